//! Checks of config values serde's types cannot express: absolute paths,
//! bounded lists, names and modes.

use std::path::Path;

use super::{Config, ConfigError, MAX_HOOK_TIMEOUT_SECS};

/// Entries of `cdi_spec_dirs`.
const MAX_CDI_SPEC_DIRS: usize = 8;
/// Entries of `gpu.ignored_pods`.
const MAX_IGNORED_PODS: usize = 64;

/// `<namespace>/<pod-name-prefix>`: a namespace name (RFC 1123 label) and a
/// non-empty prefix of pod-name characters. An empty prefix would take in
/// every pod of the namespace, which no daemon's name needs.
fn is_pod_pattern(p: &str) -> bool {
    let Some((ns, prefix)) = p.split_once('/') else {
        return false;
    };
    let name_char = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.';
    crate::allocation::is_dns_label(ns)
        && (1..=253).contains(&prefix.len())
        && prefix.bytes().all(name_char)
}

impl Config {
    /// runc runs a hook only by an absolute path (runtime-spec config.md, "POSIX-
    /// platform Hooks"), and a relative state directory would be taken from the
    /// hook's working directory, the bundle: refuse both at start, not at the
    /// first container with a VF. So are the GPU health directory and a full
    /// reset without a command.
    pub(super) fn validate_hook_paths(&self) -> Result<(), ConfigError> {
        for (key, value) in [
            ("hook_path", &self.hook_path),
            ("hook_state_dir", &self.hook_state_dir),
        ] {
            if !value.is_empty() && !value.starts_with('/') {
                return Err(ConfigError::Invalid {
                    key: key.to_string(),
                    reason: format!("a path must be absolute: {value:?}"),
                });
            }
        }
        // The health marks are read by the hook too, whose working directory
        // is the bundle: a relative directory would be a different one there.
        if !self.gpu.health_dir.is_absolute() {
            return Err(ConfigError::Invalid {
                key: "gpu.health_dir".to_string(),
                reason: format!("a path must be absolute: {:?}", self.gpu.health_dir),
            });
        }
        if self.gpu.ignored_pods.len() > MAX_IGNORED_PODS
            || !self.gpu.ignored_pods.iter().all(|p| is_pod_pattern(p))
        {
            return Err(ConfigError::Invalid {
                key: "gpu.ignored_pods".to_string(),
                reason: format!(
                    "at most {MAX_IGNORED_PODS} entries of <namespace>/<daemonset-name>"
                ),
            });
        }
        for entry in &self.gpu.ignored_cgroups {
            if let Some(reason) = crate::gpu::ignored_cgroup_problem(entry) {
                return Err(ConfigError::Invalid {
                    key: "gpu.ignored_cgroups".to_string(),
                    reason: format!("{entry:?}: {reason}"),
                });
            }
        }
        if self.cdi_spec_dirs.len() > MAX_CDI_SPEC_DIRS
            || !self.cdi_spec_dirs.iter().all(|d| d.is_absolute())
        {
            return Err(ConfigError::Invalid {
                key: "cdi_spec_dirs".to_string(),
                reason: format!("at most {MAX_CDI_SPEC_DIRS} absolute paths"),
            });
        }
        // Every release would fail on it and quarantine its GPU for good.
        if self.gpu.full_reset && self.gpu.reset_command.first().is_none_or(|c| c.is_empty()) {
            return Err(ConfigError::Invalid {
                key: "gpu.reset_command".to_string(),
                reason: "gpu.full_reset needs a command".to_string(),
            });
        }
        Ok(())
    }

    /// The values the plan and the hook take as paths, names, modes and
    /// times: checked when the config is parsed, so that a bad one fails the
    /// config (and `devgate doctor`) instead of every container that needs
    /// devgate; the plan checks them again for a config built in memory.
    pub fn validate_plan_values(&self) -> Result<(), ConfigError> {
        let invalid = |key: &str, reason: &str| ConfigError::Invalid {
            key: key.to_string(),
            reason: reason.to_string(),
        };
        for (key, path) in [
            ("hami.library_path", &self.hami.library_path),
            ("hami.lock_dir", &self.hami.lock_dir),
            ("hami.host_lock_dir", &self.hami.host_lock_dir),
        ] {
            let p = Path::new(path);
            if !p.is_absolute()
                || p.components().any(|c| c == std::path::Component::ParentDir)
                || path.contains('\0')
            {
                return Err(invalid(key, "must be an absolute path without .."));
            }
        }
        // The library goes into LD_PRELOAD, which ld.so splits at spaces and
        // colons and in which it expands `$LIB`, `$ORIGIN` and `$PLATFORM`
        // (ld.so(8)): such a path would preload something else, or nothing,
        // and the shares' limits would go unenforced without a word. Any `$`
        // is refused, the simpler rule.
        if self.hami.library_path.contains([' ', ':', '$']) {
            return Err(invalid(
                "hami.library_path",
                "must hold no space, colon or $: LD_PRELOAD splits at the first two and expands $ORIGIN, $LIB and $PLATFORM",
            ));
        }
        let prefix = &self.rdma.ifname_prefix;
        // IFNAMSIZ is 16 with the NUL: leave room for 4 digits.
        if prefix.is_empty()
            || prefix.len() > 11
            || !prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(invalid(
                "rdma.ifname_prefix",
                "must be 1 to 11 characters of [A-Za-z0-9_-]",
            ));
        }
        if self.device_file_mode > 0o777 {
            return Err(invalid(
                "device_file_mode",
                "must be at most 0o777 (write it in octal: 0o666; 666 is decimal)",
            ));
        }
        // The OCI runtime spec: a hook's timeout must be greater than zero.
        if !(1..=MAX_HOOK_TIMEOUT_SECS).contains(&self.hook_timeout_secs) {
            return Err(invalid(
                "hook_timeout_secs",
                "must be 1 to 3600 (runc kills a hook at once with 0)",
            ));
        }
        Ok(())
    }
}

/// `device_file_mode` must be written in octal (`0o660`): TOML keeps no radix
/// once a number is read, and a mode written as in chmod(1), `440`, would
/// read as decimal 440, that is 0o670, a group-writable device node, yet pass
/// the bound. So the text the value was read from is looked at.
pub(super) fn mode_written_in_octal(text: &str) -> Result<(), ConfigError> {
    #[derive(serde::Deserialize)]
    struct Written {
        device_file_mode: Option<toml::Spanned<u32>>,
    }
    // Read a second time only where the key can be: written out, or behind
    // an escape in a quoted key (`"device\u005ffile_mode"`). The hook reads
    // the config at every container of a hooks-only node.
    if !text.contains("device_file_mode") && !text.contains('\\') {
        return Ok(());
    }
    // The whole config was read already: a text this cannot read sets no mode.
    let Ok(Written {
        device_file_mode: Some(mode),
    }) = toml::from_str::<Written>(text)
    else {
        return Ok(());
    };
    let written = text.get(mode.span()).unwrap_or_default();
    let value = *mode.get_ref();
    // 0 to 7 read the same in either radix.
    if written.starts_with("0o") || value < 8 {
        return Ok(());
    }
    Err(ConfigError::Invalid {
        key: "device_file_mode".to_string(),
        reason: format!("must be written in octal, such as 0o660: {written} is 0o{value:o}"),
    })
}
