//! The pods a SidecarSet owns, and what the upgrade decision reads of each ([`PodView`]).
//!
//! A SidecarSet owns a pod (upstream's `getMatchingPods`) when the pod's
//! `kruise.io/sidecarset-injected-list` names it, the SidecarSet's selector and namespace
//! selector match it, and every sidecar container of the SidecarSet is in the pod, its native
//! sidecars (init containers with `restartPolicy: Always`) among the pod's init containers. Pods
//! that predate the SidecarSet were never injected and are not its to upgrade. A hot-upgrade
//! sidecar is in the pod when both its twins are and the pod's working annotation has an entry
//! for it (upstream's `IsPodConsistentWithSidecarSet`); its twins are two sidecar containers
//! below.
//!
//! Whether a sidecar container *runs its spec image* (upstream's `IsPodStateConsistent`; a
//! native sidecar is read from `initContainerStatuses`, by the same rules):
//! - the pod must report as many container statuses as it has containers (and, for a native
//!   sidecar, as many init container statuses as it has init containers);
//! - when every sidecar image of the SidecarSet in the pod is pinned by digest, the status
//!   imageID must carry that digest;
//! - otherwise the `kruise.io/sidecarset-inplace-update-state` annotation records each upgraded
//!   container's imageID from before the upgrade: while the status still shows that imageID
//!   under another image name, kubelet has not restarted the container yet. Image names are
//!   compared normalized (`nginx:1.25` is `docker.io/library/nginx:1.25`, as the runtime
//!   reports it), so a new tag of the same image (same imageID) counts as running once kubelet
//!   reports it (upstream compares the raw strings: #1270).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, PodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::rollout::{CurrentHashes, InPlaceResize, KubeletResize, PodPhase, PodView, SidecarView};
use super::twin_flip::others_on_empty_image;
use kruise_rs_api::image::ImageRef;
use kruise_rs_api::sidecarset::{SidecarContainer, SidecarSet};
use kruise_rs_api::well_known::{
    SIDECARSET_HASH, SIDECARSET_HASH_WITHOUT_IMAGE, SIDECARSET_INJECTED_LIST,
    SIDECARSET_INPLACE_UPDATE_STATE, SIDECARSET_WORKING_HOTUPGRADE_CONTAINER,
};
use kruise_rs_controller::pod_summary::{
    ContainerStatusSummary, ContainerSummary, POD_RESIZE_IN_PROGRESS, POD_RESIZE_PENDING,
    PodSummary,
};
use kruise_rs_sidecar::annotations::pod_entry;
use kruise_rs_sidecar::gojson::html_escape_compact_json;
use kruise_rs_sidecar::hash::is_native_sidecar;
use kruise_rs_sidecar::hot_upgrade::{injects_twins, is_twin_of, pod_has_twins, working_twins};
use kruise_rs_sidecar::matching::{pod_namespace, sidecarset_matches};

/// Namespace name to labels, for namespace selectors.
pub type NamespaceLabels = BTreeMap<String, BTreeMap<String, String>>;

/// The labels of every namespace in `namespaces`.
pub(crate) fn namespace_labels<'a>(
    namespaces: impl IntoIterator<Item = &'a Namespace>,
) -> NamespaceLabels {
    namespaces
        .into_iter()
        .filter_map(|ns| {
            let name = ns.metadata.name.clone()?;
            Some((name, ns.metadata.labels.clone().unwrap_or_default()))
        })
        .collect()
}

/// Whether `pod` was injected with `set`.
pub(crate) fn injected_with(pod: &PodSummary, set: &str) -> bool {
    pod.annotation(SIDECARSET_INJECTED_LIST)
        .is_some_and(|list| list.split(',').any(|name| name == set))
}

