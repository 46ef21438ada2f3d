use super::*;

fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn patch(
    policy: Option<SidecarSetPatchPolicy>,
    pairs: &[(&str, &str)],
) -> SidecarSetPatchPodMetadata {
    SidecarSetPatchPodMetadata {
        annotations: annotations(pairs),
        patch_policy: policy,
    }
}

// Upstream TestPatchPodMetadata, case by case.

#[test]
fn adds_missing_annotations() {
    let mut a = BTreeMap::new();
    let changed = patch_pod_metadata(
        &mut a,
        &[
            patch(Some(SidecarSetPatchPolicy::Retain), &[("key1", "value1")]),
            patch(
                Some(SidecarSetPatchPolicy::Overwrite),
                &[("key2", "value2")],
            ),
        ],
    )
    .expect("ok");
    assert!(changed);
    assert_eq!(a, annotations(&[("key1", "value1"), ("key2", "value2")]));
}

#[test]
fn retain_keeps_and_overwrite_replaces_existing_values() {
    let mut a = annotations(&[("key1", "old"), ("key2", "old")]);
    patch_pod_metadata(
        &mut a,
        &[
            patch(Some(SidecarSetPatchPolicy::Retain), &[("key1", "value1")]),
            patch(
                Some(SidecarSetPatchPolicy::Overwrite),
                &[("key2", "value2")],
            ),
        ],
    )
    .expect("ok");
    assert_eq!(a, annotations(&[("key1", "old"), ("key2", "value2")]));
}

#[test]
fn an_unset_policy_means_retain() {
    let mut a = annotations(&[("k", "old")]);
    let changed = patch_pod_metadata(&mut a, &[patch(None, &[("k", "new")])]).expect("ok");
    assert!(!changed);
    assert_eq!(a["k"], "old");
}

#[test]
fn json_merge_combines_values() {
    let mut a = annotations(&[
        ("key1", r#"{"log-agent":1}"#),
        ("key2", r#"{"log-agent":1}"#),
    ]);
    patch_pod_metadata(
        &mut a,
        &[patch(
            Some(SidecarSetPatchPolicy::MergePatchJson),
            &[
                ("key1", r#"{"log-agent":1}"#),
                ("key2", r#"{"envoy":2}"#),
                ("key3", r#"{"probe":5}"#),
            ],
        )],
    )
    .expect("ok");
    assert_eq!(
        a,
        annotations(&[
            ("key1", r#"{"log-agent":1}"#),
            ("key2", r#"{"envoy":2,"log-agent":1}"#),
            ("key3", r#"{"probe":5}"#),
        ])
    );
}

#[test]
fn json_merge_that_changes_nothing_reports_no_change() {
    let mut a = annotations(&[("key1", r#"{"log-agent":1}"#)]);
    let changed = patch_pod_metadata(
        &mut a,
        &[patch(
            Some(SidecarSetPatchPolicy::MergePatchJson),
            &[("key1", r#"{"log-agent":1}"#)],
        )],
    )
    .expect("ok");
    assert!(!changed);
}

#[test]
fn two_sidecarsets_merge_into_one_annotation() {
    // Upstream TestInjectMetadata: `{"log-agent":1}` then `{"envoy":2}`.
    let mut a = BTreeMap::new();
    patch_pod_metadata(
        &mut a,
        &[patch(
            Some(SidecarSetPatchPolicy::MergePatchJson),
            &[("key1", r#"{"log-agent":1}"#)],
        )],
    )
    .expect("ok");
    patch_pod_metadata(
        &mut a,
        &[patch(
            Some(SidecarSetPatchPolicy::MergePatchJson),
            &[("key1", r#"{"envoy":2}"#)],
        )],
    )
    .expect("ok");
    assert_eq!(a["key1"], r#"{"envoy":2,"log-agent":1}"#);
}

#[test]
fn json_merge_errors_on_invalid_json() {
    let mut a = annotations(&[("k", "not json")]);
    let err = patch_pod_metadata(
        &mut a,
        &[patch(
            Some(SidecarSetPatchPolicy::MergePatchJson),
            &[("k", r#"{"a":1}"#)],
        )],
    )
    .expect_err("invalid pod value");
    assert_eq!(err.key, "k");
    let mut a = annotations(&[("k", r#"{"a":1}"#)]);
    assert!(
        patch_pod_metadata(
            &mut a,
            &[patch(
                Some(SidecarSetPatchPolicy::MergePatchJson),
                &[("k", "{oops")]
            )],
        )
        .is_err()
    );
}

#[test]
fn json_merge_into_an_absent_or_empty_value_sets_the_patch_verbatim() {
    let mut a = annotations(&[("empty", "")]);
    patch_pod_metadata(
        &mut a,
        &[patch(
            Some(SidecarSetPatchPolicy::MergePatchJson),
            &[("empty", "{ \"x\" : 1 }"), ("absent", "not even json")],
        )],
    )
    .expect("upstream does not validate a patch it does not merge");
    assert_eq!(a["empty"], "{ \"x\" : 1 }");
    assert_eq!(a["absent"], "not even json");
}

#[test]
fn merge_patch_edge_cases_follow_upstream() {
    // Nulls delete keys and are pruned from added objects.
    assert_eq!(
        merge_patch_json(r#"{"a":1,"b":2}"#, r#"{"a":null,"c":{"d":null,"e":3}}"#).unwrap(),
        r#"{"b":2,"c":{"e":3}}"#
    );
    // Nested objects merge recursively.
    assert_eq!(
        merge_patch_json(r#"{"a":{"x":1,"y":2}}"#, r#"{"a":{"y":null,"z":3}}"#).unwrap(),
        r#"{"a":{"x":1,"z":3}}"#
    );
    // A non-object value is replaced.
    assert_eq!(
        merge_patch_json(r#"{"a":[1]}"#, r#"{"a":{"b":null,"c":1}}"#).unwrap(),
        r#"{"a":{"c":1}}"#
    );
    // A document that is JSON but not an object is replaced by the (pruned) patch.
    assert_eq!(
        merge_patch_json("[1,2]", r#"{"a":1,"b":null}"#).unwrap(),
        r#"{"a":1}"#
    );
    assert_eq!(merge_patch_json("5", r#"{"a":1}"#).unwrap(), r#"{"a":1}"#);
    // An array patch replaces the document, keeping its null elements.
    assert_eq!(
        merge_patch_json(r#"{"a":1}"#, "[1,null]").unwrap(),
        "[1,null]"
    );
    // Errors.
    assert_eq!(
        merge_patch_json("null", r#"{"a":1}"#),
        Err(MergePatchError::NullDocument)
    );
    assert_eq!(
        merge_patch_json(r#"{"a":1}"#, "null"),
        Err(MergePatchError::NullPatch)
    );
    assert_eq!(
        merge_patch_json(r#"{"a":1}"#, "7"),
        Err(MergePatchError::ScalarPatch)
    );
    assert_eq!(
        merge_patch_json(r#"{"a":1}"#, "\"s\""),
        Err(MergePatchError::ScalarPatch)
    );
    assert!(matches!(
        merge_patch_json("{", "{}"),
        Err(MergePatchError::DocumentNotJson(_))
    ));
    assert!(matches!(
        merge_patch_json("{}", "}"),
        Err(MergePatchError::PatchNotJson(_))
    ));
    // Output is Go-style: sorted keys, HTML-safe escapes.
    assert_eq!(
        merge_patch_json(r#"{"z":"<"}"#, r#"{"a":"&"}"#).unwrap(),
        r#"{"a":"\u0026","z":"\u003c"}"#
    );
}
