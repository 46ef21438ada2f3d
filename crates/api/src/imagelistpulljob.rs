//! ImageListPullJob: pull a list of images on a set of nodes, through one ImagePullJob per image.
//!
//! Namespaced, served as `v1alpha1` and `v1beta1` with one schema like the other kinds. The spec
//! is the images plus the [`ImagePullJobTemplate`] every child ImagePullJob copies, flattened
//! as upstream inlines it, so the template's schema defaults (`completionPolicy.type: Always`,
//! `pullPolicy {600, 3}`, which upstream's webhook sets on a list too) apply here too; its
//! `imagePullPolicy` default does not (`without_image_pull_policy_default`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::{JsonSchema, Schema};
use serde::{Deserialize, Serialize};

use super::imagepulljob::ImagePullJobTemplate;

/// Desired state of an ImageListPullJob.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "apps.kruise.io",
    version = "v1beta1",
    kind = "ImageListPullJob",
    namespaced,
    status = "ImageListPullJobStatus",
    derive = "Default",
    derive = "PartialEq",
    doc = "ImageListPullJob pulls a list of images on a set of nodes, one ImagePullJob per image.",
    printcolumn = r#"{"name": "TOTAL", "type": "integer", "jsonPath": ".status.desired", "description": "Number of image pull job"}"#,
    printcolumn = r#"{"name": "SUCCEEDED", "type": "integer", "jsonPath": ".status.succeeded", "description": "Number of image pull job succeeded"}"#,
    printcolumn = r#"{"name": "COMPLETED", "type": "integer", "jsonPath": ".status.completed", "description": "Number of ImagePullJobs which are finished"}"#,
    printcolumn = r#"{"name": "AGE", "type": "date", "jsonPath": ".metadata.creationTimestamp", "description": "CreationTimestamp is a timestamp representing the server time when this object was created."}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = without_image_pull_policy_default)]
pub struct ImageListPullJobSpec {
    /// The images to pull (1 to 255, each once), each by its own ImagePullJob.
    pub images: Vec<String>,

    /// How to pull, on which nodes and until when: copied whole into each image's ImagePullJob.
    #[serde(flatten)]
    pub template: ImagePullJobTemplate,
}

/// Removes the template's `imagePullPolicy` default from the list's schema. Upstream defaults
/// it on an ImagePullJob but not on an ImageListPullJob (neither its CRD nor its webhook):
/// unset, each image's ImagePullJob gets `IfNotPresent` from its own defaulting. A schema
/// default would also apply when a stored list is read, so a list upstream's kruise-manager
/// runs would read with a field it never wrote, its template hash would change, and it would
/// delete and recreate every child of every running list the moment the CRD is replaced
/// during a switch.
fn without_image_pull_policy_default(schema: &mut Schema) {
    let policy = schema
        .get_mut("properties")
        .and_then(|p| p.get_mut("imagePullPolicy"))
        .and_then(serde_json::Value::as_object_mut);
    if let Some(policy) = policy {
        policy.remove("default");
    }
}

/// Observed state of an ImageListPullJob, summed over its ImagePullJobs (those that started).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageListPullJobStatus {
    /// When the controller first acted on the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When every image's job had finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// ImagePullJobs wanted: one per image.
    #[serde(default)]
    pub desired: i32,
    /// ImagePullJobs with nodes pulling.
    #[serde(default)]
    pub active: i32,
    /// ImagePullJobs done on every node (succeeded or failed).
    #[serde(default)]
    pub completed: i32,
    /// ImagePullJobs that succeeded on every node.
    #[serde(default)]
    pub succeeded: i32,
    /// The images whose ImagePullJob has failed nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_image_statuses: Vec<FailedImageStatus>,
}

/// An image whose ImagePullJob has failed nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailedImageStatus {
    /// The ImagePullJob with failed nodes.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_pull_job: String,
    /// The image.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Where to look for the details.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::imagepulljob::CompletionPolicyType;
    use serde_json::json;

    #[test]
    fn the_template_fields_sit_beside_the_images() {
        let spec: ImageListPullJobSpec = serde_json::from_value(json!({
            "images": ["nginx:1.27", "busybox"],
            "parallelism": 2,
            "selector": {"names": ["a"]},
            "completionPolicy": {"type": "Never"}
        }))
        .expect("parses");
        assert_eq!(spec.images, ["nginx:1.27", "busybox"]);
        assert_eq!(
            spec.template.completion_policy.type_,
            Some(CompletionPolicyType::Never)
        );
        assert_eq!(
            spec.template.selector.map(|s| s.names),
            Some(vec!["a".to_owned()])
        );
        let back = serde_json::to_value(ImageListPullJobSpec {
            images: vec!["nginx".into()],
            ..Default::default()
        })
        .expect("serializes");
        assert_eq!(back, json!({"images": ["nginx"], "completionPolicy": {}}));
    }
}
