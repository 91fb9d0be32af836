//! The ValidatingAdmissionPolicy in `install/kubernetes/validating-admission-policy.yaml`,
//! evaluated on sample admission requests. The expressions are read from the file
//! itself, so the test and the installed policy cannot drift apart. Kubernetes
//! evaluates them with cel-go and its strings extension (`split`); the test uses
//! the same standard library and extension of the Rust CEL implementation.
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use cel::{Context, Env, Program, Value};
use serde::Deserialize;

const POLICY: &str = include_str!("../install/kubernetes/validating-admission-policy.yaml");
const KEY: &str = "scheduling.koordinator.sh/device-allocated";
const SCHEDULER: &str = "system:serviceaccount:koordinator-system:koord-scheduler";
const TENANT: &str = "system:serviceaccount:team-a:default";

#[derive(Deserialize)]
struct Doc {
    kind: String,
    #[serde(default)]
    spec: serde_json::Value,
}

struct Policy {
    env: Arc<Env>,
    variables: Vec<(String, Program)>,
    validations: Vec<(Program, Program)>,
}

fn docs_of(text: &str) -> Vec<Doc> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| Doc::deserialize(d).expect("policy document"))
        .collect()
}

fn docs() -> Vec<Doc> {
    docs_of(POLICY)
}

fn policy() -> Policy {
    policy_of(POLICY)
}

fn policy_of(text: &str) -> Policy {
    let mut env = Env::stdlib();
    env.add_extension(cel::extensions::strings)
        .expect("strings extension");
    let env = Arc::new(env);
    let docs = docs_of(text);
    let vap = docs
        .iter()
        .find(|d| d.kind == "ValidatingAdmissionPolicy")
        .expect("policy in the file");
    let compile = |src: &serde_json::Value| {
        let src = src.as_str().expect("expression is a string");
        env.compile(src)
            .unwrap_or_else(|e| panic!("compile {src:?}: {e}"))
    };
    let variables = vap.spec["variables"]
        .as_array()
        .expect("variables")
        .iter()
        .map(|v| {
            (
                v["name"].as_str().expect("name").to_string(),
                compile(&v["expression"]),
            )
        })
        .collect();
    let validations = vap.spec["validations"]
        .as_array()
        .expect("validations")
        .iter()
        .map(|v| (compile(&v["expression"]), compile(&v["messageExpression"])))
        .collect();
    Policy {
        env,
        variables,
        validations,
    }
}

/// The outcome of the policy on one request: `Ok` admits, `Err(message)` denies.
fn admit(
    policy: &Policy,
    user: &str,
    operation: &str,
    object: serde_json::Value,
    old: serde_json::Value,
) -> Result<(), String> {
    let mut ctx = Context::with_env(policy.env.clone());
    let request = serde_json::json!({
        "operation": operation,
        "userInfo": { "username": user, "groups": ["system:authenticated"] },
    });
    ctx.add_variable("request", request).expect("request");
    ctx.add_variable("object", object).expect("object");
    ctx.add_variable("oldObject", old).expect("oldObject");
    // Kubernetes evaluates `variables.<name>` lazily; evaluating them in order is
    // equivalent since each refers only to earlier ones.
    let mut vars: HashMap<String, Value> = HashMap::new();
    for (name, program) in &policy.variables {
        let mut scoped = ctx.new_inner_scope();
        scoped.add_variable_from_value("variables", vars.clone());
        let value = program
            .execute(&scoped)
            .unwrap_or_else(|e| panic!("variable {name}: {e}"));
        vars.insert(name.clone(), value);
    }
    ctx.add_variable_from_value("variables", vars);
    for (expression, message) in &policy.validations {
        match expression.execute(&ctx).expect("validation") {
            Value::Bool(true) => {}
            Value::Bool(false) => match message.execute(&ctx).expect("message") {
                Value::String(s) => return Err(s.to_string()),
                other => panic!("message is not a string: {other:?}"),
            },
            other => panic!("validation is not a bool: {other:?}"),
        }
    }
    Ok(())
}

