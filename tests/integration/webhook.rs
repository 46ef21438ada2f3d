//! The admission webhooks through a real kube-apiserver: the manager serves them on
//! `https://127.0.0.1:<port>` with its self-managed certificates, and the apiserver calls it for
//! every pod, SidecarSet, ImagePullJob and NodeImage written here (see `support::webhook`).

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kruise_rs::webhook::{ConfigurationParams, Endpoint, FailurePolicy};
use kruise_rs_api::imagepulljob::ImagePullJob;
use kruise_rs_api::nodeimage::NodeImage;
use kruise_rs_api::sidecarset::SidecarSet;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::support::unique_name;
use crate::support::webhook::webhook_cluster;
use crate::webhook_scenarios::admit_until;

async fn client() -> Client {
    webhook_cluster().client().await
}

fn sidecarset(name: &str, selector: Value, containers: Value) -> SidecarSet {
    serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "SidecarSet",
        "metadata": {"name": name},
        "spec": {"selector": selector, "containers": containers}
    }))
    .expect("a SidecarSet")
}

fn pod(name: &str, labels: Value, containers: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": containers}
    }))
    .expect("a pod")
}

/// An ImagePullJob of busybox, with `extra_spec` merged into its spec.
fn imagepulljob(name: &str, extra_spec: Value) -> ImagePullJob {
    let mut spec = json!({"image": "busybox:1.36"});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra_spec.as_object()) {
        spec.extend(extra.clone());
    }
    serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1", "kind": "ImagePullJob",
        "metadata": {"name": name}, "spec": spec
    }))
    .expect("an ImagePullJob")
}

/// The message of an API error, or a panic naming what was expected to fail.
fn denial<T: std::fmt::Debug>(result: Result<T, kube::Error>, what: &str) -> String {
    match result {
        Err(kube::Error::Api(status)) => status.message,
        other => panic!("{what} should have been denied, got {other:?}"),
    }
}

#[tokio::test]
async fn a_pod_gets_its_sidecar_and_the_annotations_upstream_writes() {
    let cluster = webhook_cluster();
    let client = client().await;
    let ns = cluster.namespace("wh-inject").await;
    let app = unique_name("app");
    let name = unique_name("logger");
    let created = Api::<SidecarSet>::all(client.clone())
        .create(
            &PostParams::default(),
            &sidecarset(
                &name,
                json!({"matchLabels": {"app": &app}}),
                json!([{"name": "logger", "image": "busybox:1.36", "command": ["sleep", "999"]}]),
            ),
        )
        .await
        .expect("the SidecarSet is admitted");
    // Defaulted and hashed by the mutating webhook.
    let annotations = created.annotations();
    assert!(
        annotations.contains_key("kruise.io/sidecarset-hash"),
        "{annotations:?}"
    );
    assert!(annotations.contains_key("kruise.io/sidecarset-hash-without-image"));
    let container = &created.spec.containers[0];
    assert_eq!(
        container.container.image_pull_policy.as_deref(),
        Some("IfNotPresent")
    );

    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    // The webhook learns of the new SidecarSet through its watch: until then pods pass unchanged.
    let template = serde_json::to_value(pod(
        "web",
        json!({"app": &app}),
        json!([{"name": "main", "image": "nginx:1.25"}]),
    ))
    .expect("pod JSON");
    let admitted = admit_until(
        &pods,
        &template,
        "a pod injected with the new SidecarSet",
        |p| p.spec.as_ref().is_some_and(|s| s.containers.len() > 1),
    )
    .await;
    let names: Vec<&str> = admitted
        .spec
        .as_ref()
        .expect("spec")
        .containers
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        names,
        ["logger", "main"],
        "BeforeAppContainer puts the sidecar first"
    );
    let logger = &admitted.spec.as_ref().unwrap().containers[0];
    assert!(
        logger.env.as_ref().is_some_and(|env| env
            .iter()
            .any(|e| e.name == "IS_INJECTED" && e.value.as_deref() == Some("true"))),
        "{logger:?}"
    );
    let annotations = admitted.annotations();
    let hashes: Value =
        serde_json::from_str(&annotations["kruise.io/sidecarset-hash"]).expect("JSON");
    assert_eq!(hashes[&name]["sidecarSetName"], name.as_str());
    assert_eq!(hashes[&name]["sidecarList"], json!(["logger"]));
    assert_eq!(
        hashes[&name]["hash"].as_str(),
        created
            .annotations()
            .get("kruise.io/sidecarset-hash")
            .map(String::as_str)
    );
    assert_eq!(annotations["kruise.io/sidecarset-injected-list"], name);

    // A pod the SidecarSet does not select is left alone.
    let plain = pods
        .create(
            &PostParams::default(),
            &pod(
                "other",
                json!({"app": "other"}),
                json!([{"name": "main", "image": "nginx:1.25"}]),
            ),
        )
        .await
        .expect("admitted");
    assert_eq!(plain.spec.as_ref().unwrap().containers.len(), 1);
    assert!(
        !plain
            .annotations()
            .contains_key("kruise.io/sidecarset-hash")
    );
}

