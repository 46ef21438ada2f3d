//! A SidecarSet change of a sidecar's `resources` reaches running pods in place, through the
//! `pods/resize` subresource, against the SidecarSet controller of the webhook test cluster and
//! a real kube-apiserver (its resize validation included). The test plays the kubelet
//! (`support::kubelet`): it reports a container's resources as its spec's, a resize applied at
//! once without a restart, and the generation it acted on; the e2e suite proves the real
//! kubelet's side (cgroup limits changed, no restart).
//!
//! What breaks is tested too: a resize the kubelet says is `Infeasible`, one the apiserver
//! refuses (a limit removed), and an apiserver without the subresource.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Namespace, Pod};
use kruise_rs::controllers::{ControllerOptions, sidecarset};
use kruise_rs_api::sidecarset::SidecarSet;
use kruise_rs_api::well_known::{
    SIDECARSET_HASH, SIDECARSET_HASH_WITHOUT_IMAGE, SIDECARSET_INJECTED_LIST,
};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::sidecarset_upgrade::{
    CACHE_TIMEOUT, Fixture, Kubelet, OLD_IMAGE, PODS_UPGRADABLE, ROLLOUT_HELD, ROLLOUT_TIMEOUT,
    SIDECAR, admit_injected, condition, counts, counts_of, create_sidecarset, describe_set,
    expect_condition, hash_of, one_sidecar_set, pod_condition, pod_entry, poll, rollout_done,
    update_spec,
};
use crate::support::{
    CONTROLLED_LABEL, ExtraControlPlane, kubelet, test_controller_options, unique_name,
};

/// requests = limits for cpu, half the memory limit requested: a Burstable sidecar.
fn resources(cpu: &str, memory_request: &str, memory_limit: &str) -> Value {
    json!({
        "requests": {"cpu": cpu, "memory": memory_request},
        "limits": {"cpu": cpu, "memory": memory_limit},
    })
}

fn small() -> Value {
    resources("100m", "32Mi", "64Mi")
}

fn big() -> Value {
    resources("200m", "48Mi", "96Mi")
}

/// A SidecarSet with the one sidecar [`SIDECAR`] on [`OLD_IMAGE`] with `sidecar_resources`.
fn resized_set(fx: &Fixture, sidecar_resources: Value, strategy: Value) -> Value {
    let mut spec = one_sidecar_set(&fx.name, &fx.app, &fx.ns);
    let spec_object = spec["spec"].as_object_mut().expect("spec");
    spec_object.remove("initContainers");
    spec["spec"]["containers"][0]["resources"] = sidecar_resources;
    spec["spec"]["updateStrategy"] = strategy;
    spec
}

/// The app pod, with requests so that resizing the sidecar never changes its QoS class (the
/// apiserver refuses a resize that would).
fn app_pod(app: &str) -> Value {
    json!({
        "metadata": {"name": "web", "labels": {"app": app}},
        "spec": {"containers": [{
            "name": "main",
            "image": "busybox:1.36",
            "command": ["/bin/sh", "-c", "sleep 10000000"],
            "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}},
        }]}
    })
}

async fn start_app_pods(fx: &Fixture, n: usize, set: &SidecarSet) -> Vec<Pod> {
    let mut started = Vec::new();
    for _ in 0..n {
        let pod = admit_injected(&fx.pods, &app_pod(&fx.app), &[set]).await;
        started.push(kubelet::start(&fx.pods, &pod.name_any()).await);
    }
    started
}

/// Gives [`SIDECAR`] `resources` in the SidecarSet `set`; the spec change that says so.
fn containers_resources(set: &mut Value, resources: Value) -> Value {
    let containers = set["spec"]["containers"]
        .as_array_mut()
        .expect("containers");
    let sidecar = containers
        .iter_mut()
        .find(|c| c["name"] == SIDECAR)
        .expect("the sidecar");
    sidecar["resources"] = resources;
    json!({"containers": set["spec"]["containers"].clone()})
}

/// The sidecar's `resources` in the pod's spec, or its status (what the kubelet reports).
fn sidecar_resources(pod: &Pod, reported: bool) -> Value {
    resources_of(pod, SIDECAR, reported)
}

