//! The node daemon: pulls the images its node's NodeImage asks for through the node's CRI
//! ImageService and reports each tag's state back into the NodeImage status.
//!
//! [`run`] is the whole lifecycle:
//! 1. connect to the apiserver and serve `/healthz`, `/readyz`, `/metrics`;
//! 2. find the CRI image service (`--cri-socket`, or the usual containerd / CRI-O / cri-dockerd
//!    sockets under the host's run directory), retrying every few seconds while none answers;
//! 3. watch the node's own NodeImage (`node.rs`), plan workers from it (`plan`), pull
//!    (`pull`, credentials from the pull secrets (`auth`), then from the kubelet credential
//!    provider plugins ([`credential_provider`])), and report (`report.rs`, the status from `status`);
//! 4. keep checking the runtime: `/readyz` answers 200 only while the runtime answers and the
//!    NodeImage watch has synced, and `/healthz` fails once it has not answered for
//!    `--cri-liveness-timeout` (`liveness`: a restarted runtime's new socket needs a new mount),
//!    and the daemon exits at once when its socket is a mount of its own that refuses
//!    connections (`stale_socket`: nothing will listen on that inode again);
//! 5. on shutdown, stop the workers (a restarted daemon resumes them from the status) and return.

mod args;
mod auth;
mod containerd_api;
pub mod credential_provider;
pub mod cri;
mod image_fs;
mod kubelet_activity;
mod liveness;
mod metrics;
mod node;
mod pin;
mod plan;
mod progress;
mod pull;
mod report;
mod secret_scope;
mod slots;
mod stale_socket;
mod status;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kruise_rs_kube::events::Recorder;
use kube::Api;
use kube::runtime::events::Reporter;
use tokio::net::TcpListener;
use tokio::sync::{Notify, oneshot, watch};
use tracing::{info, warn};

pub use self::args::DaemonArgs;
pub use self::credential_provider::CredentialProviderOptions;
use self::credential_provider::{ConfigError, CredentialProviders};
pub use self::cri::{CANDIDATE_SOCKETS, Cri, DetectError};
pub use self::liveness::DEFAULT_CRI_LIVENESS_TIMEOUT;
use self::liveness::RuntimeSilence;
use self::metrics::DaemonMetrics;
use self::node::{Shared, State};
pub use self::report::FIELD_MANAGER;
use self::stale_socket::SocketMount;
use kruise_rs_kube::{ConnectError, LimitWaits, Metrics, ProbeState, RateLimit, load_config};

/// Reporting controller of the daemon's events.
pub(crate) const REPORTER: &str = "kruise-rs-daemon";
/// How often the runtime is looked for while none answers, and checked once found.
const RUNTIME_CHECK_INTERVAL: Duration = Duration::from_secs(5);
/// client-go's default request rate, which upstream's daemon keeps: one node's daemon needs a
/// watch, a status write per change and an event now and then.
pub const DEFAULT_KUBE_API_RATE: RateLimit = RateLimit {
    qps: 5.0,
    burst: 10,
};

/// How long open probe connections may take to finish once shutdown has begun.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

pub use image_fs::DEFAULT_HIGH_PERCENT as DEFAULT_IMAGE_FS_HIGH_PERCENT;

