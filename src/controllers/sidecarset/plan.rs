//! The pure decisions of a SidecarSet reconcile: plain values in (the SidecarSet, its pods,
//! jobs, revisions, the previous status), plain decisions out. Nothing here reads a store or
//! calls the API, so every rule is unit-tested here (`reconcile.rs` does the
//! fetching and writing).

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::PodCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use serde_json::Value;

use super::pods::{NamespaceLabels, owns, parse_update_states, view};
use super::predownload::{self, Decision, IMAGE_PREDOWNLOAD, Knobs, Progress};
use super::rollout::Hold;
use super::rollout::{Batch, CurrentHashes, PodState, PodView, classify, next_batch};
use super::status::{PODS_UPGRADABLE, StatusReport, compute_status, unsupported_condition};
use super::twin_flip::{Flip, flip_patch, hot_sidecars};
use super::upgrade::{upgradable_condition, upgraded_condition};
use kruise_rs_api::imagepulljob::ImagePullJob;
use kruise_rs_api::sidecarset::{SidecarSet, SidecarSetStatus};
use kruise_rs_api::well_known::{
    CONTROLLER_REVISION_HASH, SIDECARSET_HASH, SIDECARSET_INPLACE_UPDATE_STATE,
    SIDECARSET_NAME_LABEL,
};
use kruise_rs_controller::pod_summary::PodSummary;
use kruise_rs_imagepull::lean_nodeimage::LeanNodeImage;
use kruise_rs_sidecar::annotations::parse_hashes;

/// Everything one reconcile decides before it writes anything.
pub struct Plan<'a> {
    /// The version the pods are upgraded to, which the views were read against.
    pub current: CurrentHashes,
    /// One per owned pod, in the same order (borrowing from them).
    pub views: Vec<PodView<'a>>,
    pub batch: Batch,
    pub report: StatusReport,
    pub predownload: Decision,
    /// When a pod waiting for its node's pull stops waiting (`predownload::wait_deadline`):
    /// the reconcile comes back then.
    pub predownload_wake: Option<k8s_openapi::jiff::Timestamp>,
    /// Pods (by index in the owned pods) whose old hot-upgrade twins go back to the empty image
    /// now; the batch leaves them out (see `flips`).
    pub flips: Vec<(usize, Flip)>,
}

/// What the pre-download part of a plan reads besides the pods.
pub struct PreDownloadInputs<'a> {
    pub knobs: &'a Knobs,
    pub manager_namespace: &'a str,
    /// The SidecarSet's pre-download jobs as they are (for their progress, and whether this
    /// revision's have started).
    pub jobs: &'a [Arc<ImagePullJob>],
    /// A node's NodeImage.
    pub nodeimage: &'a dyn Fn(&str) -> Option<Arc<LeanNodeImage>>,
}

/// The pods of `pods` that `set` owns.
pub fn owned_pods(
    set: &SidecarSet,
    pods: impl IntoIterator<Item = Arc<PodSummary>>,
    namespaces: &NamespaceLabels,
) -> Vec<Arc<PodSummary>> {
    pods.into_iter()
        .filter(|p| owns(set, p, namespaces))
        .collect()
}

/// The value of `job`'s label `key`.
pub(crate) fn label<'a>(job: &'a ImagePullJob, key: &str) -> Option<&'a str> {
    job.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// What to do for `set` (its `status.latestRevision` already the registered revision) over
/// its `owned` pods, upgrading them to `current`: the pure heart of a reconcile.
pub fn plan<'a>(
    set: &SidecarSet,
    current: CurrentHashes,
    owned: &'a [Arc<PodSummary>],
    collision_count: i32,
    now: &Time,
    pre: &PreDownloadInputs<'_>,
) -> Plan<'a> {
    let mut views: Vec<PodView> = owned.iter().map(|p| view(set, &current, p)).collect();
    let mut batch = next_batch(set, &views);
    let latest = set
        .status
        .as_ref()
        .and_then(|s| s.latest_revision.as_deref())
        .unwrap_or_default();
    let mut report = compute_status(set, &views, &batch, latest, collision_count, now);

    let hash = predownload::revision_hash(set);
    let started = pre
        .jobs
        .iter()
        .any(|j| label(j, CONTROLLER_REVISION_HASH) == Some(hash.as_str()));
    let updated_ready = usize::try_from(report.status.updated_ready_pods).unwrap_or(0);
    let mut decision = predownload::decide(
        set,
        owned,
        &batch,
        updated_ready,
        pre.knobs,
        pre.manager_namespace,
        started,
    );
    predownload::keep_listed_nodes(decision.jobs_mut(), pre.jobs);
    // While pulling, the queued pods wait for their nodes, each for a bounded time.
    let mut predownload_wake = None;
    if matches!(decision, Decision::Pull(_)) {
        let awaiting = predownload::mark_awaiting(
            set,
            owned,
            &mut views,
            &batch,
            pre.nodeimage,
            now,
            predownload::max_wait(pre.knobs),
        );
        predownload_wake = awaiting.wake;
        if awaiting.pods > 0 {
            batch = next_batch(set, &views);
            report = compute_status(set, &views, &batch, latest, collision_count, now);
        }
    }
    let wanted: Vec<&Arc<ImagePullJob>> = pre
        .jobs
        .iter()
        .filter(|j| {
            decision.jobs().iter().any(|p| {
                j.metadata.namespace.as_deref() == Some(p.namespace.as_str())
                    && j.metadata.name.as_deref() == Some(p.name.as_str())
            })
        })
        .collect();
    let progress = Progress::of(decision.jobs(), wanted.into_iter().map(|j| &**j));
    let previous = set
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == IMAGE_PREDOWNLOAD));
    report.status.conditions.push(predownload::condition(
        &decision,
        progress,
        previous,
        set.metadata.generation,
        now,
    ));
    let previous = set.status.as_ref().map(|s| s.conditions.as_slice());
    report.status.conditions.extend(unsupported_condition(
        set,
        previous.unwrap_or_default(),
        now,
    ));
    let flips = flips(set, owned, &views, &mut batch);
    Plan {
        current,
        views,
        batch,
        report,
        predownload: decision,
        predownload_wake,
        flips,
    }
}

