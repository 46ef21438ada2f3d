//! The SidecarSet controller's streams: the watches and stores it reads, what wakes a
//! SidecarSet (its own changes, its pods, its pre-download jobs, NodeImages of nodes it pulls
//! on, namespaces, revisions), and the kube-runtime `Controller` they drive.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Predicate, WatchStreamExt, predicates, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::watch;
use tracing::debug;

use super::expectations::WrittenPods;
use super::pod_events::PodTracker;
use super::{Context, NAME, plan, reconcile};
use crate::controllers::{CacheSync, ControllerOptions};
use kruise_rs_api::imagepulljob::ImagePullJob;
use kruise_rs_api::sidecarset::SidecarSet;
use kruise_rs_api::well_known::SIDECARSET_NAME_LABEL;
use kruise_rs_controller::pod_feed::{self, PodFeed};
use kruise_rs_controller::shutdown::run_until_shutdown;
use kruise_rs_controller::unreadable;
use kruise_rs_imagepull::lean_nodeimage::{self, NodeImageFeed};
use kruise_rs_kube::backoff::{self, Backoff};
use kruise_rs_kube::error_chain::error_chain;
use kruise_rs_kube::events::Recorder;

/// Runs the SidecarSet controller until `shutdown` resolves, with pod and NodeImage watches of
/// its own.
pub async fn run(
    client: Client,
    opts: ControllerOptions,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let (drive_nodeimages, mut feeds) =
        lean_nodeimage::watch_nodeimages(client.clone(), opts.scoped_watch_config(), 1);
    let Some(nodeimages) = feeds.pop() else {
        return;
    };
    let with_pods = pod_feed::with_own_watch(client.clone(), opts.watch_config(), |pods| {
        run_with_feeds(client, opts, pods, nodeimages, shutdown)
    });
    pod_feed::alongside(drive_nodeimages, with_pods).await;
}

/// Runs the SidecarSet controller until `shutdown` resolves, reading pods from `pods` and
/// NodeImages from `nodeimages` (watches it may share with other controllers; `nodeimages` of
/// `opts.scoped_watch_config()`).
pub async fn run_with_feeds(
    client: Client,
    opts: ControllerOptions,
    pods: PodFeed,
    nodeimages: NodeImageFeed,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let workers = opts.workers.sidecarset;

    let tracker = PodTracker::default();
    let written = Arc::new(WrittenPods::default());
    let written_seen = written.clone();
    let (pods, pods_ready, pod_triggers) = pods.into_triggers(move |event| {
        written_seen.saw(event);
        tracker
            .wake(event)
            .into_iter()
            .map(|name| ObjectRef::<SidecarSet>::new(&name))
            .collect()
    });

    let (namespaces, namespace_changes) = watch_namespaces(&client, &opts);
    let (revisions, revision_events) = watch_revisions(&client, &opts);
    let (jobs, job_triggers) = watch_jobs(&client, &opts);

    // A node's pull finishing lets its waiting pods go: wake the SidecarSets pulling there.
    // (Only a NodeImage's name and status are read here.)
    let jobs_for_nodes = jobs.clone();
    let (nodeimages, nodeimages_ready, nodeimage_triggers) =
        nodeimages.into_triggers(move |event| {
            let (watcher::Event::Apply(n) | watcher::Event::InitApply(n)) = event else {
                return Vec::new();
            };
            sidecarsets_pulling_on(&jobs_for_nodes, &n.name_any())
                .into_iter()
                .map(|name| ObjectRef::<SidecarSet>::new(&name))
                .collect()
        });

    let (caches_ready_rx, sets_listed) = watch_readiness(
        pods_ready,
        namespaces.clone(),
        revisions.clone(),
        jobs.clone(),
        nodeimages_ready,
        opts.synced.clone(),
    );

    let (set_changes, set_store, backoff) = watch_sidecarsets(&client, &opts, sets_listed);
    let controller = Controller::for_stream(set_changes, set_store);
    let ready_store = controller.store();

    let ctx = Arc::new(Context {
        sidecarsets: controller.store(),
        client: client.clone(),
        namespace: opts.namespace.clone(),
        caches_ready: caches_ready_rx,
        pods,
        namespaces,
        revisions,
        predownload: opts.sidecarset_predownload,
        upgradable_on_upgrade: opts.sidecarset_upgradable_condition_on_upgrade,
        jobs,
        nodeimages,
        warned: Mutex::default(),
        written,
        backoff,
        metrics: opts.metrics.clone(),
        recorder: Recorder::for_manager(client),
        resize_served: tokio::sync::OnceCell::new(),
    });
    let shutdown = shutdown.shared();
    let running = controller
        .reconcile_on(pod_triggers)
        .reconcile_on(job_triggers)
        .reconcile_on(nodeimage_triggers)
        .reconcile_all_on(namespace_changes)
        // A revision deleted by hand (or by someone else) is registered again.
        .reconcile_all_on(revision_events)
        .with_config(
            controller::Config::default()
                .debounce(Duration::from_millis(50))
                .concurrency(workers),
        )
        .graceful_shutdown_on(shutdown.clone())
        .run(
            |set, ctx| {
                ctx.metrics
                    .clone()
                    .timed(NAME, reconcile::reconcile(set, ctx))
            },
            reconcile::error_policy,
            ctx,
        )
        .for_each(|result| async move {
            if let Err(err) = result {
                debug!(error = %error_chain(&err), "sidecarset controller");
            }
        });
    run_until_shutdown(running, shutdown, &ready_store).await;
}

