//! The chaos run (`make test-chaos`, tests/cluster/chaos.sh): the installed system under load
//! while faults strike on a schedule, its invariants checked all along by watches of the test's
//! own, straight to the apiserver.
//!
//! The load: pods created through the webhook all the time (real ones, every
//! [`CREATE_EVERY`], the oldest deleted to keep at most [`CHURN_PODS`]) in a namespace a
//! SidecarSet selects; a second SidecarSet rolled v1 → v2 → v3 → v1 ... over a Deployment's
//! [`STABLE_PODS`] pods at maxUnavailable [`MAX_UNAVAILABLE`], one rollout after another; and
//! ImagePullJobs one after another at parallelism [`PARALLELISM`] over the real node (pulled by
//! the daemon through containerd) and [`FAKE_NODES`] NodeImages answered by played daemons.
//!
//! The faults, in a seeded order that has every kind once per round, one after the system is
//! healthy again from the last: a manager pod deleted with grace 0 (the leader or the other), the
//! leader's process killed (SIGKILL: the kubelet restarts the container), the leader's Lease
//! stolen (another holder written in: the leader must step down; the Lease expires to a replica
//! after its duration) or deleted, containerd, the kubelet and kube-apiserver restarted
//! (tests/cluster/restart.sh: the same command line in the cluster's namespaces).
//!
//! The invariants (each break is collected, all are printed, the test fails on any):
//! - every pod a SidecarSet selects was stored with its sidecar and the injected-list
//!   annotation (checked on each create's answer and on the watch's first sight of each pod);
//! - every refused creation is recorded with its time and message, and is legitimate only when
//!   its message says the webhook (or the apiserver) could not be reached or was starting AND it
//!   happened inside a fault's window: from the fault until the system is healthy again (both
//!   manager replicas ready and behind the webhook Service's endpoints, a replica holding the
//!   Lease, the node Ready) plus [`WINDOW_SLACK`];
//! - never more than maxUnavailable pods in flight (patched while ready, not yet running the new
//!   image ready; a pod patched while not ready was unavailable already, and the controller
//!   takes such pods without counting them, as upstream does), never more than `parallelism`
//!   nodes pulling one job's image;
//! - the rollout and the job running when the faults stop finish within [`FINISH_TIMEOUT`],
//!   and the system is healthy within [`RECOVERY_TIMEOUT`] of each fault;
//! - a stolen Lease makes its holder log that it lost it;
//! - no manager or daemon log holds a panic (the kubelet's log files, scanned all along and
//!   before each pod deletion).
//!
//! `KRUISE_RS_CHAOS_MINUTES` sets how long the faults go on (default 0: one round, however long
//! its recoveries take; a round once started always completes);
//! `KRUISE_RS_CHAOS_SEED` replays an order of faults (timing still varies).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Endpoints, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kruise_rs_api::well_known::{FAKE_NODEIMAGE, SIDECARSET_INJECTED_LIST};
use kruise_rs_api::{ImagePullJob, NodeImage, SidecarSet};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::time::Instant;

use crate::sidecarset::{create_sidecarset_injecting, deployment, running_pods, sidecarset};
use crate::support::{
    self, Cluster, DAEMON, LEASE, SYSTEM_NAMESPACE, TIMEOUT, lease_holder, logged_lost_lease,
    manager_pods, wait_for,
};

use kruise_rs_testkit::played_daemon;
use kruise_rs_testkit::rollout::container_image;

const MINUTES_VAR: &str = "KRUISE_RS_CHAOS_MINUTES";
const SEED_VAR: &str = "KRUISE_RS_CHAOS_SEED";
/// One round: every kind of fault once.
const DEFAULT_MINUTES: f64 = 0.0;

const CREATE_EVERY: Duration = Duration::from_millis(500);
const CHURN_PODS: usize = 8;
const STABLE_PODS: usize = 5;
const MAX_UNAVAILABLE: usize = 2;
const PARALLELISM: usize = 2;
const FAKE_NODES: usize = 5;
/// How long the system may take to be healthy again after a fault.
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long after the faults the rollout and the job then running must be finished.
const FINISH_TIMEOUT: Duration = Duration::from_secs(180);
/// How long a refusal may come after the system looked healthy again: endpoints reach the
/// apiserver's informer a moment after the test reads them.
const WINDOW_SLACK: Duration = Duration::from_secs(3);
/// Calm between one fault's recovery and the next fault (drawn from this range, ms).
const CALM_MS: std::ops::Range<u64> = 4000..10_000;
/// How long a stolen Lease's holder may take to log that it lost it (retry period 2 s, renew
/// deadline 10 s).
const STEP_DOWN_TIMEOUT: Duration = Duration::from_secs(20);
const WEBHOOK_SERVICE: &str = "kruise-rs-webhook";
const THIEF: &str = "chaos-lease-thief";
/// The daemon's probe port (the chart's `http` port).
const DAEMON_PORT: u16 = 10221;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    ManagerPodDeleted,
    LeaderKilled,
    LeaseStolen,
    LeaseDeleted,
    ContainerdRestarted,
    KubeletRestarted,
    ApiserverRestarted,
}

const FAULTS: [Fault; 7] = [
    Fault::ManagerPodDeleted,
    Fault::LeaderKilled,
    Fault::LeaseStolen,
    Fault::LeaseDeleted,
    Fault::ContainerdRestarted,
    Fault::KubeletRestarted,
    Fault::ApiserverRestarted,
];

/// Everything the watches and drivers record, with times in seconds since the start.
#[derive(Default)]
struct Record {
    violations: Vec<String>,
    /// Pods created by the churn and admitted (their answer read).
    admitted: usize,
    admitted_dry_run: usize,
    /// (time, class, message) of each refused or failed creation.
    refusals: Vec<(f64, String, String)>,
    /// Pods seen (watch or create answer) without the sidecars their SidecarSet injects.
    uninjected: BTreeSet<String>,
    /// Pods the watch saw, by uid.
    seen_pods: usize,
    /// (kind, start, healthy again) of each fault.
    faults: Vec<(Fault, f64, f64)>,
    max_in_flight: usize,
    at_max_in_flight: Vec<String>,
    /// Patches the watch saw land on a pod that was not ready (taken without counting).
    taken_unready: usize,
    max_pulling: usize,
    at_max_pulling: String,
    /// (revision image, seconds) of each finished rollout.
    rollouts: Vec<(String, f64)>,
    /// (job, seconds, succeeded, failed) of each finished job.
    jobs: Vec<(String, f64, i32, i32)>,
    panics: BTreeSet<String>,
    /// The rolled SidecarSet's image from each time on (when the write was answered).
    roll_images: Vec<(f64, String)>,
    /// The longest a dry-run pod's injected image had not been the set's (seconds).
    max_injection_lag: f64,
    /// How far each log file has been scanned for panics.
    log_offsets: HashMap<PathBuf, u64>,
}

type Shared = Arc<Mutex<Record>>;

struct Clock(Instant);

impl Clock {
    fn now(&self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
}

/// What the test's pods and SidecarSets are called.
#[derive(Clone)]
struct Names {
    namespace: String,
    churn_app: String,
    inject_set: String,
    stable_app: String,
    roll_set: String,
}

fn violation(record: &Shared, clock: &Clock, what: String) {
    eprintln!("chaos: {:7.1}s VIOLATION {what}", clock.now());
    record.lock().unwrap().violations.push(what);
}

// --- pods ------------------------------------------------------------------------------------

/// The sidecar (and set) a pod needs, by its `app` label: `None` for pods no set selects.
fn required_sidecar<'a>(pod: &Pod, names: &'a Names) -> Option<(&'static str, &'a str)> {
    let app = pod.labels().get("app")?;
    if *app == names.churn_app {
        Some(("sidecar", names.inject_set.as_str()))
    } else if *app == names.stable_app {
        Some(("rolled", names.roll_set.as_str()))
    } else {
        None
    }
}

