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

use kruise_rs_api::sidecarset::{SidecarSetPatchPodMetadata, SidecarSetPatchPolicy};

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
pub(crate) fn merge_patch_json(doc: &str, patch: &str) -> Result<String, MergePatchError> {
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
mod tests;
