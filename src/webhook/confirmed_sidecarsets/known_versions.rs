//! The resource versions of the apiserver's SidecarSet cache at which the webhook's own cache is
//! known to hold the same SidecarSets: an admission that reads one of them from the apiserver
//! (a fence: a list that selects nothing and answers with the cache's version) needs no list of
//! every SidecarSet.
//!
//! A watch delivers a resource's events in order, so once our cache has applied the event at
//! version `v` it holds the SidecarSets as they were at `v` (and, later, newer ones). The
//! apiserver's cache stands at the version of the last event it applied, or at a later one a
//! progress notification from etcd brought it to without any SidecarSet changing; only a full
//! list tells that case, and a list our cache matches exactly is recorded too. Versions are
//! compared for equality only: they are opaque.
//!
//! An admission reads the cache only between events (a sequence count, odd while an event is
//! being applied, like a seqlock): the readable and unreadable SidecarSets live in two stores,
//! and an object that moves between them is in neither for a moment. A relist may move the cache
//! back (a list from an apiserver behind the one watched before), so it forgets every version.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::watcher;
use tokio::sync::watch;

/// How many versions are kept: the fence answers with one of the last few.
const KEPT: usize = 16;

/// A point between two events applied to the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::webhook) struct Settled(u64);

#[derive(Default)]
struct Known {
    /// Events begun plus events applied: odd while one is being applied.
    sequence: u64,
    /// Versions our cache has held what the apiserver's held at, newest last.
    versions: VecDeque<String>,
}

pub(in crate::webhook) struct KnownVersions {
    known: Mutex<Known>,
    /// Bumped whenever a version is learnt: wakes the admissions waiting for one.
    learnt: watch::Sender<u64>,
}

impl KnownVersions {
    pub(in crate::webhook) fn new() -> Arc<Self> {
        Arc::new(Self {
            known: Mutex::default(),
            learnt: watch::Sender::new(0),
        })
    }

    /// A relist begins: the cache will be replaced by what the list holds, which may be older.
    fn relisting(&self) {
        self.lock().versions.clear();
    }

    /// An event is about to change the cache.
    fn applying(&self) {
        self.lock().sequence += 1;
    }

    /// The event has changed the cache; a watch event leaves it at `version`.
    fn applied(&self, version: Option<&str>) {
        let mut known = self.lock();
        known.sequence += 1;
        if let Some(version) = version {
            Self::learn(&mut known, version);
            drop(known);
            self.learnt.send_modify(|n| *n += 1);
        }
    }

    /// A reading of the cache taken at `settled` held exactly what a list at `version` held.
    pub(in crate::webhook) fn matched(&self, settled: Settled, version: &str) {
        let mut known = self.lock();
        if known.sequence == settled.0 {
            Self::learn(&mut known, version);
            drop(known);
            self.learnt.send_modify(|n| *n += 1);
        }
    }

    fn learn(known: &mut Known, version: &str) {
        if known.versions.iter().any(|v| v == version) {
            return;
        }
        if known.versions.len() == KEPT {
            known.versions.pop_front();
        }
        known.versions.push_back(version.to_owned());
    }

    /// Now, if no event is being applied: read the cache, then check [`Self::still`].
    pub(in crate::webhook) fn settled(&self) -> Option<Settled> {
        let known = self.lock();
        (known.sequence.is_multiple_of(2)).then_some(Settled(known.sequence))
    }

    /// Now, if the cache holds what the apiserver's held at `version` and no event is being
    /// applied.
    pub(in crate::webhook) fn holds(&self, version: &str) -> Option<Settled> {
        let known = self.lock();
        (known.sequence.is_multiple_of(2) && known.versions.iter().any(|v| v == version))
            .then_some(Settled(known.sequence))
    }

    /// Waits until [`Self::holds`] `version`.
    pub(in crate::webhook) async fn reached(&self, version: &str) -> Settled {
        let mut learnt = self.learnt.subscribe();
        loop {
            if let Some(settled) = self.holds(version) {
                return settled;
            }
            // The sender lives in `self`: it cannot close while this borrows it.
            let _ = learnt.changed().await;
        }
    }

