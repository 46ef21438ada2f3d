//! Per-object exponential backoff for `error_policy`, which kube-runtime does not have
//! (kube-rs#1916): a failure counter per object, reset by the next successful reconcile.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// Failure counts keyed by object (e.g. `namespace/name`).
#[derive(Debug)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    failures: Mutex<HashMap<String, u32>>,
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap,
            failures: Mutex::default(),
        }
    }

    /// Records a failure of `key` and returns how long to wait before retrying it:
    /// `base * 2^(failures-1)`, at most `cap`.
    pub fn failed(&self, key: &str) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let n = failures.entry(key.to_owned()).or_insert(0);
        *n = n.saturating_add(1);
        let factor = 2u32.checked_pow(n.saturating_sub(1)).unwrap_or(u32::MAX);
        self.base
            .checked_mul(factor)
            .map_or(self.cap, |d| d.min(self.cap))
    }

    /// Forgets the failures of `key` (it reconciled successfully, or is gone).
    pub fn succeeded(&self, key: &str) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        failures.remove(key);
    }
}

/// `delay` stretched by a random share of up to `factor` of itself (`delay * (1 + [0, factor))`),
/// so that many clients failing at once do not retry in step (client-go's `wait.Jitter`).
/// A `factor` that is not positive leaves `delay` as it is.
pub fn jittered(delay: Duration, factor: f64) -> Duration {
    if factor.is_nan() || factor <= 0.0 {
        return delay;
    }
    let extra = delay.as_secs_f64() * factor * fastrand::f64();
    Duration::try_from_secs_f64(extra).map_or(delay, |extra| delay.saturating_add(extra))
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(Duration::from_millis(500), Duration::from_secs(300))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_per_failure_up_to_the_cap_and_resets_on_success() {
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(10));
        let delays: Vec<_> = (0..6).map(|_| b.failed("a").as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 10, 10]);
        assert_eq!(b.failed("b").as_secs(), 1, "keys are independent");
        b.succeeded("a");
        assert_eq!(b.failed("a").as_secs(), 1);
    }

    #[test]
    fn jitter_stays_within_its_factor_and_varies() {
        let d = Duration::from_secs(10);
        let samples: Vec<_> = (0..200).map(|_| jittered(d, 0.5)).collect();
        assert!(
            samples
                .iter()
                .all(|s| *s >= d && *s < Duration::from_secs(15))
        );
        assert!(
            samples.iter().any(|s| *s != samples[0]),
            "not one fixed value"
        );
        assert_eq!(jittered(d, 0.0), d);
        assert_eq!(jittered(d, f64::NAN), d);
        assert_eq!(jittered(Duration::MAX, 1.0), Duration::MAX, "saturates");
    }

    #[test]
    fn many_failures_do_not_overflow() {
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        for _ in 0..100 {
            assert!(b.failed("x") <= Duration::from_secs(60));
        }
    }
}
