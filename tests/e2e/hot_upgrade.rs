//! SidecarSet hot upgrade on a real kubelet (upstream's three `[SidecarSetHotUpgrade]` cases,
//! `docs/hot-upgrade-plan.md`): a hot sidecar `mesh` runs as twins `mesh-1` and `mesh-2`; an
//! image change starts the idle twin on the new image, and once the kubelet runs it the old twin
//! is restarted on the empty image. The pod and its app container stay.
//!
//! Images: the test images copied to a repository of these tests' own, `e2e/hot` (the
//! ImagePullJob test needs `e2e/app:v3` to reach the node through its job only): `v1` is the
//! empty image (`hotUpgradeEmptyImage`), `v2` and `v3` the sidecar's versions; all are busybox,
//! so every twin runs the sidecar's command whatever its image. That
//! command prints the two version variables the twin got through the downward API when it
//! started, so the test reads them from the container's log, as the sidecar itself sees them.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::{Arc, Mutex};

use futures::TryStreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kruise_rs_api::SidecarSet;
use kube::api::{Api, LogParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use tokio::sync::OnceCell;

use crate::sidecarset::{
    create_sidecarset_injecting, deployment, ready, running_pods, running_started_at, status,
};
use crate::support::{self, Cluster, TIMEOUT, wait_for};

const SIDECAR: &str = "mesh";
const TWIN1: &str = "mesh-1";
const TWIN2: &str = "mesh-2";
const WORKING: &str = "kruise.io/sidecarset-working-hotupgrade-container";

/// The sidecar: prints the versions it started with, then waits (exits on TERM at once).
fn mesh(image: &str, empty: &str) -> Value {
    json!({
        "name": SIDECAR,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": [
            "/bin/busybox", "sh", "-c",
            "echo \"version=$SIDECARSET_VERSION alt=$SIDECARSET_VERSION_ALT\"; \
             trap 'exit 0' TERM; while true; do sleep 1; done"
        ],
        "upgradeStrategy": {"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": empty},
    })
}

fn hot_sidecarset(
    name: &str,
    namespace: &str,
    image: &str,
    empty: &str,
    max_unavailable: i32,
) -> SidecarSet {
    serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "SidecarSet",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "containers": [mesh(image, empty)],
            "updateStrategy": {"type": "RollingUpdate", "maxUnavailable": max_unavailable}
        }
    }))
    .expect("a SidecarSet")
}

/// Creates the SidecarSet and waits until the webhook injects its twins into a dry-run pod.
async fn create_hot_sidecarset(cluster: &Cluster, set: &SidecarSet, namespace: &str) {
    create_sidecarset_injecting(cluster, set, namespace, TWIN1).await;
}

async fn set_image(cluster: &Cluster, name: &str, image: &str, empty: &str) {
    let api: Api<SidecarSet> = Api::all(cluster.client());
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"containers": [mesh(image, empty)]}})),
    )
    .await
    .unwrap_or_else(|e| panic!("setting the sidecar image of {name} to {image}: {e}"));
}

fn annotation<'p>(pod: &'p Pod, key: &str) -> Option<&'p str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

fn version(pod: &Pod, twin: &str) -> String {
    annotation(pod, &format!("version.sidecarset.kruise.io/{twin}"))
        .unwrap_or_default()
        .to_owned()
}

fn version_alt(pod: &Pod, twin: &str) -> String {
    annotation(pod, &format!("versionalt.sidecarset.kruise.io/{twin}"))
        .unwrap_or_default()
        .to_owned()
}

fn working(pod: &Pod) -> String {
    annotation(pod, WORKING)
        .and_then(|t| serde_json::from_str::<BTreeMap<String, String>>(t).ok())
        .and_then(|m| m.get(SIDECAR).cloned())
        .unwrap_or_default()
}

fn spec_image(pod: &Pod, container: &str) -> String {
    pod.spec
        .iter()
        .flat_map(|s| &s.containers)
        .find(|c| c.name == container)
        .and_then(|c| c.image.clone())
        .unwrap_or_default()
}

fn name_of(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}

/// Whether container `name` runs the image whose registry digest is `digest`, ready.
fn runs(pod: &Pod, name: &str, digest: &str) -> bool {
    status(pod, name).is_some_and(|s| {
        s.ready
            && s.image_id.ends_with(digest)
            && s.state.as_ref().is_some_and(|s| s.running.is_some())
    })
}

