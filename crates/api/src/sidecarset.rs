//! SidecarSet: sidecar containers injected into matching pods and upgraded in place.
//!
//! Cluster-scoped. The JSON shape is upstream's v1beta1 plus v1alpha1's `spec.namespace`, so one
//! schema serves both versions and the apiserver needs no conversion webhook (see the README's
//! design notes). [`SidecarSetSpec::effective_namespace_selector`] and
//! [`SidecarSet::custom_version`] give both versions' spellings one meaning.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, LocalObjectReference, ObjectFieldSelector, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use super::common::named_objects_schema;
use super::well_known::{NAMESPACE_NAME_LABEL, SIDECARSET_CUSTOM_VERSION_LABEL};

/// Desired state of a SidecarSet.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "apps.kruise.io",
    version = "v1beta1",
    kind = "SidecarSet",
    status = "SidecarSetStatus",
    derive = "Default",
    derive = "PartialEq",
    doc = "SidecarSet injects sidecar containers into matching pods and upgrades them in place.",
    printcolumn = r#"{"name": "MATCHED", "type": "integer", "jsonPath": ".status.matchedPods", "description": "The number of pods matched."}"#,
    printcolumn = r#"{"name": "UPDATED", "type": "integer", "jsonPath": ".status.updatedPods", "description": "The number of pods matched and updated."}"#,
    printcolumn = r#"{"name": "READY", "type": "integer", "jsonPath": ".status.readyPods", "description": "The number of pods matched and ready."}"#,
    printcolumn = r#"{"name": "AGE", "type": "date", "jsonPath": ".metadata.creationTimestamp", "description": "Time since the SidecarSet was created."}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SidecarSetSpec {
    /// Pods to inject sidecars into and upgrade. Required and non-empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,

    /// v1alpha1 only: the single namespace this SidecarSet applies to. Equivalent to a
    /// `namespaceSelector` on `kubernetes.io/metadata.name`, and wins over it when both are set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,

    /// Namespaces (by their labels) this SidecarSet applies to; unset means all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,

    /// Init containers injected at pod creation only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "sidecar_containers_schema")]
    pub init_containers: Vec<SidecarContainer>,

    /// Sidecar containers injected at pod creation and upgraded in place.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "sidecar_containers_schema")]
    pub containers: Vec<SidecarContainer>,

    /// Volumes the sidecars may mount; only those an injected container uses are added to a pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "named_objects_schema")]
    pub volumes: Vec<Volume>,

    /// How existing pods are upgraded when the sidecars change.
    #[serde(default)]
    #[schemars(extend("default" = {}))]
    pub update_strategy: SidecarSetUpdateStrategy,

    /// How new pods are injected.
    #[serde(default)]
    pub injection_strategy: SidecarSetInjectionStrategy,

    /// Pull secrets appended to injected pods, at most 16; they must exist in each pod's
    /// namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = crate::limits::MAX_PULL_SECRETS))]
    pub image_pull_secrets: Vec<LocalObjectReference>,

    /// How many ControllerRevisions to keep. Defaults to 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 10))]
    pub revision_history_limit: Option<i32>,

    /// Annotations patched onto pods at injection and in-place upgrade.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patch_pod_metadata: Vec<SidecarSetPatchPodMetadata>,

    /// v1beta1's spelling of v1alpha1's `apps.kruise.io/sidecarset-custom-version` label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_version: Option<String>,
}

impl SidecarSetSpec {
    /// The namespace selector this SidecarSet really uses: v1alpha1's `namespace` (converted the
    /// way upstream converts it) wins over `namespaceSelector`; `None` means every namespace.
    pub fn effective_namespace_selector(&self) -> Option<LabelSelector> {
        match self.namespace.as_deref() {
            Some(ns) if !ns.is_empty() => Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    NAMESPACE_NAME_LABEL.to_owned(),
                    ns.to_owned(),
                )])),
                match_expressions: None,
            }),
            _ => self.namespace_selector.clone(),
        }
    }
}

impl SidecarSet {
    /// The custom version, from v1beta1's `spec.customVersion` or else v1alpha1's label.
    pub fn custom_version(&self) -> Option<&str> {
        self.spec
            .custom_version
            .as_deref()
            .filter(|v| !v.is_empty())
            .or_else(|| {
                self.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(SIDECARSET_CUSTOM_VERSION_LABEL))
                    .map(String::as_str)
                    .filter(|v| !v.is_empty())
            })
    }
}

