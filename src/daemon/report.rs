//! Writes the NodeImage status: coalesced (one write carries every change since the last), at
//! most one write per [`MIN_WRITE_INTERVAL`], guarded by resourceVersion so it never overwrites
//! a write it has not seen (see [`super::status`]).

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
/// Writes per node are at most one per this interval (2/s); changes in between are coalesced.
pub const MIN_WRITE_INTERVAL: Duration = Duration::from_millis(500);
/// Pause before retrying a write that failed for another reason than a conflict.
const RETRY_AFTER_ERROR: Duration = Duration::from_secs(2);

/// Reports until `stop` resolves.
pub(super) async fn report(shared: Arc<Shared>, stop: impl Future<Output = ()>) {
    let mut stop = pin!(stop);
    let mut last_write: Option<Instant> = None;
    loop {
        tokio::select! {
            () = shared.dirty.notified() => {}
            () = &mut stop => return,
        }
        if let Some(at) = last_write {
            tokio::select! {
                () = tokio::time::sleep_until(at + MIN_WRITE_INTERVAL) => {}
                () = &mut stop => return,
            }
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
        last_write = Some(Instant::now());
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

fn retry_later(shared: &Arc<Shared>, err: &kube::Error) {
    warn!(node = %shared.node, error = %err, retry_in = ?RETRY_AFTER_ERROR, "cannot write the NodeImage status");
    let shared = shared.clone();
    tokio::spawn(async move {
        tokio::time::sleep(RETRY_AFTER_ERROR).await;
        shared.dirty.notify_one();
    });
}
