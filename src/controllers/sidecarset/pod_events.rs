//! Which pod changes wake which SidecarSets (upstream's `sidecarset_pod_event_handler.go`).
//!
//! A cluster's pods change all the time (status heartbeats, other controllers' annotations);
//! only what can move a rollout or its status wakes a SidecarSet. Each pod is summarized in a
//! [`PodSignature`]; when it changes, the SidecarSets named in the pod's injected list (before
//! or after the change) are reconciled:
//! - a pod appears or goes away (its deletion frees a maxUnavailable slot: #1168);
//! - it starts or stops being active (deletion timestamp, finished phase), ready, or changes
//!   its containers' images, container statuses (readiness, image, imageID), the SidecarSet
//!   annotations or its `SidecarSetUpgradable` condition: what consistency, status counts and
//!   the next batch read;
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

use crate::controllers::shared::pod_summary::PodSummary;
use kube::runtime::watcher;

use super::pods::injected_sidecarsets;
use crate::apis::well_known::SIDECARSET_UPGRADABLE_CONDITION;

/// What of a pod can matter to its SidecarSets; see the module documentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodSignature {
    /// The pod's injected list.
    pub sidecarsets: Vec<String>,
    /// Everything else that matters, hashed.
    state: u64,
}

/// The signature of a pod as the SidecarSet controller stores it.
pub fn signature(pod: &PodSummary) -> PodSignature {
    let mut h = DefaultHasher::new();
    let meta = &pod.metadata;
    meta.deletion_timestamp.is_some().hash(&mut h);
    meta.labels.hash(&mut h);
    // The stored pod keeps only the SidecarSet annotations.
    meta.annotations.hash(&mut h);
    if let Some(spec) = &pod.spec {
        spec.node_name.hash(&mut h);
        for c in &spec.containers {
            (&c.name, &c.image).hash(&mut h);
        }
    }
    if let Some(status) = &pod.status {
        status.phase.hash(&mut h);
        for c in status.conditions.iter().flatten() {
            if c.type_ == "Ready" || c.type_ == SIDECARSET_UPGRADABLE_CONDITION {
                (&c.type_, &c.status, &c.message).hash(&mut h);
            }
        }
        for c in status.container_statuses.iter().flatten() {
            (&c.name, &c.image, &c.image_id, c.ready).hash(&mut h);
        }
    }
    PodSignature {
        sidecarsets: injected_sidecarsets(pod),
        state: h.finish(),
    }
}

/// The SidecarSets to wake after a pod went from `old` to `new` (`None`: absent).
pub fn sidecarsets_to_wake(
    old: Option<&PodSignature>,
    new: Option<&PodSignature>,
) -> BTreeSet<String> {
    if old == new {
        return BTreeSet::new();
    }
    old.into_iter()
        .chain(new)
        .flat_map(|s| s.sidecarsets.iter().cloned())
        .collect()
}

/// The last signature of every pod seen, to turn watch events into SidecarSets to wake.
#[derive(Default)]
pub struct PodTracker {
    state: Mutex<TrackerState>,
}

#[derive(Default)]
struct TrackerState {
    seen: HashMap<String, PodSignature>,
    /// Pods seen during a re-list in progress; the ones missing at its end were deleted
    /// while the watch was down.
    relisted: Option<HashMap<String, PodSignature>>,
}

fn key(pod: &PodSummary) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

impl PodTracker {
    /// The SidecarSets `event` wakes.
    pub fn wake(&self, event: &watcher::Event<PodSummary>) -> BTreeSet<String> {
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
                    .flat_map(|(_, s)| s.sidecarsets.iter().cloned())
                    .collect();
                state.seen = relisted;
                gone
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::apis::well_known::SIDECARSET_INJECTED_LIST;

    fn pod(name: &str, list: &str) -> PodSummary {
        serde_json::from_value(json!({
            "metadata": {
                "name": name, "namespace": "ns", "resourceVersion": "1",
                "labels": {"app": "web"},
                "annotations": {SIDECARSET_INJECTED_LIST: list},
            },
            "spec": {"containers": [{"name": "proxy", "image": "proxy:1"}]},
            "status": {
                "phase": "Running",
                "conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "ContainersReady", "status": "True"},
                ],
                "containerStatuses": [{"name": "proxy", "image": "proxy:1", "imageID": "a", "ready": true, "restartCount": 0}],
            }
        }))
        .expect("pod")
    }

    /// One edit of a pod.
    type Change = fn(&mut PodSummary);

