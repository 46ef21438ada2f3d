//! The SidecarSet controller killed and restarted in the middle of a rollout must still never
//! have more than `maxUnavailable` pods in flight, and must finish the rollout.
//!
//! In the webhook test cluster, 50 pods are injected by a SidecarSet (maxUnavailable 3) that
//! carries a label the cluster's own manager ignores; this test runs its own
//! `sidecarset::run`, confined to that label. After the sidecar image changes, the controller
//! task is stopped and started again 3–5 times at random points a few hundred milliseconds
//! apart: aborted (its task dropped mid-flight, as a crash would) except once, when it is shut
//! down cleanly. A background kubelet restarts changed containers after a random delay, and a
//! watch on the pods records the largest number of pods in flight seen at any event: spec
//! image new, but the pod not yet ready with the new image running.
//!
//! The random choices come from a seed, printed at the start and in every failure message;
//! `KRUISE_CRASH_SEED=<n>` replays one (timing still varies from run to run).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kruise_rs::controllers::{ControllerOptions, sidecarset};
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::sidecarset_upgrade::start_injected_pods;
use crate::sidecarset_upgrade::{
    NEW_IMAGE, SIDECAR, client, counts, counts_of, create_sidecarset, describe_set,
    ensure_manager_namespace, get_set, one_sidecar_set, poll, spec_image, update_spec,
};
use crate::support::kubelet::{self, BackgroundKubelet};
use crate::support::webhook::{MANAGER_NAMESPACE, webhook_cluster};
use crate::support::{seed_from_env, test_controller_options, unique_name};

const PODS: usize = 50;
const MAX_UNAVAILABLE: usize = 3;
/// The label confining this test's controller; the cluster's manager ignores it.
const CRASH_LABEL: &str = "kruise-rs-crash-test";
const SEED_VAR: &str = "KRUISE_CRASH_SEED";
/// How long the whole rollout may take once the last controller runs.
const FINISH_TIMEOUT: Duration = Duration::from_secs(180);
/// How long a clean shutdown may take.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(15);

/// Whether the pod is in flight: its sidecar's spec image is the new one, but the kubelet does
/// not report the pod ready with the new image running yet.
pub(crate) fn in_flight(pod: &Pod) -> bool {
    spec_image(pod, SIDECAR) == NEW_IMAGE
        && !(kubelet::pod_ready(pod) && kubelet::runs(pod, SIDECAR, NEW_IMAGE))
}

/// The most pods in flight seen at once, and which they were.
#[derive(Default)]
pub(crate) struct InFlightRecord {
    pub(crate) max: AtomicUsize,
    pub(crate) at_max: Mutex<Vec<String>>,
}

impl InFlightRecord {
    fn observe(&self, state: &BTreeMap<String, bool>) {
        let pods: Vec<String> = state
            .iter()
            .filter(|(_, flying)| **flying)
            .map(|(name, _)| name.clone())
            .collect();
        if pods.len() > self.max.fetch_max(pods.len(), Ordering::SeqCst) {
            *self.at_max.lock().expect("record lock") = pods;
        }
    }
}

/// Follows the pods of `pods`' namespace event by event (one watch, so events come in the
/// order the apiserver applied them) and records the most pods in flight; says on `listed`
/// once the initial list is in.
pub(crate) async fn track_in_flight(
    pods: Api<Pod>,
    record: Arc<InFlightRecord>,
    listed: oneshot::Sender<()>,
) {
    let mut listed = Some(listed);
    let mut state = BTreeMap::new();
    let mut relist = BTreeMap::new();
    let events = watcher(pods, watcher::Config::default()).default_backoff();
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => relist.clear(),
            Ok(watcher::Event::InitApply(pod)) => {
                relist.insert(pod.name_any(), in_flight(&pod));
            }
            Ok(watcher::Event::InitDone) => {
                state = std::mem::take(&mut relist);
                if let Some(tx) = listed.take() {
                    let _ = tx.send(());
                }
            }
            Ok(watcher::Event::Apply(pod)) => {
                state.insert(pod.name_any(), in_flight(&pod));
            }
            Ok(watcher::Event::Delete(pod)) => {
                state.remove(&pod.name_any());
            }
            Err(e) => eprintln!("in-flight tracker: watching pods: {e}"),
        }
        record.observe(&state);
    }
}

/// One run of the controller on a task of its own.
struct Running {
    task: JoinHandle<()>,
    stop: oneshot::Sender<()>,
}

fn start_controller(client: &Client, opts: &ControllerOptions) -> Running {
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(sidecarset::run(client.clone(), opts.clone(), async move {
        let _ = stopped.await;
    }));
    Running { task, stop }
}

/// Shuts the controller down cleanly and waits for it to return.
async fn stop_cleanly(running: Running, seed: u64) {
    let _ = running.stop.send(());
    match tokio::time::timeout(SHUTDOWN_TIMEOUT, running.task).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("seed {seed}: the controller failed while shutting down: {e}"),
        Err(_) => panic!(
            "seed {seed}: the controller did not return within {SHUTDOWN_TIMEOUT:?} of its shutdown signal"
        ),
    }
}

