//! Pods an unreadable SidecarSet may select (issue 42, item 9; decision 0027). The SidecarSet
//! is written before the manager runs (so no webhook validates it), with a container the
//! manager's type refuses and a selection that reads as raw JSON: one namespace, one label.
//! By default a pod it selects is admitted with a warning naming it and the field path;
//! with `--unreadable-sidecarset-policy=refuse` it is refused with the same names; a pod it
//! cannot select (another namespace, other labels) is admitted either way.

use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use kruise_rs::manager::ManagerOptions;
use kruise_rs::webhook::{FailurePolicy, UnreadableSidecarSetPolicy};
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};

use crate::sidecarset_upgrade::poll;
use crate::support::webhook::{MANAGER_NAMESPACE, WEBHOOK_NAMESPACE_LABEL, webhook_options};
use crate::support::{
    Created, ExtraControlPlane, RunningManager, client_for, create_with_warnings,
    free_loopback_port, manager_options, start_manager, test_controller_options, unique_name,
    wait_for_event,
};

const TIMEOUT: Duration = Duration::from_secs(60);

/// What the unreadable SidecarSet's error says: the field, then serde's words.
const UNREADABLE_FIELD: &str =
    "spec.containers[0].ports: invalid type: string \"80\", expected a sequence";

/// The cluster as the tests find it: a control plane whose apiserver holds, written before
/// the manager (and so its webhooks) ran, an unreadable SidecarSet selecting `app` pods in
/// `selected_ns` and a readable one (`logger`) selecting `app` pods anywhere, which shows when
/// the webhook is in place.
struct Scene {
    _plane: ExtraControlPlane,
    client: Client,
    manager: RunningManager,
    unreadable: String,
    app: String,
    selected_ns: String,
    other_ns: String,
}

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

async fn scene(policy: UnreadableSidecarSetPolicy) -> Scene {
    let plane = ExtraControlPlane::start_with_crds().await;
    let client = client_for(plane.kubeconfig_path()).await;
    let unreadable = unique_name("unreadable");
    let app = unique_name("web");
    let selected_ns = unique_name("selected");
    let other_ns = unique_name("other");
    // `ports` is not a list: the schema (containers are schemaless) admits it, `Container`
    // refuses it. Its selection fields read.
    create_raw_sidecarset(
        &client,
        json!({
            "apiVersion": "apps.kruise.io/v1beta1", "kind": "SidecarSet",
            "metadata": {"name": &unreadable},
            "spec": {"namespace": &selected_ns,
                     "selector": {"matchLabels": {"app": &app}},
                     "containers": [{"name": "bad", "image": "busybox:1.36", "ports": "80"}]}
        }),
    )
    .await;
    create_raw_sidecarset(
        &client,
        json!({
            "apiVersion": "apps.kruise.io/v1beta1", "kind": "SidecarSet",
            "metadata": {"name": unique_name("logger")},
            "spec": {"selector": {"matchLabels": {"app": &app}},
                     "containers": [{"name": "logger", "image": "busybox:1.36"}]}
        }),
    )
    .await;
    let mut webhook = webhook_options(free_loopback_port(), FailurePolicy::Fail);
    webhook.unreadable_sidecarset_policy = policy;
    let opts = ManagerOptions {
        controllers: kruise_rs::controllers::ControllerOptions {
            namespace: MANAGER_NAMESPACE.to_owned(),
            ..test_controller_options()
        },
        webhook: Some(webhook),
        ..manager_options(plane.kubeconfig_path())
    };
    let manager = start_manager(opts, TIMEOUT, "beside an unreadable SidecarSet").await;
    for ns in [&selected_ns, &other_ns] {
        crate::harness::objects::create_namespace(
            &client,
            ns,
            &[(WEBHOOK_NAMESPACE_LABEL, "true")],
        )
        .await
        .expect("namespace");
    }
    Scene {
        _plane: plane,
        client,
        manager,
        unreadable,
        app,
        selected_ns,
        other_ns,
    }
}

