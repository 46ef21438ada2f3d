//! Image pulling on the manager's side: the NodeImage, ImagePullJob and ImageListPullJob
//! controllers, and what they share: the compact NodeImage store, the Node summary, a tag's
//! values from its current owners, and the one guarded write of a NodeImage's `spec.images`.
//! The node daemon (`kruise-rs-daemon`) pulls what these write.
//!
//! Following an ImagePullJob to the daemon: `imagepulljob::watch` (what wakes it) →
//! `imagepulljob::reconcile` → `imagepulljob::plan` and `targets` (which nodes, in which order)
//! → `imagepulljob::entry` (the job's entry in a node's NodeImage) → `tag_values` (the tag's
//! values from all its owners) → `nodeimage_write` (the guarded JSON Patch).

pub mod compact_nodeimage;
pub mod imagelistpulljob;
pub mod imagepulljob;
pub mod lean_nodeimage;
mod node_summary;
pub mod nodeimage;
mod nodeimage_write;
mod pace;
mod tag_values;
