//! The one way nodekeeper builds an outbound HTTP client (the agent's reporter, webhooks,
//! notifications, cloud metadata, the OCI API): reqwest over rustls with the ring provider.
//! [`builder`] trusts the system's roots plus, when given, the certificates of a CA file;
//! [`pinned_builder`] trusts only a CA file's certificates; [`pin_server_name`] reaches a URL under
//! another TLS name than its host. Nothing depends on a process-wide rustls provider.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

/// Errors building a client's TLS setup.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The CA file could not be read or holds no valid certificate.
    #[error("CA file {path}: {source}")]
    CaFile {
        /// File.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: CaFileError,
    },
    /// The pinned server name is not a DNS name (nor the URL's own host).
    #[error("server name {name:?}: not a valid DNS name (an IP address must be the URL's host)")]
    ServerName {
        /// The name.
        name: String,
    },
    /// The URL has no host to connect to.
    #[error("URL {url}: no host")]
    NoHost {
        /// The URL.
        url: String,
    },
    /// rustls refused the setup.
    #[error("TLS setup: {0}")]
    Setup(#[from] rustls::Error),
    /// reqwest could not build the client.
    #[error("building the HTTP client: {0}")]
    Build(#[from] reqwest::Error),
}

/// What is wrong with a CA file.
#[derive(Debug, thiserror::Error)]
pub enum CaFileError {
    /// Unreadable, or not PEM.
    #[error("{0}")]
    Read(#[from] rustls_pki_types::pem::Error),
    /// A certificate rustls cannot use as a root.
    #[error("{0}")]
    Certificate(#[from] rustls::Error),
    /// No certificate at all.
    #[error("no certificate in the file")]
    Empty,
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
    let err = |source: CaFileError| TlsError::CaFile {
        path: path.to_path_buf(),
        source,
    };
    let mut added = 0;
    for c in CertificateDer::pem_file_iter(path).map_err(|e| err(e.into()))? {
        roots
            .add(c.map_err(|e| err(e.into()))?)
            .map_err(|e| err(e.into()))?;
        added += 1;
    }
    if added == 0 {
        return Err(err(CaFileError::Empty));
    }
    Ok(())
}

/// Offers HTTP/2 and HTTP/1.1 (ALPN), as reqwest's own TLS setup does: a server that speaks
/// HTTP/2 (the controller's report API) then carries every request on one connection.
fn with_roots(roots: rustls::RootCertStore) -> Result<rustls::ClientConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

/// A client builder for `https://` (and `http://`) endpoints: [`client_tls`]'s trust.
pub fn builder(ca_file: Option<&Path>) -> Result<reqwest::ClientBuilder, TlsError> {
    Ok(reqwest::Client::builder().tls_backend_preconfigured(client_tls(ca_file)?))
}

/// A client builder trusting only the certificates in `ca_file` (a pinned CA: no system root),
/// connecting directly (no proxy from the environment), as the agent reaches its controller.
pub fn pinned_builder(ca_file: &Path) -> Result<reqwest::ClientBuilder, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    add_ca_file(&mut roots, ca_file)?;
    Ok(reqwest::Client::builder()
        .tls_backend_preconfigured(with_roots(roots)?)
        .no_proxy())
}

/// Reaching `url` when the server's certificate carries `server_name` rather than the URL's host
/// (the agent's `[report] server_name`): returns the URL to request, with `server_name` as its
/// host (so TLS's SNI and certificate check use the name), and `builder` resolving that name to
/// the URL's host (an IP address as given, a DNS name looked up at each connection). When the
/// name is the URL's host, both are returned unchanged. A name that is an IP address must be the
/// URL's host. The builder should not use a proxy (the proxy would resolve the name itself):
/// [`pinned_builder`]'s does not.
pub fn pin_server_name(
    builder: reqwest::ClientBuilder,
    url: &reqwest::Url,
    server_name: &str,
) -> Result<(reqwest::ClientBuilder, reqwest::Url), TlsError> {
    let bad_name = || TlsError::ServerName {
        name: server_name.into(),
    };
    let host = url
        .host_str()
        .map(|h| h.trim_start_matches('[').trim_end_matches(']'))
        .ok_or_else(|| TlsError::NoHost {
            url: url.to_string(),
        })?;
    match rustls_pki_types::ServerName::try_from(server_name) {
        Err(_) => return Err(bad_name()),
        Ok(_) if host.eq_ignore_ascii_case(server_name) => {
            return Ok((builder, url.clone()));
        }
        Ok(rustls_pki_types::ServerName::DnsName(_)) => {}
        Ok(_) => return Err(bad_name()),
    }
    let name = server_name.to_ascii_lowercase();
    let mut pinned = url.clone();
    pinned.set_host(Some(&name)).map_err(|_| bad_name())?;
    let builder = match host.parse::<std::net::IpAddr>() {
        Ok(ip) => builder.resolve(&name, SocketAddr::new(ip, 0)),
        Err(_) => builder.dns_resolver(Arc::new(Alias {
            name,
            target: host.to_string(),
        })),
    };
    Ok((builder, pinned))
}

/// Resolves `name` as `target` (and every other name as itself) at each connection.
struct Alias {
    name: String,
    target: String,
}

impl reqwest::dns::Resolve for Alias {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = if name.as_str().eq_ignore_ascii_case(&self.name) {
            self.target.clone()
        } else {
            name.as_str().to_string()
        };
        Box::pin(async move {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
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

    #[test]
    fn a_pinned_server_name_becomes_the_host_requested() {
        let pin = |url: &str, name: &str| {
            let url = reqwest::Url::parse(url).unwrap();
            super::pin_server_name(reqwest::Client::builder(), &url, name)
                .map(|(_, u)| u.to_string())
                .map_err(|e| e.to_string())
        };
        assert_eq!(
            pin("https://10.0.0.5:8443/v1/reports", "ctl.ns.svc").unwrap(),
            "https://ctl.ns.svc:8443/v1/reports"
        );
        assert_eq!(
            pin("https://[::1]:8443/x", "CTL.ns.svc").unwrap(),
            "https://ctl.ns.svc:8443/x"
        );
        assert_eq!(
            pin("https://lb.example:8443/x", "ctl.ns.svc").unwrap(),
            "https://ctl.ns.svc:8443/x"
        );
        assert_eq!(
            pin("https://Ctl.ns.svc/x", "ctl.ns.svc").unwrap(),
            "https://ctl.ns.svc/x",
            "the URL's own host: unchanged"
        );
        assert_eq!(
            pin("https://10.0.0.5/x", "10.0.0.5").unwrap(),
            "https://10.0.0.5/x"
        );
        assert!(pin("https://10.0.0.5/x", "10.0.0.6").is_err());
        assert!(pin("https://10.0.0.5/x", "not a name").is_err());
    }

    #[tokio::test]
    async fn the_alias_resolves_the_name_as_its_target() {
        use reqwest::dns::Resolve;
        let alias = super::Alias {
            name: "ctl.ns.svc".into(),
            target: "127.0.0.1".into(),
        };
        let addrs: Vec<_> = alias
            .resolve("CTL.ns.svc".parse().unwrap())
            .await
            .unwrap()
            .collect();
        assert_eq!(addrs, vec!["127.0.0.1:0".parse().unwrap()]);
    }
}
