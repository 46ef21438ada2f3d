use super::*;
use kruise_rs_api::imagepulljob::{CompletionPolicy, ImagePullJobSpec, ImagePullJobTemplate};

fn t(seconds: i64) -> Time {
    Time(Timestamp::from_second(seconds).unwrap())
}

fn job(policy: CompletionPolicy, status: Option<ImagePullJobStatus>) -> ImagePullJob {
    let mut j = ImagePullJob::new(
        "j",
        ImagePullJobSpec {
            image: "nginx".into(),
            template: ImagePullJobTemplate {
                completion_policy: policy,
                ..Default::default()
            },
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
            progress: None,
        })
        .collect()
}

use NodeState::*;

#[test]
fn parallelism_defaults_to_one_and_takes_numeric_strings() {
    let mut j = job(Default::default(), None);
    assert_eq!(parallelism(&j), Ok(1));
    j.spec.template.parallelism = Some(IntOrString::Int(0));
    assert_eq!(parallelism(&j), Ok(0));
    j.spec.template.parallelism = Some(IntOrString::String("7".into()));
    assert_eq!(parallelism(&j), Ok(7));
    j.spec.template.parallelism = Some(IntOrString::String("50%".into()));
    assert!(parallelism(&j).unwrap_err().contains("50%"));
    j.spec.template.parallelism = Some(IntOrString::Int(-1));
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
fn an_always_job_with_no_node_completes_after_the_grace_not_at_first_look() {
    let first = compute_status(&job(Default::default(), None), &[], &t(5));
    assert_eq!((first.desired, &first.completion_time), (0, &None));
    assert_eq!(first.start_time, Some(t(5)));
    let looked = job(Default::default(), Some(first.clone()));
    assert_eq!(
        next_deadline(&looked, &first),
        Some(t(10).0),
        "woken when the grace ends"
    );
    let s = compute_status(&looked, &[], &t(9));
    assert_eq!(s.completion_time, None, "1 s before the grace ends");
    let s = compute_status(&looked, &[], &t(10));
    assert_eq!((s.desired, s.completion_time), (0, Some(t(10))));
    assert_eq!(s.message.as_deref(), Some("job has completed"));
    // A node seen within the grace: the job runs on it.
    let s = compute_status(&looked, &targets(&[("late", NotSynced)]), &t(7));
    assert_eq!((s.desired, s.completion_time), (1, None));
    // A Never job is not woken for the grace; an earlier active deadline comes first.
    let never = CompletionPolicy {
        type_: Some(CompletionPolicyType::Never),
        ..Default::default()
    };
    let s = compute_status(&job(never.clone(), None), &[], &t(5));
    assert_eq!(next_deadline(&job(never, None), &s), None);
    let short = CompletionPolicy {
        active_deadline_seconds: Some(2),
        ..Default::default()
    };
    assert_eq!(next_deadline(&job(short, None), &first), Some(t(7).0));
}

#[test]
fn a_job_that_ran_long_completes_at_once_when_its_last_node_goes() {
    let started = ImagePullJobStatus {
        start_time: Some(t(100)),
        desired: 1,
        active: 1,
        ..Default::default()
    };
    let s = compute_status(&job(Default::default(), Some(started)), &[], &t(200));
    assert_eq!((s.desired, s.completion_time), (0, Some(t(200))));
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

#[test]
fn notes_follow_the_progress_message_once() {
    let j = job(Default::default(), None);
    let s = compute_status(&j, &targets(&[("a", Pulling), ("b", Succeeded)]), &t(10));
    let notes = [
        "Secret x has type Opaque".to_owned(),
        "Secret y not found".to_owned(),
    ];
    let noted = with_notes(s.clone(), &notes);
    assert_eq!(
        noted.message.as_deref(),
        Some("job is running, progress 50.0%; Secret x has type Opaque; Secret y not found")
    );
    assert_eq!(with_notes(noted.clone(), &notes), noted, "not added twice");
    assert_eq!(with_notes(s.clone(), &[]), s, "no notes, no change");
    let bare = ImagePullJobStatus::default();
    assert_eq!(
        with_notes(bare, &notes[..1]).message.as_deref(),
        Some("Secret x has type Opaque")
    );
}

/// A job stored while the webhook and the schema bounds were off: the extremes of each number
/// neither panic nor invent a deadline.
#[test]
fn extreme_stored_deadlines_and_ttls_do_not_panic() {
    let ts = targets(&[("a", Pulling)]);
    for deadline in [i64::MAX, i64::MIN, 0] {
        let policy = CompletionPolicy {
            active_deadline_seconds: Some(deadline),
            ..Default::default()
        };
        let started = ImagePullJobStatus {
            start_time: Some(t(100)),
            ..Default::default()
        };
        let j = job(policy, Some(started));
        let status = compute_status(&j, &ts, &t(200));
        let _ = next_deadline(&j, &status);
    }
    // i64::MAX seconds is past any timestamp: the job runs on, with nothing to wake for.
    let policy = CompletionPolicy {
        active_deadline_seconds: Some(i64::MAX),
        ..Default::default()
    };
    let running = compute_status(&job(policy.clone(), None), &ts, &t(200));
    assert_eq!(running.completion_time, None);
    assert_eq!(next_deadline(&job(policy, None), &running), None);
    for ttl in [i32::MAX, i32::MIN] {
        let policy = CompletionPolicy {
            ttl_seconds_after_finished: Some(ttl),
            ..Default::default()
        };
        let done = ImagePullJobStatus {
            completion_time: Some(t(10)),
            ..Default::default()
        };
        let at = next_deadline(&job(policy, Some(done.clone())), &done);
        assert!(at.is_some(), "{ttl}");
    }
}

fn pulling(node: &str, percent: i32, started: i64) -> Target {
    Target {
        node: node.into(),
        state: Pulling,
        progress: Some(super::super::targets::NodeProgress {
            percent,
            started: Timestamp::from_second(started).unwrap(),
        }),
    }
}

#[test]
fn the_time_left_follows_the_pace_so_far() {
    let secs = SignedDuration::from_secs;
    assert_eq!(time_left(25, secs(10)), Some(secs(30)));
    assert_eq!(time_left(50, secs(10)), Some(secs(10)));
    assert_eq!(time_left(99, secs(99)), Some(secs(1)));
    assert_eq!(time_left(0, secs(10)), None, "no pace yet");
    assert_eq!(time_left(100, secs(10)), None, "done");
    assert_eq!(time_left(-3, secs(10)), None);
    assert_eq!(
        time_left(50, secs(-10)),
        None,
        "a clock behind the daemon's"
    );
}

#[test]
fn durations_read_coarser_as_they_grow() {
    let secs = SignedDuration::from_secs;
    assert_eq!(human_duration(secs(0)), "0s");
    assert_eq!(human_duration(secs(47)), "45s");
    assert_eq!(human_duration(secs(80)), "1m20s");
    assert_eq!(human_duration(secs(125)), "2m");
    assert_eq!(human_duration(secs(725)), "12m");
    assert_eq!(human_duration(secs(11_100)), "3h5m");
    assert_eq!(human_duration(secs(-5)), "0s");
}

#[test]
fn the_progress_names_the_node_expected_to_finish_last() {
    // At 100 s: a at 50% since 0 (100 s left), b at 80% since 60 (10 s), c at 10% since 90 (90 s).
    let ts = vec![
        pulling("a", 50, 0),
        pulling("b", 80, 60),
        pulling("c", 10, 90),
        Target {
            node: "d".into(),
            state: Succeeded,
            progress: None,
        },
    ];
    let s = compute_status(&job(Default::default(), None), &ts, &t(100));
    assert_eq!(s.progress.as_deref(), Some("50% on a, about 1m40s left"));
    assert_eq!(
        s.message.as_deref(),
        Some("job is running, progress 25.0%; slowest: 50% on a, about 1m40s left")
    );
}

#[test]
fn a_node_without_a_pace_is_named_only_when_no_other_has_one() {
    let ts = vec![pulling("a", 0, 0), pulling("b", 90, 0)];
    let s = compute_status(&job(Default::default(), None), &ts, &t(90));
    assert_eq!(s.progress.as_deref(), Some("90% on b, about 10s left"));
    let s = compute_status(
        &job(Default::default(), None),
        &[pulling("a", 0, 0)],
        &t(90),
    );
    assert_eq!(s.progress.as_deref(), Some("0% on a"));
}

#[test]
fn no_progress_without_reports_nor_once_complete() {
    let ts = targets(&[("a", Pulling), ("b", Succeeded)]);
    let s = compute_status(&job(Default::default(), None), &ts, &t(10));
    assert_eq!(s.progress, None);
    assert_eq!(s.message.as_deref(), Some("job is running, progress 50.0%"));
    let done = targets(&[("a", Succeeded)]);
    let s = compute_status(&job(Default::default(), None), &done, &t(10));
    assert_eq!(s.progress, None);
}
