//! A SidecarSet's versions, kept as ControllerRevisions: what both the webhook and the
//! controller read from them.
//!
//! - `select`: which version a new pod gets (`injectionStrategy.revision`), and a revision
//!   restored over the current spec — the webhook's side.
//! - [`history`]: what a revision records and how the history is kept (registration,
//!   truncation) — the controller's side, as pure decisions; the controller's `revisions`
//!   module makes the API calls.
//!
//! Both read revisions the same way: by the labels below, in Kubernetes' order, and with the
//! recorded fields decoded by `recorded_field`.

pub mod history;
mod select;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::jiff::Timestamp;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

pub use select::{RevisionError, SelectedSidecarSet, restore, version_for_new_pod};

/// Kubernetes' `controller/history` label for a revision's hash; upstream's revisions carry it.
pub(crate) const HISTORY_HASH_LABEL: &str = "controller.kubernetes.io/hash";

/// The value of `revision`'s label `key`.
pub(crate) fn label<'a>(revision: &'a ControllerRevision, key: &str) -> Option<&'a str> {
    revision
        .metadata
        .labels
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// Kubernetes' ControllerRevision order: by `.revision`, then creation time, then name.
pub(crate) fn revision_order(r: &ControllerRevision) -> (i64, Option<&Timestamp>, &str) {
    (
        r.revision,
        r.metadata.creation_timestamp.as_ref().map(|t| &t.0),
        r.metadata.name.as_deref().unwrap_or_default(),
    )
}

/// One recorded field of a revision's `data.spec`; absent or `null` is the type's default
/// (empty), as upstream's restore reads it.
pub(crate) fn recorded_field<T: DeserializeOwned + Default>(
    spec: &Map<String, Value>,
    key: &str,
) -> Result<T, String> {
    match spec.get(key) {
        None | Some(Value::Null) => Ok(T::default()),
        Some(v) => T::deserialize(v).map_err(|e| format!("spec.{key}: {e}")),
    }
}
