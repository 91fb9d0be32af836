//! HAMi-core's lock directory, bound read-write into every HAMi-core
//! container: made root's by the plugin, and a container refused while the
//! directory is anything another user could have made.
use super::*;
use crate::allocation::{GPU_ISOLATION_PROVIDER, HAMI_CORE};

#[test]
fn hami_cores_lock_directory_is_roots_or_the_container_is_refused() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root: it makes a directory of another owner"
    );
    let state = tempfile::tempdir().unwrap();
    let host = state.path().join("host");
    let fixture = crate::fixture::HostRootBuilder::hgx().build(&host).unwrap();
    let lock = state.path().join("run/vgpulock");
    let config = format!("[hami]\nhost_lock_dir = \"{}\"\n", lock.display());
    let plugin = plugin_on(&host, state.path(), &config);
    let gpu = &fixture.expected().gpus[0];
    let shared = |id: &str| {
        // The memory given: no NVML here to read the GPU's.
        let allocation = format!(
            r#"{{"gpu":[{{"minor":{},"id":"{}","resources":{{"koordinator.sh/gpu-core":"50","koordinator.sh/gpu-memory":"8Gi","koordinator.sh/gpu-memory-ratio":"50"}}}}]}}"#,
            gpu.minor, gpu.uuid
        );
        let mut pod = allocated_pod(&allocation);
        (pod.id, pod.uid) = (id.to_string(), format!("uid-{id}"));
        pod.labels
            .insert(GPU_ISOLATION_PROVIDER.to_string(), HAMI_CORE.to_string());
        pod
    };

    let adjust = plugin.adjustment(&shared("first"), &ctr()).unwrap();
    let bound: Vec<_> = adjust
        .mounts
        .iter()
        .map(|m| (m.source.as_str(), m.destination.as_str()))
        .collect();
    assert!(
        bound.contains(&(lock.to_str().unwrap(), "/tmp/vgpulock")),
        "{bound:?}"
    );
    let meta = std::fs::symlink_metadata(&lock).unwrap();
    assert!(meta.is_dir());
    assert_eq!(std::os::unix::fs::MetadataExt::mode(&meta) & 0o7777, 0o1777);

    // Made again by another user: the next pod is refused, naming the key,
    // and claims nothing.
    std::fs::remove_dir(&lock).unwrap();
    std::fs::create_dir(&lock).unwrap();
    std::os::unix::fs::chown(&lock, Some(65534), Some(65534)).unwrap();
    let e = plugin.adjustment(&shared("second"), &ctr()).unwrap_err();
    let text = nri::ErrorChain(&e).to_string();
    assert!(text.contains("hami.host_lock_dir"), "{text}");
    assert!(text.contains("owned by uid 65534, not root"), "{text}");
    let entry = format!(
        "{}: gpu[0]: a shared GPU's",
        crate::allocation::DEVICE_ALLOCATED
    );
    assert!(text.contains(&entry), "{text}");
    assert!(plugin.wait_for_releases(LIMIT));
    assert!(!plugin.devices().ledger().holds("second").unwrap());
}