/// The SidecarSets named in `pod`'s injected list.
#[cfg(test)]
pub(crate) fn injected_sidecarsets(pod: &PodSummary) -> Vec<String> {
    pod.annotation(SIDECARSET_INJECTED_LIST)
        .map(|list| {
            kruise_rs_sidecar::annotations::parse_injected_list(list)
                .into_iter()
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `set` owns `pod`; see the module documentation. A selector that cannot be
/// evaluated owns nothing (validation keeps such SidecarSets out).
pub(crate) fn owns(set: &SidecarSet, pod: &PodSummary, namespaces: &NamespaceLabels) -> bool {
    let name = set.metadata.name.as_deref().unwrap_or_default();
    if !injected_with(pod, name) {
        return false;
    }
    let empty = BTreeMap::new();
    let ns_labels = namespaces.get(pod_namespace(pod)).unwrap_or(&empty);
    if !sidecarset_matches(set, pod_namespace(pod), pod.labels(), ns_labels).unwrap_or(false) {
        return false;
    }
    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    let init = pod
        .spec
        .as_ref()
        .map(|s| s.init_containers.as_slice())
        .unwrap_or_default();
    let working = working_twins(pod.annotation(SIDECARSET_WORKING_HOTUPGRADE_CONTAINER));
    set.spec
        .containers
        .iter()
        .all(|sidecar| in_pod(sidecar, false, containers, &working))
        && native_sidecar_specs(set).all(|sidecar| in_pod(sidecar, true, init, &working))
}

/// Whether `sidecar` is among `containers` (the pod's containers, or with `init_container` its
/// init containers): by name, or as both twins with a working entry.
fn in_pod(
    sidecar: &SidecarContainer,
    init_container: bool,
    containers: &[ContainerSummary],
    working: &BTreeMap<String, String>,
) -> bool {
    let name = &sidecar.container.name;
    if injects_twins(sidecar, init_container) {
        pod_has_twins(name, containers.iter().map(|c| &*c.name), working)
    } else {
        containers.iter().any(|c| *c.name == **name)
    }
}

/// The containers of `containers` that are `sidecar` in a pod: itself by name, or its twins.
fn named_in_pod<'a>(
    sidecar: &'a SidecarContainer,
    init_container: bool,
    containers: &'a [ContainerSummary],
) -> impl Iterator<Item = &'a ContainerSummary> {
    let name = &sidecar.container.name;
    let twins = injects_twins(sidecar, init_container);
    containers.iter().filter(move |c| {
        if twins {
            is_twin_of(&c.name, name)
        } else {
            *c.name == **name
        }
    })
}

/// The SidecarSet's native sidecars: its init containers with `restartPolicy: Always`.
fn native_sidecar_specs(set: &SidecarSet) -> impl Iterator<Item = &SidecarContainer> {
    set.spec
        .init_containers
        .iter()
        .filter(|c| is_native_sidecar(c))
}

/// The pod's init containers that are `set`'s native sidecars (or their twins), in the
/// SidecarSet's order.
fn native_sidecars<'a>(
    set: &'a SidecarSet,
    pod: &'a PodSummary,
) -> impl Iterator<Item = &'a ContainerSummary> {
    let init = pod
        .spec
        .as_ref()
        .map(|s| s.init_containers.as_slice())
        .unwrap_or_default();
    native_sidecar_specs(set).flat_map(move |s| named_in_pod(s, true, init))
}

/// The containers of `pod` that are `set`'s sidecar containers (not its native sidecars): a
/// sidecar's own name, or both twins of a hot-upgrade sidecar; only those the pod has.
pub(crate) fn sidecar_containers<'a>(
    set: &'a SidecarSet,
    pod: &'a PodSummary,
) -> Vec<&'a ContainerSummary> {
    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    set.spec
        .containers
        .iter()
        .flat_map(|sidecar| named_in_pod(sidecar, false, containers))
        .collect()
}

/// One SidecarSet's record in `kruise.io/sidecarset-inplace-update-state` (upstream's
/// `InPlaceUpdateState`; fields in its JSON order, unknown ones kept).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct InPlaceUpdateState {
    #[serde(default)]
    pub revision: String,
    #[serde(rename = "updateTimestamp", default)]
    pub update_timestamp: Option<Time>,
    /// Container name to its imageID before the upgrade.
    #[serde(rename = "lastContainerStatuses", default)]
    pub last_container_statuses: BTreeMap<String, LastContainerStatus>,
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LastContainerStatus {
    #[serde(rename = "imageID", default, skip_serializing_if = "String::is_empty")]
    pub image_id: String,
}

/// SidecarSet name to its record.
pub(crate) type InPlaceUpdateStates = BTreeMap<String, InPlaceUpdateState>;

/// Reads the in-place update state annotation; `None` when unreadable.
pub(crate) fn parse_update_states(value: &str) -> Option<InPlaceUpdateStates> {
    serde_json::from_str::<Option<InPlaceUpdateStates>>(value)
        .ok()
        .map(Option::unwrap_or_default)
}

/// Writes the in-place update state annotation as upstream's `json.Marshal` does.
pub fn render_update_states(states: &InPlaceUpdateStates) -> String {
    let json = serde_json::to_string(states).unwrap_or_else(|_| "{}".to_owned());
    html_escape_compact_json(&json)
}

