//! SidecarSet hot upgrade (`upgradeStrategy.upgradeType: HotUpgrade`) through the webhook test
//! cluster's manager, with the test playing the kubelet (`support::kubelet`), as
//! `sidecarset_upgrade.rs` does for cold sidecars. The behaviour is upstream's
//! (`docs/hot-upgrade-plan.md`): a hot sidecar `mesh` runs as two twins, `mesh-1` (working, on
//! the sidecar's image) and `mesh-2` (idle, on `hotUpgradeEmptyImage`); an image change goes to
//! the idle twin, which becomes the working one, and once it runs the old twin goes back to the
//! empty image (the flip).
//!
//! Each step waits, with a deadline, until the SidecarSet's status describes its current
//! generation with the expected counts and the pods are in the expected state. The kubelet is
//! played step by step where the test must see the controller act before a container restarts.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::{Event, Pod};
use kruise_rs_api::sidecarset::SidecarSet;
use kruise_rs_api::well_known::{
    SIDECARSET_HASH, SIDECARSET_HASH_WITHOUT_IMAGE, SIDECARSET_INJECTED_LIST,
    SIDECARSET_INPLACE_UPDATE_STATE, SIDECARSET_VERSION_ALT_ENV, SIDECARSET_VERSION_ALT_PREFIX,
    SIDECARSET_VERSION_ENV, SIDECARSET_VERSION_PREFIX, SIDECARSET_WORKING_HOTUPGRADE_CONTAINER,
};
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::sidecarset_upgrade::{
    CACHE_TIMEOUT, Counts, NEW_IMAGE, OLD_IMAGE, ROLLOUT_TIMEOUT, admit_injected, base_pod, client,
    condition, counts, counts_of, create_sidecarset, describe_set, ensure_manager_namespace,
    get_set, hash_of, pod_entry, pod_hash, poll, spec_image, update_spec,
};
use crate::support::kubelet;
use crate::support::webhook::webhook_cluster;
use crate::support::{CONTROLLED_LABEL, unique_name};

/// The hot sidecar, and the names of its twins in a pod.
const SIDECAR: &str = "mesh";
const TWIN1: &str = "mesh-1";
const TWIN2: &str = "mesh-2";
/// `upgradeStrategy.hotUpgradeEmptyImage`: what the idle twin runs.
const EMPTY_IMAGE: &str = "busybox:1.36";
/// An image the test kubelet never manages to pull.
const BAD_IMAGE: &str = "nginx:kruise-rs-no-such-tag";

// --- SidecarSets, pods and what they say ---------------------------------------------------------

/// A SidecarSet with one hot sidecar `mesh` on `OLD_IMAGE` (an env var of its own, so the
/// version env can be seen appended after it), selecting pods labelled `app: <app>` in `ns`.
fn hot_set(name: &str, app: &str, ns: &str) -> Value {
    json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "SidecarSet",
        "metadata": {"name": name, "labels": {CONTROLLED_LABEL: name}},
        "spec": {
            "selector": {"matchLabels": {"app": app}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "updateStrategy": {"type": "RollingUpdate"},
            "containers": [{
                "name": SIDECAR,
                "image": OLD_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": ["tail", "-f", "/dev/null"],
                "env": [{"name": "PROXY_PORT", "value": "15001"}],
                "podInjectPolicy": "BeforeAppContainer",
                "upgradeStrategy": {"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": EMPTY_IMAGE},
            }],
        }
    })
}

/// `set`'s containers with the hot sidecar's `field` set to `value`.
fn containers_with(set: &mut Value, field: &str, value: Value) -> Value {
    set["spec"]["containers"][0][field] = value;
    set["spec"]["containers"].clone()
}

fn annotation<'p>(pod: &'p Pod, key: &str) -> Option<&'p str> {
    pod.annotations().get(key).map(String::as_str)
}

fn version<'p>(pod: &'p Pod, twin: &str) -> Option<&'p str> {
    annotation(pod, &format!("{SIDECARSET_VERSION_PREFIX}{twin}"))
}

fn version_alt<'p>(pod: &'p Pod, twin: &str) -> Option<&'p str> {
    annotation(pod, &format!("{SIDECARSET_VERSION_ALT_PREFIX}{twin}"))
}

/// The four version annotations: `version` and `versionalt` of `mesh-1`, then of `mesh-2`.
fn versions(pod: &Pod) -> [Option<String>; 4] {
    [
        version(pod, TWIN1),
        version_alt(pod, TWIN1),
        version(pod, TWIN2),
        version_alt(pod, TWIN2),
    ]
    .map(|v| v.map(str::to_owned))
}

fn some(values: [&str; 4]) -> [Option<String>; 4] {
    values.map(|v| Some(v.to_owned()))
}

/// The working twin of `mesh` the pod records ("" when none).
fn working(pod: &Pod) -> String {
    annotation(pod, SIDECARSET_WORKING_HOTUPGRADE_CONTAINER)
        .and_then(|text| serde_json::from_str::<BTreeMap<String, String>>(text).ok())
        .and_then(|map| map.get(SIDECAR).cloned())
        .unwrap_or_default()
}

fn container_names(pod: &Pod) -> Vec<String> {
    pod.spec
        .iter()
        .flat_map(|s| &s.containers)
        .map(|c| c.name.clone())
        .collect()
}

fn container_json(pod: &Pod, name: &str) -> Value {
    let container = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("pod {} has no container {name}", pod.name_any()));
    serde_json::to_value(container).expect("a container serializes")
}

