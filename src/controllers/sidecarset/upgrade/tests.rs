use super::*;
use kruise_rs_api::sidecarset::{SidecarSetSpec, SidecarSetStatus};

fn now() -> Time {
    Time("2026-11-29T12:00:00Z".parse().expect("time"))
}

fn set(spec: Value) -> SidecarSet {
    let spec: SidecarSetSpec = serde_json::from_value(spec).expect("spec");
    let mut set = SidecarSet::new("mesh", spec);
    set.status = Some(SidecarSetStatus {
        latest_revision: Some("mesh-7f9c".into()),
        ..Default::default()
    });
    set
}

fn mesh(proxy: &str) -> SidecarSet {
    set(json!({
        "selector": {"matchLabels": {"app": "web"}},
        "containers": [
            {"name": "proxy", "image": proxy},
            {"name": "logs", "image": "logs:1"},
        ],
        "initContainers": [{"name": "setup", "image": "setup:9"}],
    }))
}

fn current() -> CurrentHashes {
    CurrentHashes {
        hash: "h2".into(),
        without_image: "w".into(),
        ..CurrentHashes::default()
    }
}

const OLD_HASHES: &str = r#"{"logging":{"updateTimestamp":null,"hash":"l1","sidecarSetName":"logging","sidecarList":["fluent"]},"mesh":{"updateTimestamp":null,"hash":"h1","sidecarSetName":"mesh","sidecarList":["logs","proxy"]}}"#;

fn pod() -> PodSummary {
    serde_json::from_value(json!({
        "metadata": {
            "name": "web-0", "namespace": "shop",
            "annotations": {SIDECARSET_HASH: OLD_HASHES, "team": "a/b"},
        },
        "spec": {
            "initContainers": [{"name": "setup", "image": "setup:1"}],
            "containers": [
                {"name": "app", "image": "shop:1"},
                {"name": "proxy", "image": "proxy:1"},
                {"name": "logs", "image": "logs:1"},
            ]
        },
        "status": {"containerStatuses": [
            {"name": "app", "image": "shop:1", "imageID": "shop@sha256:a", "ready": true, "restartCount": 0},
            {"name": "proxy", "image": "proxy:1", "imageID": "proxy@sha256:p1", "ready": true, "restartCount": 0},
            {"name": "logs", "image": "logs:1", "imageID": "logs@sha256:l1", "ready": true, "restartCount": 0},
        ]}
    }))
    .expect("pod")
}

fn apply(pod: &PodSummary, upgrade: &Upgrade) -> PodSummary {
    let mut doc = serde_json::to_value(pod).expect("pod json");
    json_patch::patch(&mut doc, &upgrade.patch).expect("the patch applies to its own pod");
    serde_json::from_value(doc).expect("still a pod")
}

fn annotation<'a>(pod: &'a PodSummary, key: &str) -> &'a str {
    pod.annotation(key).expect("annotation")
}

#[test]
fn only_changed_sidecar_images_change_in_the_spec() {
    let before = pod();
    let upgrade = upgrade_patch(&before, &mesh("proxy:2"), &current(), &now()).expect("patch");
    assert_eq!(upgrade.changed, ["proxy"]);
    let after = apply(&before, &upgrade);
    let mut expected = before.spec.clone().expect("spec");
    expected.containers[1].image = Some("proxy:2".into());
    assert_eq!(
        after.spec,
        Some(expected),
        "init containers and the rest stay"
    );
}

#[test]
fn the_hash_entry_is_rewritten_and_the_other_entries_kept() {
    let after = apply(
        &pod(),
        &upgrade_patch(&pod(), &mesh("proxy:2"), &current(), &now()).expect("patch"),
    );
    assert_eq!(
        annotation(&after, SIDECARSET_HASH),
        r#"{"logging":{"updateTimestamp":null,"hash":"l1","sidecarSetName":"logging","sidecarList":["fluent"]},"mesh":{"updateTimestamp":"2026-11-29T12:00:00Z","hash":"h2","sidecarSetName":"mesh","sidecarList":["logs","proxy"],"controllerRevision":"mesh-7f9c"}}"#
    );
    assert_eq!(annotation(&after, "team"), "a/b");
}

#[test]
fn the_update_state_records_the_image_ids_from_before_the_upgrade() {
    let after = apply(
        &pod(),
        &upgrade_patch(&pod(), &mesh("proxy:2"), &current(), &now()).expect("patch"),
    );
    assert_eq!(
        annotation(&after, SIDECARSET_INPLACE_UPDATE_STATE),
        r#"{"mesh":{"revision":"h2","updateTimestamp":"2026-11-29T12:00:00Z","lastContainerStatuses":{"proxy":{"imageID":"proxy@sha256:p1"}}}}"#
    );
}

