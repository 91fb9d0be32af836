//! `devgate inventory` run as a process on fixture host roots.

#[path = "support/full_stdout.rs"]
mod full_stdout;
use std::path::Path;
use std::process::{Command, Output};

use devgate::fixture::{Fixture, HostRootBuilder};
use devgate::inventory::view::InventoryView;
use devgate::inventory::{Health, LinkLayer};
use serde_json::Value;

/// `devgate inventory --host-root root args` run to its end, under
/// `wrapper` (a command it is the arguments of) when not empty, with
/// `NODE_NAME` set to `node_name` or not set.
fn run_inventory_as(
    wrapper: &[&str],
    root: &Path,
    args: &[&str],
    node_name: Option<&str>,
) -> Output {
    let devgate = env!("CARGO_BIN_EXE_devgate");
    let mut cmd = match wrapper.split_first() {
        Some((program, rest)) => {
            let mut cmd = Command::new(program);
            cmd.args(rest).arg(devgate);
            cmd
        }
        None => Command::new(devgate),
    };
    cmd.arg("inventory").arg("--host-root").arg(root).args(args);
    match node_name {
        Some(name) => cmd.env("NODE_NAME", name),
        None => cmd.env_remove("NODE_NAME"),
    };
    cmd.output().expect("run devgate inventory")
}

/// [`run_inventory_as`] itself, without a `NODE_NAME`.
fn run_inventory(root: &Path, args: &[&str]) -> Output {
    run_inventory_as(&[], root, args, None)
}

