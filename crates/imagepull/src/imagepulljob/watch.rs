//! The ImagePullJob controller's watches and triggers: jobs, NodeImages (shared store with the
//! reconciles) and the pods of the shared pod feed, and which jobs each change wakes.

use std::collections::HashSet;
use std::future::Future;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use kube::api::Api;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{PredicateConfig, WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::watch;
use tracing::{info, warn};

use super::nodeimage_changes::{Change, NodeImageChanges};
use super::reconcile::{error_policy, key, reconcile};
use super::{Context, NAME, WrittenNodeImages, secrets};
use crate::lean_nodeimage::NodeImageFeed;
use kruise_rs_api::imagepulljob::ImagePullJob;
use kruise_rs_controller::metrics::ManagerMetrics;
use kruise_rs_controller::pod_feed::PodFeed;
use kruise_rs_controller::pod_summary::PodSummary;
use kruise_rs_controller::shutdown::run_until_shutdown;
use kruise_rs_controller::{CacheSync, ControllerOptions};
use kruise_rs_kube::backoff::{self, Backoff};
use kruise_rs_kube::error_chain::error_chain;
use kruise_rs_kube::events::Recorder;

/// Jobs a NodeImage event concerns (`nodeimage_changes`): jobs whose tags on `node` changed,
/// and, when the node itself appeared, went or was relabelled, running jobs whose selector could
/// include it (`node` is `None` at the end of a re-list, for the nodes gone meanwhile).
fn jobs_for_nodeimage(
    jobs: &Store<ImagePullJob>,
    node: Option<&str>,
    change: &Change,
) -> Vec<ObjectRef<ImagePullJob>> {
    if change.owners.is_empty() && !change.node {
        return Vec::new();
    }
    jobs.state()
        .into_iter()
        .filter(|job| {
            let owner = job
                .metadata
                .uid
                .as_deref()
                .is_some_and(|u| change.owners.iter().any(|o| o == u));
            let running = || {
                job.status
                    .as_ref()
                    .is_none_or(|s| s.completion_time.is_none())
            };
            let may_target = || match &job.spec.template.selector {
                Some(sel) if !sel.names.is_empty() => {
                    node.is_none_or(|node| sel.names.iter().any(|n| n == node))
                }
                _ => true,
            };
            owner || (change.node && running() && may_target())
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
            job.spec.template.pod_selector.is_some()
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
/// jobs) from `pods`, the watch `controllers::run` shares with the SidecarSet controller, and
/// NodeImages from `nodeimages` (of `opts.scoped_watch_config()`), shared with the NodeImage
/// controller.
pub async fn run_with_feeds(
    client: Client,
    opts: ControllerOptions,
    pods: PodFeed,
    nodeimages: NodeImageFeed,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    // Streaming lists where the server serves them (see `initial_list`): no whole-list response
    // in memory, no "too old resourceVersion" re-lists (the bench logged those with cache-served
    // lists).
    let scoped = opts.scoped_watch_config();
    let workers = opts.workers.imagepulljob;

    let backoff = Arc::new(Backoff::default());
    let released: Arc<Mutex<HashSet<String>>> = Arc::default();
    let JobWatch {
        events: job_events,
        store: job_reader,
        listed: jobs_listed_rx,
        sweep_wakes,
    } = watch_jobs(&client, scoped, &opts.metrics, &backoff, &released);
    let controller = Controller::for_stream(job_events, job_reader);
    let jobs = controller.store();
    let jobs_for_pods = jobs.clone();
    // Every NodeImage event, deletions included, as the pods below.
    let written = Arc::new(WrittenNodeImages::default());
    let written_seen = written.clone();
    let mut changes = NodeImageChanges::default();
    let (nodeimages, nodeimages_ready, nodeimage_triggers) =
        nodeimages.into_triggers(move |event| {
            written_seen.saw(event);
            let change = changes.observe(event);
            let node = match event {
                watcher::Event::Apply(ni)
                | watcher::Event::InitApply(ni)
                | watcher::Event::Delete(ni) => ni.metadata.name.as_deref(),
                watcher::Event::Init | watcher::Event::InitDone => None,
            };
            jobs_for_nodeimage(&jobs, node, &change)
        });
    // Every pod event, deletions included: a job's nodes follow its pods either way.
    let (pods, pods_ready, pod_triggers) = pods.into_triggers(move |event| match event {
        watcher::Event::Apply(pod)
        | watcher::Event::InitApply(pod)
        | watcher::Event::Delete(pod) => jobs_for_pod(&jobs_for_pods, pod),
        watcher::Event::Init | watcher::Event::InitDone => Vec::new(),
    });
    let caches_ready_rx = watch_readiness(
        nodeimages_ready,
        pods_ready,
        jobs_listed_rx,
        opts.synced.clone(),
    );
    let metrics = opts.metrics.clone();
    let sweeper = sweep_copies(
        client.clone(),
        opts.daemon_config_namespace.clone(),
        controller.store(),
        sweep_wakes,
    );
    let ctx = Arc::new(Context {
        caches_ready: caches_ready_rx,
        recorder: Recorder::for_manager(client.clone()),
        client,
        nodeimages,
        pods,
        jobs: controller.store(),
        refreshed: Mutex::default(),
        written,
        released,
        backoff,
        opts,
        host_locks: Default::default(),
        pace: Default::default(),
    });
    let job_store = controller.store();
    let shutdown = shutdown.shared();
    let running = controller
        .reconcile_on(nodeimage_triggers)
        .reconcile_on(pod_triggers)
        // No debounce: the triggers that arrive while a job reconciles are served by its next
        // reconcile, which starts at most `pace::MIN_GAP` after this one started (crate::pace).
        .with_config(controller::Config::default().concurrency(workers))
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
    let running = async move {
        tokio::select! {
            () = running => {}
            () = sweeper => {}
        }
    };
    run_until_shutdown(running, shutdown, &job_store).await;
}

/// The job watch as the controller reads it, and what follows its events.
struct JobWatch<S> {
    /// Each job applied, for `Controller::for_stream`.
    events: S,
    store: Store<ImagePullJob>,
    /// True once the first full list is in the store.
    listed: watch::Receiver<bool>,
    /// Changed on every full list and every deletion: when the pull-secret copies may list jobs
    /// that are gone.
    sweep_wakes: watch::Receiver<()>,
}

/// Watches the ImagePullJobs `config` selects into a store, and on each event: sets the jobs'
/// nodes gauge, forgets the failure counts of deleted jobs, drops deleted jobs from `released`
/// and wakes the copy sweep.
fn watch_jobs(
    client: &Client,
    config: watcher::Config,
    metrics: &ManagerMetrics,
    backoff: &Arc<Backoff>,
    released: &Arc<Mutex<HashSet<String>>>,
) -> JobWatch<impl Stream<Item = Result<ImagePullJob, watcher::Error>> + Send + 'static> {
    // The jobs' nodes gauge follows every job event, deletions included, from the store the
    // event has just been applied to (mid-relist the store is not swapped yet: wait for
    // InitDone). A status write is an event too.
    let (job_reader, job_writer) = reflector::store();
    let job_metrics = metrics.clone();
    let job_counts = job_reader.clone();
    let (jobs_listed, jobs_listed_rx) = watch::channel(false);
    let forget_deleted = backoff::forget_deleted(backoff.clone(), job_reader.clone(), "", key);
    // Every full list (the first one, at start) and every deletion: the copies may list jobs
    // that are gone (decision 0030). A change made while a sweep runs makes one more sweep.
    let (wake_sweep, sweep_wakes) = watch::channel(());
    let released_jobs = released.clone();
    let released_store = job_reader.clone();
    let events = watcher(Api::<ImagePullJob>::all(client.clone()), config)
        .default_backoff()
        .reflect(job_writer)
        .inspect(forget_deleted)
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
            match event {
                Ok(watcher::Event::Delete(job)) => {
                    if let Some(uid) = job.metadata.uid.as_ref() {
                        lock(&released_jobs).remove(uid);
                    }
                    wake_sweep.send_replace(());
                }
                Ok(watcher::Event::InitDone) => {
                    let live: HashSet<String> = released_store
                        .state()
                        .iter()
                        .filter_map(|job| job.metadata.uid.clone())
                        .collect();
                    lock(&released_jobs).retain(|uid| live.contains(uid));
                    wake_sweep.send_replace(());
                }
                _ => {}
            }
        })
        .applied_objects()
        // Past the store, which keeps every write: the job's own status writes wake nobody.
        .predicate_filter(wake_key, PredicateConfig::default());
    JobWatch {
        events,
        store: job_reader,
        listed: jobs_listed_rx,
        sweep_wakes,
    }
}

/// What of a job, when it changes, calls for a reconcile: the object itself (uid), its spec
/// (generation), the metadata the reconcile reads or writes (labels, annotations, owners,
/// finalizers, deletion), and whether it has finished, after which the next reconcile releases
/// its secret copies or waits for its TTL. Not the rest of its status: the reconcile writes that
/// itself, from the NodeImages, and its event used to wake the job once more for nothing (about
/// 100 of the 250 reconciles per 1,000 daemon reports in the fan-out bench's wake phase). A job
/// with nodes pulling is read again every 5 s anyway (`reconcile::PROGRESS_REFRESH`).
fn wake_key(job: &ImagePullJob) -> Option<u64> {
    let meta = &job.metadata;
    let mut hasher = DefaultHasher::new();
    meta.uid.hash(&mut hasher);
    meta.generation.hash(&mut hasher);
    meta.labels.hash(&mut hasher);
    meta.annotations.hash(&mut hasher);
    meta.finalizers.hash(&mut hasher);
    meta.deletion_timestamp.is_some().hash(&mut hasher);
    for owner in meta.owner_references.iter().flatten() {
        (
            &owner.uid,
            &owner.kind,
            &owner.api_version,
            owner.controller,
        )
            .hash(&mut hasher);
    }
    job.status
        .as_ref()
        .is_some_and(|s| s.completion_time.is_some())
        .hash(&mut hasher);
    Some(hasher.finish())
}

/// Resolves to true once the NodeImage and pod caches are ready, and marks the controller
/// synced once the jobs are listed too. (`Store::wait_until_ready` wakes only one of several
/// waiters: one task waits and tells all.)
fn watch_readiness(
    mut nodeimages_ready: watch::Receiver<bool>,
    mut pods_ready: watch::Receiver<bool>,
    mut jobs_listed: watch::Receiver<bool>,
    synced: CacheSync,
) -> watch::Receiver<bool> {
    let (caches_ready, caches_ready_rx) = watch::channel(false);
    tokio::spawn(async move {
        if nodeimages_ready.wait_for(|r| *r).await.is_ok()
            && pods_ready.wait_for(|r| *r).await.is_ok()
        {
            let _ = caches_ready.send(true);
            if jobs_listed.wait_for(|listed| *listed).await.is_ok() {
                synced.mark(NAME);
            }
        }
    });
    caches_ready_rx
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// First wait after a failed sweep; doubled on each failure in a row, up to [`SWEEP_RETRY_MAX`].
const SWEEP_RETRY: Duration = Duration::from_secs(1);
const SWEEP_RETRY_MAX: Duration = Duration::from_secs(300);

/// Sweeps the copies in `daemon_ns` (see [`secrets::sweep`]) each time `wakes` changes, and
/// again after a delay when a sweep fails. Ends when the job watch is gone.
async fn sweep_copies(
    client: Client,
    daemon_ns: String,
    jobs: Store<ImagePullJob>,
    mut wakes: watch::Receiver<()>,
) {
    let mut retry = SWEEP_RETRY;
    while wakes.changed().await.is_ok() {
        loop {
            wakes.borrow_and_update();
            let in_store =
                |ns: &str, name: &str| jobs.get(&ObjectRef::new(name).within(ns)).is_some();
            match secrets::sweep(&client, &daemon_ns, in_store).await {
                Ok(swept) => {
                    if swept > 0 {
                        info!(swept, namespace = %daemon_ns, "released the copies of deleted jobs");
                    }
                    retry = SWEEP_RETRY;
                    break;
                }
                Err(err) => {
                    warn!(error = %error_chain(&err), retry_in = ?retry, "cannot sweep the pull-secret copies");
                    tokio::time::sleep(retry).await;
                    retry = (retry * 2).min(SWEEP_RETRY_MAX);
                }
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use kruise_rs_api::imagepulljob::ImagePullJobStatus;

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

    #[test]
    fn a_job_wakes_on_its_spec_metadata_and_finishing_not_on_the_rest_of_its_status() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
        use kruise_rs_api::imagepulljob::ImagePullJobStatus;
        let mut job = ImagePullJob::new("j", Default::default());
        job.metadata.uid = Some("uid-1".into());
        job.metadata.generation = Some(1);
        job.status = Some(ImagePullJobStatus {
            desired: 10,
            active: 2,
            ..Default::default()
        });
        let base = wake_key(&job);
        let changed = |edit: &dyn Fn(&mut ImagePullJob)| {
            let mut edited = job.clone();
            edit(&mut edited);
            wake_key(&edited) != base
        };
        // What the reconcile writes into the status while the job runs.
        assert!(!changed(&|j| {
            let s = j.status.as_mut().unwrap();
            s.active = 1;
            s.succeeded = 1;
            s.progress = Some("10% on n1".into());
            s.message = Some("waiting".into());
            s.start_time = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        }));
        assert!(!changed(&|j| j.metadata.resource_version = Some("9".into())));
        // Finishing, and everything a user or another writer changes.
        assert!(changed(&|j| {
            j.status.as_mut().unwrap().completion_time =
                Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH))
        }));
        assert!(changed(&|j| j.metadata.generation = Some(2)));
        assert!(changed(&|j| j.metadata.uid = Some("uid-2".into())));
        assert!(changed(&|j| {
            j.metadata.annotations = Some([("a".to_owned(), "b".to_owned())].into())
        }));
        assert!(changed(&|j| {
            j.metadata.labels = Some([("a".to_owned(), "b".to_owned())].into())
        }));
        assert!(changed(&|j| j.metadata.finalizers = Some(vec!["f".into()])));
        assert!(changed(&|j| {
            j.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH))
        }));
        assert!(changed(&|j| {
            j.metadata.owner_references = Some(vec![OwnerReference {
                uid: "list".into(),
                kind: "ImageListPullJob".into(),
                controller: Some(true),
                ..Default::default()
            }])
        }));
    }

    #[test]
    fn a_nodeimage_change_wakes_its_owners_and_on_node_changes_the_jobs_that_may_target_it() {
        use kruise_rs_api::imagepulljob::{ImagePullJobNodeSelector, ImagePullJobStatus};
        let (store, mut writer) = reflector::store::<ImagePullJob>();
        let mut add = |name: &str, names: &[&str], done: bool| {
            let mut job = ImagePullJob::new(name, Default::default());
            job.metadata.namespace = Some("ns".into());
            job.metadata.uid = Some(format!("uid-{name}"));
            if !names.is_empty() {
                job.spec.template.selector = Some(ImagePullJobNodeSelector {
                    names: names.iter().map(|n| n.to_string()).collect(),
                    ..Default::default()
                });
            }
            if done {
                job.status = Some(ImagePullJobStatus {
                    completion_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                    )),
                    ..Default::default()
                });
            }
            writer.apply_watcher_event(&watcher::Event::Apply(job));
        };
        add("everywhere", &[], false);
        add("on-n1", &["n1"], false);
        add("on-n2", &["n2"], false);
        add("finished", &[], true);
        let woken = |node: Option<&str>, owners: &[&str], node_changed: bool| {
            let change = Change {
                owners: owners.iter().map(|o| format!("uid-{o}")).collect(),
                node: node_changed,
            };
            let mut names: Vec<String> = jobs_for_nodeimage(&store, node, &change)
                .into_iter()
                .map(|r| r.name)
                .collect();
            names.sort();
            names
        };
        // A report on one job's tag: that job alone, finished or not.
        assert_eq!(woken(Some("n1"), &["on-n2"], false), ["on-n2"]);
        assert_eq!(woken(Some("n1"), &["finished"], false), ["finished"]);
        assert!(woken(Some("n1"), &[], false).is_empty());
        // The node changed: running jobs that may target it, and the owners.
        assert_eq!(
            woken(Some("n1"), &["finished"], true),
            ["everywhere", "finished", "on-n1"]
        );
        // The end of a re-list (nodes gone, names unknown): every running job.
        assert_eq!(woken(None, &[], true), ["everywhere", "on-n1", "on-n2"]);
    }
}
