# shellcheck shell=bash disable=SC2034,SC2154 # globals are bootstrap.sh's
# Part of install/bootstrap.sh, which sources it: enabling NRI in containerd's
# config. Uses the globals and helpers bootstrap.sh defines (p, log, warn, die,
# DRY_RUN, CHANGES, FAILURES, the host paths).

# --- containerd --------------------------------------------------------------

# Whether this node runs containerd: `--containerd-version none` says it does
# not (a CRI-O or podman node), as does no containerd on the PATH.
has_containerd() {
    [[ $CONTAINERD_VERSION != none ]] && { [[ -n $CONTAINERD_VERSION ]] || command -v containerd >/dev/null; }
}

containerd_major_minor() {
    local v=$CONTAINERD_VERSION
    # Called only where has_containerd found one: on the PATH if not named.
    if [[ -z $v ]]; then
        # "containerd github.com/containerd/containerd 1.7.24~ds1 ..." or "containerd containerd.io v1.7.24 ..."
        v=$(containerd --version | awk '{ print $3 }')
    fi
    v=${v#v}
    [[ $v =~ ^([0-9]+)\.([0-9]+) ]] || die "cannot read the containerd version from '$v'"
    printf '%s %s\n' "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"
}

# awk: `nri` matches the NRI table's header in either TOML quoting
# (containerd 2.x writes [plugins.'io.containerd.nri.v1.nri'] in `containerd
# config default`), `nri_sub` the header of a table beneath it (containerd
# 2.2 writes [plugins.'io.containerd.nri.v1.nri'.default_validator] there);
# the program sets q to a single quote.
readonly NRI_HEADER_AWK='BEGIN {
    prefix = "^[ \t]*\\[[ \t]*plugins[ \t]*\\.[ \t]*[\"" q "]io\\.containerd\\.nri\\.v1\\.nri[\"" q "][ \t]*"
    nri = prefix "\\][ \t]*(#.*)?$"
    nri_sub = prefix "\\.[^]#]*\\][ \t]*(#.*)?$"
}'

