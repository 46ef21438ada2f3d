//! Upstream's SidecarSet injection e2e scenarios (kruise.md §9.2, `sidecarset.go`), reproduced
//! through a real kube-apiserver with the manager's webhooks (see `support::webhook`): each test
//! creates SidecarSets and pods with the API, then inspects the pod the apiserver admitted.
//!
//! Differences from upstream's e2e, on purpose:
//! - Bare pods instead of Deployments (no controller-manager runs here), with a `generateName`
//!   as a ReplicaSet's pods have; a test that needs several pods creates them one by one.
//! - No SidecarSet controller exists yet, so where upstream waits for it to record a
//!   ControllerRevision or set `status.latestRevision`, the test writes what it would write
//!   (kruise.md §2.4), in the shape `crates/sidecar/src/revision.rs` reads.
//! - Every SidecarSet selects a label value of its own (and, like upstream's, only its test's
//!   namespace), so tests running in parallel never inject into each other's pods.
//! - The webhook reads SidecarSets from a cache that sees a write a moment later. Instead of
//!   upstream's sleeps, a pod whose injection depends on a just-written SidecarSet is created
//!   until the admitted pod shows that version (each stale one deleted), with a deadline.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kruise_rs_api::sidecarset::SidecarSet;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::support::webhook::{MANAGER_NAMESPACE, webhook_cluster};
use crate::support::{unique_name, wait_for};

/// How long the webhook's caches may take to show a write.
const CACHE_TIMEOUT: Duration = Duration::from_secs(30);

const HASH: &str = "kruise.io/sidecarset-hash";
const HASH_WITHOUT_IMAGE: &str = "kruise.io/sidecarset-hash-without-image";
const INJECTED_LIST: &str = "kruise.io/sidecarset-injected-list";
const NAME_LABEL: &str = "kruise.io/sidecarset-name";
const CUSTOM_VERSION_LABEL: &str = "apps.kruise.io/sidecarset-custom-version";
const WHITELIST_CONFIGMAP: &str = "kruise-configuration";
const WHITELIST_KEY: &str = "SidecarSet_PatchPodMetadata_WhiteList";

async fn client() -> Client {
    webhook_cluster().client().await
}

fn sidecarsets(client: &Client) -> Api<SidecarSet> {
    Api::all(client.clone())
}

/// Upstream's `NewBaseSidecarSet`: an init container, a `BeforeAppContainer` sidecar sharing
/// the pod's volumes and an `AfterAppContainer` one; selecting pods labelled `app: <app>` in
/// namespace `ns` only.
fn base_sidecarset(name: &str, app: &str, ns: &str) -> Value {
    json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "SidecarSet",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": app}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "initContainers": [{
                "name": "init-sidecar",
                "image": "busybox:1.36",
                "command": ["/bin/sh", "-c", "sleep 1"],
            }],
            "containers": [
                {
                    "name": "nginx-sidecar",
                    "image": "nginx:1.25",
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["tail", "-f", "/dev/null"],
                    "podInjectPolicy": "BeforeAppContainer",
                    "shareVolumePolicy": {"type": "enabled"},
                },
                {
                    "name": "busybox-sidecar",
                    "image": "busybox:1.36",
                    "command": ["/bin/sh", "-c", "sleep 10000000"],
                    "podInjectPolicy": "AfterAppContainer",
                },
            ],
        }
    })
}

/// [`base_sidecarset`] with only its first container (what most upstream cases use).
fn single_sidecar_set(name: &str, app: &str, ns: &str) -> Value {
    let mut set = base_sidecarset(name, app, ns);
    let spec = set["spec"].as_object_mut().expect("spec");
    spec.remove("initContainers");
    spec["containers"]
        .as_array_mut()
        .expect("containers")
        .truncate(1);
    set
}

/// The pod of upstream's `NewBaseDeployment`: one container `main`, labelled `app: <app>`.
fn base_pod(name: &str, app: &str) -> Value {
    json!({
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"containers": [{
            "name": "main",
            "image": "busybox:1.36",
            "command": ["/bin/sh", "-c", "sleep 10000000"],
        }]}
    })
}

async fn create_sidecarset(client: &Client, set: &Value) -> SidecarSet {
    let set: SidecarSet = serde_json::from_value(set.clone()).expect("a SidecarSet");
    let name = set.name_any();
    sidecarsets(client)
        .create(&PostParams::default(), &set)
        .await
        .unwrap_or_else(|e| panic!("creating SidecarSet {name}: {e}"))
}

async fn patch_sidecarset(client: &Client, name: &str, patch: Value) -> SidecarSet {
    sidecarsets(client)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("updating SidecarSet {name} with {patch}: {e}"))
}

