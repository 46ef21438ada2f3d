//! Which pull workers should run, decided from the NodeImage alone: a pure function of its spec,
//! the status last written, and the workers the daemon has now.
//!
//! * A tag with a worker for its spec `version` keeps it (running or finished).
//! * A tag whose worker is for another version loses it: a version bump means pull again.
//! * A tag without a worker gets one, unless the status already records it finished at this
//!   version (by this daemon before a restart, or marked Failed by the manager's response
//!   timeout): that verdict stands. A tag the status shows started at this version resumes
//!   with its `startTime`, so `activeDeadlineSeconds` counts from the first start.
//! * A worker whose tag or image left the spec is stopped.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use kruise_rs_api::limits;
use kruise_rs_api::nodeimage::{
    ImagePullPhase, ImagePullPolicy, ImageTagStatus, NodeImageSpec, NodeImageStatus,
    ReferenceObject, SandboxConfig,
};

/// `timeoutSeconds` when unset or not positive (upstream's default).
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);
/// `backoffLimit` when unset or negative (upstream's default).
pub(crate) const DEFAULT_BACKOFF_LIMIT: u32 = 3;

/// One tag of one image: the unit a worker pulls.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct TagKey {
    /// The `spec.images` key (a familiar image name).
    pub image: String,
    /// The tag, or a `sha256:` digest.
    pub tag: String,
}

impl TagKey {
    pub(crate) fn new(image: impl Into<String>, tag: impl Into<String>) -> Self {
        Self {
            image: image.into(),
            tag: tag.into(),
        }
    }
}

/// Everything a worker needs to pull one tag.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PullTask {
    pub key: TagKey,
    pub version: i64,
    /// Attempts in all: `backoffLimit + 1`.
    pub attempts: u32,
    /// Bound of each attempt.
    pub timeout: Duration,
    /// Bound of all attempts together, counted from `started_at`.
    pub active_deadline: Option<Duration>,
    /// `IfNotPresent`: succeed without pulling when the runtime has the image. Anything else
    /// (including unset, as upstream) pulls.
    pub if_not_present: bool,
    pub sandbox: SandboxConfig,
    pub pull_secrets: Vec<ReferenceObject>,
    /// When an earlier run of this daemon started this version, from the status.
    pub started_at: Option<Time>,
    /// The ImagePullJobs that asked for the tag, told when it fails.
    pub owners: Vec<ObjectReference>,
}

/// A worker the daemon has, as the planner sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Running {
    pub version: i64,
}

/// What to change.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Plan {
    /// Workers to stop (and forget) first.
    pub stop: Vec<TagKey>,
    /// Workers to start, in spec order (images by name, tags as listed).
    pub start: Vec<PullTask>,
}

/// The spec version of a tag; upstream's zero when unset.
pub(crate) fn spec_version(version: Option<i64>) -> i64 {
    version.unwrap_or(0)
}

/// Decides the plan; see the module documentation for the rules.
pub(crate) fn plan(
    spec: &NodeImageSpec,
    status: Option<&NodeImageStatus>,
    running: &BTreeMap<TagKey, Running>,
) -> Plan {
    let mut plan = Plan::default();
    let mut wanted = BTreeMap::new();
    for (image, image_spec) in &spec.images {
        for tag in &image_spec.tags {
            let key = TagKey::new(image, &tag.tag);
            let version = spec_version(tag.version);
            if wanted.insert(key.clone(), version).is_some() {
                // A duplicate tag entry (the schema allows it, as upstream's does): the first one wins.
                continue;
            }
            match running.get(&key) {
                Some(worker) if worker.version == version => continue,
                Some(_) => plan.stop.push(key.clone()),
                None => {}
            }
            let reported = reported(status, &key).filter(|s| s.version.unwrap_or(0) == version);
            if reported.is_some_and(|s| s.completion_time.is_some()) {
                continue;
            }
            let policy = tag.pull_policy.clone().unwrap_or_default();
            plan.start.push(PullTask {
                key,
                version,
                attempts: attempts(policy.backoff_limit),
                timeout: timeout(policy.timeout_seconds),
                active_deadline: active_deadline(policy.active_deadline_seconds),
                if_not_present: tag.image_pull_policy == Some(ImagePullPolicy::IfNotPresent),
                // The tag's own metadata; tags written without it (by upstream's manager or an
                // older kruise-rs) get the image's.
                sandbox: tag
                    .sandbox_config
                    .as_ref()
                    .or(image_spec.sandbox_config.as_ref())
                    .cloned()
                    .unwrap_or_default(),
                pull_secrets: image_spec.pull_secrets.clone(),
                started_at: reported
                    .filter(|s| s.phase == ImagePullPhase::Pulling)
                    .and_then(|s| s.start_time.clone()),
                owners: tag.owner_references.clone(),
            });
        }
    }
    plan.stop.extend(
        running
            .keys()
            .filter(|key| !wanted.contains_key(*key))
            .cloned(),
    );
    plan
}

fn reported<'a>(status: Option<&'a NodeImageStatus>, key: &TagKey) -> Option<&'a ImageTagStatus> {
    status?
        .image_statuses
        .get(key.image.as_str())?
        .tags
        .iter()
        .find(|t| t.tag == key.tag)
}

// A NodeImage written while the webhook was off, or before the bounds of [`limits`] existed,
// may hold any number: past a bound reads as the bound.

fn attempts(backoff_limit: Option<i32>) -> u32 {
    let limit = match backoff_limit {
        Some(limit) if limit >= 0 => limit.min(limits::MAX_BACKOFF_LIMIT).unsigned_abs(),
        _ => DEFAULT_BACKOFF_LIMIT,
    };
    limit.saturating_add(1)
}

fn timeout(seconds: Option<i32>) -> Duration {
    match seconds {
        Some(s) if s > 0 => {
            Duration::from_secs(u64::from(s.min(limits::MAX_TIMEOUT_SECONDS).unsigned_abs()))
        }
        _ => DEFAULT_TIMEOUT,
    }
}

fn active_deadline(seconds: Option<i64>) -> Option<Duration> {
    seconds
        .filter(|s| *s > 0)
        .map(|s| Duration::from_secs(s.min(limits::MAX_ACTIVE_DEADLINE_SECONDS).unsigned_abs()))
}

#[cfg(test)]
mod tests;
