//! The `apps.kruise.io` API types, one module per kind, their defaults and validation, and the
//! CRDs generated from them. Plain serde types: no client, no async runtime, so anything that
//! reads these kinds (the manager, the node daemon, a tool) can import them.
//!
//! Controllers work in `v1beta1`; `v1alpha1` is served from the same schema (see [`crd`]).
//! Beside the kinds: image references as the container runtime reads them ([`image`]) and
//! resource quantities as Go computes them ([`quantity`]), which validation needs.

pub mod common;
pub mod compact;
pub mod crd;
pub mod defaults;
pub mod image;
pub mod imagelistpulljob;
pub mod imagepulljob;
pub mod interned;
pub mod limits;
pub mod nodeimage;
pub mod pull_secret_pins;
pub mod quantity;
pub mod quote;
pub mod shared_owner;
mod shared_value;
pub mod sidecarset;
pub mod validation;
pub mod well_known;

pub use crd::{crds, crds_yaml};
pub use imagelistpulljob::{ImageListPullJob, ImageListPullJobSpec, ImageListPullJobStatus};
pub use imagepulljob::{ImagePullJob, ImagePullJobSpec, ImagePullJobStatus};
pub use nodeimage::{NodeImage, NodeImageSpec, NodeImageStatus};
pub use sidecarset::{SidecarSet, SidecarSetSpec, SidecarSetStatus};
