//! Containers the hooks.d hook leaves alone: those without an allocation, and
//! those the NRI plugin admitted, as the hook meets them when a runtime has
//! both (CRI-O with NRI). A resolved annotation without the plugin's record
//! came from the pod and is refused.
use super::*;

#[test]
fn nri_handled_or_device_free_containers_are_left_alone() {
    let w = world();
    let mut os = FakeOs::default();
    let out = w
        .run(
            Stage::CreateRuntime,
            &state("c3", "creating", Some(7), &[("k", "v")]),
            &mut os,
        )
        .unwrap();
    assert_eq!(out, Outcome::Nothing);
    // The plugin's annotation without the plugin's ledger record came from the
    // pod: refused, nothing planned, claimed or created.
    let resolved = r#"{"version":1,"networks":[]}"#;
    let alloc = w.allocation();
    let ann = [
        (DEVICE_ALLOCATED, alloc.as_str()),
        (RESOLVED_ANNOTATION, resolved),
    ];
    let forged = state("c3", "creating", Some(7), &ann);
    let e = w.run(Stage::CreateRuntime, &forged, &mut os).unwrap_err();
    assert!(
        e.to_string()
            .contains("pods cannot grant themselves devices"),
        "{e}"
    );
    assert!(os.nodes.is_empty() && os.attached.is_empty());
    assert!(w.ledger().pods.is_empty());
    // With the record the plugin writes, the plugin's own hook does the work.
    admit_as_plugin(&w, "c3", Some(resolved));
    let before = w.ledger();
    for stage in [Stage::CreateRuntime, Stage::Poststop] {
        let status = if stage == Stage::Poststop {
            "stopped"
        } else {
            "creating"
        };
        let st = state("c3", status, Some(7), &ann);
        assert_eq!(w.run(stage, &st, &mut os).unwrap(), Outcome::Nothing);
    }
    assert!(os.nodes.is_empty() && os.attached.is_empty());
    assert_eq!(
        w.ledger(),
        before,
        "the plugin's claims are the plugin's to release"
    );
}

/// CRI-O with NRI and the hooks.d file: for a container the plugin admitted
/// (here GPU only, so without the resolved annotation) the hooks.d hook plans,
/// claims, creates and releases nothing.
#[test]
fn containers_the_plugin_admitted_are_the_plugins() {
    let w = world();
    let alloc = w.allocation();
    let ann = [(DEVICE_ALLOCATED, alloc.as_str())];
    admit_as_plugin(&w, "c9", None);
    let before = w.ledger();
    let mut os = FakeOs::default();
    let created = state("c9", "creating", Some(7), &ann);
    assert_eq!(
        w.run(Stage::CreateRuntime, &created, &mut os).unwrap(),
        Outcome::Nothing
    );
    let stopped = state("c9", "stopped", None, &ann);
    assert_eq!(
        w.run(Stage::Poststop, &stopped, &mut os).unwrap(),
        Outcome::Nothing
    );
    assert!(os.nodes.is_empty() && os.attached.is_empty());
    assert!(os.teardowns.borrow().is_empty());
    assert_eq!(w.ledger(), before);
}

/// What the NRI plugin records when it admits `container` (with `resolved`,
/// the annotation it gives the pod's network owner).
fn admit_as_plugin(w: &World, container: &str, resolved: Option<&str>) {
    let pod = crate::ledger::tests::pod("sb-nri");
    let record = ContainerRecord {
        name: "main".into(),
        devices: vec!["/dev/nvidia0".into()],
        applied_unix: 0,
        init: None,
        cgroups: Vec::new(),
        resolved: resolved.map(String::from),
        resolved_sha256: None,
        hooks_only: false,
    };
    let gpu = Claim {
        device: DeviceId::Gpu("GPU-nri".into()),
        share: Share::Exclusive,
        pf: None,
    };
    Ledger::open(&w.env.state_dir)
        .unwrap()
        .admit(&pod, &[gpu], container, record, resolved.is_some())
        .unwrap();
}
