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
        admitted: 0,
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

/// A line of the first form, as releases before changes wrote it: the pod's
/// whole record as `from` holds it (or its removal).
fn line(from: &LedgerState, sandbox: &str) -> Vec<u8> {
    #[derive(serde::Serialize)]
    struct FirstForm<'a> {
        g: u64,
        sandbox: &'a str,
        pod: Option<&'a PodRecord>,
    }
    let mut buf = serde_json::to_vec(&FirstForm {
        g: from.generation,
        sandbox,
        pod: from.pods.get(sandbox),
    })
    .unwrap();
    buf.push(b'\n');
    buf
}

/// The change that sets `containers` of `sandbox`, and its owner, as `from` has them.
fn change(from: &LedgerState, sandbox: &str, containers: &[&str]) -> Vec<u8> {
    let mut buf = Vec::new();
    encode(
        &mut buf,
        from.generation,
        sandbox,
        &from.pods[sandbox],
        containers,
    )
    .unwrap();
    buf
}

/// Replays `text` on `start`: it must give `want`, take exactly the complete
/// lines, say whether it skipped another generation's (the cases that do say
/// so in `what`), and change nothing when replayed again on its own result (a
/// document that folded the journal in ignores it the same way).
fn assert_replays(what: &str, start: LedgerState, text: &[u8], want: &LedgerState) {
    let mut got = start;
    let replayed = replay(&mut got, text).unwrap();
    assert_eq!(got, *want, "{what}");
    let cut = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    assert_eq!(replayed.complete, cut, "{what}");
    assert_eq!(
        replayed.other_generations,
        what.contains("another generation"),
        "{what}"
    );
    replay(&mut got, text).unwrap();
    assert_eq!(got, *want, "{what}, twice");
}

fn owned(mut p: PodRecord, owner: &str) -> PodRecord {
    p.network_owner = Some(owner.to_string());
    p
}

fn counted(mut p: PodRecord, admitted: u32) -> PodRecord {
    p.admitted = admitted;
    p
}

#[test]
fn a_line_is_one_line_whatever_its_strings_hold() {
    let from = state(3, &[pod("s", &["a", "b"])]);
    let text = change(&from, "s", &["a", "b", "gone"]);
    assert_eq!(text.iter().filter(|&&b| b == b'\n').count(), 1);
    assert!(
        text.starts_with(
            b"{\"g\":18446744073709551615,\"gen\":3,\"sandbox\":\"s\",\"containers\":{\"a\":{"
        ),
        "{}",
        String::from_utf8_lossy(&text)
    );
    assert!(
        text.ends_with(b",\"gone\":null},\"owner\":null,\"admitted\":0}\n"),
        "{}",
        String::from_utf8_lossy(&text)
    );
    // A change carries the records it touched, not the pod's.
    assert!(change(&from, "s", &["a"]).len() < line(&from, "s").len() * 2 / 3);
}

/// A reader of the release before changes reads `g` and the whole record:
/// a change is a line of a generation no document has, which it skips,
/// rather than a line without a record, which it would take for the pod's
/// removal.
#[test]
fn a_reader_of_the_first_form_skips_a_change() {
    #[derive(serde::Deserialize)]
    struct FirstForm {
        g: u64,
        pod: Option<PodRecord>,
    }
    let text = change(&state(3, &[pod("s", &["a"])]), "s", &["a"]);
    let seen: FirstForm = serde_json::from_slice(&text).unwrap();
    assert_eq!((seen.g, seen.pod), (u64::MAX, None));
    let whole: FirstForm = serde_json::from_slice(&line(&state(3, &[pod("s", &[])]), "s")).unwrap();
    assert_eq!(whole.g, 3);
    // Nor does this release take a line of the first form at that generation.
    let mut at_max = state(u64::MAX, &[pod("s", &["a"])]);
    let forged = line(&state(u64::MAX, &[]), "s");
    assert!(replay(&mut at_max, &forged).unwrap().other_generations);
    assert_eq!(at_max.pods.len(), 1);
}

