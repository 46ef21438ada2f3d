//! Leader election over a `coordination.k8s.io/v1` Lease, so that of several manager replicas
//! only one reconciles and writes.
//!
//! Every replica serves the webhooks and the probes; only the holder of the Lease runs the
//! controllers (`run_while_leading`). The protocol:
//!
//! * **Acquire.** A replica that does not lead reads the Lease about every retry period
//!   (jittered, so that followers do not poll in step; creating it if it is missing). When
//!   nobody holds it, or the record has not changed for `leaseDurationSeconds` since this
//!   replica first saw it as it is (`observe`, [`decide`]), the replica writes itself in as
//!   holder (new `acquireTime` and `renewTime`, `leaseTransitions` + 1). The write carries the
//!   `resourceVersion` it read, so of two replicas racing for it the apiserver lets one win and
//!   answers the other 409 Conflict.
//! * **Renew.** The holder rewrites `renewTime` every retry period. If it finds another holder,
//!   or cannot renew within the renew deadline (shorter than the lease duration, so it gives up
//!   before anyone else may take over), it has lost: its controllers are dropped at once, in
//!   the middle of whatever they were doing, and it goes back to acquiring.
//! * **Release.** On a clean shutdown the leader stops its controllers first, then clears
//!   `holderIdentity`, so that another replica takes over at its next retry instead of waiting
//!   for the lease to expire.
//!
//! Expiry is measured on this replica's own monotonic clock, from when it saw the record last
//! change (as client-go does), never by comparing the holder's `renewTime` with this replica's
//! wall clock: replicas whose clocks disagree still never take a Lease that is being renewed
//! (decision 0020). The price: a replica that has just started waits a whole lease duration
//! before it takes a Lease whose holder is gone without releasing it.

use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::pin::pin;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use kruise_rs_kube::backoff::jittered;

/// Default name of the Lease.
pub const DEFAULT_LEASE_NAME: &str = "kruise-rs-manager";

/// How much a follower stretches its retry period, at random, so that followers started
/// together do not read the Lease in step. client-go stretches by up to 1.2×; half keeps a
/// takeover, which waits for up to two reads besides the lease duration, closer to it. The
/// leader renews on the period itself.
const FOLLOWER_JITTER: f64 = 0.5;

/// How one replica takes part in the election.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderElection {
    /// Name of the Lease.
    pub lease_name: String,
    /// Namespace of the Lease (the manager's namespace).
    pub namespace: String,
    /// This replica's name in `holderIdentity`; unique among the replicas.
    pub identity: String,
    /// How long a Lease that is not renewed stays with its holder.
    pub lease_duration: Duration,
    /// How long the leader keeps leading while it fails to renew; less than `lease_duration`.
    pub renew_deadline: Duration,
    /// How often the leader renews, and how often the others try to acquire.
    pub retry_period: Duration,
    /// Whether a replica that does not lead keeps the pod and NodeImage watches running, so
    /// that it takes over without listing them first (decision 0043). Default true.
    pub warm_standby: bool,
}

impl LeaderElection {
    /// Upstream's defaults: Lease `kruise-rs-manager`, 15 s lease, 10 s renew deadline, 2 s
    /// retry period, identity from `default_identity`; a warm standby.
    pub fn new(namespace: impl Into<String>) -> Self {
        Self {
            lease_name: DEFAULT_LEASE_NAME.to_owned(),
            namespace: namespace.into(),
            identity: default_identity(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            warm_standby: true,
        }
    }

    /// Why these settings cannot work, if they cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.identity.is_empty() {
            return Err("the leader-election identity is empty".to_owned());
        }
        if self.retry_period.is_zero() {
            return Err("the leader-election retry period must be positive".to_owned());
        }
        if self.renew_deadline <= self.retry_period {
            return Err(format!(
                "the leader-election renew deadline ({:?}) must be longer than the retry period \
                 ({:?})",
                self.renew_deadline, self.retry_period
            ));
        }
        if self.lease_duration <= self.renew_deadline {
            return Err(format!(
                "the leader-election lease duration ({:?}) must be longer than the renew \
                 deadline ({:?})",
                self.lease_duration, self.renew_deadline
            ));
        }
        Ok(())
    }

    /// `leaseDurationSeconds`: whole seconds, rounded up, at least 1.
    fn lease_duration_seconds(&self) -> i32 {
        let secs =
            self.lease_duration.as_secs() + u64::from(self.lease_duration.subsec_nanos() > 0);
        i32::try_from(secs.max(1)).unwrap_or(i32::MAX)
    }
}

