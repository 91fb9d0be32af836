#!/usr/bin/env bash
# The project's single test command. As root on Debian bookworm: installs what
# the end-to-end tests need (tests/setup-host.sh), then runs formatting,
# clippy, every unit and end-to-end test, and the benchmarks in smoke mode
# (each benchmark run once).
# The end-to-end tests start private containerd instances, so this must run as
# root; they fail rather than skip otherwise.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ -d ${HOME:-/root}/.cargo/bin ]]; then
    PATH="${HOME:-/root}/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null || {
    echo "run.sh: cargo not found (install rustup; rust-toolchain.toml pins the version)" >&2
    exit 1
}

started=$SECONDS
step() {
    local name=$1
    shift
    local t0=$SECONDS
    printf '\n==> %s\n' "$name" >&2
    "$@"
    printf '<== %s: %ds\n' "$name" $((SECONDS - t0)) >&2
}

# Smoke mode (default): run every benchmark once, as criterion does under
# `cargo test`, reusing the test build. Measuring needs the release profile's
# fat-LTO build of the whole dependency tree, which alone takes longer than the
# rest of this script on two cores: DEVGATE_BENCH=quick runs criterion's
# `--quick` measurement instead.
run_benches() {
    if ! cargo metadata --no-deps --format-version 1 | grep -q '"kind":\["bench"\]'; then
        echo "no benchmark targets in the workspace" >&2
        return
    fi
    case ${DEVGATE_BENCH:-smoke} in
    smoke) cargo test --workspace --bench '*' ;;
    quick) cargo bench --workspace --bench '*' -- --quick --noplot ;;
    *)
        echo "run.sh: DEVGATE_BENCH must be smoke or quick" >&2
        return 1
        ;;
    esac
}

step "host setup" ./tests/setup-host.sh
step "cargo fmt" cargo fmt --all -- --check
step "cargo clippy" cargo clippy --workspace --all-targets -- -D warnings
step "cargo test" cargo test --workspace --no-fail-fast
step "cargo bench (smoke)" run_benches
printf '\nall checks passed in %ds\n' $((SECONDS - started)) >&2
