//! What an in-place sidecar upgrade writes to a pod (upstream's `updatePodSidecarAndHash`), and
//! the pod condition that says a pod cannot be upgraded in place.
//!
//! The upgrade is one JSON patch:
//! - the `image` of each of the SidecarSet's containers and native sidecars (init containers
//!   with `restartPolicy: Always`, which kubelet restarts on their new image) whose image
//!   differs, and nothing else of the spec (new resources went through `pods/resize` before,
//!   `super::resize`; plain init containers are never touched);
//! - this SidecarSet's entry in `kruise.io/sidecarset-hash`: the current hash, the latest
//!   ControllerRevision, the sidecar list and now; the other SidecarSets' entries unchanged;
//! - its entry in `kruise.io/sidecarset-hash-without-image` when that differs: a pod whose
//!   sidecars' resources changed too was resized first (`super::resize`);
//! - this SidecarSet's record in `kruise.io/sidecarset-inplace-update-state`: each changed
//!   container's imageID from before the upgrade, by which [`super::pods`] tells that kubelet
//!   has restarted it (an existing record keeps its revision and time, as upstream's);
//! - `patchPodMetadata`, as at injection.
//!
//! A hot-upgrade sidecar's new image goes to one of its twins (`twin_to_upgrade`), which the
//! same patch records as working with its version annotations
//! ([`kruise_rs_sidecar::hot_upgrade::record_upgrade`]); the old twin is reset later
//! (`super::twin_flip::flip_patch`).
//!
//! The patch first *tests* the annotation values it was computed from and the container names
//! at the indexes it writes. Two SidecarSets upgrading one pod at once, or a stale cache, make
//! the apiserver refuse it instead of one writer erasing the other's entry; the controller then
//! tries again from fresh data.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::PodCondition;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kruise_rs_controller::pod_summary::PodSummary;
use serde_json::{Value, json};

use super::pods::{
    InPlaceUpdateState, LastContainerStatus, parse_update_states, render_update_states, view,
};
use super::rollout::CurrentHashes;
use super::twin_flip::{hot_sidecars, twin_to_upgrade};
use kruise_rs_api::sidecarset::SidecarSet;
use kruise_rs_api::well_known::{
    SIDECARSET_HASH, SIDECARSET_HASH_WITHOUT_IMAGE, SIDECARSET_INPLACE_UPDATE_STATE,
    SIDECARSET_UPGRADABLE_CONDITION,
};
use kruise_rs_sidecar::annotations::{SidecarSetUpgradeSpec, parse_hashes, render_hashes};
use kruise_rs_sidecar::hash::is_native_sidecar;
use kruise_rs_sidecar::hot_upgrade::{is_hot_upgrade, record_upgrade, twin_name};
use kruise_rs_sidecar::metadata::{MetadataPatchError, patch_pod_metadata};

