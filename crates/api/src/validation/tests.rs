use super::*;
use serde_json::json;

fn sel(v: serde_json::Value) -> LabelSelector {
    serde_json::from_value(v).expect("test selector")
}

fn paths(errs: &[FieldError]) -> Vec<&str> {
    errs.iter().map(|e| e.path.as_str()).collect()
}

// --- Display ---

#[test]
fn not_supported_reads_like_kubernetes() {
    let e = FieldError::not_supported(
        "spec.containers[1].podInjectPolicy",
        "X",
        &["BeforeAppContainer", "AfterAppContainer"],
    );
    assert_eq!(
        e.to_string(),
        r#"spec.containers[1].podInjectPolicy: Unsupported value: "X": supported values: "BeforeAppContainer", "AfterAppContainer""#
    );
}

#[test]
fn each_kind_renders_as_kubernetes_does() {
    let cases = [
        (
            FieldError::required("spec.selector", ""),
            "spec.selector: Required value",
        ),
        (
            FieldError::required("spec.selector", "no selector"),
            "spec.selector: Required value: no selector",
        ),
        (
            FieldError::invalid("metadata.name", "A", "bad"),
            r#"metadata.name: Invalid value: "A": bad"#,
        ),
        (
            FieldError::invalid_int("spec.parallelism", -1, "must be greater than or equal to 0"),
            "spec.parallelism: Invalid value: -1: must be greater than or equal to 0",
        ),
        (
            FieldError::invalid_json("spec.selector", &json!({}), "empty"),
            "spec.selector: Invalid value: {}: empty",
        ),
        (
            FieldError::duplicate("spec.containers[1].name", "a"),
            r#"spec.containers[1].name: Duplicate value: "a""#,
        ),
        (
            FieldError::forbidden("spec.podSelector", "not with selector"),
            "spec.podSelector: Forbidden: not with selector",
        ),
        (
            FieldError::not_found("spec.x", "y", ""),
            r#"spec.x: Not found: "y""#,
        ),
        (
            FieldError::too_long("metadata.annotations", 262144),
            "metadata.annotations: Too long: may not be more than 262144 bytes",
        ),
        (
            FieldError::too_many("spec.images", 257, 256),
            "spec.images: Too many: 257: must have at most 256 items",
        ),
    ];
    for (error, want) in cases {
        assert_eq!(error.to_string(), want);
    }
}

