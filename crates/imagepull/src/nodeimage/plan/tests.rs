use super::*;
use crate::compact_nodeimage::{ImageStatus, ImageTagPullPolicy, Images};
use crate::node_summary::NodeStatusSummary;
use k8s_openapi::api::core::v1::NodeCondition;
use kruise_rs_api::nodeimage::NodeImage;
use kruise_rs_controller::interned_labels::Labels;
use kube::api::ObjectMeta;

const T0: i64 = 1_700_000_000;

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(T0 + secs).expect("valid")
}

fn time(secs: i64) -> Time {
    Time(at(secs))
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn node(labels_: &[(&str, &str)], ready: Option<(&str, Option<i64>)>) -> NodeSummary {
    NodeSummary {
        metadata: ObjectMeta {
            name: Some("n1".into()),
            ..Default::default()
        },
        labels: Labels::from(&labels(labels_)),
        status: ready.map(|(status, since)| NodeStatusSummary {
            conditions: Some(vec![
                NodeCondition {
                    type_: "MemoryPressure".into(),
                    status: "False".into(),
                    ..Default::default()
                },
                NodeCondition {
                    type_: "Ready".into(),
                    status: status.into(),
                    last_transition_time: since.map(time),
                    ..Default::default()
                },
            ]),
        }),
    }
}

fn nodeimage(labels_: &[(&str, &str)]) -> LeanNodeImage {
    let mut ni = NodeImage::new("n1", Default::default());
    ni.metadata.labels = Some(labels(labels_));
    ni.into()
}

fn job(name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("apps.kruise.io/v1alpha1".into()),
        kind: Some("ImagePullJob".into()),
        name: Some(name.into()),
        namespace: Some("default".into()),
        uid: Some(uid.into()),
        ..Default::default()
    }
}

fn tag(name: &str, version: i64, created: Option<i64>, owners: &[ObjectReference]) -> ImageTagSpec {
    ImageTagSpec {
        tag: name.into(),
        created_at: created.map(time),
        owner_references: owners.iter().cloned().map(Into::into).collect(),
        version: Some(version),
        ..Default::default()
    }
}

fn with_policy(mut t: ImageTagSpec, ttl: Option<i32>, deadline: Option<i64>) -> ImageTagSpec {
    t.pull_policy = Some(ImageTagPullPolicy {
        ttl_seconds_after_finished: ttl,
        active_deadline_seconds: deadline,
        ..Default::default()
    });
    t
}

fn spec(images: &[(&str, Vec<ImageTagSpec>)]) -> NodeImageSpec {
    NodeImageSpec {
        images: images
            .iter()
            .map(|(name, tags)| {
                (
                    (*name).into(),
                    ImageSpec {
                        tags: tags.clone(),
                        ..Default::default()
                    },
                )
            })
            .collect(),
    }
}

fn st(tag: &str, phase: ImagePullPhase, version: i64, completed: Option<i64>) -> ImageTagStatus {
    ImageTagStatus {
        tag: tag.into(),
        phase,
        progress: None,
        start_time: None,
        completion_time: completed.map(time),
        version: Some(version),
        image_id: None,
        message: None,
    }
}

fn status(images: &[(&str, Vec<ImageTagStatus>)]) -> NodeImageStatus {
    NodeImageStatus {
        image_statuses: images
            .iter()
            .map(|(name, tags)| ((*name).into(), ImageStatus { tags: tags.clone() }))
            .collect(),
        ..Default::default()
    }
}

fn gone(uids: &[&str]) -> BTreeSet<String> {
    uids.iter().map(|u| (*u).to_owned()).collect()
}

/// [`collect`] with the uids in `gone_uids` gone and no owner's spec known.
fn gc(
    spec: &NodeImageSpec,
    status: &NodeImageStatus,
    gone_uids: &[&str],
    now: Timestamp,
) -> Collected {
    collect(spec, status, &gone(gone_uids), |_| None, now)
}

fn tag_counts(images: &Images) -> BTreeMap<&str, usize> {
    images
        .iter()
        .map(|(k, v)| (k.as_str(), v.tags.len()))
        .collect()
}

// --- time helpers ---

#[test]
fn go_durations() {
    let cases = [
        (Duration::ZERO, "0s"),
        (Duration::from_millis(500), "500ms"),
        (Duration::from_secs(3), "3s"),
        (Duration::from_millis(1500), "1.5s"),
        (Duration::from_millis(1250), "1.25s"),
        (Duration::from_secs(90), "1m30s"),
        (Duration::from_secs(600), "10m0s"),
        (Duration::from_secs(3600), "1h0m0s"),
        (Duration::from_secs(3723), "1h2m3s"),
    ];
    for (d, want) in cases {
        assert_eq!(go_duration(d), want, "{d:?}");
    }
    assert_eq!(
        not_responded(Duration::from_secs(600)),
        "node has not responded for 10m0s"
    );
}

