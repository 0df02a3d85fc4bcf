//! The shipped alerts and dashboard against a real Prometheus (Debian's 2.42, the server beside
//! promtool; scripts/setup.sh installs it) scraping a real controller over HTTPS, on both backends
//! (the controller and Prometheus are the same processes on each; only the API server differs).
//!
//! The chart is rendered with the ServiceMonitor, the PrometheusRule and the dashboard on. The
//! scrape config is derived from the rendered ServiceMonitor's endpoint as the Prometheus Operator
//! generates it (`generateServiceMonitorConfig` and `addTLStoYaml` in its pkg/prometheus/promcfg.go:
//! job `serviceMonitor/NS/NAME/I`, `honor_labels`, `scrape_interval` from `interval`, `metrics_path`
//! from `path`, `scheme`, `tls_config` with `insecure_skip_verify`, `ca_file` — the CA ConfigMap's
//! key mounted as a file — and `server_name`; the relabelled target labels `namespace`, `service`,
//! `pod`, `container`, `job` = the Service's name and `endpoint` = the port's name). The operator
//! finds the target through the Endpoints of the Services the monitor selects; here the one target is
//! the controller on loopback, reached with the same TLS settings. An endpoint field the derivation
//! does not know fails the test, as does a selector that picks not exactly one Service.
//!
//! The controller does real work meanwhile (a repair whose drain completes, a node held by the
//! budget, a preemption notice cordoned on the fast path, agent reports). Then every alert's
//! expression is evaluated through Prometheus's query API (it must parse and evaluate, and every
//! `nodekeeper_*` metric it names must be among the scraped series), and every dashboard panel's
//! query, its variables resolved as Grafana resolves them, must return data.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use serde_json::{json, Value};

use crate::packaging_support::grafana::{load_dashboard, panel_queries, variables, DASHBOARD};
use crate::packaging_support::helm::{assert_lint_clean, helm};
use crate::repair::{one_repairing_one_held, ready_false_repair, seen_ready};
use crate::support::*;

const POOL: &str = "pm-pool";
const NODES: [&str; 4] = ["pm-0", "pm-1", "pm-2", "pm-3"];
/// A node of its own pool that gets a preemption notice.
const NOTICED: &str = "pm-n";
/// The scrape interval the test renders the chart with (`serviceMonitor.interval`).
const INTERVAL: &str = "1s";
/// Grafana's `$__rate_interval`: max($__interval + scrape interval, 4 × scrape interval), where
/// `$__interval` is the dashboard's time range over the panel's data points (≈ 20 s for the default
/// 6 h); 1 m here, which covers the whole scenario since Prometheus started.
const RATE_INTERVAL: &str = "1m";

