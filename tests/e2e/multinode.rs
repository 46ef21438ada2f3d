//! Three real nodes (`NODES=3 tests/cluster/e2e.sh --ignored multinode::`): what one node cannot
//! show. `#[ignore]`d, so the one-node suite leaves them out.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

use crate::sidecarset::{
    UnavailableWatch, containerd_has_image, create_sidecarset, deployment, in_flight, running_pods,
    set_sidecar_image, sidecarset, wait_every_pod_updated,
};
use crate::support::{self, Cluster, TIMEOUT, skopeo_copy, unique_name, wait_for};

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
/// count as the pull first.
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
                for (node, socket) in &nodes {
                    if !pulled.contains_key(node) && containerd_has_image(socket, &image).await {
                        pulled.insert(node.clone(), Instant::now());
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
    let events: Api<Event> = Api::namespaced(cluster.client(), &ns.name);
    for pod in node_of.keys() {
        let selector = ListParams::default().fields(&format!("involvedObject.name={pod}"));
        let message = wait_for(
            &format!("the kubelet's Pulled event for {fresh} in {pod}"),
            TIMEOUT,
            || async {
                events
                    .list(&selector)
                    .await
                    .ok()?
                    .items
                    .into_iter()
                    .filter(|e| e.reason.as_deref() == Some("Pulled"))
                    .filter_map(|e| e.message)
                    .find(|m| m.contains(&fresh))
            },
        )
        .await;
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
