//! The pod webhook must not take the cluster down (issue 20): a SidecarSet the manager cannot
//! read is skipped rather than blocking every admission and `/readyz`; an admission lists nothing
//! from the apiserver; namespaces and pods can opt out; a replica stopping with SIGTERM keeps
//! answering until the apiserver has stopped sending it requests.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kruise_rs::manager::ManagerOptions;
use kruise_rs::webhook::FailurePolicy;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::sidecarset_upgrade::poll;
use crate::support::webhook::{
    MANAGER_NAMESPACE, WEBHOOK_NAMESPACE_LABEL, own_manager_with_webhooks, webhook_options,
};
use crate::support::{
    ExtraControlPlane, RunningManager, client_for, free_loopback_port, manager_options,
    start_manager, test_controller_options, unique_name, wait_for_event,
};

const TIMEOUT: Duration = Duration::from_secs(60);

/// Writes a SidecarSet as JSON, bypassing our types (and, before the manager runs, its webhooks).
async fn create_raw_sidecarset(client: &Client, object: Value) {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apps.kruise.io", "v1beta1", "SidecarSet"),
        "sidecarsets",
    );
    let object: DynamicObject = serde_json::from_value(object).expect("a SidecarSet object");
    Api::<DynamicObject>::all_with(client.clone(), &resource)
        .create(&PostParams::default(), &object)
        .await
        .expect("the apiserver stores the SidecarSet");
}

/// How many LIST requests for ControllerRevisions the apiserver has served (its own counter).
async fn controllerrevision_lists(client: &Client) -> u64 {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("request");
    let text = client
        .request_text(request)
        .await
        .expect("the apiserver's metrics");
    text.lines()
        .filter(|line| {
            line.starts_with("apiserver_request_total{")
                && line.contains("resource=\"controllerrevisions\"")
                && line.contains("verb=\"LIST\"")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn web_pod(app: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "web-", "labels": {"app": app}},
        "spec": {"containers": [{"name": "main", "image": "nginx:1.25"}]}
    })
}

/// Whether the webhook injected the `logger` sidecar these tests' SidecarSets carry.
fn has_logger(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .is_some_and(|s| s.containers.iter().any(|c| c.name == "logger"))
}

/// Creates `body` until a pod comes back injected: the apiserver calls a webhook only once it
/// has loaded the configuration the manager wrote.
async fn wait_until_injected(pods: &Api<Pod>, body: &Pod, what: &str) {
    poll(what, TIMEOUT, || async {
        let pod = pods
            .create(&PostParams::default(), body)
            .await
            .map_err(|e| e.to_string())?;
        has_logger(&pod)
            .then_some(())
            .ok_or_else(|| "not injected yet".to_owned())
    })
    .await;
}

