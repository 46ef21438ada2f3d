//! The controller-manager: connects to the cluster, checks the CRDs, serves the probe and metrics
//! endpoints and runs the controllers, until it is told to shut down.
//!
//! [`run`] is the whole lifecycle:
//! 1. connect (`--kubeconfig`, else `KUBECONFIG` / `~/.kube/config`, else in-cluster);
//! 2. log the server's Kubernetes version and refuse one older than `server_version::FLOOR`;
//!    check that [`crds::REQUIRED_CRDS`] are usable ([`crds::check_crds`]: installed,
//!    Established, no conversion webhook, both versions served), or refuse to start;
//!    ask once whether the server streams lists ([`kruise_rs_controller::initial_list`]);
//! 3. serve `/healthz`, `/readyz` and `/metrics` on [`ManagerOptions::probe_addr`];
//! 4. wait for the shutdown future, running the controllers all along, or with
//!    [`ManagerOptions::leader_election`] only while this replica holds the leader Lease
//!    ([`leader`]); the webhooks and probes run either way. `/readyz` answers 200 while the
//!    webhooks' caches and, where they run, the controllers' caches have listed ([`readiness`]);
//! 5. become unready (`/readyz` answers 503), stop the controllers (releasing the Lease), keep
//!    the webhooks answering for their grace period (the Service drops this replica meanwhile),
//!    drain the HTTP servers and return.

pub mod allocator;
pub mod crd_install;
pub mod crds;
pub mod leader;
pub mod readiness;
pub mod server_version;

use std::{
    future::Future,
    io,
    net::SocketAddr,
    path::PathBuf,
    pin::{Pin, pin},
    sync::{Arc, atomic::AtomicBool},
    time::Duration,
};

use kube::Client;
use tokio::{
    net::TcpListener,
    sync::{oneshot, watch},
};

use crate::controllers::{self, CacheSync, ControllerOptions};
use crate::webhook::handlers::{HandlerSettings, Handlers};
use crate::webhook::{self, WebhookError, WebhookOptions, server::Metered};
use kruise_rs_controller::initial_list::{self, InitialList, StreamingLists};
use kruise_rs_controller::pod_feed;
use tracing::{info, warn};

pub use self::crds::{CrdState, REQUIRED_CRDS, UnusableCrds, check_crds};
pub use self::leader::LeaderElection;
use self::readiness::Controllers;
pub use self::server_version::ServerTooOld;
use kruise_rs_controller::metrics::ManagerMetrics;
use kruise_rs_controller::names;
use kruise_rs_kube::{
    self, ConnectError, LimitWaits, Metrics, ProbeState, RateLimit, START_UP_PATIENCE, load_config,
    retry_transient,
};

/// The controllers' default client-side request limit (`--kube-api-qps`, `--kube-api-burst`):
/// sized above the rates the fan-out and rollout benches sent with no limit (1.8× the highest),
/// so that it does not slow them, and still a cap on a runaway loop (decision record
/// docs/decisions/0021-client-limits-sized-by-the-benches.md).
pub const DEFAULT_KUBE_API_RATE: RateLimit = RateLimit {
    qps: 500.0,
    burst: 1000,
};

/// How long in-flight reconciles may take to finish once shutdown has begun.
const CONTROLLERS_STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// How long open probe/metrics connections may take to finish once shutdown has begun.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// What the manager needs to start.
#[derive(Clone, Debug)]
pub struct ManagerOptions {
    /// A kubeconfig file to use instead of `KUBECONFIG`, `~/.kube/config` or the in-cluster
    /// service account.
    pub kubeconfig: Option<PathBuf>,
    /// Where to serve `/healthz`, `/readyz` and `/metrics`; port 0 picks a free port.
    pub probe_addr: SocketAddr,
    /// Settings of the controllers.
    pub controllers: ControllerOptions,
    /// The admission webhooks; `None` runs the manager without them.
    pub webhook: Option<WebhookOptions>,
    /// Run the controllers only while holding this Lease; `None`: always (a single replica, or
    /// replicas that manage disjoint label selectors).
    pub leader_election: Option<LeaderElection>,
    /// Whether the controllers' watches stream their first list (`Auto`: where the server can).
    pub streaming_lists: StreamingLists,
    /// The client-side limit on the controllers' requests to the API server
    /// (`--kube-api-qps`/`--kube-api-burst`); `None`: none. The webhooks and leader election
    /// are outside it.
    pub kube_api_rate: Option<RateLimit>,
}

