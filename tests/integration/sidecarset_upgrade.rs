//! Upstream's SidecarSet upgrade e2e scenarios (kruise.md §9.2 items 10–20, `sidecarset.go`
//! Context "SidecarSet Upgrade functionality"), run against the SidecarSet controller of the
//! manager in the webhook test cluster (`support::webhook`).
//!
//! How they differ from upstream's, on purpose:
//! - Bare pods created one by one through the pod webhook instead of Deployments, and no
//!   kubelet: the tests report pod and container status themselves (`support::kubelet`). A
//!   "kubelet pass" restarts every container whose spec image changed on its new image, except
//!   [`BAD_IMAGE`], which fails to pull (`ErrImagePull`, pod not Ready). Tests that must see
//!   the controller's step before any restart leave the kubelet off for a while.
//! - Upstream sleeps and then checks the status once; here each step polls, with a deadline,
//!   until the SidecarSet's status describes the current generation (`observedGeneration`)
//!   with the expected counts and conditions, and the pods are in the expected state. A
//!   state that must *not* change (paused, partition, selector, a non-image change) is checked
//!   once the status shows the controller has seen it and why it holds (`RolloutHeld`).
//! - The SidecarSets carry the label the cluster's controllers are confined to
//!   ([`CONTROLLED_LABEL`]) and select only their test's namespace and pods.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::{Event, Namespace, Pod, PodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kruise_rs_api::sidecarset::SidecarSet;
use kruise_rs_api::well_known::{
    SIDECARSET_CUSTOM_VERSION_LABEL, SIDECARSET_HASH, SIDECARSET_HASH_WITHOUT_IMAGE,
    SIDECARSET_INJECTED_LIST, SIDECARSET_INPLACE_UPDATE_STATE, SIDECARSET_NAME_LABEL,
    SIDECARSET_UPGRADABLE_CONDITION,
};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::support::kubelet;
use crate::support::webhook::{MANAGER_NAMESPACE, webhook_cluster};
use crate::support::{CONTROLLED_LABEL, unique_name};
use crate::webhook_scenarios::whitelist_rule;

/// How long the webhook's caches may take to show a write.
pub(crate) const CACHE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one step of a rollout may take.
pub(crate) const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(60);

/// The sidecar image pods are injected with.
pub(crate) const OLD_IMAGE: &str = "nginx:1.25";
/// The image the sidecar is upgraded to.
pub(crate) const NEW_IMAGE: &str = "nginx:1.27";
/// An image the test kubelet never manages to pull.
const BAD_IMAGE: &str = "nginx:kruise-rs-no-such-tag";
/// The sidecar container of [`one_sidecar_set`].
pub(crate) const SIDECAR: &str = "nginx-sidecar";

pub(crate) const ROLLOUT_HELD: &str = "RolloutHeld";
pub(crate) const PODS_UPGRADABLE: &str = "PodsUpgradable";

// --- SidecarSets and pods ----------------------------------------------------------------------

pub(crate) async fn client() -> Client {
    webhook_cluster().client().await
}

fn sidecarsets(client: &Client) -> Api<SidecarSet> {
    Api::all(client.clone())
}

fn revisions(client: &Client) -> Api<ControllerRevision> {
    Api::namespaced(client.clone(), MANAGER_NAMESPACE)
}

/// Creates the manager's namespace, where the controller keeps ControllerRevisions, unless it
/// exists (a real installation has it; here whichever test comes first makes it).
pub(crate) async fn ensure_manager_namespace(client: &Client) {
    crate::harness::objects::create_namespace(client, MANAGER_NAMESPACE, &[])
        .await
        .unwrap_or_else(|e| panic!("creating namespace {MANAGER_NAMESPACE}: {e}"));
}

/// Upstream's `NewBaseSidecarSet`: an init container, a `BeforeAppContainer` sidecar sharing
/// the pod's volumes and an `AfterAppContainer` one; selecting pods labelled `app: <app>` in
/// namespace `ns` only; labelled for the test cluster's controllers.
fn base_sidecarset(name: &str, app: &str, ns: &str) -> Value {
    json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "SidecarSet",
        "metadata": {"name": name, "labels": {CONTROLLED_LABEL: name}},
        "spec": {
            "selector": {"matchLabels": {"app": app}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "updateStrategy": {"type": "RollingUpdate"},
            "initContainers": [{
                "name": "init-sidecar",
                "image": "busybox:1.36",
                "command": ["/bin/sh", "-c", "sleep 1"],
            }],
            "containers": [
                {
                    "name": SIDECAR,
                    "image": OLD_IMAGE,
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

/// [`base_sidecarset`] with only its first sidecar, as most upstream cases use it.
pub(crate) fn one_sidecar_set(name: &str, app: &str, ns: &str) -> Value {
    let mut set = base_sidecarset(name, app, ns);
    set["spec"]["containers"]
        .as_array_mut()
        .expect("containers")
        .truncate(1);
    set
}

/// The pod of upstream's `NewBaseDeployment`: one container `main`, labelled `app: <app>`.
pub(crate) fn base_pod(app: &str) -> Value {
    json!({
        "metadata": {"name": "web", "labels": {"app": app}},
        "spec": {"containers": [{
            "name": "main",
            "image": "busybox:1.36",
            "command": ["/bin/sh", "-c", "sleep 10000000"],
        }]}
    })
}

pub(crate) async fn create_sidecarset(client: &Client, set: &Value) -> SidecarSet {
    let set: SidecarSet = serde_json::from_value(set.clone()).expect("a SidecarSet");
    let name = set.name_any();
    sidecarsets(client)
        .create(&PostParams::default(), &set)
        .await
        .unwrap_or_else(|e| panic!("creating SidecarSet {name}: {e}"))
}

/// Merges `spec` into SidecarSet `name`'s spec (lists such as `containers` are replaced whole).
pub(crate) async fn update_spec(client: &Client, name: &str, spec: Value) -> SidecarSet {
    let patch = json!({ "spec": spec });
    sidecarsets(client)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("updating SidecarSet {name} with {patch}: {e}"))
}

pub(crate) async fn get_set(client: &Client, name: &str) -> SidecarSet {
    sidecarsets(client)
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("reading SidecarSet {name}: {e}"))
}

pub(crate) fn hash_of(set: &SidecarSet) -> String {
    annotation(set, SIDECARSET_HASH)
}

fn annotation(set: &SidecarSet, key: &str) -> String {
    set.annotations()
        .get(key)
        .cloned()
        .unwrap_or_else(|| panic!("SidecarSet {} has no annotation {key}", set.name_any()))
}

/// The pod's entry for SidecarSet `set` in the JSON map annotation `key`, if any.
pub(crate) fn pod_entry(pod: &Pod, key: &str, set: &str) -> Option<Value> {
    let text = pod.annotations().get(key)?;
    let map: Value = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("annotation {key} is not JSON ({e}): {text}"));
    map.get(set).cloned()
}

/// The hash the pod records for SidecarSet `set` ("" when none).
pub(crate) fn pod_hash(pod: &Pod, set: &str) -> String {
    pod_entry(pod, SIDECARSET_HASH, set)
        .and_then(|e| e["hash"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// The spec image of container `container` ("" when the pod has no such container).
pub(crate) fn spec_image(pod: &Pod, container: &str) -> String {
    pod.spec
        .iter()
        .flat_map(|s| &s.containers)
        .find(|c| c.name == container)
        .and_then(|c| c.image.clone())
        .unwrap_or_default()
}

fn container_names(pod: &Pod) -> Vec<String> {
    pod.spec
        .iter()
        .flat_map(|s| &s.containers)
        .map(|c| c.name.clone())
        .collect()
}

/// Creates `count` pods of `app`, 8 at a time, each admitted with the current version of `set`
/// (see [`admit_injected`]) and started by the played kubelet.
pub(crate) async fn start_injected_pods(
    pods: &Api<Pod>,
    app: &str,
    set: &SidecarSet,
    count: usize,
) {
    use futures::StreamExt;
    let started = futures::stream::iter(0..count)
        .map(|_| async move {
            let pod = admit_injected(pods, &base_pod(app), &[set]).await;
            kubelet::start(pods, &pod.name_any()).await;
        })
        .buffer_unordered(8)
        .count()
        .await;
    assert_eq!(started, count);
}

/// Creates a pod from `template` (with a `generateName`) until the admitted pod carries the
/// current version of every SidecarSet in `sets`, deleting each one that does not: the
/// webhook's cache may not show the latest SidecarSet write yet.
pub(crate) async fn admit_injected(pods: &Api<Pod>, template: &Value, sets: &[&SidecarSet]) -> Pod {
    let expected: Vec<(String, String)> = sets.iter().map(|s| (s.name_any(), hash_of(s))).collect();
    let expected = &expected;
    poll(
        "a pod injected with the current version of its SidecarSets",
        CACHE_TIMEOUT,
        move || async move {
            let mut pod: Pod = serde_json::from_value(template.clone()).expect("a pod");
            let prefix = pod.metadata.name.take().unwrap_or_else(|| "pod".to_owned());
            pod.metadata.generate_name = Some(format!("{prefix}-"));
            let created = pods
                .create(&PostParams::default(), &pod)
                .await
                .unwrap_or_else(|e| panic!("creating a pod {prefix}-*: {e}"));
            let recorded: Vec<(String, String)> = expected
                .iter()
                .map(|(set, _)| (set.clone(), pod_hash(&created, set)))
                .collect();
            if &recorded == expected {
                return Ok(created);
            }
            let _ = pods
                .delete(&created.name_any(), &DeleteParams::default())
                .await;
            Err(format!(
                "a pod recording {recorded:?}, expected {expected:?}"
            ))
        },
    )
    .await
}

/// Polls `f` until it returns `Ok`, at short intervals; once `timeout` has passed, panics
/// naming `what` and the last `Err` (what was seen instead).
pub(crate) async fn poll<F, Fut, T>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut interval = Duration::from_millis(20);
    let mut last = "nothing (no attempt finished)".to_owned();
    loop {
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(remaining, f()).await {
            Ok(Ok(value)) => return value,
            Ok(Err(seen)) => last = seen,
            Err(_) => {}
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}; last seen: {last}");
        }
        tokio::time::sleep(interval.min(remaining)).await;
        interval = (interval * 2).min(Duration::from_millis(250));
    }
}

// --- Reading a rollout -------------------------------------------------------------------------

/// The four pod counts of a SidecarSet's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Counts {
    pub matched: i32,
    pub updated: i32,
    pub ready: i32,
    pub updated_ready: i32,
}

/// `matched/updated/ready/updatedReady`, the order upstream's e2e lists them in.
pub(crate) const fn counts(matched: i32, updated: i32, ready: i32, updated_ready: i32) -> Counts {
    Counts {
        matched,
        updated,
        ready,
        updated_ready,
    }
}

pub(crate) fn counts_of(set: &SidecarSet) -> Counts {
    let status = set.status.clone().unwrap_or_default();
    counts(
        status.matched_pods,
        status.updated_pods,
        status.ready_pods,
        status.updated_ready_pods,
    )
}

pub(crate) fn condition<'s>(set: &'s SidecarSet, type_: &str) -> Option<&'s Condition> {
    set.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
}