/// Issue 20: one SidecarSet the manager's type refuses (containers are schemaless in the CRD, so
/// the apiserver stores it) used to fail the webhook's and the controller's whole SidecarSet
/// list: never ready, every pod refused "webhook is starting". It is now reported on the object
/// and left out (decision 0018), and pods it might select are admitted with the other
/// SidecarSets. The same manager also shows that a pod admission lists no ControllerRevisions
/// although a SidecarSet pins a revision (they are cached).
#[tokio::test]
async fn an_unreadable_sidecarset_is_skipped_and_admissions_list_no_revisions() {
    let plane = ExtraControlPlane::start_with_crds().await;
    let client = client_for(plane.kubeconfig_path()).await;

    // Written before the manager (and its webhooks) run: selects every pod, and its container's
    // `ports` is not a list, which the schema admits and `Container` refuses.
    create_raw_sidecarset(
        &client,
        json!({
            "apiVersion": "apps.kruise.io/v1beta1", "kind": "SidecarSet",
            "metadata": {"name": "unreadable"},
            "spec": {"selector": {},
                     "containers": [{"name": "bad", "image": "busybox:1.36", "ports": "80"}]}
        }),
    )
    .await;
    // Pins a revision: the webhook reads its history for every pod, matching or not.
    create_raw_sidecarset(
        &client,
        json!({
            "apiVersion": "apps.kruise.io/v1beta1", "kind": "SidecarSet",
            "metadata": {"name": "pinned"},
            "spec": {"selector": {"matchLabels": {"app": "nothing-here"}},
                     "injectionStrategy": {"revision": {"customVersion": "v1"}},
                     "containers": [{"name": "pinned", "image": "busybox:1.36"}]}
        }),
    )
    .await;
    let app = unique_name("web");
    create_raw_sidecarset(
        &client,
        json!({
            "apiVersion": "apps.kruise.io/v1beta1", "kind": "SidecarSet",
            "metadata": {"name": "logger"},
            "spec": {"selector": {"matchLabels": {"app": &app}},
                     "containers": [{"name": "logger", "image": "busybox:1.36"}]}
        }),
    )
    .await;

    // The controllers watch every SidecarSet too, the unreadable one included.
    let opts = own_manager_with_webhooks(plane.kubeconfig_path());
    let manager = start_manager(opts, TIMEOUT, "beside an unreadable SidecarSet").await;

    let ns = unique_name("avail");
    crate::harness::objects::create_namespace(&client, &ns, &[(WEBHOOK_NAMESPACE_LABEL, "true")])
        .await
        .expect("namespace");
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let create_injected = || {
        let pods = pods.clone();
        let body: Pod = serde_json::from_value(web_pod(&app)).expect("pod");
        async move {
            let pod = pods
                .create(&PostParams::default(), &body)
                .await
                .map_err(|e| format!("refused: {e}"))?;
            let names: Vec<String> = pod
                .spec
                .iter()
                .flat_map(|s| &s.containers)
                .map(|c| c.name.clone())
                .collect();
            if names == ["logger", "main"] {
                Ok(())
            } else {
                Err(format!("containers {names:?}"))
            }
        }
    };
    // Until the apiserver has loaded the webhook configuration, pods pass unchanged.
    poll(
        "a pod injected with the readable SidecarSet only",
        TIMEOUT,
        create_injected,
    )
    .await;

    const PODS: u64 = 10;
    let before = controllerrevision_lists(&client).await;
    for _ in 0..PODS {
        create_injected().await.expect("admitted and injected");
    }
    let lists = controllerrevision_lists(&client).await - before;
    // One per pod before the cache; a relist of a watch could add one.
    assert!(
        lists < PODS,
        "{lists} LISTs of ControllerRevisions for {PODS} admissions"
    );

    // The unreadable SidecarSet is named in a Warning event on it.
    let events = Api::<Event>::all(client.clone());
    let event = wait_for_event(&events, "Unreadable", "unreadable", TIMEOUT).await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let note = event.note.unwrap_or_default();
    assert!(note.contains("cannot read this SidecarSet"), "{note}");
    assert!(
        pods.list(&Default::default())
            .await
            .expect("pods")
            .items
            .iter()
            .all(
                |p| p.annotations().get("kruise.io/sidecarset-injected-list")
                    == Some(&"logger".to_owned())
            ),
        "only the readable SidecarSet is injected"
    );

    let _ = manager.stop.send(());
    let stopped = tokio::time::timeout(TIMEOUT, manager.task)
        .await
        .expect("the manager stops")
        .expect("join");
    assert!(stopped.is_ok(), "{stopped:?}");
}

