//! The kubelet, played, for the SidecarSet tests and the `make run` demo (`played-node kubelet`):
//! no node runs the pods, so what a kubelet would report is written through the pods' `status`
//! subresource.
//!
//! Every write is a JSON merge patch of the whole of `phase`, `conditions` and
//! `containerStatuses`, made on top of the pod as just read and guarded by its
//! `resourceVersion` (a conflict re-reads and retries): a condition another writer (the
//! SidecarSet controller's `SidecarSetUpgradable`) added in between is never lost.
//!
//! What is reported, per container:
//! - running its spec image: `image` = the spec image, `imageID` = [`image_id`] of it, ready,
//!   state `running`, `resources` = the spec's requests and limits (a resize is applied at once,
//!   without a restart); a container whose spec image changed since it was last reported counts
//!   one more restart, as an in-place restart does;
//! - failing: `image` = the spec image, no `imageID`, not ready, state `waiting` with reason
//!   `ErrImagePull`;
//! - stopping for a restart ([`mark_not_ready`]): the old image and imageID, not ready.
//!
//! A native sidecar (an init container with `restartPolicy: Always`) is reported in
//! `initContainerStatuses` as a container is, restarts included (kubelet restarts it on a new
//! spec image, the app containers untouched); a plain init container as completed.
//!
//! The pod is `Running`, its `Ready` and `ContainersReady` conditions True exactly when every
//! container is ready, and its `observedGeneration` the `metadata.generation` it acted on
//! (kept from Kubernetes 1.34 on).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kruise_rs_kube::{START_UP_PATIENCE, retry_transient};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use tokio::task::{JoinHandle, JoinSet};

/// How long a status write may keep conflicting with other writers before the test gives up.
const CONFLICT_TIMEOUT: Duration = Duration::from_secs(30);

/// The reason a container that cannot pull its image waits with.
pub const IMAGE_PULL_ERROR: &str = "ErrImagePull";

/// A fake but stable image digest reference for `image`: `<repository>@sha256:<sha256 of the
/// image string>`, as a runtime reports the image a container runs.
pub fn image_id(image: &str) -> String {
    let without_digest = image.split('@').next().unwrap_or(image);
    let slash = without_digest.rfind('/');
    let repository = match without_digest.rfind(':') {
        Some(colon) if slash.is_none_or(|slash| colon > slash) => &without_digest[..colon],
        _ => without_digest,
    };
    let digest = ring::digest::digest(&ring::digest::SHA256, image.as_bytes());
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("{repository}@sha256:{hex}")
}

fn now() -> Value {
    serde_json::to_value(Time(Timestamp::now())).expect("a timestamp serializes")
}

/// The spec image of each container, in spec order.
fn spec_images(pod: &Pod) -> Vec<(String, String)> {
    pod.spec
        .iter()
        .flat_map(|s| &s.containers)
        .map(|c| (c.name.clone(), c.image.clone().unwrap_or_default()))
        .collect()
}

/// The spec image of each native sidecar (init container with `restartPolicy: Always`), in
/// spec order.
fn native_sidecar_images(pod: &Pod) -> Vec<(String, String)> {
    pod.spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .map(|c| (c.name.clone(), c.image.clone().unwrap_or_default()))
        .collect()
}

/// The `resources` a kubelet reports for a running container: its spec's requests and limits
/// (a resize applied at once). Without them the apiserver refuses to resize the pod, as for a
/// node that cannot.
fn reported_resources(container: &k8s_openapi::api::core::v1::Container) -> Value {
    let spec = container.resources.as_ref();
    let mut out = serde_json::Map::new();
    if let Some(requests) = spec.and_then(|r| r.requests.as_ref()) {
        out.insert("requests".into(), json!(requests));
    }
    if let Some(limits) = spec.and_then(|r| r.limits.as_ref()) {
        out.insert("limits".into(), json!(limits));
    }
    Value::Object(out)
}

fn container_statuses(pod: &Pod) -> BTreeMap<&str, &ContainerStatus> {
    pod.status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .map(|s| (s.name.as_str(), s))
        .collect()
}

fn init_container_statuses(pod: &Pod) -> BTreeMap<&str, &ContainerStatus> {
    pod.status
        .iter()
        .flat_map(|s| s.init_container_statuses.iter().flatten())
        .map(|s| (s.name.as_str(), s))
        .collect()
}

