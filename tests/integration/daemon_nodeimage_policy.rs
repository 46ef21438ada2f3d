//! Each daemon writes only its own NodeImage (decision 0011): the ValidatingAdmissionPolicy of
//! `deploy/manifests/08-daemon-nodeimage-policy.yaml` (the chart's default rendering), applied
//! with the daemon's ServiceAccount and RBAC to the real apiserver. The daemon's identity is a
//! real one: a TokenRequest for `kruise-rs-daemon` bound to a pod on node A, which makes the
//! apiserver put node A into the token (user extra `authentication.kubernetes.io/node-name`),
//! the way the kubelet's projected token of a daemon pod does.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{
    BoundObjectReference, SelfSubjectReview, TokenRequest, TokenRequestSpec,
};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ServiceAccount};
use kruise_rs_api::nodeimage::NodeImage;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::AuthInfo;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::support::{self, TestCluster, wait_for};

/// Where the manifests put the two ServiceAccounts.
const NAMESPACE: &str = "kruise-system";
const DAEMON_SA: &str = "kruise-rs-daemon";
const MANAGER_SA: &str = "kruise-rs-manager";
/// The policy's name, which the apiserver puts in front of every denial it makes.
const POLICY: &str = "kruise-rs-daemon-own-nodeimage";
/// The rule, in the words of both of the policy's messages.
const RULE: &str = "a kruise-rs daemon writes only its own node's NodeImage";
/// The missing-claim message.
const NO_CLAIM: &str = "token carries no node-name claim";
const NODE_NAME_CLAIM: &str = "authentication.kubernetes.io/node-name";
/// A new policy and binding (and RBAC) reach admission through informers.
const PROPAGATION: Duration = Duration::from_secs(60);

fn manifest(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/manifests")
        .join(file)
}

/// Applies the shipped policy in `file` (named `policy`) renamed to `name` and matching the
/// ServiceAccount `account` (namespace, name) instead of the chart's, with that account created
/// and granted `rules` (YAML list items) cluster-wide: the shipped rule tried on an identity that
/// RBAC lets do more.
pub(crate) fn apply_renamed_policy(
    cluster: &TestCluster,
    file: &str,
    policy: &str,
    name: &str,
    (ns, sa): (&str, &str),
    rules: &str,
) {
    let shipped = std::fs::read_to_string(manifest(file)).expect("the shipped policy");
    let shipped_user = format!("system:serviceaccount:{NAMESPACE}:{sa}");
    assert!(shipped.contains(&shipped_user) && shipped.contains(policy));
    let renamed = shipped
        .replace(&shipped_user, &format!("system:serviceaccount:{ns}:{sa}"))
        .replace(policy, name);
    let wider_rbac = format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: {sa}, namespace: {ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: {name}}}
rules:
{rules}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {name}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {name}}}
subjects: [{{kind: ServiceAccount, name: {sa}, namespace: {ns}}}]
"#
    );
    let mut cmd = cluster.kubectl();
    cmd.args(["apply", "-f", "-"]);
    let out = support::run_with_stdin(cmd, &format!("{renamed}\n---\n{wider_rbac}"));
    assert!(
        out.status.success(),
        "applying the renamed policy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Server-side applies the shipped namespaces, ServiceAccounts, RBAC and the policy. The same
/// objects `deploy.rs` applies, with the same content, so the two tests never conflict.
fn apply_manifests(cluster: &TestCluster) {
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
        "04-rbac-daemon.yaml",
        "08-daemon-nodeimage-policy.yaml",
    ] {
        cmd.arg("-f").arg(manifest(file));
    }
    let out = cmd.output().expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl apply of the manifests failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A token for `account` of `namespace`, bound to `pod` when given (a Pod's token carries its
/// Node).
pub(crate) async fn token(
    admin: &Client,
    namespace: &str,
    account: &str,
    pod: Option<&Pod>,
) -> String {
    let bound_object_ref = pod.map(|pod| BoundObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Pod".to_owned()),
        name: Some(pod.name_any()),
        uid: pod.uid(),
    });
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            bound_object_ref,
            expiration_seconds: Some(600),
        },
        ..TokenRequest::default()
    };
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    accounts
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("TokenRequest for {account}: {e}"))
        .status
        .unwrap_or_else(|| panic!("TokenRequest for {account}: no status"))
        .token
}

