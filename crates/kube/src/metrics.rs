//! Prometheus metrics of one component (manager or daemon), served on `/metrics` in the
//! Prometheus text format.
//!
//! Counters are registered without a `_total` suffix: prometheus-client adds it when encoding and
//! panics in debug builds when the registered name already ends with it.

use std::fmt;

use prometheus_client::{
    encoding::prometheus_text,
    metrics::{gauge::Gauge, info::Info},
    registry::Registry,
};

/// The `Content-Type` of what [`Metrics::encode`] returns.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Every metric a component exports, in one registry prefixed `kruise_rs_`, and optionally
/// another one without the prefix (the names upstream OpenKruise serves).
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    unprefixed: Option<Registry>,
    ready: Gauge,
}

impl Metrics {
    /// Build info and readiness only.
    pub fn new() -> Self {
        Self::with(|_| {})
    }

    /// Build info, readiness, and what `register` adds (each component under its own prefix,
    /// e.g. `registry.sub_registry_with_prefix("daemon")`).
    pub fn with(register: impl FnOnce(&mut Registry)) -> Self {
        Self::with_unprefixed(register, None::<fn(&mut Registry)>)
    }

    /// [`Self::with`], plus what `unprefixed` registers under its own names, served after ours.
    pub fn with_unprefixed(
        register: impl FnOnce(&mut Registry),
        unprefixed: Option<impl FnOnce(&mut Registry)>,
    ) -> Self {
        let unprefixed = unprefixed.map(|register| {
            let mut registry = Registry::default();
            register(&mut registry);
            registry
        });
        let mut registry = Registry::with_prefix("kruise_rs");
        registry.register(
            "build",
            "Build information of the running kruise-rs",
            Info::new([("version", env!("CARGO_PKG_VERSION"))]),
        );
        let ready = Gauge::default();
        registry.register(
            "ready",
            "1 while the component is ready (/readyz answers 200), 0 otherwise",
            ready.clone(),
        );
        register(&mut registry);
        Self {
            registry,
            unprefixed,
            ready,
        }
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }

    /// The current values in the Prometheus text exposition format (version 0.0.4).
    pub fn encode(&self) -> Result<String, fmt::Error> {
        let mut out = String::new();
        prometheus_text::encode(&mut out, &self.registry)?;
        if let Some(unprefixed) = &self.unprefixed {
            prometheus_text::encode(&mut out, unprefixed)?;
        }
        Ok(out)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests;
