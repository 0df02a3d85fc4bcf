//! The `nodekeeper` command line. Exit codes (stable, documented in the README):
//! 0 success / no change, 1 failure (after rollback where one applies), 2 invalid configuration or usage.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config::{Config, ConfigError, Env, Loaded};

/// Exit code: success.
pub const EXIT_OK: u8 = 0;
/// Exit code: the operation failed (after rollback where one applies).
pub const EXIT_FAILURE: u8 = 1;
/// Exit code: invalid configuration or usage.
pub const EXIT_INVALID: u8 = 2;

/// nodekeeper: one agent on every Kubernetes node plus a small controller.
#[derive(Debug, Parser)]
#[command(name = "nodekeeper", version = crate::VERSION, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate a configuration file and print the effective configuration (secrets redacted).
    Validate {
        /// The TOML configuration file.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Stand-ins for the peers nodekeeper talks to (tests, demo, benchmarks).
    Sim {
        #[command(subcommand)]
        command: crate::sim::SimCommand,
    },
}

/// Parses arguments, runs the command, and maps the outcome to an exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let env = Env::from_process();
    let code = match cli.command {
        Command::Validate { config } => validate(&config, &env),
        Command::Sim { command } => block_on(async move {
            crate::telemetry::init(crate::config::LogFormat::Text, "info");
            crate::sim::run(command).await
        }),
    };
    ExitCode::from(code)
}

/// Runs a future on a multi-threaded runtime; errors are printed as `error: ...` with exit code 1.
fn block_on<F>(fut: F) -> u8
where
    F: std::future::Future<Output = Result<u8, Box<dyn std::error::Error + Send + Sync>>>,
{
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return EXIT_FAILURE;
        }
    };
    match rt.block_on(fut) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", error_chain(e.as_ref()));
            EXIT_FAILURE
        }
    }
}

/// `outer: inner: innermost`
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let msg = c.to_string();
        if !s.contains(&msg) {
            s.push_str(": ");
            s.push_str(&msg);
        }
        cur = c.source();
    }
    s
}

/// Loads a configuration for a command; on failure prints every diagnostic and returns the exit code.
pub fn load_config(path: &std::path::Path, env: &Env) -> Result<Loaded, u8> {
    let version = crate::agent::crio::lint::detect_version();
    match Config::load(path, env, version.as_deref()) {
        Ok(l) => {
            for w in &l.warnings {
                eprintln!("{}", w.render(path));
            }
            Ok(l)
        }
        Err(e @ ConfigError::Read { .. }) => {
            eprintln!("error: {e}");
            Err(EXIT_INVALID)
        }
        Err(e) => {
            eprintln!("{e}");
            Err(EXIT_INVALID)
        }
    }
}

fn validate(path: &std::path::Path, env: &Env) -> u8 {
    match load_config(path, env) {
        Ok(l) => {
            print!("{}", l.config.to_redacted_toml());
            EXIT_OK
        }
        Err(code) => code,
    }
}
