//! Following a SidecarSet rollout from outside, as the rollout benches time it: a pod watch
//! counting the pods whose spec has reached the target, the first time the SidecarSet's status
//! says so, and the pod PATCH requests the apiserver counted meanwhile.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kruise_rs::controllers::sidecarset::pods::{
    InPlaceUpdateState, LastContainerStatus, render_update_states,
};
use kruise_rs_api::sidecarset::{SidecarSet, SidecarSetStatus};
use kruise_rs_api::well_known::{SIDECARSET_HASH, SIDECARSET_INPLACE_UPDATE_STATE};
use kruise_rs_sidecar::annotations::{SidecarSetUpgradeSpec, render_hashes};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::oneshot;

use crate::controlplane::apiserver_requests;

/// A pod's hash annotation holding one entry, for SidecarSet `set` with the one sidecar
/// `sidecar`, as an injection or upgrade writes it.
pub fn hash_annotation(set: &str, sidecar: &str, hash: &str, revision: &str, at: &Time) -> String {
    render_hashes(&BTreeMap::from([(
        set.to_owned(),
        SidecarSetUpgradeSpec {
            update_timestamp: Some(at.clone()),
            hash: hash.to_owned(),
            sidecar_set_name: set.to_owned(),
            sidecar_list: Some(vec![sidecar.to_owned()]),
            controller_revision: revision.to_owned(),
        },
    )]))
}

/// The in-place update state an upgrade of `sidecar` from `before_image_id` records.
pub fn update_state(
    set: &str,
    sidecar: &str,
    hash: &str,
    before_image_id: &str,
    at: &Time,
) -> String {
    render_update_states(&BTreeMap::from([(
        set.to_owned(),
        InPlaceUpdateState {
            revision: hash.to_owned(),
            update_timestamp: Some(at.clone()),
            last_container_statuses: BTreeMap::from([(
                sidecar.to_owned(),
                LastContainerStatus {
                    image_id: before_image_id.to_owned(),
                },
            )]),
            other: BTreeMap::new(),
        },
    )]))
}

/// The JSON patch a plain client sends to upgrade one pod as the controller would: the sidecar
/// at `index` of `spec.containers` on `image`, and the SidecarSet `set`'s hash and in-place
/// update state annotations for it, stamped now.
pub fn upgrade_patch(
    set: &str,
    sidecar: &str,
    index: usize,
    image: &str,
    hash: &str,
    revision: &str,
    before_image_id: &str,
) -> Result<json_patch::Patch, serde_json::Error> {
    let at = Time(k8s_openapi::jiff::Timestamp::now());
    serde_json::from_value(serde_json::json!([
        {"op": "replace", "path": format!("/spec/containers/{index}/image"), "value": image},
        {"op": "add", "path": annotation_path(SIDECARSET_HASH),
         "value": hash_annotation(set, sidecar, hash, revision, &at)},
        {"op": "add", "path": annotation_path(SIDECARSET_INPLACE_UPDATE_STATE),
         "value": update_state(set, sidecar, hash, before_image_id, &at)},
    ]))
}

/// The JSON pointer to annotation `key`.
fn annotation_path(key: &str) -> String {
    format!(
        "/metadata/annotations/{}",
        key.replace('~', "~0").replace('/', "~1")
    )
}
/// The spec image of `pod`'s container `name`.
pub fn container_image<'a>(pod: &'a Pod, name: &str) -> Option<&'a str> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == name)?
        .image
        .as_deref()
}

/// When the watch saw the first pod, half of them and the last one reach the target.
pub struct Reached {
    pub first: Option<Instant>,
    pub half: Option<Instant>,
    pub all: Instant,
}

impl Reached {
    /// "first pod after …, half after …, all N after …" from `t0`.
    pub fn timeline(&self, t0: Instant, n: usize) -> String {
        let at = |i: Option<Instant>| i.map_or("?".to_owned(), |i| secs(i - t0));
        format!(
            "first pod after {}, half after {}, all {n} after {}",
            at(self.first),
            at(self.half),
            secs(self.all - t0)
        )
    }
}

pub fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// A pod watch counting the pods that satisfy a predicate.
pub struct Follower {
    count: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<Result<Reached, String>>,
    want: usize,
}

