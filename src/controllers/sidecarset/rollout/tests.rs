use super::*;
use crate::controllers::sidecarset::pods::{change_pod, test_pod};
use fastrand::Rng;
use kruise_rs_api::sidecarset::SidecarSetSpec;
use kruise_rs_api::well_known::{SIDECARSET_HASH, SIDECARSET_HASH_WITHOUT_IMAGE};
use serde_json::json;
use smallvec::smallvec;

const CURRENT: &str = "bbb";
const WITHOUT_IMAGE: &str = "without-aaa";

fn time(second: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + second).expect("valid second")
}

/// A SidecarSet at hash `bbb` (its hash without images `without-aaa`), with `strategy`.
fn set(strategy: serde_json::Value) -> SidecarSet {
    let spec: SidecarSetSpec = serde_json::from_value(json!({
        "selector": {"matchLabels": {"app": "sidecar"}},
        "containers": [{"name": "test-sidecar", "image": "test-image:v2"}],
        "updateStrategy": strategy,
    }))
    .expect("spec");
    let mut set = SidecarSet::new("test-sidecarset", spec);
    set.metadata.annotations = Some(BTreeMap::from([
        (SIDECARSET_HASH.to_owned(), CURRENT.to_owned()),
        (
            SIDECARSET_HASH_WITHOUT_IMAGE.to_owned(),
            WITHOUT_IMAGE.to_owned(),
        ),
    ]));
    set
}

/// `pod` with one more label (its stored pod copied).
fn add_label(pod: &mut PodView<'static>, key: &str, value: &str) {
    change_pod(pod, |p| {
        p.labels_mut().insert(key, value);
    });
}

/// `pod` on node `node` (none: unscheduled).
fn set_node(pod: &mut PodView<'static>, node: Option<&str>) {
    change_pod(pod, |p| {
        p.spec.get_or_insert_default().node_name = node.map(str::to_owned);
    });
}

/// A running, ready pod on the old version, created `i` seconds after the epoch of the
/// tests (so higher numbers are newer).
fn pod(i: usize) -> PodView<'static> {
    PodView {
        pod: test_pod(
            "default",
            &format!("pod-{i}"),
            &[("app", "sidecar")],
            Some("node-1"),
        ),
        phase: PodPhase::Running,
        ready: true,
        created: Some(time(i as i64)).into(),
        hash_current: false,
        hash_without_image_current: true,
        sidecars: smallvec![SidecarView {
            name: "test-sidecar".into(),
            ready: true,
            image_running: true,
            native: false,
        }],
        ..Default::default()
    }
}

/// Upstream's `factoryPods(count, upgraded, upgradedAndReady)`: the first `upgraded` pods
/// carry the current hash, of which the first `running` already run the new image (the
/// others are in flight: patched, kubelet not done yet).
fn pods(count: usize, upgraded: usize, running: usize) -> Vec<PodView<'static>> {
    let mut out: Vec<PodView> = (0..count).map(pod).collect();
    for (i, p) in out.iter_mut().enumerate().take(upgraded) {
        p.hash_current = true;
        p.sidecars[0].image_running = i < running;
    }
    out
}

/// True `percent` times in a hundred.
fn chance(rng: &mut Rng, percent: usize) -> bool {
    rng.usize(..100) < percent
}

fn shuffled<T>(mut items: Vec<T>, seed: u64) -> Vec<T> {
    Rng::with_seed(seed).shuffle(&mut items);
    items
}

fn names(pods: &[PodView], positions: &[usize]) -> Vec<String> {
    positions
        .iter()
        .map(|&i| pods[i].name().to_string())
        .collect()
}

// --- upstream's TestGetNextUpgradePods, scenario by scenario ---------------------------------

#[test]
fn upstream_next_upgrade_pods_scenarios() {
    let selector_pods = || {
        let mut p = pods(1000, 0, 0);
        for pod in p.iter_mut().take(30) {
            add_label(pod, "app", "test");
        }
        p
    };
    // Their hash without images is not the SidecarSet's: more than an image changed.
    let reshaped = || {
        let mut p = pods(100, 0, 0);
        for pod in &mut p {
            pod.hash_without_image_current = false;
        }
        p
    };
    #[allow(clippy::type_complexity)]
    let cases: Vec<(&str, Vec<PodView>, SidecarSet, usize, usize)> = vec![
        (
            "maxUnavailable 10, 100 pods, 30 updated, 26 running",
            pods(100, 30, 26),
            set(json!({"maxUnavailable": 10})),
            6,
            0,
        ),
        (
            "maxUnavailable 10%, 1000 pods, 300 updated, 260 running",
            pods(1000, 300, 260),
            set(json!({"maxUnavailable": "10%"})),
            60,
            0,
        ),
        (
            "maxUnavailable 5%, 1000 pods, 300 updated, 250 running",
            pods(1000, 300, 250),
            set(json!({"maxUnavailable": "5%"})),
            0,
            0,
        ),
        (
            "maxUnavailable 100, 100 pods, 30 updated, 27 running",
            pods(100, 30, 27),
            set(json!({"maxUnavailable": 100})),
            70,
            0,
        ),
        (
            "partition 180, maxUnavailable 100, 1000/800/760",
            pods(1000, 800, 760),
            set(json!({"maxUnavailable": 100, "partition": 180})),
            20,
            0,
        ),
        (
            "partition 100, maxUnavailable 100, 1000/800/760",
            pods(1000, 800, 760),
            set(json!({"maxUnavailable": 100, "partition": 100})),
            60,
            0,
        ),
        (
            "partition 18%, maxUnavailable 100, 1000/800/760",
            pods(1000, 800, 760),
            set(json!({"maxUnavailable": 100, "partition": "18%"})),
            20,
            0,
        ),
        (
            "partition 10%, maxUnavailable 100, 1000/800/760",
            pods(1000, 800, 760),
            set(json!({"maxUnavailable": 100, "partition": "10%"})),
            60,
            0,
        ),
        (
            "selector app=test (30 pods), maxUnavailable 100",
            selector_pods(),
            set(json!({"maxUnavailable": 100, "selector": {"matchLabels": {"app": "test"}}})),
            30,
            0,
        ),
        (
            "more than the image changed, maxUnavailable 100",
            reshaped(),
            set(json!({"maxUnavailable": 100})),
            0,
            100,
        ),
        (
            "maxUnavailable 5% of 5 pods (#1832)",
            pods(5, 0, 0),
            set(json!({"maxUnavailable": "5%"})),
            1,
            0,
        ),
        (
            "maxUnavailable 5, partition 99% of 5 pods",
            pods(5, 0, 0),
            set(json!({"maxUnavailable": 5, "partition": "99%"})),
            1,
            0,
        ),
        (
            "maxUnavailable 5, partition 1% of 5 pods",
            pods(5, 0, 0),
            set(json!({"maxUnavailable": 5, "partition": "1%"})),
            4,
            0,
        ),
    ];
    for (name, pods, set, upgrade, not_upgradable) in cases {
        for seed in [1, 7, 99] {
            let pods = shuffled(pods.clone(), seed);
            let batch = next_batch(&set, &pods);
            assert_eq!(batch.upgrade.len(), upgrade, "{name}");
            assert_eq!(batch.not_upgradable.len(), not_upgradable, "{name}");
        }
    }
}

