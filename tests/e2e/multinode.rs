//! Three real nodes (`NODES=3 tests/cluster/e2e.sh --ignored multinode::`): what one node cannot
//! show. `#[ignore]`d, so the one-node suite leaves them out.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kruise_rs_api::{ImagePullJob, NodeImage, SidecarSet};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::sidecarset::{
    UnavailableWatch, containerd_has_image, create_sidecarset, deployment, in_flight,
    kubelet_pulled_message, ready, running_pods, set_sidecar_image,
    set_sidecar_image_with_strategy, sidecarset, wait_every_pod_updated,
};
use crate::support::{
    self, Cluster, ClusterNode, DAEMON, FIRST_TAG, LEASE, LEASE_DURATION, RELEASE,
    SYSTEM_NAMESPACE, TIMEOUT, lease_holder, manager_logged_at, manager_pods, skopeo_copy,
    unique_name, wait_for,
};

fn require_three_nodes(cluster: &Cluster) {
    assert!(
        cluster.nodes.len() >= 3,
        "this test needs three nodes, the cluster has {}: run it with \
         NODES=3 tests/cluster/e2e.sh --ignored multinode::",
        cluster.nodes.len()
    );
}

/// When each node's containerd first had `image` and each pod was first seen patched to it, from
/// a sampler polling CRI on every node and the pods every 100 ms until told to stop. A node's
/// image is looked for before the pods in each round, so a pull and a patch seen in one round
/// count as the pull first. Pulls are dated by the start of the round that saw them: two seen in
/// one round finished in an order the sampler cannot tell (it asks the nodes one after the
/// other), so they tie.
struct RolloutSampler {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<(BTreeMap<String, Instant>, BTreeMap<String, Instant>)>,
}

impl RolloutSampler {
    fn start(cluster: &Cluster, pods: Api<Pod>, app: &str, image: &str) -> Self {
        let nodes: Vec<(String, PathBuf)> = cluster
            .nodes
            .iter()
            .map(|n| (n.name.clone(), n.containerd_socket.clone()))
            .collect();
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let (selector, image) = (
            ListParams::default().labels(&format!("app={app}")),
            image.to_owned(),
        );
        let task = tokio::spawn(async move {
            let (mut pulled, mut patched) = (BTreeMap::new(), BTreeMap::new());
            while !*stopped.borrow_and_update() {
                let round = Instant::now();
                for (node, socket) in &nodes {
                    if !pulled.contains_key(node) && containerd_has_image(socket, &image).await {
                        pulled.insert(node.clone(), round);
                    }
                }
                if let Ok(list) = pods.list(&selector).await {
                    for pod in list.items {
                        let on_image = pod.spec.as_ref().is_some_and(|s| {
                            s.containers.iter().any(|c| {
                                c.name == "sidecar" && c.image.as_deref() == Some(image.as_str())
                            })
                        });
                        if on_image {
                            patched.entry(pod.name_any()).or_insert_with(Instant::now);
                        }
                    }
                }
                let _ = tokio::time::timeout(Duration::from_millis(100), stopped.changed()).await;
            }
            (pulled, patched)
        });
        Self { stop, task }
    }

    /// Per node, when its containerd had the image; per pod, when it was patched.
    async fn stop(self) -> (BTreeMap<String, Instant>, BTreeMap<String, Instant>) {
        let _ = self.stop.send(true);
        self.task.await.expect("the rollout sampler")
    }
}

