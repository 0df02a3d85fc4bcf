//! `kubectl nodekeeper …`: the same binary invoked as `kubectl-nodekeeper` (a symlink on `PATH`;
//! kubectl runs it for `kubectl nodekeeper ARGS…` with `ARGS` as they were typed), as
//! `kubectl_complete-nodekeeper` (kubectl's completion of those ARGS), and
//! `nodekeeper completion SHELL`. docs/kubectl-plugin.md.
//!
//! kubectl's global flags are global here too, in any position after `nodekeeper`:
//! `--kubeconfig`, `--context`, `-n/--namespace` (where nodekeeper is installed, default
//! `nodekeeper`: Nodes are cluster-scoped) and `-o/--output`. Every command but `completion`
//! first checks that nodekeeper is installed (its controller's ServiceAccount in that namespace)
//! and exits 1 naming what is missing when it is not.
//!
//! Exit codes: 0 done, 1 error (nodekeeper not installed, node not found, API unreachable, ...),
//! 2 usage; `drain` also 3, 4, 5 as `nodekeeper drain`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use chrono::Utc;
use clap::{CommandFactory, Parser, Subcommand};

use nodekeeper_core::config::Env;
use nodekeeper_core::controller::status::explain::{
    self, check_installed, get_node, node_events, node_names, render_explanation, Installed,
    DEFAULT_NAMESPACE,
};
use nodekeeper_core::controller::status::StatusOutput;
use nodekeeper_core::k8s::client;

use super::{drain, status, Exit, Output};

/// The name kubectl looks up on `PATH` for `kubectl nodekeeper`.
pub const PLUGIN_BIN: &str = "kubectl-nodekeeper";

/// The name kubectl (≥ 1.26) looks up on `PATH` to complete `kubectl nodekeeper …` in its own
/// shell completion: it runs `kubectl_complete-nodekeeper WORD… CURRENT` and reads one candidate
/// a line (`VALUE\tDESCRIPTION`), then `:DIRECTIVE` (cobra's protocol).
pub const COMPLETE_BIN: &str = "kubectl_complete-nodekeeper";

/// How the process was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invoked {
    /// As `nodekeeper` (or any other name).
    Nodekeeper,
    /// As [`PLUGIN_BIN`]: the plugin's commands.
    Plugin,
    /// As [`COMPLETE_BIN`]: kubectl's completion of the plugin's words.
    Complete,
}

/// Which of [`Invoked`] `argv0` names.
pub fn invoked_as(argv0: Option<&OsString>) -> Invoked {
    match argv0.and_then(|a| Path::new(a).file_name()) {
        Some(n) if n == PLUGIN_BIN => Invoked::Plugin,
        Some(n) if n == COMPLETE_BIN => Invoked::Complete,
        _ => Invoked::Nodekeeper,
    }
}

/// cobra's `ShellCompDirectiveNoFileComp`: no file names.
const NO_FILES: u8 = 4;
/// cobra's `ShellCompDirectiveDefault`: the shell's own (file names), for `--kubeconfig`.
const FILES: u8 = 0;

/// `kubectl_complete-nodekeeper WORD… CURRENT`: prints the candidates for CURRENT after WORDs
/// (kubectl's plugin completion), node names from the cluster where a node is expected.
pub fn complete(words: &[String]) -> u8 {
    let (candidates, directive) = candidates(words, |g| {
        super::block_on_current_thread(async move {
            let (client, _) = connect(&g, "kubectl-nodekeeper").await?;
            let names = tokio::time::timeout(std::time::Duration::from_secs(3), node_names(client))
                .await??;
            for n in names {
                println!("{n}");
            }
            Ok(Exit::Ok.code())
        });
    });
    for c in candidates {
        println!("{c}");
    }
    println!(":{directive}");
    Exit::Ok.code()
}

