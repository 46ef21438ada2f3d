//! The SidecarSet controller: upgrades the sidecars of running pods in place, batch by batch,
//! keeps the SidecarSet's ControllerRevisions, and reports the rollout in its status.
//!
//! One reconcile of a SidecarSet:
//! 1. its pods ([`pods::owns`]) from the pod cache, each seen as a [`strategy::PodView`];
//! 2. its latest ControllerRevision registered ([`revisions`]);
//! 3. the next batch ([`strategy::next_batch`]) and the status ([`status::compute_status`]),
//!    written when it changed, with a Warning event when pods cannot be upgraded in place;
//! 4. the `SidecarSetUpgradable` condition of pods that cannot be upgraded ([`upgrade`]);
//! 5. the batch upgraded: one guarded JSON patch per pod ([`upgrade::upgrade_patch`]);
//! 6. revisions beyond `revisionHistoryLimit` deleted.
//!
//! Pod events wake a SidecarSet only when something that matters changed ([`pod_events`]).
//!
//! **Expectations.** The pod cache lags behind our own patches; [`expectations::WrittenPods`]
//! keeps the pods our patches return and reads them instead of cached ones until the cache has
//! caught up, so a lagging cache never lets more than `maxUnavailable` pods be in flight.

pub mod expectations;
pub mod pod_events;
pub mod pods;
pub mod predownload;
pub mod revisions;
pub mod status;
pub mod strategy;
pub mod upgrade;

