//! Which requests keep the container's env: the events and the pod
//! annotations the plugin names.

use protobuf::{Message, MessageField};

use super::*;
use crate::api;

#[test]
fn env_is_kept_at_the_events_named() {
    let keep = Keep {
        env: EnvAt::Only {
            events: EventMask::of(Event::CREATE_CONTAINER),
            pods_annotated: Keys::All,
        },
        ..Keep::ALL
    };
    let (pod, ctr) = (full_pod(), full_container());
    let no_env = Container {
        env: Vec::new(),
        ..lean_container(&ctr)
    };
    let create = create(pod.clone(), ctr.clone()).write_to_bytes().unwrap();
    let at = |event| decode(&create, POD_AND_CONTAINER, keep, Some(event)).unwrap();
    assert_eq!(at(Event::CREATE_CONTAINER).container, lean_container(&ctr));
    // The same message as another event's request: every other field kept.
    assert_eq!(at(Event::REMOVE_CONTAINER).container, no_env);
    assert_eq!(at(Event::REMOVE_CONTAINER).pod, lean_pod(&pod));

    let change = |event: i32| api::StateChangeEvent {
        event: protobuf::EnumOrUnknown::from_i32(event),
        pod: MessageField::some(pod.clone()),
        container: MessageField::some(ctr.clone()),
        ..Default::default()
    };
    let remove = change(Event::REMOVE_CONTAINER as i32);
    let parts = decode(&remove.write_to_bytes().unwrap(), STATE_CHANGE, keep, None).unwrap();
    assert_eq!(parts.container, no_env);
    // An event this proto does not know: the env is kept.
    let newer = change(99).write_to_bytes().unwrap();
    let parts = decode(&newer, STATE_CHANGE, keep, None).unwrap();
    assert_eq!(parts.container, lean_container(&ctr));
    // Fields in any order are valid protobuf: the container before the
    // event and the pod is decoded knowing both.
    let reordered = [
        api::StateChangeEvent {
            container: remove.container.clone(),
            ..Default::default()
        },
        api::StateChangeEvent {
            event: remove.event,
            pod: remove.pod.clone(),
            ..Default::default()
        },
    ]
    .map(|part| part.write_to_bytes().unwrap())
    .concat();
    let parts = decode(&reordered, STATE_CHANGE, keep, None).unwrap();
    assert_eq!(parts.event.enum_value(), Ok(Event::REMOVE_CONTAINER));
    assert_eq!((parts.pod, parts.container), (lean_pod(&pod), no_env));

    // An env variable not kept is not validated: here it is not UTF-8.
    let bad_env = [0x12, 4, 0x42, 2, 0xc3, 0x28];
    let bad = |event| decode(&bad_env, POD_AND_CONTAINER, keep, Some(event));
    assert!(bad(Event::REMOVE_CONTAINER).is_ok());
    assert_eq!(
        bad(Event::CREATE_CONTAINER),
        Err(WireError::NotUtf8 { field: 8 })
    );
}

#[test]
fn env_is_kept_for_pods_annotated_as_named() {
    let keep = Keep {
        env: EnvAt::Only {
            events: EventMask::of(Event::CREATE_CONTAINER),
            pods_annotated: Keys::Only(&["empty", "absent"]),
        },
        ..Keep::ALL
    };
    let ctr = full_container();
    let with = |annotations| {
        let pod = PodSandbox {
            annotations,
            ..full_pod()
        };
        let bytes = create(pod, ctr.clone()).write_to_bytes().unwrap();
        let parts = decode(
            &bytes,
            POD_AND_CONTAINER,
            keep,
            Some(Event::CREATE_CONTAINER),
        );
        parts.unwrap().container.env
    };
    // An empty value is an annotation all the same.
    assert_eq!(with(map(&[("empty", "")])), ctr.env);
    assert_eq!(with(map(&[("other", "x")])), Vec::<String>::new());
    assert_eq!(with(HashMap::new()), Vec::<String>::new());
    // The pod after its container: decoded first all the same.
    let pod = PodSandbox {
        annotations: map(&[("absent", "now present")]),
        ..Default::default()
    };
    let bytes = [
        create(PodSandbox::default(), ctr.clone()),
        create(pod, Container::default()),
    ]
    .map(|part| part.write_to_bytes().unwrap())
    .concat();
    let parts = decode(
        &bytes,
        POD_AND_CONTAINER,
        keep,
        Some(Event::CREATE_CONTAINER),
    )
    .unwrap();
    assert_eq!(parts.container.env, ctr.env);
    // A key the annotations' own keys skip is never seen on the pod.
    let narrowed = Keep {
        annotations: Keys::Only(&["other"]),
        ..keep
    };
    let bytes = create(
        PodSandbox {
            annotations: map(&[("empty", "")]),
            ..Default::default()
        },
        ctr.clone(),
    );
    let parts = decode(
        &bytes.write_to_bytes().unwrap(),
        POD_AND_CONTAINER,
        narrowed,
        Some(Event::CREATE_CONTAINER),
    );
    assert!(parts.unwrap().container.env.is_empty());
}