/// Pre-download across nodes, on three kubelets: one pod per node, a new sidecar image no node
/// has. Each node's daemon pulls it before that node's pod is patched (the kubelet's own event
/// for the restarted sidecar says the image was already present), the nodes pull in the order
/// the rollout patches their pods, and never more than `maxUnavailable` (1) pods are unavailable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "three real nodes: NODES=3 tests/cluster/e2e.sh --ignored multinode::"]
async fn predownload_reaches_each_node_before_its_pod_in_rollout_order() {
    let installed = support::installed().await;
    let cluster = installed.cluster;
    require_three_nodes(cluster);
    let ns = cluster.namespace("e2e-spread", json!({})).await;
    let name = unique_name("spread");
    let v1 = cluster.app_image("v1");
    // A repository of this test's own: no node has it before the rollout.
    let repository = format!("{}/e2e/{name}", cluster.registry);
    let fresh = format!("{repository}:v2");
    skopeo_copy(&cluster.test_image_source("v2"), &fresh);

    create_sidecarset(cluster, &sidecarset(&name, &ns.name, &v1, 1), &ns.name).await;
    let mut spread = deployment(&name, &v1, 3);
    let template = spread
        .spec
        .as_mut()
        .and_then(|s| s.template.spec.as_mut())
        .expect("a pod template");
    template.topology_spread_constraints = Some(vec![
        serde_json::from_value(json!({
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": name}}
        }))
        .expect("a spread constraint"),
    ]);
    Api::<Deployment>::namespaced(cluster.client(), &ns.name)
        .create(&PostParams::default(), &spread)
        .await
        .expect("creating the Deployment");
    let before = running_pods(cluster, &ns.name, &name, 3).await;
    let node_of: BTreeMap<String, String> = before
        .iter()
        .map(|p| {
            let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
            (p.name_any(), node.expect("a scheduled pod"))
        })
        .collect();
    let mut nodes: Vec<&String> = node_of.values().collect();
    nodes.sort();
    nodes.dedup();
    assert_eq!(nodes.len(), 3, "one pod per node: {node_of:?}");
    for node in &cluster.nodes {
        assert!(
            !containerd_has_image(&node.containerd_socket, &fresh).await,
            "{} has {fresh} before the rollout",
            node.name
        );
    }

    let pods: Api<Pod> = Api::namespaced(cluster.client(), &ns.name);
    let digest = support::registry_digest(&fresh);
    let watch = {
        let (fresh, digest) = (fresh.clone(), digest.clone());
        UnavailableWatch::start(pods.clone(), &name, move |p| in_flight(p, &fresh, &digest))
    };
    let sampler = RolloutSampler::start(cluster, pods.clone(), &name, &fresh);
    let started = Instant::now();
    set_sidecar_image(cluster, &name, &fresh).await;
    wait_every_pod_updated(cluster, &name, 3).await;
    let most_unavailable = watch.stop().await;
    let (pulled, patched) = sampler.stop().await;

    // Per pod, in the order the rollout patched them: its node's image, then its patch.
    let mut rolled: Vec<(Duration, Duration, &str, &str)> = Vec::new();
    for (pod, node) in &node_of {
        let patched = patched
            .get(pod)
            .unwrap_or_else(|| panic!("{pod} was never seen patched to {fresh}"));
        let pulled = pulled
            .get(node)
            .unwrap_or_else(|| panic!("{node}'s containerd never had {fresh}"));
        rolled.push((
            patched.duration_since(started),
            pulled.duration_since(started),
            pod,
            node,
        ));
    }
    rolled.sort();
    eprintln!("multinode: rollout (patched, pulled, pod, node): {rolled:?}");
    for (patched, pulled, pod, node) in &rolled {
        assert!(
            pulled <= patched,
            "{node} had {fresh} at {pulled:?}, after its pod {pod} was patched at {patched:?}"
        );
    }
    let pull_order: Vec<Duration> = rolled.iter().map(|r| r.1).collect();
    assert!(
        pull_order.is_sorted(),
        "the nodes pulled out of the rollout's order (patched, pulled, pod, node): {rolled:?}"
    );
    // The kubelet's word: each restarted sidecar found the image on its node.
    for pod in node_of.keys() {
        let message = kubelet_pulled_message(cluster, &ns.name, pod, &fresh).await;
        assert!(
            message.contains("already present on machine"),
            "{pod}'s kubelet pulled the sidecar itself: {message}"
        );
    }
    assert!(
        most_unavailable <= 1,
        "{most_unavailable} pods unavailable at once, maxUnavailable 1"
    );
}

