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

use crate::apis::nodeimage::{
    ImagePullPhase, ImagePullPolicy, ImageTagStatus, NodeImageSpec, NodeImageStatus,
    ReferenceObject, SandboxConfig,
};

/// `timeoutSeconds` when unset or not positive (upstream's default).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);
/// `backoffLimit` when unset or negative (upstream's default).
pub const DEFAULT_BACKOFF_LIMIT: u32 = 3;

/// One tag of one image: the unit a worker pulls.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TagKey {
    /// The `spec.images` key (a familiar image name).
    pub image: String,
    /// The tag, or a `sha256:` digest.
    pub tag: String,
}

impl TagKey {
    pub fn new(image: impl Into<String>, tag: impl Into<String>) -> Self {
        Self {
            image: image.into(),
            tag: tag.into(),
        }
    }
}

/// Everything a worker needs to pull one tag.
#[derive(Clone, Debug, PartialEq)]
pub struct PullTask {
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
pub struct Running {
    pub version: i64,
}

/// What to change.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// Workers to stop (and forget) first.
    pub stop: Vec<TagKey>,
    /// Workers to start, in spec order (images by name, tags as listed).
    pub start: Vec<PullTask>,
}

/// The spec version of a tag; upstream's zero when unset.
pub fn spec_version(version: Option<i64>) -> i64 {
    version.unwrap_or(0)
}

/// Decides the plan; see the module documentation for the rules.
pub fn plan(
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
                // A duplicate tag entry (the schema's list map forbids it): the first one wins.
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
                active_deadline: policy
                    .active_deadline_seconds
                    .filter(|s| *s > 0)
                    .map(|s| Duration::from_secs(s.unsigned_abs())),
                if_not_present: tag.image_pull_policy == Some(ImagePullPolicy::IfNotPresent),
                sandbox: image_spec.sandbox_config.clone().unwrap_or_default(),
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
        .get(&key.image)?
        .tags
        .iter()
        .find(|t| t.tag == key.tag)
}

fn attempts(backoff_limit: Option<i32>) -> u32 {
    let limit = match backoff_limit {
        Some(limit) if limit >= 0 => limit.unsigned_abs(),
        _ => DEFAULT_BACKOFF_LIMIT,
    };
    limit.saturating_add(1)
}

