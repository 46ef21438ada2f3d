//! A job's status from where its nodes stand, which nodes to start next, and when the job next
//! needs attention. Pure functions of (job, targets, now).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::targets::{NodeState, Target};
use kruise_rs_api::imagepulljob::{CompletionPolicyType, ImagePullJob, ImagePullJobStatus};

/// How many nodes may pull at once: `spec.parallelism` as an integer (a numeric string is
/// accepted, as upstream does), default 1. `Err` quotes a value that is neither.
pub(crate) fn parallelism(job: &ImagePullJob) -> Result<usize, String> {
    match &job.spec.template.parallelism {
        None => Ok(1),
        Some(IntOrString::Int(n)) if *n >= 0 => Ok(*n as usize),
        Some(IntOrString::String(s)) => s
            .trim()
            .parse::<usize>()
            .map_err(|_| format!("spec.parallelism {s:?} is not a non-negative integer")),
        Some(IntOrString::Int(n)) => Err(format!("spec.parallelism {n} is negative")),
    }
}

/// The not-yet-synced nodes to write now, in target order: at most `parallelism` nodes pull at
/// once, counting the ones already pulling.
pub(crate) fn nodes_to_start(targets: &[Target], parallelism: usize) -> Vec<&str> {
    let pulling = targets
        .iter()
        .filter(|t| t.state == NodeState::Pulling)
        .count();
    let budget = parallelism.saturating_sub(pulling);
    targets
        .iter()
        .filter(|t| t.state == NodeState::NotSynced)
        .take(budget)
        .map(|t| t.node.as_str())
        .collect()
}

/// How long an `Always` job that finds no target node keeps looking before it completes with
/// none. The job and its nodes' NodeImages (or its pods) come through separate watches, which
/// the apiserver serves independently: a job created just after its nodes' NodeImages can reach
/// the manager before they do, and a job completed on that first look stays completed (node
/// events wake running jobs only). Upstream completes at once and has the same race; our
/// integration suite lost a job to it about once in three runs at 12 tests at a time
/// (docs/decisions/0048-*).
pub(crate) const NO_TARGET_GRACE: SignedDuration = SignedDuration::from_secs(5);

fn never(job: &ImagePullJob) -> bool {
    job.spec
        .template
        .completion_policy
        .type_
        .unwrap_or_default()
        == CompletionPolicyType::Never
}

fn deadline(job: &ImagePullJob, start: &Time) -> Option<Timestamp> {
    let policy = &job.spec.template.completion_policy;
    if never(job) {
        return None;
    }
    let seconds = policy.active_deadline_seconds?;
    start.0.checked_add(SignedDuration::from_secs(seconds)).ok()
}

/// The time a pull that began `elapsed` ago and got `percent` far has left, at the pace it went
/// so far; `None` before it got anywhere (no pace yet). What `status.progress` estimates.
pub fn time_left(percent: i32, elapsed: SignedDuration) -> Option<SignedDuration> {
    if !(1..100).contains(&percent) || elapsed.is_negative() {
        return None;
    }
    let left = elapsed.as_secs_f64() * f64::from(100 - percent) / f64::from(percent);
    SignedDuration::try_from_secs_f64(left).ok()
}

/// `d` for people, coarser as it grows, so that the status changes only when it says more:
/// `45s` (to 5 s), `1m20s` (to 10 s), `12m` (to the minute), `3h5m`.
pub(crate) fn human_duration(d: SignedDuration) -> String {
    let s = d.as_secs().max(0);
    match s {
        0..60 => format!("{}s", s / 5 * 5),
        60..600 => {
            let s = s / 10 * 10;
            if s % 60 == 0 {
                format!("{}m", s / 60)
            } else {
                format!("{}m{}s", s / 60, s % 60)
            }
        }
        600..3600 => format!("{}m", s / 60),
        _ => format!("{}h{}m", s / 3600, s % 3600 / 60),
    }
}

/// The pulling target expected to finish last, as `status.progress` says it: the one with the
/// most time left; a node without a pace yet (0%) only when no other has one.
fn slowest(targets: &[Target], now: Timestamp) -> Option<String> {
    let pulling = targets.iter().filter(|t| t.state == NodeState::Pulling);
    let estimates = pulling.filter_map(|t| {
        let progress = t.progress.as_ref()?;
        let left = time_left(progress.percent, now.duration_since(progress.started));
        Some((left, progress.percent, t.node.as_str()))
    });
    // Any estimate outranks none; then the longer wait, the lower percentage, the first name.
    let (left, percent, node) = estimates.max_by(|a, b| {
        (a.0.is_some(), a.0, std::cmp::Reverse(a.1))
            .cmp(&(b.0.is_some(), b.0, std::cmp::Reverse(b.1)))
            .then_with(|| b.2.cmp(a.2))
    })?;
    Some(match left {
        Some(left) => format!("{percent}% on {node}, about {} left", human_duration(left)),
        None => format!("{percent}% on {node}"),
    })
}

