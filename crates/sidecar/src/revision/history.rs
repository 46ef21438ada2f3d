//! The ControllerRevision history of a SidecarSet, as pure decisions (upstream's
//! `registerLatestRevision`, `history_control.go` and Kubernetes' `controller/history`); the
//! SidecarSet controller's `revisions` module makes the API calls they call for.
//!
//! Every version of what a SidecarSet injects is kept as a ControllerRevision, so that
//! `injectionStrategy.revision` can inject an older version (`super::select`) and
//! pods can record which version they got. The rules:
//!
//! - **Where and whose.** Revisions live in the manager's namespace (the SidecarSet is
//!   cluster-scoped). One belongs to a SidecarSet when it is labelled
//!   `kruise.io/sidecarset-name: <name>` and has either no controller owner or the SidecarSet
//!   (by UID) as its controller ([`is_own_revision`]).
//! - **What.** `data` is `{"spec":{"$patch":"replace","containers":…,"initContainers":…,
//!   "volumes":…,"imagePullSecrets":…,"patchPodMetadata":…}}`, an empty list written as `null`
//!   (`revision_data`). Labels: the SidecarSet's own, plus `kruise.io/sidecarset-name`, the hash
//!   under both `controller.kubernetes.io/hash` (Kubernetes' history label, which upstream
//!   writes) and `controller-revision-hash`, plus `apps.kruise.io/sidecarset-custom-version` when
//!   the SidecarSet has a custom version. Annotations: all of the SidecarSet's (they carry both
//!   sidecar hashes, which injecting an old version reuses). One controller owner reference.
//! - **Name.** `<sidecarset>-<hash>`, the SidecarSet name cut to 223 bytes. The hash is 32-bit
//!   FNV-1 over the data's JSON text followed by the decimal collision count, printed as a
//!   decimal number and passed through `SafeEncodeString` (`revision_name`).
//! - **Registration** ([`plan_registration`]; the controller's `register` writes it): when the newest revision records
//!   the current spec it is kept; when an older one does, it is rolled back to the front by
//!   giving it the next number (max + 1); otherwise a revision with the next number is created.
//!   A name already taken by a different revision bumps the collision count (and so the name).
//!   The latest revision then gets the custom-version label if it lacks it.
//! - **Truncation** ([`revisions_to_delete`]): at most `revisionHistoryLimit` revisions
//!   (default 10, at least 1) are kept, the oldest deleted first, except the latest, those a
//!   matched pod records, `injectionStrategy.revision.revisionName`, and the newest revision
//!   labelled with `injectionStrategy.revision.customVersion`. When too many are protected, the
//!   excess stays.
//!
//! **Same names as upstream.** The data text is what upstream's `json.Marshal` of a generic map
//! writes: keys sorted at every level, compact, `<`, `>`, `&`, U+2028 and U+2029 escaped. The
//! container lists go through the hash module's Go encoder first, so they carry exactly the fields
//! Go writes (`"resources":{}`, `"upgradeStrategy":{}`, canonical quantities…). So for the same
//! spec our revision name equals upstream's, and the controller stores those exact bytes, so
//! upstream's byte comparison also accepts our revisions. The known exceptions, all in fields
//! rendered by serde rather than from Go's type tables: a volume written with zero values that Go
//! omits (`readOnly: false`, `medium: ""`), with a required field missing, with a non-canonical
//! quantity (`sizeLimit: 1024Mi`), or of a type with always-written nested structs (ephemeral
//! volume templates, `resourceFieldRef`); and non-integer or huge (> 2^53) numbers, which Go
//! passes through a float64.
//!
//! Deliberate differences from upstream:
//! - Revisions are compared by meaning, not bytes ([`equal_revisions`]): both sides' recorded
//!   fields are decoded and rendered again, so a revision written by upstream or by an older
//!   kruise-rs still counts as equal.
//! - The hash label always matches the name (upstream keeps the first attempt's hash in it after
//!   a collision), and a name taken by an equal revision of another SidecarSet (say, a deleted
//!   one of the same name whose revisions are not yet garbage-collected) counts as a collision
//!   instead of being adopted.
//! - Rollback and relabelling are merge patches guarded by `resourceVersion`, retried once.
//! - Truncation never deletes the latest revision, identified by name, rather than "the last one
//!   in the sorted list"; ties in order go by creation time, then name (Kubernetes' order).

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::{LocalObjectReference, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use serde::Serialize;
use serde_json::{Map, Value, json};

use super::{HISTORY_HASH_LABEL, label, recorded_field, revision_order};
use crate::gojson::write_generic;
use crate::hash::{hash_input, safe_encode_string};
use kruise_rs_api::sidecarset::{
    SidecarContainer, SidecarSet, SidecarSetPatchPodMetadata, SidecarSetSpec,
};
use kruise_rs_api::well_known::{
    CONTROLLER_REVISION_HASH, SIDECARSET_CUSTOM_VERSION_LABEL, SIDECARSET_NAME_LABEL,
};

/// `revisionHistoryLimit` when unset.
const DEFAULT_HISTORY_LIMIT: i32 = 10;
/// Kubernetes cuts the name prefix here so that prefix, dash and hash fit in 253 bytes.
const MAX_NAME_PREFIX: usize = 223;

// --- Building a revision -------------------------------------------------------------------------

/// The `data` of a revision recording `spec`: the injected parts, to be restored over a later
/// spec with `$patch: replace`.
pub(crate) fn revision_data(spec: &SidecarSetSpec) -> Value {
    let mut recorded = Map::new();
    recorded.insert("$patch".to_owned(), Value::from("replace"));
    recorded.insert("containers".to_owned(), go_containers(&spec.containers));
    recorded.insert(
        "initContainers".to_owned(),
        go_containers(&spec.init_containers),
    );
    recorded.insert("volumes".to_owned(), list_or_null(&spec.volumes));
    recorded.insert(
        "imagePullSecrets".to_owned(),
        pull_secrets(&spec.image_pull_secrets),
    );
    recorded.insert(
        "patchPodMetadata".to_owned(),
        list_or_null(&spec.patch_pod_metadata),
    );
    json!({ "spec": recorded })
}

/// A container list with exactly the fields Go's encoder writes for kruise's structs.
fn go_containers(containers: &[SidecarContainer]) -> Value {
    if containers.is_empty() {
        // Go omits the empty list from the spec, so the copied map value is nil: `null`.
        return Value::Null;
    }
    // `hash_input` renders `{"containers":[…]}` with Go's field set, zero values and canonical
    // quantities; reusing it keeps one set of Go type tables in the crate.
    let probe = SidecarSetSpec {
        containers: containers.to_vec(),
        ..SidecarSetSpec::default()
    };
    serde_json::from_str::<Value>(&hash_input(&probe, false))
        .ok()
        .and_then(|mut v| v.get_mut("containers").map(Value::take))
        .unwrap_or_else(|| list_or_null(containers))
}

fn list_or_null<T: Serialize>(items: &[T]) -> Value {
    if items.is_empty() {
        return Value::Null;
    }
    // Plain data structs with string map keys always serialize; Null keeps this total.
    serde_json::to_value(items).unwrap_or(Value::Null)
}

fn pull_secrets(secrets: &[LocalObjectReference]) -> Value {
    if secrets.is_empty() {
        return Value::Null;
    }
    // Go omits an empty `name` (`omitempty`); k8s-openapi would write `"name":""`.
    secrets
        .iter()
        .map(|s| {
            if s.name.is_empty() {
                json!({})
            } else {
                json!({ "name": s.name })
            }
        })
        .collect()
}

/// `value` as Go's `json.Marshal` writes the equivalent `map[string]interface{}` tree: keys
/// sorted at every level, compact, HTML-safe strings. This is the text revision names hash.
pub fn go_json_text(value: &Value) -> String {
    let mut out = String::new();
    write_generic(&mut out, value);
    out
}

/// The hash part of a revision name: FNV-1 over the data text and the decimal collision count,
/// in `SafeEncodeString` form.
pub(crate) fn revision_hash(data: &[u8], collision_count: i32) -> String {
    let hash = fnv1_32(&[data, collision_count.to_string().as_bytes()]);
    safe_encode_string(&hash.to_string())
}

/// 32-bit FNV-1 (multiply, then xor: Go's `fnv.New32`, which Kubernetes uses, not FNV-1a).
fn fnv1_32(parts: &[&[u8]]) -> u32 {
    const OFFSET_BASIS: u32 = 0x811c_9dc5;
    const PRIME: u32 = 0x0100_0193;
    parts
        .iter()
        .flat_map(|part| part.iter())
        .fold(OFFSET_BASIS, |h, &b| h.wrapping_mul(PRIME) ^ u32::from(b))
}

/// The name of the revision of SidecarSet `set_name` with this data text and collision count.
#[cfg(test)]
fn revision_name(set_name: &str, data: &[u8], collision_count: i32) -> String {
    controller_revision_name(set_name, &revision_hash(data, collision_count))
}

fn controller_revision_name(prefix: &str, hash: &str) -> String {
    let mut end = prefix.len().min(MAX_NAME_PREFIX);
    // Kubernetes cuts bytes; names are ASCII, but never split a character regardless.
    while !prefix.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}-{hash}", &prefix[..end])
}

