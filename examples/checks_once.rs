//! Runs one round of the health checks configured in a nodekeeper config file (or the defaults)
//! on this machine and prints it as JSON: `cargo run --example checks_once -- [--config FILE]`.
//! (`nodekeeper agent --once` will print the same inside the full node report.)

#![allow(clippy::unwrap_used)] // a debugging example, not agent code

use std::path::PathBuf;
use std::time::Instant;

use nodekeeper_core::agent::checks::Checks;
use nodekeeper_core::config::Env;
use nodekeeper_core::config_file::Config;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let config = match args
        .iter()
        .position(|a| a == "--config")
        .and_then(|i| args.get(i + 1))
    {
        Some(path) => match Config::load(&PathBuf::from(path), &Env::from_process()) {
            Ok(loaded) => loaded.config,
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(2);
            }
        },
        None => Config::default(),
    };
    let mut checks = Checks::from_config(&config.agent.checks);
    let round = checks.run_once(Instant::now()).await;
    println!("{}", serde_json::to_string_pretty(&round).unwrap());
}
