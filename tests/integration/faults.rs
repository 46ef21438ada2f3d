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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::{StreamExt, TryStreamExt, stream};
use kruise_rs::apis::imagepulljob::{
    ImagePullJob, ImagePullJobNodeSelector, ImagePullJobSpec, ImagePullJobTemplate,
};
use kruise_rs::apis::nodeimage::NodeImage;
use kruise_rs::apis::well_known::FAKE_NODEIMAGE;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::time::Instant;

use crate::harness::controlplane::{ControlPlane, Crds, config_for};
use crate::harness::fault_proxy::{FaultProxy, Faults, describe, restart_control_plane_process};
use crate::harness::objects::create_namespace;

const SEED_VAR: &str = "KRUISE_FAULT_SEED";
const LONG_VAR: &str = "KRUISE_FAULT_LONG";
const IMAGE: &str = "nginx";
const TAG: &str = "faults";
const RUN_LABEL: &str = "kruise-rs-faults";
/// How long the job may take to complete once the faults have stopped.
const FINISH_TIMEOUT: Duration = Duration::from_secs(240);
/// How long the apiserver may take to answer again after a restart (of itself or of etcd).
const RESTART_TIMEOUT: Duration = Duration::from_secs(90);

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

fn seed() -> u64 {
    match std::env::var(SEED_VAR) {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|e| panic!("{SEED_VAR}={text:?} is not a u64: {e}")),
        Err(_) => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_nanos() as u64,
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

/// Plays every node's daemon: each entry's version is reported Succeeded once, a random delay
/// after it is first seen. Lists every 300 ms, so that it catches up after an apiserver restart
/// without depending on the watch it would otherwise need to resume.
fn play_daemons(client: Client, seed: u64) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<NodeImage> = Api::all(client);
        let answered: Arc<Mutex<HashSet<(String, i64)>>> = Arc::default();
        let mut rng = fastrand::Rng::with_seed(seed ^ 0xdae_0000);
        let lp = ListParams::default().labels(RUN_LABEL);
        loop {
            if let Ok(list) = api.list(&lp).await {
                for ni in list {
                    let Some(entry) = tag_entry(&ni) else {
                        continue;
                    };
                    let version = entry_version(&entry);
                    if finished_version(&ni) == Some(version) {
                        continue;
                    }
                    let key = (ni.name_any(), version);
                    if !answered.lock().unwrap().insert(key.clone()) {
                        continue;
                    }
                    let delay = Duration::from_millis(rng.u64(300..2000));
                    let (api, answered) = (api.clone(), answered.clone());
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        let now = k8s_openapi::jiff::Timestamp::now().to_string();
                        let status = json!({"status": {"imageStatuses": {IMAGE: {"tags": [{
                            "tag": TAG, "phase": "Succeeded", "version": version,
                            "completionTime": now, "progress": 100
                        }]}}}});
                        let written = api
                            .patch_status(&key.0, &PatchParams::default(), &Patch::Merge(&status))
                            .await;
                        if written.is_err() {
                            // Not answered after all: the next list tries again.
                            answered.lock().unwrap().remove(&key);
                        }
                    });
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
}

/// The manager as a child process, its requests through the proxy, its output in a log file of
/// its own per start.
struct Manager {
    child: Option<Child>,
    logs: Vec<PathBuf>,
    kubeconfig: PathBuf,
    dir: PathBuf,
    exited_on_its_own: usize,
}

impl Manager {
    fn start(&mut self) {
        let log = self.dir.join(format!("manager-{}.log", self.logs.len()));
        let file = std::fs::File::create(&log).expect("the manager's log file");
        let child = Command::new(env!("CARGO_BIN_EXE_kruise-rs"))
            .arg("manager")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--probe-addr", "127.0.0.1:0", "--disable-webhooks"])
            .args(["--nodeimage-creation-delay", "0"])
            // Short, in the defaults' proportions: each start after a kill waits out the lease
            // the killed process held.
            .args(["--leader-election-lease-duration", "3s"])
            .args(["--leader-election-renew-deadline", "2s"])
            .args(["--leader-election-retry-period", "500ms"])
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
            if let Ok(Some(_)) = child.try_wait() {
                self.exited_on_its_own += 1;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_image_pull_job_keeps_parallelism_and_completes_through_faults_restarts_and_kills() {
    let seed = seed();
    let scale = scale();
    let started = Instant::now();
    eprintln!(
        "faults: seed {seed} ({SEED_VAR}={seed} replays it), {} nodes, parallelism {}, \
         {} manager kills",
        scale.nodes, scale.parallelism, scale.kills
    );
    let mut rng = fastrand::Rng::with_seed(seed);
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
    let daemons = play_daemons(client.clone(), seed);

    let dir = tempfile::Builder::new()
        .prefix("kruise-rs-faults-logs-")
        .tempdir()
        .expect("a log directory");
    let mut manager = Manager {
        child: None,
        logs: Vec::new(),
        kubeconfig: proxy.kubeconfig().to_owned(),
        dir: dir.path().to_owned(),
        exited_on_its_own: 0,
    };
    proxy.set(Faults::everything(), scale.faults);
    manager.start();

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

    // The schedule: a kill every 3–7 s (each new process first waits out the killed one's
    // 3 s Lease); the apiserver restarted after a third of them, etcd after two thirds.
    for kill in 1..=scale.kills {
        tokio::time::sleep(Duration::from_millis(rng.u64(3000..7000))).await;
        manager.kill();
        if kill == scale.kills / 3 {
            restart(plane.state_dir(), &client, "kube-apiserver").await;
        }
        if kill == 2 * scale.kills / 3 {
            restart(plane.state_dir(), &client, "etcd").await;
        }
        manager.start();
    }
    proxy.calm();
    let injected = proxy.injected();
    let faults_over = Instant::now();
    let (written, pulling) = {
        let o = observed.lock().unwrap();
        (o.entries.len(), o.pulling.values().filter(|p| **p).count())
    };
    eprintln!(
        "faults: over after {:.0?}, {written} nodes started ({pulling} pulling): {}",
        started.elapsed(),
        describe(&injected)
    );

    let deadline = Instant::now() + FINISH_TIMEOUT;
    let status = loop {
        manager.keep_running();
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
        started.elapsed(),
        o.max_pulling,
        manager.logs.len(),
        manager.exited_on_its_own,
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
    let panics = manager.panics();
    assert!(
        panics.is_empty(),
        "seed {seed}: the manager panicked: {panics:#?}"
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
