use super::*;

const ME: &str = "me";

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).unwrap()
}

fn held_by(holder: &str, renewed: i64, duration: i32) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(holder.to_owned()),
        acquire_time: Some(MicroTime(at(0))),
        renew_time: Some(MicroTime(at(renewed))),
        lease_duration_seconds: Some(duration),
        lease_transitions: Some(3),
        ..LeaseSpec::default()
    }
}

fn cfg() -> LeaderElection {
    LeaderElection {
        identity: ME.to_owned(),
        ..LeaderElection::new("ns")
    }
}

/// This replica's own clock, `seconds` after some start.
fn mono(start: Instant, seconds: u64) -> Instant {
    start + Duration::from_secs(seconds)
}

/// What `me` decides at `now` about `lease`, first seen as it is at `seen`.
fn decide_at(lease: &LeaseSpec, seen: Instant, now: Instant) -> Decision {
    decide(&observe(None, lease, seen), ME, now)
}

#[test]
fn a_free_lease_is_acquired() {
    let t = Instant::now();
    assert_eq!(decide_at(&LeaseSpec::default(), t, t), Decision::Acquire);
    let released = LeaseSpec {
        holder_identity: Some(String::new()),
        ..held_by("x", 0, 15)
    };
    assert_eq!(decide_at(&released, t, t), Decision::Acquire);
    let cleared = LeaseSpec {
        holder_identity: None,
        ..held_by("x", 0, 15)
    };
    assert_eq!(decide_at(&cleared, t, t), Decision::Acquire);
}

#[test]
fn a_lease_expires_its_duration_after_its_record_was_seen_to_change() {
    let t = Instant::now();
    let lease = held_by("other", 10, 15);
    let seen = observe(None, &lease, mono(t, 10));
    assert_eq!(
        decide(&seen, ME, mono(t, 24)),
        Decision::Wait {
            holder: "other".to_owned(),
            expires: mono(t, 25)
        }
    );
    // Expiry is strict: at exactly the observation + duration the holder still has it.
    assert!(matches!(
        decide(&seen, ME, mono(t, 25)),
        Decision::Wait { .. }
    ));
    assert_eq!(decide(&seen, ME, mono(t, 26)), Decision::Acquire);

    // Read again unchanged, the observation keeps its start; any change restarts it.
    assert_eq!(observe(Some(seen.clone()), &lease, mono(t, 20)), seen);
    for changed in [
        held_by("other", 12, 15),
        held_by("third", 10, 15),
        LeaseSpec {
            lease_transitions: Some(4),
            ..lease.clone()
        },
    ] {
        let again = observe(Some(seen.clone()), &changed, mono(t, 20));
        assert!(
            matches!(decide(&again, ME, mono(t, 26)), Decision::Wait { .. }),
            "{changed:?}"
        );
        assert_eq!(decide(&again, ME, mono(t, 36)), Decision::Acquire);
    }
}

#[test]
fn a_lease_held_by_me_is_renewed_even_when_expired() {
    let t = Instant::now();
    assert_eq!(
        decide_at(&held_by(ME, 10, 15), t, mono(t, 1)),
        Decision::Renew
    );
    assert_eq!(
        decide_at(&held_by(ME, 10, 15), t, mono(t, 100)),
        Decision::Renew
    );
}

#[test]
fn odd_leases_without_times_or_durations() {
    let t = Instant::now();
    // The times written in the Lease play no part: without them it still runs its duration.
    let no_times = LeaseSpec {
        holder_identity: Some("other".to_owned()),
        lease_duration_seconds: Some(15),
        ..LeaseSpec::default()
    };
    assert!(matches!(
        decide_at(&no_times, t, mono(t, 5)),
        Decision::Wait { .. }
    ));
    assert_eq!(decide_at(&no_times, t, mono(t, 16)), Decision::Acquire);
    // No duration (or a negative one): expired as soon as time moves on.
    let no_duration = LeaseSpec {
        lease_duration_seconds: None,
        ..held_by("other", 0, 15)
    };
    assert_eq!(decide_at(&no_duration, t, mono(t, 1)), Decision::Acquire);
    let negative = held_by("other", 0, -5);
    assert_eq!(decide_at(&negative, t, mono(t, 1)), Decision::Acquire);
    // A duration past what the clock holds never expires, and does not panic.
    let endless = held_by("other", 0, i32::MAX);
    assert!(matches!(
        decide_at(&endless, t, mono(t, 1_000_000)),
        Decision::Wait { .. }
    ));
}

#[test]
fn acquiring_counts_a_transition_renewing_does_not() {
    let cfg = cfg();
    let taken = claimed(held_by("other", 0, 15), &cfg, at(30));
    assert_eq!(taken.holder_identity.as_deref(), Some(ME));
    assert_eq!(taken.acquire_time, Some(MicroTime(at(30))));
    assert_eq!(taken.renew_time, Some(MicroTime(at(30))));
    assert_eq!(taken.lease_transitions, Some(4));
    assert_eq!(taken.lease_duration_seconds, Some(15));

    let renewed = claimed(taken.clone(), &cfg, at(32));
    assert_eq!(renewed.acquire_time, Some(MicroTime(at(30))));
    assert_eq!(renewed.renew_time, Some(MicroTime(at(32))));
    assert_eq!(renewed.lease_transitions, Some(4));

    let first = claimed(LeaseSpec::default(), &cfg, at(0));
    assert_eq!(first.lease_transitions, Some(0));
}

