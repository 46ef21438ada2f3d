use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kruise_rs_api::sidecarset::{SidecarSetInjectRevision, SidecarSetStatus};
use serde_json::json;

const LATEST_IMAGE: &str = "sidecar-image:canary";
const OLD_IMAGE: &str = "sidecar-image:stable";

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn sidecarset(revision: Option<SidecarSetInjectRevision>) -> SidecarSet {
    let spec: SidecarSetSpec = serde_json::from_value(json!({
        "selector": {"matchLabels": {"app": "demo"}},
        "containers": [{"name": "sidecar", "image": LATEST_IMAGE}],
        "updateStrategy": {"selector": {"matchLabels": {"canary": "true"}}},
    }))
    .expect("spec");
    let mut set = SidecarSet::new("sidecarset1", spec);
    set.spec.injection_strategy.revision = revision;
    set.metadata.annotations = Some(labels(&[
        (SIDECARSET_HASH, "latest-hash"),
        (SIDECARSET_HASH_WITHOUT_IMAGE, "latest-hash-noimg"),
    ]));
    set.status = Some(SidecarSetStatus {
        latest_revision: Some("sidecarset1-latest".into()),
        ..Default::default()
    });
    set
}

fn custom(version: &str, policy: SidecarSetInjectRevisionPolicy) -> SidecarSetInjectRevision {
    SidecarSetInjectRevision {
        custom_version: Some(version.into()),
        revision_name: None,
        policy: Some(policy),
    }
}

fn revision(
    name: &str,
    number: i64,
    custom_version: Option<&str>,
    image: &str,
) -> ControllerRevision {
    let mut r = ControllerRevision {
        revision: number,
        data: Some(RawExtension(json!({"spec": {
            "$patch": "replace",
            "containers": [{"name": "sidecar", "image": image}],
            "volumes": null,
        }}))),
        ..Default::default()
    };
    r.metadata.name = Some(name.into());
    let mut l = labels(&[(SIDECARSET_NAME_LABEL, "sidecarset1")]);
    if let Some(v) = custom_version {
        l.insert(SIDECARSET_CUSTOM_VERSION_LABEL.into(), v.into());
    }
    r.metadata.labels = Some(l);
    r
}

fn image(s: &SelectedSidecarSet) -> &str {
    s.spec.containers[0]
        .container
        .image
        .as_deref()
        .unwrap_or_default()
}

fn history() -> Vec<ControllerRevision> {
    vec![revision(
        "sidecarset1-12345",
        1,
        Some("sidecarset1-12345"),
        OLD_IMAGE,
    )]
}

#[test]
fn without_a_revision_the_latest_is_injected() {
    let s = sidecarset(None);
    let chosen = version_for_new_pod(&s, &history(), &labels(&[]), 0.0).expect("ok");
    assert_eq!(image(&chosen), LATEST_IMAGE);
    assert_eq!(chosen.hash, "latest-hash");
    assert_eq!(chosen.hash_without_image, "latest-hash-noimg");
    assert_eq!(
        chosen.controller_revision.as_deref(),
        Some("sidecarset1-latest")
    );
    let empty = SidecarSetInjectRevision::default();
    let s = sidecarset(Some(empty));
    let chosen = version_for_new_pod(&s, &history(), &labels(&[]), 0.0).expect("ok");
    assert_eq!(image(&chosen), LATEST_IMAGE);
}

#[test]
fn the_latest_without_hash_annotations_computes_them_from_the_defaulted_spec() {
    let mut s = sidecarset(None);
    s.metadata.annotations = None;
    let chosen = SelectedSidecarSet::latest(&s);
    // What the webhook writes at the SidecarSet's next update.
    let mut defaulted = s.clone();
    kruise_rs_api::defaults::default_sidecarset(&mut defaulted);
    assert_eq!(chosen.hash, sidecarset_hash(&defaulted.spec));
    assert_eq!(
        chosen.hash_without_image,
        sidecarset_hash_without_image(&defaulted.spec)
    );
}

#[test]
fn always_injects_the_custom_version() {
    // Upstream TestInjectionStrategyRevision.
    let s = sidecarset(Some(custom(
        "sidecarset1-12345",
        SidecarSetInjectRevisionPolicy::Always,
    )));
    let chosen =
        version_for_new_pod(&s, &history(), &labels(&[("canary", "true")]), 0.99).expect("ok");
    assert_eq!(image(&chosen), OLD_IMAGE);
    assert_eq!(
        chosen.controller_revision.as_deref(),
        Some("sidecarset1-12345")
    );
    assert_eq!(
        chosen.hash,
        sidecarset_hash(&chosen.spec),
        "hash computed from the restored spec"
    );
    assert_eq!(
        chosen.spec.selector, s.spec.selector,
        "fields not in the revision are kept"
    );
}