fn is_running(status: &ContainerStatus) -> bool {
    status.state.as_ref().is_some_and(|s| s.running.is_some())
}

fn waiting_reason(status: &ContainerStatus) -> Option<&str> {
    status
        .state
        .as_ref()
        .and_then(|s| s.waiting.as_ref())
        .and_then(|w| w.reason.as_deref())
}

/// Whether the pod's `Ready` condition is True.
pub fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// Whether a container's spec image differs from the image its status reports (the kubelet
/// has an in-place restart to do). Containers without a status do not count.
pub fn has_changed_containers(pod: &Pod) -> bool {
    let changed = |images: Vec<(String, String)>, statuses: BTreeMap<&str, &ContainerStatus>| {
        images.iter().any(|(name, image)| {
            statuses
                .get(name.as_str())
                .is_some_and(|s| &s.image != image)
        })
    };
    changed(spec_images(pod), container_statuses(pod))
        || changed(native_sidecar_images(pod), init_container_statuses(pod))
}

/// Whether container `name` runs `image` (reported image and imageID) and is ready.
pub fn runs(pod: &Pod, name: &str, image: &str) -> bool {
    let statuses = container_statuses(pod);
    let init = init_container_statuses(pod);
    statuses
        .get(name)
        .or_else(|| init.get(name))
        .is_some_and(|s| {
            s.image == image && s.image_id == image_id(image) && s.ready && is_running(s)
        })
}

fn running_status(name: &str, image: &str, resources: &Value, restarts: i32) -> Value {
    json!({
        "name": name,
        "image": image,
        "resources": resources,
        "imageID": image_id(image),
        "containerID": format!("fake://{name}/{restarts}"),
        "ready": true,
        "started": true,
        "restartCount": restarts,
        "state": {"running": {"startedAt": now()}},
    })
}

fn failing_status(name: &str, image: &str, restarts: i32) -> Value {
    json!({
        "name": name,
        "image": image,
        "imageID": "",
        "ready": false,
        "started": false,
        "restartCount": restarts,
        "state": {"waiting": {
            "reason": IMAGE_PULL_ERROR,
            "message": format!("failed to pull image {image:?}: not found"),
        }},
    })
}

/// The pod's conditions with `Ready` and `ContainersReady` set to `ready` (a transition time
/// only where the status changes), `PodScheduled` and `Initialized` added if missing, and every
/// other condition kept as it is.
fn conditions(pod: &Pod, ready: bool) -> Value {
    let existing: Vec<_> = pod
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .collect();
    let mut out = Vec::new();
    let mut seen = Vec::new();
    for c in &existing {
        let wanted = match c.type_.as_str() {
            "Ready" | "ContainersReady" => ready,
            _ => {
                out.push(serde_json::to_value(c).expect("a condition serializes"));
                seen.push(c.type_.clone());
                continue;
            }
        };
        let status = if wanted { "True" } else { "False" };
        let mut value = serde_json::to_value(c).expect("a condition serializes");
        if c.status != status {
            value["status"] = json!(status);
            value["lastTransitionTime"] = now();
        }
        out.push(value);
        seen.push(c.type_.clone());
    }
    let status = if ready { "True" } else { "False" };
    for (type_, status) in [
        ("PodScheduled", "True"),
        ("Initialized", "True"),
        ("ContainersReady", status),
        ("Ready", status),
    ] {
        if !seen.iter().any(|s| s == type_) {
            out.push(json!({"type": type_, "status": status, "lastTransitionTime": now()}));
        }
    }
    Value::Array(out)
}

/// The status a kubelet would report for `pod` once it has acted on its spec: every container
/// whose spec image `is_bad` fails to pull it, every other one runs its spec image. `None` when
/// that is what the pod reports already.
/// What one container (or native sidecar) reports once the kubelet has acted on its spec
/// `image`, given what it reported before: `(status, changed, ready)`.
fn converged_container(
    name: &str,
    image: &str,
    resources: &Value,
    previous: Option<&ContainerStatus>,
    is_bad: &(dyn Fn(&str) -> bool + Sync),
) -> (Value, bool, bool) {
    let restarts = previous.map_or(0, |s| s.restart_count);
    let same_image = previous.is_some_and(|s| s.image == image);
    let restarts_now = restarts + i32::from(previous.is_some() && !same_image);
    if is_bad(image) {
        let failing =
            same_image && previous.is_some_and(|s| waiting_reason(s) == Some(IMAGE_PULL_ERROR));
        if failing {
            let kept = serde_json::to_value(previous).expect("a status serializes");
            (kept, false, false)
        } else {
            (failing_status(name, image, restarts_now), true, false)
        }
    } else if previous.is_some_and(|s| same_image && s.ready && is_running(s)) {
        let mut kept = serde_json::to_value(previous).expect("a status serializes");
        // A resize is applied in place: new resources, no restart.
        let resized = kept["resources"] != *resources;
        if resized {
            kept["resources"] = resources.clone();
        }
        (kept, resized, true)
    } else {
        (
            running_status(name, image, resources, restarts_now),
            true,
            true,
        )
    }
}

