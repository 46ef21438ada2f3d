//! Watches feeding the NodeImage controller's stores, and what each event changed.
//!
//! kube-runtime's `Controller` keeps whole objects and offers no stable way to strip them before
//! they are stored (`for_stream` is behind an unstable feature), and Nodes are big (their
//! `status.images` alone runs to kilobytes). So the stores here are fed by `changes`, which
//! applies each (already stripped) watch event to a store and reports the objects whose stored
//! form changed. Because the stored form holds only what decisions read, a Node heartbeat or a
//! job's status update changes nothing and wakes no reconcile.

use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use futures::channel::mpsc::{UnboundedSender, unbounded};
use futures::{FutureExt, Stream, StreamExt, future, stream};
use k8s_openapi::api::core::v1::NodeCondition;
use kube::api::ObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, applier, controller, watcher};
use kube::{Api, Client, Resource, ResourceExt};

use super::{Context, NAME, plan, reconcile};
use kruise_rs_api::imagepulljob::{ImagePullJob, ImagePullJobStatus};

use crate::lean_nodeimage::LeanNodeImage;
use crate::lean_nodeimage::{self, NodeImageFeed, watch_nodeimages};
use crate::node_summary::{NodeStatusSummary, NodeSummary};
use kruise_rs_controller::ControllerOptions;
use kruise_rs_controller::pod_feed::alongside;
use kruise_rs_kube::backoff::Backoff;
use kruise_rs_kube::events::Recorder;

/// Keeps of a Node only what the controller reads: name, uid, labels, deletionTimestamp and the
/// Ready condition's status and transition time. Without a resourceVersion, an update that
/// touches nothing else leaves the stored Node equal, and so triggers nothing.
pub(crate) fn strip_node(node: NodeSummary) -> NodeSummary {
    let ready = node
        .status
        .and_then(|s| s.conditions)
        .and_then(|cs| cs.into_iter().find(|c| c.type_ == "Ready"))
        .map(|c| NodeCondition {
            type_: c.type_,
            status: c.status,
            last_transition_time: c.last_transition_time,
            ..NodeCondition::default()
        });
    NodeSummary {
        metadata: ObjectMeta {
            name: node.metadata.name,
            uid: node.metadata.uid,
            deletion_timestamp: node.metadata.deletion_timestamp,
            ..ObjectMeta::default()
        },
        labels: node.labels,
        status: ready.map(|ready| NodeStatusSummary {
            conditions: Some(vec![ready]),
        }),
    }
}

/// Of an ImagePullJob, its identity (it exists, with this uid) and its spec (what it asks of
/// the tags it owns, recomputed when another owner is gone).
pub(crate) fn strip_job(job: ImagePullJob) -> ImagePullJob {
    ImagePullJob {
        metadata: ObjectMeta {
            name: job.metadata.name,
            namespace: job.metadata.namespace,
            uid: job.metadata.uid,
            // With the completion time: whether the job still holds pull-secret copies
            // (`tag_values::held_pull_secrets`).
            deletion_timestamp: job.metadata.deletion_timestamp,
            ..ObjectMeta::default()
        },
        spec: job.spec,
        status: job
            .status
            .and_then(|s| s.completion_time)
            .map(|completion_time| ImagePullJobStatus {
                completion_time: Some(completion_time),
                ..Default::default()
            }),
    }
}

/// One object whose stored form a watch event changed.
pub(crate) struct Change<K: Resource> {
    pub key: ObjectRef<K>,
    pub before: Option<Arc<K>>,
    pub after: Option<Arc<K>>,
}

/// Whether a store has been listed once, for any number of waiters.
///
/// `Store::wait_until_ready` is not used for that: its future keeps a single waker, so of
/// several reconciles waiting at once only the last one to poll is woken (the others hang, and
/// with them a graceful shutdown).
#[derive(Clone, Debug)]
pub(crate) struct Ready(tokio::sync::watch::Receiver<bool>);

impl Ready {
    /// Resolves once the store has been listed, or its watch has stopped (shutdown).
    pub(crate) async fn wait(&self) {
        let _ = self.0.clone().wait_for(|ready| *ready).await;
    }

    /// Whether the store has been listed.
    pub(crate) fn is_ready(&self) -> bool {
        *self.0.borrow()
    }
}