/// Why `pod` lacks what its SidecarSet injects, if it does.
fn missing_injection(pod: &Pod, names: &Names) -> Option<String> {
    let (container, set) = required_sidecar(pod, names)?;
    let has_container = pod
        .spec
        .as_ref()
        .is_some_and(|s| s.containers.iter().any(|c| c.name == container));
    let listed = pod
        .annotations()
        .get(SIDECARSET_INJECTED_LIST)
        .is_some_and(|list| list.split(',').any(|n| n.trim() == set));
    match (has_container, listed) {
        (true, true) => None,
        _ => Some(format!(
            "pod {} (uid {}) stored without {set}'s injection: container {container} {}, \
             {SIDECARSET_INJECTED_LIST} {:?}",
            pod.name_any(),
            pod.metadata.uid.as_deref().unwrap_or("?"),
            if has_container { "present" } else { "missing" },
            pod.annotations().get(SIDECARSET_INJECTED_LIST)
        )),
    }
}

/// Whether `pod`'s rolled sidecar runs its spec's image, ready.
fn runs_its_image(pod: &Pod, digests: &HashMap<String, String>) -> bool {
    let Some(image) = container_image(pod, "rolled") else {
        return true;
    };
    let Some(digest) = digests.get(image) else {
        return false;
    };
    crate::sidecarset::status(pod, "rolled")
        .is_some_and(|s| s.ready && s.image_id.ends_with(digest.as_str()))
}

/// What the pod watch keeps per pod.
struct Seen {
    /// The rolled sidecar's image as last seen.
    image: Option<String>,
    /// Patched since first seen (its image changed at some point).
    patched: bool,
    /// Not ready as last seen before its latest patch: the rollout took it "for free" (it was
    /// unavailable already; the controller's rule, as upstream's), so it is not in flight
    /// because of the rollout.
    taken_unready: bool,
    /// Ready as last seen.
    ready: bool,
    in_flight: bool,
    /// The pod and its rolled sidecar as last seen: name, spec image, status imageID, ready.
    state: String,
}

/// Watches the namespace's pods: the injection of each pod at first sight, and the rollout's
/// pods in flight (patched at least once and not running their spec's image ready) at every
/// event, in the order the apiserver applied them.
async fn watch_pods(
    pods: Api<Pod>,
    names: Names,
    digests: HashMap<String, String>,
    record: Shared,
    clock: Arc<Clock>,
    listed: tokio::sync::oneshot::Sender<()>,
) {
    let mut listed = Some(listed);
    let mut seen: HashMap<String, Seen> = HashMap::new();
    let mut live: BTreeSet<String> = BTreeSet::new();
    let mut relist: BTreeSet<String> = BTreeSet::new();
    let events = watcher(pods, watcher::Config::default()).default_backoff();
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        let pod = match event {
            Ok(watcher::Event::Init) => {
                relist.clear();
                continue;
            }
            Ok(watcher::Event::InitDone) => {
                live = std::mem::take(&mut relist);
                if let Some(tx) = listed.take() {
                    let _ = tx.send(());
                }
                None
            }
            Ok(watcher::Event::InitApply(pod)) => {
                relist.insert(pod.metadata.uid.clone().unwrap_or_default());
                Some(pod)
            }
            Ok(watcher::Event::Apply(pod)) => {
                live.insert(pod.metadata.uid.clone().unwrap_or_default());
                Some(pod)
            }
            Ok(watcher::Event::Delete(pod)) => {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                live.remove(&uid);
                if let Some(s) = seen.get_mut(&uid) {
                    s.in_flight = false;
                }
                None
            }
            Err(e) => {
                eprintln!("chaos: {:7.1}s pod watch: {e}", clock.now());
                continue;
            }
        };
        if let Some(pod) = pod {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let image = container_image(&pod, "rolled").map(str::to_owned);
            let entry = seen.entry(uid).or_insert_with(|| {
                let mut r = record.lock().unwrap();
                r.seen_pods += 1;
                if let Some(why) = missing_injection(&pod, &names) {
                    r.uninjected.insert(pod.name_any());
                    r.violations.push(why);
                }
                Seen {
                    image: image.clone(),
                    patched: false,
                    taken_unready: false,
                    ready: pod_ready(&pod),
                    in_flight: false,
                    state: String::new(),
                }
            });
            if image != entry.image {
                entry.patched = true;
                entry.taken_unready = !entry.ready;
                if entry.taken_unready {
                    record.lock().unwrap().taken_unready += 1;
                }
                entry.image = image.clone();
            }
            entry.ready = pod_ready(&pod);
            entry.in_flight = entry.patched
                && !entry.taken_unready
                && pod.metadata.deletion_timestamp.is_none()
                && !runs_its_image(&pod, &digests);
            let status = crate::sidecarset::status(&pod, "rolled");
            entry.state = format!(
                "{} spec {} imageID {} ready {} (pod ready {})",
                pod.name_any(),
                image.as_deref().unwrap_or("-"),
                status.map_or("-", |s| s.image_id.as_str()),
                status.is_some_and(|s| s.ready),
                entry.ready
            );
        }
        let flying: Vec<String> = seen
            .iter()
            .filter(|(uid, s)| s.in_flight && live.contains(*uid))
            .map(|(_, s)| s.state.clone())
            .collect();
        let mut r = record.lock().unwrap();
        if flying.len() > r.max_in_flight {
            r.max_in_flight = flying.len();
            r.at_max_in_flight = flying;
            let at = format!("at {:.1}s", clock.now());
            r.at_max_in_flight.insert(0, at);
        }
    }
}

/// The classes of refused creations that name an unavailability: legitimate inside a fault's
/// window.
const UNAVAILABILITIES: [&str; 5] = [
    "webhook unreachable",
    "webhook starting",
    "webhook cannot read the apiserver",
    "apiserver unavailable",
    "apiserver unreachable",
];

/// How a refused or failed pod creation reads: the class says whether it is a legitimate
/// unavailability (one of [`UNAVAILABILITIES`]; `None`: it is not).
fn classify(error: &kube::Error) -> (String, Option<&'static str>) {
    match error {
        kube::Error::Api(status) => {
            let message = format!("{} ({})", status.message, status.code);
            let class = if status.message.contains("failed calling webhook") {
                Some("webhook unreachable")
            } else if status.message.contains("kruise-rs webhook is starting") {
                Some("webhook starting")
            } else if status.message.contains("cannot confirm which SidecarSets") {
                // The webhook's own read of the SidecarSets failed (decision 0031): a replica
                // deleted with grace 0 answers a moment with a void token.
                Some("webhook cannot read the apiserver")
            } else if status.code >= 500 || status.code == 429 {
                Some("apiserver unavailable")
            } else {
                None
            };
            (message, class)
        }
        other => (other.to_string(), Some("apiserver unreachable")),
    }
}

/// How long after the rolled SidecarSet changed a dry-run pod may still get its former image:
/// each manager replica injects from its own watch of SidecarSets.
const STALE_INJECTION: Duration = Duration::from_secs(10);

/// How long before `sent` the image `injected` stopped being the rolled set's (0: it was current
/// then, or became so by `answered`), from the set's `history` of (time written, image); `None`
/// when the set never had it.
fn staleness(history: &[(f64, String)], injected: &str, sent: f64, answered: f64) -> Option<f64> {
    history
        .iter()
        .enumerate()
        // Written a moment after our patch's answer is read: 2 s of leeway for the new image.
        .filter(|(_, (from, image))| image == injected && *from - 2.0 <= answered)
        .map(|(i, _)| match history.get(i + 1) {
            Some((until, _)) => (sent - until).max(0.0),
            None => 0.0,
        })
        .min_by(f64::total_cmp)
}

