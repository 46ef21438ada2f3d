//! A pod as the controllers watch and store it: only the fields their decisions read.
//!
//! Pods are the biggest set the manager watches. k8s-openapi's `Pod` is large even when
//! stripped (a `Container` is 2 KiB of mostly empty fields; a stripped pod with two containers
//! took about 13.6 KiB of heap), so [`PodSummary`] is deserialized straight from the API's JSON
//! instead: unknown fields are skipped without being built, `managedFields` included. Its JSON
//! shape is the pod's, so a summary serializes back to a (partial) pod and a JSON patch computed
//! against it applies to the real one.
//!
//! Kept: name, namespace, uid, resourceVersion, creation and deletion timestamps, labels and
//! annotations (the controllers drop the annotations they do not read before storing); the
//! node name and each container's and init container's name and image (native sidecars are
//! init containers); the generation; the phase, the observed generation, the `Ready`,
//! `SidecarSetUpgradable` and resize (`PodResizePending`, `PodResizeInProgress`) conditions, and each
//! container status's and init container status's name, image, imageID, readiness and restart
//! count.
//!
//! Labels and annotations are [`Labels`], beside the metadata rather than in it: the same few
//! label values and the same long SidecarSet hash annotations recur on thousands of pods, and
//! interned they are stored once (as maps they took about 1.7 KiB a pod). `metadata.labels` and
//! `metadata.annotations` are always `None`: read [`PodSummary::labels`] and
//! [`PodSummary::annotations`] (which `pod.labels()` and `pod.annotations()` call, before
//! `ResourceExt`'s).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::interned_labels::{Interned, Labels, shared_str, shared_str_option};
use crate::compact::{compact_option_vec, compact_vec};

use kruise_rs_api::well_known::{
    SIDECARSET_HASH, SIDECARSET_HASH_WITHOUT_IMAGE, SIDECARSET_INJECTED_LIST,
    SIDECARSET_INPLACE_UPDATE_STATE, SIDECARSET_UPGRADABLE_CONDITION,
    SIDECARSET_VERSION_ALT_PREFIX, SIDECARSET_VERSION_PREFIX,
    SIDECARSET_WORKING_HOTUPGRADE_CONTAINER,
};

/// The pod conditions a summary keeps: the kubelet's resize conditions say whether a sidecar
/// resize is still under way, and why not (`Deferred`, `Infeasible`).
const KEPT_CONDITIONS: [&str; 4] = [
    "Ready",
    SIDECARSET_UPGRADABLE_CONDITION,
    POD_RESIZE_PENDING,
    POD_RESIZE_IN_PROGRESS,
];

/// The kubelet's pod condition while a resize it was asked for waits (reason `Deferred`: not
/// now, or `Infeasible`: never on this node).
pub const POD_RESIZE_PENDING: &str = "PodResizePending";
/// The kubelet's pod condition while it applies a resize.
pub const POD_RESIZE_IN_PROGRESS: &str = "PodResizeInProgress";

#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodSummary {
    /// Without labels and annotations: they are in `labels` and `annotations`.
    pub metadata: ObjectMeta,
    labels: Labels,
    /// `None` when the pod has no `metadata.annotations` at all (a patch adding the first one
    /// must create the map; one that exists, even emptied by stripping, must not be replaced).
    annotations: Option<Labels>,
    pub spec: Option<PodSpecSummary>,
    pub status: Option<PodStatusSummary>,
}

impl PodSummary {
    /// A summary of these parts; `metadata`'s labels and annotations move beside it.
    pub fn new(
        mut metadata: ObjectMeta,
        spec: Option<PodSpecSummary>,
        status: Option<PodStatusSummary>,
    ) -> Self {
        let labels = metadata
            .labels
            .take()
            .map(|m| Labels::from(&m))
            .unwrap_or_default();
        let annotations = metadata.annotations.take().map(|m| Labels::from(&m));
        PodSummary {
            metadata,
            labels,
            annotations,
            spec,
            status,
        }
    }

    /// Its labels (an inherent method: `pod.labels()` finds it before `ResourceExt::labels`,
    /// which would read the empty `metadata.labels`).
    pub fn labels(&self) -> &Labels {
        &self.labels
    }

    /// Its labels, to change in a test.
    #[doc(hidden)]
    pub fn labels_mut(&mut self) -> &mut Labels {
        &mut self.labels
    }

    /// Its (kept) annotations; empty when it has none.
    pub fn annotations(&self) -> &Labels {
        static NONE: std::sync::LazyLock<Labels> = std::sync::LazyLock::new(Labels::default);
        self.annotations.as_ref().unwrap_or(&NONE)
    }

