//! Native sidecars (SidecarSet init containers with `restartPolicy: Always`) upgraded in place
//! with `RollingUpdate`, against the SidecarSet controller of the webhook test cluster: the
//! same strategy, annotations and status as ordinary sidecars (upstream refuses
//! `RollingUpdate` for them: #1671). The test plays the kubelet (`support::kubelet`), which
//! restarts a native sidecar whose spec image changed on its new image, one more restart, as
//! the real kubelet does (the e2e suite checks that one).

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kruise_rs_api::well_known::SIDECARSET_INPLACE_UPDATE_STATE;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::sidecarset_upgrade::{
    Counts, NEW_IMAGE, OLD_IMAGE, ROLLOUT_TIMEOUT, admit_injected, base_pod, client, counts,
    counts_of, create_sidecarset, describe_set, ensure_manager_namespace, get_set, hash_of,
    pod_entry, pod_hash, poll, update_spec,
};
use crate::support::kubelet;
use crate::support::webhook::webhook_cluster;
use crate::support::{CONTROLLED_LABEL, unique_name};

/// The native sidecar of [`native_sidecarset`].
const NATIVE: &str = "native-sidecar";
/// Its plain init container, which the upgrade never touches.
const SETUP: &str = "setup";
const SETUP_IMAGE: &str = "busybox:1.36";

/// A SidecarSet with a plain init container and a native sidecar on `image`, no other sidecar,
/// RollingUpdate with maxUnavailable 1; selecting pods labelled `app: <app>` in `ns` only.
fn native_sidecarset(name: &str, app: &str, ns: &str, image: &str) -> Value {
    json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "SidecarSet",
        "metadata": {"name": name, "labels": {CONTROLLED_LABEL: name}},
        "spec": {
            "selector": {"matchLabels": {"app": app}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "updateStrategy": {"type": "RollingUpdate", "maxUnavailable": 1},
            "initContainers": init_containers(image),
        }
    })
}

fn init_containers(native_image: &str) -> Value {
    init_containers_with(SETUP_IMAGE, native_image)
}

fn init_containers_with(setup_image: &str, native_image: &str) -> Value {
    json!([
        {"name": SETUP, "image": setup_image, "command": ["/bin/sh", "-c", "true"]},
        {"name": NATIVE, "image": native_image, "restartPolicy": "Always",
         "command": ["tail", "-f", "/dev/null"]},
    ])
}

fn init_spec_image(pod: &Pod, name: &str) -> String {
    pod.spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .find(|c| c.name == name)
        .and_then(|c| c.image.clone())
        .unwrap_or_default()
}

fn init_status<'p>(pod: &'p Pod, name: &str) -> Option<&'p ContainerStatus> {
    pod.status
        .iter()
        .flat_map(|s| s.init_container_statuses.iter().flatten())
        .find(|s| s.name == name)
}

fn container_restarts(pod: &Pod) -> Vec<(String, i32)> {
    pod.status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .map(|s| (s.name.clone(), s.restart_count))
        .collect()
}

fn describe_pods(pods: &[Pod]) -> String {
    let lines: Vec<String> = pods
        .iter()
        .map(|p| {
            let reported = init_status(p, NATIVE)
                .map(|s| format!("{} ready={} restarts={}", s.image, s.ready, s.restart_count))
                .unwrap_or_else(|| "no status".to_owned());
            format!(
                "{}: {NATIVE} spec {} reported {reported}",
                p.name_any(),
                init_spec_image(p, NATIVE)
            )
        })
        .collect();
    lines.join("; ")
}

async fn list_pods(pods: &Api<Pod>) -> Vec<Pod> {
    let mut list = pods
        .list(&ListParams::default())
        .await
        .unwrap_or_else(|e| panic!("listing pods: {e}"))
        .items;
    list.sort_by_key(|p| p.name_any());
    list
}

/// Waits until SidecarSet `set`'s status describes its current generation with `expected`
/// counts and `check` accepts it and the pods; with `kubelet_on`, a pass of the played kubelet
/// runs before each look.
async fn wait_rollout(
    client: &Client,
    pods: &Api<Pod>,
    set: &str,
    kubelet_on: bool,
    expected: Counts,
    check: impl Fn(&kruise_rs_api::sidecarset::SidecarSet, &[Pod]) -> Result<(), String>,
) -> Vec<Pod> {
    let check = &check;
    let what = format!("SidecarSet {set} to report {expected:?} (kubelet on: {kubelet_on})");
    poll(&what, ROLLOUT_TIMEOUT, || async move {
        if kubelet_on {
            kubelet::sync(pods, &|_| false).await;
        }
        let sidecarset = get_set(client, set).await;
        let list = list_pods(pods).await;
        let seen = || {
            format!(
                "{}; pods: {}",
                describe_set(&sidecarset),
                describe_pods(&list)
            )
        };
        let status = sidecarset.status.clone().unwrap_or_default();
        if status.observed_generation != sidecarset.metadata.generation
            || counts_of(&sidecarset) != expected
        {
            return Err(seen());
        }
        check(&sidecarset, &list).map_err(|e| format!("{e}; {}", seen()))?;
        Ok(list)
    })
    .await
}