/// The candidates for the last of `words` (the others typed before it) and cobra's directive;
/// `nodes` prints the node names of the cluster the words' flags choose (where a node goes).
fn candidates(words: &[String], nodes: impl FnOnce(Global)) -> (Vec<String>, u8) {
    let mut root = PluginCli::command();
    root.build();
    let (cur, before) = match words.split_last() {
        Some((c, b)) => (c.as_str(), b),
        None => ("", &[][..]),
    };
    let takes_value = |cmd: &clap::Command, word: &str| {
        cmd.get_arguments().any(|a| {
            a.get_action().takes_values()
                && (word
                    .strip_prefix("--")
                    .is_some_and(|l| a.get_long() == Some(l))
                    || (word.len() == 2
                        && word.strip_prefix('-').and_then(|s| s.chars().next()) == a.get_short()))
        })
    };
    let mut cmd = &root;
    let mut positionals = 0;
    let mut skip = false;
    for w in before {
        if std::mem::take(&mut skip) {
            continue;
        }
        if w.starts_with('-') {
            skip = !w.contains('=') && takes_value(cmd, w);
        } else if let Some(s) = cmd.find_subcommand(w) {
            cmd = s;
        } else {
            positionals += 1;
        }
    }
    let with_help = |name: &str, help: Option<&clap::builder::StyledStr>| match help {
        Some(h) => format!("{name}\t{}", h.to_string().lines().next().unwrap_or("")),
        None => name.to_string(),
    };
    // The value of the flag before it.
    if skip {
        let flag = before.last().map(String::as_str).unwrap_or_default();
        if matches!(flag, "-o" | "--output") {
            let values = ["text", "wide", "json"];
            return (
                values
                    .iter()
                    .filter(|v| v.starts_with(cur))
                    .map(|v| v.to_string())
                    .collect(),
                NO_FILES,
            );
        }
        return (
            Vec::new(),
            if flag == "--kubeconfig" {
                FILES
            } else {
                NO_FILES
            },
        );
    }
    if cur.starts_with('-') {
        let mut out: Vec<String> = cmd
            .get_arguments()
            .filter(|a| !a.is_hide_set())
            .filter_map(|a| a.get_long().map(|l| (format!("--{l}"), a.get_help())))
            .filter(|(l, _)| l.starts_with(cur))
            .map(|(l, h)| with_help(&l, h))
            .collect();
        out.sort();
        return (out, NO_FILES);
    }
    if cmd.has_subcommands() {
        let out = cmd
            .get_subcommands()
            .filter(|s| s.get_name() != "help" && s.get_name().starts_with(cur))
            .map(|s| with_help(s.get_name(), s.get_about()))
            .collect();
        return (out, NO_FILES);
    }
    if matches!(cmd.get_name(), "explain" | "history" | "drain") && positionals == 0 {
        // The flags typed so far choose the cluster (as for the command itself).
        let mut argv = vec![PLUGIN_BIN.to_string()];
        argv.extend(before.iter().cloned());
        if let Ok(cli) = PluginCli::try_parse_from(argv.iter().chain([&"x".to_string()])) {
            nodes(cli.global);
        }
    }
    (Vec::new(), NO_FILES)
}

/// nodekeeper as a kubectl plugin: what nodekeeper does with your nodes, why a node is held and
/// what happens next.
#[derive(Debug, Parser)]
#[command(
    name = "kubectl-nodekeeper",
    bin_name = "kubectl nodekeeper",
    version = nodekeeper_core::VERSION,
    propagate_version = true,
    after_help = "kubectl's global flags go after `nodekeeper`: kubectl nodekeeper --context prod status. \
Exit codes: 0 done, 1 error (nodekeeper not installed, node not found, API unreachable), 2 usage; drain also 3, 4, 5 (docs/drain.md)."
)]
pub struct PluginCli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: PluginCommand,
}

/// kubectl's global flags that the plugin honours.
#[derive(Debug, clap::Args)]
struct Global {
    /// Path to the kubeconfig file (default: KUBECONFIG, ~/.kube/config or in-cluster).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: the current context).
    #[arg(long, global = true)]
    context: Option<String>,
    /// The namespace nodekeeper is installed in (Nodes are cluster-scoped; this is where the
    /// installation check looks).
    #[arg(short = 'n', long, global = true, default_value = DEFAULT_NAMESPACE)]
    namespace: String,
    /// Output format: text, wide (status only) or json.
    #[arg(short = 'o', long, global = true, value_enum)]
    output: Option<PluginOutput>,
}

/// `-o`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum PluginOutput {
    /// Human-readable.
    Text,
    /// `status`: the table plus REASON, STEP, NOTICE and REPLACEMENT.
    Wide,
    /// One JSON document (`drain`: one JSON object per line).
    Json,
}

#[derive(Debug, Subcommand)]
enum PluginCommand {
    /// Every node: what nodekeeper is doing with it, what holds it back and what happens next
    /// (as `nodekeeper status`, docs/status.md).
    Status(status::StatusOpts),
    /// Cordon and drain a node in tiers, naming what blocks it (as `nodekeeper drain`,
    /// docs/drain.md).
    Drain {
        /// The node to drain.
        node: String,
        #[command(flatten)]
        opts: drain::DrainOpts,
    },
    /// One node in full: why it is held, what happens next and when, its nodekeeper conditions
    /// and latest nodekeeper Events.
    Explain {
        /// The node.
        node: String,
        /// The node label naming a node's group (as `[budgets] group_by`).
        #[arg(long, default_value = "karpenter.sh/nodepool")]
        group_label: String,
    },
    /// What nodekeeper did to the node, newest first (what, why, outcome, how long), from the
    /// history the controller keeps in its namespace; then the node's nodekeeper Events still on
    /// the API server (as `nodekeeper status NODE --history`).
    History {
        /// The node.
        node: String,
    },
    /// Print a completion script for `kubectl-nodekeeper` (bash: `source <(kubectl nodekeeper
    /// completion bash)`; zsh: write it as `_kubectl-nodekeeper` into a directory of $fpath).
    Completion {
        /// The shell.
        shell: Shell,
    },
}

