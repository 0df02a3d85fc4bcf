//! Cloud instance-metadata emulators. (Being built: issue "agent sensing".)

/// Arguments of `nodekeeper sim imds`.
#[derive(Debug, clap::Args)]
pub struct ImdsArgs {
    /// Which cloud's metadata API to serve.
    #[arg(long)]
    pub cloud: String,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8169")]
    pub listen: String,
}

/// `nodekeeper sim imds`.
pub async fn run(_args: ImdsArgs) -> Result<u8, Box<dyn std::error::Error + Send + Sync>> {
    Err("nodekeeper sim imds is not built yet".into())
}
