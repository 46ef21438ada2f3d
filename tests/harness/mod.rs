//! The one harness the benches and the test binaries share: the loopback control plane
//! (`tests/controlplane/start.sh`, stopped on drop), child processes that die with their owner,
//! `/proc` figures (RSS, CPU time), Ready fake Nodes, played node daemons, following a rollout,
//! unique names and deadline polling.
//!
//! Included by path, one copy per target:
//! - `benches/*.rs`: `#[path = "../tests/harness/mod.rs"] mod harness;`
//! - `tests/integration/main.rs`: `#[path = "../harness/mod.rs"] mod harness;`
//! - `tests/e2e/support.rs` includes only [`shared`] (it runs against a real node's cluster).
//!
//! Errors are `String`s: a test panics with them, a bench's `Box<dyn Error>` takes them by `?`.
#![allow(dead_code)]

pub mod bench;
pub mod controlplane;
pub mod fault_proxy;
pub mod manager_under_test;
pub mod objects;
pub mod played_daemon;
pub mod process;
pub mod procfs;
pub mod rollout;
pub mod shared;

/// `rel` inside the repository (the crate's manifest directory).
pub fn repo_path(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}
