//! How long to wait before trying again, for every retry of the manager and the daemon:
//! [`Doubling`], delays that double up to a cap (backon's exponential sequence) stretched by a
//! random share of themselves ([`jittered`]), so that objects, nodes or replicas that failed
//! together do not retry together; and [`Backoff`], a failure counter per object for
//! `error_policy`, which kube-runtime does not have (kube-rs#1916), reset by the next
//! successful reconcile.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use kube::Resource;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;

/// Delays that double from `first` up to `cap`, each stretched by up to `jitter` of itself.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Doubling {
    pub first: Duration,
    pub cap: Duration,
    /// The share of a delay [`Self::delay`] may add at random (0: none).
    pub jitter: f64,
}

impl Doubling {
    pub const fn new(first: Duration, cap: Duration, jitter: f64) -> Self {
        Self { first, cap, jitter }
    }

    /// The delay after failure number `failures` (1-based; 0 counts as 1) before its jitter:
    /// `first * 2^(failures-1)`, at most `cap`.
    pub fn unjittered(&self, failures: u32) -> Duration {
        // Past 40 doublings every sequence of durations has long reached its cap.
        let step = failures.clamp(1, 41) - 1;
        ExponentialBuilder::default()
            .with_min_delay(self.first)
            .with_max_delay(self.cap)
            .with_factor(2.0)
            .without_max_times()
            .build()
            .nth(step as usize)
            .map_or(self.cap, |delay| delay.min(self.cap))
    }

    /// [`Self::unjittered`], stretched by up to [`Self::jitter`] of itself at random.
    pub fn delay(&self, failures: u32) -> Duration {
        jittered(self.unjittered(failures), self.jitter)
    }
}

/// Failure counts keyed by object (e.g. `namespace/name`).
#[derive(Debug)]
pub struct Backoff {
    delays: Doubling,
    failures: Mutex<HashMap<String, u32>>,
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self {
            delays: Doubling::new(base, cap, BACKOFF_JITTER),
            failures: Mutex::default(),
        }
    }

    /// Records a failure of `key` and returns how long to wait before retrying it:
    /// `base * 2^(failures-1)`, at most `cap`, stretched by up to `BACKOFF_JITTER` of itself
    /// at random (so at most `cap * 1.2`).
    pub fn failed(&self, key: &str) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let n = failures.entry(key.to_owned()).or_insert(0);
        *n = n.saturating_add(1);
        let n = *n;
        drop(failures);
        self.delays.delay(n)
    }

    /// Forgets the failures of `key` (it reconciled successfully, or is gone).
    pub fn succeeded(&self, key: &str) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        failures.remove(key);
    }
}

impl Backoff {
    /// Forgets the failures of the keys starting with `scope` (`""`: every key) that
    /// `exists` says are gone.
    pub fn forget_missing(&self, scope: &str, exists: impl Fn(&str) -> bool) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        failures.retain(|key, _| !key.starts_with(scope) || exists(key));
    }

    /// Whether some key starting with `scope` has failures counted.
    fn counts_any(&self, scope: &str) -> bool {
        let failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        failures.keys().any(|key| key.starts_with(scope))
    }

    /// How many objects have failures counted.
    pub fn len(&self) -> usize {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Whether no object has failures counted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A controller's own watch, after its store applied the event: a deleted object's failures
/// are forgotten (kube-runtime does not reconcile an object that is gone, so nothing else
/// would), and after a relist those of every object `store` no longer holds (deleted while the
/// watch was down: no event). A reconcile in flight when its object was deleted counts a failure
/// after the deletion was seen; so each deletion also forgets whatever else `store` lacks, which
/// costs a pass over the store only while some failure is counted. `key` is the key the
/// controller counts failures under; only keys starting with `scope` are this watch's.
pub fn forget_deleted<K>(
    backoff: Arc<Backoff>,
    store: Store<K>,
    scope: &'static str,
    key: impl Fn(&K) -> String + Send + 'static,
) -> impl FnMut(&Result<watcher::Event<K>, watcher::Error>) + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    move |event| match event {
        Ok(watcher::Event::Delete(object)) => {
            backoff.succeeded(&key(object));
            if backoff.counts_any(scope) {
                let live: HashSet<String> = store.state().iter().map(|o| key(o)).collect();
                backoff.forget_missing(scope, |k| live.contains(k));
            }
        }
        Ok(watcher::Event::InitDone) => {
            let live: HashSet<String> = store.state().iter().map(|o| key(o)).collect();
            backoff.forget_missing(scope, |k| live.contains(k));
        }
        _ => {}
    }
}

