//! VF restore when a pod is released: the same code as the hook's poststop, for
//! VFs whose poststop never ran (runtime crash, hook killed, netns already gone).
//! Detach is idempotent, so VFs the hook already restored cost one file lookup.

use std::path::PathBuf;

use crate::ledger::{DeviceId, PodRecord, Teardown};
use crate::netdev::{self, NetnsRoots, SavedStore, SysNetEnv, VfOps};

pub struct VfTeardown {
    store: SavedStore,
}

impl VfTeardown {
    pub fn new(state_dir: PathBuf) -> VfTeardown {
        VfTeardown {
            store: SavedStore::new(&state_dir),
        }
    }

    fn detach(&self, pod: &PodRecord) -> Result<(), String> {
        let vfs: Vec<_> = pod
            .claims
            .iter()
            .filter_map(|c| match c.device {
                DeviceId::Vf(addr) => Some(addr),
                _ => None,
            })
            .collect();
        if vfs.is_empty() {
            return Ok(());
        }
        let mut env = SysNetEnv::new(NetnsRoots::default()).map_err(|e| e.to_string())?;
        let mut ops = VfOps {
            env: &mut env,
            store: &self.store,
            checkpoint: &|_| {},
        };
        let errors: Vec<String> = vfs
            .into_iter()
            .filter_map(|vf| netdev::detach_vf(&mut ops, vf, None).err())
            .map(|e| netdev::chain(&e))
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }
}

impl Teardown for VfTeardown {
    fn teardown(&self, pod: &PodRecord) -> Result<(), String> {
        // setns is per thread: detach enters pod namespaces, so it gets a thread
        // of its own and the caller's namespace never changes.
        std::thread::scope(|s| {
            s.spawn(|| self.detach(pod))
                .join()
                .unwrap_or_else(|_| Err("vf teardown thread panicked".to_string()))
        })
    }
}
