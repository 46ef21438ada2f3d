//! The manager's own metrics, under `kruise_rs_manager_`: reconciles, admissions, SidecarSet
//! pods, ImagePullJob nodes, leadership. [`kruise_rs_kube::metrics::Metrics`] serves them.
//!
//! With `--metrics-compat=upstream` ([`ManagerMetrics::with_upstream_names`]) the reconciles
//! and the leadership are also served under upstream kruise-manager's names: controller-runtime's
//! `controller_runtime_reconcile_total` (results `success` and `error`),
//! `controller_runtime_reconcile_errors_total`, `controller_runtime_reconcile_time_seconds`
//! (controller-runtime's buckets), `controller_runtime_max_concurrent_reconciles`,
//! `controller_runtime_active_workers`, each with upstream's controller names
//! (`sidecarset-controller`, ...), and `kruise_manager_is_leader`. Not served: workqueue
//! metrics (kube-runtime's scheduler has no work queue to measure), controller-runtime's webhook
//! metrics, Go runtime and process metrics.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

/// The controllers whose reconciles [`ManagerMetrics`] counts.
pub use crate::CONTROLLERS;

/// The resource kinds the admission webhooks serve.
pub const ADMISSION_KINDS: [&str; 5] = [
    "pods",
    "sidecarsets",
    "imagepulljobs",
    "imagelistpulljobs",
    "nodeimages",
];

/// The states of a SidecarSet's pods, as its status counts them.
pub(crate) const SIDECARSET_POD_STATES: [&str; 4] =
    ["matched", "updated", "ready", "updated_ready"];

/// The states of an ImagePullJob's nodes, as its status counts them.
pub(crate) const IMAGEPULLJOB_NODE_STATES: [&str; 4] = ["desired", "active", "succeeded", "failed"];

type Labels = Vec<(&'static str, &'static str)>;
type SidecarSetLabels = Vec<(&'static str, String)>;
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

fn reconcile_histogram() -> Histogram {
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    ])
}

/// controller-runtime's `controller_runtime_reconcile_time_seconds` buckets (v0.20).
fn upstream_reconcile_histogram() -> Histogram {
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8,
        0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0,
        15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0,
    ])
}

/// Upstream kruise-manager's name of the controller kruise-rs calls `controller`.
fn upstream_controller(controller: &str) -> &'static str {
    match controller {
        crate::names::SIDECARSET => "sidecarset-controller",
        crate::names::IMAGEPULLJOB => "imagepulljob-controller",
        crate::names::IMAGELISTPULLJOB => "imagelistpulljob-controller",
        crate::names::NODEIMAGE => "nodeimage-controller",
        _ => "unknown-controller",
    }
}

/// The reconciles and the leadership under upstream kruise-manager's names (see the module).
#[derive(Clone, Debug)]
struct UpstreamNames {
    reconciles: Family<Labels, Counter>,
    reconcile_errors: Family<Labels, Counter>,
    reconcile_seconds: HistogramFamily,
    max_concurrent_reconciles: Family<Labels, Gauge>,
    active_workers: Family<Labels, Gauge>,
    is_leader: Gauge,
}

impl UpstreamNames {
    fn new() -> Self {
        let names = Self {
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_seconds: Family::new_with_constructor(upstream_reconcile_histogram),
            max_concurrent_reconciles: Family::default(),
            active_workers: Family::default(),
            is_leader: Gauge::default(),
        };
        for controller in CONTROLLERS.map(upstream_controller) {
            let by_controller = vec![("controller", controller)];
            let _ = names.reconcile_errors.get_or_create(&by_controller);
            let _ = names.reconcile_seconds.get_or_create(&by_controller);
            let _ = names
                .max_concurrent_reconciles
                .get_or_create(&by_controller);
            let _ = names.active_workers.get_or_create(&by_controller);
            for result in ["success", "error"] {
                let _ = names
                    .reconciles
                    .get_or_create(&vec![("controller", controller), ("result", result)]);
            }
        }
        names
    }

    fn register(&self, registry: &mut Registry) {
        registry.register(
            "controller_runtime_reconcile",
            "Total number of reconciliations per controller",
            self.reconciles.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_errors",
            "Total number of reconciliation errors per controller",
            self.reconcile_errors.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            self.reconcile_seconds.clone(),
        );
        registry.register(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            self.max_concurrent_reconciles.clone(),
        );
        registry.register(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            self.active_workers.clone(),
        );
        registry.register(
            "kruise_manager_is_leader",
            "Gauge the leader of kruise-manager",
            self.is_leader.clone(),
        );
    }

    fn reconciled(&self, controller: &str, ok: bool, seconds: f64) {
        let controller = upstream_controller(controller);
        let result = if ok { "success" } else { "error" };
        self.reconciles
            .get_or_create(&vec![("controller", controller), ("result", result)])
            .inc();
        if !ok {
            self.reconcile_errors
                .get_or_create(&vec![("controller", controller)])
                .inc();
        }
        self.reconcile_seconds
            .get_or_create(&vec![("controller", controller)])
            .observe(seconds);
    }

