//! The reconciles of one object start at least [`MIN_GAP`] apart.
//!
//! An ImagePullJob is woken by every NodeImage event that concerns it, and each reconcile reads
//! every NodeImage; an ImageListPullJob by every event of its children. The controller runs one
//! reconcile of an object at a time and folds the triggers that arrive meanwhile into the next,
//! so while events stream in (daemons answering every few milliseconds), an object would
//! reconcile back to back, a whole pass over its inputs each time. The 50 ms debounces this
//! replaces bounded that too, but kube-runtime's debounce starts over with each trigger: an
//! object woken faster than every 50 ms did not reconcile until the events paused, which made a
//! parallelism-50 fan-out wait 50 ms for each round of answers (and could starve a big one, or
//! a list whose children kept reporting). A gap counted from the last start delays no reconcile
//! by more than [`MIN_GAP`] (decision 0042).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The least time between the starts of two reconciles of one object.
pub(crate) const MIN_GAP: Duration = Duration::from_millis(20);

/// Entries kept before the old ones are dropped (an object not reconciled for [`MIN_GAP`] needs
/// none).
const KEEP: usize = 256;

/// When each object's last reconcile started (or will start), by key.
#[derive(Debug, Default)]
pub(crate) struct Pace {
    started: Mutex<HashMap<String, Instant>>,
}

impl Pace {
    /// Waits until `key`'s next reconcile may start, and records that it starts then.
    pub(crate) async fn wait_turn(&self, key: &str) {
        let start = {
            let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            let start = started
                .get(key)
                .map_or(now, |last| (*last + MIN_GAP).max(now));
            if started.len() >= KEEP {
                started.retain(|_, last| *last + MIN_GAP > now);
            }
            started.insert(key.to_owned(), start);
            start
        };
        tokio::time::sleep_until(start).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_job_waits_for_the_gap_and_others_do_not() {
        let pace = Pace::default();
        let t0 = Instant::now();
        pace.wait_turn("ns/a").await;
        assert_eq!(t0.elapsed(), Duration::ZERO, "the first reconcile at once");
        pace.wait_turn("ns/b").await;
        assert_eq!(t0.elapsed(), Duration::ZERO, "another job at once");
        pace.wait_turn("ns/a").await;
        assert_eq!(t0.elapsed(), MIN_GAP, "the same job after the gap");
        tokio::time::advance(Duration::from_secs(1)).await;
        let t1 = Instant::now();
        pace.wait_turn("ns/a").await;
        assert_eq!(t1.elapsed(), Duration::ZERO, "long after: at once");
    }

    #[tokio::test(start_paused = true)]
    async fn old_entries_are_dropped() {
        let pace = Pace::default();
        for i in 0..KEEP * 3 {
            pace.wait_turn(&format!("ns/{i}")).await;
            tokio::time::advance(MIN_GAP).await;
        }
        let kept = pace.started.lock().unwrap().len();
        assert!(kept <= KEEP, "{kept} entries kept");
    }
}
