//! The one way nodekeeper builds an outbound HTTP client (webhooks, notifications, cloud
//! metadata): reqwest over rustls with the ring provider, trusting the system's roots plus, when
//! given, the certificates of a CA file. Nothing depends on a process-wide rustls provider.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

/// Errors building a client's TLS setup.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The CA file could not be read or holds no valid certificate.
    #[error("CA file {path}: {why}")]
    CaFile {
        /// File.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// rustls refused the setup.
    #[error("TLS setup: {0}")]
    Setup(#[from] rustls::Error),
    /// reqwest could not build the client.
    #[error("building the HTTP client: {0}")]
    Build(#[from] reqwest::Error),
}

/// The system's root certificates, read once per process: every client built after the first
/// (a webhook, a notification target, a reload of either) reuses them instead of walking the
/// platform's certificate files again. A certificate that cannot be read is logged once.
fn system_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for e in &found.errors {
            tracing::warn!(error = %e, "reading the system's root certificates");
        }
        found.certs
    })
}

/// A rustls client configuration trusting the system's roots and the certificates in `ca_file`.
pub fn client_tls(ca_file: Option<&Path>) -> Result<rustls::ClientConfig, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in system_roots() {
        let _ = roots.add(c.clone());
    }
    if let Some(path) = ca_file {
        add_ca_file(&mut roots, path)?;
    }
    with_roots(roots)
}

/// Adds every certificate of the PEM file at `path` to `roots` (at least one is required).
pub fn add_ca_file(roots: &mut rustls::RootCertStore, path: &Path) -> Result<(), TlsError> {
    let err = |why: String| TlsError::CaFile {
        path: path.to_path_buf(),
        why,
    };
    let mut added = 0;
    for c in CertificateDer::pem_file_iter(path).map_err(|e| err(e.to_string()))? {
        roots
            .add(c.map_err(|e| err(e.to_string()))?)
            .map_err(|e| err(e.to_string()))?;
        added += 1;
    }
    if added == 0 {
        return Err(err("no certificate in the file".into()));
    }
    Ok(())
}

fn with_roots(roots: rustls::RootCertStore) -> Result<rustls::ClientConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// A client builder for `https://` (and `http://`) endpoints: [`client_tls`]'s trust.
pub fn builder(ca_file: Option<&Path>) -> Result<reqwest::ClientBuilder, TlsError> {
    Ok(reqwest::Client::builder().tls_backend_preconfigured(client_tls(ca_file)?))
}

/// A client builder for plain-HTTP endpoints only (the link-local metadata services): no root
/// store is loaded, so an `https://` URL fails to verify.
pub fn plain_builder() -> Result<reqwest::ClientBuilder, TlsError> {
    Ok(reqwest::Client::builder()
        .tls_backend_preconfigured(with_roots(rustls::RootCertStore::empty())?))
}

/// A client with [`builder`]'s trust and reqwest's defaults (the demo, tests, benchmarks).
pub fn client() -> Result<reqwest::Client, TlsError> {
    Ok(builder(None)?.build()?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_system_roots_are_read_once_per_process() {
        assert!(std::ptr::eq(super::system_roots(), super::system_roots()));
    }
}