#[test]
fn requeue_is_floored_and_capped() {
    assert_eq!(requeue_after(None, at(0)), MAX_REQUEUE);
    assert_eq!(requeue_after(Some(at(10)), at(0)), Duration::from_secs(10));
    assert_eq!(requeue_after(Some(at(0)), at(0)), MIN_REQUEUE);
    assert_eq!(requeue_after(Some(at(-5)), at(0)), MIN_REQUEUE, "past");
    assert_eq!(
        requeue_after(Some(at(0) + SignedDuration::from_millis(200)), at(0)),
        MIN_REQUEUE
    );
    assert_eq!(requeue_after(Some(at(1_000_000)), at(0)), MAX_REQUEUE);
    assert_eq!(requeue_after(Some(Timestamp::MAX), at(0)), MAX_REQUEUE);
}

// --- lifecycle ---

const DELAY: Duration = Duration::from_secs(30);

#[test]
fn a_ready_node_gets_a_nodeimage_with_its_labels_after_the_delay() {
    let n = node(&[("zone", "a")], Some(("True", Some(0))));
    assert_eq!(
        lifecycle(Some(&n), None, DELAY, at(10)),
        Lifecycle::CreateAt(at(30))
    );
    assert_eq!(
        lifecycle(Some(&n), None, DELAY, at(30)),
        Lifecycle::Create(labels(&[("zone", "a")])),
        "exactly at ready + delay"
    );
    assert_eq!(
        lifecycle(Some(&n), None, DELAY, at(31)),
        Lifecycle::Create(labels(&[("zone", "a")]))
    );
    assert_eq!(
        lifecycle(Some(&n), None, Duration::ZERO, at(0)),
        Lifecycle::Create(labels(&[("zone", "a")])),
        "no delay"
    );
}

#[test]
fn ready_without_transition_time_counts_as_long_ago() {
    let n = node(&[], Some(("True", None)));
    assert_eq!(
        lifecycle(Some(&n), None, DELAY, at(0)),
        Lifecycle::Create(BTreeMap::new())
    );
}

#[test]
fn no_nodeimage_for_unready_virtual_deleting_or_missing_nodes() {
    for n in [
        node(&[], Some(("False", Some(0)))),
        node(&[], Some(("Unknown", Some(0)))),
        node(&[], None),
        node(&[("type", "virtual-kubelet")], Some(("True", Some(0)))),
    ] {
        assert_eq!(
            lifecycle(Some(&n), None, Duration::ZERO, at(100)),
            Lifecycle::Absent,
            "{n:?}"
        );
    }
    let mut deleting = node(&[], Some(("True", Some(0))));
    deleting.metadata.deletion_timestamp = Some(time(50));
    assert_eq!(
        lifecycle(Some(&deleting), None, Duration::ZERO, at(100)),
        Lifecycle::Absent
    );
    assert_eq!(
        lifecycle(None, None, Duration::ZERO, at(100)),
        Lifecycle::Absent
    );
    // Other `type` values are ordinary nodes.
    let kwok = node(&[("type", "kwok")], Some(("True", Some(0))));
    assert!(matches!(
        lifecycle(Some(&kwok), None, Duration::ZERO, at(0)),
        Lifecycle::Create(_)
    ));
}

#[test]
fn labels_follow_the_node_exactly() {
    let n = node(&[("a", "1"), ("b", "2")], Some(("True", Some(0))));
    let same = nodeimage(&[("b", "2"), ("a", "1")]);
    assert_eq!(
        lifecycle(Some(&n), Some(&same), DELAY, at(0)),
        Lifecycle::Keep { labels: None }
    );
    for stale in [
        nodeimage(&[("a", "1")]),
        nodeimage(&[("a", "1"), ("b", "3")]),
        nodeimage(&[("a", "1"), ("b", "2"), ("extra", "x")]),
    ] {
        assert_eq!(
            lifecycle(Some(&n), Some(&stale), DELAY, at(0)),
            Lifecycle::Keep {
                labels: Some(labels(&[("a", "1"), ("b", "2")]))
            }
        );
    }
    // A node without labels: the NodeImage loses its labels; none at all means none.
    let bare = node(&[], Some(("True", Some(0))));
    let unlabelled = LeanNodeImage::from(NodeImage::new("n1", Default::default()));
    assert_eq!(
        lifecycle(Some(&bare), Some(&unlabelled), DELAY, at(0)),
        Lifecycle::Keep { labels: None }
    );
}

#[test]
fn an_existing_nodeimage_is_kept_even_if_its_node_is_not_ready_or_virtual() {
    let ni = nodeimage(&[]);
    for n in [node(&[], Some(("False", Some(0)))), node(&[], None)] {
        assert_eq!(
            lifecycle(Some(&n), Some(&ni), DELAY, at(0)),
            Lifecycle::Keep { labels: None }
        );
    }
    let virt = node(&[("type", "virtual-kubelet")], None);
    assert_eq!(
        lifecycle(Some(&virt), Some(&ni), DELAY, at(0)),
        Lifecycle::Keep {
            labels: Some(labels(&[("type", "virtual-kubelet")]))
        }
    );
}

