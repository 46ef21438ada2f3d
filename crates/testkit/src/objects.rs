//! Objects the benches and tests make the same way: Ready fake Nodes, namespaces, and the hash
//! annotations the webhook writes onto a SidecarSet.

use std::collections::BTreeMap;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};

/// Creates Node `name` labelled `labels` and reports it Ready (condition `Ready` True, reason
/// `KubeletReady`), as a kubelet would; no kubelet runs it.
pub async fn create_ready_node(
    client: &Client,
    name: &str,
    labels: BTreeMap<String, String>,
) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        ..Node::default()
    };
    nodes.create(&PostParams::default(), &node).await?;
    let now = Time(Timestamp::now());
    let ready = serde_json::json!({"status": {"conditions": [{
        "type": "Ready", "status": "True", "reason": "KubeletReady",
        "message": "set by the test", "lastHeartbeatTime": now, "lastTransitionTime": now,
    }]}});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&ready))
        .await?;
    Ok(())
}

/// Creates `n` Ready Nodes `bench-node-00000`.. labelled `labels` and their own
/// `kubernetes.io/hostname`, `concurrency` at a time.
pub async fn create_ready_nodes(
    client: &Client,
    n: usize,
    labels: &BTreeMap<String, String>,
    concurrency: usize,
) -> Result<(), kube::Error> {
    futures::stream::iter(0..n)
        .map(|i| async move {
            let name = format!("bench-node-{i:05}");
            let mut labels = labels.clone();
            labels.insert("kubernetes.io/hostname".to_owned(), name.clone());
            create_ready_node(client, &name, labels).await
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// Creates namespace `name` labelled `labels`; one that exists already is left as it is.
pub async fn create_namespace(
    client: &Client,
    name: &str,
    labels: &[(&str, &str)],
) -> Result<(), kube::Error> {
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: (!labels.is_empty()).then(|| {
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect()
            }),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(err) => Err(err),
    }
}

/// Writes the hash annotations the webhook would write onto `set` (already defaulted).
pub fn stamp_hashes(set: &mut kruise_rs_api::sidecarset::SidecarSet) {
    use kruise_rs_api::well_known::{SIDECARSET_HASH, SIDECARSET_HASH_WITHOUT_IMAGE};
    use kruise_rs_sidecar::hash::{sidecarset_hash, sidecarset_hash_without_image};
    let hash = sidecarset_hash(&set.spec);
    let without_image = sidecarset_hash_without_image(&set.spec);
    let annotations = set
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    annotations.insert(SIDECARSET_HASH.to_owned(), hash);
    annotations.insert(SIDECARSET_HASH_WITHOUT_IMAGE.to_owned(), without_image);
}
