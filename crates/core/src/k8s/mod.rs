//! Kubernetes helpers shared by the agent, the controller, the commands and the sim.

pub mod client;
pub mod selectors;
pub mod validation;

use rand::Rng;

/// Server-side timeout, in seconds, of nodekeeper's long-lived watches (the agent's Node and pod
/// watches, the controller's reflectors, a follower's Lease watch): drawn per watch from one to
/// one and a half hours. kube-apiserver keeps a watch open as long as its client asks
/// (`GetTimeoutForWatch`; 30–60 min when it names none), and its bookmarks (about one a minute)
/// keep an idle connection alive meanwhile; kube-rs's default of 290 s would re-open each watch 12
/// times an hour, on every node. Drawn, so that watches opened together (a fleet's agents after a
/// roll-out) do not all re-open together.
pub fn watch_timeout_secs() -> u32 {
    3600 + rand::rng().random_range(0..1800)
}

#[cfg(test)]
mod tests {
    #[test]
    fn watch_timeouts_are_one_to_one_and_a_half_hours_and_spread() {
        let drawn: std::collections::HashSet<u32> =
            (0..200).map(|_| super::watch_timeout_secs()).collect();
        assert!(drawn.iter().all(|t| (3600..5400).contains(t)), "{drawn:?}");
        assert!(drawn.len() > 100, "spread: {} distinct of 200", drawn.len());
    }
}
