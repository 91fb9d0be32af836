#!/usr/bin/env bash
# The main job on a fresh Debian machine, as root: installs containerd 1.7 with
# NRI and what the demo needs, builds devgate, and runs a GPU + RDMA pod on a
# simulated HGX host root through CRI (examples/demo.rs), printing what the
# container got and what was released after it went, and checking each (exit 1
# naming what differed). Cleans up after itself. The host setup replaces another
# containerd and disables its service: run this on a test machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ -d ${HOME:-/root}/.cargo/bin ]]; then
    PATH="${HOME:-/root}/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null || {
    echo "demo.sh: cargo not found (install rustup; rust-toolchain.toml pins the version)" >&2
    exit 1
}
DEVGATE_SETUP_ONLY_17=1 ./tests/setup-host.sh
# The binaries as a node gets them (the hook static), in the dev profile the
# tests share.
CARGO_BUILD_FLAGS=--quiet ./install/build.sh --profile dev
cargo run --quiet --example demo