#[tokio::test]
async fn invalid_sidecarsets_are_denied_with_the_field_named() {
    let client = client().await;
    let sets = Api::<SidecarSet>::all(client.clone());
    let name = unique_name("bad");
    let mount_without_volume = sidecarset(
        &name,
        json!({"matchLabels": {"app": "x"}}),
        json!([{"name": "c", "image": "busybox", "volumeMounts": [{"name": "missing", "mountPath": "/m"}]}]),
    );
    let message = denial(
        sets.create(&PostParams::default(), &mount_without_volume)
            .await,
        "a mount of a missing volume",
    );
    assert!(
        message.contains("spec.containers[0].volumeMounts[0].name"),
        "{message}"
    );

    let hot = sidecarset(
        &unique_name("hot"),
        json!({"matchLabels": {"app": "x"}}),
        json!([{"name": "c", "image": "busybox", "upgradeStrategy": {"upgradeType": "HotUpgrade"}}]),
    );
    let message = denial(
        sets.create(&PostParams::default(), &hot).await,
        "HotUpgrade without hotUpgradeEmptyImage",
    );
    assert!(
        message.contains("spec.containers[0].upgradeStrategy.hotUpgradeEmptyImage: Required value"),
        "{message}"
    );

    let empty_selector = sidecarset(
        &unique_name("empty"),
        json!({}),
        json!([{"name": "c", "image": "busybox"}]),
    );
    let message = denial(
        sets.create(&PostParams::default(), &empty_selector).await,
        "an empty selector",
    );
    assert!(message.contains("spec.selector"), "{message}");
}

#[tokio::test]
async fn a_sidecarset_update_cannot_add_containers() {
    let client = client().await;
    let sets = Api::<SidecarSet>::all(client.clone());
    let name = unique_name("grow");
    sets.create(
        &PostParams::default(),
        &sidecarset(
            &name,
            json!({"matchLabels": {"app": &name}}),
            json!([{"name": "a", "image": "busybox"}]),
        ),
    )
    .await
    .expect("created");
    let patch = json!({"spec": {"containers": [
        {"name": "a", "image": "busybox"}, {"name": "b", "image": "busybox"}
    ]}});
    let message = denial(
        sets.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await,
        "adding a container",
    );
    assert!(
        message.contains("spec.containers[1].name") || message.contains("\"b\""),
        "{message}"
    );
    // Changing an image is fine.
    let patch = json!({"spec": {"containers": [{"name": "a", "image": "busybox:1.36"}]}});
    let updated = sets
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("an image change is admitted");
    assert_eq!(
        updated.spec.containers[0].container.image.as_deref(),
        Some("busybox:1.36")
    );
}

#[tokio::test]
async fn imagepulljobs_and_nodeimages_are_defaulted_and_validated() {
    let cluster = webhook_cluster();
    let client = client().await;
    let ns = cluster.namespace("wh-jobs").await;
    let jobs = Api::<ImagePullJob>::namespaced(client.clone(), &ns);
    let both: ImagePullJob = serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1", "kind": "ImagePullJob",
        "metadata": {"name": "both"},
        "spec": {"image": "nginx:1.25", "selector": {"names": ["n1"], "matchLabels": {"a": "b"}}}
    }))
    .expect("job");
    let message = denial(
        jobs.create(&PostParams::default(), &both).await,
        "names with matchLabels",
    );
    assert!(message.contains("spec.selector"), "{message}");

    let never_with_deadline: ImagePullJob = serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1", "kind": "ImagePullJob",
        "metadata": {"name": "never"},
        "spec": {"image": "nginx:1.25", "completionPolicy": {"type": "Never", "activeDeadlineSeconds": 60}}
    }))
    .expect("job");
    let message = denial(
        jobs.create(&PostParams::default(), &never_with_deadline)
            .await,
        "Never with a deadline",
    );
    assert!(
        message.contains("spec.completionPolicy.activeDeadlineSeconds"),
        "{message}"
    );

    let node = unique_name("wh-node");
    let nodeimage: NodeImage = serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1", "kind": "NodeImage",
        "metadata": {"name": &node},
        "spec": {"images": {"nginx": {"tags": [{"tag": "1.25", "pullPolicy": {"ttlSecondsAfterFinished": 300}}]}}}
    }))
    .expect("NodeImage");
    let created = Api::<NodeImage>::all(client.clone())
        .create(&PostParams::default(), &nodeimage)
        .await
        .expect("admitted");
    let tag = &created.spec.images["nginx"].tags[0];
    assert!(tag.created_at.is_some(), "createdAt defaulted: {tag:?}");
    // Upstream requires a TTL on every tag (its controller always writes one).
    let mut without_ttl = nodeimage.clone();
    without_ttl.metadata.name = Some(unique_name("wh-node"));
    without_ttl.spec.images.get_mut("nginx").unwrap().tags[0].pull_policy = None;
    let message = denial(
        Api::<NodeImage>::all(client.clone())
            .create(&PostParams::default(), &without_ttl)
            .await,
        "a tag without a TTL",
    );
    assert!(
        message.contains("spec.images[nginx].tags[0].pullPolicy.ttlSecondsAfterFinished"),
        "{message}"
    );
    let policy = tag.pull_policy.clone().expect("pullPolicy defaulted");
    assert_eq!(
        (policy.timeout_seconds, policy.backoff_limit),
        (Some(600), Some(3))
    );
}

