//! The ControllerRevision history of a SidecarSet (upstream's `registerLatestRevision`,
//! `history_control.go` and Kubernetes' `controller/history`).
//!
//! Every version of what a SidecarSet injects is kept as a ControllerRevision, so that
//! `injectionStrategy.revision` can inject an older version ([`crate::sidecar::revision`]) and
//! pods can record which version they got. The rules:
//!
//! - **Where and whose.** Revisions live in the manager's namespace (the SidecarSet is
//!   cluster-scoped). One belongs to a SidecarSet when it is labelled
//!   `kruise.io/sidecarset-name: <name>` and has either no controller owner or the SidecarSet
//!   (by UID) as its controller ([`is_own_revision`]).
//! - **What.** `data` is `{"spec":{"$patch":"replace","containers":…,"initContainers":…,
//!   "volumes":…,"imagePullSecrets":…,"patchPodMetadata":…}}`, an empty list written as `null`
//!   ([`revision_data`]). Labels: the SidecarSet's own, plus `kruise.io/sidecarset-name`, the hash
//!   under both `controller.kubernetes.io/hash` (Kubernetes' history label, which upstream
//!   writes) and `controller-revision-hash`, plus `apps.kruise.io/sidecarset-custom-version` when
//!   the SidecarSet has a custom version. Annotations: all of the SidecarSet's (they carry both
//!   sidecar hashes, which injecting an old version reuses). One controller owner reference.
//! - **Name.** `<sidecarset>-<hash>`, the SidecarSet name cut to 223 bytes. The hash is 32-bit
//!   FNV-1 over the data's JSON text followed by the decimal collision count, printed as a
//!   decimal number and passed through `SafeEncodeString` ([`revision_name`]).
//! - **Registration** ([`plan_registration`], [`register`]): when the newest revision records
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
//! spec our revision name equals upstream's, and [`register`] stores those exact bytes, so
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
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use crate::apis::sidecarset::{
    SidecarContainer, SidecarSet, SidecarSetPatchPodMetadata, SidecarSetSpec,
};
use crate::apis::well_known::{
    CONTROLLER_REVISION_HASH, SIDECARSET_CUSTOM_VERSION_LABEL, SIDECARSET_NAME_LABEL,
};
use crate::sidecar::gojson::write_generic;
use crate::sidecar::hash::{hash_input, safe_encode_string};

/// Kubernetes' `controller/history` label for a revision's hash; upstream's revisions carry it.
pub const HISTORY_HASH_LABEL: &str = "controller.kubernetes.io/hash";

/// The SidecarSet controller's field manager (kept here so this module stands alone).
const FIELD_MANAGER: &str = "kruise-rs-sidecarset";
/// `revisionHistoryLimit` when unset.
const DEFAULT_HISTORY_LIMIT: i32 = 10;
/// Kubernetes cuts the name prefix here so that prefix, dash and hash fit in 253 bytes.
const MAX_NAME_PREFIX: usize = 223;
/// Names to try before giving up on collisions; each collision needs a 32-bit hash clash.
const CREATE_ATTEMPTS: usize = 10;

// --- Building a revision -------------------------------------------------------------------------

/// The `data` of a revision recording `spec`: the injected parts, to be restored over a later
/// spec with `$patch: replace`.
pub fn revision_data(spec: &SidecarSetSpec) -> Value {
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
pub fn revision_hash(data: &[u8], collision_count: i32) -> String {
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
pub fn revision_name(set_name: &str, data: &[u8], collision_count: i32) -> String {
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
/// cluster); [`register`] refuses such a SidecarSet.
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
pub fn own_revisions<'a>(
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

/// Kubernetes' revision order: by number, then creation time, then name.
fn revision_order(r: &ControllerRevision) -> (i64, Option<&Time>, &str) {
    (
        r.revision,
        r.metadata.creation_timestamp.as_ref(),
        r.metadata.name.as_deref().unwrap_or_default(),
    )
}

fn label<'a>(revision: &'a ControllerRevision, key: &str) -> Option<&'a str> {
    revision
        .metadata
        .labels
        .as_ref()?
        .get(key)
        .map(String::as_str)
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
        containers: recorded_field::<Vec<SidecarContainer>>(spec, "containers")?,
        init_containers: recorded_field::<Vec<SidecarContainer>>(spec, "initContainers")?,
        volumes: recorded_field::<Vec<Volume>>(spec, "volumes")?,
        image_pull_secrets: recorded_field::<Vec<LocalObjectReference>>(spec, "imagePullSecrets")?,
        patch_pod_metadata: recorded_field::<Vec<SidecarSetPatchPodMetadata>>(
            spec,
            "patchPodMetadata",
        )?,
        ..SidecarSetSpec::default()
    };
    Some(revision_data(&recorded))
}

/// A recorded field; absent or `null` is empty, as when restoring.
fn recorded_field<T: DeserializeOwned + Default>(
    spec: &Map<String, Value>,
    key: &str,
) -> Option<T> {
    match spec.get(key) {
        None | Some(Value::Null) => Some(T::default()),
        Some(v) => T::deserialize(v).ok(),
    }
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
fn missing_custom_version(set: &SidecarSet, revision: &ControllerRevision) -> Option<String> {
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

// --- Writing -------------------------------------------------------------------------------------

/// Why the history could not be brought up to date.
#[derive(Debug, thiserror::Error)]
pub enum RevisionsError {
    #[error(
        "SidecarSet {sidecarset:?} has no metadata.name or metadata.uid, so it cannot own ControllerRevisions"
    )]
    NotStored { sidecarset: String },
    #[error("creating ControllerRevision {revision} of SidecarSet {sidecarset}: {source}")]
    Create {
        sidecarset: String,
        revision: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "SidecarSet {sidecarset}: gave up creating its ControllerRevision after {attempts} names, the last {revision}, were taken by other revisions (collisionCount now {collision_count})"
    )]
    Collisions {
        sidecarset: String,
        revision: String,
        attempts: usize,
        collision_count: i32,
    },
    #[error("reading ControllerRevision {revision} of SidecarSet {sidecarset}: {source}")]
    Get {
        sidecarset: String,
        revision: String,
        #[source]
        source: kube::Error,
    },
    #[error("updating ControllerRevision {revision} of SidecarSet {sidecarset}: {source}")]
    Update {
        sidecarset: String,
        revision: String,
        #[source]
        source: kube::Error,
    },
    /// The revision's name starts with its SidecarSet's.
    #[error("deleting old SidecarSet ControllerRevision {revision}: {source}")]
    Delete {
        revision: String,
        #[source]
        source: kube::Error,
    },
}

/// The registered latest revision, and the collision count to store in the SidecarSet's status.
#[derive(Clone, Debug, PartialEq)]
pub struct Registered {
    pub latest: ControllerRevision,
    pub collision_count: i32,
}