fn pod(annotations: &[(&str, &str)]) -> serde_json::Value {
    let map: BTreeMap<&str, &str> = annotations.iter().copied().collect();
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "p", "namespace": "team-a", "annotations": map },
        "spec": { "containers": [{ "name": "main" }] },
    })
}

fn bare_pod() -> serde_json::Value {
    serde_json::json!({ "apiVersion": "v1", "kind": "Pod", "metadata": { "name": "p" } })
}

const ALLOC: &str = r#"{"gpu":[{"minor":0}]}"#;
const OTHER: &str = r#"{"gpu":[{"minor":1}]}"#;

#[test]
fn only_listed_users_add_change_or_remove_the_allocation() {
    let p = policy();
    let null = serde_json::Value::Null;
    let with = pod(&[(KEY, ALLOC)]);
    let other = pod(&[(KEY, OTHER)]);
    let without = pod(&[("team", "a")]);
    let doubled = format!("{SCHEDULER},{SCHEDULER}");
    let cases: Vec<(&str, &str, &str, serde_json::Value, serde_json::Value, bool)> = vec![
        (
            "tenant creates a pod with a forged allocation",
            TENANT,
            "CREATE",
            with.clone(),
            null.clone(),
            false,
        ),
        (
            "tenant creates a plain pod",
            TENANT,
            "CREATE",
            without.clone(),
            null.clone(),
            true,
        ),
        (
            "tenant creates a pod without metadata.annotations",
            TENANT,
            "CREATE",
            bare_pod(),
            null.clone(),
            true,
        ),
        (
            "kubelet creates the mirror pod of a static pod with an allocation",
            "system:node:node-a",
            "CREATE",
            pod(&[(KEY, ALLOC), ("kubernetes.io/config.mirror", "hash")]),
            null.clone(),
            false,
        ),
        (
            "tenant adds the allocation later",
            TENANT,
            "UPDATE",
            with.clone(),
            without.clone(),
            false,
        ),
        (
            "tenant adds it to a pod that had no annotations",
            TENANT,
            "UPDATE",
            with.clone(),
            bare_pod(),
            false,
        ),
        (
            "tenant changes the allocation",
            TENANT,
            "UPDATE",
            other.clone(),
            with.clone(),
            false,
        ),
        (
            "tenant removes the allocation",
            TENANT,
            "UPDATE",
            without.clone(),
            with.clone(),
            false,
        ),
        (
            "tenant changes another annotation and keeps the allocation",
            TENANT,
            "UPDATE",
            pod(&[(KEY, ALLOC), ("x", "y")]),
            with.clone(),
            true,
        ),
        (
            "the scheduler writes the allocation at PreBind",
            SCHEDULER,
            "UPDATE",
            with.clone(),
            without.clone(),
            true,
        ),
        (
            "the scheduler changes it",
            SCHEDULER,
            "UPDATE",
            other.clone(),
            with.clone(),
            true,
        ),
        (
            "a user named like a list of allowed users",
            &doubled,
            "CREATE",
            with.clone(),
            null.clone(),
            false,
        ),
        (
            "a prefix of the scheduler's name",
            "system:serviceaccount:koordinator-system:koord",
            "CREATE",
            with.clone(),
            null.clone(),
            false,
        ),
    ];
    for (what, user, op, object, old, allowed) in cases {
        let got = admit(&p, user, op, object, old);
        assert_eq!(got.is_ok(), allowed, "{what}: {got:?}");
        if let Err(message) = got {
            assert!(message.contains(KEY), "{what}: {message}");
            assert!(message.contains(user), "{what}: {message}");
        }
    }
}

#[test]
fn a_binding_with_the_annotation_needs_an_allowed_user() {
    let p = policy();
    let binding = |annotations: serde_json::Value| {
        serde_json::json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": { "name": "p", "annotations": annotations },
            "target": { "kind": "Node", "name": "n1" },
        })
    };
    let forged = binding(serde_json::json!({ KEY: ALLOC }));
    let null = serde_json::Value::Null;
    assert!(admit(&p, TENANT, "CREATE", forged.clone(), null.clone()).is_err());
    assert!(admit(&p, SCHEDULER, "CREATE", forged, null.clone()).is_ok());
    let plain = binding(serde_json::json!({}));
    assert!(admit(&p, TENANT, "CREATE", plain, null).is_ok());
}

