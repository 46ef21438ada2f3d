use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference};
use serde_json::{Value, json};

use super::*;
use crate::controllers::sidecarset::pods::{namespace_labels, test_view};
use crate::controllers::sidecarset::predownload::{JobPlan, knobs_when};
use kruise_rs_api::imagepulljob::{
    ImagePullJobNodeSelector, ImagePullJobSpec, ImagePullJobTemplate,
};
use kruise_rs_api::sidecarset::SidecarSetSpec;
use kruise_rs_api::well_known::{SIDECARSET_HASH_WITHOUT_IMAGE, SIDECARSET_INJECTED_LIST};

const MANAGER_NS: &str = "kruise-system";

fn now() -> Time {
    Time("2026-11-29T12:00:00Z".parse().expect("time"))
}

/// SidecarSet `mesh` (uid `uid-mesh`, hash "new") whose proxy is now on `proxy:2`.
fn set(strategy: Value) -> SidecarSet {
    let spec: SidecarSetSpec = serde_json::from_value(json!({
        "selector": {"matchLabels": {"app": "web"}},
        "containers": [{"name": "proxy", "image": "proxy:2"}],
        "updateStrategy": strategy,
    }))
    .expect("spec");
    let mut set = SidecarSet::new("mesh", spec);
    set.metadata.uid = Some("uid-mesh".into());
    set.metadata.annotations = Some(BTreeMap::from([
        (SIDECARSET_HASH.to_owned(), "new".to_owned()),
        (SIDECARSET_HASH_WITHOUT_IMAGE.to_owned(), "shape".to_owned()),
    ]));
    set.status = Some(SidecarSetStatus {
        latest_revision: Some("mesh-7c9d5b".into()),
        ..Default::default()
    });
    set
}

/// A ready pod on `node`, injected with `injected`, labelled `app: <app>`, its proxy on `image`
/// (hash "new" when that is proxy:2), recording `revision`.
fn pod_of(name: &str, injected: &str, app: &str, image: &str, revision: &str) -> Arc<PodSummary> {
    let hash = if image == "proxy:2" { "new" } else { "old" };
    let entry = |h: &str| {
        format!(
            r#"{{"{injected}":{{"updateTimestamp":null,"hash":"{h}","sidecarSetName":"{injected}","sidecarList":["proxy"],"controllerRevision":"{revision}"}}}}"#
        )
    };
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {
                "name": name, "namespace": "shop", "labels": {"app": app},
                "creationTimestamp": "2026-11-29T10:00:00Z",
                "annotations": {
                    SIDECARSET_INJECTED_LIST: injected,
                    SIDECARSET_HASH: entry(hash),
                    SIDECARSET_HASH_WITHOUT_IMAGE: entry("shape"),
                }
            },
            "spec": {
                "nodeName": format!("node-{name}"),
                "containers": [
                    {"name": "app", "image": "shop:1"},
                    {"name": "proxy", "image": image},
                ]
            },
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-29T10:00:00Z"}],
                "containerStatuses": [
                    {"name": "app", "image": "shop:1", "imageID": "a", "ready": true, "restartCount": 0},
                    {"name": "proxy", "image": image, "imageID": image, "ready": true, "restartCount": 0},
                ]
            }
        }))
        .expect("pod"),
    )
}

fn old(name: &str) -> Arc<PodSummary> {
    pod_of(name, "mesh", "web", "proxy:1", "mesh-1")
}

fn new(name: &str) -> Arc<PodSummary> {
    pod_of(name, "mesh", "web", "proxy:2", "mesh-7c9d5b")
}

fn no_namespaces() -> NamespaceLabels {
    namespace_labels(std::iter::empty::<&Namespace>())
}