// --- upstream's TestSortNextUpgradePods ------------------------------------------------------

#[test]
fn newest_pods_go_first() {
    let p = shuffled(pods(20, 10, 5), 3);
    let batch = next_batch(&set(json!({"maxUnavailable": 10})), &p);
    assert_eq!(
        names(&p, &batch.upgrade),
        ["pod-19", "pod-18", "pod-17", "pod-16", "pod-15"]
    );
}

#[test]
fn pods_that_are_not_ready_go_first_and_cost_nothing() {
    let mut p = pods(20, 10, 5);
    p[10].ready = false;
    p[13].ready = false;
    let p = shuffled(p, 5);
    let batch = next_batch(&set(json!({"maxUnavailable": 10})), &p);
    assert_eq!(
        names(&p, &batch.upgrade),
        [
            "pod-13", "pod-10", "pod-19", "pod-18", "pod-17", "pod-16", "pod-15"
        ]
    );
}

#[test]
fn weight_priority_goes_first() {
    let mut p = pods(20, 10, 2);
    add_label(&mut p[15], "test-key", "bar");
    add_label(&mut p[16], "test-key", "foo");
    let p = shuffled(p, 11);
    let s = set(
        json!({"maxUnavailable": 10, "priorityStrategy": {"weightPriority": [
            {"weight": 50, "matchSelector": {"matchLabels": {"test-key": "foo"}}},
            {"weight": 30, "matchSelector": {"matchLabels": {"test-key": "bar"}}},
        ]}}),
    );
    assert_eq!(names(&p, &next_batch(&s, &p).upgrade), ["pod-16", "pod-15"]);
}

#[test]
fn order_priority_goes_first() {
    let mut p = pods(20, 10, 2);
    for pod in &mut p {
        add_label(pod, "key1", "5");
    }
    add_label(&mut p[17], "key1", "10");
    add_label(&mut p[18], "key1", "20");
    let p = shuffled(p, 13);
    let s = set(
        json!({"maxUnavailable": 10, "priorityStrategy": {"orderPriority": [{"orderedKey": "key1"}]}}),
    );
    assert_eq!(names(&p, &next_batch(&s, &p).upgrade), ["pod-18", "pod-17"]);
}

// --- rounding ----------------------------------------------------------------------------------

fn int(n: i32) -> IntOrString {
    IntOrString::Int(n)
}
fn pct(s: &str) -> IntOrString {
    IntOrString::String(s.into())
}

#[test]
fn max_unavailable_rounds_percentages_up() {
    let cases = [
        (None, 10, 1),
        (Some(int(0)), 10, 0),
        (Some(int(3)), 10, 3),
        (Some(int(50)), 10, 50),
        (Some(pct("0%")), 10, 0),
        (Some(pct("5%")), 5, 1), // #1832: 0.25 must not become 0
        (Some(pct("1%")), 1, 1),
        (Some(pct("5%")), 0, 0),
        (Some(pct("10%")), 1000, 100),
        (Some(pct("33%")), 3, 1),
        (Some(pct("34%")), 3, 2),
        (Some(pct("100%")), 7, 7),
        (Some(pct("200%")), 7, 14),
        (Some(pct("12.5%")), 10, 2),
        // Exact: 64.4% of 250 is 161; Go's float64 arithmetic gives 162.
        (Some(pct("64.4%")), 250, 161),
    ];
    for (value, matched, want) in cases {
        assert_eq!(
            max_unavailable_count(value.as_ref(), matched),
            Ok(want),
            "{value:?} of {matched}"
        );
    }
}

#[test]
fn partition_rounds_up_but_a_percent_below_100_always_leaves_one_pod_to_upgrade() {
    let cases = [
        (None, 10, 0),
        (Some(int(0)), 10, 0),
        (Some(int(3)), 5, 3),
        (Some(int(10)), 5, 5),
        (Some(pct("0%")), 5, 0),
        (Some(pct("1%")), 5, 1),
        (Some(pct("99%")), 5, 4),
        (Some(pct("99%")), 2, 1),
        (Some(pct("99.99%")), 1000, 999),
        (Some(pct("99.9%")), 1000, 999),
        (Some(pct("100%")), 5, 5),
        (Some(pct("100.0%")), 5, 5),
        (Some(pct("150%")), 5, 5),
        (Some(pct("18%")), 1000, 180),
        (Some(pct("10%")), 1000, 100),
        (Some(pct("15%")), 10, 2),
        // One pod: "keeps at least one old pod" wins over "upgrades at least one".
        (Some(pct("50%")), 1, 1),
        (Some(pct("50%")), 0, 0),
        (Some(pct("64.4%")), 250, 161),
    ];
    for (value, matched, want) in cases {
        assert_eq!(
            partition_count(value.as_ref(), matched),
            Ok(want),
            "{value:?} of {matched}"
        );
    }
}

#[test]
fn malformed_values_are_errors_naming_the_field() {
    for bad in [
        int(-1),
        pct("abc"),
        pct("5"),
        pct("%"),
        pct("1.%"),
        pct(".5%"),
        pct("-5%"),
        pct("1e2%"),
        pct("5 %"),
        pct("1234567890%"),
    ] {
        let err = partition_count(Some(&bad), 10).expect_err("partition");
        assert!(
            err.to_string().contains("updateStrategy.partition"),
            "{err}"
        );
        let err = max_unavailable_count(Some(&bad), 10).expect_err("maxUnavailable");
        assert!(
            err.to_string().contains("updateStrategy.maxUnavailable"),
            "{err}"
        );
    }
}

