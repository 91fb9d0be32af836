#!/usr/bin/env bash
# The project's single test command. As root on Debian bookworm, in order:
#  1. host setup (tests/setup-host.sh): containerd 1.7.24 (the system package),
#     containerd 2.1.9 unpacked into /opt/devgate-test/containerd-2.1, runc,
#     podman, protoc, busybox-static, shellcheck; each only when missing;
#  2. cargo fmt --check;
#  3. cargo clippy on every target, warnings denied;
#  4. every unit, integration and end-to-end test of the workspace under
#     containerd 1.7 (DEVGATE_TEST_RUNTIME=containerd-1.7), podman tests included;
#  5. every tests/e2e_*.rs again under containerd 2.1, except the e2e_podman*
#     files, which drive podman and no containerd (they ran in step 4);
#  6. the README's main job, ./install/demo.sh, end to end as a user runs it;
#  7. every benchmark once in smoke mode (DEVGATE_BENCH=quick: criterion's quick
#     measurement) under containerd 1.7, and the one benchmark that drives
#     containerd (create_container) again under containerd 2.1, and once more
#     with a pod of its own per creation.
# A failure under a containerd line names the line (`FAILED under <runtime>`).
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
# $1: a benchmark target name, or '*' for every one.
run_benches() {
    local which=${1:-*}
    case ${DEVGATE_BENCH:-smoke} in
    smoke) cargo test --workspace --bench "$which" ;;
    quick) cargo bench --workspace --bench "$which" -- --quick --noplot ;;
    *)
        echo "run.sh: DEVGATE_BENCH must be smoke or quick" >&2
        return 1
        ;;
    esac
}

# The end-to-end suite runs once per containerd line (tests/support/runtime.rs).
# The first line runs with everything else; the others rerun every
# tests/e2e_*.rs, found by name so that new files join without an edit here.
# Files matching a RUNTIME_FREE_E2E pattern drive podman only, do not depend on
# the containerd line, and run in the first pass only; each one left out is
# named in the output.
readonly RUNTIMES=(containerd-1.7 containerd-2.1)
readonly RUNTIME_FREE_E2E=('e2e_podman*')

# Runs "$@" with DEVGATE_TEST_RUNTIME=$1; a failure names the runtime.
under_runtime() {
    local runtime=$1
    shift
    printf -- '--- runtime: %s\n' "$runtime" >&2
    if ! DEVGATE_TEST_RUNTIME=$runtime "$@"; then
        printf '\nrun.sh: FAILED under %s: %s\n' "$runtime" "$*" >&2
        return 1
    fi
}

# `--test NAME` for each runtime-dependent end-to-end test file.
e2e_test_args() {
    local f name skip
    for f in tests/e2e_*.rs; do
        name=$(basename "$f" .rs)
        for skip in "${RUNTIME_FREE_E2E[@]}"; do
            # shellcheck disable=SC2053 # $skip is a glob pattern on purpose
            if [[ $name == $skip ]]; then
                printf -- '--- %s: runs once, in the first pass (no containerd)\n' "$name" >&2
                continue 2
            fi
        done
        printf -- '--test\n%s\n' "$name"
    done
}

run_e2e_again() {
    local runtime=$1
    local -a args
    mapfile -t args < <(e2e_test_args)
    ((${#args[@]} > 0)) || {
        echo "run.sh: no tests/e2e_*.rs found" >&2
        return 1
    }
    under_runtime "$runtime" cargo test "${args[@]}" --no-fail-fast
}

step "host setup" ./tests/setup-host.sh
step "cargo fmt" cargo fmt --all -- --check
step "cargo clippy" cargo clippy --workspace --all-targets -- -D warnings
# The fuzz targets are a crate of their own (cargo-fuzz builds them with
# nightly and sanitizers): compiled here so that they cannot rot unseen.
step "fuzz targets compile" cargo check --manifest-path fuzz/Cargo.toml --bins
step "cargo test (end-to-end under ${RUNTIMES[0]})" under_runtime "${RUNTIMES[0]}" cargo test --workspace --no-fail-fast
for runtime in "${RUNTIMES[@]:1}"; do
    step "end-to-end tests under $runtime" run_e2e_again "$runtime"
done
# The README's main job, end to end, as a user runs it (about a minute: it
# reuses the test build, and tests/install_build.rs built its static hook).
step "demo (install/demo.sh)" ./install/demo.sh
step "cargo bench (${DEVGATE_BENCH:-smoke}) under ${RUNTIMES[0]}" under_runtime "${RUNTIMES[0]}" run_benches
# Only the benchmark that drives containerd depends on the line.
for runtime in "${RUNTIMES[@]:1}"; do
    step "create_container bench under $runtime" under_runtime "$runtime" run_benches create_container
done
# Its other mode: every creation the first container of a pod of its own.
fresh_pod_bench() {
    DEVGATE_BENCH_NEW_PODS=1 DEVGATE_BENCH_CREATES=3 run_benches create_container
}
step "create_container bench, a pod per creation" under_runtime "${RUNTIMES[0]}" fresh_pod_bench
printf '\nall checks passed in %ds\n' $((SECONDS - started)) >&2
