#!/usr/bin/env bash
# Installs what the end-to-end tests need on a Debian bookworm host, as root.
# Idempotent: a second run finds everything in place and installs nothing.
#
# containerd comes from Debian trixie (1.7.24, NRI v0.6.1): bookworm's 1.6 has no
# NRI. The .deb is fetched through a private apt source list so that trixie is
# never added to the system's sources.
set -euo pipefail

readonly CONTAINERD_VERSION_GLOB='1.7.24~ds1-*'
# The second runtime of the end-to-end matrix: containerd 2.1 (NRI v0.8.0) from
# Debian forky, unpacked (dpkg -x, never installed) beside 1.7 so both coexist.
readonly CONTAINERD21_VERSION_GLOB='2.1.9+ds1-*'
readonly CONTAINERD21_PREFIX=/opt/devgate-test/containerd-2.1
readonly CACHE=/var/cache/devgate-test
# gcc and libc6-dev: cargo links with cc, and ring (TLS of the grant check's
# watch) compiles C; libc6-dev also holds libc.a, which install/build.sh links
# devgate-hook statically against. g++: checking the fuzz targets runs
# libfuzzer-sys's build script, which compiles libFuzzer's C++.
readonly BOOKWORM_PACKAGES=(runc protobuf-compiler busybox-static iproute2 tar coreutils util-linux podman shellcheck gcc g++ libc6-dev)

