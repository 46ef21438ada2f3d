//! A native sidecar (a SidecarSet init container with `restartPolicy: Always`) upgraded in place
//! on a real kubelet: the controller patches the pod's `spec.initContainers[i].image`, the
//! kubelet restarts only that init container on the new image, the app container and the pod
//! stay (upstream refuses `RollingUpdate` for native sidecars: #1671).

use std::collections::BTreeMap;
use std::time::Instant;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kruise_rs_api::well_known::{SIDECARSET_CONTAINER_LABEL, SIDECARSET_NAME_LABEL};
use kruise_rs_api::{ImagePullJob, SidecarSet};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::sidecarset::{
    UnavailableWatch, deployment, running_pods, running_started_at, status, wait_every_pod_updated,
};
use crate::support::{self, TIMEOUT, wait_for};

/// The native sidecar's name.
const NATIVE: &str = "native";

/// The native sidecar on `image`: exits on TERM, like the app container.
fn init_containers(image: &str) -> Value {
    json!([{
        "name": NATIVE,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "restartPolicy": "Always",
        "command": ["/bin/busybox", "sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
    }])
}

fn native_sidecarset(name: &str, namespace: &str, image: &str) -> SidecarSet {
    serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "SidecarSet",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "initContainers": init_containers(image),
            "updateStrategy": {"type": "RollingUpdate", "maxUnavailable": 1}
        }
    }))
    .expect("a SidecarSet")
}

fn init_status<'a>(pod: &'a Pod, name: &str) -> Option<&'a ContainerStatus> {
    pod.status
        .as_ref()?
        .init_container_statuses
        .as_ref()?
        .iter()
        .find(|s| s.name == name)
}

fn init_spec_image(pod: &Pod, name: &str) -> Option<String> {
    pod.spec
        .as_ref()?
        .init_containers
        .as_ref()?
        .iter()
        .find(|c| c.name == name)?
        .image
        .clone()
}

/// Patched to `image` and not yet running it ready (its imageID is another digest).
fn in_flight(pod: &Pod, image: &str, digest: &str) -> bool {
    init_spec_image(pod, NATIVE).as_deref() == Some(image)
        && init_status(pod, NATIVE).is_none_or(|s| !s.image_id.ends_with(digest) || !s.ready)
}