/// The share of a backoff delay [`Backoff::failed`] may add at random: enough to spread a
/// thousand objects that failed on the same apiserver outage over a fifth of the delay.
pub(crate) const BACKOFF_JITTER: f64 = 0.2;

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
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    /// Whether `delay` is `expected` seconds stretched by at most [`BACKOFF_JITTER`].
    fn within_jitter(delay: Duration, expected: u64) -> bool {
        let expected = Duration::from_secs(expected);
        delay >= expected && delay <= expected.mul_f64(1.0 + BACKOFF_JITTER)
    }

    #[test]
    fn doubles_per_failure_up_to_the_cap_and_resets_on_success() {
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(10));
        let delays: Vec<_> = (0..6).map(|_| b.failed("a")).collect();
        for (delay, expected) in delays.iter().zip([1, 2, 4, 8, 10, 10]) {
            assert!(within_jitter(*delay, expected), "{delays:?}");
        }
        assert!(within_jitter(b.failed("b"), 1), "keys are independent");
        b.succeeded("a");
        assert!(within_jitter(b.failed("a"), 1));
    }

    fn set(name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// A watch with [`forget_deleted`] on `backoff`, after it listed a, b and c: feed it events.
    fn watched_abc(backoff: &Arc<Backoff>) -> impl FnMut(watcher::Event<ConfigMap>) {
        let (store, mut writer) = kube::runtime::reflector::store::<ConfigMap>();
        let mut hook = forget_deleted(backoff.clone(), store, "", |s: &ConfigMap| {
            s.metadata.name.clone().unwrap_or_default()
        });
        let mut apply = move |event: watcher::Event<ConfigMap>| {
            writer.apply_watcher_event(&event);
            hook(&Ok(event));
        };
        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(set("a")),
            watcher::Event::InitApply(set("b")),
            watcher::Event::InitApply(set("c")),
            watcher::Event::InitDone,
        ] {
            apply(event);
        }
        apply
    }

    #[test]
    fn a_deleted_objects_failures_are_forgotten() {
        let backoff = Arc::new(Backoff::default());
        let mut apply = watched_abc(&backoff);
        for name in ["a", "b", "c"] {
            backoff.failed(name);
        }
        assert_eq!(backoff.len(), 3);
        apply(watcher::Event::Apply(set("a")));
        assert_eq!(backoff.len(), 3, "a change is not a deletion");
        apply(watcher::Event::Delete(set("a")));
        assert_eq!(backoff.len(), 2, "deleted: forgotten");
        // b is deleted while the watch is down: the relist no longer has it.
        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(set("c")),
            watcher::Event::InitDone,
        ] {
            apply(event);
        }
        assert_eq!(backoff.len(), 1, "gone from the relist: forgotten");
        // The default base is 500 ms: c's second failure waits 1 s.
        assert!(within_jitter(backoff.failed("c"), 1), "c's count is kept");
    }

    #[test]
    fn a_failure_counted_after_its_objects_deletion_goes_with_the_next_deletion() {
        let backoff = Arc::new(Backoff::default());
        let mut apply = watched_abc(&backoff);
        backoff.failed("c");
        apply(watcher::Event::Delete(set("a")));
        // a's reconcile was in flight: its error_policy runs after the delete was seen.
        backoff.failed("a");
        assert_eq!(backoff.len(), 2);
        apply(watcher::Event::Delete(set("b")));
        let mut left: Vec<String> = backoff.failures.lock().unwrap().keys().cloned().collect();
        left.sort();
        assert_eq!(left, ["c"], "a is gone, c still fails");
    }

    #[test]
    fn forgetting_is_confined_to_its_scope() {
        let b = Backoff::default();
        for key in ["node/a", "node/b", "nodeimage/a", "nodeimage/b"] {
            b.failed(key);
        }
        b.forget_missing("node/", |k| k == "node/a");
        let mut left: Vec<String> = b.failures.lock().unwrap().keys().cloned().collect();
        left.sort();
        assert_eq!(left, ["node/a", "nodeimage/a", "nodeimage/b"]);
        b.forget_missing("", |_| false);
        assert!(b.is_empty());
    }

    #[test]
    fn objects_failing_together_do_not_retry_together() {
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(300));
        let keys: Vec<_> = (0..100).map(|i| format!("ns/{i}")).collect();
        for _ in 0..5 {
            let delays: std::collections::BTreeSet<_> = keys.iter().map(|k| b.failed(k)).collect();
            assert!(delays.len() > 50, "only {} distinct delays", delays.len());
        }
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
    fn doubling_matches_the_hand_written_sequences_it_replaced() {
        // The pull backoff (1 s to 30 s), the start-up retries (250 ms to 8 s), the status
        // write retries (2 s to 60 s) and the reconcile backoff (500 ms to 300 s).
        for (first, cap) in [
            (1000, 30_000),
            (250, 8_000),
            (2_000, 60_000),
            (500, 300_000),
        ] {
            let (first, cap) = (Duration::from_millis(first), Duration::from_millis(cap));
            let d = Doubling::new(first, cap, 0.0);
            for n in 0..200u32 {
                let doublings = n.saturating_sub(1).min(16);
                let expected = first.saturating_mul(1 << doublings).min(cap);
                assert_eq!(d.unjittered(n), expected, "{first:?}..{cap:?}, failure {n}");
                assert_eq!(d.delay(n), expected, "no jitter asked");
            }
            assert_eq!(d.unjittered(u32::MAX), cap);
        }
        let past_cap = Doubling::new(Duration::from_secs(10), Duration::from_secs(1), 0.0);
        assert_eq!(
            past_cap.unjittered(1),
            Duration::from_secs(1),
            "capped from the first"
        );
    }

    #[test]
    fn many_failures_do_not_overflow() {
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        for _ in 0..100 {
            assert!(b.failed("x") <= Duration::from_secs(72));
        }
    }
}
