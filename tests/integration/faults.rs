//! The manager under faults: an ImagePullJob fanning out over 200 nodes while the manager's
//! every request goes through a proxy that answers 429 and 5xx, delays and hangs requests, cuts
//! and stalls watches ([`FaultProxy`]); while the manager process is killed (SIGKILL) and started
//! again 10 times; and while kube-apiserver and etcd are each restarted once. A watch of its own,
//! straight to the apiserver, checks what must hold all along: never more nodes pulling than
//! `parallelism`, each node's entry written once (one version, never changed, never lost). Once
//! the faults stop the job must complete, and no manager log may hold a panic.
//!
//! The control plane is this test's own (restarting the suite's would disturb every other test).
//! The node daemons are played: a node reports Succeeded for the entry's version a random
//! 0.3–2 s after it appears, so that the fan-out spans the faults.
//!
//! Random choices (faults, kill times, the daemons' delays) come from one seed, printed first and
//! in every failure; `KRUISE_FAULT_SEED=<n>` replays it (timing still varies).
//! `KRUISE_FAULT_LONG=1` runs the long version: 1,000 nodes, 30 kills, more faults.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kruise_rs_api::imagepulljob::{
    ImagePullJob, ImagePullJobNodeSelector, ImagePullJobSpec, ImagePullJobTemplate,
};
use kruise_rs_api::nodeimage::NodeImage;
use kruise_rs_api::sidecarset::SidecarSet;
use kruise_rs_api::well_known::{FAKE_NODEIMAGE, SIDECARSET_HASH};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::time::Instant;

use crate::harness::controlplane::{ControlPlane, Crds, config_for};
use crate::harness::fault_proxy::{
    FaultProxy, Faults, Injected, describe, restart_control_plane_process,
};
use crate::harness::objects::create_namespace;
use crate::harness::played_daemon::{PlayedDaemons, play_node_image_daemons};
use crate::sidecarset_crash::{InFlightRecord, track_in_flight};
use crate::sidecarset_upgrade::start_injected_pods;
use crate::sidecarset_upgrade::{
    NEW_IMAGE, SIDECAR, counts, counts_of, describe_set, one_sidecar_set, spec_image,
};
use crate::support::kubelet::{self, BackgroundKubelet};
use crate::support::seed_from_env;

const SEED_VAR: &str = "KRUISE_FAULT_SEED";
const LONG_VAR: &str = "KRUISE_FAULT_LONG";
const IMAGE: &str = "nginx";
const TAG: &str = "faults";
const RUN_LABEL: &str = "kruise-rs-faults";
/// How long the job may take to complete once the faults have stopped.
const FINISH_TIMEOUT: Duration = Duration::from_secs(240);
/// How long the apiserver may take to answer again after a restart (of itself or of etcd).
const RESTART_TIMEOUT: Duration = Duration::from_secs(90);
/// How long the faults stay on after the last kill while no work has been seen done under them.
const WORK_UNDER_FAULTS_TIMEOUT: Duration = Duration::from_secs(60);

struct Scale {
    nodes: usize,
    parallelism: usize,
    kills: usize,
    /// The fault budget: at most this many requests meet a fault.
    faults: u64,
}

fn scale() -> Scale {
    if std::env::var(LONG_VAR).is_ok_and(|v| v == "1") {
        Scale {
            nodes: 1000,
            parallelism: 20,
            kills: 30,
            faults: 100_000,
        }
    } else {
        Scale {
            nodes: 200,
            parallelism: 10,
            kills: 10,
            faults: 20_000,
        }
    }
}

/// What the independent watch saw.
#[derive(Default)]
struct Observed {
    /// Per node, every distinct value its tag entry had (as JSON).
    entries: HashMap<String, BTreeSet<String>>,
    /// Nodes whose entry disappeared after it had been written.
    lost: BTreeSet<String>,
    /// Nodes pulling now: entry written, no final report for its version.
    pulling: HashMap<String, bool>,
    max_pulling: usize,
}

