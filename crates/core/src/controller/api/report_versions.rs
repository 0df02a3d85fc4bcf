//! Version skew of the report API: which report versions the controller took, the warning about
//! an older one, and the refusals of versions it does not read (`POST /v1/reports`).
//!
//! The controller reads every version of [`ACCEPTED_REPORT_VERSIONS`] (the current and the
//! previous one): an agent not yet upgraded keeps reporting while the controller is upgraded
//! first. A report of an older version is counted (`nodekeeper_reports_by_version_total`), logged
//! once per node at `warn`, and answered with an HTTP `Warning: 299` header; an unknown version is
//! refused with 400 naming the accepted ones (`nodekeeper_reports_unsupported_version_total`).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::MetricType;

use crate::controller::metrics;
use crate::sync::lock;
use crate::wire::{accepted_report_versions, ACCEPTED_REPORT_VERSIONS, REPORT_VERSION};

/// Most nodes remembered as already warned about (then the set starts over: one more warning
/// per node, never unbounded memory).
const MAX_WARNED: usize = 100_000;

/// The report API's version counters.
#[derive(Debug, Default)]
pub struct ReportVersions {
    /// Reports taken, per accepted version (in the order of [`ACCEPTED_REPORT_VERSIONS`]).
    by_version: [AtomicU64; ACCEPTED_REPORT_VERSIONS.len()],
    /// Reports refused (400) for a version this controller does not read.
    unsupported: AtomicU64,
    /// Nodes whose older report version was logged already.
    warned: Mutex<HashSet<String>>,
}

impl ReportVersions {
    /// Counts a report of `version` (an accepted one) from `node`. For an older version, returns
    /// the warning text for the answer's `Warning` header, and logs it the first time for `node`.
    pub fn taken(&self, node: &str, version: u32, agent_version: &str) -> Option<String> {
        if let Some(i) = ACCEPTED_REPORT_VERSIONS.iter().position(|v| *v == version) {
            self.by_version[i].fetch_add(1, Ordering::Relaxed);
        }
        if version >= REPORT_VERSION {
            return None;
        }
        let warning = format!(
            "report version {version} is deprecated: this controller writes version \
             {REPORT_VERSION} and accepts versions {}; upgrade the agent",
            accepted_report_versions()
        );
        let first = {
            let mut warned = lock(&self.warned);
            if warned.len() >= MAX_WARNED {
                warned.clear();
            }
            warned.insert(node.to_string())
        };
        if first {
            tracing::warn!(%node, version, %agent_version, current = REPORT_VERSION,
                "an agent reports in an older report version (still accepted); upgrade it: \
                 the next controller release may no longer accept it");
        }
        Some(warning)
    }

    /// Counts a report refused for its version.
    pub fn refused(&self) {
        self.unsupported.fetch_add(1, Ordering::Relaxed);
    }

    /// Reports taken of `version` so far.
    pub fn count(&self, version: u32) -> u64 {
        ACCEPTED_REPORT_VERSIONS
            .iter()
            .position(|v| *v == version)
            .map_or(0, |i| self.by_version[i].load(Ordering::Relaxed))
    }

    /// Encodes `nodekeeper_reports_by_version_total{version}` (every accepted version, from 0)
    /// and `nodekeeper_reports_unsupported_version_total`.
    pub fn encode(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let labels: Vec<String> = ACCEPTED_REPORT_VERSIONS
            .iter()
            .map(u32::to_string)
            .collect();
        metrics::encode_family(
            enc,
            metrics::counter_name("nodekeeper_reports_by_version_total"),
            "Reports taken, by report version; a version below the current one is deprecated (still accepted, logged once per node).",
            MetricType::Counter,
            labels.iter().zip(&self.by_version).map(|(v, n)| {
                (
                    [("version", v.as_str())],
                    ConstCounter::new(n.load(Ordering::Relaxed)),
                )
            }),
        )?;
        metrics::encode_counter(
            enc,
            "nodekeeper_reports_unsupported_version_total",
            "Reports refused (400) for a report version this controller does not accept.",
            self.unsupported.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn older_versions_are_counted_and_warned_about_current_ones_only_counted() {
        let v = ReportVersions::default();
        assert_eq!(v.taken("n1", REPORT_VERSION, "0.2.0"), None);
        let w = v.taken("n1", 1, "0.1.0").unwrap();
        assert!(w.contains("report version 1 is deprecated"), "{w}");
        assert!(w.contains("accepts versions 1, 2"), "{w}");
        assert!(
            v.taken("n1", 1, "0.1.0").is_some(),
            "the header goes with every answer"
        );
        v.refused();
        assert_eq!((v.count(1), v.count(2), v.count(3)), (2, 1, 0));
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(Collect(std::sync::Arc::new(v))));
        let text = metrics::encode(&registry);
        assert!(
            text.contains("nodekeeper_reports_by_version_total{version=\"1\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("nodekeeper_reports_by_version_total{version=\"2\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("nodekeeper_reports_unsupported_version_total 1"),
            "{text}"
        );
    }

    #[derive(Debug)]
    struct Collect(std::sync::Arc<ReportVersions>);

    impl prometheus_client::collector::Collector for Collect {
        fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
            self.0.encode(&mut enc)
        }
    }
}
