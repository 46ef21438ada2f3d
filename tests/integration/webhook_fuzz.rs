//! A property test of sidecar injection against the real apiserver.
//!
//! Several hundred varied pods and SidecarSets are generated from a seed (deterministic; set
//! `KRUISE_FUZZ_SEED` to explore others, `KRUISE_FUZZ_CASES` for more cases). Each SidecarSet is
//! defaulted, hashed and validated as the admission webhooks would (`validate_create`, against
//! the SidecarSets accepted before it in the same case, with this SidecarSet's
//! ControllerRevisions) and by the webhook's dry-run pod (decision 0012: each SidecarSet's
//! `synthetic_pod` judged by the apiserver with `dry_run::judge`, once, before the cases run);
//! only the SidecarSets both accept are used, since the webhook denies the others.
//! Then the pure injection pipeline runs in-process (`plan_for_new_pod` + `inject`). Properties:
//!
//! 1. Nothing panics.
//! 2. The JSON patch the webhook would return turns the pod into the injected pod.
//! 3. Every pod container survives, every container of an injected SidecarSet is in the pod and
//!    marked `IS_INJECTED=true`.
//! 4. The apiserver accepts every injected pod (server-side dry run in a namespace of the shared
//!    cluster, which has no webhooks), every accepted SidecarSet, and, for every accepted
//!    SidecarSet, a pod holding its containers, init containers and volumes (whether or not a
//!    generated pod selected it).
//! 5. A SidecarSet the validator denies on its own (no other SidecarSet around) for pod-spec
//!    reasons only makes such a pod rejected too: the validator is no stricter than Kubernetes.
//!
//! 6. Through the real webhook (a sample, dry-run creates on the webhook cluster): every
//!    SidecarSet it admits yields a pod of its containers and volumes the apiserver admits.
//!
//! To give properties 4 and 5 something to bite on, roughly a third of the SidecarSets carry a
//! deliberate defect (or an odd but valid value) among those the validator documents checking
//! (`crates/api/src/validation/pod_spec.rs`), and some that only the dry-run pod checks (marked
//! "dry run"); the summary line counts how each kind was judged.
//! The pods as generated are dry-run too: the generator must only produce valid pods, or a
//! rejected injected pod would say nothing about injection. Every failure is collected and
//! reported with the JSON to reproduce it, then the test fails.

use std::collections::{BTreeMap, BTreeSet};
use std::panic::{AssertUnwindSafe, catch_unwind};

use futures::{StreamExt, stream};
use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kruise_rs::webhook::dry_run::{self, Outcome as Outcome0012};
use kruise_rs_api::defaults::default_sidecarset;
use kruise_rs_api::sidecarset::SidecarSet;
use kruise_rs_api::validation::sidecarset::{
    KnownRevision, PatchPodMetadataPolicy, SidecarSetContext, validate_create,
};
use kruise_rs_sidecar::hash::{sidecarset_hash, sidecarset_hash_without_image};
use kruise_rs_sidecar::hot_upgrade::{injects_twins, twin_names};
use kruise_rs_sidecar::{InjectionError, inject, plan_for_new_pod, pod_patch};
use kube::api::{Api, PostParams};
use kube::core::ObjectMeta;
use serde_json::{Value, json};

const DEFAULT_SEED: u64 = 0x6b72_7569_7365_2d72;
const DEFAULT_CASES: usize = 400;
/// Dry-run requests in flight at once.
const CONCURRENCY: usize = 16;

const HASH: &str = "kruise.io/sidecarset-hash";
const HASH_WITHOUT_IMAGE: &str = "kruise.io/sidecarset-hash-without-image";
const NAME_LABEL: &str = "kruise.io/sidecarset-name";
const CUSTOM_VERSION_LABEL: &str = "apps.kruise.io/sidecarset-custom-version";

// --- Drawing test inputs ------------------------------------------------------------------------

/// The shapes of random choice the generators below make, drawn from the seeded
/// `fastrand::Rng` of each case.
trait Draw {
    /// True with probability `percent`/100.
    fn chance(&mut self, percent: u64) -> bool;
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T;
    /// Up to `max` distinct items of `items`, in `items`' order.
    fn subset<'a, T>(&mut self, items: &'a [T], max: usize) -> Vec<&'a T>;
}

impl Draw for fastrand::Rng {
    fn chance(&mut self, percent: u64) -> bool {
        self.u64(..100) < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.usize(..items.len())]
    }

    fn subset<'a, T>(&mut self, items: &'a [T], max: usize) -> Vec<&'a T> {
        let mut chosen: BTreeSet<usize> = BTreeSet::new();
        for _ in 0..self.usize(0..=max) {
            chosen.insert(self.usize(..items.len()));
        }
        chosen.into_iter().map(|i| &items[i]).collect()
    }
}

const APP_CONTAINERS: [&str; 4] = ["main", "app", "web", "worker"];
const POD_INIT_CONTAINERS: [&str; 2] = ["setup", "migrate"];
const SIDECARS: [&str; 5] = ["proxy", "logger", "agent", "mesh", "web"];
/// "setup" may replace the pod's init container of that name; "main" clashes with an app
/// container (the pod is then refused).
const SIDECAR_INITS: [&str; 4] = ["init-net", "init-perm", "setup", "main"];
const ENV_NAMES: [&str; 6] = [
    "POD_NAME",
    "OD_NAME",
    "PROXY_IP",
    "LOG_LEVEL",
    "REGION",
    "TOKEN",
];
const POD_VOLUMES: [&str; 5] = ["data", "conf", "logs", "cache", "podinfo"];
const SIDECAR_VOLUMES: [&str; 5] = ["sc-data", "sc-conf", "data", "logs", "sc-token"];
const MOUNT_PATHS: [&str; 6] = [
    "/data",
    "/conf",
    "/logs",
    "/cache",
    "/etc/podinfo",
    "/var/run/sc",
];
const IMAGES: [&str; 5] = [
    "busybox:1.36",
    "nginx:1.25",
    "registry.example.com/team/proxy:v2",
    "ghcr.io/org/agent@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    "localhost:5000/logger",
];
const PORT_NAMES: [&str; 4] = ["http", "metrics", "grpc", "admin"];
const PULL_SECRETS: [&str; 3] = ["regcred", "mirror", "sidecar-pull"];
const SHARED_KEY: &str = "fuzz.kruise.io/shared";
const JSON_KEY: &str = "fuzz.kruise.io/json";

fn env_var(rng: &mut fastrand::Rng, name: &str) -> Value {
    match rng.usize(..5) {
        0 => {
            json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": rng.pick(&["metadata.name", "metadata.namespace", "status.podIP", "metadata.labels['app']"])}}})
        }
        1 => {
            json!({"name": name, "valueFrom": {"configMapKeyRef": {"name": "settings", "key": name.to_lowercase(), "optional": true}}})
        }
        _ => {
            json!({"name": name, "value": format!("{}-{}", name.to_lowercase(), rng.usize(..100))})
        }
    }
}

fn env_list(rng: &mut fastrand::Rng, max: usize) -> Vec<Value> {
    rng.subset(&ENV_NAMES, max)
        .into_iter()
        .map(|n| env_var(rng, n))
        .collect()
}

