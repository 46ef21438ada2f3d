use super::*;
use crate::compact_nodeimage::ImagePullPhase;
use kruise_rs_api::imagepulljob::{CompletionPolicy, PullPolicy};

const EXTRA: Duration = Duration::from_secs(300);

fn terms(completion: CompletionPolicy) -> PullTerms {
    PullTerms::of(&ImagePullJobTemplate {
        completion_policy: completion,
        pull_policy: Some(PullPolicy {
            timeout_seconds: Some(100),
            backoff_limit: Some(2),
        }),
        ..Default::default()
    })
}

fn labels(pairs: &[(&str, &str)]) -> SandboxConfig {
    SandboxConfig {
        labels: pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Default::default()
    }
}

fn ask(timeout: i32, always: bool, sandbox: SandboxConfig) -> OwnerAsk {
    OwnerAsk {
        pull_policy: ImageTagPullPolicy {
            timeout_seconds: Some(timeout),
            backoff_limit: Some(3),
            ttl_seconds_after_finished: Some(600),
            active_deadline_seconds: None,
        },
        image_pull_policy: if always {
            ImagePullPolicy::Always
        } else {
            ImagePullPolicy::IfNotPresent
        },
        sandbox,
        pull_secrets: Vec::new(),
    }
}

fn owner(uid: &str) -> ObjectReference {
    ObjectReference {
        kind: Some("ImagePullJob".into()),
        uid: Some(uid.into()),
        ..Default::default()
    }
}

fn tag(name: &str, owners: &[&str]) -> ImageTagSpec {
    ImageTagSpec {
        tag: name.into(),
        owner_references: owners.iter().map(|u| owner(u).into()).collect(),
        version: Some(0),
        ..Default::default()
    }
}

#[test]
fn tag_ttls_follow_upstreams_rules() {
    let always = tag_pull_policy(&terms(Default::default()), "u", "n", EXTRA);
    let ttl = i64::from(always.ttl_seconds_after_finished.unwrap());
    assert!(
        (200 + 300..200 + 600).contains(&ttl),
        "timeout x backoff + extra + jitter: {ttl}"
    );
    let with_ttl = CompletionPolicy {
        ttl_seconds_after_finished: Some(1000),
        active_deadline_seconds: Some(50),
        ..Default::default()
    };
    let p = tag_pull_policy(&terms(with_ttl), "u", "n", Duration::ZERO);
    assert!((1000..1300).contains(&p.ttl_seconds_after_finished.unwrap()));
    assert_eq!(p.active_deadline_seconds, Some(50));
    let never = CompletionPolicy {
        type_: Some(CompletionPolicyType::Never),
        ..Default::default()
    };
    let p = tag_pull_policy(&terms(never), "u", "n", EXTRA);
    assert!((86_400 - 600..86_400 + 600).contains(&p.ttl_seconds_after_finished.unwrap()));
    assert_eq!(p.active_deadline_seconds, Some(1800));
    let a = tag_pull_policy(&terms(Default::default()), "u", "node-a", EXTRA);
    assert_eq!(
        a,
        tag_pull_policy(&terms(Default::default()), "u", "node-a", EXTRA),
        "stable per node"
    );
}

#[test]
fn jitter_is_pinned_across_builds() {
    // Written into NodeImages: a new toolchain must not change it (golden values from
    // `printf 'uid-1\0node-a' | sha256sum`, first 8 bytes big-endian, modulo the range).
    assert_eq!(jitter("uid-1", "node-a", 300), 12);
    assert_eq!(jitter("uid-1", "node-a", 1200), 612);
    assert_eq!(
        jitter("uid-1", "node-a", 0),
        0,
        "an empty range gives no spread"
    );
    assert_ne!(
        jitter("uid-1", "node-a", 1200),
        jitter("uid-1", "node-b", 1200)
    );
}

