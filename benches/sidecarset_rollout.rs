//! SidecarSet rollout at scale: the decisions of one reconcile over 10,000 pods, and a 5,000-pod
//! in-place rollout against a real kube-apiserver on loopback.
//!
//! `cargo bench --bench sidecarset_rollout` (env `PODS`, default 5000; `ROUNDS`, default 3;
//! `DECISION_PODS`, default 10000; `DECISION_RUNS`, default 30; `PODS=0` or `DECISION_PODS=0`
//! skips that part; the controller logs to stderr at `RUST_LOG`, default `warn`):
//! 1. rollout: starts a local control plane (tests/controlplane/start.sh), installs the CRDs,
//!    creates the manager namespace, a SidecarSet (labelled for the controller's label selector,
//!    hash annotations as the webhook writes them, maxUnavailable 100%) and PODS pods already
//!    injected with sidecar image v1. Each round: this program plays the kubelet (every pod
//!    Running and Ready, its sidecar running its spec image), starts `sidecarset::run` in this
//!    process and waits until the status counts every pod matched, updated and ready; then the
//!    SidecarSet's image moves one version up (spec and hash annotation together) and the time
//!    until a pod watch has seen every pod on it is measured (and until `status.updatedPods` is
//!    PODS), with the pod PATCH requests the apiserver counted and the CPU of this process, the
//!    apiserver and etcd; in round 1 the process's memory (RSS after glibc's `malloc_trim`, and
//!    the heap in use from `mallinfo2`) before the controller, with its caches filled, after the
//!    rollout and once it stopped;
//! 2. baseline, in the same round: the controller stopped, a plain client sends every pod the
//!    equivalent JSON patch (image one version up, the hash and in-place update state
//!    annotations, no `test` operations), 16 at a time as the controller does, timed the same
//!    way. The next round starts with the SidecarSet moved to where the baseline left the pods.
//!    Rounds interleave the two so that other load on the machine (builds) hits both alike; the
//!    ratio of the medians is the figure, with the CPU other processes used during each phase;
//! 3. decision CPU, no cluster (after the rollout, so that the process RSS the rollout reports is
//!    its own): DECISION_PODS realistic pods (labels, the annotations the webhook writes, two
//!    containers, Running status with container statuses; half already on the new hash, some
//!    not ready, some not restarted yet) go through `strip_pod` as the controller's store keeps
//!    them; `owned_pods` + `plan` for a SidecarSet at maxUnavailable 10% is timed DECISION_RUNS
//!    times on one thread (the thread's own CPU time, from
//!    `clock_gettime(CLOCK_THREAD_CPUTIME_ID)`; wall time next to it). Baseline in the same run:
//!    deserializing the same pods from their JSON (what receiving them over a watch costs
//!    anyway). Also the heap a stored (stripped) pod takes, and plan's steps timed apart.
//!
//! Figures are printed with their ratio to the baseline (goal: rollout within 1.5x); nothing is
//! asserted.

use kruise_rs_testkit as harness;

use harness::bench::{Result, env_number, median};
use harness::controlplane::{ControlPlane, Crds};
use harness::objects::{create_namespace, stamp_hashes};
use harness::procfs::{cpu_total, machine_cpu, rss_mib};
use harness::rollout::{
    await_rollout, container_image, describe_patches, describe_status, follow, patches_between,
    pod_patches, secs, watch_status,
};
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kruise_rs::controllers::ControllerOptions;
use kruise_rs::controllers::sidecarset::pods::NamespaceLabels;
use kruise_rs::controllers::sidecarset::predownload::{self, Decision};
use kruise_rs::controllers::sidecarset::rollout::CurrentHashes;
use kruise_rs::controllers::sidecarset::{self, PreDownloadInputs, owned_pods, plan};
use kruise_rs_api::defaults::default_sidecarset;
use kruise_rs_api::sidecarset::{SidecarSet, SidecarSetStatus};
use kruise_rs_api::well_known::{
    SIDECARSET_HASH, SIDECARSET_HASH_WITHOUT_IMAGE, SIDECARSET_INJECTED_LIST,
    SIDECARSET_INPLACE_UPDATE_STATE,
};
use kruise_rs_controller::pod_summary::{PodSummary, strip_pod};
use kruise_rs_imagepull::lean_nodeimage::LeanNodeImage;
use kruise_rs_sidecar::hash::sidecarset_hash;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::oneshot;

/// Where the controller keeps its ControllerRevisions.
const MANAGER_NAMESPACE: &str = "kruise-rs-system";
/// The rollout's pods.
const POD_NAMESPACE: &str = "bench-rollout";
/// The controller only sees SidecarSets carrying this label.
const LABEL: &str = "kruise-rs-bench";
const LABEL_VALUE: &str = "sidecarset-rollout";
const SET_NAME: &str = "bench-mesh";
/// The `app` label the SidecarSet selects.
const APP: &str = "web";
const SIDECAR: &str = "proxy";
/// The sidecar is injected before the app container (`BeforeAppContainer`).
const SIDECAR_INDEX: usize = 0;
const PROXY: &str = "registry.local/mesh/proxy";
/// The controller's `UPGRADE_CONCURRENCY`; the baseline patches as many pods at once.
const CONCURRENCY: usize = 16;
/// Requests in flight while setting up.
const SETUP_CONCURRENCY: usize = 32;
/// Longest wait without progress before a phase is declared stalled.
const STALL: Duration = Duration::from_secs(120);
/// The design's goal: rollout time within this factor of the baseline's.
const GOAL: f64 = 1.5;
/// Namespaces the decision part spreads its pods over.
const DECISION_NAMESPACES: usize = 20;

