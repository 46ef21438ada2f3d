//! The `apps.kruise.io` API types, one module per kind, their defaults and validation, and the
//! CRDs generated from them. Plain serde types: no client, no async runtime, so anything that
//! reads these kinds (the manager, the node daemon, a tool) can import them.
//!
//! Controllers work in `v1beta1`; `v1alpha1` is served from the same schema (see [`crd`]).
//! Beside the kinds: image references as the container runtime reads them ([`image`]) and
//! resource quantities as Go computes them ([`quantity`]), which validation needs.

pub mod common;
pub mod crd;
pub mod defaults;
pub mod image;
pub mod imagelistpulljob;
pub mod imagepulljob;
pub mod limits;
pub mod nodeimage;
pub mod pull_secret_pins;
pub mod quantity;
pub mod quote;
pub mod sidecarset;
pub mod validation;
pub mod well_known;

pub use crd::{crds, crds_yaml};
pub use imagelistpulljob::{ImageListPullJob, ImageListPullJobSpec, ImageListPullJobStatus};
pub use imagepulljob::{ImagePullJob, ImagePullJobSpec, ImagePullJobStatus};
pub use nodeimage::{NodeImage, NodeImageSpec, NodeImageStatus};
pub use sidecarset::{SidecarSet, SidecarSetSpec, SidecarSetStatus};

#[cfg(test)]
mod tests {
    /// The types are meant for anyone to import: a client, an async runtime or a controller
    /// runtime here would be compiled into every tool that only reads these kinds.
    #[test]
    fn the_api_crate_depends_on_no_client_and_no_async_runtime() {
        let manifest = include_str!("../Cargo.toml");
        let dependencies: Vec<&str> = manifest
            .split("\n[")
            .find(|section| section.starts_with("dependencies]"))
            .expect("a [dependencies] section")
            .lines()
            .skip(1)
            .filter(|line| !line.trim().is_empty() && !line.starts_with('#'))
            .collect();
        let names: Vec<&str> = dependencies
            .iter()
            .map(|line| line.split(['=', '.']).next().unwrap_or_default().trim())
            .collect();
        for forbidden in [
            "tokio",
            "kube-runtime",
            "kube-client",
            "futures",
            "hyper",
            "tower",
        ] {
            assert!(!names.contains(&forbidden), "{forbidden} in {names:?}");
        }
        let kube = dependencies
            .iter()
            .find(|line| line.starts_with("kube "))
            .expect("kube, for its derive");
        assert!(
            kube.ends_with(r#"features = ["derive"] }"#),
            "kube with features beyond derive: {kube}"
        );
    }
}