/// `Ok` when the SidecarSet's condition `type_` has `status` and `reason`.
pub(crate) fn expect_condition(
    set: &SidecarSet,
    type_: &str,
    status: &str,
    reason: &str,
) -> Result<(), String> {
    match condition(set, type_) {
        Some(c) if c.status == status && c.reason == reason => Ok(()),
        other => Err(format!(
            "condition {type_} {status}/{reason} wanted, found {other:?}"
        )),
    }
}

/// `RolloutHeld` False/`Updated`: every pod that can be upgraded in place is.
pub(crate) fn rollout_done(set: &SidecarSet) -> Result<(), String> {
    expect_condition(set, ROLLOUT_HELD, "False", "Updated")
}

fn describe_conditions(set: &SidecarSet) -> String {
    let conditions = set.status.iter().flat_map(|s| &s.conditions);
    let parts: Vec<String> = conditions
        .map(|c| format!("{}={}/{} ({:?})", c.type_, c.status, c.reason, c.message))
        .collect();
    format!("[{}]", parts.join("; "))
}

/// One line about the SidecarSet's status.
pub(crate) fn describe_set(set: &SidecarSet) -> String {
    let status = set.status.clone().unwrap_or_default();
    format!(
        "SidecarSet {} generation {:?}: observedGeneration {:?}, matched/updated/ready/updatedReady {}/{}/{}/{}, latestRevision {:?}, conditions {}",
        set.name_any(),
        set.metadata.generation,
        status.observed_generation,
        status.matched_pods,
        status.updated_pods,
        status.ready_pods,
        status.updated_ready_pods,
        status.latest_revision,
        describe_conditions(set),
    )
}

/// One line per pod: container `container`'s spec and reported image, and readiness.
pub(crate) fn describe_pods(pods: &[Pod], container: &str) -> String {
    let lines: Vec<String> = pods
        .iter()
        .map(|p| {
            let reported = p
                .status
                .iter()
                .flat_map(|s| s.container_statuses.iter().flatten())
                .find(|s| s.name == container)
                .map(|s| format!("{} ready={}", s.image, s.ready))
                .unwrap_or_else(|| "no status".to_owned());
            format!(
                "{}: {container} spec {} reported {reported}, pod ready={}",
                p.name_any(),
                spec_image(p, container),
                kubelet::pod_ready(p)
            )
        })
        .collect();
    lines.join("; ")
}

pub(crate) async fn list_pods(pods: &Api<Pod>) -> Vec<Pod> {
    let mut list = pods
        .list(&ListParams::default())
        .await
        .unwrap_or_else(|e| panic!("listing pods: {e}"))
        .items;
    list.sort_by_key(|p| p.name_any());
    list
}

/// Whether the test plays the kubelet while waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kubelet {
    /// Containers keep reporting what they reported.
    Off,
    /// Each poll, changed containers are restarted on their new image, or fail if it is
    /// [`BAD_IMAGE`].
    On,
}

fn is_bad(image: &str) -> bool {
    image == BAD_IMAGE
}

/// One test's namespace, pods and SidecarSet name.
pub(crate) struct Fixture {
    pub(crate) client: Client,
    pub(crate) ns: String,
    pub(crate) pods: Api<Pod>,
    pub(crate) app: String,
    pub(crate) name: String,
}

impl Fixture {
    pub(crate) async fn new(prefix: &str) -> Fixture {
        let client = client().await;
        ensure_manager_namespace(&client).await;
        let ns = webhook_cluster().namespace(prefix).await;
        Fixture {
            pods: Api::namespaced(client.clone(), &ns),
            client,
            ns,
            app: unique_name("app"),
            name: unique_name(prefix),
        }
    }

    /// Creates `n` pods injected with the current version of `sets` and starts them.
    async fn start_pods(&self, n: usize, sets: &[&SidecarSet]) -> Vec<String> {
        let mut names = Vec::new();
        for _ in 0..n {
            let pod = admit_injected(&self.pods, &base_pod(&self.app), sets).await;
            kubelet::start(&self.pods, &pod.name_any()).await;
            names.push(pod.name_any());
        }
        names
    }

    /// Waits until SidecarSet `set`'s status describes its current generation with `expected`
    /// counts and `check` accepts the SidecarSet and the namespace's pods; with
    /// [`Kubelet::On`], a kubelet pass runs before each look. Returns what was seen last.
    pub(crate) async fn wait_rollout(
        &self,
        set: &str,
        kubelet: Kubelet,
        expected: Counts,
        check: impl Fn(&SidecarSet, &[Pod]) -> Result<(), String>,
    ) -> (SidecarSet, Vec<Pod>) {
        let what = format!(
            "SidecarSet {set} to report {expected:?} for its current generation ({kubelet:?} kubelet)"
        );
        let check = &check;
        poll(&what, ROLLOUT_TIMEOUT, || async move {
            if kubelet == Kubelet::On {
                kubelet::sync(&self.pods, &is_bad).await;
            }
            let sidecarset = get_set(&self.client, set).await;
            let pods = list_pods(&self.pods).await;
            let seen = || {
                format!(
                    "{}; pods: {}",
                    describe_set(&sidecarset),
                    describe_pods(&pods, SIDECAR)
                )
            };
            let status = sidecarset.status.clone().unwrap_or_default();
            if status.observed_generation != sidecarset.metadata.generation
                || counts_of(&sidecarset) != expected
            {
                return Err(seen());
            }
            check(&sidecarset, &pods).map_err(|e| format!("{e}; {}", seen()))?;
            Ok((sidecarset, pods))
        })
        .await
    }
}

/// The pod's condition `type_`.
pub(crate) fn pod_condition<'p>(pod: &'p Pod, type_: &str) -> Option<&'p PodCondition> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == type_))
}

