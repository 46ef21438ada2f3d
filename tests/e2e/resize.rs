//! A sidecar's resources changed in its SidecarSet, on a real kubelet: the controller resizes the
//! running pods in place (the `pods/resize` subresource, `resizePolicy` left NotRequired) instead
//! of restarting the sidecar or recreating the pod. The kubelet applies the new requests and
//! limits to the running container: the pod keeps its UID and QoS class, no container restarts,
//! the kubelet reports the new resources in the sidecar's status with no resize condition left,
//! and the sidecar itself sees its new CFS quota and memory limit in its own cgroup (it logs
//! them, the test reads its log). The SidecarSet reports every pod updated once its hash is
//! current, and at most maxUnavailable pods are being resized at once.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kruise_rs_api::SidecarSet;
use kruise_rs_api::quantity::Qty;
use kruise_rs_api::well_known::SIDECARSET_HASH;
use kube::api::{Api, LogParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::sidecarset::{
    UnavailableWatch, create_sidecarset, deployment, running_pods, running_started_at, status,
    wait_every_pod_updated,
};
use crate::support::{self, Cluster, TIMEOUT, wait_for};

const SIDECAR: &str = "sidecar";
/// The CFS period the kubelet gives every container, in µs.
const CFS_PERIOD: u64 = 100_000;

/// A container's requests and limits, and what the limits make of its cgroup.
struct Size {
    cpu_request: &'static str,
    memory_request: &'static str,
    cpu_limit: &'static str,
    memory_limit: &'static str,
    /// The CPU limit as a CFS quota, in µs per [`CFS_PERIOD`].
    cfs_quota: u64,
    /// The memory limit in bytes.
    memory_bytes: u64,
}

const BEFORE: Size = Size {
    cpu_request: "100m",
    memory_request: "32Mi",
    cpu_limit: "100m",
    memory_limit: "64Mi",
    cfs_quota: 10_000,
    memory_bytes: 64 << 20,
};

const AFTER: Size = Size {
    cpu_request: "200m",
    memory_request: "48Mi",
    cpu_limit: "200m",
    memory_limit: "96Mi",
    cfs_quota: 20_000,
    memory_bytes: 96 << 20,
};

impl Size {
    fn json(&self) -> Value {
        json!({
            "requests": {"cpu": self.cpu_request, "memory": self.memory_request},
            "limits": {"cpu": self.cpu_limit, "memory": self.memory_limit},
        })
    }

    fn requirements(&self) -> ResourceRequirements {
        serde_json::from_value(self.json()).expect("resource requirements")
    }

    /// What the sidecar logs of its cgroup under these limits (see [`sidecar_container`]).
    fn cgroup(&self) -> String {
        format!("{} {CFS_PERIOD} {}", self.cfs_quota, self.memory_bytes)
    }
}

/// The sidecar: exits on TERM, and logs `cgroup QUOTA PERIOD MEMORY` read from its own cgroup
/// (cgroup v1: runc mounts the container's own cpu and memory cgroups under /sys/fs/cgroup;
/// v2: `cpu.max`, `memory.max`) at its start and whenever they change, polled every 0.2 s.
fn sidecar_container(image: &str, size: &Size) -> Value {
    let script = r#"trap 'exit 0' TERM
read_cgroup() {
  if [ -f /sys/fs/cgroup/cpu.max ]; then
    echo "$(/bin/busybox cat /sys/fs/cgroup/cpu.max) $(/bin/busybox cat /sys/fs/cgroup/memory.max)"
  else
    echo "$(/bin/busybox cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) $(/bin/busybox cat /sys/fs/cgroup/cpu/cpu.cfs_period_us) $(/bin/busybox cat /sys/fs/cgroup/memory/memory.limit_in_bytes)"
  fi
}
last=
while true; do
  now=$(read_cgroup)
  [ "$now" = "$last" ] || echo "cgroup $now"
  last=$now
  sleep 0.2
done"#;
    json!({
        "name": SIDECAR,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/busybox", "sh", "-c", script],
        "resources": size.json(),
    })
}

fn resized_sidecarset(name: &str, namespace: &str, image: &str) -> SidecarSet {
    sidecarset_of(name, namespace, sidecar_container(image, &BEFORE))
}

fn sidecarset_of(name: &str, namespace: &str, sidecar: Value) -> SidecarSet {
    serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "SidecarSet",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "containers": [sidecar],
            "updateStrategy": {"type": "RollingUpdate", "maxUnavailable": 1}
        }
    }))
    .expect("a SidecarSet")
}

/// The app container's resources, left alone by the resize; with the sidecar's (requests below
/// limits) the pod is Burstable before and after, as a resize must keep it.
fn app_resources() -> ResourceRequirements {
    serde_json::from_value(json!({
        "requests": {"cpu": "50m", "memory": "16Mi"},
        "limits": {"cpu": "100m", "memory": "32Mi"},
    }))
    .expect("resource requirements")
}

