//! What one job writes into one node's NodeImage: its tag entry, its owner reference, its pull
//! secrets and its sandbox metadata. Pure: the reconciler hands the result to the guarded write.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::apis::common::{ImagePullPolicy, SandboxConfig};
use crate::apis::imagepulljob::{CompletionPolicyType, ImagePullJob};
use crate::apis::nodeimage::{
    ImageSpec, ImageTagPullPolicy, ImageTagSpec, NodeImageStatus, ReferenceObject,
};

/// Upstream's per-pull defaults.
pub const DEFAULT_TIMEOUT_SECONDS: i32 = 600;
pub const DEFAULT_BACKOFF_LIMIT: i32 = 3;

/// Everything a job asks of every node, computed once per reconcile.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRequest {
    /// NodeImage key: the familiar image name.
    pub name: String,
    /// Tag, or `sha256:…` digest.
    pub tag: String,
    pub owner: ObjectReference,
    pub timeout_seconds: i32,
    pub backoff_limit: i32,
    pub completion: CompletionPolicyType,
    pub ttl_seconds_after_finished: Option<i32>,
    pub active_deadline_seconds: Option<i64>,
    pub image_pull_policy: ImagePullPolicy,
    pub sandbox_config: Option<SandboxConfig>,
    pub pull_secrets: Vec<ReferenceObject>,
}

impl JobRequest {
    pub fn new(
        job: &ImagePullJob,
        name: String,
        tag: String,
        pull_secrets: Vec<ReferenceObject>,
    ) -> Self {
        let pull = job.spec.template.pull_policy.clone().unwrap_or_default();
        let completion = &job.spec.template.completion_policy;
        Self {
            name,
            tag,
            owner: ObjectReference {
                api_version: Some("apps.kruise.io/v1beta1".into()),
                kind: Some("ImagePullJob".into()),
                name: job.metadata.name.clone(),
                namespace: job.metadata.namespace.clone(),
                uid: job.metadata.uid.clone(),
                ..Default::default()
            },
            timeout_seconds: pull.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS),
            backoff_limit: pull.backoff_limit.unwrap_or(DEFAULT_BACKOFF_LIMIT),
            completion: completion.type_.unwrap_or_default(),
            ttl_seconds_after_finished: completion.ttl_seconds_after_finished,
            active_deadline_seconds: completion.active_deadline_seconds,
            image_pull_policy: job.spec.template.image_pull_policy.unwrap_or_default(),
            sandbox_config: job.spec.template.sandbox_config.clone(),
            pull_secrets,
        }
    }

    fn uid(&self) -> Option<&str> {
        self.owner.uid.as_deref()
    }
}

/// A spread in `0..range` seconds that is stable for one (job, node) pair, so that thousands of
/// nodes do not expire their tags in the same second, without a random source in a pure function.
/// SHA-256, not `DefaultHasher`: the value is written into NodeImages, and std does not promise
/// `DefaultHasher` output across Rust releases (a rebuilt manager would rewrite every entry).
fn jitter(job_uid: &str, node: &str, range: u64) -> i64 {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(job_uid.as_bytes());
    ctx.update(b"\0");
    ctx.update(node.as_bytes());
    let digest = ctx.finish();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_ref()[..8]);
    (u64::from_be_bytes(first) % range.max(1)) as i64
}

fn clamp_i32(v: i64) -> i32 {
    v.clamp(0, i64::from(i32::MAX)) as i32
}

/// The pull policy a job gives its tag on `node` (upstream's rules, kruise.md §4.7):
/// `Never` jobs keep tags about a day and bound each pull round; `Always` jobs keep them for the
/// job's TTL (else its deadline, else every retry's timeout) plus `extra_ttl`, spread over 5 min.
pub fn tag_pull_policy(req: &JobRequest, node: &str, extra_ttl: Duration) -> ImageTagPullPolicy {
    let uid = req.uid().unwrap_or_default();
    let (ttl, deadline) = match req.completion {
        CompletionPolicyType::Never => (
            86_400 - 600 + jitter(uid, node, 1200),
            Some(i64::from(req.timeout_seconds).max(1800)),
        ),
        CompletionPolicyType::Always => {
            let base = req
                .ttl_seconds_after_finished
                .map(i64::from)
                .or(req.active_deadline_seconds)
                .unwrap_or(i64::from(req.timeout_seconds) * i64::from(req.backoff_limit.max(1)));
            let extra = i64::try_from(extra_ttl.as_secs()).unwrap_or(i64::MAX / 2);
            (
                base.saturating_add(extra)
                    .saturating_add(jitter(uid, node, 300)),
                req.active_deadline_seconds,
            )
        }
    };
    ImageTagPullPolicy {
        timeout_seconds: Some(req.timeout_seconds),
        backoff_limit: Some(req.backoff_limit),
        ttl_seconds_after_finished: Some(clamp_i32(ttl)),
        active_deadline_seconds: deadline,
    }
}

