//! A SidecarSet's status, and why its rollout cannot move, from its matched pods.
//!
//! The counts are upstream's (`calculateStatus`), over the *active* matched pods (pods being
//! deleted or finished are not counted, as upstream drops them while listing):
//! - `matchedPods`: the active pods;
//! - `updatedPods`: those whose hash entry for this SidecarSet is the current hash;
//! - `readyPods`: those that are ready *and* run every sidecar's spec image (a pod whose
//!   in-place restart kubelet has not performed yet is not counted, even if still Ready);
//! - `updatedReadyPods`: both;
//! - `observedGeneration`: the SidecarSet's `metadata.generation`;
//! - `latestRevision`, `collisionCount`: as the revision registration found them.
//!
//! [`Stall`]s say why pods that should be upgraded are not. They become two status conditions
//! (upstream has none; its clients ignore them):
//! - `RolloutHeld`: `True` with the stall's reason (`Paused`, `NotUpdateStrategy`,
//!   `InvalidUpdateStrategy`, `PartitionReached`, `MaxUnavailableReached`) when pods wait and
//!   none can move now; `False` with `Progressing` while pods wait and move, `Updated` when none
//!   waits.
//! - `PodsUpgradable`: `False` with `NotUpgradablePods` while some pods changed in more than
//!   their images and resources (`ResizeNotServed` when only their resources did, and the
//!   apiserver does not serve `pods/resize`); else `False` with `ResizeInfeasible` or
//!   `ResizeDeferred` while the kubelet of an updated pod has not applied its sidecars' resize
//!   and says why (its `PodResizePending` condition); `True` with `AllPodsUpgradable` otherwise.
//!
//! A third condition, `UnsupportedFeatures`, comes from the spec alone (`unsupported_condition`):
//! `True` while the SidecarSet uses a feature kruise-rs does not serve yet, with the features as
//! reason and the containers in the message; absent otherwise.
//!
//! A stall tied to the strategy (`NotUpdate`, paused, partition, maxUnavailable) is reported
//! only when the next batch is empty while pods still wait for the upgrade; an invalid strategy
//! and pods that cannot be upgraded in place are reported whenever there are any.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use kruise_rs_api::sidecarset::{SidecarSet, SidecarSetStatus};
use kruise_rs_sidecar::unsupported::{self, REFUSE, UNSUPPORTED_FEATURES};

use super::rollout::{
    Batch, Hold, InPlaceResize, KubeletResize, PodPhase, PodState, PodView, StrategyError, classify,
};
use kruise_rs_controller::pod_summary::POD_RESIZE_PENDING;

/// How many pod names a stall's message lists.
const EXAMPLES: usize = 5;

/// Why (part of) a rollout does not move.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stall {
    /// `updateStrategy.type: NotUpdate`; `waiting` pods keep their old sidecars.
    NotUpdate { waiting: usize },
    /// `updateStrategy.paused`; `waiting` pods wait.
    Paused { waiting: usize },
    /// The strategy cannot be evaluated.
    InvalidStrategy(StrategyError),
    /// Pods whose sidecars changed in more than their images: an in-place patch cannot update
    /// them, only recreating them can. `examples` are the first few by namespace/name.
    /// `resize_unserved` of them changed only in images and resources, which a resize would
    /// bring up to date, but the apiserver does not serve `pods/resize`.
    NotUpgradable {
        pods: usize,
        resize_unserved: usize,
        examples: Vec<String>,
    },
    /// Updated pods whose kubelet has not applied their sidecars' resize: `infeasible` never
    /// will on its node, `deferred` wait for room. `examples` name the first few with the
    /// kubelet's reason and message. They stay in flight (counted against maxUnavailable).
    ResizeNotApplied {
        infeasible: usize,
        deferred: usize,
        examples: Vec<String>,
    },
    /// `pods` pods wait for their nodes to pull the new sidecar images.
    WaitingForPreDownload { pods: usize },
    /// Every remaining pod is held back by the partition.
    PartitionReached { partition: usize },
    /// `unavailable` updated pods are not available yet, at least `max_unavailable`: the next
    /// pod waits for them. `examples` are the first few by namespace/name.
    MaxUnavailableReached {
        unavailable: usize,
        max_unavailable: usize,
        examples: Vec<String>,
    },
    /// Updated, running pods whose native sidecar still runs its old image
    /// `NATIVE_RESTART_GRACE` after the upgrade: their kubelet does not restart a native
    /// sidecar on a new image. `examples` are the first few by namespace/name.
    NativeSidecarNotRestarted { pods: usize, examples: Vec<String> },
}

