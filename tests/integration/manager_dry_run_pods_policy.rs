//! The manager creates pods only as dry runs (decision 0012): the ValidatingAdmissionPolicy of
//! `deploy/manifests/09-manager-dry-run-pods-policy.yaml` (the chart's default rendering),
//! applied with the manager's ServiceAccount and RBAC to the real apiserver. The manager's
//! identity is a real one: a TokenRequest for `kruise-rs-manager`, whose Role grants `create
//! pods` in `kruise-system` for the SidecarSet webhook's dry-run pod. A stored pod is refused
//! with the policy's message; the webhook's own dry run (`dry_run::judge`) still gives its
//! verdicts; other users' creates are not the policy's business.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kruise_rs::webhook::dry_run::{self, Outcome};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::daemon_nodeimage_policy::{apply_renamed_policy, client_with_token, token};
use crate::support::{self, TestCluster, wait_for};

/// Where the manifests put the manager, its ServiceAccount and its `create pods` Role.
const NAMESPACE: &str = "kruise-system";
const MANAGER_SA: &str = "kruise-rs-manager";
/// The policy's name, which the apiserver puts in front of every denial it makes.
const POLICY: &str = "kruise-rs-manager-dry-run-pods-only";
/// The rule, in the words of the policy's message.
const RULE: &str = "the kruise-rs manager creates pods only as dry runs";
/// A new policy and binding (and RBAC) reach admission and the authorizer through informers.
const PROPAGATION: Duration = Duration::from_secs(60);

/// Server-side applies the shipped namespaces, ServiceAccounts, the manager's RBAC and the
/// policy: the same objects, with the same content, `deploy.rs` applies.
pub(crate) fn apply_manifests(cluster: &TestCluster) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/manifests");
    let mut cmd = cluster.kubectl();
    cmd.args([
        "apply",
        "--server-side",
        "--field-manager=kruise-rs-policy-test",
    ]);
    for file in [
        "00-namespaces.yaml",
        "02-serviceaccounts.yaml",
        "03-rbac-manager.yaml",
        "09-manager-dry-run-pods-policy.yaml",
    ] {
        cmd.arg("-f").arg(dir.join(file));
    }
    let out = cmd.output().expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl apply of the manifests failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A pod (never run: no kubelet) named `name` in the manager's namespace.
