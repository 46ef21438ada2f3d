//! The pod-injection webhook's latency in-process, and pod creation through a real kube-apiserver
//! with and without it.
//!
//! `cargo bench --bench admission` (env `REQUESTS`, default 20000; `PODS`, default 500;
//! `CLIENTS`, default 8; `ROUNDS`, default 3):
//! 1. starts a local control plane (tests/controlplane/start.sh) and installs the CRDs;
//! 2. baseline: PODS pods created while no webhook configuration exists, by one client one after
//!    the other, then by CLIENTS clients at once (each its own connection), ROUNDS times: the
//!    median pods/s;
//! 3. starts `kruise-rs manager` (release build) as a child with its webhooks on loopback and
//!    creates 50 SidecarSets through them: 3 that select the bench pod (containers, an init
//!    container, volumes, env, transferEnv, shared volumes) and 47 that do not (other labels,
//!    other namespaces, namespace selectors, near-miss label sets);
//! 4. in-process: `Handlers::new` fed by the same apiserver, its caches holding the 50
//!    SidecarSets; REQUESTS calls of `review(handlers, "/mutate-pod", body, deadline)` (decoding the
//!    AdmissionReview, deciding, encoding the answer) with the pod the apiserver itself hands a
//!    webhook (a dry-run create's defaulted pod, 2 containers): latency percentiles and
//!    single-thread throughput, for a pod 3 SidecarSets select and for one none selects; then
//!    `Handlers::admit` alone, the pure path (`plan_for_new_pod` + `inject` + `pod_patch`), and
//!    every stage of a request timed on its own (decode, cache read, plan, inject, patch,
//!    encode, drops), the fence the handler sends per request (decision 0044) and the metadata
//!    list of SidecarSets it sends when the fence is not a version its cache is known to hold
//!    (decision 0031), to show where the time goes (the handler's own patch step, its private
//!    `patch_preserving`, is what `admit()` takes beyond the other stages and the fence); and
//!    throughput with a task per core and more;
//! 5. through the apiserver, with the manager running, ROUNDS interleaved rounds of: pods in the
//!    manager's namespace (which the configuration excludes: the webhook is not called), the
//!    injected pod created directly there (what the bigger object alone costs), pods 3
//!    SidecarSets select (called, injected) and pods none selects (called, admitted unchanged),
//!    each with 1 and CLIENTS clients; median pods/s against the baseline and against the
//!    excluded namespace, the apiserver's own mean webhook call time
//!    (`apiserver_admission_webhook_admission_duration_seconds`), the TCP connections to the
//!    webhook, and CPU per pod of the apiserver, etcd, this process and the manager. Every run's
//!    pods are deleted after it, so each starts with the same store;
//! 6. the manager stopped and its configurations deleted, the baseline again (drift check);
//! 7. with `SECOND_MANAGER=<description file>` (format: crates/testkit/src/manager_under_test.rs;
//!    upstream's, its webhooks registered for real:
//!    benches/upstream-kruise-manager/manager.admission.yaml), the same again for that manager
//!    on a fresh control plane: baseline, the manager started and waited for (a SidecarSet comes
//!    back defaulted), the 50 SidecarSets created through its webhooks, the two runs that call
//!    its pod webhook; then both managers' figures side by side, each against its own baseline.
//!
//! `MANAGER_ARGS` (whitespace-separated) are appended to our manager's arguments, e.g.
//! `--sidecarset-cache-fence=false` (decision 0046); the in-process handlers of step 4 always
//! confirm their cache.
//!
//! Pods never run (no kubelet); creating them is what is measured. Figures are printed with the
//! goal (p99 ≤ 2 ms in-process) and ratios; nothing is asserted. The manager logs at
//! `MANAGER_RUST_LOG` (default `warn`) into a temporary file whose tail a failure prints.

use kruise_rs_testkit as harness;

use harness::bench::{Result, env_number, median};
use harness::controlplane::{ControlPlane, Crds, apiserver_metric};
use harness::manager_under_test::ManagerUnderTest;
use harness::objects::create_namespace;
use harness::process::{ChildGuard, free_loopback_port, tail};
use harness::procfs::{MachineCpu, cpu_seconds, machine_cpu};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kruise_rs::webhook::admission_deadline::AdmissionDeadline;
use kruise_rs::webhook::handlers::Handlers;
use kruise_rs::webhook::server::{self, Admit, Verdict};
use kruise_rs_api::sidecarset::SidecarSet;
use kruise_rs_sidecar as sidecar;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

/// The manager's namespace; the webhook configuration excludes it.
const MANAGER_NAMESPACE: &str = "kruise-rs-system";
/// Pods here are injected by 3 SidecarSets (one of them needs the namespace's `env: prod`).
const INJECT_NAMESPACE: &str = "bench-inject";
/// The baseline's namespace (covered by the webhook once it runs: used only without it).
const PLAIN_NAMESPACE: &str = "bench-plain";
/// The in-process goal, from the issue.
const P99_GOAL: Duration = Duration::from_millis(2);
const SIDECARSETS: usize = 50;
const MATCHING: usize = 3;
/// Longest wait for any one thing (the manager's webhooks, a cache).
const WAIT: Duration = Duration::from_secs(90);
const HASH_ANNOTATION: &str = "kruise.io/sidecarset-hash";
const INJECTED_LIST: &str = "kruise.io/sidecarset-injected-list";

struct Settings {
    requests: usize,
    pods: usize,
    clients: usize,
    rounds: usize,
}

fn main() -> Result<()> {
    if !harness::bench::requested("admission") {
        return Ok(());
    }
    let settings = Settings {
        requests: env_number("REQUESTS", 20000, 1)?,
        pods: env_number("PODS", 500, 1)?,
        clients: env_number("CLIENTS", 8, 1)?,
        rounds: env_number("ROUNDS", 3, 1)?,
    };
    let scratch = tempfile::Builder::new()
        .prefix("kruise-rs-bench-admission-")
        .tempdir()?;
    let manager_log = scratch.path().join("manager.log");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let second = ManagerUnderTest::second()?;
    let result = runtime.block_on(bench(&settings, &manager_log, second.as_ref()));
    if let Err(err) = &result {
        eprintln!("admission failed: {err}");
        if let Some(tail) = tail(
            &[
                manager_log.clone(),
                manager_log.with_extension("stderr.log"),
            ],
            40,
        ) {
            eprintln!("---- last lines of the manager's log ----\n{tail}----");
        }
    }
    // The reflectors of the in-process handlers still run on the runtime: do not wait for them.
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

// --- environment -------------------------------------------------------------------------------

/// The manager with its webhooks on a loopback port of its own, and that port.
fn start_manager(cp: &ControlPlane, log: &Path) -> Result<(ChildGuard, u16)> {
    let addr = free_loopback_port()?;
    let level = std::env::var("MANAGER_RUST_LOG")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "warn".into());
    let child = ChildGuard::spawn(
        Command::new(env!("CARGO_BIN_EXE_kruise-rs"))
            .args(["manager", "--kubeconfig"])
            .arg(cp.kubeconfig())
            .args(["--probe-addr", "127.0.0.1:0"])
            .args(["--webhook-addr", &addr.to_string()])
            .args(["--webhook-url", &format!("https://{addr}")])
            .args(["--namespace", MANAGER_NAMESPACE])
            .args(harness::bench::manager_args())
            .env("RUST_LOG", level)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(log)?)
            .stderr(std::fs::File::create(log.with_extension("stderr.log"))?),
    )?;
    Ok((child, addr.port()))
}

/// The client-side ports of the TCP connections (any state, TIME_WAIT included: it lasts a
/// minute) to or from loopback port `port`, from `/proc/net/tcp`.
fn connections(port: u16) -> HashSet<u16> {
    let mut peers = HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let port_of = |field: Option<&&str>| {
                field
                    .and_then(|a| a.rsplit_once(':'))
                    .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
            };
            let (Some(local), Some(remote), Some(state)) = (
                port_of(fields.get(1)),
                port_of(fields.get(2)),
                fields.get(3),
            ) else {
                continue;
            };
            // 0A: listening.
            if local == port && *state != "0A" {
                peers.insert(remote);
            } else if remote == port {
                peers.insert(local);
            }
        }
    }
    peers
}

