//! Scratch network objects for the root tests, each owned by an RAII guard:
//! named netns (`ip netns`), processes in a fresh netns (`unshare -n`), veth
//! pairs standing in for VF netdevs (a veth moves, renames and takes a MAC and
//! MTU like a VF netdev; see test-environment.md "Network stand-ins").
#![allow(dead_code)]

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use devgate::hook::{Resolved, RESOLVED_ANNOTATION};
use devgate::netdev::{VfAttach, VfSettings};
use serde::Deserialize;

/// These tests create namespaces and move links: they need root. Fail, never skip.
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the netns tests need root (they create network namespaces and veth pairs)"
    );
}

/// Runs a command; panics with its stderr when it fails.
pub fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .expect("spawn");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn quiet(args: &[&str]) {
    let _ = Command::new(args[0])
        .args(&args[1..])
        .stderr(Stdio::null())
        .status();
}

/// A named netns under /run/netns, deleted on drop.
pub struct NamedNs(pub String);

impl NamedNs {
    pub fn new(name: &str) -> NamedNs {
        quiet(&["ip", "netns", "del", name]);
        sh(&["ip", "netns", "add", name]);
        NamedNs(name.to_string())
    }

    pub fn delete(&self) {
        sh(&["ip", "netns", "del", &self.0]);
    }
}

impl Drop for NamedNs {
    fn drop(&mut self) {
        quiet(&["ip", "netns", "del", &self.0]);
    }
}

/// A process alone in a fresh netns; killed on drop.
pub struct Sleeper(pub Child);

impl Sleeper {
    /// A process alone in a fresh netns (`unshare -n`).
    pub fn new() -> Sleeper {
        let me = std::fs::read_link("/proc/self/ns/net").unwrap();
        Sleeper::spawn(&["unshare", "-n", "sleep", "infinity"], |l| {
            l.read_link().map(|t| t != me)
        })
    }

    /// A process in the host's netns, as a hostNetwork pod's are.
    pub fn on_host() -> Sleeper {
        let me = std::fs::read_link("/proc/self/ns/net").unwrap();
        Sleeper::spawn(&["sleep", "infinity"], |l| l.read_link().map(|t| t == me))
    }

    /// A process inside the named netns `ns`.
    pub fn in_named(ns: &str) -> Sleeper {
        use std::os::unix::fs::MetadataExt;
        let want = std::fs::metadata(format!("/run/netns/{ns}")).unwrap().ino();
        Sleeper::spawn(&["ip", "netns", "exec", ns, "sleep", "infinity"], |l| {
            l.metadata().map(|m| m.ino() == want)
        })
    }