fn tag_entry(ni: &NodeImage) -> Option<serde_json::Value> {
    let entry = ni
        .spec
        .images
        .get(IMAGE)?
        .tags
        .iter()
        .find(|t| t.tag == TAG)?;
    serde_json::to_value(entry).ok()
}

fn entry_version(entry: &serde_json::Value) -> i64 {
    entry["version"].as_i64().unwrap_or(0)
}

fn finished_version(ni: &NodeImage) -> Option<i64> {
    let tag = ni
        .status
        .as_ref()?
        .image_statuses
        .get(IMAGE)?
        .tags
        .iter()
        .find(|t| t.tag == TAG)?;
    tag.completion_time.as_ref()?;
    Some(tag.version.unwrap_or(0))
}

fn observe(observed: &Mutex<Observed>, ni: &NodeImage) {
    let node = ni.name_any();
    let mut o = observed.lock().unwrap();
    match tag_entry(ni) {
        Some(entry) => {
            let pulling = finished_version(ni) != Some(entry_version(&entry));
            o.entries
                .entry(node.clone())
                .or_default()
                .insert(entry.to_string());
            o.pulling.insert(node, pulling);
        }
        None => {
            if o.entries.contains_key(&node) {
                o.lost.insert(node.clone());
            }
            o.pulling.remove(&node);
        }
    }
    let now = o.pulling.values().filter(|p| **p).count();
    o.max_pulling = o.max_pulling.max(now);
}

/// The manager as a child process, its requests through the proxy, its output in a log file of
/// its own per start.
struct Manager {
    child: Option<Child>,
    logs: Vec<PathBuf>,
    kubeconfig: PathBuf,
    dir: PathBuf,
    /// Flags beyond the ones every start gets (webhooks, say).
    args: Vec<String>,
    /// Each time it ended without being killed, with its last log line.
    exits: Vec<String>,
}

