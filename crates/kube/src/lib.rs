//! What the manager and the node daemon both need to talk to Kubernetes and to be run as a
//! process: the client and its rate limit, start-up retries and per-object backoff, Events, the
//! `/healthz` `/readyz` `/metrics` server, and the command-line pieces both binaries share.
//!
//! Nothing here knows a kruise kind: those are in `kruise-rs-api`.

pub mod backoff;
pub mod cli;
mod client;
pub mod error_chain;
pub mod events;
pub mod metrics;
mod probe_server;
mod rate_limit;
mod transient;

pub use self::client::{ConnectError, client, connect, load_config};
pub use self::metrics::{CONTENT_TYPE, Metrics};
pub use self::probe_server::{LivenessCheck, ProbeState, router, serve};
pub use self::rate_limit::{LimitWaits, RateLimit, TokenBucket};
pub use self::transient::{START_UP_PATIENCE, is_transient, retry_transient, retry_while};
