//! ImagePullJob: pull one image on a set of nodes.
//!
//! Namespaced. Upstream's v1alpha1 and v1beta1 have the same JSON shape, so one schema serves
//! both. Defaults that upstream's mutating webhook sets are schema defaults here, so the
//! apiserver applies them on every create and read, with or without our webhook.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, Time,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub use super::common::{ImagePullPolicy, SandboxConfig};
use super::limits;

/// Desired state of an ImagePullJob.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "apps.kruise.io",
    version = "v1beta1",
    kind = "ImagePullJob",
    namespaced,
    status = "ImagePullJobStatus",
    derive = "Default",
    derive = "PartialEq",
    doc = "ImagePullJob pulls an image on a set of nodes.",
    printcolumn = r#"{"name": "TOTAL", "type": "integer", "jsonPath": ".status.desired", "description": "Number of all nodes matched by this job."}"#,
    printcolumn = r#"{"name": "ACTIVE", "type": "integer", "jsonPath": ".status.active", "description": "Number of image pull tasks active."}"#,
    printcolumn = r#"{"name": "SUCCEED", "type": "integer", "jsonPath": ".status.succeeded", "description": "Number of image pull tasks succeeded."}"#,
    printcolumn = r#"{"name": "FAILED", "type": "integer", "jsonPath": ".status.failed", "description": "Number of image pull tasks failed."}"#,
    printcolumn = r#"{"name": "PROGRESS", "type": "string", "jsonPath": ".status.progress", "description": "The pulling node expected to finish last, how far it got and the time it has left."}"#,
    printcolumn = r#"{"name": "AGE", "type": "date", "jsonPath": ".metadata.creationTimestamp", "description": "Time since the job was created."}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ImagePullJobSpec {
    /// The image to pull: a name with a tag or a digest.
    #[schemars(length(min = 1))]
    pub image: String,

    /// Everything but the image, as an ImageListPullJob gives it to each of its jobs.
    #[serde(flatten)]
    pub template: ImagePullJobTemplate,
}

/// How to pull, on which nodes and until when: the part of an ImagePullJob an ImageListPullJob
/// copies into the job of each of its images.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImagePullJobTemplate {
    /// Secrets in the job's namespace used to pull the image, at most 16. Immutable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = limits::MAX_PULL_SECRETS))]
    pub pull_secrets: Vec<String>,

    /// Nodes to pull on: `names`, or a label selector over NodeImages (which carry their Node's
    /// labels). Unset means every node. Mutually exclusive with `podSelector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<ImagePullJobNodeSelector>,

    /// Pull on the nodes of the pods in the job's namespace that match this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,

    /// Most nodes pulling at once; 0 pauses the job. Defaults to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallelism: Option<IntOrString>,

    /// Per-node pull attempt policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = {}))]
    pub pull_policy: Option<PullPolicy>,

    /// When the job counts as finished.
    #[serde(default)]
    #[schemars(extend("default" = {}))]
    pub completion_policy: CompletionPolicy,

    /// Labels and annotations passed to the CRI `PullImage` call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_config: Option<SandboxConfig>,

    /// `Always` or `IfNotPresent` (default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "IfNotPresent"))]
    pub image_pull_policy: Option<ImagePullPolicy>,
}

/// Node names, or a label selector over NodeImages, inline in one object as upstream has it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-map-type" = "atomic"))]
pub struct ImagePullJobNodeSelector {
    /// Node names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_labels: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_expressions: Option<Vec<LabelSelectorRequirement>>,
}

impl ImagePullJobNodeSelector {
    /// The label-selector half, if it says anything.
    pub fn label_selector(&self) -> Option<LabelSelector> {
        (self.match_labels.is_some() || self.match_expressions.is_some()).then(|| LabelSelector {
            match_labels: self.match_labels.clone(),
            match_expressions: self.match_expressions.clone(),
        })
    }
}

