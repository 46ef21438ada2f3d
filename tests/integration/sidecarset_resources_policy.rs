//! Upstream's `resourcesPolicy` e2e stories (kruise.md §9.2, `sidecarset_resources_policy.go`)
//! through a real kube-apiserver with the manager's webhooks: each test creates SidecarSets and a
//! pod with the API and checks the sidecar resources of the pod the apiserver admitted, exactly.
//!
//! As in `webhook_scenarios.rs`: bare pods instead of Deployments, each SidecarSet selects a label
//! of its own in its test's namespace only, and a pod is created (each one without the sidecar
//! deleted) until the webhook's cache shows the new SidecarSets, with a deadline. Upstream checks
//! values with `Cmp`; these compare the stored text, which is stricter.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use kruise_rs_api::sidecarset::SidecarSet;
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::support::webhook::webhook_cluster;
use crate::support::{unique_name, wait_for};
use crate::webhook_scenarios::admit_until;

async fn client() -> Client {
    webhook_cluster().client().await
}

/// A SidecarSet selecting pods labelled `app: <app>` in namespace `ns`, with `spec` merged in.
async fn create_sidecarset(client: &Client, app: &str, ns: &str, spec: Value) -> SidecarSet {
    let mut set = json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "SidecarSet",
        "metadata": {"name": unique_name(app)},
        "spec": {
            "selector": {"matchLabels": {"app": app}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
        }
    });
    json_patch::merge(&mut set["spec"], &spec);
    let set: SidecarSet = serde_json::from_value(set).expect("a SidecarSet");
    Api::<SidecarSet>::all(client.clone())
        .create(&PostParams::default(), &set)
        .await
        .unwrap_or_else(|e| panic!("creating SidecarSet {}: {e}", set.name_any()))
}

/// A sidecar container with `resourcesPolicy`.
fn policy_sidecar(name: &str, mode: &str, regex: &str, limits: Value, requests: Value) -> Value {
    json!({
        "name": name,
        "image": "busybox:1.36",
        "command": ["/bin/sh", "-c", "sleep 10000000"],
        "resourcesPolicy": {
            "targetContainersMode": mode,
            "targetContainersNameRegex": regex,
            "resourcesExpr": {"limits": limits, "requests": requests}
        }
    })
}

/// An app container with resources `limits` and `requests` as `[cpu, memory]`, `""` unset.
fn app_container(name: &str, limits: [&str; 2], requests: [&str; 2]) -> Value {
    let list = |values: [&str; 2]| {
        let mut m = serde_json::Map::new();
        for (k, v) in ["cpu", "memory"].into_iter().zip(values) {
            if !v.is_empty() {
                m.insert(k.into(), json!(v));
            }
        }
        Value::Object(m)
    };
    json!({"name": name, "image": "nginx:1.25",
           "resources": {"limits": list(limits), "requests": list(requests)}})
}

/// Creates the pod until it is admitted with every container named in `sidecars` (containers
/// or init containers), and returns it.
async fn admit_with(client: &Client, ns: &str, app: &str, spec: Value, sidecars: &[&str]) -> Pod {
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let template = json!({"metadata": {"name": app, "labels": {"app": app}}, "spec": spec});
    admit_until(&pods, &template, "a pod with its sidecars", |p| {
        sidecars.iter().all(|name| find(p, name).is_some())
    })
    .await
}

fn find<'p>(pod: &'p Pod, name: &str) -> Option<&'p Container> {
    let spec = pod.spec.as_ref()?;
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == name)
}

/// The admitted resources of container `name`, as JSON.
fn resources(pod: &Pod, name: &str) -> Value {
    let c = find(pod, name).unwrap_or_else(|| panic!("{name} in the pod"));
    serde_json::to_value(c.resources.clone().unwrap_or_default()).expect("JSON")
}

/// The four values upstream's stories check.
fn expected(limits: [&str; 2], requests: [&str; 2]) -> Value {
    json!({
        "limits": {"cpu": limits[0], "memory": limits[1]},
        "requests": {"cpu": requests[0], "memory": requests[1]}
    })
}