fn main() -> Result<()> {
    if !harness::bench::requested("sidecarset_rollout") {
        return Ok(());
    }
    let pods = env_number("PODS", 5000, 0)?;
    let decision_pods = env_number("DECISION_PODS", 10000, 0)?;
    let runs = env_number("DECISION_RUNS", 30, 0)?.max(1);
    let rounds = env_number("ROUNDS", 3, 0)?.max(1);
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    println!(
        "command: PODS={pods} ROUNDS={rounds} DECISION_PODS={decision_pods} DECISION_RUNS={runs} cargo bench --bench sidecarset_rollout"
    );
    // The rollout first, so that the process RSS it reports is not the decision part's.
    if pods > 0 {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        let result = runtime.block_on(rollout(pods, rounds));
        // Watches of a stalled phase may still run on the runtime: do not wait for them.
        runtime.shutdown_timeout(Duration::from_secs(1));
        result?;
    }
    if decision_pods > 0 {
        // On the main thread, the runtime gone and the control plane stopped.
        decision(decision_pods, runs)?;
    }
    Ok(())
}

// --- objects -----------------------------------------------------------------------------------

fn image(version: &str) -> String {
    format!("{PROXY}:{version}")
}

/// A made-up but well-formed digest reference for `image`.
fn image_id(image: &str) -> String {
    let repo = image.rsplit_once(':').map_or(image, |(r, _)| r);
    format!("{repo}@sha256:{}", hex64(image))
}

fn hex64(seed: &str) -> String {
    (0..4u8)
        .map(|i| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (seed, i).hash(&mut h);
            format!("{:016x}", h.finish())
        })
        .collect()
}

fn sidecar_container(image: &str) -> Value {
    json!({
        "name": SIDECAR,
        "image": image,
        "args": ["proxy", "sidecar", "--log-level=warning", "--concurrency=2"],
        "ports": [{"name": "http-prom", "containerPort": 15090, "protocol": "TCP"}],
        "env": [
            {"name": "PROXY_CONFIG", "value": "{\"discoveryAddress\":\"mesh.mesh-system.svc:15012\"}"},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}
        ],
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"cpu": "2", "memory": "1Gi"}
        },
        "readinessProbe": {"httpGet": {"path": "/healthz/ready", "port": 15021}, "periodSeconds": 2}
    })
}

/// The SidecarSet as the webhook would store it: defaulted, with both hash annotations.
fn sidecarset(version: &str, max_unavailable: &str) -> Result<SidecarSet> {
    let mut set: SidecarSet = serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "SidecarSet",
        "metadata": {"name": SET_NAME, "labels": {LABEL: LABEL_VALUE}},
        "spec": {
            "selector": {"matchLabels": {"app": APP}},
            "containers": [sidecar_container(&image(version))],
            "updateStrategy": {"type": "RollingUpdate", "maxUnavailable": max_unavailable}
        }
    }))?;
    default_sidecarset(&mut set);
    stamp_hashes(&mut set);
    Ok(set)
}

fn set_annotation(set: &SidecarSet, key: &str) -> String {
    set.annotations().get(key).cloned().unwrap_or_default()
}

/// What one bench pod looks like.
struct PodShape<'a> {
    namespace: &'a str,
    index: usize,
    /// This SidecarSet's entries in the pod's hash annotations.
    hash: &'a str,
    hash_without_image: &'a str,
    revision: &'a str,
    /// The sidecar's spec image, and the image its status reports running.
    spec_image: String,
    running_image: String,
    /// The sidecar's imageID before its last in-place upgrade, if it had one.
    upgraded_from: Option<String>,
    ready: bool,
    created: Timestamp,
}

fn pod_name(i: usize) -> String {
    format!("web-7c9d8f6b5-{i:05}")
}

