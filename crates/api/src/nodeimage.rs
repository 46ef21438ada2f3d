//! NodeImage: the images one node should hold, and what its daemon reports about them.
//!
//! Cluster-scoped, one per Node, named after it; its labels mirror the Node's. `spec.images` is
//! keyed by image name (`nginx`, `ghcr.io/org/app`); each holds a list of tag entries, each
//! with the ImagePullJobs that own it. The JSON shape and the list types are upstream's; our
//! writers guard each change with JSON Patch `test`s, so several jobs writing one NodeImage do
//! not overwrite each other's entries (upstream's read-modify-write loses them, kruise#1517).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

pub use super::common::{ImagePullPolicy, SandboxConfig};
use super::limits;

/// Desired state of a NodeImage.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "apps.kruise.io",
    version = "v1beta1",
    kind = "NodeImage",
    status = "NodeImageStatus",
    derive = "Default",
    derive = "PartialEq",
    doc = "NodeImage lists the images one node should pull and reports their state.",
    printcolumn = r#"{"name": "DESIRED", "type": "integer", "jsonPath": ".status.desired", "description": "Number of all images on this node."}"#,
    printcolumn = r#"{"name": "PULLING", "type": "integer", "jsonPath": ".status.pulling", "description": "Number of image pull tasks active."}"#,
    printcolumn = r#"{"name": "SUCCEED", "type": "integer", "jsonPath": ".status.succeeded", "description": "Number of image pull tasks succeeded."}"#,
    printcolumn = r#"{"name": "FAILED", "type": "integer", "jsonPath": ".status.failed", "description": "Number of image pull tasks failed."}"#,
    printcolumn = r#"{"name": "AGE", "type": "date", "jsonPath": ".metadata.creationTimestamp", "description": "Time since the NodeImage was created."}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NodeImageSpec {
    /// Image name (without tag) to what to pull of it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 256))]
    pub images: BTreeMap<String, ImageSpec>,
}

/// What to pull of one image name.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageSpec {
    /// Pull secrets, by namespace and name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pull_secrets: Vec<ReferenceObject>,
    /// The tags (or `sha256:` digests) to pull.
    #[serde(default)]
    #[schemars(schema_with = "tags_schema")]
    pub tags: Vec<ImageTagSpec>,
    /// Labels and annotations passed to the CRI `PullImage` call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_config: Option<SandboxConfig>,
}

/// A Secret by namespace and name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceObject {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `batch` for shared secret copies (v1beta1; v1alpha1 readers ignore it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

/// One tag of an image to pull, and who asked for it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageTagSpec {
    /// A tag, or a digest such as `sha256:…`.
    #[schemars(length(min = 1))]
    pub tag: String,
    /// When the entry was added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_policy: Option<ImageTagPullPolicy>,
    /// The ImagePullJobs that want this tag.
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(schema_with = "owner_references_schema")]
    pub owner_references: Vec<ObjectReference>,
    /// Bumped to ask for another pull.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub version: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<ImagePullPolicy>,
    /// The sandbox metadata of this tag's owners, passed to CRI `PullImage` for this tag (a
    /// kruise-rs addition: upstream keeps one per image). Unset: the image's `sandboxConfig`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_config: Option<SandboxConfig>,
}

/// Reads `null` as an empty list (upstream's Go writer sends `"ownerReferences": null`).
fn null_as_empty<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Vec<T>, D::Error> {
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// How one tag is pulled.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageTagPullPolicy {
    /// Seconds one pull may take, 1 to 86400. Defaults to 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = limits::MIN_TIMEOUT_SECONDS, max = limits::MAX_TIMEOUT_SECONDS))]
    pub timeout_seconds: Option<i32>,
    /// Retries before the tag counts as failed, 0 to 1000. Defaults to 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = limits::MIN_BACKOFF_LIMIT, max = limits::MAX_BACKOFF_LIMIT))]
    pub backoff_limit: Option<i32>,
    /// Seconds after the pull finished before the entry is removed; not negative.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = limits::MIN_TTL_SECONDS))]
    pub ttl_seconds_after_finished: Option<i32>,
    /// Seconds after creation the pull may stay active, 1 to 31536000 (365 days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = limits::MIN_ACTIVE_DEADLINE_SECONDS, max = limits::MAX_ACTIVE_DEADLINE_SECONDS))]
    pub active_deadline_seconds: Option<i64>,
}

