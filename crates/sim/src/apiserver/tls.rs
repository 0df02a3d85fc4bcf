//! Optional TLS for the sim apiserver: a throw-away CA and a server certificate for
//! `127.0.0.1`/`localhost`/`::1`, generated at start ([`serve`](super::serve) serves the router over it).

use std::sync::Arc;

use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

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
        let server = nodekeeper_core::serve::server_config(chain, key_der)?;
        Ok(SimTls {
            ca_pem: ca.pem(),
            ca_der: CertificateDer::clone(ca.der()).to_vec(),
            server: Arc::new(server),
        })
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