/// How long after its upgrade a native sidecar may still run its old image before the pod is
/// reported ([`Stall::NativeSidecarNotRestarted`]). Kubelets that restart it do so in seconds
/// (4 s measured on 1.36.3), pulls included once the image is pre-downloaded.
pub(crate) const NATIVE_RESTART_GRACE: std::time::Duration = std::time::Duration::from_secs(300);

impl Stall {
    /// A CamelCase reason, for an event or a condition.
    pub fn reason(&self) -> &'static str {
        match self {
            Stall::NotUpdate { .. } => "NotUpdateStrategy",
            Stall::Paused { .. } => "Paused",
            Stall::InvalidStrategy(_) => "InvalidUpdateStrategy",
            // Upstream's event reason for the same finding.
            Stall::NotUpgradable {
                pods,
                resize_unserved,
                ..
            } if pods == resize_unserved => "ResizeNotServed",
            Stall::NotUpgradable { .. } => "NotUpgradablePods",
            Stall::ResizeNotApplied {
                infeasible: 1.., ..
            } => "ResizeInfeasible",
            Stall::ResizeNotApplied { .. } => "ResizeDeferred",
            Stall::PartitionReached { .. } => "PartitionReached",
            Stall::WaitingForPreDownload { .. } => "WaitingForPreDownload",
            Stall::MaxUnavailableReached { .. } => "MaxUnavailableReached",
            Stall::NativeSidecarNotRestarted { .. } => "NativeSidecarNotRestarted",
        }
    }
}

fn names(examples: &[String], total: usize) -> String {
    let more = total.saturating_sub(examples.len());
    let mut out = examples.join(", ");
    if more > 0 {
        out.push_str(&format!(" and {more} more"));
    }
    out
}

impl fmt::Display for Stall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stall::NotUpdate { waiting } => write!(
                f,
                "updateStrategy.type is NotUpdate: {waiting} pod(s) keep their old sidecars until they are recreated"
            ),
            Stall::Paused { waiting } => write!(
                f,
                "updateStrategy.paused is set: {waiting} pod(s) wait for the sidecar upgrade"
            ),
            Stall::InvalidStrategy(e) => write!(f, "{e}; no pod is upgraded until it is fixed"),
            Stall::NotUpgradable {
                pods,
                resize_unserved: 0,
                examples,
            } => write!(
                f,
                "{pods} pod(s) cannot be upgraded in place because more than the sidecar images \
                 and resources changed; recreate them to get the new sidecars: {}",
                names(examples, *pods)
            ),
            Stall::NotUpgradable {
                pods,
                resize_unserved,
                examples,
            } => write!(
                f,
                "{pods} pod(s) cannot be upgraded in place: {resize_unserved} of them because their \
                 sidecars' resources changed and the apiserver does not serve the pods/resize \
                 subresource (feature gate InPlacePodVerticalScaling, on by default from \
                 Kubernetes 1.33), the others because more than images and resources changed; \
                 recreate them to get the new sidecars: {}",
                names(examples, *pods)
            ),
            Stall::ResizeNotApplied {
                infeasible,
                deferred,
                examples,
            } => write!(
                f,
                "the kubelet has not applied the sidecars' new resources to {} pod(s) \
                 ({infeasible} infeasible on their node, {deferred} deferred until it has room); \
                 they count as unavailable: {}",
                infeasible + deferred,
                names(examples, infeasible + deferred)
            ),
            Stall::WaitingForPreDownload { pods } => write!(
                f,
                "{pods} pod(s) wait for their nodes to pull the new sidecar images (see condition ImagePreDownload)"
            ),
            Stall::PartitionReached { partition } => write!(
                f,
                "updateStrategy.partition keeps {partition} pod(s) on the old version"
            ),
            Stall::MaxUnavailableReached {
                unavailable: 0,
                max_unavailable: 0,
                ..
            } => write!(
                f,
                "updateStrategy.maxUnavailable is 0: only pods that are not ready are upgraded"
            ),
            Stall::MaxUnavailableReached {
                unavailable,
                max_unavailable,
                examples,
            } => write!(
                f,
                "{unavailable} updated pod(s) are not available yet (maxUnavailable is {max_unavailable}): {}; \
                 the upgrade continues as they become ready",
                names(examples, *unavailable)
            ),
            Stall::NativeSidecarNotRestarted { pods, examples } => write!(
                f,
                "{pods} pod(s) still run the old image of a native sidecar (init container with \
                 restartPolicy Always) {} minutes after its image was changed in place: {}; their \
                 kubelet does not restart native sidecars on a new image (kubelets with \
                 kubernetes/kubernetes#126525 do: every release from 1.33; measured on 1.36.3). \
                 Upgrade those nodes' kubelets, or delete the pods to recreate them with the new image",
                NATIVE_RESTART_GRACE.as_secs() / 60,
                names(examples, *pods)
            ),
        }
    }
}

