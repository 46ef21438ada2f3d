//! What one job writes into one node's NodeImage: its tag entry, its owner reference, its pull
//! secrets and its sandbox metadata. Pure: the reconciler hands the result to the guarded write.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
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
        let pull = job.spec.pull_policy.clone().unwrap_or_default();
        let completion = &job.spec.completion_policy;
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
            image_pull_policy: job.spec.image_pull_policy.unwrap_or_default(),
            sandbox_config: job.spec.sandbox_config.clone(),
            pull_secrets,
        }
    }

    fn uid(&self) -> Option<&str> {
        self.owner.uid.as_deref()
    }
}

/// A spread in `0..range` seconds that is stable for one (job, node) pair, so that thousands of
/// nodes do not expire their tags in the same second, without a random source in a pure function.
fn jitter(job_uid: &str, node: &str, range: u64) -> i64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (job_uid, node).hash(&mut h);
    (h.finish() % range.max(1)) as i64
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
mod tests {
    use super::*;
    use crate::apis::imagepulljob::{CompletionPolicy, ImagePullJobSpec, PullPolicy};
    use crate::apis::nodeimage::{ImagePullPhase, ImageStatus, ImageTagStatus};
    use k8s_openapi::jiff::Timestamp;

    fn t(s: i64) -> Time {
        Time(Timestamp::from_second(s).unwrap())
    }

    fn job(uid: &str, policy: CompletionPolicy, sandbox: Option<SandboxConfig>) -> ImagePullJob {
        let mut j = ImagePullJob::new(
            &format!("job-{uid}"),
            ImagePullJobSpec {
                image: "nginx:1".into(),
                completion_policy: policy,
                sandbox_config: sandbox,
                pull_policy: Some(PullPolicy {
                    timeout_seconds: Some(100),
                    backoff_limit: Some(2),
                }),
                ..Default::default()
            },
        );
        j.metadata.namespace = Some("ns".into());
        j.metadata.uid = Some(uid.into());
        j
    }

    fn req(uid: &str, policy: CompletionPolicy, sandbox: Option<SandboxConfig>) -> JobRequest {
        JobRequest::new(
            &job(uid, policy, sandbox),
            "nginx".into(),
            "1".into(),
            Vec::new(),
        )
    }

    const EXTRA: Duration = Duration::from_secs(300);

    #[test]
    fn a_new_tag_entry_has_owner_version_policy_and_creation_time() {
        let r = req("u1", Default::default(), None);
        let images =
            with_job_entry(&BTreeMap::new(), None, &r, "n1", &t(50), EXTRA).expect("changed");
        let tag = &images["nginx"].tags[0];
        assert_eq!(tag.tag, "1");
        assert_eq!(tag.version, Some(0));
        assert_eq!(tag.created_at, Some(t(50)));
        assert_eq!(tag.owner_references[0].uid.as_deref(), Some("u1"));
        assert_eq!(
            tag.owner_references[0].kind.as_deref(),
            Some("ImagePullJob")
        );
        assert_eq!(tag.image_pull_policy, Some(ImagePullPolicy::IfNotPresent));
        let p = tag.pull_policy.as_ref().unwrap();
        assert_eq!(
            (
                p.timeout_seconds,
                p.backoff_limit,
                p.active_deadline_seconds
            ),
            (Some(100), Some(2), None)
        );
        assert!(
            with_job_entry(&images, None, &r, "n1", &t(60), EXTRA).is_none(),
            "idempotent"
        );
    }

    #[test]
    fn a_new_entry_continues_after_the_last_reported_round() {
        let status = NodeImageStatus {
            image_statuses: BTreeMap::from([(
                "nginx".to_owned(),
                ImageStatus {
                    tags: vec![ImageTagStatus {
                        version: Some(4),
                        ..ImageTagStatus::new("1", ImagePullPhase::Succeeded)
                    }],
                },
            )]),
            ..Default::default()
        };
        let images = with_job_entry(
            &BTreeMap::new(),
            Some(&status),
            &req("u1", Default::default(), None),
            "n",
            &t(1),
            EXTRA,
        )
        .unwrap();
        assert_eq!(images["nginx"].tags[0].version, Some(5));
    }