/// The machine's and this process's CPU use at one instant.
struct Load {
    machine: Option<MachineCpu>,
    this: Option<(f64, f64)>,
    at: Instant,
}

impl Load {
    fn now() -> Self {
        Self {
            machine: machine_cpu(),
            this: cpu_seconds(std::process::id()),
            at: Instant::now(),
        }
    }
}

/// What else used the machine between two samples.
fn interference(before: &Load, after: &Load) -> String {
    match ((before.machine, before.this), (after.machine, after.this)) {
        ((Some(mb), Some(sb)), (Some(ma), Some(sa))) => {
            let wall = (after.at - before.at).as_secs_f64();
            let others = (ma.busy - mb.busy) - ((sa.0 + sa.1) - (sb.0 + sb.1));
            format!(
                "other processes kept {:.2} CPUs busy on average, {:.1}% of CPU time stolen by the hypervisor",
                others / wall,
                100.0 * (ma.steal - mb.steal) / (ma.total - mb.total).max(f64::EPSILON)
            )
        }
        _ => "machine load unknown".to_owned(),
    }
}

// --- objects -----------------------------------------------------------------------------------

/// The bench pod: two containers, the labels `matching` decides. Pods 3 SidecarSets select carry
/// `mesh.bench/enabled`, `logging.bench/agent` and `team: payments` (the namespace adds
/// `env: prod`); the others carry labels no SidecarSet selects.
fn pod(name: &str, matching: bool) -> Result<Pod> {
    let labels = if matching {
        json!({
            "app": "web", "tier": "frontend", "team": "payments", "version": "v3",
            "mesh.bench/enabled": "true", "logging.bench/agent": "fluent-bit",
            "bench/main-container": "app"
        })
    } else {
        json!({
            "app": "batch-worker", "tier": "jobs", "team": "data", "version": "v7",
            "bench/main-container": "app"
        })
    };
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": "9102",
                "deployment.kubernetes.io/revision": "12"
            }
        },
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": "registry.local/shop/web:3.14.2",
                    "args": ["--listen=:8080", "--config=/etc/web/config.yaml"],
                    "ports": [{"name": "http", "containerPort": 8080}],
                    "env": [
                        {"name": "APP_NAME", "value": "web"},
                        {"name": "LOG_LEVEL", "value": "info"},
                        {"name": "SERVICE_VERSION", "value": "3.14.2"},
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
                    ],
                    "resources": {
                        "requests": {"cpu": "500m", "memory": "512Mi"},
                        "limits": {"cpu": "2", "memory": "1Gi"}
                    },
                    "volumeMounts": [
                        {"name": "config", "mountPath": "/etc/web"},
                        {"name": "logs", "mountPath": "/var/log/web"}
                    ],
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 5},
                    "livenessProbe": {"httpGet": {"path": "/live", "port": 8080}, "periodSeconds": 10}
                },
                {
                    "name": "exporter",
                    "image": "registry.local/shop/exporter:1.8.0",
                    "ports": [{"name": "metrics", "containerPort": 9102}],
                    "env": [{"name": "EXPORTER_PORT", "value": "9102"}],
                    "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
                    "volumeMounts": [{"name": "logs", "mountPath": "/var/log/web", "readOnly": true}]
                }
            ],
            "volumes": [
                {"name": "config", "configMap": {"name": "web-config"}},
                {"name": "logs", "emptyDir": {}}
            ],
            "terminationGracePeriodSeconds": 30,
            "nodeSelector": {"kubernetes.io/os": "linux"}
        }
    }))?)
}

fn sidecarset(value: Value) -> Result<SidecarSet> {
    Ok(serde_json::from_value(value)?)
}

/// 3 SidecarSets selecting the matching bench pod (in `bench-inject`), then 47 that select it
/// not: other labels, near misses, other namespaces, namespace selectors the namespace fails.
fn bench_sidecarsets() -> Result<Vec<SidecarSet>> {
    let mut sets = vec![
        sidecarset(json!({
            "apiVersion": "apps.kruise.io/v1beta1", "kind": "SidecarSet",
            "metadata": {"name": "mesh-proxy"},
            "spec": {
                "selector": {"matchLabels": {"mesh.bench/enabled": "true"}},
                "initContainers": [{
                    "name": "mesh-init",
                    "image": "registry.local/mesh/proxyv2:1.22.0",
                    "args": ["istio-iptables", "-p", "15001", "-z", "15006", "-u", "1337"],
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}
                }],
                "containers": [{
                    "name": "mesh-proxy",
                    "image": "registry.local/mesh/proxyv2:1.22.0",
                    "args": ["proxy", "sidecar", "--domain", "$(POD_NAMESPACE).svc.cluster.local"],
                    "ports": [{"name": "http-envoy-prom", "containerPort": 15090}],
                    "env": [
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                        {"name": "INSTANCE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                        {"name": "PROXY_CONFIG", "value": "{\"holdApplicationUntilProxyStarts\":true}"}
                    ],
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "128Mi"},
                        "limits": {"cpu": "2", "memory": "1Gi"}
                    },
                    "volumeMounts": [
                        {"name": "mesh-certs", "mountPath": "/etc/certs"},
                        {"name": "mesh-envoy", "mountPath": "/etc/istio/proxy"}
                    ],
                    "readinessProbe": {"httpGet": {"path": "/healthz/ready", "port": 15021}},
                    "podInjectPolicy": "BeforeAppContainer",
                    "transferEnv": [{"sourceContainerName": "app", "envName": "SERVICE_VERSION"}]
                }],
                "volumes": [
                    {"name": "mesh-certs", "emptyDir": {"medium": "Memory"}},
                    {"name": "mesh-envoy", "emptyDir": {}},
                    {"name": "mesh-unused", "configMap": {"name": "mesh-extra"}}
                ]
            }
        }))?,
        sidecarset(json!({
            "apiVersion": "apps.kruise.io/v1beta1", "kind": "SidecarSet",
            "metadata": {"name": "log-agent"},
            "spec": {
                "selector": {"matchExpressions": [
                    {"key": "logging.bench/agent", "operator": "In", "values": ["fluent-bit", "vector"]},
                    {"key": "tier", "operator": "NotIn", "values": ["jobs"]}
                ]},
                "containers": [{
                    "name": "log-agent",
                    "image": "registry.local/logging/fluent-bit:3.1.4",
                    "env": [
                        {"name": "FLUENT_HOST", "value": "logs.logging.svc"},
                        {"name": "FLUENT_PORT", "value": "24224"}
                    ],
                    "resources": {"requests": {"cpu": "20m", "memory": "32Mi"}},
                    "volumeMounts": [{"name": "log-agent-config", "mountPath": "/fluent-bit/etc"}],
                    "podInjectPolicy": "AfterAppContainer",
                    "shareVolumePolicy": {"type": "enabled"},
                    "transferEnv": [{"sourceContainerName": "app", "envNames": ["APP_NAME", "LOG_LEVEL"]}]
                }],
                "volumes": [{"name": "log-agent-config", "configMap": {"name": "fluent-bit-config"}}],
                "imagePullSecrets": [{"name": "logging-pull"}]
            }
        }))?,
        sidecarset(json!({
            "apiVersion": "apps.kruise.io/v1beta1", "kind": "SidecarSet",
            "metadata": {"name": "metrics-agent"},
            "spec": {
                "selector": {"matchLabels": {"team": "payments"}},
                "namespaceSelector": {"matchLabels": {"env": "prod"}},
                "containers": [{
                    "name": "metrics-agent",
                    "image": "registry.local/observability/agent:0.41.0",
                    "env": [{"name": "SCRAPE_INTERVAL", "value": "15s"}],
                    "resources": {"requests": {"cpu": "10m", "memory": "24Mi"}},
                    "volumeMounts": [{"name": "metrics-agent-state", "mountPath": "/var/lib/agent"}],
                    "transferEnv": [{
                        "sourceContainerNameFrom": {"fieldRef": {"fieldPath": "metadata.labels['bench/main-container']"}},
                        "envName": "POD_IP"
                    }]
                }],
                "volumes": [{"name": "metrics-agent-state", "emptyDir": {"sizeLimit": "64Mi"}}]
            }
        }))?,
    ];
    for i in 0..SIDECARSETS - MATCHING {
        let name = format!("agent-{i:02}");
        let (selector, scope) = match i % 5 {
            // Another app.
            0 => (
                json!({"matchLabels": {"app": format!("svc-{i}")}}),
                json!({}),
            ),
            // Another tier.
            1 => (
                json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": [format!("backend-{i}"), format!("batch-{i}")]}]}),
                json!({}),
            ),
            // The matching pod's labels, another namespace (by its name label: v1beta1 has no
            // `spec.namespace` upstream, whose schema would drop it and select every namespace).
            2 => (
                json!({"matchLabels": {"mesh.bench/enabled": "true"}}),
                json!({"namespaceSelector": {"matchLabels": {
                    "kubernetes.io/metadata.name": format!("team-{i}")
                }}}),
            ),
            // The matching pod's team, a namespace selector `bench-inject` fails.
            3 => (
                json!({"matchLabels": {"team": "payments"}}),
                json!({"namespaceSelector": {"matchLabels": {"env": format!("staging-{i}")}}}),
            ),
            // A near miss: one label more than the pod has.
            _ => (
                json!({"matchLabels": {"app": "web", "canary.bench/track": format!("v{i}")}}),
                json!({}),
            ),
        };
        let mut spec = json!({
            "selector": selector,
            "containers": [{
                "name": format!("{name}-sidecar"),
                "image": format!("registry.local/agents/{name}:1.{i}.0"),
                "env": [
                    {"name": "AGENT_ID", "value": name.clone()},
                    {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
                ],
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                "volumeMounts": [{"name": format!("{name}-data"), "mountPath": "/var/lib/agent"}],
                "transferEnv": [{"sourceContainerName": "app", "envName": "APP_NAME"}]
            }],
            "volumes": [{"name": format!("{name}-data"), "emptyDir": {}}]
        });
        if i % 3 == 0 {
            spec["initContainers"] = json!([{
                "name": format!("{name}-init"),
                "image": format!("registry.local/agents/{name}-init:1.{i}.0"),
                "command": ["sh", "-c", "true"]
            }]);
        }
        if let (Some(spec), Some(scope)) = (spec.as_object_mut(), scope.as_object()) {
            spec.extend(scope.clone());
        }
        sets.push(sidecarset(json!({
            "apiVersion": "apps.kruise.io/v1beta1", "kind": "SidecarSet",
            "metadata": {"name": name},
            "spec": spec
        }))?);
    }
    Ok(sets)
}

