//! Placeholder: the imagepulljob controller is being written.

use std::future::Future;

use kube::Client;

use super::ControllerOptions;

/// Runs the imagepulljob controller until `shutdown` resolves.
pub async fn run(_client: Client, _opts: ControllerOptions, shutdown: impl Future<Output = ()>) {
    shutdown.await;
}