/// What the apiserver does while a webhook cannot be reached, under each failurePolicy: a
/// configuration built like the manager's, pointing at a port nothing listens on, for one
/// namespace only.
#[tokio::test]
async fn a_webhook_that_is_down_blocks_pods_under_fail_and_not_under_ignore() {
    let cluster = webhook_cluster();
    let client = client().await;
    for policy in [FailurePolicy::Fail, FailurePolicy::Ignore] {
        let label = unique_name("down");
        let ns = cluster.namespace("wh-down").await;
        Api::<Namespace>::all(client.clone())
            .patch(
                &ns,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"webhook-down": &label}}})),
            )
            .await
            .expect("label the namespace");
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a port");
        let params = ConfigurationParams {
            name_prefix: label.clone(),
            endpoint: Endpoint::Url(format!("https://{closed}")),
            ca_bundle: None,
            pod_failure_policy: policy,
            timeout_seconds: 2,
            excluded_namespaces: vec![],
            pod_namespace_selector: Some(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                    match_labels: Some(BTreeMap::from([(
                        "webhook-down".to_owned(),
                        label.clone(),
                    )])),
                    ..Default::default()
                },
            ),
            pod_object_selector: None,
        };
        let configs = Api::<MutatingWebhookConfiguration>::all(client.clone());
        // Only the pod webhook: the kruise kinds' webhooks have no namespace selector and would
        // stop the other tests' SidecarSets and jobs too.
        let mut config = params.mutating();
        if let Some(webhooks) = config.webhooks.as_mut() {
            webhooks.retain(|w| w.name == "mutate-pods.kruise-rs.io");
        }
        configs
            .create(&PostParams::default(), &config)
            .await
            .expect("a configuration pointing nowhere");
        let result = Api::<Pod>::namespaced(client.clone(), &ns)
            .create(
                &PostParams::default(),
                &pod(
                    "p",
                    json!({"app": "x"}),
                    json!([{"name": "main", "image": "nginx:1.25"}]),
                ),
            )
            .await;
        configs
            .delete(&params.mutating_name(), &DeleteParams::default())
            .await
            .expect("cleanup");
        match policy {
            FailurePolicy::Fail => {
                let message = denial(result, "a pod while the webhook is down under Fail");
                assert!(message.contains("failed calling webhook"), "{message}");
            }
            FailurePolicy::Ignore => {
                let pod = result.expect("admitted unchanged under Ignore");
                assert_eq!(pod.spec.unwrap().containers.len(), 1);
            }
        }
    }
}

