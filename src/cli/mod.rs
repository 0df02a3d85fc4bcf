//! The `nodekeeper` command line. Exit codes (stable, documented in the README):
//! 0 success / no change, 1 failure (after rollback where one applies), 2 invalid configuration or usage.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use nodekeeper_core::config::{ConfigError, Env};
use nodekeeper_core::config_file::{Config, Loaded};
use nodekeeper_core::telemetry::error_chain;

#[cfg(feature = "demo")]
mod demo;
#[cfg(feature = "controller")]
mod drain;
mod exit;
#[cfg(feature = "controller")]
mod plugin;
#[cfg(feature = "demo")]
mod sim;
#[cfg(feature = "controller")]
mod status;

pub use exit::Exit;

/// nodekeeper: one agent on every Kubernetes node plus a small controller.
#[derive(Debug, Parser)]
#[command(name = "nodekeeper", version = nodekeeper_core::VERSION, about, propagate_version = true)]
#[cfg_attr(
    not(feature = "controller"),
    command(
        after_help = "This is the agent build: the controller, drain, status, sim and demo \
commands are in the full build (README \"Builds\")."
    )
)]
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
    /// Run the node agent: CRI-O config, health checks, metadata notices, label rules, reports.
    Agent {
        /// The TOML configuration file.
        #[arg(long, short)]
        config: PathBuf,
        /// Prefix for every host path (tests and the demo).
        #[arg(long)]
        root: Option<PathBuf>,
        /// Print one report of this node and exit (nothing is applied or sent).
        #[arg(long)]
        once: bool,
        /// Output of `--once`.
        #[arg(long, short, value_enum, default_value_t = Output::Json, requires = "once")]
        output: Output,
    },
    /// Run the central controller (report API, node state, OCI Events, leader election).
    #[cfg(feature = "controller")]
    Controller {
        /// The TOML configuration file (with a `[controller]` section).
        #[arg(long, short)]
        config: PathBuf,
    },
    /// CRI-O configuration.
    Crio {
        #[command(subcommand)]
        command: CrioCommand,
    },
    /// Cordon and drain a node in tiers, naming what blocks it. Exit 0 drained, 1 error, 2 usage,
    /// 3 blocked by a PDB/do-not-disrupt at the deadline, 4 timed out, 5 interrupted (docs/drain.md).
    #[cfg(feature = "controller")]
    Drain(drain::DrainArgs),
    /// The whole loop on an embedded cluster, no cloud needed: sim API server, one agent per
    /// node, the controller, a scripted scenario with a live timeline. Exit 0 only if every
    /// expected outcome happened (docs/demo.md).
    #[cfg(feature = "demo")]
    Demo(demo::DemoCmd),
    /// Show what nodekeeper is doing with each node and what holds it back (from the Node
    /// annotations). Exit 0 listed, 1 error (API unreachable, bad kubeconfig), 2 usage (docs/status.md).
    #[cfg(feature = "controller")]
    Status(status::StatusArgs),
    /// Print a completion script for `nodekeeper` (bash: `source <(nodekeeper completion bash)`;
    /// zsh: write it as `_nodekeeper` into a directory of $fpath). The kubectl plugin has its own:
    /// `kubectl nodekeeper completion SHELL`.
    #[cfg(feature = "controller")]
    Completion {
        /// The shell.
        #[arg(value_enum)]
        shell: plugin::Shell,
    },
    /// Stand-ins for the peers nodekeeper talks to (tests, demo, benchmarks).
    #[cfg(feature = "demo")]
    Sim {
        #[command(subcommand)]
        command: sim::SimCmd,
    },
}

