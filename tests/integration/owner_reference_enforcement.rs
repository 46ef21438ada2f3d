//! The manager works where OwnerReferencesPermissionEnforcement is on (OpenShift, hardened
//! clusters; the test control plane enables it for the whole suite, tests/controlplane/start.sh).
//! That plugin lets a client set `blockOwnerDeletion` on an ownerReference only if it may update
//! the owner's finalizers. The manager sets it on the ControllerRevisions and pre-download
//! ImagePullJobs a SidecarSet owns, and on the ImagePullJobs an ImageListPullJob owns: with its
//! shipped RBAC and a real token, each of those creates must pass, and a ServiceAccount that may
//! create the same objects but not update the owner's finalizers must be refused (which proves
//! the plugin is on, so the passes mean something).

use std::time::Duration;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kruise_rs_api::imagelistpulljob::ImageListPullJob;
use kruise_rs_api::imagepulljob::ImagePullJob;
use kruise_rs_api::sidecarset::SidecarSet;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::daemon_nodeimage_policy::{client_with_token, token};
use crate::manager_dry_run_pods_policy::apply_manifests;
use crate::support::{self, wait_for};

/// Where the manifests put the manager and its ServiceAccount.
const NAMESPACE: &str = "kruise-system";
const MANAGER_SA: &str = "kruise-rs-manager";
/// New RBAC reaches the authorizer through informers.
const PROPAGATION: Duration = Duration::from_secs(60);

fn blocking_owner(api_version: &str, kind: &str, name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: api_version.to_owned(),
        kind: kind.to_owned(),
        name: name.to_owned(),
        uid: uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn revision(name: &str, owner: &OwnerReference) -> ControllerRevision {
    ControllerRevision {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(NAMESPACE.to_owned()),
            owner_references: Some(vec![owner.clone()]),
            ..ObjectMeta::default()
        },
        revision: 1,
        data: Some(k8s_openapi::apimachinery::pkg::runtime::RawExtension(
            json!({}),
        )),
    }
}

fn pull_job(name: &str, namespace: &str, owner: &OwnerReference) -> ImagePullJob {
    serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1", "kind": "ImagePullJob",
        "metadata": {"name": name, "namespace": namespace, "ownerReferences": [owner]},
        "spec": {"image": "127.0.0.1:5000/owner-refs:v1",
                 "selector": {"names": ["no-such-node"]},
                 "completionPolicy": {"type": "Always"}}
    }))
    .expect("an ImagePullJob")
}

