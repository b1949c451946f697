//! TLS trust for the review-plane client: the platform's roots (`rustls-native-certs`), or,
//! with `airlock login --cacert FILE`, that CA alone. The ring provider, like the rest of the
//! package.

use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// Where the trusted roots came from, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    Platform,
    /// The private CA, named as the user knows it (a path).
    Ca(String),
}

/// Parses a CA bundle in PEM; at least one certificate is required. `Err` holds the reason.
pub fn parse_ca_pem(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("it is not valid PEM: {e}"))?;
    if certs.is_empty() {
        return Err(
            "it holds no certificate (expected a -----BEGIN CERTIFICATE----- block)".to_owned()
        );
    }
    Ok(certs)
}

/// A client configuration trusting `ca` (when given) or the platform roots.
pub fn client_config(
    ca: Option<&[CertificateDer<'static>]>,
) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(certs) => {
            for c in certs {
                roots
                    .add(c.clone())
                    .map_err(|e| format!("the CA certificate cannot be used as a root: {e}"))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            // Unparseable platform certificates are skipped, as browsers do; none at all
            // is an error below.
            let _ = roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(format!(
                    "no trusted root certificates were found on this system{}; install the \
                     system CA bundle (e.g. the ca-certificates package) or pass --cacert FILE",
                    found.errors.first().map(|e| format!(" ({e})")).unwrap_or_default()
                ));
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup failed: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn ca_pem_needs_a_certificate() {
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let pem = ck.cert.pem();
        assert_eq!(parse_ca_pem(pem.as_bytes()).unwrap().len(), 1);
        assert!(client_config(Some(&parse_ca_pem(pem.as_bytes()).unwrap())).is_ok());
        let e = parse_ca_pem(b"").unwrap_err();
        assert!(e.contains("no certificate"), "{e}");
        // A key alone is not a CA.
        let e = parse_ca_pem(ck.signing_key.serialize_pem().as_bytes()).unwrap_err();
        assert!(e.contains("no certificate"), "{e}");
    }
}
