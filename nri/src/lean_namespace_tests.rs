//! The pod's namespaces under the lean decode: each entry's type kept, its
//! path stepped over.

use super::*;

#[test]
fn namespace_types_are_kept_and_their_paths_neither_kept_nor_validated() {
    // pod (1) { linux (8) { namespaces (5) { type (1), path (2) } } }.
    let pod_with = |kind: &[u8], path: &[u8]| {
        let mut ns = vec![0x0a, kind.len() as u8];
        ns.extend(kind);
        ns.extend([0x12, path.len() as u8]);
        ns.extend(path);
        let mut linux = vec![0x2a, ns.len() as u8];
        linux.extend(ns);
        let mut pod = vec![0x42, linux.len() as u8];
        pod.extend(linux);
        let mut bytes = vec![0x0a, pod.len() as u8];
        bytes.extend(pod);
        bytes
    };
    let types = |bytes: &[u8]| -> Result<Vec<String>, WireError> {
        let parts = decode(bytes, POD_AND_CONTAINER, Keep::ALL, None)?;
        let linux = parts.pod.linux.into_option().unwrap_or_default();
        assert!(linux.namespaces.iter().all(|n| n.path.is_empty()));
        Ok(linux.namespaces.into_iter().map(|n| n.type_).collect())
    };
    // A path that is not UTF-8 is stepped over; a type that is not is refused.
    assert_eq!(
        types(&pod_with(b"network", &[0xc3, 0x28])).unwrap(),
        ["network"]
    );
    assert_eq!(
        types(&pod_with(&[0xc3, 0x28], b"/proc/1/ns/ipc")),
        Err(WireError::NotUtf8 { field: 1 })
    );
    let mut two = pod_with(b"ipc", b"/proc/1/ns/ipc");
    two.extend(pod_with(b"network", b""));
    assert_eq!(types(&two).unwrap(), ["ipc", "network"]);
}
