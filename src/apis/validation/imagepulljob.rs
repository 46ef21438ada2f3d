//! ImagePullJob admission validation (upstream:
//! `pkg/webhook/imagepulljob/validating/imagepulljob_create_update_handler.go`).
//!
//! Rules:
//! - **update**: `spec.pullSecrets` is immutable.
//! - **selector**: `names` and a label selector not both; names unique; label selector valid.
//! - **podSelector**: not together with `selector`; valid.
//! - **image**: required, and a reference docker's grammar accepts ([`ImageRef::parse`]).
//! - **parallelism**: an integer (or a numeric string) ≥ 0; percentages are refused.
//! - **completionPolicy**: `Always` (the default): `activeDeadlineSeconds`, when set, at least
//!   `pullPolicy.timeoutSeconds` (default 600); `Never`: neither `activeDeadlineSeconds` nor
//!   `ttlSecondsAfterFinished`. (The type is an enum; [`validate_raw_enums`] reports an unknown
//!   one from the raw JSON.)
//!
//! Differences from upstream: every problem is reported, not only the first; upstream's feature
//! gates (`KruiseDaemon`, `ImagePullJobGate`) do not exist here; an update that leaves the spec
//! alone (finalizers, labels, annotations) is not re-validated, so a job admitted under older
//! rules can always lose its finalizer and be deleted.

use std::collections::HashSet;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{
    FieldError, ValidationErrors, check_raw_enum, index, validate_label_selector,
    validate_nonnegative, validate_selector_parts,
};
use crate::apis::imagepulljob::{CompletionPolicyType, ImagePullJob, ImagePullJobSpec};
use crate::image::ImageRef;

/// `pullPolicy.timeoutSeconds` when unset (upstream's default).
const DEFAULT_TIMEOUT_SECONDS: i64 = 600;

/// Validates an ImagePullJob being created.
pub fn validate_create(job: &ImagePullJob) -> Result<(), ValidationErrors> {
    ValidationErrors(validate_spec(&job.spec)).into_result()
}