    /// Whether it has a `metadata.annotations` map at all.
    pub fn has_annotations(&self) -> bool {
        self.annotations.is_some()
    }

    /// Annotation `key`'s value.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.as_ref()?.get(key)
    }

    /// Annotation `key`'s value as the interned string the summary holds.
    pub fn annotation_shared(&self, key: &str) -> Option<&Interned> {
        self.annotations.as_ref()?.get_shared(key)
    }

    /// Its annotations as the API types hold them (for a patch computed against them).
    pub fn annotation_map(&self) -> Option<BTreeMap<String, String>> {
        self.annotations.as_ref().map(Labels::to_map)
    }

    /// Sets annotation `key` (creating the map if it has none).
    pub fn set_annotation(&mut self, key: &str, value: &str) {
        self.annotations
            .get_or_insert_with(Labels::default)
            .insert(key, value);
    }

    /// Removes annotation `key`.
    pub fn remove_annotation(&mut self, key: &str) {
        if let Some(all) = self.annotations.as_mut() {
            all.retain_shared(|k| k != key);
        }
    }

    /// Replaces its labels.
    pub fn set_labels(&mut self, labels: &BTreeMap<String, String>) {
        self.labels = Labels::from(labels);
    }
}

/// Serializes as the (partial) pod it summarizes, labels and annotations in the metadata.
impl Serialize for PodSummary {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Out<'a> {
            metadata: ObjectMeta,
            #[serde(skip_serializing_if = "Option::is_none")]
            spec: &'a Option<PodSpecSummary>,
            #[serde(skip_serializing_if = "Option::is_none")]
            status: &'a Option<PodStatusSummary>,
        }
        let mut metadata = self.metadata.clone();
        if !self.labels.is_empty() {
            metadata.labels = Some(self.labels.to_map());
        }
        metadata.annotations = self.annotation_map();
        Out {
            metadata,
            spec: &self.spec,
            status: &self.status,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for PodSummary {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Wire {
            #[serde(default)]
            metadata: Option<SummaryMetadata>,
            #[serde(default)]
            spec: Option<PodSpecSummary>,
            #[serde(default)]
            status: Option<PodStatusSummary>,
        }
        let wire = Wire::deserialize(d)?;
        let kept = wire.metadata.unwrap_or_default();
        Ok(PodSummary {
            metadata: ObjectMeta {
                name: kept.name,
                namespace: kept.namespace,
                uid: kept.uid,
                resource_version: kept.resource_version,
                generation: kept.generation,
                creation_timestamp: kept.creation_timestamp,
                deletion_timestamp: kept.deletion_timestamp,
                ..ObjectMeta::default()
            },
            labels: kept.labels.unwrap_or_default(),
            annotations: kept.annotations,
            spec: wire.spec,
            status: wire.status,
        })
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpecSummary {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(default, deserialize_with = "compact_vec")]
    pub containers: Vec<ContainerSummary>,
    /// All of them, in spec order (a patch addresses one by its index); native sidecars are
    /// among them.
    #[serde(
        default,
        deserialize_with = "compact_vec",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub init_containers: Vec<ContainerSummary>,
}

/// A container's name and image. Both are interned: the same few recur on every pod of a
/// workload (as are a status's image and imageID).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ContainerSummary {
    #[serde(default, with = "shared_str")]
    pub name: Interned,
    #[serde(
        default,
        with = "shared_str_option",
        skip_serializing_if = "Option::is_none"
    )]
    pub image: Option<Interned>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatusSummary {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The `metadata.generation` the kubelet last acted on (Kubernetes 1.34 on, or 1.33 with
    /// `PodObservedGenerationTracking`): behind the generation, a spec change such as a resize
    /// has not been seen by the kubelet yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(
        default,
        deserialize_with = "kept_conditions",
        skip_serializing_if = "Option::is_none"
    )]
    pub conditions: Option<Vec<PodCondition>>,
    #[serde(
        default,
        deserialize_with = "compact_option_vec",
        skip_serializing_if = "Option::is_none"
    )]
    pub container_statuses: Option<Vec<ContainerStatusSummary>>,
    #[serde(
        default,
        deserialize_with = "compact_option_vec",
        skip_serializing_if = "Option::is_none"
    )]
    pub init_container_statuses: Option<Vec<ContainerStatusSummary>>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatusSummary {
    #[serde(default, with = "shared_str")]
    pub name: Interned,
    #[serde(default, with = "shared_str")]
    pub image: Interned,
    #[serde(rename = "imageID", default, with = "shared_str")]
    pub image_id: Interned,
    #[serde(default)]
    pub ready: bool,
    #[serde(default)]
    pub restart_count: i32,
}