/// Issue 42: with the pod webhook at `Ignore`, the job webhooks still fail closed. The
/// configurations are built as the manager builds them with `--webhook-failure-policy=Ignore`,
/// pointing at a port nothing listens on; the test confines them to one namespace of its own
/// (a selector it adds to the built objects, which no option of the manager can) so the other
/// tests' objects are not refused meanwhile. A pod there is admitted unchanged, a job refused.
#[tokio::test]
async fn with_the_pod_webhook_at_ignore_a_job_is_refused_while_the_webhook_is_down() {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    let cluster = webhook_cluster();
    let client = client().await;
    let label = unique_name("down-ignore");
    let ns = cluster.namespace("wh-down-ignore").await;
    Api::<Namespace>::all(client.clone())
        .patch(
            &ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"webhook-down": &label}}})),
        )
        .await
        .expect("label the namespace");
    let only_here = LabelSelector {
        match_labels: Some(BTreeMap::from([("webhook-down".to_owned(), label.clone())])),
        ..LabelSelector::default()
    };
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a port");
    let params = ConfigurationParams {
        name_prefix: label.clone(),
        endpoint: Endpoint::Url(format!("https://{closed}")),
        ca_bundle: None,
        pod_failure_policy: FailurePolicy::Ignore,
        timeout_seconds: 2,
        excluded_namespaces: vec![],
        pod_namespace_selector: Some(only_here.clone()),
        pod_object_selector: None,
    };
    let mut mutating = params.mutating();
    if let Some(webhooks) = mutating.webhooks.as_mut() {
        webhooks.retain(|w| w.name == "mutate-pods.kruise-rs.io");
    }
    let mut validating = params.validating();
    if let Some(webhooks) = validating.webhooks.as_mut() {
        webhooks.retain(|w| w.name == "validate-imagepulljobs.kruise-rs.io");
        for webhook in webhooks.iter_mut() {
            webhook.namespace_selector = Some(only_here.clone());
        }
    }
    let mutating_api = Api::<MutatingWebhookConfiguration>::all(client.clone());
    let validating_api = Api::<ValidatingWebhookConfiguration>::all(client.clone());
    mutating_api
        .create(&PostParams::default(), &mutating)
        .await
        .expect("a pod webhook pointing nowhere");
    validating_api
        .create(&PostParams::default(), &validating)
        .await
        .expect("a job webhook pointing nowhere");

    let jobs = Api::<ImagePullJob>::namespaced(client.clone(), &ns);
    // Once the apiserver has loaded the configuration, the webhook's absence refuses the job.
    let refused = crate::support::wait_for(
        "a job refused for the webhook being down",
        std::time::Duration::from_secs(30),
        || {
            let jobs = jobs.clone();
            async move {
                let job = imagepulljob(&unique_name("job"), json!({}));
                match jobs.create(&PostParams::default(), &job).await {
                    Err(kube::Error::Api(status))
                        if status.message.contains("failed calling webhook") =>
                    {
                        Some(Ok(status.message))
                    }
                    Err(e) => Some(Err(e.to_string())),
                    // Admitted: the apiserver has not loaded the configuration yet, or the
                    // webhook is Ignore (then this times out, naming the admission).
                    Ok(_) => None,
                }
            }
        },
    )
    .await;
    let pod = Api::<Pod>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &pod(
                "p",
                json!({"app": "x"}),
                json!([{"name": "main", "image": "nginx:1.25"}]),
            ),
        )
        .await;
    let _ = mutating_api
        .delete(&params.mutating_name(), &DeleteParams::default())
        .await;
    let _ = validating_api
        .delete(&params.validating_name(), &DeleteParams::default())
        .await;
    let message = refused.expect("refused by the apiserver for the webhook being down");
    assert!(
        message.contains("validate-imagepulljobs.kruise-rs.io"),
        "{message}"
    );
    let pod = pod.expect("a pod admitted unchanged under Ignore");
    assert_eq!(pod.spec.map(|s| s.containers.len()), Some(1));
}

/// Issue 42: the review of an UPDATE holds the object twice. Over axum's default body limit
/// (2 MiB) the webhook answered 413 and the apiserver applied the failurePolicy instead of the
/// webhook's decision. A job of about 1.2 MiB (a big `sandboxConfig` annotation: metadata
/// annotations stop at 256 KiB) is stored, then updated: an invalid update is denied with the
/// webhook's reason, a valid one admitted.
#[tokio::test]
async fn an_update_whose_review_exceeds_two_mib_is_validated() {
    let cluster = webhook_cluster();
    let client = client().await;
    let ns = cluster.namespace("wh-big").await;
    let jobs = Api::<ImagePullJob>::namespaced(client.clone(), &ns);
    let big = "x".repeat(1_200 * 1024);
    let name = unique_name("big");
    let job = imagepulljob(
        &name,
        json!({
            // A node that does not exist: nothing is pulled, no NodeImage gets the annotation.
            "selector": {"names": [unique_name("nowhere")]},
            "sandboxConfig": {"annotations": {"big": &big}}
        }),
    );
    jobs.create(&PostParams::default(), &job)
        .await
        .expect("a job of 1.2 MiB is admitted");

    let invalid = jobs
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"pullSecrets": ["added"]}})),
        )
        .await;
    let message = denial(invalid, "a change to the immutable pullSecrets");
    assert!(
        message.contains("denied the request") && message.contains("field is immutable"),
        "the webhook's own denial, not a failed call: {message}"
    );
    let valid = jobs
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"edited": "yes"}}})),
        )
        .await
        .expect("a label added to the big job is admitted");
    assert_eq!(
        valid.labels().get("edited").map(String::as_str),
        Some("yes")
    );
    let _ = jobs.delete(&name, &DeleteParams::default()).await;
}

