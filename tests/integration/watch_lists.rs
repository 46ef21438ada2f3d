//! No dependence on the optional `WatchList` server feature: against a kube-apiserver started
//! with `--feature-gates=WatchList=false` (Kubernetes 1.33's default), the manager asks once,
//! falls back to list-then-watch, becomes ready and reconciles; forced to stream there, its
//! watches are refused and `/readyz` stays 503, so a Deployment rollout would stop on it.
//!
//! Each test gets a control plane of its own with the gate off, whatever the suite's run uses.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use kruise_rs::controllers::ControllerOptions;
use kruise_rs::manager::{self, ManagerOptions};
use kruise_rs_api::nodeimage::NodeImage;
use kruise_rs_controller::initial_list::{self, InitialList, StreamingLists};
use kube::Api;
use tokio::sync::oneshot;

use crate::support::{self, ExtraControlPlane, free_loopback_port, http_get, wait_for};

const WATCH_LIST_OFF: &str = "--feature-gates=WatchList=false";

pub(crate) async fn plane_without_watch_list() -> ExtraControlPlane {
    tokio::task::spawn_blocking(|| {
        let plane = ExtraControlPlane::start_with_apiserver_args(Some(WATCH_LIST_OFF));
        plane.install_crds();
        plane
    })
    .await
    .expect("join")
}

pub(crate) fn options(
    kubeconfig: &Path,
    probe_addr: SocketAddr,
    mode: StreamingLists,
) -> ManagerOptions {
    ManagerOptions {
        probe_addr,
        // Every object: this control plane is the test's own.
        controllers: ControllerOptions {
            nodeimage_creation_delay: Duration::ZERO,
            ..ControllerOptions::default()
        },
        streaming_lists: mode,
        ..support::manager_options(kubeconfig)
    }
}

pub(crate) async fn readyz(addr: SocketAddr) -> Option<u16> {
    tokio::task::spawn_blocking(move || http_get(addr, "/readyz"))
        .await
        .expect("join")
        .ok()
        .map(|(status, _)| status)
}

#[tokio::test]
async fn without_watch_list_the_manager_lists_then_watches_and_reconciles() {
    let plane = plane_without_watch_list().await;
    let client = support::client_for(plane.kubeconfig_path()).await;

    // The probe the manager runs at start: refused, and it says why.
    let (mode, why) = initial_list::detect(&client).await;
    assert_eq!(mode, InitialList::ListThenWatch, "{why}");
    assert!(why.contains("422"), "the refusal is reported: {why}");

    support::create_ready_node(&client, "node-watch-list-off", Default::default()).await;
    let manager = support::start_manager(
        options(
            plane.kubeconfig_path(),
            free_loopback_port(),
            StreamingLists::Auto,
        ),
        Duration::from_secs(60),
        "without WatchList (its controllers synced)",
    )
    .await;
    let addr = manager.probe_addr;
    assert_eq!(readyz(addr).await, Some(200));

    // The NodeImage controller works: the Ready Node gets its NodeImage.
    let nodeimages: Api<NodeImage> = Api::all(client.clone());
    wait_for(
        "the NodeImage of the Ready Node",
        Duration::from_secs(30),
        || {
            let nodeimages = nodeimages.clone();
            async move {
                nodeimages
                    .get_opt("node-watch-list-off")
                    .await
                    .ok()
                    .flatten()
            }
        },
    )
    .await;

    manager.stop.send(()).expect("manager still running");
    let result = tokio::time::timeout(Duration::from_secs(15), manager.task)
        .await
        .expect("the manager stops within 15 s")
        .expect("join");
    assert!(result.is_ok(), "{result:?}");
}

#[tokio::test]
async fn a_manager_whose_watches_are_refused_stays_unready() {
    let plane = plane_without_watch_list().await;
    let client = support::client_for(plane.kubeconfig_path()).await;
    support::create_ready_node(&client, "node-forced-streaming", Default::default()).await;

    let addr = free_loopback_port();
    let (ready_tx, mut ready_rx) = oneshot::channel();
    let manager = tokio::spawn(manager::run(
        options(plane.kubeconfig_path(), addr, StreamingLists::Always),
        std::future::pending(),
        Some(ready_tx),
    ));
    // The probe server answers (the manager started) ...
    let first = wait_for(
        "the manager's probe server",
        Duration::from_secs(30),
        || async move { readyz(addr).await },
    )
    .await;
    assert_eq!(first, 503);
    // ... and keeps answering 503 while every streaming watch is refused: a Node that the
    // controllers would give a NodeImage within a second gets none. Observed over a bounded
    // window, since what is checked is that something does not happen.
    let nodeimages: Api<NodeImage> = Api::all(client.clone());
    let window = tokio::time::Instant::now() + Duration::from_secs(8);
    while tokio::time::Instant::now() < window {
        assert_eq!(readyz(addr).await, Some(503), "/readyz while watches fail");
        assert!(
            nodeimages
                .get_opt("node-forced-streaming")
                .await
                .expect("get")
                .is_none(),
            "no controller ran"
        );
        assert!(
            matches!(
                ready_rx.try_recv(),
                Err(oneshot::error::TryRecvError::Empty)
            ),
            "the manager never reports ready"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    manager.abort();
}

/// The suite's own control plane: where the test tooling started it, the detection matches
/// how it was started (1.36 streams unless the gate is turned off; 1.33 ships it off).
#[tokio::test]
async fn detection_matches_the_suite_control_plane() {
    let cluster = support::cluster().await;
    let client = cluster.client().await;
    let (mode, why) = initial_list::detect(&client).await;
    let info = client.apiserver_version().await.expect("/version");
    let gate_off = std::env::var("KRUISE_RS_APISERVER_ARGS")
        .is_ok_and(|args| args.contains("WatchList=false"));
    eprintln!("API server {}: {} ({why})", info.git_version, mode.as_str());
    if !cluster.is_local() {
        return;
    }
    let expected = match info.minor.trim_end_matches('+') {
        _ if gate_off => Some(InitialList::ListThenWatch),
        "33" => Some(InitialList::ListThenWatch),
        "36" => Some(InitialList::Streaming),
        _ => None,
    };
    if let Some(expected) = expected {
        assert_eq!(
            mode, expected,
            "{} with args {gate_off}: {why}",
            info.git_version
        );
    }
}