/// Starts following the pods of `api` (all namespaces or one) until `want` of them satisfy
/// `reached`, and returns once the watch's initial list is in.
pub async fn follow(
    api: Api<Pod>,
    config: watcher::Config,
    reached: impl Fn(&Pod) -> bool + Send + 'static,
    want: usize,
) -> Result<Follower, String> {
    let (listed_tx, listed_rx) = oneshot::channel();
    let count = Arc::new(AtomicUsize::new(0));
    let shared = count.clone();
    let task = tokio::spawn(async move {
        let mut listed_tx = Some(listed_tx);
        let key = |pod: &Pod| (pod.namespace().unwrap_or_default(), pod.name_any());
        let mut on: HashMap<(String, String), bool> = HashMap::new();
        let mut relist: HashMap<(String, String), bool> = HashMap::new();
        let mut n = 0usize;
        let mut first = None;
        let mut half = None;
        let stream = watcher(api, config).default_backoff();
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Init) => relist.clear(),
                Ok(watcher::Event::InitApply(pod)) => {
                    relist.insert(key(&pod), reached(&pod));
                }
                Ok(watcher::Event::InitDone) => {
                    on = std::mem::take(&mut relist);
                    n = on.values().filter(|v| **v).count();
                    if let Some(tx) = listed_tx.take() {
                        let _ = tx.send(());
                    }
                }
                Ok(watcher::Event::Apply(pod)) => {
                    let now_on = reached(&pod);
                    if now_on && first.is_none() {
                        first = Some(Instant::now());
                    }
                    let was = on.insert(key(&pod), now_on).unwrap_or(false);
                    n = n + usize::from(now_on) - usize::from(was);
                }
                Ok(watcher::Event::Delete(pod)) => {
                    if on.remove(&key(&pod)).unwrap_or(false) {
                        n -= 1;
                    }
                }
                Err(e) => eprintln!("following the pods: {e}"),
            }
            shared.store(n, Ordering::Relaxed);
            if first.is_some() && half.is_none() && 2 * n >= want {
                half = Some(Instant::now());
            }
            if listed_tx.is_none() && n >= want {
                return Ok(Reached {
                    first,
                    half,
                    all: Instant::now(),
                });
            }
        }
        Err("the pod watch ended".to_owned())
    });
    listed_rx
        .await
        .map_err(|_| "the pod watch ended before its first list")?;
    Ok(Follower { count, task, want })
}

impl Follower {
    /// Waits until `want` pods are seen on the target, failing after `stall` without progress.
    pub async fn wait(mut self, what: &str, stall: Duration) -> Result<Reached, String> {
        let mut last = (self.count.load(Ordering::Relaxed), Instant::now());
        loop {
            tokio::select! {
                done = &mut self.task => return done.map_err(|e| format!("{what}: {e}"))?,
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            let now = self.count.load(Ordering::Relaxed);
            if now != last.0 {
                last = (now, Instant::now());
            } else if last.1.elapsed() > stall {
                self.task.abort();
                return Err(format!(
                    "{what}: stalled at {now}/{} pods for {} s",
                    self.want,
                    stall.as_secs()
                ));
            }
        }
    }
}

/// The first time SidecarSet `name`'s status satisfies `done`, watched; `None` if the watch
/// ends first.
pub fn watch_status(
    api: Api<SidecarSet>,
    name: &str,
    done: impl Fn(&SidecarSetStatus) -> bool + Send + 'static,
) -> tokio::task::JoinHandle<Option<(Instant, SidecarSetStatus)>> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    tokio::spawn(async move {
        let stream = watcher(api, config).default_backoff().applied_objects();
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            if let Ok(set) = event
                && let Some(status) = set.status
                && done(&status)
            {
                return Some((Instant::now(), status));
            }
        }
        None
    })
}

/// Waits for the rollout `stored` (the SidecarSet as the image change wrote it, which must be
/// at `generation`) until `follower` has seen every pod reach the target; an error says where
/// the SidecarSet's status stood.
pub async fn await_rollout(
    sets: &Api<SidecarSet>,
    stored: &SidecarSet,
    generation: i64,
    follower: Follower,
    stall: Duration,
) -> Result<Reached, String> {
    if stored.metadata.generation != Some(generation) {
        return Err(format!(
            "the SidecarSet is at generation {:?} after the image change, not {generation}",
            stored.metadata.generation
        ));
    }
    match follower.wait("rollout", stall).await {
        Ok(reached) => Ok(reached),
        Err(e) => {
            let status = sets
                .get(&stored.name_any())
                .await
                .ok()
                .and_then(|s| s.status);
            Err(format!(
                "{e}; SidecarSet status: {}",
                describe_status(status.as_ref())
            ))
        }
    }
}

pub fn describe_status(status: Option<&SidecarSetStatus>) -> String {
    match status {
        Some(s) => format!(
            "matched {} updated {} ready {} updatedReady {} (generation {:?}, revision {:?})",
            s.matched_pods,
            s.updated_pods,
            s.ready_pods,
            s.updated_ready_pods,
            s.observed_generation,
            s.latest_revision
        ),
        None => "no status".to_owned(),
    }
}

/// The apiserver's `apiserver_request_total` for pod PATCHes, by subresource (`pod` for the
/// object itself) and code.
pub async fn pod_patches(client: &Client) -> Result<BTreeMap<String, f64>, String> {
    apiserver_requests(client, "pods", "PATCH", |label| {
        let subresource = match label("subresource").as_str() {
            "" => "pod".to_owned(),
            other => other.to_owned(),
        };
        Some(format!("{subresource} {}", label("code")))
    })
    .await
}

/// What each counter of [`pod_patches`] grew by between `before` and `after`.
pub fn patches_between(
    after: &BTreeMap<String, f64>,
    before: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

/// "5000 pod 200, 12 status 200", or "none".
pub fn describe_patches(grown: &BTreeMap<String, f64>) -> String {
    if grown.is_empty() {
        return "none".to_owned();
    }
    grown
        .iter()
        .map(|(k, v)| format!("{v:.0} {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}