#[test]
fn terms_default_like_upstream() {
    let t = PullTerms::of(&ImagePullJobTemplate::default());
    assert_eq!(
        (t.timeout_seconds, t.backoff_limit, t.image_pull_policy),
        (600, 3, ImagePullPolicy::IfNotPresent)
    );
    assert_eq!(t.completion, CompletionPolicyType::Always);
}

#[test]
fn merge_keeps_the_most_patient_always_and_every_label_later_owner_winning() {
    assert_eq!(merge([]), None);
    let a = ask(100, false, labels(&[("app", "a"), ("team", "x")]));
    let b = ask(300, true, labels(&[("app", "b")]));
    let m = merge([&a, &b]).unwrap();
    assert_eq!(m.pull_policy.timeout_seconds, Some(300));
    assert_eq!(m.image_pull_policy, ImagePullPolicy::Always);
    assert_eq!(m.sandbox, labels(&[("app", "b"), ("team", "x")]));
    let m = merge([&b, &a]).unwrap();
    assert_eq!(m.sandbox.labels["app"], "a", "the later owner wins a key");
}

#[test]
fn most_patient_drops_a_deadline_only_one_side_has() {
    let with = ImageTagPullPolicy {
        active_deadline_seconds: Some(10),
        ..Default::default()
    };
    let other = ImageTagPullPolicy {
        active_deadline_seconds: Some(20),
        ..Default::default()
    };
    assert_eq!(
        most_patient(&with, &ImageTagPullPolicy::default()).active_deadline_seconds,
        None
    );
    assert_eq!(
        most_patient(&with, &other).active_deadline_seconds,
        Some(20)
    );
}

#[test]
fn restarts_only_for_more() {
    let base = ask(100, false, labels(&[("app", "a")]));
    let mut old = tag("1", &["u"]);
    old.pull_policy = Some(base.pull_policy.clone());
    old.image_pull_policy = Some(ImagePullPolicy::IfNotPresent);
    old.sandbox_config = Some(Box::new(base.sandbox.clone()));
    let values = |a: &OwnerAsk| merge([a]).unwrap();

    assert!(!must_restart(&old, None, &values(&base)), "nothing new");
    assert!(must_restart(
        &old,
        None,
        &values(&ask(200, false, base.sandbox.clone()))
    ));
    assert!(!must_restart(
        &old,
        None,
        &values(&ask(50, false, base.sandbox.clone()))
    ));
    assert!(must_restart(
        &old,
        None,
        &values(&ask(100, true, base.sandbox.clone()))
    ));
    assert!(must_restart(
        &old,
        None,
        &values(&ask(100, false, labels(&[("app", "b")])))
    ));
    assert!(
        !must_restart(
            &old,
            None,
            &values(&ask(100, false, SandboxConfig::default()))
        ),
        "fewer labels: the pull carries extra ones, harmless"
    );
    let mut more_tries = base.clone();
    more_tries.pull_policy.backoff_limit = Some(9);
    assert!(must_restart(&old, None, &values(&more_tries)));
    let mut ttl = base.clone();
    ttl.pull_policy.ttl_seconds_after_finished = Some(1);
    assert!(!must_restart(&old, None, &values(&ttl)), "the TTL never");

    // Deadlines: a later one, or none, is more.
    let mut bounded = old.clone();
    bounded
        .pull_policy
        .as_mut()
        .unwrap()
        .active_deadline_seconds = Some(100);
    assert!(
        must_restart(&bounded, None, &values(&base)),
        "no deadline now"
    );
    let mut later = base.clone();
    later.pull_policy.active_deadline_seconds = Some(200);
    assert!(must_restart(&bounded, None, &values(&later)));
    later.pull_policy.active_deadline_seconds = Some(50);
    assert!(!must_restart(&bounded, None, &values(&later)));

    // A tag without its own metadata was pulled with the image's.
    let mut legacy = old.clone();
    legacy.sandbox_config = None;
    let image_level = labels(&[("app", "a")]);
    assert!(!must_restart(&legacy, Some(&image_level), &values(&base)));
    assert!(must_restart(&legacy, None, &values(&base)));
}