/// Merges `b` into `a` keeping, for each field, the more patient value: a tag shared by several
/// jobs must satisfy all of them (upstream keeps whatever the first job wrote, §10.8).
fn most_patient(a: &ImageTagPullPolicy, b: &ImageTagPullPolicy) -> ImageTagPullPolicy {
    let max_i32 = |x: Option<i32>, y: Option<i32>| match (x, y) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, y) => x.or(y),
    };
    ImageTagPullPolicy {
        timeout_seconds: max_i32(a.timeout_seconds, b.timeout_seconds),
        backoff_limit: max_i32(a.backoff_limit, b.backoff_limit),
        ttl_seconds_after_finished: max_i32(
            a.ttl_seconds_after_finished,
            b.ttl_seconds_after_finished,
        ),
        // No deadline on either side means no deadline for the shared tag.
        active_deadline_seconds: match (a.active_deadline_seconds, b.active_deadline_seconds) {
            (Some(x), Some(y)) => Some(x.max(y)),
            _ => None,
        },
    }
}

/// Sandbox metadata is per image name (upstream's JSON shape). Jobs merge their labels and
/// annotations into it; a job without any never wipes another's (upstream overwrote it, even
/// with nothing, §10.2). On the same key the job writing last wins.
fn merge_sandbox(
    current: Option<&SandboxConfig>,
    job: Option<&SandboxConfig>,
) -> Option<SandboxConfig> {
    let Some(job) = job else {
        return current.cloned();
    };
    let mut merged = current.cloned().unwrap_or_default();
    merged
        .labels
        .extend(job.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    merged
        .annotations
        .extend(job.annotations.iter().map(|(k, v)| (k.clone(), v.clone())));
    (!merged.labels.is_empty() || !merged.annotations.is_empty()).then_some(merged)
}

/// `images` with `req`'s entry for `node` in it, or `None` if it is already there.
pub fn with_job_entry(
    images: &BTreeMap<String, ImageSpec>,
    status: Option<&NodeImageStatus>,
    req: &JobRequest,
    node: &str,
    now: &Time,
    extra_ttl: Duration,
) -> Option<BTreeMap<String, ImageSpec>> {
    let mut images = images.clone();
    let image = images.entry(req.name.clone()).or_default();
    let before = image.clone();

    image.sandbox_config =
        merge_sandbox(image.sandbox_config.as_ref(), req.sandbox_config.as_ref());
    for secret in &req.pull_secrets {
        let known = image
            .pull_secrets
            .iter()
            .any(|s| s.namespace == secret.namespace && s.name == secret.name);
        if !known {
            image.pull_secrets.push(secret.clone());
        }
    }

    let policy = tag_pull_policy(req, node, extra_ttl);
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
            tag.image_pull_policy = Some(req.image_pull_policy);
            tag.pull_policy = Some(match &tag.pull_policy {
                Some(existing) => most_patient(existing, &policy),
                None => policy,
            });
        }
        None => {
            // Continue after whatever round the node last reported for this tag, so its old
            // result is not taken for this request's.
            let reported = status
                .and_then(|s| s.image_statuses.get(&req.name))
                .and_then(|i| i.tags.iter().find(|t| t.tag == req.tag))
                .and_then(|t| t.version);
            image.tags.push(ImageTagSpec {
                tag: req.tag.clone(),
                created_at: Some(now.clone()),
                pull_policy: Some(policy),
                owner_references: vec![req.owner.clone()],
                version: Some(reported.map_or(0, |v| v + 1)),
                image_pull_policy: Some(req.image_pull_policy),
            });
            image.tags.sort_by(|a, b| a.tag.cmp(&b.tag));
        }
    }
    (*image != before).then_some(images)
}

#[cfg(test)]
mod tests;