fn ports(rng: &mut fastrand::Rng) -> Vec<Value> {
    let mut numbers = BTreeSet::new();
    let mut out = Vec::new();
    for name in rng.subset(&PORT_NAMES, 2) {
        let number = [80, 443, 8080, 9090, 15001, 65535][rng.usize(..6)];
        if !numbers.insert(number) {
            continue;
        }
        let mut port = json!({"containerPort": number});
        if rng.chance(70) {
            port["name"] = json!(name);
        }
        if rng.chance(30) {
            port["protocol"] = json!(rng.pick(&["TCP", "UDP"]));
        }
        out.push(port);
    }
    out
}

fn resources(rng: &mut fastrand::Rng) -> Value {
    match rng.usize(..3) {
        0 => json!({"requests": {"cpu": "50m", "memory": "32Mi"}}),
        1 => json!({"requests": {"cpu": "100m"}, "limits": {"cpu": "1", "memory": "256Mi"}}),
        _ => json!({"limits": {"memory": "64Mi"}}),
    }
}

/// A container: name, image, maybe command, env, ports, resources, a probe (when `probes`).
fn container(rng: &mut fastrand::Rng, name: &str, env_max: usize, probes: bool) -> Value {
    let mut c = json!({"name": name, "image": rng.pick(&IMAGES)});
    if rng.chance(60) {
        c["command"] = json!(["/bin/sh", "-c", format!("sleep {}", rng.usize(..1000))]);
    }
    if rng.chance(30) {
        c["args"] = json!(["--flag", rng.usize(..10).to_string()]);
    }
    let env = env_list(rng, env_max);
    if !env.is_empty() {
        c["env"] = json!(env);
    }
    let ports = ports(rng);
    if !ports.is_empty() {
        c["ports"] = json!(ports);
    }
    if rng.chance(40) {
        c["resources"] = resources(rng);
    }
    if rng.chance(20) {
        c["imagePullPolicy"] = json!(rng.pick(&["Always", "IfNotPresent", "Never"]));
    }
    if probes && rng.chance(25) {
        c["readinessProbe"] = json!({"tcpSocket": {"port": 8080}, "periodSeconds": 5});
    }
    c
}

/// Mounts of up to `max` of `volumes` at distinct paths; `subPathExpr`s only name variables the
/// container defines when `env` says so.
fn mounts(rng: &mut fastrand::Rng, volumes: &[String], max: usize, env: &[String]) -> Vec<Value> {
    if volumes.is_empty() {
        return Vec::new();
    }
    let mut paths = BTreeSet::new();
    let mut out = Vec::new();
    for _ in 0..rng.usize(0..=max) {
        let volume = rng.pick(volumes).clone();
        let path = (*rng.pick(&MOUNT_PATHS)).to_owned();
        if !paths.insert(path.clone()) {
            continue;
        }
        let mut mount = json!({"name": volume, "mountPath": path});
        match rng.usize(..6) {
            0 => mount["readOnly"] = json!(true),
            1 => mount["subPath"] = json!("sub"),
            2 if !env.is_empty() => {
                let var = rng.pick(env);
                mount["subPathExpr"] = json!(format!("x/$({var})/y"));
            }
            _ => {}
        }
        out.push(mount);
    }
    out
}

