use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kruise_rs_controller::pod_summary::PodSummary;
use serde_json::{Value, json};

use super::*;
use crate::controllers::sidecarset::pods::test_view;
use crate::controllers::sidecarset::rollout::next_batch;
use kruise_rs_api::sidecarset::{SidecarSetSpec, SidecarSetStatus};
use kruise_rs_api::well_known::{
    SIDECARSET_HASH, SIDECARSET_HASH_WITHOUT_IMAGE, SIDECARSET_INJECTED_LIST,
};
use kruise_rs_imagepull::lean_nodeimage::LeanNodeImage;

const MANAGER_NS: &str = "kruise-system";

fn set(strategy: Value, annotations: &[(&str, &str)]) -> SidecarSet {
    let spec: SidecarSetSpec = serde_json::from_value(json!({
        "selector": {"matchLabels": {"app": "web"}},
        "containers": [
            {"name": "proxy", "image": "proxy:2"},
            {"name": "logs", "image": "logs:1"},
        ],
        "updateStrategy": strategy,
    }))
    .expect("spec");
    let mut set = SidecarSet::new("mesh", spec);
    set.metadata.uid = Some("uid-mesh".into());
    set.metadata.labels = Some([("team".to_owned(), "net".to_owned())].into());
    let mut all = BTreeMap::from([
        (SIDECARSET_HASH.to_owned(), "new".to_owned()),
        (SIDECARSET_HASH_WITHOUT_IMAGE.to_owned(), "shape".to_owned()),
    ]);
    for (k, v) in annotations {
        all.insert((*k).to_owned(), (*v).to_owned());
    }
    set.metadata.annotations = Some(all);
    set.status = Some(SidecarSetStatus {
        latest_revision: Some("mesh-7c9d5b".into()),
        ..Default::default()
    });
    set
}

/// A ready pod on `node` running proxy `image` (hash "new" when that is proxy:2).
fn pod(name: &str, namespace: &str, node: &str, image: &str, labels: Value) -> Arc<PodSummary> {
    let hash = if image == "proxy:2" { "new" } else { "old" };
    let entry = |h: &str| {
        format!(
            r#"{{"mesh":{{"updateTimestamp":null,"hash":"{h}","sidecarSetName":"mesh","sidecarList":["logs","proxy"]}}}}"#
        )
    };
    let mut labels = labels;
    labels["app"] = json!("web");
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {
                "name": name, "namespace": namespace, "labels": labels,
                "creationTimestamp": "2026-11-29T10:00:00Z",
                "annotations": {
                    SIDECARSET_INJECTED_LIST: "mesh",
                    SIDECARSET_HASH: entry(hash),
                    SIDECARSET_HASH_WITHOUT_IMAGE: entry("shape"),
                }
            },
            "spec": {
                "nodeName": node,
                "containers": [
                    {"name": "app", "image": "shop:1"},
                    {"name": "proxy", "image": image},
                    {"name": "logs", "image": "logs:1"},
                ]
            },
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-29T10:00:00Z"}],
                "containerStatuses": [
                    {"name": "app", "image": "shop:1", "imageID": "a", "ready": true, "restartCount": 0},
                    {"name": "proxy", "image": image, "imageID": image, "ready": true, "restartCount": 0},
                    {"name": "logs", "image": "logs:1", "imageID": "l", "ready": true, "restartCount": 0},
                ]
            }
        }))
        .expect("pod"),
    )
}

fn old(name: &str, node: &str) -> Arc<PodSummary> {
    pod(name, "shop", node, "proxy:1", json!({}))
}

fn decide_for(
    set: &SidecarSet,
    pods: &[Arc<PodSummary>],
    updated_ready: usize,
    started: bool,
) -> Decision {
    decide_when(true, set, pods, updated_ready, started)
}

/// [`decide_for`] on a manager whose `--sidecarset-predownload` is `enabled`.
fn decide_when(
    enabled: bool,
    set: &SidecarSet,
    pods: &[Arc<PodSummary>],
    updated_ready: usize,
    started: bool,
) -> Decision {
    let views: Vec<_> = pods.iter().map(|p| test_view(set, p)).collect();
    let batch = next_batch(set, &views);
    let (knobs, _) = knobs_when(set, enabled);
    decide(
        set,
        pods,
        &batch,
        updated_ready,
        &knobs,
        MANAGER_NS,
        started,
    )
}

