//! Explicit device cgroup rules: on a runtime whose NRI applies
//! `linux.resources.devices` (v0.10 and later), every device node of the
//! adjustment comes with its allow rule; on older ones (v0.6.1 allows a
//! node's rule with the node itself) none is sent.
use super::*;

/// A device as a rule or a node allows it: type, major, minor, access.
type Allowed = (String, i64, i64, String);

/// The rules of `adj`, and what its nodes allow.
fn rules_and_nodes(adj: &ContainerAdjustment) -> (Vec<Allowed>, Vec<Allowed>) {
    let rules = adj
        .linux
        .as_ref()
        .and_then(|l| l.resources.as_ref())
        .map(|r| {
            r.devices
                .iter()
                .inspect(|d| assert!(d.allow, "{d:?}"))
                .map(|d| {
                    (
                        d.type_.clone(),
                        d.major.value,
                        d.minor.value,
                        d.access.clone(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let nodes = adj
        .linux
        .as_ref()
        .map(|l| {
            l.devices
                .iter()
                .map(|d| (d.type_.clone(), d.major, d.minor, "rw".to_string()))
                .collect()
        })
        .unwrap_or_default();
    (rules, nodes)
}

#[test]
fn nri_v0_10_gets_a_rule_for_every_node_of_every_container() {
    let node = node();
    let config = Arc::new(Config::default());
    let explicit = RuntimeFeatures {
        explicit_cgroup_rules: true,
        ..RuntimeFeatures::default()
    };
    // The pod's first container, then a further one from the prepared plan.
    for id in ["c1", "c2"] {
        let adj = node.create(id, &[], &config, explicit).unwrap();
        let (mut rules, mut nodes) = rules_and_nodes(&adj);
        assert!(nodes.len() >= 3, "the gpu's and the vf's nodes: {nodes:?}");
        rules.sort();
        nodes.sort();
        assert_eq!(rules, nodes, "{id}");
    }
}

#[test]
fn nri_v0_6_gets_nodes_without_rules() {
    let node = node();
    let adj = node
        .create(
            "c1",
            &[],
            &Arc::new(Config::default()),
            RuntimeFeatures::default(),
        )
        .unwrap();
    let (rules, nodes) = rules_and_nodes(&adj);
    assert!(!nodes.is_empty());
    assert!(rules.is_empty(), "{rules:?}");
}