/// A shell of `completion`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Shell {
    /// bash.
    Bash,
    /// zsh.
    Zsh,
}

/// Writes the completion script of `cmd` (invoked as `bin`) for `shell` to stdout.
pub fn completion(shell: Shell, mut cmd: clap::Command, bin: &str) -> u8 {
    let shell = match shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
    };
    clap_complete::generate(shell, &mut cmd, bin, &mut std::io::stdout());
    Exit::Ok.code()
}

/// Runs `kubectl nodekeeper ARGS`; returns the exit code.
pub fn main(env: &Env) -> u8 {
    let cli = PluginCli::parse();
    let g = cli.global;
    let usage = |msg: &str| -> u8 {
        let e = PluginCli::command().error(clap::error::ErrorKind::InvalidValue, msg);
        let _ = e.print();
        Exit::Invalid.code()
    };
    if let PluginCommand::Completion { shell } = cli.command {
        return completion(shell, PluginCli::command(), PLUGIN_BIN);
    }
    let output = g.output.unwrap_or(PluginOutput::Text);
    if output == PluginOutput::Wide && !matches!(cli.command, PluginCommand::Status(_)) {
        return usage("-o wide is for `status` only; use -o text or -o json");
    }
    if let Err(code) = installed(&g) {
        return code;
    }
    match cli.command {
        PluginCommand::Status(opts) => status::main(
            status::StatusArgs {
                kubeconfig: g.kubeconfig,
                context: g.context,
                output: match output {
                    PluginOutput::Text => StatusOutput::Text,
                    PluginOutput::Wide => StatusOutput::Wide,
                    PluginOutput::Json => StatusOutput::Json,
                },
                node: None,
                history: false,
                namespace: g.namespace,
                opts,
            },
            env,
        ),
        PluginCommand::Drain { node, opts } => drain::main(drain::DrainArgs {
            node,
            kubeconfig: g.kubeconfig,
            context: g.context,
            output: text_or_json(output),
            opts,
        }),
        PluginCommand::Explain { node, group_label } => {
            explain(&g, &node, &group_label, text_or_json(output))
        }
        PluginCommand::History { node } => history(&g, &node, text_or_json(output)),
        PluginCommand::Completion { .. } => unreachable!("handled above"),
    }
}

fn text_or_json(o: PluginOutput) -> Output {
    match o {
        PluginOutput::Json => Output::Json,
        PluginOutput::Text | PluginOutput::Wide => Output::Text,
    }
}

/// A client for the global flags, and its server's URL (for messages).
async fn connect(
    g: &Global,
    component: &str,
) -> Result<(kube::Client, String), Box<dyn std::error::Error + Send + Sync>> {
    let mut cfg = client::config(g.kubeconfig.as_deref(), g.context.as_deref(), component).await?;
    cfg.connect_timeout = Some(std::time::Duration::from_secs(10));
    let server = cfg.cluster_url.to_string();
    Ok((client::client(cfg)?, server))
}

/// The installation check: Err(exit code) when nodekeeper is not installed (the message names
/// what is missing) or the cluster cannot be reached; a warning when the caller may not look.
fn installed(g: &Global) -> Result<(), u8> {
    let code = super::block_on_current_thread(async {
        let (client, server) = connect(g, "kubectl-nodekeeper").await?;
        match check_installed(client, &server, &g.namespace).await? {
            Installed::Yes => {}
            Installed::Unknown(why) => eprintln!("warning: {why}"),
        }
        Ok(Exit::Ok.code())
    });
    if code == Exit::Ok.code() {
        Ok(())
    } else {
        Err(code)
    }
}

fn explain(g: &Global, node: &str, group_label: &str, output: Output) -> u8 {
    super::block_on_current_thread(async {
        let (client, server) = connect(g, "kubectl-nodekeeper").await?;
        let n = get_node(client.clone(), &server, node).await?;
        let events = node_events(client, &server, node).await?;
        let now = Utc::now();
        let x = explain::explain(&n, &events, group_label, now);
        match output {
            Output::Json => println!("{}", serde_json::to_string_pretty(&x)?),
            Output::Text => print!("{}", render_explanation(&x, now)),
        }
        Ok(Exit::Ok.code())
    })
}