/// The pod as the apiserver hands it out (no managedFields): labels, the annotations the webhook
/// writes (and a few others), the sidecar and an app container, Running status with container
/// statuses.
fn pod_json(s: &PodShape<'_>) -> Value {
    let i = s.index;
    let created = Time(s.created);
    let ready_since = Time(
        Timestamp::from_second(s.created.as_second() + 30 + (i % 600) as i64).unwrap_or(s.created),
    );
    let mut annotations = BTreeMap::from([
        (SIDECARSET_INJECTED_LIST.to_owned(), SET_NAME.to_owned()),
        (
            SIDECARSET_HASH.to_owned(),
            harness::rollout::hash_annotation(SET_NAME, SIDECAR, s.hash, s.revision, &created),
        ),
        (
            SIDECARSET_HASH_WITHOUT_IMAGE.to_owned(),
            harness::rollout::hash_annotation(
                SET_NAME,
                SIDECAR,
                s.hash_without_image,
                "",
                &created,
            ),
        ),
        ("prometheus.io/scrape".to_owned(), "true".to_owned()),
        ("prometheus.io/port".to_owned(), "9102".to_owned()),
        (
            "kubectl.kubernetes.io/restartedAt".to_owned(),
            "2026-11-02T09:14:00Z".to_owned(),
        ),
    ]);
    if let Some(before) = &s.upgraded_from {
        annotations.insert(
            SIDECARSET_INPLACE_UPDATE_STATE.to_owned(),
            harness::rollout::update_state(SET_NAME, SIDECAR, s.hash, before, &created),
        );
    }
    let ready = if s.ready { "True" } else { "False" };
    let not_ready_reason = (!s.ready).then_some("ContainersNotReady");
    let app_image = "registry.local/shop/web:3.14.2";
    let container_id = |name: &str| format!("containerd://{}", hex64(&format!("{name}{i}")));
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(i),
            "namespace": s.namespace,
            "uid": format!("{}-{:04x}-4{:03x}-8{:03x}-{:012x}", &hex64(&i.to_string())[..8], i % 0xffff, i % 0xfff, (i / 7) % 0xfff, i),
            "resourceVersion": (100_000 + i).to_string(),
            "creationTimestamp": created,
            "generateName": "web-7c9d8f6b5-",
            "labels": {
                "app": APP,
                "pod-template-hash": "7c9d8f6b5",
                "app.kubernetes.io/version": "3.14.2",
                "team": s.namespace,
                "zone": format!("zone-{}", ["a", "b", "c"][i % 3])
            },
            "annotations": annotations,
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7c9d8f6b5",
                "uid": "6f1c2b3a-1d2e-4f5a-9b8c-7d6e5f4a3b2c", "controller": true, "blockOwnerDeletion": true
            }]
        },
        "spec": {
            "nodeName": format!("node-{:04}", i % 500),
            "containers": [
                sidecar_container(&s.spec_image),
                {
                    "name": "app",
                    "image": app_image,
                    "args": ["--listen=:8080", "--config=/etc/web/config.yaml"],
                    "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                    "env": [
                        {"name": "APP_NAME", "value": "web"},
                        {"name": "LOG_LEVEL", "value": "info"},
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
                    ],
                    "resources": {
                        "requests": {"cpu": "500m", "memory": "512Mi"},
                        "limits": {"cpu": "2", "memory": "1Gi"}
                    },
                    "volumeMounts": [{"name": "config", "mountPath": "/etc/web"}],
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 5},
                    "livenessProbe": {"httpGet": {"path": "/live", "port": 8080}, "periodSeconds": 10},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent"
                }
            ],
            "volumes": [{"name": "config", "configMap": {"name": "web-config", "defaultMode": 420}}],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "schedulerName": "default-scheduler",
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            ]
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": created},
                {"type": "Initialized", "status": "True", "lastTransitionTime": created},
                {"type": "Ready", "status": ready, "reason": not_ready_reason, "lastTransitionTime": ready_since},
                {"type": "ContainersReady", "status": ready, "reason": not_ready_reason, "lastTransitionTime": ready_since},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": created}
            ],
            "hostIP": format!("10.0.{}.{}", (i % 500) / 250, (i % 250) + 1),
            "hostIPs": [{"ip": format!("10.0.{}.{}", (i % 500) / 250, (i % 250) + 1)}],
            "podIP": format!("10.{}.{}.{}", 64 + i / 65536, (i / 256) % 256, i % 256),
            "podIPs": [{"ip": format!("10.{}.{}.{}", 64 + i / 65536, (i / 256) % 256, i % 256)}],
            "startTime": created,
            "qosClass": "Burstable",
            "containerStatuses": [
                {
                    "name": "app", "image": app_image, "imageID": image_id(app_image),
                    "containerID": container_id("app"), "ready": s.ready, "started": true,
                    "restartCount": i % 3,
                    "state": {"running": {"startedAt": created}}
                },
                {
                    "name": SIDECAR, "image": s.running_image, "imageID": image_id(&s.running_image),
                    "containerID": container_id(SIDECAR), "ready": s.ready, "started": true,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": ready_since}}
                }
            ]
        }
    })
}

// --- 1. decision CPU ---------------------------------------------------------------------------

/// CPU time the calling thread has used (`clock_gettime(CLOCK_THREAD_CPUTIME_ID)` from the C
/// library std links anyway); `None` where that is not available.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
fn thread_cpu() -> Option<Duration> {
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    unsafe extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec (two 64-bit fields on 64-bit Linux) for the
    // duration of the call, and the clock id is Linux's CLOCK_THREAD_CPUTIME_ID.
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
fn thread_cpu() -> Option<Duration> {
    None
}

/// Times `f` on this thread: (CPU time, or wall time when CPU time is unknown; wall time).
fn timed<T>(f: impl FnOnce() -> T) -> (Duration, Duration, T) {
    let cpu0 = thread_cpu();
    let wall0 = Instant::now();
    let out = f();
    let wall = wall0.elapsed();
    let cpu = match (cpu0, thread_cpu()) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => wall,
    };
    (cpu, wall, out)
}

/// The CPU time of deserializing every pod of `wire` as a `T`, `runs` times.
fn decode_times<T: serde::de::DeserializeOwned>(
    wire: &[Vec<u8>],
    runs: usize,
) -> Result<Percentiles> {
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let mut pods = Vec::with_capacity(wire.len());
        let (cpu, _, result) = timed(|| -> Result<()> {
            for b in wire {
                pods.push(serde_json::from_slice::<T>(b)?);
            }
            Ok(())
        });
        result?;
        drop(std::hint::black_box(pods));
        times.push(cpu);
    }
    Ok(percentiles(times))
}

struct Percentiles {
    p50: Duration,
    p90: Duration,
}

