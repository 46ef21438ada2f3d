//! The NodeImage controller: one NodeImage per Node, named after it and labelled like it; tags
//! of gone jobs and past their TTL collected; tags the node never answers marked Failed.
//!
//! # Shape
//!
//! Everything is keyed by the node name, but kube-runtime's applier drops a request for an
//! object missing from its store, and each half of the job needs a different object to exist:
//!
//! * the **Node applier** (store: Nodes) creates a missing NodeImage once its Node has been
//!   Ready for the creation delay, requeueing at exactly that instant before;
//! * the **NodeImage applier** (store: NodeImages) deletes a NodeImage whose Node is gone or
//!   going (unless labelled `apps.kruise.io/fake-nodeimage`), keeps its labels equal to the
//!   Node's, garbage-collects `spec.images` and times out unanswered tags in `status`, then
//!   requeues at the next instant any of that would change ([`logic::next_wake`]).
//!
//! Both decide through the same pure [`logic::lifecycle`] and act on their half of it.
//!
//! Three watches feed three stores, each stripped before storing ([`watch`]): Nodes (labels,
//! deletion, Ready condition only), NodeImages (all but managedFields) and ImagePullJobs
//! (metadata only: name, namespace, uid). One router turns what changed into requests:
//! a Node change wakes both appliers for its name; a NodeImage change wakes the NodeImage
//! applier, and its disappearance wakes the Node applier (to recreate it); a job deleted or
//! replaced wakes every NodeImage that has a tag owned by its uid.
//!
//! Stores may lag the apiserver by a moment, so both destructive decisions are confirmed
//! first: a NodeImage is deleted only after a GET shows its Node gone too (and with a uid
//! precondition), and an owner job counts as gone only if it is missing from the job store
//! *and* a GET says 404 or another uid. A job that cannot be checked keeps its tags.
//!
//! Shutdown ends the router, which owns the watches and the store writers: dropping them ends
//! the appliers' queues, and the appliers stop once their reconciles in flight are done. (A
//! kube-runtime `Controller` with `graceful_shutdown_on` keeps its reflector's writer alive, so
//! when told to stop before its first list completes it waits for that store forever.)
//! Reconciles wait for all three stores through [`watch::Ready`], never through
//! `Store::wait_until_ready`, whose future wakes only the last of several concurrent waiters.
//!
//! # Writes (field manager [`FIELD_MANAGER`])
//!
//! * create: `POST` with the Node's labels and an empty spec (409 = someone was first: fine);
//! * labels: a merge patch ([`patches::labels_patch`]), this controller being their only writer;
//! * `spec.images`: [`update_images`](super::shared::nodeimage_images::update_images), the guarded JSON
//!   patch shared with the ImagePullJob controller, so its concurrent additions survive;
//! * `status`: a guarded JSON patch on the status subresource ([`patches::status_patch`]), which
//!   the node daemon's concurrent writes refuse rather than lose;
//! * delete: with a uid precondition.
//!
//! A Warning event `PullImageFailed` goes to each owner of a tag marked Failed and to the
//! NodeImage (reporting controller `kruise-rs-manager`).

pub mod logic;
pub mod patches;
mod reconcile;
pub mod watch;

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::controllers::shared::node_summary::NodeSummary;
use crate::events::Recorder;
use futures::channel::mpsc::{UnboundedSender, unbounded};
use futures::{FutureExt, StreamExt, future, stream};
use kube::core::PartialObjectMeta;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, applier, controller, watcher};
use kube::{Api, Client, ResourceExt};

use self::watch::Change;
use super::ControllerOptions;
use super::shared::backoff::Backoff;
use crate::apis::imagepulljob::ImagePullJob;
use crate::apis::nodeimage::NodeImage;

/// Field manager of every write of this controller.
pub const FIELD_MANAGER: &str = "kruise-rs-nodeimage";
/// The controller's name in metrics and in [`super::CacheSync`].
pub const NAME: &str = "nodeimage";
/// Reporting controller of its events.
pub const REPORTER: &str = "kruise-rs-manager";

/// Reconciles running at once, per applier.
const CONCURRENCY: u16 = 16;