#[test]
fn a_nodeimage_without_a_live_node_is_deleted_unless_fake() {
    let ni = nodeimage(&[("zone", "a")]);
    assert_eq!(lifecycle(None, Some(&ni), DELAY, at(0)), Lifecycle::Delete);
    let mut deleting = node(&[], Some(("True", Some(0))));
    deleting.metadata.deletion_timestamp = Some(time(0));
    assert_eq!(
        lifecycle(Some(&deleting), Some(&ni), DELAY, at(0)),
        Lifecycle::Delete
    );
    for value in ["true", "", "anything"] {
        let fake = nodeimage(&[(FAKE_NODEIMAGE, value)]);
        assert_eq!(
            lifecycle(None, Some(&fake), DELAY, at(0)),
            Lifecycle::Keep { labels: None },
            "{value:?}"
        );
        assert_eq!(
            lifecycle(Some(&deleting), Some(&fake), DELAY, at(0)),
            Lifecycle::Keep { labels: None }
        );
    }
    // A fake NodeImage whose Node does exist follows the Node's labels (upstream too).
    let n = node(&[("zone", "b")], None);
    let fake = nodeimage(&[(FAKE_NODEIMAGE, "true")]);
    assert_eq!(
        lifecycle(Some(&n), Some(&fake), DELAY, at(0)),
        Lifecycle::Keep {
            labels: Some(labels(&[("zone", "b")]))
        }
    );
}

#[test]
fn a_nodeimage_being_deleted_is_left_alone() {
    let mut deleting = NodeImage::new("n1", Default::default());
    deleting.metadata.deletion_timestamp = Some(time(0));
    let ni = LeanNodeImage::from(deleting);
    assert_eq!(
        lifecycle(None, Some(&ni), DELAY, at(0)),
        Lifecycle::Deleting
    );
    let n = node(&[("a", "b")], Some(("True", Some(0))));
    assert_eq!(
        lifecycle(Some(&n), Some(&ni), DELAY, at(0)),
        Lifecycle::Deleting
    );
}

// --- owners ---

#[test]
fn image_pull_job_references_by_group_and_kind() {
    assert!(is_image_pull_job(&job("j", "u")));
    let mut beta = job("j", "u");
    beta.api_version = Some("apps.kruise.io/v1beta1".into());
    assert!(is_image_pull_job(&beta));
    for (api_version, kind) in [
        (Some("apps/v1"), Some("Deployment")),
        (Some("other.io/v1"), Some("ImagePullJob")),
        (Some("v1"), Some("ImagePullJob")),
        (None, Some("ImagePullJob")),
        (Some("apps.kruise.io/v1beta1"), Some("SidecarSet")),
        (Some("apps.kruise.io/v1beta1"), None),
    ] {
        let r = ObjectReference {
            api_version: api_version.map(Into::into),
            kind: kind.map(Into::into),
            ..job("j", "u")
        };
        assert!(!is_image_pull_job(&r), "{api_version:?} {kind:?}");
    }
}

#[test]
fn job_owners_are_listed_once_by_uid() {
    let s = spec(&[
        (
            "nginx",
            vec![tag("1", 1, Some(0), &[job("a", "ua"), job("b", "ub")])],
        ),
        (
            "redis",
            vec![tag(
                "7",
                1,
                Some(0),
                &[
                    job("a", "ua"),
                    ObjectReference {
                        kind: Some("Deployment".into()),
                        api_version: Some("apps/v1".into()),
                        uid: Some("ud".into()),
                        ..Default::default()
                    },
                ],
            )],
        ),
    ]);
    let uids: Vec<_> = job_owners(&s)
        .into_iter()
        .filter_map(|r| r.uid.as_deref())
        .collect();
    assert_eq!(uids, ["ua", "ub"]);
}

// --- collect: upstream's TestDoUpdateNodeImage cases that apply ---

fn base() -> NodeImageSpec {
    spec(&[(
        "nginx",
        vec![tag("latest", 1, Some(0), &[job("job1", "uid1")])],
    )])
}

#[test]
fn upstream_normal_case_without_modification() {
    // An extra owner without kind/apiVersion is not an ImagePullJob: kept.
    let mut s = base();
    let t = &mut s.images.get_mut("nginx").expect("nginx").tags[0];
    t.owner_references.push(
        ObjectReference {
            name: Some("job1".into()),
            namespace: Some("default".into()),
            uid: Some("uid1".into()),
            ..Default::default()
        }
        .into(),
    );
    let out = gc(&s, &NodeImageStatus::default(), &[], at(0));
    assert_eq!(out.images, s.images);
    assert_eq!(out.wake, None);
}

#[test]
fn upstream_missing_created_at_is_kept_here() {
    let mut s = base();
    s.images.get_mut("nginx").expect("nginx").tags[0].created_at = None;
    let out = gc(&s, &NodeImageStatus::default(), &[], at(0));
    assert_eq!(out.images, s.images, "upstream drops it; we do not");
}

