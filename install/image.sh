#!/usr/bin/env bash
# Builds the image install/kubernetes/daemonset.yaml runs, without a base image or
# a registry: devgate and devgate-hook in /usr/local/bin, the shared libraries they
# link (found with ldd, at the paths the binaries ask for) and the parts of glibc
# the host's NVML library needs when devgate loads it, and a static busybox
# for the init container's sh, cp and mv. The result is a docker-archive tarball,
# which `ctr -n k8s.io images import`, `podman load` and `docker load` all read.
#
# usage: install/image.sh [--bin-dir DIR] [--tag TAG] [--output FILE] [--busybox FILE]
#   --bin-dir  where devgate and devgate-hook are (default the newer of the
#              checkout's target/dist, built by install/build.sh, and
#              target/release, built by `cargo build --release --bins`)
#   --tag      image name (default ghcr.io/devgate/devgate:<version in Cargo.toml>)
#   --output   tarball to write (default the checkout's target/devgate-image.tar)
#   --busybox  a statically linked busybox (default /bin/busybox, Debian's
#              busybox-static)
#
# The init container copies devgate-hook onto the host, where runc runs it:
# install/build.sh links it statically, so it runs whatever C library the node
# has. A dynamically linked hook (a plain `cargo build`) is taken with a
# warning: it runs only on nodes whose glibc is no older than the build
# machine's (`objdump -T` shows what it needs).
set -euo pipefail
umask 022
# Paths given on the command line stay relative to where the script is run;
# the defaults are the checkout's.
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

die() {
    echo "image.sh: $*" >&2
    exit 1
}

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/Cargo.toml" | head -n 1)
if [[ -x $repo/target/dist/devgate && ! $repo/target/release/devgate -nt $repo/target/dist/devgate ]]; then
    bin_dir=$repo/target/dist
else
    bin_dir=$repo/target/release
fi
tag="ghcr.io/devgate/devgate:${version}"
output=$repo/target/devgate-image.tar
busybox=/bin/busybox
while (($#)); do
    case $1 in
    --bin-dir | --tag | --output | --busybox)
        (($# >= 2)) || die "$1 needs a value"
        case $1 in
        --bin-dir) bin_dir=$2 ;;
        --tag) tag=$2 ;;
        --output) output=$2 ;;
        --busybox) busybox=$2 ;;
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
# A tag is a colon in the last path component: `host:5000/devgate` has none.
[[ ${tag##*/} == *:* ]] || tag="${tag}:${version}"

binaries=("$bin_dir/devgate" "$bin_dir/devgate-hook")
for bin in "${binaries[@]}"; do
    [[ -x $bin ]] || die "$bin not found (install/build.sh, or pass --bin-dir)"
done
if linking=$(ldd "$bin_dir/devgate-hook" 2>&1) && ! grep -q 'statically linked' <<<"$linking"; then
    echo "image.sh: warning: $bin_dir/devgate-hook is dynamically linked; nodes need a glibc no older than this machine's (install/build.sh links it statically)" >&2
fi
[[ -x $busybox ]] || die "$busybox not found (apt-get install busybox-static)"
# A dynamic busybox would need libraries the image does not carry. ldd says
# "statically linked" and succeeds for a static-pie build, and fails for a
# plain static one.
if linking=$(ldd "$busybox" 2>&1) && ! grep -q 'statically linked' <<<"$linking"; then
    die "$busybox is dynamically linked; the image needs busybox-static"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rootfs=$work/rootfs
mkdir -p "$rootfs"/{usr/local/bin,bin,etc,dev,proc,sys,tmp,run}
chmod 1777 "$rootfs/tmp"

# Debug info stays out of the image (symbols stay, for backtraces and perf).
for bin in "${binaries[@]}"; do
    install -m 0755 "$bin" "$rootfs/usr/local/bin/"
    strip --strip-debug "$rootfs/usr/local/bin/$(basename "$bin")"
done
# Every library the dynamic loader resolves for them, at the path it resolves;
# a static build (ldd: "not a dynamic executable", or "statically linked" for
# static-pie) needs none.
for bin in "${binaries[@]}"; do
    deps=$(ldd "$bin" 2>/dev/null) || continue
    if missing=$(grep 'not found' <<<"$deps"); then
        die "$bin: $missing"
    fi
    awk '$2 == "=>" && $3 ~ /^\// { print $3 }
         $1 ~ /^\// && $2 ~ /^\(/ { print $1 }' <<<"$deps"
done | sort -u >"$work/libs"
# The host's NVML (`[gpu] nvml_library`) is loaded into devgate at run time and
# needs these parts of the C library besides libc.so.6, which devgate itself may not.
if libc=$(grep -m 1 '/libc\.so\.6$' "$work/libs"); then
    for part in libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1; do
        if [[ -e ${libc%/*}/$part ]]; then
            echo "${libc%/*}/$part"
        fi
    done >>"$work/libs"
    sort -u -o "$work/libs" "$work/libs"
fi
while read -r lib; do
    mkdir -p "$rootfs$(dirname "$lib")"
    cp -L "$lib" "$rootfs$lib"
done <"$work/libs"

install -m 0755 "$busybox" "$rootfs/bin/busybox"
for applet in sh cp mv rm ls cat mkdir; do
    ln -s busybox "$rootfs/bin/$applet"
done
echo 'root:x:0:0:root:/root:/bin/sh' >"$rootfs/etc/passwd"
echo 'root:x:0:' >"$rootfs/etc/group"

# One layer, reproducible: sorted names, fixed times and owners.
tar --sort=name --mtime=@0 --numeric-owner --owner=0 --group=0 \
    -C "$rootfs" -cf "$work/layer.tar" .
layer=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
archive=$work/archive
mkdir -p "$archive/$layer"
mv "$work/layer.tar" "$archive/$layer/layer.tar"
# The binaries were built on this host, for its architecture (OCI image-spec
# config.md: GOARCH names).
case $(uname -m) in
x86_64) arch=amd64 ;;
aarch64 | arm64) arch=arm64 ;;
ppc64le) arch=ppc64le ;;
s390x) arch=s390x ;;
riscv64) arch=riscv64 ;;
*) die "architecture $(uname -m): no OCI name for it" ;;
esac
cat >"$archive/config.json" <<EOF
{"architecture":"${arch}","os":"linux",
 "config":{"Env":["PATH=/usr/local/bin:/bin"],"Entrypoint":["/usr/local/bin/devgate"],
  "Cmd":["nri"],"WorkingDir":"/",
  "Labels":{"org.opencontainers.image.title":"devgate","org.opencontainers.image.version":"${version}"}},
 "rootfs":{"type":"layers","diff_ids":["sha256:${layer}"]}}
EOF
config=$(sha256sum "$archive/config.json" | cut -d' ' -f1)
mv "$archive/config.json" "$archive/$config.json"
printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]\n' \
    "$config" "$tag" "$layer" >"$archive/manifest.json"

mkdir -p "$(dirname "$output")"
tar --sort=name --mtime=@0 --numeric-owner --owner=0 --group=0 \
    -C "$archive" -cf "$output.tmp" .
mv -f "$output.tmp" "$output"
echo "image.sh: $tag -> $output (image id sha256:$config)"
