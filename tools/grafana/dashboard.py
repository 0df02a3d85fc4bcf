#!/usr/bin/env python3
"""Writes the chart's Grafana dashboard, packaging/helm/nodekeeper/dashboards/nodekeeper.json, with
Grafana's foundation SDK (PyPI `grafana-foundation-sdk`; scripts/setup-grafana-sdk.sh installs it
into .cache/venv). The chart ships it as a ConfigMap for Grafana's dashboard sidecar
(`dashboard.enabled`, docs/operations.md#grafana-dashboard).

Every query selects the controller's series by `namespace="$namespace"` (the label the Prometheus
Operator's ServiceMonitor and PodMonitor both set) and uses Grafana's `$__rate_interval`.
tests/host/grafana_dashboard.rs fails when the committed file differs from this script's output;
tests/e2e/prometheus.rs runs every panel's query against a real Prometheus scraping a real
controller and fails on a query that returns nothing.

Usage: .cache/venv/bin/python tools/grafana/dashboard.py [--check | --stdout]
"""
import json
import os
import sys

from grafana_foundation_sdk.builders import common, dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(REPO, "packaging/helm/nodekeeper/dashboards/nodekeeper.json")

DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
SEL = 'namespace="$namespace"'
RATE = "$__rate_interval"


def q(expr, legend):
    return prometheus.Dataquery().expr(expr).legend_format(legend).datasource(DS)


def single(title, description, expr, legend):
    return (stat.Panel().title(title).description(description).datasource(DS).height(4).span(6)
            .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]))
            .with_target(q(expr, legend)))


def series(title, description, unit, targets, span=12):
    p = (timeseries.Panel().title(title).description(description).datasource(DS)
         .unit(unit).height(8).span(span))
    for t in targets:
        p = p.with_target(t)
    return p


