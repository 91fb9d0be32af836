//! Specs generated from a simulated HGX node, checked against the CDI rules
//! and against what the planner grants.
use std::collections::HashSet;

use super::*;
use crate::config::Config;
use crate::fixture::HostRootBuilder;
use crate::inventory::Inventory;

fn hgx() -> (Inventory, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let fixture = HostRootBuilder::hgx().build(dir.path()).unwrap();
    (crate::inventory::discover(fixture.root()), dir)
}

fn spec_of(g: &Generated, class: Class) -> &Spec {
    &g.specs.iter().find(|(c, _)| *c == class).unwrap().1
}

fn names(spec: &Spec) -> HashSet<&str> {
    spec.devices.iter().map(|d| d.name.as_str()).collect()
}

fn node_paths(e: &ContainerEdits) -> Vec<&str> {
    e.device_nodes.iter().map(|n| n.path.as_str()).collect()
}

#[test]
fn gpus_by_uuid_and_minor_with_shared_nodes_spec_wide() {
    let (inv, _dir) = hgx();
    let g = generate(&inv, &Config::default(), &Class::ALL, DEFAULT_CDI_VERSION).unwrap();
    // Only VFs without an RDMA device (the fixture has some) are left out.
    let no_rdma = inv
        .rdma
        .iter()
        .flat_map(|n| &n.vfs)
        .filter(|v| v.rdma.is_none())
        .count();
    assert_eq!(g.warnings.len(), no_rdma, "{:?}", g.warnings);
    assert!(g.warnings.iter().all(|w| w.contains("has no rdma device")));
    let spec = spec_of(&g, Class::Gpu);
    assert_eq!(spec.kind, "devgate.io/gpu");
    assert_eq!(spec.cdi_version, "0.6.0");
    assert_eq!(spec.devices.len(), 2 * inv.gpus.len());
    let gpu = &inv.gpus[3];
    let by_uuid = spec.devices.iter().find(|d| d.name == gpu.uuid).unwrap();
    let by_minor = spec
        .devices
        .iter()
        .find(|d| d.name == gpu.minor.to_string())
        .unwrap();
    assert_eq!(by_uuid.container_edits, by_minor.container_edits);
    let node = &by_uuid.container_edits.device_nodes[..];
    assert_eq!(node.len(), 1);
    let nvidia = i64::from(inv.nvidia_majors.nvidia.unwrap());
    assert_eq!(node[0].path, format!("/dev/nvidia{}", gpu.minor));
    assert_eq!(
        (node[0].kind.as_str(), node[0].major, node[0].minor),
        ("c", nvidia, i64::from(gpu.minor))
    );
    assert_eq!(node[0].permissions, "rw");
    assert_eq!(node[0].file_mode, 0o666);
    assert_eq!(
        node_paths(&spec.container_edits),
        ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    );
    validate(spec).unwrap();
}

#[test]
fn rdma_pfs_and_vfs_by_pci_address_with_sysfs_numbers() {
    let (inv, _dir) = hgx();
    let g = generate(
        &inv,
        &Config::default(),
        &[Class::Rdma],
        DEFAULT_CDI_VERSION,
    )
    .unwrap();
    let spec = spec_of(&g, Class::Rdma);
    assert_eq!(spec.kind, "devgate.io/rdma");
    let nic = &inv.rdma[0];
    let vf = &nic.vfs[1];
    let want_vf_devs = inv
        .rdma
        .iter()
        .map(|n| 1 + n.vfs.iter().filter(|v| v.rdma.is_some()).count())
        .sum::<usize>();
    assert_eq!(spec.devices.len(), want_vf_devs);
    let names = names(spec);
    assert!(names.contains(nic.bus_id.to_string().as_str()));
    assert!(names.contains(vf.bus_id.to_string().as_str()));
    let dev = spec
        .devices
        .iter()
        .find(|d| d.name == vf.bus_id.to_string())
        .unwrap();
    let rdma = vf.rdma.as_ref().unwrap();
    // Each of the VF's char devices but issm (`rdma.allow_issm` is off).
    let want_nodes = rdma
        .char_devs
        .iter()
        .filter(|c| c.kind != crate::inventory::RdmaCharKind::Issm)
        .count();
    assert!(want_nodes > 0);
    assert_eq!(dev.container_edits.device_nodes.len(), want_nodes);
    for n in &dev.container_edits.device_nodes {
        let name = n.path.strip_prefix("/dev/infiniband/").unwrap();
        let c = rdma.char_devs.iter().find(|c| c.name == name).unwrap();
        assert_eq!(
            (n.major, n.minor),
            (i64::from(c.dev.major), i64::from(c.dev.minor))
        );
    }
    // issm stays out unless the config allows subnet-manager access.
    assert!(!node_paths(&dev.container_edits)
        .iter()
        .any(|p| p.contains("issm")));
    assert_eq!(
        node_paths(&spec.container_edits),
        ["/dev/infiniband/rdma_cm"]
    );
}