#[test]
fn upstream_non_image_pull_job_owner_is_kept() {
    let mut s = base();
    s.images.get_mut("nginx").expect("nginx").tags[0].owner_references = vec![
        ObjectReference {
            name: Some("deployment1".into()),
            namespace: Some("default".into()),
            uid: Some("dep-uid1".into()),
            kind: Some("Deployment".into()),
            api_version: Some("apps/v1".into()),
            ..Default::default()
        }
        .into(),
    ];
    // Even if its uid were somehow listed as gone.
    let out = gc(&s, &NodeImageStatus::default(), &["dep-uid1"], at(0));
    assert_eq!(out.images, s.images);
}

#[test]
fn upstream_gone_or_replaced_job_removes_the_owner_then_tag_then_image() {
    // "not found" and "uid mismatch" both reach here as a gone uid.
    let out = gc(&base(), &NodeImageStatus::default(), &["uid1"], at(0));
    assert!(out.images.is_empty());
}

#[test]
fn upstream_running_or_completed_job_keeps_the_owner() {
    let out = gc(&base(), &NodeImageStatus::default(), &["other"], at(0));
    assert_eq!(out.images, base().images);
}

#[test]
fn upstream_partial_owner_removal_keeps_the_tag() {
    let mut s = base();
    s.images.get_mut("nginx").expect("nginx").tags[0]
        .owner_references
        .push(job("job2", "uid2").into());
    let out = gc(&s, &NodeImageStatus::default(), &["uid1"], at(0));
    assert_eq!(tag_counts(&out.images), BTreeMap::from([("nginx", 1)]));
    assert_eq!(
        out.images["nginx"].tags[0].owner_references,
        vec![job("job2", "uid2").into()]
    );
}

#[test]
fn upstream_partial_tag_removal_keeps_the_image() {
    let mut s = base();
    s.images.get_mut("nginx").expect("nginx").tags.push(tag(
        "1.20",
        1,
        Some(0),
        &[job("job2", "another-uid")],
    ));
    let out = gc(&s, &NodeImageStatus::default(), &["uid1"], at(0));
    assert_eq!(tag_counts(&out.images), BTreeMap::from([("nginx", 1)]));
    assert_eq!(out.images["nginx"].tags[0].tag, "1.20");
}

#[test]
fn upstream_ttl_exceeded_removes_the_tag() {
    let s = spec(&[(
        "nginx",
        vec![with_policy(
            tag("latest", 1, Some(0), &[job("job1", "uid1")]),
            Some(60),
            None,
        )],
    )]);
    let done = status(&[(
        "nginx",
        vec![st("latest", ImagePullPhase::Succeeded, 1, Some(0))],
    )]);
    let out = gc(&s, &done, &[], at(61));
    assert!(out.images.is_empty());
    assert_eq!(out.wake, None);
}

#[test]
fn upstream_ttl_not_exceeded_sets_the_wake_up() {
    let s = spec(&[(
        "nginx",
        vec![with_policy(
            tag("latest", 1, Some(0), &[job("job1", "uid1")]),
            Some(60),
            None,
        )],
    )]);
    let done = status(&[(
        "nginx",
        vec![st("latest", ImagePullPhase::Succeeded, 1, Some(0))],
    )]);
    let out = gc(&s, &done, &[], at(30));
    assert_eq!(out.images, s.images);
    assert_eq!(out.wake, Some(at(60)));
}

#[test]
fn upstream_multiple_images_all_alive() {
    let s = spec(&[
        (
            "nginx",
            vec![
                tag("latest", 1, Some(0), &[job("job1", "uid1")]),
                tag("1.20", 1, Some(0), &[job("job2", "uid2")]),
            ],
        ),
        (
            "redis",
            vec![tag("alpine", 1, Some(0), &[job("job3", "uid3")])],
        ),
    ]);
    let out = gc(&s, &NodeImageStatus::default(), &[], at(0));
    assert_eq!(
        tag_counts(&out.images),
        BTreeMap::from([("nginx", 2), ("redis", 1)])
    );
}

// --- collect: edge cases ---

#[test]
fn ttl_exactly_at_the_boundary_removes_the_tag() {
    let s = spec(&[(
        "nginx",
        vec![with_policy(
            tag("1", 1, Some(0), &[job("j", "u")]),
            Some(60),
            None,
        )],
    )]);
    let done = status(&[("nginx", vec![st("1", ImagePullPhase::Failed, 1, Some(10))])]);
    assert_eq!(gc(&s, &done, &[], at(69)).wake, Some(at(70)));
    assert!(gc(&s, &done, &[], at(70)).images.is_empty());
    let zero = spec(&[(
        "nginx",
        vec![with_policy(
            tag("1", 1, Some(0), &[job("j", "u")]),
            Some(0),
            None,
        )],
    )]);
    assert!(gc(&zero, &done, &[], at(10)).images.is_empty());
    let negative = spec(&[(
        "nginx",
        vec![with_policy(
            tag("1", 1, Some(0), &[job("j", "u")]),
            Some(-5),
            None,
        )],
    )]);
    assert!(gc(&negative, &done, &[], at(10)).images.is_empty());
}