#[test]
fn refresh_recomputes_known_tags_and_merges_the_image_sandbox() {
    let image = ImageSpec {
        tags: vec![tag("1", &["a"]), tag("2", &["b", "c"])],
        sandbox_config: Some(Box::new(labels(&[("stale", "x")]))),
        ..Default::default()
    };
    let asks = |o: &ObjectReference| match o.uid.as_deref() {
        Some("a") => Some(ask(100, false, labels(&[("app", "a")]))),
        Some("b") => Some(ask(200, false, labels(&[("team", "b")]))),
        Some("c") => Some(ask(50, true, SandboxConfig::default())),
        _ => None,
    };
    let out = refresh_image(&image, asks, |_| false);
    assert_eq!(
        out.tags[0].sandbox_config,
        Some(Box::new(labels(&[("app", "a")])))
    );
    assert_eq!(
        out.tags[1].pull_policy.as_ref().unwrap().timeout_seconds,
        Some(200)
    );
    assert_eq!(out.tags[1].image_pull_policy, Some(ImagePullPolicy::Always));
    assert_eq!(
        out.sandbox_config,
        Some(Box::new(labels(&[("app", "a"), ("team", "b")]))),
        "every tag recomputed: the stale key goes"
    );
    assert_eq!(
        (out.tags[0].version, out.tags[1].version),
        (Some(0), Some(0)),
        "nothing in flight"
    );
    let again = refresh_image(&out, asks, |_| true);
    assert_eq!(again, out, "a fixed point");

    // In flight, the tag that now asks for more restarts; the other does not.
    let in_flight = refresh_image(&image, asks, |_| true);
    assert_eq!(
        (in_flight.tags[0].version, in_flight.tags[1].version),
        (Some(1), Some(1)),
        "both tags gained labels they were not pulled with"
    );
}

#[test]
fn refresh_leaves_a_tag_with_an_unknown_owner_and_its_image_metadata() {
    let mut legacy = tag("1", &["gone"]);
    legacy.pull_policy = Some(ImageTagPullPolicy {
        timeout_seconds: Some(999),
        ..Default::default()
    });
    let image = ImageSpec {
        tags: vec![legacy.clone(), tag("2", &["b"])],
        // Written by a manager that kept metadata per image only: it may be tag 1's.
        sandbox_config: Some(Box::new(labels(&[("old", "x")]))),
        ..Default::default()
    };
    let asks = |o: &ObjectReference| {
        (o.uid.as_deref() == Some("b")).then(|| ask(100, false, labels(&[("team", "b")])))
    };
    let out = refresh_image(&image, asks, |_| true);
    assert_eq!(out.tags[0], legacy, "left alone");
    assert_eq!(
        out.sandbox_config,
        Some(Box::new(labels(&[("old", "x"), ("team", "b")])))
    );
}

#[test]
fn in_flight_until_the_node_reports_this_round_finished() {
    let status = |version: i64, done: bool| NodeImageStatus {
        image_statuses: crate::compact_nodeimage::ImageStatuses::from([(
            "nginx".into(),
            crate::compact_nodeimage::ImageStatus {
                tags: vec![ImageTagStatus {
                    version: Some(version),
                    completion_time: done.then_some(
                        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                        ),
                    ),
                    ..ImageTagStatus::new("1", ImagePullPhase::Succeeded)
                }],
            },
        )]),
        ..Default::default()
    };
    let mut t = tag("1", &["u"]);
    t.version = Some(2);
    assert!(in_flight(None, "nginx", &t), "not reported yet");
    assert!(in_flight(Some(&status(2, false)), "nginx", &t));
    assert!(!in_flight(Some(&status(2, true)), "nginx", &t));
    assert!(
        in_flight(Some(&status(1, true)), "nginx", &t),
        "an older round"
    );
    assert!(in_flight(Some(&status(2, true)), "other", &t));
}

