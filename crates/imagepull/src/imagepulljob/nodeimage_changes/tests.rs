use kruise_rs_api::nodeimage::NodeImage;
use serde_json::{Value, json};

use super::*;

/// A NodeImage `name` with `labels`, the tags `tags` (image, tag, owner UIDs) in its spec and
/// the reports `reported` (image, tag, phase) in its status.
fn nodeimage(
    name: &str,
    labels: Value,
    tags: &[(&str, &str, &[&str])],
    reported: &[(&str, &str, &str)],
) -> LeanNodeImage {
    let mut images = serde_json::Map::new();
    for (image, tag, owners) in tags {
        let owners: Vec<Value> = owners
            .iter()
            .map(|uid| json!({"apiVersion": "apps.kruise.io/v1beta1", "kind": "ImagePullJob", "name": uid, "uid": uid}))
            .collect();
        let entry = images
            .entry(image.to_string())
            .or_insert_with(|| json!({"tags": []}));
        entry["tags"]
            .as_array_mut()
            .unwrap()
            .push(json!({"tag": tag, "version": 0, "ownerReferences": owners}));
    }
    let mut statuses = serde_json::Map::new();
    for (image, tag, phase) in reported {
        let entry = statuses
            .entry(image.to_string())
            .or_insert_with(|| json!({"tags": []}));
        entry["tags"]
            .as_array_mut()
            .unwrap()
            .push(json!({"tag": tag, "phase": phase, "version": 0}));
    }
    let full: NodeImage = serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "NodeImage",
        "metadata": {"name": name, "labels": labels},
        "spec": {"images": images},
        "status": {"imageStatuses": statuses},
    }))
    .unwrap();
    full.into()
}

fn apply(ni: LeanNodeImage) -> watcher::Event<LeanNodeImage> {
    watcher::Event::Apply(ni)
}

fn owners(change: &Change) -> Vec<&str> {
    change.owners.iter().map(String::as_str).collect()
}

const TWO_JOBS: &[(&str, &str, &[&str])] = &[
    ("nginx", "1.27", &["job-a"]),
    ("redis", "7", &["job-b"]),
    ("envoy", "1", &["job-a", "job-b"]),
];

#[test]
fn a_new_node_wakes_its_owners_and_the_jobs_that_may_target_it() {
    let mut changes = NodeImageChanges::default();
    let change = changes.observe(&apply(nodeimage("n1", json!({}), TWO_JOBS, &[])));
    assert!(change.node);
    assert_eq!(owners(&change), ["job-a", "job-b"]);
}

#[test]
fn a_report_on_one_jobs_tag_wakes_that_job_alone() {
    let mut changes = NodeImageChanges::default();
    changes.observe(&apply(nodeimage("n1", json!({}), TWO_JOBS, &[])));
    let change = changes.observe(&apply(nodeimage(
        "n1",
        json!({}),
        TWO_JOBS,
        &[("nginx", "1.27", "Pulling")],
    )));
    assert_eq!(
        change,
        Change {
            owners: vec!["job-a".into()],
            node: false
        }
    );
    // A tag two jobs own wakes both.
    let change = changes.observe(&apply(nodeimage(
        "n1",
        json!({}),
        TWO_JOBS,
        &[("nginx", "1.27", "Pulling"), ("envoy", "1", "Succeeded")],
    )));
    assert_eq!(owners(&change), ["job-a", "job-b"]);
    // The same again (a resync, another field): nothing.
    let change = changes.observe(&apply(nodeimage(
        "n1",
        json!({}),
        TWO_JOBS,
        &[("nginx", "1.27", "Pulling"), ("envoy", "1", "Succeeded")],
    )));
    assert_eq!(change, Change::default());
    // A report on a tag nobody owns (a pre-download gone, a manual entry): nothing.
    let change = changes.observe(&apply(nodeimage(
        "n1",
        json!({}),
        TWO_JOBS,
        &[
            ("nginx", "1.27", "Pulling"),
            ("envoy", "1", "Succeeded"),
            ("busybox", "1", "Succeeded"),
        ],
    )));
    assert_eq!(change, Change::default());
}

