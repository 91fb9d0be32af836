//! `devgate cdi generate` without a runtime: both kinds to stdout, one kind to
//! a file, both to a directory, and the refusals and clean-up around them.
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use devgate::fixture::{Fixture, HostRootBuilder};
use serde_json::Value;

/// `devgate cdi generate` on the host root `root`, without a config.
fn command(root: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_devgate"));
    cmd.args(["cdi", "generate", "--config", "/nonexistent/devgate.toml"])
        .arg("--host-root")
        .arg(root);
    cmd
}

fn generate(root: &Path, extra: &[&str]) -> Output {
    command(root)
        .args(extra)
        .output()
        .expect("run devgate cdi generate")
}

/// The names of the files in `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// [`generate`] that must succeed.
fn generated(root: &Path, extra: &[&str]) -> Output {
    succeeded(generate(root, extra))
}

/// `out`, after asserting its run succeeded (its stderr shown otherwise).
fn succeeded(out: Output) -> Output {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn kinds(text: &str) -> Vec<String> {
    serde_json::Deserializer::from_str(text)
        .into_iter::<Value>()
        .map(|v| {
            v.expect("a json spec")["kind"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

/// A scratch directory with the HGX fixture in it and an empty spec
/// directory, `cdi`, beside it.
fn hgx_and_specs_dir() -> (tempfile::TempDir, Fixture, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let hgx = HostRootBuilder::hgx()
        .build(&dir.path().join("hgx"))
        .unwrap();
    let specs = dir.path().join("cdi");
    std::fs::create_dir(&specs).unwrap();
    (dir, hgx, specs)
}

#[test]
fn stdout_file_and_directory_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let hgx = HostRootBuilder::hgx()
        .build(&dir.path().join("hgx"))
        .unwrap();

    // Without -o: every kind's spec on stdout, nothing else there.
    let out = generated(hgx.root(), &[]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(kinds(&stdout), ["devgate.io/gpu", "devgate.io/rdma"]);

    // -o naming a file: a spec holds one kind, so the first goes there and
    // the second beside it, where a runtime reading the directory finds both.
    let file = dir.path().join("devgate.json");
    let out = generated(hgx.root(), &["-o", file.to_str().unwrap()]);
    let second = dir.path().join("devgate-rdma.json");
    assert_eq!(
        kinds(&std::fs::read_to_string(&file).unwrap()),
        ["devgate.io/gpu"]
    );
    assert_eq!(
        kinds(&std::fs::read_to_string(&second).unwrap()),
        ["devgate.io/rdma"]
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("devgate.io/rdma went to"), "{stderr}");
    // One kind asked for, into a file of its own: that kind there, and its
    // earlier file, now stale, removed; the other kind's file stays. (Into
    // the file holding the other kind it is refused: see below.)
    let only = dir.path().join("rdma-only.json");
    generated(
        hgx.root(),
        &["--kind", "rdma", "-o", only.to_str().unwrap()],
    );
    assert_eq!(
        kinds(&std::fs::read_to_string(&only).unwrap()),
        ["devgate.io/rdma"]
    );
    assert!(!second.exists(), "the same devices never in two specs");
    assert_eq!(
        kinds(&std::fs::read_to_string(&file).unwrap()),
        ["devgate.io/gpu"]
    );

    // A path that does not exist and is not named like a spec is a
    // directory, made for the specs (`-o /etc/cdi` on a fresh node).
    let fresh = dir.path().join("etc-cdi");
    generated(hgx.root(), &["-o", fresh.to_str().unwrap()]);
    assert!(fresh.join("devgate.io-gpu.json").is_file());
    assert!(fresh.join("devgate.io-rdma.json").is_file());
    // A file in a directory that does not exist yet (`-o
    // /etc/cdi/devgate.json` on a fresh node): the directory is made.
    let in_fresh = dir.path().join("fresh-etc/cdi/devgate.json");
    generated(hgx.root(), &["-o", in_fresh.to_str().unwrap()]);
    assert_eq!(
        kinds(&std::fs::read_to_string(&in_fresh).unwrap()),
        ["devgate.io/gpu"]
    );
    assert!(in_fresh.with_file_name("devgate-rdma.json").is_file());

    // A directory gets one file per kind; a kind the node no longer has loses
    // its stale spec, so the runtime cannot resolve devices that are gone.
    let specs = dir.path().join("cdi");
    std::fs::create_dir(&specs).unwrap();
    generated(hgx.root(), &["-o", specs.to_str().unwrap()]);
    let rdma = specs.join("devgate.io-rdma.json");
    assert!(specs.join("devgate.io-gpu.json").exists() && rdma.exists());
    let gpus_only = HostRootBuilder::hgx()
        .nics(0)
        .intel_rdma(false)
        .build(&dir.path().join("gpus-only"))
        .unwrap();
    let out = generated(gpus_only.root(), &["-o", specs.to_str().unwrap()]);
    assert!(specs.join("devgate.io-gpu.json").exists());
    assert!(!rdma.exists(), "stale rdma spec removed");
    // Said, since a container asking for such a device is refused from now.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "note: removed {}: a kind without devices",
            rdma.display()
        )),
        "{stderr}"
    );
}

/// Each kind in one spec of a directory, however earlier runs named their
/// output: CDI refuses a device that two specs name.
#[test]
fn switching_between_file_and_directory_keeps_one_spec_per_kind() {
    let (dir, hgx, specs) = hgx_and_specs_dir();
    // Somebody else's spec, a file that is no spec, and a spec converted to
    // YAML by hand: only the last declares a kind of devgate's.
    let other = specs.join("vendor.json");
    std::fs::write(
        &other,
        r#"{"cdiVersion":"0.6.0","kind":"vendor.com/x","devices":[]}"#,
    )
    .unwrap();
    let notes = specs.join("notes.json");
    std::fs::write(&notes, "not a spec").unwrap();
    let converted = specs.join("devgate.yaml");
    std::fs::write(
        &converted,
        "cdiVersion: 0.6.0\nkind: devgate.io/rdma\ndevices: []\n",
    )
    .unwrap();

    // The directory first, then a file in it: the directory's files go.
    generated(hgx.root(), &["-o", specs.to_str().unwrap()]);
    assert!(!converted.exists(), "the hand-made rdma spec removed");
    let file = specs.join("devgate.json");
    let out = generated(hgx.root(), &["-o", file.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("devgate.io-gpu.json: it also declared devgate.io/gpu;")
            && stderr.contains("devgate.json now holds it"),
        "{stderr}"
    );
    assert_eq!(
        names_in(&specs),
        [
            "devgate-rdma.json",
            "devgate.json",
            "notes.json",
            "vendor.json"
        ]
    );

    // Then the directory again, from inside it with a relative path for the
    // file in between: what this run writes is never taken for another spec.
    succeeded(
        command(hgx.root())
            .current_dir(&specs)
            .args(["-o", "devgate.json"])
            .output()
            .unwrap(),
    );
    assert!(file.exists() && specs.join("devgate-rdma.json").exists());
    generated(hgx.root(), &["-o", specs.to_str().unwrap()]);
    assert_eq!(
        names_in(&specs),
        [
            "devgate.io-gpu.json",
            "devgate.io-rdma.json",
            "notes.json",
            "vendor.json"
        ]
    );
    assert_eq!(
        kinds(&std::fs::read_to_string(&other).unwrap()),
        ["vendor.com/x"]
    );

    // A link to a spec of devgate's kept elsewhere (an earlier `-o` outside
    // the directory): CDI reads it as that spec, so the link goes (its
    // target stays); a FIFO so named is not waited on.
    let elsewhere = dir.path().join("kept-gpu.json");
    std::fs::copy(specs.join("devgate.io-gpu.json"), &elsewhere).unwrap();
    let link = specs.join("linked.json");
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    let fifo = specs.join("fifo.json");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let out = generated(hgx.root(), &["-o", specs.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(std::fs::symlink_metadata(&link).is_err(), "{stderr}");
    assert!(
        stderr.contains("linked.json: it also declared devgate.io/gpu;"),
        "{stderr}"
    );
    assert_eq!(
        kinds(&std::fs::read_to_string(&elsewhere).unwrap()),
        ["devgate.io/gpu"]
    );
    std::fs::remove_file(&fifo).unwrap();

    // A node without RDMA devices: a spec of that kind under any name is
    // stale, and goes too.
    let stray = specs.join("old-rdma.json");
    std::fs::copy(specs.join("devgate.io-rdma.json"), &stray).unwrap();
    let gpus_only = HostRootBuilder::hgx()
        .nics(0)
        .intel_rdma(false)
        .build(&dir.path().join("gpus-only"))
        .unwrap();
    let out = generated(gpus_only.root(), &["-o", specs.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stray.exists() && !specs.join("devgate.io-rdma.json").exists());
    assert!(
        stderr.contains(
            "old-rdma.json: it also declared devgate.io/rdma; this node has no such devices"
        ),
        "{stderr}"
    );
}

/// `-o FILE` never replaces a spec of a kind the run does not write: the
/// other kind under `--kind`, or another vendor's. Nothing is written then.
#[test]
fn a_file_holding_another_kind_is_not_replaced() {
    let (_dir, hgx, specs) = hgx_and_specs_dir();
    let file = specs.join("devgate.json");
    let path = file.to_str().unwrap();
    generated(hgx.root(), &["--kind", "gpu", "-o", path]);
    let before = std::fs::read_to_string(&file).unwrap();
    assert_eq!(kinds(&before), ["devgate.io/gpu"]);

    let out = generate(hgx.root(), &["--kind", "rdma", "-o", path]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("is a cdi spec of kind devgate.io/gpu, which this run does not write"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), before);
    assert_eq!(names_in(&specs), ["devgate.json"]);

    // Its own kind again, or both kinds (the GPUs stay in it): written.
    generated(hgx.root(), &["--kind", "gpu", "-o", path]);
    generated(hgx.root(), &["-o", path]);
    assert_eq!(names_in(&specs), ["devgate-rdma.json", "devgate.json"]);

    // An existing file CDI would not load: refused, the specs beside it kept.
    let conf = specs.join("devgate.conf");
    std::fs::write(&conf, "").unwrap();
    let out = generate(hgx.root(), &["-o", conf.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("not named *.json or *.yaml"), "{stderr}");
    assert_eq!(
        names_in(&specs),
        ["devgate-rdma.json", "devgate.conf", "devgate.json"]
    );
    std::fs::remove_file(&conf).unwrap();

    let vendor = specs.join("vendor.yaml");
    let theirs = "cdiVersion: 0.6.0\nkind: vendor.com/x\ndevices: []\n";
    std::fs::write(&vendor, theirs).unwrap();
    let out = generate(hgx.root(), &["-o", vendor.to_str().unwrap()]);
    assert!(!out.status.success());
    assert_eq!(std::fs::read_to_string(&vendor).unwrap(), theirs);
    assert!(!specs.join("vendor-rdma.yaml").exists());
}

/// `out` failed, saying `what` on stderr.
fn refused(out: Output, what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains(what), "{stderr}");
}

/// What would tell the runtime the node has no devices, or put the specs
/// where none looks, is refused with nothing written or removed.
#[test]
fn a_root_without_sysfs_or_a_new_non_spec_name_changes_nothing() {
    let (dir, hgx, specs) = hgx_and_specs_dir();
    generated(hgx.root(), &["-o", specs.to_str().unwrap()]);
    let before = names_in(&specs);
    assert_eq!(before, ["devgate.io-gpu.json", "devgate.io-rdma.json"]);

    // A wrong root, or a container's /host/sys left unmounted: before, it
    // read as a node without devices and both specs were removed.
    let empty = dir.path().join("empty-root");
    std::fs::create_dir(&empty).unwrap();
    refused(
        generate(&empty, &["-o", specs.to_str().unwrap()]),
        "no sysfs under",
    );
    refused(generate(&empty, &[]), "no sysfs under");
    assert_eq!(names_in(&specs), before);

    // A new name with an extension CDI does not load: not made a directory.
    let yml = specs.join("devgate.yml");
    refused(
        generate(hgx.root(), &["-o", yml.to_str().unwrap()]),
        "not *.json or *.yaml",
    );
    assert!(!yml.exists());
    assert_eq!(names_in(&specs), before);
    // Ending in `/`, a dotted name is a directory.
    let dotted = dir.path().join("cdi.d");
    generated(hgx.root(), &["-o", &format!("{}/", dotted.display())]);
    assert_eq!(names_in(&dotted), before);

    // Nothing to print is an error, not an empty success.
    let no_gpus = HostRootBuilder::hgx()
        .gpus(0)
        .build(&dir.path().join("no-gpus"))
        .unwrap();
    let out = generate(no_gpus.root(), &["--kind", "gpu"]);
    assert!(out.stdout.is_empty());
    refused(out, "no spec to print");
}