/// A client for the test cluster that authenticates with `token` alone.
pub(crate) async fn client_with_token(cluster: &TestCluster, token: &str) -> Client {
    let mut config = cluster.config().await;
    config.auth_info =
        serde_json::from_value::<AuthInfo>(json!({ "token": token })).expect("an AuthInfo");
    Client::try_from(config).expect("a client with a bearer token")
}

/// What the apiserver says the client's user is: its name and its `node-name` extra.
async fn whoami(client: &Client) -> (String, Option<Vec<String>>) {
    let review = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .unwrap_or_else(|e| panic!("SelfSubjectReview: {e}"));
    let user = review
        .status
        .and_then(|s| s.user_info)
        .expect("a SelfSubjectReview answers with the user");
    let node = user
        .extra
        .and_then(|mut extra| extra.remove(NODE_NAME_CLAIM));
    (user.username.unwrap_or_default(), node)
}

/// A daemon pod on `node` (never run: no kubelet), whose token the kubelet would request bound
/// to it.
async fn daemon_pod(admin: &Client, namespace: &str, node: &str) -> Pod {
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(support::unique_name("own-nodeimage-daemon")),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.to_owned()),
            service_account_name: Some(DAEMON_SA.to_owned()),
            automount_service_account_token: Some(false),
            containers: vec![Container {
                name: "daemon".to_owned(),
                image: Some("127.0.0.1:5000/kruise-rs/kruise-rs:policy-test".to_owned()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    Api::<Pod>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("creating the daemon pod: {e}"))
}

/// The status a daemon writes when its pre-download of `image` succeeded.
fn succeeded(image: &str) -> Value {
    json!({"status": {
        "desired": 1, "succeeded": 1, "failed": 0, "pulling": 0, "waiting": 0,
        "imageStatuses": {image: {"tags": [{"tag": "v1", "phase": "Succeeded"}]}},
    }})
}

fn daemon_params(dry_run: bool) -> PatchParams {
    PatchParams {
        field_manager: Some("kruise-rs-daemon".to_owned()),
        dry_run,
        ..PatchParams::default()
    }
}

/// The apiserver's denial of a patch: 403 Forbidden, message returned for further checks.
fn denial(result: Result<NodeImage, kube::Error>, what: &str) -> String {
    match result {
        Err(kube::Error::Api(status)) if status.code == 403 && status.reason == "Forbidden" => {
            status.message
        }
        Err(e) => panic!("{what}: expected a 403 Forbidden from the policy, got {e}"),
        Ok(ni) => panic!(
            "{what}: expected a denial, the write passed: {:?}",
            ni.status
        ),
    }
}

#[tokio::test]
async fn daemon_nodeimage_policy_lets_a_daemon_write_only_its_own_nodeimage() {
    let cluster = support::cluster().await;
    let admin = cluster.client().await;
    apply_manifests(cluster);

    // Nodes A and B and their NodeImages, named for this test alone (they carry no label the
    // test controllers select, so only this test writes them).
    let node_a = support::unique_name("own-nodeimage-a");
    let node_b = support::unique_name("own-nodeimage-b");
    let nodeimages: Api<NodeImage> = Api::all(admin.clone());
    for node in [&node_a, &node_b] {
        support::create_ready_node(&admin, node, Default::default()).await;
        nodeimages
            .create(
                &PostParams::default(),
                &NodeImage::new(node, Default::default()),
            )
            .await
            .unwrap_or_else(|e| panic!("creating NodeImage {node}: {e}"));
    }

    // A daemon pod on node A (never run: no kubelet) and a token bound to it, as the kubelet
    // would request for the pod's projected service account token.
    let pod = daemon_pod(&admin, NAMESPACE, &node_a).await;
    let daemon_a = client_with_token(
        cluster,
        &token(&admin, NAMESPACE, DAEMON_SA, Some(&pod)).await,
    )
    .await;
    let unbound =
        client_with_token(cluster, &token(&admin, NAMESPACE, DAEMON_SA, None).await).await;
    let manager =
        client_with_token(cluster, &token(&admin, NAMESPACE, MANAGER_SA, None).await).await;

    // The claim the policy reads is really in the pod-bound token, and only there.
    let daemon_user = format!("system:serviceaccount:{NAMESPACE}:{DAEMON_SA}");
    assert_eq!(
        whoami(&daemon_a).await,
        (daemon_user.clone(), Some(vec![node_a.clone()])),
        "a token bound to a pod on {node_a} must carry the node (ServiceAccountTokenPodNodeInfo)"
    );
    assert_eq!(whoami(&unbound).await, (daemon_user, None));

    // The policy takes a moment to reach admission: dry-run writes to B until it is refused
    // (a dry run goes through admission and changes nothing).
    let daemon_nodeimages: Api<NodeImage> = Api::all(daemon_a.clone());
    let attempt = succeeded("attempt");
    let message = wait_for(
        "the policy to refuse the daemon of node A a write to NodeImage B",
        PROPAGATION,
        || {
            let (api, node_b, attempt) = (&daemon_nodeimages, &node_b, &attempt);
            async move {
                match api
                    .patch_status(node_b, &daemon_params(true), &Patch::Merge(attempt))
                    .await
                {
                    Err(kube::Error::Api(status)) if status.message.contains(POLICY) => {
                        Some(status.message)
                    }
                    // Not effective yet (passed), or RBAC not yet effective (refused by it).
                    _ => None,
                }
            }
        },
    )
    .await;
    assert!(message.contains(RULE), "{message}");

    // The daemon of A reports into A's NodeImage.
    let written = daemon_nodeimages
        .patch_status(
            &node_a,
            &daemon_params(false),
            &Patch::Merge(&succeeded("own")),
        )
        .await
        .unwrap_or_else(|e| panic!("the daemon of {node_a} writing its own NodeImage: {e}"));
    let status = written.status.expect("status written");
    assert_eq!(status.succeeded, 1);
    assert!(status.image_statuses.contains_key("own"), "{status:?}");

    // ... and cannot mark B's pre-download Succeeded: the denial names the rule, the
    // NodeImage and the node in the token.
    let message = denial(
        daemon_nodeimages
            .patch_status(
                &node_b,
                &daemon_params(false),
                &Patch::Merge(&succeeded("forged")),
            )
            .await,
        "the daemon of node A writing NodeImage B",
    );
    for part in [
        POLICY,
        RULE,
        &format!("the token is for node {node_a}"),
        &format!("UPDATE of NodeImage {node_b} refused"),
    ] {
        assert!(message.contains(part), "{message:?} lacks {part:?}");
    }

    // A daemon token bound to no pod carries no node: refused everywhere, its own node too,
    // with the message saying why.
    let unbound_nodeimages: Api<NodeImage> = Api::all(unbound);
    for node in [&node_a, &node_b] {
        let message = denial(
            unbound_nodeimages
                .patch_status(
                    node,
                    &daemon_params(false),
                    &Patch::Merge(&succeeded("unbound")),
                )
                .await,
            &format!("a daemon token bound to no pod writing NodeImage {node}"),
        );
        for part in [
            POLICY,
            RULE,
            NO_CLAIM,
            &format!("UPDATE of NodeImage {node} refused"),
        ] {
            assert!(message.contains(part), "{message:?} lacks {part:?}");
        }
    }

    // Nothing the daemons were refused reached B.
    let b = nodeimages.get(&node_b).await.expect("NodeImage B");
    assert!(
        b.status.is_none(),
        "NodeImage B was written: {:?}",
        b.status
    );

    // Other writers are not the policy's business: the manager's ServiceAccount (no node
    // claim either) and the admin write B's status.
    let params = PatchParams {
        field_manager: Some("kruise-rs-nodeimage".to_owned()),
        ..PatchParams::default()
    };
    let manager_nodeimages: Api<NodeImage> = Api::all(manager);
    let by_manager = succeeded("manager");
    wait_for("the manager's write of NodeImage B", PROPAGATION, || {
        let (api, node_b, params, by_manager) =
            (&manager_nodeimages, &node_b, &params, &by_manager);
        async move {
            match api
                .patch_status(node_b, params, &Patch::Merge(by_manager))
                .await
            {
                Ok(_) => Some(()),
                // The manager's RBAC, applied with the policy, may not be effective yet.
                Err(kube::Error::Api(status))
                    if status.code == 403 && !status.message.contains(POLICY) =>
                {
                    None
                }
                Err(e) => panic!("the manager writing NodeImage B: {e}"),
            }
        }
    })
    .await;
    let b = nodeimages
        .patch_status(&node_b, &params, &Patch::Merge(&succeeded("admin")))
        .await
        .unwrap_or_else(|e| panic!("the admin writing NodeImage B: {e}"));
    let images = b.status.expect("status written").image_statuses;
    assert!(
        images.contains_key("manager") && images.contains_key("admin"),
        "{images:?}"
    );
}

/// The daemon's RBAC grants neither CREATE nor DELETE, so the shipped policy's rules for them
/// never run against the shipped ServiceAccount. Here the shipped policy text, renamed and
/// pointed at a ServiceAccount of this test's own namespace, meets an account that RBAC lets
/// create and delete NodeImages: the policy alone keeps it to its own node's.
#[tokio::test]
async fn daemon_nodeimage_policy_holds_for_create_and_delete_too() {
    let cluster = support::cluster().await;
    let admin = cluster.client().await;
    let namespace = cluster.namespace("own-nodeimage-policy").await;
    let ns = namespace.name();
    let name = format!("{ns}-own-nodeimage");

    apply_renamed_policy(
        cluster,
        "08-daemon-nodeimage-policy.yaml",
        POLICY,
        &name,
        (ns, DAEMON_SA),
        r#"  - apiGroups: ["apps.kruise.io"]
    resources: ["nodeimages"]
    verbs: ["get", "create", "delete"]"#,
    );

    let node_a = support::unique_name("own-nodeimage-a");
    let node_b = support::unique_name("own-nodeimage-b");
    for node in [&node_a, &node_b] {
        support::create_ready_node(&admin, node, Default::default()).await;
    }
    let nodeimages: Api<NodeImage> = Api::all(admin.clone());
    nodeimages
        .create(
            &PostParams::default(),
            &NodeImage::new(&node_b, Default::default()),
        )
        .await
        .unwrap_or_else(|e| panic!("creating NodeImage {node_b}: {e}"));
    let pod = daemon_pod(&admin, ns, &node_a).await;
    let daemon_a =
        client_with_token(cluster, &token(&admin, ns, DAEMON_SA, Some(&pod)).await).await;
    let daemon_nodeimages: Api<NodeImage> = Api::all(daemon_a);

    // Until both the RBAC and the policy are effective, a dry-run create of another node's
    // NodeImage is refused by RBAC or passes; then the policy refuses it.
    let create = |node: String, dry_run: bool| {
        let api = daemon_nodeimages.clone();
        async move {
            let params = PostParams {
                dry_run,
                ..PostParams::default()
            };
            api.create(&params, &NodeImage::new(&node, Default::default()))
                .await
        }
    };
    let message = wait_for(
        "the renamed policy to refuse the daemon of node A creating NodeImage B",
        PROPAGATION,
        || {
            let attempt = create(node_b.clone(), true);
            let name = &name;
            async move {
                match attempt.await {
                    Err(kube::Error::Api(status)) if status.message.contains(name.as_str()) => {
                        Some(status.message)
                    }
                    _ => None,
                }
            }
        },
    )
    .await;
    for part in [RULE, &format!("CREATE of NodeImage {node_b} refused")] {
        assert!(message.contains(part), "{message:?} lacks {part:?}");
    }

    // Its own node's NodeImage it may create and delete; another node's it may not delete.
    create(node_a.clone(), false)
        .await
        .unwrap_or_else(|e| panic!("the daemon of {node_a} creating its own NodeImage: {e}"));
    let message = match daemon_nodeimages.delete(&node_b, &Default::default()).await {
        Err(kube::Error::Api(status)) if status.code == 403 => status.message,
        other => panic!("the daemon of node A deleting NodeImage B: expected a 403, got {other:?}"),
    };
    for part in [
        name.as_str(),
        RULE,
        &format!("the token is for node {node_a}"),
        &format!("DELETE of NodeImage {node_b} refused"),
    ] {
        assert!(message.contains(part), "{message:?} lacks {part:?}");
    }
    assert!(
        nodeimages
            .get_opt(&node_b)
            .await
            .expect("reading B")
            .is_some()
    );
    daemon_nodeimages
        .delete(&node_a, &Default::default())
        .await
        .unwrap_or_else(|e| panic!("the daemon of {node_a} deleting its own NodeImage: {e}"));

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
