//! Types and schema helpers shared by more than one kind.

use std::collections::BTreeMap;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// Labels and annotations handed to the CRI `PullImage` call as its pod sandbox config.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxConfig {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// Whether a node pulls an image it already has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ImagePullPolicy {
    /// Pull every time, even when the image is present.
    Always,
    /// Pull only when the image is missing.
    #[default]
    IfNotPresent,
}

/// Schema for a list of core objects kept schemaless, as upstream does for containers and
/// volumes: a full `core/v1` schema would push the CRD past the 256 KiB `kubectl apply`
/// annotation limit, and the webhook validates these with core rules anyway. Items must carry a
/// `name`, because the Rust types (and Kubernetes) cannot do without one.
pub(crate) fn named_objects_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "items": {
            "type": "object",
            "required": ["name"],
            "properties": { "name": { "type": "string" } },
            "x-kubernetes-preserve-unknown-fields": true
        }
    })
}
