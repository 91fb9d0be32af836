# shellcheck shell=bash disable=SC2034,SC2154 # globals are bootstrap.sh's
# Part of install/bootstrap.sh, which sources it: the service restarts, and the
# check that devgate registered with the runtime after them. Uses the globals
# and helpers bootstrap.sh defines (p, log, warn, die, DRY_RUN, CHANGES,
# FAILURES, the host paths).

# --- services ------------------------------------------------------------------

# Tests point DEVGATE_BOOTSTRAP_SYSTEMCTL at a stand-in for systemctl, which
# then runs under a --prefix too.
readonly SYSTEMCTL_STANDIN=${DEVGATE_BOOTSTRAP_SYSTEMCTL:-}

# Whether systemctl_do runs systemctl (or the stand-in).
services_run() {
    ((!DRY_RUN)) || return 1
    [[ -n $SYSTEMCTL_STANDIN ]] || { real_root && [[ -d /run/systemd/system ]]; }
}

systemctl_do() {
    if ((DRY_RUN)); then
        log "would run: systemctl $*"
    elif [[ -n $SYSTEMCTL_STANDIN ]]; then
        log "systemctl $*"
        "$SYSTEMCTL_STANDIN" "$@" || FAILURES=$((FAILURES + 1))
    elif ! real_root; then
        log "skip (prefix $PREFIX): systemctl $*"
    elif [[ ! -d /run/systemd/system ]]; then
        warn "systemd is not running: run 'systemctl $*' yourself"
    else
        log "systemctl $*"
        systemctl "$@" || FAILURES=$((FAILURES + 1))
    fi
}

# A run that changed files and then stopped on an error before its restarts
# owes them: a file beside the manifest remembers which, so that the next run
# restarts even when it changes nothing itself.
pending_file() { p "$(dirname "$MANIFEST")/pending-restart"; }

load_pending() {
    local f
    f=$(pending_file)
    [[ -f $f ]] || return 0
    if grep -qx containerd "$f"; then RESTART_CONTAINERD=1; fi
    if grep -qx devgate "$f"; then RESTART_DEVGATE=1; fi
    log "restarts owed by an earlier run that stopped: $(tr '\n' ' ' <"$f")"
}

# The EXIT trap: on failure, records the restarts this run owes, and only
# those: one that paid an earlier run's restarts and then failed (devgate did
# not register) owes none, and the record of them goes.
save_pending() {
    local status=$? f
    ((status != 0 && !DRY_RUN)) || return 0
    [[ -z $IN_FLIGHT ]] || owe "$IN_FLIGHT"
    f=$(pending_file)
    [[ -d $(dirname "$f") ]] || return 0
    if ((!RESTART_CONTAINERD && !RESTART_DEVGATE)); then
        rm -f "$f"
        return 0
    fi
    {
        ((RESTART_CONTAINERD)) && echo containerd
        ((RESTART_DEVGATE)) && echo devgate
    } >"$f" 2>/dev/null || true
    return 0
}

# owing SERVICE CMD...: runs CMD (put_file, put_text, put_link, undo_owned),
# which returns 0 when it changed a file SERVICE reads; then SERVICE owes a
# restart. The debt counts from before CMD runs: a run that stops inside it
# (a signal, the manifest not written after the file went into place)
# records it at exit, at worst one restart more than was needed.
owing() {
    local service=$1 rc=0
    shift
    IN_FLIGHT=$service
    "$@" || rc=$?
    IN_FLIGHT=
    ((rc == 0)) || return "$rc"
    owe "$service"
}

# owe SERVICE: SERVICE (containerd or devgate) is to be restarted.
owe() {
    case $1 in
    containerd) RESTART_CONTAINERD=1 ;;
    devgate) RESTART_DEVGATE=1 ;;
    esac
}

clear_pending() {
    ((DRY_RUN)) || rm -f "$(pending_file)"
}