impl Manager {
    fn start(&mut self) {
        let log = self.dir.join(format!("manager-{}.log", self.logs.len()));
        let file = std::fs::File::create(&log).expect("the manager's log file");
        let child = Command::new(env!("CARGO_BIN_EXE_kruise-rs"))
            .arg("manager")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--probe-addr", "127.0.0.1:0"])
            .args(["--nodeimage-creation-delay", "0"])
            // Short, in the defaults' proportions: each start after a kill waits out the lease
            // the killed process held.
            .args(["--leader-election-lease-duration", "3s"])
            .args(["--leader-election-renew-deadline", "2s"])
            .args(["--leader-election-retry-period", "500ms"])
            .args(&self.args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("the log file"))
            .stderr(file)
            .spawn()
            .expect("starting kruise-rs manager");
        self.child = Some(child);
        self.logs.push(log);
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Ok(Some(status)) = child.try_wait() {
                let last = self.logs.last().and_then(|log| {
                    let text = std::fs::read_to_string(log).ok()?;
                    text.lines().last().map(str::to_owned)
                });
                let exit = format!(
                    "start {} exited on its own ({status}): {}",
                    self.logs.len(),
                    last.unwrap_or_default()
                );
                eprintln!("faults: manager {exit}");
                self.exits.push(exit);
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again if it has exited (e.g. after losing its Lease to an apiserver outage).
    fn keep_running(&mut self) {
        let exited = self
            .child
            .as_mut()
            .is_none_or(|c| matches!(c.try_wait(), Ok(Some(_))));
        if exited {
            self.kill();
            self.start();
        }
    }

    fn panics(&self) -> Vec<String> {
        self.logs
            .iter()
            .filter_map(|log| {
                let text = std::fs::read_to_string(log).ok()?;
                let line = text.lines().find(|l| l.contains("panicked"))?;
                Some(format!("{}: {line}", log.display()))
            })
            .collect()
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

async fn wait_apiserver(client: &Client, after: &str) {
    let deadline = Instant::now() + RESTART_TIMEOUT;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    loop {
        if namespaces
            .list(&ListParams::default().limit(1))
            .await
            .is_ok()
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the apiserver did not answer within {RESTART_TIMEOUT:?} after {after}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn restart(plane_state: &Path, client: &Client, name: &'static str) {
    let state = plane_state.to_owned();
    tokio::task::spawn_blocking(move || restart_control_plane_process(&state, name))
        .await
        .expect("the restart task")
        .unwrap_or_else(|e| panic!("restarting {name}: {e}"));
    wait_apiserver(client, &format!("restarting {name}")).await;
}

/// What both tests share: a control plane of their own, the proxy in front of it, the manager
/// behind the proxy, and the seed.
struct Rig {
    seed: u64,
    rng: fastrand::Rng,
    started: Instant,
    plane: ControlPlane,
    /// Straight to the apiserver: the test's own requests meet no faults.
    client: Client,
    proxy: FaultProxy,
    manager: Manager,
    _logs: tempfile::TempDir,
}

impl Rig {
    async fn start(what: &str, manager_args: Vec<String>) -> Rig {
        let seed = seed_from_env(SEED_VAR);
        eprintln!("faults, {what}: seed {seed} ({SEED_VAR}={seed} replays it)");
        let plane = tokio::task::spawn_blocking(|| {
            let plane = ControlPlane::start("kruise-rs-faults-")?;
            plane.install_crds(Crds::Repository)?;
            Ok::<_, String>(plane)
        })
        .await
        .expect("the start task")
        .unwrap_or_else(|e| panic!("seed {seed}: the fault test's control plane: {e}"));
        let client = plane.client().await.expect("a client");
        create_namespace(&client, "kruise-system", &[])
            .await
            .expect("namespace kruise-system");
        let mut upstream_config = config_for(plane.kubeconfig()).await.expect("a config");
        upstream_config.read_timeout = None;
        let upstream = Client::try_from(upstream_config).expect("the proxy's client");
        let proxy = FaultProxy::start(upstream, seed)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let logs = tempfile::Builder::new()
            .prefix("kruise-rs-faults-logs-")
            .tempdir()
            .expect("a log directory");
        let manager = Manager {
            child: None,
            logs: Vec::new(),
            kubeconfig: proxy.kubeconfig().to_owned(),
            dir: logs.path().to_owned(),
            args: manager_args,
            exits: Vec::new(),
        };
        Rig {
            seed,
            rng: fastrand::Rng::with_seed(seed),
            started: Instant::now(),
            plane,
            client,
            proxy,
            manager,
            _logs: logs,
        }
    }

    /// Faults on; the manager killed `kills` times, most kills 2–4 s apart (each new process
    /// first waits out the killed one's 3 s Lease), every third 6–10 s after the one before, so
    /// that a process leads long enough to act while the faults go on; the apiserver restarted
    /// after a third of the kills, etcd after two thirds. Then, the faults still on and the
    /// manager running, `work` (how much the controller has done, `None` when it cannot be read
    /// now) is polled until it is above zero or [`WORK_UNDER_FAULTS_TIMEOUT`] has passed: on a
    /// loaded machine every window between kills can pass before a new process has acted, and
    /// the test must not depend on that. Then calm. Returns what the proxy injected and the last
    /// work read (0 when none was seen).
    async fn faults_and_kills<F, W>(
        &mut self,
        kills: usize,
        budget: u64,
        mut work: W,
    ) -> (Injected, usize)
    where
        W: FnMut() -> F,
        F: std::future::Future<Output = Option<usize>>,
    {
        self.proxy.set(Faults::everything(), budget);
        for kill in 1..=kills {
            // A random moment to strike, not a wait for something to happen.
            let apart = if kill % 3 == 0 {
                6000..10_000
            } else {
                2000..4000
            };
            tokio::time::sleep(Duration::from_millis(self.rng.u64(apart))).await;
            self.manager.kill();
            if kill == kills / 3 {
                restart(self.plane.state_dir(), &self.client, "kube-apiserver").await;
            }
            if kill == 2 * kills / 3 {
                restart(self.plane.state_dir(), &self.client, "etcd").await;
            }
            self.manager.start();
        }
        let deadline = Instant::now() + WORK_UNDER_FAULTS_TIMEOUT;
        let done = loop {
            self.manager.keep_running();
            let done = work().await.unwrap_or(0);
            if done > 0 || Instant::now() >= deadline {
                break done;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        self.proxy.calm();
        (self.proxy.injected(), done)
    }

    /// What every test asserts at its end: no panic in any manager log, no manager that gave
    /// up and exited (a refused request is asked again; a lost Lease makes it follow), every
    /// kind of fault injected at least once.
    fn assert_no_panic_and_every_fault(&self, injected: &Injected) {
        let seed = self.seed;
        let panics = self.manager.panics();
        assert!(
            panics.is_empty(),
            "seed {seed}: the manager panicked: {panics:#?}"
        );
        assert!(
            self.manager.exits.is_empty(),
            "seed {seed}: the manager exited on its own: {:#?}",
            self.manager.exits
        );
        for (kind, count) in [
            ("429", injected.too_many_requests),
            ("5xx", injected.server_errors),
            ("delays", injected.delays),
            ("hangs", injected.hangs),
            ("watch cuts", injected.cut_watches),
            ("watch stalls", injected.stalled_watches),
        ] {
            assert!(
                count > 0,
                "seed {seed}: no {kind} injected: the proxy did not do its job"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_image_pull_job_keeps_parallelism_and_completes_through_faults_restarts_and_kills() {
    let scale = scale();
    let mut rig = Rig::start(
        &format!(
            "ImagePullJob over {} nodes, parallelism {}, {} manager kills",
            scale.nodes, scale.parallelism, scale.kills
        ),
        vec!["--disable-webhooks".to_owned()],
    )
    .await;
    let (seed, client) = (rig.seed, rig.client.clone());

    // The nodes: NodeImages only (the fake label keeps the manager from collecting them).
    let nodeimages: Api<NodeImage> = Api::all(client.clone());
    stream::iter(0..scale.nodes)
        .map(|i| {
            let api = nodeimages.clone();
            async move {
                let mut ni = NodeImage::new(&format!("fault-node-{i:04}"), Default::default());
                ni.metadata.labels = Some(BTreeMap::from([
                    (FAKE_NODEIMAGE.to_owned(), "true".to_owned()),
                    (RUN_LABEL.to_owned(), "true".to_owned()),
                ]));
                api.create(&PostParams::default(), &ni).await
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await
        .expect("creating the NodeImages");

    let observed: Arc<Mutex<Observed>> = Arc::default();
    let watch = {
        let (api, observed) = (nodeimages.clone(), observed.clone());
        tokio::spawn(async move {
            let config = watcher::Config::default().labels(RUN_LABEL);
            let stream = watcher(api, config).default_backoff().applied_objects();
            let mut stream = std::pin::pin!(stream);
            while let Some(item) = stream.next().await {
                if let Ok(ni) = item {
                    observe(&observed, &ni);
                }
            }
        })
    };
    let daemons = play_node_image_daemons(
        client.clone(),
        PlayedDaemons {
            label_selector: Some(RUN_LABEL.to_owned()),
            image: None,
            delay_ms: 300..2000,
            seed: seed ^ 0xdae_0000,
            ..PlayedDaemons::default()
        },
    );
    rig.manager.start();

    let job = ImagePullJob::new(
        "fan-out",
        ImagePullJobSpec {
            image: format!("{IMAGE}:{TAG}"),
            template: ImagePullJobTemplate {
                selector: Some(ImagePullJobNodeSelector {
                    match_labels: Some(BTreeMap::from([(RUN_LABEL.to_owned(), "true".to_owned())])),
                    ..Default::default()
                }),
                parallelism: Some(
                    k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(
                        scale.parallelism as i32,
                    ),
                ),
                ..Default::default()
            },
        },
    );
    let jobs: Api<ImagePullJob> = Api::namespaced(client.clone(), "default");
    jobs.create(&PostParams::default(), &job)
        .await
        .expect("creating the job");

    let started_nodes = || {
        let written = observed.lock().unwrap().entries.len();
        std::future::ready(Some(written))
    };
    let (injected, written) = rig
        .faults_and_kills(scale.kills, scale.faults, started_nodes)
        .await;
    let faults_over = Instant::now();
    let pulling = observed
        .lock()
        .unwrap()
        .pulling
        .values()
        .filter(|p| **p)
        .count();
    eprintln!(
        "faults: over after {:.0?}, {written} nodes started ({pulling} pulling): {}",
        rig.started.elapsed(),
        describe(&injected)
    );
    assert!(
        written > 0,
        "seed {seed}: no node started while the faults went on: parallelism was not tested \
         under them"
    );

    let deadline = Instant::now() + FINISH_TIMEOUT;
    let status = loop {
        rig.manager.keep_running();
        let status = jobs.get("fan-out").await.ok().and_then(|j| j.status);
        if let Some(status) = status.filter(|s| s.completion_time.is_some()) {
            break status;
        }
        let (written, pulling) = {
            let o = observed.lock().unwrap();
            (o.entries.len(), o.pulling.values().filter(|p| **p).count())
        };
        assert!(
            Instant::now() < deadline,
            "seed {seed}: the job did not complete within {FINISH_TIMEOUT:?} after the faults \
             stopped ({written} nodes have an entry, {pulling} pulling)"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let finished_in = faults_over.elapsed();
    watch.abort();
    daemons.abort();

    let o = observed.lock().unwrap();
    eprintln!(
        "faults: seed {seed}: job complete {finished_in:.0?} after the faults stopped \
         ({:.0?} in all); at most {} nodes pulling at once; manager started {} times, {} of \
         them after exiting on its own",
        rig.started.elapsed(),
        o.max_pulling,
        rig.manager.logs.len(),
        rig.manager.exits.len(),
    );
    assert_eq!(
        (status.succeeded, status.failed, status.desired),
        (scale.nodes as i32, 0, scale.nodes as i32),
        "seed {seed}: every node succeeded: {status:?}"
    );
    assert!(
        o.max_pulling <= scale.parallelism,
        "seed {seed}: {} nodes were pulling at once, parallelism is {}",
        o.max_pulling,
        scale.parallelism
    );
    assert_eq!(
        o.entries.len(),
        scale.nodes,
        "seed {seed}: every node got an entry"
    );
    let rewritten: Vec<_> = o
        .entries
        .iter()
        .filter(|(_, values)| values.len() > 1)
        .collect();
    assert!(
        rewritten.is_empty(),
        "seed {seed}: entries written more than once: {rewritten:#?}"
    );
    assert!(o.lost.is_empty(), "seed {seed}: entries lost: {:?}", o.lost);
    rig.assert_no_panic_and_every_fault(&injected);
}

/// Pods of the SidecarSet rollout under faults.
const ROLLOUT_PODS: usize = 30;
const ROLLOUT_MAX_UNAVAILABLE: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sidecarset_rollout_keeps_max_unavailable_and_finishes_through_faults_restarts_and_kills()
{
    let scale = scale();
    let webhook = crate::support::free_loopback_port();
    let mut rig = Rig::start(
        &format!(
            "SidecarSet rollout over {ROLLOUT_PODS} pods, maxUnavailable \
             {ROLLOUT_MAX_UNAVAILABLE}, {} manager kills",
            scale.kills
        ),
        vec![
            "--webhook-addr".to_owned(),
            webhook.to_string(),
            "--webhook-url".to_owned(),
            format!("https://{webhook}"),
        ],
    )
    .await;
    let (seed, client) = (rig.seed, rig.client.clone());
    rig.manager.start();

    // Set up while nothing misbehaves: the webhook injects every pod.
    let ns = "rollout";
    create_namespace(&client, ns, &[])
        .await
        .expect("the pods' namespace");
    let name = "faults";
    let mut spec = one_sidecar_set(name, "web", ns);
    spec["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("initContainers");
    spec["spec"]["updateStrategy"]["maxUnavailable"] = json!(ROLLOUT_MAX_UNAVAILABLE);
    let set: SidecarSet = serde_json::from_value(spec.clone()).expect("a SidecarSet");
    let sets: Api<SidecarSet> = Api::all(client.clone());
    let set = crate::sidecarset_upgrade::poll(
        &format!("seed {seed}: the manager's webhooks to admit a SidecarSet"),
        Duration::from_secs(60),
        || {
            let (sets, set) = (sets.clone(), set.clone());
            async move {
                let created = sets
                    .create(&PostParams::default(), &set)
                    .await
                    .map_err(|e| e.to_string())?;
                // Created before the manager registered its webhooks: admitted undefaulted.
                if created.annotations().contains_key(SIDECARSET_HASH) {
                    Ok(created)
                } else {
                    sets.delete(&created.name_any(), &Default::default())
                        .await
                        .map_err(|e| format!("deleting an undefaulted SidecarSet: {e}"))?;
                    Err("admitted without the webhook (no hash annotation)".to_owned())
                }
            }
        },
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    start_injected_pods(&pods, "web", &set, ROLLOUT_PODS).await;

    let background_kubelet = BackgroundKubelet::spawn(pods.clone(), rig.rng.u64(..));
    let record = Arc::new(InFlightRecord::default());
    let (listed_tx, listed) = tokio::sync::oneshot::channel();
    let tracker = tokio::spawn(track_in_flight(pods.clone(), record.clone(), listed_tx));
    listed.await.expect("the in-flight tracker lists the pods");

    spec["spec"]["containers"][0]["image"] = json!(NEW_IMAGE);
    let patch = json!({"spec": {"containers": spec["spec"]["containers"].clone()}});
    sets.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("seed {seed}: updating the SidecarSet's image: {e}"));

    // A list that fails (the apiserver restarting) reads as unknown, not as no pod updated.
    let updated_pods = || async {
        let listed = pods.list(&ListParams::default()).await.ok()?;
        Some(
            listed
                .items
                .iter()
                .filter(|p| spec_image(p, SIDECAR) == NEW_IMAGE)
                .count(),
        )
    };
    let (injected, updated) = rig
        .faults_and_kills(scale.kills, scale.faults, updated_pods)
        .await;
    let faults_over = Instant::now();
    eprintln!(
        "faults: over after {:.0?}, {updated} pods updated to {NEW_IMAGE}: {}",
        rig.started.elapsed(),
        describe(&injected)
    );
    assert!(
        updated > 0,
        "seed {seed}: no pod was updated while the faults went on: maxUnavailable was not \
         tested under them"
    );

    let deadline = Instant::now() + FINISH_TIMEOUT;
    loop {
        rig.manager.keep_running();
        let errors = background_kubelet.errors();
        assert!(
            errors.is_empty(),
            "seed {seed}: the kubelet failed: {errors:?}"
        );
        let done = pods
            .list(&ListParams::default())
            .await
            .map(|l| {
                l.items
                    .iter()
                    .filter(|p| kubelet::pod_ready(p) && kubelet::runs(p, SIDECAR, NEW_IMAGE))
                    .count()
            })
            .unwrap_or(0);
        let set = sets.get(name).await.ok();
        let counted = set.as_ref().map(counts_of);
        let all = ROLLOUT_PODS as i32;
        if done == ROLLOUT_PODS && counted == Some(counts(all, all, all, all)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "seed {seed}: the rollout did not finish within {FINISH_TIMEOUT:?} after the faults \
             stopped: {done} pods ready on {NEW_IMAGE}; {}",
            set.as_ref().map(describe_set).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tracker.abort();
    drop(background_kubelet);

    let max = record.max.load(std::sync::atomic::Ordering::SeqCst);
    let at_max = record.at_max.lock().unwrap().clone();
    eprintln!(
        "faults: seed {seed}: rollout done {:.0?} after the faults stopped ({:.0?} in all); at \
         most {max} pods in flight; manager started {} times, {} of them after exiting on its own",
        faults_over.elapsed(),
        rig.started.elapsed(),
        rig.manager.logs.len(),
        rig.manager.exits.len(),
    );
    assert!(
        max <= ROLLOUT_MAX_UNAVAILABLE,
        "seed {seed}: {max} pods were in flight at once (maxUnavailable \
         {ROLLOUT_MAX_UNAVAILABLE}): {at_max:?}"
    );
    assert!(
        max >= 1,
        "seed {seed}: the tracker never saw a pod in flight"
    );
    rig.assert_no_panic_and_every_fault(&injected);
}