use std::collections::{BTreeSet, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::{Namespace, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Predicate, WatchStreamExt, predicates, watcher};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use self::expectations::{WrittenPods, pod_key};
use self::pod_events::PodTracker;
use self::pods::{NamespaceLabels, namespace_labels, owns, view};
use self::predownload::{Decision, IMAGE_PREDOWNLOAD, KnobWarning, Knobs, Progress};
use self::revisions::RevisionsError;
use self::status::{PODS_UPGRADABLE, StatusReport, compute_status};
use self::strategy::{Batch, CurrentHashes, PodState, PodView, classify, next_batch};
use self::upgrade::{UpgradeError, upgradable_condition, upgrade_patch};
use super::ControllerOptions;
use super::shared::backoff::Backoff;
use super::shared::pod_feed::{self, PodFeed};
use super::shared::pod_summary::{PodSummary, strip_pod};
use super::shared::shutdown::run_until_shutdown;
use crate::apis::imagepulljob::ImagePullJob;
use crate::apis::nodeimage::NodeImage;
use crate::apis::sidecarset::{SidecarSet, SidecarSetStatus};
use crate::apis::well_known::{CONTROLLER_REVISION_HASH, SIDECARSET_HASH, SIDECARSET_NAME_LABEL};
use crate::error_chain::error_chain;
use crate::events::Recorder;
use crate::runtime::ManagerMetrics;
use crate::sidecar::annotations::parse_hashes;
use crate::sidecar::revision::history::revisions_to_delete;

/// Field manager of everything this controller writes.
pub const FIELD_MANAGER: &str = "kruise-rs-sidecarset";
/// The controller's name in metrics and in [`super::CacheSync`].
pub const NAME: &str = "sidecarset";

/// How long a reconcile waits for the first lists of pods, namespaces and revisions.
const CACHE_WAIT: Duration = Duration::from_secs(10);

/// Pod patches in flight at once while a batch is upgraded.
const UPGRADE_CONCURRENCY: usize = 16;

/// When a pod patch was refused because the pod changed meanwhile: the next try, from fresh data.
const RETRY_CHANGED_POD: Duration = Duration::from_secs(1);

/// A periodic look even when nothing changed (level-based safety net).
const RESYNC: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the pod, namespace and ControllerRevision caches are not filled yet")]
    CachesNotReady,
    #[error(transparent)]
    Revisions(#[from] RevisionsError),
    #[error("writing the status of SidecarSet {name}")]
    WriteStatus {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("upgrading the sidecars of pod {pod}")]
    UpgradePod {
        pod: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing the pre-download ImagePullJob {job}")]
    Job {
        job: String,
        #[source]
        source: kube::Error,
    },
    #[error("the pre-download ImagePullJob {job} exists and belongs to something else")]
    JobTaken { job: String },
    #[error("writing the SidecarSetUpgradable condition of pod {pod}")]
    PodCondition {
        pod: String,
        #[source]
        source: kube::Error,
    },
}

/// What every reconcile shares.
pub struct Context {
    client: Client,
    /// Where the ControllerRevisions live.
    namespace: String,
    /// True once the pod, namespace and revision stores hold a first full list.
    caches_ready: watch::Receiver<bool>,
    pods: Store<PodSummary>,
    namespaces: Store<Namespace>,
    revisions: Store<ControllerRevision>,
    /// Whether SidecarSet image pre-download is on (`--sidecarset-predownload`); off, the
    /// jobs left from when it was on are deleted.
    predownload: bool,
    /// The SidecarSets' pre-download jobs.
    jobs: Store<ImagePullJob>,
    /// NodeImages (status only), to tell when a node has pulled.
    nodeimages: Store<NodeImage>,
    /// Bad pre-download annotations already warned about (SidecarSet uid, annotation, value).
    warned: Mutex<HashSet<String>>,
    /// The SidecarSets as watched: a long batch stops when its SidecarSet changed meanwhile.
    sidecarsets: Store<SidecarSet>,
    /// Pods as our own patches returned them, until the store has caught up with them.
    written: WrittenPods,
    backoff: Backoff,
    recorder: Recorder,
    metrics: ManagerMetrics,
}

impl Context {
    fn remember(&self, mut pod: PodSummary) {
        strip_pod(&mut pod);
        self.written.remember(pod);
    }
}

/// Runs the SidecarSet controller until `shutdown` resolves, with a pod watch of its own.
pub async fn run(
    client: Client,
    opts: ControllerOptions,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    pod_feed::with_own_watch(client.clone(), opts.watch_config(), |pods| {
        run_with_pods(client, opts, pods, shutdown)
    })
    .await;
}

/// Runs the SidecarSet controller until `shutdown` resolves, reading pods from `pods` (a watch
/// it may share with other controllers).
pub async fn run_with_pods(
    client: Client,
    opts: ControllerOptions,
    pods: PodFeed,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let scoped = opts.scoped_watch_config();

    let tracker = PodTracker::default();
    let (pods, pods_ready, pod_triggers) = pods.into_triggers(move |event| {
        tracker
            .wake(event)
            .into_iter()
            .map(|name| ObjectRef::<SidecarSet>::new(&name))
            .collect()
    });

    let (namespaces, namespace_writer) = reflector::store();
    // A namespace's labels decide which SidecarSets select its pods (upstream does not watch
    // them: a relabelled namespace waited for the next pod event).
    let namespace_changes = watcher(Api::<Namespace>::all(client.clone()), opts.watch_config())
        .default_backoff()
        .modify(|ns: &mut Namespace| ns.managed_fields_mut().clear())
        .reflect(namespace_writer)
        .applied_objects()
        .predicate_filter(predicates::labels, Default::default())
        .filter_map(|r| futures::future::ready(r.ok().map(|_| ())));

    let (revisions, revision_writer) = reflector::store();
    let revision_api = Api::<ControllerRevision>::namespaced(client.clone(), &opts.namespace);
    let revision_events = watcher(
        revision_api,
        opts.watch_config().labels(SIDECARSET_NAME_LABEL),
    )
    .default_backoff()
    .modify(|r: &mut ControllerRevision| r.managed_fields_mut().clear())
    .reflect(revision_writer)
    .touched_objects()
    .filter_map(|r| futures::future::ready(r.ok()))
    .map(|_| ());

    // Pre-download jobs carry the SidecarSet's labels, so the label selector applies to them too.
    let job_labels = match &opts.label_selector {
        Some(selector) => format!("{SIDECARSET_NAME_LABEL},{selector}"),
        None => SIDECARSET_NAME_LABEL.to_owned(),
    };
    let (jobs, job_writer) = reflector::store();
    let job_triggers = watcher(
        Api::<ImagePullJob>::all(client.clone()),
        opts.watch_config().labels(&job_labels),
    )
    .default_backoff()
    .modify(|j: &mut ImagePullJob| j.managed_fields_mut().clear())
    .reflect(job_writer)
    .touched_objects()
    .filter_map(|r| {
        let set = r
            .ok()
            .and_then(|j| j.labels().get(SIDECARSET_NAME_LABEL).cloned());
        futures::future::ready(set.map(|name| ObjectRef::<SidecarSet>::new(&name)))
    });

    // A node's pull finishing lets its waiting pods go: wake the SidecarSets pulling there.
    let (nodeimages, nodeimage_writer) = reflector::store();
    let jobs_for_nodes = jobs.clone();
    let nodeimage_triggers = watcher(Api::<NodeImage>::all(client.clone()), scoped.clone())
        .default_backoff()
        // Only its name and status are read: labels (a copy of the Node's) and spec are dropped.
        .modify(|n: &mut NodeImage| {
            let meta = std::mem::take(&mut n.metadata);
            n.metadata.name = meta.name;
            n.metadata.resource_version = meta.resource_version;
            n.spec = Default::default();
        })
        .reflect(nodeimage_writer)
        .applied_objects()
        .filter_map(move |r| {
            let node = r.ok().map(|n| n.name_any());
            let sets: BTreeSet<String> = node
                .map(|node| sidecarsets_pulling_on(&jobs_for_nodes, &node))
                .unwrap_or_default();
            futures::future::ready(Some(futures::stream::iter(
                sets.into_iter()
                    .map(|name| ObjectRef::<SidecarSet>::new(&name)),
            )))
        })
        .flatten();

    // `Store::wait_until_ready` wakes only one of several waiters; one task waits and tells all.
    let (caches_ready, caches_ready_rx) = watch::channel(false);
    let (mut p, n, r) = (pods_ready, namespaces.clone(), revisions.clone());
    let (j, ni) = (jobs.clone(), nodeimages.clone());
    let (sets_listed, mut sets_listed_rx) = watch::channel(false);
    let synced = opts.synced.clone();
    tokio::spawn(async move {
        if p.wait_for(|ready| *ready).await.is_ok()
            && n.wait_until_ready().await.is_ok()
            && r.wait_until_ready().await.is_ok()
            && j.wait_until_ready().await.is_ok()
            && ni.wait_until_ready().await.is_ok()
        {
            let _ = caches_ready.send(true);
            if sets_listed_rx.wait_for(|listed| *listed).await.is_ok() {
                synced.mark(NAME);
            }
        }
    });

    let sets = Api::<SidecarSet>::all(client.clone());
    let set_stream = watcher(sets, scoped)
        .default_backoff()
        .modify(|s: &mut SidecarSet| s.managed_fields_mut().clear());
    let (set_store, set_writer) = reflector::store();
    // A deleted SidecarSet's series go as soon as the store has let it go (on a relist, at
    // InitDone, when the store is swapped); a reconcile in flight that set them again removes
    // them itself (see `reconcile`).
    let set_metrics = opts.metrics.clone();
    let known_sets = set_store.clone();
    // Status writes (ours) change neither generation, labels nor annotations.
    let set_changes = set_stream
        .reflect(set_writer)
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
        jobs,
        nodeimages,
        warned: Mutex::default(),
        written: WrittenPods::default(),
        backoff: Backoff::default(),
        metrics: opts.metrics.clone(),
        recorder: Recorder::new(
            client,
            Reporter {
                controller: "kruise-rs-manager".into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        ),
    });
    let shutdown = shutdown.shared();
    let running = controller
        .reconcile_on(pod_triggers)
        .reconcile_on(job_triggers)
        .reconcile_on(nodeimage_triggers)
        .reconcile_all_on(namespace_changes)
        // A revision deleted by hand (or by someone else) is registered again.
        .reconcile_all_on(revision_events)
        .with_config(controller::Config::default().debounce(Duration::from_millis(50)))
        .graceful_shutdown_on(shutdown.clone())
        .run(
            |set, ctx| ctx.metrics.clone().timed(NAME, reconcile(set, ctx)),
            error_policy,
            ctx,
        )
        .for_each(|result| async move {
            if let Err(err) = result {
                debug!(error = %error_chain(&err), "sidecarset controller");
            }
        });
    run_until_shutdown(running, shutdown, &ready_store).await;
}

/// The SidecarSets with a pre-download job listing `node`.
fn sidecarsets_pulling_on(jobs: &Store<ImagePullJob>, node: &str) -> BTreeSet<String> {
    jobs.state()
        .iter()
        .filter(|j| {
            j.spec
                .selector
                .as_ref()
                .is_some_and(|s| s.names.iter().any(|n| n == node))
        })
        .filter_map(|j| label(j, SIDECARSET_NAME_LABEL).map(str::to_owned))
        .collect()
}

fn error_policy(set: Arc<SidecarSet>, err: &Error, ctx: Arc<Context>) -> Action {
    let name = set.name_any();
    let delay = ctx.backoff.failed(&name);
    warn!(sidecarset = %name, error = %error_chain(err), retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

async fn reconcile(set: Arc<SidecarSet>, ctx: Arc<Context>) -> Result<Action, Error> {
    // An empty pod store would read as "no pods": the status would drop to zero.
    let mut ready = ctx.caches_ready.clone();
    match tokio::time::timeout(CACHE_WAIT, ready.wait_for(|r| *r)).await {
        Ok(Ok(_)) => {}
        _ => return Err(Error::CachesNotReady),
    }
    let action = reconcile_set(&set, &ctx).await;
    ctx.written.forget_caught_up(&ctx.pods);
    // The SidecarSet watch removes a deleted one's series; this catches a reconcile that was
    // in flight then and set them again after.
    let sidecarsets = &ctx.sidecarsets;
    ctx.metrics
        .retain_sidecarsets(|name| sidecarsets.get(&ObjectRef::new(name)).is_some());
    let action = action?;
    ctx.backoff.succeeded(&set.name_any());
    Ok(action)
}

/// Everything one reconcile decides before it writes anything.
pub struct Plan<'a> {
    /// One per owned pod, in the same order (borrowing from them).
    pub views: Vec<PodView<'a>>,
    pub batch: Batch,
    pub report: StatusReport,
    pub predownload: Decision,
}

/// What the pre-download part of a plan reads besides the pods.
pub struct PreDownloadInputs<'a> {
    pub knobs: &'a Knobs,
    pub manager_namespace: &'a str,
    /// The SidecarSet's pre-download jobs as they are (for their progress, and whether this
    /// revision's have started).
    pub jobs: &'a [Arc<ImagePullJob>],
    /// A node's NodeImage.
    pub nodeimage: &'a dyn Fn(&str) -> Option<Arc<NodeImage>>,
}

/// The pods of `pods` that `set` owns.
pub fn owned_pods(
    set: &SidecarSet,
    pods: impl IntoIterator<Item = Arc<PodSummary>>,
    namespaces: &NamespaceLabels,
) -> Vec<Arc<PodSummary>> {
    pods.into_iter()
        .filter(|p| owns(set, p, namespaces))
        .collect()
}

fn label<'a>(job: &'a ImagePullJob, key: &str) -> Option<&'a str> {
    job.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// What to do for `set` (its `status.latestRevision` already the registered revision) over
