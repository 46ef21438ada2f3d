//! Our own pod writes, until the pod cache has caught up with them (upstream's update and
//! resourceVersion expectations, as an overlay instead of a wait).
//!
//! The pod cache lags behind the patches a reconcile sends. A pod just upgraded that the cache
//! still shows on the old version would not count as in flight, and the next reconcile (of this
//! SidecarSet, or triggered by an unrelated event) could take more than `maxUnavailable` pods.
//! So the pods our patches return are kept and read instead of the cached ones until the cache
//! holds the same pod at the same or a later resourceVersion. A restarted manager starts from a
//! fresh list, which is never older than its writes, so nothing needs to survive a restart.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kruise_rs_controller::pod_summary::PodSummary;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

/// `namespace/name`.
pub(crate) fn pod_key(pod: &PodSummary) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// etcd resourceVersions are increasing integers; anything else compares as unknown.
fn version(pod: &PodSummary) -> Option<u64> {
    pod.metadata.resource_version.as_deref()?.parse().ok()
}

/// Whether `ours` is newer than `stored`: the same pod (uid), at a later resourceVersion.
fn newer(ours: &PodSummary, stored: &PodSummary) -> bool {
    ours.metadata.uid == stored.metadata.uid
        && matches!((version(ours), version(stored)), (Some(o), Some(s)) if o > s)
}

fn fresher(ours: &HashMap<String, Arc<PodSummary>>, cached: Arc<PodSummary>) -> Arc<PodSummary> {
    match ours.get(&pod_key(&cached)) {
        Some(ours) if newer(ours, &cached) => ours.clone(),
        _ => cached,
    }
}

/// Pods as our own writes returned them.
#[derive(Default)]
pub(crate) struct WrittenPods {
    pods: Mutex<HashMap<String, Arc<PodSummary>>>,
}

impl WrittenPods {
    /// The newer of the cached pod and the one our last write returned (reconciles read all
    /// pods through [`Self::overlay`]).
    #[cfg(test)]
    pub(crate) fn fresher(&self, cached: Arc<PodSummary>) -> Arc<PodSummary> {
        let pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        fresher(&pods, cached)
    }

    /// Every pod in `cache`, each as our last write returned it when that is newer. The cache is
    /// read under this overlay's lock: [`Self::saw`] forgets a write only after the cache has
    /// applied the event that brought it, so a write forgotten before the read is in what is
    /// read, and none can be forgotten between reading a pod and looking it up here (a pod read
    /// just before its event, looked up just after, would be the old one).
    pub(crate) fn overlay(&self, cache: &Store<PodSummary>) -> Vec<Arc<PodSummary>> {
        let pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .state()
            .into_iter()
            .map(|cached| fresher(&pods, cached))
            .collect()
    }

    /// Keeps what a write returned (already stripped as the cache strips it), unless `cache`
    /// already holds that version or a later one: the watch can bring our write before its
    /// response is read, and [`Self::saw`] has then come and gone, so nothing would forget it
    /// until the next reconcile (a batch of thousands of upgrades kept a second copy of most of
    /// its pods that way). Checked under the lock `saw` takes after the store applied an event,
    /// so a write is either seen here as cached or forgotten by `saw`.
    pub(crate) fn remember(&self, pod: PodSummary, cache: &Store<PodSummary>) {
        let mut pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        let needed = cache
            .get(&ObjectRef::from_obj(&pod))
            .is_none_or(|cached| newer(&pod, &cached));
        if needed {
            pods.insert(pod_key(&pod), Arc::new(pod));
        }
    }

    /// Forgets our write of the pod in `event` once the store holds it at the same or a later
    /// version, or holds it no more. Called for every pod event, after the store applied it, so
    /// that a batch of thousands of upgrades does not keep a second copy of every pod it wrote
    /// until the reconcile ends. A re-list's pods (`InitApply`) reach the store only at its end,
    /// so they forget nothing; [`Self::forget_caught_up`] catches those.
    pub(crate) fn saw(&self, event: &watcher::Event<PodSummary>) {
        let (watcher::Event::Apply(pod) | watcher::Event::Delete(pod)) = event else {
            return;
        };
        let mut pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        if pods.is_empty() {
            return;
        }
        let key = pod_key(pod);
        let caught_up = match pods.get(&key) {
            None => return,
            Some(_) if matches!(event, watcher::Event::Delete(_)) => true,
            Some(ours) => !newer(ours, pod),
        };
        if caught_up {
            pods.remove(&key);
        }
    }

