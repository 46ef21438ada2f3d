//! The harness itself: a real apiserver answers, namespaces can be created, kubectl works.

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;

use crate::support::{cluster, local_kube_minor, repository_crds, wait_for};

#[tokio::test]
async fn apiserver_serves_version_and_namespaces() {
    let cluster = cluster().await;
    let client = cluster.client().await;

    let version = client.apiserver_version().await.expect("GET /version");
    if cluster.is_local() {
        let minor = local_kube_minor();
        assert!(
            version.git_version.starts_with(&format!("v{minor}.")),
            "local control plane reports {}, KUBE_VERSION asks for {minor}",
            version.git_version
        );
    }

    let namespace = cluster.namespace("smoke").await;
    let api: Api<Namespace> = Api::all(client);
    let phase = wait_for(
        "the new namespace to be Active",
        Duration::from_secs(10),
        || async {
            let ns = api
                .get_opt(namespace.name())
                .await
                .expect("GET namespace")?;
            ns.status?.phase.filter(|p| p == "Active")
        },
    )
    .await;
    assert_eq!(phase, "Active");
}

#[tokio::test]
async fn kubectl_reaches_the_apiserver() {
    let cluster = cluster().await;
    let output = tokio::task::spawn_blocking(move || {
        cluster.kubectl().args(["version", "-o", "json"]).output()
    })
    .await
    .expect("join")
    .expect("running kubectl");
    assert!(
        output.status.success(),
        "kubectl version failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let json: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("kubectl version -o json");
    let server = json["serverVersion"]["gitVersion"]
        .as_str()
        .expect("serverVersion.gitVersion");
    if cluster.is_local() {
        let minor = format!("v{}.", local_kube_minor());
        assert!(server.starts_with(&minor), "kubectl saw server {server}");
        // kubectl is built with the apiserver, from the same release.
        let client = json["clientVersion"]["gitVersion"]
            .as_str()
            .expect("clientVersion.gitVersion");
        assert!(client.starts_with(&minor), "kubectl is {client}");
    }
}

#[tokio::test]
async fn repository_crds_are_established() {
    let cluster = cluster().await;
    let api: Api<CustomResourceDefinition> = Api::all(cluster.client().await);
    for (file, crd) in repository_crds().expect("reading crds/") {
        let name = crd.metadata.name.expect("CRD name");
        let live = api
            .get(&name)
            .await
            .unwrap_or_else(|e| panic!("CRD {name} from {} is not installed: {e}", file.display()));
        let established = live
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        assert!(established, "CRD {name} is not Established");
    }
}