fn engines(v8_limits: [&str; 2], v8_requests: [&str; 2]) -> Value {
    json!({"containers": [
        app_container("large-engine-v4", ["200m", "200Mi"], ["50m", "100Mi"]),
        app_container("large-engine-v8", v8_limits, v8_requests),
    ]})
}

fn floor_expressions() -> (Value, Value) {
    (
        json!({"cpu": "max(cpu*50%, 50m)", "memory": "200Mi"}),
        json!({"cpu": "max(cpu*50%, 50m)", "memory": "100Mi"}),
    )
}

/// Stories 1-4 share their shape: one SidecarSet whose `sidecar1` has the floor expressions over
/// `mode` and `regex`, a pod with the two engines (large-engine-v8's limits and requests given);
/// the admitted sidecar1's resources.
async fn floor_story(
    prefix: &str,
    mode: &str,
    regex: &str,
    v8_limits: [&str; 2],
    v8_requests: [&str; 2],
) -> Value {
    let client = client().await;
    let ns = webhook_cluster().namespace(&format!("rp-{prefix}")).await;
    let app = unique_name(prefix);
    let (limits, requests) = floor_expressions();
    let sidecar = policy_sidecar("sidecar1", mode, regex, limits, requests);
    create_sidecarset(&client, &app, &ns, json!({"containers": [sidecar]})).await;
    let pod = admit_with(
        &client,
        &ns,
        &app,
        engines(v8_limits, v8_requests),
        &["sidecar1"],
    )
    .await;
    resources(&pod, "sidecar1")
}

#[tokio::test]
async fn story_1_a_specific_container_name_regex() {
    let got = floor_story(
        "story1",
        "sum",
        "^large-engine-v4$",
        ["200m", "200Mi"],
        ["50m", "100Mi"],
    )
    .await;
    // max(200m × 50%, 50m) and max(50m × 50%, 50m): only large-engine-v4 counts.
    assert_eq!(got, expected(["100m", "200Mi"], ["50m", "100Mi"]));
}

#[tokio::test]
async fn story_2_sum_mode() {
    let got = floor_story(
        "story2",
        "sum",
        "^large-engine-v.*$",
        ["400m", "400Mi"],
        ["100m", "200Mi"],
    )
    .await;
    // (200m + 400m) × 50%; max((50m + 100m) × 50%, 50m).
    assert_eq!(got, expected(["300m", "200Mi"], ["75m", "100Mi"]));
}

#[tokio::test]
async fn story_3_max_mode() {
    let got = floor_story(
        "story3",
        "max",
        "^large-engine-v.*$",
        ["400m", "400Mi"],
        ["100m", "200Mi"],
    )
    .await;
    // max(400m × 50%, 50m); max(100m × 50%, 50m).
    assert_eq!(got, expected(["200m", "200Mi"], ["50m", "100Mi"]));
}

#[tokio::test]
async fn story_4_an_unlimited_target_leaves_the_limit_unset() {
    // large-engine-v8 has no CPU limit.
    let got = floor_story(
        "story4",
        "max",
        "^large-engine-v.*$",
        ["", "400Mi"],
        ["100m", "200Mi"],
    )
    .await;
    assert_eq!(
        got,
        json!({
            "limits": {"memory": "200Mi"},
            "requests": {"cpu": "50m", "memory": "100Mi"}
        })
    );
}

#[tokio::test]
async fn story_5_a_complex_linear_expression() {
    let client = client().await;
    let ns = webhook_cluster().namespace("rp-story5").await;
    let app = unique_name("story5");
    let sidecar = policy_sidecar(
        "sidecar1",
        "sum",
        ".*",
        json!({"cpu": "cpu*50% + 100m", "memory": "max(memory*20% + 100Mi, 200Mi)"}),
        json!({"cpu": "cpu*30% + 50m", "memory": "memory*15% + 50Mi"}),
    );
    create_sidecarset(&client, &app, &ns, json!({"containers": [sidecar]})).await;
    let spec = json!({"containers": [
        app_container("app1", ["200m", "400Mi"], ["100m", "200Mi"]),
        app_container("app2", ["400m", "600Mi"], ["200m", "300Mi"]),
    ]});
    let pod = admit_with(&client, &ns, &app, spec, &["sidecar1"]).await;
    assert_eq!(
        resources(&pod, "sidecar1"),
        expected(["400m", "300Mi"], ["140m", "125Mi"])
    );
}

