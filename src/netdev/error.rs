//! Errors of VF attach and detach: every one names the VF and the step.

use super::netns::NetnsError;
use super::nl::NlError;
use super::saved::SavedError;
use super::settings::SettingsError;
use crate::inventory::PciAddr;

/// Why a step failed.
#[derive(Debug, thiserror::Error)]
pub enum Cause {
    #[error(transparent)]
    Netlink(#[from] NlError),
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error(transparent)]
    Saved(#[from] SavedError),
    #[error(transparent)]
    Settings(#[from] SettingsError),
    #[error("{what} {name} not found")]
    NotFound { what: &'static str, name: String },
    #[error("read {}: {source}", path.display())]
    Sysfs {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    RdmaRenumbered(Box<Renumbered>),
    #[error("{name} already exists in the pod netns")]
    NameTaken { name: String },
    #[error("host name {name} is taken by another link (ifindex {index})")]
    HostNameTaken { name: String, index: u32 },
    #[error("vf is attached to container {holder}")]
    Held { holder: String },
    /// The saved record's container cannot be matched to a pod (the ledger
    /// unreadable): restoring it could pull the VF out of a pod that holds
    /// it now, so it is left as it is.
    #[error("whose container {container} is cannot be told: {reason}")]
    HolderUnknown { container: String, reason: String },
    #[error("vf netdev {name} not found in its pod or on the host")]
    Lost { name: String },
    #[error("host netdev {name} belongs to {parent}, not to this vf")]
    OtherDevice { name: String, parent: String },
    #[error("more than one link looks like this vf: {names:?}")]
    Ambiguous { names: Vec<String> },
    #[error("more than one link is on the pf's pci function and reports the vf: {names:?}")]
    AmbiguousPf { names: Vec<String> },
    /// `devices`: what the link is now, and what the PF was at attach (boxed:
    /// every step's result carries a `Cause`).
    #[error("pf {name} is now device {}, not {} as at attach", .devices.0, .devices.1)]
    OtherPf {
        name: String,
        devices: Box<(String, String)>,
    },
    /// `devices`: the PF link's device, and the VF's PF (`physfn`).
    #[error("pf {pf} is device {}, but vf {vf}'s pf is {}", .devices.0, .devices.1)]
    NotItsPf {
        pf: String,
        vf: String,
        devices: Box<(String, String)>,
    },
    #[error("settings need the pf, but pf {pf:?} is not on this host")]
    NoPf { pf: String },
    #[error("pf {pf} reports no vf {index}")]
    NoVf { pf: String, index: u32 },
    #[error("the kernel's rdma netns mode is shared; moving a device needs exclusive")]
    RdmaShared,
    #[error("the pod has no network namespace of its own (hostNetwork): a vf cannot be moved into the host's")]
    HostNetns,
    #[error("mac stayed {got} instead of {want}")]
    MacNotApplied { want: String, got: String },
    #[error("{what} is listed twice: {value}")]
    Duplicate { what: &'static str, value: String },
    #[error("write {path}: {source}")]
    Sysctl {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum VfError {
    #[error("vf {vf}{}: {step}", named(.netdev))]
    Step {
        vf: PciAddr,
        netdev: String,
        step: &'static str,
        #[source]
        cause: Cause,
    },
    #[error(
        "vf {vf}{}: {step} failed ({cause}) and the rollback failed too, state kept for a later detach: {rollback}",
        named(.netdev)
    )]
    Rollback {
        vf: PciAddr,
        netdev: String,
        step: &'static str,
        cause: Cause,
        rollback: Box<VfError>,
    },
    #[error("{}", nri::ErrorChain::join(.0))]
    Several(Vec<VfError>),
    #[error("read saved vf states")]
    Records(#[source] SavedError),
}

fn named(netdev: &str) -> String {
    if netdev.is_empty() {
        String::new()
    } else {
        format!(" ({netdev})")
    }
}

impl VfError {
    /// `first` with the errors that followed it; alone it stays itself.
    pub fn with(first: VfError, mut rest: Vec<VfError>) -> VfError {
        if rest.is_empty() {
            return first;
        }
        rest.insert(0, first);
        VfError::Several(rest)
    }

    /// All of `errors` as one, if there are any.
    pub fn all(mut errors: Vec<VfError>) -> Option<VfError> {
        if errors.is_empty() {
            return None;
        }
        let first = errors.remove(0);
        Some(VfError::with(first, errors))
    }
}

/// Binds errors to one VF.
pub(crate) struct At<'a> {
    pub vf: PciAddr,
    pub netdev: &'a str,
}

impl At<'_> {
    pub fn err(&self, step: &'static str) -> impl FnOnce(Cause) -> VfError + '_ {
        move |cause| VfError::Step {
            vf: self.vf,
            netdev: self.netdev.to_string(),
            step,
            cause,
        }
    }

    pub fn step<T, E: Into<Cause>>(
        &self,
        step: &'static str,
        r: Result<T, E>,
    ) -> Result<T, VfError> {
        r.map_err(|e| (self.err(step))(e.into()))
    }
}

/// An RDMA device whose char devices the kernel numbered anew when it moved.
#[derive(Debug)]
pub struct Renumbered {
    pub device: String,
    /// What the container's nodes name.
    pub want: Vec<super::settings::CharNum>,
    /// What the device has now.
    pub got: Vec<super::settings::CharNum>,
}

impl std::fmt::Display for Renumbered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |l: &[super::settings::CharNum]| {
            l.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        write!(
            f,
            "rdma device {} took other char devices when it moved into the pod ({}; the container's nodes name {}): the kernel numbered them anew, so the container would reach none of its own",
            self.device,
            list(&self.got),
            list(&self.want)
        )
    }
}