/// A stand-in for the webhook Service: connections to it go to a backend whose `/readyz`
/// answered 200 at the last check, made every [`ENDPOINTS_LAG`] (the endpoints controller and
/// kube-proxy are not faster than that). A connection with no ready backend is closed.
struct ServiceProxy {
    addr: std::net::SocketAddr,
    /// The backends connections go to now.
    ready: std::sync::Arc<std::sync::Mutex<Vec<std::net::SocketAddr>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

const ENDPOINTS_LAG: Duration = Duration::from_secs(1);

impl ServiceProxy {
    /// `backends`: each replica's webhook and probe addresses.
    async fn start(backends: Vec<(std::net::SocketAddr, std::net::SocketAddr)>) -> Self {
        use std::sync::{Arc, Mutex};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let addr = listener.local_addr().expect("address");
        let ready: Arc<Mutex<Vec<std::net::SocketAddr>>> = Arc::default();
        let endpoints = ready.clone();
        let watch = tokio::spawn(async move {
            loop {
                let mut now = Vec::new();
                for (webhook, probe) in &backends {
                    let probe = *probe;
                    let answer = tokio::task::spawn_blocking(move || {
                        crate::support::http_get(probe, "/readyz")
                    })
                    .await;
                    if matches!(answer, Ok(Ok((200, _)))) {
                        now.push(*webhook);
                    }
                }
                *endpoints.lock().unwrap_or_else(|e| e.into_inner()) = now;
                tokio::time::sleep(ENDPOINTS_LAG).await;
            }
        });
        let routing = ready.clone();
        let accept = tokio::spawn(async move {
            let mut next = 0usize;
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                let backend = {
                    let ready = ready.lock().unwrap_or_else(|e| e.into_inner());
                    next = next.wrapping_add(1);
                    (!ready.is_empty()).then(|| ready[next % ready.len()])
                };
                let Some(backend) = backend else { continue };
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(backend).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        ServiceProxy {
            addr,
            ready: routing,
            tasks: vec![watch, accept],
        }
    }
}

impl ServiceProxy {
    /// Waits until connections no longer go to `backend`.
    async fn wait_dropped(&self, backend: std::net::SocketAddr) {
        poll("the Service to drop the stopping replica", TIMEOUT, || {
            let routed = self
                .ready
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&backend);
            async move {
                if routed {
                    Err("still routed to".to_owned())
                } else {
                    Ok(())
                }
            }
        })
        .await;
    }
}

impl Drop for ServiceProxy {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// A manager replica with webhooks, reached through `service`.
async fn start_replica(
    plane: &ExtraControlPlane,
    webhook_addr: std::net::SocketAddr,
    probe_addr: std::net::SocketAddr,
    service: std::net::SocketAddr,
    grace: Duration,
) -> RunningManager {
    let mut webhook = webhook_options(webhook_addr, FailurePolicy::Fail);
    webhook.endpoint = kruise_rs::webhook::Endpoint::Url(format!("https://{service}"));
    webhook.shutdown_grace = grace;
    let opts = ManagerOptions {
        probe_addr,
        controllers: kruise_rs::controllers::ControllerOptions {
            namespace: MANAGER_NAMESPACE.to_owned(),
            ..test_controller_options()
        },
        webhook: Some(webhook),
        ..manager_options(plane.kubeconfig_path())
    };
    start_manager(opts, TIMEOUT, "a replica").await
}

/// Issue 20: a replica told to stop (what SIGTERM does: `main` resolves the manager's shutdown
/// future) used to stop serving at once, and admissions on their way to it failed ("write:
/// broken pipe" in the e2e lifecycle test). It now fails `/readyz` and keeps answering for its
/// grace period, closing each connection after its answer, so the apiserver moves to the other
/// replica: pods created in a loop meanwhile are all admitted, by the webhook, under `Fail`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_created_while_a_replica_stops_are_all_admitted() {
    let plane = ExtraControlPlane::start_with_crds().await;
    let client = client_for(plane.kubeconfig_path()).await;
    let app = unique_name("web");
    create_raw_sidecarset(
        &client,
        json!({
            "apiVersion": "apps.kruise.io/v1beta1", "kind": "SidecarSet",
            "metadata": {"name": "logger"},
            "spec": {"selector": {"matchLabels": {"app": &app}},
                     "containers": [{"name": "logger", "image": "busybox:1.36"}]}
        }),
    )
    .await;

    // Both replicas' addresses are known before either starts: the proxy needs them.
    let (webhook_a, probe_a) = (free_loopback_port(), free_loopback_port());
    let (webhook_b, probe_b) = (free_loopback_port(), free_loopback_port());
    let service = ServiceProxy::start(vec![(webhook_a, probe_a), (webhook_b, probe_b)]).await;
    let grace = Duration::from_secs(5);
    let a = start_replica(&plane, webhook_a, probe_a, service.addr, grace).await;
    let b = start_replica(&plane, webhook_b, probe_b, service.addr, grace).await;
    assert_eq!((a.probe_addr, b.probe_addr), (probe_a, probe_b));

