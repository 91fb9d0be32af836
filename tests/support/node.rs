//! A simulated GPU node: a private containerd, an HGX-class host root written by
//! `devgate::fixture`, and `devgate nri` reading that root.

use std::path::{Path, PathBuf};

use devgate::fixture::{Fixture, HostRootBuilder};
use devgate::inventory::Gpu;
use devgate::ledger::{Ledger, LedgerState};

use super::{Containerd, Cri, DevgatePlugin, DEVGATE};

pub const DEVICE_ALLOCATED: &str = "scheduling.koordinator.sh/device-allocated";

/// The `/dev/nvidia*` nodes of a container granted the fixture's GPU 2, as
/// `node <path> <major>:<minor>` in hex (`stat -c '%t:%T'`): 195 = 0xc3, minor 2;
/// nvidiactl is 195:255 (0xff); the uvm major comes from proc/devices (508 = 0x1fc).
pub const GPU2_NODES: [&str; 4] = [
    "node /dev/nvidia-uvm 1fc:0",
    "node /dev/nvidia-uvm-tools 1fc:1",
    "node /dev/nvidia2 c3:2",
    "node /dev/nvidiactl c3:ff",
];

pub struct Node {
    pub plugin: DevgatePlugin,
    pub fixture: Fixture,
    // Dropped last: the plugin and containerd run inside it.
    pub ctrd: Containerd,
}

impl Node {
    /// containerd + the default HGX host root + devgate, registered.
    pub fn start(extra: &[&str]) -> Node {
        Node::start_with(HostRootBuilder::hgx(), extra)
    }

    pub fn start_with(builder: HostRootBuilder, extra: &[&str]) -> Node {
        Node::start_full(builder, "", extra)
    }

    /// With `config` as devgate's config file (`devgate.toml` of the instance).
    pub fn start_full(builder: HostRootBuilder, config: &str, extra: &[&str]) -> Node {
        let ctrd = Containerd::launch();
        let config = with_private_dirs(config, &ctrd);
        std::fs::write(ctrd.path("devgate.toml"), config).expect("write devgate config");
        mount_state_tmpfs(&ctrd.path("devgate-state"));
        let fixture = builder.build(&ctrd.path("host")).expect("write host root");
        let root = fixture.root().to_string_lossy().into_owned();
        let mut args = vec!["--host-root", root.as_str()];
        args.extend_from_slice(extra);
        let plugin = DevgatePlugin::launch(&ctrd, &args);
        Node {
            plugin,
            fixture,
            ctrd,
        }
    }

    pub fn cri(&self) -> Cri {
        self.ctrd.cri()
    }

    pub fn state_dir(&self) -> PathBuf {
        self.ctrd.path("devgate-state")
    }

    /// `devgate status` of this node, run as its own process, with `args`
    /// after its state directory and config (which names the GPU health
    /// directory the plugin marks); fails unless it succeeds.
    pub fn status(&self, args: &[&str]) -> String {
        let out = std::process::Command::new(DEVGATE)
            .arg("status")
            .arg("--state-dir")
            .arg(self.state_dir())
            .arg("--config")
            .arg(self.ctrd.path("devgate.toml"))
            .args(args)
            .output()
            .expect("run devgate status");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "devgate status {args:?}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    }

    pub fn ledger(&self) -> LedgerState {
        Ledger::open(&self.state_dir())
            .and_then(|l| l.snapshot())
            .expect("read ledger")
    }

    /// The fixture GPU with this minor.
    pub fn gpu(&self, minor: u32) -> &Gpu {
        self.fixture
            .expected()
            .gpus
            .iter()
            .find(|g| g.minor == minor)
            .expect("fixture gpu minor")
    }
}

/// devgate's state lives on tmpfs on a node (`/run/devgate`), where fsync is
/// free; the test's directory is on disk, so give it a tmpfs of its own. The
/// containerd guard unmounts everything below its directory on drop.
fn mount_state_tmpfs(dir: &Path) {
    use nix::mount::{mount, MsFlags};
    std::fs::create_dir_all(dir).expect("state dir");
    mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=0700,size=16m"),
    )
    .expect("mount tmpfs on the state dir");
}

/// A Koordinator GPU entry with whole-GPU resources.
pub fn gpu_entry(minor: u32, uuid: &str) -> String {
    gpu_share_entry(minor, uuid, 100)
}

pub fn gpu_share_entry(minor: u32, uuid: &str, percent: u32) -> String {
    format!(
        r#"{{"minor":{minor},"id":"{uuid}","resources":{{"koordinator.sh/gpu-core":"{percent}","koordinator.sh/gpu-memory-ratio":"{percent}"}}}}"#
    )
}

/// `{"gpu":[entries]}`.
pub fn gpus(entries: &[String]) -> String {
    allocation(entries, &[])
}

/// A Koordinator RDMA entry for one VF of a PF, as koord-scheduler writes it.
pub fn vf_entry(minor: usize, pf: impl std::fmt::Display, vf: impl std::fmt::Display) -> String {
    format!(
        r#"{{"minor":{minor},"id":"{pf}","resources":{{"koordinator.sh/rdma":"1"}},"extension":{{"vfs":[{{"minor":-1,"busID":"{vf}"}}]}}}}"#
    )
}

/// `{"gpu":[...],"rdma":[...]}`, leaving out an empty type.
pub fn allocation(gpus: &[String], rdma: &[String]) -> String {
    let mut parts = Vec::new();
    if !gpus.is_empty() {
        parts.push(format!(r#""gpu":[{}]"#, gpus.join(",")));
    }
    if !rdma.is_empty() {
        parts.push(format!(r#""rdma":[{}]"#, rdma.join(",")));
    }
    format!("{{{}}}", parts.join(","))
}

/// The config with `gpu.health_dir` inside the instance unless the test sets it:
/// GPU health outlives reboots in /var/lib/devgate, which a test must not read or
/// leave behind.
/// `config` with the instance's own GPU health directory and CDI spec
/// directory (the one its containerd reads), unless it names them.
fn with_private_dirs(config: &str, ctrd: &Containerd) -> String {
    let mut doc: toml::Table = toml::from_str(config).expect("test config is toml");
    let path = |p: &Path| toml::Value::String(p.to_string_lossy().into_owned());
    let gpu = doc
        .entry("gpu")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    if let toml::Value::Table(gpu) = gpu {
        gpu.entry("health_dir")
            .or_insert_with(|| path(&ctrd.path("gpu-health")));
    }
    doc.entry("cdi_spec_dirs")
        .or_insert_with(|| toml::Value::Array(vec![path(&ctrd.cdi_dir())]));
    toml::to_string(&doc).expect("serialize test config")
}