/// Creates a pod every [`CREATE_EVERY`], checks each answer's injection, deletes the oldest
/// beyond [`CHURN_PODS`]; runs until `stop`. Every other one is a dry run of a pod the rolled
/// SidecarSet selects (not stored: the rollout's pods stay the Deployment's), whose injected
/// image must be the set's current one, or one it had within [`STALE_INJECTION`].
async fn churn(
    client: Client,
    names: Names,
    image: String,
    record: Shared,
    clock: Arc<Clock>,
    stop: Arc<AtomicBool>,
) {
    let pods: Api<Pod> = Api::namespaced(client, &names.namespace);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"generateName": "churn-", "labels": {"app": names.churn_app}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "app", "image": image,
                            "command": ["/bin/busybox", "sh", "-c",
                                        "trap 'exit 0' TERM; while true; do sleep 1; done"]}]
        }
    }))
    .expect("a pod");
    let mut rolled: Pod = pod.clone();
    rolled.metadata.generate_name = Some("rolled-dry-run-".to_owned());
    rolled.metadata.labels = Some(BTreeMap::from([(
        "app".to_owned(),
        names.stable_app.clone(),
    )]));
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let mut created: std::collections::VecDeque<String> = Default::default();
    let mut n = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let tick = Instant::now();
        n += 1;
        let dry = n.is_multiple_of(2);
        let params = if dry {
            &dry_run
        } else {
            &PostParams::default()
        };
        let template = if dry { &rolled } else { &pod };
        let sent = clock.now();
        let outcome =
            tokio::time::timeout(Duration::from_secs(30), pods.create(params, template)).await;
        let at = clock.now();
        match outcome {
            Ok(Ok(stored)) => {
                let mut r = record.lock().unwrap();
                if dry {
                    r.admitted_dry_run += 1;
                } else {
                    r.admitted += 1;
                    created.push_back(stored.name_any());
                }
                if let Some(why) = missing_injection(&stored, &names) {
                    r.uninjected
                        .insert(format!("{} (dry run: {dry})", stored.name_any()));
                    r.violations
                        .push(format!("at {at:.1}s, the create's answer: {why}"));
                } else if let Some(image) = container_image(&stored, "rolled") {
                    match staleness(&r.roll_images, image, sent, at) {
                        Some(lag) => {
                            r.max_injection_lag = r.max_injection_lag.max(lag);
                            if lag > STALE_INJECTION.as_secs_f64() {
                                let what = format!(
                                    "a dry-run pod sent at {sent:.1}s got {image}, which the \
                                     rolled SidecarSet left {lag:.1}s before: {:?}",
                                    r.roll_images
                                );
                                r.violations.push(what);
                            }
                        }
                        None => {
                            let what = format!(
                                "a dry-run pod sent at {sent:.1}s got {image}, which the rolled \
                                 SidecarSet never had: {:?}",
                                r.roll_images
                            );
                            r.violations.push(what);
                        }
                    }
                }
            }
            Ok(Err(e)) => {
                let (message, class) = classify(&e);
                eprintln!("chaos: {at:7.1}s creation refused: {message}");
                record.lock().unwrap().refusals.push((
                    at,
                    class.unwrap_or("other").to_owned(),
                    message,
                ));
            }
            Err(_) => {
                eprintln!("chaos: {at:7.1}s creation did not answer within 30 s");
                record.lock().unwrap().refusals.push((
                    at,
                    "no answer".to_owned(),
                    "no answer within 30 s".to_owned(),
                ));
            }
        }
        while created.len() > CHURN_PODS {
            let oldest = created.front().expect("non-empty").clone();
            match pods.delete(&oldest, &DeleteParams::default()).await {
                Ok(_) => {
                    created.pop_front();
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    created.pop_front();
                }
                // The apiserver restarting: deleted on a later round.
                Err(_) => break,
            }
        }
        tokio::time::sleep(CREATE_EVERY.saturating_sub(tick.elapsed())).await;
    }
}

// --- the rollouts ----------------------------------------------------------------------------

fn rollout_done(set: &SidecarSet) -> bool {
    let Some(status) = &set.status else {
        return false;
    };
    let all = STABLE_PODS as i32;
    status.observed_generation == set.metadata.generation
        && status.matched_pods == all
        && status.updated_pods == all
        && status.updated_ready_pods == all
}

/// Rolls the rolled sidecar through `images` in turn, each once the last has finished, until
/// `stop`; returns when the rollout it had started then has finished (or at `deadline_after_stop`
/// past the stop, saying so).
async fn roll(
    client: Client,
    names: Names,
    images: Vec<String>,
    record: Shared,
    clock: Arc<Clock>,
    stop: Arc<AtomicBool>,
) -> Result<(), String> {
    let sets: Api<SidecarSet> = Api::all(client);
    let mut rng = fastrand::Rng::new();
    let mut next = 1;
    let mut stopped_at: Option<Instant> = None;
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        let image = images[next % images.len()].clone();
        next += 1;
        let patch = json!({"spec": {"containers": [
            {"name": "rolled", "image": image, "imagePullPolicy": "IfNotPresent"}
        ]}});
        let started = clock.now();
        // The apiserver may be restarting: asked again until it lands.
        while let Err(e) = sets
            .patch(
                &names.roll_set,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            eprintln!("chaos: {:7.1}s patching the SidecarSet: {e}", clock.now());
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        record
            .lock()
            .unwrap()
            .roll_images
            .push((clock.now(), image.clone()));
        eprintln!("chaos: {started:7.1}s rollout to {image} started");
        loop {
            if stop.load(Ordering::Relaxed) {
                let at = *stopped_at.get_or_insert_with(Instant::now);
                if at.elapsed() > FINISH_TIMEOUT {
                    let set = sets.get(&names.roll_set).await.ok();
                    return Err(format!(
                        "the rollout to {image} (started at {started:.1}s) did not finish \
                         within {FINISH_TIMEOUT:?} after the faults stopped: status {:?}",
                        set.and_then(|s| s.status)
                    ));
                }
            }
            if sets
                .get(&names.roll_set)
                .await
                .is_ok_and(|s| rollout_done(&s))
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let took = clock.now() - started;
        eprintln!(
            "chaos: {:7.1}s rollout to {image} finished in {took:.1}s",
            clock.now()
        );
        record.lock().unwrap().rollouts.push((image, took));
        if stopped_at.is_some() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(rng.u64(1000..3000))).await;
    }
}

// --- the image pull jobs ---------------------------------------------------------------------

/// The repository the jobs pull tags of (pushed by the test, one tag per job).
const PULL_REPOSITORY: &str = "e2e/chaos-pull";

fn tag_entry(ni: &NodeImage, image: &str, tag: &str) -> Option<i64> {
    let entry = ni
        .spec
        .images
        .get(image)?
        .tags
        .iter()
        .find(|t| t.tag == tag)?;
    Some(
        serde_json::to_value(entry).ok()?["version"]
            .as_i64()
            .unwrap_or(0),
    )
}

fn finished_version(ni: &NodeImage, image: &str, tag: &str) -> Option<i64> {
    let tag = ni
        .status
        .as_ref()?
        .image_statuses
        .get(image)?
        .tags
        .iter()
        .find(|t| t.tag == tag)?;
    tag.completion_time.as_ref()?;
    Some(tag.version.unwrap_or(0))
}

/// The job tags `ni` is pulling: entries in the spec whose version the status has not finished.
fn busy_tags(ni: &NodeImage, repository: &str) -> BTreeSet<String> {
    let Some(image) = ni.spec.images.get(repository) else {
        return BTreeSet::new();
    };
    image
        .tags
        .iter()
        .map(|t| t.tag.to_string())
        .filter(|tag| {
            let version = tag_entry(ni, repository, tag);
            version.is_some() && finished_version(ni, repository, tag) != version
        })
        .collect()
}

/// The tags each node is pulling, as the NodeImage watch says. A re-list replaces the whole
/// state at its end: taken one object at a time, its fresh objects sat beside the others' state
/// from before the watch broke and counted nodes that never pulled at once (CI at f43f0a3,
/// after the apiserver's restart: 3 nodes on one job of parallelism 2, one of them finished
/// while the watch was down and listed after the two that had started since).
#[derive(Default)]
struct PullingNodes {
    by_node: BTreeMap<String, BTreeSet<String>>,
    /// What a re-list has brought so far (between `Init` and `InitDone`).
    relist: Option<BTreeMap<String, BTreeSet<String>>>,
}

