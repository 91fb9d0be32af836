//! A VF whose pod namespace is gone and whose return to the host the
//! kernel's namespace cleanup has yet to make: waited for, within one bound.

use super::rig::*;

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

/// A VF that is neither in its gone netns nor on the host (moved elsewhere
/// by a container with NET_ADMIN) is looked for no longer than the bound,
/// then counts as lost, its record kept; a second VF of the same restore
/// shares the bound rather than waiting again.
#[test]
fn a_vf_found_nowhere_is_waited_for_within_one_bound() {
    let mut rig = Rig::new(model());
    rig.attach(&[action()]).unwrap();
    {
        let mut m = rig.m();
        m.namespaces.insert(NESTED);
        let vf = m
            .links
            .iter_mut()
            .find(|l| l.link.index == VF_NETDEV)
            .unwrap();
        vf.ns = NESTED;
    }
    rig.m().destroy_ns(POD);
    let err = rig.detach("ctr1").unwrap_err();
    says(&err, "not found in its pod or on the host");
    assert_eq!(rig.records(), 1);
    let bound = crate::netdev::restore::HOME_WAIT;
    assert_eq!(rig.m().paused, bound);
    rig.detach("ctr1").unwrap_err();
    assert_eq!(rig.m().paused, bound, "the bound is shared");
}