/// The hot-upgrade flips of this round ([`flip_patch`] for every owned pod), unless the
/// rollout is `NotUpdate` or paused (upstream checks those first too). Selection does not
/// matter: a pod that got a twin upgraded finishes it. A flipping pod leaves `batch.upgrade`:
/// both patches would test the same annotations and the second would fail. Upstream ends the
/// round after flipping; here the batch goes on, since it already counts flipping pods as in
/// flight (updated, not ready) against `maxUnavailable`.
pub(crate) fn flips(
    set: &SidecarSet,
    owned: &[Arc<PodSummary>],
    views: &[PodView<'_>],
    batch: &mut Batch,
) -> Vec<(usize, Flip)> {
    if hot_sidecars(set).next().is_none()
        || matches!(batch.hold, Some(Hold::NotUpdate | Hold::Paused))
    {
        return Vec::new();
    }
    let flips: Vec<(usize, Flip)> = owned
        .iter()
        .zip(views)
        .enumerate()
        .filter(|(_, (_, v))| v.is_active())
        .filter_map(|(i, (pod, v))| {
            let names: Vec<String> = v.sidecars.iter().map(|s| s.name.to_string()).collect();
            let settled = |c: &str| v.sidecars.iter().any(|s| &*s.name == c && s.image_running);
            flip_patch(set, pod, &names, settled).map(|f| (i, f))
        })
        .collect();
    batch.upgrade.retain(|i| !flips.iter().any(|(f, _)| f == i));
    flips
}

/// The ControllerRevision `pod`'s hash entry for `set` records.
#[cfg(test)]
pub(crate) fn recorded_revision(pod: &PodSummary, set: &str) -> Option<String> {
    revision_in_hashes(pod.annotations().get(SIDECARSET_HASH)?, set)
}

/// The ControllerRevision a hash annotation `value` records for `set`.
fn revision_in_hashes(value: &str, set: &str) -> Option<String> {
    let entry = parse_hashes(SIDECARSET_HASH, value).ok()?.remove(set)?;
    Some(entry.controller_revision).filter(|r| !r.is_empty())
}

/// The SidecarSets with a pre-download job listing `node`.
pub(crate) fn sidecarsets_pulling_on<'a>(
    jobs: impl IntoIterator<Item = &'a ImagePullJob>,
    node: &str,
) -> BTreeSet<String> {
    jobs.into_iter()
        .filter(|j| {
            j.spec
                .template
                .selector
                .as_ref()
                .is_some_and(|s| s.names.iter().any(|n| n == node))
        })
        .filter_map(|j| label(j, SIDECARSET_NAME_LABEL).map(str::to_owned))
        .collect()
}

/// `set`'s pre-download jobs among `jobs`: labelled with its name and owned by its uid.
pub(crate) fn own_jobs(
    set: &SidecarSet,
    jobs: impl IntoIterator<Item = Arc<ImagePullJob>>,
) -> Vec<Arc<ImagePullJob>> {
    let name = set.name_any();
    let uid = set.metadata.uid.as_deref();
    jobs.into_iter()
        .filter(|j| {
            label(j, SIDECARSET_NAME_LABEL) == Some(name.as_str())
                && j.owner_references()
                    .iter()
                    .any(|o| Some(o.uid.as_str()) == uid)
        })
        .collect()
}

/// The revisions among `revisions` labelled as SidecarSet `name`'s.
pub(crate) fn labelled_history<'a>(
    name: &str,
    revisions: impl IntoIterator<Item = &'a ControllerRevision>,
) -> Vec<ControllerRevision> {
    revisions
        .into_iter()
        .filter(|r| r.labels().get(SIDECARSET_NAME_LABEL).map(String::as_str) == Some(name))
        .cloned()
        .collect()
}

