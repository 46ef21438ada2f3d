use super::*;
use crate::compact_nodeimage::{
    ImagePullPhase, ImageStatus, ImageStatuses, ImageTagStatus, Images,
};
use k8s_openapi::jiff::Timestamp;
use kruise_rs_api::common::{ImagePullPolicy, SandboxConfig};
use kruise_rs_api::imagepulljob::{
    CompletionPolicy, ImagePullJobSpec, ImagePullJobTemplate, PullPolicy,
};

fn t(s: i64) -> Time {
    Time(Timestamp::from_second(s).unwrap())
}

fn job(uid: &str, policy: CompletionPolicy, sandbox: Option<SandboxConfig>) -> ImagePullJob {
    let mut j = ImagePullJob::new(
        &format!("job-{uid}"),
        ImagePullJobSpec {
            image: "nginx:1".into(),
            template: ImagePullJobTemplate {
                completion_policy: policy,
                sandbox_config: sandbox,
                pull_policy: Some(PullPolicy {
                    timeout_seconds: Some(100),
                    backoff_limit: Some(2),
                }),
                ..Default::default()
            },
        },
    );
    j.metadata.namespace = Some("ns".into());
    j.metadata.uid = Some(uid.into());
    j
}

fn req(uid: &str, policy: CompletionPolicy, sandbox: Option<SandboxConfig>) -> JobRequest {
    JobRequest::new(
        &job(uid, policy, sandbox),
        "nginx".into(),
        "1".into(),
        Vec::new(),
    )
}

const EXTRA: Duration = Duration::from_secs(300);

/// `with_job_entry` with `known` as the job store the other owners are looked up in.
fn entry(
    images: &Images,
    status: Option<&NodeImageStatus>,
    r: &JobRequest,
    known: &[&JobRequest],
    now: i64,
) -> Option<Images> {
    let others = |owner: &ObjectReference| {
        let uid = owner.uid.as_deref()?;
        let other = known.iter().find(|k| k.owner.uid.as_deref() == Some(uid))?;
        Some(other.terms.ask(uid, "n", EXTRA, other.pull_secrets.clone()))
    };
    with_job_entry(images, status, r, others, "n", &t(now), EXTRA)
}

#[test]
fn a_new_tag_entry_has_owner_version_policy_and_creation_time() {
    let r = req("u1", Default::default(), None);
    let images = entry(&Images::new(), None, &r, &[], 50).expect("changed");
    let tag = &images["nginx"].tags[0];
    assert_eq!(tag.tag, "1");
    assert_eq!(tag.version, Some(0));
    assert_eq!(tag.created_at, Some(t(50)));
    assert_eq!(tag.owner_references[0].uid.as_deref(), Some("u1"));
    assert_eq!(
        tag.owner_references[0].kind.as_deref(),
        Some("ImagePullJob")
    );
    assert_eq!(tag.image_pull_policy, Some(ImagePullPolicy::IfNotPresent));
    let p = tag.pull_policy.as_ref().unwrap();
    assert_eq!(
        (
            p.timeout_seconds,
            p.backoff_limit,
            p.active_deadline_seconds
        ),
        (Some(100), Some(2), None)
    );
    assert!(entry(&images, None, &r, &[], 60).is_none(), "idempotent");
}

#[test]
fn a_new_entry_continues_after_the_last_reported_round() {
    let status = NodeImageStatus {
        image_statuses: ImageStatuses::from([(
            "nginx".into(),
            ImageStatus {
                tags: vec![ImageTagStatus {
                    version: Some(4),
                    ..ImageTagStatus::new("1", ImagePullPhase::Succeeded)
                }],
            },
        )]),
        ..Default::default()
    };
    let r = req("u1", Default::default(), None);
    let images = entry(&Images::new(), Some(&status), &r, &[], 1).unwrap();
    assert_eq!(images["nginx"].tags[0].version, Some(5));
}

