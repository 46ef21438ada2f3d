//! The pod webhook must not take the cluster down (issue 20): a SidecarSet the manager cannot
//! read is skipped rather than blocking every admission and `/readyz`; an admission lists nothing
//! from the apiserver; namespaces and pods can opt out; a replica stopping with SIGTERM keeps
//! answering until the apiserver has stopped sending it requests.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kruise_rs::manager::{self, ManagerOptions};
use kruise_rs::webhook::FailurePolicy;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::sidecarset_upgrade::poll;
use crate::support::webhook::{MANAGER_NAMESPACE, WEBHOOK_NAMESPACE_LABEL, webhook_options};
use crate::support::{
    ExtraControlPlane, client_for, free_loopback_port, test_controller_options, unique_name,
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

/// Issue 20: one SidecarSet the manager's type refuses (containers are schemaless in the CRD, so
/// the apiserver stores it) used to fail the webhook's and the controller's whole SidecarSet
/// list: never ready, every pod refused "webhook is starting". It is now reported on the object
/// and left out (decision 0018), and pods it might select are admitted with the other
/// SidecarSets. The same manager also shows that a pod admission lists no ControllerRevisions
/// although a SidecarSet pins a revision (they are cached).
#[tokio::test]
async fn an_unreadable_sidecarset_is_skipped_and_admissions_list_no_revisions() {
    let plane = tokio::task::spawn_blocking(|| {
        let plane = ExtraControlPlane::start();
        plane.install_crds();
        plane
    })
    .await
    .expect("join");
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

    let (ready_tx, ready_rx) = oneshot::channel();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let opts = ManagerOptions {
        kubeconfig: Some(plane.kubeconfig_path().to_owned()),
        probe_addr: "127.0.0.1:0".parse().expect("address"),
        controllers: kruise_rs::controllers::ControllerOptions {
            namespace: MANAGER_NAMESPACE.to_owned(),
            // The controllers watch every SidecarSet too, the unreadable one included.
            label_selector: None,
            ..test_controller_options()
        },
        webhook: Some(webhook_options(free_loopback_port(), FailurePolicy::Fail)),
        leader_election: None,
        streaming_lists: Default::default(),
    };
    let manager = tokio::spawn(manager::run(
        opts,
        async move {
            let _ = stop_rx.await;
        },
        Some(ready_tx),
    ));
    tokio::time::timeout(TIMEOUT, ready_rx)
        .await
        .expect("the manager becomes ready beside an unreadable SidecarSet")
        .expect("the manager reports ready");

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
    poll(
        "a Warning event on the unreadable SidecarSet",
        TIMEOUT,
        || {
            let events = events.clone();
            async move {
                let list = events
                    .list(&Default::default())
                    .await
                    .map_err(|e| e.to_string())?;
                list.items
                    .iter()
                    .find(|e| {
                        e.reason.as_deref() == Some("Unreadable")
                            && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                                == Some("unreadable")
                    })
                    .map(|e| {
                        assert_eq!(e.type_.as_deref(), Some("Warning"));
                        assert!(
                            e.note
                                .as_deref()
                                .unwrap_or_default()
                                .contains("cannot read this SidecarSet"),
                            "{:?}",
                            e.note
                        );
                    })
                    .ok_or_else(|| format!("{} events, none about it", list.items.len()))
            }
        },
    )
    .await;
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

    let _ = stop_tx.send(());
    let stopped = tokio::time::timeout(TIMEOUT, manager)
        .await
        .expect("the manager stops")
        .expect("join");
    assert!(stopped.is_ok(), "{stopped:?}");
}
