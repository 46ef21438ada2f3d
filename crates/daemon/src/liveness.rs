//! When the daemon asks to be restarted: its container runtime has not answered for
//! `--cri-liveness-timeout`.
//!
//! The chart mounts only the runtime's socket file into the daemon's container. A bind mount of a
//! file keeps the inode it was made with, and a runtime that restarts unlinks its socket and binds
//! a new one: the daemon's path then leads to the old inode and every connection is refused until
//! the container is created again with a fresh mount
//! ([decision 0010](../../docs/decisions/0010-daemon-mounts-only-its-cri-socket.md)). A refusal
//! through such a mount makes the daemon exit at once (`stale_socket`); what a refusal cannot tell,
//! a runtime that hangs, is left to this rule: `/healthz` fails once the runtime has been silent
//! for the limit, counted from the first check (every 5 s) that got no answer, and the kubelet's
//! liveness probe restarts the container. A runtime that
//! is really down costs nothing more: the kubelet cannot start the new container before the
//! runtime is back, and then it mounts the new socket.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// `--cri-liveness-timeout`'s default: a runtime restart takes seconds, and a false restart of the
/// daemon only costs its pulls in flight (a restarted daemon resumes them from the status).
pub const DEFAULT_CRI_LIVENESS_TIMEOUT: Duration = Duration::from_secs(60);

/// Whether the daemon is live at `now`: `Err(silent_for)` once the runtime has failed to answer
/// for longer than `limit`, counted from `silent_since`, the first check that failed since it last
/// answered (the daemon's start, until it first answers); `None` (live) while it answers.
pub(crate) fn runtime_liveness(
    silent_since: Option<Instant>,
    now: Instant,
    limit: Duration,
) -> Result<(), Duration> {
    let Some(since) = silent_since else {
        return Ok(());
    };
    let silent_for = now.saturating_duration_since(since);
    if silent_for > limit {
        Err(silent_for)
    } else {
        Ok(())
    }
}

/// Since when the runtime has not answered, shared by the runtime checks (which write it) and
/// `/healthz` (which reads it). The clock is the caller's: every method takes the instant.
#[derive(Debug)]
pub(crate) struct RuntimeSilence {
    silent_since: Mutex<Option<Instant>>,
    limit: Duration,
}

impl RuntimeSilence {
    /// Silent since `started`: the daemon has not reached its runtime yet.
    pub(crate) fn new(started: Instant, limit: Duration) -> Self {
        Self {
            silent_since: Mutex::new(Some(started)),
            limit,
        }
    }

    /// The runtime answered.
    pub(crate) fn answered(&self) {
        *self.lock() = None;
    }

    /// A check at `at` got no answer; the silence counts from the first such check.
    pub(crate) fn unanswered(&self, at: Instant) {
        self.lock().get_or_insert(at);
    }

    /// [`runtime_liveness`] at `now`, with the reason `/healthz` gives when it fails.
    pub(crate) fn check(&self, now: Instant) -> Result<(), String> {
        let since = *self.lock();
        runtime_liveness(since, now, self.limit).map_err(|silent_for| {
            format!(
                "the container runtime has not answered for {}s (--cri-liveness-timeout {}s)",
                silent_for.as_secs(),
                self.limit.as_secs()
            )
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.silent_since.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_secs(60);

    #[test]
    fn live_while_answering_and_until_silent_for_longer_than_the_limit() {
        let t0 = Instant::now();
        assert_eq!(runtime_liveness(None, t0 + LIMIT * 10, LIMIT), Ok(()));
        assert_eq!(runtime_liveness(Some(t0), t0, LIMIT), Ok(()));
        assert_eq!(runtime_liveness(Some(t0), t0 + LIMIT, LIMIT), Ok(()));
        let past = LIMIT + Duration::from_millis(1);
        assert_eq!(runtime_liveness(Some(t0), t0 + past, LIMIT), Err(past));
    }

    #[test]
    fn a_clock_behind_the_silence_counts_as_none() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(5);
        assert_eq!(runtime_liveness(Some(later), t0, LIMIT), Ok(()));
    }

    #[test]
    fn silence_counts_from_the_start_until_the_runtime_first_answers() {
        let t0 = Instant::now();
        let silence = RuntimeSilence::new(t0, LIMIT);
        silence.unanswered(t0 + Duration::from_secs(30));
        assert_eq!(silence.check(t0 + Duration::from_secs(60)), Ok(()));
        let err = silence.check(t0 + Duration::from_secs(61)).unwrap_err();
        assert_eq!(
            err,
            "the container runtime has not answered for 61s (--cri-liveness-timeout 60s)"
        );
        silence.answered();
        assert_eq!(silence.check(t0 + Duration::from_secs(61)), Ok(()));
    }

    #[test]
    fn the_time_between_answers_is_not_silence() {
        // Checks every 5 s with a limit below that: a runtime that answers each one stays live.
        let t0 = Instant::now();
        let limit = Duration::from_secs(3);
        let silence = RuntimeSilence::new(t0, limit);
        silence.answered();
        assert_eq!(silence.check(t0 + Duration::from_secs(4)), Ok(()));
        silence.answered();
        assert_eq!(silence.check(t0 + Duration::from_secs(9)), Ok(()));
    }

    #[test]
    fn silence_counts_from_the_first_failed_check_and_an_answer_ends_it() {
        let t0 = Instant::now();
        let silence = RuntimeSilence::new(t0, LIMIT);
        silence.answered();
        silence.unanswered(t0 + Duration::from_secs(100));
        silence.unanswered(t0 + Duration::from_secs(105));
        assert_eq!(silence.check(t0 + Duration::from_secs(160)), Ok(()));
        assert!(silence.check(t0 + Duration::from_secs(161)).is_err());
        silence.answered();
        assert_eq!(silence.check(t0 + Duration::from_secs(161)), Ok(()));
        silence.unanswered(t0 + Duration::from_secs(200));
        assert_eq!(silence.check(t0 + Duration::from_secs(260)), Ok(()));
        assert!(silence.check(t0 + Duration::from_secs(261)).is_err());
    }
}