/// The name of the device object `out` printed.
fn name_of(out: &Output) -> String {
    let cr: serde_yaml_ng::Value = serde_yaml_ng::from_slice(&out.stdout).expect("yaml");
    cr["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// [`run_inventory`] that must succeed.
fn inventory(root: &Path, args: &[&str]) -> Output {
    let output = run_inventory(root, args);
    assert!(
        output.status.success(),
        "devgate failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn hgx() -> (tempfile::TempDir, Fixture) {
    let dir = tempfile::tempdir().expect("tempdir");
    let fixture = HostRootBuilder::hgx().build(dir.path()).expect("fixture");
    (dir, fixture)
}

/// One fixture for all three formats: writing it takes a while on a slow disk.
#[test]
fn every_format_on_the_hgx_fixture() {
    let (_dir, fixture) = hgx();
    check_json(&fixture);
    check_device_cr(&fixture);
    let table = inventory(fixture.root(), &[]);
    let text = String::from_utf8(table.stdout).expect("utf-8");
    assert!(
        text.contains("0000:18:00.0") && text.contains("rocep218s0f1") && text.contains("PIX"),
        "{text}"
    );
    assert!(
        table.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&table.stderr)
    );
}

fn check_json(fixture: &Fixture) {
    let out = inventory(fixture.root(), &["-o", "json"]);
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value = serde_json::from_slice(&out.stdout).expect("json");
    let typed: InventoryView = serde_json::from_value(json.clone()).expect("typed view");
    assert_eq!(typed.version, 1);
    let want = fixture.expected();

    let gpus = json["gpus"].as_array().expect("gpus");
    assert_eq!(gpus.len(), want.gpus.len());
    for (got, want) in gpus.iter().zip(&want.gpus) {
        assert_eq!(got["index"], want.index);
        assert_eq!(got["minor"], want.minor);
        assert_eq!(got["uuid"], want.uuid.as_str());
        assert_eq!(got["bus_id"], want.bus_id.to_string());
        assert_eq!(got["numa_node"], want.topology.numa_node.expect("numa"));
        assert_eq!(got["pcie_root"], want.topology.pcie_root.as_str());
        assert_eq!(got["model"], want.model.as_str());
        assert_eq!(got["health"], "healthy");
        assert_eq!(got["device"], format!("195:{}", want.minor));
    }
    assert_eq!(gpus[0]["minor"], 2);
    assert_eq!(gpus[0]["rdma_affinity"]["mlx5_0"], "PIX");

    let nics = json["rdma"].as_array().expect("rdma");
    assert_eq!(nics.len(), want.rdma.len());
    for (got, want) in nics.iter().zip(&want.rdma) {
        assert_eq!(got["name"], want.rdma.name.as_str());
        assert_eq!(got["bus_id"], want.bus_id.to_string());
        assert_eq!(got["netdev"], want.netdevs[0].as_str());
        assert_eq!(got["numa_node"], want.topology.numa_node.expect("numa"));
        assert_eq!(got["pcie_root"], want.topology.pcie_root.as_str());
        let layer = match want.rdma.ports[0].link_layer {
            LinkLayer::InfiniBand => "InfiniBand",
            _ => "Ethernet",
        };
        assert_eq!(got["link_layer"], layer);
        assert_eq!(got["ports"][0]["state"], want.rdma.ports[0].state.as_str());
        assert_eq!(
            got["health"],
            if want.health == Health::Healthy {
                "healthy"
            } else {
                "unhealthy"
            }
        );
        let chars = got["char_devices"].as_array().expect("char devices");
        assert_eq!(chars.len(), want.rdma.char_devs.len());
        for (c, w) in chars.iter().zip(&want.rdma.char_devs) {
            assert_eq!(c["dev"], w.dev.to_string());
            assert_eq!(c["path"], format!("/dev/infiniband/{}", w.name));
        }
        let vfs = got["vfs"].as_array().expect("vfs");
        assert_eq!(vfs.len(), want.vfs.len());
        for (v, w) in vfs.iter().zip(&want.vfs) {
            assert_eq!(v["index"], w.index);
            assert_eq!(v["bus_id"], w.bus_id.to_string());
            assert_eq!(v["netdev"].as_str(), w.netdev.as_deref());
            assert_eq!(v["rdma"].as_str(), w.rdma.as_ref().map(|r| r.name.as_str()));
            assert_eq!(v["driver"].as_str(), w.driver.as_deref());
        }
    }
    assert_eq!(nics[0]["char_devices"][0]["dev"], "231:192");
    assert_eq!(nics[0]["vfs"][0]["netdev"], "ibp25s0v0");
    assert_eq!(nics[7]["vfs"][3]["char_devices"][0]["dev"], "510:9");
    assert_eq!(nics[9]["health"], "unhealthy");
    assert!(json.get("warnings").is_none());
    // No ib_core in the fixture: the kernel's mode is unknown.
    assert_eq!(json["rdma_netns_mode"], Value::Null);
    let param = fixture.root().join(devgate::inventory::NETNS_MODE_PARAM);
    std::fs::create_dir_all(param.parent().unwrap()).unwrap();
    std::fs::write(&param, "N\n").unwrap();
    let out = inventory(fixture.root(), &["-o", "json"]);
    let json: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(json["rdma_netns_mode"], "exclusive");
    let table = String::from_utf8(inventory(fixture.root(), &[]).stdout).unwrap();
    assert!(table.contains("netns mode exclusive"), "{table}");
    std::fs::remove_dir_all(fixture.root().join("sys/module/ib_core")).unwrap();
}

fn check_device_cr(fixture: &Fixture) {
    let out = inventory(fixture.root(), &["-o", "device-cr"]);
    let cr: serde_yaml_ng::Value = serde_yaml_ng::from_slice(&out.stdout).expect("yaml");
    assert_eq!(
        cr["apiVersion"].as_str(),
        Some("scheduling.koordinator.sh/v1alpha1")
    );
    assert_eq!(cr["kind"].as_str(), Some("Device"));
    assert_eq!(cr["metadata"]["name"].as_str(), Some(fixture.hostname()));
    let devices = cr["spec"]["devices"].as_sequence().expect("devices");
    assert_eq!(devices.len(), 18);
    let mut gpu_minors = Vec::new();
    let mut rdma_minors = Vec::new();
    let inv = fixture.expected();
    // nodeID is the NUMA node, -1 read as 0 as koordlet does.
    let node_id = |t: &devgate::inventory::Topology| i64::from(t.numa_node.unwrap_or(0));
    for d in devices {
        let minor = d["minor"].as_i64().expect("every device has a minor");
        let topology = &d["topology"];
        assert_eq!(topology["socketID"].as_i64(), Some(-1));
        assert!(topology["pcieID"]
            .as_str()
            .is_some_and(|p| p.starts_with("pci0000:")));
        match d["type"].as_str() {
            Some("gpu") => {
                gpu_minors.push(minor);
                let gpu = inv
                    .gpus
                    .iter()
                    .find(|g| i64::from(g.minor) == minor)
                    .unwrap();
                assert_eq!(d["id"].as_str(), Some(gpu.uuid.as_str()));
                assert_eq!(
                    topology["busID"].as_str(),
                    Some(gpu.bus_id.to_string().as_str())
                );
                assert_eq!(topology["nodeID"].as_i64(), Some(node_id(&gpu.topology)));
                assert_eq!(
                    topology["pcieID"].as_str(),
                    Some(gpu.topology.pcie_root.as_str())
                );
                assert_eq!(
                    d["resources"]["koordinator.sh/gpu-core"].as_str(),
                    Some("100")
                );
            }
            Some("rdma") => {
                rdma_minors.push(minor);
                let id = d["id"].as_str().expect("pf bus id");
                let nic = inv
                    .rdma
                    .iter()
                    .find(|n| n.bus_id.to_string() == id)
                    .unwrap();
                assert_eq!(topology["busID"].as_str(), Some(id));
                assert_eq!(topology["nodeID"].as_i64(), Some(node_id(&nic.topology)));
                assert_eq!(d["resources"]["koordinator.sh/rdma"].as_str(), Some("100"));
                let vfs: Vec<&str> = d["vfGroups"][0]["vfs"]
                    .as_sequence()
                    .into_iter()
                    .flatten()
                    .map(|vf| {
                        assert_eq!(vf["minor"].as_i64(), Some(-1));
                        vf["busID"].as_str().expect("vf busID")
                    })
                    .collect();
                // Only VFs with an RDMA device are offered.
                let mut want: Vec<String> = nic
                    .vfs
                    .iter()
                    .filter(|v| v.rdma.is_some())
                    .map(|v| v.bus_id.to_string())
                    .collect();
                want.sort();
                assert_eq!(vfs, want, "{id}");
            }
            other => panic!("unexpected device type {other:?}"),
        }
    }
    assert_eq!(gpu_minors, (0..8).collect::<Vec<_>>());
    assert_eq!(rdma_minors, (0..10).collect::<Vec<_>>());
    let named = inventory(
        fixture.root(),
        &["-o", "device-cr", "--node-name", "node-7"],
    );
    let named: serde_yaml_ng::Value = serde_yaml_ng::from_slice(&named.stdout).expect("yaml");
    assert_eq!(named["metadata"]["name"].as_str(), Some("node-7"));
}

#[test]
fn warnings_go_to_stderr_and_json_stays_clean() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = HostRootBuilder::hgx()
        .gpus(2)
        .nics(1)
        .vfs_per_pf(1)
        .intel_rdma(false);
    let fixture = b.build(dir.path()).expect("fixture");
    let info = dir
        .path()
        .join("proc/driver/nvidia/gpus/0000:18:00.0/information");
    std::fs::remove_file(info).expect("remove");
    let out = inventory(fixture.root(), &["-o", "json"]);
    let json: Value = serde_json::from_slice(&out.stdout).expect("json on stdout");
    assert_eq!(json["gpus"].as_array().map(Vec::len), Some(1));
    let stderr = String::from_utf8(out.stderr).expect("utf-8");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with("devgate: warning: ") && lines[0].contains("information"),
        "{stderr}"
    );
}

