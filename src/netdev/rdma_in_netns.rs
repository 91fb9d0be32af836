//! An RDMA netlink connection that keeps its thread in the connection's
//! network namespace for as long as it lives.
//!
//! A socket alone is not enough to move a device out of a pod. The kernel
//! finds the device by index in the socket's namespace (`nldev_set_doit`:
//! `ib_device_get_by_index(sock_net(skb->sk), ...)`), but moves it only for a
//! caller in the device's namespace: `ib_device_set_netns_put` hands the
//! calling thread's (`current->nsproxy->net_ns`) to `rdma_dev_change_netns`,
//! which answers ENODEV when the device lives elsewhere. So returning a
//! device from a pod needs the thread in the pod while it asks, as rdma-cni
//! does inside `containerNs.Do`; entering only to open the socket left the
//! thread on the host and every return refused.

use super::netns::{Netns, NetnsGuard};
use super::nl::NlError;
use super::rdma::{NetnsMode, RdmaNl};
use super::Cause;

/// `conn`, opened in a namespace that the thread stays in until this drops.
pub struct InNetns<C> {
    // Dropped first: the socket is closed in its own namespace, then the
    // thread goes back.
    conn: C,
    _thread: NetnsGuard,
}

impl<C> InNetns<C> {
    /// Enters `ns` and opens the connection there; on failure the thread is
    /// back where it was.
    pub fn open<E>(ns: &Netns, open: impl FnOnce() -> Result<C, E>) -> Result<Self, Cause>
    where
        Cause: From<E>,
    {
        let thread = ns.enter()?;
        Ok(InNetns {
            conn: open()?,
            _thread: thread,
        })
    }
}

impl<C: RdmaNl> RdmaNl for InNetns<C> {
    fn devices(&mut self) -> Result<Vec<(u32, String)>, NlError> {
        self.conn.devices()
    }

    fn set_netns(&mut self, index: u32, netns: &Netns) -> Result<(), NlError> {
        self.conn.set_netns(index, netns)
    }

    fn rename(&mut self, index: u32, name: &str) -> Result<(), NlError> {
        self.conn.rename(index, name)
    }

    fn netns_mode(&mut self) -> Result<NetnsMode, NlError> {
        self.conn.netns_mode()
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use nix::sched::{setns, unshare, CloneFlags};

    use super::*;
    use crate::netdev::NetnsId;

    /// Records the calling thread's namespace at each request.
    struct Probe(Rc<RefCell<Vec<NetnsId>>>);

    impl Probe {
        fn here(&self) {
            self.0.borrow_mut().push(Netns::current().unwrap().id());
        }
    }

    impl RdmaNl for Probe {
        fn devices(&mut self) -> Result<Vec<(u32, String)>, NlError> {
            self.here();
            Ok(vec![(3, "mlx5_3".to_string())])
        }
        fn set_netns(&mut self, _: u32, _: &Netns) -> Result<(), NlError> {
            self.here();
            Ok(())
        }
        fn rename(&mut self, _: u32, _: &str) -> Result<(), NlError> {
            self.here();
            Ok(())
        }
        fn netns_mode(&mut self) -> Result<NetnsMode, NlError> {
            self.here();
            Ok(NetnsMode::Exclusive)
        }
    }

    /// Each request, the move included, is made from inside the namespace
    /// the connection was opened in, in a real namespace of the test's own;
    /// the thread is back home once it drops, and when the open fails.
    #[test]
    fn requests_are_made_from_inside_the_connections_namespace() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test needs root: it makes a network namespace"
        );
        std::thread::spawn(|| {
            let home = Netns::current().unwrap();
            unshare(CloneFlags::CLONE_NEWNET).expect("unshare netns");
            let pod = Netns::current().unwrap();
            setns(home.fd(), CloneFlags::CLONE_NEWNET).expect("back home");
            assert_ne!(pod.id(), home.id());

            let seen = Rc::new(RefCell::new(Vec::new()));
            let mut conn = InNetns::open(&pod, || Ok::<_, NlError>(Probe(seen.clone()))).unwrap();
            assert_eq!(Netns::current().unwrap().id(), pod.id());
            conn.netns_mode().unwrap();
            let index = conn.dev_index("mlx5_3").unwrap().unwrap();
            conn.rename(index, "mlx5_3").unwrap();
            conn.set_netns(index, &home).unwrap();
            drop(conn);
            assert_eq!(*seen.borrow(), vec![pod.id(); 4]);
            assert_eq!(Netns::current().unwrap().id(), home.id());

            let failed = InNetns::<Probe>::open(&pod, || {
                Err(NlError::Malformed {
                    op: "open",
                    reason: "refused".into(),
                })
            });
            assert!(failed.is_err());
            assert_eq!(Netns::current().unwrap().id(), home.id());
        })
        .join()
        .expect("test thread");
    }
}
