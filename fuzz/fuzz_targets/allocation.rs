//! The `device-allocated` parser on arbitrary bytes: it must return, never panic,
//! and every error must print as one bounded line naming the annotation.
#![no_main]

use devgate::allocation::{parse_allocation, DEVICE_ALLOCATED, MAX_ENTRIES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match parse_allocation(data) {
        Ok(a) => {
            let vfs: usize = a.rdma.iter().map(|e| e.vfs.len()).sum();
            assert!(a.gpus.len() + a.rdma.len() + a.fpga.len() + vfs <= MAX_ENTRIES);
            assert!(a
                .gpus
                .iter()
                .all(|g| g.resources.core_percent.unwrap_or(0) <= 100));
            assert!(a.rdma.iter().all(|r| (1..=100).contains(&r.share_percent)));
            // The typed value must survive a serde round trip.
            let json = serde_json::to_string(&a).unwrap();
            let back: devgate::allocation::Allocation = serde_json::from_str(&json).unwrap();
            assert_eq!(back, a);
        }
        Err(e) => {
            let text = e.to_string();
            assert!(text.starts_with(DEVICE_ALLOCATED), "{text}");
            assert!(!text.contains(['\n', '\r', '\0']), "{text:?}");
            assert!(text.len() < 1024, "{}", text.len());
        }
    }
});