/// The revisions the `owned` pods of SidecarSet `name` record: never deleted.
pub(crate) fn revisions_in_use(owned: &[Arc<PodSummary>], name: &str) -> BTreeSet<String> {
    // Pods upgraded together carry equal hash annotations: each distinct one is parsed once,
    // not once per pod (this runs every reconcile, over every pod, and a parse builds a map
    // and its strings).
    let distinct: HashSet<&str> = owned
        .iter()
        .filter_map(|p| p.annotations().get(SIDECARSET_HASH))
        .collect();
    distinct
        .into_iter()
        .filter_map(|value| revision_in_hashes(value, name))
        .collect()
}

/// The message of a `PodsUpgradable: False` condition that is new or changed since `previous`
/// (upstream's `NotUpgradablePods` event), so the event is not repeated every reconcile.
pub(crate) fn newly_not_upgradable(
    previous: Option<&SidecarSetStatus>,
    status: &SidecarSetStatus,
) -> Option<String> {
    let condition = |s: &SidecarSetStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == PODS_UPGRADABLE)
            .map(|c| (c.status.clone(), c.message.clone()))
    };
    let (state, message) = condition(status)?;
    if state != "False" || previous.and_then(condition) == Some((state, message.clone())) {
        return None;
    }
    Some(message)
}

/// The reason and message when pre-download has just turned to skipped (its reason differs
/// from `previous`'s).
pub(crate) fn newly_skipped(
    previous: Option<&SidecarSetStatus>,
    status: &SidecarSetStatus,
) -> Option<(String, String)> {
    let reason = |s: &SidecarSetStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == IMAGE_PREDOWNLOAD)
            .map(|c| (c.reason.clone(), c.message.clone()))
    };
    let (now, message) = reason(status)?;
    let skipped = now == "NotUpdateStrategy" || now == "OneBatch";
    (skipped && previous.and_then(reason).map(|(r, _)| r) != Some(now.clone()))
        .then_some((now, message))
}

/// Whether the pod seen as `view` can be upgraded in place, for its `SidecarSetUpgradable`
/// condition; `None` for a pod the condition does not concern (inactive or not selected).
pub(crate) fn upgradable(view: &PodView<'_>) -> Option<bool> {
    match classify(view, true) {
        PodState::NotUpgradable => Some(false),
        PodState::Inactive | PodState::NotSelected => None,
        _ => Some(true),
    }
}

/// The `SidecarSetUpgradable` condition SidecarSet `set` writes on the pod seen as `view`, if
/// any: `False` where it cannot upgrade the pod in place, its entry back to `true` where it can
/// again. With `on_upgrade` (`--sidecarset-upgradable-condition-on-upgrade`) also upstream's
/// `True` on a pod it has upgraded in place (its `kruise.io/sidecarset-inplace-update-state`
/// has an entry for `set`), created where the pod has no condition: one more pod status write
/// per upgraded pod. Decided from the pod as it is, so a write lost to a restart is made by the
/// next reconcile.
pub(crate) fn pod_condition(
    view: &PodView<'_>,
    set: &str,
    on_upgrade: bool,
    now: &Time,
) -> Option<PodCondition> {
    let pod = view.pod;
    let can_upgrade = upgradable(view)?;
    if let Some(condition) = upgradable_condition(pod, set, can_upgrade, now) {
        return Some(condition);
    }
    if !(can_upgrade && on_upgrade) {
        return None;
    }
    // The condition first: once it says so, the update state is not read again.
    let condition = upgraded_condition(pod, set, now)?;
    upgraded_in_place(pod, set).then_some(condition)
}

/// Whether `set` has upgraded `pod` in place: the pod's `kruise.io/sidecarset-inplace-update-state`
/// has an entry for it (injection writes none).
pub(crate) fn upgraded_in_place(pod: &PodSummary, set: &str) -> bool {
    pod.annotations()
        .get(SIDECARSET_INPLACE_UPDATE_STATE)
        .and_then(parse_update_states)
        .is_some_and(|states| states.contains_key(set))
}

/// The merge patch writing `status`. A merge patch leaves out what it does not mention, so the
/// optional fields are named even when unset (as `null`, removing them).
pub(crate) fn status_patch(status: &SidecarSetStatus) -> Value {
    let mut fields = serde_json::to_value(status).expect("a status always serializes");
    if let Some(map) = fields.as_object_mut() {
        for key in [
            "observedGeneration",
            "latestRevision",
            "collisionCount",
            "conditions",
        ] {
            map.entry(key).or_insert(Value::Null);
        }
    }
    serde_json::json!({ "status": fields })
}

/// Whether `job` is the job `namespace`/`name`.
pub(crate) fn is_job(job: &ImagePullJob, namespace: &str, name: &str) -> bool {
    job.metadata.namespace.as_deref() == Some(namespace)
        && job.metadata.name.as_deref() == Some(name)
}

/// The jobs of `existing` that `decision` no longer wants, to delete.
pub(crate) fn unwanted_jobs<'a>(
    decision: &Decision,
    existing: &'a [Arc<ImagePullJob>],
) -> Vec<&'a Arc<ImagePullJob>> {
    existing
        .iter()
        .filter(|j| {
            !decision
                .jobs()
                .iter()
                .any(|p| is_job(j, &p.namespace, &p.name))
        })
        .collect()
}

#[cfg(test)]
mod tests;