/// Runs `create`, polling past 403s (RBAC not yet propagated); panics with the last refusal
/// when it never passes, and at once on any other error.
async fn created_once_rbac_is_there<F, Fut, T>(what: &str, create: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let last = std::sync::Mutex::new(String::new());
    let passed = tokio::time::timeout(PROPAGATION, async {
        loop {
            match create().await {
                Ok(_) => return,
                // RBAC not propagated yet, or the plugin refusing: ask again until the deadline.
                Err(kube::Error::Api(s)) if s.code == 403 => {
                    *last.lock().expect("lock") = s.message;
                }
                Err(e) => panic!("{what}: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await;
    assert!(
        passed.is_ok(),
        "{what}: the manager's create never passed: {}",
        last.lock().expect("lock")
    );
}

/// A ServiceAccount in `namespace` that may create ControllerRevisions there and nothing else.
async fn account_without_finalizers(admin: &Client, namespace: &str) -> String {
    let name = support::unique_name("no-finalizers");
    let meta = |n: &str| ObjectMeta {
        name: Some(n.to_owned()),
        namespace: Some(namespace.to_owned()),
        ..ObjectMeta::default()
    };
    Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
        .create(
            &PostParams::default(),
            &ServiceAccount {
                metadata: meta(&name),
                ..ServiceAccount::default()
            },
        )
        .await
        .expect("ServiceAccount");
    Api::<Role>::namespaced(admin.clone(), namespace)
        .create(
            &PostParams::default(),
            &Role {
                metadata: meta(&name),
                rules: Some(vec![PolicyRule {
                    api_groups: Some(vec!["apps".to_owned()]),
                    resources: Some(vec!["controllerrevisions".to_owned()]),
                    verbs: vec!["create".to_owned()],
                    ..PolicyRule::default()
                }]),
            },
        )
        .await
        .expect("Role");
    Api::<RoleBinding>::namespaced(admin.clone(), namespace)
        .create(
            &PostParams::default(),
            &RoleBinding {
                metadata: meta(&name),
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".to_owned(),
                    kind: "Role".to_owned(),
                    name: name.clone(),
                },
                subjects: Some(vec![Subject {
                    kind: "ServiceAccount".to_owned(),
                    name: name.clone(),
                    namespace: Some(namespace.to_owned()),
                    ..Subject::default()
                }]),
            },
        )
        .await
        .expect("RoleBinding");
    name
}

#[tokio::test]
async fn the_manager_may_set_blocking_owner_references_to_sidecarsets_and_lists() {
    let cluster = support::cluster().await;
    let admin = cluster.client().await;
    apply_manifests(cluster);
    let namespace = cluster.namespace("owner-refs").await;
    let ns = namespace.name();

    let set_name = support::unique_name("owner-refs");
    let set: SidecarSet = serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1", "kind": "SidecarSet",
        "metadata": {"name": &set_name},
        "spec": {"selector": {"matchLabels": {"app": &set_name}},
                 "containers": [{"name": "sidecar", "image": "127.0.0.1:5000/sidecar:v1"}]}
    }))
    .expect("a SidecarSet");
    let sets = Api::<SidecarSet>::all(admin.clone());
    let set = sets
        .create(&PostParams::default(), &set)
        .await
        .expect("SidecarSet");
    let set_owner = blocking_owner(
        "apps.kruise.io/v1beta1",
        "SidecarSet",
        &set_name,
        &set.uid().expect("uid"),
    );
    let list: ImageListPullJob = serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1", "kind": "ImageListPullJob",
        "metadata": {"name": "list", "namespace": ns},
        "spec": {"images": ["127.0.0.1:5000/owner-refs:v1"],
                 "selector": {"names": ["no-such-node"]},
                 "completionPolicy": {"type": "Always"}}
    }))
    .expect("an ImageListPullJob");
    let list = Api::<ImageListPullJob>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &list)
        .await
        .expect("ImageListPullJob");
    let list_owner = blocking_owner(
        "apps.kruise.io/v1beta1",
        "ImageListPullJob",
        "list",
        &list.uid().expect("uid"),
    );

    let manager =
        client_with_token(cluster, &token(&admin, NAMESPACE, MANAGER_SA, None).await).await;
    let revision_name = support::unique_name("owner-refs-revision");
    let revisions = Api::<ControllerRevision>::namespaced(manager.clone(), NAMESPACE);
    created_once_rbac_is_there("a SidecarSet's ControllerRevision", || {
        let object = revision(&revision_name, &set_owner);
        let revisions = revisions.clone();
        async move { revisions.create(&PostParams::default(), &object).await }
    })
    .await;
    let jobs = Api::<ImagePullJob>::namespaced(manager.clone(), ns);
    for (what, name, owner) in [
        ("a pre-download ImagePullJob", "predownload", &set_owner),
        ("a list's ImagePullJob", "list-child", &list_owner),
    ] {
        created_once_rbac_is_there(what, || {
            let object = pull_job(name, ns, owner);
            let jobs = jobs.clone();
            async move { jobs.create(&PostParams::default(), &object).await }
        })
        .await;
    }

    // Someone allowed to create ControllerRevisions, not to update the SidecarSet's finalizers.
    let other = account_without_finalizers(&admin, NAMESPACE).await;
    let other = client_with_token(cluster, &token(&admin, NAMESPACE, &other, None).await).await;
    let other_revisions = Api::<ControllerRevision>::namespaced(other, NAMESPACE);
    let refusal = wait_for(
        "the plugin to refuse a blocking reference without the finalizers grant",
        PROPAGATION,
        || async {
            let name = support::unique_name("owner-refs-refused");
            match other_revisions
                .create(&PostParams::default(), &revision(&name, &set_owner))
                .await
            {
                Err(kube::Error::Api(s)) if s.message.contains("blockOwnerDeletion") => {
                    Some(s.message)
                }
                Ok(_) => panic!(
                    "OwnerReferencesPermissionEnforcement is off: a blocking reference to a \
                     SidecarSet passed without the finalizers grant"
                ),
                // RBAC not there yet: 403 for the create itself.
                Err(_) => None,
            }
        },
    )
    .await;
    assert!(refusal.contains("finalizers"), "{refusal}");

    Api::<ControllerRevision>::namespaced(admin.clone(), NAMESPACE)
        .delete(&revision_name, &DeleteParams::default())
        .await
        .expect("cleanup");
    sets.delete(&set_name, &DeleteParams::default())
        .await
        .expect("cleanup");
}
