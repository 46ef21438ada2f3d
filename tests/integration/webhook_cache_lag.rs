//! The pod webhook while its SidecarSet cache lags the apiserver. The soak lost pods created
//! within 0.2 s of their SidecarSet: the watch behind the cache had not delivered it yet. Here
//! the lag is made as long as the test wants: the manager talks to the apiserver through a
//! [`FaultProxy`] that holds every watch event back, while the test writes SidecarSets and pods
//! straight to the apiserver. Each pod must get the sidecars of the SidecarSets as they are when
//! it is created (decision 0031).
//!
//! What the confirmation costs (decision 0044): while the SidecarSets stay as they are, a pod
//! costs the apiserver one fence (a read of its cache's version), not a list of every
//! SidecarSet; read from the proxy, which sees every request the manager sends. With
//! `--sidecarset-cache-fence=false` (decision 0046) a pod costs no request, and one created
//! while the watch lags gets the SidecarSets as the cache holds them, as upstream's would.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kruise_rs_api::sidecarset::SidecarSet;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::Config;
use serde_json::json;

use crate::harness::fault_proxy::{FaultProxy, Faults};
use crate::sidecarset_upgrade::poll;
use crate::support::webhook::{WEBHOOK_NAMESPACE_LABEL, own_manager_with_webhooks};
use crate::support::{ExtraControlPlane, client_for, start_manager};
use crate::warm_standby::{LEASE, NAMESPACE, hold_lease};
use k8s_openapi::api::core::v1::ConfigMap;
use kruise_rs::manager::LeaderElection;
use kruise_rs::webhook::{FailurePolicy, SidecarSetCacheReads, WebhookOptions};

const TIMEOUT: Duration = Duration::from_secs(60);
const INJECTED_LIST: &str = "kruise.io/sidecarset-injected-list";
/// The name the webhook's fence selects (no SidecarSet can have it): what its request carries.
const FENCE: &str = "kruise-rs..fence";

fn sidecarset(name: &str, image: &str) -> SidecarSet {
    serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "SidecarSet",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "containers": [{"name": name, "image": image, "command": ["sleep", "999"]}]
        }
    }))
    .expect("a SidecarSet")
}

fn pod() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"generateName": "web-", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "main", "image": "nginx:1.25"}]}
    }))
    .expect("a pod")
}

/// The pod's containers as `name=image`, in order.
fn containers(pod: &Pod) -> Vec<String> {
    pod.spec
        .iter()
        .flat_map(|spec| &spec.containers)
        .map(|c| format!("{}={}", c.name, c.image.as_deref().unwrap_or_default()))
        .collect()
}

/// A control plane of the test's own, a client of it, and a [`FaultProxy`] in front of it for
/// the manager.
async fn plane_and_proxy() -> (ExtraControlPlane, kube::Client, FaultProxy) {
    let plane = ExtraControlPlane::start_with_crds().await;
    let client = client_for(plane.kubeconfig_path()).await;
    let mut upstream = Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(plane.kubeconfig_path()).expect("kubeconfig"),
        &Default::default(),
    )
    .await
    .expect("a config");
    upstream.read_timeout = None; // the proxy carries the manager's watches
    let proxy = FaultProxy::start(kube::Client::try_from(upstream).expect("client"), 1)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    (plane, client, proxy)
}

#[tokio::test]
async fn a_pod_gets_the_sidecarsets_as_they_are_while_the_webhooks_cache_lags() {
    sidecarsets_as_they_are_while_the_cache_lags(Replica::Leader).await;
}

/// Every replica serves the pod webhook, and the apiserver calls whichever its Service picks:
/// a replica that does not lead (its controllers idle, its caches the warm watches of decision
/// 0043) confirms its cache the same way.
#[tokio::test]
async fn a_replica_that_does_not_lead_injects_the_sidecarsets_as_they_are_too() {
    sidecarsets_as_they_are_while_the_cache_lags(Replica::NotLeading).await;
}

enum Replica {
    Leader,
    NotLeading,
}

