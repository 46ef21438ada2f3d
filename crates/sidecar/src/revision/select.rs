//! Which version of a SidecarSet a new pod gets (upstream's `getSuitableRevisionSidecarSet`,
//! CREATE branch).
//!
//! Without `injectionStrategy.revision` (or with neither `revisionName` nor `customVersion`),
//! a pod gets the latest spec. Otherwise the named historical version is restored from the
//! SidecarSet's ControllerRevisions (`revisionName` wins over `customVersion`; for a custom
//! version the newest revision labelled `apps.kruise.io/sidecarset-custom-version: <v>` is
//! used), and then:
//!
//! - `updateStrategy.paused` → the historical version;
//! - policy `Partial` → the historical version for pods outside `updateStrategy.selector` (when
//!   one is set); for the others, the historical version with probability `partition` when the
//!   partition is a percentage, else the latest;
//! - policy `Always` (the default) → the historical version.
//!
//! A revision's `data` is `{"spec":{"$patch":"replace","containers":…,"initContainers":…,
//! "volumes":…,"imagePullSecrets":…,"patchPodMetadata":…}}`; restoring takes those five fields
//! from it (absent or `null` meaning empty) and everything else from the current SidecarSet. The
//! hashes recorded on the revision's annotations are used when present, else computed.
//!
//! Differences from upstream, on purpose: a `revisionName` must name one of *this* SidecarSet's
//! revisions (upstream fetches any ControllerRevision of that name in its namespace); the random
//! draw uses `r < p` rather than `r <= p`, so `0%` never and `100%` always selects the historical
//! version; a missing revision is an error in both lookups, as upstream's behaviour in practice
//! (the pod is denied rather than silently given another version).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::{LocalObjectReference, Volume};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

use kruise_rs_api::sidecarset::{
    SidecarContainer, SidecarSet, SidecarSetInjectRevisionPolicy, SidecarSetPatchPodMetadata,
    SidecarSetSpec,
};
use kruise_rs_api::well_known::{
    SIDECARSET_CUSTOM_VERSION_LABEL, SIDECARSET_HASH, SIDECARSET_HASH_WITHOUT_IMAGE,
    SIDECARSET_NAME_LABEL,
};

use super::{label, recorded_field, revision_order};
use crate::hash::{current_hashes, sidecarset_hash, sidecarset_hash_without_image};
use crate::matching::{SelectorError, selector_matches};

/// A SidecarSet at the version chosen for one pod: what injection needs and records.
#[derive(Clone, Debug, PartialEq)]
pub struct SelectedSidecarSet {
    pub name: String,
    /// The spec to inject: the latest, or the latest with a historical revision's containers,
    /// init containers, volumes, pull secrets and metadata patches.
    pub spec: SidecarSetSpec,
    /// `kruise.io/sidecarset-hash` of that version.
    pub hash: String,
    /// `kruise.io/sidecarset-hash-without-image` of that version.
    pub hash_without_image: String,
    /// The ControllerRevision recorded on the pod (`controllerRevision` in the hash annotation).
    pub controller_revision: Option<String>,
}

impl SelectedSidecarSet {
    /// The latest version: the SidecarSet's own hash annotations (computed when missing, e.g.
    /// before the defaulting webhook has seen it) and `status.latestRevision`.
    pub fn latest(set: &SidecarSet) -> Self {
        let (hash, hash_without_image) = current_hashes(set);
        Self {
            name: set.metadata.name.clone().unwrap_or_default(),
            hash,
            hash_without_image,
            controller_revision: set
                .status
                .as_ref()
                .and_then(|s| s.latest_revision.clone())
                .filter(|r| !r.is_empty()),
            spec: set.spec.clone(),
        }
    }
}

/// Why the version to inject cannot be decided; the webhook denies the pod with it.
#[derive(Debug, thiserror::Error)]
pub enum RevisionError {
    #[error(
        "SidecarSet {sidecarset}: injectionStrategy.revision names {wanted}, but no such ControllerRevision of this SidecarSet exists"
    )]
    NotFound { sidecarset: String, wanted: String },
    #[error("SidecarSet {sidecarset}: ControllerRevision {revision} has unreadable data: {reason}")]
    BadData {
        sidecarset: String,
        revision: String,
        reason: String,
    },
    #[error(
        "SidecarSet {sidecarset}: updateStrategy.partition {value:?} is not a percentage usable by the Partial injection policy"
    )]
    InvalidPartition { sidecarset: String, value: String },
    #[error("SidecarSet {sidecarset}: updateStrategy.selector is invalid: {source}")]
    InvalidSelector {
        sidecarset: String,
        #[source]
        source: SelectorError,
    },
}