fn describe(pod: &Pod) -> String {
    let twin = |name: &str| {
        let reported = status(pod, name)
            .map(|s| {
                format!(
                    "{} ready={} restarts={}",
                    s.image_id, s.ready, s.restart_count
                )
            })
            .unwrap_or_else(|| "no status".to_owned());
        format!("{name} spec {} reported {reported}", spec_image(pod, name))
    };
    format!(
        "{}: {}; {}; working {:?}; versions {TWIN1} {}/{} {TWIN2} {}/{}; pod ready={}",
        name_of(pod),
        twin(TWIN1),
        twin(TWIN2),
        working(pod),
        version(pod, TWIN1),
        version_alt(pod, TWIN1),
        version(pod, TWIN2),
        version_alt(pod, TWIN2),
        ready(pod)
    )
}

/// Whether the pod holds `mesh` at rest: `working_twin` on `image` and running it, the other
/// on `empty` and running it.
fn at_rest(
    pod: &Pod,
    working_twin: &str,
    (image, digest): (&str, &str),
    (empty, empty_digest): (&str, &str),
) -> bool {
    let other = if working_twin == TWIN1 { TWIN2 } else { TWIN1 };
    working(pod) == working_twin
        && spec_image(pod, working_twin) == image
        && runs(pod, working_twin, digest)
        && spec_image(pod, other) == empty
        && runs(pod, other, empty_digest)
}

/// Waits for the SidecarSet's status of its current generation to be these counts.
async fn wait_counts(cluster: &Cluster, name: &str, counts: [i32; 4]) -> SidecarSet {
    let api: Api<SidecarSet> = Api::all(cluster.client());
    let last = Arc::new(Mutex::new(String::new()));
    let what = format!("SidecarSet {name}: matched/updated/ready/updatedReady {counts:?}");
    let found = tokio::time::timeout(
        TIMEOUT,
        wait_for(&what, TIMEOUT * 2, || async {
            let set = api.get(name).await.ok()?;
            let status = set.status.clone()?;
            let seen = [
                status.matched_pods,
                status.updated_pods,
                status.ready_pods,
                status.updated_ready_pods,
            ];
            *last.lock().expect("lock") = format!(
                "observedGeneration {:?} of {:?}, counts {seen:?}",
                status.observed_generation, set.metadata.generation
            );
            (status.observed_generation == set.metadata.generation && seen == counts).then_some(set)
        }),
    )
    .await;
    found.unwrap_or_else(|_| {
        panic!(
            "timed out after {TIMEOUT:?} waiting for {what}; last seen {}",
            last.lock().expect("lock")
        )
    })
}

/// Waits until `check` accepts the pods of the Deployment `app` (`count` of them, none going).
async fn wait_pods(
    pods: &Api<Pod>,
    app: &str,
    count: usize,
    what: &str,
    check: impl Fn(&[Pod]) -> bool,
) -> Vec<Pod> {
    crate::support::wait_app_pods(pods, app, count, what, describe, check).await
}

/// The first line container `container` of pod `pod` logged since it last started.
async fn first_log_line(pods: &Api<Pod>, pod: &str, container: &str) -> String {
    let params = LogParams {
        container: Some(container.to_owned()),
        ..LogParams::default()
    };
    wait_for(
        &format!("a log line from {pod}/{container}"),
        TIMEOUT,
        || async {
            let text = pods.logs(pod, &params).await.ok()?;
            text.lines().next().map(str::to_owned)
        },
    )
    .await
}

async fn assert_logged(pods: &Api<Pod>, pod: &Pod, container: &str) {
    let expected = format!(
        "version={} alt={}",
        version(pod, container),
        version_alt(pod, container)
    );
    let line = first_log_line(pods, &name_of(pod), container).await;
    assert_eq!(
        line,
        expected,
        "{}: what {container} saw at its start",
        describe(pod)
    );
}

/// Images and their registry digests.
struct Images {
    v1: (String, String),
    v2: (String, String),
    v3: (String, String),
}

/// The repository the hot-upgrade tests pull from.
const REPOSITORY: &str = "e2e/hot";
static COPIED: OnceCell<()> = OnceCell::const_new();

