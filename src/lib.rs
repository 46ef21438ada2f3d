//! kruise-rs's controller-manager: the admission webhooks, the controllers, leader election and
//! the probes, on top of the workspace's crates (`kruise-rs-api` for the kinds,
//! `kruise-rs-sidecar` for what a SidecarSet does to a pod, `kruise-rs-kube` for the client and
//! process plumbing). The node daemon is `kruise-rs-daemon`, which links none of this.
//!
//! The binary (`src/main.rs`) wires these modules into the `manager`, `daemon` and `crds`
//! subcommands, and `src/bin/kruise-rs-daemon.rs` the daemon alone.

pub mod controllers;
pub mod manager;
pub mod webhook;