on_both!(prometheus_scrapes_the_controller_and_every_alert_and_panel_query_has_its_series);
async fn prometheus_scrapes_the_controller_and_every_alert_and_panel_query_has_its_series(
    c: &'static Cluster,
) {
    init_tracing();
    let _one_engine = c.exclusive().await;
    let admin = c.admin().await;
    let chart = render_chart();

    let mut nodes: Vec<Node> = NODES
        .iter()
        .map(|n| {
            kwok_node(
                n,
                json!({ "karpenter.sh/nodepool": POOL, "kubernetes.io/hostname": n }),
            )
        })
        .collect();
    nodes.push(kwok_node(
        NOTICED,
        json!({ "karpenter.sh/nodepool": "pm-notice", "kubernetes.io/hostname": NOTICED }),
    ));
    let _nodes = c.create_nodes(&nodes).await;
    let dir = tempfile::tempdir().unwrap();
    let config = controller_toml(dir.path(), "prom", ready_false_repair);
    let ctl = ControllerProc::start(c, &config, "prom").await;
    let prom = Prometheus::start(dir.path(), &chart, ctl.addr).await;

    // A repair (its drain completes) and a node held by the budget.
    let api: Api<Node> = Api::all(admin.clone());
    seen_ready(&api, &NODES[..2]).await;
    c.kubelet_reports_not_ready(NODES[0]).await;
    c.kubelet_reports_not_ready(NODES[1]).await;
    one_repairing_one_held(&api, NODES[0], NODES[1]).await;
    // An agent's reports, the last with a preemption notice: cordoned on the fast path.
    let token = agent_report_token(&admin, NOTICED).await;
    let https = crate::ctl::https(&dir.path().join("ca.pem"), ctl.addr);
    let mut report = crate::ctl::report(NOTICED, 1, &[]);
    wait_leading(&admin, "nodekeeper-prom", "prom").await;
    report_until(&https, ctl.addr, &token, &report, |_| true).await;
    let now = chrono::Utc::now();
    report.sequence = 100;
    report.events = vec![crate::failover::preemption(now)];
    report_until(&https, ctl.addr, &token, &report, |r| {
        r["acknowledged_events"]
            .to_string()
            .contains("ha-preempt-1")
    })
    .await;

    // Prometheus has the scenario's series: the drain's end, the notice's cordon, the hold.
    for (what, query) in [
        (
            "a finished drain",
            "sum(nodekeeper_engine_drain_duration_seconds_count) > 0",
        ),
        (
            "a notice cordoned",
            "sum(nodekeeper_engine_notice_to_cordon_seconds_count) > 0",
        ),
        (
            "a node held by the budget",
            r#"nodekeeper_engine_nodes_held{reason="BlockedByBudget"} > 0"#,
        ),
        ("reports", "sum(nodekeeper_reports_by_version_total) > 0"),
    ] {
        wait_until(
            Duration::from_secs(60),
            &format!("Prometheus to see {what} ({query})"),
            || prom.has_data(query),
        )
        .await;
    }
    // Three scrapes more: a rate over $__rate_interval needs 2 samples, and a series that
    // appeared at the last scrape has 1.
    let last = prom
        .query("max(timestamp(nodekeeper_leader))")
        .await
        .unwrap();
    let t0 = last[0]["value"][1].as_str().unwrap().to_string();
    let later = format!("max(timestamp(nodekeeper_leader)) > {t0} + 2.5");
    wait_until(Duration::from_secs(30), "3 scrapes more", || {
        prom.has_data(&later)
    })
    .await;
    let names: BTreeSet<String> = prom
        .label_values("__name__", None)
        .await
        .into_iter()
        .collect();

    // Every alert: parses, evaluates, and names only scraped metrics.
    let mut alerts = 0;
    for (source, rule) in alert_rules(&chart) {
        let alert = rule["alert"].as_str().unwrap();
        let expr = rule["expr"].as_str().unwrap();
        prom.query(expr)
            .await
            .unwrap_or_else(|e| panic!("{source}: alert {alert}: {expr}: {e}"));
        let metrics = metric_names(expr);
        assert!(
            !metrics.is_empty(),
            "{source}: alert {alert} names no nodekeeper metric: {expr}"
        );
        for m in metrics {
            assert!(
                names.contains(&m),
                "{source}: alert {alert} selects {m}, which the controller does not expose \
                 (scraped: {names:?})"
            );
        }
        alerts += 1;
    }
    assert!(
        alerts >= 5,
        "the rendered PrometheusRule has {alerts} alerts"
    );

    // Every panel's query, its variables resolved, returns data.
    let dashboard = load_dashboard(&repo().join(DASHBOARD)).unwrap_or_else(|e| panic!("{e}"));
    let mut vars = vec![("__rate_interval".to_string(), RATE_INTERVAL.to_string())];
    for (name, kind, query) in variables(&dashboard) {
        match kind.as_str() {
            // The panels' datasource, not part of a query.
            "datasource" => {}
            "query" => {
                let value = prom.resolve_variable(&query).await;
                let value = value.unwrap_or_else(|| {
                    panic!("{DASHBOARD}: variable ${name} ({query}) resolves to nothing")
                });
                vars.push((name, value));
            }
            other => {
                panic!("{DASHBOARD}: variable ${name} of type {other}: not resolved by this test")
            }
        }
    }
    let queries = panel_queries(&dashboard).unwrap_or_else(|e| panic!("{DASHBOARD}: {e}"));
    assert!(
        queries.len() >= 20,
        "{DASHBOARD}: {} queries",
        queries.len()
    );
    for q in &queries {
        let expr = substitute(&q.expr, &vars);
        assert!(
            !expr.contains('$'),
            "{DASHBOARD}: panel {:?} {}: unresolved variable in {expr}",
            q.panel,
            q.ref_id
        );
        let result = prom.query(&expr).await.unwrap_or_else(|e| {
            panic!("{DASHBOARD}: panel {:?} {}: {expr}: {e}", q.panel, q.ref_id)
        });
        if result.as_array().is_none_or(|r| r.is_empty()) {
            let mut seen = String::new();
            for m in metric_names(&expr) {
                let series = prom.query(&m).await.unwrap_or_default();
                seen.push_str(&format!("\n{m}: {series}"));
            }
            panic!(
                "{DASHBOARD}: panel {:?} query {} returns no data: {expr}\nthe series it selects                  from:{seen}",
                q.panel, q.ref_id
            );
        }
    }
    eprintln!(
        "{alerts} alerts and {} panel queries evaluated",
        queries.len()
    );

    prom.stop().await;
    assert_eq!(
        ctl.forbidden_lines(),
        Vec::<String>::new(),
        "the controller hit a 403"
    );
    ctl.stop().await;
}

