//! End-to-end tests on a real one-node cluster: a real kubelet, containerd and runc run the
//! product image installed with its Helm chart, and the sidecars it injects and upgrades.
//!
//! Run with `make test-e2e` (tests/cluster/e2e.sh): it builds the image, starts the cluster
//! (tests/cluster/start.sh) and runs this binary inside the cluster's network namespace. Run
//! directly, every test fails saying so.

mod support;

mod chaos;
mod hot_upgrade;
mod image_gc;
mod imagepulljob;
mod lifecycle;
mod multinode;
mod native_sidecar;
mod predownload;
mod pull_verification;
mod resize;
mod sidecarset;