impl PullingNodes {
    /// Records `event`; once the state changed, the most nodes pulling one tag, and which.
    fn observe(
        &mut self,
        event: &watcher::Event<NodeImage>,
        repository: &str,
    ) -> Option<(usize, String)> {
        match event {
            watcher::Event::Init => {
                self.relist = Some(BTreeMap::new());
                return None;
            }
            watcher::Event::InitApply(ni) if self.relist.is_some() => {
                if let Some(relist) = self.relist.as_mut() {
                    relist.insert(ni.name_any(), busy_tags(ni, repository));
                }
                return None;
            }
            watcher::Event::InitDone => self.by_node = self.relist.take()?,
            watcher::Event::Apply(ni) | watcher::Event::InitApply(ni) => {
                self.by_node
                    .insert(ni.name_any(), busy_tags(ni, repository));
            }
            watcher::Event::Delete(ni) => {
                self.by_node.remove(&ni.name_any());
            }
        }
        let mut per_tag: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (node, tags) in &self.by_node {
            for tag in tags {
                per_tag.entry(tag).or_default().push(node);
            }
        }
        per_tag
            .into_iter()
            .max_by_key(|(_, nodes)| nodes.len())
            .map(|(tag, nodes)| (nodes.len(), format!("{tag}: {nodes:?}")))
    }
}

/// Watches every NodeImage and records the most nodes pulling one job tag at once.
async fn watch_pulls(client: Client, repository: String, record: Shared, clock: Arc<Clock>) {
    let api: Api<NodeImage> = Api::all(client);
    let mut pulling = PullingNodes::default();
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    while let Some(item) = stream.next().await {
        let event = match item {
            Ok(event) => event,
            Err(e) => {
                eprintln!("chaos: {:7.1}s NodeImage watch: {e}", clock.now());
                continue;
            }
        };
        if let Some((most, at)) = pulling.observe(&event, &repository) {
            let mut r = record.lock().unwrap();
            if most > r.max_pulling {
                r.max_pulling = most;
                r.at_max_pulling = at;
            }
        }
    }
}

/// Creates ImagePullJobs one after another (a new tag each), each deleted once complete, until
/// `stop`; returns once the job it had started then is complete, or with the reason it is not
/// within [`FINISH_TIMEOUT`] of the stop.
#[allow(clippy::too_many_arguments)]
async fn pull_jobs(
    client: Client,
    cluster: &'static Cluster,
    namespace: String,
    nodes: Vec<String>,
    record: Shared,
    clock: Arc<Clock>,
    stop: Arc<AtomicBool>,
) -> Result<(), String> {
    let jobs: Api<ImagePullJob> = Api::namespaced(client, &namespace);
    let mut stopped_at: Option<Instant> = None;
    for n in 1.. {
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        let tag = format!("j{n}");
        let source = cluster.test_image_source(["v1", "v2", "v3"][n % 3]);
        let destination = format!("{}/{PULL_REPOSITORY}:{tag}", cluster.registry);
        tokio::task::spawn_blocking(move || support::skopeo_copy(&source, &destination))
            .await
            .expect("skopeo");
        let name = format!("pull-{tag}");
        let job: ImagePullJob = serde_json::from_value(json!({
            "apiVersion": "apps.kruise.io/v1beta1",
            "kind": "ImagePullJob",
            "metadata": {"name": name},
            "spec": {
                "image": format!("{}/{PULL_REPOSITORY}:{tag}", cluster.registry),
                "selector": {"names": nodes},
                "parallelism": PARALLELISM,
                "pullPolicy": {"timeoutSeconds": 60, "backoffLimit": 3},
                "completionPolicy": {"type": "Always"}
            }
        }))
        .expect("an ImagePullJob");
        while let Err(e) = jobs.create(&PostParams::default(), &job).await {
            if matches!(&e, kube::Error::Api(s) if s.code == 409) {
                break;
            }
            eprintln!("chaos: {:7.1}s creating {name}: {e}", clock.now());
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let started = clock.now();
        let status = loop {
            if stop.load(Ordering::Relaxed) {
                let at = *stopped_at.get_or_insert_with(Instant::now);
                if at.elapsed() > FINISH_TIMEOUT {
                    let job = jobs.get(&name).await.ok();
                    return Err(format!(
                        "ImagePullJob {name} (created at {started:.1}s) did not complete within \
                         {FINISH_TIMEOUT:?} after the faults stopped: status {:?}",
                        job.and_then(|j| j.status)
                    ));
                }
            }
            if let Some(status) = jobs.get(&name).await.ok().and_then(|j| j.status)
                && status.completion_time.is_some()
            {
                break status;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        let took = clock.now() - started;
        eprintln!(
            "chaos: {:7.1}s {name} complete in {took:.1}s: {} succeeded, {} failed",
            clock.now(),
            status.succeeded,
            status.failed
        );
        record
            .lock()
            .unwrap()
            .jobs
            .push((name.clone(), took, status.succeeded, status.failed));
        while let Err(e) = jobs.delete(&name, &DeleteParams::default()).await {
            if matches!(&e, kube::Error::Api(s) if s.code == 404) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        if stopped_at.is_some() {
            return Ok(());
        }
    }
    Ok(())
}

// --- health and faults -----------------------------------------------------------------------

fn pod_ready(pod: &Pod) -> bool {
    crate::sidecarset::ready(pod)
}

/// Healthy: the node Ready; both manager replicas ready, and exactly their addresses ready
/// behind the webhook Service; one of them holding the Lease; the daemon ready. Else what is
/// not.
async fn healthy(client: &Client, node: &str) -> Result<(), String> {
    let nodes: Api<Node> = Api::all(client.clone());
    let n = nodes
        .get(node)
        .await
        .map_err(|e| format!("reading the node: {e}"))?;
    let ready = n
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if !ready {
        return Err("the node is not Ready".to_owned());
    }
    let managers = manager_pods(client)
        .await
        .ok_or("listing the manager pods failed")?;
    let unready: Vec<String> = managers
        .iter()
        .filter(|p| !pod_ready(p))
        .map(|p| p.name_any())
        .collect();
    if managers.len() != 2 || !unready.is_empty() {
        return Err(format!(
            "{} manager pods, not ready: {unready:?}",
            managers.len()
        ));
    }
    let mut ips: Vec<String> = managers
        .iter()
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .collect();
    ips.sort();
    let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let e = endpoints
        .get(WEBHOOK_SERVICE)
        .await
        .map_err(|e| format!("reading the webhook endpoints: {e}"))?;
    let subsets = e.subsets.unwrap_or_default();
    let mut ready_ips: Vec<String> = subsets
        .iter()
        .flat_map(|s| s.addresses.iter().flatten().map(|a| a.ip.clone()))
        .collect();
    ready_ips.sort();
    let not_ready: Vec<String> = subsets
        .iter()
        .flat_map(|s| s.not_ready_addresses.iter().flatten().map(|a| a.ip.clone()))
        .collect();
    if ready_ips != ips || !not_ready.is_empty() {
        return Err(format!(
            "webhook endpoints {ready_ips:?} (not ready {not_ready:?}), manager pods at {ips:?}"
        ));
    }
    let holder = lease_holder(client).await.ok_or("nobody holds the Lease")?;
    if !managers.iter().any(|p| p.name_any() == holder) {
        return Err(format!(
            "the Lease is held by {holder}, no live manager pod"
        ));
    }
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let ds = daemonsets
        .get(DAEMON)
        .await
        .map_err(|e| format!("reading the daemon DaemonSet: {e}"))?
        .status
        .ok_or("the daemon DaemonSet has no status")?;
    if ds.number_ready != 1 {
        return Err(format!("{} daemon pods ready", ds.number_ready));
    }
    // The kubelet marks the daemon unready only after three failed probes 10 s apart: its own
    // /readyz says at once.
    daemon_readyz(client).await
}

/// The daemon pod's own `/readyz`, asked directly at its pod IP (inside the cluster's network
/// namespace).
async fn daemon_readyz(client: &Client) -> Result<(), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let list = pods
        .list(&ListParams::default().labels("app.kubernetes.io/component=daemon"))
        .await
        .map_err(|e| format!("listing the daemon pods: {e}"))?;
    let ip = list
        .items
        .iter()
        .find(|p| p.metadata.deletion_timestamp.is_none())
        .and_then(|p| p.status.as_ref()?.pod_ip.clone())
        .ok_or("no daemon pod with an IP")?;
    let ask = async {
        let mut stream = tokio::net::TcpStream::connect((ip.as_str(), DAEMON_PORT)).await?;
        stream
            .write_all(b"GET /readyz HTTP/1.0\r\nHost: daemon\r\n\r\n")
            .await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&answer).into_owned())
    };
    let answer = tokio::time::timeout(Duration::from_secs(3), ask)
        .await
        .map_err(|_| format!("the daemon's /readyz at {ip} did not answer within 3 s"))?
        .map_err(|e| format!("the daemon's /readyz at {ip}: {e}"))?;
    let status = answer.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) == Some("200") {
        Ok(())
    } else {
        Err(format!("the daemon's /readyz: {status}"))
    }
}

