//! What-if events (`--what-if EVENT:TARGET`): `notready:NODE`, `preemption:NODE`,
//! `maintenance:pool=gpu`, `notready:karpenter.sh/capacity-type=spot`, ... Parsed purely; the
//! target is resolved against the snapshot's nodes.

use std::fmt;
use std::str::FromStr;

use serde_json::Value;

use nodekeeper_core::wire::EventKind;

/// What happens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Happening {
    /// The node's `Ready` condition turns `False` (kubelet stops posting status).
    NotReady,
    /// A cloud notice reaches the controller (as from the node's agent or OCI Events).
    Notice(EventKind),
}

/// To which nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One node by name.
    Node(String),
    /// Every node of a budget group (`pool=NAME`: the value of `[budgets] group_by`).
    Pool(String),
    /// Every node with this label value.
    Label {
        /// Key.
        key: String,
        /// Value.
        value: String,
    },
}

/// One `--what-if`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WhatIf {
    /// What.
    pub happening: Happening,
    /// Where.
    pub target: Target,
}

/// The notice kinds `--what-if` accepts.
const NOTICES: [EventKind; 6] = [
    EventKind::Preemption,
    EventKind::Termination,
    EventKind::Maintenance,
    EventKind::Rebalance,
    EventKind::Reboot,
    EventKind::Redeploy,
];

fn kinds() -> String {
    let mut k = vec!["notready"];
    k.extend(NOTICES.iter().map(EventKind::name));
    k.join(", ")
}

impl FromStr for WhatIf {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (what, target) = s.split_once(':').ok_or_else(|| {
            format!("{s:?}: expected EVENT:TARGET, e.g. notready:NODE or preemption:pool=spot (events: {})", kinds())
        })?;
        let what = what.trim().to_ascii_lowercase();
        let happening = if what == "notready" {
            Happening::NotReady
        } else {
            let kind = NOTICES
                .iter()
                .find(|k| k.name() == what)
                .ok_or_else(|| format!("{s:?}: unknown event {what:?} (events: {})", kinds()))?;
            Happening::Notice(kind.clone())
        };
        let target = target.trim();
        let target = match target.split_once('=') {
            _ if target.is_empty() => return Err(format!("{s:?}: no target node")),
            Some(("pool", v)) => Target::Pool(v.to_string()),
            Some((k, v)) if !k.is_empty() => Target::Label {
                key: k.to_string(),
                value: v.to_string(),
            },
            Some(_) => return Err(format!("{s:?}: expected LABEL=VALUE")),
            None => Target::Node(target.to_string()),
        };
        Ok(WhatIf { happening, target })
    }
}

impl fmt::Display for WhatIf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let target = match &self.target {
            Target::Node(n) => n.clone(),
            Target::Pool(p) => format!("every node of pool {p}"),
            Target::Label { key, value } => format!("every node with {key}={value}"),
        };
        match &self.happening {
            Happening::NotReady => write!(f, "{target} NotReady"),
            Happening::Notice(k) => write!(f, "{} notice on {target}", k.name()),
        }
    }
}

impl WhatIf {
    /// The names of the snapshot nodes this event applies to (at least one, else an error).
    pub fn nodes(&self, nodes: &[Value], group_by: &str) -> Result<Vec<String>, String> {
        let label = |n: &Value, k: &str| {
            n.pointer("/metadata/labels")
                .and_then(|l| l.get(k))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let matching: Vec<String> = nodes
            .iter()
            .filter(|n| match &self.target {
                Target::Node(name) => super::snapshot::name_of(n) == Some(name.as_str()),
                Target::Pool(p) => label(n, group_by).as_deref() == Some(p.as_str()),
                Target::Label { key, value } => label(n, key).as_deref() == Some(value.as_str()),
            })
            .filter_map(|n| super::snapshot::name_of(n).map(str::to_string))
            .collect();
        if matching.is_empty() {
            let why = match &self.target {
                Target::Node(n) => format!("no node {n:?} in the snapshot"),
                Target::Pool(p) => {
                    format!("no node with {group_by}={p} (pools are [budgets] group_by)")
                }
                Target::Label { key, value } => format!("no node with {key}={value}"),
            };
            return Err(format!("--what-if {self}: {why}"));
        }
        Ok(matching)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_events_and_targets() {
        let w: WhatIf = "notready:on-demand-0".parse().unwrap();
        assert_eq!(w.happening, Happening::NotReady);
        assert_eq!(w.target, Target::Node("on-demand-0".into()));
        assert_eq!(w.to_string(), "on-demand-0 NotReady");
        let w: WhatIf = "Preemption:pool=spot".parse().unwrap();
        assert_eq!(w.happening, Happening::Notice(EventKind::Preemption));
        assert_eq!(w.target, Target::Pool("spot".into()));
        let w: WhatIf = "maintenance:karpenter.sh/capacity-type=spot"
            .parse()
            .unwrap();
        assert!(
            matches!(w.target, Target::Label { ref key, .. } if key == "karpenter.sh/capacity-type")
        );
        for bad in ["on-demand-0", "explode:n-0", "notready:", "notready:=x"] {
            assert!(bad.parse::<WhatIf>().is_err(), "{bad}");
        }
    }

    #[test]
    fn resolves_against_the_snapshot() {
        let n = |name: &str, pool: &str| serde_json::json!({"metadata": {"name": name, "labels": {"karpenter.sh/nodepool": pool}}});
        let nodes = [n("a-0", "a"), n("a-1", "a"), n("b-0", "b")];
        let g = "karpenter.sh/nodepool";
        let w: WhatIf = "notready:pool=a".parse().unwrap();
        assert_eq!(w.nodes(&nodes, g).unwrap(), ["a-0", "a-1"]);
        let w: WhatIf = "notready:c-0".parse().unwrap();
        assert!(w.nodes(&nodes, g).unwrap_err().contains("no node \"c-0\""));
    }
}
