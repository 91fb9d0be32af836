//! Config parsing: defaults, unknown keys, sections and bounds.
use super::*;

#[test]
fn empty_text_is_defaults() {
    assert_eq!(Config::parse("", "t").unwrap(), Config::default());
}

#[test]
fn missing_file_is_defaults() {
    let c = Config::load(Path::new("/nonexistent/devgate.toml")).unwrap();
    assert_eq!(c, Config::default());
}

#[test]
fn keys_parse_and_unknown_keys_fail() {
    let c = Config::parse(
        "failure_policy = \"ignore\"\n[rdma]\nnetns_mode = \"exclusive\"\n",
        "t",
    )
    .unwrap();
    assert_eq!(c.failure_policy, FailurePolicy::Ignore);
    assert_eq!(c.rdma.netns_mode, RdmaNetnsMode::Exclusive);
    let e = Config::parse("failure_polcy = \"ignore\"", "t").unwrap_err();
    assert!(e.to_string().contains("failure_polcy"), "{e}");
}

#[test]
fn gpu_section_parses_with_defaults() {
    let c = Config::parse(
        "[gpu]\nfull_reset = true\nignored_xids = [13]\ncompute_mode = \"exclusive_process\"\n",
        "t",
    )
    .unwrap();
    assert!(c.gpu.full_reset);
    assert_eq!(c.gpu.ignored_xids, vec![13]);
    assert_eq!(c.gpu.compute_mode, GpuComputeMode::ExclusiveProcess);
    assert_eq!(c.gpu.kill_grace_ms, GpuConfig::default().kill_grace_ms);
    assert!(Config::parse("[gpu]\nfull_rest = true\n", "t").is_err());
}