log() { printf 'setup-host: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

[[ $(id -u) -eq 0 ]] || die "must run as root (installs packages; the e2e tests start containerd)"
command -v apt-get >/dev/null || die "apt-get not found: this script targets Debian bookworm"

# Versions of installed packages, empty when absent.
installed_version() {
    { dpkg-query -W -f='${db:Status-Abbrev} ${Version}\n' "$1" 2>/dev/null || true; } | awk '$1 == "ii" { print $2 }'
}

install_bookworm_packages() {
    local missing=() pkg
    for pkg in "${BOOKWORM_PACKAGES[@]}"; do
        [[ -n $(installed_version "$pkg") ]] || missing+=("$pkg")
    done
    if ((${#missing[@]} == 0)); then
        return
    fi
    log "installing ${missing[*]}"
    # The system lists are refreshed only when installing from them fails: a
    # package unknown to them, or lists so old that the versions they name
    # are gone from the mirror (a dry run would not tell: it downloads nothing).
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"; then
        apt-get update
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
    fi
}

# Prints the .deb path of containerd matching $2 from Debian suite $1, downloading it
# when needed through a private source list of that suite alone; fails (status 1)
# when the suite has no such version.
fetch_suite_deb() {
    local suite=$1 glob=$2 pattern existing
    pattern="$CACHE/debs/containerd_${glob%-\*}-*_$(dpkg --print-architecture).deb"
    existing=$(compgen -G "$pattern" | head -n1 || true)
    if [[ -n $existing ]]; then
        printf '%s\n' "$existing"
        return
    fi
    local dir="$CACHE/$suite"
    mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial" "$CACHE/debs"
    ! id _apt >/dev/null 2>&1 || chown _apt "$CACHE/debs"
    echo "deb http://deb.debian.org/debian $suite main" >"$dir/sources.list"
    local -a opts=(
        -o "Dir::Etc::SourceList=$dir/sources.list"
        -o "Dir::Etc::SourceParts=/dev/null"
        -o "Dir::State::Lists=$dir/lists"
        -o "Dir::Cache=$dir/cache"
        -o "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false"
    )
    apt-get "${opts[@]}" update >&2
    local version
    version=$(apt-cache "${opts[@]}" madison containerd | awk -F'|' '{ gsub(/ /, "", $2); print $2 }' |
        while read -r v; do
            # shellcheck disable=SC2053 # the glob is intended
            [[ $v == $glob ]] && echo "$v"
        done | head -n1)
    if [[ -z $version ]]; then
        log "$suite offers no containerd $glob (has: $(apt-cache "${opts[@]}" madison containerd | tr '\n' ' '))"
        return 1
    fi
    (cd "$CACHE/debs" && apt-get "${opts[@]}" download "containerd=$version" >&2)
    compgen -G "$pattern" | head -n1
}

# containerd 2.1 under $CONTAINERD21_PREFIX (usr/bin/containerd, ctr, the runc shim).
# The unpacked tree is replaced only when its version is not the wanted one.
install_containerd21() {
    local bin=$CONTAINERD21_PREFIX/usr/bin/containerd
    if [[ -x $bin ]] && "$bin" --version 2>/dev/null | grep -q ' 2\.1\.'; then
        return
    fi
    local deb
    # Debian testing moves on: take the pinned release where a suite still has
    # it, else another 2.1 release (same NRI line), forky first, then sid.
    local deb="" glob suite
    for glob in "$CONTAINERD21_VERSION_GLOB" '2.1.*'; do
        for suite in forky sid; do
            deb=$(fetch_suite_deb "$suite" "$glob") && break 2
        done
    done
    [[ -n $deb ]] || die "neither forky nor sid offers containerd 2.1"
    log "unpacking $deb into $CONTAINERD21_PREFIX"
    rm -rf "$CONTAINERD21_PREFIX.new"
    mkdir -p "$CONTAINERD21_PREFIX.new"
    dpkg -x "$deb" "$CONTAINERD21_PREFIX.new"
    rm -rf "$CONTAINERD21_PREFIX"
    mv "$CONTAINERD21_PREFIX.new" "$CONTAINERD21_PREFIX"
    "$bin" --version >&2 || die "containerd 2.1 at $bin does not run"
}

install_containerd() {
    local current
    current=$(installed_version containerd)
    # shellcheck disable=SC2053 # the glob is intended
    if [[ -n $current && $current == $CONTAINERD_VERSION_GLOB ]]; then
        return
    fi
    [[ -z $current ]] || log "replacing containerd $current with $CONTAINERD_VERSION_GLOB"
    local deb
    deb=$(fetch_suite_deb trixie "$CONTAINERD_VERSION_GLOB") || die "trixie offers no containerd $CONTAINERD_VERSION_GLOB"
    log "installing $deb"
    # Keep the package's maintainer scripts from starting the service on hosts
    # without systemd: a policy-rc.d that denies every start, removed afterwards.
    local policy=/usr/sbin/policy-rc.d own_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 0755 "$policy"
        own_policy=1
    fi
    local rc=0
    DEBIAN_FRONTEND=noninteractive dpkg -i "$deb" || rc=$?
    ((own_policy == 0)) || rm -f "$policy"
    ((rc == 0)) || die "dpkg -i $deb failed"
    current=$(installed_version containerd)
    # shellcheck disable=SC2053 # the glob is intended
    [[ $current == $CONTAINERD_VERSION_GLOB ]] || die "containerd $current installed, want $CONTAINERD_VERSION_GLOB"
}

# The tests start private instances; the packaged service would only hold
# /run/containerd and compete for the CPU, so keep it off. `systemctl disable`
# also works when systemd is not PID 1 (it edits the unit symlinks), which keeps
# a later boot from starting it.
disable_containerd_service() {
    command -v systemctl >/dev/null || return 0
    if systemctl is-enabled --quiet containerd 2>/dev/null; then
        log "disabling the packaged containerd service"
        systemctl disable containerd
    fi
    if [[ -d /run/systemd/system ]] && systemctl is-active --quiet containerd; then
        log "stopping the packaged containerd service"
        systemctl stop containerd
    fi
}

install_bookworm_packages
install_containerd
# The demo runs on containerd 1.7 only (DEVGATE_SETUP_ONLY_17=1).
if [[ ${DEVGATE_SETUP_ONLY_17:-0} != 1 ]]; then
    install_containerd21
fi
disable_containerd_service
containerd --version >&2
