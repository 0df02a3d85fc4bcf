//! Kubernetes API stand-in. (Being built: issue "nodekeeper sim".)

/// Arguments of `nodekeeper sim apiserver`.
#[derive(Debug, clap::Args)]
pub struct ApiserverArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:6443")]
    pub listen: String,
}

/// Arguments of `nodekeeper sim token`.
#[derive(Debug, clap::Args)]
pub struct TokenArgs {
    /// Pod the token is bound to.
    #[arg(long)]
    pub pod: String,
}

/// `nodekeeper sim apiserver`.
pub async fn run_apiserver(
    _args: ApiserverArgs,
) -> Result<u8, Box<dyn std::error::Error + Send + Sync>> {
    Err("nodekeeper sim apiserver is not built yet".into())
}

/// `nodekeeper sim token`.
pub async fn run_token(_args: TokenArgs) -> Result<u8, Box<dyn std::error::Error + Send + Sync>> {
    Err("nodekeeper sim token is not built yet".into())
}