/// The cluster's node called `name` (its index is what `tests/cluster/node.sh` takes).
fn node_named<'a>(cluster: &'a Cluster, name: &str) -> &'a ClusterNode {
    cluster
        .nodes
        .iter()
        .find(|n| n.name == name)
        .unwrap_or_else(|| panic!("{name} is none of the cluster's nodes"))
}

fn node_of_pod(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_else(|| panic!("{} is not scheduled", pod.name_any()))
}

async fn set_unschedulable(cluster: &Cluster, node: &str, unschedulable: bool) {
    Api::<Node>::all(cluster.client())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": unschedulable}})),
        )
        .await
        .unwrap_or_else(|e| panic!("setting {node} unschedulable={unschedulable}: {e}"));
}

/// No manager replica on `node` afterwards: it is cordoned, the replicas there are deleted one at
/// a time (each replaced and ready before the next goes, so admissions keep an answer), then it
/// is uncordoned. The replicas' anti-affinity keeps them on different nodes.
async fn move_managers_off(cluster: &Cluster, node: &str) {
    let client = cluster.client();
    let on_node = |pods: &[Pod]| -> Vec<String> {
        pods.iter()
            .filter(|p| node_of_pod(p) == node)
            .map(|p| p.name_any())
            .collect()
    };
    let managers = manager_pods(&client).await.expect("the manager pods");
    if on_node(&managers).is_empty() {
        return;
    }
    set_unschedulable(cluster, node, true).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    for victim in on_node(&managers) {
        pods.delete(&victim, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("deleting manager pod {victim}: {e}"));
        wait_for(
            &format!("{victim} replaced by a ready replica off {node}"),
            TIMEOUT,
            || async {
                let live = manager_pods(&client).await?;
                let holder = lease_holder(&client).await?;
                (live.len() == 2
                    && live.iter().all(ready)
                    && !live.iter().any(|p| p.name_any() == victim)
                    && live.iter().any(|p| p.name_any() == holder))
                .then_some(())
            },
        )
        .await;
    }
    set_unschedulable(cluster, node, false).await;
}

fn pull_job(name: &str, image: &str, completion: &str, parallelism: i32) -> ImagePullJob {
    serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "ImagePullJob",
        "metadata": {"name": name},
        "spec": {
            "image": image,
            // A label every kubelet puts on its own Node, so a node registering again has it.
            "selector": {"matchLabels": {"kubernetes.io/os": "linux"}},
            "parallelism": parallelism,
            "pullPolicy": {"timeoutSeconds": 60, "backoffLimit": 1},
            "completionPolicy": {"type": completion}
        }
    }))
    .expect("an ImagePullJob")
}

