//! ImagePullJob admission validation (upstream:
//! `pkg/webhook/imagepulljob/validating/imagepulljob_create_update_handler.go`).
//!
//! Rules:
//! - **update**: `spec.pullSecrets` is immutable.
//! - **`kruise-rs.io/pull-secret-uids`**: `name=uid` entries, when set or changed (decision 0029).
//! - **pullSecrets**: at most [`limits::MAX_PULL_SECRETS`] (`validate_pull_secrets`): the
//!   webhook asks one SubjectAccessReview per Secret within its timeout (ours; upstream has no
//!   bound).
//! - **selector**: `names` and a label selector not both; names unique; label selector valid.
//! - **podSelector**: not together with `selector`; valid.
//! - **image**: required, and a reference docker's grammar accepts ([`ImageRef::parse`]).
//! - **parallelism**: an integer (or a numeric string) ≥ 0; percentages are refused.
//! - **pullPolicy**: `timeoutSeconds` 1 to 86400, `backoffLimit` 0 to 1000 ([`limits`]).
//! - **completionPolicy**: `Always` (the default): `activeDeadlineSeconds`, when set, at least
//!   `pullPolicy.timeoutSeconds` (default 600) and 1 to 365 days, `ttlSecondsAfterFinished` 0
//!   to 365 days; `Never`: neither `activeDeadlineSeconds` nor `ttlSecondsAfterFinished`. (The type is an enum; [`validate_raw_enums`] reports an unknown
//!   one from the raw JSON.)
//!
//! Differences from upstream: every problem is reported, not only the first; the bounds on
//! durations and counts are ours (upstream has none, and reads a negative `backoffLimit` as 3:
//! decision 0019); upstream's feature
//! gates (`KruiseDaemon`, `ImagePullJobGate`) do not exist here; an update that leaves the spec
//! alone (finalizers, labels, annotations) is not re-validated, so a job admitted under older
//! rules can always lose its finalizer and be deleted.

use std::collections::HashSet;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::{
    FieldError, ValidationErrors, check_raw_enum, index, validate_label_selector,
    validate_max_items, validate_nonnegative, validate_range, validate_selector_parts,
};
use crate::image::ImageRef;
use crate::imagepulljob::{
    CompletionPolicyType, ImagePullJob, ImagePullJobSpec, ImagePullJobTemplate,
};
use crate::limits;
use crate::pull_secret_pins;
use crate::well_known::{MAX_PULLS_PER_REGISTRY, PULL_SECRET_UIDS};
use std::collections::BTreeMap;

/// `pullPolicy.timeoutSeconds` when unset (upstream's default).
const DEFAULT_TIMEOUT_SECONDS: i64 = 600;

/// Validates an ImagePullJob being created.
pub fn validate_create(job: &ImagePullJob) -> Result<(), ValidationErrors> {
    let mut errs = validate_pull_secrets(&job.spec.template.pull_secrets, None);
    errs.extend(pull_secret_pins::validate(job.annotations()));
    errs.extend(validate_max_pulls_per_registry(job.annotations()));
    errs.extend(validate_spec(&job.spec));
    ValidationErrors(errs).into_result()
}

/// `kruise-rs.io/max-pulls-per-registry`, when set, is a positive integer.
fn validate_max_pulls_per_registry(annotations: &BTreeMap<String, String>) -> Vec<FieldError> {
    match crate::imagepulljob::max_pulls_per_registry(annotations) {
        Err(message) => vec![FieldError::invalid(
            super::key("metadata.annotations", MAX_PULLS_PER_REGISTRY),
            annotations
                .get(MAX_PULLS_PER_REGISTRY)
                .map(String::as_str)
                .unwrap_or_default(),
            message,
        )],
        Ok(_) => Vec::new(),
    }
}

