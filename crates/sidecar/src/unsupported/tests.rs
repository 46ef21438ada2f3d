use super::*;
use kruise_rs_api::sidecarset::SidecarSet;
use serde_json::{Value, json};

fn selected(name: &str, containers: Value, init_containers: Value) -> SelectedSidecarSet {
    let set: SidecarSet = serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "SidecarSet",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "containers": containers,
            "initContainers": init_containers,
        }
    }))
    .expect("a SidecarSet");
    SelectedSidecarSet::latest(&set)
}

fn plain(name: &str) -> SelectedSidecarSet {
    selected(name, json!([{"name": "c", "image": "busybox"}]), json!([]))
}

fn hot(name: &str) -> SelectedSidecarSet {
    selected(
        name,
        json!([
            {"name": "cold", "image": "busybox"},
            {"name": "hot", "image": "busybox",
             "upgradeStrategy": {"upgradeType": "HotUpgrade"}},
        ]),
        json!([]),
    )
}

const FIELD: &str =
    "upgradeStrategy.upgradeType HotUpgrade without upgradeStrategy.hotUpgradeEmptyImage";

#[test]
fn hot_upgrade_without_empty_image_is_found_on_containers_and_native_sidecar_init_containers_only()
{
    assert_eq!(
        detect(&hot("s").spec),
        [Found {
            feature: "HotUpgradeWithoutEmptyImage",
            field: FIELD,
            problem: "so its idle twin would have no image",
            containers: vec!["hot".into()],
        }]
    );
    // Served: HotUpgrade with its empty image (also an empty string is no image).
    let with_empty = |empty: &str| {
        selected(
            "s",
            json!([{"name": "hot", "image": "busybox",
                    "upgradeStrategy": {"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": empty}}]),
            json!([]),
        )
    };
    assert!(detect(&with_empty("empty:1").spec).is_empty());
    assert_eq!(detect(&with_empty("").spec)[0].containers, ["hot"]);
    let strategy = json!({"upgradeType": "HotUpgrade"});
    let native = selected(
        "s",
        json!([]),
        json!([{"name": "init", "image": "busybox", "restartPolicy": "Always", "upgradeStrategy": strategy}]),
    );
    assert_eq!(detect(&native.spec)[0].containers, ["init"]);
    // A plain init container's upgrade strategy means nothing upstream.
    let plain_init = selected(
        "s",
        json!([{"name": "c", "image": "busybox"}]),
        json!([{"name": "init", "image": "busybox", "upgradeStrategy": strategy}]),
    );
    assert!(detect(&plain_init.spec).is_empty());
    let cold = selected(
        "s",
        json!([{"name": "c", "image": "busybox", "upgradeStrategy": {"upgradeType": "ColdUpgrade"}}]),
        json!([]),
    );
    assert!(detect(&cold.spec).is_empty());
}

#[test]
fn every_feature_is_named_for_a_condition_reason() {
    for f in FEATURES {
        assert!(
            !f.name.is_empty() && f.name.chars().all(|c| c.is_ascii_alphanumeric()),
            "{}",
            f.name
        );
        assert!(f.name.starts_with(|c: char| c.is_ascii_uppercase()));
    }
}

#[test]
fn screening_skips_only_the_sidecarsets_using_an_unsupported_feature() {
    let screened = screen(vec![plain("a"), hot("b"), plain("c")], |_| false);
    let injected: Vec<&str> = screened.inject.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(injected, ["a", "c"]);
    assert_eq!(screened.skipped.len(), 1);
    assert_eq!(screened.skipped[0].sidecarset, "b");
    assert!(!screened.skipped[0].refuse);
    assert!(screened.refusal().is_none());
    assert_eq!(
        screened.warnings(),
        [
            "SidecarSet b was not injected: container hot uses upgradeStrategy.upgradeType HotUpgrade without upgradeStrategy.hotUpgradeEmptyImage, so its idle twin would have no image"
        ]
    );
}

#[test]
fn a_sidecarset_annotated_refuse_refuses_the_pod() {
    let screened = screen(vec![plain("a"), hot("b"), hot("c")], |name| name == "c");
    let refusal = screened.refusal().expect("c refuses");
    assert_eq!(refusal.sidecarset, "c");
    let message = refusal.message();
    assert!(message.contains("HotUpgrade"), "{message}");
    assert!(
        message.contains("kruise-rs.io/unsupported-features=refuse"),
        "{message}"
    );
}

#[test]
fn nothing_unsupported_leaves_the_selection_as_it_was() {
    let sets = vec![plain("a"), plain("b")];
    let screened = screen(sets.clone(), |_| panic!("asked only for skipped sets"));
    assert_eq!(screened.inject, sets);
    assert!(screened.skipped.is_empty());
    assert!(screened.warnings().is_empty());
}

#[test]
fn the_annotation_value_is_read_leniently() {
    assert!(refuses(Some("refuse")));
    assert!(refuses(Some(" Refuse ")));
    assert!(!refuses(Some("skip")));
    assert!(!refuses(Some("")));
    assert!(!refuses(None));
}

#[test]
fn several_containers_and_features_are_all_named() {
    let set = selected(
        "s",
        json!([
            {"name": "a", "image": "x", "upgradeStrategy": {"upgradeType": "HotUpgrade"}},
            {"name": "b", "image": "x", "upgradeStrategy": {"upgradeType": "HotUpgrade"},
             "resourcesPolicy": {"targetContainersMode": "max", "resourcesExpr": {}}},
        ]),
        json!([]),
    );
    let found = detect(&set.spec);
    assert_eq!(
        found[0].to_string(),
        format!("containers a, b use {FIELD}, so its idle twin would have no image")
    );
    let skipped = Skipped {
        sidecarset: "s".into(),
        found,
        refuse: false,
    };
    assert_eq!(skipped.message().matches(" use").count(), FEATURES.len());
}
