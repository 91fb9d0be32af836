use std::collections::BTreeMap;

use super::*;
use crate::ledger::{ContainerRecord, PodRef};

fn pod(id: &str, containers: &[&str]) -> PodRecord {
    let record = |name: &&str| ContainerRecord {
        name: name.to_string(),
        devices: vec!["/dev/nvidia0".to_string()],
        applied_unix: 1,
        init: None,
        cgroups: Vec::new(),
        resolved: Some("{\"line\":\"with a\\nnewline\"}".to_string()),
        resolved_sha256: None,
        hooks_only: false,
    };
    PodRecord {
        pod: PodRef {
            sandbox_id: id.to_string(),
            ..PodRef::default()
        },
        claims: Vec::new(),
        claimed_unix: 1,
        containers: containers
            .iter()
            .map(|c| (c.to_string(), record(c)))
            .collect::<BTreeMap<_, _>>(),
        network_owner: None,
    }
}

fn state(generation: u64, pods: &[PodRecord]) -> LedgerState {
    LedgerState {
        generation,
        pods: pods
            .iter()
            .map(|p| (p.pod.sandbox_id.clone(), p.clone()))
            .collect(),
        ..LedgerState::default()
    }
}

/// The line that sets (or, absent from `from`, removes) `sandbox`.
fn line(from: &LedgerState, sandbox: &str) -> Vec<u8> {
    let mut buf = Vec::new();
    encode(&mut buf, from, sandbox).unwrap();
    buf
}

#[test]
fn a_line_is_one_line_whatever_its_strings_hold() {
    let text = line(&state(3, &[pod("s", &["a", "b"])]), "s");
    assert_eq!(text.iter().filter(|&&b| b == b'\n').count(), 1);
    assert!(
        text.starts_with(b"{\"g\":3,"),
        "{}",
        String::from_utf8_lossy(&text)
    );
}

#[test]
fn replay_applies_the_lines_of_its_generation_in_order() {
    let later = state(5, &[pod("s", &["a", "b"]), pod("t", &["c"])]);
    let gone = state(5, &[pod("t", &["c"])]);
    let older = state(4, &[pod("s", &["stale"])]);
    let cases: Vec<(&str, Vec<u8>, LedgerState)> = vec![
        ("nothing", Vec::new(), state(5, &[pod("s", &["a"])])),
        (
            "a set",
            line(&later, "s"),
            state(5, &[pod("s", &["a", "b"])]),
        ),
        (
            "a new pod",
            line(&later, "t"),
            state(5, &[pod("s", &["a"]), pod("t", &["c"])]),
        ),
        (
            "the last line of a pod wins",
            [line(&later, "s"), line(&gone, "s")].concat(),
            state(5, &[]),
        ),
        ("a removal", line(&gone, "s"), state(5, &[])),
        (
            "a line of another generation is skipped",
            [line(&older, "s"), b"\n".to_vec()].concat(),
            state(5, &[pod("s", &["a"])]),
        ),
        (
            "a tail without its newline is no part of it",
            [line(&later, "t"), line(&gone, "s")[..20].to_vec()].concat(),
            state(5, &[pod("s", &["a"]), pod("t", &["c"])]),
        ),
    ];
    for (what, text, want) in cases {
        let mut got = state(5, &[pod("s", &["a"])]);
        let complete = replay(&mut got, &text).unwrap();
        assert_eq!(got, want, "{what}");
        let cut = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        assert_eq!(complete, cut, "{what}");
        // Replayed again on its own result, a journal changes nothing: a
        // document that folded it in ignores it the same way.
        replay(&mut got, &text).unwrap();
        assert_eq!(got, want, "{what}, twice");
    }
}

#[test]
fn a_complete_line_that_does_not_parse_is_corrupt() {
    let good = line(&state(1, &[pod("s", &["a"])]), "s");
    for bad in [&b"{torn\n"[..], b"{\"g\":1}\n", b"[]\n", b"\xff\n"] {
        let text = [good.clone(), bad.to_vec()].concat();
        let err = replay(&mut state(1, &[]), &text).unwrap_err();
        assert!(err.contains(&format!("byte {}", good.len())), "{err}");
    }
}
