#!/usr/bin/env python3
"""Lints, validates and renders the chart offline with real Helm v4 (PyPI helm-python-sdk;
scripts/setup-helm.sh installs it into .cache/venv). Used by tests/host/helm_chart.rs.

Usage: .cache/venv/bin/python packaging/helm/render.py CHART RELEASE NAMESPACE [VALUES.yaml]
Prints one JSON object: {"lint": {...}, "schema_error": null | "...", "render_error": null | "...",
"manifests": {path: yaml}, "values": the values after merging with the chart defaults}.
"""
import json
import sys

import helm_python as helm


def main():
    chart_dir, release, namespace = sys.argv[1:4]
    values = {}
    if len(sys.argv) > 4:
        with open(sys.argv[4]) as f:
            values = helm.values_from_yaml(f.read())
    out = {"lint": helm.lint(chart_dir, values, strict=True, namespace=namespace),
           "schema_error": None, "render_error": None, "manifests": {}, "values": None}
    chart = helm.Chart.load(chart_dir)
    merged = chart.merge_values(values)
    out["values"] = merged
    try:
        chart.validate_schema(merged)
    except helm.HelmError as e:
        out["schema_error"] = str(e)
    if out["schema_error"] is None:
        try:
            out["manifests"] = chart.render(values, name=release, namespace=namespace)
        except helm.HelmError as e:
            out["render_error"] = str(e)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
