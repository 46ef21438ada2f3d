//! An ImagePullJob with `sandboxConfig` pulled through the daemon DaemonSet into the node's
//! containerd.

use kruise_rs_api::ImagePullJob;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::sidecarset::node_has_image;
use crate::support::{self, TIMEOUT, wait_for};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imagepulljob_with_sandbox_config_completes_through_the_daemon() {
    let installed = support::installed().await;
    let cluster = installed.cluster;
    let ns = cluster.namespace("e2e-ipj", json!({})).await;
    // v3 is no pod's image in this suite: only this job puts it on the node.
    let image = cluster.app_image("v3");
    assert!(
        !node_has_image(cluster, &image).await,
        "{image} is not on the node yet"
    );
    let job: ImagePullJob = serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "ImagePullJob",
        "metadata": {"name": "pull-v3"},
        "spec": {
            "image": image,
            "selector": {"names": [cluster.node_name]},
            "parallelism": 1,
            "pullPolicy": {"timeoutSeconds": 60, "backoffLimit": 1},
            "completionPolicy": {"type": "Always", "activeDeadlineSeconds": 300},
            "sandboxConfig": {
                "labels": {"app": "e2e"},
                "annotations": {"io.kubernetes.image.metrics.tags": "app=e2e"}
            }
        }
    }))
    .expect("an ImagePullJob");
    let jobs: Api<ImagePullJob> = Api::namespaced(cluster.client(), &ns.name);
    jobs.create(&PostParams::default(), &job)
        .await
        .expect("creating the ImagePullJob");
    let status = wait_for("the ImagePullJob to complete", TIMEOUT, || async {
        let status = jobs.get("pull-v3").await.ok()?.status?;
        status.completion_time.is_some().then_some(status)
    })
    .await;
    assert_eq!(
        (status.desired, status.succeeded, status.failed),
        (1, 1, 0),
        "one node, pulled: {status:?}"
    );
    assert!(
        node_has_image(cluster, &image).await,
        "containerd has {image}"
    );
}
