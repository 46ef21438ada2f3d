use serde_json::json;

use super::*;
use kruise_rs_api::sidecarset::SidecarSetSpec;
use kruise_rs_controller::pod_summary::strip_pod;

fn set(image: &str) -> SidecarSet {
    let spec: SidecarSetSpec = serde_json::from_value(json!({
        "selector": {"matchLabels": {"app": "web"}},
        "containers": [{"name": "proxy", "image": image}],
    }))
    .expect("spec");
    SidecarSet::new("mesh", spec)
}

/// A running, ready pod injected with `mesh`, its proxy on `image` reported as `image_id`.
fn pod(image: &str, status_image: &str, image_id: &str) -> PodSummary {
    serde_json::from_value(json!({
        "metadata": {
            "name": "web-0", "namespace": "shop", "labels": {"app": "web"},
            "annotations": {
                SIDECARSET_INJECTED_LIST: "logs,mesh",
                SIDECARSET_HASH: r#"{"mesh":{"updateTimestamp":null,"hash":"h1","sidecarSetName":"mesh","sidecarList":["proxy"]}}"#,
                SIDECARSET_HASH_WITHOUT_IMAGE: r#"{"mesh":{"updateTimestamp":null,"hash":"w1","sidecarSetName":"mesh","sidecarList":["proxy"]}}"#,
                "kubectl.kubernetes.io/last-applied-configuration": "{…}",
            }
        },
        "spec": {
            "nodeName": "node-1",
            "containers": [
                {"name": "proxy", "image": image, "env": [{"name": "A", "value": "b"}]},
                {"name": "app", "image": "shop:1"},
            ]
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-29T10:00:00Z"},
                {"type": "PodScheduled", "status": "True"},
            ],
            "containerStatuses": [
                {"name": "proxy", "image": status_image, "imageID": image_id, "ready": true, "restartCount": 2},
                {"name": "app", "image": "shop:1", "imageID": "shop@sha256:aa", "ready": true, "restartCount": 0},
            ]
        }
    }))
    .expect("pod")
}

fn with_state(mut pod: PodSummary, state: &str) -> PodSummary {
    pod.set_annotation(SIDECARSET_INPLACE_UPDATE_STATE, state);
    pod
}

const RECORD: &str = r#"{"mesh":{"revision":"h2","updateTimestamp":"2026-11-29T11:00:00Z","lastContainerStatuses":{"proxy":{"imageID":"docker.io/library/proxy@sha256:old"}}}}"#;

#[test]
fn the_view_reads_hashes_readiness_and_order_fields() {
    let p = pod("proxy:1", "proxy:1", "proxy@sha256:11");
    let at = |hash: &str, without_image: &str| CurrentHashes {
        hash: hash.into(),
        without_image: without_image.into(),
        ..CurrentHashes::default()
    };
    let s = set("proxy:1");
    let v = view(&s, &at("h1", "w1"), &p);
    assert_eq!(v.key(), "shop/web-0");
    assert!(v.hash_current && v.hash_without_image_current);
    let moved = view(&s, &at("h2", "w1"), &p);
    assert!(!moved.hash_current && moved.hash_without_image_current);
    let reshaped = view(&s, &at("h2", "w2"), &p);
    assert!(!reshaped.hash_current && !reshaped.hash_without_image_current);
    assert!(v.ready);
    assert_eq!(v.phase, PodPhase::Running);
    assert_eq!(v.restarts, 2);
    assert_eq!(v.node_name(), Some("node-1"));
    assert_eq!(
        v.ready_since.get(),
        Some("2026-11-29T10:00:00Z".parse().expect("time"))
    );
    assert_eq!(
        v.sidecars.as_slice(),
        [SidecarView {
            name: "proxy".into(),
            ready: true,
            image_running: true,
            native: false,
        }]
    );
}

