use super::*;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kruise_rs_api::nodeimage::{ImageSpec, ImageStatus, ImageTagPullPolicy, ImageTagSpec};
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
fn a_tag_listed_twice_is_pulled_once_as_its_first_entry_asks() {
    // The schema's tag lists are atomic, as upstream's (decision 0041): a hand-written
    // NodeImage may repeat a tag.
    let spec = spec(json!({"images": {
        "nginx": {"tags": [{"tag": "1", "version": 2}, {"tag": "1", "version": 5}]},
    }}));
    let plan = plan(&spec, None, &BTreeMap::new());
    assert_eq!(started(&plan), [("nginx", "1", 2)]);
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

/// A NodeImage stored while the webhook was off: numbers past the bounds read as the bounds.
#[test]
fn numbers_past_the_bounds_read_as_the_bounds() {
    let spec = spec(json!({"images": {"nginx": {"tags": [
        {"tag": "huge", "pullPolicy": {"backoffLimit": i32::MAX, "timeoutSeconds": i32::MAX,
            "activeDeadlineSeconds": i64::MAX}},
        {"tag": "lowest", "pullPolicy": {"backoffLimit": i32::MIN, "timeoutSeconds": i32::MIN,
            "activeDeadlineSeconds": i64::MIN}}
    ]}}}));
    let plan = plan(&spec, None, &BTreeMap::new());
    let by_tag = |tag: &str| {
        let t = plan.start.iter().find(|t| t.key.tag == tag).unwrap();
        (t.attempts, t.timeout, t.active_deadline)
    };
    assert_eq!(
        by_tag("huge"),
        (
            1001,
            Duration::from_secs(86_400),
            Some(Duration::from_secs(365 * 86_400))
        )
    );
    assert_eq!(by_tag("lowest"), (4, DEFAULT_TIMEOUT, None));
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
            "nginx".into(),
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
            image_statuses: [("nginx".into(), ImageStatus::default())].into(),
            ..Default::default()
        }),
        &running(&[("nginx", "1", 0)]),
    );
    assert_eq!(keys(&plan.stop), [("nginx", "1")]);
    assert!(plan.start.is_empty());
}

#[test]
fn a_tags_own_sandbox_config_wins_over_the_images() {
    let s = spec(json!({"images": {"nginx": {
        "sandboxConfig": {"labels": {"image": "level", "a": "1"}},
        "tags": [
            {"tag": "1", "sandboxConfig": {"labels": {"a": "1"}}},
            {"tag": "2", "sandboxConfig": {}},
            {"tag": "3"}
        ]
    }}}));
    let plan = plan(&s, None, &BTreeMap::new());
    let labels = |i: usize| -> Vec<&str> {
        plan.start[i]
            .sandbox
            .labels
            .keys()
            .map(String::as_str)
            .collect()
    };
    assert_eq!(labels(0), ["a"], "its own");
    assert!(labels(1).is_empty(), "its own, empty: not the image's");
    assert_eq!(
        labels(2),
        ["a", "image"],
        "none of its own: the image's (older writers)"
    );
}