#[derive(Debug, Subcommand)]
enum CrioCommand {
    /// Write the configured drop-ins atomically; restart CRI-O over D-Bus only if something
    /// changed; roll back if the restart fails. Exit 0 ok/no change, 1 failed (rolled back), 2 invalid config.
    Apply {
        /// The TOML configuration file.
        #[arg(long, short)]
        config: PathBuf,
        /// Prefix for every host path.
        #[arg(long)]
        root: Option<PathBuf>,
        /// Print the diff and touch nothing.
        #[arg(long)]
        dry_run: bool,
        /// Output format.
        #[arg(long, short, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
}

/// CLI output format (`-o`) of `agent --once`, `crio apply`, `drain` and `demo --snapshot`.
///
/// The binary's own, not a mirror: the library only returns reports, and the binary chooses how
/// to print them (the demo gets it as `DemoArgs::json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Human-readable lines.
    Text,
    /// One JSON object on one line.
    Json,
}

/// The value parser of an option whose type is a library enum (parsed with its `FromStr`, its
/// default shown with its `Display`): `values` are its spellings, each with the help line that
/// `--help` lists under "Possible values" (what a clap `ValueEnum` lists, without a mirror enum).
#[cfg(feature = "controller")]
fn choices<T>(
    values: &[(&'static str, &'static str)],
) -> impl clap::builder::TypedValueParser<Value = T>
where
    T: std::str::FromStr + Clone + Send + Sync + 'static,
    T::Err: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(
        values
            .iter()
            .map(|&(name, help)| PossibleValue::new(name).help(help)),
    )
    .try_map(|s| s.parse::<T>())
}

/// Parses arguments, runs the command, and maps the outcome to an exit code.
pub fn main() -> ExitCode {
    let env = Env::from_process();
    // Started as `kubectl-nodekeeper` (kubectl's plugin lookup): the plugin's commands.
    #[cfg(feature = "controller")]
    match plugin::invoked_as(std::env::args_os().next().as_ref()) {
        plugin::Invoked::Plugin => return ExitCode::from(plugin::main(&env)),
        plugin::Invoked::Complete => {
            let words: Vec<String> = std::env::args().skip(1).collect();
            return ExitCode::from(plugin::complete(&words));
        }
        plugin::Invoked::Nodekeeper => {}
    }
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Validate { config } => validate(&config, &env),
        Command::Agent {
            config,
            root,
            once,
            output,
        } => agent(&config, root, once, output, env),
        #[cfg(feature = "controller")]
        Command::Controller { config } => controller(&config, &env),
        Command::Crio {
            command:
                CrioCommand::Apply {
                    config,
                    root,
                    dry_run,
                    output,
                },
        } => crio_apply(
            &config,
            nodekeeper_core::agent::crio::apply::ApplyOptions { root, dry_run },
            output,
            &env,
        ),
        #[cfg(feature = "controller")]
        Command::Drain(args) => drain::main(args),
        #[cfg(feature = "demo")]
        Command::Demo(args) => demo::main(args),
        #[cfg(feature = "controller")]
        Command::Status(args) => status::main(args, &env),
        #[cfg(feature = "controller")]
        Command::Completion { shell } => {
            use clap::CommandFactory;
            plugin::completion(shell, Cli::command(), "nodekeeper")
        }
        #[cfg(feature = "demo")]
        Command::Sim { command } => sim::main(command),
    };
    ExitCode::from(code)
}

/// Runs a future on a multi-threaded runtime; errors are printed as `error: ...` with exit code 1.
fn block_on<F>(fut: F) -> u8
where
    F: std::future::Future<Output = Result<u8, Box<dyn std::error::Error + Send + Sync>>>,
{
    run_on(tokio::runtime::Builder::new_multi_thread(), fut)
}

/// As [`block_on`] on one thread: the agent is idle nearly all the time, and one thread (with
/// one malloc arena) keeps its resident memory small.
fn block_on_current_thread<F>(fut: F) -> u8
where
    F: std::future::Future<Output = Result<u8, Box<dyn std::error::Error + Send + Sync>>>,
{
    run_on(tokio::runtime::Builder::new_current_thread(), fut)
}

