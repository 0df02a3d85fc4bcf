//! A repair policy's own escalation ladder, on both backends: Ready=False repaired by
//! `restart-unit:kubelet.service` → `reboot` → `replace`. A stand-in agent reports for the failing
//! node with the shipped DaemonSet pod's bound token (as the real agent does), runs what the
//! controller's answers ask (it lists `restart_unit` among its command types) and reports each
//! result. In one scenario the kubelet's restart heals the node: the repair ends and no reboot
//! follows. In the other it does not: the ladder escalates to a reboot, and the node's Ready again
//! with its old boot ID does not end the repair; the new boot ID does.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use nodekeeper_core::controller::policy::view::keys;
use nodekeeper_core::wire::{AgentCommand, CommandResult, NodeReport, COMMAND_TYPES};
use serde_json::json;

use crate::repair::{ready_false_repair, seen_ready, status_reader_token};
use crate::support::*;

/// The agent on one node, as the controller sees it: reports, the commands they brought back, and
/// the result of each, sent with the next report.
struct StandInAgent {
    https: reqwest::Client,
    addr: std::net::SocketAddr,
    token: String,
    report: NodeReport,
    received: Vec<AgentCommand>,
    results: Vec<CommandResult>,
}

impl StandInAgent {
    async fn new(c: &Cluster, ctl: &ControllerProc, dir: &std::path::Path, node: &str) -> Self {
        let admin = c.admin().await;
        let mut report = crate::ctl::report(node, 1, &[]);
        report.command_types = COMMAND_TYPES.iter().map(|t| t.to_string()).collect();
        StandInAgent {
            https: crate::ctl::https(&dir.join("ca.pem"), ctl.addr),
            addr: ctl.addr,
            token: agent_report_token(&admin, node).await,
            report,
            received: Vec::new(),
            results: Vec::new(),
        }
    }

    /// One report (the next sequence number, with every result so far); the commands of the answer
    /// not seen before are run: each succeeds.
    async fn report_once(&mut self) {
        self.report.sequence += 1;
        self.report.command_results = self.results.clone();
        let (code, body) = post_report(&self.https, self.addr, &self.token, &self.report).await;
        if code != 200 {
            eprintln!("report {}: {code} {body}", self.report.sequence);
            return;
        }
        let commands: Vec<AgentCommand> =
            serde_json::from_value(body["commands"].clone()).unwrap_or_default();
        for cmd in commands {
            if self.received.contains(&cmd) {
                continue;
            }
            eprintln!("agent stand-in runs {cmd:?}");
            self.results.push(CommandResult {
                id: cmd.id().to_string(),
                ok: true,
                message: format!("{} done", cmd.type_name()),
            });
            self.received.push(cmd);
        }
    }

    fn got(&self, type_: &str) -> Vec<&AgentCommand> {
        self.received
            .iter()
            .filter(|c| c.type_name() == type_)
            .collect()
    }
}

/// Reports (every 100 ms, as often as the wait polls) until `f` of the Node holds.
async fn reporting_until<T>(
    agent: &Arc<tokio::sync::Mutex<StandInAgent>>,
    api: &Api<Node>,
    node: &str,
    what: &str,
    f: impl Fn(&Node, &StandInAgent) -> Option<T>,
) -> T {
    let f = &f;
    wait_for(Duration::from_secs(60), what, || async move {
        let mut a = agent.lock().await;
        a.report_once().await;
        let n = api.get(node).await.ok()?;
        f(&n, &a)
    })
    .await
}

/// The controller's engine reconciles so far.
async fn reconciles(ctl: &ControllerProc, dir: &std::path::Path) -> f64 {
    let https = crate::ctl::https(&dir.join("ca.pem"), ctl.addr);
    let (_, text) = crate::ctl::get(&https, ctl.addr, "/metrics").await.unwrap();
    metric(&text, "nodekeeper_engine_reconciles_total")
}

/// An Event of `reason` about `node` whose note contains `note`.
async fn wait_event(admin: &kube::Client, node: &str, reason: &str, note: &str) {
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    wait_until(
        Duration::from_secs(30),
        &format!("{reason} Event about {node}"),
        || {
            let events = events.clone();
            async move {
                events.list(&ListParams::default()).await.is_ok_and(|l| {
                    l.items.iter().any(|e| {
                        e.reason.as_deref() == Some(reason)
                            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node)
                            && e.note.as_deref().is_some_and(|m| m.contains(note))
                    })
                })
            }
        },
    )
    .await;
}

