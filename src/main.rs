//! `devgate`: the NRI plugin and the operator commands.
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use devgate::cli;

#[derive(Parser)]
#[command(
    name = "devgate",
    version,
    about = "apply scheduler-chosen GPU and RDMA allocations to containers"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the containerd/CRI-O NRI plugin.
    Nri(cli::nri::NriArgs),
    /// Show the devices of a host root.
    Inventory(cli::inventory::InventoryArgs),
    /// Show what a pod's container would get.
    Plan(cli::plan::PlanArgs),
    /// Show devices, holders and state from the ledger.
    Status(cli::status::StatusArgs),
    /// CDI specs of this node's devices.
    Cdi(cli::cdi::CdiArgs),
    /// Check the node's setup: runtime, NRI, hooks, devices, config.
    Doctor(cli::doctor::DoctorArgs),
    /// Return devices to service: a GPU's health mark and quarantine, a NIC's quarantine.
    Clear(cli::clear::ClearArgs),
    /// Exit 0 when the plugin runs and a runtime configured it (a readiness probe).
    Ready(cli::ready::ReadyArgs),
}

/// Parses the command line. A runtime launches a pre-installed NRI plugin
/// with no arguments and only `NRI_PLUGIN_*` in the environment
/// (containerd/nri `adaptation/plugin.go`), which means `devgate nri`.
fn parse_cli() -> Cli {
    let launched = launched_by_runtime(
        std::env::args_os().len(),
        std::env::var_os(nri::stub::ENV_PLUGIN_SOCKET).is_some(),
    );
    if launched {
        Cli::parse_from(["devgate", "nri"])
    } else {
        Cli::parse()
    }
}

/// No arguments but the program name, and the runtime's plugin socket
/// variable: a runtime started this binary as a pre-installed plugin.
fn launched_by_runtime(argc: usize, plugin_socket_set: bool) -> bool {
    argc <= 1 && plugin_socket_set
}

fn main() -> ExitCode {
    // `devgate hook ARGS`: the OCI hook's entry, for a statically linked
    // `devgate-hook` in hooks-only mode (devgate::hook::entry). Not a clap
    // subcommand: the arguments are the hook's own, parsed by the hook.
    let mut argv = std::env::args_os().skip(1);
    if argv.next().as_deref() == Some(devgate::hook::entry::DEVGATE_SUBCOMMAND.as_ref()) {
        return devgate::hook::entry::main(argv);
    }
    let cli = parse_cli();
    if !matches!(cli.cmd, Cmd::Nri(_)) {
        // A report piped into `head` ends when the reader goes, as other
        // command-line tools do, instead of panicking on the closed pipe.
        // Not for the plugin, whose closed sockets are errors to handle.
        // SAFETY: restores the default disposition before any thread starts.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let result: anyhow::Result<()> = match cli.cmd {
        Cmd::Nri(args) => cli::nri::run(args).map_err(Into::into),
        Cmd::Inventory(args) => cli::inventory::run(args).map_err(Into::into),
        Cmd::Plan(args) => cli::plan::run(args).map_err(Into::into),
        Cmd::Status(args) => cli::status::run(args).map_err(Into::into),
        Cmd::Doctor(args) => cli::doctor::run(args).map_err(Into::into),
        Cmd::Cdi(args) => cli::cdi::run(args).map_err(Into::into),
        Cmd::Clear(args) => cli::clear::run(args).map_err(Into::into),
        Cmd::Ready(args) => cli::ready::run(args).map_err(Into::into),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line on stderr: kubelet and operators read the first line only.
            eprintln!("devgate: {}", nri::ErrorChain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `bootstrap.sh --preinstalled` installs the bare binary, which a runtime
    /// starts with no arguments: that alone means `devgate nri`.
    #[test]
    fn a_bare_start_by_the_runtime_is_the_plugin() {
        assert!(launched_by_runtime(1, true));
        assert!(
            !launched_by_runtime(1, false),
            "a bare start by hand shows the usage"
        );
        assert!(!launched_by_runtime(2, true), "arguments are parsed");
        let cli = Cli::parse_from(["devgate", "nri"]);
        assert!(matches!(cli.cmd, Cmd::Nri(_)));
    }
}