/// The self-managed certificates live in a Secret; the configurations carry its CA; a second
/// manager (another replica, or a restart) serves the same certificates instead of new ones,
/// and the apiserver calls it through both configurations.
///
/// On a control plane of its own: the replica's kruise-kind webhooks see every namespace and
/// fail closed, and on the shared webhook plane a request that had picked its webhooks before
/// the replica's configurations were deleted still called it after it stopped (another test's
/// job update refused on its dead port, twice in CI).
#[tokio::test]
async fn replicas_share_the_certificates_in_the_secret_and_its_ca_is_the_ca_bundle() {
    use crate::support::webhook::{
        MANAGER_NAMESPACE, WEBHOOK_NAMESPACE_LABEL, own_manager_with_webhooks, webhook_options,
    };
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    use k8s_openapi::api::core::v1::Secret;
    use kruise_rs::webhook::handlers::Handlers;

    let plane = crate::support::ExtraControlPlane::start_with_crds().await;
    let _first = crate::support::start_manager(
        own_manager_with_webhooks(plane.kubeconfig_path()),
        std::time::Duration::from_secs(60),
        "the first replica",
    )
    .await;
    let client = crate::support::client_for(plane.kubeconfig_path()).await;
    let secret = Api::<Secret>::namespaced(client.clone(), MANAGER_NAMESPACE)
        .get("kruise-rs-webhook-certs")
        .await
        .expect("the certificate Secret");
    let ca = secret
        .data
        .as_ref()
        .and_then(|d| d.get("ca.crt"))
        .expect("ca.crt")
        .0
        .clone();
    let mutating = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get("kruise-rs-mutating-webhook-configuration")
        .await
        .expect("mutating configuration");
    let validating = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .get("kruise-rs-validating-webhook-configuration")
        .await
        .expect("validating configuration");
    for config in mutating
        .webhooks
        .iter()
        .flatten()
        .map(|w| &w.client_config)
        .chain(
            validating
                .webhooks
                .iter()
                .flatten()
                .map(|w| &w.client_config),
        )
    {
        assert_eq!(config.ca_bundle.as_ref().map(|b| &b.0), Some(&ca));
    }
    let pods = mutating
        .webhooks
        .iter()
        .flatten()
        .find(|w| w.name == "mutate-pods.kruise-rs.io")
        .expect("pod webhook");
    let excluded = pods
        .namespace_selector
        .as_ref()
        .and_then(|s| s.match_expressions.as_ref())
        .and_then(|e| e.iter().find(|r| r.operator == "NotIn"))
        .and_then(|r| r.values.clone())
        .unwrap_or_default();
    assert!(
        excluded.contains(&"kube-system".to_owned())
            && excluded.contains(&MANAGER_NAMESPACE.to_owned()),
        "{excluded:?}"
    );

    // A second webhook server on the same Secret, under other configuration names.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a port");
    let mut opts = webhook_options(addr, FailurePolicy::Ignore);
    opts.configuration_prefix = unique_name("replica");
    opts.pod_namespace_selector = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
            match_labels: Some(BTreeMap::from([(
                "nothing".to_owned(),
                "matches".to_owned(),
            )])),
            ..Default::default()
        },
    );
    let (handlers, caches) = Handlers::new(client.clone(), MANAGER_NAMESPACE);
    let caches = tokio::spawn(caches);
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let handlers = std::sync::Arc::new(Recording {
        inner: handlers,
        seen: seen.clone(),
    });
    let (ready_tx, ready) = tokio::sync::oneshot::channel();
    let (stop, stopping) = tokio::sync::oneshot::channel::<()>();
    let prefix = opts.configuration_prefix.clone();
    let replica = tokio::spawn(kruise_rs::webhook::run(
        client.clone(),
        opts,
        handlers,
        async move {
            let _ = stopping.await;
        },
        Some(ready_tx),
    ));
    ready.await.expect("the second server starts");
    let second = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get(&format!("{prefix}-mutating-webhook-configuration"))
        .await
        .expect("the replica's configuration");
    let bundle = second
        .webhooks
        .as_ref()
        .and_then(|w| w.first())
        .and_then(|w| w.client_config.ca_bundle.clone());
    assert_eq!(
        bundle.map(|b| b.0),
        Some(ca.clone()),
        "the same CA, not a new one"
    );
    let after = Api::<Secret>::namespaced(client.clone(), MANAGER_NAMESPACE)
        .get("kruise-rs-webhook-certs")
        .await
        .expect("the Secret");
    assert_eq!(
        after.metadata.resource_version, secret.metadata.resource_version,
        "not rewritten"
    );
    // The apiserver calls the replica through both configurations: a dry-run job is sent to
    // its mutating and its validating webhook (TLS with the shared CA works).
    let ns = unique_name("wh-replica");
    crate::harness::objects::create_namespace(&client, &ns, &[(WEBHOOK_NAMESPACE_LABEL, "true")])
        .await
        .expect("namespace");
    let jobs = Api::<ImagePullJob>::namespaced(client.clone(), &ns);
    crate::support::wait_for(
        "the apiserver to call the replica's two configurations",
        std::time::Duration::from_secs(30),
        || {
            let (jobs, seen) = (jobs.clone(), seen.clone());
            async move {
                let name = unique_name("probe");
                let dry_run = PostParams {
                    dry_run: true,
                    ..PostParams::default()
                };
                jobs.create(&dry_run, &imagepulljob(&name, json!({})))
                    .await
                    .ok()?;
                let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                let called = |path: &str| seen.iter().any(|(p, n)| *p == path && *n == name);
                (called("/mutate-imagepulljob") && called("/validate-imagepulljob")).then_some(())
            }
        },
    )
    .await;
    let _ = stop.send(());
    replica
        .await
        .expect("join")
        .expect("the replica stops cleanly");
    caches.abort();
}