/// Registers `set`'s current spec in `api` (the manager namespace, `namespace`), given the
/// revisions listed there, and returns the latest revision. The caller stores the returned
/// collision count in `status.collisionCount` and then truncates the history.
pub async fn register(
    api: &Api<ControllerRevision>,
    set: &SidecarSet,
    history: &[ControllerRevision],
    namespace: &str,
) -> Result<Registered, RevisionsError> {
    let set_name = set.metadata.name.clone().unwrap_or_default();
    if set_name.is_empty() || set.metadata.uid.as_deref().is_none_or(str::is_empty) {
        return Err(RevisionsError::NotStored {
            sidecarset: set_name,
        });
    }
    let collision_count = set
        .status
        .as_ref()
        .and_then(|s| s.collision_count)
        .unwrap_or(0);
    match plan_registration(set, history, namespace, collision_count) {
        Registration::Current {
            revision,
            custom_version,
        } => Ok(Registered {
            latest: update(api, &set_name, revision, None, custom_version).await?,
            collision_count,
        }),
        Registration::RollBack {
            revision,
            number,
            custom_version,
        } => Ok(Registered {
            latest: update(api, &set_name, revision, Some(number), custom_version).await?,
            collision_count,
        }),
        Registration::Create { revision } => {
            create(api, set, namespace, revision, collision_count).await
        }
    }
}

/// Creates `first`, moving to the next collision count while its name is taken by a different
/// revision. A name taken by an equal revision of this SidecarSet means an earlier attempt
/// succeeded unseen (the listing lagged): that one is used.
async fn create(
    api: &Api<ControllerRevision>,
    set: &SidecarSet,
    namespace: &str,
    first: ControllerRevision,
    mut collision_count: i32,
) -> Result<Registered, RevisionsError> {
    let set_name = set.metadata.name.clone().unwrap_or_default();
    let number = first.revision;
    let mut candidate = first;
    let mut name = String::new();
    for _ in 0..CREATE_ATTEMPTS {
        name = candidate.metadata.name.clone().unwrap_or_default();
        let error = |source| RevisionsError::Create {
            sidecarset: set_name.clone(),
            revision: name.clone(),
            source,
        };
        match create_exact(api, &candidate).await {
            Ok(created) => {
                return Ok(Registered {
                    latest: created,
                    collision_count,
                });
            }
            Err(e) if status_code(&e) == Some(409) => {}
            Err(e) => return Err(error(e)),
        }
        let existing = api
            .get_opt(&name)
            .await
            .map_err(|source| RevisionsError::Get {
                sidecarset: set_name.clone(),
                revision: name.clone(),
                source,
            })?;
        match existing {
            Some(existing)
                if is_own_revision(set, &existing) && equal_revisions(&existing, &candidate) =>
            {
                let custom_version = missing_custom_version(set, &existing);
                return Ok(Registered {
                    latest: update(api, &set_name, existing, None, custom_version).await?,
                    collision_count,
                });
            }
            Some(_) => collision_count = collision_count.saturating_add(1),
            // Deleted since: the same name is free again.
            None => {}
        }
        candidate = new_revision(set, namespace, number, collision_count);
    }
    Err(RevisionsError::Collisions {
        sidecarset: set_name,
        revision: name,
        attempts: CREATE_ATTEMPTS,
        collision_count,
    })
}

/// POSTs `revision` with its data written byte for byte as upstream writes it, so that
/// upstream's byte comparison of revisions also accepts ours (`Api::create` would let serde
/// choose the bytes, which the apiserver keeps verbatim in `data`).
async fn create_exact(
    api: &Api<ControllerRevision>,
    revision: &ControllerRevision,
) -> Result<ControllerRevision, kube::Error> {
    let object = serde_json::to_value(revision).map_err(kube::Error::SerdeError)?;
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    };
    let mut request = kube::core::Request::new(api.resource_url())
        .create(&params, go_json_text(&object).into_bytes())
        .map_err(kube::Error::BuildRequest)?;
    request.extensions_mut().insert("create");
    api.clone().into_client().request(request).await
}

/// Renumbers and/or relabels `revision`, guarded by its resourceVersion; on a conflict, once more
/// against the stored object. Without changes, returns it as it is.
async fn update(
    api: &Api<ControllerRevision>,
    set_name: &str,
    revision: ControllerRevision,
    number: Option<i64>,
    custom_version: Option<String>,
) -> Result<ControllerRevision, RevisionsError> {
    if number.is_none() && custom_version.is_none() {
        return Ok(revision);
    }
    let name = revision.metadata.name.clone().unwrap_or_default();
    let update_error = |source| RevisionsError::Update {
        sidecarset: set_name.to_owned(),
        revision: name.clone(),
        source,
    };
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    let body = update_patch(&revision, number, custom_version.as_deref());
    match api.patch(&name, &params, &Patch::Merge(&body)).await {
        Ok(updated) => return Ok(updated),
        Err(e) if status_code(&e) == Some(409) => {}
        Err(e) => return Err(update_error(e)),
    }
    // Written by someone else since it was listed (data is immutable, so it still records the
    // same version): apply the change to what is stored now.
    let stored = api.get(&name).await.map_err(|source| RevisionsError::Get {
        sidecarset: set_name.to_owned(),
        revision: name.clone(),
        source,
    })?;
    let body = update_patch(&stored, number, custom_version.as_deref());
    api.patch(&name, &params, &Patch::Merge(&body))
        .await
        .map_err(update_error)
}

fn update_patch(
    revision: &ControllerRevision,
    number: Option<i64>,
    custom_version: Option<&str>,
) -> Value {
    let mut metadata = Map::new();
    if let Some(version) = &revision.metadata.resource_version {
        // A merge patch carrying resourceVersion fails with 409 if the object changed.
        metadata.insert("resourceVersion".to_owned(), Value::from(version.as_str()));
    }
    if let Some(custom_version) = custom_version {
        metadata.insert(
            "labels".to_owned(),
            json!({ SIDECARSET_CUSTOM_VERSION_LABEL: custom_version }),
        );
    }
    let mut patch = json!({ "metadata": metadata });
    if let Some(number) = number {
        patch["revision"] = Value::from(number);
    }
    patch
}

