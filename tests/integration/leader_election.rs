//! Leader election against the real apiserver: of two manager replicas competing for one Lease
//! only the holder reconciles; when it stops (cleanly, releasing the Lease, or abruptly, leaving
//! it to expire) the other takes over within the lease duration; a replica whose Lease is taken
//! from it stops writing.
//!
//! To tell the replicas' work apart, each keeps its SidecarSet ControllerRevisions in a namespace
//! of its own (`ControllerOptions::namespace`): a revision of this test's SidecarSet in replica
//! X's namespace means X reconciled it. The replicas are confined to a label unique to the test,
//! so they ignore every other test's objects (and the shared test controllers ignore theirs).

use std::time::Duration;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kruise_rs::manager::{LeaderElection, ManagerError, ManagerOptions};
use kruise_rs_api::sidecarset::SidecarSet;
use kruise_rs_api::well_known::SIDECARSET_NAME_LABEL;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::support::scrape::wait_sample;
use crate::support::{self, FIELD_MANAGER, TestCluster, TestNamespace, unique_name, wait_for};

/// The replicas' settings: short, so that the test is quick, in the proportions of the defaults.
const LEASE_DURATION: Duration = Duration::from_secs(3);
const RENEW_DEADLINE: Duration = Duration::from_secs(2);
const RETRY_PERIOD: Duration = Duration::from_millis(500);
/// What a takeover may take beyond the protocol's own bound: the new leader's controllers list
/// their caches and reconcile once.
const MARGIN: Duration = Duration::from_secs(3);
/// The longest a follower waits between two reads of the Lease: its retry period, stretched
/// by up to half at random.
const FOLLOWER_PERIOD: Duration = Duration::from_millis(750);
/// How long a replica may take to start, and the controllers to reconcile a new object.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The label key the replicas of every test here are confined to (each test its own value).
const LABEL: &str = "kruise-rs-leader-election";

/// One election: its Lease and the label its replicas and objects carry.
struct Election {
    client: Client,
    lease: String,
    lease_ns: TestNamespace,
    label_value: String,
    /// Whether the replicas keep their pod and NodeImage watches while they stand by.
    warm_standby: bool,
}

impl Election {
    async fn new(cluster: &TestCluster) -> Self {
        Election {
            client: cluster.client().await,
            lease: unique_name("lease"),
            lease_ns: cluster.namespace("leader-lease").await,
            label_value: unique_name("le"),
            warm_standby: true,
        }
    }

    /// Replicas that watch nothing while they stand by (`--standby-caches=cold`).
    async fn cold(cluster: &TestCluster) -> Self {
        Election {
            warm_standby: false,
            ..Self::new(cluster).await
        }
    }

    fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), self.lease_ns.name())
    }

    async fn lease(&self) -> Option<LeaseSpec> {
        self.leases()
            .get_opt(&self.lease)
            .await
            .unwrap_or_else(|e| panic!("reading Lease {}: {e}", self.lease))
            .and_then(|l| l.spec)
    }

    async fn holder(&self) -> Option<String> {
        self.lease()
            .await
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty())
    }

    async fn wait_holder(&self, identity: &str, timeout: Duration) {
        wait_for(
            &format!("{identity} to hold Lease {}", self.lease),
            timeout,
            || async { (self.holder().await.as_deref() == Some(identity)).then_some(()) },
        )
        .await;
    }

    /// Starts a replica called `identity` that keeps its revisions in a namespace of its own;
    /// returns once it is ready (serving; not necessarily leading).
    async fn start(&self, cluster: &TestCluster, identity: &str) -> Replica {
        let revisions = cluster.namespace(identity).await;
        let opts = ManagerOptions {
            controllers: kruise_rs::controllers::ControllerOptions {
                namespace: revisions.name().to_owned(),
                label_selector: Some(format!("{LABEL}={}", self.label_value)),
                ..support::test_controller_options()
            },
            leader_election: Some(LeaderElection {
                lease_name: self.lease.clone(),
                namespace: self.lease_ns.name().to_owned(),
                identity: identity.to_owned(),
                lease_duration: LEASE_DURATION,
                renew_deadline: RENEW_DEADLINE,
                retry_period: RETRY_PERIOD,
                warm_standby: self.warm_standby,
            }),
            ..support::manager_options(cluster.kubeconfig_path())
        };
        let running = support::start_manager(opts, START_TIMEOUT, identity).await;
        Replica {
            identity: identity.to_owned(),
            revisions,
            client: self.client.clone(),
            probe_addr: running.probe_addr,
            stop: Some(running.stop),
            task: running.task,
        }
    }

    /// Creates a SidecarSet the replicas manage; returns its name.
    async fn sidecarset(&self) -> String {
        let name = unique_name("le-set");
        let set = json!({
            "apiVersion": "apps.kruise.io/v1beta1",
            "kind": "SidecarSet",
            "metadata": {"name": name, "labels": {LABEL: self.label_value}},
            "spec": {
                "selector": {"matchLabels": {"app": name}},
                "updateStrategy": {"type": "RollingUpdate"},
                "containers": [{
                    "name": "sidecar",
                    "image": "busybox:1.36",
                    "command": ["sleep", "infinity"],
                }],
            }
        });
        Api::<SidecarSet>::all(self.client.clone())
            .patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER),
                &Patch::Apply(&set),
            )
            .await
            .unwrap_or_else(|e| panic!("creating SidecarSet {name}: {e}"));
        name
    }
}

