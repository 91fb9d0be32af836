//! CDI (Container Device Interface) specs for the node's devices, so that
//! podman, Docker, CRI-O and containerd users can ask for
//! `--device devgate.io/rdma=0000:19:00.2` without devgate's NRI plugin, and so
//! that `device_mode = "cdi"` can name devices in the NRI adjustment.
//!
//! Two kinds: `devgate.io/gpu` (each GPU by UUID and by minor) and
//! `devgate.io/rdma` (each RDMA PF and VF by PCI address). The device nodes of
//! each CDI device are exactly those devgate's planner grants a container that
//! is allocated that one device ([`generate`]); nodes that every device of a
//! kind needs (`nvidiactl`, `rdma_cm`) are spec-wide edits. Numbers come from
//! sysfs through the inventory and are always written, so runtimes never stat
//! the host path (CDI `container-edits_unix.go` fills only missing numbers).
//!
//! Rules: cncf-tags/container-device-interface SPEC.md (v1.1.0) and its parser
//! (`pkg/parser`), checked by [`validate`].

mod check;
mod generate;
mod validate;

pub use check::SpecDirs;
pub use generate::{generate, node, Generated};
pub use validate::{validate, version_at_least};

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The spec version written by default: the first with spec annotations
/// and dotted class names, understood by containerd 2.x and CRI-O.
pub const DEFAULT_CDI_VERSION: &str = "0.6.0";
/// Versions devgate writes: 0.5.0 (names starting with a digit, `hostPath`)
/// for runtimes that vendor an older CDI library, e.g. podman 4.3 (CDI v0.5.2),
/// up to 1.0.0; the spec's fields are the same in all of them (a runtime
/// refuses a version newer than its library, never an older one).
pub const WRITABLE_VERSIONS: [&str; 5] = ["0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0"];

pub const VENDOR: &str = "devgate.io";
pub const GPU_CLASS: &str = "gpu";
pub const RDMA_CLASS: &str = "rdma";

/// Upper bound on devices in one spec: a node has tens, never thousands.
pub const MAX_DEVICES: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error("cdi spec {kind}: {reason}")]
    Invalid { kind: String, reason: String },
    #[error("cdi spec {kind}: device {name:?}: {reason}")]
    InvalidDevice {
        kind: String,
        name: String,
        reason: String,
    },
    #[error("cdi version {version:?} is not one devgate writes (one of {WRITABLE_VERSIONS:?})")]
    Version { version: String },
    #[error("cdi device {name} is in no spec of {dirs:?}: write them with devgate cdi generate")]
    Unresolved { name: String, dirs: Vec<PathBuf> },
    #[error("cdi device {name} is named by two specs of one directory, {first} and {second}, and resolves to neither")]
    Conflict {
        name: String,
        first: PathBuf,
        second: PathBuf,
    },
    #[error("cdi spec {path} cannot be checked: {reason}")]
    Unchecked { path: PathBuf, reason: String },
    #[error(
        "cdi spec {path} is stale for {name}: {reason}; write it again with devgate cdi generate"
    )]
    Stale {
        name: String,
        path: PathBuf,
        reason: String,
    },
}

impl CdiError {
    /// The CDI device name the error is about, if one.
    pub fn device_name(&self) -> Option<&str> {
        match self {
            CdiError::Unresolved { name, .. }
            | CdiError::Conflict { name, .. }
            | CdiError::Stale { name, .. } => Some(name),
            _ => None,
        }
    }
}

/// The class of a devgate kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum)]
pub enum Class {
    Gpu,
    Rdma,
}

impl Class {
    pub const ALL: [Class; 2] = [Class::Gpu, Class::Rdma];

    pub fn name(self) -> &'static str {
        match self {
            Class::Gpu => GPU_CLASS,
            Class::Rdma => RDMA_CLASS,
        }
    }

    /// `devgate.io/gpu`.
    pub fn kind(self) -> String {
        format!("{VENDOR}/{}", self.name())
    }

    /// `devgate.io/gpu=<device>`, the name runtimes resolve.
    pub fn qualified(self, device: &str) -> String {
        format!("{VENDOR}/{}={device}", self.name())
    }

    /// The file name CDI's own tooling uses for a vendor and class
    /// (`GenerateSpecName`: `vendor-class`), with `.json`.
    pub fn file_name(self) -> String {
        format!("{VENDOR}-{}.json", self.name())
    }
}

/// A CDI spec document. Empty optional fields are left out: runtimes refuse
/// unknown fields and fields newer than `cdiVersion`, never missing optional ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    pub devices: Vec<Device>,
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Device {
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Required by the schema, and must not be empty (CDI `Device.validate`).
    pub container_edits: ContainerEdits,
}

/// The subset of CDI container edits devgate writes.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerEdits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
}