impl Scene {
    async fn create_pod(&self, namespace: &str, app: &str) -> Created {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "web-", "labels": {"app": app}},
            "spec": {"containers": [{"name": "main", "image": "nginx:1.25"}]}
        });
        create_with_warnings(
            &self.client,
            &format!("/api/v1/namespaces/{namespace}/pods"),
            &pod,
        )
        .await
    }

    /// The warnings about the unreadable SidecarSet.
    fn about_it<'a>(&self, created: &'a Created) -> Vec<&'a String> {
        created
            .warnings
            .iter()
            .filter(|w| w.contains(&self.unreadable))
            .collect()
    }

    async fn stop(self) {
        let _ = self.manager.stop.send(());
        let _ = tokio::time::timeout(TIMEOUT, self.manager.task).await;
    }
}

fn injected(created: &Created) -> bool {
    created.body["spec"]["containers"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["name"] == "logger"))
}

#[tokio::test]
async fn a_pod_an_unreadable_sidecarset_selects_is_admitted_with_a_warning_naming_it() {
    let scene = scene(UnreadableSidecarSetPolicy::Admit).await;
    // Until the apiserver has loaded the webhook configuration, pods pass unchanged.
    let selected = poll("a pod through the webhook", TIMEOUT, || async {
        let created = scene.create_pod(&scene.selected_ns, &scene.app).await;
        if created.code == 201 && injected(&created) {
            Ok(created)
        } else {
            Err(format!("{}: {}", created.code, created.message()))
        }
    })
    .await;
    let warnings = scene.about_it(&selected);
    assert_eq!(warnings.len(), 1, "{:?}", selected.warnings);
    assert!(
        warnings[0].contains(&format!(
            "SidecarSet \"{}\" cannot be read ({UNREADABLE_FIELD}) and selects this pod",
            scene.unreadable
        )) && warnings[0].contains("admitted without its sidecars"),
        "{}",
        warnings[0]
    );

    // Not selected: another namespace (the readable SidecarSet still injects), other labels.
    let elsewhere = scene.create_pod(&scene.other_ns, &scene.app).await;
    assert_eq!(elsewhere.code, 201, "{}", elsewhere.message());
    assert!(injected(&elsewhere), "the readable SidecarSet injects");
    assert!(
        scene.about_it(&elsewhere).is_empty(),
        "{:?}",
        elsewhere.warnings
    );
    let other_labels = scene.create_pod(&scene.selected_ns, "db").await;
    assert_eq!(other_labels.code, 201, "{}", other_labels.message());
    assert!(
        scene.about_it(&other_labels).is_empty(),
        "{:?}",
        other_labels.warnings
    );

    // The SidecarSet's Warning event names the field too.
    let events = Api::<Event>::all(scene.client.clone());
    let event = wait_for_event(&events, "Unreadable", &scene.unreadable, TIMEOUT).await;
    let note = event.note.unwrap_or_default();
    assert!(note.contains(UNREADABLE_FIELD), "{note}");
    scene.stop().await;
}

#[tokio::test]
async fn with_the_refuse_policy_a_pod_an_unreadable_sidecarset_may_select_is_refused() {
    let scene = scene(UnreadableSidecarSetPolicy::Refuse).await;
    // Until the apiserver has loaded the webhook configuration, pods pass unchanged.
    let refused = poll("a pod refused by the webhook", TIMEOUT, || async {
        let created = scene.create_pod(&scene.selected_ns, &scene.app).await;
        if created.code == 201 {
            Err("admitted (the webhook is not in place yet?)".to_owned())
        } else {
            Ok(created)
        }
    })
    .await;
    assert_eq!(refused.code, 403, "{}", refused.message());
    let message = refused.message();
    assert!(
        message.contains(&format!(
            "SidecarSet \"{}\" cannot be read ({UNREADABLE_FIELD}) and selects this pod",
            scene.unreadable
        )) && message.contains("--unreadable-sidecarset-policy=refuse"),
        "{message}"
    );

    // Pods it cannot select are admitted, and injected by the readable SidecarSet.
    let elsewhere = scene.create_pod(&scene.other_ns, &scene.app).await;
    assert_eq!(elsewhere.code, 201, "{}", elsewhere.message());
    assert!(injected(&elsewhere), "the readable SidecarSet injects");
    let other_labels = scene.create_pod(&scene.selected_ns, "db").await;
    assert_eq!(other_labels.code, 201, "{}", other_labels.message());
    scene.stop().await;
}
