//! The node name in kubelet's client certificate. Kubernetes' node authorizer
//! knows a kubelet by the subject common name `system:node:<node name>`, so a
//! watch with kubelet's credentials sees exactly the pods of the node that name
//! gives, which can differ from the host name (`--hostname-override`, cloud
//! providers' FQDNs).
//!
//! Only the subject is read, with a bounded DER walk (X.690): no signature or
//! validity check, which is the API server's business on every connection.

use super::credentials::{certificates, ClientCert};

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
const VERSION: u8 = 0xa0;
/// id-at-commonName, 2.5.4.3.
const COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
const UTF8_STRING: u8 = 0x0c;
const PRINTABLE_STRING: u8 = 0x13;
const NODE_PREFIX: &str = "system:node:";

/// The node a client certificate's first certificate names, if it is a node's.
pub fn node_name(client: &ClientCert) -> Option<String> {
    let certs = certificates("client certificate", &client.cert).ok()?;
    let cn = subject_common_name(certs.first()?.der())?;
    let name = cn.strip_prefix(NODE_PREFIX)?;
    (!name.is_empty()).then(|| name.to_string())
}

/// One DER element: (tag, content, what follows it).
fn element(buf: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = buf.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        // Long form: 1 to 4 length bytes, enough for any certificate.
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// The subject's common name of a DER certificate (RFC 5280 4.1).
fn subject_common_name(der: &[u8]) -> Option<String> {
    let (SEQUENCE, cert, _) = element(der)? else {
        return None;
    };
    let (SEQUENCE, mut tbs, _) = element(cert)? else {
        return None;
    };
    if tbs.first() == Some(&VERSION) {
        tbs = element(tbs)?.2;
    }
    // serialNumber, signature, issuer, validity, then subject.
    for _ in 0..4 {
        tbs = element(tbs)?.2;
    }
    let (SEQUENCE, mut rdns, _) = element(tbs)? else {
        return None;
    };
    while !rdns.is_empty() {
        let (SET, mut set, rest) = element(rdns)? else {
            return None;
        };
        rdns = rest;
        while !set.is_empty() {
            let (SEQUENCE, attr, rest) = element(set)? else {
                return None;
            };
            set = rest;
            let (OID, oid, value) = element(attr)? else {
                return None;
            };
            if oid == COMMON_NAME {
                let (tag, text, _) = element(value)?;
                if matches!(tag, UTF8_STRING | PRINTABLE_STRING) {
                    return String::from_utf8(text.to_vec()).ok();
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_long_lengths_and_truncation() {
        assert_eq!(
            element(&[0x04, 0x02, 1, 2, 9]),
            Some((0x04, &[1u8, 2][..], &[9u8][..]))
        );
        let long = [&[0x04, 0x81, 0x03][..], &[7, 7, 7]].concat();
        assert_eq!(element(&long).map(|e| e.1.len()), Some(3));
        for bad in [
            &[0x04][..],
            &[0x04, 0x05, 1],
            &[0x04, 0x85, 0, 0, 0, 0, 1],
            &[0x04, 0x80],
        ] {
            assert_eq!(element(bad), None, "{bad:?}");
        }
        assert_eq!(subject_common_name(&[0x30, 0x00]), None);
        assert_eq!(subject_common_name(b"not der at all"), None);
    }
}
