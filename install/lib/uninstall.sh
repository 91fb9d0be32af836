# shellcheck shell=bash disable=SC2034,SC2154 # globals are bootstrap.sh's
# Part of install/bootstrap.sh, which sources it: --uninstall, driven by the
# manifest. Uses the globals and helpers bootstrap.sh defines (p, log, warn,
# die, DRY_RUN, CHANGES, FAILURES, the host paths).

# --- uninstall -----------------------------------------------------------------

# Before anything is undone: pods in devgate's ledger still hold devices,
# and their containers' poststop hooks run the devgate-hook this would
# remove, so their VFs would never come back and their GPUs never be cleaned.
# After --node-only too: putting containerd's config back turns 1.7's NRI
# off under the DaemonSet's plugin, whose pods' releases would never come.
refuse_live_pods() {
    local because=$1
    local devgate status err
    devgate=$(installed_devgate)
    make_temp err
    if ! status=$(ledger_status "$devgate" 2>"$err"); then
        local why
        why=$(tail -c 300 "$err")
        rm -f "$err"
        die "cannot read devgate's ledger in /run/devgate with $devgate to see whether pods hold devices ($why): drain the node first, or pass --bin-dir with a directory holding a devgate; nothing changed"
    fi
    rm -f "$err"
    # No ledger, or serde_json's pretty form of its empty pod map.
    [[ -z $status || $status == *'"pods": {}'* ]] ||
        die "pods hold devices in devgate's ledger (devgate status lists them), and $because: drain the node first; nothing changed"
}

# undo_numvfs BDF COUNT: puts the PF's VF count back to COUNT, unless pods
# hold its VFs or the ledger cannot say (a failure: kept for the next run).
undo_numvfs() {
    local key=$1 value=$2
    local dev=/sys/bus/pci/devices/$key current
    if ! current=$(cat "$(p "$dev/sriov_numvfs")" 2>/dev/null); then
        warn "$key is gone: its VF count ($value before devgate) cannot be restored"
        ((DRY_RUN)) || manifest_drop numvfs "$key"
        return
    fi
    local held=""
    if ((current != value)) && ! held=$(held_vfs "$(installed_devgate)" "$key"); then
        warn "cannot read devgate's ledger to see which VFs of $key pods hold: its VF count ($value before devgate) is left until --uninstall runs again"
        FAILURES=$((FAILURES + 1))
        return
    fi
    if [[ -n $held ]]; then
        warn "the ledger names VFs of $key ($(echo "$held" | paste -sd, -)), held or quarantined: its VF count ($value before devgate) is left until the node is drained and --uninstall runs again"
        FAILURES=$((FAILURES + 1))
        return
    fi
    if ((current != value)); then
        CHANGES=$((CHANGES + 1))
        ((current == 0)) || write_sysfs "$dev/sriov_numvfs" 0
        ((value == 0)) || write_sysfs "$dev/sriov_numvfs" "$value"
    fi
    ((DRY_RUN)) || manifest_drop numvfs "$key"
}

uninstall() {
    local m kind key value
    local -a dirs=()
    m=$(p "$MANIFEST")
    if [[ ! -f $m ]]; then
        log "nothing installed (no $MANIFEST)"
        return
    fi
    refuse_live_pods "their containers' poststop hooks run the devgate-hook this would remove"
    # Nothing is owed to services being taken away.
    clear_pending
    local UNIT_REMOVED=0
    if [[ -n $(manifest_get unit devgate.service) ]]; then
        systemctl_do disable --now devgate.service
        ((DRY_RUN)) || manifest_drop unit devgate.service
        # The unit file goes below; systemd must forget it.
        UNIT_REMOVED=1
    fi
    # VF counts first: putting one back reads the ledger with the installed
    # devgate, which a re-run of bootstrap records after them, so that
    # newest first it would be gone by then.
    while IFS=$'\t' read -r kind key value; do
        [[ $kind != numvfs ]] || undo_numvfs "$key" "$value"
    done < <(tac "$m")
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
            # containerd restarts only onto a config or plugin actually put back.
            if restore_owned "$key" && [[ $key == "$CONTAINERD_CONFIG" || $key == "$PREINSTALLED_PLUGIN" ]]; then
                RESTART_CONTAINERD=1
            fi
            ;;
        numvfs) ;; # put back first, above
        dir) dirs+=("$key") ;;
        esac
    done < <(tac "$m")
    if ((UNIT_REMOVED)); then
        systemctl_do daemon-reload
    fi
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
