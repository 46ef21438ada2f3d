//! The ImageListPullJob controller's decisions, from plain values: what a list needs next
//! (`next_step`), which ImagePullJobs to create, delete and relabel ([`plan`]), the list's
//! status ([`compute_status`]) and the batches creations go in (`slow_start_batches`).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::SignedDuration;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use kruise_rs_api::defaults;
use kruise_rs_api::imagelistpulljob::{
    FailedImageStatus, ImageListPullJob, ImageListPullJobStatus,
};
use kruise_rs_api::imagepulljob::{
    CompletionPolicyType, ImagePullJob, ImagePullJobSpec, ImagePullJobTemplate,
};
use kruise_rs_api::well_known::{CONTROLLER_REVISION_HASH, GROUP, STORAGE_VERSION};
use kruise_rs_sidecar::hash::safe_encode_string;

/// The kind of the lists, as their children's ownerReferences name it.
pub(crate) const KIND: &str = "ImageListPullJob";

/// What a list needs before its children are looked at.
#[derive(Debug, PartialEq)]
pub(crate) enum Step {
    /// Being deleted: the garbage collector takes its ImagePullJobs; nothing to do.
    LetGo,
    /// Finished: delete the list at `expiry` (`ttlSecondsAfterFinished`, its children go with
    /// it), or keep it when there is none.
    Finished { expiry: Option<Timestamp> },
    /// Keep one current ImagePullJob per image and sum their statuses.
    Run,
}

/// The first decision of every reconcile.
pub(crate) fn next_step(list: &ImageListPullJob) -> Step {
    if list.metadata.deletion_timestamp.is_some() {
        return Step::LetGo;
    }
    match list
        .status
        .as_ref()
        .and_then(|s| s.completion_time.as_ref())
    {
        Some(done) => Step::Finished {
            expiry: list
                .spec
                .template
                .completion_policy
                .ttl_seconds_after_finished
                .and_then(|ttl| {
                    done.0
                        .checked_add(SignedDuration::from_secs(i64::from(ttl)))
                        .ok()
                }),
        },
        None => Step::Run,
    }
}

/// The `controller-revision-hash` of a list's template: 16 characters of the SHA-256 of the
/// JSON of its `child_template`, spelled as Kubernetes spells hashes in labels (upstream
/// hashes Go's memory layout with FNV-32a, which no other program can reproduce; children are
/// matched by their template, so the values need not agree). A list without `imagePullPolicy`
/// hashes as one with `IfNotPresent`: their children are the same.
pub fn template_hash(template: &ImagePullJobTemplate) -> String {
    let template = child_template(template);
    // Serializing plain data cannot fail; an empty text still hashes.
    let json = serde_json::to_vec(&template).unwrap_or_default();
    let digest = ring::digest::digest(&ring::digest::SHA256, &json);
    let hex: String = digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    safe_encode_string(&hex)
}

/// The template of a list's ImagePullJobs as they are stored: the list's, with the
/// ImagePullJob defaults its own (and upstream's) schema and webhook give an ImagePullJob. A
/// list leaves `imagePullPolicy` unset when its author did (as upstream), and each image's job
/// gets `IfNotPresent`; its children are compared with this, not with the list's template.
pub(crate) fn child_template(template: &ImagePullJobTemplate) -> ImagePullJobTemplate {
    let mut template = template.clone();
    defaults::default_imagepulljob_template(&mut template);
    template
}

/// Whether `job`'s controller is `list`.
pub(crate) fn controlled_by(job: &ImagePullJob, list_uid: &str) -> bool {
    job.owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && o.kind == KIND && o.uid == list_uid)
}

/// The ImagePullJob that pulls `image` for `list`: named `<list>-<random>`, labelled as the
/// list is plus `controller-revision-hash: <hash>`, controlled by the list, spec = the image and
/// the whole template as the job will be stored ([`child_template`]).
pub(crate) fn child(list: &ImageListPullJob, image: &str, hash: &str) -> ImagePullJob {
    let name = list.name_any();
    let mut labels = list.labels().clone();
    labels.insert(CONTROLLER_REVISION_HASH.to_owned(), hash.to_owned());
    ImagePullJob {
        metadata: ObjectMeta {
            generate_name: Some(format!("{name}-")),
            namespace: list.namespace(),
            labels: Some(labels),
            owner_references: Some(vec![OwnerReference {
                api_version: format!("{GROUP}/{STORAGE_VERSION}"),
                kind: KIND.to_owned(),
                name,
                uid: list.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..Default::default()
        },
        spec: ImagePullJobSpec {
            image: image.to_owned(),
            template: child_template(&list.spec.template),
        },
        status: None,
    }
}

/// Why a child goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Why {
    /// Its template is not the list's any more; a new one replaces it.
    Outdated,
    /// Another current child pulls the same image.
    Duplicate,
    /// Its image left the list.
    Unlisted,
}

/// A child to delete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Doomed {
    pub name: String,
    pub uid: String,
    pub image: String,
    pub why: Why,
}

/// What one reconcile of a running list does.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// Images without a current child, in list order: create one each.
    pub create: Vec<String>,
    /// Children to delete.
    pub delete: Vec<Doomed>,
    /// Current children whose `controller-revision-hash` is not the template's (made by an
    /// older hash, or by upstream's kruise-manager): relabel them.
    pub relabel: Vec<String>,
    /// The list's status, from the current children.
    pub status: ImageListPullJobStatus,
}

