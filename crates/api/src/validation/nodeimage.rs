//! NodeImage admission validation (upstream:
//! `pkg/webhook/nodeimage/validating/nodeimage_create_update_handler.go`).
//!
//! Run after [`crate::defaults::default_nodeimage`], as upstream's webhooks do: defaulting
//! fills every tag's `createdAt` and `pullPolicy`, so the "required" rules below only catch a
//! caller that skipped it. Our ImagePullJob controller writes `createdAt`, `pullPolicy` and a
//! `ttlSecondsAfterFinished` on every tag it adds, so its writes always pass.
//!
//! Rules:
//! - at most 256 images (`spec.images`);
//! - image names non-empty;
//! - each tag: non-empty, unique within its image, `createdAt` set, `version` ≥ 0,
//!   `pullPolicy` set with `ttlSecondsAfterFinished` (a tag must eventually expire, and not
//!   negative), `timeoutSeconds`, `backoffLimit` and `activeDeadlineSeconds` within
//!   [`limits`].
//!
//! Differences from upstream: every problem is reported, not only the first; no feature gate.
//! On update, a tag entry equal to the one already stored is not re-checked, and the image
//! limit only refuses growth: a NodeImage written before these rules applied (or by another
//! tool) can still be trimmed by the controllers, whose every write is a whole-object update
//! that would otherwise be refused because of an entry they did not touch. Image names are not
//! parsed here: the daemon fails a bad entry on its own, where refusing it here would block
//! every write to the node's NodeImage.

use std::collections::{BTreeMap, HashSet};

use super::imagepulljob::validate_pull_policy;
use super::{FieldError, ValidationErrors, check_raw_enum, child, index, key, validate_range};
use crate::image::joined_ref;
use crate::limits;
use crate::nodeimage::{ImageTagSpec, NodeImage};

/// Most images one NodeImage may list (upstream's `defaultMaxImagesPerNode`).
pub(crate) const MAX_IMAGES_PER_NODE: usize = 256;

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
    // As a reference (`nginx:1.25`, `app@sha256:…`); upstream wrote `name/tag`, which reads as
    // a repository.
    let full = joined_ref(name, &tag.tag);
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
        Some(policy) => {
            let policy_path = child(path, "pullPolicy");
            match policy.ttl_seconds_after_finished {
                None => errs.push(FieldError::required(
                    child(&policy_path, "ttlSecondsAfterFinished"),
                    format!("pullPolicy.ttlSecondsAfterFinished of {full} must be set"),
                )),
                Some(ttl) => errs.extend(validate_range(
                    ttl.into(),
                    &child(&policy_path, "ttlSecondsAfterFinished"),
                    limits::MIN_TTL_SECONDS.into(),
                    i32::MAX.into(),
                )),
            }
            errs.extend(validate_pull_policy(
                policy.timeout_seconds,
                policy.backoff_limit,
                &policy_path,
            ));
            if let Some(deadline) = policy.active_deadline_seconds {
                errs.extend(validate_range(
                    deadline,
                    &child(&policy_path, "activeDeadlineSeconds"),
                    limits::MIN_ACTIVE_DEADLINE_SECONDS,
                    limits::MAX_ACTIVE_DEADLINE_SECONDS,
                ));
            }
        }
    }
    errs
}

#[cfg(test)]
mod tests;