#[test]
fn a_pod_is_ready_only_when_running_with_the_ready_condition() {
    let mut p = pod("proxy:1", "proxy:1", "id");
    p.status.as_mut().expect("status").phase = Some("Pending".into());
    assert!(!test_view(&set("proxy:1"), &p).ready);
    let mut p = pod("proxy:1", "proxy:1", "id");
    p.status
        .as_mut()
        .expect("status")
        .conditions
        .as_mut()
        .expect("c")[0]
        .status = "False".into();
    assert!(!test_view(&set("proxy:1"), &p).ready);
}

#[test]
fn after_an_upgrade_the_sidecar_runs_its_image_once_the_image_id_changes() {
    let s = set("proxy:2");
    // kubelet has not restarted it: same imageID, old image name.
    let waiting = with_state(
        pod(
            "proxy:2",
            "docker.io/library/proxy:1",
            "docker.io/library/proxy@sha256:old",
        ),
        RECORD,
    );
    assert!(!test_view(&s, &waiting).sidecars[0].image_running);
    // Restarted on the new image.
    let done = with_state(
        pod(
            "proxy:2",
            "docker.io/library/proxy:2",
            "docker.io/library/proxy@sha256:new",
        ),
        RECORD,
    );
    assert!(test_view(&s, &done).sidecars[0].image_running);
}

#[test]
fn a_new_tag_of_the_same_image_counts_once_kubelet_reports_the_new_name() {
    // #1270: the new tag has the old imageID; the runtime reports the name normalized.
    let retagged = with_state(
        pod(
            "proxy:2",
            "docker.io/library/proxy:2",
            "docker.io/library/proxy@sha256:old",
        ),
        RECORD,
    );
    assert!(test_view(&set("proxy:2"), &retagged).sidecars[0].image_running);
}

#[test]
fn without_a_record_the_sidecar_counts_as_running() {
    let p = pod("proxy:2", "something-else", "x@sha256:zz");
    assert!(test_view(&set("proxy:2"), &p).sidecars[0].image_running);
}

#[test]
fn an_unreadable_record_falls_back_to_the_image_names() {
    let p = with_state(pod("proxy:2", "proxy:1", "x@sha256:zz"), "{oops");
    assert!(!test_view(&set("proxy:2"), &p).sidecars[0].image_running);
    let p = with_state(
        pod("proxy:2", "docker.io/library/proxy:2", "x@sha256:zz"),
        "{oops",
    );
    assert!(test_view(&set("proxy:2"), &p).sidecars[0].image_running);
}

#[test]
fn missing_container_statuses_mean_not_running() {
    let mut p = pod("proxy:1", "proxy:1", "id");
    p.status
        .as_mut()
        .expect("status")
        .container_statuses
        .as_mut()
        .expect("statuses")
        .pop();
    assert!(!test_view(&set("proxy:1"), &p).sidecars[0].image_running);
}

#[test]
fn digest_pinned_sidecars_compare_the_digest() {
    let d = "sha256:0123456789012345678901234567890123456789012345678901234567890123";
    let image = format!("proxy@{d}");
    let s = set(&image);
    let running = pod(
        &image,
        "proxy:whatever",
        &format!("docker.io/library/proxy@{d}"),
    );
    assert!(test_view(&s, &running).sidecars[0].image_running);
    let other = pod(&image, &image, "docker.io/library/proxy@sha256:other");
    assert!(!test_view(&s, &other).sidecars[0].image_running);
}

#[test]
fn ownership_needs_the_injected_list_the_selector_and_every_sidecar() {
    let s = set("proxy:1");
    let namespaces = NamespaceLabels::new();
    assert!(owns(&s, &pod("proxy:1", "proxy:1", "id"), &namespaces));

    let mut not_listed = pod("proxy:1", "proxy:1", "id");
    not_listed.set_annotation(SIDECARSET_INJECTED_LIST, "mesh-v2");
    assert!(!owns(&s, &not_listed, &namespaces));

    let mut relabelled = pod("proxy:1", "proxy:1", "id");
    relabelled.set_labels(&[("app".into(), "db".into())].into());
    assert!(!owns(&s, &relabelled, &namespaces));

    let mut missing = pod("proxy:1", "proxy:1", "id");
    missing.spec.as_mut().expect("spec").containers.remove(0);
    assert!(!owns(&s, &missing, &namespaces));
}

