//! Which pod changes wake which SidecarSets (upstream's `sidecarset_pod_event_handler.go`).
//!
//! A cluster's pods change all the time (status heartbeats, other controllers' annotations);
//! only what can move a rollout or its status wakes a SidecarSet. Each pod is summarized in a
//! `PodSignature`; when it changes, the SidecarSets named in the pod's injected list (before
//! or after the change) are reconciled:
//! - a pod appears or goes away (its deletion frees a maxUnavailable slot: #1168);
//! - it starts or stops being active (deletion timestamp, finished phase), ready, or changes
//!   its containers' or init containers' images (native sidecars are init containers), their
//!   statuses (readiness, image, imageID), the SidecarSet
//!   annotations, its `SidecarSetUpgradable` condition, the kubelet's resize conditions
//!   (`PodResizePending`, `PodResizeInProgress`) or whether the kubelet has observed the latest
//!   generation (a resize): what consistency, status counts and the next batch read;
//! - its labels change. Upstream wakes only SidecarSets with an update selector here, but the
//!   SidecarSet's own selector reads labels too (a relabelled pod leaves or joins it), so every
//!   named SidecarSet is woken.
//!
//! Anything else (a new unrelated annotation, a condition other than Ready, a heartbeat) wakes
//! nothing.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

use kruise_rs_controller::pod_summary::PodSummary;
use kube::runtime::watcher;

use kruise_rs_api::well_known::SIDECARSET_INJECTED_LIST;
use kruise_rs_controller::interned_labels::Interned;
use kruise_rs_sidecar::annotations::parse_injected_list;

/// What of a pod can matter to its SidecarSets; see the module documentation. One is kept per
/// pod, so it is small: the injected list is the pod's own (interned) annotation value, the same
/// string for every pod of the same SidecarSets, parsed only when a change wakes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PodSignature {
    /// The pod's injected list, as its annotation holds it.
    injected: Option<Interned>,
    /// Everything else that matters, hashed.
    state: u64,
}

impl PodSignature {
    /// The SidecarSets in the pod's injected list.
    pub(crate) fn sidecarsets(&self) -> BTreeSet<String> {
        self.injected
            .as_deref()
            .map(parse_injected_list)
            .unwrap_or_default()
    }
}

/// The signature of a pod as the SidecarSet controller stores it.
pub(crate) fn signature(pod: &PodSummary) -> PodSignature {
    let mut h = DefaultHasher::new();
    let meta = &pod.metadata;
    meta.deletion_timestamp.is_some().hash(&mut h);
    pod.labels().hash(&mut h);
    // The stored pod keeps only the SidecarSet annotations.
    (pod.has_annotations(), pod.annotations()).hash(&mut h);
    if let Some(spec) = &pod.spec {
        spec.node_name.hash(&mut h);
        for c in spec.containers.iter().chain(&spec.init_containers) {
            (&c.name, &c.image).hash(&mut h);
        }
    }
    if let Some(status) = &pod.status {
        status.phase.hash(&mut h);
        // The summary keeps Ready, SidecarSetUpgradable and the kubelet's resize conditions,
        // which hold or free a resized pod's slot; their reason tells Deferred from Infeasible.
        for c in status.conditions.iter().flatten() {
            (&c.type_, &c.status, &c.reason, &c.message).hash(&mut h);
        }
        // Whether the kubelet has acted on the latest spec (a resize).
        (meta.generation, status.observed_generation).hash(&mut h);
        let init = status.init_container_statuses.iter().flatten();
        for c in status.container_statuses.iter().flatten().chain(init) {
            (&c.name, &c.image, &c.image_id, c.ready).hash(&mut h);
        }
    }
    PodSignature {
        injected: pod.annotation_shared(SIDECARSET_INJECTED_LIST).cloned(),
        state: h.finish(),
    }
}

/// The SidecarSets to wake after a pod went from `old` to `new` (`None`: absent).
pub(crate) fn sidecarsets_to_wake(
    old: Option<&PodSignature>,
    new: Option<&PodSignature>,
) -> BTreeSet<String> {
    if old == new {
        return BTreeSet::new();
    }
    old.into_iter()
        .chain(new)
        .flat_map(|s| s.sidecarsets())
        .collect()
}

/// The last signature of every pod seen, to turn watch events into SidecarSets to wake.
#[derive(Default)]
pub(crate) struct PodTracker {
    state: Mutex<TrackerState>,
}

/// Pods by `namespace/name`, held without spare room (one per pod in the cluster).
#[derive(Default)]
struct TrackerState {
    seen: HashMap<Box<str>, PodSignature>,
    /// Pods seen during a re-list in progress; the ones missing at its end were deleted
    /// while the watch was down.
    relisted: Option<HashMap<Box<str>, PodSignature>>,
}

fn key(pod: &PodSummary) -> Box<str> {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
    .into_boxed_str()
}

impl PodTracker {
    /// The SidecarSets `event` wakes.
    pub(crate) fn wake(&self, event: &watcher::Event<PodSummary>) -> BTreeSet<String> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match event {
            watcher::Event::Apply(pod) => {
                let new = signature(pod);
                let old = state.seen.insert(key(pod), new.clone());
                sidecarsets_to_wake(old.as_ref(), Some(&new))
            }
            watcher::Event::Delete(pod) => {
                let old = state.seen.remove(&key(pod));
                sidecarsets_to_wake(old.as_ref(), None)
            }
            watcher::Event::Init => {
                state.relisted = Some(HashMap::new());
                BTreeSet::new()
            }
            watcher::Event::InitApply(pod) => {
                let new = signature(pod);
                let k = key(pod);
                let old = state.seen.get(&k).cloned();
                state
                    .relisted
                    .get_or_insert_with(HashMap::new)
                    .insert(k, new.clone());
                // The first list wakes nothing: every SidecarSet is reconciled at start.
                match old {
                    Some(old) => sidecarsets_to_wake(Some(&old), Some(&new)),
                    None => BTreeSet::new(),
                }
            }
            watcher::Event::InitDone => {
                let relisted = state.relisted.take().unwrap_or_default();
                let gone = state
                    .seen
                    .iter()
                    .filter(|(k, _)| !relisted.contains_key(*k))
                    .flat_map(|(_, s)| s.sidecarsets())
                    .collect();
                state.seen = relisted;
                gone
            }
        }
    }
}

#[cfg(test)]
mod tests;