impl Images {
    /// `e2e/app:{v1,v2,v3}` copied, registry to registry, to [`REPOSITORY`] (once per run).
    async fn new(cluster: &Cluster) -> Images {
        let image = |tag: &str| format!("{}/{REPOSITORY}:{tag}", cluster.registry);
        COPIED
            .get_or_init(|| async {
                for tag in ["v1", "v2", "v3"] {
                    let out = Command::new("skopeo")
                        .args([
                            "copy",
                            "-q",
                            "--src-tls-verify=false",
                            "--dest-tls-verify=false",
                        ])
                        .arg(format!("docker://{}", cluster.app_image(tag)))
                        .arg(format!("docker://{}", image(tag)))
                        .output()
                        .expect("running skopeo");
                    assert!(
                        out.status.success(),
                        "skopeo copy {} {}: {}",
                        cluster.app_image(tag),
                        image(tag),
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            })
            .await;
        let pair = |tag: &str| {
            let image = image(tag);
            let digest = support::registry_digest(&image);
            (image, digest)
        };
        Images {
            v1: pair("v1"),
            v2: pair("v2"),
            v3: pair("v3"),
        }
    }
}

fn pair(p: &(String, String)) -> (&str, &str) {
    (&p.0, &p.1)
}

/// (a) and (b): injection, then an image change and back, on one pod. The twins, the versions
/// each twin saw at its start (its log), the order of the two restarts (a watch on the pod),
/// the app container and the pod kept; then a non-image change is not applied in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_sidecar_twins_swap_on_a_real_kubelet() {
    let installed = support::installed().await;
    let cluster = installed.cluster;
    let ns = cluster.namespace("e2e-hot", json!({})).await;
    let name = support::unique_name("hot");
    let images = Images::new(cluster).await;
    let (empty, v2, v3) = (&images.v1.0, &images.v2.0, &images.v3.0);

    create_hot_sidecarset(
        cluster,
        &hot_sidecarset(&name, &ns.name, v2, empty, 1),
        &ns.name,
    )
    .await;
    let deployments: Api<Deployment> = Api::namespaced(cluster.client(), &ns.name);
    deployments
        .create(&PostParams::default(), &deployment(&name, empty, 1))
        .await
        .expect("creating the Deployment");
    let pods: Api<Pod> = Api::namespaced(cluster.client(), &ns.name);

    // (a) Injection: three containers, the twins running, the versions each saw.
    let before = running_pods(cluster, &ns.name, &name, 1).await.remove(0);
    let names: Vec<&str> = before
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(names, [TWIN1, TWIN2, "app"]);
    assert!(
        at_rest(&before, TWIN1, pair(&images.v2), pair(&images.v1)),
        "{}",
        describe(&before)
    );
    assert_eq!(annotation(&before, WORKING), Some(r#"{"mesh":"mesh-1"}"#));
    assert_eq!(
        [
            version(&before, TWIN1),
            version_alt(&before, TWIN1),
            version(&before, TWIN2),
            version_alt(&before, TWIN2)
        ],
        ["1", "0", "0", "1"]
    );
    assert_logged(&pods, &before, TWIN1).await;
    assert_logged(&pods, &before, TWIN2).await;
    wait_counts(cluster, &name, [1, 1, 1, 1]).await;

    // (b) The image change, watched version by version: mesh-2 becomes the working twin on v3
    // while mesh-1 keeps v2, and mesh-1 goes to the empty image only after mesh-2 ran v3.
    let pod_name = name_of(&before);
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let observer = {
        let (pods, seen) = (pods.clone(), seen.clone());
        let (v1, v2, v3) = (
            images.v1.0.clone(),
            images.v2.0.clone(),
            images.v3.0.clone(),
        );
        let v3_digest = images.v3.1.clone();
        let config = watcher::Config::default().fields(&format!("metadata.name={pod_name}"));
        tokio::spawn(async move {
            let stream = watcher(pods, config).default_backoff().applied_objects();
            let mut stream = std::pin::pin!(stream);
            let mut mesh2_ran_v3 = false;
            while let Ok(Some(pod)) = stream.try_next().await {
                let short = |image: &str| {
                    if image == v1 {
                        "empty"
                    } else if image == v2 {
                        "v2"
                    } else if image == v3 {
                        "v3"
                    } else {
                        "other"
                    }
                };
                let state = format!(
                    "working {} {TWIN1} {} {TWIN2} {}",
                    working(&pod),
                    short(&spec_image(&pod, TWIN1)),
                    short(&spec_image(&pod, TWIN2))
                );
                mesh2_ran_v3 |= runs(&pod, TWIN2, &v3_digest);
                let mut seen = seen.lock().expect("lock");
                if seen.last() != Some(&state) {
                    if spec_image(&pod, TWIN1) == v1 && !mesh2_ran_v3 {
                        seen.push(format!("FLIP BEFORE {TWIN2} RAN v3: {}", describe(&pod)));
                    }
                    seen.push(state);
                }
            }
        })
    };
    wait_for("the watch on the pod to start", TIMEOUT, || async {
        (!seen.lock().expect("lock").is_empty()).then_some(())
    })
    .await;
    set_image(cluster, &name, v3, empty).await;
    wait_counts(cluster, &name, [1, 1, 1, 1]).await;
    let after = wait_pods(
        &pods,
        &name,
        1,
        "mesh-2 working on v3, mesh-1 empty",
        |pods| at_rest(&pods[0], TWIN2, pair(&images.v3), pair(&images.v1)),
    )
    .await
    .remove(0);
    observer.abort();
    let states = seen.lock().expect("lock").clone();
    assert_eq!(
        states,
        [
            format!("working {TWIN1} {TWIN1} v2 {TWIN2} empty"),
            format!("working {TWIN2} {TWIN1} v2 {TWIN2} v3"),
            format!("working {TWIN2} {TWIN1} empty {TWIN2} v3"),
        ],
        "the pod's states, in order"
    );
    let r = version(&after, TWIN2);
    assert!(
        r.parse::<u64>().is_ok_and(|v| v > 1),
        "version of mesh-2: {r:?}"
    );
    assert_eq!(
        [
            version(&after, TWIN1),
            version_alt(&after, TWIN1),
            version_alt(&after, TWIN2)
        ],
        ["0".to_owned(), r.clone(), "0".to_owned()]
    );
    // What each twin saw when it started: mesh-2 at the upgrade (its alt: mesh-1's "1" then),
    // mesh-1 at the flip (empty, its alt the new version).
    let line = first_log_line(&pods, &pod_name, TWIN2).await;
    assert_eq!(line, format!("version={r} alt=1"));
    let line = first_log_line(&pods, &pod_name, TWIN1).await;
    assert_eq!(line, format!("version=0 alt={r}"));
    assert_same_pod_and_app(&before, &after);

    // Back to v2: mesh-1, the idle twin, takes it.
    set_image(cluster, &name, v2, empty).await;
    wait_counts(cluster, &name, [1, 1, 1, 1]).await;
    let back = wait_pods(
        &pods,
        &name,
        1,
        "mesh-1 working on v2, mesh-2 empty",
        |pods| at_rest(&pods[0], TWIN1, pair(&images.v2), pair(&images.v1)),
    )
    .await
    .remove(0);
    let r2 = version(&back, TWIN1);
    assert!(
        r2.parse::<u64>()
            .is_ok_and(|v| v > r.parse::<u64>().unwrap_or(u64::MAX)),
        "{r2:?} after {r:?}"
    );
    assert_eq!(
        [
            version_alt(&back, TWIN1),
            version(&back, TWIN2),
            version_alt(&back, TWIN2)
        ],
        ["0".to_owned(), "0".to_owned(), r2.clone()]
    );
    // mesh-1 started at the upgrade, when its alt was mesh-2's version; the flip changed the
    // annotation, not what the running container saw.
    let line = first_log_line(&pods, &pod_name, TWIN1).await;
    assert_eq!(line, format!("version={r2} alt={r}"));
    let line = first_log_line(&pods, &pod_name, TWIN2).await;
    assert_eq!(line, format!("version=0 alt={r2}"));
    assert_same_pod_and_app(&before, &back);

    // A change beyond the image: not applied in place.
    let sidecarsets: Api<SidecarSet> = Api::all(cluster.client());
    let mut changed = mesh(v2, empty);
    changed["env"] = json!([{"name": "PROXY", "value": "127.0.0.1"}]);
    sidecarsets
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"containers": [changed]}})),
        )
        .await
        .expect("an env change");
    wait_counts(cluster, &name, [1, 0, 1, 0]).await;
    let now = pods.get(&pod_name).await.expect("the pod");
    assert_eq!(now.spec, back.spec, "not upgraded: {}", describe(&now));
}

