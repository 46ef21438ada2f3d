//! How a kube-runtime `Controller` run with `graceful_shutdown_on` is stopped.

use std::future::Future;
use std::hash::Hash;
use std::time::Duration;

use futures::FutureExt;
use kube::Resource;
use kube::runtime::reflector::Store;

/// How long a stopping controller lets its reconciles in flight finish. They are idempotent,
/// so cutting a slow one off costs nothing but a repeat after the restart.
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(5);

/// Drives `running` (a controller's `for_each` future) until it ends or `shutdown` fires, then
/// lets it finish for at most `STOP_GRACE`.
///
/// A `Controller` told to stop before `store` (the cache of the kind it reconciles) holds its
/// first list waits for that list forever: the stopped watch never delivers it. Nothing can be
/// in flight then, so it is simply dropped.
pub async fn run_until_shutdown<K>(
    running: impl Future<Output = ()>,
    shutdown: impl Future<Output = ()>,
    store: &Store<K>,
) where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    tokio::pin!(running);
    tokio::select! {
        () = &mut running => return,
        () = shutdown => {}
    }
    if store.wait_until_ready().now_or_never().is_none() {
        return;
    }
    let _ = tokio::time::timeout(STOP_GRACE, running).await;
}