#[test]
fn each_device_gets_exactly_what_the_planner_grants() {
    let (inv, _dir) = hgx();
    let config = Config::default();
    let g = generate(&inv, &config, &Class::ALL, DEFAULT_CDI_VERSION).unwrap();
    let spec = spec_of(&g, Class::Gpu);
    let gpu = &inv.gpus[0];
    let pod = crate::allocation::PodDevices {
        allocation: crate::allocation::Allocation {
            gpus: vec![crate::allocation::GpuEntry {
                minor: gpu.minor,
                uuid: None,
                resources: Default::default(),
            }],
            ..Default::default()
        },
        ..Default::default()
    };
    let plan = crate::plan::build(&inv, &pod, "c", &config).unwrap();
    let dev = spec.devices.iter().find(|d| d.name == gpu.uuid).unwrap();
    let mut from_cdi: Vec<(String, i64, i64)> = dev
        .container_edits
        .device_nodes
        .iter()
        .chain(&spec.container_edits.device_nodes)
        .map(|n| (n.path.clone(), n.major, n.minor))
        .collect();
    let mut from_plan: Vec<(String, i64, i64)> = plan
        .devices
        .iter()
        .map(|d| (d.path.clone(), i64::from(d.major), i64::from(d.minor)))
        .collect();
    from_cdi.sort();
    from_plan.sort();
    assert_eq!(from_cdi, from_plan);
}

#[test]
fn one_device_keeps_all_its_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = HostRootBuilder::hgx()
        .gpus(1)
        .nics(0)
        .intel_rdma(false)
        .build(dir.path())
        .unwrap();
    let inv = crate::inventory::discover(fixture.root());
    let g = generate(&inv, &Config::default(), &Class::ALL, "0.5.0").unwrap();
    assert_eq!(g.specs.len(), 1, "no rdma spec without rdma devices");
    let spec = spec_of(&g, Class::Gpu);
    assert!(spec.container_edits.is_empty());
    assert_eq!(spec.devices[0].container_edits.device_nodes.len(), 4);
    validate(spec).unwrap();
}

#[test]
fn writes_only_known_versions() {
    let (inv, _dir) = hgx();
    for v in ["0.4.0", "1.1.0", "", "0.6"] {
        let e = generate(&inv, &Config::default(), &Class::ALL, v).unwrap_err();
        assert!(matches!(e, CdiError::Version { .. }), "{v}");
    }
    for v in crate::cdi::WRITABLE_VERSIONS {
        let g = generate(&inv, &Config::default(), &Class::ALL, v).unwrap();
        for (_, spec) in &g.specs {
            assert_eq!(spec.cdi_version, v);
            validate(spec).unwrap_or_else(|e| panic!("{v}: {e}"));
        }
    }
}

#[test]
fn json_has_the_cdi_field_names_and_round_trips() {
    let (inv, _dir) = hgx();
    let g = generate(&inv, &Config::default(), &[Class::Rdma], "0.5.0").unwrap();
    let spec = spec_of(&g, Class::Rdma);
    let v: serde_json::Value = serde_json::to_value(spec).unwrap();
    assert_eq!(v["cdiVersion"], "0.5.0");
    assert_eq!(v["kind"], "devgate.io/rdma");
    let node = &v["containerEdits"]["deviceNodes"][0];
    for key in ["path", "type", "major", "minor", "fileMode", "permissions"] {
        assert!(node.get(key).is_some(), "{key} missing: {node}");
    }
    assert!(node.get("hostPath").is_none());
    assert!(v.get("annotations").is_none());
    let back: Spec = serde_json::from_value(v).unwrap();
    assert_eq!(&back, spec);
}