/// The SidecarSets whose names the pod's injected-list annotation holds.
fn injected_sets(pod: &Pod) -> usize {
    pod.annotations()
        .get(INJECTED_LIST)
        .map_or(0, |list| list.split(',').filter(|s| !s.is_empty()).count())
}

// --- in-process --------------------------------------------------------------------------------

/// The AdmissionReview the apiserver sends for creating `pod` in `namespace`.
fn review_body(pod: &Pod, namespace: &str, uid: &str) -> Result<Vec<u8>> {
    let mut object = serde_json::to_value(pod)?;
    object["metadata"]["namespace"] = json!(namespace);
    let name = pod.name_any();
    Ok(serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": name,
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "uid": "5d4c1f0e-3b0a-4b7e-9a51-0f7b1e1c2a90",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]
            },
            "object": object,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    }))?)
}

/// The pod exactly as a mutating webhook receives it: the apiserver's defaulted object from a
/// dry-run create (where no webhook is registered), without what is only set after admission.
async fn defaulted_pod(client: &Client, matching: bool, name: &str) -> Result<Pod> {
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let mut pod = Api::<Pod>::namespaced(client.clone(), PLAIN_NAMESPACE)
        .create(&params, &pod(name, matching)?)
        .await?;
    pod.metadata.uid = None;
    pod.metadata.creation_timestamp = None;
    pod.metadata.resource_version = None;
    pod.metadata.namespace = None;
    pod.status = None;
    Ok(pod)
}

struct Stats {
    n: usize,
    total: Duration,
    p50: Duration,
    p90: Duration,
    p99: Duration,
    max: Duration,
}

