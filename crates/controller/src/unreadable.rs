//! Objects a watch cannot read. Parts of a SidecarSet are schemaless in the CRD (decision 0004),
//! so the apiserver can store one our types refuse (written while the webhook was off, or by an
//! older or newer writer). Watched as plain `K`, that one object fails the whole list: the cache
//! never syncs and everything waiting on it (every pod admission, `/readyz`) waits forever.
//! Watched as `Guarded<K>`, it arrives as a value naming the field that failed;
//! `skip_unreadable` reports it and takes it out of the stream, so the cache holds every object
//! it can read, and can keep the unreadable ones apart (`UnreadableObject`) for callers that
//! must know what they might be missing.

use std::borrow::Cow;
use std::collections::HashSet;
use std::marker::PhantomData;
use std::sync::Arc;

use futures::{Stream, StreamExt, future};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use kruise_rs_kube::events::Recorder;

/// An object as a watch read it: `K`, or why not. Unlike kube's `DeserializeGuard`, the error
/// names the path of the field that failed (`spec.containers[0].ports: invalid type: ...`), and
/// the unreadable object keeps its raw JSON, so the parts that do read can still be used.
#[derive(Clone, Debug)]
pub struct Guarded<K>(pub Result<K, Unreadable>);

/// An object `K` refuses.
#[derive(Clone, Debug)]
pub struct Unreadable {
    pub metadata: ObjectMeta,
    /// `<field path>: <what is wrong>`.
    pub error: String,
    /// The object as the apiserver sent it, without `metadata` (kept in `metadata`).
    pub raw: Value,
}

/// Why a value does not read as a type: where, and what is wrong there.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", if path.is_empty() { String::new() } else { format!("{path}: ") })]
pub struct ReadError {
    /// The field's path from the value read (`spec.containers[0].ports`); empty: the value
    /// itself.
    pub path: String,
    pub message: String,
}

impl ReadError {
    /// The same error for the value read found at `prefix` of an outer one.
    pub fn under(self, prefix: &str) -> Self {
        let path = match self.path.as_str() {
            "" => prefix.to_owned(),
            inner if inner.starts_with('[') => format!("{prefix}{inner}"),
            inner => format!("{prefix}.{inner}"),
        };
        Self { path, ..self }
    }
}

/// `K` read from `value`, or where and why not.
pub fn read_with_path<K: DeserializeOwned>(value: &Value) -> Result<K, ReadError> {
    serde_path_to_error::deserialize::<_, K>(value).map_err(|e| {
        let path = e.path().to_string();
        ReadError {
            path: if path == "." { String::new() } else { path },
            message: e.inner().to_string(),
        }
    })
}

impl<'de, K: DeserializeOwned + Resource> Deserialize<'de> for Guarded<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut raw = Value::deserialize(deserializer)?;
        match read_with_path::<K>(&raw) {
            Ok(object) => Ok(Guarded(Ok(object))),
            Err(error) => {
                let error = error.to_string();
                let mut metadata = raw
                    .as_object_mut()
                    .and_then(|fields| fields.remove("metadata"))
                    .unwrap_or(Value::Null);
                // Only unreadable objects are kept this way; their managed fields are noise.
                if let Some(fields) = metadata.as_object_mut() {
                    fields.remove("managedFields");
                }
                let metadata: ObjectMeta = serde_json::from_value(metadata).map_err(|e| {
                    D::Error::custom(format!("the object's metadata is unreadable: {e}"))
                })?;
                Ok(Guarded(Err(Unreadable {
                    metadata,
                    error,
                    raw,
                })))
            }
        }
    }
}

impl<K: Resource> Resource for Guarded<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        self.0.as_ref().map_or_else(|u| &u.metadata, K::meta)
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        self.0
            .as_mut()
            .map_or_else(|u| &mut u.metadata, K::meta_mut)
    }
}

/// An unreadable `K` as a cache entry of its own ([`skip_unreadable_into`]): a store of these
/// is what a cache of `K` is missing.
#[derive(Debug)]
pub struct UnreadableObject<K> {
    pub unreadable: Unreadable,
    kind: PhantomData<fn() -> K>,
}

// By hand: a derive would ask `K: Clone` of a marker.
impl<K> Clone for UnreadableObject<K> {
    fn clone(&self) -> Self {
        Self::new(self.unreadable.clone())
    }
}

impl<K> UnreadableObject<K> {
    fn new(unreadable: Unreadable) -> Self {
        Self {
            unreadable,
            kind: PhantomData,
        }
    }
}

impl<K: Resource> Resource for UnreadableObject<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.unreadable.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.unreadable.metadata
    }
}

/// Event reason on an object a watch cannot read.
pub(crate) const REASON: &str = "Unreadable";