/// `POD_NAME` when set (the downward API's `metadata.name`), else the host name with a random
/// suffix, so that two processes on one host are different candidates.
pub(crate) fn default_identity() -> String {
    if let Some(name) = std::env::var("POD_NAME").ok().filter(|n| !n.is_empty()) {
        return name;
    }
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "kruise-rs".to_owned());
    let suffix = RandomState::new().hash_one(std::process::id()) & 0xff_ffff;
    format!("{host}_{suffix:06x}")
}

/// What a replica does with the Lease as it finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nobody holds it, or its holder let it expire: take it.
    Acquire,
    /// This replica holds it: renew it.
    Renew,
    /// `holder` holds it until `expires`, on this replica's clock (unless it renews it first).
    Wait { holder: String, expires: Instant },
}

/// The Lease as this replica last read it, and when it first read it so, on its own clock.
#[derive(Clone, Debug, PartialEq)]
pub struct Observed {
    spec: LeaseSpec,
    since: Instant,
}

/// `last` brought up to date with `spec`, read at `now`: any change of the record (a renewal,
/// a new holder, a transition) starts a new observation; the same record keeps the old one.
pub(crate) fn observe(last: Option<Observed>, spec: &LeaseSpec, now: Instant) -> Observed {
    match last {
        Some(last) if last.spec == *spec => last,
        _ => Observed {
            spec: spec.clone(),
            since: now,
        },
    }
}

/// The pure core of the protocol: what `me` does at `now` with the Lease it has `observed`.
///
/// A holder's Lease expires `leaseDurationSeconds` after this replica saw its record last
/// change; the times written in it are the holder's clock and are not compared with ours.
pub fn decide(observed: &Observed, me: &str, now: Instant) -> Decision {
    let lease = &observed.spec;
    let Some(holder) = lease.holder_identity.as_deref().filter(|h| !h.is_empty()) else {
        return Decision::Acquire;
    };
    if holder == me {
        return Decision::Renew;
    }
    let seconds = lease.lease_duration_seconds.unwrap_or(0).max(0);
    let duration = Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
    // At most 68 years on: no real clock overflows, and if one did the Lease would stay held.
    let expires = observed.since.checked_add(duration).unwrap_or(now);
    if expires < now {
        Decision::Acquire
    } else {
        Decision::Wait {
            holder: holder.to_owned(),
            expires,
        }
    }
}

/// The Lease after `me` acquired it (`Decision::Acquire`) or renewed it (`Decision::Renew`).
fn claimed(mut spec: LeaseSpec, cfg: &LeaderElection, now: Timestamp) -> LeaseSpec {
    let ours = spec.holder_identity.as_deref() == Some(cfg.identity.as_str());
    if !ours {
        spec.holder_identity = Some(cfg.identity.clone());
        spec.acquire_time = Some(MicroTime(now));
        spec.lease_transitions = Some(spec.lease_transitions.map_or(0, |n| n.saturating_add(1)));
    } else if spec.acquire_time.is_none() {
        spec.acquire_time = Some(MicroTime(now));
    }
    spec.renew_time = Some(MicroTime(now));
    spec.lease_duration_seconds = Some(cfg.lease_duration_seconds());
    spec
}

/// Where this replica stands after one attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Standing {
    Leading,
    /// Someone else holds the Lease (`None`: it changed under us; look again next time).
    Following(Option<String>),
}