fn run_on<F>(mut builder: tokio::runtime::Builder, fut: F) -> u8
where
    F: std::future::Future<Output = Result<u8, Box<dyn std::error::Error + Send + Sync>>>,
{
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return Exit::Failure.code();
        }
    };
    match rt.block_on(fut) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", error_chain(e.as_ref()));
            Exit::Failure.code()
        }
    }
}

/// Loads a configuration for a command; on failure prints every diagnostic and returns the exit code.
pub fn load_config(path: &std::path::Path, env: &Env) -> Result<Loaded, u8> {
    match Config::load(path, env) {
        Ok(l) => {
            for w in &l.warnings {
                eprintln!("{}", w.render(path));
            }
            Ok(l)
        }
        Err(e @ ConfigError::Read { .. }) => {
            eprintln!("error: {e}");
            Err(Exit::Invalid.code())
        }
        Err(e) => {
            eprintln!("{e}");
            Err(Exit::Invalid.code())
        }
    }
}

/// `nodekeeper controller --config FILE`: runs until SIGTERM/SIGINT, then releases the Lease;
/// exit 1 when it cannot start or a supervised task died, 2 for an invalid configuration.
#[cfg(feature = "controller")]
fn controller(path: &std::path::Path, env: &Env) -> u8 {
    use nodekeeper_core::controller::{self, ControllerError};
    let loaded = match load_config(path, env) {
        Ok(l) => l,
        Err(code) => return code,
    };
    nodekeeper_core::telemetry::init(loaded.config.log.format, &loaded.config.log.level);
    let Some(cfg) = loaded.config.controller.controller.clone() else {
        let e = ControllerError::NoSection {
            path: path.display().to_string(),
        };
        eprintln!("error: {e}");
        return Exit::Invalid.code();
    };
    let policy = loaded.config.policy();
    block_on(async move {
        let signals = nodekeeper_core::shutdown::install()?;
        controller::run(cfg, policy, signals.shutdown).await?;
        Ok(Exit::Ok.code())
    })
}

fn validate(path: &std::path::Path, env: &Env) -> u8 {
    match load_config(path, env) {
        Ok(l) => {
            print!("{}", l.config.to_redacted_toml());
            Exit::Ok.code()
        }
        Err(code) => code,
    }
}

fn agent(
    path: &std::path::Path,
    root: Option<PathBuf>,
    once: bool,
    output: Output,
    env: Env,
) -> u8 {
    let loaded = match load_config(path, &env) {
        Ok(l) => l,
        Err(code) => return code,
    };
    nodekeeper_core::telemetry::init(loaded.config.log.format, &loaded.config.log.level);
    block_on_current_thread(async move {
        if once {
            let report = nodekeeper_core::agent::once::report(&loaded.config.agent, root).await;
            match output {
                Output::Json => println!("{}", serde_json::to_string(&report)?),
                Output::Text => println!("{}", serde_json::to_string_pretty(&report)?),
            }
            return Ok(Exit::Ok.code());
        }
        let signals = nodekeeper_core::shutdown::install()?;
        let opts = nodekeeper_core::agent::AgentOptions {
            root,
            load: Config::load_agent,
        };
        nodekeeper_core::agent::run(loaded.map(|c| c.agent), env, opts, signals).await;
        Ok(Exit::Ok.code())
    })
}

fn crio_apply(
    path: &std::path::Path,
    opts: nodekeeper_core::agent::crio::apply::ApplyOptions,
    output: Output,
    env: &Env,
) -> u8 {
    use nodekeeper_core::agent::crio::apply::{self, ApplyReport};
    let loaded = match load_config(path, env) {
        Ok(l) => l,
        Err(code) => {
            if output == Output::Json {
                let report = ApplyReport {
                    unit_state: "unknown".into(),
                    error: Some(format!("invalid configuration {}", path.display())),
                    ..ApplyReport::default()
                };
                println!("{}", serde_json::to_string(&report).unwrap_or_default());
            }
            return code;
        }
    };
    nodekeeper_core::telemetry::init(loaded.config.log.format, &loaded.config.log.level);
    let crio = loaded.config.agent.crio;
    let dry_run = opts.dry_run;
    block_on(async move {
        let (report, result) = apply::apply(
            &crio,
            &opts,
            nodekeeper_core::agent::host::systemd::Systemd::connect_system,
        )
        .await;
        match output {
            Output::Json => println!("{}", serde_json::to_string(&report)?),
            Output::Text => print!("{}", render_text(&report, &crio.unit, dry_run)),
        }
        Ok(match result {
            Ok(()) => Exit::Ok.code(),
            Err(e) => {
                if output == Output::Text {
                    eprintln!("error: {}", error_chain(&e));
                }
                Exit::Failure.code()
            }
        })
    })
}

