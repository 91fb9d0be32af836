//! The runtime part of `devgate status`: which runtime configured the plugin
//! last and what the adjustments use there (the record `devgate nri` writes at
//! Configure).
use std::fmt::Write as _;

use crate::config::DeviceMode;
use crate::plugin::features::RuntimeRecord;

fn mode(m: DeviceMode) -> &'static str {
    match m {
        DeviceMode::Nodes => "device nodes",
        DeviceMode::Cdi => "cdi names",
    }
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// A few people-readable lines; `running`: whether the plugin process that
/// wrote the record still runs, where that is known.
pub fn table(record: Option<&RuntimeRecord>, running: Option<bool>) -> String {
    let Some(r) = record else {
        return "RUNTIME: none has configured devgate yet\n".to_string();
    };
    let mut out = String::new();
    let nri = r.nri_version.as_deref().unwrap_or("unknown");
    let _ = writeln!(out, "RUNTIME: {} {} (nri {nri})", r.runtime, r.version);
    if let (Some(p), Some(running)) = (&r.plugin, running) {
        let _ = match running {
            true => writeln!(out, "  plugin:                   pid {}, running", p.pid),
            false => writeln!(
                out,
                "  plugin:                   pid {}, NOT RUNNING: this record is of a plugin that exited (configured at unix time {})",
                p.pid, r.configured_unix
            ),
        };
    }
    let _ = writeln!(out, "  events subscribed:        {}", r.events);
    let _ = writeln!(
        out,
        "  explicit cgroup rules:    {}",
        yes_no(r.explicit_cgroup_rules)
    );
    let _ = writeln!(
        out,
        "  cdi device injection:     {} (runtime_cdi {})",
        yes_no(r.cdi_devices),
        r.runtime_cdi.as_str()
    );
    let _ = writeln!(
        out,
        "  devices as:               {} (device_mode {})",
        mode(r.devices_as),
        r.device_mode.as_str()
    );
    let _ = match r.request_timeout_ms {
        Some(ms) => writeln!(
            out,
            "  request timeout:          {ms} ms (stated by the runtime)"
        ),
        None => writeln!(
            out,
            "  request timeout:          not stated at Configure (each request's deadline, at most {} ms, bounds its waits)",
            nri::stub::DEFAULT_REQUEST_TIMEOUT.as_millis()
        ),
    };
    if let Some(since) = r.disconnected_unix {
        let _ = writeln!(
            out,
            "  connection:               CLOSED by the runtime at unix time {since}; the plugin serves no creation until a runtime configures it again"
        );
    }
    if let Some(why) = &r.config_error {
        let _ = writeln!(
            out,
            "  config:                   INVALID, containers that need devgate are refused: {why}"
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RuntimeCdi;

    #[test]
    fn shows_runtime_and_features_in_use() {
        let rec = RuntimeRecord {
            runtime: "containerd".into(),
            version: "2.1.9+unknown".into(),
            nri_version: Some("v0.8.0".into()),
            events: "0x60c".into(),
            explicit_cgroup_rules: false,
            cdi_devices: true,
            device_mode: DeviceMode::Cdi,
            runtime_cdi: RuntimeCdi::Auto,
            devices_as: DeviceMode::Cdi,
            configured_unix: 0,
            plugin: None,
            host_root: None,
            config_error: None,
            request_timeout_ms: Some(1500),
            disconnected_unix: None,
        };
        let t = table(Some(&rec), None);
        assert!(
            t.contains("request timeout:          1500 ms (stated by the runtime)"),
            "{t}"
        );
        assert!(!t.contains("config:"), "{t}");
        assert!(t.starts_with("RUNTIME: containerd 2.1.9+unknown (nri v0.8.0)\n"));
        assert!(t.contains("explicit cgroup rules:    no"));
        assert!(t.contains("cdi device injection:     yes (runtime_cdi auto)"));
        assert!(t.contains("devices as:               cdi names (device_mode cdi)"));
        assert!(table(None, None).contains("none has configured"));
        let invalid = RuntimeRecord {
            config_error: Some("unknown field `gpus`".into()),
            request_timeout_ms: None,
            ..rec
        };
        assert!(table(Some(&invalid), None).contains(
            "not stated at Configure (each request's deadline, at most 2000 ms, bounds its waits)"
        ));
        assert!(table(Some(&invalid), None).contains(
            "config:                   INVALID, containers that need devgate are refused: unknown field `gpus`"
        ));
        assert!(!t.contains("connection:"), "{t}");
        let closed = RuntimeRecord {
            disconnected_unix: Some(1_700_000_000),
            ..invalid
        };
        assert!(table(Some(&closed), None)
            .contains("connection:               CLOSED by the runtime at unix time 1700000000;"));
        assert!(!t.contains("plugin:"), "{t}");
        let named = RuntimeRecord {
            plugin: Some(crate::ledger::InitProcess {
                pid: 77,
                start_ticks: 5,
            }),
            ..closed
        };
        assert!(
            table(Some(&named), Some(true)).contains("plugin:                   pid 77, running\n")
        );
        assert!(table(Some(&named), Some(false)).contains(
            "plugin:                   pid 77, NOT RUNNING: this record is of a plugin that exited"
        ));
    }
}