/// The env of container `name`, as JSON.
fn env_of(pod: &Pod, name: &str) -> Vec<Value> {
    container_json(pod, name)["env"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The two version env vars a twin ends with, read through the downward API from its own
/// annotations (the apiserver defaults `fieldRef.apiVersion` to `v1`).
fn assert_version_env(pod: &Pod, twin: &str) {
    let env = env_of(pod, twin);
    let names: Vec<&str> = env.iter().filter_map(|e| e["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            "PROXY_PORT",
            "IS_INJECTED",
            SIDECARSET_VERSION_ENV,
            SIDECARSET_VERSION_ALT_ENV
        ],
        "pod {} container {twin}: env {env:?}",
        pod.name_any()
    );
    let n = env.len();
    for (var, prefix) in [
        (&env[n - 2], SIDECARSET_VERSION_PREFIX),
        (&env[n - 1], SIDECARSET_VERSION_ALT_PREFIX),
    ] {
        assert_eq!(
            var["valueFrom"]["fieldRef"]["fieldPath"],
            json!(format!("metadata.annotations['{prefix}{twin}']")),
            "pod {} container {twin}: {var}",
            pod.name_any()
        );
        assert!(var.get("value").is_none(), "{var}");
    }
}

/// Whether the pod holds `mesh` at rest: `working` on `image` and running it, the other twin on
/// the empty image and running it.
fn at_rest(pod: &Pod, working_twin: &str, image: &str) -> Result<(), String> {
    let other = if working_twin == TWIN1 { TWIN2 } else { TWIN1 };
    let seen = || describe_twins(pod);
    if working(pod) != working_twin {
        return Err(format!("working twin not {working_twin}: {}", seen()));
    }
    if spec_image(pod, working_twin) != image || !kubelet::runs(pod, working_twin, image) {
        return Err(format!("{working_twin} not running {image}: {}", seen()));
    }
    if spec_image(pod, other) != EMPTY_IMAGE || !kubelet::runs(pod, other, EMPTY_IMAGE) {
        return Err(format!("{other} not running {EMPTY_IMAGE}: {}", seen()));
    }
    Ok(())
}

/// One line about the pod's twins: spec and reported image of each, the working twin, the
/// versions.
fn describe_twins(pod: &Pod) -> String {
    let reported = |name: &str| {
        pod.status
            .iter()
            .flat_map(|s| s.container_statuses.iter().flatten())
            .find(|s| s.name == name)
            .map(|s| format!("{} ready={}", s.image, s.ready))
            .unwrap_or_else(|| "no status".to_owned())
    };
    format!(
        "{}: {TWIN1} spec {} reported {}; {TWIN2} spec {} reported {}; working {:?}; versions {:?}; pod ready={}",
        pod.name_any(),
        spec_image(pod, TWIN1),
        reported(TWIN1),
        spec_image(pod, TWIN2),
        reported(TWIN2),
        working(pod),
        versions(pod),
        kubelet::pod_ready(pod),
    )
}

/// The restart count the pod reports for container `name`.
fn restarts(pod: &Pod, name: &str) -> i32 {
    pod.status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .find(|s| s.name == name)
        .map_or(-1, |s| s.restart_count)
}

fn parse_version(value: Option<&str>, what: &str) -> u64 {
    value
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{what}: {value:?} is not a resourceVersion"))
}

fn is_bad(image: &str) -> bool {
    image == BAD_IMAGE
}

// --- The fixture -------------------------------------------------------------------------------

/// One test's namespace, pods and SidecarSet name.
struct Fixture {
    client: Client,
    ns: String,
    pods: Api<Pod>,
    app: String,
    name: String,
}

impl Fixture {
    /// A namespace whose pods go through the webhook.
    async fn new(prefix: &str) -> Fixture {
        let client = client().await;
        ensure_manager_namespace(&client).await;
        let ns = webhook_cluster().namespace(prefix).await;
        Self::with_namespace(client, ns, prefix)
    }

    /// A namespace the webhook leaves alone: its pods are created as given.
    async fn without_webhook(prefix: &str) -> Fixture {
        let client = client().await;
        ensure_manager_namespace(&client).await;
        let ns = unique_name(prefix);
        crate::harness::objects::create_namespace(&client, &ns, &[])
            .await
            .unwrap_or_else(|e| panic!("creating namespace {ns}: {e}"));
        Self::with_namespace(client, ns, prefix)
    }

    fn with_namespace(client: Client, ns: String, prefix: &str) -> Fixture {
        Fixture {
            pods: Api::namespaced(client.clone(), &ns),
            client,
            ns,
            app: unique_name("app"),
            name: unique_name(prefix),
        }
    }

    /// Creates `n` pods injected with the current version of `set` and starts them.
    async fn start_pods(&self, n: usize, set: &SidecarSet) -> Vec<String> {
        let mut names = Vec::new();
        for _ in 0..n {
            let pod = admit_injected(&self.pods, &base_pod(&self.app), &[set]).await;
            kubelet::start(&self.pods, &pod.name_any()).await;
            names.push(pod.name_any());
        }
        names
    }

    async fn pods(&self) -> Vec<Pod> {
        let mut list = self
            .pods
            .list(&ListParams::default())
            .await
            .unwrap_or_else(|e| panic!("listing pods: {e}"))
            .items;
        list.sort_by_key(|p| p.name_any());
        list
    }

    async fn pod(&self, name: &str) -> Pod {
        self.pods
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("reading pod {name}: {e}"))
    }

    /// Waits until the SidecarSet's status describes its current generation with `expected`
    /// counts and `check` accepts it and the namespace's pods; with `kubelet`, a kubelet pass
    /// (changed containers restarted, [`BAD_IMAGE`] failing) runs before each look.
    async fn wait(
        &self,
        kubelet: bool,
        expected: Counts,
        check: impl Fn(&SidecarSet, &[Pod]) -> Result<(), String>,
    ) -> (SidecarSet, Vec<Pod>) {
        let what = format!(
            "SidecarSet {} to report {expected:?} for its current generation (kubelet {})",
            self.name,
            if kubelet { "on" } else { "off" }
        );
        let check = &check;
        poll(&what, ROLLOUT_TIMEOUT, || async move {
            if kubelet {
                kubelet::sync(&self.pods, &is_bad).await;
            }
            let set = get_set(&self.client, &self.name).await;
            let pods = self.pods().await;
            let seen = || {
                let twins: Vec<String> = pods.iter().map(describe_twins).collect();
                format!("{}; pods: {}", describe_set(&set), twins.join("; "))
            };
            let status = set.status.clone().unwrap_or_default();
            if status.observed_generation != set.metadata.generation || counts_of(&set) != expected
            {
                return Err(seen());
            }
            check(&set, &pods).map_err(|e| format!("{e}; {}", seen()))?;
            Ok((set, pods))
        })
        .await
    }
}

fn expect_condition(
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

fn rollout_done(set: &SidecarSet) -> Result<(), String> {
    expect_condition(set, "RolloutHeld", "False", "Updated")
}

fn all_at_rest(pods: &[Pod], working_twin: &str, image: &str) -> Result<(), String> {
    pods.iter()
        .try_for_each(|p| at_rest(p, working_twin, image))
}

// --- 1. Injection ------------------------------------------------------------------------------

/// Upstream's "sidecarSet inject pod hot upgrade sidecar container": the hot sidecar is injected
/// as its two twins, `mesh-1` on the sidecar's image and working, `mesh-2` on the empty image,
/// with upstream's annotations (byte for byte where upstream's are bytes) and each twin's
/// version env read from them; the SidecarSet counts the pod by its twins.
#[tokio::test]
async fn a_hot_sidecar_is_injected_as_two_twins() {
    let fx = Fixture::new("hot-inject").await;
    let set = create_sidecarset(&fx.client, &hot_set(&fx.name, &fx.app, &fx.ns)).await;
    let names = fx.start_pods(1, &set).await;
    let pod = fx.pod(&names[0]).await;

    assert_eq!(container_names(&pod), [TWIN1, TWIN2, "main"], "{pod:?}");
    assert_eq!(spec_image(&pod, TWIN1), OLD_IMAGE);
    assert_eq!(spec_image(&pod, TWIN2), EMPTY_IMAGE);
    assert_eq!(
        annotation(&pod, SIDECARSET_WORKING_HOTUPGRADE_CONTAINER),
        Some(r#"{"mesh":"mesh-1"}"#)
    );
    assert_eq!(versions(&pod), some(["1", "0", "0", "1"]));
    assert_version_env(&pod, TWIN1);
    assert_version_env(&pod, TWIN2);
    // The twins are the sidecar as written but for the image and the annotations they read.
    let strip = |mut c: Value| {
        let map = c.as_object_mut().expect("an object");
        for key in ["name", "image", "env"] {
            map.remove(key);
        }
        c
    };
    assert_eq!(
        strip(container_json(&pod, TWIN1)),
        strip(container_json(&pod, TWIN2))
    );
    // The hash entries list the sidecar by its own name.
    for key in [SIDECARSET_HASH, SIDECARSET_HASH_WITHOUT_IMAGE] {
        let entry = pod_entry(&pod, key, &fx.name).expect("an entry for the SidecarSet");
        assert_eq!(entry["sidecarList"], json!([SIDECAR]), "{key}: {entry}");
    }
    assert_eq!(
        annotation(&pod, SIDECARSET_INJECTED_LIST),
        Some(fx.name.as_str())
    );

    let (_, pods) = fx
        .wait(false, counts(1, 1, 1, 1), |set, pods| {
            rollout_done(set)?;
            all_at_rest(pods, TWIN1, OLD_IMAGE)
        })
        .await;
    assert_eq!(pods[0].spec, pod.spec, "nothing to upgrade");
}

// --- 2. Upgrade and flip -----------------------------------------------------------------------

/// Upstream's "sidecarSet upgrade hot sidecar container image", one step at a time: the new
/// image goes to the idle twin `mesh-2`, which becomes the working one (versions record the
/// SidecarSet's resourceVersion); the old twin keeps its image until the kubelet reports the
/// new one running, then goes to the empty image. The app container never changes. Changing the
/// image back makes `mesh-1` the working twin again.
#[tokio::test]
async fn an_image_change_upgrades_the_idle_twin_then_empties_the_old_one() {
    let fx = Fixture::new("hot-upgrade").await;
    let mut spec = hot_set(&fx.name, &fx.app, &fx.ns);
    let set = create_sidecarset(&fx.client, &spec).await;
    let name = fx.start_pods(1, &set).await.remove(0);
    let (_, pods) = fx
        .wait(false, counts(1, 1, 1, 1), |set, _| rollout_done(set))
        .await;
    let before = pods[0].clone();

    let containers = containers_with(&mut spec, "image", json!(NEW_IMAGE));
    let changed = update_spec(&fx.client, &fx.name, json!({"containers": containers})).await;
    let changed_at = parse_version(changed.metadata.resource_version.as_deref(), "the update");

    // Step 2 (kubelet off): mesh-2 gets the new image and works; mesh-1 keeps serving. The pod
    // counts updated, not ready (its other twin is not on the empty image).
    let (_, pods) = fx
        .wait(false, counts(1, 1, 0, 0), |_, pods| {
            let pod = &pods[0];
            if spec_image(pod, TWIN2) == NEW_IMAGE && working(pod) == TWIN2 {
                Ok(())
            } else {
                Err("mesh-2 not upgraded yet".to_owned())
            }
        })
        .await;
    let upgraded = &pods[0];
    assert_eq!(
        spec_image(upgraded, TWIN1),
        OLD_IMAGE,
        "no flip before mesh-2 runs: {}",
        describe_twins(upgraded)
    );
    assert_eq!(
        annotation(upgraded, SIDECARSET_WORKING_HOTUPGRADE_CONTAINER),
        Some(r#"{"mesh":"mesh-2"}"#)
    );
    let upgraded_at = parse_version(version(upgraded, TWIN2), "version of mesh-2");
    let now = parse_version(
        get_set(&fx.client, &fx.name)
            .await
            .metadata
            .resource_version
            .as_deref(),
        "the SidecarSet now",
    );
    assert!(
        (changed_at..=now).contains(&upgraded_at),
        "version of mesh-2 {upgraded_at}: the SidecarSet's resourceVersion at the upgrade, \
         between {changed_at} and {now}"
    );
    let r = upgraded_at.to_string();
    assert_eq!(
        versions(upgraded),
        some(["1", &r, &r, "1"]),
        "{}",
        describe_twins(upgraded)
    );
    assert_eq!(pod_hash(upgraded, &fx.name), hash_of(&changed));
    let state = pod_entry(upgraded, SIDECARSET_INPLACE_UPDATE_STATE, &fx.name)
        .unwrap_or_else(|| panic!("no in-place update state: {:?}", upgraded.annotations()));
    assert_eq!(
        state["lastContainerStatuses"][TWIN2],
        json!({"imageID": kubelet::image_id(EMPTY_IMAGE)}),
        "the imageID mesh-2 ran before: {state}"
    );
    assert_eq!(
        container_json(upgraded, "main"),
        container_json(&before, "main")
    );

    // The kubelet restarts mesh-2 on the new image: the flip empties mesh-1.
    kubelet::restart_changed(&fx.pods, &name)
        .await
        .expect("mesh-2 had a new image to run");
    let flipped = poll("the flip of mesh-1", ROLLOUT_TIMEOUT, || async {
        let pod = fx.pod(&name).await;
        if spec_image(&pod, TWIN1) == EMPTY_IMAGE {
            Ok(pod)
        } else {
            Err(describe_twins(&pod))
        }
    })
    .await;
    assert_eq!(versions(&flipped), some(["0", &r, &r, "0"]));
    assert_eq!(working(&flipped), TWIN2);
    assert_eq!(spec_image(&flipped, TWIN2), NEW_IMAGE);
    assert_eq!(
        annotation(&flipped, SIDECARSET_HASH),
        annotation(upgraded, SIDECARSET_HASH),
        "the flip does not touch the hash"
    );
    let (_, pods) = fx
        .wait(true, counts(1, 1, 1, 1), |set, pods| {
            rollout_done(set)?;
            all_at_rest(pods, TWIN2, NEW_IMAGE)
        })
        .await;
    let after = &pods[0];
    assert_eq!(after.metadata.uid, before.metadata.uid);
    assert_eq!(
        container_json(after, "main"),
        container_json(&before, "main")
    );
    assert_eq!(restarts(after, "main"), restarts(&before, "main"));
    assert_eq!(versions(after), some(["0", &r, &r, "0"]));

    // The flip is told on the pod.
    let events = Api::<Event>::namespaced(fx.client.clone(), &fx.ns);
    let params = ListParams::default().fields(&format!(
        "involvedObject.name={name},reason=ResetContainerSucceed"
    ));
    let (events, params) = (&events, &params);
    poll(
        "a ResetContainerSucceed event on the pod",
        CACHE_TIMEOUT,
        || async move {
            let list = events.list(params).await.expect("listing events").items;
            if list.is_empty() {
                Err("no such event".to_owned())
            } else {
                Ok(())
            }
        },
    )
    .await;

    // Back to the old image: it goes to mesh-1, now the idle twin.
    let containers = containers_with(&mut spec, "image", json!(OLD_IMAGE));
    update_spec(&fx.client, &fx.name, json!({"containers": containers})).await;
    let (_, pods) = fx
        .wait(true, counts(1, 1, 1, 1), |set, pods| {
            rollout_done(set)?;
            all_at_rest(pods, TWIN1, OLD_IMAGE)
        })
        .await;
    let back = &pods[0];
    let again = parse_version(version(back, TWIN1), "version of mesh-1");
    assert!(again > upgraded_at, "{again} after {upgraded_at}");
    let a = again.to_string();
    assert_eq!(versions(back), some([&a, "0", "0", &a]));
    assert_eq!(back.metadata.uid, before.metadata.uid);
    assert_eq!(
        container_json(back, "main"),
        container_json(&before, "main")
    );
    assert_eq!(restarts(back, "main"), restarts(&before, "main"));
}

/// Upstream checks a paused rollout before it flips: a pod upgraded before the pause keeps
/// its old twin on the old image, even once the new twin runs, until the rollout resumes.
#[tokio::test]
async fn a_paused_rollout_holds_the_flip_until_it_resumes() {
    let fx = Fixture::new("hot-paused").await;
    let mut spec = hot_set(&fx.name, &fx.app, &fx.ns);
    let set = create_sidecarset(&fx.client, &spec).await;
    let name = fx.start_pods(1, &set).await.remove(0);
    fx.wait(false, counts(1, 1, 1, 1), |set, _| rollout_done(set))
        .await;

    let containers = containers_with(&mut spec, "image", json!(NEW_IMAGE));
    update_spec(&fx.client, &fx.name, json!({"containers": containers})).await;
    fx.wait(false, counts(1, 1, 0, 0), |_, pods| {
        (spec_image(&pods[0], TWIN2) == NEW_IMAGE)
            .then_some(())
            .ok_or_else(|| "mesh-2 not upgraded yet".to_owned())
    })
    .await;
    update_spec(
        &fx.client,
        &fx.name,
        json!({"updateStrategy": {"paused": true}}),
    )
    .await;
    fx.wait(false, counts(1, 1, 0, 0), |_, _| Ok(())).await;
    kubelet::restart_changed(&fx.pods, &name)
        .await
        .expect("mesh-2 had a new image to run");
    // A spec change after the restart: once its generation is observed, the controller has
    // seen the new twin running, paused.
    update_spec(
        &fx.client,
        &fx.name,
        json!({"updateStrategy": {"paused": true, "maxUnavailable": 2}}),
    )
    .await;
    // (Every pod is updated, so `RolloutHeld` says `Updated`, not `Paused`: no pod waits for
    // the batch; the flip is held all the same.)
    let (_, pods) = fx.wait(false, counts(1, 1, 0, 0), |_, _| Ok(())).await;
    let pod = &pods[0];
    assert!(
        kubelet::runs(pod, TWIN2, NEW_IMAGE),
        "{}",
        describe_twins(pod)
    );
    assert_eq!(
        spec_image(pod, TWIN1),
        OLD_IMAGE,
        "paused: no flip; {}",
        describe_twins(pod)
    );

    update_spec(
        &fx.client,
        &fx.name,
        json!({"updateStrategy": {"paused": false}}),
    )
    .await;
    fx.wait(true, counts(1, 1, 1, 1), |set, pods| {
        rollout_done(set)?;
        all_at_rest(pods, TWIN2, NEW_IMAGE)
    })
    .await;
}

// --- 3. maxUnavailable -------------------------------------------------------------------------

/// Whether the pod is in the middle of a hot upgrade to `image`: its hash is `hash` (updated),
/// and its working twin does not run `image` or its other twin does not run the empty image.
fn in_flight(pod: &Pod, set: &str, hash: &str, image: &str) -> bool {
    if pod_hash(pod, set) != hash {
        return false;
    }
    let w = working(pod);
    let other = if w == TWIN1 { TWIN2 } else { TWIN1 };
    let done = spec_image(pod, &w) == image
        && kubelet::runs(pod, &w, image)
        && spec_image(pod, other) == EMPTY_IMAGE
        && kubelet::runs(pod, other, EMPTY_IMAGE);
    !done
}

/// Upstream's maxUnavailable rule for hot sidecars: a pod stays in flight from its upgrade
/// until its flip is done (the old twin running the empty image), so with maxUnavailable 1 the
/// second pod is not upgraded before then. A watch on the pods sees every version of each
/// and checks that never both are in flight.
#[tokio::test]
async fn max_unavailable_holds_the_second_pod_until_the_first_flip_is_done() {
    let fx = Fixture::new("hot-maxunavail").await;
    let mut spec = hot_set(&fx.name, &fx.app, &fx.ns);
    spec["spec"]["updateStrategy"]["maxUnavailable"] = json!(1);
    let set = create_sidecarset(&fx.client, &spec).await;
    fx.start_pods(2, &set).await;
    let (_, before) = fx
        .wait(false, counts(2, 2, 2, 2), |set, _| rollout_done(set))
        .await;

    let containers = containers_with(&mut spec, "image", json!(NEW_IMAGE));
    let changed = update_spec(&fx.client, &fx.name, json!({"containers": containers})).await;
    let new_hash = hash_of(&changed);

    // Every version of every pod, in the order the apiserver wrote them.
    let most = Arc::new(Mutex::new((0usize, Vec::<String>::new())));
    let observer = {
        let (pods, most) = (fx.pods.clone(), most.clone());
        let (set, hash) = (fx.name.clone(), new_hash.clone());
        tokio::spawn(async move {
            let mut latest: BTreeMap<String, Pod> = BTreeMap::new();
            let stream = watcher(pods, watcher::Config::default())
                .default_backoff()
                .applied_objects();
            let mut stream = std::pin::pin!(stream);
            while let Ok(Some(pod)) = stream.try_next().await {
                latest.insert(pod.name_any(), pod);
                let flying: Vec<String> = latest
                    .values()
                    .filter(|p| in_flight(p, &set, &hash, NEW_IMAGE))
                    .map(describe_twins)
                    .collect();
                let mut most = most.lock().expect("lock");
                if flying.len() > most.0 {
                    *most = (flying.len(), flying);
                }
            }
        })
    };

    // One pod is upgraded; the other waits.
    let (_, pods) = fx
        .wait(false, counts(2, 1, 1, 0), |set, pods| {
            expect_condition(set, "RolloutHeld", "True", "MaxUnavailableReached")?;
            let upgraded = pods
                .iter()
                .filter(|p| spec_image(p, TWIN2) == NEW_IMAGE)
                .count();
            if upgraded == 1 {
                Ok(())
            } else {
                Err(format!("{upgraded} pods upgraded"))
            }
        })
        .await;
    let first = pods
        .iter()
        .find(|p| spec_image(p, TWIN2) == NEW_IMAGE)
        .expect("the upgraded pod")
        .name_any();
    let second = pods
        .iter()
        .find(|p| p.name_any() != first)
        .expect("the other pod")
        .name_any();
    let untouched = |pods: &[Pod]| {
        let now = pods
            .iter()
            .find(|p| p.name_any() == second)
            .expect("second");
        let was = before
            .iter()
            .find(|p| p.name_any() == second)
            .expect("second");
        assert_eq!(
            now.spec,
            was.spec,
            "{second} must wait: {}",
            describe_twins(now)
        );
        assert_eq!(now.annotations(), was.annotations());
    };
    untouched(&pods);

    // The first pod's new twin runs: its flip follows, and it is still in flight until the old
    // twin runs the empty image.
    kubelet::restart_changed(&fx.pods, &first)
        .await
        .expect("mesh-2 of the first pod had a new image");
    let (_, pods) = fx
        .wait(false, counts(2, 1, 1, 0), |set, pods| {
            expect_condition(set, "RolloutHeld", "True", "MaxUnavailableReached")?;
            let pod = pods.iter().find(|p| p.name_any() == first).expect("first");
            if spec_image(pod, TWIN1) == EMPTY_IMAGE {
                Ok(())
            } else {
                Err("the first pod's flip not done yet".to_owned())
            }
        })
        .await;
    untouched(&pods);

    // The flip done: the second pod's turn.
    kubelet::restart_changed(&fx.pods, &first)
        .await
        .expect("mesh-1 of the first pod had the empty image to run");
    fx.wait(false, counts(2, 2, 1, 1), |_, pods| {
        let pod = pods
            .iter()
            .find(|p| p.name_any() == second)
            .expect("second");
        if spec_image(pod, TWIN2) == NEW_IMAGE {
            Ok(())
        } else {
            Err("the second pod not upgraded yet".to_owned())
        }
    })
    .await;
    fx.wait(true, counts(2, 2, 2, 2), |set, pods| {
        rollout_done(set)?;
        all_at_rest(pods, TWIN2, NEW_IMAGE)
    })
    .await;
    observer.abort();
    let (most, flying) = most.lock().expect("lock").clone();
    assert_eq!(
        most, 1,
        "maxUnavailable 1: at most one pod in flight, and the watch saw one: {flying:?}"
    );
}

// --- 3b. A failing image ------------------------------------------------------------------------

/// Upstream's "sidecarSet upgrade hot sidecar container failed image": with maxUnavailable 1
/// the first pod's new twin fails to pull, so it works on paper only: its old twin keeps the old
/// image and stays ready, the pod counts updated and not ready, and the second pod is never
/// taken. A good image then goes to the failed twin, and both pods finish.
#[tokio::test]
async fn a_failing_image_leaves_the_old_twin_serving_and_holds_the_rollout() {
    let fx = Fixture::new("hot-failed").await;
    let mut spec = hot_set(&fx.name, &fx.app, &fx.ns);
    let set = create_sidecarset(&fx.client, &spec).await;
    fx.start_pods(2, &set).await;
    let (_, before) = fx
        .wait(false, counts(2, 2, 2, 2), |set, _| rollout_done(set))
        .await;

    let containers = containers_with(&mut spec, "image", json!(BAD_IMAGE));
    update_spec(&fx.client, &fx.name, json!({"containers": containers})).await;
    let (_, pods) = fx
        .wait(true, counts(2, 1, 1, 0), |set, pods| {
            expect_condition(set, "RolloutHeld", "True", "MaxUnavailableReached")?;
            let failing = pods
                .iter()
                .filter(|p| spec_image(p, TWIN2) == BAD_IMAGE)
                .count();
            assert!(
                failing <= 1,
                "maxUnavailable 1, yet {failing} pods got {BAD_IMAGE}"
            );
            if failing == 1 {
                Ok(())
            } else {
                Err("no pod on the failing image yet".to_owned())
            }
        })
        .await;
    let failed = pods
        .iter()
        .find(|p| spec_image(p, TWIN2) == BAD_IMAGE)
        .expect("the failed pod");
    assert_eq!(working(failed), TWIN2, "{}", describe_twins(failed));
    assert_eq!(spec_image(failed, TWIN1), OLD_IMAGE, "no flip");
    assert!(
        kubelet::runs(failed, TWIN1, OLD_IMAGE),
        "the old twin still serves: {}",
        describe_twins(failed)
    );
    assert!(!kubelet::pod_ready(failed));
    let other = pods
        .iter()
        .find(|p| p.name_any() != failed.name_any())
        .expect("the other pod");
    let was = before
        .iter()
        .find(|p| p.name_any() == other.name_any())
        .expect("the other pod before");
    assert_eq!(other.spec, was.spec, "the other pod is not taken");
    assert_eq!(other.annotations(), was.annotations());

    let containers = containers_with(&mut spec, "image", json!(NEW_IMAGE));
    update_spec(&fx.client, &fx.name, json!({"containers": containers})).await;
    let (_, pods) = fx
        .wait(true, counts(2, 2, 2, 2), |set, pods| {
            rollout_done(set)?;
            all_at_rest(pods, TWIN2, NEW_IMAGE)
        })
        .await;
    for pod in &pods {
        let was = before
            .iter()
            .find(|p| p.name_any() == pod.name_any())
            .expect("the same pods");
        assert_eq!(pod.metadata.uid, was.metadata.uid);
    }
}

// --- 4. A pod upstream's webhook injected -------------------------------------------------------

/// A pod injected by upstream's webhook (its twins, env and annotations written here in
/// upstream's bytes, in a namespace kruise-rs's webhook leaves alone) is counted and upgraded
/// like one kruise-rs injected.
#[tokio::test]
async fn a_pod_injected_by_upstream_is_owned_and_upgraded() {
    let fx = Fixture::without_webhook("hot-upstream").await;
    let mut spec = hot_set(&fx.name, &fx.app, &fx.ns);
    create_sidecarset(&fx.client, &spec).await;
    let set = poll(
        "the SidecarSet's hashes and latest revision",
        ROLLOUT_TIMEOUT,
        || async {
            let set = get_set(&fx.client, &fx.name).await;
            let ready = set.annotations().contains_key(SIDECARSET_HASH)
                && set
                    .annotations()
                    .contains_key(SIDECARSET_HASH_WITHOUT_IMAGE)
                && set
                    .status
                    .as_ref()
                    .is_some_and(|s| s.latest_revision.is_some());
            if ready {
                Ok(set)
            } else {
                Err(describe_set(&set))
            }
        },
    )
    .await;
    let hash = hash_of(&set);
    let without_image = set.annotations()[SIDECARSET_HASH_WITHOUT_IMAGE].clone();
    let revision = set
        .status
        .as_ref()
        .and_then(|s| s.latest_revision.clone())
        .expect("latestRevision");
    let name = &fx.name;
    let at = "2026-11-30T08:00:00Z";
    let twin = |twin: &str, image: &str| {
        json!({
            "name": twin,
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            "command": ["tail", "-f", "/dev/null"],
            "env": [
                {"name": "PROXY_PORT", "value": "15001"},
                {"name": "IS_INJECTED", "value": "true"},
                {"name": SIDECARSET_VERSION_ENV, "valueFrom": {"fieldRef": {
                    "fieldPath": format!("metadata.annotations['{SIDECARSET_VERSION_PREFIX}{twin}']")}}},
                {"name": SIDECARSET_VERSION_ALT_ENV, "valueFrom": {"fieldRef": {
                    "fieldPath": format!("metadata.annotations['{SIDECARSET_VERSION_ALT_PREFIX}{twin}']")}}},
            ],
        })
    };
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": unique_name("upstream"),
            "labels": {"app": &fx.app},
            "annotations": {
                SIDECARSET_HASH: format!(
                    r#"{{"{name}":{{"updateTimestamp":"{at}","hash":"{hash}","sidecarSetName":"{name}","sidecarList":["mesh"],"controllerRevision":"{revision}"}}}}"#
                ),
                SIDECARSET_HASH_WITHOUT_IMAGE: format!(
                    r#"{{"{name}":{{"updateTimestamp":"{at}","hash":"{without_image}","sidecarSetName":"{name}","sidecarList":["mesh"]}}}}"#
                ),
                SIDECARSET_INJECTED_LIST: name,
                SIDECARSET_WORKING_HOTUPGRADE_CONTAINER: r#"{"mesh":"mesh-1"}"#,
                format!("{SIDECARSET_VERSION_PREFIX}{TWIN1}"): "1",
                format!("{SIDECARSET_VERSION_ALT_PREFIX}{TWIN1}"): "0",
                format!("{SIDECARSET_VERSION_PREFIX}{TWIN2}"): "0",
                format!("{SIDECARSET_VERSION_ALT_PREFIX}{TWIN2}"): "1",
            },
        },
        "spec": {"containers": [
            twin(TWIN1, OLD_IMAGE),
            twin(TWIN2, EMPTY_IMAGE),
            {"name": "main", "image": "busybox:1.36", "command": ["/bin/sh", "-c", "sleep 10000000"]},
        ]},
    }))
    .expect("a pod");
    let created = fx
        .pods
        .create(&PostParams::default(), &pod)
        .await
        .expect("creating the upstream pod");
    assert_eq!(
        container_names(&created),
        [TWIN1, TWIN2, "main"],
        "not injected again"
    );
    let pod_name = created.name_any();
    kubelet::start(&fx.pods, &pod_name).await;
    fx.wait(false, counts(1, 1, 1, 1), |set, pods| {
        rollout_done(set)?;
        all_at_rest(pods, TWIN1, OLD_IMAGE)
    })
    .await;

    let containers = containers_with(&mut spec, "image", json!(NEW_IMAGE));
    let changed = update_spec(&fx.client, &fx.name, json!({"containers": containers})).await;
    let (_, pods) = fx
        .wait(true, counts(1, 1, 1, 1), |set, pods| {
            rollout_done(set)?;
            all_at_rest(pods, TWIN2, NEW_IMAGE)
        })
        .await;
    let after = &pods[0];
    assert_eq!(after.metadata.uid, created.metadata.uid);
    assert_eq!(pod_hash(after, &fx.name), hash_of(&changed));
    let r = parse_version(version(after, TWIN2), "version of mesh-2").to_string();
    assert_eq!(versions(after), some(["0", &r, &r, "0"]));
    assert_eq!(
        container_json(after, "main"),
        container_json(&created, "main")
    );
}

