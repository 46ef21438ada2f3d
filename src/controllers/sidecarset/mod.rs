//! The SidecarSet controller: upgrades the sidecars of running pods in place, batch by batch,
//! and reports the rollout in the SidecarSet's status.
//!
//! For now only its pure decisions exist; the reconciler (matching pods, ControllerRevisions,
//! the image-only pod patch, pod conditions, events) will call them:
//!
//! - [`strategy`]: which pods to upgrade next ([`strategy::next_batch`]) under partition,
//!   maxUnavailable, the update selector, priority, scatter, pause and `NotUpdate`; also the
//!   order in which the rollout will reach the remaining pods (the pre-download targets).
//! - [`status`]: the counts in `status` and why a rollout cannot move
//!   ([`status::compute_status`]).
//!
//! Both read pods through [`strategy::PodView`], a plain summary the reconciler fills from each
//! matched pod, so the decisions carry no Kubernetes client types and are tested densely.

pub mod pod_events;
pub mod pods;
pub mod revisions;
pub mod status;
pub mod strategy;
pub mod upgrade;
