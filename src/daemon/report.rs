//! Writes the NodeImage status: coalesced (one write carries every change since the last),
//! paced by a token bucket ([`Pacer`]: a burst of [`WRITE_BURST`], then [`WRITES_PER_SECOND`]),
//! and guarded by resourceVersion so it never overwrites a write it has not seen (see
//! [`super::status`]). The burst lets a quiet node report a pull's start and end at once; the
//! rate bounds what a busy node costs the apiserver.

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

/// Field manager of the daemon's status writes.
pub const FIELD_MANAGER: &str = "kruise-rs-daemon";
/// Writes a node may make at once after a quiet spell.
pub const WRITE_BURST: f64 = 4.0;
/// Writes per second a busy node makes at most, once its burst is spent.
pub const WRITES_PER_SECOND: f64 = 2.0;
/// Changes this close together go out in one write (a worker's Waiting and Pulling, say).
const GATHER: Duration = Duration::from_millis(10);
/// Pause before retrying a write that failed for another reason than a conflict.
const RETRY_AFTER_ERROR: Duration = Duration::from_secs(2);

/// Reports until `stop` resolves.
pub(super) async fn report(shared: Arc<Shared>, stop: impl Future<Output = ()>) {
    let mut stop = pin!(stop);
    let mut pacer = Pacer::new(Instant::now());
    loop {
        tokio::select! {
            () = shared.dirty.notified() => {}
            () = &mut stop => return,
        }
        let wait = GATHER.max(pacer.wait(Instant::now()));
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
        pacer.take(Instant::now());
        match shared
            .nodeimages
            .patch_status(&shared.node, &params, &Patch::Merge(&patch))
            .await
        {
            Ok(written) => {
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
                        shared.set_latest(fresh, true);
                        shared.dirty.notify_one();
                    }
                    Ok(None) => {}
                    Err(err) => retry_later(&shared, &err),
                }
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {
                // Gone: the watch says so too and stops the workers.
                shared.metrics.status_write("error");
            }
            Err(err) => {
                shared.metrics.status_write("error");
                retry_later(&shared, &err);
            }
        }
    }
}

/// A token bucket: [`WRITE_BURST`] tokens, refilled at [`WRITES_PER_SECOND`]; a write takes one.
#[derive(Debug)]
pub struct Pacer {
    tokens: f64,
    at: Instant,
}

impl Pacer {
    pub fn new(now: Instant) -> Self {
        Self {
            tokens: WRITE_BURST,
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * WRITES_PER_SECOND).min(WRITE_BURST);
        self.at = now;
    }

    /// How long until a write may go out.
    pub fn wait(&mut self, now: Instant) -> Duration {
        self.refill(now);
        if self.tokens >= 1.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64((1.0 - self.tokens) / WRITES_PER_SECOND)
        }
    }

    /// Spends a token for a write made now.
    pub fn take(&mut self, now: Instant) {
        self.refill(now);
        self.tokens -= 1.0;
    }
}

fn retry_later(shared: &Arc<Shared>, err: &kube::Error) {
    warn!(node = %shared.node, error = %err, retry_in = ?RETRY_AFTER_ERROR, "cannot write the NodeImage status");
    let shared = shared.clone();
    tokio::spawn(async move {
        tokio::time::sleep(RETRY_AFTER_ERROR).await;
        shared.dirty.notify_one();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quiet_node_writes_its_burst_at_once_then_at_the_rate() {
        let start = Instant::now();
        let mut pacer = Pacer::new(start);
        for _ in 0..4 {
            assert_eq!(pacer.wait(start), Duration::ZERO);
            pacer.take(start);
        }
        assert_eq!(pacer.wait(start), Duration::from_millis(500));
        let later = start + Duration::from_millis(500);
        assert_eq!(pacer.wait(later), Duration::ZERO);
        pacer.take(later);
        assert_eq!(pacer.wait(later), Duration::from_millis(500));
    }

    #[test]
    fn writes_over_any_span_stay_within_burst_plus_rate() {
        // Write whenever allowed for 10 simulated seconds.
        let start = Instant::now();
        let mut pacer = Pacer::new(start);
        let mut now = start;
        let mut writes = 0;
        while now < start + Duration::from_secs(10) {
            now += pacer.wait(now);
            pacer.take(now);
            writes += 1;
        }
        assert!(writes <= 4 + 20 + 1, "{writes}");
        assert!(writes >= 4 + 20 - 1, "{writes}");
    }

    #[test]
    fn the_bucket_never_holds_more_than_the_burst() {
        let start = Instant::now();
        let mut pacer = Pacer::new(start);
        let much_later = start + Duration::from_secs(3600);
        for _ in 0..4 {
            assert_eq!(pacer.wait(much_later), Duration::ZERO);
            pacer.take(much_later);
        }
        assert!(pacer.wait(much_later) > Duration::ZERO);
    }
}