// --- what is held, and why ---------------------------------------------------------------------

#[test]
fn not_update_and_paused_upgrade_nothing_but_still_report_not_upgradable_pods() {
    let mut p = pods(4, 0, 0);
    p[3].hash_without_image_current = false;
    let batch = next_batch(&set(json!({"type": "NotUpdate"})), &p);
    assert!(batch.upgrade.is_empty() && batch.queue.is_empty());
    assert_eq!(batch.hold, Some(Hold::NotUpdate));
    assert_eq!(names(&p, &batch.not_upgradable), ["pod-3"]);
    assert_eq!(batch.waiting, 3);

    let batch = next_batch(&set(json!({"paused": true, "maxUnavailable": 4})), &p);
    assert!(batch.upgrade.is_empty());
    assert_eq!(
        batch.queue.len(),
        3,
        "a paused rollout still knows its queue"
    );
    assert_eq!(batch.hold, Some(Hold::Paused));
    assert_eq!(names(&p, &batch.not_upgradable), ["pod-3"]);
}

#[test]
fn pods_awaiting_their_images_stay_queued_and_the_next_ones_go() {
    let mut p = pods(4, 0, 0);
    p[0].awaiting_images = true;
    p[2].awaiting_images = true;
    let batch = next_batch(&set(json!({"maxUnavailable": 4})), &p);
    let queued_and_free: Vec<usize> = batch
        .queue
        .iter()
        .copied()
        .filter(|&i| !p[i].awaiting_images)
        .collect();
    assert_eq!(batch.upgrade, queued_and_free, "the rest, in queue order");
    assert_eq!(names(&p, &batch.upgrade), ["pod-3", "pod-1"]);
    assert_eq!(batch.queue.len(), 4, "they stay in the queue");
    assert_eq!(batch.hold, Some(Hold::PreDownload { pods: 2 }));

    // Waiting pods do not count against maxUnavailable.
    let batch = next_batch(&set(json!({"maxUnavailable": 1})), &p);
    assert_eq!(names(&p, &batch.upgrade), ["pod-3"]);
    assert_eq!(
        batch.hold,
        Some(Hold::MaxUnavailable {
            unavailable: 1,
            max_unavailable: 1
        })
    );

    for pod in &mut p {
        pod.awaiting_images = true;
    }
    let batch = next_batch(&set(json!({"maxUnavailable": 4})), &p);
    assert!(batch.upgrade.is_empty());
    assert_eq!(batch.hold, Some(Hold::PreDownload { pods: 4 }));
}

#[test]
fn a_malformed_strategy_holds_instead_of_upgrading_everything() {
    let p = pods(10, 0, 0);
    // Upstream read a bad partition as 0 and upgraded every pod (within maxUnavailable).
    let batch = next_batch(&set(json!({"partition": "half", "maxUnavailable": 10})), &p);
    assert!(batch.upgrade.is_empty());
    assert!(matches!(
        batch.hold,
        Some(Hold::Invalid(StrategyError::IntOrPercent {
            field: "partition",
            ..
        }))
    ));
    let batch = next_batch(&set(json!({"maxUnavailable": -2})), &p);
    assert!(matches!(
        batch.hold,
        Some(Hold::Invalid(StrategyError::IntOrPercent {
            field: "maxUnavailable",
            ..
        }))
    ));
    let bad_selector =
        json!({"selector": {"matchExpressions": [{"key": "app", "operator": "Near"}]}});
    let batch = next_batch(&set(bad_selector), &p);
    assert!(batch.upgrade.is_empty());
    assert!(matches!(
        batch.hold,
        Some(Hold::Invalid(StrategyError::Selector(_)))
    ));
}

#[test]
fn the_hold_says_what_stopped_the_batch() {
    let p = pods(10, 2, 0);
    let batch = next_batch(&set(json!({"maxUnavailable": 3})), &p);
    assert_eq!(batch.upgrade.len(), 1);
    assert_eq!(
        batch.hold,
        Some(Hold::MaxUnavailable {
            unavailable: 3,
            max_unavailable: 3
        })
    );
    assert_eq!(names(&p, &batch.in_flight), ["pod-0", "pod-1"]);

    let p = pods(10, 2, 2);
    let batch = next_batch(&set(json!({"maxUnavailable": 10, "partition": 5})), &p);
    assert_eq!(batch.upgrade.len(), 3);
    assert_eq!(batch.hold, Some(Hold::Partition { partition: 5 }));

    let batch = next_batch(&set(json!({"maxUnavailable": 10})), &p);
    assert_eq!(batch.upgrade.len(), 8);
    assert_eq!(batch.hold, None);

    let done = pods(3, 3, 3);
    let batch = next_batch(&set(json!({})), &done);
    assert!(batch.upgrade.is_empty() && batch.hold.is_none());
    assert_eq!(batch.waiting, 0);
}

#[test]
fn the_queue_is_every_pod_the_rollout_will_reach_in_order() {
    let p = pods(8, 0, 0);
    let batch = next_batch(&set(json!({"maxUnavailable": 2, "partition": 3})), &p);
    assert_eq!(
        names(&p, &batch.queue),
        ["pod-7", "pod-6", "pod-5", "pod-4", "pod-3"]
    );
    assert_eq!(names(&p, &batch.upgrade), ["pod-7", "pod-6"]);
}

#[test]
fn max_unavailable_zero_moves_only_pods_that_are_not_ready() {
    let mut p = pods(5, 0, 0);
    p[1].ready = false;
    let batch = next_batch(&set(json!({"maxUnavailable": 0})), &p);
    assert_eq!(names(&p, &batch.upgrade), ["pod-1"]);
    let batch = next_batch(&set(json!({"maxUnavailable": "0%"})), &p);
    assert_eq!(names(&p, &batch.upgrade), ["pod-1"]);
}

#[test]
fn a_ready_pod_that_does_not_fit_stops_the_walk() {
    // Priority puts the ready pod-4 before the unready pod-1: the walk stops at pod-4 and
    // pod-1 waits, as upstream (priority order is kept even for free pods).
    let mut p = pods(5, 1, 0);
    p[1].ready = false;
    add_label(&mut p[4], "first", "yes");
    let s = set(json!({"priorityStrategy": {"weightPriority": [
        {"weight": 10, "matchSelector": {"matchLabels": {"first": "yes"}}}]}}));
    let batch = next_batch(&s, &p);
    assert!(batch.upgrade.is_empty());
    assert_eq!(names(&p, &batch.queue)[..2], ["pod-4", "pod-1"]);
}

