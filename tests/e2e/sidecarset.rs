//! SidecarSets on a real kubelet: injected sidecars really run, and a new sidecar image is
//! pre-downloaded by the daemon pod and then applied in place: the kubelet restarts only the
//! sidecar container, the app container and the pod stay.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use k8s_cri::v1::{ImageSpec, ImageStatusRequest};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kruise_rs_api::{NodeImage, SidecarSet};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::support::{self, Cluster, TIMEOUT, wait_for};

/// The app container: exits on TERM (busybox `sleep` as PID 1 would wait out the grace period).
pub(crate) fn app_command() -> serde_json::Value {
    json!([
        "/bin/busybox",
        "sh",
        "-c",
        "trap 'exit 0' TERM; while true; do sleep 1; done"
    ])
}

pub(crate) fn sidecarset(
    name: &str,
    namespace: &str,
    image: &str,
    max_unavailable: i32,
) -> SidecarSet {
    serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "SidecarSet",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "containers": [{"name": "sidecar", "image": image, "imagePullPolicy": "IfNotPresent"}],
            "updateStrategy": {"type": "RollingUpdate", "maxUnavailable": max_unavailable}
        }
    }))
    .expect("a SidecarSet")
}

pub(crate) fn deployment(name: &str, image: &str, replicas: i32) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 3,
                    "containers": [{"name": "app", "image": image, "command": app_command()}]
                }
            }
        }
    }))
    .expect("a Deployment")
}

/// Creates `sidecarset` and waits until the webhook injects it (a dry-run pod in `namespace`
/// comes back with the sidecar): the webhook's cache lags the create a little.
pub(crate) async fn create_sidecarset(cluster: &Cluster, sidecarset: &SidecarSet, namespace: &str) {
    create_sidecarset_injecting(cluster, sidecarset, namespace, "sidecar").await;
}

/// [`create_sidecarset`], waiting for a dry-run pod with the container `injected`.
pub(crate) async fn create_sidecarset_injecting(
    cluster: &Cluster,
    sidecarset: &SidecarSet,
    namespace: &str,
    injected: &str,
) {
    let api: Api<SidecarSet> = Api::all(cluster.client());
    api.create(&PostParams::default(), sidecarset)
        .await
        .expect("creating the SidecarSet");
    let name = sidecarset.metadata.name.clone().expect("named");
    let pods: Api<Pod> = Api::namespaced(cluster.client(), namespace);
    let probe: Pod = serde_json::from_value(json!({
        "metadata": {"generateName": "probe-", "labels": {"app": name}},
        "spec": {"containers": [{"name": "app", "image": cluster.app_image("v1")}]}
    }))
    .expect("a pod");
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    wait_for(
        "the webhook to inject the new SidecarSet",
        TIMEOUT,
        || async {
            let pod = pods.create(&dry_run, &probe).await.ok()?;
            let spec = pod.spec?;
            spec.containers
                .iter()
                .any(|c| c.name == injected)
                .then_some(())
        },
    )
    .await;
}

pub(crate) fn status<'a>(pod: &'a Pod, container: &str) -> Option<&'a ContainerStatus> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|s| s.name == container)
}