/// The init container statuses once the kubelet has acted: a native sidecar as a container
/// (restarted on a new spec image, one more restart), a plain init container completed;
/// `(statuses, changed, every native sidecar ready)`.
fn converged_init_statuses(
    pod: &Pod,
    is_bad: &(dyn Fn(&str) -> bool + Sync),
) -> (Vec<Value>, bool, bool) {
    let statuses = init_container_statuses(pod);
    let mut changed = false;
    let mut all_ready = true;
    let mut out = Vec::new();
    for c in pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
    {
        let image = c.image.clone().unwrap_or_default();
        let previous = statuses.get(c.name.as_str()).copied();
        if c.restart_policy.as_deref() == Some("Always") {
            let resources = reported_resources(c);
            let (status, moved, ready) =
                converged_container(&c.name, &image, &resources, previous, is_bad);
            changed |= moved;
            all_ready &= ready;
            out.push(status);
        } else if let Some(previous) = previous {
            out.push(serde_json::to_value(previous).expect("a status serializes"));
        } else {
            changed = true;
            out.push(json!({
                "name": c.name,
                "image": image,
                "imageID": image_id(&image),
                "ready": true,
                "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
            }));
        }
    }
    (out, changed, all_ready)
}

fn converged_status(pod: &Pod, is_bad: &(dyn Fn(&str) -> bool + Sync)) -> Option<Value> {
    let statuses = container_statuses(pod);
    let (init_out, init_changed, init_ready) = converged_init_statuses(pod, is_bad);
    let mut changed = statuses.len() != spec_images(pod).len() || init_changed;
    let mut all_ready = init_ready;
    let mut out = Vec::new();
    let containers = pod.spec.iter().flat_map(|s| &s.containers);
    for ((name, image), container) in spec_images(pod).into_iter().zip(containers) {
        let previous = statuses.get(name.as_str()).copied();
        let resources = reported_resources(container);
        let (status, moved, ready) =
            converged_container(&name, &image, &resources, previous, is_bad);
        changed |= moved;
        all_ready &= ready;
        out.push(status);
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    changed |= phase != Some("Running") || pod_ready(pod) != all_ready;
    // Kubernetes 1.33 drops observedGeneration (its gate is off): only a kept one is followed,
    // or every pass would write again.
    let observed = pod.status.as_ref().and_then(|s| s.observed_generation);
    changed |= observed.is_some() && observed != pod.metadata.generation;
    if !changed {
        return None;
    }
    let mut status = json!({
        "phase": "Running",
        "observedGeneration": pod.metadata.generation,
        "conditions": conditions(pod, all_ready),
        "containerStatuses": out,
    });
    if pod
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .is_none()
    {
        status["startTime"] = now();
        status["hostIP"] = json!("127.0.0.1");
        status["podIP"] = json!("127.0.0.1");
    }
    if !init_out.is_empty() {
        status["initContainerStatuses"] = Value::Array(init_out);
    }
    Some(status)
}

/// The status of a container about to be restarted with a new image: every container whose
/// spec image differs from its reported one stops being ready (keeping the old image), and so
/// does the pod. `None` when no container has a new image or all such are reported not ready.
fn stopping_status(pod: &Pod) -> Option<Value> {
    let statuses = container_statuses(pod);
    let mut changed = false;
    let stop = |previous: &ContainerStatus, image: &str, changed: &mut bool| {
        let mut value = serde_json::to_value(previous).expect("a status serializes");
        if previous.image != image && previous.ready {
            *changed = true;
            value["ready"] = json!(false);
            value["started"] = json!(false);
            value["state"] = json!({"waiting": {"reason": "ContainerCreating"}});
        }
        value
    };
    let mut out = Vec::new();
    for (name, image) in spec_images(pod) {
        let previous = *statuses.get(name.as_str())?;
        out.push(stop(previous, &image, &mut changed));
    }
    let natives: BTreeMap<String, String> = native_sidecar_images(pod).into_iter().collect();
    let init_out: Vec<Value> = pod
        .status
        .iter()
        .flat_map(|s| s.init_container_statuses.iter().flatten())
        .map(|previous| match natives.get(&previous.name) {
            Some(image) => stop(previous, image, &mut changed),
            None => serde_json::to_value(previous).expect("a status serializes"),
        })
        .collect();
    changed.then(|| {
        let mut status = json!({
            "phase": "Running",
            "conditions": conditions(pod, false),
            "containerStatuses": out,
        });
        if !init_out.is_empty() {
            status["initContainerStatuses"] = Value::Array(init_out);
        }
        status
    })
}

/// Writes `change(pod)` as the pod's status, re-reading and retrying while the pod changes
/// under it. `Ok(None)` when `change` says there is nothing to write.
async fn write_status(
    pods: &Api<Pod>,
    name: &str,
    change: &(dyn Fn(&Pod) -> Option<Value> + Sync),
) -> Result<Option<Pod>, String> {
    let deadline = tokio::time::Instant::now() + CONFLICT_TIMEOUT;
    loop {
        // As a kubelet does, ask again while the apiserver is restarting or overloaded (the
        // fault suite restarts it under this kubelet).
        let pod = retry_transient(&format!("reading pod {name}"), START_UP_PATIENCE, || {
            pods.get(name)
        })
        .await
        .map_err(|e| format!("reading pod {name}: {e}"))?;
        let Some(status) = change(&pod) else {
            return Ok(None);
        };
        let patch = json!({
            "metadata": {"resourceVersion": pod.metadata.resource_version},
            "status": status,
        });
        // A write that did land before its answer was lost comes back as a conflict: read again.
        let params = PatchParams::default();
        let merge = Patch::Merge(&patch);
        match retry_transient(
            &format!("writing pod {name}'s status"),
            START_UP_PATIENCE,
            || pods.patch_status(name, &params, &merge),
        )
        .await
        {
            Ok(pod) => return Ok(Some(pod)),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                if tokio::time::Instant::now() >= deadline {
                    return Err(format!(
                        "the status of pod {name} kept conflicting for {CONFLICT_TIMEOUT:?}: {s:?}"
                    ));
                }
            }
            Err(e) => return Err(format!("writing the status of pod {name} ({patch}): {e}")),
        }
    }
}

