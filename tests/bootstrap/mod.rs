//! Helpers of the `install/bootstrap.sh` tests: a node under a `--prefix`
//! directory, bootstrap runs into it, and snapshots of the tree.
#![allow(dead_code)]
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

pub const DEVGATE: &str = env!("CARGO_BIN_EXE_devgate");
pub const PF: &str = "0000:19:00.0";
/// A containerd config with comments, odd spacing and no final newline: the
/// uninstall must give these bytes back exactly.
pub const CONTAINERD_CONFIG: &str = "# node config\nversion = 2\nroot = \"/var/lib/containerd\"\n\n[plugins]\n  [plugins.\"io.containerd.grpc.v1.cri\"]\n    sandbox_image = \"registry.k8s.io/pause:3.9\"   # pinned\n  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n    SystemdCgroup = true";

/// Every entry below a root: (mode, file bytes or link target; empty for dirs).
pub type Tree = BTreeMap<PathBuf, (u32, Vec<u8>)>;

pub fn snapshot(root: &Path) -> Tree {
    let mut tree = Tree::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let rel = path.strip_prefix(root).unwrap().to_path_buf();
            let content = if meta.file_type().is_symlink() {
                std::fs::read_link(&path)
                    .unwrap()
                    .into_os_string()
                    .into_encoded_bytes()
            } else if meta.is_dir() {
                stack.push(path.clone());
                Vec::new()
            } else {
                std::fs::read(&path).unwrap()
            };
            tree.insert(rel, (meta.permissions().mode(), content));
        }
    }
    tree
}

pub fn write(path: &Path, text: &str) {
    write_bytes(path, text.as_bytes());
}