/// The version of `set` a new pod with `pod_labels` gets.
///
/// `history` holds the SidecarSet's ControllerRevisions (those labelled
/// `kruise.io/sidecarset-name: <name>`; others are ignored). `random` is a number drawn
/// uniformly from `[0, 1)`, used only by the `Partial` policy with a percentage partition.
pub fn version_for_new_pod(
    set: &SidecarSet,
    history: &[ControllerRevision],
    pod_labels: &BTreeMap<String, String>,
    random: f64,
) -> Result<SelectedSidecarSet, RevisionError> {
    let latest = SelectedSidecarSet::latest(set);
    let Some(wanted) = set.spec.injection_strategy.revision.as_ref() else {
        return Ok(latest);
    };
    if wanted.revision_name.is_none() && wanted.custom_version.is_none() {
        return Ok(latest);
    }
    let name = latest.name.clone();
    let own: Vec<&ControllerRevision> = history
        .iter()
        .filter(|r| label(r, SIDECARSET_NAME_LABEL) == Some(name.as_str()))
        .collect();
    let revision = if let Some(revision_name) = &wanted.revision_name {
        own.into_iter()
            .find(|r| r.metadata.name.as_deref() == Some(revision_name.as_str()))
            .ok_or_else(|| RevisionError::NotFound {
                sidecarset: name.clone(),
                wanted: format!("revisionName {revision_name:?}"),
            })?
    } else {
        let version = wanted.custom_version.as_deref().unwrap_or_default();
        own.into_iter()
            .filter(|r| label(r, SIDECARSET_CUSTOM_VERSION_LABEL) == Some(version))
            .max_by(|a, b| revision_order(a).cmp(&revision_order(b)))
            .ok_or_else(|| RevisionError::NotFound {
                sidecarset: name.clone(),
                wanted: format!("customVersion {version:?}"),
            })?
    };
    let historical = restore(set, revision)?;

    let strategy = &set.spec.update_strategy;
    if strategy.paused {
        return Ok(historical);
    }
    match wanted.policy {
        Some(SidecarSetInjectRevisionPolicy::Partial) => {
            if let Some(selector) = &strategy.selector {
                let selected = selector_matches(selector, pod_labels).map_err(|source| {
                    RevisionError::InvalidSelector {
                        sidecarset: name.clone(),
                        source,
                    }
                })?;
                if !selected {
                    return Ok(historical);
                }
            }
            let probability = match &strategy.partition {
                None | Some(IntOrString::Int(_)) => return Ok(latest),
                Some(IntOrString::String(p)) => {
                    parse_percentage(p).ok_or_else(|| RevisionError::InvalidPartition {
                        sidecarset: name.clone(),
                        value: p.clone(),
                    })?
                }
            };
            Ok(if random < probability {
                historical
            } else {
                latest
            })
        }
        Some(SidecarSetInjectRevisionPolicy::Always) | None => Ok(historical),
    }
}

/// The SidecarSet at `revision`: its recorded fields over the current spec.
pub fn restore(
    set: &SidecarSet,
    revision: &ControllerRevision,
) -> Result<SelectedSidecarSet, RevisionError> {
    let name = set.metadata.name.clone().unwrap_or_default();
    let revision_name = revision.metadata.name.clone().unwrap_or_default();
    let bad = |reason: String| RevisionError::BadData {
        sidecarset: name.clone(),
        revision: revision_name.clone(),
        reason,
    };
    let data = revision.data.as_ref().map(|d| &d.0);
    let Some(Value::Object(spec)) = data.and_then(|d| d.get("spec")) else {
        return Err(bad("no \"spec\" object".to_owned()));
    };
    let mut restored = set.spec.clone();
    restored.containers =
        recorded_field::<Vec<SidecarContainer>>(spec, "containers").map_err(&bad)?;
    restored.init_containers =
        recorded_field::<Vec<SidecarContainer>>(spec, "initContainers").map_err(&bad)?;
    restored.volumes = recorded_field::<Vec<Volume>>(spec, "volumes").map_err(&bad)?;
    restored.image_pull_secrets =
        recorded_field::<Vec<LocalObjectReference>>(spec, "imagePullSecrets").map_err(&bad)?;
    restored.patch_pod_metadata =
        recorded_field::<Vec<SidecarSetPatchPodMetadata>>(spec, "patchPodMetadata")
            .map_err(&bad)?;

    let annotation = |key: &str| {
        revision
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .filter(|v| !v.is_empty())
            .cloned()
    };
    Ok(SelectedSidecarSet {
        hash: annotation(SIDECARSET_HASH).unwrap_or_else(|| sidecarset_hash(&restored)),
        hash_without_image: annotation(SIDECARSET_HASH_WITHOUT_IMAGE)
            .unwrap_or_else(|| sidecarset_hash_without_image(&restored)),
        controller_revision: Some(revision_name.clone()).filter(|n| !n.is_empty()),
        name,
        spec: restored,
    })
}

/// `"25%"` → 0.25; anything else (no `%`, not a finite number) → `None`.
fn parse_percentage(s: &str) -> Option<f64> {
    let number: f64 = s.strip_suffix('%')?.parse().ok()?;
    number.is_finite().then_some(number / 100.0)
}

#[cfg(test)]
mod tests;
