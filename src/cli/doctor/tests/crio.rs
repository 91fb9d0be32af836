//! A CRI-O node: no containerd, `/etc/crio`. The containerd checks step
//! aside, NRI's setting comes from CRI-O's config and drop-ins, and nothing
//! containerd-specific fails the node.
use super::*;

/// The healthy fake node without containerd, with `/etc/crio` holding `files`.
fn crio_node(files: &[(&str, &str)]) -> Node {
    let mut node = healthy();
    node.host.version = Err("containerd: not found".into());
    let crio = node.roots.etc_root.join("crio");
    std::fs::create_dir_all(&crio).unwrap();
    for (name, text) in files {
        write(&crio.join(name), text);
    }
    node
}

#[test]
fn nri_is_read_from_crios_config_and_its_dropins() {
    let node = crio_node(&[
        ("crio.conf", "[crio.nri]\nenable_nri = false\n"),
        ("crio.conf.d/10-nri.conf", "[crio.nri]\nenable_nri = true\n"),
        (
            "crio.conf.d/20-other.conf",
            "[crio.runtime]\nlog_level = \"info\"\n",
        ),
    ]);
    let checks = run_checks(&node.roots, &node.host);
    let runtime = check(&checks, "containerd");
    assert_eq!(runtime.status, Status::Warn, "{runtime:?}");
    assert!(runtime.detail.contains("a CRI-O node"), "{runtime:?}");
    let nri = check(&checks, "nri enabled");
    assert_eq!(nri.status, Status::Pass, "{nri:?}");
    assert!(
        nri.detail.ends_with("10-nri.conf"),
        "the drop-in wins: {nri:?}"
    );
    let cgroup = check(&checks, "cgroup");
    assert_eq!(cgroup.status, Status::Pass, "{cgroup:?}");
    assert!(cgroup.detail.contains("CRI-O"), "{cgroup:?}");
}

/// The drop-ins in lexical order, whatever order they were written in: the
/// last that sets `enable_nri` decides; any file name counts, as in CRI-O.
#[test]
fn the_last_dropin_that_sets_nri_decides() {
    let node = crio_node(&[
        ("crio.conf.d/20-off", "[crio.nri]\nenable_nri = false\n"),
        ("crio.conf.d/10-on.conf", "[crio.nri]\nenable_nri = true\n"),
    ]);
    let nri = run_check(&node, "nri enabled");
    assert_eq!(nri.status, Status::Warn, "{nri:?}");
    assert!(
        nri.detail.ends_with("20-off: the plugin cannot connect"),
        "{nri:?}"
    );
    // A subdirectory's files and a link to a file elsewhere count, in order.
    let dir = node.roots.etc_root.join("crio/crio.conf.d");
    write(
        &dir.join("30-sub/on.conf"),
        "[crio.nri]\nenable_nri = true\n",
    );
    let elsewhere = node.roots.etc_root.join("managed-nri.conf");
    write(&elsewhere, "[crio.nri]\nenable_nri = false\n");
    std::os::unix::fs::symlink(&elsewhere, dir.join("40-link.conf")).unwrap();
    let nri = run_check(&node, "nri enabled");
    assert!(nri.detail.contains("40-link.conf"), "{nri:?}");
    std::fs::remove_file(dir.join("40-link.conf")).unwrap();
    let nri = run_check(&node, "nri enabled");
    assert_eq!(nri.status, Status::Pass, "{nri:?}");
    assert!(nri.detail.ends_with("30-sub/on.conf"), "{nri:?}");
}

#[test]
fn nri_off_or_unset_is_a_warning_and_a_broken_config_fails() {
    let off = crio_node(&[(
        "crio.conf.d/10-nri.conf",
        "[crio.nri]\nenable_nri = false\n",
    )]);
    let nri = run_check(&off, "nri enabled");
    assert_eq!(nri.status, Status::Warn, "{nri:?}");
    assert!(
        nri.fix
            .as_deref()
            .unwrap_or_default()
            .contains("--hooks-only"),
        "{nri:?}"
    );

    let unset = crio_node(&[("crio.conf", "[crio.runtime]\n")]);
    let nri = run_check(&unset, "nri enabled");
    assert_eq!(nri.status, Status::Warn, "{nri:?}");
    assert!(nri.detail.contains("not set"), "{nri:?}");

    let broken = crio_node(&[("crio.conf", "[crio.nri\n")]);
    let nri = run_check(&broken, "nri enabled");
    assert_eq!(nri.status, Status::Fail, "{nri:?}");
    assert!(nri.detail.contains("line 1, column"), "{nri:?}");
}

/// Without `/etc/crio` a node without containerd still fails its check.
#[test]
fn no_containerd_and_no_crio_still_fails() {
    let mut node = healthy();
    node.host.version = Err("containerd: not found".into());
    let checks = run_checks(&node.roots, &node.host);
    assert_eq!(check(&checks, "containerd").status, Status::Fail);
}