/// Waits until each pod of `names` has a `SidecarSetUpgradable` condition `check` accepts;
/// returns those pods.
async fn wait_upgradable_condition(
    pods: &Api<Pod>,
    names: &[String],
    what: &str,
    check: impl Fn(&PodCondition) -> bool,
) -> Vec<Pod> {
    let check = &check;
    poll(what, ROLLOUT_TIMEOUT, || async move {
        let list: Vec<Pod> = list_pods(pods)
            .await
            .into_iter()
            .filter(|p| names.contains(&p.name_any()))
            .collect();
        let conditions: Vec<_> = list
            .iter()
            .map(|p| {
                (
                    p.name_any(),
                    pod_condition(p, SIDECARSET_UPGRADABLE_CONDITION).cloned(),
                )
            })
            .collect();
        if list.len() == names.len()
            && conditions
                .iter()
                .all(|(_, c)| c.as_ref().is_some_and(check))
        {
            Ok(list)
        } else {
            Err(format!("pod conditions {conditions:?}"))
        }
    })
    .await
}

/// The upgradable map in a `SidecarSetUpgradable` condition's message.
fn upgradable_map(condition: &PodCondition) -> Value {
    let message = condition.message.as_deref().unwrap_or_default();
    serde_json::from_str(message).unwrap_or(Value::Null)
}

/// Checks the two hash annotations upstream checks on every pod: the entry names the
/// SidecarSet, records its current hash (and hash without image), and lists its sidecars.
fn assert_hash_entries(pods: &[Pod], set: &SidecarSet, sidecars: &[&str]) {
    let name = set.name_any();
    for pod in pods {
        for (key, hash) in [
            (SIDECARSET_HASH, hash_of(set)),
            (
                SIDECARSET_HASH_WITHOUT_IMAGE,
                annotation(set, SIDECARSET_HASH_WITHOUT_IMAGE),
            ),
        ] {
            let entry = pod_entry(pod, key, &name)
                .unwrap_or_else(|| panic!("pod {} has no {key} entry for {name}", pod.name_any()));
            assert_eq!(entry["sidecarSetName"], json!(name), "{key}: {entry}");
            assert_eq!(entry["hash"], json!(hash), "{key}: {entry}");
            assert_eq!(entry["sidecarList"], json!(sidecars), "{key}: {entry}");
        }
    }
}

fn pods_with_image(pods: &[Pod], image: &str) -> Vec<String> {
    pods.iter()
        .filter(|p| spec_image(p, SIDECAR) == image)
        .map(|p| p.name_any())
        .collect()
}

/// The SidecarSet's containers with container `index`'s `field` set to `value`.
fn containers_with(set: &mut Value, index: usize, field: &str, value: Value) -> Value {
    set["spec"]["containers"][index][field] = value;
    set["spec"]["containers"].clone()
}

// --- Upgrade functionality [SidecarSetUpgrade] --------------------------------------------------

/// Upstream item 10, "sidecarSet upgrade cold sidecar container image only": with
/// maxUnavailable 2 both pods get the new image in one round, and the pod patch touches only
/// the sidecar's image and the two upgrade annotations. A pod created before its namespace was
/// selected (never injected) is neither counted nor touched.
#[tokio::test]
async fn an_image_only_change_upgrades_every_pod_in_place() {
    let fx = Fixture::new("sc-up-image").await;
    let mut spec = one_sidecar_set(&fx.name, &fx.app, &fx.ns);
    spec["spec"]["updateStrategy"]["maxUnavailable"] = json!(2);
    spec["spec"]["namespaceSelector"]["matchLabels"]["inject"] = json!("sidecar");
    let set = create_sidecarset(&fx.client, &spec).await;

    // The namespace lacks `inject: sidecar` yet: this pod gets no sidecar.
    let mut early: Pod = serde_json::from_value(base_pod(&fx.app)).expect("pod");
    early.metadata.name = Some(unique_name("early"));
    let early = fx
        .pods
        .create(&PostParams::default(), &early)
        .await
        .expect("creating the early pod");
    assert_eq!(container_names(&early), ["main"]);
    assert!(
        !early.annotations().contains_key(SIDECARSET_INJECTED_LIST),
        "{early:?}"
    );
    kubelet::start(&fx.pods, &early.name_any()).await;
    Api::<Namespace>::all(fx.client.clone())
        .patch(
            &fx.ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"inject": "sidecar"}}})),
        )
        .await
        .expect("labelling the namespace");
    let names = fx.start_pods(2, &[&set]).await;
    let (_, before) = fx
        .wait_rollout(&fx.name, Kubelet::Off, counts(2, 2, 2, 2), |set, _| {
            rollout_done(set)?;
            expect_condition(set, PODS_UPGRADABLE, "True", "AllPodsUpgradable")
        })
        .await;

    let containers = containers_with(&mut spec, 0, "image", json!(NEW_IMAGE));
    let set = update_spec(&fx.client, &fx.name, json!({"containers": containers})).await;

    // maxUnavailable 2: both pods change before either restarts. Their sidecars do not run the
    // new image yet, so neither counts as ready.
    let names_ref = &names;
    fx.wait_rollout(&fx.name, Kubelet::Off, counts(2, 2, 0, 0), |_, pods| {
        let upgraded = pods_with_image(pods, NEW_IMAGE);
        if upgraded.len() == names_ref.len() {
            Ok(())
        } else {
            Err(format!("pods on {NEW_IMAGE}: {upgraded:?}"))
        }
    })
    .await;
    let (set_now, after) = fx
        .wait_rollout(&fx.name, Kubelet::On, counts(2, 2, 2, 2), |set, _| {
            rollout_done(set)
        })
        .await;
    let latest = set_now
        .status
        .as_ref()
        .and_then(|s| s.latest_revision.clone())
        .expect("status.latestRevision");
    let revision = revisions(&fx.client)
        .get(&latest)
        .await
        .unwrap_or_else(|e| panic!("status.latestRevision {latest} names no revision: {e}"));
    assert_eq!(
        revision.labels().get(SIDECARSET_NAME_LABEL),
        Some(&fx.name),
        "{revision:?}"
    );

    for name in &names {
        let old = before.iter().find(|p| &p.name_any() == name).expect("old");
        let new = after.iter().find(|p| &p.name_any() == name).expect("new");
        // The spec differs in the sidecar's image only.
        let mut expected_spec = serde_json::to_value(&old.spec).expect("spec");
        let containers = expected_spec["containers"].as_array_mut().expect("list");
        let sidecar = containers
            .iter_mut()
            .find(|c| c["name"] == SIDECAR)
            .expect("the sidecar");
        sidecar["image"] = json!(NEW_IMAGE);
        assert_eq!(
            serde_json::to_value(&new.spec).expect("spec"),
            expected_spec,
            "pod {name}: only the sidecar image may change"
        );
        assert_eq!(old.labels(), new.labels(), "pod {name}");
        let keys: BTreeSet<&String> = old
            .annotations()
            .keys()
            .chain(new.annotations().keys())
            .collect();
        for key in keys {
            if key != SIDECARSET_HASH && key != SIDECARSET_INPLACE_UPDATE_STATE {
                assert_eq!(
                    old.annotations().get(key),
                    new.annotations().get(key),
                    "pod {name}: annotation {key} must not change"
                );
            }
        }

        let entry = pod_entry(new, SIDECARSET_HASH, &fx.name).expect("hash entry");
        assert_eq!(entry["hash"], json!(hash_of(&set)), "{entry}");
        assert_eq!(entry["controllerRevision"], json!(latest), "{entry}");
        assert_eq!(entry["sidecarSetName"], json!(fx.name), "{entry}");
        assert_eq!(entry["sidecarList"], json!([SIDECAR]), "{entry}");
        assert!(entry["updateTimestamp"].is_string(), "{entry}");

        let state =
            pod_entry(new, SIDECARSET_INPLACE_UPDATE_STATE, &fx.name).unwrap_or_else(|| {
                panic!(
                    "pod {name}: no in-place update state: {:?}",
                    new.annotations()
                )
            });
        assert!(
            state["revision"].as_str().is_some_and(|r| !r.is_empty()),
            "{state}"
        );
        assert!(state["updateTimestamp"].is_string(), "{state}");
        assert_eq!(
            state["lastContainerStatuses"],
            json!({SIDECAR: {"imageID": kubelet::image_id(OLD_IMAGE)}}),
            "the imageID the sidecar ran before the update: {state}"
        );
        assert!(kubelet::runs(new, SIDECAR, NEW_IMAGE));
    }
    // Upstream also writes SidecarSetUpgradable True on every pod it upgrades (a second write
    // per pod); kruise-rs does so only with --sidecarset-upgradable-condition-on-upgrade (off
    // here; `upgraded_pods_are_marked_upgradable_with_the_flag`), so an upgraded pod has none.
    for pod in list_pods(&fx.pods).await {
        if names.contains(&pod.name_any()) {
            assert_eq!(
                pod_condition(&pod, SIDECARSET_UPGRADABLE_CONDITION),
                None,
                "pod {}",
                pod.name_any()
            );
        }
    }

    let early_now = fx.pods.get(&early.name_any()).await.expect("early pod");
    assert_eq!(
        early_now.spec, early.spec,
        "the never-injected pod is not touched"
    );
    assert_eq!(early_now.annotations(), early.annotations());
    assert!(
        pod_condition(&early_now, SIDECARSET_UPGRADABLE_CONDITION).is_none(),
        "{early_now:?}"
    );
}

