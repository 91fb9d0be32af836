//! `install/bootstrap.sh` run into a `--prefix` directory: dry run, install,
//! idempotent second run, `devgate doctor` on the result, and `--uninstall`
//! restoring the tree byte for byte.
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const DEVGATE: &str = env!("CARGO_BIN_EXE_devgate");
const PF: &str = "0000:19:00.0";
/// A containerd config with comments, odd spacing and no final newline: the
/// uninstall must give these bytes back exactly.
const CONTAINERD_CONFIG: &str = "# node config\nversion = 2\nroot = \"/var/lib/containerd\"\n\n[plugins]\n  [plugins.\"io.containerd.grpc.v1.cri\"]\n    sandbox_image = \"registry.k8s.io/pause:3.9\"   # pinned\n  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n    SystemdCgroup = true";

/// Every entry below a root: (mode, file bytes or link target; empty for dirs).
type Tree = BTreeMap<PathBuf, (u32, Vec<u8>)>;

fn snapshot(root: &Path) -> Tree {
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

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// The repository's hooks.d files, or a stand-in when the repository has none.
fn hooks_dir(scratch: &Path) -> PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("hooks");
    let has_json = std::fs::read_dir(&repo)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| e.path().extension().is_some_and(|x| x == "json"));
    if has_json {
        return repo;
    }
    let dir = scratch.join("hooks");
    write(
        &dir.join("devgate.json"),
        r#"{"version":"1.0.0","hook":{"path":"/usr/local/bin/devgate-hook","args":["devgate-hook","createRuntime"]},"when":{"annotations":{"^scheduling\\.koordinator\\.sh/device-allocated$":".*"}},"stages":["createRuntime"]}"#,
    );
    dir
}

struct Run {
    ok: bool,
    out: String,
}