/// The status to write, and what keeps the rollout from moving.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusReport {
    pub status: SidecarSetStatus,
    /// Empty when the rollout is complete or moving.
    pub stalls: Vec<Stall>,
}

/// Status condition: whether the rollout is held, and by what.
pub(crate) const ROLLOUT_HELD: &str = "RolloutHeld";
/// Status condition: whether every matched pod can be upgraded in place.
pub(crate) const PODS_UPGRADABLE: &str = "PodsUpgradable";
/// Status condition, present only while `True`: the SidecarSet uses features kruise-rs does
/// not serve yet.
pub(crate) const UNSUPPORTED: &str = "UnsupportedFeatures";

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// `set`'s status given its matched `pods`, the `batch` [`next_batch`](super::rollout::next_batch) chose for them, and its
/// latest ControllerRevision. Conditions whose status did not change keep their
/// `lastTransitionTime`; `now` stamps the others.
pub fn compute_status(
    set: &SidecarSet,
    pods: &[PodView],
    batch: &Batch,
    latest_revision: &str,
    collision_count: i32,
    now: &Time,
) -> StatusReport {
    let (mut matched, mut updated, mut ready, mut updated_ready) = (0, 0, 0, 0);
    for pod in pods {
        // Selection does not matter for counting: an updated pod is updated either way.
        let state = classify(pod, true);
        if state == PodState::Inactive {
            continue;
        }
        let is_updated = matches!(state, PodState::Updated { .. });
        matched += 1;
        updated += usize::from(is_updated);
        if pod.is_available() {
            ready += 1;
            updated_ready += usize::from(is_updated);
        }
    }
    let mut stalls = stalls(batch, pods);
    // The most specific reason the rollout does not finish comes first (RolloutHeld names it).
    stalls.splice(0..0, native_not_restarted(pods, now));
    let previous = set
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let conditions = conditions(&stalls, batch, previous, set.metadata.generation, now);
    let status = SidecarSetStatus {
        observed_generation: set.metadata.generation,
        matched_pods: count(matched),
        updated_pods: count(updated),
        ready_pods: count(ready),
        updated_ready_pods: count(updated_ready),
        latest_revision: Some(latest_revision.to_owned()).filter(|r| !r.is_empty()),
        collision_count: Some(collision_count),
        conditions,
    };
    StatusReport { status, stalls }
}