#[test]
fn an_unknown_owner_never_lets_a_tag_shrink_but_known_asks_add() {
    let mut shared = tag("1", &["gone", "b"]);
    shared.pull_policy = Some(ImageTagPullPolicy {
        timeout_seconds: Some(999),
        ..Default::default()
    });
    shared.image_pull_policy = Some(ImagePullPolicy::IfNotPresent);
    let image = ImageSpec {
        tags: vec![shared],
        sandbox_config: Some(Box::new(labels(&[("old", "x")]))),
        ..Default::default()
    };
    let asks = |o: &ObjectReference| {
        (o.uid.as_deref() == Some("b")).then(|| ask(100, true, labels(&[("team", "b")])))
    };
    let out = refresh_image(&image, asks, |_| true);
    let tag = &out.tags[0];
    assert_eq!(
        tag.pull_policy.as_ref().unwrap().timeout_seconds,
        Some(999),
        "kept"
    );
    assert_eq!(
        tag.image_pull_policy,
        Some(ImagePullPolicy::Always),
        "added"
    );
    assert_eq!(
        tag.sandbox_config,
        Some(Box::new(labels(&[("old", "x"), ("team", "b")]))),
        "what it was pulled with, plus b's"
    );
    assert_eq!(tag.version, Some(1), "in flight, asked for more");
    assert_eq!(refresh_image(&out, asks, |_| true), out, "a fixed point");
}

#[test]
fn terms_stored_past_the_bounds_make_tags_the_nodeimage_schema_accepts() {
    for (timeout, backoff, deadline, ttl) in [
        (i32::MAX, i32::MAX, i64::MAX, i32::MAX),
        (i32::MIN, i32::MIN, i64::MIN, i32::MIN),
        (0, -1, 0, -1),
    ] {
        for completion in [CompletionPolicyType::Always, CompletionPolicyType::Never] {
            let t = PullTerms::of(&ImagePullJobTemplate {
                pull_policy: Some(PullPolicy {
                    timeout_seconds: Some(timeout),
                    backoff_limit: Some(backoff),
                }),
                completion_policy: CompletionPolicy {
                    type_: Some(completion),
                    active_deadline_seconds: Some(deadline),
                    ttl_seconds_after_finished: Some(ttl),
                },
                ..Default::default()
            });
            let policy = tag_pull_policy(&t, "u", "n", Duration::MAX);
            let tag: kruise_rs_api::nodeimage::ImageTagSpec =
                serde_json::from_value(serde_json::json!({
                    "tag": "v1", "createdAt": "2026-01-01T00:00:00Z", "pullPolicy": policy,
                }))
                .unwrap();
            let mut node = kruise_rs_api::nodeimage::NodeImage::new("n", Default::default());
            node.spec.images.insert(
                "nginx".into(),
                kruise_rs_api::nodeimage::ImageSpec {
                    tags: vec![tag],
                    ..Default::default()
                },
            );
            assert_eq!(
                kruise_rs_api::validation::nodeimage::validate_create(&node),
                Ok(()),
                "{timeout} {backoff} {deadline} {ttl} {completion:?}: {policy:?}"
            );
        }
    }
    // A negative backoffLimit reads as upstream reads it.
    let t = PullTerms::of(&ImagePullJobTemplate {
        pull_policy: Some(PullPolicy {
            timeout_seconds: Some(0),
            backoff_limit: Some(-1),
        }),
        ..Default::default()
    });
    assert_eq!((t.timeout_seconds, t.backoff_limit), (600, 3));
}

fn running_job(namespace: &str, secrets: &[&str]) -> ImagePullJob {
    let mut job = ImagePullJob::new(
        "job",
        kruise_rs_api::imagepulljob::ImagePullJobSpec {
            image: "nginx:1".into(),
            template: ImagePullJobTemplate {
                pull_secrets: secrets.iter().map(|s| (*s).to_owned()).collect(),
                ..Default::default()
            },
        },
    );
    job.metadata.namespace = Some(namespace.into());
    job
}

