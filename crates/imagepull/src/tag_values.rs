//! The values of a NodeImage tag — its pull policy, image pull policy and sandbox metadata — as
//! the merge of what its owner jobs ask now, and when a change must restart a pull in flight.
//!
//! Used by the ImagePullJob controller (a job joins a tag, or its spec was edited: upstream's
//! #2221, where edits never reached nodes already written) and by the NodeImage controller (an
//! owner job is gone: what it alone asked for goes with it). Both recompute a tag from the specs
//! of all its owners, so values can grow and shrink again.
//!
//! Sandbox metadata is kept per tag (`tags[].sandboxConfig`, an addition to upstream's shape),
//! and `images[].sandboxConfig` holds the merge of the image's tags, which is what upstream's
//! daemon reads. Our daemon reads the tag's own and falls back to the image's for tags written
//! without one (by upstream's manager or an older kruise-rs).
//!
//! Pull secrets stay where upstream's shape has them, on the image (`images[].pullSecrets`):
//! the copies of the owners that hold copies now (running jobs; a finished job has released
//! its), so a copy leaves the list with the last owner that used it (upstream's #2235, where
//! the list only grew). Which tag may use which copy is not in the NodeImage at all: a copy
//! names the jobs it serves, and the daemon pulls a tag only with the copies that name one of
//! that tag's owners (decision 0024).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;

use kruise_rs_api::common::{ImagePullPolicy, SandboxConfig};
use kube::runtime::reflector::{ObjectRef, Store};

use crate::compact_nodeimage::{
    ImageSpec, ImageTagPullPolicy, ImageTagSpec, ImageTagStatus, NodeImageStatus, ReferenceObject,
};
use crate::imagepulljob::secrets::{copy_name, reference_object};
use kruise_rs_api::imagepulljob::{CompletionPolicyType, ImagePullJob, ImagePullJobTemplate};
use kruise_rs_api::limits;
use kruise_rs_api::well_known::GROUP;

/// Upstream's per-pull defaults.
pub(crate) const DEFAULT_TIMEOUT_SECONDS: i32 = 600;
pub(crate) const DEFAULT_BACKOFF_LIMIT: i32 = 3;

/// The pull terms of one job, from its spec (an ImagePullJob's template).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct PullTerms {
    pub timeout_seconds: i32,
    pub backoff_limit: i32,
    pub completion: CompletionPolicyType,
    pub ttl_seconds_after_finished: Option<i32>,
    pub active_deadline_seconds: Option<i64>,
    pub image_pull_policy: ImagePullPolicy,
    pub sandbox_config: Option<SandboxConfig>,
}

impl PullTerms {
    /// The terms of a job's template, within [`limits`] whatever is stored (a job admitted
    /// before the bounds existed), so the tags they make pass the NodeImage schema: a timeout
    /// that is not positive and a negative `backoffLimit` read as their defaults (the daemon's
    /// and upstream's reading), anything past a bound as the bound.
    pub(crate) fn of(template: &ImagePullJobTemplate) -> Self {
        let pull = template.pull_policy.clone().unwrap_or_default();
        let completion = &template.completion_policy;
        Self {
            timeout_seconds: pull
                .timeout_seconds
                .filter(|s| *s >= limits::MIN_TIMEOUT_SECONDS)
                .unwrap_or(DEFAULT_TIMEOUT_SECONDS)
                .min(limits::MAX_TIMEOUT_SECONDS),
            backoff_limit: pull
                .backoff_limit
                .filter(|b| *b >= limits::MIN_BACKOFF_LIMIT)
                .unwrap_or(DEFAULT_BACKOFF_LIMIT)
                .min(limits::MAX_BACKOFF_LIMIT),
            completion: completion.type_.unwrap_or_default(),
            ttl_seconds_after_finished: completion.ttl_seconds_after_finished,
            active_deadline_seconds: completion.active_deadline_seconds.map(|d| {
                d.clamp(
                    limits::MIN_ACTIVE_DEADLINE_SECONDS,
                    limits::MAX_ACTIVE_DEADLINE_SECONDS,
                )
            }),
            image_pull_policy: template.image_pull_policy.unwrap_or_default(),
            sandbox_config: template.sandbox_config.clone(),
        }
    }

    /// What the job with these terms (and uid `job_uid`) asks of its tag on `node`, the pull
    /// secrets it holds now being `pull_secrets`.
    pub(crate) fn ask(
        &self,
        job_uid: &str,
        node: &str,
        extra_ttl: Duration,
        pull_secrets: Vec<ReferenceObject>,
    ) -> OwnerAsk {
        OwnerAsk {
            pull_policy: tag_pull_policy(self, job_uid, node, extra_ttl),
            image_pull_policy: self.image_pull_policy,
            sandbox: self.sandbox_config.clone().unwrap_or_default(),
            pull_secrets,
        }
    }
}