fn job(name: &str, set_label: Option<&str>, owner_uid: &str, nodes: &[&str]) -> Arc<ImagePullJob> {
    let mut job = ImagePullJob::new(
        name,
        ImagePullJobSpec {
            image: "proxy:2".into(),
            template: ImagePullJobTemplate {
                selector: Some(ImagePullJobNodeSelector {
                    names: nodes.iter().map(|n| (*n).to_owned()).collect(),
                    ..Default::default()
                }),
                ..Default::default()
            },
        },
    );
    job.metadata.namespace = Some("shop".into());
    if let Some(set) = set_label {
        job.metadata.labels = Some(BTreeMap::from([(
            SIDECARSET_NAME_LABEL.to_owned(),
            set.to_owned(),
        )]));
    }
    job.metadata.owner_references = Some(vec![OwnerReference {
        uid: owner_uid.into(),
        ..Default::default()
    }]);
    Arc::new(job)
}

/// `plan` for `set` over `owned`, pre-download on or off, no jobs and no NodeImages yet.
fn plan_with<'a>(set: &SidecarSet, owned: &'a [Arc<PodSummary>], predownload: bool) -> Plan<'a> {
    plan_counting(set, owned, predownload, 0)
}

/// [`plan`] with no jobs and no NodeImages, `collision_count` collisions so far.
fn plan_counting<'a>(
    set: &SidecarSet,
    owned: &'a [Arc<PodSummary>],
    predownload: bool,
    collision_count: i32,
) -> Plan<'a> {
    let (knobs, _) = knobs_when(set, predownload);
    let nodeimage = |_: &str| None;
    plan(
        set,
        CurrentHashes::of(set),
        owned,
        collision_count,
        &now(),
        &PreDownloadInputs {
            knobs: &knobs,
            manager_namespace: MANAGER_NS,
            jobs: &[],
            nodeimage: &nodeimage,
        },
    )
}

fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: now(),
        observed_generation: None,
    }
}

fn status_with(conditions: Vec<Condition>) -> SidecarSetStatus {
    SidecarSetStatus {
        conditions,
        ..Default::default()
    }
}

// --- owned_pods ----------------------------------------------------------------------------------

#[test]
fn owned_pods_are_the_injected_and_selected_ones_in_order() {
    let pods = vec![
        old("a"),
        pod_of("other-set", "logs", "web", "proxy:1", "logs-1"),
        pod_of("other-app", "mesh", "db", "proxy:1", "mesh-1"),
        new("b"),
    ];
    let owned = owned_pods(&set(json!({})), pods, &no_namespaces());
    let names: Vec<_> = owned.iter().map(|p| p.name_any()).collect();
    assert_eq!(names, ["a", "b"]);
}

#[test]
fn no_pods_own_nothing() {
    assert!(owned_pods(&set(json!({})), Vec::new(), &no_namespaces()).is_empty());
}

// --- plan ----------------------------------------------------------------------------------------

#[test]
fn a_plan_has_one_view_per_owned_pod_in_the_same_order() {
    let owned = [old("a"), new("b"), old("c")];
    let s = set(json!({}));
    let plan = plan_with(&s, &owned, false);
    let names: Vec<_> = plan.views.iter().map(|v| v.name().to_string()).collect();
    assert_eq!(names, ["a", "b", "c"]);
}

#[test]
fn the_batch_respects_max_unavailable() {
    let owned = [old("a"), old("b"), old("c")];
    let s = set(json!({"maxUnavailable": 2}));
    let plan = plan_with(&s, &owned, false);
    assert_eq!(plan.batch.upgrade.len(), 2);
    assert_eq!(plan.report.status.matched_pods, 3);
    assert_eq!(plan.report.status.updated_pods, 0);
}

#[test]
fn a_finished_rollout_upgrades_nothing_and_counts_every_pod_updated() {
    let owned = [new("a"), new("b")];
    let s = set(json!({}));
    let plan = plan_with(&s, &owned, true);
    assert!(plan.batch.upgrade.is_empty());
    assert_eq!(plan.report.status.matched_pods, 2);
    assert_eq!(plan.report.status.updated_pods, 2);
    assert_eq!(plan.report.status.updated_ready_pods, 2);
    assert!(!matches!(plan.predownload, Decision::Pull(_)));
}