/// Creates the Deployment `name` of `replicas` pods on `image`, its app container with
/// [`app_resources`]; returns its pods once they run.
async fn start_app(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    image: &str,
    replicas: usize,
) -> Vec<Pod> {
    let mut app = deployment(
        name,
        image,
        i32::try_from(replicas).expect("a few replicas"),
    );
    let template = app
        .spec
        .as_mut()
        .and_then(|s| s.template.spec.as_mut())
        .expect("a pod template");
    template.containers[0].resources = Some(app_resources());
    Api::<Deployment>::namespaced(cluster.client(), namespace)
        .create(&PostParams::default(), &app)
        .await
        .expect("creating the Deployment");
    running_pods(cluster, namespace, name, replicas).await
}

fn name_of(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}

fn spec_resources<'a>(pod: &'a Pod, container: &str) -> Option<&'a ResourceRequirements> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == container)?
        .resources
        .as_ref()
}

/// The resources the kubelet reports the container running with.
fn status_resources<'a>(pod: &'a Pod, container: &str) -> Option<&'a ResourceRequirements> {
    status(pod, container)?.resources.as_ref()
}

fn same_quantity(a: Option<&Quantity>, b: Option<&Quantity>) -> bool {
    let parse = |q: Option<&Quantity>| q.and_then(|q| Qty::parse(&q.0));
    match (parse(a), parse(b)) {
        (Some(a), Some(b)) => !a.exceeds(&b) && !b.exceeds(&a),
        (None, None) => a.is_none() && b.is_none(),
        _ => false,
    }
}

/// Whether both hold the same requests and limits, by value ("0.2" is "200m").
fn same_resources(a: Option<&ResourceRequirements>, b: Option<&ResourceRequirements>) -> bool {
    let empty = BTreeMap::new();
    let same_map = |a: Option<&BTreeMap<String, Quantity>>,
                    b: Option<&BTreeMap<String, Quantity>>| {
        let (a, b) = (a.unwrap_or(&empty), b.unwrap_or(&empty));
        a.keys()
            .chain(b.keys())
            .all(|k| same_quantity(a.get(k), b.get(k)))
    };
    same_map(
        a.and_then(|r| r.requests.as_ref()),
        b.and_then(|r| r.requests.as_ref()),
    ) && same_map(
        a.and_then(|r| r.limits.as_ref()),
        b.and_then(|r| r.limits.as_ref()),
    )
}

fn describe_resources(r: Option<&ResourceRequirements>) -> String {
    let map = |m: Option<&BTreeMap<String, Quantity>>| {
        m.map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.0))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
    };
    match r {
        Some(r) => format!(
            "requests {} limits {}",
            map(r.requests.as_ref()),
            map(r.limits.as_ref())
        ),
        None => "none".to_owned(),
    }
}

/// The pod's resize conditions (`PodResizePending`, `PodResizeInProgress`), as
/// `type/reason: message`.
fn resize_conditions(pod: &Pod) -> Vec<String> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.type_ == "PodResizePending" || c.type_ == "PodResizeInProgress")
        .map(|c| {
            format!(
                "{}/{}: {}",
                c.type_,
                c.reason.as_deref().unwrap_or(""),
                c.message.as_deref().unwrap_or("")
            )
        })
        .collect()
}

/// Being resized: the sidecar's spec resources are not yet what the kubelet reports it running
/// with, or a resize condition is up.
fn resizing(pod: &Pod) -> bool {
    !same_resources(spec_resources(pod, SIDECAR), status_resources(pod, SIDECAR))
        || !resize_conditions(pod).is_empty()
}

/// Resized to `size`: in the spec, reported by the kubelet, no resize condition left.
fn resized_to(pod: &Pod, size: &Size) -> bool {
    let want = size.requirements();
    same_resources(spec_resources(pod, SIDECAR), Some(&want))
        && same_resources(status_resources(pod, SIDECAR), Some(&want))
        && resize_conditions(pod).is_empty()
}

fn describe(pod: &Pod) -> String {
    let restarts = |name: &str| {
        status(pod, name)
            .map(|s| s.restart_count.to_string())
            .unwrap_or_else(|| "no status".to_owned())
    };
    format!(
        "{} (uid {:?}, qos {:?}): sidecar spec {}, reported {}; conditions {:?}; restarts app {} \
         sidecar {}",
        name_of(pod),
        pod.metadata.uid,
        pod.status.as_ref().and_then(|s| s.qos_class.as_deref()),
        describe_resources(spec_resources(pod, SIDECAR)),
        describe_resources(status_resources(pod, SIDECAR)),
        resize_conditions(pod),
        restarts("app"),
        restarts(SIDECAR),
    )
}