fn bootstrap(prefix: &Path, hooks: &Path, args: &[&str]) -> Run {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("install/bootstrap.sh");
    let bin_dir = Path::new(DEVGATE).parent().unwrap();
    let out = Command::new("bash")
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
fn node(dir: &Path) -> PathBuf {
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

fn position(out: &str, needle: &str) -> usize {
    out.find(needle)
        .unwrap_or_else(|| panic!("no {needle:?} in:\n{out}"))
}

fn doctor_statuses(prefix: &Path) -> BTreeMap<String, String> {
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

#[test]
fn dry_run_install_rerun_and_uninstall() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = node(dir.path());
    let hooks = hooks_dir(dir.path());
    let before = snapshot(&prefix);

    let dry = bootstrap(&prefix, &hooks, &["--dry-run"]);
    assert!(dry.ok, "{}", dry.out);
    assert_eq!(
        snapshot(&prefix),
        before,
        "a dry run wrote something:\n{}",
        dry.out
    );
    for line in [
        "would install /usr/local/bin/devgate (mode 755)",
        "would install /etc/systemd/system/devgate.service",
        "+  disable = false",
        "would write 0 to /sys/bus/pci/devices/0000:19:00.0/sriov_numvfs",
        "would write 4 to /sys/bus/pci/devices/0000:19:00.0/sriov_numvfs",
        "would run: systemctl restart containerd.service",
    ] {
        position(&dry.out, line);
    }

    let first = bootstrap(&prefix, &hooks, &[]);
    assert!(first.ok, "{}", first.out);
    let installed = snapshot(&prefix);
    let file = |rel: &str| &installed[Path::new(rel)];
    assert_eq!(
        file("usr/local/bin/devgate").1,
        std::fs::read(DEVGATE).unwrap()
    );
    assert_eq!(file("usr/local/bin/devgate").0 & 0o777, 0o755);
    let hook_exe = env!("CARGO_BIN_EXE_devgate-hook");
    assert_eq!(
        file("usr/local/bin/devgate-hook").1,
        std::fs::read(hook_exe).unwrap()
    );
    let unit = String::from_utf8_lossy(&file("etc/systemd/system/devgate.service").1).into_owned();
    assert!(unit.contains("\nRestart=always\n"), "{unit}");
    assert!(
        unit.contains("ExecStart=/usr/local/bin/devgate nri --config /etc/devgate/config.toml"),
        "{unit}"
    );
    let ctrd = String::from_utf8_lossy(&file("etc/containerd/config.toml").1).into_owned();
    assert!(ctrd.starts_with(CONTAINERD_CONFIG), "{ctrd}");
    assert!(
        ctrd.ends_with("\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = false\n"),
        "{ctrd}"
    );
    assert_eq!(
        file("etc/containerd/config.toml.devgate-backup").1,
        CONTAINERD_CONFIG.as_bytes()
    );
    for hook in std::fs::read_dir(&hooks).unwrap() {
        let name = hook.unwrap().file_name();
        let rel = Path::new("etc/containers/oci/hooks.d").join(&name);
        assert!(installed.contains_key(&rel), "{rel:?} not installed");
    }
    assert!(file("etc/modprobe.d/devgate-rdma.conf")
        .1
        .ends_with(b"options ib_core netns_mode=0\n"));
    let numvfs = format!("sys/bus/pci/devices/{PF}/sriov_numvfs");
    assert_eq!(file(&numvfs).1, b"4\n");
    // 0 first: the kernel refuses to go from 2 VFs to 4 directly.
    assert!(
        position(&first.out, "write 0 to") < position(&first.out, "write 4 to"),
        "{}",
        first.out
    );
    position(&first.out, "takes effect after a reboot");
    position(&first.out, "systemctl restart containerd.service");
    assert!(!installed.contains_key(Path::new("opt/nri/plugins/10-devgate")));

    let second = bootstrap(&prefix, &hooks, &[]);
    assert!(second.ok, "{}", second.out);
    position(&second.out, "bootstrap: no changes");
    assert!(
        !second.out.contains("systemctl"),
        "restarted with nothing changed:\n{}",
        second.out
    );
    assert_eq!(snapshot(&prefix), installed, "the second run changed files");

    // What doctor sees on the result: the kernel still runs ib_core shared
    // (the modprobe file applies at the next boot), everything else is in place.
    let statuses = doctor_statuses(&prefix);
    for (check, want) in [
        ("config", "pass"),
        ("containerd", "fail"),
        ("nri enabled", "pass"),
        ("hooks.d", "pass"),
        ("vfs", "pass"),
        ("rdma netns mode", "fail"),
    ] {
        assert_eq!(
            statuses.get(check).map(String::as_str),
            Some(want),
            "{check}: {statuses:?}"
        );
    }

    let undo = bootstrap(&prefix, &hooks, &["--uninstall"]);
    assert!(undo.ok, "{}", undo.out);
    position(
        &undo.out,
        "the RDMA netns mode returns to shared after a reboot",
    );
    let after = snapshot(&prefix);
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>(),
        "{}",
        undo.out
    );
    assert_eq!(after, before, "uninstall did not restore the tree");
    let again = bootstrap(&prefix, &hooks, &["--uninstall"]);
    assert!(
        again.ok && again.out.contains("nothing installed"),
        "{}",
        again.out
    );
}

#[test]
fn preinstalled_mode_on_a_node_without_configs() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("node");
    std::fs::create_dir_all(&prefix).unwrap();
    let hooks = hooks_dir(dir.path());
    let args = ["--preinstalled", "--containerd-version", "1.7.24"];

    let run = bootstrap(&prefix, &hooks, &args);
    assert!(run.ok, "{}", run.out);
    let plugin = prefix.join("opt/nri/plugins/10-devgate");
    assert_eq!(
        std::fs::read(&plugin).unwrap(),
        std::fs::read(DEVGATE).unwrap()
    );
    let conf = prefix.join("etc/nri/conf.d/10-devgate.conf");
    assert_eq!(
        std::fs::read_link(&conf).unwrap(),
        Path::new("/etc/devgate/config.toml")
    );
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("install/config.toml");
    assert_eq!(
        std::fs::read(prefix.join("etc/devgate/config.toml")).unwrap(),
        std::fs::read(shipped).unwrap()
    );
    assert_eq!(
        std::fs::read_to_string(prefix.join("etc/containerd/config.toml")).unwrap(),
        "version = 2\n\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = false\n"
    );
    assert!(!prefix.join("etc/systemd/system/devgate.service").exists());
    position(&run.out, "systemctl restart containerd.service");
    assert!(!run.out.contains("devgate.service"), "{}", run.out);

    let second = bootstrap(&prefix, &hooks, &args);
    assert!(
        second.ok && second.out.contains("no changes"),
        "{}",
        second.out
    );

    let undo = bootstrap(&prefix, &hooks, &["--uninstall"]);
    assert!(undo.ok, "{}", undo.out);
    assert!(
        snapshot(&prefix).is_empty(),
        "left behind: {:?}",
        snapshot(&prefix).keys()
    );
}

