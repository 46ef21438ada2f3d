//! One watch of every pod, shared by the controllers that read pods (SidecarSet and
//! ImagePullJob): pods are the biggest set the manager watches, so they are stored once, in one
//! reflector store, and each controller gets every watch event after that store has applied it.
//!
//! kube's own shared reflector (`store_shared` + `subscribe`) hands out applied objects only;
//! the SidecarSet controller also needs deletions and the re-list markers (a pod that vanished
//! while the watch was down wakes its SidecarSets), hence this small fan-out.
//!
//! The same fan-out serves the NodeImage watch. A [`SharedWatch`] runs apart from the
//! controllers that read it: a standby replica keeps its pod and NodeImage watches (the two big
//! lists) warm, and the controllers of each term it leads take their feeds from them.

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
    let (drive, shared) = share_pods(client, config);
    (drive, shared.feeds(consumers))
}

/// The pod watch of [`watch_pods`], handing out feeds for as long as the [`SharedWatch`] (or a
/// clone, or a feed) lives.
pub fn share_pods(
    client: Client,
    config: watcher::Config,
) -> (impl Future<Output = ()>, SharedWatch<PodSummary>) {
    let (store, writer) = reflector::store();
    let events = watcher(Api::<PodSummary>::all(client), config)
        .default_backoff()
        .modify(strip_pod)
        .reflect(writer);
    SharedWatch::new(events, store)
}

/// Hands every event of `events` (a stream already reflected into `store`) to `consumers`
/// feeds, in order; a watch error is logged and skipped (the watcher retries by itself). The
/// future ends once every feed is dropped.
pub fn fan_out<K>(
    events: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    store: Store<K>,
    consumers: usize,
) -> (impl Future<Output = ()>, Vec<Feed<K>>)
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    let (drive, shared) = SharedWatch::new(events, store);
    (drive, shared.feeds(consumers))
}

/// A watch (its store and its readiness) that hands a [`Feed`] to whoever asks, at any time:
/// a standby replica keeps its watches running with no controller reading them, and the
/// controllers of each term it leads take a feed then (decision 0043).
///
/// A feed asked for before the watch's first event gets every event from the first list on. A
/// feed asked for later gets the store as a list of its own (`Init`, an `InitApply` per object,
/// `InitDone`), then every event after it; asked for while a list is under way, it gets that
/// once the list is done. Either way a feed's events say what a fresh watch's would.
pub struct SharedWatch<K: kube::Resource<DynamicType = ()> + 'static> {
    store: Store<K>,
    ready: watch::Receiver<bool>,
    requests: mpsc::UnboundedSender<mpsc::Sender<Arc<watcher::Event<K>>>>,
}

impl<K: kube::Resource<DynamicType = ()> + 'static> Clone for SharedWatch<K> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            ready: self.ready.clone(),
            requests: self.requests.clone(),
        }
    }
}

impl<K> SharedWatch<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    /// Shares `events` (a stream already reflected into `store`). Returns the future that drives
    /// the watch: it ends once this handle, its clones and every feed are dropped (or the
    /// stream ends).
    pub fn new(
        events: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
        store: Store<K>,
    ) -> (impl Future<Output = ()>, Self) {
        let (ready_tx, ready) = watch::channel(false);
        let (requests, asked) = mpsc::unbounded();
        let drive = drive(events, store.clone(), ready_tx, asked);
        let shared = Self {
            store,
            ready,
            requests,
        };
        (drive, shared)
    }

    /// A feed of this watch, as the type's documentation says. If the watch has stopped, its
    /// events end at once.
    pub fn feed(&self) -> Feed<K> {
        let (tx, events) = mpsc::channel(BUFFER);
        let _ = self.requests.unbounded_send(tx);
        Feed {
            store: self.store.clone(),
            ready: self.ready.clone(),
            events,
        }
    }

    /// `n` feeds, asked for in turn.
    pub fn feeds(&self, n: usize) -> Vec<Feed<K>> {
        (0..n).map(|_| self.feed()).collect()
    }

    /// True once the store holds a first full list.
    pub fn ready(&self) -> watch::Receiver<bool> {
        self.ready.clone()
    }
}

/// Where a watch stands, as the feeds asked for need it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ListState {
    /// No event yet: a new feed gets the first list as it comes.
    NotStarted,
    /// A list is under way: a new feed waits for its end.
    InProgress,
    /// Between lists: a new feed gets the store at once.
    Done,
}

/// Drives a [`SharedWatch`]: each event to every feed, feeds asked for added as the type's
/// documentation says.
async fn drive<K>(
    events: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    store: Store<K>,
    ready_tx: watch::Sender<bool>,
    mut asked: mpsc::UnboundedReceiver<mpsc::Sender<Arc<watcher::Event<K>>>>,
) where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    let mut feeds: Vec<mpsc::Sender<Arc<watcher::Event<K>>>> = Vec::new();
    // Asked for during a list: served at its end.
    let mut waiting = Vec::new();
    let mut list = ListState::NotStarted;
    let mut asking = true;
    let mut events = std::pin::pin!(events);
    loop {
        // Requests first: a feed asked for before the first event must get that event.
        let event = tokio::select! {
            biased;
            asked_for = asked.next(), if asking => {
                match asked_for {
                    Some(tx) => match list {
                        ListState::NotStarted => feeds.push(tx),
                        ListState::InProgress => waiting.push(tx),
                        ListState::Done => feeds.extend(replay(&store, tx).await),
                    },
                    None => asking = false,
                }
                if !asking && feeds.is_empty() && waiting.is_empty() {
                    break;
                }
                continue;
            }
            event = events.next() => event,
        };
        let Some(event) = event else { break };
        let event = match event {
            Ok(event) => event,
            Err(err) => {
                warn!(kind = %K::kind(&()), error = %err, "shared watch failed; retrying");
                continue;
            }
        };
        let done = match event {
            watcher::Event::Init => {
                list = ListState::InProgress;
                false
            }
            watcher::Event::InitDone => {
                list = ListState::Done;
                ready_tx.send_replace(true);
                true
            }
            _ => {
                if list == ListState::NotStarted {
                    // A stream that starts mid-watch (tests): nothing to wait for.
                    list = ListState::Done;
                }
                false
            }
        };
        let event = Arc::new(event);
        let mut open = Vec::with_capacity(feeds.len());
        for mut tx in feeds.drain(..) {
            // A feed whose controller has stopped is dropped.
            if tx.send(event.clone()).await.is_ok() {
                open.push(tx);
            }
        }
        feeds = open;
        if done {
            for tx in std::mem::take(&mut waiting) {
                feeds.extend(replay(&store, tx).await);
            }
        }
        if !asking && feeds.is_empty() && waiting.is_empty() {
            break;
        }
    }
}

/// Sends the store to a new feed as a list: `Init`, each object, `InitDone`. `None` if the feed
/// was dropped meanwhile.
async fn replay<K>(
    store: &Store<K>,
    mut tx: mpsc::Sender<Arc<watcher::Event<K>>>,
) -> Option<mpsc::Sender<Arc<watcher::Event<K>>>>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    tx.send(Arc::new(watcher::Event::Init)).await.ok()?;
    for object in store.state() {
        let event = watcher::Event::InitApply(K::clone(&object));
        tx.send(Arc::new(event)).await.ok()?;
    }
    tx.send(Arc::new(watcher::Event::InitDone)).await.ok()?;
    Some(tx)
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
