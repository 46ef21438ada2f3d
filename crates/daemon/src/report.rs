//! Writes the NodeImage status: coalesced (one write carries every change since the last),
//! paced by a token bucket ([`pacer`]: a burst of [`WRITE_BURST`], then [`WRITES_PER_SECOND`]),
//! and guarded by resourceVersion so it never overwrites a write it has not seen (see
//! [`super::status`]). The burst lets a quiet node report a pull's start and end at once; the
//! rate bounds what a busy node costs the apiserver. A write that fails (the apiserver down or
//! overloaded) is retried after [`retry_delay`]: doubling per failure in a row up to a minute,
//! each pause stretched at random by up to half, so a whole fleet neither hammers a recovering
//! apiserver nor retries in step (5,000 nodes send about 70 writes a second at the cap, not
//! the 2,500 of a fixed 2 s).

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use tokio::time::Instant;
use tracing::{debug, warn};

use super::node::Shared;
use super::status::{desired_status, status_patch};
use kruise_rs_kube::backoff::Doubling;
use kruise_rs_kube::{RateLimit, TokenBucket};

/// Field manager of the daemon's status writes.
pub const FIELD_MANAGER: &str = "kruise-rs-daemon";
/// Writes a node may make at once after a quiet spell.
pub(crate) const WRITE_BURST: u32 = 4;
/// Writes per second a busy node makes at most, once its burst is spent.
pub(crate) const WRITES_PER_SECOND: f64 = 2.0;
/// Changes this close together go out in one write (a worker's Waiting and Pulling, say).
const GATHER: Duration = Duration::from_millis(10);
/// Pause before the first retry of a write that failed for another reason than a conflict.
pub(crate) const FIRST_RETRY: Duration = Duration::from_secs(2);
/// Longest pause between retries, before its jitter.
pub(crate) const MAX_RETRY: Duration = Duration::from_secs(60);
/// Each retry pause is stretched by a random share of up to this much of itself.
pub(crate) const RETRY_JITTER: f64 = 0.5;

/// Reports until `stop` resolves.
pub(super) async fn report(shared: Arc<Shared>, stop: impl Future<Output = ()>) {
    let mut stop = pin!(stop);
    let mut pacer = pacer(Instant::now());
    // Failed writes in a row, and when the next write may go out after the last failure.
    let mut failures: u32 = 0;
    let mut retry_at: Option<Instant> = None;
    loop {
        tokio::select! {
            () = shared.dirty.notified() => {}
            () = &mut stop => return,
        }
        let now = Instant::now();
        let wait = GATHER
            .max(pacer.wait(now))
            .max(retry_at.map_or(Duration::ZERO, |at| at.saturating_duration_since(now)));
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = &mut stop => return,
        }
        let (object, desired) = {
            let state = shared.lock();
            let Some(object) = state.latest.clone() else {
                continue;
            };
            let desired = desired_status(
                &object.spec,
                object.status.as_ref(),
                &state.worker_statuses(),
            );
            (object, desired)
        };
        if object.status.clone().unwrap_or_default() == desired {
            continue;
        }
        let Some(resource_version) = object.resource_version() else {
            continue;
        };
        let patch = status_patch(object.status.as_ref(), &desired, &resource_version);
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        pacer.spend(Instant::now());
        let mut failed = |err: &kube::Error| {
            failures = failures.saturating_add(1);
            let delay = retry_delay(failures);
            warn!(node = %shared.node, error = %err, retry_in = ?delay, failures, "cannot write the NodeImage status");
            retry_at = Instant::now().checked_add(delay);
            // Comes back for the retry even if nothing else changes meanwhile.
            shared.dirty.notify_one();
        };
        match shared
            .nodeimages
            .patch_status(&shared.node, &params, &Patch::Merge(&patch))
            .await
        {
            Ok(written) => {
                (failures, retry_at) = (0, None);
                debug!(node = %shared.node, desired = desired.desired, succeeded = desired.succeeded, failed = desired.failed, "status written");
                shared.metrics.status_write("written");
                shared.set_latest(written, false);
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                // Someone wrote in between: read what they wrote and decide again.
                shared.metrics.status_write("conflict");
                debug!(node = %shared.node, "status write conflicted; re-reading");
                match shared.nodeimages.get_opt(&shared.node).await {
                    Ok(Some(fresh)) => {
                        (failures, retry_at) = (0, None);
                        shared.set_latest(fresh, true);
                        shared.dirty.notify_one();
                    }
                    Ok(None) => {}
                    Err(err) => failed(&err),
                }
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {
                // Gone: the watch says so too and stops the workers.
                shared.metrics.status_write("error");
            }
            Err(err) => {
                shared.metrics.status_write("error");
                failed(&err);
            }
        }
    }
}

