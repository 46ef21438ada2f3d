//! The hot upgrade of one pod step by step, with the kubelet played by hand: upstream's e2e
//! sequence (inject, upgrade, flip, upgrade back), a failed image, and the guards.

use super::*;
use crate::controllers::sidecarset::pods::{owns, test_view};
use crate::controllers::sidecarset::rollout::CurrentHashes;
use crate::controllers::sidecarset::upgrade::upgrade_patch;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kruise_rs_api::sidecarset::SidecarSetSpec;
use kruise_rs_api::well_known::SIDECARSET_HASH;

const EMPTY: &str = "empty:1";

fn now() -> Time {
    Time("2026-12-02T12:00:00Z".parse().expect("time"))
}

/// SidecarSet `mesh` with a cold `logs` and a hot `proxy` on `image`, at `resource_version`.
fn set(image: &str, resource_version: &str) -> SidecarSet {
    let spec: SidecarSetSpec = serde_json::from_value(json!({
        "selector": {"matchLabels": {"app": "web"}},
        "containers": [
            {"name": "logs", "image": "logs:1"},
            {"name": "proxy", "image": image,
             "upgradeStrategy": {"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": EMPTY}},
        ],
    }))
    .expect("spec");
    let mut set = SidecarSet::new("mesh", spec);
    set.metadata.resource_version = Some(resource_version.into());
    set
}

fn current() -> CurrentHashes {
    CurrentHashes {
        hash: "h2".into(),
        without_image: "w".into(),
        ..CurrentHashes::default()
    }
}

fn id(image: &str) -> String {
    format!("{}@sha256:{}", image.replace(':', "-"), image.len())
}

/// A pod as injection leaves it and the kubelet runs it: `proxy-1` on `first`, `proxy-2` on
/// `second`, `proxy-1` working, everything ready.
fn pod(first: &str, second: &str) -> PodSummary {
    let status = |name: &str, image: &str| json!({"name": name, "image": image, "imageID": id(image), "ready": true, "restartCount": 0});
    serde_json::from_value(json!({
        "metadata": {
            "name": "web-0", "namespace": "shop", "labels": {"app": "web"},
            "annotations": {
                "kruise.io/sidecarset-injected-list": "mesh",
                SIDECARSET_HASH: r#"{"mesh":{"updateTimestamp":null,"hash":"h1","sidecarSetName":"mesh","sidecarList":["logs","proxy"]}}"#,
                "kruise.io/sidecarset-working-hotupgrade-container": r#"{"proxy":"proxy-1"}"#,
                "version.sidecarset.kruise.io/proxy-1": "1",
                "versionalt.sidecarset.kruise.io/proxy-1": "0",
                "version.sidecarset.kruise.io/proxy-2": "0",
                "versionalt.sidecarset.kruise.io/proxy-2": "1",
            },
        },
        "spec": {"nodeName": "n1", "containers": [
            {"name": "logs", "image": "logs:1"},
            {"name": "proxy-1", "image": first},
            {"name": "proxy-2", "image": second},
            {"name": "app", "image": "shop:1"},
        ]},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [
                status("logs", "logs:1"), status("proxy-1", first),
                status("proxy-2", second), status("app", "shop:1"),
            ],
        }
    }))
    .expect("pod")
}

fn apply(pod: &PodSummary, patch: &json_patch::Patch) -> PodSummary {
    let mut doc = serde_json::to_value(pod).expect("pod json");
    json_patch::patch(&mut doc, patch).expect("the patch applies to the pod it was built from");
    serde_json::from_value(doc).expect("still a pod")
}

/// `pod` after `set`'s upgrade patch.
fn upgraded(pod: &PodSummary, set: &SidecarSet) -> PodSummary {
    apply(
        pod,
        &upgrade_patch(pod, set, &current(), &now())
            .expect("patch")
            .patch,
    )
}

/// The kubelet restarts `container` on its spec image; `ready` says whether it becomes ready.
fn kubelet_restarts(pod: &mut PodSummary, container: &str, ready: bool) {
    let image = image_of(pod, container).expect("container").to_owned();
    let status = pod.status.as_mut().expect("status");
    let s = status
        .container_statuses
        .as_mut()
        .expect("statuses")
        .iter_mut()
        .find(|s| *s.name == *container)
        .expect("status");
    s.image_id = id(&image).into();
    s.image = image.into();
    s.ready = ready;
    s.restart_count += 1;
    let all = status
        .container_statuses
        .as_ref()
        .expect("statuses")
        .iter()
        .all(|s| s.ready);
    status.conditions.as_mut().expect("conditions")[0].status =
        if all { "True" } else { "False" }.into();
}

fn annotation<'a>(pod: &'a PodSummary, key: &str) -> &'a str {
    pod.annotation(key).unwrap_or("<unset>")
}