/// A minimal valid spec to break one rule at a time.
fn minimal() -> Spec {
    Spec {
        cdi_version: "0.6.0".into(),
        kind: "devgate.io/gpu".into(),
        annotations: Default::default(),
        devices: vec![Device {
            name: "GPU-1".into(),
            annotations: Default::default(),
            container_edits: ContainerEdits {
                env: vec![],
                device_nodes: vec![DeviceNode {
                    path: "/dev/nvidia0".into(),
                    host_path: None,
                    kind: "c".into(),
                    major: 195,
                    minor: 0,
                    file_mode: 0o666,
                    permissions: "rw".into(),
                }],
            },
        }],
        container_edits: ContainerEdits::default(),
    }
}

#[test]
fn rejects_what_runtimes_reject() {
    validate(&minimal()).unwrap();
    type Break = fn(&mut Spec);
    let cases: [(&str, Break); 16] = [
        ("unknown version", |s| s.cdi_version = "0.9.0".into()),
        ("kind without class", |s| s.kind = "devgate.io".into()),
        ("kind with two slashes", |s| {
            s.kind = "devgate.io/gpu/x".into()
        }),
        ("vendor starting with a digit", |s| {
            s.kind = "1devgate.io/gpu".into()
        }),
        ("class ending in a dash", |s| {
            s.kind = "devgate.io/gpu-".into()
        }),
        ("no devices", |s| s.devices.clear()),
        ("empty name", |s| s.devices[0].name = String::new()),
        ("slash in name", |s| s.devices[0].name = "a/b".into()),
        ("name ending in colon", |s| {
            s.devices[0].name = "0000:19:".into()
        }),
        ("duplicate name", |s| {
            let d = s.devices[0].clone();
            s.devices.push(d)
        }),
        ("empty device edits", |s| {
            s.devices[0].container_edits = ContainerEdits::default()
        }),
        ("relative node path", |s| {
            s.devices[0].container_edits.device_nodes[0].path = "dev/x".into()
        }),
        ("bad type", |s| {
            s.devices[0].container_edits.device_nodes[0].kind = "x".into()
        }),
        ("bad permissions", |s| {
            s.devices[0].container_edits.device_nodes[0].permissions = "rwx".into()
        }),
        ("env without =", |s| {
            s.container_edits.env = vec!["FOO".into()]
        }),
        ("annotations before 0.6.0", |s| {
            s.cdi_version = "0.5.0".into();
            s.annotations.insert("a".into(), "b".into());
        }),
    ];
    for (what, break_it) in cases {
        let mut s = minimal();
        break_it(&mut s);
        assert!(validate(&s).is_err(), "accepted: {what}");
    }
}

#[test]
fn version_follows_the_fields_used() {
    let mut s = minimal();
    s.devices[0].name = "0000:19:00.2".into();
    s.cdi_version = "0.4.0".into();
    let e = validate(&s).unwrap_err().to_string();
    assert!(e.contains("older than 0.5.0"), "{e}");
    s.cdi_version = "0.5.0".into();
    validate(&s).unwrap();
    s.kind = "devgate.io/gpu.v1".into();
    assert!(validate(&s).is_err(), "dotted class needs 0.6.0");
    s.cdi_version = "v0.6.0".into();
    validate(&s).unwrap();
    assert!(version_at_least("0.6.0", "0.5.0"));
    assert!(!version_at_least("0.5.0", "0.6.0"));
    assert!(!version_at_least("bogus", "0.3.0"));
}

#[test]
fn qualified_names_and_file_names() {
    assert_eq!(
        Class::Rdma.qualified("0000:19:00.2"),
        "devgate.io/rdma=0000:19:00.2"
    );
    assert_eq!(Class::Gpu.file_name(), "devgate.io-gpu.json");
}

