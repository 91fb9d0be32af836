//! A VF whose pod namespace is gone and whose return to the host the
//! kernel's namespace cleanup has yet to make: waited for, within one bound.

use super::rig::*;
use crate::netdev::fake::HOST;

/// A namespace a container with NET_ADMIN made.
const NESTED: u64 = 3;

/// A VF whose namespace can no longer be found but whose cleanup has not
/// run yet (podman's poststop right after its network teardown): looked for
/// on the host until the kernel brings it home, then restored whole.
#[test]
fn a_vf_of_a_dying_netns_is_waited_for_and_restored() {
    let mut rig = Rig::new(model());
    let before = host_world(&rig.m());
    rig.attach(&[action()]).unwrap();
    rig.m().start_dying(POD, 3);
    assert_eq!(rig.detach("ctr1").unwrap(), 1);
    assert_eq!(host_world(&rig.m()), before);
    assert_eq!(rig.records(), 0);
    assert_eq!(rig.m().paused, std::time::Duration::from_millis(60));
}

/// VFs that are neither in their gone netns nor on the host (moved
/// elsewhere by a container with NET_ADMIN) are looked for no longer than
/// one bound for the whole restore, then count as lost, their records kept
/// and marked. A later try of such a record looks for nothing more: the wait
/// is for the kernel's cleanup just after the namespace went, long past.
#[test]
fn vfs_found_nowhere_are_waited_for_within_one_bound() {
    let mut m = model();
    m.add_link(HOST, "ens1f0v4", "0e:00:00:00:00:04", true);
    m.links.last_mut().unwrap().link.parent = Some("0000:3b:02.4".to_string());
    let mut state = vf_state();
    state.vf = 4;
    m.vfs.insert((PF, 4), state);
    let mut rig = Rig::new(m);
    let mut second = action();
    second.vf_bus_id = "0000:3b:02.4".parse().unwrap();
    second.host_netdev = "ens1f0v4".to_string();
    second.container_ifname = "net2".to_string();
    second.vf_index = 4;
    second.rdma_device = None;
    second.move_rdma = false;
    rig.attach(&[action(), second]).unwrap();
    {
        let mut m = rig.m();
        m.namespaces.insert(NESTED);
        for l in m.links.iter_mut().filter(|l| l.ns == POD && l.physical) {
            l.ns = NESTED;
        }
    }
    rig.m().destroy_ns(POD);
    let err = rig.detach("ctr1").unwrap_err();
    says(&err, "not found in its pod or on the host");
    assert_eq!(rig.records(), 2);
    let bound = crate::netdev::restore::HOME_WAIT;
    assert_eq!(rig.m().paused, bound, "one bound for both");
    rig.m().paused = std::time::Duration::ZERO;
    rig.detach("ctr1").unwrap_err();
    assert_eq!(rig.m().paused, std::time::Duration::ZERO, "no wait again");
}