    #[test]
    fn a_second_job_joins_the_tag_with_a_new_round_and_the_more_patient_policy() {
        let first = with_job_entry(
            &BTreeMap::new(),
            None,
            &req("u1", Default::default(), None),
            "n",
            &t(1),
            EXTRA,
        )
        .unwrap();
        let deadline = CompletionPolicy {
            active_deadline_seconds: Some(900),
            ttl_seconds_after_finished: Some(10),
            ..Default::default()
        };
        let both =
            with_job_entry(&first, None, &req("u2", deadline, None), "n", &t(2), EXTRA).unwrap();
        let tag = &both["nginx"].tags[0];
        assert_eq!(both["nginx"].tags.len(), 1);
        let owners: Vec<_> = tag
            .owner_references
            .iter()
            .map(|o| o.uid.as_deref().unwrap())
            .collect();
        assert_eq!(owners, ["u1", "u2"]);
        assert_eq!(tag.version, Some(1));
        assert_eq!(tag.created_at, Some(t(2)));
        let p = tag.pull_policy.as_ref().unwrap();
        assert_eq!(
            p.active_deadline_seconds, None,
            "the first job has no deadline"
        );
        assert!(
            p.ttl_seconds_after_finished.unwrap() >= 100 * 2 + 300,
            "the longer TTL stays"
        );
    }

    #[test]
    fn sandbox_config_merges_and_is_never_wiped() {
        let a = SandboxConfig {
            labels: BTreeMap::from([("app".to_owned(), "foo".to_owned())]),
            annotations: BTreeMap::from([(
                "io.kubernetes.image.metrics.tags".to_owned(),
                "app=foo".to_owned(),
            )]),
        };
        let first = with_job_entry(
            &BTreeMap::new(),
            None,
            &req("u1", Default::default(), Some(a.clone())),
            "n",
            &t(1),
            EXTRA,
        )
        .unwrap();
        let mut other = req("u2", Default::default(), None);
        other.tag = "2".into();
        let second = with_job_entry(&first, None, &other, "n", &t(2), EXTRA).unwrap();
        assert_eq!(
            second["nginx"].sandbox_config.as_ref(),
            Some(&a),
            "a job without sandboxConfig keeps the other's"
        );
        let b = SandboxConfig {
            labels: BTreeMap::from([("team".to_owned(), "x".to_owned())]),
            ..Default::default()
        };
        let mut third = req("u3", Default::default(), Some(b));
        third.tag = "3".into();
        let merged = with_job_entry(&second, None, &third, "n", &t(3), EXTRA).unwrap();
        let sc = merged["nginx"].sandbox_config.as_ref().unwrap();
        assert_eq!(sc.labels.len(), 2);
        assert_eq!(sc.annotations.len(), 1);
        let tags: Vec<_> = merged["nginx"]
            .tags
            .iter()
            .map(|t| t.tag.as_str())
            .collect();
        assert_eq!(tags, ["1", "2", "3"], "sorted by tag");
    }

    #[test]
    fn pull_secrets_are_added_once() {
        let secret = ReferenceObject {
            namespace: Some("kruise-daemon-config".into()),
            name: Some("s".into()),
            mode: Some("batch".into()),
        };
        let mut r = req("u1", Default::default(), None);
        r.pull_secrets = vec![secret.clone(), secret.clone()];
        let images = with_job_entry(&BTreeMap::new(), None, &r, "n", &t(1), EXTRA).unwrap();
        assert_eq!(images["nginx"].pull_secrets, [secret]);
    }

    #[test]
    fn tag_ttls_follow_upstreams_rules() {
        let always = tag_pull_policy(&req("u", Default::default(), None), "n", EXTRA);
        let ttl = i64::from(always.ttl_seconds_after_finished.unwrap());
        assert!(
            (200 + 300..200 + 600).contains(&ttl),
            "timeout x backoff + extra + jitter: {ttl}"
        );
        let with_ttl = CompletionPolicy {
            ttl_seconds_after_finished: Some(1000),
            active_deadline_seconds: Some(50),
            ..Default::default()
        };
        let p = tag_pull_policy(&req("u", with_ttl, None), "n", Duration::ZERO);
        assert!((1000..1300).contains(&p.ttl_seconds_after_finished.unwrap()));
        assert_eq!(p.active_deadline_seconds, Some(50));
        let never = CompletionPolicy {
            type_: Some(CompletionPolicyType::Never),
            ..Default::default()
        };
        let p = tag_pull_policy(&req("u", never, None), "n", EXTRA);
        assert!((86_400 - 600..86_400 + 600).contains(&p.ttl_seconds_after_finished.unwrap()));
        assert_eq!(p.active_deadline_seconds, Some(1800));
        let a = tag_pull_policy(&req("u", Default::default(), None), "node-a", EXTRA);
        assert_eq!(
            a,
            tag_pull_policy(&req("u", Default::default(), None), "node-a", EXTRA),
            "stable per node"
        );
    }
}
