//! The manager's client-side request limit paces a SidecarSet rollout without stalling it: 50
//! pods roll out while the SidecarSet controller's client is held to 5 requests a second (burst
//! 10), the limit `--kube-api-qps 5 --kube-api-burst 10` gives the manager. The test prints how
//! long the rollout took.
//!
//! In the webhook test cluster the pods are injected by a SidecarSet carrying a label the
//! cluster's own manager ignores; this test runs its own `sidecarset::run`, confined to that
//! label, on a client built the way the manager builds its own.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kruise_rs::controllers::{ControllerOptions, sidecarset};
use kruise_rs_kube::{LimitWaits, RateLimit};
use kube::api::{Api, ListParams};
use serde_json::json;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::sidecarset_upgrade::start_injected_pods;
use crate::sidecarset_upgrade::{
    NEW_IMAGE, SIDECAR, client, counts, counts_of, create_sidecarset, describe_set,
    ensure_manager_namespace, get_set, one_sidecar_set, poll, update_spec,
};
use crate::support::kubelet::{self, BackgroundKubelet};
use crate::support::webhook::{MANAGER_NAMESPACE, webhook_cluster};
use crate::support::{test_controller_options, unique_name};

const PODS: usize = 50;
const QPS: f64 = 5.0;
const BURST: u32 = 10;
/// The label confining this test's controller; the cluster's manager ignores it.
const LABEL: &str = "kruise-rs-rate-limit-test";
/// How long the rollout may take: its requests at 5 a second, with room for a slow machine.
const FINISH_TIMEOUT: Duration = Duration::from_secs(180);

#[tokio::test]
async fn a_sidecarset_rollout_completes_under_a_low_request_limit() {
    let client = client().await;
    ensure_manager_namespace(&client).await;
    let cluster = webhook_cluster();
    let ns = cluster.namespace("rate-limit").await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let app = unique_name("app");
    let name = unique_name("limited");
    let mut spec = one_sidecar_set(&name, &app, &ns);
    spec["metadata"]["labels"] = json!({LABEL: &name});
    spec["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("initContainers");
    // All pods in one batch: the pace is the request limit's, not the strategy's.
    spec["spec"]["updateStrategy"]["maxUnavailable"] = json!("100%");
    let set = create_sidecarset(&client, &spec).await;

    start_injected_pods(&pods, &app, &set, PODS).await;
    let background_kubelet = BackgroundKubelet::spawn(pods.clone(), fastrand::u64(..));

    spec["spec"]["containers"][0]["image"] = json!(NEW_IMAGE);
    update_spec(
        &client,
        &name,
        json!({"containers": spec["spec"]["containers"].clone()}),
    )
    .await;

    let config = kruise_rs_kube::load_config(Some(cluster.kubeconfig_path()))
        .await
        .expect("the test cluster's kubeconfig loads");
    let limit = RateLimit::from_flags(QPS, BURST).expect("a valid limit");
    let waits = LimitWaits::default();
    let limited = kruise_rs_kube::client(config, limit, &waits).expect("a limited client");
    let opts = ControllerOptions {
        label_selector: Some(format!("{LABEL}={name}")),
        namespace: MANAGER_NAMESPACE.to_owned(),
        ..test_controller_options()
    };
    let started = Instant::now();
    let (stop, stopped) = oneshot::channel::<()>();
    let controller = tokio::spawn(sidecarset::run(limited, opts, async move {
        let _ = stopped.await;
    }));

    let (pods_ref, client_ref, name_ref, kubelet_ref) =
        (&pods, &client, &name, &background_kubelet);
    let what = format!(
        "all {PODS} pods to run {NEW_IMAGE} and the status to count them, at {QPS} requests/s"
    );
    poll(&what, FINISH_TIMEOUT, || async move {
        let errors = kubelet_ref.errors();
        assert!(errors.is_empty(), "the kubelet failed: {errors:?}");
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
        let expected = counts(PODS as i32, PODS as i32, PODS as i32, PODS as i32);
        if done == PODS && counts_of(&set) == expected {
            Ok(())
        } else {
            Err(format!(
                "{done} pods ready on {NEW_IMAGE}; {}",
                describe_set(&set)
            ))
        }
    })
    .await;
    let took = started.elapsed();
    eprintln!(
        "rate limit test: {PODS} pods rolled out in {:.1} s at {QPS} requests/s (burst {BURST})",
        took.as_secs_f64()
    );

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(15), controller)
        .await
        .expect("the controller stops within 15 s of its shutdown signal")
        .expect("the controller task does not fail");
    // The controller's client was in use from `started` until now, not only until the poll saw
    // the rollout done.
    let ran = started.elapsed();
    drop(background_kubelet);

    // Every pod took one patch from the controller's client: past the burst, 5 a second.
    let floor = Duration::from_secs_f64((PODS as f64 - f64::from(BURST)) / QPS);
    assert!(
        took >= floor,
        "{PODS} pod patches went through in {took:?}, under the {floor:?} the limit allows"
    );
    // The wait is counted, in seconds. Requests wait side by side, so their waits add up to more
    // than the wall time (CI: 57 requests waited 11.28 s in 11.25 s); no single one can have
    // waited longer than the controller ran.
    let most = waits.requests() as f64 * ran.as_secs_f64();
    assert!(
        waits.requests() > 0 && waits.seconds() > 0.0 && waits.seconds() <= most,
        "{} requests waited {:.2} s while the controller ran {ran:?} held to {QPS}/s",
        waits.requests(),
        waits.seconds()
    );
    eprintln!(
        "rate limit test: {} requests waited for the limit, {:.1} s in all",
        waits.requests(),
        waits.seconds()
    );
}
