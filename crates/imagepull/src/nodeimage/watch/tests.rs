use super::*;
use k8s_openapi::api::core::v1::{ContainerImage, Node, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::store;
use std::collections::BTreeMap;

/// A Node as the apiserver sends it, read as the watch reads it.
fn big_node(name: &str, heartbeat: i64) -> NodeSummary {
    let t = |s| Time(Timestamp::from_second(1_700_000_000 + s).expect("valid"));
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some(heartbeat.to_string()),
            labels: Some(BTreeMap::from([("zone".into(), "a".into())])),
            annotations: Some(BTreeMap::from([("big".into(), "x".repeat(100))])),
            managed_fields: Some(vec![Default::default()]),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: Some(vec![Taint {
                key: "k".into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            conditions: Some(vec![
                NodeCondition {
                    type_: "DiskPressure".into(),
                    status: "False".into(),
                    ..Default::default()
                },
                NodeCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    last_transition_time: Some(t(0)),
                    last_heartbeat_time: Some(t(heartbeat)),
                    reason: Some("KubeletReady".into()),
                    message: Some("kubelet is posting ready status".into()),
                },
            ]),
            images: Some(vec![ContainerImage {
                names: Some(vec!["nginx:1".into()]),
                size_bytes: Some(1),
            }]),
            ..Default::default()
        }),
    };
    serde_json::from_value(serde_json::to_value(node).expect("json")).expect("a NodeSummary")
}

#[test]
fn a_stripped_node_keeps_labels_deletion_and_ready_only() {
    let node = strip_node(big_node("n1", 5));
    assert_eq!(node.metadata.name.as_deref(), Some("n1"));
    assert_eq!(node.metadata.uid.as_deref(), Some("uid-n1"));
    assert_eq!(node.labels.len(), 1);
    assert!(node.metadata.annotations.is_none());
    assert!(node.metadata.managed_fields.is_none());
    assert!(node.metadata.resource_version.is_none());
    let status = node.status.expect("status");
    let conditions = status.conditions.expect("conditions");
    assert_eq!(conditions.len(), 1);
    assert_eq!(conditions[0].type_, "Ready");
    assert_eq!(conditions[0].status, "True");
    assert!(conditions[0].last_transition_time.is_some());
    assert!(conditions[0].last_heartbeat_time.is_none());
    assert!(conditions[0].message.is_none());
    // Heartbeats leave the stripped form equal.
    assert_eq!(
        strip_node(big_node("n1", 5)),
        strip_node(big_node("n1", 60))
    );
    // No status, no Ready: nothing kept.
    let bare = strip_node(NodeSummary::default());
    assert!(bare.status.is_none());
}

#[test]
fn a_stripped_job_keeps_its_identity_and_spec() {
    let mut job = ImagePullJob::new("j", Default::default());
    job.spec.image = "nginx:1".into();
    job.metadata = ObjectMeta {
        name: Some("j".into()),
        namespace: Some("ns".into()),
        uid: Some("u".into()),
        labels: Some(BTreeMap::from([("a".into(), "b".into())])),
        managed_fields: Some(vec![Default::default()]),
        resource_version: Some("9".into()),
        ..Default::default()
    };
    job.status = Some(Default::default());
    let job = strip_job(job);
    assert_eq!(
        (job.name_any(), job.namespace(), job.uid()),
        ("j".to_owned(), Some("ns".to_owned()), Some("u".to_owned()))
    );
    assert_eq!(job.spec.image, "nginx:1");
    assert!(job.metadata.labels.is_none() && job.metadata.resource_version.is_none());
    assert!(job.status.is_none());
}

fn node_named(name: &str, zone: &str) -> NodeSummary {
    NodeSummary {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        labels: [("zone", zone)].into_iter().collect(),
        ..Default::default()
    }
}

fn keys(changes: &[Change<NodeSummary>]) -> Vec<(String, bool, bool)> {
    let mut keys: Vec<_> = changes
        .iter()
        .map(|c| (c.key.name.clone(), c.before.is_some(), c.after.is_some()))
        .collect();
    keys.sort();
    keys
}

#[test]
fn events_report_what_changed_in_the_store() {
    let (reader, mut writer) = store::<NodeSummary>();
    let mut run = |e: watcher::Event<NodeSummary>| apply(&mut writer, &reader, &e, equal);
    assert!(run(watcher::Event::Init).is_empty());
    assert!(run(watcher::Event::InitApply(node_named("a", "1"))).is_empty());
    assert!(run(watcher::Event::InitApply(node_named("b", "1"))).is_empty());
    assert_eq!(
        keys(&run(watcher::Event::InitDone)),
        [("a".into(), false, true), ("b".into(), false, true)]
    );
    assert!(
        run(watcher::Event::Apply(node_named("a", "1"))).is_empty(),
        "no change"
    );
    assert_eq!(
        keys(&run(watcher::Event::Apply(node_named("a", "2")))),
        [("a".into(), true, true)]
    );
    assert_eq!(
        keys(&run(watcher::Event::Delete(node_named("b", "1")))),
        [("b".into(), true, false)]
    );
    assert!(
        run(watcher::Event::Delete(node_named("b", "1"))).is_empty(),
        "already gone"
    );

    // A re-list: `a` changed, `c` appeared and `d`… never existed; `a`'s old form is what
    // the store shows until the swap.
    assert!(run(watcher::Event::Apply(node_named("e", "1"))).len() == 1);
    assert!(run(watcher::Event::Init).is_empty());
    assert!(run(watcher::Event::InitApply(node_named("a", "3"))).is_empty());
    assert_eq!(
        reader
            .get(&ObjectRef::new("a"))
            .and_then(|n| n.labels.get("zone").map(str::to_owned)),
        Some("2".to_owned())
    );
    assert!(run(watcher::Event::InitApply(node_named("c", "1"))).is_empty());
    let changes = run(watcher::Event::InitDone);
    assert_eq!(
        keys(&changes),
        [
            ("a".into(), true, true),
            ("c".into(), false, true),
            ("e".into(), true, false)
        ],
        "e vanished while the watch was down"
    );
    assert_eq!(reader.len(), 2);
}
