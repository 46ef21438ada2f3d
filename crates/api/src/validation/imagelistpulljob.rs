//! ImageListPullJob admission validation (upstream:
//! `pkg/webhook/imagelistpulljob/validating/imagelistpulljob_create_update_handler.go`).
//!
//! Rules:
//! - **images**: at least one, at most `MAX_IMAGES`, each once, each a reference docker's
//!   grammar accepts ([`ImageRef::parse`]); a denial names the entry (`spec.images[2]`).
//! - **pullSecrets**: at most [`crate::limits::MAX_PULL_SECRETS`], as an ImagePullJob's.
//! - **the template** (selector, podSelector, parallelism, completionPolicy): the ImagePullJob
//!   rules (`validate_template`), since each image's ImagePullJob is the template plus the
//!   image and must pass them too.
//!
//! Differences from upstream: every problem is reported, not only the first; `Always` also checks
//! `activeDeadlineSeconds` against `pullPolicy.timeoutSeconds` as an ImagePullJob does (upstream
//! admits such a list, whose ImagePullJobs its own webhook then refuses); an update that leaves
//! the spec alone (labels, finalizers) is not re-validated.

use std::collections::HashSet;

use super::imagepulljob::{validate_pull_secrets, validate_template};
use super::{FieldError, ValidationErrors, index};
use crate::image::ImageRef;
use crate::imagelistpulljob::{ImageListPullJob, ImageListPullJobSpec};

pub use super::imagepulljob::validate_raw_enums;

/// The most images one list may name (upstream's limit).
pub(crate) const MAX_IMAGES: usize = 255;

/// Validates an ImageListPullJob being created.
pub fn validate_create(job: &ImageListPullJob) -> Result<(), ValidationErrors> {
    let mut errs = validate_pull_secrets(&job.spec.template.pull_secrets, None);
    errs.extend(validate_spec(&job.spec));
    ValidationErrors(errs).into_result()
}

/// Validates an update from `old` to `new`.
pub fn validate_update(
    old: &ImageListPullJob,
    new: &ImageListPullJob,
) -> Result<(), ValidationErrors> {
    if old.spec == new.spec {
        return Ok(());
    }
    let mut errs = validate_pull_secrets(
        &new.spec.template.pull_secrets,
        Some(&old.spec.template.pull_secrets),
    );
    errs.extend(validate_spec(&new.spec));
    ValidationErrors(errs).into_result()
}

fn validate_spec(spec: &ImageListPullJobSpec) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if spec.images.is_empty() {
        errs.push(FieldError::required(
            "spec.images",
            "images can not be empty",
        ));
    } else if spec.images.len() > MAX_IMAGES {
        errs.push(FieldError::too_many(
            "spec.images",
            spec.images.len(),
            MAX_IMAGES,
        ));
    }
    let mut seen = HashSet::new();
    for (i, image) in spec.images.iter().enumerate() {
        let path = index("spec.images", i);
        if image.is_empty() {
            errs.push(FieldError::required(path, "image can not be empty"));
        } else if !seen.insert(image.as_str()) {
            errs.push(FieldError::duplicate(path, image));
        } else if let Err(e) = ImageRef::parse(image) {
            errs.push(FieldError::invalid(path, image, e.kind().to_string()));
        }
    }
    errs.extend(validate_template(&spec.template));
    errs
}

#[cfg(test)]
mod tests;