fn pod(name: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(NAMESPACE.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            automount_service_account_token: Some(false),
            containers: vec![Container {
                name: "app".to_owned(),
                image: Some("127.0.0.1:5000/kruise-rs/policy-test:v1".to_owned()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

fn params(dry_run: bool) -> PostParams {
    PostParams {
        dry_run,
        ..PostParams::default()
    }
}

/// A denial by `policy`: 403 Forbidden naming it; the message, for further checks.
fn denial<T: std::fmt::Debug>(result: Result<T, kube::Error>, policy: &str, what: &str) -> String {
    match result {
        Err(kube::Error::Api(status))
            if status.code == 403
                && status.reason == "Forbidden"
                && status.message.contains(policy) =>
        {
            status.message
        }
        Err(e) => panic!("{what}: expected a 403 Forbidden from {policy}, got {e}"),
        Ok(created) => panic!("{what}: expected a denial, the create passed: {created:?}"),
    }
}

async fn exists(admin: &Client, name: &str) -> bool {
    Api::<Pod>::namespaced(admin.clone(), NAMESPACE)
        .get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("reading pod {name}: {e}"))
        .is_some()
}

#[tokio::test]
async fn manager_dry_run_pods_policy_lets_the_manager_create_pods_only_as_dry_runs() {
    let cluster = support::cluster().await;
    let admin = cluster.client().await;
    apply_manifests(cluster);
    let admin_pods: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);

    // A pod the admin stores (other users are not matched), whose name the probe below reuses.
    let existing = support::unique_name("dry-run-pods-existing");
    admin_pods
        .create(&params(false), &pod(&existing))
        .await
        .unwrap_or_else(|e| panic!("the admin creating pod {existing}: {e}"));

    let manager =
        client_with_token(cluster, &token(&admin, NAMESPACE, MANAGER_SA, None).await).await;
    let manager_pods: Api<Pod> = Api::namespaced(manager.clone(), NAMESPACE);

    // The policy (and the manager's Role) take a moment to be effective. Probe with a real
    // create of the name that exists: validating admission runs before storage, so until the
    // policy is effective the apiserver answers 409 AlreadyExists (or 403 from RBAC) and stores
    // nothing; then the policy refuses it.
    let message = wait_for(
        "the policy to refuse the manager a stored pod",
        PROPAGATION,
        || {
            let (api, existing) = (&manager_pods, &existing);
            async move {
                match api.create(&params(false), &pod(existing)).await {
                    Err(kube::Error::Api(status)) if status.message.contains(POLICY) => {
                        Some(status.message)
                    }
                    Err(kube::Error::Api(status)) if status.code == 409 || status.code == 403 => {
                        None
                    }
                    other => panic!("the manager creating pod {existing}: {other:?}"),
                }
            }
        },
    )
    .await;
    assert!(message.contains(RULE), "{message}");

    // A stored pod of a new name: refused, saying which pod where, and not stored.
    let fresh = support::unique_name("dry-run-pods-fresh");
    let message = denial(
        manager_pods.create(&params(false), &pod(&fresh)).await,
        POLICY,
        "the manager creating a stored pod",
    );
    for part in [
        POLICY,
        RULE,
        &format!("CREATE of pod {fresh} in namespace {NAMESPACE} without dryRun refused"),
    ] {
        assert!(message.contains(part), "{message:?} lacks {part:?}");
    }
    assert!(!exists(&admin, &fresh).await, "pod {fresh} was stored");

    // The same pod as a dry run passes (and is not stored).
    let judged = manager_pods
        .create(&params(true), &pod(&fresh))
        .await
        .unwrap_or_else(|e| panic!("the manager's dry-run create of pod {fresh}: {e}"));
    assert_eq!(judged.name_any(), fresh);
    assert!(
        !exists(&admin, &fresh).await,
        "the dry-run pod {fresh} was stored"
    );

    // The webhook's own dry run, with the manager's identity, gets the apiserver's verdicts
    // (not the fail-open `Unknown` a refusal would give): valid, and invalid naming the field.
    let set = |containers: serde_json::Value| {
        json!({"apiVersion": "apps.kruise.io/v1beta1", "kind": "SidecarSet",
               "metadata": {"name": "policy"}, "spec": {"containers": containers}})
    };
    let valid = dry_run::synthetic_pod(
        &set(json!([{"name": "proxy", "image": "envoy:v1",
                     "resources": {"limits": {"memory": "64Mi"}}}])),
        NAMESPACE,
    );
    assert_eq!(dry_run::judge(&manager, &valid, 1).await, Outcome::Valid);
    let invalid = dry_run::synthetic_pod(
        &set(json!([{"name": "proxy", "image": "envoy:v1",
                     "securityContext": {"runAsUser": -1}}])),
        NAMESPACE,
    );
    match dry_run::judge(&manager, &invalid, 1).await {
        Outcome::Invalid(causes) => assert!(
            causes
                .iter()
                .any(|c| c.contains("spec.containers[0].securityContext.runAsUser")),
            "{causes:?}"
        ),
        other => panic!("the invalid sidecar's dry run: {other:?}"),
    }
    // The same synthetic pod stored (a generated name) is refused.
    let object: kube::api::DynamicObject =
        serde_json::from_value(valid.clone()).expect("a pod object");
    let dynamic = Api::<kube::api::DynamicObject>::namespaced_with(
        manager.clone(),
        NAMESPACE,
        &kube::api::ApiResource::erase::<Pod>(&()),
    );
    let message = denial(
        dynamic.create(&params(false), &object).await,
        POLICY,
        "the manager storing the webhook's synthetic pod",
    );
    assert!(
        message.contains(&format!("CREATE of pod {}", dry_run::GENERATE_NAME)),
        "{message}"
    );

    // Another ServiceAccount of the same namespace with the same grant stores pods.
    let other = support::unique_name("dry-run-pods-other");
    let rbac = format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: {other}, namespace: {NAMESPACE}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: {other}, namespace: {NAMESPACE}}}
rules:
  - apiGroups: [""]
    resources: ["pods"]
    verbs: ["create"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: {other}, namespace: {NAMESPACE}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {other}}}
subjects: [{{kind: ServiceAccount, name: {other}, namespace: {NAMESPACE}}}]
"#
    );
    let mut cmd = cluster.kubectl();
    cmd.args(["apply", "-f", "-"]);
    let out = support::run_with_stdin(cmd, &rbac);
    assert!(
        out.status.success(),
        "applying the other ServiceAccount: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let other_pods: Api<Pod> = Api::namespaced(
        client_with_token(cluster, &token(&admin, NAMESPACE, &other, None).await).await,
        NAMESPACE,
    );
    let stored = support::unique_name("dry-run-pods-by-other");
    wait_for("another ServiceAccount's stored pod", PROPAGATION, || {
        let (api, stored) = (&other_pods, &stored);
        async move {
            match api.create(&params(false), &pod(stored)).await {
                Ok(_) => Some(()),
                // Its Role may not be effective yet; the policy never answers it.
                Err(kube::Error::Api(status))
                    if status.code == 403 && !status.message.contains(POLICY) =>
                {
                    None
                }
                Err(e) => panic!("{stored} by another ServiceAccount: {e}"),
            }
        }
    })
    .await;
    assert!(exists(&admin, &stored).await);

    // The pods and the other account are this test's alone: remove them.
    for name in [&existing, &stored] {
        admin_pods
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("deleting pod {name}: {e}"));
    }
    let mut cmd = cluster.kubectl();
    cmd.args([
        "delete",
        "-n",
        NAMESPACE,
        "--ignore-not-found",
        &format!("serviceaccount/{other}"),
        &format!("role/{other}"),
        &format!("rolebinding/{other}"),
    ]);
    let out = cmd.output().expect("kubectl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The shipped policy matches pod CREATE in every namespace, not only the manager's: a wider
/// grant added later gains no stored pod either. The manager's RBAC allows pods in
/// `kruise-system` only, so here the shipped policy text, renamed and pointed at a
/// ServiceAccount of this test's own namespace, meets an account that RBAC lets create pods in
/// every namespace.
#[tokio::test]
async fn manager_dry_run_pods_policy_holds_in_every_namespace() {
    let cluster = support::cluster().await;
    let admin = cluster.client().await;
    let namespace = cluster.namespace("dry-run-pods-policy").await;
    let ns = namespace.name();
    let other = cluster.namespace("dry-run-pods-elsewhere").await;
    let elsewhere = other.name();
    let name = format!("{ns}-dry-run-pods-only");

    apply_renamed_policy(
        cluster,
        "09-manager-dry-run-pods-policy.yaml",
        POLICY,
        &name,
        (ns, MANAGER_SA),
        r#"  - apiGroups: [""]
    resources: ["pods"]
    verbs: ["create"]"#,
    );

    let account = client_with_token(cluster, &token(&admin, ns, MANAGER_SA, None).await).await;
    // In a namespace that is neither the manager's nor the account's own.
    let pods: Api<Pod> = Api::namespaced(account, elsewhere);
    let stored = |name: &str| {
        let mut pod = pod(name);
        pod.metadata.namespace = Some(elsewhere.to_owned());
        pod
    };
    // Probe with a stored create of a name the admin already stored there, as above: 409 (or
    // 403 from RBAC) until the renamed policy is effective, then its refusal; nothing is stored.
    let existing = support::unique_name("dry-run-pods-existing");
    Api::<Pod>::namespaced(admin.clone(), elsewhere)
        .create(&params(false), &stored(&existing))
        .await
        .unwrap_or_else(|e| panic!("the admin creating pod {existing}: {e}"));
    wait_for(
        "the renamed policy to refuse a stored pod in another namespace",
        PROPAGATION,
        || {
            let (pods, existing, name, stored) = (&pods, &existing, &name, &stored);
            async move {
                match pods.create(&params(false), &stored(existing)).await {
                    Err(kube::Error::Api(status)) if status.message.contains(name.as_str()) => {
                        Some(())
                    }
                    Err(kube::Error::Api(status)) if status.code == 409 || status.code == 403 => {
                        None
                    }
                    other => panic!("the account creating pod {existing}: {other:?}"),
                }
            }
        },
    )
    .await;
    let probe = support::unique_name("dry-run-pods-probe");
    let message = denial(
        pods.create(&params(false), &stored(&probe)).await,
        &name,
        "a stored pod in another namespace",
    );
    for part in [
        name.as_str(),
        RULE,
        &format!("CREATE of pod {probe} in namespace {elsewhere} without dryRun refused"),
    ] {
        assert!(message.contains(part), "{message:?} lacks {part:?}");
    }
    pods.create(&params(true), &stored(&probe))
        .await
        .unwrap_or_else(|e| panic!("the dry-run create in {elsewhere}: {e}"));
    assert!(
        Api::<Pod>::namespaced(admin.clone(), elsewhere)
            .get_opt(&probe)
            .await
            .expect("reading the probe pod")
            .is_none()
    );

    // The renamed policy and the wider RBAC are this test's alone: remove them.
    let mut cmd = cluster.kubectl();
    cmd.args([
        "delete",
        "--ignore-not-found",
        &format!("validatingadmissionpolicy/{name}"),
        &format!("validatingadmissionpolicybinding/{name}"),
        &format!("clusterrole/{name}"),
        &format!("clusterrolebinding/{name}"),
    ]);
    let out = cmd.output().expect("kubectl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