/// Creates the pod `template` describes until the admitted pod satisfies `ready`, deleting
/// each one that does not: the webhook's cache may not show the latest SidecarSet write yet. A
/// denied pod fails the test at once. Like the pods of upstream's Deployments, it has a
/// `generateName` (`<the template's name>-`) and no name.
pub(crate) async fn admit_until(
    pods: &Api<Pod>,
    template: &Value,
    what: &str,
    ready: impl Fn(&Pod) -> bool,
) -> Pod {
    let ready = &ready;
    wait_for(what, CACHE_TIMEOUT, move || async move {
        let mut pod: Pod = serde_json::from_value(template.clone()).expect("a pod");
        let prefix = pod.metadata.name.take().unwrap_or_else(|| "pod".to_owned());
        pod.metadata.generate_name = Some(format!("{prefix}-"));
        let created = pods
            .create(&PostParams::default(), &pod)
            .await
            .unwrap_or_else(|e| panic!("creating a pod {prefix}-* ({what}): {e}"));
        if ready(&created) {
            return Some(created);
        }
        let _ = pods
            .delete(&created.name_any(), &DeleteParams::default())
            .await;
        None
    })
    .await
}

/// Creates the pod `template` describes once and returns it as admitted.
async fn admit(pods: &Api<Pod>, template: &Value) -> Pod {
    admit_until(pods, template, "a pod to be admitted", |_| true).await
}

/// The pod's entry for SidecarSet `set` in the hash annotation `key`, if any.
fn hash_entry(pod: &Pod, key: &str, set: &str) -> Option<Value> {
    let text = pod.annotations().get(key)?;
    let map: Value = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("annotation {key} is not JSON ({e}): {text}"));
    map.get(set).cloned()
}

fn injected_by(pod: &Pod, set: &str) -> bool {
    hash_entry(pod, HASH, set).is_some()
}

/// The `controllerRevision` the pod records for SidecarSet `set` ("" when absent).
fn recorded_revision(pod: &Pod, set: &str) -> String {
    hash_entry(pod, HASH, set)
        .and_then(|e| e["controllerRevision"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn containers(pod: &Pod) -> &[Container] {
    &pod.spec.as_ref().expect("spec").containers
}

fn init_containers(pod: &Pod) -> &[Container] {
    pod.spec
        .as_ref()
        .expect("spec")
        .init_containers
        .as_deref()
        .unwrap_or_default()
}

fn names(list: &[Container]) -> Vec<&str> {
    list.iter().map(|c| c.name.as_str()).collect()
}

fn container<'p>(pod: &'p Pod, name: &str) -> &'p Container {
    containers(pod)
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("pod has no container {name}: {:?}", names(containers(pod))))
}

fn env_value<'c>(c: &'c Container, name: &str) -> Option<&'c str> {
    c.env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .and_then(|e| e.value.as_deref())
}

fn mount_paths(c: &Container) -> Vec<&str> {
    c.volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.as_str())
        .collect()
}

fn volume_names(pod: &Pod) -> Vec<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .map(|v| v.iter().map(|v| v.name.as_str()).collect())
        .unwrap_or_default()
}

fn image(c: &Container) -> &str {
    c.image.as_deref().unwrap_or_default()
}

// --- Emulating the SidecarSet controller ------------------------------------------------------

/// The ControllerRevision the SidecarSet controller records for `set`'s current version
/// (kruise.md §2.4): in the manager's namespace, labelled with the SidecarSet's name (and custom
/// version), carrying its annotations (both hashes among them), data the five restorable fields.
async fn record_revision(client: &Client, set: &SidecarSet, number: i64) -> ControllerRevision {
    let name = set.name_any();
    let spec = serde_json::to_value(&set.spec).expect("spec JSON");
    let field = |key: &str| spec.get(key).cloned().unwrap_or(Value::Null);
    let mut labels = set.labels().clone();
    labels.insert(NAME_LABEL.to_owned(), name.clone());
    if let Some(version) = set.spec.custom_version.as_deref() {
        labels.insert(CUSTOM_VERSION_LABEL.to_owned(), version.to_owned());
    }
    let revision = ControllerRevision {
        metadata: ObjectMeta {
            name: Some(format!("{name}-r{number}")),
            namespace: Some(MANAGER_NAMESPACE.to_owned()),
            labels: Some(labels),
            annotations: Some(set.annotations().clone()),
            ..ObjectMeta::default()
        },
        data: Some(RawExtension(json!({"spec": {
            "$patch": "replace",
            "volumes": field("volumes"),
            "containers": field("containers"),
            "initContainers": field("initContainers"),
            "imagePullSecrets": field("imagePullSecrets"),
            "patchPodMetadata": field("patchPodMetadata"),
        }}))),
        revision: number,
    };
    Api::<ControllerRevision>::namespaced(client.clone(), MANAGER_NAMESPACE)
        .create(&PostParams::default(), &revision)
        .await
        .unwrap_or_else(|e| panic!("recording revision {number} of SidecarSet {name}: {e}"))
}

/// `status.latestRevision`, as the controller sets it after recording a revision.
async fn set_latest_revision(client: &Client, set: &str, revision: &str) {
    sidecarsets(client)
        .patch_status(
            set,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"latestRevision": revision}})),
        )
        .await
        .unwrap_or_else(|e| panic!("setting status.latestRevision of {set}: {e}"));
}

fn hash_of(set: &SidecarSet) -> String {
    set.annotations()
        .get(HASH)
        .cloned()
        .unwrap_or_else(|| panic!("SidecarSet {} has no hash annotation", set.name_any()))
}

