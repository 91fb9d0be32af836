//! The NRI hook check on nodes whose hook path or hook state dir is wrong.
use std::os::unix::fs::PermissionsExt;

use super::{check, healthy, healthy_from, write, write_script, Node};
use crate::cli::doctor::{run_checks, Status};

type Setup = fn(&mut Node);

/// The healthy node's config plus `extra` keys.
fn config(node: &Node, extra: &str) {
    write(
        node.roots.config.as_deref().unwrap(),
        &format!("{extra}\n[sriov.num_vfs]\n\"0000:19:00.0\" = 4\n"),
    );
}

#[test]
fn hook_path_and_state_dir_are_checked_as_the_host_sees_them() {
    let cases: &[(&str, Setup, Status, &str)] = &[
        (
            "configured hook and its state dir",
            |n| {
                let host_state = n.roots.host_root.join("run/devgate");
                std::fs::create_dir_all(host_state.parent().unwrap()).unwrap();
                std::os::unix::fs::symlink(&n.roots.state_dir, &host_state).unwrap();
                config(
                    n,
                    "hook_path = \"/usr/local/bin/devgate-hook\"\nhook_state_dir = \"/run/devgate\"",
                );
            },
            Status::Pass,
            "/usr/local/bin/devgate-hook, state dir /run/devgate",
        ),
        (
            "hook missing",
            |n| std::fs::remove_file(n.roots.host_root.join("usr/local/bin/devgate-hook")).unwrap(),
            Status::Fail,
            "/usr/local/bin/devgate-hook is not an executable file on the host",
        ),
        (
            "hook not executable",
            |n| {
                let hook = n.roots.host_root.join("usr/local/bin/devgate-hook");
                std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o644)).unwrap();
            },
            Status::Fail,
            "not an executable file",
        ),
        (
            "configured hook absent",
            |n| config(n, "hook_path = \"/opt/devgate/bin/devgate-hook\""),
            Status::Fail,
            "/opt/devgate/bin/devgate-hook is not an executable file",
        ),
        (
            "hook state dir is another directory",
            |n| {
                std::fs::create_dir_all(n.roots.host_root.join("run/other")).unwrap();
                config(n, "hook_state_dir = \"/run/other\"");
            },
            Status::Fail,
            "is not the plugin's state dir",
        ),
        (
            "hook state dir not visible",
            |n| config(n, "hook_state_dir = \"/run/devgate\""),
            Status::Warn,
            "cannot compare hook_state_dir /run/devgate",
        ),
        (
            "no hook_path and no running plugin",
            |n| std::fs::remove_dir_all(n.roots.proc_dir.join("4242")).unwrap(),
            Status::Warn,
            "no devgate nri runs",
        ),
    ];
    let template = healthy();
    for (case, setup, status, needle) in cases {
        let mut node = healthy_from(Some(&template.roots.host_root));
        setup(&mut node);
        let checks = run_checks(&node.roots, &node.host);
        let c = check(&checks, "nri hook");
        assert_eq!(c.status, *status, "{case}: {c:?}");
        assert!(c.detail.contains(needle), "{case}: {c:?}");
        assert_eq!(c.fix.is_some(), *status != Status::Pass, "{case}: {c:?}");
    }
}

/// The config check passes, reading `file` (as it ends) for the running
/// plugin, pid 4242.
fn config_read_from(checks: &[crate::cli::doctor::Check], file: &str) {
    let config = check(checks, "config");
    assert_eq!(config.status, Status::Pass, "{config:?}");
    let read = format!("{file} (devgate nri, pid 4242, reads it)");
    assert!(config.detail.contains(&read), "{config:?}");
}

/// The nri hook check passes, naming `hook`.
fn hook_passes(checks: &[crate::cli::doctor::Check], hook: &str) {
    let c = check(checks, "nri hook");
    assert_eq!(c.status, Status::Pass, "{c:?}");
    assert!(c.detail.contains(hook), "{c:?}");
}

/// A DaemonSet node: the plugin runs in a container and reads the ConfigMap
/// mounted there (`--config`), whose `hook_path` is where the init container
/// put the hook; the host's own file (from `bootstrap.sh --node-only`) names
/// none. Without `--config`, doctor checks the plugin's config, seen through
/// its root, and says so; given one, it checks that.
#[test]
fn without_config_the_running_plugins_own_config_is_checked() {
    let mut node = healthy();
    let plugin = node.roots.proc_dir.join("4242");
    write(
        &plugin.join("cmdline"),
        "/usr/local/bin/devgate\0nri\0--config=/etc/devgate/config.toml\0--socket=/var/run/nri/nri.sock\0",
    );
    write(
        &plugin.join("root/etc/devgate/config.toml"),
        "hook_path = \"/opt/devgate/bin/devgate-hook\"\n[sriov.num_vfs]\n\"0000:19:00.0\" = 4\n",
    );
    // Only the init container's copy exists on the host.
    std::fs::remove_file(node.roots.host_root.join("usr/local/bin/devgate-hook")).unwrap();
    write_script(&node.roots.host_root.join("opt/devgate/bin/devgate-hook"));

    let given = run_checks(&node.roots, &node.host);
    assert_eq!(
        check(&given, "nri hook").status,
        Status::Fail,
        "the host's file names no hook_path"
    );

    node.roots.config = None;
    let checks = run_checks(&node.roots, &node.host);
    config_read_from(&checks, "4242/root/etc/devgate/config.toml");
    hook_passes(&checks, "/opt/devgate/bin/devgate-hook");
}

/// The plugin's files behind absolute links in its own root (a config whose
/// mount is linked in, a hook beside its executable that is a link): doctor
/// follows them there, as the plugin does, not from its own root, where the
/// kernel would take them through `<proc>/<pid>/root`.
#[test]
fn absolute_links_in_the_plugins_root_are_followed_there() {
    use std::os::unix::fs::symlink;
    let mut node = healthy();
    node.roots.config = None;
    let plugin = node.roots.proc_dir.join("4242");
    let root = plugin.join("root");
    write(
        &root.join("configmap/config.toml"),
        "hook_path = \"/opt/devgate/bin/devgate-hook\"\n[sriov.num_vfs]\n\"0000:19:00.0\" = 4\n",
    );
    std::fs::create_dir_all(root.join("etc/devgate")).unwrap();
    symlink(
        "/configmap/config.toml",
        root.join("etc/devgate/config.toml"),
    )
    .unwrap();
    // Only the init container's copy exists on the host.
    std::fs::remove_file(node.roots.host_root.join("usr/local/bin/devgate-hook")).unwrap();
    write_script(&node.roots.host_root.join("opt/devgate/bin/devgate-hook"));

    let checks = run_checks(&node.roots, &node.host);
    config_read_from(&checks, "4242/root/configmap/config.toml");
    hook_passes(&checks, "/opt/devgate/bin/devgate-hook");

    // No hook_path: the hook beside the plugin's executable, a link in its
    // root to the copy it was installed with.
    write(
        &root.join("configmap/config.toml"),
        "[sriov.num_vfs]\n\"0000:19:00.0\" = 4\n",
    );
    std::fs::remove_file(plugin.join("exe")).unwrap();
    symlink("/opt/devgate/bin/devgate", plugin.join("exe")).unwrap();
    write_script(&root.join("image/devgate-hook"));
    std::fs::create_dir_all(root.join("opt/devgate/bin")).unwrap();
    symlink(
        "/image/devgate-hook",
        root.join("opt/devgate/bin/devgate-hook"),
    )
    .unwrap();
    let checks = run_checks(&node.roots, &node.host);
    hook_passes(&checks, "/opt/devgate/bin/devgate-hook");
}
