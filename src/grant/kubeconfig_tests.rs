//! Kubeconfig resolution as table tests: contexts, clusters and users, inline data
//! against files, relative paths, and what is refused.
use std::path::Path;

use super::*;

/// A kubeadm-style kubelet.conf: inline CA, client certificate and key in one
/// rotated file.
const KUBELET_CONF: &str = r#"
apiVersion: v1
kind: Config
clusters:
- cluster:
    certificate-authority-data: Q0E=
    server: https://10.0.0.1:6443/
  name: default-cluster
contexts:
- context:
    cluster: default-cluster
    namespace: default
    user: default-auth
  name: default-context
current-context: default-context
preferences: {}
users:
- name: default-auth
  user:
    client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem
    client-key: /var/lib/kubelet/pki/kubelet-client-current.pem
"#;

const TWO_CONTEXTS: &str = r#"
clusters:
- name: a
  cluster: { server: "https://a.example:443", certificate-authority: pki/ca.crt }
- name: b
  cluster: { server: "http://127.0.0.1:8001" }
users:
- name: tok
  user: { token: " abc ", tokenFile: /ignored }
- name: file
  user: { tokenFile: token }
- name: none
  user: {}
contexts:
- name: with-token
  context: { cluster: a, user: tok }
- name: with-file
  context: { cluster: a, user: file }
- name: proxy
  context: { cluster: b, user: none }
- name: proxy-token
  context: { cluster: b, user: tok }
current-context: with-token
"#;

fn file(p: &str) -> Option<Secret> {
    Some(Secret::File(p.into()))
}

#[test]
fn kubelet_conf_resolves_to_its_client_certificate() {
    let c = parse(KUBELET_CONF, Path::new("/etc/kubernetes"), "").unwrap();
    assert_eq!(c.server, "https://10.0.0.1:6443");
    assert_eq!(c.ca, Some(Secret::Inline(b"CA".to_vec())));
    let pem = "/var/lib/kubelet/pki/kubelet-client-current.pem";
    assert_eq!(
        c.client,
        Some(ClientCert {
            cert: Secret::File(pem.into()),
            key: Secret::File(pem.into()),
        })
    );
    assert_eq!(c.token, None);
}

/// Read as another process sees it: the kubeconfig where this process finds
/// it, the absolute files it names under that process's root, the relative
/// ones beside the kubeconfig.
#[test]
fn files_are_taken_under_the_root_given() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("proc/4242/root");
    let conf = root.join("etc/kubernetes/kubelet.conf");
    std::fs::create_dir_all(conf.parent().unwrap()).unwrap();
    let text = KUBELET_CONF.replace(
        "certificate-authority-data: Q0E=",
        "certificate-authority: pki/ca.crt",
    );
    std::fs::write(&conf, text).unwrap();
    let c = load_in(&conf, "", &root).unwrap();
    let pem = root.join("var/lib/kubelet/pki/kubelet-client-current.pem");
    assert_eq!(
        c.client,
        Some(ClientCert {
            cert: Secret::File(pem.clone()),
            key: Secret::File(pem),
        })
    );
    assert_eq!(
        c.ca,
        Some(Secret::File(root.join("etc/kubernetes/pki/ca.crt")))
    );
    // This process's own view: `load`, the root being `/`.
    let c = load(&conf, "").unwrap();
    assert_eq!(
        c.client.unwrap().cert,
        Secret::File("/var/lib/kubelet/pki/kubelet-client-current.pem".into())
    );
}

#[test]
fn contexts_select_cluster_and_user() {
    let dir = Path::new("/etc/devgate");
    let cases: &[(&str, &str, Option<Secret>, Option<Secret>)] = &[
        // (context, server, ca, token)
        (
            "",
            "https://a.example:443",
            file("/etc/devgate/pki/ca.crt"),
            Some(Secret::Inline(b"abc".to_vec())),
        ),
        (
            "with-file",
            "https://a.example:443",
            file("/etc/devgate/pki/ca.crt"),
            file("/etc/devgate/token"),
        ),
        ("proxy", "http://127.0.0.1:8001", None, None),
    ];
    for (context, server, ca, token) in cases {
        let c = parse(TWO_CONTEXTS, dir, context).unwrap();
        assert_eq!(&c.server, server, "{context}");
        assert_eq!(&c.ca, ca, "{context}");
        assert_eq!(&c.token, token, "{context}");
        assert_eq!(c.client, None);
    }
}

