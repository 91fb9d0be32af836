//! The shell scripts (install/, tests/, .ci/run) are shellcheck clean, and
//! `install/bootstrap.sh` finds its parts (install/lib/*.sh) from any working
//! directory. `tests/setup-host.sh` installs shellcheck.
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `*.sh` files directly in `dir` of the repository, sorted.
fn scripts(dir: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(repo().join(dir))
        .unwrap_or_else(|e| panic!("read {dir}: {e}"))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "sh"))
        .collect();
    found.sort();
    found
}

#[test]
fn shell_scripts_are_shellcheck_clean() {
    let mut files = scripts("install");
    files.extend(scripts("install/lib"));
    files.extend(scripts("tests"));
    // CI's entry point has no suffix.
    files.push(repo().join(".ci/run"));
    for name in [
        "install/bootstrap.sh",
        "install/lib/files.sh",
        "tests/run.sh",
    ] {
        assert!(files.contains(&repo().join(name)), "{name} not checked");
    }
    // -x follows bootstrap.sh's `source` of its parts, so their functions and
    // its globals are known to each other.
    let out = Command::new("shellcheck")
        .current_dir(repo())
        .arg("-x")
        .args(&files)
        .output()
        .expect("run shellcheck (tests/setup-host.sh installs it)");
    assert!(
        out.status.success(),
        "shellcheck:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn bootstrap_finds_its_parts_from_another_directory() {
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let out = Command::new("bash")
        .current_dir(elsewhere.path())
        .arg(repo().join("install/bootstrap.sh"))
        .arg("--help")
        .output()
        .expect("run bootstrap.sh");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("install/bootstrap.sh --uninstall"), "{text}");
}
