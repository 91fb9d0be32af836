//! Several teardowns as one: GPU cleanup and VF restore for the same pod.

use std::sync::Arc;

use super::{PodRecord, Teardown, Unclean};

/// A shared teardown (kept by its owner for other calls too) is a teardown.
impl<T: Teardown + ?Sized> Teardown for Arc<T> {
    fn teardown(&self, pod: &PodRecord) -> Result<(), Unclean> {
        (**self).teardown(pod)
    }

    fn kept(&self, pod: &PodRecord) {
        (**self).kept(pod);
    }
}

/// Runs every teardown, in order, even after one fails, so each device kind gets its
/// cleanup; fails with all the reasons, `; `-separated, and the devices of each.
pub struct Teardowns(pub Vec<Box<dyn Teardown + Send + Sync>>);

impl Teardown for Teardowns {
    fn teardown(&self, pod: &PodRecord) -> Result<(), Unclean> {
        self.0
            .iter()
            .filter_map(|t| t.teardown(pod).err())
            .reduce(Unclean::and)
            .map_or(Ok(()), Err)
    }

    fn kept(&self, pod: &PodRecord) {
        self.0.iter().for_each(|t| t.kept(pod));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{NoTeardown, PodRef};

    struct Fails(&'static str);

    impl Teardown for Fails {
        fn teardown(&self, _pod: &PodRecord) -> Result<(), Unclean> {
            Err(Unclean::of(
                [crate::ledger::DeviceId::Gpu(self.0.to_string())],
                self.0,
            ))
        }
    }

    #[test]
    fn all_run_and_all_reasons_come_back() {
        let pod = PodRecord {
            pod: PodRef::default(),
            claims: Vec::new(),
            claimed_unix: 0,
            containers: Default::default(),
            network_owner: None,
            admitted: 0,
        };
        let ok = Teardowns(vec![Box::new(NoTeardown), Box::new(NoTeardown)]);
        assert_eq!(ok.teardown(&pod), Ok(()));
        let bad = Teardowns(vec![
            Box::new(Fails("gpu busy")),
            Box::new(NoTeardown),
            Box::new(Fails("vf stuck")),
        ]);
        let unclean = bad.teardown(&pod).unwrap_err();
        assert_eq!(unclean.reason, "gpu busy; vf stuck");
        let named: Vec<String> = unclean
            .devices
            .unwrap()
            .iter()
            .map(|d| d.to_string())
            .collect();
        assert_eq!(named, ["gpu gpu busy", "gpu vf stuck"]);
    }
}