/// Why a pod cannot be upgraded as it is.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpgradeError {
    #[error(transparent)]
    Annotation(#[from] kruise_rs_sidecar::annotations::AnnotationError),
    #[error("spec.patchPodMetadata: {0}")]
    Metadata(#[from] MetadataPatchError),
}

/// One pod's upgrade.
#[derive(Debug)]
pub(crate) struct Upgrade {
    pub patch: json_patch::Patch,
    /// The containers (native sidecars included) whose image changes.
    pub changed: Vec<String>,
}

/// A JSON pointer token (RFC 6901).
fn token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

pub(super) fn annotation_path(key: &str) -> String {
    format!("/metadata/annotations/{}", token(key))
}

/// The operations that turn the annotations `before` into `after`: a `test` of each value that
/// changes (`tests`) and an `add` of each new value (`writes`). Annotations are never removed.
pub(super) fn annotation_ops(
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
    tests: &mut Vec<Value>,
    writes: &mut Vec<Value>,
) {
    for (key, value) in after {
        let old = before.get(key);
        if old == Some(value) {
            continue;
        }
        if let Some(old) = old {
            tests.push(json!({"op": "test", "path": annotation_path(key), "value": old}));
        }
        writes.push(json!({"op": "add", "path": annotation_path(key), "value": value}));
    }
}

/// The names upstream lists in a hash entry: the containers and native-sidecar init
/// containers, sorted.
fn sidecar_list(set: &SidecarSet) -> Vec<String> {
    let names: BTreeSet<&str> = set
        .spec
        .containers
        .iter()
        .chain(
            set.spec
                .init_containers
                .iter()
                .filter(|c| is_native_sidecar(c)),
        )
        .map(|c| c.container.name.as_str())
        .collect();
    names.into_iter().map(str::to_owned).collect()
}

/// The patch that upgrades `pod`'s sidecars to `set`'s images and records it; see the module
/// documentation. `pod` must carry every annotation `patchPodMetadata` reads (the live pod
/// when the SidecarSet has any).
pub(crate) fn upgrade_patch(
    pod: &PodSummary,
    set: &SidecarSet,
    current: &CurrentHashes,
    now: &Time,
) -> Result<Upgrade, UpgradeError> {
    let name = set.metadata.name.clone().unwrap_or_default();
    let annotations = &pod.annotation_map().unwrap_or_default();
    let mut ops = Vec::new();
    let mut writes = Vec::new();
    if !pod.has_annotations() {
        writes.push(json!({"op": "add", "path": "/metadata/annotations", "value": {}}));
    }

    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    let mut changed = Vec::new();
    let mut after = annotations.clone();
    // Twin readiness and state consistency, for the choice of the twin to upgrade.
    let settled: BTreeMap<String, bool> = if hot_sidecars(set).next().is_some() {
        view(set, current, pod)
            .sidecars
            .into_iter()
            .map(|s| (s.name.to_string(), s.ready && s.image_running))
            .collect()
    } else {
        BTreeMap::new()
    };
    let resource_version = set.metadata.resource_version.as_deref().unwrap_or_default();
    for sidecar in &set.spec.containers {
        let twin = if is_hot_upgrade(sidecar) {
            let settled = |c: &str| settled.get(c).copied().unwrap_or(false);
            let Some(twin) = twin_to_upgrade(sidecar, pod, settled) else {
                continue;
            };
            Some(twin)
        } else {
            None
        };
        let target = match twin {
            Some(twin) => twin_name(&sidecar.container.name, twin),
            None => sidecar.container.name.clone(),
        };
        let Some((i, container)) = containers
            .iter()
            .enumerate()
            .find(|(_, c)| *c.name == *target)
        else {
            continue;
        };
        if container.image.as_deref() == sidecar.container.image.as_deref() {
            continue;
        }
        ops.push(json!({"op": "test", "path": format!("/spec/containers/{i}/name"), "value": &*container.name}));
        writes.push(json!({"op": "replace", "path": format!("/spec/containers/{i}/image"), "value": sidecar.container.image}));
        changed.push(container.name.to_string());
        if let Some(twin) = twin {
            record_upgrade(&mut after, &sidecar.container.name, twin, resource_version);
        }
    }
    let init_containers = pod
        .spec
        .as_ref()
        .map(|s| s.init_containers.as_slice())
        .unwrap_or_default();
    for sidecar in set
        .spec
        .init_containers
        .iter()
        .filter(|c| is_native_sidecar(c))
    {
        let Some((i, container)) = init_containers
            .iter()
            .enumerate()
            .find(|(_, c)| *c.name == *sidecar.container.name)
        else {
            continue;
        };
        if container.image.as_deref() == sidecar.container.image.as_deref() {
            continue;
        }
        ops.push(json!({"op": "test", "path": format!("/spec/initContainers/{i}/name"), "value": &*container.name}));
        writes.push(json!({"op": "replace", "path": format!("/spec/initContainers/{i}/image"), "value": sidecar.container.image}));
        changed.push(container.name.to_string());
    }

    let old_hashes = annotations.get(SIDECARSET_HASH);
    let mut hashes = match old_hashes {
        Some(value) => parse_hashes(SIDECARSET_HASH, value)?,
        None => BTreeMap::new(),
    };
    hashes.insert(
        name.clone(),
        SidecarSetUpgradeSpec {
            update_timestamp: Some(now.clone()),
            hash: current.hash.clone(),
            sidecar_set_name: name.clone(),
            sidecar_list: Some(sidecar_list(set)),
            controller_revision: set
                .status
                .as_ref()
                .and_then(|s| s.latest_revision.clone())
                .unwrap_or_default(),
        },
    );
    after.insert(SIDECARSET_HASH.to_owned(), render_hashes(&hashes));

    // A resized pod is on the current version in more than its images.
    let old_without_image = annotations.get(SIDECARSET_HASH_WITHOUT_IMAGE);
    let mut without_image = match old_without_image {
        Some(value) => parse_hashes(SIDECARSET_HASH_WITHOUT_IMAGE, value)?,
        None => BTreeMap::new(),
    };
    if without_image.get(&name).map(|e| e.hash.as_str()) != Some(current.without_image.as_str()) {
        without_image.insert(
            name.clone(),
            SidecarSetUpgradeSpec {
                update_timestamp: Some(now.clone()),
                hash: current.without_image.clone(),
                sidecar_set_name: name.clone(),
                sidecar_list: Some(sidecar_list(set)),
                controller_revision: String::new(),
            },
        );
        after.insert(
            SIDECARSET_HASH_WITHOUT_IMAGE.to_owned(),
            render_hashes(&without_image),
        );
    }

    if !changed.is_empty() {
        // An unreadable record is replaced (upstream too starts over).
        let mut states = annotations
            .get(SIDECARSET_INPLACE_UPDATE_STATE)
            .and_then(|v| parse_update_states(v))
            .unwrap_or_default();
        let state = states
            .entry(name.clone())
            .or_insert_with(|| InPlaceUpdateState {
                revision: current.hash.clone(),
                update_timestamp: Some(now.clone()),
                ..Default::default()
            });
        let status = pod.status.as_ref();
        let statuses = status
            .and_then(|s| s.container_statuses.as_deref())
            .unwrap_or_default();
        let init_statuses = status
            .and_then(|s| s.init_container_statuses.as_deref())
            .unwrap_or_default();
        for container in &changed {
            // Names are unique across a pod's containers and init containers.
            let image_id = statuses
                .iter()
                .chain(init_statuses)
                .find(|s| *s.name == **container)
                .map(|s| s.image_id.to_string())
                .unwrap_or_default();
            state
                .last_container_statuses
                .insert(container.clone(), LastContainerStatus { image_id });
        }
        after.insert(
            SIDECARSET_INPLACE_UPDATE_STATE.to_owned(),
            render_update_states(&states),
        );
    }

    patch_pod_metadata(&mut after, &set.spec.patch_pod_metadata)?;

    annotation_ops(annotations, &after, &mut ops, &mut writes);
    ops.extend(writes);
    let patch = serde_json::from_value(Value::Array(ops))
        .expect("the operations are well-formed JSON patch operations");
    Ok(Upgrade { patch, changed })
}

/// The `SidecarSetUpgradable` condition message: SidecarSet name to whether it can upgrade
/// the pod, as upstream writes it (`{"a":true,"b":false}`).
fn upgradable_map(condition: Option<&PodCondition>) -> BTreeMap<String, bool> {
    condition
        .and_then(|c| c.message.as_deref())
        .and_then(|m| serde_json::from_str(m).ok())
        .unwrap_or_default()
}

/// The `SidecarSetUpgradable` pod condition after `set` found the pod `upgradable` or not;
/// `None` when the condition already says so (or, for an upgradable pod, does not exist: only
/// a pod some SidecarSet cannot upgrade needs one).
pub(crate) fn upgradable_condition(
    pod: &PodSummary,
    set: &str,
    upgradable: bool,
    now: &Time,
) -> Option<PodCondition> {
    condition_with(pod, set, upgradable, false, now)
}

/// The `SidecarSetUpgradable` pod condition once `set` has upgraded the pod in place, as
/// upstream writes it after every in-place upgrade: this SidecarSet's entry `true`, and `True`
/// (`AllSidecarsetUpgradable`) when every entry is; created when the pod has none. `None` when
/// the condition already says so.
pub(crate) fn upgraded_condition(pod: &PodSummary, set: &str, now: &Time) -> Option<PodCondition> {
    condition_with(pod, set, true, true, now)
}

/// [`upgradable_condition`]; with `create`, an upgradable pod without the condition gets one.
fn condition_with(
    pod: &PodSummary,
    set: &str,
    upgradable: bool,
    create: bool,
    now: &Time,
) -> Option<PodCondition> {
    let existing = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|all| {
            all.iter()
                .find(|c| c.type_ == SIDECARSET_UPGRADABLE_CONDITION)
        });
    let mut sets = upgradable_map(existing);
    match sets.get(set) {
        Some(&known) if known == upgradable => return None,
        None if upgradable && existing.is_none() && !create => return None,
        _ => {}
    }
    sets.insert(set.to_owned(), upgradable);
    let all = sets.values().all(|&ok| ok);
    let status = if all { "True" } else { "False" };
    let transition = existing
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    Some(PodCondition {
        type_: SIDECARSET_UPGRADABLE_CONDITION.to_owned(),
        status: status.to_owned(),
        reason: Some(
            if all {
                "AllSidecarsetUpgradable"
            } else {
                "UpdateImmutableField"
            }
            .to_owned(),
        ),
        message: Some(serde_json::to_string(&sets).unwrap_or_default()),
        last_transition_time: Some(transition),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests;
