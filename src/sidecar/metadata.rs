//! `spec.patchPodMetadata`: annotations a SidecarSet writes onto its pods.
//!
//! Applied at injection, and by the upgrade controller on in-place upgrades. Per patch policy:
//!
//! - `Retain` (the default): add each key the pod does not have; never change an existing value.
//! - `Overwrite`: set each key.
//! - `MergePatchJson`: merge the patch value into the pod's value as an RFC 7386 JSON merge patch
//!   (so several SidecarSets can each contribute keys to one JSON annotation); a pod without the
//!   annotation, or with an empty value, gets the patch value as it is.
//!
//! The merge follows upstream's library (evanphx/json-patch `MergePatch`) case by case: text
//! that is not JSON, on either side, is an error; so is a `null` or scalar patch, or a `null`
//! document; a document that is JSON but not an object is replaced by the patch; an array patch
//! replaces the document; `null` members of the patch delete keys and are pruned from added
//! objects. The result is written like Go's `json.Marshal`: compact, keys sorted, HTML-safe
//! escapes. One difference remains: Go copies untouched nested values byte for byte, while here
//! they are re-rendered (keys sorted, numbers as serde_json prints them, e.g. `1e3` → `1000.0`).

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::apis::sidecarset::{SidecarSetPatchPodMetadata, SidecarSetPatchPolicy};

use super::gojson::write_generic;

/// Why a `MergePatchJson` patch cannot be applied to one annotation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("annotation {key}: {source}")]
pub struct MetadataPatchError {
    pub key: String,
    #[source]
    pub source: MergePatchError,
}

/// Why a JSON merge patch cannot be applied (upstream's library refuses the same inputs).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MergePatchError {
    #[error("the pod's value is not valid JSON: {0}")]
    DocumentNotJson(String),
    #[error("the patch is not valid JSON: {0}")]
    PatchNotJson(String),
    #[error("the pod's value is JSON null, not a document")]
    NullDocument,
    #[error("the patch is JSON null")]
    NullPatch,
    #[error("the patch is neither a JSON object nor an array")]
    ScalarPatch,
}

/// Applies `patches` in order to `annotations`. Returns whether anything changed.
pub fn patch_pod_metadata(
    annotations: &mut BTreeMap<String, String>,
    patches: &[SidecarSetPatchPodMetadata],
) -> Result<bool, MetadataPatchError> {
    let before = annotations.clone();
    for patch in patches {
        match patch.patch_policy.unwrap_or(SidecarSetPatchPolicy::Retain) {
            SidecarSetPatchPolicy::Retain => {
                for (k, v) in &patch.annotations {
                    annotations.entry(k.clone()).or_insert_with(|| v.clone());
                }
            }
            SidecarSetPatchPolicy::Overwrite => {
                for (k, v) in &patch.annotations {
                    annotations.insert(k.clone(), v.clone());
                }
            }
            SidecarSetPatchPolicy::MergePatchJson => {
                for (k, v) in &patch.annotations {
                    let merged = match annotations.get(k).filter(|o| !o.is_empty()) {
                        Some(origin) => {
                            merge_patch_json(origin, v).map_err(|source| MetadataPatchError {
                                key: k.clone(),
                                source,
                            })?
                        }
                        None => v.clone(),
                    };
                    annotations.insert(k.clone(), merged);
                }
            }
        }
    }
    Ok(*annotations != before)
}

/// RFC 7386 merge of `patch` into `doc`, both JSON text, with upstream's edge cases.
pub fn merge_patch_json(doc: &str, patch: &str) -> Result<String, MergePatchError> {
    let doc: Value =
        serde_json::from_str(doc).map_err(|e| MergePatchError::DocumentNotJson(e.to_string()))?;
    let patch: Value =
        serde_json::from_str(patch).map_err(|e| MergePatchError::PatchNotJson(e.to_string()))?;
    if doc.is_null() {
        return Err(MergePatchError::NullDocument);
    }
    let result = match (doc, patch) {
        (_, Value::Null) => return Err(MergePatchError::NullPatch),
        (Value::Object(mut doc), Value::Object(patch)) => {
            merge_objects(&mut doc, patch);
            Value::Object(doc)
        }
        (_, patch @ (Value::Object(_) | Value::Array(_))) => prune_nulls(patch),
        (_, _) => return Err(MergePatchError::ScalarPatch),
    };
    let mut out = String::new();
    write_generic(&mut out, &result);
    Ok(out)
}

fn merge_objects(doc: &mut Map<String, Value>, patch: Map<String, Value>) {
    for (key, value) in patch {
        if value.is_null() {
            doc.remove(&key);
            continue;
        }
        let merged = match doc.remove(&key) {
            None | Some(Value::Null) => prune_nulls(value),
            Some(Value::Object(mut current)) => match value {
                Value::Object(patch) => {
                    merge_objects(&mut current, patch);
                    Value::Object(current)
                }
                other => other,
            },
            Some(_) => prune_nulls(value),
        };
        doc.insert(key, merged);
    }
}

/// Removes `null` members of objects, recursively (arrays keep their `null` elements).
fn prune_nulls(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, prune_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(prune_nulls).collect()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
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
}
