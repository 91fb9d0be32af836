//! Several teardowns as one: GPU cleanup and VF restore for the same pod.

use std::sync::Arc;

use super::{PodRecord, Teardown};

/// A shared teardown (kept by its owner for other calls too) is a teardown.
impl<T: Teardown + ?Sized> Teardown for Arc<T> {
    fn teardown(&self, pod: &PodRecord) -> Result<(), String> {
        (**self).teardown(pod)
    }
}

/// Runs every teardown, in order, even after one fails, so each device kind gets its
/// cleanup; fails with all the reasons, `; `-separated.
pub struct Teardowns(pub Vec<Box<dyn Teardown + Send + Sync>>);

impl Teardown for Teardowns {
    fn teardown(&self, pod: &PodRecord) -> Result<(), String> {
        let reasons: Vec<String> = self
            .0
            .iter()
            .filter_map(|t| t.teardown(pod).err())
            .collect();
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(reasons.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{NoTeardown, PodRef};

    struct Fails(&'static str);

    impl Teardown for Fails {
        fn teardown(&self, _pod: &PodRecord) -> Result<(), String> {
            Err(self.0.to_string())
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
        };
        let ok = Teardowns(vec![Box::new(NoTeardown), Box::new(NoTeardown)]);
        assert_eq!(ok.teardown(&pod), Ok(()));
        let bad = Teardowns(vec![
            Box::new(Fails("gpu busy")),
            Box::new(NoTeardown),
            Box::new(Fails("vf stuck")),
        ]);
        assert_eq!(bad.teardown(&pod), Err("gpu busy; vf stuck".to_string()));
    }
}
