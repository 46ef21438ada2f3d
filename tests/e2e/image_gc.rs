//! The kubelet's image GC and pre-download: an image the daemon pre-pulled for a rollout that is
//! held stays on the node through the kubelet's GC (the daemon pins it), so the rollout, once
//! resumed, restarts its sidecars without a pull. Node 1's kubelet removes unused images after a
//! minute (`imageMaximumGCAge: 1m`, set by `KRUISE_RS_KUBELET_IMAGE_MAX_AGE`); its GC runs every
//! five minutes from its start, so this test waits for one pass that removes an unpinned control
//! image. `#[ignore]`d: it runs beside the three-node tests, on a cluster of its own.

use std::time::{Duration, Instant};

use k8s_cri::v1::{ImageSpec, PullImageRequest};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kruise_rs_api::SidecarSet;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::sidecarset::{
    containerd_image_pinned, create_sidecarset, deployment, kubelet_pulled_message, sidecarset,
    wait_every_pod_updated,
};
use crate::support::{self, Cluster, TIMEOUT, skopeo_copy, unique_name, wait_for};

/// What node 1's kubelet must be started with (tests/cluster/start.sh).
const MAX_AGE: &str = "imageMaximumGCAge: 1m";
/// The GC runs every 5 min from the kubelet's start: one pass after the pre-pull comes within
/// that, plus the time a pass takes.
const GC_PASS: Duration = Duration::from_secs(7 * 60);

/// The registry's access-log lines that fetched a manifest of `repository`.
fn manifest_fetches(cluster: &Cluster, repository: &str) -> usize {
    let log = std::fs::read(&cluster.registry_log)
        .unwrap_or_else(|e| panic!("reading {}: {e}", cluster.registry_log.display()));
    let needle = format!("/v2/{repository}/manifests/");
    String::from_utf8_lossy(&log)
        .lines()
        .filter(|l| l.starts_with("127.0.0.1 - ") && l.contains(&needle))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "an image GC of a minute on node 1: KRUISE_RS_KUBELET_IMAGE_MAX_AGE=1m NODES=3 tests/cluster/e2e.sh --ignored image_gc::"]
async fn a_prepulled_image_outlives_the_kubelets_image_gc_until_the_rollout_uses_it() {
    let cluster = support::cluster().await;
    let node = &cluster.nodes[0];
    let config_path = cluster.state_dir.join("kubelet/config.yaml");
    let config = std::fs::read_to_string(&config_path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", config_path.display()));
    assert!(
        config.contains(MAX_AGE),
        "node 1's kubelet runs without `{MAX_AGE}`: start the cluster with \
         KRUISE_RS_KUBELET_IMAGE_MAX_AGE=1m (tests/cluster/e2e.sh does for this test)"
    );
    let name = unique_name("gc");
    let old = cluster.app_image("v1");
    let repository = format!("e2e/{name}-sidecar");
    let fresh = format!("{}/{repository}:v1", cluster.registry);
    let control = format!("{}/e2e/{name}-control:v1", cluster.registry);
    // Content of their own: an image another test's container (even an exited one) runs counts
    // as used, and the GC would keep it whether pinned or not.
    let dir = tempfile::tempdir().expect("a temporary directory");
    let tags = [format!("{name}-fresh"), format!("{name}-control")];
    kruise_rs_testkit::slow_registry::build_large_images(
        dir.path(),
        &[&tags[0], &tags[1]],
        64 << 10,
    );
    let layout = dir.path().join("oci");
    skopeo_copy(&format!("oci:{}:{}", layout.display(), tags[0]), &fresh);
    skopeo_copy(&format!("oci:{}:{}", layout.display(), tags[1]), &control);

    // Set up with the system shared, then let the exclusive tests run while the GC is awaited.
    let (ns, pulled_at) = {
        let _installed = support::installed().await;
        let ns = cluster.namespace("e2e-gc", json!({})).await;
        create_sidecarset(cluster, &sidecarset(&name, &ns.name, &old, 1), &ns.name).await;
        let mut pods = deployment(&name, &old, 2);
        pods.spec
            .as_mut()
            .and_then(|s| s.template.spec.as_mut())
            .expect("a pod template")
            .node_selector =
            Some([("kubernetes.io/hostname".to_owned(), node.name.clone())].into());
        Api::<Deployment>::namespaced(cluster.client(), &ns.name)
            .create(&PostParams::default(), &pods)
            .await
            .expect("creating the Deployment");
        crate::sidecarset::running_pods(cluster, &ns.name, &name, 2).await;
        // The rollout is held (paused: a partition would not pre-pull the pods it holds back)
        // and its new image pre-pulled.
        Api::<SidecarSet>::all(cluster.client())
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {
                    "containers": [{"name": "sidecar", "image": fresh, "imagePullPolicy": "IfNotPresent"}],
                    "updateStrategy": {"paused": true}
                }})),
            )
            .await
            .expect("changing the sidecar image, paused");
        wait_for(
            "the new sidecar image pre-pulled and pinned on node 1",
            TIMEOUT,
            || async {
                (containerd_image_pinned(&node.containerd_socket, &fresh).await == Some(true))
                    .then_some(())
            },
        )
        .await;
        // The control: unused and not pinned, so the next GC pass removes it.
        support::image_client(&node.containerd_socket)
            .pull_image(PullImageRequest {
                image: Some(ImageSpec {
                    image: control.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .expect("pulling the control image through CRI");
        assert_eq!(
            containerd_image_pinned(&node.containerd_socket, &control).await,
            Some(false)
        );
        (ns, Instant::now())
    };

    wait_for(
        "a pass of the kubelet's image GC (the unused control image removed)",
        GC_PASS,
        || async {
            let kept = containerd_image_pinned(&node.containerd_socket, &fresh).await;
            assert_eq!(
                kept,
                Some(true),
                "the pre-pulled image must stay pinned on node 1 while the rollout is held"
            );
            containerd_image_pinned(&node.containerd_socket, &control)
                .await
                .is_none()
                .then_some(())
        },
    )
    .await;
    let held = pulled_at.elapsed();
    assert_eq!(
        containerd_image_pinned(&node.containerd_socket, &fresh).await,
        Some(true),
        "the GC pass that removed the control kept the pre-pulled image"
    );

    // The rollout resumes: no pull, the kubelet finds the image on the node.
    let _installed = support::installed().await;
    let fetches = manifest_fetches(cluster, &repository);
    let resumed = Instant::now();
    Api::<SidecarSet>::all(cluster.client())
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"updateStrategy": {"paused": false}}})),
        )
        .await
        .expect("resuming the rollout");
    wait_every_pod_updated(cluster, &name, 2).await;
    let rollout = resumed.elapsed();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), &ns.name);
    let selector = ListParams::default().labels(&format!("app={name}"));
    for pod in pods.list(&selector).await.expect("listing pods").items {
        let pod_name = pod.metadata.name.clone().expect("named");
        let message = kubelet_pulled_message(cluster, &ns.name, &pod_name, &fresh).await;
        assert!(
            message.contains("already present on machine"),
            "{pod_name}'s kubelet pulled the sidecar itself: {message}"
        );
    }
    assert_eq!(
        manifest_fetches(cluster, &repository),
        fetches,
        "no fetch of the new sidecar image after the rollout resumed"
    );
    println!(
        "image GC: the pre-pulled {fresh} stayed pinned through a GC pass {:.0?} after the \
         pre-pull (the unpinned control removed); 2 pods upgraded {:.1?} after the resume, \
         0 registry fetches",
        held, rollout
    );
}