fn versions(pod: &PodSummary) -> [&str; 5] {
    [
        annotation(pod, "kruise.io/sidecarset-working-hotupgrade-container"),
        annotation(pod, "version.sidecarset.kruise.io/proxy-1"),
        annotation(pod, "versionalt.sidecarset.kruise.io/proxy-1"),
        annotation(pod, "version.sidecarset.kruise.io/proxy-2"),
        annotation(pod, "versionalt.sidecarset.kruise.io/proxy-2"),
    ]
}

fn flip_of(set: &SidecarSet, pod: &PodSummary) -> Option<Flip> {
    let v = test_view(set, pod);
    let names: Vec<String> = v.sidecars.iter().map(|s| s.name.to_string()).collect();
    flip_patch(set, pod, &names, |c| {
        v.sidecars.iter().any(|s| &*s.name == c && s.image_running)
    })
}

fn images(pod: &PodSummary) -> Vec<&str> {
    ["logs", "proxy-1", "proxy-2", "app"]
        .into_iter()
        .map(|c| image_of(pod, c).expect("container"))
        .collect()
}

#[test]
fn upgrade_flip_and_upgrade_back_as_upstreams_e2e() {
    let v2 = set("proxy:2", "100");
    let mut pod = pod("proxy:1", EMPTY);
    assert!(
        test_view(&v2, &pod).ready,
        "steady: the idle twin is on the empty image"
    );

    // The twin on the empty image takes the new image and becomes the working one.
    let upgrade = upgrade_patch(&pod, &v2, &current(), &now()).expect("patch");
    assert_eq!(upgrade.changed, ["proxy-2"]);
    pod = apply(&pod, &upgrade.patch);
    assert_eq!(images(&pod), ["logs:1", "proxy:1", "proxy:2", "shop:1"]);
    assert_eq!(
        versions(&pod),
        [r#"{"proxy":"proxy-2"}"#, "1", "100", "100", "1"]
    );
    // Updated, not ready: it holds a place in maxUnavailable until the flip is done.
    let v = test_view(&v2, &pod);
    assert!(!v.ready && !v.images_running());
    assert!(
        flip_of(&v2, &pod).is_none(),
        "no flip before the new twin runs"
    );

    // The kubelet restarted proxy-2 on the new image: the old twin goes idle.
    kubelet_restarts(&mut pod, "proxy-2", true);
    let flip = flip_of(&v2, &pod).expect("flip");
    assert_eq!(flip.reset, ["proxy-1"]);
    pod = apply(&pod, &flip.patch);
    assert_eq!(images(&pod), ["logs:1", EMPTY, "proxy:2", "shop:1"]);
    assert_eq!(
        versions(&pod),
        [r#"{"proxy":"proxy-2"}"#, "0", "100", "100", "0"]
    );
    let v = test_view(&v2, &pod);
    assert!(v.ready, "ready: the idle twin's spec is the empty image");
    assert!(
        !v.images_running(),
        "until the kubelet restarted the old twin"
    );
    assert!(flip_of(&v2, &pod).is_none(), "one flip");
    kubelet_restarts(&mut pod, "proxy-1", true);
    assert!(test_view(&v2, &pod).is_available());

    // Back to proxy:1: proxy-1, on the empty image now, works again.
    let v1 = set("proxy:1", "200");
    let upgrade = upgrade_patch(&pod, &v1, &current(), &now()).expect("patch");
    assert_eq!(upgrade.changed, ["proxy-1"]);
    pod = apply(&pod, &upgrade.patch);
    assert_eq!(
        versions(&pod),
        [r#"{"proxy":"proxy-1"}"#, "200", "100", "100", "200"]
    );
    kubelet_restarts(&mut pod, "proxy-1", true);
    pod = apply(&pod, &flip_of(&v1, &pod).expect("flip").patch);
    assert_eq!(images(&pod), ["logs:1", "proxy:1", EMPTY, "shop:1"]);
    assert_eq!(
        versions(&pod),
        [r#"{"proxy":"proxy-1"}"#, "200", "0", "0", "200"]
    );
    // The app container was never touched.
    assert_eq!(
        pod.status
            .as_ref()
            .expect("status")
            .container_statuses
            .as_ref()
            .expect("statuses")[3]
            .restart_count,
        0
    );
}

#[test]
fn a_failed_image_never_flips_and_a_good_one_goes_to_the_twin_that_is_not_ready() {
    let bad = set("proxy:bad", "100");
    let mut pod = pod("proxy:1", EMPTY);
    pod = upgraded(&pod, &bad);
    kubelet_restarts(&mut pod, "proxy-2", false);
    assert!(flip_of(&bad, &pod).is_none(), "the old twin keeps serving");
    assert_eq!(image_of(&pod, "proxy-1"), Some("proxy:1"));

    let good = set("proxy:3", "300");
    let view_of = test_view(&good, &pod);
    let settled = |c: &str| {
        view_of
            .sidecars
            .iter()
            .any(|s| &*s.name == c && s.ready && s.image_running)
    };
    assert_eq!(
        twin_to_upgrade(&good.spec.containers[1], &pod, settled),
        Some(Twin::Second)
    );
    let upgrade = upgrade_patch(&pod, &good, &current(), &now()).expect("patch");
    assert_eq!(upgrade.changed, ["proxy-2"]);
    pod = apply(&pod, &upgrade.patch);
    kubelet_restarts(&mut pod, "proxy-2", true);
    pod = apply(&pod, &flip_of(&good, &pod).expect("flip").patch);
    assert_eq!(images(&pod), ["logs:1", EMPTY, "proxy:3", "shop:1"]);
}

#[test]
fn the_twin_to_upgrade_follows_upstreams_order() {
    let sidecar = &set("proxy:9", "1").spec.containers[1];
    let none = |_: &str| false;
    // A twin on the empty image first, -1 looked at first.
    assert_eq!(
        twin_to_upgrade(sidecar, &pod(EMPTY, EMPTY), none),
        Some(Twin::First)
    );
    assert_eq!(
        twin_to_upgrade(sidecar, &pod("proxy:1", EMPTY), none),
        Some(Twin::Second)
    );
    // Neither idle: the one not settled when the other is.
    let both = pod("proxy:1", "proxy:2");
    assert_eq!(
        twin_to_upgrade(sidecar, &both, |c| c == "proxy-1"),
        Some(Twin::Second)
    );
    assert_eq!(
        twin_to_upgrade(sidecar, &both, |c| c == "proxy-2"),
        Some(Twin::First)
    );
    // Both or neither settled: the one not working (proxy-1 works here).
    assert_eq!(
        twin_to_upgrade(sidecar, &both, |_| true),
        Some(Twin::Second)
    );
    assert_eq!(twin_to_upgrade(sidecar, &both, none), Some(Twin::Second));
    // The twin not chosen already runs the new image: nothing to change.
    assert_eq!(twin_to_upgrade(sidecar, &pod("proxy:9", EMPTY), none), None);
}

#[test]
fn a_pod_already_running_the_image_only_gets_its_hash_entry() {
    let v2 = set("proxy:2", "100");
    let before = pod("proxy:2", EMPTY);
    let upgrade = upgrade_patch(&before, &v2, &current(), &now()).expect("patch");
    assert!(upgrade.changed.is_empty());
    let after = apply(&before, &upgrade.patch);
    assert_eq!(versions(&after), versions(&before));
    assert!(annotation(&after, SIDECARSET_HASH).contains(r#""hash":"h2""#));
}

#[test]
fn the_flip_waits_for_the_rest_of_the_pod() {
    let v2 = set("proxy:2", "100");
    let mut pod = pod("proxy:1", EMPTY);
    pod = upgraded(&pod, &v2);
    kubelet_restarts(&mut pod, "proxy-2", true);
    // The app container is not ready: the pod is neither Ready nor ready apart from the old twin.
    let mut not_ready = pod.clone();
    kubelet_restarts(&mut not_ready, "app", false);
    assert!(flip_of(&v2, &not_ready).is_none());
    // A cold sidecar not on its spec image yet holds it too.
    let mut logs_behind = pod.clone();
    logs_behind.spec.as_mut().expect("spec").containers[0].image = Some("logs:2".into());
    let states = r#"{"mesh":{"revision":"h2","updateTimestamp":null,"lastContainerStatuses":{"logs":{"imageID":"logs-1@sha256:6"}}}}"#;
    logs_behind.set_annotation(SIDECARSET_INPLACE_UPDATE_STATE, states);
    assert!(flip_of(&v2, &logs_behind).is_none());
    // The old twin itself may be anything: not ready, not consistent.
    let mut old_down = pod.clone();
    kubelet_restarts(&mut old_down, "proxy-1", false);
    assert!(flip_of(&v2, &old_down).is_some());
}

#[test]
fn the_flip_patch_refuses_a_pod_that_changed() {
    let v2 = set("proxy:2", "100");
    let mut pod = pod("proxy:1", EMPTY);
    pod = upgraded(&pod, &v2);
    kubelet_restarts(&mut pod, "proxy-2", true);
    let flip = flip_of(&v2, &pod).expect("flip");
    // Another writer moved the working twin meanwhile.
    let mut moved = pod.clone();
    moved.set_annotation(
        SIDECARSET_WORKING_HOTUPGRADE_CONTAINER,
        r#"{"proxy":"proxy-1"}"#,
    );
    let mut doc = serde_json::to_value(&moved).expect("json");
    assert!(json_patch::patch(&mut doc, &flip.patch).is_err());
    // ... or changed the old twin's image.
    let mut changed = pod.clone();
    changed.spec.as_mut().expect("spec").containers[1].image = Some("proxy:7".into());
    let mut doc = serde_json::to_value(&changed).expect("json");
    assert!(json_patch::patch(&mut doc, &flip.patch).is_err());
}

#[test]
fn ownership_needs_both_twins_and_a_working_entry() {
    let v2 = set("proxy:2", "100");
    let namespaces = Default::default();
    let owned = pod("proxy:1", EMPTY);
    assert!(owns(&v2, &owned, &namespaces));
    let names: Vec<String> = test_view(&v2, &owned)
        .sidecars
        .into_iter()
        .map(|s| s.name.to_string())
        .collect();
    assert_eq!(names, ["logs", "proxy-1", "proxy-2"]);

    let mut no_entry = owned.clone();
    no_entry.remove_annotation(SIDECARSET_WORKING_HOTUPGRADE_CONTAINER);
    assert!(!owns(&v2, &no_entry, &namespaces));
    let mut one_twin = owned.clone();
    one_twin.spec.as_mut().expect("spec").containers.remove(2);
    assert!(!owns(&v2, &one_twin, &namespaces));
    // A pod with the sidecar under its plain name (injected cold) is not this hot set's.
    let mut cold = owned;
    cold.spec.as_mut().expect("spec").containers[1].name = "proxy".into();
    assert!(!owns(&v2, &cold, &namespaces));
}

#[test]
fn flips_wait_for_a_paused_or_not_update_rollout_and_leave_the_batch() {
    use crate::controllers::sidecarset::plan::flips;
    use crate::controllers::sidecarset::rollout::{Batch, Hold};
    use std::sync::Arc;

    let v2 = set("proxy:2", "100");
    let mut mid = pod("proxy:1", EMPTY);
    mid = upgraded(&mid, &v2);
    kubelet_restarts(&mut mid, "proxy-2", true);
    let owned = vec![Arc::new(pod("proxy:1", EMPTY)), Arc::new(mid)];
    let views: Vec<_> = owned.iter().map(|p| test_view(&v2, p)).collect();

    let mut batch = Batch {
        upgrade: vec![0, 1],
        ..Default::default()
    };
    let found = flips(&v2, &owned, &views, &mut batch);
    assert_eq!(found.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [1]);
    assert_eq!(batch.upgrade, [0], "the flipping pod is not upgraded too");

    for hold in [Hold::Paused, Hold::NotUpdate] {
        let mut batch = Batch {
            hold: Some(hold.clone()),
            ..Default::default()
        };
        assert!(
            flips(&v2, &owned, &views, &mut batch).is_empty(),
            "{hold:?}"
        );
    }
    // Other holds (maxUnavailable, partition) do not stop a flip: it finishes an upgrade.
    let mut batch = Batch {
        hold: Some(Hold::Partition { partition: 1 }),
        ..Default::default()
    };
    assert_eq!(flips(&v2, &owned, &views, &mut batch).len(), 1);
}

#[test]
fn native_sidecar_twins_are_owned_and_viewed_never_flipped() {
    let spec: SidecarSetSpec = serde_json::from_value(json!({
        "selector": {"matchLabels": {"app": "web"}},
        "initContainers": [{"name": "envoy", "image": "envoy:2", "restartPolicy": "Always",
            "upgradeStrategy": {"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": EMPTY}}],
        "updateStrategy": {"type": "NotUpdate"},
    }))
    .expect("spec");
    let set = SidecarSet::new("mesh", spec);
    let mut pod = pod("proxy:1", EMPTY);
    pod.set_annotation(
        SIDECARSET_WORKING_HOTUPGRADE_CONTAINER,
        r#"{"envoy":"envoy-1","proxy":"proxy-1"}"#,
    );
    let spec = pod.spec.as_mut().expect("spec");
    spec.init_containers = serde_json::from_value(json!([
        {"name": "envoy-1", "image": "envoy:1"},
        {"name": "envoy-2", "image": EMPTY},
    ]))
    .expect("init containers");
    assert!(owns(&set, &pod, &Default::default()));
    let names: Vec<String> = test_view(&set, &pod)
        .sidecars
        .into_iter()
        .map(|s| s.name.to_string())
        .collect();
    assert_eq!(names, ["envoy-1", "envoy-2"]);
    assert!(
        flip_of(&set, &pod).is_none(),
        "init twins are never flipped"
    );
    // Without its twins the pod is not this SidecarSet's.
    pod.spec.as_mut().expect("spec").init_containers.truncate(1);
    assert!(!owns(&set, &pod, &Default::default()));
}