/// `mesh` with `proxy` on `proxy:1` and a native sidecar `agent` on `agent`.
fn native_set(agent: &str) -> SidecarSet {
    let mut s = set("proxy:1");
    s.spec.init_containers = serde_json::from_value(json!([
        {"name": "setup", "image": "setup:1"},
        {"name": "agent", "image": agent, "restartPolicy": "Always"},
    ]))
    .expect("init containers");
    s
}

/// [`pod`] (proxy on `proxy:1`) with init containers `setup` (done) and the native sidecar
/// `agent` on `agent`, reported as `status_image` / `image_id`, ready or not.
fn native_pod(agent: &str, status_image: &str, image_id: &str, ready: bool) -> PodSummary {
    let mut p = pod("proxy:1", "proxy:1", "proxy@sha256:11");
    let spec = p.spec.as_mut().expect("spec");
    spec.init_containers = serde_json::from_value(json!([
        {"name": "setup", "image": "setup:1"},
        {"name": "agent", "image": agent},
    ]))
    .expect("init containers");
    p.status.as_mut().expect("status").init_container_statuses = Some(
        serde_json::from_value(json!([
            {"name": "setup", "image": "setup:1", "imageID": "setup@sha256:s", "ready": false, "restartCount": 0},
            {"name": "agent", "image": status_image, "imageID": image_id, "ready": ready, "restartCount": 0},
        ]))
        .expect("init statuses"),
    );
    p
}

#[test]
fn ownership_needs_the_native_sidecars_among_the_init_containers() {
    let namespaces = NamespaceLabels::new();
    let s = native_set("agent:1");
    let p = native_pod("agent:1", "agent:1", "agent@sha256:1", true);
    assert!(owns(&s, &p, &namespaces));
    // A plain init container of the SidecarSet is not required (it may have been dropped).
    let mut without_setup = p.clone();
    without_setup
        .spec
        .as_mut()
        .expect("spec")
        .init_containers
        .remove(0);
    assert!(owns(&s, &without_setup, &namespaces));
    // Without the native sidecar, or with it only among the containers, the pod is not owned.
    let mut missing = p.clone();
    missing
        .spec
        .as_mut()
        .expect("spec")
        .init_containers
        .remove(1);
    assert!(!owns(&s, &missing, &namespaces));
    let spec = missing.spec.as_mut().expect("spec");
    spec.containers.push(ContainerSummary {
        name: "agent".into(),
        image: Some("agent:1".into()),
    });
    assert!(!owns(&s, &missing, &namespaces));
}

#[test]
fn native_sidecars_are_viewed_from_the_init_container_statuses() {
    let s = native_set("agent:1");
    let p = native_pod("agent:1", "agent:1", "agent@sha256:1", false);
    let v = test_view(&s, &p);
    let sidecars: Vec<(&str, bool, bool)> = v
        .sidecars
        .iter()
        .map(|c| (&*c.name, c.ready, c.image_running))
        .collect();
    // The plain init container `setup` is no sidecar.
    assert_eq!(sidecars, [("proxy", true, true), ("agent", false, true)]);
    let native: Vec<bool> = v.sidecars.iter().map(|c| c.native).collect();
    assert_eq!(native, [false, true]);
}

#[test]
fn the_view_knows_when_the_hash_entry_was_written() {
    let s = set("proxy:1");
    let mut p = pod("proxy:1", "proxy:1", "id");
    assert_eq!(
        test_view(&s, &p).hash_written.get(),
        None,
        "null in the entry"
    );
    p.set_annotation(SIDECARSET_HASH, r#"{"mesh":{"updateTimestamp":"2026-11-29T11:00:00Z","hash":"h1","sidecarSetName":"mesh"}}"#
            );
    assert_eq!(
        test_view(&s, &p).hash_written.get(),
        Some("2026-11-29T11:00:00Z".parse().expect("time"))
    );
}