/// Container `name`'s `resources` in the pod's spec, or its status.
fn resources_of(pod: &Pod, name: &str, reported: bool) -> Value {
    let found = if reported {
        pod.status
            .iter()
            .flat_map(|s| s.container_statuses.iter().flatten())
            .find(|s| s.name == name)
            .and_then(|s| s.resources.as_ref())
            .map(|r| serde_json::to_value(r).expect("json"))
    } else {
        pod.spec
            .iter()
            .flat_map(|s| &s.containers)
            .find(|c| c.name == name)
            .and_then(|c| c.resources.as_ref())
            .map(|r| serde_json::to_value(r).expect("json"))
    };
    found.unwrap_or(Value::Null)
}

fn restarts(pod: &Pod) -> Vec<(String, i32)> {
    pod.status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .map(|s| (s.name.clone(), s.restart_count))
        .collect()
}

/// Whether the cluster keeps `status.observedGeneration` (Kubernetes 1.34 on): there a pod the
/// kubelet has not acted on since its resize is in flight.
fn observes_generations(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .is_some_and(|s| s.observed_generation.is_some())
}

/// A second sidecar, injected after the app container but listed first in the SidecarSet: the
/// resize must list the pod's containers in the pod's order.
const AFTER: &str = "after-sidecar";

/// Every pod's two sidecars are resized from 100m/64Mi to 200m/96Mi in place: same pod (UID),
/// same images, no container restarted, the spec and the reported resources new, the hash
/// entries current, the status counting every pod updated. On a cluster that keeps observed
/// generations (1.34 on), a resized pod is in flight until its kubelet acts, so with
/// maxUnavailable 1 and the kubelet away the rollout holds after one pod and says so.
#[tokio::test]
async fn a_resources_change_resizes_every_pod_in_place_without_a_restart() {
    let fx = Fixture::new("sc-resize").await;
    let mut spec = resized_set(&fx, small(), json!({"maxUnavailable": 1}));
    let after = json!({
        "name": AFTER, "image": "busybox:1.36", "command": ["/bin/sh", "-c", "sleep 10000000"],
        "podInjectPolicy": "AfterAppContainer", "resources": small(),
    });
    spec["spec"]["containers"]
        .as_array_mut()
        .expect("containers")
        .insert(0, after);
    let set = create_sidecarset(&fx.client, &spec).await;
    let before = start_app_pods(&fx, 3, &set).await;
    fx.wait_rollout(&fx.name, Kubelet::On, counts(3, 3, 3, 3), |set, _| {
        rollout_done(set)
    })
    .await;
    let observed = observes_generations(
        &fx.pods
            .get(&before[0].name_any())
            .await
            .expect("reading a pod"),
    );

    spec["spec"]["containers"][0]["resources"] = big();
    let changed = update_spec(&fx.client, &fx.name, containers_resources(&mut spec, big())).await;
    assert_ne!(hash_of(&changed), hash_of(&set), "resources are hashed");

    if observed {
        // Kubelet away: one pod resized, then the rollout holds on it.
        fx.wait_rollout(&fx.name, Kubelet::Off, counts(3, 1, 3, 1), |set, pods| {
            let resized: Vec<String> = pods
                .iter()
                .filter(|p| sidecar_resources(p, false) == big())
                .map(|p| p.name_any())
                .collect();
            if resized.len() != 1 {
                return Err(format!("pods {resized:?} resized"));
            }
            expect_condition(set, ROLLOUT_HELD, "True", "MaxUnavailableReached")?;
            let message = &condition(set, ROLLOUT_HELD).expect("held").message;
            if !message.contains(&resized[0]) {
                return Err(format!("RolloutHeld does not name {}", resized[0]));
            }
            Ok(())
        })
        .await;
    }

    let (set, after) = fx
        .wait_rollout(&fx.name, Kubelet::On, counts(3, 3, 3, 3), |set, pods| {
            rollout_done(set)?;
            expect_condition(set, PODS_UPGRADABLE, "True", "AllPodsUpgradable")?;
            let behind = |p: &&Pod| {
                sidecar_resources(p, true) != big() || resources_of(p, AFTER, true) != big()
            };
            match pods.iter().find(behind) {
                Some(p) => Err(format!(
                    "{} reports {} and {}",
                    p.name_any(),
                    sidecar_resources(p, true),
                    resources_of(p, AFTER, true)
                )),
                None => Ok(()),
            }
        })
        .await;
    for pod in &after {
        let was = before
            .iter()
            .find(|b| b.name_any() == pod.name_any())
            .unwrap_or_else(|| panic!("pod {} is new", pod.name_any()));
        assert_eq!(pod.uid(), was.uid(), "the same pod");
        assert_eq!(sidecar_resources(pod, false), big(), "{}", pod.name_any());
        assert_eq!(resources_of(pod, AFTER, false), big(), "{}", pod.name_any());
        assert_eq!(
            restarts(pod),
            [
                (SIDECAR.to_owned(), 0),
                ("main".to_owned(), 0),
                (AFTER.to_owned(), 0)
            ],
            "no container restarted (in the pod's order)"
        );
        assert_eq!(
            crate::sidecarset_upgrade::spec_image(pod, SIDECAR),
            OLD_IMAGE,
            "the image stays"
        );
        for key in [SIDECARSET_HASH, SIDECARSET_HASH_WITHOUT_IMAGE] {
            let entry = pod_entry(pod, key, &fx.name).expect("an entry");
            assert_eq!(
                entry["hash"].as_str(),
                set.annotations().get(key).map(String::as_str),
                "{key} of {}",
                pod.name_any()
            );
        }
    }
}