// --- which pods are candidates -----------------------------------------------------------------

#[test]
fn only_pods_matching_the_update_selector_are_upgraded() {
    let mut p = pods(6, 0, 0);
    for i in [1, 4] {
        add_label(&mut p[i], "canary", "true");
    }
    let s = set(json!({"maxUnavailable": 10, "selector": {"matchLabels": {"canary": "true"}}}));
    let batch = next_batch(&s, &p);
    assert_eq!(names(&p, &batch.upgrade), ["pod-4", "pod-1"]);
    assert_eq!(batch.waiting, 2);
}

#[test]
fn pods_going_away_are_ignored_and_never_hold_the_rollout() {
    // #1168: an in-flight pod that is being deleted must not block the next batch.
    let mut p = pods(4, 1, 0);
    p[0].deleting = true;
    p[1].phase = PodPhase::Succeeded;
    p[2].phase = PodPhase::Failed;
    let batch = next_batch(&set(json!({})), &p);
    assert_eq!(batch.matched, 1);
    assert!(batch.in_flight.is_empty());
    assert_eq!(names(&p, &batch.upgrade), ["pod-3"]);
}

#[test]
fn a_pod_without_an_entry_for_this_sidecarset_is_not_upgradable() {
    let mut p = pods(2, 0, 0);
    // What the view of a pod without the entry reads: neither hash current.
    p[0].hash_current = false;
    p[0].hash_without_image_current = false;
    let batch = next_batch(&set(json!({"maxUnavailable": 2})), &p);
    assert_eq!(names(&p, &batch.not_upgradable), ["pod-0"]);
    assert_eq!(names(&p, &batch.upgrade), ["pod-1"]);
}

#[test]
fn a_ready_sidecar_still_switching_images_settles_first() {
    let mut p = pods(3, 0, 0);
    // pod-2: an earlier upgrade kubelet has not applied; the container still runs, ready.
    p[2].sidecars[0].image_running = false;
    // pod-1: stuck on a bad image (not ready): the new version may replace it.
    p[1].sidecars[0].image_running = false;
    p[1].sidecars[0].ready = false;
    let batch = next_batch(&set(json!({"maxUnavailable": 3})), &p);
    assert_eq!(names(&p, &batch.upgrade), ["pod-1", "pod-0"]);
    assert_eq!(batch.waiting, 3);
    assert_eq!(classify(&p[2], true), PodState::Settling);
}

#[test]
fn in_flight_means_updated_and_not_ready_or_not_running_the_new_image() {
    let mut p = pod(0);
    p.hash_current = true;
    assert_eq!(classify(&p, false), PodState::Updated { in_flight: false });
    p.ready = false;
    assert_eq!(classify(&p, true), PodState::Updated { in_flight: true });
    p.ready = true;
    p.sidecars.push(SidecarView {
        name: "second".into(),
        ready: true,
        image_running: false,
        native: false,
    });
    assert_eq!(classify(&p, true), PodState::Updated { in_flight: true });
    assert_eq!(classify(&pod(1), false), PodState::NotSelected);
}

#[test]
fn current_hashes_come_from_the_annotations_or_else_the_defaulted_spec() {
    let annotated = set(json!({}));
    assert_eq!(
        CurrentHashes::of(&annotated),
        CurrentHashes {
            hash: CURRENT.into(),
            without_image: WITHOUT_IMAGE.into(),
            ..CurrentHashes::default()
        }
    );
    let mut bare = annotated.clone();
    bare.metadata.annotations = None;
    // As the webhook would write them at the next update: from the defaulted spec.
    let mut defaulted = bare.clone();
    kruise_rs_api::defaults::default_sidecarset(&mut defaulted);
    use kruise_rs_sidecar::hash::{sidecarset_hash, sidecarset_hash_without_image};
    assert_eq!(
        CurrentHashes::of(&bare),
        CurrentHashes {
            hash: sidecarset_hash(&defaulted.spec),
            without_image: sidecarset_hash_without_image(&defaulted.spec),
            ..CurrentHashes::default()
        }
    );
    assert_ne!(
        sidecarset_hash_without_image(&bare.spec),
        sidecarset_hash_without_image(&defaulted.spec),
        "defaulting changes what is hashed (imagePullPolicy…), so the stored spec would not do"
    );
}

// --- ordering ------------------------------------------------------------------------------------

#[test]
fn active_pods_order_step_by_step() {
    let base = pod(5);
    let with = |f: &dyn Fn(&mut PodView<'static>)| {
        let mut p = base.clone();
        f(&mut p);
        p
    };
    let before = |a: &PodView, b: &PodView| active_pods_order(a, b) == Ordering::Less;
    assert!(before(&with(&|p| set_node(p, None)), &base));
    assert!(before(&with(&|p| set_node(p, Some(""))), &base));
    let pending = with(&|p| p.phase = PodPhase::Pending);
    let unknown = with(&|p| p.phase = PodPhase::Unknown);
    assert!(before(&pending, &unknown) && before(&unknown, &base));
    assert!(before(&with(&|p| p.ready = false), &base));
    let recent = with(&|p| p.ready_since = Some(time(100)).into());
    let older = with(&|p| p.ready_since = Some(time(50)).into());
    assert!(before(&base, &recent), "never-ready time first");
    assert!(before(&recent, &older), "ready for less time first");
    assert!(
        !before(
            &with(&|p| {
                p.ready = false;
                p.ready_since = Some(time(1)).into()
            }),
            &with(&|p| p.ready = false)
        ) && !before(
            &with(&|p| p.ready = false),
            &with(&|p| {
                p.ready = false;
                p.ready_since = Some(time(1)).into()
            })
        ),
        "ready time only counts between ready pods"
    );
    assert!(before(&with(&|p| p.restarts = 3), &base));
    assert!(before(&with(&|p| p.created = OptionalTime::NONE), &base));
    assert!(before(&with(&|p| p.created = Some(time(9)).into()), &base));
    let twin = with(&|p| change_pod(p, |s| s.metadata.name = Some("pod-50".into())));
    assert!(before(&base, &twin), "equal pods by name");
    let other_ns = with(&|p| change_pod(p, |s| s.metadata.namespace = Some("a".into())));
    assert!(before(&other_ns, &base), "then by namespace first");
}