#[test]
fn ttl_counts_only_from_a_completion_of_the_same_version() {
    let s = spec(&[(
        "nginx",
        vec![with_policy(
            tag("1", 2, Some(0), &[job("j", "u")]),
            Some(1),
            None,
        )],
    )]);
    // Completed long ago, but for version 1: version 2 was asked for since.
    let old = status(&[(
        "nginx",
        vec![st("1", ImagePullPhase::Succeeded, 1, Some(0))],
    )]);
    let out = gc(&s, &old, &[], at(1000));
    assert_eq!(out.images, s.images);
    assert_eq!(out.wake, None);
    // Same version but still running: no completion time, no TTL.
    let running = status(&[("nginx", vec![st("1", ImagePullPhase::Pulling, 2, None)])]);
    assert_eq!(gc(&s, &running, &[], at(1000)).images, s.images);
    // Missing versions count as 0 on both sides.
    let mut unversioned = s.clone();
    unversioned.images.get_mut("nginx").expect("nginx").tags[0].version = None;
    let mut done = status(&[(
        "nginx",
        vec![st("1", ImagePullPhase::Succeeded, 0, Some(0))],
    )]);
    done.image_statuses.get_mut("nginx").expect("nginx").tags[0].version = None;
    assert!(gc(&unversioned, &done, &[], at(10)).images.is_empty());
}

#[test]
fn no_ttl_or_no_status_keeps_the_tag_without_wake_up() {
    let s = spec(&[("nginx", vec![tag("1", 1, Some(0), &[job("j", "u")])])]);
    let done = status(&[(
        "nginx",
        vec![st("1", ImagePullPhase::Succeeded, 1, Some(0))],
    )]);
    let out = gc(&s, &done, &[], at(1_000_000));
    assert_eq!((out.images, out.wake), (s.images.clone(), None));
    let ttl = spec(&[(
        "nginx",
        vec![with_policy(
            tag("1", 1, Some(0), &[job("j", "u")]),
            Some(5),
            None,
        )],
    )]);
    let out = gc(&ttl, &NodeImageStatus::default(), &[], at(1_000_000));
    assert_eq!((out.images, out.wake), (ttl.images.clone(), None));
    // The status of another image with the same tag name does not count.
    let other = status(&[(
        "redis",
        vec![st("1", ImagePullPhase::Succeeded, 1, Some(0))],
    )]);
    assert_eq!(gc(&ttl, &other, &[], at(1_000_000)).images, ttl.images);
}

#[test]
fn a_tag_that_never_had_owners_is_kept() {
    let s = spec(&[("nginx", vec![tag("1", 1, Some(0), &[])])]);
    assert_eq!(
        gc(&s, &NodeImageStatus::default(), &["u"], at(0)).images,
        s.images
    );
}

#[test]
fn an_image_without_tags_is_dropped_and_others_keep_secrets_and_sandbox() {
    let mut s = spec(&[
        ("empty", vec![]),
        (
            "nginx",
            vec![
                tag("1", 1, Some(0), &[job("j", "u")]),
                tag("2", 1, Some(0), &[job("k", "v")]),
            ],
        ),
    ]);
    let nginx = s.images.get_mut("nginx").expect("nginx");
    nginx.pull_secrets = vec![crate::compact_nodeimage::ReferenceObject {
        namespace: Some("kruise-daemon-config".into()),
        name: Some("s".into()),
        mode: Some("batch".into()),
    }];
    nginx.sandbox_config = Some(Box::new(crate::compact_nodeimage::SandboxConfig {
        labels: labels(&[("app", "x")]),
        ..Default::default()
    }));
    let out = gc(&s, &NodeImageStatus::default(), &["v"], at(0));
    assert_eq!(tag_counts(&out.images), BTreeMap::from([("nginx", 1)]));
    let kept = &out.images["nginx"];
    assert_eq!(kept.pull_secrets, s.images["nginx"].pull_secrets);
    assert_eq!(kept.sandbox_config, s.images["nginx"].sandbox_config);
    assert_eq!(kept.tags[0].tag, "1");
}

#[test]
fn the_earliest_ttl_of_several_tags_and_images_wakes_us() {
    let s = spec(&[
        (
            "nginx",
            vec![
                with_policy(tag("1", 1, Some(0), &[job("j", "u")]), Some(100), None),
                with_policy(tag("2", 1, Some(0), &[job("j", "u")]), Some(10), None),
            ],
        ),
        (
            "redis",
            vec![with_policy(
                tag("7", 1, Some(0), &[job("j", "u")]),
                Some(50),
                None,
            )],
        ),
    ]);
    let done = status(&[
        (
            "nginx",
            vec![
                st("1", ImagePullPhase::Succeeded, 1, Some(0)),
                st("2", ImagePullPhase::Succeeded, 1, Some(0)),
            ],
        ),
        ("redis", vec![st("7", ImagePullPhase::Failed, 1, Some(0))]),
    ]);
    let out = gc(&s, &done, &[], at(5));
    assert_eq!(out.wake, Some(at(10)));
    let out = gc(&s, &done, &[], at(20));
    assert_eq!(
        tag_counts(&out.images),
        BTreeMap::from([("nginx", 1), ("redis", 1)])
    );
    assert_eq!(out.wake, Some(at(50)));
}