#[test]
fn the_kind_a_spec_file_declares() {
    let cases: &[(&str, Option<&str>)] = &[
        (
            r#"{"cdiVersion":"0.6.0","kind":"devgate.io/gpu","devices":[]}"#,
            Some("devgate.io/gpu"),
        ),
        (r#"{"kind":"vendor.com/x"}"#, Some("vendor.com/x")),
        (r#"{"cdiVersion":"0.6.0"}"#, None),
        (r#"{"kind":7}"#, None),
        (r#"["kind"]"#, None),
        ("not json", None),
        ("", None),
        (
            "cdiVersion: 0.6.0\nkind: devgate.io/rdma\ndevices: []\n",
            Some("devgate.io/rdma"),
        ),
        ("kind: \"devgate.io/gpu\"\n", Some("devgate.io/gpu")),
        (
            "{\n  \"cdiVersion\": \"0.6.0\",\n  \"kind\": \"devgate.io/gpu\"\n}\n",
            Some("devgate.io/gpu"),
        ),
        ("kind: 'devgate.io/gpu' # ours\n", Some("devgate.io/gpu")),
        // Indented: a field of something else, not the spec's kind.
        ("devices:\n  - kind: devgate.io/gpu\n", None),
        ("kind:\n", None),
        // encoding/json matches keys without regard to case (the Kelvin
        // sign folds to k), and gets them sorted (Go's json.Marshal of the
        // map YAML gave): the byte-greatest match wins, wherever written.
        (r#"{"Kind":"devgate.io/gpu"}"#, Some("devgate.io/gpu")),
        ("KIND: devgate.io/rdma\n", Some("devgate.io/rdma")),
        ("\u{212a}ind: devgate.io/gpu\n", Some("devgate.io/gpu")),
        (
            r#"{"kind":"vendor.com/x","KIND":"devgate.io/gpu"}"#,
            Some("vendor.com/x"),
        ),
        (
            "kind: devgate.io/gpu\nKind: nvidia.com/gpu\n",
            Some("devgate.io/gpu"),
        ),
        (
            "kind: nvidia.com/gpu\n\u{212a}ind: devgate.io/gpu\n",
            Some("devgate.io/gpu"),
        ),
        ("kinds: devgate.io/gpu\n", None),
        // A key twice: sigs.k8s.io/yaml's UnmarshalStrict refuses the file.
        (r#"{"kind":"devgate.io/gpu","kind":"devgate.io/gpu"}"#, None),
        ("kind: devgate.io/gpu\nkind: devgate.io/gpu\n", None),
        // The first document is the spec; the rest is never read.
        (
            "kind: devgate.io/gpu\n---\nkind: vendor.com/x\n",
            Some("devgate.io/gpu"),
        ),
        // Merge keys are applied, and a local tag's scalar is its text.
        (
            "base: &b {kind: devgate.io/gpu}\n<<: *b\n",
            Some("devgate.io/gpu"),
        ),
        ("kind: !foo devgate.io/gpu\n", Some("devgate.io/gpu")),
    ];
    for (text, want) in cases {
        assert_eq!(declared_kind(text).as_deref(), *want, "{text:?}");
    }
}

/// Spec files are read as UTF-8, or as UTF-16 after a byte-order mark (Go's
/// YAML decodes both); other bytes are no text.
#[test]
fn spec_text_is_utf8_or_utf16_after_its_mark() {
    let text = "kind: devgate.io/gpu\n";
    assert_eq!(spec_text(text.as_bytes().to_vec()).as_deref(), Some(text));
    for big in [false, true] {
        let mut bytes = if big {
            vec![0xfe, 0xff]
        } else {
            vec![0xff, 0xfe]
        };
        for unit in text.encode_utf16() {
            bytes.extend(if big {
                unit.to_be_bytes()
            } else {
                unit.to_le_bytes()
            });
        }
        let read = spec_text(bytes).unwrap();
        assert_eq!(declared_kind(&read).as_deref(), Some("devgate.io/gpu"));
        assert_eq!(spec_text(vec![0xff, 0xfe, 0x41]), None, "an odd byte");
    }
    assert_eq!(spec_text(vec![0xc3, 0x28]), None);
}
