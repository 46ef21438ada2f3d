//! The ImagePullJob controller's decisions, from plain values: what a job needs next
//! (`next_step`) and where each of its target nodes stands (`targets`). The pieces they are
//! built from live beside this file: `super::targets` (which nodes, in which order),
//! `super::status` (the status, which nodes start next, the next deadline) and `super::entry`
//! (what a job writes into a NodeImage).

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::entry::JobRequest;
use super::status::parallelism;
use super::targets::{NodeState, SelectorError, Target, node_progress, node_state, select_nodes};
use crate::lean_nodeimage::LeanNodeImage;
use kruise_rs_api::image::ImageRef;
use kruise_rs_api::imagepulljob::ImagePullJob;
use kruise_rs_api::well_known::GROUP;
use kruise_rs_controller::pod_summary::PodSummary;

/// What a job needs before any node is looked at.
#[derive(Debug, PartialEq)]
pub(crate) enum Step {
    /// Being deleted (held by someone's finalizer: kruise-rs sets none, decision 0030): release
    /// its secret copies and the finalizer earlier versions set; its NodeImage entries are
    /// collected by the NodeImage controller once it is gone.
    LetGo,
    /// Finished: release as above, then delete the job at `expiry`
    /// (`ttlSecondsAfterFinished`), or keep it when there is none. A job an ImageListPullJob
    /// controls has none: it goes with its list (docs/decisions/0016-*).
    Finished { expiry: Option<Timestamp> },
    /// It cannot run as written: a Warning event with `reason`, and `message` in its status.
    Refuse {
        reason: &'static str,
        message: String,
    },
    /// Pull `image` on at most `parallelism` nodes at once.
    Run { image: ImageRef, parallelism: usize },
}

/// The first decision of every reconcile.
pub(crate) fn next_step(job: &ImagePullJob) -> Step {
    if job.metadata.deletion_timestamp.is_some() {
        return Step::LetGo;
    }
    if let Some(status) = job.status.as_ref().filter(|s| s.completion_time.is_some()) {
        // The list's own TTL removes the whole family: a child deleted by its own TTL before
        // the list saw it finish would be recreated (upstream's defect, reference §10.16).
        let expiry = if controlled_by_a_list(job) {
            None
        } else {
            super::status::next_deadline(job, status)
        };
        return Step::Finished { expiry };
    }
    let image = match ImageRef::parse(&job.spec.image) {
        Ok(image) => image,
        Err(err) => {
            return Step::Refuse {
                reason: "InvalidImage",
                message: format!("spec.image: {err}"),
            };
        }
    };
    match parallelism(job) {
        Ok(parallelism) => Step::Run { image, parallelism },
        Err(message) => Step::Refuse {
            reason: "InvalidParallelism",
            message,
        },
    }
}

/// Whether the job's controller owner is an ImageListPullJob (`apps.kruise.io`, any version).
fn controlled_by_a_list(job: &ImagePullJob) -> bool {
    job.owner_references().iter().any(|o| {
        o.controller == Some(true)
            && o.kind == "ImageListPullJob"
            && o.api_version.split('/').next() == Some(GROUP)
    })
}

/// The job's target nodes in pull order, each with where it stands for `req`, among the nodes
/// that have a NodeImage (`nodeimages`, by name). `pods` may include other namespaces' pods.
/// `Err`: a selector that does not parse (the job is refused, `InvalidSelector`).
pub(crate) fn targets<'a>(
    job: &ImagePullJob,
    req: &JobRequest,
    nodeimages: &'a HashMap<String, Arc<LeanNodeImage>>,
    pods: impl IntoIterator<Item = &'a PodSummary>,
) -> Result<Vec<Target>, SelectorError> {
    let job_uid = job.metadata.uid.clone().unwrap_or_default();
    // `select_nodes` takes the NodeImages in any order.
    let nodes = select_nodes(job, nodeimages.values().map(|n| &**n), pods)?;
    Ok(nodes
        .into_iter()
        .filter_map(|node| {
            let nodeimage = nodeimages.get(&node)?;
            let state = node_state(nodeimage, &req.name, &req.tag, &job_uid, &req.pull_secrets);
            let progress = (state == NodeState::Pulling)
                .then(|| node_progress(nodeimage, &req.name, &req.tag))
                .flatten();
            Some(Target {
                node,
                state,
                progress,
            })
        })
        .collect())
}

/// The NodeImages by name, as [`targets`] takes them.
pub(crate) fn by_name(
    nodeimages: impl IntoIterator<Item = Arc<LeanNodeImage>>,
) -> HashMap<String, Arc<LeanNodeImage>> {
    nodeimages.into_iter().map(|n| (n.name_any(), n)).collect()
}

#[cfg(test)]
mod tests;