fn never_bad(_: &str) -> bool {
    false
}

/// Starts pod `name`: Running and Ready, every container running its spec image.
pub async fn start(pods: &Api<Pod>, name: &str) -> Pod {
    match write_status(pods, name, &|pod| converged_status(pod, &never_bad)).await {
        Ok(Some(pod)) => pod,
        Ok(None) => pods.get(name).await.expect("reading the started pod"),
        Err(e) => panic!("starting pod {name}: {e}"),
    }
}

/// Restarts the containers of pod `name` whose spec image changed (the new image running,
/// ready). `None` when there was nothing to restart.
pub async fn restart_changed(pods: &Api<Pod>, name: &str) -> Option<Pod> {
    write_status(pods, name, &|pod| converged_status(pod, &never_bad))
        .await
        .unwrap_or_else(|e| panic!("restarting the containers of pod {name}: {e}"))
}

/// Makes every container of pod `name` whose spec image `is_bad` fail to pull it (not ready,
/// waiting with `ErrImagePull`; the pod not Ready) and restarts the other changed ones.
pub async fn fail_bad_images(
    pods: &Api<Pod>,
    name: &str,
    is_bad: &(dyn Fn(&str) -> bool + Sync),
) -> Option<Pod> {
    write_status(pods, name, &|pod| converged_status(pod, is_bad))
        .await
        .unwrap_or_else(|e| panic!("failing the bad images of pod {name}: {e}"))
}

/// Marks the containers of pod `name` whose spec image changed as stopped for a restart, and
/// the pod not Ready. `None` when there was nothing to mark.
pub async fn mark_not_ready(pods: &Api<Pod>, name: &str) -> Option<Pod> {
    write_status(pods, name, &stopping_status)
        .await
        .unwrap_or_else(|e| panic!("marking pod {name} not ready: {e}"))
}