    /// Spawns `args` and waits until `ready(/proc/<pid>/ns/net)` says its
    /// namespace is the intended one (unshare and ip exec sleep once it is).
    fn spawn(args: &[&str], ready: impl Fn(&Path) -> std::io::Result<bool>) -> Sleeper {
        let child = Command::new(args[0])
            .args(&args[1..])
            .spawn()
            .expect("spawn");
        let sleeper = Sleeper(child);
        let link = std::path::PathBuf::from(format!("/proc/{}/ns/net", sleeper.pid()));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ready(&link).unwrap_or(false) {
            assert!(Instant::now() < deadline, "{args:?} did not start");
            std::thread::sleep(Duration::from_millis(5));
        }
        sleeper
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A veth pair: `name` is the VF stand-in, `peer` stays on the host. Dropping
/// deletes the pair wherever the stand-in went (deleting one end deletes both).
pub struct Veth {
    pub name: String,
    pub peer: String,
    pub mac: String,
}

impl Veth {
    pub fn new(name: &str, peer: &str, mac: &str) -> Veth {
        claim_peer(peer);
        // A pair left by an interrupted run goes with its (test-only) peer name;
        // a link named `name` that is not ours makes the add fail loudly.
        quiet(&["ip", "link", "del", peer]);
        sh(&[
            "ip", "link", "add", name, "address", mac, "mtu", "1500", "type", "veth", "peer",
            "name", peer,
        ]);
        Veth {
            name: name.to_string(),
            peer: peer.to_string(),
            mac: mac.to_string(),
        }
    }
}

/// Makes a peer name this process's for good: the tests of one binary run
/// in parallel threads, and a second pair with the same peer would delete
/// the first's (above) whenever the two overlap.
fn claim_peer(peer: &str) {
    static PEERS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut peers = PEERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    assert!(
        !peers.iter().any(|p| p == peer),
        "veth peer {peer} is used twice in this test binary: give each test its own names"
    );
    peers.push(peer.to_string());
}

impl Drop for Veth {
    fn drop(&mut self) {
        quiet(&["ip", "link", "del", &self.peer]);
    }
}

/// Where to list links.
#[derive(Clone, Copy)]
pub enum In<'a> {
    Host,
    Named(&'a str),
    Pid(u32),
}

#[derive(Debug, Clone, Deserialize)]
pub struct IpLink {
    pub ifindex: u32,
    pub ifname: String,
    pub address: Option<String>,
    pub mtu: u32,
    pub flags: Vec<String>,
    #[serde(default)]
    pub altnames: Vec<String>,
}

impl IpLink {
    pub fn up(&self) -> bool {
        self.flags.iter().any(|f| f == "UP")
    }
}

pub fn links(at: In<'_>) -> Vec<IpLink> {
    serde_json::from_str(&sh_in(at, &["ip", "-j", "link", "show"])).expect("ip -j output")
}

/// `net.ipv4.conf.<ifname>.arp_notify` as seen inside `at`.
pub fn arp_notify(at: In<'_>, ifname: &str) -> String {
    let path = format!("/proc/sys/net/ipv4/conf/{ifname}/arp_notify");
    sh_in(at, &["cat", &path]).trim().to_string()
}

/// Runs `cmd` in the network namespace `at` names.
fn sh_in(at: In<'_>, cmd: &[&str]) -> String {
    let pid;
    let mut full: Vec<&str> = match at {
        In::Host => vec![],
        In::Named(ns) => vec!["ip", "netns", "exec", ns],
        In::Pid(p) => {
            pid = p.to_string();
            vec!["nsenter", "-t", &pid, "-n"]
        }
    };
    full.extend_from_slice(cmd);
    sh(&full)
}

pub fn link(at: In<'_>, name: &str) -> Option<IpLink> {
    links(at).into_iter().find(|l| l.ifname == name)
}

/// A stand-in action: the veth as the VF, no PF on this host.
pub fn action(veth: &Veth, bdf: &str, ifname: &str, mac: &str, mtu: u32) -> VfAttach {
    VfAttach {
        pf_netdev: String::new(),
        vf_index: 0,
        vf_bus_id: bdf.parse().unwrap(),
        host_netdev: veth.name.clone(),
        rdma_device: None,
        container_ifname: ifname.to_string(),
        settings: VfSettings {
            mac: Some(mac.parse().unwrap()),
            mtu: Some(mtu),
            ..VfSettings::default()
        },
        move_rdma: false,
        rdma_chars: Vec::new(),
    }
}

/// An OCI state as runc writes it for a hook.
pub fn state(id: &str, status: &str, pid: Option<u32>, networks: &[VfAttach]) -> String {
    let mut annotations = serde_json::Map::new();
    annotations.insert("io.kubernetes.cri.container-name".into(), "app".into());
    if !networks.is_empty() {
        let value = Resolved::new(networks.to_vec()).to_annotation().unwrap();
        annotations.insert(RESOLVED_ANNOTATION.into(), value.into());
    }
    let mut s = serde_json::json!({
        "ociVersion": "1.0.2", "id": id, "status": status,
        "bundle": "/run/containerd/io.containerd.runtime.v2.task/k8s.io/x",
        "annotations": annotations,
    });
    if let Some(p) = pid {
        s["pid"] = p.into();
    }
    s.to_string()
}

/// Records in the ledger under `state_dir`, as the plugin does at creation, the
/// resolved annotation `state` carries, so that the hook acts on it. Idempotent.
pub fn vouch(state: &str, state_dir: &Path) {
    vouch_in(state, state_dir, None, &[]);
}

/// As [`vouch`], in the pod `pod` (`sb-<pod>`) rather than one of the
/// container's own (`sb-<id>`), the pod also claiming the VFs `vfs`.
pub fn vouch_in(state: &str, state_dir: &Path, pod: Option<&str>, vfs: &[&str]) {
    // Malformed states are what some tests feed the hook: nothing to vouch for.
    let Ok(state) = serde_json::from_str::<serde_json::Value>(state) else {
        return;
    };
    let Some(value) = state["annotations"][RESOLVED_ANNOTATION].as_str() else {
        return;
    };
    let id = state["id"].as_str().expect("state id");
    let key = pod.unwrap_or(id);
    let pod = devgate::ledger::PodRef {
        sandbox_id: format!("sb-{key}"),
        namespace: "test".into(),
        name: format!("pod-{key}"),
        uid: format!("uid-{key}"),
    };
    let record = devgate::ledger::ContainerRecord {
        name: "app".into(),
        devices: Vec::new(),
        applied_unix: 0,
        init: None,
        cgroups: Vec::new(),
        // As the plugin records it: the annotation's digest.
        resolved: None,
        resolved_sha256: Some(devgate::ledger::resolved_digest(value)),
        hooks_only: false,
    };
    let claim = devgate::ledger::Claim {
        device: devgate::ledger::DeviceId::Gpu(format!("GPU-{key}")),
        share: devgate::ledger::Share::Exclusive,
        pf: None,
    };
    let vfs = vfs.iter().map(|vf| devgate::ledger::Claim {
        device: devgate::ledger::DeviceId::Vf(vf.parse().unwrap()),
        share: devgate::ledger::Share::Exclusive,
        pf: None,
    });
    let claims: Vec<_> = std::iter::once(claim).chain(vfs).collect();
    devgate::ledger::Ledger::open(state_dir)
        .and_then(|l| l.admit(&pod, &claims, id, record, true))
        .expect("vouch in the ledger");
}

/// Runs the hook binary as a container of pod `pod` (see [`vouch_in`]).
pub fn hook_in_pod(stage: &str, state: &str, state_dir: &Path, pod: &str, vfs: &[&str]) -> Output {
    vouch_in(state, state_dir, Some(pod), vfs);
    hook_unvouched(stage, state, state_dir, &[])
}

/// Runs the hook binary with `state` on stdin, its annotation vouched for.
pub fn hook(stage: &str, state: &str, state_dir: &Path, env: &[(&str, &str)]) -> Output {
    vouch(state, state_dir);
    hook_unvouched(stage, state, state_dir, env)
}

/// Runs the hook binary with `state` on stdin, the ledger as it is.
pub fn hook_unvouched(stage: &str, state: &str, state_dir: &Path, env: &[(&str, &str)]) -> Output {
    let bin = Path::new(env!("CARGO_BIN_EXE_devgate-hook"));
    hook_program(bin, stage, state, state_dir, env)
}

/// Runs the hook `bin` with `state` on stdin, the ledger as it is.
pub fn hook_program(
    bin: &Path,
    stage: &str,
    state: &str,
    state_dir: &Path,
    env: &[(&str, &str)],
) -> Output {
    hook_program_args(bin, &[stage], state, state_dir, env)
}

/// [`hook_program`] with `args` (the stage and any flags) before `--state-dir`.
pub fn hook_program_args(
    bin: &Path,
    args: &[&str],
    state: &str,
    state_dir: &Path,
    env: &[(&str, &str)],
) -> Output {
    let mut child = Command::new(bin)
        .args(args)
        .arg("--state-dir")
        .arg(state_dir)
        .env("DEVGATE_CONFIG", "/nonexistent/devgate.toml")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn devgate-hook");
    // A hook that fails early may not read its stdin (runc ignores EPIPE too).
    let _ = child.stdin.take().unwrap().write_all(state.as_bytes());
    child.wait_with_output().unwrap()
}

/// The hook succeeded and printed nothing.
/// The hook failed with one line on stderr that contains `needle`.
pub fn fails_with(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(needle), "{err}");
}

pub fn ok(out: &Output) {
    assert!(
        out.status.success(),
        "hook failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stdout.is_empty() && out.stderr.is_empty(),
        "hook printed: {out:?}"
    );
}

/// How many VF records the state dir holds.
pub fn records(state_dir: &Path) -> usize {
    std::fs::read_dir(state_dir.join("vf"))
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
                .count()
        })
        .unwrap_or(0)
}
