//! What an in-place sidecar upgrade writes to a pod (upstream's `updatePodSidecarAndHash`), and
//! the pod condition that says a pod cannot be upgraded in place.
//!
//! The upgrade is one JSON patch:
//! - the `image` of each of the SidecarSet's containers whose image differs, and nothing else of
//!   the spec (Kubernetes allows no other in-place change; init containers are never touched);
//! - this SidecarSet's entry in `kruise.io/sidecarset-hash`: the current hash, the latest
//!   ControllerRevision, the sidecar list and now; the other SidecarSets' entries unchanged;
//! - this SidecarSet's record in `kruise.io/sidecarset-inplace-update-state`: each changed
//!   container's imageID from before the upgrade, by which [`super::pods`] tells that kubelet
//!   has restarted it (an existing record keeps its revision and time, as upstream's);
//! - `patchPodMetadata`, as at injection.
//!
//! The patch first *tests* the annotation values it was computed from and the container names
//! at the indexes it writes. Two SidecarSets upgrading one pod at once, or a stale cache, make
//! the apiserver refuse it instead of one writer erasing the other's entry; the controller then
//! tries again from fresh data.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::PodCondition;

use crate::controllers::shared::pod_summary::PodSummary;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use super::pods::{
    InPlaceUpdateState, LastContainerStatus, parse_update_states, render_update_states,
};
use super::strategy::CurrentHashes;
use crate::apis::sidecarset::SidecarSet;
use crate::apis::well_known::{
    SIDECARSET_HASH, SIDECARSET_INPLACE_UPDATE_STATE, SIDECARSET_UPGRADABLE_CONDITION,
};
use crate::sidecar::annotations::{SidecarSetUpgradeSpec, parse_hashes, render_hashes};
use crate::sidecar::hash::is_native_sidecar;
use crate::sidecar::metadata::{MetadataPatchError, patch_pod_metadata};

