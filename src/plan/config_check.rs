//! The config values the plan relies on, checked before planning.

use super::PlanError;
use crate::config::{Config, ConfigError};

/// Config values the plan uses as paths and names; checked here too because a
/// `Config` can be built in memory, not only parsed.
pub(super) fn check_config(config: &Config) -> Result<(), PlanError> {
    let to_plan = |e: ConfigError| match e {
        ConfigError::Invalid { key, reason } => PlanError::Config { key, reason },
        other => PlanError::Config {
            key: "config".to_string(),
            reason: other.to_string(),
        },
    };
    config.validate_plan_values().map_err(to_plan)?;
    config
        .vf
        .validate()
        .and_then(|()| config.comm_env.validate())
        .map_err(to_plan)
}