/// The list's children against its spec: per listed image, the oldest child with the list's
/// template is kept (its hash label notwithstanding: a child from before a cutover carries
/// upstream's hash); the others of that image go, as do children of images no longer listed.
/// `children` are the ImagePullJobs the list controls, in any order; those being deleted are
/// ignored.
pub fn plan(
    list: &ImageListPullJob,
    children: &[Arc<ImagePullJob>],
    hash: &str,
    now: &Time,
) -> Plan {
    let mut by_image: BTreeMap<&str, Vec<&ImagePullJob>> = BTreeMap::new();
    for child in children
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
    {
        by_image
            .entry(child.spec.image.as_str())
            .or_default()
            .push(child);
    }
    for candidates in by_image.values_mut() {
        // Oldest first, then by name: the same child is kept by every reconcile.
        candidates.sort_by(|a, b| {
            let at = |j: &ImagePullJob| j.metadata.creation_timestamp.as_ref().map(|t| t.0);
            at(a)
                .cmp(&at(b))
                .then_with(|| a.name_any().cmp(&b.name_any()))
        });
    }
    let doomed = |job: &ImagePullJob, why| Doomed {
        name: job.name_any(),
        uid: job.metadata.uid.clone().unwrap_or_default(),
        image: job.spec.image.clone(),
        why,
    };

    let template = child_template(&list.spec.template);
    let mut out = Plan::default();
    let mut current = Vec::new();
    let mut listed = HashSet::new();
    for image in &list.spec.images {
        if !listed.insert(image.as_str()) {
            continue;
        }
        let candidates = by_image.get(image.as_str()).map_or(&[][..], Vec::as_slice);
        let kept = candidates.iter().find(|c| c.spec.template == template);
        match kept {
            Some(kept) => {
                if kept
                    .labels()
                    .get(CONTROLLER_REVISION_HASH)
                    .map(String::as_str)
                    != Some(hash)
                {
                    out.relabel.push(kept.name_any());
                }
                current.push(*kept);
            }
            None => out.create.push(image.clone()),
        }
        for other in candidates {
            if kept.is_some_and(|k| std::ptr::eq(*k, *other)) {
                continue;
            }
            let why = if other.spec.template == template {
                Why::Duplicate
            } else {
                Why::Outdated
            };
            out.delete.push(doomed(other, why));
        }
    }
    for (image, candidates) in &by_image {
        if !listed.contains(image) {
            out.delete
                .extend(candidates.iter().map(|c| doomed(c, Why::Unlisted)));
        }
    }
    out.status = compute_status(list, &current, now);
    out
}

/// The hint every failed image's entry carries (upstream's words).
pub(crate) fn failed_message(job_name: &str) -> String {
    format!("Please check for details which nodes failed by 'kubectl get ImagePullJob {job_name}'.")
}

/// The list's status from its current children (one per image at most): only children that
/// have started count. A child is completed when every node is done (`desired == succeeded +
/// failed`) or it has finished (its deadline passed); succeeded when every node succeeded. The
/// list completes when every image's child has completed, unless its type is `Never`.
pub fn compute_status(
    list: &ImageListPullJob,
    current: &[&ImagePullJob],
    now: &Time,
) -> ImageListPullJobStatus {
    let old = list.status.clone().unwrap_or_default();
    let mut status = ImageListPullJobStatus {
        start_time: Some(old.start_time.unwrap_or_else(|| now.clone())),
        desired: i32::try_from(list.spec.images.iter().collect::<HashSet<_>>().len())
            .unwrap_or(i32::MAX),
        ..Default::default()
    };
    for child in current {
        let Some(s) = child.status.as_ref().filter(|s| s.start_time.is_some()) else {
            continue;
        };
        if s.active > 0 {
            status.active += 1;
        }
        if s.failed > 0 {
            status.failed_image_statuses.push(FailedImageStatus {
                image_pull_job: child.name_any(),
                name: child.spec.image.clone(),
                message: failed_message(&child.name_any()),
            });
        }
        if s.completion_time.is_some() || s.desired == s.succeeded.saturating_add(s.failed) {
            status.completed += 1;
        }
        if s.desired == s.succeeded {
            status.succeeded += 1;
        }
    }
    let never = list.spec.template.completion_policy.type_ == Some(CompletionPolicyType::Never);
    if !never && status.completed == status.desired {
        status.completion_time = Some(old.completion_time.unwrap_or_else(|| now.clone()));
    }
    status
}

/// The sizes of the batches `n` creations go in: 1, 2, 4, … (the last one what is left), as
/// upstream's slow start; a batch that fails stops the ones after it.
pub(crate) fn slow_start_batches(n: usize) -> Vec<usize> {
    let mut batches = Vec::new();
    let (mut left, mut size) = (n, 1usize);
    while left > 0 {
        let take = size.min(left);
        batches.push(take);
        left -= take;
        size = size.saturating_mul(2);
    }
    batches
}

#[cfg(test)]
mod tests;