/// its `owned` pods: the pure heart of a reconcile.
pub fn plan<'a>(
    set: &SidecarSet,
    owned: &'a [Arc<PodSummary>],
    collision_count: i32,
    now: &Time,
    pre: &PreDownloadInputs<'_>,
) -> Plan<'a> {
    let mut views: Vec<PodView> = owned.iter().map(|p| view(set, p)).collect();
    let mut batch = next_batch(set, &views);
    let latest = set
        .status
        .as_ref()
        .and_then(|s| s.latest_revision.as_deref())
        .unwrap_or_default();
    let mut report = compute_status(set, &views, &batch, latest, collision_count, now);

    let hash = predownload::revision_hash(set);
    let started = pre
        .jobs
        .iter()
        .any(|j| label(j, CONTROLLER_REVISION_HASH) == Some(hash.as_str()));
    let updated_ready = usize::try_from(report.status.updated_ready_pods).unwrap_or(0);
    let mut decision = predownload::decide(
        set,
        owned,
        &batch,
        updated_ready,
        pre.knobs,
        pre.manager_namespace,
        started,
    );
    predownload::keep_listed_nodes(decision.jobs_mut(), pre.jobs);
    // While pulling, the queued pods wait for their nodes.
    if matches!(decision, Decision::Pull(_))
        && predownload::mark_awaiting(set, owned, &mut views, &batch, pre.nodeimage) > 0
    {
        batch = next_batch(set, &views);
        report = compute_status(set, &views, &batch, latest, collision_count, now);
    }
    let wanted: Vec<&Arc<ImagePullJob>> = pre
        .jobs
        .iter()
        .filter(|j| {
            decision.jobs().iter().any(|p| {
                j.metadata.namespace.as_deref() == Some(p.namespace.as_str())
                    && j.metadata.name.as_deref() == Some(p.name.as_str())
            })
        })
        .collect();
    let progress = Progress::of(decision.jobs(), wanted.into_iter().map(|j| &**j));
    let previous = set
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == IMAGE_PREDOWNLOAD));
    report.status.conditions.push(predownload::condition(
        &decision,
        progress,
        previous,
        set.metadata.generation,
        now,
    ));
    Plan {
        views,
        batch,
        report,
        predownload: decision,
    }
}