fn nodes(decision: &Decision) -> Vec<&str> {
    match decision {
        Decision::Pull(jobs) => {
            assert_eq!(jobs.len(), 1, "{jobs:?}");
            jobs[0].nodes.iter().map(String::as_str).collect()
        }
        other => panic!("expected a pull, got {other:?}"),
    }
}

// --- knobs ---------------------------------------------------------------------------------------

#[test]
fn knobs_default_to_upstreams_values() {
    let (k, warnings) = knobs(&set(json!({}), &[]));
    assert_eq!(
        k,
        Knobs {
            enabled: true,
            parallelism: 1,
            min_updated_ready: None,
            timeout_seconds: 300
        }
    );
    assert!(warnings.is_empty());
}

#[test]
fn knobs_read_integers_and_percents() {
    let (k, warnings) = knobs(&set(
        json!({}),
        &[
            (IMAGE_PREDOWNLOAD_PARALLELISM, "4"),
            (IMAGE_PREDOWNLOAD_TIMEOUT_SECONDS, " 60 "),
            (IMAGE_PREDOWNLOAD_MIN_UPDATED_READY_PODS, "25%"),
        ],
    ));
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(k.parallelism, 4);
    assert_eq!(k.timeout_seconds, 60);
    assert_eq!(k.min_updated_ready, Some(IntOrString::String("25%".into())));
    let (k, _) = knobs(&set(
        json!({}),
        &[(IMAGE_PREDOWNLOAD_MIN_UPDATED_READY_PODS, "3")],
    ));
    assert_eq!(k.min_updated_ready, Some(IntOrString::Int(3)));
}

#[test]
fn bad_knobs_warn_with_the_annotation_the_value_and_the_default() {
    let cases = [
        (IMAGE_PREDOWNLOAD_PARALLELISM, "50%", "1"),
        (IMAGE_PREDOWNLOAD_PARALLELISM, "0", "1"),
        (IMAGE_PREDOWNLOAD_PARALLELISM, "-2", "1"),
        (IMAGE_PREDOWNLOAD_TIMEOUT_SECONDS, "0", "300"),
        (IMAGE_PREDOWNLOAD_TIMEOUT_SECONDS, "5m", "300"),
        // Past the ImagePullJob's bound, which would refuse the job.
        (IMAGE_PREDOWNLOAD_TIMEOUT_SECONDS, "86401", "300"),
        (IMAGE_PREDOWNLOAD_MIN_UPDATED_READY_PODS, "-1", "0"),
        (IMAGE_PREDOWNLOAD_MIN_UPDATED_READY_PODS, "half", "0"),
        (IMAGE_PREDOWNLOAD_MIN_UPDATED_READY_PODS, "%", "0"),
    ];
    for (annotation, value, default) in cases {
        let (k, warnings) = knobs(&set(json!({}), &[(annotation, value)]));
        assert_eq!(warnings.len(), 1, "{annotation}={value}");
        let text = warnings[0].to_string();
        assert!(
            text.contains(annotation)
                && text.contains(&format!("{value:?}"))
                && text.ends_with(&format!("using the default {default}")),
            "{text}"
        );
        assert_eq!(k.parallelism, 1);
        assert_eq!(k.timeout_seconds, 300);
        assert_eq!(k.min_updated_ready, None);
    }
}

#[test]
fn the_managers_switch_on_reads_the_annotations_off_ignores_them() {
    let annotated = set(
        json!({}),
        &[
            (IMAGE_PREDOWNLOAD_PARALLELISM, "3"),
            (IMAGE_PREDOWNLOAD_TIMEOUT_SECONDS, "-1"),
        ],
    );
    assert_eq!(knobs_when(&annotated, true), knobs(&annotated));
    assert!(knobs(&annotated).0.enabled);
    let (off, warnings) = knobs_when(&annotated, false);
    assert!(!off.enabled);
    assert!(
        warnings.is_empty(),
        "a switched-off feature warns about nothing"
    );
    assert_eq!(
        (off.parallelism, off.timeout_seconds, off.min_updated_ready),
        (1, 300, None)
    );
}