    /// One more reconcile of `controller` running until the guard drops.
    fn active(&self, controller: &str) -> ActiveWorker {
        let gauge = self
            .active_workers
            .get_or_create(&vec![("controller", upstream_controller(controller))])
            .clone();
        gauge.inc();
        ActiveWorker(gauge)
    }
}

/// Counts a running reconcile in `controller_runtime_active_workers` until dropped (a reconcile
/// cancelled at shutdown included).
struct ActiveWorker(Gauge);

impl Drop for ActiveWorker {
    fn drop(&mut self) {
        self.0.dec();
    }
}

fn admission_histogram() -> Histogram {
    Histogram::new([
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ])
}

/// The manager's own metrics, under `kruise_rs_manager_`. Every label takes values from a fixed
/// list, except `sidecarset`, which names the user's SidecarSets (series of deleted ones are
/// removed, see [`ManagerMetrics::retain_sidecarsets`]).
///
/// Cheap to clone: every field shares its value. The manager hands them to its controllers in
/// `ControllerOptions::metrics`.
#[derive(Clone, Debug)]
pub struct ManagerMetrics {
    /// Finished reconciles by `controller` and `result` (`ok`, `error`).
    reconciles: Family<Labels, Counter>,
    /// Reconcile durations by `controller`.
    reconcile_seconds: HistogramFamily,
    /// Admission reviews answered, by `kind` and `verdict` (`allowed`, `patched`, `denied`).
    admissions: Family<Labels, Counter>,
    /// Time to decide an admission review, by `kind`.
    admission_seconds: HistogramFamily,
    /// Pods of each SidecarSet by `state`, from the status its last reconcile computed.
    sidecarset_pods: Family<SidecarSetLabels, Gauge>,
    /// The SidecarSets `sidecarset_pods` has series for.
    sidecarsets: Arc<Mutex<BTreeSet<String>>>,
    /// Nodes of all ImagePullJobs by `state`, summed over the jobs' statuses.
    imagepulljob_nodes: Family<Labels, Gauge>,
    /// 1 while this replica runs the controllers: it holds the leader Lease, or leader election
    /// is off.
    leader: Gauge,
    /// The same under upstream's names, with `--metrics-compat=upstream`.
    upstream: Option<UpstreamNames>,
}

impl ManagerMetrics {
    pub fn new() -> Self {
        let metrics = Self {
            reconciles: Family::default(),
            reconcile_seconds: Family::new_with_constructor(reconcile_histogram),
            admissions: Family::default(),
            admission_seconds: Family::new_with_constructor(admission_histogram),
            sidecarset_pods: Family::default(),
            sidecarsets: Arc::default(),
            imagepulljob_nodes: Family::default(),
            leader: Gauge::default(),
            upstream: None,
        };
        // Every fixed series from the start, at zero: rates and alerts need no "absent" case.
        for controller in CONTROLLERS {
            let _ = metrics
                .reconcile_seconds
                .get_or_create(&vec![("controller", controller)]);
            for result in ["ok", "error"] {
                let _ = metrics
                    .reconciles
                    .get_or_create(&vec![("controller", controller), ("result", result)]);
            }
        }
        for state in IMAGEPULLJOB_NODE_STATES {
            let _ = metrics
                .imagepulljob_nodes
                .get_or_create(&vec![("state", state)]);
        }
        for kind in ADMISSION_KINDS {
            let _ = metrics
                .admission_seconds
                .get_or_create(&vec![("kind", kind)]);
            for verdict in ["allowed", "patched", "denied", "abandoned"] {
                let _ = metrics
                    .admissions
                    .get_or_create(&vec![("kind", kind), ("verdict", verdict)]);
            }
        }
        metrics
    }

    /// [`Self::new`], also counting under upstream kruise-manager's names
    /// (`--metrics-compat=upstream`): register those with [`Self::register_upstream_names`].
    pub fn with_upstream_names() -> Self {
        Self {
            upstream: Some(UpstreamNames::new()),
            ..Self::new()
        }
    }

    /// Registers upstream's names (if counted) in `registry`, which must have no prefix.
    pub fn register_upstream_names(&self, registry: &mut Registry) {
        if let Some(upstream) = &self.upstream {
            upstream.register(registry);
        }
    }

    /// Whether upstream's names are counted too.
    pub fn counts_upstream_names(&self) -> bool {
        self.upstream.is_some()
    }

    /// Sets upstream's `controller_runtime_max_concurrent_reconciles` of `controller`.
    pub fn set_workers(&self, controller: &'static str, workers: u16) {
        if let Some(upstream) = &self.upstream {
            upstream
                .max_concurrent_reconciles
                .get_or_create(&vec![("controller", upstream_controller(controller))])
                .set(i64::from(workers));
        }
    }

