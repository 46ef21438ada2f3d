use serde_json::json;

use super::*;
use kruise_rs_api::well_known::SIDECARSET_INJECTED_LIST;

fn pod(name: &str, list: &str) -> PodSummary {
    serde_json::from_value(json!({
        "metadata": {
            "name": name, "namespace": "ns", "resourceVersion": "1",
            "labels": {"app": "web"},
            "annotations": {SIDECARSET_INJECTED_LIST: list},
        },
        "spec": {
            "containers": [{"name": "proxy", "image": "proxy:1"}],
            "initContainers": [{"name": "agent", "image": "agent:1", "restartPolicy": "Always"}],
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "ContainersReady", "status": "True"},
            ],
            "containerStatuses": [{"name": "proxy", "image": "proxy:1", "imageID": "a", "ready": true, "restartCount": 0}],
            "initContainerStatuses": [{"name": "agent", "image": "agent:1", "imageID": "g", "ready": true, "restartCount": 0}],
        }
    }))
    .expect("pod")
}

/// One edit of a pod.
type Change = fn(&mut PodSummary);

fn wake(old: &PodSummary, new: &PodSummary) -> Vec<String> {
    sidecarsets_to_wake(Some(&signature(old)), Some(&signature(new)))
        .into_iter()
        .collect()
}

#[test]
fn changes_that_matter_wake_the_pods_sidecarsets() {
    let old = pod("a", "logs,mesh");
    let changes: Vec<(&str, Change)> = vec![
        ("readiness", |p| {
            p.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "False".into()
        }),
        ("deletion", |p| {
            p.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    "2026-11-29T00:00:00Z".parse().unwrap(),
                ))
        }),
        ("phase", |p| {
            p.status.as_mut().unwrap().phase = Some("Succeeded".into())
        }),
        ("image", |p| {
            p.spec.as_mut().unwrap().containers[0].image = Some("proxy:2".into())
        }),
        ("imageID", |p| {
            p.status
                .as_mut()
                .unwrap()
                .container_statuses
                .as_mut()
                .unwrap()[0]
                .image_id = "b".into()
        }),
        ("native sidecar image", |p| {
            p.spec.as_mut().unwrap().init_containers[0].image = Some("agent:2".into())
        }),
        ("native sidecar imageID", |p| {
            p.status
                .as_mut()
                .unwrap()
                .init_container_statuses
                .as_mut()
                .unwrap()[0]
                .image_id = "h".into()
        }),
        ("native sidecar ready", |p| {
            p.status
                .as_mut()
                .unwrap()
                .init_container_statuses
                .as_mut()
                .unwrap()[0]
                .ready = false
        }),
        ("container ready", |p| {
            p.status
                .as_mut()
                .unwrap()
                .container_statuses
                .as_mut()
                .unwrap()[0]
                .ready = false
        }),
        ("labels", |p| {
            let mut labels = p.labels().to_map();
            labels.insert("tier".into(), "x".into());
            p.set_labels(&labels);
        }),
        ("hash annotation", |p| {
            p.set_annotation("kruise.io/sidecarset-hash", "{}");
        }),
        ("scheduling", |p| {
            p.spec.as_mut().unwrap().node_name = Some("n1".into())
        }),
    ];
    for (what, change) in changes {
        let mut new = old.clone();
        change(&mut new);
        assert_eq!(wake(&old, &new), ["logs", "mesh"], "{what}");
    }
}

#[test]
fn other_changes_wake_nothing() {
    let old = pod("a", "mesh");
    let mut new = old.clone();
    new.metadata.resource_version = Some("2".into());
    new.status
        .as_mut()
        .unwrap()
        .container_statuses
        .as_mut()
        .unwrap()[0]
        .restart_count = 1;
    assert!(wake(&old, &new).is_empty());
}

#[test]
fn a_changed_injected_list_wakes_old_and_new_sidecarsets() {
    assert_eq!(wake(&pod("a", "logs"), &pod("a", "mesh")), ["logs", "mesh"]);
}

#[test]
fn the_tracker_wakes_on_creation_change_and_deletion_but_not_on_the_first_list() {
    let tracker = PodTracker::default();
    let a = pod("a", "mesh");
    assert!(tracker.wake(&watcher::Event::Init).is_empty());
    assert!(
        tracker
            .wake(&watcher::Event::InitApply(a.clone()))
            .is_empty()
    );
    assert!(tracker.wake(&watcher::Event::InitDone).is_empty());
    assert!(
        tracker.wake(&watcher::Event::Apply(a.clone())).is_empty(),
        "no change"
    );
    let b = pod("b", "logs");
    assert_eq!(
        tracker.wake(&watcher::Event::Apply(b.clone())),
        BTreeSet::from(["logs".to_owned()])
    );
    let mut a2 = a.clone();
    a2.spec.as_mut().unwrap().containers[0].image = Some("proxy:2".into());
    assert_eq!(
        tracker.wake(&watcher::Event::Apply(a2)),
        BTreeSet::from(["mesh".to_owned()])
    );
    assert_eq!(
        tracker.wake(&watcher::Event::Delete(b)),
        BTreeSet::from(["logs".to_owned()])
    );
}

#[test]
fn a_relist_wakes_the_sidecarsets_of_pods_that_vanished_meanwhile() {
    let tracker = PodTracker::default();
    tracker.wake(&watcher::Event::Apply(pod("a", "mesh")));
    tracker.wake(&watcher::Event::Apply(pod("b", "logs")));
    tracker.wake(&watcher::Event::Init);
    assert!(
        tracker
            .wake(&watcher::Event::InitApply(pod("a", "mesh")))
            .is_empty()
    );
    assert_eq!(
        tracker.wake(&watcher::Event::InitDone),
        BTreeSet::from(["logs".to_owned()])
    );
    // b is forgotten: deleting it again wakes nothing.
    assert!(
        tracker
            .wake(&watcher::Event::Delete(pod("b", "logs")))
            .is_empty()
    );
}
