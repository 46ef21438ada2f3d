use std::collections::BTreeMap;

use serde_json::json;
use smallvec::smallvec;

use super::*;
use crate::controllers::sidecarset::pods::test_pod;
use crate::controllers::sidecarset::rollout::{SidecarView, next_batch};
use kruise_rs_api::sidecarset::SidecarSetSpec;
use kruise_rs_api::well_known::{SIDECARSET_HASH, SIDECARSET_HASH_WITHOUT_IMAGE};

fn set(strategy: serde_json::Value) -> SidecarSet {
    let spec: SidecarSetSpec = serde_json::from_value(json!({
        "selector": {"matchLabels": {"app": "web"}},
        "containers": [{"name": "proxy", "image": "proxy:2"}],
        "updateStrategy": strategy,
    }))
    .expect("spec");
    let mut set = SidecarSet::new("proxy", spec);
    set.metadata.generation = Some(7);
    set.metadata.annotations = Some(BTreeMap::from([
        (SIDECARSET_HASH.to_owned(), "new".to_owned()),
        (SIDECARSET_HASH_WITHOUT_IMAGE.to_owned(), "shape".to_owned()),
    ]));
    set
}

/// A running, ready pod on the old version.
fn pod(name: &str) -> PodView<'static> {
    PodView {
        pod: test_pod("ns", name, &[], Some("n")),
        phase: PodPhase::Running,
        ready: true,
        hash_current: false,
        hash_without_image_current: true,
        sidecars: smallvec![SidecarView {
            name: "proxy".into(),
            ready: true,
            image_running: true,
            native: false,
        }],
        ..Default::default()
    }
}

fn updated(name: &str) -> PodView<'static> {
    PodView {
        hash_current: true,
        ..pod(name)
    }
}

fn in_flight(name: &str) -> PodView<'static> {
    let mut p = updated(name);
    p.sidecars[0].image_running = false;
    p
}

fn not_upgradable(name: &str) -> PodView<'static> {
    PodView {
        hash_without_image_current: false,
        ..pod(name)
    }
}

fn report(set: &SidecarSet, pods: &[PodView]) -> StatusReport {
    let batch = next_batch(set, pods);
    compute_status(set, pods, &batch, "proxy-5f7c9", 2, &now())
}

fn now() -> Time {
    Time("2026-11-29T12:00:00Z".parse().expect("time"))
}

#[test]
fn counts_follow_upstream() {
    let mut not_ready = updated("d");
    not_ready.ready = false;
    let mut old_not_ready = pod("e");
    old_not_ready.ready = false;
    let pods = [
        pod("a"),            // matched, ready
        updated("b"),        // matched, updated, ready
        in_flight("c"),      // matched, updated; Ready, but the new image is not running
        not_ready,           // matched, updated
        old_not_ready,       // matched
        not_upgradable("f"), // matched, ready
    ];
    let got = report(&set(json!({})), &pods).status;
    assert_eq!(
        got,
        SidecarSetStatus {
            observed_generation: Some(7),
            matched_pods: 6,
            updated_pods: 3,
            ready_pods: 3,
            updated_ready_pods: 1,
            latest_revision: Some("proxy-5f7c9".into()),
            collision_count: Some(2),
            conditions: got.conditions.clone(),
        }
    );
}

#[test]
fn pods_going_away_are_not_counted() {
    let mut deleting = updated("a");
    deleting.deleting = true;
    let mut done = pod("b");
    done.phase = PodPhase::Succeeded;
    let mut failed = pod("c");
    failed.phase = PodPhase::Failed;
    let got = report(&set(json!({})), &[deleting, done, failed, pod("d")]).status;
    assert_eq!(
        (got.matched_pods, got.updated_pods, got.ready_pods),
        (1, 0, 1)
    );
}

#[test]
fn the_update_selector_does_not_change_the_counts() {
    let s = set(json!({"selector": {"matchLabels": {"canary": "yes"}}}));
    let got = report(&s, &[updated("a"), pod("b")]).status;
    assert_eq!((got.matched_pods, got.updated_pods), (2, 1));
}