    /// Whether the cache is as it was at `settled`: nothing applied since.
    pub(in crate::webhook) fn still(&self, settled: Settled) -> bool {
        self.lock().sequence == settled.0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// `stream` (a watcher's, before the stores apply it) telling `known` of each change it is
/// about to make to the stores. Pair with [`after_stores`] above the last store.
pub(in crate::webhook) fn before_stores<K, S>(
    known: Arc<KnownVersions>,
    stream: S,
) -> impl Stream<Item = S::Item> + Send
where
    K: Send,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
{
    stream.inspect(move |event| match event {
        Ok(watcher::Event::Init) => known.relisting(),
        Ok(watcher::Event::InitDone) => {
            known.relisting();
            known.applying();
        }
        Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => known.applying(),
        Ok(watcher::Event::InitApply(_)) | Err(_) => {}
    })
}

/// `stream` (the last store's reflector) telling `known` of each change the stores have made.
/// Every `Apply`, `Delete` and `InitDone` [`before_stores`] saw must come through.
pub(in crate::webhook) fn after_stores<K, S>(
    known: Arc<KnownVersions>,
    stream: S,
) -> impl Stream<Item = S::Item> + Send
where
    K: Resource + Send,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
{
    stream.inspect(move |event| match event {
        Ok(watcher::Event::InitDone) => known.applied(None),
        Ok(watcher::Event::Apply(object) | watcher::Event::Delete(object)) => {
            known.applied(object.meta().resource_version.as_deref());
        }
        Ok(watcher::Event::Init | watcher::Event::InitApply(_)) | Err(_) => {}
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    use super::*;

    fn at(version: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some("a".into()),
                resource_version: Some(version.into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    /// Runs `events` through both adapters, with `between` called where the stores would apply
    /// each one.
    async fn through(
        known: &Arc<KnownVersions>,
        events: Vec<watcher::Event<ConfigMap>>,
        mut between: impl FnMut(&KnownVersions) + Send,
    ) {
        let stream = futures::stream::iter(events.into_iter().map(Ok));
        let k = known.clone();
        let stores = before_stores(known.clone(), stream).inspect(move |_| between(&k));
        after_stores(known.clone(), stores)
            .for_each(|_| async {})
            .await;
    }

    #[tokio::test]
    async fn a_version_is_held_once_the_stores_have_applied_its_event() {
        let known = KnownVersions::new();
        let mut seen_while_applying = Vec::new();
        through(&known, vec![watcher::Event::Apply(at("7"))], |k| {
            seen_while_applying.push((k.holds("7"), k.settled()));
        })
        .await;
        assert_eq!(seen_while_applying, vec![(None, None)]);
        let settled = known.holds("7").expect("held after the event");
        assert!(known.still(settled));
        assert_eq!(known.holds("6"), None);
    }

    #[tokio::test]
    async fn a_deletion_leaves_the_cache_at_its_version() {
        let known = KnownVersions::new();
        through(&known, vec![watcher::Event::Delete(at("9"))], |_| {}).await;
        assert!(known.holds("9").is_some());
    }

    #[tokio::test]
    async fn an_event_applied_after_a_reading_began_voids_it() {
        let known = KnownVersions::new();
        through(&known, vec![watcher::Event::Apply(at("7"))], |_| {}).await;
        let settled = known.holds("7").expect("held");
        through(&known, vec![watcher::Event::Apply(at("8"))], |_| {}).await;
        assert!(!known.still(settled));
        // Both versions are held: the cache is at 8, newer than 7.
        assert!(known.holds("7").is_some() && known.holds("8").is_some());
    }

    #[tokio::test]
    async fn a_relist_forgets_every_version_and_voids_readings() {
        let known = KnownVersions::new();
        through(&known, vec![watcher::Event::Apply(at("7"))], |_| {}).await;
        let settled = known.settled().expect("settled");
        let mut held_during_list = Vec::new();
        through(
            &known,
            vec![
                watcher::Event::Init,
                watcher::Event::InitApply(at("5")),
                watcher::Event::InitDone,
            ],
            |k| held_during_list.push(k.holds("7").is_some()),
        )
        .await;
        assert_eq!(held_during_list, vec![false, false, false]);
        assert_eq!(known.holds("7"), None);
        assert!(!known.still(settled), "the relist replaced the cache");
        // A list the relisted cache matched is recorded.
        let settled = known.settled().expect("settled after the relist");
        known.matched(settled, "12");
        assert!(known.holds("12").is_some());
    }

    #[tokio::test]
    async fn a_match_read_before_an_event_is_not_recorded() {
        let known = KnownVersions::new();
        let settled = known.settled().expect("settled");
        through(&known, vec![watcher::Event::Apply(at("3"))], |_| {}).await;
        known.matched(settled, "4");
        assert_eq!(known.holds("4"), None);
    }

    #[tokio::test]
    async fn only_the_last_versions_are_kept() {
        let known = KnownVersions::new();
        let events = (1..=KEPT + 1)
            .map(|n| watcher::Event::Apply(at(&n.to_string())))
            .collect();
        through(&known, events, |_| {}).await;
        assert_eq!(known.holds("1"), None);
        assert!(known.holds("2").is_some());
        assert!(known.holds(&(KEPT + 1).to_string()).is_some());
    }

    #[tokio::test]
    async fn a_wait_for_a_version_ends_when_its_event_is_applied() {
        let known = KnownVersions::new();
        let waiting = tokio::spawn({
            let known = known.clone();
            async move { known.reached("21").await }
        });
        through(&known, vec![watcher::Event::Apply(at("20"))], |_| {}).await;
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "ended at another version");
        through(&known, vec![watcher::Event::Apply(at("21"))], |_| {}).await;
        let settled = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the wait ended")
            .expect("task");
        assert!(known.still(settled));
    }
}
