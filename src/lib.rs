//! kruise-rs: OpenKruise's SidecarSet, ImagePullJob and NodeImage APIs served from Rust.
//!
//! The binary (`src/main.rs`) wires these modules into the `manager`, `daemon` and `crds`
//! subcommands, and `src/bin/kruise-rs-daemon.rs` the daemon alone; everything with a decision
//! in it lives here so it can be unit tested.

pub mod apis;
pub mod cli;
pub mod controllers;
pub mod daemon;
pub mod error_chain;
pub mod events;
pub mod image;
pub mod manager;
pub mod quote;
pub mod runtime;
pub mod sidecar;
pub mod webhook;
