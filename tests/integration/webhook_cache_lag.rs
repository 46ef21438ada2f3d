//! The pod webhook while its SidecarSet cache lags the apiserver. The soak lost pods created
//! within 0.2 s of their SidecarSet: the watch behind the cache had not delivered it yet. Here
//! the lag is made as long as the test wants: the manager talks to the apiserver through a
//! [`FaultProxy`] that holds every watch event back, while the test writes SidecarSets and pods
//! straight to the apiserver. Each pod must get the sidecars of the SidecarSets as they are when
//! it is created (decision 0031).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kruise_rs_api::sidecarset::SidecarSet;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::Config;
use serde_json::json;

use crate::harness::fault_proxy::FaultProxy;
use crate::sidecarset_upgrade::poll;
use crate::support::webhook::{WEBHOOK_NAMESPACE_LABEL, own_manager_with_webhooks};
use crate::support::{ExtraControlPlane, client_for, start_manager};

const TIMEOUT: Duration = Duration::from_secs(60);
const INJECTED_LIST: &str = "kruise.io/sidecarset-injected-list";

fn sidecarset(name: &str, image: &str) -> SidecarSet {
    serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "SidecarSet",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "containers": [{"name": name, "image": image, "command": ["sleep", "999"]}]
        }
    }))
    .expect("a SidecarSet")
}

fn pod() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"generateName": "web-", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "main", "image": "nginx:1.25"}]}
    }))
    .expect("a pod")
}

/// The pod's containers as `name=image`, in order.
fn containers(pod: &Pod) -> Vec<String> {
    pod.spec
        .iter()
        .flat_map(|spec| &spec.containers)
        .map(|c| format!("{}={}", c.name, c.image.as_deref().unwrap_or_default()))
        .collect()
}

#[tokio::test]
async fn a_pod_gets_the_sidecarsets_as_they_are_while_the_webhooks_cache_lags() {
    let plane = ExtraControlPlane::start_with_crds().await;
    let client = client_for(plane.kubeconfig_path()).await;
    let mut upstream = Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(plane.kubeconfig_path()).expect("kubeconfig"),
        &Default::default(),
    )
    .await
    .expect("a config");
    upstream.read_timeout = None; // the proxy carries the manager's watches
    let proxy = FaultProxy::start(kube::Client::try_from(upstream).expect("client"), 1)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let opts = own_manager_with_webhooks(proxy.kubeconfig());
    let _manager = start_manager(opts, TIMEOUT, "behind the fault proxy").await;
    let ns = "lag";
    crate::harness::objects::create_namespace(&client, ns, &[(WEBHOOK_NAMESPACE_LABEL, "true")])
        .await
        .expect("namespace");
    let sets = Api::<SidecarSet>::all(client.clone());
    let pods = Api::<Pod>::namespaced(client.clone(), ns);

    // In the cache before the lag: pods get it once the apiserver calls the webhook.
    sets.create(&PostParams::default(), &sidecarset("early", "busybox:1.36"))
        .await
        .expect("SidecarSet early");
    poll("a pod injected with early", TIMEOUT, || {
        let pods = pods.clone();
        async move {
            let created = pods
                .create(&PostParams::default(), &pod())
                .await
                .map_err(|e| e.to_string())?;
            match created.annotations().get(INJECTED_LIST) {
                Some(list) if list == "early" => Ok(()),
                other => Err(format!("injected list {other:?}")),
            }
        }
    })
    .await;

    // From here the manager's caches see nothing new.
    proxy.hold_watch_events();
    sets.create(&PostParams::default(), &sidecarset("late", "busybox:1.37"))
        .await
        .expect("SidecarSet late");
    let image = json!({"spec": {"containers": [
        {"name": "early", "image": "busybox:1.38", "command": ["sleep", "999"]}
    ]}});
    sets.patch("early", &PatchParams::default(), &Patch::Merge(&image))
        .await
        .expect("early's image changed");

    let created = pods
        .create(&PostParams::default(), &pod())
        .await
        .expect("a pod while the cache lags");
    assert_eq!(
        created.annotations().get(INJECTED_LIST).map(String::as_str),
        Some("early,late"),
        "a SidecarSet created a moment before the pod is injected"
    );
    assert_eq!(
        containers(&created),
        ["early=busybox:1.38", "late=busybox:1.37", "main=nginx:1.25"],
        "each sidecar as its SidecarSet is now, not as the cache last saw it"
    );

    // Deleted while the cache still holds it: left out.
    sets.delete("early", &DeleteParams::default())
        .await
        .expect("early deleted");
    poll("early gone", TIMEOUT, || {
        let sets = sets.clone();
        async move {
            match sets.get_opt("early").await {
                Ok(None) => Ok(()),
                Ok(Some(set)) => Err(format!("still there: {:?}", set.finalizers())),
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await;
    let created = pods
        .create(&PostParams::default(), &pod())
        .await
        .expect("a pod after the delete");
    assert_eq!(
        created.annotations().get(INJECTED_LIST).map(String::as_str),
        Some("late")
    );
    assert_eq!(
        containers(&created),
        ["late=busybox:1.37", "main=nginx:1.25"]
    );
    proxy.release_watch_events();
}