/// Aborts the controller's task, as a crash would end it.
async fn crash(running: Running, seed: u64) {
    running.task.abort();
    match running.task.await {
        Ok(()) => panic!("seed {seed}: the controller returned on its own, without a shutdown"),
        Err(e) if e.is_cancelled() => {}
        Err(e) => panic!("seed {seed}: the controller task failed: {e}"),
    }
}

/// How many pods have the new spec image (for the log of what each run got done).
async fn upgraded_count(pods: &Api<Pod>) -> usize {
    pods.list(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .iter()
                .filter(|p| spec_image(p, SIDECAR) == NEW_IMAGE)
                .count()
        })
        .unwrap_or(0)
}

#[tokio::test]
async fn a_crashing_controller_keeps_max_unavailable_and_finishes_the_rollout() {
    let seed = seed_from_env(SEED_VAR);
    eprintln!("sidecarset crash test: seed {seed} ({SEED_VAR}={seed} replays the random choices)");
    let mut rng = fastrand::Rng::with_seed(seed);

    let client = client().await;
    ensure_manager_namespace(&client).await;
    let ns = webhook_cluster().namespace("sc-crash").await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let app = unique_name("app");
    let name = unique_name("crash");
    let mut spec = one_sidecar_set(&name, &app, &ns);
    spec["metadata"]["labels"] = json!({CRASH_LABEL: &name});
    spec["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("initContainers");
    spec["spec"]["updateStrategy"]["maxUnavailable"] = json!(MAX_UNAVAILABLE);
    let set = create_sidecarset(&client, &spec).await;

    start_injected_pods(&pods, &app, &set, PODS).await;

    let background_kubelet = BackgroundKubelet::spawn(pods.clone(), rng.u64(..));
    let record = Arc::new(InFlightRecord::default());
    let (listed_tx, listed) = oneshot::channel();
    let tracker = tokio::spawn(track_in_flight(pods.clone(), record.clone(), listed_tx));
    listed.await.expect("the in-flight tracker lists the pods");

    spec["spec"]["containers"][0]["image"] = json!(NEW_IMAGE);
    let set = update_spec(
        &client,
        &name,
        json!({"containers": spec["spec"]["containers"].clone()}),
    )
    .await;

    let opts = ControllerOptions {
        label_selector: Some(format!("{CRASH_LABEL}={name}")),
        namespace: MANAGER_NAMESPACE.to_owned(),
        ..test_controller_options()
    };
    let interruptions = rng.usize(3..=5);
    let clean_one = rng.usize(..interruptions);
    let mut log = Vec::new();
    let mut running = start_controller(&client, &opts);
    for i in 0..interruptions {
        let after = rng.u64(200..=700);
        // A random moment of the rollout to stop at, not a wait for something to happen.
        tokio::time::sleep(Duration::from_millis(after)).await;
        if i == clean_one {
            stop_cleanly(running, seed).await;
        } else {
            crash(running, seed).await;
        }
        let kind = if i == clean_one {
            "clean stop"
        } else {
            "crash"
        };
        log.push(format!(
            "{kind} after {after} ms with {} pods upgraded",
            upgraded_count(&pods).await
        ));
        running = start_controller(&client, &opts);
    }

    let generation = set.metadata.generation;
    let (pods_ref, client_ref, name_ref, log_ref, kubelet_ref) =
        (&pods, &client, &name, &log, &background_kubelet);
    let what = format!(
        "seed {seed}: all {PODS} pods to run {NEW_IMAGE} and the status to count them updated and ready (runs: {log:?})"
    );
    poll(&what, FINISH_TIMEOUT, || async move {
        let errors = kubelet_ref.errors();
        assert!(
            errors.is_empty(),
            "seed {seed}: the kubelet failed: {errors:?}; runs {log_ref:?}"
        );
        let set = get_set(client_ref, name_ref).await;
        let list = pods_ref
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("listing pods: {e}"))?
            .items;
        let done = list
            .iter()
            .filter(|p| kubelet::pod_ready(p) && kubelet::runs(p, SIDECAR, NEW_IMAGE))
            .count();
        let observed = set.status.as_ref().and_then(|s| s.observed_generation);
        let expected = counts(PODS as i32, PODS as i32, PODS as i32, PODS as i32);
        if done == PODS && counts_of(&set) == expected && observed == set.metadata.generation {
            Ok(())
        } else {
            Err(format!(
                "{done} pods ready on {NEW_IMAGE} (generation {generation:?} written); {}",
                describe_set(&set)
            ))
        }
    })
    .await;
    stop_cleanly(running, seed).await;
    tracker.abort();
    drop(background_kubelet);

    let max = record.max.load(Ordering::SeqCst);
    let at_max = record.at_max.lock().expect("record lock").clone();
    assert!(
        max <= MAX_UNAVAILABLE,
        "seed {seed}: {max} pods were in flight at once (maxUnavailable {MAX_UNAVAILABLE}): {at_max:?}; runs {log:?}"
    );
    assert!(
        max >= 1,
        "seed {seed}: the tracker never saw a pod in flight; runs {log:?}"
    );
    eprintln!("sidecarset crash test: seed {seed}: at most {max} pods in flight; runs {log:?}");
}