/// A volume named `name`; mostly of the kind that name always gets, so that SidecarSets (and
/// pods) defining the same name often agree, as the validator requires of overlapping ones.
fn volume(rng: &mut fastrand::Rng, name: &str) -> Value {
    let usual = name.bytes().map(usize::from).sum::<usize>() % 8;
    let kind = if rng.chance(80) {
        usual
    } else {
        rng.usize(..8)
    };
    match kind {
        0 => json!({"name": name, "emptyDir": {}}),
        1 => json!({"name": name, "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}}),
        2 => {
            json!({"name": name, "configMap": {"name": format!("{name}-cm"), "optional": true, "items": [{"key": "a", "path": "a.conf"}]}})
        }
        3 => {
            json!({"name": name, "secret": {"secretName": format!("{name}-secret"), "defaultMode": 0o400}})
        }
        4 => json!({"name": name, "downwardAPI": {"items": [
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
        ]}}),
        5 => json!({"name": name, "projected": {"sources": [
            {"configMap": {"name": "proj-cm", "optional": true}},
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
            {"downwardAPI": {"items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}},
        ]}}),
        6 => {
            json!({"name": name, "hostPath": {"path": format!("/var/lib/{name}"), "type": "DirectoryOrCreate"}})
        }
        _ => json!({"name": name, "persistentVolumeClaim": {"claimName": format!("{name}-pvc")}}),
    }
}

fn env_names(container: &Value) -> Vec<String> {
    container["env"]
        .as_array()
        .map(|env| {
            env.iter()
                .filter_map(|e| e["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// A pod in `namespace`, labelled `app: fuzz` mostly.
fn generate_pod(rng: &mut fastrand::Rng, index: usize, namespace: &str) -> Value {
    let volume_names: Vec<String> = rng
        .subset(&POD_VOLUMES, 3)
        .into_iter()
        .map(|s| (*s).to_owned())
        .collect();
    let volumes: Vec<Value> = volume_names.iter().map(|n| volume(rng, n)).collect();
    let container_names = rng.subset(&APP_CONTAINERS, 3);
    let container_names = if container_names.is_empty() {
        vec![&APP_CONTAINERS[0]]
    } else {
        container_names
    };
    let mut containers = Vec::new();
    for name in container_names {
        let mut c = container(rng, name, 4, true);
        let env = env_names(&c);
        let m = mounts(rng, &volume_names, 3, &env);
        if !m.is_empty() {
            c["volumeMounts"] = json!(m);
        }
        containers.push(c);
    }
    let mut labels = BTreeMap::new();
    if rng.chance(90) {
        labels.insert("app", json!("fuzz"));
    }
    if rng.chance(60) {
        labels.insert("tier", json!(rng.pick(&["a", "b"])));
    }
    if rng.chance(50) {
        labels.insert("biz", json!(rng.pick(&APP_CONTAINERS)));
    }
    let mut annotations = BTreeMap::new();
    if rng.chance(30) {
        annotations.insert(
            "biz".to_owned(),
            json!(rng.pick(&[APP_CONTAINERS[0], APP_CONTAINERS[1], "missing"])),
        );
    }
    if rng.chance(30) {
        annotations.insert(SHARED_KEY.to_owned(), json!("pod-value"));
    }
    if rng.chance(30) {
        // Mostly JSON; rarely text a MergePatchJson cannot merge into (the pod is then denied).
        let value = if rng.chance(90) {
            r#"{"pod":{"a":1}}"#
        } else {
            "not json"
        };
        annotations.insert(JSON_KEY.to_owned(), json!(value));
    }
    if rng.chance(2) {
        // Unreadable: the webhook refuses the pod rather than overwrite it.
        annotations.insert(HASH.to_owned(), json!("not json"));
    } else if rng.chance(5) {
        // As if copied from an injected pod's template.
        annotations.insert(
            HASH.to_owned(),
            json!(
                r#"{"elsewhere":{"updateTimestamp":"2024-01-01T00:00:00Z","hash":"h","sidecarSetName":"elsewhere","sidecarList":["x"],"controllerRevision":"elsewhere-1"}}"#
            ),
        );
        annotations.insert(
            "kruise.io/sidecarset-injected-list".to_owned(),
            json!("elsewhere"),
        );
    }
    // What ServiceAccount admission (off on the test control plane) would set; projected
    // service account tokens need it.
    let mut spec = json!({"containers": containers, "serviceAccountName": "default"});
    if !volumes.is_empty() {
        spec["volumes"] = json!(volumes);
    }
    let mut init = Vec::new();
    for name in rng.subset(&POD_INIT_CONTAINERS, 2) {
        let native = rng.chance(30);
        let mut c = container(rng, name, 2, native);
        if native {
            c["restartPolicy"] = json!("Always");
        }
        if rng.chance(30) {
            let m = mounts(rng, &volume_names, 1, &[]);
            if !m.is_empty() {
                c["volumeMounts"] = json!(m);
            }
        }
        init.push(c);
    }
    if !init.is_empty() {
        spec["initContainers"] = json!(init);
    }
    let secrets = rng.subset(&PULL_SECRETS[..2], 2);
    if !secrets.is_empty() {
        spec["imagePullSecrets"] = json!(
            secrets
                .iter()
                .map(|s| json!({"name": s}))
                .collect::<Vec<_>>()
        );
    }
    if rng.chance(30) {
        spec["restartPolicy"] = json!(rng.pick(&["Always", "OnFailure", "Never"]));
    }
    if rng.chance(20) {
        spec["terminationGracePeriodSeconds"] = json!(rng.usize(..60));
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": format!("fuzz-{index}"),
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec,
    })
}

/// A sidecar container (or init container, `init`), named `name`, mounting some of `volumes`.
fn sidecar(
    rng: &mut fastrand::Rng,
    name: &str,
    volumes: &[String],
    init: bool,
    corruptions: &mut Vec<&'static str>,
) -> Value {
    let native = init && rng.chance(40);
    let mut c = container(rng, name, 3, !init || native);
    if native {
        c["restartPolicy"] = json!("Always");
    }
    let m = mounts(rng, volumes, 2, &[]);
    if !m.is_empty() {
        c["volumeMounts"] = json!(m);
    }
    match rng.usize(..3) {
        0 => c["podInjectPolicy"] = json!("BeforeAppContainer"),
        1 => c["podInjectPolicy"] = json!("AfterAppContainer"),
        _ => {}
    }
    match rng.usize(..3) {
        0 => c["shareVolumePolicy"] = json!({"type": "enabled"}),
        1 => c["shareVolumePolicy"] = json!({"type": "disabled"}),
        _ => {}
    }
    if rng.chance(20) {
        c["upgradeStrategy"] = json!({"upgradeType": "ColdUpgrade"});
    } else if rng.chance(10) {
        // Twins `<name>-1`/`-2`; sometimes without the empty image (refused).
        c["upgradeStrategy"] = if rng.chance(80) {
            json!({"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "busybox:1.36"})
        } else {
            json!({"upgradeType": "HotUpgrade"})
        };
    }
    let mut transfer = Vec::new();
    for _ in 0..rng.usize(0..=2) {
        let mut entry = match rng.usize(..3) {
            0 => json!({"sourceContainerNameFrom": {"fieldRef": {
                "apiVersion": "v1",
                "fieldPath": rng.pick(&["metadata.labels['biz']", "metadata.annotations['biz']"]),
            }}}),
            _ => json!({"sourceContainerName": rng.pick(&APP_CONTAINERS)}),
        };
        if rng.chance(50) {
            entry["envName"] = json!(rng.pick(&ENV_NAMES));
        }
        let names = rng.subset(&ENV_NAMES, 3);
        if !names.is_empty() || entry.get("envName").is_none() {
            entry["envNames"] = json!(names);
        }
        transfer.push(entry);
    }
    if !transfer.is_empty() {
        c["transferEnv"] = json!(transfer);
    }
    if rng.chance(12) {
        corruptions.extend(corrupt_container(rng, &mut c, volumes, init));
    }
    c
}

/// Breaks (or, for a few, oddly shapes) one thing the pod validation covers, so that the
/// validator has something to deny and the apiserver something to compare it with. Returns
/// what it did, for the report; `None` when the container offers nothing to change.
fn corrupt_container(
    rng: &mut fastrand::Rng,
    c: &mut Value,
    volumes: &[String],
    init: bool,
) -> Option<&'static str> {
    let push = |c: &mut Value, list: &str, item: Value| {
        let entry = c
            .as_object_mut()
            .expect("a container")
            .entry(list)
            .or_insert_with(|| json!([]));
        entry.as_array_mut().expect("a list").push(item);
    };
    let volume = volumes.first().cloned();
    Some(match rng.usize(..36) {
        0 => {
            c["name"] = json!("Bad_Name");
            "invalid container name"
        }
        1 => {
            c["name"] = json!("x".repeat(64));
            "container name of 64 characters"
        }
        2 => {
            c["image"] = json!(" busybox:1.36");
            "image with leading whitespace"
        }
        3 => {
            c["imagePullPolicy"] = json!("Sometimes");
            "unknown imagePullPolicy"
        }
        4 => {
            c["terminationMessagePolicy"] = json!("Sometimes");
            "unknown terminationMessagePolicy"
        }
        5 => {
            c["restartPolicy"] = json!(if init { "OnFailure" } else { "Always" });
            "restartPolicy not allowed here"
        }
        6 => {
            c["lifecycle"] = json!({"preStop": {"exec": {"command": ["true"]}}});
            "lifecycle (invalid on a plain init container)"
        }
        7 => {
            push(c, "ports", json!({"containerPort": 0}));
            "containerPort 0"
        }
        8 => {
            push(c, "ports", json!({"containerPort": 70000}));
            "containerPort 70000"
        }
        9 => {
            push(c, "ports", json!({"containerPort": 81, "name": "dup"}));
            push(c, "ports", json!({"containerPort": 82, "name": "dup"}));
            "duplicate port names"
        }
        10 => {
            push(
                c,
                "ports",
                json!({"containerPort": 83, "name": "averyveryverylongportname"}),
            );
            "port name too long"
        }
        11 => {
            push(c, "ports", json!({"containerPort": 84, "protocol": "HTTP"}));
            "unknown port protocol"
        }
        12 => {
            push(c, "ports", json!({"containerPort": 85, "hostPort": 70000}));
            "hostPort 70000"
        }
        13 => {
            push(c, "env", json!({"name": "A=B", "value": "x"}));
            "env name with ="
        }
        14 => {
            push(c, "env", json!({"name": "1_DIGIT_FIRST", "value": "x"}));
            "env name starting with a digit (valid under the relaxed rule)"
        }
        15 => {
            push(
                c,
                "env",
                json!({"name": "BOTH", "value": "x", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}),
            );
            "env value and valueFrom"
        }
        16 => {
            push(
                c,
                "env",
                json!({"name": "TWO", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}, "configMapKeyRef": {"name": "cm", "key": "k"}}}),
            );
            "env valueFrom with two sources"
        }
        17 => {
            push(
                c,
                "env",
                json!({"name": "HOST", "valueFrom": {"fieldRef": {"fieldPath": "spec.hostname"}}}),
            );
            "env fieldRef the downward API does not serve"
        }
        18 => {
            push(
                c,
                "env",
                json!({"name": "CMK", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "bad key"}}}),
            );
            "env configMapKeyRef with an invalid key"
        }
        19 => {
            c["readinessProbe"] = json!({"exec": {"command": ["true"]}, "tcpSocket": {"port": 80}});
            "probe with two handlers"
        }
        20 => {
            c["livenessProbe"] = json!({"exec": {"command": ["true"]}, "successThreshold": 2});
            "liveness probe successThreshold 2"
        }
        21 => {
            c["startupProbe"] = json!({"exec": {"command": ["true"]}, "periodSeconds": -1});
            "negative probe period"
        }
        22 => {
            let v = volume?;
            push(c, "volumeMounts", json!({"name": v, "mountPath": "/dup"}));
            push(c, "volumeMounts", json!({"name": v, "mountPath": "/dup"}));
            "duplicate mountPath"
        }
        23 => {
            push(
                c,
                "volumeMounts",
                json!({"name": volume?, "mountPath": "/up", "subPath": "../x"}),
            );
            "subPath with .."
        }
        24 => {
            push(
                c,
                "volumeMounts",
                json!({"name": volume?, "mountPath": "/abs", "subPath": "/abs"}),
            );
            "absolute subPath"
        }
        25 => {
            push(
                c,
                "volumeMounts",
                json!({"name": volume?, "mountPath": "/both", "subPath": "a", "subPathExpr": "$(POD_NAME)"}),
            );
            "subPath and subPathExpr"
        }
        26 => {
            push(
                c,
                "volumeMounts",
                json!({"name": volume?, "mountPath": "/bidi", "mountPropagation": "Bidirectional"}),
            );
            "Bidirectional propagation without privileged"
        }
        27 => {
            push(
                c,
                "volumeMounts",
                json!({"name": volume?, "mountPath": "/bidi", "mountPropagation": "Bidirectional"}),
            );
            c["securityContext"] = json!({"privileged": true});
            "Bidirectional propagation, privileged (valid)"
        }
        28 => {
            push(
                c,
                "volumeMounts",
                json!({"name": volume?, "mountPath": "relative/path"}),
            );
            "relative mountPath (valid in a pod)"
        }
        // What only the webhook's dry-run pod checks (decision 0012).
        30 => {
            c["resources"] = json!({"limits": {"cpu": "lots"}});
            "resource quantity that does not parse (dry run)"
        }
        31 => {
            c["resources"] = json!({"requests": {"cpu": "2"}, "limits": {"cpu": "1"}});
            "request above its limit (dry run)"
        }
        32 => {
            c["securityContext"] = json!({"runAsUser": -1});
            "negative runAsUser (dry run)"
        }
        33 => {
            c["livenessProbe"] = json!({"httpGet": {"port": 0, "path": "/"}});
            "probe httpGet port 0 (dry run)"
        }
        34 => {
            push(c, "envFrom", json!({"configMapRef": {"name": "Bad_Name"}}));
            "envFrom configMapRef with an invalid name (dry run)"
        }
        35 => {
            c["securityContext"] =
                json!({"capabilities": {"add": ["NET_ADMIN"]}, "runAsGroup": 1000});
            "capabilities and runAsGroup (valid)"
        }
        _ => {
            push(
                c,
                "volumeMounts",
                json!({"name": "not-a-volume", "mountPath": "/missing"}),
            );
            "mount of a volume the SidecarSet does not define"
        }
    })
}

/// Like [`corrupt_container`], for a volume.
///
/// Only what the validator covers: it documents that it does not check, for instance, a
/// downwardAPI volume's item paths and field paths, or a configMap item's key, which the
/// apiserver then rejects in every pod the SidecarSet is injected into.
fn corrupt_volume(rng: &mut fastrand::Rng, v: &mut Value) -> &'static str {
    let name = v["name"].clone();
    match rng.usize(..12) {
        0 => {
            v["name"] = json!("Bad_Volume");
            "invalid volume name"
        }
        1 => {
            if v.get("emptyDir").is_some() {
                v["hostPath"] = json!({"path": "/x"});
            } else {
                v["emptyDir"] = json!({});
            }
            "two volume sources"
        }
        2 => {
            *v = json!({"name": name});
            "no volume source"
        }
        3 => {
            *v = json!({"name": name, "hostPath": {"path": "/x", "type": "Bogus"}});
            "unknown hostPath type"
        }
        4 => {
            *v = json!({"name": name, "hostPath": {"path": ""}});
            "empty hostPath path"
        }
        5 => {
            *v = json!({"name": name, "secret": {"secretName": ""}});
            "empty secretName"
        }
        6 => {
            *v = json!({"name": name, "configMap": {"name": ""}});
            "empty configMap name"
        }
        7 => {
            *v = json!({"name": name, "persistentVolumeClaim": {"claimName": ""}});
            "empty claimName"
        }
        8 => {
            *v = json!({"name": name, "secret": {"secretName": "s", "defaultMode": 0o1000}});
            "defaultMode above 0777"
        }
        9 => {
            *v = json!({"name": name, "projected": {"sources": [{"serviceAccountToken": {"path": "t", "expirationSeconds": 60}}]}});
            "token expiry under 10 minutes"
        }
        10 => {
            *v = json!({"name": name, "projected": {"sources": [{"serviceAccountToken": {"path": ""}}]}});
            "token without a path"
        }
        _ => {
            *v = json!({"name": name, "projected": {"sources": [{"serviceAccountToken": {"path": "t", "expirationSeconds": 1u64 << 33}}]}});
            "token expiry over 2^32 seconds"
        }
    }
}

/// Container names for SidecarSet `j`: mostly its own (suffixed), sometimes shared ones.
fn sidecar_name(rng: &mut fastrand::Rng, pool: &[&str], j: usize) -> String {
    let base = rng.pick(pool);
    if rng.chance(75) {
        format!("{base}-{j}")
    } else {
        (*base).to_owned()
    }
}

/// A SidecarSet as a user would write it, and the historical revision it may pin.
fn generate_sidecarset(
    rng: &mut fastrand::Rng,
    case: usize,
    j: usize,
    namespace: &str,
) -> (Value, Option<Value>, Vec<&'static str>) {
    let name = format!("fuzz-{case}-{j}");
    let mut corruptions = Vec::new();
    let volume_names: Vec<String> = rng
        .subset(&SIDECAR_VOLUMES, 3)
        .into_iter()
        .map(|s| (*s).to_owned())
        .collect();
    let mut volumes: Vec<Value> = volume_names.iter().map(|n| volume(rng, n)).collect();
    if !volumes.is_empty() && rng.chance(8) {
        let i = rng.usize(..volumes.len());
        corruptions.push(corrupt_volume(rng, &mut volumes[i]));
    }
    if !volumes.is_empty() && rng.chance(3) {
        let copy = volumes[0].clone();
        volumes.push(copy);
        corruptions.push("duplicate volume name");
    }
    let mut containers = Vec::new();
    let mut seen = BTreeSet::new();
    for _ in 0..rng.usize(0..=2) {
        let n = sidecar_name(rng, &SIDECARS, j);
        if seen.insert(n.clone()) {
            containers.push(sidecar(rng, &n, &volume_names, false, &mut corruptions));
        }
    }
    let mut init_containers = Vec::new();
    for _ in 0..rng.usize(usize::from(containers.is_empty())..=2) {
        let n = sidecar_name(rng, &SIDECAR_INITS, j);
        if seen.insert(n.clone()) {
            init_containers.push(sidecar(rng, &n, &volume_names, true, &mut corruptions));
        }
    }
    let selector = match rng.usize(..7) {
        0 => json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]}),
        1 => json!({"matchLabels": {"tier": "b"}}),
        2 => {
            json!({"matchLabels": {"app": "fuzz"}, "matchExpressions": [{"key": "biz", "operator": "Exists"}]})
        }
        _ => json!({"matchLabels": {"app": "fuzz"}}),
    };
    let mut spec = json!({"selector": selector});
    if !containers.is_empty() {
        spec["containers"] = json!(containers);
    }
    if !init_containers.is_empty() {
        spec["initContainers"] = json!(init_containers);
    }
    if !volumes.is_empty() {
        spec["volumes"] = json!(volumes);
    }
    match rng.usize(..10) {
        0 | 1 => spec["namespaceSelector"] = json!({"matchLabels": {"fuzz-ns": "yes"}}),
        2 => spec["namespace"] = json!(namespace),
        _ => {}
    }
    let has_native = init_containers
        .iter()
        .any(|c| c["restartPolicy"] == json!("Always"));
    // NotUpdate mostly with native sidecars (RollingUpdate upgrades them in place: both valid).
    if (has_native && rng.chance(85)) || rng.chance(15) {
        spec["updateStrategy"] = json!({"type": "NotUpdate"});
    }
    let secrets = rng.subset(&PULL_SECRETS[1..], 2);
    if !secrets.is_empty() {
        spec["imagePullSecrets"] = json!(
            secrets
                .iter()
                .map(|s| json!({"name": s}))
                .collect::<Vec<_>>()
        );
    }
    let mut patches = Vec::new();
    if rng.chance(40) {
        patches.push(
            json!({"patchPolicy": rng.pick(&["Retain", "Retain", "Overwrite"]), "annotations": {
                // Overwrite only keys of this SidecarSet's own, so no two Overwrite the same key.
                format!("fuzz.kruise.io/own-{j}"): format!("set-{j}"),
            }}),
        );
    }
    if rng.chance(30) {
        patches.push(json!({"annotations": {SHARED_KEY: format!("from-{j}")}}));
    }
    if rng.chance(40) {
        let value = match rng.usize(..3) {
            0 => format!(r#"{{"set-{j}":{}}}"#, rng.usize(..5)),
            1 => format!(r#"{{"nested":{{"set-{j}":true}},"pod":null}}"#),
            _ => format!(r#"[{j}]"#),
        };
        patches.push(json!({"patchPolicy": "MergePatchJson", "annotations": {JSON_KEY: value}}));
    }
    if !patches.is_empty() {
        spec["patchPodMetadata"] = json!(patches);
    }
    if rng.chance(8) {
        spec["injectionStrategy"] = json!({"paused": true});
    }
    let mut history = None;
    if rng.chance(25) {
        let by_name = rng.chance(40);
        let mut revision = if by_name {
            json!({"revisionName": format!("{name}-old")})
        } else {
            json!({"customVersion": "old"})
        };
        match rng.usize(..3) {
            0 => revision["policy"] = json!("Always"),
            1 => {
                revision["policy"] = json!("Partial");
                let strategy = spec
                    .as_object_mut()
                    .expect("spec")
                    .entry("updateStrategy")
                    .or_insert_with(|| json!({}));
                if rng.chance(50) {
                    strategy["selector"] = json!({"matchLabels": {"tier": "a"}});
                } else {
                    strategy["partition"] = json!(rng.pick(&["0%", "50%", "100%"]));
                }
            }
            _ => {}
        }
        spec["injectionStrategy"]["revision"] = revision;
        // The older version: other images, one env var fewer.
        let mut old = json!({"$patch": "replace"});
        for key in ["containers", "initContainers"] {
            if let Some(list) = spec.get(key).and_then(Value::as_array) {
                let list: Vec<Value> = list
                    .iter()
                    .map(|c| {
                        let mut c = c.clone();
                        c["image"] = json!("busybox:1.35");
                        if let Some(env) = c.get_mut("env").and_then(Value::as_array_mut) {
                            env.pop();
                        }
                        c
                    })
                    .collect();
                old[key] = json!(list);
            } else {
                old[key] = Value::Null;
            }
        }
        for key in ["volumes", "imagePullSecrets", "patchPodMetadata"] {
            old[key] = spec.get(key).cloned().unwrap_or(Value::Null);
        }
        history = Some(old);
    }
    let set = json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "SidecarSet",
        "metadata": {"name": name, "labels": {"fuzz": "true"}},
        "spec": spec,
    });
    (set, history, corruptions)
}

/// The ControllerRevision the controller would have recorded for `old` (a revision's `spec`).
fn revision_of(set: &SidecarSet, old: Value, with_hashes: bool) -> ControllerRevision {
    let name = set.metadata.name.clone().unwrap_or_default();
    let mut annotations = BTreeMap::new();
    if with_hashes {
        let mut restored = set.spec.clone();
        let spec: kruise_rs_api::sidecarset::SidecarSetSpec = serde_json::from_value(json!({
            "containers": old["containers"].as_array().cloned().unwrap_or_default(),
            "initContainers": old["initContainers"].as_array().cloned().unwrap_or_default(),
        }))
        .expect("old containers");
        restored.containers = spec.containers;
        restored.init_containers = spec.init_containers;
        annotations.insert(HASH.to_owned(), sidecarset_hash(&restored));
        annotations.insert(
            HASH_WITHOUT_IMAGE.to_owned(),
            sidecarset_hash_without_image(&restored),
        );
    }
    ControllerRevision {
        metadata: ObjectMeta {
            name: Some(format!("{name}-old")),
            labels: Some(BTreeMap::from([
                (NAME_LABEL.to_owned(), name),
                (CUSTOM_VERSION_LABEL.to_owned(), "old".to_owned()),
            ])),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        data: Some(RawExtension(json!({ "spec": old }))),
        revision: 1,
    }
}

// --- The property ---------------------------------------------------------------------------------

/// What one case produced in-process.
#[derive(Default)]
struct Outcome {
    /// SidecarSets the validator accepted (defaulted and hashed, as stored).
    accepted: Vec<SidecarSet>,
    /// Validator denials, by the first error's path (for the summary).
    denied: Vec<String>,
    /// The pod to dry-run: the injected pod, when injection succeeded and changed something.
    injected: Option<Pod>,
    /// Why the webhook would deny the pod, if it would.
    refused: Option<String>,
    /// SidecarSets denied on their own (no other SidecarSet around) for pod-spec reasons only,
    /// with the errors: a pod holding their containers and volumes must be rejected too.
    pod_denied: Vec<(SidecarSet, String)>,
    /// The corruptions applied to each generated SidecarSet, by name.
    corruptions: BTreeMap<String, Vec<&'static str>>,
    /// Every SidecarSet generated (defaulted and hashed), whatever the verdict.
    generated: Vec<SidecarSet>,
    /// SidecarSets the validator accepted but the dry-run pod refused (the webhook denies them).
    dry_run_refused: usize,
    /// Per corruption: (denied, accepted) counts.
    corruption_verdicts: Vec<(&'static str, bool)>,
    failures: Vec<String>,
}

/// Whether a validation error is about what Kubernetes checks in a pod (rather than about a
/// SidecarSet-only field or rule).
fn is_pod_rule(path: &str) -> bool {
    const POD_PARTS: [&str; 3] = ["spec.containers", "spec.initContainers", "spec.volumes"];
    const SIDECARSET_FIELDS: [&str; 5] = [
        ".transferEnv",
        ".podInjectPolicy",
        ".upgradeStrategy",
        ".shareVolume",
        ".resourcesPolicy",
    ];
    // `restartPolicy` too: Kubernetes 1.35 (ContainerRestartRules, beta) accepts it on
    // containers, and other values than `Always` on init containers; the validator keeps the
    // rule of the Kubernetes release upstream validates with.
    POD_PARTS.iter().any(|p| path.starts_with(p))
        && !SIDECARSET_FIELDS.iter().any(|f| path.contains(f))
        && !path.ends_with(".restartPolicy")
}

/// A pod holding the SidecarSet's containers, init containers and volumes as they are (as
/// upstream's validator builds one to run Kubernetes' pod validation on), plus a placeholder
/// container when the SidecarSet has init containers only.
fn fake_pod(set: &SidecarSet, namespace: &str) -> Pod {
    let mut containers: Vec<_> = set
        .spec
        .containers
        .iter()
        .map(|c| c.container.clone())
        .collect();
    if containers.is_empty() {
        containers.push(
            serde_json::from_value(json!({"name": "fake-app", "image": "busybox:1.36"}))
                .expect("a container"),
        );
    }
    let init: Vec<_> = set
        .spec
        .init_containers
        .iter()
        .map(|c| c.container.clone())
        .collect();
    Pod {
        metadata: ObjectMeta {
            name: Some(format!(
                "fake-{}",
                set.metadata.name.as_deref().unwrap_or_default()
            )),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(k8s_openapi::api::core::v1::PodSpec {
            containers,
            init_containers: (!init.is_empty()).then_some(init),
            volumes: (!set.spec.volumes.is_empty()).then(|| set.spec.volumes.clone()),
            service_account_name: Some("default".to_owned()),
            ..Default::default()
        }),
        status: None,
    }
}

/// One case; `refused` are the SidecarSets whose dry-run pod the apiserver refuses (the
/// webhook's second check), denied like the validator's refusals.
fn run_case(
    seed: u64,
    index: usize,
    namespace: &str,
    refused: &BTreeSet<String>,
) -> (Pod, Outcome) {
    let mut rng =
        fastrand::Rng::with_seed(seed ^ (index as u64).wrapping_mul(0xa076_1d64_78bd_642f));
    let pod: Pod =
        serde_json::from_value(generate_pod(&mut rng, index, namespace)).expect("a generated pod");
    let mut namespace_labels = BTreeMap::from([(
        "kubernetes.io/metadata.name".to_owned(),
        namespace.to_owned(),
    )]);
    if rng.chance(50) {
        namespace_labels.insert("fuzz-ns".to_owned(), "yes".to_owned());
    }
    let mut out = Outcome::default();
    let mut histories: BTreeMap<String, Vec<ControllerRevision>> = BTreeMap::new();
    let policy = PatchPodMetadataPolicy::AllowAll;
    for j in 0..rng.usize(1..=3) {
        let (raw, old, corruptions) = generate_sidecarset(&mut rng, index, j, namespace);
        let mut set: SidecarSet = match serde_json::from_value(raw.clone()) {
            Ok(set) => set,
            Err(e) => {
                out.failures
                    .push(format!("generated SidecarSet does not parse: {e}\n{raw:#}"));
                continue;
            }
        };
        // As the mutating webhook does before validation.
        default_sidecarset(&mut set);
        let annotations = set.metadata.annotations.get_or_insert_with(BTreeMap::new);
        annotations.insert(HASH.to_owned(), sidecarset_hash(&set.spec));
        annotations.insert(
            HASH_WITHOUT_IMAGE.to_owned(),
            sidecarset_hash_without_image(&set.spec),
        );
        let revisions: Vec<ControllerRevision> = old
            .map(|old| vec![revision_of(&set, old, rng.chance(50))])
            .unwrap_or_default();
        let known: Vec<KnownRevision> = revisions
            .iter()
            .map(KnownRevision::from_controller_revision)
            .collect();
        let ctx = SidecarSetContext {
            revisions: &known,
            patch_pod_metadata: &policy,
        };
        let verdict = catch_unwind(AssertUnwindSafe(|| {
            validate_create(&set, &out.accepted, &ctx)
        }));
        let name = set.metadata.name.clone().unwrap_or_default();
        out.generated.push(set.clone());
        let verdict = match verdict {
            Ok(Ok(())) if refused.contains(&name) => {
                out.dry_run_refused += 1;
                out.denied.push("(dry-run pod)".to_owned());
                for corruption in &corruptions {
                    out.corruption_verdicts.push((corruption, false));
                }
                out.corruptions.insert(name, corruptions);
                continue;
            }
            verdict => verdict,
        };
        for corruption in &corruptions {
            out.corruption_verdicts
                .push((corruption, matches!(verdict, Ok(Ok(())))));
        }
        out.corruptions.insert(name.clone(), corruptions);
        match verdict {
            Ok(Ok(())) => {
                histories.insert(name, revisions);
                out.accepted.push(set);
            }
            Ok(Err(errors)) => {
                out.denied.push(
                    errors
                        .errors()
                        .first()
                        .map(|e| generalize(&e.path))
                        .unwrap_or_default(),
                );
                let alone = validate_create(&set, [], &ctx);
                if let Err(alone) = alone
                    && alone.errors().iter().all(|e| is_pod_rule(&e.path))
                {
                    out.pod_denied.push((set, alone.to_string()));
                }
            }
            Err(panic) => out.failures.push(format!(
                "validate_create panicked: {}\nSidecarSet: {}",
                panic_message(&panic),
                to_json(&set)
            )),
        }
    }

    let planned = catch_unwind(AssertUnwindSafe(|| {
        plan_for_new_pod(
            &out.accepted,
            &pod,
            &namespace_labels,
            |name| histories.get(name).map(Vec::as_slice).unwrap_or(&[]),
            || rng.f64(),
        )
    }));
    let plan = match planned {
        Ok(Ok(plan)) => plan,
        Ok(Err(e)) => {
            out.refused = Some(format!("plan: {e}"));
            return (pod, out);
        }
        Err(panic) => {
            out.failures.push(format!(
                "plan_for_new_pod panicked: {}\n{}",
                panic_message(&panic),
                reproduction(&pod, &out.accepted)
            ));
            return (pod, out);
        }
    };
    let now = Time("2025-01-01T00:00:00Z".parse().expect("a time"));
    let injection = match catch_unwind(AssertUnwindSafe(|| inject(&pod, &plan, now))) {
        Ok(Ok(injection)) => injection,
        Ok(Err(e)) => {
            out.refused = Some(refusal_kind(&e).to_owned());
            return (pod, out);
        }
        Err(panic) => {
            out.failures.push(format!(
                "inject panicked: {}\n{}",
                panic_message(&panic),
                reproduction(&pod, &out.accepted)
            ));
            return (pod, out);
        }
    };
    check_injection(&pod, &injection, &out.accepted, &mut out.failures);
    if injection.pod != pod {
        out.injected = Some(injection.pod);
    }
    (pod, out)
}

/// Properties 2 and 3, checked in-process.
fn check_injection(
    pod: &Pod,
    injection: &kruise_rs_sidecar::Injection,
    sets: &[SidecarSet],
    failures: &mut Vec<String>,
) {
    let mut problems = Vec::new();
    match pod_patch(pod, &injection.pod) {
        Ok(patch) => {
            let mut patched = serde_json::to_value(pod).expect("pod JSON");
            match json_patch::patch(&mut patched, &patch.0) {
                Ok(()) if patched == serde_json::to_value(&injection.pod).expect("JSON") => {}
                Ok(()) => problems.push("the patch does not produce the injected pod".to_owned()),
                Err(e) => problems.push(format!("the patch does not apply: {e}")),
            }
        }
        Err(e) => problems.push(format!("no patch: {e}")),
    }
    let spec = injection.pod.spec.as_ref().expect("spec");
    let all: Vec<&k8s_openapi::api::core::v1::Container> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .collect();
    let original = pod.spec.as_ref().expect("spec");
    for c in original
        .containers
        .iter()
        .chain(original.init_containers.iter().flatten())
    {
        if !all.iter().any(|x| x.name == c.name) {
            problems.push(format!("the pod's container {} is gone", c.name));
        }
    }
    for name in &injection.injected {
        let set = sets
            .iter()
            .find(|s| s.metadata.name.as_ref() == Some(name))
            .expect("an injected SidecarSet was accepted");
        let init = set.spec.init_containers.iter().map(|c| (c, true));
        for (sidecar, is_init) in set.spec.containers.iter().map(|c| (c, false)).chain(init) {
            // A hot-upgrade sidecar is there as its two twins.
            let names = if injects_twins(sidecar, is_init) {
                twin_names(&sidecar.container.name).to_vec()
            } else {
                vec![sidecar.container.name.clone()]
            };
            let marked = names.iter().all(|name| {
                all.iter().find(|c| &c.name == name).is_some_and(|c| {
                    c.env
                        .iter()
                        .flatten()
                        .any(|e| e.name == "IS_INJECTED" && e.value.as_deref() == Some("true"))
                })
            });
            if !marked {
                problems.push(format!(
                    "sidecar {} of {name} is missing or unmarked",
                    sidecar.container.name
                ));
            }
        }
    }
    if !problems.is_empty() {
        failures.push(format!(
            "{}\n{}\ninjected pod: {}",
            problems.join("; "),
            reproduction(pod, sets),
            to_json(&injection.pod)
        ));
    }
}

fn refusal_kind(e: &InjectionError) -> &'static str {
    match e {
        InjectionError::ResourcesPolicy { .. } => "inject: resourcesPolicy",
        InjectionError::PatchPodMetadata { .. } => "inject: patchPodMetadata",
        InjectionError::Annotation(_) => "inject: annotation",
        InjectionError::NameConflict { .. } => "inject: name conflict",
        InjectionError::HotUpgrade { .. } => "inject: hot upgrade",
    }
}

/// `spec.containers[1].env[0].name` → `spec.containers[*].env[*].name`.
fn generalize(path: &str) -> String {
    let mut out = String::new();
    let mut skipping = false;
    for c in path.chars() {
        match c {
            '[' => {
                skipping = true;
                out.push_str("[*]");
            }
            ']' => skipping = false,
            _ if skipping => {}
            c => out.push(c),
        }
    }
    out
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "(not a string)".to_owned())
}

fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|e| format!("(unserializable: {e})"))
}

fn reproduction(pod: &Pod, sets: &[SidecarSet]) -> String {
    format!("pod: {}\nSidecarSets: {}", to_json(pod), to_json(&sets))
}

fn env_number(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    let value = value.trim();
    match value.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => value.parse().ok(),
    }
}