/// A new revision numbered `number` recording `set`'s current spec, in `namespace`.
///
/// The owner reference is left out when the SidecarSet has no UID (it was not read from the
/// cluster); the controller refuses to register such a SidecarSet.
pub fn new_revision(
    set: &SidecarSet,
    namespace: &str,
    number: i64,
    collision_count: i32,
) -> ControllerRevision {
    let set_name = set.metadata.name.clone().unwrap_or_default();
    let data = revision_data(&set.spec);
    let hash = revision_hash(go_json_text(&data).as_bytes(), collision_count);
    let mut labels = set.metadata.labels.clone().unwrap_or_default();
    labels.insert(HISTORY_HASH_LABEL.to_owned(), hash.clone());
    labels.insert(CONTROLLER_REVISION_HASH.to_owned(), hash.clone());
    if let Some(version) = set.custom_version() {
        labels.insert(
            SIDECARSET_CUSTOM_VERSION_LABEL.to_owned(),
            version.to_owned(),
        );
    }
    labels.insert(SIDECARSET_NAME_LABEL.to_owned(), set_name.clone());
    ControllerRevision {
        metadata: ObjectMeta {
            name: Some(controller_revision_name(&set_name, &hash)),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels),
            annotations: set.metadata.annotations.clone().filter(|a| !a.is_empty()),
            owner_references: controller_ref(set).map(|r| vec![r]),
            ..ObjectMeta::default()
        },
        data: Some(RawExtension(data)),
        revision: number,
    }
}

