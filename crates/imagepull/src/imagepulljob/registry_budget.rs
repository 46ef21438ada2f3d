//! A pull budget per registry: at most N nodes pull from one registry host at once, across every
//! ImagePullJob in the cluster (SidecarSet pre-downloads are ImagePullJobs too), so a fan-out or
//! five at once do not take a registry down (upstream #1440, #1848, #1679: only `parallelism`
//! per job exists there).
//!
//! The budget is the manager's `--max-pulls-per-registry` (0: none), lowered for one job's own
//! starts by its annotation `kruise-rs.io/max-pulls-per-registry` (a job cannot raise it). What
//! counts against it is every NodeImage tag entry of an image on that host that is written and
//! not finished for the version its spec asks (not reported, `Waiting` or `Pulling`), whoever
//! wrote it: the load the registry is about to see. Jobs of one host decide one at a time (a
//! lock per host around counting and writing), so two reconciles never spend the same room.
//! A job the budget holds back is reconciled again after [`HELD_RETRY`]: the nodes that free the
//! room belong to other jobs, whose NodeImage events do not wake it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::compact_nodeimage::ImagePullPhase;
use crate::lean_nodeimage::LeanNodeImage;
use kruise_rs_api::image::ImageRef;
use kruise_rs_api::imagepulljob::{ImagePullJob, max_pulls_per_registry};
use kruise_rs_api::well_known::MAX_PULLS_PER_REGISTRY;
use kube::ResourceExt;

/// How soon a job held back by its registry's budget looks again.
pub(crate) const HELD_RETRY: Duration = Duration::from_secs(1);

/// The budget for `job`'s starts: the manager's (`flag`, 0 for none) and the job's annotation,
/// the lower of the two. `Err` names a bad annotation (the webhook refuses one; a job written
/// while it was not serving may carry one).
pub(crate) fn budget_for(job: &ImagePullJob, flag: usize) -> Result<Option<usize>, String> {
    let from_flag = (flag > 0).then_some(flag);
    let own = max_pulls_per_registry(job.annotations())
        .map_err(|e| format!("metadata.annotations[{MAX_PULLS_PER_REGISTRY}]: {e}"))?;
    Ok(match (from_flag, own) {
        (Some(f), Some(o)) => Some(f.min(o)),
        (f, o) => f.or(o),
    })
}

/// The registry host of a NodeImage image name (a familiar name: `nginx` is on `docker.io`).
fn host_of(name: &str) -> Option<String> {
    ImageRef::parse(name).ok().map(|r| r.registry().to_owned())
}

/// How many tag entries of images on `host`, across `nodeimages`, are written and not finished.
pub(crate) fn in_flight<'a>(
    nodeimages: impl IntoIterator<Item = &'a LeanNodeImage>,
    host: &str,
) -> usize {
    let mut hosts: HashMap<&str, bool> = HashMap::new();
    let mut count = 0;
    for nodeimage in nodeimages {
        for (name, image) in &nodeimage.spec.images {
            let on_host = *hosts
                .entry(name.as_str())
                .or_insert_with(|| host_of(name).as_deref() == Some(host));
            if !on_host {
                continue;
            }
            let reported = nodeimage
                .status
                .as_ref()
                .and_then(|s| s.image_statuses.get(name.as_str()));
            for tag in &image.tags {
                let version = tag.version.unwrap_or(0);
                let finished = reported
                    .and_then(|r| {
                        r.tags
                            .iter()
                            .find(|t| t.tag == tag.tag && t.version.unwrap_or(0) == version)
                    })
                    .is_some_and(|t| {
                        matches!(t.phase, ImagePullPhase::Succeeded | ImagePullPhase::Failed)
                    });
                if !finished {
                    count += 1;
                }
            }
        }
    }
    count
}

/// How many more nodes a job may start: its own parallelism room, within the budget's.
pub(crate) fn starts_allowed(
    parallelism_room: usize,
    budget: Option<usize>,
    in_flight: usize,
) -> usize {
    match budget {
        Some(budget) => parallelism_room.min(budget.saturating_sub(in_flight)),
        None => parallelism_room,
    }
}

/// One lock per registry host: the jobs of a host count and write one at a time.
#[derive(Debug, Default)]
pub(crate) struct HostLocks {
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl HostLocks {
    pub(crate) async fn lock(&self, host: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
            locks.entry(host.to_owned()).or_default().clone()
        };
        lock.lock_owned().await
    }
}

#[cfg(test)]
mod tests;