/// One scenario's world, from [`ladder_setup`] (the lock and the nodes held until it drops).
struct Ladder {
    _one_engine: tokio::sync::MutexGuard<'static, ()>,
    _nodes: NodesGuard,
    admin: kube::Client,
    api: Api<Node>,
    dir: tempfile::TempDir,
    ctl: ControllerProc,
    agent: Arc<tokio::sync::Mutex<StandInAgent>>,
}

/// Four nodes of `pool`, the controller with the AKS-like ladder on Ready=False (restart the
/// kubelet: 4 s to clear; reboot: 120 s), the first node failing, its agent stand-in reporting.
async fn ladder_setup(c: &'static Cluster, pool: &str, nodes: &[&str; 4]) -> Ladder {
    init_tracing();
    let one_engine = c.exclusive().await;
    let admin = c.admin().await;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let guard = c
        .create_nodes(
            &nodes
                .iter()
                .map(|n| {
                    kwok_node(
                        n,
                        json!({ "karpenter.sh/nodepool": pool, "kubernetes.io/hostname": n }),
                    )
                })
                .collect::<Vec<_>>(),
        )
        .await;
    let config = controller_toml(dir, pool, |t| {
        ready_false_repair(t);
        let r = t["repair"].as_table_mut().unwrap();
        r.insert("restart_timeout".into(), "4s".into());
        r.insert("reboot_timeout".into(), "120s".into());
        r.insert("healthy_delay".into(), "1s".into());
        let p = r["policy"].as_array_mut().unwrap()[0]
            .as_table_mut()
            .unwrap();
        p.insert(
            "steps".into(),
            toml::Value::Array(
                ["restart-unit:kubelet.service", "reboot", "replace"]
                    .map(toml::Value::from)
                    .to_vec(),
            ),
        );
        let c = t["controller"].as_table_mut().unwrap();
        let engine = c
            .entry("engine")
            .or_insert_with(|| toml::Table::new().into())
            .as_table_mut()
            .unwrap();
        engine.insert("tick".into(), "1s".into());
    });
    let ctl = ControllerProc::start(c, &config, pool).await;
    let api: Api<Node> = Api::all(admin.clone());
    seen_ready(&api, &nodes[..1]).await;
    // The token is bound to the agent pod: taken while the node is healthy.
    let agent = StandInAgent::new(c, &ctl, dir, nodes[0]).await;
    c.kubelet_reports_not_ready(nodes[0]).await;
    c.kubelet_reports_boot_id(nodes[0], "boot-1").await;
    Ladder {
        _one_engine: one_engine,
        _nodes: guard,
        admin,
        api,
        dir: tmp,
        ctl,
        agent: Arc::new(tokio::sync::Mutex::new(agent)),
    }
}

/// The node's kubelet posts Ready=True again.
async fn kubelet_ready(c: &Cluster, node: &str) {
    c.kubelet_reports(
        node,
        "True",
        "KubeletReady",
        "kubelet is posting ready status",
    )
    .await;
}

/// The first step, restart-unit of the kubelet, asked for and run.
async fn restart_asked(agent: &Arc<tokio::sync::Mutex<StandInAgent>>, api: &Api<Node>, node: &str) {
    reporting_until(
        agent,
        api,
        node,
        "restart_unit of kubelet.service",
        |n, a| {
            let asked = a.got("restart_unit").iter().any(
            |c| matches!(c, AgentCommand::RestartUnit { unit, .. } if unit == "kubelet.service"),
        );
            (asked && annotation(n, keys::REPAIR_STEP) == Some("restart-unit:kubelet.service"))
                .then_some(())
        },
    )
    .await;
}

