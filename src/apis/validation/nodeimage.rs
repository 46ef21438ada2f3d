//! NodeImage admission validation (upstream:
//! `pkg/webhook/nodeimage/validating/nodeimage_create_update_handler.go`).
//!
//! Run after [`crate::apis::defaults::default_nodeimage`], as upstream's webhooks do: defaulting
//! fills every tag's `createdAt` and `pullPolicy`, so the "required" rules below only catch a
//! caller that skipped it. Our ImagePullJob controller writes `createdAt`, `pullPolicy` and a
//! `ttlSecondsAfterFinished` on every tag it adds, so its writes always pass.
//!
//! Rules:
//! - at most 256 images (`spec.images`);
//! - image names non-empty;
//! - each tag: non-empty, unique within its image, `createdAt` set, `version` ≥ 0,
//!   `pullPolicy` set with `ttlSecondsAfterFinished` (a tag must eventually expire).
//!
//! Differences from upstream: every problem is reported, not only the first; no feature gate.
//! On update, a tag entry equal to the one already stored is not re-checked, and the image
//! limit only refuses growth: a NodeImage written before these rules applied (or by another
//! tool) can still be trimmed by the controllers, whose every write is a whole-object update
//! that would otherwise be refused because of an entry they did not touch. Image names are not
//! parsed here: the daemon fails a bad entry on its own, where refusing it here would block
//! every write to the node's NodeImage.

use std::collections::{BTreeMap, HashSet};

use super::{FieldError, ValidationErrors, check_raw_enum, child, index, key};
use crate::apis::nodeimage::{ImageTagSpec, NodeImage};

/// Most images one NodeImage may list (upstream's `defaultMaxImagesPerNode`).
pub const MAX_IMAGES_PER_NODE: usize = 256;

/// Validates a NodeImage being created.
pub fn validate_create(node: &NodeImage) -> Result<(), ValidationErrors> {
    ValidationErrors(validate(node, None)).into_result()
}

/// Validates an update from `old` to `new`, re-checking only what changed.
pub fn validate_update(old: &NodeImage, new: &NodeImage) -> Result<(), ValidationErrors> {
    ValidationErrors(validate(new, Some(old))).into_result()
}

/// Reports, from a NodeImage's raw JSON, enum fields the typed struct cannot hold.
pub fn validate_raw_enums(raw: &serde_json::Value) -> Result<(), ValidationErrors> {
    check_and_wrap(check_raw_enum(
        raw,
        "spec.images{*}.tags[*].imagePullPolicy",
        &["Always", "IfNotPresent"],
    ))
}

fn check_and_wrap(errs: Vec<FieldError>) -> Result<(), ValidationErrors> {
    ValidationErrors(errs).into_result()
}

fn validate(node: &NodeImage, old: Option<&NodeImage>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let images = &node.spec.images;
    let old_count = old.map_or(0, |o| o.spec.images.len());
    if images.len() > MAX_IMAGES_PER_NODE && images.len() > old_count {
        errs.push(FieldError::too_many(
            "spec.images",
            images.len(),
            MAX_IMAGES_PER_NODE,
        ));
    }
    let unchanged_tags: BTreeMap<(&str, &str), &ImageTagSpec> = old
        .iter()
        .flat_map(|o| o.spec.images.iter())
        .flat_map(|(name, image)| {
            image
                .tags
                .iter()
                .map(move |t| ((name.as_str(), t.tag.as_str()), t))
        })
        .collect();

    for (name, image) in images {
        let image_path = key("spec.images", name);
        if name.is_empty() {
            errs.push(FieldError::required(
                &image_path,
                "image name can not be empty",
            ));
        }
        let mut seen = HashSet::new();
        for (i, tag) in image.tags.iter().enumerate() {
            let tag_path = index(&child(&image_path, "tags"), i);
            if tag.tag.is_empty() {
                errs.push(FieldError::required(
                    child(&tag_path, "tag"),
                    format!("tag for image {name} can not be empty"),
                ));
            } else if !seen.insert(tag.tag.as_str()) {
                errs.push(FieldError::duplicate(child(&tag_path, "tag"), &tag.tag));
                continue;
            }
            if unchanged_tags.get(&(name.as_str(), tag.tag.as_str())) == Some(&tag) {
                continue;
            }
            errs.extend(validate_tag(name, tag, &tag_path));
        }
    }
    errs
}