/// One pass of a kubelet over the pods of `pods`' namespace that were started: containers whose
/// spec image `is_bad` fail, changed ones are restarted on their new image. Returns the names of
/// the pods whose status was written.
pub async fn sync(pods: &Api<Pod>, is_bad: &(dyn Fn(&str) -> bool + Sync)) -> Vec<String> {
    let list = pods
        .list(&ListParams::default())
        .await
        .unwrap_or_else(|e| panic!("listing pods for the kubelet: {e}"));
    let mut written = Vec::new();
    for pod in list {
        let started = pod
            .status
            .as_ref()
            .is_some_and(|s| s.container_statuses.is_some());
        if !started || converged_status(&pod, is_bad).is_none() {
            continue;
        }
        let name = pod.metadata.name.clone().unwrap_or_default();
        if fail_bad_images(pods, &name, is_bad).await.is_some() {
            written.push(name);
        }
    }
    written
}

/// Pods whose restart is under way, each with whether its spec changed again meanwhile.
type Restarting = Arc<Mutex<HashMap<String, bool>>>;

/// A kubelet running in the background for the pods of one namespace: whenever a container's
/// spec image differs from the image its status reports, it first marks the pod not ready,
/// then after a random 50–400 ms reports the new image running and ready. Stopped when
/// dropped.
pub struct BackgroundKubelet {
    task: JoinHandle<()>,
    errors: Arc<Mutex<Vec<String>>>,
}

impl BackgroundKubelet {
    /// Starts watching `pods` (a namespaced Api); delays are drawn from a generator seeded with
    /// `seed`.
    pub fn spawn(pods: Api<Pod>, seed: u64) -> Self {
        let errors = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn(watch_and_restart(pods, seed, errors.clone()));
        BackgroundKubelet { task, errors }
    }

    /// What went wrong writing statuses so far (empty when nothing did).
    pub fn errors(&self) -> Vec<String> {
        self.errors.lock().expect("errors lock").clone()
    }
}

impl Drop for BackgroundKubelet {
    fn drop(&mut self) {
        // Aborting the watch drops its JoinSet, which aborts the restarts under way.
        self.task.abort();
    }
}