/// The pid of the manager process of pod `pod` on this machine (its POD_NAME environment).
fn manager_pid(pod: &str) -> Option<u32> {
    let want = format!("POD_NAME={pod}");
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let argv: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_manager = argv.first().is_some_and(|a| a.ends_with(b"kruise-rs"))
            && argv.get(1).is_some_and(|a| *a == b"manager");
        if !is_manager {
            continue;
        }
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if environ.split(|b| *b == 0).any(|v| v == want.as_bytes()) {
            return Some(pid);
        }
    }
    None
}

/// Every new line holding "panicked" in the logs the kubelet keeps for kruise-system's pods:
/// each file is read on from `offsets` (how far it was read before; updated), whole lines only.
fn scan_panics(log_dir: &Path, offsets: &mut HashMap<PathBuf, u64>) -> Vec<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut found = Vec::new();
    let Ok(pods) = std::fs::read_dir(log_dir) else {
        return found;
    };
    let mut stack: Vec<PathBuf> = pods
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{SYSTEM_NAMESPACE}_"))
        })
        .map(|e| e.path())
        .collect();
    while let Some(path) = stack.pop() {
        if path.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&path) {
                stack.extend(entries.flatten().map(|e| e.path()));
            }
            continue;
        }
        let Ok(mut file) = std::fs::File::open(&path) else {
            continue;
        };
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        let offset = offsets
            .get(&path)
            .copied()
            .filter(|o| *o <= len)
            .unwrap_or(0);
        let mut bytes = Vec::new();
        if file.seek(SeekFrom::Start(offset)).is_err() || file.read_to_end(&mut bytes).is_err() {
            continue;
        }
        let whole = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        offsets.insert(path.clone(), offset + whole as u64);
        for line in String::from_utf8_lossy(&bytes[..whole])
            .lines()
            .filter(|l| l.contains("panicked"))
        {
            found.push(format!("{}: {line}", path.display()));
        }
    }
    found
}

fn note_panics(record: &Shared, log_dir: &Path) {
    let mut offsets = std::mem::take(&mut record.lock().unwrap().log_offsets);
    let found = scan_panics(log_dir, &mut offsets);
    let mut r = record.lock().unwrap();
    // A scan that ran meanwhile read some files further: keep the furthest.
    for (path, offset) in std::mem::take(&mut r.log_offsets) {
        let mine = offsets.entry(path).or_default();
        *mine = (*mine).max(offset);
    }
    r.log_offsets = offsets;
    r.panics.extend(found);
}

struct Faulter {
    client: Client,
    state_dir: PathBuf,
    log_dir: PathBuf,
    node: String,
    record: Shared,
    clock: Arc<Clock>,
    rng: fastrand::Rng,
}

impl Faulter {
    async fn restart(&self, name: &'static str) -> Result<String, String> {
        let state = self.state_dir.clone();
        let down = tokio::task::spawn_blocking(move || support::restart_process(&state, name))
            .await
            .expect("the restart task")?;
        Ok(format!("{name} answering after {down} s"))
    }

    async fn leader(&self) -> Result<String, String> {
        lease_holder(&self.client)
            .await
            .ok_or_else(|| "no replica holds the Lease".to_owned())
    }