fn percentiles(mut samples: Vec<Duration>) -> Percentiles {
    samples.sort_unstable();
    let n = samples.len();
    let at = |q: f64| samples[((q * n as f64).ceil() as usize).clamp(1, n) - 1];
    Percentiles {
        p50: at(0.5),
        p90: at(0.9),
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn decision(n: usize, runs: usize) -> Result<()> {
    let old = sidecarset("v1", "10%")?;
    let mut set = sidecarset("v2", "10%")?;
    set.metadata.uid = Some("0b7f3c52-7d1e-4c8a-9f0e-2a6b5c4d3e21".to_owned());
    set.metadata.generation = Some(2);
    let revision = format!("{SET_NAME}-5f7d9c8b6");
    set.status = Some(SidecarSetStatus {
        observed_generation: Some(2),
        matched_pods: i32::try_from(n).unwrap_or(i32::MAX),
        latest_revision: Some(revision.clone()),
        collision_count: Some(0),
        ..Default::default()
    });
    let (old_hash, new_hash) = (
        set_annotation(&old, SIDECARSET_HASH),
        set_annotation(&set, SIDECARSET_HASH),
    );
    let without_image = set_annotation(&set, SIDECARSET_HASH_WITHOUT_IMAGE);
    let namespaces: Vec<String> = (0..DECISION_NAMESPACES)
        .map(|i| format!("team-{i:02}"))
        .collect();
    let namespace_labels: NamespaceLabels = namespaces
        .iter()
        .map(|ns| {
            let labels = BTreeMap::from([
                ("kubernetes.io/metadata.name".to_owned(), ns.clone()),
                ("env".to_owned(), "prod".to_owned()),
            ]);
            (ns.clone(), labels)
        })
        .collect();

    // Even pods are on v2 already (odd ones on v1); 1 in 10 is not ready (half of them on
    // each version); 1 in 40 was upgraded but kubelet has not restarted its sidecar yet.
    let base = Timestamp::now().as_second() - 86_400;
    let (v1, v2) = (image("v1"), image("v2"));
    let mut wire = Vec::with_capacity(n);
    for i in 0..n {
        let on_new = i % 2 == 0;
        let not_restarted = i % 40 == 10;
        let shape = PodShape {
            namespace: &namespaces[i % DECISION_NAMESPACES],
            index: i,
            hash: if on_new { &new_hash } else { &old_hash },
            hash_without_image: &without_image,
            revision: if on_new { &revision } else { "" },
            spec_image: if on_new { v2.clone() } else { v1.clone() },
            running_image: if on_new && !not_restarted {
                v2.clone()
            } else {
                v1.clone()
            },
            upgraded_from: on_new.then(|| image_id(&v1)),
            ready: !matches!(i % 20, 3 | 4),
            created: Timestamp::from_second(base + (i as i64 % 3600))?,
        };
        wire.push(serde_json::to_vec(&pod_json(&shape))?);
    }
    let bytes: usize = wire.iter().map(Vec::len).sum();
    trim_heap();
    let rss_wire = rss_mib(std::process::id(), "VmRSS:");
    let heap_wire = heap_in_use_mib();
    let stored: Vec<Arc<PodSummary>> = wire
        .iter()
        .map(|b| {
            let mut pod: PodSummary = serde_json::from_slice(b)?;
            strip_pod(&mut pod);
            Ok(Arc::new(pod))
        })
        .collect::<Result<_>>()?;
    trim_heap();
    let kib_each = |before: Option<f64>, after: Option<f64>| match (before, after) {
        (Some(a), Some(b)) => format!("{:.1} KiB", (b - a) * 1024.0 / n as f64),
        _ => "unknown".to_owned(),
    };
    let per_pod = format!(
        "{} of process RSS and {} of heap in use",
        kib_each(rss_wire, rss_mib(std::process::id(), "VmRSS:")),
        kib_each(heap_wire, heap_in_use_mib())
    );
    let now = Time(Timestamp::now());
    // Pre-download as the reconcile feeds it: the SidecarSet's knobs, no jobs yet, and no
    // NodeImages (no pod waits for a pull).
    let (knobs, _) = predownload::knobs(&set);
    let no_nodeimage = |_: &str| -> Option<Arc<LeanNodeImage>> { None };
    let pre = PreDownloadInputs {
        knobs: &knobs,
        manager_namespace: MANAGER_NAMESPACE,
        jobs: &[],
        nodeimage: &no_nodeimage,
    };

    // The version pods are upgraded to, as the reconcile takes it before planning: with the
    // SidecarSet's revision checked for what a resize can reach.
    let registered =
        kruise_rs_sidecar::revision::history::new_revision(&set, MANAGER_NAMESPACE, 1, 0);
    let current = || CurrentHashes::with_resize(&set, [&registered], true);

    // One untimed round to warm caches and allocator, and to describe what is decided.
    let owned = owned_pods(&set, stored.iter().cloned(), &namespace_labels);
    let decided = plan(&set, current(), &owned, 0, &now, &pre);
    let status = &decided.report.status;
    let not_ready = decided
        .batch
        .upgrade
        .iter()
        .filter(|&&i| !decided.views[i].ready)
        .count();
    println!(
        "decisions of one reconcile over {n} matched pods, maxUnavailable 10% (owned_pods + plan, one thread, {runs} runs)"
    );
    println!(
        "  pods: {n} in {DECISION_NAMESPACES} namespaces, {:.1} KiB of JSON each (no managedFields), kept stripped as the store keeps them: \
         {per_pod} each (after malloc_trim; size_of PodSummary {} B, ContainerSummary {} B, ContainerStatusSummary {} B; \
         k8s-openapi's Pod {} B, Container {} B, ContainerStatus {} B)",
        bytes as f64 / n as f64 / 1024.0,
        std::mem::size_of::<PodSummary>(),
        std::mem::size_of::<kruise_rs_controller::pod_summary::ContainerSummary>(),
        std::mem::size_of::<kruise_rs_controller::pod_summary::ContainerStatusSummary>(),
        std::mem::size_of::<Pod>(),
        std::mem::size_of::<k8s_openapi::api::core::v1::Container>(),
        std::mem::size_of::<k8s_openapi::api::core::v1::ContainerStatus>(),
    );
    println!(
        "  decided: {} owned; status matched {} updated {} ready {} updatedReady {}; {} in flight; batch of {} ({} of them not ready); hold {:?}",
        owned.len(),
        status.matched_pods,
        status.updated_pods,
        status.ready_pods,
        status.updated_ready_pods,
        decided.batch.in_flight.len(),
        decided.batch.upgrade.len(),
        not_ready,
        decided.batch.hold,
    );
    let pull = match &decided.predownload {
        Decision::Pull(jobs) => format!(
            "pull: {} job(s) over {} node(s)",
            jobs.len(),
            jobs.iter().map(|j| j.nodes.len()).sum::<usize>()
        ),
        other => format!("{other:?}"),
    };
    println!("  pre-download decided: {pull}");
    drop(decided);
    drop(owned);

    let clock = if thread_cpu().is_some() {
        "thread CPU time"
    } else {
        "wall time (thread CPU time unavailable)"
    };
    let (mut own_cpu, mut plan_cpu, mut total_cpu, mut total_wall) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let (cpu, wall, ()) = timed(|| {
            let (c1, _, owned) =
                timed(|| owned_pods(&set, stored.iter().cloned(), &namespace_labels));
            let (c2, _, decided) = timed(|| plan(&set, current(), &owned, 0, &now, &pre));
            own_cpu.push(c1);
            plan_cpu.push(c2);
            drop(std::hint::black_box(decided));
            drop(owned);
        });
        total_cpu.push(cpu);
        total_wall.push(wall);
    }
    let (own, planned, total, wall) = (
        percentiles(own_cpu),
        percentiles(plan_cpu),
        percentiles(total_cpu),
        percentiles(total_wall),
    );
    println!(
        "  {clock}: owned_pods p50 {} p90 {}; plan p50 {} p90 {}; whole (dropping the plan included) p50 {} p90 {} \
         ({:.2} µs per pod); wall p50 {}",
        ms(own.p50),
        ms(own.p90),
        ms(planned.p50),
        ms(planned.p90),
        ms(total.p50),
        ms(total.p90),
        total.p50.as_secs_f64() * 1e6 / n as f64,
        ms(wall.p50),
    );

    let decode = decode_times::<Pod>(&wire, runs)?;
    // What the controller's pod watch deserializes instead.
    let decode_summary = decode_times::<PodSummary>(&wire, runs)?;

    // Where plan's time goes: its steps, timed the same way.
    let owned = owned_pods(&set, stored.iter().cloned(), &namespace_labels);
    let latest = revision.as_str();
    let (mut view_cpu, mut batch_cpu, mut status_cpu, mut pull_cpu) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let (c1, _, views) = timed(|| {
            let current = sidecarset::rollout::CurrentHashes::of(&set);
            owned
                .iter()
                .map(|p| sidecarset::pods::view(&set, &current, p))
                .collect::<Vec<_>>()
        });
        let (c2, _, batch) = timed(|| sidecarset::rollout::next_batch(&set, &views));
        let (c3, _, report) =
            timed(|| sidecarset::status::compute_status(&set, &views, &batch, latest, 0, &now));
        let updated_ready = usize::try_from(report.status.updated_ready_pods).unwrap_or(0);
        let (c4, _, decision) = timed(|| {
            predownload::decide(
                &set,
                &owned,
                &batch,
                updated_ready,
                &knobs,
                MANAGER_NAMESPACE,
                false,
            )
        });
        drop(std::hint::black_box((views, batch, report, decision)));
        view_cpu.push(c1);
        batch_cpu.push(c2);
        status_cpu.push(c3);
        pull_cpu.push(c4);
    }
    drop(owned);
    println!(
        "  plan's steps, p50: a PodView per pod {}, next_batch {}, compute_status {}, pre-download decision {}",
        ms(percentiles(view_cpu).p50),
        ms(percentiles(batch_cpu).p50),
        ms(percentiles(status_cpu).p50),
        ms(percentiles(pull_cpu).p50),
    );
    println!(
        "  baseline, deserializing the same {n} pods from JSON as k8s-openapi Pods ({clock}): p50 {} p90 {} ({:.2} µs per pod, {:.0} MB/s)",
        ms(decode.p50),
        ms(decode.p90),
        decode.p50.as_secs_f64() * 1e6 / n as f64,
        bytes as f64 / decode.p50.as_secs_f64() / 1e6,
    );
    println!(
        "  deserializing them as PodSummary, as the controller's watch does: p50 {} p90 {} ({:.2}x the Pods)",
        ms(decode_summary.p50),
        ms(decode_summary.p90),
        decode_summary.p50.as_secs_f64() / decode.p50.as_secs_f64(),
    );
    println!(
        "  ratio decisions / deserializing: {:.2}x (p50), {:.2}x (p90)",
        total.p50.as_secs_f64() / decode.p50.as_secs_f64(),
        total.p90.as_secs_f64() / decode.p90.as_secs_f64(),
    );
    Ok(())
}