async fn watch_and_restart(pods: Api<Pod>, seed: u64, errors: Arc<Mutex<Vec<String>>>) {
    let rng = Arc::new(Mutex::new(fastrand::Rng::with_seed(seed)));
    let restarting: Restarting = Arc::default();
    let mut restarts = JoinSet::new();
    let stream = watcher(pods.clone(), watcher::Config::default())
        .default_backoff()
        .applied_objects();
    let mut stream = std::pin::pin!(stream);
    loop {
        tokio::select! {
            item = stream.try_next() => match item {
                Ok(Some(pod)) if has_changed_containers(&pod) => {
                    let name = pod.metadata.name.clone().unwrap_or_default();
                    let mut under_way = restarting.lock().expect("restarting lock");
                    if let Some(dirty) = under_way.get_mut(&name) {
                        *dirty = true;
                    } else {
                        under_way.insert(name.clone(), false);
                        restarts.spawn(restart(
                            pods.clone(),
                            name,
                            rng.clone(),
                            restarting.clone(),
                            errors.clone(),
                        ));
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) => return,
                // The watcher retries with a backoff; nothing is lost but time.
                Err(e) => eprintln!("background kubelet: watching pods: {e}"),
            },
            Some(Err(e)) = restarts.join_next(), if !restarts.is_empty() => {
                if e.is_panic() {
                    errors.lock().expect("errors lock").push(format!("a restart panicked: {e}"));
                }
            }
        }
    }
}

/// Restarts pod `name`'s changed containers, again as long as its spec changed meanwhile.
async fn restart(
    pods: Api<Pod>,
    name: String,
    rng: Arc<Mutex<fastrand::Rng>>,
    restarting: Restarting,
    errors: Arc<Mutex<Vec<String>>>,
) {
    loop {
        if let Err(e) = write_status(&pods, &name, &stopping_status).await {
            errors.lock().expect("errors lock").push(e);
        }
        let delay = rng.lock().expect("rng lock").u64(50..=400);
        // The time a runtime takes to pull and start the new image, simulated.
        tokio::time::sleep(Duration::from_millis(delay)).await;
        if let Err(e) = write_status(&pods, &name, &|pod| converged_status(pod, &never_bad)).await {
            errors.lock().expect("errors lock").push(e);
        }
        let mut under_way = restarting.lock().expect("restarting lock");
        if under_way.get(&name) == Some(&true) {
            under_way.insert(name.clone(), false);
        } else {
            under_way.remove(&name);
            return;
        }
    }
}

/// Plays the kubelet for every pod of `pods`' namespace that is scheduled (`spec.nodeName`
/// set) and not being deleted, once a second until the task is dropped: a pod not yet started,
/// or with a container whose spec image changed, is reported converged (Running and Ready,
/// every container running its spec image; a changed one restarted once more).
pub async fn play_scheduled_pods(pods: Api<Pod>) {
    loop {
        match pods.list(&ListParams::default()).await {
            Ok(list) => {
                for pod in list {
                    let scheduled = pod
                        .spec
                        .as_ref()
                        .is_some_and(|spec| spec.node_name.is_some());
                    if !scheduled
                        || pod.metadata.deletion_timestamp.is_some()
                        || converged_status(&pod, &never_bad).is_none()
                    {
                        continue;
                    }
                    let name = pod.metadata.name.clone().unwrap_or_default();
                    if let Err(e) =
                        write_status(&pods, &name, &|pod| converged_status(pod, &never_bad)).await
                    {
                        eprintln!("played kubelet: pod {name}: {e}");
                    }
                }
            }
            Err(e) => eprintln!("played kubelet: listing pods: {e}"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_ids_name_the_repository_and_a_stable_digest() {
        let id = image_id("nginx:1.25");
        assert!(id.starts_with("nginx@sha256:"), "{id}");
        assert_eq!(id.len(), "nginx@sha256:".len() + 64);
        assert_eq!(id, image_id("nginx:1.25"));
        assert_ne!(id, image_id("nginx:1.27"));
        assert!(image_id("localhost:5000/team/proxy:v2").starts_with("localhost:5000/team/proxy@"));
        assert!(image_id("localhost:5000/proxy").starts_with("localhost:5000/proxy@"));
    }

    /// A pod with the plain init container `setup`, the native sidecar `agent` on `agent` and
    /// the container `app`, started on `agent:1`.
    fn native_pod(agent: &str) -> Pod {
        let mut pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {
                "initContainers": [
                    {"name": "setup", "image": "setup:1"},
                    {"name": "agent", "image": "agent:1", "restartPolicy": "Always"},
                ],
                "containers": [{"name": "app", "image": "app:1"}],
            },
        }))
        .expect("a pod");
        let status = converged_status(&pod, &never_bad).expect("a first status");
        pod.status = Some(serde_json::from_value(status).expect("a status"));
        pod.spec
            .as_mut()
            .expect("spec")
            .init_containers
            .as_mut()
            .expect("init")[1]
            .image = Some(agent.to_owned());
        pod
    }

    #[test]
    fn a_native_sidecar_with_a_new_image_is_restarted_alone() {
        let pod = native_pod("agent:1");
        assert!(runs(&pod, "agent", "agent:1") && runs(&pod, "app", "app:1"));
        assert!(pod_ready(&pod));
        assert!(!has_changed_containers(&pod));
        assert!(
            converged_status(&pod, &never_bad).is_none(),
            "nothing to do"
        );

        let mut pod = native_pod("agent:2");
        assert!(has_changed_containers(&pod));
        let stopping = stopping_status(&pod).expect("the sidecar stops");
        assert_eq!(stopping["initContainerStatuses"][1]["ready"], json!(false));
        assert_eq!(stopping["containerStatuses"][0]["ready"], json!(true));
        let app_before = container_statuses(&pod)["app"].clone();
        let status = converged_status(&pod, &never_bad).expect("a restart");
        pod.status = Some(serde_json::from_value(status).expect("a status"));
        assert!(runs(&pod, "agent", "agent:2"));
        let init = init_container_statuses(&pod);
        assert_eq!(init["agent"].restart_count, 1);
        assert_eq!(init["setup"].image, "setup:1");
        assert_eq!(
            container_statuses(&pod)["app"],
            &app_before,
            "the app is untouched"
        );
        assert!(!has_changed_containers(&pod) && pod_ready(&pod));
    }
}
