use super::super::Config;
use super::*;

#[test]
fn defaults_turn_everything_on_under_its_own_name() {
    let c = CommEnvConfig::default();
    for v in CommVar::ALL {
        assert_eq!(c.name_of(v), Some(v.default_name()));
    }
    let off = CommEnvConfig {
        enabled: false,
        ..CommEnvConfig::default()
    };
    assert!(CommVar::ALL.iter().all(|&v| off.name_of(v).is_none()));
}

#[test]
fn off_rename_and_extra_parse() {
    let c = Config::parse(
        "[comm_env]\nNCCL_SOCKET_IFNAME = false\nNCCL_IB_HCA = \"MY_HCA\"\ngid_family = \"ipv6\"\n\
         [comm_env.extra]\nGLOO_SOCKET_IFNAME = \"{netdevs}\"\n",
        "t",
    )
    .unwrap();
    let e = &c.comm_env;
    assert_eq!(e.name_of(CommVar::NcclSocketIfname), None);
    assert_eq!(e.name_of(CommVar::NcclIbHca), Some("MY_HCA"));
    assert_eq!(e.name_of(CommVar::UcxNetDevices), Some("UCX_NET_DEVICES"));
    assert_eq!(e.gid_family, GidFamily::Ipv6);
    assert_eq!(e.extra["GLOO_SOCKET_IFNAME"], "{netdevs}");
    // Serde's round trip (serialized, the mode is decimal text, which
    // `Config::parse` refuses from a person: see `mode_written_in_octal`).
    let text = toml::to_string(&c).unwrap();
    assert_eq!(toml::from_str::<Config>(&text).unwrap(), c);
}

#[test]
fn bad_settings_are_refused_with_their_key() {
    let table = [
        ("[comm_env]\nNCCL_IB_HCS = false\n", "NCCL_IB_HCS"),
        (
            "[comm_env]\nNCCL_IB_HCA = 3\n",
            "true, false or a variable name",
        ),
        ("[comm_env]\nNCCL_IB_HCA = \"1X\"\n", "comm_env.NCCL_IB_HCA"),
        (
            "[comm_env]\nNCCL_IB_HCA = \"A=B\"\n",
            "comm_env.NCCL_IB_HCA",
        ),
        ("[comm_env]\nNCCL_IB_HCA = \"\"\n", "comm_env.NCCL_IB_HCA"),
        (
            "[comm_env]\nNCCL_IB_HCA = \"UCX_NET_DEVICES\"\n",
            "sets UCX_NET_DEVICES, as comm_env.NCCL_IB_HCA does",
        ),
        (
            "[comm_env.extra]\nNCCL_IB_HCA = \"{rdma_devices}\"\n",
            "comm_env.extra.NCCL_IB_HCA: sets NCCL_IB_HCA",
        ),
        (
            "[comm_env.extra]\nLD_PRELOAD = \"x\"\n",
            "set by devgate for another purpose",
        ),
        (
            "[comm_env.extra]\nCUDA_DEVICE_SM_LIMIT_0 = \"x\"\n",
            "set by devgate for another purpose",
        ),
        (
            "[comm_env.extra]\nCUDA_VISIBLE_DEVICES = \"{gpu_uuids}\"\n",
            "comm_env.extra.CUDA_VISIBLE_DEVICES: CUDA_VISIBLE_DEVICES renumbers",
        ),
        (
            "[comm_env]\nNCCL_IB_HCA = \"CUDA_VISIBLE_DEVICES\"\n",
            "comm_env.NCCL_IB_HCA: CUDA_VISIBLE_DEVICES renumbers",
        ),
        (
            "[comm_env.extra]\nX = \"{gpu_uuid}\"\n",
            "unknown placeholder {gpu_uuid}",
        ),
        ("[comm_env.extra]\nX = \"a{netdevs\"\n", "a brace outside"),
        ("[comm_env.extra]\nX = \"a}\"\n", "a brace outside"),
        ("[comm_env.extra]\nX = \"a\\nb\"\n", "control character"),
    ];
    for (text, want) in table {
        let e = Config::parse(text, "t").unwrap_err().to_string();
        assert!(e.contains(want), "{text:?}: {e}");
    }
    let long = format!(
        "[comm_env.extra]\nX = \"{}\"\n",
        "a".repeat(MAX_TEMPLATE + 1)
    );
    assert!(Config::parse(&long, "t").is_err());
    let many: String = (0..=MAX_EXTRA).map(|i| format!("V{i} = \"x\"\n")).collect();
    let e = Config::parse(&format!("[comm_env.extra]\n{many}"), "t").unwrap_err();
    assert!(e.to_string().contains("at most 32"), "{e}");
    // Turned off, a variable frees its name for a template.
    let ok =
        "[comm_env]\nNCCL_IB_HCA = false\n[comm_env.extra]\nNCCL_IB_HCA = \"={rdma_devices}\"\n";
    assert!(Config::parse(ok, "t").is_ok());
}

#[test]
fn templates_split_into_text_and_lists() {
    assert_eq!(
        parse_template("a{netdevs}:{numa_nodes}").unwrap(),
        [
            Piece::Text("a"),
            Piece::List(Placeholder::Netdevs),
            Piece::Text(":"),
            Piece::List(Placeholder::NumaNodes),
        ]
    );
    assert_eq!(parse_template("").unwrap(), []);
    assert_eq!(
        parse_template("{}").unwrap_err().split(';').next(),
        Some("unknown placeholder {}")
    );
}
