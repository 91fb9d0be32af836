use super::*;

fn parse(s: &str) -> Result<Allocation, AllocationError> {
    parse_allocation(s.as_bytes())
}

/// The HAMi example of koordinator issue #2545 (UUID completed).
const HAMI_EXAMPLE: &str = r#"{"gpu":[{"minor":3,"resources":{"koordinator.sh/gpu-core":"50","koordinator.sh/gpu-memory":"23034Mi","koordinator.sh/gpu-memory-ratio":"50"},"id":"GPU-57047317-2d3e-4a1b-9c0d-0123456789ab"}]}"#;

/// The GPU + RDMA VF example of Koordinator's RDMA user manual.
const RDMA_EXAMPLE: &str = r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory":"80Gi","koordinator.sh/gpu-memory-ratio":"100"}}],"rdma":[{"minor":0,"resources":{"koordinator.sh/rdma":"1"},"extension":{"vfs":[{"minor":-1,"busID":"0000:01:00.2"}]}}]}"#;

#[test]
fn koordinator_examples() {
    let a = parse(HAMI_EXAMPLE).unwrap();
    assert_eq!(
        a.gpus,
        vec![GpuEntry {
            minor: 3,
            uuid: Some("GPU-57047317-2d3e-4a1b-9c0d-0123456789ab".into()),
            resources: GpuResources {
                core_percent: Some(50),
                memory_ratio_percent: Some(50),
                memory_bytes: Some(23034 << 20),
            },
        }]
    );
    assert!(a.gpus[0].resources.is_shared());

    let a = parse(RDMA_EXAMPLE).unwrap();
    assert_eq!(a.gpus[0].uuid, None);
    assert!(!a.gpus[0].resources.is_shared());
    assert_eq!(
        a.rdma,
        vec![RdmaEntry {
            minor: 0,
            pf: None,
            share_percent: 1,
            vfs: vec![VfRef {
                bus_id: "0000:01:00.2".parse().unwrap(),
                minor: Some(-1)
            }],
        }]
    );
}