def build():
    d = (dashboard.Dashboard("nodekeeper")
         .uid("nodekeeper")
         .tags(["nodekeeper", "kubernetes"])
         .description("nodekeeper's controller: repairs, drains, notices, budgets, agent reports "
                      "and its Kubernetes API writes (docs/operations.md#grafana-dashboard).")
         .editable()
         .time("now-6h", "now")
         .refresh("1m")
         .timezone("browser"))
    d = d.with_variable(dashboard.DatasourceVariable("datasource").label("Data source")
                        .type("prometheus"))
    d = d.with_variable(dashboard.QueryVariable("namespace").label("Namespace")
                        .datasource(DS)
                        .query("label_values(nodekeeper_leader, namespace)")
                        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED))

    d = d.with_row(dashboard.Row("Controller"))
    d = d.with_panel(single(
        "Leader", "1 on the replica that leads (holds the Lease); no replica at 1 for long fires "
        "NodekeeperControllerNoLeader.", f"max by (pod) (nodekeeper_leader{{{SEL}}})", "{{pod}}"))
    d = d.with_panel(single(
        "Nodes held now", "Nodes the engine holds back, all reasons (the NodekeeperHeld condition).",
        f"sum(nodekeeper_engine_nodes_held{{{SEL}}})", "held"))
    d = d.with_panel(single(
        "Drains running", "Drains evicting pods now.",
        f"sum(nodekeeper_engine_drains_running{{{SEL}}})", "drains"))
    d = d.with_panel(single(
        "Unhealthy nodes", "Nodes matching a repair policy now, all groups.",
        f"sum(nodekeeper_engine_unhealthy_nodes{{{SEL}}})", "unhealthy"))

    d = d.with_row(dashboard.Row("Repairs and their steps"))
    d = d.with_panel(series(
        "Repair steps",
        "Actions the engine carried out, by step: cordon, start_drain, request_reboot, "
        "request_replacement, retire_node (successful ones; errors in the next panel).",
        "short",
        [q(f'sum by (kind) (increase(nodekeeper_engine_actions_total{{{SEL}, result="ok", '
           f'kind=~"cordon|start_drain|request_reboot|request_replacement|retire_node"}}[{RATE}]))',
           "{{kind}}")]))
    d = d.with_panel(series(
        "Actions by result",
        "Every action (annotations, taints, Events too) by result: ok, error, dry_run.",
        "short",
        [q(f"sum by (result) (increase(nodekeeper_engine_actions_total{{{SEL}}}[{RATE}]))",
           "{{result}}")]))
    d = d.with_panel(series(
        "Unhealthy nodes and short-circuit, by group",
        "Nodes matching a repair policy per group, and 1 while a group's repairs are "
        "short-circuited (more than repair.max_unhealthy unhealthy).",
        "short",
        [q(f"sum by (group) (nodekeeper_engine_unhealthy_nodes{{{SEL}}})", "unhealthy {{group}}"),
         q(f"max by (group) (nodekeeper_engine_repair_short_circuited{{{SEL}}})",
           "short-circuited {{group}}")]))
    d = d.with_panel(series(
        "Replacements requested",
        "Replacement requests the provider accepted.",
        "short",
        [q(f"sum(increase(nodekeeper_engine_replacements_total{{{SEL}}}[{RATE}]))",
           "replacements")]))

    d = d.with_row(dashboard.Row("Drains and their blockers"))
    d = d.with_panel(series(
        "Nodes held, by reason",
        "Nodes held back by reason (BlockedByBudget, BlockedByPDB, BlockedByDoNotDisrupt, ...): "
        "`nodekeeper status` names each node's blocker.",
        "short",
        [q(f"sum by (reason) (nodekeeper_engine_nodes_held{{{SEL}}})", "{{reason}}")]))
    d = d.with_panel(series(
        "Drain duration (p50, p90), by result",
        "Wall time of finished drains, by result (completed, failed, cancelled, error).",
        "s",
        [q("histogram_quantile(0.5, sum by (le, result) (rate("
           f"nodekeeper_engine_drain_duration_seconds_bucket{{{SEL}}}[{RATE}])))", "p50 {{result}}"),
         q("histogram_quantile(0.9, sum by (le, result) (rate("
           f"nodekeeper_engine_drain_duration_seconds_bucket{{{SEL}}}[{RATE}])))", "p90 {{result}}")]))
    d = d.with_panel(series(
        "Drains running and evictions blocked by a PDB",
        "Drains evicting now, and evictions a PodDisruptionBudget started refusing.",
        "short",
        [q(f"sum(nodekeeper_engine_drains_running{{{SEL}}})", "drains running"),
         q(f"sum(increase(nodekeeper_engine_evictions_blocked_by_pdb_total{{{SEL}}}[{RATE}]))",
           "evictions blocked by a PDB")]))

    d = d.with_row(dashboard.Row("Notices → cordon"))
    d = d.with_panel(series(
        "Notice → cordon latency (p50, p99)",
        "Time from the engine taking a notice (an agent's report, an OCI Events delivery) to its "
        "node's taint + cordon patch answered, on the fast path.",
        "s",
        [q("histogram_quantile(0.5, sum by (le) (rate("
           f"nodekeeper_engine_notice_to_cordon_seconds_bucket{{{SEL}}}[{RATE}])))", "p50"),
         q("histogram_quantile(0.99, sum by (le) (rate("
           f"nodekeeper_engine_notice_to_cordon_seconds_bucket{{{SEL}}}[{RATE}])))", "p99")]))
    d = d.with_panel(series(
        "Notices acted on",
        "Notices acted on at once for their node (the fast path), and the engine's wakes by cause.",
        "short",
        [q(f"sum(increase(nodekeeper_engine_fast_paths_total{{{SEL}}}[{RATE}]))", "fast paths"),
         q(f"sum by (cause) (increase(nodekeeper_engine_wakes_total{{{SEL}}}[{RATE}]))",
           "wakes: {{cause}}")]))

    d = d.with_row(dashboard.Row("Budgets"))
    d = d.with_panel(series(
        "Repair budget used and allowed, by group",
        "Nodes counted against each group's repair budget, and the budget's limit now "
        "(-1: no budget active).",
        "short",
        [q(f"sum by (group) (nodekeeper_engine_budget_used{{{SEL}}})", "used {{group}}"),
         q(f"max by (group) (nodekeeper_engine_budget_allowed{{{SEL}}})", "allowed {{group}}")]))
    d = d.with_panel(series(
        "Nodes per group",
        "Nodes per budgets.group_by value (\"\" without it).",
        "short",
        [q(f"sum by (group) (nodekeeper_engine_group_nodes{{{SEL}}})", "{{group}}")]))

    d = d.with_row(dashboard.Row("Agent reports and silence"))
    d = d.with_panel(series(
        "Reports accepted, by version",
        "Agent reports taken per second, by the report version the agent wrote (an older one is "
        "deprecated: docs/install.md#version-skew).",
        "reqps",
        [q(f"sum by (version) (rate(nodekeeper_reports_by_version_total{{{SEL}}}[{RATE}]))",
           "version {{version}}")]))
    d = d.with_panel(series(
        "Reports refused",
        "Reports refused per second: another node than the token's, no valid token, an "
        "unsupported version, shed at max_reports_in_flight.",
        "reqps",
        [q(f"sum(rate(nodekeeper_reports_forbidden_total{{{SEL}}}[{RATE}]))", "forbidden"),
         q(f"sum(rate(nodekeeper_reports_unauthenticated_total{{{SEL}}}[{RATE}]))",
           "unauthenticated"),
         q(f"sum(rate(nodekeeper_reports_unsupported_version_total{{{SEL}}}[{RATE}]))",
           "unsupported version"),
         q(f"sum(rate(nodekeeper_reports_shed_total{{{SEL}}}[{RATE}]))", "shed")]))
    d = d.with_panel(series(
        "Agents gone silent",
        "Nodes marked stale (condition reason AgentNotReporting) because their agent stopped "
        "reporting; NodekeeperAgentSilent fires on any.",
        "short",
        [q(f"sum(increase(nodekeeper_nodes_marked_stale_total{{{SEL}}}[{RATE}]))",
           "marked stale")]))
    d = d.with_panel(series(
        "Report API connections",
        "Connections of the report API open now, and the limit (max_connections).",
        "short",
        [q(f"sum by (pod) (nodekeeper_connections_open{{{SEL}}})", "open {{pod}}"),
         q(f"max(nodekeeper_connections_max{{{SEL}}})", "limit")]))

    d = d.with_row(dashboard.Row("API requests"))
    d = d.with_panel(series(
        "Kubernetes API requests",
        "The controller's requests to the API server per second: Node status writes, Events "
        "about Nodes, TokenReviews of agent tokens.",
        "reqps",
        [q(f"sum(rate(nodekeeper_node_writes_total{{{SEL}}}[{RATE}]))", "Node writes"),
         q(f"sum(rate(nodekeeper_node_events_total{{{SEL}}}[{RATE}]))", "Events"),
         q(f"sum(rate(nodekeeper_token_reviews_total{{{SEL}}}[{RATE}]))", "TokenReviews")]))
    d = d.with_panel(series(
        "Kubernetes API write failures and conflicts",
        "Failed Node writes, and taint patches refused with 409 (re-read and retried).",
        "reqps",
        [q(f"sum(rate(nodekeeper_node_write_failures_total{{{SEL}}}[{RATE}]))", "failed writes"),
         q(f"sum(rate(nodekeeper_engine_node_write_conflicts_total{{{SEL}}}[{RATE}]))",
           "409 conflicts")]))
    built = d.build()
    # Stable panel ids and query refIds (Grafana keys panels and queries by them).
    for i, panel in enumerate(built.panels, start=1):
        panel.id_val = i
        for j, target in enumerate(getattr(panel, "targets", None) or []):
            target.ref_id = chr(ord("A") + j)
    return built


def render():
    return json.dumps(build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main():
    text = render()
    if "--stdout" in sys.argv[1:]:
        sys.stdout.write(text)
    elif "--check" in sys.argv[1:]:
        with open(OUT) as f:
            if f.read() != text:
                sys.exit(f"{os.path.relpath(OUT, REPO)} differs from tools/grafana/dashboard.py's "
                         "output: run .cache/venv/bin/python tools/grafana/dashboard.py")
    else:
        os.makedirs(os.path.dirname(OUT), exist_ok=True)
        with open(OUT, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