/// Why a pod cannot be upgraded as it is.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    #[error(transparent)]
    Annotation(#[from] crate::sidecar::annotations::AnnotationError),
    #[error("spec.patchPodMetadata: {0}")]
    Metadata(#[from] MetadataPatchError),
}

/// One pod's upgrade.
#[derive(Debug)]
pub struct Upgrade {
    pub patch: json_patch::Patch,
    /// The containers whose image changes.
    pub changed: Vec<String>,
}

/// A JSON pointer token (RFC 6901).
fn token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn annotation_path(key: &str) -> String {
    format!("/metadata/annotations/{}", token(key))
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
pub fn upgrade_patch(
    pod: &PodSummary,
    set: &SidecarSet,
    current: &CurrentHashes,
    now: &Time,
) -> Result<Upgrade, UpgradeError> {
    let name = set.metadata.name.clone().unwrap_or_default();
    let empty = BTreeMap::new();
    let annotations = pod.metadata.annotations.as_ref().unwrap_or(&empty);
    let mut ops = Vec::new();
    let mut writes = Vec::new();
    if pod.metadata.annotations.is_none() {
        writes.push(json!({"op": "add", "path": "/metadata/annotations", "value": {}}));
    }

    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    let mut changed = Vec::new();
    for sidecar in &set.spec.containers {
        let Some((i, container)) = containers
            .iter()
            .enumerate()
            .find(|(_, c)| c.name == sidecar.container.name)
        else {
            continue;
        };
        if container.image == sidecar.container.image {
            continue;
        }
        ops.push(json!({"op": "test", "path": format!("/spec/containers/{i}/name"), "value": container.name}));
        writes.push(json!({"op": "replace", "path": format!("/spec/containers/{i}/image"), "value": sidecar.container.image}));
        changed.push(container.name.clone());
    }

    let mut after = annotations.clone();
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
        let statuses = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_deref())
            .unwrap_or_default();
        for container in &changed {
            let image_id = statuses
                .iter()
                .find(|s| &s.name == container)
                .map(|s| s.image_id.clone())
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

    for (key, value) in &after {
        let before = annotations.get(key);
        if before == Some(value) {
            continue;
        }
        if let Some(before) = before {
            ops.push(json!({"op": "test", "path": annotation_path(key), "value": before}));
        }
        writes.push(json!({"op": "add", "path": annotation_path(key), "value": value}));
    }
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
pub fn upgradable_condition(
    pod: &PodSummary,
    set: &str,
    upgradable: bool,
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
        None if upgradable && existing.is_none() => return None,
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
mod tests {
    use super::*;
    use crate::apis::sidecarset::{SidecarSetSpec, SidecarSetStatus};

    fn now() -> Time {
        Time("2026-11-29T12:00:00Z".parse().expect("time"))
    }

    fn set(spec: Value) -> SidecarSet {
        let spec: SidecarSetSpec = serde_json::from_value(spec).expect("spec");
        let mut set = SidecarSet::new("mesh", spec);
        set.status = Some(SidecarSetStatus {
            latest_revision: Some("mesh-7f9c".into()),
            ..Default::default()
        });
        set
    }

    fn mesh(proxy: &str) -> SidecarSet {
        set(json!({
            "selector": {"matchLabels": {"app": "web"}},
            "containers": [
                {"name": "proxy", "image": proxy},
                {"name": "logs", "image": "logs:1"},
            ],
            "initContainers": [{"name": "setup", "image": "setup:9"}],
        }))
    }

    fn current() -> CurrentHashes {
        CurrentHashes {
            hash: "h2".into(),
            without_image: "w".into(),
        }
    }

    const OLD_HASHES: &str = r#"{"logging":{"updateTimestamp":null,"hash":"l1","sidecarSetName":"logging","sidecarList":["fluent"]},"mesh":{"updateTimestamp":null,"hash":"h1","sidecarSetName":"mesh","sidecarList":["logs","proxy"]}}"#;

    fn pod() -> PodSummary {
        serde_json::from_value(json!({
            "metadata": {
                "name": "web-0", "namespace": "shop",
                "annotations": {SIDECARSET_HASH: OLD_HASHES, "team": "a/b"},
            },
            "spec": {
                "initContainers": [{"name": "setup", "image": "setup:1"}],
                "containers": [
                    {"name": "app", "image": "shop:1"},
                    {"name": "proxy", "image": "proxy:1"},
                    {"name": "logs", "image": "logs:1"},
                ]
            },
            "status": {"containerStatuses": [
                {"name": "app", "image": "shop:1", "imageID": "shop@sha256:a", "ready": true, "restartCount": 0},
                {"name": "proxy", "image": "proxy:1", "imageID": "proxy@sha256:p1", "ready": true, "restartCount": 0},
                {"name": "logs", "image": "logs:1", "imageID": "logs@sha256:l1", "ready": true, "restartCount": 0},
            ]}
        }))
        .expect("pod")
    }

    fn apply(pod: &PodSummary, upgrade: &Upgrade) -> PodSummary {
        let mut doc = serde_json::to_value(pod).expect("pod json");
        json_patch::patch(&mut doc, &upgrade.patch).expect("the patch applies to its own pod");
        serde_json::from_value(doc).expect("still a pod")
    }

    fn annotation<'a>(pod: &'a PodSummary, key: &str) -> &'a str {
        pod.metadata.annotations.as_ref().expect("annotations")[key].as_str()
    }

    #[test]
    fn only_changed_sidecar_images_change_in_the_spec() {
        let before = pod();
        let upgrade = upgrade_patch(&before, &mesh("proxy:2"), &current(), &now()).expect("patch");
        assert_eq!(upgrade.changed, ["proxy"]);
        let after = apply(&before, &upgrade);
        let mut expected = before.spec.clone().expect("spec");
        expected.containers[1].image = Some("proxy:2".into());
        assert_eq!(
            after.spec,
            Some(expected),
            "init containers and the rest stay"
        );
    }

    #[test]
    fn the_hash_entry_is_rewritten_and_the_other_entries_kept() {
        let after = apply(
            &pod(),
            &upgrade_patch(&pod(), &mesh("proxy:2"), &current(), &now()).expect("patch"),
        );
        assert_eq!(
            annotation(&after, SIDECARSET_HASH),
            r#"{"logging":{"updateTimestamp":null,"hash":"l1","sidecarSetName":"logging","sidecarList":["fluent"]},"mesh":{"updateTimestamp":"2026-11-29T12:00:00Z","hash":"h2","sidecarSetName":"mesh","sidecarList":["logs","proxy"],"controllerRevision":"mesh-7f9c"}}"#
        );
        assert_eq!(annotation(&after, "team"), "a/b");
    }

    #[test]
    fn the_update_state_records_the_image_ids_from_before_the_upgrade() {
        let after = apply(
            &pod(),
            &upgrade_patch(&pod(), &mesh("proxy:2"), &current(), &now()).expect("patch"),
        );
        assert_eq!(
            annotation(&after, SIDECARSET_INPLACE_UPDATE_STATE),
            r#"{"mesh":{"revision":"h2","updateTimestamp":"2026-11-29T12:00:00Z","lastContainerStatuses":{"proxy":{"imageID":"proxy@sha256:p1"}}}}"#
        );
    }

    #[test]
    fn an_existing_record_keeps_its_revision_and_time_and_gains_containers() {
        let mut before = pod();
        let record = r#"{"mesh":{"revision":"h0","updateTimestamp":"2026-01-01T00:00:00Z","lastContainerStatuses":{"logs":{"imageID":"logs@sha256:l0"}}},"other":{"revision":"x","updateTimestamp":null,"lastContainerStatuses":{}}}"#;
        before
            .metadata
            .annotations
            .as_mut()
            .expect("annotations")
            .insert(SIDECARSET_INPLACE_UPDATE_STATE.into(), record.into());
        let upgrade = upgrade_patch(&before, &mesh("proxy:2"), &current(), &now()).expect("patch");
        let after = apply(&before, &upgrade);
        assert_eq!(
            annotation(&after, SIDECARSET_INPLACE_UPDATE_STATE),
            r#"{"mesh":{"revision":"h0","updateTimestamp":"2026-01-01T00:00:00Z","lastContainerStatuses":{"logs":{"imageID":"logs@sha256:l0"},"proxy":{"imageID":"proxy@sha256:p1"}}},"other":{"revision":"x","updateTimestamp":null,"lastContainerStatuses":{}}}"#
        );
        let value = serde_json::to_value(&upgrade.patch).expect("json");
        assert!(
            value
                .as_array()
                .expect("ops")
                .iter()
                .any(|op| op["op"] == "test"
                    && op["path"]
                        == "/metadata/annotations/kruise.io~1sidecarset-inplace-update-state"
                    && op["value"] == record),
            "the record is tested before it is replaced: {value}"
        );
    }

    #[test]
    fn the_patch_tests_what_it_was_computed_from() {
        let upgrade = upgrade_patch(&pod(), &mesh("proxy:2"), &current(), &now()).expect("patch");
        let mut moved = pod();
        moved
            .metadata
            .annotations
            .as_mut()
            .expect("annotations")
            .insert(SIDECARSET_HASH.into(), "{}".into());
        let mut doc = serde_json::to_value(&moved).expect("json");
        assert!(
            json_patch::patch(&mut doc, &upgrade.patch).is_err(),
            "a hash annotation changed meanwhile makes the patch fail"
        );
    }

    #[test]
    fn a_pod_already_on_the_images_only_gets_its_hash_entry() {
        let upgrade = upgrade_patch(&pod(), &mesh("proxy:1"), &current(), &now()).expect("patch");
        assert!(upgrade.changed.is_empty());
        let after = apply(&pod(), &upgrade);
        assert_eq!(after.spec, pod().spec);
        assert!(
            !after
                .metadata
                .annotations
                .as_ref()
                .expect("annotations")
                .contains_key(SIDECARSET_INPLACE_UPDATE_STATE)
        );
        assert!(annotation(&after, SIDECARSET_HASH).contains(r#""hash":"h2""#));
    }

    #[test]
    fn pod_metadata_patches_are_applied_as_at_injection() {
        let mut s = mesh("proxy:2");
        s.spec.patch_pod_metadata = serde_json::from_value(json!([
            {"annotations": {"team": "x", "new": "1"}, "patchPolicy": "Retain"},
        ]))
        .expect("patches");
        let after = apply(
            &pod(),
            &upgrade_patch(&pod(), &s, &current(), &now()).expect("patch"),
        );
        assert_eq!(
            annotation(&after, "team"),
            "a/b",
            "Retain keeps the pod's value"
        );
        assert_eq!(annotation(&after, "new"), "1");
    }

    #[test]
    fn an_unreadable_hash_annotation_is_an_error_not_a_reset() {
        let mut bad = pod();
        bad.metadata
            .annotations
            .as_mut()
            .expect("annotations")
            .insert(SIDECARSET_HASH.into(), "not json".into());
        let err = upgrade_patch(&bad, &mesh("proxy:2"), &current(), &now()).unwrap_err();
        assert!(err.to_string().contains(SIDECARSET_HASH), "{err}");
    }

    #[test]
    fn old_format_hashes_are_converted() {
        let mut old = pod();
        old.metadata
            .annotations
            .as_mut()
            .expect("annotations")
            .insert(SIDECARSET_HASH.into(), r#"{"mesh":"h1"}"#.into());
        let after = apply(
            &old,
            &upgrade_patch(&old, &mesh("proxy:2"), &current(), &now()).expect("patch"),
        );
        assert!(
            annotation(&after, SIDECARSET_HASH).starts_with(r#"{"mesh":{"updateTimestamp":"2026"#)
        );
    }

    fn with_condition(message: &str, status: &str) -> PodSummary {
        let mut p = pod();
        p.status.as_mut().expect("status").conditions = Some(vec![PodCondition {
            type_: SIDECARSET_UPGRADABLE_CONDITION.into(),
            status: status.into(),
            message: Some(message.into()),
            last_transition_time: Some(Time("2026-01-01T00:00:00Z".parse().expect("time"))),
            ..Default::default()
        }]);
        p
    }

    #[test]
    fn a_pod_that_cannot_be_upgraded_gets_the_condition() {
        let c = upgradable_condition(&pod(), "mesh", false, &now()).expect("written");
        assert_eq!(c.status, "False");
        assert_eq!(c.reason.as_deref(), Some("UpdateImmutableField"));
        assert_eq!(c.message.as_deref(), Some(r#"{"mesh":false}"#));
        assert_eq!(c.last_transition_time, Some(now()));
    }

    #[test]
    fn an_upgradable_pod_without_the_condition_needs_none() {
        assert_eq!(upgradable_condition(&pod(), "mesh", true, &now()), None);
        let p = with_condition(r#"{"mesh":false}"#, "False");
        assert_eq!(upgradable_condition(&p, "mesh", false, &now()), None);
    }

    #[test]
    fn the_condition_merges_the_sidecarsets() {
        let p = with_condition(r#"{"logging":false}"#, "False");
        let c = upgradable_condition(&p, "mesh", true, &now()).expect("written");
        assert_eq!(
            c.message.as_deref(),
            Some(r#"{"logging":false,"mesh":true}"#)
        );
        assert_eq!(c.status, "False");
        assert_eq!(
            c.last_transition_time,
            Some(Time("2026-01-01T00:00:00Z".parse().expect("time"))),
            "still False: the transition time stays"
        );

        let p = with_condition(r#"{"logging":true,"mesh":false}"#, "False");
        let c = upgradable_condition(&p, "mesh", true, &now()).expect("written");
        assert_eq!(c.status, "True");
        assert_eq!(c.reason.as_deref(), Some("AllSidecarsetUpgradable"));
        assert_eq!(c.last_transition_time, Some(now()));
    }
}