// --- when ----------------------------------------------------------------------------------------

#[test]
fn a_manager_with_pre_download_off_never_pulls() {
    let rolling = set(json!({}), &[]);
    let pods = [old("a", "n1"), old("b", "n2")];
    assert!(matches!(
        decide_when(true, &rolling, &pods, 0, false),
        Decision::Pull(_)
    ));
    // Off wins over everything else: work to do, jobs already started, a gate, NotUpdate,
    // nothing to pull.
    let gated = set(
        json!({}),
        &[(IMAGE_PREDOWNLOAD_MIN_UPDATED_READY_PODS, "1")],
    );
    let not_update = set(json!({"type": "NotUpdate"}), &[]);
    let current = [pod("a", "shop", "n1", "proxy:2", json!({}))];
    for (s, pods, started) in [
        (&rolling, &pods[..], false),
        (&rolling, &pods[..], true),
        (&gated, &pods[..], false),
        (&not_update, &pods[..], false),
        (&rolling, &current[..], false),
        (&rolling, &[][..], false),
    ] {
        let decision = decide_when(false, s, pods, 0, started);
        assert_eq!(decision, Decision::Skipped(Skip::Disabled));
        assert!(
            decision.jobs().is_empty(),
            "so every job left over is deleted"
        );
    }
}

#[test]
fn an_image_change_pulls_on_the_nodes_of_the_old_pods() {
    let s = set(json!({}), &[]);
    let pods = [
        old("a", "n1"),
        old("b", "n2"),
        pod("c", "shop", "n3", "proxy:2", json!({})),
    ];
    let decision = decide_for(&s, &pods, 0, false);
    let Decision::Pull(jobs) = &decision else {
        panic!("{decision:?}")
    };
    assert_eq!(jobs.len(), 1, "only the proxy image changed");
    let job = &jobs[0];
    assert_eq!(job.namespace, MANAGER_NS);
    assert_eq!(job.name, "mesh-7c9d5b-proxy");
    assert_eq!(job.container, "proxy");
    assert_eq!(job.image, "proxy:2");
    let mut sorted = job.nodes.clone();
    sorted.sort();
    assert_eq!(sorted, ["n1", "n2"], "not the updated pod's node");
    assert!(job.pull_secrets.is_empty());
}

#[test]
fn not_update_skips() {
    let s = set(json!({"type": "NotUpdate"}), &[]);
    assert_eq!(
        decide_for(&s, &[old("a", "n1"), old("b", "n2")], 0, false),
        Decision::Skipped(Skip::NotUpdate)
    );
    let current = [pod("a", "shop", "n1", "proxy:2", json!({}))];
    assert_eq!(
        decide_for(&s, &current, 1, false),
        Decision::NothingToPull,
        "nothing would be pulled anyway"
    );
}

#[test]
fn one_batch_skips_with_the_rollouts_rounding() {
    let pods = [old("a", "n1"), old("b", "n2"), old("c", "n3")];
    for strategy in [
        json!({"maxUnavailable": 3}),
        json!({"maxUnavailable": "100%"}),
        json!({"maxUnavailable": "67%"}),
    ] {
        let s = set(strategy.clone(), &[]);
        assert_eq!(
            decide_for(&s, &pods, 0, false),
            Decision::Skipped(Skip::OneBatch { matched: 3 }),
            "{strategy}"
        );
    }
    // 66% of 3 rounds up to 2: two batches.
    for strategy in [
        json!({"maxUnavailable": "66%"}),
        json!({"maxUnavailable": 3, "partition": 1}),
        json!({"maxUnavailable": 2}),
    ] {
        let s = set(strategy.clone(), &[]);
        assert!(
            matches!(decide_for(&s, &pods, 0, false), Decision::Pull(_)),
            "{strategy}"
        );
    }
}