fn qos_class(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.qos_class.as_deref()
}

/// The hash the pod records for SidecarSet `set` (`kruise.io/sidecarset-hash`), if any.
fn pod_hash(pod: &Pod, set: &str) -> Option<String> {
    let text = pod.metadata.annotations.as_ref()?.get(SIDECARSET_HASH)?;
    let map: Value = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("annotation {SIDECARSET_HASH} is not JSON ({e}): {text}"));
    Some(map.get(set)?.get("hash")?.as_str()?.to_owned())
}

/// Waits until the `count` pods of the Deployment `app` (none going) are all `check`ed; on
/// timeout, says how they were last seen.
async fn wait_pods(
    pods: &Api<Pod>,
    app: &str,
    count: usize,
    what: &str,
    check: impl Fn(&Pod) -> bool,
) -> Vec<Pod> {
    let all = |list: &[Pod]| list.iter().all(&check);
    crate::support::wait_app_pods(pods, app, count, what, describe, all).await
}

/// Waits until the sidecar of pod `pod` logs `want` as its cgroup limits (its latest line); on
/// timeout, says what it logged last.
async fn wait_cgroup(pods: &Api<Pod>, pod: &str, want: &str) {
    let params = LogParams {
        container: Some(SIDECAR.to_owned()),
        tail_lines: Some(1),
        ..LogParams::default()
    };
    let what = format!("{pod}'s sidecar to see its cgroup limits (quota period memory) {want}");
    let last = Arc::new(Mutex::new(String::new()));
    let found = tokio::time::timeout(
        TIMEOUT,
        wait_for(&what, TIMEOUT * 2, || async {
            let text = pods.logs(pod, &params).await.ok()?;
            let line = text.lines().last()?.to_owned();
            let seen = line.strip_prefix("cgroup ").map(str::to_owned);
            *last.lock().expect("lock") = line;
            (seen.as_deref() == Some(want)).then_some(())
        }),
    )
    .await;
    found.unwrap_or_else(|_| {
        panic!(
            "timed out after {TIMEOUT:?} waiting for {what}; its last log line: {:?}",
            last.lock().expect("lock")
        )
    })
}

/// The promise of the in-place resize, on a real kubelet: two pods of a Deployment run the
/// sidecar with requests 100m/32Mi and limits 100m/64Mi; the SidecarSet changes only its
/// resources (to 200m/48Mi, 200m/96Mi, the image the same); each pod is resized in place, at
/// most one at a time: the same pod UID and QoS class, app and sidecar never restarted (the same
/// processes), the new resources in the spec and in the kubelet's report with no resize
/// condition left, the sidecar's cgroup quota and memory limit changed under it, the pod's hash
/// annotation current, and the SidecarSet reporting every pod updated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_resources_change_resizes_running_pods_in_place() {
    let installed = support::installed().await;
    let cluster = installed.cluster;
    let ns = cluster.namespace("e2e-resize", json!({})).await;
    let name = support::unique_name("resize");
    let v1 = cluster.app_image("v1");

    create_sidecarset(cluster, &resized_sidecarset(&name, &ns.name, &v1), &ns.name).await;
    let before = start_app(cluster, &ns.name, &name, &v1, 2).await;
    let pods: Api<Pod> = Api::namespaced(cluster.client(), &ns.name);
    for pod in &before {
        assert!(
            resized_to(pod, &BEFORE) && qos_class(pod) == Some("Burstable"),
            "the sidecar injected with requests 100m/32Mi, limits 100m/64Mi, running so, the pod \
             Burstable: {}",
            describe(pod)
        );
        wait_cgroup(&pods, &name_of(pod), &BEFORE.cgroup()).await;
    }

    let sidecarsets: Api<SidecarSet> = Api::all(cluster.client());
    let watch = UnavailableWatch::start(pods.clone(), &name, resizing);
    let started = Instant::now();
    sidecarsets
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"containers": [sidecar_container(&v1, &AFTER)]}})),
        )
        .await
        .expect("changing the sidecar's resources");
    wait_pods(
        &pods,
        &name,
        2,
        "both pods' sidecars resized to 200m/48Mi, 200m/96Mi (spec and kubelet report, no \
         resize condition)",
        |p| resized_to(p, &AFTER),
    )
    .await;
    let resized = started.elapsed();
    for pod in &before {
        wait_cgroup(&pods, &name_of(pod), &AFTER.cgroup()).await;
    }
    let cgroups = started.elapsed();
    wait_every_pod_updated(cluster, &name, 2).await;
    let after = running_pods(cluster, &ns.name, &name, 2).await;
    let most_unavailable = watch.stop().await;

    let set = sidecarsets.get(&name).await.expect("the SidecarSet");
    let set_hash = set
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SIDECARSET_HASH))
        .cloned()
        .unwrap_or_else(|| panic!("SidecarSet {name} has no {SIDECARSET_HASH} annotation"));
    let before: BTreeMap<_, _> = before.iter().map(|p| (name_of(p), p)).collect();
    for pod in &after {
        let pod_name = name_of(pod);
        let old = before
            .get(&pod_name)
            .unwrap_or_else(|| panic!("pod {pod_name} is new: the resize recreated a pod"));
        assert_eq!(pod.metadata.uid, old.metadata.uid, "{pod_name}: same pod");
        assert!(
            resized_to(pod, &AFTER),
            "{pod_name}: still resized: {}",
            describe(pod)
        );
        assert_eq!(
            qos_class(pod),
            Some("Burstable"),
            "{pod_name}: the QoS class kept"
        );
        assert!(
            same_resources(spec_resources(pod, "app"), Some(&app_resources())),
            "{pod_name}: the app container's resources untouched: {}",
            describe_resources(spec_resources(pod, "app"))
        );
        for container in ["app", SIDECAR] {
            let (now, then) = (
                status(pod, container).expect("a container status now"),
                status(old, container).expect("a container status before"),
            );
            assert_eq!(
                (now.restart_count, then.restart_count),
                (0, 0),
                "{pod_name}: {container} never restarted"
            );
            assert_eq!(
                running_started_at(now),
                running_started_at(then),
                "{pod_name}: {container} still the same process"
            );
        }
        let (hash, old_hash) = (pod_hash(pod, &name), pod_hash(old, &name));
        assert_eq!(
            hash.as_deref(),
            Some(set_hash.as_str()),
            "{pod_name}: the pod's hash for {name} is the SidecarSet's (it was {old_hash:?})"
        );
        assert_ne!(
            hash, old_hash,
            "{pod_name}: the hash changed with the resources"
        );
    }
    eprintln!(
        "in-place resize of the sidecar in 2 pods: {resized:.1?} from the SidecarSet change to \
         the kubelet reporting both resized, {cgroups:.1?} to both sidecars seeing their new \
         cgroup limits (polled every 0.2 s); at most {most_unavailable} pod(s) unavailable at \
         once (maxUnavailable 1)"
    );
    assert!(
        most_unavailable <= 1,
        "maxUnavailable 1 exceeded: {most_unavailable} pods resizing or unready at once"
    );
}