/// Runs the NodeImage controller over every Node until `shutdown` resolves, then lets the
/// reconciles in flight finish.
///
/// With `opts.label_selector` it is confined to the Nodes and NodeImages matching it. A Node that
/// loses the label is out of scope, not gone: its NodeImage is kept.
pub async fn run(client: Client, opts: ControllerOptions, shutdown: impl Future<Output = ()>) {
    let label_selector = opts.label_selector.clone();
    let node_api: Api<NodeSummary> = Api::all(client.clone());
    let nodeimage_api: Api<NodeImage> = Api::all(client.clone());
    let job_api: Api<PartialObjectMeta<ImagePullJob>> = Api::all(client.clone());
    let unscoped = opts.watch_config();
    let scoped = opts.scoped_watch_config();

    let (nodes, node_writer) = reflector::store();
    let (nodeimage_store, nodeimage_writer) = reflector::store();
    let (jobs, job_writer) = reflector::store();

    let (node_changes, nodes_ready) = watch::changes(
        watcher(node_api, scoped.clone())
            .default_backoff()
            .modify(|n| *n = watch::strip_node(std::mem::take(n))),
        node_writer,
        watch::equal,
    );
    let (nodeimage_changes, nodeimages_ready) = watch::changes(
        watcher(nodeimage_api.clone(), scoped)
            .default_backoff()
            .modify(|ni| *ni = watch::strip_nodeimage(std::mem::take(ni))),
        nodeimage_writer,
        watch::equal,
    );
    let (job_changes, jobs_ready) = watch::changes(
        watcher(job_api, unscoped)
            .default_backoff()
            .modify(|j| *j = watch::strip_job(std::mem::take(j))),
        job_writer,
        watch::same_uid,
    );

    let ctx = Arc::new(Context {
        client: client.clone(),
        nodeimages: nodeimage_api,
        nodes: nodes.clone(),
        nodeimage_store: nodeimage_store.clone(),
        jobs,
        recorder: Recorder::new(
            client,
            Reporter {
                controller: REPORTER.into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        ),
        creation_delay: opts.nodeimage_creation_delay,
        response_timeout: opts.nodeimage_response_timeout,
        backoff: Backoff::default(),
        ready: [nodes_ready, nodeimages_ready, jobs_ready],
    });
    let (listed, synced) = (ctx.clone(), opts.synced.clone());
    tokio::spawn(async move {
        // `stores_ready` also returns when the watches stop; only a full listing counts.
        listed.stores_ready().await;
        if listed.ready.iter().all(watch::Ready::is_ready) {
            synced.mark(NAME);
        }
    });

    let (node_tx, node_rx) = unbounded::<ObjectRef<NodeSummary>>();
    let (nodeimage_tx, nodeimage_rx) = unbounded::<ObjectRef<NodeImage>>();
    let router = Router {
        nodes: nodes.clone(),
        nodeimages: nodeimage_store.clone(),
        node_tx,
        nodeimage_tx,
    };
    // Ends on shutdown, dropping the senders: the appliers then drain and end too.
    let routing = stream::select(
        stream::select(
            node_changes.map(Changed::Node),
            nodeimage_changes.map(Changed::NodeImage),
        ),
        job_changes.map(Changed::Job),
    )
    .take_until(shutdown)
    .for_each(move |change| {
        router.route(change);
        future::ready(())
    });

    let config = controller::Config::default().concurrency(CONCURRENCY);
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

/// What the reconcilers share.
struct Context {
    client: Client,
    nodeimages: Api<NodeImage>,
    nodes: Store<NodeSummary>,
    nodeimage_store: Store<NodeImage>,
    jobs: Store<PartialObjectMeta<ImagePullJob>>,
    recorder: Recorder,
    creation_delay: Duration,
    response_timeout: Duration,
    backoff: Backoff,
    /// The three stores' readiness.
    ready: [watch::Ready; 3],
}

impl Context {
    /// Waits until every store has been listed once: before that, absence means nothing.
    async fn stores_ready(&self) {
        for ready in &self.ready {
            ready.wait().await;
        }
    }
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
    NodeImage(Change<NodeImage>),
    Job(Change<PartialObjectMeta<ImagePullJob>>),
}

/// Turns store changes into reconcile requests.
struct Router {
    nodes: Store<NodeSummary>,
    nodeimages: Store<NodeImage>,
    node_tx: UnboundedSender<ObjectRef<NodeSummary>>,
    nodeimage_tx: UnboundedSender<ObjectRef<NodeImage>>,
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
            Changed::NodeImage(c) => {
                let name = c.key.name;
                if c.after.is_some() {
                    self.nodeimage(&name);
                } else if self.nodes.get(&ObjectRef::new(&name)).is_some() {
                    // Gone while its Node is here: the Node applier recreates it.
                    self.node(&name);
                }
            }
            Changed::Job(c) => {
                // Deleted, or replaced by a job of the same name with another uid.
                let Some(uid) = c.before.as_ref().and_then(|j| j.uid()) else {
                    return;
                };
                let uids = BTreeSet::from([uid]);
                for ni in self.nodeimages.state() {
                    let owned = logic::job_owners(&ni.spec)
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