/// An [`Admit`] that records the path and object name of every review it is asked for.
struct Recording {
    inner: std::sync::Arc<kruise_rs::webhook::handlers::Handlers>,
    seen: std::sync::Arc<std::sync::Mutex<Vec<(&'static str, String)>>>,
}

impl kruise_rs::webhook::server::Admit for Recording {
    fn admit<'a>(
        &'a self,
        path: &'static str,
        request: &'a kube::core::admission::AdmissionRequest<kube::core::DynamicObject>,
    ) -> kruise_rs::webhook::server::AdmitFuture<'a> {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((path, request.name.clone()));
        self.inner.admit(path, request)
    }
}

/// v1alpha1 SidecarSets go through the same webhooks: `spec.namespace` scopes injection to one
/// namespace, and the object is defaulted and hashed like a v1beta1 one.
#[tokio::test]
async fn a_v1alpha1_sidecarset_is_defaulted_and_injects_only_in_its_namespace() {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let cluster = webhook_cluster();
    let client = client().await;
    let ns = cluster.namespace("wh-alpha").await;
    let elsewhere = cluster.namespace("wh-alpha-other").await;
    let app = unique_name("alpha");
    let name = unique_name("alpha-set");
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apps.kruise.io", "v1alpha1", "SidecarSet"),
        "sidecarsets",
    );
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "SidecarSet",
        "metadata": {"name": &name},
        "spec": {"namespace": &ns, "selector": {"matchLabels": {"app": &app}},
                 "containers": [{"name": "side", "image": "busybox:1.36"}]}
    }))
    .expect("object");
    let created = Api::<DynamicObject>::all_with(client.clone(), &resource)
        .create(&PostParams::default(), &object)
        .await
        .expect("admitted");
    assert!(
        created
            .annotations()
            .contains_key("kruise.io/sidecarset-hash")
    );
    assert_eq!(
        created.data["spec"]["containers"][0]["podInjectPolicy"],
        "BeforeAppContainer"
    );

    // Containers of a new pod labelled for the SidecarSet in `namespace`.
    let containers_in = |namespace: String| {
        let pods = Api::<Pod>::namespaced(client.clone(), &namespace);
        let labels = json!({"app": &app});
        async move {
            let body = pod(
                &unique_name("p"),
                labels,
                json!([{"name": "main", "image": "nginx"}]),
            );
            let created = pods.create(&PostParams::default(), &body).await.ok()?;
            created.spec.map(|s| s.containers.len())
        }
    };
    // The webhook's cache sees the new SidecarSet a moment later: retry until it injects.
    crate::support::wait_for(
        "a pod in the SidecarSet's namespace to get the sidecar",
        std::time::Duration::from_secs(30),
        || {
            let created = containers_in(ns.clone());
            async move { (created.await == Some(2)).then_some(()) }
        },
    )
    .await;
    assert_eq!(
        containers_in(elsewhere.clone()).await,
        Some(1),
        "no sidecar outside spec.namespace"
    );
}

