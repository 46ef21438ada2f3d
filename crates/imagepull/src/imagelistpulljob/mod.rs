//! The ImageListPullJob controller: one ImagePullJob per listed image, each the image plus the
//! list's template, and the list's status summed from them.
//!
//! - [`plan`]: the decisions, from plain values (what to create, delete and relabel; the status);
//! - `reconcile.rs`: fetch, plan, write (children in slow-start batches, labels, status, TTL);
//! - `watch.rs`: the list watch and the ImagePullJob watch, which wakes a child's list.
//!
//! Children are found in the ImagePullJob store by their controller ownerReference. The store can
//! lag behind our own creates and deletes; until it catches up they are overlaid on it
//! (`Context::family`), so a reconcile never creates a second child for an image, nor counts a
//! child it just deleted.
pub mod plan;
mod reconcile;
mod watch;

pub use self::watch::run;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};

use kruise_rs_api::imagepulljob::ImagePullJob;
use kruise_rs_kube::backoff::Backoff;
use kruise_rs_kube::events::Recorder;

/// Field manager of everything this controller writes.
pub(crate) const FIELD_MANAGER: &str = "kruise-rs-imagelistpulljob";
/// The controller's name in metrics and in [`super::CacheSync`].
pub(crate) const NAME: &str = "imagelistpulljob";

/// How long our own creates and deletes are overlaid on a store that has not shown them (a
/// watch that lags this long has been re-listed, and the store is then authoritative again).
const OVERLAY_TTL: Duration = Duration::from_secs(120);

#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error("the ImagePullJob cache is not filled yet")]
    CachesNotReady,
    #[error("labelling ImageListPullJob {name} with its template hash")]
    Label {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing the status of ImageListPullJob {name}")]
    WriteStatus {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting the finished ImageListPullJob {name}")]
    Delete {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("{verb} ImagePullJob {name} of ImageListPullJob {list}")]
    Child {
        verb: &'static str,
        name: String,
        list: String,
        #[source]
        source: kube::Error,
    },
}

/// Our writes the ImagePullJob store may not show yet, per list uid.
#[derive(Default)]
struct Overlays(Mutex<HashMap<String, Overlay>>);

#[derive(Default)]
struct Overlay {
    created: Vec<(Arc<ImagePullJob>, Instant)>,
    deleted: Vec<(String, Instant)>,
}

impl Overlays {
    /// `stored` (the children of list `uid` in the store) with our creates it does not show
    /// yet added and our deletes it still shows removed. Entries the store has caught up with,
    /// or older than [`OVERLAY_TTL`], are forgotten.
    fn merge(&self, uid: &str, mut stored: Vec<Arc<ImagePullJob>>) -> Vec<Arc<ImagePullJob>> {
        let mut overlays = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let Some(overlay) = overlays.get_mut(uid) else {
            return stored;
        };
        let has = |stored: &[Arc<ImagePullJob>], child_uid: &str| {
            stored
                .iter()
                .any(|j| j.metadata.uid.as_deref() == Some(child_uid))
        };
        let fresh = |at: &Instant| at.elapsed() < OVERLAY_TTL;
        overlay.created.retain(|(job, at)| {
            fresh(at) && !has(&stored, job.metadata.uid.as_deref().unwrap_or_default())
        });
        overlay
            .deleted
            .retain(|(child_uid, at)| fresh(at) && has(&stored, child_uid));
        stored.retain(|j| {
            !overlay
                .deleted
                .iter()
                .any(|(child_uid, _)| j.metadata.uid.as_deref() == Some(child_uid.as_str()))
        });
        stored.extend(overlay.created.iter().map(|(job, _)| job.clone()));
        if overlay.created.is_empty() && overlay.deleted.is_empty() {
            overlays.remove(uid);
        }
        stored
    }

    fn created(&self, list_uid: &str, mut job: ImagePullJob) {
        job.managed_fields_mut().clear();
        let mut overlays = self.0.lock().unwrap_or_else(|e| e.into_inner());
        overlays
            .entry(list_uid.to_owned())
            .or_default()
            .created
            .push((Arc::new(job), Instant::now()));
    }

    fn deleted(&self, list_uid: &str, child_uid: &str) {
        let mut overlays = self.0.lock().unwrap_or_else(|e| e.into_inner());
        overlays
            .entry(list_uid.to_owned())
            .or_default()
            .deleted
            .push((child_uid.to_owned(), Instant::now()));
    }

    fn forget(&self, list_uid: &str) {
        let mut overlays = self.0.lock().unwrap_or_else(|e| e.into_inner());
        overlays.remove(list_uid);
    }
}

/// What every reconcile shares.
pub(crate) struct Context {
    client: Client,
    /// Every ImagePullJob the manager sees; a list's children are those it controls.
    jobs: Store<ImagePullJob>,
    /// True once the ImagePullJob store holds a first full list.
    jobs_ready: tokio::sync::watch::Receiver<bool>,
    /// Children we created or deleted that the store has not caught up with.
    overlays: Overlays,
    backoff: Arc<Backoff>,
    recorder: Recorder,
    /// A list's reconciles start at least 20 ms apart, however fast its children report.
    pace: crate::pace::Pace,
}

impl Context {
    /// The children of the list `uid`, as the store has them and as our own writes left them.
    fn family(&self, uid: &str) -> Vec<Arc<ImagePullJob>> {
        let stored = self
            .jobs
            .state()
            .into_iter()
            .filter(|job| plan::controlled_by(job, uid))
            .collect();
        self.overlays.merge(uid, stored)
    }

    fn created(&self, list_uid: &str, job: ImagePullJob) {
        self.overlays.created(list_uid, job);
    }

    fn deleted(&self, list_uid: &str, child_uid: &str) {
        self.overlays.deleted(list_uid, child_uid);
    }

    /// Forgets the overlay of a list that is gone.
    fn forget(&self, list_uid: &str) {
        self.overlays.forget(list_uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(uid: &str) -> ImagePullJob {
        let mut j = ImagePullJob::new(uid, Default::default());
        j.metadata.uid = Some(uid.into());
        j
    }

    fn uids(jobs: &[Arc<ImagePullJob>]) -> Vec<&str> {
        jobs.iter()
            .filter_map(|j| j.metadata.uid.as_deref())
            .collect()
    }

    #[test]
    fn our_writes_count_until_the_store_shows_them() {
        let overlays = Overlays::default();
        overlays.created("list", job("new"));
        overlays.deleted("list", "old");
        let stored = vec![Arc::new(job("kept")), Arc::new(job("old"))];
        // The store lags: the new child counts, the deleted one does not.
        assert_eq!(
            uids(&overlays.merge("list", stored.clone())),
            ["kept", "new"]
        );
        // Other lists are not concerned.
        assert_eq!(uids(&overlays.merge("other", stored)), ["kept", "old"]);
        // The store caught up: the overlay is empty and forgotten.
        let caught_up = vec![Arc::new(job("kept")), Arc::new(job("new"))];
        assert_eq!(
            uids(&overlays.merge("list", caught_up.clone())),
            ["kept", "new"]
        );
        assert!(overlays.0.lock().unwrap().is_empty());
        assert_eq!(uids(&overlays.merge("list", caught_up)), ["kept", "new"]);
    }

    #[test]
    fn a_gone_list_forgets_its_overlay() {
        let overlays = Overlays::default();
        overlays.created("list", job("new"));
        overlays.forget("list");
        assert_eq!(
            uids(&overlays.merge("list", Vec::new())),
            Vec::<&str>::new()
        );
    }
}