#[test]
fn changes_apply_in_order_to_their_pod_of_their_generation() {
    let ab = state(5, &[pod("s", &["a", "b"]), pod("t", &["c"])]);
    let none = state(5, &[pod("s", &[]), pod("t", &["c"])]);
    let b_owns = state(5, &[owned(pod("s", &["a", "b"]), "b")]);
    let older = state(4, &[pod("s", &["stale"])]);
    let cases: Vec<(&str, Vec<u8>, LedgerState)> = vec![
        (
            "a container added",
            change(&ab, "s", &["b"]),
            state(5, &[pod("s", &["a", "b"]), pod("t", &["c"])]),
        ),
        (
            "a container removed",
            change(&none, "s", &["a"]),
            state(5, &[pod("s", &[]), pod("t", &["c"])]),
        ),
        (
            "the owner set with its container",
            change(&b_owns, "s", &["b"]),
            state(5, &[owned(pod("s", &["a", "b"]), "b"), pod("t", &["c"])]),
        ),
        (
            "the count of containers ever recorded set with them",
            change(&state(5, &[counted(pod("s", &["a", "b"]), 3)]), "s", &["b"]),
            state(5, &[counted(pod("s", &["a", "b"]), 3), pod("t", &["c"])]),
        ),
        (
            "added, then removed",
            [change(&ab, "s", &["b"]), change(&none, "s", &["a", "b"])].concat(),
            state(5, &[pod("s", &[]), pod("t", &["c"])]),
        ),
        (
            "after a line of the first form",
            [line(&ab, "s"), change(&b_owns, "s", &["b"])].concat(),
            state(5, &[owned(pod("s", &["a", "b"]), "b"), pod("t", &["c"])]),
        ),
        (
            "a change of another generation is skipped",
            change(&older, "s", &["stale"]),
            state(5, &[pod("s", &["a"]), pod("t", &["c"])]),
        ),
        (
            "a tail without its newline is no part of it",
            [
                change(&ab, "s", &["b"]),
                change(&none, "s", &["a"])[..30].to_vec(),
            ]
            .concat(),
            state(5, &[pod("s", &["a", "b"]), pod("t", &["c"])]),
        ),
    ];
    for (what, text, want) in cases {
        let start = state(5, &[pod("s", &["a"]), pod("t", &["c"])]);
        assert_replays(what, start, &text, &want);
    }
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
        assert_replays(what, state(5, &[pod("s", &["a"])]), &text, &want);
    }
}

#[test]
fn a_complete_line_that_does_not_parse_is_corrupt() {
    let good = line(&state(1, &[pod("s", &["a"])]), "s");
    let unknown_pod = change(&state(1, &[pod("u", &["a"])]), "u", &["a"]);
    let neither = br#"{"sandbox":"s","pod":null}"#.to_vec();
    for bad in [
        &b"{torn\n"[..],
        b"{\"g\":1}\n",
        b"[]\n",
        b"\xff\n",
        &unknown_pod,
        &[neither, b"\n".to_vec()].concat(),
    ] {
        let text = [good.clone(), bad.to_vec()].concat();
        let err = replay(&mut state(1, &[]), &text).unwrap_err();
        assert!(err.contains(&format!("byte {}", good.len())), "{err}");
    }
}

fn gpu_record(minor: u32, holders: &[&str]) -> DeviceRecord {
    use crate::ledger::{DeviceId, Holder, Share};
    DeviceRecord {
        device: DeviceId::Gpu(format!("GPU-{minor}")),
        holders: holders
            .iter()
            .map(|h| Holder {
                sandbox_id: h.to_string(),
                share: Share::Exclusive,
            })
            .collect(),
        quarantine: None,
    }
}

/// `from` with device records `(key, record)` added.
fn with_devices(mut from: LedgerState, devices: &[(&str, DeviceRecord)]) -> LedgerState {
    for (k, r) in devices {
        from.devices.insert(k.to_string(), r.clone());
    }
    from
}

