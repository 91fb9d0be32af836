//! Rule reduction, program bytes, the replace protocol on a fake `bpf(2)`,
//! and (as root) the kernel verifier's verdict on generated programs.

use std::os::fd::AsFd;

use super::fake::FakeBpf;
use super::program::to_bytes;
use super::*;

fn hex(insns: &[Insn]) -> Vec<String> {
    insns
        .iter()
        .map(|i| i.to_bytes().iter().map(|b| format!("{b:02x}")).collect())
        .collect()
}

const PROLOGUE: [&str; 6] = [
    "6112000000000000", // r2 = *(u32 *)(r1 + 0)
    "54020000ffff0000", // w2 &= 0xffff
    "6113000000000000", // r3 = *(u32 *)(r1 + 0)
    "7403000010000000", // w3 >>= 16
    "6114040000000000", // r4 = *(u32 *)(r1 + 4)
    "6115080000000000", // r5 = *(u32 *)(r1 + 8)
];

fn set(rules: &[Rule]) -> Ruleset {
    Ruleset::from_rules(rules).unwrap()
}

fn expect(body: &[&str]) -> Vec<String> {
    PROLOGUE.iter().chain(body).map(|s| s.to_string()).collect()
}

#[test]
fn programs_are_byte_exact() {
    let deny_all = set(&[Rule::new(false, DevType::All, -1, -1, 7)]);
    assert_eq!(
        hex(&generate(&deny_all).unwrap()),
        expect(&["b400000000000000", "9500000000000000"])
    );
    let allow_all = set(&[Rule::new(true, DevType::All, -1, -1, 7)]);
    assert_eq!(
        hex(&generate(&allow_all).unwrap()),
        expect(&["b400000001000000", "9500000000000000"])
    );
    // c 195:3 rw: type, access subset, major, minor, then allow.
    let one = set(&[Rule::new(true, DevType::Char, 195, 3, 6)]);
    assert_eq!(
        hex(&generate(&one).unwrap()),
        expect(&[
            "5502070002000000", // if r2 != char goto end
            "bc31000000000000", // w1 = w3
            "5401000006000000", // w1 &= rw
            "5d31040000000000", // if r1 != r3 goto end
            "55040300c3000000", // if r4 != 195 goto end
            "5505020003000000", // if r5 != 3 goto end
            "b400000001000000", // r0 = 1
            "9500000000000000", // exit
            "b400000000000000",
            "9500000000000000",
        ])
    );
    // c 136:* rwm (runc's /dev/pts): no access or minor test.
    let pts = set(&[Rule::new(true, DevType::Char, 136, -1, 7)]);
    assert_eq!(
        hex(&generate(&pts).unwrap()),
        expect(&[
            "5502030002000000",
            "5504020088000000",
            "b400000001000000",
            "9500000000000000",
            "b400000000000000",
            "9500000000000000",
        ])
    );
    // A deny list: b 8:* denied reads, everything else allowed.
    let deny = set(&[
        Rule::new(true, DevType::All, -1, -1, 7),
        Rule::new(false, DevType::Block, 8, -1, 2),
    ]);
    assert_eq!(
        hex(&generate(&deny).unwrap()),
        expect(&[
            "5502060001000000",
            "bc31000000000000",
            "5401000002000000",
            "5d31030000000000",
            "5504020008000000",
            "b400000000000000",
            "9500000000000000",
            "b400000001000000",
            "9500000000000000",
        ])
    );
    assert_eq!(to_bytes(&generate(&deny).unwrap()).len(), 8 * 15);
}

const PODMAN_SPEC: &str = r#"{"ociVersion":"1.0.2","process":{"args":["sh"]},
  "linux":{"devices":[{"path":"/dev/null","type":"c","major":1,"minor":3}],
  "resources":{"devices":[{"allow":false,"access":"rwm"},
    {"allow":true,"type":"c","major":1,"minor":3,"access":"rwm"},
    {"allow":true,"type":"c","major":10,"minor":229,"access":"rwm"},
    {"allow":true,"type":"b","major":7,"access":"rw"}]}},"extra":{"x":1}}"#;

fn spec(json: &str) -> Spec {
    serde_json::from_str(json).unwrap()
}

fn listed(set: &Ruleset) -> Vec<(DevType, Option<u32>, Option<u32>, u8)> {
    set.exceptions()
        .map(|r| (r.kind, r.major, r.minor, r.access.0))
        .collect()
}

