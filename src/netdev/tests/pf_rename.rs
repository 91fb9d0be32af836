//! A restore finds the PF attach configured by its ifindex, not by a name
//! another PF may hold by then.

use super::rig::*;
use crate::netdev::fake::HOST;

/// The PFs' names swapped after the attach: the VF's own PF gets its
/// settings back, and the PF now named as the record says keeps its VF's.
#[test]
fn a_pf_renamed_since_the_attach_is_restored_by_its_ifindex() {
    let mut m = model();
    let other = m.add_link(HOST, "ens2f0", "0c:42:a1:00:00:02", true);
    let mut tenant = vf_state();
    tenant.vlan.vlan = 300;
    m.vfs.insert((other, 3), tenant.clone());
    let mut rig = Rig::new(m);
    rig.attach(&[action()]).unwrap();
    {
        let mut m = rig.m();
        for l in m.links.iter_mut().filter(|l| l.ns == HOST) {
            match l.link.name.as_str() {
                "ens1f0" => l.link.name = "ens2f0".into(),
                "ens2f0" => l.link.name = "ens1f0".into(),
                _ => {}
            }
        }
    }
    assert_eq!(rig.detach("ctr1").unwrap(), 1);
    let m = rig.m();
    assert_eq!(m.vfs[&(PF, 3)], vf_state(), "its own pf restored");
    assert_eq!(m.vfs[&(other, 3)], tenant, "the other pf's vf untouched");
}
