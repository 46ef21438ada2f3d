//! SidecarSet image pre-download end to end (issue 7): the manager of the webhook test cluster
//! (webhooks, SidecarSet, ImagePullJob and NodeImage controllers), two Nodes each served by a
//! containerd and a node daemon of its own, one registry on loopback, and the test playing
//! kubelet for the pods.
//!
//! The issue's requirement: the new sidecar image is present on each old pod's node before that
//! pod is upgraded. Checked three ways, per pod:
//! - the moment a watch shows the pod's sidecar spec image turn to the new one, the test asks
//!   that node's containerd over CRI (`ImageStatus`): it must have the new image (its image ID
//!   and manifest digest, so the content is the new one, not just the tag);
//! - the contract's gate: the NodeImage status write that reported the new tag `Succeeded` on
//!   the pod's node comes before the pod write that changed its image. Both objects live in the
//!   same etcd of the test control plane, where a `resourceVersion` is the etcd revision of the
//!   write, so the two compare (the test refuses a non-numeric one);
//! - containerd's own log: its `PullImage "<new image>" returns` line on that node is older than
//!   the moment the test saw the pod change.
//!
//! The nodes' pull order (by the NodeImage writes and by containerd's logs) and the pods'
//! upgrade order (by the pods' writes) are recorded and printed (`--nocapture`); with the
//! default parallelism 1 the nodes must pull in the job's `selector.names` order.
//!
//! Also checked, per the contract: one ImagePullJob, seen deleted once the rollout completes;
//! `RolloutHeld` True/`WaitingForPreDownload` and `ImagePreDownload` True while pulling, then
//! `ImagePreDownload` False/`NothingToPull`; a `CreatedImagePullJob` event; the registry serving
//! v2 to each node. Last, every difference between the job as first created and the contract's
//! description of it (name, labels, owner, spec) is listed in one failure, so a shape mismatch
//! never hides the outcome of the ordering checks above.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::future::Future;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::TryStreamExt;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::{Image, ImageSpec, ImageStatusRequest, PullImageRequest};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kruise_rs_api::imagepulljob::ImagePullJob;
use kruise_rs_api::nodeimage::{ImagePullPhase, NodeImage};
use kruise_rs_api::sidecarset::SidecarSet;
use kruise_rs_api::well_known::{CONTROLLER_REVISION_HASH, SIDECARSET_NAME_LABEL};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use crate::sidecarset_upgrade::{
    admit_injected, condition, counts, counts_of, create_sidecarset, describe_pods, describe_set,
    ensure_manager_namespace, get_set, poll, spec_image, update_spec,
};
use crate::support::cri_proxy::image_client;
use crate::support::daemon::Daemon;
use crate::support::kubelet::{self, BackgroundKubelet};
use crate::support::node::{ExtraContainerd, NodeEnv, Variant, node_env};
use crate::support::webhook::{MANAGER_NAMESPACE, webhook_cluster};
use crate::support::{CONTROLLED_LABEL, create_ready_node, unique_name, wait_for};

/// The SidecarSet's one sidecar container.
const SIDECAR: &str = "proxy";
/// Pods per node; the SidecarSet's maxUnavailable is 1, so the rollout takes several batches.
const PODS_PER_NODE: usize = 2;
/// One step (a node coming up, a cache catching up).
const STEP: Duration = Duration::from_secs(60);
/// The whole rollout: two sequential pulls and four pods, one at a time.
const ROLLOUT: Duration = Duration::from_secs(180);

const IMAGE_PREDOWNLOAD: &str = "ImagePreDownload";
const ROLLOUT_HELD: &str = "RolloutHeld";
const SIDECARSET_CONTAINER_LABEL: &str = "apps.kruise.io/sidecarset-container";

// --- a node: containerd, daemon, Node ---------------------------------------------------------

/// The daemon of `node` in this process, talking to the webhook cluster's apiserver, once it has
/// found its runtime.
async fn start_daemon(node: &str, socket: &Path, kubeconfig: &Path) -> Daemon {
    let daemon = Daemon::start(node, socket, kubeconfig, 2).await;
    daemon.wait_ready(true, STEP).await;
    daemon
}

/// One node of the test: its Node object, containerd and daemon.
struct TestNode {
    name: String,
    cri: ImageServiceClient<Channel>,
    daemon: Option<Daemon>,
    containerd: ExtraContainerd,
    // After `containerd`: the directory goes once containerd is stopped.
    _dir: tempfile::TempDir,
}