/// What the daemon needs to start.
#[derive(Clone, Debug)]
pub struct DaemonOptions {
    /// The node this daemon serves: its NodeImage has this name.
    pub node_name: String,
    /// A kubeconfig file to use instead of `KUBECONFIG`, `~/.kube/config` or the in-cluster
    /// service account.
    pub kubeconfig: Option<PathBuf>,
    /// The CRI socket; `None` tries [`CANDIDATE_SOCKETS`] under `host_run_dir`.
    pub cri_socket: Option<PathBuf>,
    /// Where the host's `/var/run` is (mounted into the daemon's container).
    pub host_run_dir: PathBuf,
    /// Where to serve `/healthz`, `/readyz` and `/metrics`; port 0 picks a free port.
    pub probe_addr: SocketAddr,
    /// How long the runtime may go unanswered before `/healthz` fails (`liveness`).
    pub cri_liveness_timeout: Duration,
    /// Pulls in flight at once on this node (at least 1).
    pub max_concurrent_pulls: usize,
    /// The kubelet credential provider plugins (`--plugin-config-file`, `--plugin-bin-dir`).
    pub credential_providers: CredentialProviderOptions,
    /// The client-side request rate limit (`--kube-api-qps`, `--kube-api-burst`); `None`: none.
    pub kube_api_rate: Option<RateLimit>,
    /// Pulls are refused while the runtime's image filesystem is at least this full, in percent
    /// (`--image-fs-high-threshold-percent`); 100 turns the check off.
    pub image_fs_high_percent: u8,
}

/// Why the daemon could not start, or stopped other than by request.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(
        "the node name is empty: set NODE_NAME (the downward API's spec.nodeName) or --node-name"
    )]
    NoNodeName,
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error(transparent)]
    CredentialProviders(#[from] ConfigError),
    #[error(
        "cannot listen on {addr} for the probe and metrics server; choose another --probe-addr \
         or stop what is using it"
    )]
    Bind {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("the probe and metrics server stopped unexpectedly")]
    ServerStopped {
        #[source]
        source: Option<io::Error>,
    },
    #[error(
        "the runtime's socket {} is a mount of a socket nobody listens on any more (the runtime \
         restarted and bound a new one, which this mount cannot reach): exiting, so that the \
         kubelet starts the container again with a mount of the new socket",
        socket.display()
    )]
    StaleRuntimeSocket { socket: PathBuf },
}

