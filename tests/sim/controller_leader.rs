//! Leader election against the sim over HTTP: a follower watches the Lease instead of reading it
//! every `retry_period`, and still takes over at once when the leader releases the Lease and just
//! after an unrenewed Lease expires. (Failover of whole controllers, on both backends:
//! `tests/e2e` `failover`, `supervised`.)

use crate::support::drain::{cluster, counting_client};

use std::time::Duration;

use nodekeeper_core::controller::cluster::leader::{Elector, Timing};
use nodekeeper_core::controller::config::LeaderConfig;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const LEASE: Duration = Duration::from_secs(2);
const RETRY: Duration = Duration::from_millis(200);

/// The shipped timing scaled down: lease 2 s, retry 200 ms, and the default renewal interval
/// these give (lease − 4 × retry = 1.2 s).
fn timing() -> Timing {
    Timing::from(&LeaderConfig {
        lease_duration: LEASE,
        retry_period: RETRY,
        ..LeaderConfig::default()
    })
}

struct Replica {
    leader: watch::Receiver<bool>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

fn start(c: &crate::support::drain::Cluster, identity: &str) -> Replica {
    let (client, log) = counting_client(c);
    let e = Elector::new(client, "default", "nk", identity, timing());
    let (tx, leader) = watch::channel(false);
    let cancel = CancellationToken::new();
    let task = tokio::spawn(e.run(tx, cancel.clone()));
    Replica {
        leader,
        cancel,
        task,
        log,
    }
}

/// A leader `a`, then a follower `b` started once `a` leads.
async fn leader_and_follower(c: &crate::support::drain::Cluster) -> (Replica, Replica) {
    let mut a = start(c, "a");
    until_leading(&mut a, Duration::from_secs(2)).await;
    (a, start(c, "b"))
}

async fn until_leading(r: &mut Replica, within: Duration) -> Duration {
    let t0 = Instant::now();
    tokio::time::timeout(within, r.leader.wait_for(|l| *l))
        .await
        .expect("leading in time")
        .unwrap();
    t0.elapsed()
}

/// The follower's requests over three renewals of a live leader (3.6 s): a read and one watch
/// (18 reads when it polled every 200 ms); the leader's release reaches it through the watch, so
/// it leads well before the Lease would have expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_watches_the_lease_and_takes_it_when_released() {
    let c = cluster().await;
    let (a, mut b) = leader_and_follower(&c).await;
    // The leader's renewals (replaces of the Lease), 1.2 s apart, while the follower runs.
    let renewals = || {
        a.log
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.starts_with("PUT "))
            .count()
    };
    let before = renewals();
    crate::support::wait::until(
        Duration::from_secs(10),
        "three renewals by the leader",
        || std::future::ready(renewals() >= before + 3),
    )
    .await;
    assert!(!*b.leader.borrow());
    let requests = b.log.lock().unwrap().clone();
    let reads = requests
        .iter()
        .filter(|r| !r.contains("watch=true"))
        .count();
    let watches = requests.iter().filter(|r| r.contains("watch=true")).count();
    assert!((reads, watches) == (1, 1), "{requests:#?}");
    a.cancel.cancel();
    a.task.await.unwrap();
    let took = until_leading(&mut b, LEASE).await;
    assert!(took < LEASE / 2, "took {took:?} after the release");
    b.cancel.cancel();
    b.task.await.unwrap();
}

/// A leader that stops renewing without releasing (its task gone): the follower, seeing no
/// renewal, reads the Lease just after it expires and takes it over, not a whole lease later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_takes_an_unrenewed_lease_just_after_it_expires() {
    let c = cluster().await;
    let (a, mut b) = leader_and_follower(&c).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    a.task.abort();
    let took = until_leading(&mut b, LEASE * 2).await;
    // The last renewal was at most the renew interval before the abort; expiry is LEASE after it.
    let renew = timing().renew;
    assert_eq!(renew, Duration::from_millis(1200));
    assert!(
        took >= LEASE - renew - Duration::from_millis(50) && took < LEASE + Duration::from_secs(1),
        "took {took:?} after the leader stopped"
    );
    b.cancel.cancel();
    b.task.await.unwrap();
}
