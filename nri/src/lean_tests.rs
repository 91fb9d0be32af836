use protobuf::{Message, MessageField};

use super::*;
use crate::api::{self, ContainerState};

pub(super) fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub(super) fn resources() -> api::LinuxResources {
    let mut r = api::LinuxResources::default();
    r.memory.mut_or_insert_default().limit = MessageField::some(api::OptionalInt64 {
        value: 1 << 30,
        ..Default::default()
    });
    r.cpu.mut_or_insert_default().cpus = "0-3".into();
    r.unified = map(&[("memory.high", "max")]);
    r
}

/// A pod with every field set, kept or not.
pub(super) fn full_pod() -> PodSandbox {
    let mut linux = LinuxPodSandbox {
        cgroup_parent: "kubepods-besteffort.slice".into(),
        cgroups_path: "kubepods-besteffort.slice:cri-containerd:abc".into(),
        namespaces: ["ipc", "network", "uts"]
            .iter()
            .map(|t| api::LinuxNamespace {
                type_: t.to_string(),
                path: format!("/var/run/netns/cni-1-{t}"),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    linux.pod_overhead = MessageField::some(resources());
    linux.pod_resources = MessageField::some(resources());
    linux.resources = MessageField::some(resources());
    PodSandbox {
        id: "sandbox-1".into(),
        name: "trainer-0".into(),
        uid: "0f9c".into(),
        namespace: "ml".into(),
        labels: map(&[("app", "trainer"), ("", "empty key")]),
        annotations: map(&[
            (
                "scheduling.koordinator.sh/device-allocated",
                r#"{"gpu":[]}"#,
            ),
            ("empty", ""),
        ]),
        runtime_handler: "runc".into(),
        linux: MessageField::some(linux),
        pid: 4242,
        ips: vec!["10.0.0.7".into()],
        ..Default::default()
    }
}

/// A container with every field set, kept or not.
pub(super) fn full_container() -> Container {
    let hook = api::Hook {
        path: "/usr/local/bin/h".into(),
        args: vec!["h".into(), "x".into()],
        env: vec!["A=1".into()],
        ..Default::default()
    };
    let mut linux = LinuxContainer {
        namespaces: vec![api::LinuxNamespace {
            type_: "pid".into(),
            ..Default::default()
        }],
        devices: vec![api::LinuxDevice {
            path: "/dev/fuse".into(),
            type_: "c".into(),
            major: 10,
            minor: 229,
            ..Default::default()
        }],
        cgroups_path: "kubepods-besteffort.slice:cri-containerd:def".into(),
        sysctl: map(&[("net.core.somaxconn", "1024")]),
        ..Default::default()
    };
    linux.resources = MessageField::some(resources());
    linux.oom_score_adj = MessageField::some(api::OptionalInt {
        value: -997,
        ..Default::default()
    });
    let mut hooks = api::Hooks::default();
    hooks.prestart.push(hook.clone());
    hooks.poststop.push(hook);
    Container {
        id: "ctr-1".into(),
        pod_sandbox_id: "sandbox-1".into(),
        name: "main".into(),
        state: ContainerState::CONTAINER_RUNNING.into(),
        labels: map(&[("io.kubernetes.container.name", "main")]),
        annotations: map(&[("io.kubernetes.cri.container-type", "container")]),
        args: vec!["sh".into(), "-c".into(), "sleep 1".into()],
        env: vec!["PATH=/bin".into(), "NCCL_DEBUG=INFO".into(), "=".into()],
        mounts: vec![api::Mount {
            destination: "/etc/hosts".into(),
            type_: "bind".into(),
            source: "/var/lib/hosts".into(),
            options: vec!["rbind".into(), "ro".into()],
            ..Default::default()
        }],
        hooks: MessageField::some(hooks),
        linux: MessageField::some(linux),
        pid: 99,
        rlimits: vec![api::POSIXRlimit {
            type_: "RLIMIT_NOFILE".into(),
            hard: 1 << 20,
            soft: 1024,
            ..Default::default()
        }],
        created_at: 1,
        started_at: 2,
        finished_at: 3,
        exit_code: -1,
        status_reason: "r".into(),
        status_message: "m".into(),
        CDI_devices: vec![api::CDIDevice {
            name: "vendor.com/gpu=0".into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// What a lean decode keeps of `pod`: the module docs' list.
pub(super) fn lean_pod(pod: &PodSandbox) -> PodSandbox {
    let linux = pod.linux.as_ref().map(|l| LinuxPodSandbox {
        cgroup_parent: l.cgroup_parent.clone(),
        cgroups_path: l.cgroups_path.clone(),
        namespaces: l
            .namespaces
            .iter()
            .map(|n| api::LinuxNamespace {
                type_: n.type_.clone(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    });
    PodSandbox {
        id: pod.id.clone(),
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        namespace: pod.namespace.clone(),
        labels: pod.labels.clone(),
        annotations: pod.annotations.clone(),
        linux: linux.into(),
        pid: pod.pid,
        ..Default::default()
    }
}

pub(super) fn lean_container(ctr: &Container) -> Container {
    let linux = ctr.linux.as_ref().map(|l| LinuxContainer {
        cgroups_path: l.cgroups_path.clone(),
        ..Default::default()
    });
    Container {
        id: ctr.id.clone(),
        pod_sandbox_id: ctr.pod_sandbox_id.clone(),
        name: ctr.name.clone(),
        state: ctr.state,
        env: ctr.env.clone(),
        pid: ctr.pid,
        linux: linux.into(),
        ..Default::default()
    }
}

pub(super) fn create(pod: PodSandbox, container: Container) -> api::CreateContainerRequest {
    api::CreateContainerRequest {
        pod: MessageField::some(pod),
        container: MessageField::some(container),
        ..Default::default()
    }
}

#[test]
fn keeps_exactly_the_listed_fields_of_every_layout() {
    let (pod, ctr) = (full_pod(), full_container());
    let request = create(pod.clone(), ctr.clone());
    let parts = decode(
        &request.write_to_bytes().unwrap(),
        POD_AND_CONTAINER,
        Keep::ALL,
        Some(Event::CREATE_CONTAINER),
    )
    .unwrap();
    assert_eq!(parts.pod, lean_pod(&pod));
    assert_eq!(parts.container, lean_container(&ctr));
    assert_eq!(parts.event.value(), 0);

    let event = api::StateChangeEvent {
        event: Event::REMOVE_CONTAINER.into(),
        pod: MessageField::some(pod.clone()),
        container: MessageField::some(ctr.clone()),
        ..Default::default()
    };
    let parts = decode(
        &event.write_to_bytes().unwrap(),
        STATE_CHANGE,
        Keep::ALL,
        None,
    )
    .unwrap();
    assert_eq!(parts.event.enum_value(), Ok(Event::REMOVE_CONTAINER));
    assert_eq!(parts.pod, lean_pod(&pod));
    assert_eq!(parts.container, lean_container(&ctr));

    let stop = api::StopPodSandboxRequest {
        pod: MessageField::some(pod.clone()),
        ..Default::default()
    };
    let parts = decode(&stop.write_to_bytes().unwrap(), POD, Keep::ALL, None).unwrap();
    assert_eq!(parts.pod, lean_pod(&pod));
    assert_eq!(parts.container, Container::default());
}

#[test]
fn absent_parts_stay_default_and_empty_messages_decode() {
    let parts = decode(&[], POD_AND_CONTAINER, Keep::ALL, None).unwrap();
    assert_eq!(parts, Parts::default());
    let bare = api::CreateContainerRequest {
        pod: MessageField::some(PodSandbox::default()),
        ..Default::default()
    };
    let parts = decode(
        &bare.write_to_bytes().unwrap(),
        POD_AND_CONTAINER,
        Keep::ALL,
        Some(Event::CREATE_CONTAINER),
    )
    .unwrap();
    assert_eq!(parts.pod, PodSandbox::default());
}

#[test]
fn repeated_fields_merge_as_protobuf_does() {
    // Two encodings concatenated are one message with both sets of fields
    // (protobuf encoding guide, "Last One Wins" and merging): scalars keep
    // the last value, maps and lists accumulate, embedded messages merge.
    // Go's protobuf, which the runtime uses, does the same; rust-protobuf 3
    // replaces an embedded message given twice instead.
    let first = create(full_pod(), full_container());
    let mut pod = PodSandbox {
        name: "renamed".into(),
        labels: map(&[("app", "other"), ("tier", "gpu")]),
        ..Default::default()
    };
    pod.linux.mut_or_insert_default().cgroups_path = "second".into();
    let second = create(
        pod,
        Container {
            env: vec!["X=1".into()],
            ..Default::default()
        },
    );
    let mut bytes = first.write_to_bytes().unwrap();
    bytes.extend(second.write_to_bytes().unwrap());
    let parts = decode(&bytes, POD_AND_CONTAINER, Keep::ALL, None).unwrap();
    let mut want = lean_pod(&full_pod());
    want.name = "renamed".into();
    want.labels.insert("app".into(), "other".into());
    want.labels.insert("tier".into(), "gpu".into());
    want.linux.mut_or_insert_default().cgroups_path = "second".into();
    assert_eq!(parts.pod, want);
    let mut want = lean_container(&full_container());
    want.env.push("X=1".into());
    assert_eq!(parts.container, want);
    assert_eq!(parts.pod.labels["app"], "other");
    assert_eq!(parts.pod.linux.cgroup_parent, "kubepods-besteffort.slice");
    assert_eq!(parts.pod.linux.cgroups_path, "second");
}

#[test]
fn map_keys_keep_only_the_named_entries() {
    let keys = Keep {
        labels: Keys::Only(&["app", "absent"]),
        annotations: Keys::Only(&["scheduling.koordinator.sh/device-allocated"]),
        env: EnvAt::Every,
    };
    let request = create(full_pod(), full_container());
    let parts = decode(
        &request.write_to_bytes().unwrap(),
        POD_AND_CONTAINER,
        keys,
        None,
    )
    .unwrap();
    assert_eq!(parts.pod.labels, map(&[("app", "trainer")]));
    assert_eq!(
        parts.pod.annotations,
        map(&[(
            "scheduling.koordinator.sh/device-allocated",
            r#"{"gpu":[]}"#
        )])
    );
    let mut want = lean_pod(&full_pod());
    (want.labels, want.annotations) = (parts.pod.labels.clone(), parts.pod.annotations.clone());
    assert_eq!(parts.pod, want, "every other kept field as before");
    assert_eq!(parts.container, lean_container(&full_container()));

    // A key matches byte for byte: no prefix, no case folding.
    for key in ["ap", "apps", "App"] {
        let pod = PodSandbox {
            labels: map(&[(key, "v")]),
            ..Default::default()
        };
        let bytes = create(pod, Container::default()).write_to_bytes().unwrap();
        let parts = decode(&bytes, POD_AND_CONTAINER, keys, None).unwrap();
        assert!(parts.pod.labels.is_empty(), "{key}");
    }

    // A kept key given twice keeps its last value, as with every key.
    let twice = |value: &str| PodSandbox {
        labels: map(&[("app", value), ("other", value)]),
        ..Default::default()
    };
    let mut bytes = create(twice("first"), Container::default())
        .write_to_bytes()
        .unwrap();
    bytes.extend(
        create(twice("last"), Container::default())
            .write_to_bytes()
            .unwrap(),
    );
    let parts = decode(&bytes, POD_AND_CONTAINER, keys, None).unwrap();
    assert_eq!(parts.pod.labels, map(&[("app", "last")]));
}

#[test]
fn an_entry_not_kept_is_not_validated_and_a_kept_one_is() {
    // pod (field 1) { labels (field 5) { key "k", value 0xc3 0x28 } }: the
    // value is not UTF-8.
    let entry = [0x0a, 1, b'k', 0x12, 2, 0xc3, 0x28];
    let mut labels = vec![0x2a, entry.len() as u8];
    labels.extend(entry);
    let mut bytes = vec![0x0a, labels.len() as u8];
    bytes.extend(labels);
    let only = |keys: &'static [&'static str]| Keep {
        labels: Keys::Only(keys),
        ..Keep::ALL
    };
    let parts = decode(&bytes, POD_AND_CONTAINER, only(&["other"]), None).unwrap();
    assert!(parts.pod.labels.is_empty());
    for keys in [only(&["k"]), Keep::ALL] {
        assert_eq!(
            decode(&bytes, POD_AND_CONTAINER, keys, None),
            Err(WireError::NotUtf8 { field: 2 }),
            "{keys:?}"
        );
    }
}

#[test]
fn malformed_requests_fail_and_never_panic() {
    let req = create(full_pod(), full_container());
    let bytes = req.write_to_bytes().unwrap();
    for end in 0..bytes.len() {
        let _ = decode(&bytes[..end], POD_AND_CONTAINER, Keep::ALL, None);
    }
    // The pod's name (pod field 1 -> name field 2) is not UTF-8.
    let bad = [0x0a, 4, 0x12, 2, 0xc3, 0x28];
    assert_eq!(
        decode(&bad, POD_AND_CONTAINER, Keep::ALL, None),
        Err(WireError::NotUtf8 { field: 2 })
    );
    // A group left open, one closed by another's tag, one nested too deep.
    let group = [0x0a, 1, 3 << 3 | 3];
    assert_eq!(
        decode(&group, POD_AND_CONTAINER, Keep::ALL, None),
        Err(WireError::Group { field: 3, at: 1 })
    );
    let crossed = [3 << 3 | 3, 5 << 3 | 4];
    assert_eq!(
        decode(&crossed, POD_AND_CONTAINER, Keep::ALL, None),
        Err(WireError::Group { field: 5, at: 2 })
    );
    // 100 groups nested and closed are skipped, as the full decoder skips
    // them; a 101st inside is refused as too deep (its tag ends at byte
    // 101), not as left open.
    let nested = |n: usize| [vec![3 << 3 | 3; n], vec![3 << 3 | 4; n]].concat();
    assert!(api::CreateContainerRequest::parse_from_bytes(&nested(40)).is_ok());
    assert!(decode(&nested(40), POD_AND_CONTAINER, Keep::ALL, None).is_ok());
    assert!(decode(&nested(100), POD_AND_CONTAINER, Keep::ALL, None).is_ok());
    assert_eq!(
        decode(&nested(101), POD_AND_CONTAINER, Keep::ALL, None),
        Err(WireError::TooDeep { field: 3, at: 101 })
    );
}

/// An unknown group (proto2's wire types 3 and 4), nested or not, is skipped
/// as protobuf's own parsers skip it: the request reads as without it.
#[test]
fn unknown_groups_are_skipped() {
    let req = create(full_pod(), full_container());
    let bytes = req.write_to_bytes().unwrap();
    let plain = decode(&bytes, POD_AND_CONTAINER, Keep::ALL, None);
    assert!(plain.is_ok());
    let mut grouped = bytes.clone();
    // Group 99 { varint 1 = 5; group 2 { fixed32 3 }; } (keys as varints).
    grouped.extend_from_slice(&[
        0x9b, 0x06, 0x08, 5, 0x13, 0x1d, 1, 2, 3, 4, 0x14, 0x9c, 0x06,
    ]);
    assert_eq!(decode(&grouped, POD_AND_CONTAINER, Keep::ALL, None), plain);
}

#[path = "lean_env_tests.rs"]
mod env;

#[path = "lean_namespace_tests.rs"]
mod namespaces;