    fn wake(old: &PodSummary, new: &PodSummary) -> Vec<String> {
        sidecarsets_to_wake(Some(&signature(old)), Some(&signature(new)))
            .into_iter()
            .collect()
    }

    #[test]
    fn changes_that_matter_wake_the_pods_sidecarsets() {
        let old = pod("a", "logs,mesh");
        let changes: Vec<(&str, Change)> = vec![
            ("readiness", |p| {
                p.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "False".into()
            }),
            ("deletion", |p| {
                p.metadata.deletion_timestamp =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        "2026-11-29T00:00:00Z".parse().unwrap(),
                    ))
            }),
            ("phase", |p| {
                p.status.as_mut().unwrap().phase = Some("Succeeded".into())
            }),
            ("image", |p| {
                p.spec.as_mut().unwrap().containers[0].image = Some("proxy:2".into())
            }),
            ("imageID", |p| {
                p.status
                    .as_mut()
                    .unwrap()
                    .container_statuses
                    .as_mut()
                    .unwrap()[0]
                    .image_id = "b".into()
            }),
            ("container ready", |p| {
                p.status
                    .as_mut()
                    .unwrap()
                    .container_statuses
                    .as_mut()
                    .unwrap()[0]
                    .ready = false
            }),
            ("labels", |p| {
                p.metadata
                    .labels
                    .as_mut()
                    .unwrap()
                    .insert("tier".into(), "x".into());
            }),
            ("hash annotation", |p| {
                p.metadata
                    .annotations
                    .as_mut()
                    .unwrap()
                    .insert("kruise.io/sidecarset-hash".into(), "{}".into());
            }),
            ("scheduling", |p| {
                p.spec.as_mut().unwrap().node_name = Some("n1".into())
            }),
        ];
        for (what, change) in changes {
            let mut new = old.clone();
            change(&mut new);
            assert_eq!(wake(&old, &new), ["logs", "mesh"], "{what}");
        }
    }

    #[test]
    fn other_changes_wake_nothing() {
        let old = pod("a", "mesh");
        let mut new = old.clone();
        new.metadata.resource_version = Some("2".into());
        new.status
            .as_mut()
            .unwrap()
            .container_statuses
            .as_mut()
            .unwrap()[0]
            .restart_count = 1;
        assert!(wake(&old, &new).is_empty());
    }

    #[test]
    fn a_changed_injected_list_wakes_old_and_new_sidecarsets() {
        assert_eq!(wake(&pod("a", "logs"), &pod("a", "mesh")), ["logs", "mesh"]);
    }

    #[test]
    fn the_tracker_wakes_on_creation_change_and_deletion_but_not_on_the_first_list() {
        let tracker = PodTracker::default();
        let a = pod("a", "mesh");
        assert!(tracker.wake(&watcher::Event::Init).is_empty());
        assert!(
            tracker
                .wake(&watcher::Event::InitApply(a.clone()))
                .is_empty()
        );
        assert!(tracker.wake(&watcher::Event::InitDone).is_empty());
        assert!(
            tracker.wake(&watcher::Event::Apply(a.clone())).is_empty(),
            "no change"
        );
        let b = pod("b", "logs");
        assert_eq!(
            tracker.wake(&watcher::Event::Apply(b.clone())),
            BTreeSet::from(["logs".to_owned()])
        );
        let mut a2 = a.clone();
        a2.spec.as_mut().unwrap().containers[0].image = Some("proxy:2".into());
        assert_eq!(
            tracker.wake(&watcher::Event::Apply(a2)),
            BTreeSet::from(["mesh".to_owned()])
        );
        assert_eq!(
            tracker.wake(&watcher::Event::Delete(b)),
            BTreeSet::from(["logs".to_owned()])
        );
    }

    #[test]
    fn a_relist_wakes_the_sidecarsets_of_pods_that_vanished_meanwhile() {
        let tracker = PodTracker::default();
        tracker.wake(&watcher::Event::Apply(pod("a", "mesh")));
        tracker.wake(&watcher::Event::Apply(pod("b", "logs")));
        tracker.wake(&watcher::Event::Init);
        assert!(
            tracker
                .wake(&watcher::Event::InitApply(pod("a", "mesh")))
                .is_empty()
        );
        assert_eq!(
            tracker.wake(&watcher::Event::InitDone),
            BTreeSet::from(["logs".to_owned()])
        );
        // b is forgotten: deleting it again wakes nothing.
        assert!(
            tracker
                .wake(&watcher::Event::Delete(pod("b", "logs")))
                .is_empty()
        );
    }
}
