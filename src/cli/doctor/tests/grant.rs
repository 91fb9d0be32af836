//! The grant check resolves the API server as the running plugin has it:
//! its environment and its files, read through procfs, not doctor's own.
use super::{healthy, run_check, write, Node};
use crate::cli::doctor::Status;

/// The healthy node's config without `[kube_api]`: the API server is found.
fn found_not_configured(n: &Node) {
    write(
        n.roots.config.as_deref().unwrap(),
        "[sriov.num_vfs]\n\"0000:19:00.0\" = 4\n",
    );
}

/// The running plugin (pid 4242) as in a DaemonSet's pod: the API server in
/// its environment, the node name from the downward API, and its service
/// account's token and CA in `sa`, a directory of its root; returns the
/// plugin's `/proc` directory.
fn plugin_in_a_pod(node: &Node, sa: &str) -> std::path::PathBuf {
    found_not_configured(node);
    let pid = node.roots.proc_dir.join("4242");
    write(
        &pid.join("environ"),
        "KUBERNETES_SERVICE_HOST=10.96.0.1\0KUBERNETES_SERVICE_PORT=443\0NODE_NAME=node-b\0",
    );
    let sa = pid.join("root").join(sa);
    write(&sa.join("token"), "t");
    write(&sa.join("ca.crt"), "c");
    pid
}

/// The check passes with the service account's token, for node-b.
fn passes_in_the_pod(node: &Node) {
    let got = run_check(node, "grant check");
    assert_eq!(got.status, Status::Pass, "{got:?}");
    assert_eq!(
        got.detail,
        "pods of node node-b from https://10.96.0.1:443 with a bearer token, as the running plugin (pid 4242) resolves it"
    );
}

/// A plugin in a DaemonSet's pod: the API server from its environment and
/// its service account, the node name from the downward API.
#[test]
fn a_plugin_in_a_pod_resolves_from_its_own_environment() {
    let node = healthy();
    plugin_in_a_pod(&node, "var/run/secrets/kubernetes.io/serviceaccount");
    passes_in_the_pod(&node);
}

/// Many images link `/var/run` to `/run` by an absolute link: the service
/// account's token is found through it in the plugin's root.
#[test]
fn the_service_accounts_token_is_found_through_an_absolute_link() {
    let node = healthy();
    let pid = plugin_in_a_pod(&node, "run/secrets/kubernetes.io/serviceaccount");
    std::fs::create_dir_all(pid.join("root/var")).unwrap();
    std::os::unix::fs::symlink("/run", pid.join("root/var/run")).unwrap();
    passes_in_the_pod(&node);
}

/// Where the plugin's environment cannot be read, doctor resolves with its
/// own and says so; with no plugin running, there is nothing to say.
#[test]
fn without_the_plugins_environment_doctor_says_whose_it_used() {
    let node = healthy();
    found_not_configured(&node);
    std::fs::remove_file(node.roots.proc_dir.join("4242/environ")).unwrap();
    let got = run_check(&node, "grant check");
    assert_eq!(got.status, Status::Warn, "{got:?}");
    assert!(
        got.detail.ends_with("(resolved with doctor's environment: that of the running plugin, pid 4242, is unreadable)"),
        "{}",
        got.detail
    );

    std::fs::remove_file(node.roots.proc_dir.join("4242/cmdline")).unwrap();
    let got = run_check(&node, "grant check");
    assert_eq!(
        got.detail,
        "off: allocations are applied as the annotation says, unchecked against the pod's requests"
    );
}

/// kubelet's kubeconfig is looked for where the plugin would find it, in its
/// root: one only the host has leaves a plugin in a pod without an API server.
#[test]
fn kubelets_kubeconfig_is_the_one_the_plugin_sees() {
    let node = healthy();
    found_not_configured(&node);
    write(
        &node.roots.etc_root.join("kubernetes/kubelet.conf"),
        "not: [a kubeconfig",
    );
    let got = run_check(&node, "grant check");
    assert_eq!(got.status, Status::Warn, "{got:?}");

    write(
        &node
            .roots
            .proc_dir
            .join("4242/root/etc/kubernetes/kubelet.conf"),
        "not: [a kubeconfig",
    );
    let got = run_check(&node, "grant check");
    assert_eq!(got.status, Status::Fail, "{got:?}");
    assert!(
        got.detail.ends_with(
            "every allocation would be refused, as the running plugin (pid 4242) resolves it"
        ),
        "{}",
        got.detail
    );
}

/// A kubeconfig the plugin's config names is read where the plugin reads
/// it: doctor took the config from the plugin's root, so its paths are the
/// plugin's.
#[test]
fn a_configured_kubeconfig_is_read_in_the_plugins_root() {
    let node = healthy();
    write(
        node.roots.config.as_deref().unwrap(),
        "[sriov.num_vfs]\n\"0000:19:00.0\" = 4\n[kube_api]\nkubeconfig = \"/host/etc/kubernetes/kubelet.conf\"\nnode_name = \"node-a\"\n",
    );
    write(
        &node
            .roots
            .proc_dir
            .join("4242/root/host/etc/kubernetes/kubelet.conf"),
        "apiVersion: v1\nkind: Config\n\
         clusters: [{name: c, cluster: {server: \"https://10.0.0.9:6443\"}}]\n\
         users: [{name: u, user: {token: t0k}}]\n\
         contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
    );
    let got = run_check(&node, "grant check");
    assert_eq!(got.status, Status::Pass, "{got:?}");
    assert_eq!(
        got.detail,
        "pods of node node-a from https://10.0.0.9:6443 with a bearer token, as the running plugin (pid 4242) resolves it"
    );
}

