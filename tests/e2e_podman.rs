//! Hooks-only mode end to end with podman 4.3 and runc: the shipped hooks.d
//! file (pointed at the built `devgate-hook` and a simulated HGX host root)
//! gives a container with the Koordinator annotation its device nodes, device
//! cgroup rules and VF, with no NRI plugin anywhere. Needs root; fails without it.
//!
//! podman runs with private storage under a temp dir, so tests never share a
//! container or image store.
mod support;

#[path = "hook_netns/net.rs"]
mod net;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use devgate::allocation::DEVICE_ALLOCATED;
use devgate::fixture::HostRootBuilder;
use devgate::ledger::Ledger;
use net::{link, In, NamedNs, Veth};
use support::node::{allocation, gpu_entry, vf_entry};
use support::{image_set, require_root, wait_for, SLOW, WORKLOAD_IMAGE};

/// podman with its own root, runroot and tmpdir; everything removed on drop.
struct Podman {
    dir: PathBuf,
    hooks: PathBuf,
}

impl Podman {
    fn new(dir: &Path, hooks: PathBuf) -> Podman {
        Podman {
            dir: dir.to_path_buf(),
            hooks,
        }
    }

    fn cmd(&self, args: &[&str]) -> Output {
        let d = |p: &str| self.dir.join(p).display().to_string();
        Command::new("podman")
            .args([
                "--root",
                &d("root"),
                "--runroot",
                &d("run"),
                "--tmpdir",
                &d("tmp"),
            ])
            .args([
                "--storage-driver",
                "overlay",
                "--cgroup-manager",
                "cgroupfs",
            ])
            .args(["--events-backend", "none", "--hooks-dir"])
            .arg(&self.hooks)
            .args(args)
            .output()
            .expect("spawn podman (tests/setup-host.sh installs it)")
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.cmd(args);
        assert!(
            out.status.success(),
            "podman {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `sh -c script` in a running container: (exit code, stdout + stderr).
    fn exec(&self, name: &str, script: &str) -> (i32, String) {
        let out = self.cmd(&["exec", name, "sh", "-c", script]);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code().unwrap_or(-1), text)
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self.cmd(&["rm", "--force", "--all", "--time", "0"]);
        let _ = self.cmd(&["system", "reset", "--force"]);
    }
}

/// The shipped hooks file, with the hook binary, state and host root of this test.
fn hooks_dir(dir: &Path, host_root: &Path, state: &Path, config: &Path) -> PathBuf {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("hooks/devgate.json");
    let mut hook: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&shipped).unwrap()).unwrap();
    assert_eq!(hook["version"], "1.0.0");
    assert_eq!(hook["hook"]["path"], "/usr/local/bin/devgate-hook");
    let mut args: Vec<String> = serde_json::from_value(hook["hook"]["args"].clone()).unwrap();
    let at = args.iter().position(|a| a == "--state-dir").unwrap();
    args[at + 1] = state.display().to_string();
    args.extend(["--host-root".to_string(), host_root.display().to_string()]);
    hook["hook"]["path"] = env!("CARGO_BIN_EXE_devgate-hook").into();
    hook["hook"]["args"] = args.into();
    hook["hook"]["env"] = vec![format!("DEVGATE_CONFIG={}", config.display())].into();
    let hooks = dir.join("hooks.d");
    std::fs::create_dir_all(&hooks).unwrap();
    std::fs::write(hooks.join("devgate.json"), hook.to_string()).unwrap();
    hooks
}

#[test]
fn podman_container_gets_its_devices_and_vf_from_the_hooks_file() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let fixture = HostRootBuilder::hgx()
        .vf_netdev_prefix("dgpm")
        .build(&dir.path().join("host"))
        .unwrap();
    let inv = fixture.expected();
    let (gpu, other_gpu) = (&inv.gpus[0], &inv.gpus[1]);
    let (pf, vf) = (&inv.rdma[0], &inv.rdma[0].vfs[1]);
    let host_name = vf.netdev.clone().expect("fixture vf netdev");
    let stand_in = Veth::new(&host_name, "dgpmpeer", "02:00:00:de:0b:01");
    let uverbs = vf.rdma.as_ref().expect("vf rdma").char_devs[0].name.clone();
    let alloc = allocation(
        &[gpu_entry(gpu.minor, &gpu.uuid)],
        &[vf_entry(0, pf.bus_id, vf.bus_id)],
    );
    let state = dir.path().join("state");
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "log_format = \"text\"\n").unwrap();
    let hooks = hooks_dir(dir.path(), fixture.root(), &state, &config);
    let podman = Podman::new(dir.path(), hooks);
    podman.ok(&[
        "load",
        "--input",
        &image_set().workload.display().to_string(),
    ]);

    // The container's own netns, pinned like a pod's: a veth stand-in would die
    // with an unpinned one (a real VF returns to the host), leaving nothing to restore.
    let pod_ns = NamedNs::new("dgpm");
    let netns = format!("ns:/run/netns/{}", pod_ns.0);
    // podman 4.3 reads --annotation as a CSV list (pflag StringSlice): quote it.
    let annotation = format!(
        "\"{}\"",
        format!("{DEVICE_ALLOCATED}={alloc}").replace('"', "\"\"")
    );
    podman.ok(&[
        "run",
        "--detach",
        "--name",
        "dgpm",
        "--network",
        &netns,
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
        "--annotation",
        &annotation,
        WORKLOAD_IMAGE,
        "sleep",
        "300",
    ]);
    let gpu_node = format!("/dev/nvidia{}", gpu.minor);
    let (code, out) = podman.exec(
        "dgpm",
        &format!("stat -c '%n %t %T' {gpu_node} /dev/nvidiactl /dev/infiniband/{uverbs}"),
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("{gpu_node} c3 {:x}", gpu.minor)),
        "{out}"
    );
    assert!(out.contains("/dev/nvidiactl c3 ff"), "{out}");
    // Allowed by the device cgroup, no driver behind it.
    let (_, out) = podman.exec("dgpm", &format!("cat {gpu_node}"));
    assert!(out.contains("No such device or address"), "{out}");
    let (code, out) = podman.exec("dgpm", &format!("ls /dev/nvidia{}", other_gpu.minor));
    assert_ne!(code, 0, "an ungranted gpu node is there: {out}");
    let (code, out) = podman.exec(
        "dgpm",
        "ip -o link show net1 && cat /proc/sys/net/ipv4/conf/net1/arp_notify",
    );
    assert_eq!(code, 0, "net1 missing in the container: {out}");
    assert!(
        out.contains("02:00:00:de:0b:01") && out.ends_with("1\n"),
        "{out}"
    );
    assert!(
        link(In::Host, &host_name).is_none(),
        "the VF is still on the host"
    );
    let held = Ledger::open(&state).unwrap().snapshot().unwrap();
    assert_eq!(held.pods.len(), 1, "{held:?}");

    podman.ok(&["stop", "--time", "1", "dgpm"]);
    podman.ok(&["rm", "dgpm"]);
    let log = || std::fs::read_to_string(state.join("hook.log")).unwrap_or_default();
    let back = wait_for("vf back on the host", SLOW, || link(In::Host, &host_name));
    assert!(log().contains("hook done"), "{}", log());
    assert_eq!(back.address.as_deref(), Some("02:00:00:de:0b:01"));
    wait_for("claims released", SLOW, || {
        let l = Ledger::open(&state).ok()?.snapshot().ok()?;
        (l.pods.is_empty() && l.devices.is_empty()).then_some(())
    });
    drop(stand_in);
    drop(pod_ns);
}