/// The text form of an apply report (stable; see README "CLI output").
fn render_text(
    r: &nodekeeper_core::agent::crio::apply::ApplyReport,
    unit: &str,
    dry_run: bool,
) -> String {
    use nodekeeper_core::agent::crio::apply::Action;
    let mut out = String::new();
    // What the running CRI-O said after the apply, whatever changed.
    let runtime_lines = |out: &mut String| {
        if let Some(rt) = &r.runtime {
            for w in rt.warnings() {
                out.push_str(&format!("warning: {w}\n"));
            }
        }
    };
    if !r.changed {
        out.push_str("no change\n");
        runtime_lines(&mut out);
        return out;
    }
    for f in &r.files {
        let verb = match (dry_run, r.rolled_back, f.action) {
            (true, _, Action::Create) => "would create",
            (true, _, Action::Update) => "would update",
            (true, _, Action::Remove) => "would remove",
            (false, true, _) => "rolled back",
            (false, false, Action::Create) => "created",
            (false, false, Action::Update) => "updated",
            (false, false, Action::Remove) => "removed",
        };
        out.push_str(&format!("{verb} {}\n", f.path.display()));
        if let Some(d) = &f.diff {
            out.push_str(d);
        }
    }
    if !dry_run {
        match (r.restarted, r.rolled_back) {
            (true, false) => out.push_str(&format!("restarted {unit}: {}\n", r.unit_state)),
            (true, true) => out.push_str(&format!(
                "restart of {unit} failed; previous files restored; {unit}: {}\n",
                r.unit_state
            )),
            (false, _) => out.push_str(&format!(
                "{unit} not running ({}): not restarted\n",
                r.unit_state
            )),
        }
    }
    runtime_lines(&mut out);
    out
}

#[cfg(all(test, feature = "demo"))]
#[allow(clippy::unwrap_used)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::Cli;

    /// Every value `--help` lists for an option parsed by [`super::choices`] is one the library
    /// type's `FromStr` accepts (else clap would list a value it then refuses).
    #[test]
    fn every_listed_choice_parses() {
        Cli::command().debug_assert();
        // (subcommand path, the other arguments it requires, the option's id)
        let cases: [(&[&str], &[&str], &str); 3] = [
            (&["drain"], &["n1"], "on_timeout"),
            (&["status"], &[], "output"),
            (
                &["sim", "oci-event"],
                &["--url", "u", "--token", "t", "--instance", "i"],
                "kind",
            ),
        ];
        for (path, rest, id) in cases {
            let mut cmd = Cli::command();
            for sub in path {
                cmd = cmd.find_subcommand(sub).unwrap().clone();
            }
            let arg = cmd.get_arguments().find(|a| a.get_id() == id).unwrap();
            let values = arg.get_possible_values();
            assert!(values.len() >= 2, "{id}: {values:?}");
            let flag = format!("--{}", arg.get_long().unwrap());
            for v in values {
                let mut argv = vec!["nodekeeper"];
                argv.extend(path);
                argv.extend(rest);
                argv.extend([flag.as_str(), v.get_name()]);
                if let Err(e) = Cli::try_parse_from(&argv) {
                    panic!("{argv:?}: {e}");
                }
            }
        }
    }
}