#[test]
fn the_runtime_rules_are_the_spec_then_runc_defaults() {
    let rules = spec(PODMAN_SPEC).runtime_rules().unwrap();
    assert_eq!(
        rules.len(),
        4 + rules::RUNC_DEFAULTS.len() - 1,
        "/dev/null deduplicated"
    );
    let set = ruleset(&spec(PODMAN_SPEC), &[]).unwrap();
    assert!(!set.default_allow);
    let list = listed(&set);
    for want in [
        (DevType::Char, Some(1), Some(3), 7),
        (DevType::Char, Some(10), Some(229), 7),
        (DevType::Block, Some(7), None, 6),
        (DevType::Char, None, None, 1),
        (DevType::Block, None, None, 1),
        (DevType::Char, Some(136), None, 7),
        (DevType::Char, Some(10), Some(200), 7),
    ] {
        assert!(list.contains(&want), "{want:?} in {list:?}");
    }
    // An empty spec is runc's defaults on a deny-all start.
    assert_eq!(listed(&ruleset(&spec("{}"), &[]).unwrap()).len(), 11);
}

#[test]
fn planned_nodes_are_added_read_write() {
    let node = crate::plan::DeviceNode {
        path: "/dev/nvidia0".into(),
        kind: crate::plan::DeviceKind::Char,
        major: 195,
        minor: 0,
        file_mode: 0o666,
    };
    let set = ruleset(&spec(PODMAN_SPEC), &[node]).unwrap();
    assert!(listed(&set).contains(&(DevType::Char, Some(195), Some(0), 6)));
    // On an allow-all spec the program stays allow-all.
    let all = r#"{"linux":{"resources":{"devices":[{"allow":true,"access":"rwm"}]}}}"#;
    let set = ruleset(&spec(all), &[]).unwrap();
    assert!(set.default_allow && listed(&set).is_empty());
}

/// `a 195:* rw` is allow-all to runc and 195:* to crun: refused, so the
/// container is never given wider access than its runtime would.
#[test]
fn a_type_a_rule_with_numbers_is_refused() {
    let text = r#"{"linux":{"resources":{"devices":[{"allow":false,"access":"rwm"},{"allow":true,"type":"a","major":195,"access":"rw"}]}}}"#;
    let e = ruleset(&spec(text), &[]).unwrap_err();
    assert!(matches!(e, CgroupV2Error::AllWithNumbers { .. }), "{e}");
}

/// `a *:* r` is allow-all to runc and read-only to crun: refused likewise.
#[test]
fn a_type_a_rule_without_full_access_is_refused() {
    for access in ["r", "rw", "m"] {
        for allow in [true, false] {
            let text = format!(
                r#"{{"linux":{{"resources":{{"devices":[{{"allow":false,"access":"rwm"}},{{"allow":{allow},"type":"a","access":"{access}"}}]}}}}}}"#
            );
            let e = ruleset(&spec(&text), &[]).unwrap_err();
            assert!(
                matches!(e, CgroupV2Error::AllPartial { .. }),
                "{access} {allow}: {e}"
            );
        }
    }
}