/// Runs the daemon until `shutdown` resolves, then stops cleanly and returns `Ok(())`.
///
/// `on_serving`, when given, receives the probe address once it is bound; readiness comes
/// later, on `/readyz`, once the runtime answers and the NodeImage watch has synced.
pub async fn run(
    opts: DaemonOptions,
    shutdown: impl Future<Output = ()>,
    on_serving: Option<oneshot::Sender<SocketAddr>>,
) -> Result<(), DaemonError> {
    if opts.node_name.is_empty() {
        return Err(DaemonError::NoNodeName);
    }
    info!(version = env!("CARGO_PKG_VERSION"), node = %opts.node_name, "starting the daemon");
    let providers = CredentialProviders::load(&opts.credential_providers)?;
    let mut shutdown = pin!(shutdown);
    let limit_waits = LimitWaits::default();
    let client = kruise_rs_kube::client(
        load_config(opts.kubeconfig.as_deref()).await?,
        opts.kube_api_rate,
        &limit_waits,
    )?;
    let listener =
        TcpListener::bind(opts.probe_addr)
            .await
            .map_err(|source| DaemonError::Bind {
                addr: opts.probe_addr,
                source,
            })?;
    let addr = listener.local_addr().map_err(|source| DaemonError::Bind {
        addr: opts.probe_addr,
        source,
    })?;
    let daemon_metrics = DaemonMetrics::new();
    let silence = Arc::new(RuntimeSilence::new(
        Instant::now(),
        opts.cri_liveness_timeout,
    ));
    let probe_state = ProbeState::new(Arc::new(Metrics::with(|registry| {
        daemon_metrics.register(registry);
        limit_waits.register(registry);
    })))
    .with_liveness({
        let silence = silence.clone();
        Arc::new(move || silence.check(Instant::now()))
    });
    let (stop_server, server_stopping) = oneshot::channel::<()>();
    let mut server = pin!(kruise_rs_kube::serve(
        listener,
        probe_state.clone(),
        async move {
            let _ = server_stopping.await;
        }
    ));
    info!(probe_addr = %addr, "serving probes and metrics");
    if let Some(on_serving) = on_serving {
        let _ = on_serving.send(addr);
    }

    // Ends only with why the daemon cannot go on (`Ok`: for no known reason).
    let work = async {
        let cri = find_runtime(&opts, &daemon_metrics, &silence).await?;
        let mount = SocketMount::of(cri.socket());
        // Whether the kubelet is starting a pod here: pre-pulls step aside meanwhile.
        let (kubelet_busy_tx, kubelet_busy) = watch::channel(false);
        let activity = kubelet_activity::KubeletActivity::new(cri.channel());
        let shared = Arc::new(Shared {
            node: opts.node_name.clone(),
            client: client.clone(),
            nodeimages: Api::all(client.clone()),
            cri,
            providers: providers.clone(),
            slots: slots::FairSlots::new(opts.max_concurrent_pulls),
            image_fs: image_fs::ImageFsGuard::new(opts.image_fs_high_percent),
            pins: pin::Pins::default(),
            state: Mutex::new(State::default()),
            dirty: Notify::new(),
            recorder: Recorder::new(
                client.clone(),
                Reporter {
                    controller: REPORTER.into(),
                    instance: Some(opts.node_name.clone()),
                },
            ),
            metrics: daemon_metrics.clone(),
            kubelet_busy,
        });
        let (synced_tx, synced) = watch::channel(false);
        let pulls = daemon_metrics.active_workers.clone();
        // Shutdown drops this future, and with it the watch and the reporter; the guard stops
        // the workers, whose tasks would otherwise outlive it.
        let workers = shared.clone();
        let _stop_workers = scopeguard(move || workers.stop_all());
        let others = async {
            tokio::join!(
                node::watch_nodeimage(shared.clone(), synced_tx),
                report::report(shared.clone(), std::future::pending()),
                activity.run(kubelet_busy_tx, move || pulls.get() > 0),
            )
        };
        tokio::select! {
            _ = others => Ok(()),
            stale = readiness(&shared, &mount, synced, &probe_state, &silence) => Err(stale),
        }
    };

    let mut failure = None;
    tokio::select! {
        () = &mut shutdown => {}
        ended = work => match ended {
            Ok(()) => warn!("the daemon's work ended unexpectedly"),
            Err(err) => failure = Some(err),
        },
        result = &mut server => {
            probe_state.set_ready(false);
            return Err(DaemonError::ServerStopped { source: result.err() });
        }
    }

    info!("shutting down");
    probe_state.set_ready(false);
    let _ = stop_server.send(());
    match tokio::time::timeout(DRAIN_TIMEOUT, &mut server).await {
        Ok(result) => result.map_err(|source| DaemonError::ServerStopped {
            source: Some(source),
        })?,
        Err(_elapsed) => {
            warn!(timeout = ?DRAIN_TIMEOUT, "probe connections still open; closing them")
        }
    }
    if let Some(err) = failure {
        return Err(err);
    }
    info!("stopped");
    Ok(())
}

/// Looks for the runtime until one answers; fails when the given socket is a stale mount.
async fn find_runtime(
    opts: &DaemonOptions,
    metrics: &DaemonMetrics,
    silence: &RuntimeSilence,
) -> Result<Cri, DaemonError> {
    // A runtime found by detection is under the host's run directory, a mount of a directory.
    let given = opts.cri_socket.as_deref().map(SocketMount::of);
    let mut live = true;
    loop {
        match Cri::detect(opts.cri_socket.as_deref(), &opts.host_run_dir).await {
            Ok(cri) => {
                silence.answered();
                info!(socket = %cri.socket().display(), "CRI image service found");
                metrics.runtime_up.set(1);
                return Ok(cri);
            }
            Err(err) => {
                metrics.runtime_up.set(0);
                if let Some(mount) = &given
                    && mount.is_stale().await
                {
                    return Err(stale(mount.path()));
                }
                warn!(error = %err, retry_in = ?RUNTIME_CHECK_INTERVAL, "not ready: no container runtime");
                silence.unanswered(Instant::now());
                live = log_liveness(silence, live);
                tokio::time::sleep(RUNTIME_CHECK_INTERVAL).await;
            }
        }
    }
}