// --- timeouts ---

const TIMEOUT: Duration = Duration::from_secs(600);

#[test]
fn an_unanswered_tag_fails_after_the_response_timeout() {
    let s = spec(&[("nginx", vec![tag("1", 3, Some(0), &[job("j", "u")])])]);
    let none = NodeImageStatus::default();
    let early = timeouts(&s, &none, at(599), TIMEOUT);
    assert_eq!(early.status, None);
    assert!(early.failed.is_empty());
    assert_eq!(early.wake, Some(at(600)));

    let out = timeouts(&s, &none, at(600), TIMEOUT);
    let new = out.status.expect("changed");
    let t = &new.image_statuses["nginx"].tags[0];
    assert_eq!(t.tag, "1");
    assert_eq!(t.phase, ImagePullPhase::Failed);
    assert_eq!(t.version, Some(3));
    assert_eq!(t.completion_time, Some(time(600)));
    assert_eq!(
        t.message.as_deref(),
        Some("node has not responded for 10m0s")
    );
    assert_eq!(
        (new.desired, new.failed, new.pulling, new.succeeded),
        (1, 1, 0, 0)
    );
    assert_eq!(
        out.failed,
        vec![FailedTag {
            image: "nginx".into(),
            tag: "1".into(),
            message: "node has not responded for 10m0s".into(),
            owners: vec![job("j", "u").into()],
        }]
    );
    assert_eq!(out.wake, None);
    assert_eq!(
        out.failed[0].note("node-a"),
        "Failed to pull image nginx:1 on node node-a: node has not responded for 10m0s"
    );
}

#[test]
fn a_timed_out_digest_is_named_as_a_reference() {
    let digest = format!("sha256:{}", "a".repeat(64));
    let failed = FailedTag {
        image: "ghcr.io/org/app".into(),
        tag: digest.clone(),
        message: "node has not responded for 10m0s".into(),
        owners: Vec::new(),
    };
    assert_eq!(
        failed.note("node-a"),
        format!(
            "Failed to pull image ghcr.io/org/app@{digest} on node node-a: node has not responded for 10m0s"
        )
    );
}

#[test]
fn a_status_of_another_version_is_no_answer() {
    let s = spec(&[("nginx", vec![tag("1", 2, Some(100), &[job("j", "u")])])]);
    let mut old = status(&[(
        "nginx",
        vec![st("1", ImagePullPhase::Succeeded, 1, Some(50))],
    )]);
    let t = &mut old.image_statuses.get_mut("nginx").expect("nginx").tags[0];
    t.image_id = Some("nginx@sha256:abc".into());
    t.start_time = Some(time(40));
    old.succeeded = 1;
    old.desired = 1;
    old.waiting = 7;
    assert_eq!(timeouts(&s, &old, at(699), TIMEOUT).wake, Some(at(700)));
    let out = timeouts(&s, &old, at(700), TIMEOUT);
    let new = out.status.expect("changed");
    let t = &new.image_statuses["nginx"].tags[0];
    assert_eq!((t.phase, t.version), (ImagePullPhase::Failed, Some(2)));
    assert_eq!(t.completion_time, Some(time(700)));
    assert_eq!(
        t.image_id.as_deref(),
        Some("nginx@sha256:abc"),
        "other fields stay"
    );
    assert_eq!(t.start_time, Some(time(40)));
    assert_eq!((new.succeeded, new.failed, new.desired), (0, 1, 1));
    assert_eq!(new.waiting, 7, "waiting is the daemon's");
}

#[test]
fn an_answered_tag_never_times_out_for_response() {
    let s = spec(&[("nginx", vec![tag("1", 1, Some(0), &[job("j", "u")])])]);
    for phase in [ImagePullPhase::Waiting, ImagePullPhase::Pulling] {
        let answered = status(&[("nginx", vec![st("1", phase, 1, None)])]);
        let out = timeouts(&s, &answered, at(1_000_000), TIMEOUT);
        assert_eq!(out, Timeouts::default(), "{phase:?}: no deadline set");
    }
}