#[test]
fn a_huge_value_is_cut_in_messages() {
    let long = "a".repeat(1000);
    let shown = quote(&long);
    assert!(shown.ends_with('…') && shown.len() < 300, "{shown}");
    assert_eq!(quote("a\"b"), r#""a\"b""#);
}

#[test]
fn errors_aggregate_like_kubernetes() {
    let one = ValidationErrors(vec![FieldError::required("a", "")]);
    assert_eq!(one.to_string(), "a: Required value");
    let two = ValidationErrors(vec![
        FieldError::required("a", ""),
        FieldError::forbidden("b", "no"),
        FieldError::required("a", ""),
    ]);
    assert_eq!(two.to_string(), "[a: Required value, b: Forbidden: no]");
    assert_eq!(two.len(), 3);
    assert!(ValidationErrors::default().into_result().is_ok());
    assert_eq!(two.clone().into_result(), Err(two));
}

#[test]
fn paths_compose() {
    assert_eq!(child("", "spec"), "spec");
    assert_eq!(index(&child("spec", "containers"), 2), "spec.containers[2]");
    assert_eq!(
        key("metadata.annotations", "a/b"),
        "metadata.annotations[a/b]"
    );
}

// --- Names ---

#[test]
fn dns1123_labels() {
    // The double space before "or" is Kubernetes' own wording, kept so messages match.
    for ok in ["a", "my-name", "123", "a1-b2", &"a".repeat(63)] {
        assert!(dns1123_label_errors(ok).is_empty(), "{ok}");
    }
    assert_eq!(
        dns1123_label_errors("My-name"),
        [
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
        ]
    );
    assert_eq!(dns1123_label_errors("a.b"), ["must not contain dots"]);
    assert_eq!(
        dns1123_label_errors(&"a".repeat(64)),
        ["must be no more than 63 characters"]
    );
    for bad in ["", "-a", "a-", "a_b", "ä"] {
        assert_eq!(dns1123_label_errors(bad).len(), 1, "{bad}");
    }
}

#[test]
fn dns1123_subdomains() {
    assert!(dns1123_subdomain_errors("example.com").is_empty());
    assert!(dns1123_subdomain_errors("a").is_empty());
    for bad in ["", "a..b", ".a", "a.", "Example.com", "a_b.c"] {
        let errs = dns1123_subdomain_errors(bad);
        assert_eq!(errs.len(), 1, "{bad}");
        assert!(errs[0].contains("RFC 1123 subdomain"), "{errs:?}");
    }
    let long = format!("{}.{}", "a".repeat(63), "b".repeat(190));
    assert_eq!(
        dns1123_subdomain_errors(&long),
        ["must be no more than 253 characters"]
    );
}

#[test]
fn qualified_names() {
    for ok in ["a", "A_b.c-D", "example.com/a", "kruise.io/sidecarset-hash"] {
        assert!(qualified_name_errors(ok).is_empty(), "{ok}");
    }
    assert_eq!(
        qualified_name_errors("/a"),
        ["prefix part must be non-empty"]
    );
    let errs = qualified_name_errors("a/");
    assert_eq!(errs[0], "name part must be non-empty");
    assert!(errs[1].starts_with("name part must consist of alphanumeric"));
    assert!(qualified_name_errors("a/b/c")[0].starts_with("a qualified name must consist"));
    assert!(
        qualified_name_errors("Example.com/a")[0]
            .starts_with("prefix part a lowercase RFC 1123 subdomain")
    );
    assert_eq!(
        qualified_name_errors(&"a".repeat(64)),
        ["name part must be no more than 63 characters"]
    );
    assert_eq!(qualified_name_errors("-a").len(), 1);
    assert_eq!(qualified_name_errors("a b").len(), 1);
}

#[test]
fn label_values() {
    for ok in ["", "a", "my_value", "1.2-3"] {
        assert!(label_value_errors(ok).is_empty(), "{ok}");
    }
    assert!(label_value_errors("-a")[0].starts_with("a valid label must be an empty string"));
    assert_eq!(
        label_value_errors(&"a".repeat(64)),
        ["must be no more than 63 characters"]
    );
}

#[test]
fn labels_and_annotations() {
    let labels = BTreeMap::from([
        ("good".to_owned(), "v".to_owned()),
        ("bad key".to_owned(), "bad value!".to_owned()),
    ]);
    let errs = validate_labels(&labels, "metadata.labels");
    assert_eq!(errs.len(), 2);
    assert_eq!(paths(&errs), ["metadata.labels", "metadata.labels"]);
    assert_eq!(errs[0].value.as_deref(), Some(r#""bad key""#));
    assert_eq!(errs[1].value.as_deref(), Some(r#""bad value!""#));

    // Annotation keys are case-insensitive; values are free.
    let annotations = BTreeMap::from([("Example.COM/Key".to_owned(), "any value !".to_owned())]);
    assert!(validate_annotations(&annotations, "a").is_empty());
    let bad = BTreeMap::from([("a//b".to_owned(), String::new())]);
    assert_eq!(validate_annotations(&bad, "a").len(), 1);
    let huge = BTreeMap::from([("k".to_owned(), "x".repeat(TOTAL_ANNOTATION_SIZE_LIMIT))]);
    let errs = validate_annotations(&huge, "metadata.annotations");
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].kind, ErrorKind::TooLong);
}

// --- Selectors ---

#[test]
fn a_valid_selector_has_no_errors() {
    let s = sel(json!({
        "matchLabels": {"app": "web"},
        "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["a", "b"]},
            {"key": "x", "operator": "Exists"}
        ]
    }));
    assert!(validate_label_selector(&s, "spec.selector").is_empty());
}

#[test]
fn selector_requirements_are_checked_as_kubernetes_does() {
    let s = sel(json!({
        "matchLabels": {"bad key": "v"},
        "matchExpressions": [
            {"key": "a", "operator": "In"},
            {"key": "b", "operator": "Exists", "values": ["x"]},
            {"key": "c", "operator": "Near", "values": ["x"]},
            {"key": "d", "operator": "NotIn", "values": ["ok", "app-risk-"]},
            {"key": "-e", "operator": "DoesNotExist"}
        ]
    }));
    let errs = validate_label_selector(&s, "spec.selector");
    assert_eq!(
        paths(&errs),
        [
            "spec.selector.matchLabels",
            "spec.selector.matchExpressions[0].values",
            "spec.selector.matchExpressions[1].values",
            "spec.selector.matchExpressions[2].operator",
            "spec.selector.matchExpressions[3].values[1]",
            "spec.selector.matchExpressions[4].key",
        ]
    );
    assert_eq!(
        errs[1].to_string(),
        "spec.selector.matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'"
    );
    assert_eq!(errs[2].kind, ErrorKind::Forbidden);
    assert_eq!(
        errs[3].to_string(),
        r#"spec.selector.matchExpressions[2].operator: Unsupported value: "Near": supported values: "In", "NotIn", "Exists", "DoesNotExist""#
    );
}

#[test]
fn empty_selectors() {
    assert!(selector_is_empty(&sel(json!({}))));
    assert!(selector_is_empty(&sel(
        json!({"matchLabels": {}, "matchExpressions": []})
    )));
    assert!(!selector_is_empty(&sel(json!({"matchLabels": {"a": "b"}}))));
}

#[test]
fn int_or_percent() {
    for ok in [
        IntOrString::Int(0),
        IntOrString::Int(5),
        IntOrString::String("0%".into()),
        IntOrString::String("20%".into()),
        IntOrString::String("150%".into()),
    ] {
        assert!(validate_int_or_percent(&ok, "p").is_empty(), "{ok:?}");
    }
    assert_eq!(
        validate_int_or_percent(&IntOrString::Int(-1), "spec.updateStrategy.partition")[0]
            .to_string(),
        "spec.updateStrategy.partition: Invalid value: -1: must be greater than or equal to 0"
    );
    for bad in ["5", "%", "a%", "-5%", "5 %"] {
        let errs = validate_int_or_percent(&IntOrString::String(bad.into()), "p");
        assert_eq!(errs.len(), 1, "{bad}");
        assert!(errs[0].message.starts_with("a valid percent string"));
    }
}

// --- Overlap: upstream's TestSelectorConflict, then the two fixes ---

#[test]
fn upstream_selector_conflict_cases() {
    let cases = [
        (
            json!({"matchLabels": {"a": "h"}}),
            json!({"matchLabels": {"a": "h"}}),
            true,
        ),
        (
            json!({"matchLabels": {"a": "h"}}),
            json!({"matchLabels": {"a": "i"}}),
            false,
        ),
        (
            json!({"matchLabels": {"a": "h"}}),
            json!({"matchLabels": {"b": "i"}}),
            true,
        ),
        (
            json!({"matchLabels": {"a": "h", "b": "i", "c": "j"}}),
            json!({"matchLabels": {"a": "h", "b": "x", "c": "j"}}),
            false,
        ),
        (
            json!({"matchLabels": {"a": "h"}}),
            json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["h", "i", "j"]}]}),
            true,
        ),
        (
            json!({"matchLabels": {"a": "h"}}),
            json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["i", "j"]}]}),
            false,
        ),
        (
            json!({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["h", "i"]}]}),
            json!({"matchLabels": {"a": "h"}}),
            false,
        ),
        (
            json!({"matchLabels": {"a": "h"}}),
            json!({"matchExpressions": [{"key": "a", "operator": "Exists"}]}),
            true,
        ),
        (
            json!({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}),
            json!({"matchLabels": {"a": "h"}}),
            false,
        ),
    ];
    for (i, (a, b, want)) in cases.into_iter().enumerate() {
        let (a, b) = (sel(a), sel(b));
        assert_eq!(is_selector_overlapping(&a, &b), want, "case {i}");
        assert_eq!(is_selector_overlapping(&b, &a), want, "case {i} swapped");
    }
}