fn stats(mut samples: Vec<Duration>) -> Stats {
    samples.sort_unstable();
    let n = samples.len();
    let at = |q: f64| samples[((q * n as f64).ceil() as usize).clamp(1, n) - 1];
    Stats {
        n,
        total: samples.iter().sum(),
        p50: at(0.50),
        p90: at(0.90),
        p99: at(0.99),
        max: samples[n - 1],
    }
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

impl Stats {
    fn line(&self) -> String {
        format!(
            "p50 {}, p90 {}, p99 {}, max {}; {:.0} req/s on one thread",
            us(self.p50),
            us(self.p90),
            us(self.p99),
            us(self.max),
            self.n as f64 / self.total.as_secs_f64()
        )
    }
}

/// The body of `review`'s answer, decoded.
async fn answer(response: axum::response::Response) -> Result<Value> {
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await?;
    Ok(serde_json::from_slice(&bytes)?)
}

/// How many operations the answer's JSON Patch has (0 for a plain allow); an error for a denial.
fn patch_ops(answer: &Value) -> Result<usize> {
    use base64::Engine as _;
    let response = &answer["response"];
    if response["allowed"] != json!(true) {
        return Err(format!("the webhook refused the pod: {}", response["status"]).into());
    }
    let Some(patch) = response["patch"].as_str() else {
        return Ok(0);
    };
    let bytes = base64::engine::general_purpose::STANDARD.decode(patch)?;
    let ops: Vec<Value> = serde_json::from_slice(&bytes)?;
    Ok(ops.len())
}

/// The p99 of each quarter of `samples` (in the order they were taken): how steady the figure is.
fn quarter_p99s(samples: &[Duration]) -> String {
    let quarter = samples.len().div_ceil(4).max(1);
    samples
        .chunks(quarter)
        .map(|c| us(stats(c.to_vec()).p99))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The stages of one request as `review()` and the handler run them (the same calls, in the same
/// order), each timed; the drops at the end are a stage of their own.
const STAGES: [&str; 8] = [
    "decode AdmissionReview",
    "object to Pod (to_value + from_value)",
    "the 50 cached SidecarSets (Store::state)",
    "plan_for_new_pod",
    "inject",
    "pod_patch",
    "encode answer",
    "drop the pod, plan and answer",
];

/// One request driven stage by stage: the time of each stage of [`STAGES`] it reached.
fn stages_once(
    body: &[u8],
    cache: &[Arc<SidecarSet>],
    namespace_labels: &BTreeMap<String, String>,
) -> Result<[Option<Duration>; STAGES.len()]> {
    let mut laps = [None; STAGES.len()];
    let mut t = Instant::now();
    let mut lap = |stage: usize| {
        let now = Instant::now();
        laps[stage] = Some(now - t);
        t = now;
    };
    let review: AdmissionReview<DynamicObject> = serde_json::from_slice(body)?;
    let request: AdmissionRequest<DynamicObject> = review.try_into()?;
    lap(0);
    let object = request.object.as_ref().ok_or("no object")?;
    let mut pod: Pod = serde_json::from_value(serde_json::to_value(object)?)?;
    if pod.metadata.namespace.is_none() {
        pod.metadata.namespace = request.namespace.clone();
    }
    lap(1);
    // What `Store::state()` hands the handler: the cached objects behind `Arc`s, not copies.
    let candidates: Vec<Arc<SidecarSet>> = cache.to_vec();
    lap(2);
    let plan = sidecar::plan_for_new_pod(
        candidates.iter().map(|set| set.as_ref()),
        &pod,
        namespace_labels,
        |_| &[],
        || 0.5,
    )?;
    lap(3);
    let (verdict, injected) = if plan.is_empty() {
        (Verdict::Allow, None)
    } else {
        let injection = sidecar::inject(&pod, &plan, Time(Timestamp::now()))?;
        lap(4);
        let patch = sidecar::pod_patch(&pod, &injection.pod)?;
        lap(5);
        (
            Verdict::Patch(patch, injection.warnings),
            Some(injection.pod),
        )
    };
    let encoded = serde_json::to_vec(&server::response(&request.uid, &verdict))?;
    lap(6);
    drop(std::hint::black_box(encoded));
    drop(verdict);
    drop(injected);
    drop(plan);
    drop(candidates);
    drop(pod);
    drop(request);
    lap(7);
    Ok(laps)
}

/// Samples of one pod kind: `review()`, `Handlers::admit()` alone, each stage, the pure path.
struct Measured {
    review: Vec<Duration>,
    admit: Vec<Duration>,
    stages: Vec<Vec<Duration>>,
    pure: Vec<Duration>,
    /// When the `review()` samples began, and what else used the machine while they were taken.
    load: Load,
    load_text: String,
}

/// `requests` calls (after a warm-up) of `review(handlers, "/mutate-pod", body)` back to back,
/// with what else used the machine meanwhile; then `requests` rounds of one `Handlers::admit`
/// (the request decoded beforehand) and one request stage by stage, interleaved so that both see
/// the same machine (other processes, caches, allocator state).
async fn measure_in_process(
    handlers: &Handlers,
    body: &[u8],
    cache: &[Arc<SidecarSet>],
    namespace_labels: &BTreeMap<String, String>,
    requests: usize,
) -> Result<Measured> {
    let review: AdmissionReview<DynamicObject> = serde_json::from_slice(body)?;
    let request: AdmissionRequest<DynamicObject> = review.try_into()?;
    let mut m = Measured {
        review: Vec::with_capacity(requests),
        admit: Vec::with_capacity(requests),
        stages: vec![Vec::with_capacity(requests); STAGES.len()],
        pure: Vec::with_capacity(requests),
        load: Load::now(),
        load_text: String::new(),
    };
    let warm_up = requests.min(1000);
    for i in 0..warm_up + requests {
        if i == warm_up {
            m.load = Load::now();
        }
        let t = Instant::now();
        let response = server::review(handlers, "/mutate-pod", body, &deadline()).await;
        std::hint::black_box(response);
        if i >= warm_up {
            m.review.push(t.elapsed());
        }
    }
    m.load_text = interference(&m.load, &Load::now());
    for i in 0..warm_up + requests {
        let t = Instant::now();
        let verdict = handlers.admit("/mutate-pod", &request).await;
        std::hint::black_box(verdict);
        let admit = t.elapsed();
        let laps = stages_once(body, cache, namespace_labels)?;
        if i < warm_up {
            continue;
        }
        m.admit.push(admit);
        for (stage, lap) in laps.iter().enumerate() {
            if let Some(lap) = lap {
                m.stages[stage].push(*lap);
            }
        }
        m.pure.push(laps[3..6].iter().flatten().sum());
    }
    Ok(m)
}

/// `requests` reviews spread over `tasks` tasks of the multi-threaded runtime: requests per second.
/// `n` metadata lists of every SidecarSet from the apiserver's cache, one after another, as the
/// pod webhook sends one when its fence is not a version its cache is known to hold.
async fn sidecarset_lists(client: &Client, n: usize) -> Result<Stats> {
    let api = Api::<SidecarSet>::all(client.clone());
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        api.list_metadata(&ListParams::default().match_any())
            .await?;
        samples.push(t.elapsed());
    }
    Ok(stats(samples))
}

/// `n` fences, one after another, as the pod webhook sends one per admission: a metadata list
/// from the apiserver's cache selecting a name no SidecarSet can have.
async fn sidecarset_fences(client: &Client, n: usize) -> Result<Stats> {
    let api = Api::<SidecarSet>::all(client.clone());
    let params = ListParams::default()
        .match_any()
        .fields("metadata.name=kruise-rs..fence");
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        api.list_metadata(&params).await?;
        samples.push(t.elapsed());
    }
    Ok(stats(samples))
}

async fn parallel_throughput(
    handlers: &Arc<Handlers>,
    body: &Arc<Vec<u8>>,
    requests: usize,
    tasks: usize,
) -> Result<f64> {
    let t = Instant::now();
    let mut joins = Vec::new();
    for _ in 0..tasks {
        let (handlers, body) = (handlers.clone(), body.clone());
        let share = requests / tasks;
        joins.push(tokio::spawn(async move {
            for _ in 0..share {
                std::hint::black_box(
                    server::review(&*handlers, "/mutate-pod", &body, &deadline()).await,
                );
            }
        }));
    }
    for join in joins {
        join.await?;
    }
    Ok((requests / tasks * tasks) as f64 / t.elapsed().as_secs_f64())
}

struct InProcess {
    /// The matching pod as the webhook's patch leaves it.
    injected_pod: Pod,
    matching_p99: Duration,
    matching_p50: Duration,
    none_p99: Duration,
    none_p50: Duration,
    pure_p50: Duration,
}

async fn in_process(client: &Client, requests: usize) -> Result<InProcess> {
    println!(
        "in-process /mutate-pod with {SIDECARSETS} SidecarSets ({requests} requests per pod kind: \
         review() back to back, then admit() and the stages interleaved)"
    );
    let matching_pod = defaulted_pod(client, true, "web-7d9f8b6c5-x2k4q").await?;
    let other_pod = defaulted_pod(client, false, "batch-worker-5c8d7-q9z2m").await?;
    let matching_body = review_body(
        &matching_pod,
        INJECT_NAMESPACE,
        "0f5b7c9e-1a2b-4c3d-8e9f-a0b1c2d3e4f5",
    )?;
    let other_body = review_body(
        &other_pod,
        INJECT_NAMESPACE,
        "7a6b5c4d-3e2f-4a1b-9c8d-7e6f5a4b3c2d",
    )?;
    println!(
        "  AdmissionReview bodies: {} bytes (pod 3 SidecarSets select), {} bytes (pod none selects)",
        matching_body.len(),
        other_body.len()
    );

    let (handlers, caches) = Handlers::new(client.clone(), MANAGER_NAMESPACE);
    tokio::spawn(caches);
    // The SidecarSets all exist before the caches list, so the first answer that is not a
    // "starting" denial sees every one of them; it must inject exactly the 3 selecting ones.
    let t = Instant::now();
    let first = loop {
        let response = server::review(&*handlers, "/mutate-pod", &matching_body, &deadline()).await;
        let first = answer(response).await?;
        match patch_ops(&first) {
            Ok(_) => break first,
            Err(e) if t.elapsed() > WAIT => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let ops = patch_ops(&first)?;
    let (injected_pod, injected) = {
        use base64::Engine as _;
        let patch = first["response"]["patch"].as_str().unwrap_or_default();
        let patch = base64::engine::general_purpose::STANDARD.decode(patch)?;
        let bytes = patch.len();
        let ops: json_patch::Patch = serde_json::from_slice(&patch)?;
        let mut pod = serde_json::to_value(&matching_pod)?;
        json_patch::patch(&mut pod, &ops.0)?;
        let pod: Pod = serde_json::from_value(pod)?;
        let spec = pod.spec.clone().unwrap_or_default();
        let described = format!(
            "{bytes} bytes; {} SidecarSets injected, {} containers and {} init containers after it",
            injected_sets(&pod),
            spec.containers.len(),
            spec.init_containers.map_or(0, |c| c.len())
        );
        (pod, described)
    };
    let none_ops = patch_ops(
        &answer(server::review(&*handlers, "/mutate-pod", &other_body, &deadline()).await).await?,
    )?;
    println!(
        "  caches synced after {:.2} s; pod 3 select: {ops}-operation patch ({injected}); pod none selects: {}",
        t.elapsed().as_secs_f64(),
        if none_ops == 0 {
            "allowed unchanged".to_owned()
        } else {
            format!("{none_ops}-operation patch (unexpected)")
        }
    );

    // The same cache contents and namespace labels the handler reads.
    let cache: Vec<Arc<SidecarSet>> = Api::<SidecarSet>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(Arc::new)
        .collect();
    let namespace_labels = Api::<Namespace>::all(client.clone())
        .get(INJECT_NAMESPACE)
        .await?
        .metadata
        .labels
        .unwrap_or_default();

    let mut results = Vec::new();
    for (what, body) in [
        ("pod 3 SidecarSets select", &matching_body),
        ("pod no SidecarSet selects", &other_body),
    ] {
        let m = measure_in_process(&handlers, body, &cache, &namespace_labels, requests).await?;
        let load = &m.load_text;
        let quarters = quarter_p99s(&m.review);
        let review = stats(m.review);
        println!("  review(), {what}: {}", review.line());
        println!("    p99 of each quarter of the requests: {quarters}");
        println!("    meanwhile {load}");
        let admit = stats(m.admit);
        println!(
            "    Handlers::admit() alone (request decoded beforehand, answer not encoded): {}",
            admit.line()
        );
        let pure = stats(m.pure);
        println!(
            "    pure path (plan_for_new_pod + inject + pod_patch): {}",
            pure.line()
        );
        let stages = m.stages;
        let mut sum = Duration::ZERO;
        // The stages `Handlers::admit` runs: all but decoding the review and encoding the answer.
        let mut in_admit = Duration::ZERO;
        let mut pod_patch = None;
        let mut breakdown = Vec::new();
        for (i, (stage, samples)) in STAGES.iter().zip(stages).enumerate() {
            if samples.is_empty() {
                continue;
            }
            let s = stats(samples);
            sum += s.p50;
            if i != 0 && i != 6 {
                in_admit += s.p50;
            }
            if i == 5 {
                pod_patch = Some(s.p50);
            }
            breakdown.push(format!("{stage} {} (p99 {})", us(s.p50), us(s.p99)));
        }
        println!("    stages at p50: {}", breakdown.join(", "));
        println!(
            "    sum of stage medians {} = {:.0}% of review()'s p50 (pure path {:.0}%); \
             the handler's stages {} = {:.0}% of admit()'s p50",
            us(sum),
            100.0 * sum.as_secs_f64() / review.p50.as_secs_f64(),
            100.0 * pure.p50.as_secs_f64() / review.p50.as_secs_f64(),
            us(in_admit),
            100.0 * in_admit.as_secs_f64() / admit.p50.as_secs_f64(),
        );
        // Before injecting, the handler confirms its SidecarSet cache against the apiserver's: a
        // fence (decision 0044), and a metadata list of every SidecarSet only when the fence is
        // not a version the cache is known to hold (decision 0031). Each timed here on its own,
        // through the same client.
        let fence = sidecarset_fences(client, 200).await?;
        let list = sidecarset_lists(client, 200).await?;
        let (fenced, caught_up, listed) = handlers.sidecarset_confirmations();
        println!(
            "    cache confirmation, one per request sent one after another: the fence (the \
             apiserver cache's version) p50 {}, p99 {}; a metadata list of every SidecarSet p50 \
             {}, p99 {}; so far the handler confirmed by the fence {fenced} times, by its watch \
             catching up {caught_up}, by a list {listed}",
            us(fence.p50),
            us(fence.p99),
            us(list.p50),
            us(list.p99)
        );
        // The handler builds its patch with its own (private) `preserving_patch`, which keeps the
        // fields the typed Pod does not know and sets each changed field whole; what admit()
        // takes beyond its other stages and the fence is that.
        if let Some(pod_patch) = pod_patch {
            let rest = admit
                .p50
                .saturating_sub(in_admit.saturating_sub(pod_patch))
                .saturating_sub(fence.p50);
            println!(
                "    admit()'s p50 less its other stages and the fence's p50: {} for the handler's \
                 patch step (preserving_patch.rs, private: one operation per changed field), against \
                 {} for pod_patch (a field-by-field diff)",
                us(rest),
                us(pod_patch)
            );
        }
        results.push((review, pure));
    }

    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let tasks = threads * 2;
    let body = Arc::new(matching_body);
    let rate = parallel_throughput(&handlers, &body, requests, tasks).await?;
    println!(
        "  review(), pod 3 select, {tasks} tasks on {threads} threads: {rate:.0} req/s ({:.2}x one thread)",
        rate * results[0].0.total.as_secs_f64() / results[0].0.n as f64
    );
    Ok(InProcess {
        injected_pod,
        matching_p99: results[0].0.p99,
        matching_p50: results[0].0.p50,
        none_p99: results[1].0.p99,
        none_p50: results[1].0.p50,
        pure_p50: results[0].1.p50,
    })
}

// --- through the apiserver ---------------------------------------------------------------------

/// The apiserver's own `apiserver_admission_webhook_admission_duration_seconds` sum and count
/// for mutating webhooks on CREATE: while a run creates pods, its pod webhook's calls (by type
/// and operation, not by name, so that a second manager's webhook counts the same way).
async fn webhook_calls(client: &Client) -> Result<(f64, f64)> {
    const METRIC: &str = "apiserver_admission_webhook_admission_duration_seconds";
    let mut figures = [0.0; 2];
    for (figure, suffix) in figures.iter_mut().zip(["_sum", "_count"]) {
        *figure = apiserver_metric(client, &format!("{METRIC}{suffix}"))
            .await?
            .iter()
            .filter(|(labels, _)| {
                labels.contains("type=\"admit\"") && labels.contains("operation=\"CREATE\"")
            })
            .map(|(_, value)| value)
            .sum();
    }
    Ok((figures[0], figures[1]))
}

/// Processes whose CPU time is reported per pod.
struct Watched {
    names: Vec<(&'static str, u32)>,
}

impl Watched {
    fn sample(&self) -> Vec<Option<(f64, f64)>> {
        self.names
            .iter()
            .map(|(_, pid)| cpu_seconds(*pid))
            .collect()
    }
}

/// A run's median pods/s at one client count.
#[derive(Clone)]
struct Phase {
    label: &'static str,
    clients: usize,
    rate: f64,
    /// The webhook's mean call time as the apiserver saw it, when it was called.
    call_ms: Option<f64>,
    /// The manager's CPU milliseconds per pod, when it ran.
    manager_ms: Option<f64>,
}

/// One kind of pod creation run: where, which pod, and what the answers should carry.
struct Run {
    label: &'static str,
    namespace: &'static str,
    /// Pod names are `<prefix>-r<round>-c<clients>-<i>`.
    prefix: &'static str,
    /// The pod to create (its name is replaced).
    template: Pod,
    /// SidecarSets each created pod should come back with.
    want_injected: usize,
}

/// What every run needs.
struct Env<'a> {
    client: &'a Client,
    /// The manager's webhook port, while it runs.
    webhook_port: Option<u16>,
    cp: &'a ControlPlane,
    watched: &'a Watched,
    settings: &'a Settings,
}

/// One timed creation of PODS pods.
struct Sample {
    took: Duration,
    /// CPU seconds the machine spent on anything but the watched processes.
    unrelated: Option<f64>,
    /// Pods that came back with the SidecarSets they should have.
    as_wanted: usize,
    /// CPU seconds (user, system) of each watched process.
    cpu: Vec<Option<(f64, f64)>>,
    /// Pod webhook calls, and their total duration, by the apiserver's metrics.
    calls: f64,
    call_seconds: f64,
    /// TCP connections to the webhook opened meanwhile, and seen at the end.
    new_connections: usize,
    connections: usize,
}

/// Creates PODS pods for `run` with `clients` clients at once (each its own connection, one
/// request at a time).
async fn measure(env: &Env<'_>, run: &Run, clients: usize, round: usize) -> Result<Sample> {
    let count = env.settings.pods;
    let mut workers = Vec::new();
    for _ in 0..clients {
        workers.push(Api::<Pod>::namespaced(
            env.cp.client().await?,
            run.namespace,
        ));
    }
    // One request per client first, so connection set-up is not timed.
    for api in &workers {
        api.list(&ListParams::default().limit(1)).await?;
    }
    let prefix = format!("{}-r{round}-c{clients}", run.prefix);
    let before_machine = machine_cpu();
    let before_cpu = env.watched.sample();
    let before_calls = webhook_calls(env.client).await?;
    let before_connections = env.webhook_port.map(connections);
    let t = Instant::now();
    let results = futures::stream::iter(workers.into_iter().enumerate())
        .map(|(w, api)| {
            let prefix = &prefix;
            async move {
                let mut as_wanted = 0;
                for i in (w..count).step_by(clients) {
                    let mut pod = run.template.clone();
                    pod.metadata.name = Some(format!("{prefix}-{i:05}"));
                    let created = api.create(&PostParams::default(), &pod).await?;
                    if injected_sets(&created) == run.want_injected {
                        as_wanted += 1;
                    }
                }
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(as_wanted)
            }
        })
        .buffer_unordered(clients)
        .try_collect::<Vec<_>>()
        .await?;
    let took = t.elapsed();
    let after_cpu = env.watched.sample();
    let after_machine = machine_cpu();
    let watched: Option<f64> = before_cpu
        .iter()
        .zip(&after_cpu)
        .map(|(b, a)| Some((a.as_ref()?.0 + a.as_ref()?.1) - (b.as_ref()?.0 + b.as_ref()?.1)))
        .sum();
    let unrelated = match (before_machine, after_machine, watched) {
        (Some(b), Some(a), Some(w)) => Some(((a.busy - b.busy) - w).max(0.0)),
        _ => None,
    };
    let after_calls = webhook_calls(env.client).await?;
    let (new_connections, connections) = match (env.webhook_port, before_connections) {
        (Some(port), Some(before)) => {
            let after = connections(port);
            (after.difference(&before).count(), after.len())
        }
        _ => (0, 0),
    };
    // Back to the same number of pods for the next run: an unscheduled pod goes at once.
    let pods = Api::<Pod>::namespaced(env.client.clone(), run.namespace);
    pods.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    while !pods
        .list_metadata(&ListParams::default().limit(1))
        .await?
        .items
        .is_empty()
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Let the watchers (the manager's pod cache) take the deletions in.
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(Sample {
        took,
        unrelated,
        as_wanted: results.iter().sum(),
        cpu: before_cpu
            .iter()
            .zip(&after_cpu)
            .map(|(b, a)| {
                let ((bu, bs), (au, as_)) = ((*b)?, (*a)?);
                Some((au - bu, as_ - bs))
            })
            .collect(),
        calls: after_calls.1 - before_calls.1,
        call_seconds: after_calls.0 - before_calls.0,
        new_connections,
        connections,
    })
}

/// ROUNDS rounds of every run in `runs`, each with 1 client then CLIENTS, interleaved (so drift
/// spreads over all of them); then, per run and client count, the median pods/s and the totals,
/// printed with their ratio to `baseline` and appended to `out`.
async fn phases(
    env: &Env<'_>,
    runs: &[Run],
    baseline: Option<&[Phase]>,
    out: &mut Vec<Phase>,
) -> Result<()> {
    let client_counts = [1, env.settings.clients];
    let mut samples: Vec<Vec<Sample>> = (0..runs.len() * client_counts.len())
        .map(|_| Vec::new())
        .collect();
    for round in 0..env.settings.rounds {
        for (r, run) in runs.iter().enumerate() {
            for (c, clients) in client_counts.iter().enumerate() {
                let sample = measure(env, run, *clients, round).await?;
                samples[r * client_counts.len() + c].push(sample);
            }
        }
    }
    for (r, run) in runs.iter().enumerate() {
        for (c, clients) in client_counts.iter().enumerate() {
            let samples = &samples[r * client_counts.len() + c];
            let pods = env.settings.pods;
            let total = pods * samples.len();
            let rates: Vec<f64> = samples
                .iter()
                .map(|s| pods as f64 / s.took.as_secs_f64())
                .collect();
            let (low, high) = rates
                .iter()
                .fold((f64::INFINITY, 0.0f64), |(l, h), r| (l.min(*r), h.max(*r)));
            let rate = median(&rates);
            let ratio = baseline
                .and_then(|b| b.iter().find(|p| p.clients == *clients))
                .map_or(String::new(), |b| {
                    format!(" = {:.2}x baseline", rate / b.rate)
                });
            let calls: f64 = samples.iter().map(|s| s.calls).sum();
            let call_ms = (calls > 0.0)
                .then(|| samples.iter().map(|s| s.call_seconds).sum::<f64>() / calls * 1e3);
            let call_time = match call_ms {
                Some(ms) => format!(
                    "; webhook called {calls:.0} times, {ms:.2} ms mean as the apiserver saw it, \
                     over {} TCP connections ({} new)",
                    samples.iter().map(|s| s.connections).max().unwrap_or(0),
                    samples.iter().map(|s| s.new_connections).sum::<usize>()
                ),
                None => "; webhook not called".to_owned(),
            };
            let per_pod = |v: f64| v * 1e3 / total as f64;
            // CPU seconds (all, system) of each watched process over the samples.
            let used: Vec<Option<(f64, f64)>> = (0..env.watched.names.len())
                .map(|i| {
                    samples.iter().try_fold((0.0, 0.0), |(u, s), sample| {
                        let (du, ds) = sample.cpu.get(i).copied().flatten()?;
                        Some((u + du + ds, s + ds))
                    })
                })
                .collect();
            let cpu: Vec<String> = env
                .watched
                .names
                .iter()
                .zip(&used)
                .map(|((name, _), used)| {
                    used.map_or(format!("{name} ?"), |(all, sys)| {
                        format!("{name} {:.2} (sys {:.2})", per_pod(all), per_pod(sys))
                    })
                })
                .collect();
            let manager_ms = env
                .watched
                .names
                .iter()
                .zip(&used)
                .find(|((name, _), _)| *name == "manager")
                .and_then(|(_, used)| used.map(|(all, _)| per_pod(all)));
            println!(
                "  {}, {clients} client{}: {rate:.0} pods/s{ratio} (median of {} rounds of {pods}; \
                 {low:.0} to {high:.0}){call_time}",
                run.label,
                if *clients == 1 { "" } else { "s" },
                samples.len(),
            );
            let unrelated = samples
                .iter()
                .map(|s| s.unrelated)
                .sum::<Option<f64>>()
                .map_or("unknown".to_owned(), |u| {
                    let wall: f64 = samples.iter().map(|s| s.took.as_secs_f64()).sum();
                    format!("{:.2} CPUs", u / wall)
                });
            println!(
                "    {}/{total} pods came back with {} SidecarSets injected; CPU ms per pod: {}; \
                 anything else on the machine: {unrelated}",
                samples.iter().map(|s| s.as_wanted).sum::<usize>(),
                run.want_injected,
                cpu.join(", ")
            );
            out.push(Phase {
                label: run.label,
                clients: *clients,
                rate,
                call_ms,
                manager_ms,
            });
        }
    }
    Ok(())
}

/// Retries `attempt` until it returns true, up to [`WAIT`]; fails early if the manager exits.
async fn wait_for<F, Fut>(
    what: &str,
    mut manager: Option<&mut ChildGuard>,
    mut attempt: F,
) -> Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let t = Instant::now();
    loop {
        if let Some(manager) = manager.as_deref_mut() {
            manager.check_alive("the manager")?;
        }
        if attempt().await {
            return Ok(t.elapsed());
        }
        if t.elapsed() > WAIT {
            return Err(format!("{what}: not within {} s", WAIT.as_secs()).into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Until a SidecarSet created through the apiserver comes back defaulted (hashed): the manager's
/// SidecarSet webhook is registered and answering. Its time.
async fn wait_for_sidecarset_webhook(
    client: &Client,
    manager: &mut ChildGuard,
) -> Result<Duration> {
    let sidecarsets = Api::<SidecarSet>::all(client.clone());
    let mut probe = 0;
    wait_for("the manager's SidecarSet webhooks", Some(manager), || {
        probe += 1;
        let name = format!("bench-probe-{probe}");
        let sidecarsets = sidecarsets.clone();
        async move {
            let Ok(set) = sidecarset(json!({
                "apiVersion": "apps.kruise.io/v1beta1", "kind": "SidecarSet",
                "metadata": {"name": name},
                "spec": {"selector": {"matchLabels": {"bench-probe": "x"}},
                         "containers": [{"name": "probe", "image": "probe:1"}]}
            })) else {
                return false;
            };
            match sidecarsets.create(&PostParams::default(), &set).await {
                Ok(created) => {
                    let _ = sidecarsets.delete(&name, &DeleteParams::default()).await;
                    created.annotations().contains_key(HASH_ANNOTATION)
                }
                Err(_) => false,
            }
        }
    })
    .await
}

/// Creates the bench's SidecarSets through the webhooks, each checked defaulted.
async fn create_bench_sidecarsets(client: &Client) -> Result<()> {
    let sidecarsets = Api::<SidecarSet>::all(client.clone());
    let t = Instant::now();
    for set in bench_sidecarsets()? {
        let created = sidecarsets.create(&PostParams::default(), &set).await?;
        if !created.annotations().contains_key(HASH_ANNOTATION) {
            return Err(format!("SidecarSet {} was not defaulted", created.name_any()).into());
        }
    }
    println!(
        "{SIDECARSETS} SidecarSets created through the webhooks in {:.2} s ({MATCHING} select the bench pod)",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Until the manager's cache holds the bench's SidecarSets: a matching pod (dry run) gets all 3.
async fn wait_for_sidecarset_cache(client: &Client, manager: &mut ChildGuard) -> Result<()> {
    let pods = Api::<Pod>::namespaced(client.clone(), INJECT_NAMESPACE);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    wait_for("the manager's SidecarSet cache", Some(manager), || {
        let (pods, dry_run) = (pods.clone(), dry_run.clone());
        async move {
            match pod("cache-probe", true) {
                Ok(p) => pods
                    .create(&dry_run, &p)
                    .await
                    .is_ok_and(|p| injected_sets(&p) == MATCHING),
                Err(_) => false,
            }
        }
    })
    .await?;
    Ok(())
}

/// The runs that call the pod webhook: a pod 3 SidecarSets select, and one none selects.
fn called_runs() -> Result<[Run; 2]> {
    Ok([
        Run {
            label: "webhook called, 3 SidecarSets injected",
            namespace: INJECT_NAMESPACE,
            prefix: "inject",
            template: pod("", true)?,
            want_injected: MATCHING,
        },
        Run {
            label: "webhook called, pod selected by none",
            namespace: INJECT_NAMESPACE,
            prefix: "none",
            template: pod("", false)?,
            want_injected: 0,
        },
    ])
}

/// The baseline's run, in a namespace no webhook here is ever called for without a manager.
fn baseline_run(label: &'static str, prefix: &'static str) -> Result<Run> {
    Ok(Run {
        label,
        namespace: PLAIN_NAMESPACE,
        prefix,
        template: pod("", true)?,
        want_injected: 0,
    })
}

/// A fresh control plane with the bench's namespaces and our CRDs, and the processes whose CPU
/// is reported (the apiserver, etcd, this one).
async fn fresh_control_plane() -> Result<(ControlPlane, Client, Watched)> {
    let cp = ControlPlane::start("kruise-rs-bench-cp-")?;
    cp.install_crds(Crds::Generated)?;
    let client = cp.client().await?;
    create_namespace(&client, INJECT_NAMESPACE, &[("env", "prod")]).await?;
    create_namespace(&client, PLAIN_NAMESPACE, &[]).await?;
    let mut watched = Watched { names: Vec::new() };
    for name in ["kube-apiserver", "etcd"] {
        if let Some(pid) = cp.pid(name) {
            watched.names.push((name, pid));
        }
    }
    watched.names.push(("bench", std::process::id()));
    Ok((cp, client, watched))
}

/// The baseline's phases on `cp` (no webhook configuration in place).
async fn measure_baseline(
    cp: &ControlPlane,
    client: &Client,
    watched: &Watched,
    settings: &Settings,
) -> Result<Vec<Phase>> {
    let env = Env {
        client,
        webhook_port: None,
        cp,
        watched,
        settings,
    };
    let mut results = Vec::new();
    let base = baseline_run("baseline (no webhook configuration)", "base")?;
    phases(&env, &[base], None, &mut results).await?;
    Ok(results)
}

/// The side-by-side part for the manager `SECOND_MANAGER` describes, on a fresh control plane:
/// the baseline, then that manager started, the same 50 SidecarSets created through its
/// webhooks, and the runs that call its pod webhook. Its phases, baseline first.
async fn second_manager(settings: &Settings, under_test: &ManagerUnderTest) -> Result<Vec<Phase>> {
    let name = &under_test.name;
    println!("{name}, on a fresh control plane");
    let (cp, client, mut watched) = fresh_control_plane().await?;
    let mut results = measure_baseline(&cp, &client, &watched, settings).await?;
    let baseline = results.clone();
    let mut manager = under_test.spawn(&cp)?;
    let started = async {
        let took = wait_for_sidecarset_webhook(&client, &mut manager.child).await?;
        println!(
            "{name} started, its webhooks answering the apiserver after {:.1} s",
            took.as_secs_f64()
        );
        create_bench_sidecarsets(&client).await?;
        wait_for_sidecarset_cache(&client, &mut manager.child).await
    }
    .await;
    if let Err(e) = started {
        let log = tail(&[manager.log_path()], 40).unwrap_or_default();
        return Err(format!("{name}: {e}; the last lines of its log:\n{log}").into());
    }
    watched.names.push(("manager", manager.pid()));
    let env = Env {
        client: &client,
        webhook_port: manager.ports.get("webhook").copied(),
        cp: &cp,
        watched: &watched,
        settings,
    };
    phases(&env, &called_runs()?, Some(&baseline), &mut results).await?;
    manager.check_alive(name)?;
    Ok(results)
}

/// Ours and the second manager's figures for the runs that call the pod webhook, a row per run
/// and client count, each against its own baseline from its own control plane.
fn print_side_by_side(settings: &Settings, second: &str, ours: &[Phase], theirs: &[Phase]) {
    let find = |phases: &[Phase], label: &str, clients: usize| {
        phases
            .iter()
            .find(|p| p.label == label && p.clients == clients)
            .cloned()
    };
    // Both lists start with their baseline's phases.
    let baseline = |phases: &[Phase], clients| find(phases, phases.first()?.label, clients);
    let opt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2}"));
    println!("side by side: kruise-rs and {second}, each on a control plane of its own");
    println!(
        "  | run | clients | kruise-rs pods/s (x its baseline) | {second} pods/s (x its baseline) \
         | {second} / kruise-rs | apiserver's mean call ms, kruise-rs / {second} \
         | manager CPU ms per pod, kruise-rs / {second} |"
    );
    let labels = match called_runs() {
        Ok(runs) => runs.map(|r| r.label),
        Err(_) => return,
    };
    for label in labels {
        for clients in [1, settings.clients] {
            let (Some(o), Some(t), Some(ob), Some(tb)) = (
                find(ours, label, clients),
                find(theirs, label, clients),
                baseline(ours, clients),
                baseline(theirs, clients),
            ) else {
                println!("  | {label} | {clients} | missing | missing | | | |");
                continue;
            };
            println!(
                "  | {label} | {clients} | {:.0} ({:.2}x) | {:.0} ({:.2}x) | {:.2}x | {} / {} | {} / {} |",
                o.rate,
                o.rate / ob.rate,
                t.rate,
                t.rate / tb.rate,
                t.rate / o.rate,
                opt(o.call_ms),
                opt(t.call_ms),
                opt(o.manager_ms),
                opt(t.manager_ms),
            );
        }
    }
    for clients in [1, settings.clients] {
        if let (Some(ob), Some(tb)) = (baseline(ours, clients), baseline(theirs, clients)) {
            println!(
                "  baseline, {clients} client{}: {:.0} pods/s on kruise-rs's control plane, {:.0} on {second}'s ({:.2}x)",
                if clients == 1 { "" } else { "s" },
                ob.rate,
                tb.rate,
                tb.rate / ob.rate
            );
        }
    }
}

// --- the bench ---------------------------------------------------------------------------------

async fn bench(
    settings: &Settings,
    manager_log: &Path,
    second: Option<&ManagerUnderTest>,
) -> Result<()> {
    println!(
        "command: REQUESTS={} PODS={} CLIENTS={} ROUNDS={} cargo bench --bench admission",
        settings.requests, settings.pods, settings.clients, settings.rounds
    );
    let (cp, client, mut watched) = fresh_control_plane().await?;
    println!(
        "through the apiserver, no manager: {} pods per run, 1 client then {} clients",
        settings.pods, settings.clients
    );
    let mut results = measure_baseline(&cp, &client, &watched, settings).await?;
    let baseline = results.clone();

    // The manager with its webhooks; the SidecarSets go through them (defaulted and hashed).
    let (mut manager, webhook_port) = start_manager(&cp, manager_log)?;
    let took = wait_for_sidecarset_webhook(&client, &mut manager).await?;
    println!(
        "manager started (release binary), its webhooks answering the apiserver after {:.1} s",
        took.as_secs_f64()
    );
    watched.names.push(("manager", manager.id()));
    create_bench_sidecarsets(&client).await?;
    wait_for_sidecarset_cache(&client, &mut manager).await?;
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };

    let inproc = in_process(&client, settings.requests).await?;
    // The same object the webhook makes, created directly: what the pod's size alone costs.
    let mut preinjected = inproc.injected_pod.clone();
    preinjected.metadata.managed_fields = None;
    preinjected.metadata.namespace = None;

    println!(
        "through the apiserver, manager running: {} pods per run, 1 client then {} clients",
        settings.pods, settings.clients
    );
    let env = Env {
        client: &client,
        webhook_port: Some(webhook_port),
        cp: &cp,
        watched: &watched,
        settings,
    };
    let [inject, none] = called_runs()?;
    let runs = [
        Run {
            label: "webhook configured, namespace excluded (not called)",
            namespace: MANAGER_NAMESPACE,
            prefix: "excluded",
            template: pod("", true)?,
            want_injected: 0,
        },
        Run {
            label: "pod created already injected, namespace excluded (not called)",
            namespace: MANAGER_NAMESPACE,
            prefix: "preinjected",
            template: preinjected,
            want_injected: MATCHING,
        },
        inject,
        none,
    ];
    phases(&env, &runs, Some(&baseline), &mut results).await?;
    manager.check_alive("the manager")?;

    // Without the manager and its configurations: the baseline again.
    drop(manager);
    watched.names.retain(|(name, _)| *name != "manager");
    let _ = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .delete(
            "kruise-rs-mutating-webhook-configuration",
            &DeleteParams::default(),
        )
        .await;
    let _ = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .delete(
            "kruise-rs-validating-webhook-configuration",
            &DeleteParams::default(),
        )
        .await;
    let plain = Api::<Pod>::namespaced(client.clone(), PLAIN_NAMESPACE);
    // While the apiserver still has the configuration, the stopped webhook fails pods.
    wait_for(
        "the apiserver dropping the webhook configuration",
        None,
        || {
            let (plain, dry_run) = (plain.clone(), dry_run.clone());
            async move {
                match pod("drop-probe", true) {
                    Ok(p) => plain.create(&dry_run, &p).await.is_ok(),
                    Err(_) => false,
                }
            }
        },
    )
    .await?;
    println!("manager stopped, webhook configurations deleted");
    let env = Env {
        client: &client,
        webhook_port: None,
        cp: &cp,
        watched: &watched,
        settings,
    };
    let again = baseline_run("baseline again (drift check)", "again")?;
    phases(&env, &[again], Some(&baseline), &mut results).await?;

    println!("summary");
    let verdict = |p99: Duration| if p99 <= P99_GOAL { "met" } else { "NOT met" };
    println!(
        "  goal p99 <= {} ms in-process with {SIDECARSETS} SidecarSets: pod 3 select p99 {} ({}, {:.2}x the goal); \
         pod none selects p99 {} ({}, {:.2}x the goal)",
        P99_GOAL.as_millis(),
        us(inproc.matching_p99),
        verdict(inproc.matching_p99),
        inproc.matching_p99.as_secs_f64() / P99_GOAL.as_secs_f64(),
        us(inproc.none_p99),
        verdict(inproc.none_p99),
        inproc.none_p99.as_secs_f64() / P99_GOAL.as_secs_f64(),
    );
    println!(
        "  in-process p50: pod 3 select {} (pure path {}, {:.0}% of it); pod none selects {} ({:.2}x)",
        us(inproc.matching_p50),
        us(inproc.pure_p50),
        100.0 * inproc.pure_p50.as_secs_f64() / inproc.matching_p50.as_secs_f64(),
        us(inproc.none_p50),
        inproc.none_p50.as_secs_f64() / inproc.matching_p50.as_secs_f64(),
    );
    let rate = |label: &str, clients: usize| {
        results
            .iter()
            .find(|p| p.label == label && p.clients == clients)
            .map_or(f64::NAN, |p| p.rate)
    };
    for clients in [1, settings.clients] {
        let excluded = rate(runs[0].label, clients);
        println!(
            "  the webhook call alone (manager running in both), {clients} client{}: pods/s {:.2}x \
             with 3 SidecarSets injected, {:.2}x with none selecting, of the excluded namespace's",
            if clients == 1 { "" } else { "s" },
            rate(runs[2].label, clients) / excluded,
            rate(runs[3].label, clients) / excluded,
        );
        println!(
            "  the webhook call alone, against the same injected pod created directly, {clients} client{}: \
             pods/s {:.2}x; the bigger pod alone: {:.2}x of the excluded namespace's",
            if clients == 1 { "" } else { "s" },
            rate(runs[2].label, clients) / rate(runs[1].label, clients),
            rate(runs[1].label, clients) / excluded,
        );
    }
    for clients in [1, settings.clients] {
        let base = baseline
            .iter()
            .find(|p| p.clients == clients)
            .map_or(f64::NAN, |p| p.rate);
        let rows: Vec<String> = results
            .iter()
            .filter(|p| p.clients == clients)
            .map(|p| format!("{} {:.0}/s ({:.2}x)", p.label, p.rate, p.rate / base))
            .collect();
        println!(
            "  pods/s, {clients} client{}: {}",
            if clients == 1 { "" } else { "s" },
            rows.join("; ")
        );
    }
    if let Some(second) = second {
        // Ours is done with its control plane: stop it before the second's starts.
        drop(cp);
        let theirs = second_manager(settings, second).await?;
        print_side_by_side(settings, &second.name, &results, &theirs);
    }
    Ok(())
}

/// A call's deadline as the server takes it from the apiserver's default `timeout`, made per
/// request as the server makes it.
fn deadline() -> AdmissionDeadline {
    AdmissionDeadline::from_query(Some("timeout=10s"), tokio::time::Instant::now())
}
