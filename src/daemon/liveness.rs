//! When the daemon asks to be restarted: its container runtime has not answered for
//! `--cri-liveness-timeout`.
//!
//! The chart mounts only the runtime's socket file into the daemon's container. A bind mount of a
//! file keeps the inode it was made with, and a runtime that restarts unlinks its socket and binds
//! a new one: the daemon's path then leads to the old inode and every connection is refused until
//! the container is created again with a fresh mount
//! ([decision 0010](../../docs/decisions/0010-daemon-mounts-only-its-cri-socket.md)). So `/healthz`
//! fails once the runtime has been silent for the limit, and the kubelet's liveness probe restarts
//! the container. A runtime that is really down costs nothing more: the kubelet cannot start the
//! new container before the runtime is back, and then it mounts the new socket.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// `--cri-liveness-timeout`'s default: a runtime restart takes seconds, and a false restart of the
/// daemon only costs its pulls in flight (a restarted daemon resumes them from the status).
pub const DEFAULT_CRI_LIVENESS_TIMEOUT: Duration = Duration::from_secs(60);

/// Whether the daemon is live at `now`: `Err(silent_for)` once the runtime has not answered for
/// longer than `limit` since `last_answer` (the daemon's start until it first answers).
pub fn runtime_liveness(
    last_answer: Instant,
    now: Instant,
    limit: Duration,
) -> Result<(), Duration> {
    let silent_for = now.saturating_duration_since(last_answer);
    if silent_for > limit {
        Err(silent_for)
    } else {
        Ok(())
    }
}

/// The last time the runtime answered, shared by the runtime checks (which write it) and
/// `/healthz` (which reads it). The clock is the caller's: every method takes `now`.
#[derive(Debug)]
pub struct RuntimeSilence {
    last_answer: Mutex<Instant>,
    limit: Duration,
}

impl RuntimeSilence {
    /// Counts silence from `started`, when the daemon has not reached its runtime yet.
    pub fn new(started: Instant, limit: Duration) -> Self {
        Self {
            last_answer: Mutex::new(started),
            limit,
        }
    }

    /// The runtime answered at `at`. An earlier instant than the one held is ignored.
    pub fn answered(&self, at: Instant) {
        let mut last = self.last_answer.lock().unwrap_or_else(|e| e.into_inner());
        *last = (*last).max(at);
    }

    /// [`runtime_liveness`] at `now`, with the reason `/healthz` gives when it fails.
    pub fn check(&self, now: Instant) -> Result<(), String> {
        let last = *self.last_answer.lock().unwrap_or_else(|e| e.into_inner());
        runtime_liveness(last, now, self.limit).map_err(|silent_for| {
            format!(
                "the container runtime has not answered for {}s (--cri-liveness-timeout {}s)",
                silent_for.as_secs(),
                self.limit.as_secs()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_secs(60);

    #[test]
    fn live_until_the_runtime_has_been_silent_for_longer_than_the_limit() {
        let t0 = Instant::now();
        assert_eq!(runtime_liveness(t0, t0, LIMIT), Ok(()));
        assert_eq!(runtime_liveness(t0, t0 + LIMIT, LIMIT), Ok(()));
        let past = LIMIT + Duration::from_millis(1);
        assert_eq!(runtime_liveness(t0, t0 + past, LIMIT), Err(past));
    }

    #[test]
    fn a_clock_behind_the_last_answer_counts_as_no_silence() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(5);
        assert_eq!(runtime_liveness(later, t0, LIMIT), Ok(()));
    }

    #[test]
    fn silence_counts_from_the_start_until_the_runtime_first_answers() {
        let t0 = Instant::now();
        let silence = RuntimeSilence::new(t0, LIMIT);
        assert_eq!(silence.check(t0 + Duration::from_secs(59)), Ok(()));
        let err = silence.check(t0 + Duration::from_secs(61)).unwrap_err();
        assert_eq!(
            err,
            "the container runtime has not answered for 61s (--cri-liveness-timeout 60s)"
        );
    }

    #[test]
    fn each_answer_restarts_the_count_and_a_late_report_of_an_older_one_does_not() {
        let t0 = Instant::now();
        let silence = RuntimeSilence::new(t0, LIMIT);
        silence.answered(t0 + Duration::from_secs(50));
        assert_eq!(silence.check(t0 + Duration::from_secs(100)), Ok(()));
        silence.answered(t0 + Duration::from_secs(10));
        assert_eq!(silence.check(t0 + Duration::from_secs(110)), Ok(()));
        assert!(silence.check(t0 + Duration::from_secs(111)).is_err());
        // Answering again makes it live at once.
        silence.answered(t0 + Duration::from_secs(200));
        assert_eq!(silence.check(t0 + Duration::from_secs(200)), Ok(()));
    }
}