#[test]
fn revision_hash_annotations_win_over_computing() {
    let s = sidecarset(Some(custom("v", SidecarSetInjectRevisionPolicy::Always)));
    let mut r = revision("r1", 1, Some("v"), OLD_IMAGE);
    r.metadata.annotations = Some(labels(&[
        (SIDECARSET_HASH, "old-hash"),
        (SIDECARSET_HASH_WITHOUT_IMAGE, "old-noimg"),
    ]));
    let chosen = version_for_new_pod(&s, &[r], &labels(&[]), 0.0).expect("ok");
    assert_eq!(chosen.hash, "old-hash");
    assert_eq!(chosen.hash_without_image, "old-noimg");
}

#[test]
fn revision_name_wins_over_custom_version() {
    let mut wanted = custom("v2", SidecarSetInjectRevisionPolicy::Always);
    wanted.revision_name = Some("r1".into());
    let s = sidecarset(Some(wanted));
    let history = [
        revision("r1", 1, Some("v1"), "img:r1"),
        revision("r2", 2, Some("v2"), "img:r2"),
    ];
    let chosen = version_for_new_pod(&s, &history, &labels(&[]), 0.0).expect("ok");
    assert_eq!(image(&chosen), "img:r1");
}

#[test]
fn the_newest_revision_of_a_custom_version_is_used() {
    let s = sidecarset(Some(custom("v", SidecarSetInjectRevisionPolicy::Always)));
    let history = [
        revision("r3", 3, Some("v"), "img:r3"),
        revision("r5", 5, Some("v"), "img:r5"),
        revision("r9", 9, Some("other"), "img:r9"),
        revision("r4", 4, Some("v"), "img:r4"),
    ];
    let chosen = version_for_new_pod(&s, &history, &labels(&[]), 0.0).expect("ok");
    assert_eq!(image(&chosen), "img:r5");
}

#[test]
fn a_missing_revision_is_an_error() {
    // Upstream "canary no history".
    let s = sidecarset(Some(custom(
        "sidecarset1-12345",
        SidecarSetInjectRevisionPolicy::Partial,
    )));
    let err = version_for_new_pod(&s, &[], &labels(&[]), 0.0).expect_err("no history");
    assert!(matches!(err, RevisionError::NotFound { .. }), "{err}");
    let by_name = SidecarSetInjectRevision {
        revision_name: Some("nope".into()),
        ..Default::default()
    };
    let s = sidecarset(Some(by_name));
    let err = version_for_new_pod(&s, &history(), &labels(&[]), 0.0).expect_err("no such name");
    assert!(err.to_string().contains("nope"), "{err}");
}

#[test]
fn revisions_of_other_sidecarsets_are_ignored() {
    let by_name = SidecarSetInjectRevision {
        revision_name: Some("foreign".into()),
        ..Default::default()
    };
    let s = sidecarset(Some(by_name));
    let mut foreign = revision("foreign", 1, None, OLD_IMAGE);
    foreign.metadata.labels = Some(labels(&[(SIDECARSET_NAME_LABEL, "someone-else")]));
    assert!(version_for_new_pod(&s, &[foreign], &labels(&[]), 0.0).is_err());
}

#[test]
fn unreadable_revision_data_is_an_error() {
    let s = sidecarset(Some(custom("v", SidecarSetInjectRevisionPolicy::Always)));
    let mut r = revision("r1", 1, Some("v"), OLD_IMAGE);
    r.data = Some(RawExtension(json!({"spec": {"containers": "not a list"}})));
    let err = version_for_new_pod(&s, &[r.clone()], &labels(&[]), 0.0).expect_err("bad data");
    assert!(matches!(err, RevisionError::BadData { .. }), "{err}");
    r.data = None;
    assert!(version_for_new_pod(&s, &[r], &labels(&[]), 0.0).is_err());
}

#[test]
fn restoring_replaces_the_recorded_fields_only() {
    let mut s = sidecarset(None);
    s.spec.volumes = serde_json::from_value(json!([{"name": "v-latest", "emptyDir": {}}])).unwrap();
    s.spec.image_pull_secrets = vec![LocalObjectReference {
        name: "latest".into(),
    }];
    let mut r = revision("r1", 1, None, OLD_IMAGE);
    r.data = Some(RawExtension(json!({"spec": {
        "$patch": "replace",
        "containers": [{"name": "sidecar", "image": OLD_IMAGE}],
        "initContainers": [{"name": "init", "image": "init:1"}],
        "imagePullSecrets": [{"name": "old"}],
        "patchPodMetadata": [{"annotations": {"a": "b"}, "patchPolicy": "Overwrite"}],
    }})));
    let restored = restore(&s, &r).expect("ok");
    assert_eq!(restored.spec.init_containers[0].container.name, "init");
    assert!(
        restored.spec.volumes.is_empty(),
        "absent volumes are empty, as with $patch: replace"
    );
    assert_eq!(restored.spec.image_pull_secrets[0].name, "old");
    assert_eq!(restored.spec.patch_pod_metadata[0].annotations["a"], "b");
    assert_eq!(restored.spec.selector, s.spec.selector);
}