/// Deletes the revisions `names` (already-deleted ones are fine). Every name is tried; the
/// first failure is returned.
pub async fn delete_revisions(
    api: &Api<ControllerRevision>,
    names: &[String],
) -> Result<(), RevisionsError> {
    let mut first_error = None;
    for name in names {
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(e) if status_code(&e) == Some(404) => {}
            Err(source) => {
                tracing::warn!(
                    revision = %name,
                    error = %source,
                    "cannot delete a SidecarSet revision"
                );
                first_error.get_or_insert(RevisionsError::Delete {
                    revision: name.clone(),
                    source,
                });
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

fn status_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::sidecarset::{SidecarSetInjectRevision, SidecarSetStatus};
    use crate::apis::well_known::{SIDECARSET_HASH, SIDECARSET_HASH_WITHOUT_IMAGE};
    use crate::sidecar::hash::{sidecarset_hash, sidecarset_hash_without_image};
    use crate::sidecar::revision::restore;
    use std::collections::BTreeMap;

    const NS: &str = "kruise-system";
    const UID: &str = "1223344";

    fn spec(v: Value) -> SidecarSetSpec {
        serde_json::from_value(v).expect("valid spec")
    }

    fn minimal() -> Value {
        json!({"containers": [{"name": "c", "image": "i"}]})
    }

    fn rich() -> Value {
        json!({
            "containers": [{
                "name": "proxy",
                "image": "example.com/proxy:1.2",
                "command": ["/bin/sh", "-c", "run <a> && b"],
                "env": [{"name": "A", "value": "1"}],
                "ports": [{"containerPort": 15000, "name": "admin"}],
                "resources": {"limits": {"cpu": "0.5", "memory": "1024Mi"}},
                "volumeMounts": [{"name": "cfg", "mountPath": "/etc/cfg"}],
                "podInjectPolicy": "AfterAppContainer",
                "upgradeStrategy": {"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "example.com/empty:1"},
                "shareVolumePolicy": {"type": "enabled"},
                "transferEnv": [{"sourceContainerName": "app", "envNames": ["X"]}],
            }],
            "initContainers": [
                {"name": "init", "image": "busybox", "restartPolicy": "Always"},
                {"name": "plain", "image": "busybox", "args": ["x"]},
            ],
            "volumes": [
                {"name": "cfg", "configMap": {"name": "cfg", "defaultMode": 420, "optional": false}},
                {"name": "scratch", "emptyDir": {}},
                {"name": "host", "hostPath": {"path": "/var/log", "type": "Directory"}},
                {"name": "sec", "secret": {"secretName": "s", "items": [{"key": "k", "path": "p"}]}},
            ],
            "imagePullSecrets": [{"name": "regcred"}],
            "patchPodMetadata": [{
                "annotations": {"oom-score": "{\"log-agent\": 1}", "b": "2"},
                "patchPolicy": "MergePatchJson",
            }],
        })
    }

    fn sidecarset(name: &str, spec_json: Value) -> SidecarSet {
        let mut set = SidecarSet::new(name, spec(spec_json));
        set.metadata.uid = Some(UID.into());
        set.spec.revision_history_limit = Some(10);
        set
    }

    fn text_of(s: &SidecarSetSpec) -> String {
        go_json_text(&revision_data(s))
    }

    fn name_of(r: &ControllerRevision) -> &str {
        r.metadata.name.as_deref().unwrap_or_default()
    }

    // --- Names and data, against Go --------------------------------------------------------------
    //
    // Expected texts and names were produced by Go 1.26 running upstream's steps (kruise
    // v1beta1 field tags, `json.Marshal` → map → `json.Marshal`, then k8s.io/kubernetes v1.36.3
    // `history.HashControllerRevision` and `ControllerRevisionName`) on the same input JSON.

    #[test]
    fn fnv1_matches_the_published_vectors() {
        assert_eq!(fnv1_32(&[]), 0x811c_9dc5);
        assert_eq!(fnv1_32(&[b"a"]), 0x050c_5d7e);
        assert_eq!(fnv1_32(&[b"foobar"]), 0x31f0_b262);
        assert_eq!(
            fnv1_32(&[b"foo", b"", b"bar"]),
            0x31f0_b262,
            "parts are one stream"
        );
    }

    #[test]
    fn a_minimal_spec_is_named_as_upstream_names_it() {
        let s = spec(minimal());
        let text = text_of(&s);
        assert_eq!(
            text,
            r#"{"spec":{"$patch":"replace","containers":[{"image":"i","name":"c","resources":{},"shareVolumePolicy":{},"upgradeStrategy":{}}],"imagePullSecrets":null,"initContainers":null,"patchPodMetadata":null,"volumes":null}}"#
        );
        let name = |cc| revision_name("sidecarset1", text.as_bytes(), cc);
        assert_eq!(name(0), "sidecarset1-65fd5cd67c");
        assert_eq!(name(1), "sidecarset1-65fd5cd67b");
        assert_eq!(name(7), "sidecarset1-65fd5cd678");
        assert_eq!(name(-1), "sidecarset1-7cdbf4f7f7");
    }

    #[test]
    fn a_rich_spec_is_written_and_named_byte_for_byte_as_upstream() {
        let s = spec(rich());
        let text = text_of(&s);
        assert_eq!(
            text,
            r#"{"spec":{"$patch":"replace","containers":[{"command":["/bin/sh","-c","run \u003ca\u003e \u0026\u0026 b"],"env":[{"name":"A","value":"1"}],"image":"example.com/proxy:1.2","name":"proxy","podInjectPolicy":"AfterAppContainer","ports":[{"containerPort":15000,"name":"admin"}],"resources":{"limits":{"cpu":"500m","memory":"1Gi"}},"shareVolumePolicy":{"type":"enabled"},"transferEnv":[{"envNames":["X"],"sourceContainerName":"app"}],"upgradeStrategy":{"hotUpgradeEmptyImage":"example.com/empty:1","upgradeType":"HotUpgrade"},"volumeMounts":[{"mountPath":"/etc/cfg","name":"cfg"}]}],"imagePullSecrets":[{"name":"regcred"}],"initContainers":[{"image":"busybox","name":"init","resources":{},"restartPolicy":"Always","shareVolumePolicy":{},"upgradeStrategy":{}},{"args":["x"],"image":"busybox","name":"plain","resources":{},"shareVolumePolicy":{},"upgradeStrategy":{}}],"patchPodMetadata":[{"annotations":{"b":"2","oom-score":"{\"log-agent\": 1}"},"patchPolicy":"MergePatchJson"}],"volumes":[{"configMap":{"defaultMode":420,"name":"cfg","optional":false},"name":"cfg"},{"emptyDir":{},"name":"scratch"},{"hostPath":{"path":"/var/log","type":"Directory"},"name":"host"},{"name":"sec","secret":{"items":[{"key":"k","path":"p"}],"secretName":"s"}}]}}"#
        );
        assert_eq!(
            revision_name("sidecarset-rich", text.as_bytes(), 0),
            "sidecarset-rich-7868cf7968"
        );
        assert_eq!(
            revision_name("sidecarset-rich", text.as_bytes(), 3),
            "sidecarset-rich-7868cf796c"
        );
    }

    #[test]
    fn an_empty_spec_records_nulls() {
        let text = text_of(&SidecarSetSpec::default());
        assert_eq!(
            text,
            r#"{"spec":{"$patch":"replace","containers":null,"imagePullSecrets":null,"initContainers":null,"patchPodMetadata":null,"volumes":null}}"#
        );
        assert_eq!(
            revision_name("empty", text.as_bytes(), 0),
            "empty-5c7c857c5f"
        );
    }

    #[test]
    fn a_nameless_pull_secret_is_written_as_go_omits_it() {
        let s = spec(json!({
            "containers": [{"name": "c", "image": "i"}],
            "imagePullSecrets": [{"name": ""}],
        }));
        let text = text_of(&s);
        assert!(text.contains(r#""imagePullSecrets":[{}]"#), "{text}");
        assert_eq!(revision_name("sec", text.as_bytes(), 0), "sec-65f7465d4b");
    }

    #[test]
    fn long_sidecarset_names_are_cut_to_223_bytes() {
        let long = "s".repeat(240);
        let name = revision_name(&long, text_of(&spec(minimal())).as_bytes(), 1);
        assert_eq!(name, format!("{}-65fd5cd67b", "s".repeat(223)));
        assert_eq!(controller_revision_name("short", "h"), "short-h");
        // Never split a character, whatever the input.
        let odd = format!("{}é", "x".repeat(222));
        assert_eq!(
            controller_revision_name(&odd, "h"),
            format!("{}-h", "x".repeat(222))
        );
    }

    #[test]
    fn go_strings_escape_html_and_control_characters() {
        assert_eq!(
            go_json_text(
                &json!({"b": "a<b>&c\u{2028}\u{2029}\u{1}\n\"\\é", "a": [1, -2, true, null]})
            ),
            r#"{"a":[1,-2,true,null],"b":"a\u003cb\u003e\u0026c\u2028\u2029\u0001\n\"\\é"}"#
        );
    }

    #[test]
    fn the_data_restores_to_the_same_version() {
        let mut set = sidecarset("rich", rich());
        set.metadata.annotations = Some(BTreeMap::from([
            (SIDECARSET_HASH.to_owned(), sidecarset_hash(&set.spec)),
            (
                SIDECARSET_HASH_WITHOUT_IMAGE.to_owned(),
                sidecarset_hash_without_image(&set.spec),
            ),
        ]));
        let revision = new_revision(&set, NS, 1, 0);
        // Restore over a different current spec, as injection of an old version does.
        let mut current = set.clone();
        current.spec = spec(minimal());
        current.spec.selector = set.spec.selector.clone();
        let restored = restore(&current, &revision).expect("restorable");
        assert_eq!(restored.spec.volumes, set.spec.volumes);
        assert_eq!(
            restored.spec.image_pull_secrets,
            set.spec.image_pull_secrets
        );
        assert_eq!(
            restored.spec.patch_pod_metadata,
            set.spec.patch_pod_metadata
        );
        assert_eq!(restored.spec.init_containers.len(), 2);
        // Go's always-written `{}` structs and canonical quantities decode to the same version.
        assert_eq!(
            sidecarset_hash(&restored.spec),
            sidecarset_hash(&set.spec),
            "containers and native-sidecar init containers"
        );
        assert_eq!(
            sidecarset_hash_without_image(&restored.spec),
            sidecarset_hash_without_image(&set.spec)
        );
        assert_eq!(restored.hash, sidecarset_hash(&set.spec));
        assert_eq!(revision_data(&restored.spec), revision_data(&set.spec));
        assert_eq!(
            restored.controller_revision.as_deref(),
            Some(name_of(&revision))
        );
    }

    #[test]
    fn an_empty_revision_restores_to_empty_lists() {
        let set = sidecarset("s", json!({}));
        let mut current = set.clone();
        current.spec = spec(rich());
        let restored = restore(&current, &new_revision(&set, NS, 1, 0)).expect("restorable");
        assert!(restored.spec.containers.is_empty());
        assert!(restored.spec.init_containers.is_empty());
        assert!(restored.spec.volumes.is_empty());
        assert!(restored.spec.image_pull_secrets.is_empty());
        assert!(restored.spec.patch_pod_metadata.is_empty());
    }

    // --- The revision object ---------------------------------------------------------------------

    #[test]
    fn a_new_revision_carries_labels_annotations_owner_and_data() {
        let mut set = sidecarset("sidecarset1", minimal());
        set.metadata.labels = Some(BTreeMap::from([
            ("team".to_owned(), "a".to_owned()),
            (SIDECARSET_NAME_LABEL.to_owned(), "spoofed".to_owned()),
        ]));
        set.metadata.annotations = Some(BTreeMap::from([
            (SIDECARSET_HASH.to_owned(), "h1".to_owned()),
            (SIDECARSET_HASH_WITHOUT_IMAGE.to_owned(), "h2".to_owned()),
            ("note".to_owned(), "x".to_owned()),
        ]));
        let r = new_revision(&set, NS, 4, 1);
        assert_eq!(name_of(&r), "sidecarset1-65fd5cd67b");
        assert_eq!(r.metadata.namespace.as_deref(), Some(NS));
        assert_eq!(r.revision, 4);
        let labels = r.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels,
            BTreeMap::from([
                ("team".to_owned(), "a".to_owned()),
                (SIDECARSET_NAME_LABEL.to_owned(), "sidecarset1".to_owned()),
                (HISTORY_HASH_LABEL.to_owned(), "65fd5cd67b".to_owned()),
                (CONTROLLER_REVISION_HASH.to_owned(), "65fd5cd67b".to_owned()),
            ])
        );
        assert_eq!(r.metadata.annotations, set.metadata.annotations);
        assert_eq!(
            r.metadata.owner_references,
            Some(vec![OwnerReference {
                api_version: "apps.kruise.io/v1beta1".into(),
                kind: "SidecarSet".into(),
                name: "sidecarset1".into(),
                uid: UID.into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }])
        );
        assert_eq!(r.data, Some(RawExtension(revision_data(&set.spec))));
    }

    #[test]
    fn the_custom_version_label_comes_from_the_spec_or_the_v1alpha1_label() {
        let mut set = sidecarset("s", minimal());
        set.metadata.labels = Some(BTreeMap::from([(
            SIDECARSET_CUSTOM_VERSION_LABEL.to_owned(),
            "old".to_owned(),
        )]));
        let version = |set: &SidecarSet| {
            label(
                &new_revision(set, NS, 1, 0),
                SIDECARSET_CUSTOM_VERSION_LABEL,
            )
            .map(str::to_owned)
        };
        assert_eq!(version(&set).as_deref(), Some("old"));
        set.spec.custom_version = Some("v2".into());
        assert_eq!(version(&set).as_deref(), Some("v2"));
        set.metadata.labels = None;
        set.spec.custom_version = None;
        assert_eq!(version(&set), None);
    }

    #[test]
    fn without_a_uid_there_is_no_owner_reference() {
        let mut set = sidecarset("s", minimal());
        set.metadata.uid = None;
        assert_eq!(new_revision(&set, NS, 1, 0).metadata.owner_references, None);
    }

    // --- Ownership and equality ------------------------------------------------------------------

    fn owned_by(mut r: ControllerRevision, uid: &str, controller: bool) -> ControllerRevision {
        r.metadata.owner_references = Some(vec![OwnerReference {
            uid: uid.into(),
            controller: Some(controller),
            ..OwnerReference::default()
        }]);
        r
    }

    #[test]
    fn own_revisions_are_labelled_and_not_controlled_by_others() {
        let set = sidecarset("s", minimal());
        let r = new_revision(&set, NS, 1, 0);
        assert!(is_own_revision(&set, &r));
        assert!(is_own_revision(&set, &owned_by(r.clone(), UID, true)));
        assert!(
            is_own_revision(&set, &owned_by(r.clone(), "other", false)),
            "only a controller reference excludes"
        );
        let mut orphan = r.clone();
        orphan.metadata.owner_references = None;
        assert!(is_own_revision(&set, &orphan), "orphans are adopted");
        assert!(!is_own_revision(&set, &owned_by(r.clone(), "other", true)));
        let other = sidecarset("other", minimal());
        assert!(!is_own_revision(&other, &r));
        let mut unlabelled = r.clone();
        unlabelled.metadata.labels = None;
        assert!(!is_own_revision(&set, &unlabelled));
        let mut nameless = set.clone();
        nameless.metadata.name = None;
        assert!(!is_own_revision(&nameless, &unlabelled));
    }

    fn with_data(data: Value) -> ControllerRevision {
        ControllerRevision {
            data: Some(RawExtension(data)),
            ..ControllerRevision::default()
        }
    }

    #[test]
    fn revisions_are_equal_by_meaning() {
        let set = sidecarset("s", rich());
        let ours = new_revision(&set, NS, 1, 0);
        assert!(equal_revisions(&ours, &new_revision(&set, NS, 7, 3)));

        // As upstream's kruise-manager writes it (parsed from its text).
        let upstream: Value = serde_json::from_str(&text_of(&set.spec)).expect("json");
        assert!(equal_revisions(&ours, &with_data(upstream)));

        // As serde writes the spec (the integration tests' `record_revision`): no Go-only
        // `{}` structs, quantities as written.
        let plain = serde_json::to_value(&set.spec).expect("json");
        let field = |k: &str| plain.get(k).cloned().unwrap_or(Value::Null);
        let serde_form = json!({"spec": {
            "$patch": "replace",
            "volumes": field("volumes"),
            "containers": field("containers"),
            "initContainers": field("initContainers"),
            "imagePullSecrets": field("imagePullSecrets"),
            "patchPodMetadata": field("patchPodMetadata"),
        }});
        assert_ne!(serde_form, revision_data(&set.spec));
        assert!(equal_revisions(&ours, &with_data(serde_form)));

        // Absent and null lists are the same empty list.
        let empty = new_revision(&sidecarset("s", json!({})), NS, 1, 0);
        assert!(equal_revisions(
            &empty,
            &with_data(json!({"spec": {"$patch": "replace"}}))
        ));
    }

    #[test]
    fn different_versions_are_not_equal() {
        let a = new_revision(&sidecarset("s", minimal()), NS, 1, 0);
        let b = new_revision(
            &sidecarset("s", json!({"containers": [{"name": "c", "image": "j"}]})),
            NS,
            1,
            0,
        );
        assert!(!equal_revisions(&a, &b));
        let mut c_spec = minimal();
        c_spec["volumes"] = json!([{"name": "v", "emptyDir": {}}]);
        let c = new_revision(&sidecarset("s", c_spec), NS, 1, 0);
        assert!(!equal_revisions(&a, &c), "volumes count");
        let mut d_spec = minimal();
        d_spec["patchPodMetadata"] = json!([{"annotations": {"a": "b"}}]);
        let d = new_revision(&sidecarset("s", d_spec), NS, 1, 0);
        assert!(!equal_revisions(&a, &d), "metadata patches count");
    }

    #[test]
    fn odd_data_is_compared_as_it_is() {
        let a = new_revision(&sidecarset("s", minimal()), NS, 1, 0);
        assert!(!equal_revisions(&a, &ControllerRevision::default()));
        assert!(!equal_revisions(
            &ControllerRevision::default(),
            &ControllerRevision::default()
        ));
        // Without `$patch: replace`, or with fields this version does not record, data is not
        // reinterpreted: only identical JSON is equal.
        let merge = json!({"spec": {"containers": [{"name": "c", "image": "i"}]}});
        assert!(!equal_revisions(&a, &with_data(merge.clone())));
        assert!(equal_revisions(
            &with_data(merge.clone()),
            &with_data(merge)
        ));
        let mut extra = revision_data(&spec(minimal()));
        extra["spec"]["selector"] = json!({});
        assert!(!equal_revisions(&a, &with_data(extra)));
        let bad = json!({"spec": {"$patch": "replace", "containers": "nope"}});
        assert!(!equal_revisions(&a, &with_data(bad.clone())));
        assert!(equal_revisions(&with_data(bad.clone()), &with_data(bad)));
    }

    // --- Registration ----------------------------------------------------------------------------

    /// What the apiserver would hold after the plan is carried out; returns the latest name.
    fn apply(store: &mut Vec<ControllerRevision>, plan: Registration) -> String {
        let (name, number, custom_version) = match plan {
            Registration::Create { revision } => {
                let name = name_of(&revision).to_owned();
                store.push(revision);
                return name;
            }
            Registration::Current {
                revision,
                custom_version,
            } => (name_of(&revision).to_owned(), None, custom_version),
            Registration::RollBack {
                revision,
                number,
                custom_version,
            } => (name_of(&revision).to_owned(), Some(number), custom_version),
        };
        let stored = store
            .iter_mut()
            .find(|r| name_of(r) == name)
            .expect("planned revision is stored");
        if let Some(number) = number {
            stored.revision = number;
        }
        if let Some(version) = custom_version {
            stored
                .metadata
                .labels
                .get_or_insert_with(BTreeMap::new)
                .insert(SIDECARSET_CUSTOM_VERSION_LABEL.to_owned(), version);
        }
        name
    }

    /// Upstream's reconcile step: register, then truncate (no pods use anything).
    fn reconcile(store: &mut Vec<ControllerRevision>, set: &SidecarSet) -> (String, i64) {
        let latest = apply(store, plan_registration(set, store, NS, 0));
        let doomed = revisions_to_delete(set, store, &latest, &BTreeSet::new());
        store.retain(|r| !doomed.iter().any(|d| d == name_of(r)));
        let number = store
            .iter()
            .find(|r| name_of(r) == latest)
            .map(|r| r.revision)
            .unwrap_or_default();
        (latest, number)
    }

    #[test]
    fn upstream_get_active_revisions_create_update_rollback_and_limit() {
        // Upstream TestGetActiveRevisions.
        let mut store = Vec::new();
        let mut set = sidecarset("sidecarset1", minimal());
        assert_eq!(reconcile(&mut store, &set).1, 1, "create");

        let mut updated = set.clone();
        updated.spec.init_containers =
            spec(json!({"initContainers": [{"name": "emptyInitC"}]})).init_containers;
        updated.spec.volumes = spec(json!({"volumes": [{"name": "emptyVolume"}]})).volumes;
        updated.spec.image_pull_secrets = vec![LocalObjectReference {
            name: "emptySecret".into(),
        }];
        for _ in 0..5 {
            let (latest, number) = reconcile(&mut store, &updated);
            assert_eq!(number, 2, "update, then unchanged");
            let stored = store.iter().find(|r| name_of(r) == latest).expect("stored");
            let data = &stored.data.as_ref().expect("data").0["spec"];
            for key in [
                "volumes",
                "containers",
                "initContainers",
                "imagePullSecrets",
            ] {
                assert!(!data[key].is_null(), "{key} recorded");
            }
        }
        for _ in 0..5 {
            assert_eq!(reconcile(&mut store, &set).1, 3, "rollback, then unchanged");
        }
        assert_eq!(store.len(), 2, "a rollback creates nothing");

        for i in 0..100 {
            set.spec.containers[0].container.image = Some(i.to_string());
            reconcile(&mut store, &set);
        }
        assert_eq!(store.len(), 10, "revisionHistoryLimit");
    }

    #[test]
    fn an_empty_history_creates_revision_one() {
        let set = sidecarset("s", minimal());
        match plan_registration(&set, &[], NS, 2) {
            Registration::Create { revision } => {
                assert_eq!(revision.revision, 1);
                assert_eq!(
                    revision,
                    new_revision(&set, NS, 1, 2),
                    "collision count used"
                );
            }
            other => panic!("expected Create, got {other:?}"),
        }
    }

    #[test]
    fn a_changed_spec_gets_the_next_number() {
        let old = sidecarset("s", minimal());
        let history = [new_revision(&old, NS, 5, 0)];
        let new = sidecarset("s", json!({"containers": [{"name": "c", "image": "j"}]}));
        let plan = plan_registration(&new, &history, NS, 0);
        assert!(matches!(&plan, Registration::Create { revision } if revision.revision == 6));
    }

    #[test]
    fn the_newest_equal_revision_is_kept_even_from_upstream() {
        let set = sidecarset("s", rich());
        let mut upstream = new_revision(&set, NS, 3, 0);
        upstream.data = Some(RawExtension(
            serde_json::from_str(&text_of(&set.spec)).expect("json"),
        ));
        upstream.metadata.name = Some("s-written-by-upstream".into());
        let older = new_revision(&sidecarset("s", minimal()), NS, 2, 0);
        let plan = plan_registration(&set, &[upstream.clone(), older], NS, 0);
        assert_eq!(
            plan,
            Registration::Current {
                revision: upstream,
                custom_version: None
            }
        );
    }

    #[test]
    fn an_older_equal_revision_is_rolled_back_to_the_front() {
        let v1 = sidecarset("s", minimal());
        let v2 = sidecarset("s", json!({"containers": [{"name": "c", "image": "j"}]}));
        let history = [new_revision(&v2, NS, 2, 0), new_revision(&v1, NS, 1, 0)];
        match plan_registration(&v1, &history, NS, 0) {
            Registration::RollBack {
                revision,
                number,
                custom_version,
            } => {
                assert_eq!(name_of(&revision), name_of(&history[1]));
                assert_eq!(number, 3);
                assert_eq!(custom_version, None);
            }
            other => panic!("expected RollBack, got {other:?}"),
        }
    }

    #[test]
    fn of_several_equal_revisions_the_newest_is_rolled_back() {
        let v1 = sidecarset("s", minimal());
        let v2 = sidecarset("s", json!({"containers": [{"name": "c", "image": "j"}]}));
        let mut dup = new_revision(&v1, NS, 3, 1);
        dup.metadata.name = Some("s-dup".into());
        let history = [
            new_revision(&v1, NS, 1, 0),
            dup,
            new_revision(&v2, NS, 4, 0),
        ];
        let plan = plan_registration(&v1, &history, NS, 0);
        assert!(
            matches!(
                &plan,
                Registration::RollBack { revision, number: 5, .. } if name_of(revision) == "s-dup"
            ),
            "{plan:?}"
        );
    }

    #[test]
    fn equal_numbers_are_ordered_by_creation_time_then_name() {
        let v1 = sidecarset("s", minimal());
        let v2 = sidecarset("s", json!({"containers": [{"name": "c", "image": "j"}]}));
        let mut a = new_revision(&v1, NS, 2, 0);
        a.metadata.name = Some("s-b".into());
        let mut b = new_revision(&v2, NS, 2, 0);
        b.metadata.name = Some("s-a".into());
        // Same number, no timestamps: "s-b" (v1) sorts last, so v1 is current.
        let plan = plan_registration(&v1, &[a.clone(), b.clone()], NS, 0);
        assert!(matches!(plan, Registration::Current { .. }), "{plan:?}");
        // A later creation time wins over the name.
        b.metadata.creation_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        let plan = plan_registration(&v1, &[a, b], NS, 0);
        assert!(
            matches!(plan, Registration::RollBack { number: 3, .. }),
            "{plan:?}"
        );
    }

    #[test]
    fn other_sidecarsets_revisions_are_ignored() {
        let set = sidecarset("s", minimal());
        let mut foreign = new_revision(&sidecarset("t", minimal()), NS, 50, 0);
        foreign.metadata.name = Some("t-x".into());
        let stolen = owned_by(new_revision(&set, NS, 40, 0), "another-uid", true);
        let plan = plan_registration(&set, &[foreign, stolen], NS, 0);
        assert!(
            matches!(&plan, Registration::Create { revision } if revision.revision == 1),
            "{plan:?}"
        );
    }

    #[test]
    fn a_missing_custom_version_label_is_reported() {
        let mut set = sidecarset("s", minimal());
        let stored = new_revision(&set, NS, 1, 0);
        set.spec.custom_version = Some("v1".into());
        let plan = plan_registration(&set, std::slice::from_ref(&stored), NS, 0);
        assert_eq!(
            plan,
            Registration::Current {
                revision: stored.clone(),
                custom_version: Some("v1".into())
            }
        );
        // Labelled already: nothing to do.
        let labelled = new_revision(&set, NS, 1, 0);
        assert!(matches!(
            plan_registration(&set, &[labelled], NS, 0),
            Registration::Current {
                custom_version: None,
                ..
            }
        ));
        // A rollback carries the label too.
        let other = new_revision(
            &sidecarset("s", json!({"containers": [{"name": "c", "image": "j"}]})),
            NS,
            2,
            0,
        );
        assert!(matches!(
            plan_registration(&set, &[stored, other], NS, 0),
            Registration::RollBack { custom_version: Some(v), number: 3, .. } if v == "v1"
        ));
    }

    // --- Truncation ------------------------------------------------------------------------------

    fn numbered(set: &SidecarSet, count: i64) -> Vec<ControllerRevision> {
        (1..=count)
            .map(|i| {
                let mut r = new_revision(set, NS, i, 0);
                r.metadata.name = Some(format!("sidecar-{i}"));
                r
            })
            .collect()
    }

    /// Upstream TestTruncateHistory: 15 revisions, 100 pods recording `sidecar-(i % used + 1)`.
    fn in_use(used: usize) -> BTreeSet<String> {
        (0..100)
            .map(|i| format!("sidecar-{}", i % used + 1))
            .collect()
    }

    #[test]
    fn upstream_truncate_history_cases() {
        let set = sidecarset("sidecar", minimal());
        let history = numbered(&set, 15);
        for used in 1..=9 {
            let doomed = revisions_to_delete(&set, &history, "sidecar-15", &in_use(used));
            assert_eq!(doomed.len(), 5, "used {used}: back to the limit");
        }
        for (used, left) in [(10, 11), (11, 12), (14, 15), (15, 15), (20, 15)] {
            let doomed = revisions_to_delete(&set, &history, "sidecar-15", &in_use(used));
            assert_eq!(15 - doomed.len(), left, "used {used}");
        }
        let doomed = revisions_to_delete(&set, &history, "sidecar-15", &in_use(8));
        assert_eq!(
            doomed,
            [
                "sidecar-9",
                "sidecar-10",
                "sidecar-11",
                "sidecar-12",
                "sidecar-13"
            ],
            "oldest unused first; 1-8, 14 and 15 stay"
        );
    }

    #[test]
    fn the_limit_defaults_to_ten_and_is_at_least_one() {
        let mut set = sidecarset("sidecar", minimal());
        let history = numbered(&set, 12);
        let none = BTreeSet::new();
        set.spec.revision_history_limit = None;
        assert_eq!(
            revisions_to_delete(&set, &history, "sidecar-12", &none),
            ["sidecar-1", "sidecar-2"]
        );
        for limit in [0, -3, 1] {
            set.spec.revision_history_limit = Some(limit);
            let doomed = revisions_to_delete(&set, &history, "sidecar-12", &none);
            assert_eq!(doomed.len(), 11, "limit {limit}");
            assert!(!doomed.contains(&"sidecar-12".to_owned()));
        }
        set.spec.revision_history_limit = Some(12);
        assert!(revisions_to_delete(&set, &history, "sidecar-12", &none).is_empty());
    }

    #[test]
    fn the_latest_is_never_deleted_and_counts_even_if_unlisted() {
        let mut set = sidecarset("sidecar", minimal());
        set.spec.revision_history_limit = Some(3);
        let history = numbered(&set, 3);
        let none = BTreeSet::new();
        // Rolled back: the oldest listed number is the latest.
        assert_eq!(
            revisions_to_delete(&set, &history, "sidecar-1", &none),
            Vec::<String>::new()
        );
        // Just created, not yet in the listing: four stored.
        assert_eq!(
            revisions_to_delete(&set, &history, "sidecar-new", &none),
            ["sidecar-1"]
        );
        // Listed twice (before and after renumbering): one revision.
        let mut twice = history.clone();
        let mut bumped = twice[0].clone();
        bumped.revision = 4;
        twice.push(bumped);
        assert!(revisions_to_delete(&set, &twice, "sidecar-1", &none).is_empty());
    }

    #[test]
    fn injection_strategy_revisions_are_kept() {
        let mut set = sidecarset("sidecar", minimal());
        set.spec.revision_history_limit = Some(2);
        let mut history = numbered(&set, 6);
        for r in &mut history[..3] {
            r.metadata
                .labels
                .get_or_insert_with(BTreeMap::new)
                .insert(SIDECARSET_CUSTOM_VERSION_LABEL.to_owned(), "v1".to_owned());
        }
        set.spec.injection_strategy.revision = Some(SidecarSetInjectRevision {
            custom_version: Some("v1".into()),
            revision_name: Some("sidecar-2".into()),
            policy: None,
        });
        assert_eq!(
            revisions_to_delete(&set, &history, "sidecar-6", &BTreeSet::new()),
            ["sidecar-1", "sidecar-4", "sidecar-5"],
            "sidecar-2 by name, sidecar-3 as the newest v1"
        );
    }

    #[test]
    fn other_sidecarsets_revisions_are_neither_counted_nor_deleted() {
        let mut set = sidecarset("sidecar", minimal());
        set.spec.revision_history_limit = Some(2);
        let mut history = numbered(&set, 2);
        let mut foreign = numbered(&sidecarset("other", minimal()), 5);
        for r in &mut foreign {
            r.metadata.name = Some(format!("other-{}", r.revision));
        }
        history.extend(foreign);
        history.push(owned_by(
            {
                let mut r = new_revision(&set, NS, 0, 0);
                r.metadata.name = Some("stolen".into());
                r
            },
            "another-uid",
            true,
        ));
        assert!(revisions_to_delete(&set, &history, "sidecar-2", &BTreeSet::new()).is_empty());
    }

    // --- Writing, against a scripted apiserver ---------------------------------------------------

    mod api {
        use super::*;
        use std::collections::VecDeque;
        use std::sync::{Arc, Mutex};

        const PATH: &str = "/apis/apps/v1/namespaces/kruise-system/controllerrevisions";

        /// One expected request and the reply to it.
        struct Step {
            method: &'static str,
            path: String,
            status: u16,
            reply: Value,
        }

        fn step(method: &'static str, name: &str, status: u16, reply: Value) -> Step {
            let path = if name.is_empty() {
                PATH.to_owned()
            } else {
                format!("{PATH}/{name}")
            };
            Step {
                method,
                path,
                status,
                reply,
            }
        }

        fn status(code: u16, reason: &str) -> Value {
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                   "message": reason, "reason": reason, "code": code})
        }

        /// Requests seen: method, path, body.
        type Seen = Arc<Mutex<Vec<(String, String, String)>>>;

        fn scripted(steps: Vec<Step>) -> (Api<ControllerRevision>, Seen) {
            let steps = Arc::new(Mutex::new(VecDeque::from(steps)));
            let seen: Seen = Arc::default();
            let log = seen.clone();
            let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
                let steps = steps.clone();
                let log = log.clone();
                async move {
                    let method = req.method().to_string();
                    let path = req.uri().path().to_owned();
                    let body = req.into_body().collect_bytes().await.unwrap_or_default();
                    let body = String::from_utf8_lossy(&body).into_owned();
                    log.lock()
                        .unwrap()
                        .push((method.clone(), path.clone(), body));
                    let next = steps.lock().unwrap().pop_front();
                    let (code, reply) = match next {
                        Some(s) if s.method == method && s.path == path => (s.status, s.reply),
                        _ => (500, status(500, &format!("unexpected {method} {path}"))),
                    };
                    let response = http::Response::builder()
                        .status(code)
                        .header("content-type", "application/json")
                        .body(kube::client::Body::from(
                            serde_json::to_vec(&reply).unwrap(),
                        ))
                        .unwrap();
                    Ok::<_, std::convert::Infallible>(response)
                }
            });
            let client = kube::Client::new(service, "default");
            (Api::namespaced(client, NS), seen)
        }

        fn json_of<T: Serialize>(v: &T) -> Value {
            serde_json::to_value(v).unwrap()
        }

        fn stored(mut r: ControllerRevision, resource_version: &str) -> ControllerRevision {
            r.metadata.resource_version = Some(resource_version.into());
            r
        }

        #[tokio::test]
        async fn creating_sends_upstreams_exact_bytes() {
            let set = sidecarset("rich", rich());
            let expected = new_revision(&set, NS, 1, 0);
            let (api, seen) = scripted(vec![step("POST", "", 201, json_of(&expected))]);
            let registered = register(&api, &set, &[], NS).await.expect("created");
            assert_eq!(registered.collision_count, 0);
            assert_eq!(name_of(&registered.latest), name_of(&expected));
            let seen = seen.lock().unwrap();
            assert_eq!(seen.len(), 1);
            let body = &seen[0].2;
            assert!(
                body.contains(&format!("\"data\":{}", text_of(&set.spec))),
                "{body}"
            );
            let sent: ControllerRevision = serde_json::from_str(body).expect("a revision");
            assert_eq!(sent, expected);
        }

        #[tokio::test]
        async fn a_name_taken_by_other_data_bumps_the_collision_count() {
            let set = sidecarset("s", minimal());
            let first = new_revision(&set, NS, 1, 0);
            let mut squatter = first.clone();
            squatter.data = Some(RawExtension(
                json!({"spec": {"$patch": "replace", "containers": [{"name": "x"}]}}),
            ));
            let second = new_revision(&set, NS, 1, 1);
            let (api, seen) = scripted(vec![
                step("POST", "", 409, status(409, "AlreadyExists")),
                step("GET", name_of(&first), 200, json_of(&squatter)),
                step("POST", "", 201, json_of(&second)),
            ]);
            let registered = register(&api, &set, &[], NS).await.expect("created");
            assert_eq!(registered.collision_count, 1);
            assert_eq!(name_of(&registered.latest), "s-65fd5cd67b");
            assert_eq!(seen.lock().unwrap().len(), 3);
        }

        #[tokio::test]
        async fn a_name_taken_by_an_equal_revision_is_used() {
            let mut set = sidecarset("s", minimal());
            set.status = Some(SidecarSetStatus {
                collision_count: Some(2),
                ..SidecarSetStatus::default()
            });
            let existing = stored(new_revision(&set, NS, 1, 2), "5");
            let (api, seen) = scripted(vec![
                step("POST", "", 409, status(409, "AlreadyExists")),
                step("GET", name_of(&existing), 200, json_of(&existing)),
            ]);
            let registered = register(&api, &set, &[], NS).await.expect("used");
            assert_eq!(registered.collision_count, 2);
            assert_eq!(registered.latest, existing);
            assert_eq!(seen.lock().unwrap().len(), 2);
        }

        #[tokio::test]
        async fn endless_collisions_give_up() {
            let set = sidecarset("s", minimal());
            let mut squatter = new_revision(&set, NS, 1, 0);
            squatter.data = Some(RawExtension(json!({"other": true})));
            let mut steps = Vec::new();
            for cc in 0..CREATE_ATTEMPTS {
                let name = name_of(&new_revision(&set, NS, 1, cc as i32)).to_owned();
                steps.push(step("POST", "", 409, status(409, "AlreadyExists")));
                steps.push(step("GET", &name, 200, json_of(&squatter)));
            }
            let (api, _) = scripted(steps);
            let err = register(&api, &set, &[], NS).await.expect_err("gives up");
            assert!(
                matches!(
                    err,
                    RevisionsError::Collisions {
                        attempts: 10,
                        collision_count: 10,
                        ..
                    }
                ),
                "{err}"
            );
        }

        #[tokio::test]
        async fn an_unchanged_spec_writes_nothing() {
            let set = sidecarset("s", minimal());
            let current = stored(new_revision(&set, NS, 1, 0), "3");
            let (api, seen) = scripted(vec![]);
            let registered = register(&api, &set, std::slice::from_ref(&current), NS)
                .await
                .expect("kept");
            assert_eq!(registered.latest, current);
            assert!(seen.lock().unwrap().is_empty());
        }

        #[tokio::test]
        async fn a_rollback_is_a_guarded_patch_retried_once_on_conflict() {
            let mut set = sidecarset("s", minimal());
            let old = stored(new_revision(&set, NS, 1, 0), "10");
            set.spec.custom_version = Some("v1".into());
            let newer = stored(
                new_revision(
                    &sidecarset("s", json!({"containers": [{"name": "c", "image": "j"}]})),
                    NS,
                    2,
                    0,
                ),
                "11",
            );
            let mut done = old.clone();
            done.revision = 3;
            let (api, seen) = scripted(vec![
                step("PATCH", name_of(&old), 409, status(409, "Conflict")),
                step(
                    "GET",
                    name_of(&old),
                    200,
                    json_of(&stored(old.clone(), "12")),
                ),
                step("PATCH", name_of(&old), 200, json_of(&done)),
            ]);
            let registered = register(&api, &set, &[old.clone(), newer], NS)
                .await
                .expect("rolled back");
            assert_eq!(registered.latest.revision, 3);
            let seen = seen.lock().unwrap();
            let patch = |i: usize| serde_json::from_str::<Value>(&seen[i].2).unwrap();
            let label = json!({SIDECARSET_CUSTOM_VERSION_LABEL: "v1"});
            assert_eq!(
                patch(0),
                json!({"metadata": {"resourceVersion": "10", "labels": label}, "revision": 3})
            );
            assert_eq!(
                patch(2),
                json!({"metadata": {"resourceVersion": "12", "labels": label}, "revision": 3})
            );
        }

        #[tokio::test]
        async fn a_second_conflict_is_an_error_naming_both() {
            let mut set = sidecarset("s", minimal());
            set.spec.custom_version = Some("v1".into());
            let current = stored(new_revision(&set, NS, 1, 0), "1");
            let mut unlabelled = current.clone();
            unlabelled
                .metadata
                .labels
                .as_mut()
                .unwrap()
                .remove(SIDECARSET_CUSTOM_VERSION_LABEL);
            let (api, _) = scripted(vec![
                step("PATCH", name_of(&current), 409, status(409, "Conflict")),
                step("GET", name_of(&current), 200, json_of(&unlabelled)),
                step("PATCH", name_of(&current), 409, status(409, "Conflict")),
            ]);
            let err = register(&api, &set, &[unlabelled], NS)
                .await
                .expect_err("conflict");
            let text = err.to_string();
            assert!(matches!(err, RevisionsError::Update { .. }), "{text}");
            assert!(
                text.contains(name_of(&current)) && text.contains("SidecarSet s"),
                "{text}"
            );
        }

        #[tokio::test]
        async fn a_sidecarset_not_from_the_cluster_is_refused() {
            let mut set = sidecarset("s", minimal());
            set.metadata.uid = None;
            let (api, seen) = scripted(vec![]);
            let err = register(&api, &set, &[], NS).await.expect_err("no uid");
            assert!(matches!(err, RevisionsError::NotStored { .. }), "{err}");
            assert!(seen.lock().unwrap().is_empty());
        }

        #[tokio::test]
        async fn deleting_ignores_missing_revisions_and_tries_every_name() {
            let gone = status(404, "NotFound");
            let (api, seen) = scripted(vec![
                step("DELETE", "s-1", 404, gone),
                step("DELETE", "s-2", 500, status(500, "InternalError")),
                step(
                    "DELETE",
                    "s-3",
                    200,
                    json_of(&ControllerRevision::default()),
                ),
            ]);
            let names = ["s-1", "s-2", "s-3"].map(str::to_owned);
            let err = delete_revisions(&api, &names)
                .await
                .expect_err("s-2 failed");
            assert!(
                matches!(&err, RevisionsError::Delete { revision, .. } if revision == "s-2"),
                "{err}"
            );
            assert_eq!(seen.lock().unwrap().len(), 3);

            let (api, _) = scripted(vec![step("DELETE", "s-1", 404, status(404, "NotFound"))]);
            delete_revisions(&api, &names[..1])
                .await
                .expect("404 is fine");
        }
    }
}