#[test]
fn an_existing_record_keeps_its_revision_and_time_and_gains_containers() {
    let mut before = pod();
    let record = r#"{"mesh":{"revision":"h0","updateTimestamp":"2026-01-01T00:00:00Z","lastContainerStatuses":{"logs":{"imageID":"logs@sha256:l0"}}},"other":{"revision":"x","updateTimestamp":null,"lastContainerStatuses":{}}}"#;
    before.set_annotation(SIDECARSET_INPLACE_UPDATE_STATE, record);
    let upgrade = upgrade_patch(&before, &mesh("proxy:2"), &current(), &now()).expect("patch");
    let after = apply(&before, &upgrade);
    assert_eq!(
        annotation(&after, SIDECARSET_INPLACE_UPDATE_STATE),
        r#"{"mesh":{"revision":"h0","updateTimestamp":"2026-01-01T00:00:00Z","lastContainerStatuses":{"logs":{"imageID":"logs@sha256:l0"},"proxy":{"imageID":"proxy@sha256:p1"}}},"other":{"revision":"x","updateTimestamp":null,"lastContainerStatuses":{}}}"#
    );
    let value = serde_json::to_value(&upgrade.patch).expect("json");
    assert!(
        value
            .as_array()
            .expect("ops")
            .iter()
            .any(|op| op["op"] == "test"
                && op["path"]
                    == "/metadata/annotations/kruise.io~1sidecarset-inplace-update-state"
                && op["value"] == record),
        "the record is tested before it is replaced: {value}"
    );
}

/// `mesh` with the plain init container `setup` and the native sidecar `agent` on `agent`.
fn native_mesh(proxy: &str, agent: &str) -> SidecarSet {
    set(json!({
        "selector": {"matchLabels": {"app": "web"}},
        "containers": [{"name": "proxy", "image": proxy}, {"name": "logs", "image": "logs:1"}],
        "initContainers": [
            {"name": "setup", "image": "setup:9"},
            {"name": "agent", "image": agent, "restartPolicy": "Always"},
        ],
    }))
}

/// [`pod`] with the native sidecar `agent` (on `agent:1`) after `setup`.
fn native_pod() -> PodSummary {
    let mut p = pod();
    p.spec
        .as_mut()
        .expect("spec")
        .init_containers
        .push(serde_json::from_value(json!({"name": "agent", "image": "agent:1"})).expect("c"));
    p.status.as_mut().expect("status").init_container_statuses = Some(
        serde_json::from_value(json!([
            {"name": "setup", "image": "setup:1", "imageID": "setup@sha256:s1", "ready": false, "restartCount": 0},
            {"name": "agent", "image": "agent:1", "imageID": "agent@sha256:g1", "ready": true, "restartCount": 0},
        ]))
        .expect("init statuses"),
    );
    p
}

