#!/usr/bin/env bash
# Installs devgate on a node, as root (Debian/Ubuntu and RHEL-like).
#
#   install/bootstrap.sh [--prefix DIR] [--bin-dir DIR] [--hooks-dir DIR] [--preinstalled] [--dry-run]
#   install/bootstrap.sh --node-only [--prefix DIR] [--bin-dir DIR] [--dry-run]   (nodes running the DaemonSet)
#   install/bootstrap.sh --hooks-only [--prefix DIR] [--bin-dir DIR] [--hooks-dir DIR] [--dry-run]   (podman, CRI-O without NRI)
#   install/bootstrap.sh --uninstall [--prefix DIR] [--bin-dir DIR] [--dry-run]
#
# Idempotent: every file is compared before it is written, and a second run
# reports "no changes". What it does, in order:
#   1. installs devgate and devgate-hook into /usr/local/bin, from --bin-dir:
#      by default the newer of target/dist (install/build.sh: the hook linked
#      statically) and target/release (`cargo build --release`);
#   2. writes /etc/devgate/config.toml from install/config.toml when absent;
#   3. enables NRI in containerd: 1.7 has it off by default, so the config gets
#      [plugins."io.containerd.nri.v1.nri"] disable = false (an edit that keeps
#      a backup next to the file); 2.x has it on and is only changed when its
#      config turns it off; a node without containerd (no containerd on the
#      PATH, or --containerd-version none: CRI-O, podman) skips this step;
#   4. installs a systemd unit running `devgate nri` (Restart=always), or with
#      --preinstalled the plugin /opt/nri/plugins/10-devgate that containerd
#      starts itself;
#   5. installs the hooks.d files (hooks/*.json) for CRI-O and podman, in
#      /etc/containers/oci/hooks.d and /usr/share/containers/oci/hooks.d (a
#      read-only /usr is warned about and skipped);
#   6. prepares the node from the config: [sriov] num_vfs (sriov_numvfs, 0
#      first when changing: the kernel refuses a change between two non-zero
#      counts, drivers/pci/iov.c; a udev rule writes the counts again at each
#      boot) and rdma.netns_mode = "exclusive" (modprobe option
#      `ib_core netns_mode=0`, read only when ib_core loads: reboot);
#   7. restarts containerd and devgate only when something of theirs changed,
#      or an earlier run that stopped on an error owed them a restart; then,
#      with containerd, waits for devgate to register (DEVGATE_REGISTER_WAIT seconds, default
#      20), and fails if it does not. A pre-installed plugin that does not
#      register is undone and containerd restarted without it: containerd 1.7
#      does not run with one that cannot register.
# --node-only does steps 2, 3 and 6 for a node whose plugin is the DaemonSet's,
# and removes the unit or pre-installed plugin an earlier install left.
# --hooks-only does steps 1, 2, 5 and 6 for a node whose runtime runs
# devgate-hook from hooks.d (podman, CRI-O without NRI): no NRI, no plugin
# (an earlier install's unit or pre-installed plugin is removed, and
# containerd restarted to forget the latter), and it fails when no hooks.d
# directory took devgate's file, or a pre-installed plugin stays in place.
# Every path is below --prefix (default /), so tests run it into a directory;
# with a prefix other than / no service is started or restarted.
# --uninstall reverses what the recorded installs did, restoring each file it
# changed from its backup byte for byte, and refuses to overwrite a file that
# was edited after devgate wrote it.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail
# Directories and files made here hold programs containerd and systemd run
# as root: never writable by others, whatever umask the caller had.
umask 022

readonly NRI_SECTION='plugins."io.containerd.nri.v1.nri"'
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly SCRIPT_DIR
readonly REPO_DIR=${SCRIPT_DIR%/install}

PREFIX=/
# install/build.sh's output, else cargo's release build: the newer of the two.
if [[ -x $REPO_DIR/target/dist/devgate && ! $REPO_DIR/target/release/devgate -nt $REPO_DIR/target/dist/devgate ]]; then
    BIN_DIR=$REPO_DIR/target/dist
else
    BIN_DIR=$REPO_DIR/target/release
fi
HOOKS_SRC=$REPO_DIR/hooks
DRY_RUN=0
UNINSTALL=0
PREINSTALLED=0
NODE_ONLY=0
HOOKS_ONLY=0
CONTAINERD_VERSION=${DEVGATE_CONTAINERD_VERSION:-}
CHANGES=0
FAILURES=0
RESTART_CONTAINERD=0
RESTART_DEVGATE=0
# The service whose restart a file change under way will owe (see owing).
IN_FLIGHT=
# Temporary files, removed at exit however bootstrap ends (see make_temp).
TEMPS=()

