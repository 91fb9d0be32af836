//! `install/bootstrap.sh` run into a `--prefix` directory: dry run, install,
//! idempotent second run, `devgate doctor` on the result, and `--uninstall`
//! restoring the tree byte for byte.
mod bootstrap;

use std::path::Path;

use bootstrap::*;

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
        // podman reads both; CRI-O by default only /usr/share's.
        for dir in [
            "etc/containers/oci/hooks.d",
            "usr/share/containers/oci/hooks.d",
        ] {
            let rel = Path::new(dir).join(&name);
            assert!(installed.contains_key(&rel), "{rel:?} not installed");
        }
    }
    assert!(file("etc/modprobe.d/devgate-rdma.conf")
        .1
        .ends_with(b"options ib_core netns_mode=0\n"));
    let numvfs = format!("sys/bus/pci/devices/{PF}/sriov_numvfs");
    assert_eq!(file(&numvfs).1, b"4\n");
    // The kernel starts every boot with no VFs: udev gives them back.
    let rules =
        String::from_utf8_lossy(&file("etc/udev/rules.d/70-devgate-sriov.rules").1).into_owned();
    assert!(
        rules.ends_with(&format!(
            "\nACTION==\"add|bind\", SUBSYSTEM==\"pci\", KERNEL==\"{PF}\", ATTR{{sriov_numvfs}}=\"4\"\n"
        )),
        "{rules}"
    );
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
    // systemd forgets the removed unit.
    assert!(
        position(&undo.out, "systemctl disable --now devgate.service")
            < position(&undo.out, "systemctl daemon-reload"),
        "{}",
        undo.out
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

/// The udev rule follows the config: a new count rewrites it, a count of 0
/// removes it, and each run writes the count to the PF as well.
#[test]
fn the_boot_time_vf_rule_follows_the_config() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = node(dir.path());
    let hooks = hooks_dir(dir.path());
    let rules = prefix.join("etc/udev/rules.d/70-devgate-sriov.rules");
    let config = prefix.join("etc/devgate/config.toml");
    let numvfs = prefix.join(format!("sys/bus/pci/devices/{PF}/sriov_numvfs"));
    let count = || std::fs::read_to_string(&numvfs).unwrap();
    assert!(bootstrap(&prefix, &hooks, &[]).ok);
    assert!(std::fs::read_to_string(&rules)
        .unwrap()
        .contains("ATTR{sriov_numvfs}=\"4\""));

    write(&config, &format!("[sriov.num_vfs]\n\"{PF}\" = 6\n"));
    let six = bootstrap(&prefix, &hooks, &[]);
    assert!(six.ok, "{}", six.out);
    let text = std::fs::read_to_string(&rules).unwrap();
    assert!(text.contains("ATTR{sriov_numvfs}=\"6\""), "{text}");
    assert_eq!(count(), "6\n");
    assert!(!text.contains("\"4\""), "{text}");

    // 0 VFs is every boot's start: nothing to keep.
    write(&config, &format!("[sriov.num_vfs]\n\"{PF}\" = 0\n"));
    let none = bootstrap(&prefix, &hooks, &[]);
    assert!(none.ok, "{}", none.out);
    assert!(!rules.exists(), "{}", none.out);
    assert_eq!(count(), "0\n");
    position(&none.out, "remove /etc/udev/rules.d/70-devgate-sriov.rules");
}

/// A read-only mount, unmounted when dropped.
struct ReadOnly(std::path::PathBuf);

impl ReadOnly {
    fn mount(dir: &Path) -> ReadOnly {
        std::fs::create_dir_all(dir).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "ro", "tmpfs"])
            .arg(dir)
            .output()
            .expect("run mount");
        assert!(out.status.success(), "mount (needs root): {out:?}");
        ReadOnly(dir.to_path_buf())
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// A node without containerd whose /usr is read-only, as on an image-based
/// host: its scratch directory, prefix, the read-only mount and the hooks
/// source directory.
fn image_based_node() -> (
    tempfile::TempDir,
    std::path::PathBuf,
    ReadOnly,
    std::path::PathBuf,
) {
    let dir = tempfile::tempdir().unwrap();
    let prefix = node(dir.path());
    std::fs::remove_dir_all(prefix.join("etc/containerd")).unwrap();
    let usr = ReadOnly::mount(&prefix.join("usr/share"));
    let hooks = hooks_dir(dir.path());
    (dir, prefix, usr, hooks)
}

