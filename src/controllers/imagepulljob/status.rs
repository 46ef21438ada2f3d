//! A job's status from where its nodes stand, which nodes to start next, and when the job next
//! needs attention. Pure functions of (job, targets, now).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::targets::{NodeState, Target};
use crate::apis::imagepulljob::{CompletionPolicyType, ImagePullJob, ImagePullJobStatus};

/// How many nodes may pull at once: `spec.parallelism` as an integer (a numeric string is
/// accepted, as upstream does), default 1. `Err` quotes a value that is neither.
pub fn parallelism(job: &ImagePullJob) -> Result<usize, String> {
    match &job.spec.parallelism {
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
pub fn nodes_to_start(targets: &[Target], parallelism: usize) -> Vec<&str> {
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

fn deadline(job: &ImagePullJob, start: &Time) -> Option<Timestamp> {
    let policy = &job.spec.completion_policy;
    if policy.type_.unwrap_or_default() == CompletionPolicyType::Never {
        return None;
    }
    let seconds = policy.active_deadline_seconds?;
    start.0.checked_add(SignedDuration::from_secs(seconds)).ok()
}

/// The job's status given where its targets stand now. A finished job's status does not change.
pub fn compute_status(job: &ImagePullJob, targets: &[Target], now: &Time) -> ImagePullJobStatus {
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
        };
    }

    let never = job.spec.completion_policy.type_.unwrap_or_default() == CompletionPolicyType::Never;
    let complete = !never && finished;
    let message = if complete {
        "job has completed".to_owned()
    } else if desired == 0 {
        "job is running, no progress".to_owned()
    } else {
        let done = f64::from(succeeded + count(NodeState::Failed)) / f64::from(desired);
        format!("job is running, progress {:.1}%", done * 100.0)
    };
    let failed = failed_nodes(&|s| s == NodeState::Failed);
    ImagePullJobStatus {
        start_time: Some(start),
        completion_time: complete.then(|| now.clone()),
        desired,
        active: count(NodeState::Pulling),
        succeeded,
        failed: failed.len() as i32,
        message: Some(message),
        failed_nodes: failed,
    }
}

/// When a job needs attention with nothing else happening: at its active deadline while it runs,
/// at its TTL expiry once it finished. `None` when only a change can move it.
pub fn next_deadline(job: &ImagePullJob, status: &ImagePullJobStatus) -> Option<Timestamp> {
    match &status.completion_time {
        Some(done) => {
            let ttl = job.spec.completion_policy.ttl_seconds_after_finished?;
            done.0
                .checked_add(SignedDuration::from_secs(i64::from(ttl)))
                .ok()
        }
        None => deadline(job, status.start_time.as_ref()?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::imagepulljob::{CompletionPolicy, ImagePullJobSpec};

    fn t(seconds: i64) -> Time {
        Time(Timestamp::from_second(seconds).unwrap())
    }

    fn job(policy: CompletionPolicy, status: Option<ImagePullJobStatus>) -> ImagePullJob {
        let mut j = ImagePullJob::new(
            "j",
            ImagePullJobSpec {
                image: "nginx".into(),
                completion_policy: policy,
                ..Default::default()
            },
        );
        j.status = status;
        j
    }

    fn targets(states: &[(&str, NodeState)]) -> Vec<Target> {
        states
            .iter()
            .map(|(n, s)| Target {
                node: (*n).into(),
                state: *s,
            })
            .collect()
    }

    use NodeState::*;

    #[test]
    fn parallelism_defaults_to_one_and_takes_numeric_strings() {
        let mut j = job(Default::default(), None);
        assert_eq!(parallelism(&j), Ok(1));
        j.spec.parallelism = Some(IntOrString::Int(0));
        assert_eq!(parallelism(&j), Ok(0));
        j.spec.parallelism = Some(IntOrString::String("7".into()));
        assert_eq!(parallelism(&j), Ok(7));
        j.spec.parallelism = Some(IntOrString::String("50%".into()));
        assert!(parallelism(&j).unwrap_err().contains("50%"));
        j.spec.parallelism = Some(IntOrString::Int(-1));
        assert!(parallelism(&j).is_err());
    }

    #[test]
    fn never_more_nodes_pulling_than_parallelism_in_target_order() {
        let ts = targets(&[
            ("a", Succeeded),
            ("b", Pulling),
            ("c", NotSynced),
            ("d", NotSynced),
            ("e", NotSynced),
        ]);
        assert_eq!(nodes_to_start(&ts, 3), ["c", "d"]);
        assert_eq!(nodes_to_start(&ts, 1), Vec::<&str>::new());
        assert_eq!(nodes_to_start(&ts, 0), Vec::<&str>::new(), "0 pauses");
        assert_eq!(nodes_to_start(&ts, 100), ["c", "d", "e"]);
    }

    #[test]
    fn running_status_counts_and_reports_progress() {
        let j = job(Default::default(), None);
        let s = compute_status(
            &j,
            &targets(&[
                ("a", Succeeded),
                ("c", Failed),
                ("b", Pulling),
                ("d", NotSynced),
            ]),
            &t(100),
        );
        assert_eq!((s.desired, s.active, s.succeeded, s.failed), (4, 1, 1, 1));
        assert_eq!(s.failed_nodes, ["c"]);
        assert_eq!(s.start_time, Some(t(100)));
        assert_eq!(s.completion_time, None);
        assert_eq!(s.message.as_deref(), Some("job is running, progress 50.0%"));
    }

    #[test]
    fn always_completes_when_every_node_finished_never_does_not() {
        let ts = targets(&[("a", Succeeded), ("b", Failed)]);
        let s = compute_status(&job(Default::default(), None), &ts, &t(5));
        assert_eq!(s.completion_time, Some(t(5)));
        assert_eq!(s.message.as_deref(), Some("job has completed"));
        let never = CompletionPolicy {
            type_: Some(CompletionPolicyType::Never),
            ..Default::default()
        };
        let s = compute_status(&job(never, None), &ts, &t(5));
        assert_eq!(s.completion_time, None);
    }

    #[test]
    fn no_nodes_completes_an_always_job_as_upstream_does() {
        let s = compute_status(&job(Default::default(), None), &[], &t(5));
        assert_eq!((s.desired, s.completion_time), (0, Some(t(5))));
    }

    #[test]
    fn the_active_deadline_fails_every_unfinished_node() {
        let policy = CompletionPolicy {
            active_deadline_seconds: Some(60),
            ..Default::default()
        };
        let started = ImagePullJobStatus {
            start_time: Some(t(100)),
            ..Default::default()
        };
        let j = job(policy, Some(started));
        let ts = targets(&[("a", Succeeded), ("b", Pulling), ("c", NotSynced)]);
        let before = compute_status(&j, &ts, &t(159));
        assert_eq!(before.completion_time, None);
        assert_eq!(next_deadline(&j, &before), Some(t(160).0));
        let after = compute_status(&j, &ts, &t(160));
        assert_eq!(after.completion_time, Some(t(160)));
        assert_eq!((after.succeeded, after.failed, after.active), (1, 2, 0));
        assert_eq!(after.failed_nodes, ["b", "c"]);
        assert_eq!(
            after.message.as_deref(),
            Some("job exceeds activeDeadlineSeconds")
        );
    }

    #[test]
    fn a_finished_job_keeps_its_status_and_wakes_at_its_ttl() {
        let policy = CompletionPolicy {
            ttl_seconds_after_finished: Some(30),
            ..Default::default()
        };
        let done = ImagePullJobStatus {
            start_time: Some(t(1)),
            completion_time: Some(t(10)),
            desired: 2,
            succeeded: 2,
            ..Default::default()
        };
        let j = job(policy, Some(done.clone()));
        assert_eq!(
            compute_status(&j, &targets(&[("a", Pulling)]), &t(20)),
            done
        );
        assert_eq!(next_deadline(&j, &done), Some(t(40).0));
        let no_ttl = job(Default::default(), Some(done.clone()));
        assert_eq!(next_deadline(&no_ttl, &done), None);
    }
}
