#!/usr/bin/env bash
# Installs devgate on a node, as root (Debian/Ubuntu and RHEL-like).
#
#   install/bootstrap.sh [--prefix DIR] [--bin-dir DIR] [--hooks-dir DIR] [--preinstalled] [--dry-run]
#   install/bootstrap.sh --uninstall [--prefix DIR] [--dry-run]
#
# Idempotent: every file is compared before it is written, and a second run
# reports "no changes". What it does, in order:
#   1. installs devgate and devgate-hook into /usr/local/bin;
#   2. writes /etc/devgate/config.toml from install/config.toml when absent;
#   3. enables NRI in containerd: 1.7 has it off by default, so the config gets
#      [plugins."io.containerd.nri.v1.nri"] disable = false (an edit that keeps
#      a backup next to the file); 2.x has it on and is only changed when its
#      config turns it off;
#   4. installs a systemd unit running `devgate nri` (Restart=always), or with
#      --preinstalled the plugin /opt/nri/plugins/10-devgate that containerd
#      starts itself;
#   5. installs the hooks.d files (hooks/*.json) for CRI-O and podman;
#   6. prepares the node from the config: [sriov] num_vfs (sriov_numvfs, 0
#      first when changing: the kernel refuses a change between two non-zero
#      counts, drivers/pci/iov.c) and rdma.netns_mode = "exclusive" (modprobe
#      option `ib_core netns_mode=0`, read only when ib_core loads: reboot);
#   7. restarts containerd and devgate only when something of theirs changed.
# Every path is below --prefix (default /), so tests run it into a directory;
# with a prefix other than / no service is started or restarted.
# --uninstall reverses what the recorded installs did, restoring each file it
# changed from its backup byte for byte, and refuses to overwrite a file that
# was edited after devgate wrote it.
set -euo pipefail

readonly NRI_SECTION='plugins."io.containerd.nri.v1.nri"'
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly SCRIPT_DIR
readonly REPO_DIR=${SCRIPT_DIR%/install}

PREFIX=/
BIN_DIR=$REPO_DIR/target/release
HOOKS_SRC=$REPO_DIR/hooks
DRY_RUN=0
UNINSTALL=0
PREINSTALLED=0
CONTAINERD_VERSION=${DEVGATE_CONTAINERD_VERSION:-}
CHANGES=0
FAILURES=0
RESTART_CONTAINERD=0
RESTART_DEVGATE=0

log() { printf 'bootstrap: %s\n' "$*"; }
warn() { printf 'bootstrap: warning: %s\n' "$*" >&2; }
die() {
    printf 'bootstrap: error: %s\n' "$*" >&2
    exit 1
}