#[test]
fn empty_and_missing_values() {
    let s = set(json!({}));
    let got = compute_status(&s, &[], &next_batch(&s, &[]), "", 0, &now()).status;
    assert_eq!(got.matched_pods, 0);
    assert_eq!(got.latest_revision, None);
    assert_eq!(got.collision_count, Some(0));
    let mut s = set(json!({}));
    s.metadata.generation = None;
    assert_eq!(report(&s, &[]).status.observed_generation, None);
}

#[test]
fn a_finished_or_moving_rollout_has_no_stalls() {
    assert!(
        report(&set(json!({})), &[updated("a"), updated("b")])
            .stalls
            .is_empty()
    );
    assert!(
        report(&set(json!({})), &[pod("a"), pod("b")])
            .stalls
            .is_empty()
    );
    // Paused with nothing left to do is not a stall either.
    assert!(
        report(&set(json!({"paused": true})), &[updated("a")])
            .stalls
            .is_empty()
    );
}

#[test]
fn paused_and_not_update_say_how_many_pods_wait() {
    let pods = [pod("a"), pod("b"), updated("c")];
    let stalls = report(&set(json!({"paused": true})), &pods).stalls;
    assert_eq!(stalls, [Stall::Paused { waiting: 2 }]);
    assert_eq!(stalls[0].reason(), "Paused");
    assert!(
        stalls[0].to_string().contains("2 pod(s) wait"),
        "{}",
        stalls[0]
    );

    let stalls = report(&set(json!({"type": "NotUpdate"})), &pods).stalls;
    assert_eq!(stalls, [Stall::NotUpdate { waiting: 2 }]);
    assert_eq!(stalls[0].reason(), "NotUpdateStrategy");
}

#[test]
fn a_malformed_strategy_is_a_stall_naming_the_field() {
    let stalls = report(&set(json!({"maxUnavailable": "lots"})), &[pod("a")]).stalls;
    assert_eq!(stalls.len(), 1);
    assert_eq!(stalls[0].reason(), "InvalidUpdateStrategy");
    let message = stalls[0].to_string();
    assert!(
        message.contains("spec.updateStrategy.maxUnavailable"),
        "{message}"
    );
    assert!(message.contains("\"lots\""), "{message}");
}