#[test]
fn a_running_job_holds_a_copy_per_pull_secret_named_as_the_copies_are() {
    use crate::imagepulljob::secrets::{copy_name, reference_object};
    let held = held_pull_secrets(&running_job("team-a", &["reg", "other"]), "daemons");
    assert_eq!(
        held,
        [
            reference_object("daemons", &copy_name("team-a", "reg")),
            reference_object("daemons", &copy_name("team-a", "other")),
        ]
    );
}

#[test]
fn a_job_in_the_daemons_namespace_holds_its_own_secrets() {
    let held = held_pull_secrets(&running_job("daemons", &["reg"]), "daemons");
    assert_eq!(
        held,
        [ReferenceObject {
            namespace: Some("daemons".into()),
            name: Some("reg".into()),
            mode: None,
        }]
    );
}

#[test]
fn a_finished_or_deleted_job_holds_no_copies() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    let mut finished = running_job("team-a", &["reg"]);
    finished.status = Some(kruise_rs_api::imagepulljob::ImagePullJobStatus {
        completion_time: Some(Time(Timestamp::UNIX_EPOCH)),
        ..Default::default()
    });
    assert!(held_pull_secrets(&finished, "daemons").is_empty());
    let mut deleting = running_job("team-a", &["reg"]);
    deleting.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    assert!(held_pull_secrets(&deleting, "daemons").is_empty());
}

fn secret_ref(name: &str) -> ReferenceObject {
    ReferenceObject {
        namespace: Some("daemons".into()),
        name: Some(name.into()),
        mode: Some("batch".into()),
    }
}

fn holding(secrets: &[&str]) -> OwnerAsk {
    OwnerAsk {
        pull_secrets: secrets.iter().map(|s| secret_ref(s)).collect(),
        ..ask(100, false, SandboxConfig::default())
    }
}

#[test]
fn the_image_lists_the_secrets_its_owners_hold_now() {
    let image = ImageSpec {
        pull_secrets: vec![secret_ref("gone"), secret_ref("b"), secret_ref("a")],
        tags: vec![tag("1", &["u1"]), tag("2", &["u2", "u3"])],
        ..Default::default()
    };
    let asks = |o: &ObjectReference| match o.uid.as_deref() {
        Some("u1") => Some(holding(&["a", "c"])),
        Some("u2") => Some(holding(&[])),
        Some("u3") => Some(holding(&["b"])),
        _ => None,
    };
    let out = refresh_image(&image, asks, |_| false);
    assert_eq!(
        out.pull_secrets,
        [secret_ref("b"), secret_ref("a"), secret_ref("c")],
        "kept in their order, new ones after, the one nobody holds gone"
    );
    assert_eq!(refresh_image(&out, asks, |_| false), out, "a fixed point");
}

#[test]
fn while_an_owner_is_unknown_no_listed_secret_goes() {
    let image = ImageSpec {
        pull_secrets: vec![secret_ref("maybe-u9s")],
        tags: vec![tag("1", &["u1"]), tag("2", &["u9"])],
        ..Default::default()
    };
    let asks = |o: &ObjectReference| (o.uid.as_deref() == Some("u1")).then(|| holding(&["a"]));
    let out = refresh_image(&image, asks, |_| false);
    assert_eq!(out.pull_secrets, [secret_ref("maybe-u9s"), secret_ref("a")]);
}

#[test]
fn a_tag_nobody_owns_keeps_the_secrets_listed_for_it() {
    // Written by hand with its Secret; a job then adds tag 2 of the same image without one.
    let image = ImageSpec {
        pull_secrets: vec![secret_ref("admins")],
        tags: vec![tag("1", &[]), tag("2", &["u1"])],
        ..Default::default()
    };
    let asks = |o: &ObjectReference| (o.uid.as_deref() == Some("u1")).then(|| holding(&[]));
    let out = refresh_image(&image, asks, |_| false);
    assert_eq!(out.pull_secrets, [secret_ref("admins")]);
}