/// The SidecarSets: a stream of those whose generation, labels or annotations changed (status
/// writes, ours, change none), their store, and the backoff that forgets deleted ones. Their
/// metric series go with them; `sets_listed` turns true at their first full list.
fn watch_sidecarsets(
    client: &Client,
    opts: &ControllerOptions,
    sets_listed: watch::Sender<bool>,
) -> (
    impl Stream<Item = Result<SidecarSet, watcher::Error>> + Send + 'static,
    Store<SidecarSet>,
    Arc<Backoff>,
) {
    // Guarded: a SidecarSet our type refuses (its containers are schemaless, decision 0004) is
    // reported and left out instead of failing the list, and with it every other SidecarSet.
    let sets = Api::<unreadable::Guarded<SidecarSet>>::all(client.clone());
    let set_stream = unreadable::skip_unreadable(
        watcher(sets, opts.scoped_watch_config()).default_backoff(),
        unreadable::log_and_record::<SidecarSet>(
            Arc::new(Recorder::for_manager(client.clone())),
            "the SidecarSet controller",
        ),
    )
    .modify(|s: &mut SidecarSet| s.managed_fields_mut().clear());
    let (set_store, set_writer) = reflector::store();
    // A deleted SidecarSet's series go as soon as the store has let it go (on a relist, at
    // InitDone, when the store is swapped); a reconcile in flight that set them again removes
    // them itself (see `reconcile`).
    let set_metrics = opts.metrics.clone();
    let known_sets = set_store.clone();
    let backoff = Arc::new(Backoff::default());
    let forget_deleted =
        backoff::forget_deleted(backoff.clone(), set_store.clone(), "", |s: &SidecarSet| {
            s.name_any()
        });
    let set_changes = set_stream
        .reflect(set_writer)
        .inspect(forget_deleted)
        .inspect(move |event| {
            if matches!(
                event,
                Ok(watcher::Event::Delete(_) | watcher::Event::InitDone)
            ) {
                set_metrics
                    .retain_sidecarsets(|name| known_sets.get(&ObjectRef::new(name)).is_some());
            }
            if matches!(event, Ok(watcher::Event::InitDone)) {
                sets_listed.send_replace(true);
            }
        })
        .applied_objects()
        .predicate_filter(
            predicates::generation
                .combine(predicates::labels)
                .combine(predicates::annotations),
            Default::default(),
        );
    (set_changes, set_store, backoff)
}

/// Namespaces, kept to read their labels; a relabelled namespace wakes every SidecarSet, since
/// its labels decide which SidecarSets select its pods (upstream does not watch them: a
/// relabelled namespace waited for the next pod event).
fn watch_namespaces(
    client: &Client,
    opts: &ControllerOptions,
) -> (Store<Namespace>, impl Stream<Item = ()> + Send + 'static) {
    let (namespaces, writer) = reflector::store();
    let changes = watcher(Api::<Namespace>::all(client.clone()), opts.watch_config())
        .default_backoff()
        .modify(|ns: &mut Namespace| ns.managed_fields_mut().clear())
        .reflect(writer)
        .applied_objects()
        .predicate_filter(predicates::labels, Default::default())
        .filter_map(|r| futures::future::ready(r.ok().map(|_| ())));
    (namespaces, changes)
}

