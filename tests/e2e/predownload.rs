//! What pre-download buys on a real node: the sidecar restart time of an in-place upgrade when
//! the new image is pre-downloaded, against one where the kubelet pulls it during the restart,
//! with a registry that serves slowly (a throttling proxy on loopback in front of the registry,
//! images with one large layer). Figures, printed; the test asserts the behaviour behind them:
//! with pre-download the image is on the node before the pod is patched.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kruise_rs_api::SidecarSet;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::sidecarset::{create_sidecarset, deployment, node_has_image, running_pods, status};
use crate::support::{self, Cluster, TIMEOUT};

/// The slow registry: bytes per second toward containerd, per connection.
const RATE: usize = 6 * 1024 * 1024;
/// The large layer of each test image (random, so it does not compress).
const LAYER_BYTES: usize = 24 * 1024 * 1024;

/// One in-place upgrade of `replicas` pods to `new_image`, timed per pod from the moment its
/// sidecar image is patched to the moment its new sidecar container runs. Returns the times and
/// whether the image was on the node before the first pod was patched.
async fn timed_upgrade(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    new_image: &str,
    replicas: usize,
) -> (Vec<Duration>, bool) {
    let pods: Api<Pod> = Api::namespaced(cluster.client(), namespace);
    let before: BTreeMap<String, i32> = running_pods(cluster, namespace, name, replicas)
        .await
        .iter()
        .map(|p| {
            (
                p.metadata.name.clone().unwrap(),
                status(p, "sidecar").unwrap().restart_count,
            )
        })
        .collect();
    let sidecarsets: Api<SidecarSet> = Api::all(cluster.client());
    sidecarsets
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"containers": [sidecar(new_image)]}})),
        )
        .await
        .expect("changing the sidecar image");
    let selector = ListParams::default().labels(&format!("app={name}"));
    let mut patched: BTreeMap<String, Instant> = BTreeMap::new();
    let mut restarted: BTreeMap<String, Duration> = BTreeMap::new();
    let mut on_node_before_patch = None;
    let deadline = Instant::now() + TIMEOUT;
    while restarted.len() < replicas {
        assert!(
            Instant::now() < deadline,
            "the upgrade of {name} did not finish in {TIMEOUT:?}"
        );
        let list = pods.list(&selector).await.expect("listing pods").items;
        for pod in list {
            let pod_name = pod.metadata.name.clone().unwrap();
            let Some(old_restarts) = before.get(&pod_name) else {
                continue;
            };
            let spec_image = pod
                .spec
                .as_ref()
                .and_then(|s| s.containers.iter().find(|c| c.name == "sidecar"))
                .and_then(|c| c.image.clone());
            if spec_image.as_deref() == Some(new_image) && !patched.contains_key(&pod_name) {
                if on_node_before_patch.is_none() {
                    on_node_before_patch = Some(node_has_image(cluster, new_image).await);
                }
                patched.insert(pod_name.clone(), Instant::now());
            }
            let Some(at) = patched.get(&pod_name) else {
                continue;
            };
            let running = status(&pod, "sidecar").is_some_and(|s| {
                s.restart_count == old_restarts + 1
                    && s.ready
                    && s.state.as_ref().is_some_and(|st| st.running.is_some())
            });
            if running && !restarted.contains_key(&pod_name) {
                restarted.insert(pod_name, at.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (
        restarted.into_values().collect(),
        on_node_before_patch.unwrap_or(false),
    )
}

fn sidecar(image: &str) -> serde_json::Value {
    json!({
        "name": "sidecar",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/busybox", "sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
    })
}

fn mean(times: &[Duration]) -> Duration {
    times.iter().sum::<Duration>() / times.len().max(1) as u32
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predownload_takes_the_pull_out_of_the_sidecar_restart() {
    // Exclusive: the figures mean nothing with other rollouts pulling meanwhile.
    let exclusive = support::exclusive().await;
    let cluster = exclusive.cluster;
    let dir = tempfile::tempdir().expect("a temporary directory");
    kruise_rs_testkit::slow_registry::build_large_images(dir.path(), &["a", "b"], LAYER_BYTES);
    let upstream: SocketAddr = cluster.registry.parse().expect("the registry's address");
    let proxy = kruise_rs_testkit::slow_registry::slow_proxy(upstream, RATE).await;
    cluster.add_plain_http_registry(proxy);
    for tag in ["a", "b"] {
        support::skopeo_copy(
            &format!("oci:{}:{tag}", dir.path().join("oci").display()),
            &format!("{}/e2e/large:{tag}", cluster.registry),
        );
    }
    let ns = cluster.namespace("e2e-timing", json!({})).await;
    let deployments: Api<Deployment> = Api::namespaced(cluster.client(), &ns.name);
    let small = cluster.app_image("v1");

    // (a) pre-download: two pods, maxUnavailable 1, so the rollout has two batches.
    // (b) one batch (maxUnavailable 2): pre-download is skipped, the kubelet pulls.
    let mut figures = Vec::new();
    for (case, tag, max_unavailable) in [
        ("with pre-download", "a", 1),
        ("without (one batch)", "b", 2),
    ] {
        let name = support::unique_name("timing");
        let mut set = crate::sidecarset::sidecarset(&name, &ns.name, &small, max_unavailable);
        set.spec.containers = vec![serde_json::from_value(sidecar(&small)).expect("a sidecar")];
        create_sidecarset(cluster, &set, &ns.name).await;
        deployments
            .create(&PostParams::default(), &deployment(&name, &small, 2))
            .await
            .expect("creating the Deployment");
        let image = format!("{proxy}/e2e/large:{tag}");
        let (times, on_node) = timed_upgrade(cluster, &ns.name, &name, &image, 2).await;
        println!(
            "sidecar restart {case}: mean {:.2?} over {} pods ({:?}); image on the node before the first patch: {on_node}",
            mean(&times),
            times.len(),
            times
        );
        figures.push((case, mean(&times), on_node));
    }
    let (with, without) = (&figures[0], &figures[1]);
    println!(
        "pre-download: restart {:.2?} vs {:.2?} without ({:.1}x), {} MiB layer at {} MiB/s",
        with.1,
        without.1,
        without.1.as_secs_f64() / with.1.as_secs_f64().max(0.001),
        LAYER_BYTES >> 20,
        RATE >> 20
    );
    assert!(
        with.2,
        "with pre-download the new image is on the node before any pod is patched"
    );
    assert!(
        !without.2,
        "without it the kubelet pulls during the restart"
    );
}