// --- 5. A change beyond the image --------------------------------------------------------------

/// Upstream's last step of "sidecarSet upgrade hot sidecar container image": an env change of
/// the hot sidecar cannot be made in place, so the pod keeps its twins as they are and counts
/// not updated, as for a cold sidecar.
#[tokio::test]
async fn a_change_beyond_the_image_does_not_upgrade_hot_twins() {
    let fx = Fixture::new("hot-env").await;
    let mut spec = hot_set(&fx.name, &fx.app, &fx.ns);
    let set = create_sidecarset(&fx.client, &spec).await;
    fx.start_pods(1, &set).await;
    let (_, before) = fx
        .wait(false, counts(1, 1, 1, 1), |set, _| rollout_done(set))
        .await;

    let env = json!([{"name": "PROXY_PORT", "value": "15002"}]);
    let containers = containers_with(&mut spec, "env", env);
    update_spec(&fx.client, &fx.name, json!({"containers": containers})).await;
    let (_, after) = fx
        .wait(true, counts(1, 0, 1, 0), |set, _| {
            expect_condition(set, "PodsUpgradable", "False", "NotUpgradablePods")
        })
        .await;
    assert_eq!(after[0].spec, before[0].spec, "the pod must not be updated");
    assert_eq!(versions(&after[0]), versions(&before[0]));
    assert_eq!(working(&after[0]), TWIN1);
}