/// Applies every event of `events` to `writer`'s store and yields the objects whose stored form
/// changed, by `same`. A re-list (`Init` … `InitDone`) is compared as a whole when it is
/// swapped in, so objects that changed or vanished while the watch was down are reported then,
/// after the store holds their new state. Watch errors are logged; the watcher recovers.
/// The [`Ready`] turns ready at the first `InitDone`.
pub(crate) fn changes<K, S>(
    events: S,
    mut writer: Writer<K>,
    same: fn(&K, &K) -> bool,
) -> (impl Stream<Item = Change<K>> + Send, Ready)
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
{
    let reader = writer.as_reader();
    let (ready_tx, ready_rx) = tokio::sync::watch::channel(false);
    let changes = events
        .map(move |event| match event {
            Ok(event) => {
                let changed = apply(&mut writer, &reader, &event, same);
                if matches!(event, watcher::Event::InitDone) {
                    ready_tx.send_replace(true);
                }
                changed
            }
            Err(err) => {
                tracing::warn!(kind = %K::kind(&()), error = %err, "watch failed; retrying");
                Vec::new()
            }
        })
        .flat_map(futures::stream::iter);
    (changes, Ready(ready_rx))
}

fn apply<K>(
    writer: &mut Writer<K>,
    reader: &Store<K>,
    event: &watcher::Event<K>,
    same: fn(&K, &K) -> bool,
) -> Vec<Change<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let differs = |a: &Option<Arc<K>>, b: &Option<Arc<K>>| match (a, b) {
        (Some(a), Some(b)) => !same(a, b),
        (None, None) => false,
        _ => true,
    };
    match event {
        watcher::Event::Apply(obj) | watcher::Event::Delete(obj) => {
            let key = ObjectRef::from_obj(obj);
            let before = reader.get(&key);
            writer.apply_watcher_event(event);
            let after = reader.get(&key);
            if differs(&before, &after) {
                vec![Change { key, before, after }]
            } else {
                Vec::new()
            }
        }
        watcher::Event::Init | watcher::Event::InitApply(_) => {
            writer.apply_watcher_event(event);
            Vec::new()
        }
        watcher::Event::InitDone => {
            let mut before: HashMap<ObjectRef<K>, Arc<K>> = reader
                .state()
                .into_iter()
                .map(|o| (ObjectRef::from_obj(&*o), o))
                .collect();
            writer.apply_watcher_event(event);
            let mut changed = Vec::new();
            for obj in reader.state() {
                let key = ObjectRef::from_obj(&*obj);
                let before = before.remove(&key);
                let after = Some(obj);
                if differs(&before, &after) {
                    changed.push(Change { key, before, after });
                }
            }
            changed.extend(before.into_iter().map(|(key, obj)| Change {
                key,
                before: Some(obj),
                after: None,
            }));
            changed
        }
    }
}

/// `same` for types compared whole.
pub(crate) fn equal<K: PartialEq>(a: &K, b: &K) -> bool {
    a == b
}

/// `same` for ImagePullJobs: only a different uid (a job replaced under the same name) counts.
pub(crate) fn same_uid(a: &ImagePullJob, b: &ImagePullJob) -> bool {
    a.uid() == b.uid()
}

/// Runs the NodeImage controller with a NodeImage watch of its own; see [`run_with_nodeimages`].
pub async fn run(client: Client, opts: ControllerOptions, shutdown: impl Future<Output = ()>) {
    let (drive, mut feeds) = watch_nodeimages(client.clone(), opts.scoped_watch_config(), 1);
    if let Some(feed) = feeds.pop() {
        alongside(drive, run_with_nodeimages(client, opts, feed, shutdown)).await;
    }
}

