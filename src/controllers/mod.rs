//! The manager's controllers: [`run`] starts the NodeImage, ImagePullJob and ImageListPullJob
//! controllers (`kruise-rs-imagepull`) and the SidecarSet controller ([`sidecarset`]) with one
//! pod watch and one NodeImage watch between them (`SharedWatches`), and returns when
//! `shutdown` fires.
//!
//! Each controller has a small `Context`, a free `reconcile` and `error_policy`, and keeps its
//! decisions in pure functions (a `plan.rs` each) that carry the unit tests. What they all share
//! (options, metrics, the pod store, stopping) is `kruise-rs-controller`.

pub mod sidecarset;

use std::future::Future;
use std::pin::Pin;

use futures::FutureExt;
use kube::Client;
use tokio::sync::watch;

use kruise_rs_controller::pod_feed::{self, SharedWatch};
use kruise_rs_controller::pod_summary::PodSummary;
pub use kruise_rs_controller::{CONTROLLERS, CacheSync, ControllerOptions, InitialList, Workers};
use kruise_rs_imagepull::lean_nodeimage::{self, LeanNodeImage};
use kruise_rs_imagepull::{imagelistpulljob, imagepulljob, nodeimage};

/// The two watches the controllers share, of the biggest sets the manager reads: every pod,
/// and the NodeImages in scope. They may outlive the controllers: a standby replica keeps them
/// running (warm) so that, once it leads, its controllers start from full stores instead of
/// listing tens of thousands of pods first (decision 0043).
#[derive(Clone)]
pub(crate) struct SharedWatches {
    pods: SharedWatch<PodSummary>,
    nodeimages: SharedWatch<LeanNodeImage>,
}

impl SharedWatches {
    /// Starts nothing by itself: returns the future that drives both watches (poll it for as
    /// long as the watches should run) and the handle the controllers take their feeds from.
    pub(crate) fn new(
        client: &Client,
        opts: &ControllerOptions,
    ) -> (Pin<Box<dyn Future<Output = ()> + Send>>, Self) {
        let (drive_pods, pods) = pod_feed::share_pods(client.clone(), opts.watch_config());
        let (drive_nodeimages, nodeimages) =
            lean_nodeimage::share_nodeimages(client.clone(), opts.scoped_watch_config());
        // Boxed here: 16 KB in a debug build, which every poll frame that built it in place
        // would carry.
        let drive = Box::pin(futures::future::join(drive_pods, drive_nodeimages).map(|_| ()));
        (drive, Self { pods, nodeimages })
    }

    /// Resolves once both watches have listed (at once if they have).
    pub(crate) async fn listed(&self) {
        let (mut pods, mut nodeimages) = (self.pods.ready(), self.nodeimages.ready());
        let _ = pods.wait_for(|listed| *listed).await;
        let _ = nodeimages.wait_for(|listed| *listed).await;
    }
}

/// Runs every controller until `shutdown` resolves; each one stops gracefully (in-flight
/// reconciles finish) before this returns. The shared watches start and stop with them.
pub async fn run(client: Client, opts: ControllerOptions, shutdown: impl Future<Output = ()>) {
    let (drive, watches) = SharedWatches::new(&client, &opts);
    pod_feed::alongside(drive, run_on(&watches, client, opts, shutdown)).await;
}

/// Runs every controller, reading pods and NodeImages from `watches` (whose drive runs apart),
/// until `shutdown` resolves; each one stops gracefully before this returns.
pub(crate) async fn run_on(
    watches: &SharedWatches,
    client: Client,
    opts: ControllerOptions,
    shutdown: impl Future<Output = ()>,
) {
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };
    // One pod store for both controllers that read pods, and one NodeImage store for the
    // NodeImage, ImagePullJob and SidecarSet controllers.
    let (for_jobs, for_sidecarsets) = (watches.pods.feed(), watches.pods.feed());
    let (nodeimages_for_jobs, nodeimages_for_nodeimage, nodeimages_for_sets) = (
        watches.nodeimages.feed(),
        watches.nodeimages.feed(),
        watches.nodeimages.feed(),
    );
    // Boxed: each controller's future holds its watches and stores inline; unboxed, `run`'s
    // future was 54 KB in a debug build (15 KB boxed) and the manager's 159 KB (80 KB), and a
    // test awaiting the manager in place overflowed its 2 MiB thread stack.
    let controllers = futures::future::join4(
        Box::pin(nodeimage::run_with_nodeimages(
            client.clone(),
            opts.clone(),
            nodeimages_for_nodeimage,
            stopped(),
        )),
        Box::pin(imagelistpulljob::run(
            client.clone(),
            opts.clone(),
            stopped(),
        )),
        Box::pin(imagepulljob::run_with_feeds(
            client.clone(),
            opts.clone(),
            for_jobs,
            nodeimages_for_jobs,
            stopped(),
        )),
        Box::pin(sidecarset::run_with_feeds(
            client,
            opts,
            for_sidecarsets,
            nodeimages_for_sets,
            stopped(),
        )),
    );
    tokio::pin!(controllers);
    let shutdown = shutdown.fuse();
    tokio::pin!(shutdown);
    tokio::select! {
        _ = &mut controllers => return,
        () = &mut shutdown => {}
    }
    let _ = stop_tx.send(true);
    controllers.await;
}