/// The `RolloutHeld` and `PodsUpgradable` conditions for `stalls`.
fn conditions(
    stalls: &[Stall],
    batch: &Batch,
    previous: &[Condition],
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    let condition = |type_: &str, held: bool, reason: &str, message: String| {
        let status = if held { "True" } else { "False" };
        let since = previous
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
        Condition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message,
            observed_generation: generation,
            last_transition_time: since,
        }
    };
    let hold = stalls.iter().find(|s| !is_about_pods(s));
    let held = match hold {
        Some(stall) => condition(ROLLOUT_HELD, true, stall.reason(), stall.to_string()),
        None if batch.waiting > 0 => condition(
            ROLLOUT_HELD,
            false,
            "Progressing",
            format!("{} pod(s) wait for the upgrade", batch.waiting),
        ),
        None => condition(
            ROLLOUT_HELD,
            false,
            "Updated",
            "every pod that can be upgraded in place runs the latest sidecars".to_owned(),
        ),
    };
    // The first one: pods that cannot be upgraded at all before resizes not applied yet.
    let not_upgradable = stalls.iter().find(|s| is_about_pods(s));
    let upgradable = match not_upgradable {
        // Upside down on purpose: `held` here means "some pods cannot be upgraded".
        Some(stall) => condition(PODS_UPGRADABLE, false, stall.reason(), stall.to_string()),
        None => condition(PODS_UPGRADABLE, true, "AllPodsUpgradable", String::new()),
    };
    vec![held, upgradable]
}

/// Whether `stall` is about some pods' upgrade (the `PodsUpgradable` condition) rather than
/// about what holds the rollout (`RolloutHeld`).
fn is_about_pods(stall: &Stall) -> bool {
    matches!(
        stall,
        Stall::NotUpgradable { .. } | Stall::ResizeNotApplied { .. }
    )
}

/// Updated pods whose kubelet says their resize is `Deferred` or `Infeasible`
/// ([`Stall::ResizeNotApplied`]).
pub(crate) fn resize_not_applied(pods: &[PodView]) -> Option<Stall> {
    let mut waiting: Vec<(&PodView, KubeletResize)> = pods
        .iter()
        .filter(|p| p.is_active() && p.hash_current)
        .filter_map(|p| match p.kubelet_resize {
            k @ (KubeletResize::Deferred | KubeletResize::Infeasible) => Some((p, k)),
            _ => None,
        })
        .collect();
    if waiting.is_empty() {
        return None;
    }
    // Infeasible first: those never finish by themselves.
    waiting.sort_by_key(|(p, k)| (*k != KubeletResize::Infeasible, p.key()));
    let infeasible = waiting
        .iter()
        .filter(|(_, k)| *k == KubeletResize::Infeasible)
        .count();
    let examples = waiting
        .iter()
        .take(EXAMPLES)
        .map(|(p, _)| {
            let pending = p
                .pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == POD_RESIZE_PENDING));
            let reason = pending
                .and_then(|c| c.reason.as_deref())
                .unwrap_or("Deferred");
            match pending
                .and_then(|c| c.message.as_deref())
                .filter(|m| !m.is_empty())
            {
                Some(message) => format!("{} ({reason}: {message})", p.key()),
                None => format!("{} ({reason})", p.key()),
            }
        })
        .collect();
    Some(Stall::ResizeNotApplied {
        infeasible,
        deferred: waiting.len() - infeasible,
        examples,
    })
}

