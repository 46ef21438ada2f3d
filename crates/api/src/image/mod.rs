//! Image reference parsing and normalization.
//!
//! NodeImage `spec.images` is keyed by the *familiar* image name (`nginx`, `foo/bar`,
//! `ghcr.io/org/app`) and each tag entry by the tag, or by the digest (`sha256:…`) for
//! digest-pinned images. Upstream computes both with docker/distribution v2.8.2's
//! `reference.ParseNormalizedNamed` + `FamiliarName`; [`ImageRef`] reproduces that grammar and
//! normalization, so a NodeImage written by us reads the same to upstream's daemon and the other
//! way round. It refuses two kinds of reference upstream accepts but cannot serve: a first
//! component that looks like a host but is not one (`a_b.c/d`), and Docker Hub namespaces whose
//! familiar name reads back as a registry (`docker.io/localhost/x` would be keyed `localhost/x`).
//!
//! The reverse direction, [`pull_ref_for`], builds what the daemon hands to CRI from a NodeImage
//! (name, tag) pair. It writes `name@sha256:…` for digest entries; upstream built
//! `name:sha256:…`, which no runtime can pull (kruise issue #2534).
//!
//! Why a hand-written parser: `oci-spec`'s `distribution::Reference` (the one `oci-client`
//! re-exports) accepts references upstream rejects (`Uppercase/repo`, non-ASCII tags through
//! Rust's Unicode `\w`, upper-case digest hex, 64-hex image IDs, over-long registry+path names)
//! and splits `a_b.c/d` at an invalid host. Each would make us accept a job upstream refuses or
//! key it differently, and fixing them on top re-validates every component anyway; the grammar is
//! small enough to check by hand, without a regex or the crate's derive/serde dependency tree.

mod reference;

pub use reference::{
    DEFAULT_REGISTRY, DEFAULT_TAG, ImageRef, ImageRefError, ImageRefErrorKind, NAME_MAX_LEN,
    joined_ref, pull_ref_for,
};

#[cfg(test)]
mod tests;