#[test]
fn v1_semantics_hold_and_bad_rules_fail() {
    let mut set = set(&[Rule::new(true, DevType::Char, 5, -1, 7)]);
    // Removing part of a wildcard exception is the hole v1 refuses.
    let e = set
        .apply(&Rule::new(false, DevType::Char, 5, 1, 2))
        .unwrap_err();
    assert!(matches!(e, CgroupV2Error::Hole { .. }), "{e}");
    set.apply(&Rule::new(false, DevType::Char, 5, -1, 6))
        .unwrap();
    assert_eq!(listed(&set), vec![(DevType::Char, Some(5), None, 1)]);
    set.apply(&Rule::new(false, DevType::Char, 5, -1, 7))
        .unwrap();
    assert!(listed(&set).is_empty());
    for bad in [
        r#"{"allow":true,"type":"x","access":"r"}"#,
        r#"{"allow":true,"type":"c","access":""}"#,
        r#"{"allow":true,"type":"c"}"#,
        r#"{"allow":true,"type":"c","access":"rwx"}"#,
        r#"{"allow":true,"type":"c","major":-2,"access":"r"}"#,
        r#"{"allow":true,"type":"c","major":4294967296,"access":"r"}"#,
    ] {
        let json = format!(r#"{{"linux":{{"resources":{{"devices":[{bad}]}}}}}}"#);
        let e = spec(&json).runtime_rules().unwrap_err();
        assert!(
            matches!(e, CgroupV2Error::SpecRule { index: 0, .. }),
            "{bad}: {e}"
        );
    }
    let many: Vec<String> = (0..=rules::MAX_SPEC_RULES)
        .map(|_| r#"{"allow":true,"type":"c","access":"r"}"#.to_string())
        .collect();
    let json = format!(
        r#"{{"linux":{{"resources":{{"devices":[{}]}}}}}}"#,
        many.join(",")
    );
    assert!(matches!(
        spec(&json).runtime_rules(),
        Err(CgroupV2Error::TooManyRules { .. })
    ));
}

fn cgroup() -> std::fs::File {
    std::fs::File::open("/dev/null").unwrap()
}

fn program() -> Vec<Insn> {
    generate(&ruleset(&spec(PODMAN_SPEC), &[]).unwrap()).unwrap()
}

#[test]
fn one_program_is_replaced_in_one_step() {
    let mut bpf = FakeBpf::with_attached(&[1]);
    let out = install(&mut bpf, cgroup().as_fd(), &program()).unwrap();
    assert_eq!(out, (1, true));
    assert_eq!(bpf.attached, vec![100]);
    assert_eq!(bpf.only_program(), Some(&program()));
    assert_eq!(bpf.calls, ["load", "query", "prog_fd", "replace"]);
}

#[test]
fn without_replace_the_new_program_goes_on_before_the_old_comes_off() {
    let mut bpf = FakeBpf {
        no_replace: true,
        ..FakeBpf::with_attached(&[1])
    };
    assert_eq!(
        install(&mut bpf, cgroup().as_fd(), &program()).unwrap(),
        (1, false)
    );
    assert_eq!(bpf.attached, vec![100]);
    assert_eq!(
        bpf.calls,
        ["load", "query", "prog_fd", "replace", "attach", "detach"]
    );
    // Several (or no) programs: attach, then detach each old one.
    let mut bpf = FakeBpf::with_attached(&[1, 2]);
    assert_eq!(
        install(&mut bpf, cgroup().as_fd(), &program()).unwrap(),
        (2, false)
    );
    assert_eq!(bpf.attached, vec![100]);
    let mut bpf = FakeBpf::default();
    assert_eq!(
        install(&mut bpf, cgroup().as_fd(), &program()).unwrap(),
        (0, false)
    );
    assert_eq!(bpf.attached, vec![100]);
}

#[test]
fn failures_never_leave_less_than_the_old_programs() {
    for step in ["load", "query", "prog_fd", "replace"] {
        let mut bpf = FakeBpf {
            fail: Some(step),
            ..FakeBpf::with_attached(&[1])
        };
        assert!(
            install(&mut bpf, cgroup().as_fd(), &program()).is_err(),
            "{step}"
        );
        assert_eq!(bpf.attached, vec![1], "{step}");
    }
    // A failed detach leaves both: their intersection is at most the old access.
    let mut bpf = FakeBpf {
        fail: Some("detach"),
        ..FakeBpf::with_attached(&[1, 2])
    };
    assert!(install(&mut bpf, cgroup().as_fd(), &program()).is_err());
    assert_eq!(bpf.attached, vec![1, 2, 100]);
}

#[test]
fn the_kernel_verifier_accepts_generated_programs() {
    // Needs root (CAP_BPF), as the hook has.
    let sets = [
        ruleset(&spec("{}"), &[]).unwrap(),
        ruleset(&spec(PODMAN_SPEC), &[]).unwrap(),
        set(&[Rule::new(true, DevType::All, -1, -1, 7)]),
        set(&[
            Rule::new(true, DevType::All, -1, -1, 7),
            Rule::new(false, DevType::Block, 8, -1, 2),
        ]),
    ];
    for s in &sets {
        let insns = generate(s).unwrap();
        if let Err(e) = SysBpf.load(&insns, LICENSE) {
            panic!("{s:?}: {e}");
        }
    }
}

/// `c 195:0 r` then `c 195:0 w` is `rw` to runc and neither to crun, which
/// checks each rule alone: refused. An access one of them holds whole is
/// what both read alike, and kept.
#[test]
fn allow_rules_of_one_device_with_split_access_are_refused() {
    let rules = |a: &str, b: &str| {
        format!(
            r#"{{"linux":{{"resources":{{"devices":[{{"allow":false,"access":"rwm"}},{{"allow":true,"type":"c","major":195,"minor":0,"access":"{a}"}},{{"allow":true,"type":"c","major":195,"minor":0,"access":"{b}"}}]}}}}}}"#
        )
    };
    let e = ruleset(&spec(&rules("r", "w")), &[]).unwrap_err();
    assert!(matches!(e, CgroupV2Error::SplitAccess { .. }), "{e}");
    for (a, b) in [("r", "rw"), ("rw", "r"), ("rwm", "w")] {
        let set = ruleset(&spec(&rules(a, b)), &[]).unwrap();
        let want = if a.len() > b.len() { a } else { b };
        let bits = want
            .chars()
            .map(|c| match c {
                'm' => 1,
                'r' => 2,
                _ => 4,
            })
            .sum::<u8>();
        assert!(
            listed(&set).contains(&(DevType::Char, Some(195), Some(0), bits)),
            "{a} {b}"
        );
    }
}