impl fmt::Display for Standing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Standing::Leading => f.write_str("leading"),
            Standing::Following(Some(holder)) => write!(f, "following {holder}"),
            Standing::Following(None) => f.write_str("lost a race for the lease"),
        }
    }
}

/// Why a read or write of the Lease failed, for the log: a refusal names the permissions the
/// manager needs; an apiserver that did not answer (restarting, overloaded) is not blamed on
/// RBAC.
fn lease_error_hint(err: &kube::Error) -> &'static str {
    match err {
        kube::Error::Api(status) if status.code == 401 || status.code == 403 => {
            "the manager needs get, create and update on leases.coordination.k8s.io"
        }
        _ if kruise_rs_kube::is_transient(err) => "the API server did not answer; asking again",
        _ => "asking again",
    }
}

fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 409)
}

/// One round: read (or create) the Lease and acquire or renew it if [`decide`] says so, given
/// what this replica `observed` of it before (updated here).
async fn attempt(
    api: &Api<Lease>,
    cfg: &LeaderElection,
    observed: &Mutex<Option<Observed>>,
) -> Result<Standing, kube::Error> {
    // Only written into the Lease, for whoever reads it; expiry is measured on `Instant`s.
    let wall_now = Timestamp::now();
    let Some(lease) = api.get_opt(&cfg.lease_name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(cfg.lease_name.clone()),
                namespace: Some(cfg.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(claimed(LeaseSpec::default(), cfg, wall_now)),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(created) => {
                remember(observed, created.spec, Instant::now());
                Ok(Standing::Leading)
            }
            Err(err) if is_conflict(&err) => Ok(Standing::Following(None)),
            Err(err) => Err(err),
        };
    };
    let now = Instant::now();
    let spec = lease.spec.clone().unwrap_or_default();
    let seen = observe(take(observed), &spec, now);
    let decision = decide(&seen, &cfg.identity, now);
    remember(observed, Some(seen.spec), seen.since);
    match decision {
        Decision::Wait { holder, .. } => Ok(Standing::Following(Some(holder))),
        Decision::Acquire | Decision::Renew => {
            let mut next = lease;
            next.spec = Some(claimed(spec, cfg, wall_now));
            // `next` keeps the resourceVersion we read: a concurrent writer makes this a 409.
            match api
                .replace(&cfg.lease_name, &PostParams::default(), &next)
                .await
            {
                Ok(written) => {
                    remember(observed, written.spec, Instant::now());
                    Ok(Standing::Leading)
                }
                Err(err) if is_conflict(&err) => Ok(Standing::Following(None)),
                Err(err) => Err(err),
            }
        }
    }
}

fn take(observed: &Mutex<Option<Observed>>) -> Option<Observed> {
    observed.lock().unwrap_or_else(|e| e.into_inner()).take()
}

fn remember(observed: &Mutex<Option<Observed>>, spec: Option<LeaseSpec>, since: Instant) {
    *observed.lock().unwrap_or_else(|e| e.into_inner()) = Some(Observed {
        spec: spec.unwrap_or_default(),
        since,
    });
}

/// Clears `holderIdentity` if this replica still holds the Lease.
async fn release(api: &Api<Lease>, cfg: &LeaderElection) -> Result<bool, kube::Error> {
    let Some(mut lease) = api.get_opt(&cfg.lease_name).await? else {
        return Ok(false);
    };
    let Some(spec) = lease.spec.as_mut() else {
        return Ok(false);
    };
    if spec.holder_identity.as_deref() != Some(cfg.identity.as_str()) {
        return Ok(false);
    }
    spec.holder_identity = None;
    spec.renew_time = Some(MicroTime(Timestamp::now()));
    api.replace(&cfg.lease_name, &PostParams::default(), &lease)
        .await?;
    Ok(true)
}