/// Upstream item 11, "sidecarSet upgrade cold sidecar container failed image, and only update
/// one pod": with the default maxUnavailable (1), the first pod fails to pull the new image and
/// stays unavailable, so the second is never taken (`RolloutHeld` MaxUnavailableReached).
/// Fixing the image then upgrades both, the failed one first for free.
#[tokio::test]
async fn a_failing_image_stops_the_rollout_after_one_pod() {
    let fx = Fixture::new("sc-up-failed").await;
    let mut spec = one_sidecar_set(&fx.name, &fx.app, &fx.ns);
    let set = create_sidecarset(&fx.client, &spec).await;
    fx.start_pods(2, &[&set]).await;
    let (set, pods) = fx
        .wait_rollout(&fx.name, Kubelet::On, counts(2, 2, 2, 2), |set, _| {
            rollout_done(set)
        })
        .await;
    assert_hash_entries(&pods, &set, &[SIDECAR]);

    let containers = containers_with(&mut spec, 0, "image", json!(BAD_IMAGE));
    update_spec(&fx.client, &fx.name, json!({"containers": containers})).await;
    let at_most_one = |pods: &[Pod]| {
        let failing = pods_with_image(pods, BAD_IMAGE);
        assert!(
            failing.len() <= 1,
            "maxUnavailable 1, yet pods {failing:?} got the failing image"
        );
        failing.len()
    };
    let (_, pods) = fx
        .wait_rollout(&fx.name, Kubelet::On, counts(2, 1, 1, 0), |set, pods| {
            at_most_one(pods);
            expect_condition(set, ROLLOUT_HELD, "True", "MaxUnavailableReached")
        })
        .await;
    assert_eq!(at_most_one(&pods), 1);
    assert_eq!(pods_with_image(&pods, OLD_IMAGE).len(), 1);

    let containers = containers_with(&mut spec, 0, "image", json!(NEW_IMAGE));
    let set = update_spec(&fx.client, &fx.name, json!({"containers": containers})).await;
    let (_, pods) = fx
        .wait_rollout(&fx.name, Kubelet::On, counts(2, 2, 2, 2), |set, _| {
            rollout_done(set)
        })
        .await;
    assert_eq!(pods_with_image(&pods, NEW_IMAGE).len(), 2);
    assert!(pods.iter().all(|p| kubelet::runs(p, SIDECAR, NEW_IMAGE)));
    assert_hash_entries(&pods, &set, &[SIDECAR]);
}

