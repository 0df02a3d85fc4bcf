//! The cloud instance behind a node, as its instance-metadata service describes it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::Cloud;

/// What the instance-metadata service says about this instance.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceIdentity {
    /// The cloud.
    pub cloud: Option<Cloud>,
    /// Instance id (OCI OCID, EC2 `i-…`, Azure `vmId`, GCE numeric id).
    pub instance_id: String,
    /// Instance / VM name where the cloud has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Region (OCI canonical name, e.g. `us-phoenix-1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Zone / availability domain (OCI without the tenancy prefix).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// OCI fault domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault_domain: Option<String>,
    /// Shape / instance type / VM size / machine type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_type: Option<String>,
    /// Spot/preemptible capacity, when the metadata says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemptible: Option<bool>,
    /// OCI compartment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compartment: Option<String>,
    /// Creation time, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<DateTime<Utc>>,
}