/// Why the manager could not start, or stopped other than by request.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error(
        "cannot read the CustomResourceDefinition {name} from the API server (the manager needs \
         `get` on customresourcedefinitions.apiextensions.k8s.io)"
    )]
    ReadCrd {
        name: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    CrdsUnusable(#[from] UnusableCrds),
    #[error("cannot read the API server's version (GET /version)")]
    ReadServerVersion(#[source] kube::Error),
    #[error(transparent)]
    ServerTooOld(#[from] ServerTooOld),
    #[error(
        "cannot listen on {addr} for the probe and metrics server; choose another --probe-addr \
         or stop what is using it"
    )]
    Bind {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Webhook(#[from] WebhookError),
    #[error("the webhooks stopped unexpectedly")]
    WebhookStopped,
    #[error("invalid leader-election settings: {0}")]
    LeaderElection(String),
    #[error("the controllers stopped unexpectedly")]
    ControllersStopped,
    #[error("the probe and metrics server stopped unexpectedly")]
    ServerStopped {
        #[source]
        source: Option<io::Error>,
    },
}

/// Runs the manager until `shutdown` resolves, then stops cleanly and returns `Ok(())`.
///
/// `on_ready`, when given, receives the bound probe address the first time the manager is
/// ready: the CRDs passed the check, the probe server is serving, the caches [`readiness`] waits
/// for have listed, and `/readyz` answers 200 (a manager whose watches fail never sends it, see
/// `tests/integration/watch_lists.rs`). If start-up fails,
/// `on_ready` is dropped and `run` returns the error. A `shutdown` that resolves during start-up
/// stops the manager before it becomes ready (also `Ok(())`).
pub async fn run(
    opts: ManagerOptions,
    shutdown: impl Future<Output = ()>,
    on_ready: Option<oneshot::Sender<SocketAddr>>,
) -> Result<(), ManagerError> {
    info!(version = env!("CARGO_PKG_VERSION"), "starting the manager");
    if let Some(election) = &opts.leader_election {
        election.check().map_err(ManagerError::LeaderElection)?;
    }
    let mut shutdown = pin!(shutdown);
    let limit_waits = LimitWaits::default();

    let Started {
        client,
        unlimited,
        listener,
        initial_list,
    } = tokio::select! {
        biased;
        () = &mut shutdown => {
            info!("shutting down before the manager started");
            info!("stopped");
            return Ok(());
        }
        started = start(&opts, &limit_waits) => started?,
    };
    let addr = listener.local_addr().map_err(|source| ManagerError::Bind {
        addr: opts.probe_addr,
        source,
    })?;

    let manager_metrics = if opts.controllers.upstream_metric_names {
        ManagerMetrics::with_upstream_names()
    } else {
        ManagerMetrics::new()
    };
    let workers = opts.controllers.workers;
    for (controller, count) in [
        (names::SIDECARSET, workers.sidecarset),
        (names::IMAGEPULLJOB, workers.imagepulljob),
        (names::IMAGELISTPULLJOB, workers.imagelistpulljob),
        (names::NODEIMAGE, workers.nodeimage),
    ] {
        manager_metrics.set_workers(controller, count);
    }
    let state = ProbeState::new(Arc::new(Metrics::with_unprefixed(
        |registry| {
            manager_metrics.register(registry);
            limit_waits.register(registry);
        },
        manager_metrics
            .counts_upstream_names()
            .then_some(|registry: &mut _| manager_metrics.register_upstream_names(registry)),
    )));
    let (stop_server, server_stopping) = oneshot::channel::<()>();
    let mut server = pin!(kruise_rs_kube::serve(listener, state.clone(), async move {
        // A dropped sender also stops the server.
        let _ = server_stopping.await;
    }));

    let (stop_controllers, controllers_stopping) = oneshot::channel::<()>();
    // Admission has deadlines (a dry-run pod within 5 s, an answer within the webhook timeout)
    // and its rate is the apiserver's to govern: it must not queue behind a rollout's patches.
    let webhook_client = unlimited.clone();
    let controller_opts = ControllerOptions {
        metrics: manager_metrics.clone(),
        initial_list,
        ..opts.controllers.clone()
    };
    // Without election the controllers start right away: not ready until they have synced.
    let (controllers_state, controllers_seen) = watch::channel(match &opts.leader_election {
        Some(election) if election.warm_standby => Controllers::StandbyListing,
        Some(_) => Controllers::Standby,
        None => Controllers::Syncing,
    });
    let mut controllers = pin!(boxed_controllers(
        client,
        unlimited,
        controller_opts,
        opts.leader_election.clone(),
        Arc::new(controllers_state),
        async move {
            let _ = controllers_stopping.await;
        },
    ));

    let (stop_webhook, webhook_stopping) = oneshot::channel::<()>();
    let (webhook_ready, webhook_serving) = oneshot::channel();
    let (webhooks, webhook_caches) = serve_webhooks(
        opts.webhook.clone(),
        webhook_client,
        manager_metrics.clone(),
        webhook_stopping,
        webhook_ready,
    );
    let mut webhooks = pin!(webhooks);
    tokio::select! {
        biased;
        () = &mut shutdown => {
            info!("shutting down before the webhooks were ready");
            return Ok(());
        }
        result = &mut webhooks => {
            return Err(result.err().map(ManagerError::Webhook).unwrap_or(ManagerError::WebhookStopped));
        }
        serving = webhook_serving => {
            // An error here means "no webhooks": a failed start ends `webhooks` first.
            if let Ok(addr) = serving {
                info!(webhook_addr = %addr, "webhooks ready");
            }
        }
    }

    info!(probe_addr = %addr, "manager running");
    serve_until_shutdown(
        shutdown.as_mut(),
        server.as_mut(),
        controllers.as_mut(),
        webhooks.as_mut(),
        Readiness {
            webhook_caches,
            controllers_seen,
            state: &state,
            addr,
            on_ready,
        },
    )
    .await?;

    info!("shutting down");
    state.set_ready(false);
    let _ = stop_controllers.send(());
    let _ = stop_webhook.send(());
    // The webhooks answer through their grace period while the controllers stop.
    let webhook_grace = opts
        .webhook
        .as_ref()
        .map_or(Duration::ZERO, |w| w.shutdown_grace);
    drain(
        server.as_mut(),
        stop_server,
        webhooks.as_mut(),
        webhook_grace,
        controllers.as_mut(),
    )
    .await?;
    info!("stopped");
    Ok(())
}

/// What `/readyz` follows, and who waits for the first ready.
struct Readiness<'a> {
    webhook_caches: Option<watch::Receiver<bool>>,
    controllers_seen: watch::Receiver<Controllers>,
    state: &'a ProbeState,
    addr: SocketAddr,
    on_ready: Option<oneshot::Sender<SocketAddr>>,
}

/// Keeps `/readyz` in step with the webhooks' caches and the controllers until `shutdown`
/// (then `Ok`), or until the probe server, the controllers or the webhooks stop on their own
/// (an error). `on_ready` gets the probe address the first time the manager is ready.
async fn serve_until_shutdown<Sh, S, C, W>(
    mut shutdown: Pin<&mut Sh>,
    mut server: Pin<&mut S>,
    mut controllers: Pin<&mut C>,
    mut webhooks: Pin<&mut W>,
    watched: Readiness<'_>,
) -> Result<(), ManagerError>
where
    Sh: Future<Output = ()>,
    S: Future<Output = io::Result<()>>,
    C: Future<Output = ()>,
    W: Future<Output = Result<(), WebhookError>>,
{
    let Readiness {
        mut webhook_caches,
        mut controllers_seen,
        state,
        addr,
        mut on_ready,
    } = watched;
    let mut was_ready = None;
    loop {
        let webhooks_listed = webhook_caches.as_mut().map(|rx| *rx.borrow_and_update());
        let controllers_now = *controllers_seen.borrow_and_update();
        let ready = readiness::is_ready(webhooks_listed, controllers_now);
        if was_ready != Some(ready) {
            if ready {
                info!("ready");
            } else {
                let waiting = readiness::waiting_for(webhooks_listed, controllers_now);
                info!(waiting_for = ?waiting, "not ready");
            }
            state.set_ready(ready);
            was_ready = Some(ready);
        }
        if ready && let Some(on_ready) = on_ready.take() {
            // The caller may have stopped listening; that is not our problem.
            let _ = on_ready.send(addr);
        }
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            result = &mut server => {
                state.set_ready(false);
                return Err(ManagerError::ServerStopped { source: result.err() });
            }
            () = &mut controllers => {
                state.set_ready(false);
                return Err(ManagerError::ControllersStopped);
            }
            result = &mut webhooks => {
                state.set_ready(false);
                return Err(result.err().map(ManagerError::Webhook).unwrap_or(ManagerError::WebhookStopped));
            }
            // A closed channel means its side is going away: the branches above end next.
            () = changed_or_pending(webhook_caches.as_mut()) => {}
            () = changed_or_pending(Some(&mut controllers_seen)) => {}
        }
    }
}

/// The webhooks' part of the manager: a future that serves them until `stop` (or fails), and
/// a receiver that turns true once their caches have listed. Without webhooks the future only
/// waits for `stop`, `ready` is dropped, and there is no receiver.
fn serve_webhooks(
    opts: Option<WebhookOptions>,
    client: Client,
    metrics: ManagerMetrics,
    stop: oneshot::Receiver<()>,
    ready: oneshot::Sender<SocketAddr>,
) -> (
    impl Future<Output = Result<(), WebhookError>>,
    Option<watch::Receiver<bool>>,
) {
    let parts = opts.map(|webhook_opts| {
        let (handlers, caches) = Handlers::with_settings(
            client.clone(),
            &webhook_opts.namespace,
            HandlerSettings {
                patch_pod_metadata_defaults_allowed: webhook_opts
                    .patch_pod_metadata_defaults_allowed,
                injection: kruise_rs_sidecar::InjectionOptions {
                    sort_containers_by_name: webhook_opts.sort_sidecar_containers_by_name,
                },
                unreadable_sidecarset_policy: webhook_opts.unreadable_sidecarset_policy,
                sidecarset_cache_reads: webhook_opts.sidecarset_cache_reads,
            },
        );
        (webhook_opts, handlers, caches)
    });
    let listed = parts.as_ref().map(|(_, handlers, _)| handlers.synced());
    let serving = async move {
        let Some((webhook_opts, handlers, caches)) = parts else {
            drop(ready);
            // Without webhooks this branch only ends when told to stop.
            let _ = stop.await;
            return Ok(());
        };
        let serve = webhook::run(
            client,
            webhook_opts,
            Arc::new(Metered {
                inner: handlers,
                metrics,
            }),
            async move {
                let _ = stop.await;
            },
            Some(ready),
        );
        tokio::select! {
            result = serve => result,
            () = caches => Err(WebhookError::CachesStopped),
        }
    };
    (serving, listed)
}

/// Lets the webhooks (through `webhook_grace`) and the controllers finish, the probe server
/// answering meanwhile, then stops the probe server.
async fn drain<S, W, C>(
    mut server: Pin<&mut S>,
    stop_server: oneshot::Sender<()>,
    webhooks: Pin<&mut W>,
    webhook_grace: Duration,
    controllers: Pin<&mut C>,
) -> Result<(), ManagerError>
where
    S: Future<Output = io::Result<()>>,
    W: Future,
    C: Future<Output = ()>,
{
    let stopping = async {
        tokio::join!(
            tokio::time::timeout(webhook_grace + CONTROLLERS_STOP_TIMEOUT, webhooks),
            tokio::time::timeout(CONTROLLERS_STOP_TIMEOUT, controllers),
        )
        .1
    };
    // The probe server keeps answering meanwhile: `/readyz` must say 503, not time out.
    let controllers_stopped = tokio::select! {
        stopped = stopping => stopped,
        result = &mut server => {
            return Err(ManagerError::ServerStopped { source: result.err() });
        }
    };
    if controllers_stopped.is_err() {
        warn!(timeout = ?CONTROLLERS_STOP_TIMEOUT, "controllers still busy after the stop timeout; leaving them");
    }
    let _ = stop_server.send(());
    match tokio::time::timeout(DRAIN_TIMEOUT, server).await {
        Ok(result) => result.map_err(|source| ManagerError::ServerStopped {
            source: Some(source),
        })?,
        Err(_elapsed) => warn!(
            timeout = ?DRAIN_TIMEOUT,
            "probe and metrics connections still open after the drain timeout; closing them"
        ),
    }
    Ok(())
}

/// Resolves when `rx` sees a new value; never, without a channel or once its sender is gone.
async fn changed_or_pending<T>(rx: Option<&mut watch::Receiver<T>>) {
    if let Some(rx) = rx
        && rx.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

/// Runs `run` (the controllers with `synced` in their options), telling `state` whether they
/// are syncing, synced or stopped (standing by: [`readiness::stand_by`] with `warm_listed`).
async fn reporting_sync(
    run: impl Future<Output = ()>,
    synced: CacheSync,
    state: Arc<watch::Sender<Controllers>>,
    warm_listed: Arc<AtomicBool>,
) {
    state.send_replace(Controllers::Syncing);
    let report = async {
        synced.wait_all().await;
        info!("the controllers' caches have listed");
        state.send_replace(Controllers::Synced);
        std::future::pending::<()>().await;
    };
    tokio::select! {
        () = run => {}
        () = report => {}
    }
    readiness::stand_by(&state, &warm_listed);
}

/// [`run_controllers`], on the heap. Built here, in a frame that ends once it is built: built
/// in place, the 79 KB it takes in a debug build were part of every poll of the manager's own
/// future, whose tests await it in place or on 2 MiB threads (a cutover test overflowed).
fn boxed_controllers(
    client: Client,
    lease_client: Client,
    opts: ControllerOptions,
    election: Option<LeaderElection>,
    state: Arc<watch::Sender<Controllers>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    Box::pin(run_controllers(
        client,
        lease_client,
        opts,
        election,
        state,
        shutdown,
    ))
}

/// Runs the controllers until `shutdown` resolves: all along, or with `election` only while
/// this replica leads (then the Lease is released once they have stopped). Returns early only
/// if they stop by themselves. `state` follows them, for `/readyz`. `lease_client` is for
/// leader election alone.
async fn run_controllers(
    client: Client,
    lease_client: Client,
    opts: ControllerOptions,
    election: Option<LeaderElection>,
    state: Arc<watch::Sender<Controllers>>,
    shutdown: impl Future<Output = ()>,
) {
    let metrics = opts.metrics.clone();
    let metrics_for_terms = opts.metrics.clone();
    let Some(election) = election else {
        metrics.set_leader(true);
        let synced = CacheSync::default();
        let opts = ControllerOptions {
            synced: synced.clone(),
            ..opts
        };
        let no_warm_watches = Arc::new(AtomicBool::new(true));
        reporting_sync(
            controllers::run(client, opts, shutdown),
            synced,
            state,
            no_warm_watches,
        )
        .await;
        return;
    };
    info!(lease = %election.lease_name, namespace = %election.namespace, identity = %election.identity,
          warm_standby = election.warm_standby,
          "leader election on: the controllers run only on the replica holding the lease");
    // Warm: the pod and NodeImage watches run all along, leading or not (decision 0043). Until
    // they have listed, a replica standing by is not ready (also after a term that began
    // before they had).
    let warm_listed = Arc::new(AtomicBool::new(!election.warm_standby));
    let (drive, warm) = match election.warm_standby {
        true => {
            let (drive, watches) = controllers::SharedWatches::new(&client, &opts);
            let listed = {
                let (watches, state, warm_listed) =
                    (watches.clone(), state.clone(), warm_listed.clone());
                async move {
                    watches.listed().await;
                    info!("standing by with the pods and NodeImages listed");
                    readiness::warm_watches_listed(&state, &warm_listed);
                    std::future::pending::<()>().await;
                }
            };
            let drive = async move {
                futures::future::join(drive, listed).await;
            };
            (futures::future::Either::Left(drive), Some(watches))
        }
        false => (
            futures::future::Either::Right(std::future::pending::<()>()),
            None,
        ),
    };
    // The manager's own stop timeout bounds the whole of this; the inner one lets the release
    // happen within it.
    let stop_timeout = CONTROLLERS_STOP_TIMEOUT
        .saturating_sub(election.renew_deadline.min(Duration::from_secs(3)));
    let leading = leader::run_while_leading(
        lease_client,
        election,
        shutdown,
        stop_timeout,
        |leading| metrics.set_leader(leading),
        move |stop| {
            // Each term's controllers start with empty caches of their own (and, cold, of pods
            // and NodeImages too): readiness waits for them again.
            let synced = CacheSync::default();
            let opts = ControllerOptions {
                synced: synced.clone(),
                ..opts.clone()
            };
            let (client, warm, state, warm_listed) = (
                client.clone(),
                warm.clone(),
                state.clone(),
                warm_listed.clone(),
            );
            // Dropped with the controllers, also when the Lease is lost mid-reconcile.
            let forget = ForgetObjects(
                metrics_for_terms.clone(),
                state.clone(),
                warm_listed.clone(),
            );
            // Boxed, and the controllers' futures made inside it: built here, in the election's
            // poll, they were moved through its stack, which a debug build's 2 MiB test threads
            // could not hold (leader_election::cold_standbys_hand_over_the_same_way).
            Box::pin(async move {
                let _forget = forget;
                let stop = async move {
                    let _ = stop.await;
                };
                match warm {
                    Some(watches) => {
                        let run = controllers::run_on(&watches, client, opts, stop);
                        reporting_sync(run, synced, state, warm_listed).await;
                    }
                    None => {
                        let run = controllers::run(client, opts, stop);
                        reporting_sync(run, synced, state, warm_listed).await;
                    }
                }
            })
        },
    );
    let _ = pod_feed::alongside(drive, leading).await;
}

/// On drop, clears what the controllers reported about the objects: a replica that no longer
/// leads does not watch them, so its gauges would only go stale; and its controllers stand by.
struct ForgetObjects(
    ManagerMetrics,
    Arc<watch::Sender<Controllers>>,
    Arc<AtomicBool>,
);

impl Drop for ForgetObjects {
    fn drop(&mut self) {
        self.0.forget_objects();
        readiness::stand_by(&self.1, &self.2);
    }
}

/// Start-up before the manager can serve: clients, server version, CRD check, how the watches
/// list, probe listener.
async fn start(opts: &ManagerOptions, waits: &LimitWaits) -> Result<Started, ManagerError> {
    let config = load_config(opts.kubeconfig.as_deref()).await?;
    match opts.kube_api_rate {
        Some(limit) => info!(
            qps = limit.qps,
            burst = limit.burst,
            "client-side API request rate limit"
        ),
        None => info!("no client-side API request rate limit"),
    }
    // Leader election and the webhooks have a client outside the limit: a queue of controller
    // requests must not hold up a renewal past the renew deadline (leader election sends one
    // request a retry period), nor an admission past its deadline.
    let unlimited = kruise_rs_kube::client(config.clone(), None, waits)?;
    let client = kruise_rs_kube::client(config, opts.kube_api_rate, waits)?;
    let info = retry_transient(
        "reading the API server's version",
        START_UP_PATIENCE,
        || client.apiserver_version(),
    )
    .await
    .map_err(ManagerError::ReadServerVersion)?;
    match server_version::check(&info.major, &info.minor, &info.git_version)? {
        Some(version) => info!(server = %info.git_version, %version, "API server"),
        None => warn!(
            server = %info.git_version, major = %info.major, minor = %info.minor,
            "cannot tell the API server's Kubernetes version; going on (supported: {} to {})",
            server_version::FLOOR, server_version::NEWEST_TESTED
        ),
    }
    crds::ensure_installed(&client).await?;
    info!(crds = ?REQUIRED_CRDS, "required CustomResourceDefinitions are installed, Established and convert with strategy None");
    let (initial_list, why) = initial_list::choose(&client, opts.streaming_lists).await;
    info!(initial_list = initial_list.as_str(), reason = %why, "how the controllers' watches list");
    let listener =
        TcpListener::bind(opts.probe_addr)
            .await
            .map_err(|source| ManagerError::Bind {
                addr: opts.probe_addr,
                source,
            })?;
    Ok(Started {
        client,
        unlimited,
        listener,
        initial_list,
    })
}

/// What [`start`] made.
struct Started {
    /// The controllers' client, behind `--kube-api-qps`.
    client: Client,
    /// The webhooks' and leader election's, outside it.
    unlimited: Client,
    listener: TcpListener,
    initial_list: InitialList,
}

#[cfg(test)]
mod tests {
    use std::{future::pending, path::Path};

    use super::*;

    fn opts(kubeconfig: &str) -> ManagerOptions {
        ManagerOptions {
            kubeconfig: Some(PathBuf::from(kubeconfig)),
            probe_addr: "127.0.0.1:0".parse().unwrap(),
            controllers: ControllerOptions::default(),
            webhook: None,
            leader_election: None,
            streaming_lists: StreamingLists::Auto,
            kube_api_rate: None,
        }
    }

    fn assert_send<T: Send>(_: &T) {}

    /// Tests await the manager in place on threads of 2 MiB. With the warm standby's watches
    /// held inline its future was 129 KB in a debug build, and polling it overflowed a cutover
    /// test's stack; with the controllers boxed it is 50 KB.
    #[test]
    fn the_managers_future_stays_small() {
        let fut = run(opts("/nonexistent/kubeconfig"), pending(), None);
        let size = std::mem::size_of_val(&fut);
        assert!(size < 96 * 1024, "the manager's future is {size} bytes");
    }

    #[tokio::test]
    async fn missing_kubeconfig_is_a_clear_error() {
        let (tx, rx) = oneshot::channel();
        let fut = run(opts("/nonexistent/kubeconfig"), pending(), Some(tx));
        // Integration tests spawn `run` on the runtime.
        assert_send(&fut);
        let err = fut.await.unwrap_err();
        assert!(
            matches!(&err, ManagerError::Connect(ConnectError::Kubeconfig { path, .. }) if path == Path::new("/nonexistent/kubeconfig")),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "cannot load the kubeconfig /nonexistent/kubeconfig"
        );
        // Start-up failed, so nobody is told the manager is ready.
        assert!(rx.await.is_err());
    }

    #[tokio::test]
    async fn shutdown_before_start_returns_ok() {
        let result = run(
            opts("/nonexistent/kubeconfig"),
            std::future::ready(()),
            None,
        )
        .await;
        assert!(result.is_ok(), "{result:?}");
    }

    #[test]
    fn crds_missing_message_is_the_check_message() {
        let err = ManagerError::from(check_crds(&[]).unwrap_err());
        assert!(
            err.to_string()
                .starts_with("required CustomResourceDefinitions are not installed: "),
            "{err}"
        );
        assert!(std::error::Error::source(&err).is_none());
    }
}