/// Upstream item 12, "sidecarSet upgrade sidecar container (more than image field), no pod
/// should be updated": an env change cannot be made in place, so the pod keeps its sidecar, is
/// marked `SidecarSetUpgradable` False (`UpdateImmutableField`), and the SidecarSet gets a
/// `NotUpgradablePods` event (Normal, as upstream) and `PodsUpgradable` False. A pod created afterwards has
/// the new env, so a later image change upgrades it, and only it.
#[tokio::test]
async fn a_change_beyond_images_upgrades_no_pod() {
    let fx = Fixture::new("sc-up-env").await;
    let mut spec = one_sidecar_set(&fx.name, &fx.app, &fx.ns);
    spec["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("initContainers");
    let set = create_sidecarset(&fx.client, &spec).await;
    let first = fx.start_pods(1, &[&set]).await;
    let (_, before) = fx
        .wait_rollout(&fx.name, Kubelet::On, counts(1, 1, 1, 1), |set, _| {
            rollout_done(set)
        })
        .await;

    let env = json!([{"name": "version", "value": "v2"}]);
    let containers = containers_with(&mut spec, 0, "env", env);
    let set = update_spec(&fx.client, &fx.name, json!({"containers": containers})).await;
    let pod_name = &first[0];
    fx.wait_rollout(&fx.name, Kubelet::On, counts(1, 0, 1, 0), |set, _| {
        expect_condition(set, PODS_UPGRADABLE, "False", "NotUpgradablePods")?;
        let message = &condition(set, PODS_UPGRADABLE).expect("condition").message;
        if message.contains(pod_name.as_str()) {
            Ok(())
        } else {
            Err(format!(
                "the PodsUpgradable message does not name pod {pod_name}"
            ))
        }
    })
    .await;
    let pods = wait_upgradable_condition(
        &fx.pods,
        &first,
        "SidecarSetUpgradable False/UpdateImmutableField on the pod",
        |c| c.status == "False" && c.reason.as_deref() == Some("UpdateImmutableField"),
    )
    .await;
    let condition = pod_condition(&pods[0], SIDECARSET_UPGRADABLE_CONDITION).expect("condition");
    assert_eq!(
        upgradable_map(condition),
        json!({&fx.name: false}),
        "{condition:?}"
    );
    assert_eq!(pods[0].spec, before[0].spec, "the pod must not be updated");
    assert_eq!(
        pod_entry(&pods[0], SIDECARSET_HASH, &fx.name),
        pod_entry(&before[0], SIDECARSET_HASH, &fx.name)
    );

    let events = Api::<Event>::all(fx.client.clone());
    let params = ListParams::default().fields(&format!(
        "involvedObject.name={},reason=NotUpgradablePods",
        fx.name
    ));
    let (events, params) = (&events, &params);
    poll(
        "a Normal event NotUpgradablePods about the SidecarSet (upstream's type)",
        ROLLOUT_TIMEOUT,
        || async move {
            let list = events.list(params).await.expect("listing events").items;
            let found = list.iter().any(|e| {
                e.type_.as_deref() == Some("Normal")
                    && e.involved_object.kind.as_deref() == Some("SidecarSet")
            });
            if found {
                Ok(())
            } else {
                Err(format!("events {list:?}"))
            }
        },
    )
    .await;

    // A second pod, injected with the env: an image change is in place for it alone.
    let second = fx.start_pods(1, &[&set]).await;
    let containers = containers_with(&mut spec, 0, "image", json!(NEW_IMAGE));
    update_spec(&fx.client, &fx.name, json!({"containers": containers})).await;
    let (_, pods) = fx
        .wait_rollout(&fx.name, Kubelet::On, counts(2, 1, 2, 1), |set, _| {
            expect_condition(set, PODS_UPGRADABLE, "False", "NotUpgradablePods")
        })
        .await;
    assert_eq!(pods_with_image(&pods, NEW_IMAGE), second);
    assert_eq!(pods_with_image(&pods, OLD_IMAGE), first);
}

/// Upstream item 13, "multi sidecarSet upgrade sidecar container, check pod condition": two
/// SidecarSets inject one sidecar each into the same pods. One that cannot be upgraded in place
/// does not block the other, and keeps the pods' `SidecarSetUpgradable` False until it can be
/// upgraded again; then both are upgraded and the condition turns True.
#[tokio::test]
async fn two_sidecarsets_on_one_pod_are_upgraded_independently() {
    let fx = Fixture::new("sc-up-multi").await;
    let (name1, name2) = (unique_name("multi-a"), unique_name("multi-b"));
    let mut spec1 = one_sidecar_set(&name1, &fx.app, &fx.ns);
    let mut spec2 = base_sidecarset(&name2, &fx.app, &fx.ns);
    spec2["spec"]["initContainers"] = json!([]);
    spec2["spec"]["containers"]
        .as_array_mut()
        .expect("containers")
        .remove(0);
    let set1 = create_sidecarset(&fx.client, &spec1).await;
    let set2 = create_sidecarset(&fx.client, &spec2).await;
    let names = fx.start_pods(2, &[&set1, &set2]).await;
    for set in [&name1, &name2] {
        fx.wait_rollout(set, Kubelet::On, counts(2, 2, 2, 2), |set, _| {
            rollout_done(set)
        })
        .await;
    }

    // Only the command of the first: nothing can be upgraded in place.
    let original_command = spec1["spec"]["containers"][0]["command"].clone();
    let containers = containers_with(&mut spec1, 0, "command", json!(["sleep", "1000"]));
    update_spec(&fx.client, &name1, json!({"containers": containers})).await;
    fx.wait_rollout(&name1, Kubelet::On, counts(2, 0, 2, 0), |set, _| {
        expect_condition(set, PODS_UPGRADABLE, "False", "NotUpgradablePods")
    })
    .await;
    let not_first = |c: &PodCondition| {
        c.status == "False" && upgradable_map(c).get(&name1) == Some(&json!(false))
    };
    wait_upgradable_condition(
        &fx.pods,
        &names,
        "SidecarSetUpgradable False, naming the first SidecarSet",
        not_first,
    )
    .await;

    // The second one's image: upgraded everywhere regardless.
    let busybox = "busybox:1.37";
    let containers = containers_with(&mut spec2, 0, "image", json!(busybox));
    update_spec(&fx.client, &name2, json!({"containers": containers})).await;
    let (_, pods) = fx
        .wait_rollout(&name2, Kubelet::On, counts(2, 2, 2, 2), |set, _| {
            rollout_done(set)
        })
        .await;
    for pod in &pods {
        assert!(kubelet::runs(pod, "busybox-sidecar", busybox), "{pod:?}");
        assert_eq!(spec_image(pod, SIDECAR), OLD_IMAGE);
        let condition = pod_condition(pod, SIDECARSET_UPGRADABLE_CONDITION).expect("condition");
        assert!(not_first(condition), "{condition:?}");
    }

    // The first one back to its shape, with a new image: in place again.
    containers_with(&mut spec1, 0, "command", original_command);
    let containers = containers_with(&mut spec1, 0, "image", json!(NEW_IMAGE));
    update_spec(&fx.client, &name1, json!({"containers": containers})).await;
    fx.wait_rollout(&name1, Kubelet::On, counts(2, 2, 2, 2), |set, _| {
        rollout_done(set)?;
        expect_condition(set, PODS_UPGRADABLE, "True", "AllPodsUpgradable")
    })
    .await;
    let pods = wait_upgradable_condition(
        &fx.pods,
        &names,
        "SidecarSetUpgradable True once both SidecarSets are upgraded",
        |c| c.status == "True",
    )
    .await;
    for pod in &pods {
        assert!(kubelet::runs(pod, SIDECAR, NEW_IMAGE), "{pod:?}");
        assert!(kubelet::runs(pod, "busybox-sidecar", busybox), "{pod:?}");
    }
}

/// Upstream item 14, "sidecarSet upgrade cold sidecar container image, and paused": pausing
/// while the first pod restarts leaves the second on the old image (`RolloutHeld` Paused);
/// resuming finishes the rollout.
#[tokio::test]
async fn a_paused_rollout_resumes_when_unpaused() {
    let fx = Fixture::new("sc-up-paused").await;
    let mut spec = one_sidecar_set(&fx.name, &fx.app, &fx.ns);
    let set = create_sidecarset(&fx.client, &spec).await;
    fx.start_pods(2, &[&set]).await;
    fx.wait_rollout(&fx.name, Kubelet::On, counts(2, 2, 2, 2), |set, _| {
        rollout_done(set)
    })
    .await;

    let containers = containers_with(&mut spec, 0, "image", json!(NEW_IMAGE));
    update_spec(&fx.client, &fx.name, json!({"containers": containers})).await;
    // The first pod waits for its restart, which holds the second back.
    fx.wait_rollout(&fx.name, Kubelet::Off, counts(2, 1, 1, 0), |set, _| {
        expect_condition(set, ROLLOUT_HELD, "True", "MaxUnavailableReached")
    })
    .await;
    update_spec(
        &fx.client,
        &fx.name,
        json!({"updateStrategy": {"paused": true}}),
    )
    .await;
    fx.wait_rollout(&fx.name, Kubelet::Off, counts(2, 1, 1, 0), |set, _| {
        expect_condition(set, ROLLOUT_HELD, "True", "Paused")
    })
    .await;
    // The restart frees the way, but the rollout is paused.
    let (_, pods) = fx
        .wait_rollout(&fx.name, Kubelet::On, counts(2, 1, 2, 1), |set, _| {
            expect_condition(set, ROLLOUT_HELD, "True", "Paused")
        })
        .await;
    assert_eq!(pods_with_image(&pods, NEW_IMAGE).len(), 1, "{pods:?}");
    assert_eq!(pods_with_image(&pods, OLD_IMAGE).len(), 1, "{pods:?}");

    update_spec(
        &fx.client,
        &fx.name,
        json!({"updateStrategy": {"paused": false}}),
    )
    .await;
    let (_, pods) = fx
        .wait_rollout(&fx.name, Kubelet::On, counts(2, 2, 2, 2), |set, _| {
            rollout_done(set)
        })
        .await;
    assert!(pods.iter().all(|p| kubelet::runs(p, SIDECAR, NEW_IMAGE)));
}

/// Upstream item 15, "sidecarSet upgrade cold sidecar container image, and selector": with
/// `updateStrategy.selector` only the canary pod is upgraded; without it, the rest follows.
#[tokio::test]
async fn the_update_selector_limits_the_upgrade_to_matching_pods() {
    let fx = Fixture::new("sc-up-selector").await;
    let mut spec = one_sidecar_set(&fx.name, &fx.app, &fx.ns);
    let set = create_sidecarset(&fx.client, &spec).await;
    let names = fx.start_pods(2, &[&set]).await;
    fx.wait_rollout(&fx.name, Kubelet::On, counts(2, 2, 2, 2), |set, _| {
        rollout_done(set)
    })
    .await;
    let canary = &names[0];
    fx.pods
        .patch(
            canary,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"canary.release": "true"}}})),
        )
        .await
        .expect("labelling the canary pod");

    let containers = containers_with(&mut spec, 0, "image", json!(NEW_IMAGE));
    update_spec(
        &fx.client,
        &fx.name,
        json!({
            "containers": containers,
            "updateStrategy": {"selector": {"matchLabels": {"canary.release": "true"}}},
        }),
    )
    .await;
    // No pod the selector allows waits any more: the rollout is done as far as it goes.
    let (_, pods) = fx
        .wait_rollout(&fx.name, Kubelet::On, counts(2, 1, 2, 1), |set, _| {
            rollout_done(set)
        })
        .await;
    assert_eq!(
        pods_with_image(&pods, NEW_IMAGE),
        std::slice::from_ref(canary)
    );
    assert_eq!(pods_with_image(&pods, OLD_IMAGE), [names[1].clone()]);

    update_spec(
        &fx.client,
        &fx.name,
        json!({"updateStrategy": {"selector": null}}),
    )
    .await;
    let (_, pods) = fx
        .wait_rollout(&fx.name, Kubelet::On, counts(2, 2, 2, 2), |set, _| {
            rollout_done(set)
        })
        .await;
    assert!(pods.iter().all(|p| kubelet::runs(p, SIDECAR, NEW_IMAGE)));
}

/// Upstream item 16, "sidecarSet upgrade cold sidecar container image, and partition": a
/// partition of 50% of two pods (one) keeps one pod on the old image (`RolloutHeld`
/// PartitionReached); removing it upgrades that one too.
#[tokio::test]
async fn a_partition_keeps_pods_on_the_old_version() {
    let fx = Fixture::new("sc-up-partition").await;
    let mut spec = one_sidecar_set(&fx.name, &fx.app, &fx.ns);
    let set = create_sidecarset(&fx.client, &spec).await;
    fx.start_pods(2, &[&set]).await;
    fx.wait_rollout(&fx.name, Kubelet::On, counts(2, 2, 2, 2), |set, _| {
        rollout_done(set)
    })
    .await;

    let containers = containers_with(&mut spec, 0, "image", json!(NEW_IMAGE));
    update_spec(
        &fx.client,
        &fx.name,
        json!({"containers": containers, "updateStrategy": {"partition": "50%"}}),
    )
    .await;
    let (_, pods) = fx
        .wait_rollout(&fx.name, Kubelet::On, counts(2, 1, 2, 1), |set, _| {
            expect_condition(set, ROLLOUT_HELD, "True", "PartitionReached")
        })
        .await;
    assert_eq!(pods_with_image(&pods, NEW_IMAGE).len(), 1, "{pods:?}");
    assert_eq!(pods_with_image(&pods, OLD_IMAGE).len(), 1, "{pods:?}");

    update_spec(
        &fx.client,
        &fx.name,
        json!({"updateStrategy": {"partition": null}}),
    )
    .await;
    let (_, pods) = fx
        .wait_rollout(&fx.name, Kubelet::On, counts(2, 2, 2, 2), |set, _| {
            rollout_done(set)
        })
        .await;
    assert!(pods.iter().all(|p| kubelet::runs(p, SIDECAR, NEW_IMAGE)));
}

