# shellcheck shell=bash disable=SC2034,SC2154 # globals are bootstrap.sh's
# Part of install/bootstrap.sh, which sources it: node preparation from the
# config (VF counts, the RDMA netns mode). Uses the globals and helpers
# bootstrap.sh defines (p, log, warn, die, DRY_RUN, CHANGES, FAILURES, the host
# paths).

# --- node preparation ----------------------------------------------------------

write_sysfs() { # host path, value
    if ((DRY_RUN)); then
        log "would write $2 to $1"
        return
    fi
    log "write $2 to $1"
    printf '%s\n' "$2" >"$(p "$1")" || die "write $2 to $1 failed"
}

# ledger_status DEVGATE: `devgate status -o json` of /run/devgate, read with
# the devgate binary DEVGATE; nothing where there is no ledger. Fails (its
# stderr the reason) when the ledger cannot be read.
ledger_status() {
    local state
    state=$(p /run/devgate)
    [[ -e $state/ledger.json || -e $state/ledger.journal ]] || return 0
    "$1" status --state-dir "$state" -o json
}

# The devgate that reads the ledger in --uninstall: the installed one first,
# else the one in the bin dir (--bin-dir, or the checkout's build).
installed_devgate() {
    local devgate
    devgate=$(p "$BIN/devgate")
    [[ -x $devgate ]] || devgate=$BIN_DIR/devgate
    printf '%s' "$devgate"
}

# held_vfs DEVGATE BDF: the PF's VFs that pods hold in devgate's ledger, one
# a line, read with the devgate binary DEVGATE. Changing the count destroys
# every VF of the PF (0 is written first), those moved into running pods
# included. Status 2: the ledger cannot be read, which the callers take as
# holding everything: nothing is destroyed on a guess. The plugin may claim a
# VF between this look and the write: drain the node before a change.
held_vfs() {
    local link bdf status
    status=$(ledger_status "$1" 2>/dev/null) || return 2
    for link in "$(p "/sys/bus/pci/devices/$2")"/virtfn*; do
        [[ -L $link ]] || continue
        bdf=$(basename "$(readlink "$link")")
        [[ $status != *"\"vf $bdf\""* ]] || printf '%s\n' "$bdf"
    done
}

# refuse_held BDF: dies when pods hold VFs of the PF, or the ledger says not.
refuse_held() {
    local held
    held=$(held_vfs "$BIN_DIR/devgate" "$1") ||
        die "cannot read devgate's ledger in /run/devgate to see which VFs of $1 pods hold: its VF count left as it is"
    [[ -z $held ]] || die "[sriov] num_vfs changes the VF count of $1, which destroys its VFs, and pods hold $(echo "$held" | paste -sd, -): drain the node first"
}

# numvfs_now BDF COUNT: prints the PF's VF count now; dies when the config's
# count cannot be set on it.
numvfs_now() {
    local dev=/sys/bus/pci/devices/$1 total
    [[ -f $(p "$dev/sriov_numvfs") ]] || die "[sriov] num_vfs names $1, which has no $dev/sriov_numvfs"
    total=$(<"$(p "$dev/sriov_totalvfs")")
    (($2 <= total)) || die "[sriov] num_vfs asks $2 VFs of $1, which has at most $total"
    cat "$(p "$dev/sriov_numvfs")"
}

set_numvfs() { # bdf count
    local dev=/sys/bus/pci/devices/$1 current
    current=$(numvfs_now "$1" "$2")
    ((current == $2)) && return 0
    refuse_held "$1"
    CHANGES=$((CHANGES + 1))
    [[ -n $(manifest_get numvfs "$1") ]] || ((DRY_RUN)) || manifest_put numvfs "$1" "$current"
    # A change between two non-zero counts is refused with EBUSY.
    ((current == 0)) || write_sysfs "$dev/sriov_numvfs" 0
    write_sysfs "$dev/sriov_numvfs" "$2"
}

# udev_rule BDF COUNT: the line that gives the PF its VFs again after a boot or
# a driver reload. sriov_numvfs exists once the PF's driver is bound: "bind"
# comes when it binds (kernel 4.14 and later), "add" when coldplug replays the
# devices at boot for a driver the initramfs bound before udevd ran. A count of
# 0 is what the kernel starts with and needs no rule.
udev_rule() {
    printf 'ACTION=="add|bind", SUBSYSTEM=="pci", KERNEL=="%s", ATTR{sriov_numvfs}="%s"' "$1" "$2"
}

# keep_numvfs RULES: installs the udev rules file, or removes devgate's when
# there is nothing to keep. udevd reads changed rules files at its next event.
keep_numvfs() {
    if [[ -n $1 ]]; then
        put_text "$UDEV_RULES" 644 < <(printf '# Installed by devgate from [sriov.num_vfs]: the kernel forgets VF counts at boot.\n%s' "$1") || true
    else
        remove_owned "$UDEV_RULES" || true
    fi
}

# The node preparation the config asks for, one step a line: read once, by
# check_numvfs before any change (the config step installs the shipped
# config where there is none, which is what is read then too).
NODE_PREP=""
node_prep() {
    local cfg=$CONFIG
    # A dry run on a fresh node has no config yet: the shipped one applies.
    [[ -e $(p "$cfg") ]] || cfg=$SCRIPT_DIR/config.toml
    [[ $cfg == "$SCRIPT_DIR"/* ]] || cfg=$(p "$cfg")
    "$BIN_DIR/devgate" doctor --config "$cfg" --print-node-prep || die "read the node preparation from $cfg"
}

# Before any change: a VF count the config cannot have, or changes on a PF
# whose VFs pods hold, stops the run here, not after the binaries and
# containerd's config.
check_numvfs() {
    local kind a b c current
    NODE_PREP=$(node_prep)
    while read -r kind a b c; do
        [[ $kind == sriov_numvfs ]] || continue
        current=$(numvfs_now "$a" "$b")
        ((current == b)) || refuse_held "$a"
    done <<<"$NODE_PREP"
}

# Before any change: every refusal containerd's config would meet.
check_containerd() {
    enable_nri 1
    check_nri_paths
    check_preinstalled_conf
}

# Before any change: with --preinstalled, the config containerd hands the
# plugin goes where only devgate's own link may be; a file there would be
# refused after the unit was removed and the plugin copied in.
check_preinstalled_conf() {
    ((PREINSTALLED)) || return 0
    link_place "$PREINSTALLED_CONF" "$CONFIG" "; nothing changed" || true
}

prepare_node() {
    local kind a b c mode=shared
    local rules=""
    while read -r kind a b c; do
        case $kind in
        sriov_numvfs)
            set_numvfs "$a" "$b"
            ((b == 0)) || rules+=$(udev_rule "$a" "$b")$'\n'
            ;;
        rdma_netns_mode) mode=$a ;;
        "") ;;
        *) die "unexpected node preparation line: $kind $a $b $c" ;;
        esac
    done <<<"$NODE_PREP"
    keep_numvfs "$rules"
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
        log "notice: rdma.netns_mode = $mode takes effect after a reboot (ib_core reads netns_mode when it loads; where the initramfs loads it, rebuild that first: update-initramfs -u, or dracut -f)"
    fi
}