// --- environment -------------------------------------------------------------------------------

fn rss(field: &str) -> String {
    rss_mib(std::process::id(), field).map_or("unknown".into(), |r| format!("{r:.1} MiB"))
}

/// Hands the heap's free pages back to the system (glibc's `malloc_trim`), so that the RSS read
/// next is close to what is live rather than what the allocator kept.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim_heap() {
    unsafe extern "C" {
        fn malloc_trim(pad: usize) -> i32;
    }
    // SAFETY: malloc_trim only releases free memory of glibc's allocator, which this process
    // uses (no global allocator is set).
    unsafe {
        malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim_heap() {}

/// What the allocator has handed out and not got back, in MiB (glibc's `mallinfo2`, every
/// arena: `uordblks` + `hblkhd`). RSS beyond it is the binary, stacks, and freed memory the
/// allocator cannot return (fragmentation).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn heap_in_use_mib() -> Option<f64> {
    /// `struct mallinfo2`: ten `size_t`s; `hblkhd` is the 5th, `uordblks` the 8th.
    #[repr(C)]
    struct MallInfo2([usize; 10]);
    unsafe extern "C" {
        fn mallinfo2() -> MallInfo2;
    }
    // SAFETY: mallinfo2 takes nothing and returns the struct by value (glibc >= 2.33).
    let info = unsafe { mallinfo2() };
    Some((info.0[4] + info.0[7]) as f64 / (1024.0 * 1024.0))
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn heap_in_use_mib() -> Option<f64> {
    None
}

/// `VmRSS` after [`trim_heap`], and the heap in use.
fn memory() -> String {
    trim_heap();
    let heap = heap_in_use_mib().map_or("unknown".into(), |h| format!("{h:.1} MiB"));
    format!("RSS {} (heap in use {heap})", rss("VmRSS:"))
}

/// CPU seconds of this process, the apiserver and etcd, and of the whole machine.
struct Cpu {
    processes: Vec<(&'static str, Option<f64>)>,
    machine: Option<f64>,
    at: Instant,
}

impl Cpu {
    fn sample(cp: &ControlPlane) -> Self {
        let mut who = vec![("this process", std::process::id())];
        for name in ["kube-apiserver", "etcd"] {
            if let Some(pid) = cp.pid(name) {
                who.push((name, pid));
            }
        }
        Cpu {
            processes: who
                .into_iter()
                .map(|(name, pid)| (name, cpu_total(pid)))
                .collect(),
            machine: machine_cpu().map(|m| m.busy),
            at: Instant::now(),
        }
    }

    /// Each process's CPU seconds since `before`, and how many CPUs everything else on the
    /// machine (other builds, say) kept busy on average meanwhile.
    fn since(&self, before: &Cpu) -> String {
        let mut ours = Some(0.0);
        let mut parts: Vec<String> = self
            .processes
            .iter()
            .map(|(name, after)| {
                let used = before
                    .processes
                    .iter()
                    .find(|(n, _)| n == name)
                    .and_then(|(_, b)| Some((*after)? - (*b)?));
                ours = ours.zip(used).map(|(a, b)| a + b);
                match used {
                    Some(s) => format!("{name} {s:.1} s"),
                    None => format!("{name} unknown"),
                }
            })
            .collect();
        let wall = (self.at - before.at).as_secs_f64();
        match (self.machine, before.machine, ours) {
            (Some(a), Some(b), Some(ours)) if wall > 0.0 => parts.push(format!(
                "other processes {:.2} CPUs on average",
                ((a - b - ours) / wall).max(0.0)
            )),
            _ => parts.push("other processes unknown".to_owned()),
        }
        parts.join(", ")
    }
}

// --- 2. and 3. the rollout and its baseline -----------------------------------------------------

/// Follows the bench pods until `n` of them have sidecar spec image `target`.
async fn follow_image(
    pods: &Api<Pod>,
    target: String,
    n: usize,
) -> Result<harness::rollout::Follower> {
    let reached = move |pod: &Pod| container_image(pod, SIDECAR) == Some(target.as_str());
    Ok(follow(pods.clone(), watcher::Config::default(), reached, n).await?)
}

/// Sidecar image `v<k>`.
fn v(k: usize) -> String {
    image(&format!("v{k}"))
}

/// The bench pod `i` as injected with `set` at sidecar version `k`, running and ready.
fn rollout_pod(i: usize, set: &SidecarSet, k: usize) -> Result<Value> {
    let hash = set_annotation(set, SIDECARSET_HASH);
    let without_image = set_annotation(set, SIDECARSET_HASH_WITHOUT_IMAGE);
    let base = Timestamp::now().as_second() - 3600;
    Ok(pod_json(&PodShape {
        namespace: POD_NAMESPACE,
        index: i,
        hash: &hash,
        hash_without_image: &without_image,
        revision: "",
        spec_image: v(k),
        running_image: v(k),
        upgraded_from: None,
        ready: true,
        created: Timestamp::from_second(base + (i as i64 % 600))?,
    }))
}

/// Creates `n` pods injected with `set` (sidecar v1), without status (the apiserver ignores it
/// on create).
async fn create_pods(client: &Client, set: &SidecarSet, n: usize) -> Result<Duration> {
    let api: Api<Pod> = Api::namespaced(client.clone(), POD_NAMESPACE);
    let t = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let mut pod = rollout_pod(i, set, 1)?;
                let meta = pod["metadata"].as_object_mut().ok_or("no metadata")?;
                for key in [
                    "uid",
                    "resourceVersion",
                    "creationTimestamp",
                    "generateName",
                ] {
                    meta.remove(key);
                }
                pod.as_object_mut().ok_or("not an object")?.remove("status");
                let pod: Pod = serde_json::from_value(pod)?;
                api.create(&PostParams::default(), &pod).await?;
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
            }
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(t.elapsed())
}

/// Plays the kubelet: every pod Running and Ready, its sidecar running `v<k>` (its spec image,
/// restarted since the last upgrade).
async fn start_pods(client: &Client, set: &SidecarSet, n: usize, k: usize) -> Result<Duration> {
    let api: Api<Pod> = Api::namespaced(client.clone(), POD_NAMESPACE);
    let t = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let status = json!({"status": rollout_pod(i, set, k)?["status"]});
                api.patch_status(
                    &pod_name(i),
                    &PatchParams::default(),
                    &Patch::Merge(&status),
                )
                .await?;
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
            }
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(t.elapsed())
}