#[test]
fn an_invalid_update_selector_is_reported_though_no_pod_counts_as_waiting() {
    let bad = json!({"selector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}});
    let stalls = report(&set(bad), &[pod("a")]).stalls;
    assert_eq!(stalls.len(), 1, "{stalls:?}");
    assert_eq!(stalls[0].reason(), "InvalidUpdateStrategy");
    assert!(stalls[0].to_string().contains("selector"), "{}", stalls[0]);
}

#[test]
fn pods_that_changed_more_than_images_are_named() {
    let mut pods: Vec<PodView> = (0..7).map(|i| not_upgradable(&format!("p{i}"))).collect();
    pods.push(pod("ok"));
    let stalls = report(&set(json!({})), &pods).stalls;
    assert_eq!(stalls.len(), 1, "the other pod moves: {stalls:?}");
    let Stall::NotUpgradable {
        pods: n,
        resize_unserved: 0,
        examples,
    } = &stalls[0]
    else {
        panic!("{stalls:?}");
    };
    assert_eq!(*n, 7);
    assert_eq!(examples, &["ns/p0", "ns/p1", "ns/p2", "ns/p3", "ns/p4"]);
    assert_eq!(stalls[0].reason(), "NotUpgradablePods");
    let message = stalls[0].to_string();
    assert!(message.ends_with("ns/p4 and 2 more"), "{message}");
    assert!(message.contains("recreate them"), "{message}");
}

#[test]
fn not_upgradable_pods_are_reported_even_when_paused() {
    let stalls = report(
        &set(json!({"paused": true})),
        &[not_upgradable("x"), pod("y")],
    )
    .stalls;
    assert_eq!(stalls.len(), 2);
    assert_eq!(stalls[0], Stall::Paused { waiting: 1 });
    assert_eq!(stalls[1].reason(), "NotUpgradablePods");
}

#[test]
fn unready_updated_pods_at_max_unavailable_are_named() {
    let pods = [in_flight("b"), in_flight("a"), pod("c")];
    let stalls = report(&set(json!({"maxUnavailable": 2})), &pods).stalls;
    assert_eq!(
        stalls,
        [Stall::MaxUnavailableReached {
            unavailable: 2,
            max_unavailable: 2,
            examples: vec!["ns/a".into(), "ns/b".into()],
        }]
    );
    let message = stalls[0].to_string();
    assert!(
        message.starts_with(
            "2 updated pod(s) are not available yet (maxUnavailable is 2): ns/a, ns/b;"
        ),
        "{message}"
    );
}

#[test]
fn max_unavailable_zero_is_explained() {
    let stalls = report(&set(json!({"maxUnavailable": "0%"})), &[pod("a")]).stalls;
    assert_eq!(
        stalls,
        [Stall::MaxUnavailableReached {
            unavailable: 0,
            max_unavailable: 0,
            examples: vec![],
        }]
    );
    assert!(
        stalls[0].to_string().contains("maxUnavailable is 0"),
        "{}",
        stalls[0]
    );
}

#[test]
fn a_partition_holding_every_remaining_pod_is_a_stall() {
    let pods = [updated("a"), pod("b"), pod("c")];
    let stalls = report(&set(json!({"partition": 2})), &pods).stalls;
    assert_eq!(stalls, [Stall::PartitionReached { partition: 2 }]);
    assert_eq!(stalls[0].reason(), "PartitionReached");
    assert!(
        stalls[0].to_string().contains("keeps 2 pod(s)"),
        "{}",
        stalls[0]
    );
    // While pods still move within the partition, it is not a stall.
    assert!(
        report(&set(json!({"partition": 1})), &pods)
            .stalls
            .is_empty()
    );
}

#[test]
fn status_counts_are_consistent_for_random_pods() {
    // Deterministic variety: every mix of the flags that matter, on 1 to 4 pods.
    let flags = |bits: u32, k: u32| bits >> k & 1 == 1;
    for bits in 0..1u32 << 5 {
        let mut p = pod(&format!("p{bits}"));
        p.hash_current = flags(bits, 0);
        p.ready = flags(bits, 1);
        p.sidecars[0].image_running = flags(bits, 2);
        p.deleting = flags(bits, 3);
        p.hash_without_image_current = flags(bits, 4);
        let pods = vec![p.clone(), pod("other"), updated("third")];
        let s = report(&set(json!({"maxUnavailable": 1})), &pods).status;
        assert!(
            s.updated_ready_pods <= s.updated_pods.min(s.ready_pods),
            "{bits:b}"
        );
        assert!(s.updated_pods <= s.matched_pods && s.ready_pods <= s.matched_pods);
        assert_eq!(s.matched_pods, 3 - i32::from(p.deleting), "{bits:b}");
        let counted_ready = !p.deleting && p.ready && p.sidecars[0].image_running;
        assert_eq!(s.ready_pods, 2 + i32::from(counted_ready), "{bits:b}");
    }
}

fn condition<'a>(status: &'a SidecarSetStatus, type_: &str) -> &'a Condition {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {status:?}"))
}

#[test]
fn conditions_say_whether_and_why_the_rollout_is_held() {
    let s = set(json!({}));
    let moving = report(&s, &[pod("a"), pod("b")]).status;
    let held = condition(&moving, ROLLOUT_HELD);
    assert_eq!(
        (held.status.as_str(), held.reason.as_str()),
        ("False", "Progressing")
    );
    assert_eq!(held.message, "2 pod(s) wait for the upgrade");
    assert_eq!(held.observed_generation, Some(7));

    let done = report(&s, &[updated("a")]).status;
    let held = condition(&done, ROLLOUT_HELD);
    assert_eq!(
        (held.status.as_str(), held.reason.as_str()),
        ("False", "Updated")
    );
    let upgradable = condition(&done, PODS_UPGRADABLE);
    assert_eq!(
        (upgradable.status.as_str(), upgradable.reason.as_str()),
        ("True", "AllPodsUpgradable")
    );

    let paused = report(&set(json!({"paused": true})), &[pod("a")]).status;
    let held = condition(&paused, ROLLOUT_HELD);
    assert_eq!(
        (held.status.as_str(), held.reason.as_str()),
        ("True", "Paused")
    );
    assert!(held.message.contains("paused"), "{}", held.message);

    let waiting = report(&s, &[in_flight("a"), pod("b")]).status;
    let held = condition(&waiting, ROLLOUT_HELD);
    assert_eq!(
        (held.status.as_str(), held.reason.as_str()),
        ("True", "MaxUnavailableReached")
    );
    assert!(held.message.contains("ns/a"), "{}", held.message);
}