/// Runs the NodeImage controller over every Node until `shutdown` resolves, then lets the
/// reconciles in flight finish. NodeImages come from `nodeimages`, a watch (of
/// `opts.scoped_watch_config()`) it may share with other controllers.
///
/// With `opts.label_selector` it is confined to the Nodes and NodeImages matching it. A Node that
/// loses the label is out of scope, not gone: its NodeImage is kept.
pub async fn run_with_nodeimages(
    client: Client,
    opts: ControllerOptions,
    nodeimages: NodeImageFeed,
    shutdown: impl Future<Output = ()>,
) {
    let label_selector = opts.label_selector.clone();
    let node_api: Api<NodeSummary> = Api::all(client.clone());
    let nodeimage_api = lean_nodeimage::api(client.clone());
    let job_api: Api<ImagePullJob> = Api::all(client.clone());
    let unscoped = opts.watch_config();
    let scoped = opts.scoped_watch_config();

    let (nodes, node_writer) = reflector::store();
    let (jobs, job_writer) = reflector::store();
    let nodeimage_store = nodeimages.store;
    let nodeimage_events = nodeimages.events;
    // Turned ready by the router, which drops it on shutdown: a reconcile waiting for a first
    // list then stops waiting, whether or not the shared watch goes on for other controllers.
    let (nodeimages_listed, nodeimages_ready) = tokio::sync::watch::channel(false);
    let nodeimages_ready = Ready(nodeimages_ready);

    let (node_changes, nodes_ready) = changes(
        watcher(node_api, scoped)
            .default_backoff()
            .modify(|n| *n = strip_node(std::mem::take(n))),
        node_writer,
        equal,
    );
    let (job_changes, jobs_ready) = changes(
        watcher(job_api, unscoped)
            .default_backoff()
            .modify(|j| *j = strip_job(std::mem::take(j))),
        job_writer,
        same_uid,
    );

    // Failures of Nodes and NodeImages that are gone are forgotten: the appliers reconcile
    // only what their stores hold.
    let backoff = Arc::new(Backoff::default());
    let forget_node = backoff.clone();
    let node_changes = node_changes.inspect(move |change| {
        if change.after.is_none() {
            forget_node.succeeded(&reconcile::node_key(&change.key.name));
        }
    });
    let forget_nodeimage = backoff.clone();
    let nodeimages_gone = nodeimage_store.clone();
    let nodeimage_events = nodeimage_events.inspect(move |event| match &**event {
        watcher::Event::Delete(ni) => {
            forget_nodeimage.succeeded(&reconcile::nodeimage_key(&ni.name_any()))
        }
        watcher::Event::InitDone => {
            let live: std::collections::HashSet<String> = nodeimages_gone
                .state()
                .iter()
                .map(|ni| reconcile::nodeimage_key(&ni.name_any()))
                .collect();
            forget_nodeimage.forget_missing(reconcile::NODEIMAGE_KEY_SCOPE, |k| live.contains(k));
        }
        _ => {}
    });

    let ctx = Arc::new(Context {
        client: client.clone(),
        nodeimages: nodeimage_api,
        nodes: nodes.clone(),
        nodeimage_store: nodeimage_store.clone(),
        jobs,
        extra_ttl: opts.default_ttl_for_always_nodeimage,
        daemon_config_namespace: opts.daemon_config_namespace.clone(),
        recorder: Recorder::for_manager(client),
        creation_delay: opts.nodeimage_creation_delay,
        response_timeout: opts.nodeimage_response_timeout,
        backoff,
        ready: [nodes_ready, nodeimages_ready, jobs_ready],
    });
    let (listed, synced) = (ctx.clone(), opts.synced.clone());
    tokio::spawn(async move {
        // `stores_ready` also returns when the watches stop; only a full listing counts.
        listed.stores_ready().await;
        if listed.ready.iter().all(Ready::is_ready) {
            synced.mark(NAME);
        }
    });

    let (node_tx, node_rx) = unbounded::<ObjectRef<NodeSummary>>();
    let (nodeimage_tx, nodeimage_rx) = unbounded::<ObjectRef<LeanNodeImage>>();
    let router = Router {
        nodes: nodes.clone(),
        nodeimages: nodeimage_store.clone(),
        nodeimages_listed,
        node_tx,
        nodeimage_tx,
    };
    // Ends on shutdown, dropping the senders: the appliers then drain and end too.
    let routing = stream::select(
        stream::select(
            node_changes.map(Changed::Node),
            nodeimage_events.map(Changed::NodeImage),
        ),
        job_changes.map(Changed::Job),
    )
    .take_until(shutdown)
    .for_each(move |change| {
        router.route(change);
        future::ready(())
    });

    // `--nodeimage-workers` reconciles at once for Nodes, and as many for NodeImages.
    let config = controller::Config::default().concurrency(opts.workers.nodeimage);
    // Node and NodeImage reconciles both count as the `nodeimage` controller's.
    let metrics = opts.metrics.clone();
    let node_metrics = metrics.clone();
    let node_applier = applier(
        move |node, ctx| node_metrics.timed(NAME, reconcile::node(node, ctx)).boxed(),
        reconcile::node_error_policy,
        ctx.clone(),
        nodes,
        node_rx.map(Ok::<_, Infallible>),
        config.clone(),
    )
    .for_each(|result| {
        log_result("Node", result);
        future::ready(())
    });
    let nodeimage_applier = applier(
        move |ni, ctx| metrics.timed(NAME, reconcile::nodeimage(ni, ctx)).boxed(),
        reconcile::nodeimage_error_policy,
        ctx,
        nodeimage_store,
        nodeimage_rx.map(Ok::<_, Infallible>),
        config,
    )
    .for_each(|result| {
        log_result("NodeImage", result);
        future::ready(())
    });
    tracing::info!(scope = ?label_selector, "nodeimage controller started");
    futures::join!(routing, node_applier, nodeimage_applier);
    tracing::info!("nodeimage controller stopped");
}