#[test]
fn a_second_job_joins_the_tag_with_a_new_round_and_the_more_patient_policy() {
    let u1 = req("u1", Default::default(), None);
    let first = entry(&Images::new(), None, &u1, &[], 1).unwrap();
    let deadline = CompletionPolicy {
        active_deadline_seconds: Some(900),
        ttl_seconds_after_finished: Some(10),
        ..Default::default()
    };
    let u2 = req("u2", deadline, None);
    let both = entry(&first, None, &u2, &[&u1], 2).unwrap();
    let tag = &both["nginx"].tags[0];
    assert_eq!(both["nginx"].tags.len(), 1);
    let owners: Vec<_> = tag
        .owner_references
        .iter()
        .map(|o| o.uid.as_deref().unwrap())
        .collect();
    assert_eq!(owners, ["u1", "u2"]);
    assert_eq!(tag.version, Some(1), "one new round, not two");
    assert_eq!(tag.created_at, Some(t(2)));
    let p = tag.pull_policy.as_ref().unwrap();
    assert_eq!(
        p.active_deadline_seconds, None,
        "the first job has no deadline"
    );
    assert!(
        p.ttl_seconds_after_finished.unwrap() >= 100 * 2 + 300,
        "the longer TTL stays"
    );
}

#[test]
fn an_unknown_owner_keeps_what_the_tag_holds_and_known_owners_add_to_it() {
    // u1 is not in the store (deleted, outside this manager's selector, not listed yet): it may
    // need what the tag holds, so the tag never shrinks without it; u2 and u3 still get theirs.
    let u1 = req("u1", Default::default(), Some(labels(&[("app", "one")])));
    let first = entry(&Images::new(), None, &u1, &[], 1).unwrap();
    let mut u2 = req("u2", Default::default(), None);
    u2.terms.timeout_seconds = 10;
    let both = entry(&first, None, &u2, &[], 2).unwrap();
    let tag = &both["nginx"].tags[0];
    assert_eq!(tag.owner_references.len(), 2);
    let timeout = |t: &ImageTagSpec| t.pull_policy.as_ref().unwrap().timeout_seconds;
    assert_eq!(timeout(tag), Some(100), "not shrunk to u2's");
    assert_eq!(
        tag.sandbox_config,
        Some(Box::new(labels(&[("app", "one")])))
    );

    let mut u3 = req("u3", Default::default(), Some(labels(&[("team", "three")])));
    u3.terms.timeout_seconds = 5000;
    u3.terms.image_pull_policy = ImagePullPolicy::Always;
    let three = entry(&both, None, &u3, &[&u2], 3).unwrap();
    let tag = &three["nginx"].tags[0];
    assert_eq!(timeout(tag), Some(5000));
    assert_eq!(tag.image_pull_policy, Some(ImagePullPolicy::Always));
    assert_eq!(
        tag.sandbox_config,
        Some(Box::new(labels(&[("app", "one"), ("team", "three")])))
    );
    assert_eq!(tag.version, Some(2), "one new round per joiner");
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

#[test]
fn sandbox_config_is_kept_per_tag_and_merged_per_image() {
    let a = SandboxConfig {
        annotations: std::collections::BTreeMap::from([(
            "io.kubernetes.image.metrics.tags".to_owned(),
            "app=foo".to_owned(),
        )]),
        ..labels(&[("app", "foo")])
    };
    let u1 = req("u1", Default::default(), Some(a.clone()));
    let first = entry(&Images::new(), None, &u1, &[], 1).unwrap();
    let mut u2 = req("u2", Default::default(), None);
    u2.tag = "2".into();
    let second = entry(&first, None, &u2, &[&u1], 2).unwrap();
    assert_eq!(second["nginx"].sandbox_config.as_deref(), Some(&a));
    let tag = |images: &Images, name: &str| {
        images["nginx"]
            .tags
            .iter()
            .find(|t| t.tag == name)
            .unwrap()
            .clone()
    };
    assert_eq!(tag(&second, "1").sandbox_config, Some(Box::new(a.clone())));
    assert_eq!(
        tag(&second, "2").sandbox_config,
        Some(Box::new(SandboxConfig::default())),
        "tag 2 is pulled with no metadata, not with tag 1's"
    );
    let mut u3 = req("u3", Default::default(), Some(labels(&[("team", "x")])));
    u3.tag = "3".into();
    let merged = entry(&second, None, &u3, &[&u1, &u2], 3).unwrap();
    let sc = merged["nginx"].sandbox_config.as_ref().unwrap();
    assert_eq!(sc.labels.len(), 2);
    assert_eq!(sc.annotations.len(), 1);
    assert_eq!(
        tag(&merged, "3").sandbox_config,
        Some(Box::new(labels(&[("team", "x")])))
    );
    let tags: Vec<_> = merged["nginx"]
        .tags
        .iter()
        .map(|t| t.tag.as_str())
        .collect();
    assert_eq!(tags, ["1", "2", "3"], "sorted by tag");
}

fn copy(name: &str) -> ReferenceObject {
    ReferenceObject {
        namespace: Some("kruise-daemon-config".into()),
        name: Some(name.into()),
        mode: Some("batch".into()),
    }
}

#[test]
fn pull_secrets_are_added_once() {
    let secret = copy("s");
    let mut r = req("u1", Default::default(), None);
    r.pull_secrets = vec![secret.clone(), secret.clone()];
    let images = entry(&Images::new(), None, &r, &[], 1).unwrap();
    assert_eq!(images["nginx"].pull_secrets, [secret]);
}

/// `req` for tag `tag` of nginx, holding `secrets`.
fn req_for_tag(uid: &str, tag: &str, secrets: &[ReferenceObject]) -> JobRequest {
    JobRequest::new(
        &job(uid, Default::default(), None),
        "nginx".into(),
        tag.into(),
        secrets.to_vec(),
    )
}

#[test]
fn a_copy_no_owner_holds_any_more_leaves_the_image_with_the_next_write() {
    // u1 pulled tag 1 with its copy, then finished and released it (the store's ask holds no
    // secrets); u2 now asks for tag 2 of the same image without any: u1's copy goes (#2235).
    let u1 = req_for_tag("u1", "1", &[copy("a-secret")]);
    let first = entry(&Images::new(), None, &u1, &[], 1).unwrap();
    assert_eq!(first["nginx"].pull_secrets, [copy("a-secret")]);
    let u1_finished = req_for_tag("u1", "1", &[]);
    let u2 = req_for_tag("u2", "2", &[]);
    let both = entry(&first, None, &u2, &[&u1_finished], 2).unwrap();
    assert!(both["nginx"].pull_secrets.is_empty(), "{both:?}");
}

#[test]
fn every_running_owners_copies_stay_and_a_joiner_adds_its_own() {
    let u1 = req_for_tag("u1", "1", &[copy("a-secret")]);
    let first = entry(&Images::new(), None, &u1, &[], 1).unwrap();
    let u2 = req_for_tag("u2", "2", &[copy("b-secret"), copy("a-secret")]);
    let both = entry(&first, None, &u2, &[&u1], 2).unwrap();
    assert_eq!(
        both["nginx"].pull_secrets,
        [copy("a-secret"), copy("b-secret")],
        "the ones listed before first, each once"
    );
}

#[test]
fn a_copy_of_an_owner_not_in_the_store_stays() {
    // u1 is unknown (not listed yet, outside the selector): what it may hold is kept.
    let u1 = req_for_tag("u1", "1", &[copy("a-secret")]);
    let first = entry(&Images::new(), None, &u1, &[], 1).unwrap();
    let u2 = req_for_tag("u2", "2", &[]);
    let both = entry(&first, None, &u2, &[], 2).unwrap();
    assert_eq!(both["nginx"].pull_secrets, [copy("a-secret")]);
}

/// A status reporting tag "1" of nginx at `version` in `phase`.
fn reported(version: i64, phase: ImagePullPhase) -> NodeImageStatus {
    let done = matches!(phase, ImagePullPhase::Succeeded | ImagePullPhase::Failed);
    NodeImageStatus {
        image_statuses: ImageStatuses::from([(
            "nginx".into(),
            ImageStatus {
                tags: vec![ImageTagStatus {
                    version: Some(version),
                    completion_time: done.then(|| t(5)),
                    ..ImageTagStatus::new("1", phase)
                }],
            },
        )]),
        ..Default::default()
    }
}

#[test]
fn an_edit_reaches_a_node_already_pulling_and_restarts_it_when_it_asks_for_more() {
    let u1 = req("u1", Default::default(), None);
    let first = entry(&Images::new(), None, &u1, &[], 1).unwrap();
    let pulling = reported(0, ImagePullPhase::Pulling);
    let mut edited = u1.clone();
    edited.terms.timeout_seconds = 1200;
    let out = entry(&first, Some(&pulling), &edited, &[], 2).expect("changed");
    let tag = &out["nginx"].tags[0];
    assert_eq!(
        tag.pull_policy.as_ref().unwrap().timeout_seconds,
        Some(1200)
    );
    assert_eq!(
        tag.version,
        Some(1),
        "the pull restarts with the longer timeout"
    );
    assert_eq!(tag.created_at, Some(t(1)), "still the same request");
    assert!(
        entry(&out, Some(&pulling), &edited, &[], 3).is_none(),
        "idempotent"
    );

    // Less patience applies to the next round: the pull in flight goes on.
    let mut shorter = u1.clone();
    shorter.terms.timeout_seconds = 30;
    let out = entry(&first, Some(&pulling), &shorter, &[], 2).expect("changed");
    let tag = &out["nginx"].tags[0];
    assert_eq!(tag.pull_policy.as_ref().unwrap().timeout_seconds, Some(30));
    assert_eq!(tag.version, Some(0));

    // A new sandbox label reaches CRI only through a new pull.
    let labelled = req("u1", Default::default(), Some(labels(&[("app", "web")])));
    let out = entry(&first, Some(&pulling), &labelled, &[], 2).expect("changed");
    assert_eq!(out["nginx"].tags[0].version, Some(1));
    assert_eq!(
        out["nginx"].sandbox_config,
        Some(Box::new(labels(&[("app", "web")])))
    );

    // Only the TTL: the manager's business, no restart.
    let mut ttl = u1.clone();
    ttl.terms.ttl_seconds_after_finished = Some(5000);
    let out = entry(&first, Some(&pulling), &ttl, &[], 2).expect("changed");
    assert_eq!(out["nginx"].tags[0].version, Some(0));
}

#[test]
fn an_edit_never_restarts_a_finished_round() {
    let u1 = req("u1", Default::default(), None);
    let first = entry(&Images::new(), None, &u1, &[], 1).unwrap();
    let mut edited = u1.clone();
    edited.terms.timeout_seconds = 1200;
    edited.terms.image_pull_policy = ImagePullPolicy::Always;
    for phase in [ImagePullPhase::Succeeded, ImagePullPhase::Failed] {
        let done = reported(0, phase);
        let out = entry(&first, Some(&done), &edited, &[], 2).expect("changed");
        let tag = &out["nginx"].tags[0];
        assert_eq!(
            tag.pull_policy.as_ref().unwrap().timeout_seconds,
            Some(1200)
        );
        assert_eq!(tag.image_pull_policy, Some(ImagePullPolicy::Always));
        assert_eq!(tag.version, Some(0), "{phase:?} stands");
    }
    // A status of an older round does not count as this round's end.
    let old = reported(-1, ImagePullPhase::Succeeded);
    let out = entry(&first, Some(&old), &edited, &[], 2).expect("changed");
    assert_eq!(out["nginx"].tags[0].version, Some(1));
}

#[test]
fn always_wins_and_the_values_shrink_back_with_the_owners() {
    let u1 = req("u1", Default::default(), None);
    let mut u2 = req("u2", Default::default(), None);
    u2.terms.image_pull_policy = ImagePullPolicy::Always;
    u2.terms.timeout_seconds = 900;
    let first = entry(&Images::new(), None, &u1, &[], 1).unwrap();
    let both = entry(&first, None, &u2, &[&u1], 2).unwrap();
    let tag = &both["nginx"].tags[0];
    assert_eq!(tag.image_pull_policy, Some(ImagePullPolicy::Always));
    assert_eq!(tag.pull_policy.as_ref().unwrap().timeout_seconds, Some(900));
    // u2 edited back to u1's terms: the tag follows, since it is recomputed, not accumulated.
    let mut calmer = u2.clone();
    calmer.terms = u1.terms.clone();
    let out = entry(&both, None, &calmer, &[&u1], 3).expect("changed");
    let tag = &out["nginx"].tags[0];
    assert_eq!(tag.image_pull_policy, Some(ImagePullPolicy::IfNotPresent));
    assert_eq!(tag.pull_policy.as_ref().unwrap().timeout_seconds, Some(100));
}