/// A core Container plus the SidecarSet-specific fields, flattened into one JSON object.
/// Deserialized by hand (`sidecar_container_de`) rather than with `#[serde(flatten)]`, which
/// reads the Container part from a buffer and so loses the path of an error inside it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SidecarContainer {
    #[serde(flatten)]
    pub container: Container,

    /// Where the sidecar goes relative to the pod's own containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_inject_policy: Option<PodInjectPolicy>,

    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_strategy: Option<SidecarContainerUpgradeStrategy>,

    /// Whether the sidecar mounts the app containers' volumes too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_volume_policy: Option<ShareVolumePolicy>,

    /// Whether the sidecar gets the app containers' volume devices too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_volume_device_policy: Option<ShareVolumePolicy>,

    /// Environment variables copied from an app container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub transfer_env: Vec<TransferEnvVar>,

    /// Sidecar resources computed from the app containers' resources at pod creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources_policy: Option<ResourcesPolicy>,

    /// Container fields the Kubernetes types this crate is built against (1.33) do not know
    /// (`restartPolicyRules`, 1.35), as written. Kept so that injection gives them to the pod
    /// and the cluster's apiserver, not this crate's age, decides what they mean.
    #[serde(flatten)]
    pub unknown_fields: BTreeMap<String, serde_json::Value>,
}

impl<'de> Deserialize<'de> for SidecarContainer {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(sidecar_container_de::SidecarContainerVisitor)
    }
}

/// [`SidecarContainer`]'s deserialization: the object's keys go to `Container`'s own visitor
/// straight from the deserializer's map, except the SidecarSet fields and the fields
/// `Container` does not know, taken out on the way. Every value is read from the original map,
/// so a deserializer that tracks paths (`serde_path_to_error`) names the field inside the
/// container that failed.
mod sidecar_container_de {
    use std::fmt;
    use std::sync::LazyLock;

    use k8s_openapi::api::core::v1::Container;
    use serde::de::value::MapAccessDeserializer;
    use serde::de::{DeserializeSeed, IntoDeserializer, MapAccess, Visitor};
    use serde::{Deserialize, Deserializer};

    use super::SidecarContainer;

    /// The JSON names of `Container`'s fields, as its `Deserialize` declares them to
    /// `deserialize_struct` (k8s-openapi lists every field there).
    pub(super) static CONTAINER_FIELDS: LazyLock<&'static [&'static str]> = LazyLock::new(|| {
        let mut fields = None;
        // Fails by design once the names are seen.
        let _ = Container::deserialize(FieldNames(&mut fields));
        fields.unwrap_or_default()
    });

    /// A deserializer that only records the field names a struct asks for.
    struct FieldNames<'a>(&'a mut Option<&'static [&'static str]>);

    impl<'de> Deserializer<'de> for FieldNames<'_> {
        type Error = serde::de::value::Error;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(serde::de::Error::custom(
                "only a struct's field names are read",
            ))
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            visitor: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = Some(fields);
            self.deserialize_any(visitor)
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
            option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
            ignored_any
        }
    }

    pub(super) struct SidecarContainerVisitor;

    impl<'de> Visitor<'de> for SidecarContainerVisitor {
        type Value = SidecarContainer;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a sidecar container object")
        }

        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<SidecarContainer, A::Error> {
            let mut sidecar = SidecarContainer::default();
            let container = Container::deserialize(MapAccessDeserializer::new(ContainerFields {
                map,
                sidecar: &mut sidecar,
            }))?;
            sidecar.container = container;
            Ok(sidecar)
        }
    }

    /// The container's map with the SidecarSet fields read into `sidecar` as they pass.
    struct ContainerFields<'s, A> {
        map: A,
        sidecar: &'s mut SidecarContainer,
    }

    impl<'de, A: MapAccess<'de>> MapAccess<'de> for ContainerFields<'_, A> {
        type Error = A::Error;

        fn next_key_seed<K: DeserializeSeed<'de>>(
            &mut self,
            seed: K,
        ) -> Result<Option<K::Value>, A::Error> {
            loop {
                let Some(key) = self.map.next_key::<String>()? else {
                    return Ok(None);
                };
                let sidecar = &mut *self.sidecar;
                match key.as_str() {
                    "podInjectPolicy" => sidecar.pod_inject_policy = self.map.next_value()?,
                    "upgradeStrategy" => sidecar.upgrade_strategy = self.map.next_value()?,
                    "shareVolumePolicy" => sidecar.share_volume_policy = self.map.next_value()?,
                    "shareVolumeDevicePolicy" => {
                        sidecar.share_volume_device_policy = self.map.next_value()?;
                    }
                    "transferEnv" => sidecar.transfer_env = self.map.next_value()?,
                    "resourcesPolicy" => sidecar.resources_policy = self.map.next_value()?,
                    _ if !CONTAINER_FIELDS.contains(&key.as_str()) => {
                        let value = self.map.next_value()?;
                        sidecar.unknown_fields.insert(key, value);
                    }
                    _ => return seed.deserialize(key.into_deserializer()).map(Some),
                }
            }
        }

        fn next_value_seed<V: DeserializeSeed<'de>>(
            &mut self,
            seed: V,
        ) -> Result<V::Value, A::Error> {
            self.map.next_value_seed(seed)
        }
    }
}