restart_services() {
    local since restarted=0 failures containerd_restarted=0
    since=$(date +%s)
    # devgate's unit first: the plugin it replaces would otherwise reconnect
    # to the restarted containerd and register, vouching for a new binary
    # that may never start. The new one waits for containerd's socket.
    # --node-only and --hooks-only removed devgate's unit: nothing of
    # devgate's to restart (a hook runs afresh at each container).
    if ((RESTART_DEVGATE && !PREINSTALLED && !NODE_ONLY && !HOOKS_ONLY)); then
        failures=$FAILURES
        systemctl_do daemon-reload
        systemctl_do enable devgate.service
        systemctl_do restart devgate.service
        restarted=1
        # Paid: a registration that fails below is reported, and not paid
        # again by the next run (save_pending keeps only what is owed).
        ((FAILURES != failures)) || RESTART_DEVGATE=0
    fi
    if ((RESTART_CONTAINERD)) && has_containerd; then
        # Only a Configure from the restarted containerd counts: the new
        # plugin may have registered with the old one within the second.
        if services_run; then rm -f "$(p /run/devgate/runtime.json)"; fi
        failures=$FAILURES
        systemctl_do restart containerd.service
        restarted=1
        containerd_restarted=1
        ((FAILURES != failures)) || RESTART_CONTAINERD=0
    fi
    # Only containerd is known to run NRI here (step 3 saw to it): CRI-O's
    # may be off, and podman has none.
    ((restarted && !NODE_ONLY && !HOOKS_ONLY)) && has_containerd && services_run || return 0
    registered_since "$since" && return 0
    if ((PREINSTALLED && containerd_restarted)); then
        unregistered_preinstalled
    else
        warn "devgate did not register with the runtime within ${REGISTER_WAIT}s of the restarts: see journalctl -u devgate and devgate doctor"
        FAILURES=$((FAILURES + 1))
    fi
}

# Seconds devgate gets to register after the restarts (DEVGATE_REGISTER_WAIT,
# default 20): containerd starts a pre-installed plugin as its CRI plugin
# starts, and the systemd one connects once the unit and containerd are up.
readonly REGISTER_WAIT=${DEVGATE_REGISTER_WAIT:-20}

# Before any change. At least a second (none would undo every pre-installed
# plugin at once), and no leading zero: bash reads 08 as a bad octal number.
check_register_wait() {
    [[ $REGISTER_WAIT =~ ^[1-9][0-9]{0,3}$ ]] ||
        die "DEVGATE_REGISTER_WAIT must be whole seconds from 1, got $REGISTER_WAIT; nothing changed"
}

# Whether a runtime configured devgate since `since` (epoch seconds): the
# plugin records each Configure in <state-dir>/runtime.json (the unit's and a
# pre-installed plugin's state dir is /run/devgate). Waits up to REGISTER_WAIT.
registered_since() {
    local since=$1 file tries
    file=$(p /run/devgate/runtime.json)
    for ((tries = REGISTER_WAIT * 4; tries > 0; tries--)); do
        [[ -f $file && $(stat -c %Y "$file") -ge $since ]] && return 0
        sleep 0.25
    done
    return 1
}

# A pre-installed plugin that does not register takes containerd 1.7 down
# with it (its NRI fails to start: every pod start fails), and leaves 2.x
# without devgate. Its files are undone (removed, or the plugin they replaced
# put back) and containerd restarted on what it had before; the next run
# installs them again.
unregistered_preinstalled() {
    warn "the pre-installed devgate did not register within ${REGISTER_WAIT}s of containerd's restart (journalctl -u containerd says why): undoing $PREINSTALLED_PLUGIN and restarting containerd without it"
    FAILURES=$((FAILURES + 1))
    local path
    for path in "$PREINSTALLED_PLUGIN" "$PREINSTALLED_CONF"; do
        undo_owned "$path" || true
    done
    systemctl_do restart containerd.service
}
