//! A NodeImage's spec and status as the manager stores them: the JSON shape of
//! `kruise_rs_api::nodeimage`, held compactly.
//!
//! The manager keeps every NodeImage of the cluster (one per node) and a fan-out writes the same
//! entry into thousands of them, so the stored copies share what they hold equal: image names,
//! tags and image IDs are interned strings ([`InternedString`], [`Interned`]); owner references
//! are shared (`SharedOwner`); a whole image entry, spec or status, equal to one already stored
//! is that one ([`Shared`]); maps are sorted `Vec`s and lists carry no spare room
//! ([`SortedMap`], `compact_vec`). At 5,000 nodes this is what keeps a job's entry at a few
//! bytes per NodeImage instead of ~2 KiB (issue 21).
//!
//! The types are named as the API's and read, compare and serialize as they do, so the
//! controllers read `nodeimage.spec.images[name].tags` either way; the API crate keeps the
//! plain types users and the daemon deserialize (issue 44). `From` turns a plain value into its
//! stored form (shared as a parsed one is), and back.

use std::hash::{Hash, Hasher};
use std::sync::LazyLock;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

use kruise_rs_api::nodeimage as api;
pub use kruise_rs_api::nodeimage::{
    ImagePullPhase, ImageTagPullPolicy, ReferenceObject, SandboxConfig,
};
use kruise_rs_api::nodeimage::{ImagePullPolicy, SyncStatus};
use kruise_rs_controller::compact::{SortedMap, compact_vec};
use kruise_rs_controller::interned::{Interned, InternedString, intern, shared_str_option};
pub use kruise_rs_controller::shared_owner::SharedOwner;
use kruise_rs_controller::shared_owner::{share, shared_owners};
pub use kruise_rs_controller::shared_value::Shared;
use kruise_rs_controller::shared_value::{Shareable, SharedTable};

/// `spec`: image name to what to pull of it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeImageSpec {
    #[serde(default, skip_serializing_if = "SortedMap::is_empty")]
    pub images: Images,
}

/// `spec.images`: a job's entry is the same on every node it targets, so equal entries are
/// stored once.
pub type Images = SortedMap<InternedString, Shared<ImageSpec>>;

/// `status.imageStatuses`: image name to the state of its tags, equal ones stored once.
pub type ImageStatuses = SortedMap<InternedString, Shared<ImageStatus>>;

/// What to pull of one image name.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageSpec {
    #[serde(
        default,
        deserialize_with = "compact_vec",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub pull_secrets: Vec<ReferenceObject>,
    #[serde(default, deserialize_with = "compact_vec")]
    pub tags: Vec<ImageTagSpec>,
    // Boxed, as the tag's: rarely set, 56 bytes inline on every entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_config: Option<Box<SandboxConfig>>,
}

impl Shareable for ImageSpec {
    fn hash_key<H: Hasher>(&self, state: &mut H) {
        for tag in &self.tags {
            tag.tag.hash(state);
            tag.version.hash(state);
            tag.created_at.as_ref().map(time_key).hash(state);
            for owner in &tag.owner_references {
                owner.uid.hash(state);
            }
        }
        self.pull_secrets.hash(state);
    }

    fn table() -> &'static SharedTable<Self> {
        static TABLE: LazyLock<SharedTable<ImageSpec>> = LazyLock::new(SharedTable::default);
        &TABLE
    }
}

/// A time as what tells two apart, for hashing (`Time` has no `Hash`).
fn time_key(t: &Time) -> (i64, i32) {
    (t.0.as_second(), t.0.subsec_nanosecond())
}

/// One tag of an image to pull, and who asked for it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageTagSpec {
    pub tag: InternedString,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_policy: Option<ImageTagPullPolicy>,
    // Each shared with every tag its owner owns: a fan-out writes the same one into thousands
    // of NodeImages.
    #[serde(
        default,
        deserialize_with = "shared_owners",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub owner_references: Vec<SharedOwner>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<ImagePullPolicy>,
    // Boxed: set only for jobs that carry sandbox metadata, and 56 bytes inline on every tag
    // of every NodeImage otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_config: Option<Box<SandboxConfig>>,
}