/// Validates an update from `old` to `new`.
pub fn validate_update(old: &ImagePullJob, new: &ImagePullJob) -> Result<(), ValidationErrors> {
    let mut errs = Vec::new();
    if old.spec.template.pull_secrets != new.spec.template.pull_secrets {
        errs.push(FieldError::invalid_json(
            "spec.pullSecrets",
            &new.spec.template.pull_secrets,
            "field is immutable",
        ));
        errs.extend(validate_pull_secrets(
            &new.spec.template.pull_secrets,
            Some(&old.spec.template.pull_secrets),
        ));
    }
    if old.spec != new.spec {
        errs.extend(validate_spec(&new.spec));
    }
    if old.annotations().get(PULL_SECRET_UIDS) != new.annotations().get(PULL_SECRET_UIDS) {
        errs.extend(pull_secret_pins::validate(new.annotations()));
    }
    if old.annotations().get(MAX_PULLS_PER_REGISTRY)
        != new.annotations().get(MAX_PULLS_PER_REGISTRY)
    {
        errs.extend(validate_max_pulls_per_registry(new.annotations()));
    }
    ValidationErrors(errs).into_result()
}

/// `spec.pullSecrets` (an ImagePullJob's or an ImageListPullJob's) names at most
/// [`limits::MAX_PULL_SECRETS`] Secrets, when new or changed from `old`.
pub(crate) fn validate_pull_secrets(
    pull_secrets: &[String],
    old: Option<&[String]>,
) -> Vec<FieldError> {
    validate_max_items(
        pull_secrets,
        old,
        "spec.pullSecrets",
        limits::MAX_PULL_SECRETS,
    )
}

/// Reports, from an ImagePullJob's raw JSON, enum fields the typed struct cannot hold.
pub fn validate_raw_enums(raw: &serde_json::Value) -> Result<(), ValidationErrors> {
    let mut errs = check_raw_enum(raw, "spec.completionPolicy.type", &["Always", "Never"]);
    errs.extend(check_raw_enum(
        raw,
        "spec.imagePullPolicy",
        &["Always", "IfNotPresent"],
    ));
    ValidationErrors(errs).into_result()
}

fn validate_spec(spec: &ImagePullJobSpec) -> Vec<FieldError> {
    let mut errs = validate_template(&spec.template);
    if spec.image.is_empty() {
        errs.push(FieldError::required("spec.image", "image can not be empty"));
    } else if let Err(e) = ImageRef::parse(&spec.image) {
        errs.push(FieldError::invalid(
            "spec.image",
            &spec.image,
            e.kind().to_string(),
        ));
    }
    errs
}

