//! A test-only CNI plugin: gives a pod its own `eth0` (one end of a veth pair)
//! without any address or route, so that containerd accepts the sandbox network
//! while no traffic can leave it. It reports 127.1.0.2/32 because containerd
//! fails a sandbox whose CNI result has no IP ("failed to find network info").
//! containerd also always runs a `loopback` plugin first; a stand-in for it
//! brings `lo` up.
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// The plugin's type, file name and network name.
pub const CNI_TYPE: &str = "devgate-test-cni";

/// Common head of both plugins: reads the network config from stdin and
/// answers in the cniVersion it asked for (containerd's loopback config is 0.3.1).
const PRELUDE: &str = r#"#!/bin/sh
set -eu
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
ver=$(sed -n 's/.*"cniVersion" *: *"\([^"]*\)".*/\1/p' | head -n1)
case "$CNI_COMMAND" in
VERSION)
    echo '{"cniVersion":"1.0.0","supportedVersions":["0.3.1","0.4.0","1.0.0"]}'
    exit 0
    ;;
ADD|DEL|CHECK) ;;
*)
    printf '{"cniVersion":"%s","code":4,"msg":"unsupported command %s"}\n' "$ver" "$CNI_COMMAND"
    exit 1
    ;;
esac
"#;

/// The veth host end is named after the sandbox ID so that ADD and DEL agree
/// without any state file, and parallel pods never collide.
const VETH: &str = r#"
host_if="dg$(printf %s "$CNI_CONTAINERID" | cut -c1-12)"
case "$CNI_COMMAND" in
ADD)
    ip link add "$host_if" type veth peer name eth0 netns "$CNI_NETNS"
    printf '{"cniVersion":"%s","interfaces":[{"name":"eth0","sandbox":"%s"}],"ips":[{"address":"127.1.0.2/32","interface":0}]}\n' "$ver" "$CNI_NETNS"
    ;;
DEL)
    ip link del "$host_if" 2>/dev/null || true
    ;;
esac
"#;

const LOOPBACK: &str = r#"
if [ "$CNI_COMMAND" = ADD ]; then
    nsenter --net="$CNI_NETNS" ip link set lo up
    printf '{"cniVersion":"%s"}\n' "$ver"
fi
"#;

/// Writes the plugin into `bin_dir` and its conflist into `conf_dir`.
pub fn install(bin_dir: &Path, conf_dir: &Path) {
    std::fs::create_dir_all(bin_dir).expect("create CNI bin dir");
    std::fs::create_dir_all(conf_dir).expect("create CNI conf dir");
    for (name, body) in [(CNI_TYPE, VETH), ("loopback", LOOPBACK)] {
        let plugin = bin_dir.join(name);
        std::fs::write(&plugin, format!("{PRELUDE}{body}")).expect("write CNI plugin");
        std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755))
            .expect("chmod CNI plugin");
    }
    let conflist = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": CNI_TYPE,
        "plugins": [{ "type": CNI_TYPE }],
    });
    std::fs::write(
        conf_dir.join("10-devgate-test.conflist"),
        serde_json::to_vec_pretty(&conflist).expect("conflist json"),
    )
    .expect("write CNI conflist");
}