#[test]
fn tolerated_inputs() {
    #[rustfmt::skip]
    let table: &[(&str, &str)] = &[
        ("empty object", "{}"),
        ("unknown type", r#"{"npu":[{"minor":1}],"gpu":[{"minor":0}]}"#),
        ("unknown type, null entries", r#"{"xpu":null,"npu":[null,{"minor":-3,"id":"npu-0","resources":{"huawei.com/npu-core":"-0.5"},"extension":{"vfs":[{"minor":7,"busID":"x"}],"other":[1]}}]}"#),
        ("vfs under a gpu", r#"{"gpu":[{"minor":0,"extension":{"vfs":[{"minor":-1,"busID":"0000:01:00.2"}]}}]}"#),
        ("unknown type's quantities as go reads them", r#"{"npu":[{"resources":{"a":null,"b":"-1.5Gi","c":"+2","d":1e3,"e":"99999999999999999999Ei","f":" 100n ","g":"-","h":"Gi"}}]}"#),
        ("unknown keys everywhere", r#"{"gpu":[{"minor":0,"moduleID":3,"x":{"y":[1]}}],"rdma":[{"minor":1,"extension":{"priority":"VFPriorityHigh","bondSlaves":["a"],"vfs":[{"busID":"0000:01:00.2","extra":true}]}}]}"#),
        ("missing id", r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100"}}]}"#),
        ("empty id", r#"{"gpu":[{"minor":0,"id":""}]}"#),
        ("null id", r#"{"gpu":[{"minor":0,"id":null}]}"#),
        ("vf minor absent", r#"{"rdma":[{"minor":0,"extension":{"vfs":[{"busID":"0000:01:00.2"}]}}]}"#),
        ("vf minor -1", r#"{"rdma":[{"minor":0,"extension":{"vfs":[{"minor":-1,"busID":"0000:01:00.2"}]}}]}"#),
        ("vf minor 4", r#"{"rdma":[{"minor":0,"extension":{"vfs":[{"minor":4,"busID":"0000:01:00.2"}]}}]}"#),
        ("empty vfs", r#"{"rdma":[{"minor":0,"id":"0000:01:00.0","extension":{"vfs":[]}}]}"#),
        ("null type", r#"{"gpu":null}"#),
        ("bare numbers", r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":50,"koordinator.sh/gpu-memory":1073741824,"koordinator.sh/gpu-memory-ratio":50.0}}]}"#),
        ("unknown resource", r#"{"gpu":[{"minor":0,"resources":{"nvidia.com/gpu":"1","huawei.com/npu-core":"8"}}]}"#),
        ("vnpu template", r#"{"gpu":[{"minor":0,"extension":{"gpuSharedResourceTemplate":"vir01"}}]}"#),
        ("fpga", r#"{"fpga":[{"minor":2,"id":"fpga-2"}]}"#),
    ];
    for (name, input) in table {
        assert!(parse(input).is_ok(), "{name}: {:?}", parse(input));
    }
    // Entries devgate does not apply count toward none of its limits.
    let many = vec![r#"{"minor":1}"#; 2 * MAX_ENTRIES].join(",");
    let text = format!(r#"{{"gpu":[{{"minor":0}}],"npu":[{many}]}}"#);
    assert_eq!(parse(&text).unwrap().gpus.len(), 1);
    let a = parse(r#"{"npu":[],"gpu":[],"xpu":null}"#).unwrap();
    assert_eq!(a.ignored_types, vec!["npu".to_string(), "xpu".to_string()]);
    assert!(a.is_empty());
    let a = parse(r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-memory-ratio":50.0}}]}"#)
        .unwrap();
    assert_eq!(a.gpus[0].resources.memory_ratio_percent, Some(50));
    let a = parse(r#"{"rdma":[{"minor":0}]}"#).unwrap();
    assert_eq!(a.rdma[0].share_percent, 100);
}

/// Every bad-input class, with the entry the error must name.
#[test]
fn rejected_inputs() {
    type Check = fn(&AllocationError) -> bool;
    let long_id = format!(r#"{{"gpu":[{{"minor":0,"id":"{}"}}]}}"#, "a".repeat(129));
    let long_quantity = format!(
        r#"{{"gpu":[{{"minor":0,"resources":{{"koordinator.sh/gpu-memory":"{}"}}}}]}}"#,
        "1".repeat(65)
    );
    #[rustfmt::skip]
    let table: &[(&str, &str, &str, Check)] = &[
        ("not json", "{", "-", |e| matches!(e, AllocationError::Malformed { .. })),
        ("nul byte", "\u{0}", "-", |e| matches!(e, AllocationError::Malformed { .. })),
        ("array at top", "[]", "-", |e| matches!(e, AllocationError::Malformed { .. })),
        ("null at top", "null", "-", |e| matches!(e, AllocationError::Malformed { .. })),
        ("trailing garbage", "{} x", "-", |e| matches!(e, AllocationError::Malformed { .. })),
        ("type not a list", r#"{"gpu":{}}"#, "gpu", |e| matches!(e, AllocationError::Malformed { .. })),
        ("entry not an object", r#"{"gpu":[1]}"#, "gpu[0]", |e| matches!(e, AllocationError::Malformed { .. })),
        ("minor a string", r#"{"gpu":[{"minor":"0"}]}"#, "gpu[0]", |e| matches!(e, AllocationError::Malformed { .. })),
        ("minor a float", r#"{"gpu":[{"minor":1.5}]}"#, "gpu[0]", |e| matches!(e, AllocationError::Malformed { .. })),
        ("duplicate type key", r#"{"gpu":[],"gpu":[]}"#, "-", |e| matches!(e, AllocationError::Malformed { .. })),
        ("duplicate entry key", r#"{"gpu":[{"minor":0,"minor":1}]}"#, "gpu[0]", |e| matches!(e, AllocationError::Malformed { .. })),
        ("duplicate resource key", r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"1","koordinator.sh/gpu-core":"2"}}]}"#, "gpu[0]", |e| matches!(e, AllocationError::Malformed { .. })),
        ("missing minor", r#"{"gpu":[{"id":"GPU-1"}]}"#, "gpu[0]", |e| matches!(e, AllocationError::Missing { field: "minor", .. })),
        ("negative minor", r#"{"gpu":[{"minor":-1}]}"#, "gpu[0]", |e| matches!(e, AllocationError::Negative { value: -1, .. })),
        ("minor over int32", r#"{"rdma":[{"minor":2147483648}]}"#, "rdma[0]", |e| matches!(e, AllocationError::OutOfRange { .. })),
        ("negative vf minor", r#"{"rdma":[{"minor":0,"extension":{"vfs":[{"minor":-2,"busID":"0000:01:00.2"}]}}]}"#, "rdma[0].vfs[0]", |e| matches!(e, AllocationError::Negative { .. })),
        ("negative quantity", r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-memory":"-1Gi"}}]}"#, "gpu[0]", |e| matches!(e, AllocationError::Quantity { reason: QuantityError::Negative(_), .. })),
        ("negative number", r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":-5}}]}"#, "gpu[0]", |e| matches!(e, AllocationError::Quantity { reason: QuantityError::Negative(_), .. })),
        ("number past f64 precision", r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":100.000000000000001}}]}"#, "gpu[0]", |e| matches!(e, AllocationError::Quantity { reason: QuantityError::NotWhole(_), .. })),
        ("negative float", r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":-0.5}}]}"#, "gpu[0]", |e| matches!(e, AllocationError::Quantity { reason: QuantityError::Negative(_), .. })),
        ("bad quantity", r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-memory":"16GB"}}]}"#, "gpu[0]", |e| matches!(e, AllocationError::Quantity { .. })),
        ("fractional percent", r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"0.5"}}]}"#, "gpu[0]", |e| matches!(e, AllocationError::Quantity { reason: QuantityError::NotWhole(_), .. })),
        ("quantity overflow", r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-memory":"16Ei"}}]}"#, "gpu[0]", |e| matches!(e, AllocationError::Quantity { reason: QuantityError::Overflow(_), .. })),
        ("quantity past int64", r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-memory":"8Ei"}}]}"#, "gpu[0]", |e| matches!(e, AllocationError::Quantity { reason: QuantityError::Overflow(_), .. })),
        ("escaped quantity", r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"\u0035\u0030","koordinator.sh/gpu-memory-ratio":"50"}}]}"#, "gpu[0]", |e| matches!(e, AllocationError::Malformed { .. })),
        ("quantity a bool", r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":true}}]}"#, "gpu[0]", |e| matches!(e, AllocationError::Malformed { .. })),
        ("core over 100", r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"101"}}]}"#, "gpu[0]", |e| matches!(e, AllocationError::OutOfRange { value: 101, .. })),
        ("ratio over 100", r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-memory-ratio":"200"}}]}"#, "gpu[0]", |e| matches!(e, AllocationError::OutOfRange { value: 200, .. })),
        ("rdma over 100", r#"{"rdma":[{"minor":0,"resources":{"koordinator.sh/rdma":"101"}}]}"#, "rdma[0]", |e| matches!(e, AllocationError::OutOfRange { .. })),
        ("rdma zero", r#"{"rdma":[{"minor":0,"resources":{"koordinator.sh/rdma":"0"}}]}"#, "rdma[0]", |e| matches!(e, AllocationError::OutOfRange { .. })),
        ("duplicate gpu minor", r#"{"gpu":[{"minor":1},{"minor":2},{"minor":1}]}"#, "gpu[2]", |e| matches!(e, AllocationError::Duplicate { first, .. } if first == "gpu[0]")),
        ("duplicate gpu id", r#"{"gpu":[{"minor":1,"id":"GPU-a"},{"minor":2,"id":"GPU-a"}]}"#, "gpu[1]", |e| matches!(e, AllocationError::Duplicate { .. })),
        ("duplicate rdma minor", r#"{"rdma":[{"minor":1},{"minor":1}]}"#, "rdma[1]", |e| matches!(e, AllocationError::Duplicate { .. })),
        ("duplicate pf", r#"{"rdma":[{"minor":1,"id":"0000:19:00.0"},{"minor":2,"id":"19:00.0"}]}"#, "rdma[1]", |e| matches!(e, AllocationError::Duplicate { .. })),
        ("duplicate vf in entry", r#"{"rdma":[{"minor":0,"extension":{"vfs":[{"busID":"0000:01:00.2"},{"busID":"0000:01:00.2"}]}}]}"#, "rdma[0].vfs[1]", |e| matches!(e, AllocationError::Duplicate { first, .. } if first == "rdma[0].vfs[0]")),
        ("duplicate vf across entries", r#"{"rdma":[{"minor":0,"extension":{"vfs":[{"busID":"0000:01:00.2"}]}},{"minor":1,"extension":{"vfs":[{"busID":"0000:01:00.2"}]}}]}"#, "rdma[1].vfs[0]", |e| matches!(e, AllocationError::Duplicate { .. })),
        ("vf without busID", r#"{"rdma":[{"minor":0,"extension":{"vfs":[{"minor":-1}]}}]}"#, "rdma[0].vfs[0]", |e| matches!(e, AllocationError::Missing { field: "busID", .. })),
        ("vf busID a number", r#"{"rdma":[{"minor":0,"extension":{"vfs":[{"busID":"0000:01:00.2"},{"busID":7}]}}]}"#, "rdma[0].vfs[1]", |e| matches!(e, AllocationError::Malformed { .. })),
        ("vf minor not whole", r#"{"rdma":[{"minor":0,"extension":{"vfs":[{"minor":1.5,"busID":"0000:01:00.2"}]}}]}"#, "rdma[0].vfs[0]", |e| matches!(e, AllocationError::Malformed { .. })),
        ("busID not pci", r#"{"rdma":[{"minor":0,"extension":{"vfs":[{"busID":"0000:01:00"}]}}]}"#, "rdma[0].vfs[0]", |e| matches!(e, AllocationError::BadBusId { .. })),
        ("rdma id not pci", r#"{"rdma":[{"minor":0,"id":"mlx5_0"}]}"#, "rdma[0]", |e| matches!(e, AllocationError::BadBusId { .. })),
        ("path in busID", r#"{"rdma":[{"minor":0,"extension":{"vfs":[{"busID":"../../dev/sda"}]}}]}"#, "rdma[0].vfs[0]", |e| matches!(e, AllocationError::BadName { .. })),
        ("path in rdma id", r#"{"rdma":[{"minor":0,"id":"/sys/bus/pci"}]}"#, "rdma[0]", |e| matches!(e, AllocationError::BadName { .. })),
        ("slash in gpu id", r#"{"gpu":[{"minor":0,"id":"GPU-1/../x"}]}"#, "gpu[0]", |e| matches!(e, AllocationError::BadName { .. })),
        ("dotdot in gpu id", r#"{"gpu":[{"minor":0,"id":".."}]}"#, "gpu[0]", |e| matches!(e, AllocationError::BadName { .. })),
        ("nul in gpu id", r#"{"gpu":[{"minor":0,"id":"GPU-\u0000"}]}"#, "gpu[0]", |e| matches!(e, AllocationError::BadName { .. })),
        ("newline in gpu id", r#"{"gpu":[{"minor":0,"id":"GPU-\n"}]}"#, "gpu[0]", |e| matches!(e, AllocationError::BadName { .. })),
        ("path in type key", r#"{"../gpu":[]}"#, "-", |e| matches!(e, AllocationError::BadName { .. })),
        ("path in resource name", r#"{"gpu":[{"minor":0,"resources":{"a/b/c":"1"}}]}"#, "gpu[0]", |e| matches!(e, AllocationError::BadName { .. })),
        ("nul in resource name", r#"{"gpu":[{"minor":0,"resources":{"a\u0000":"1"}}]}"#, "gpu[0]", |e| matches!(e, AllocationError::BadName { .. })),
        ("long id", &long_id, "gpu[0]", |e| matches!(e, AllocationError::TooLong { .. })),
        ("long quantity", &long_quantity, "gpu[0]", |e| matches!(e, AllocationError::Malformed { .. })),
        // What devgate does not apply, in a shape koordinator cannot read
        // (its `json.Unmarshal` fails the whole annotation).
        ("unknown type not a list", r#"{"gpu":[{"minor":0}],"xpu":1}"#, "xpu", |e| matches!(e, AllocationError::Malformed { .. })),
        ("unknown type of objects", r#"{"xpu":{"a":[1,{"b":null}]}}"#, "xpu", |e| matches!(e, AllocationError::Malformed { .. })),
        ("unknown type's minor a string", r#"{"gpu":[{"minor":0}],"npu":[{"minor":"x"}]}"#, "npu[0]", |e| matches!(e, AllocationError::Malformed { .. })),
        ("unknown type's minor over int32", r#"{"npu":[{"minor":2147483648}]}"#, "npu[0]", |e| matches!(e, AllocationError::OutOfRange { .. })),
        ("unknown type's id a number", r#"{"npu":[{"id":5}]}"#, "npu[0]", |e| matches!(e, AllocationError::Malformed { .. })),
        ("unknown type's quantity not one", r#"{"gpu":[{"minor":0}],"npu":[{"resources":{"huawei.com/npu":"abc"}}]}"#, "npu[0]", |e| matches!(e, AllocationError::Malformed { .. })),
        ("unknown type's quantity signed twice", r#"{"npu":[{"resources":{"a":"-+1"}}]}"#, "npu[0]", |e| matches!(e, AllocationError::Malformed { .. })),
        ("unknown type's quantity of no digit inf.Dec reads", r#"{"npu":[{"resources":{"a":"Pi"}}]}"#, "npu[0]", |e| matches!(e, AllocationError::Malformed { .. })),
        ("unknown type's quantity a bool", r#"{"npu":[{"resources":{"huawei.com/npu-core":true}}]}"#, "npu[0]", |e| matches!(e, AllocationError::Malformed { .. })),
        ("unknown type's entry an array", r#"{"npu":[[3]]}"#, "npu[0]", |e| matches!(e, AllocationError::Malformed { .. })),
        ("gpu vf busID a number", r#"{"gpu":[{"minor":0,"extension":{"vfs":[{"busID":7}]}}]}"#, "gpu[0].vfs[0]", |e| matches!(e, AllocationError::Malformed { .. })),
        ("fpga vfs not a list", r#"{"fpga":[{"minor":0,"extension":{"vfs":{}}}]}"#, "fpga[0]", |e| matches!(e, AllocationError::Malformed { .. })),
        ("template a number", r#"{"gpu":[{"minor":0,"extension":{"gpuSharedResourceTemplate":5}}]}"#, "gpu[0]", |e| matches!(e, AllocationError::Malformed { .. })),
        ("template spelled otherwise", r#"{"npu":[{"extension":{"GPUSharedResourceTemplate":"vir01"}}]}"#, "npu[0]", |e| matches!(e, AllocationError::Malformed { .. })),
        ("unknown type's template an array", r#"{"npu":[{"extension":{"gpuSharedResourceTemplate":[1]}}]}"#, "npu[0]", |e| matches!(e, AllocationError::Malformed { .. })),
        ("unknown type's minor under int32", r#"{"npu":[{"minor":-3000000000}]}"#, "npu[0]", |e| matches!(e, AllocationError::OutOfRange { value: -3_000_000_000, .. })),
        ("unknown type's vf minor not whole", r#"{"npu":[{"extension":{"vfs":[{"minor":0.5}]}}]}"#, "npu[0].vfs[0]", |e| matches!(e, AllocationError::Malformed { .. })),
    ];
    for (name, input, entry, check) in table {
        let e = parse(input).expect_err(name);
        assert!(check(&e), "{name}: {e:?}");
        let text = e.to_string();
        assert!(text.starts_with(DEVICE_ALLOCATED), "{name}: {text}");
        assert!(
            text.contains(&format!(": {entry}: ")),
            "{name}: want entry {entry}: {text}"
        );
        assert!(
            !text.contains('\n') && !text.contains('\0'),
            "{name}: {text:?}"
        );
    }
}

#[test]
fn not_utf8() {
    let e = parse_allocation(b"{\"gpu\":[{\"minor\":0,\"id\":\"\xff\"}]}").unwrap_err();
    assert!(
        matches!(&e, AllocationError::Malformed { entry, .. } if entry == "-"),
        "{e}"
    );
}

#[test]
fn bounds() {
    let big = format!(r#"{{"x":"{}"}}"#, " ".repeat(MAX_ANNOTATION_BYTES));
    assert!(matches!(parse(&big), Err(AllocationError::TooLarge { .. })));

    let entries = |n: usize| {
        let list: Vec<String> = (0..n).map(|i| format!(r#"{{"minor":{i}}}"#)).collect();
        format!(r#"{{"gpu":[{}]}}"#, list.join(","))
    };
    assert_eq!(
        parse(&entries(MAX_ENTRIES)).unwrap().gpus.len(),
        MAX_ENTRIES
    );
    let e = parse(&entries(MAX_ENTRIES + 1)).unwrap_err();
    assert!(
        matches!(&e, AllocationError::TooMany { entry, .. } if entry == "gpu[256]"),
        "{e}"
    );

    // VFs count toward the same bound.
    let vfs: Vec<String> = (0..MAX_ENTRIES)
        .map(|i| format!(r#"{{"busID":"0000:{:02x}:{:02x}.{}"}}"#, i / 32, i % 32, 1))
        .collect();
    let input = format!(
        r#"{{"rdma":[{{"minor":0,"extension":{{"vfs":[{}]}}}}]}}"#,
        vfs.join(",")
    );
    assert!(matches!(
        parse(&input),
        Err(AllocationError::TooMany { .. })
    ));

    let types: Vec<String> = (0..=MAX_TYPES).map(|i| format!(r#""t{i}":[]"#)).collect();
    let input = format!("{{{}}}", types.join(","));
    assert!(matches!(
        parse(&input),
        Err(AllocationError::TooMany { .. })
    ));

    let res: Vec<String> = (0..=MAX_RESOURCES)
        .map(|i| format!(r#""r{i}":"1""#))
        .collect();
    let input = format!(
        r#"{{"gpu":[{{"minor":0,"resources":{{{}}}}}]}}"#,
        res.join(",")
    );
    assert!(matches!(
        parse(&input),
        Err(AllocationError::TooMany { .. })
    ));

    // Deep nesting is skipped without recursion in an ignored key and stopped by
    // serde_json's recursion limit where a value is read: neither touches the stack.
    // Beyond Go's limit (10000 levels, the top object, the list and the entry
    // included) it is refused as koordinator's reader refuses it.
    let nested = |levels: usize| {
        format!(
            r#"{{"gpu":[{{"minor":0,"x":{}"a\"[{{"{}}}]}}"#,
            "[".repeat(levels),
            "]".repeat(levels)
        )
    };
    assert!(parse(&nested(9_997)).is_ok());
    let e = parse(&nested(9_998)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "scheduling.koordinator.sh/device-allocated: -: malformed: nested deeper than 10000 levels, which koordinator's json reader refuses"
    );
    let deep = format!(
        r#"{{"gpu":[{{"minor":0,"resources":{{"a":{}{}}}}}]}}"#,
        "[".repeat(1_000),
        "]".repeat(1_000)
    );
    assert!(matches!(
        parse(&deep),
        Err(AllocationError::Malformed { .. })
    ));
}

#[test]
fn pod_keys() {
    let ann = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let none = ann(&[]);
    let p = parse_pod(&none, &none).unwrap();
    assert_eq!(p, PodDevices::default());

    let labels = ann(&[(GPU_ISOLATION_PROVIDER, "HAMi-core")]);
    assert!(parse_pod(&none, &labels).unwrap().hami_core);
    for other in ["hami-core", "HAMi-core ", "HAMI-CORE", ""] {
        let labels = ann(&[(GPU_ISOLATION_PROVIDER, other)]);
        assert!(!parse_pod(&none, &labels).unwrap().hami_core, "{other:?}");
    }

    let hash: HashMap<String, String> = ann(&[(CONTAINERS, "main, sidecar")]).into_iter().collect();
    let p = parse_pod(&hash, &none).unwrap();
    assert_eq!(
        p.containers,
        ContainerSelector::Only(vec!["main".into(), "sidecar".into()])
    );
    assert!(p.containers.selects("main") && !p.containers.selects("init"));
    assert!(ContainerSelector::All.selects("anything"));

    for bad in [
        "",
        "main,",
        "Main",
        "a/b",
        "..",
        "-x",
        "a,a",
        &"x".repeat(64),
        &"a,".repeat(70),
    ] {
        let a = ann(&[(CONTAINERS, bad)]);
        let e = parse_pod(&a, &none).expect_err(bad);
        assert!(e.to_string().starts_with(CONTAINERS), "{e}");
    }

    let a = ann(&[(DEVICE_ALLOCATED, "{")]);
    assert!(parse_pod(&a, &none).is_err());
}