/// A resize the kubelet reports `Infeasible` (here written as the kubelet writes it) keeps the
/// pod in flight and is named, with the kubelet's message, in `PodsUpgradable` and a Warning
/// event on the SidecarSet; once the kubelet applies it, the condition clears.
#[tokio::test]
async fn an_infeasible_resize_is_named_and_keeps_the_pod_in_flight() {
    let fx = Fixture::new("sc-resize-no").await;
    // The partition keeps the second pod old, whatever the first pod's state.
    let mut spec = resized_set(&fx, small(), json!({"maxUnavailable": 1, "partition": 1}));
    let set = create_sidecarset(&fx.client, &spec).await;
    start_app_pods(&fx, 2, &set).await;
    fx.wait_rollout(&fx.name, Kubelet::On, counts(2, 2, 2, 2), |set, _| {
        rollout_done(set)
    })
    .await;

    update_spec(&fx.client, &fx.name, containers_resources(&mut spec, big())).await;
    let (_, pods) = fx
        .wait_rollout(
            &fx.name,
            Kubelet::Off,
            counts(2, 1, 2, 1),
            |_, pods| match pods
                .iter()
                .filter(|p| sidecar_resources(p, false) == big())
                .count()
            {
                1 => Ok(()),
                n => Err(format!("{n} pods resized")),
            },
        )
        .await;
    let resized = pods
        .iter()
        .find(|p| sidecar_resources(p, false) == big())
        .expect("the resized pod")
        .name_any();
    let message = "Node didn't have enough capacity: cpu, requested: 250, capacity: 200";
    let pending = json!({"status": {"conditions": [{
        "type": "PodResizePending", "status": "True", "reason": "Infeasible", "message": message,
    }]}});
    fx.pods
        .patch_status(
            &resized,
            &PatchParams::default(),
            &Patch::Strategic(&pending),
        )
        .await
        .expect("writing the kubelet's condition");

    fx.wait_rollout(&fx.name, Kubelet::Off, counts(2, 1, 2, 1), |set, _| {
        expect_condition(set, PODS_UPGRADABLE, "False", "ResizeInfeasible")?;
        let said = &condition(set, PODS_UPGRADABLE).expect("condition").message;
        if said.contains(&format!("{}/{resized} (Infeasible: {message})", fx.ns)) {
            Ok(())
        } else {
            Err(format!("PodsUpgradable says {said:?}"))
        }
    })
    .await;
    let events = Api::<Event>::all(fx.client.clone());
    let params = ListParams::default().fields(&format!(
        "involvedObject.name={},reason=ResizeInfeasible",
        fx.name
    ));
    let (events, params) = (&events, &params);
    poll(
        "a Warning event ResizeInfeasible about the SidecarSet",
        ROLLOUT_TIMEOUT,
        || async move {
            let list = events.list(params).await.expect("listing events").items;
            match list.iter().find(|e| e.type_.as_deref() == Some("Warning")) {
                Some(e) if e.message.as_deref().is_some_and(|m| m.contains(message)) => Ok(()),
                _ => Err(format!("events {list:?}")),
            }
        },
    )
    .await;

    // The kubelet applies it after all (room was made).
    let applied = json!({"status": {"conditions": [{
        "type": "PodResizePending", "status": "False", "reason": "", "message": "",
    }]}});
    fx.pods
        .patch_status(
            &resized,
            &PatchParams::default(),
            &Patch::Strategic(&applied),
        )
        .await
        .expect("clearing the kubelet's condition");
    fx.wait_rollout(&fx.name, Kubelet::On, counts(2, 1, 2, 1), |set, _| {
        expect_condition(set, PODS_UPGRADABLE, "True", "AllPodsUpgradable")?;
        expect_condition(set, ROLLOUT_HELD, "True", "PartitionReached")
    })
    .await;
}