#[test]
fn a_native_sidecar_image_is_replaced_in_the_init_containers() {
    let before = native_pod();
    let upgrade = upgrade_patch(
        &before,
        &native_mesh("proxy:2", "agent:2"),
        &current(),
        &now(),
    )
    .expect("patch");
    assert_eq!(upgrade.changed, ["proxy", "agent"]);
    let after = apply(&before, &upgrade);
    let mut expected = before.spec.clone().expect("spec");
    expected.containers[1].image = Some("proxy:2".into());
    expected.init_containers[1].image = Some("agent:2".into());
    assert_eq!(
        after.spec,
        Some(expected),
        "the plain init container `setup` keeps its image"
    );
    assert_eq!(
        annotation(&after, SIDECARSET_INPLACE_UPDATE_STATE),
        r#"{"mesh":{"revision":"h2","updateTimestamp":"2026-11-29T12:00:00Z","lastContainerStatuses":{"agent":{"imageID":"agent@sha256:g1"},"proxy":{"imageID":"proxy@sha256:p1"}}}}"#
    );
    assert!(
        annotation(&after, SIDECARSET_HASH).contains(r#""sidecarList":["agent","logs","proxy"]"#)
    );
    // The index it writes is guarded by the name there.
    let value = serde_json::to_value(&upgrade.patch).expect("json");
    let ops = value.as_array().expect("ops");
    assert!(ops.iter().any(|op| op["op"] == "test"
        && op["path"] == "/spec/initContainers/1/name"
        && op["value"] == "agent"));
    let mut reordered = before.clone();
    reordered
        .spec
        .as_mut()
        .expect("spec")
        .init_containers
        .swap(0, 1);
    let mut doc = serde_json::to_value(&reordered).expect("json");
    assert!(json_patch::patch(&mut doc, &upgrade.patch).is_err());
}

#[test]
fn only_a_native_sidecar_image_changes_when_only_it_differs() {
    let upgrade = upgrade_patch(
        &native_pod(),
        &native_mesh("proxy:1", "agent:2"),
        &current(),
        &now(),
    )
    .expect("patch");
    assert_eq!(upgrade.changed, ["agent"]);
    let value = serde_json::to_value(&upgrade.patch).expect("json");
    let replaced: Vec<&str> = value
        .as_array()
        .expect("ops")
        .iter()
        .filter(|op| op["op"] == "replace")
        .map(|op| op["path"].as_str().expect("path"))
        .collect();
    assert_eq!(replaced, ["/spec/initContainers/1/image"]);
}

#[test]
fn the_patch_tests_what_it_was_computed_from() {
    let upgrade = upgrade_patch(&pod(), &mesh("proxy:2"), &current(), &now()).expect("patch");
    let mut moved = pod();
    moved.set_annotation(SIDECARSET_HASH, "{}");
    let mut doc = serde_json::to_value(&moved).expect("json");
    assert!(
        json_patch::patch(&mut doc, &upgrade.patch).is_err(),
        "a hash annotation changed meanwhile makes the patch fail"
    );
}

#[test]
fn a_pod_already_on_the_images_only_gets_its_hash_entry() {
    let upgrade = upgrade_patch(&pod(), &mesh("proxy:1"), &current(), &now()).expect("patch");
    assert!(upgrade.changed.is_empty());
    let after = apply(&pod(), &upgrade);
    assert_eq!(after.spec, pod().spec);
    assert!(after.annotation(SIDECARSET_INPLACE_UPDATE_STATE).is_none());
    assert!(annotation(&after, SIDECARSET_HASH).contains(r#""hash":"h2""#));
}

#[test]
fn pod_metadata_patches_are_applied_as_at_injection() {
    let mut s = mesh("proxy:2");
    s.spec.patch_pod_metadata = serde_json::from_value(json!([
        {"annotations": {"team": "x", "new": "1"}, "patchPolicy": "Retain"},
    ]))
    .expect("patches");
    let after = apply(
        &pod(),
        &upgrade_patch(&pod(), &s, &current(), &now()).expect("patch"),
    );
    assert_eq!(
        annotation(&after, "team"),
        "a/b",
        "Retain keeps the pod's value"
    );
    assert_eq!(annotation(&after, "new"), "1");
}

#[test]
fn an_unreadable_hash_annotation_is_an_error_not_a_reset() {
    let mut bad = pod();
    bad.set_annotation(SIDECARSET_HASH, "not json");
    let err = upgrade_patch(&bad, &mesh("proxy:2"), &current(), &now()).unwrap_err();
    assert!(err.to_string().contains(SIDECARSET_HASH), "{err}");
}

#[test]
fn old_format_hashes_are_converted() {
    let mut old = pod();
    old.set_annotation(SIDECARSET_HASH, r#"{"mesh":"h1"}"#);
    let after = apply(
        &old,
        &upgrade_patch(&old, &mesh("proxy:2"), &current(), &now()).expect("patch"),
    );
    assert!(annotation(&after, SIDECARSET_HASH).starts_with(r#"{"mesh":{"updateTimestamp":"2026"#));
}

fn with_condition(message: &str, status: &str) -> PodSummary {
    let mut p = pod();
    p.status.as_mut().expect("status").conditions = Some(vec![PodCondition {
        type_: SIDECARSET_UPGRADABLE_CONDITION.into(),
        status: status.into(),
        message: Some(message.into()),
        last_transition_time: Some(Time("2026-01-01T00:00:00Z".parse().expect("time"))),
        ..Default::default()
    }]);
    p
}

#[test]
fn a_pod_that_cannot_be_upgraded_gets_the_condition() {
    let c = upgradable_condition(&pod(), "mesh", false, &now()).expect("written");
    assert_eq!(c.status, "False");
    assert_eq!(c.reason.as_deref(), Some("UpdateImmutableField"));
    assert_eq!(c.message.as_deref(), Some(r#"{"mesh":false}"#));
    assert_eq!(c.last_transition_time, Some(now()));
}

#[test]
fn an_upgradable_pod_without_the_condition_needs_none() {
    assert_eq!(upgradable_condition(&pod(), "mesh", true, &now()), None);
    let p = with_condition(r#"{"mesh":false}"#, "False");
    assert_eq!(upgradable_condition(&p, "mesh", false, &now()), None);
}

#[test]
fn the_condition_merges_the_sidecarsets() {
    let p = with_condition(r#"{"logging":false}"#, "False");
    let c = upgradable_condition(&p, "mesh", true, &now()).expect("written");
    assert_eq!(
        c.message.as_deref(),
        Some(r#"{"logging":false,"mesh":true}"#)
    );
    assert_eq!(c.status, "False");
    assert_eq!(
        c.last_transition_time,
        Some(Time("2026-01-01T00:00:00Z".parse().expect("time"))),
        "still False: the transition time stays"
    );

    let p = with_condition(r#"{"logging":true,"mesh":false}"#, "False");
    let c = upgradable_condition(&p, "mesh", true, &now()).expect("written");
    assert_eq!(c.status, "True");
    assert_eq!(c.reason.as_deref(), Some("AllSidecarsetUpgradable"));
    assert_eq!(c.last_transition_time, Some(now()));
}

#[test]
fn an_upgraded_pod_gets_a_true_condition_as_upstream_writes_it() {
    // No condition yet: created, as upstream does after every in-place upgrade.
    let c = upgraded_condition(&pod(), "mesh", &now()).expect("written");
    assert_eq!(c.type_, SIDECARSET_UPGRADABLE_CONDITION);
    assert_eq!(c.status, "True");
    assert_eq!(c.reason.as_deref(), Some("AllSidecarsetUpgradable"));
    assert_eq!(c.message.as_deref(), Some(r#"{"mesh":true}"#));
    assert_eq!(c.last_transition_time, Some(now()));
    // Already saying so: no write.
    let p = with_condition(r#"{"mesh":true}"#, "True");
    assert_eq!(upgraded_condition(&p, "mesh", &now()), None);
    // Another SidecarSet's entry is kept; True only when every entry is.
    let p = with_condition(r#"{"logging":true}"#, "True");
    let c = upgraded_condition(&p, "mesh", &now()).expect("written");
    assert_eq!(
        c.message.as_deref(),
        Some(r#"{"logging":true,"mesh":true}"#)
    );
    assert_eq!(c.status, "True");
    assert_eq!(
        c.last_transition_time,
        Some(Time("2026-01-01T00:00:00Z".parse().expect("time"))),
        "still True: the transition time stays"
    );
    let p = with_condition(r#"{"logging":false}"#, "False");
    let c = upgraded_condition(&p, "mesh", &now()).expect("written");
    assert_eq!(c.status, "False");
    assert_eq!(c.reason.as_deref(), Some("UpdateImmutableField"));
    assert_eq!(
        c.message.as_deref(),
        Some(r#"{"logging":false,"mesh":true}"#)
    );
}

#[test]
fn a_resized_pod_gets_the_current_hash_without_image_and_an_image_only_one_keeps_it() {
    let entries = |mesh: &str| {
        format!(
            r#"{{"logging":{{"updateTimestamp":null,"hash":"lw","sidecarSetName":"logging","sidecarList":["fluent"]}},"mesh":{{"updateTimestamp":null,"hash":"{mesh}","sidecarSetName":"mesh","sidecarList":["logs","proxy"]}}}}"#
        )
    };
    let mut resized = pod();
    resized.set_annotation(SIDECARSET_HASH_WITHOUT_IMAGE, &entries("w-before-resize"));
    let upgrade = upgrade_patch(&resized, &mesh("proxy:1"), &current(), &now()).expect("patch");
    assert!(upgrade.changed.is_empty(), "no image changed");
    let after = apply(&resized, &upgrade);
    assert_eq!(
        annotation(&after, SIDECARSET_HASH_WITHOUT_IMAGE),
        r#"{"logging":{"updateTimestamp":null,"hash":"lw","sidecarSetName":"logging","sidecarList":["fluent"]},"mesh":{"updateTimestamp":"2026-11-29T12:00:00Z","hash":"w","sidecarSetName":"mesh","sidecarList":["logs","proxy"]}}"#
    );

    let mut image_only = pod();
    image_only.set_annotation(SIDECARSET_HASH_WITHOUT_IMAGE, &entries("w"));
    let upgrade = upgrade_patch(&image_only, &mesh("proxy:2"), &current(), &now()).expect("patch");
    let ops = serde_json::to_string(&upgrade.patch).expect("json");
    assert!(
        !ops.contains("sidecarset-hash-without-image"),
        "the entry is current, nothing to write: {ops}"
    );
}