/// Upstream item 17, "sidecarSet upgrade cold sidecar container image, and maxUnavailable": of
/// four pods, maxUnavailable 50% (two) lets exactly two take a failing image, never more; a
/// fixed image then reaches all four.
#[tokio::test]
async fn max_unavailable_bounds_the_pods_in_flight() {
    let fx = Fixture::new("sc-up-maxunavail").await;
    let mut spec = one_sidecar_set(&fx.name, &fx.app, &fx.ns);
    let set = create_sidecarset(&fx.client, &spec).await;
    fx.start_pods(4, &[&set]).await;
    fx.wait_rollout(&fx.name, Kubelet::On, counts(4, 4, 4, 4), |set, _| {
        rollout_done(set)
    })
    .await;

    let containers = containers_with(&mut spec, 0, "image", json!(BAD_IMAGE));
    update_spec(
        &fx.client,
        &fx.name,
        json!({"containers": containers, "updateStrategy": {"maxUnavailable": "50%"}}),
    )
    .await;
    let (_, pods) = fx
        .wait_rollout(&fx.name, Kubelet::On, counts(4, 2, 2, 0), |set, pods| {
            // A failed pod stays failed, so an excess would still be here at the next look.
            let failing = pods_with_image(pods, BAD_IMAGE);
            assert!(
                failing.len() <= 2,
                "maxUnavailable 50% of 4, yet pods {failing:?} got the failing image"
            );
            expect_condition(set, ROLLOUT_HELD, "True", "MaxUnavailableReached")
        })
        .await;
    assert_eq!(pods_with_image(&pods, BAD_IMAGE).len(), 2);

    let containers = containers_with(&mut spec, 0, "image", json!(NEW_IMAGE));
    update_spec(&fx.client, &fx.name, json!({"containers": containers})).await;
    let (_, pods) = fx
        .wait_rollout(&fx.name, Kubelet::On, counts(4, 4, 4, 4), |set, _| {
            rollout_done(set)
        })
        .await;
    assert!(pods.iter().all(|p| kubelet::runs(p, SIDECAR, NEW_IMAGE)));
}

/// Upstream item 18, "sidecarSet update init sidecar container, and don't upgrade": an init
/// container's image is not part of the hash, so changing it upgrades nothing.
#[tokio::test]
async fn an_init_container_image_change_upgrades_nothing() {
    let fx = Fixture::new("sc-up-init").await;
    let spec = one_sidecar_set(&fx.name, &fx.app, &fx.ns);
    let set = create_sidecarset(&fx.client, &spec).await;
    let created = get_set(&fx.client, &fx.name).await;
    assert_eq!(
        serde_json::to_value(created.spec.init_containers[0].pod_inject_policy).expect("json"),
        json!("AfterAppContainer"),
        "defaulted"
    );
    fx.start_pods(1, &[&set]).await;
    let (_, before) = fx
        .wait_rollout(&fx.name, Kubelet::On, counts(1, 1, 1, 1), |set, _| {
            rollout_done(set)
        })
        .await;

    let mut init = spec["spec"]["initContainers"].clone();
    init[0]["image"] = json!(BAD_IMAGE);
    let changed = update_spec(&fx.client, &fx.name, json!({"initContainers": init})).await;
    assert_eq!(
        hash_of(&changed),
        hash_of(&set),
        "the hash covers no init container"
    );
    assert!(changed.metadata.generation > set.metadata.generation);
    let (_, after) = fx
        .wait_rollout(&fx.name, Kubelet::On, counts(1, 1, 1, 1), |set, _| {
            rollout_done(set)
        })
        .await;
    assert_eq!(after[0].spec, before[0].spec, "the pod must not be updated");
    assert_eq!(after[0].annotations(), before[0].annotations());
}

/// The revisions of SidecarSet `name`, oldest first.
async fn list_revisions(client: &Client, name: &str) -> Vec<ControllerRevision> {
    let params = ListParams::default().labels(&format!("{SIDECARSET_NAME_LABEL}={name}"));
    let mut list = revisions(client)
        .list(&params)
        .await
        .unwrap_or_else(|e| panic!("listing the revisions of {name}: {e}"))
        .items;
    list.sort_by_key(|r| r.revision);
    list
}

fn describe_revisions(list: &[ControllerRevision]) -> String {
    let parts: Vec<String> = list
        .iter()
        .map(|r| format!("{}#{}", r.name_any(), r.revision))
        .collect();
    format!("[{}]", parts.join(", "))
}

/// Waits until the SidecarSet's status describes its current generation and names a latest
/// revision, and its revisions satisfy `check`; returns the SidecarSet and its revisions.
async fn wait_revisions(
    client: &Client,
    name: &str,
    what: &str,
    check: impl Fn(&SidecarSet, &[ControllerRevision]) -> Result<(), String>,
) -> (SidecarSet, Vec<ControllerRevision>) {
    let check = &check;
    poll(what, ROLLOUT_TIMEOUT, || async move {
        let set = get_set(client, name).await;
        let list = list_revisions(client, name).await;
        let status = set.status.clone().unwrap_or_default();
        let seen = || {
            format!(
                "{}; revisions {}",
                describe_set(&set),
                describe_revisions(&list)
            )
        };
        if status.observed_generation != set.metadata.generation || status.latest_revision.is_none()
        {
            return Err(seen());
        }
        check(&set, &list).map_err(|e| format!("{e}; {}", seen()))?;
        Ok((set, list))
    })
    .await
}

fn latest_revision(set: &SidecarSet) -> String {
    set.status
        .as_ref()
        .and_then(|s| s.latest_revision.clone())
        .unwrap_or_default()
}

/// The `data.spec` of a revision.
fn revision_spec(revision: &ControllerRevision) -> Value {
    let data = revision.data.as_ref().expect("revision data");
    data.0["spec"].clone()
}

fn assert_restorable_fields(revision: &ControllerRevision, with_patch_pod_metadata: bool) {
    let spec = revision_spec(revision);
    let mut fields = vec![
        "volumes",
        "containers",
        "initContainers",
        "imagePullSecrets",
    ];
    if with_patch_pod_metadata {
        fields.push("patchPodMetadata");
    }
    for field in fields {
        assert!(
            spec.get(field).is_some(),
            "revision {} data.spec lacks {field}: {spec}",
            revision.name_any()
        );
    }
}