/// The stream of the objects that can be read. An unreadable object in an `Apply` or `Delete`
/// becomes a `Delete` of that object (an object that turned unreadable must not stay in the cache
/// as it was); in the initial list it is left out. `report` is called for each unreadable
/// object, once per resource version.
pub fn skip_unreadable<K, S>(
    stream: S,
    report: impl FnMut(&Unreadable) + Send + 'static,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    K: Resource<DynamicType = ()> + Default + Send + 'static,
    S: Stream<Item = Result<watcher::Event<Guarded<K>>, watcher::Error>> + Send,
{
    split_unreadable(stream, report, None)
}

/// [`skip_unreadable`], keeping the unreadable objects in `unreadable`'s store: an object that
/// turns readable or is deleted leaves it, a relist replaces it.
pub fn skip_unreadable_into<K, S>(
    stream: S,
    report: impl FnMut(&Unreadable) + Send + 'static,
    unreadable: Writer<UnreadableObject<K>>,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    K: Resource<DynamicType = ()> + Default + Send + 'static,
    S: Stream<Item = Result<watcher::Event<Guarded<K>>, watcher::Error>> + Send,
{
    split_unreadable(stream, report, Some(unreadable))
}

fn split_unreadable<K, S>(
    stream: S,
    mut report: impl FnMut(&Unreadable) + Send + 'static,
    mut unreadable: Option<Writer<UnreadableObject<K>>>,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    K: Resource<DynamicType = ()> + Default + Send + 'static,
    S: Stream<Item = Result<watcher::Event<Guarded<K>>, watcher::Error>> + Send,
{
    let mut reported: HashSet<(Option<String>, Option<String>)> = HashSet::new();
    let mut report_once = move |invalid: &Unreadable| {
        let key = (
            invalid.metadata.uid.clone(),
            invalid.metadata.resource_version.clone(),
        );
        if reported.insert(key) {
            report(invalid);
        }
    };
    stream.filter_map(move |event| {
        if let (Some(writer), Ok(event)) = (unreadable.as_mut(), &event)
            && let Some(mirrored) = unreadable_event(event)
        {
            writer.apply_watcher_event(&mirrored);
        }
        let mapped = match event {
            Err(err) => Some(Err(err)),
            Ok(watcher::Event::Init) => Some(Ok(watcher::Event::Init)),
            Ok(watcher::Event::InitDone) => Some(Ok(watcher::Event::InitDone)),
            Ok(watcher::Event::InitApply(Guarded(object))) => match object {
                Ok(object) => Some(Ok(watcher::Event::InitApply(object))),
                Err(invalid) => {
                    report_once(&invalid);
                    None
                }
            },
            Ok(watcher::Event::Apply(Guarded(object))) => Some(Ok(match object {
                Ok(object) => watcher::Event::Apply(object),
                Err(invalid) => {
                    report_once(&invalid);
                    watcher::Event::Delete(placeholder(invalid.metadata))
                }
            })),
            Ok(watcher::Event::Delete(Guarded(object))) => Some(Ok(watcher::Event::Delete(
                object.unwrap_or_else(|invalid| placeholder(invalid.metadata)),
            ))),
        };
        future::ready(mapped)
    })
}

/// The event for the store of unreadable objects: they are applied, a readable object is
/// deleted from it (it may have been unreadable before), readable ones in a list are left out.
fn unreadable_event<K: Resource>(
    event: &watcher::Event<Guarded<K>>,
) -> Option<watcher::Event<UnreadableObject<K>>> {
    let stub = |meta: &ObjectMeta| {
        UnreadableObject::new(Unreadable {
            metadata: meta.clone(),
            error: String::new(),
            raw: Value::Null,
        })
    };
    Some(match event {
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
        watcher::Event::InitApply(Guarded(Err(invalid))) => {
            watcher::Event::InitApply(UnreadableObject::new(invalid.clone()))
        }
        watcher::Event::InitApply(Guarded(Ok(_))) => return None,
        watcher::Event::Apply(Guarded(Err(invalid))) => {
            watcher::Event::Apply(UnreadableObject::new(invalid.clone()))
        }
        watcher::Event::Apply(Guarded(Ok(object))) => watcher::Event::Delete(stub(object.meta())),
        watcher::Event::Delete(guarded) => watcher::Event::Delete(stub(guarded.meta())),
    })
}

/// A `K` carrying only the unreadable object's metadata: enough for a store to drop it by name.
fn placeholder<K: Resource + Default>(metadata: ObjectMeta) -> K {
    let mut object = K::default();
    *object.meta_mut() = metadata;
    object
}

/// A reporter for [`skip_unreadable`]: a log line naming the object and a Warning event on it
/// (sent in the background; a failed send is logged).
pub fn log_and_record<K>(
    recorder: Arc<Recorder>,
    what: &'static str,
) -> impl FnMut(&Unreadable) + Send + 'static
where
    K: Resource<DynamicType = ()>,
{
    move |invalid: &Unreadable| {
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
    use kruise_rs_api::sidecarset::SidecarSet;
    use serde_json::json;

    fn guarded(value: serde_json::Value) -> Guarded<SidecarSet> {
        serde_json::from_value(value).expect("any object with metadata")
    }

    fn good(name: &str) -> Guarded<SidecarSet> {
        guarded(json!({
            "metadata": {"name": name, "uid": name, "resourceVersion": "1"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}
        }))
    }

    fn bad(name: &str, rv: &str) -> Guarded<SidecarSet> {
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

    #[test]
    fn the_error_names_the_field_path_inside_a_sidecar_container() {
        let Guarded(read) = bad("b", "1");
        let invalid = read.expect_err("ports is not a list");
        assert_eq!(
            invalid.error,
            "spec.containers[0].ports: invalid type: string \"not-a-list\", expected a sequence"
        );
        assert_eq!(invalid.metadata.name.as_deref(), Some("b"));
        assert_eq!(invalid.raw["spec"]["containers"][0]["ports"], "not-a-list");
        assert!(
            invalid.raw.get("metadata").is_none(),
            "kept once, as metadata"
        );
        // SidecarSet-only fields and fields deeper in the Container keep their paths too.
        for (container, expected) in [
            (
                json!({"name": "c", "image": "i", "podInjectPolicy": "Sideways"}),
                "spec.containers[0].podInjectPolicy: unknown variant `Sideways`",
            ),
            (
                json!({"name": "c", "image": "i", "env": [{"name": "A", "valueFrom": {"fieldRef": 5}}]}),
                "spec.containers[0].env[0].valueFrom.fieldRef: invalid type: integer `5`",
            ),
            (
                json!({"name": "c", "image": "i", "transferEnv": [{"sourceContainerName": 1}]}),
                "spec.containers[0].transferEnv[0].sourceContainerName: invalid type: integer `1`",
            ),
        ] {
            let Guarded(read) = guarded(json!({
                "metadata": {"name": "x"},
                "spec": {"containers": [container]}
            }));
            let error = read.expect_err("unreadable").error;
            assert!(error.starts_with(expected), "{error}");
        }
    }

    #[test]
    fn a_readable_sidecar_container_reads_as_before() {
        let Guarded(read) = guarded(json!({
            "metadata": {"name": "ok"},
            "spec": {"containers": [{
                "name": "c", "image": "i", "ports": [{"containerPort": 80}],
                "podInjectPolicy": "AfterAppContainer", "futureField": {"x": 1},
                "transferEnv": [{"sourceContainerName": "app", "envName": "E"}],
                "upgradeStrategy": null
            }]}
        }));
        let set = read.expect("readable");
        let c = &set.spec.containers[0];
        assert_eq!(c.container.name, "c");
        assert_eq!(c.container.ports.as_ref().map(Vec::len), Some(1));
        assert_eq!(
            c.pod_inject_policy,
            Some(kruise_rs_api::sidecarset::PodInjectPolicy::AfterAppContainer)
        );
        assert_eq!(c.transfer_env.len(), 1);
        assert_eq!(c.upgrade_strategy, None);
    }

    #[tokio::test]
    async fn the_unreadable_store_follows_the_watch() {
        let (store, writer) = kube::runtime::reflector::store::<UnreadableObject<SidecarSet>>();
        let input = vec![
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(good("a"))),
            Ok(watcher::Event::InitApply(bad("b", "1"))),
            Ok(watcher::Event::InitDone),
            Ok(watcher::Event::Apply(bad("a", "2"))),
        ];
        let _: Vec<_> = skip_unreadable_into(futures::stream::iter(input), |_| {}, writer)
            .collect()
            .await;
        let mut names: Vec<_> = store
            .state()
            .iter()
            .map(|o| o.unreadable.metadata.name.clone().unwrap_or_default())
            .collect();
        names.sort();
        assert_eq!(names, ["a", "b"]);
        let b = store
            .get(&kube::runtime::reflector::ObjectRef::new("b"))
            .expect("b");
        assert!(b.unreadable.error.starts_with("spec.containers[0].ports:"));

        // Fixed, deleted, and a relist without the other one: the store empties.
        let (store, writer) = kube::runtime::reflector::store::<UnreadableObject<SidecarSet>>();
        let input = vec![
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(bad("a", "1"))),
            Ok(watcher::Event::InitApply(bad("b", "1"))),
            Ok(watcher::Event::InitApply(bad("c", "1"))),
            Ok(watcher::Event::InitDone),
            Ok(watcher::Event::Apply(good("a"))),
            Ok(watcher::Event::Delete(bad("b", "2"))),
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(good("c"))),
            Ok(watcher::Event::InitDone),
        ];
        let _: Vec<_> = skip_unreadable_into(futures::stream::iter(input), |_| {}, writer)
            .collect()
            .await;
        assert!(store.state().is_empty(), "{:?}", store.state());
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