async fn reconcile_set(set: &SidecarSet, ctx: &Context) -> Result<Action, Error> {
    if set.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let name = set.name_any();
    let namespaces = namespace_labels(ctx.namespaces.state().iter().map(|n| &**n));
    let owned = owned_pods(
        set,
        ctx.pods.state().into_iter().map(|p| ctx.written.fresher(p)),
        &namespaces,
    );

    let history: Vec<ControllerRevision> = ctx
        .revisions
        .state()
        .iter()
        .filter(|r| r.labels().get(SIDECARSET_NAME_LABEL) == Some(&name))
        .map(|r| (**r).clone())
        .collect();
    let revision_api = Api::<ControllerRevision>::namespaced(ctx.client.clone(), &ctx.namespace);
    let registered = revisions::register(&revision_api, set, &history, &ctx.namespace).await?;
    let latest = registered.latest.name_any();

    let previous = set.status.clone();
    // The pods' hash entries record the revision they were upgraded to.
    let mut set = set.clone();
    set.status
        .get_or_insert_with(SidecarSetStatus::default)
        .latest_revision = Some(latest.clone());
    let set = &set;

    let now = Time(Timestamp::now());
    let (knobs, knob_warnings) = predownload::knobs_when(set, ctx.predownload);
    warn_knobs(ctx, set, &knob_warnings).await;
    let uid = set.metadata.uid.as_deref();
    let jobs: Vec<Arc<ImagePullJob>> = ctx
        .jobs
        .state()
        .into_iter()
        .filter(|j| {
            label(j, SIDECARSET_NAME_LABEL) == Some(name.as_str())
                && j.owner_references()
                    .iter()
                    .any(|o| Some(o.uid.as_str()) == uid)
        })
        .collect();
    let nodeimage = |node: &str| ctx.nodeimages.get(&ObjectRef::new(node));
    let Plan {
        views,
        batch,
        report,
        predownload: decision,
    } = plan(
        set,
        &owned,
        registered.collision_count,
        &now,
        &PreDownloadInputs {
            knobs: &knobs,
            manager_namespace: &ctx.namespace,
            jobs: &jobs,
            nodeimage: &nodeimage,
        },
    );
    let s = &report.status;
    ctx.metrics.set_sidecarset_pods(
        &name,
        [
            s.matched_pods,
            s.updated_pods,
            s.ready_pods,
            s.updated_ready_pods,
        ],
    );
    if previous.as_ref() != Some(&report.status) {
        write_status(ctx, set, &report.status).await?;
        announce_not_upgradable(ctx, set, previous.as_ref(), &report.status).await;
        announce_skipped(ctx, set, previous.as_ref(), &report.status).await;
    }
    let jobs_synced = sync_jobs(ctx, set, &knobs, &decision, &jobs).await;

    let current = CurrentHashes::of(set);
    mark_upgradable(ctx, set, &owned, &views, &current, &now).await?;

    let targets: Vec<Arc<PodSummary>> = batch.upgrade.iter().map(|&i| owned[i].clone()).collect();
    let outcome = upgrade_pods(ctx, set, &current, targets, &now).await;

    let in_use: BTreeSet<String> = owned
        .iter()
        .filter_map(|p| recorded_revision(p, &name))
        .collect();
    let mut all = history;
    if !all.iter().any(|r| r.name_any() == latest) {
        all.push(registered.latest.clone());
    }
    let stale = revisions_to_delete(set, &all, &latest, &in_use);
    if !stale.is_empty() {
        revisions::delete_revisions(&revision_api, &stale).await?;
    }

    jobs_synced?;
    match outcome? {
        UpgradeOutcome { refused: 0, .. } => Ok(Action::requeue(RESYNC)),
        UpgradeOutcome { refused, .. } => {
            debug!(sidecarset = %name, refused, "pods changed while being upgraded; trying again");
            Ok(Action::requeue(RETRY_CHANGED_POD))
        }
    }
}

