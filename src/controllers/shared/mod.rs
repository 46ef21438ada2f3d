//! What more than one controller uses: the shared pod watch and the summaries it stores, the
//! guarded NodeImage `spec.images` write, the watch configuration and the retry backoff.
//!
//! Nothing here reaches into a per-kind module; the per-kind modules reach in here.

pub mod initial_list;
pub mod interned_labels;
pub mod lean_nodeimage;
pub mod node_summary;
pub mod nodeimage_images;
pub mod pod_feed;
pub mod pod_summary;
pub mod shutdown;
pub mod tag_values;
pub mod unreadable;
