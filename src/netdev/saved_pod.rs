//! What the saved records say about a pod's VFs as a whole: whether its
//! network owner moved anything, holds anything away from the host, or left
//! its VFs part way.

use std::path::Path;

use super::{SavedError, SavedStore, SavedVf};
use crate::inventory::PciAddr;
use crate::ledger::PodRecord;

impl SavedStore {
    /// Whether no VF `pod` claims has a record: its network owner moved
    /// nothing (or has them all back on the host), since the hook saves a
    /// record before it touches a VF. Asked under the ledger lock by
    /// [`crate::ledger::Ledger::admit_or_take_over`].
    pub fn none_moved(&self, pod: &PodRecord) -> bool {
        self.none_away(pod, |_| false)
    }

    /// Whether a VF `pod` claims was moved and is away from the host below
    /// `host_root` as it was moved: a readable record of a finished attach
    /// no restore has begun on, and no netdev of it on the host. A VF a
    /// restore began on may be half undone (down, its VLAN gone), one whose
    /// attach was cut half done, and neither counts.
    pub fn vfs_away(&self, host_root: &Path, pod: &PodRecord) -> bool {
        pod.vfs()
            .any(|vf| self.moved_whole(vf) && !crate::inventory::has_netdev(host_root, vf))
    }

    /// Whether `vf` has a readable record of a finished attach no restore
    /// has begun on: wherever it is, it is as its attach left it.
    pub fn moved_whole(&self, vf: PciAddr) -> bool {
        matches!(self.load(vf), Ok(Some(r)) if !r.cut())
    }

    /// Whether `container`'s records among `vfs` (a pod's VFs) are left part
    /// way: one of them cut, or a VF of the pod on the host (`at_home`: its
    /// netdev there; or no record, since a record is saved before a move and
    /// dropped only after a full restore) beside one of them away (the pod's
    /// network split between the host and the pod: a restore or an attach
    /// cut between two VFs, or a VF's netdev made anew on the host); or,
    /// with `given_up` (the pod's network no longer `container`'s: its
    /// poststop gave it up and stopped before its restore began), one of
    /// them away at all, whole records of VFs no container of the pod may
    /// use. An unreadable record is no cut, and its VF is home when its
    /// netdev is.
    pub fn left_part_way(
        &self,
        container: &str,
        vfs: &[PciAddr],
        at_home: impl Fn(PciAddr) -> bool,
        given_up: bool,
    ) -> bool {
        let records: Vec<_> = vfs.iter().map(|vf| (*vf, self.load(*vf))).collect();
        let mine = || {
            records.iter().filter_map(|(vf, r)| match r {
                Ok(Some(r)) if r.container_id == container => Some((*vf, r)),
                _ => None,
            })
        };
        if mine().any(|(_, r)| r.cut()) {
            return true;
        }
        let home = |(vf, r): &(PciAddr, Result<Option<SavedVf>, SavedError>)| match r {
            Ok(None) => true,
            Ok(Some(_)) | Err(_) => at_home(*vf),
        };
        mine().any(|(vf, _)| !at_home(vf)) && (given_up || records.iter().any(home))
    }

    /// Whether every VF `pod` claims that has a record is on the host
    /// (`at_home`): a restore that failed after the netdev came home left
    /// the record, and the owner holds nothing in the pod. Stops at the
    /// first VF away, the usual answer while the owner runs.
    pub fn none_away(&self, pod: &PodRecord, at_home: impl Fn(PciAddr) -> bool) -> bool {
        !pod.vfs().any(|vf| self.has_record(vf) && !at_home(vf))
    }
}