fn assert_same_pod_and_app(before: &Pod, after: &Pod) {
    assert_eq!(after.metadata.uid, before.metadata.uid, "the same pod");
    let (app, old) = (
        status(after, "app").expect("app status"),
        status(before, "app").expect("app status"),
    );
    assert_eq!(app.restart_count, old.restart_count, "app not restarted");
    assert_eq!(
        running_started_at(app),
        running_started_at(old),
        "app still the same process"
    );
    assert!(app.ready);
}

/// (c) A failing image on 2 pods with maxUnavailable 1: one pod's idle twin gets it and fails
/// to pull, the working annotation points at it, but the old twin still runs and is ready; the
/// other pod is not touched. A good image then finishes both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_hot_image_leaves_the_old_twin_serving() {
    let installed = support::installed().await;
    let cluster = installed.cluster;
    let ns = cluster.namespace("e2e-hot-fail", json!({})).await;
    let name = support::unique_name("hot-fail");
    let images = Images::new(cluster).await;
    let (empty, v2, v3) = (&images.v1.0, &images.v2.0, &images.v3.0);
    let bad = cluster.app_image("no-such-tag");

    create_hot_sidecarset(
        cluster,
        &hot_sidecarset(&name, &ns.name, v2, empty, 1),
        &ns.name,
    )
    .await;
    let deployments: Api<Deployment> = Api::namespaced(cluster.client(), &ns.name);
    deployments
        .create(&PostParams::default(), &deployment(&name, empty, 2))
        .await
        .expect("creating the Deployment");
    let pods: Api<Pod> = Api::namespaced(cluster.client(), &ns.name);
    let before = running_pods(cluster, &ns.name, &name, 2).await;
    wait_counts(cluster, &name, [2, 2, 2, 2]).await;

    set_image(cluster, &name, &bad, empty).await;
    wait_counts(cluster, &name, [2, 1, 1, 0]).await;
    let failing = |p: &Pod| {
        spec_image(p, TWIN2) == bad
            && status(p, TWIN2).is_some_and(|s| {
                !s.ready
                    && s.state
                        .as_ref()
                        .and_then(|s| s.waiting.as_ref())
                        .and_then(|w| w.reason.as_deref())
                        .is_some_and(|r| r == "ErrImagePull" || r == "ImagePullBackOff")
            })
    };
    let list = wait_pods(
        &pods,
        &name,
        2,
        "one pod failing to pull the bad image",
        |pods| pods.iter().filter(|p| failing(p)).count() == 1,
    )
    .await;
    let failed = list.iter().find(|p| failing(p)).expect("the failing pod");
    assert_eq!(working(failed), TWIN2, "{}", describe(failed));
    assert_eq!(
        spec_image(failed, TWIN1),
        *v2,
        "no flip: {}",
        describe(failed)
    );
    assert!(
        runs(failed, TWIN1, &images.v2.1),
        "the old twin serves: {}",
        describe(failed)
    );
    let other = list.iter().find(|p| !failing(p)).expect("the other pod");
    let was = before
        .iter()
        .find(|p| name_of(p) == name_of(other))
        .expect("the other pod was there");
    assert_eq!(
        other.spec,
        was.spec,
        "the other pod is not taken: {}",
        describe(other)
    );
    assert!(ready(other));

    set_image(cluster, &name, v3, empty).await;
    wait_counts(cluster, &name, [2, 2, 2, 2]).await;
    let after = wait_pods(
        &pods,
        &name,
        2,
        "both pods: mesh-2 working on v3, mesh-1 empty",
        |pods| {
            pods.iter()
                .all(|p| at_rest(p, TWIN2, pair(&images.v3), pair(&images.v1)))
        },
    )
    .await;
    for pod in &after {
        let old = before
            .iter()
            .find(|p| name_of(p) == name_of(pod))
            .unwrap_or_else(|| panic!("pod {} is new: a pod was recreated", name_of(pod)));
        assert_same_pod_and_app(old, pod);
    }
}