#[test]
fn lease_duration_rounds_up_to_whole_seconds() {
    let mut cfg = cfg();
    cfg.lease_duration = Duration::from_millis(2500);
    assert_eq!(cfg.lease_duration_seconds(), 3);
    cfg.lease_duration = Duration::from_millis(10);
    assert_eq!(cfg.lease_duration_seconds(), 1);
    cfg.lease_duration = Duration::from_secs(15);
    assert_eq!(cfg.lease_duration_seconds(), 15);
}

#[test]
fn settings_must_nest() {
    assert_eq!(cfg().check(), Ok(()));
    let mut bad = cfg();
    bad.renew_deadline = bad.lease_duration;
    assert!(bad.check().unwrap_err().contains("lease duration"));
    let mut bad = cfg();
    bad.retry_period = bad.renew_deadline;
    assert!(bad.check().unwrap_err().contains("renew deadline"));
    let mut bad = cfg();
    bad.identity.clear();
    assert!(bad.check().is_err());
}

/// Runs [`elect_with`] on a paused clock with `script` answering the attempts in turn
/// (`None`: the apiserver never answers); returns when it stood as leader, and when it
/// stopped, relative to the start, and whether it released the Lease.
async fn elect_script(
    script: Vec<Option<Result<Standing, u16>>>,
    run_for: Duration,
) -> (Vec<(Duration, bool)>, bool) {
    let cfg = LeaderElection {
        lease_duration: Duration::from_secs(15),
        // Not a multiple of the retry period: the deadline falls between two retries.
        renew_deadline: Duration::from_secs(9),
        retry_period: Duration::from_secs(2),
        ..cfg()
    };
    let start = Instant::now();
    let mut script = script.into_iter();
    let (leading_tx, mut leading) = watch::channel(false);
    let (release_tx, release_rx) = oneshot::channel();
    let released = std::sync::atomic::AtomicBool::new(false);
    let attempt = || {
        let next = script.next().unwrap_or(None);
        async move {
            match next {
                Some(Ok(standing)) => Ok(standing),
                Some(Err(code)) => Err(kube::Error::Api(
                    kube::core::Status::failure("injected", "Injected")
                        .with_code(code)
                        .boxed(),
                )),
                None => std::future::pending().await,
            }
        }
    };
    let release = || async {
        released.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(true)
    };
    let elector = elect_with(&cfg, attempt, release, leading_tx, release_rx);
    let watcher = async {
        let mut changes = vec![];
        loop {
            tokio::select! {
                changed = leading.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    changes.push((start.elapsed(), *leading.borrow_and_update()));
                }
                () = tokio::time::sleep_until(start + run_for) => {
                    let _ = release_tx.send(());
                    break;
                }
            }
        }
        changes
    };
    let ((), changes) = tokio::join!(elector, watcher);
    (changes, released.into_inner())
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_cannot_renew_stops_at_its_renew_deadline() {
    // Acquired at 0 and renewed at 2; from 4 on every renewal fails at once (500s): the
    // leader gives up at 2 + 9 = 11, not at its next retry (12), and before the lease (15 s
    // from 2) could pass to another.
    let (changes, released) = elect_script(
        vec![
            Some(Ok(Standing::Leading)),
            Some(Ok(Standing::Leading)),
            Some(Err(500)),
            Some(Err(500)),
            Some(Err(500)),
            Some(Err(500)),
            Some(Err(500)),
            Some(Err(500)),
        ],
        secs(13),
    )
    .await;
    let leading: Vec<_> = changes.iter().filter(|(_, l)| *l).collect();
    assert_eq!(leading.first().map(|c| c.0), Some(Duration::ZERO));
    let lost = changes.iter().find(|(_, l)| !*l).expect("leadership lost");
    assert_eq!(lost.0, secs(11), "{changes:?}");
    assert!(
        !released,
        "a replica that lost the lease has nothing to release"
    );
}