/// The ControllerRevision `pod`'s hash entry for `set` records.
fn recorded_revision(pod: &PodSummary, set: &str) -> Option<String> {
    let value = pod.annotations().get(SIDECARSET_HASH)?;
    let entry = parse_hashes(SIDECARSET_HASH, value).ok()?.remove(set)?;
    Some(entry.controller_revision).filter(|r| !r.is_empty())
}

async fn write_status(
    ctx: &Context,
    set: &SidecarSet,
    status: &SidecarSetStatus,
) -> Result<(), Error> {
    let name = set.name_any();
    let mut fields = serde_json::to_value(status).expect("a status always serializes");
    if let Some(map) = fields.as_object_mut() {
        // A merge patch leaves out what it does not mention: name the optional ones.
        for key in [
            "observedGeneration",
            "latestRevision",
            "collisionCount",
            "conditions",
        ] {
            map.entry(key).or_insert(serde_json::Value::Null);
        }
    }
    let patch = serde_json::json!({ "status": fields });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    };
    Api::<SidecarSet>::all(ctx.client.clone())
        .patch_status(&name, &params, &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(|source| Error::WriteStatus { name, source })
}

/// A Warning event when the pods that cannot be upgraded in place change (upstream's
/// `NotUpgradablePods`), so `kubectl describe` shows it without repeating it every reconcile.
async fn announce_not_upgradable(
    ctx: &Context,
    set: &SidecarSet,
    previous: Option<&SidecarSetStatus>,
    status: &SidecarSetStatus,
) {
    let condition = |s: &SidecarSetStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == PODS_UPGRADABLE)
            .map(|c| (c.status.clone(), c.message.clone()))
    };
    let Some((state, message)) = condition(status) else {
        return;
    };
    if state != "False" || previous.and_then(condition) == Some((state, message.clone())) {
        return;
    }
    let event = Event {
        type_: EventType::Warning,
        reason: "NotUpgradablePods".into(),
        note: Some(message),
        action: "Upgrade".into(),
        secondary: None,
    };
    if let Err(err) = ctx.recorder.publish(&event, &set.object_ref(&())).await {
        warn!(sidecarset = %set.name_any(), error = %err, "cannot publish an event");
    }
}

