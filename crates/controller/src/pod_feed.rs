//! One watch of every pod, shared by the controllers that read pods (SidecarSet and
//! ImagePullJob): pods are the biggest set the manager watches, so they are stored once, in one
//! reflector store, and each controller gets every watch event after that store has applied it.
//!
//! kube's own shared reflector (`store_shared` + `subscribe`) hands out applied objects only;
//! the SidecarSet controller also needs deletions and the re-list markers (a pod that vanished
//! while the watch was down wakes its SidecarSets), hence this small fan-out.

use std::future::Future;
use std::sync::Arc;

use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::watch;
use tracing::warn;

use super::pod_summary::PodSummary;
use super::pod_summary::strip_pod;

/// Events a consumer may fall behind by before the watch waits for it.
const BUFFER: usize = 1024;

/// What one controller gets of a shared watch.
pub struct Feed<K: kube::Resource<DynamicType = ()> + 'static> {
    /// Every object, as the watch stores it.
    pub store: Store<K>,
    /// True once `store` holds a first full list.
    pub ready: watch::Receiver<bool>,
    /// Every watch event, in order, after `store` has applied it (one copy shared by all).
    pub events: mpsc::Receiver<Arc<watcher::Event<K>>>,
}

/// What one controller gets of the shared pod watch; pods are kept as [`strip_pod`] keeps
/// them (the union of what the controllers read).
pub type PodFeed = Feed<PodSummary>;

impl<K> Feed<K>
where
    K: kube::Resource<DynamicType = ()> + Send + Sync + 'static,
{
    /// Turns every event into what to reconcile (`map`), on a task of its own, and returns the
    /// store, the readiness and the stream of those triggers. A kube `Controller` stops polling
    /// all its trigger streams while it backs off from an error of any of its watches; the
    /// shared watch must not wait for that (the other controller would get no events), so the
    /// feed is drained here, always, and only the small triggers queue up (unbounded; the
    /// controller's scheduler merges duplicates). The task ends with the feed or the stream.
    pub fn into_triggers<T: Send + 'static>(
        self,
        mut map: impl FnMut(&watcher::Event<K>) -> Vec<T> + Send + 'static,
    ) -> (Store<K>, watch::Receiver<bool>, mpsc::UnboundedReceiver<T>) {
        let (tx, triggers) = mpsc::unbounded();
        let mut events = self.events;
        tokio::spawn(async move {
            while let Some(event) = events.next().await {
                for trigger in map(&event) {
                    if tx.unbounded_send(trigger).is_err() {
                        return;
                    }
                }
            }
        });
        (self.store, self.ready, triggers)
    }
}

/// Watches every pod for `consumers` controllers, listing as `config` says (see
/// `ControllerOptions::watch_config`). Returns the future that drives the watch (run it
/// alongside the controllers; it ends when every feed is dropped) and one feed per consumer.
pub fn watch_pods(
    client: Client,
    config: watcher::Config,
    consumers: usize,
) -> (impl Future<Output = ()>, Vec<PodFeed>) {
    let (store, writer) = reflector::store();
    let events = watcher(Api::<PodSummary>::all(client), config)
        .default_backoff()
        .modify(strip_pod)
        .reflect(writer);
    fan_out(events, store, consumers)
}

/// Hands every event of `events` (a stream already reflected into `store`) to `consumers`
/// feeds, in order; a watch error is logged and skipped (the watcher retries by itself).
pub fn fan_out<K>(
    events: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    store: Store<K>,
    consumers: usize,
) -> (impl Future<Output = ()>, Vec<Feed<K>>)
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    let (ready_tx, ready) = watch::channel(false);
    let (senders, feeds): (Vec<_>, Vec<_>) = (0..consumers)
        .map(|_| {
            let (tx, events) = mpsc::channel(BUFFER);
            let feed = Feed {
                store: store.clone(),
                ready: ready.clone(),
                events,
            };
            (Some(tx), feed)
        })
        .unzip();
    let drive = async move {
        let mut senders = senders;
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            let event = match event {
                Ok(event) => event,
                Err(err) => {
                    warn!(kind = %K::kind(&()), error = %err, "shared watch failed; retrying");
                    continue;
                }
            };
            if matches!(event, watcher::Event::InitDone) {
                ready_tx.send_replace(true);
            }
            let event = Arc::new(event);
            for slot in &mut senders {
                if let Some(tx) = slot
                    && tx.send(event.clone()).await.is_err()
                {
                    // That controller has stopped.
                    *slot = None;
                }
            }
            if senders.iter().all(Option::is_none) {
                break;
            }
        }
    };
    (drive, feeds)
}

/// Runs `work` on a pod watch of its own (a controller run alone, as in tests), to its end.
pub async fn with_own_watch<W: Future<Output = ()>>(
    client: Client,
    config: watcher::Config,
    work: impl FnOnce(PodFeed) -> W,
) {
    let (drive, mut feeds) = watch_pods(client, config, 1);
    if let Some(feed) = feeds.pop() {
        alongside(drive, work(feed)).await;
    }
}

/// Runs `work` to its end while driving `drive` (a [`watch_pods`] or
/// `kruise_rs_imagepull::lean_nodeimage::watch_nodeimages` future) beside it.
pub async fn alongside<W: Future>(drive: impl Future<Output = ()>, work: W) -> W::Output {
    tokio::pin!(work);
    tokio::pin!(drive);
    let mut driving = true;
    loop {
        tokio::select! {
            out = &mut work => return out,
            () = &mut drive, if driving => driving = false,
        }
    }
}

#[cfg(test)]
mod tests;