fn write_bytes(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// [`write`] (of any bytes), then mode 0755: a script or binary to run.
pub fn write_executable(path: &Path, contents: impl AsRef<[u8]>) {
    write_bytes(path, contents.as_ref());
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The repository's hooks.d files, which bootstrap installs.
pub fn hooks_dir(_scratch: &Path) -> PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("hooks");
    assert!(
        repo.join("devgate.json").is_file(),
        "the shipped hooks.d file {} is missing",
        repo.join("devgate.json").display()
    );
    repo
}

pub struct Run {
    pub ok: bool,
    pub out: String,
}

pub fn bootstrap(prefix: &Path, hooks: &Path, args: &[&str]) -> Run {
    bootstrap_with_path(prefix, hooks, args, None)
}

/// [`bootstrap`] with `path` as its PATH, where given.
pub fn bootstrap_with_path(prefix: &Path, hooks: &Path, args: &[&str], path: Option<&Path>) -> Run {
    let env: Vec<(&str, &std::ffi::OsStr)> =
        path.map(|p| ("PATH", p.as_os_str())).into_iter().collect();
    bootstrap_with_env(prefix, hooks, args, &env)
}

/// [`bootstrap`] with these variables in its environment.
pub fn bootstrap_with_env(
    prefix: &Path,
    hooks: &Path,
    args: &[&str],
    env: &[(&str, &std::ffi::OsStr)],
) -> Run {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("install/bootstrap.sh");
    let bin_dir = Path::new(DEVGATE).parent().unwrap();
    let mut cmd = Command::new("bash");
    cmd.envs(env.iter().copied());
    let out = cmd
        .arg(script)
        .arg("--prefix")
        .arg(prefix)
        .arg("--bin-dir")
        .arg(bin_dir)
        .arg("--hooks-dir")
        .arg(hooks)
        .args(args)
        .output()
        .expect("run bootstrap.sh");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Run {
        ok: out.status.success(),
        out: text,
    }
}

/// A node directory: containerd 1.7's config, one SR-IOV PF with 2 VFs,
/// ib_core loaded in shared mode, and a devgate config asking for 4 VFs and
/// the exclusive RDMA mode.
pub fn node(dir: &Path) -> PathBuf {
    let prefix = dir.join("node");
    write(
        &prefix.join("etc/containerd/config.toml"),
        CONTAINERD_CONFIG,
    );
    write(&prefix.join("etc/os-release"), "ID=debian\nVERSION_ID=12\n");
    let pf = prefix.join("sys/bus/pci/devices").join(PF);
    write(&pf.join("sriov_numvfs"), "2\n");
    write(&pf.join("sriov_totalvfs"), "8\n");
    write(
        &prefix.join("sys/module/ib_core/parameters/netns_mode"),
        "Y\n",
    );
    write(
        &prefix.join("etc/devgate/config.toml"),
        &format!("[rdma]\nnetns_mode = \"exclusive\"\n[sriov.num_vfs]\n\"{PF}\" = 4\n"),
    );
    prefix
}

/// Links [`PF`]'s two VFs (`virtfn0`, `virtfn1`: `0000:19:00.2` and `.3`)
/// under `prefix`, as sysfs lists them; returns the PF's sysfs directory.
pub fn link_vfs(prefix: &Path) -> PathBuf {
    let pf_dir = prefix.join("sys/bus/pci/devices").join(PF);
    for (i, vf) in ["0000:19:00.2", "0000:19:00.3"].iter().enumerate() {
        let target = format!("../{vf}");
        std::os::unix::fs::symlink(target, pf_dir.join(format!("virtfn{i}"))).unwrap();
    }
    pf_dir
}

/// Pod `sb-a` of devgate's ledger under `prefix` claims [`PF`]'s VF `vf`.
pub fn hold_vf(prefix: &Path, vf: &str) {
    use devgate::ledger::{Claim, DeviceId, Ledger, PodRef, Share};
    let pod = PodRef {
        sandbox_id: "sb-a".into(),
        namespace: "ns".into(),
        name: "a".into(),
        uid: "uid-a".into(),
    };
    let vf = Claim {
        device: DeviceId::Vf(vf.parse().unwrap()),
        share: Share::Exclusive,
        pf: Some(PF.parse().unwrap()),
    };
    let ledger = Ledger::open(&prefix.join("run/devgate")).unwrap();
    ledger.claim(&pod, &[vf]).unwrap();
}

pub fn position(out: &str, needle: &str) -> usize {
    out.find(needle)
        .unwrap_or_else(|| panic!("no {needle:?} in:\n{out}"))
}

pub fn doctor_statuses(prefix: &Path) -> BTreeMap<String, String> {
    let out = Command::new(DEVGATE)
        .arg("doctor")
        .arg("--host-root")
        .arg(prefix)
        .arg("--etc-root")
        .arg(prefix.join("etc"))
        .arg("--config")
        .arg(prefix.join("etc/devgate/config.toml"))
        .arg("--state-dir")
        .arg(prefix.join("run/devgate"))
        .args(["--containerd", "/nonexistent/containerd", "-o", "json"])
        .output()
        .expect("run devgate doctor");
    let checks: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("doctor json: {e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert!(!out.status.success(), "doctor must fail without containerd");
    checks
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_string(),
                c["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// A PATH directory holding every command of the usual ones but containerd.
pub fn path_without_containerd(dir: &Path) -> PathBuf {
    let bin = dir.join("path-bin");
    std::fs::create_dir_all(&bin).unwrap();
    for from in [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ] {
        let Ok(entries) = std::fs::read_dir(from) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            if name.to_string_lossy().starts_with("containerd") || bin.join(&name).exists() {
                continue;
            }
            let _ = std::os::unix::fs::symlink(e.path(), bin.join(&name));
        }
    }
    bin
}

/// A containerd config `main` under `prefix` and the file its
/// `imports = ["conf.d/*.toml"]` finds, which turns NRI off; the config's path.
pub fn importing_nri_off(prefix: &Path, main: &str) -> PathBuf {
    let cfg = prefix.join("etc/containerd/config.toml");
    write(&cfg, main);
    write(
        &prefix.join("etc/containerd/conf.d/nri.toml"),
        "[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = true\n",
    );
    cfg
}