/// The job's status given where its targets stand now. A finished job's status does not change.
pub(super) fn compute_status(
    job: &ImagePullJob,
    targets: &[Target],
    now: &Time,
) -> ImagePullJobStatus {
    let old = job.status.clone().unwrap_or_default();
    if old.completion_time.is_some() {
        return old;
    }
    let start = old.start_time.clone().unwrap_or_else(|| now.clone());
    let count = |state| targets.iter().filter(|t| t.state == state).count() as i32;
    let desired = targets.len() as i32;
    let succeeded = count(NodeState::Succeeded);
    let failed_nodes = |pred: &dyn Fn(NodeState) -> bool| {
        let mut nodes: Vec<String> = targets
            .iter()
            .filter(|t| pred(t.state))
            .map(|t| t.node.clone())
            .collect();
        nodes.sort();
        nodes
    };
    let finished = succeeded + count(NodeState::Failed) == desired;

    if !finished && deadline(job, &start).is_some_and(|d| now.0 >= d) {
        let failed = failed_nodes(&|s| s != NodeState::Succeeded);
        return ImagePullJobStatus {
            start_time: Some(start),
            completion_time: Some(now.clone()),
            desired,
            active: 0,
            succeeded,
            failed: failed.len() as i32,
            message: Some("job exceeds activeDeadlineSeconds".into()),
            failed_nodes: failed,
            progress: None,
        };
    }

    // With no target, finished only once the grace has passed since the first look.
    let looked_long_enough = desired > 0 || now.0.duration_since(start.0) >= NO_TARGET_GRACE;
    let complete = !never(job) && finished && looked_long_enough;
    let message = if complete {
        "job has completed".to_owned()
    } else if desired == 0 {
        "job is running, no progress".to_owned()
    } else {
        let done = f64::from(succeeded + count(NodeState::Failed)) / f64::from(desired);
        format!("job is running, progress {:.1}%", done * 100.0)
    };
    let failed = failed_nodes(&|s| s == NodeState::Failed);
    let progress = (!complete).then(|| slowest(targets, now.0)).flatten();
    let message = match &progress {
        Some(slowest) => format!("{message}; slowest: {slowest}"),
        None => message,
    };
    ImagePullJobStatus {
        start_time: Some(start),
        completion_time: complete.then(|| now.clone()),
        desired,
        active: count(NodeState::Pulling),
        succeeded,
        failed: failed.len() as i32,
        message: Some(message),
        failed_nodes: failed,
        progress,
    }
}

/// `status` with `notes` (what the reconcile could not do: a pull secret left out) after its
/// message, so the status says why pulls may fail. A note already there is not added again: a
/// finished job's status is kept as it was written, notes included.
pub(crate) fn with_notes(mut status: ImagePullJobStatus, notes: &[String]) -> ImagePullJobStatus {
    for note in notes {
        let message = status.message.get_or_insert_with(String::new);
        if message.contains(note.as_str()) {
            continue;
        }
        if !message.is_empty() {
            message.push_str("; ");
        }
        message.push_str(note);
    }
    status
}

/// When a job needs attention with nothing else happening: at its active deadline while it runs
/// (and at the end of [`NO_TARGET_GRACE`] while it has no target), at its TTL expiry once it
/// finished. `None` when only a change can move it.
pub(crate) fn next_deadline(job: &ImagePullJob, status: &ImagePullJobStatus) -> Option<Timestamp> {
    match &status.completion_time {
        Some(done) => {
            let ttl = job
                .spec
                .template
                .completion_policy
                .ttl_seconds_after_finished?;
            done.0
                .checked_add(SignedDuration::from_secs(i64::from(ttl)))
                .ok()
        }
        None => {
            let start = status.start_time.as_ref()?;
            let grace_ends = (status.desired == 0 && !never(job))
                .then(|| start.0.checked_add(NO_TARGET_GRACE).ok())
                .flatten();
            [deadline(job, start), grace_ends]
                .into_iter()
                .flatten()
                .min()
        }
    }
}

#[cfg(test)]
mod tests;
