//! A supervised controller on the real control plane: the leader's engine panics mid-drain (a fault
//! injected through its clock, the engine's one test seam), the replica says which task died, marks
//! `/livez` failed, gives up its Lease and stops its drain; the standby (the real binary) takes the
//! Lease within the lease duration + 1 s, finishes the drain, and the replacement is asked for once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use nodekeeper_core::controller::clock::{Clock, SystemClock};
use nodekeeper_core::controller::engine::EngineOptions;
use nodekeeper_core::controller::policy::view::keys;

use crate::drain::workload_pods;
use crate::failover::preemption;
use crate::support::*;

const NODE: &str = "sv-0";
const SPARE: &str = "sv-spare";
const NS_APP: &str = "supervised";
const LEASE: &str = "nodekeeper-supervised";
/// `[controller.leader] lease_duration` of `support::controller_toml`.
const LEASE_DURATION: Duration = Duration::from_secs(3);

/// Wall time until armed; then every reading panics (as a bug in the engine would).
struct FaultClock(Arc<AtomicBool>);

impl Clock for FaultClock {
    fn now(&self) -> chrono::DateTime<chrono::Utc> {
        if self.0.load(Ordering::Relaxed) {
            panic!("injected fault: the engine's clock");
        }
        SystemClock.now()
    }
}

on_both!(a_panicking_engine_gives_up_the_lease_and_the_standby_finishes_the_drain);
async fn a_panicking_engine_gives_up_the_lease_and_the_standby_finishes_the_drain(
    c: &'static Cluster,
) {
    init_tracing();
    let _one_engine = c.exclusive().await;
    let admin = c.admin().await;
    let ha = crate::failover::HaSetup::start(c, &admin, "sv", NS_APP, LEASE).await;
    let nodes: Api<Node> = Api::all(admin.clone());
    let dir = &ha.dir;
    let config = |id: &str| ha.config(id);

    let (cfg_a, cfg_b) = (config("sv-a"), config("sv-b"));
    // Replica A in-process (the library the binary runs), as the controller ServiceAccount.
    let loaded = nodekeeper_core::config_file::Config::load(
        &cfg_a,
        &nodekeeper_core::config::Env::default(),
    )
    .unwrap();
    let ccfg = loaded.config.controller.controller.clone().unwrap();
    let token = sa_token(&admin, NS, CONTROLLER_SA, None, None).await;
    let kc_path = dir.path().join("sv-a.kubeconfig");
    c.write_token_kubeconfig(&kc_path, &token);
    let kcfg = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(&kc_path).unwrap(),
        &KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let fault = Arc::new(AtomicBool::new(false));
    let mut opts = EngineOptions::new(loaded.config.policy());
    opts.clock = Arc::new(FaultClock(fault.clone()));
    opts.drain_client =
        Some(nodekeeper_core::controller::act::drain::client(kcfg.clone()).unwrap());
    let mut a = nodekeeper_core::controller::start_with(
        kube::Client::try_from(kcfg).unwrap(),
        &ccfg,
        Some(opts),
    )
    .await
    .unwrap();
    wait_leading(&admin, LEASE, "sv-a").await;
    // Replica B: the real binary, standing by.
    let b = ControllerProc::start(c, &cfg_b, "sv-b").await;

    let token = agent_report_token(&admin, NODE).await;
    let https = crate::ctl::https(&dir.path().join("ca.pem"), a.addr);
    let mut report = crate::ctl::report(NODE, 1, &[]);
    report.events = vec![preemption(chrono::Utc::now())];
    report_until(&https, a.addr, &token, &report, |_| true).await;
    wait_for(
        Duration::from_secs(60),
        "A's drain held by the PDB after one eviction",
        || async {
            let n = nodes.get(NODE).await.ok()?;
            let b = annotation(&n, keys::BLOCKED)?.to_string();
            (b.contains("supervised/web") && workload_pods(&admin, NODE).await.0 == 5).then_some(())
        },
    )
    .await;

    // The fault: A's engine panics at its next reconcile.
    fault.store(true, Ordering::Relaxed);
    let died = tokio::time::timeout(Duration::from_secs(10), a.failed())
        .await
        .expect("the supervisor saw the engine die");
    let t_died = Instant::now();
    assert_eq!(died.task, "engine", "{died}");
    assert!(died.how.contains("injected fault"), "{died}");
    let (code, body) = crate::ctl::get(&https, a.addr, "/livez").await.unwrap();
    assert_eq!(code, 503, "/livez fails once a task died: {body}");
    assert!(body.contains("engine"), "{body}");
    // What `nodekeeper controller` does next: stop everything, release the Lease (then exit 1).
    a.stop().await;

    wait_leading(&admin, LEASE, "sv-b").await;
    let took = t_died.elapsed();
    eprintln!("the standby led {took:?} after the engine died");
    assert!(
        took <= LEASE_DURATION + Duration::from_secs(1),
        "the standby led {took:?} after the engine died"
    );
    nodes.uncordon(SPARE).await.unwrap();
    wait_until(
        Duration::from_secs(90),
        "the drain finished by sv-b",
        || async { workload_pods(&admin, NODE).await.0 == 0 },
    )
    .await;
    assert_eq!(
        workload_pods(&admin, SPARE).await.0,
        6,
        "the workload moved"
    );
    ha.one_replacement_by(&b, NODE).await;
    b.stop().await;
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
        .delete(NS_APP, &Default::default())
        .await;
}
