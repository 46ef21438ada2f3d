//! A control plane of its own with the manager's admission webhooks registered at
//! `https://127.0.0.1:<port>`, the way envtest runs webhooks: the apiserver calls the manager
//! running in this process. Separate from the shared cluster so that no other test's pods,
//! jobs or NodeImages go through these webhooks.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kruise_rs::manager::{self, ManagerOptions};
use kruise_rs::webhook::{
    CertSource, Endpoint, FailurePolicy, SidecarSetCacheReads, UnreadableSidecarSetPolicy,
    WebhookOptions,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use super::{ExtraControlPlane, test_controller_options};

/// Label a namespace needs for its pods to go through the pod webhook. (The kruise kinds'
/// webhooks see every namespace: nothing scopes them.)
pub(crate) const WEBHOOK_NAMESPACE_LABEL: &str = "kruise-rs-webhook-test";
/// The manager's own namespace on this control plane.
pub(crate) const MANAGER_NAMESPACE: &str = "kruise-rs-system";

pub(crate) struct WebhookCluster {
    plane: ExtraControlPlane,
    pub webhook_addr: std::net::SocketAddr,
    /// Where the manager serves `/healthz`, `/readyz` and `/metrics`.
    pub probe_addr: std::net::SocketAddr,
}

static WEBHOOK_CLUSTER: OnceLock<Result<WebhookCluster, String>> = OnceLock::new();

/// The webhook test cluster, started on first use with the manager (controllers and webhooks)
/// running on a runtime of its own. Panics with the reason when it cannot start.
pub(crate) fn webhook_cluster() -> &'static WebhookCluster {
    match WEBHOOK_CLUSTER.get_or_init(start) {
        Ok(cluster) => cluster,
        Err(e) => panic!("{e}"),
    }
}

/// The options the test manager's webhooks run with, on `addr`.
pub(crate) fn webhook_options(
    addr: std::net::SocketAddr,
    failure_policy: FailurePolicy,
) -> WebhookOptions {
    WebhookOptions {
        addr,
        namespace: MANAGER_NAMESPACE.to_owned(),
        certs: CertSource::SelfManaged {
            secret: "kruise-rs-webhook-certs".to_owned(),
        },
        endpoint: Endpoint::Url(format!("https://{addr}")),
        pod_failure_policy: failure_policy,
        timeout_seconds: 10,
        configuration_prefix: "kruise-rs".to_owned(),
        pod_namespace_selector: Some(LabelSelector {
            match_labels: Some([(WEBHOOK_NAMESPACE_LABEL.to_owned(), "true".to_owned())].into()),
            ..LabelSelector::default()
        }),
        patch_pod_metadata_defaults_allowed: false,
        sort_sidecar_containers_by_name: false,
        unreadable_sidecarset_policy: UnreadableSidecarSetPolicy::Admit,
        sidecarset_cache_reads: SidecarSetCacheReads::Confirmed,
        pod_object_selector: None,
        // Tests stop their managers at once; webhook_availability sets one.
        shutdown_grace: Duration::ZERO,
    }
}

/// A manager of a test's own: controllers (watching every object, no test label) and webhooks
/// at `Fail` on a free loopback port, talking to the apiserver through `kubeconfig`.
pub(crate) fn own_manager_with_webhooks(kubeconfig: &std::path::Path) -> ManagerOptions {
    ManagerOptions {
        controllers: kruise_rs::controllers::ControllerOptions {
            namespace: MANAGER_NAMESPACE.to_owned(),
            label_selector: None,
            ..test_controller_options()
        },
        webhook: Some(webhook_options(
            crate::support::free_loopback_port(),
            FailurePolicy::Fail,
        )),
        ..super::manager_options(kubeconfig)
    }
}

fn start() -> Result<WebhookCluster, String> {
    let plane = ExtraControlPlane::start();
    plane.install_crds();
    let addr = crate::harness::process::free_loopback_port()?;
    let kubeconfig: PathBuf = plane.kubeconfig_path().to_owned();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<std::net::SocketAddr, String>>();
    std::thread::Builder::new()
        .name("webhook-manager".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("a runtime for the manager: {e}")));
                    return;
                }
            };
            runtime.block_on(async move {
                let (on_ready, ready) = tokio::sync::oneshot::channel();
                let opts = ManagerOptions {
                    controllers: kruise_rs::controllers::ControllerOptions {
                        namespace: MANAGER_NAMESPACE.to_owned(),
                        ..test_controller_options()
                    },
                    webhook: Some(webhook_options(addr, FailurePolicy::Fail)),
                    ..super::manager_options(&kubeconfig)
                };
                let run = manager::run(opts, std::future::pending(), Some(on_ready));
                tokio::pin!(run);
                tokio::select! {
                    result = &mut run => {
                        let _ = ready_tx.send(Err(format!("the manager with webhooks stopped: {result:?}")));
                        return;
                    }
                    ready = ready => {
                        let _ = ready_tx.send(ready.map_err(|_| "the manager never became ready".to_owned()));
                    }
                }
                if let Err(e) = run.await {
                    eprintln!("the manager with webhooks stopped: {e}");
                }
            });
        })
        .map_err(|e| format!("the manager thread: {e}"))?;
    let probe_addr = ready_rx
        .recv_timeout(Duration::from_secs(60))
        .map_err(|e| format!("the manager with webhooks did not start within 60 s: {e}"))??;
    Ok(WebhookCluster {
        plane,
        webhook_addr: addr,
        probe_addr,
    })
}

impl WebhookCluster {
    pub(crate) fn kubeconfig_path(&self) -> &std::path::Path {
        self.plane.kubeconfig_path()
    }

    pub(crate) async fn client(&self) -> Client {
        let kubeconfig = Kubeconfig::read_from(self.plane.kubeconfig_path()).expect("kubeconfig");
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("config");
        Client::try_from(config).expect("client")
    }

    /// A namespace whose pods and jobs go through the webhooks.
    pub(crate) async fn namespace(&self, prefix: &str) -> String {
        let name = super::unique_name(prefix);
        crate::harness::objects::create_namespace(
            &self.client().await,
            &name,
            &[(WEBHOOK_NAMESPACE_LABEL, "true")],
        )
        .await
        .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
        name
    }
}