fn condition_reason(set: &kruise_rs_api::sidecarset::SidecarSet, type_: &str) -> String {
    set.status
        .iter()
        .flat_map(|s| &s.conditions)
        .find(|c| c.type_ == type_)
        .map(|c| format!("{}/{}", c.status, c.reason))
        .unwrap_or_default()
}

/// A native sidecar's new image reaches every pod in place, one pod at a time
/// (maxUnavailable 1): its init container image is patched, the plain init container and the
/// app container are untouched, the pods record the new hash and the old imageID, and the
/// status counts them updated and ready once the (played) kubelet restarted the sidecar.
#[tokio::test]
async fn a_native_sidecar_image_change_upgrades_every_pod_in_place() {
    let client = client().await;
    ensure_manager_namespace(&client).await;
    let ns = webhook_cluster().namespace("sc-native").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let app = unique_name("app");
    let name = unique_name("sc-native");

    let set = create_sidecarset(&client, &native_sidecarset(&name, &app, &ns, OLD_IMAGE)).await;
    let mut names = Vec::new();
    for _ in 0..3 {
        let pod = admit_injected(&pods, &base_pod(&app), &[&set]).await;
        assert_eq!(init_spec_image(&pod, NATIVE), OLD_IMAGE, "injected");
        kubelet::start(&pods, &pod.name_any()).await;
        names.push(pod.name_any());
    }
    let before = wait_rollout(&client, &pods, &name, true, counts(3, 3, 3, 3), |_, _| {
        Ok(())
    })
    .await;
    for pod in &before {
        assert!(
            kubelet::runs(pod, NATIVE, OLD_IMAGE),
            "{}",
            describe_pods(&before)
        );
    }

    // The plain init container's image changes too: it ran once, it is never touched.
    let changed = update_spec(
        &client,
        &name,
        json!({"initContainers": init_containers_with("busybox:1.37", NEW_IMAGE)}),
    )
    .await;
    assert_ne!(
        hash_of(&changed),
        hash_of(&set),
        "a native sidecar's image is hashed"
    );

    // Kubelet off: one pod is patched (maxUnavailable 1) and stays unavailable (its sidecar
    // still reports the old imageID), so the rollout holds there, and says so: what a kubelet
    // that never restarts the native sidecar would show.
    let held = wait_rollout(
        &client,
        &pods,
        &name,
        false,
        counts(3, 1, 2, 0),
        |set, pods| {
            let patched: Vec<String> = pods
                .iter()
                .filter(|p| init_spec_image(p, NATIVE) == NEW_IMAGE)
                .map(|p| p.name_any())
                .collect();
            if patched.len() != 1 {
                return Err(format!("pods {patched:?} have the new image"));
            }
            match condition_reason(set, "RolloutHeld").as_str() {
                "True/MaxUnavailableReached" => Ok(()),
                other => Err(format!("RolloutHeld {other}")),
            }
        },
    )
    .await;
    let upgraded = held
        .iter()
        .find(|p| init_spec_image(p, NATIVE) == NEW_IMAGE)
        .expect("one upgraded pod");
    let original = before
        .iter()
        .find(|p| p.name_any() == upgraded.name_any())
        .expect("the same pod before");
    let old_image_id = init_status(original, NATIVE)
        .expect("status")
        .image_id
        .clone();
    let state = pod_entry(upgraded, SIDECARSET_INPLACE_UPDATE_STATE, &name)
        .unwrap_or_else(|| panic!("no in-place update state: {:?}", upgraded.annotations()));
    assert_eq!(
        state["lastContainerStatuses"][NATIVE]["imageID"],
        json!(old_image_id),
        "{state}"
    );
    assert_eq!(pod_hash(upgraded, &name), hash_of(&changed));

    // Kubelet on: every pod gets there.
    let after = wait_rollout(
        &client,
        &pods,
        &name,
        true,
        counts(3, 3, 3, 3),
        |set, pods| {
            if pods.iter().any(|p| !kubelet::runs(p, NATIVE, NEW_IMAGE)) {
                return Err("a native sidecar is not on the new image yet".to_owned());
            }
            match condition_reason(set, "RolloutHeld").as_str() {
                "False/Updated" => Ok(()),
                other => Err(format!("RolloutHeld {other}")),
            }
        },
    )
    .await;
    for pod in &after {
        let was = before
            .iter()
            .find(|p| p.name_any() == pod.name_any())
            .expect("the same pod before");
        assert_eq!(pod.uid(), was.uid(), "upgraded in place, not recreated");
        assert_eq!(pod_hash(pod, &name), hash_of(&changed));
        assert_eq!(
            init_spec_image(pod, SETUP),
            SETUP_IMAGE,
            "plain init container untouched"
        );
        let native = init_status(pod, NATIVE).expect("native sidecar status");
        assert_eq!(
            native.restart_count,
            init_status(was, NATIVE)
                .expect("status before")
                .restart_count
                + 1
        );
        assert_eq!(
            container_restarts(pod),
            container_restarts(was),
            "app untouched"
        );
        assert_eq!(
            pod.spec.as_ref().map(|s| &s.containers),
            was.spec.as_ref().map(|s| &s.containers),
            "the app container's spec is untouched"
        );
    }
}