/// The status writes' token bucket: [`WRITE_BURST`] tokens, refilled at [`WRITES_PER_SECOND`];
/// a write takes one.
pub(crate) fn pacer(now: Instant) -> TokenBucket {
    TokenBucket::full(
        RateLimit {
            qps: WRITES_PER_SECOND,
            burst: WRITE_BURST,
        },
        now,
    )
}

/// The pause after `failures` failed writes in a row (1-based): [`FIRST_RETRY`] doubling up to
/// [`MAX_RETRY`], stretched by up to [`RETRY_JITTER`] of itself.
pub(crate) fn retry_delay(failures: u32) -> Duration {
    Doubling::new(FIRST_RETRY, MAX_RETRY, RETRY_JITTER).delay(failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_writes_back_off_exponentially_with_jitter_up_to_a_cap() {
        let bases = [2, 4, 8, 16, 32, 60, 60, 60];
        for (failures, base) in (1..).zip(bases) {
            let base = Duration::from_secs(base);
            for _ in 0..50 {
                let delay = retry_delay(failures);
                assert!(
                    delay >= base && delay < base.mul_f64(1.0 + RETRY_JITTER),
                    "failure {failures}: {delay:?} outside [{base:?}, 1.5 × {base:?})"
                );
            }
        }
        assert!(retry_delay(u32::MAX) < MAX_RETRY.mul_f64(1.0 + RETRY_JITTER));
        assert!(retry_delay(0) < FIRST_RETRY.mul_f64(1.0 + RETRY_JITTER));
    }

    #[test]
    fn nodes_failing_together_do_not_retry_in_step() {
        let delays: std::collections::BTreeSet<Duration> =
            (0..100).map(|_| retry_delay(10)).collect();
        assert!(delays.len() > 50, "{} distinct delays", delays.len());
    }

    #[test]
    fn a_fleet_at_the_cap_writes_far_less_than_with_a_fixed_pause() {
        // 5,000 nodes failing for long: each writes once per retry_delay at the cap.
        let nodes = 5_000.0;
        let mean: f64 = (0..1000)
            .map(|_| retry_delay(20).as_secs_f64())
            .sum::<f64>()
            / 1000.0;
        let per_second = nodes / mean;
        assert!(per_second < 100.0, "{per_second} writes/s");
    }

    #[test]
    fn a_quiet_node_writes_its_burst_at_once_then_at_the_rate() {
        let start = Instant::now();
        let mut pacer = pacer(start);
        for _ in 0..4 {
            assert_eq!(pacer.wait(start), Duration::ZERO);
            pacer.spend(start);
        }
        assert_eq!(pacer.wait(start), Duration::from_millis(500));
        let later = start + Duration::from_millis(500);
        assert_eq!(pacer.wait(later), Duration::ZERO);
        pacer.spend(later);
        assert_eq!(pacer.wait(later), Duration::from_millis(500));
    }

    #[test]
    fn writes_over_any_span_stay_within_burst_plus_rate() {
        // Write whenever allowed for 10 simulated seconds.
        let start = Instant::now();
        let mut pacer = pacer(start);
        let mut now = start;
        let mut writes = 0;
        while now < start + Duration::from_secs(10) {
            now += pacer.wait(now);
            pacer.spend(now);
            writes += 1;
        }
        assert!(writes <= 4 + 20 + 1, "{writes}");
        assert!(writes >= 4 + 20 - 1, "{writes}");
    }

    #[test]
    fn the_bucket_never_holds_more_than_the_burst() {
        let start = Instant::now();
        let mut pacer = pacer(start);
        let much_later = start + Duration::from_secs(3600);
        for _ in 0..4 {
            assert_eq!(pacer.wait(much_later), Duration::ZERO);
            pacer.spend(much_later);
        }
        assert!(pacer.wait(much_later) > Duration::ZERO);
    }
}