/// The manager counts the admission reviews its webhooks answer, by kind and verdict, and times
/// them: an injected pod counts as `patched`, an invalid SidecarSet as `denied`. Other tests go
/// through the same manager at the same time, so the counts are only required to grow.
#[tokio::test]
async fn admissions_are_counted_by_kind_and_verdict_and_timed() {
    use crate::support::scrape::{sample, scrape};
    let cluster = webhook_cluster();
    let client = client().await;
    let admissions = |kind: &str, verdict: &str| {
        format!("kruise_rs_manager_admissions_total{{kind=\"{kind}\",verdict=\"{verdict}\"}}")
    };
    let timed = "kruise_rs_manager_admission_seconds_count{kind=\"pods\"}";
    let value = |text: &str, series: &str| {
        sample(text, series).unwrap_or_else(|| panic!("{series} missing:\n{text}"))
    };
    let before = scrape(cluster.probe_addr).await;

    let ns = cluster.namespace("wh-metrics").await;
    let app = unique_name("app");
    Api::<SidecarSet>::all(client.clone())
        .create(
            &PostParams::default(),
            &sidecarset(
                &unique_name("counted"),
                json!({"matchLabels": {"app": &app}}),
                json!([{"name": "logger", "image": "busybox:1.36"}]),
            ),
        )
        .await
        .expect("the SidecarSet is admitted");
    let template = serde_json::to_value(pod(
        "counted",
        json!({"app": &app}),
        json!([{"name": "main", "image": "nginx:1.25"}]),
    ))
    .expect("pod JSON");
    admit_until(
        &Api::<Pod>::namespaced(client.clone(), &ns),
        &template,
        "a pod injected with the new SidecarSet",
        |p| p.spec.as_ref().is_some_and(|s| s.containers.len() > 1),
    )
    .await;
    let invalid = sidecarset(
        &unique_name("uncounted"),
        json!({}),
        json!([{"name": "c", "image": "busybox"}]),
    );
    denial(
        Api::<SidecarSet>::all(client.clone())
            .create(&PostParams::default(), &invalid)
            .await,
        "an empty selector",
    );

    let after = scrape(cluster.probe_addr).await;
    for series in [
        admissions("pods", "patched"),
        admissions("sidecarsets", "patched"),
        admissions("sidecarsets", "denied"),
        timed.to_owned(),
    ] {
        let (was, is) = (value(&before, &series), value(&after, &series));
        assert!(is > was, "{series} went from {was} to {is}");
    }
    // Every kind and verdict has its series from the start, so rates need no "absent" case.
    for kind in [
        "pods",
        "sidecarsets",
        "imagepulljobs",
        "imagelistpulljobs",
        "nodeimages",
    ] {
        for verdict in ["allowed", "patched", "denied"] {
            value(&before, &admissions(kind, verdict));
        }
        value(
            &before,
            &format!("kruise_rs_manager_admission_seconds_count{{kind=\"{kind}\"}}"),
        );
    }
}

/// `--sidecarset-patch-pod-metadata-defaults-allowed` (upstream's feature gate
/// `SidecarSetPatchPodMetadataDefaultsAllowed`) through the real SidecarSet webhook, on a
/// control plane of its own whose manager runs with it (the shared one runs without it and
/// refuses these: `webhook_scenarios`): without a whitelist every `patchPodMetadata` is
/// admitted; beside one, a SidecarSet no rule applies to may patch any key, and one a rule
/// applies to only the keys the rule allows.
#[tokio::test]
async fn patch_pod_metadata_defaults_allowed_admits_what_no_whitelist_rule_covers() {
    use crate::support::webhook::{MANAGER_NAMESPACE, webhook_options};
    use kruise_rs::manager::ManagerOptions;
    use kube::config::{KubeConfigOptions, Kubeconfig};

    let plane = crate::support::ExtraControlPlane::start_with_crds().await;
    let addr = crate::harness::process::free_loopback_port().expect("a loopback port");
    let mut webhook = webhook_options(addr, FailurePolicy::Fail);
    webhook.patch_pod_metadata_defaults_allowed = true;
    let opts = ManagerOptions {
        controllers: kruise_rs::controllers::ControllerOptions {
            namespace: MANAGER_NAMESPACE.to_owned(),
            ..crate::support::test_controller_options()
        },
        webhook: Some(webhook),
        ..crate::support::manager_options(plane.kubeconfig_path())
    };
    let manager = crate::support::start_manager(
        opts,
        std::time::Duration::from_secs(60),
        "with patchPodMetadata defaults allowed",
    )
    .await;
    let kubeconfig = Kubeconfig::read_from(plane.kubeconfig_path()).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("config");
    let client = Client::try_from(config).expect("client");
    let sets = Api::<SidecarSet>::all(client.clone());
    let patching = |labels: Value, key: &str| {
        // A pod selector of its own: SidecarSets selecting the same pods conflict.
        let mut set = sidecarset(
            &unique_name("sc-defaults"),
            json!({"matchLabels": {"app": unique_name("app")}}),
            json!([{"name": "sidecar", "image": "busybox:1.36"}]),
        );
        set.metadata.labels = serde_json::from_value(labels).expect("labels");
        set.spec.patch_pod_metadata = serde_json::from_value(json!([
            {"annotations": {key: "1"}, "patchPolicy": "Overwrite"}
        ]))
        .expect("patchPodMetadata");
        set
    };

    // No whitelist at all: admitted.
    sets.create(&PostParams::default(), &patching(json!({}), "any-key"))
        .await
        .expect("no whitelist: admitted with the flag");

    // A whitelist whose one rule applies to `sidecar: demo` SidecarSets.
    let rule = json!({
        "selector": {"matchLabels": {"sidecar": "demo"}},
        "allowedAnnotationKeyExprs": ["^oom-score$"],
    });
    crate::webhook_scenarios::whitelist_rule(&client, rule, true).await;
    sets.create(&PostParams::default(), &patching(json!({}), "any-key"))
        .await
        .expect("no rule applies: admitted with the flag");
    let demo = json!({"sidecar": "demo"});
    sets.create(&PostParams::default(), &patching(demo.clone(), "oom-score"))
        .await
        .expect("a key the applying rule allows");
    let message = denial(
        sets.create(&PostParams::default(), &patching(demo, "any-key"))
            .await,
        "a key the applying rule does not allow",
    );
    assert!(
        message.contains("annotation(any-key) is not allowed"),
        "{message}"
    );

    let _ = manager.stop.send(());
    let stopped = tokio::time::timeout(std::time::Duration::from_secs(30), manager.task)
        .await
        .expect("the manager stops within 30 s")
        .expect("join");
    assert!(stopped.is_ok(), "{stopped:?}");
    drop(plane);
}

