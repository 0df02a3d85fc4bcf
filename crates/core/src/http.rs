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

/// Why `ip` is no destination for a URL taken from configuration or from a request (a webhook, a
/// notification target, an OCI subscription's confirmation), or `None` when it may be reached:
/// the unspecified, broadcast and multicast addresses, the cloud metadata addresses
/// (169.254.169.254, fd00:ec2::254), link-local addresses, and loopback unless `allow_loopback`
/// (an explicit opt-in for tests and local stand-ins). An IPv4-mapped IPv6 address is judged as
/// its IPv4 address.
pub fn refused_address(ip: std::net::IpAddr, allow_loopback: bool) -> Option<&'static str> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let ip = match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    };
    const AWS_V6_METADATA: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);
    match ip {
        IpAddr::V4(a) if a == Ipv4Addr::new(169, 254, 169, 254) => Some("a cloud metadata address"),
        IpAddr::V6(a) if a == AWS_V6_METADATA => Some("a cloud metadata address"),
        IpAddr::V4(a) if a.is_unspecified() || a.octets()[0] == 0 => Some("unspecified"),
        IpAddr::V6(a) if a.is_unspecified() => Some("unspecified"),
        IpAddr::V4(a) if a.is_broadcast() || a.is_multicast() => Some("broadcast or multicast"),
        IpAddr::V6(a) if a.is_multicast() => Some("multicast"),
        IpAddr::V4(a) if a.is_link_local() => Some("link-local"),
        IpAddr::V6(a) if (a.segments()[0] & 0xffc0) == 0xfe80 => Some("link-local"),
        a if a.is_loopback() && !allow_loopback => Some("loopback"),
        _ => None,
    }
}

/// A resolver that drops the addresses [`refused_address`] refuses, after DNS: a name that
/// resolves only to refused addresses fails with "refused" (the request is never sent).
#[derive(Debug, Clone, Copy)]
struct Guarded {
    allow_loopback: bool,
}