/// The `UnsupportedFeatures` condition of `set`, from its spec: `None` when it uses none.
/// The reason names the features (comma-separated), the message the containers and what
/// happens to the pods it matches. Keeps the `lastTransitionTime` of a `True` condition in
/// `previous`.
pub(crate) fn unsupported_condition(
    set: &SidecarSet,
    previous: &[Condition],
    now: &Time,
) -> Option<Condition> {
    let found = unsupported::detect(&set.spec);
    if found.is_empty() {
        return None;
    }
    let reason: Vec<&str> = found.iter().map(|f| f.feature).collect();
    let what: Vec<String> = found.iter().map(ToString::to_string).collect();
    let refuse = unsupported::refuses(
        set.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(UNSUPPORTED_FEATURES))
            .map(String::as_str),
    );
    let outcome = if refuse {
        format!("pods it matches are refused ({UNSUPPORTED_FEATURES}={REFUSE})")
    } else {
        format!(
            "pods it matches are admitted without it, with a warning (annotate {UNSUPPORTED_FEATURES}={REFUSE} to refuse them)"
        )
    };
    let since = previous
        .iter()
        .find(|c| c.type_ == UNSUPPORTED && c.status == "True")
        .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
    Some(Condition {
        type_: UNSUPPORTED.to_owned(),
        status: "True".to_owned(),
        reason: reason.join(","),
        message: format!("{}; {outcome}", what.join("; ")),
        observed_generation: set.metadata.generation,
        last_transition_time: since,
    })
}

/// Updated, running pods with a native sidecar that has not run its spec image for
/// [`NATIVE_RESTART_GRACE`] since the pod's hash entry was written (the upgrade); see
/// [`Stall::NativeSidecarNotRestarted`].
pub(crate) fn native_not_restarted(pods: &[PodView], now: &Time) -> Option<Stall> {
    let grace =
        k8s_openapi::jiff::SignedDuration::try_from(NATIVE_RESTART_GRACE).unwrap_or_default();
    let mut stuck: Vec<String> = pods
        .iter()
        .filter(|p| {
            p.is_active()
                && p.phase == PodPhase::Running
                && p.hash_current
                && p.hash_written
                    .get()
                    .is_some_and(|t| now.0.duration_since(t) >= grace)
                && p.sidecars.iter().any(|s| s.native && !s.image_running)
        })
        .map(PodView::key)
        .collect();
    if stuck.is_empty() {
        return None;
    }
    stuck.sort();
    Some(Stall::NativeSidecarNotRestarted {
        pods: stuck.len(),
        examples: stuck.into_iter().take(EXAMPLES).collect(),
    })
}

/// Why `set`'s rollout over `pods` does not move; see the module documentation.
pub(crate) fn stalls(batch: &Batch, pods: &[PodView]) -> Vec<Stall> {
    let keys = |positions: &[usize]| -> Vec<String> {
        positions
            .iter()
            .take(EXAMPLES)
            .map(|&i| pods[i].key())
            .collect()
    };
    let mut out = Vec::new();
    // Nothing moving is only a stall while pods wait; a broken strategy always is (with a bad
    // selector no pod even counts as waiting).
    let stuck = batch.upgrade.is_empty() && batch.waiting > 0;
    let stall = match batch.hold.clone() {
        Some(Hold::Invalid(e)) => Some(Stall::InvalidStrategy(e)),
        _ if !stuck => None,
        Some(Hold::NotUpdate) => Some(Stall::NotUpdate {
            waiting: batch.waiting,
        }),
        Some(Hold::Paused) => Some(Stall::Paused {
            waiting: batch.waiting,
        }),
        Some(Hold::Partition { partition }) => Some(Stall::PartitionReached { partition }),
        Some(Hold::PreDownload { pods }) => Some(Stall::WaitingForPreDownload { pods }),
        Some(Hold::MaxUnavailable {
            unavailable,
            max_unavailable,
        }) => Some(Stall::MaxUnavailableReached {
            unavailable,
            max_unavailable,
            examples: keys(&batch.in_flight),
        }),
        None => None,
    };
    out.extend(stall);
    if !batch.not_upgradable.is_empty() {
        out.push(Stall::NotUpgradable {
            pods: batch.not_upgradable.len(),
            resize_unserved: batch
                .not_upgradable
                .iter()
                .filter(|&&i| pods[i].resize == InPlaceResize::Unserved)
                .count(),
            examples: keys(&batch.not_upgradable),
        });
    }
    out.extend(resize_not_applied(pods));
    out
}

#[cfg(test)]
mod tests;
