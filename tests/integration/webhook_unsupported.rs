//! A pod matching a SidecarSet that uses a feature kruise-rs does not serve (HotUpgrade without
//! `hotUpgradeEmptyImage`, which upstream admitted and we cannot inject: the idle twin would
//! have no image) is
//! admitted without that SidecarSet, through a real apiserver and the manager's webhook: the
//! other SidecarSets still inject, `kubectl` prints the admission warning, a Warning event is
//! recorded on the SidecarSet and the controller sets its `UnsupportedFeatures` condition. A
//! SidecarSet annotated `kruise-rs.io/unsupported-features: refuse` still refuses its pods.
//!
//! Our validating webhook denies such SidecarSets, so they exist only in clusters switching from
//! OpenKruise. The test plays that: on a control plane of its own, the SidecarSets are created
//! before the manager (with its webhooks) starts.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kruise_rs_api::sidecarset::SidecarSet;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use crate::sidecarset_upgrade::poll;
use crate::support::webhook::{WEBHOOK_NAMESPACE_LABEL, own_manager_with_webhooks};
use crate::support::{
    ExtraControlPlane, client_for, run_with_stdin, start_manager, wait_for_event,
};

const TIMEOUT: Duration = Duration::from_secs(60);

fn sidecarset(name: &str, app: &str, container: Value, refuse: bool) -> SidecarSet {
    let annotations = if refuse {
        json!({"kruise-rs.io/unsupported-features": "refuse"})
    } else {
        json!({})
    };
    serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "SidecarSet",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"selector": {"matchLabels": {"app": app}}, "containers": [container]}
    }))
    .expect("a SidecarSet")
}

fn hot_container() -> Value {
    json!({"name": "hot", "image": "busybox:1.36",
           "upgradeStrategy": {"upgradeType": "HotUpgrade"}})
}

fn pod(app: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "web-", "labels": {"app": app}},
        "spec": {"containers": [{"name": "main", "image": "nginx:1.25"}]}
    })
}

#[tokio::test]
async fn a_pod_is_admitted_without_a_sidecarset_using_an_unsupported_feature() {
    let plane = ExtraControlPlane::start_with_crds().await;
    let client = client_for(plane.kubeconfig_path()).await;

    // Left by upstream: created before kruise-rs's webhooks exist.
    let sets = Api::<SidecarSet>::all(client.clone());
    let create = PostParams::default();
    let normal_container = json!({"name": "logger", "image": "busybox:1.36"});
    for set in [
        sidecarset("hot", "web", hot_container(), false),
        sidecarset("normal", "web", normal_container, false),
        sidecarset("strict", "strict", hot_container(), true),
    ] {
        sets.create(&create, &set).await.expect("created");
    }

    let opts = own_manager_with_webhooks(plane.kubeconfig_path());
    let manager = start_manager(opts, TIMEOUT, "beside an unsupported SidecarSet").await;

    let ns = "unsupported";
    crate::harness::objects::create_namespace(&client, ns, &[(WEBHOOK_NAMESPACE_LABEL, "true")])
        .await
        .expect("namespace");

    // 1. Admitted with only the normal SidecarSet's sidecar, and the warning printed. Until the
    // apiserver has loaded the new webhook configuration, pods pass unchanged: try again.
    let (admitted, stderr) = poll("a pod through the webhook", TIMEOUT, || {
        let mut kubectl = plane.kubectl();
        kubectl.args(["create", "-n", ns, "-o", "json", "-f", "-"]);
        async move {
            let out = tokio::task::spawn_blocking(move || {
                run_with_stdin(kubectl, &pod("web").to_string())
            })
            .await
            .map_err(|e| e.to_string())?;
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            if !out.status.success() {
                return Err(format!("kubectl create failed: {stderr}"));
            }
            let admitted: Pod = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
            let injected = admitted
                .annotations()
                .contains_key("kruise.io/sidecarset-injected-list");
            if injected {
                Ok((admitted, stderr))
            } else {
                Err("a pod not seen by the webhook".to_owned())
            }
        }
    })
    .await;
    let containers: Vec<&str> = admitted
        .spec
        .as_ref()
        .expect("spec")
        .containers
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(containers, ["logger", "main"], "only the normal sidecar");
    assert_eq!(
        admitted
            .annotations()
            .get("kruise.io/sidecarset-injected-list")
            .map(String::as_str),
        Some("normal")
    );
    assert!(
        stderr.contains(
            "Warning: SidecarSet hot was not injected: container hot uses upgradeStrategy.upgradeType HotUpgrade without upgradeStrategy.hotUpgradeEmptyImage, so its idle twin would have no image"
        ),
        "{stderr}"
    );

    // A server-side dry run goes through the webhook too (`sideEffects: NoneOnDryRun`).
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let web: Pod = serde_json::from_value(pod("web")).expect("pod");
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let dry_run = pods
        .create(&dry, &web)
        .await
        .expect("a dry run is admitted");
    let containers = dry_run.spec.map(|s| s.containers.len());
    assert_eq!(containers, Some(2), "the normal sidecar and main");

    // 2. A Warning event on the SidecarSet (cluster-scoped: in `default`) naming the pod.
    let events = Api::<Event>::namespaced(client.clone(), "default");
    let event = wait_for_event(&events, "UnsupportedFeature", "hot", TIMEOUT).await;
    let note = (
        event.type_.unwrap_or_default(),
        event.note.unwrap_or_default(),
    );
    assert_eq!(note.0, "Warning");
    assert!(note.1.contains(&format!("pod {ns}/web-*")), "{}", note.1);
    assert!(note.1.contains("HotUpgrade"), "{}", note.1);

    // 3. The controller sets the condition from the spec.
    let condition = poll(
        "condition UnsupportedFeatures on SidecarSet hot",
        TIMEOUT,
        || {
            let sets = sets.clone();
            async move {
                let set = sets.get("hot").await.map_err(|e| e.to_string())?;
                set.status
                    .iter()
                    .flat_map(|s| s.conditions.iter())
                    .find(|c| c.type_ == "UnsupportedFeatures")
                    .cloned()
                    .ok_or_else(|| format!("status {:?}", set.status))
            }
        },
    )
    .await;
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("True", "HotUpgradeWithoutEmptyImage")
    );
    assert!(
        condition.message.contains("container hot"),
        "{}",
        condition.message
    );
    let normal = sets.get("normal").await.expect("normal");
    let conditions = normal.status.map(|s| s.conditions).unwrap_or_default();
    assert!(
        conditions.iter().all(|c| c.type_ != "UnsupportedFeatures"),
        "{conditions:?}"
    );

    // 4. Annotated to refuse: the pod is refused, naming the feature and the annotation.
    let strict: Pod = serde_json::from_value(pod("strict")).expect("pod");
    let message = match pods.create(&create, &strict).await {
        Err(kube::Error::Api(status)) => status.message,
        other => panic!("the strict SidecarSet's pod should be refused, got {other:?}"),
    };
    assert!(
        message.contains("SidecarSet strict")
            && message.contains("HotUpgrade")
            && message.contains("kruise-rs.io/unsupported-features=refuse"),
        "{message}"
    );

    let _ = manager.stop.send(());
    let stopped = tokio::time::timeout(TIMEOUT, manager.task).await;
    assert!(
        matches!(stopped, Ok(Ok(Ok(())))),
        "the manager stops cleanly: {stopped:?}"
    );
    drop(plane);
}
