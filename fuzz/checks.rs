//! The properties the fuzz targets check, shared with the test suite's short
//! smoke run (`tests/fuzz_smoke.rs`), so CI exercises the same assertions.
// Each fuzz target includes this file for its one property.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::OnceLock;

use devgate::allocation::{
    parse_allocation, parse_pod, CONTAINERS, DEVICE_ALLOCATED, GPU_ISOLATION_PROVIDER, MAX_ENTRIES,
};
use devgate::config::Config;
use devgate::fixture::HostRootBuilder;
use devgate::hook::{args, Resolved, State, MAX_NETWORKS};
use devgate::inventory::Inventory;
use devgate::plan;

/// The `device-allocated` parser on arbitrary bytes: it must return, never panic,
/// and every error must print as one bounded line naming the annotation.
pub fn allocation(data: &[u8]) {
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
}

fn inventory() -> &'static Inventory {
    static INV: OnceLock<Inventory> = OnceLock::new();
    INV.get_or_init(|| {
        HostRootBuilder::hgx()
            .expected()
            .expect("fixture inventory")
    })
}

/// Parse + plan against the fixture's HGX-class inventory. The first byte picks the
/// pod label, `devgate.io/containers` and the container; the rest is the annotation.
/// A plan must only hold device nodes from the inventory; an error must be one line.
pub fn plan(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let mut annotations = BTreeMap::new();
    annotations.insert(DEVICE_ALLOCATED.to_string(), text.to_string());
    if flags & 1 != 0 {
        annotations.insert(CONTAINERS.to_string(), "main,init".to_string());
    }
    let mut labels = BTreeMap::new();
    if flags & 2 != 0 {
        labels.insert(GPU_ISOLATION_PROVIDER.to_string(), "HAMi-core".to_string());
    }
    let mut config = Config::default();
    config.rdma.allow_issm = flags & 4 != 0;
    let container = if flags & 8 != 0 { "sidecar" } else { "main" };
    let pod = match parse_pod(&annotations, &labels) {
        Ok(pod) => pod,
        Err(e) => return assert!(!e.to_string().contains('\n')),
    };
    match plan::build(inventory(), &pod, container, &config) {
        Ok(p) => check(&p),
        Err(e) => {
            let text = e.to_string();
            assert!(text.starts_with(DEVICE_ALLOCATED), "{text}");
            assert!(!text.contains(['\n', '\r', '\0']), "{text:?}");
        }
    }
}

fn check(p: &plan::Plan) {
    for d in &p.devices {
        assert!(
            d.path.starts_with("/dev/") && !d.path.contains(".."),
            "{}",
            d.path
        );
    }
    let mut paths: Vec<&str> = p.devices.iter().map(|d| d.path.as_str()).collect();
    paths.sort_unstable();
    let n = paths.len();
    paths.dedup();
    assert_eq!(n, paths.len(), "a device node twice");
    let json = serde_json::to_string(p).unwrap();
    let back: plan::Plan = serde_json::from_str(&json).unwrap();
    assert_eq!(&back, p);
}

/// What a runtime writes on the hook's stdin, annotations included (a pod can
/// write `devgate.io/resolved` too): parsing must return, never panic; a
/// resolved value that parses holds only validated networks and survives its
/// own round trip; every error is one bounded line.
pub fn hook_state(data: &[u8]) {
    let state = match State::parse(data) {
        Ok(s) => s,
        Err(e) => return one_line(&e.to_string()),
    };
    assert!(!state.id.is_empty() && state.id.len() <= 256);
    let _ = state.pid();
    match Resolved::from_annotations(&state.annotations) {
        Ok(Some(r)) => {
            assert!(r.networks.len() <= MAX_NETWORKS);
            assert!(r.networks.iter().all(|n| n.validate().is_ok()));
            let text = r.to_annotation().unwrap();
            assert_eq!(Resolved::parse(&text).unwrap(), r);
        }
        Ok(None) => {}
        Err(e) => one_line(&e.to_string()),
    }
    // The same bytes as a command line (NUL-separated): parsed or refused.
    let argv = data
        .split(|b| *b == 0)
        .map(|a| std::ffi::OsString::from(String::from_utf8_lossy(a).into_owned()));
    if let Err(e) = args::parse(argv) {
        one_line(&e.to_string());
    }
}

