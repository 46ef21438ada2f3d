//! `played-node`: what a real node does, played against a control plane without nodes, for the
//! `make run` demo (tests/controlplane/run-local.sh). The same code plays the kubelet and the
//! node daemon in the integration tests and the benches.
//!
//! ```text
//! played-node kubelet NAMESPACE   report every scheduled pod of NAMESPACE Running and Ready,
//!                                 each container running its spec image (a changed image
//!                                 restarted once more)
//! played-node daemon [NODE...]    report every tag a NodeImage asks for pulled, except on the
//!                                 NodeImages of NODE... (where a real daemon runs)
//! ```
//!
//! Connects as `KUBECONFIG` says; runs until killed.

use std::collections::HashSet;
use std::process::ExitCode;

use k8s_openapi::api::core::v1::Pod;
use kruise_rs_testkit::played_daemon::{PlayedDaemons, play_node_image_daemons};
use kruise_rs_testkit::played_kubelet::play_scheduled_pods;
use kube::{Api, Client};

const USAGE: &str = "usage: played-node kubelet NAMESPACE | played-node daemon [NODE...]";

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let client = match Client::try_default().await {
        Ok(client) => client,
        Err(e) => {
            eprintln!("played-node: cannot connect to the cluster: {e}");
            return ExitCode::FAILURE;
        }
    };
    match args.split_first() {
        Some((mode, [namespace])) if mode == "kubelet" => {
            play_scheduled_pods(Api::<Pod>::namespaced(client, namespace)).await;
            ExitCode::SUCCESS
        }
        Some((mode, nodes)) if mode == "daemon" => {
            let how = PlayedDaemons {
                // Answers spread over a second or two, as pulls finish out of order.
                delay_ms: 500..2000,
                seed: fastrand::u64(..),
                except_nodes: nodes.iter().cloned().collect::<HashSet<_>>(),
                ..PlayedDaemons::default()
            };
            match play_node_image_daemons(client, how).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("played-node: the played daemons stopped: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}