fn history(g: &Global, node: &str, output: Output) -> u8 {
    super::block_on_current_thread(async {
        let (client, server) = connect(g, "kubectl-nodekeeper").await?;
        status::print_history(client, &server, &g.namespace, node, output).await
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn only_the_plugin_names_dispatch() {
        let of = |s: &str| invoked_as(Some(&OsString::from(s)));
        assert_eq!(of("kubectl-nodekeeper"), Invoked::Plugin);
        assert_eq!(of("/usr/local/bin/kubectl-nodekeeper"), Invoked::Plugin);
        assert_eq!(of("/x/kubectl_complete-nodekeeper"), Invoked::Complete);
        assert_eq!(of("nodekeeper"), Invoked::Nodekeeper);
        assert_eq!(of("/usr/bin/kubectl-nodekeeper-old"), Invoked::Nodekeeper);
        assert_eq!(invoked_as(None), Invoked::Nodekeeper);
    }

    fn complete_words(words: &[&str]) -> (Vec<String>, u8, Option<Global>) {
        let words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
        let mut asked = None;
        let (c, d) = candidates(&words, |g| asked = Some(g));
        (c, d, asked)
    }

    #[test]
    fn kubectls_completion_gets_commands_flags_values_and_nodes() {
        let (c, d, _) = complete_words(&[""]);
        let names: Vec<&str> = c.iter().map(|l| l.split('\t').next().unwrap()).collect();
        assert_eq!(
            names,
            ["status", "drain", "explain", "history", "completion"]
        );
        assert!(c[2].starts_with("explain\tOne node in full"), "{c:?}");
        assert_eq!(d, NO_FILES);
        let (c, _, _) = complete_words(&["--context", "prod", "ex"]);
        assert_eq!(c.len(), 1);
        assert!(c[0].starts_with("explain\t"));
        let (c, _, _) = complete_words(&["status", "--conte"]);
        assert_eq!(c.len(), 1, "{c:?}");
        assert!(c[0].starts_with("--context\t"), "{c:?}");
        let (c, _, _) = complete_words(&["status", "-o", ""]);
        assert_eq!(c, ["text", "wide", "json"]);
        let (c, d, _) = complete_words(&["--kubeconfig", ""]);
        assert!(c.is_empty());
        assert_eq!(d, FILES);
        // Where a node goes, the cluster of the typed flags is asked.
        let (_, _, asked) = complete_words(&["--context", "prod", "explain", ""]);
        assert_eq!(asked.unwrap().context.as_deref(), Some("prod"));
        let (_, _, asked) = complete_words(&["drain", "n1", ""]);
        assert!(asked.is_none(), "one node only");
    }

    #[test]
    fn global_flags_go_anywhere_after_the_plugin_name() {
        PluginCli::command().debug_assert();
        for argv in [
            &[
                "kubectl-nodekeeper",
                "--context",
                "c",
                "-n",
                "ops",
                "-o",
                "json",
                "status",
            ][..],
            &[
                "kubectl-nodekeeper",
                "status",
                "--context",
                "c",
                "-n",
                "ops",
                "-o",
                "json",
            ],
            &[
                "kubectl-nodekeeper",
                "-ojson",
                "status",
                "--context=c",
                "--namespace=ops",
            ],
        ] {
            let cli = PluginCli::try_parse_from(argv).unwrap();
            assert_eq!(cli.global.context.as_deref(), Some("c"), "{argv:?}");
            assert_eq!(cli.global.namespace, "ops", "{argv:?}");
            assert_eq!(cli.global.output, Some(PluginOutput::Json), "{argv:?}");
            assert!(matches!(cli.command, PluginCommand::Status(_)));
        }
        let cli = PluginCli::try_parse_from([
            "kubectl-nodekeeper",
            "explain",
            "n1",
            "--kubeconfig",
            "/k",
        ])
        .unwrap();
        assert_eq!(cli.global.kubeconfig.as_deref(), Some(Path::new("/k")));
        assert_eq!(cli.global.namespace, DEFAULT_NAMESPACE);
        assert!(PluginCli::try_parse_from(["kubectl-nodekeeper", "-o", "yaml", "status"]).is_err());
    }

    #[test]
    fn completions_name_every_command_for_both_shells() {
        for shell in [clap_complete::Shell::Bash, clap_complete::Shell::Zsh] {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut PluginCli::command(), PLUGIN_BIN, &mut out);
            let text = String::from_utf8(out).unwrap();
            for word in [
                "status",
                "drain",
                "explain",
                "history",
                "--kubeconfig",
                "--context",
            ] {
                assert!(text.contains(word), "{shell}: {word}");
            }
        }
    }
}