#[test]
fn hook_paths_are_absolute_or_unset() {
    for key in ["hook_path", "hook_state_dir"] {
        let c = Config::parse(&format!("{key} = \"/opt/x\"\n"), "t").unwrap();
        assert!([c.hook_path.as_str(), c.hook_state_dir.as_str()].contains(&"/opt/x"));
        let e = Config::parse(&format!("{key} = \"opt/x\"\n"), "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains(key) && e.contains("must be absolute"), "{e}");
    }
}

#[test]
fn nvml_library_is_sonames_or_absolute_paths_tried_in_order() {
    // `value` as TOML writes it.
    let lib = |value: &str| Config::parse(&format!("[gpu]\nnvml_library = {value}\n"), "t");
    let names = |c: Config| c.gpu.nvml_library.candidates().to_vec();
    assert_eq!(names(Config::default()), ["libnvidia-ml.so.1"]);
    assert_eq!(
        names(lib(r#""/host/usr/lib64/libnvidia-ml.so.1""#).unwrap()),
        ["/host/usr/lib64/libnvidia-ml.so.1"]
    );
    assert_eq!(
        names(lib(r#"["/a/libnvidia-ml.so.1", "libnvidia-ml.so.1"]"#).unwrap()),
        ["/a/libnvidia-ml.so.1", "libnvidia-ml.so.1"]
    );
    let long = format!("{:?}", "/x".repeat(2049));
    let nine = format!("[{}]", [r#""l.so""#; 9].join(","));
    for (bad, reason) in [
        (r#""""#, "empty"),
        ("[]", "0 names"),
        (nine.as_str(), "9 names"),
        (long.as_str(), "longer than 4096"),
        (r#""lib64/libnvidia-ml.so.1""#, "a path must be absolute"),
        (
            r#"["libnvidia-ml.so.1", "lib64/x.so"]"#,
            "a path must be absolute",
        ),
        (r#""a\u0000b""#, "NUL"),
    ] {
        let e = lib(bad).unwrap_err().to_string();
        assert!(
            e.contains("gpu.nvml_library") && e.contains(reason),
            "{bad}: {e}"
        );
    }
    assert!(lib("7").is_err(), "neither a name nor a list");
}

/// Values the plan or the hook would refuse fail the config itself, so a bad
/// one is seen at start (and by `devgate doctor`), not at every container.
#[test]
fn values_the_plan_refuses_fail_the_config() {
    for (text, key) in [
        ("device_file_mode = 666", "device_file_mode"),
        // Within the bound, but decimal: 0o670, not what chmod 440 means.
        (
            "device_file_mode = 440",
            "device_file_mode: must be written in octal, such as 0o660: 440 is 0o670",
        ),
        ("device_file_mode = 0x1b6", "device_file_mode"),
        ("\"device\\u005ffile_mode\" = 440", "device_file_mode: must be written in octal"),
        ("device_file_mode = 438", "device_file_mode"),
        ("hook_timeout_secs = 0", "hook_timeout_secs"),
        ("hook_timeout_secs = -5", "hook_timeout_secs"),
        ("hook_timeout_secs = 100000", "hook_timeout_secs"),
        ("[rdma]\nifname_prefix = \"\"", "rdma.ifname_prefix"),
        (
            "[rdma]\nifname_prefix = \"ens-frontend-\"",
            "rdma.ifname_prefix",
        ),
        ("[rdma]\nifname_prefix = \"a/b\"", "rdma.ifname_prefix"),
        ("[hami]\nlibrary_path = \"libvgpu.so\"", "hami.library_path"),
        (
            "[hami]\nlibrary_path = \"/opt/v gpu/libvgpu.so\"",
            "hami.library_path: must hold no space, colon or $",
        ),
        ("[hami]\nlibrary_path = \"/opt/a:b/libvgpu.so\"", "hami.library_path"),
        ("[hami]\nlibrary_path = \"/opt/$LIB/libvgpu.so\"", "hami.library_path"),
        (
            "[vf.defaults]\nqos = 3\n[vf.pf.\"0000:3b:00.0\"]\nmtu = 9000",
            "vf.pf.\"0000:3b:00.0\".qos",
        ),
        (
            "[vf.pf.\"0000:3b:00.0\"]\nvlan_proto = \"802.1ad\"",
            "vf.pf.\"0000:3b:00.0\".vlan_proto",
        ),
        (
            "[vf.defaults]\nvlan = 100\n[vf.pf.\"0000:3b:00.0\"]\nvlan = 0\nqos = 2",
            "vf.pf.\"0000:3b:00.0\".qos",
        ),
        ("[gpu]\nignored_pods = [\"koordlet-\"]", "gpu.ignored_pods"),
        (
            "[gpu]\nignored_pods = [\"kube-system/\"]",
            "gpu.ignored_pods",
        ),
        ("[gpu]\nignored_pods = [\"Kube/x\"]", "gpu.ignored_pods"),
        // Namespaces are RFC 1123 labels: no '-' at either end.
        ("[gpu]\nignored_pods = [\"-kube/x\"]", "gpu.ignored_pods"),
        ("[gpu]\nignored_pods = [\"kube-/x\"]", "gpu.ignored_pods"),
        ("[gpu]\nignored_pods = [\"a/b/c\"]", "gpu.ignored_pods"),
        // Levels every pod or service is under would hide every tenant's
        // processes from the teardown; entries the matcher cannot use would
        // be dropped unseen.
        (
            "[gpu]\nignored_cgroups = [\"kubepods.slice\"]",
            "gpu.ignored_cgroups: \"kubepods.slice\": a level",
        ),
        (
            "[gpu]\nignored_cgroups = [\"/kubepods\"]",
            "gpu.ignored_cgroups",
        ),
        (
            "[gpu]\nignored_cgroups = [\"/kubepods/burstable/\"]",
            "gpu.ignored_cgroups",
        ),
        (
            "[gpu]\nignored_cgroups = [\"system.slice\"]",
            "gpu.ignored_cgroups",
        ),
        // The systemd driver's QoS slices under `--cgroup-root=/k8s`.
        (
            "[gpu]\nignored_cgroups = [\"/k8s.slice/k8s-kubepods.slice\"]",
            "gpu.ignored_cgroups: \"/k8s.slice/k8s-kubepods.slice\": a level",
        ),
        (
            "[gpu]\nignored_cgroups = [\"/k8s.slice/k8s-kubepods.slice/k8s-kubepods-burstable.slice/\"]",
            "gpu.ignored_cgroups",
        ),
        (
            "[gpu]\nignored_cgroups = [\"k8s-kubepods-besteffort.slice\"]",
            "gpu.ignored_cgroups: \"k8s-kubepods-besteffort.slice\": a level",
        ),
        (
            "[gpu]\nignored_cgroups = [\"kubepods-burstable-pod1.slice\"]",
            "gpu.ignored_cgroups: \"kubepods-burstable-pod1.slice\": a pod's slice by name",
        ),
        (
            "[gpu]\nignored_cgroups = [\"/\"]",
            "gpu.ignored_cgroups: \"/\": not a unit name",
        ),
        ("[gpu]\nignored_cgroups = [\"\"]", "gpu.ignored_cgroups"),
        (
            "[gpu]\nignored_cgroups = [\"//\"]",
            "gpu.ignored_cgroups: \"//\": not a unit name",
        ),
        (
            "[gpu]\nignored_cgroups = [\"system.slice/dcgm.service\"]",
            "gpu.ignored_cgroups",
        ),
        ("[gpu]\nhealth_dir = \"var/lib/devgate\"", "gpu.health_dir"),
        ("[gpu]\nhealth_dir = \"\"", "gpu.health_dir"),
        (
            "[gpu]\nfull_reset = true\nreset_command = []",
            "gpu.reset_command",
        ),
        (
            "[gpu]\nfull_reset = true\nreset_command = [\"\", \"-r\"]",
            "gpu.reset_command",
        ),
        // Each table in range, their merge not: every VF of the PF would fail.
        (
            "[vf.defaults]\nmin_tx_rate = 1000\n[vf.pf.\"0000:3b:00.0\"]\nmax_tx_rate = 500",
            "vf.pf.\"0000:3b:00.0\".min_tx_rate",
        ),
    ] {
        let e = Config::parse(text, "t").unwrap_err();
        assert!(e.to_string().contains(key), "{text}: {e}");
    }
    // A priority with the VLAN it applies to, or the defaults' VLAN.
    Config::parse("[vf.defaults]\nvlan = 100\nqos = 3", "t").unwrap();
    Config::parse(
        "[vf.defaults]\nvlan = 100\n[vf.pf.\"0000:3b:00.0\"]\nqos = 2",
        "t",
    )
    .unwrap();
    Config::parse("device_file_mode = 0o660\nhook_timeout_secs = 30", "t").unwrap();
    Config::parse("device_file_mode = 0", "t").unwrap();
    Config::parse("# device_file_mode = 440\n[gpu]\nnvml = false", "t").unwrap();
    Config::parse("[gpu]\nreset_command = []", "t").unwrap();
    Config::parse("[gpu]\nignored_pods = [\"monitoring/dcgm-exporter\"]", "t").unwrap();
    Config::parse(
        "[gpu]\nignored_cgroups = [\"dcgm.service\", \"/system.slice/nvidia-dcgm.service\", \"/kubepods/burstable/pod6b2c\"]",
        "t",
    )
    .unwrap();
    // The VLAN from a PF section, or from the pod where pods may set it.
    Config::parse(
        "[vf.defaults]\nqos = 3\n[vf.pf.\"0000:3b:00.0\"]\nvlan = 7",
        "t",
    )
    .unwrap();
    Config::parse(
        "[vf]\npod_settings = [\"vlan\"]\n[vf.defaults]\nqos = 3\n[vf.pf.\"0000:3b:00.0\"]\nmtu = 9000",
        "t",
    )
    .unwrap();
}

/// A parse error says where: its line and column, and the key the line
/// begins with; never a value (a containerd config may hold credentials),
/// and on one line.
#[test]
fn parse_errors_name_their_line_and_key() {
    let cases = [
        (
            "log_format = \"json\"\n[gpu]\nkill_grace_ms = \"s3cret\"\n",
            "parse config c.toml: line 3, column 17, at kill_grace_ms: invalid type: string, expected u64",
        ),
        (
            "[gpu\n",
            "parse config c.toml: line 1, column 5: invalid table header; expected `.`, `]`",
        ),
        // A value continued on the next line is no key.
        (
            "cdi_spec_dirs = [\n  \"/etc/cdi\",\n  7,\n]\n",
            "parse config c.toml: line 3, column 3: invalid type: integer, expected path string",
        ),
    ];
    for (text, want) in cases {
        let e = Config::parse(text, "c.toml").unwrap_err();
        assert_eq!(e.to_string(), want);
    }
    let e = Config::parse("bogus = 1\n", "c.toml")
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("parse config c.toml: line 1, column 1, at bogus: unknown field `bogus`"),
        "{e}"
    );
}

/// serde's type errors keep their kinds and what was expected, never the value.
#[test]
fn type_errors_lose_their_values() {
    let cases = [
        (
            "invalid type: string \"a, b\", expected u64",
            "invalid type: string, expected u64",
        ),
        (
            "invalid type: string \"tok, expected xyz\", expected u64",
            "invalid type: string, expected u64",
        ),
        (
            "invalid type: floating point `1.5`, expected u32",
            "invalid type: floating point, expected u32",
        ),
        (
            "invalid value: integer `5`, expected one of 1, 2",
            "invalid value: integer, expected one of 1, 2",
        ),
        (
            "invalid type: unit value, expected a string",
            "invalid type: unit value, expected a string",
        ),
        ("unknown field `x`", "unknown field `x`"),
    ];
    for (why, want) in cases {
        assert_eq!(super::toml_error::without_value(why), want, "{why}");
    }
}

/// What `devgate status`, doctor and the inventory print of these settings is
/// what the config file says.
#[test]
fn enum_settings_print_as_the_config_spells_them() {
    fn spelled<T: Serialize>(value: T) -> String {
        serde_json::to_value(value)
            .unwrap()
            .as_str()
            .unwrap()
            .to_string()
    }
    for m in [DeviceMode::Nodes, DeviceMode::Cdi] {
        assert_eq!(m.as_str(), spelled(m));
    }
    for c in [RuntimeCdi::Auto, RuntimeCdi::On, RuntimeCdi::Off] {
        assert_eq!(c.as_str(), spelled(c));
    }
    for r in [RdmaNetnsMode::Shared, RdmaNetnsMode::Exclusive] {
        assert_eq!(r.as_str(), spelled(r));
    }
}
