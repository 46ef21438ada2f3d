//! The manager run inside a test's process, as `main` runs it: options tests start from, and a
//! running manager with its shutdown signal.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use kruise_rs::manager::{self, ManagerError, ManagerOptions};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The options tests start from, changing what they test with `..manager_options(path)`:
/// `kubeconfig`, probes on a free loopback port, [`super::test_controller_options`], and no
/// webhooks, leader election or client-side rate limit.
pub(crate) fn manager_options(kubeconfig: &Path) -> ManagerOptions {
    ManagerOptions {
        kubeconfig: Some(kubeconfig.to_owned()),
        probe_addr: "127.0.0.1:0".parse().expect("a loopback address"),
        controllers: super::test_controller_options(),
        webhook: None,
        leader_election: None,
        streaming_lists: Default::default(),
        kube_api_rate: None,
    }
}

/// A manager running in a task of this process.
pub(crate) struct RunningManager {
    /// Where it serves `/healthz`, `/readyz` and `/metrics`.
    pub probe_addr: SocketAddr,
    /// Its shutdown signal (what SIGTERM resolves in `main`).
    pub stop: oneshot::Sender<()>,
    pub task: JoinHandle<Result<(), ManagerError>>,
}

/// Starts `manager::run(opts)` in a task and waits up to `timeout` for it to report ready;
/// panics naming `what` if it does not.
pub(crate) async fn start_manager(
    opts: ManagerOptions,
    timeout: Duration,
    what: &str,
) -> RunningManager {
    let (ready_tx, ready_rx) = oneshot::channel();
    let (stop, stopping) = oneshot::channel::<()>();
    let task = tokio::spawn(manager::run(
        opts,
        async move {
            let _ = stopping.await;
        },
        Some(ready_tx),
    ));
    let probe_addr = match tokio::time::timeout(timeout, ready_rx).await {
        Ok(Ok(addr)) => addr,
        Ok(Err(_)) => {
            let ended = task.await;
            panic!("{what}: the manager ended before it was ready: {ended:?}")
        }
        Err(_) => panic!("{what}: the manager was not ready within {timeout:?}"),
    };
    RunningManager {
        probe_addr,
        stop,
        task,
    }
}