/// Two image references name the same image (normalized; the raw strings when either does
/// not parse).
pub(crate) fn same_image(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    match (ImageRef::parse(a), ImageRef::parse(b)) {
        (Ok(a), Ok(b)) => a.to_pull_ref() == b.to_pull_ref(),
        _ => false,
    }
}

/// The digest an imageID carries (`repo@sha256:…`, `docker-pullable://repo@sha256:…`, or a
/// bare `sha256:…`).
fn image_id_digest(image_id: &str) -> &str {
    match image_id.rsplit_once('@') {
        Some((_, digest)) => digest,
        None => image_id,
    }
}

/// What the in-place update state says of one container.
enum Record<'a> {
    /// Its imageID before the last upgrade.
    ImageId(&'a str),
    /// Never upgraded in place.
    None,
    /// The annotation cannot be read. Upstream then calls the pod inconsistent until the next
    /// upgrade rewrites it, which can hold a rollout forever; we compare image names instead.
    Unreadable,
}

/// The container runs the image its spec names; see the module documentation.
fn runs_spec_image(
    container: &ContainerSummary,
    status: Option<&ContainerStatusSummary>,
    all_digests: bool,
    before_upgrade: Record<'_>,
) -> bool {
    let Some(status) = status else {
        return false;
    };
    let spec_image = container.image.as_deref().unwrap_or_default();
    if all_digests {
        let digest = ImageRef::parse(spec_image)
            .ok()
            .and_then(|r| r.digest().map(str::to_owned));
        return digest.is_some_and(|d| image_id_digest(&status.image_id) == d);
    }
    match before_upgrade {
        Record::ImageId(before) => {
            *before != *status.image_id || same_image(spec_image, &status.image)
        }
        Record::None => true,
        Record::Unreadable => same_image(spec_image, &status.image),
    }
}

fn pod_condition<'a>(pod: &'a PodSummary, type_: &str) -> Option<&'a PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

/// Where `pod`'s kubelet is with its resizes: its resize conditions, then its observed
/// generation. A `PodResizePending` with a reason other than `Infeasible` reads as deferred.
pub(crate) fn kubelet_resize(pod: &PodSummary) -> KubeletResize {
    if let Some(pending) = pod_condition(pod, POD_RESIZE_PENDING).filter(|c| c.status == "True") {
        return match pending.reason.as_deref() {
            Some("Infeasible") => KubeletResize::Infeasible,
            _ => KubeletResize::Deferred,
        };
    }
    if pod_condition(pod, POD_RESIZE_IN_PROGRESS).is_some_and(|c| c.status == "True") {
        return KubeletResize::InProgress;
    }
    let observed = pod.status.as_ref().and_then(|s| s.observed_generation);
    match (observed, pod.metadata.generation) {
        (Some(observed), Some(generation)) if observed < generation => KubeletResize::Unobserved,
        _ => KubeletResize::Settled,
    }
}

fn phase(pod: &PodSummary) -> PodPhase {
    match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Running") => PodPhase::Running,
        Some("Succeeded") => PodPhase::Succeeded,
        Some("Failed") => PodPhase::Failed,
        Some("Unknown") => PodPhase::Unknown,
        _ => PodPhase::Pending,
    }
}