/// Keeps `leading` up to date with this replica's standing until `release` fires (or its
/// sender is dropped); then gives the Lease up if it holds it.
async fn elect(
    api: Api<Lease>,
    cfg: LeaderElection,
    leading: watch::Sender<bool>,
    release_rx: oneshot::Receiver<()>,
) {
    let observed = Mutex::new(None);
    elect_with(
        &cfg,
        || attempt(&api, &cfg, &observed),
        || release(&api, &cfg),
        leading,
        release_rx,
    )
    .await;
}

/// [`elect`] with its two API calls given, so that the timing can be tested without a server.
async fn elect_with<A, FA, R, FR>(
    cfg: &LeaderElection,
    mut attempt: A,
    release: R,
    leading: watch::Sender<bool>,
    release_rx: oneshot::Receiver<()>,
) where
    A: FnMut() -> FA,
    FA: Future<Output = Result<Standing, kube::Error>>,
    R: FnOnce() -> FR,
    FR: Future<Output = Result<bool, kube::Error>>,
{
    let mut release_rx = pin!(release_rx);
    // When the last successful acquire or renew started: the lease counts from then.
    let mut renewed_at: Option<Instant> = None;
    let mut last_standing: Option<Standing> = None;
    let mut next_try = Instant::now();
    // Whether an acquire that may have succeeded was cut short by the release request.
    let mut interrupted = false;
    loop {
        // A leader whose renewals keep failing wakes up at its renew deadline, not later.
        let wake = match renewed_at {
            Some(at) => next_try.min(at + cfg.renew_deadline),
            None => next_try,
        };
        tokio::select! {
            biased;
            _ = &mut release_rx => break,
            () = tokio::time::sleep_until(wake) => {}
        }
        let started = Instant::now();
        next_try = started + cfg.retry_period;
        // The leader must know within its renew deadline; a follower within a retry period.
        let deadline = match renewed_at {
            Some(at) => at + cfg.renew_deadline,
            None => started + cfg.retry_period.max(Duration::from_secs(1)),
        };
        let outcome = tokio::select! {
            biased;
            _ = &mut release_rx => {
                interrupted = true;
                break;
            }
            outcome = tokio::time::timeout_at(deadline, attempt()) => outcome,
        };
        match outcome {
            Ok(Ok(Standing::Leading)) => {
                if renewed_at.is_none() {
                    info!(lease = %cfg.lease_name, namespace = %cfg.namespace, identity = %cfg.identity,
                          "acquired the leader lease; starting the controllers");
                } else {
                    debug!(lease = %cfg.lease_name, "renewed the leader lease");
                }
                renewed_at = Some(started);
                leading.send_replace(true);
                last_standing = Some(Standing::Leading);
            }
            Ok(Ok(standing)) => {
                if renewed_at.take().is_some() {
                    warn!(lease = %cfg.lease_name, identity = %cfg.identity, %standing,
                          "lost the leader lease; stopping the controllers");
                } else if last_standing.as_ref() != Some(&standing) {
                    info!(lease = %cfg.lease_name, identity = %cfg.identity, %standing,
                          "waiting for the leader lease");
                }
                leading.send_replace(false);
                last_standing = Some(standing);
            }
            Ok(Err(err)) => {
                warn!(lease = %cfg.lease_name, namespace = %cfg.namespace, error = %err,
                      "cannot read or write the leader lease ({})", lease_error_hint(&err));
                if renewed_at.is_some_and(|at| Instant::now() >= at + cfg.renew_deadline) {
                    renewed_at = None;
                    warn!(lease = %cfg.lease_name, identity = %cfg.identity, deadline = ?cfg.renew_deadline,
                          "could not renew the leader lease within the renew deadline; stopping the controllers");
                    leading.send_replace(false);
                    last_standing = None;
                }
            }
            Err(_elapsed) => {
                if renewed_at.take().is_some() {
                    warn!(lease = %cfg.lease_name, identity = %cfg.identity, deadline = ?cfg.renew_deadline,
                          "could not renew the leader lease within the renew deadline; stopping the controllers");
                    leading.send_replace(false);
                    last_standing = None;
                } else {
                    warn!(lease = %cfg.lease_name, "the apiserver did not answer about the leader lease in time");
                }
            }
        }
        if renewed_at.is_none() {
            next_try = started + jittered(cfg.retry_period, FOLLOWER_JITTER);
        }
    }
    leading.send_replace(false);
    if renewed_at.is_some() || interrupted {
        match tokio::time::timeout(cfg.renew_deadline, release()).await {
            Ok(Ok(true)) => {
                info!(lease = %cfg.lease_name, identity = %cfg.identity, "released the leader lease")
            }
            Ok(Ok(false)) => {}
            Ok(Err(err)) => warn!(lease = %cfg.lease_name, error = %err,
                                  "cannot release the leader lease; it expires on its own"),
            Err(_elapsed) => warn!(lease = %cfg.lease_name,
                                   "the apiserver did not answer the lease release in time; it expires on its own"),
        }
    }
}