fn stale(socket: &Path) -> DaemonError {
    DaemonError::StaleRuntimeSocket {
        socket: socket.to_owned(),
    }
}

/// Keeps `/readyz` true exactly while the runtime answers and the watch has synced, and tells
/// `silence` (hence `/healthz`) when the runtime answers. Returns only when the runtime's socket
/// turns out to be a stale mount (`stale_socket`).
async fn readiness(
    shared: &Shared,
    mount: &SocketMount,
    mut synced: watch::Receiver<bool>,
    probe: &ProbeState,
    silence: &RuntimeSilence,
) -> DaemonError {
    let mut runtime_ok = true;
    let mut live = true;
    let mut watching = true;
    loop {
        let ready = runtime_ok && *synced.borrow_and_update();
        probe.set_ready(ready);
        tokio::select! {
            changed = synced.changed(), if watching => watching = changed.is_ok(),
            () = tokio::time::sleep(RUNTIME_CHECK_INTERVAL) => {
                let now_ok = shared.cri.check().await;
                if now_ok.is_err() && mount.is_stale().await {
                    probe.set_ready(false);
                    return stale(mount.path());
                }
                match (&now_ok, runtime_ok) {
                    (Err(err), true) => warn!(socket = %shared.cri.socket().display(), error = %err, "not ready: the container runtime does not answer"),
                    (Ok(()), false) => info!("the container runtime answers again"),
                    _ => {}
                }
                runtime_ok = now_ok.is_ok();
                if runtime_ok {
                    silence.answered();
                } else {
                    silence.unanswered(Instant::now());
                }
                live = log_liveness(silence, live);
                shared.metrics.runtime_up.set(i64::from(runtime_ok));
            }
        }
    }
}

/// Logs when `/healthz` starts or stops failing; returns whether it passes now.
fn log_liveness(silence: &RuntimeSilence, was_live: bool) -> bool {
    let now = silence.check(Instant::now());
    match (&now, was_live) {
        (Err(why), true) => warn!(
            reason = %why,
            "not live: /healthz fails until the runtime answers (a liveness probe restarts the \
             container, whose new mount reaches a restarted runtime's new socket)"
        ),
        (Ok(()), false) => info!("live again: the container runtime answers"),
        _ => {}
    }
    now.is_ok()
}

/// Runs `f` when dropped.
fn scopeguard(f: impl FnOnce()) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(node: &str) -> DaemonOptions {
        DaemonOptions {
            node_name: node.into(),
            kubeconfig: Some("/nonexistent/kubeconfig".into()),
            cri_socket: None,
            host_run_dir: "/nonexistent".into(),
            probe_addr: "127.0.0.1:0".parse().unwrap(),
            cri_liveness_timeout: DEFAULT_CRI_LIVENESS_TIMEOUT,
            max_concurrent_pulls: 2,
            credential_providers: CredentialProviderOptions::default(),
            kube_api_rate: Some(DEFAULT_KUBE_API_RATE),
            image_fs_high_percent: DEFAULT_IMAGE_FS_HIGH_PERCENT,
        }
    }

    #[tokio::test]
    async fn an_empty_node_name_is_refused() {
        let err = run(opts(""), std::future::pending(), None)
            .await
            .unwrap_err();
        assert!(matches!(err, DaemonError::NoNodeName), "{err}");
    }

    #[tokio::test]
    async fn a_missing_explicit_plugin_config_stops_the_start() {
        let mut opts = opts("n1");
        opts.credential_providers.config_file = Some("/nonexistent/plugins.yaml".into());
        let err = run(opts, std::future::pending(), None).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "the credential provider config /nonexistent/plugins.yaml (--plugin-config-file) \
             does not exist"
        );
    }

    #[tokio::test]
    async fn a_missing_kubeconfig_is_a_clear_error() {
        let err = run(opts("n1"), std::future::pending(), None)
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot load the kubeconfig /nonexistent/kubeconfig"
        );
    }
}
