//! The SidecarSet's ControllerRevisions written: what [`kruise_rs_sidecar::revision::history`]
//! decides (register the current spec, delete what is beyond the history limit), done through
//! the API. The rules themselves, and how they differ from upstream, are described there.

use k8s_openapi::api::apps::v1::ControllerRevision;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Map, Value, json};

use super::FIELD_MANAGER;
use kruise_rs_api::sidecarset::SidecarSet;
use kruise_rs_api::well_known::SIDECARSET_CUSTOM_VERSION_LABEL;
use kruise_rs_sidecar::revision::history::{
    Registration, equal_revisions, go_json_text, is_own_revision, missing_custom_version,
    new_revision, plan_registration,
};

/// Names to try before giving up on collisions; each collision needs a 32-bit hash clash.
const CREATE_ATTEMPTS: usize = 10;

/// Why the history could not be brought up to date.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RevisionsError {
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
pub(crate) struct Registered {
    pub latest: ControllerRevision,
    pub collision_count: i32,
}

/// Registers `set`'s current spec in `api` (the manager namespace, `namespace`), given the
/// revisions listed there, and returns the latest revision. The caller stores the returned
/// collision count in `status.collisionCount` and then truncates the history.
pub(crate) async fn register(
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
pub(crate) async fn delete_revisions(
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
mod tests;