#[test]
fn an_unfinished_tag_fails_after_deadline_plus_response_timeout() {
    let s = spec(&[(
        "nginx",
        vec![with_policy(
            tag("1", 1, Some(0), &[job("j", "u")]),
            None,
            Some(100),
        )],
    )]);
    let pulling = status(&[("nginx", vec![st("1", ImagePullPhase::Pulling, 1, None)])]);
    assert_eq!(timeouts(&s, &pulling, at(699), TIMEOUT).wake, Some(at(700)));
    let out = timeouts(&s, &pulling, at(700), TIMEOUT);
    let t = &out.status.expect("changed").image_statuses["nginx"].tags[0];
    assert_eq!(t.phase, ImagePullPhase::Failed);
    assert_eq!(t.message.as_deref(), Some(DEADLINE_EXCEEDED));
    assert_eq!(out.failed[0].message, DEADLINE_EXCEEDED);
    // Finished in time: nothing.
    let done = status(&[(
        "nginx",
        vec![st("1", ImagePullPhase::Succeeded, 1, Some(50))],
    )]);
    assert_eq!(
        timeouts(&s, &done, at(10_000), TIMEOUT),
        Timeouts::default()
    );
}

#[test]
fn no_status_at_all_fails_for_response_first_even_with_a_deadline() {
    let s = spec(&[(
        "nginx",
        vec![with_policy(
            tag("1", 1, Some(0), &[job("j", "u")]),
            None,
            Some(10),
        )],
    )]);
    let out = timeouts(&s, &NodeImageStatus::default(), at(5000), TIMEOUT);
    assert_eq!(out.failed.len(), 1);
    assert_eq!(out.failed[0].message, "node has not responded for 10m0s");
    // Once marked, it is finished: nothing more happens.
    let again = timeouts(&s, &out.status.expect("changed"), at(6000), TIMEOUT);
    assert_eq!(again, Timeouts::default());
}

#[test]
fn a_tag_without_created_at_never_times_out() {
    let s = spec(&[(
        "nginx",
        vec![with_policy(
            tag("1", 1, None, &[job("j", "u")]),
            None,
            Some(1),
        )],
    )]);
    let out = timeouts(&s, &NodeImageStatus::default(), at(1_000_000), TIMEOUT);
    assert_eq!(out, Timeouts::default());
}

#[test]
fn a_failure_prunes_stale_status_and_recounts() {
    let s = spec(&[
        (
            "nginx",
            vec![
                tag("a", 1, Some(0), &[job("j", "u")]),
                tag("b", 1, Some(0), &[job("j", "u")]),
                tag("c", 1, Some(0), &[job("j", "u")]),
                tag("new", 1, Some(0), &[job("j", "u")]),
            ],
        ),
        ("redis", vec![tag("7", 1, Some(0), &[job("j", "u")])]),
    ]);
    let old = NodeImageStatus {
        desired: 9,
        succeeded: 9,
        waiting: 2,
        ..status(&[
            (
                "nginx",
                vec![
                    st("a", ImagePullPhase::Succeeded, 1, Some(1)),
                    st("b", ImagePullPhase::Pulling, 1, None),
                    st("c", ImagePullPhase::Waiting, 1, None),
                    st("gone", ImagePullPhase::Succeeded, 1, Some(1)),
                    st("z", ImagePullPhase::Failed, 1, Some(1)),
                ],
            ),
            ("redis", vec![st("7", ImagePullPhase::Failed, 1, Some(1))]),
            (
                "removed",
                vec![st("1", ImagePullPhase::Succeeded, 1, Some(1))],
            ),
        ])
    };
    let out = timeouts(&s, &old, at(600), TIMEOUT);
    assert_eq!(out.failed.len(), 1, "only `new` was unanswered");
    let new = out.status.expect("changed");
    let nginx: Vec<_> = new.image_statuses["nginx"]
        .tags
        .iter()
        .map(|t| t.tag.as_str())
        .collect();
    assert_eq!(
        nginx,
        ["a", "b", "c", "new"],
        "sorted insert, stale tags pruned"
    );
    assert!(!new.image_statuses.contains_key("removed"));
    assert_eq!(
        (
            new.desired,
            new.succeeded,
            new.pulling,
            new.failed,
            new.waiting
        ),
        (5, 1, 1, 2, 2)
    );
}

#[test]
fn the_earliest_pending_instant_wins_and_nothing_changes_before_it() {
    let s = spec(&[
        ("nginx", vec![tag("1", 1, Some(100), &[job("j", "u")])]),
        (
            "redis",
            vec![with_policy(
                tag("7", 1, Some(0), &[job("j", "u")]),
                None,
                Some(30),
            )],
        ),
    ]);
    let st_ = status(&[("redis", vec![st("7", ImagePullPhase::Pulling, 1, None)])]);
    let out = timeouts(&s, &st_, at(10), Duration::from_secs(3));
    assert_eq!(out.status, None);
    assert_eq!(out.wake, Some(at(33)));
    let out = timeouts(&s, &st_, at(40), Duration::from_secs(3));
    assert_eq!(out.failed.len(), 1);
    assert_eq!(out.wake, Some(at(103)));
}