/// A node leaves in the middle of a label-selector ImagePullJob (the machine powers off, then its
/// Node is deleted): its NodeImage goes and the job completes counting the nodes that remain, as
/// upstream does (its `desired` is the NodeImages it selects). The node comes back (containerd
/// and kubelet start, the Node registers again): its NodeImage is created, the daemon runs there,
/// and a running `Never` job pulls its image on it; the completed job does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "three real nodes: NODES=3 tests/cluster/e2e.sh --ignored multinode::"]
async fn a_node_leaving_mid_job_is_dropped_and_a_joining_node_is_picked_up() {
    let exclusive = support::exclusive().await;
    let cluster = exclusive.cluster;
    require_three_nodes(cluster);
    let ns = cluster.namespace("e2e-churn", json!({})).await;
    let name = unique_name("churn");
    // The last node, with no manager replica left on it, so admissions keep their answers.
    let leaving = cluster.nodes.last().expect("three nodes");
    move_managers_off(cluster, &leaving.name).await;
    let once = format!("{}/e2e/{name}-once:v1", cluster.registry);
    let kept = format!("{}/e2e/{name}-kept:v1", cluster.registry);
    skopeo_copy(&cluster.test_image_source("v2"), &once);
    skopeo_copy(&cluster.test_image_source("v3"), &kept);

    cluster.node_action("down", leaving.index).await;
    let jobs: Api<ImagePullJob> = Api::namespaced(cluster.client(), &ns.name);
    for job in [
        pull_job("once", &once, "Always", 3),
        pull_job("kept", &kept, "Never", 3),
    ] {
        jobs.create(&PostParams::default(), &job)
            .await
            .expect("creating the ImagePullJob");
    }
    // The middle of the job: the two live nodes pulled, the powered-off one never answers.
    let status = wait_for(
        "the two live nodes pulled, the third pending",
        TIMEOUT,
        || async {
            let status = jobs.get("once").await.ok()?.status?;
            (status.desired == 3 && status.succeeded == 2 && status.active == 1).then_some(status)
        },
    )
    .await;
    assert!(
        status.completion_time.is_none(),
        "completed with a node pending: {status:?}"
    );

    Api::<Node>::all(cluster.client())
        .delete(&leaving.name, &DeleteParams::default())
        .await
        .expect("deleting the powered-off Node");
    let nodeimages: Api<NodeImage> = Api::all(cluster.client());
    wait_for(
        &format!("{}'s NodeImage deleted with its Node", leaving.name),
        TIMEOUT,
        || async {
            nodeimages
                .get_opt(&leaving.name)
                .await
                .ok()?
                .is_none()
                .then_some(())
        },
    )
    .await;
    let status = wait_for("the job to complete", TIMEOUT, || async {
        let status = jobs.get("once").await.ok()?.status?;
        status.completion_time.is_some().then_some(status)
    })
    .await;
    assert_eq!(
        (
            status.desired,
            status.succeeded,
            status.failed,
            status.active
        ),
        (2, 2, 0, 0),
        "the job counts the nodes that remain: {status:?}"
    );

    cluster.node_action("up", leaving.index).await;
    wait_for(
        &format!("{} registered again and Ready", leaving.name),
        TIMEOUT,
        || async {
            let node = Api::<Node>::all(cluster.client())
                .get_opt(&leaving.name)
                .await
                .ok()??;
            node_ready(&node).then_some(())
        },
    )
    .await;
    // NodeImage created (once the node is --nodeimage-creation-delay old), the daemon Ready on
    // every node: the suite's own readiness check.
    cluster.wait_ready(FIRST_TAG).await;
    let status = wait_for(
        "the running Never job to pull on the node that joined",
        TIMEOUT,
        || async {
            let status = jobs.get("kept").await.ok()?.status?;
            (status.desired == 3 && status.succeeded == 3).then_some(status)
        },
    )
    .await;
    assert_eq!(status.failed, 0, "{status:?}");
    assert!(
        containerd_has_image(&leaving.containerd_socket, &kept).await,
        "{} joined without {kept}",
        leaving.name
    );
    assert!(
        !containerd_has_image(&leaving.containerd_socket, &once).await,
        "the completed job pulled {once} on {}, which joined after it completed",
        leaving.name
    );
    jobs.delete("kept", &DeleteParams::default())
        .await
        .expect("deleting the Never job");
}