/// A root without a sysfs (a wrong `--host-root`, an unmounted `/host/sys`)
/// fails instead of showing a node without devices; one with a sysfs and no
/// hostname names its device object after this machine, with a warning,
/// and needs `--node-name` from a UTS namespace of its own.
#[test]
fn a_missing_hostname_is_this_machines_or_needs_a_node_name() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (a UTS namespace of its own)"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let status = run_inventory(dir.path(), &["-o", "device-cr"]);
    assert!(!status.status.success());
    assert!(String::from_utf8_lossy(&status.stderr).contains("no sysfs under"));
    // A node with a sysfs but no devices: an empty object, once named.
    std::fs::create_dir_all(dir.path().join("sys/devices")).unwrap();
    let own = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let own = own.trim();
    let status = run_inventory(dir.path(), &["-o", "device-cr"]);
    let stderr = String::from_utf8_lossy(&status.stderr);
    assert!(status.status.success(), "{stderr}");
    assert_eq!(name_of(&status), own.to_lowercase());
    assert!(
        stderr.contains("no proc/sys/kernel/hostname under") && stderr.contains("--node-name"),
        "{stderr}"
    );
    // In a UTS namespace of its own, and in one with a pid namespace of its
    // own too (a container without the host's pids, whose pid 1 shares its
    // UTS namespace): refused.
    for wrapper in [
        &["unshare", "-u"][..],
        &["unshare", "-u", "-p", "-f", "--mount-proc"],
    ] {
        let unshared = run_inventory_as(wrapper, dir.path(), &["-o", "device-cr"], None);
        assert!(!unshared.status.success(), "{wrapper:?}");
        assert!(
            String::from_utf8_lossy(&unshared.stderr)
                .contains("no node name for the device object (pass --node-name)"),
            "{wrapper:?}"
        );
    }
    let ok = inventory(dir.path(), &["-o", "device-cr", "--node-name", "empty"]);
    let cr: serde_yaml_ng::Value = serde_yaml_ng::from_slice(&ok.stdout).expect("yaml");
    assert_eq!(cr["spec"]["devices"].as_sequence().map(Vec::len), Some(0));
}