#[tokio::test(start_paused = true)]
async fn a_leader_whose_renewal_hangs_stops_at_its_renew_deadline() {
    // Renewed at 2, then the apiserver stops answering.
    let (changes, _) = elect_script(
        vec![Some(Ok(Standing::Leading)), Some(Ok(Standing::Leading))],
        secs(20),
    )
    .await;
    let lost = changes.iter().find(|(_, l)| !*l).expect("leadership lost");
    assert_eq!(lost.0, secs(11), "{changes:?}");
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_finds_another_holder_stops_at_once_and_releases_only_when_leading() {
    let (changes, released) = elect_script(
        vec![
            Some(Ok(Standing::Leading)),
            Some(Ok(Standing::Following(Some("other".to_owned())))),
            Some(Ok(Standing::Following(Some("other".to_owned())))),
        ],
        secs(5),
    )
    .await;
    let lost = changes.iter().find(|(_, l)| !*l).expect("leadership lost");
    assert_eq!(lost.0, secs(2), "{changes:?}");
    assert!(!released);

    let (_, released) = elect_script(
        vec![
            Some(Ok(Standing::Leading)),
            Some(Ok(Standing::Leading)),
            Some(Ok(Standing::Leading)),
        ],
        secs(5),
    )
    .await;
    assert!(released, "a leader releases the lease when told to stop");
}

#[tokio::test]
async fn the_standing_is_reported_until_the_election_ends() {
    let (tx, rx) = watch::channel(false);
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let reporter = tokio::spawn(report_standing(rx, move |l| {
        let _ = seen_tx.send(l);
    }));
    assert_eq!(seen.recv().await, Some(false));
    tx.send_replace(true);
    assert_eq!(seen.recv().await, Some(true));
    tx.send_replace(false);
    assert_eq!(seen.recv().await, Some(false));
    tx.send_replace(true);
    assert_eq!(seen.recv().await, Some(true));
    drop(tx);
    assert_eq!(
        seen.recv().await,
        Some(false),
        "the end reads as not leading"
    );
    assert_eq!(seen.recv().await, None);
    reporter.await.unwrap();
}

#[test]
fn default_identity_is_never_empty() {
    assert!(!default_identity().is_empty());
}

/// A holder that renews every `renew_every_ms` (on its own clock) until `stops_at_ms`, watched
/// by a follower that polls every 2 s and whose wall clock reads `skew_ms` more than the
/// holder's (so the holder's `renewTime`s look `skew_ms` older to it). Returns when (ms after
/// the start, on the follower's own clock) the follower first decided to take the Lease, if it
/// did within `run_for_ms`.
fn takeover_after(
    skew_ms: i64,
    renew_every_ms: i64,
    stops_at_ms: i64,
    run_for_ms: i64,
) -> Option<i64> {
    let base = 1_800_000_000_000i64;
    let wall = |ms: i64| Timestamp::from_millisecond(base + ms).unwrap();
    let lease_at = |t: i64| {
        let last = (t.min(stops_at_ms) / renew_every_ms) * renew_every_ms;
        LeaseSpec {
            holder_identity: Some("other".to_owned()),
            acquire_time: Some(MicroTime(wall(-skew_ms))),
            renew_time: Some(MicroTime(wall(last - skew_ms))),
            lease_duration_seconds: Some(15),
            lease_transitions: Some(3),
            ..LeaseSpec::default()
        }
    };
    let start = Instant::now();
    let mut observed = None;
    (1..)
        .map(|n| n * 2000)
        .take_while(|t| *t <= run_for_ms)
        .find(|t| {
            let now = start + Duration::from_millis(u64::try_from(*t).unwrap());
            let seen = observe(observed.take(), &lease_at(*t), now);
            let decision = decide(&seen, ME, now);
            observed = Some(seen);
            decision == Decision::Acquire
        })
}

#[test]
fn a_follower_whose_clock_runs_ahead_does_not_take_a_live_lease() {
    // The holder renews every 3.5 s (a slow apiserver; well within its 10 s renew deadline).
    for skew in [-13_000, 0, 13_000] {
        assert_eq!(
            takeover_after(skew, 3_500, i64::MAX, 120_000),
            None,
            "skew {skew} ms"
        );
    }
}

#[test]
fn a_follower_takes_a_lease_its_lease_duration_after_the_renewals_stop_whatever_its_clock() {
    // The last renewal is at 28 s, seen at the poll at 28 s; 15 s later the Lease has expired
    // for the follower, which takes it at its next poll (44 s), whichever way its clock is off.
    for skew in [-13_000, 0, 13_000] {
        let at = takeover_after(skew, 3_500, 30_000, 120_000);
        assert!(
            at.is_some_and(|at| (43_000..=46_000).contains(&at)),
            "skew {skew} ms: took over at {at:?} ms"
        );
    }
}

/// The chaos run's apiserver restarts logged "the manager needs get, create and update on
/// leases" for every refused connection: only a refusal names the permissions.
#[test]
fn only_a_refusal_blames_the_leases_permissions() {
    let api = |code: u16| {
        kube::Error::Api(
            kube::core::Status::failure("refused", "Test")
                .with_code(code)
                .boxed(),
        )
    };
    for code in [401, 403] {
        assert!(lease_error_hint(&api(code)).contains("needs get, create and update"));
    }
    let unreachable = kube::Error::Service("client error (Connect)".into());
    for err in [unreachable, api(503), api(429)] {
        let hint = lease_error_hint(&err);
        assert!(
            !hint.contains("needs") && hint.contains("did not answer"),
            "{err}: {hint}"
        );
    }
    assert_eq!(lease_error_hint(&api(404)), "asking again");
}