#[test]
fn after_an_upgrade_a_native_sidecar_runs_its_image_once_the_image_id_changes() {
    let s = native_set("agent:2");
    let record = r#"{"mesh":{"revision":"h2","updateTimestamp":"2026-11-29T11:00:00Z","lastContainerStatuses":{"agent":{"imageID":"agent@sha256:1"}}}}"#;
    let waiting = with_state(
        native_pod("agent:2", "agent:1", "agent@sha256:1", true),
        record,
    );
    let v = test_view(&s, &waiting);
    assert!(!v.sidecars[1].image_running && v.sidecars[1].ready);
    assert!(!v.images_running());
    let done = with_state(
        native_pod("agent:2", "agent:2", "agent@sha256:2", true),
        record,
    );
    assert!(test_view(&s, &done).images_running());
    // Init container statuses that do not cover every init container: not running yet.
    let mut partial = done.clone();
    partial
        .status
        .as_mut()
        .expect("status")
        .init_container_statuses
        .as_mut()
        .expect("init statuses")
        .remove(0);
    let v = test_view(&s, &partial);
    assert!(v.sidecars[0].image_running && !v.sidecars[1].image_running);
}

#[test]
fn digest_pinned_native_sidecars_compare_the_digest() {
    let digest = format!("sha256:{}", "b".repeat(64));
    let proxy = format!("proxy@sha256:{}", "a".repeat(64));
    let agent = format!("agent@{digest}");
    let mut s = native_set(&agent);
    s.spec.containers[0].container.image = Some(proxy.clone());
    let mut p = native_pod(&agent, &agent, &format!("docker.io/library/{agent}"), true);
    p.spec.as_mut().expect("spec").containers[0].image = Some(proxy.as_str().into());
    p.status
        .as_mut()
        .expect("status")
        .container_statuses
        .as_mut()
        .expect("s")[0]
        .image_id = format!("docker.io/library/{proxy}").into();
    assert!(test_view(&s, &p).images_running());
    p.status
        .as_mut()
        .expect("status")
        .init_container_statuses
        .as_mut()
        .expect("s")[1]
        .image_id = "agent@sha256:other".into();
    let v = test_view(&s, &p);
    assert!(v.sidecars[0].image_running && !v.sidecars[1].image_running);
}

#[test]
fn ownership_follows_the_namespace_selector() {
    let mut s = set("proxy:1");
    s.spec.namespace_selector =
        serde_json::from_value(json!({"matchLabels": {"mesh": "on"}})).expect("selector");
    let p = pod("proxy:1", "proxy:1", "id");
    let mut namespaces = NamespaceLabels::new();
    namespaces.insert("shop".into(), [("mesh".into(), "off".into())].into());
    assert!(!owns(&s, &p, &namespaces));
    namespaces.insert("shop".into(), [("mesh".into(), "on".into())].into());
    assert!(owns(&s, &p, &namespaces));
}

#[test]
fn stripping_keeps_what_decisions_read_and_drops_other_annotations() {
    let mut p = with_state(pod("proxy:1", "proxy:1", "id"), RECORD);
    let unstripped = p.clone();
    let before = test_view(&set("proxy:1"), &unstripped);
    strip_pod(&mut p);
    let after = test_view(&set("proxy:1"), &p);
    assert_eq!(
        (after.key(), after.labels()),
        (before.key(), before.labels())
    );
    assert_eq!(after.node_name(), before.node_name());
    // Everything else the view read is the same too (its pod is the stripped one, of course).
    assert_eq!(
        PodView {
            pod: &unstripped,
            ..after
        },
        before
    );
    assert!(
        p.annotation("kubectl.kubernetes.io/last-applied-configuration")
            .is_none()
    );
    assert!(p.annotation(SIDECARSET_INJECTED_LIST).is_some());
    let conditions = p.status.as_ref().and_then(|s| s.conditions.as_ref());
    assert_eq!(conditions.map(Vec::len), Some(1), "only Ready is kept");
}

