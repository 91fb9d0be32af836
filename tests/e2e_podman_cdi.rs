//! podman 4.3.1 (Debian bookworm) runs a container with a devgate RDMA VF named
//! by PCI address (`--device devgate.io/rdma=<bdf>`) from a spec that
//! `devgate cdi generate` wrote. Its CDI library (v0.5.2) knows no spec version
//! after 0.5.0, so a 0.6.0 spec is unresolvable and `--cdi-version 0.5.0` works.
//!
//! podman uses no containerd: `tests/run.sh` runs this file once, in the pass
//! under containerd 1.7, and leaves it out of the containerd 2.1 pass (as every
//! `e2e_podman*` file). Needs root; fails without it.
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use devgate::fixture::HostRootBuilder;
use support::{image_set, require_root, DEVGATE};

fn generate(root: &Path, config: &Path, extra: &[&str]) {
    let out = Command::new(DEVGATE)
        .args(["cdi", "generate", "--host-root"])
        .arg(root)
        .arg("--config")
        .arg(config)
        .args(extra)
        .output()
        .expect("run devgate");
    assert!(
        out.status.success(),
        "devgate cdi generate {extra:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CDI spec file in podman's dynamic spec directory, removed on drop.
struct SpecFile(PathBuf);

/// podman reads every spec of the CDI directories: one left by a run of this
/// test that was killed is removed, and one of anything else that names
/// devgate's devices (a node's own install) would decide the lookup instead
/// of the spec under test, so it fails the test.
fn no_other_devgate_spec() {
    for dir in ["/etc/cdi", "/var/run/cdi"] {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for path in entries.flatten().map(|e| e.path()) {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            let pid = name
                .strip_prefix("devgate-e2e-")
                .and_then(|rest| rest.strip_suffix(".json"));
            // Left by a run that is gone: its pid is not a run of this test
            // (it may have been taken by another process since).
            if let Some(pid) = pid {
                let exe = std::fs::read_link(Path::new("/proc").join(pid).join("exe")).ok();
                if exe.is_none() || exe != std::env::current_exe().ok() {
                    let _ = std::fs::remove_file(&path);
                    continue;
                }
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                !text.contains("devgate.io"),
                "{} already names devgate's devices; podman would read it beside this test's spec",
                path.display()
            );
        }
    }
}

impl Drop for SpecFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Private podman storage (vfs), state, networks and volumes, so the host's
/// are left alone; settings this VM needs.
fn podman(store: &Path, args: &[&str]) -> std::process::Output {
    let private = |flag: &str, dir: &str| [flag.to_string(), store.join(dir).display().to_string()];
    Command::new("podman")
        .args(private("--root", "root"))
        .args(private("--runroot", "run"))
        .args(private("--tmpdir", "tmp"))
        .args(private("--network-config-dir", "net"))
        .args(private("--volumepath", "volumes"))
        .args(["--storage-driver", "vfs", "--cgroup-manager", "cgroupfs"])
        .args(["--events-backend", "file"])
        .args(args)
        .output()
        .expect("run podman (tests/setup-host.sh installs it)")
}

const RDMA_CHECK: &str = r#"
for d in /dev/infiniband/*; do echo "node $d $(stat -c '%t:%T' $d)"; done
for d in /dev/infiniband/uverbs*; do echo "open: $(cat $d 2>&1)"; done
"#;

#[test]
fn podman_runs_a_container_with_a_devgate_rdma_vf_by_pci_address() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let fixture = HostRootBuilder::hgx()
        .build(&dir.path().join("host"))
        .expect("host root");
    let config = dir.path().join("none.toml");
    let spec = SpecFile(PathBuf::from(format!(
        "/var/run/cdi/devgate-e2e-{}.json",
        std::process::id()
    )));
    std::fs::create_dir_all("/var/run/cdi").expect("create /var/run/cdi");
    no_other_devgate_spec();
    let out = podman(
        dir.path(),
        &["load", "-i", &image_set().workload.to_string_lossy()],
    );
    assert!(out.status.success(), "podman load: {out:?}");
    let inv = fixture.expected();
    let nic = &inv.rdma[0];
    let vf = &nic.vfs[0];
    let device = format!("devgate.io/rdma={}", vf.bus_id);
    let run = |name: &str| {
        podman(
            dir.path(),
            &[
                "run",
                "--rm",
                "--name",
                name,
                "--network",
                "none",
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=1024:1024",
                "--device",
                &device,
                support::WORKLOAD_IMAGE,
                "sh",
                "-c",
                RDMA_CHECK,
            ],
        )
    };
    let spec_path = spec.0.to_string_lossy().into_owned();

    // cdiVersion 0.6.0 is past what podman 4.3's CDI library knows.
    generate(
        fixture.root(),
        &config,
        &["--kind", "rdma", "-o", &spec_path],
    );
    let out = run("cdi-060");
    assert!(
        !out.status.success(),
        "podman 4.3 took a 0.6.0 spec: {out:?}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unresolvable CDI devices"),
        "{out:?}"
    );

    generate(
        fixture.root(),
        &config,
        &["--kind", "rdma", "--cdi-version", "0.5.0", "-o", &spec_path],
    );
    let out = run("cdi-050");
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "podman run: {out:?}");
    let rdma = vf.rdma.as_ref().expect("fixture vf has an rdma device");
    let mut want: Vec<String> = rdma
        .char_devs
        .iter()
        .filter(|c| !c.name.starts_with("issm"))
        .map(|c| {
            format!(
                "node /dev/infiniband/{} {:x}:{:x}",
                c.name, c.dev.major, c.dev.minor
            )
        })
        .collect();
    let cm = inv.rdma_cm.expect("fixture rdma_cm");
    want.push(format!(
        "node /dev/infiniband/rdma_cm {:x}:{:x}",
        cm.major, cm.minor
    ));
    want.sort();
    let mut got: Vec<String> = log
        .lines()
        .filter(|l| l.starts_with("node "))
        .map(String::from)
        .collect();
    got.sort();
    assert_eq!(got, want, "{log}");
    assert!(
        log.contains("No such device or address"),
        "cgroup must allow uverbs: {log}"
    );
}