// Upstream TestCanarySidecarSetInjection, case by case.

fn canary_set(partition: Option<&str>, paused: bool) -> SidecarSet {
    let mut s = sidecarset(Some(custom(
        "sidecarset1-12345",
        SidecarSetInjectRevisionPolicy::Partial,
    )));
    s.spec.update_strategy.partition = partition.map(|p| IntOrString::String(p.into()));
    s.spec.update_strategy.paused = paused;
    s
}

const STABLE_POD: &[(&str, &str)] = &[("app", "demo")];
const CANARY_POD: &[(&str, &str)] = &[("app", "demo"), ("canary", "true")];

#[test]
fn partial_pods_outside_the_update_selector_get_the_old_version() {
    let chosen = version_for_new_pod(
        &canary_set(None, false),
        &history(),
        &labels(STABLE_POD),
        0.0,
    )
    .expect("ok");
    assert_eq!(image(&chosen), OLD_IMAGE);
}

#[test]
fn partial_selected_pods_without_partition_get_the_latest() {
    let chosen = version_for_new_pod(
        &canary_set(None, false),
        &history(),
        &labels(CANARY_POD),
        0.0,
    )
    .expect("ok");
    assert_eq!(image(&chosen), LATEST_IMAGE);
    let mut s = canary_set(None, false);
    s.spec.update_strategy.partition = Some(IntOrString::Int(5));
    let chosen = version_for_new_pod(&s, &history(), &labels(CANARY_POD), 0.0).expect("ok");
    assert_eq!(
        image(&chosen),
        LATEST_IMAGE,
        "an integer partition counts as 0%"
    );
}

#[test]
fn partial_percentage_partition_is_the_chance_of_the_old_version() {
    for r in [0.0, 0.5, 0.999_999] {
        let chosen = version_for_new_pod(
            &canary_set(Some("100%"), false),
            &history(),
            &labels(CANARY_POD),
            r,
        )
        .expect("ok");
        assert_eq!(image(&chosen), OLD_IMAGE, "100% at r={r}");
        let chosen = version_for_new_pod(
            &canary_set(Some("0%"), false),
            &history(),
            &labels(CANARY_POD),
            r,
        )
        .expect("ok");
        assert_eq!(image(&chosen), LATEST_IMAGE, "0% at r={r}");
    }
    let s = canary_set(Some("30%"), false);
    let old = version_for_new_pod(&s, &history(), &labels(CANARY_POD), 0.29).expect("ok");
    let new = version_for_new_pod(&s, &history(), &labels(CANARY_POD), 0.30).expect("ok");
    assert_eq!((image(&old), image(&new)), (OLD_IMAGE, LATEST_IMAGE));
}

#[test]
fn partial_with_a_bad_partition_is_an_error() {
    for bad in ["abc%", "30", "NaN%", "inf%"] {
        let err = version_for_new_pod(
            &canary_set(Some(bad), false),
            &history(),
            &labels(CANARY_POD),
            0.0,
        )
        .expect_err(bad);
        assert!(
            matches!(err, RevisionError::InvalidPartition { .. }),
            "{err}"
        );
    }
}

#[test]
fn partial_with_a_bad_update_selector_is_an_error() {
    let mut s = canary_set(None, false);
    s.spec.update_strategy.selector = Some(LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                key: "somekey".into(),
                operator: "badOp".into(),
                values: None,
            },
        ]),
    });
    let err =
        version_for_new_pod(&s, &history(), &labels(CANARY_POD), 0.0).expect_err("bad selector");
    assert!(
        matches!(err, RevisionError::InvalidSelector { .. }),
        "{err}"
    );
}

#[test]
fn paused_updates_always_inject_the_old_version() {
    let chosen = version_for_new_pod(
        &canary_set(Some("0%"), true),
        &history(),
        &labels(CANARY_POD),
        0.5,
    )
    .expect("ok");
    assert_eq!(image(&chosen), OLD_IMAGE);
}

#[test]
fn partial_without_update_selector_draws_for_every_pod() {
    let mut s = canary_set(Some("50%"), false);
    s.spec.update_strategy.selector = None;
    let a = version_for_new_pod(&s, &history(), &labels(STABLE_POD), 0.1).expect("ok");
    let b = version_for_new_pod(&s, &history(), &labels(STABLE_POD), 0.9).expect("ok");
    assert_eq!((image(&a), image(&b)), (OLD_IMAGE, LATEST_IMAGE));
}

#[test]
fn percentages_parse_like_upstream() {
    assert_eq!(parse_percentage("25%"), Some(0.25));
    assert_eq!(parse_percentage("12.5%"), Some(0.125));
    assert_eq!(parse_percentage("25"), None);
    assert_eq!(parse_percentage("%"), None);
}