#[tokio::test]
async fn story_6_a_native_sidecar_init_container_with_a_policy() {
    let client = client().await;
    let ns = webhook_cluster().namespace("rp-story6").await;
    let app = unique_name("story6");
    let mut sidecar = policy_sidecar(
        "init-sidecar",
        "sum",
        "^app.*$",
        json!({"cpu": "max(cpu*30%, 50m)", "memory": "max(memory*25%, 100Mi)"}),
        json!({"cpu": "cpu*20%", "memory": "memory*15%"}),
    );
    sidecar["restartPolicy"] = json!("Always");
    create_sidecarset(
        &client,
        &app,
        &ns,
        json!({"updateStrategy": {"type": "NotUpdate"}, "initContainers": [sidecar]}),
    )
    .await;
    let spec = json!({"containers": [
        app_container("app1", ["400m", "800Mi"], ["200m", "400Mi"]),
        app_container("app2", ["600m", "1200Mi"], ["300m", "600Mi"]),
    ]});
    let pod = admit_with(&client, &ns, &app, spec, &["init-sidecar"]).await;
    let init = pod.spec.as_ref().unwrap().init_containers.as_ref();
    assert!(
        init.is_some_and(|i| i.iter().any(|c| c.name == "init-sidecar")),
        "injected as an init container"
    );
    assert_eq!(
        resources(&pod, "init-sidecar"),
        expected(["300m", "500Mi"], ["100m", "150Mi"])
    );
}

#[tokio::test]
async fn the_pods_native_sidecar_init_containers_are_targets() {
    let client = client().await;
    let ns = webhook_cluster().namespace("rp-native").await;
    let app = unique_name("native");
    let sidecar = policy_sidecar(
        "sidecar1",
        "sum",
        ".*",
        json!({"cpu": "cpu*50%", "memory": "memory*50%"}),
        json!({"cpu": "cpu*40%", "memory": "memory*40%"}),
    );
    create_sidecarset(&client, &app, &ns, json!({"containers": [sidecar]})).await;
    let mut native = app_container("native-proxy", ["200m", "56Mi"], ["100m", "28Mi"]);
    native["restartPolicy"] = json!("Always");
    let spec = json!({
        "initContainers": [native],
        "containers": [app_container("app1", ["200m", "200Mi"], ["100m", "100Mi"])]
    });
    let pod = admit_with(&client, &ns, &app, spec, &["sidecar1"]).await;
    // (200m + 200m) × 50%, (56Mi + 200Mi) × 50%; (100m + 100m) × 40%, (28Mi + 100Mi) × 40%.
    assert_eq!(
        resources(&pod, "sidecar1"),
        json!({
            "limits": {"cpu": "200m", "memory": "128Mi"},
            "requests": {"cpu": "80m", "memory": "53687091200m"}
        })
    );
}

/// The SidecarSet of the two filtering stories: halves of limits, 40 % of requests.
fn halves_and_forty_percent(name: &str) -> Value {
    policy_sidecar(
        name,
        "sum",
        ".*",
        json!({"cpu": "cpu*50%", "memory": "memory*50%"}),
        json!({"cpu": "cpu*40%", "memory": "memory*40%"}),
    )
}

#[tokio::test]
async fn plain_init_containers_are_not_targets() {
    let client = client().await;
    let ns = webhook_cluster().namespace("rp-plain-init").await;
    let app = unique_name("plain-init");
    let sidecar = halves_and_forty_percent("sidecar1");
    create_sidecarset(&client, &app, &ns, json!({"containers": [sidecar]})).await;
    let mut init = app_container("plain-init", ["100m", "100Mi"], ["50m", "50Mi"]);
    init["command"] = json!(["sh", "-c", "echo init"]);
    let spec = json!({
        "initContainers": [init],
        "containers": [app_container("app1", ["200m", "200Mi"], ["100m", "100Mi"])]
    });
    let pod = admit_with(&client, &ns, &app, spec, &["sidecar1"]).await;
    assert_eq!(
        resources(&pod, "sidecar1"),
        expected(["100m", "100Mi"], ["40m", "40Mi"])
    );
}

