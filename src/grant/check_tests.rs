use super::*;
use crate::allocation::parse_allocation;

const G: u64 = 1 << 30;

fn req(core: u64, ratio: u64, bytes: u64, shared: u64, rdma: u64) -> DeviceRequest {
    DeviceRequest {
        gpu_core: core,
        gpu_memory_ratio: ratio,
        gpu_memory_bytes: bytes,
        gpu_shared: shared,
        rdma,
        rdma_strategy: RdmaStrategy::Default,
    }
}

fn gpu(minor: u32, core: u32, ratio: u32) -> String {
    format!(
        r#"{{"minor":{minor},"resources":{{"koordinator.sh/gpu-core":"{core}","koordinator.sh/gpu-memory-ratio":"{ratio}"}}}}"#
    )
}

fn gpu_bytes(minor: u32, core: u32, mem: &str) -> String {
    format!(
        r#"{{"minor":{minor},"resources":{{"koordinator.sh/gpu-core":"{core}","koordinator.sh/gpu-memory-ratio":"20","koordinator.sh/gpu-memory":"{mem}"}}}}"#
    )
}

fn vf(minor: u32, share: u32, vfs: usize) -> String {
    let vfs: Vec<String> = (0..vfs)
        .map(|i| format!(r#"{{"busID":"0000:2{minor}:00.{}"}}"#, i + 1))
        .collect();
    format!(
        r#"{{"minor":{minor},"id":"0000:1{minor}:00.0","resources":{{"koordinator.sh/rdma":"{share}"}},"extension":{{"vfs":[{}]}}}}"#,
        vfs.join(",")
    )
}

fn alloc(gpus: &[String], rdma: &[String]) -> Allocation {
    let text = format!(
        r#"{{"gpu":[{}],"rdma":[{}]}}"#,
        gpus.join(","),
        rdma.join(",")
    );
    parse_allocation(text.as_bytes()).expect("test allocation")
}

#[test]
fn allocations_against_requests() {
    let whole = |m| gpu(m, 100, 100);
    let bare = r#"{"minor":0}"#.to_string();
    // (what, request, allocation, the error's text or None when granted)
    let cases: Vec<(&str, DeviceRequest, Allocation, Option<&str>)> = vec![
        ("no request, no devices", req(0, 0, 0, 0, 0), alloc(&[], &[]), None),
        (
            "forged gpu on a pod that requests nothing",
            req(0, 0, 0, 0, 0),
            alloc(&[whole(0)], &[]),
            Some("request no gpu, but 1 gpus are allocated"),
        ),
        (
            "forged vf on a pod that requests nothing",
            req(0, 0, 0, 0, 0),
            alloc(&[], &[vf(0, 1, 1)]),
            Some("request no rdma device"),
        ),
        ("one whole gpu", req(100, 100, 0, 0, 0), alloc(&[whole(3)], &[]), None),
        (
            "entry without resources counts as whole",
            req(100, 100, 0, 0, 0),
            alloc(std::slice::from_ref(&bare), &[]),
            None,
        ),
        (
            "two gpus for a request of one",
            req(100, 100, 0, 0, 0),
            alloc(&[whole(0), whole(1)], &[]),
            Some("2 gpus are allocated, but the pod's requests imply 1"),
        ),
        (
            "one gpu for a request of two",
            req(200, 200, 0, 0, 0),
            alloc(&[whole(0)], &[]),
            Some("1 gpus are allocated, but the pod's requests imply 2"),
        ),
        ("half a gpu", req(50, 50, 0, 0, 0), alloc(&[gpu(0, 50, 50)], &[]), None),
        (
            "whole gpu for a half request",
            req(50, 50, 0, 0, 0),
            alloc(&[whole(0)], &[]),
            Some("gpu core of 100 is allocated, but the pod's containers request 50"),
        ),
        (
            "bare entry for a half request",
            req(50, 50, 0, 0, 0),
            alloc(&[bare], &[]),
            Some("gpu core of 100"),
        ),
        (
            "more memory ratio than requested",
            req(50, 50, 0, 0, 0),
            alloc(&[gpu(0, 50, 60)], &[]),
            Some("gpu memory ratio of 60 is allocated"),
        ),
        (
            "shared over two gpus",
            req(100, 100, 0, 2, 0),
            alloc(&[gpu(0, 50, 50), gpu(1, 50, 50)], &[]),
            None,
        ),
        (
            "memory in bytes within the request",
            req(50, 0, 16 * G, 0, 0),
            alloc(&[gpu_bytes(0, 50, "16Gi")], &[]),
            None,
        ),
        (
            "memory in bytes over the request",
            req(50, 0, 16 * G, 0, 0),
            alloc(&[gpu_bytes(0, 50, "32Gi")], &[]),
            Some("gpu memory bytes of 34359738368 is allocated"),
        ),
        (
            "memory in bytes, allocation without bytes",
            req(50, 0, 16 * G, 0, 0),
            alloc(&[gpu(0, 50, 20)], &[]),
            Some("gpu[0] has no gpu-memory"),
        ),
        (
            "memory in bytes, entry without a ratio (it would claim the gpu whole)",
            req(0, 0, G, 0, 0),
            alloc(&[r#"{"minor":0,"resources":{"koordinator.sh/gpu-memory":"1Gi"}}"#.into()], &[]),
            Some("gpu[0] has no gpu-memory-ratio"),
        ),
        (
            "memory only, for a pod that requests memory only",
            req(0, 50, 0, 0, 0),
            alloc(&[r#"{"minor":0,"resources":{"koordinator.sh/gpu-memory-ratio":"50"}}"#.into()], &[]),
            None,
        ),
        (
            "memory only, for a pod that requests gpu-core too (no sm limit would apply)",
            req(10, 50, 0, 0, 0),
            alloc(&[r#"{"minor":0,"resources":{"koordinator.sh/gpu-memory-ratio":"50"}}"#.into()], &[]),
            Some("gpu[0] has no gpu-core, but the pod requests gpu-core 10"),
        ),
        ("a vf", req(0, 0, 0, 0, 1), alloc(&[], &[vf(0, 1, 1)]), None),
        (
            "two vfs in one entry for a request of one",
            req(0, 0, 0, 0, 1),
            alloc(&[], &[vf(0, 1, 2)]),
            Some("rdma[0] names 2 vfs"),
        ),
        (
            "a whole pf for a vf request",
            req(0, 0, 0, 0, 1),
            alloc(&[], &[vf(0, 100, 0)]),
            Some("rdma[0] has a share of 100, but the pod's containers request 1"),
        ),
        (
            "two nics for one vf without gpus",
            req(0, 0, 0, 0, 1),
            alloc(&[], &[vf(0, 1, 1), vf(1, 1, 1)]),
            Some("2 rdma devices are allocated"),
        ),
        (
            "joint allocation: one vf per gpu",
            req(200, 200, 0, 0, 1),
            alloc(&[whole(0), whole(1)], &[vf(0, 1, 1), vf(1, 1, 1)]),
            None,
        ),
        (
            "two whole pfs",
            req(0, 0, 0, 0, 200),
            alloc(&[], &[vf(0, 100, 0), vf(1, 100, 0)]),
            None,
        ),
        (
            "three whole pfs for a request of two",
            req(0, 0, 0, 0, 200),
            alloc(&[], &[vf(0, 100, 0), vf(1, 100, 0), vf(2, 100, 0)]),
            Some("3 rdma devices are allocated, but the pod's request of koordinator.sh/rdma 200 allows 2"),
        ),
        (
            // Koordinator asks for N whole devices only for a multiple of 100
            // (`DefaultDeviceHandler.CalcDesiredRequestsAndCount`); 150 is one
            // device of share 150, which none fits: no allocation is right.
            "two whole pfs for a request of 150",
            req(0, 0, 0, 0, 150),
            alloc(&[], &[vf(0, 100, 0), vf(1, 100, 0)]),
            Some("koordinator.sh/rdma 150 allows 0"),
        ),
        (
            "one whole pf for a request of 150",
            req(0, 0, 0, 0, 150),
            alloc(&[], &[vf(0, 100, 0)]),
            Some("koordinator.sh/rdma 150 allows 0"),
        ),
        (
            "gpu only requested, rdma forged beside it",
            req(100, 100, 0, 0, 0),
            alloc(&[whole(0)], &[vf(0, 1, 1)]),
            Some("request no rdma device"),
        ),
    ];
    for (what, r, a, want) in cases {
        match (check(&r, &a), want) {
            (Ok(()), None) => {}
            (Err(e), Some(text)) => assert!(e.to_string().contains(text), "{what}: {e}"),
            (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
        }
    }
}

/// The pod's allocate hint decides how its `koordinator.sh/rdma` maps to
/// devices: every NIC (`ApplyForAll`), or `value` NICs (`RequestsAsCount`).
#[test]
fn rdma_allocate_hints_set_the_count() {
    let with = |strategy, rdma| DeviceRequest {
        rdma_strategy: strategy,
        ..req(0, 0, 0, 0, rdma)
    };
    let four = |share| {
        alloc(
            &[],
            &[
                vf(0, share, 1),
                vf(1, share, 1),
                vf(2, share, 1),
                vf(3, share, 1),
            ],
        )
    };
    assert!(
        check(&req(0, 0, 0, 0, 1), &four(1)).is_err(),
        "no hint: one device"
    );
    check(&with(RdmaStrategy::ApplyForAll, 1), &four(1)).expect("apply for all");
    let count = RdmaStrategy::RequestsAsCount {
        device_level: false,
    };
    check(&with(count, 4), &four(1)).expect("4 as a count");
    assert!(check(&with(count, 3), &four(1)).is_err(), "3 as a count");
    assert!(check(&with(count, 4), &four(100)).is_err(), "each gets 1");
    let whole = RdmaStrategy::RequestsAsCount { device_level: true };
    check(&with(whole, 4), &four(100)).expect("device level: whole devices");
    for (text, want) in [
        (None, RdmaStrategy::Default),
        (Some("not json"), RdmaStrategy::Default),
        (Some(r#"{"gpu":{}}"#), RdmaStrategy::Default),
        (
            Some(r#"{"rdma":{"allocateStrategy":"ApplyForAll"}}"#),
            RdmaStrategy::ApplyForAll,
        ),
        (
            Some(
                r#"{"rdma":{"allocateStrategy":"RequestsAsCount","exclusivePolicy":"DeviceLevel"}}"#,
            ),
            whole,
        ),
    ] {
        assert_eq!(RdmaStrategy::from_hint(text), want, "{text:?}");
    }
}

/// A pod asking for GPU memory only: Koordinator writes its entries without
/// `gpu-core`, and counts no core for it.
#[test]
fn memory_only_requests_grant_entries_without_core() {
    let mem_only = |res: &str| alloc(&[format!(r#"{{"minor":0,"resources":{{{res}}}}}"#)], &[]);
    let bytes =
        mem_only(r#""koordinator.sh/gpu-memory":"8Gi","koordinator.sh/gpu-memory-ratio":"10""#);
    check(&req(0, 0, 8 * G, 0, 0), &bytes).expect("gpu-memory only");
    let ratio = mem_only(r#""koordinator.sh/gpu-memory-ratio":"50""#);
    check(&req(0, 50, 0, 0, 0), &ratio).expect("gpu-memory-ratio only");
    // An explicit core the pod did not ask for is still too much.
    let with_core = alloc(&[gpu(0, 10, 50)], &[]);
    let e = check(&req(0, 50, 0, 0, 0), &with_core).unwrap_err();
    assert!(e.to_string().contains("core"), "{e}");
}

#[test]
fn gpu_count_from_requests() {
    for (r, want) in [
        (req(0, 0, 0, 0, 5), 0),
        (req(50, 50, 0, 0, 0), 1),
        (req(100, 100, 0, 0, 0), 1),
        (req(300, 300, 0, 0, 0), 3),
        (req(100, 250, 0, 0, 0), 3),
        (req(0, 0, G, 0, 0), 1),
        (req(100, 100, 0, 4, 0), 4),
    ] {
        assert_eq!(gpu_count(&r), want, "{r:?}");
    }
}

#[test]
fn describe_names_minors_and_nics() {
    let a = alloc(&[gpu(0, 100, 100), gpu(2, 100, 100)], &[vf(1, 1, 1)]);
    assert_eq!(describe(&a), "gpu minors [0,2] rdma [0000:11:00.0 +1 vf]");
    assert_eq!(describe(&Allocation::default()), "none");
}