fn validate_tag(name: &str, tag: &ImageTagSpec, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let full = format!("{name}/{}", tag.tag);
    if tag.created_at.is_none() {
        errs.push(FieldError::required(
            child(path, "createdAt"),
            format!("createdAt field for {full} can not be empty"),
        ));
    }
    if let Some(version) = tag.version.filter(|v| *v < 0) {
        errs.push(FieldError::invalid_int(
            child(path, "version"),
            version,
            format!("version for {full} can not be less than 0"),
        ));
    }
    match &tag.pull_policy {
        None => errs.push(FieldError::required(
            child(path, "pullPolicy"),
            format!("pullPolicy of {full} must be set"),
        )),
        Some(policy) if policy.ttl_seconds_after_finished.is_none() => {
            errs.push(FieldError::required(
                child(&child(path, "pullPolicy"), "ttlSecondsAfterFinished"),
                format!("pullPolicy.ttlSecondsAfterFinished of {full} must be set"),
            ));
        }
        Some(_) => {}
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::defaults::default_nodeimage;
    use crate::apis::nodeimage::{ImageSpec, ImageTagPullPolicy};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::{Value, json};

    fn now() -> Time {
        Time("2026-01-02T03:04:05Z".parse().expect("timestamp"))
    }

    fn node(images: Value) -> NodeImage {
        NodeImage::new(
            "node-a",
            serde_json::from_value(json!({"images": images})).expect("spec"),
        )
    }

    fn defaulted(images: Value) -> NodeImage {
        let mut n = node(images);
        default_nodeimage(&mut n, &now());
        n
    }

    fn errors(r: Result<(), ValidationErrors>) -> Vec<String> {
        r.err()
            .map(|e| e.0.iter().map(ToString::to_string).collect())
            .unwrap_or_default()
    }

    fn tag(t: &str) -> Value {
        json!({"tag": t, "pullPolicy": {"ttlSecondsAfterFinished": 300}})
    }

    #[test]
    fn what_our_controller_writes_passes_after_defaulting() {
        let n = defaulted(
            json!({"nginx": {"tags": [tag("1.25"), tag("latest")]}, "ghcr.io/org/app": {"tags": [tag("sha256:abc")]}}),
        );
        assert_eq!(errors(validate_create(&n)), Vec::<String>::new());
        assert_eq!(
            errors(validate_create(&node(json!({})))),
            Vec::<String>::new()
        );
    }

    #[test]
    fn at_most_256_images() {
        let many: serde_json::Map<String, Value> = (0..257)
            .map(|i| (format!("image{i}"), json!({"tags": [tag("1")]})))
            .collect();
        let n = defaulted(Value::Object(many));
        assert_eq!(
            errors(validate_create(&n)),
            ["spec.images: Too many: 257: must have at most 256 items"]
        );
        // An update that does not grow an over-full NodeImage is let through so it can shrink.
        let mut smaller = n.clone();
        smaller.spec.images.remove("image0");
        assert_eq!(errors(validate_update(&n, &smaller)), Vec::<String>::new());
        let mut bigger = n.clone();
        bigger
            .spec
            .images
            .insert("extra".into(), smaller.spec.images["image1"].clone());
        assert_eq!(errors(validate_update(&n, &bigger)).len(), 1);
    }

    #[test]
    fn names_and_tags_are_non_empty_and_tags_unique() {
        let n = defaulted(
            json!({"": {"tags": [tag("1")]}, "nginx": {"tags": [tag(""), tag("1"), tag("1")]}}),
        );
        assert_eq!(
            errors(validate_create(&n)),
            [
                "spec.images[]: Required value: image name can not be empty",
                "spec.images[nginx].tags[0].tag: Required value: tag for image nginx can not be empty",
                r#"spec.images[nginx].tags[2].tag: Duplicate value: "1""#,
            ]
        );
    }

    #[test]
    fn tags_need_created_at_pull_policy_ttl_and_a_non_negative_version() {
        // Undefaulted, as a caller that skipped defaulting would pass it.
        let n = node(json!({"nginx": {"tags": [
            {"tag": "a"},
            {"tag": "b", "createdAt": "2026-01-01T00:00:00Z", "pullPolicy": {}, "version": -1}
        ]}}));
        assert_eq!(
            errors(validate_create(&n)),
            [
                "spec.images[nginx].tags[0].createdAt: Required value: createdAt field for nginx/a can not be empty",
                "spec.images[nginx].tags[0].pullPolicy: Required value: pullPolicy of nginx/a must be set",
                "spec.images[nginx].tags[1].version: Invalid value: -1: version for nginx/b can not be less than 0",
                "spec.images[nginx].tags[1].pullPolicy.ttlSecondsAfterFinished: Required value: pullPolicy.ttlSecondsAfterFinished of nginx/b must be set",
            ]
        );
        // Defaulting fills createdAt and pullPolicy, but not the TTL.
        let n = defaulted(json!({"nginx": {"tags": [{"tag": "a"}]}}));
        assert_eq!(
            errors(validate_create(&n)),
            [
                "spec.images[nginx].tags[0].pullPolicy.ttlSecondsAfterFinished: Required value: pullPolicy.ttlSecondsAfterFinished of nginx/a must be set"
            ]
        );
    }

    #[test]
    fn an_update_only_checks_new_or_changed_tags() {
        // Stored before these rules applied: a tag without TTL.
        let old = defaulted(json!({"nginx": {"tags": [{"tag": "old"}]}}));
        let mut new = old.clone();
        let image: &mut ImageSpec = new.spec.images.get_mut("nginx").expect("nginx");
        image
            .tags
            .push(serde_json::from_value(tag("new")).expect("tag"));
        default_nodeimage(&mut new, &now());
        assert_eq!(errors(validate_update(&old, &new)), Vec::<String>::new());
        // Changing the old entry re-checks it.
        let image = new.spec.images.get_mut("nginx").expect("nginx");
        image.tags[1].version = Some(1);
        assert_eq!(image.tags[1].tag, "old");
        assert_eq!(errors(validate_update(&old, &new)).len(), 1);
        // A new tag is checked.
        let image = new.spec.images.get_mut("nginx").expect("nginx");
        image.tags[1].pull_policy = Some(ImageTagPullPolicy {
            ttl_seconds_after_finished: Some(1),
            ..Default::default()
        });
        image.tags[0].pull_policy = None;
        assert_eq!(
            errors(validate_update(&old, &new)),
            [
                "spec.images[nginx].tags[0].pullPolicy: Required value: pullPolicy of nginx/new must be set"
            ]
        );
    }

    #[test]
    fn raw_enums() {
        let errs = errors(validate_raw_enums(
            &json!({"spec": {"images": {"nginx": {"tags": [
            {"tag": "1", "imagePullPolicy": "Always"}, {"tag": "2", "imagePullPolicy": "Never"}]}}}}),
        ));
        assert_eq!(
            errs,
            [
                r#"spec.images[nginx].tags[1].imagePullPolicy: Unsupported value: "Never": supported values: "Always", "IfNotPresent""#
            ]
        );
    }
}