    let ns = unique_name("avail-stop");
    crate::harness::objects::create_namespace(&client, &ns, &[(WEBHOOK_NAMESPACE_LABEL, "true")])
        .await
        .expect("namespace");
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let body: Pod = serde_json::from_value(web_pod(&app)).expect("pod");
    wait_until_injected(&pods, &body, "a pod injected through the proxy").await;

    // Four loops creating pods, from before replica A is told to stop until after it has.
    let creating = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let loops: Vec<_> = (0..4)
        .map(|_| {
            let (pods, body, creating) = (pods.clone(), body.clone(), creating.clone());
            tokio::spawn(async move {
                let (mut admitted, mut failures) = (0u32, Vec::new());
                while creating.load(std::sync::atomic::Ordering::Relaxed) {
                    match pods.create(&PostParams::default(), &body).await {
                        Ok(pod) if has_logger(&pod) => admitted += 1,
                        Ok(pod) => failures.push(format!("{} not injected", pod.name_any())),
                        Err(e) => failures.push(e.to_string()),
                    }
                }
                (admitted, failures)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stopping = std::time::Instant::now();
    let _ = a.stop.send(());
    // Requests may reach A until the Service has dropped it: A still answers then.
    service.wait_dropped(webhook_a).await;
    let served_until_dropped = std::net::TcpStream::connect(webhook_a).is_ok();
    let stopped = tokio::time::timeout(TIMEOUT, a.task).await;
    let took = stopping.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    creating.store(false, std::sync::atomic::Ordering::Relaxed);
    let (mut admitted, mut failures) = (0, Vec::new());
    for handle in loops {
        let (n, f) = handle.await.expect("join");
        admitted += n;
        failures.extend(f);
    }
    // Everything is stopped before asserting.
    let _ = b.stop.send(());
    let _ = tokio::time::timeout(TIMEOUT, b.task).await;
    drop(service);
    assert!(
        matches!(stopped, Ok(Ok(Ok(())))),
        "replica A stops cleanly: {stopped:?}"
    );
    assert!(
        served_until_dropped,
        "replica A stopped serving before the Service dropped it"
    );
    println!(
        "{admitted} pods admitted while replica A stopped (in {took:?}); {} failed",
        failures.len()
    );
    assert!(
        took >= grace,
        "replica A stopped after {took:?}, before its grace"
    );
    assert!(admitted > 20, "only {admitted} pods were created");
    assert!(
        failures.is_empty(),
        "{} failed: {failures:?}",
        failures.len()
    );
}

/// The `ca.crt` of the webhook certificate Secret, if it exists.
async fn secret_ca(client: &Client) -> Option<String> {
    let secret =
        Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), MANAGER_NAMESPACE)
            .get_opt(CERT_SECRET)
            .await
            .expect("read the certificate Secret")?;
    let data = secret.data?;
    String::from_utf8(data.get("ca.crt")?.0.clone()).ok()
}

const CERT_SECRET: &str = "kruise-rs-webhook-certs";

/// Whether the webhook on `addr` serves a certificate that `ca` (PEM) signed, for `127.0.0.1`:
/// a TLS handshake trusting `ca` alone.
fn serves_certificate_of(addr: std::net::SocketAddr, ca: &str) -> Result<(), String> {
    use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots
            .add(cert.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = ServerName::try_from("127.0.0.1").map_err(|e| e.to_string())?;
    let mut tls = rustls::ClientConnection::new(std::sync::Arc::new(config), name)
        .map_err(|e| e.to_string())?;
    let mut socket = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| e.to_string())?;
    socket
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    while tls.is_handshaking() {
        tls.complete_io(&mut socket)
            .map_err(|e| format!("{addr}: {e}"))?;
    }
    Ok(())
}

/// Pod admissions a replica has answered (its `kruise_rs_manager_admissions_total` for pods).
async fn pod_admissions(probe: std::net::SocketAddr) -> f64 {
    let text = crate::support::scrape::scrape(probe).await;
    text.lines()
        .filter(|line| {
            line.starts_with("kruise_rs_manager_admissions_total{")
                && line.contains("kind=\"pods\"")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Clears its flag when dropped.
struct StopOnDrop(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Issue 42: deleting the certificate Secret used to go unnoticed until a replica restarted (the
/// Secret was polled every six hours), and then that replica put its new CA alone in `caBundle`
/// while the other served a certificate of the old one: the apiserver's TLS to it failed and,
/// under `Fail`, pods were refused. The Secret is now watched: a replica recreates it at once
/// with a new CA, `caBundle` holds the new and the old CA, and each replica serves its new
/// certificate only after that bundle is published. Pods created in a loop across the deletion
/// are all admitted; meanwhile each replica, handshaken directly, always serves a certificate
/// the published `caBundle` trusts (the apiserver speaks HTTP/2 to the webhook and may keep its
/// one connection on either replica); both end on the new CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_created_while_the_certificate_secret_is_deleted_are_all_admitted() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    let plane = ExtraControlPlane::start_with_crds().await;
    let client = client_for(plane.kubeconfig_path()).await;
    let app = unique_name("web");
    create_raw_sidecarset(
        &client,
        json!({
            "apiVersion": "apps.kruise.io/v1beta1", "kind": "SidecarSet",
            "metadata": {"name": "logger"},
            "spec": {"selector": {"matchLabels": {"app": &app}},
                     "containers": [{"name": "logger", "image": "busybox:1.36"}]}
        }),
    )
    .await;
    let (webhook_a, probe_a) = (free_loopback_port(), free_loopback_port());
    let (webhook_b, probe_b) = (free_loopback_port(), free_loopback_port());
    let service = ServiceProxy::start(vec![(webhook_a, probe_a), (webhook_b, probe_b)]).await;
    let a = start_replica(&plane, webhook_a, probe_a, service.addr, Duration::ZERO).await;
    let b = start_replica(&plane, webhook_b, probe_b, service.addr, Duration::ZERO).await;

    let ns = unique_name("avail-ca");
    crate::harness::objects::create_namespace(&client, &ns, &[(WEBHOOK_NAMESPACE_LABEL, "true")])
        .await
        .expect("namespace");
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let body: Pod = serde_json::from_value(web_pod(&app)).expect("pod");
    wait_until_injected(&pods, &body, "a pod injected through the proxy").await;
    let old_ca = secret_ca(&client)
        .await
        .expect("the replicas wrote the Secret");

    let creating = Arc::new(AtomicBool::new(true));
    // Stops the loops however the test ends (a panic included: they would spin on a stopped
    // apiserver and keep the runtime from shutting down).
    let stop_creating = StopOnDrop(creating.clone());
    let admitted = Arc::new(AtomicU32::new(0));
    let loops: Vec<_> = (0..4)
        .map(|_| {
            let (pods, body) = (pods.clone(), body.clone());
            let (creating, admitted) = (creating.clone(), admitted.clone());
            tokio::spawn(async move {
                let mut failures = Vec::new();
                while creating.load(Ordering::Relaxed) {
                    match pods.create(&PostParams::default(), &body).await {
                        Ok(pod) if has_logger(&pod) => {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(pod) => failures.push(format!("{} not injected", pod.name_any())),
                        Err(e) => failures.push(e.to_string()),
                    }
                }
                failures
            })
        })
        .collect();
    // Whatever replica the apiserver's connections reach: every moment, each replica serves a
    // certificate the published caBundle trusts (what the apiserver checks on each new
    // connection).
    let monitor = {
        let (client, creating) = (client.clone(), creating.clone());
        tokio::spawn(async move {
            let configurations = Api::<
                k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration,
            >::all(client);
            let (mut checks, mut untrusted) = (0u32, Vec::new());
            while creating.load(Ordering::Relaxed) {
                let bundle = configurations
                    .get("kruise-rs-mutating-webhook-configuration")
                    .await
                    .ok()
                    .and_then(|c| c.webhooks?.first()?.client_config.ca_bundle.clone())
                    .and_then(|b| String::from_utf8(b.0).ok())
                    .unwrap_or_default();
                for (replica, addr) in [("A", webhook_a), ("B", webhook_b)] {
                    let bundle = bundle.clone();
                    let served =
                        tokio::task::spawn_blocking(move || serves_certificate_of(addr, &bundle))
                            .await
                            .expect("join");
                    checks += 1;
                    if let Err(e) = served {
                        untrusted.push(format!("replica {replica}: {e}"));
                    }
                }
                // Pacing between rounds, not a wait for a condition.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (checks, untrusted)
        })
    };
    let admitted_at_least = |n: u32| {
        let admitted = admitted.clone();
        move || {
            let now = admitted.load(Ordering::Relaxed);
            async move {
                (now >= n)
                    .then_some(())
                    .ok_or_else(|| format!("{now} admitted"))
            }
        }
    };
    poll(
        "pods admitted before the deletion",
        TIMEOUT,
        admitted_at_least(20),
    )
    .await;

    let (before_a, before_b) = (pod_admissions(probe_a).await, pod_admissions(probe_b).await);
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), MANAGER_NAMESPACE)
        .delete(CERT_SECRET, &Default::default())
        .await
        .expect("delete the certificate Secret");
    let new_ca = poll("the Secret recreated with a new CA", TIMEOUT, || async {
        match secret_ca(&client).await {
            Some(ca) if ca != old_ca => Ok(ca),
            Some(_) => Err("the old CA".to_owned()),
            None => Err("no Secret".to_owned()),
        }
    })
    .await;
    for (replica, addr) in [("A", webhook_a), ("B", webhook_b)] {
        let ca = new_ca.clone();
        poll(
            &format!("replica {replica} serving a certificate of the new CA"),
            TIMEOUT,
            || {
                let ca = ca.clone();
                async move {
                    tokio::task::spawn_blocking(move || serves_certificate_of(addr, &ca))
                        .await
                        .map_err(|e| e.to_string())?
                }
            },
        )
        .await;
    }
    // Admissions go on after the move (the apiserver's connection may sit on either replica:
    // the monitor checks both).
    let moved = admitted.load(Ordering::Relaxed);
    poll(
        "pods admitted after the move",
        TIMEOUT,
        admitted_at_least(moved + 20),
    )
    .await;
    let (after_a, after_b) = (pod_admissions(probe_a).await, pod_admissions(probe_b).await);

    let bundle =
        Api::<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration>::all(
            client.clone(),
        )
        .get("kruise-rs-mutating-webhook-configuration")
        .await
        .expect("the mutating configuration")
        .webhooks
        .and_then(|w| w.first()?.client_config.ca_bundle.clone())
        .expect("a caBundle");
    drop(stop_creating);
    let mut failures = Vec::new();
    for handle in loops {
        failures.extend(handle.await.expect("join"));
    }
    for replica in [a, b] {
        let _ = replica.stop.send(());
        let _ = tokio::time::timeout(TIMEOUT, replica.task).await;
    }
    drop(service);
    let (checks, untrusted) = monitor.await.expect("join");
    let total = admitted.load(Ordering::Relaxed);
    println!(
        "{total} pods admitted across the CA rotation (pod admissions by replica A {before_a} \
         before the deletion, {after_a} after the move; B {before_b}, {after_b}); {} failed; \
         {checks} handshakes with the published caBundle, {} refused",
        failures.len(),
        untrusted.len()
    );
    assert!(
        failures.is_empty(),
        "{} failed, the first: {:?}",
        failures.len(),
        failures.first()
    );
    assert!(
        untrusted.is_empty(),
        "{} handshakes refused, the first: {:?}",
        untrusted.len(),
        untrusted.first()
    );
    assert!(checks > 20, "only {checks} handshakes");
    assert_eq!(
        String::from_utf8(bundle.0).expect("PEM"),
        format!("{new_ca}{old_ca}"),
        "caBundle: the new CA, then the old one"
    );
}

/// Issue 20: upstream's opt-out. A namespace labelled `control-plane` is not sent to the pod
/// webhook, so its pods are created even while the webhook is down under `Fail`; beside it, a
/// namespace without the label has its pods refused (the webhook is consulted, and down).
#[tokio::test]
async fn a_namespace_labelled_control_plane_is_not_sent_to_the_pod_webhook() {
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use kruise_rs::webhook::{ConfigurationParams, Endpoint};

    let cluster = crate::support::webhook::webhook_cluster();
    let client = cluster.client().await;
    // Only this test's namespaces carry `label`; nothing listens on `down`.
    let label = unique_name("opt-out");
    let down = free_loopback_port();
    let params = ConfigurationParams {
        name_prefix: unique_name("down"),
        endpoint: Endpoint::Url(format!("https://{down}")),
        ca_bundle: None,
        pod_failure_policy: FailurePolicy::Fail,
        timeout_seconds: 2,
        excluded_namespaces: vec![MANAGER_NAMESPACE.to_owned()],
        pod_namespace_selector: Some(LabelSelector {
            match_labels: Some([(label.clone(), "true".to_owned())].into()),
            ..LabelSelector::default()
        }),
        pod_object_selector: None,
    };
    // Only the pod webhook: the kruise kinds' webhooks see every namespace and would refuse
    // the other tests' objects while this one points nowhere.
    let mut configuration = params.mutating();
    if let Some(webhooks) = configuration.webhooks.as_mut() {
        webhooks.retain(|w| w.name == "mutate-pods.kruise-rs.io");
    }
    let configurations = Api::<MutatingWebhookConfiguration>::all(client.clone());
    configurations
        .create(&PostParams::default(), &configuration)
        .await
        .expect("the configuration");
    let sent = unique_name("sent");
    let opted_out = unique_name("opted-out");
    for (ns, labels) in [
        (&sent, vec![(label.as_str(), "true")]),
        (
            &opted_out,
            vec![(label.as_str(), "true"), ("control-plane", "")],
        ),
    ] {
        crate::harness::objects::create_namespace(&client, ns, &labels)
            .await
            .expect("namespace");
    }
    let body: Pod = serde_json::from_value(web_pod("opt-out")).expect("pod");
    let create = |ns: &str| {
        let pods = Api::<Pod>::namespaced(client.clone(), ns);
        let body = body.clone();
        async move { pods.create(&PostParams::default(), &body).await }
    };
    // Once the apiserver has loaded the configuration, the webhook's absence refuses pods.
    poll(
        "a pod refused for the webhook being down",
        TIMEOUT,
        || async {
            match create(&sent).await {
                Err(kube::Error::Api(status))
                    if status.message.contains("failed calling webhook") =>
                {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let admitted = create(&opted_out).await;
    let _ = configurations
        .delete(&params.mutating_name(), &Default::default())
        .await;
    admitted.expect("a pod in a namespace labelled control-plane is admitted");
}

/// The measurement behind the webhook timeout (decision 0018): 300 pod creations, each through
/// the pod webhook with a SidecarSet to inject, on the local control plane. Prints p50/p99/max
/// of the whole create (apiserver, webhook call, etcd): an upper bound of the webhook's share.
/// The timeout (10 s) must stay far above the p99.
#[tokio::test]
async fn pod_admission_latency_is_far_below_the_webhook_timeout() {
    let cluster = crate::support::webhook::webhook_cluster();
    let client = cluster.client().await;
    let ns = cluster.namespace("avail-latency").await;
    let app = unique_name("lat");
    create_raw_sidecarset(
        &client,
        json!({
            "apiVersion": "apps.kruise.io/v1beta1", "kind": "SidecarSet",
            "metadata": {"name": unique_name("lat")},
            "spec": {"selector": {"matchLabels": {"app": &app}},
                     "containers": [{"name": "logger", "image": "busybox:1.36"}]}
        }),
    )
    .await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let body: Pod = serde_json::from_value(web_pod(&app)).expect("pod");
    wait_until_injected(&pods, &body, "a pod injected").await;
    let mut took = Vec::new();
    for _ in 0..300 {
        let start = std::time::Instant::now();
        let pod = pods
            .create(&PostParams::default(), &body)
            .await
            .expect("admitted");
        took.push(start.elapsed());
        assert!(has_logger(&pod));
    }
    took.sort();
    let at = |q: f64| took[((took.len() as f64 * q) as usize).min(took.len() - 1)];
    println!(
        "pod create through the webhook, {} pods: p50 {:?}, p99 {:?}, max {:?}",
        took.len(),
        at(0.5),
        at(0.99),
        took[took.len() - 1]
    );
    assert!(at(0.99) < Duration::from_secs(1), "p99 {:?}", at(0.99));
}
