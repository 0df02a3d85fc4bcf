//! The demo's scripted scenario and the checks of its expected outcomes.

use std::collections::BTreeSet;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::Api;

use super::agents::{Agents, SERVICE_ACCOUNT};
use super::backend::Backend;
use super::cluster::MIGRATION_LABEL;
use super::timeline::{Outcome, Timeline};
use super::{DemoArgs, DemoError};
use nodekeeper_core::config_file::Config;
use nodekeeper_core::controller::config::ControllerConfig;
use nodekeeper_core::controller::policy::explain::{Blocker, Held};
use nodekeeper_core::controller::policy::view::keys;
use nodekeeper_core::controller::policy::PolicyConfig;

/// Phases of the scenario, the summary included.
pub const PHASES: usize = 4;

/// The running demo: cluster client, controller, agents.
pub struct Env {
    client: kube::Client,
    backend: Arc<Backend>,
    controller: Option<nodekeeper_core::controller::Running>,
    agents: Arc<Agents>,
    tl: Arc<Timeline>,
    args: DemoArgs,
    policy: PolicyConfig,
    crio_root: PathBuf,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Env {
    /// Starts the controller and the agent supervisor against `cluster`.
    #[allow(clippy::too_many_arguments)]
    pub async fn start(
        backend: Arc<Backend>,
        config: &Config,
        policy: PolicyConfig,
        exe: PathBuf,
        dir: PathBuf,
        kubeconfig: PathBuf,
        args: DemoArgs,
        tl: Arc<Timeline>,
    ) -> Result<Env, DemoError> {
        let client = backend.admin();
        if let Backend::Sim(_) = *backend {
            let ns: Namespace =
                serde_json::from_value(serde_json::json!({"metadata": {"name": "nodekeeper"}}))
                    .map_err(|e| DemoError::Start(e.to_string()))?;
            Api::<Namespace>::all(client.clone())
                .create(&PostParams::default(), &ns)
                .await
                .map_err(|e| DemoError::Start(format!("namespace nodekeeper: {e}")))?;
        }
        let mut ccfg = controller_config(config.controller.controller.clone());
        let provider = backend.provider(&ccfg.provider);
        if matches!(*backend, Backend::Real(_))
            && matches!(
                provider,
                nodekeeper_core::controller::act::provider::ProviderConfig::Webhook(_)
            )
            && provider != ccfg.provider
        {
            // The real backend's cloud stand-in answers on loopback, in this process.
            ccfg.allow_loopback_destinations = true;
        }
        ccfg.provider = provider;
        let events_tl = tl.clone();
        let events_client = client.clone();
        let mut tasks = vec![tokio::spawn(async move {
            super::timeline::follow_events(
                events_client,
                nodekeeper_core::controller::cluster::events::NODE_EVENT_NAMESPACE,
                &events_tl,
            )
            .await;
        })];
        let engine = nodekeeper_core::controller::engine::EngineOptions::new(policy.clone());
        let controller_client = backend.controller_client().await?;
        let controller =
            nodekeeper_core::controller::start_with(controller_client, &ccfg, Some(engine))
                .await
                .map_err(|e| DemoError::Start(format!("controller: {e}")))?;
        let url = format!("http://{}", controller.addr);
        tl.raw(&format!(
            "nodekeeper demo: {}, controller {url}, policy time ×{} (work dir {})",
            backend.describe(),
            args.speed,
            dir.display()
        ));
        let agents = Arc::new(Agents::new(
            exe,
            dir.clone(),
            url,
            backend.credentials(&kubeconfig),
        ));
        tasks.push(tokio::spawn(supervise(
            client.clone(),
            agents.clone(),
            tl.clone(),
        )));
        Ok(Env {
            client,
            backend,
            controller: Some(controller),
            agents,
            tl,
            args,
            policy,
            crio_root: dir.join("crio-root"),
            tasks,
        })
    }

    /// Plays the scenario (the summary is printed by the caller, after [`Env::stop`]).
    pub async fn play(&self) {
        let nodes = self.node_names().await;
        let spot = self.pool_nodes("spot").await;
        let ondemand = self.pool_nodes("on-demand").await;
        self.tl.phase(
            1,
            PHASES,
            "cluster up: agents report, migration labels cleaned, CRI-O drop-ins applied",
        );
        let labelled: Vec<String> = nodes.iter().step_by(2).cloned().collect();
        self.label(&labelled).await;
        let t0 = Instant::now();
        self.agents_reporting(&nodes, t0).await;
        self.labels_cleaned(&labelled, t0).await;
        self.crio().await;
        if let Some(victim) = spot.first() {
            self.tl.phase(
                2,
                PHASES,
                "Spot preemption: notice → taint + cordon → tiered drain → replacement",
            );
            self.preemption(victim).await;
        }
        if ondemand.len() >= 2 {
            self.tl.phase(3, PHASES, "two on-demand nodes NotReady: graceful repair, one at a time (budget nodes: \"1\")");
            self.repair(&ondemand[0], &ondemand[1]).await;
        }
    }

    /// Stops agents, controller and background tasks.
    pub async fn stop(mut self) {
        self.agents.stop_all().await;
        if let Some(c) = self.controller.take() {
            c.stop().await;
        }
        for t in &self.tasks {
            t.abort();
        }
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    async fn node_names(&self) -> Vec<String> {
        self.names(ListParams::default()).await
    }

    async fn pool_nodes(&self, pool: &str) -> Vec<String> {
        self.names(ListParams::default().labels(&format!("karpenter.sh/nodepool={pool}")))
            .await
    }

    async fn names(&self, lp: ListParams) -> Vec<String> {
        self.nodes()
            .list(&lp)
            .await
            .map(|l| {
                l.items
                    .into_iter()
                    .filter_map(|n| n.metadata.name)
                    .collect()
            })
            .unwrap_or_default()
    }

    async fn node(&self, name: &str) -> Option<Node> {
        self.nodes().get_opt(name).await.ok().flatten()
    }

    async fn label(&self, nodes: &[String]) {
        for n in nodes {
            let patch = serde_json::json!({"metadata": {"labels": {MIGRATION_LABEL: "true"}}});
            if self
                .nodes()
                .patch(n, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .is_ok()
            {
                self.tl.line(
                    n,
                    "labelled",
                    &format!("{MIGRATION_LABEL}=true (as OKE leaves it after a Cilium migration)"),
                );
            }
        }
    }

    /// Polls `f` every 100 ms until it returns `Some`, or gives up after the step timeout.
    /// The time returned is measured from `since` (what the outcome is timed against).
    async fn until<T, F, Fut>(&self, since: Instant, mut f: F) -> Result<(T, Duration), Duration>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let start = Instant::now();
        loop {
            if let Some(v) = f().await {
                return Ok((v, since.elapsed()));
            }
            if start.elapsed() > self.args.step_timeout {
                return Err(start.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn outcome<T>(
        &self,
        what: &str,
        node: &str,
        r: &Result<(T, Duration), Duration>,
        detail: String,
    ) {
        let (ok, took, detail) = match r {
            Ok((_, d)) => (true, Some(*d), detail),
            Err(d) => (false, None, format!("not within {:.0}s", d.as_secs_f64())),
        };
        self.tl.outcome(Outcome {
            what: what.into(),
            node: node.into(),
            took,
            ok,
            detail,
        });
    }

    async fn agents_reporting(&self, nodes: &[String], t0: Instant) {
        let r = self
            .until(t0, || async {
                for n in nodes {
                    let node = self.node(n).await?;
                    let reported = node
                        .status?
                        .conditions?
                        .iter()
                        .any(|c| c.type_.starts_with("Nodekeeper"));
                    if !reported {
                        return None;
                    }
                }
                Some(())
            })
            .await;
        let detail = format!(
            "{} agents, conditions Nodekeeper* on every node",
            nodes.len()
        );
        self.outcome("agents report to the controller", "all", &r, detail);
    }

    async fn labels_cleaned(&self, labelled: &[String], t0: Instant) {
        for n in labelled {
            let r = self
                .until(t0, || async {
                    let node = self.node(n).await?;
                    let has = node
                        .metadata
                        .labels
                        .as_ref()
                        .is_some_and(|l| l.contains_key(MIGRATION_LABEL));
                    (!has).then_some(())
                })
                .await;
            self.outcome(
                "migration label cleaned",
                n,
                &r,
                "removed by the controller once this node's cilium pod was Ready".into(),
            );
        }
    }

    async fn crio(&self) {
        use nodekeeper_core::agent::crio::apply::{apply, ApplyOptions};
        use nodekeeper_core::agent::host::fake::FakeUnitManager;
        let text = "[crio]\nstate_dir = \"/var/lib/nodekeeper\"\n[[crio.dropin]]\nname = \"11-default.conf\"\ncontent = \"\"\"\n[crio.image]\nshort_name_mode = \"enforcing\"\n\"\"\"\n";
        let cfg = match nodekeeper_core::config_file::Config::load_str(
            std::path::Path::new("<demo crio>"),
            text,
            &nodekeeper_core::config::Env::default(),
        ) {
            Ok(l) => l.config.agent.crio,
            Err(e) => {
                self.tl.outcome(Outcome {
                    what: "CRI-O drop-in applied".into(),
                    node: "on-demand".into(),
                    took: None,
                    ok: false,
                    detail: e.to_string(),
                });
                return;
            }
        };
        // CRI-O's package creates its drop-in directory; the throw-away root has it too.
        let dropins = self
            .crio_root
            .join(cfg.dropin_dir.strip_prefix("/").unwrap_or(&cfg.dropin_dir));
        if let Err(e) = std::fs::create_dir_all(&dropins) {
            self.tl.line(
                "(throw-away root)",
                "error",
                &format!("{}: {e}", dropins.display()),
            );
        }
        let opts = ApplyOptions {
            root: Some(self.crio_root.clone()),
            dry_run: false,
        };
        let mut restarts = Vec::new();
        for _ in 0..2 {
            let start = Instant::now();
            let f = FakeUnitManager::new().with_unit("crio.service", FakeUnitManager::active());
            let (report, result) = apply(&cfg, &opts, || async move { Ok(f) }).await;
            if let Err(e) = &result {
                self.tl.line(
                    "(throw-away root)",
                    "CRI-O apply failed",
                    &nodekeeper_core::telemetry::error_chain(e),
                );
            }
            restarts.push((
                report.changed,
                report.restarted,
                result.is_ok(),
                start.elapsed(),
            ));
        }
        let (first, second) = (restarts[0], restarts[1]);
        self.tl.outcome(Outcome {
            what: "CRI-O drop-in applied, crio restarted".into(),
            node: "(throw-away root)".into(),
            took: Some(first.3),
            ok: first.0 && first.1 && first.2,
            detail: format!(
                "11-default.conf written atomically under {}; 1 restart over the unit manager",
                self.crio_root.display()
            ),
        });
        self.tl.outcome(Outcome {
            what: "CRI-O re-apply: no change, no restart".into(),
            node: "(throw-away root)".into(),
            took: Some(second.3),
            ok: !second.0 && !second.1 && second.2,
            detail: "drop-in unchanged: CRI-O left running".into(),
        });
    }

    async fn preemption(&self, victim: &str) {
        let before: BTreeSet<String> = self.pool_nodes("spot").await.into_iter().collect();
        let movable = self.movable_pods(victim).await;
        let lead = Duration::from_secs(30);
        self.tl.line(
            victim,
            "preemption notice",
            &format!(
                "injected into its OCI metadata emulator: reclaimed in {}s ({} pods to move)",
                lead.as_secs(),
                movable
            ),
        );
        let t0 = Instant::now();
        if !self.agents.preempt(victim, lead).await {
            self.tl.outcome(Outcome {
                what: "preemption notice delivered".into(),
                node: victim.into(),
                took: None,
                ok: false,
                detail: "no agent for the node".into(),
            });
            return;
        }
        let taint_key = self.policy.interruption.taint_key.clone();
        let r = self
            .until(t0, || async {
                let n = self.node(victim).await?;
                let spec = n.spec?;
                let tainted = spec
                    .taints
                    .unwrap_or_default()
                    .iter()
                    .any(|t| t.key == taint_key);
                (tainted && spec.unschedulable == Some(true)).then_some(())
            })
            .await;
        self.outcome(
            "tainted + cordoned",
            victim,
            &r,
            format!("{taint_key} taint, unschedulable; notice → cordon"),
        );
        let r = self
            .until(t0, || async {
                (self.movable_pods(victim).await == 0).then_some(())
            })
            .await;
        let in_time = matches!(&r, Ok((_, d)) if *d < lead);
        let detail = format!(
            "{movable} pods evicted in tiers, PDBs respected; deadline {}s",
            lead.as_secs()
        );
        match r {
            Ok((v, d)) if in_time => {
                self.outcome("drained before the deadline", victim, &Ok((v, d)), detail)
            }
            Ok((_, d)) => {
                self.outcome::<()>("drained before the deadline", victim, &Err(d), detail)
            }
            Err(d) => self.outcome::<()>("drained before the deadline", victim, &Err(d), detail),
        }
        let r = self
            .until(t0, || async { self.new_ready_node("spot", &before).await })
            .await;
        let name = r.as_ref().map(|(n, _)| n.clone()).unwrap_or_default();
        self.outcome(
            "replacement Ready",
            victim,
            &r,
            format!("new spot node {name}"),
        );
    }

    async fn repair(&self, a: &str, b: &str) {
        let before: BTreeSet<String> = self.pool_nodes("on-demand").await.into_iter().collect();
        let t0 = Instant::now();
        for n in [a, b] {
            self.set_ready(n, "False").await;
            self.tl.line(
                n,
                "Ready=False",
                &format!("kubelet reports NotReady ({})", self.backend.fault_path()),
            );
        }
        let tol = self
            .policy
            .repair
            .repair_policies
            .iter()
            .chain(self.policy.repair.policy.iter())
            .find(|p| p.condition_type == "Ready")
            .map(|p| p.toleration)
            .unwrap_or_default();
        let mut first: Option<String> = None;
        let max_concurrent = std::cell::Cell::new(0usize);
        // Which node is repaired first is the controller's choice; the other must be held.
        let r = self
            .until(t0, || async {
                let (sa, sb) = (self.node(a).await, self.node(b).await);
                let acting = |n: &Option<Node>| {
                    n.as_ref()
                        .is_some_and(|n| annotation(n, keys::STATE).is_some())
                };
                let held = |n: &Option<Node>| {
                    let h = Held::decode(&annotation(n.as_ref()?, keys::BLOCKED)?)?;
                    matches!(h.blocker, Blocker::Budget { .. }).then(|| h.blocker.message())
                };
                match (acting(&sa), acting(&sb)) {
                    (true, false) => held(&sb).map(|h| (a.to_string(), b.to_string(), h)),
                    (false, true) => held(&sa).map(|h| (b.to_string(), a.to_string(), h)),
                    _ => None,
                }
            })
            .await;
        match &r {
            Ok(((f, h, why), _)) => {
                first = Some(f.clone());
                self.outcome(
                    "repair started after toleration",
                    f,
                    &r,
                    format!("toleration {:.0}s (600 s policy time)", tol.as_secs_f64()),
                );
                self.outcome(
                    "second node held by the budget",
                    h,
                    &r,
                    why.chars().take(140).collect(),
                );
            }
            Err(_) => self.outcome("second node held by the budget", b, &r, String::new()),
        }
        let Some(first) = first else { return };
        let second = if first == a { b } else { a };
        let r = self
            .until(t0, || async {
                let acting = self.acting_in_pool("on-demand").await;
                max_concurrent.set(max_concurrent.get().max(acting));
                let gone = self.node(&first).await.is_none();
                let repl = self.new_ready_node("on-demand", &before).await;
                (gone && repl.is_some()).then_some(())
            })
            .await;
        self.outcome(
            "first node drained and replaced",
            &first,
            &r,
            self.backend.replacement_path().into(),
        );
        let r = self
            .until(t0, || async {
                let acting = self.acting_in_pool("on-demand").await;
                max_concurrent.set(max_concurrent.get().max(acting));
                self.node(second).await.is_none().then_some(())
            })
            .await;
        self.outcome(
            "held node repaired after the first",
            second,
            &r,
            "budget freed when the first finished".into(),
        );
        self.tl.outcome(Outcome {
            what: "budget never exceeded".into(),
            node: "on-demand".into(),
            took: None,
            ok: max_concurrent.get() <= 1,
            detail: format!(
                "at most {} node(s) disrupted at once (budget 1)",
                max_concurrent.get()
            ),
        });
    }

    async fn acting_in_pool(&self, pool: &str) -> usize {
        self.nodes()
            .list(&ListParams::default().labels(&format!("karpenter.sh/nodepool={pool}")))
            .await
            .map(|l| {
                l.items
                    .iter()
                    .filter(|n| annotation(n, keys::STATE).is_some())
                    .count()
            })
            .unwrap_or(0)
    }

    async fn new_ready_node(&self, pool: &str, before: &BTreeSet<String>) -> Option<String> {
        let list = self
            .nodes()
            .list(&ListParams::default().labels(&format!("karpenter.sh/nodepool={pool}")))
            .await
            .ok()?;
        list.items.into_iter().find_map(|n| {
            let name = n.metadata.name.clone()?;
            let ready = n
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            (!before.contains(&name) && ready).then_some(name)
        })
    }

    /// Pods on `node` that a drain moves (not DaemonSet pods, not finished).
    async fn movable_pods(&self, node: &str) -> usize {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
        pods.list(&lp)
            .await
            .map(|l| {
                l.items
                    .iter()
                    .filter(|p| {
                        let ds = p
                            .metadata
                            .owner_references
                            .as_ref()
                            .is_some_and(|o| o.iter().any(|o| o.kind == "DaemonSet"));
                        let done = p
                            .status
                            .as_ref()
                            .and_then(|s| s.phase.as_deref())
                            .is_some_and(|ph| ph == "Succeeded" || ph == "Failed");
                        !ds && !done && p.metadata.deletion_timestamp.is_none()
                    })
                    .count()
            })
            .unwrap_or(usize::MAX)
    }

    async fn set_ready(&self, node: &str, status: &str) {
        if let Err(e) = self.backend.set_ready(node, status).await {
            self.tl.line(node, "error", &e);
        }
    }
}

fn annotation(n: &Node, key: &str) -> Option<String> {
    n.metadata.annotations.as_ref()?.get(key).cloned()
}

/// The controller configuration of the demo: the user's `[controller]` (if any) with the
/// demo's listen address, plain HTTP on loopback and short leases (the provider is the
/// backend's choice, [`Backend::provider`]).
pub fn controller_config(user: Option<ControllerConfig>) -> ControllerConfig {
    let mut c = user.unwrap_or_default();
    c.listen = "127.0.0.1:0".into();
    c.insecure_plain_http = true;
    c.tls_cert_file = None;
    c.tls_key_file = None;
    c.service_account = SERVICE_ACCOUNT.into();
    c.namespace = "nodekeeper".into();
    if !c.label_removal_allow.iter().any(|l| l == MIGRATION_LABEL) {
        c.label_removal_allow.push(MIGRATION_LABEL.into());
    }
    c.leader.lease_duration = Duration::from_secs(2);
    c.leader.retry_period = Duration::from_millis(200);
    c.staleness = Duration::from_secs(30);
    c
}

/// Starts an agent for every node and stops those of removed nodes (like a DaemonSet).
async fn supervise(client: kube::Client, agents: Arc<Agents>, tl: Arc<Timeline>) {
    let api: Api<Node> = Api::all(client);
    let mut known: BTreeSet<String> = BTreeSet::new();
    loop {
        if let Ok(list) = api.list(&ListParams::default()).await {
            let names: Vec<String> = list
                .items
                .into_iter()
                .filter_map(|n| n.metadata.name)
                .collect();
            let now: BTreeSet<String> = names.iter().cloned().collect();
            for gone in known.difference(&now) {
                tl.line(gone, "node removed", "its agent stopped");
            }
            match agents.sync(&names).await {
                Ok(started) => {
                    for n in started {
                        tl.line(
                            &n,
                            "agent started",
                            "nodekeeper agent (OCI metadata emulator on loopback)",
                        );
                    }
                }
                Err(e) => tl.line("-", "error", &e.to_string()),
            }
            known = now;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