/// The claim line that sets `sandbox` and `devices` as `from` has them.
fn set(from: &LedgerState, sandbox: &str, devices: &[&str]) -> Vec<u8> {
    let keys: Vec<String> = devices.iter().map(|d| d.to_string()).collect();
    let mut buf = Vec::new();
    encode_set(&mut buf, from, sandbox, &keys).unwrap();
    buf
}

#[test]
fn claims_set_their_pod_and_devices_in_order() {
    let (g0, g1) = (gpu_record(0, &["s"]), gpu_record(1, &["t"]));
    let start = with_devices(state(7, &[pod("s", &["a"])]), &[("gpu 0", g0.clone())]);
    let t_claims = with_devices(
        state(7, &[pod("s", &["a"]), pod("t", &["c"])]),
        &[("gpu 0", g0.clone()), ("gpu 1", g1.clone())],
    );
    let s_gone = with_devices(state(7, &[pod("t", &["c"])]), &[("gpu 1", g1.clone())]);
    let older = with_devices(
        state(6, &[pod("x", &[])]),
        &[("gpu 2", gpu_record(2, &["x"]))],
    );
    let cases: Vec<(&str, Vec<u8>, LedgerState)> = vec![
        ("a claim", set(&t_claims, "t", &["gpu 1"]), t_claims.clone()),
        (
            "a claim, then a change to its pod",
            [
                set(&t_claims, "t", &["gpu 1"]),
                change(
                    &with_devices(state(7, &[pod("t", &["c", "d"])]), &[]),
                    "t",
                    &["d"],
                ),
            ]
            .concat(),
            with_devices(
                state(7, &[pod("s", &["a"]), pod("t", &["c", "d"])]),
                &[("gpu 0", g0.clone()), ("gpu 1", g1.clone())],
            ),
        ),
        (
            "a pod and a device set to none",
            [
                set(&t_claims, "t", &["gpu 1"]),
                set(&s_gone, "s", &["gpu 0"]),
            ]
            .concat(),
            s_gone.clone(),
        ),
        (
            "a claim of another generation is skipped",
            set(&older, "x", &["gpu 2"]),
            start.clone(),
        ),
        (
            "a claim cut short is no part of it",
            set(&t_claims, "t", &["gpu 1"])[..40].to_vec(),
            start.clone(),
        ),
    ];
    for (what, text, want) in cases {
        assert_replays(what, start.clone(), &text, &want);
    }
}

/// A claim must never be skipped by a reader that does not know its form:
/// the readers of both earlier forms refuse a line that names neither `g`
/// nor `gen`, so the ledger fails closed instead of giving the devices out twice.
#[test]
fn readers_of_the_earlier_forms_refuse_a_claim() {
    let claimed = with_devices(
        state(3, &[pod("s", &["a"])]),
        &[("gpu 0", gpu_record(0, &["s"]))],
    );
    let text = set(&claimed, "s", &["gpu 0"]);
    assert_eq!(text.iter().filter(|&&b| b == b'\n').count(), 1);
    assert!(
        text.starts_with(b"{\"set\":3,\"sandbox\":\"s\",\"pod\":{"),
        "{}",
        String::from_utf8_lossy(&text)
    );
    #[derive(serde::Deserialize)]
    struct EarlierForms {
        g: Option<u64>,
        gen: Option<u64>,
    }
    let seen: EarlierForms = serde_json::from_slice(&text).unwrap();
    assert_eq!(
        (seen.g, seen.gen),
        (None, None),
        "read as: a line names no generation"
    );
    // The first form's reader required `g`: the line does not even parse.
    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct FirstForm {
        g: u64,
        sandbox: String,
        pod: Option<PodRecord>,
    }
    assert!(serde_json::from_slice::<FirstForm>(&text).is_err());
    let neither = br#"{"sandbox":"s","pod":null}"#;
    assert!(replay(&mut state(3, &[]), &[&neither[..], b"\n"].concat()).is_err());
}
