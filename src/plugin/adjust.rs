//! A [`Plan`] as an NRI container adjustment: the one place where plan types meet
//! wire types.
//!
//! - `linux.devices`: every runtime creates the node and, through NRI's generator,
//!   adds its allow rule (containerd/nri `pkg/runtime-tools/generate`).
//! - `linux.resources.devices`: explicit rules, applied only from NRI v0.10 (nri#168);
//!   older runtimes ignore them, so they are sent only where they take effect.
//! - `CDI_devices` (`device_mode = "cdi"`, where the runtime injects them): the
//!   runtime takes nodes and their cgroup rules from devgate's CDI spec, so
//!   neither `linux.devices` nor explicit rules are sent.
//! - hooks: `devgate-hook` at createRuntime (netns set-up, runc runs it after the
//!   cgroup is applied) and poststop (restore), each with a timeout because runc
//!   has none by default.

use std::collections::HashMap;

use nri::api::{
    CDIDevice, ContainerAdjustment, CreateContainerResponse, Hook, Hooks, KeyValue,
    LinuxContainerAdjustment, LinuxDevice, LinuxDeviceCgroup, LinuxResources, Mount,
    OptionalFileMode, OptionalInt, OptionalInt64,
};
use nri::protobuf::MessageField;

use crate::plan::{DeviceKind, Plan};

/// How to run the hook, when the plan needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookSpec {
    pub path: String,
    /// Flags after the stage, e.g. `--state-dir /run/devgate`.
    pub flags: Vec<String>,
    pub timeout_secs: i64,
}

/// What the runtime can take and what accompanies the plan.
#[derive(Debug, Clone, Default)]
pub struct AdjustOptions {
    /// The runtime applies `linux.resources.devices` (NRI >= v0.10).
    pub explicit_cgroup_rules: bool,
    /// Fully qualified CDI names that replace the plan's device nodes; empty
    /// means raw nodes.
    pub cdi_devices: Vec<String>,
    /// Set when the plan has work for the hook.
    pub hook: Option<HookSpec>,
    /// Container annotations to add (the resolved allocation for the hook).
    pub annotations: Vec<(String, String)>,
}

fn type_char(kind: DeviceKind) -> &'static str {
    match kind {
        DeviceKind::Char => "c",
    }
}