/// Sets the `SidecarSetUpgradable` condition of pods this SidecarSet cannot upgrade in place,
/// and clears this SidecarSet's `false` from pods it can upgrade again.
async fn mark_upgradable(
    ctx: &Context,
    set: &SidecarSet,
    owned: &[Arc<PodSummary>],
    views: &[PodView<'_>],
    current: &CurrentHashes,
    now: &Time,
) -> Result<(), Error> {
    let name = set.name_any();
    for (pod, v) in owned.iter().zip(views) {
        let upgradable = match classify(v, current, true) {
            PodState::NotUpgradable => false,
            PodState::Inactive | PodState::NotSelected => continue,
            _ => true,
        };
        let Some(condition) = upgradable_condition(pod, &name, upgradable, now) else {
            continue;
        };
        let api = Api::<PodSummary>::namespaced(
            ctx.client.clone(),
            pod.metadata.namespace.as_deref().unwrap_or_default(),
        );
        let patch = serde_json::json!({ "status": { "conditions": [condition] } });
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..Default::default()
        };
        match api
            .patch_status(&pod.name_any(), &params, &Patch::Strategic(&patch))
            .await
        {
            Ok(written) => ctx.remember(written),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(source) => {
                return Err(Error::PodCondition {
                    pod: pod_key(pod),
                    source,
                });
            }
        }
    }
    Ok(())
}

#[derive(Debug, Default)]
struct UpgradeOutcome {
    upgraded: usize,
    /// Patches the apiserver refused because the pod changed since it was read.
    refused: usize,
}

/// What became of one pod of a batch.
enum PodUpgrade {
    Upgraded,
    /// It changed since it was read, or is gone: the next reconcile sees it afresh.
    Changed,
    /// Its annotations make an upgrade impossible; said in a Warning event.
    Impossible,
}

/// Upgrades `targets`, a few at a time. A pod that changed meanwhile is left for the next try;
/// the first other failure is returned after the rest were tried.
async fn upgrade_pods(
    ctx: &Context,
    set: &SidecarSet,
    current: &CurrentHashes,
    targets: Vec<Arc<PodSummary>>,
    now: &Time,
) -> Result<UpgradeOutcome, Error> {
    let set_name = set.name_any();
    let results: Vec<_> = futures::stream::iter(targets)
        .map(|pod| upgrade_one(ctx, set, current, pod, now))
        .buffer_unordered(UPGRADE_CONCURRENCY)
        .collect()
        .await;
    let mut outcome = UpgradeOutcome::default();
    let mut first_error = None;
    for result in results {
        match result {
            Ok(PodUpgrade::Upgraded) => outcome.upgraded += 1,
            Ok(PodUpgrade::Changed) => outcome.refused += 1,
            Ok(PodUpgrade::Impossible) => {}
            Err(err) => {
                first_error.get_or_insert(err);
            }
        }
    }
    if outcome.upgraded > 0 {
        info!(sidecarset = %set_name, pods = outcome.upgraded, "upgraded sidecars in place");
    }
    match first_error {
        Some(err) => Err(err),
        None => Ok(outcome),
    }
}

