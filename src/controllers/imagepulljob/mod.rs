//! The ImagePullJob controller: writes each target node's share of a job into its NodeImage, at
//! most `parallelism` nodes at a time and in target order, and sums the nodes' reports into the
//! job's status.
//!
//! - [`targets`]: which nodes, in which order, and where each stands;
//! - [`entry`]: what a job writes into a NodeImage;
//! - [`status`]: the job's status, which nodes start next, when the job next needs attention.
//!
//! Writes go through [`update_images`] (guarded JSON patches), so jobs sharing a node never lose
//! each other's entries. The NodeImage store can lag behind our own writes; the objects our
//! patches return are kept until the store catches up ([`Context::fresher`]), so a reconcile
//! never counts a node it just started as not started, and `parallelism` holds exactly.

pub mod entry;
pub mod secrets;
pub mod status;
pub mod targets;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::watch;
use tracing::{info, warn};

use self::entry::{JobRequest, with_job_entry};
use self::secrets::SecretsError;
use self::status::{compute_status, next_deadline, nodes_to_start, parallelism};
use self::targets::{NodeState, Target, node_state, select_nodes};
use super::ControllerOptions;
use super::shared::backoff::Backoff;
use super::shared::nodeimage_images::{ImagesWriteError, update_images};
use super::shared::pod_feed::PodFeed;
use super::shared::pod_summary::PodSummary;
use super::shared::shutdown::run_until_shutdown;
use crate::apis::imagepulljob::{ImagePullJob, ImagePullJobStatus};
use crate::apis::nodeimage::NodeImage;
use crate::apis::well_known::DELETION_PROTECTION_FINALIZER;
use crate::error_chain::error_chain;
use crate::events::Recorder;
use crate::image::ImageRef;

/// Field manager of everything this controller writes.
pub const FIELD_MANAGER: &str = "kruise-rs-imagepulljob";
/// The controller's name in metrics and in [`super::CacheSync`].
pub const NAME: &str = "imagepulljob";

