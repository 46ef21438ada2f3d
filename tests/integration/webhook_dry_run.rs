//! The SidecarSet webhook's dry-run pod (decision 0012): what the in-process validator does not
//! check (resources, securityContext, probe handlers, envFrom...) is refused by Kubernetes' own
//! pod validation, naming the SidecarSet's field; valid SidecarSets are admitted.

use kruise_rs_api::sidecarset::SidecarSet;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::support::webhook::{MANAGER_NAMESPACE, webhook_cluster};
use crate::support::{create_with_warnings, local_kube_minor, unique_name, wait_for};

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

/// A ValidatingAdmissionPolicy (and its binding) refusing every pod carrying a container named
/// `marker`, with reason `Invalid`: what a policy engine refusing the dry-run pod looks like to
/// the webhook (a 422, as a field error would be). Scoped by the marker so the other tests'
/// dry runs on this cluster are not refused.
fn marker_policy(name: &str, marker: &str) -> (Value, Value) {
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["CREATE"], "resources": ["pods"]
            }]},
            "matchConditions": [{
                "name": "carries-the-marker",
                "expression": format!("object.spec.containers.exists(c, c.name == '{marker}')")
            }],
            "validations": [{
                "expression": "false",
                "message": format!("pods with a {marker} container are refused here"),
                "reason": "Invalid"
            }]
        }
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]}
    });
    (policy, binding)
}

fn admission_api(client: &kube::Client, kind: &str, plural: &str) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind),
        plural,
    );
    Api::all_with(client.clone(), &resource)
}

/// Waits until a dry-run pod carrying `marker` in the manager's namespace is refused by the
/// policy (`refused`) or passes (`!refused`): policies reach admission through an informer.
async fn wait_for_marker_policy(client: &kube::Client, marker: &str, refused: bool) {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "policy-probe-"},
        "spec": {"containers": [{"name": marker, "image": "busybox"}]}
    });
    let path = format!("/api/v1/namespaces/{MANAGER_NAMESPACE}/pods?dryRun=All");
    let what = if refused {
        "the policy refusing marked pods"
    } else {
        "the policy gone"
    };
    crate::sidecarset_upgrade::poll(what, POLICY_PROPAGATION, || async {
        let answer = create_with_warnings(client, &path, &pod).await;
        let is_refused = answer.message().contains("ValidatingAdmissionPolicy");
        if is_refused == refused {
            Ok(())
        } else {
            Err(format!("{}: {}", answer.code, answer.message()))
        }
    })
    .await;
}

/// How long a new or deleted policy may take to reach admission.
const POLICY_PROPAGATION: std::time::Duration = std::time::Duration::from_secs(60);