#[test]
fn nothing_to_pull_once_every_pod_runs_the_new_image() {
    let s = set(json!({}), &[]);
    let pods = [
        pod("a", "shop", "n1", "proxy:2", json!({})),
        pod("b", "shop", "n2", "proxy:2", json!({})),
    ];
    assert_eq!(decide_for(&s, &pods, 2, true), Decision::NothingToPull);
    assert_eq!(decide_for(&s, &[], 0, false), Decision::NothingToPull);
}

#[test]
fn unscheduled_pods_have_no_node_to_pull_on() {
    let s = set(json!({}), &[]);
    let pods = [old("a", ""), old("b", "n2")];
    assert_eq!(nodes(&decide_for(&s, &pods, 0, false)), ["n2"]);
}

#[test]
fn min_updated_ready_pods_gates_the_start_only() {
    let s = set(
        json!({}),
        &[(IMAGE_PREDOWNLOAD_MIN_UPDATED_READY_PODS, "50%")],
    );
    let pods = [old("a", "n1"), old("b", "n2"), old("c", "n3")];
    assert_eq!(
        decide_for(&s, &pods, 1, false),
        Decision::WaitingForUpdatedReadyPods {
            needed: 2,
            ready: 1
        },
        "50% of 3 rounds up to 2"
    );
    assert!(matches!(decide_for(&s, &pods, 2, false), Decision::Pull(_)));
    assert!(
        matches!(decide_for(&s, &pods, 0, true), Decision::Pull(_)),
        "started jobs are kept when the count drops"
    );
}

#[test]
fn a_paused_rollout_still_pulls() {
    let s = set(json!({"paused": true}), &[]);
    assert!(matches!(
        decide_for(&s, &[old("a", "n1"), old("b", "n2")], 0, false),
        Decision::Pull(_)
    ));
}

// --- where and in what order ---------------------------------------------------------------------

#[test]
fn nodes_follow_the_rollout_order_and_each_comes_once() {
    // ActivePods order: a not-ready pod first; then newer first.
    let s = set(json!({}), &[]);
    let mut newer = (*old("newer", "n1")).clone();
    newer.metadata.creation_timestamp = Some(Time("2026-11-29T11:00:00Z".parse().unwrap()));
    let mut not_ready = (*old("not-ready", "n3")).clone();
    not_ready
        .status
        .as_mut()
        .unwrap()
        .conditions
        .as_mut()
        .unwrap()[0]
        .status = "False".into();
    let pods = [
        old("older", "n2"),
        Arc::new(newer),
        Arc::new(not_ready),
        old("twin", "n1"),
    ];
    assert_eq!(nodes(&decide_for(&s, &pods, 0, false)), ["n3", "n1", "n2"]);
}

#[test]
fn priority_decides_the_node_order() {
    let s = set(
        json!({"priorityStrategy": {"weightPriority": [{"weight": 50, "matchSelector": {"matchLabels": {"tier": "edge"}}}]}}),
        &[],
    );
    let pods = [
        pod("a", "shop", "n1", "proxy:1", json!({})),
        pod("b", "shop", "n2", "proxy:1", json!({"tier": "edge"})),
        pod("c", "shop", "n3", "proxy:1", json!({})),
    ];
    assert_eq!(nodes(&decide_for(&s, &pods, 0, false))[0], "n2");
}

#[test]
fn scatter_spreads_the_nodes() {
    let s = set(
        json!({"scatterStrategy": [{"key": "zone", "value": "a"}]}),
        &[],
    );
    let pods: Vec<_> = (0..6)
        .map(|i| {
            let zone = if i < 2 { "a" } else { "b" };
            pod(
                &format!("p{i}"),
                "shop",
                &format!("n{i}"),
                "proxy:1",
                json!({"zone": zone}),
            )
        })
        .collect();
    let decision = decide_for(&s, &pods, 0, false);
    let order = nodes(&decision);
    let zone_a: Vec<usize> = order
        .iter()
        .enumerate()
        .filter(|(_, n)| **n == "n0" || **n == "n1")
        .map(|(i, _)| i)
        .collect();
    assert!(zone_a[1] - zone_a[0] > 1, "zone a spread out: {order:?}");
}