#[test]
fn update_states_round_trip_in_upstream_order_and_keep_unknown_fields() {
    let text = r#"{"mesh":{"revision":"h2","updateTimestamp":"2026-11-29T11:00:00Z","lastContainerStatuses":{"proxy":{"imageID":"a<b"}},"updateImages":true}}"#;
    let states = parse_update_states(text).expect("readable");
    assert_eq!(
        render_update_states(&states),
        r#"{"mesh":{"revision":"h2","updateTimestamp":"2026-11-29T11:00:00Z","lastContainerStatuses":{"proxy":{"imageID":"a\u003cb"}},"updateImages":true}}"#
    );
    assert_eq!(
        parse_update_states("null"),
        Some(InPlaceUpdateStates::new())
    );
    assert_eq!(parse_update_states("[1]"), None);
}

#[test]
fn injected_lists_are_read_by_name_not_substring() {
    let p = pod("proxy:1", "proxy:1", "id");
    assert!(injected_with(&p, "mesh"));
    assert!(!injected_with(&p, "mes"));
    assert_eq!(injected_sidecarsets(&p), ["logs", "mesh"]);
}

#[test]
fn the_kubelets_resize_state_comes_from_its_conditions_then_the_observed_generation() {
    let with = |conditions: serde_json::Value, generation: Option<i64>, observed: Option<i64>| {
        let pod: PodSummary = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "generation": generation},
            "status": {"conditions": conditions, "observedGeneration": observed},
        }))
        .expect("pod");
        kubelet_resize(&pod)
    };
    let pending = |reason: &str| json!([{"type": POD_RESIZE_PENDING, "status": "True", "reason": reason, "message": "m"}]);
    assert_eq!(with(json!([]), Some(3), Some(3)), KubeletResize::Settled);
    assert_eq!(
        with(json!([]), Some(3), None),
        KubeletResize::Settled,
        "1.33"
    );
    assert_eq!(with(json!([]), Some(4), Some(3)), KubeletResize::Unobserved);
    assert_eq!(
        with(pending("Infeasible"), Some(3), Some(3)),
        KubeletResize::Infeasible
    );
    assert_eq!(
        with(pending("Deferred"), Some(3), Some(3)),
        KubeletResize::Deferred
    );
    assert_eq!(
        with(
            json!([{"type": POD_RESIZE_IN_PROGRESS, "status": "True"}]),
            Some(3),
            Some(3)
        ),
        KubeletResize::InProgress
    );
    assert_eq!(
        with(
            json!([{"type": POD_RESIZE_IN_PROGRESS, "status": "False"}]),
            Some(3),
            Some(3)
        ),
        KubeletResize::Settled
    );
}

#[test]
fn only_a_pod_on_a_resizable_version_needs_a_resize() {
    // Its hash entry records no revision name (injected before the first one was written).
    let p = pod("proxy:1", "proxy:1", "proxy@sha256:11");
    let s = set("proxy:1");
    let at = |hashes: &[&str], served: bool, without_image: &str| CurrentHashes {
        hash: "h2".into(),
        without_image: without_image.into(),
        resizable_hashes: hashes.iter().map(|r| (*r).to_owned()).collect(),
        resize_served: served,
    };
    assert_eq!(
        view(&s, &at(&["h1", "h2"], true, "w2"), &p).resize,
        InPlaceResize::Needed
    );
    assert_eq!(
        view(&s, &at(&["h1"], false, "w2"), &p).resize,
        InPlaceResize::Unserved
    );
    assert_eq!(
        view(&s, &at(&["h0", "h2"], true, "w2"), &p).resize,
        InPlaceResize::NotNeeded,
        "its version differs in more than resources"
    );
    assert_eq!(
        view(&s, &at(&["h1"], true, "w1"), &p).resize,
        InPlaceResize::NotNeeded,
        "only images changed"
    );
}
