//! The ImageListPullJob controller: one ImagePullJob per listed image, each the image plus the
//! list's template, and the list's status summed from them.
//!
//! - [`plan`]: the decisions, from plain values (what to create, delete and relabel; the status);
//! - `reconcile.rs`: fetch, plan, write (children in slow-start batches, labels, status, TTL);
//! - `watch.rs`: the list watch and the ImagePullJob watch, which wakes a child's list.
//!
//! Children are found in the ImagePullJob store by their controller ownerReference. The store can
//! lag behind our own creates and deletes; until it catches up they are overlaid on it
//! (`Context::family`), so a reconcile never creates a second child for an image, nor counts a
//! child it just deleted.
pub mod plan;
