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

/// Containers `ids` of one pod on a runtime with `explicit` rules or
/// without: each one's rules and nodes, sorted.
fn created(ids: &[&str], explicit: bool) -> Vec<(Vec<Allowed>, Vec<Allowed>)> {
    let node = node();
    let config = Arc::new(Config::default());
    let features = RuntimeFeatures {
        explicit_cgroup_rules: explicit,
        ..RuntimeFeatures::default()
    };
    ids.iter()
        .map(|id| {
            let adj = node.create(id, &[], &config, features).unwrap();
            let (mut rules, mut nodes) = rules_and_nodes(&adj);
            rules.sort();
            nodes.sort();
            (rules, nodes)
        })
        .collect()
}

#[test]
fn nri_v0_10_gets_a_rule_for_every_node_of_every_container() {
    // The pod's first container, then a further one from the prepared plan.
    for (rules, nodes) in created(&["c1", "c2"], true) {
        assert!(nodes.len() >= 3, "the gpu's and the vf's nodes: {nodes:?}");
        assert_eq!(rules, nodes);
    }
}

#[test]
fn nri_v0_6_gets_nodes_without_rules() {
    for (rules, nodes) in created(&["c1"], false) {
        assert!(!nodes.is_empty());
        assert!(rules.is_empty(), "{rules:?}");
    }
}
