//! The NodeImage controller: one NodeImage per Node, named after it and labelled like it; tags
//! of gone jobs and past their TTL collected; tags the node never answers marked Failed.
//!
//! # Shape
//!
//! Everything is keyed by the node name, but kube-runtime's applier drops a request for an
//! object missing from its store, and each half of the job needs a different object to exist:
//!
//! * the **Node applier** (store: Nodes) creates a missing NodeImage once its Node has been
//!   Ready for the creation delay, requeueing at exactly that instant before;
//! * the **NodeImage applier** (store: NodeImages) deletes a NodeImage whose Node is gone or
//!   going (unless labelled `apps.kruise.io/fake-nodeimage`), keeps its labels equal to the
//!   Node's, garbage-collects `spec.images` and times out unanswered tags in `status`, then
//!   requeues at the next instant any of that would change (`plan::next_wake`).
//!
//! Both decide through the same pure `plan::lifecycle` and act on their half of it.
//!
//! Three watches feed three stores, each stripped before storing (`watch`): Nodes (labels,
//! deletion, Ready condition only), NodeImages (all but managedFields; a watch and store shared
//! with the ImagePullJob controller) and ImagePullJobs (identity and spec). One router turns what
//! changed into requests:
//! a Node change wakes both appliers for its name; a NodeImage change wakes the NodeImage
//! applier, and its disappearance wakes the Node applier (to recreate it); a job deleted or
//! replaced wakes every NodeImage that has a tag owned by its uid.
//!
//! Stores may lag the apiserver by a moment, so both destructive decisions are confirmed
//! first: a NodeImage is deleted only after a GET shows its Node gone too (and with a uid
//! precondition), and an owner job counts as gone only if it is missing from the job store
//! *and* a GET says 404 or another uid. A job that cannot be checked keeps its tags.
//!
//! Shutdown ends the router, which owns the watches and the store writers: dropping them ends
//! the appliers' queues, and the appliers stop once their reconciles in flight are done. (A
//! kube-runtime `Controller` with `graceful_shutdown_on` keeps its reflector's writer alive, so
//! when told to stop before its first list completes it waits for that store forever.)
//! Reconciles wait for all three stores through `watch::Ready`, never through
//! `Store::wait_until_ready`, whose future wakes only the last of several concurrent waiters.
//!
//! # Writes (field manager `FIELD_MANAGER`)
//!
//! * create: `POST` with the Node's labels and an empty spec (409 = someone was first: fine);
//! * labels: a merge patch (`patches::labels_patch`), this controller being their only writer;
//! * `spec.images`: `update_images`, the guarded JSON
//!   patch shared with the ImagePullJob controller, so its concurrent additions survive;
//! * `status`: a guarded JSON patch on the status subresource (`patches::status_patch`), which
//!   the node daemon's concurrent writes refuse rather than lose;
//! * delete: with a uid precondition.
//!
//! A Warning event `PullImageFailed` goes to each owner of a tag marked Failed and to the
//! NodeImage (reporting controller `kruise-rs-manager`).

mod patches;
pub mod plan;
mod reconcile;
mod watch;

pub use self::watch::{run, run_with_nodeimages};

use std::time::Duration;

use kube::runtime::reflector::Store;
use kube::{Api, Client};

use crate::node_summary::NodeSummary;
use kruise_rs_api::imagepulljob::ImagePullJob;
use kruise_rs_kube::backoff::Backoff;

use crate::lean_nodeimage::LeanNodeImage;
use kruise_rs_kube::events::Recorder;

/// Field manager of every write of this controller.
pub(crate) const FIELD_MANAGER: &str = "kruise-rs-nodeimage";
/// The controller's name in metrics and in [`super::CacheSync`].
pub(crate) const NAME: &str = "nodeimage";

/// What the reconcilers share.
struct Context {
    client: Client,
    nodeimages: Api<LeanNodeImage>,
    nodes: Store<NodeSummary>,
    nodeimage_store: Store<LeanNodeImage>,
    /// Every ImagePullJob, identity and spec ([`watch::strip_job`]).
    jobs: Store<ImagePullJob>,
    /// The manager's `--default-ttlseconds-for-always-nodeimage`.
    extra_ttl: Duration,
    /// Where the jobs' pull-secret copies live (`--daemon-config-namespace`).
    daemon_config_namespace: String,
    recorder: Recorder,
    creation_delay: Duration,
    response_timeout: Duration,
    backoff: std::sync::Arc<Backoff>,
    /// The three stores' readiness.
    ready: [watch::Ready; 3],
}

impl Context {
    /// Waits until every store has been listed once: before that, absence means nothing.
    async fn stores_ready(&self) {
        for ready in &self.ready {
            ready.wait().await;
        }
    }
}
