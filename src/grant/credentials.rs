//! The credentials of the pod watch: a bearer token, the API server's CA and a
//! client certificate, each from a file or held in memory.
//!
//! Files are read again for every connection, never cached: service account
//! tokens are projected and rotated by kubelet, and kubelet rotates its own client
//! certificate (`/var/lib/kubelet/pki/kubelet-client-current.pem` is a symlink it
//! repoints), so a client that read them once would lose the API server when
//! they expire. Reads are bounded: these are small PEM or token files.

use std::fmt;
use std::path::PathBuf;

use crate::fsutil::BoundedError;

/// Largest certificate, key or CA bundle read (a CA bundle of a few hundred
/// roots is under 300 KiB).
pub const MAX_PEM_BYTES: u64 = 1 << 20;
/// Largest bearer token read (service account JWTs are about 1 KiB).
pub const MAX_TOKEN_BYTES: u64 = 64 << 10;

/// A credential: a file, re-read at each connection, or bytes from a kubeconfig.
#[derive(Clone, PartialEq, Eq)]
pub enum Secret {
    File(PathBuf),
    Inline(Vec<u8>),
}

// Inline secrets never reach a log line or an error message.
impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Secret::File(p) => write!(f, "File({})", p.display()),
            Secret::Inline(b) => write!(f, "Inline(<{} bytes>)", b.len()),
        }
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Secret::File(p) => write!(f, "{}", p.display()),
            Secret::Inline(_) => f.write_str("inline data"),
        }
    }
}

/// A client certificate (chain) and its private key, PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    pub cert: Secret,
    pub key: Secret,
}

#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("read {what} {source_name}: {source}")]
    Read {
        what: &'static str,
        source_name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} {source_name} is larger than {limit} bytes")]
    TooLarge {
        what: &'static str,
        source_name: String,
        limit: u64,
    },
    #[error("{what} {source_name}: {reason}")]
    Pem {
        what: &'static str,
        source_name: String,
        reason: String,
    },
}

fn read(what: &'static str, secret: &Secret, limit: u64) -> Result<Vec<u8>, CredentialError> {
    let path = match secret {
        Secret::Inline(b) if b.len() as u64 > limit => {
            return Err(CredentialError::TooLarge {
                what,
                source_name: secret.to_string(),
                limit,
            })
        }
        Secret::Inline(b) => return Ok(b.clone()),
        Secret::File(p) => p,
    };
    let err = |source| CredentialError::Read {
        what,
        source_name: secret.to_string(),
        source,
    };
    match crate::fsutil::read_file_bounded(path, limit) {
        Ok(bytes) => Ok(bytes),
        Err(BoundedError::Io(source)) => Err(err(source)),
        Err(BoundedError::TooLarge { .. }) => Err(CredentialError::TooLarge {
            what,
            source_name: secret.to_string(),
            limit,
        }),
    }
}

/// The `Authorization` header value for `token`, read now.
pub fn bearer(token: &Secret) -> Result<String, CredentialError> {
    let bytes = read("token", token, MAX_TOKEN_BYTES)?;
    let text = std::str::from_utf8(&bytes)
        .ok()
        .map(str::trim)
        .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or_else(|| CredentialError::Pem {
            what: "token",
            source_name: token.to_string(),
            reason: "not a non-empty printable token".into(),
        })?;
    Ok(format!("Bearer {text}"))
}

fn pem_error(what: &'static str, secret: &Secret, reason: impl ToString) -> CredentialError {
    CredentialError::Pem {
        what,
        source_name: secret.to_string(),
        reason: reason.to_string(),
    }
}

pub(super) fn certificates(
    what: &'static str,
    secret: &Secret,
) -> Result<Vec<ureq::tls::Certificate<'static>>, CredentialError> {
    let pem = read(what, secret, MAX_PEM_BYTES)?;
    let certs: Vec<_> = ureq::tls::parse_pem(&pem)
        .filter_map(|item| match item {
            Ok(ureq::tls::PemItem::Certificate(c)) => Some(Ok(c)),
            Ok(_) => None,
            Err(e) => Some(Err(e)),
        })
        .collect::<Result<_, _>>()
        .map_err(|e| pem_error(what, secret, e))?;
    if certs.is_empty() {
        return Err(pem_error(what, secret, "no certificate in it"));
    }
    Ok(certs)
}

fn private_key(secret: &Secret) -> Result<ureq::tls::PrivateKey<'static>, CredentialError> {
    let pem = read("client key", secret, MAX_PEM_BYTES)?;
    // kubelet keeps certificate and key in one file: skip the certificates.
    for item in ureq::tls::parse_pem(&pem) {
        match item {
            Ok(ureq::tls::PemItem::PrivateKey(k)) => return Ok(k),
            Ok(_) => {}
            Err(e) => return Err(pem_error("client key", secret, e)),
        }
    }
    Err(pem_error("client key", secret, "no private key in it"))
}

/// The TLS settings for one connection: `ca` as the only roots (else the public
/// web roots), `client` as the client certificate.
pub fn tls_config(
    ca: Option<&Secret>,
    client: Option<&ClientCert>,
) -> Result<ureq::tls::TlsConfig, CredentialError> {
    let mut tls = ureq::tls::TlsConfig::builder();
    if let Some(ca) = ca {
        let roots = certificates("ca", ca)?;
        tls = tls.root_certs(ureq::tls::RootCerts::new_with_certs(&roots));
    }
    if let Some(c) = client {
        let chain = certificates("client certificate", &c.cert)?;
        let key = private_key(&c.key)?;
        tls = tls.client_cert(Some(ureq::tls::ClientCert::new_with_certs(&chain, key)));
    }
    Ok(tls.build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_trimmed_bounded_and_never_printed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "abc.def\n").unwrap();
        assert_eq!(
            bearer(&Secret::File(path.clone())).unwrap(),
            "Bearer abc.def"
        );
        std::fs::write(&path, vec![b'a'; MAX_TOKEN_BYTES as usize + 1]).unwrap();
        assert!(matches!(
            bearer(&Secret::File(path)),
            Err(CredentialError::TooLarge { .. })
        ));
        let inline = Secret::Inline(b"s3cret".to_vec());
        assert_eq!(bearer(&inline).unwrap(), "Bearer s3cret");
        assert!(!format!("{inline:?} {inline}").contains("s3cret"));
        assert!(bearer(&Secret::Inline(b"a b".to_vec())).is_err());
        let e = bearer(&Secret::File(dir.path().join("missing"))).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
    }

    #[test]
    fn pem_files_without_the_expected_item_are_refused() {
        let junk = Secret::Inline(b"not pem".to_vec());
        let e = tls_config(Some(&junk), None).unwrap_err();
        assert!(e.to_string().contains("no certificate"), "{e}");
        let client = ClientCert {
            cert: junk.clone(),
            key: junk,
        };
        assert!(tls_config(None, Some(&client)).is_err());
        assert!(tls_config(None, None).is_ok());
    }
}
