//! The manager's controllers: [`run`] starts the NodeImage, ImagePullJob and ImageListPullJob
//! controllers (`kruise-rs-imagepull`) and the SidecarSet controller ([`sidecarset`]) with one
//! pod watch and one NodeImage watch between them, and returns when `shutdown` fires.
//!
//! Each controller has a small `Context`, a free `reconcile` and `error_policy`, and keeps its
//! decisions in pure functions (a `plan.rs` each) that carry the unit tests. What they all share
//! (options, metrics, the pod store, stopping) is `kruise-rs-controller`.

pub mod sidecarset;

use std::future::Future;

use futures::FutureExt;
use kube::Client;
use tokio::sync::watch;

use kruise_rs_controller::pod_feed;
pub use kruise_rs_controller::{CONTROLLERS, CacheSync, ControllerOptions, InitialList, Workers};
use kruise_rs_imagepull::{imagelistpulljob, imagepulljob, lean_nodeimage, nodeimage};

/// Runs every controller until `shutdown` resolves; each one stops gracefully (in-flight
/// reconciles finish) before this returns.
pub async fn run(client: Client, opts: ControllerOptions, shutdown: impl Future<Output = ()>) {
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };
    // One pod watch and store for both controllers that read pods.
    let (drive_pods, mut feeds) = pod_feed::watch_pods(client.clone(), opts.watch_config(), 2);
    let (Some(for_jobs), Some(for_sidecarsets)) = (feeds.pop(), feeds.pop()) else {
        return;
    };
    // And one NodeImage watch and store for the NodeImage, ImagePullJob and SidecarSet
    // controllers.
    let (drive_nodeimages, mut feeds) =
        lean_nodeimage::watch_nodeimages(client.clone(), opts.scoped_watch_config(), 3);
    let (Some(nodeimages_for_jobs), Some(nodeimages_for_nodeimage), Some(nodeimages_for_sets)) =
        (feeds.pop(), feeds.pop(), feeds.pop())
    else {
        return;
    };
    let drive = futures::future::join(drive_pods, drive_nodeimages).map(|_| ());
    let controllers = pod_feed::alongside(
        drive,
        // Boxed: each controller's future holds its watches and stores inline; unboxed, `run`'s
        // future was 54 KB in a debug build (15 KB boxed) and the manager's 159 KB (80 KB), and
        // a test awaiting the manager in place overflowed its 2 MiB thread stack.
        futures::future::join4(
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
        ),
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
