//! The JSON Patch the pod webhook answers an injection with: from the pod as the apiserver sent
//! it to the injected pod, keeping every field the typed `Pod` does not know (fields newer than
//! the API version this crate is built against).
//!
//! Injection changes a pod's annotations and labels and four of its lists (containers, init
//! containers, volumes, image pull secrets). The patch sets each of those that changed as a
//! whole, one operation each: a field-by-field diff of the two pods cost more than the rest of
//! the injection (benches/admission.rs) and gave the apiserver ~90 operations to apply for three
//! sidecars.

use std::collections::BTreeMap;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation, ReplaceOperation};
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use kube::core::{DynamicObject, ObjectMeta};
use serde::Serialize;
use serde_json::Value;

use kruise_rs_sidecar as sidecar;

/// The patch from `raw` (the pod as the apiserver sent it) to `after`, where `before` is `raw`
/// read into the typed `Pod`. List items the injection left alone are taken from `raw` as they
/// were; items it changed keep the fields of `raw` the typed item does not have; injected
/// containers (every name in `unknown_fields`) get their sidecar's unknown fields instead.
pub(super) fn patch_preserving(
    raw: &DynamicObject,
    before: &Pod,
    after: &Pod,
    unknown_fields: &BTreeMap<String, BTreeMap<String, Value>>,
) -> Result<Patch, serde_json::Error> {
    let raw_spec = raw.data.get("spec").and_then(Value::as_object);
    let (Some(raw_spec), Some(spec_before), Some(spec_after)) =
        (raw_spec, before.spec.as_ref(), after.spec.as_ref())
    else {
        return sidecar::pod_patch(before, after);
    };
    // Anything else the injection changed (nothing today) goes through the typed diff.
    if !same_but_injected(before, after) {
        return sidecar::pod_patch(before, after);
    }
    let mut ops = Vec::new();
    let (meta_raw, meta_after) = (&raw.metadata, &after.metadata);
    if before.metadata.annotations != meta_after.annotations {
        let there = meta_raw.annotations.is_some();
        ops.extend(set(
            &["metadata", "annotations"],
            there,
            &meta_after.annotations,
        )?);
    }
    if before.metadata.labels != meta_after.labels {
        let there = meta_raw.labels.is_some();
        ops.extend(set(&["metadata", "labels"], there, &meta_after.labels)?);
    }
    let (b, a) = (spec_before, spec_after);
    let lists = [
        (
            "containers",
            changed(Some(&b.containers), Some(&a.containers))?,
        ),
        (
            "initContainers",
            changed(b.init_containers.as_ref(), a.init_containers.as_ref())?,
        ),
        ("volumes", changed(b.volumes.as_ref(), a.volumes.as_ref())?),
        (
            "imagePullSecrets",
            changed(b.image_pull_secrets.as_ref(), a.image_pull_secrets.as_ref())?,
        ),
    ];
    for (field, change) in lists {
        let Some((items_before, items_after)) = change else {
            continue;
        };
        let there = raw_spec.contains_key(field);
        let Some(items_after) = items_after else {
            if there {
                ops.push(PatchOperation::Remove(RemoveOperation {
                    path: pointer(&["spec", field]),
                }));
            }
            continue;
        };
        let merged = merge_items(
            field,
            raw_spec.get(field).and_then(Value::as_array),
            items_before.as_ref().and_then(Value::as_array),
            items_after,
            unknown_fields,
        );
        ops.push(put(&["spec", field], there, merged));
    }
    Ok(Patch(ops))
}

/// A list before and after injection, as JSON, when they differ.
type Change = Option<(Option<Value>, Option<Value>)>;

fn changed<T: Serialize + PartialEq>(
    before: Option<&T>,
    after: Option<&T>,
) -> Result<Change, serde_json::Error> {
    if before == after {
        return Ok(None);
    }
    Ok(Some((
        before.map(to_value).transpose()?,
        after.map(to_value).transpose()?,
    )))
}