/// The memory resize policy `RestartContainer` on the sidecar: the kubelet restarts the sidecar
/// alone to apply its new memory limit (one restart, new cgroup limits), the app container and the
/// pod stay. The controller sends the same resize either way; the policy is the kubelet's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_container_resize_policy_restarts_only_that_sidecar() {
    let installed = support::installed().await;
    let cluster = installed.cluster;
    let ns = cluster.namespace("e2e-resize-restart", json!({})).await;
    let name = support::unique_name("resize-restart");
    let v1 = cluster.app_image("v1");
    let with_policy = |size: &Size| {
        let mut sidecar = sidecar_container(&v1, size);
        sidecar["resizePolicy"] = json!([
            {"resourceName": "cpu", "restartPolicy": "NotRequired"},
            {"resourceName": "memory", "restartPolicy": "RestartContainer"},
        ]);
        sidecar
    };

    create_sidecarset(
        cluster,
        &sidecarset_of(&name, &ns.name, with_policy(&BEFORE)),
        &ns.name,
    )
    .await;
    let before = start_app(cluster, &ns.name, &name, &v1, 1).await;
    let pods: Api<Pod> = Api::namespaced(cluster.client(), &ns.name);
    wait_cgroup(&pods, &name_of(&before[0]), &BEFORE.cgroup()).await;

    let sidecarsets: Api<SidecarSet> = Api::all(cluster.client());
    sidecarsets
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"containers": [with_policy(&AFTER)]}})),
        )
        .await
        .expect("changing the sidecar's resources");
    let after = wait_pods(
        &pods,
        &name,
        1,
        "the sidecar resized to 200m/48Mi, 200m/96Mi and restarted once for its memory",
        |p| {
            resized_to(p, &AFTER)
                && status(p, SIDECAR).is_some_and(|s| s.restart_count == 1 && s.ready)
        },
    )
    .await;
    wait_cgroup(&pods, &name_of(&after[0]), &AFTER.cgroup()).await;
    wait_every_pod_updated(cluster, &name, 1).await;
    let (pod, old) = (&after[0], &before[0]);
    assert_eq!(pod.metadata.uid, old.metadata.uid, "the same pod");
    let app_now = status(pod, "app").expect("the app's status");
    let app_then = status(old, "app").expect("the app's status before");
    assert_eq!(app_now.restart_count, 0, "the app never restarted");
    assert_eq!(
        running_started_at(app_now),
        running_started_at(app_then),
        "the app is still the same process"
    );
}