#[test]
fn pods_that_cannot_be_upgraded_turn_pods_upgradable_false_without_holding_the_rest() {
    let status = report(&set(json!({})), &[not_upgradable("x"), pod("a")]).status;
    let upgradable = condition(&status, PODS_UPGRADABLE);
    assert_eq!(
        (upgradable.status.as_str(), upgradable.reason.as_str()),
        ("False", "NotUpgradablePods")
    );
    assert!(
        upgradable.message.contains("ns/x"),
        "{}",
        upgradable.message
    );
    let held = condition(&status, ROLLOUT_HELD);
    assert_eq!(
        (held.status.as_str(), held.reason.as_str()),
        ("False", "Progressing")
    );
}

#[test]
fn an_unchanged_condition_keeps_its_transition_time() {
    let mut s = set(json!({"paused": true}));
    let first = report(&s, &[pod("a")]).status;
    s.status = Some(first.clone());
    let later = Time("2026-11-29T13:00:00Z".parse().expect("time"));
    let batch = next_batch(&s, &[pod("a")]);
    let again = compute_status(&s, &[pod("a")], &batch, "proxy-5f7c9", 2, &later).status;
    assert_eq!(again, first, "nothing changed, so nothing is rewritten");

    s.spec.update_strategy.paused = false;
    let batch = next_batch(&s, &[pod("a")]);
    let moved = compute_status(&s, &[pod("a")], &batch, "proxy-5f7c9", 2, &later).status;
    let held = condition(&moved, ROLLOUT_HELD);
    assert_eq!(held.status, "False");
    assert_eq!(held.last_transition_time, later, "a flip is stamped now");
    assert_eq!(
        condition(&moved, PODS_UPGRADABLE).last_transition_time,
        now(),
        "the other condition did not flip"
    );
}

fn time(s: &str) -> Time {
    Time(s.parse().expect("time"))
}

#[test]
fn the_unsupported_features_condition_comes_from_the_spec() {
    let now = time("2026-12-01T00:00:00Z");
    let mut s = set(json!({}));
    assert_eq!(
        unsupported_condition(&s, &[], &now),
        None,
        "nothing unsupported"
    );

    s.spec.containers[0].upgrade_strategy =
        Some(serde_json::from_value(json!({"upgradeType": "HotUpgrade"})).expect("strategy"));
    let c = unsupported_condition(&s, &[], &now).expect("HotUpgrade");
    assert_eq!(c.type_, UNSUPPORTED);
    assert_eq!(c.status, "True");
    assert_eq!(c.reason, "HotUpgradeWithoutEmptyImage");
    assert_eq!(c.observed_generation, Some(7));
    assert_eq!(c.last_transition_time, now);
    assert!(
        c.message
            .starts_with("container proxy uses upgradeStrategy.upgradeType HotUpgrade"),
        "{}",
        c.message
    );
    assert!(c.message.contains("admitted without it"), "{}", c.message);

    // The transition time stays while the condition holds.
    let later = time("2026-12-01T01:00:00Z");
    let again = unsupported_condition(&s, std::slice::from_ref(&c), &later).expect("still");
    assert_eq!(again.last_transition_time, now);

    // Annotated to refuse: the message says so.
    s.metadata
        .annotations
        .get_or_insert_default()
        .insert(UNSUPPORTED_FEATURES.to_owned(), REFUSE.to_owned());
    let refused = unsupported_condition(&s, &[], &now).expect("refuse");
    assert!(
        refused.message.contains("pods it matches are refused"),
        "{}",
        refused.message
    );
}

#[test]
fn several_unsupported_features_make_one_reason() {
    let now = time("2026-12-01T00:00:00Z");
    let mut s = set(json!({}));
    s.spec.containers[0] = serde_json::from_value(json!({
        "name": "proxy", "image": "proxy:2",
        "upgradeStrategy": {"upgradeType": "HotUpgrade"},
        "resourcesPolicy": {"targetContainersMode": "max", "resourcesExpr": {}},
    }))
    .expect("container");
    let c = unsupported_condition(&s, &[], &now).expect("condition");
    let features: Vec<&str> = kruise_rs_sidecar::unsupported::FEATURES
        .iter()
        .map(|f| f.name)
        .collect();
    assert_eq!(c.reason, features.join(","));
    // A valid condition reason (metav1.Condition's pattern allows commas).
    assert!(
        c.reason
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || ch == ',')
    );
}