/// What the upgrade decision needs to know about `pod` for `set`, whose current hashes are
/// `current` ([`CurrentHashes::of`], taken once for all the pods of a reconcile).
pub fn view<'a>(set: &SidecarSet, current: &CurrentHashes, pod: &'a PodSummary) -> PodView<'a> {
    let name = set.metadata.name.as_deref().unwrap_or_default();
    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_deref())
        .unwrap_or_default();
    let all_reported = statuses.len() == containers.len();
    let sidecar_containers = sidecar_containers(set, pod);
    let native_containers: Vec<&ContainerSummary> = native_sidecars(set, pod).collect();
    let init_statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_deref())
        .unwrap_or_default();
    let init_count = pod.spec.as_ref().map_or(0, |s| s.init_containers.len());
    let init_reported = all_reported && init_statuses.len() == init_count;
    let all_digests = sidecar_containers
        .iter()
        .chain(&native_containers)
        .all(|c| {
            ImageRef::parse(c.image.as_deref().unwrap_or_default())
                .is_ok_and(|r| r.digest().is_some())
        });
    let states = pod
        .annotation(SIDECARSET_INPLACE_UPDATE_STATE)
        .map(parse_update_states);
    let before = |container: &str| -> Record {
        match &states {
            Some(None) => Record::Unreadable,
            Some(Some(states)) => states
                .get(name)
                .and_then(|s| s.last_container_statuses.get(container))
                .filter(|s| !s.image_id.is_empty())
                .map_or(Record::None, |s| Record::ImageId(&s.image_id)),
            None => Record::None,
        }
    };
    let sidecars = sidecar_containers
        .iter()
        .map(|c| {
            let status = statuses.iter().find(|s| s.name == c.name);
            SidecarView {
                name: c.name.clone(),
                ready: status.is_some_and(|s| s.ready),
                image_running: all_reported
                    && runs_spec_image(c, status, all_digests, before(&c.name)),
                native: false,
            }
        })
        .chain(native_containers.iter().map(|c| {
            let status = init_statuses.iter().find(|s| s.name == c.name);
            SidecarView {
                name: c.name.clone(),
                ready: status.is_some_and(|s| s.ready),
                image_running: init_reported
                    && runs_spec_image(c, status, all_digests, before(&c.name)),
                native: true,
            }
        }))
        .collect();
    let ready_condition = pod_condition(pod, "Ready");
    let phase = phase(pod);
    let hash_entry = pod_entry(pod.annotation(SIDECARSET_HASH), SIDECARSET_HASH, name);
    let hash_without_image_current = pod_entry(
        pod.annotation(SIDECARSET_HASH_WITHOUT_IMAGE),
        SIDECARSET_HASH_WITHOUT_IMAGE,
        name,
    )
    .is_some_and(|e| e.hash == current.without_image);
    // The version the pod records says what else changed: only resources means a resize.
    let resources_only = !hash_without_image_current
        && hash_entry
            .as_ref()
            .is_some_and(|e| current.resizable_hashes.contains(e.hash.as_str()));
    let resize = match (resources_only, current.resize_served) {
        (false, _) => InPlaceResize::NotNeeded,
        (true, true) => InPlaceResize::Needed,
        (true, false) => InPlaceResize::Unserved,
    };
    PodView {
        pod,
        phase,
        ready: phase == PodPhase::Running
            && ready_condition.is_some_and(|c| c.status == "True")
            && others_on_empty_image(set, pod),
        ready_since: ready_condition
            .and_then(|c| c.last_transition_time.as_ref())
            .map(|t| t.0)
            .into(),
        restarts: statuses.iter().map(|s| s.restart_count).max().unwrap_or(0),
        created: pod.metadata.creation_timestamp.as_ref().map(|t| t.0).into(),
        deleting: pod.metadata.deletion_timestamp.is_some(),
        hash_current: hash_entry.as_ref().is_some_and(|e| e.hash == current.hash),
        hash_written: hash_entry
            .as_ref()
            .and_then(|e| e.update_timestamp.as_ref())
            .map(|t| t.0)
            .into(),
        hash_without_image_current,
        resize,
        kubelet_resize: kubelet_resize(pod),
        sidecars,
        // Decided later, from the pre-download state of the pod's node.
        awaiting_images: false,
    }
}

/// [`view`] with the SidecarSet's current hashes taken here, for tests of one pod.
#[cfg(test)]
pub(crate) fn test_view<'a>(set: &SidecarSet, pod: &'a PodSummary) -> PodView<'a> {
    view(set, &CurrentHashes::of(set), pod)
}

/// A stored pod for a test's views: `namespace/name` with `labels`, on `node` (leaked: a test's
/// pods live as long as it).
#[cfg(test)]
pub(crate) fn test_pod(
    namespace: &str,
    name: &str,
    labels: &[(&str, &str)],
    node: Option<&str>,
) -> &'static PodSummary {
    let metadata = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        namespace: Some(namespace.to_owned()),
        name: Some(name.to_owned()),
        labels: Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ),
        ..Default::default()
    };
    let spec = kruise_rs_controller::pod_summary::PodSpecSummary {
        node_name: node.map(str::to_owned),
        ..Default::default()
    };
    Box::leak(Box::new(PodSummary::new(metadata, Some(spec), None)))
}

/// Changes the stored pod `view` reads (a changed copy, leaked as [`test_pod`]'s).
#[cfg(test)]
pub(crate) fn change_pod(view: &mut PodView<'static>, change: impl FnOnce(&mut PodSummary)) {
    let mut pod = view.pod.clone();
    change(&mut pod);
    view.pod = Box::leak(Box::new(pod));
}

#[cfg(test)]
mod tests;