/// `set` at sidecar version `k`, with the hash annotations the webhook would write.
fn versioned(set: &SidecarSet, k: usize) -> SidecarSet {
    let mut out = set.clone();
    out.spec.containers[0].container.image = Some(v(k));
    stamp_hashes(&mut out);
    out
}

/// Moves the SidecarSet to sidecar version `k`: spec and hash annotations in one write.
async fn set_version(sets: &Api<SidecarSet>, set: &SidecarSet, k: usize) -> Result<SidecarSet> {
    let target = versioned(set, k);
    let patch = json!({
        "metadata": {"annotations": {
            SIDECARSET_HASH: set_annotation(&target, SIDECARSET_HASH),
            SIDECARSET_HASH_WITHOUT_IMAGE: set_annotation(&target, SIDECARSET_HASH_WITHOUT_IMAGE),
        }},
        "spec": {"containers": target.spec.containers},
    });
    Ok(sets
        .patch(SET_NAME, &PatchParams::default(), &Patch::Merge(&patch))
        .await?)
}

/// Polls the SidecarSet until `done`, up to [`STALL`].
async fn poll_status(
    api: &Api<SidecarSet>,
    what: &str,
    done: impl Fn(&SidecarSetStatus) -> bool,
) -> Result<Duration> {
    let t = Instant::now();
    let mut last = None;
    while t.elapsed() < STALL {
        if let Ok(set) = api.get(SET_NAME).await {
            if set.status.as_ref().is_some_and(&done) {
                return Ok(t.elapsed());
            }
            last = set.status;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!(
        "{what}: not within {} s; status {}",
        STALL.as_secs(),
        describe_status(last.as_ref())
    )
    .into())
}

async fn rollout(n: usize, rounds: usize) -> Result<()> {
    println!(
        "rollout of {n} pods at maxUnavailable 100% through a local kube-apiserver (sidecarset::run in this process), \
         {rounds} rounds of rollout then baseline"
    );
    let t = Instant::now();
    let cp = ControlPlane::start("kruise-rs-bench-cp-")?;
    cp.install_crds(Crds::Generated)?;
    let setup = cp.client().await?;
    create_namespace(&setup, MANAGER_NAMESPACE, &[]).await?;
    create_namespace(&setup, POD_NAMESPACE, &[]).await?;
    println!("  control plane and CRDs ready in {}", secs(t.elapsed()));

    let sets: Api<SidecarSet> = Api::all(setup.clone());
    let set = sets
        .create(&PostParams::default(), &sidecarset("v1", "100%")?)
        .await?;
    if sidecarset_hash(&set.spec) != set_annotation(&set, SIDECARSET_HASH) {
        // The webhook hashes the object it returns; the apiserver could still change the spec
        // while storing it (CRD defaults, pruning). The annotation is what the controller uses.
        println!("  note: the stored SidecarSet's spec hashes differently from its annotation");
    }
    let created = create_pods(&setup, &set, n).await?;
    println!(
        "  {n} pods injected with sidecar {} created in {} ({:.0}/s), {SETUP_CONCURRENCY} at a time",
        v(1),
        secs(created),
        n as f64 / created.as_secs_f64(),
    );

    let watch_client = cp.client().await?;
    let pods: Api<Pod> = Api::namespaced(watch_client.clone(), POD_NAMESPACE);
    let names: Vec<String> = (0..n).map(pod_name).collect();
    let (mut rollout_times, mut baseline_times, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let mut memory_line = String::new();
    // Round r rolls the SidecarSet out from v<k> to v<k+1>, then the baseline patches v<k+2>.
    let mut k = 1;
    for round in 1..=rounds {
        let (from, to, after) = (k, k + 1, k + 2);
        if round > 1 {
            // Where the last baseline left the pods, the controller still stopped.
            set_version(&sets, &set, from).await?;
        }
        let started = start_pods(&setup, &set, n, from).await?;
        let rss_before = memory();
        let opts = ControllerOptions {
            namespace: MANAGER_NAMESPACE.to_owned(),
            label_selector: Some(format!("{LABEL}={LABEL_VALUE}")),
            ..ControllerOptions::default()
        };
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        // The controller, on a client of its own.
        let controller = tokio::spawn(sidecarset::run(cp.client().await?, opts, async move {
            let _ = stop_rx.await;
        }));
        let n32 = i32::try_from(n)?;
        let took = poll_status(&sets, "every pod matched, updated and ready", move |s| {
            s.matched_pods == n32 && s.updated_pods == n32 && s.ready_pods == n32
        })
        .await?;
        let rss_filled = memory();
        println!(
            "  round {round}: pods Running/Ready on v{from} (status written by this program in {}); controller started, \
             status.matchedPods = updatedPods = readyPods = {n} after {}",
            secs(started),
            secs(took),
        );
        tokio::time::sleep(Duration::from_secs(1)).await;

        // The rollout: v<from> -> v<to>, spec and hash annotation together.
        let generation = sets.get(SET_NAME).await?.metadata.generation.unwrap_or(0) + 1;
        let follower = follow_image(&pods, v(to), n).await?;
        let updated = watch_status(Api::all(watch_client.clone()), SET_NAME, move |s| {
            s.updated_pods == n32 && s.observed_generation >= Some(generation)
        });
        let patches_before = pod_patches(&setup).await?;
        let cpu_before = Cpu::sample(&cp);
        let t0 = Instant::now();
        let stored = set_version(&sets, &set, to).await?;
        let reached = await_rollout(&sets, &stored, generation, follower, STALL).await?;
        let cpu_rollout = Cpu::sample(&cp).since(&cpu_before);
        let rollout_time = reached.all - t0;
        let updated_at = tokio::time::timeout(STALL, updated).await;
        let patches_rollout = describe_patches(&patches_between(
            &pod_patches(&setup).await?,
            &patches_before,
        ));
        let final_status = sets.get(SET_NAME).await?.status;
        let updated_line = match updated_at {
            Ok(Ok(Some((at, _)))) => format!("status.updatedPods = {n} after {}", secs(at - t0)),
            _ => format!(
                "status.updatedPods did not reach {n} within {} s of the last pod",
                STALL.as_secs()
            ),
        };
        println!(
            "    rollout v{from} -> v{to}, seen by a pod watch: {} ({:.0} pods/s); {updated_line}",
            reached.timeline(t0, n),
            n as f64 / rollout_time.as_secs_f64(),
        );
        println!("      pod PATCH requests meanwhile: {patches_rollout}; CPU: {cpu_rollout}");
        println!(
            "      status then: {}",
            describe_status(final_status.as_ref())
        );
        let rss_after = rss("VmRSS:");
        let peak_rollout = rss("VmHWM:");
        let rss_after_trimmed = memory();

        // Stop the controller before the baseline.
        let _ = stop_tx.send(());
        match tokio::time::timeout(Duration::from_secs(15), controller).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(format!("the controller task failed: {e}").into()),
            Err(_) => return Err("the controller did not stop within 15 s".into()),
        }
        // Let the last events and requests settle.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let rss_stopped = memory();
        if round == 1 {
            memory_line = format!(
                "  process memory in round 1 (controller and this driver), each after malloc_trim: before the controller {rss_before}; \
                 its caches filled {rss_filled}; after the rollout {rss_after_trimmed} (RSS {rss_after} before the trim, \
                 peak {peak_rollout}); the controller stopped {rss_stopped}"
            );
        }

        // Baseline: a plain client sends each pod the equivalent patch, v<to> -> v<after>.
        let api: Api<Pod> = Api::namespaced(cp.client().await?, POD_NAMESPACE);
        let revision = final_status
            .as_ref()
            .and_then(|s| s.latest_revision.clone())
            .unwrap_or_default();
        let new_hash = set_annotation(&versioned(&set, after), SIDECARSET_HASH);
        let before_id = image_id(&v(from));
        let new_image = v(after);
        let follower = follow_image(&pods, v(after), n).await?;
        let patches_before = pod_patches(&setup).await?;
        let cpu_before = Cpu::sample(&cp);
        let params = PatchParams {
            field_manager: Some("bench-baseline".to_owned()),
            ..PatchParams::default()
        };
        let t0 = Instant::now();
        let (api, params, new_hash, revision, before_id, new_image) =
            (&api, &params, &new_hash, &revision, &before_id, &new_image);
        futures::stream::iter(&names)
            .map(|name| async move {
                let patch = harness::rollout::upgrade_patch(
                    SET_NAME,
                    SIDECAR,
                    SIDECAR_INDEX,
                    new_image,
                    new_hash,
                    revision,
                    before_id,
                )?;
                api.patch(name, params, &Patch::<()>::Json(patch)).await?;
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
            })
            .buffer_unordered(CONCURRENCY)
            .try_collect::<Vec<_>>()
            .await?;
        let sent = t0.elapsed();
        let reached = follower.wait("baseline", STALL).await?;
        let cpu_baseline = Cpu::sample(&cp).since(&cpu_before);
        let baseline_time = reached.all - t0;
        let patches_baseline = describe_patches(&patches_between(
            &pod_patches(&setup).await?,
            &patches_before,
        ));
        println!(
            "    baseline, a plain client patching the same pods v{to} -> v{after} ({CONCURRENCY} at a time), seen by a pod watch: \
             {} ({:.0} pods/s; last answer after {})",
            reached.timeline(t0, n),
            n as f64 / baseline_time.as_secs_f64(),
            secs(sent),
        );
        println!("      pod PATCH requests meanwhile: {patches_baseline}; CPU: {cpu_baseline}");
        let ratio = rollout_time.as_secs_f64() / baseline_time.as_secs_f64();
        println!("    round {round}: rollout / baseline {ratio:.2}x");
        rollout_times.push(rollout_time.as_secs_f64());
        baseline_times.push(baseline_time.as_secs_f64());
        ratios.push(ratio);
        k = after;
    }
    let (rollout_median, baseline_median) = (median(&rollout_times), median(&baseline_times));
    let ratio = rollout_median / baseline_median;
    println!(
        "  summary: rollout median {rollout_median:.2} s ({:.0} pods/s), baseline median {baseline_median:.2} s ({:.0} pods/s); \
         ratio of the medians {ratio:.2}x (goal <= {GOAL}x: {}); per round: {}",
        n as f64 / rollout_median,
        n as f64 / baseline_median,
        if ratio <= GOAL { "met" } else { "NOT met" },
        ratios
            .iter()
            .map(|r| format!("{r:.2}x"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    println!("{memory_line}; peak over all rounds {}", rss("VmHWM:"));
    Ok(())
}
