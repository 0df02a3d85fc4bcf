//! The resource table: every kind the stand-in serves, used for routing and discovery.

use serde_json::{json, Value};

pub use super::store::lifecycle::Lifecycle;

/// One served resource (a plural name in a group/version).
#[derive(Debug, PartialEq, Eq)]
pub struct ResourceDef {
    /// API group; empty for the core group.
    pub group: &'static str,
    /// API version inside the group.
    pub version: &'static str,
    /// Kind of the objects.
    pub kind: &'static str,
    /// Plural (URL) name.
    pub plural: &'static str,
    /// Singular name.
    pub singular: &'static str,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
    /// kubectl short names.
    pub short_names: &'static [&'static str],
    /// Whether `/status` is a subresource (main writes then keep the old status).
    pub has_status: bool,
    /// Create-only virtual resources (TokenReview): nothing is stored.
    pub virtual_create: bool,
    /// What the store does beyond storing (graceful pod deletion, namespace cascade, …).
    pub lifecycle: Lifecycle,
}

impl ResourceDef {
    /// This definition with `lifecycle`.
    const fn with_lifecycle(mut self, lifecycle: Lifecycle) -> Self {
        self.lifecycle = lifecycle;
        self
    }

    /// `apiVersion` of the objects, e.g. `apps/v1` or `v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `group/plural` (core: `plural`), as used in error messages.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// Index of this resource in [`RESOURCES`].
    pub fn index(&self) -> usize {
        RESOURCES
            .iter()
            .position(|r| std::ptr::eq(r, self))
            .unwrap_or(0)
    }
}

macro_rules! res {
    ($g:expr, $v:expr, $k:expr, $p:expr, $s:expr, $ns:expr, $short:expr, $status:expr) => {
        ResourceDef {
            group: $g,
            version: $v,
            kind: $k,
            plural: $p,
            singular: $s,
            namespaced: $ns,
            short_names: $short,
            has_status: $status,
            virtual_create: false,
            lifecycle: Lifecycle::Plain,
        }
    };
}

/// Every served resource.
pub static RESOURCES: &[ResourceDef] = &[
    res!("", "v1", "Node", "nodes", "node", false, &["no"], true),
    res!("", "v1", "Pod", "pods", "pod", true, &["po"], true).with_lifecycle(Lifecycle::Pod),
    res!(
        "",
        "v1",
        "Namespace",
        "namespaces",
        "namespace",
        false,
        &["ns"],
        true
    )
    .with_lifecycle(Lifecycle::Namespace),
    res!("", "v1", "Event", "events", "event", true, &["ev"], false),
    res!(
        "",
        "v1",
        "Service",
        "services",
        "service",
        true,
        &["svc"],
        true
    ),
    res!(
        "",
        "v1",
        "ConfigMap",
        "configmaps",
        "configmap",
        true,
        &["cm"],
        false
    ),
    res!("", "v1", "Secret", "secrets", "secret", true, &[], false),
    res!(
        "",
        "v1",
        "ResourceQuota",
        "resourcequotas",
        "resourcequota",
        true,
        &["quota"],
        true
    ),
    res!(
        "",
        "v1",
        "LimitRange",
        "limitranges",
        "limitrange",
        true,
        &["limits"],
        false
    ),
    res!(
        "",
        "v1",
        "ServiceAccount",
        "serviceaccounts",
        "serviceaccount",
        true,
        &["sa"],
        false
    ),
    res!(
        "apps",
        "v1",
        "ReplicaSet",
        "replicasets",
        "replicaset",
        true,
        &["rs"],
        true
    ),
    res!(
        "apps",
        "v1",
        "Deployment",
        "deployments",
        "deployment",
        true,
        &["deploy"],
        true
    ),
    res!(
        "apps",
        "v1",
        "DaemonSet",
        "daemonsets",
        "daemonset",
        true,
        &["ds"],
        true
    ),
    res!(
        "apps",
        "v1",
        "StatefulSet",
        "statefulsets",
        "statefulset",
        true,
        &["sts"],
        true
    ),
    res!(
        "policy",
        "v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        "poddisruptionbudget",
        true,
        &["pdb"],
        true
    ),
    res!(
        "coordination.k8s.io",
        "v1",
        "Lease",
        "leases",
        "lease",
        true,
        &[],
        false
    ),
    res!(
        "events.k8s.io",
        "v1",
        "Event",
        "events",
        "event",
        true,
        &["ev"],
        false
    )
    .with_lifecycle(Lifecycle::MirroredEvent),
    ResourceDef {
        group: "authentication.k8s.io",
        version: "v1",
        kind: "TokenReview",
        plural: "tokenreviews",
        singular: "tokenreview",
        namespaced: false,
        short_names: &[],
        has_status: false,
        virtual_create: true,
        lifecycle: Lifecycle::Plain,
    },
    res!(
        "storage.k8s.io",
        "v1",
        "VolumeAttachment",
        "volumeattachments",
        "volumeattachment",
        false,
        &[],
        true
    ),
    // Stored so the shipped manifests install; the sim neither authorizes nor admits by them
    // (docs/dev/sim.md, fidelity).
    res!(
        "rbac.authorization.k8s.io",
        "v1",
        "Role",
        "roles",
        "role",
        true,
        &[],
        false
    ),
    res!(
        "rbac.authorization.k8s.io",
        "v1",
        "RoleBinding",
        "rolebindings",
        "rolebinding",
        true,
        &[],
        false
    ),
    res!(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRole",
        "clusterroles",
        "clusterrole",
        false,
        &[],
        false
    ),
    res!(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
        "clusterrolebinding",
        false,
        &[],
        false
    ),
    res!(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
        "validatingadmissionpolicy",
        false,
        &[],
        true
    ),
    res!(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
        "validatingadmissionpolicybinding",
        false,
        &[],
        false
    ),
    // Stored only: the sim has no API Priority and Fairness.
    res!(
        "flowcontrol.apiserver.k8s.io",
        "v1",
        "FlowSchema",
        "flowschemas",
        "flowschema",
        false,
        &[],
        true
    ),
    res!(
        "flowcontrol.apiserver.k8s.io",
        "v1",
        "PriorityLevelConfiguration",
        "prioritylevelconfigurations",
        "prioritylevelconfiguration",
        false,
        &[],
        true
    ),
    res!(
        "karpenter.sh",
        "v1",
        "NodeClaim",
        "nodeclaims",
        "nodeclaim",
        false,
        &[],
        true
    ),
    res!(
        "karpenter.sh",
        "v1",
        "NodePool",
        "nodepools",
        "nodepool",
        false,
        &[],
        true
    ),
];