# Prints the containerd config with NRI enabled, reading the current one on
# stdin. Exit 3: the file names the NRI plugin in a form this edit does not
# know (dotted keys, disabled_plugins): fail rather than guess. Exit 4: NRI is
# already on as the file stands (a `disable` that is already false is kept as
# written), so the file must not be rewritten, nor containerd restarted.
# Exit 5: the table sets `disable_connections = true`, which keeps `devgate
# nri` (not a pre-installed plugin) out for ever: an operator's choice that
# is refused, not undone. Exit 6: the file has CRLF line endings and names
# the NRI plugin or needs its table: the line patterns read neither a
# header nor a key so ended, and a second table of the same name would keep
# containerd from starting.
nri_enabled_config() {
    local need_section=$1 conn=1
    # `devgate nri` dials the socket; a pre-installed plugin is started by
    # containerd itself.
    ((!PREINSTALLED)) || conn=0
    awk -v need="$need_section" -v conn="$conn" -v q="'" "$NRI_HEADER_AWK"'
        function header(line) { return line ~ /^[ \t]*\[/ }
        /\r$/ { cr = 1 }
        $0 ~ nri {
            found = 1; in_nri = 1; print; next
        }
        # A table beneath the NRI one: the NRI table ends there, as at any
        # other header, and a table that the file defines only by this one
        # is added at the end (TOML lets a table follow its sub-tables).
        $0 ~ nri_sub {
            if (in_nri && !set && need == 1) { print "  disable = false"; changed = 1 }
            in_nri = 0; print; next
        }
        # The NRI table under another spelling (["plugins"."io.containerd.nri.v1.nri"]),
        # or a quoted key in it: not read, so neither added to nor guessed at.
        header($0) && /^[^#]*io\.containerd\.nri\.v1\.nri/ { odd = 1 }
        in_nri && /^[ \t]*["\047]/ { odd = 1 }
        header($0) {
            if (in_nri && !set && need == 1) { print "  disable = false"; changed = 1 }
            in_nri = 0; print; next
        }
        in_nri && /^[ \t]*disable[ \t]*=[ \t]*false[ \t]*(#.*)?$/ {
            set = 1; print; next
        }
        in_nri && /^[ \t]*disable[ \t]*=/ {
            match($0, /^[ \t]*/); print substr($0, 1, RLENGTH) "disable = false"; set = 1; changed = 1; next
        }
        in_nri && conn == 1 && /^[ \t]*disable_connections[ \t]*=[ \t]*true[ \t]*(#.*)?$/ {
            shut = 1
        }
        /^[ \t]*#/ { print; next }
        /io\.containerd\.nri\.v1\.nri/ { odd = 1 }
        { print }
        END {
            if (cr && (odd || found || need == 1)) exit 6
            if (odd) exit 3
            if (shut) exit 5
            if (in_nri && !set && need == 1) { print "  disable = false"; changed = 1 }
            if (!found && need == 1) {
                print ""
                print "[plugins.\"io.containerd.nri.v1.nri\"]"
                print "  disable = false"
                changed = 1
            }
            if (!changed) exit 4
        }'
}

# Dies when a file the config imports (directly or through another import)
# has an NRI table that leaves NRI off:
# containerd replaces a plugin's whole table with an imported one, so an edit
# of the main file would not take effect (`devgate doctor` merges imports the
# same way). An imported table that already turns NRI on is fine; one that
# sets `disable = false` itself is named in NRI_ON_BY_IMPORT: containerd
# applies it after the main file (replacing the table on 1.x, key by key on
# 2.x), so NRI is on whatever the main file's table says, and an edit of it
# would only restart containerd. (On 2.x an imported table without the key
# leaves the main file's `disable` in force, which is edited as before.)
NRI_ON_BY_IMPORT=
check_imports() {
    local cfg=$1 need=$2 file rc
    NRI_ON_BY_IMPORT=
    imported_files "$cfg"
    for file in "${IMPORTED[@]}"; do
        names_nri "$file" || continue
        rc=0
        nri_enabled_config "$need" <"$file" >/dev/null || rc=$?
        ((rc != 5)) || die "$(shut_out "/${file#"$(p /)"} (imported by $CONTAINERD_CONFIG)")"
        ((rc != 6)) || die "$(crlf "/${file#"$(p /)"} (imported by $CONTAINERD_CONFIG)")"
        ((rc == 4)) ||
            die "/${file#"$(p /)"} (imported by $CONTAINERD_CONFIG) configures NRI without enabling it, which overrides an edit of $CONTAINERD_CONFIG: set disable = false there by hand"
        if nri_sets_enabled <"$file"; then
            NRI_ON_BY_IMPORT="/${file#"$(p /)"}"
        fi
    done
}

# Whether the NRI table of the config on stdin sets `disable = false`.
nri_sets_enabled() {
    awk -v q="'" "$NRI_HEADER_AWK"'
        /^[ \t]*\[/ { in_nri = ($0 ~ nri); next }
        in_nri && /^[ \t]*disable[ \t]*=[ \t]*false[ \t]*(#.*)?$/ { on = 1 }
        END { exit !on }'
}

# Whether a config file names the NRI plugin outside a comment. One grep:
# with pipefail, `grep -v | grep -q` fails when -q stops reading early and
# the first grep dies of SIGPIPE.
names_nri() {
    grep -Eq '^[^#]*io\.containerd\.nri\.v1\.nri' "$1"
}

# The most files imports may bring in; a config importing more is refused
# (`devgate doctor` reads as many).
readonly MAX_IMPORTS=64

# IMPORTED: the files a config (as this run reads it, under --prefix)
# imports, in the same form, in the order containerd loads them
# (`LoadConfig`, services/server/config/config.go): breadth first, an
# imported file's own imports too, each resolved against the directory of the
# file that names it (`resolveImports`) and cleaned as containerd cleans it
# (`..` taken lexically, links not followed), each file once, and never the
# config itself, which a glob in its own directory matches. Set in this shell,
# not printed, so that too many stops bootstrap.
IMPORTED=()
imported_files() {
    local file pattern match i=0 main
    main=$(realpath -ms -- "$1")
    local -a queue=("$main")
    local -A seen=(["$main"]=1)
    IMPORTED=()
    while ((i < ${#queue[@]})); do
        file=${queue[i]}
        i=$((i + 1))
        while read -r pattern; do
            [[ -n $pattern ]] || continue
            [[ $pattern == /* ]] || pattern=$(dirname "/${file#"$(p /)"}")/$pattern
            while read -r match; do
                [[ -n $match ]] || continue
                match=$(realpath -ms -- "$match")
                [[ -z ${seen[$match]:-} ]] || continue
                seen[$match]=1
                queue+=("$match")
                IMPORTED+=("$match")
                ((${#IMPORTED[@]} <= MAX_IMPORTS)) ||
                    die "$CONTAINERD_CONFIG imports more than $MAX_IMPORTS files, with its imports' own imports: check them by hand, or gather them; nothing changed"
            done < <(compgen -G "$(p "$pattern")" || true)
        done < <(toml_strings imports "$file")
    done
}

# The strings of the array `key = [...]` in a TOML file, over as many lines
# as it takes, one per line, in any of TOML's quotes (multi-line ones written
# on one line); a path holding a quote or `#` is not one. With TABLE, only
# the key in that table (`[crio.runtime]`) counts, as the runtime reads it.
toml_strings() { # KEY FILE [TABLE]
    toml_key 0 "$@" |
        { grep -oE "'''[^']*'''|\"\"\"[^\"]*\"\"\"|\"[^\"]*\"|'[^']*'" || true; } | tr -d "\"'"
}

# Whether a TOML file sets KEY (in TABLE when given), even to an empty array.
toml_sets() { # KEY FILE [TABLE]
    toml_key 1 "$@"
}

# toml_key CHECK KEY FILE [TABLE]: the lines of KEY's value (CHECK 0), or
# whether it is there (CHECK 1). A table header outside a value names the
# table the keys below it are in, and a dotted key (`runtime.hooks_dir`
# under `[crio]`) is its table's path joined to it, their quotes and blanks
# dropped, as TOML reads them; an array of tables (`[[x]]`) is none a caller
# asks for.
toml_key() {
    # [ \t], not [[:space:]]: mawk before 1.3.4 knows no character classes.
    awk -v check="$1" -v key="$2" -v table="${4-*}" '
        !on && /^[ \t]*\[\[/ { cur = "\001"; next }
        !on && /^[ \t]*\[/ {
            cur = $0; sub(/^[ \t]*\[/, "", cur); sub(/\].*$/, "", cur); gsub("[\"\047 \t]", "", cur); next
        }
        !on && /=/ && !/^[ \t]*#/ {
            left = substr($0, 1, index($0, "=") - 1); gsub("[\"\047 \t]", "", left)
            full = (cur == "") ? left : cur "." left
            if ((table == "*" && left == key) || full == table "." key) {
                on = 1; found = 1; $0 = substr($0, index($0, "=") + 1)
            }
        }
        on { sub(/#.*/, ""); if (!check) print; if (/\]/) on = 0 }
        END { if (check) exit !found }' "$3"
}

shut_out() { # file
    local or=", or install with --preinstalled (containerd then starts devgate itself)"
    # The DaemonSet's plugin dials the socket: no other way for --node-only.
    ((!NODE_ONLY)) || or=""
    printf '%s' "$1 sets disable_connections = true in [$NRI_SECTION], which keeps devgate nri from ever connecting: set it to false$or"
}

# The refusal of a config with CRLF line endings (exit 6 above).
crlf() { # file
    printf '%s' "$1 has CRLF line endings, which this edit does not read: convert it to LF (sed -i 's/\r\$//' FILE), then run this again; nothing changed"
}

# k3s and RKE2 run a containerd of their own (its socket under /run/k3s),
# configured from a template under /var/lib/rancher/<k3s|rke2>/agent/etc/containerd
# that they render at each start: an edit of /etc/containerd/config.toml
# would never reach it, and a node taken for one without containerd would
# install a plugin that never registers. Refused unless
# --containerd-version none says NRI was enabled there by hand.
readonly EMBEDDED_SOCKET=/run/k3s/containerd/containerd.sock

check_embedded() {
    [[ $CONTAINERD_VERSION != none && -e $(p "$EMBEDDED_SOCKET") ]] || return 0
    die "$EMBEDDED_SOCKET is k3s's or RKE2's own containerd, configured from config.toml.tmpl under /var/lib/rancher/<k3s|rke2>/agent/etc/containerd, which this script does not edit: enable NRI there ([$NRI_SECTION] disable = false), restart k3s or rke2, then run this again with --containerd-version none; nothing changed"
}

# enable_nri [check]: with check 1, every refusal is made and nothing is
# written (bootstrap's look before its first change).
enable_nri() {
    local check=${1:-0} major minor need=1 cfg new rc=0
    check_embedded
    if ! has_containerd; then
        local sign
        # A containerd outside the PATH (a tarball in /usr/local/bin under
        # sudo's secure_path): never taken for a node without one.
        for sign in "$CONTAINERD_CONFIG" /run/containerd/containerd.sock; do
            [[ $CONTAINERD_VERSION == none || ! -e $(p "$sign") ]] ||
                die "no containerd on the PATH, but $sign is there: pass --containerd-version with its version (containerd --version), or none"
        done
        if ((!check)); then
            log "no containerd on this node: its NRI is not configured; CRI-O and podman run devgate-hook from hooks.d (and CRI-O with NRI enabled serves the plugin on its own socket)"
        fi
        return 0
    fi
    read -r major minor < <(containerd_major_minor)
    ((major > 1 || (major == 1 && minor >= 7))) || die "containerd $major.$minor has no NRI: install 1.7 or later"
    # 2.x enables NRI unless its config says otherwise.
    ((major == 1)) || need=0
    cfg=$(p "$CONTAINERD_CONFIG")
    # Replacing a link with a file would give it the link's mode (0777) and
    # leave the file it points to behind; a dangling one too.
    [[ ! -L $cfg ]] || die "$CONTAINERD_CONFIG is a symbolic link: enable NRI in the file it points to by hand"
    if [[ ! -e $cfg ]]; then
        if ((!need || check)); then
            return 0
        fi
        owing containerd put_text "$CONTAINERD_CONFIG" 644 < <(printf 'version = 2\n\n[%s]\n  disable = false\n' "$NRI_SECTION") ||
            true
        return 0
    fi
    if ! grep -Eq '^[[:space:]]*version[[:space:]]*=[[:space:]]*[23]([[:space:]]|#|$)' "$cfg"; then
        # A version 1 config (no version line, as Docker's containerd.io
        # package ships): 2.x migrates it as it loads and has NRI on, while
        # 1.7 reads the NRI table only in a version 2 layout.
        if ((!need)); then
            # NRI's settings in a version 1 layout (`[plugins.nri]`,
            # `disabled_plugins`) are not read here: refused, not guessed at.
            # Its imports are migrated alike.
            local file where
            imported_files "$cfg"
            for file in "$cfg" "${IMPORTED[@]}"; do
                grep -Eq '^[^#]*\<nri\>' "$file" || continue
                where=" names NRI"
                [[ $file == "$cfg" ]] || where=" imports /${file#"$(p /)"}, which names NRI"
                die "$CONTAINERD_CONFIG is a version 1 config that$where: this script reads NRI's settings only where the main config is version 2 or 3; check by hand that they leave NRI on (containerd config migrate prints the result as version 3), or migrate the config; nothing changed"
            done
            ((check)) || log "$CONTAINERD_CONFIG is a version 1 config: containerd $major.$minor migrates it as it loads, with NRI on; left as it is"
            return 0
        fi
        die "$CONTAINERD_CONFIG is not a version 2 or 3 config: containerd $major.$minor reads NRI's settings only from a version 2 config; rewrite it in that layout with version = 2 at its top (containerd config default prints one), then run this again"
    fi
    check_imports "$cfg" "$need"
    make_temp new
    nri_enabled_config "$need" <"$cfg" >"$new" || rc=$?
    if ((rc == 3)); then
        rm -f "$new"
        die "$CONTAINERD_CONFIG names io.containerd.nri.v1.nri outside a [$NRI_SECTION] table, or with a quoted key in it: set disable = false there by hand"
    fi
    ((rc != 6)) || { rm -f "$new"; die "$(crlf "$CONTAINERD_CONFIG")"; }
    if ((rc == 4)); then
        rm -f "$new"
        return 0
    fi
    if ((rc == 5)); then
        rm -f "$new"
        die "$(shut_out "$CONTAINERD_CONFIG")"
    fi
    ((rc == 0)) || die "cannot edit $CONTAINERD_CONFIG"
    if ((check)); then
        rm -f "$new"
        return 0
    fi
    if [[ -n $NRI_ON_BY_IMPORT ]]; then
        rm -f "$new"
        log "NRI is enabled by $NRI_ON_BY_IMPORT, which $CONTAINERD_CONFIG imports: $CONTAINERD_CONFIG left as it is"
        return 0
    fi
    # Keep the file's mode: containerd configs may hold registry credentials.
    owing containerd put_file "$new" "$CONTAINERD_CONFIG" "$(stat -c '%a' "$cfg")" || true
    rm -f "$new"
}

# The value of `key` in the NRI table of the config on stdin, its quotes
# taken off; nothing where the table does not set it as a string.
nri_value() {
    awk -v key="$1" -v q="'" "$NRI_HEADER_AWK"'
        /^[ \t]*\[/ { in_nri = ($0 ~ nri); next }
        in_nri {
            line = $0
            sub(/^[ \t]*/, "", line)
            if (index(line, key) != 1) next
            rest = substr(line, length(key) + 1)
            if (rest !~ /^[ \t]*=/) next
            sub(/^[ \t]*=[ \t]*/, "", rest)
            c = substr(rest, 1, 1)
            if (c != "\"" && c != q) next
            # A multi-line string (triple quotes) on one line, as a path is.
            t = c c c
            if (substr(rest, 1, 3) == t) {
                end = index(substr(rest, 4), t)
                if (end > 0) { print substr(rest, 4, end - 1); exit }
                next
            }
            end = index(substr(rest, 2), c)
            if (end > 0) { print substr(rest, 2, end - 1); exit }
        }'
}

# `key` of the NRI table containerd uses. containerd 1.x replaces a
# plugin's whole table with an imported one, so the last file naming the
# table holds it; 2.x merges tables key by key (containerd PR #9982), so the
# last file setting the key does, the main config first (see check_imports).
nri_setting() {
    local cfg file value set major
    cfg=$(p "$CONTAINERD_CONFIG")
    # No containerd (--containerd-version none): no NRI to read settings of.
    has_containerd && [[ -f $cfg ]] || return 0
    read -r major _ < <(containerd_major_minor)
    value=$(nri_value "$1" <"$cfg")
    imported_files "$cfg"
    for file in "${IMPORTED[@]}"; do
        names_nri "$file" || continue
        set=$(nri_value "$1" <"$file")
        if [[ -n $set ]] || ((major == 1)); then value=$set; fi
    done
    printf '%s' "$value"
}

# Before any change: where containerd's NRI listens and looks for plugins.
# The unit dials the socket_path the config sets; a pre-installed plugin
# must lie where containerd looks for one, and the DaemonSet mounts
# /var/run/nri. A path the unit cannot carry as written is refused.
check_nri_paths() {
    local socket
    socket=$(nri_setting socket_path)
    # A pre-installed plugin is handed its connection by containerd.
    if [[ -n $socket && $socket != /var/run/nri/nri.sock && $socket != /run/nri/nri.sock ]]; then
        if ((NODE_ONLY)); then
            warn "containerd's NRI socket is $socket: set the DaemonSet's --socket and its nri volume's hostPath to match"
        elif ((!PREINSTALLED)); then
            [[ $socket =~ ^/[A-Za-z0-9._/-]+$ ]] ||
                die "$CONTAINERD_CONFIG sets the NRI socket_path $socket, which the unit cannot name as written: use an absolute path of letters, digits and ._-/; nothing changed"
            NRI_SOCKET=$socket
            log "containerd's NRI socket, from $CONTAINERD_CONFIG: $socket"
        fi
    fi
    ((PREINSTALLED)) || return 0
    local key want set
    for key in plugin_path plugin_config_path; do
        want=$(dirname "$PREINSTALLED_PLUGIN")
        [[ $key == plugin_path ]] || want=$(dirname "$PREINSTALLED_CONF")
        set=$(nri_setting "$key")
        [[ -z $set || ${set%/} == "$want" ]] ||
            die "$CONTAINERD_CONFIG sets the NRI $key $set, where --preinstalled installs into $want: install without --preinstalled, or set $key back; nothing changed"
    done
}