/// An updated pod whose native sidecar `agent` has not run its new image since `written`.
fn native_behind(name: &str, written: &str) -> PodView<'static> {
    let mut p = updated(name);
    p.ready = false;
    p.hash_written = Some(written.parse().expect("time")).into();
    p.sidecars.push(SidecarView {
        name: "agent".into(),
        ready: true,
        image_running: false,
        native: true,
    });
    p
}

#[test]
fn a_native_sidecar_the_kubelet_never_restarts_is_named_after_the_grace() {
    let s = set(json!({"maxUnavailable": 1}));
    // Upgraded 4 minutes ago: still within the grace, only maxUnavailable holds.
    let recent = [native_behind("a", "2026-11-29T11:56:00Z"), pod("b")];
    let r = report(&s, &recent);
    assert!(matches!(r.stalls[0], Stall::MaxUnavailableReached { .. }));
    // Upgraded 5 minutes ago and still on the old image: named first, RolloutHeld says why.
    let stuck = [native_behind("a", "2026-11-29T11:55:00Z"), pod("b")];
    let r = report(&s, &stuck);
    assert_eq!(
        r.stalls[0],
        Stall::NativeSidecarNotRestarted {
            pods: 1,
            examples: vec!["ns/a".into()]
        }
    );
    let held = r
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == ROLLOUT_HELD)
        .expect("RolloutHeld");
    assert_eq!(
        (held.status.as_str(), held.reason.as_str()),
        ("True", "NativeSidecarNotRestarted")
    );
    assert!(
        held.message.contains("ns/a") && held.message.contains("kubelet"),
        "{}",
        held.message
    );
    // A container (not native) behind, a pod not running, or a pod not updated: not this.
    let mut container = native_behind("a", "2026-11-29T11:00:00Z");
    container.sidecars[1].native = false;
    let mut pending = native_behind("a", "2026-11-29T11:00:00Z");
    pending.phase = PodPhase::Pending;
    let mut old = native_behind("a", "2026-11-29T11:00:00Z");
    old.hash_current = false;
    for p in [container, pending, old] {
        assert!(
            !report(&s, &[p])
                .stalls
                .iter()
                .any(|s| matches!(s, Stall::NativeSidecarNotRestarted { .. }))
        );
    }
}

// --- resize ---------------------------------------------------------------------------------

/// A pod whose sidecars' resources changed too (besides images), with `resize` as the view
/// reads it.
fn resources_changed(name: &str, resize: InPlaceResize) -> PodView<'static> {
    PodView {
        resize,
        ..not_upgradable(name)
    }
}

/// An updated pod, with its `PodResizePending` condition when `pending` is a reason.
fn resized(name: &str, kubelet: KubeletResize, pending: Option<(&str, &str)>) -> PodView<'static> {
    let mut p = updated(name);
    p.kubelet_resize = kubelet;
    if let Some((reason, message)) = pending {
        crate::controllers::sidecarset::pods::change_pod(&mut p, |pod| {
            pod.status.get_or_insert_with(Default::default).conditions =
                Some(vec![k8s_openapi::api::core::v1::PodCondition {
                    type_: POD_RESIZE_PENDING.into(),
                    status: "True".into(),
                    reason: Some(reason.into()),
                    message: Some(message.into()),
                    ..Default::default()
                }]);
        });
    }
    p
}

#[test]
fn pods_needing_only_a_resize_are_candidates_and_count_as_upgradable() {
    let pods = vec![
        resources_changed("a", InPlaceResize::Needed),
        resources_changed("b", InPlaceResize::Needed),
    ];
    let s = set(json!({"maxUnavailable": 1}));
    let batch = next_batch(&s, &pods);
    assert_eq!(batch.upgrade, [0], "one at a time, as for images");
    assert!(batch.not_upgradable.is_empty());
    let r = report(&s, &pods);
    assert!(r.stalls.is_empty(), "{:?}", r.stalls);
    let upgradable = r
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == PODS_UPGRADABLE)
        .expect("PodsUpgradable");
    assert_eq!(upgradable.status, "True");
}