/// Per-node pull attempt policy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PullPolicy {
    /// Seconds one pull may take, 1 to 86400. Defaults to 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 600), range(min = limits::MIN_TIMEOUT_SECONDS, max = limits::MAX_TIMEOUT_SECONDS))]
    pub timeout_seconds: Option<i32>,
    /// Retries before a node counts as failed, 0 to 1000. Defaults to 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 3), range(min = limits::MIN_BACKOFF_LIMIT, max = limits::MAX_BACKOFF_LIMIT))]
    pub backoff_limit: Option<i32>,
}

/// When a job counts as finished (shared with upstream's BroadcastJob).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompletionPolicy {
    /// `Always` (default): finish once every node is done. `Never`: keep pulling on new nodes.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "Always"))]
    pub type_: Option<CompletionPolicyType>,
    /// Seconds after the start time the job may stay active (`Always` only), 1 to 31536000
    /// (365 days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = limits::MIN_ACTIVE_DEADLINE_SECONDS, max = limits::MAX_ACTIVE_DEADLINE_SECONDS))]
    pub active_deadline_seconds: Option<i64>,
    /// Seconds after finishing before the job is deleted (`Always` only), 0 to 31536000
    /// (365 days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = limits::MIN_TTL_SECONDS, max = limits::MAX_JOB_TTL_SECONDS))]
    pub ttl_seconds_after_finished: Option<i32>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum CompletionPolicyType {
    #[default]
    Always,
    Never,
}

/// Observed state of an ImagePullJob.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImagePullJobStatus {
    /// When the controller first acted on the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the job finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// Nodes the job pulls on.
    #[serde(default)]
    pub desired: i32,
    /// Nodes pulling now.
    #[serde(default)]
    pub active: i32,
    /// Nodes that pulled the image.
    #[serde(default)]
    pub succeeded: i32,
    /// Nodes that failed to pull the image.
    #[serde(default)]
    pub failed: i32,
    /// A summary of the job's state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The nodes that failed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_nodes: Vec<String>,
    /// While nodes pull: the one expected to finish last, how far it got and about how long it
    /// has left (`37% on node-2, about 1m20s left`), from its daemon's progress. Not upstream's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
}

/// The job's `kruise-rs.io/max-pulls-per-registry` annotation: `None` when absent, else a
/// positive integer; `Err` says what is wrong with the value.
pub fn max_pulls_per_registry(
    annotations: &BTreeMap<String, String>,
) -> Result<Option<usize>, String> {
    use crate::well_known::MAX_PULLS_PER_REGISTRY;
    let Some(value) = annotations.get(MAX_PULLS_PER_REGISTRY) else {
        return Ok(None);
    };
    match value.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(Some(n)),
        _ => Err(
            "must be a positive integer: the most nodes pulling from this job's registry at once"
                .to_owned(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_seed_imagepulljob_parses_with_sandbox_config() {
        let yaml = include_str!("../../../tests/fixtures/seed-003-imagepulljob.yaml");
        let job: ImagePullJob = serde_yaml::from_str(yaml).expect("parses");
        assert_eq!(job.spec.image, "nginx");
        assert_eq!(job.spec.template.parallelism, Some(IntOrString::Int(10)));
        let sandbox = job.spec.template.sandbox_config.expect("sandboxConfig");
        assert_eq!(sandbox.labels["app"], "foo");
        // completionPolicy is absent in the seed: the schema default fills it server-side, and
        // the Rust type reads its absence as the same default.
        assert_eq!(
            job.spec.template.completion_policy,
            CompletionPolicy::default()
        );
    }

    #[test]
    fn node_names_and_label_selector_share_one_object() {
        let sel: ImagePullJobNodeSelector = serde_json::from_value(json!({
            "names": ["a", "b"],
            "matchLabels": {"zone": "z1"}
        }))
        .expect("parses");
        assert_eq!(sel.names, ["a", "b"]);
        assert_eq!(
            sel.label_selector().and_then(|s| s.match_labels),
            Some(BTreeMap::from([("zone".to_owned(), "z1".to_owned())]))
        );
        assert_eq!(ImagePullJobNodeSelector::default().label_selector(), None);
    }
}
