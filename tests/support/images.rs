//! Container images without a registry: a one-layer busybox-static rootfs written
//! as docker-archive tarballs that `ctr images import` loads.
//!
//! The tarballs are built once and cached under cargo's target tmp dir, keyed by
//! the busybox binary, so that every test binary and test reuses them.
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::json;

use super::process::run;

/// The CRI sandbox ("pause") image containerd is configured with.
pub const SANDBOX_IMAGE: &str = "registry.k8s.io/pause:3.9";
/// The image workload containers run.
pub const WORKLOAD_IMAGE: &str = "devgate.test/busybox:1";

const BUSYBOX: &str = "/bin/busybox";
/// Bump when the image layout changes so that stale caches are not reused.
const FORMAT: u32 = 1;

/// Paths of the image tarballs, built on first use.
pub struct ImageSet {
    pub sandbox: PathBuf,
    pub workload: PathBuf,
}

/// The cached tarballs, building them if this is the first caller on this host.
pub fn image_set() -> &'static ImageSet {
    static SET: OnceLock<ImageSet> = OnceLock::new();
    SET.get_or_init(|| {
        let dir = cache_dir();
        if !dir.join("done").exists() {
            build_into(&dir);
        }
        ImageSet {
            sandbox: dir.join("sandbox.tar"),
            workload: dir.join("workload.tar"),
        }
    })
}

fn cache_dir() -> PathBuf {
    let meta = std::fs::metadata(BUSYBOX).unwrap_or_else(|e| {
        panic!("{BUSYBOX}: {e} (install busybox-static; tests/setup-host.sh does)")
    });
    let mtime = meta.modified().expect("busybox mtime");
    let secs = mtime
        .duration_since(std::time::UNIX_EPOCH)
        .expect("mtime after epoch")
        .as_secs();
    // Examples (the demo) have no CARGO_TARGET_TMPDIR; they run from target/.
    PathBuf::from(option_env!("CARGO_TARGET_TMPDIR").unwrap_or("target/tmp"))
        .join(format!("images-v{FORMAT}-{}-{secs}", meta.len()))
}

/// Builds in a private scratch directory and renames it into place, so that
/// concurrent test binaries either win the rename or discard their copy.
fn build_into(dir: &Path) {
    let parent = dir.parent().expect("cache dir has a parent");
    std::fs::create_dir_all(parent).expect("create target tmp dir");
    let scratch = tempfile::Builder::new()
        .prefix(".images-")
        .tempdir_in(parent)
        .expect("scratch dir");
    let rootfs = scratch.path().join("rootfs");
    build_rootfs(&rootfs);
    let layer = scratch.path().join("layer.tar");
    let rootfs_arg = rootfs.to_string_lossy();
    let layer_arg = layer.to_string_lossy();
    run(
        "tar",
        &[
            "--numeric-owner",
            "--owner=0",
            "--group=0",
            "-C",
            &rootfs_arg,
            "-cf",
            &layer_arg,
            ".",
        ],
    )
    .expect("tar the rootfs layer");
    let pause = json!(["/bin/sleep", "inf"]);
    let shell = json!(["/bin/sh"]);
    write_archive(scratch.path(), &layer, SANDBOX_IMAGE, &pause, "sandbox.tar");
    write_archive(
        scratch.path(),
        &layer,
        WORKLOAD_IMAGE,
        &shell,
        "workload.tar",
    );
    std::fs::write(scratch.path().join("done"), b"").expect("mark images done");
    std::fs::remove_dir_all(&rootfs).expect("remove rootfs scratch");
    let scratch = scratch.keep();
    if std::fs::rename(&scratch, dir).is_err() {
        // Another process finished first; its copy is identical.
        let _ = std::fs::remove_dir_all(&scratch);
    }
}

/// /bin/busybox plus one symlink per applet, and the few files a runtime reads.
fn build_rootfs(rootfs: &Path) {
    for sub in ["bin", "dev", "etc", "proc", "sys", "tmp", "root"] {
        std::fs::create_dir_all(rootfs.join(sub)).expect("create rootfs dir");
    }
    std::fs::copy(BUSYBOX, rootfs.join("bin/busybox")).expect("copy busybox");
    let applets = run(BUSYBOX, &["--list"]).expect("busybox --list");
    for applet in applets.lines().filter(|a| !a.is_empty() && *a != "busybox") {
        symlink("busybox", rootfs.join("bin").join(applet)).expect("applet symlink");
    }
    std::fs::write(rootfs.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").expect("passwd");
    std::fs::write(rootfs.join("etc/group"), "root:x:0:\n").expect("group");
}

/// Writes a docker-archive (`docker save` layout) holding one image.
fn write_archive(dir: &Path, layer: &Path, tag: &str, cmd: &serde_json::Value, out: &str) {
    let stage = dir.join(format!("{out}.d"));
    let layer_digest = sha256_hex(layer);
    std::fs::create_dir_all(stage.join(&layer_digest)).expect("layer dir");
    std::fs::copy(layer, stage.join(&layer_digest).join("layer.tar")).expect("copy layer");
    let config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": { "Env": ["PATH=/bin"], "Cmd": cmd, "WorkingDir": "/" },
        "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{layer_digest}")] },
    });
    let config_path = stage.join("config.json");
    std::fs::write(
        &config_path,
        serde_json::to_vec(&config).expect("config json"),
    )
    .expect("write config");
    let config_name = format!("{}.json", sha256_hex(&config_path));
    std::fs::rename(&config_path, stage.join(&config_name)).expect("name config by digest");
    let manifest = json!([{
        "Config": config_name,
        "RepoTags": [tag],
        "Layers": [format!("{layer_digest}/layer.tar")],
    }]);
    std::fs::write(
        stage.join("manifest.json"),
        serde_json::to_vec(&manifest).expect("manifest json"),
    )
    .expect("write manifest");
    let stage_arg = stage.to_string_lossy();
    let out_arg = dir.join(out);
    run(
        "tar",
        &["-C", &stage_arg, "-cf", &out_arg.to_string_lossy(), "."],
    )
    .expect("tar the archive");
    std::fs::remove_dir_all(&stage).expect("remove archive stage");
}

fn sha256_hex(path: &Path) -> String {
    let out = run("sha256sum", &[&path.to_string_lossy()]).expect("sha256sum");
    out.split_whitespace()
        .next()
        .expect("sha256sum output")
        .to_string()
}