on_both!(restart_unit_that_heals_ends_the_repair_without_a_reboot);
async fn restart_unit_that_heals_ends_the_repair_without_a_reboot(c: &'static Cluster) {
    const NODES: [&str; 4] = ["lh-0", "lh-1", "lh-2", "lh-3"];
    let l = ladder_setup(c, "lh-pool", &NODES).await;
    let (admin, api, agent) = (&l.admin, &l.api, &l.agent);
    restart_asked(agent, api, NODES[0]).await;
    wait_event(admin, NODES[0], "UnitRestartRequested", "kubelet.service").await;
    let asked_at = tokio::time::Instant::now();
    // The kubelet came back with its restart.
    kubelet_ready(c, NODES[0]).await;
    reporting_until(agent, api, NODES[0], "the repair over", |n, _| {
        annotation(n, keys::STATE).is_none().then_some(())
    })
    .await;
    wait_event(admin, NODES[0], "RepairCancelled", "healthy").await;
    // Past the restart step's timeout and three more reconciles: still no reboot.
    let before = reconciles(&l.ctl, l.dir.path()).await;
    reporting_until(
        agent,
        api,
        NODES[0],
        "3 reconciles past the restart timeout",
        |_, _| (asked_at.elapsed() > Duration::from_secs(5)).then_some(()),
    )
    .await;
    let ctl_ref = &l.ctl;
    let path = l.dir.path();
    wait_until(
        Duration::from_secs(30),
        "3 more reconciles",
        || async move { reconciles(ctl_ref, path).await >= before + 3.0 },
    )
    .await;
    agent.lock().await.report_once().await;
    let node = api.get(NODES[0]).await.unwrap();
    let a = agent.lock().await;
    assert!(a.got("reboot").is_empty(), "{:?}", a.received);
    assert_eq!(annotation(&node, keys::REBOOT_REQUESTED), None);
    assert_eq!(annotation(&node, keys::REPLACEMENT_REQUESTED), None);
    assert!(!unschedulable(&node), "uncordoned");
    drop(a);
    l.ctl.stop().await;
}

on_both!(restart_unit_that_does_not_heal_escalates_to_a_reboot_gated_on_a_new_boot_id);
async fn restart_unit_that_does_not_heal_escalates_to_a_reboot_gated_on_a_new_boot_id(
    c: &'static Cluster,
) {
    const NODES: [&str; 4] = ["le-0", "le-1", "le-2", "le-3"];
    let l = ladder_setup(c, "le-pool", &NODES).await;
    let (admin, api, agent) = (&l.admin, &l.api, &l.agent);
    restart_asked(agent, api, NODES[0]).await;
    // Still NotReady 4 s later: the reboot, with the boot ID it must change from.
    reporting_until(agent, api, NODES[0], "the reboot asked", |n, a| {
        (!a.got("reboot").is_empty() && annotation(n, keys::REPAIR_STEP) == Some("reboot"))
            .then_some(())
    })
    .await;
    let node = api.get(NODES[0]).await.unwrap();
    assert_eq!(annotation(&node, keys::REBOOT_REQUESTED), Some("boot-1"));
    wait_event(
        admin,
        NODES[0],
        "RepairEscalated",
        "restart-unit:kubelet.service done or timed out; next: reboot",
    )
    .await;

    // Ready again, but the same boot ID: no reboot happened, the repair goes on.
    kubelet_ready(c, NODES[0]).await;
    let ready_at = tokio::time::Instant::now();
    let before = reconciles(&l.ctl, l.dir.path()).await;
    let ctl_ref = &l.ctl;
    let path = l.dir.path();
    wait_until(
        Duration::from_secs(30),
        "3 more reconciles past healthy_delay",
        || async move {
            ready_at.elapsed() > Duration::from_secs(2)
                && reconciles(ctl_ref, path).await >= before + 3.0
        },
    )
    .await;
    let node = api.get(NODES[0]).await.unwrap();
    assert_eq!(annotation(&node, keys::STATE), Some("repairing"));
    assert_eq!(annotation(&node, keys::REPAIR_STEP), Some("reboot"));
    // `nodekeeper status` (as a read-only operator) names the step and what it waits for.
    let token = status_reader_token(c, admin).await;
    let kc = l.dir.path().join("reader.kubeconfig");
    c.write_token_kubeconfig(&kc, &token);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args(["status", "-o", "json", "--kubeconfig"])
        .arg(&kc)
        .args(["-l", &format!("kubernetes.io/hostname={}", NODES[0])])
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = &status["nodes"][0];
    assert_eq!(row["repair_step"], "reboot", "{status}");
    assert_eq!(
        row["next"]["action"], "wait for the reboot (a new boot id)",
        "{status}"
    );

    // The new boot ID: the reboot is proven, and Ready ends the repair (no replacement).
    c.kubelet_reports_boot_id(NODES[0], "boot-2").await;
    reporting_until(agent, api, NODES[0], "the repair over", |n, _| {
        annotation(n, keys::STATE).is_none().then_some(())
    })
    .await;
    let node = api.get(NODES[0]).await.unwrap();
    assert_eq!(annotation(&node, keys::REPLACEMENT_REQUESTED), None);
    assert!(!unschedulable(&node), "uncordoned");
    assert_eq!(agent.lock().await.got("reboot").len(), 1, "one reboot");
    l.ctl.stop().await;
}