/// containerd restarts on a node and binds a new socket, which the daemon's mount of the old one
/// cannot reach (docs/decisions/0010). The daemon exits at its next runtime check and says why
/// (its container's termination message, the chart's `FallbackToLogsOnError`) instead of
/// waiting a minute for its liveness probe to fail; the kubelet starts it again with a mount of
/// the new socket, and a job pulls on that node again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "three real nodes: NODES=3 tests/cluster/e2e.sh --ignored multinode::"]
async fn after_containerd_restarts_the_daemon_exits_and_pulls_again_through_the_new_socket() {
    let exclusive = support::exclusive().await;
    let cluster = exclusive.cluster;
    require_three_nodes(cluster);
    let node = cluster.nodes.last().expect("three nodes");
    let pods: Api<Pod> = Api::namespaced(cluster.client(), SYSTEM_NAMESPACE);
    let on_node = ListParams::default()
        .labels("app.kubernetes.io/component=daemon")
        .fields(&format!("spec.nodeName={}", node.name));
    let daemon_container = |pod: &Pod| {
        pod.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.iter().find(|c| c.name == "daemon").cloned())
    };
    // Ready first: the previous test may have just rolled the daemon out.
    let (daemon, restarts) = wait_for(
        &format!("the daemon pod on {} ready", node.name),
        TIMEOUT,
        || async {
            let pod = pods.list(&on_node).await.ok()?.items.into_iter().next()?;
            let restarts = daemon_container(&pod)?.restart_count;
            ready(&pod).then(|| (pod.name_any(), restarts))
        },
    )
    .await;

    let process = format!("containerd-{}", node.index);
    // containerd 2.2.9 once ended the daemon's container itself as it restarted (exit 255,
    // reason `Unknown`, `cleaning leaked shim process`: any failure to list a shim's processes
    // counted as none; decision 0038's amendment). The node runs 2.3.7, which keeps such a shim,
    // so the daemon's own exit is the only one expected.
    let restarted = Instant::now();
    if let Err(e) = cluster.restart(&process).await {
        panic!("{e}");
    }
    let terminated = wait_for(
        &format!("{daemon} to exit and start again"),
        TIMEOUT,
        || async {
            let status = daemon_container(&pods.get(&daemon).await.ok()?)?;
            if status.restart_count <= restarts {
                return None;
            }
            status.last_state?.terminated
        },
    )
    .await;
    let exited_after = restarted.elapsed();
    let message = terminated.message.clone().unwrap_or_default();
    assert!(
        terminated.exit_code == 1
            && message.contains("is a mount of a socket nobody listens on any more"),
        "the daemon's last termination is not its own exit for a stale socket (a liveness \
         probe's kill ends it with SIGTERM, exit 0; containerd's own cleanup with 255, \
         `Unknown`: look for `cleaning leaked shim process` and its error in {process}'s \
         log): {terminated:?}"
    );
    wait_for(&format!("{daemon} ready again"), TIMEOUT, || async {
        ready(&pods.get(&daemon).await.ok()?).then_some(())
    })
    .await;
    let ready_after = restarted.elapsed();

    let ns = cluster.namespace("e2e-cri-restart", json!({})).await;
    let image = format!(
        "{}/e2e/{}:v1",
        cluster.registry,
        unique_name("after-restart")
    );
    skopeo_copy(&cluster.test_image_source("v2"), &image);
    let jobs: Api<ImagePullJob> = Api::namespaced(cluster.client(), &ns.name);
    jobs.create(
        &PostParams::default(),
        &pull_job("after", &image, "Always", 3),
    )
    .await
    .expect("creating the ImagePullJob");
    let status = wait_for("the job to complete", TIMEOUT, || async {
        let status = jobs.get("after").await.ok()?.status?;
        status.completion_time.is_some().then_some(status)
    })
    .await;
    assert_eq!(
        (status.succeeded, status.failed),
        (3, 0),
        "every node pulls, the restarted one too: {status:?}"
    );
    assert!(
        containerd_has_image(&node.containerd_socket, &image).await,
        "{} has no {image} after the job",
        node.name
    );
    eprintln!(
        "containerd restarted on {}: the daemon exited after {exited_after:.1?} and was ready \
         again after {ready_after:.1?}",
        node.name
    );
}

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The leader's node cut off the network mid-rollout (it goes NotReady; the leader runs on,
/// isolated): the other replica holds the Lease within the lease duration, and the rollout the
/// first leader started (one pod of three updated, the partition then lowered) finishes. The
/// first leader stopped its controllers before the other acquired the Lease, and does not take
/// it back once its node is connected again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "three real nodes: NODES=3 tests/cluster/e2e.sh --ignored multinode::"]
async fn the_leaders_node_cut_off_the_other_replica_finishes_the_rollout() {
    let exclusive = support::exclusive().await;
    let cluster = exclusive.cluster;
    require_three_nodes(cluster);
    let client = cluster.client();
    let ns = cluster.namespace("e2e-cut", json!({})).await;
    let name = unique_name("cut");
    let control_node = &cluster.nodes[0];
    let (v1, v2) = (cluster.app_image("v1"), cluster.app_image("v2"));

    // The rollout's pods on the node that stays: a cut-off kubelet could not restart them.
    create_sidecarset(cluster, &sidecarset(&name, &ns.name, &v1, 1), &ns.name).await;
    let mut pinned = deployment(&name, &v1, 3);
    pinned
        .spec
        .as_mut()
        .and_then(|s| s.template.spec.as_mut())
        .expect("a pod template")
        .node_selector = Some(
        [(
            "kubernetes.io/hostname".to_owned(),
            control_node.name.clone(),
        )]
        .into(),
    );
    Api::<Deployment>::namespaced(client.clone(), &ns.name)
        .create(&PostParams::default(), &pinned)
        .await
        .expect("creating the Deployment");
    running_pods(cluster, &ns.name, &name, 3).await;

    // Both replicas off node 1 (which cannot be cut), so the leader runs on node 2 or 3.
    move_managers_off(cluster, &control_node.name).await;
    let managers = manager_pods(&client).await.expect("the manager pods");
    let leader = lease_holder(&client).await.expect("a leader");
    let node_of = |pod: &str| {
        managers
            .iter()
            .find(|p| p.name_any() == pod)
            .map(node_of_pod)
            .unwrap_or_else(|| panic!("{pod} is no live manager pod"))
    };
    let leader_node = node_named(cluster, &node_of(&leader));
    let follower = managers
        .iter()
        .map(|p| p.name_any())
        .find(|p| *p != leader)
        .expect("a second replica");
    assert_ne!(
        node_of(&follower),
        leader_node.name,
        "both replicas on one node"
    );

    // The first leader updates one pod of three, held there by the partition.
    set_sidecar_image_with_strategy(cluster, &name, &v2, json!({"partition": 2})).await;
    let sidecarsets: Api<SidecarSet> = Api::all(client.clone());
    wait_for("the first leader to update one pod", TIMEOUT, || async {
        let s = sidecarsets.get(&name).await.ok()?;
        let status = s.status?;
        (status.observed_generation == s.metadata.generation && status.updated_ready_pods == 1)
            .then_some(())
    })
    .await;

    cluster.node_action("cut", leader_node.index).await;
    // Takeover is measured on the Lease (acquireTime, written by the follower on this machine's
    // clock), not by polling: the partition patch below can wait on the cut-off webhook first.
    let cut = Instant::now();
    let cut_at = Timestamp::now();
    eprintln!(
        "multinode: cut {} off, where leader {leader} runs ({follower} on {})",
        leader_node.name,
        node_of(&follower)
    );
    // Admission may reach the cut-off replica until its node is NotReady: retry.
    wait_for("the partition lowered to 0", TIMEOUT, || async {
        sidecarsets
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"updateStrategy": {"partition": 0}}})),
            )
            .await
            .ok()
    })
    .await;
    wait_for(
        &format!("{follower} to hold the Lease"),
        TIMEOUT,
        || async { (lease_holder(&client).await? == follower).then_some(()) },
    )
    .await;
    let acquired = Api::<Lease>::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .get(LEASE)
        .await
        .expect("the Lease")
        .spec
        .and_then(|s| s.acquire_time)
        .expect("the Lease's acquire time")
        .0;
    let takeover = Duration::try_from(acquired.duration_since(cut_at))
        .unwrap_or_else(|_| panic!("{follower} acquired the Lease at {acquired}, before the cut"));
    eprintln!("multinode: {follower} leads {takeover:.1?} after the cut");
    // The Lease runs out LEASE_DURATION after the last renewal (at most a retry period before the
    // cut), counted from when the follower saw it; the follower looks every retry period (2 s,
    // stretched by up to half) and needs a look to see the renewal and one to see it expire.
    let follower_look = Duration::from_secs(3);
    assert!(
        takeover <= LEASE_DURATION + 3 * follower_look,
        "{follower} took {takeover:.1?} to lead (lease duration {LEASE_DURATION:?})"
    );
    wait_every_pod_updated(cluster, &name, 3).await;
    eprintln!(
        "multinode: rollout finished {:.1?} after the cut",
        cut.elapsed()
    );
    assert_eq!(
        lease_holder(&client).await.as_deref(),
        Some(follower.as_str()),
        "the Lease changed hands again during the rollout"
    );
    let nodes: Api<Node> = Api::all(client.clone());
    wait_for(
        &format!("{} NotReady", leader_node.name),
        TIMEOUT,
        || async { (!node_ready(&nodes.get(&leader_node.name).await.ok()?)).then_some(()) },
    )
    .await;

    // No two leaders: the first stopped its controllers (its renewals failing for the renew
    // deadline) before the follower acquired the Lease. Its node's log files are written on the
    // node, cut off or not.
    let stepped_down = wait_for(
        &format!("{leader} to log that it stopped leading"),
        TIMEOUT,
        || async {
            manager_logged_at(
                &leader_node.pod_logs,
                &leader,
                "could not renew the leader lease within the renew deadline",
            )
        },
    )
    .await;
    eprintln!(
        "multinode: {leader} stepped down at {stepped_down}, {follower} acquired at {acquired}"
    );
    assert!(
        stepped_down < acquired,
        "{follower} acquired the Lease at {acquired}, before {leader} stopped leading at {stepped_down}"
    );

    cluster.node_action("mend", leader_node.index).await;
    wait_for(
        &format!("{} Ready again", leader_node.name),
        TIMEOUT,
        || async { node_ready(&nodes.get(&leader_node.name).await.ok()?).then_some(()) },
    )
    .await;
    cluster.wait_ready(FIRST_TAG).await;
    assert_eq!(
        lease_holder(&client).await.as_deref(),
        Some(follower.as_str()),
        "the first leader took the Lease back"
    );
}

