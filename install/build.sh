#!/usr/bin/env bash
# Builds what a node runs into one directory: `devgate`, linked against the
# host's C library (it loads the host's NVML with dlopen, which a static glibc
# program cannot do safely), and `devgate-hook` linked statically (static-pie,
# as runc's release binaries are).
#
# Why the hook is static: runc runs it on every container start and stop, so its
# exec time is on that path, and the dynamic loader's work (mapping libc and
# libgcc_s, relocating against them) is most of what a hook with nothing to do
# costs; and the DaemonSet's init container copies it onto nodes whose C library
# it cannot know. docs/performance.md has the measurements.
#
# usage: install/build.sh [--profile release|dev] [--out DIR]
#   --profile  cargo profile (default release)
#   --out      where to put both binaries (default the checkout's target/dist
#              for release, target/dist-dev for dev)
#
# Extra cargo flags may come in CARGO_BUILD_FLAGS (e.g. --quiet, --locked).
# Needs the C library's static archive (Debian/Ubuntu libc6-dev, RHEL-like
# glibc-static). A statically linked hook cannot load NVML, which hooks-only
# mode (hooks.d) uses: it hands such runs to the `devgate` beside it
# (src/hook/entry.rs), so install both together.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

die() {
    echo "build.sh: $*" >&2
    exit 1
}

profile=release
out=
while (($#)); do
    case $1 in
    --profile | --out)
        (($# >= 2)) || die "$1 needs a value"
        case $1 in
        --profile) profile=$2 ;;
        --out) out=$2 ;;
        esac
        shift 2
        ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
        exit 0
        ;;
    *) die "unknown argument: $1" ;;
    esac
done
case $profile in
release) profile_dir=release default_out=$repo/target/dist ;;
dev) profile_dir=debug default_out=$repo/target/dist-dev ;;
*) die "--profile must be release or dev" ;;
esac
out=${out:-$default_out}
# --out is the caller's path; the build runs in the checkout.
[[ $out == /* ]] || out=$PWD/$out

if [[ -d ${HOME:-/root}/.cargo/bin ]]; then
    PATH="${HOME:-/root}/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null || die "cargo not found (install rustup; rust-toolchain.toml pins the version)"
cd "$repo"
host=$(rustc -vV | sed -n 's/^host: //p') || true
[[ -n $host ]] || die "rustc -vV names no host (is rustc installed?)"
[[ $host == *-linux-gnu ]] || die "host $host: the static hook build is for *-linux-gnu"
# The static link needs the C library's archive.
[[ $(cc -print-file-name=libc.a 2>/dev/null) == /* ]] ||
    die "libc.a not found: install the C library's static archive (Debian/Ubuntu libc6-dev, RHEL-like glibc-static)"
read -ra extra <<<"${CARGO_BUILD_FLAGS:-}"
# CARGO_TARGET_DIR or build.target-dir may move it.
target_dir=$(cargo metadata --no-deps --format-version 1 | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
[[ -n $target_dir ]] || die "cargo metadata names no target directory"

cargo build ${extra[@]+"${extra[@]}"} --profile "$profile" --bin devgate
# With --target, RUSTFLAGS reach only what is built for the target, not the
# build scripts and proc-macros (which must stay dynamic), and the static
# build of the dependencies gets its own directory, <target>/<host>/. They
# replace any rustflags from cargo's config files for this build.
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
    cargo build ${extra[@]+"${extra[@]}"} --profile "$profile" --bin devgate-hook --target "$host"

plugin=$target_dir/$profile_dir/devgate
hook=$target_dir/$host/$profile_dir/devgate-hook
[[ -x $plugin && -x $hook ]] || die "cargo left no $plugin or $hook"
# CARGO_ENCODED_RUSTFLAGS, for one, would override the flag above. ldd says
# "statically linked" of static-pie, "not a dynamic executable" of static.
linking=$(ldd "$hook" 2>&1) || true
grep -q -e 'statically linked' -e 'not a dynamic executable' <<<"$linking" ||
    die "$hook is not statically linked (is CARGO_ENCODED_RUSTFLAGS set?): $(head -n 3 <<<"$linking")"
mkdir -p "$out"
install -m 0755 "$plugin" "$out/devgate"
install -m 0755 "$hook" "$out/devgate-hook"
echo "build.sh: $out/devgate and $out/devgate-hook (static)" >&2