/// The webhook's bounds on pull durations and counts (decision 0019), in both API versions.
/// Through the apiserver the CRD schema refuses these values before any validating webhook is
/// called (`api_objects`), so each AdmissionReview goes straight to the webhook, as the
/// apiserver would send it.
#[tokio::test]
async fn the_webhook_denies_pull_numbers_past_their_bounds_naming_the_field() {
    let cluster = webhook_cluster();
    let cases = [
        (
            "/validate-imagepulljob",
            "ImagePullJob",
            "imagepulljobs",
            json!({"image": "nginx", "pullPolicy": {"backoffLimit": -1}}),
            "spec.pullPolicy.backoffLimit: Invalid value: -1: must be between 0 and 1000, inclusive",
        ),
        (
            "/validate-imagelistpulljob",
            "ImageListPullJob",
            "imagelistpulljobs",
            json!({"images": ["nginx"], "completionPolicy": {"activeDeadlineSeconds": i64::MAX}}),
            "spec.completionPolicy.activeDeadlineSeconds: Invalid value: 9223372036854775807: must be between 1 and 31536000, inclusive",
        ),
        (
            "/validate-nodeimage",
            "NodeImage",
            "nodeimages",
            json!({"images": {"nginx": {"tags": [{"tag": "v1", "createdAt": "2026-01-01T00:00:00Z",
                "pullPolicy": {"ttlSecondsAfterFinished": 300, "timeoutSeconds": 0}}]}}}),
            "spec.images[nginx].tags[0].pullPolicy.timeoutSeconds: Invalid value: 0: must be between 1 and 86400, inclusive",
        ),
    ];
    for (path, kind, resource, spec, needle) in cases {
        for version in ["v1alpha1", "v1beta1"] {
            let review = json!({
                "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {
                    "uid": "4f0c6f0e-0000-4000-8000-000000000019",
                    "kind": {"group": "apps.kruise.io", "version": version, "kind": kind},
                    "resource": {"group": "apps.kruise.io", "version": version, "resource": resource},
                    "name": "bounded", "namespace": "default", "operation": "CREATE",
                    "userInfo": {"username": "admin", "groups": ["system:masters"]},
                    "dryRun": false,
                    "object": {
                        "apiVersion": format!("apps.kruise.io/{version}"), "kind": kind,
                        "metadata": {"name": "bounded", "namespace": "default"},
                        "spec": spec,
                    },
                },
            });
            let mut curl = std::process::Command::new("curl");
            // The manager's self-signed serving certificate; only loopback is contacted.
            curl.args(["-sSk", "-X", "POST", "-H", "Content-Type: application/json"])
                .args(["--data-binary", "@-"])
                .arg(format!("https://{}{path}", cluster.webhook_addr));
            let out = crate::support::run_with_stdin(curl, &review.to_string());
            assert!(
                out.status.success(),
                "{kind} {version}: curl failed: {out:?}"
            );
            let answer: Value = serde_json::from_slice(&out.stdout)
                .unwrap_or_else(|e| panic!("{kind} {version}: {e}: {out:?}"));
            let response = &answer["response"];
            assert_eq!(response["allowed"], false, "{kind} {version}: {answer}");
            let message = response["status"]["message"].as_str().unwrap_or_default();
            assert!(message.contains(needle), "{kind} {version}: {message}");
        }
    }
}