/// Moves the healthy node's hooks.d file from /usr/share's directory to /etc's.
fn hooks_file_in_etc(node: &super::Node) {
    let etc = node.roots.etc_root.join("containers/oci/hooks.d");
    std::fs::create_dir_all(&etc).unwrap();
    let usr = node
        .roots
        .host_root
        .join("usr/share/containers/oci/hooks.d/devgate.json");
    std::fs::rename(usr, etc.join("devgate.json")).unwrap();
}

/// CRI-O reads hooks.d files only from its `hooks_dir` (by default
/// /usr/share/containers/oci/hooks.d): the file in /etc's directory alone,
/// which podman reads, warns on a CRI-O node, until a drop-in lists /etc's.
#[test]
fn the_hooks_file_is_looked_for_where_crio_reads_hooks() {
    let node = crio_node(&[]);
    hooks_file_in_etc(&node);
    let hooks = run_check(&node, "hooks.d");
    assert_eq!(hooks.status, Status::Warn, "{hooks:?}");
    assert!(
        hooks
            .detail
            .contains("CRI-O's hooks_dir (/usr/share/containers/oci/hooks.d)"),
        "{hooks:?}"
    );
    let dropin = node.roots.etc_root.join("crio/crio.conf.d/10-hooks.conf");
    let listed = "[crio.runtime]\nhooks_dir = [\"/opt/hooks\", \"/etc/containers/oci/hooks.d\"]\n";
    write(&dropin, listed);
    let hooks = run_check(&node, "hooks.d");
    assert_eq!(hooks.status, Status::Pass, "{hooks:?}");
    assert!(hooks.detail.contains("hooks.d/devgate.json"), "{hooks:?}");

    write(
        &dropin,
        "[crio.runtime]\nhooks_dir = \"/etc/containers/oci/hooks.d\"\n",
    );
    let hooks = run_check(&node, "hooks.d");
    assert_eq!(hooks.status, Status::Fail, "{hooks:?}");
    assert!(hooks.detail.contains("not a list of paths"), "{hooks:?}");
}

/// A hooks-only CRI-O node (`bootstrap.sh --hooks-only`): NRI off, no socket
/// and no plugin, the hooks.d file where CRI-O reads it. The node works as
/// built: the socket and the plugin's absence warn, naming the mode, and
/// nothing fails. Without the hooks.d file nothing serves devgate: they fail.
#[test]
fn a_hooks_only_node_without_socket_or_plugin_passes_with_warnings() {
    let mut node = crio_node(&[
        (
            "crio.conf.d/10-nri.conf",
            "[crio.nri]\nenable_nri = false\n",
        ),
        (
            "crio.conf.d/10-hooks.conf",
            "[crio.runtime]\nhooks_dir = [\"/etc/containers/oci/hooks.d\"]\n",
        ),
    ]);
    hooks_file_in_etc(&node);
    node.host.socket_up = false;
    std::fs::remove_dir_all(node.roots.proc_dir.join("4242")).unwrap();
    let checks = run_checks(&node.roots, &node.host);
    assert!(crate::cli::doctor::verdict(&checks).is_ok(), "{checks:?}");
    for name in ["nri socket", "devgate registered"] {
        let c = check(&checks, name);
        assert_eq!(c.status, Status::Warn, "{c:?}");
        assert!(c.detail.contains("hooks-only mode"), "{c:?}");
    }
    std::fs::remove_file(node.roots.etc_root.join("crio/crio.conf.d/10-hooks.conf")).unwrap();
    let checks = run_checks(&node.roots, &node.host);
    for name in ["nri socket", "devgate registered"] {
        assert_eq!(check(&checks, name).status, Status::Fail, "{name}");
    }
}

/// podman reads the `hooks_dir` its containers.conf files set, the last
/// one winning (drop-ins by name), `{append = true}` (podman 5) adding the
/// default; without podman on the host, the file's place is not judged.
#[test]
fn podman_reads_the_hooks_dir_its_containers_conf_sets() {
    let node = super::healthy();
    hooks_file_in_etc(&node);
    assert_eq!(run_check(&node, "hooks.d").status, Status::Pass);

    write(&node.roots.host_root.join("usr/bin/podman"), "");
    assert_eq!(run_check(&node, "hooks.d").status, Status::Warn);
    let dropins = node.roots.etc_root.join("containers/containers.conf.d");
    write(
        &dropins.join("10-hooks.conf"),
        "[engine]\nhooks_dir = [\"/etc/containers/oci/hooks.d\", {append = true}]\n",
    );
    let hooks = run_check(&node, "hooks.d");
    assert_eq!(hooks.status, Status::Pass, "{hooks:?}");
    // A later drop-in replaces the list.
    write(
        &dropins.join("20-hooks.conf"),
        "[engine]\nhooks_dir = [\"/opt/hooks\"]\n",
    );
    let hooks = run_check(&node, "hooks.d");
    assert_eq!(hooks.status, Status::Warn, "{hooks:?}");
    assert!(hooks.detail.contains("only from /opt/hooks"), "{hooks:?}");
}