#[test]
fn priority_comparisons_match_upstream() {
    // Upstream's TestCompare: `true` means the first pod goes first (or they are equal).
    let weights = json!({"weightPriority": [
        {"weight": 20, "matchSelector": {"matchLabels": {"key": "foo"}}},
        {"weight": 10, "matchSelector": {"matchLabels": {"key": "bar"}}}]});
    let weights3 = |w3: i32| {
        json!({"weightPriority": [
        {"weight": 20, "matchSelector": {"matchLabels": {"key1": "foo"}}},
        {"weight": 10, "matchSelector": {"matchLabels": {"key2": "bar"}}},
        {"weight": w3, "matchSelector": {"matchLabels": {"key3": "baz"}}}]})
    };
    let orders = json!({"orderPriority": [{"orderedKey": "key1"}, {"orderedKey": "key2"}]});
    let cases = [
        (&weights, vec![], vec![], true),
        (&weights, vec![("key", "foo")], vec![("key", "foo")], true),
        (&weights, vec![("key", "bar")], vec![("key", "foo")], false),
        (&weights, vec![], vec![("key", "bar")], false),
        (&weights, vec![], vec![("key", "foo")], false),
        (
            &weights3(15),
            vec![("key1", "foo")],
            vec![("key2", "bar"), ("key3", "baz")],
            false,
        ),
        (
            &weights3(5),
            vec![("key2", "bar"), ("key3", "baz")],
            vec![("key1", "foo")],
            false,
        ),
        (&orders, vec![], vec![], true),
        (&orders, vec![("key1", "o-10")], vec![("key1", "o-5")], true),
        (
            &orders,
            vec![("key1", "o-10")],
            vec![("key1", "o-10")],
            true,
        ),
        (
            &orders,
            vec![("key1", "o-10")],
            vec![("key1", "o-20")],
            false,
        ),
        (
            &orders,
            vec![("key2", "o-20")],
            vec![("key1", "o-10")],
            false,
        ),
        (
            &orders,
            vec![("key2", "o-20")],
            vec![("key2", "o-10")],
            true,
        ),
    ];
    for (n, (strategy, i, j, first)) in cases.into_iter().enumerate() {
        let priority: UpdatePriorityStrategy =
            serde_json::from_value(strategy.clone()).expect("priority");
        let view = |labels: Vec<(&str, &str)>| PodView {
            pod: test_pod("default", "p", &labels, None),
            ..Default::default()
        };
        let p = [view(i), view(j)];
        let mut order = vec![0, 1];
        sort_by_priority(&priority, &p, &mut order);
        assert_eq!(order == [0, 1], first, "case {n}");
    }
}

#[test]
fn pods_without_any_ordered_key_come_last_as_documented() {
    let priority: UpdatePriorityStrategy =
        serde_json::from_value(json!({"orderPriority": [{"orderedKey": "k"}]})).expect("p");
    let mut p = vec![pod(0), pod(1), pod(2)];
    add_label(&mut p[1], "k", "1");
    add_label(&mut p[2], "k", "x");
    let mut order = vec![0, 1, 2];
    sort_by_priority(&priority, &p, &mut order);
    assert_eq!(order, [1, 2, 0]);
}

#[test]
fn a_weight_term_that_cannot_be_evaluated_counts_nothing() {
    let priority: UpdatePriorityStrategy = serde_json::from_value(json!({"weightPriority": [
        {"weight": 90, "matchSelector": {"matchExpressions": [{"key": "k", "operator": "Near"}]}},
        {"weight": 10, "matchSelector": {"matchLabels": {"k": "v"}}}]}))
    .expect("p");
    let mut p = vec![pod(0), pod(1)];
    add_label(&mut p[1], "k", "v");
    let mut order = vec![0, 1];
    sort_by_priority(&priority, &p, &mut order);
    assert_eq!(order, [1, 0]);
}

#[test]
fn trailing_numbers() {
    for (value, want) in [
        ("5", 5),
        ("sts-10", 10),
        ("o-007", 7),
        ("abc", 0),
        ("", 0),
        ("1a", 0),
        ("x99999999999999999999", 0),
    ] {
        assert_eq!(trailing_number(value), want, "{value}");
    }
}

// --- scatter (upstream's updatesort tests) -----------------------------------------------------