/// The rules on everything but the image: `selector`, `podSelector`, `parallelism` and
/// `completionPolicy`, with paths under `spec` (an ImageListPullJob's template is inline in
/// its spec, so its paths are the same).
pub(crate) fn validate_template(template: &ImagePullJobTemplate) -> Vec<FieldError> {
    let mut errs = Vec::new();

    if let Some(selector) = &template.selector {
        let has_labels = selector.match_labels.is_some() || selector.match_expressions.is_some();
        if has_labels && !selector.names.is_empty() {
            errs.push(FieldError::forbidden(
                "spec.selector",
                "can not set both names and labelSelector in this spec.selector",
            ));
        }
        let mut seen = HashSet::new();
        for (i, name) in selector.names.iter().enumerate() {
            if !seen.insert(name.as_str()) {
                errs.push(FieldError::duplicate(index("spec.selector.names", i), name));
            }
        }
        errs.extend(validate_selector_parts(
            selector.match_labels.as_ref(),
            selector.match_expressions.as_deref(),
            "spec.selector",
        ));
    }
    if let Some(pod_selector) = &template.pod_selector {
        if template.selector.is_some() {
            errs.push(FieldError::forbidden(
                "spec.podSelector",
                "can not set both selector and podSelector",
            ));
        }
        errs.extend(validate_label_selector(pod_selector, "spec.podSelector"));
    }

    if let Some(parallelism) = &template.parallelism {
        errs.extend(validate_parallelism(parallelism));
    }
    if let Some(policy) = &template.pull_policy {
        errs.extend(validate_pull_policy(
            policy.timeout_seconds,
            policy.backoff_limit,
            "spec.pullPolicy",
        ));
    }

    let completion = &template.completion_policy;
    match completion.type_.unwrap_or_default() {
        CompletionPolicyType::Always => {
            let timeout = template
                .pull_policy
                .as_ref()
                .and_then(|p| p.timeout_seconds)
                .map_or(DEFAULT_TIMEOUT_SECONDS, i64::from);
            if let Some(deadline) = completion.active_deadline_seconds
                && deadline < timeout
            {
                errs.push(FieldError::invalid_int(
                    "spec.completionPolicy.activeDeadlineSeconds",
                    deadline,
                    format!(
                        "completionPolicy.activeDeadlineSeconds must be greater than pullPolicy.timeoutSeconds({timeout})"
                    ),
                ));
            }
            if let Some(deadline) = completion.active_deadline_seconds {
                errs.extend(validate_range(
                    deadline,
                    "spec.completionPolicy.activeDeadlineSeconds",
                    limits::MIN_ACTIVE_DEADLINE_SECONDS,
                    limits::MAX_ACTIVE_DEADLINE_SECONDS,
                ));
            }
            if let Some(ttl) = completion.ttl_seconds_after_finished {
                errs.extend(validate_range(
                    ttl.into(),
                    "spec.completionPolicy.ttlSecondsAfterFinished",
                    limits::MIN_TTL_SECONDS.into(),
                    limits::MAX_JOB_TTL_SECONDS.into(),
                ));
            }
        }
        CompletionPolicyType::Never => {
            let message = "activeDeadlineSeconds and ttlSecondsAfterFinished can only work with Always CompletionPolicyType";
            if completion.active_deadline_seconds.is_some() {
                errs.push(FieldError::forbidden(
                    "spec.completionPolicy.activeDeadlineSeconds",
                    message,
                ));
            }
            if completion.ttl_seconds_after_finished.is_some() {
                errs.push(FieldError::forbidden(
                    "spec.completionPolicy.ttlSecondsAfterFinished",
                    message,
                ));
            }
        }
    }
    errs
}

/// `timeoutSeconds` and `backoffLimit` within [`limits`], under `path` (a job's
/// `spec.pullPolicy`, a NodeImage tag's `pullPolicy`).
pub(crate) fn validate_pull_policy(
    timeout_seconds: Option<i32>,
    backoff_limit: Option<i32>,
    path: &str,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(timeout) = timeout_seconds {
        errs.extend(validate_range(
            timeout.into(),
            &format!("{path}.timeoutSeconds"),
            limits::MIN_TIMEOUT_SECONDS.into(),
            limits::MAX_TIMEOUT_SECONDS.into(),
        ));
    }
    if let Some(limit) = backoff_limit {
        errs.extend(validate_range(
            limit.into(),
            &format!("{path}.backoffLimit"),
            limits::MIN_BACKOFF_LIMIT.into(),
            limits::MAX_BACKOFF_LIMIT.into(),
        ));
    }
    errs
}

/// Upstream's rule: an integer, or a string holding one (Go's `ParseInt(s, 10, 32)`, which
/// accepts a sign), never negative; a percentage is refused because a job has no natural total.
fn validate_parallelism(parallelism: &IntOrString) -> Vec<FieldError> {
    let path = "spec.parallelism";
    match parallelism {
        IntOrString::Int(i) => validate_nonnegative(i64::from(*i), path),
        IntOrString::String(s) if s.ends_with('%') => vec![FieldError::invalid(
            path,
            s,
            "parallelism does not support percentage value",
        )],
        IntOrString::String(s) => match s.parse::<i32>() {
            Ok(i) => validate_nonnegative(i64::from(i), path),
            Err(e) => vec![FieldError::invalid(
                path,
                s,
                format!("parallelism must be a valid integer: {e}"),
            )],
        },
    }
}

#[cfg(test)]
mod tests;