/// The SidecarSets' ControllerRevisions in the manager's namespace; any change wakes every
/// SidecarSet, so that a revision deleted by hand is registered again.
fn watch_revisions(
    client: &Client,
    opts: &ControllerOptions,
) -> (
    Store<ControllerRevision>,
    impl Stream<Item = ()> + Send + 'static,
) {
    let (revisions, writer) = reflector::store();
    let api = Api::<ControllerRevision>::namespaced(client.clone(), &opts.namespace);
    let events = watcher(api, opts.watch_config().labels(SIDECARSET_NAME_LABEL))
        .default_backoff()
        .modify(|r: &mut ControllerRevision| r.managed_fields_mut().clear())
        .reflect(writer)
        .touched_objects()
        .filter_map(|r| futures::future::ready(r.ok()))
        .map(|_| ());
    (revisions, events)
}

/// The SidecarSets' pre-download ImagePullJobs; a change wakes the SidecarSet it belongs to.
fn watch_jobs(
    client: &Client,
    opts: &ControllerOptions,
) -> (
    Store<ImagePullJob>,
    impl Stream<Item = ObjectRef<SidecarSet>> + Send + 'static,
) {
    // Pre-download jobs carry the SidecarSet's labels, so the label selector applies to them too.
    let labels = match &opts.label_selector {
        Some(selector) => format!("{SIDECARSET_NAME_LABEL},{selector}"),
        None => SIDECARSET_NAME_LABEL.to_owned(),
    };
    let (jobs, writer) = reflector::store();
    let triggers = watcher(
        Api::<ImagePullJob>::all(client.clone()),
        opts.watch_config().labels(&labels),
    )
    .default_backoff()
    .modify(|j: &mut ImagePullJob| j.managed_fields_mut().clear())
    .reflect(writer)
    .touched_objects()
    .filter_map(|r| {
        let set = r
            .ok()
            .and_then(|j| j.labels().get(SIDECARSET_NAME_LABEL).cloned());
        futures::future::ready(set.map(|name| ObjectRef::<SidecarSet>::new(&name)))
    });
    (jobs, triggers)
}

/// Starts the task that says when every cache the reconciles read has listed (the receiver),
/// and, once the SidecarSets have listed too (the sender, set at their first `InitDone`),
/// marks this controller synced. `Store::wait_until_ready` wakes only one of several waiters:
/// one task waits and tells all.
fn watch_readiness(
    mut pods_ready: watch::Receiver<bool>,
    namespaces: Store<Namespace>,
    revisions: Store<ControllerRevision>,
    jobs: Store<ImagePullJob>,
    mut nodeimages_ready: watch::Receiver<bool>,
    synced: CacheSync,
) -> (watch::Receiver<bool>, watch::Sender<bool>) {
    let (caches_ready, caches_ready_rx) = watch::channel(false);
    let (sets_listed, mut sets_listed_rx) = watch::channel(false);
    tokio::spawn(async move {
        if pods_ready.wait_for(|ready| *ready).await.is_ok()
            && namespaces.wait_until_ready().await.is_ok()
            && revisions.wait_until_ready().await.is_ok()
            && jobs.wait_until_ready().await.is_ok()
            && nodeimages_ready.wait_for(|ready| *ready).await.is_ok()
        {
            let _ = caches_ready.send(true);
            if sets_listed_rx.wait_for(|listed| *listed).await.is_ok() {
                synced.mark(NAME);
            }
        }
    });
    (caches_ready_rx, sets_listed)
}

/// The SidecarSets with a pre-download job listing `node`.
fn sidecarsets_pulling_on(jobs: &Store<ImagePullJob>, node: &str) -> BTreeSet<String> {
    plan::sidecarsets_pulling_on(jobs.state().iter().map(|j| &**j), node)
}
