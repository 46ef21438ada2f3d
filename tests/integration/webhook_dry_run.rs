//! The SidecarSet webhook's dry-run pod (decision 0012): what the in-process validator does not
//! check (resources, securityContext, probe handlers, envFrom...) is refused by Kubernetes' own
//! pod validation, naming the SidecarSet's field; valid SidecarSets are admitted.

use kruise_rs::apis::sidecarset::SidecarSet;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::support::unique_name;
use crate::support::webhook::webhook_cluster;

/// A SidecarSet with `containers` (and `extra` spec fields), as raw JSON.
fn raw_sidecarset(name: &str, containers: Value, extra: Value) -> Value {
    let mut spec = json!({"selector": {"matchLabels": {"app": name}}, "containers": containers});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "SidecarSet",
        "metadata": {"name": name},
        "spec": spec,
    })
}

/// Creates `set` as written (no typed round trip: unknown fields reach the webhook).
async fn create(set: &Value) -> Result<DynamicObject, kube::Error> {
    let client = webhook_cluster().client().await;
    let resource = ApiResource::erase::<SidecarSet>(&());
    let api = Api::<DynamicObject>::all_with(client, &resource);
    let object: DynamicObject = serde_json::from_value(set.clone()).expect("an object");
    api.create(&PostParams::default(), &object).await
}

#[tokio::test]
async fn sidecars_kubernetes_would_refuse_in_a_pod_are_refused_naming_the_sidecarset_field() {
    let cases = [
        (
            "quantity",
            json!([{"name": "c", "image": "busybox", "resources": {"limits": {"cpu": "lots"}}}]),
            json!({}),
            "spec.containers[0].resources.limits",
        ),
        (
            "run-as",
            json!([
                {"name": "ok", "image": "busybox"},
                {"name": "c", "image": "busybox", "securityContext": {"runAsUser": -1}},
            ]),
            json!({}),
            "spec.containers[1].securityContext.runAsUser",
        ),
        (
            "probe",
            json!([{"name": "c", "image": "busybox",
                    "readinessProbe": {"httpGet": {"port": 0, "path": "/"}}}]),
            json!({}),
            "spec.containers[0].readinessProbe.httpGet.port",
        ),
        (
            "envfrom",
            json!([{"name": "c", "image": "busybox",
                    "envFrom": [{"configMapRef": {"name": "Bad_Name"}}]}]),
            json!({}),
            "spec.containers[0].envFrom[0].configMapRef.name",
        ),
        (
            "init-lifecycle",
            json!([]),
            json!({
                "updateStrategy": {"type": "NotUpdate"},
                "initContainers": [{"name": "native", "image": "busybox", "restartPolicy": "Always",
                    "lifecycle": {"preStop": {"httpGet": {"port": 70000}}}}],
            }),
            "spec.initContainers[0].lifecycle.preStop.httpGet.port",
        ),
    ];
    for (what, containers, extra, field) in cases {
        let set = raw_sidecarset(&unique_name(what), containers, extra);
        match create(&set).await {
            Err(kube::Error::Api(status)) => {
                let message = &status.message;
                assert!(message.contains(field), "{what}: {message}");
                assert!(
                    message.contains("pod validation"),
                    "{what}: refused by the dry run: {message}"
                );
            }
            other => panic!("{what} should have been refused: {other:?}\n{set:#}"),
        }
    }
}

#[tokio::test]
async fn valid_sidecarsets_are_admitted_and_the_same_spec_again_too() {
    let containers = json!([{
        "name": "proxy", "image": "envoy:v1",
        "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
        "securityContext": {"runAsUser": 1000, "runAsNonRoot": true,
                            "capabilities": {"drop": ["ALL"]}},
        "envFrom": [{"configMapRef": {"name": "proxy-env", "optional": true}, "prefix": "P_"}],
        "readinessProbe": {"httpGet": {"port": 15021, "path": "/healthz"}},
        "lifecycle": {"preStop": {"sleep": {"seconds": 5}}},
        "podInjectPolicy": "AfterAppContainer",
        "volumeMounts": [{"name": "certs", "mountPath": "/certs"}],
    }]);
    let extra = json!({
        "volumes": [{"name": "certs", "emptyDir": {}}],
        "initContainers": [{"name": "init", "image": "busybox", "command": ["true"]}],
    });
    let name = unique_name("valid");
    create(&raw_sidecarset(&name, containers.clone(), extra.clone()))
        .await
        .expect("a valid SidecarSet is admitted");
    // The same spec under a dry run (the verdict is remembered) is admitted again.
    let client = webhook_cluster().client().await;
    let resource = ApiResource::erase::<SidecarSet>(&());
    let api = Api::<DynamicObject>::all_with(client, &resource);
    let object: DynamicObject =
        serde_json::from_value(raw_sidecarset(&unique_name("valid"), containers, extra))
            .expect("an object");
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    api.create(&dry_run, &object)
        .await
        .expect("admitted under a dry run too");
}

#[tokio::test]
async fn an_update_that_breaks_a_sidecar_is_refused_and_one_that_leaves_them_alone_is_not() {
    let name = unique_name("upd");
    let containers = json!([{"name": "c", "image": "busybox"}]);
    create(&raw_sidecarset(&name, containers, json!({})))
        .await
        .expect("a valid SidecarSet is admitted");
    let client = webhook_cluster().client().await;
    let sets = Api::<SidecarSet>::all(client);
    let bad = json!({"spec": {"containers": [
        {"name": "c", "image": "busybox", "securityContext": {"runAsGroup": -5}}
    ]}});
    match sets
        .patch(&name, &PatchParams::default(), &Patch::Merge(&bad))
        .await
    {
        Err(kube::Error::Api(status)) => assert!(
            status
                .message
                .contains("spec.containers[0].securityContext.runAsGroup"),
            "{}",
            status.message
        ),
        other => panic!("the update should have been refused: {other:?}"),
    }
    let label = json!({"metadata": {"labels": {"edited": "yes"}}});
    sets.patch(&name, &PatchParams::default(), &Patch::Merge(&label))
        .await
        .expect("a label edit is admitted");
    sets.delete(&name, &Default::default())
        .await
        .expect("deleted");
}