/// A CRI-O or podman node on an image-based host: no containerd, and a
/// read-only /usr. Bootstrap installs devgate, the unit and the hooks.d file
/// in /etc, says why /usr's is missing, leaves containerd's NRI alone and
/// prepares the node, instead of stopping halfway.
#[test]
fn a_node_without_containerd_and_with_a_read_only_usr() {
    let (_dir, prefix, _usr, hooks) = image_based_node();
    let run = bootstrap(&prefix, &hooks, &["--containerd-version", "none"]);
    assert!(run.ok, "{}", run.out);
    position(&run.out, "no containerd on this node");
    position(
        &run.out,
        "/usr/share/containers/oci/hooks.d is on a read-only file system",
    );
    assert!(prefix
        .join("etc/containers/oci/hooks.d/devgate.json")
        .is_file());
    assert!(prefix.join("usr/local/bin/devgate-hook").is_file());
    assert!(!prefix.join("etc/containerd").exists(), "{}", run.out);
    let numvfs = prefix.join(format!("sys/bus/pci/devices/{PF}/sriov_numvfs"));
    assert_eq!(std::fs::read_to_string(numvfs).unwrap().trim(), "4");
    let again = bootstrap(&prefix, &hooks, &["--containerd-version", "none"]);
    assert!(again.ok, "{}", again.out);
    position(&again.out, "no changes");
}

/// `--hooks-only` on such a host: podman and CRI-O read only
/// /usr/share/containers/oci/hooks.d unless their config lists another, so
/// the file in /etc alone would serve no runtime: the run is refused before
/// any change, saying where to list it. Once containers.conf lists /etc's
/// directory, it succeeds.
#[test]
fn hooks_only_fails_where_no_runtime_reads_the_directory_that_took_the_file() {
    let (_dir, prefix, _usr, hooks) = image_based_node();
    let args = ["--hooks-only", "--containerd-version", "none"];
    let run = bootstrap(&prefix, &hooks, &args);
    assert!(!run.ok, "{}", run.out);
    position(
        &run.out,
        "podman reads hooks.d files only from /usr/share/containers/oci/hooks.d",
    );
    position(
        &run.out,
        "[engine] hooks_dir in /etc/containers/containers.conf.d",
    );
    position(&run.out, "no hooks.d directory that podman or CRI-O reads");
    // Refused before any change.
    position(&run.out, "nothing changed");
    assert!(
        !prefix.join("usr/local/bin/devgate-hook").exists(),
        "{}",
        run.out
    );
    assert!(!prefix
        .join("etc/containers/oci/hooks.d/devgate.json")
        .exists());

    write(
        &prefix.join("etc/containers/containers.conf.d/10-hooks.conf"),
        "[engine]\nhooks_dir = [\"/usr/share/containers/oci/hooks.d\", \"/etc/containers/oci/hooks.d\"]\n",
    );
    let listed = bootstrap(&prefix, &hooks, &args);
    assert!(listed.ok, "{}", listed.out);
    assert!(
        !listed.out.contains("podman reads hooks.d files only"),
        "{}",
        listed.out
    );
    // CRI-O's default is still /usr/share's alone: said, not fatal.
    position(&listed.out, "CRI-O reads hooks.d files only from");
    assert!(prefix
        .join("etc/containers/oci/hooks.d/devgate.json")
        .is_file());
}