usage() {
    sed -n '2,6p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}

parse_args() {
    while (($#)); do
        case $1 in
        --prefix) PREFIX=${2:?--prefix needs a directory} && shift ;;
        --bin-dir) BIN_DIR=${2:?--bin-dir needs a directory} && shift ;;
        --hooks-dir) HOOKS_SRC=${2:?--hooks-dir needs a directory} && shift ;;
        --containerd-version) CONTAINERD_VERSION=${2:?--containerd-version needs a version} && shift ;;
        --preinstalled) PREINSTALLED=1 ;;
        --dry-run) DRY_RUN=1 ;;
        --uninstall) UNINSTALL=1 ;;
        -h | --help) usage 0 ;;
        *) warn "unknown argument $1" && usage 2 ;;
        esac
        shift
    done
    [[ $PREFIX == /* ]] || die "--prefix must be an absolute path, got $PREFIX"
    PREFIX=${PREFIX%/}
}

# Host path (as the node sees it) -> path written by this run.
p() { printf '%s%s' "$PREFIX" "$1"; }
real_root() { [[ -z $PREFIX ]]; }

readonly BIN=/usr/local/bin
readonly CONFIG=/etc/devgate/config.toml
readonly CONTAINERD_CONFIG=/etc/containerd/config.toml
readonly UNIT=/etc/systemd/system/devgate.service
readonly PREINSTALLED_PLUGIN=/opt/nri/plugins/10-devgate
readonly PREINSTALLED_CONF=/etc/nri/conf.d/10-devgate.conf
readonly HOOKS_DIR=/etc/containers/oci/hooks.d
readonly MODPROBE=/etc/modprobe.d/devgate-rdma.conf
readonly MANIFEST=/var/lib/devgate/install/manifest

# --- the manifest: one tab-separated line per thing an install did ---------
#   created  <path>  <sha256 written>      removed at uninstall
#   modified <path>  <sha256 written>      restored from <path>.devgate-backup
#   numvfs   <bdf>   <count before>        written back at uninstall
#   unit     <name>                        disabled at uninstall
#   dir      <path>                        removed at uninstall when empty

sha() { sha256sum "$1" | cut -d' ' -f1; }

manifest_get() { # kind key -> third field, or nothing
    [[ -f $(p "$MANIFEST") ]] || return 0
    awk -F'\t' -v k="$1" -v p="$2" '$1 == k && $2 == p { print $3; exit }' "$(p "$MANIFEST")"
}

manifest_kind() { # path -> created|modified|nothing
    [[ -f $(p "$MANIFEST") ]] || return 0
    awk -F'\t' -v p="$1" '($1 == "created" || $1 == "modified") && $2 == p { print $1; exit }' "$(p "$MANIFEST")"
}

# ensure_dir DIR: creates the host directory DIR and its missing parents,
# recording each one it created.
ensure_dir() {
    local d=$1 i
    local -a missing=()
    while [[ ! -d $(p "$d") ]]; do
        missing+=("$d")
        d=$(dirname "$d")
    done
    for ((i = ${#missing[@]} - 1; i >= 0; i--)); do
        mkdir "$(p "${missing[i]}")"
        manifest_put dir "${missing[i]}" -
    done
}

manifest_put() { # kind key value: replaces the line for (kind, key)
    local m
    m=$(p "$MANIFEST")
    if [[ ! -d $(dirname "$m") ]]; then
        # The manifest's own directories are recorded in it, parents first.
        local d i
        local -a missing=()
        d=$(dirname "$MANIFEST")
        while [[ ! -d $(p "$d") ]]; do
            missing+=("$d")
            d=$(dirname "$d")
        done
        mkdir -p "$(dirname "$m")"
        for ((i = ${#missing[@]} - 1; i >= 0; i--)); do
            printf 'dir\t%s\t-\n' "${missing[i]}" >>"$m"
        done
    fi
    touch "$m"
    awk -F'\t' -v k="$1" -v p="$2" '!($1 == k && $2 == p)' "$m" >"$m.new"
    printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$m.new"
    mv "$m.new" "$m"
}

manifest_drop() { # kind key
    local m
    m=$(p "$MANIFEST")
    [[ -f $m ]] || return 0
    awk -F'\t' -v k="$1" -v p="$2" '!($1 == k && $2 == p)' "$m" >"$m.new"
    mv "$m.new" "$m"
}

# --- file operations ---------------------------------------------------------

# put_file SRC DEST MODE: installs SRC as host path DEST when its content or
# mode differs. The first time devgate touches a file that already exists, the
# file is kept as DEST.devgate-backup. Returns 0 when it changed something.
put_file() {
    local src=$1 dest=$2 mode=$3 target
    target=$(p "$dest")
    if [[ -f $target && ! -L $target ]] && cmp -s "$src" "$target" &&
        [[ $(stat -c '%a' "$target") == "$mode" ]]; then
        return 1
    fi
    CHANGES=$((CHANGES + 1))
    if ((DRY_RUN)); then
        log "would install $dest (mode $mode)"
        # Show edits of text files (the containerd config) as a diff.
        if [[ -f $target ]] && grep -Iq . "$target" && grep -Iq . "$src"; then
            diff -u --label "$dest" --label "$dest (new)" "$target" "$src" | sed 's/^/    /' || true
        fi
        return 0
    fi
    log "install $dest"
    ensure_dir "$(dirname "$dest")"
    local kind
    kind=$(manifest_kind "$dest")
    if [[ -z $kind ]]; then
        if [[ -e $target || -L $target ]]; then
            cp -a "$target" "$target.devgate-backup"
            kind=modified
        else
            kind=created
        fi
    fi
    install -m "$mode" "$src" "$target.devgate-new"
    mv -f "$target.devgate-new" "$target"
    manifest_put "$kind" "$dest" "$(sha "$target")"
}

# put_text DEST MODE: like put_file with the text on stdin.
put_text() {
    local tmp rc=0
    tmp=$(mktemp)
    cat >"$tmp"
    put_file "$tmp" "$1" "$2" || rc=$?
    rm -f "$tmp"
    return "$rc"
}

# put_link DEST TARGET: a symlink, created when absent; never replaces a file.
put_link() {
    local link
    link=$(p "$1")
    if [[ -L $link && $(readlink "$link") == "$2" ]]; then
        return 1
    fi
    [[ ! -e $link && ! -L $link ]] || die "$1 exists and is not devgate's link to $2: move it away first"
    CHANGES=$((CHANGES + 1))
    if ((DRY_RUN)); then
        log "would link $1 -> $2"
        return 0
    fi
    log "link $1 -> $2"
    ensure_dir "$(dirname "$1")"
    ln -s "$2" "$link"
    manifest_put created "$1" link
}

# --- containerd --------------------------------------------------------------

containerd_major_minor() {
    local v=$CONTAINERD_VERSION
    if [[ -z $v ]]; then
        command -v containerd >/dev/null || die "containerd not found: install containerd 1.7 or later first"
        # "containerd github.com/containerd/containerd 1.7.24~ds1 ..." or "containerd containerd.io v1.7.24 ..."
        v=$(containerd --version | awk '{ print $3 }')
    fi
    v=${v#v}
    [[ $v =~ ^([0-9]+)\.([0-9]+) ]] || die "cannot read the containerd version from '$v'"
    printf '%s %s\n' "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"
}

# Prints the containerd config with NRI enabled, reading the current one on
# stdin. Exit 3: the file names the NRI plugin in a form this edit does not
# know (dotted keys, disabled_plugins): fail rather than guess.
nri_enabled_config() {
    local need_section=$1
    awk -v need="$need_section" '
        function header(line) { return line ~ /^[ \t]*\[/ }
        /^[ \t]*\[plugins\."io\.containerd\.nri\.v1\.nri"\][ \t]*(#.*)?$/ {
            found = 1; in_nri = 1; print; next
        }
        header($0) {
            if (in_nri && !set && need == 1) print "  disable = false"
            in_nri = 0; print; next
        }
        in_nri && /^[ \t]*disable[ \t]*=/ {
            match($0, /^[ \t]*/); print substr($0, 1, RLENGTH) "disable = false"; set = 1; next
        }
        /^[ \t]*#/ { print; next }
        /io\.containerd\.nri\.v1\.nri/ { odd = 1 }
        { print }
        END {
            if (odd) exit 3
            if (in_nri && !set && need == 1) print "  disable = false"
            if (!found && need == 1) {
                print ""
                print "[plugins.\"io.containerd.nri.v1.nri\"]"
                print "  disable = false"
            }
        }'
}