#[test]
fn the_status_records_the_latest_revision_and_the_collision_count() {
    let owned = [old("a")];
    let s = set(json!({}));
    let plan = plan_counting(&s, &owned, false, 3);
    assert_eq!(
        plan.report.status.latest_revision.as_deref(),
        Some("mesh-7c9d5b")
    );
    assert_eq!(plan.report.status.collision_count, Some(3));
}

#[test]
fn every_plan_carries_exactly_one_pre_download_condition() {
    for predownload in [false, true] {
        let owned = [old("a"), old("b"), old("c")];
        let s = set(json!({"maxUnavailable": 1}));
        let plan = plan_with(&s, &owned, predownload);
        let count = plan
            .report
            .status
            .conditions
            .iter()
            .filter(|c| c.type_ == IMAGE_PREDOWNLOAD)
            .count();
        assert_eq!(count, 1, "predownload {predownload}");
    }
}

#[test]
fn with_pre_download_off_nothing_is_pulled() {
    let owned = [old("a"), old("b"), old("c")];
    let s = set(json!({"maxUnavailable": 1}));
    let plan = plan_with(&s, &owned, false);
    assert!(plan.predownload.jobs().is_empty());
    assert_eq!(plan.batch.upgrade.len(), 1);
}

#[test]
fn with_pre_download_on_the_old_pods_nodes_are_pulled_on() {
    let owned = [old("a"), old("b"), old("c")];
    let s = set(json!({"maxUnavailable": 1}));
    let plan = plan_with(&s, &owned, true);
    let Decision::Pull(jobs) = &plan.predownload else {
        panic!("expected a pull, got {:?}", plan.predownload);
    };
    let mut nodes: Vec<&str> = jobs
        .iter()
        .flat_map(|j| j.nodes.iter().map(String::as_str))
        .collect();
    nodes.sort_unstable();
    assert_eq!(nodes, ["node-a", "node-b", "node-c"]);
}

#[test]
fn a_plan_over_no_pods_is_empty() {
    let s = set(json!({}));
    let plan = plan_with(&s, &[], true);
    assert!(plan.views.is_empty());
    assert!(plan.batch.upgrade.is_empty());
    assert_eq!(plan.report.status.matched_pods, 0);
}

// --- small decisions -----------------------------------------------------------------------------

#[test]
fn the_recorded_revision_is_this_sets_entry() {
    assert_eq!(
        recorded_revision(&old("a"), "mesh").as_deref(),
        Some("mesh-1")
    );
    assert_eq!(recorded_revision(&old("a"), "logs"), None);
    let empty = pod_of("e", "mesh", "web", "proxy:1", "");
    assert_eq!(recorded_revision(&empty, "mesh"), None);
    let mut bad = (*old("x")).clone();
    bad.set_annotation(SIDECARSET_HASH, "not json");
    assert_eq!(recorded_revision(&bad, "mesh"), None);
}

#[test]
fn revisions_in_use_are_those_the_pods_record_once_each() {
    let owned = [old("a"), old("b"), new("c")];
    let in_use = revisions_in_use(&owned, "mesh");
    assert_eq!(
        in_use.into_iter().collect::<Vec<_>>(),
        ["mesh-1", "mesh-7c9d5b"]
    );
}

#[test]
fn revisions_in_use_read_every_distinct_annotation() {
    // Two annotations recording one revision (upgraded at different times), one recording
    // another, and ones recording none for this set.
    let mut later = (*old("later")).clone();
    let value = later.annotation(SIDECARSET_HASH).unwrap().replace(
        r#""updateTimestamp":null"#,
        r#""updateTimestamp":"2026-11-29T11:00:00Z""#,
    );
    later.set_annotation(SIDECARSET_HASH, &value);
    let mut bad = (*old("bad")).clone();
    bad.set_annotation(SIDECARSET_HASH, "not json");
    let owned = [
        old("a"),
        Arc::new(later),
        pod_of("o", "logs", "web", "proxy:1", "logs-3"),
        Arc::new(bad),
        pod_of("e", "mesh", "web", "proxy:1", ""),
        pod_of("n", "mesh", "web", "proxy:2", "mesh-2"),
    ];
    let in_use = revisions_in_use(&owned, "mesh");
    assert_eq!(in_use.into_iter().collect::<Vec<_>>(), ["mesh-1", "mesh-2"]);
}

