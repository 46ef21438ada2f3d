//! A Node as the NodeImage controller watches and stores it: its name, uid, labels, deletion and
//! conditions; serde skips the rest of the object (spec, addresses, the `images` list that runs
//! to kilobytes, managedFields) without building it. k8s-openapi's `Node` is 1,496 bytes before
//! anything is in it; this is a quarter of that.
//!
//! The labels are [`Labels`], their strings shared by every Node (a cloud node's 17 labels took
//! 2.3 KiB a Node as a map), and live beside the metadata: `metadata.labels` is always `None`,
//! so read `NodeSummary::labels`, never `ResourceExt::labels`.

use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use kruise_rs_controller::interned_labels::Labels;

#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct NodeSummary {
    /// Without labels: they are in `labels`.
    pub metadata: ObjectMeta,
    pub labels: Labels,
    pub status: Option<NodeStatusSummary>,
}

/// A Node's JSON as far as a summary reads it (serde skips the rest unbuilt).
#[derive(Deserialize)]
struct Wire {
    #[serde(default)]
    metadata: Option<WireMetadata>,
    #[serde(default)]
    status: Option<NodeStatusSummary>,
}

#[derive(Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct WireMetadata {
    name: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    labels: Option<Labels>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
}

impl<'de> Deserialize<'de> for NodeSummary {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let wire = Wire::deserialize(d)?;
        let m = wire.metadata.unwrap_or_default();
        Ok(NodeSummary {
            metadata: ObjectMeta {
                name: m.name,
                uid: m.uid,
                resource_version: m.resource_version,
                creation_timestamp: m.creation_timestamp,
                deletion_timestamp: m.deletion_timestamp,
                ..ObjectMeta::default()
            },
            labels: m.labels.unwrap_or_default(),
            status: wire.status,
        })
    }
}

/// Serializes as the (partial) Node it summarizes, labels in the metadata.
impl Serialize for NodeSummary {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Out<'a> {
            metadata: ObjectMeta,
            #[serde(skip_serializing_if = "Option::is_none")]
            status: &'a Option<NodeStatusSummary>,
        }
        let mut metadata = self.metadata.clone();
        if !self.labels.is_empty() {
            metadata.labels = Some(self.labels.to_map());
        }
        Out {
            metadata,
            status: &self.status,
        }
        .serialize(s)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct NodeStatusSummary {
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
        assert_eq!(node.labels.get("zone"), Some("a"));
        assert!(
            node.metadata.labels.is_none(),
            "labels live beside the metadata"
        );
        assert!(node.metadata.managed_fields.is_none());
        let conditions = node.status.and_then(|s| s.conditions).expect("conditions");
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].type_, "Ready");
    }

    #[test]
    fn a_summary_serializes_back_to_the_node_it_read() {
        let json = json!({
            "metadata": {"name": "n1", "uid": "u1", "resourceVersion": "7", "labels": {"zone": "a"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        });
        let node: NodeSummary = serde_json::from_value(json.clone()).expect("parses");
        assert_eq!(serde_json::to_value(&node).expect("serializes"), json);
        let bare: NodeSummary = serde_json::from_value(json!({})).expect("parses");
        assert_eq!(bare, NodeSummary::default());
    }
}
