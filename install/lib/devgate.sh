# shellcheck shell=bash disable=SC2034,SC2154 # globals are bootstrap.sh's
# Part of install/bootstrap.sh, which sources it: devgate's binaries, config,
# systemd unit or pre-installed plugin, and hooks.d files.
# Uses the globals and helpers bootstrap.sh defines (p, log, warn, die, DRY_RUN,
# CHANGES, FAILURES, the host paths).

# --- devgate -----------------------------------------------------------------

unit_text() {
    cat <<EOF
# Installed by devgate's install/bootstrap.sh.
[Unit]
Description=devgate NRI plugin (GPU and RDMA device allocation)
After=containerd.service
Wants=containerd.service
# Restarted for as long as it fails, not given up on after five quick starts
# (a config fixed later, a ledger directory mounted late).
StartLimitIntervalSec=0

[Service]
ExecStart=$BIN/devgate nri --config $CONFIG --socket $NRI_SOCKET --state-dir /run/devgate
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

# The unit of an earlier systemd install; true when there was one.
remove_unit() {
    [[ -n $(manifest_get unit devgate.service) ]] || return 1
    systemctl_do disable --now devgate.service
    remove_owned "$UNIT" || true
    ((DRY_RUN)) || manifest_drop unit devgate.service
    systemctl_do daemon-reload
}

# A pre-installed plugin an earlier install left (or the file it replaced, put
# back); containerd forgets it only when it restarts. Any file that stays
# there (changed since it was written, what it replaced, one put there by
# hand) would run beside what this install sets up: every run fails, naming
# it, until it is gone.
remove_preinstalled() {
    owing containerd undo_owned "$PREINSTALLED_PLUGIN" || true
    undo_owned "$PREINSTALLED_CONF" || true
    if ((!DRY_RUN)) && [[ -e $(p "$PREINSTALLED_PLUGIN") || -L $(p "$PREINSTALLED_PLUGIN") ]]; then
        warn "$PREINSTALLED_PLUGIN is still there, and containerd starts whatever it is as an NRI plugin: remove it by hand, then restart containerd"
        FAILURES=$((FAILURES + 1))
    fi
}

# Before any change, --hooks-only: the plugin of an earlier install, which it
# removes, is what releases the pods it admitted (their hooks leave that to
# it), and the hooks.d file must have somewhere to go.
check_hooks_only() {
    if [[ -n $(manifest_get unit devgate.service) || -n $(manifest_kind "$PREINSTALLED_PLUGIN") ]]; then
        refuse_live_pods "only the NRI plugin this would remove releases the pods it admitted"
    fi
    local hook dir writable=()
    load_hooks_targets
    for hook in "$HOOKS_SRC"/*.json; do
        [[ -f $hook ]] || continue
        for dir in "${HOOKS_TARGETS[@]}"; do
            ! dir_writable "$dir" || writable+=("$dir")
        done
        break
    done
    ((${#writable[@]})) ||
        die "--hooks-only: no $HOOKS_SRC/*.json, or no hooks.d directory to put it in, so no runtime would run devgate-hook; nothing changed"
    local runtime
    for runtime in podman CRI-O; do
        ! read_by "$runtime" "${writable[@]}" || return 0
    done
    hooks_unread_warnings "${writable[@]}"
    die "--hooks-only: no hooks.d directory that podman or CRI-O reads can take devgate's file (${writable[*]} can), so no runtime would run devgate-hook; nothing changed"
}

# --node-only: a node whose plugin is the DaemonSet's. Its config (read for
# the VFs and the RDMA mode) is written when absent; a plugin an earlier
# install left would run beside the DaemonSet's on the same ledger: removed.
prepare_for_daemonset() {
    if [[ ! -e $(p "$CONFIG") ]]; then
        put_file "$SCRIPT_DIR/config.toml" "$CONFIG" 644 || true
    fi
    remove_unit || true
    remove_preinstalled
}

install_devgate() {
    if ((NODE_ONLY)); then
        prepare_for_daemonset
        return
    fi
    local b
    for b in devgate devgate-hook; do
        [[ -x $BIN_DIR/$b ]] || die "$BIN_DIR/$b not found: build with install/build.sh or pass --bin-dir"
        owing devgate put_file "$BIN_DIR/$b" "$BIN/$b" 755 || true
    done
    if [[ ! -e $(p "$CONFIG") ]]; then
        owing devgate put_file "$SCRIPT_DIR/config.toml" "$CONFIG" 644 || true
    fi
    if ((PREINSTALLED)); then
        # A systemd install from before would run a second plugin on the
        # same ledger.
        remove_unit || true
        # containerd starts pre-installed plugins itself, only when it starts.
        owing containerd put_file "$BIN_DIR/devgate" "$PREINSTALLED_PLUGIN" 755 || true
        owing containerd put_link "$PREINSTALLED_CONF" "$CONFIG" || true
    elif ((HOOKS_ONLY)); then
        # The runtime runs devgate-hook from hooks.d; a plugin from an
        # earlier install would apply the same pods again through NRI.
        remove_unit || true
        remove_preinstalled
    else
        # Likewise a pre-installed plugin from before, which containerd
        # would start beside this one.
        remove_preinstalled
        if owing devgate put_text "$UNIT" 644 < <(unit_text); then
            ((DRY_RUN)) || manifest_put unit devgate.service -
        fi
    fi
    install_hooks_d
}

# hooks_dirs, read once per run (its warnings said once): HOOKS_TARGETS.
HOOKS_TARGETS=()
load_hooks_targets() {
    ((${#HOOKS_TARGETS[@]})) || mapfile -t HOOKS_TARGETS < <(hooks_dirs)
}

# The hooks.d directories devgate's file goes into: the defaults, and those
# podman and CRI-O read.
hooks_dirs() {
    local dir
    {
        printf '%s\n' "${HOOKS_DIRS[@]}"
        runtime_hooks_dirs CRI-O
        runtime_hooks_dirs podman
    } | awk '!seen[$0]++' | while read -r dir; do
        if [[ $dir =~ ^/[A-Za-z0-9._/-]+$ ]]; then
            printf '%s\n' "$dir"
        else
            warn "hooks_dir $dir is not an absolute path of letters, digits and ._-/: devgate's hooks.d file is not put there"
        fi
    done
}

# runtime_hooks_dirs podman|CRI-O: the only directories that runtime reads
# hooks.d files from: the `hooks_dir` of the last of its config files that
# sets it (CRI-O: crio.conf, then its drop-ins in order; podman:
# containers.conf, /usr/share's, /etc's, then /etc's drop-ins), else its
# default, /usr/share/containers/oci/hooks.d alone (podman 4 reads /etc's
# only where containers.conf lists it: containers/common sets the default).
runtime_hooks_dirs() {
    local dirs=()
    if [[ $1 == podman ]]; then
        mapfile -t dirs < <(last_array engine hooks_dir /usr/share/containers/containers.conf \
            /etc/containers/containers.conf '/etc/containers/containers.conf.d/*.conf')
    else
        local crio=()
        mapfile -t crio < <(crio_config_files)
        mapfile -t dirs < <(last_array_in crio.runtime hooks_dir "${crio[@]}")
    fi
    ((${#dirs[@]})) || dirs=(/usr/share/containers/oci/hooks.d)
    printf '%s\n' "${dirs[@]}"
}

# last_array TABLE KEY FILE...: the strings of array KEY of TABLE in the
# last of the files (host paths, globs allowed, taken in order) that sets it.
last_array() {
    local table=$1 key=$2 pattern file files=()
    shift 2
    for pattern in "$@"; do
        while read -r file; do files+=("$file"); done < <(compgen -G "$(p "$pattern")" || true)
    done
    last_array_in "$table" "$key" "${files[@]}"
}

# last_array_in TABLE KEY FILE...: as last_array, the files given as they are.
last_array_in() {
    local table=$1 key=$2 file last=""
    shift 2
    for file in "$@"; do
        if [[ -f $file ]] && toml_sets "$key" "$file" "$table"; then last=$file; fi
    done
    [[ -z $last ]] || toml_strings "$key" "$last" "$table"
}

# CRI-O's config files in the order it merges them: crio.conf, then every
# file of its drop-in tree (CRI-O walks it with Go's filepath.Walk: entries
# of each directory by name, any name, subdirectories entered in place, a
# link to a file read, a link to a directory not entered), as `devgate
# doctor` reads them.
crio_config_files() {
    printf '%s\n' "$(p /etc/crio/crio.conf)"
    crio_walk "$(p /etc/crio/crio.conf.d)" 0
}

# crio_walk DIR DEPTH: the files below DIR in walk order; a bounded depth
# keeps a looping tree finite.
crio_walk() {
    local dir=$1 depth=$2 entry
    [[ -d $dir && $depth -lt 16 ]] || return 0
    while IFS= read -r entry; do
        if [[ -L $entry ]]; then
            [[ ! -f $entry ]] || printf '%s\n' "$entry"
        elif [[ -d $entry ]]; then
            crio_walk "$entry" $((depth + 1))
        elif [[ -f $entry ]]; then
            printf '%s\n' "$entry"
        fi
    done < <(find "$dir" -mindepth 1 -maxdepth 1 -print 2>/dev/null | LC_ALL=C sort)
}

# Step 5. In --hooks-only mode the hooks.d file is the whole install: a node
# where no directory podman or CRI-O reads took it fails the run.
install_hooks_d() {
    local hook dir found=0 placed=()
    load_hooks_targets
    for hook in "$HOOKS_SRC"/*.json; do
        [[ -f $hook ]] || continue
        found=1
        for dir in "${HOOKS_TARGETS[@]}"; do
            # /usr is read-only on image-based hosts (Fedora CoreOS, RHCOS,
            # Flatcar): said, and fatal below only where no runtime reads
            # the directories that took the file.
            if ! dir_writable "$dir"; then
                warn "$dir is on a read-only file system: $(basename "$hook") not installed there"
                continue
            fi
            put_file "$hook" "$dir/$(basename "$hook")" 644 || true
            placed+=("$dir")
        done
    done
    if ((!found)); then
        warn "no $HOOKS_SRC/*.json: CRI-O and podman will not run devgate-hook"
        return 0
    fi
    # Said where the file is the whole install: on a containerd node podman
    # and CRI-O may not even be there. (check_hooks_only refused a node
    # where neither reads a directory the file could go into.)
    ((!HOOKS_ONLY)) || hooks_unread_warnings "${placed[@]}"
}

# read_by RUNTIME DIR...: whether RUNTIME reads hooks.d files from one of DIR.
read_by() {
    local runtime=$1 dirs=() dir placed
    shift
    mapfile -t dirs < <(runtime_hooks_dirs "$runtime")
    for dir in "${dirs[@]}"; do
        for placed in "$@"; do
            [[ $placed != "$dir" ]] || return 0
        done
    done
    return 1
}

# hooks_unread_warnings DIR...: a warning for each of podman and CRI-O that
# reads none of DIR, the directories that take devgate's file, naming where
# to list /etc's.
hooks_unread_warnings() {
    local runtime dirs=() where
    for runtime in podman CRI-O; do
        ! read_by "$runtime" "$@" || continue
        mapfile -t dirs < <(runtime_hooks_dirs "$runtime")
        where="[engine] hooks_dir in /etc/containers/containers.conf.d/*.conf"
        [[ $runtime == podman ]] || where="[crio.runtime] hooks_dir in /etc/crio/crio.conf.d/*.conf"
        warn "$runtime reads hooks.d files only from ${dirs[*]}, which do not take devgate's file: list /etc/containers/oci/hooks.d in $where (keeping the directories listed)"
    done
}