/// A sidecar container: every core/v1 Container field, plus the SidecarSet-specific fields.
// Exists for the schema only: the Container part stays schemaless (as upstream's), the
// SidecarSet fields are typed so the apiserver rejects bad values naming the field.
#[derive(JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // only its schema is used
struct SidecarContainerSchema {
    /// Container name, a DNS label, unique within the pod.
    name: String,
    /// Container image.
    image: Option<String>,
    pod_inject_policy: Option<PodInjectPolicy>,
    upgrade_strategy: Option<SidecarContainerUpgradeStrategy>,
    share_volume_policy: Option<ShareVolumePolicy>,
    share_volume_device_policy: Option<ShareVolumePolicy>,
    transfer_env: Option<Vec<TransferEnvVar>>,
    resources_policy: Option<ResourcesPolicy>,
}

fn sidecar_containers_schema(generator: &mut SchemaGenerator) -> Schema {
    let mut item = generator.subschema_for::<SidecarContainerSchema>();
    item.insert("x-kubernetes-preserve-unknown-fields".into(), true.into());
    json_schema!({ "type": "array", "items": item })
}

/// Where an injected container is placed among the pod's own containers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum PodInjectPolicy {
    /// In front of the pod's containers (the default for containers).
    BeforeAppContainer,
    /// After the pod's containers (the default for init containers).
    AfterAppContainer,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SidecarContainerUpgradeStrategy {
    /// `ColdUpgrade` (default) restarts the sidecar; `HotUpgrade` swaps a twin container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_type: Option<SidecarContainerUpgradeType>,
    /// Image of the idle twin container during a hot upgrade.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hot_upgrade_empty_image: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SidecarContainerUpgradeType {
    ColdUpgrade,
    HotUpgrade,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ShareVolumePolicy {
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<ShareVolumePolicyType>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ShareVolumePolicyType {
    Enabled,
    Disabled,
}

/// An environment variable copied from one of the pod's app containers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TransferEnvVar {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_container_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_container_name_from: Option<SourceContainerNameSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_names: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SourceContainerNameSource {
    /// `metadata.labels['k']` or `metadata.annotations['k']` of the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_ref: Option<ObjectFieldSelector>,
}

/// Sidecar resources computed from the app containers' resources.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourcesPolicy {
    pub target_containers_mode: TargetContainersMode,
    /// Which app containers count (unanchored); defaults to `.*`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = ".*"))]
    pub target_containers_name_regex: Option<String>,
    pub resources_expr: ResourcesExpr,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TargetContainersMode {
    #[default]
    Sum,
    Max,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ResourcesExpr {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ResourceExpressions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<ResourceExpressions>,
}

/// Expressions over the variables `cpu` / `memory`: `+ - * /`, `max()`, `min()`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ResourceExpressions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
}

/// How running pods are upgraded.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SidecarSetUpdateStrategy {
    /// `RollingUpdate` (default) or `NotUpdate` (inject only, never touch running pods).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "RollingUpdate"))]
    pub type_: Option<SidecarSetUpdateStrategyType>,
    /// Stop in-place upgrades.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// Only pods matching this are upgraded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// Number or percent of matched pods kept on the old version. Defaults to 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 0))]
    pub partition: Option<IntOrString>,
    /// Most updated-but-unready pods at once; a percent rounds up. Defaults to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 1))]
    pub max_unavailable: Option<IntOrString>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_strategy: Option<UpdatePriorityStrategy>,
    /// Spread the updates of pods carrying these labels across batches.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scatter_strategy: Vec<UpdateScatterTerm>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SidecarSetUpdateStrategyType {
    RollingUpdate,
    NotUpdate,
}

