//! Objects a watch cannot read. Parts of a SidecarSet are schemaless in the CRD (decision 0004),
//! so the apiserver can store one our types refuse (written while the webhook was off, or by an
//! older or newer writer). Watched as plain `K`, that one object fails the whole list: the cache
//! never syncs and everything waiting on it (every pod admission, `/readyz`) waits forever.
//! Watched as [`DeserializeGuard<K>`], it arrives as a value; [`skip_unreadable`] reports it and
//! takes it out of the stream, so the cache holds every object it can read.

use std::collections::HashSet;
use std::sync::Arc;

use futures::{Stream, StreamExt, future};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::core::DeserializeGuard;
use kube::core::error_boundary::InvalidObject;
use kube::runtime::events::{Event, EventType};
use kube::runtime::watcher;

use crate::events::Recorder;

/// Event reason on an object a watch cannot read.
pub const REASON: &str = "Unreadable";

/// The stream of the objects that can be read. An unreadable object in an `Apply` or `Delete`
/// becomes a `Delete` of that object (an object that turned unreadable must not stay in the cache
/// as it was); in the initial list it is left out. `report` is called for each unreadable
/// object, once per resource version.
pub fn skip_unreadable<K, S>(
    stream: S,
    mut report: impl FnMut(&InvalidObject) + Send + 'static,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    K: Resource + Default + Send + 'static,
    S: Stream<Item = Result<watcher::Event<DeserializeGuard<K>>, watcher::Error>> + Send,
{
    let mut reported: HashSet<(Option<String>, Option<String>)> = HashSet::new();
    let mut report_once = move |invalid: &InvalidObject| {
        let key = (
            invalid.metadata.uid.clone(),
            invalid.metadata.resource_version.clone(),
        );
        if reported.insert(key) {
            report(invalid);
        }
    };
    stream.filter_map(move |event| {
        let mapped = match event {
            Err(err) => Some(Err(err)),
            Ok(watcher::Event::Init) => Some(Ok(watcher::Event::Init)),
            Ok(watcher::Event::InitDone) => Some(Ok(watcher::Event::InitDone)),
            Ok(watcher::Event::InitApply(DeserializeGuard(object))) => match object {
                Ok(object) => Some(Ok(watcher::Event::InitApply(object))),
                Err(invalid) => {
                    report_once(&invalid);
                    None
                }
            },
            Ok(watcher::Event::Apply(DeserializeGuard(object))) => Some(Ok(match object {
                Ok(object) => watcher::Event::Apply(object),
                Err(invalid) => {
                    report_once(&invalid);
                    watcher::Event::Delete(placeholder(invalid))
                }
            })),
            Ok(watcher::Event::Delete(DeserializeGuard(object))) => Some(Ok(
                watcher::Event::Delete(object.unwrap_or_else(placeholder)),
            )),
        };
        future::ready(mapped)
    })
}

/// A `K` carrying only the unreadable object's metadata: enough for a store to drop it by name.
fn placeholder<K: Resource + Default>(invalid: InvalidObject) -> K {
    let mut object = K::default();
    *object.meta_mut() = invalid.metadata;
    object
}

/// A reporter for [`skip_unreadable`]: a log line naming the object and a Warning event on it
/// (sent in the background; a failed send is logged).
pub fn log_and_record<K>(
    recorder: Arc<Recorder>,
    what: &'static str,
) -> impl FnMut(&InvalidObject) + Send + 'static
where
    K: Resource<DynamicType = ()>,
{
    move |invalid: &InvalidObject| {
        let name = invalid.metadata.name.clone().unwrap_or_default();
        let namespace = invalid.metadata.namespace.clone();
        tracing::warn!(
            kind = %K::kind(&()),
            name = %name,
            namespace = ?namespace,
            error = %invalid.error,
            "cannot read this object; {what} goes on without it"
        );
        let regarding = ObjectReference {
            api_version: Some(K::api_version(&()).into_owned()),
            kind: Some(K::kind(&()).into_owned()),
            name: Some(name),
            namespace,
            uid: invalid.metadata.uid.clone(),
            resource_version: invalid.metadata.resource_version.clone(),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: REASON.into(),
            note: Some(format!(
                "kruise-rs cannot read this {}: {}; {what} goes on without it until it is fixed",
                K::kind(&()),
                invalid.error
            )),
            action: "Watch".into(),
            secondary: None,
        };
        let recorder = recorder.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(err) = recorder.publish(&event, &regarding).await {
                    tracing::warn!(error = %err, "cannot record the unreadable-object event");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::sidecarset::SidecarSet;
    use serde_json::json;

    fn guarded(value: serde_json::Value) -> DeserializeGuard<SidecarSet> {
        serde_json::from_value(value).expect("any object with metadata")
    }

    fn good(name: &str) -> DeserializeGuard<SidecarSet> {
        guarded(json!({
            "metadata": {"name": name, "uid": name, "resourceVersion": "1"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}
        }))
    }

    fn bad(name: &str, rv: &str) -> DeserializeGuard<SidecarSet> {
        guarded(json!({
            "metadata": {"name": name, "uid": name, "resourceVersion": rv},
            "spec": {"containers": [{"name": "c", "image": "busybox", "ports": "not-a-list"}]}
        }))
    }

    fn names(events: &[watcher::Event<SidecarSet>]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                watcher::Event::Init => "init".into(),
                watcher::Event::InitDone => "done".into(),
                watcher::Event::InitApply(s) => {
                    format!("list {}", s.metadata.name.clone().unwrap())
                }
                watcher::Event::Apply(s) => format!("apply {}", s.metadata.name.clone().unwrap()),
                watcher::Event::Delete(s) => format!("delete {}", s.metadata.name.clone().unwrap()),
            })
            .collect()
    }

    #[tokio::test]
    async fn an_unreadable_object_is_reported_once_and_left_out() {
        let input = vec![
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(good("a"))),
            Ok(watcher::Event::InitApply(bad("b", "1"))),
            Ok(watcher::Event::InitDone),
            Ok(watcher::Event::Apply(bad("a", "2"))),
            Ok(watcher::Event::Apply(bad("a", "2"))),
            Ok(watcher::Event::Delete(bad("b", "3"))),
        ];
        let reported = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = reported.clone();
        let out: Vec<_> = skip_unreadable(futures::stream::iter(input), move |invalid| {
            seen.lock()
                .unwrap()
                .push(invalid.metadata.name.clone().unwrap());
        })
        .map(|e| e.expect("no error"))
        .collect()
        .await;
        assert_eq!(
            names(&out),
            ["init", "list a", "done", "delete a", "delete a", "delete b"]
        );
        assert!(out.iter().all(|e| !matches!(e, watcher::Event::InitApply(s) if s.metadata.name.as_deref() == Some("b"))));
        assert_eq!(*reported.lock().unwrap(), ["b", "a"]);
    }
}
