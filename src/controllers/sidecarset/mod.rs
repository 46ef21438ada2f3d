//! The SidecarSet controller: upgrades the sidecars of running pods in place, batch by batch,
//! keeps the SidecarSet's ControllerRevisions, and reports the rollout in its status.
//!
//! One reconcile of a SidecarSet:
//! 1. its pods (`pods::owns`) from the pod cache, each seen as a [`rollout::PodView`];
//! 2. its latest ControllerRevision registered ([`revisions`]);
//! 3. the next batch ([`rollout::next_batch`]) and the status ([`status::compute_status`]),
//!    written when it changed, with a `NotUpgradablePods` event when pods cannot be upgraded
//!    in place;
//! 4. the `SidecarSetUpgradable` condition of pods that cannot be upgraded, and optionally of
//!    the pods it has upgraded (`plan::pod_condition`);
//! 5. the batch upgraded: one guarded JSON patch per pod (`upgrade::upgrade_patch`), after a
//!    `pods/resize` patch where the sidecars' resources changed too (`resize`);
//! 6. revisions beyond `revisionHistoryLimit` deleted.
//!
//! Pod events wake a SidecarSet only when something that matters changed ([`pod_events`]).
//!
//! Where things live: [`watch`] wires the watches, stores and triggers into the kube-runtime
//! `Controller`; [`plan`](mod@plan) holds the pure decisions of a reconcile (plain values in,
//! plain values out); `reconcile` fetches from the stores, plans, and writes.
//!
//! **Expectations.** The pod cache lags behind our own patches; `expectations::WrittenPods`
//! keeps the pods our patches return and reads them instead of cached ones until the cache has
//! caught up, so a lagging cache never lets more than `maxUnavailable` pods be in flight.

pub mod expectations;
pub mod plan;
pub mod pod_events;
pub mod pods;
pub mod predownload;
mod reconcile;
mod resize;
pub mod revisions;
pub mod rollout;
pub mod status;
pub mod twin_flip;
pub mod upgrade;
pub mod watch;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::runtime::reflector::Store;
use tokio::sync::watch as channel;

use self::expectations::WrittenPods;
use self::revisions::RevisionsError;
use kruise_rs_api::imagepulljob::ImagePullJob;
use kruise_rs_api::sidecarset::SidecarSet;
use kruise_rs_controller::metrics::ManagerMetrics;
use kruise_rs_controller::pod_summary::{PodSummary, strip_pod};
use kruise_rs_imagepull::lean_nodeimage::LeanNodeImage;
use kruise_rs_kube::backoff::Backoff;
use kruise_rs_kube::events::Recorder;

pub use self::plan::{Plan, PreDownloadInputs, owned_pods, plan};
pub use self::watch::{run, run_with_feeds};

/// Field manager of everything this controller writes.
pub(crate) const FIELD_MANAGER: &str = "kruise-rs-sidecarset";
/// The controller's name in metrics and in [`super::CacheSync`].
pub(crate) const NAME: &str = "sidecarset";

#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error("the pod, namespace and ControllerRevision caches are not filled yet")]
    CachesNotReady,
    #[error(transparent)]
    Revisions(#[from] RevisionsError),
    #[error("writing the status of SidecarSet {name}")]
    WriteStatus {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("upgrading the sidecars of pod {pod}")]
    UpgradePod {
        pod: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing the pre-download ImagePullJob {job}")]
    Job {
        job: String,
        #[source]
        source: kube::Error,
    },
    #[error("the pre-download ImagePullJob {job} exists and belongs to something else")]
    JobTaken { job: String },
    #[error("asking the apiserver whether it serves pods/resize")]
    Discovery(#[source] kube::Error),
    #[error("writing the SidecarSetUpgradable condition of pod {pod}")]
    PodCondition {
        pod: String,
        #[source]
        source: kube::Error,
    },
}

/// What every reconcile shares.
pub(crate) struct Context {
    client: Client,
    /// Where the ControllerRevisions live.
    namespace: String,
    /// True once the pod, namespace and revision stores hold a first full list.
    caches_ready: channel::Receiver<bool>,
    pods: Store<PodSummary>,
    namespaces: Store<Namespace>,
    revisions: Store<ControllerRevision>,
    /// Whether SidecarSet image pre-download is on (`--sidecarset-predownload`); off, the
    /// jobs left from when it was on are deleted.
    predownload: bool,
    /// Whether pods upgraded in place also get upstream's `SidecarSetUpgradable=True`
    /// (`--sidecarset-upgradable-condition-on-upgrade`).
    upgradable_on_upgrade: bool,
    /// The SidecarSets' pre-download jobs.
    jobs: Store<ImagePullJob>,
    /// NodeImages, to tell when a node has pulled (status) and since when it was asked (spec).
    nodeimages: Store<LeanNodeImage>,
    /// Bad pre-download annotations already warned about (SidecarSet uid, annotation, value).
    warned: Mutex<HashSet<String>>,
    /// The SidecarSets as watched: a long batch stops when its SidecarSet changed meanwhile.
    sidecarsets: Store<SidecarSet>,
    /// Pods as our own patches returned them, until the store has caught up with them.
    written: Arc<WrittenPods>,
    backoff: Arc<Backoff>,
    recorder: Recorder,
    metrics: ManagerMetrics,
    /// Whether the apiserver serves `pods/resize`, once asked (discovery of `/api/v1`).
    resize_served: tokio::sync::OnceCell<bool>,
}

impl Context {
    /// Whether the apiserver serves the `pods/resize` subresource (Kubernetes with
    /// `InPlacePodVerticalScaling`: on by default from 1.33). Asked once; a failed answer is
    /// asked again at the next reconcile.
    async fn resize_served(&self) -> Result<bool, Error> {
        self.resize_served
            .get_or_try_init(|| async {
                let resources = self
                    .client
                    .list_core_api_resources("v1")
                    .await
                    .map_err(Error::Discovery)?;
                Ok(resources.resources.iter().any(|r| r.name == "pods/resize"))
            })
            .await
            .copied()
    }

    fn remember(&self, mut pod: PodSummary) {
        strip_pod(&mut pod);
        self.written.remember(pod, &self.pods);
    }
}