type ApplierResult<K> = Result<
    (ObjectRef<K>, kube::runtime::controller::Action),
    controller::Error<reconcile::Error, Infallible>,
>;

fn log_result<K: kube::Resource>(kind: &str, result: ApplierResult<K>)
where
    K::DynamicType: std::fmt::Debug,
{
    match result {
        Ok((obj, action)) => tracing::debug!(kind, name = %obj.name, ?action, "reconciled"),
        // The object went away between the request and its turn: nothing to do.
        Err(controller::Error::ObjectNotFound(obj)) => {
            tracing::debug!(kind, name = %obj.name, "gone before its reconcile")
        }
        // Already logged by the error policy.
        Err(controller::Error::ReconcilerFailed(..)) => {}
        Err(err) => tracing::warn!(kind, error = %err, "controller error"),
    }
}

/// A change in one of the three stores.
enum Changed {
    Node(Change<NodeSummary>),
    /// NodeImages come from a shared watch, after its store applied them.
    NodeImage(Arc<watcher::Event<LeanNodeImage>>),
    Job(Change<ImagePullJob>),
}

/// Turns store changes into reconcile requests.
struct Router {
    nodes: Store<NodeSummary>,
    nodeimages: Store<LeanNodeImage>,
    /// Sent `true` at the NodeImage watch's first full list.
    nodeimages_listed: tokio::sync::watch::Sender<bool>,
    node_tx: UnboundedSender<ObjectRef<NodeSummary>>,
    nodeimage_tx: UnboundedSender<ObjectRef<LeanNodeImage>>,
}

impl Router {
    fn route(&self, change: Changed) {
        match change {
            Changed::Node(c) => {
                let name = c.key.name;
                if c.after.is_some() {
                    self.node(&name);
                }
                self.nodeimage_if_stored(&name);
            }
            Changed::NodeImage(event) => match &*event {
                watcher::Event::Apply(ni) => self.nodeimage(&ni.name_any()),
                watcher::Event::Delete(ni) => {
                    let name = ni.name_any();
                    if self.nodes.get(&ObjectRef::new(&name)).is_some() {
                        // Gone while its Node is here: the Node applier recreates it.
                        self.node(&name);
                    }
                }
                watcher::Event::Init | watcher::Event::InitApply(_) => {}
                watcher::Event::InitDone => {
                    self.nodeimages_listed.send_replace(true);
                    // A (re-)list swapped in: what changed or vanished meanwhile is not told
                    // one by one, so every NodeImage is looked at, and every Node without one.
                    for ni in self.nodeimages.state() {
                        self.nodeimage(&ni.name_any());
                    }
                    for node in self.nodes.state() {
                        let name = node.name_any();
                        if self.nodeimages.get(&ObjectRef::new(&name)).is_none() {
                            self.node(&name);
                        }
                    }
                }
            },
            Changed::Job(c) => {
                // Deleted, or replaced by a job of the same name with another uid.
                let Some(uid) = c.before.as_ref().and_then(|j| j.uid()) else {
                    return;
                };
                let uids = BTreeSet::from([uid]);
                for ni in self.nodeimages.state() {
                    let owned = plan::job_owners(&ni.spec)
                        .iter()
                        .any(|r| r.uid.as_ref().is_some_and(|u| uids.contains(u)));
                    if owned {
                        self.nodeimage(&ni.name_any());
                    }
                }
            }
        }
    }

    fn node(&self, name: &str) {
        // A closed channel means the applier stopped (shutdown): nothing left to tell.
        let _ = self.node_tx.unbounded_send(ObjectRef::new(name));
    }

    fn nodeimage(&self, name: &str) {
        let _ = self.nodeimage_tx.unbounded_send(ObjectRef::new(name));
    }

    fn nodeimage_if_stored(&self, name: &str) {
        if self.nodeimages.get(&ObjectRef::new(name)).is_some() {
            self.nodeimage(name);
        }
    }
}

#[cfg(test)]
mod tests;