/// A manager replica running on this test's runtime.
struct Replica {
    identity: String,
    /// Where its SidecarSet controller keeps ControllerRevisions.
    revisions: TestNamespace,
    client: Client,
    /// Its probe server, with `/metrics`.
    probe_addr: std::net::SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), ManagerError>>,
}

impl Replica {
    /// How many revisions of SidecarSet `set` this replica has written.
    async fn revisions_of(&self, set: &str) -> usize {
        Api::<ControllerRevision>::namespaced(self.client.clone(), self.revisions.name())
            .list(&ListParams::default().labels(&format!("{SIDECARSET_NAME_LABEL}={set}")))
            .await
            .unwrap_or_else(|e| panic!("listing revisions in {}: {e}", self.revisions.name()))
            .items
            .len()
    }

    async fn wait_reconciled(&self, set: &str, timeout: Duration) {
        wait_for(
            &format!("{} to reconcile SidecarSet {set}", self.identity),
            timeout,
            || async { (self.revisions_of(set).await > 0).then_some(()) },
        )
        .await;
    }

    /// Waits until its `kruise_rs_manager_leader` gauge says `leading` (1) or not (0).
    async fn wait_leader_gauge(&self, leading: bool, timeout: Duration) {
        let want = if leading { 1.0 } else { 0.0 };
        wait_sample(self.probe_addr, "kruise_rs_manager_leader", timeout, |v| {
            v == want
        })
        .await;
    }