#[test]
fn exists_on_an_unmentioned_key_overlaps() {
    // Upstream calls these disjoint, though a pod labelled a=x,b=c matches both.
    let a = sel(json!({"matchExpressions": [{"key": "a", "operator": "Exists"}]}));
    let b = sel(json!({"matchLabels": {"b": "c"}}));
    assert!(is_selector_overlapping(&a, &b));
    assert!(is_selector_overlapping(&b, &a));
}

#[test]
fn the_label_value_all_is_a_value_not_a_wildcard() {
    // Upstream's "ALL" marker makes `a In [ALL]` match `a=b`.
    let a = sel(json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["ALL"]}]}));
    let b = sel(json!({"matchLabels": {"a": "b"}}));
    assert!(!is_selector_overlapping(&a, &b));
    let c = sel(json!({"matchLabels": {"a": "ALL"}}));
    assert!(is_selector_overlapping(&a, &c));
}

#[test]
fn more_overlap_cases() {
    let exists = sel(json!({"matchExpressions": [{"key": "a", "operator": "Exists"}]}));
    let not_exists = sel(json!({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}));
    let not_in =
        sel(json!({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["x"]}]}));
    assert!(!is_selector_overlapping(&exists, &not_exists));
    assert!(is_selector_overlapping(&exists, &not_in));
    assert!(is_selector_overlapping(&not_in, &not_exists));
    assert!(is_selector_overlapping(&sel(json!({})), &exists));
    let in_xy =
        sel(json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["x", "y"]}]}));
    let not_in_xy = sel(
        json!({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["y", "x", "z"]}]}),
    );
    assert!(!is_selector_overlapping(&in_xy, &not_in_xy));
    assert!(is_selector_overlapping(&in_xy, &not_in));
}

