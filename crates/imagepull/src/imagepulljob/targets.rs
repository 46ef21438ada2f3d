//! Which nodes a job pulls on, in which order, and where each one stands.
//!
//! The order matters: the first nodes of the list are the first to get the image when
//! `parallelism` is smaller than the list. `selector.names` keeps the order the user wrote;
//! `podSelector` follows the pods (oldest first, so a rollout that replaces pods in that order
//! finds the image where it goes next); label selectors and "all nodes" go by name. Upstream
//! loses every order by passing the names through a sorted set (kruise.md §10.4).

use std::collections::HashSet;

use crate::lean_nodeimage::LeanNodeImage;
use kruise_rs_controller::pod_summary::PodSummary;
use kube::ResourceExt;
use kube::core::Selector;
use kube::core::labels::Expression;

use crate::compact_nodeimage::{ImagePullPhase, ReferenceObject};
use kruise_rs_api::imagepulljob::ImagePullJob;

/// Where one target node stands for one job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NodeState {
    /// The job's tag entry is not (yet) in the node's NodeImage.
    NotSynced,
    /// Written; the node has not finished this round of pulling.
    Pulling,
    Succeeded,
    Failed,
}

/// A target node and its state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    pub node: String,
    pub state: NodeState,
    /// How far its pull got, while it pulls and its daemon says.
    pub progress: Option<NodeProgress>,
}

/// How far a node's pull got: the daemon's `progress` and when the pull began.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NodeProgress {
    pub percent: i32,
    pub started: k8s_openapi::jiff::Timestamp,
}

/// Why the job's selector cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("spec.{field} is not a valid label selector: {reason}")]
pub(crate) struct SelectorError {
    pub field: &'static str,
    pub reason: String,
}

fn selector(
    field: &'static str,
    s: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
) -> Result<Selector, SelectorError> {
    Selector::try_from(s).map_err(|e| SelectorError {
        field,
        reason: e.to_string(),
    })
}

/// Whether a pod still holds its node: scheduled, not finished, not being deleted.
fn pod_occupies_node(pod: &PodSummary) -> Option<&str> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return None;
    }
    pod.spec
        .as_ref()?
        .node_name
        .as_deref()
        .filter(|n| !n.is_empty())
}

/// The job's target nodes, in pull order, among the nodes that have a NodeImage.
/// `nodeimages` may be in any order; `pods` may include other namespaces' pods.
pub(crate) fn select_nodes<'a>(
    job: &ImagePullJob,
    nodeimages: impl IntoIterator<Item = &'a LeanNodeImage>,
    pods: impl IntoIterator<Item = &'a PodSummary>,
) -> Result<Vec<String>, SelectorError> {
    let nodeimages: Vec<&LeanNodeImage> = nodeimages.into_iter().collect();
    let existing: HashSet<String> = nodeimages.iter().map(|n| n.name_any()).collect();
    let mut seen = HashSet::new();
    let spec = &job.spec;
    if let Some(pod_selector) = spec.template.pod_selector.clone() {
        let requirements: Vec<Expression> =
            selector("podSelector", pod_selector)?.into_iter().collect();
        let namespace = job.namespace();
        let mut pods: Vec<&PodSummary> = pods
            .into_iter()
            .filter(|p| p.namespace() == namespace && p.labels().matches(&requirements))
            .collect();
        // Oldest first; the name breaks ties so the order is total and stable.
        pods.sort_by_cached_key(|p| {
            (
                p.metadata.creation_timestamp.clone().map(|t| t.0),
                p.name_any(),
            )
        });
        return Ok(pods
            .into_iter()
            .filter_map(pod_occupies_node)
            .filter(|n| existing.contains(*n) && seen.insert(n.to_string()))
            .map(str::to_owned)
            .collect());
    }
    let label_selector = match &spec.template.selector {
        Some(node_selector) if !node_selector.names.is_empty() => {
            return Ok(node_selector
                .names
                .iter()
                .filter(|n| existing.contains(*n) && seen.insert(n.to_string()))
                .cloned()
                .collect());
        }
        Some(node_selector) => node_selector.label_selector(),
        None => None,
    };
    let requirements: Vec<Expression> = match label_selector {
        Some(s) => selector("selector", s)?.into_iter().collect(),
        None => Vec::new(),
    };
    let mut names: Vec<String> = nodeimages
        .into_iter()
        .filter(|n| n.labels().matches(&requirements))
        .map(|n| n.name_any())
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
}

/// Where `node` stands for the job `job_uid` pulling `tag` of image `name` with `secrets`:
/// synced means the tag entry lists the job and the image lists the secrets; finished means the
/// node reported a final phase for the entry's version.
pub(crate) fn node_state(
    nodeimage: &LeanNodeImage,
    name: &str,
    tag: &str,
    job_uid: &str,
    secrets: &[ReferenceObject],
) -> NodeState {
    let Some(image) = nodeimage.spec.images.get(name) else {
        return NodeState::NotSynced;
    };
    let has_secrets = secrets.iter().all(|s| {
        image
            .pull_secrets
            .iter()
            .any(|p| p.namespace == s.namespace && p.name == s.name)
    });
    let Some(entry) = image
        .tags
        .iter()
        .find(|t| t.tag == tag)
        .filter(|_| has_secrets)
    else {
        return NodeState::NotSynced;
    };
    if !entry
        .owner_references
        .iter()
        .any(|o| o.uid.as_deref() == Some(job_uid))
    {
        return NodeState::NotSynced;
    }
    let version = entry.version.unwrap_or(0);
    let reported = nodeimage
        .status
        .as_ref()
        .and_then(|s| s.image_statuses.get(name))
        .and_then(|image| image.tags.iter().find(|t| t.tag == tag))
        .filter(|t| t.version.unwrap_or(0) == version);
    match reported.map(|t| t.phase) {
        Some(ImagePullPhase::Succeeded) => NodeState::Succeeded,
        Some(ImagePullPhase::Failed) => NodeState::Failed,
        _ => NodeState::Pulling,
    }
}

/// How far `node`'s pull of `tag` of image `name` got, for the version its spec entry asks: the
/// daemon's report while `Pulling`, with a progress and a start time.
pub(crate) fn node_progress(
    nodeimage: &LeanNodeImage,
    name: &str,
    tag: &str,
) -> Option<NodeProgress> {
    let version = nodeimage
        .spec
        .images
        .get(name)?
        .tags
        .iter()
        .find(|t| t.tag == tag)?
        .version
        .unwrap_or(0);
    let reported = nodeimage
        .status
        .as_ref()?
        .image_statuses
        .get(name)?
        .tags
        .iter()
        .find(|t| t.tag == tag && t.version.unwrap_or(0) == version)?;
    if reported.phase != ImagePullPhase::Pulling {
        return None;
    }
    Some(NodeProgress {
        percent: reported.progress?,
        started: reported.start_time.as_ref()?.0,
    })
}

#[cfg(test)]
mod tests;
