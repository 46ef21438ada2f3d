//! NodeImages as the manager stores them: parsed without their managedFields, their labels
//! interned, their spec and status compact.
//!
//! A NodeImage's managedFields are most of its JSON once jobs have written it (one entry per
//! writer, each a tree of field paths), and k8s-openapi parses them into `serde_json::Value`
//! maps. Every watch event and every patch response carries them, and nothing here reads them:
//! [`LeanNodeImage`] parses a NodeImage with serde skipping them unbuilt, and is what the
//! manager watches and patches NodeImages as.
//!
//! Its labels are the Node's (the NodeImage controller copies them): as a map, a cloud node's 17
//! labels cost about 2.3 KiB per NodeImage, the same strings for thousands of them. They are
//! kept as [`Labels`] beside the NodeImage instead, so each distinct string is stored once; the
//! rest of the metadata is kept whole. Its spec and status are the compact forms of
//! [`crate::compact_nodeimage`].
//!
//! `watch_nodeimages` is the one NodeImage watch and store the NodeImage, ImagePullJob and
//! SidecarSet controllers share (each stored its own copy of every NodeImage before).

use std::collections::BTreeMap;
use std::future::Future;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::compact_nodeimage::{NodeImageSpec, NodeImageStatus};
use kruise_rs_api::nodeimage::NodeImage;
use kruise_rs_controller::interned_labels::Labels;
use kruise_rs_controller::pod_feed::{Feed, SharedWatch};

/// A NodeImage as the manager stores it: managedFields left unparsed, labels interned, spec and
/// status compact. `metadata.labels` is always `None`: read [`LeanNodeImage::labels`] (which
/// `ni.labels()` calls), never the metadata's. Serializes as the whole NodeImage, labels in the
/// metadata.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LeanNodeImage {
    /// Without labels (they are in `labels`) and managedFields.
    pub metadata: ObjectMeta,
    pub spec: NodeImageSpec,
    pub status: Option<NodeImageStatus>,
    labels: Labels,
}

impl LeanNodeImage {
    /// A NodeImage named `name` with `spec`, nothing else set (as `NodeImage::new`).
    #[cfg(test)]
    pub(crate) fn new(name: &str, spec: NodeImageSpec) -> Self {
        LeanNodeImage {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec,
            status: None,
            labels: Labels::default(),
        }
    }

    /// Its labels (an inherent method, so it is what `ni.labels()` finds before
    /// `ResourceExt::labels`, which would read the empty `metadata.labels`).
    pub fn labels(&self) -> &Labels {
        &self.labels
    }
}

impl From<NodeImage> for LeanNodeImage {
    fn from(nodeimage: NodeImage) -> Self {
        let mut metadata = nodeimage.metadata;
        let labels = metadata
            .labels
            .take()
            .map(|map| Labels::from(&map))
            .unwrap_or_default();
        metadata.managed_fields = None;
        LeanNodeImage {
            metadata,
            spec: nodeimage.spec.into(),
            status: nodeimage.status.map(NodeImageStatus::from),
            labels,
        }
    }
}

impl From<&LeanNodeImage> for NodeImage {
    fn from(lean: &LeanNodeImage) -> Self {
        let mut nodeimage = NodeImage::new("", (&lean.spec).into());
        nodeimage.metadata = lean.metadata.clone();
        if !lean.labels.is_empty() {
            nodeimage.metadata.labels = Some(lean.labels.to_map());
        }
        nodeimage.status = lean.status.as_ref().map(Into::into);
        nodeimage
    }
}

impl Serialize for LeanNodeImage {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        /// What a NodeImage serializes as, borrowed.
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Whole<'a> {
            api_version: &'static str,
            kind: &'static str,
            metadata: &'a ObjectMeta,
            spec: &'a NodeImageSpec,
            #[serde(skip_serializing_if = "Option::is_none")]
            status: &'a Option<NodeImageStatus>,
        }
        let labelled;
        let metadata = if self.labels.is_empty() {
            &self.metadata
        } else {
            labelled = ObjectMeta {
                labels: Some(self.labels.to_map()),
                ..self.metadata.clone()
            };
            &labelled
        };
        Whole {
            api_version: <Self as k8s_openapi::Resource>::API_VERSION,
            kind: <Self as k8s_openapi::Resource>::KIND,
            metadata,
            spec: &self.spec,
            status: &self.status,
        }
        .serialize(s)
    }
}

/// Every `ObjectMeta` field but `managedFields`, which serde skips without building.
#[derive(Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct MetadataWithoutManagedFields {
    annotations: Option<BTreeMap<String, String>>,
    creation_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    generate_name: Option<String>,
    generation: Option<i64>,
    labels: Option<Labels>,
    name: Option<String>,
    namespace: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
    resource_version: Option<String>,
    self_link: Option<String>,
    uid: Option<String>,
}

impl MetadataWithoutManagedFields {
    /// The metadata without its labels, and the labels.
    fn split(self) -> (ObjectMeta, Labels) {
        let m = self;
        let metadata = ObjectMeta {
            annotations: m.annotations,
            creation_timestamp: m.creation_timestamp,
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
            deletion_timestamp: m.deletion_timestamp,
            finalizers: m.finalizers,
            generate_name: m.generate_name,
            generation: m.generation,
            labels: None,
            managed_fields: None,
            name: m.name,
            namespace: m.namespace,
            owner_references: m.owner_references,
            resource_version: m.resource_version,
            self_link: m.self_link,
            uid: m.uid,
        };
        (metadata, m.labels.unwrap_or_default())
    }
}