#[test]
fn the_partition_keeps_its_pods_nodes_out_until_it_is_lowered() {
    let pods = [
        old("a", "n1"),
        old("b", "n2"),
        old("c", "n3"),
        old("d", "n4"),
    ];
    let held = nodes(&decide_for(
        &set(json!({"partition": 2}), &[]),
        &pods,
        0,
        false,
    ))
    .len();
    assert_eq!(held, 2);
    let lowered = decide_for(&set(json!({"partition": 1}), &[]), &pods, 0, false);
    assert_eq!(nodes(&lowered).len(), 3);
}

#[test]
fn the_update_selector_limits_the_nodes() {
    let s = set(json!({"selector": {"matchLabels": {"canary": "yes"}}}), &[]);
    let pods = [
        pod("a", "shop", "n1", "proxy:1", json!({"canary": "yes"})),
        pod("b", "shop", "n2", "proxy:1", json!({})),
    ];
    assert_eq!(nodes(&decide_for(&s, &pods, 0, false)), ["n1"]);
}

#[test]
fn pull_secrets_make_one_job_per_namespace_each_node_once() {
    let mut s = set(json!({}), &[]);
    s.spec.image_pull_secrets = serde_json::from_value(json!([{"name": "regcred"}])).unwrap();
    let pods = [
        pod("a", "shop", "n1", "proxy:1", json!({})),
        pod("b", "blog", "n1", "proxy:1", json!({})),
        pod("c", "blog", "n2", "proxy:1", json!({})),
        pod("d", "shop", "n3", "proxy:1", json!({})),
    ];
    let Decision::Pull(jobs) = decide_for(&s, &pods, 0, false) else {
        panic!()
    };
    let by_ns: BTreeMap<&str, (&[String], &[String])> = jobs
        .iter()
        .map(|j| {
            (
                j.namespace.as_str(),
                (j.nodes.as_slice(), j.pull_secrets.as_slice()),
            )
        })
        .collect();
    assert_eq!(by_ns.len(), 2, "{jobs:?}");
    let total: usize = by_ns.values().map(|(n, _)| n.len()).sum();
    assert_eq!(total, 3, "n1 is pulled once: {jobs:?}");
    assert!(
        by_ns
            .values()
            .all(|(_, secrets)| *secrets == ["regcred".to_owned()])
    );
}

#[test]
fn two_changed_containers_make_two_jobs() {
    let mut s = set(json!({}), &[]);
    s.spec.containers[1].container.image = Some("logs:2".into());
    let Decision::Pull(jobs) = decide_for(&s, &[old("a", "n1"), old("b", "n2")], 0, false) else {
        panic!()
    };
    let names: Vec<&str> = jobs.iter().map(|j| j.name.as_str()).collect();
    assert_eq!(names, ["mesh-7c9d5b-logs", "mesh-7c9d5b-proxy"]);
}

// --- names, jobs, waiting ------------------------------------------------------------------------

#[test]
fn long_names_are_shortened_with_a_hash() {
    let base = format!("{}-5f7c9d8b6-{}", "a".repeat(60), "proxy");
    let name = job_name(&base);
    assert_eq!(name.len(), 63);
    assert_ne!(
        job_name(&format!("{base}x")),
        name,
        "the hash tells them apart"
    );
    assert!(!name.contains("--"), "{name}");
    assert_eq!(job_name("mesh-1-proxy"), "mesh-1-proxy");
}

#[test]
fn the_job_carries_labels_owner_and_spec() {
    let s = set(
        json!({}),
        &[
            (IMAGE_PREDOWNLOAD_PARALLELISM, "3"),
            (IMAGE_PREDOWNLOAD_TIMEOUT_SECONDS, "90"),
        ],
    );
    let Decision::Pull(plans) = decide_for(&s, &[old("a", "n1"), old("b", "n2")], 0, false) else {
        panic!()
    };
    let (k, _) = knobs(&s);
    let job = job(&s, &plans[0], &k);
    let value = serde_json::to_value(&job).unwrap();
    assert_eq!(
        value["metadata"]["labels"],
        json!({
            "team": "net",
            "kruise.io/sidecarset-name": "mesh",
            "controller-revision-hash": "7c9d5b",
            "apps.kruise.io/sidecarset-container": "proxy",
        })
    );
    assert_eq!(value["metadata"]["ownerReferences"][0]["uid"], "uid-mesh");
    assert_eq!(value["metadata"]["ownerReferences"][0]["controller"], true);
    assert_eq!(value["spec"]["parallelism"], 3);
    assert_eq!(
        value["spec"]["pullPolicy"],
        json!({"timeoutSeconds": 90, "backoffLimit": 1})
    );
    assert_eq!(value["spec"]["completionPolicy"], json!({"type": "Never"}));
    assert_eq!(value["spec"]["imagePullPolicy"], "IfNotPresent");
    assert_eq!(
        value["spec"]["sandboxConfig"]["labels"]["kruise.io/sidecarset-name"],
        "mesh"
    );
    assert_eq!(
        value["spec"]["selector"]["names"].as_array().unwrap().len(),
        2
    );
}