    /// Clean shutdown; the replica must stop without error.
    async fn stop(mut self) {
        let _ = self.stop.take().expect("not stopped yet").send(());
        let result = tokio::time::timeout(Duration::from_secs(15), &mut self.task)
            .await
            .unwrap_or_else(|_| panic!("{} stops within 15 s", self.identity))
            .expect("join");
        assert!(result.is_ok(), "{}: {result:?}", self.identity);
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Over one lease duration, `follower` writes nothing for `set` while `leader` keeps the Lease.
async fn assert_only_leader_acts(
    election: &Election,
    leader: &Replica,
    follower: &Replica,
    set: &str,
) {
    let until = Instant::now() + LEASE_DURATION;
    while Instant::now() < until {
        assert_eq!(
            election.holder().await.as_deref(),
            Some(leader.identity.as_str()),
            "the leader keeps renewing its Lease"
        );
        assert_eq!(
            follower.revisions_of(set).await,
            0,
            "{} is not the leader and must not reconcile {set}",
            follower.identity
        );
        tokio::time::sleep(RETRY_PERIOD / 2).await;
    }
}

/// Two replicas, `a` first so that it wins; `set` reconciled by `a` alone.
async fn two_replicas(cluster: &TestCluster, election: &Election) -> (Replica, Replica, String) {
    let a = election.start(cluster, &unique_name("replica-a")).await;
    election.wait_holder(&a.identity, START_TIMEOUT).await;
    let b = election.start(cluster, &unique_name("replica-b")).await;
    let set = election.sidecarset().await;
    a.wait_reconciled(&set, START_TIMEOUT).await;
    assert_only_leader_acts(election, &a, &b, &set).await;
    a.wait_leader_gauge(true, MARGIN).await;
    b.wait_leader_gauge(false, MARGIN).await;
    (a, b, set)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_reconciles_and_a_clean_stop_hands_over_at_once() {
    let cluster = support::cluster().await;
    clean_handover(cluster, &Election::new(cluster).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_standbys_hand_over_the_same_way() {
    let cluster = support::cluster().await;
    clean_handover(cluster, &Election::cold(cluster).await).await;
}

/// Two replicas of `election`: only the leader reconciles; a clean stop hands over at once.
async fn clean_handover(cluster: &TestCluster, election: &Election) {
    let (a, b, set) = two_replicas(cluster, election).await;
    let before = election.lease().await.expect("the Lease exists");

    let stopped_at = Instant::now();
    a.stop().await;
    // A clean stop releases the Lease: nobody waits for it to expire.
    let holder = election.holder().await;
    assert!(
        holder.is_none() || holder.as_deref() == Some(b.identity.as_str()),
        "the stopped leader released the Lease, holder {holder:?}"
    );
    b.wait_reconciled(&set, RETRY_PERIOD + MARGIN).await;
    let took = stopped_at.elapsed();
    b.wait_leader_gauge(true, MARGIN).await;
    assert!(
        took < LEASE_DURATION + MARGIN,
        "takeover after a clean stop took {took:?}"
    );
    let after = election.lease().await.expect("the Lease exists");
    assert_eq!(after.holder_identity.as_deref(), Some(b.identity.as_str()));
    assert_eq!(
        after.lease_transitions,
        before.lease_transitions.map(|n| n + 1),
        "one transition, a to b"
    );
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_leader_is_replaced_within_the_lease_duration() {
    let cluster = support::cluster().await;
    let election = Election::new(cluster).await;
    let (a, b, set) = two_replicas(cluster, &election).await;

    // A crash: no release, the Lease stays with `a` until it expires. For `b` it expires a
    // lease duration after the read that saw `a`'s last renewal (up to one read late), and `b`
    // takes it at its first read after that.
    let bound = LEASE_DURATION + 2 * FOLLOWER_PERIOD + MARGIN;
    a.task.abort();
    let aborted_at = Instant::now();
    let after_abort = election.lease().await.expect("the Lease exists");
    assert_eq!(
        after_abort.holder_identity.as_deref(),
        Some(a.identity.as_str())
    );
    election.wait_holder(&b.identity, bound).await;
    let took_over = aborted_at.elapsed();
    b.wait_reconciled(&set, bound).await;
    let acted = aborted_at.elapsed();
    assert!(
        acted < bound,
        "b took the Lease after {took_over:?} and reconciled after {acted:?}"
    );
    drop(a);
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_lease_is_taken_stops_writing() {
    let cluster = support::cluster().await;
    let election = Election::new(cluster).await;
    let a = election.start(cluster, &unique_name("replica-a")).await;
    election.wait_holder(&a.identity, START_TIMEOUT).await;
    let first = election.sidecarset().await;
    a.wait_reconciled(&first, START_TIMEOUT).await;

    // Someone else takes the Lease (as if `a` had been partitioned away and it expired), for
    // longer than the test runs.
    let intruder = "intruder";
    a.wait_leader_gauge(true, MARGIN).await;
    take_lease(&election, intruder, 3600).await;
    // `a` finds out at its next renewal, within a retry period plus the request, and says so on
    // /metrics once its controllers are gone. Only from then on must it stay quiet, so the new
    // SidecarSet comes after that.
    a.wait_leader_gauge(false, RETRY_PERIOD * 2 + MARGIN).await;
    let second = election.sidecarset().await;
    let until = Instant::now() + LEASE_DURATION;
    while Instant::now() < until {
        assert_eq!(election.holder().await.as_deref(), Some(intruder));
        assert_eq!(
            a.revisions_of(&second).await,
            0,
            "{} lost the Lease and must not reconcile {second}",
            a.identity
        );
        tokio::time::sleep(RETRY_PERIOD / 2).await;
    }
    // The intruder lets go; `a` takes the Lease back and catches up.
    take_lease(&election, "", 1).await;
    election
        .wait_holder(&a.identity, RETRY_PERIOD + MARGIN)
        .await;
    a.wait_leader_gauge(true, RETRY_PERIOD + MARGIN).await;
    a.wait_reconciled(&second, START_TIMEOUT).await;
    a.stop().await;
}

/// Writes `holder` (empty: nobody) into the Lease with a fresh `renewTime`.
async fn take_lease(election: &Election, holder: &str, seconds: i32) {
    let leases = election.leases();
    wait_for(
        "the Lease write to go through",
        Duration::from_secs(10),
        || {
            let leases = leases.clone();
            async move {
                let mut lease = leases.get(&election.lease).await.ok()?;
                let spec = lease.spec.get_or_insert_with(Default::default);
                spec.holder_identity = (!holder.is_empty()).then(|| holder.to_owned());
                spec.renew_time = Some(MicroTime(Timestamp::now()));
                spec.acquire_time = Some(MicroTime(Timestamp::now()));
                spec.lease_duration_seconds = Some(seconds);
                // A conflict (the leader renewed meanwhile) is retried.
                leases
                    .replace(&election.lease, &PostParams::default(), &lease)
                    .await
                    .ok()
                    .map(|_| ())
            }
        },
    )
    .await;
}

/// How far behind ours the skewed holder's clock runs.
const SKEW: Duration = Duration::from_secs(13);

/// A holder on a machine whose clock runs [`SKEW`] behind this one's: it holds the Lease and
/// renews it every retry period, stamping `renewTime` with its own (slow) clock, until stopped;
/// then it stops renewing without releasing, as a crashed process does.
struct SkewedHolder {
    task: JoinHandle<()>,
    errors: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl SkewedHolder {
    const IDENTITY: &str = "skewed-holder";

    fn clock() -> Timestamp {
        Timestamp::now() - SKEW
    }

    async fn start(election: &Election) -> Self {
        let lease: Lease = serde_json::from_value(json!({
            "metadata": {"name": election.lease, "namespace": election.lease_ns.name()},
            "spec": {
                "holderIdentity": Self::IDENTITY,
                "leaseDurationSeconds": LEASE_DURATION.as_secs(),
                "acquireTime": MicroTime(Self::clock()),
                "renewTime": MicroTime(Self::clock()),
                "leaseTransitions": 0,
            }
        }))
        .expect("a Lease");
        let leases = election.leases();
        leases
            .create(&PostParams::default(), &lease)
            .await
            .expect("the skewed holder creates its Lease");
        let errors = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (name, recorded) = (election.lease.clone(), errors.clone());
        let task = tokio::spawn(async move {
            let mut every = tokio::time::interval(RETRY_PERIOD);
            loop {
                every.tick().await;
                let renewed = async {
                    let mut lease = leases.get(&name).await.map_err(|e| e.to_string())?;
                    let spec = lease.spec.get_or_insert_with(Default::default);
                    if spec.holder_identity.as_deref() != Some(Self::IDENTITY) {
                        return Err(format!("the Lease was taken while renewed: {spec:?}"));
                    }
                    spec.renew_time = Some(MicroTime(Self::clock()));
                    leases
                        .replace(&name, &PostParams::default(), &lease)
                        .await
                        .map(|_| ())
                        .map_err(|e| format!("renewing: {e}"))
                };
                if let Err(e) = renewed.await {
                    recorded.lock().expect("errors lock").push(e);
                }
            }
        });
        SkewedHolder { task, errors }
    }

    /// Stops renewing; returns what went wrong while it renewed.
    async fn stop(self) -> Vec<String> {
        self.task.abort();
        let _ = self.task.await;
        self.errors.lock().expect("errors lock").clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_clock_runs_13_s_behind_keeps_its_lease_while_it_renews() {
    let cluster = support::cluster().await;
    let election = Election::new(cluster).await;
    let holder = SkewedHolder::start(&election).await;
    let replica = election.start(cluster, &unique_name("replica")).await;
    let set = election.sidecarset().await;

    // Every renewTime the replica reads is 13 s old by its clock, over four times the lease
    // duration; the holder renews all along, so the Lease is live.
    let until = Instant::now() + 3 * LEASE_DURATION;
    while Instant::now() < until {
        assert_eq!(
            election.holder().await.as_deref(),
            Some(SkewedHolder::IDENTITY),
            "a live Lease stays with its holder, whatever its clock"
        );
        assert_eq!(replica.revisions_of(&set).await, 0);
        tokio::time::sleep(RETRY_PERIOD / 2).await;
    }
    let errors = holder.stop().await;
    assert!(errors.is_empty(), "the holder's renewals: {errors:?}");

    // The renewals stop: a lease duration after the replica saw the last one (up to a read
    // late), it takes the Lease at its next read.
    let stopped_at = Instant::now();
    let bound = LEASE_DURATION + 2 * FOLLOWER_PERIOD + MARGIN;
    election.wait_holder(&replica.identity, bound).await;
    let took = stopped_at.elapsed();
    assert!(
        took >= LEASE_DURATION - RETRY_PERIOD,
        "the replica took the Lease {took:?} after the renewals stopped, before it expired"
    );
    replica.wait_reconciled(&set, START_TIMEOUT).await;
    replica.stop().await;
}