/// Without `--health-dir`, GPU health comes from `[gpu] health_dir` of the
/// config, where the plugin marks it: a GPU marked unhealthy there shows so.
#[test]
fn gpu_health_comes_from_the_configs_health_dir() {
    use devgate::gpu::health::Fault;
    let (dir, fixture) = hgx();
    let health = dir.path().join("health");
    let config = dir.path().join("devgate.toml");
    std::fs::write(
        &config,
        format!(
            "[gpu]\nnvml = false\nhealth_dir = \"{}\"\n",
            health.display()
        ),
    )
    .unwrap();
    let gpu = &fixture.expected().gpus[1];
    devgate::gpu::HealthStore::new(&health)
        .mark(&gpu.uuid, &[Fault::Xid { code: 79 }], 1)
        .unwrap();
    let out = inventory(
        fixture.root(),
        &["-o", "json", "--config", config.to_str().unwrap()],
    );
    let json: Value = serde_json::from_slice(&out.stdout).expect("json");
    let gpus = json["gpus"].as_array().unwrap();
    let marked = gpus
        .iter()
        .find(|g| g["uuid"] == gpu.uuid.as_str())
        .unwrap();
    assert_eq!(marked["health"], "unhealthy", "{marked}");
    assert!(gpus
        .iter()
        .filter(|g| g["uuid"] != gpu.uuid.as_str())
        .all(|g| g["health"] == "healthy"));
}

/// The device object's name: `--node-name`, else `$NODE_NAME` (a Job's
/// downward API), else the host name, which a process in a UTS namespace of
/// its own cannot read: it fails rather than name the object after its pod.
#[test]
fn the_node_name_comes_from_the_flag_the_environment_or_the_hosts_uts() {
    let (_dir, fixture) = hgx();
    let with_env = run_inventory_as(
        &[],
        fixture.root(),
        &["-o", "device-cr"],
        Some("node-from-env"),
    );
    assert!(with_env.status.success());
    assert_eq!(name_of(&with_env), "node-from-env");
    let flag = inventory(
        fixture.root(),
        &["-o", "device-cr", "--node-name", "node-a"],
    );
    assert_eq!(name_of(&flag), "node-a");
    // Lower-cased as kubelet makes a given name; one the API server would
    // refuse is refused here, with nothing printed.
    let upper = inventory(
        fixture.root(),
        &["-o", "device-cr", "--node-name", "Node-A"],
    );
    assert_eq!(name_of(&upper), "node-a");
    for bad in ["", "node_a", "-node", "node a"] {
        let flag = format!("--node-name={bad}");
        let out = run_inventory(fixture.root(), &["-o", "device-cr", &flag]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad:?}: {stderr}");
        assert!(stderr.contains("is not a node's name"), "{bad:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{bad:?}");
    }
}

/// The host's procfs read from a UTS namespace of its own shows that
/// namespace's name, not the node's: refused, unless `$NODE_NAME` names it.
#[test]
fn the_hosts_procfs_from_another_uts_namespace_is_refused() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (a UTS namespace of its own)"
    );
    let unshare = ["unshare", "-u"];
    let root = Path::new("/");
    let unshared = run_inventory_as(&unshare, root, &["-o", "device-cr"], None);
    let stderr = String::from_utf8_lossy(&unshared.stderr);
    assert!(!unshared.status.success(), "{stderr}");
    assert!(stderr.contains("another UTS namespace"), "{stderr}");
    // There, $NODE_NAME names the node.
    let named = run_inventory_as(&unshare, root, &["-o", "device-cr"], Some("node-b"));
    assert!(
        named.status.success(),
        "{}",
        String::from_utf8_lossy(&named.stderr)
    );
    assert_eq!(name_of(&named), "node-b");
}

/// A report that cannot be written (stdout on a full disk) fails with one
/// line, exit 1, not a panic: `inventory` and `cdi generate` alike.
#[test]
fn a_failed_write_to_stdout_is_an_error_not_a_panic() {
    let (_dir, fixture) = hgx();
    let root = fixture.root().to_str().unwrap();
    let runs: [&[&str]; 3] = [
        &["inventory", "--host-root", root],
        &["inventory", "-o", "json", "--host-root", root],
        &[
            "cdi",
            "generate",
            "--config",
            "/nonexistent/devgate.toml",
            "--host-root",
            root,
        ],
    ];
    for args in runs {
        full_stdout::fails_cleanly(args);
    }
}
