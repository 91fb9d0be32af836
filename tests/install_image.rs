//! `install/image.sh`: the image tarball is the same bytes from the same inputs, holds
//! what the DaemonSet runs, and the script refuses inputs it cannot make an image
//! of. `tests/e2e_daemonset.rs` runs the image it builds.
use std::path::Path;
use std::process::{Command, Output};

fn image_sh(args: &[&std::ffi::OsStr]) -> Output {
    image_sh_in(Path::new(env!("CARGO_MANIFEST_DIR")), args)
}

/// `install/image.sh args`, run from `cwd`.
fn image_sh_in(cwd: &Path, args: &[&std::ffi::OsStr]) -> Output {
    Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("install/image.sh"))
        .current_dir(cwd)
        .args(args)
        .output()
        .expect("run install/image.sh")
}

/// `install/image.sh args` from `cwd`, which must succeed; its stderr.
fn build_image(cwd: &Path, args: &[&std::ffi::OsStr]) -> String {
    let run = image_sh_in(cwd, args);
    let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
    assert!(run.status.success(), "{stderr}");
    stderr
}

/// What image.sh says of a hook that needs the node's C library.
const DYNAMIC_HOOK_WARNING: &str = "devgate-hook is dynamically linked";

/// The manifest entry of the one image in `archive`.
fn manifest(archive: &Path) -> serde_json::Value {
    let manifest = Command::new("tar")
        .arg("-xOf")
        .arg(archive)
        .arg("./manifest.json")
        .output()
        .expect("tar");
    let manifest: serde_json::Value = serde_json::from_slice(&manifest.stdout).unwrap();
    manifest[0].clone()
}

fn bin_dir() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_devgate"))
        .parent()
        .expect("binary dir")
}

/// The names in the image's one layer.
fn layer_names(archive: &Path) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg("tar -xOf \"$1\" --wildcards '*/layer.tar' | tar -t")
        .arg("sh")
        .arg(archive)
        .output()
        .expect("list the layer");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn same_inputs_give_the_same_image_with_what_the_daemonset_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.tar"), dir.path().join("b.tar"));
    for out in [&a, &b] {
        // cargo's test build of the hook is linked dynamically.
        let stderr = build_image(
            dir.path(),
            &[
                "--bin-dir".as_ref(),
                bin_dir().as_os_str(),
                "--tag".as_ref(),
                "example.test/devgate:t1".as_ref(),
                "--output".as_ref(),
                out.as_os_str(),
            ],
        );
        assert!(stderr.contains(DYNAMIC_HOOK_WARNING), "{stderr}");
    }
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());

    let manifest = manifest(&a);
    assert_eq!(
        manifest["RepoTags"],
        serde_json::json!(["example.test/devgate:t1"])
    );
    assert_eq!(manifest["Layers"].as_array().map(Vec::len), Some(1));
    // The image is for the architecture its binaries were built for: this host's.
    let config_name = manifest["Config"].as_str().unwrap();
    let config = Command::new("tar")
        .arg("-xOf")
        .arg(&a)
        .arg(format!("./{config_name}"))
        .output()
        .unwrap();
    let config: serde_json::Value = serde_json::from_slice(&config.stdout).unwrap();
    let want = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        other => other,
    };
    assert_eq!(config["architecture"], want, "{config}");
    let layer = layer_names(&a);
    for path in [
        "./usr/local/bin/devgate",
        "./usr/local/bin/devgate-hook",
        "./bin/busybox",
        "./bin/sh",
        "./bin/cp",
        "./bin/mv",
        "./lib64/ld-linux-x86-64.so.2",
        "./etc/passwd",
    ] {
        assert!(
            layer.lines().any(|l| l == path),
            "{path} not in the layer:\n{layer}"
        );
    }
    // The parts of glibc the host's NVML loads with it, beside libc.so.6.
    for part in ["libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1"] {
        assert!(
            layer.lines().any(|l| l.ends_with(&format!("/{part}"))),
            "{part}:\n{layer}"
        );
    }
    // Every library the binaries link is in the layer, at the path they ask for.
    let ldd = Command::new("ldd")
        .arg(env!("CARGO_BIN_EXE_devgate"))
        .output()
        .unwrap();
    for lib in String::from_utf8_lossy(&ldd.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with('/')))
    {
        assert!(
            layer.lines().any(|l| l == format!(".{lib}")),
            "{lib} missing:\n{layer}"
        );
    }
}

/// Relative paths are the caller's, not the checkout's; a registry's port is
/// not a tag, so the version is still added.
#[test]
fn paths_are_relative_to_the_caller_and_a_port_is_not_a_tag() {
    let dir = tempfile::tempdir().unwrap();
    let bins = dir.path().join("bins");
    std::fs::create_dir(&bins).unwrap();
    for name in ["devgate", "devgate-hook"] {
        std::fs::copy(bin_dir().join(name), bins.join(name)).unwrap();
    }
    build_image(
        dir.path(),
        &[
            "--bin-dir".as_ref(),
            "bins".as_ref(),
            "--tag".as_ref(),
            "localhost:5000/devgate".as_ref(),
            "--output".as_ref(),
            "out/image.tar".as_ref(),
        ],
    );
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        manifest(&dir.path().join("out/image.tar"))["RepoTags"],
        serde_json::json!([format!("localhost:5000/devgate:{version}")])
    );
}

#[test]
fn inputs_it_cannot_make_an_image_of_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.tar");
    let cases: [(&[&str], &str); 4] = [
        (
            &["--bin-dir", "/nonexistent"],
            "/nonexistent/devgate not found",
        ),
        (&["--busybox", "/bin/ls"], "/bin/ls is dynamically linked"),
        (&["--tag"], "--tag needs a value"),
        (&["--frobnicate"], "unknown argument: --frobnicate"),
    ];
    for (args, needle) in cases {
        let mut all: Vec<&std::ffi::OsStr> = vec!["--output".as_ref(), out.as_os_str()];
        if args[0] != "--bin-dir" {
            all.extend(["--bin-dir".as_ref(), bin_dir().as_os_str()]);
        }
        all.extend(args.iter().map(std::ffi::OsStr::new));
        let run = image_sh(&all);
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(!out.exists(), "{args:?} left an image behind");
    }
}

#[test]
fn static_binaries_need_no_libraries() {
    let dir = tempfile::tempdir().unwrap();
    let bins = dir.path().join("bin");
    std::fs::create_dir(&bins).unwrap();
    // busybox-static stands in for a static build of both binaries.
    for name in ["devgate", "devgate-hook"] {
        std::fs::copy("/bin/busybox", bins.join(name)).unwrap();
    }
    let out = dir.path().join("static.tar");
    let stderr = build_image(
        dir.path(),
        &[
            "--bin-dir".as_ref(),
            bins.as_os_str(),
            "--output".as_ref(),
            out.as_os_str(),
        ],
    );
    assert!(!stderr.contains(DYNAMIC_HOOK_WARNING), "{stderr}");
    let layer = layer_names(&out);
    assert!(
        layer.lines().any(|l| l == "./usr/local/bin/devgate-hook"),
        "{layer}"
    );
    assert!(
        !layer.contains(".so"),
        "a static image carries no library:\n{layer}"
    );
}