pub(crate) fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Patched to `image` and not yet running it (its sidecar's imageID is another digest).
pub(crate) fn in_flight(pod: &Pod, image: &str, digest: &str) -> bool {
    let patched = pod.spec.as_ref().is_some_and(|s| {
        s.containers
            .iter()
            .any(|c| c.name == "sidecar" && c.image.as_deref() == Some(image))
    });
    patched && status(pod, "sidecar").is_none_or(|s| !s.image_id.ends_with(digest) || !s.ready)
}

/// Samples the pods labelled `app=<app>` until stopped and keeps the most that were unavailable
/// at once: not Ready, or `in_flight` (patched, not yet running the new image). Sampling, not
/// waiting: a rollout's in-flight window is seconds long, longer than the 150 ms between lists.
pub(crate) struct UnavailableWatch {
    most: Arc<AtomicUsize>,
    done: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl UnavailableWatch {
    pub(crate) fn start(
        pods: Api<Pod>,
        app: &str,
        in_flight: impl Fn(&Pod) -> bool + Send + 'static,
    ) -> Self {
        let most = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let selector = ListParams::default().labels(&format!("app={app}"));
        let task = {
            let (most, done) = (most.clone(), done.clone());
            tokio::spawn(async move {
                while !done.load(Ordering::Relaxed) {
                    if let Ok(list) = pods.list(&selector).await {
                        let unavailable = list
                            .items
                            .iter()
                            .filter(|p| !ready(p) || in_flight(p))
                            .count();
                        most.fetch_max(unavailable, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_millis(150)).await;
                }
            })
        };
        Self { most, done, task }
    }

    /// Stops sampling; the most pods seen unavailable at once.
    pub(crate) async fn stop(self) -> usize {
        self.done.store(true, Ordering::Relaxed);
        self.task.await.expect("the readiness watcher");
        self.most.load(Ordering::Relaxed)
    }
}

/// When the container's current process started, while it runs.
pub(crate) fn running_started_at(status: &ContainerStatus) -> Option<String> {
    let started = status
        .state
        .as_ref()?
        .running
        .as_ref()?
        .started_at
        .as_ref()?;
    Some(started.0.to_string())
}

/// The pods of the Deployment `app`, once there are `count` and all run with every container
/// ready.
pub(crate) async fn running_pods(
    cluster: &Cluster,
    namespace: &str,
    app: &str,
    count: usize,
) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(cluster.client(), namespace);
    let selector = ListParams::default().labels(&format!("app={app}"));
    wait_for(
        &format!("{count} running pods of {app}"),
        TIMEOUT,
        || async {
            let list = pods.list(&selector).await.ok()?.items;
            let live: Vec<Pod> = list
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            (live.len() == count && live.iter().all(ready)).then_some(live)
        },
    )
    .await
}

/// Points the SidecarSet `name`'s container `sidecar` at `image`: a rollout starts.
pub(crate) async fn set_sidecar_image(cluster: &Cluster, name: &str, image: &str) {
    set_sidecar_image_with_strategy(cluster, name, image, json!({})).await;
}

/// [`set_sidecar_image`] with `strategy` merged into the SidecarSet's `updateStrategy` in the
/// same write (a partition, a pause).
pub(crate) async fn set_sidecar_image_with_strategy(
    cluster: &Cluster,
    name: &str,
    image: &str,
    strategy: serde_json::Value,
) {
    let sidecarsets: Api<SidecarSet> = Api::all(cluster.client());
    sidecarsets
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {
                "containers": [{"name": "sidecar", "image": image, "imagePullPolicy": "IfNotPresent"}],
                "updateStrategy": strategy
            }})),
        )
        .await
        .unwrap_or_else(|e| panic!("changing the sidecar image to {image} ({strategy}): {e}"));
}

/// Waits until the SidecarSet `name` reports its `pods` matched pods all updated and ready, for
/// its latest generation.
pub(crate) async fn wait_every_pod_updated(cluster: &Cluster, name: &str, pods: i32) {
    let sidecarsets: Api<SidecarSet> = Api::all(cluster.client());
    wait_for(
        "the SidecarSet to report every pod updated and ready",
        TIMEOUT,
        || async {
            let s = sidecarsets.get(name).await.ok()?;
            let generation = s.metadata.generation;
            let status = s.status?;
            (status.observed_generation == generation
                && status.matched_pods == pods
                && status.updated_pods == pods
                && status.updated_ready_pods == pods)
                .then_some(())
        },
    )
    .await;
}

/// Whether the node's containerd has `image` (CRI ImageStatus).
pub(crate) async fn node_has_image(cluster: &Cluster, image: &str) -> bool {
    containerd_has_image(&cluster.containerd_socket, image).await
}

/// The message of the kubelet's `Pulled` event for `image` in pod `pod` of `namespace`, once
/// there is one: "… already present on machine …" when the kubelet did not pull it.
pub(crate) async fn kubelet_pulled_message(
    cluster: &Cluster,
    namespace: &str,
    pod: &str,
    image: &str,
) -> String {
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(cluster.client(), namespace);
    let selector = ListParams::default().fields(&format!("involvedObject.name={pod}"));
    wait_for(
        &format!("the kubelet's Pulled event for {image} in {pod}"),
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
                .find(|m| m.contains(image))
        },
    )
    .await
}

