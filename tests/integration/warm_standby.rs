//! Warm standbys (decision 0043): a replica that does not lead keeps its pod and NodeImage
//! watches, is ready only once they have listed, and takes over without listing them again.
//! Each test runs on a control plane of its own, where it alone opens watches.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kruise_rs::manager::{self, LeaderElection, ManagerError, ManagerOptions};
use kruise_rs_api::nodeimage::NodeImage;
use kruise_rs_controller::initial_list::StreamingLists;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::task::JoinHandle;

use crate::support::{self, ExtraControlPlane, free_loopback_port, wait_for};
use crate::watch_lists::{options, plane_without_watch_list, readyz};

/// The Lease the replicas here elect over, in `default` (each control plane is the test's own).
pub(crate) const LEASE: &str = "kruise-rs-standby";
pub(crate) const NAMESPACE: &str = "default";

/// Writes `holder` (empty: nobody) into the Lease, renewed now, for `seconds`; creates it first
/// if there is none.
pub(crate) async fn hold_lease(client: &Client, holder: &str, seconds: i32) {
    let leases = Api::<Lease>::namespaced(client.clone(), NAMESPACE);
    let spec = LeaseSpec {
        holder_identity: (!holder.is_empty()).then(|| holder.to_owned()),
        lease_duration_seconds: Some(seconds),
        acquire_time: Some(MicroTime(Timestamp::now())),
        renew_time: Some(MicroTime(Timestamp::now())),
        ..LeaseSpec::default()
    };
    if leases
        .get_opt(LEASE)
        .await
        .expect("reading the Lease")
        .is_none()
    {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(LEASE.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(spec),
        };
        leases
            .create(&PostParams::default(), &lease)
            .await
            .expect("creating the Lease");
        return;
    }
    let patch = json!({"spec": {
        "holderIdentity": spec.holder_identity,
        "leaseDurationSeconds": seconds,
        "renewTime": spec.renew_time,
    }});
    leases
        .patch(LEASE, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("writing the Lease");
}

/// Starts a manager replica `identity` electing over [`LEASE`], warm or cold while it stands by;
/// its probe address and task.
fn start_standby(
    kubeconfig: &Path,
    identity: &str,
    warm_standby: bool,
    mode: StreamingLists,
) -> (SocketAddr, JoinHandle<Result<(), ManagerError>>) {
    let addr = free_loopback_port();
    let opts = ManagerOptions {
        leader_election: Some(LeaderElection {
            lease_name: LEASE.to_owned(),
            identity: identity.to_owned(),
            retry_period: Duration::from_millis(500),
            warm_standby,
            ..LeaderElection::new(NAMESPACE)
        }),
        ..options(kubeconfig, addr, mode)
    };
    let task = tokio::spawn(manager::run(opts, std::future::pending(), None));
    (addr, task)
}

/// A standby keeps its pod and NodeImage watches warm (decision 0043), so it is ready only
/// once they have listed: a replica that could not take over at once does not let a
/// Deployment rollout stop the replica it replaces. Forced to stream where the server cannot,
/// a warm standby stays 503; a cold one (`--standby-caches=cold`), which watches nothing while
/// it stands by, is ready at once.
#[tokio::test]
async fn a_warm_standby_whose_watches_are_refused_stays_unready_and_a_cold_one_is_ready() {
    let plane = plane_without_watch_list().await;
    let client = support::client_for(plane.kubeconfig_path()).await;
    hold_lease(&client, "elsewhere", 3600).await;
    let standby = |identity: &str, warm: bool| {
        start_standby(
            plane.kubeconfig_path(),
            identity,
            warm,
            StreamingLists::Always,
        )
    };

    let (cold_addr, cold) = standby("standby-cold", false);
    wait_for(
        "the cold standby to be ready",
        Duration::from_secs(30),
        || async move { (readyz(cold_addr).await == Some(200)).then_some(()) },
    )
    .await;

    let (warm_addr, warm) = standby("standby-warm", true);
    let first = wait_for(
        "the warm standby's probe server",
        Duration::from_secs(30),
        || async move { readyz(warm_addr).await },
    )
    .await;
    assert_eq!(first, 503);
    // Observed over a bounded window, since what is checked is that something does not happen.
    let window = tokio::time::Instant::now() + Duration::from_secs(8);
    while tokio::time::Instant::now() < window {
        assert_eq!(
            readyz(warm_addr).await,
            Some(503),
            "/readyz of a warm standby whose watches fail"
        );
        assert_eq!(
            readyz(cold_addr).await,
            Some(200),
            "/readyz of the cold one"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    warm.abort();
    cold.abort();
}

/// What the apiserver counts for `resource` (of `group`, empty for the core group): lists
/// answered, and watches open now.
#[derive(Debug, PartialEq, Eq)]
struct Reads {
    lists: u64,
    open_watches: u64,
}

async fn reads(client: &Client, group: &str, resource: &str) -> Reads {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("a request");
    let text = client
        .request_text(request)
        .await
        .expect("the apiserver's /metrics");
    let labelled = |line: &str, verb: &str| {
        line.contains(&format!("group=\"{group}\""))
            && line.contains(&format!("resource=\"{resource}\""))
            && line.contains("subresource=\"\"")
            && line.contains(&format!("verb=\"{verb}\""))
    };
    let sum = |metric: &str, verb: &str| -> u64 {
        text.lines()
            .filter(|line| line.starts_with(&format!("{metric}{{")) && labelled(line, verb))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    };
    Reads {
        lists: sum("apiserver_request_total", "LIST"),
        open_watches: sum("apiserver_longrunning_requests", "WATCH"),
    }
}

/// A warm standby that takes over opens no pod or NodeImage watch and lists neither again: its
/// controllers read the stores it kept. (A cold one opens one watch of each once it leads.)
#[tokio::test]
async fn a_warm_standby_takes_over_without_listing_pods_or_nodeimages_again() {
    let plane = ExtraControlPlane::start_with_crds().await;
    let client = support::client_for(plane.kubeconfig_path()).await;
    hold_lease(&client, "elsewhere", 3600).await;
    // The control plane's own readers (it watches pods itself).
    let pods = || reads(&client, "", "pods");
    let nodeimages = || reads(&client, "apps.kruise.io", "nodeimages");
    let others = (pods().await, nodeimages().await);
    // Listing then watching, on every Kubernetes version, and no probe (`Auto` opens a
    // streaming watch of each to ask, which the server holds open for seconds).
    let (addr, standby) = start_standby(
        plane.kubeconfig_path(),
        "standby",
        true,
        StreamingLists::Never,
    );
    wait_for(
        "the warm standby to be ready",
        Duration::from_secs(30),
        || async move { (readyz(addr).await == Some(200)).then_some(()) },
    )
    .await;
    let before = (pods().await, nodeimages().await);
    let plus_one = |others: &Reads| Reads {
        lists: others.lists + 1,
        open_watches: others.open_watches + 1,
    };
    assert_eq!(
        before,
        (plus_one(&others.0), plus_one(&others.1)),
        "the standby has listed and watches pods and NodeImages (beside {others:?})"
    );

    // Nobody holds the Lease: the standby takes it within a retry period and its controllers
    // run, here giving a new Ready Node its NodeImage.
    hold_lease(&client, "", 1).await;
    support::create_ready_node(&client, "node-after-takeover", Default::default()).await;
    let nodeimage_api: Api<NodeImage> = Api::all(client.clone());
    wait_for(
        "the new leader to give the Node its NodeImage",
        Duration::from_secs(30),
        || {
            let nodeimage_api = nodeimage_api.clone();
            async move {
                nodeimage_api
                    .get_opt("node-after-takeover")
                    .await
                    .ok()
                    .flatten()
            }
        },
    )
    .await;
    let after = (pods().await, nodeimages().await);
    assert_eq!(
        after, before,
        "the new leader reads pods and NodeImages from the standby's watches"
    );
    standby.abort();
}
