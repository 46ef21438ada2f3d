//! Watches feeding the NodeImage controller's stores, and what each event changed.
//!
//! kube-runtime's `Controller` keeps whole objects and offers no stable way to strip them before
//! they are stored (`for_stream` is behind an unstable feature), and Nodes are big (their
//! `status.images` alone runs to kilobytes). So the stores here are fed by [`changes`], which
//! applies each (already stripped) watch event to a store and reports the objects whose stored
//! form changed. Because the stored form holds only what decisions read, a Node heartbeat or a
//! job's status update changes nothing and wakes no reconcile.

use std::collections::HashMap;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::NodeCondition;

use crate::controllers::shared::node_summary::{NodeStatusSummary, NodeSummary};
use kube::api::ObjectMeta;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store, store::Writer};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

use crate::apis::imagepulljob::ImagePullJob;
use crate::apis::nodeimage::NodeImage;

/// Keeps of a Node only what the controller reads: name, uid, labels, deletionTimestamp and the
/// Ready condition's status and transition time. Without a resourceVersion, an update that
/// touches nothing else leaves the stored Node equal, and so triggers nothing.
pub fn strip_node(node: NodeSummary) -> NodeSummary {
    let ready = node
        .status
        .and_then(|s| s.conditions)
        .and_then(|cs| cs.into_iter().find(|c| c.type_ == "Ready"))
        .map(|c| NodeCondition {
            type_: c.type_,
            status: c.status,
            last_transition_time: c.last_transition_time,
            ..NodeCondition::default()
        });
    NodeSummary {
        metadata: ObjectMeta {
            name: node.metadata.name,
            uid: node.metadata.uid,
            labels: node.metadata.labels,
            deletion_timestamp: node.metadata.deletion_timestamp,
            ..ObjectMeta::default()
        },
        status: ready.map(|ready| NodeStatusSummary {
            conditions: Some(vec![ready]),
        }),
    }
}

/// A NodeImage is kept whole (spec and status drive every decision, the resourceVersion guards
/// writes) but for its managedFields.
pub fn strip_nodeimage(mut nodeimage: NodeImage) -> NodeImage {
    nodeimage.metadata.managed_fields = None;
    nodeimage
}

/// Of an ImagePullJob, only its identity matters: it exists, with this uid.
pub fn strip_job(job: PartialObjectMeta<ImagePullJob>) -> PartialObjectMeta<ImagePullJob> {
    PartialObjectMeta {
        types: job.types,
        metadata: ObjectMeta {
            name: job.metadata.name,
            namespace: job.metadata.namespace,
            uid: job.metadata.uid,
            ..ObjectMeta::default()
        },
        _phantom: Default::default(),
    }
}

/// One object whose stored form a watch event changed.
pub struct Change<K: Resource> {
    pub key: ObjectRef<K>,
    pub before: Option<Arc<K>>,
    pub after: Option<Arc<K>>,
}

/// Whether a store has been listed once, for any number of waiters.
///
/// `Store::wait_until_ready` is not used for that: its future keeps a single waker, so of
/// several reconciles waiting at once only the last one to poll is woken (the others hang, and
/// with them a graceful shutdown).
#[derive(Clone, Debug)]
pub struct Ready(tokio::sync::watch::Receiver<bool>);

impl Ready {
    /// Resolves once the store has been listed, or its watch has stopped (shutdown).
    pub async fn wait(&self) {
        let _ = self.0.clone().wait_for(|ready| *ready).await;
    }

    /// Whether the store has been listed.
    pub fn is_ready(&self) -> bool {
        *self.0.borrow()
    }
}

