//! The README's plain install, `kubectl apply -k manifests`, on the real control plane, which (like
//! many clusters) has no Prometheus Operator: it succeeds, and the opt-in monitoring component is
//! what needs the operator's CRDs. Server-side dry runs: the API server admits every object as it
//! would create it, and nothing is stored.

use crate::support::*;

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn apply_k_manifests_succeeds_without_the_prometheus_operator() {
    let c = cluster();
    // The cluster has no monitoring.coreos.com API at all.
    let out = kubectl(
        c,
        &[
            "api-resources",
            "--api-group=monitoring.coreos.com",
            "-o",
            "name",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "");

    let manifests = repo().join("manifests");
    let out = kubectl(
        c,
        &[
            "apply",
            "-k",
            manifests.to_str().unwrap(),
            "--dry-run=server",
        ],
    );
    assert!(
        out.status.success(),
        "kubectl apply -k manifests failed without the Prometheus Operator: {}",
        stderr(&out)
    );

    // With the monitoring component the apply needs the operator's CRDs, and says so.
    let dir = c.dir.join("overlay-monitoring");
    crate::packaging_support::write_overlay(&dir, &["components/monitoring"]);
    let out = kubectl(
        c,
        &["apply", "-k", dir.to_str().unwrap(), "--dry-run=server"],
    );
    assert!(
        !out.status.success(),
        "applied the monitoring component without its CRDs"
    );
    let err = stderr(&out);
    for kind in ["ServiceMonitor", "PrometheusRule"] {
        assert!(err.contains(kind), "{kind} not named in: {err}");
    }
    assert!(err.contains("ensure CRDs are installed first"), "{err}");
}