#[test]
fn refusals_name_what_is_wrong() {
    let dir = Path::new("/k");
    let user = |u: &str| {
        format!(
            "clusters: [{{name: c, cluster: {{server: \"https://h:6443\"}}}}]\n\
             users: [{{name: u, user: {u}}}]\n\
             contexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: x\n"
        )
    };
    let cluster = |c: &str| {
        format!(
            "clusters: [{{name: c, cluster: {c}}}]\nusers: [{{name: u, user: {{}}}}]\n\
             contexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: x\n"
        )
    };
    let cases: Vec<(String, &str, &str)> = vec![
        // (kubeconfig, context, expected text of the error)
        (TWO_CONTEXTS.into(), "nope", "no context named \"nope\""),
        (
            TWO_CONTEXTS.into(),
            "proxy-token",
            "credentials are never sent in clear text",
        ),
        ("clusters: []".into(), "", "current-context"),
        ("{ not: [yaml".into(), "", "decode kubeconfig"),
        (user("{exec: {command: aws}}"), "", "exec and auth-provider"),
        (user("{auth-provider: {name: gcp}}"), "", "auth-provider"),
        (user("{username: a, password: b}"), "", "basic auth"),
        (
            user("{client-certificate: /c.pem}"),
            "",
            "needs both certificate and key",
        ),
        (
            user("{client-key-data: '***'}"),
            "",
            "client-key-data is not valid base64",
        ),
        (
            cluster("{server: \"https://h\", insecure-skip-tls-verify: true}"),
            "",
            "insecure-skip-tls-verify",
        ),
        (
            cluster("{server: \"https://h\", tls-server-name: k}"),
            "",
            "tls-server-name",
        ),
        (
            cluster("{server: \"https://h\", proxy-url: \"http://p\"}"),
            "",
            "proxy-url",
        ),
        (cluster("{server: \"ftp://h\"}"), "", "not an http(s) url"),
        (cluster("{server: \"https://h?x=1\"}"), "", "has a query"),
        (cluster("{}"), "", "not an http(s) url"),
        (
            "contexts: [{name: x, context: {cluster: gone, user: u}}]\ncurrent-context: x\n".into(),
            "",
            "no cluster named \"gone\"",
        ),
    ];
    for (text, context, expected) in cases {
        let e = parse(&text, dir, context).unwrap_err().to_string();
        assert!(e.contains(expected), "{text}: {e}");
    }
}

#[test]
fn inline_data_wins_over_files_and_tolerates_line_breaks() {
    let text = "clusters: [{name: c, cluster: {server: \"https://h\", \
                certificate-authority: /ca, certificate-authority-data: \"Q0\\nE=\"}}]\n\
                users: [{name: u, user: {client-certificate-data: Q0VSVA==, client-certificate: /c, \
                client-key-data: S0VZ}}]\n\
                contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n";
    let c = parse(text, Path::new("/"), "").unwrap();
    assert_eq!(c.ca, Some(Secret::Inline(b"CA".to_vec())));
    let client = c.client.unwrap();
    assert_eq!(client.cert, Secret::Inline(b"CERT".to_vec()));
    assert_eq!(client.key, Secret::Inline(b"KEY".to_vec()));
}

#[test]
fn files_are_read_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubelet.conf");
    std::fs::write(&path, KUBELET_CONF).unwrap();
    assert_eq!(load(&path, "").unwrap().server, "https://10.0.0.1:6443");
    std::fs::write(&path, vec![b'#'; MAX_KUBECONFIG_BYTES as usize + 1]).unwrap();
    assert!(matches!(
        load(&path, ""),
        Err(KubeconfigError::TooLarge { .. })
    ));
    assert!(matches!(
        load(&dir.path().join("missing"), ""),
        Err(KubeconfigError::Read { .. })
    ));
}

/// A kubeconfig behind a dangling link: the error names the path as given,
/// the one the operator wrote, not where the link leads.
#[test]
fn a_dangling_link_is_named_as_given() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("proc/4242/root");
    let conf = root.join("etc/kubernetes/kubelet.conf");
    std::fs::create_dir_all(conf.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink("/opt/kubelet/missing.conf", &conf).unwrap();
    match load_in(&conf, "", &root) {
        Err(KubeconfigError::Read { path, source }) => {
            assert_eq!(path, conf);
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("{other:?}"),
    }
    // Once the target exists in that root, it is read.
    std::fs::create_dir_all(root.join("opt/kubelet")).unwrap();
    std::fs::write(root.join("opt/kubelet/missing.conf"), KUBELET_CONF).unwrap();
    assert_eq!(
        load_in(&conf, "", &root).unwrap().server,
        "https://10.0.0.1:6443"
    );
}