/// `"labelA=AAA,labelB=BBB"` → labels; bare words without `=` are ignored, as upstream's
/// test helper does. `A`, `B`, `C` abbreviate `labelA=AAA` etc.
fn labels(spec: &str) -> BTreeMap<String, String> {
    spec.split(',')
        .filter_map(|kv| match kv {
            "A" => Some(("labelA", "AAA")),
            "B" => Some(("labelB", "BBB")),
            "C" => Some(("labelC", "CCC")),
            _ => kv.split_once('='),
        })
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn terms(spec: &str) -> Vec<UpdateScatterTerm> {
    labels(spec)
        .into_iter()
        .map(|(key, value)| UpdateScatterTerm { key, value })
        .collect()
}

#[test]
fn scatter_by_one_term_matches_upstream() {
    let term = UpdateScatterTerm {
        key: "labelA".into(),
        value: "AAA".into(),
    };
    let cases: [(&[&str], &[usize]); 11] = [
        (&[""], &[0]),
        (&["A"], &[0]),
        (&["A", "bbb"], &[0, 1]),
        (&["", "", "", "", "A", "A"], &[4, 0, 1, 2, 3, 5]),
        (&["", "", "", "A", "A", "A"], &[3, 0, 1, 4, 2, 5]),
        (&["", "", "", "A", "", "", "A"], &[3, 0, 1, 2, 4, 5, 6]),
        (
            &["", "", "", "", "", "", "A", "A", "A"],
            &[6, 0, 1, 2, 7, 3, 4, 5, 8],
        ),
        (&["", "", "A", "A", "A", "A"], &[2, 3, 0, 4, 1, 5]),
        (
            &["", "", "A", "", "A", "A", "A", "A", "A"],
            &[2, 4, 0, 5, 6, 1, 7, 3, 8],
        ),
        (
            &["", "A", "", "A", "", "", "A", "A", "A"],
            &[1, 0, 3, 2, 6, 4, 7, 5, 8],
        ),
        (
            &["", "", "", "", "ee", "a", "", "A", "A", "A,labelB=BBB"],
            &[7, 0, 1, 2, 3, 8, 4, 5, 6, 9],
        ),
    ];
    for (specs, want) in cases {
        let owned: Vec<Labels> = specs.iter().map(|s| Labels::from(&labels(s))).collect();
        let refs: Vec<_> = owned.iter().collect();
        let all: Vec<usize> = (0..specs.len()).collect();
        let total = refs.iter().filter(|l| has_label(l, &term)).count();
        assert_eq!(
            scatter_by_term(&term, &refs, (total, all.len()), all.clone()),
            want,
            "{specs:?}"
        );
    }
}

#[test]
fn scatter_sort_matches_upstream() {
    // (pod labels, "nil" for an absent pod; terms; expected order of the first pods).
    let cases: Vec<(Vec<&str>, &str, Vec<usize>)> = vec![
        (vec!["A,B"], "A", vec![0]),
        (vec!["", "", "", "", "", ""], "", vec![0, 1, 2, 3, 4, 5]),
        (vec!["", "", "", "", "A", "A"], "A", vec![4, 0, 1, 2, 3, 5]),
        (
            vec!["", "", "", "", "sdfb=eee", "dsf=same", "B", "A", "A", "A,B"],
            "B",
            vec![6, 0, 1, 2, 3, 4, 5, 7, 8, 9],
        ),
        (
            vec!["B", "B", "", "", "A", "A"],
            "A,B",
            vec![0, 4, 2, 3, 5, 1],
        ),
        (
            vec!["", "", "", "B", "A,B", "A"],
            "A,B",
            vec![4, 0, 1, 2, 5, 3],
        ),
        (
            vec!["", "", "", "", "sdfb=eee", "dsf=same", "B", "A", "A", "B"],
            "B,A",
            vec![7, 6, 0, 1, 2, 3, 4, 5, 9, 8],
        ),
        (
            vec!["", "", "", "", "sdfb=eee", "dsf=same", "B", "A", "A", "B"],
            "A,B",
            vec![6, 7, 0, 1, 2, 3, 4, 5, 8, 9],
        ),
        (
            vec!["", "", "", "", "sdfb=eee", "dsf=same", "A,B", "", "", "A,B"],
            "A,B",
            vec![6, 0, 1, 2, 3, 4, 5, 7, 8, 9],
        ),
        (
            vec!["", "", "", "sdfb=eee", "dsf=same", "A,B", "", "", "A,B"],
            "A,B",
            vec![5, 0, 1, 2, 3, 4, 6, 7, 8],
        ),
        (
            vec!["", "", "", "A", "sdfb=eee", "dsf=same", "A,B", "", "", ""],
            "A,B",
            vec![3, 0, 1, 2, 4, 5, 7, 6],
        ),
        (
            vec![
                "", "", "", "A", "", "", "sdfb=eee", "dsf=same", "A,B", "", "", "A,B",
            ],
            "A,B",
            vec![0, 1, 2, 4, 3, 5, 6, 7, 9, 10, 8],
        ),
        (
            vec![
                "",
                "",
                "",
                "A",
                "sdfb=eee,A",
                "dsf=same",
                "A,B",
                "",
                "",
                "A,B",
            ],
            "A,B",
            vec![6, 3, 0, 1, 4, 2, 5, 7, 8, 9],
        ),
        (
            vec!["", "A", "A", "sdfb=eee", "dsf=same", "A,B", "", "", "A,B"],
            "A,B",
            vec![5, 1, 0, 3, 2, 4, 6, 7, 8],
        ),
        (
            vec![
                "A",
                "",
                "",
                "A",
                "sdfb=eee,A",
                "dsf=same",
                "A,B",
                "",
                "",
                "A,B",
            ],
            "A,B",
            vec![1, 0, 2, 3, 5, 4, 7, 6],
        ),
        (
            vec![
                "", "", "A", "A", "", "A", "sdfb=eee", "dsf=same", "A,B", "", "", "A,B",
            ],
            "A,B",
            vec![0, 2, 1, 4, 3, 6, 7, 5, 9, 10, 8],
        ),
        (
            vec!["", "A", "A", "B", "B", "C", "C", "C", "C", "C"],
            "A,B,C",
            vec![3, 1, 5, 0, 6, 7, 8, 9, 2, 4],
        ),
        (
            vec!["", "A", "A,C", "B,C", "B", "", "", "C", "C", "C"],
            "A,B,C",
            vec![3, 2, 0, 7, 8, 5, 6, 9, 1, 4],
        ),
        (
            vec!["", "", "", "", "A", "A", "A"],
            "A",
            vec![0, 1, 4, 2, 3, 5],
        ),
        (
            vec!["A", "A", "", "", "", "", "", "", "", "A"],
            "A",
            vec![2, 0, 3, 4, 5, 6, 1],
        ),
        (
            vec!["", "A", "A,C", "B,C", "B", "nil", "", "", "C", "C", "C"],
            "A,B,C",
            vec![3, 2, 0, 8, 9, 6, 7, 10, 1, 4],
        ),
    ];
    for (n, (specs, term_spec, want)) in cases.into_iter().enumerate() {
        let owned: Vec<Labels> = specs.iter().map(|s| Labels::from(&labels(s))).collect();
        let refs: Vec<_> = owned.iter().collect();
        let population: Vec<usize> = (0..specs.len()).filter(|&i| specs[i] != "nil").collect();
        // Upstream sorts the first pods (as many as expected, skipping absent ones).
        let order: Vec<usize> = population.iter().copied().take(want.len()).collect();
        // Upstream's terms are in the order written: "B,A" means B first.
        let mut t = Vec::new();
        for part in term_spec.split(',').filter(|p| !p.is_empty()) {
            t.extend(terms(part));
        }
        assert_eq!(
            scatter(&t, &refs, &population, order),
            want,
            "case {n}: {specs:?} {term_spec}"
        );
    }
}

#[test]
fn star_terms_expand_to_every_value_in_sorted_order() {
    let mut p = pods(10, 0, 0);
    for (i, v) in [
        "value-4-0",
        "value-4-1",
        "value-4-2",
        "value-4",
        "value-4",
        "value-4",
    ]
    .iter()
    .enumerate()
    {
        add_label(&mut p[i], "key-4", v);
    }
    let written = [
        ("key-1", "value-1"),
        ("key-2", "value-2"),
        ("key-1", "value-1"),
        ("key-4", "*"),
        ("key-4", "value-4"),
        ("missing", "*"),
    ]
    .map(|(k, v)| UpdateScatterTerm {
        key: k.into(),
        value: v.into(),
    });
    let got: Vec<String> = expand_scatter_terms(&written, p.iter())
        .into_iter()
        .map(|t| format!("{}={}", t.key, t.value))
        .collect();
    assert_eq!(
        got,
        [
            "key-1=value-1",
            "key-2=value-2",
            "key-4=value-4",
            "key-4=value-4-0",
            "key-4=value-4-1",
            "key-4=value-4-2"
        ]
    );
}

#[test]
fn scatter_spreads_a_zone_across_batches() {
    // 12 pods, 4 in zone a (the newest four would otherwise go first together).
    let mut p = pods(12, 0, 0);
    for (i, pod) in p.iter_mut().enumerate() {
        let zone = if i >= 8 { "a" } else { "b" };
        add_label(pod, "zone", zone);
    }
    let s = set(json!({"maxUnavailable": 3, "scatterStrategy": [{"key": "zone", "value": "a"}]}));
    let batch = next_batch(&s, &p);
    let zone_a_in_batch = batch
        .upgrade
        .iter()
        .filter(|&&i| p[i].labels().get("zone") == Some("a"))
        .count();
    assert_eq!(batch.upgrade.len(), 3);
    assert_eq!(zone_a_in_batch, 1, "{:?}", names(&p, &batch.upgrade));
    // Without scatter the first batch is the three newest: all zone a.
    let plain = next_batch(&set(json!({"maxUnavailable": 3})), &p);
    assert!(
        plain
            .upgrade
            .iter()
            .all(|&i| p[i].labels().get("zone") == Some("a"))
    );
}

// --- properties ------------------------------------------------------------------------------------

fn random_case(rng: &mut Rng) -> (SidecarSet, Vec<PodView<'static>>) {
    let n = rng.usize(..40);
    let zones = ["a", "b", "c"];
    let pods: Vec<PodView> = (0..n)
        .map(|i| {
            let mut p = pod(i);
            let namespace = ["default", "other"][rng.usize(..2)];
            change_pod(&mut p, |s| s.metadata.namespace = Some(namespace.into()));
            add_label(&mut p, "zone", zones[rng.usize(..3)]);
            if chance(rng, 30) {
                add_label(&mut p, "rank", &format!("r-{}", rng.usize(..5)));
            }
            // Without an entry (0), current (1-4), old.
            p.hash_current = matches!(rng.usize(..10), 1..=4);
            if chance(rng, 10) {
                p.hash_without_image_current = false;
            }
            p.ready = chance(rng, 80);
            p.ready_since = chance(rng, 50)
                .then(|| time(rng.usize(..100) as i64))
                .into();
            p.created = chance(rng, 90).then(|| time(rng.usize(..20) as i64)).into();
            p.restarts = rng.usize(..3) as i32;
            let node = chance(rng, 95).then_some("n");
            set_node(&mut p, node);
            p.phase = [
                PodPhase::Running,
                PodPhase::Running,
                PodPhase::Running,
                PodPhase::Pending,
                PodPhase::Unknown,
                PodPhase::Succeeded,
            ][rng.usize(..6)];
            p.deleting = chance(rng, 5);
            p.sidecars = (0..1 + rng.usize(..2))
                .map(|c| SidecarView {
                    name: format!("s{c}").into(),
                    ready: chance(rng, 85),
                    image_running: chance(rng, 85),
                    native: false,
                })
                .collect();
            p
        })
        .collect();
    let int_or_pct = |rng: &mut Rng, ints: usize| match rng.usize(..3) {
        0 => serde_json::Value::Null,
        1 => json!(rng.usize(..ints)),
        _ => json!(format!("{}%", rng.usize(..101))),
    };
    let mut strategy = json!({
        "partition": int_or_pct(rng, n + 3),
        "maxUnavailable": int_or_pct(rng, 6),
        "paused": chance(rng, 5),
    });
    if chance(rng, 5) {
        strategy["type"] = json!("NotUpdate");
    }
    if chance(rng, 20) {
        strategy["selector"] =
            json!({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]});
    }
    match rng.usize(..4) {
        0 => strategy["priorityStrategy"] = json!({"orderPriority": [{"orderedKey": "rank"}]}),
        1 => {
            strategy["priorityStrategy"] = json!({"weightPriority": [{"weight": 30, "matchSelector": {"matchLabels": {"zone": "c"}}}]})
        }
        _ => {}
    }
    match rng.usize(..3) {
        0 => strategy["scatterStrategy"] = json!([{"key": "zone", "value": "*"}]),
        1 => {
            strategy["scatterStrategy"] =
                json!([{"key": "zone", "value": "a"}, {"key": "rank", "value": "r-1"}])
        }
        _ => {}
    }
    (set(strategy), pods)
}