#[test]
fn progress_and_messages_alone_wake_nobody_and_a_phase_change_wakes_the_owner() {
    let with = |progress: i32, message: &str, phase: &str| {
        let mut ni = nodeimage("n1", json!({}), TWO_JOBS, &[("nginx", "1.27", phase)]);
        let status = ni.status.as_mut().unwrap();
        let tag = &mut status.image_statuses.values_mut().next().unwrap().tags[0];
        tag.progress = Some(progress);
        tag.message = Some(message.into());
        ni
    };
    let mut changes = NodeImageChanges::default();
    changes.observe(&apply(with(10, "", "Pulling")));
    assert_eq!(
        changes.observe(&apply(with(40, "", "Pulling"))),
        Change::default(),
        "progress"
    );
    assert_eq!(
        changes.observe(&apply(with(40, "attempt 2 of 4", "Pulling"))),
        Change::default(),
        "message"
    );
    let change = changes.observe(&apply(with(100, "", "Succeeded")));
    assert_eq!(owners(&change), ["job-a"]);
}

#[test]
fn tags_added_or_removed_wake_their_owners() {
    let mut changes = NodeImageChanges::default();
    changes.observe(&apply(nodeimage("n1", json!({}), TWO_JOBS, &[])));
    // job-c writes its first tag; job-b's own tag goes.
    let change = changes.observe(&apply(nodeimage(
        "n1",
        json!({}),
        &[
            ("nginx", "1.27", &["job-a"]),
            ("envoy", "1", &["job-a", "job-b"]),
            ("mysql", "8", &["job-c"]),
        ],
        &[],
    )));
    assert!(!change.node);
    assert_eq!(owners(&change), ["job-b", "job-c"]);
}

#[test]
fn images_going_wake_the_jobs_that_may_target_the_node_and_images_coming_do_not() {
    let mut changes = NodeImageChanges::default();
    changes.observe(&apply(nodeimage("n1", json!({}), TWO_JOBS, &[])));
    // job-c adds an image: its own business.
    let mut more = TWO_JOBS.to_vec();
    more.push(("mysql", "8", &["job-c"]));
    let change = changes.observe(&apply(nodeimage("n1", json!({}), &more, &[])));
    assert_eq!(
        change,
        Change {
            owners: vec!["job-c".into()],
            node: false
        }
    );
    // An image goes: room for a job the full NodeImage refused.
    let change = changes.observe(&apply(nodeimage("n1", json!({}), &more[1..], &[])));
    assert!(change.node);
    assert_eq!(owners(&change), ["job-a"]);
}

#[test]
fn labels_changing_wake_the_jobs_that_may_target_the_node() {
    let mut changes = NodeImageChanges::default();
    changes.observe(&apply(nodeimage("n1", json!({"pool": "a"}), TWO_JOBS, &[])));
    let change = changes.observe(&apply(nodeimage("n1", json!({"pool": "b"}), TWO_JOBS, &[])));
    assert_eq!(
        change,
        Change {
            owners: Vec::new(),
            node: true
        }
    );
}

#[test]
fn a_deleted_node_wakes_its_owners_and_may_target_jobs() {
    let mut changes = NodeImageChanges::default();
    let ni = nodeimage("n1", json!({}), TWO_JOBS, &[]);
    changes.observe(&apply(ni.clone()));
    let change = changes.observe(&watcher::Event::Delete(ni.clone()));
    assert!(change.node);
    assert_eq!(owners(&change), ["job-a", "job-b"]);
    // Seen again afterwards: new again.
    assert!(changes.observe(&apply(ni)).node);
}

#[test]
fn a_relist_wakes_only_what_changed_meanwhile_and_what_vanished() {
    let mut changes = NodeImageChanges::default();
    changes.observe(&apply(nodeimage("n1", json!({}), TWO_JOBS, &[])));
    changes.observe(&apply(nodeimage(
        "n2",
        json!({}),
        &[("nginx", "1.27", &["job-a"])],
        &[],
    )));
    changes.observe(&apply(nodeimage(
        "n3",
        json!({}),
        &[("mysql", "8", &["job-c"])],
        &[],
    )));
    assert_eq!(changes.observe(&watcher::Event::Init), Change::default());
    // n1 unchanged, n2 reported meanwhile, n3 deleted while the watch was down.
    let unchanged = changes.observe(&watcher::Event::InitApply(nodeimage(
        "n1",
        json!({}),
        TWO_JOBS,
        &[],
    )));
    assert_eq!(unchanged, Change::default());
    let reported = changes.observe(&watcher::Event::InitApply(nodeimage(
        "n2",
        json!({}),
        &[("nginx", "1.27", &["job-a"])],
        &[("nginx", "1.27", "Succeeded")],
    )));
    assert_eq!(owners(&reported), ["job-a"]);
    let done = changes.observe(&watcher::Event::InitDone);
    assert_eq!(
        done,
        Change {
            owners: vec!["job-c".into()],
            node: true
        }
    );
    // n3 is forgotten: a later Apply is a new node.
    assert!(
        changes
            .observe(&apply(nodeimage("n3", json!({}), &[], &[])))
            .node
    );
}