fn timeout(seconds: Option<i32>) -> Duration {
    match seconds {
        Some(s) if s > 0 => Duration::from_secs(u64::from(s.unsigned_abs())),
        _ => DEFAULT_TIMEOUT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::nodeimage::{ImageSpec, ImageStatus, ImageTagPullPolicy, ImageTagSpec};
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    fn spec(value: serde_json::Value) -> NodeImageSpec {
        serde_json::from_value(value).expect("valid spec")
    }

    fn status(value: serde_json::Value) -> NodeImageStatus {
        serde_json::from_value(value).expect("valid status")
    }

    fn running(entries: &[(&str, &str, i64)]) -> BTreeMap<TagKey, Running> {
        entries
            .iter()
            .map(|(i, t, v)| (TagKey::new(*i, *t), Running { version: *v }))
            .collect()
    }

    fn started(plan: &Plan) -> Vec<(&str, &str, i64)> {
        plan.start
            .iter()
            .map(|t| (t.key.image.as_str(), t.key.tag.as_str(), t.version))
            .collect()
    }

    fn keys(keys: &[TagKey]) -> Vec<(&str, &str)> {
        keys.iter()
            .map(|k| (k.image.as_str(), k.tag.as_str()))
            .collect()
    }

    #[test]
    fn new_tags_start_in_spec_order() {
        let spec = spec(json!({"images": {
            "redis": {"tags": [{"tag": "7"}]},
            "nginx": {"tags": [{"tag": "b", "version": 2}, {"tag": "a"}]},
        }}));
        let plan = plan(&spec, None, &BTreeMap::new());
        assert_eq!(
            started(&plan),
            [("nginx", "b", 2), ("nginx", "a", 0), ("redis", "7", 0)]
        );
        assert!(plan.stop.is_empty());
    }

    #[test]
    fn a_worker_at_the_spec_version_is_kept() {
        let spec = spec(json!({"images": {"nginx": {"tags": [{"tag": "1", "version": 3}]}}}));
        let plan = plan(&spec, None, &running(&[("nginx", "1", 3)]));
        assert_eq!(plan, Plan::default());
    }

    #[test]
    fn a_version_bump_replaces_the_worker() {
        let spec = spec(json!({"images": {"nginx": {"tags": [{"tag": "1", "version": 4}]}}}));
        let plan = plan(&spec, None, &running(&[("nginx", "1", 3)]));
        assert_eq!(keys(&plan.stop), [("nginx", "1")]);
        assert_eq!(started(&plan), [("nginx", "1", 4)]);
    }

    #[test]
    fn a_version_bump_pulls_again_even_after_success() {
        let spec = spec(json!({"images": {"nginx": {"tags": [{"tag": "1", "version": 2}]}}}));
        let status = status(json!({"imageStatuses": {"nginx": {"tags": [
            {"tag": "1", "phase": "Succeeded", "version": 1, "completionTime": "2026-11-29T10:00:00Z"}
        ]}}}));
        let plan = plan(&spec, Some(&status), &BTreeMap::new());
        assert_eq!(started(&plan), [("nginx", "1", 2)]);
    }

    #[test]
    fn removed_tags_and_images_stop_their_workers() {
        let spec = spec(json!({"images": {"nginx": {"tags": [{"tag": "1"}]}}}));
        let plan = plan(
            &spec,
            None,
            &running(&[("nginx", "1", 0), ("nginx", "2", 0), ("redis", "7", 0)]),
        );
        assert_eq!(keys(&plan.stop), [("nginx", "2"), ("redis", "7")]);
        assert!(plan.start.is_empty());
    }

    #[test]
    fn finished_at_this_version_is_not_pulled_again_after_a_restart() {
        let spec = spec(json!({"images": {"nginx": {"tags": [
            {"tag": "ok", "version": 1}, {"tag": "bad", "version": 1}
        ]}}}));
        let status = status(json!({"imageStatuses": {"nginx": {"tags": [
            {"tag": "ok", "phase": "Succeeded", "version": 1, "completionTime": "2026-11-29T10:00:00Z"},
            {"tag": "bad", "phase": "Failed", "version": 1, "completionTime": "2026-11-29T10:00:00Z"}
        ]}}}));
        assert_eq!(
            plan(&spec, Some(&status), &BTreeMap::new()),
            Plan::default()
        );
    }

    #[test]
    fn a_pull_interrupted_by_a_restart_resumes_with_its_start_time() {
        let spec = spec(json!({"images": {"nginx": {"tags": [{"tag": "1", "version": 1}]}}}));
        let status = status(json!({"imageStatuses": {"nginx": {"tags": [
            {"tag": "1", "phase": "Pulling", "version": 1, "startTime": "2026-11-29T10:00:00Z"}
        ]}}}));
        let plan = plan(&spec, Some(&status), &BTreeMap::new());
        assert_eq!(started(&plan), [("nginx", "1", 1)]);
        let at: Timestamp = "2026-11-29T10:00:00Z".parse().unwrap();
        assert_eq!(plan.start[0].started_at, Some(Time(at)));
    }

    #[test]
    fn a_start_time_of_another_version_is_not_inherited() {
        let spec = spec(json!({"images": {"nginx": {"tags": [{"tag": "1", "version": 2}]}}}));
        let status = status(json!({"imageStatuses": {"nginx": {"tags": [
            {"tag": "1", "phase": "Pulling", "version": 1, "startTime": "2026-11-29T10:00:00Z"}
        ]}}}));
        let plan = plan(&spec, Some(&status), &BTreeMap::new());
        assert_eq!(plan.start[0].started_at, None);
    }

    #[test]
    fn policy_defaults_follow_upstream() {
        let spec = spec(json!({"images": {"nginx": {"tags": [
            {"tag": "unset"},
            {"tag": "negative", "pullPolicy": {"backoffLimit": -1, "timeoutSeconds": 0, "activeDeadlineSeconds": 0}},
            {"tag": "set", "pullPolicy": {"backoffLimit": 0, "timeoutSeconds": 5, "activeDeadlineSeconds": 30}}
        ]}}}));
        let plan = plan(&spec, None, &BTreeMap::new());
        let by_tag = |tag: &str| {
            let t = plan.start.iter().find(|t| t.key.tag == tag).unwrap();
            (t.attempts, t.timeout, t.active_deadline)
        };
        assert_eq!(by_tag("unset"), (4, DEFAULT_TIMEOUT, None));
        assert_eq!(by_tag("negative"), (4, DEFAULT_TIMEOUT, None));
        assert_eq!(
            by_tag("set"),
            (1, Duration::from_secs(5), Some(Duration::from_secs(30)))
        );
    }

    #[test]
    fn only_if_not_present_skips_present_images() {
        let spec = spec(json!({"images": {"nginx": {"tags": [
            {"tag": "a", "imagePullPolicy": "IfNotPresent"},
            {"tag": "b", "imagePullPolicy": "Always"},
            {"tag": "c"}
        ]}}}));
        let plan = plan(&spec, None, &BTreeMap::new());
        let flags: Vec<bool> = plan.start.iter().map(|t| t.if_not_present).collect();
        assert_eq!(flags, [true, false, false]);
    }

    #[test]
    fn image_level_sandbox_and_secrets_and_tag_owners_reach_the_task() {
        let spec = NodeImageSpec {
            images: [(
                "nginx".to_owned(),
                ImageSpec {
                    pull_secrets: vec![ReferenceObject {
                        namespace: Some("kruise-daemon-config".into()),
                        name: Some("s".into()),
                        mode: None,
                    }],
                    tags: vec![ImageTagSpec {
                        tag: "1".into(),
                        owner_references: vec![ObjectReference {
                            uid: Some("u1".into()),
                            ..Default::default()
                        }],
                        pull_policy: Some(ImageTagPullPolicy::default()),
                        ..Default::default()
                    }],
                    sandbox_config: Some(SandboxConfig {
                        labels: [("app".to_owned(), "foo".to_owned())].into(),
                        annotations: Default::default(),
                    }),
                },
            )]
            .into(),
        };
        let plan = plan(&spec, None, &BTreeMap::new());
        let task = &plan.start[0];
        assert_eq!(task.sandbox.labels["app"], "foo");
        assert_eq!(task.pull_secrets[0].name.as_deref(), Some("s"));
        assert_eq!(task.owners[0].uid.as_deref(), Some("u1"));
    }

    #[test]
    fn an_empty_spec_stops_everything() {
        let plan = plan(
            &NodeImageSpec::default(),
            Some(&NodeImageStatus {
                image_statuses: [("nginx".to_owned(), ImageStatus::default())].into(),
                ..Default::default()
            }),
            &running(&[("nginx", "1", 0)]),
        );
        assert_eq!(keys(&plan.stop), [("nginx", "1")]);
        assert!(plan.start.is_empty());
    }
}