/// Validates an update from `old` to `new`.
pub fn validate_update(old: &ImagePullJob, new: &ImagePullJob) -> Result<(), ValidationErrors> {
    let mut errs = Vec::new();
    if old.spec.pull_secrets != new.spec.pull_secrets {
        errs.push(FieldError::invalid_json(
            "spec.pullSecrets",
            &new.spec.pull_secrets,
            "field is immutable",
        ));
    }
    if old.spec != new.spec {
        errs.extend(validate_spec(&new.spec));
    }
    ValidationErrors(errs).into_result()
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
    let mut errs = Vec::new();

    if let Some(selector) = &spec.selector {
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
    if let Some(pod_selector) = &spec.pod_selector {
        if spec.selector.is_some() {
            errs.push(FieldError::forbidden(
                "spec.podSelector",
                "can not set both selector and podSelector",
            ));
        }
        errs.extend(validate_label_selector(pod_selector, "spec.podSelector"));
    }

    if spec.image.is_empty() {
        errs.push(FieldError::required("spec.image", "image can not be empty"));
    } else if let Err(e) = ImageRef::parse(&spec.image) {
        errs.push(FieldError::invalid(
            "spec.image",
            &spec.image,
            e.kind().to_string(),
        ));
    }

    if let Some(parallelism) = &spec.parallelism {
        errs.extend(validate_parallelism(parallelism));
    }

    let completion = &spec.completion_policy;
    match completion.type_.unwrap_or_default() {
        CompletionPolicyType::Always => {
            let timeout = spec
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
mod tests {
    use super::*;
    use crate::apis::defaults::default_imagepulljob;
    use crate::apis::validation::ErrorKind;
    use serde_json::{Value, json};

    fn job(spec: Value) -> ImagePullJob {
        let mut job = ImagePullJob::new("job", serde_json::from_value(spec).expect("test spec"));
        default_imagepulljob(&mut job);
        job
    }

    fn errors(r: Result<(), ValidationErrors>) -> Vec<String> {
        r.err()
            .map(|e| e.0.iter().map(ToString::to_string).collect())
            .unwrap_or_default()
    }

    fn create(spec: Value) -> Vec<String> {
        errors(validate_create(&job(spec)))
    }

    #[test]
    fn a_plain_job_is_valid() {
        assert_eq!(create(json!({"image": "nginx:1.25"})), Vec::<String>::new());
        assert_eq!(
            create(
                json!({"image": "127.0.0.1:5000/app@sha256:0000000000000000000000000000000000000000000000000000000000000000",
                "selector": {"names": ["node-a", "node-b"]}, "parallelism": 3,
                "completionPolicy": {"type": "Always", "activeDeadlineSeconds": 600, "ttlSecondsAfterFinished": 10}})
            ),
            Vec::<String>::new()
        );
    }

    /// Upstream's TestValidateParallelismV1beta1 table.
    #[test]
    fn upstream_parallelism_cases() {
        let cases = [
            (json!(5), None),
            (json!(0), None),
            (
                json!(-1),
                Some("spec.parallelism: Invalid value: -1: must be greater than or equal to 0"),
            ),
            (
                json!("50%"),
                Some(
                    r#"spec.parallelism: Invalid value: "50%": parallelism does not support percentage value"#,
                ),
            ),
            (json!("10"), None),
            (json!("0"), None),
            (
                json!("-5"),
                Some("spec.parallelism: Invalid value: -5: must be greater than or equal to 0"),
            ),
            (
                json!("abc"),
                Some(
                    r#"spec.parallelism: Invalid value: "abc": parallelism must be a valid integer: invalid digit found in string"#,
                ),
            ),
            (json!(null), None),
        ];
        for (parallelism, want) in cases {
            let got = create(json!({"image": "nginx", "parallelism": parallelism}));
            assert_eq!(
                got,
                want.map(|w| vec![w.to_owned()]).unwrap_or_default(),
                "{parallelism}"
            );
        }
    }

    /// Upstream's TestPullSecretsImmutability table.
    #[test]
    fn upstream_pull_secrets_immutability() {
        // `null` stands for "absent" (the apiserver drops nulls of non-nullable fields).
        let with_secrets = |secrets: Value| {
            if secrets.is_null() {
                job(json!({"image": "nginx"}))
            } else {
                job(json!({"image": "nginx", "pullSecrets": secrets}))
            }
        };
        assert_eq!(
            errors(validate_create(&with_secrets(json!(["a"])))),
            Vec::<String>::new()
        );
        let cases = [
            (json!(["a"]), json!(["a"]), true),
            (json!(["a"]), json!(["b"]), false),
            (json!(null), json!(["a"]), false),
            (json!(["a"]), json!(null), false),
            (json!(null), json!(null), true),
        ];
        for (old, new, allowed) in cases {
            let got = errors(validate_update(
                &with_secrets(old.clone()),
                &with_secrets(new.clone()),
            ));
            assert_eq!(got.is_empty(), allowed, "{old} -> {new}: {got:?}");
            if !allowed {
                assert!(
                    got[0].starts_with("spec.pullSecrets: Invalid value: ")
                        && got[0].ends_with("field is immutable"),
                    "{got:?}"
                );
            }
        }
    }

    #[test]
    fn selector_names_xor_labels_unique_names_valid_labels() {
        assert_eq!(
            create(
                json!({"image": "nginx", "selector": {"names": ["a"], "matchLabels": {"z": "1"}}})
            ),
            [
                "spec.selector: Forbidden: can not set both names and labelSelector in this spec.selector"
            ]
        );
        assert_eq!(
            create(json!({"image": "nginx", "selector": {"names": ["a", "b", "a"]}})),
            [r#"spec.selector.names[2]: Duplicate value: "a""#]
        );
        let errs = create(
            json!({"image": "nginx", "selector": {"matchExpressions": [{"key": "zone", "operator": "In"}]}}),
        );
        assert_eq!(
            errs,
            [
                "spec.selector.matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'"
            ]
        );
        assert_eq!(
            create(json!({"image": "nginx", "selector": {"matchLabels": {"zone": "z1"}}})),
            Vec::<String>::new()
        );
    }

    #[test]
    fn pod_selector_excludes_selector_and_must_be_valid() {
        assert_eq!(
            create(
                json!({"image": "nginx", "selector": {}, "podSelector": {"matchLabels": {"app": "web"}}})
            ),
            ["spec.podSelector: Forbidden: can not set both selector and podSelector"]
        );
        let errs =
            create(json!({"image": "nginx", "podSelector": {"matchLabels": {"app": "-web"}}}));
        assert_eq!(errs.len(), 1);
        assert!(
            errs[0].starts_with("spec.podSelector.matchLabels: Invalid value: \"-web\""),
            "{errs:?}"
        );
        assert_eq!(
            create(json!({"image": "nginx", "podSelector": {"matchLabels": {"app": "web"}}})),
            Vec::<String>::new()
        );
    }

    #[test]
    fn image_is_required_and_must_parse() {
        assert_eq!(
            create(json!({"image": ""})),
            ["spec.image: Required value: image can not be empty"]
        );
        let errs = create(json!({"image": "Nginx:latest"}));
        assert_eq!(errs.len(), 1);
        assert!(
            errs[0].starts_with(
                r#"spec.image: Invalid value: "Nginx:latest": repository name must be lowercase"#
            ),
            "{errs:?}"
        );
        assert_eq!(create(json!({"image": "nginx:bad tag"})).len(), 1);
    }

    #[test]
    fn always_deadline_must_cover_the_pull_timeout() {
        assert_eq!(
            create(json!({"image": "nginx", "completionPolicy": {"activeDeadlineSeconds": 599}})),
            [
                "spec.completionPolicy.activeDeadlineSeconds: Invalid value: 599: completionPolicy.activeDeadlineSeconds must be greater than pullPolicy.timeoutSeconds(600)"
            ]
        );
        assert_eq!(
            create(json!({"image": "nginx", "completionPolicy": {"activeDeadlineSeconds": 600}})),
            Vec::<String>::new()
        );
        assert_eq!(
            create(
                json!({"image": "nginx", "pullPolicy": {"timeoutSeconds": 30}, "completionPolicy": {"activeDeadlineSeconds": 60}})
            ),
            Vec::<String>::new()
        );
        assert_eq!(
            create(json!({"image": "nginx", "pullPolicy": {"timeoutSeconds": 120}, "completionPolicy": {"activeDeadlineSeconds": 60}})).len(),
            1
        );
        // Without defaulting, the timeout is upstream's 600 all the same.
        let raw = ImagePullJob::new(
            "j",
            serde_json::from_value(
                json!({"image": "nginx", "completionPolicy": {"activeDeadlineSeconds": 100}}),
            )
            .expect("spec"),
        );
        assert_eq!(errors(validate_create(&raw)).len(), 1);
    }

    #[test]
    fn never_jobs_have_no_deadline_and_no_ttl() {
        assert_eq!(
            create(json!({"image": "nginx", "completionPolicy": {"type": "Never"}})),
            Vec::<String>::new()
        );
        let errs = create(
            json!({"image": "nginx", "completionPolicy": {"type": "Never", "activeDeadlineSeconds": 1000, "ttlSecondsAfterFinished": 5}}),
        );
        assert_eq!(
            errs,
            [
                "spec.completionPolicy.activeDeadlineSeconds: Forbidden: activeDeadlineSeconds and ttlSecondsAfterFinished can only work with Always CompletionPolicyType",
                "spec.completionPolicy.ttlSecondsAfterFinished: Forbidden: activeDeadlineSeconds and ttlSecondsAfterFinished can only work with Always CompletionPolicyType",
            ]
        );
    }

    #[test]
    fn an_update_that_keeps_the_spec_is_not_revalidated() {
        // A job admitted under other rules can still lose its finalizer.
        let old = job(json!({"image": "Not Valid"}));
        let mut new = old.clone();
        new.metadata.finalizers = Some(vec![]);
        assert_eq!(errors(validate_update(&old, &new)), Vec::<String>::new());
        new.spec.parallelism = Some(IntOrString::Int(2));
        assert_eq!(errors(validate_update(&old, &new)).len(), 1);
    }

    #[test]
    fn raw_enums() {
        let errs = validate_raw_enums(&json!({"spec": {"image": "x", "completionPolicy": {"type": "Sometimes"}, "imagePullPolicy": "Never"}}))
            .expect_err("bad enums");
        assert_eq!(errs.len(), 2);
        assert_eq!(errs.0[0].kind, ErrorKind::NotSupported);
        assert_eq!(
            errs.0[1].to_string(),
            r#"spec.imagePullPolicy: Unsupported value: "Never": supported values: "Always", "IfNotPresent""#
        );
        assert!(validate_raw_enums(&json!({"spec": {"image": "x"}})).is_ok());
    }
}
