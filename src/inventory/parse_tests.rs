use super::*;

const H100_INFORMATION: &str = "Model: \t\t NVIDIA H100 80GB HBM3\n\
IRQ:   \t\t 0\n\
GPU UUID: \t GPU-5a1e3f0c-8d2b-4c6e-9f10-2b3c4d5e6f70\n\
Video BIOS: \t 96.00.74.00.01\n\
Bus Type: \t PCIe\n\
DMA Size: \t 52 bits\n\
DMA Mask: \t 0xfffffffffffff\n\
Bus Location: \t 0000:18:00.0\n\
Device Minor: \t 2\n\
GPU Excluded:\t No\n";

#[test]
fn gpu_information_lines() {
    let full = GpuInformation {
        model: Some("NVIDIA H100 80GB HBM3".into()),
        uuid: Some("GPU-5a1e3f0c-8d2b-4c6e-9f10-2b3c4d5e6f70".into()),
        bus_location: Some("0000:18:00.0".into()),
        minor: Some(2),
        excluded: false,
    };
    let table: [(&str, GpuInformation); 6] = [
        (H100_INFORMATION, full.clone()),
        (
            "Device Minor: \t 0\nBlacklisted:\t Yes\n",
            GpuInformation {
                minor: Some(0),
                excluded: true,
                ..GpuInformation::default()
            },
        ),
        ("", GpuInformation::default()),
        (
            "Device Minor:  seven\nGPU Excluded: Yes\n",
            GpuInformation {
                excluded: true,
                ..GpuInformation::default()
            },
        ),
        (
            "Bus Location:0000:3a:00.0",
            GpuInformation {
                bus_location: Some("0000:3a:00.0".into()),
                ..GpuInformation::default()
            },
        ),
        (
            "garbage without colon\nDevice Minor: 255\n",
            GpuInformation {
                minor: Some(255),
                ..GpuInformation::default()
            },
        ),
    ];
    for (input, want) in table {
        assert_eq!(parse_gpu_information(input), want, "input {input:?}");
    }
}

#[test]
fn proc_devices_majors() {
    let modern = "Character devices:\n  1 mem\n 10 misc\n195 nvidia\n231 infiniband_verbs\n\
                  508 nvidia-uvm\n511 nvidia-caps\n\nBlock devices:\n  8 sd\n195 nvidia\n";
    let older = "Character devices:\n195 nvidia-frontend\n237 nvidia-uvm\n";
    let block_only = "Block devices:\n195 nvidia\n";
    let garbage = "Character devices:\nxx nvidia\n195\n";
    let table = [
        (modern, (Some(195), Some(508), Some(511))),
        (older, (Some(195), Some(237), None)),
        (block_only, (None, None, None)),
        (garbage, (None, None, None)),
        ("", (None, None, None)),
    ];
    for (input, (nvidia, uvm, caps)) in table {
        let got = nvidia_majors(input);
        assert_eq!(
            (got.nvidia, got.nvidia_uvm, got.nvidia_caps),
            (nvidia, uvm, caps),
            "{input:?}"
        );
    }
    assert_eq!(parse_char_majors(modern).len(), 6);
}

#[test]
fn dev_files() {
    let table = [
        ("231:192\n", Some((231, 192))),
        ("510:0", Some((510, 0))),
        (" 10:58 \n", Some((10, 58))),
        ("231", None),
        ("231:", None),
        (":1", None),
        ("-1:2", None),
        ("a:b", None),
        ("99999999999:1", None),
    ];
    for (input, want) in table {
        let got = parse_dev_num(input).map(|d| (d.major, d.minor));
        assert_eq!(got, want, "input {input:?}");
    }
}

#[test]
fn port_states() {
    let table = [
        ("4: ACTIVE\n", Some("ACTIVE")),
        ("1: DOWN", Some("DOWN")),
        ("5: ACTIVE_DEFER\n", Some("ACTIVE_DEFER")),
        ("ACTIVE", None),
        ("x: ACTIVE", None),
        ("4:", None),
        ("4: active", None),
    ];
    for (input, want) in table {
        assert_eq!(parse_port_state(input).as_deref(), want, "input {input:?}");
    }
}

#[test]
fn link_layers() {
    let table = [
        ("InfiniBand\n", LinkLayer::InfiniBand),
        ("Ethernet\n", LinkLayer::Ethernet),
        ("Unknown\n", LinkLayer::Unknown),
        ("infiniband", LinkLayer::Unknown),
        ("", LinkLayer::Unknown),
    ];
    for (input, want) in table {
        assert_eq!(parse_link_layer(input), want, "input {input:?}");
    }
}

#[test]
fn class_codes() {
    let table = [
        ("0x060400\n", Some(0x060400), true),
        ("0x060401", Some(0x060401), true),
        ("0x030200", Some(0x030200), false),
        ("0x020700", Some(0x020700), false),
        ("0x060000", Some(0x060000), false),
        ("060400", None, false),
        ("0x", None, false),
        ("0x1234567", None, false),
        ("0xzz0400", None, false),
    ];
    for (input, want, bridge) in table {
        let got = parse_class(input);
        assert_eq!(got, want, "input {input:?}");
        assert_eq!(got.is_some_and(is_bridge_class), bridge, "input {input:?}");
    }
}

#[test]
fn numa_nodes() {
    let table = [
        ("-1\n", Some(None)),
        ("0\n", Some(Some(0))),
        ("1", Some(Some(1))),
        ("-2", None),
        ("one", None),
        ("", None),
    ];
    for (input, want) in table {
        assert_eq!(parse_numa_node(input), want, "input {input:?}");
    }
}

#[test]
fn names() {
    assert_eq!(parse_virtfn("virtfn0"), Some(0));
    assert_eq!(parse_virtfn("virtfn17"), Some(17));
    assert_eq!(parse_virtfn("virtfn"), None);
    assert_eq!(parse_virtfn("virtfnx"), None);
    let chars = [
        ("uverbs40", Some((RdmaCharKind::Uverbs, 40))),
        ("umad3", Some((RdmaCharKind::Umad, 3))),
        ("issm3", Some((RdmaCharKind::Issm, 3))),
        ("abi_version", None),
        ("uverbs", None),
    ];
    for (input, want) in chars {
        assert_eq!(parse_rdma_char_name(input), want, "input {input:?}");
    }
    let minors = [
        ("mlx5_0", Some(0)),
        ("mlx5_12", Some(12)),
        ("mlx4_3", Some(3)),
        ("mlx5_", None),
        ("mlx_1", None),
        ("rocep218s0f0", None),
        ("mlx5_bond_0", None),
    ];
    for (input, want) in minors {
        assert_eq!(mlx_minor(input), want, "input {input:?}");
    }
    let roots = [
        ("pci0000:15", true),
        ("pci10000:00", true),
        ("pci0000:1", false),
        ("0000:15:01.0", false),
        ("platform", false),
        ("pcixxxx:00", false),
    ];
    for (input, want) in roots {
        assert_eq!(is_pcie_root(input), want, "input {input:?}");
    }
}
