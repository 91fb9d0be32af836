//! How the plugin will check grants on this node (`crate::grant`): the API
//! server, the credentials and the node name it resolves from the config and
//! what the node has (a service account, kubelet's kubeconfig). Nothing is
//! dialled: this says what a plugin started now would do.
use std::path::Path;

use super::host::Roots;
use super::Check;
use crate::config::Config;
use crate::grant::{self, Mode};

const NAME: &str = "grant check";

pub fn grant_check(roots: &Roots, config: &Config) -> Check {
    let mode = grant::settings::resolve_on_host(
        config,
        &roots.host_root,
        &roots.host_path(Path::new(grant::KUBELET_KUBECONFIG)),
    );
    match mode {
        Mode::Requests(ep) => {
            let with = match (&ep.client, &ep.token) {
                (Some(_), _) => "a client certificate",
                (None, Some(_)) => "a bearer token",
                (None, None) => "no credentials",
            };
            Check::pass(
                NAME,
                format!(
                    "pods of node {} from {} with {with}",
                    ep.node_name, ep.base
                ),
            )
        }
        Mode::Off => Check::warn(
            NAME,
            "off: allocations are applied as the annotation says, unchecked against the pod's requests",
            "set kube_api.kubeconfig (kubelet's /etc/kubernetes/kubelet.conf) or run devgate in-cluster",
        ),
        Mode::Unavailable(reason) => Check::fail(
            NAME,
            format!("{reason}: every allocation would be refused"),
            "fix the kubeconfig or kube_api settings, or set grant_check = \"off\"",
        ),
    }
}