    /// Injects `fault` (at `start`); returns what it did.
    async fn inject(&mut self, fault: Fault, start: f64) -> Result<String, String> {
        let client = self.client.clone();
        match fault {
            Fault::ManagerPodDeleted => {
                let managers = manager_pods(&client)
                    .await
                    .ok_or("listing the manager pods")?;
                let leader = self.leader().await.unwrap_or_default();
                let victim = if self.rng.bool() {
                    leader.clone()
                } else {
                    managers
                        .iter()
                        .map(|p| p.name_any())
                        .find(|n| *n != leader)
                        .unwrap_or(leader.clone())
                };
                note_panics(&self.record, &self.log_dir);
                let pods: Api<Pod> = Api::namespaced(client, SYSTEM_NAMESPACE);
                pods.delete(
                    &victim,
                    &DeleteParams {
                        grace_period_seconds: Some(0),
                        ..Default::default()
                    },
                )
                .await
                .map_err(|e| format!("deleting {victim}: {e}"))?;
                let role = if victim == leader {
                    "the leader"
                } else {
                    "the follower"
                };
                Ok(format!("deleted {role} {victim} with grace 0"))
            }
            Fault::LeaderKilled => {
                let leader = self.leader().await?;
                let pods: Api<Pod> = Api::namespaced(client, SYSTEM_NAMESPACE);
                let restarts = |pod: &Pod| {
                    crate::sidecarset::status(pod, "manager").map_or(0, |s| s.restart_count)
                };
                let before = pods
                    .get(&leader)
                    .await
                    .map_err(|e| format!("reading {leader}: {e}"))?;
                let pid = manager_pid(&leader)
                    .ok_or_else(|| format!("no manager process of {leader} found in /proc"))?;
                let status = std::process::Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status()
                    .map_err(|e| format!("kill: {e}"))?;
                if !status.success() {
                    return Err(format!("kill -KILL {pid} failed"));
                }
                // The fault lasts until the kubelet has seen the container die (the pod stays
                // Ready until then): the health check must not pass before.
                let seen = tokio::time::timeout(RECOVERY_TIMEOUT, async {
                    loop {
                        match pods.get(&leader).await {
                            Ok(now) if restarts(&now) > restarts(&before) => break,
                            Err(kube::Error::Api(e)) if e.code == 404 => break,
                            _ => tokio::time::sleep(Duration::from_millis(250)).await,
                        }
                    }
                })
                .await;
                if seen.is_err() {
                    return Err(format!(
                        "the kubelet did not restart {leader}'s container within \
                         {RECOVERY_TIMEOUT:?} of its SIGKILL"
                    ));
                }
                Ok(format!(
                    "SIGKILLed the leader {leader} (pid {pid}); the kubelet restarted it after \
                     {:.1}s",
                    self.clock.now() - start
                ))
            }
            Fault::LeaseStolen => {
                let leases: Api<Lease> = Api::namespaced(client, SYSTEM_NAMESPACE);
                // The leader renews every 2 s: a write between our read and ours is a 409; read
                // again and steal again.
                let mut attempts = 0;
                let victim = loop {
                    attempts += 1;
                    let mut lease = leases
                        .get(LEASE)
                        .await
                        .map_err(|e| format!("reading the Lease: {e}"))?;
                    let spec = lease.spec.get_or_insert_with(Default::default);
                    let victim = spec.holder_identity.clone().unwrap_or_default();
                    spec.holder_identity = Some(THIEF.to_owned());
                    spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
                    match leases.replace(LEASE, &PostParams::default(), &lease).await {
                        Ok(_) => break victim,
                        Err(kube::Error::Api(e)) if e.code == 409 && attempts < 10 => continue,
                        Err(e) => {
                            return Err(format!("stealing the Lease ({attempts} attempts): {e}"));
                        }
                    }
                };
                let log_dir = self.log_dir.clone();
                let deadline = Instant::now() + STEP_DOWN_TIMEOUT;
                loop {
                    if logged_lost_lease(&log_dir, &victim) {
                        break;
                    }
                    if Instant::now() > deadline {
                        violation(
                            &self.record,
                            &self.clock,
                            format!(
                                "{victim} did not log losing the Lease within \
                                 {STEP_DOWN_TIMEOUT:?} of it being stolen"
                            ),
                        );
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Ok(format!("stole the Lease from {victim}"))
            }
            Fault::LeaseDeleted => {
                let leases: Api<Lease> = Api::namespaced(client, SYSTEM_NAMESPACE);
                let holder = self.leader().await.unwrap_or_default();
                leases
                    .delete(LEASE, &DeleteParams::default())
                    .await
                    .map_err(|e| format!("deleting the Lease: {e}"))?;
                Ok(format!("deleted the Lease {holder} held"))
            }
            Fault::ContainerdRestarted => {
                let restarted = self.restart("containerd").await?;
                // The daemon notices a runtime gone on its next call: the fault lasts until it
                // has (or for 15 s if it does not; then it reached the new runtime at once).
                let deadline = Instant::now() + Duration::from_secs(15);
                let noticed = loop {
                    if daemon_readyz(&self.client).await.is_err() {
                        break true;
                    }
                    if Instant::now() > deadline {
                        break false;
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                };
                Ok(format!(
                    "{restarted}; the daemon {}",
                    if noticed {
                        "saw it gone"
                    } else {
                        "stayed ready for 15 s"
                    }
                ))
            }
            Fault::KubeletRestarted => self.restart("kubelet").await,
            Fault::ApiserverRestarted => self.restart("kube-apiserver").await,
        }
    }

    /// One fault and the wait until the system is healthy again; recorded with its window.
    async fn strike(&mut self, fault: Fault) {
        let start = self.clock.now();
        eprintln!("chaos: {start:7.1}s fault {fault:?}");
        let did = self.inject(fault, start).await;
        match &did {
            Ok(what) => eprintln!("chaos: {:7.1}s   {what}", self.clock.now()),
            Err(e) => violation(
                &self.record,
                &self.clock,
                format!("injecting {fault:?} at {start:.1}s: {e}"),
            ),
        }
        let deadline = Instant::now() + RECOVERY_TIMEOUT;
        let mut last_reason = String::new();
        loop {
            let reason = match healthy(&self.client, &self.node).await {
                Ok(()) => break,
                Err(reason) => reason,
            };
            // Each new reason once: what the recovery waited on, in order.
            if reason != last_reason {
                eprintln!("chaos: {:7.1}s   not healthy: {reason}", self.clock.now());
                last_reason = reason;
            }
            if Instant::now() > deadline {
                violation(
                    &self.record,
                    &self.clock,
                    format!(
                        "not healthy within {RECOVERY_TIMEOUT:?} of {fault:?} at {start:.1}s: \
                         {last_reason}"
                    ),
                );
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let end = self.clock.now();
        eprintln!(
            "chaos: {end:7.1}s healthy again after {fault:?} ({:.1}s)",
            end - start
        );
        if did.is_ok() {
            self.record.lock().unwrap().faults.push((fault, start, end));
        }
    }
}

fn minutes() -> f64 {
    match std::env::var(MINUTES_VAR) {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|e| panic!("{MINUTES_VAR}={text:?} is not a number: {e}")),
        Err(_) => DEFAULT_MINUTES,
    }
}

fn seed() -> u64 {
    match std::env::var(SEED_VAR) {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|e| panic!("{SEED_VAR}={text:?} is not a u64: {e}")),
        Err(_) => fastrand::u64(..),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "minutes of faults on the real node: `make test-chaos`, or e2e.sh without a filter"]
async fn chaos_invariants_hold_through_manager_lease_containerd_kubelet_and_apiserver_faults() {
    let exclusive = support::exclusive().await;
    let cluster = exclusive.cluster;
    let client = cluster.client();
    let seed = seed();
    let minutes = minutes();
    eprintln!(
        "chaos: seed {seed} ({SEED_VAR}={seed} replays the order), {minutes} minutes of faults"
    );
    let state_dir = cluster.state_dir.clone();
    let log_dir = state_dir.join("log/pods");

    // --- setup, while nothing misbehaves -----------------------------------------------------
    let ns = cluster.namespace("chaos", json!({})).await;
    // Each SidecarSet selects the pods whose `app` is its name (as `sidecarset` does).
    let (inject_set, roll_set) = (
        support::unique_name("chaos-inject"),
        support::unique_name("chaos-roll"),
    );
    let names = Names {
        namespace: ns.name.clone(),
        churn_app: inject_set.clone(),
        inject_set,
        stable_app: roll_set.clone(),
        roll_set,
    };
    let images: Vec<String> = ["v1", "v2", "v3"]
        .iter()
        .map(|t| cluster.app_image(t))
        .collect();
    let digests: HashMap<String, String> = images
        .iter()
        .map(|i| (i.clone(), support::registry_digest(i)))
        .collect();
    // `sidecarset` with another sidecar name.
    let set = |name: &str, sidecar: &str, max_unavailable: usize| -> SidecarSet {
        let mut value = serde_json::to_value(sidecarset(
            name,
            &ns.name,
            &images[0],
            max_unavailable as i32,
        ))
        .expect("a SidecarSet as JSON");
        value["spec"]["containers"][0]["name"] = json!(sidecar);
        serde_json::from_value(value).expect("a SidecarSet")
    };
    let inject = set(&names.inject_set, "sidecar", 1);
    create_sidecarset_injecting(cluster, &inject, &ns.name, "sidecar").await;
    let rolled = set(&names.roll_set, "rolled", MAX_UNAVAILABLE);
    create_sidecarset_injecting(cluster, &rolled, &ns.name, "rolled").await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    deployments
        .create(
            &PostParams::default(),
            &deployment(&names.stable_app, &images[0], STABLE_PODS as i32),
        )
        .await
        .expect("creating the Deployment");
    running_pods(cluster, &ns.name, &names.stable_app, STABLE_PODS).await;

    let nodeimages: Api<NodeImage> = Api::all(client.clone());
    let mut job_nodes = vec![cluster.node_name.clone()];
    for i in 0..FAKE_NODES {
        let name = support::unique_name(&format!("chaos-fake-{i}"));
        let mut ni = NodeImage::new(&name, Default::default());
        ni.metadata.labels = Some(BTreeMap::from([
            (FAKE_NODEIMAGE.to_owned(), "true".to_owned()),
            ("kruise-rs-chaos".to_owned(), ns.name.clone()),
        ]));
        nodeimages
            .create(&PostParams::default(), &ni)
            .await
            .expect("a fake NodeImage");
        job_nodes.push(name);
    }

    let record: Shared = Arc::default();
    record
        .lock()
        .unwrap()
        .roll_images
        .push((0.0, images[0].clone()));
    let clock = Arc::new(Clock(Instant::now()));
    let stop_load = Arc::new(AtomicBool::new(false));
    let stop_drivers = Arc::new(AtomicBool::new(false));
    let daemons = played_daemon::play_node_image_daemons(
        client.clone(),
        played_daemon::PlayedDaemons {
            label_selector: Some(format!("kruise-rs-chaos={}", ns.name)),
            image: None,
            delay_ms: 500..2000,
            seed,
            ..played_daemon::PlayedDaemons::default()
        },
    );
    let (listed_tx, listed) = tokio::sync::oneshot::channel();
    let pod_watch = tokio::spawn(watch_pods(
        Api::namespaced(client.clone(), &ns.name),
        names.clone(),
        digests,
        record.clone(),
        clock.clone(),
        listed_tx,
    ));
    listed.await.expect("the pod watch lists");
    let pull_watch = tokio::spawn(watch_pulls(
        client.clone(),
        format!("{}/{PULL_REPOSITORY}", cluster.registry),
        record.clone(),
        clock.clone(),
    ));
    let scanning = Arc::new(AtomicUsize::new(0));
    let scanner = {
        let (record, log_dir, scanning) = (record.clone(), log_dir.clone(), scanning.clone());
        tokio::spawn(async move {
            loop {
                let (record, log_dir) = (record.clone(), log_dir.clone());
                tokio::task::spawn_blocking(move || note_panics(&record, &log_dir))
                    .await
                    .expect("the log scan");
                scanning.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_secs(3)).await;
            }
        })
    };
    let churner = tokio::spawn(churn(
        client.clone(),
        names.clone(),
        images[0].clone(),
        record.clone(),
        clock.clone(),
        stop_load.clone(),
    ));
    let roller = tokio::spawn(roll(
        client.clone(),
        names.clone(),
        images.clone(),
        record.clone(),
        clock.clone(),
        stop_drivers.clone(),
    ));
    let puller = tokio::spawn(pull_jobs(
        client.clone(),
        cluster,
        ns.name.clone(),
        job_nodes,
        record.clone(),
        clock.clone(),
        stop_drivers.clone(),
    ));

    // --- the faults --------------------------------------------------------------------------
    let mut faulter = Faulter {
        client: client.clone(),
        state_dir: state_dir.clone(),
        log_dir: log_dir.clone(),
        node: cluster.node_name.clone(),
        record: record.clone(),
        clock: clock.clone(),
        rng: fastrand::Rng::with_seed(seed),
    };
    let chaos_for = Duration::from_secs_f64(minutes * 60.0);
    let chaos_start = Instant::now();
    // At least one whole round, however long its recoveries take: every kind once.
    let mut round: Vec<Fault> = Vec::new();
    let mut rounds = 0;
    while chaos_start.elapsed() < chaos_for || !round.is_empty() || rounds == 0 {
        if round.is_empty() {
            rounds += 1;
            round = FAULTS.to_vec();
            faulter.rng.shuffle(&mut round);
        }
        let fault = round.pop().expect("non-empty");
        faulter.strike(fault).await;
        // A random moment to strike next, not a wait for something to happen.
        tokio::time::sleep(Duration::from_millis(faulter.rng.u64(CALM_MS))).await;
    }
    let faults_over = clock.now();
    eprintln!("chaos: {faults_over:7.1}s faults over; the rollout and the job must finish");
    let (rollouts_under_faults, jobs_under_faults) = {
        let r = record.lock().unwrap();
        (r.rollouts.len(), r.jobs.len())
    };
    if rollouts_under_faults == 0 || jobs_under_faults == 0 {
        violation(
            &record,
            &clock,
            format!(
                "{rollouts_under_faults} rollouts and {jobs_under_faults} ImagePullJobs finished \
                 under the faults: maxUnavailable and parallelism were not tested under them"
            ),
        );
    }
    stop_drivers.store(true, Ordering::Relaxed);
    let (rolled_out, pulled) = tokio::join!(roller, puller);
    for result in [rolled_out.expect("the roller"), pulled.expect("the puller")] {
        if let Err(e) = result {
            violation(&record, &clock, e);
        }
    }
    // Admissions once more in calm, then the load stops.
    let calm_from = clock.now();
    let admitted_before = record.lock().unwrap().admitted;
    wait_for("pods admitted after the faults", TIMEOUT, || async {
        (record.lock().unwrap().admitted >= admitted_before + 5).then_some(())
    })
    .await;
    stop_load.store(true, Ordering::Relaxed);
    churner.await.expect("the churn");
    // One last scan, after the watch has caught up with every pod created.
    let last_scan = scanning.load(Ordering::Relaxed);
    wait_for("a last log scan", TIMEOUT, || async {
        (scanning.load(Ordering::Relaxed) > last_scan + 1).then_some(())
    })
    .await;
    for task in [pod_watch, pull_watch, scanner, daemons] {
        task.abort();
    }

    // --- the verdict -------------------------------------------------------------------------
    let mut r = record.lock().unwrap();
    let windows: Vec<(Fault, f64, f64)> = r.faults.clone();
    let mut refusal_causes: BTreeMap<String, usize> = BTreeMap::new();
    let mut bad_refusals = Vec::new();
    for (at, class, message) in &r.refusals {
        *refusal_causes.entry(class.clone()).or_default() += 1;
        let slack = WINDOW_SLACK.as_secs_f64();
        let during = windows
            .iter()
            .find(|(_, start, end)| *at >= *start && *at <= *end + slack);
        let legitimate = UNAVAILABILITIES.contains(&class.as_str());
        match (during, legitimate) {
            (Some(_), true) => {}
            (Some((fault, start, end)), false) => bad_refusals.push(format!(
                "at {at:.1}s, during {fault:?} ({start:.1}s-{end:.1}s), with no unavailability \
                 named: {message}"
            )),
            (None, _) => bad_refusals.push(format!(
                "at {at:.1}s, outside every fault's window ({class}): {message}"
            )),
        }
    }
    let mut faults_by_kind: BTreeMap<String, usize> = BTreeMap::new();
    for (fault, _, _) in &windows {
        *faults_by_kind.entry(format!("{fault:?}")).or_default() += 1;
    }
    let pulls_failed: i32 = r.jobs.iter().map(|j| j.3).sum();
    eprintln!(
        "chaos: seed {seed}: {:.1} min of faults, {:.1} s in all\n\
         \x20 pods admitted: {} stored + {} dry runs ({} pods seen by the watch); refused: {} \
         {refusal_causes:?}; uninjected: {}\n\
         \x20 faults: {} {faults_by_kind:?}\n\
         \x20 rollouts finished: {} (times {:?}); most pods in flight: {} (maxUnavailable \
         {MAX_UNAVAILABLE}; {} patches of pods not ready, not counted)\n\
         \x20 ImagePullJobs complete: {} ({} node pulls failed); most nodes pulling one job: {} \
         (parallelism {PARALLELISM})\n\
         \x20 injected images at most {:.1}s stale (bound {STALE_INJECTION:?}); panics: {}",
        minutes,
        clock.now(),
        r.admitted,
        r.admitted_dry_run,
        r.seen_pods,
        r.refusals.len(),
        r.uninjected.len(),
        windows.len(),
        r.rollouts.len(),
        r.rollouts
            .iter()
            .map(|(_, t)| format!("{t:.0}s"))
            .collect::<Vec<_>>(),
        r.max_in_flight,
        r.taken_unready,
        r.jobs.len(),
        pulls_failed,
        r.max_pulling,
        r.max_injection_lag,
        r.panics.len(),
    );
    for (at, class, message) in &r.refusals {
        eprintln!("chaos:   refused at {at:.1}s ({class}): {message}");
    }
    for (fault, start, end) in &windows {
        eprintln!("chaos:   fault {fault:?} {start:.1}s, healthy at {end:.1}s");
    }
    if r.max_in_flight > MAX_UNAVAILABLE {
        let what = format!(
            "{} pods in flight at once (maxUnavailable {MAX_UNAVAILABLE}): {:?}",
            r.max_in_flight, r.at_max_in_flight
        );
        r.violations.push(what);
    }
    if r.max_pulling > PARALLELISM {
        let what = format!(
            "{} nodes pulling one job at once (parallelism {PARALLELISM}): {}",
            r.max_pulling, r.at_max_pulling
        );
        r.violations.push(what);
    }
    if r.max_in_flight == 0 || r.max_pulling == 0 {
        let what = format!(
            "the watches never saw a pod in flight ({}) or a node pulling ({}): they did not \
             watch",
            r.max_in_flight, r.max_pulling
        );
        r.violations.push(what);
    }
    if pulls_failed > 0 {
        let what = format!("{pulls_failed} node pulls failed: {:?}", r.jobs);
        r.violations.push(what);
    }
    let panics: Vec<String> = r.panics.iter().cloned().collect();
    r.violations
        .extend(panics.into_iter().map(|p| format!("panic: {p}")));
    r.violations.extend(bad_refusals);
    for kind in FAULTS {
        if !faults_by_kind.contains_key(&format!("{kind:?}")) {
            r.violations.push(format!("no {kind:?} injected"));
        }
    }
    let calm_admissions = r
        .refusals
        .iter()
        .filter(|(at, ..)| *at >= calm_from)
        .count();
    assert!(
        r.violations.is_empty(),
        "seed {seed}: {} invariant(s) broken ({calm_admissions} refusals after the faults):\n{}",
        r.violations.len(),
        r.violations.join("\n")
    );
}

/// The panic scan finds a panic line in a kruise-system pod's log, reads each file on from
/// where it stopped (a line written later is found, none twice), and ignores other namespaces.
#[test]
fn the_panic_scan_reads_new_lines_of_kruise_system_logs() {
    use std::io::Write;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let ours = dir.path().join(format!(
        "{SYSTEM_NAMESPACE}_kruise-rs-manager-x_uid/manager"
    ));
    let theirs = dir.path().join("default_app_uid/app");
    std::fs::create_dir_all(&ours).unwrap();
    std::fs::create_dir_all(&theirs).unwrap();
    std::fs::write(
        theirs.join("0.log"),
        "thread 'main' panicked at app.rs:1:1\n",
    )
    .unwrap();
    let log = ours.join("0.log");
    std::fs::write(&log, "{\"message\":\"ready\"}\n").unwrap();
    let mut offsets = HashMap::new();
    assert!(scan_panics(dir.path(), &mut offsets).is_empty());
    let mut file = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    // A line still being written is left for the next scan.
    file.write_all(b"thread 'tokio-runtime-worker' panicked at src/x.rs:1:1")
        .unwrap();
    assert!(scan_panics(dir.path(), &mut offsets).is_empty());
    file.write_all(b"\n").unwrap();
    let found = scan_panics(dir.path(), &mut offsets);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("src/x.rs"), "{found:?}");
    assert!(
        scan_panics(dir.path(), &mut offsets).is_empty(),
        "read once"
    );
}

/// A re-list counts the nodes pulling at its end: before the watch broke, c pulled j1; while it
/// was down c finished and a and b started. Object by object the re-list would count a, b and
/// the stale c at once.
#[test]
fn a_relist_counts_the_nodes_pulling_at_its_end_not_object_by_object() {
    let repo = "127.0.0.1:5000/e2e/chaos-pull";
    let ni = |name: &str, finished: bool| -> NodeImage {
        let status = if finished {
            json!({"imageStatuses": {repo: {"tags": [{"tag": "j1", "version": 0,
                "phase": "Succeeded", "completionTime": "2026-12-07T14:40:40Z"}]}}})
        } else {
            json!({})
        };
        serde_json::from_value(json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "NodeImage",
            "metadata": {"name": name},
            "spec": {"images": {repo: {"tags": [{"tag": "j1", "version": 0,
                "createdAt": "2026-12-07T14:40:30Z",
                "pullPolicy": {"ttlSecondsAfterFinished": 300}}]}}},
            "status": status
        }))
        .expect("a NodeImage")
    };
    let mut pulling = PullingNodes::default();
    let mut most = 0;
    let mut observe = |pulling: &mut PullingNodes, event: watcher::Event<NodeImage>| {
        if let Some((n, _)) = pulling.observe(&event, repo) {
            most = most.max(n);
        }
    };
    observe(&mut pulling, watcher::Event::Apply(ni("c", false)));
    observe(&mut pulling, watcher::Event::Init);
    observe(&mut pulling, watcher::Event::InitApply(ni("a", false)));
    observe(&mut pulling, watcher::Event::InitApply(ni("b", false)));
    observe(&mut pulling, watcher::Event::InitApply(ni("c", true)));
    observe(&mut pulling, watcher::Event::InitDone);
    assert_eq!(most, 2);
    let now = pulling.observe(&watcher::Event::Delete(ni("a", false)), repo);
    assert_eq!(now, Some((1, r#"j1: ["b"]"#.to_owned())));
}

/// Every class `classify` gives is one the checker accepts inside a fault's window (the
/// 401 class was once given and then counted as a broken invariant), and a plain denial is none.
#[test]
fn each_unavailability_classify_names_is_accepted_by_the_checker() {
    let status = |code: u16, message: &str| {
        kube::Error::Api(
            kube::core::Status::failure(message, "")
                .with_code(code)
                .boxed(),
        )
    };
    let unavailable = [
        status(
            500,
            "Internal error occurred: failed calling webhook \"mutate-pods\": connection refused",
        ),
        status(
            403,
            "admission webhook \"mutate-pods.kruise-rs.io\" denied the request: the kruise-rs webhook is starting",
        ),
        status(
            403,
            "admission webhook \"mutate-pods.kruise-rs.io\" denied the request: cannot confirm which SidecarSets may select this pod (listing the SidecarSets: ApiError: Unauthorized (401)); retry",
        ),
        status(503, "the server is currently unable to handle the request"),
    ];
    for error in &unavailable {
        let (message, class) = classify(error);
        let class = class.unwrap_or_else(|| panic!("no unavailability named for {message}"));
        assert!(
            UNAVAILABILITIES.contains(&class),
            "{class} ({message}) is not accepted"
        );
    }
    let denied = status(
        403,
        "admission webhook \"validate-sidecarsets.kruise-rs.io\" denied the request: spec.containers[0].image: Required value",
    );
    assert_eq!(classify(&denied).1, None);
}

/// A selected pod needs both its set's container and the set's name in the injected list; a pod
/// no set selects needs nothing.
#[test]
fn a_selected_pod_without_its_sidecar_or_listed_set_is_uninjected() {
    let names = Names {
        namespace: "ns".to_owned(),
        churn_app: "inject".to_owned(),
        inject_set: "inject".to_owned(),
        stable_app: "roll".to_owned(),
        roll_set: "roll".to_owned(),
    };
    let pod = |app: &str, containers: &[&str], listed: Option<&str>| -> Pod {
        let containers: Vec<_> = containers
            .iter()
            .map(|c| json!({"name": c, "image": "i"}))
            .collect();
        let annotations = listed.map_or(json!({}), |l| json!({SIDECARSET_INJECTED_LIST: l}));
        serde_json::from_value(json!({
            "metadata": {"name": "p", "labels": {"app": app}, "annotations": annotations},
            "spec": {"containers": containers}
        }))
        .unwrap()
    };
    assert_eq!(
        missing_injection(
            &pod("inject", &["app", "sidecar"], Some("other,inject")),
            &names
        ),
        None
    );
    assert!(missing_injection(&pod("inject", &["app"], Some("inject")), &names).is_some());
    assert!(missing_injection(&pod("inject", &["app", "sidecar"], None), &names).is_some());
    assert!(missing_injection(&pod("roll", &["app", "sidecar"], Some("roll")), &names).is_some());
    assert_eq!(
        missing_injection(&pod("other", &["app"], None), &names),
        None
    );
}

/// An injected image is as stale as how long before the pod was sent the set had left it.
#[test]
fn staleness_is_how_long_ago_the_set_left_the_injected_image() {
    let history = vec![
        (0.0, "v1".to_owned()),
        (10.0, "v2".to_owned()),
        (20.0, "v3".to_owned()),
        (30.0, "v1".to_owned()),
    ];
    assert_eq!(staleness(&history, "v3", 25.0, 25.1), Some(0.0));
    assert_eq!(staleness(&history, "v2", 25.0, 25.1), Some(5.0));
    // v1 again since 30 s: current, not 25 s stale.
    assert_eq!(staleness(&history, "v1", 35.0, 35.1), Some(0.0));
    assert_eq!(staleness(&history, "v1", 25.0, 25.1), Some(15.0));
    // The new image a moment before our patch's answer was read.
    assert_eq!(staleness(&history, "v2", 9.0, 9.5), Some(0.0));
    assert_eq!(staleness(&history, "v3", 5.0, 5.1), None);
    assert_eq!(staleness(&history, "v9", 5.0, 5.1), None);
}