#[test]
fn the_history_is_the_revisions_labelled_with_the_name() {
    let revision = |name: &str, set: Option<&str>| {
        let mut r = ControllerRevision::default();
        r.metadata.name = Some(name.into());
        r.metadata.labels = set.map(|s| BTreeMap::from([(SIDECARSET_NAME_LABEL.into(), s.into())]));
        r
    };
    let all = [
        revision("mesh-1", Some("mesh")),
        revision("logs-1", Some("logs")),
        revision("loose", None),
        revision("mesh-2", Some("mesh")),
    ];
    let names: Vec<_> = labelled_history("mesh", &all)
        .iter()
        .map(|r| r.name_any())
        .collect();
    assert_eq!(names, ["mesh-1", "mesh-2"]);
}

#[test]
fn own_jobs_carry_the_name_label_and_the_uid_as_owner() {
    let jobs = vec![
        job("mine", Some("mesh"), "uid-mesh", &[]),
        job("same-name-other-uid", Some("mesh"), "uid-old-mesh", &[]),
        job("other-set", Some("logs"), "uid-mesh", &[]),
        job("unlabelled", None, "uid-mesh", &[]),
    ];
    let own: Vec<_> = own_jobs(&set(json!({})), jobs)
        .iter()
        .map(|j| j.name_any())
        .collect();
    assert_eq!(own, ["mine"]);
}

#[test]
fn a_node_wakes_the_sets_whose_jobs_list_it() {
    let jobs = [
        job("j1", Some("mesh"), "u1", &["n1", "n2"]),
        job("j2", Some("logs"), "u2", &["n2"]),
        job("j3", Some("mesh"), "u1", &["n2"]),
        job("j4", None, "u3", &["n2"]),
    ];
    let on = |node| sidecarsets_pulling_on(jobs.iter().map(|j| &**j), node);
    assert_eq!(on("n1").into_iter().collect::<Vec<_>>(), ["mesh"]);
    assert_eq!(on("n2").into_iter().collect::<Vec<_>>(), ["logs", "mesh"]);
    assert!(on("n3").is_empty());
}

#[test]
fn not_upgradable_is_announced_when_it_appears_or_changes() {
    let no = |m: &str| status_with(vec![condition(PODS_UPGRADABLE, "False", "r", m)]);
    let yes = status_with(vec![condition(PODS_UPGRADABLE, "True", "r", "")]);
    assert_eq!(newly_not_upgradable(None, &no("p1")).as_deref(), Some("p1"));
    assert_eq!(
        newly_not_upgradable(Some(&yes), &no("p1")).as_deref(),
        Some("p1")
    );
    assert_eq!(
        newly_not_upgradable(Some(&no("p1")), &no("p2")).as_deref(),
        Some("p2")
    );
    assert_eq!(newly_not_upgradable(Some(&no("p1")), &no("p1")), None);
    assert_eq!(newly_not_upgradable(None, &yes), None);
    assert_eq!(newly_not_upgradable(None, &status_with(vec![])), None);
}

#[test]
fn a_skip_is_announced_once_per_reason() {
    let with =
        |reason: &str| status_with(vec![condition(IMAGE_PREDOWNLOAD, "False", reason, reason)]);
    assert_eq!(
        newly_skipped(None, &with("NotUpdateStrategy")),
        Some(("NotUpdateStrategy".into(), "NotUpdateStrategy".into()))
    );
    assert_eq!(
        newly_skipped(Some(&with("NotUpdateStrategy")), &with("OneBatch")),
        Some(("OneBatch".into(), "OneBatch".into()))
    );
    assert_eq!(
        newly_skipped(Some(&with("OneBatch")), &with("OneBatch")),
        None
    );
    assert_eq!(newly_skipped(None, &with("Pulling")), None);
    assert_eq!(newly_skipped(None, &status_with(vec![])), None);
}