    /// Forgets the pods `cache` has caught up with, or that are gone from it.
    pub(crate) fn forget_caught_up(&self, cache: &Store<PodSummary>) {
        let mut pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        pods.retain(|_, ours| {
            cache
                .get(&ObjectRef::from_obj(&**ours))
                .is_some_and(|cached| newer(ours, &cached))
        });
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.pods.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher;
    use serde_json::json;

    use super::*;

    fn pod(uid: &str, version: &str, image: &str) -> PodSummary {
        serde_json::from_value(json!({
            "metadata": {"name": "web-0", "namespace": "shop", "uid": uid, "resourceVersion": version},
            "spec": {"containers": [{"name": "proxy", "image": image}]},
        }))
        .expect("pod")
    }

    fn image(pod: &PodSummary) -> &str {
        pod.spec.as_ref().expect("spec").containers[0]
            .image
            .as_deref()
            .unwrap_or_default()
    }

    fn cache_with(pod: PodSummary) -> (Store<PodSummary>, Writer<PodSummary>) {
        let mut writer = Writer::default();
        writer.apply_watcher_event(&watcher::Event::Apply(pod));
        (writer.as_reader(), writer)
    }

    #[test]
    fn our_write_is_read_until_the_cache_catches_up() {
        let (cache, mut writer) = cache_with(pod("u1", "5", "proxy:1"));
        let written = WrittenPods::default();
        written.remember(pod("u1", "7", "proxy:2"), &cache);

        let cached = cache
            .get(&ObjectRef::new("web-0").within("shop"))
            .expect("cached");
        assert_eq!(image(&written.fresher(cached)), "proxy:2", "the cache lags");
        written.forget_caught_up(&cache);
        assert_eq!(written.len(), 1, "still needed");

        // kubelet wrote after us: the cache is now newer than our write.
        writer.apply_watcher_event(&watcher::Event::Apply(pod("u1", "9", "proxy:2")));
        let cached = cache
            .get(&ObjectRef::new("web-0").within("shop"))
            .expect("cached");
        assert_eq!(
            written
                .fresher(cached.clone())
                .metadata
                .resource_version
                .as_deref(),
            Some("9")
        );
        written.forget_caught_up(&cache);
        assert!(written.is_empty());
    }

    #[test]
    fn a_recreated_pod_of_the_same_name_is_not_replaced_by_our_write() {
        let (cache, _writer) = cache_with(pod("u2", "3", "proxy:1"));
        let written = WrittenPods::default();
        // The write is of the old pod: not kept, and the new one is read.
        written.remember(pod("u1", "7", "proxy:2"), &cache);
        let cached = cache
            .get(&ObjectRef::new("web-0").within("shop"))
            .expect("cached");
        assert_eq!(image(&written.fresher(cached)), "proxy:1");
        written.forget_caught_up(&cache);
        assert!(written.is_empty());
    }

    #[test]
    fn a_deleted_pod_is_forgotten() {
        let (cache, mut writer) = cache_with(pod("u1", "5", "proxy:1"));
        let written = WrittenPods::default();
        written.remember(pod("u1", "7", "proxy:2"), &cache);
        writer.apply_watcher_event(&watcher::Event::Delete(pod("u1", "8", "proxy:2")));
        written.forget_caught_up(&cache);
        assert!(written.is_empty());
    }

    #[test]
    fn a_watch_event_at_our_version_or_later_forgets_our_write() {
        let empty = Writer::<PodSummary>::default().as_reader();
        let written = WrittenPods::default();
        written.remember(pod("u1", "7", "proxy:2"), &empty);
        written.saw(&watcher::Event::Apply(pod("u1", "6", "proxy:1")));
        assert_eq!(written.len(), 1, "an older event: the store still lags");
        written.saw(&watcher::Event::InitApply(pod("u1", "7", "proxy:2")));
        assert_eq!(
            written.len(),
            1,
            "a re-list reaches the store only at its end"
        );
        written.saw(&watcher::Event::Apply(pod("u1", "7", "proxy:2")));
        assert!(written.is_empty(), "the store holds our write now");

        written.remember(pod("u1", "9", "proxy:3"), &empty);
        let mut other = pod("u1", "1", "proxy:3");
        other.metadata.name = Some("web-1".into());
        written.saw(&watcher::Event::Apply(other));
        assert_eq!(written.len(), 1, "another pod's event");
        written.saw(&watcher::Event::Apply(pod("u2", "2", "proxy:1")));
        assert!(
            written.is_empty(),
            "a new pod of the same name: our write is of the old one"
        );

        written.remember(pod("u1", "9", "proxy:3"), &empty);
        written.saw(&watcher::Event::Delete(pod("u1", "5", "proxy:1")));
        assert!(written.is_empty(), "deleted");
    }

    #[test]
    fn the_overlay_reads_our_write_until_the_cache_holds_it_then_the_cache() {
        let (cache, mut writer) = cache_with(pod("u1", "5", "proxy:1"));
        let written = WrittenPods::default();
        written.remember(pod("u1", "7", "proxy:2"), &cache);
        let images = |w: &WrittenPods| {
            w.overlay(&cache)
                .iter()
                .map(|p| image(p).to_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(images(&written), ["proxy:2"], "the cache lags");
        // As the pod feed does it: the store applies the event, then the overlay sees it.
        let event = watcher::Event::Apply(pod("u1", "7", "proxy:2"));
        writer.apply_watcher_event(&event);
        written.saw(&event);
        assert!(written.is_empty());
        assert_eq!(images(&written), ["proxy:2"], "the cache holds it now");
    }

    #[test]
    fn unparsable_versions_trust_the_cache() {
        let (cache, _writer) = cache_with(pod("u1", "abc", "proxy:1"));
        let written = WrittenPods::default();
        written.remember(pod("u1", "7", "proxy:2"), &cache);
        let cached = cache
            .get(&ObjectRef::new("web-0").within("shop"))
            .expect("cached");
        assert_eq!(image(&written.fresher(cached)), "proxy:1");
    }

    #[test]
    fn a_write_the_watch_brought_first_is_not_kept() {
        // The store applied the event and `saw` ran before the patch's response was read.
        let (cache, _writer) = cache_with(pod("u1", "7", "proxy:2"));
        let written = WrittenPods::default();
        written.saw(&watcher::Event::Apply(pod("u1", "7", "proxy:2")));
        written.remember(pod("u1", "7", "proxy:2"), &cache);
        assert!(written.is_empty(), "the cache holds it already");
        // Nor when a later write (the kubelet's) got there first.
        let (later, _w) = cache_with(pod("u1", "8", "proxy:2"));
        written.remember(pod("u1", "7", "proxy:2"), &later);
        assert!(written.is_empty());
        // A cache behind our write: kept, as before.
        let (behind, _w) = cache_with(pod("u1", "6", "proxy:1"));
        written.remember(pod("u1", "7", "proxy:2"), &behind);
        assert_eq!(written.len(), 1);
    }
}
