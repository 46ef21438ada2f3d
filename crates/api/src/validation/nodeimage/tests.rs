use super::*;
use crate::defaults::default_nodeimage;
use crate::nodeimage::{ImageSpec, ImageTagPullPolicy};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

fn now() -> Time {
    Time("2026-01-02T03:04:05Z".parse().expect("timestamp"))
}

fn node(images: Value) -> NodeImage {
    NodeImage::new(
        "node-a",
        serde_json::from_value(json!({"images": images})).expect("spec"),
    )
}

fn defaulted(images: Value) -> NodeImage {
    let mut n = node(images);
    default_nodeimage(&mut n, &now());
    n
}

fn errors(r: Result<(), ValidationErrors>) -> Vec<String> {
    r.err()
        .map(|e| e.0.iter().map(ToString::to_string).collect())
        .unwrap_or_default()
}

fn tag(t: &str) -> Value {
    json!({"tag": t, "pullPolicy": {"ttlSecondsAfterFinished": 300}})
}

#[test]
fn what_our_controller_writes_passes_after_defaulting() {
    let n = defaulted(
        json!({"nginx": {"tags": [tag("1.25"), tag("latest")]}, "ghcr.io/org/app": {"tags": [tag("sha256:abc")]}}),
    );
    assert_eq!(errors(validate_create(&n)), Vec::<String>::new());
    assert_eq!(
        errors(validate_create(&node(json!({})))),
        Vec::<String>::new()
    );
}

#[test]
fn at_most_256_images() {
    let many: serde_json::Map<String, Value> = (0..257)
        .map(|i| (format!("image{i}"), json!({"tags": [tag("1")]})))
        .collect();
    let n = defaulted(Value::Object(many));
    assert_eq!(
        errors(validate_create(&n)),
        ["spec.images: Too many: 257: must have at most 256 items"]
    );
    // An update that does not grow an over-full NodeImage is let through so it can shrink.
    let mut smaller = n.clone();
    smaller.spec.images.remove("image0");
    assert_eq!(errors(validate_update(&n, &smaller)), Vec::<String>::new());
    let mut bigger = n.clone();
    bigger
        .spec
        .images
        .insert("extra".into(), smaller.spec.images["image1"].clone());
    assert_eq!(errors(validate_update(&n, &bigger)).len(), 1);
}

#[test]
fn names_and_tags_are_non_empty_and_tags_unique() {
    let n = defaulted(
        json!({"": {"tags": [tag("1")]}, "nginx": {"tags": [tag(""), tag("1"), tag("1")]}}),
    );
    assert_eq!(
        errors(validate_create(&n)),
        [
            "spec.images[]: Required value: image name can not be empty",
            "spec.images[nginx].tags[0].tag: Required value: tag for image nginx can not be empty",
            r#"spec.images[nginx].tags[2].tag: Duplicate value: "1""#,
        ]
    );
}

#[test]
fn tags_need_created_at_pull_policy_ttl_and_a_non_negative_version() {
    // Undefaulted, as a caller that skipped defaulting would pass it.
    let n = node(json!({"nginx": {"tags": [
        {"tag": "a"},
        {"tag": "b", "createdAt": "2026-01-01T00:00:00Z", "pullPolicy": {}, "version": -1}
    ]}}));
    assert_eq!(
        errors(validate_create(&n)),
        [
            "spec.images[nginx].tags[0].createdAt: Required value: createdAt field for nginx:a can not be empty",
            "spec.images[nginx].tags[0].pullPolicy: Required value: pullPolicy of nginx:a must be set",
            "spec.images[nginx].tags[1].version: Invalid value: -1: version for nginx:b can not be less than 0",
            "spec.images[nginx].tags[1].pullPolicy.ttlSecondsAfterFinished: Required value: pullPolicy.ttlSecondsAfterFinished of nginx:b must be set",
        ]
    );
    // Defaulting fills createdAt and pullPolicy, but not the TTL.
    let n = defaulted(json!({"nginx": {"tags": [{"tag": "a"}]}}));
    assert_eq!(
        errors(validate_create(&n)),
        [
            "spec.images[nginx].tags[0].pullPolicy.ttlSecondsAfterFinished: Required value: pullPolicy.ttlSecondsAfterFinished of nginx:a must be set"
        ]
    );
}

#[test]
fn an_update_only_checks_new_or_changed_tags() {
    // Stored before these rules applied: a tag without TTL.
    let old = defaulted(json!({"nginx": {"tags": [{"tag": "old"}]}}));
    let mut new = old.clone();
    let image: &mut ImageSpec = new.spec.images.get_mut("nginx").expect("nginx");
    image
        .tags
        .push(serde_json::from_value(tag("new")).expect("tag"));
    default_nodeimage(&mut new, &now());
    assert_eq!(errors(validate_update(&old, &new)), Vec::<String>::new());
    // Changing the old entry re-checks it.
    let image = new.spec.images.get_mut("nginx").expect("nginx");
    image.tags[1].version = Some(1);
    assert_eq!(image.tags[1].tag, "old");
    assert_eq!(errors(validate_update(&old, &new)).len(), 1);
    // A new tag is checked.
    let image = new.spec.images.get_mut("nginx").expect("nginx");
    image.tags[1].pull_policy = Some(ImageTagPullPolicy {
        ttl_seconds_after_finished: Some(1),
        ..Default::default()
    });
    image.tags[0].pull_policy = None;
    assert_eq!(
        errors(validate_update(&old, &new)),
        [
            "spec.images[nginx].tags[0].pullPolicy: Required value: pullPolicy of nginx:new must be set"
        ]
    );
}

#[test]
fn raw_enums() {
    let errs = errors(validate_raw_enums(
        &json!({"spec": {"images": {"nginx": {"tags": [
            {"tag": "1", "imagePullPolicy": "Always"}, {"tag": "2", "imagePullPolicy": "Never"}]}}}}),
    ));
    assert_eq!(
        errs,
        [
            r#"spec.images[nginx].tags[1].imagePullPolicy: Unsupported value: "Never": supported values: "Always", "IfNotPresent""#
        ]
    );
}

#[test]
fn a_tags_durations_and_counts_are_bounded() {
    // Defaulting sorts the tags: "bad" comes first.
    let n = defaulted(json!({"nginx": {"tags": [
        {"tag": "ok", "pullPolicy": {"ttlSecondsAfterFinished": 2_147_483_647, "timeoutSeconds": 86400,
            "backoffLimit": 1000, "activeDeadlineSeconds": 31_536_000}},
        {"tag": "bad", "pullPolicy": {"ttlSecondsAfterFinished": -1, "timeoutSeconds": -5,
            "backoffLimit": -1, "activeDeadlineSeconds": i64::MAX}}
    ]}}));
    assert_eq!(
        errors(validate_create(&n)),
        [
            "spec.images[nginx].tags[0].pullPolicy.ttlSecondsAfterFinished: Invalid value: -1: must be between 0 and 2147483647, inclusive",
            "spec.images[nginx].tags[0].pullPolicy.timeoutSeconds: Invalid value: -5: must be between 1 and 86400, inclusive",
            "spec.images[nginx].tags[0].pullPolicy.backoffLimit: Invalid value: -1: must be between 0 and 1000, inclusive",
            "spec.images[nginx].tags[0].pullPolicy.activeDeadlineSeconds: Invalid value: 9223372036854775807: must be between 1 and 31536000, inclusive",
        ]
    );
}