async fn sidecarsets_as_they_are_while_the_cache_lags(replica: Replica) {
    let (_plane, client, proxy) = plane_and_proxy().await;
    let mut opts = own_manager_with_webhooks(proxy.kubeconfig());
    if let Replica::NotLeading = replica {
        hold_lease(&client, "the-leader-elsewhere", 3600).await;
        opts.leader_election = Some(LeaderElection {
            lease_name: LEASE.to_owned(),
            identity: "not-leading".to_owned(),
            ..LeaderElection::new(NAMESPACE)
        });
    }
    let _manager = start_manager(opts, TIMEOUT, "behind the fault proxy").await;
    let ns = "lag";
    crate::harness::objects::create_namespace(&client, ns, &[(WEBHOOK_NAMESPACE_LABEL, "true")])
        .await
        .expect("namespace");
    let sets = Api::<SidecarSet>::all(client.clone());
    let pods = Api::<Pod>::namespaced(client.clone(), ns);

    // In the cache before the lag: pods get it once the apiserver calls the webhook.
    sets.create(&PostParams::default(), &sidecarset("early", "busybox:1.36"))
        .await
        .expect("SidecarSet early");
    until_a_pod_gets(&pods, "early").await;

    // From here the manager's caches see nothing new.
    proxy.hold_watch_events();
    sets.create(&PostParams::default(), &sidecarset("late", "busybox:1.37"))
        .await
        .expect("SidecarSet late");
    let image = json!({"spec": {"containers": [
        {"name": "early", "image": "busybox:1.38", "command": ["sleep", "999"]}
    ]}});
    sets.patch("early", &PatchParams::default(), &Patch::Merge(&image))
        .await
        .expect("early's image changed");

    let created = pods
        .create(&PostParams::default(), &pod())
        .await
        .expect("a pod while the cache lags");
    assert_eq!(
        created.annotations().get(INJECTED_LIST).map(String::as_str),
        Some("early,late"),
        "a SidecarSet created a moment before the pod is injected"
    );
    assert_eq!(
        containers(&created),
        ["early=busybox:1.38", "late=busybox:1.37", "main=nginx:1.25"],
        "each sidecar as its SidecarSet is now, not as the cache last saw it"
    );

    // Deleted while the cache still holds it: left out.
    sets.delete("early", &DeleteParams::default())
        .await
        .expect("early deleted");
    poll("early gone", TIMEOUT, || {
        let sets = sets.clone();
        async move {
            match sets.get_opt("early").await {
                Ok(None) => Ok(()),
                Ok(Some(set)) => Err(format!("still there: {:?}", set.finalizers())),
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await;
    let created = pods
        .create(&PostParams::default(), &pod())
        .await
        .expect("a pod after the delete");
    assert_eq!(
        created.annotations().get(INJECTED_LIST).map(String::as_str),
        Some("late")
    );
    assert_eq!(
        containers(&created),
        ["late=busybox:1.37", "main=nginx:1.25"]
    );
    proxy.release_watch_events();
    if let Replica::NotLeading = replica {
        let lease = Api::<Lease>::namespaced(client.clone(), NAMESPACE)
            .get(LEASE)
            .await
            .expect("the Lease");
        assert_eq!(
            lease.spec.and_then(|s| s.holder_identity).as_deref(),
            Some("the-leader-elsewhere"),
            "the replica took the Lease: it led after all"
        );
    }
}

/// The manager's requests for the SidecarSets' resource version (fences) and lists of every
/// SidecarSet, among `requests` (from [`FaultProxy::requests`]).
fn fences_and_lists(requests: &[String]) -> (usize, usize) {
    let reads: Vec<&String> = requests
        .iter()
        .filter(|r| r.starts_with("GET ") && r.contains("/sidecarsets?") && !r.contains("watch="))
        .collect();
    let fences = reads
        .iter()
        .filter(|r| r.contains("fieldSelector=metadata.name"))
        .count();
    (fences, reads.len() - fences)
}

/// A manager behind a proxy that only records what it sends, serving its webhooks without
/// running its controllers (the Lease is held elsewhere), so nothing but the test writes
/// SidecarSets; and the SidecarSets `a`, `b`, `c` selecting `app=web`, in its cache.
async fn webhooks_behind_a_recording_proxy(
    ns: &str,
    configure: impl FnOnce(&mut WebhookOptions),
) -> (
    ExtraControlPlane,
    kube::Client,
    FaultProxy,
    crate::support::RunningManager,
) {
    let (plane, client, proxy) = plane_and_proxy().await;
    hold_lease(&client, "elsewhere", 3600).await;
    let mut opts = own_manager_with_webhooks(proxy.kubeconfig());
    configure(opts.webhook.as_mut().expect("webhooks on"));
    opts.leader_election = Some(LeaderElection {
        lease_name: LEASE.to_owned(),
        identity: "webhooks-only".to_owned(),
        ..LeaderElection::new(NAMESPACE)
    });
    let manager = start_manager(opts, TIMEOUT, "webhooks behind the recording proxy").await;
    crate::harness::objects::create_namespace(&client, ns, &[(WEBHOOK_NAMESPACE_LABEL, "true")])
        .await
        .expect("namespace");
    let sets = Api::<SidecarSet>::all(client.clone());
    for name in ["a", "b", "c"] {
        sets.create(&PostParams::default(), &sidecarset(name, "busybox:1.36"))
            .await
            .unwrap_or_else(|e| panic!("SidecarSet {name}: {e}"));
    }
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    until_a_pod_gets(&pods, "a,b,c").await;
    (plane, client, proxy, manager)
}

/// Creates pods until one comes back injected with `list` (the webhook is registered and its
/// cache has the SidecarSets).
async fn until_a_pod_gets(pods: &Api<Pod>, list: &'static str) {
    poll(&format!("a pod injected with {list}"), TIMEOUT, || {
        let pods = pods.clone();
        async move {
            let created = pods
                .create(&PostParams::default(), &pod())
                .await
                .map_err(|e| e.to_string())?;
            match created.annotations().get(INJECTED_LIST) {
                Some(got) if got == list => Ok(()),
                other => Err(format!("injected list {other:?}")),
            }
        }
    })
    .await;
}

/// Creates `n` pods one after another; each must get `a`, `b` and `c`.
async fn create_injected_pods(pods: &Api<Pod>, n: usize) {
    for i in 0..n {
        let created = pods
            .create(&PostParams::default(), &pod())
            .await
            .unwrap_or_else(|e| panic!("pod {i}: {e}"));
        assert_eq!(
            created.annotations().get(INJECTED_LIST).map(String::as_str),
            Some("a,b,c"),
            "pod {i}"
        );
    }
}

/// The version the apiserver's SidecarSet cache stands at, read as the webhook's fence reads it.
async fn cache_version(client: &kube::Client) -> String {
    let params = kube::api::ListParams::default()
        .match_any()
        .fields(&format!("metadata.name={FENCE}"));
    Api::<SidecarSet>::all(client.clone())
        .list_metadata(&params)
        .await
        .expect("the fence")
        .metadata
        .resource_version
        .expect("a list version")
}

/// Decision 0044: while the SidecarSets stay as they are, each pod costs one fence and no list.
/// Before it, each pod cost a list of every SidecarSet (20 here).
#[tokio::test]
async fn a_pod_costs_a_fence_and_no_list_while_the_sidecarsets_stay_as_they_are() {
    let ns = "fence";
    let (_plane, client, proxy, _manager) = webhooks_behind_a_recording_proxy(ns, |_| {}).await;
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let _ = proxy.requests();
    create_injected_pods(&pods, 20).await;
    let (fences, lists) = fences_and_lists(&proxy.requests());
    assert_eq!(
        fences, 20,
        "one fence per pod (admissions one after another share none)"
    );
    // A progress notification from etcd may move the apiserver's cache on meanwhile (every
    // 10 minutes by default): one list then teaches the webhook the new version.
    assert!(lists <= 1, "{lists} lists of every SidecarSet for 20 pods");
}

/// The apiserver's SidecarSet cache moves to a newer version without any SidecarSet changing
/// when it is asked for a consistent read (it requests a progress notification from etcd): no
/// watch event brings our cache to that version, so the first pod costs a list; our cache matches
/// it exactly, the version is learnt, and the next pods cost a fence each again.
#[tokio::test]
async fn a_version_reached_without_a_change_costs_one_list_then_fences_again() {
    let ns = "fence-progress";
    let (_plane, client, proxy, _manager) = webhooks_behind_a_recording_proxy(ns, |_| {}).await;
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let before = cache_version(&client).await;
    let configmaps = Api::<ConfigMap>::namespaced(client.clone(), ns);
    for i in 0..3 {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": format!("moves-etcd-on-{i}")}}))
                .expect("a ConfigMap");
        configmaps
            .create(&PostParams::default(), &cm)
            .await
            .expect("a ConfigMap");
    }
    // A consistent list (no resourceVersion): the apiserver's cache waits for etcd's revision.
    Api::<SidecarSet>::all(client.clone())
        .list_metadata(&kube::api::ListParams::default())
        .await
        .expect("a consistent list");
    let after = cache_version(&client).await;
    assert_ne!(
        before, after,
        "the consistent list did not move the apiserver's SidecarSet cache: nothing to test"
    );

    let _ = proxy.requests();
    // The apiserver's cache may move on again while the pods are created (CI saw three lists
    // once, under load): each version it stands at costs at most one list. Read after each
    // pod, as the fence reads it (which does not move it).
    let mut versions = vec![after];
    for _ in 0..10 {
        create_injected_pods(&pods, 1).await;
        let now = cache_version(&client).await;
        if versions.last() != Some(&now) {
            versions.push(now);
        }
    }
    let (fences, lists) = fences_and_lists(&proxy.requests());
    assert_eq!(fences, 10);
    assert!(
        (1..=versions.len()).contains(&lists),
        "{lists} lists for 10 pods while the apiserver's SidecarSet cache stood at {versions:?}: \
         the first pod lists, and the list's version is learnt for the pods after it"
    );
    eprintln!("{lists} list(s) for 10 pods; the cache stood at {versions:?}");
}

/// Decision 0046: with `--sidecarset-cache-fence=false` an admission sends the apiserver
/// nothing, and trusts the cache as it stands: a SidecarSet the watch has not delivered yet is
/// not injected (upstream's behaviour, the price of the option), and is once it arrives.
#[tokio::test]
async fn with_the_fence_off_a_pod_costs_no_read_and_gets_what_the_cache_holds() {
    let ns = "no-fence";
    let (_plane, client, proxy, _manager) = webhooks_behind_a_recording_proxy(ns, |webhook| {
        webhook.sidecarset_cache_reads = SidecarSetCacheReads::AsTheyStand;
    })
    .await;
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let _ = proxy.requests();
    create_injected_pods(&pods, 20).await;
    assert_eq!(
        fences_and_lists(&proxy.requests()),
        (0, 0),
        "fences and lists for 20 pods with the fence off"
    );

    proxy.hold_watch_events();
    Api::<SidecarSet>::all(client.clone())
        .create(&PostParams::default(), &sidecarset("late", "busybox:1.37"))
        .await
        .expect("SidecarSet late");
    let created = pods
        .create(&PostParams::default(), &pod())
        .await
        .expect("a pod while the cache lags");
    assert_eq!(
        created.annotations().get(INJECTED_LIST).map(String::as_str),
        Some("a,b,c"),
        "with the fence off, the cache is used as it stands"
    );
    proxy.release_watch_events();
    until_a_pod_gets(&pods, "a,b,c,late").await;
}

/// Creates a pod that must be refused (`while_`: what was wrong meanwhile); the refusal's text.
async fn refusal(pods: &Api<Pod>, while_: &str) -> String {
    match pods.create(&PostParams::default(), &pod()).await {
        Ok(created) => panic!("a pod admitted while {while_}: {:?}", containers(&created)),
        Err(e) => e.to_string(),
    }
}

/// How many pods `pods` holds.
async fn pod_count(pods: &Api<Pod>) -> usize {
    pods.list(&Default::default())
        .await
        .expect("listing the pods")
        .items
        .len()
}

/// Every request whose path and query contain `part` hangs (answered 504 a minute later).
fn hanging(part: &str) -> Faults {
    Faults {
        hang: 1.0,
        hang_for: Duration::from_secs(60),
        only_where: Some(part.to_owned()),
        ..Faults::default()
    }
}

/// The fence is the apiserver's to answer, and it may fail or never answer, and so may the read
/// of a SidecarSet the cache lacks. The webhook then refuses the pod itself, saying why, within
/// the apiserver's timeout for the call: under `failurePolicy: Ignore` an admission the
/// apiserver gave up on would create the pod without its sidecars, for good. Nothing is
/// created, and the next pod, once the reads answer, gets them.
#[tokio::test]
async fn a_read_that_fails_or_never_answers_refuses_the_pod_and_creates_nothing() {
    let ns = "fence-fails";
    let (_plane, client, proxy, _manager) = webhooks_behind_a_recording_proxy(ns, |webhook| {
        webhook.pod_failure_policy = FailurePolicy::Ignore;
    })
    .await;
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let count = || pod_count(&pods);
    let before = count().await;
    for (what, faults) in [
        (
            "an error",
            Faults {
                server_error: 1.0,
                only_where: Some(FENCE.to_owned()),
                ..Faults::default()
            },
        ),
        ("no answer", hanging(FENCE)),
    ] {
        let injected = proxy.injected().total();
        proxy.set(faults, 1000);
        let started = std::time::Instant::now();
        let message = refusal(&pods, &format!("the fence met {what}")).await;
        proxy.calm();
        assert!(
            message.contains("cannot confirm which SidecarSets may select this pod")
                && message.contains("reading the SidecarSets' resource version"),
            "the refusal for {what} says why: {message}"
        );
        assert!(
            proxy.injected().total() > injected,
            "no fence met {what}: the test tested nothing"
        );
        eprintln!(
            "the fence met {what}: refused after {:.1?}: {message}",
            started.elapsed()
        );
    }

    // The fence and the list answer, but the SidecarSet the cache lacks (its watch event held
    // back) cannot be read.
    proxy.hold_watch_events();
    Api::<SidecarSet>::all(client.clone())
        .create(&PostParams::default(), &sidecarset("late", "busybox:1.37"))
        .await
        .expect("SidecarSet late");
    proxy.set(hanging("/sidecarsets/late"), 1000);
    let message = refusal(&pods, "SidecarSet late could not be read").await;
    proxy.calm();
    assert!(
        message.contains("cannot confirm which SidecarSets may select this pod")
            && message.contains("reading SidecarSet late"),
        "the refusal says why: {message}"
    );
    assert_eq!(count().await, before, "pods created while refused");

    // A namespace the cache does not hold yet (its event held back too), whose labels cannot be
    // read.
    let fresh = "fence-fails-fresh";
    crate::harness::objects::create_namespace(&client, fresh, &[(WEBHOOK_NAMESPACE_LABEL, "true")])
        .await
        .expect("namespace");
    proxy.set(hanging(&format!("/namespaces/{fresh}")), 1000);
    let in_fresh = Api::<Pod>::namespaced(client.clone(), fresh);
    let message = refusal(&in_fresh, "its namespace's labels could not be read").await;
    proxy.calm();
    assert!(
        message.contains(&format!("cannot read the labels of namespace {fresh}")),
        "the refusal says why: {message}"
    );
    assert!(
        in_fresh
            .list(&Default::default())
            .await
            .expect("pods")
            .items
            .is_empty(),
        "a pod created while refused"
    );

    proxy.release_watch_events();
    until_a_pod_gets(&pods, "a,b,c,late").await;
    until_a_pod_gets(&in_fresh, "a,b,c,late").await;
}

/// Reads that each answer within their own bound (3 s) can still add up past the time the
/// apiserver gives the call: there, under `failurePolicy: Ignore`, the apiserver gave up and
/// created the pod without its sidecars. The webhook now decides within one deadline taken from
/// the call's `timeout` (4 s here, less a 1.5 s margin) and refuses the pod itself when it
/// passes (decision 0049).
#[tokio::test]
async fn slow_reads_that_add_up_past_the_apiservers_timeout_refuse_the_pod() {
    let ns = "slow-reads";
    let (_plane, client, proxy, _manager) = webhooks_behind_a_recording_proxy(ns, |webhook| {
        webhook.pod_failure_policy = FailurePolicy::Ignore;
        webhook.timeout_seconds = 4;
    })
    .await;
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let count = || pod_count(&pods);
    let before = count().await;
    // A SidecarSet the cache lacks (its watch event held back): the fence's version is one the
    // cache does not hold, so the pod needs the fence, a list and a read of `slow`, 2 s each.
    proxy.hold_watch_events();
    Api::<SidecarSet>::all(client.clone())
        .create(&PostParams::default(), &sidecarset("slow", "busybox:1.37"))
        .await
        .expect("SidecarSet slow");
    let delays = proxy.injected().delays;
    proxy.set(
        Faults {
            delay: 1.0,
            min_delay: Duration::from_secs(2),
            max_delay: Duration::from_secs(2),
            only_where: Some("/sidecarsets".to_owned()),
            ..Faults::default()
        },
        1000,
    );
    let started = std::time::Instant::now();
    let message = refusal(&pods, "its reads added up past the apiserver's timeout").await;
    let took = started.elapsed();
    proxy.calm();
    assert!(
        proxy.injected().delays > delays,
        "no read was delayed: the test tested nothing"
    );
    assert!(
        message.contains("kruise-rs could not decide within 2.5 s of the 4 s"),
        "the refusal says why: {message}"
    );
    assert!(
        took < Duration::from_secs(4),
        "refused after {took:?}, past the apiserver's timeout: the apiserver's refusal, not ours"
    );
    assert_eq!(count().await, before, "a pod created while refused");
    eprintln!("refused after {took:.1?}: {message}");
    proxy.release_watch_events();
    until_a_pod_gets(&pods, "a,b,c,slow").await;
}