/// kubelet's kubeconfig at `conf` (in the plugin's root), its client
/// certificate and key at kubelet's usual path.
fn kubelet_conf_with_client_cert(conf: &std::path::Path) {
    write(
        conf,
        "apiVersion: v1\nkind: Config\n\
         clusters: [{name: c, cluster: {server: \"https://10.0.0.9:6443\"}}]\n\
         users: [{name: u, user: {client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem, \
         client-key: /var/lib/kubelet/pki/kubelet-client-current.pem}}]\n\
         contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
    );
}

/// A certificate and its key naming node `node`, written at `path`.
fn node_cert(path: &std::path::Path, node: &str) {
    use rcgen::{CertificateParams, DnType, KeyPair};
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, format!("system:node:{node}"));
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    write(path, &format!("{}{}", cert.pem(), key.serialize_pem()));
}

/// A healthy node with the API server not configured, and the running
/// plugin's root (pid 4242).
fn node_and_plugin_root() -> (Node, std::path::PathBuf) {
    let node = healthy();
    found_not_configured(&node);
    let root = node.roots.proc_dir.join("4242/root");
    (node, root)
}

/// The check passes with node-c's certificate from kubelet's kubeconfig.
fn passes_as_node_c(node: &Node) {
    let got = run_check(node, "grant check");
    assert_eq!(got.status, Status::Pass, "{got:?}");
    assert_eq!(
        got.detail,
        "pods of node node-c from https://10.0.0.9:6443 with a client certificate, as the running plugin (pid 4242) resolves it"
    );
}

/// The files kubelet's kubeconfig names are the plugin's too: its client
/// certificate, which only the plugin's root has here, names the node.
#[test]
fn the_kubeconfigs_files_are_read_in_the_plugins_root() {
    let (node, root) = node_and_plugin_root();
    kubelet_conf_with_client_cert(&root.join("etc/kubernetes/kubelet.conf"));
    node_cert(
        &root.join("var/lib/kubelet/pki/kubelet-client-current.pem"),
        "node-c",
    );
    passes_as_node_c(&node);
}

/// kubelet's `kubelet-client-current.pem` is an absolute link to the dated
/// certificate it rotates in: followed in the plugin's root, where the
/// certificate is, not in doctor's, and so is a kubeconfig that is a link.
#[test]
fn absolute_links_among_the_files_are_followed_in_the_plugins_root() {
    use std::os::unix::fs::symlink;
    let (node, root) = node_and_plugin_root();
    kubelet_conf_with_client_cert(&root.join("etc/kubernetes/kubelet-real.conf"));
    symlink(
        "/etc/kubernetes/kubelet-real.conf",
        root.join("etc/kubernetes/kubelet.conf"),
    )
    .unwrap();
    let pki = root.join("var/lib/kubelet/pki");
    node_cert(
        &pki.join("kubelet-client-2026-12-04-10-00-00.pem"),
        "node-c",
    );
    symlink(
        "/var/lib/kubelet/pki/kubelet-client-2026-12-04-10-00-00.pem",
        pki.join("kubelet-client-current.pem"),
    )
    .unwrap();
    passes_as_node_c(&node);
}

/// An exiting process's environment reads as empty: not the plugin's view.
#[test]
fn an_empty_environment_is_not_the_plugins() {
    let node = healthy();
    write(&node.roots.proc_dir.join("4242/environ"), "");
    let got = run_check(&node, "grant check");
    assert!(
        got.detail.contains("(resolved with doctor's environment"),
        "{}",
        got.detail
    );
}

/// The relative files a kubeconfig names are beside the path the plugin
/// reads it by, as for the plugin, not beside where its link leads.
#[test]
fn a_linked_kubeconfigs_relative_files_are_beside_the_link() {
    use std::os::unix::fs::symlink;
    let (node, root) = node_and_plugin_root();
    write(
        &root.join("opt/kubelet/kubelet.conf"),
        "apiVersion: v1\nkind: Config\n\
         clusters: [{name: c, cluster: {server: \"https://10.0.0.9:6443\"}}]\n\
         users: [{name: u, user: {client-certificate: pki/client.pem, client-key: pki/client.pem}}]\n\
         contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
    );
    node_cert(&root.join("etc/kubernetes/pki/client.pem"), "node-c");
    node_cert(&root.join("opt/kubelet/pki/client.pem"), "node-d");
    symlink(
        "/opt/kubelet/kubelet.conf",
        root.join("etc/kubernetes/kubelet.conf"),
    )
    .unwrap();
    passes_as_node_c(&node);
}