/// Whether the containerd at `socket` has `image` (CRI ImageStatus).
pub(crate) async fn containerd_has_image(socket: &std::path::Path, image: &str) -> bool {
    containerd_image_pinned(socket, image).await.is_some()
}

/// What the containerd at `socket` says of `image` through CRI: `None` when it has no such
/// image, else whether it is pinned (what the kubelet's image GC skips).
pub(crate) async fn containerd_image_pinned(socket: &std::path::Path, image: &str) -> Option<bool> {
    let mut client = support::image_client(socket);
    let response = client
        .image_status(ImageStatusRequest {
            image: Some(ImageSpec {
                image: image.to_owned(),
                ..Default::default()
            }),
            verbose: false,
        })
        .await
        .expect("CRI ImageStatus");
    response.into_inner().image.map(|i| i.pinned)
}

/// What the NodeImage of the node says about `repository:tag` (its phase), if anything.
async fn nodeimage_phase(cluster: &Cluster, repository: &str, tag: &str) -> Option<String> {
    let api: Api<NodeImage> = Api::all(cluster.client());
    let nodeimage = api.get_opt(&cluster.node_name).await.ok()??;
    let status = nodeimage.status?;
    let tags = &status.image_statuses.get(repository)?.tags;
    let found = tags.iter().find(|t| t.tag == tag)?;
    Some(serde_json::to_value(found.phase).ok()?.as_str()?.to_owned())
}

/// The core promise, on a real kubelet: three pods get the sidecar injected and running; a new
/// sidecar image is pulled into the node's containerd by the daemon pod while the rollout is
/// paused (no pod patched yet); once resumed, each pod's sidecar container is restarted in place
/// with the new image (restartCount + 1, the new imageID) while the app container keeps running
/// (same restartCount and startedAt, same pod UID), never more than maxUnavailable pods unready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_upgraded_in_place_by_the_kubelet_after_predownload() {
    let installed = support::installed().await;
    let cluster = installed.cluster;
    let ns = cluster.namespace("e2e-inplace", json!({})).await;
    let name = support::unique_name("inplace");
    let (v1, v2) = (cluster.app_image("v1"), cluster.app_image("v2"));

    create_sidecarset(cluster, &sidecarset(&name, &ns.name, &v1, 1), &ns.name).await;
    let deployments: Api<Deployment> = Api::namespaced(cluster.client(), &ns.name);
    deployments
        .create(&PostParams::default(), &deployment(&name, &v1, 3))
        .await
        .expect("creating the Deployment");
    let before = running_pods(cluster, &ns.name, &name, 3).await;
    for pod in &before {
        let sidecar = status(pod, "sidecar").expect("the sidecar was injected and runs");
        assert!(
            sidecar.ready && sidecar.image.ends_with("e2e/app:v1"),
            "sidecar of {:?}: {sidecar:?}",
            pod.metadata.name
        );
    }

    // Pre-download, proved by pausing the rollout: the image arrives with no pod patched.
    set_sidecar_image_with_strategy(cluster, &name, &v2, json!({"paused": true})).await;
    let sidecarsets: Api<SidecarSet> = Api::all(cluster.client());
    let repository = v2.rsplit_once(':').expect("tagged").0.to_owned();
    wait_for(
        "the daemon to pull the new sidecar image",
        TIMEOUT,
        || async {
            (nodeimage_phase(cluster, &repository, "v2").await.as_deref() == Some("Succeeded"))
                .then_some(())
        },
    )
    .await;
    assert!(node_has_image(cluster, &v2).await, "containerd has {v2}");
    let pods: Api<Pod> = Api::namespaced(cluster.client(), &ns.name);
    for pod in &before {
        let now = pods
            .get(pod.metadata.name.as_deref().unwrap())
            .await
            .unwrap();
        let image = now
            .spec
            .unwrap()
            .containers
            .into_iter()
            .find(|c| c.name == "sidecar");
        assert_eq!(
            image.and_then(|c| c.image).as_deref(),
            Some(v1.as_str()),
            "paused: not patched yet"
        );
    }

    // Watch the pods through the rollout: a pod is unavailable while it is not Ready or its
    // sidecar is patched but not yet running the new image.
    let v2_digest = support::registry_digest(&v2);
    let watch = {
        let (v2, v2_digest) = (v2.clone(), v2_digest.clone());
        UnavailableWatch::start(pods.clone(), &name, move |p| in_flight(p, &v2, &v2_digest))
    };
    sidecarsets
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"updateStrategy": {"paused": false}}})),
        )
        .await
        .expect("resuming the rollout");
    wait_every_pod_updated(cluster, &name, 3).await;
    let after = running_pods(cluster, &ns.name, &name, 3).await;
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
        let (sidecar, old_sidecar) = (
            status(pod, "sidecar").unwrap(),
            status(old, "sidecar").unwrap(),
        );
        assert_eq!(
            sidecar.restart_count,
            old_sidecar.restart_count + 1,
            "{pod_name}: the sidecar container restarted once"
        );
        assert!(
            sidecar.image_id.ends_with(&v2_digest),
            "{pod_name}: sidecar runs {} (imageID {}), want digest {v2_digest}",
            sidecar.image,
            sidecar.image_id
        );
    }
    println!(
        "in-place upgrade of 3 pods: at most {most_unavailable} pod(s) unavailable at once \
         (maxUnavailable 1)"
    );
    assert!(
        most_unavailable <= 1,
        "maxUnavailable 1 exceeded: {most_unavailable} pods at once"
    );
    // The sidecar's 3 s grace period keeps each pod in flight for seconds: seen by the watcher.
    assert_eq!(most_unavailable, 1, "the watcher saw the pods in flight");
}

