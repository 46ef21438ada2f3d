//! What the manager and the daemon both serve over plain HTTP: `/healthz`, `/readyz` and
//! `/metrics`, the Kubernetes client they both connect with, and how the process's allocator is
//! set up.

pub mod allocator;
mod client;
mod metrics;
pub mod rate_limit;
mod server;
mod transient;

pub use self::client::{ConnectError, client, connect, load_config};
pub use self::metrics::{ADMISSION_KINDS, CONTENT_TYPE, ManagerMetrics, Metrics};
pub use self::rate_limit::{LimitWaits, RateLimit};
pub use self::server::{LivenessCheck, ProbeState, router, serve};
pub use self::transient::{START_UP_PATIENCE, is_transient, retry_transient, retry_while};