/// Upgrades one pod.
async fn upgrade_one(
    ctx: &Context,
    set: &SidecarSet,
    current: &CurrentHashes,
    pod: Arc<PodSummary>,
    now: &Time,
) -> Result<PodUpgrade, Error> {
    // A batch of thousands of pods takes a while: once the SidecarSet has changed, the rest
    // waits for the next reconcile rather than getting a version that is already old.
    let changed = ctx
        .sidecarsets
        .get(&ObjectRef::from_obj(set))
        .is_some_and(|now| now.metadata.generation != set.metadata.generation);
    if changed {
        return Ok(PodUpgrade::Changed);
    }
    let key = pod_key(&pod);
    let api = Api::<PodSummary>::namespaced(
        ctx.client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
    );
    // patchPodMetadata reads annotations the cache does not keep.
    let pod = if set.spec.patch_pod_metadata.is_empty() {
        pod
    } else {
        match api.get(&pod.name_any()).await {
            Ok(live) => Arc::new(live),
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(PodUpgrade::Changed),
            Err(source) => return Err(upgrade_failed(ctx, set, key, source).await),
        }
    };
    let upgrade = match upgrade_patch(&pod, set, current, now) {
        Ok(upgrade) => upgrade,
        Err(err) => {
            refuse_pod(ctx, set, &key, &err).await;
            return Ok(PodUpgrade::Impossible);
        }
    };
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    };
    match api
        .patch(&pod.name_any(), &params, &Patch::<()>::Json(upgrade.patch))
        .await
    {
        Ok(written) => {
            debug!(pod = %key, containers = ?upgrade.changed, "sidecars upgraded");
            ctx.remember(written);
            Ok(PodUpgrade::Upgraded)
        }
        // A failed `test` (the pod changed since it was read), a conflict, or a pod gone.
        Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409 | 422) => Ok(PodUpgrade::Changed),
        Err(source) => Err(upgrade_failed(ctx, set, key, source).await),
    }
}

/// A pod the apiserver would not let us read or patch (RBAC, a webhook, a timeout): said on the
/// SidecarSet as well as in the log, since the rollout stalls on it until it is fixed.
async fn upgrade_failed(
    ctx: &Context,
    set: &SidecarSet,
    pod: String,
    source: kube::Error,
) -> Error {
    // The apiserver's own message says it best ("... cannot get resource pods ..."); kube's
    // rendering of the whole Status would not fit an event.
    let cause = match &source {
        kube::Error::Api(status) => status.message.clone(),
        other => error_chain(other),
    };
    upgrade_failed_event(ctx, set, format!("pod {pod}: {cause}")).await;
    Error::UpgradePod { pod, source }
}