/// How long a reconcile waits for the first lists of NodeImages and Pods.
const CACHE_WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum Error {
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
    #[error("updating the finalizers of ImagePullJob {name}")]
    Finalizer {
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
pub struct Context {
    client: Client,
    /// True once the NodeImage and Pod stores hold a first full list.
    caches_ready: watch::Receiver<bool>,
    nodeimages: Store<NodeImage>,
    pods: Store<PodSummary>,
    /// NodeImages as our own patches returned them, until the store has caught up with them.
    written: Mutex<HashMap<String, Arc<NodeImage>>>,
    backoff: Backoff,
    opts: ControllerOptions,
    recorder: Recorder,
}

impl Context {
    /// The newer of the stored NodeImage and the one our last patch returned. Spec writes bump
    /// `generation`, and the store sees events in order, so a stored object with a lower
    /// generation than our write is entirely older than it.
    fn fresher(&self, stored: Arc<NodeImage>) -> Arc<NodeImage> {
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
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

    /// Forgets the written objects the store has caught up with (or that are gone), so the
    /// overlay holds only writes still in flight, whatever the jobs do next.
    fn forget_caught_up(&self) {
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        written.retain(|name, ours| {
            self.nodeimages
                .get(&ObjectRef::new(name))
                .is_some_and(|stored| stored.metadata.generation < ours.metadata.generation)
        });
    }

    fn remember(&self, mut written: NodeImage) {
        // A patch response carries managedFields, by far the largest part of a NodeImage here.
        written.managed_fields_mut().clear();
        let mut map = self.written.lock().unwrap_or_else(|e| e.into_inner());
        map.insert(written.name_any(), Arc::new(written));
    }
}

/// Jobs a NodeImage change may concern: running jobs whose selector could include the node,
/// and any job the NodeImage names as an owner.
fn jobs_for_nodeimage(
    jobs: &Store<ImagePullJob>,
    nodeimage: &NodeImage,
) -> Vec<ObjectRef<ImagePullJob>> {
    let node = nodeimage.name_any();
    let owners: Vec<&str> = nodeimage
        .spec
        .images
        .values()
        .flat_map(|i| i.tags.iter())
        .flat_map(|t| t.owner_references.iter())
        .filter_map(|o| o.uid.as_deref())
        .collect();
    jobs.state()
        .into_iter()
        .filter(|job| {
            let running = job
                .status
                .as_ref()
                .is_none_or(|s| s.completion_time.is_none());
            let owner = job
                .metadata
                .uid
                .as_deref()
                .is_some_and(|u| owners.contains(&u));
            let may_target = match &job.spec.selector {
                Some(sel) if !sel.names.is_empty() => sel.names.contains(&node),
                _ => true,
            };
            owner || (running && may_target)
        })
        .map(|job| ObjectRef::from_obj(&*job))
        .collect()
}

/// Running podSelector jobs in the pod's namespace.
fn jobs_for_pod(jobs: &Store<ImagePullJob>, pod: &PodSummary) -> Vec<ObjectRef<ImagePullJob>> {
    let namespace = pod.namespace();
    jobs.state()
        .into_iter()
        .filter(|job| {
            job.spec.pod_selector.is_some()
                && job.namespace() == namespace
                && job
                    .status
                    .as_ref()
                    .is_none_or(|s| s.completion_time.is_none())
        })
        .map(|job| ObjectRef::from_obj(&*job))
        .collect()
}

/// Runs the ImagePullJob controller until `shutdown` resolves, reading pods (for `podSelector`
/// jobs) from `pods`, the watch `controllers::run` shares with the SidecarSet controller.
pub async fn run_with_pods(
    client: Client,
    opts: ControllerOptions,
    pods: PodFeed,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    // Streaming lists where the server serves them (see `initial_list`): no whole-list response
    // in memory, no "too old resourceVersion" re-lists (the bench logged those with cache-served
    // lists).
    let scoped = opts.scoped_watch_config();
    let (nodeimages, nodeimage_writer) = reflector::store();
    let nodeimage_events = watcher(Api::<NodeImage>::all(client.clone()), scoped.clone())
        .default_backoff()
        .modify(|n: &mut NodeImage| n.managed_fields_mut().clear())
        .reflect(nodeimage_writer)
        .touched_objects();

    // The jobs' nodes gauge follows every job event, deletions included, from the store the
    // event has just been applied to (mid-relist the store is not swapped yet: wait for
    // InitDone). A status write is an event too.
    let (job_reader, job_writer) = reflector::store();
    let job_metrics = opts.metrics.clone();
    let job_counts = job_reader.clone();
    let (jobs_listed, mut jobs_listed_rx) = watch::channel(false);
    let job_events = watcher(Api::<ImagePullJob>::all(client.clone()), scoped)
        .default_backoff()
        .reflect(job_writer)
        .inspect(move |event| {
            if matches!(
                event,
                Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone)
            ) {
                job_metrics.set_imagepulljob_nodes(node_counts(&job_counts.state()));
            }
            if matches!(event, Ok(watcher::Event::InitDone)) {
                jobs_listed.send_replace(true);
            }
        })
        .applied_objects();
    let controller = Controller::for_stream(job_events, job_reader);
    let jobs = controller.store();
    let jobs_for_pods = jobs.clone();
    // Every pod event, deletions included: a job's nodes follow its pods either way.
    let (pods, mut pods_ready, pod_triggers) = pods.into_triggers(move |event| match event {
        watcher::Event::Apply(pod)
        | watcher::Event::InitApply(pod)
        | watcher::Event::Delete(pod) => jobs_for_pod(&jobs_for_pods, pod),
        watcher::Event::Init | watcher::Event::InitDone => Vec::new(),
    });
    // `Store::wait_until_ready` wakes only one of several waiters; one task waits and tells all.
    let (caches_ready, caches_ready_rx) = watch::channel(false);
    let ni_store = nodeimages.clone();
    let synced = opts.synced.clone();
    tokio::spawn(async move {
        if ni_store.wait_until_ready().await.is_ok() && pods_ready.wait_for(|r| *r).await.is_ok() {
            let _ = caches_ready.send(true);
            if jobs_listed_rx.wait_for(|listed| *listed).await.is_ok() {
                synced.mark(NAME);
            }
        }
    });
    let metrics = opts.metrics.clone();
    let ctx = Arc::new(Context {
        caches_ready: caches_ready_rx,
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "kruise-rs-manager".into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        ),
        client,
        nodeimages,
        pods,
        written: Mutex::default(),
        backoff: Backoff::default(),
        opts,
    });
    let job_store = controller.store();
    let shutdown = shutdown.shared();
    let running = controller
        .watches_stream(nodeimage_events, move |n| jobs_for_nodeimage(&jobs, &n))
        .reconcile_on(pod_triggers)
        // Many NodeImage events arrive together while a job fans out; one reconcile serves them.
        .with_config(controller::Config::default().debounce(Duration::from_millis(50)))
        .graceful_shutdown_on(shutdown.clone())
        .run(
            move |job, ctx| metrics.timed(NAME, reconcile(job, ctx)),
            error_policy,
            ctx,
        )
        .for_each(|result| async move {
            if let Err(err) = result {
                warn!(error = %err, "imagepulljob controller");
            }
        });
    run_until_shutdown(running, shutdown, &job_store).await;
}

/// The jobs' nodes by state (desired, active, succeeded, failed), summed over their statuses.
fn node_counts(jobs: &[Arc<ImagePullJob>]) -> [i64; 4] {
    jobs.iter()
        .filter_map(|job| job.status.as_ref())
        .fold([0; 4], |sum, s| {
            let counts = [s.desired, s.active, s.succeeded, s.failed];
            std::array::from_fn(|i| sum[i] + i64::from(counts[i]))
        })
}

fn key(job: &ImagePullJob) -> String {
    format!("{}/{}", job.namespace().unwrap_or_default(), job.name_any())
}

fn error_policy(job: Arc<ImagePullJob>, err: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.backoff.failed(&key(&job));
    warn!(job = %key(&job), error = %error_chain(err), retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

fn now() -> Time {
    Time(Timestamp::now())
}

fn until(at: Timestamp) -> Duration {
    let now = Timestamp::now();
    let wait = at.duration_since(now);
    Duration::try_from(wait)
        .unwrap_or(Duration::ZERO)
        .max(Duration::from_secs(1))
}

async fn reconcile(job: Arc<ImagePullJob>, ctx: Arc<Context>) -> Result<Action, Error> {
    // An empty store would read as "no nodes": an Always job would complete at once. Bounded,
    // so a shutdown never waits on a cache that will not fill.
    let mut ready = ctx.caches_ready.clone();
    match tokio::time::timeout(CACHE_WAIT, ready.wait_for(|r| *r)).await {
        Ok(Ok(_)) => {}
        _ => return Err(Error::CachesNotReady),
    }
    let action = reconcile_job(&job, &ctx).await;
    ctx.forget_caught_up();
    let action = action?;
    ctx.backoff.succeeded(&key(&job));
    Ok(action)
}

async fn reconcile_job(job: &ImagePullJob, ctx: &Context) -> Result<Action, Error> {
    let name = job.name_any();
    let namespace = job.namespace().unwrap_or_default();
    let jobs: Api<ImagePullJob> = Api::namespaced(ctx.client.clone(), &namespace);
    let daemon_ns = ctx.opts.daemon_config_namespace.as_str();

    if job.metadata.deletion_timestamp.is_some() {
        // Its NodeImage entries are collected by the NodeImage controller once it is gone; the
        // secret copies are ours to release.
        let_go(ctx, &jobs, job).await?;
        return Ok(Action::await_change());
    }

    if let Some(status) = job.status.as_ref().filter(|s| s.completion_time.is_some()) {
        let_go(ctx, &jobs, job).await?;
        return match next_deadline(job, status) {
            Some(expiry) if expiry <= Timestamp::now() => {
                info!(job = %key(job), "deleting the finished job: ttlSecondsAfterFinished passed");
                match jobs.delete(&name, &DeleteParams::background()).await {
                    Ok(_) => Ok(Action::await_change()),
                    Err(kube::Error::Api(s)) if s.code == 404 => Ok(Action::await_change()),
                    Err(source) => Err(Error::Delete { name, source }),
                }
            }
            Some(expiry) => Ok(Action::requeue(until(expiry))),
            None => Ok(Action::await_change()),
        };
    }

    let image = match ImageRef::parse(&job.spec.image) {
        Ok(image) => image,
        Err(err) => {
            return refuse(
                job,
                ctx,
                &jobs,
                "InvalidImage",
                format!("spec.image: {err}"),
            )
            .await;
        }
    };
    let parallelism = match parallelism(job) {
        Ok(p) => p,
        Err(msg) => return refuse(job, ctx, &jobs, "InvalidParallelism", msg).await,
    };

    // The daemons may read secrets only in their own namespace: copy the job's there, and keep
    // the job from vanishing before the copies are released.
    let pull_secrets = if job.spec.pull_secrets.is_empty() {
        Vec::new()
    } else {
        set_finalizer(&jobs, job, true).await?;
        let (refs, missing) = secrets::claim(
            &ctx.client,
            daemon_ns,
            &namespace,
            &name,
            &job.spec.pull_secrets,
        )
        .await?;
        if !missing.is_empty() {
            let note = format!(
                "spec.pullSecrets: Secret {} not found in namespace {namespace}; pulling without it",
                missing.join(", ")
            );
            publish(ctx, job, EventType::Warning, "PullSecretNotFound", note).await;
        }
        refs
    };

    let all_nodeimages: Vec<Arc<NodeImage>> = ctx
        .nodeimages
        .state()
        .into_iter()
        .map(|n| ctx.fresher(n))
        .collect();
    let pods = ctx.pods.state();
    let nodes = match select_nodes(
        job,
        all_nodeimages.iter().map(|n| &**n),
        pods.iter().map(|p| &**p),
    ) {
        Ok(nodes) => nodes,
        Err(err) => return refuse(job, ctx, &jobs, "InvalidSelector", err.to_string()).await,
    };
    let by_name: HashMap<String, Arc<NodeImage>> = all_nodeimages
        .into_iter()
        .map(|n| (n.name_any(), n))
        .collect();
    let req = JobRequest::new(
        job,
        image.familiar_name().to_owned(),
        image.nodeimage_tag().to_owned(),
        pull_secrets,
    );
    let job_uid = job.metadata.uid.clone().unwrap_or_default();
    let mut targets: Vec<Target> = nodes
        .into_iter()
        .filter_map(|node| {
            let state = node_state(
                by_name.get(&node)?,
                &req.name,
                &req.tag,
                &job_uid,
                &req.pull_secrets,
            );
            Some(Target { node, state })
        })
        .collect();

    // Start the next nodes, within the parallelism budget.
    let start: Vec<String> = nodes_to_start(&targets, parallelism)
        .into_iter()
        .map(str::to_owned)
        .collect();
    let api: Api<NodeImage> = Api::all(ctx.client.clone());
    let now_time = now();
    // One node after the other, in target order: the order of the writes is the order in which
    // nodes start pulling, which is the point of keeping the order at all.
    let mut results = Vec::with_capacity(start.len());
    for node in start {
        let current = (*by_name[&node]).clone();
        let extra_ttl = ctx.opts.default_ttl_for_always_nodeimage;
        let result = update_images(&api, FIELD_MANAGER, current, |ni| {
            with_job_entry(
                &ni.spec.images,
                ni.status.as_ref(),
                &req,
                &node,
                &now_time,
                extra_ttl,
            )
        })
        .await;
        results.push((node, result));
    }
    let mut first_error = None;
    for (node, result) in results {
        match result {
            Ok(written) => {
                if let Some(written) = written {
                    ctx.remember(written);
                }
                if let Some(t) = targets.iter_mut().find(|t| t.node == node) {
                    t.state = NodeState::Pulling;
                }
            }
            // The node went away meanwhile: it is no target any more.
            Err(ImagesWriteError::NotFound { .. }) => targets.retain(|t| t.node != node),
            Err(err) => {
                warn!(job = %key(job), node, error = %err, "cannot start the pull on a node");
                first_error.get_or_insert(err);
            }
        }
    }

    let status = compute_status(job, &targets, &now_time);
    write_status(&jobs, job, &status).await?;
    if let Some(err) = first_error {
        return Err(err.into());
    }
    Ok(match next_deadline(job, &status) {
        Some(at) => Action::requeue(until(at)),
        None => Action::await_change(),
    })
}

/// Writes `status` unless it is what the job already has.
async fn write_status(
    jobs: &Api<ImagePullJob>,
    job: &ImagePullJob,
    status: &ImagePullJobStatus,
) -> Result<(), Error> {
    if job.status.as_ref() == Some(status) {
        return Ok(());
    }
    let name = job.name_any();
    // A merge patch leaves out what it does not mention: name every field, null for the empty
    // ones, so a node that left `failedNodes` or a cleared message really goes.
    let mut fields = serde_json::to_value(status).expect("a status always serializes");
    if let Some(map) = fields.as_object_mut() {
        for key in ["startTime", "completionTime", "message", "failedNodes"] {
            map.entry(key).or_insert(serde_json::Value::Null);
        }
    }
    let patch = serde_json::json!({ "status": fields });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    };
    jobs.patch_status(&name, &params, &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(|source| Error::WriteStatus { name, source })
}

/// A job that cannot run as written: a Warning event and the reason in `status.message`, then
/// nothing until the job changes.
async fn refuse(
    job: &ImagePullJob,
    ctx: &Context,
    jobs: &Api<ImagePullJob>,
    reason: &str,
    message: String,
) -> Result<Action, Error> {
    warn!(job = %key(job), reason, %message, "job cannot run");
    publish(ctx, job, EventType::Warning, reason, message.clone()).await;
    let mut status = job.status.clone().unwrap_or_default();
    status.message = Some(message);
    write_status(jobs, job, &status).await?;
    Ok(Action::await_change())
}

/// A job done pulling (finished or being deleted) releases its secret copies, then its finalizer.
async fn let_go(ctx: &Context, jobs: &Api<ImagePullJob>, job: &ImagePullJob) -> Result<(), Error> {
    // The finalizer goes on before any copy is made and comes off only after the copies are
    // released: without it there is nothing to release. A finished job is reconciled on every
    // change of the NodeImages it owns; this spares each of those reconciles a GET per secret.
    if !job
        .finalizers()
        .iter()
        .any(|f| f == DELETION_PROTECTION_FINALIZER)
    {
        return Ok(());
    }
    let namespace = job.namespace().unwrap_or_default();
    let daemon_ns = &ctx.opts.daemon_config_namespace;
    secrets::release(
        &ctx.client,
        daemon_ns,
        &namespace,
        &job.name_any(),
        &job.spec.pull_secrets,
    )
    .await?;
    set_finalizer(jobs, job, false).await
}

/// Publishes an event on the job; failing to is logged, never fatal.
async fn publish(ctx: &Context, job: &ImagePullJob, type_: EventType, reason: &str, note: String) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(err) = ctx.recorder.publish(&event, &job.object_ref(&())).await {
        warn!(job = %key(job), error = %err, "cannot publish an event");
    }
}

/// Adds or removes upstream's `apps.kruise.io/deletion-protection` finalizer, guarded by the
/// job's resourceVersion so a concurrent change to the list is never overwritten.
async fn set_finalizer(
    jobs: &Api<ImagePullJob>,
    job: &ImagePullJob,
    present: bool,
) -> Result<(), Error> {
    let mut finalizers = job.finalizers().to_vec();
    let has = finalizers
        .iter()
        .any(|f| f == DELETION_PROTECTION_FINALIZER);
    if has == present {
        return Ok(());
    }
    if present {
        finalizers.push(DELETION_PROTECTION_FINALIZER.to_owned());
    } else {
        finalizers.retain(|f| f != DELETION_PROTECTION_FINALIZER);
    }
    let patch = serde_json::json!({
        "metadata": { "finalizers": finalizers, "resourceVersion": job.resource_version() }
    });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    };
    match jobs
        .patch(&job.name_any(), &params, &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        // Gone already: nothing to protect.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(Error::Finalizer {
            name: job.name_any(),
            source,
        }),
    }
}

#[cfg(test)]
mod metrics_tests {
    use super::*;

    #[test]
    fn node_counts_sum_the_statuses() {
        let job = |status: Option<ImagePullJobStatus>| {
            let mut job = ImagePullJob::new("j", Default::default());
            job.status = status;
            Arc::new(job)
        };
        let status = |desired, active, succeeded, failed| ImagePullJobStatus {
            desired,
            active,
            succeeded,
            failed,
            ..Default::default()
        };
        let jobs = [
            job(Some(status(3, 1, 1, 1))),
            job(None),
            job(Some(status(2, 0, 2, 0))),
        ];
        assert_eq!(node_counts(&jobs), [5, 1, 3, 1]);
        assert_eq!(node_counts(&[]), [0; 4]);
    }
}