impl ContainerEdits {
    pub fn is_empty(&self) -> bool {
        self.env.is_empty() && self.device_nodes.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceNode {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    #[serde(rename = "type")]
    pub kind: String,
    pub major: i64,
    pub minor: i64,
    pub file_mode: u32,
    /// Cgroup access: devgate grants `rw`, never `m` (mknod).
    pub permissions: String,
}

/// Spec files larger than this are not read (for a check, not trusted):
/// devgate's are a few KiB per device.
pub const MAX_SPEC_BYTES: u64 = 16 << 20;

/// Whether `path` is named as CDI loads specs, `*.json` or `*.yaml`
/// (`pkg/cdi/spec-dirs.go`); either is read as YAML, JSON being YAML too.
pub fn spec_named(path: &std::path::Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("json" | "yaml")
    )
}

/// The `kind` a CDI spec file declares, read as CDI reads every spec file
/// whatever its name (`ParseSpec`: sigs.k8s.io/yaml's `UnmarshalStrict`).
/// That reads the first YAML document (JSON is YAML too), merge keys
/// applied, refuses a mapping that names a key twice, and turns it into
/// JSON through a Go map, whose keys `json.Marshal` sorts; encoding/json
/// then sets the field at every key that matches `kind` without regard to
/// case, so the byte-greatest such key wins, wherever it is written. `None`
/// when the text declares none or does not parse, as CDI loads no spec from
/// it either.
pub fn declared_kind(text: &str) -> Option<String> {
    let keys = match serde_json::from_str::<TopLevel>(text) {
        Ok(top) => top.0,
        Err(_) => yaml_top_level(text)?,
    };
    let mut names: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
    names.sort_unstable();
    if names.windows(2).any(|w| w[0] == w[1]) {
        return None;
    }
    keys.into_iter()
        .filter(|(k, _)| go_fold_eq(k, "kind"))
        .max_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()))?
        .1
}

/// The first YAML document's top-level keys, with the values that are
/// strings (a tag such as `!foo` set aside, as Go's YAML reads a local
/// tag's scalar). A merge key's mappings are merged; a document with a key
/// twice is refused by the parser.
fn yaml_top_level(text: &str) -> Option<Vec<(String, Option<String>)>> {
    use serde::Deserialize;
    use serde_yaml_ng::Value;
    let doc = serde_yaml_ng::Deserializer::from_str(text).next()?;
    let mut value = Value::deserialize(doc).ok()?;
    value.apply_merge().ok()?;
    let Value::Mapping(map) = value else {
        return None;
    };
    let text_of = |v: Value| match v {
        Value::String(s) => Some(s),
        Value::Tagged(t) => match t.value {
            Value::String(s) => Some(s),
            _ => None,
        },
        _ => None,
    };
    Some(
        map.into_iter()
            .filter_map(|(k, v)| Some((text_of(k)?, text_of(v))))
            .collect(),
    )
}

/// The text of a spec file's bytes: UTF-8, or UTF-16 after its byte-order
/// mark, which Go's YAML reader decodes too (`yaml_parser_determine_encoding`).
/// `None` for anything else, which no runtime's parser reads either.
pub fn spec_text(bytes: Vec<u8>) -> Option<String> {
    let units = |be: bool| {
        bytes[2..]
            .chunks(2)
            .map(|c| match (c, be) {
                ([a, b], true) => Some(u16::from_be_bytes([*a, *b])),
                ([a, b], false) => Some(u16::from_le_bytes([*a, *b])),
                _ => None,
            })
            .collect::<Option<Vec<u16>>>()
    };
    match bytes.get(..2) {
        Some([0xff, 0xfe]) => String::from_utf16(&units(false)?).ok(),
        Some([0xfe, 0xff]) => String::from_utf16(&units(true)?).ok(),
        _ => String::from_utf8(bytes).ok(),
    }
}

/// A document's top-level keys with the values that are strings, in the
/// order written (serde_json's map sorts them and keeps one of a key named
/// twice).
struct TopLevel(Vec<(String, Option<String>)>);

impl<'de> serde::Deserialize<'de> for TopLevel {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Keys;
        impl<'de> serde::de::Visitor<'de> for Keys {
            type Value = TopLevel;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a mapping")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<TopLevel, A::Error> {
                let mut keys = Vec::new();
                while let Some((key, value)) = map.next_entry::<String, serde_json::Value>()? {
                    keys.push((key, value.as_str().map(str::to_owned)));
                }
                Ok(TopLevel(keys))
            }
        }
        d.deserialize_map(Keys)
    }
}

/// Go's `strings.EqualFold` against a lower-case ASCII `name`: ASCII letters
/// in either case, and the Kelvin sign, which folds to `k`.
fn go_fold_eq(key: &str, name: &str) -> bool {
    let folded = key.chars().map(|c| match c {
        '\u{212a}' => 'k',
        c => c.to_ascii_lowercase(),
    });
    folded.eq(name.chars())
}

#[cfg(test)]
mod tests;
