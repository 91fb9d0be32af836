//! The config values the plan relies on, checked before planning.

use super::PlanError;
use crate::config::{Config, ConfigError};

/// Config values the plan uses as paths and names; checked here too because a
/// `Config` can be built in memory, not only parsed.
pub(super) fn check_config(config: &Config) -> Result<(), PlanError> {
    let invalid = |key: &str, reason: &str| PlanError::Config {
        key: key.to_string(),
        reason: reason.to_string(),
    };
    for (key, path) in [
        ("hami.library_path", &config.hami.library_path),
        ("hami.lock_dir", &config.hami.lock_dir),
    ] {
        let p = std::path::Path::new(path);
        if !p.is_absolute()
            || p.components().any(|c| c == std::path::Component::ParentDir)
            || path.contains('\0')
        {
            return Err(invalid(key, "must be an absolute path without .."));
        }
    }
    let prefix = &config.rdma.ifname_prefix;
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
    if config.device_file_mode > 0o777 {
        return Err(invalid("device_file_mode", "must be at most 0o777"));
    }
    match config
        .vf
        .validate()
        .and_then(|()| config.comm_env.validate())
    {
        Err(ConfigError::Invalid { key, reason }) => Err(PlanError::Config { key, reason }),
        Err(other) => Err(invalid("vf", &other.to_string())),
        Ok(()) => Ok(()),
    }
}
