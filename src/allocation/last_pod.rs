//! The recent pods' parsed devices (`crate::recent`). A pod's sandbox start and
//! its containers come with the same annotations, and for each but the first,
//! parsing the allocation is the largest part of what its creation costs. An
//! entry is keyed by the exact texts [`parse_pod`] reads, so a hit returns what
//! parsing would.

use std::sync::Arc;

use super::{parse_pod, AllocationError, Metadata, PodDevices};
use super::{CONTAINERS, DEVICE_ALLOCATED, GPU_ISOLATION_PROVIDER, VF_SETTINGS};
use crate::recent::Recent;

/// The inputs of [`parse_pod`]: three annotations and one label.
type Key<T> = [Option<T>; 4];

#[derive(Debug, Default)]
pub struct LastPod {
    entries: Recent<Key<String>, PodDevices>,
}

impl LastPod {
    /// [`parse_pod`], answered from a recent pod when its texts are the same.
    /// Only pods with an allocation are kept; errors are not.
    pub fn parse(
        &self,
        annotations: &impl Metadata,
        labels: &impl Metadata,
    ) -> Result<Arc<PodDevices>, AllocationError> {
        let key: Key<&str> = [
            annotations.get_value(DEVICE_ALLOCATED),
            annotations.get_value(CONTAINERS),
            labels.get_value(GPU_ISOLATION_PROVIDER),
            annotations.get_value(VF_SETTINGS),
        ];
        let same = |kept: &Key<String>| kept.iter().map(Option::as_deref).eq(key);
        if let Some(devices) = self.entries.find(same) {
            return Ok(devices);
        }
        let devices = Arc::new(parse_pod(annotations, labels)?);
        if key[0].is_some() {
            let owned = key.map(|k| k.map(str::to_owned));
            self.entries
                .put(owned, Arc::clone(&devices), |new, old| new == old);
        }
        Ok(devices)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const ONE_GPU: &str = r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory-ratio":"100"}}]}"#;
    const TWO_GPUS: &str = r#"{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory-ratio":"100"}},{"minor":1,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory-ratio":"100"}}]}"#;

    #[test]
    fn the_same_texts_give_the_same_parse_and_any_change_parses_again() {
        let last = LastPod::default();
        let none = map(&[]);
        let a = last
            .parse(&map(&[(DEVICE_ALLOCATED, ONE_GPU)]), &none)
            .unwrap();
        let again = last
            .parse(&map(&[(DEVICE_ALLOCATED, ONE_GPU)]), &none)
            .unwrap();
        assert!(Arc::ptr_eq(&a, &again));
        assert_eq!(
            *a,
            parse_pod(&map(&[(DEVICE_ALLOCATED, ONE_GPU)]), &none).unwrap()
        );

        let b = last
            .parse(&map(&[(DEVICE_ALLOCATED, TWO_GPUS)]), &none)
            .unwrap();
        assert_eq!(b.allocation.gpus.len(), 2);
        let only_main = map(&[(DEVICE_ALLOCATED, TWO_GPUS), (CONTAINERS, "main")]);
        let c = last.parse(&only_main, &none).unwrap();
        assert!(!c.containers.selects("sidecar"));
        let hami = map(&[(GPU_ISOLATION_PROVIDER, super::super::HAMI_CORE)]);
        assert!(last.parse(&only_main, &hami).unwrap().hami_core);
        assert!(!last.parse(&only_main, &none).unwrap().hami_core);
        let mtu = map(&[
            (DEVICE_ALLOCATED, TWO_GPUS),
            (CONTAINERS, "main"),
            (VF_SETTINGS, r#"{"mtu":9000}"#),
        ]);
        let d = last.parse(&mtu, &none).unwrap();
        assert_eq!(d.vf_settings.as_ref().and_then(|s| s.mtu), Some(9000));
        assert_eq!(last.parse(&only_main, &none).unwrap().vf_settings, None);
    }

    #[test]
    fn errors_and_pods_without_an_allocation_are_not_kept() {
        let last = LastPod::default();
        let none = map(&[]);
        let bad = map(&[(DEVICE_ALLOCATED, "{not json")]);
        assert!(last.parse(&bad, &none).is_err());
        assert!(last.parse(&bad, &none).is_err());
        assert!(last.parse(&none, &none).unwrap().allocation.is_empty());
        assert!(last.entries.is_empty());
    }
}
