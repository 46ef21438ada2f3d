use std::collections::BTreeMap;

use serde_json::json;

use super::*;
use kruise_rs_api::imagepulljob::ImagePullJobSpec;
use kruise_rs_api::nodeimage::NodeImage;

/// Image name → [(tag, version)].
type Spec<'a> = &'a [(&'a str, &'a [(&'a str, i64)])];
/// Image name → [(tag, version, phase)].
type Reported<'a> = &'a [(&'a str, &'a [(&'a str, i64, &'a str)])];

/// A NodeImage with `spec` and `reported`.
fn nodeimage(spec: Spec, reported: Reported) -> LeanNodeImage {
    let images: serde_json::Map<String, serde_json::Value> = spec
        .iter()
        .map(|(name, tags)| {
            let tags: Vec<_> = tags
                .iter()
                .map(|(t, v)| json!({"tag": t, "version": v}))
                .collect();
            (name.to_string(), json!({"tags": tags}))
        })
        .collect();
    let statuses: serde_json::Map<String, serde_json::Value> = reported
        .iter()
        .map(|(name, tags)| {
            let tags: Vec<_> = tags
                .iter()
                .map(|(t, v, p)| json!({"tag": t, "version": v, "phase": p}))
                .collect();
            (name.to_string(), json!({"tags": tags}))
        })
        .collect();
    let n: NodeImage = serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "NodeImage",
        "metadata": {"name": "n"},
        "spec": {"images": images},
        "status": {"desired": 0, "imageStatuses": statuses}
    }))
    .expect("a NodeImage");
    n.into()
}

fn job(annotation: Option<&str>) -> ImagePullJob {
    let mut j = ImagePullJob::new(
        "j",
        ImagePullJobSpec {
            image: "nginx".into(),
            template: Default::default(),
        },
    );
    j.metadata.annotations =
        annotation.map(|v| BTreeMap::from([(MAX_PULLS_PER_REGISTRY.to_owned(), v.to_owned())]));
    j
}

#[test]
fn unfinished_entries_of_the_hosts_images_count_whoever_wrote_them() {
    let nodes = [
        // Written, not reported; Pulling; Waiting: three in flight on 127.0.0.1:5000.
        nodeimage(
            &[
                ("127.0.0.1:5000/a", &[("v1", 1), ("v2", 1)]),
                ("127.0.0.1:5000/b", &[("v1", 1)]),
            ],
            &[
                ("127.0.0.1:5000/a", &[("v2", 1, "Pulling")]),
                ("127.0.0.1:5000/b", &[("v1", 1, "Waiting")]),
            ],
        ),
        // Finished (either way) for the version asked: not in flight.
        nodeimage(
            &[("127.0.0.1:5000/a", &[("v1", 1), ("v2", 1)])],
            &[(
                "127.0.0.1:5000/a",
                &[("v1", 1, "Succeeded"), ("v2", 1, "Failed")],
            )],
        ),
        // Succeeded for an older version: the new one is in flight.
        nodeimage(
            &[("127.0.0.1:5000/a", &[("v1", 2)])],
            &[("127.0.0.1:5000/a", &[("v1", 1, "Succeeded")])],
        ),
        // Other hosts (docker.io for a familiar name, another port).
        nodeimage(
            &[("nginx", &[("1", 1)]), ("127.0.0.1:5001/a", &[("v1", 1)])],
            &[],
        ),
    ];
    assert_eq!(in_flight(&nodes, "127.0.0.1:5000"), 4);
    assert_eq!(in_flight(&nodes, "docker.io"), 1);
    assert_eq!(in_flight(&nodes, "127.0.0.1:5001"), 1);
    assert_eq!(in_flight(&nodes, "ghcr.io"), 0);
}

#[test]
fn a_job_starts_within_its_parallelism_and_the_hosts_room() {
    assert_eq!(starts_allowed(5, None, 100), 5, "no budget");
    assert_eq!(starts_allowed(5, Some(10), 7), 3);
    assert_eq!(starts_allowed(2, Some(10), 7), 2);
    assert_eq!(starts_allowed(5, Some(10), 10), 0, "full");
    assert_eq!(
        starts_allowed(5, Some(10), 12),
        0,
        "over (others wrote meanwhile)"
    );
}

#[test]
fn the_budget_is_the_flags_lowered_by_the_jobs_annotation() {
    assert_eq!(budget_for(&job(None), 0), Ok(None));
    assert_eq!(budget_for(&job(None), 8), Ok(Some(8)));
    assert_eq!(budget_for(&job(Some("3")), 8), Ok(Some(3)));
    assert_eq!(
        budget_for(&job(Some("20")), 8),
        Ok(Some(8)),
        "a job cannot raise it"
    );
    assert_eq!(budget_for(&job(Some(" 4 ")), 0), Ok(Some(4)));
    for bad in ["0", "-1", "two", "", "1.5"] {
        let err = budget_for(&job(Some(bad)), 8).unwrap_err();
        assert!(
            err.contains(MAX_PULLS_PER_REGISTRY) && err.contains("positive integer"),
            "{err}"
        );
    }
}

#[tokio::test]
async fn the_jobs_of_one_host_take_turns_and_other_hosts_do_not_wait() {
    let locks = HostLocks::default();
    let held = locks.lock("r:5000").await;
    // Another host: at once.
    let other = tokio::time::timeout(Duration::from_secs(1), locks.lock("r:5001")).await;
    assert!(other.is_ok(), "another host's lock is free");
    // The same host: not while held.
    let same = tokio::time::timeout(Duration::from_millis(50), locks.lock("r:5000")).await;
    assert!(same.is_err(), "the same host waits");
    drop(held);
    let again = tokio::time::timeout(Duration::from_secs(1), locks.lock("r:5000")).await;
    assert!(again.is_ok(), "free once released");
}