/// Whether an owner reference points at an `apps.kruise.io` ImagePullJob (any version). Others
/// (other kinds, or no apiVersion at all) are never collected.
pub fn is_image_pull_job(owner: &ObjectReference) -> bool {
    let group = owner
        .api_version
        .as_deref()
        .and_then(|v| v.rsplit_once('/'))
        .map_or("", |(group, _)| group);
    owner.kind.as_deref() == Some("ImagePullJob") && group == GROUP
}

/// The pull-secret references a job holds in the daemons' namespace `daemon_ns` now: one per
/// `pullSecrets` name (its copy, or the Secret itself for a job in `daemon_ns`) while it runs;
/// none once it finished or is being deleted, since it then has released its copies. Read from
/// the spec alone: a name the job could not copy (no such Secret, not a registry credential)
/// names a copy that does not exist, which the daemon skips.
pub(crate) fn held_pull_secrets(job: &ImagePullJob, daemon_ns: &str) -> Vec<ReferenceObject> {
    let finished = job
        .status
        .as_ref()
        .is_some_and(|s| s.completion_time.is_some());
    if finished || job.metadata.deletion_timestamp.is_some() {
        return Vec::new();
    }
    let namespace = job.metadata.namespace.as_deref().unwrap_or_default();
    job.spec
        .template
        .pull_secrets
        .iter()
        .map(|name| {
            if namespace == daemon_ns {
                ReferenceObject {
                    namespace: Some(namespace.to_owned()),
                    name: Some(name.clone()),
                    mode: None,
                }
            } else {
                reference_object(daemon_ns, &copy_name(namespace, name))
            }
        })
        .collect()
}

/// What `owner` asks of its tag on `node`, read from the ImagePullJobs in `jobs` (their pull
/// secrets as references in `daemon_ns`): `None` for an owner that is not an ImagePullJob there
/// with this uid (gone, replaced, outside this manager's label selector, not listed yet), which
/// [`refresh_image`] then treats as unknown.
pub(crate) fn stored_owner_ask(
    jobs: &Store<ImagePullJob>,
    owner: &ObjectReference,
    node: &str,
    extra_ttl: Duration,
    daemon_ns: &str,
) -> Option<OwnerAsk> {
    if !is_image_pull_job(owner) {
        return None;
    }
    let (name, namespace, uid) = (
        owner.name.as_deref()?,
        owner.namespace.as_deref()?,
        owner.uid.as_deref()?,
    );
    let job = jobs
        .get(&ObjectRef::new(name).within(namespace))
        .filter(|job| job.metadata.uid.as_deref() == Some(uid))?;
    Some(PullTerms::of(&job.spec.template).ask(
        uid,
        node,
        extra_ttl,
        held_pull_secrets(&job, daemon_ns),
    ))
}

/// What one owner job asks of one tag on one node.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct OwnerAsk {
    pub pull_policy: ImageTagPullPolicy,
    pub image_pull_policy: ImagePullPolicy,
    pub sandbox: SandboxConfig,
    /// The pull-secret references the owner holds now (copies in the daemons' namespace).
    pub pull_secrets: Vec<ReferenceObject>,
}

