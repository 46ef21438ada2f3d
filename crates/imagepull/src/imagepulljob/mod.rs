//! The ImagePullJob controller: writes each target node's share of a job into its NodeImage, at
//! most `parallelism` nodes at a time and in target order, and sums the nodes' reports into the
//! job's status.
//!
//! - `watch.rs`: the job watch, the shared NodeImage and pod feeds, and what wakes which job
//!   (`nodeimage_changes`: which jobs a NodeImage event concerns);
//! - [`plan`]: the decisions of a reconcile, from plain values, built from
//!   - `targets`: which nodes, in which order, and where each stands;
//!   - `entry`: what a job writes into a NodeImage;
//!   - `status`: the job's status, which nodes start next, when the job next needs attention;
//! - `reconcile.rs`: fetch, plan, write: secrets, the NodeImage writes, the status, events;
//! - [`secrets`]: the pull-secret copies in the daemons' namespace.
//!
//! A job's spec edits reach every node it owns, not only nodes not yet written: after each new
//! `generation` a reconcile recomputes the job's tags everywhere (see
//! `tag_values`), and the NodeImage controller does the same for the
//! remaining owners when a job is gone.
//!
//! Writes go through `update_images` (guarded
//! JSON patches), so jobs sharing a node never lose each other's entries. The NodeImage store can lag behind our own writes; the objects our
//! patches return are kept until the store catches up (`Context::fresher`), so a reconcile
//! never counts a node it just started as not started, and `parallelism` holds exactly.

mod entry;
mod nodeimage_changes;
pub mod plan;
mod reconcile;
mod registry_budget;
pub mod secrets;
mod status;
mod targets;
mod watch;

pub use self::status::time_left;
pub use self::watch::run_with_feeds;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};

use self::secrets::SecretsError;
use crate::nodeimage_write::ImagesWriteError;
use kruise_rs_api::imagepulljob::ImagePullJob;
use kruise_rs_controller::ControllerOptions;
use kruise_rs_controller::pod_summary::PodSummary;
use kruise_rs_kube::backoff::Backoff;

use crate::lean_nodeimage::LeanNodeImage;
use kruise_rs_kube::events::Recorder;

/// Field manager of everything this controller writes.
pub(crate) const FIELD_MANAGER: &str = "kruise-rs-imagepulljob";
/// The controller's name in metrics and in [`super::CacheSync`].
pub(crate) const NAME: &str = "imagepulljob";