#[test]
fn next_wake_combines_ttl_and_timeouts() {
    let mut ni = LeanNodeImage::new(
        "n1",
        spec(&[
            (
                "nginx",
                vec![with_policy(
                    tag("1", 1, Some(0), &[job("j", "u")]),
                    Some(40),
                    None,
                )],
            ),
            ("redis", vec![tag("7", 1, Some(20), &[job("j", "u")])]),
        ]),
    );
    ni.status = Some(status(&[(
        "nginx",
        vec![st("1", ImagePullPhase::Succeeded, 1, Some(5))],
    )]));
    let timeout = Duration::from_secs(60);
    assert_eq!(next_wake(&ni, at(10), timeout), Some(at(45)));
    ni.status = None;
    assert_eq!(next_wake(&ni, at(10), timeout), Some(at(60)));
    ni.spec = NodeImageSpec::default();
    assert_eq!(next_wake(&ni, at(10), timeout), None);
}

#[test]
fn counts() {
    let s = spec(&[
        ("a", vec![tag("1", 0, None, &[]), tag("2", 0, None, &[])]),
        ("b", vec![tag("1", 0, None, &[])]),
    ]);
    let statuses = status(&[
        (
            "a",
            vec![
                st("1", ImagePullPhase::Waiting, 0, None),
                st("2", ImagePullPhase::Pulling, 0, None),
            ],
        ),
        ("b", vec![st("1", ImagePullPhase::Failed, 0, None)]),
    ])
    .image_statuses;
    assert_eq!(
        count(&s, &statuses),
        Counts {
            desired: 3,
            pulling: 1,
            succeeded: 0,
            failed: 1
        }
    );
}

#[test]
fn an_image_that_lost_an_owner_is_recomputed_from_the_owners_left() {
    use crate::tag_values::OwnerAsk;
    use kruise_rs_api::common::{ImagePullPolicy, SandboxConfig};
    let label = |k: &str| SandboxConfig {
        labels: BTreeMap::from([(k.to_owned(), "x".to_owned())]),
        ..Default::default()
    };
    let ask = |timeout: i32, key: &str| OwnerAsk {
        pull_policy: ImageTagPullPolicy {
            timeout_seconds: Some(timeout),
            ..Default::default()
        },
        image_pull_policy: ImagePullPolicy::IfNotPresent,
        sandbox: label(key),
        pull_secrets: Vec::new(),
    };
    let mut shared = tag(
        "latest",
        1,
        Some(0),
        &[job("a", "uid-a"), job("b", "uid-b")],
    );
    shared.pull_policy = Some(ImageTagPullPolicy {
        timeout_seconds: Some(900),
        ..Default::default()
    });
    let mut both = label("a");
    both.labels.insert("b".into(), "x".into());
    shared.sandbox_config = Some(Box::new(both));
    let s = spec(&[("nginx", vec![shared])]);
    let asks = |o: &ObjectReference| match o.uid.as_deref() {
        Some("uid-a") => Some(ask(900, "a")),
        Some("uid-b") => Some(ask(100, "b")),
        _ => None,
    };
    // Nothing gone: the image is left exactly as it is, even where it differs from the asks.
    let out = collect(&s, &NodeImageStatus::default(), &gone(&[]), asks, at(0));
    assert_eq!(out.images, s.images);

    let out = collect(
        &s,
        &NodeImageStatus::default(),
        &gone(&["uid-a"]),
        asks,
        at(0),
    );
    let image = &out.images["nginx"];
    let tag = &image.tags[0];
    assert_eq!(tag.pull_policy.as_ref().unwrap().timeout_seconds, Some(100));
    assert_eq!(tag.sandbox_config, Some(Box::new(label("b"))));
    assert_eq!(image.sandbox_config, Some(Box::new(label("b"))));
    assert_eq!(tag.version, Some(1), "less asked: no new round");
}

#[test]
fn a_gone_owners_pull_secret_copy_is_collected_with_it() {
    use crate::compact_nodeimage::ReferenceObject;
    use crate::tag_values::OwnerAsk;
    let copy = |name: &str| ReferenceObject {
        namespace: Some("kruise-daemon-config".into()),
        name: Some(name.into()),
        mode: Some("batch".into()),
    };
    let holding = |secrets: &[&str]| OwnerAsk {
        pull_policy: ImageTagPullPolicy::default(),
        image_pull_policy: Default::default(),
        sandbox: Default::default(),
        pull_secrets: secrets.iter().map(|s| copy(s)).collect(),
    };
    let mut s = spec(&[(
        "reg/app",
        vec![
            tag("v1", 1, Some(0), &[job("a", "uid-a")]),
            tag("v2", 1, Some(0), &[job("b", "uid-b")]),
        ],
    )]);
    let image = s.images.get_mut("reg/app").unwrap();
    image.pull_secrets = vec![copy("a-copy"), copy("b-copy")];
    let asks = |o: &ObjectReference| match o.uid.as_deref() {
        Some("uid-b") => Some(holding(&["b-copy"])),
        _ => None,
    };
    let out = collect(
        &s,
        &NodeImageStatus::default(),
        &gone(&["uid-a"]),
        asks,
        at(0),
    );
    assert_eq!(out.images["reg/app"].pull_secrets, [copy("b-copy")]);
    assert_eq!(out.images["reg/app"].tags.len(), 1);
}
