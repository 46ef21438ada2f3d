//! The NodeImage status the daemon reports, built by a pure function, and the merge patch that
//! writes it.
//!
//! For each tag in the spec the status shows, in order of preference, what this daemon's worker
//! says about the spec's version, or what the status already says about that version (a pull
//! finished before a restart, or the manager's "no response" verdict), or nothing yet. Tags and
//! images no longer in the spec are dropped.
//!
//! The patch carries `metadata.resourceVersion`, so the apiserver refuses it (409) when anyone,
//! the manager included, wrote in between: the daemon then re-reads and decides again instead of
//! overwriting what it has not seen.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::plan::{TagKey, spec_version};
use kruise_rs_api::nodeimage::{
    ImagePullPhase, ImageStatus, ImageTagStatus, NodeImageSpec, NodeImageStatus,
};

/// The status to report for `spec`, given the status last seen and the workers' states.
pub(crate) fn desired_status(
    spec: &NodeImageSpec,
    observed: Option<&NodeImageStatus>,
    workers: &BTreeMap<TagKey, ImageTagStatus>,
) -> NodeImageStatus {
    let mut status = NodeImageStatus {
        first_sync_status: observed.and_then(|s| s.first_sync_status.clone()),
        ..NodeImageStatus::default()
    };
    for (image, image_spec) in &spec.images {
        let mut tags: Vec<ImageTagStatus> = Vec::new();
        for tag in &image_spec.tags {
            status.desired += 1;
            if tags.iter().any(|t| t.tag == tag.tag) {
                continue;
            }
            let version = spec_version(tag.version);
            let at_version = |s: &&ImageTagStatus| s.version.unwrap_or(0) == version;
            let from_worker = workers
                .get(&TagKey::new(image, &tag.tag))
                .filter(at_version);
            let from_status = || {
                observed?
                    .image_statuses
                    .get(image)?
                    .tags
                    .iter()
                    .find(|t| t.tag == tag.tag)
                    .filter(at_version)
            };
            let Some(tag_status) = from_worker.or_else(from_status) else {
                continue;
            };
            match tag_status.phase {
                ImagePullPhase::Waiting => status.waiting += 1,
                ImagePullPhase::Pulling => status.pulling += 1,
                ImagePullPhase::Succeeded => status.succeeded += 1,
                ImagePullPhase::Failed => status.failed += 1,
            }
            tags.push(tag_status.clone());
        }
        if !tags.is_empty() {
            status
                .image_statuses
                .insert(image.clone(), ImageStatus { tags });
        }
    }
    status
}