#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error("the NodeImage and Pod caches are not filled yet")]
    CachesNotReady,
    #[error(transparent)]
    WriteNodeImage(#[from] ImagesWriteError),
    #[error("writing the status of ImagePullJob {name}")]
    WriteStatus {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Secrets(#[from] SecretsError),
    #[error("updating the finalizers or pull-secret pins of ImagePullJob {name}")]
    Metadata {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("reading ImagePullJob {name}")]
    Read {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting the finished ImagePullJob {name}")]
    Delete {
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// What every reconcile shares.
pub(crate) struct Context {
    client: Client,
    /// True once the NodeImage and Pod stores hold a first full list.
    caches_ready: tokio::sync::watch::Receiver<bool>,
    nodeimages: Store<LeanNodeImage>,
    pods: Store<PodSummary>,
    /// Every ImagePullJob: what the other owners of a shared tag ask of it.
    jobs: Store<ImagePullJob>,
    /// Per job uid, the generation whose values every node it owns has been brought up to.
    refreshed: Mutex<HashMap<String, i64>>,
    /// NodeImages as our own patches returned them, until the store has caught up with them.
    written: Arc<WrittenNodeImages>,
    /// The uids of finished jobs whose copies were released since this manager started
    /// (forgotten when the job is deleted).
    released: Arc<Mutex<HashSet<String>>>,
    backoff: Arc<Backoff>,
    opts: ControllerOptions,
    recorder: Recorder,
    /// One lock per registry host, for the registry budget.
    host_locks: registry_budget::HostLocks,
    /// Keeps the reconciles of one job apart: they start at least 20 ms apart (its events
    /// arrive much faster).
    pace: crate::pace::Pace,
}

impl Context {
    /// Every stored NodeImage, each as our last patch returned it when that is newer.
    fn fresh_nodeimages(&self) -> Vec<Arc<LeanNodeImage>> {
        self.written.overlay_all(&self.nodeimages)
    }

    /// NodeImage `name` as stored, or as our last patch returned it when that is newer.
    fn fresh_nodeimage(&self, name: &str) -> Option<Arc<LeanNodeImage>> {
        self.written.overlay_one(&self.nodeimages, name)
    }

    /// Forgets the written objects the store has caught up with (or that are gone), so the
    /// overlay holds only writes still in flight, whatever the jobs do next.
    fn forget_caught_up(&self) {
        self.written.forget_caught_up(&self.nodeimages);
    }

    fn refreshed_generation(&self, job: &ImagePullJob) -> Option<i64> {
        let refreshed = self.refreshed.lock().unwrap_or_else(|e| e.into_inner());
        refreshed.get(job.metadata.uid.as_deref()?).copied()
    }

    /// Records that every node `job` owns carries its values as of `generation`; `None` forgets
    /// the job (it is done writing).
    fn refreshed(&self, job: &ImagePullJob, generation: Option<i64>) {
        let Some(uid) = job.metadata.uid.clone() else {
            return;
        };
        let mut refreshed = self.refreshed.lock().unwrap_or_else(|e| e.into_inner());
        match generation {
            Some(generation) => refreshed.insert(uid, generation),
            None => refreshed.remove(&uid),
        };
    }

    fn was_released(&self, job: &ImagePullJob) -> bool {
        let released = self.released.lock().unwrap_or_else(|e| e.into_inner());
        job.metadata
            .uid
            .as_ref()
            .is_some_and(|uid| released.contains(uid))
    }

    fn released(&self, job: &ImagePullJob) {
        if let Some(uid) = job.metadata.uid.clone() {
            let mut released = self.released.lock().unwrap_or_else(|e| e.into_inner());
            released.insert(uid);
        }
    }

    fn remember(&self, written: LeanNodeImage) {
        self.written.remember(written, &self.nodeimages);
    }
}

/// The newer of the stored NodeImage and the one our last patch returned (which is forgotten
/// once the store has it). Spec writes bump `generation`, and the store sees events in order,
/// so a stored object with a lower generation than our write is entirely older than it.
fn fresher(
    written: &mut HashMap<String, Arc<LeanNodeImage>>,
    stored: Arc<LeanNodeImage>,
) -> Arc<LeanNodeImage> {
    let name = stored.name_any();
    match written.get(&name) {
        Some(ours) if ours.metadata.generation > stored.metadata.generation => ours.clone(),
        Some(_) => {
            written.remove(&name);
            stored
        }
        None => stored,
    }
}

/// NodeImages as our own patches returned them, until the store has caught up with them.
#[derive(Default)]
pub(crate) struct WrittenNodeImages(Mutex<HashMap<String, Arc<LeanNodeImage>>>);

impl WrittenNodeImages {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<LeanNodeImage>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every NodeImage in `store`, each replaced by our write when that is newer. The store is
    /// read under this overlay's lock: [`Self::saw`] forgets a write only after the store has
    /// applied the event that brought it, so a write forgotten before the read is in what is
    /// read, and none can be forgotten between reading an object and looking it up here.
    fn overlay_all(&self, store: &Store<LeanNodeImage>) -> Vec<Arc<LeanNodeImage>> {
        let mut written = self.lock();
        store
            .state()
            .into_iter()
            .map(|stored| fresher(&mut written, stored))
            .collect()
    }

    /// NodeImage `name` in `store`, or our write when that is newer (read as in `overlay_all`).
    fn overlay_one(&self, store: &Store<LeanNodeImage>, name: &str) -> Option<Arc<LeanNodeImage>> {
        let mut written = self.lock();
        let stored = store.get(&ObjectRef::new(name))?;
        Some(fresher(&mut written, stored))
    }

    fn forget_caught_up(&self, store: &Store<LeanNodeImage>) {
        self.lock().retain(|name, ours| {
            store
                .get(&ObjectRef::new(name))
                .is_some_and(|stored| stored.metadata.generation < ours.metadata.generation)
        });
    }

    /// Forgets our write of the NodeImage in `event` once the store holds its generation or a
    /// later one, or holds it no more. Called for every NodeImage event after the store applied
    /// it, so that a fan-out over thousands of nodes does not keep a second copy of every
    /// NodeImage it wrote until its reconcile ends. A re-list's objects (`InitApply`) reach the
    /// store only at its end, so they forget nothing; `forget_caught_up` catches those.
    pub(crate) fn saw(&self, event: &watcher::Event<LeanNodeImage>) {
        let (watcher::Event::Apply(ni) | watcher::Event::Delete(ni)) = event else {
            return;
        };
        let mut written = self.lock();
        if written.is_empty() {
            return;
        }
        let Some(name) = ni.metadata.name.as_deref() else {
            return;
        };
        let caught_up = match written.get(name) {
            None => return,
            Some(_) if matches!(event, watcher::Event::Delete(_)) => true,
            Some(ours) => ni.metadata.generation >= ours.metadata.generation,
        };
        if caught_up {
            written.remove(name);
        }
    }

    /// Keeps what a write returned (parsed without managedFields already, `update_images`)
    /// unless `store` already holds that generation or a later one: on loopback the watch often
    /// brings our write before its response is read, and [`Self::saw`] has then come and gone,
    /// so nothing would forget the copy until the job's next reconcile. Checked under the lock
    /// `saw` takes after the store applied an event, so a write is either seen here as stored
    /// or forgotten by `saw`.
    fn remember(&self, written: LeanNodeImage, store: &Store<LeanNodeImage>) {
        let mut kept = self.lock();
        let name = written.name_any();
        let needed = store
            .get(&ObjectRef::new(&name))
            .is_none_or(|stored| stored.metadata.generation < written.metadata.generation);
        if needed {
            kept.insert(name, Arc::new(written));
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod written_tests {
    use kube::runtime::reflector::store::Writer;

    use super::*;
    use kruise_rs_api::nodeimage::NodeImage;

    fn nodeimage(name: &str, generation: i64) -> LeanNodeImage {
        let mut ni = NodeImage::new(name, Default::default());
        ni.metadata.generation = Some(generation);
        ni.into()
    }

    #[test]
    fn a_watch_event_at_our_generation_or_later_forgets_our_write() {
        let store = Writer::<LeanNodeImage>::default().as_reader();
        let written = WrittenNodeImages::default();
        written.remember(nodeimage("node-1", 4), &store);
        written.saw(&watcher::Event::Apply(nodeimage("node-1", 3)));
        assert_eq!(written.len(), 1, "an older event: the store still lags");
        written.saw(&watcher::Event::Apply(nodeimage("node-2", 9)));
        assert_eq!(written.len(), 1, "another node's event");
        written.saw(&watcher::Event::InitApply(nodeimage("node-1", 4)));
        assert_eq!(
            written.len(),
            1,
            "a re-list reaches the store only at its end"
        );
        written.saw(&watcher::Event::Apply(nodeimage("node-1", 4)));
        assert_eq!(written.len(), 0, "the store holds our write now");

        written.remember(nodeimage("node-1", 5), &store);
        written.saw(&watcher::Event::Delete(nodeimage("node-1", 2)));
        assert_eq!(written.len(), 0, "deleted");
    }

    #[test]
    fn a_write_the_watch_brought_first_is_not_kept() {
        let mut writer = Writer::<LeanNodeImage>::default();
        writer.apply_watcher_event(&watcher::Event::Apply(nodeimage("node-1", 4)));
        let store = writer.as_reader();
        let written = WrittenNodeImages::default();
        written.remember(nodeimage("node-1", 4), &store);
        assert_eq!(written.len(), 0, "the store holds this generation already");
        written.remember(nodeimage("node-1", 5), &store);
        assert_eq!(written.len(), 1, "the store lags behind this one");
        written.remember(nodeimage("node-2", 1), &store);
        assert_eq!(written.len(), 2, "not in the store at all yet");
    }

    #[test]
    fn until_the_store_catches_up_our_write_is_read() {
        let mut writer = Writer::<LeanNodeImage>::default();
        writer.apply_watcher_event(&watcher::Event::Apply(nodeimage("node-1", 3)));
        let store = writer.as_reader();
        let written = WrittenNodeImages::default();
        written.remember(nodeimage("node-1", 4), &store);
        let generation = |ni: Option<Arc<LeanNodeImage>>| ni.and_then(|ni| ni.metadata.generation);
        assert_eq!(generation(written.overlay_one(&store, "node-1")), Some(4));
        assert_eq!(generation(written.overlay_all(&store).pop()), Some(4));
        assert_eq!(written.overlay_one(&store, "node-2"), None);

        writer.apply_watcher_event(&watcher::Event::Apply(nodeimage("node-1", 4)));
        assert_eq!(generation(written.overlay_one(&store, "node-1")), Some(4));
        assert_eq!(written.len(), 0, "read once caught up, then forgotten");
    }
}