/// Creates, updates and deletes the SidecarSet's pre-download jobs to match `decision`. Every
/// job is tried; the first failure is returned (the reconcile is retried with backoff).
async fn sync_jobs(
    ctx: &Context,
    set: &SidecarSet,
    knobs: &Knobs,
    decision: &Decision,
    existing: &[Arc<ImagePullJob>],
) -> Result<(), Error> {
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    };
    let mut first_error = None;
    let is = |j: &ImagePullJob, namespace: &str, name: &str| {
        j.metadata.namespace.as_deref() == Some(namespace)
            && j.metadata.name.as_deref() == Some(name)
    };
    for plan in decision.jobs() {
        let wanted = predownload::job(set, plan, knobs);
        let api = Api::<ImagePullJob>::namespaced(ctx.client.clone(), &plan.namespace);
        let key = format!("{}/{}", plan.namespace, plan.name);
        match existing.iter().find(|j| is(j, &plan.namespace, &plan.name)) {
            Some(job) => {
                let Some(patch) = predownload::job_update(job, &wanted) else {
                    continue;
                };
                if let Err(source) = api.patch(&plan.name, &params, &Patch::Merge(&patch)).await {
                    first_error.get_or_insert(Error::Job { job: key, source });
                }
            }
            None => match api.create(&PostParams::default(), &wanted).await {
                Ok(created) => {
                    let note = format!(
                        "created ImagePullJob {key} to pull {} on {} node(s) before their pods are upgraded",
                        plan.image,
                        plan.nodes.len()
                    );
                    let related = Some(created.object_ref(&()));
                    let reason = "CreatedImagePullJob";
                    publish(ctx, set, EventType::Normal, reason, note, related).await;
                }
                // Our store lags behind an earlier create: nothing to do.
                Err(kube::Error::Api(s)) if s.code == 409 && s.reason == "AlreadyExists" => {
                    let ours = api.get(&plan.name).await.ok().is_some_and(|j| {
                        j.owner_references()
                            .iter()
                            .any(|o| Some(o.uid.as_str()) == set.metadata.uid.as_deref())
                    });
                    if !ours {
                        let note = format!(
                            "cannot create ImagePullJob {key} for {}: an ImagePullJob of that name exists and is not this SidecarSet's",
                            plan.image
                        );
                        publish(
                            ctx,
                            set,
                            EventType::Warning,
                            "FailedCreateImagePullJob",
                            note,
                            Some(wanted.object_ref(&())),
                        )
                        .await;
                        first_error.get_or_insert(Error::JobTaken { job: key });
                    }
                }
                Err(source) => {
                    let note = format!(
                        "cannot create ImagePullJob {key} for {}: {source}",
                        plan.image
                    );
                    publish(
                        ctx,
                        set,
                        EventType::Warning,
                        "FailedCreateImagePullJob",
                        note,
                        Some(wanted.object_ref(&())),
                    )
                    .await;
                    first_error.get_or_insert(Error::Job { job: key, source });
                }
            },
        }
    }
    for job in existing {
        let namespace = job.metadata.namespace.clone().unwrap_or_default();
        let name = job.name_any();
        if decision
            .jobs()
            .iter()
            .any(|p| is(job, &p.namespace, &p.name))
        {
            continue;
        }
        let api = Api::<ImagePullJob>::namespaced(ctx.client.clone(), &namespace);
        match api.delete(&name, &DeleteParams::background()).await {
            Ok(_) => {
                debug!(sidecarset = %set.name_any(), job = %name, "deleted a pre-download job")
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(source) => {
                first_error.get_or_insert(Error::Job {
                    job: format!("{namespace}/{name}"),
                    source,
                });
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// One Warning event naming every pre-download annotation that cannot be used, once per set of
/// values.
async fn warn_knobs(ctx: &Context, set: &SidecarSet, warnings: &[KnobWarning]) {
    if warnings.is_empty() {
        return;
    }
    let note = warnings
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    let key = format!("{}/{note}", set.metadata.uid.as_deref().unwrap_or_default());
    let first = ctx
        .warned
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key);
    if first {
        let reason = "InvalidPreDownloadAnnotation";
        publish(ctx, set, EventType::Warning, reason, note, None).await;
    }
}

/// A Normal event when pre-download turns to skipped, saying why.
async fn announce_skipped(
    ctx: &Context,
    set: &SidecarSet,
    previous: Option<&SidecarSetStatus>,
    status: &SidecarSetStatus,
) {
    let reason = |s: &SidecarSetStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == IMAGE_PREDOWNLOAD)
            .map(|c| (c.reason.clone(), c.message.clone()))
    };
    let Some((now, message)) = reason(status) else {
        return;
    };
    let skipped = now == "NotUpdateStrategy" || now == "OneBatch";
    if skipped && previous.and_then(reason).map(|(r, _)| r) != Some(now.clone()) {
        // One series per skip reason: a later, different skip keeps its own message.
        let event = Event {
            type_: EventType::Normal,
            reason: "ImagePreDownloadSkipped".into(),
            note: Some(message),
            action: now,
            secondary: None,
        };
        if let Err(err) = ctx.recorder.publish(&event, &set.object_ref(&())).await {
            warn!(sidecarset = %set.name_any(), error = %err, "cannot publish an event");
        }
    }
}

/// Publishes an event on the SidecarSet; failing to is logged, never fatal.
async fn publish(
    ctx: &Context,
    set: &SidecarSet,
    type_: EventType,
    reason: &str,
    note: String,
    related: Option<ObjectReference>,
) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: related,
    };
    if let Err(err) = ctx.recorder.publish(&event, &set.object_ref(&())).await {
        warn!(sidecarset = %set.name_any(), error = %err, "cannot publish an event");
    }
}

/// A pod whose annotations make an upgrade impossible: said on the SidecarSet.
async fn refuse_pod(ctx: &Context, set: &SidecarSet, pod: &str, err: &UpgradeError) {
    warn!(sidecarset = %set.name_any(), pod, error = %err, "cannot upgrade the pod");
    upgrade_failed_event(ctx, set, format!("pod {pod}: {err}")).await;
}

/// The Warning event `UpgradeFailed` on the SidecarSet.
async fn upgrade_failed_event(ctx: &Context, set: &SidecarSet, note: String) {
    let event = Event {
        type_: EventType::Warning,
        reason: "UpgradeFailed".into(),
        note: Some(note),
        action: "Upgrade".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &set.object_ref(&())).await {
        warn!(error = %e, "cannot publish an event");
    }
}
