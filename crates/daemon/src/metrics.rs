//! The daemon's own metrics, under `kruise_rs_daemon_` next to the build info and readiness.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, &'static str)>;

/// Cheap to clone: every field shares its value.
#[derive(Clone, Debug)]
pub(crate) struct DaemonMetrics {
    /// Finished pulls by `result` (`succeeded`, `failed`).
    pub pulls: Family<Labels, Counter>,
    /// Seconds from a pull's start (after waiting for a slot) to its end.
    pub pull_seconds: Histogram,
    /// Workers waiting for or holding a pull slot.
    pub active_workers: Gauge,
    /// Status writes by `result` (`written`, `conflict`, `error`).
    pub status_writes: Family<Labels, Counter>,
    /// 1 while the CRI image service answers.
    pub runtime_up: Gauge,
}

impl DaemonMetrics {
    pub(crate) fn new() -> Self {
        Self {
            pulls: Family::default(),
            pull_seconds: Histogram::new([
                0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
            ]),
            active_workers: Gauge::default(),
            status_writes: Family::default(),
            runtime_up: Gauge::default(),
        }
    }

    /// Registers every metric under `daemon_` in `registry`.
    pub(crate) fn register(&self, registry: &mut Registry) {
        let daemon = registry.sub_registry_with_prefix("daemon");
        daemon.register(
            "pulls",
            "Finished image pulls by result",
            self.pulls.clone(),
        );
        daemon.register(
            "pull_seconds",
            "Duration of image pulls, from start to success or final failure",
            self.pull_seconds.clone(),
        );
        daemon.register(
            "active_workers",
            "Pull workers not finished yet (waiting for a slot or pulling)",
            self.active_workers.clone(),
        );
        daemon.register(
            "status_writes",
            "NodeImage status writes by result",
            self.status_writes.clone(),
        );
        daemon.register(
            "runtime_up",
            "1 while the CRI image service answers, 0 otherwise",
            self.runtime_up.clone(),
        );
    }

    pub(crate) fn pull_finished(&self, succeeded: bool, seconds: f64) {
        let result = if succeeded { "succeeded" } else { "failed" };
        self.pulls.get_or_create(&vec![("result", result)]).inc();
        self.pull_seconds.observe(seconds);
    }

    pub(crate) fn status_write(&self, result: &'static str) {
        self.status_writes
            .get_or_create(&vec![("result", result)])
            .inc();
    }
}

impl Default for DaemonMetrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kruise_rs_kube::Metrics;

    #[test]
    fn daemon_metrics_are_exposed_with_their_prefix() {
        let daemon = DaemonMetrics::new();
        let metrics = Metrics::with(|registry| daemon.register(registry));
        daemon.pull_finished(true, 0.3);
        daemon.status_write("conflict");
        daemon.runtime_up.set(1);
        let text = metrics.encode().unwrap();
        assert!(
            text.contains("kruise_rs_daemon_pulls_total{result=\"succeeded\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("kruise_rs_daemon_status_writes_total{result=\"conflict\"} 1"),
            "{text}"
        );
        assert!(text.contains("kruise_rs_daemon_runtime_up 1"), "{text}");
        assert!(
            text.contains("kruise_rs_daemon_pull_seconds_count 1"),
            "{text}"
        );
    }
}