// --- Injecting functionality [SidecarSetInject] ------------------------------------------------

/// Upstream item 1, "pods don't have matched sidecarSet".
#[tokio::test]
async fn a_pod_no_sidecarset_selects_is_admitted_unchanged() {
    let client = client().await;
    let ns = webhook_cluster().namespace("sc-nomatch").await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let app = unique_name("app");
    let unmatched = format!("nomatched-{app}");
    let name = unique_name("nomatch");
    create_sidecarset(&client, &base_sidecarset(&name, &unmatched, &ns)).await;
    // The SidecarSet is in the webhook's cache once a pod it does select gets its sidecars;
    // only then does the unselected pod below say anything.
    admit_until(
        &pods,
        &base_pod("probe", &unmatched),
        "the SidecarSet to reach the webhook's cache",
        |p| injected_by(p, &name),
    )
    .await;

    let pod = admit(&pods, &base_pod("web", &app)).await;
    assert_eq!(names(containers(&pod)), ["main"]);
    assert!(init_containers(&pod).is_empty(), "{pod:?}");
    for key in [HASH, HASH_WITHOUT_IMAGE, INJECTED_LIST] {
        assert!(!pod.annotations().contains_key(key), "{key} on {pod:?}");
    }
}

/// Upstream item 2, "sidecarset with volumes.downwardAPI": upstream only checks that such a
/// SidecarSet is admitted; here a pod gets the volume too, defaulted as the apiserver defaults
/// a pod's own.
#[tokio::test]
async fn a_downward_api_volume_is_admitted_and_injected_with_its_mount() {
    let client = client().await;
    let ns = webhook_cluster().namespace("sc-downward").await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let app = unique_name("app");
    let name = unique_name("downward");
    let mut set = base_sidecarset(&name, &app, &ns);
    set["spec"]["volumes"] = json!([{
        "name": "podinfo",
        "downwardAPI": {"items": [
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
        ]},
    }]);
    set["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "podinfo", "mountPath": "/etc/podinfo"}]);
    let created = create_sidecarset(&client, &set).await;
    let volume = &created.spec.volumes[0];
    let downward = volume.downward_api.as_ref().expect("downwardAPI");
    assert_eq!(downward.default_mode, Some(0o644), "defaulted: {volume:?}");
    assert_eq!(downward.items.as_ref().map(Vec::len), Some(2));

    let pod = admit_until(
        &pods,
        &base_pod("web", &app),
        "the pod to be injected",
        |p| injected_by(p, &name),
    )
    .await;
    let volumes = pod
        .spec
        .as_ref()
        .unwrap()
        .volumes
        .clone()
        .unwrap_or_default();
    let podinfo = volumes
        .iter()
        .find(|v| v.name == "podinfo")
        .unwrap_or_else(|| panic!("no podinfo volume: {volumes:?}"));
    assert_eq!(
        podinfo.downward_api, volume.downward_api,
        "the pod's volume is the SidecarSet's, with nothing the apiserver had to add"
    );
    let sidecar = container(&pod, "nginx-sidecar");
    assert!(
        mount_paths(sidecar).contains(&"/etc/podinfo"),
        "{sidecar:?}"
    );
    assert!(
        mount_paths(container(&pod, "busybox-sidecar")).is_empty(),
        "only the container that mounts it gets the volume"
    );
    assert_eq!(volume_names(&pod), ["podinfo"], "{volumes:?}");
}

/// Upstream item 3, "sidecarSet inject pod sidecar container": the sidecars around `main` in
/// their policies' order, the init container after the pod's own.
#[tokio::test]
async fn sidecars_are_injected_before_and_after_the_app_container() {
    let client = client().await;
    let ns = webhook_cluster().namespace("sc-inject").await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let app = unique_name("app");
    let name = unique_name("inject");
    let created = create_sidecarset(&client, &base_sidecarset(&name, &app, &ns)).await;
    let mut template = base_pod("web", &app);
    template["spec"]["initContainers"] =
        json!([{"name": "prepare", "image": "busybox:1.36", "command": ["true"]}]);
    let pod = admit_until(&pods, &template, "the pod to be injected", |p| {
        injected_by(p, &name)
    })
    .await;

    assert_eq!(
        names(containers(&pod)),
        ["nginx-sidecar", "main", "busybox-sidecar"]
    );
    assert_eq!(names(init_containers(&pod)), ["prepare", "init-sidecar"]);
    for c in containers(&pod).iter().chain(init_containers(&pod)) {
        let injected = env_value(c, "IS_INJECTED") == Some("true");
        assert_eq!(injected, c.name != "main" && c.name != "prepare", "{c:?}");
    }
    let entry = hash_entry(&pod, HASH, &name).expect("hash entry");
    assert_eq!(entry["hash"].as_str(), Some(hash_of(&created).as_str()));
    // Plain init containers are not sidecars: they are not upgraded, so not listed.
    assert_eq!(
        entry["sidecarList"],
        json!(["busybox-sidecar", "nginx-sidecar"])
    );
    assert_eq!(
        hash_entry(&pod, HASH_WITHOUT_IMAGE, &name).expect("entry")["hash"].as_str(),
        created
            .annotations()
            .get(HASH_WITHOUT_IMAGE)
            .map(String::as_str)
    );
    assert_eq!(pod.annotations()[INJECTED_LIST], name);
}

/// Upstream item 4, "sidecarSet inject pod sidecar container volumeMounts": with
/// `shareVolumePolicy` enabled the sidecar mounts the app's volumes next to its own.
#[tokio::test]
async fn a_sharing_sidecar_mounts_the_app_volumes_next_to_its_own() {
    let client = client().await;
    let ns = webhook_cluster().namespace("sc-mounts").await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let app = unique_name("app");
    let name = unique_name("mounts");
    let mut set = single_sidecar_set(&name, &app, &ns);
    set["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "nginx-volume", "mountPath": "/nginx-volume"}]);
    set["spec"]["volumes"] = json!([{"name": "nginx-volume", "emptyDir": {}}]);
    create_sidecarset(&client, &set).await;
    let mut template = base_pod("web", &app);
    template["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "main-volume", "mountPath": "/main-volume"}]);
    template["spec"]["volumes"] = json!([{"name": "main-volume", "emptyDir": {}}]);
    let pod = admit_until(&pods, &template, "the pod to be injected", |p| {
        injected_by(p, &name)
    })
    .await;

    assert_eq!(volume_names(&pod), ["main-volume", "nginx-volume"]);
    let sidecar = &containers(&pod)[0];
    assert_eq!(sidecar.name, "nginx-sidecar");
    assert_eq!(mount_paths(sidecar), ["/nginx-volume", "/main-volume"]);
    assert_eq!(mount_paths(container(&pod, "main")), ["/main-volume"]);
}

/// Upstream item 5, "volumeMounts, SubPathExpr with expanded subpath": a shared mount's
/// `subPathExpr` needs the variables it names, so the sidecar gets them from the app container.
#[tokio::test]
async fn a_shared_subpath_expr_mount_brings_the_variables_it_expands() {
    let client = client().await;
    let ns = webhook_cluster().namespace("sc-subpath").await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let app = unique_name("app");
    let name = unique_name("subpath");
    let mut set = single_sidecar_set(&name, &app, &ns);
    set["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "nginx-volume", "mountPath": "/nginx-volume"}]);
    set["spec"]["volumes"] = json!([{"name": "nginx-volume", "emptyDir": {}}]);
    create_sidecarset(&client, &set).await;
    let mut template = base_pod("web", &app);
    template["spec"]["containers"][0]["volumeMounts"] = json!([{
        "name": "main-volume",
        "mountPath": "/main-volume",
        "subPathExpr": "foo/$(POD_NAME)/$(OD_NAME)/conf",
    }]);
    template["spec"]["containers"][0]["env"] = json!([
        {"name": "POD_NAME", "value": "bar"},
        {"name": "OD_NAME", "value": "od_name"},
        {"name": "UNRELATED", "value": "x"},
    ]);
    template["spec"]["volumes"] = json!([{"name": "main-volume", "emptyDir": {}}]);
    let pod = admit_until(&pods, &template, "the pod to be injected", |p| {
        injected_by(p, &name)
    })
    .await;

    assert_eq!(volume_names(&pod), ["main-volume", "nginx-volume"]);
    let sidecar = &containers(&pod)[0];
    assert_eq!(mount_paths(sidecar), ["/nginx-volume", "/main-volume"]);
    let shared = sidecar
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == "/main-volume")
        .expect("shared mount");
    assert_eq!(
        shared.sub_path_expr.as_deref(),
        Some("foo/$(POD_NAME)/$(OD_NAME)/conf")
    );
    assert_eq!(env_value(sidecar, "POD_NAME"), Some("bar"));
    assert_eq!(env_value(sidecar, "OD_NAME"), Some("od_name"));
    assert_eq!(
        env_value(sidecar, "UNRELATED"),
        None,
        "only the variables the expression names"
    );
}

/// The sidecar of upstream's transferEnv cases: its own `OD_NAME` and `SidecarName`.
fn transfer_env_set(name: &str, app: &str, ns: &str, transfer: Value) -> Value {
    let mut set = single_sidecar_set(name, app, ns);
    set["spec"]["containers"][0]["env"] = json!([
        {"name": "OD_NAME", "value": "sidecar_name"},
        {"name": "SidecarName", "value": "nginx-sidecar"},
    ]);
    set["spec"]["containers"][0]["transferEnv"] = transfer;
    set
}

/// The pod of upstream's transferEnv cases: `main` defines the three variables.
fn transfer_env_pod(app: &str) -> Value {
    let mut pod = base_pod("web", app);
    pod["spec"]["containers"][0]["env"] = json!([
        {"name": "POD_NAME", "value": "bar"},
        {"name": "OD_NAME", "value": "od_name"},
        {"name": "PROXY_IP", "value": "127.0.0.1"},
    ]);
    pod
}

/// What upstream expects of the sidecar in every transferEnv case: the transferred variables,
/// except `OD_NAME`, which the sidecar defines itself.
fn assert_transferred(pod: &Pod) {
    assert_eq!(names(containers(pod)), ["nginx-sidecar", "main"]);
    let sidecar = &containers(pod)[0];
    for (key, value) in [
        ("POD_NAME", "bar"),
        ("OD_NAME", "sidecar_name"),
        ("PROXY_IP", "127.0.0.1"),
        ("SidecarName", "nginx-sidecar"),
    ] {
        assert_eq!(env_value(sidecar, key), Some(value), "{key}: {sidecar:?}");
    }
    let od_names = sidecar
        .env
        .iter()
        .flatten()
        .filter(|e| e.name == "OD_NAME")
        .count();
    assert_eq!(od_names, 1, "the sidecar's own variable is not duplicated");
}

/// Upstream item 6, "sidecarSet inject pod sidecar container transfer Envs".
#[tokio::test]
async fn transfer_env_copies_the_app_variables_the_sidecar_lacks() {
    let client = client().await;
    let ns = webhook_cluster().namespace("sc-transfer").await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let app = unique_name("app");
    let name = unique_name("transfer");
    let transfer = json!([
        {"sourceContainerName": "main", "envName": "POD_NAME"},
        {"sourceContainerName": "main", "envName": "OD_NAME"},
        {"sourceContainerName": "main", "envName": "PROXY_IP"},
    ]);
    create_sidecarset(&client, &transfer_env_set(&name, &app, &ns, transfer)).await;
    let pod = admit_until(
        &pods,
        &transfer_env_pod(&app),
        "the pod to be injected",
        |p| injected_by(p, &name),
    )
    .await;
    assert_transferred(&pod);
}

/// Upstream items 7 and 8, "transfer Envs with downward API by metadata.labels / annotations":
/// the source container is named by a pod label or annotation.
async fn transfer_env_from_field(field_path: &str, pod_metadata: Value) {
    let client = client().await;
    let ns = webhook_cluster().namespace("sc-transfer-from").await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let app = unique_name("app");
    let name = unique_name("transfer-from");
    let transfer = json!([{
        "sourceContainerNameFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": field_path}},
        "envNames": ["POD_NAME", "OD_NAME", "PROXY_IP"],
    }]);
    create_sidecarset(&client, &transfer_env_set(&name, &app, &ns, transfer)).await;
    let mut template = transfer_env_pod(&app);
    for (key, value) in pod_metadata.as_object().expect("metadata") {
        let target = template["metadata"]
            .as_object_mut()
            .expect("metadata")
            .entry(key.clone())
            .or_insert_with(|| json!({}));
        for (k, v) in value.as_object().expect("a map") {
            target[k] = v.clone();
        }
    }
    let pod = admit_until(&pods, &template, "the pod to be injected", |p| {
        injected_by(p, &name)
    })
    .await;
    assert_transferred(&pod);
}

/// Upstream item 7.
#[tokio::test]
async fn transfer_env_source_container_from_a_pod_label() {
    transfer_env_from_field("metadata.labels['biz']", json!({"labels": {"biz": "main"}})).await;
}

/// Upstream item 8.
#[tokio::test]
async fn transfer_env_source_container_from_a_pod_annotation() {
    transfer_env_from_field(
        "metadata.annotations['biz']",
        json!({"annotations": {"biz": "main"}}),
    )
    .await;
}

// --- Upgrade functionality [SidecarSetUpgrade], the injection side --------------------------

/// Adds `rule` to (`add`) or removes it from the patch-metadata whitelist in the manager's
/// namespace, creating the namespace and the ConfigMap when missing and keeping other tests'
/// rules; read-modify-write, retried while a concurrent writer interferes.
pub(crate) async fn whitelist_rule(client: &Client, rule: Value, add: bool) {
    if add {
        crate::sidecarset_upgrade::ensure_manager_namespace(client).await;
    }
    let configmaps = Api::<ConfigMap>::namespaced(client.clone(), MANAGER_NAMESPACE);
    wait_for(
        "the whitelist ConfigMap to be written",
        CACHE_TIMEOUT,
        || {
            let (configmaps, rule) = (&configmaps, &rule);
            async move {
                let existing = configmaps
                    .get_opt(WHITELIST_CONFIGMAP)
                    .await
                    .expect("reading the whitelist ConfigMap");
                let mut whitelist: Value = existing
                    .as_ref()
                    .and_then(|c| c.data.as_ref())
                    .and_then(|d| d.get(WHITELIST_KEY))
                    .map(|text| serde_json::from_str(text).expect("the whitelist is JSON"))
                    .unwrap_or_else(|| json!({"rules": []}));
                let rules = whitelist["rules"].as_array_mut().expect("rules");
                rules.retain(|r| r != rule);
                if add {
                    rules.push(rule.clone());
                }
                let data = BTreeMap::from([(WHITELIST_KEY.to_owned(), whitelist.to_string())]);
                let result = match existing {
                    Some(mut configmap) => {
                        configmap.data = Some(data);
                        configmaps
                            .replace(WHITELIST_CONFIGMAP, &PostParams::default(), &configmap)
                            .await
                    }
                    None if !add => return Some(()),
                    None => {
                        let configmap = ConfigMap {
                            metadata: ObjectMeta {
                                name: Some(WHITELIST_CONFIGMAP.to_owned()),
                                ..ObjectMeta::default()
                            },
                            data: Some(data),
                            ..ConfigMap::default()
                        };
                        configmaps.create(&PostParams::default(), &configmap).await
                    }
                };
                match result {
                    Ok(_) => Some(()),
                    Err(kube::Error::Api(s)) if s.code == 409 => None,
                    Err(e) => panic!("writing the whitelist ConfigMap: {e}"),
                }
            }
        },
    )
    .await;
}

/// Upstream item 9, "sidecarSet patch pod metadata" (the injection half; the in-place update
/// half needs the controller): `patchPodMetadata` needs the administrator's whitelist, and then
/// merges its JSON into the pod's annotation.
#[tokio::test]
async fn patch_pod_metadata_is_whitelisted_then_merged_into_pods() {
    let client = client().await;
    let ns = webhook_cluster().namespace("sc-patch").await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let app = unique_name("app");
    let name = unique_name("patch");
    let mut set = single_sidecar_set(&name, &app, &ns);
    set["metadata"]["labels"] = json!({"kruise-rs-test-patch": &name});
    set["spec"]["patchPodMetadata"] = json!([
        {"patchPolicy": "MergePatchJson", "annotations": {"key": "{\"nginx-sidecar\":1}"}},
        {"patchPolicy": "Retain", "annotations": {"retained": "sidecar"}},
    ]);
    let rule = json!({
        "selector": {"matchLabels": {"kruise-rs-test-patch": &name}},
        "allowedAnnotationKeyExprs": ["^key$", "^retained$"],
    });

    // No rule for this SidecarSet's labels yet: denied.
    let parsed: SidecarSet = serde_json::from_value(set.clone()).expect("SidecarSet");
    match sidecarsets(&client)
        .create(&PostParams::default(), &parsed)
        .await
    {
        Err(kube::Error::Api(s)) => {
            assert!(s.message.contains("spec.patchPodMetadata"), "{}", s.message)
        }
        other => panic!("patchPodMetadata without a whitelist should be denied: {other:?}"),
    }

    whitelist_rule(&client, rule.clone(), true).await;
    // A key the rule does not allow is still denied.
    let mut other_key = set.clone();
    other_key["metadata"]["name"] = json!(unique_name("patch-denied"));
    other_key["spec"]["patchPodMetadata"][1]["annotations"] = json!({"not-allowed": "x"});
    let parsed: SidecarSet = serde_json::from_value(other_key).expect("SidecarSet");
    match sidecarsets(&client)
        .create(&PostParams::default(), &parsed)
        .await
    {
        Err(kube::Error::Api(s)) => assert!(s.message.contains("not-allowed"), "{}", s.message),
        other => panic!("a key outside the whitelist should be denied: {other:?}"),
    }
    create_sidecarset(&client, &set).await;

    let fresh = admit_until(
        &pods,
        &base_pod("fresh", &app),
        "the pod to be injected",
        |p| injected_by(p, &name),
    )
    .await;
    assert_eq!(image(&containers(&fresh)[0]), "nginx:1.25");
    assert_eq!(fresh.annotations()["key"], r#"{"nginx-sidecar":1}"#);
    assert_eq!(fresh.annotations()["retained"], "sidecar");

    // A pod with both annotations already: JSON merged (keys sorted, as Go writes them), the
    // Retain value kept.
    let mut template = base_pod("annotated", &app);
    template["metadata"]["annotations"] = json!({"key": "{\"main\":{\"a\":1}}", "retained": "pod"});
    let annotated = admit(&pods, &template).await;
    assert!(injected_by(&annotated, &name), "{annotated:?}");
    assert_eq!(
        annotated.annotations()["key"],
        r#"{"main":{"a":1},"nginx-sidecar":1}"#
    );
    assert_eq!(annotated.annotations()["retained"], "pod");

    whitelist_rule(&client, rule, false).await;
}

/// Upstream item 21, "sidecarSet InjectionStrategy.Revision checker": with six recorded
/// versions, pinning one by `customVersion` (or by `revisionName`) gives new pods that
/// version's sidecars and records its ControllerRevision on the pod.
#[tokio::test]
async fn injection_strategy_revision_pins_new_pods_to_a_recorded_version() {
    let client = client().await;
    let ns = webhook_cluster().namespace("sc-revision").await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let app = unique_name("app");
    let name = unique_name("revision");
    let tags = ["latest", "1.21.1", "1.21", "1.20.1", "1.20", "1.19.10"];
    let nginx = |tag: &str| format!("nginx:{tag}");

    let mut spec = base_sidecarset(&name, &app, &ns);
    spec["spec"]["customVersion"] = json!("0");
    spec["spec"]["updateStrategy"] = json!({"paused": true});
    spec["spec"]["containers"][0]["image"] = json!(nginx(tags[0]));
    let mut set = create_sidecarset(&client, &spec).await;
    // (revision name, hash) of each version.
    let mut versions = Vec::new();
    for (i, tag) in tags.iter().enumerate() {
        if i > 0 {
            spec["spec"]["containers"][0]["image"] = json!(nginx(tag));
            spec["spec"]["customVersion"] = json!(i.to_string());
            set = patch_sidecarset(&client, &name, json!({"spec": spec["spec"].clone()})).await;
        }
        let revision = record_revision(&client, &set, i as i64 + 1).await;
        set_latest_revision(&client, &name, &revision.name_any()).await;
        versions.push((revision.name_any(), hash_of(&set)));
    }
    let hashes: std::collections::BTreeSet<&String> = versions.iter().map(|(_, h)| h).collect();
    assert_eq!(hashes.len(), tags.len(), "every image is a new hash");

    let pick = 3;
    patch_sidecarset(
        &client,
        &name,
        json!({"spec": {"injectionStrategy": {"revision": {"customVersion": pick.to_string(), "policy": "Always"}}}}),
    )
    .await;
    let pod = admit_until(
        &pods,
        &base_pod("pinned", &app),
        "a pod injected at the pinned custom version",
        |p| recorded_revision(p, &name) == versions[pick].0,
    )
    .await;
    assert_eq!(image(&containers(&pod)[0]), nginx(tags[pick]));
    let entry = hash_entry(&pod, HASH, &name).expect("entry");
    assert_eq!(entry["hash"].as_str(), Some(versions[pick].1.as_str()));
    assert_eq!(
        names(containers(&pod)),
        ["nginx-sidecar", "main", "busybox-sidecar"]
    );

    // By name instead: merged into the pin above, revisionName wins over customVersion.
    let pinned = patch_sidecarset(
        &client,
        &name,
        json!({"spec": {"injectionStrategy": {"revision": {"revisionName": &versions[1].0}}}}),
    )
    .await;
    let revision = pinned.spec.injection_strategy.revision.expect("pinned");
    assert_eq!(revision.custom_version, Some(pick.to_string()));
    let pod = admit_until(
        &pods,
        &base_pod("by-name", &app),
        "a pod injected at the pinned revision name",
        |p| recorded_revision(p, &name) == versions[1].0,
    )
    .await;
    assert_eq!(image(&containers(&pod)[0]), nginx(tags[1]));

    // Unpinned: the latest version, recorded as status.latestRevision.
    patch_sidecarset(
        &client,
        &name,
        json!({"spec": {"injectionStrategy": {"revision": null}}}),
    )
    .await;
    let latest = tags.len() - 1;
    let pod = admit_until(
        &pods,
        &base_pod("latest", &app),
        "a pod injected at the latest version",
        |p| recorded_revision(p, &name) == versions[latest].0,
    )
    .await;
    assert_eq!(image(&containers(&pod)[0]), nginx(tags[latest]));
    assert_eq!(
        hash_entry(&pod, HASH, &name).expect("entry")["hash"].as_str(),
        Some(versions[latest].1.as_str())
    );
}

/// Upstream item 22, "sidecarSet inject pod sidecar during canary upgrades": with the `Partial`
/// policy pinned to the stable version, new pods matching `updateStrategy.selector` get the
/// canary (latest) sidecar and the others the stable one. Then, without a selector, a
/// percentage partition is the share of pods kept on the pinned version (0% and 100% are
/// certain).
#[tokio::test]
async fn partial_injection_gives_the_canary_only_to_selected_pods() {
    let client = client().await;
    let ns = webhook_cluster().namespace("sc-canary-upgrade").await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let app = unique_name("app");
    let name = unique_name("partial");
    let (stable, canary) = ("nginx:1.20.1", "nginx:1.21.1");
    let template = |version: &str| {
        let mut pod = base_pod(version, &app);
        pod["metadata"]["labels"]["version"] = json!(version);
        pod
    };

    let mut spec = single_sidecar_set(&name, &app, &ns);
    spec["spec"]["customVersion"] = json!("0");
    spec["spec"]["containers"][0]["image"] = json!(stable);
    spec["spec"]["updateStrategy"] = json!({"type": "RollingUpdate"});
    let set = create_sidecarset(&client, &spec).await;
    let stable_hash = hash_of(&set);
    let stable_revision = record_revision(&client, &set, 1).await.name_any();
    set_latest_revision(&client, &name, &stable_revision).await;
    for version in ["stable", "canary"] {
        let pod = admit_until(
            &pods,
            &template(version),
            "a pod injected with the first version",
            |p| recorded_revision(p, &name) == stable_revision,
        )
        .await;
        assert_eq!(image(&containers(&pod)[0]), stable, "{version}");
    }

    // The canary update: a new image (and env, so no in-place update could do it), new pods
    // pinned to custom version 0 unless they match the update selector.
    spec["spec"]["containers"][0]["image"] = json!(canary);
    spec["spec"]["containers"][0]["env"] = json!([{"name": "SOME_ENV", "value": "SOME_VAL"}]);
    spec["spec"]["updateStrategy"]["selector"] = json!({"matchLabels": {"version": "canary"}});
    spec["spec"]["injectionStrategy"] =
        json!({"revision": {"customVersion": "0", "policy": "Partial"}});
    spec["spec"]["customVersion"] = json!("1");
    let set = patch_sidecarset(&client, &name, json!({"spec": spec["spec"].clone()})).await;
    let canary_revision = record_revision(&client, &set, 2).await.name_any();
    set_latest_revision(&client, &name, &canary_revision).await;

    // The canary pod first: once it gets the latest version, the cache holds the update, and
    // the stable pod's outcome is the policy's doing.
    let canary_pod = admit_until(
        &pods,
        &template("canary"),
        "a selected pod injected with the canary",
        |p| recorded_revision(p, &name) == canary_revision,
    )
    .await;
    let sidecar = &containers(&canary_pod)[0];
    assert_eq!(image(sidecar), canary);
    assert_eq!(env_value(sidecar, "SOME_ENV"), Some("SOME_VAL"));
    let stable_pod = admit(&pods, &template("stable")).await;
    assert_eq!(recorded_revision(&stable_pod, &name), stable_revision);
    let sidecar = &containers(&stable_pod)[0];
    assert_eq!(image(sidecar), stable);
    assert_eq!(env_value(sidecar, "SOME_ENV"), None, "{sidecar:?}");
    assert_eq!(
        hash_entry(&stable_pod, HASH, &name).expect("entry")["hash"].as_str(),
        Some(stable_hash.as_str()),
        "the pinned revision's hash"
    );

    // No selector, partition 100%: every new pod keeps the pinned version, the canary too.
    patch_sidecarset(
        &client,
        &name,
        json!({"spec": {"updateStrategy": {"selector": null, "partition": "100%"}}}),
    )
    .await;
    let pod = admit_until(
        &pods,
        &template("canary"),
        "a canary-labelled pod kept on the pinned version by partition 100%",
        |p| recorded_revision(p, &name) == stable_revision,
    )
    .await;
    assert_eq!(image(&containers(&pod)[0]), stable);
    // Partition 0%: every new pod gets the latest, the stable ones too.
    patch_sidecarset(
        &client,
        &name,
        json!({"spec": {"updateStrategy": {"partition": "0%"}}}),
    )
    .await;
    let pod = admit_until(
        &pods,
        &template("stable"),
        "a stable-labelled pod given the latest version by partition 0%",
        |p| recorded_revision(p, &name) == canary_revision,
    )
    .await;
    assert_eq!(image(&containers(&pod)[0]), canary);
}

/// Upstream item 23 (v1beta1 only), "inject pod sidecar with canary sidecarSet": a SidecarSet
/// annotated as the canary of a base replaces the base for the pods both select. Beyond
/// upstream: once the canary is deleted, new pods get the base again.
#[tokio::test]
async fn a_canary_sidecarset_replaces_its_base() {
    let client = client().await;
    let ns = webhook_cluster().namespace("sc-canary").await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let app = unique_name("app");
    let (stable, canary) = ("nginx:1.20.1", "nginx:1.21.1");
    let base_name = unique_name("base");
    let canary_name = unique_name("canary");
    let mut base = single_sidecar_set(&base_name, &app, &ns);
    base["spec"]["containers"][0]["image"] = json!(stable);
    base["spec"]["updateStrategy"] = json!({"type": "NotUpdate"});
    create_sidecarset(&client, &base).await;
    // The same container name: without the base dropped, the pod could not hold both.
    let mut canary_set = single_sidecar_set(&canary_name, &app, &ns);
    canary_set["metadata"]["annotations"] = json!({
        "apps.kruise.io/sidecarset-canary": "true",
        "apps.kruise.io/sidecarset-base": &base_name,
    });
    canary_set["spec"]["containers"][0]["image"] = json!(canary);
    canary_set["spec"]["updateStrategy"] = json!({"type": "NotUpdate"});
    // The validating webhook looks the base up in its cache: retry while it is not there yet.
    let parsed: SidecarSet = serde_json::from_value(canary_set).expect("SidecarSet");
    wait_for(
        "the canary SidecarSet to be admitted",
        CACHE_TIMEOUT,
        || async {
            match sidecarsets(&client)
                .create(&PostParams::default(), &parsed)
                .await
            {
                Ok(_) => Some(()),
                Err(kube::Error::Api(s)) if s.message.contains("does not exist") => None,
                Err(e) => panic!("creating the canary SidecarSet: {e}"),
            }
        },
    )
    .await;

    let mut template = base_pod("web", &app);
    template["metadata"]["labels"]["version"] = json!("stable");
    for _ in 0..2 {
        let pod = admit_until(&pods, &template, "a pod injected by the canary", |p| {
            injected_by(p, &canary_name)
        })
        .await;
        assert_eq!(names(containers(&pod)), ["nginx-sidecar", "main"]);
        assert_eq!(image(&containers(&pod)[0]), canary);
        assert!(!injected_by(&pod, &base_name), "{:?}", pod.annotations());
        assert_eq!(pod.annotations()[INJECTED_LIST], canary_name);
    }

    sidecarsets(&client)
        .delete(&canary_name, &DeleteParams::default())
        .await
        .expect("deleting the canary");
    let pod = admit_until(&pods, &template, "a pod injected by the base again", |p| {
        injected_by(p, &base_name)
    })
    .await;
    assert_eq!(image(&containers(&pod)[0]), stable);
    assert_eq!(pod.annotations()[INJECTED_LIST], base_name);
}