#[test]
fn without_the_resize_subresource_the_pods_are_not_upgradable_and_the_reason_says_why() {
    let pods = vec![
        resources_changed("a", InPlaceResize::Unserved),
        resources_changed("b", InPlaceResize::Unserved),
    ];
    let r = report(&set(json!({})), &pods);
    assert_eq!(
        r.stalls,
        [Stall::NotUpgradable {
            pods: 2,
            resize_unserved: 2,
            examples: vec!["ns/a".into(), "ns/b".into()],
        }]
    );
    assert_eq!(r.stalls[0].reason(), "ResizeNotServed");
    let message = r.stalls[0].to_string();
    assert!(
        message.contains("does not serve the pods/resize subresource")
            && message.contains("InPlacePodVerticalScaling"),
        "{message}"
    );
    // Mixed with pods that changed in more than resources: the general reason.
    let mixed = vec![
        resources_changed("a", InPlaceResize::Unserved),
        not_upgradable("c"),
    ];
    let r = report(&set(json!({})), &mixed);
    assert_eq!(r.stalls[0].reason(), "NotUpgradablePods");
    assert!(r.stalls[0].to_string().contains("1 of them because"));
}

#[test]
fn a_resize_in_progress_or_unobserved_keeps_the_pod_in_flight() {
    for kubelet in [
        KubeletResize::Unobserved,
        KubeletResize::InProgress,
        KubeletResize::Deferred,
        KubeletResize::Infeasible,
    ] {
        let pods = vec![resized("a", kubelet, None), pod("b")];
        let batch = next_batch(&set(json!({"maxUnavailable": 1})), &pods);
        assert!(batch.upgrade.is_empty(), "{kubelet:?}: {batch:?}");
        assert_eq!(batch.in_flight, [0], "{kubelet:?}");
    }
    let pods = vec![resized("a", KubeletResize::Settled, None), pod("b")];
    let batch = next_batch(&set(json!({"maxUnavailable": 1})), &pods);
    assert_eq!(batch.upgrade, [1], "a settled resize frees the slot");
}

#[test]
fn deferred_and_infeasible_resizes_are_named_with_the_kubelets_words() {
    let pods = vec![
        resized(
            "d",
            KubeletResize::Deferred,
            Some(("Deferred", "Node didn't have enough resource: cpu")),
        ),
        resized(
            "i",
            KubeletResize::Infeasible,
            Some(("Infeasible", "Node didn't have enough capacity: memory")),
        ),
        resized("p", KubeletResize::InProgress, None),
    ];
    let r = report(&set(json!({})), &pods);
    let stall = r
        .stalls
        .iter()
        .find(|s| matches!(s, Stall::ResizeNotApplied { .. }))
        .expect("a resize stall");
    assert_eq!(
        stall,
        &Stall::ResizeNotApplied {
            infeasible: 1,
            deferred: 1,
            examples: vec![
                "ns/i (Infeasible: Node didn't have enough capacity: memory)".into(),
                "ns/d (Deferred: Node didn't have enough resource: cpu)".into(),
            ],
        }
    );
    assert_eq!(stall.reason(), "ResizeInfeasible");
    let upgradable = r
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == PODS_UPGRADABLE)
        .expect("PodsUpgradable");
    assert_eq!(
        (upgradable.status.as_str(), upgradable.reason.as_str()),
        ("False", "ResizeInfeasible")
    );
    assert!(upgradable.message.contains("ns/i (Infeasible"));
    let held = r
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == ROLLOUT_HELD)
        .expect("RolloutHeld");
    assert_ne!(held.reason, "ResizeInfeasible", "not a hold of the rollout");

    let deferred_only = vec![resized("d", KubeletResize::Deferred, None)];
    let r = report(&set(json!({})), &deferred_only);
    assert_eq!(r.stalls.last().map(Stall::reason), Some("ResizeDeferred"));
    assert!(
        r.stalls
            .last()
            .unwrap()
            .to_string()
            .contains("ns/d (Deferred)")
    );
}
