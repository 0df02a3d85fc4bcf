//! `nodekeeper sim …`: the stand-ins' arguments; the stand-ins themselves are `nodekeeper_sim`
//! (each subcommand's plain arguments struct and `run`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use nodekeeper_core::wire::Cloud;
use nodekeeper_sim::apiserver::{ApiserverArgs, TokenArgs};
use nodekeeper_sim::imds::ImdsArgs;
use nodekeeper_sim::oci_compute::OciComputeArgs;
use nodekeeper_sim::oci_events::{OciEventArgs, OciEventKind};

/// `nodekeeper sim ...` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum SimCmd {
    /// Run the Kubernetes API stand-in (with simulated kubelets, scheduler, controllers).
    Apiserver(ApiserverCmd),
    /// Mint a service-account token bound to a pod and node (for TokenReview tests).
    Token(TokenCmd),
    /// Serve a cloud's instance-metadata API (OCI, AWS, Azure, GCP) with an admin endpoint.
    Imds(ImdsCmd),
    /// Post an OCI Events notification (preemption, maintenance) to the controller.
    OciEvent(OciEventCmd),
    /// Serve a stand-in of the OCI Compute / OKE API calls of the `oci` replacement provider
    /// (signatures verified; removes and replaces the cluster's Node on DELETE).
    OciCompute(OciComputeCmd),
}

/// Runs a `sim` subcommand (logs as text at `info`); returns the process exit code.
pub fn main(cmd: SimCmd) -> u8 {
    super::block_on(async move {
        nodekeeper_core::telemetry::init(nodekeeper_core::telemetry::LogFormat::Text, "info");
        match cmd {
            // The servers run until the one shutdown token (SIGTERM/SIGINT) is cancelled; the
            // one-shot commands keep the default signal handling.
            SimCmd::Apiserver(c) => {
                let shutdown = nodekeeper_core::shutdown::install()?.shutdown;
                nodekeeper_sim::apiserver::run_apiserver(c.into(), shutdown).await
            }
            SimCmd::Token(c) => nodekeeper_sim::apiserver::run_token(c.into()).await,
            SimCmd::Imds(c) => {
                let shutdown = nodekeeper_core::shutdown::install()?.shutdown;
                nodekeeper_sim::imds::run(c.into(), shutdown).await
            }
            SimCmd::OciEvent(c) => nodekeeper_sim::oci_events::run(c.into()).await,
            SimCmd::OciCompute(c) => {
                let shutdown = nodekeeper_core::shutdown::install()?.shutdown;
                nodekeeper_sim::oci_compute::run(c.into(), shutdown).await
            }
        }
    })
}

/// Arguments of `nodekeeper sim apiserver`.
#[derive(Debug, clap::Args)]
pub struct ApiserverCmd {
    /// Address to listen on (plain HTTP unless --tls; use port 0 for a free port).
    #[arg(long, default_value = "127.0.0.1:6443")]
    pub listen: String,
    /// Serve HTTPS with a freshly generated self-signed CA and a server certificate for
    /// 127.0.0.1/localhost/::1; the kubeconfig written by --kubeconfig-out trusts that CA.
    #[arg(long)]
    pub tls: bool,
    /// Write a kubeconfig for the server to this path.
    #[arg(long)]
    pub kubeconfig_out: Option<PathBuf>,
    /// Scenario TOML (node pools, workloads, PDBs, DaemonSets); default: a small mixed cluster.
    #[arg(long)]
    pub scenario: Option<PathBuf>,
    /// Scale mode: this many nodes (one pool) instead of the scenario.
    #[arg(long)]
    pub nodes: Option<usize>,
    /// Scale mode: pods per node.
    #[arg(long, default_value_t = 0)]
    pub pods_per_node: usize,
    /// Simulated seconds per real second.
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Start no control loops (a bare API server).
    #[arg(long)]
    pub no_loops: bool,
    /// Start empty (no default scenario).
    #[arg(long)]
    pub empty: bool,
    /// Exit once the process with this PID is gone (a test harness that owns this server).
    #[arg(long)]
    pub owner_pid: Option<i32>,
}

impl From<ApiserverCmd> for ApiserverArgs {
    fn from(c: ApiserverCmd) -> Self {
        ApiserverArgs {
            listen: c.listen,
            tls: c.tls,
            kubeconfig_out: c.kubeconfig_out,
            scenario: c.scenario,
            nodes: c.nodes,
            pods_per_node: c.pods_per_node,
            time_scale: c.time_scale,
            no_loops: c.no_loops,
            empty: c.empty,
            owner_pid: c.owner_pid,
        }
    }
}