fn one_line(text: &str) {
    assert!(!text.contains(['\n', '\r']), "{text:?}");
    assert!(text.len() < 4096, "{}", text.len());
}

/// NRI request bytes, as the runtime sends them to a plugin: the lean decoder
/// returns under every layout, never panics; and on a message in canonical form
/// (what the generated code writes back is the input itself: no field given
/// twice, none unknown), it keeps exactly what the generated decoder reads;
/// with devgate's `LEAN`, of the pod's maps exactly the entries under its keys,
/// and the container's env only at a creation in a pod with an allocation.
pub fn nri_request(data: &[u8]) {
    use devgate::plugin::reads::LEAN;
    use nri::api::Event;
    use nri::lean::{decode, Keep, POD, POD_AND_CONTAINER, STATE_CHANGE};
    use nri::protobuf::Message;
    for layout in [POD_AND_CONTAINER, POD, STATE_CHANGE] {
        for keep in [Keep::ALL, LEAN] {
            for event in [
                None,
                Some(Event::CREATE_CONTAINER),
                Some(Event::REMOVE_CONTAINER),
            ] {
                let _ = decode(data, layout, keep, event);
            }
        }
    }
    let Ok(full) = nri::api::CreateContainerRequest::parse_from_bytes(data) else {
        return;
    };
    if full.write_to_bytes().ok().as_deref() != Some(data) {
        return;
    }
    let create = Some(Event::CREATE_CONTAINER);
    let lean =
        decode(data, POD_AND_CONTAINER, Keep::ALL, create).expect("canonical request decodes lean");
    let kept = decode(data, POD_AND_CONTAINER, LEAN, create).expect("and with devgate's keys");
    let removed = decode(data, POD_AND_CONTAINER, LEAN, Some(Event::REMOVE_CONTAINER))
        .expect("and as another event's request");
    assert!(removed.container.env.is_empty());
    let allocated = full
        .pod
        .annotations
        .contains_key(devgate::allocation::DEVICE_ALLOCATED);
    let env = if allocated {
        &full.container.env[..]
    } else {
        &[]
    };
    assert_eq!(kept.container.env, env);
    let only = |map: &std::collections::HashMap<String, String>, keys: nri::Keys| {
        let mut map = map.clone();
        map.retain(|k, _| keys.keeps(k.as_bytes()));
        map
    };
    assert_eq!(kept.pod.labels, only(&full.pod.labels, LEAN.labels));
    assert_eq!(
        kept.pod.annotations,
        only(&full.pod.annotations, LEAN.annotations)
    );
    let (p, lp) = (&full.pod, &lean.pod);
    assert_eq!(
        (
            &p.id,
            &p.name,
            &p.uid,
            &p.namespace,
            &p.labels,
            &p.annotations
        ),
        (
            &lp.id,
            &lp.name,
            &lp.uid,
            &lp.namespace,
            &lp.labels,
            &lp.annotations
        )
    );
    assert_eq!(p.linux.cgroup_parent, lp.linux.cgroup_parent);
    assert_eq!(p.linux.cgroups_path, lp.linux.cgroups_path);
    assert_eq!(p.linux.is_some(), lp.linux.is_some());
    let (c, lc) = (&full.container, &lean.container);
    assert_eq!(
        (&c.id, &c.pod_sandbox_id, &c.name, c.state, &c.env, c.pid),
        (
            &lc.id,
            &lc.pod_sandbox_id,
            &lc.name,
            lc.state,
            &lc.env,
            lc.pid
        )
    );
    assert_eq!(c.linux.cgroups_path, lc.linux.cgroups_path);
    assert!(lc.mounts.is_empty() && lc.args.is_empty() && lc.hooks.is_none());
}
