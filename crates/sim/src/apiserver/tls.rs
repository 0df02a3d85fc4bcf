//! Optional TLS for the sim apiserver: a throw-away CA and a server certificate for
//! `127.0.0.1`/`localhost`/`::1`, generated at start, and the accept loop serving the router over it.

use std::sync::Arc;

use axum::Router;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_util::sync::CancellationToken;

/// Names the generated server certificate is valid for.
pub const SERVER_NAMES: [&str; 3] = ["127.0.0.1", "localhost", "::1"];

/// Why TLS material could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Certificate generation failed.
    #[error("cannot generate the sim's {what} certificate: {source}")]
    Generate {
        /// CA or server.
        what: &'static str,
        /// Cause.
        source: rcgen::Error,
    },
    /// rustls rejected the generated material.
    #[error("cannot build the sim's TLS server config: {0}")]
    Config(#[from] rustls::Error),
}

/// A generated CA and the server config using a certificate it signed.
#[derive(Debug, Clone)]
pub struct SimTls {
    /// The CA certificate (PEM) clients must trust (it goes into the kubeconfig).
    pub ca_pem: String,
    /// The CA certificate (DER), for kube-rs `Config::root_cert`.
    pub ca_der: Vec<u8>,
    /// rustls server config (HTTP/2 and HTTP/1.1 via ALPN).
    pub server: Arc<rustls::ServerConfig>,
}

impl SimTls {
    /// Generates a fresh CA and server certificate.
    pub fn generate() -> Result<Self, TlsError> {
        let gen_err = |what| move |source| TlsError::Generate { what, source };
        let ca_key = rcgen::KeyPair::generate().map_err(gen_err("CA"))?;
        let mut ca_params =
            rcgen::CertificateParams::new(Vec::<String>::new()).map_err(gen_err("CA"))?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "nodekeeper sim CA");
        let ca = ca_params.self_signed(&ca_key).map_err(gen_err("CA"))?;
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = rcgen::KeyPair::generate().map_err(gen_err("server"))?;
        let names: Vec<String> = SERVER_NAMES.iter().map(|s| s.to_string()).collect();
        let mut params = rcgen::CertificateParams::new(names).map_err(gen_err("server"))?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "nodekeeper-sim-apiserver");
        let cert = params.signed_by(&key, &issuer).map_err(gen_err("server"))?;
        let chain = vec![cert.der().clone(), ca.der().clone()];
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key_der)?;
        server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(SimTls {
            ca_pem: ca.pem(),
            ca_der: CertificateDer::clone(ca.der()).to_vec(),
            server: Arc::new(server),
        })
    }
}

/// Serves `router` over TLS on `listener` until `cancel`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    cfg: Arc<rustls::ServerConfig>,
    cancel: CancellationToken,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = cancel.cancelled() => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "sim apiserver: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let svc = hyper_util::service::TowerToHyperService::new(router.clone());
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let handshake = acceptor.accept(tcp);
            let tls =
                match tokio::time::timeout(std::time::Duration::from_secs(10), handshake).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "sim apiserver: TLS handshake failed");
                        return;
                    }
                    Err(_) => return,
                };
            let builder =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(tls), svc);
            tokio::select! {
                r = conn => if let Err(e) = r {
                    tracing::debug!(%peer, error = %e, "sim apiserver: connection ended with an error");
                },
                _ = cancel.cancelled() => {}
            }
        });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn generates_a_ca_and_a_server_config() {
        let t = SimTls::generate().unwrap();
        assert!(t.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert_eq!(t.server.alpn_protocols[0], b"h2");
        let other = SimTls::generate().unwrap();
        assert_ne!(t.ca_der, other.ca_der, "each start makes a fresh CA");
    }
}