/// Looks a resource up by group, version and plural.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static ResourceDef> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// Whether `/scale` (autoscaling/v1 Scale) is a subresource.
pub fn has_scale(r: &ResourceDef) -> bool {
    r.group == "apps" && matches!(r.plural, "deployments" | "replicasets" | "statefulsets")
}

/// Discovery categories (`kubectl get all`).
fn categories(r: &ResourceDef) -> &'static [&'static str] {
    match (r.group, r.plural) {
        ("", "pods" | "services")
        | ("apps", "deployments" | "replicasets" | "daemonsets" | "statefulsets") => &["all"],
        _ => &[],
    }
}

/// Looks a resource up by `apiVersion` and `kind`.
pub fn find_kind(api_version: &str, kind: &str) -> Option<&'static ResourceDef> {
    RESOURCES
        .iter()
        .find(|r| r.api_version() == api_version && r.kind == kind)
}

/// Resource shortcuts used by the simulated control loops.
pub mod well_known {
    use super::{find, ResourceDef};

    fn get(group: &str, plural: &str) -> &'static ResourceDef {
        // The table is static and these entries exist in it (checked by a unit test).
        find(group, "v1", plural).unwrap_or(&super::RESOURCES[0])
    }
    /// core/v1 nodes.
    pub fn nodes() -> &'static ResourceDef {
        get("", "nodes")
    }
    /// core/v1 pods.
    pub fn pods() -> &'static ResourceDef {
        get("", "pods")
    }
    /// core/v1 serviceaccounts.
    pub fn service_accounts() -> &'static ResourceDef {
        get("", "serviceaccounts")
    }
    /// core/v1 namespaces.
    pub fn namespaces() -> &'static ResourceDef {
        get("", "namespaces")
    }
    /// core/v1 events.
    pub fn events() -> &'static ResourceDef {
        get("", "events")
    }
    /// events.k8s.io/v1 events.
    pub fn new_events() -> &'static ResourceDef {
        find("events.k8s.io", "v1", "events").unwrap_or(&super::RESOURCES[0])
    }
    /// apps/v1 replicasets.
    pub fn replicasets() -> &'static ResourceDef {
        get("apps", "replicasets")
    }
    /// apps/v1 deployments.
    pub fn deployments() -> &'static ResourceDef {
        get("apps", "deployments")
    }
    /// apps/v1 daemonsets.
    pub fn daemonsets() -> &'static ResourceDef {
        get("apps", "daemonsets")
    }
    /// apps/v1 statefulsets.
    pub fn statefulsets() -> &'static ResourceDef {
        get("apps", "statefulsets")
    }
    /// policy/v1 poddisruptionbudgets.
    pub fn pdbs() -> &'static ResourceDef {
        get("policy", "poddisruptionbudgets")
    }
    /// coordination.k8s.io/v1 leases.
    pub fn leases() -> &'static ResourceDef {
        get("coordination.k8s.io", "leases")
    }
    /// karpenter.sh/v1 nodeclaims.
    pub fn nodeclaims() -> &'static ResourceDef {
        get("karpenter.sh", "nodeclaims")
    }
}

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// `/api`: the core versions.
pub fn api_versions(server: &str) -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"],
           "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server}]})
}