fn controller_ref(set: &SidecarSet) -> Option<OwnerReference> {
    let uid = set.metadata.uid.as_deref().filter(|u| !u.is_empty())?;
    Some(OwnerReference {
        api_version: <SidecarSet as kube::Resource>::api_version(&()).into_owned(),
        kind: <SidecarSet as kube::Resource>::kind(&()).into_owned(),
        name: set.metadata.name.clone().unwrap_or_default(),
        uid: uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    })
}

// --- Reading the history -------------------------------------------------------------------------

/// Whether `revision` is one of `set`'s: labelled with its name, and not controlled by another
/// object (a revision without a controller is adopted, as Kubernetes' history does).
pub fn is_own_revision(set: &SidecarSet, revision: &ControllerRevision) -> bool {
    let Some(set_name) = set.metadata.name.as_deref().filter(|n| !n.is_empty()) else {
        return false;
    };
    if label(revision, SIDECARSET_NAME_LABEL) != Some(set_name) {
        return false;
    }
    revision
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
        .is_none_or(|owner| Some(owner.uid.as_str()) == set.metadata.uid.as_deref())
}

/// `set`'s revisions among `history`, oldest first (nameless ones, which cannot come from the
/// cluster, are skipped).
pub(crate) fn own_revisions<'a>(
    set: &SidecarSet,
    history: &'a [ControllerRevision],
) -> Vec<&'a ControllerRevision> {
    let mut own: Vec<&ControllerRevision> = history
        .iter()
        .filter(|r| r.metadata.name.as_deref().is_some_and(|n| !n.is_empty()))
        .filter(|r| is_own_revision(set, r))
        .collect();
    own.sort_by(|a, b| revision_order(a).cmp(&revision_order(b)));
    own
}

/// Whether two revisions record the same version. Their recorded fields are decoded and
/// rendered again, so key order, Go's always-written empty structs and quantity spellings do not
/// matter; data that cannot be decoded that way is compared as JSON values. A revision without
/// data equals nothing.
pub fn equal_revisions(a: &ControllerRevision, b: &ControllerRevision) -> bool {
    let (Some(RawExtension(x)), Some(RawExtension(y))) = (&a.data, &b.data) else {
        return false;
    };
    match (canonical_data(x), canonical_data(y)) {
        (Some(x), Some(y)) => x == y,
        _ => x == y,
    }
}

/// The data rendered again from its decoded fields; `None` when it is not exactly the shape
/// [`revision_data`] writes (so nothing unknown is silently ignored).
fn canonical_data(data: &Value) -> Option<Value> {
    let top = data.as_object()?;
    let spec = top.get("spec")?.as_object()?;
    const KEYS: [&str; 6] = [
        "$patch",
        "containers",
        "initContainers",
        "volumes",
        "imagePullSecrets",
        "patchPodMetadata",
    ];
    if top.len() != 1
        || spec.keys().any(|k| !KEYS.contains(&k.as_str()))
        || spec.get("$patch").and_then(Value::as_str) != Some("replace")
    {
        return None;
    }
    let recorded = SidecarSetSpec {
        containers: recorded_field::<Vec<SidecarContainer>>(spec, "containers").ok()?,
        init_containers: recorded_field::<Vec<SidecarContainer>>(spec, "initContainers").ok()?,
        volumes: recorded_field::<Vec<Volume>>(spec, "volumes").ok()?,
        image_pull_secrets: recorded_field::<Vec<LocalObjectReference>>(spec, "imagePullSecrets")
            .ok()?,
        patch_pod_metadata: recorded_field::<Vec<SidecarSetPatchPodMetadata>>(
            spec,
            "patchPodMetadata",
        )
        .ok()?,
        ..SidecarSetSpec::default()
    };
    Some(revision_data(&recorded))
}

