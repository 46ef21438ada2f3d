use super::*;
use crate::apis::imagepulljob::{
    CompletionPolicy, ImagePullJobSpec, ImagePullJobTemplate, PullPolicy,
};
use crate::apis::nodeimage::{ImagePullPhase, ImageStatus, ImageTagStatus};
use k8s_openapi::jiff::Timestamp;

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

#[test]
fn a_new_tag_entry_has_owner_version_policy_and_creation_time() {
    let r = req("u1", Default::default(), None);
    let images = with_job_entry(&BTreeMap::new(), None, &r, "n1", &t(50), EXTRA).expect("changed");
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
    assert!(
        with_job_entry(&images, None, &r, "n1", &t(60), EXTRA).is_none(),
        "idempotent"
    );
}

#[test]
fn a_new_entry_continues_after_the_last_reported_round() {
    let status = NodeImageStatus {
        image_statuses: BTreeMap::from([(
            "nginx".to_owned(),
            ImageStatus {
                tags: vec![ImageTagStatus {
                    version: Some(4),
                    ..ImageTagStatus::new("1", ImagePullPhase::Succeeded)
                }],
            },
        )]),
        ..Default::default()
    };
    let images = with_job_entry(
        &BTreeMap::new(),
        Some(&status),
        &req("u1", Default::default(), None),
        "n",
        &t(1),
        EXTRA,
    )
    .unwrap();
    assert_eq!(images["nginx"].tags[0].version, Some(5));
}

#[test]
fn a_second_job_joins_the_tag_with_a_new_round_and_the_more_patient_policy() {
    let first = with_job_entry(
        &BTreeMap::new(),
        None,
        &req("u1", Default::default(), None),
        "n",
        &t(1),
        EXTRA,
    )
    .unwrap();
    let deadline = CompletionPolicy {
        active_deadline_seconds: Some(900),
        ttl_seconds_after_finished: Some(10),
        ..Default::default()
    };
    let both = with_job_entry(&first, None, &req("u2", deadline, None), "n", &t(2), EXTRA).unwrap();
    let tag = &both["nginx"].tags[0];
    assert_eq!(both["nginx"].tags.len(), 1);
    let owners: Vec<_> = tag
        .owner_references
        .iter()
        .map(|o| o.uid.as_deref().unwrap())
        .collect();
    assert_eq!(owners, ["u1", "u2"]);
    assert_eq!(tag.version, Some(1));
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
fn sandbox_config_merges_and_is_never_wiped() {
    let a = SandboxConfig {
        labels: BTreeMap::from([("app".to_owned(), "foo".to_owned())]),
        annotations: BTreeMap::from([(
            "io.kubernetes.image.metrics.tags".to_owned(),
            "app=foo".to_owned(),
        )]),
    };
    let first = with_job_entry(
        &BTreeMap::new(),
        None,
        &req("u1", Default::default(), Some(a.clone())),
        "n",
        &t(1),
        EXTRA,
    )
    .unwrap();
    let mut other = req("u2", Default::default(), None);
    other.tag = "2".into();
    let second = with_job_entry(&first, None, &other, "n", &t(2), EXTRA).unwrap();
    assert_eq!(
        second["nginx"].sandbox_config.as_ref(),
        Some(&a),
        "a job without sandboxConfig keeps the other's"
    );
    let b = SandboxConfig {
        labels: BTreeMap::from([("team".to_owned(), "x".to_owned())]),
        ..Default::default()
    };
    let mut third = req("u3", Default::default(), Some(b));
    third.tag = "3".into();
    let merged = with_job_entry(&second, None, &third, "n", &t(3), EXTRA).unwrap();
    let sc = merged["nginx"].sandbox_config.as_ref().unwrap();
    assert_eq!(sc.labels.len(), 2);
    assert_eq!(sc.annotations.len(), 1);
    let tags: Vec<_> = merged["nginx"]
        .tags
        .iter()
        .map(|t| t.tag.as_str())
        .collect();
    assert_eq!(tags, ["1", "2", "3"], "sorted by tag");
}

#[test]
fn pull_secrets_are_added_once() {
    let secret = ReferenceObject {
        namespace: Some("kruise-daemon-config".into()),
        name: Some("s".into()),
        mode: Some("batch".into()),
    };
    let mut r = req("u1", Default::default(), None);
    r.pull_secrets = vec![secret.clone(), secret.clone()];
    let images = with_job_entry(&BTreeMap::new(), None, &r, "n", &t(1), EXTRA).unwrap();
    assert_eq!(images["nginx"].pull_secrets, [secret]);
}

#[test]
fn tag_ttls_follow_upstreams_rules() {
    let always = tag_pull_policy(&req("u", Default::default(), None), "n", EXTRA);
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
    let p = tag_pull_policy(&req("u", with_ttl, None), "n", Duration::ZERO);
    assert!((1000..1300).contains(&p.ttl_seconds_after_finished.unwrap()));
    assert_eq!(p.active_deadline_seconds, Some(50));
    let never = CompletionPolicy {
        type_: Some(CompletionPolicyType::Never),
        ..Default::default()
    };
    let p = tag_pull_policy(&req("u", never, None), "n", EXTRA);
    assert!((86_400 - 600..86_400 + 600).contains(&p.ttl_seconds_after_finished.unwrap()));
    assert_eq!(p.active_deadline_seconds, Some(1800));
    let a = tag_pull_policy(&req("u", Default::default(), None), "node-a", EXTRA);
    assert_eq!(
        a,
        tag_pull_policy(&req("u", Default::default(), None), "node-a", EXTRA),
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