/// Tag entries, a plain (atomic) list as upstream's: as a list map keyed by `tag` (and its
/// owners keyed by `uid`), the apiserver tracked every leaf of every entry in managedFields,
/// which cost about 25% more of its CPU on each NodeImage write, the daemons' status writes
/// included (decision 0041). Writers guard their changes with JSON Patch `test`s instead.
fn tags_schema(generator: &mut SchemaGenerator) -> Schema {
    let item = generator.subschema_for::<ImageTagSpec>();
    json_schema!({
        "type": "array",
        "items": item,
        "x-kubernetes-list-type": "atomic"
    })
}

fn owner_references_schema(generator: &mut SchemaGenerator) -> Schema {
    let item = generator.subschema_for::<ObjectReference>();
    json_schema!({
        "type": "array",
        "items": item,
        "x-kubernetes-list-type": "atomic"
    })
}

/// Observed state of a NodeImage, written by the node's daemon.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeImageStatus {
    /// Tags in the spec.
    #[serde(default)]
    pub desired: i32,
    #[serde(default)]
    pub succeeded: i32,
    #[serde(default)]
    pub failed: i32,
    #[serde(default)]
    pub pulling: i32,
    #[serde(default)]
    pub waiting: i32,
    /// Image name to the state of its tags.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub image_statuses: BTreeMap<String, ImageStatus>,
    /// Declared by upstream; nothing there writes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_sync_status: Option<SyncStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ImageStatus {
    #[serde(default)]
    pub tags: Vec<ImageTagStatus>,
}

/// The state of one tag on the node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageTagStatus {
    pub tag: String,
    pub phase: ImagePullPhase,
    /// 0 to 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// The spec `version` this state is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<i64>,
    /// `<name>@<runtime image id>`.
    #[serde(rename = "imageID", default, skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl ImageTagStatus {
    /// A tag in `phase`, with nothing else known yet.
    pub fn new(tag: impl Into<String>, phase: ImagePullPhase) -> Self {
        Self {
            tag: tag.into(),
            phase,
            progress: None,
            start_time: None,
            completion_time: None,
            version: None,
            image_id: None,
            message: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ImagePullPhase {
    Waiting,
    Pulling,
    Succeeded,
    Failed,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyncStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<SyncStatusPhase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SyncStatusPhase {
    Succeeded,
    Failed,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_seed_nodeimage_parses_with_sandbox_config_owners_and_pull_policy() {
        let yaml = include_str!("../../../tests/fixtures/seed-003-nodeimage.yaml");
        let node: NodeImage = serde_yaml::from_str(yaml).expect("parses");
        let nginx = &node.spec.images["nginx"];
        let sandbox = nginx.sandbox_config.as_ref().expect("sandboxConfig");
        assert_eq!(sandbox.labels["app"], "foo");
        assert_eq!(
            sandbox.annotations["io.kubernetes.image.metrics.tags"],
            "app=foo"
        );
        let tag = &nginx.tags[0];
        assert_eq!(tag.tag, "latest");
        assert_eq!(
            tag.owner_references[0].uid.as_deref(),
            Some("64f5b96a-8596-4688-8e15-c1e7adddd209")
        );
        let policy = tag.pull_policy.as_ref().expect("pullPolicy");
        assert_eq!(
            (
                policy.timeout_seconds,
                policy.backoff_limit,
                policy.ttl_seconds_after_finished
            ),
            (Some(600), Some(3), Some(2246))
        );
    }

    #[test]
    fn tag_status_uses_upstreams_image_id_spelling() {
        let status = ImageTagStatus {
            tag: "v1".into(),
            phase: ImagePullPhase::Succeeded,
            progress: Some(100),
            start_time: None,
            completion_time: None,
            version: Some(2),
            image_id: Some("nginx@sha256:abc".into()),
            message: None,
        };
        let json = serde_json::to_value(&status).expect("serializes");
        assert_eq!(
            json,
            json!({"tag": "v1", "phase": "Succeeded", "progress": 100, "version": 2, "imageID": "nginx@sha256:abc"})
        );
        assert_eq!(
            serde_json::from_value::<ImageTagStatus>(json).expect("parses"),
            status
        );
    }

    #[test]
    fn null_owner_references_read_as_none() {
        let tag: ImageTagSpec =
            serde_json::from_value(json!({"tag": "1", "ownerReferences": null})).expect("parses");
        assert!(tag.owner_references.is_empty());
    }

    #[test]
    fn pull_secret_mode_is_kept() {
        let spec: ImageSpec = serde_json::from_value(json!({
            "pullSecrets": [{"namespace": "kruise-daemon-config", "name": "s", "mode": "batch"}],
            "tags": []
        }))
        .expect("parses");
        assert_eq!(spec.pull_secrets[0].mode.as_deref(), Some("batch"));
    }
}
