//! The one way a command builds its Kubernetes client configuration: `--kubeconfig FILE` (and
//! `--context`), else what kube-rs infers (`$KUBECONFIG`, `~/.kube/config`, in-cluster).

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};

/// Why no client configuration could be built; each names the file or server.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The named kubeconfig could not be read or used.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        /// File (`(default)` for the default kubeconfig with an explicit context).
        path: String,
        /// Cause.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Nothing to infer a configuration from.
    #[error("kubeconfig (default): no Kubernetes configuration found: {source}")]
    Infer {
        /// Cause.
        #[source]
        source: kube::config::InferConfigError,
    },
    /// The client could not be built.
    #[error("cannot build a Kubernetes client for {server}: {source}")]
    Client {
        /// API server URL.
        server: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
}

/// The client configuration of `kubeconfig` (with `context`, default: its current one), else
/// the default kubeconfig with `context`, else the inferred configuration.
pub async fn config(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> Result<kube::Config, ClientError> {
    let opts = KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    match (kubeconfig, context) {
        (Some(p), _) => {
            let path = p.display().to_string();
            let kc = Kubeconfig::read_from(p).map_err(|source| ClientError::Kubeconfig {
                path: path.clone(),
                source,
            })?;
            kube::Config::from_custom_kubeconfig(kc, &opts)
                .await
                .map_err(|source| ClientError::Kubeconfig { path, source })
        }
        (None, Some(_)) => kube::Config::from_kubeconfig(&opts)
            .await
            .map_err(|source| ClientError::Kubeconfig {
                path: "(default)".into(),
                source,
            }),
        (None, None) => kube::Config::infer()
            .await
            .map_err(|source| ClientError::Infer { source }),
    }
}

/// A client of `cfg`, or an error naming its server.
pub fn client(cfg: kube::Config) -> Result<kube::Client, ClientError> {
    let server = cfg.cluster_url.to_string();
    kube::Client::try_from(cfg).map_err(|source| ClientError::Client { server, source })
}