/// The chart rendered with the monitoring objects and the dashboard on, a 1 s scrape interval.
fn render_chart() -> Vec<(String, Value)> {
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("values.yaml");
    std::fs::write(
        &values,
        format!(
            "serviceMonitor: {{enabled: true, interval: {INTERVAL}}}\n\
             prometheusRule: {{enabled: true}}\ndashboard: {{enabled: true}}\n"
        ),
    )
    .unwrap();
    let r = helm(NS, Some(&values));
    assert_lint_clean(&r, "serviceMonitor, prometheusRule and dashboard on");
    r.docs
}

fn of_kind<'a>(docs: &'a [(String, Value)], kind: &str) -> Vec<&'a (String, Value)> {
    docs.iter().filter(|(_, v)| v["kind"] == kind).collect()
}

/// Every alert rule of the rendered PrometheusRule, with the template it came from.
fn alert_rules(docs: &[(String, Value)]) -> Vec<(String, Value)> {
    of_kind(docs, "PrometheusRule")
        .into_iter()
        .flat_map(|(source, v)| {
            v["spec"]["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
                .filter(|r| r["alert"].is_string())
                .map(move |r| (format!("packaging/helm/{source}"), r))
        })
        .collect()
}

/// The `nodekeeper_*` metric names an expression selects.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let re = regex::Regex::new(r"\bnodekeeper_[a-z0-9_]+").unwrap();
    re.find_iter(expr).map(|m| m.as_str().to_string()).collect()
}

/// `$name` and `${name}` of each variable replaced by its value, the longest names first.
fn substitute(expr: &str, vars: &[(String, String)]) -> String {
    let mut vars = vars.to_vec();
    vars.sort_by_key(|(n, _)| std::cmp::Reverse(n.len()));
    let mut out = expr.to_string();
    for (name, value) in vars {
        out = out
            .replace(&format!("${{{name}}}"), &value)
            .replace(&format!("${name}"), &value);
    }
    out
}

/// Whether `labels` (a Service's) match a `LabelSelector` (matchLabels and matchExpressions).
fn selects(selector: &Value, labels: &Value) -> bool {
    let label = |k: &str| labels[k].as_str();
    let by_labels = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| label(k) == v.as_str());
    let by_expressions = selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|e| {
            let key = e["key"].as_str().unwrap();
            let values: Vec<&str> = e["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            match e["operator"].as_str().unwrap() {
                "In" => label(key).is_some_and(|v| values.contains(&v)),
                "NotIn" => !label(key).is_some_and(|v| values.contains(&v)),
                "Exists" => label(key).is_some(),
                "DoesNotExist" => label(key).is_none(),
                op => panic!("matchExpressions operator {op}"),
            }
        });
    by_labels && by_expressions
}