/// Changing a PF's VF count destroys its VFs: while a pod holds one (in the
/// ledger), bootstrap refuses the change, naming the VF; `--uninstall`
/// refuses while any pod holds devices, before it undoes anything.
#[test]
fn a_vf_count_is_not_changed_under_a_pod_holding_a_vf() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = node(dir.path());
    let pf_dir = link_vfs(&prefix);
    let state = prefix.join("run/devgate");
    hold_vf(&prefix, "0000:19:00.3");
    let hooks = hooks_dir(dir.path());
    let version = ["--containerd-version", "1.7.24"];
    let numvfs = || std::fs::read_to_string(pf_dir.join("sriov_numvfs")).unwrap();

    let refused = bootstrap(&prefix, &hooks, &version);
    assert!(!refused.ok, "{}", refused.out);
    position(&refused.out, "pods hold 0000:19:00.3: drain the node first");
    assert_eq!(numvfs().trim(), "2");
    assert!(
        !prefix.join("usr/local/bin").exists(),
        "refused before any change: {}",
        refused.out
    );

    // Drained: the change goes through; uninstall then meets a new holder.
    std::fs::remove_dir_all(&state).unwrap();
    let done = bootstrap(&prefix, &hooks, &version);
    assert!(done.ok, "{}", done.out);
    assert_eq!(numvfs().trim(), "4");
    hold_vf(&prefix, "0000:19:00.2");
    let kept = bootstrap(&prefix, &hooks, &["--uninstall"]);
    assert!(!kept.ok, "{}", kept.out);
    position(&kept.out, "pods hold devices in devgate's ledger");
    position(&kept.out, "nothing changed");
    assert_eq!(numvfs().trim(), "4");
    assert!(
        prefix.join("usr/local/bin/devgate-hook").exists(),
        "{}",
        kept.out
    );
    std::fs::remove_dir_all(&state).unwrap();
    let undone = bootstrap(&prefix, &hooks, &["--uninstall"]);
    assert!(undone.ok, "{}", undone.out);
    assert_eq!(numvfs().trim(), "2");
}

/// No containerd on the PATH, but its config is there (a tarball install in
/// /usr/local/bin under sudo's secure_path): stopped before any change, not
/// taken for a node without containerd.
#[test]
fn a_containerd_off_the_path_is_not_taken_for_none() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = node(dir.path());
    let hooks = hooks_dir(dir.path());
    let path = path_without_containerd(dir.path());
    let run = bootstrap_with_path(&prefix, &hooks, &[], Some(&path));
    assert!(!run.ok, "{}", run.out);
    position(
        &run.out,
        "no containerd on the PATH, but /etc/containerd/config.toml is there",
    );
    let config = std::fs::read_to_string(prefix.join("etc/containerd/config.toml")).unwrap();
    assert_eq!(config, CONTAINERD_CONFIG);
    let bin = prefix.join("usr/local/bin");
    assert!(!bin.exists(), "stopped before any change: {}", run.out);
    // Without any sign of it, a node without containerd.
    std::fs::remove_dir_all(prefix.join("etc/containerd")).unwrap();
    let run = bootstrap_with_path(&prefix, &hooks, &[], Some(&path));
    assert!(run.ok, "{}", run.out);
    position(&run.out, "no containerd on this node");
}

/// A VF count the PF cannot have stops bootstrap before any change.
#[test]
fn a_vf_count_over_the_pfs_total_stops_before_any_change() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = node(dir.path());
    write(
        &prefix.join("etc/devgate/config.toml"),
        &format!("[sriov.num_vfs]\n\"{PF}\" = 9\n"),
    );
    let hooks = hooks_dir(dir.path());
    let run = bootstrap(&prefix, &hooks, &["--containerd-version", "1.7.24"]);
    assert!(!run.ok, "{}", run.out);
    position(
        &run.out,
        &format!("asks 9 VFs of {PF}, which has at most 8"),
    );
    assert!(!prefix.join("usr/local/bin").exists(), "{}", run.out);
    let config = std::fs::read_to_string(prefix.join("etc/containerd/config.toml")).unwrap();
    assert_eq!(config, CONTAINERD_CONFIG);
}

/// A containerd config that is a dangling link is refused like any link,
/// before any change, not replaced by a new file.
#[test]
fn a_dangling_linked_containerd_config_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = node(dir.path());
    let cfg = prefix.join("etc/containerd/config.toml");
    std::fs::remove_file(&cfg).unwrap();
    std::os::unix::fs::symlink("/nowhere/config.toml", &cfg).unwrap();
    let hooks = hooks_dir(dir.path());
    let run = bootstrap(&prefix, &hooks, &["--containerd-version", "1.7.24"]);
    assert!(!run.ok, "{}", run.out);
    position(&run.out, "/etc/containerd/config.toml is a symbolic link");
    assert!(std::fs::symlink_metadata(&cfg)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(!prefix.join("usr/local/bin").exists(), "{}", run.out);
}