impl reqwest::dns::Resolve for Guarded {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow = self.allow_loopback;
        let host = name.as_str().to_string();
        Box::pin(async move {
            let all: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut why = "no address";
            let ok: Vec<SocketAddr> = all
                .into_iter()
                .filter(|a| match refused_address(a.ip(), allow) {
                    Some(w) => {
                        why = w;
                        false
                    }
                    None => true,
                })
                .collect();
            if ok.is_empty() {
                return Err(format!("refused: {host} resolves to {why} addresses only").into());
            }
            Ok(Box::new(ok.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// A client builder for URLs from configuration or from a request: [`builder`]'s trust, no
/// redirects (a 3xx is the answer: a signed body is never re-sent elsewhere, and no rule is
/// skipped on a redirect target), no proxy from the environment (a proxy would resolve names
/// itself), and names resolved through [`refused_address`]. A URL whose host is an IP address
/// is not resolved: check it with [`check_destination`] first.
pub fn guarded_builder(
    ca_file: Option<&Path>,
    allow_loopback: bool,
) -> Result<reqwest::ClientBuilder, TlsError> {
    Ok(guard(builder(ca_file)?, allow_loopback).no_proxy())
}

/// `builder` following no redirect and resolving names through [`refused_address`] (a proxy
/// from the environment, when `builder` keeps one, resolves the target itself): the webhook,
/// notification and OCI API clients, whose URLs come from the configuration.
pub fn guard(builder: reqwest::ClientBuilder, allow_loopback: bool) -> reqwest::ClientBuilder {
    builder
        .redirect(reqwest::redirect::Policy::none())
        .dns_resolver(Arc::new(Guarded { allow_loopback }))
}

/// Refuses a URL whose host is an IP address [`refused_address`] refuses (names are checked
/// when they are resolved, by [`guarded_builder`]'s resolver).
pub fn check_destination(url: &reqwest::Url, allow_loopback: bool) -> Result<(), String> {
    let ip = match url.host() {
        Some(url::Host::Ipv4(a)) => std::net::IpAddr::V4(a),
        Some(url::Host::Ipv6(a)) => std::net::IpAddr::V6(a),
        Some(url::Host::Domain(_)) => return Ok(()),
        None => return Err("refused: no host".into()),
    };
    match refused_address(ip, allow_loopback) {
        Some(why) => Err(format!("refused: {ip} is {why}")),
        None => Ok(()),
    }
}

/// A URL as it may be printed (logs, `nodekeeper validate`, Events): the scheme, host and port,
/// without userinfo, and the path and query reduced to a fingerprint (the first 8 hex digits of
/// their SHA-256), since Slack-, Teams- and token-style URLs carry their secret there:
/// `https://hooks.example.com/…#3f2a9c1b`. A text that is no URL gives `<invalid URL>`.
pub fn redact_url(raw: &str) -> String {
    use sha2::{Digest, Sha256};
    let Ok(u) = reqwest::Url::parse(raw) else {
        return "<invalid URL>".into();
    };
    let host = u.host_str().unwrap_or("");
    let port = u.port().map(|p| format!(":{p}")).unwrap_or_default();
    let rest = &u[url::Position::BeforePath..];
    if rest.is_empty() || rest == "/" {
        if u.username().is_empty() && u.password().is_none() {
            // nothing to hide: as given
            return raw.to_string();
        }
        return format!("{}://{host}{port}/", u.scheme());
    }
    let fp = hex::encode(&Sha256::digest(rest.as_bytes())[..4]);
    format!("{}://{host}{port}/…#{fp}", u.scheme())
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

    #[test]
    fn refused_addresses() {
        use super::refused_address as r;
        let cases: [(&str, bool, Option<&str>); 16] = [
            ("127.0.0.1", false, Some("loopback")),
            ("127.0.0.1", true, None),
            ("::1", false, Some("loopback")),
            ("::ffff:127.0.0.1", false, Some("loopback")),
            ("169.254.169.254", true, Some("a cloud metadata address")),
            ("fd00:ec2::254", true, Some("a cloud metadata address")),
            (
                "::ffff:169.254.169.254",
                true,
                Some("a cloud metadata address"),
            ),
            ("169.254.1.1", true, Some("link-local")),
            ("fe80::1", true, Some("link-local")),
            ("0.0.0.0", true, Some("unspecified")),
            ("::", true, Some("unspecified")),
            ("255.255.255.255", true, Some("broadcast or multicast")),
            ("10.0.0.5", false, None),
            ("192.168.1.1", false, None),
            ("93.184.216.34", false, None),
            ("2001:db8::1", false, None),
        ];
        for (ip, allow, want) in cases {
            assert_eq!(r(ip.parse().unwrap(), allow), want, "{ip} allow={allow}");
        }
    }

    #[test]
    fn check_destination_judges_ip_hosts_and_leaves_names_to_the_resolver() {
        let c = |u: &str, allow| super::check_destination(&reqwest::Url::parse(u).unwrap(), allow);
        assert!(c("http://127.0.0.1:9/x", false)
            .unwrap_err()
            .starts_with("refused"));
        assert!(c("http://127.0.0.1:9/x", true).is_ok());
        assert!(c("http://[::1]/x", false).is_err());
        assert!(c("http://169.254.169.254/latest", true).is_err());
        assert!(c("https://hooks.example.com/x", false).is_ok());
    }

    #[tokio::test]
    async fn the_guarded_resolver_refuses_names_of_refused_addresses() {
        use reqwest::dns::Resolve;
        let g = super::Guarded {
            allow_loopback: false,
        };
        let e = match g.resolve("localhost".parse().unwrap()).await {
            Ok(a) => panic!("resolved: {:?}", a.collect::<Vec<_>>()),
            Err(e) => e.to_string(),
        };
        assert!(
            e.starts_with("refused: localhost resolves to loopback"),
            "{e}"
        );
        let ok = super::Guarded {
            allow_loopback: true,
        };
        assert!(ok.resolve("localhost".parse().unwrap()).await.is_ok());
    }

    #[test]
    fn redacted_urls_keep_no_userinfo_path_or_query() {
        use super::redact_url as r;
        let slack = "https://hooks.slack.com/services/T000/B000/XXXXSECRETXXXX";
        let out = r(slack);
        assert!(
            out.starts_with("https://hooks.slack.com/…#") && !out.contains("SECRET"),
            "{out}"
        );
        assert_eq!(r(slack), out, "the same URL, the same fingerprint");
        assert_ne!(r("https://hooks.slack.com/services/T000/B000/other"), out);
        let u = r("https://user:p4ssw0rd@example.com:8443/hook?token=t0ps3cret");
        assert!(
            u.starts_with("https://example.com:8443/…#")
                && !u.contains("p4ssw0rd")
                && !u.contains("user")
                && !u.contains("t0ps3cret"),
            "{u}"
        );
        assert_eq!(r("https://example.com"), "https://example.com");
        assert_eq!(r("https://u:pw@example.com/"), "https://example.com/");
        assert_eq!(r("not a url"), "<invalid URL>");
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