/// Issue 42, item 6: a policy that refuses the placeholder pod (reason `Invalid`, so a 422 like
/// a field error) is not the SidecarSet's fault. A valid SidecarSet is admitted with a warning
/// naming the policy, one that pod validation refuses is still refused (the apiserver validates
/// before admission), and once the policy is gone the same name and spec are judged afresh:
/// the policy's refusal was not remembered as a verdict.
#[tokio::test]
async fn a_policy_refusing_the_dry_run_pod_neither_refuses_the_sidecarset_nor_is_remembered() {
    let client = webhook_cluster().client().await;
    let marker = unique_name("refused-here");
    let policy_name = unique_name("no-marked-pods");
    let (policy, binding) = marker_policy(&policy_name, &marker);
    let policies = admission_api(
        &client,
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
    );
    let bindings = admission_api(
        &client,
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
    );
    for (api, object) in [(&policies, &policy), (&bindings, &binding)] {
        let object: DynamicObject = serde_json::from_value(object.clone()).expect("an object");
        api.create(&PostParams::default(), &object)
            .await
            .expect("the policy and its binding are created");
    }
    wait_for_marker_policy(&client, &marker, true).await;

    let sets = "/apis/apps.kruise.io/v1beta1/sidecarsets";
    let name = unique_name("vap-valid");
    let valid = raw_sidecarset(
        &name,
        json!([{"name": &marker, "image": "busybox"}]),
        json!({}),
    );
    // A dry run of the SidecarSet: judged by the webhook, nothing stored, so the real create
    // below has the same name and spec.
    let under_policy = create_with_warnings(&client, &format!("{sets}?dryRun=All"), &valid).await;
    assert_eq!(
        under_policy.code,
        201,
        "a valid SidecarSet is admitted although a policy refuses its dry-run pod: {}",
        under_policy.message()
    );
    assert!(
        under_policy.warnings.iter().any(|w| w.contains(&format!(
            "refused by ValidatingAdmissionPolicy '{policy_name}' with binding '{policy_name}'"
        )) && w.contains("not judged")),
        "a warning names the policy: {:?}",
        under_policy.warnings
    );

    // With no answer from the dry run, the local copy of 1.33's pod rules only advises: a
    // container that 1.36 allows and 1.33 forbids is admitted, the rule it breaks in a warning.
    // (On 1.33 the apiserver's own validation refuses it before any policy runs.)
    let newer = raw_sidecarset(
        &unique_name("vap-newer"),
        json!([{"name": &marker, "image": "busybox", "restartPolicy": "Never",
                "restartPolicyRules": [{"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]}]),
        json!({}),
    );
    let answered = create_with_warnings(&client, &format!("{sets}?dryRun=All"), &newer).await;
    if kube_minor_at_least(35) {
        assert_eq!(answered.code, 201, "{}", answered.message());
        assert!(
            answered.warnings.iter().any(|w| w.contains(
                "Kubernetes 1.33 would refuse pods with these sidecars (a newer Kubernetes may \
                 not): [spec.containers[0].restartPolicy: Forbidden"
            )),
            "the local rules advise: {:?}",
            answered.warnings
        );
    } else {
        assert_eq!(answered.code, 403, "{}", answered.message());
    }

    let invalid = raw_sidecarset(
        &unique_name("vap-invalid"),
        // Only Kubernetes' pod validation checks this (not the in-process checks).
        json!([{"name": &marker, "image": "busybox", "securityContext": {"runAsUser": -1}}]),
        json!({}),
    );
    let refused = create_with_warnings(&client, sets, &invalid).await;
    assert_eq!(refused.code, 403, "{}", refused.message());
    assert!(
        refused
            .message()
            .contains("spec.containers[0].securityContext.runAsUser")
            && refused.message().contains("pod validation"),
        "refused by pod validation, naming the field: {}",
        refused.message()
    );

    // The policy goes: the same name and spec get a verdict of their own, with no warning.
    bindings
        .delete(&policy_name, &Default::default())
        .await
        .expect("binding deleted");
    policies
        .delete(&policy_name, &Default::default())
        .await
        .expect("policy deleted");
    wait_for_marker_policy(&client, &marker, false).await;
    let after = create_with_warnings(&client, sets, &valid).await;
    assert_eq!(
        after.code,
        201,
        "the SidecarSet is admitted once the policy is gone: {}",
        after.message()
    );
    assert!(
        after.warnings.iter().all(|w| !w.contains("not checked")),
        "judged by pod validation this time: {:?}",
        after.warnings
    );
    Api::<SidecarSet>::all(client)
        .delete(&name, &Default::default())
        .await
        .expect("deleted");
}

/// ContainerRestartRules (beta and on by default since Kubernetes 1.35) lets a regular container
/// set `restartPolicy` with `restartPolicyRules`; 1.33 forbids `restartPolicy` there and knows no
/// `restartPolicyRules`. This crate's types are 1.33's, so only the cluster can judge such a
/// sidecar: on 1.36 it is admitted and reaches pods whole, on 1.33 it is refused by the
/// apiserver's own pod validation.
#[tokio::test]
async fn a_sidecar_using_a_newer_kubernetes_field_is_judged_by_the_cluster_and_reaches_pods() {
    let cluster = webhook_cluster();
    let client = cluster.client().await;
    let ns = cluster.namespace("wh-newer").await;
    let name = unique_name("restart-rules");
    let rules = json!([{"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]);
    let set = raw_sidecarset(
        &name,
        json!([{"name": "proxy", "image": "busybox", "command": ["sleep", "999"],
                "restartPolicy": "Never", "restartPolicyRules": rules}]),
        json!({}),
    );
    let sets = "/apis/apps.kruise.io/v1beta1/sidecarsets";
    let created = create_with_warnings(&client, sets, &set).await;
    let minor = local_kube_minor();
    if !kube_minor_at_least(35) {
        assert_eq!(
            created.code,
            403,
            "refused on {minor}: {}",
            created.message()
        );
        assert!(
            created
                .message()
                .contains("spec.containers[0].restartPolicy")
                && created.message().contains("pod validation"),
            "refused by the apiserver's pod validation, naming the field: {}",
            created.message()
        );
        return;
    }
    assert_eq!(
        created.code,
        201,
        "admitted on {minor}, as a pod with this container is: {}",
        created.message()
    );
    assert!(
        created.warnings.iter().all(|w| !w.contains("not checked")),
        "judged by the apiserver's dry run: {:?}",
        created.warnings
    );

    let pods = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        &ns,
        &ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&()),
    );
    // The webhook learns of the new SidecarSet through its watch: until then pods pass unchanged.
    let pod: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "newer-", "labels": {"app": &name}},
        "spec": {"containers": [{"name": "main", "image": "nginx"}]},
    }))
    .expect("a pod");
    let injected = wait_for(
        "a pod injected with the SidecarSet",
        std::time::Duration::from_secs(30),
        || async {
            let created = pods
                .create(&PostParams::default(), &pod)
                .await
                .expect("the pod is admitted");
            let containers = created.data["spec"]["containers"].clone();
            if containers.as_array().is_some_and(|c| c.len() > 1) {
                return Some(containers);
            }
            let name = created.metadata.name.clone().unwrap_or_default();
            let _ = pods.delete(&name, &Default::default()).await;
            None
        },
    )
    .await;
    assert_eq!(injected[0]["name"], "proxy");
    assert_eq!(injected[0]["restartPolicy"], "Never");
    assert_eq!(
        injected[0]["restartPolicyRules"], rules,
        "the sidecar keeps the field this crate's types do not know: {injected}"
    );
    Api::<SidecarSet>::all(client)
        .delete(&name, &Default::default())
        .await
        .expect("SidecarSet deleted");
}

/// Whether the local control plane runs Kubernetes 1.`minor` or newer.
fn kube_minor_at_least(minor: u32) -> bool {
    local_kube_minor()
        .split('.')
        .nth(1)
        .and_then(|m| m.parse::<u32>().ok())
        .is_some_and(|m| m >= minor)
}