/// Upstream item 19, "sidecarSet history revision checker": fifteen versions leave the ten
/// newest revisions (numbers 6–15, revisionHistoryLimit's default); going back to version 12
/// reuses its revision, renumbered 16, and creates none.
#[tokio::test]
async fn revision_history_is_capped_and_an_old_version_is_reused() {
    let client = client().await;
    ensure_manager_namespace(&client).await;
    let ns = webhook_cluster().namespace("sc-up-history").await;
    let name = unique_name("history");
    let mut spec = base_sidecarset(&name, &unique_name("app"), &ns);
    spec["spec"]["imagePullSecrets"] = json!([{"name": "secret-1"}]);
    create_sidecarset(&client, &spec).await;
    let (set, list) = wait_revisions(&client, &name, "the first revision", |_, list| {
        (list.len() == 1)
            .then_some(())
            .ok_or_else(|| "one revision wanted".to_owned())
    })
    .await;
    assert_eq!(list[0].revision, 1);
    assert_eq!(latest_revision(&set), list[0].name_any());

    // The revision recorded for each version, by version number.
    let mut by_version = BTreeMap::from([(1, list[0].name_any())]);
    for version in 2..=15 {
        let secrets = json!([{"name": format!("secret-{version}")}]);
        update_spec(&client, &name, json!({"imagePullSecrets": secrets})).await;
        let known: BTreeSet<String> = by_version.values().cloned().collect();
        let (set, _) = wait_revisions(
            &client,
            &name,
            &format!("a new latest revision for version {version}"),
            |set, _| {
                let latest = latest_revision(set);
                (!known.contains(&latest))
                    .then_some(())
                    .ok_or_else(|| format!("latestRevision {latest} is an earlier version's"))
            },
        )
        .await;
        by_version.insert(version, latest_revision(&set));
    }
    let numbers = |list: &[ControllerRevision]| list.iter().map(|r| r.revision).collect::<Vec<_>>();
    let (_, list) = wait_revisions(&client, &name, "ten revisions, 6 to 15", |_, list| {
        (numbers(list) == (6..=15).collect::<Vec<i64>>())
            .then_some(())
            .ok_or_else(|| "revisions numbered 6..=15 wanted".to_owned())
    })
    .await;
    for revision in &list {
        assert_restorable_fields(revision, false);
        let version = revision.revision;
        assert_eq!(
            revision.name_any(),
            by_version[&version],
            "revision number {version} is the one recorded for version {version}"
        );
        assert_eq!(
            revision_spec(revision)["imagePullSecrets"],
            json!([{"name": format!("secret-{version}")}])
        );
    }

    let names_before: BTreeSet<String> = list.iter().map(|r| r.name_any()).collect();
    update_spec(
        &client,
        &name,
        json!({"imagePullSecrets": [{"name": "secret-12"}]}),
    )
    .await;
    let (set, list) = wait_revisions(
        &client,
        &name,
        "version 12's revision to be reused as number 16",
        |set, list| {
            let expected: Vec<i64> = vec![6, 7, 8, 9, 10, 11, 13, 14, 15, 16];
            if numbers(list) == expected && latest_revision(set) == by_version[&12] {
                Ok(())
            } else {
                Err(format!(
                    "revisions numbered {expected:?} with latestRevision {} wanted",
                    by_version[&12]
                ))
            }
        },
    )
    .await;
    let reused = list.last().expect("revisions");
    assert_eq!(reused.name_any(), by_version[&12], "{}", describe_set(&set));
    let names_after: BTreeSet<String> = list.iter().map(|r| r.name_any()).collect();
    assert_eq!(names_after, names_before, "no revision created or deleted");
}

/// revisionHistoryLimit never deletes a revision a matched pod records as the one it was
/// injected with (kruise.md §2.4), even when it is the oldest.
#[tokio::test]
async fn a_revision_a_pod_records_outlives_the_history_limit() {
    let fx = Fixture::new("sc-up-keep").await;
    let mut spec = one_sidecar_set(&fx.name, &fx.app, &fx.ns);
    spec["spec"]["revisionHistoryLimit"] = json!(2);
    create_sidecarset(&fx.client, &spec).await;
    let (set, _) = wait_revisions(&fx.client, &fx.name, "the first revision", |_, list| {
        (list.len() == 1)
            .then_some(())
            .ok_or_else(|| "one revision wanted".to_owned())
    })
    .await;
    let first = latest_revision(&set);
    // Injected once the webhook knows the revision, so the pod records it.
    let (pods, app, set, name, first_ref) = (&fx.pods, &fx.app, &set, &fx.name, &first);
    let pod = poll(
        "a pod recording the first revision",
        CACHE_TIMEOUT,
        || async move {
            let pod = admit_injected(pods, &base_pod(app), &[set]).await;
            let entry = pod_entry(&pod, SIDECARSET_HASH, name).unwrap_or_default();
            if entry["controllerRevision"] == json!(first_ref) {
                return Ok(pod);
            }
            let _ = pods.delete(&pod.name_any(), &DeleteParams::default()).await;
            Err(format!("a pod recording {entry}"))
        },
    )
    .await;
    kubelet::start(&fx.pods, &pod.name_any()).await;

    // Pull secrets are not part of the hash: the pod stays updated, on the first revision.
    let mut seen = BTreeSet::from([first.clone()]);
    for version in 2..=4 {
        let secrets = json!([{"name": format!("secret-{version}")}]);
        update_spec(&fx.client, &fx.name, json!({"imagePullSecrets": secrets})).await;
        let known = seen.clone();
        let (set, _) = wait_revisions(
            &fx.client,
            &fx.name,
            &format!("a new latest revision for version {version}"),
            |set, _| {
                let latest = latest_revision(set);
                (!known.contains(&latest))
                    .then_some(())
                    .ok_or_else(|| format!("latestRevision {latest} is an earlier version's"))
            },
        )
        .await;
        seen.insert(latest_revision(&set));
    }
    let (set, list) = wait_revisions(
        &fx.client,
        &fx.name,
        "two revisions: the pod's and the latest",
        |set, list| {
            let names: BTreeSet<String> = list.iter().map(|r| r.name_any()).collect();
            let expected = BTreeSet::from([first.clone(), latest_revision(set)]);
            (names == expected)
                .then_some(())
                .ok_or_else(|| format!("revisions {expected:?} wanted"))
        },
    )
    .await;
    assert_eq!(
        counts_of(&set),
        counts(1, 1, 1, 1),
        "{}",
        describe_set(&set)
    );
    assert_eq!(list.len(), 2);
}

/// Upstream item 20, "sidecarSet history revision data checker": each revision holds its
/// version's restorable fields (here `patchPodMetadata` differs), is owned by the SidecarSet,
/// labelled with its name and custom version, and carries its hash annotations.
#[tokio::test]
async fn each_revision_records_its_version_of_the_sidecarset() {
    let client = client().await;
    ensure_manager_namespace(&client).await;
    let ns = webhook_cluster().namespace("sc-up-revdata").await;
    let name = unique_name("revdata");
    let key = "sidecarset.kruise.io/test";
    let rule = json!({
        "selector": {"matchLabels": {CONTROLLED_LABEL: &name}},
        "allowedAnnotationKeyExprs": ["^sidecarset\\.kruise\\.io/test$"],
    });
    whitelist_rule(&client, rule.clone(), true).await;
    let patch_metadata =
        |version: &str| json!([{"patchPolicy": "Retain", "annotations": {key: version}}]);
    let mut spec = base_sidecarset(&name, &unique_name("app"), &ns);
    spec["spec"]["imagePullSecrets"] = json!([{"name": "secret-1"}]);
    spec["spec"]["patchPodMetadata"] = patch_metadata("version-1");
    spec["spec"]["customVersion"] = json!("v1");
    let created = create_sidecarset(&client, &spec).await;
    wait_revisions(&client, &name, "the first revision", |_, list| {
        (list.len() == 1)
            .then_some(())
            .ok_or_else(|| "one revision wanted".to_owned())
    })
    .await;
    update_spec(
        &client,
        &name,
        json!({"patchPodMetadata": patch_metadata("version-2"), "customVersion": "v2"}),
    )
    .await;
    let (set, list) = wait_revisions(&client, &name, "two revisions", |set, list| {
        match list.last() {
            Some(last) if list.len() == 2 && last.name_any() == latest_revision(set) => Ok(()),
            _ => Err("two revisions, the newer one latest, wanted".to_owned()),
        }
    })
    .await;
    whitelist_rule(&client, rule, false).await;

    let uid = created.metadata.uid.clone().expect("uid");
    for (revision, version) in list.iter().zip(["1", "2"]) {
        let what = format!("revision {} (version {version})", revision.name_any());
        assert_restorable_fields(revision, true);
        let data = revision_spec(revision);
        assert_eq!(
            data["patchPodMetadata"][0]["annotations"][key],
            json!(format!("version-{version}")),
            "{what}: {data}"
        );
        assert_eq!(
            data["imagePullSecrets"],
            json!([{"name": "secret-1"}]),
            "{what}"
        );
        let containers: Vec<(&str, &str)> = data["containers"]
            .as_array()
            .expect("containers")
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().unwrap_or(""),
                    c["image"].as_str().unwrap_or(""),
                )
            })
            .collect();
        assert_eq!(
            containers,
            [(SIDECAR, OLD_IMAGE), ("busybox-sidecar", "busybox:1.36")],
            "{what}"
        );
        assert!(
            revision.name_any().starts_with(&format!("{name}-")),
            "{what}"
        );
        let labels = revision.labels();
        assert_eq!(
            labels.get(SIDECARSET_NAME_LABEL),
            Some(&name),
            "{what}: {labels:?}"
        );
        assert_eq!(
            labels
                .get(SIDECARSET_CUSTOM_VERSION_LABEL)
                .map(String::as_str),
            Some(format!("v{version}").as_str()),
            "{what}: {labels:?}"
        );
        for hash in [SIDECARSET_HASH, SIDECARSET_HASH_WITHOUT_IMAGE] {
            assert_eq!(
                revision.annotations().get(hash),
                Some(&annotation(&set, hash)),
                "{what}: annotation {hash}"
            );
        }
        let owners = revision.owner_references();
        assert!(
            owners.iter().any(|o| o.uid == uid
                && o.kind == "SidecarSet"
                && o.name == name
                && o.api_version == "apps.kruise.io/v1beta1"
                && o.controller == Some(true)),
            "{what}: owned by the SidecarSet as its controller: {owners:?}"
        );
    }
}