/// Applies every event of `events` to `writer`'s store and yields the objects whose stored form
/// changed, by `same`. A re-list (`Init` … `InitDone`) is compared as a whole when it is
/// swapped in, so objects that changed or vanished while the watch was down are reported then,
/// after the store holds their new state. Watch errors are logged; the watcher recovers.
/// The [`Ready`] turns ready at the first `InitDone`.
pub fn changes<K, S>(
    events: S,
    mut writer: Writer<K>,
    same: fn(&K, &K) -> bool,
) -> (impl Stream<Item = Change<K>> + Send, Ready)
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
{
    let reader = writer.as_reader();
    let (ready_tx, ready_rx) = tokio::sync::watch::channel(false);
    let changes = events
        .map(move |event| match event {
            Ok(event) => {
                let changed = apply(&mut writer, &reader, &event, same);
                if matches!(event, watcher::Event::InitDone) {
                    ready_tx.send_replace(true);
                }
                changed
            }
            Err(err) => {
                tracing::warn!(kind = %K::kind(&()), error = %err, "watch failed; retrying");
                Vec::new()
            }
        })
        .flat_map(futures::stream::iter);
    (changes, Ready(ready_rx))
}

fn apply<K>(
    writer: &mut Writer<K>,
    reader: &Store<K>,
    event: &watcher::Event<K>,
    same: fn(&K, &K) -> bool,
) -> Vec<Change<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let differs = |a: &Option<Arc<K>>, b: &Option<Arc<K>>| match (a, b) {
        (Some(a), Some(b)) => !same(a, b),
        (None, None) => false,
        _ => true,
    };
    match event {
        watcher::Event::Apply(obj) | watcher::Event::Delete(obj) => {
            let key = ObjectRef::from_obj(obj);
            let before = reader.get(&key);
            writer.apply_watcher_event(event);
            let after = reader.get(&key);
            if differs(&before, &after) {
                vec![Change { key, before, after }]
            } else {
                Vec::new()
            }
        }
        watcher::Event::Init | watcher::Event::InitApply(_) => {
            writer.apply_watcher_event(event);
            Vec::new()
        }
        watcher::Event::InitDone => {
            let mut before: HashMap<ObjectRef<K>, Arc<K>> = reader
                .state()
                .into_iter()
                .map(|o| (ObjectRef::from_obj(&*o), o))
                .collect();
            writer.apply_watcher_event(event);
            let mut changed = Vec::new();
            for obj in reader.state() {
                let key = ObjectRef::from_obj(&*obj);
                let before = before.remove(&key);
                let after = Some(obj);
                if differs(&before, &after) {
                    changed.push(Change { key, before, after });
                }
            }
            changed.extend(before.into_iter().map(|(key, obj)| Change {
                key,
                before: Some(obj),
                after: None,
            }));
            changed
        }
    }
}

/// `same` for types compared whole.
pub fn equal<K: PartialEq>(a: &K, b: &K) -> bool {
    a == b
}

/// `same` for ImagePullJobs: only a different uid (a job replaced under the same name) counts.
pub fn same_uid(a: &PartialObjectMeta<ImagePullJob>, b: &PartialObjectMeta<ImagePullJob>) -> bool {
    a.uid() == b.uid()
}

#[cfg(test)]
mod tests {
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
        assert_eq!(node.metadata.labels.as_ref().map(|l| l.len()), Some(1));
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
    fn a_stripped_job_keeps_its_identity() {
        let job = PartialObjectMeta::<ImagePullJob> {
            metadata: ObjectMeta {
                name: Some("j".into()),
                namespace: Some("ns".into()),
                uid: Some("u".into()),
                labels: Some(BTreeMap::from([("a".into(), "b".into())])),
                managed_fields: Some(vec![Default::default()]),
                resource_version: Some("9".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let job = strip_job(job);
        assert_eq!(
            (job.name_any(), job.namespace(), job.uid()),
            ("j".to_owned(), Some("ns".to_owned()), Some("u".to_owned()))
        );
        assert!(job.metadata.labels.is_none() && job.metadata.resource_version.is_none());
    }

    fn node_named(name: &str, zone: &str) -> NodeSummary {
        NodeSummary {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(BTreeMap::from([("zone".into(), zone.into())])),
                ..Default::default()
            },
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
                .and_then(|n| n.labels().get("zone").cloned()),
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
}