#[test]
fn containerd_configs_it_must_not_touch_or_cannot_edit() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = hooks_dir(dir.path());
    // (containerd version, config, bootstrap succeeds, config after)
    let on = "version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n  socket_path = \"/x\"\n  disable = false\n";
    let cases = [
        (
            "2.1.9",
            "version = 3\n[plugins]\n",
            true,
            Some("version = 3\n[plugins]\n"),
        ),
        ("1.7.24", on, true, Some(on)),
        (
            "1.7.24",
            "version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n    disable = true # off\n[x]\n",
            true,
            Some("version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n    disable = false\n[x]\n"),
        ),
        (
            "2.1.9",
            "version = 3\n[plugins.\"io.containerd.nri.v1.nri\"]\n  socket_path = \"/x\"\n",
            true,
            Some("version = 3\n[plugins.\"io.containerd.nri.v1.nri\"]\n  socket_path = \"/x\"\n"),
        ),
        (
            "1.7.24",
            "version = 2\ndisabled_plugins = [\"io.containerd.nri.v1.nri\"]\n",
            false,
            None,
        ),
        ("1.7.24", "[plugins.cri]\n", false, None),
        ("1.6.20", "version = 2\n", false, None),
    ];
    for (i, (version, config, ok, after)) in cases.into_iter().enumerate() {
        let prefix = dir.path().join(format!("node{i}"));
        let path = prefix.join("etc/containerd/config.toml");
        write(&path, config);
        let run = bootstrap(&prefix, &hooks, &["--containerd-version", version]);
        assert_eq!(run.ok, ok, "case {i}:\n{}", run.out);
        let want = after.unwrap_or(config);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            want,
            "case {i}:\n{}",
            run.out
        );
        assert_eq!(
            run.out.contains("systemctl restart containerd"),
            ok && want != config,
            "case {i}:\n{}",
            run.out
        );
    }
}

#[test]
fn uninstall_keeps_a_containerd_config_edited_after_install() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = node(dir.path());
    let hooks = hooks_dir(dir.path());
    assert!(bootstrap(&prefix, &hooks, &[]).ok);
    let path = prefix.join("etc/containerd/config.toml");
    let edited = format!(
        "{}# edited by hand\n",
        std::fs::read_to_string(&path).unwrap()
    );
    std::fs::write(&path, &edited).unwrap();

    let undo = bootstrap(&prefix, &hooks, &["--uninstall"]);
    assert!(!undo.ok, "{}", undo.out);
    position(&undo.out, "changed after devgate wrote it");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), edited);
    let backup = prefix.join("etc/containerd/config.toml.devgate-backup");
    assert_eq!(std::fs::read_to_string(backup).unwrap(), CONTAINERD_CONFIG);
    assert!(
        !prefix.join("usr/local/bin/devgate").exists(),
        "{}",
        undo.out
    );
    assert!(
        prefix.join("var/lib/devgate/install/manifest").exists(),
        "the manifest must stay for a retry"
    );
}
