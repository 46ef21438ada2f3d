use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;

fn spec_json(tag: &str, second: i64) -> serde_json::Value {
    let created = Time(k8s_openapi::jiff::Timestamp::from_second(second).unwrap());
    serde_json::json!({
        "tags": [{
            "tag": tag,
            "createdAt": created,
            "version": 1,
            "ownerReferences": [{"uid": "job-uid", "kind": "ImagePullJob", "name": "job"}]
        }]
    })
}

fn parse(value: serde_json::Value) -> Shared<ImageSpec> {
    serde_json::from_value(value).unwrap()
}

#[test]
fn equal_values_parsed_apart_are_one_copy() {
    let a = parse(spec_json("shared-1.0", 1_700_000_000));
    let b = parse(spec_json("shared-1.0", 1_700_000_000));
    assert!(a.same_copy(&b));
    assert_eq!(a, b);
}

#[test]
fn values_that_differ_anywhere_are_not_shared() {
    let a = parse(spec_json("differ-1.0", 1_700_000_000));
    let other_time = parse(spec_json("differ-1.0", 1_700_000_001));
    let other_tag = parse(spec_json("differ-1.1", 1_700_000_000));
    assert!(!a.same_copy(&other_time));
    assert!(!a.same_copy(&other_tag));
    assert_ne!(a, other_time);
    assert_ne!(a, other_tag);
}

#[test]
fn changing_a_shared_value_changes_only_the_changers_copy() {
    let a = parse(spec_json("cow-1.0", 1_700_000_000));
    let mut b = parse(spec_json("cow-1.0", 1_700_000_000));
    assert!(a.same_copy(&b));
    b.tags[0].version = Some(2);
    assert_eq!(a.tags[0].version, Some(1));
    assert_eq!(b.tags[0].version, Some(2));
    // A value parsed afterwards still finds the unchanged one.
    let c = parse(spec_json("cow-1.0", 1_700_000_000));
    assert!(c.same_copy(&a));
}

#[test]
fn it_serializes_and_reads_as_the_value_it_holds() {
    let json = spec_json("roundtrip-1.0", 1_700_000_000);
    let shared = parse(json.clone());
    assert_eq!(serde_json::to_value(&shared).unwrap(), json);
    let plain: ImageSpec = serde_json::from_value(json).unwrap();
    assert_eq!(*shared, plain);
    assert_eq!(
        serde_json::to_value(Shared::from(plain.clone())).unwrap(),
        serde_json::to_value(&plain).unwrap()
    );
}

#[test]
fn a_nodeimage_reads_its_entries_as_shared_copies() {
    let images = |tag: &str| -> Images {
        serde_json::from_value(serde_json::json!({ "nginx": spec_json(tag, 1_700_000_000) }))
            .unwrap()
    };
    let a = images("map-1.0");
    let b = images("map-1.0");
    assert!(a["nginx"].same_copy(&b["nginx"]));

    let status = |phase: &str| -> Shared<ImageStatus> {
        serde_json::from_value(serde_json::json!({
            "tags": [{"tag": "map-1.0", "phase": phase, "imageID": "nginx@sha256:abc"}]
        }))
        .unwrap()
    };
    assert!(status("Succeeded").same_copy(&status("Succeeded")));
    assert!(!status("Succeeded").same_copy(&status("Pulling")));
    assert_eq!(
        status("Succeeded").tags,
        vec![ImageTagStatus {
            image_id: Some("nginx@sha256:abc".into()),
            ..ImageTagStatus::new("map-1.0", ImagePullPhase::Succeeded)
        }]
    );
}