/// A resize the apiserver refuses (a sidecar's memory limit removed: Kubernetes cannot remove
/// a limit in place) is said on the SidecarSet with the apiserver's words, and the pod is left
/// as it was: no image, hash or resources half-written.
#[tokio::test]
async fn a_resize_the_apiserver_refuses_is_said_and_the_pod_left_as_it_was() {
    let fx = Fixture::new("sc-resize-bad").await;
    let mut spec = resized_set(&fx, small(), json!({"maxUnavailable": 1}));
    let set = create_sidecarset(&fx.client, &spec).await;
    let before = start_app_pods(&fx, 1, &set).await;
    fx.wait_rollout(&fx.name, Kubelet::On, counts(1, 1, 1, 1), |set, _| {
        rollout_done(set)
    })
    .await;

    let no_memory_limit = json!({
        "requests": {"cpu": "200m", "memory": "32Mi"},
        "limits": {"cpu": "200m"},
    });
    update_spec(
        &fx.client,
        &fx.name,
        containers_resources(&mut spec, no_memory_limit),
    )
    .await;
    let events = Api::<Event>::all(fx.client.clone());
    let params = ListParams::default().fields(&format!(
        "involvedObject.name={},reason=UpgradeFailed",
        fx.name
    ));
    let pod = before[0].name_any();
    let (events, params, pod_ref) = (&events, &params, &pod);
    let event = poll(
        "a Warning event UpgradeFailed naming the refused resize",
        ROLLOUT_TIMEOUT,
        || async move {
            let list = events.list(params).await.expect("listing events").items;
            list.into_iter()
                .find(|e| {
                    e.type_.as_deref() == Some("Warning")
                        && e.message.as_deref().is_some_and(|m| {
                            m.contains(pod_ref.as_str())
                                && m.contains("refused to resize")
                                && m.contains("limits cannot be removed")
                        })
                })
                .ok_or_else(|| "no such event yet".to_owned())
        },
    )
    .await;
    eprintln!("refused resize event: {:?}", event.message);
    let (_, after) = fx
        .wait_rollout(&fx.name, Kubelet::On, counts(1, 0, 1, 0), |_, _| Ok(()))
        .await;
    assert_eq!(sidecar_resources(&after[0], false), small(), "not resized");
    assert_eq!(
        pod_entry(&after[0], SIDECARSET_HASH, &fx.name),
        pod_entry(&before[0], SIDECARSET_HASH, &fx.name),
        "the hash entry is not rewritten"
    );
    assert_eq!(after[0].spec, before[0].spec);
}