// --- Init containers ---------------------------------------------------------------------------

fn init_json(pod: &Pod, name: &str) -> Option<Value> {
    pod.spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .find(|c| c.name == name)
        .map(|c| serde_json::to_value(c).expect("a container serializes"))
}

fn init_names(pod: &Pod) -> Vec<String> {
    pod.spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .map(|c| c.name.clone())
        .collect()
}

/// Upstream's injection rule for init containers: a native sidecar (`restartPolicy: Always`)
/// with `HotUpgrade` gets its twins like a container does (kruise-rs admits that in a
/// `NotUpdate` SidecarSet only), a plain init container is injected as written; the working
/// map covers every hot sidecar of the pod, in Go's bytes (keys sorted). The pod is counted by
/// its container twins.
#[tokio::test]
async fn native_sidecar_init_containers_get_twins_and_plain_ones_do_not() {
    let fx = Fixture::new("hot-init").await;
    let mut spec = hot_set(&fx.name, &fx.app, &fx.ns);
    // Native sidecars cannot be rolled (validation): NotUpdate, as upstream requires.
    spec["spec"]["updateStrategy"] = json!({"type": "NotUpdate"});
    spec["spec"]["initContainers"] = json!([
        {
            "name": "netproxy",
            "image": OLD_IMAGE,
            "command": ["tail", "-f", "/dev/null"],
            "restartPolicy": "Always",
            "upgradeStrategy": {"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": EMPTY_IMAGE},
        },
        {
            "name": "setup",
            "image": EMPTY_IMAGE,
            "command": ["/bin/sh", "-c", "true"],
        },
    ]);
    let set = create_sidecarset(&fx.client, &spec).await;
    let name = fx.start_pods(1, &set).await.remove(0);
    let pod = fx.pod(&name).await;

    let names = init_names(&pod);
    for expected in ["netproxy-1", "netproxy-2", "setup"] {
        assert!(
            names.iter().any(|n| n == expected),
            "init containers {names:?}"
        );
    }
    assert!(
        !names
            .iter()
            .any(|n| n == "netproxy" || n.starts_with("setup-")),
        "init containers {names:?}"
    );
    let position = |n: &str| names.iter().position(|m| m == n);
    assert!(position("netproxy-1") < position("netproxy-2"), "{names:?}");
    let first = init_json(&pod, "netproxy-1").expect("netproxy-1");
    let second = init_json(&pod, "netproxy-2").expect("netproxy-2");
    assert_eq!(first["image"], json!(OLD_IMAGE));
    assert_eq!(second["image"], json!(EMPTY_IMAGE));
    assert_eq!(first["restartPolicy"], json!("Always"));
    assert_eq!(second["restartPolicy"], json!("Always"));
    for (twin, container) in [("netproxy-1", &first), ("netproxy-2", &second)] {
        let env = container["env"].as_array().cloned().unwrap_or_default();
        let paths: Vec<&str> = env
            .iter()
            .filter_map(|e| e["valueFrom"]["fieldRef"]["fieldPath"].as_str())
            .collect();
        assert_eq!(
            paths,
            [
                format!("metadata.annotations['{SIDECARSET_VERSION_PREFIX}{twin}']"),
                format!("metadata.annotations['{SIDECARSET_VERSION_ALT_PREFIX}{twin}']"),
            ],
            "{twin}: {env:?}"
        );
    }
    let setup = init_json(&pod, "setup").expect("setup");
    assert_eq!(setup["image"], json!(EMPTY_IMAGE));
    assert!(
        !setup["env"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["name"] == SIDECARSET_VERSION_ENV),
        "a plain init container gets no version env: {setup}"
    );
    assert_eq!(
        annotation(&pod, SIDECARSET_WORKING_HOTUPGRADE_CONTAINER),
        Some(r#"{"mesh":"mesh-1","netproxy":"netproxy-1"}"#)
    );
    for (twin, v, alt) in [("netproxy-1", "1", "0"), ("netproxy-2", "0", "1")] {
        assert_eq!(version(&pod, twin), Some(v), "{twin}");
        assert_eq!(version_alt(&pod, twin), Some(alt), "{twin}");
    }
    assert_eq!(versions(&pod), some(["1", "0", "0", "1"]));
    fx.wait(false, counts(1, 1, 1, 1), |_, _| Ok(())).await;
}

// --- Validation --------------------------------------------------------------------------------

/// Upstream injects a hot sidecar without `hotUpgradeEmptyImage` as an idle twin with no image,
/// which the apiserver refuses pod by pod; kruise-rs refuses the SidecarSet, naming the field.
#[tokio::test]
async fn hot_upgrade_without_an_empty_image_is_refused_naming_the_field() {
    let client = client().await;
    let name = unique_name("hot-noempty");
    let mut spec = hot_set(&name, "x", "x");
    spec["spec"]["containers"][0]["upgradeStrategy"] = json!({"upgradeType": "HotUpgrade"});
    let set: SidecarSet = serde_json::from_value(spec).expect("a SidecarSet");
    let result = Api::<SidecarSet>::all(client.clone())
        .create(&PostParams::default(), &set)
        .await;
    let message = match result {
        Err(kube::Error::Api(status)) => status.message,
        other => {
            panic!("a HotUpgrade sidecar without hotUpgradeEmptyImage was admitted: {other:?}")
        }
    };
    assert!(
        message.contains("spec.containers[0].upgradeStrategy.hotUpgradeEmptyImage"),
        "{message}"
    );

    // On init containers: a plain one never (upstream ignores it there); a native sidecar only
    // in a SidecarSet that does not update pods (kruise-rs upgrades native sidecars in place).
    let hot = json!({"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": EMPTY_IMAGE});
    let mut spec = hot_set(&unique_name("hot-init-bad"), "x", "x");
    spec["spec"]["initContainers"] = json!([
        {"name": "native", "image": OLD_IMAGE, "restartPolicy": "Always", "upgradeStrategy": hot},
        {"name": "plain", "image": OLD_IMAGE, "upgradeStrategy": {"upgradeType": "HotUpgrade"}},
    ]);
    let set: SidecarSet = serde_json::from_value(spec).expect("a SidecarSet");
    let message = match Api::<SidecarSet>::all(client)
        .create(&PostParams::default(), &set)
        .await
    {
        Err(kube::Error::Api(status)) => status.message,
        other => {
            panic!("HotUpgrade init containers of a rolling SidecarSet were admitted: {other:?}")
        }
    };
    for field in [
        "spec.initContainers[0].upgradeStrategy.upgradeType",
        "spec.initContainers[1].upgradeStrategy.upgradeType",
    ] {
        assert!(message.contains(field), "{field}: {message}");
    }
}