fn hook(spec: &HookSpec, stage: &str) -> Hook {
    let mut args = vec!["devgate-hook".to_string(), stage.to_string()];
    args.extend(spec.flags.iter().cloned());
    Hook {
        path: spec.path.clone(),
        args,
        timeout: MessageField::some(OptionalInt {
            value: spec.timeout_secs,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Builds the adjustment; an empty plan gives an empty adjustment.
pub fn to_adjustment(plan: &Plan, opts: &AdjustOptions) -> ContainerAdjustment {
    let mut adjust = ContainerAdjustment::default();
    if plan.is_empty() {
        return adjust;
    }
    let devices: Vec<LinuxDevice> = plan
        .devices
        .iter()
        .map(|d| LinuxDevice {
            path: d.path.clone(),
            type_: type_char(d.kind).to_string(),
            major: i64::from(d.major),
            minor: i64::from(d.minor),
            file_mode: MessageField::some(OptionalFileMode {
                value: d.file_mode,
                ..Default::default()
            }),
            ..Default::default()
        })
        .collect();
    let mut linux = LinuxContainerAdjustment::default();
    let use_cdi = !opts.cdi_devices.is_empty();
    if opts.explicit_cgroup_rules && !plan.devices.is_empty() && !use_cdi {
        let rules = plan
            .devices
            .iter()
            .map(|d| LinuxDeviceCgroup {
                allow: true,
                type_: type_char(d.kind).to_string(),
                major: MessageField::some(OptionalInt64 {
                    value: i64::from(d.major),
                    ..Default::default()
                }),
                minor: MessageField::some(OptionalInt64 {
                    value: i64::from(d.minor),
                    ..Default::default()
                }),
                access: "rw".to_string(),
                ..Default::default()
            })
            .collect();
        linux.resources = MessageField::some(LinuxResources {
            devices: rules,
            ..Default::default()
        });
    }
    if use_cdi {
        adjust.CDI_devices = opts
            .cdi_devices
            .iter()
            .map(|name| CDIDevice {
                name: name.clone(),
                ..Default::default()
            })
            .collect();
    } else {
        linux.devices = devices;
    }
    adjust.linux = MessageField::some(linux);
    adjust.env = plan
        .env
        .iter()
        .map(|(k, v)| KeyValue {
            key: k.clone(),
            value: v.clone(),
            ..Default::default()
        })
        .collect();
    adjust.mounts = plan
        .mounts
        .iter()
        .map(|m| Mount {
            source: m.source.clone(),
            destination: m.destination.clone(),
            type_: m.kind.clone(),
            options: m.options.clone(),
            ..Default::default()
        })
        .collect();
    if let Some(spec) = &opts.hook {
        add_hook(&mut adjust, spec);
    }
    adjust.annotations = opts.annotations.iter().cloned().collect::<HashMap<_, _>>();
    adjust
}

/// `devgate-hook` at createRuntime and poststop.
pub fn add_hook(adjust: &mut ContainerAdjustment, spec: &HookSpec) {
    adjust.hooks = MessageField::some(Hooks {
        create_runtime: vec![hook(spec, "createRuntime")],
        poststop: vec![hook(spec, "poststop")],
        ..Default::default()
    });
}

/// The CreateContainer reply carrying `adjust`.
pub fn create_response(adjust: ContainerAdjustment) -> CreateContainerResponse {
    CreateContainerResponse {
        adjust: MessageField::some(adjust),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{DeviceNode, Mount as PlanMount};

    fn plan() -> Plan {
        Plan {
            container: "main".into(),
            selected: true,
            devices: vec![DeviceNode {
                path: "/dev/nvidia3".into(),
                kind: DeviceKind::Char,
                major: 195,
                minor: 3,
                file_mode: 0o666,
            }],
            env: [("NVIDIA_VISIBLE_DEVICES".to_string(), "GPU-1".to_string())].into(),
            mounts: vec![PlanMount {
                source: "/usr/local/vgpu/libvgpu.so".into(),
                destination: "/usr/local/vgpu/libvgpu.so".into(),
                kind: "bind".into(),
                options: vec!["rbind".into(), "ro".into()],
            }],
            ..Plan::default()
        }
    }

    #[test]
    fn empty_plan_gives_empty_adjustment() {
        let a = to_adjustment(&Plan::default(), &AdjustOptions::default());
        assert_eq!(a, ContainerAdjustment::default());
    }

    #[test]
    fn devices_env_mounts_and_no_rules_before_v0_10() {
        let a = to_adjustment(&plan(), &AdjustOptions::default());
        let linux = a.linux.as_ref().unwrap();
        assert_eq!(linux.devices.len(), 1);
        let d = &linux.devices[0];
        assert_eq!(
            (d.path.as_str(), d.type_.as_str(), d.major, d.minor),
            ("/dev/nvidia3", "c", 195, 3)
        );
        assert_eq!(d.file_mode.value, 0o666);
        assert!(linux.resources.is_none());
        assert_eq!(a.env[0].key, "NVIDIA_VISIBLE_DEVICES");
        assert_eq!(a.mounts[0].options, vec!["rbind", "ro"]);
        assert!(a.hooks.is_none());
    }

    #[test]
    fn explicit_rules_and_hooks_when_asked() {
        let opts = AdjustOptions {
            explicit_cgroup_rules: true,
            cdi_devices: Vec::new(),
            hook: Some(HookSpec {
                path: "/usr/local/bin/devgate-hook".into(),
                flags: vec!["--state-dir".into(), "/run/devgate".into()],
                timeout_secs: 10,
            }),
            annotations: vec![("devgate.io/resolved".into(), "{}".into())],
        };
        let a = to_adjustment(&plan(), &opts);
        let rules = &a.linux.resources.devices;
        assert_eq!(rules.len(), 1);
        assert!(rules[0].allow);
        assert_eq!((rules[0].major.value, rules[0].minor.value), (195, 3));
        assert_eq!(rules[0].access, "rw");
        let hooks = a.hooks.as_ref().unwrap();
        assert_eq!(
            hooks.create_runtime[0].args,
            vec![
                "devgate-hook",
                "createRuntime",
                "--state-dir",
                "/run/devgate"
            ]
        );
        assert_eq!(hooks.poststop[0].args[1], "poststop");
        assert_eq!(hooks.poststop[0].timeout.value, 10);
        assert_eq!(a.annotations["devgate.io/resolved"], "{}");
    }

    #[test]
    fn cdi_names_replace_nodes_and_rules() {
        let opts = AdjustOptions {
            explicit_cgroup_rules: true,
            cdi_devices: vec!["devgate.io/gpu=GPU-1".into()],
            ..AdjustOptions::default()
        };
        let a = to_adjustment(&plan(), &opts);
        let names: Vec<&str> = a.CDI_devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["devgate.io/gpu=GPU-1"]);
        let linux = a.linux.as_ref().unwrap();
        assert!(linux.devices.is_empty());
        assert!(linux.resources.is_none());
        // Env and mounts still travel in the adjustment.
        assert_eq!(a.env[0].key, "NVIDIA_VISIBLE_DEVICES");
        assert_eq!(a.mounts.len(), 1);
    }
}