#[tokio::test]
async fn kruise_sidecars_are_not_targets() {
    let client = client().await;
    let ns = webhook_cluster().namespace("rp-kruise").await;
    let app = unique_name("kruise");
    let with_resources = |name: &str, limits: [&str; 2], requests: [&str; 2]| {
        let mut c = app_container(name, limits, requests);
        c["image"] = json!("busybox:1.36");
        c["command"] = json!(["/bin/sh", "-c", "sleep 10000000"]);
        c
    };
    let mut init = with_resources("kruise-init-sidecar", ["300m", "300Mi"], ["150m", "150Mi"]);
    init["restartPolicy"] = json!("Always");
    let plain = with_resources("kruise-sidecar", ["400m", "400Mi"], ["200m", "200Mi"]);
    create_sidecarset(
        &client,
        &app,
        &ns,
        json!({
            "updateStrategy": {"type": "NotUpdate"},
            "initContainers": [init],
            "containers": [plain]
        }),
    )
    .await;
    let policy = halves_and_forty_percent("policy-sidecar");
    create_sidecarset(&client, &app, &ns, json!({"containers": [policy]})).await;
    let spec = json!({"containers": [app_container("app1", ["200m", "200Mi"], ["100m", "100Mi"])]});
    let pod = admit_with(
        &client,
        &ns,
        &app,
        spec,
        &["kruise-init-sidecar", "kruise-sidecar", "policy-sidecar"],
    )
    .await;
    assert_eq!(
        resources(&pod, "policy-sidecar"),
        expected(["100m", "100Mi"], ["40m", "40Mi"])
    );
}

#[tokio::test]
async fn a_pod_without_a_target_is_denied_and_a_bad_expression_never_admitted() {
    let client = client().await;
    let ns = webhook_cluster().namespace("rp-denied").await;
    let app = unique_name("denied");
    let bad = policy_sidecar(
        "sidecar1",
        "sum",
        ".*",
        json!({"memory": "memory*2Mi"}),
        json!(null),
    );
    let err = Api::<SidecarSet>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "apps.kruise.io/v1beta1", "kind": "SidecarSet",
                "metadata": {"name": unique_name("bad-expr")},
                "spec": {"selector": {"matchLabels": {"app": &app}}, "containers": [bad]}
            }))
            .expect("a SidecarSet"),
        )
        .await
        .expect_err("an invalid expression is denied");
    assert!(
        err.to_string().contains(
            "spec.containers[0].resourcesPolicy.resourcesExpr.limits.memory: Invalid value: \"memory*2Mi\""
        ),
        "{err}"
    );

    let sidecar = policy_sidecar(
        "sidecar1",
        "sum",
        "^nothing$",
        json!({"cpu": "cpu"}),
        json!(null),
    );
    create_sidecarset(&client, &app, &ns, json!({"containers": [sidecar]})).await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"generateName": "denied-", "labels": {"app": &app}},
        "spec": {"containers": [app_container("main", ["1", "1Gi"], ["", ""])]}
    }))
    .expect("a pod");
    // Until the webhook's cache has the SidecarSet the pod passes untouched: delete and retry.
    let message = wait_for("the pod to be denied", Duration::from_secs(30), || async {
        match pods.create(&PostParams::default(), &pod).await {
            Ok(admitted) => {
                let _ = pods
                    .delete(&admitted.name_any(), &DeleteParams::default())
                    .await;
                None
            }
            Err(kube::Error::Api(status)) => Some(status.message),
            Err(e) => panic!("creating the pod: {e}"),
        }
    })
    .await;
    assert!(
        message.contains("resourcesPolicy")
            && message.contains(
                "no container of the pod matches targetContainersNameRegex \"^nothing$\""
            ),
        "{message}"
    );
}