/// The chart's manager validates SidecarSets by a dry-run pod under its own ServiceAccount,
/// which the chart's ValidatingAdmissionPolicy `kruise-rs-manager-dry-run-pods-only` allows
/// only dry runs (decision 0012): a sidecar only Kubernetes' pod validation refuses is refused
/// naming its field (a policy in the way would have the webhook fail open and admit it), and
/// the manager's identity cannot store a pod in its namespace.
#[tokio::test]
async fn sidecarset_dry_run_pod_passes_the_charts_manager_policy() {
    const POLICY: &str = "kruise-rs-manager-dry-run-pods-only";
    let installed = support::installed().await;
    let cluster = installed.cluster;

    let name = support::unique_name("e2e-dry-run");
    let invalid: SidecarSet = serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "SidecarSet",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "containers": [{"name": "sidecar", "image": cluster.app_image("v1"),
                            "securityContext": {"runAsUser": -1}}],
        },
    }))
    .expect("a SidecarSet");
    match Api::<SidecarSet>::all(cluster.client())
        .create(&PostParams::default(), &invalid)
        .await
    {
        Err(kube::Error::Api(status)) => {
            let message = &status.message;
            assert!(
                message.contains("spec.containers[0].securityContext.runAsUser")
                    && message.contains("pod validation"),
                "refused, but not by the dry-run pod: {message}"
            );
        }
        other => panic!("a sidecar with runAsUser -1 should have been refused: {other:?}"),
    }

    // The manager's identity (impersonated) stores no pod; a dry run passes.
    let manager = cluster.client_as(&format!(
        "system:serviceaccount:{}:{}",
        support::SYSTEM_NAMESPACE,
        support::MANAGER
    ));
    let pods: Api<Pod> = Api::namespaced(manager, support::SYSTEM_NAMESPACE);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": support::unique_name("e2e-manager-pod")},
        "spec": {"automountServiceAccountToken": false,
                 "containers": [{"name": "app", "image": cluster.app_image("v1")}]},
    }))
    .expect("a pod");
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    pods.create(&dry_run, &pod)
        .await
        .expect("the manager's dry-run pod");
    match pods.create(&PostParams::default(), &pod).await {
        Err(kube::Error::Api(status)) if status.code == 403 => {
            assert!(status.message.contains(POLICY), "{}", status.message);
        }
        other => panic!("the manager storing a pod: expected the policy's 403, got {other:?}"),
    }
}