#[test]
fn an_existing_job_is_updated_only_where_it_differs() {
    let s = set(json!({}), &[]);
    let Decision::Pull(plans) = decide_for(&s, &[old("a", "n1"), old("b", "n2")], 0, false) else {
        panic!()
    };
    let (mut k, _) = knobs(&s);
    let have = job(&s, &plans[0], &k);
    assert_eq!(job_update(&have, &have), None);
    k.parallelism = 5;
    let mut more = plans[0].clone();
    more.nodes.push("n9".into());
    let want = job(&s, &more, &k);
    let patch = job_update(&have, &want).expect("a patch");
    assert_eq!(patch["spec"]["parallelism"], 5);
    assert_eq!(
        patch["spec"]["selector"]["names"].as_array().unwrap().len(),
        3
    );
    assert!(patch["spec"].get("pullPolicy").is_none());
}

fn nodeimage(tags: Value) -> LeanNodeImage {
    serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1", "kind": "NodeImage",
        "metadata": {"name": "n1"},
        "spec": {},
        "status": {"desired": 1, "succeeded": 0, "failed": 0, "pulling": 0, "waiting": 0,
                   "imageStatuses": {"proxy": {"tags": tags}}}
    }))
    .unwrap()
}

#[test]
fn a_node_has_pulled_when_its_nodeimage_says_so_either_way() {
    assert!(
        pulled(None, "proxy:2"),
        "no NodeImage, no daemon to wait for"
    );
    assert!(!pulled(Some(&nodeimage(json!([]))), "proxy:2"));
    assert!(!pulled(
        Some(&nodeimage(json!([{"tag": "2", "phase": "Pulling"}]))),
        "proxy:2"
    ));
    assert!(pulled(
        Some(&nodeimage(json!([{"tag": "2", "phase": "Succeeded"}]))),
        "proxy:2"
    ));
    assert!(pulled(
        Some(&nodeimage(json!([{"tag": "2", "phase": "Failed"}]))),
        "docker.io/library/proxy:2"
    ));
    assert!(!pulled(
        Some(&nodeimage(json!([{"tag": "1", "phase": "Succeeded"}]))),
        "proxy:2"
    ));
}

#[test]
fn only_queued_pods_whose_node_lacks_the_image_wait() {
    let s = set(json!({"maxUnavailable": 3}), &[]);
    let pods = [
        old("a", "n1"),
        old("b", "n2"),
        pod("c", "shop", "n3", "proxy:2", json!({})),
    ];
    let mut views: Vec<_> = pods.iter().map(|p| test_view(&s, p)).collect();
    let batch = next_batch(&s, &views);
    let pulled_on_n1 = |node: &str| {
        (node == "n1").then(|| Arc::new(nodeimage(json!([{"tag": "2", "phase": "Succeeded"}]))))
    };
    let lookup = |node: &str| match node {
        "n1" => pulled_on_n1(node),
        _ => Some(Arc::new(nodeimage(json!([])))),
    };
    let awaiting = mark_awaiting(&s, &pods, &mut views, &batch, &lookup, &now(), MAX_WAIT);
    assert_eq!(awaiting.pods, 1);
    assert_eq!(awaiting.wake, None, "n2 has no entry yet: no deadline");
    assert!(!views[0].awaiting_images);
    assert!(views[1].awaiting_images);
    assert!(!views[2].awaiting_images, "already updated");
    let gated = next_batch(&s, &views);
    assert_eq!(gated.upgrade, [0]);
}

