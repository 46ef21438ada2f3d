use super::*;
use crate::compact_nodeimage::{ImagePullPhase, ImageStatus, ImageTagStatus};

fn tag(name: &str, phase: ImagePullPhase) -> ImageTagStatus {
    ImageTagStatus {
        tag: name.into(),
        phase,
        progress: None,
        start_time: None,
        completion_time: None,
        version: Some(1),
        image_id: None,
        message: None,
    }
}

fn status(images: &[(&str, &[(&str, ImagePullPhase)])], failed: i32) -> NodeImageStatus {
    NodeImageStatus {
        desired: 2,
        failed,
        image_statuses: images
            .iter()
            .map(|(name, tags)| {
                (
                    (*name).into(),
                    ImageStatus {
                        tags: tags.iter().map(|(t, p)| tag(t, *p)).collect(),
                    },
                )
            })
            .collect(),
        ..Default::default()
    }
}

fn object(status: Option<&NodeImageStatus>, rv: &str) -> Value {
    let mut doc = json!({"metadata": {"name": "n1", "resourceVersion": rv}, "spec": {}});
    if let Some(s) = status {
        doc["status"] = value(s);
    }
    doc
}

fn apply(doc: &Value, patch: &Patch) -> Result<Value, json_patch::PatchError> {
    let mut doc = doc.clone();
    json_patch::patch(&mut doc, patch)?;
    Ok(doc)
}

use ImagePullPhase::{Failed, Pulling, Succeeded};

#[test]
fn equal_status_no_patch() {
    let s = status(&[("nginx", &[("1", Pulling)])], 0);
    assert!(status_patch(&s, Some("1"), &s, false).is_none());
    assert!(status_patch(&s, Some("1"), &s, true).is_none());
}

#[test]
fn an_empty_status_is_written_whole_under_the_resource_version() {
    let new = status(&[("nginx", &[("1", Failed)])], 1);
    let patch = status_patch(&NodeImageStatus::default(), Some("7"), &new, false).expect("patch");
    let out = apply(&object(None, "7"), &patch).expect("applies");
    assert_eq!(out["status"], value(&new));
    assert!(
        apply(&object(None, "8"), &patch).is_err(),
        "moved on: refused"
    );
}

#[test]
fn replacing_one_image_tests_only_that_image_and_the_counts() {
    let old = status(
        &[("nginx", &[("1", Pulling)]), ("redis", &[("7", Pulling)])],
        0,
    );
    let new = status(
        &[("nginx", &[("1", Failed)]), ("redis", &[("7", Pulling)])],
        1,
    );
    let patch = status_patch(&old, Some("1"), &new, false).expect("patch");
    let doc = object(Some(&old), "1");
    assert_eq!(apply(&doc, &patch).expect("applies")["status"], value(&new));

    // The daemon moved redis on meanwhile (counts untouched): ours still applies, theirs stays.
    let mut moved = doc.clone();
    moved["status"]["imageStatuses"]["redis"]["tags"][0]["phase"] = json!("Succeeded");
    moved["metadata"]["resourceVersion"] = json!("2");
    let out = apply(&moved, &patch).expect("applies");
    assert_eq!(
        out["status"]["imageStatuses"]["redis"]["tags"][0]["phase"],
        "Succeeded"
    );
    assert_eq!(
        out["status"]["imageStatuses"]["nginx"]["tags"][0]["phase"],
        "Failed"
    );

    // The daemon answered nginx meanwhile: refused, its answer is not overwritten.
    let mut answered = doc.clone();
    answered["status"]["imageStatuses"]["nginx"]["tags"][0]["phase"] = json!("Succeeded");
    assert!(apply(&answered, &patch).is_err());

    // The daemon changed the counts meanwhile: refused too.
    let mut recounted = doc;
    recounted["status"]["failed"] = json!(3);
    assert!(apply(&recounted, &patch).is_err());
}