#[test]
fn property_the_batch_respects_max_unavailable_and_partition() {
    let mut rng = Rng::with_seed(0x5eed_cafe_f00d_1234);
    let mut moved = 0;
    for case in 0..3000 {
        let (set, pods) = random_case(&mut rng);
        let strategy = &set.spec.update_strategy;
        let batch = next_batch(&set, &pods);
        let active: Vec<&PodView> = pods.iter().filter(|p| p.is_active()).collect();
        let matched = active.len();
        let updated = active.iter().filter(|p| p.hash_current).count();
        let in_flight = active
            .iter()
            .filter(|p| p.hash_current && !(p.ready && p.sidecars.iter().all(|s| s.image_running)))
            .count();
        let selected = |p: &PodView| match &strategy.selector {
            None => true,
            Some(s) => selector_matches(s, p.labels()).expect("valid selector"),
        };
        let candidates: Vec<usize> = (0..pods.len())
            .filter(|&i| classify(&pods[i], selected(&pods[i])) == PodState::Candidate)
            .collect();
        let ctx = format!("case {case}: {:?}", strategy);

        assert_eq!(batch.matched, matched, "{ctx}");
        assert_eq!(batch.in_flight.len(), in_flight, "{ctx}");
        assert!(
            batch.upgrade.len() <= batch.queue.len() && batch.queue.starts_with(&batch.upgrade),
            "{ctx}"
        );
        let mut distinct = batch.queue.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), batch.queue.len(), "{ctx}");
        for &i in &batch.queue {
            assert!(
                candidates.contains(&i),
                "{ctx}: {} is not a candidate",
                pods[i].key()
            );
        }

        if strategy.paused || strategy.type_ == Some(SidecarSetUpdateStrategyType::NotUpdate) {
            assert!(batch.upgrade.is_empty(), "{ctx}");
            continue;
        }
        let max = max_unavailable_count(strategy.max_unavailable.as_ref(), matched).expect("valid");
        let partition = partition_count(strategy.partition.as_ref(), matched).expect("valid");
        if let Some(IntOrString::Int(n)) = &strategy.partition {
            assert_eq!(partition, (*n as usize).min(matched), "{ctx}");
        }
        if let Some(IntOrString::String(s)) = &strategy.max_unavailable
            && s != "0%"
            && matched > 0
        {
            assert!(
                max >= 1,
                "{ctx}: #1832, a percent rounded a rollout to zero"
            );
        }

        // maxUnavailable: ready pods taken only while fewer than max are in flight.
        let ready_taken = batch.upgrade.iter().filter(|&&i| pods[i].ready).count();
        assert!(
            ready_taken <= max.saturating_sub(in_flight),
            "{ctx}: {ready_taken} ready pods taken, {in_flight} in flight, max {max}"
        );
        // partition: the batch never leaves fewer than `partition` pods on the old version.
        assert!(
            batch.upgrade.len() <= (matched - updated).saturating_sub(partition),
            "{ctx}"
        );
        assert_eq!(
            batch.queue.len(),
            candidates.len().saturating_sub(partition),
            "{ctx}"
        );
        // Progress: with room under both limits, something always moves.
        if candidates.len() > partition && in_flight == 0 && max >= 1 {
            assert!(!batch.upgrade.is_empty(), "{ctx}: stalled");
        }
        moved += usize::from(!batch.upgrade.is_empty());

        // The order of the input does not matter.
        let reordered = shuffled(pods.clone(), case as u64 + 1);
        let again = next_batch(&set, &reordered);
        let keys =
            |ps: &[PodView], is: &[usize]| is.iter().map(|&i| ps[i].key()).collect::<Vec<_>>();
        assert_eq!(
            keys(&pods, &batch.upgrade),
            keys(&reordered, &again.upgrade),
            "{ctx}"
        );
        assert_eq!(
            keys(&pods, &batch.queue),
            keys(&reordered, &again.queue),
            "{ctx}"
        );
        assert_eq!(batch.hold, again.hold, "{ctx}");
    }
    assert!(
        moved > 500,
        "the generator must exercise real batches ({moved})"
    );
}