/// A merge patch of the status subresource turning `observed` into `desired`, guarded by
/// `resource_version`. Images present before and absent now are removed explicitly.
pub(crate) fn status_patch(
    observed: Option<&NodeImageStatus>,
    desired: &NodeImageStatus,
    resource_version: &str,
) -> Value {
    let mut status = match serde_json::to_value(desired) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    };
    let images = status
        .entry("imageStatuses")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(images) = images {
        for gone in observed
            .into_iter()
            .flat_map(|s| s.image_statuses.keys())
            .filter(|name| !desired.image_statuses.contains_key(*name))
        {
            images.insert(gone.to_string(), Value::Null);
        }
    }
    if desired.first_sync_status.is_none() {
        status.insert("firstSyncStatus".into(), Value::Null);
    }
    json!({
        "metadata": {"resourceVersion": resource_version},
        "status": status,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(value: Value) -> NodeImageSpec {
        serde_json::from_value(value).unwrap()
    }

    fn status(value: Value) -> NodeImageStatus {
        serde_json::from_value(value).unwrap()
    }

    fn worker(tag: &str, phase: ImagePullPhase, version: i64) -> ImageTagStatus {
        ImageTagStatus {
            version: Some(version),
            ..ImageTagStatus::new(tag, phase)
        }
    }

    #[test]
    fn workers_and_counts_in_spec_order() {
        let spec = spec(json!({"images": {"nginx": {"tags": [
            {"tag": "b", "version": 1}, {"tag": "a", "version": 1}, {"tag": "c", "version": 1}
        ]}, "redis": {"tags": [{"tag": "7"}]}}}));
        let workers = BTreeMap::from([
            (
                TagKey::new("nginx", "a"),
                worker("a", ImagePullPhase::Succeeded, 1),
            ),
            (
                TagKey::new("nginx", "b"),
                worker("b", ImagePullPhase::Pulling, 1),
            ),
            (
                TagKey::new("nginx", "c"),
                worker("c", ImagePullPhase::Failed, 1),
            ),
            (
                TagKey::new("redis", "7"),
                worker("7", ImagePullPhase::Waiting, 0),
            ),
        ]);
        let out = desired_status(&spec, None, &workers);
        assert_eq!(
            (
                out.desired,
                out.succeeded,
                out.failed,
                out.pulling,
                out.waiting
            ),
            (4, 1, 1, 1, 1)
        );
        let tags: Vec<&str> = out.image_statuses["nginx"]
            .tags
            .iter()
            .map(|t| t.tag.as_str())
            .collect();
        assert_eq!(tags, ["b", "a", "c"]);
    }

    #[test]
    fn a_worker_of_an_older_version_is_not_reported() {
        let spec = spec(json!({"images": {"nginx": {"tags": [{"tag": "a", "version": 2}]}}}));
        let workers = BTreeMap::from([(
            TagKey::new("nginx", "a"),
            worker("a", ImagePullPhase::Succeeded, 1),
        )]);
        let out = desired_status(&spec, None, &workers);
        assert_eq!((out.desired, out.succeeded), (1, 0));
        assert!(out.image_statuses.is_empty());
    }

    #[test]
    fn a_verdict_in_the_status_at_this_version_is_kept() {
        let spec = spec(json!({"images": {"nginx": {"tags": [
            {"tag": "a", "version": 1}, {"tag": "b", "version": 2}
        ]}}}));
        let observed = status(json!({"failed": 1, "imageStatuses": {"nginx": {"tags": [
            {"tag": "a", "phase": "Failed", "version": 1, "completionTime": "2026-11-29T10:00:00Z", "message": "node did not respond"},
            {"tag": "b", "phase": "Succeeded", "version": 1, "completionTime": "2026-11-29T10:00:00Z"}
        ]}}}));
        let out = desired_status(&spec, Some(&observed), &BTreeMap::new());
        assert_eq!(out.image_statuses["nginx"].tags.len(), 1);
        assert_eq!(
            out.image_statuses["nginx"].tags[0].message.as_deref(),
            Some("node did not respond")
        );
        assert_eq!((out.desired, out.failed, out.succeeded), (2, 1, 0));
    }

    #[test]
    fn removed_images_are_deleted_by_the_patch() {
        let observed = status(json!({"imageStatuses": {
            "nginx": {"tags": [{"tag": "a", "phase": "Succeeded"}]},
            "redis": {"tags": [{"tag": "7", "phase": "Succeeded"}]}
        }}));
        let desired = desired_status(
            &spec(json!({"images": {"nginx": {"tags": [{"tag": "a"}]}}})),
            Some(&observed),
            &BTreeMap::new(),
        );
        let patch = status_patch(Some(&observed), &desired, "42");
        assert_eq!(patch["metadata"], json!({"resourceVersion": "42"}));
        assert_eq!(patch["status"]["imageStatuses"]["redis"], Value::Null);
        assert_eq!(
            patch["status"]["imageStatuses"]["nginx"]["tags"][0]["tag"],
            "a"
        );
        assert_eq!(patch["status"]["succeeded"], 1);
        assert_eq!(patch["status"]["desired"], 1);
    }

    #[test]
    fn merging_the_patch_gives_exactly_the_desired_status() {
        let observed = status(json!({"desired": 2, "pulling": 1, "imageStatuses": {
            "nginx": {"tags": [{"tag": "a", "phase": "Pulling", "version": 1}]},
            "gone": {"tags": [{"tag": "x", "phase": "Failed"}]}
        }}));
        let desired = desired_status(
            &spec(json!({"images": {"nginx": {"tags": [{"tag": "a", "version": 1}]}}})),
            Some(&observed),
            &BTreeMap::from([(
                TagKey::new("nginx", "a"),
                worker("a", ImagePullPhase::Succeeded, 1),
            )]),
        );
        let mut doc = json!({"status": serde_json::to_value(&observed).unwrap()});
        json_patch::merge(&mut doc, &status_patch(Some(&observed), &desired, "1"));
        let merged: NodeImageStatus = serde_json::from_value(doc["status"].clone()).unwrap();
        assert_eq!(merged, desired);
    }

    #[test]
    fn an_empty_spec_clears_the_images() {
        let observed = status(
            json!({"imageStatuses": {"nginx": {"tags": [{"tag": "a", "phase": "Succeeded"}]}}}),
        );
        let desired = desired_status(&NodeImageSpec::default(), Some(&observed), &BTreeMap::new());
        assert_eq!(desired, NodeImageStatus::default());
        let patch = status_patch(Some(&observed), &desired, "1");
        assert_eq!(patch["status"]["imageStatuses"], json!({"nginx": null}));
    }
}