#[test]
fn adding_an_image_guards_the_whole_map() {
    let old = status(&[("redis", &[("7", Succeeded)])], 0);
    let new = status(
        &[("nginx", &[("1", Failed)]), ("redis", &[("7", Succeeded)])],
        1,
    );
    let patch = status_patch(&old, Some("1"), &new, false).expect("patch");
    let doc = object(Some(&old), "1");
    assert_eq!(apply(&doc, &patch).expect("applies")["status"], value(&new));
    let mut raced = doc;
    raced["status"]["imageStatuses"]["nginx"] = json!({"tags": [{"tag": "1", "phase": "Pulling"}]});
    assert!(apply(&raced, &patch).is_err(), "the daemon added it first");
}

#[test]
fn adding_the_first_image_to_an_existing_status_guards_the_version() {
    let old = NodeImageStatus {
        desired: 1,
        ..Default::default()
    };
    let new = NodeImageStatus {
        desired: 1,
        failed: 1,
        ..status(&[("nginx", &[("1", Failed)])], 1)
    };
    let patch = status_patch(&old, Some("4"), &new, false).expect("patch");
    // The stored status has no imageStatuses key at all.
    let doc = json!({"metadata": {"resourceVersion": "4"}, "status": {"desired": 1, "succeeded": 0, "failed": 0, "pulling": 0, "waiting": 0}});
    let out = apply(&doc, &patch).expect("applies");
    assert_eq!(out["status"], value(&new));
    let mut moved = doc;
    moved["metadata"]["resourceVersion"] = json!("5");
    assert!(apply(&moved, &patch).is_err());
}

#[test]
fn removing_an_image_and_names_with_slashes() {
    let old = status(
        &[
            ("127.0.0.1:5000/team/app", &[("1", Succeeded)]),
            ("nginx", &[("1", Pulling)]),
        ],
        0,
    );
    let new = status(&[("nginx", &[("1", Failed)])], 1);
    let patch = status_patch(&old, Some("1"), &new, false).expect("patch");
    let out = apply(&object(Some(&old), "1"), &patch).expect("applies");
    assert_eq!(out["status"], value(&new));
}

#[test]
fn whole_replaces_under_the_version_only() {
    let old = status(&[("nginx", &[("1", Pulling)])], 0);
    let new = status(&[("nginx", &[("1", Failed)])], 1);
    let patch = status_patch(&old, Some("9"), &new, true).expect("patch");
    // A stored form that would fail a value test (fractional seconds) is fine here.
    let mut doc = object(Some(&old), "9");
    doc["status"]["imageStatuses"]["nginx"]["tags"][0]["startTime"] =
        json!("2024-01-01T00:00:00.5Z");
    assert_eq!(apply(&doc, &patch).expect("applies")["status"], value(&new));
    doc["metadata"]["resourceVersion"] = json!("10");
    assert!(apply(&doc, &patch).is_err());
}

#[test]
fn labels_patch_sets_changes_and_removes_extras() {
    let wanted = BTreeMap::from([
        ("a".to_owned(), "1".to_owned()),
        ("b".to_owned(), "2".to_owned()),
    ]);
    assert_eq!(labels_patch(&wanted, &wanted), None);
    let current = BTreeMap::from([
        ("a".to_owned(), "1".to_owned()),
        ("b".to_owned(), "old".to_owned()),
        ("x".to_owned(), "y".to_owned()),
    ]);
    assert_eq!(
        labels_patch(&current, &wanted),
        Some(json!({"metadata": {"labels": {"b": "2", "x": null}}}))
    );
    assert_eq!(
        labels_patch(&BTreeMap::new(), &wanted),
        Some(json!({"metadata": {"labels": {"a": "1", "b": "2"}}}))
    );
    assert_eq!(labels_patch(&BTreeMap::new(), &BTreeMap::new()), None);
    // Applying it as a merge patch gives exactly the wanted labels.
    let mut doc = json!({"metadata": {"labels": value(&current)}});
    json_patch::merge(&mut doc, &labels_patch(&current, &wanted).expect("patch"));
    assert_eq!(doc["metadata"]["labels"], value(&wanted));
}