#[test]
fn optional_times_keep_the_second_and_order_none_first() {
    let t: Timestamp = "2026-11-29T10:00:00.750Z".parse().expect("time");
    assert_eq!(
        OptionalTime::from(Some(t)).get(),
        Some("2026-11-29T10:00:00Z".parse().expect("time"))
    );
    assert_eq!(OptionalTime::from(None).get(), None);
    assert_eq!(OptionalTime::default(), OptionalTime::NONE);
    assert!(OptionalTime::NONE < OptionalTime::from(Some(Timestamp::MIN)));
    let epoch = OptionalTime::from(Some(Timestamp::UNIX_EPOCH));
    assert_eq!(epoch.get(), Some(Timestamp::UNIX_EPOCH), "zero is a time");
}

#[test]
fn a_pod_view_stays_small() {
    // A reconcile holds one for every owned pod at once: each byte is 10 KB at 10,000 pods.
    // 80 = the pod (8), three times (24), the inline sidecar (32 with smallvec's `union`),
    // restarts and flags (16 with padding).
    assert!(std::mem::size_of::<PodView>() <= 80);
    assert!(std::mem::size_of::<OptionalTime>() == 8);
}

#[test]
fn revisions_differing_only_in_images_and_resources_are_resizable() {
    use kruise_rs_sidecar::revision::history::new_revision;
    let at = |image: &str, resources: serde_json::Value, env: &str| {
        let spec: SidecarSetSpec = serde_json::from_value(json!({
            "selector": {"matchLabels": {"app": "web"}},
            "containers": [{
                "name": "proxy", "image": image, "resources": resources,
                "env": [{"name": "MODE", "value": env}],
            }],
        }))
        .expect("spec");
        SidecarSet::new("mesh", spec)
    };
    let small = json!({"limits": {"cpu": "100m"}});
    let big = json!({"limits": {"cpu": "200m"}});
    let current = at("proxy:2", big.clone(), "a");
    let revision = |set: &SidecarSet, number: i64, name: &str| {
        let mut r = new_revision(set, "kruise-system", number, 0);
        r.metadata.name = Some(name.into());
        r
    };
    let versions = [
        at("proxy:1", small.clone(), "a"),
        at("proxy:1", big.clone(), "b"),
        current.clone(),
    ];
    let revisions = [
        revision(&versions[0], 1, "resources-and-image"),
        revision(&versions[1], 2, "env"),
        revision(&versions[2], 3, "current"),
    ];
    let hashes = CurrentHashes::with_resize(&current, &revisions, true);
    // What the webhook wrote on the pods of each version: the hash of its defaulted spec (no
    // SidecarSet here carries hash annotations).
    let hash_of = |i: usize| CurrentHashes::of(&versions[i]).hash;
    assert_eq!(
        hashes.resizable_hashes,
        HashSet::from([hash_of(0), hash_of(2)]),
        "the revisions resources-and-image and current, not env"
    );
    assert_ne!(hash_of(0), hash_of(1));
    // A revision's own hash annotation wins (upstream's and ours carry one).
    let mut annotated = revision(&versions[0], 5, "annotated");
    annotated
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(SIDECARSET_HASH.into(), "as-recorded".into());
    let hashes = CurrentHashes::with_resize(&current, [&annotated], true);
    assert_eq!(
        hashes.resizable_hashes,
        HashSet::from(["as-recorded".into()])
    );
    assert!(hashes.resize_served);
    let of = CurrentHashes::of(&current);
    assert_eq!(
        (&hashes.hash, &hashes.without_image),
        (&of.hash, &of.without_image)
    );
    // Unreadable revision data is not resizable.
    let mut broken = revision(&current, 4, "broken");
    broken.data = Some(k8s_openapi::apimachinery::pkg::runtime::RawExtension(
        json!({"nope": 1}),
    ));
    let hashes = CurrentHashes::with_resize(&current, [&broken], true);
    assert!(hashes.resizable_hashes.is_empty());
}