    /// Registers every metric under `manager_` in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        let manager = registry.sub_registry_with_prefix("manager");
        manager.register(
            "reconciles",
            "Finished reconciles by controller and result",
            self.reconciles.clone(),
        );
        manager.register(
            "reconcile_seconds",
            "Duration of reconciles by controller",
            self.reconcile_seconds.clone(),
        );
        manager.register(
            "admissions",
            "Admission reviews answered by resource kind and verdict",
            self.admissions.clone(),
        );
        manager.register(
            "admission_seconds",
            "Time to decide an admission review, by resource kind",
            self.admission_seconds.clone(),
        );
        manager.register(
            "sidecarset_pods",
            "Pods of a SidecarSet by state (matched, updated, ready, updated_ready), from its \
             status",
            self.sidecarset_pods.clone(),
        );
        manager.register(
            "imagepulljob_nodes",
            "Nodes of all ImagePullJobs by state (desired, active, succeeded, failed), summed \
             over the jobs' statuses",
            self.imagepulljob_nodes.clone(),
        );
        manager.register(
            "leader",
            "1 while this replica runs the controllers (it holds the leader Lease, or leader \
             election is off), 0 otherwise",
            self.leader.clone(),
        );
    }

    /// Counts one reconcile of `controller` and its duration.
    pub fn reconciled(&self, controller: &'static str, ok: bool, seconds: f64) {
        let result = if ok { "ok" } else { "error" };
        self.reconciles
            .get_or_create(&vec![("controller", controller), ("result", result)])
            .inc();
        self.reconcile_seconds
            .get_or_create(&vec![("controller", controller)])
            .observe(seconds);
        if let Some(upstream) = &self.upstream {
            upstream.reconciled(controller, ok, seconds);
        }
    }

    /// Runs the reconcile `fut` of `controller`, recording its result and duration.
    pub fn timed<F, T, E>(
        &self,
        controller: &'static str,
        fut: F,
    ) -> impl Future<Output = Result<T, E>> + use<F, T, E>
    where
        F: Future<Output = Result<T, E>>,
    {
        let metrics = self.clone();
        async move {
            let _active = metrics.upstream.as_ref().map(|u| u.active(controller));
            let start = Instant::now();
            let result = fut.await;
            metrics.reconciled(controller, result.is_ok(), start.elapsed().as_secs_f64());
            result
        }
    }

    /// Counts one admission review of `kind` answered with `verdict`, decided in `seconds`.
    pub fn admitted(&self, kind: &'static str, verdict: &'static str, seconds: f64) {
        self.admissions
            .get_or_create(&vec![("kind", kind), ("verdict", verdict)])
            .inc();
        self.admission_seconds
            .get_or_create(&vec![("kind", kind)])
            .observe(seconds);
    }

    /// Sets the pod gauges of SidecarSet `name`, in the order of `SIDECARSET_POD_STATES`.
    pub fn set_sidecarset_pods(&self, name: &str, counts: [i32; 4]) {
        let mut known = self.sidecarsets.lock().unwrap_or_else(|e| e.into_inner());
        known.insert(name.to_owned());
        for (state, count) in SIDECARSET_POD_STATES.into_iter().zip(counts) {
            self.sidecarset_pods
                .get_or_create(&vec![
                    ("sidecarset", name.to_owned()),
                    ("state", state.into()),
                ])
                .set(i64::from(count));
        }
    }

    /// Removes the series of the SidecarSets for which `keep` is false (deleted ones).
    pub fn retain_sidecarsets(&self, mut keep: impl FnMut(&str) -> bool) {
        let mut known = self.sidecarsets.lock().unwrap_or_else(|e| e.into_inner());
        known.retain(|name| {
            if keep(name) {
                return true;
            }
            for state in SIDECARSET_POD_STATES {
                self.sidecarset_pods
                    .remove(&vec![("sidecarset", name.clone()), ("state", state.into())]);
            }
            false
        });
    }

    /// Sets the ImagePullJob node gauges, in the order of `IMAGEPULLJOB_NODE_STATES`.
    pub fn set_imagepulljob_nodes(&self, counts: [i64; 4]) {
        for (state, count) in IMAGEPULLJOB_NODE_STATES.into_iter().zip(counts) {
            self.imagepulljob_nodes
                .get_or_create(&vec![("state", state)])
                .set(count);
        }
    }

    /// Sets the leader gauge: whether this replica runs the controllers.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
        if let Some(upstream) = &self.upstream {
            upstream.is_leader.set(i64::from(leading));
        }
    }

    /// Forgets what the controllers reported about the objects (SidecarSet series removed,
    /// ImagePullJob nodes back to 0): a replica that stopped leading no longer watches them, so
    /// it reports nothing stale. The next leader's controllers report them afresh.
    pub fn forget_objects(&self) {
        self.retain_sidecarsets(|_| false);
        self.set_imagepulljob_nodes([0; 4]);
    }
}

impl Default for ManagerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests;