enable_nri() {
    local major minor need=1 cfg new rc=0
    read -r major minor < <(containerd_major_minor)
    ((major > 1 || (major == 1 && minor >= 7))) || die "containerd $major.$minor has no NRI: install 1.7 or later"
    # 2.x enables NRI unless its config says otherwise.
    ((major == 1)) || need=0
    cfg=$(p "$CONTAINERD_CONFIG")
    if [[ ! -e $cfg ]]; then
        ((need)) || return 0
        ! put_text "$CONTAINERD_CONFIG" 644 < <(printf 'version = 2\n\n[%s]\n  disable = false\n' "$NRI_SECTION") ||
            RESTART_CONTAINERD=1
        return 0
    fi
    grep -Eq '^[[:space:]]*version[[:space:]]*=[[:space:]]*[23]([[:space:]]|#|$)' "$cfg" ||
        die "$CONTAINERD_CONFIG is not a version 2 or 3 config: run 'containerd config migrate' first"
    new=$(mktemp)
    nri_enabled_config "$need" <"$cfg" >"$new" || rc=$?
    if ((rc == 3)); then
        rm -f "$new"
        die "$CONTAINERD_CONFIG names io.containerd.nri.v1.nri outside a [$NRI_SECTION] table: set disable = false there by hand"
    fi
    ((rc == 0)) || die "cannot edit $CONTAINERD_CONFIG"
    # Keep the file's mode: containerd configs may hold registry credentials.
    if put_file "$new" "$CONTAINERD_CONFIG" "$(stat -c '%a' "$cfg")"; then
        RESTART_CONTAINERD=1
    fi
    rm -f "$new"
}