/// An apiserver without `pods/resize` (Kubernetes 1.33 and 1.34 with the feature gate
/// `InPlacePodVerticalScaling` off): pods whose sidecars' resources changed are not upgradable,
/// and the reason says why. From 1.35 the gate is locked on: there the test checks that the
/// apiserver's discovery lists the subresource the controller looks for.
#[tokio::test]
async fn without_the_resize_subresource_pods_stay_not_upgradable_and_the_reason_says_why() {
    let gate_locked = crate::support::local_kube_minor() != "1.33";
    let args = (!gate_locked).then_some("--feature-gates=InPlacePodVerticalScaling=false");
    let plane = tokio::task::spawn_blocking(move || {
        let plane = ExtraControlPlane::start_with_apiserver_args(args);
        plane.install_crds();
        plane
    })
    .await
    .expect("join");
    let config = kruise_rs_kube::load_config(Some(plane.kubeconfig_path()))
        .await
        .expect("the extra control plane's kubeconfig loads");
    let client = Client::try_from(config).expect("a client");
    let served = client
        .list_core_api_resources("v1")
        .await
        .expect("discovery of /api/v1")
        .resources
        .iter()
        .any(|r| r.name == "pods/resize");
    if gate_locked {
        assert!(served, "pods/resize is served from 1.35 on");
        return;
    }
    assert!(!served, "the gate is off: no pods/resize");

    for ns in ["kruise-system", "shop"] {
        let namespace: Namespace =
            serde_json::from_value(json!({"metadata": {"name": ns}})).expect("a namespace");
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap_or_else(|e| panic!("creating namespace {ns}: {e}"));
    }
    let name = unique_name("no-resize");
    let mut spec = json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "SidecarSet",
        "metadata": {"name": name, "labels": {CONTROLLED_LABEL: name}},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "containers": [{"name": SIDECAR, "image": OLD_IMAGE, "resources": small()}],
        }
    });
    let sets = Api::<SidecarSet>::all(client.clone());
    let set: SidecarSet = serde_json::from_value(spec.clone()).expect("a SidecarSet");
    sets.create(&PostParams::default(), &set)
        .await
        .expect("creating the SidecarSet");

    let (stop, stopped) = oneshot::channel::<()>();
    let opts = ControllerOptions {
        namespace: "kruise-system".to_owned(),
        ..test_controller_options()
    };
    let controller = tokio::spawn(sidecarset::run(client.clone(), opts, async move {
        let _ = stopped.await;
    }));
    let (sets_ref, name_ref) = (&sets, &name);
    let revision = poll(
        "the controller to register the first revision",
        CACHE_TIMEOUT,
        || async move {
            let set = sets_ref.get(name_ref).await.map_err(|e| e.to_string())?;
            set.status
                .and_then(|s| s.latest_revision)
                .ok_or_else(|| "no latestRevision yet".to_owned())
        },
    )
    .await;

    // A pod as the webhook injects it: the sidecar, and the hash entries of that revision.
    let mut defaulted: SidecarSet = sets.get(&name).await.expect("the SidecarSet");
    kruise_rs_api::defaults::default_sidecarset(&mut defaulted);
    let entry = |hash: String, revision: &str| {
        json!({name.clone(): {
            "updateTimestamp": null, "hash": hash, "sidecarSetName": name,
            "sidecarList": [SIDECAR], "controllerRevision": revision,
        }})
        .to_string()
    };
    let pod = json!({
        "metadata": {
            "name": "web-0", "labels": {"app": "web"},
            "annotations": {
                SIDECARSET_HASH: entry(kruise_rs_sidecar::hash::sidecarset_hash(&defaulted.spec), &revision),
                SIDECARSET_HASH_WITHOUT_IMAGE: entry(
                    kruise_rs_sidecar::hash::sidecarset_hash_without_image(&defaulted.spec), ""),
                SIDECARSET_INJECTED_LIST: name,
            },
        },
        "spec": {"containers": [
            {"name": SIDECAR, "image": OLD_IMAGE, "resources": small()},
            {"name": "main", "image": "busybox:1.36",
             "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}}},
        ]},
    });
    let pods = Api::<Pod>::namespaced(client.clone(), "shop");
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(pod).expect("a pod"),
    )
    .await
    .expect("creating the pod");
    kubelet::start(&pods, "web-0").await;

    wait_set(
        &sets,
        &name,
        counts(1, 1, 1, 1),
        ("True", "AllPodsUpgradable"),
    )
    .await;

    spec["spec"]["containers"][0]["resources"] = big();
    sets.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"containers": spec["spec"]["containers"].clone()}})),
    )
    .await
    .expect("changing the sidecar's resources");
    let set = wait_set(
        &sets,
        &name,
        counts(1, 0, 1, 0),
        ("False", "ResizeNotServed"),
    )
    .await;
    let message = &condition(&set, PODS_UPGRADABLE).expect("condition").message;
    assert!(
        message.contains("does not serve the pods/resize subresource")
            && message.contains("shop/web-0"),
        "{message}"
    );
    // The pod's condition is written after the SidecarSet's status, in the same reconcile.
    let pods_ref = &pods;
    let pod = poll(
        "the pod's SidecarSetUpgradable condition False",
        ROLLOUT_TIMEOUT,
        || async move {
            let pod = pods_ref.get("web-0").await.map_err(|e| e.to_string())?;
            match pod_condition(&pod, "SidecarSetUpgradable") {
                Some(c) if c.status == "False" => Ok(pod),
                other => Err(format!("condition {other:?}")),
            }
        },
    )
    .await;
    assert_eq!(sidecar_resources(&pod, false), small(), "not resized");

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(15), controller)
        .await
        .expect("the controller stops")
        .expect("the controller task does not fail");
    drop(plane);
}