/// The NodeImage fields, as on the wire (apiVersion and kind are implied by the type).
#[derive(Deserialize)]
struct Wire {
    #[serde(default)]
    metadata: Option<MetadataWithoutManagedFields>,
    #[serde(default)]
    spec: NodeImageSpec,
    #[serde(default)]
    status: Option<NodeImageStatus>,
}

impl<'de> Deserialize<'de> for LeanNodeImage {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let wire = Wire::deserialize(d)?;
        let (metadata, labels) = wire.metadata.unwrap_or_default().split();
        Ok(LeanNodeImage {
            metadata,
            spec: wire.spec,
            status: wire.status,
            labels,
        })
    }
}

impl k8s_openapi::Resource for LeanNodeImage {
    const API_VERSION: &'static str = "apps.kruise.io/v1beta1";
    const GROUP: &'static str = "apps.kruise.io";
    const KIND: &'static str = "NodeImage";
    const VERSION: &'static str = "v1beta1";
    const URL_PATH_SEGMENT: &'static str = "nodeimages";
    type Scope = k8s_openapi::ClusterResourceScope;
}

impl k8s_openapi::Metadata for LeanNodeImage {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The NodeImage API on `client`'s apiserver, every response parsed without managedFields.
pub(crate) fn api(client: Client) -> Api<LeanNodeImage> {
    Api::all(client)
}

/// What one controller gets of the shared NodeImage watch.
pub type NodeImageFeed = Feed<LeanNodeImage>;

/// Watches every NodeImage `config` selects for `consumers` controllers, into one store.
/// Returns the future that drives the watch (run it alongside the controllers; it ends when
/// every feed is dropped) and one feed per consumer.
pub fn watch_nodeimages(
    client: Client,
    config: watcher::Config,
    consumers: usize,
) -> (impl Future<Output = ()>, Vec<NodeImageFeed>) {
    let (drive, shared) = share_nodeimages(client, config);
    (drive, shared.feeds(consumers))
}

/// The NodeImage watch of [`watch_nodeimages`], handing out feeds for as long as the
/// [`SharedWatch`] (or a clone, or a feed) lives.
pub fn share_nodeimages(
    client: Client,
    config: watcher::Config,
) -> (impl Future<Output = ()>, SharedWatch<LeanNodeImage>) {
    let (store, writer) = reflector::store();
    let events = watcher(api(client), config)
        .default_backoff()
        .reflect(writer);
    SharedWatch::new(events, store)
}

#[cfg(test)]
mod tests {
    use kube::Resource;
    use serde_json::json;

    use super::*;

    fn stored() -> serde_json::Value {
        json!({
            "apiVersion": "apps.kruise.io/v1beta1",
            "kind": "NodeImage",
            "metadata": {
                "name": "node-1",
                "uid": "u-1",
                "resourceVersion": "42",
                "generation": 3,
                "creationTimestamp": "2026-01-02T03:04:05Z",
                "labels": {"kubernetes.io/hostname": "node-1", "topology.kubernetes.io/zone": "z1"},
                "annotations": {"a": "b"},
                "finalizers": ["f"],
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "node-1", "uid": "n-1"}],
                "managedFields": [{
                    "manager": "kruise-rs-imagepulljob", "operation": "Update",
                    "apiVersion": "apps.kruise.io/v1beta1", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {"f:images": {"f:nginx": {".": {}, "f:tags": {}}}}}
                }]
            },
            "spec": {"images": {"nginx": {"tags": [{"tag": "1.25", "version": 0}]}}},
            "status": {"desired": 1, "pulling": 1}
        })
    }

    #[test]
    fn parses_all_of_a_nodeimage_but_its_managed_fields() {
        let lean: LeanNodeImage = serde_json::from_value(stored()).unwrap();
        let mut full: NodeImage = serde_json::from_value(stored()).unwrap();
        assert!(full.metadata.managed_fields.is_some());
        full.metadata.managed_fields = None;
        assert_eq!(lean.metadata.labels, None, "the labels are kept beside");
        assert_eq!(lean.labels().get("topology.kubernetes.io/zone"), Some("z1"));
        assert_eq!(lean.labels().len(), 2);
        assert_eq!(NodeImage::from(&lean), full);
        assert_eq!(LeanNodeImage::from(full), lean);
    }

    #[test]
    fn an_object_without_metadata_spec_or_status_parses_empty() {
        let lean: LeanNodeImage = serde_json::from_value(
            json!({"apiVersion": "apps.kruise.io/v1beta1", "kind": "NodeImage"}),
        )
        .unwrap();
        let mut empty = NodeImage::new("", Default::default());
        empty.metadata = ObjectMeta::default();
        assert!(lean.labels().is_empty());
        assert_eq!(NodeImage::from(&lean), empty);
    }

    #[test]
    fn names_the_nodeimage_api() {
        assert_eq!(LeanNodeImage::kind(&()), NodeImage::kind(&()));
        assert_eq!(LeanNodeImage::api_version(&()), NodeImage::api_version(&()));
        assert_eq!(LeanNodeImage::plural(&()), NodeImage::plural(&()));
        assert_eq!(
            serde_json::to_value(LeanNodeImage::from(NodeImage::new("n", Default::default())))
                .unwrap(),
            serde_json::to_value(NodeImage::new("n", Default::default())).unwrap()
        );
        let lean: LeanNodeImage = serde_json::from_value(stored()).unwrap();
        let mut full: NodeImage = serde_json::from_value(stored()).unwrap();
        full.metadata.managed_fields = None;
        assert_eq!(
            serde_json::to_value(&lean).unwrap(),
            serde_json::to_value(&full).unwrap(),
            "serializes with its labels in the metadata"
        );
    }
}
