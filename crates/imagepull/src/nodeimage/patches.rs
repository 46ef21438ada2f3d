//! The patches the NodeImage controller sends, built as pure functions.
//!
//! * `status_patch`: a guarded JSON Patch of `status` (the node daemon is the main writer
//!   there). Each replaced value is `test`ed first, so a concurrent daemon write makes the
//!   apiserver refuse ours (422) instead of being overwritten; the caller re-reads and decides
//!   again. A key we add cannot be tested for absence, so adding guards the whole map (or the
//!   object's `resourceVersion` when there is no map yet), as `nodeimage_write` does for spec.
//! * `labels_patch`: a merge patch making `metadata.labels` equal to the Node's. This
//!   controller is the only writer of NodeImage labels, so it needs no guard: a label someone
//!   else adds meanwhile triggers another reconcile, which removes it.

use std::collections::BTreeMap;

use json_patch::{
    AddOperation, Patch, PatchOperation, RemoveOperation, ReplaceOperation, TestOperation,
};
use jsonptr::PointerBuf;
use serde::Serialize;
use serde_json::{Value, json};

use crate::compact_nodeimage::NodeImageStatus;

fn value<T: Serialize>(v: &T) -> Value {
    serde_json::to_value(v).expect("plain API types always serialize")
}

fn pointer(tokens: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(tokens.iter().copied())
}

fn test(path: PointerBuf, value: Value) -> PatchOperation {
    PatchOperation::Test(TestOperation { path, value })
}

fn test_resource_version(ops: &mut Vec<PatchOperation>, resource_version: Option<&str>) {
    if let Some(rv) = resource_version {
        ops.push(test(
            pointer(&["metadata", "resourceVersion"]),
            Value::String(rv.to_owned()),
        ));
    }
}

/// The guarded JSON Patch turning `old` (the status as last read, at `resource_version`) into
/// `new`; `None` when they are equal.
///
/// `whole` replaces the whole status, guarded by `resourceVersion` only: for a status we saw
/// empty, and as the fallback when a value test failed although the object had not changed
/// (the stored JSON differs from ours in form, e.g. fractional seconds written by another tool).
pub(crate) fn status_patch(
    old: &NodeImageStatus,
    resource_version: Option<&str>,
    new: &NodeImageStatus,
    whole: bool,
) -> Option<Patch> {
    if old == new {
        return None;
    }
    let mut ops = Vec::new();
    // Nothing here changes `firstSyncStatus`; should a caller ever, it goes whole too.
    if whole || *old == NodeImageStatus::default() || old.first_sync_status != new.first_sync_status
    {
        test_resource_version(&mut ops, resource_version);
        ops.push(PatchOperation::Add(AddOperation {
            path: pointer(&["status"]),
            value: value(new),
        }));
        return Some(Patch(ops));
    }

    let (old_images, new_images) = (&old.image_statuses, &new.image_statuses);
    if old_images != new_images {
        if old_images.is_empty() {
            // The map may be absent altogether: write it whole, guarded by the version.
            test_resource_version(&mut ops, resource_version);
            ops.push(PatchOperation::Add(AddOperation {
                path: pointer(&["status", "imageStatuses"]),
                value: value(new_images),
            }));
        } else {
            if new_images.keys().any(|k| !old_images.contains_key(k)) {
                ops.push(test(
                    pointer(&["status", "imageStatuses"]),
                    value(old_images),
                ));
            }
            for (name, before) in old_images {
                let path = pointer(&["status", "imageStatuses", name]);
                match new_images.get(name) {
                    Some(after) if after == before => {}
                    Some(after) => {
                        ops.push(test(path.clone(), value(before)));
                        ops.push(PatchOperation::Replace(ReplaceOperation {
                            path,
                            value: value(after),
                        }));
                    }
                    None => {
                        ops.push(test(path.clone(), value(before)));
                        ops.push(PatchOperation::Remove(RemoveOperation { path }));
                    }
                }
            }
            for (name, after) in new_images
                .iter()
                .filter(|(k, _)| !old_images.contains_key(*k))
            {
                ops.push(PatchOperation::Add(AddOperation {
                    path: pointer(&["status", "imageStatuses", name]),
                    value: value(after),
                }));
            }
        }
    }

    // The counts have schema defaults, so they are always present once a status exists.
    let counts = [
        ("desired", old.desired, new.desired),
        ("succeeded", old.succeeded, new.succeeded),
        ("failed", old.failed, new.failed),
        ("pulling", old.pulling, new.pulling),
        ("waiting", old.waiting, new.waiting),
    ];
    for (field, before, after) in counts {
        if before != after {
            let path = pointer(&["status", field]);
            ops.push(test(path.clone(), json!(before)));
            ops.push(PatchOperation::Replace(ReplaceOperation {
                path,
                value: json!(after),
            }));
        }
    }
    Some(Patch(ops))
}

/// The merge patch making a NodeImage's labels exactly `wanted`; `None` when they already are.
pub(crate) fn labels_patch(
    current: &BTreeMap<String, String>,
    wanted: &BTreeMap<String, String>,
) -> Option<Value> {
    if current == wanted {
        return None;
    }
    let mut labels = serde_json::Map::new();
    for key in current.keys().filter(|k| !wanted.contains_key(*k)) {
        labels.insert(key.clone(), Value::Null);
    }
    for (key, v) in wanted {
        if current.get(key) != Some(v) {
            labels.insert(key.clone(), Value::String(v.clone()));
        }
    }
    Some(json!({ "metadata": { "labels": labels } }))
}

#[cfg(test)]
mod tests;