/// Waits until SidecarSet `name` reports `expected` counts and `PodsUpgradable` with `(status,
/// reason)`.
async fn wait_set(
    sets: &Api<SidecarSet>,
    name: &str,
    expected: crate::sidecarset_upgrade::Counts,
    (status, reason): (&str, &str),
) -> SidecarSet {
    let what =
        format!("SidecarSet {name} to report {expected:?} and PodsUpgradable {status}/{reason}");
    poll(&what, ROLLOUT_TIMEOUT, || async move {
        let set = sets.get(name).await.map_err(|e| e.to_string())?;
        if counts_of(&set) != expected {
            return Err(describe_set(&set));
        }
        expect_condition(&set, PODS_UPGRADABLE, status, reason)
            .map_err(|e| format!("{e}; {}", describe_set(&set)))?;
        Ok(set)
    })
    .await
}

/// A sidecar sized by `resourcesPolicy` is re-evaluated against each pod's own app container
/// when the policy changes: the pod with the larger app gets the larger sidecar, each resized in
/// place.
#[tokio::test]
async fn a_changed_resources_policy_is_evaluated_again_for_each_pod() {
    let fx = Fixture::new("sc-resize-policy").await;
    let policy = |share: &str| {
        json!({
            "targetContainersMode": "sum",
            "targetContainersNameRegex": "^main$",
            "resourcesExpr": {
                "limits": {"cpu": format!("cpu*{share}"), "memory": "memory*50%"},
                "requests": {"cpu": format!("cpu*{share}"), "memory": "memory*25%"},
            },
        })
    };
    let mut spec = resized_set(&fx, json!(null), json!({"maxUnavailable": "100%"}));
    let sidecar = spec["spec"]["containers"][0]
        .as_object_mut()
        .expect("the sidecar");
    sidecar.remove("resources");
    sidecar.insert("resourcesPolicy".into(), policy("50%"));
    let set = create_sidecarset(&fx.client, &spec).await;
    let app = |cpu: &str| {
        let mut pod = app_pod(&fx.app);
        pod["spec"]["containers"][0]["resources"] = json!({
            "requests": {"cpu": cpu, "memory": "128Mi"},
            "limits": {"cpu": cpu, "memory": "128Mi"},
        });
        pod
    };
    let mut names = Vec::new();
    for cpu in ["200m", "400m"] {
        let pod = admit_injected(&fx.pods, &app(cpu), &[&set]).await;
        kubelet::start(&fx.pods, &pod.name_any()).await;
        names.push(pod.name_any());
    }
    fx.wait_rollout(&fx.name, Kubelet::On, counts(2, 2, 2, 2), |set, _| {
        rollout_done(set)
    })
    .await;

    spec["spec"]["containers"][0]["resourcesPolicy"] = policy("100%");
    update_spec(
        &fx.client,
        &fx.name,
        json!({"containers": spec["spec"]["containers"].clone()}),
    )
    .await;
    let names = &names;
    let (_, pods) = fx
        .wait_rollout(&fx.name, Kubelet::On, counts(2, 2, 2, 2), |set, pods| {
            rollout_done(set)?;
            let cpus: Vec<(String, Value)> = pods
                .iter()
                .map(|p| {
                    (
                        p.name_any(),
                        sidecar_resources(p, true)["limits"]["cpu"].clone(),
                    )
                })
                .collect();
            let wanted = vec![
                (names[0].clone(), json!("200m")),
                (names[1].clone(), json!("400m")),
            ];
            let mut sorted = cpus.clone();
            sorted.sort_by_key(|(name, _)| names.iter().position(|n| n == name));
            if sorted == wanted {
                Ok(())
            } else {
                Err(format!("the sidecars report cpu limits {cpus:?}"))
            }
        })
        .await;
    for pod in &pods {
        let resources = sidecar_resources(pod, false);
        assert_eq!(
            (
                &resources["limits"]["memory"],
                &resources["requests"]["memory"]
            ),
            (&json!("64Mi"), &json!("32Mi")),
            "{}: memory from the app's 128Mi, unchanged",
            pod.name_any()
        );
        assert_eq!(
            restarts(pod),
            [(SIDECAR.to_owned(), 0), ("main".to_owned(), 0)],
            "{}: resized in place",
            pod.name_any()
        );
    }
}