fn to_value<T: Serialize>(value: &T) -> Result<Value, serde_json::Error> {
    serde_json::to_value(value)
}

/// Whether `before` and `after` differ only in what injection changes.
fn same_but_injected(before: &Pod, after: &Pod) -> bool {
    fn meta(m: &ObjectMeta) -> ObjectMeta {
        ObjectMeta {
            annotations: None,
            labels: None,
            ..m.clone()
        }
    }
    fn spec(s: Option<&PodSpec>) -> Option<PodSpec> {
        s.map(|s| PodSpec {
            containers: Vec::new(),
            init_containers: None,
            volumes: None,
            image_pull_secrets: None,
            ..s.clone()
        })
    }
    before.status == after.status
        && meta(&before.metadata) == meta(&after.metadata)
        && spec(before.spec.as_ref()) == spec(after.spec.as_ref())
}

/// The list `field` of the injected pod (`after`, as JSON), each item keeping the fields of its
/// `raw` namesake the typed item does not know, or getting its sidecar's unknown fields.
fn merge_items(
    field: &str,
    raw: Option<&Vec<Value>>,
    before: Option<&Vec<Value>>,
    after: Value,
    unknown_fields: &BTreeMap<String, BTreeMap<String, Value>>,
) -> Value {
    let Value::Array(items) = after else {
        return after;
    };
    let merged = items
        .into_iter()
        .map(|mut item| {
            let name = &item["name"];
            // An injected container (new, or replacing the pod's own of that name) gets its
            // sidecar's unknown fields, never the replaced container's.
            let injected = matches!(field, "containers" | "initContainers")
                .then(|| name.as_str().and_then(|name| unknown_fields.get(name)))
                .flatten();
            let typed_before = named(before, name);
            match (injected, named(raw, name)) {
                (Some(extra), _) => {
                    if let Some(fields) = item.as_object_mut() {
                        for (key, value) in extra {
                            fields.entry(key.clone()).or_insert_with(|| value.clone());
                        }
                    }
                    item
                }
                (None, Some(original)) if typed_before == Some(&item) => original.clone(),
                (None, Some(original)) => {
                    keep_unknown(&mut item, original, typed_before);
                    item
                }
                (None, None) => item,
            }
        })
        .collect();
    Value::Array(merged)
}

/// The item of `list` named `name`.
fn named<'a>(list: Option<&'a Vec<Value>>, name: &Value) -> Option<&'a Value> {
    list.and_then(|l| l.iter().find(|item| &item["name"] == name))
}

/// Copies into `item` the fields of `original` that neither `item` nor the typed item before
/// injection has: those the typed struct does not know.
fn keep_unknown(item: &mut Value, original: &Value, typed_before: Option<&Value>) {
    let (Some(fields), Some(original)) = (item.as_object_mut(), original.as_object()) else {
        return;
    };
    let known_before = |key: &str| typed_before.is_some_and(|b| b.get(key).is_some());
    for (key, value) in original {
        if !fields.contains_key(key) && !known_before(key) {
            fields.insert(key.clone(), value.clone());
        }
    }
}

/// The operation that makes `path` hold `value` (`None`: absent), given whether it was there.
fn set<T: Serialize>(
    path: &[&str],
    was_there: bool,
    value: &Option<T>,
) -> Result<Option<PatchOperation>, serde_json::Error> {
    Ok(match value {
        Some(value) => Some(put(path, was_there, to_value(value)?)),
        None if was_there => Some(PatchOperation::Remove(RemoveOperation {
            path: pointer(path),
        })),
        None => None,
    })
}

/// `replace` of a member that is there, `add` of one that is not.
fn put(path: &[&str], was_there: bool, value: Value) -> PatchOperation {
    let path = pointer(path);
    if was_there {
        PatchOperation::Replace(ReplaceOperation { path, value })
    } else {
        PatchOperation::Add(AddOperation { path, value })
    }
}

fn pointer(tokens: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(tokens.iter().copied())
}

#[cfg(test)]
mod tests;