impl TestNode {
    /// Starts containerd, pulls `running` into it (the image the node's pods run, as a kubelet
    /// pulled it to start them), creates the Node (labelled for the test controllers, Ready),
    /// waits for the manager to create its NodeImage, and starts the daemon.
    async fn start(env: &NodeEnv, client: &Client, name: String, run: &str, running: &str) -> Self {
        // Short: the socket path must stay under 100 bytes.
        let dir = tempfile::Builder::new()
            .prefix("pdl")
            .tempdir_in("/tmp")
            .expect("a directory for containerd");
        let containerd = env.start_containerd(dir.path());
        let mut cri = image_client(containerd.socket());
        cri.pull_image(PullImageRequest {
            image: Some(image_spec(running)),
            ..PullImageRequest::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{name}: pulling {running} through CRI: {e}"));

        create_ready_node(
            client,
            &name,
            BTreeMap::from([(CONTROLLED_LABEL.to_owned(), run.to_owned())]),
        )
        .await;
        let nodeimages = Api::<NodeImage>::all(client.clone());
        wait_for(
            &format!("the manager to create NodeImage {name} for the Ready Node"),
            STEP,
            || async { nodeimages.get_opt(&name).await.ok().flatten() },
        )
        .await;

        let kubeconfig = webhook_cluster().kubeconfig_path().to_owned();
        let daemon = start_daemon(&name, containerd.socket(), &kubeconfig).await;
        TestNode {
            name,
            cri,
            daemon: Some(daemon),
            containerd,
            _dir: dir,
        }
    }

    /// Stops the daemon and deletes the Node (its NodeImage goes with it); containerd stops
    /// when the node is dropped.
    async fn stop(mut self, client: &Client) {
        if let Some(daemon) = self.daemon.take() {
            daemon.stop().await;
        }
        match Api::<Node>::all(client.clone())
            .delete(&self.name, &DeleteParams::default())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => panic!("deleting Node {}: {e}", self.name),
        }
    }
}

fn image_spec(image: &str) -> ImageSpec {
    ImageSpec {
        image: image.to_owned(),
        ..ImageSpec::default()
    }
}

/// What a containerd reports over CRI for `image`: `None` when it does not have it.
async fn image_status(
    cri: &mut ImageServiceClient<Channel>,
    image: &str,
) -> Result<Option<Image>, String> {
    cri.image_status(ImageStatusRequest {
        image: Some(image_spec(image)),
        verbose: false,
    })
    .await
    .map(|r| r.into_inner().image)
    .map_err(|e| format!("CRI ImageStatus {image}: {e}"))
}

/// The moments containerd's CRI plugin logged `PullImage "<image>" returns image reference …`
/// (one per PullImage call that succeeded), from its log.
fn pull_returns(log: &Path, image: &str) -> Vec<SystemTime> {
    let text = std::fs::read_to_string(log)
        .unwrap_or_else(|e| panic!("reading containerd's log {}: {e}", log.display()));
    let needle = format!(r#"PullImage \"{image}\" returns image reference"#);
    text.lines()
        .filter(|line| line.contains(&needle))
        .map(|line| {
            let time = line
                .strip_prefix("time=\"")
                .and_then(|rest| rest.split_once('"'))
                .map(|(time, _)| time)
                .unwrap_or_else(|| panic!("no time= in containerd's log line {line:?}"));
            let time: Timestamp = time
                .parse()
                .unwrap_or_else(|e| panic!("containerd's log time {time:?}: {e}"));
            SystemTime::from(time)
        })
        .collect()
}

// --- watching: what happened, in which order ----------------------------------------------------

/// A pod whose sidecar spec image was seen to turn to the new image.
#[derive(Clone, Debug)]
struct Upgrade {
    pod: String,
    node: String,
    /// The pod's resourceVersion in the first event showing the new image.
    revision: u64,
    /// Seen while the watch re-listed (then `revision` may be later than the change itself).
    relisted: bool,
    seen_at: SystemTime,
    /// CRI `ImageStatus` of the new image on the pod's node, asked right after seeing it.
    on_node: Result<Option<Image>, String>,
}

/// The first NodeImage write a watch saw with the new tag in a node's spec or finished in its
/// status.
#[derive(Clone, Debug)]
struct NodeEvent {
    node: String,
    revision: u64,
    seen_at: SystemTime,
    phase: Option<ImagePullPhase>,
    message: Option<String>,
}

#[derive(Clone, Debug)]
struct JobSeen {
    first: ImagePullJob,
    deleted: bool,
}

#[derive(Default)]
struct Timeline {
    upgrades: Vec<Upgrade>,
    /// The new tag written into the node's NodeImage spec (the job asking).
    requested: Vec<NodeEvent>,
    /// The new tag reported Succeeded or Failed by the node.
    finished: Vec<NodeEvent>,
    /// `ImagePreDownload` and `RolloutHeld` of the SidecarSet, each time either changed.
    conditions: Vec<(SystemTime, String)>,
    jobs: BTreeMap<String, JobSeen>,
    /// Watch errors (each followed by a retry).
    watch_errors: Vec<String>,
}

type Shared = Arc<Mutex<Timeline>>;

enum Seen<K> {
    /// In a (re-)list: the object as it is now, possibly past several writes.
    Listed(K),
    /// A watch event: this very write.
    Changed(K),
    Deleted(K),
}

/// A watch running in the background; aborted when dropped.
struct Watch(JoinHandle<()>);

impl Drop for Watch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Watches `api`, handing every object to `on`; returns once the initial list is done.
async fn watch<K, F, Fut>(
    what: &'static str,
    api: Api<K>,
    config: watcher::Config,
    timeline: Shared,
    mut on: F,
) -> Watch
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    F: FnMut(Seen<K>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let (synced_tx, synced) = oneshot::channel();
    let task = tokio::spawn(async move {
        let mut synced_tx = Some(synced_tx);
        let stream = watcher(api, config).default_backoff();
        let mut stream = std::pin::pin!(stream);
        loop {
            match stream.try_next().await {
                Ok(Some(watcher::Event::InitApply(object))) => on(Seen::Listed(object)).await,
                Ok(Some(watcher::Event::Apply(object))) => on(Seen::Changed(object)).await,
                Ok(Some(watcher::Event::Delete(object))) => on(Seen::Deleted(object)).await,
                Ok(Some(watcher::Event::InitDone)) => {
                    if let Some(tx) = synced_tx.take() {
                        let _ = tx.send(());
                    }
                }
                Ok(Some(watcher::Event::Init)) => {}
                Ok(None) => return,
                Err(e) => lock(&timeline)
                    .watch_errors
                    .push(format!("watching {what}: {e}")),
            }
        }
    });
    match tokio::time::timeout(STEP, synced).await {
        Ok(Ok(())) => Watch(task),
        _ => panic!("the watch of {what} did not list within {STEP:?}"),
    }
}

fn lock(timeline: &Shared) -> std::sync::MutexGuard<'_, Timeline> {
    timeline.lock().expect("timeline lock")
}

fn revision_of(meta: &ObjectMeta) -> u64 {
    let rv = meta.resource_version.as_deref().unwrap_or_default();
    rv.parse().unwrap_or_else(|_| {
        panic!(
            "resourceVersion {rv:?} is not an etcd revision; this test compares the revisions \
             of writes to different objects and needs the local test control plane"
        )
    })
}

fn describe_conditions(set: &SidecarSet) -> String {
    [IMAGE_PREDOWNLOAD, ROLLOUT_HELD]
        .iter()
        .map(|type_| match condition(set, type_) {
            Some(c) => format!("{type_}={}/{} ({})", c.status, c.reason, c.message),
            None => format!("{type_}=absent"),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Everything this test watches, from before the image change to the end.
struct Watches {
    _all: Vec<Watch>,
}

struct Scene<'a> {
    client: &'a Client,
    ns: &'a str,
    set: &'a str,
    run: &'a str,
    repository: &'a str,
    new_image: &'a str,
    new_tag: &'a str,
    nodes: &'a [TestNode],
}

async fn start_watches(scene: &Scene<'_>, timeline: &Shared) -> Watches {
    let mut all = Vec::new();

    // Pods: the moment one shows the new image, ask its node's containerd.
    let cris: Arc<HashMap<String, ImageServiceClient<Channel>>> = Arc::new(
        scene
            .nodes
            .iter()
            .map(|n| (n.name.clone(), n.cri.clone()))
            .collect(),
    );
    let new_image = scene.new_image.to_owned();
    let shared = timeline.clone();
    all.push(
        watch(
            "pods",
            Api::<Pod>::namespaced(scene.client.clone(), scene.ns),
            watcher::Config::default(),
            timeline.clone(),
            move |seen| {
                let (cris, new_image, timeline) = (cris.clone(), new_image.clone(), shared.clone());
                async move {
                    let (pod, relisted) = match seen {
                        Seen::Listed(pod) => (pod, true),
                        Seen::Changed(pod) => (pod, false),
                        Seen::Deleted(_) => return,
                    };
                    let name = pod.name_any();
                    if spec_image(&pod, SIDECAR) != new_image
                        || lock(&timeline).upgrades.iter().any(|u| u.pod == name)
                    {
                        return;
                    }
                    let seen_at = SystemTime::now();
                    let node = pod
                        .spec
                        .as_ref()
                        .and_then(|s| s.node_name.clone())
                        .unwrap_or_default();
                    let on_node = match cris.get(&node) {
                        Some(cri) => image_status(&mut cri.clone(), &new_image).await,
                        None => Err(format!("pod {name} is on {node:?}, not a test node")),
                    };
                    lock(&timeline).upgrades.push(Upgrade {
                        pod: name,
                        node,
                        revision: revision_of(&pod.metadata),
                        relisted,
                        seen_at,
                        on_node,
                    });
                }
            },
        )
        .await,
    );

    // NodeImages: when the new tag is asked for, and when the node reports it done.
    let (repository, tag) = (scene.repository.to_owned(), scene.new_tag.to_owned());
    let shared = timeline.clone();
    all.push(
        watch(
            "NodeImages",
            Api::<NodeImage>::all(scene.client.clone()),
            watcher::Config::default().labels(&format!("{CONTROLLED_LABEL}={}", scene.run)),
            timeline.clone(),
            move |seen| {
                let (repository, tag, timeline) = (repository.clone(), tag.clone(), shared.clone());
                async move {
                    let (Seen::Listed(ni) | Seen::Changed(ni)) = seen else {
                        return;
                    };
                    let node = ni.name_any();
                    let revision = revision_of(&ni.metadata);
                    let seen_at = SystemTime::now();
                    let mut timeline = lock(&timeline);
                    let asked = ni
                        .spec
                        .images
                        .get(repository.as_str())
                        .is_some_and(|i| i.tags.iter().any(|t| t.tag == tag));
                    if asked && !timeline.requested.iter().any(|e| e.node == node) {
                        timeline.requested.push(NodeEvent {
                            node: node.clone(),
                            revision,
                            seen_at,
                            phase: None,
                            message: None,
                        });
                    }
                    let done = ni
                        .status
                        .as_ref()
                        .and_then(|s| s.image_statuses.get(repository.as_str()))
                        .and_then(|i| i.tags.iter().find(|t| t.tag == tag))
                        .filter(|t| {
                            matches!(t.phase, ImagePullPhase::Succeeded | ImagePullPhase::Failed)
                        });
                    if let Some(done) = done
                        && !timeline.finished.iter().any(|e| e.node == node)
                    {
                        timeline.finished.push(NodeEvent {
                            node,
                            revision,
                            seen_at,
                            phase: Some(done.phase),
                            message: done.message.clone(),
                        });
                    }
                }
            },
        )
        .await,
    );

    // The SidecarSet's two conditions of interest.
    let shared = timeline.clone();
    all.push(
        watch(
            "the SidecarSet",
            Api::<SidecarSet>::all(scene.client.clone()),
            watcher::Config::default().fields(&format!("metadata.name={}", scene.set)),
            timeline.clone(),
            move |seen| {
                let timeline = shared.clone();
                async move {
                    let (Seen::Listed(set) | Seen::Changed(set)) = seen else {
                        return;
                    };
                    let now = describe_conditions(&set);
                    let mut timeline = lock(&timeline);
                    if timeline.conditions.last().map(|(_, c)| c) != Some(&now) {
                        timeline.conditions.push((SystemTime::now(), now));
                    }
                }
            },
        )
        .await,
    );

    // The SidecarSet's ImagePullJobs.
    let shared = timeline.clone();
    all.push(
        watch(
            "the ImagePullJobs",
            Api::<ImagePullJob>::namespaced(scene.client.clone(), MANAGER_NAMESPACE),
            watcher::Config::default().labels(&format!("{SIDECARSET_NAME_LABEL}={}", scene.set)),
            timeline.clone(),
            move |seen| {
                let timeline = shared.clone();
                async move {
                    let mut timeline = lock(&timeline);
                    match seen {
                        Seen::Listed(job) | Seen::Changed(job) => {
                            timeline.jobs.entry(job.name_any()).or_insert(JobSeen {
                                first: job,
                                deleted: false,
                            });
                        }
                        Seen::Deleted(job) => {
                            let name = job.name_any();
                            timeline
                                .jobs
                                .entry(name)
                                .or_insert(JobSeen {
                                    first: job,
                                    deleted: true,
                                })
                                .deleted = true;
                        }
                    }
                }
            },
        )
        .await,
    );
    Watches { _all: all }
}

// --- the report -------------------------------------------------------------------------------

fn since(t0: SystemTime, t: SystemTime) -> String {
    match t.duration_since(t0) {
        Ok(d) => format!("+{:.3}s", d.as_secs_f64()),
        Err(e) => format!("-{:.3}s", e.duration().as_secs_f64()),
    }
}

/// The timeline, in the order things were seen, relative to the image change at `t0`.
fn describe_timeline(
    timeline: &Timeline,
    t0: SystemTime,
    pulls: &[(String, Vec<SystemTime>)],
) -> String {
    let mut entries: Vec<(SystemTime, String)> = Vec::new();
    for e in &timeline.requested {
        let line = format!("rv {} NodeImage {}: new tag asked for", e.revision, e.node);
        entries.push((e.seen_at, line));
    }
    for (node, times) in pulls {
        for t in times {
            entries.push((
                *t,
                format!("containerd of {node}: PullImage returned (its log)"),
            ));
        }
    }
    for e in &timeline.finished {
        let line = format!(
            "rv {} NodeImage {}: new tag {:?} {}",
            e.revision,
            e.node,
            e.phase,
            e.message.as_deref().unwrap_or_default()
        );
        entries.push((e.seen_at, line));
    }
    for u in &timeline.upgrades {
        let line = format!(
            "rv {} pod {} on {}: sidecar spec image changed{}; node's containerd then: {}",
            u.revision,
            u.pod,
            u.node,
            if u.relisted {
                " (seen in a re-list)"
            } else {
                ""
            },
            match &u.on_node {
                Ok(Some(image)) => format!("has it, id {}", image.id),
                Ok(None) => "does NOT have it".to_owned(),
                Err(e) => e.clone(),
            }
        );
        entries.push((u.seen_at, line));
    }
    for (t, c) in &timeline.conditions {
        entries.push((*t, format!("SidecarSet: {c}")));
    }
    entries.sort_by_key(|(t, _)| *t);
    let mut out = String::from("timeline (t0 = the sidecar image change):\n");
    for (t, line) in entries {
        let _ = writeln!(out, "  {} {line}", since(t0, t));
    }
    for (name, job) in &timeline.jobs {
        let _ = writeln!(
            out,
            "  job {name}: selector.names {:?} when first seen, deleted {}",
            job.first.spec.template.selector.as_ref().map(|s| &s.names),
            job.deleted
        );
    }
    for e in &timeline.watch_errors {
        let _ = writeln!(out, "  watch error: {e}");
    }
    out
}

// --- the test ---------------------------------------------------------------------------------

/// The issue's end-to-end requirement: two nodes (each its own containerd and daemon), one
/// registry, a SidecarSet with maxUnavailable 1 over four pods, two per node. After the sidecar
/// image changes from v1 to v2, each pod's node has v2 before that pod is upgraded, the
/// SidecarSet's one ImagePullJob is what the contract says, and it is deleted once the rollout
/// completes.
#[tokio::test]
async fn each_node_has_the_new_sidecar_image_before_its_pods_are_upgraded() {
    let env = node_env().await;
    let cluster = webhook_cluster();
    let client = cluster.client().await;
    ensure_manager_namespace(&client).await;
    let ns = cluster.namespace("predl").await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let run = unique_name("predl");
    let set_name = run.clone();
    let app = unique_name("app");

    let repo = format!("kruise-rs/{run}/proxy");
    let repository = format!("{}/{repo}", env.registry());
    let (v1, v2) = (format!("{repository}:v1"), format!("{repository}:v2"));
    env.push(Variant::V1, &v1);
    let v2_digest = env.push(Variant::V2, &v2);
    let v2_id = env.image_id(Variant::V2);
    assert_ne!(
        env.image_id(Variant::V1),
        v2_id,
        "v1 and v2 differ in content"
    );

    let mut nodes = Vec::new();
    for suffix in ["a", "b"] {
        let node = TestNode::start(env, &client, format!("{run}-{suffix}"), &run, &v1).await;
        nodes.push(node);
    }
    for node in &mut nodes {
        assert_eq!(
            image_status(&mut node.cri, &v2)
                .await
                .map(|i| i.map(|i| i.id)),
            Ok(None),
            "{} has no {v2} before the change",
            node.name
        );
    }

    let spec = json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "SidecarSet",
        "metadata": {"name": &set_name, "labels": {CONTROLLED_LABEL: &run}},
        "spec": {
            "selector": {"matchLabels": {"app": &app}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": &ns}},
            "updateStrategy": {"type": "RollingUpdate", "maxUnavailable": 1},
            "containers": [{
                "name": SIDECAR,
                "image": &v1,
                "imagePullPolicy": "IfNotPresent",
                "command": ["/bin/busybox", "sleep", "3600"],
                "podInjectPolicy": "BeforeAppContainer",
            }],
        }
    });
    let set = create_sidecarset(&client, &spec).await;
    let mut pod_nodes = BTreeMap::new();
    for i in 0..PODS_PER_NODE {
        for node in &nodes {
            let template = json!({
                "metadata": {"name": format!("web-{i}"), "labels": {"app": &app}},
                "spec": {
                    "nodeName": &node.name,
                    "containers": [{
                        "name": "main",
                        "image": "busybox:1.36",
                        "command": ["/bin/sh", "-c", "sleep 10000000"],
                    }],
                },
            });
            let pod = admit_injected(&pods, &template, &[&set]).await;
            assert_eq!(spec_image(&pod, SIDECAR), v1, "{pod:?}");
            kubelet::start(&pods, &pod.name_any()).await;
            pod_nodes.insert(pod.name_any(), node.name.clone());
        }
    }
    // `admit_injected` deletes a pod the webhook's cache injected with a stale SidecarSet and
    // tries again; a pod bound to a node stays Terminating until its kubelet confirms, so the
    // test confirms for it.
    for pod in pods
        .list(&ListParams::default())
        .await
        .expect("listing pods")
    {
        if pod.metadata.deletion_timestamp.is_some() {
            match pods
                .delete(&pod.name_any(), &DeleteParams::default().grace_period(0))
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => panic!("removing the deleted pod {}: {e}", pod.name_any()),
            }
        }
    }
    let total = i32::try_from(pod_nodes.len()).expect("a few pods");
    poll(
        "the SidecarSet to count its pods, all on v1 and ready",
        STEP,
        || async {
            let set = get_set(&client, &set_name).await;
            let status = set.status.clone().unwrap_or_default();
            if status.observed_generation == set.metadata.generation
                && counts_of(&set) == counts(total, total, total, total)
            {
                Ok(())
            } else {
                Err(describe_set(&set))
            }
        },
    )
    .await;
    let jobs = Api::<ImagePullJob>::namespaced(client.clone(), MANAGER_NAMESPACE);
    let set_jobs = ListParams::default().labels(&format!("{SIDECARSET_NAME_LABEL}={set_name}"));
    let before = jobs.list(&set_jobs).await.expect("listing jobs").items;
    assert!(
        before.is_empty(),
        "no pre-download before the image changes: {before:?}"
    );

    let timeline: Shared = Arc::default();
    let scene = Scene {
        client: &client,
        ns: &ns,
        set: &set_name,
        run: &run,
        repository: &repository,
        new_image: &v2,
        new_tag: "v2",
        nodes: &nodes,
    };
    let watches = start_watches(&scene, &timeline).await;
    let background = BackgroundKubelet::spawn(pods.clone(), 7);

    // The change.
    let t0 = SystemTime::now();
    let mut containers = spec["spec"]["containers"].clone();
    containers[0]["image"] = json!(v2);
    update_spec(&client, &set_name, json!({"containers": containers})).await;

    let pod_list = ListParams::default();
    let (finished_set, _) = poll(
        "every pod to run the new sidecar image and the rollout to complete",
        ROLLOUT,
        || async {
            let set = get_set(&client, &set_name).await;
            let mut list = pods.list(&pod_list).await.expect("listing pods").items;
            list.sort_by_key(|p| p.name_any());
            let seen = || {
                format!(
                    "{}; pods: {}\n{}",
                    describe_set(&set),
                    describe_pods(&list, SIDECAR),
                    describe_timeline(&lock(&timeline), t0, &[])
                )
            };
            let status = set.status.clone().unwrap_or_default();
            let done = status.observed_generation == set.metadata.generation
                && counts_of(&set) == counts(total, total, total, total)
                && condition(&set, ROLLOUT_HELD)
                    .is_some_and(|c| c.status == "False" && c.reason == "Updated")
                && pod_nodes.keys().all(|name| {
                    list.iter()
                        .any(|p| &p.name_any() == name && kubelet::runs(p, SIDECAR, &v2))
                });
            if done { Ok((set, list)) } else { Err(seen()) }
        },
    )
    .await;
    let latest = finished_set
        .status
        .as_ref()
        .and_then(|s| s.latest_revision.clone())
        .expect("status.latestRevision");

    // Rollout complete: the jobs go, pre-download has nothing left to pull.
    poll(
        "the SidecarSet's ImagePullJobs to be deleted after the rollout",
        STEP,
        || async {
            let left = jobs.list(&set_jobs).await.expect("listing jobs").items;
            let names: Vec<String> = left.iter().map(|j| j.name_any()).collect();
            if names.is_empty() {
                Ok(())
            } else {
                Err(format!("jobs left: {names:?}"))
            }
        },
    )
    .await;
    poll(
        "ImagePreDownload False/NothingToPull after the rollout",
        STEP,
        || async {
            let set = get_set(&client, &set_name).await;
            match condition(&set, IMAGE_PREDOWNLOAD) {
                Some(c) if c.status == "False" && c.reason == "NothingToPull" => Ok(()),
                _ => Err(describe_set(&set)),
            }
        },
    )
    .await;
    let events = Api::<Event>::all(client.clone());
    let created_events = ListParams::default().fields(&format!(
        "involvedObject.name={set_name},reason=CreatedImagePullJob"
    ));
    poll(
        "a Normal event CreatedImagePullJob on the SidecarSet",
        STEP,
        || async {
            let list = events
                .list(&created_events)
                .await
                .expect("listing events")
                .items;
            let found = list.iter().any(|e| {
                e.type_.as_deref() == Some("Normal")
                    && e.involved_object.kind.as_deref() == Some("SidecarSet")
            });
            if found {
                Ok(())
            } else {
                Err(format!("events {list:?}"))
            }
        },
    )
    .await;
    // The registry served v2 to each containerd: real pulls.
    let manifest = format!("/v2/{repo}/manifests/v2 ");
    wait_for(
        "the registry to log a v2 manifest request from each node",
        STEP,
        || async {
            (env.registry_log_lines(env.registry(), &manifest).len() >= nodes.len()).then_some(())
        },
    )
    .await;
    drop(watches);
    let kubelet_errors = background.errors();
    drop(background);

    let pulls: Vec<(String, Vec<SystemTime>)> = nodes
        .iter()
        .map(|n| (n.name.clone(), pull_returns(&n.containerd.log(), &v2)))
        .collect();
    let timeline = std::mem::take(&mut *lock(&timeline));
    let report = describe_timeline(&timeline, t0, &pulls);
    eprintln!("{report}");
    assert!(
        kubelet_errors.is_empty(),
        "the test kubelet: {kubelet_errors:?}"
    );

    // --- the one job, and the order it lists the nodes in ------------------------------------
    assert_eq!(
        timeline.jobs.len(),
        1,
        "one container changed, no imagePullSecrets: one job in {MANAGER_NAMESPACE}\n{report}"
    );
    let (job_name, seen_job) = timeline.jobs.iter().next().expect("one job");
    assert!(
        seen_job.deleted,
        "the watch saw job {job_name} deleted\n{report}"
    );
    let job = &seen_job.first;
    let names: Vec<String> = job
        .spec
        .template
        .selector
        .as_ref()
        .map(|s| s.names.clone())
        .unwrap_or_default();
    assert_eq!(
        names.iter().collect::<BTreeSet<_>>(),
        nodes.iter().map(|n| &n.name).collect::<BTreeSet<_>>(),
        "selector.names of job {job_name}: both nodes\n{report}"
    );
    assert_eq!(names.len(), nodes.len(), "no node twice: {names:?}");

    // --- each pod's node had the image before the pod was upgraded --------------------------
    let upgraded: BTreeSet<&String> = timeline.upgrades.iter().map(|u| &u.pod).collect();
    assert_eq!(
        upgraded,
        pod_nodes.keys().collect::<BTreeSet<_>>(),
        "every pod seen changing to {v2}\n{report}"
    );
    let expected_digest = format!("{repository}@{v2_digest}");
    for u in &timeline.upgrades {
        assert_eq!(
            Some(&u.node),
            pod_nodes.get(&u.pod),
            "pod {} kept its node",
            u.pod
        );
        match &u.on_node {
            Ok(Some(image))
                if image.id == v2_id && image.repo_digests.contains(&expected_digest) => {}
            other => panic!(
                "when pod {} was seen on {v2}, its node {}'s containerd did not have it \
                 (id {v2_id}, {expected_digest}): {other:?}\n{report}",
                u.pod, u.node
            ),
        }
        assert!(
            !u.relisted,
            "pod {}'s change was seen in a re-list, so its write's revision is unknown\n{report}",
            u.pod
        );
        let finished = timeline
            .finished
            .iter()
            .find(|e| e.node == u.node)
            .unwrap_or_else(|| {
                panic!(
                    "pod {} was upgraded, but NodeImage {} never reported {v2} done\n{report}",
                    u.pod, u.node
                )
            });
        assert_eq!(
            finished.phase,
            Some(ImagePullPhase::Succeeded),
            "{}: {:?}\n{report}",
            u.node,
            finished.message
        );
        assert!(
            finished.revision < u.revision,
            "pod {} (rv {}) was upgraded before NodeImage {} reported {v2} Succeeded (rv {})\n{report}",
            u.pod,
            u.revision,
            u.node,
            finished.revision
        );
        let (_, returns) = pulls
            .iter()
            .find(|(n, _)| n == &u.node)
            .expect("a node of the test");
        assert!(
            returns.iter().any(|t| *t < u.seen_at),
            "containerd of {} logged no PullImage {v2} return before pod {} was seen changed\n{report}",
            u.node,
            u.pod
        );
    }

    // --- order: the nodes pull in the job's order, one at a time (parallelism 1) -------------
    let mut by_report: Vec<&NodeEvent> = timeline.finished.iter().collect();
    by_report.sort_by_key(|e| e.revision);
    let report_order: Vec<&String> = by_report.iter().map(|e| &e.node).collect();
    assert_eq!(
        report_order,
        names.iter().collect::<Vec<_>>(),
        "nodes finished in selector.names order\n{report}"
    );
    let mut by_containerd: Vec<(SystemTime, &String)> = pulls
        .iter()
        .map(|(node, times)| {
            let first = *times.iter().min().unwrap_or_else(|| {
                panic!("containerd of {node} logged no PullImage {v2} return\n{report}")
            });
            (first, node)
        })
        .collect();
    by_containerd.sort();
    assert_eq!(
        by_containerd.iter().map(|(_, n)| *n).collect::<Vec<_>>(),
        names.iter().collect::<Vec<_>>(),
        "containerds pulled in selector.names order\n{report}"
    );
    let mut upgrade_order = timeline.upgrades.clone();
    upgrade_order.sort_by_key(|u| u.revision);
    eprintln!(
        "node pull order: {report_order:?}; pod upgrade order: {:?}",
        upgrade_order
            .iter()
            .map(|u| format!("{} ({})", u.pod, u.node))
            .collect::<Vec<_>>()
    );

    // --- what the SidecarSet said meanwhile ----------------------------------------------
    let said = |needle: &str| timeline.conditions.iter().any(|(_, c)| c.contains(needle));
    assert!(
        said(&format!("{ROLLOUT_HELD}=True/WaitingForPreDownload")),
        "RolloutHeld True/WaitingForPreDownload while the first node pulled\n{report}"
    );
    assert!(
        said(&format!("{IMAGE_PREDOWNLOAD}=True/Pulling"))
            || said(&format!("{IMAGE_PREDOWNLOAD}=True/Pulled")),
        "ImagePreDownload True while the jobs existed\n{report}"
    );

    for node in nodes {
        node.stop(&client).await;
    }

    // --- the job's shape, as the contract describes it (every difference listed) ------------
    let hash = latest
        .strip_prefix(&format!("{set_name}-"))
        .unwrap_or_else(|| panic!("latestRevision {latest} is not <set>-<hash>"));
    let job_spec = serde_json::to_value(&job.spec).expect("spec");
    let mut mismatches = Vec::new();
    let mut expect = |what: &str, got: Value, want: Value| {
        if got != want {
            mismatches.push(format!("{what}: {got}, the contract says {want}"));
        }
    };
    expect(
        "name",
        json!(job_name),
        json!(format!("{latest}-{SIDECAR}")),
    );
    let labels = job.labels();
    for (key, value) in [
        (CONTROLLED_LABEL, run.as_str()),
        (SIDECARSET_NAME_LABEL, set_name.as_str()),
        (CONTROLLER_REVISION_HASH, hash),
        (SIDECARSET_CONTAINER_LABEL, SIDECAR),
    ] {
        expect(
            &format!("label {key}"),
            json!(labels.get(key)),
            json!(value),
        );
    }
    let controllers: Vec<(String, String, String)> = job
        .owner_references()
        .iter()
        .filter(|o| o.controller == Some(true))
        .map(|o| (o.kind.clone(), o.name.clone(), o.uid.clone()))
        .collect();
    expect(
        "controller references",
        json!(controllers),
        json!([(
            "SidecarSet",
            &set_name,
            set.metadata.uid.clone().unwrap_or_default()
        )]),
    );
    expect("spec.image", job_spec["image"].clone(), json!(v2));
    expect(
        "spec.parallelism",
        job_spec["parallelism"].clone(),
        json!(1),
    );
    expect(
        "spec.pullPolicy",
        job_spec["pullPolicy"].clone(),
        json!({"backoffLimit": 1, "timeoutSeconds": 300}),
    );
    expect(
        "spec.completionPolicy",
        job_spec["completionPolicy"].clone(),
        json!({"type": "Never"}),
    );
    expect(
        "spec.imagePullPolicy",
        job_spec["imagePullPolicy"].clone(),
        json!("IfNotPresent"),
    );
    let secrets = job_spec.get("pullSecrets").cloned().unwrap_or(json!([]));
    expect("spec.pullSecrets", secrets, json!([]));
    expect(
        "spec.sandboxConfig",
        job_spec["sandboxConfig"].clone(),
        json!({"labels": {SIDECARSET_NAME_LABEL: &set_name, CONTROLLER_REVISION_HASH: hash}}),
    );
    assert!(
        mismatches.is_empty(),
        "ImagePullJob {job_name} as first created differs from the contract:\n  {}\n{job_spec}",
        mismatches.join("\n  ")
    );
}