/// A pod patch the apiserver refuses for a reason other than a changed pod (here an admission
/// policy answering 403, as a missing RBAC verb did on the real node): the SidecarSet gets a
/// Warning `UpgradeFailed` event with the apiserver's message, and once the cause is gone the
/// rollout finishes (it is retried with backoff, not given up).
#[tokio::test]
async fn a_refused_pod_patch_is_a_warning_event_and_retried() {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    let fx = Fixture::new("sc-up-refused").await;
    let mut spec = one_sidecar_set(&fx.name, &fx.app, &fx.ns);
    let set = create_sidecarset(&fx.client, &spec).await;
    fx.start_pods(1, &[&set]).await;
    fx.wait_rollout(&fx.name, Kubelet::On, counts(1, 1, 1, 1), |set, _| {
        rollout_done(set)
    })
    .await;

    // Pod image changes in this namespace are refused with 403 Forbidden.
    let policy_name = unique_name("refuse-image-changes");
    let policies = Api::<ValidatingAdmissionPolicy>::all(fx.client.clone());
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
        "metadata": {"name": policy_name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                "resources": ["pods"]
            }]},
            "validations": [{
                "expression": "object.spec.containers.map(c, c.image) == oldObject.spec.containers.map(c, c.image)",
                "message": "image changes are frozen here",
                "reason": "Forbidden"
            }]
        }
    }))
    .expect("a policy");
    policies
        .create(&PostParams::default(), &policy)
        .await
        .expect("creating the policy");
    let bindings = Api::<ValidatingAdmissionPolicyBinding>::all(fx.client.clone());
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "metadata": {"name": policy_name},
        "spec": {
            "policyName": policy_name,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": fx.ns
            }}}
        }
    }))
    .expect("a binding");
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .expect("creating the binding");
    // The apiserver applies new policies after a moment: wait until a pod update is refused.
    let probe_pod = list_pods(&fx.pods).await.remove(0).name_any();
    let (pods_api, probe) = (&fx.pods, &probe_pod);
    poll("the policy to refuse image changes", ROLLOUT_TIMEOUT, || async move {
        let patch = json!([{"op": "replace", "path": "/spec/containers/0/image", "value": "busybox:refused"}]);
        let dry_run = PatchParams {
            dry_run: true,
            ..Default::default()
        };
        match pods_api
            .patch(probe, &dry_run, &Patch::<()>::Json(serde_json::from_value(patch).unwrap()))
            .await
        {
            Err(kube::Error::Api(s)) if s.code == 403 => Ok(()),
            other => Err(format!("not refused yet: {:?}", other.map(|_| ()))),
        }
    })
    .await;

    let containers = containers_with(&mut spec, 0, "image", json!(NEW_IMAGE));
    update_spec(&fx.client, &fx.name, json!({"containers": containers})).await;
    let events = Api::<Event>::all(fx.client.clone());
    let params = ListParams::default().fields(&format!(
        "involvedObject.name={},reason=UpgradeFailed",
        fx.name
    ));
    let (events, params, pod) = (&events, &params, &probe_pod);
    poll(
        "a Warning event UpgradeFailed naming the pod and the apiserver's message",
        ROLLOUT_TIMEOUT,
        || async move {
            let list = events.list(params).await.expect("listing events").items;
            let found = list.iter().any(|e| {
                let note = e.message.as_deref().unwrap_or_default();
                e.type_.as_deref() == Some("Warning")
                    && note.contains(pod.as_str())
                    && note.contains("image changes are frozen here")
            });
            if found {
                Ok(())
            } else {
                Err(format!("events {list:?}"))
            }
        },
    )
    .await;

    bindings
        .delete(&policy_name, &DeleteParams::default())
        .await
        .expect("deleting the binding");
    policies
        .delete(&policy_name, &DeleteParams::default())
        .await
        .expect("deleting the policy");
    let (_, pods) = fx
        .wait_rollout(&fx.name, Kubelet::On, counts(1, 1, 1, 1), |set, _| {
            rollout_done(set)
        })
        .await;
    assert!(pods.iter().all(|p| kubelet::runs(p, SIDECAR, NEW_IMAGE)));
}

/// The label that confines the controller of [`upgraded_pods_are_marked_upgradable_with_the_flag`]
/// to its SidecarSet (the shared manager's controllers only take [`CONTROLLED_LABEL`]).
const MARK_LABEL: &str = "kruise-rs-test-upgradable-on-upgrade";

/// Upstream's pod signal after an in-place upgrade (kruise.md §2.7): with
/// `--sidecarset-upgradable-condition-on-upgrade`, every pod the SidecarSet upgrades in place
/// gets `SidecarSetUpgradable=True` (`AllSidecarsetUpgradable`, message `{"<set>":true}`); a pod
/// injected at the latest version, never upgraded, gets none. Run by a SidecarSet controller of
/// its own with the flag on, confined to this test's SidecarSet.
#[tokio::test]
async fn upgraded_pods_are_marked_upgradable_with_the_flag() {
    let fx = Fixture::new("sc-up-mark").await;
    let mut spec = one_sidecar_set(&fx.name, &fx.app, &fx.ns);
    spec["metadata"]["labels"] = json!({ MARK_LABEL: fx.name });
    let set = create_sidecarset(&fx.client, &spec).await;
    let opts = kruise_rs::controllers::ControllerOptions {
        label_selector: Some(format!("{MARK_LABEL}={}", fx.name)),
        namespace: MANAGER_NAMESPACE.to_owned(),
        sidecarset_predownload: false,
        sidecarset_upgradable_condition_on_upgrade: true,
        ..crate::support::test_controller_options()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let controller = tokio::spawn(kruise_rs::controllers::sidecarset::run(
        fx.client.clone(),
        opts,
        async move {
            let _ = stopped.await;
        },
    ));

    let names = fx.start_pods(2, &[&set]).await;
    fx.wait_rollout(&fx.name, Kubelet::On, counts(2, 2, 2, 2), |set, _| {
        rollout_done(set)
    })
    .await;
    let containers = containers_with(&mut spec, 0, "image", json!(NEW_IMAGE));
    let set = update_spec(&fx.client, &fx.name, json!({"containers": containers})).await;
    fx.wait_rollout(&fx.name, Kubelet::On, counts(2, 2, 2, 2), |set, pods| {
        rollout_done(set)?;
        let upgraded = pods_with_image(pods, NEW_IMAGE);
        if upgraded.len() == 2 {
            Ok(())
        } else {
            Err(format!("pods on {NEW_IMAGE}: {upgraded:?}"))
        }
    })
    .await;
    let pods = wait_upgradable_condition(
        &fx.pods,
        &names,
        "SidecarSetUpgradable True/AllSidecarsetUpgradable on both upgraded pods",
        |c| c.status == "True" && c.reason.as_deref() == Some("AllSidecarsetUpgradable"),
    )
    .await;
    for pod in &pods {
        let condition = pod_condition(pod, SIDECARSET_UPGRADABLE_CONDITION).expect("condition");
        assert_eq!(
            upgradable_map(condition),
            json!({&fx.name: true}),
            "{condition:?}"
        );
    }

    // Injected at the new version: never upgraded in place, so no condition (as upstream).
    let late = fx.start_pods(1, &[&set]).await;
    let (_, pods) = fx
        .wait_rollout(&fx.name, Kubelet::On, counts(3, 3, 3, 3), |set, _| {
            rollout_done(set)
        })
        .await;
    let late_pod = pods
        .iter()
        .find(|p| p.name_any() == late[0])
        .expect("the late pod");
    assert_eq!(
        pod_condition(late_pod, SIDECARSET_UPGRADABLE_CONDITION),
        None,
        "{late_pod:?}"
    );

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(30), controller)
        .await
        .expect("the controller stops")
        .expect("join");
    let _ = sidecarsets(&fx.client)
        .delete(&fx.name, &DeleteParams::default())
        .await;
}