const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

/// n1's NodeImage with an entry for proxy:2 written at `created`, reported `phase`.
fn asked_at(created: &str, phase: &str) -> LeanNodeImage {
    let mut ni = nodeimage(json!([{"tag": "2", "phase": phase}]));
    ni.spec = serde_json::from_value(json!({"images": {"proxy": {"tags": [
        {"tag": "2", "createdAt": created}]}}}))
    .unwrap();
    ni
}

#[test]
fn a_pod_waits_for_its_nodes_pull_at_most_the_response_timeout_after_the_entry() {
    let s = set(json!({"maxUnavailable": 3}), &[]);
    let pods = [old("a", "n1")];
    let run = |ni: LeanNodeImage| {
        let mut views: Vec<_> = pods.iter().map(|p| test_view(&s, p)).collect();
        let batch = next_batch(&s, &views);
        let lookup = |_: &str| Some(Arc::new(ni.clone()));
        let awaiting = mark_awaiting(&s, &pods, &mut views, &batch, &lookup, &now(), MAX_WAIT);
        (awaiting, views[0].awaiting_images)
    };
    // Queued behind other tenants' pulls for 5 minutes: waits 5 more, and says when.
    let (awaiting, waits) = run(asked_at("2026-11-29T11:55:00Z", "Waiting"));
    assert!(waits);
    assert_eq!(
        awaiting.wake,
        Some("2026-11-29T12:05:00Z".parse().unwrap()),
        "back exactly when the wait ends"
    );
    // Still waiting after 10 minutes (or pulling): the kubelet pulls instead.
    for phase in ["Waiting", "Pulling"] {
        let (awaiting, waits) = run(asked_at("2026-11-29T11:49:00Z", phase));
        assert!(!waits, "{phase}");
        assert_eq!(awaiting, Awaiting::default(), "{phase}");
    }
    // Exactly at the deadline counts as past it.
    let (_, waits) = run(asked_at("2026-11-29T11:50:00Z", "Pulling"));
    assert!(!waits);
}

#[test]
fn the_wait_deadline_is_the_entrys_creation_plus_the_bound() {
    let ni = asked_at("2026-11-29T11:55:00Z", "Waiting");
    assert_eq!(
        wait_deadline(&ni, "docker.io/library/proxy:2", MAX_WAIT),
        Some("2026-11-29T12:05:00Z".parse().unwrap())
    );
    assert_eq!(wait_deadline(&ni, "proxy:3", MAX_WAIT), None, "no entry");
    let mut without_time = ni.clone();
    without_time.spec = serde_json::from_value(json!({"images": {"proxy": {"tags": [
        {"tag": "2"}]}}}))
    .unwrap();
    assert_eq!(wait_deadline(&without_time, "proxy:2", MAX_WAIT), None);
}

// --- the condition -------------------------------------------------------------------------------

fn now() -> Time {
    Time("2026-11-29T12:00:00Z".parse().unwrap())
}