impl k8s_openapi::Resource for PodSummary {
    const API_VERSION: &'static str = "v1";
    const GROUP: &'static str = "";
    const KIND: &'static str = "Pod";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "pods";
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for PodSummary {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The annotations the controllers read (only the SidecarSet controller reads any); a stored
/// pod keeps only these.
const READ_ANNOTATIONS: [&str; 5] = [
    SIDECARSET_HASH,
    SIDECARSET_HASH_WITHOUT_IMAGE,
    SIDECARSET_INJECTED_LIST,
    SIDECARSET_INPLACE_UPDATE_STATE,
    SIDECARSET_WORKING_HOTUPGRADE_CONTAINER,
];

/// Prefixes of the per-container annotations the controllers read (hot upgrade's twin
/// versions, one key per twin).
const READ_ANNOTATION_PREFIXES: [&str; 2] =
    [SIDECARSET_VERSION_PREFIX, SIDECARSET_VERSION_ALT_PREFIX];

/// Keeps only the annotations the controllers read; the rest of a [`PodSummary`] is what they
/// read already. What remains is also what the SidecarSet upgrade patch needs, except the other
/// annotations `patchPodMetadata` may touch (the controller reads the live pod then).
pub fn strip_pod(pod: &mut PodSummary) {
    if let Some(all) = pod.annotations.as_mut() {
        all.retain_shared(|k| {
            READ_ANNOTATIONS.contains(&k)
                || READ_ANNOTATION_PREFIXES.iter().any(|p| k.starts_with(p))
        });
    }
}

impl PodSummary {
    /// Keeps only the annotations named in `keys`.
    pub fn retain_annotations(&mut self, keys: &[&str]) {
        if let Some(all) = self.annotations.as_mut() {
            all.retain_shared(|k| keys.contains(&k));
        }
    }
}

/// The metadata fields a summary keeps; everything else (managedFields, ownerReferences,
/// finalizers, ...) is skipped while parsing. The annotations are not interned yet: most are
/// about to be dropped ([`strip_pod`] interns the rest).
#[derive(Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct SummaryMetadata {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    generation: Option<i64>,
    labels: Option<Labels>,
    #[serde(deserialize_with = "Labels::deserialize_unshared")]
    annotations: Option<Labels>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
}

fn kept_conditions<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<PodCondition>>, D::Error> {
    Ok(Option::<Vec<PodCondition>>::deserialize(d)?.map(|mut all| {
        all.retain(|c| KEPT_CONDITIONS.contains(&c.type_.as_str()));
        all.shrink_to_fit();
        all
    }))
}

// A Vec grown while parsing has room for twice its items (four at least); stored pods keep
// exactly theirs (measured: 0.7 KiB less per pod with two containers and four conditions).
#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    use super::*;