/// Dry-runs every `(label, object)` creation through `create`, CONCURRENCY at a time; returns
/// the failure message `describe` writes for each whose outcome is not `expect_accepted`.
async fn dry_run_all<'a, T, F, Fut>(
    items: &'a [T],
    expect_accepted: bool,
    create: F,
    describe: impl Fn(&'a T, Option<kube::Error>) -> String,
) -> Vec<String>
where
    F: Fn(&'a T) -> Fut,
    Fut: std::future::Future<Output = Result<(), kube::Error>>,
{
    let create = &create;
    let results: Vec<(usize, Result<(), kube::Error>)> = stream::iter(items.iter().enumerate())
        .map(|(i, item)| async move { (i, create(item).await) })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let mut results = results;
    results.sort_by_key(|(i, _)| *i);
    results
        .into_iter()
        .filter_map(|(i, result)| match (result, expect_accepted) {
            (Ok(()), true) => None,
            (Err(kube::Error::Api(_)), false) => None,
            (Err(e), true) => Some(describe(&items[i], Some(e))),
            (Ok(()), false) => Some(describe(&items[i], None)),
            (Err(e), false) => Some(describe(&items[i], Some(e))),
        })
        .collect()
}

#[tokio::test]
async fn injected_pods_are_accepted_by_the_apiserver() {
    let started = std::time::Instant::now();
    let seed = env_number("KRUISE_FUZZ_SEED").unwrap_or(DEFAULT_SEED);
    let cases = env_number("KRUISE_FUZZ_CASES").map_or(DEFAULT_CASES, |n| n as usize);
    let cluster = crate::support::cluster().await;
    let namespace = cluster.namespace("webhook-fuzz").await;
    let ns = namespace.name().to_owned();
    let client = cluster.client().await;

    let mut failures: Vec<String> = Vec::new();
    let mut originals = Vec::new();
    let mut injected = Vec::new();
    let mut accepted_sets = Vec::new();
    let mut pod_denied = Vec::new();
    let mut denied: BTreeMap<String, usize> = BTreeMap::new();
    let mut refused: BTreeMap<String, usize> = BTreeMap::new();
    let mut corruption_verdicts: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    let mut untouched = 0;
    let mut dry_run_only = 0;

    // The webhook's second check, as it makes it (decision 0012): every generated SidecarSet's
    // dry-run pod, judged once by the apiserver.
    let all_sets: Vec<SidecarSet> = (0..cases)
        .flat_map(|index| run_case(seed, index, &ns, &BTreeSet::new()).1.generated)
        .collect();
    let judged: Vec<(String, Outcome0012)> = stream::iter(&all_sets)
        .map(|set| {
            let (client, ns) = (&client, &ns);
            async move {
                let raw = serde_json::to_value(set).expect("SidecarSet JSON");
                let pod = dry_run::synthetic_pod(&raw, ns);
                let name = set.metadata.name.clone().unwrap_or_default();
                (
                    name,
                    dry_run::judge(client, &pod, set.spec.containers.len()).await,
                )
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let mut refused_by_dry_run = BTreeSet::new();
    for (name, outcome) in judged {
        match outcome {
            Outcome0012::Valid => {}
            Outcome0012::Invalid(_) => {
                refused_by_dry_run.insert(name);
            }
            Outcome0012::Unknown(why) => {
                failures.push(format!("the dry-run pod of {name} got no verdict: {why}"))
            }
        }
    }

    for index in 0..cases {
        let (pod, outcome) = run_case(seed, index, &ns, &refused_by_dry_run);
        failures.extend(
            outcome
                .failures
                .into_iter()
                .map(|f| format!("case {index}: {f}")),
        );
        dry_run_only += outcome.dry_run_refused;
        for path in outcome.denied {
            *denied.entry(path).or_default() += 1;
        }
        for (corruption, accepted) in outcome.corruption_verdicts {
            let counts = corruption_verdicts.entry(corruption).or_default();
            if accepted {
                counts.1 += 1;
            } else {
                counts.0 += 1;
            }
        }
        let corruptions = outcome.corruptions;
        let corruptions_of = |set: &SidecarSet| {
            corruptions
                .get(set.metadata.name.as_deref().unwrap_or_default())
                .cloned()
                .unwrap_or_default()
        };
        match (&outcome.refused, outcome.injected) {
            (Some(reason), _) => *refused.entry(reason.clone()).or_default() += 1,
            (None, Some(pod)) => injected.push((index, pod, outcome.accepted.clone())),
            (None, None) => untouched += 1,
        }
        for set in outcome.accepted {
            let corruptions = corruptions_of(&set);
            accepted_sets.push((index, fake_pod(&set, &ns), set, corruptions));
        }
        for (set, errors) in outcome.pod_denied {
            let corruptions = corruptions_of(&set);
            pod_denied.push((index, fake_pod(&set, &ns), set, errors, corruptions));
        }
        originals.push((index, pod));
    }

    // Property 4 (and the generator's honesty): the apiserver's word.
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let sets = Api::<SidecarSet>::all(client.clone());
    let (pods, sets, dry_run, generated) = (&pods, &sets, &dry_run, &originals);
    let outcome = |e: Option<kube::Error>| match e {
        Some(e) => format!("rejected: {e}"),
        None => "accepted".to_owned(),
    };
    let mut checks = Vec::new();
    checks.push(
        dry_run_all(
            &originals,
            true,
            |(_, pod)| async move { pods.create(dry_run, pod).await.map(drop) },
            |(index, pod), e| {
                format!(
                    "case {index}: the GENERATED pod (before injection) is {}; fix the generator\npod: {}",
                    outcome(e),
                    to_json(pod)
                )
            },
        )
        .await,
    );
    checks.push(
        dry_run_all(
            &injected,
            true,
            |(_, pod, _)| async move { pods.create(dry_run, pod).await.map(drop) },
            |(index, pod, accepted), e| {
                format!(
                    "case {index}: the injected pod is {}\ninjected pod: {}\n{}",
                    outcome(e),
                    to_json(pod),
                    reproduction(&generated[*index].1, accepted)
                )
            },
        )
        .await,
    );
    checks.push(
        dry_run_all(
            &accepted_sets,
            true,
            |(_, _, set, _)| async move { sets.create(dry_run, set).await.map(drop) },
            |(index, _, set, corruptions), e| {
                format!(
                    "case {index}: a SidecarSet the validator accepted (corruptions {corruptions:?}) is {} by the apiserver\nSidecarSet: {}",
                    outcome(e),
                    to_json(set)
                )
            },
        )
        .await,
    );
    checks.push(
        dry_run_all(
            &accepted_sets,
            true,
            |(_, pod, _, _)| async move { pods.create(dry_run, pod).await.map(drop) },
            |(index, pod, set, corruptions), e| {
                format!(
                    "case {index}: the validator accepts a SidecarSet (corruptions {corruptions:?}) but a pod with its containers and volumes is {}\npod: {}\nSidecarSet: {}",
                    outcome(e),
                    to_json(pod),
                    to_json(set)
                )
            },
        )
        .await,
    );
    checks.push(
        dry_run_all(
            &pod_denied,
            false,
            |(_, pod, _, _, _)| async move { pods.create(dry_run, pod).await.map(drop) },
            |(index, pod, set, errors, corruptions), e| {
                format!(
                    "case {index}: the validator denies a SidecarSet (corruptions {corruptions:?}) for pod-spec reasons ({errors}) but a pod with its containers and volumes is {}\npod: {}\nSidecarSet: {}",
                    outcome(e),
                    to_json(pod),
                    to_json(set)
                )
            },
        )
        .await,
    );

    eprintln!(
        "webhook fuzz: seed {seed:#x}, {cases} cases in {:.1?}: {} SidecarSets accepted, denied by first error {denied:?}; \
         {} pods injected, {untouched} untouched, refused {refused:?}; \
         corruptions (denied, accepted): {corruption_verdicts:?}; {} denied for pod-spec reasons only; \
         {dry_run_only} accepted by the validator but refused by the dry-run pod",
        started.elapsed(),
        accepted_sets.len(),
        injected.len(),
        pod_denied.len(),
    );
    // Not vacuous: a good share of the cases inject something.
    assert!(
        injected.len() * 5 > cases * 2,
        "only {} of {cases} pods were injected",
        injected.len()
    );
    assert!(
        dry_run_only > 0,
        "the dry-run pod refused nothing the validator accepts: the corruptions only it \
         checks are not reaching it"
    );
    failures.extend(webhook_admits_only_valid_pods(&all_sets, &ns, seed).await);
    let all: Vec<String> = failures.into_iter().chain(checks.concat()).collect();
    if !all.is_empty() {
        panic!(
            "{} failures (seed {seed:#x}; rerun with KRUISE_FUZZ_SEED={seed:#x}):\n\n{}",
            all.len(),
            all.join("\n\n----\n\n")
        );
    }
}

/// Through the real webhook (the webhook cluster, dry-run creates): every generated SidecarSet
/// the webhook admits yields a pod (its containers, init containers and volumes) the apiserver
/// admits. The webhook may refuse more than the in-process pipeline above (pinned revisions it
/// cannot find, no `patchPodMetadata` whitelist, other tests' SidecarSets): those say nothing,
/// so `patchPodMetadata` and revision pins, which do not reach the pod, are left out.
/// A bounded sample (every third SidecarSet), CONCURRENCY at a time.
async fn webhook_admits_only_valid_pods(
    generated: &[SidecarSet],
    namespace: &str,
    seed: u64,
) -> Vec<String> {
    let webhook = crate::support::webhook::webhook_cluster().client().await;
    let shared = crate::support::cluster().await.client().await;
    let (sets, pods) = (
        &Api::<SidecarSet>::all(webhook),
        &Api::<Pod>::namespaced(shared, namespace),
    );
    let dry_run = &PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    // (admitted by the webhook, what went wrong)
    let results: Vec<(bool, Option<String>)> = stream::iter(generated.iter().step_by(3))
        .map(|set| async move {
            let mut sent = set.clone();
            sent.metadata.annotations = None;
            // Irrelevant to the pod, and refused on that cluster (no whitelist, no history).
            sent.spec.patch_pod_metadata.clear();
            sent.spec.injection_strategy.revision = None;
            match sets.create(dry_run, &sent).await {
                Err(kube::Error::Api(_)) => (false, None),
                Err(e) => (
                    false,
                    Some(format!("the webhook could not be asked: {e}\nSidecarSet: {}", to_json(set))),
                ),
                Ok(_) => {
                    let pod = fake_pod(set, namespace);
                    let failure = pods.create(dry_run, &pod).await.err().map(|e| {
                        format!(
                            "seed {seed:#x}: the webhook admits a SidecarSet whose pod the apiserver refuses: {e}\npod: {}\nSidecarSet: {}",
                            to_json(&pod),
                            to_json(set)
                        )
                    });
                    (true, failure)
                }
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let admitted = results.iter().filter(|(admitted, _)| *admitted).count();
    eprintln!(
        "webhook fuzz, through the webhook: {admitted} of {} sampled SidecarSets admitted",
        results.len()
    );
    let mut failures: Vec<String> = results.into_iter().filter_map(|(_, f)| f).collect();
    if admitted == 0 {
        failures.push("the webhook admitted none of the sampled SidecarSets".to_owned());
    }
    failures
}