/// The measurement of docs/decisions/0013-native-sidecars-upgraded-in-place.md as a test,
/// through the controller: two pods of a Deployment run a native sidecar on v1; the SidecarSet
/// moves it to v2, paused first while the daemon pre-downloads v2 (an ImagePullJob for the
/// native sidecar, no pod patched); once resumed, each pod's init container is patched and
/// restarted by the kubelet on v2 (the new imageID, one more restart) while the app container
/// keeps running (same restartCount and startedAt, same pod UID), at most one pod unavailable
/// at once, and the SidecarSet reports every pod updated and ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_sidecar_upgraded_in_place_by_the_kubelet() {
    let installed = support::installed().await;
    let cluster = installed.cluster;
    let ns = cluster.namespace("e2e-native", json!({})).await;
    let name = support::unique_name("native");
    let (v1, v2) = (cluster.app_image("v1"), cluster.app_image("v2"));

    let sidecarsets: Api<SidecarSet> = Api::all(cluster.client());
    sidecarsets
        .create(
            &PostParams::default(),
            &native_sidecarset(&name, &ns.name, &v1),
        )
        .await
        .expect("creating the SidecarSet (RollingUpdate with a native sidecar)");
    // The webhook's cache lags the create a little: wait until a dry-run pod gets the sidecar.
    let pods: Api<Pod> = Api::namespaced(cluster.client(), &ns.name);
    let probe: Pod = serde_json::from_value(json!({
        "metadata": {"generateName": "probe-", "labels": {"app": name}},
        "spec": {"containers": [{"name": "app", "image": v1}]}
    }))
    .expect("a pod");
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    wait_for(
        "the webhook to inject the native sidecar",
        TIMEOUT,
        || async {
            let pod = pods.create(&dry_run, &probe).await.ok()?;
            init_spec_image(&pod, NATIVE).map(|_| ())
        },
    )
    .await;

    let deployments: Api<Deployment> = Api::namespaced(cluster.client(), &ns.name);
    deployments
        .create(&PostParams::default(), &deployment(&name, &v1, 2))
        .await
        .expect("creating the Deployment");
    let before = running_pods(cluster, &ns.name, &name, 2).await;
    for pod in &before {
        let native = init_status(pod, NATIVE).expect("the native sidecar was injected and runs");
        assert!(
            native.ready && native.image.ends_with("e2e/app:v1"),
            "native sidecar of {:?}: {native:?}",
            pod.metadata.name
        );
    }

    let v2_digest = support::registry_digest(&v2);
    let watch = {
        let (v2, v2_digest) = (v2.clone(), v2_digest.clone());
        UnavailableWatch::start(pods.clone(), &name, move |p| in_flight(p, &v2, &v2_digest))
    };
    // Pre-download, proved by pausing the rollout: the SidecarSet's ImagePullJob for the native
    // sidecar pulls v2 onto the node while no pod is patched.
    sidecarsets
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {
                "initContainers": init_containers(&v2),
                "updateStrategy": {"paused": true},
            }})),
        )
        .await
        .expect("changing the native sidecar's image, paused");
    let jobs: Api<ImagePullJob> = Api::all(cluster.client());
    let job_selector = ListParams::default().labels(&format!(
        "{SIDECARSET_NAME_LABEL}={name},{SIDECARSET_CONTAINER_LABEL}={NATIVE}"
    ));
    wait_for(
        "the native sidecar's image pulled by the SidecarSet's ImagePullJob",
        TIMEOUT,
        || async {
            let list = jobs.list(&job_selector).await.ok()?.items;
            let job = list.first()?;
            assert_eq!(
                job.spec.image, v2,
                "the job pulls the new native sidecar image"
            );
            let status = job.status.as_ref()?;
            (status.succeeded >= 1).then_some(())
        },
    )
    .await;
    for pod in pods.list(&ListParams::default()).await.expect("pods").items {
        if pod.metadata.labels.as_ref().and_then(|l| l.get("app")) == Some(&name) {
            assert_eq!(
                init_spec_image(&pod, NATIVE).as_deref(),
                Some(v1.as_str()),
                "paused: not patched yet"
            );
        }
    }

    let started = Instant::now();
    sidecarsets
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"updateStrategy": {"paused": false}}})),
        )
        .await
        .expect("resuming the rollout");
    wait_every_pod_updated(cluster, &name, 2).await;
    let after = running_pods(cluster, &ns.name, &name, 2).await;
    let elapsed = started.elapsed();
    let most_unavailable = watch.stop().await;

    let before: BTreeMap<_, _> = before
        .iter()
        .map(|p| (p.metadata.name.clone().unwrap(), p))
        .collect();
    for pod in &after {
        let pod_name = pod.metadata.name.clone().unwrap();
        let old = before
            .get(&pod_name)
            .unwrap_or_else(|| panic!("pod {pod_name} is new: the upgrade recreated a pod"));
        assert_eq!(pod.metadata.uid, old.metadata.uid, "{pod_name}: same pod");
        assert_eq!(
            init_spec_image(pod, NATIVE).as_deref(),
            Some(v2.as_str()),
            "{pod_name}: the init container's image was patched"
        );
        let (app, old_app) = (status(pod, "app").unwrap(), status(old, "app").unwrap());
        assert_eq!(
            app.restart_count, old_app.restart_count,
            "{pod_name}: app not restarted"
        );
        assert_eq!(
            running_started_at(app),
            running_started_at(old_app),
            "{pod_name}: app container still the same process"
        );
        let (native, old_native) = (
            init_status(pod, NATIVE).unwrap(),
            init_status(old, NATIVE).unwrap(),
        );
        assert_eq!(
            native.restart_count,
            old_native.restart_count + 1,
            "{pod_name}: the native sidecar restarted once"
        );
        assert!(
            native.ready && native.image_id.ends_with(&v2_digest),
            "{pod_name}: native sidecar runs {} (imageID {}, ready {}), want digest {v2_digest}",
            native.image,
            native.image_id,
            native.ready
        );
    }
    println!(
        "in-place upgrade of a native sidecar in 2 pods: {elapsed:?} from the SidecarSet change \
         to both updated and ready, at most {most_unavailable} pod(s) unavailable at once \
         (maxUnavailable 1)"
    );
    assert!(
        most_unavailable <= 1,
        "maxUnavailable 1 exceeded: {most_unavailable} pods at once"
    );
}