    fn full_pod() -> serde_json::Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "web-0", "namespace": "shop", "uid": "u-1", "resourceVersion": "42",
                "generateName": "web-",
                "creationTimestamp": "2026-11-29T10:00:00Z",
                "labels": {"app": "web"},
                "annotations": {"kruise.io/sidecarset-injected-list": "mesh", "big": "x".repeat(4096)},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "r"}],
                "finalizers": ["example.com/keep"],
                "managedFields": [{"manager": "kubectl", "operation": "Apply", "fieldsType": "FieldsV1",
                                   "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}}}}}],
            },
            "spec": {
                "nodeName": "node-1",
                "serviceAccountName": "default",
                "volumes": [{"name": "v", "emptyDir": {}}],
                "containers": [
                    {"name": "proxy", "image": "proxy:1", "env": [{"name": "A", "value": "b"}],
                     "resources": {"limits": {"memory": "64Mi"}}, "volumeMounts": [{"name": "v", "mountPath": "/v"}]},
                    {"name": "app", "image": "shop:1", "ports": [{"containerPort": 80}]},
                ],
                "initContainers": [
                    {"name": "init", "image": "init:1", "command": ["true"]},
                    {"name": "agent", "image": "agent:1", "restartPolicy": "Always"},
                ],
            },
            "status": {
                "phase": "Running",
                "hostIP": "127.0.0.1",
                "conditions": [
                    {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-29T10:01:00Z"},
                    {"type": "PodScheduled", "status": "True"},
                    {"type": SIDECARSET_UPGRADABLE_CONDITION, "status": "False", "message": "{\"mesh\":false}"},
                ],
                "containerStatuses": [
                    {"name": "proxy", "image": "proxy:1", "imageID": "proxy@sha256:p", "ready": true,
                     "restartCount": 2, "started": true, "state": {"running": {"startedAt": "2026-11-29T10:00:30Z"}}},
                    {"name": "app", "image": "shop:1", "imageID": "shop@sha256:a", "ready": false, "restartCount": 0},
                ],
                "initContainerStatuses": [
                    {"name": "init", "image": "init:1", "imageID": "init@sha256:i", "ready": false, "restartCount": 0,
                     "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
                    {"name": "agent", "image": "agent:1", "imageID": "agent@sha256:g", "ready": true, "restartCount": 1,
                     "started": true, "state": {"running": {"startedAt": "2026-11-29T10:00:10Z"}}},
                ],
            }
        })
    }

    #[test]
    fn a_summary_keeps_what_the_decisions_read_and_nothing_else() {
        let pod: PodSummary = serde_json::from_value(full_pod()).expect("a pod parses");
        let meta = &pod.metadata;
        assert_eq!(meta.name.as_deref(), Some("web-0"));
        assert_eq!(meta.namespace.as_deref(), Some("shop"));
        assert_eq!(meta.uid.as_deref(), Some("u-1"));
        assert_eq!(meta.resource_version.as_deref(), Some("42"));
        assert!(meta.creation_timestamp.is_some());
        assert!(
            meta.labels.is_none() && meta.annotations.is_none(),
            "kept beside"
        );
        assert_eq!(pod.labels().get("app"), Some("web"));
        assert_eq!(pod.labels().len(), 1);
        assert_eq!(pod.annotations().len(), 2);
        assert!(pod.has_annotations());
        assert!(meta.managed_fields.is_none() && meta.owner_references.is_none());
        assert!(meta.finalizers.is_none() && meta.generate_name.is_none());

        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.node_name.as_deref(), Some("node-1"));
        let containers: Vec<(&str, Option<&str>)> = spec
            .containers
            .iter()
            .map(|c| (&*c.name, c.image.as_deref()))
            .collect();
        assert_eq!(
            containers,
            [("proxy", Some("proxy:1")), ("app", Some("shop:1"))]
        );
        let init: Vec<(&str, Option<&str>)> = spec
            .init_containers
            .iter()
            .map(|c| (&*c.name, c.image.as_deref()))
            .collect();
        assert_eq!(init, [("init", Some("init:1")), ("agent", Some("agent:1"))]);

        let status = pod.status.as_ref().expect("status");
        assert_eq!(status.phase.as_deref(), Some("Running"));
        let kept: Vec<&str> = status
            .conditions
            .iter()
            .flatten()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(kept, ["Ready", SIDECARSET_UPGRADABLE_CONDITION]);
        let statuses = status.container_statuses.as_ref().expect("statuses");
        assert_eq!(
            statuses[0],
            ContainerStatusSummary {
                name: "proxy".into(),
                image: "proxy:1".into(),
                image_id: "proxy@sha256:p".into(),
                ready: true,
                restart_count: 2,
            }
        );
        assert!(!statuses[1].ready);
        let init = status
            .init_container_statuses
            .as_ref()
            .expect("init statuses");
        assert_eq!(
            init[1],
            ContainerStatusSummary {
                name: "agent".into(),
                image: "agent:1".into(),
                image_id: "agent@sha256:g".into(),
                ready: true,
                restart_count: 1,
            }
        );
        assert_eq!(&*init[0].name, "init");
    }

    #[test]
    fn a_summary_serializes_as_the_same_fields_of_the_pod() {
        let summary: PodSummary = serde_json::from_value(full_pod()).expect("parses");
        let again: PodSummary =
            serde_json::from_value(serde_json::to_value(&summary).expect("serializes"))
                .expect("parses back");
        assert_eq!(again, summary);
        // The same JSON read as a full Pod agrees on every kept field.
        let pod: Pod =
            serde_json::from_value(serde_json::to_value(&summary).expect("json")).expect("a Pod");
        let full: Pod = serde_json::from_value(full_pod()).expect("a Pod");
        let spec = pod.spec.expect("spec");
        assert_eq!(spec.node_name, full.spec.as_ref().unwrap().node_name);
        assert_eq!(spec.containers[1].name, "app");
        assert_eq!(spec.containers[1].image.as_deref(), Some("shop:1"));
        let status = pod.status.expect("status");
        assert_eq!(
            status.container_statuses.expect("statuses")[0].restart_count,
            2
        );
        assert_eq!(
            status.init_container_statuses.expect("init statuses")[1].image_id,
            "agent@sha256:g"
        );
        let init = spec.init_containers.expect("init containers");
        assert_eq!(init[1].name, "agent");
        assert_eq!(init[1].image.as_deref(), Some("agent:1"));
        // A pod without init containers serializes without the list.
        let plain = PodSummary {
            spec: Some(PodSpecSummary::default()),
            ..PodSummary::default()
        };
        let json = serde_json::to_value(&plain).expect("json");
        assert!(json["spec"].get("initContainers").is_none(), "{json}");
    }

    #[test]
    fn missing_or_null_parts_are_empty_not_errors() {
        for value in [
            json!({}),
            json!({"metadata": null, "spec": null, "status": null}),
            json!({"metadata": {"name": "p"}, "spec": {}, "status": {"conditions": null}}),
            json!({"spec": {"containers": [{}]}, "status": {"containerStatuses": [{}]}}),
        ] {
            let pod: Result<PodSummary, _> = serde_json::from_value(value.clone());
            assert!(pod.is_ok(), "{value}: {pod:?}");
        }
    }

    #[test]
    fn labels_and_annotations_serialize_back_into_the_metadata() {
        let pod: PodSummary = serde_json::from_value(full_pod()).expect("parses");
        let json = serde_json::to_value(&pod).expect("json");
        assert_eq!(json["metadata"]["labels"], json!({"app": "web"}));
        assert_eq!(
            json["metadata"]["annotations"],
            full_pod()["metadata"]["annotations"]
        );
        let again: PodSummary = serde_json::from_value(json).expect("parses again");
        assert_eq!(again, pod);
        // A map emptied by stripping is still there (a patch must not replace it).
        let mut stripped: PodSummary =
            serde_json::from_value(json!({"metadata": {"annotations": {"team": "a"}}}))
                .expect("parses");
        strip_pod(&mut stripped);
        assert!(stripped.has_annotations() && stripped.annotations().is_empty());
        let bare: PodSummary = serde_json::from_value(json!({"metadata": {}})).expect("parses");
        assert!(!bare.has_annotations());
        let json = serde_json::to_value(&bare).expect("json");
        assert!(json["metadata"].get("annotations").is_none(), "{json}");
    }

    #[test]
    fn stripped_pods_share_their_annotation_values() {
        let hash = r#"{"mesh":{"hash":"h-shared-by-stripped-pods","sidecarSetName":"mesh"}}"#;
        let pods: Vec<PodSummary> = ["a", "b"]
            .into_iter()
            .map(|name| {
                let mut pod: PodSummary = serde_json::from_value(json!({"metadata": {
                    "name": name, "labels": {"app": "web"},
                    "annotations": {SIDECARSET_HASH: hash}}}))
                .expect("parses");
                strip_pod(&mut pod);
                pod
            })
            .collect();
        fn value(p: &PodSummary) -> &str {
            p.annotation(SIDECARSET_HASH).expect("kept")
        }
        assert_eq!(value(&pods[0]), hash);
        assert!(std::ptr::eq(value(&pods[0]), value(&pods[1])));
        assert!(std::ptr::eq(
            pods[0].labels().get("app").expect("label"),
            pods[1].labels().get("app").expect("label")
        ));
    }

    #[test]
    fn retain_annotations_keeps_only_the_named_ones() {
        let mut pod: PodSummary = serde_json::from_value(full_pod()).expect("parses");
        pod.retain_annotations(&["kruise.io/sidecarset-injected-list"]);
        let keys: Vec<&str> = pod.annotations().iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["kruise.io/sidecarset-injected-list"]);
    }

    #[test]
    fn stripping_keeps_the_sidecarset_annotations_and_the_twin_versions() {
        let mut pod: PodSummary = serde_json::from_value(json!({"metadata": {"annotations": {
            "kruise.io/sidecarset-hash": "{}",
            "kruise.io/sidecarset-working-hotupgrade-container": "{\"proxy\":\"proxy-1\"}",
            "version.sidecarset.kruise.io/proxy-1": "1",
            "versionalt.sidecarset.kruise.io/proxy-1": "0",
            "deployment.kubernetes.io/revision": "3",
            "team": "a",
        }}}))
        .expect("parses");
        strip_pod(&mut pod);
        let keys: Vec<&str> = pod.annotations().iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            [
                "kruise.io/sidecarset-hash",
                "kruise.io/sidecarset-working-hotupgrade-container",
                "version.sidecarset.kruise.io/proxy-1",
                "versionalt.sidecarset.kruise.io/proxy-1",
            ]
        );
    }
}
