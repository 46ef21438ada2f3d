use super::*;
use crate::defaults::default_imagepulljob;
use crate::validation::ErrorKind;
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
        create(json!({"image": "nginx", "selector": {"names": ["a"], "matchLabels": {"z": "1"}}})),
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
    let errs = create(json!({"image": "nginx", "podSelector": {"matchLabels": {"app": "-web"}}}));
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
    new.spec.template.parallelism = Some(IntOrString::Int(2));
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

#[test]
fn durations_and_counts_are_bounded() {
    // At the bounds: accepted.
    assert_eq!(
        create(
            json!({"image": "nginx", "pullPolicy": {"timeoutSeconds": 86400, "backoffLimit": 1000},
            "completionPolicy": {"activeDeadlineSeconds": 31_536_000, "ttlSecondsAfterFinished": 31_536_000}})
        ),
        Vec::<String>::new()
    );
    assert_eq!(
        create(
            json!({"image": "nginx", "pullPolicy": {"timeoutSeconds": 1, "backoffLimit": 0},
            "completionPolicy": {"activeDeadlineSeconds": 1, "ttlSecondsAfterFinished": 0}})
        ),
        Vec::<String>::new()
    );
    // Beyond them: each field named.
    assert_eq!(
        create(
            json!({"image": "nginx", "pullPolicy": {"timeoutSeconds": 86401, "backoffLimit": -1},
            "completionPolicy": {"activeDeadlineSeconds": i64::MAX, "ttlSecondsAfterFinished": -1}})
        ),
        [
            "spec.pullPolicy.timeoutSeconds: Invalid value: 86401: must be between 1 and 86400, inclusive",
            "spec.pullPolicy.backoffLimit: Invalid value: -1: must be between 0 and 1000, inclusive",
            "spec.completionPolicy.activeDeadlineSeconds: Invalid value: 9223372036854775807: must be between 1 and 31536000, inclusive",
            "spec.completionPolicy.ttlSecondsAfterFinished: Invalid value: -1: must be between 0 and 31536000, inclusive",
        ]
    );
    assert_eq!(
        create(
            json!({"image": "nginx", "pullPolicy": {"timeoutSeconds": 0, "backoffLimit": 1001}})
        ),
        [
            "spec.pullPolicy.timeoutSeconds: Invalid value: 0: must be between 1 and 86400, inclusive",
            "spec.pullPolicy.backoffLimit: Invalid value: 1001: must be between 0 and 1000, inclusive",
        ]
    );
}

fn secrets(n: usize) -> Value {
    json!((0..n).map(|i| format!("s{i}")).collect::<Vec<_>>())
}

/// Issue 42: the webhook asks one SubjectAccessReview per pull Secret within its timeout, so
/// their number is bounded, and a denial names the field.
#[test]
fn at_most_sixteen_pull_secrets() {
    assert_eq!(limits::MAX_PULL_SECRETS, 16);
    assert_eq!(
        create(json!({"image": "nginx", "pullSecrets": secrets(16)})),
        Vec::<String>::new()
    );
    assert_eq!(
        create(json!({"image": "nginx", "pullSecrets": secrets(17)})),
        ["spec.pullSecrets: Too many: 17: must have at most 16 items"]
    );
    // A job stored before the bound can still be edited; changing its Secrets is refused anyway.
    let old = job(json!({"image": "nginx", "pullSecrets": secrets(17)}));
    let mut edited = old.clone();
    edited.spec.template.parallelism = Some(IntOrString::Int(2));
    assert_eq!(errors(validate_update(&old, &edited)), Vec::<String>::new());
}

#[test]
fn a_uid_pin_annotation_must_parse_when_set_or_changed() {
    let pinned = |value: &str| {
        let mut j = job(json!({"image": "nginx:1.25", "pullSecrets": ["reg"]}));
        j.annotations_mut()
            .insert(PULL_SECRET_UIDS.to_owned(), value.to_owned());
        j
    };
    assert!(errors(validate_create(&pinned("reg=u1"))).is_empty());
    let bad = errors(validate_create(&pinned("reg")));
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(
        bad[0].starts_with("metadata.annotations[kruise-rs.io/pull-secret-uids]: Invalid value"),
        "{bad:?}"
    );
    assert_eq!(
        errors(validate_update(&pinned("reg=u1"), &pinned("reg=u1,"))),
        Vec::<String>::new()
    );
    assert_eq!(
        errors(validate_update(&pinned("reg=u1"), &pinned("reg=u1=u2"))).len(),
        1
    );
    // Left alone, an old bad value does not block other edits (the finalizer coming off).
    let mut without_finalizer = pinned("junk");
    without_finalizer.metadata.finalizers = Some(Vec::new());
    assert!(errors(validate_update(&pinned("junk"), &without_finalizer)).is_empty());
}

#[test]
fn the_registry_budget_annotation_is_a_positive_integer() {
    let with = |value: &str| {
        let mut j = job(json!({"image": "nginx:1.25"}));
        j.metadata.annotations =
            Some([(MAX_PULLS_PER_REGISTRY.to_owned(), value.to_owned())].into());
        j
    };
    assert_eq!(errors(validate_create(&with("3"))), Vec::<String>::new());
    for bad in ["0", "-2", "x", ""] {
        let errs = errors(validate_create(&with(bad)));
        assert_eq!(errs.len(), 1, "{bad:?}: {errs:?}");
        assert!(
            errs[0].contains("metadata.annotations[kruise-rs.io/max-pulls-per-registry]")
                && errs[0].contains("positive integer"),
            "{errs:?}"
        );
    }
    // An update that leaves a bad value (written before the webhook checked it) as it was is
    // not refused for it; one that sets it is.
    assert_eq!(
        errors(validate_update(&with("0"), &with("0"))),
        Vec::<String>::new()
    );
    assert_eq!(errors(validate_update(&with("3"), &with("0"))).len(), 1);
}