/// The allowed users are the policy's own list: edited there, they decide.
#[test]
fn the_user_list_is_the_policys_variable() {
    let edited = POLICY.replace(
        &format!("['{SCHEDULER}']"),
        &format!("['a', '{TENANT}', 'b']"),
    );
    assert_ne!(edited, POLICY, "the list is where the file says");
    let p = policy_of(&edited);
    let with = pod(&[(KEY, ALLOC)]);
    let null = serde_json::Value::Null;
    assert!(admit(&p, TENANT, "CREATE", with.clone(), null.clone()).is_ok());
    assert!(admit(&p, SCHEDULER, "CREATE", with, null.clone()).is_err());
    assert!(admit(&p, SCHEDULER, "CREATE", pod(&[]), null).is_ok());
}

#[test]
fn the_policy_covers_pods_and_is_bound_fail_closed() {
    let docs = docs();
    let vap = docs
        .iter()
        .find(|d| d.kind == "ValidatingAdmissionPolicy")
        .expect("policy");
    assert_eq!(vap.spec["failurePolicy"], "Fail");
    let rule = &vap.spec["matchConstraints"]["resourceRules"][0];
    assert_eq!(rule["operations"], serde_json::json!(["CREATE", "UPDATE"]));
    for resource in ["pods", "pods/status", "pods/binding", "bindings"] {
        assert!(
            rule["resources"]
                .as_array()
                .is_some_and(|r| r.iter().any(|x| x == resource)),
            "{resource}"
        );
    }
    let binding = docs
        .iter()
        .find(|d| d.kind == "ValidatingAdmissionPolicyBinding")
        .expect("binding");
    assert_eq!(binding.spec["policyName"], "devgate-device-allocated");
    assert_eq!(
        binding.spec["validationActions"],
        serde_json::json!(["Deny"])
    );
    // No parameter object: its absence would refuse every pod write.
    assert!(vap.spec.get("paramKind").is_none());
    assert!(binding.spec.get("paramRef").is_none());
}

const HINT: &str = "scheduling.koordinator.sh/device-allocate-hint";
const DEVICE_LEVEL: &str =
    r#"{"rdma":{"allocateStrategy":"RequestsAsCount","exclusivePolicy":"DeviceLevel"}}"#;

/// The allocation hint is the pod author's at creation; once the pod exists,
/// only a listed user changes or removes it, and a binding carries it only
/// from one: the grant check reads the RDMA strategy from the live pod.
#[test]
fn the_hint_is_set_at_creation_and_changed_only_by_listed_users() {
    let p = policy();
    let null = serde_json::Value::Null;
    let hinted = pod(&[(HINT, DEVICE_LEVEL)]);
    assert!(admit(&p, TENANT, "CREATE", hinted.clone(), null.clone()).is_ok());
    let cases = [
        ("added", pod(&[]), hinted.clone()),
        ("changed", pod(&[(HINT, "{}")]), hinted.clone()),
        ("removed", hinted.clone(), pod(&[])),
    ];
    for (what, old, new) in cases {
        let e = admit(&p, TENANT, "UPDATE", new.clone(), old.clone()).unwrap_err();
        assert!(e.contains(HINT) && e.contains(TENANT), "{what}: {e}");
        assert!(admit(&p, SCHEDULER, "UPDATE", new, old).is_ok(), "{what}");
    }
    // Unchanged, other annotations may change.
    let relabelled = pod(&[(HINT, DEVICE_LEVEL), ("team", "a")]);
    assert!(admit(&p, TENANT, "UPDATE", relabelled, hinted).is_ok());
    let binding = serde_json::json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": { "name": "p", "annotations": { HINT: DEVICE_LEVEL } },
        "target": { "kind": "Node", "name": "n1" },
    });
    assert!(admit(&p, TENANT, "CREATE", binding.clone(), null.clone()).is_err());
    assert!(admit(&p, SCHEDULER, "CREATE", binding, null).is_ok());
}