/// `status`, as the node's daemon wrote it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeImageStatus {
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
    #[serde(default, skip_serializing_if = "SortedMap::is_empty")]
    pub image_statuses: ImageStatuses,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_sync_status: Option<SyncStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageStatus {
    #[serde(default, deserialize_with = "compact_vec")]
    pub tags: Vec<ImageTagStatus>,
}

impl Shareable for ImageStatus {
    fn hash_key<H: Hasher>(&self, state: &mut H) {
        for tag in &self.tags {
            tag.tag.hash(state);
            tag.phase.hash(state);
            tag.progress.hash(state);
            tag.version.hash(state);
            tag.start_time.as_ref().map(time_key).hash(state);
            tag.completion_time.as_ref().map(time_key).hash(state);
            tag.image_id.hash(state);
            tag.message.hash(state);
        }
    }

    fn table() -> &'static SharedTable<Self> {
        static TABLE: LazyLock<SharedTable<ImageStatus>> = LazyLock::new(SharedTable::default);
        &TABLE
    }
}

/// The state of one tag on the node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageTagStatus {
    pub tag: InternedString,
    pub phase: ImagePullPhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<i64>,
    // Interned: every node that pulled the image reports the same one.
    #[serde(
        rename = "imageID",
        default,
        with = "shared_str_option",
        skip_serializing_if = "Option::is_none"
    )]
    pub image_id: Option<Interned>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl ImageTagStatus {
    /// A tag in `phase`, with nothing else known yet.
    pub fn new(tag: impl Into<InternedString>, phase: ImagePullPhase) -> Self {
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

// --- from the plain API types ------------------------------------------------------------------

impl From<api::NodeImageSpec> for NodeImageSpec {
    fn from(spec: api::NodeImageSpec) -> Self {
        NodeImageSpec {
            images: spec
                .images
                .into_iter()
                .map(|(name, image)| (name.into(), Shared::share(ImageSpec::from(image))))
                .collect(),
        }
    }
}

impl From<api::ImageSpec> for ImageSpec {
    fn from(image: api::ImageSpec) -> Self {
        ImageSpec {
            pull_secrets: image.pull_secrets,
            tags: image.tags.into_iter().map(ImageTagSpec::from).collect(),
            sandbox_config: image.sandbox_config.map(Box::new),
        }
    }
}

impl From<api::ImageTagSpec> for ImageTagSpec {
    fn from(tag: api::ImageTagSpec) -> Self {
        ImageTagSpec {
            tag: tag.tag.into(),
            created_at: tag.created_at,
            pull_policy: tag.pull_policy,
            owner_references: tag.owner_references.into_iter().map(share).collect(),
            version: tag.version,
            image_pull_policy: tag.image_pull_policy,
            sandbox_config: tag.sandbox_config.map(Box::new),
        }
    }
}

impl From<api::NodeImageStatus> for NodeImageStatus {
    fn from(status: api::NodeImageStatus) -> Self {
        NodeImageStatus {
            desired: status.desired,
            succeeded: status.succeeded,
            failed: status.failed,
            pulling: status.pulling,
            waiting: status.waiting,
            image_statuses: status
                .image_statuses
                .into_iter()
                .map(|(name, image)| (name.into(), Shared::share(ImageStatus::from(image))))
                .collect(),
            first_sync_status: status.first_sync_status,
        }
    }
}

impl From<api::ImageStatus> for ImageStatus {
    fn from(image: api::ImageStatus) -> Self {
        ImageStatus {
            tags: image.tags.into_iter().map(ImageTagStatus::from).collect(),
        }
    }
}

impl From<api::ImageTagStatus> for ImageTagStatus {
    fn from(tag: api::ImageTagStatus) -> Self {
        ImageTagStatus {
            tag: tag.tag.into(),
            phase: tag.phase,
            progress: tag.progress,
            start_time: tag.start_time,
            completion_time: tag.completion_time,
            version: tag.version,
            image_id: tag.image_id.as_deref().map(intern),
            message: tag.message,
        }
    }
}

// --- back to the plain API types ---------------------------------------------------------------

impl From<&NodeImageSpec> for api::NodeImageSpec {
    fn from(spec: &NodeImageSpec) -> Self {
        api::NodeImageSpec {
            images: spec
                .images
                .iter()
                .map(|(name, image)| (name.to_string(), api::ImageSpec::from(&**image)))
                .collect(),
        }
    }
}

impl From<&ImageSpec> for api::ImageSpec {
    fn from(image: &ImageSpec) -> Self {
        api::ImageSpec {
            pull_secrets: image.pull_secrets.clone(),
            tags: image.tags.iter().map(api::ImageTagSpec::from).collect(),
            sandbox_config: image.sandbox_config.as_deref().cloned(),
        }
    }
}

impl From<&ImageTagSpec> for api::ImageTagSpec {
    fn from(tag: &ImageTagSpec) -> Self {
        api::ImageTagSpec {
            tag: tag.tag.to_string(),
            created_at: tag.created_at.clone(),
            pull_policy: tag.pull_policy.clone(),
            owner_references: tag
                .owner_references
                .iter()
                .map(|owner| (**owner).clone())
                .collect(),
            version: tag.version,
            image_pull_policy: tag.image_pull_policy,
            sandbox_config: tag.sandbox_config.as_deref().cloned(),
        }
    }
}

impl From<&NodeImageStatus> for api::NodeImageStatus {
    fn from(status: &NodeImageStatus) -> Self {
        api::NodeImageStatus {
            desired: status.desired,
            succeeded: status.succeeded,
            failed: status.failed,
            pulling: status.pulling,
            waiting: status.waiting,
            image_statuses: status
                .image_statuses
                .iter()
                .map(|(name, image)| (name.to_string(), api::ImageStatus::from(&**image)))
                .collect(),
            first_sync_status: status.first_sync_status.clone(),
        }
    }
}

impl From<&ImageStatus> for api::ImageStatus {
    fn from(image: &ImageStatus) -> Self {
        api::ImageStatus {
            tags: image.tags.iter().map(api::ImageTagStatus::from).collect(),
        }
    }
}

impl From<&ImageTagStatus> for api::ImageTagStatus {
    fn from(tag: &ImageTagStatus) -> Self {
        api::ImageTagStatus {
            tag: tag.tag.to_string(),
            phase: tag.phase,
            progress: tag.progress,
            start_time: tag.start_time.clone(),
            completion_time: tag.completion_time.clone(),
            version: tag.version,
            image_id: tag.image_id.as_deref().map(str::to_owned),
            message: tag.message.clone(),
        }
    }
}

#[cfg(test)]
mod sharing_tests;

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A NodeImage's spec and status with every field set, as the apiserver returns them.
    fn every_field() -> (serde_json::Value, serde_json::Value) {
        let spec = json!({"images": {
            "nginx": {
                "pullSecrets": [{"namespace": "ns", "name": "s", "mode": "batch"}],
                "sandboxConfig": {"labels": {"app": "web"}},
                "tags": [{
                    "tag": "1.27", "createdAt": "2026-01-02T03:04:05Z", "version": 2,
                    "pullPolicy": {"timeoutSeconds": 60, "backoffLimit": 1,
                                   "ttlSecondsAfterFinished": 30, "activeDeadlineSeconds": 90},
                    "imagePullPolicy": "Always",
                    "sandboxConfig": {"annotations": {"a": "b"}},
                    "ownerReferences": [{"apiVersion": "apps.kruise.io/v1beta1",
                        "kind": "ImagePullJob", "namespace": "ns", "name": "j", "uid": "u"}]
                }]
            },
            "redis": {"tags": [{"tag": "7"}]}
        }});
        let status = json!({
            "desired": 2, "succeeded": 1, "failed": 1, "pulling": 0, "waiting": 0,
            "imageStatuses": {"nginx": {"tags": [{
                "tag": "1.27", "phase": "Succeeded", "progress": 100, "version": 2,
                "startTime": "2026-01-02T03:04:06Z", "completionTime": "2026-01-02T03:04:07Z",
                "imageID": "nginx@sha256:abc", "message": "done"
            }]}},
            "firstSyncStatus": {"status": "Succeeded", "message": "m"}
        });
        (spec, status)
    }

    #[test]
    fn stored_and_plain_types_read_and_write_the_same_json() {
        let (spec, status) = every_field();
        let stored_spec: NodeImageSpec = serde_json::from_value(spec.clone()).unwrap();
        let plain_spec: api::NodeImageSpec = serde_json::from_value(spec.clone()).unwrap();
        assert_eq!(serde_json::to_value(&stored_spec).unwrap(), spec);
        assert_eq!(serde_json::to_value(&plain_spec).unwrap(), spec);
        assert_eq!(NodeImageSpec::from(plain_spec.clone()), stored_spec);
        assert_eq!(api::NodeImageSpec::from(&stored_spec), plain_spec);

        let stored_status: NodeImageStatus = serde_json::from_value(status.clone()).unwrap();
        let plain_status: api::NodeImageStatus = serde_json::from_value(status.clone()).unwrap();
        assert_eq!(serde_json::to_value(&stored_status).unwrap(), status);
        assert_eq!(serde_json::to_value(&plain_status).unwrap(), status);
        assert_eq!(NodeImageStatus::from(plain_status.clone()), stored_status);
        assert_eq!(api::NodeImageStatus::from(&stored_status), plain_status);
    }

    #[test]
    fn stored_nodeimages_share_their_image_names_tags_owner_references_and_image_ids() {
        let parse = || {
            let (spec, status) = every_field();
            let spec: NodeImageSpec = serde_json::from_value(spec).unwrap();
            let status: NodeImageStatus = serde_json::from_value(status).unwrap();
            (spec, status)
        };
        let ((spec_a, status_a), (spec_b, status_b)) = (parse(), parse());
        let same = |x: &str, y: &str| x.as_ptr() == y.as_ptr();
        let name = |spec: &NodeImageSpec| spec.images.keys().next().unwrap().clone();
        assert!(same(&name(&spec_a), &name(&spec_b)));
        let status_name = status_a.image_statuses.keys().next().unwrap();
        assert!(same(&name(&spec_a), status_name));
        let tag_a = &spec_a.images["nginx"].tags[0];
        let tag_b = &spec_b.images["nginx"].tags[0];
        assert!(same(&tag_a.tag, &tag_b.tag));
        assert!(same(
            &tag_a.tag,
            &status_b.image_statuses["nginx"].tags[0].tag
        ));
        assert!(std::sync::Arc::ptr_eq(
            &tag_a.owner_references[0],
            &tag_b.owner_references[0]
        ));
        let id = |status: &NodeImageStatus| {
            status.image_statuses["nginx"].tags[0]
                .image_id
                .clone()
                .unwrap()
        };
        assert!(std::sync::Arc::ptr_eq(&id(&status_a), &id(&status_b)));
        // Converted from the plain types, they share as parsed ones do.
        let (plain_spec, _) = every_field();
        let plain: api::NodeImageSpec = serde_json::from_value(plain_spec).unwrap();
        let converted = NodeImageSpec::from(plain);
        assert!(converted.images["nginx"].same_copy(&spec_a.images["nginx"]));
    }
}