/// The scrape config the Prometheus Operator generates for the rendered ServiceMonitor's endpoints
/// (see the module's comment), with the controller at `target` as the one target; the CA ConfigMap's
/// key is written into `dir` under the operator's asset name, as it mounts it.
fn scrape_configs(
    docs: &[(String, Value)],
    dir: &Path,
    target: std::net::SocketAddr,
) -> Vec<Value> {
    let monitors = of_kind(docs, "ServiceMonitor");
    assert_eq!(monitors.len(), 1, "one ServiceMonitor rendered");
    let (source, sm) = monitors[0];
    let ns = sm["metadata"]["namespace"].as_str().unwrap();
    let name = sm["metadata"]["name"].as_str().unwrap();
    let spec = &sm["spec"];
    let namespaces: Vec<&str> = spec["namespaceSelector"]["matchNames"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_else(|| vec![ns]);
    let services: Vec<&Value> = of_kind(docs, "Service")
        .into_iter()
        .map(|(_, s)| s)
        .filter(|s| namespaces.contains(&s["metadata"]["namespace"].as_str().unwrap_or("")))
        .filter(|s| selects(&spec["selector"], &s["metadata"]["labels"]))
        .collect();
    let names: Vec<&str> = services
        .iter()
        .map(|s| s["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names.len(),
        1,
        "{source}: the ServiceMonitor's selector picks {names:?}: each selected Service's \
         endpoints are scraped, so the controller would be scraped once per Service"
    );
    let service = services[0];
    let deployments = of_kind(docs, "Deployment");
    let containers = deployments
        .iter()
        // The Service's selector (a plain map) against the pods' labels.
        .filter(|(_, d)| {
            let pod = &d["spec"]["template"]["metadata"]["labels"];
            service["spec"]["selector"]
                .as_object()
                .into_iter()
                .flatten()
                .all(|(k, v)| &pod[k] == v)
        })
        .flat_map(|(_, d)| {
            d["spec"]["template"]["spec"]["containers"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect::<Vec<_>>();
    let known = [
        "port",
        "path",
        "scheme",
        "interval",
        "scrapeTimeout",
        "honorLabels",
        "tlsConfig",
    ];
    spec["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, ep)| {
            for k in ep.as_object().unwrap().keys() {
                assert!(
                    known.contains(&k.as_str()),
                    "{source}: endpoint field {k}: this test does not derive it (add it from \
                     the operator's promcfg.go)"
                );
            }
            let port = ep["port"].as_str().expect("endpoint port (by name)");
            let sp = service["spec"]["ports"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == port)
                .unwrap_or_else(|| panic!("{source}: Service {} has no port {port}", names[0]));
            let container = containers
                .iter()
                .find(|c| {
                    c["ports"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|p| p["name"] == sp["targetPort"] || p["containerPort"] == sp["targetPort"])
                })
                .unwrap_or_else(|| panic!("{source}: no container serves {}", sp["targetPort"]));
            let mut cfg = json!({
                "job_name": format!("serviceMonitor/{ns}/{name}/{i}"),
                "honor_labels": ep["honorLabels"].as_bool().unwrap_or(false),
                "static_configs": [{
                    "targets": [target.to_string()],
                    "labels": {
                        "namespace": service["metadata"]["namespace"],
                        "service": names[0],
                        "pod": "nodekeeper-controller-0",
                        "container": container["name"],
                        "job": names[0],
                        "endpoint": port,
                    },
                }],
            });
            for (from, to) in [
                ("interval", "scrape_interval"),
                ("scrapeTimeout", "scrape_timeout"),
                ("path", "metrics_path"),
                ("scheme", "scheme"),
            ] {
                if let Some(v) = ep[from].as_str() {
                    cfg[to] = json!(v);
                }
            }
            if let Some(tls) = ep["tlsConfig"].as_object() {
                let mut t = json!({
                    "insecure_skip_verify": tls.get("insecureSkipVerify").and_then(Value::as_bool).unwrap_or(false),
                });
                for (k, v) in tls {
                    match k.as_str() {
                        "insecureSkipVerify" => {}
                        "serverName" => t["server_name"] = v.clone(),
                        "ca" => {
                            let cm = &v["configMap"];
                            let (cm_name, key) = (cm["name"].as_str(), cm["key"].as_str());
                            let (Some(cm_name), Some(key)) = (cm_name, key) else {
                                panic!("{source}: tlsConfig.ca {v}: only a ConfigMap key is derived")
                            };
                            // The operator mounts it as configmap_<ns>_<name>_<key>; here it holds
                            // the CA of the controller's test certificate.
                            let file = dir.join(format!("configmap_{ns}_{cm_name}_{key}"));
                            std::fs::copy(dir.join("ca.pem"), &file).unwrap();
                            t["ca_file"] = json!(file);
                        }
                        other => panic!(
                            "{source}: tlsConfig.{other}: this test does not derive it (add it from \
                             the operator's addTLStoYaml)"
                        ),
                    }
                }
                cfg["tls_config"] = t;
            }
            cfg
        })
        .collect()
}

/// The real Prometheus, on loopback, in a temp dir of its own; killed by PID at the end.
struct Prometheus {
    child: tokio::process::Child,
    url: String,
    http: reqwest::Client,
    log: std::path::PathBuf,
}

impl Prometheus {
    async fn start(
        dir: &Path,
        docs: &[(String, Value)],
        target: std::net::SocketAddr,
    ) -> Prometheus {
        let prometheus = which("prometheus");
        let home = dir.join("prometheus");
        std::fs::create_dir_all(&home).unwrap();
        let scrape = scrape_configs(docs, dir, target);
        let config = json!({
            "global": { "scrape_interval": INTERVAL, "evaluation_interval": INTERVAL },
            "scrape_configs": scrape,
        });
        let config_file = home.join("prometheus.yml");
        std::fs::write(&config_file, serde_yaml::to_string(&config).unwrap()).unwrap();
        eprintln!(
            "prometheus.yml:\n{}",
            serde_yaml::to_string(&config).unwrap()
        );
        let log = home.join("prometheus.log");
        let child = tokio::process::Command::new(prometheus)
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                home.join("data").display()
            ))
            .arg("--web.listen-address=127.0.0.1:0")
            .current_dir(&home)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .expect("start prometheus");
        let pid = child.id().unwrap();
        // It binds port 0 and does not say which port it got: the one its process listens on.
        let port = wait_for(
            Duration::from_secs(30),
            "prometheus listening",
            || async move { listening_ports(pid).into_iter().next() },
        )
        .await;
        let p = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
            log,
        };
        wait_until(Duration::from_secs(30), "prometheus ready", || async {
            p.http
                .get(format!("{}/-/ready", p.url))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await;
        // The target is up: scraped over HTTPS with the ServiceMonitor's TLS settings.
        let what = format!("prometheus's target up (log: {})", p.log.display());
        let targets = crate::shared::wait::until(Duration::from_secs(30), what, || async {
            let t = p.get("/api/v1/targets", &[]).await?["data"]["activeTargets"].clone();
            let up = t
                .as_array()
                .is_some_and(|a| !a.is_empty() && a.iter().all(|t| t["health"] == "up"));
            if up {
                Ok(t)
            } else {
                Err(t.to_string())
            }
        })
        .await;
        eprintln!("prometheus targets: {targets}");
        p
    }

    async fn get(&self, path: &str, params: &[(&str, &str)]) -> Result<Value, String> {
        let url = reqwest::Url::parse_with_params(&format!("{}{path}", self.url), params)
            .map_err(|e| e.to_string())?;
        let resp = self.http.get(url).send().await.map_err(|e| e.to_string())?;
        let v: Value = resp.json().await.map_err(|e| e.to_string())?;
        if v["status"] != "success" {
            return Err(format!("{}: {}", v["errorType"], v["error"]));
        }
        Ok(v)
    }

    /// An instant query's result (`data.result`), or Prometheus's error.
    async fn query(&self, expr: &str) -> Result<Value, String> {
        Ok(self.get("/api/v1/query", &[("query", expr)]).await?["data"]["result"].clone())
    }

    async fn has_data(&self, expr: &str) -> bool {
        self.query(expr)
            .await
            .is_ok_and(|r| r.as_array().is_some_and(|a| !a.is_empty()))
    }

    /// The values of `label` (of series matching `matcher`, when given).
    async fn label_values(&self, label: &str, matcher: Option<&str>) -> Vec<String> {
        let params: Vec<(&str, &str)> = matcher.map(|m| ("match[]", m)).into_iter().collect();
        let v = self
            .get(&format!("/api/v1/label/{label}/values"), &params)
            .await
            .unwrap_or_else(|e| panic!("label values of {label}: {e}"));
        v["data"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect()
    }

    /// A query variable's first value, as Grafana's Prometheus data source resolves
    /// `label_values(METRIC, LABEL)`: the label's values of the series of METRIC.
    async fn resolve_variable(&self, query: &str) -> Option<String> {
        let inner = query.strip_prefix("label_values(")?.strip_suffix(')')?;
        let (metric, label) = inner.split_once(',').expect("label_values(METRIC, LABEL)");
        self.label_values(label.trim(), Some(metric.trim()))
            .await
            .into_iter()
            .next()
    }

    /// Kills the process (by its PID) and waits for it.
    async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
    }
}

/// The ports `pid` listens on at 127.0.0.1 (its sockets' inodes among /proc/net/tcp's listeners).
fn listening_ports(pid: u32) -> Vec<u16> {
    let inodes: BTreeSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            l.to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')
                .map(str::to_string)
        })
        .collect();
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    tcp.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // local_address, st (0A = LISTEN), inode
            let (local, state, inode) = (f.get(1)?, f.get(3)?, f.get(9)?);
            let (ip, port) = local.split_once(':')?;
            (*state == "0A" && ip == "0100007F" && inodes.contains(*inode))
                .then(|| u16::from_str_radix(port, 16).ok())
                .flatten()
        })
        .collect()
}

/// `name` on PATH; a missing one fails the test naming its package.
fn which(name: &str) -> std::path::PathBuf {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("{name} not found on PATH: run scripts/setup.sh (Debian package `prometheus`)")
        })
}