#[test]
fn the_condition_says_where_pre_download_stands() {
    let plan = JobPlan {
        namespace: MANAGER_NS.into(),
        name: "j".into(),
        container: "proxy".into(),
        image: "proxy:2".into(),
        nodes: vec!["n1".into(), "n2".into()],
        pull_secrets: vec![],
    };
    let pulling = condition(
        &Decision::Pull(vec![plan.clone()]),
        Progress {
            nodes: 2,
            succeeded: 1,
            failed: 0,
        },
        None,
        Some(3),
        &now(),
    );
    assert_eq!(
        (pulling.status.as_str(), pulling.reason.as_str()),
        ("True", "Pulling")
    );
    assert_eq!(
        pulling.message,
        "pulling proxy:2 on 2 node(s): 1 succeeded, 0 failed"
    );
    let pulled = condition(
        &Decision::Pull(vec![plan]),
        Progress {
            nodes: 2,
            succeeded: 1,
            failed: 1,
        },
        Some(&pulling),
        Some(3),
        &Time("2026-11-29T13:00:00Z".parse().unwrap()),
    );
    assert_eq!(pulled.reason, "Pulled");
    assert_eq!(pulled.last_transition_time, now(), "still True");

    let cases = [
        (
            Decision::WaitingForUpdatedReadyPods {
                needed: 2,
                ready: 1,
            },
            "WaitingForUpdatedReadyPods",
            "starts once 2 pod(s)",
        ),
        (
            Decision::Skipped(Skip::Disabled),
            "Disabled",
            "--sidecarset-predownload=false",
        ),
        (
            Decision::Skipped(Skip::NotUpdate),
            "NotUpdateStrategy",
            "NotUpdate",
        ),
        (
            Decision::Skipped(Skip::OneBatch { matched: 4 }),
            "OneBatch",
            "all 4 pod(s)",
        ),
        (Decision::NothingToPull, "NothingToPull", "no pod"),
    ];
    for (decision, reason, says) in cases {
        let c = condition(&decision, Progress::default(), None, None, &now());
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", reason));
        assert!(c.message.contains(says), "{}", c.message);
    }
}

#[test]
fn listed_nodes_stay_and_new_targets_are_appended() {
    let s = set(json!({}), &[]);
    let Decision::Pull(mut plans) = decide_for(&s, &[old("a", "n2"), old("b", "n3")], 0, false)
    else {
        panic!()
    };
    let (k, _) = knobs(&s);
    let mut before = plans[0].clone();
    before.nodes = vec!["n1".into(), "n2".into()];
    let existing = vec![Arc::new(job(&s, &before, &k))];
    keep_listed_nodes(&mut plans, &existing);
    assert_eq!(plans[0].nodes, ["n1", "n2", "n3"]);
}

#[test]
fn a_hot_sidecar_needs_its_image_when_neither_twin_has_it() {
    let mut hot = set(json!({}), &[]);
    hot.spec.containers[0].upgrade_strategy = Some(
        serde_json::from_value(
            json!({"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "empty:1"}),
        )
        .expect("strategy"),
    );
    let twins = |first: &str, second: &str| -> PodSummary {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "shop"},
            "spec": {"nodeName": "n1", "containers": [
                {"name": "proxy-1", "image": first},
                {"name": "proxy-2", "image": second},
                {"name": "logs", "image": "logs:1"},
            ]}
        }))
        .expect("pod")
    };
    // The job keeps the sidecar's own name.
    assert_eq!(
        missing_images(&hot, &twins("proxy:1", "empty:1")),
        [("proxy", "proxy:2")]
    );
    // Either twin on the new image: nothing to pull (mid-upgrade, or working on it).
    assert!(missing_images(&hot, &twins("empty:1", "proxy:2")).is_empty());
    assert!(missing_images(&hot, &twins("proxy:2", "proxy:1")).is_empty());
    // No twin at all (not this SidecarSet's pod shape): nothing.
    let mut cold = twins("proxy:1", "empty:1");
    cold.spec.as_mut().expect("spec").containers.truncate(0);
    assert!(missing_images(&hot, &cold).is_empty());
}

#[test]
fn native_sidecar_images_are_pre_downloaded_too() {
    let mut s = set(json!({"type": "RollingUpdate"}), &[]);
    s.spec.init_containers = serde_json::from_value(json!([
        {"name": "setup", "image": "setup:2"},
        {"name": "agent", "image": "agent:2", "restartPolicy": "Always"},
    ]))
    .expect("init containers");
    let mut p = (*old("web-0", "node-1")).clone();
    p.spec.as_mut().expect("spec").init_containers = serde_json::from_value(json!([
        {"name": "setup", "image": "setup:1"},
        {"name": "agent", "image": "agent:1"},
    ]))
    .expect("init containers");
    // The plain init container `setup` never runs again: its image is not wanted.
    assert_eq!(
        missing_images(&s, &p),
        [("proxy", "proxy:2"), ("agent", "agent:2")]
    );
    p.spec.as_mut().expect("spec").init_containers[1].image = Some("agent:2".into());
    assert_eq!(missing_images(&s, &p), [("proxy", "proxy:2")]);
}