/// `helm upgrade` rolls the daemon DaemonSet (one node at a time) while ImagePullJobs pull one
/// node at a time: every job completes on every node, none fails, and every image is on every
/// node's containerd: no pull is lost to a daemon replaced mid-job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "three real nodes: NODES=3 tests/cluster/e2e.sh --ignored multinode::"]
async fn a_rolling_update_of_the_daemon_loses_no_pull() {
    let exclusive = support::exclusive().await;
    let cluster = exclusive.cluster;
    require_three_nodes(cluster);
    let ns = cluster.namespace("e2e-roll", json!({})).await;
    let name = unique_name("roll");
    let images: Vec<String> = (1..=6)
        .map(|i| format!("{}/e2e/{name}-{i}:v1", cluster.registry))
        .collect();
    for (i, image) in images.iter().enumerate() {
        skopeo_copy(&cluster.test_image_source(["v2", "v3"][i % 2]), image);
    }
    let daemonsets: Api<DaemonSet> = Api::namespaced(cluster.client(), SYSTEM_NAMESPACE);
    let daemonset = daemonsets.get(DAEMON).await.expect("the daemon DaemonSet");
    let generation = daemonset.metadata.generation;

    // A new daemon pod template, the release's other values kept: the default pull concurrency
    // (2) made explicit, or 3 where an earlier run on this cluster made it explicit already.
    let explicit_default = serde_json::to_string(&daemonset.spec)
        .expect("a DaemonSet spec")
        .contains("--max-concurrent-pulls=2");
    let pulls = if explicit_default { 3 } else { 2 };
    cluster.helm(&[
        "upgrade",
        RELEASE,
        support::chart_dir().to_str().expect("UTF-8 path"),
        "--reuse-values",
        "--set",
        &format!("daemon.extraArgs[0]=--max-concurrent-pulls={pulls}"),
    ]);
    let nodes = i32::try_from(cluster.nodes.len()).expect("a few nodes");
    let rolling = |ds: &DaemonSet| {
        let status = ds.status.as_ref();
        ds.metadata.generation != generation
            && status.is_some_and(|s| {
                s.observed_generation == ds.metadata.generation
                    && s.updated_number_scheduled.unwrap_or(0) < nodes
            })
    };
    let updated = |ds: &DaemonSet| ds.status.as_ref().and_then(|s| s.updated_number_scheduled);
    let updated_before = wait_for("the daemon's rolling update to start", TIMEOUT, || async {
        let ds = daemonsets.get(DAEMON).await.ok()?;
        rolling(&ds).then_some(updated(&ds).unwrap_or(0))
    })
    .await;
    // A new job (the six images in turn, each over the three nodes one node at a time) at every
    // poll until the rollout has ended, so pulls are in flight for as long as it lasts however
    // fast the jobs are (six at once once took 2 s, less than one daemon pod's replacement).
    // Every 200 ms: the jobs' statuses and the daemon pods replaced; a replacement counts as
    // overlapping the jobs when some job was incomplete at the polls on both sides of it.
    let jobs: Api<ImagePullJob> = Api::namespaced(cluster.client(), &ns.name);
    const MAX_JOBS: usize = 150;
    let started = Instant::now();
    let deadline = started + TIMEOUT;
    let mut names: Vec<String> = Vec::new();
    let mut updated_last = updated_before;
    let mut incomplete_last: Vec<String> = Vec::new();
    let mut overlapped = 0;
    let statuses = loop {
        let ds = daemonsets.get(DAEMON).await.ok();
        let rolled_out = ds.as_ref().is_some_and(|ds| {
            ds.metadata.generation != generation
                && ds.status.as_ref().is_some_and(|s| {
                    s.observed_generation == ds.metadata.generation
                        && s.updated_number_scheduled == Some(nodes)
                        && s.number_available == Some(nodes)
                })
        });
        let listed = match jobs.list(&ListParams::default()).await {
            Ok(listed) => listed,
            Err(error) => {
                // Nothing to conclude from this poll: its jobs are neither complete nor not.
                assert!(Instant::now() < deadline, "listing the jobs: {error}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let mut statuses = Vec::new();
        let mut incomplete = Vec::new();
        for job in &names {
            let status = listed
                .items
                .iter()
                .find(|j| j.metadata.name.as_ref() == Some(job))
                .and_then(|j| j.status.clone());
            match status {
                Some(status) if status.completion_time.is_some() => statuses.push(status),
                _ => incomplete.push(job.clone()),
            }
        }
        if let Some(now) = ds.as_ref().and_then(updated) {
            if now > updated_last && incomplete.iter().any(|j| incomplete_last.contains(j)) {
                overlapped += now - updated_last;
            }
            updated_last = updated_last.max(now);
        }
        if rolled_out && incomplete.is_empty() && !names.is_empty() {
            break statuses;
        }
        // The first job whatever the rollout's state: one that ended before it fails the
        // overlap check below by name, not this loop's deadline.
        if names.is_empty() || (!rolled_out && names.len() < MAX_JOBS) {
            let job = format!("roll-{}", names.len());
            let image = &images[names.len() % images.len()];
            jobs.create(&PostParams::default(), &pull_job(&job, image, "Always", 1))
                .await
                .expect("creating an ImagePullJob");
            incomplete.push(job.clone());
            names.push(job);
        }
        incomplete_last = incomplete;
        assert!(
            Instant::now() < deadline,
            "the rollout and the jobs did not end within {TIMEOUT:?}: {} of {} jobs incomplete \
             ({incomplete_last:?})",
            incomplete_last.len(),
            names.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!(
        "multinode: {} jobs completed in {:.1?}; daemon pods replaced: {updated_before} before \
         the first job, {overlapped} while a job ran",
        names.len(),
        started.elapsed()
    );
    for (job, status) in names.iter().zip(&statuses) {
        assert_eq!(
            (status.desired, status.succeeded, status.failed),
            (nodes, nodes, 0),
            "{job}: {status:?}"
        );
    }
    for node in &cluster.nodes {
        for image in &images {
            assert!(
                containerd_has_image(&node.containerd_socket, image).await,
                "{} lacks {image}",
                node.name
            );
        }
    }
    cluster.wait_ready(FIRST_TAG).await;
    // The jobs overlapped the rollout: a daemon was replaced while one of them pulled.
    assert!(
        overlapped > 0,
        "no daemon pod was replaced while a job ran ({updated_before} before the first job, \
         {updated_last} in all): nothing overlapped the rollout"
    );
}
