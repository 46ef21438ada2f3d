//! Which nodes a job pulls on, in which order, and where each one stands.
//!
//! The order matters: the first nodes of the list are the first to get the image when
//! `parallelism` is smaller than the list. `selector.names` keeps the order the user wrote;
//! `podSelector` follows the pods (oldest first, so a rollout that replaces pods in that order
//! finds the image where it goes next); label selectors and "all nodes" go by name. Upstream
//! loses every order by passing the names through a sorted set (kruise.md §10.4).

use std::collections::HashSet;

use crate::controllers::shared::pod_summary::PodSummary;
use kube::ResourceExt;
use kube::core::{Selector, SelectorExt};

use crate::apis::imagepulljob::ImagePullJob;
use crate::apis::nodeimage::{ImagePullPhase, NodeImage, ReferenceObject};

/// Where one target node stands for one job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeState {
    /// The job's tag entry is not (yet) in the node's NodeImage.
    NotSynced,
    /// Written; the node has not finished this round of pulling.
    Pulling,
    Succeeded,
    Failed,
}

/// A target node and its state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub node: String,
    pub state: NodeState,
}

/// Why the job's selector cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("spec.{field} is not a valid label selector: {reason}")]
pub struct SelectorError {
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
pub fn select_nodes<'a>(
    job: &ImagePullJob,
    nodeimages: impl IntoIterator<Item = &'a NodeImage>,
    pods: impl IntoIterator<Item = &'a PodSummary>,
) -> Result<Vec<String>, SelectorError> {
    let nodeimages: Vec<&NodeImage> = nodeimages.into_iter().collect();
    let existing: HashSet<String> = nodeimages.iter().map(|n| n.name_any()).collect();
    let mut seen = HashSet::new();
    let spec = &job.spec;
    if let Some(pod_selector) = spec.pod_selector.clone() {
        let sel = selector("podSelector", pod_selector)?;
        let namespace = job.namespace();
        let mut pods: Vec<&PodSummary> = pods
            .into_iter()
            .filter(|p| p.namespace() == namespace && sel.matches(p.labels()))
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
    let label_selector = match &spec.selector {
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
    let sel = label_selector
        .map(|s| selector("selector", s))
        .transpose()?;
    let mut names: Vec<String> = nodeimages
        .into_iter()
        .filter(|n| sel.as_ref().is_none_or(|sel| sel.matches(n.labels())))
        .map(|n| n.name_any())
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
}

/// Where `node` stands for the job `job_uid` pulling `tag` of image `name` with `secrets`:
/// synced means the tag entry lists the job and the image lists the secrets; finished means the
/// node reported a final phase for the entry's version.
pub fn node_state(
    nodeimage: &NodeImage,
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::ObjectReference;

    use crate::controllers::shared::pod_summary::{PodSpecSummary, PodStatusSummary};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::apis::imagepulljob::{ImagePullJobNodeSelector, ImagePullJobSpec};
    use crate::apis::nodeimage::{
        ImageSpec, ImageStatus, ImageTagSpec, ImageTagStatus, NodeImageStatus,
    };

    fn nodeimage(name: &str, labels: &[(&str, &str)]) -> NodeImage {
        let mut n = NodeImage::new(name, Default::default());
        n.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        n
    }

    fn job(spec: ImagePullJobSpec) -> ImagePullJob {
        let mut j = ImagePullJob::new("j", spec);
        j.metadata.namespace = Some("ns".into());
        j.metadata.uid = Some("uid-1".into());
        j
    }

    fn pod(name: &str, ns: &str, node: &str, created: i64, phase: &str) -> PodSummary {
        PodSummary {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                labels: Some(BTreeMap::from([("app".to_owned(), "web".to_owned())])),
                creation_timestamp: Some(Time(Timestamp::from_second(created).unwrap())),
                ..Default::default()
            },
            spec: Some(PodSpecSummary {
                node_name: Some(node.into()),
                ..Default::default()
            }),
            status: Some(PodStatusSummary {
                phase: Some(phase.into()),
                ..Default::default()
            }),
        }
    }
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn nodes() -> Vec<NodeImage> {
        vec![
            nodeimage("n3", &[("zone", "a")]),
            nodeimage("n1", &[("zone", "b")]),
            nodeimage("n2", &[("zone", "a")]),
        ]
    }

    #[test]
    fn no_selector_means_every_node_by_name() {
        let j = job(ImagePullJobSpec {
            image: "nginx".into(),
            ..Default::default()
        });
        assert_eq!(select_nodes(&j, &nodes(), []).unwrap(), ["n1", "n2", "n3"]);
    }

    #[test]
    fn names_keep_the_users_order_and_skip_unknown_and_repeated_nodes() {
        let j = job(ImagePullJobSpec {
            image: "nginx".into(),
            selector: Some(ImagePullJobNodeSelector {
                names: vec!["n3".into(), "gone".into(), "n1".into(), "n3".into()],
                ..Default::default()
            }),
            ..Default::default()
        });
        assert_eq!(select_nodes(&j, &nodes(), []).unwrap(), ["n3", "n1"]);
    }

    #[test]
    fn label_selector_matches_nodeimage_labels() {
        let j = job(ImagePullJobSpec {
            image: "nginx".into(),
            selector: Some(ImagePullJobNodeSelector {
                match_labels: Some(BTreeMap::from([("zone".to_owned(), "a".to_owned())])),
                ..Default::default()
            }),
            ..Default::default()
        });
        assert_eq!(select_nodes(&j, &nodes(), []).unwrap(), ["n2", "n3"]);
    }

    #[test]
    fn pod_selector_follows_pods_oldest_first_once_per_node() {
        let j = job(ImagePullJobSpec {
            image: "nginx".into(),
            pod_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([("app".to_owned(), "web".to_owned())])),
                ..Default::default()
            }),
            ..Default::default()
        });
        let mut deleting = pod("d", "ns", "n1", 1, "Running");
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(5).unwrap()));
        let pods = [
            pod("c", "ns", "n1", 30, "Running"),
            pod("a", "ns", "n3", 10, "Pending"),
            pod("b", "ns", "n3", 20, "Running"),
            pod("e", "other", "n2", 1, "Running"),
            pod("f", "ns", "n2", 5, "Succeeded"),
            pod("g", "ns", "unknown-node", 2, "Running"),
            deleting,
        ];
        assert_eq!(select_nodes(&j, &nodes(), &pods).unwrap(), ["n3", "n1"]);
    }

    #[test]
    fn a_bad_selector_is_an_error_naming_the_field() {
        let j = job(ImagePullJobSpec {
            image: "nginx".into(),
            pod_selector: Some(LabelSelector {
                match_expressions: Some(vec![
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                        key: "a".into(),
                        operator: "Sometimes".into(),
                        values: None,
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        });
        let err = select_nodes(&j, &nodes(), []).unwrap_err();
        assert!(err.to_string().starts_with("spec.podSelector"), "{err}");
    }

    fn with_tag(owner: &str, version: i64, reported: Option<(i64, ImagePullPhase)>) -> NodeImage {
        let mut n = nodeimage("n", &[]);
        n.spec.images.insert(
            "nginx".into(),
            ImageSpec {
                tags: vec![ImageTagSpec {
                    tag: "1".into(),
                    version: Some(version),
                    owner_references: vec![ObjectReference {
                        uid: Some(owner.into()),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            },
        );
        if let Some((v, phase)) = reported {
            n.status = Some(NodeImageStatus {
                image_statuses: BTreeMap::from([(
                    "nginx".to_owned(),
                    ImageStatus {
                        tags: vec![ImageTagStatus {
                            version: Some(v),
                            ..ImageTagStatus::new("1", phase)
                        }],
                    },
                )]),
                ..Default::default()
            });
        }
        n
    }

    #[test]
    fn node_state_needs_our_owner_reference_and_a_report_for_the_current_version() {
        let state = |n: &NodeImage| node_state(n, "nginx", "1", "me", &[]);
        assert_eq!(state(&nodeimage("n", &[])), NodeState::NotSynced);
        assert_eq!(
            state(&with_tag("someone-else", 1, None)),
            NodeState::NotSynced
        );
        assert_eq!(state(&with_tag("me", 1, None)), NodeState::Pulling);
        assert_eq!(
            state(&with_tag("me", 2, Some((1, ImagePullPhase::Succeeded)))),
            NodeState::Pulling,
            "an old round's result"
        );
        assert_eq!(
            state(&with_tag("me", 2, Some((2, ImagePullPhase::Succeeded)))),
            NodeState::Succeeded
        );
        assert_eq!(
            state(&with_tag("me", 2, Some((2, ImagePullPhase::Failed)))),
            NodeState::Failed
        );
        assert_eq!(
            state(&with_tag("me", 2, Some((2, ImagePullPhase::Waiting)))),
            NodeState::Pulling
        );
        let secret = ReferenceObject {
            namespace: Some("d".into()),
            name: Some("s".into()),
            mode: None,
        };
        assert_eq!(
            node_state(&with_tag("me", 1, None), "nginx", "1", "me", &[secret]),
            NodeState::NotSynced,
            "a secret is missing"
        );
        assert_eq!(
            node_state(&with_tag("me", 1, None), "nginx", "2", "me", &[]),
            NodeState::NotSynced,
            "another tag"
        );
    }
}