// --- Deciding ------------------------------------------------------------------------------------

/// What registering the current spec takes.
#[derive(Clone, Debug, PartialEq)]
pub enum Registration {
    /// The newest revision records the current spec; keep it. `custom_version`: the
    /// custom-version label it must be given first, if any.
    Current {
        revision: ControllerRevision,
        custom_version: Option<String>,
    },
    /// An older revision records the current spec: make it the newest by renumbering it to
    /// `number`, and give it `custom_version` as label if set.
    RollBack {
        revision: ControllerRevision,
        number: i64,
        custom_version: Option<String>,
    },
    /// No revision records the current spec: create this one.
    Create { revision: ControllerRevision },
}

impl Registration {
    /// The revision that will be the latest (before any renumbering or relabelling).
    pub fn revision(&self) -> &ControllerRevision {
        match self {
            Registration::Current { revision, .. }
            | Registration::RollBack { revision, .. }
            | Registration::Create { revision } => revision,
        }
    }
}

/// How to register `set`'s current spec, given the revisions listed in `namespace` (others'
/// revisions among them are ignored) and the SidecarSet's collision count.
pub fn plan_registration(
    set: &SidecarSet,
    history: &[ControllerRevision],
    namespace: &str,
    collision_count: i32,
) -> Registration {
    let own = own_revisions(set, history);
    let next = own.last().map_or(1, |r| r.revision.saturating_add(1));
    let candidate = new_revision(set, namespace, next, collision_count);
    let Some(index) = own.iter().rposition(|r| equal_revisions(r, &candidate)) else {
        return Registration::Create {
            revision: candidate,
        };
    };
    let revision = own[index].clone();
    let custom_version = missing_custom_version(set, &revision);
    if index + 1 == own.len() {
        Registration::Current {
            revision,
            custom_version,
        }
    } else {
        Registration::RollBack {
            revision,
            number: next,
            custom_version,
        }
    }
}

/// The custom version `revision` must be labelled with, when it is not already.
pub fn missing_custom_version(set: &SidecarSet, revision: &ControllerRevision) -> Option<String> {
    let version = set.custom_version()?;
    (label(revision, SIDECARSET_CUSTOM_VERSION_LABEL) != Some(version)).then(|| version.to_owned())
}

/// Which of `set`'s revisions to delete, oldest first, to get back to its history limit.
///
/// `history` is what was listed; `latest` (the registered revision's name) counts as stored even
/// when the list predates its creation. `in_use` holds the revisions matched pods record.
pub fn revisions_to_delete(
    set: &SidecarSet,
    history: &[ControllerRevision],
    latest: &str,
    in_use: &BTreeSet<String>,
) -> Vec<String> {
    let limit = set
        .spec
        .revision_history_limit
        .unwrap_or(DEFAULT_HISTORY_LIMIT)
        .max(1);
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let own = own_revisions(set, history);
    // The same revision may be listed twice (before and after a renumbering): count names.
    let mut stored: BTreeSet<&str> = own
        .iter()
        .filter_map(|r| r.metadata.name.as_deref())
        .collect();
    stored.insert(latest);
    let Some(mut excess) = stored.len().checked_sub(limit).filter(|&n| n > 0) else {
        return Vec::new();
    };

    let mut protected: BTreeSet<&str> = in_use.iter().map(String::as_str).collect();
    protected.insert(latest);
    if let Some(wanted) = &set.spec.injection_strategy.revision {
        if let Some(name) = &wanted.revision_name {
            protected.insert(name);
        }
        if let Some(version) = &wanted.custom_version
            && let Some(newest) = own
                .iter()
                .rev()
                .find(|r| label(r, SIDECARSET_CUSTOM_VERSION_LABEL) == Some(version.as_str()))
                .and_then(|r| r.metadata.name.as_deref())
        {
            protected.insert(newest);
        }
    }

    let mut seen = BTreeSet::new();
    let mut doomed = Vec::new();
    for name in own.iter().filter_map(|r| r.metadata.name.as_deref()) {
        if excess == 0 {
            break;
        }
        if seen.insert(name) && !protected.contains(name) {
            doomed.push(name.to_owned());
            excess -= 1;
        }
    }
    doomed
}

#[cfg(any(test, feature = "test-fixtures"))]
pub mod fixtures;
#[cfg(test)]
mod tests;
