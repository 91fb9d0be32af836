//! The watch as kubelet's identity: a kubeconfig like kubelet.conf (CA file,
//! client certificate and key in one file) against the fake API server behind a
//! TLS front that requires a client certificate from the cluster CA.
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use super::cache::Lookup;
use super::fake_api::{pod, FakeApi};
use super::*;

const NODE: &str = "node-a";

struct Pki {
    ca_pem: String,
    server: (CertificateDer<'static>, PrivateKeyDer<'static>),
    /// kubelet-client-current.pem: certificate then key.
    kubelet_pem: String,
    kubelet_der: CertificateDer<'static>,
}

fn pki() -> Pki {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    ca.distinguished_name.push(DnType::CommonName, "kubernetes");
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let leaf = |names: Vec<String>, cn: &str, usage| {
        let mut p = CertificateParams::new(names).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.extended_key_usages = vec![usage];
        let key = KeyPair::generate().unwrap();
        (p.signed_by(&key, &ca).unwrap(), key)
    };
    let (server, server_key) = leaf(
        vec!["127.0.0.1".into()],
        "kube-apiserver",
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let (kubelet, kubelet_key) = leaf(
        Vec::new(),
        &format!("system:node:{NODE}"),
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    Pki {
        ca_pem: ca.pem(),
        server: (
            server.der().clone(),
            PrivatePkcs8KeyDer::from(server_key.serialize_der()).into(),
        ),
        kubelet_pem: format!("{}{}", kubelet.pem(), kubelet_key.serialize_pem()),
        kubelet_der: kubelet.der().clone(),
    }
}

/// Terminates TLS (client certificate required) and relays each request to the
/// plain fake API server; records the client certificate of each connection.
struct TlsFront {
    url: String,
    peers: Arc<Mutex<Vec<CertificateDer<'static>>>>,
}

fn tls_front(pki: &Pki, backend: &str) -> TlsFront {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::pem::PemObject::pem_slice_iter(pki.ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::clone(&provider),
    )
    .build()
    .unwrap();
    let config = Arc::new(
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(vec![pki.server.0.clone()], pki.server.1.clone_key())
            .unwrap(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("https://{}", listener.local_addr().unwrap());
    let peers = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&peers);
    let backend = backend.trim_start_matches("http://").to_string();
    std::thread::spawn(move || {
        for tcp in listener.incoming().flatten() {
            let (config, seen, backend) = (Arc::clone(&config), Arc::clone(&seen), backend.clone());
            std::thread::spawn(move || relay(config, tcp, &seen, &backend));
        }
    });
    TlsFront { url, peers }
}

fn relay(
    config: Arc<rustls::ServerConfig>,
    tcp: TcpStream,
    seen: &Mutex<Vec<CertificateDer<'static>>>,
    backend: &str,
) -> Option<()> {
    let conn = rustls::ServerConnection::new(config).ok()?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 64 << 10 {
        if tls.read(&mut byte).ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    if let Some(certs) = tls.conn.peer_certificates() {
        seen.lock().unwrap().extend(certs.iter().cloned());
    }
    let mut back = TcpStream::connect(backend).ok()?;
    back.write_all(&head).ok()?;
    let mut buf = [0u8; 16 << 10];
    loop {
        let n = back.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        tls.write_all(&buf[..n]).ok()?;
        tls.flush().ok()?;
    }
    tls.conn.send_close_notify();
    tls.flush().ok()
}

/// kubelet's files in `dir` and a kubelet.conf naming them (CA by a relative path).
fn kubelet_conf(dir: &Path, pki: &Pki, server: &str, with_client: bool) -> std::path::PathBuf {
    std::fs::write(dir.join("ca.crt"), &pki.ca_pem).unwrap();
    let pem = dir.join("kubelet-client-current.pem");
    std::fs::write(&pem, &pki.kubelet_pem).unwrap();
    let user = if with_client {
        format!(
            "{{client-certificate: {0}, client-key: {0}}}",
            pem.display()
        )
    } else {
        "{}".to_string()
    };
    let text = format!(
        "apiVersion: v1\nkind: Config\n\
         clusters: [{{name: c, cluster: {{server: \"{server}\", certificate-authority: ca.crt}}}}]\n\
         users: [{{name: u, user: {user}}}]\n\
         contexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: x\n"
    );
    let path = dir.join("kubelet.conf");
    std::fs::write(&path, text).unwrap();
    path
}

fn resolve(path: &Path) -> Mode {
    let config = Config::parse(
        &format!(
            "[kube_api]\nkubeconfig = \"{}\"\nnode_name = \"{NODE}\"\n",
            path.display()
        ),
        "t",
    )
    .unwrap();
    let none = Path::new("/nonexistent");
    settings::resolve(&config, &|_| None, none, none, "h")
}

#[test]
fn the_watch_runs_as_the_node_with_kubelets_client_certificate() {
    let pki = pki();
    let api = FakeApi::start().unwrap();
    api.put_pod(pod("ns", "p", "u-p", NODE, &[("nvidia.com/gpu", "1")]));
    let front = tls_front(&pki, api.url());
    let dir = tempfile::tempdir().unwrap();
    let mode = resolve(&kubelet_conf(dir.path(), &pki, &front.url, true));
    let Mode::Requests(ep) = &mode else {
        panic!("{mode:?}")
    };
    assert!(ep.client.is_some() && ep.token.is_none(), "{ep:?}");
    let state = tempfile::tempdir().unwrap();
    let checker = GrantChecker::with_mode(mode, state.path());
    match checker.cache().wait_for("u-p", Duration::from_secs(20)) {
        Lookup::Found(p) => assert_eq!(p.request.as_ref().unwrap().gpu_core, 100),
        other => panic!("{other:?}"),
    }
    // Through the watch, too, not only the list.
    api.put_pod(pod("ns", "q", "u-q", NODE, &[]));
    assert!(matches!(
        checker.cache().wait_for("u-q", Duration::from_secs(20)),
        Lookup::Found(_)
    ));
    let peers = front.peers.lock().unwrap().clone();
    assert!(!peers.is_empty() && peers.iter().all(|c| *c == pki.kubelet_der));
}

#[test]
fn without_the_client_certificate_or_the_ca_the_list_fails() {
    let pki = pki();
    let api = FakeApi::start().unwrap();
    let front = tls_front(&pki, api.url());
    let dir = tempfile::tempdir().unwrap();
    let Mode::Requests(anonymous) = resolve(&kubelet_conf(dir.path(), &pki, &front.url, false))
    else {
        panic!("kubeconfig not resolved")
    };
    let e = watch::PodClient::new(&anonymous)
        .unwrap()
        .list(&super::watch::ListFrom::Cache)
        .unwrap_err();
    assert!(matches!(e, watch::WatchError::Http { .. }), "{e}");
    let Mode::Requests(mut ep) = resolve(&kubelet_conf(dir.path(), &pki, &front.url, true)) else {
        panic!("kubeconfig not resolved")
    };
    assert!(watch::PodClient::new(&ep)
        .unwrap()
        .list(&super::watch::ListFrom::Cache)
        .is_ok());
    // Another CA: the API server's certificate is not trusted.
    let other = self::pki();
    ep.ca = Some(credentials::Secret::Inline(other.ca_pem.into_bytes()));
    assert!(watch::PodClient::new(&ep)
        .unwrap()
        .list(&super::watch::ListFrom::Cache)
        .is_err());
    assert!(api.requests().iter().all(|r| r.starts_with("list")));
}

#[test]
fn an_unusable_kubeconfig_fails_closed() {
    let mode = resolve(Path::new("/nonexistent/kubelet.conf"));
    let Mode::Unavailable(reason) = &mode else {
        panic!("{mode:?}")
    };
    assert!(
        reason.starts_with("kube_api.kubeconfig: read kubeconfig"),
        "{reason}"
    );
}

/// Without a configured node name or `$NODE_NAME`, the watch asks for the
/// pods of the node kubelet's certificate names, not the host name's.
#[test]
fn the_node_name_comes_from_kubelets_certificate() {
    let pki = pki();
    let none = Path::new("/nonexistent");
    let node_of = |with_client: bool, env: &dyn Fn(&str) -> Option<String>| {
        let dir = tempfile::tempdir().unwrap();
        let conf = kubelet_conf(dir.path(), &pki, "https://127.0.0.1:1", with_client);
        let config = Config::parse(
            &format!("[kube_api]\nkubeconfig = \"{}\"\n", conf.display()),
            "t",
        )
        .unwrap();
        match settings::resolve(&config, env, none, none, "Host-Name") {
            Mode::Requests(ep) => ep.node_name,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(node_of(true, &|_| None), NODE);
    let downward = |k: &str| (k == "NODE_NAME").then(|| "from-env".to_string());
    assert_eq!(node_of(true, &downward), "from-env");
    assert_eq!(node_of(false, &|_| None), "host-name");
}