# --- devgate -----------------------------------------------------------------

unit_text() {
    cat <<EOF
# Installed by devgate's install/bootstrap.sh.
[Unit]
Description=devgate NRI plugin (GPU and RDMA device allocation)
After=containerd.service
Wants=containerd.service

[Service]
ExecStart=$BIN/devgate nri --config $CONFIG --socket /var/run/nri/nri.sock --state-dir /run/devgate
# The plugin reconnects when containerd restarts; a crash is restarted here.
Restart=always
RestartSec=1
# Claims and saved VF state: /run/devgate (tmpfs), GPU health: /var/lib/devgate.
RuntimeDirectory=devgate
RuntimeDirectoryPreserve=yes
StateDirectory=devgate
Environment=DEVGATE_LOG=info

[Install]
WantedBy=multi-user.target
EOF
}

install_devgate() {
    local b
    for b in devgate devgate-hook; do
        [[ -x $BIN_DIR/$b ]] || die "$BIN_DIR/$b not found: build with 'cargo build --release' or pass --bin-dir"
        ! put_file "$BIN_DIR/$b" "$BIN/$b" 755 || RESTART_DEVGATE=1
    done
    if [[ ! -e $(p "$CONFIG") ]]; then
        ! put_file "$SCRIPT_DIR/config.toml" "$CONFIG" 644 || RESTART_DEVGATE=1
    fi
    if ((PREINSTALLED)); then
        # containerd starts pre-installed plugins itself, only when it starts.
        ! put_file "$BIN_DIR/devgate" "$PREINSTALLED_PLUGIN" 755 || RESTART_CONTAINERD=1
        ! put_link "$PREINSTALLED_CONF" "$CONFIG" || RESTART_CONTAINERD=1
    else
        if put_text "$UNIT" 644 < <(unit_text); then
            RESTART_DEVGATE=1
            ((DRY_RUN)) || manifest_put unit devgate.service -
        fi
    fi
    local hook found=0
    for hook in "$HOOKS_SRC"/*.json; do
        [[ -f $hook ]] || continue
        found=1
        put_file "$hook" "$HOOKS_DIR/$(basename "$hook")" 644 || true
    done
    ((found)) || warn "no $HOOKS_SRC/*.json: CRI-O and podman will not run devgate-hook"
}

# --- node preparation ----------------------------------------------------------

write_sysfs() { # host path, value
    if ((DRY_RUN)); then
        log "would write $2 to $1"
        return
    fi
    log "write $2 to $1"
    printf '%s\n' "$2" >"$(p "$1")" || die "write $2 to $1 failed"
}

set_numvfs() { # bdf count
    local dev=/sys/bus/pci/devices/$1 current total
    [[ -f $(p "$dev/sriov_numvfs") ]] || die "[sriov] num_vfs names $1, which has no $dev/sriov_numvfs"
    current=$(<"$(p "$dev/sriov_numvfs")")
    total=$(<"$(p "$dev/sriov_totalvfs")")
    ((current == $2)) && return 0
    (($2 <= total)) || die "[sriov] num_vfs asks $2 VFs of $1, which has at most $total"
    CHANGES=$((CHANGES + 1))
    [[ -n $(manifest_get numvfs "$1") ]] || ((DRY_RUN)) || manifest_put numvfs "$1" "$current"
    # A change between two non-zero counts is refused with EBUSY.
    ((current == 0)) || write_sysfs "$dev/sriov_numvfs" 0
    write_sysfs "$dev/sriov_numvfs" "$2"
}

prepare_node() {
    local cfg=$CONFIG kind a b c mode=shared
    # A dry run on a fresh node has no config yet: the shipped one applies.
    [[ -e $(p "$cfg") ]] || cfg=$SCRIPT_DIR/config.toml
    [[ $cfg == "$SCRIPT_DIR"/* ]] || cfg=$(p "$cfg")
    local plan
    plan=$("$BIN_DIR/devgate" doctor --config "$cfg" --print-node-prep) || die "read the node preparation from $cfg"
    while read -r kind a b c; do
        case $kind in
        sriov_numvfs) set_numvfs "$a" "$b" ;;
        rdma_netns_mode) mode=$a ;;
        "") ;;
        *) die "unexpected node preparation line: $kind $a $b $c" ;;
        esac
    done <<<"$plan"
    local changed=1
    if [[ $mode == exclusive ]]; then
        put_text "$MODPROBE" 644 < <(printf '# Installed by devgate: RDMA devices belong to one network namespace.\noptions ib_core netns_mode=0\n') ||
            changed=0
    else
        remove_owned "$MODPROBE" || changed=0
    fi
    # ib_core's netns_mode parameter reads Y (shared) or N (exclusive); it is
    # absent while ib_core is not loaded, and then the file applies at its load.
    local param runtime="" want=Y
    param=$(p /sys/module/ib_core/parameters/netns_mode)
    [[ ! -r $param ]] || runtime=$(<"$param")
    [[ $mode == shared ]] || want=N
    if [[ $runtime != "$want" ]] && { ((changed)) || [[ -n $runtime ]]; }; then
        log "notice: rdma.netns_mode = $mode takes effect after a reboot (ib_core reads netns_mode when it loads)"
    fi
}

# --- services ------------------------------------------------------------------

systemctl_do() {
    if ((DRY_RUN)); then
        log "would run: systemctl $*"
    elif ! real_root; then
        log "skip (prefix $PREFIX): systemctl $*"
    elif [[ ! -d /run/systemd/system ]]; then
        warn "systemd is not running: run 'systemctl $*' yourself"
    else
        log "systemctl $*"
        systemctl "$@" || FAILURES=$((FAILURES + 1))
    fi
}

restart_services() {
    if ((RESTART_CONTAINERD)); then
        systemctl_do restart containerd.service
    fi
    if ((RESTART_DEVGATE && !PREINSTALLED)); then
        systemctl_do daemon-reload
        systemctl_do enable devgate.service
        systemctl_do restart devgate.service
    fi
}

# --- uninstall -----------------------------------------------------------------

# Removes a file devgate created (per the manifest). Returns 0 when it did.
remove_owned() {
    local path=$1 target written
    target=$(p "$path")
    [[ $(manifest_kind "$path") == created ]] || return 1
    written=$(manifest_get created "$path")
    if [[ ! -e $target && ! -L $target ]]; then
        ((DRY_RUN)) || manifest_drop created "$path"
        return 1
    fi
    if { [[ $written == link ]] && [[ ! -L $target ]]; } ||
        { [[ $written != link && -f $target ]] && [[ $(sha "$target") != "$written" ]]; }; then
        warn "$path changed after devgate wrote it; left in place"
        ((DRY_RUN)) || manifest_drop created "$path"
        return 1
    fi
    CHANGES=$((CHANGES + 1))
    if ((DRY_RUN)); then
        log "would remove $path"
        return 0
    fi
    log "remove $path"
    rm -f "$target"
    manifest_drop created "$path"
}

# Restores a file devgate modified, when nobody changed it since.
restore_owned() {
    local path=$1 target written
    target=$(p "$path")
    written=$(manifest_get modified "$path")
    [[ -f $target.devgate-backup || -L $target.devgate-backup ]] || {
        warn "$path: backup $path.devgate-backup is gone; left as it is"
        FAILURES=$((FAILURES + 1))
        return
    }
    if [[ -f $target && $(sha "$target") != "$written" ]]; then
        warn "$path changed after devgate wrote it; left as it is (the original is $path.devgate-backup)"
        FAILURES=$((FAILURES + 1))
        return
    fi
    CHANGES=$((CHANGES + 1))
    if ((DRY_RUN)); then
        log "would restore $path from $path.devgate-backup"
        return
    fi
    log "restore $path"
    mv -f "$target.devgate-backup" "$target"
    manifest_drop modified "$path"
}

uninstall() {
    local m kind key value
    local -a dirs=()
    m=$(p "$MANIFEST")
    if [[ ! -f $m ]]; then
        log "nothing installed (no $MANIFEST)"
        return
    fi
    if [[ -n $(manifest_get unit devgate.service) ]]; then
        systemctl_do disable --now devgate.service
        ((DRY_RUN)) || manifest_drop unit devgate.service
    fi
    while IFS=$'\t' read -r kind key value; do
        case $kind in
        created)
            if [[ $key == "$MODPROBE" ]] && remove_owned "$key"; then
                log "notice: the RDMA netns mode returns to shared after a reboot"
            elif [[ $key == "$CONTAINERD_CONFIG" || $key == "$PREINSTALLED_PLUGIN" ]] && remove_owned "$key"; then
                RESTART_CONTAINERD=1
            else
                remove_owned "$key" || true
            fi
            ;;
        modified)
            restore_owned "$key"
            [[ $key != "$CONTAINERD_CONFIG" ]] || RESTART_CONTAINERD=1
            ;;
        numvfs)
            local dev=/sys/bus/pci/devices/$key current
            current=$(<"$(p "$dev/sriov_numvfs")")
            if ((current != value)); then
                CHANGES=$((CHANGES + 1))
                ((current == 0)) || write_sysfs "$dev/sriov_numvfs" 0
                ((value == 0)) || write_sysfs "$dev/sriov_numvfs" "$value"
            fi
            ((DRY_RUN)) || manifest_drop numvfs "$key"
            ;;
        dir) dirs+=("$key") ;;
        esac
    done < <(tac "$m")
    if ((RESTART_CONTAINERD)); then
        systemctl_do restart containerd.service
    fi
    if ((!DRY_RUN && FAILURES == 0)); then
        rm -f "$m"
        # Newest first: children before their parents; a directory that holds
        # something else is kept.
        for key in "${dirs[@]}"; do
            rmdir "$(p "$key")" 2>/dev/null || true
        done
    fi
}

# --- main ----------------------------------------------------------------------

check_os() {
    local os_release id_like=""
    os_release=$(p /etc/os-release)
    [[ -r $os_release ]] || os_release=/etc/os-release
    [[ -r $os_release ]] || return 0
    # shellcheck disable=SC1090 # the host's own description
    id_like=$(. "$os_release" && printf '%s %s' "${ID:-}" "${ID_LIKE:-}")
    case " $id_like " in
    *" debian "* | *" ubuntu "* | *" rhel "* | *" fedora "* | *" centos "*) ;;
    *) warn "untested distribution ($id_like): continuing with the generic paths" ;;
    esac
}

main() {
    parse_args "$@"
    ((DRY_RUN)) || [[ $(id -u) -eq 0 ]] || die "must run as root"
    check_os
    if ((UNINSTALL)); then
        uninstall
    else
        [[ -d $BIN_DIR ]] || die "--bin-dir $BIN_DIR does not exist"
        BIN_DIR=$(cd "$BIN_DIR" && pwd)
        install_devgate
        enable_nri
        prepare_node
        restart_services
    fi
    if ((CHANGES == 0)); then
        log "no changes"
    elif ((DRY_RUN)); then
        log "dry run: $CHANGES change(s) not made"
    fi
    ((FAILURES == 0)) || die "$FAILURES step(s) failed; see the warnings above"
}

main "$@"