log() { printf 'bootstrap: %s\n' "$*"; }
# make_temp VAR: a temporary file's path into VAR, the file removed when
# bootstrap exits, on an error too: one may be a copy of containerd's config,
# which can hold registry credentials. Not in a subshell, so that it is
# remembered.
make_temp() {
    local t
    t=$(mktemp) || die "cannot make a temporary file"
    TEMPS+=("$t")
    printf -v "$1" '%s' "$t"
}
remove_temps() {
    ((${#TEMPS[@]} == 0)) || rm -f "${TEMPS[@]}"
}
warn() { printf 'bootstrap: warning: %s\n' "$*" >&2; }
die() {
    printf 'bootstrap: error: %s\n' "$*" >&2
    exit 1
}

usage() {
    sed -n '2,7p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
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
        --node-only) NODE_ONLY=1 ;;
        --hooks-only) HOOKS_ONLY=1 ;;
        --dry-run) DRY_RUN=1 ;;
        --uninstall) UNINSTALL=1 ;;
        -h | --help) usage 0 ;;
        *) warn "unknown argument $1" && usage 2 ;;
        esac
        shift
    done
    ((!(PREINSTALLED && NODE_ONLY))) || die "--node-only installs no plugin: --preinstalled makes no sense with it"
    ((!(HOOKS_ONLY && (PREINSTALLED || NODE_ONLY)))) ||
        die "--hooks-only installs no plugin and no DaemonSet node: it takes neither --preinstalled nor --node-only"
    [[ $PREFIX == /* ]] || die "--prefix must be an absolute path, got $PREFIX"
    # In normal form (no `//`, `.` or `..`, links kept): paths under it are
    # compared and cut as text, against imports cleaned the same way.
    PREFIX=$(realpath -ms -- "$PREFIX")
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
# containerd's NRI socket unless its config sets socket_path (check_nri_paths).
NRI_SOCKET=/var/run/nri/nri.sock
# The usual hooks.d directories. podman and CRI-O read only their hooks_dir,
# /usr/share's alone by default; /etc's serves where it is listed there.
readonly HOOKS_DIRS=(/etc/containers/oci/hooks.d /usr/share/containers/oci/hooks.d)
readonly MODPROBE=/etc/modprobe.d/devgate-rdma.conf
# The kernel forgets sriov_numvfs at every boot and driver reload: this rule
# writes the configured counts again when the PF's driver binds.
readonly UDEV_RULES=/etc/udev/rules.d/70-devgate-sriov.rules
readonly MANIFEST=/var/lib/devgate/install/manifest

# The parts, one concern each; they only define functions.
# shellcheck source=lib/files.sh
. "$SCRIPT_DIR/lib/files.sh"
# shellcheck source=lib/containerd.sh
. "$SCRIPT_DIR/lib/containerd.sh"
# shellcheck source=lib/devgate.sh
. "$SCRIPT_DIR/lib/devgate.sh"
# shellcheck source=lib/services.sh
. "$SCRIPT_DIR/lib/services.sh"
# shellcheck source=lib/node.sh
. "$SCRIPT_DIR/lib/node.sh"
# shellcheck source=lib/uninstall.sh
. "$SCRIPT_DIR/lib/uninstall.sh"

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

# Before any change: both modes run devgate to read the node preparation
# (step 6), so a run without it would stop halfway, its edits made.
check_bin_dir() {
    if [[ ! -x $BIN_DIR/devgate ]]; then
        ((!NODE_ONLY)) || die "--node-only reads [sriov] and [rdma] from the config with devgate, and there is none at $BIN_DIR/devgate: pass --bin-dir with a directory holding it (the image's /usr/local/bin/devgate, on a node whose glibc is as new as the image builder's, or a build for the node); nothing changed"
        die "no devgate in --bin-dir $BIN_DIR (cargo build --release, or install/build.sh); nothing changed"
    fi
    # A full install copies both, devgate first.
    ((NODE_ONLY)) || [[ -x $BIN_DIR/devgate-hook ]] ||
        die "no devgate-hook in --bin-dir $BIN_DIR (cargo build --release, or install/build.sh); nothing changed"
    BIN_DIR=$(cd "$BIN_DIR" && pwd)
    # Each must run on this node (its C library, its architecture): a plugin
    # that cannot start leaves pods without their devices, a pre-installed one
    # takes containerd's start down with it, and a hook that cannot run fails
    # every container it is named for.
    local bin out
    for bin in devgate devgate-hook; do
        [[ -x $BIN_DIR/$bin ]] || continue
        # --node-only installs no hook.
        [[ $bin == devgate || $NODE_ONLY == 0 ]] || continue
        out=$("$BIN_DIR/$bin" --version 2>&1 >/dev/null) ||
            die "$BIN_DIR/$bin does not run on this node: $(head -c 300 <<<"$out"); nothing changed"
    done
    ((NODE_ONLY)) || log "binaries from $BIN_DIR"
}

main() {
    trap remove_temps EXIT
    parse_args "$@"
    ((DRY_RUN)) || [[ $(id -u) -eq 0 ]] || die "must run as root"
    check_os
    if ((UNINSTALL)); then
        uninstall
    else
        check_register_wait
        check_bin_dir
        check_numvfs
        if ((HOOKS_ONLY)); then
            check_hooks_only
        else
            check_containerd
        fi
        load_pending
        trap 'save_pending; remove_temps' EXIT
        # A run cut by a signal ends through exit, so that save_pending sees
        # it failed (bash gives an EXIT trap a status of 0 on a fatal
        # signal) and records what it owes.
        trap 'exit 129' HUP
        trap 'exit 130' INT
        trap 'exit 143' TERM
        install_devgate
        if ((HOOKS_ONLY)); then
            if has_containerd || [[ -e $(p "$EMBEDDED_SOCKET") ]]; then
                warn "containerd runs here and never reads hooks.d: its pods get no devices without the plugin (install without --hooks-only)"
            fi
        else
            enable_nri
        fi
        prepare_node
        restart_services
        ((FAILURES != 0)) || clear_pending
    fi
    if ((CHANGES == 0)); then
        log "no changes"
    elif ((DRY_RUN)); then
        log "dry run: $CHANGES change(s) not made"
    fi
    ((FAILURES == 0)) || die "$FAILURES step(s) failed; see the warnings above"
}

main "$@"
