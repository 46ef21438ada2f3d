//! What one job writes into one node's NodeImage: its tag entry, its owner reference, its pull
//! secrets and its sandbox metadata. Pure: the reconciler hands the result to the guarded write.

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::compact_nodeimage::{ImageTagSpec, Images, NodeImageStatus, ReferenceObject};
use crate::tag_values::{OwnerAsk, PullTerms, in_flight, refresh_image, reported};
use kruise_rs_api::imagepulljob::ImagePullJob;
use kruise_rs_controller::interned::InternedString;
use kruise_rs_controller::shared_owner::{SharedOwner, share};

/// Everything a job asks of every node, computed once per reconcile.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct JobRequest {
    /// NodeImage key: the familiar image name.
    pub name: String,
    /// Tag, or `sha256:…` digest.
    pub tag: String,
    pub owner: SharedOwner,
    pub terms: PullTerms,
    pub pull_secrets: Vec<ReferenceObject>,
}

impl JobRequest {
    pub(crate) fn new(
        job: &ImagePullJob,
        name: String,
        tag: String,
        pull_secrets: Vec<ReferenceObject>,
    ) -> Self {
        Self {
            name,
            tag,
            owner: share(owner_reference(job)),
            terms: PullTerms::of(&job.spec.template),
            pull_secrets,
        }
    }

    fn uid(&self) -> Option<&str> {
        self.owner.uid.as_deref()
    }
}

/// How a tag names the job that asked for it.
pub(crate) fn owner_reference(job: &ImagePullJob) -> ObjectReference {
    ObjectReference {
        api_version: Some("apps.kruise.io/v1beta1".into()),
        kind: Some("ImagePullJob".into()),
        name: job.metadata.name.clone(),
        namespace: job.metadata.namespace.clone(),
        uid: job.metadata.uid.clone(),
        ..Default::default()
    }
}

/// `images` with `req`'s entry for `node` in it, or `None` if it is already there as it should
/// be. Every tag of the image, and the image's pull secrets, are recomputed from its owners'
/// current asks ([`refresh_image`]):
/// `req` answers for its own job, `others` for the other owners (from the job store; `None` for
/// a job it does not know, whose tags are then left alone).
pub(crate) fn with_job_entry(
    images: &Images,
    status: Option<&NodeImageStatus>,
    req: &JobRequest,
    others: impl Fn(&ObjectReference) -> Option<OwnerAsk>,
    node: &str,
    now: &Time,
    extra_ttl: Duration,
) -> Option<Images> {
    let mut images = images.clone();
    let image = images.get_or_insert_with(InternedString::from(&req.name), Default::default);
    let before = image.clone();

    // A new round, which no later change needs to restart again.
    let mut new_round = false;
    match image.tags.iter_mut().find(|t| t.tag == req.tag) {
        Some(tag)
            if tag
                .owner_references
                .iter()
                .any(|o| o.uid.as_deref() == req.uid()) => {}
        Some(tag) => {
            // Joining a tag another job asked for: a new round, so the node pulls (or checks)
            // again for this job rather than reporting an old result.
            tag.version = Some(tag.version.unwrap_or(0) + 1);
            tag.owner_references.push(req.owner.clone());
            tag.created_at = Some(now.clone());
            new_round = true;
        }
        None => {
            // Continue after whatever round the node last reported for this tag, so its old
            // result is not taken for this request's.
            let last = reported(status, &req.name, &req.tag).and_then(|t| t.version);
            image.tags.push(ImageTagSpec {
                tag: InternedString::from(&req.tag),
                created_at: Some(now.clone()),
                owner_references: vec![req.owner.clone()],
                version: Some(last.map_or(0, |v| v + 1)),
                ..Default::default()
            });
            image.tags.sort_by(|a, b| a.tag.cmp(&b.tag));
            new_round = true;
        }
    }

    // The image's pull secrets are recomputed with the tags: this job's copies join them, and
    // copies no owner holds any more leave.
    let own = req.terms.ask(
        req.uid().unwrap_or_default(),
        node,
        extra_ttl,
        req.pull_secrets.clone(),
    );
    let refreshed = refresh_image(
        image,
        |owner| {
            if owner.uid.is_some() && owner.uid.as_deref() == req.uid() {
                Some(own.clone())
            } else {
                others(owner)
            }
        },
        |tag| !(new_round && tag.tag == req.tag) && in_flight(status, &req.name, tag),
    );
    *image = refreshed.into();
    (*image != before).then_some(images)
}

#[cfg(test)]
mod tests;