/// Arguments of `nodekeeper sim token`.
#[derive(Debug, clap::Args)]
pub struct TokenCmd {
    /// Pod the token is bound to.
    #[arg(long)]
    pub pod: String,
    /// Node the token is bound to.
    #[arg(long)]
    pub node: String,
    /// Audience (repeatable).
    #[arg(long = "audience")]
    pub audiences: Vec<String>,
    /// Namespace of the pod.
    #[arg(long, default_value = "default")]
    pub namespace: String,
    /// Service account name.
    #[arg(long, default_value = "default")]
    pub service_account: String,
    /// Lifetime in simulated seconds.
    #[arg(long, default_value_t = 3600)]
    pub expiration_seconds: i64,
    /// URL of the running sim apiserver (the token is minted by its admin API).
    #[arg(long, default_value = "http://127.0.0.1:6443")]
    pub server: String,
}

impl From<TokenCmd> for TokenArgs {
    fn from(c: TokenCmd) -> Self {
        TokenArgs {
            pod: c.pod,
            node: c.node,
            audiences: c.audiences,
            namespace: c.namespace,
            service_account: c.service_account,
            expiration_seconds: c.expiration_seconds,
            server: c.server,
        }
    }
}

/// Arguments of `nodekeeper sim imds`.
#[derive(Debug, clap::Args)]
pub struct ImdsCmd {
    /// Which cloud's metadata API to serve.
    #[arg(long)]
    pub cloud: Cloud,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8169")]
    pub listen: String,
}

impl From<ImdsCmd> for ImdsArgs {
    fn from(c: ImdsCmd) -> Self {
        ImdsArgs {
            cloud: c.cloud,
            listen: c.listen,
        }
    }
}

/// Arguments of `nodekeeper sim oci-event`.
#[derive(Debug, clap::Args)]
pub struct OciEventCmd {
    /// The controller's OCI events URL, e.g. `https://127.0.0.1:8443/v1/oci-events`.
    #[arg(long)]
    pub url: String,
    /// The shared secret, sent as OCI Notifications can: the URL's last path segment, or with
    /// `--basic-user` the password of HTTP Basic authentication.
    #[arg(long, env = "NODEKEEPER_OCI_EVENTS_TOKEN")]
    pub token: String,
    /// Send the secret with HTTP Basic authentication as this user (`https://USER:TOKEN@host/...`),
    /// not in the path.
    #[arg(long)]
    pub basic_user: Option<String>,
    /// The event.
    #[arg(long, value_parser = super::choices::<OciEventKind>(&[
        ("preemption", "`instancepreemptionaction` (TERMINATE)"),
        ("maintenance", "`instancemaintenance`, lifecycleState SCHEDULED"),
        ("maintenance-canceled", "`instancemaintenance`, lifecycleState CANCELED"),
        ("rescheduled", "`maintenancerescheduled` with a new window"),
        ("maintenance-begin", "`instancemaintenance.begin`, lifecycleState STARTED"),
        ("maintenance-end", "`instancemaintenance.end`, lifecycleState SUCCEEDED"),
    ]))]
    pub kind: OciEventKind,
    /// Instance OCID (the node's `spec.providerID` without `oci://`).
    #[arg(long)]
    pub instance: String,
    /// Maintenance window start (RFC 3339).
    #[arg(long, default_value = "2030-01-01T12:00:00.000Z")]
    pub window_start: String,
    /// CA of the controller's certificate (https).
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// Name the controller's certificate carries.
    #[arg(long, default_value = "nodekeeper-controller.nodekeeper.svc")]
    pub server_name: String,
}

impl From<OciEventCmd> for OciEventArgs {
    fn from(c: OciEventCmd) -> Self {
        OciEventArgs {
            url: c.url,
            token: c.token,
            basic_user: c.basic_user,
            kind: c.kind,
            instance: c.instance,
            window_start: c.window_start,
            ca_file: c.ca_file,
            server_name: c.server_name,
        }
    }
}

/// Arguments of `nodekeeper sim oci-compute`.
#[derive(Debug, clap::Args)]
pub struct OciComputeCmd {
    /// Address to listen on (HTTPS).
    #[arg(long, default_value = "127.0.0.1:8443")]
    pub listen: SocketAddr,
    /// An accepted API key, `KEYID=FILE`: keyId `<tenancy>/<user>/<fingerprint>` and the PEM public
    /// key (`PUBLIC KEY`). Repeatable.
    #[arg(long = "key", required = true)]
    pub keys: Vec<String>,
    /// File to write the CA certificate (PEM) of the stand-in's TLS certificate to (the
    /// provider's `ca_file`).
    #[arg(long)]
    pub ca_out: PathBuf,
    /// Cluster whose Nodes stand for the instances (removed and replaced on DELETE); without it,
    /// DELETEs are only answered and logged.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// First give every node of that cluster an OCI identity (providerID, node-pool annotation).
    #[arg(long, requires = "kubeconfig")]
    pub adopt_nodes: bool,
    /// Real time from an accepted DELETE to the node's removal and replacement.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub launch_delay: Duration,
}

impl From<OciComputeCmd> for OciComputeArgs {
    fn from(c: OciComputeCmd) -> Self {
        OciComputeArgs {
            listen: c.listen,
            keys: c.keys,
            ca_out: c.ca_out,
            kubeconfig: c.kubeconfig,
            adopt_nodes: c.adopt_nodes,
            launch_delay: c.launch_delay,
        }
    }
}
