//! `install/bootstrap.sh` and containerd's imported config files: the ones it
//! must refuse (an NRI table that would override its edit) and the order and
//! reach in which containerd reads them.
mod bootstrap;

use bootstrap::*;

/// Configs bootstrap must not edit: a symbolic link (replacing it would leave
/// a file of mode 0777 and the real config behind), and one whose imported
/// file configures NRI (containerd would use that table, not the edit).
#[test]
fn a_linked_config_or_an_imported_nri_table_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = hooks_dir(dir.path());
    let version = ["--containerd-version", "1.7.24"];

    let linked = dir.path().join("linked");
    let real = linked.join("etc/containerd/real.toml");
    write(&real, "version = 2\n");
    let cfg = linked.join("etc/containerd/config.toml");
    std::os::unix::fs::symlink("real.toml", &cfg).unwrap();
    let run = bootstrap(&linked, &hooks, &version);
    assert!(!run.ok, "{}", run.out);
    position(&run.out, "is a symbolic link");
    assert!(cfg.is_symlink());
    assert_eq!(std::fs::read_to_string(&real).unwrap(), "version = 2\n");

    let imports = dir.path().join("imports");
    let main = "version = 2\nimports = [\"conf.d/*.toml\"]\n";
    let cfg = importing_nri_off(&imports, main);
    let run = bootstrap(&imports, &hooks, &version);
    assert!(!run.ok, "{}", run.out);
    position(&run.out, "/etc/containerd/conf.d/nri.toml (imported by");
    assert_eq!(std::fs::read_to_string(&cfg).unwrap(), main);
    assert!(
        !run.out.contains("systemctl restart containerd"),
        "{}",
        run.out
    );
    // An imported table that turns NRI on, and a comment naming it, are
    // fine: NRI is on, so the main file stays as it is and containerd is not
    // restarted for it.
    let on = dir.path().join("imports-on");
    write(&on.join("etc/containerd/config.toml"), main);
    write(
        &on.join("etc/containerd/conf.d/nri.toml"),
        "# io.containerd.nri.v1.nri\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = false\n",
    );
    let run = bootstrap(&on, &hooks, &version);
    assert!(run.ok, "{}", run.out);
    position(
        &run.out,
        "NRI is enabled by /etc/containerd/conf.d/nri.toml",
    );
    assert_eq!(
        std::fs::read_to_string(on.join("etc/containerd/config.toml")).unwrap(),
        main
    );
    assert!(
        !run.out.contains("systemctl restart containerd"),
        "{}",
        run.out
    );
    // On 2.x an imported table without `disable` merges into the main one,
    // whose `disable = true` stays in force: the main file is edited.
    let merged = dir.path().join("imports-merged");
    let main3 = "version = 3\nimports = [\"conf.d/*.toml\"]\n[plugins.'io.containerd.nri.v1.nri']\n  disable = true\n";
    write(&merged.join("etc/containerd/config.toml"), main3);
    write(
        &merged.join("etc/containerd/conf.d/nri.toml"),
        "[plugins.'io.containerd.nri.v1.nri']\n  socket_path = \"/var/run/nri/nri.sock\"\n",
    );
    let run = bootstrap(&merged, &hooks, &["--containerd-version", "2.1.9"]);
    assert!(run.ok, "{}", run.out);
    let edited = std::fs::read_to_string(merged.join("etc/containerd/config.toml")).unwrap();
    assert!(edited.contains("disable = false"), "{edited}\n{}", run.out);
    assert!(!run.out.contains("NRI is enabled by"), "{}", run.out);
    // An array over several lines is read whole.
    let multi = dir.path().join("imports-multi");
    let main = "version = 2\nimports = [\n  \"/etc/other.toml\", # a comment \"x\"\n  \"conf.d/*.toml\",\n]\n";
    write(&multi.join("etc/containerd/config.toml"), main);
    write(
        &multi.join("etc/containerd/conf.d/nri.toml"),
        "[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = true\n",
    );
    let run = bootstrap(&multi, &hooks, &version);
    assert!(!run.ok, "{}", run.out);
    position(&run.out, "/etc/containerd/conf.d/nri.toml (imported by");
    // A long import whose NRI table comes first: found all the same, not
    // lost to a reader that stopped at the first match.
    let long = dir.path().join("imports-long");
    write(&long.join("etc/containerd/config.toml"), main);
    let mut text = "[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = true\n[x]\n".to_string();
    text.push_str(&"key = 1\n".repeat(50_000));
    write(&long.join("etc/containerd/conf.d/nri.toml"), &text);
    let run = bootstrap(&long, &hooks, &version);
    assert!(!run.ok, "{}", run.out);
    position(&run.out, "/etc/containerd/conf.d/nri.toml (imported by");
    assert_eq!(
        std::fs::read_to_string(long.join("etc/containerd/config.toml")).unwrap(),
        main
    );
}

/// containerd follows an imported file's own imports, and loads each file
/// once: a table two imports deep that turns NRI off is found and refused,
/// and a glob that matches the config itself does not make its own NRI
/// table an import that leaves NRI off: the config is edited as usual.
#[test]
fn nested_imports_are_followed_and_the_config_is_not_its_own_import() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = hooks_dir(dir.path());
    let version = ["--containerd-version", "1.7.24"];

    let nested = dir.path().join("nested");
    let main = "version = 2\nimports = [\"conf.d/*.toml\"]\n";
    write(&nested.join("etc/containerd/config.toml"), main);
    write(
        &nested.join("etc/containerd/conf.d/10-more.toml"),
        "version = 2\nimports = [\"../nested/nri.toml\"]\n",
    );
    write(
        &nested.join("etc/containerd/nested/nri.toml"),
        "[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = true\n",
    );
    let run = bootstrap(&nested, &hooks, &version);
    assert!(!run.ok, "{}", run.out);
    position(&run.out, "/etc/containerd/nested/nri.toml (imported by");
    assert_eq!(
        std::fs::read_to_string(nested.join("etc/containerd/config.toml")).unwrap(),
        main
    );

    let own = dir.path().join("own");
    let cfg = own.join("etc/containerd/config.toml");
    write(
        &cfg,
        "version = 2\nimports = [\"*.toml\"]\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = true\n",
    );
    let run = bootstrap(&own, &hooks, &version);
    assert!(run.ok, "{}", run.out);
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(text.contains("disable = false"), "{text}");
    position(&run.out, "systemctl restart containerd.service");
}

/// More imported files than bootstrap reads (64, as `devgate doctor`) are
/// refused before any change, rather than the rest left unread.
#[test]
fn a_config_importing_more_than_64_files_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = hooks_dir(dir.path());
    let prefix = dir.path().join("many");
    let main = "version = 2\nimports = [\"conf.d/*.toml\"]\n";
    write(&prefix.join("etc/containerd/config.toml"), main);
    for i in 0..65 {
        write(
            &prefix.join(format!("etc/containerd/conf.d/{i:02}.toml")),
            "version = 2\n",
        );
    }
    let run = bootstrap(&prefix, &hooks, &["--containerd-version", "1.7.24"]);
    assert!(!run.ok, "{}", run.out);
    position(&run.out, "imports more than 64 files");
    assert_eq!(
        std::fs::read_to_string(prefix.join("etc/containerd/config.toml")).unwrap(),
        main
    );
    // 64 are read.
    std::fs::remove_file(prefix.join("etc/containerd/conf.d/64.toml")).unwrap();
    let run = bootstrap(&prefix, &hooks, &["--containerd-version", "1.7.24"]);
    assert!(run.ok, "{}", run.out);
}
