//! The test kit the benches and the test binaries share: the loopback control plane
//! (`tests/controlplane/start.sh`, stopped on drop), child processes that die with their owner,
//! `/proc` figures (RSS, CPU time), Ready fake Nodes, played kubelets and node daemons, following a rollout,
//! unique names and deadline polling.
//!
//! A dev-dependency of the `kruise-rs` package: `tests/integration` and the benches use it as
//! `harness` (`use kruise_rs_testkit as harness;`); `tests/e2e`, which runs against a real
//! cluster, takes only [`shared`] and [`played_daemon`].
//!
//! Errors are `String`s: a test panics with them, a bench's `Box<dyn Error>` takes them by `?`.

pub mod bench;
pub mod controlplane;
pub mod fault_proxy;
pub mod manager_under_test;
pub mod objects;
pub mod played_daemon;
pub mod played_kubelet;
pub mod process;
pub mod procfs;
pub mod rollout;
pub mod shared;
pub mod slow_registry;

/// `rel` inside the repository (two levels above this crate's manifest directory).
pub fn repo_path(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

/// The `kruise-rs` binary cargo built beside the running test or bench: cargo builds a package's
/// binaries before its integration tests and benches, into `target/<profile>/`, and the test's
/// own executable sits in `target/<profile>/deps/`.
pub(crate) fn kruise_rs_binary() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the running executable's path");
    exe.parent()
        .and_then(std::path::Path::parent)
        .expect("a test executable in target/<profile>/deps/")
        .join("kruise-rs")
}
