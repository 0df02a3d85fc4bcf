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
    /// A component name that cannot be part of a `User-Agent` header.
    #[error("component name {0:?} is not a valid User-Agent")]
    Component(String),
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

/// The `User-Agent` of `component`'s requests: `nodekeeper-<component>/<version>`. kube-apiserver
/// names the field manager of a write after it (the part before `/`), so a Node's
/// `managedFields` say which of nodekeeper's processes wrote which field, and audit logs and
/// `apiserver_request_total` consumers can tell them apart (kube-rs sends no `User-Agent` of its
/// own: its writes are the manager `unknown`).
pub fn user_agent(component: &str) -> String {
    format!("nodekeeper-{component}/{}", env!("CARGO_PKG_VERSION"))
}

/// The client configuration of `kubeconfig` (with `context`, default: its current one), else
/// the default kubeconfig with `context`, else the inferred configuration; its requests carry
/// `component`'s [`user_agent`].
pub async fn config(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
    component: &str,
) -> Result<kube::Config, ClientError> {
    let mut cfg = read_config(kubeconfig, context).await?;
    let agent = http::HeaderValue::from_str(&user_agent(component))
        .map_err(|_| ClientError::Component(component.to_string()))?;
    cfg.headers.push((http::header::USER_AGENT, agent));
    Ok(cfg)
}

async fn read_config(
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

#[cfg(test)]
mod tests {
    use super::*;

    const KUBECONFIG: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\n\
        users:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n";

    #[tokio::test]
    async fn every_request_names_the_component_that_sends_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        std::fs::write(&path, KUBECONFIG).unwrap();
        let cfg = config(Some(&path), None, "controller").await.unwrap();
        let agents: Vec<_> = cfg
            .headers
            .iter()
            .filter(|(k, _)| k == http::header::USER_AGENT)
            .map(|(_, v)| v.to_str().unwrap())
            .collect();
        assert_eq!(
            agents,
            [format!(
                "nodekeeper-controller/{}",
                env!("CARGO_PKG_VERSION")
            )]
        );
        assert!(matches!(
            config(Some(&path), None, "bad\ncomponent").await,
            Err(ClientError::Component(_))
        ));
    }
}
