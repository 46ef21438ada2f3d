//! A node daemon running in this test process for one node, talking to a real containerd (or
//! the recording CRI proxy) and the test apiserver.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kruise_rs_daemon::{self as daemon, CredentialProviderOptions, DaemonError, DaemonOptions};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::{http_get, wait_for};

pub(crate) struct Daemon {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), DaemonError>>,
    pub addr: SocketAddr,
}

impl Daemon {
    /// Starts the daemon of `node` on the CRI `socket`, returning once its probe server is
    /// bound (not yet ready: see [`Self::wait_ready`]).
    pub(crate) async fn start(
        node: &str,
        socket: &Path,
        kubeconfig: &Path,
        max_concurrent_pulls: usize,
    ) -> Daemon {
        Self::start_with(
            node,
            socket,
            kubeconfig,
            max_concurrent_pulls,
            daemon::DEFAULT_CRI_LIVENESS_TIMEOUT,
        )
        .await
    }

    /// [`Self::start`] with `--cri-liveness-timeout` `cri_liveness_timeout`.
    pub(crate) async fn start_with(
        node: &str,
        socket: &Path,
        kubeconfig: &Path,
        max_concurrent_pulls: usize,
        cri_liveness_timeout: Duration,
    ) -> Daemon {
        let mut opts = Self::options(node, socket, kubeconfig, max_concurrent_pulls);
        opts.cri_liveness_timeout = cri_liveness_timeout;
        Self::start_opts(opts).await
    }

    /// [`Self::start`] with `--image-fs-high-threshold-percent` `percent`.
    pub(crate) async fn start_with_image_fs_limit(
        node: &str,
        socket: &Path,
        kubeconfig: &Path,
        percent: u8,
    ) -> Daemon {
        let mut opts = Self::options(node, socket, kubeconfig, 4);
        opts.image_fs_high_percent = percent;
        Self::start_opts(opts).await
    }

    /// [`Self::start`] with credential provider plugins (`--plugin-config-file`,
    /// `--plugin-bin-dir`).
    pub(crate) async fn start_with_credential_providers(
        node: &str,
        socket: &Path,
        kubeconfig: &Path,
        credential_providers: CredentialProviderOptions,
    ) -> Daemon {
        let mut opts = Self::options(node, socket, kubeconfig, 4);
        opts.credential_providers = credential_providers;
        Self::start_opts(opts).await
    }

    fn options(
        node: &str,
        socket: &Path,
        kubeconfig: &Path,
        max_concurrent_pulls: usize,
    ) -> DaemonOptions {
        DaemonOptions {
            node_name: node.to_owned(),
            kubeconfig: Some(kubeconfig.to_owned()),
            cri_socket: Some(socket.to_owned()),
            host_run_dir: PathBuf::from("/nonexistent"),
            probe_addr: "127.0.0.1:0".parse().expect("address"),
            cri_liveness_timeout: daemon::DEFAULT_CRI_LIVENESS_TIMEOUT,
            max_concurrent_pulls,
            credential_providers: CredentialProviderOptions::default(),
            kube_api_rate: Some(daemon::DEFAULT_KUBE_API_RATE),
            // Off: the node tests' containerds keep their images in the host's /tmp, whose
            // fullness is no node's (86% by the kubelet's formula on the machine these ran on:
            // its reserved blocks count as used). The disk test sets its own limit.
            image_fs_high_percent: 100,
        }
    }

    async fn start_opts(opts: DaemonOptions) -> Daemon {
        let node = opts.node_name.clone();
        let (serving_tx, serving) = oneshot::channel();
        let (stop, stopping) = oneshot::channel::<()>();
        let task = tokio::spawn(daemon::run(
            opts,
            async move {
                let _ = stopping.await;
            },
            Some(serving_tx),
        ));
        let addr = match serving.await {
            Ok(addr) => addr,
            Err(_) => panic!("the daemon of {node} did not start: {:?}", task.await),
        };
        Daemon {
            stop: Some(stop),
            task,
            addr,
        }
    }

    /// Asks it to stop and waits (15 s at most) for a clean exit.
    pub(crate) async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(15), &mut self.task)
            .await
            .expect("the daemon stops within 15 s")
            .expect("join")
            .expect("the daemon stops cleanly");
    }

    pub(crate) async fn get(&self, path: &'static str) -> (u16, String) {
        let addr = self.addr;
        tokio::task::spawn_blocking(move || http_get(addr, path))
            .await
            .expect("join")
            .expect("the probe server answers")
    }

    /// The value of a metric line `name value` (labels included in `name`).
    pub(crate) async fn metric(&self, name: &str) -> Option<f64> {
        let (_, body) = self.get("/metrics").await;
        body.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    }

    /// Waits until `/healthz` answers 200 (`live`) or 503; returns the body.
    pub(crate) async fn wait_live(&self, live: bool, within: Duration) -> String {
        let want = if live { 200 } else { 503 };
        wait_for(&format!("/healthz to answer {want}"), within, || async {
            let (status, body) = self.get("/healthz").await;
            (status == want).then_some(body)
        })
        .await
    }

    /// Waits until `/readyz` answers 200 (`ready`) or 503.
    pub(crate) async fn wait_ready(&self, ready: bool, within: Duration) {
        let want = if ready { 200 } else { 503 };
        wait_for(&format!("/readyz to answer {want}"), within, || async {
            (self.get("/readyz").await.0 == want).then_some(())
        })
        .await;
    }
}
