use serde_json::json;

use super::*;
use kruise_rs_api::sidecarset::SidecarSetSpec;

fn set(containers: Value, init_containers: Value) -> SidecarSet {
    let spec: SidecarSetSpec = serde_json::from_value(json!({
        "selector": {"matchLabels": {"app": "web"}},
        "containers": containers,
        "initContainers": init_containers,
    }))
    .expect("spec");
    SidecarSet::new("mesh", spec)
}

fn pod(containers: Value, init_containers: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {
            "name": "web-0", "namespace": "shop", "resourceVersion": "42",
            "annotations": {
                SIDECARSET_HASH: r#"{"logs":{"updateTimestamp":null,"hash":"l","sidecarSetName":"logs","sidecarList":["fluent"]}}"#,
            },
        },
        "spec": {"containers": containers, "initContainers": init_containers},
    }))
    .expect("pod")
}

fn resources(cpu: &str, memory: &str) -> Value {
    json!({"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu, "memory": memory}})
}

#[test]
fn a_sidecar_with_new_resources_is_resized_by_name_guarded_by_the_resource_version() {
    let s = set(
        json!([{"name": "proxy", "image": "proxy:1", "resources": resources("200m", "128Mi")}]),
        json!([]),
    );
    let p = pod(
        json!([
            {"name": "app", "image": "app:1", "resources": resources("1", "1Gi")},
            {"name": "proxy", "image": "proxy:1", "resources": resources("100m", "64Mi")},
        ]),
        json!([]),
    );
    assert_eq!(
        resize_patch(&s, &p).expect("computed"),
        Some(json!({
            "metadata": {"resourceVersion": "42"},
            "spec": {"containers": [{"name": "proxy", "resources": resources("200m", "128Mi")}]},
        }))
    );
}

#[test]
fn equal_resources_written_differently_need_no_resize() {
    let s = set(
        json!([{"name": "proxy", "image": "proxy:2", "resources": resources("0.2", "128Mi")}]),
        json!([]),
    );
    let p = pod(
        json!([{"name": "proxy", "image": "proxy:1", "resources": resources("200m", "134217728")}]),
        json!([]),
    );
    assert_eq!(resize_patch(&s, &p).expect("computed"), None);
}

#[test]
fn a_limit_alone_requests_as_much_and_a_dropped_resource_is_sent_as_removed() {
    // The pod got requests = limits from the apiserver's defaulting at creation.
    let p = pod(
        json!([{"name": "proxy", "image": "proxy:1", "resources": resources("100m", "64Mi")}]),
        json!([]),
    );
    let limits_only = set(
        json!([{"name": "proxy", "image": "proxy:1",
                "resources": {"limits": {"cpu": "200m", "memory": "64Mi"}}}]),
        json!([]),
    );
    assert_eq!(
        resize_patch(&limits_only, &p).expect("computed"),
        Some(json!({
            "metadata": {"resourceVersion": "42"},
            "spec": {"containers": [{"name": "proxy", "resources": resources("200m", "64Mi")}]},
        })),
        "no request is sent as removed"
    );
    let no_memory = set(
        json!([{"name": "proxy", "image": "proxy:1", "resources": {"limits": {"cpu": "200m"}}}]),
        json!([]),
    );
    assert_eq!(
        resize_patch(&no_memory, &p).expect("computed"),
        Some(json!({
            "metadata": {"resourceVersion": "42"},
            "spec": {"containers": [{"name": "proxy", "resources": {
                "requests": {"cpu": "200m", "memory": null},
                "limits": {"cpu": "200m", "memory": null},
            }}]},
        })),
        "the apiserver is asked to remove memory, and refuses by its own rules"
    );
}

#[test]
fn hot_upgrade_twins_and_native_sidecars_are_resized_too() {
    let s = set(
        json!([{"name": "proxy", "image": "proxy:1", "resources": resources("200m", "64Mi"),
                "upgradeStrategy": {"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "empty:1"}}]),
        json!([
            {"name": "native", "image": "n:1", "restartPolicy": "Always", "resources": resources("300m", "64Mi")},
            {"name": "setup", "image": "s:1", "resources": resources("1", "1Gi")},
        ]),
    );
    let p = pod(
        json!([
            {"name": "proxy-1", "image": "proxy:1", "resources": resources("100m", "64Mi")},
            {"name": "proxy-2", "image": "empty:1", "resources": resources("100m", "64Mi")},
        ]),
        json!([
            {"name": "setup", "image": "s:1", "resources": resources("2", "1Gi")},
            {"name": "native", "image": "n:1", "restartPolicy": "Always", "resources": resources("100m", "64Mi")},
        ]),
    );
    let patch = resize_patch(&s, &p).expect("computed").expect("a patch");
    assert_eq!(
        patch["spec"]["containers"],
        json!([
            {"name": "proxy-1", "resources": resources("200m", "64Mi")},
            {"name": "proxy-2", "resources": resources("200m", "64Mi")},
        ])
    );
    assert_eq!(
        patch["spec"]["initContainers"],
        json!([{"name": "native", "resources": resources("300m", "64Mi")}]),
        "a plain init container is never resized"
    );
}

#[test]
fn a_resources_policy_is_evaluated_against_the_pods_app_containers() {
    let s = set(
        json!([{"name": "proxy", "image": "proxy:1",
        "resourcesPolicy": {
            "targetContainersMode": "sum",
            "resourcesExpr": {"limits": {"cpu": "cpu*50%"}, "requests": {"cpu": "cpu*50%"}},
        }}]),
        json!([]),
    );
    let p = pod(
        json!([
            {"name": "a", "image": "a:1", "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}},
            {"name": "b", "image": "b:1", "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}},
            // Another SidecarSet's sidecar (listed in the pod's hash annotation) is no target.
            {"name": "fluent", "image": "f:1", "resources": {"requests": {"cpu": "4"}, "limits": {"cpu": "4"}}},
            {"name": "proxy", "image": "proxy:1", "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "100m"}}},
        ]),
        json!([]),
    );
    let patch = resize_patch(&s, &p).expect("computed").expect("a patch");
    assert_eq!(
        patch["spec"]["containers"],
        json!([{"name": "proxy", "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}}])
    );
    let unmatched = set(
        json!([{"name": "proxy", "image": "proxy:1",
        "resourcesPolicy": {
            "targetContainersMode": "sum",
            "targetContainersNameRegex": "^nothing$",
            "resourcesExpr": {"limits": {"cpu": "cpu"}},
        }}]),
        json!([]),
    );
    let err = resize_patch(&unmatched, &p).expect_err("no target");
    assert!(
        err.to_string().contains("container proxy: resourcesPolicy"),
        "{err}"
    );
}

#[test]
fn containers_are_listed_in_the_pods_order_not_the_sidecarsets() {
    let s = set(
        json!([
            {"name": "second", "image": "b:1", "resources": resources("200m", "64Mi")},
            {"name": "first", "image": "a:1", "resources": resources("200m", "64Mi")},
        ]),
        json!([]),
    );
    let p = pod(
        json!([
            {"name": "first", "image": "a:1", "resources": resources("100m", "64Mi")},
            {"name": "app", "image": "app:1"},
            {"name": "second", "image": "b:1", "resources": resources("100m", "64Mi")},
        ]),
        json!([]),
    );
    let patch = resize_patch(&s, &p).expect("computed").expect("a patch");
    let order: Vec<&str> = patch["spec"]["containers"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|c| c["name"].as_str().expect("a name"))
        .collect();
    assert_eq!(order, ["first", "second"]);
}