/// Update order: by the number at the end of a label value, or by weighted selectors.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpdatePriorityStrategy {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub order_priority: Vec<UpdatePriorityOrderTerm>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub weight_priority: Vec<UpdatePriorityWeightTerm>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpdatePriorityOrderTerm {
    pub ordered_key: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpdatePriorityWeightTerm {
    /// 0 to 100.
    #[schemars(range(min = 0, max = 100))]
    pub weight: i32,
    pub match_selector: LabelSelector,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct UpdateScatterTerm {
    pub key: String,
    /// A label value, or `*` for every value present on the pods.
    pub value: String,
}

/// How new pods are injected.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SidecarSetInjectionStrategy {
    /// Stop injecting into new pods.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// Inject a historical revision instead of the latest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<SidecarSetInjectRevision>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SidecarSetInjectRevision {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_name: Option<String>,
    /// `Always` (default) or `Partial`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "Always"))]
    pub policy: Option<SidecarSetInjectRevisionPolicy>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SidecarSetInjectRevisionPolicy {
    Always,
    Partial,
}

/// Annotations patched onto pods.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SidecarSetPatchPodMetadata {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// `Retain` (default), `Overwrite` or `MergePatchJson`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "Retain"))]
    pub patch_policy: Option<SidecarSetPatchPolicy>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SidecarSetPatchPolicy {
    Retain,
    Overwrite,
    MergePatchJson,
}

/// Observed state of a SidecarSet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SidecarSetStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Pods matched by the SidecarSet.
    #[serde(default)]
    pub matched_pods: i32,
    /// Matched pods whose sidecars are at the latest version.
    #[serde(default)]
    pub updated_pods: i32,
    /// Matched pods that are ready.
    #[serde(default)]
    pub ready_pods: i32,
    /// Matched pods that are updated and ready.
    #[serde(default)]
    pub updated_ready_pods: i32,
    /// Name of the latest ControllerRevision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_revision: Option<String>,
    /// Bumped when revision names collide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collision_count: Option<i32>,
    /// Why the rollout does or does not move (`RolloutHeld`), and whether every pod can be
    /// upgraded in place (`PodsUpgradable`). Not in upstream's API; its clients ignore it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn selector(labels: &[(&str, &str)]) -> LabelSelector {
        LabelSelector {
            match_labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            match_expressions: None,
        }
    }

    #[test]
    fn container_fields_are_read_from_the_containers_deserializer() {
        let fields = *sidecar_container_de::CONTAINER_FIELDS;
        for known in [
            "name",
            "image",
            "resizePolicy",
            "restartPolicy",
            "volumeMounts",
        ] {
            assert!(fields.contains(&known), "{known} in {fields:?}");
        }
        // k8s-openapi's Container (1.33) has 24 fields.
        assert_eq!(fields.len(), 24, "{fields:?}");
    }

    #[test]
    fn container_fields_newer_than_the_types_are_kept_as_written() {
        let raw = json!({
            "name": "c",
            "image": "busybox",
            "restartPolicy": "Never",
            "restartPolicyRules": [{"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}],
            "futureField": {"nested": [1, "two", null]},
            "podInjectPolicy": "AfterAppContainer",
        });
        let sidecar: SidecarContainer = serde_json::from_value(raw.clone()).unwrap();
        assert_eq!(sidecar.container.restart_policy.as_deref(), Some("Never"));
        assert_eq!(
            sidecar.pod_inject_policy,
            Some(PodInjectPolicy::AfterAppContainer)
        );
        assert_eq!(
            sidecar.unknown_fields.keys().collect::<Vec<_>>(),
            ["futureField", "restartPolicyRules"]
        );
        assert_eq!(serde_json::to_value(&sidecar).unwrap(), raw);
        // Known fields never land among the unknown ones.
        let plain: SidecarContainer =
            serde_json::from_value(json!({"name": "c", "image": "x", "env": []})).unwrap();
        assert!(plain.unknown_fields.is_empty());
    }

    #[test]
    fn v1alpha1_namespace_becomes_a_namespace_name_selector_and_wins() {
        let spec = SidecarSetSpec {
            namespace: Some("payments".into()),
            namespace_selector: Some(selector(&[("team", "a")])),
            ..Default::default()
        };
        assert_eq!(
            spec.effective_namespace_selector(),
            Some(selector(&[("kubernetes.io/metadata.name", "payments")]))
        );
    }

    #[test]
    fn without_namespace_the_namespace_selector_is_used() {
        let spec = SidecarSetSpec {
            namespace: Some(String::new()),
            namespace_selector: Some(selector(&[("team", "a")])),
            ..Default::default()
        };
        assert_eq!(
            spec.effective_namespace_selector(),
            Some(selector(&[("team", "a")]))
        );
        assert_eq!(
            SidecarSetSpec::default().effective_namespace_selector(),
            None
        );
    }

    #[test]
    fn custom_version_comes_from_the_spec_or_else_the_v1alpha1_label() {
        let mut set = SidecarSet::new("s", SidecarSetSpec::default());
        assert_eq!(set.custom_version(), None);
        set.metadata.labels = Some(BTreeMap::from([(
            SIDECARSET_CUSTOM_VERSION_LABEL.to_owned(),
            "v1".to_owned(),
        )]));
        assert_eq!(set.custom_version(), Some("v1"));
        set.spec.custom_version = Some("v2".into());
        assert_eq!(set.custom_version(), Some("v2"));
        set.spec.custom_version = Some(String::new());
        assert_eq!(
            set.custom_version(),
            Some("v1"),
            "an empty spec value does not hide the label"
        );
    }

    #[test]
    fn a_sidecar_container_round_trips_core_and_sidecarset_fields() {
        let input = json!({
            "name": "proxy",
            "image": "example.com/proxy:1",
            "command": ["/proxy"],
            "env": [{"name": "A", "value": "1"}],
            "volumeMounts": [{"name": "v", "mountPath": "/v"}],
            "podInjectPolicy": "AfterAppContainer",
            "upgradeStrategy": {"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "example.com/empty:1"},
            "shareVolumePolicy": {"type": "enabled"},
            "transferEnv": [{"sourceContainerName": "app", "envNames": ["X", "Y"]}]
        });
        let container: SidecarContainer = serde_json::from_value(input.clone()).expect("parses");
        assert_eq!(container.container.name, "proxy");
        assert_eq!(
            container.container.command.as_deref(),
            Some(&["/proxy".to_owned()][..])
        );
        assert_eq!(
            container.pod_inject_policy,
            Some(PodInjectPolicy::AfterAppContainer)
        );
        assert_eq!(
            container.share_volume_policy.and_then(|p| p.type_),
            Some(ShareVolumePolicyType::Enabled)
        );
        let back = serde_json::to_value(
            serde_json::from_value::<SidecarContainer>(input.clone()).expect("parses"),
        )
        .expect("serializes");
        assert_eq!(back, input);
    }

    #[test]
    fn an_unknown_enum_value_is_an_error_not_a_panic() {
        let err = serde_json::from_value::<SidecarSetUpdateStrategy>(json!({"type": "Sometimes"}))
            .expect_err("rejected");
        assert!(err.to_string().contains("Sometimes"), "{err}");
    }

    #[test]
    fn update_strategy_accepts_ints_and_percents() {
        let s: SidecarSetUpdateStrategy =
            serde_json::from_value(json!({"partition": "20%", "maxUnavailable": 3}))
                .expect("parses");
        assert_eq!(s.partition, Some(IntOrString::String("20%".into())));
        assert_eq!(s.max_unavailable, Some(IntOrString::Int(3)));
    }
}
