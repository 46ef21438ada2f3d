//! `kruise-rs manager` against a real apiserver: it becomes ready and serves its probes when the
//! CRDs are installed, refuses to start (saying how to fix it) when they are not, and stops
//! cleanly on SIGTERM.
//!
//! Each test gets a control plane of its own: a manager runs controllers, and the shared cluster
//! already has the test controllers (`support::TestCluster::start_controllers`).

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use kruise_rs::manager::{self, ManagerError};
use kruise_rs_api::imagepulljob::ImagePullJob;
use tokio::sync::oneshot;

use crate::support::{self, ExtraControlPlane, KillOnDrop, free_loopback_port, http_get, wait_for};

async fn get(addr: SocketAddr, path: &'static str) -> (u16, String) {
    tokio::task::spawn_blocking(move || http_get(addr, path))
        .await
        .expect("join")
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

#[tokio::test]
async fn manager_becomes_ready_serves_probes_and_stops_on_request() {
    let cluster = ExtraControlPlane::start_with_crds().await;
    let manager = support::start_manager(
        support::manager_options(cluster.kubeconfig_path()),
        Duration::from_secs(30),
        "with its CRDs installed",
    )
    .await;
    let addr = manager.probe_addr;

    assert_eq!(get(addr, "/healthz").await.0, 200);
    assert_eq!(get(addr, "/readyz").await.0, 200);
    let (status, metrics) = get(addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(metrics.contains("kruise_rs_build_info"), "{metrics}");

    manager.stop.send(()).expect("manager still running");
    let result = tokio::time::timeout(Duration::from_secs(10), manager.task)
        .await
        .expect("the manager stops within 10 s")
        .expect("join");
    assert!(result.is_ok(), "{result:?}");
}

#[tokio::test]
async fn manager_refuses_to_start_without_crds_and_says_how_to_install_them() {
    let empty = tokio::task::spawn_blocking(ExtraControlPlane::start)
        .await
        .expect("join");
    let (ready_tx, ready_rx) = oneshot::channel();
    let result = manager::run(
        support::manager_options(empty.kubeconfig_path()),
        std::future::pending(),
        Some(ready_tx),
    )
    .await;
    let err = result.expect_err("no CRDs, no manager");
    assert!(matches!(err, ManagerError::CrdsUnusable(_)), "{err:?}");
    let message = err.to_string();
    for needle in [
        "sidecarsets.apps.kruise.io",
        "imagepulljobs.apps.kruise.io",
        "nodeimages.apps.kruise.io",
        "imagelistpulljobs.apps.kruise.io",
        "kruise-rs crds | kubectl apply --server-side -f -",
    ] {
        assert!(
            message.contains(needle),
            "message lacks {needle:?}: {message}"
        );
    }
    assert!(
        ready_rx.await.is_err(),
        "a manager that refused must never report ready"
    );
}

#[tokio::test]
async fn the_manager_binary_stops_cleanly_on_sigterm() {
    let cluster = ExtraControlPlane::start_with_crds().await;
    let addr = free_loopback_port();
    let child = Command::new(env!("CARGO_BIN_EXE_kruise-rs"))
        .args([
            "manager",
            "--probe-addr",
            &addr.to_string(),
            "--webhook-addr",
            "127.0.0.1:0",
        ])
        .arg("--webhook-url")
        .arg("https://127.0.0.1:1")
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig_path())
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kruise-rs starts");
    let _kill_if_the_test_fails = KillOnDrop(child.id());

    wait_for(
        "the manager binary to answer /readyz with 200",
        Duration::from_secs(30),
        || async move {
            match tokio::task::spawn_blocking(move || http_get(addr, "/readyz"))
                .await
                .expect("join")
            {
                Ok((200, _)) => Some(()),
                _ => None,
            }
        },
    )
    .await;

    let output = support::terminate(child, "the manager").await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "exit {:?}: {stderr}",
        output.status
    );
    assert!(
        stderr.contains("shutting down") && stderr.contains("stopped"),
        "{stderr}"
    );
}

/// `--log-format json`: a reconcile's lines carry the object's key in their span, so one
/// object's lines can be picked out of the manager's log.
#[tokio::test]
async fn json_log_lines_of_a_reconcile_name_the_object() {
    let cluster = ExtraControlPlane::start_with_crds().await;
    let log = tempfile::NamedTempFile::new().expect("log file");
    let child = Command::new(env!("CARGO_BIN_EXE_kruise-rs"))
        .args(["--log-format", "json", "manager", "--leader-elect=false"])
        .args(["--disable-webhooks", "--probe-addr", "127.0.0.1:0"])
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig_path())
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log.reopen().expect("log file"))
        .spawn()
        .expect("kruise-rs starts");
    let _kill_if_the_test_fails = KillOnDrop(child.id());

    // Refused by the controller (no webhook here to refuse it first): a warning in its reconcile.
    let client = support::client_for(cluster.kubeconfig_path()).await;
    let jobs: kube::Api<ImagePullJob> = kube::Api::namespaced(client, "default");
    let job: ImagePullJob = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "ImagePullJob",
        "metadata": {"name": "span-check"},
        "spec": {"image": "nginx:1.27", "parallelism": "many"},
    }))
    .expect("job");
    jobs.create(&Default::default(), &job)
        .await
        .expect("create");

    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let line = loop {
        let text = std::fs::read_to_string(log.path()).unwrap_or_default();
        let found = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|l| l["fields"]["reason"] == "InvalidParallelism");
        match found {
            Some(line) => break line,
            None if tokio::time::Instant::now() > deadline => {
                panic!("no JSON log line of the job's reconcile within 30 s; the log:\n{text}")
            }
            None => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    assert_eq!(line["span"]["imagepulljob"], "default/span-check", "{line}");
    assert_eq!(line["span"]["name"], "reconcile", "{line}");
    assert_eq!(line["level"], "WARN", "{line}");
    support::terminate(child, "the manager").await;
}