/// Groups other than core, in table order, without duplicates.
fn groups() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for r in RESOURCES.iter().filter(|r| !r.group.is_empty()) {
        if !out.contains(&(r.group, r.version)) {
            out.push((r.group, r.version));
        }
    }
    out
}

/// `/apis`: the API group list.
pub fn api_group_list() -> Value {
    let groups: Vec<Value> = groups()
        .into_iter()
        .map(|(g, v)| {
            let gv = json!({"groupVersion": format!("{g}/{v}"), "version": v});
            json!({"name": g, "versions": [gv.clone()], "preferredVersion": gv})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>`: one API group.
pub fn api_group(group: &str) -> Option<Value> {
    let (g, v) = groups().into_iter().find(|(g, _)| *g == group)?;
    let gv = json!({"groupVersion": format!("{g}/{v}"), "version": v});
    Some(
        json!({"kind": "APIGroup", "apiVersion": "v1", "name": g, "versions": [gv.clone()], "preferredVersion": gv}),
    )
}

/// `/api/v1` or `/apis/<g>/<v>`: the resource list, with subresources.
pub fn api_resource_list(group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for r in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let verbs: Vec<&str> = if r.virtual_create {
            vec!["create"]
        } else {
            VERBS.to_vec()
        };
        resources.push(
            json!({"name": r.plural, "singularName": r.singular, "namespaced": r.namespaced,
            "kind": r.kind, "verbs": verbs, "shortNames": r.short_names, "categories": categories(r)}),
        );
        if has_scale(r) {
            resources.push(
                json!({"name": format!("{}/scale", r.plural), "singularName": "", "namespaced": r.namespaced,
                "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"]}),
            );
        }
        if r.has_status {
            resources.push(
                json!({"name": format!("{}/status", r.plural), "singularName": "",
                "namespaced": r.namespaced, "kind": r.kind, "verbs": ["get", "patch", "update"]}),
            );
        }
        if r.plural == "serviceaccounts" && r.group.is_empty() {
            resources.push(
                json!({"name": "serviceaccounts/token", "singularName": "", "namespaced": true,
                "group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest", "verbs": ["create"]}),
            );
        }
        if r.plural == "pods" && r.group.is_empty() {
            resources.push(
                json!({"name": "pods/eviction", "singularName": "", "namespaced": true,
                "group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"]}),
            );
        }
    }
    if resources.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn well_known_entries_exist() {
        assert_eq!(well_known::nodes().kind, "Node");
        assert_eq!(well_known::pods().kind, "Pod");
        assert_eq!(well_known::namespaces().kind, "Namespace");
        assert_eq!(well_known::service_accounts().kind, "ServiceAccount");
        assert_eq!(well_known::events().group, "");
        assert_eq!(well_known::replicasets().kind, "ReplicaSet");
        assert_eq!(well_known::deployments().kind, "Deployment");
        assert_eq!(well_known::daemonsets().kind, "DaemonSet");
        assert_eq!(well_known::statefulsets().kind, "StatefulSet");
        assert_eq!(well_known::pdbs().kind, "PodDisruptionBudget");
        assert_eq!(well_known::leases().kind, "Lease");
        assert_eq!(well_known::nodeclaims().kind, "NodeClaim");
    }

    #[test]
    fn discovery_lists_eviction_with_policy_group() {
        let list = api_resource_list("", "v1").unwrap();
        let ev = list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "pods/eviction")
            .unwrap();
        assert_eq!(ev["group"], "policy");
        assert_eq!(ev["kind"], "Eviction");
        assert!(api_resource_list("nope", "v1").is_none());
        assert_eq!(
            find_kind("apps/v1", "DaemonSet").unwrap().plural,
            "daemonsets"
        );
        assert_eq!(well_known::pods().index(), 1);
        let apps = api_resource_list("apps", "v1").unwrap();
        let names: Vec<&str> = apps["resources"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["name"].as_str())
            .collect();
        assert!(names.contains(&"deployments/scale") && names.contains(&"replicasets/scale"));
        let deploy = apps["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "deployments")
            .unwrap();
        assert_eq!(deploy["categories"], json!(["all"]));
        assert!(!has_scale(well_known::daemonsets()));
    }
}