/// Runs `work` while this replica holds the Lease `cfg` describes, until `shutdown` resolves.
///
/// `work` is called each time the Lease is acquired, with a future that resolves when it should
/// stop gracefully (shutdown). When the Lease is lost, the future `work` returned is dropped at
/// once. On shutdown the work gets `stop_timeout` to finish, then the Lease is released.
///
/// `on_standing` is told whether this replica holds the Lease: at the start, on every change,
/// and `false` once the election has ended (the manager's `kruise_rs_manager_leader` gauge).
///
/// Returns `Ok(())` after a shutdown, `Err(WorkEnded)` if `work` ended by itself.
pub(crate) async fn run_while_leading<W, F>(
    client: Client,
    cfg: LeaderElection,
    shutdown: impl Future<Output = ()>,
    stop_timeout: Duration,
    on_standing: impl FnMut(bool),
    mut work: W,
) -> Result<(), WorkEnded>
where
    W: FnMut(oneshot::Receiver<()>) -> F,
    F: Future<Output = ()>,
{
    let api = Api::<Lease>::namespaced(client, &cfg.namespace);
    let (leading_tx, mut leading) = watch::channel(false);
    let reporter = report_standing(leading.clone(), on_standing);
    let (release_tx, release_rx) = oneshot::channel::<()>();
    let elector = elect(api, cfg, leading_tx, release_rx);

    let supervisor = async move {
        let mut shutdown = pin!(shutdown);
        let result = loop {
            tokio::select! {
                biased;
                () = &mut shutdown => break Ok(()),
                open = async { leading.wait_for(|l| *l).await.is_ok() } => if !open { break Ok(()) },
            }
            let (stop_tx, stop_rx) = oneshot::channel();
            let mut running = Box::pin(work(stop_rx));
            tokio::select! {
                biased;
                () = &mut shutdown => {
                    let _ = stop_tx.send(());
                    if tokio::time::timeout(stop_timeout, &mut running).await.is_err() {
                        warn!(timeout = ?stop_timeout, "controllers still busy after the stop timeout; leaving them");
                    }
                    break Ok(());
                }
                () = &mut running => break Err(WorkEnded),
                _ = async { leading.wait_for(|l| !*l).await.is_ok() } => {
                    // Dropping `running` cancels every reconcile in flight: no write after this.
                    drop(running);
                    info!("controllers stopped: not the leader any more");
                }
            }
        };
        // Only now that nothing of ours writes may another replica take over.
        let _ = release_tx.send(());
        result
    };
    let (result, (), ()) = tokio::join!(supervisor, elector, reporter);
    result
}

/// Calls `report` with the standing `leading` holds now and with each one it changes to, until
/// its sender is gone; then with `false`.
async fn report_standing(mut leading: watch::Receiver<bool>, mut report: impl FnMut(bool)) {
    loop {
        report(*leading.borrow_and_update());
        if leading.changed().await.is_err() {
            break;
        }
    }
    report(false);
}

/// The work given to [`run_while_leading`] ended by itself.
#[derive(Debug, thiserror::Error)]
#[error("the leader's work ended unexpectedly")]
pub(crate) struct WorkEnded;

#[cfg(test)]
mod tests;
