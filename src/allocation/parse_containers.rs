//! `devgate.io/containers`: which of a pod's containers get its devices.

use super::super::{AllocationError, ContainerSelector, CONTAINERS, MAX_CONTAINERS};
use super::clip;

/// Parses `devgate.io/containers`: comma-separated container names.
pub(in crate::allocation) fn parse_containers(
    text: &str,
) -> Result<ContainerSelector, AllocationError> {
    const ANN: &str = CONTAINERS;
    // 64 names of at most 63 characters, with separators and spaces.
    let limit = MAX_CONTAINERS * 66;
    if text.len() > limit {
        return Err(AllocationError::TooLarge {
            annotation: ANN,
            len: text.len(),
            limit,
        });
    }
    let mut names: Vec<String> = Vec::new();
    for (i, name) in text.split(',').map(str::trim).enumerate() {
        let entry = format!("[{i}]");
        if names.len() == MAX_CONTAINERS {
            return Err(AllocationError::TooMany {
                annotation: ANN,
                entry,
                what: "containers",
                limit: MAX_CONTAINERS,
            });
        }
        if !is_dns_label(name) {
            return Err(AllocationError::BadName {
                annotation: ANN,
                entry,
                field: "container name".into(),
                value: clip(name),
            });
        }
        if let Some(first) = names.iter().position(|n| n == name) {
            return Err(AllocationError::Duplicate {
                annotation: ANN,
                entry,
                what: format!("container {name}"),
                first: format!("[{first}]"),
            });
        }
        names.push(name.to_string());
    }
    Ok(ContainerSelector::Only(names))
}

/// A container or namespace name: an RFC 1123 label, as Kubernetes validates it.
pub(crate) fn is_dns_label(s: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| alnum(b) || b == b'-')
        && s.bytes().next().is_some_and(alnum)
        && s.bytes().last().is_some_and(alnum)
}
