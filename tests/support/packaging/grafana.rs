//! The chart's Grafana dashboard (written by tools/grafana/dashboard.py): loading it, naming the
//! file on a parse error, and listing its panels' queries and its templating variables. For
//! tests/host/grafana_dashboard.rs and the e2e Prometheus scenario.

use std::path::Path;

use serde_json::Value;

/// The committed dashboard, relative to the repository.
pub const DASHBOARD: &str = "packaging/helm/nodekeeper/dashboards/nodekeeper.json";

/// The dashboard at `path`, parsed; the error names the file.
pub fn load_dashboard(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_dashboard(&path.display().to_string(), &text)
}

/// `text` parsed as a dashboard; the error names `source`.
pub fn parse_dashboard(source: &str, text: &str) -> Result<Value, String> {
    let v: Value = serde_json::from_str(text)
        .map_err(|e| format!("{source}: not a Grafana dashboard's JSON: {e}"))?;
    if !v["panels"].is_array() {
        return Err(format!("{source}: no `panels` array"));
    }
    Ok(v)
}

/// One query of a panel.
#[derive(Debug, Clone)]
pub struct PanelQuery {
    pub panel: String,
    pub ref_id: String,
    pub expr: String,
}

/// Every query of every panel (rows excluded); a panel without a query is an error naming it.
pub fn panel_queries(d: &Value) -> Result<Vec<PanelQuery>, String> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().into_iter().flatten() {
        if p["type"] == "row" {
            continue;
        }
        let panel = p["title"].as_str().unwrap_or("(untitled)").to_string();
        let targets = p["targets"].as_array().cloned().unwrap_or_default();
        if targets.is_empty() {
            return Err(format!("panel {panel:?} has no query"));
        }
        for t in targets {
            let expr = t["expr"].as_str().unwrap_or("").to_string();
            let ref_id = t["refId"].as_str().unwrap_or("").to_string();
            if expr.is_empty() {
                return Err(format!("panel {panel:?}, query {ref_id:?}: no expr"));
            }
            out.push(PanelQuery {
                panel: panel.clone(),
                ref_id,
                expr,
            });
        }
    }
    Ok(out)
}

/// The templating variables: (name, type, query).
pub fn variables(d: &Value) -> Vec<(String, String, String)> {
    d["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| {
            let s = |k: &str| v[k].as_str().unwrap_or("").to_string();
            (s("name"), s("type"), s("query"))
        })
        .collect()
}
