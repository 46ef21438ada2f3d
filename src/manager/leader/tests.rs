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

#[test]
fn a_free_lease_is_acquired() {
    assert_eq!(decide(&LeaseSpec::default(), ME, at(0)), Decision::Acquire);
    let released = LeaseSpec {
        holder_identity: Some(String::new()),
        ..held_by("x", 0, 15)
    };
    assert_eq!(decide(&released, ME, at(1)), Decision::Acquire);
    let cleared = LeaseSpec {
        holder_identity: None,
        ..held_by("x", 0, 15)
    };
    assert_eq!(decide(&cleared, ME, at(1)), Decision::Acquire);
}

#[test]
fn an_expired_lease_is_acquired_a_live_one_is_waited_for() {
    let lease = held_by("other", 10, 15);
    assert_eq!(
        decide(&lease, ME, at(24)),
        Decision::Wait {
            holder: "other".to_owned(),
            expires: at(25)
        }
    );
    // Expiry is strict: at exactly renewTime + duration the holder still has it.
    assert!(matches!(decide(&lease, ME, at(25)), Decision::Wait { .. }));
    assert_eq!(decide(&lease, ME, at(26)), Decision::Acquire);
}

#[test]
fn a_lease_held_by_me_is_renewed_even_when_expired() {
    assert_eq!(decide(&held_by(ME, 10, 15), ME, at(11)), Decision::Renew);
    assert_eq!(decide(&held_by(ME, 10, 15), ME, at(100)), Decision::Renew);
}

#[test]
fn odd_leases_without_times_or_durations() {
    let no_times = LeaseSpec {
        holder_identity: Some("other".to_owned()),
        ..LeaseSpec::default()
    };
    assert_eq!(decide(&no_times, ME, at(0)), Decision::Acquire);
    // Only an acquireTime: it counts as the last renewal.
    let acquired_only = LeaseSpec {
        renew_time: None,
        ..held_by("other", 0, 15)
    };
    assert!(matches!(
        decide(&acquired_only, ME, at(5)),
        Decision::Wait { .. }
    ));
    assert_eq!(decide(&acquired_only, ME, at(16)), Decision::Acquire);
    // No duration (or a negative one): expired as soon as time moves on.
    let no_duration = LeaseSpec {
        lease_duration_seconds: None,
        ..held_by("other", 0, 15)
    };
    assert_eq!(decide(&no_duration, ME, at(1)), Decision::Acquire);
    let negative = held_by("other", 0, -5);
    assert_eq!(decide(&negative, ME, at(1)), Decision::Acquire);
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