// --- Raw enums ---

#[test]
fn raw_enums_walk_lists_and_maps() {
    let raw = json!({
        "spec": {
            "containers": [
                {"name": "a", "podInjectPolicy": "BeforeAppContainer"},
                {"name": "b", "podInjectPolicy": "X"},
                {"name": "c", "podInjectPolicy": null},
                {"name": "d", "podInjectPolicy": 3}
            ],
            "images": {"nginx": {"tags": [{"imagePullPolicy": "Sometimes"}]}}
        }
    });
    let errs = check_raw_enum(
        &raw,
        "spec.containers[*].podInjectPolicy",
        &["BeforeAppContainer", "AfterAppContainer"],
    );
    assert_eq!(errs.len(), 2);
    assert_eq!(
        errs[0].to_string(),
        r#"spec.containers[1].podInjectPolicy: Unsupported value: "X": supported values: "BeforeAppContainer", "AfterAppContainer""#
    );
    assert_eq!(
        errs[1].to_string(),
        "spec.containers[3].podInjectPolicy: Invalid value: 3: must be a string"
    );
    let errs = check_raw_enum(&raw, "spec.images{*}.tags[*].imagePullPolicy", &["Always"]);
    assert_eq!(paths(&errs), ["spec.images[nginx].tags[0].imagePullPolicy"]);
    assert!(check_raw_enum(&json!({}), "spec.x[*].y", &["a"]).is_empty());
    assert!(check_raw_enum(&json!({"spec": {"x": "notalist"}}), "spec.x[*].y", &["a"]).is_empty());
}