#[test]
fn only_active_selected_pods_get_the_upgradable_condition() {
    let s = set(json!({}));
    let a = old("a");
    assert_eq!(upgradable(&test_view(&s, &a)), Some(true));
    let mut gone = (*old("g")).clone();
    gone.metadata.deletion_timestamp = Some(now());
    assert_eq!(upgradable(&test_view(&s, &gone)), None);
}

#[test]
fn the_true_condition_on_upgraded_pods_is_behind_the_flag() {
    let s = set(json!({}));
    // Upgraded in place by mesh: its record in the update state.
    let mut upgraded = (*new("u")).clone();
    upgraded.set_annotation(
        SIDECARSET_INPLACE_UPDATE_STATE,
        r#"{"mesh":{"revision":"mesh-1","updateTimestamp":null,"lastContainerStatuses":{"proxy":{"imageID":"proxy:1"}}}}"#,
    );
    assert!(upgraded_in_place(&upgraded, "mesh"));
    assert!(!upgraded_in_place(&upgraded, "logging"));
    let decide =
        |pod: &PodSummary, on: bool| pod_condition(&test_view(&s, pod), "mesh", on, &now());
    // Off: no condition on an upgradable pod that has none (kruise-rs's default).
    assert_eq!(decide(&upgraded, false), None);
    // On: upstream's True, once.
    let c = decide(&upgraded, true).expect("written");
    assert_eq!(
        (c.status.as_str(), c.reason.as_deref()),
        ("True", Some("AllSidecarsetUpgradable"))
    );
    assert_eq!(c.message.as_deref(), Some(r#"{"mesh":true}"#));
    let mut marked = upgraded.clone();
    marked
        .status
        .get_or_insert_default()
        .conditions
        .get_or_insert_default()
        .push(c);
    assert_eq!(decide(&marked, true), None);
    // A pod injected at this revision was never upgraded in place: nothing, as upstream.
    assert!(!upgraded_in_place(&new("i"), "mesh"));
    assert_eq!(decide(&new("i"), true), None);
    // Whatever the flag, a pod that cannot be upgraded gets False.
    let mut changed = (*old("c")).clone();
    let entry = r#"{"mesh":{"updateTimestamp":null,"hash":"old","sidecarSetName":"mesh","sidecarList":["proxy"]}}"#;
    changed.set_annotation(SIDECARSET_HASH_WITHOUT_IMAGE, entry);
    for on in [false, true] {
        let c = decide(&changed, on).expect("written");
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            ("False", Some("UpdateImmutableField"))
        );
    }
}

#[test]
fn the_status_patch_names_unset_optional_fields_as_null() {
    let patch = status_patch(&SidecarSetStatus {
        matched_pods: 2,
        latest_revision: Some("mesh-1".into()),
        ..Default::default()
    });
    let status = &patch["status"];
    assert_eq!(status["matchedPods"], json!(2));
    assert_eq!(status["latestRevision"], json!("mesh-1"));
    for key in ["observedGeneration", "collisionCount"] {
        assert_eq!(status.get(key), Some(&Value::Null), "{key}");
    }
    assert!(status.get("conditions").is_some());
}

#[test]
fn jobs_the_decision_does_not_name_are_unwanted() {
    let existing = [
        job("keep", Some("mesh"), "uid-mesh", &[]),
        job("drop", Some("mesh"), "uid-mesh", &[]),
    ];
    let wanted = JobPlan {
        namespace: "shop".into(),
        name: "keep".into(),
        container: "proxy".into(),
        image: "proxy:2".into(),
        nodes: vec!["n1".into()],
        pull_secrets: vec![],
    };
    let names = |d: &Decision| -> Vec<String> {
        unwanted_jobs(d, &existing)
            .iter()
            .map(|j| j.name_any())
            .collect()
    };
    assert_eq!(names(&Decision::Pull(vec![wanted])), ["drop"]);
    assert_eq!(names(&Decision::NothingToPull), ["keep", "drop"]);
    assert!(is_job(&existing[0], "shop", "keep"));
    assert!(!is_job(&existing[0], "other", "keep"));
}
