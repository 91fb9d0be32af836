//! GPU teardown of a recreated sandbox against real processes and nested
//! cgroups (see `real_proc`, whose stand-in GPU and helpers it shares; needs root).

use super::real_proc::{require_root, unclaimed, Holder, TestCgroup, SERIAL};
use crate::ledger::tests::record;
use crate::ledger::{Claim, DeviceId, PodRef, Share};

/// kubelet recreated a pod's sandbox: the old and the new one share the pod's
/// cgroup and a GPU. Releasing the old one ends the process in its container's
/// cgroup and leaves the new container's, both read from the real `/proc`.
#[test]
fn releasing_an_old_sandbox_leaves_the_recreated_sandboxs_process() {
    const OLD: &str = "1111111111111111111111111111111111111111111111111111111111111111";
    const NEW: &str = "2222222222222222222222222222222222222222222222222222222222222222";
    require_root();
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let top = TestCgroup::create();
    let pod_cgroup = top.child("podrecreated");
    let (old_ctr, new_ctr) = (pod_cgroup.child(OLD), pod_cgroup.child(NEW));
    let s = unclaimed();
    let half = Share::Shared {
        core: 50,
        memory_ratio: 50,
    };
    let gpu = Claim {
        device: DeviceId::Gpu(s.uuid.clone()),
        share: half,
        pf: None,
    };
    let pod = |sandbox_id: &str| PodRef {
        sandbox_id: sandbox_id.into(),
        namespace: "ns".into(),
        name: "recreated".into(),
        uid: "recreated".into(),
    };
    let (old, new) = (pod("sb-old"), pod("sb-new"));
    for (sandbox, ctr) in [(&old, OLD), (&new, NEW)] {
        s.ledger.claim(sandbox, std::slice::from_ref(&gpu)).unwrap();
        s.ledger
            .record_container(&sandbox.sandbox_id, ctr, record("main"))
            .unwrap();
    }
    // As NRI named the old sandbox's cgroup parent: the pod's cgroup.
    s.teardown
        .set_pod_cgroups("sb-old", &[pod_cgroup.path.as_str()]);
    let mut leftover = Holder::spawn(false);
    let mut live = Holder::spawn(false);
    old_ctr.add(leftover.pid());
    new_ctr.add(live.pid());
    leftover.wait_open();
    live.wait_open();

    let out = s.ledger.release_pod("sb-old", &s.teardown).unwrap();
    assert_eq!(out.failed, vec![]);
    assert_eq!(leftover.signal_that_ended_it(), Some(libc::SIGTERM));
    assert_eq!(
        live.signal_that_ended_it(),
        None,
        "the new sandbox's process lives"
    );
    assert!(s.nvml.calls().is_empty(), "a gpu still held is not reset");
    let state = s.ledger.snapshot().unwrap();
    assert_eq!(state.pods.keys().collect::<Vec<_>>(), ["sb-new"]);
    drop((live, leftover, old_ctr, new_ctr, pod_cgroup));
}
