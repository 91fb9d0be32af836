# shellcheck shell=bash disable=SC2034,SC2154 # globals are bootstrap.sh's
# Part of install/bootstrap.sh, which sources it: the install manifest and the
# file operations that record what they did in it, and their reversal at
# --uninstall. Uses the globals and helpers bootstrap.sh defines (p, log, warn,
# die, DRY_RUN, CHANGES, FAILURES, the host paths).
#
# Callers test these functions (`! put_file ... ||`, `if put_file`), and bash
# ignores `set -e` in the whole body of a function so called: every step that
# can fail (a full disk) ends in `|| die`, so that a half-written file is never
# installed, recorded, or followed by a containerd restart.

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

# dir_writable DIR: whether the host directory DIR can be made or written:
# its nearest existing ancestor is writable, which access(2) denies on a
# read-only mount even to root.
dir_writable() {
    local d
    d=$(p "$1")
    while [[ ! -e $d ]]; do d=$(dirname "$d"); done
    [[ -w $d ]]
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
        [[ -d $(p "${missing[i]}") ]] || mkdir "$(p "${missing[i]}")" || die "cannot create ${missing[i]}"
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
        mkdir -p "$(dirname "$m")" || die "cannot create $(dirname "$MANIFEST")"
        for ((i = ${#missing[@]} - 1; i >= 0; i--)); do
            printf 'dir\t%s\t-\n' "${missing[i]}" >>"$m" || die "cannot write $MANIFEST"
        done
    fi
    touch "$m" || die "cannot write $MANIFEST"
    {
        awk -F'\t' -v k="$1" -v p="$2" '!($1 == k && $2 == p)' "$m" >"$m.new" &&
            printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$m.new" &&
            mv "$m.new" "$m"
    } || die "cannot write $MANIFEST"
}

manifest_drop() { # kind key
    local m
    m=$(p "$MANIFEST")
    [[ -f $m ]] || return 0
    {
        awk -F'\t' -v k="$1" -v p="$2" '!($1 == k && $2 == p)' "$m" >"$m.new" &&
            mv "$m.new" "$m"
    } || die "cannot write $MANIFEST"
}

# --- file operations ---------------------------------------------------------

# The backup of host path DEST. containerd starts every executable file in
# its NRI plugin directory as a plugin, so a backup kept there would run as a
# second one: backups of files there are kept beside the manifest.
backup_of() {
    case $1 in
    /opt/nri/plugins/*) printf '%s/backup/%s' "$(dirname "$MANIFEST")" "$(basename "$1")" ;;
    *) printf '%s.devgate-backup' "$1" ;;
    esac
}

# put_file SRC DEST MODE: installs SRC as host path DEST when its content or
# mode differs. The first time devgate touches a file that already exists, the
# file is kept as DEST.devgate-backup; so is a file someone changed after
# devgate last wrote it, which --uninstall then returns to rather than to an
# older state. Returns 0 when it changed something.
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
        # Show edits of text files (the containerd config) as a diff, without
        # context lines: the lines around an edit may be a registry's
        # credentials, and a dry run's output goes to tickets and CI logs.
        if [[ -f $target ]] && grep -Iq . "$target" && grep -Iq . "$src"; then
            # A last line without its newline would show as changed: compared
            # with one added, as the edit writes it.
            diff -U0 --label "$dest" --label "$dest (new)" <(awk 1 "$target") "$src" | sed 's/^/    /' || true
        fi
        return 0
    fi
    log "install $dest"
    ensure_dir "$(dirname "$dest")"
    local kind recorded
    kind=$(manifest_kind "$dest")
    recorded=$kind
    if [[ -n $kind ]] && [[ -e $target || -L $target ]] &&
        { [[ -L $target || ! -f $target ]] || [[ $(sha "$target") != "$(manifest_get "$kind" "$dest")" ]]; }; then
        log "$dest changed since devgate wrote it: that version is the one --uninstall restores"
        kind=
    fi
    if [[ -z $kind ]]; then
        if [[ -e $target || -L $target ]]; then
            ensure_dir "$(dirname "$(backup_of "$dest")")"
            cp -a "$target" "$(p "$(backup_of "$dest")")" || die "cannot back up $dest"
            kind=modified
        else
            kind=created
        fi
    fi
    # Removed at exit however bootstrap ends: a signal between the install
    # and the rename would otherwise leave an executable beside the target,
    # which NRI, in its plugin directory, would start as another plugin.
    TEMPS+=("$target.devgate-new")
    install -m "$mode" "$src" "$target.devgate-new" || {
        rm -f "$target.devgate-new"
        die "cannot write $dest"
    }
    mv -f "$target.devgate-new" "$target" || die "cannot install $dest"
    manifest_put "$kind" "$dest" "$(sha "$target")"
    if [[ -n $recorded && $recorded != "$kind" ]]; then
        manifest_drop "$recorded" "$dest"
    fi
}

# put_text DEST MODE: like put_file with the text on stdin.
put_text() {
    local tmp rc=0
    # Callers test put_text, which turns errexit off in it: a temporary file
    # not made or not written whole (a full /tmp) must not be installed.
    make_temp tmp
    cat >"$tmp" || {
        rm -f "$tmp"
        die "cannot write a temporary file for $1"
    }
    put_file "$tmp" "$1" "$2" || rc=$?
    rm -f "$tmp"
    return "$rc"
}

# link_place DEST TARGET [MORE]: returns 1 when DEST is already devgate's
# link to TARGET, 0 when nothing is there; dies otherwise (MORE is added to
# the refusal).
link_place() {
    local link
    link=$(p "$1")
    if [[ -L $link && $(readlink "$link") == "$2" ]]; then
        return 1
    fi
    [[ ! -e $link && ! -L $link ]] || die "$1 exists and is not devgate's link to $2: move it away first${3-}"
}

# put_link DEST TARGET: a symlink, created when absent; never replaces a file.
put_link() {
    local link
    link_place "$1" "$2" || return 1
    link=$(p "$1")
    CHANGES=$((CHANGES + 1))
    if ((DRY_RUN)); then
        log "would link $1 -> $2"
        return 0
    fi
    log "link $1 -> $2"
    ensure_dir "$(dirname "$1")"
    ln -s "$2" "$link" || die "cannot link $1"
    manifest_put created "$1" link
}

# --- removing and restoring what the manifest records --------------------------

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
    rm -f "$target" || die "cannot remove $path"
    manifest_drop created "$path"
}

# undo_owned PATH: removes the file devgate created at PATH, or puts back the
# one it replaced there; true when it changed something.
undo_owned() {
    case $(manifest_kind "$1") in
    created) remove_owned "$1" ;;
    modified) restore_owned "$1" ;;
    *) return 1 ;;
    esac
}

# Restores a file devgate modified, when nobody changed it since. Returns 0
# when it did (or would, in a dry run).
restore_owned() {
    local path=$1 target written backup
    target=$(p "$path")
    written=$(manifest_get modified "$path")
    backup=$(backup_of "$path")
    # An install from before backups left the plugin directory kept it beside the file.
    if [[ ! -e $(p "$backup") && ! -L $(p "$backup") ]] &&
        [[ -e $target.devgate-backup || -L $target.devgate-backup ]]; then
        backup=$path.devgate-backup
    fi
    [[ -f $(p "$backup") || -L $(p "$backup") ]] || {
        warn "$path: backup $backup is gone; left as it is"
        FAILURES=$((FAILURES + 1))
        return 1
    }
    if [[ -f $target && $(sha "$target") != "$written" ]]; then
        warn "$path changed after devgate wrote it; left as it is (the original is $backup)"
        FAILURES=$((FAILURES + 1))
        return 1
    fi
    CHANGES=$((CHANGES + 1))
    if ((DRY_RUN)); then
        log "would restore $path from $backup"
        return 0
    fi
    log "restore $path"
    mv -f "$(p "$backup")" "$target" || die "cannot restore $path"
    manifest_drop modified "$path"
}