/// A spread in `0..range` seconds that is stable for one (job, node) pair, so that thousands of
/// nodes do not expire their tags in the same second, without a random source in a pure function.
/// SHA-256, not `DefaultHasher`: the value is written into NodeImages, and std does not promise
/// `DefaultHasher` output across Rust releases (a rebuilt manager would rewrite every entry).
pub(crate) fn jitter(job_uid: &str, node: &str, range: u64) -> i64 {
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
pub(crate) fn tag_pull_policy(
    terms: &PullTerms,
    job_uid: &str,
    node: &str,
    extra_ttl: Duration,
) -> ImageTagPullPolicy {
    let (ttl, deadline) = match terms.completion {
        CompletionPolicyType::Never => (
            86_400 - 600 + jitter(job_uid, node, 1200),
            Some(i64::from(terms.timeout_seconds).max(1800)),
        ),
        CompletionPolicyType::Always => {
            let base = terms
                .ttl_seconds_after_finished
                .map(i64::from)
                .or(terms.active_deadline_seconds)
                .unwrap_or(
                    i64::from(terms.timeout_seconds) * i64::from(terms.backoff_limit.max(1)),
                );
            let extra = i64::try_from(extra_ttl.as_secs()).unwrap_or(i64::MAX / 2);
            (
                base.saturating_add(extra)
                    .saturating_add(jitter(job_uid, node, 300)),
                terms.active_deadline_seconds,
            )
        }
    };
    ImageTagPullPolicy {
        timeout_seconds: Some(terms.timeout_seconds),
        backoff_limit: Some(terms.backoff_limit),
        ttl_seconds_after_finished: Some(clamp_i32(ttl)),
        active_deadline_seconds: deadline,
    }
}

/// `b` merged into `a` keeping, for each field, the more patient value: a tag shared by several
/// jobs must satisfy all of them (upstream keeps whatever the first job wrote, §10.8).
pub(crate) fn most_patient(a: &ImageTagPullPolicy, b: &ImageTagPullPolicy) -> ImageTagPullPolicy {
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

/// `b`'s labels and annotations laid over `a`'s: on the same key `b` wins.
fn overlay(a: &mut SandboxConfig, b: &SandboxConfig) {
    a.labels
        .extend(b.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    a.annotations
        .extend(b.annotations.iter().map(|(k, v)| (k.clone(), v.clone())));
}

/// What a tag's owners ask together.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TagValues {
    pub pull_policy: ImageTagPullPolicy,
    /// `Always` when any owner asks for it: one owner wanting a fresh pull gets one.
    pub image_pull_policy: ImagePullPolicy,
    /// Every owner's metadata; on the same key, the owner listed later (the later joiner) wins.
    pub sandbox: SandboxConfig,
}

/// The merge of `asks`, in owner order; `None` without any.
pub(crate) fn merge<'a>(asks: impl IntoIterator<Item = &'a OwnerAsk>) -> Option<TagValues> {
    let mut asks = asks.into_iter();
    let first = asks.next()?;
    let mut values = TagValues {
        pull_policy: first.pull_policy.clone(),
        image_pull_policy: first.image_pull_policy,
        sandbox: first.sandbox.clone(),
    };
    for ask in asks {
        values.pull_policy = most_patient(&values.pull_policy, &ask.pull_policy);
        if ask.image_pull_policy == ImagePullPolicy::Always {
            values.image_pull_policy = ImagePullPolicy::Always;
        }
        overlay(&mut values.sandbox, &ask.sandbox);
    }
    Some(values)
}

fn is_subset(small: &BTreeMap<String, String>, big: &BTreeMap<String, String>) -> bool {
    small.iter().all(|(k, v)| big.get(k) == Some(v))
}

/// Whether a pull in flight with `old`'s values (and `image_sandbox`, the image-level metadata a
/// tag without its own falls back to) must restart to give its owners `new`: they now ask for
/// more time, more attempts, a later or no deadline, a pull even when present, or sandbox
/// metadata the pull was not started with. Asking for less never interrupts a pull: the more
/// patient pull still satisfies every owner, and restarting would throw its progress away. The
/// TTL is the manager's alone, never a reason.
pub(crate) fn must_restart(
    old: &ImageTagSpec,
    image_sandbox: Option<&SandboxConfig>,
    new: &TagValues,
) -> bool {
    let old_policy = old.pull_policy.clone().unwrap_or_default();
    let more = |new: Option<i32>, old: Option<i32>, default: i32| {
        new.unwrap_or(default) > old.unwrap_or(default)
    };
    let later_deadline = match (
        new.pull_policy.active_deadline_seconds,
        old_policy.active_deadline_seconds,
    ) {
        (None, Some(_)) => true,
        (Some(new), Some(old)) => new > old,
        _ => false,
    };
    let pulled_with = old
        .sandbox_config
        .as_deref()
        .or(image_sandbox)
        .cloned()
        .unwrap_or_default();
    more(
        new.pull_policy.timeout_seconds,
        old_policy.timeout_seconds,
        DEFAULT_TIMEOUT_SECONDS,
    ) || more(
        new.pull_policy.backoff_limit,
        old_policy.backoff_limit,
        DEFAULT_BACKOFF_LIMIT,
    ) || later_deadline
        || (new.image_pull_policy == ImagePullPolicy::Always
            && old.image_pull_policy != Some(ImagePullPolicy::Always))
        || !is_subset(&new.sandbox.labels, &pulled_with.labels)
        || !is_subset(&new.sandbox.annotations, &pulled_with.annotations)
}

/// `image` with every tag's values recomputed from its owners' asks (`ask` answers for one owner
/// reference; `None` when that owner's spec is unknown: a job already deleted, outside this
/// manager's label selector, or not yet in a store).
///
/// A tag whose owners are all known gets exactly their merge, so its values can shrink. A tag
/// with an unknown owner never shrinks, since that owner may need what the tag holds: its
/// current values count as one more ask, and the known owners' asks can only add to them.
///
/// A tag whose values change gets a new `version` when `in_flight` says its current round is
/// still pulling and [`must_restart`] says the pull must start over; a finished round keeps its
/// verdict, and the new values apply to the next round.
///
/// The image's `sandboxConfig` becomes the merge of its tags' (in tag order), plus what it held
/// before when a tag is left without metadata of its own (an owner unknown, and the known ones
/// add none): that metadata may be that tag's, written by a manager that kept it per image only.
///
/// The image's `pullSecrets` become the secrets its tags' owners hold now (each once, those
/// listed before first in their order): a copy whose owners all finished or left goes. While
/// any owner is unknown, or a tag has none (written by hand), nothing listed goes (it may be
/// theirs); the daemon pulls each tag only with the copies of its own owners anyway (decision
/// 0024).
pub(crate) fn refresh_image(
    image: &ImageSpec,
    ask: impl Fn(&ObjectReference) -> Option<OwnerAsk>,
    in_flight: impl Fn(&ImageTagSpec) -> bool,
) -> ImageSpec {
    let mut refreshed = image.clone();
    let mut keep_old_image_sandbox = false;
    let mut held: Vec<ReferenceObject> = Vec::new();
    let mut any_unknown = false;
    for tag in &mut refreshed.tags {
        let asks: Vec<Option<OwnerAsk>> = tag.owner_references.iter().map(|o| ask(o)).collect();
        let all_known = asks.iter().all(Option::is_some);
        // A tag nobody owns was written by hand, with whatever Secrets its writer listed: they
        // stay, as for an owner the store does not know.
        any_unknown |= !all_known || tag.owner_references.is_empty();
        let mut known: Vec<OwnerAsk> = asks.into_iter().flatten().collect();
        for secret in known.iter().flat_map(|a| &a.pull_secrets) {
            if !held.contains(secret) {
                held.push(secret.clone());
            }
        }
        if known.is_empty() {
            keep_old_image_sandbox |= tag.sandbox_config.is_none();
            continue;
        }
        // What the pull was (or will be) started with.
        let pulled_with = tag
            .sandbox_config
            .as_deref()
            .or(image.sandbox_config.as_deref())
            .cloned()
            .unwrap_or_default();
        if !all_known {
            known.insert(
                0,
                OwnerAsk {
                    pull_policy: tag.pull_policy.clone().unwrap_or_default(),
                    image_pull_policy: tag.image_pull_policy.unwrap_or_default(),
                    sandbox: pulled_with.clone(),
                    pull_secrets: Vec::new(),
                },
            );
        }
        let Some(values) = merge(&known) else {
            continue;
        };
        let old = tag.clone();
        tag.pull_policy = Some(values.pull_policy.clone());
        tag.image_pull_policy = Some(values.image_pull_policy);
        if all_known || tag.sandbox_config.is_some() || values.sandbox != pulled_with {
            tag.sandbox_config = Some(Box::new(values.sandbox.clone()));
        } else {
            // Written without metadata of its own, and the known owners add none.
            keep_old_image_sandbox = true;
        }
        if *tag != old
            && in_flight(&old)
            && must_restart(&old, image.sandbox_config.as_deref(), &values)
        {
            tag.version = Some(old.version.unwrap_or(0) + 1);
        }
    }
    let mut sandbox = if keep_old_image_sandbox {
        image.sandbox_config.as_deref().cloned().unwrap_or_default()
    } else {
        SandboxConfig::default()
    };
    for tag in &refreshed.tags {
        if let Some(own) = &tag.sandbox_config {
            overlay(&mut sandbox, own);
        }
    }
    refreshed.sandbox_config =
        (!sandbox.labels.is_empty() || !sandbox.annotations.is_empty()).then(|| Box::new(sandbox));
    refreshed.pull_secrets = image
        .pull_secrets
        .iter()
        .filter(|s| any_unknown || held.contains(s))
        .cloned()
        .collect();
    for secret in held {
        if !refreshed.pull_secrets.contains(&secret) {
            refreshed.pull_secrets.push(secret);
        }
    }
    refreshed
}

/// The status the node last reported for one tag of one image.
pub(crate) fn reported<'a>(
    status: Option<&'a NodeImageStatus>,
    image: &str,
    tag: &str,
) -> Option<&'a ImageTagStatus> {
    status?
        .image_statuses
        .get(image)?
        .tags
        .iter()
        .find(|t| t.tag == tag)
}

/// Whether the node is still on `tag`'s current round: it has not reported that round
/// finished (or not reported it at all yet).
pub(crate) fn in_flight(status: Option<&NodeImageStatus>, image: &str, tag: &ImageTagSpec) -> bool {
    reported(status, image, &tag.tag).is_none_or(|s| {
        s.version.unwrap_or(0) != tag.version.unwrap_or(0) || s.completion_time.is_none()
    })
}

#[cfg(test)]
mod tests;
