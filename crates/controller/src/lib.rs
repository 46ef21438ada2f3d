//! What every controller of the manager shares: the options they run with, their metrics, the
//! pod watch and the compact summaries its store keeps, how watches list, how a controller
//! stops, and what becomes of objects that cannot be read. Nothing here knows one kind's rules:
//! those are in `kruise-rs-imagepull` (NodeImage, ImagePullJob, ImageListPullJob) and in the
//! manager (SidecarSet).

pub mod compact;
pub mod initial_list;
pub mod interned;
pub mod interned_labels;
pub mod metrics;
pub mod pod_feed;
pub mod pod_summary;
pub mod shared_owner;
pub mod shared_value;
pub mod shutdown;
pub mod unreadable;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::watcher;
use tokio::sync::watch;

pub use self::initial_list::InitialList;
use self::metrics::ManagerMetrics;

/// The manager's controllers, by the names their metrics, logs and readiness use.
pub mod names {
    pub const NODEIMAGE: &str = "nodeimage";
    pub const IMAGEPULLJOB: &str = "imagepulljob";
    pub const IMAGELISTPULLJOB: &str = "imagelistpulljob";
    pub const SIDECARSET: &str = "sidecarset";
}

/// Every controller [`CacheSync`] waits for.
pub const CONTROLLERS: [&str; 4] = [
    names::NODEIMAGE,
    names::IMAGEPULLJOB,
    names::IMAGELISTPULLJOB,
    names::SIDECARSET,
];

/// Settings shared by the controllers, from the command line.
#[derive(Clone, Debug)]
pub struct ControllerOptions {
    /// How long a Node must have been Ready before its NodeImage is created.
    pub nodeimage_creation_delay: Duration,
    /// How long a node may leave a requested tag unanswered before the tag is marked Failed.
    pub nodeimage_response_timeout: Duration,
    /// Extra lifetime of an `Always` job's tags on a node after they finish.
    pub default_ttl_for_always_nodeimage: Duration,
    /// Namespace the node daemons may read pull secrets from; job secrets are copied there.
    pub daemon_config_namespace: String,
    /// The manager's namespace: SidecarSet ControllerRevisions live there (SidecarSets are
    /// cluster-scoped).
    pub namespace: String,
    /// Manage only the Nodes, NodeImages, ImagePullJobs and SidecarSets carrying these labels (a label
    /// selector as `kubectl -l` takes it); `None`: all. For sharding, and for test clusters
    /// where other tests' objects must be left alone.
    pub label_selector: Option<String>,
    /// The most nodes pulling from one registry host at once, across every ImagePullJob
    /// (`--max-pulls-per-registry`, 0: no limit); a job's annotation
    /// `kruise-rs.io/max-pulls-per-registry` lowers it for its own starts.
    pub max_pulls_per_registry: usize,
    /// Pre-download new SidecarSet sidecar images on the nodes of the pods to upgrade, and hold
    /// each pod until its node has pulled (`--sidecarset-predownload`, default on; upstream has
    /// no such feature). Off: SidecarSets roll out as upstream's do.
    pub sidecarset_predownload: bool,
    /// Also write upstream's pod condition `SidecarSetUpgradable=True` on every pod a
    /// SidecarSet upgrades in place (`--sidecarset-upgradable-condition-on-upgrade`, default
    /// off: one more pod status write per upgraded pod). Off, the condition is written only on
    /// pods some SidecarSet cannot upgrade.
    pub sidecarset_upgradable_condition_on_upgrade: bool,
    /// Where the controllers count their reconciles and report progress; the manager passes
    /// the set its `/metrics` serves (the default is a set nobody reads).
    pub metrics: ManagerMetrics,
    /// The manager's `/metrics` also serves the reconciles and leadership under upstream
    /// kruise-manager's names (`--metrics-compat=upstream`, [`ManagerMetrics::with_upstream_names`]).
    pub upstream_metric_names: bool,
    /// How every watch lists first: streaming where the server serves it (the manager asks
    /// once at start), else list then watch (the default: every server serves it).
    pub initial_list: InitialList,
    /// Where each controller reports that its caches hold a first full list.
    pub synced: CacheSync,
    /// How many reconciles each controller runs at once.
    pub workers: Workers,
}

/// How many reconciles each controller runs at once (`--sidecarset-workers` and the like,
/// upstream's flag names). A reconcile here is a task, not a thread: most of its time it waits
/// on the apiserver, so the bound is on work in flight (memory, requests queued behind the
/// client's rate limit), not on cores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workers {
    pub sidecarset: u16,
    pub imagepulljob: u16,
    pub imagelistpulljob: u16,
    /// For Nodes, and as many again for NodeImages (the controller has a queue for each).
    pub nodeimage: u16,
}

impl Default for Workers {
    /// Upstream's 3, except NodeImages: a fan-out to 5,000 nodes is 5,000 small reconciles of
    /// one write each, which 3 at a time would serialise behind the apiserver's round trip.
    fn default() -> Self {
        Self {
            sidecarset: 3,
            imagepulljob: 3,
            imagelistpulljob: 3,
            nodeimage: 16,
        }
    }
}

/// Which controllers have filled their caches; the manager's `/readyz` waits for all of
/// [`CONTROLLERS`] on the replica that runs them. Clones share the set.
#[derive(Clone, Debug)]
pub struct CacheSync(Arc<watch::Sender<BTreeSet<&'static str>>>);

impl Default for CacheSync {
    fn default() -> Self {
        Self(Arc::new(watch::channel(BTreeSet::new()).0))
    }
}

impl CacheSync {
    /// Records that `controller`'s caches have listed once.
    pub fn mark(&self, controller: &'static str) {
        self.0.send_modify(|synced| {
            synced.insert(controller);
        });
    }

    /// Whether every one of [`CONTROLLERS`] has reported.
    pub fn all_synced(&self) -> bool {
        let synced = self.0.borrow();
        CONTROLLERS.iter().all(|name| synced.contains(name))
    }

    /// Resolves once every one of [`CONTROLLERS`] has reported.
    pub async fn wait_all(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx
            .wait_for(|synced| CONTROLLERS.iter().all(|name| synced.contains(name)))
            .await;
    }
}

impl ControllerOptions {
    /// A watcher configuration that lists as [`Self::initial_list`] says, with no selector.
    pub fn watch_config(&self) -> watcher::Config {
        self.initial_list.config()
    }

    /// [`Self::watch_config`] confined to [`Self::label_selector`], when there is one.
    pub fn scoped_watch_config(&self) -> watcher::Config {
        match &self.label_selector {
            Some(selector) => self.watch_config().labels(selector),
            None => self.watch_config(),
        }
    }
}

impl Default for ControllerOptions {
    /// Upstream's defaults, and SidecarSet pre-download on.
    fn default() -> Self {
        Self {
            nodeimage_creation_delay: Duration::from_secs(30),
            nodeimage_response_timeout: Duration::from_secs(600),
            default_ttl_for_always_nodeimage: Duration::from_secs(300),
            daemon_config_namespace: "kruise-daemon-config".to_owned(),
            namespace: "kruise-system".to_owned(),
            label_selector: None,
            max_pulls_per_registry: 0,
            sidecarset_predownload: true,
            sidecarset_upgradable_condition_on_upgrade: false,
            metrics: ManagerMetrics::new(),
            upstream_metric_names: false,
            initial_list: InitialList::default(),
            synced: CacheSync::default(),
            workers: Workers::default(),
        }
    }
}
