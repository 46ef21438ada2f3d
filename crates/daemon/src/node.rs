//! The daemon's work for its node: the newest NodeImage, one worker per tag, and the state each
//! worker reports.
//!
//! The NodeImage watch (field selector on the node's name) replaces [`State::latest`] and runs
//! the pure [`plan`](super::plan::plan) against the workers; each worker waits for a pull slot
//! (the node-wide cap, given back during its pauses), pulls, and records its state; every
//! change wakes the status reporter ([`super::report`]). A worker is stopped by aborting its
//! task, which drops the CRI call in flight; its generation number keeps a worker that was
//! stopped mid-step from writing into the entry of its successor.

use std::collections::{BTreeMap, BTreeSet};
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kruise_rs_kube::events::Recorder;
use kube::runtime::events::{Event, EventType};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::{Notify, watch};
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tracing::{debug, info, instrument, warn};

use super::auth::Keyring;
use super::credential_provider::CredentialProviders;
use super::cri::Cri;
use super::image_fs::ImageFsGuard;
use super::metrics::DaemonMetrics;
use super::pin::{Pins, unpin_unwanted};
use super::plan::{PullTask, Running, TagKey, plan};
use super::progress;
use super::pull::{self, PullInput};
use super::secret_scope::serves;
use super::slots::FairSlots;
use kruise_rs_api::image::{ImageRef, joined_ref};
use kruise_rs_api::nodeimage::{ImagePullPhase, ImageTagStatus, NodeImage, ReferenceObject};

/// Longest event note the apiserver accepts (events.k8s.io/v1 allows 1 kB).
const NOTE_MAX_BYTES: usize = 1000;

/// What the watch, the workers and the reporter share.
pub(super) struct Shared {
    pub node: String,
    pub client: Client,
    pub nodeimages: Api<NodeImage>,
    pub cri: Cri,
    /// The kubelet credential provider plugins (none when not configured).
    pub providers: CredentialProviders,
    /// The node-wide cap on pulls in flight, shared fairly between tenants.
    pub slots: FairSlots,
    /// How full the image filesystem may be for a pull to go ahead.
    pub image_fs: ImageFsGuard,
    /// The images the daemon pinned (`pin`).
    pub pins: Pins,
    pub state: Mutex<State>,
    /// Wakes the reporter: something it reports may have changed.
    pub dirty: Notify,
    pub recorder: Recorder,
    pub metrics: DaemonMetrics,
    /// True while the kubelet starts a pod on the node (`kubelet_activity`).
    pub kubelet_busy: watch::Receiver<bool>,
}

#[derive(Default)]
pub(super) struct State {
    /// The newest NodeImage seen (from the watch or a write's response); `None` while it does
    /// not exist.
    pub latest: Option<Arc<NodeImage>>,
    next_generation: u64,
    workers: BTreeMap<TagKey, Worker>,
}

struct Worker {
    generation: u64,
    status: ImageTagStatus,
    abort: Option<AbortHandle>,
}

impl State {
    /// What every worker reports now.
    pub(crate) fn worker_statuses(&self) -> BTreeMap<TagKey, ImageTagStatus> {
        self.workers
            .iter()
            .map(|(key, w)| (key.clone(), w.status.clone()))
            .collect()
    }

    fn stop(&mut self, key: &TagKey) {
        if let Some(worker) = self.workers.remove(key)
            && let Some(abort) = worker.abort
        {
            abort.abort();
        }
    }
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A worker that panicked while holding the lock left consistent data (every update is
        // a single assignment), so the poison is ignored.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes `object` as the newest NodeImage unless what is held is newer; `force` takes it
    /// anyway (a fresh GET after a conflict). Returns whether it was taken.
    pub(crate) fn set_latest(&self, object: NodeImage, force: bool) -> bool {
        let object = strip(object);
        let mut state = self.lock();
        let newer = state.latest.as_ref().is_none_or(|held| {
            is_newer(
                object.resource_version().as_deref(),
                held.resource_version().as_deref(),
            )
        });
        if force || newer {
            state.latest = Some(Arc::new(object));
        }
        force || newer
    }

    /// Plans against the newest NodeImage and starts and stops workers accordingly.
    pub(crate) fn sync(self: &Arc<Self>) {
        let mut state = self.lock();
        let Some(latest) = state.latest.clone() else {
            let keys: Vec<TagKey> = state.workers.keys().cloned().collect();
            if !keys.is_empty() {
                info!(node = %self.node, workers = keys.len(), "NodeImage is gone; stopping its workers");
            }
            for key in &keys {
                state.stop(key);
            }
            drop(state);
            self.dirty.notify_one();
            return;
        };
        let running: BTreeMap<TagKey, Running> = state
            .workers
            .iter()
            .map(|(key, w)| {
                let version = w.status.version.unwrap_or(0);
                (key.clone(), Running { version })
            })
            .collect();
        let decided = plan(&latest.spec, latest.status.as_ref(), &running);
        let wanted = pull_refs(&latest);
        if self.pins.wanted_changed(&wanted) {
            tokio::spawn(unpin_unwanted_of(self.clone(), wanted));
        }
        for key in &decided.stop {
            debug!(image = %key.image, tag = %key.tag, "stopping worker");
            state.stop(key);
        }
        let nodeimage = latest.object_ref(&());
        for task in decided.start {
            state.next_generation += 1;
            let generation = state.next_generation;
            let key = task.key.clone();
            debug!(image = %key.image, tag = %key.tag, version = task.version, "starting worker");
            let status = ImageTagStatus {
                version: Some(task.version),
                ..ImageTagStatus::new(&key.tag, ImagePullPhase::Waiting)
            };
            let handle = tokio::spawn(work(self.clone(), task, generation, nodeimage.clone()));
            state.workers.insert(
                key,
                Worker {
                    generation,
                    status,
                    abort: Some(handle.abort_handle()),
                },
            );
        }
        drop(state);
        self.dirty.notify_one();
    }

    /// Stops every worker (shutdown); what they reported stays in the status.
    pub(crate) fn stop_all(&self) {
        let mut state = self.lock();
        let keys: Vec<TagKey> = state.workers.keys().cloned().collect();
        for key in &keys {
            state.stop(key);
        }
    }

    /// Applies `change` to the worker's status if it is still the current one for its tag.
    fn update(
        &self,
        key: &TagKey,
        generation: u64,
        change: impl FnOnce(&mut ImageTagStatus),
    ) -> bool {
        let mut state = self.lock();
        let Some(worker) = state
            .workers
            .get_mut(key)
            .filter(|w| w.generation == generation)
        else {
            return false;
        };
        change(&mut worker.status);
        drop(state);
        self.dirty.notify_one();
        true
    }
}

/// Watches the node's own NodeImage until the stream ends; `synced` turns true once the first
/// list has been seen.
pub(super) async fn watch_nodeimage(shared: Arc<Shared>, synced: watch::Sender<bool>) {
    let config = watcher::Config::default().fields(&format!("metadata.name={}", shared.node));
    let mut events = pin!(watcher(shared.nodeimages.clone(), config).default_backoff());
    let mut listed: Option<NodeImage> = None;
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => listed = None,
            Ok(watcher::Event::InitApply(object)) => listed = Some(object),
            Ok(watcher::Event::InitDone) => {
                match listed.take() {
                    Some(object) => {
                        shared.set_latest(object, true);
                    }
                    None => {
                        info!(node = %shared.node, "no NodeImage for this node yet; waiting for the manager to create it");
                        shared.lock().latest = None;
                    }
                }
                shared.sync();
                synced.send_replace(true);
            }
            Ok(watcher::Event::Apply(object)) => {
                if shared.set_latest(object, false) {
                    shared.sync();
                }
            }
            Ok(watcher::Event::Delete(_)) => {
                shared.lock().latest = None;
                shared.sync();
            }
            Err(err) => {
                warn!(node = %shared.node, error = %err, "NodeImage watch failed; retrying")
            }
        }
    }
}

/// Decrements the active-worker gauge however the worker ends (an abort included).
struct ActiveWorker(DaemonMetrics);

impl Drop for ActiveWorker {
    fn drop(&mut self) {
        self.0.active_workers.dec();
    }
}

/// One tag's worker: wait for a slot, pull, record the outcome, tell the owners. Its lines
/// carry the tag (span `pull`), so one image's story can be picked out of the daemon's log.
#[instrument(name = "pull", skip_all, fields(image = %task.key.image, tag = %task.key.tag, version = task.version))]
async fn work(shared: Arc<Shared>, task: PullTask, generation: u64, nodeimage: ObjectReference) {
    shared.metrics.active_workers.inc();
    let _active = ActiveWorker(shared.metrics.clone());
    let Some(mut slot) = pull::Slot::acquire(&shared.slots, share(&task)).await else {
        return;
    };
    let now = now_time();
    let started_at = task.started_at.clone().unwrap_or_else(|| now.clone());
    let elapsed = now
        .0
        .duration_since(started_at.0)
        .try_into()
        .unwrap_or(Duration::ZERO);
    let start = started_at.clone();
    if !shared.update(&task.key, generation, |s| {
        s.phase = ImagePullPhase::Pulling;
        s.start_time = Some(start);
    }) {
        return;
    }
    let began = Instant::now();
    let pulling = pull_task(&shared, &mut slot, &task, elapsed);
    let result = match ImageRef::from_nodeimage(&task.key.image, &task.key.tag) {
        Ok(image) => {
            // The tag's progress rises as containerd downloads, until the pull returns.
            let watch = progress::PullWatch::new(
                shared.cri.containerd_api(),
                &image,
                std::time::SystemTime::now(),
            );
            let follow = progress::follow(watch, |percent| {
                shared.update(&task.key, generation, |s| s.progress = Some(percent));
            });
            tokio::pin!(pulling, follow);
            tokio::select! {
                result = &mut pulling => result,
                () = &mut follow => pulling.await,
            }
        }
        Err(_) => pulling.await,
    };
    drop(slot);
    let seconds = began.elapsed().as_secs_f64();
    let finished = shared.update(&task.key, generation, |s| {
        s.completion_time = Some(now_time());
        match &result {
            Ok(image_id) => {
                s.phase = ImagePullPhase::Succeeded;
                s.progress = Some(100);
                s.image_id = Some(image_id.as_str().into());
                s.message = None;
            }
            Err(message) => {
                s.phase = ImagePullPhase::Failed;
                s.message = Some(message.clone());
            }
        }
    });
    if !finished {
        return;
    }
    shared.metrics.pull_finished(result.is_ok(), seconds);
    let image = joined_ref(&task.key.image, &task.key.tag);
    match result {
        Ok(image_id) => {
            info!(%image, %image_id, seconds, "image pulled");
            pin_pulled(&shared, &task).await;
            let note = format!("Image {image}, elapsed time {seconds:.1}s");
            publish(
                &shared,
                EventType::Normal,
                "PullImageSucceed",
                note,
                &nodeimage,
                task.owners.first().cloned(),
            )
            .await;
        }
        Err(message) => {
            warn!(%image, %message, "image pull failed");
            let note = format!("Image {image} failed on node {}: {message}", shared.node);
            for owner in &task.owners {
                publish(
                    &shared,
                    EventType::Warning,
                    "PullImageFailed",
                    note.clone(),
                    owner,
                    Some(nodeimage.clone()),
                )
                .await;
            }
            let related = task.owners.first().cloned();
            publish(
                &shared,
                EventType::Warning,
                "PullImageFailed",
                note,
                &nodeimage,
                related,
            )
            .await;
        }
    }
}

/// The CRI references the NodeImage's spec asks for: what stays pinned.
fn pull_refs(nodeimage: &NodeImage) -> BTreeSet<String> {
    nodeimage
        .spec
        .images
        .iter()
        .flat_map(|(name, image)| {
            image
                .tags
                .iter()
                .filter_map(move |t| ImageRef::from_nodeimage(name, &t.tag).ok())
        })
        .map(|r| r.to_pull_ref())
        .collect()
}

/// Pins the image `task` pulled, so that the kubelet's image GC keeps it until it is used.
async fn pin_pulled(shared: &Shared, task: &PullTask) {
    let Ok(reference) = ImageRef::from_nodeimage(&task.key.image, &task.key.tag) else {
        return;
    };
    let name = reference.to_pull_ref();
    let images = shared.cri.containerd_images();
    let pinned = shared
        .pins
        .one_at_a_time(images.set_pinned(&name, true))
        .await;
    match pinned {
        Ok(()) => debug!(image = %name, "pinned"),
        Err(err) => shared.pins.failed("pin", &name, &err),
    }
}

/// Unpins the images the daemon pinned that `wanted` (the spec's references) no longer names.
async fn unpin_unwanted_of(shared: Arc<Shared>, wanted: BTreeSet<String>) {
    let images = shared.cri.containerd_images();
    let result = shared
        .pins
        .one_at_a_time(unpin_unwanted(&images, &wanted))
        .await;
    if let Err(err) = result {
        shared.pins.failed("unpin", "", &err);
        shared.pins.forget();
    }
}

async fn pull_task(
    shared: &Shared,
    slot: &mut pull::Slot<'_>,
    task: &PullTask,
    elapsed: Duration,
) -> Result<String, String> {
    let reference = ImageRef::from_nodeimage(&task.key.image, &task.key.tag)
        .map_err(|err| format!("cannot pull: {err}"))?;
    // The pull secrets' credentials first, then the plugins', each source's own order kept and
    // a credential repeated by a later source left out; anonymous only when none matched.
    let (keyring, mut problems) =
        load_keyring(&shared.client, &task.pull_secrets, &task.owners).await;
    let mut credentials = keyring.lookup(&reference);
    let (plugin_keyring, plugin_problems) = shared.providers.credentials(&reference).await;
    problems.extend(plugin_problems);
    for credential in plugin_keyring.lookup(&reference) {
        if !credentials.iter().any(|c| c.same_material(credential)) {
            credentials.push(credential);
        }
    }
    let image = reference.to_pull_ref();
    let input = PullInput {
        image: &image,
        name: reference.name(),
        credentials: &credentials,
        credential_problems: &problems,
        elapsed,
        image_fs: &shared.image_fs,
        kubelet_busy: Some(&shared.kubelet_busy),
    };
    pull::pull(&shared.cri, slot, task, &input).await
}

/// Whose turn a tag waits for a pull slot in: the namespace of its first owner job, a tenant
/// (`""` for a tag nobody owns).
fn share(task: &PullTask) -> &str {
    task.owners
        .first()
        .and_then(|o| o.namespace.as_deref())
        .unwrap_or_default()
}

/// The credentials of the pull secrets that serve the tag's `owners` ([`serves`]), and why any
/// of them gave none. A Secret that serves other jobs only is left out without a word (it is
/// theirs); so is one that is gone: its jobs released it, and a job whose own Secret is missing
/// already says so in its status.
async fn load_keyring(
    client: &Client,
    secrets: &[ReferenceObject],
    owners: &[ObjectReference],
) -> (Keyring, Vec<String>) {
    let mut keyring = Keyring::default();
    let mut problems = Vec::new();
    for reference in secrets {
        let (Some(namespace), Some(name)) = (&reference.namespace, &reference.name) else {
            problems.push(format!(
                "a pull secret lacks its namespace or name (namespace {:?}, name {:?})",
                reference.namespace.as_deref().unwrap_or(""),
                reference.name.as_deref().unwrap_or("")
            ));
            continue;
        };
        let source = format!("{namespace}/{name}");
        match Api::<Secret>::namespaced(client.clone(), namespace)
            .get(name)
            .await
        {
            Ok(secret) if !serves(namespace, secret.annotations(), owners.iter()) => {
                debug!(secret = %source, "pull secret serves none of the tag's jobs; not used");
            }
            Ok(secret) => {
                let data: BTreeMap<String, Vec<u8>> = secret
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(key, value)| (key, value.0))
                    .collect();
                let secret_type = secret.type_.unwrap_or_default();
                if let Err(err) = keyring.add_secret(&source, &secret_type, &data) {
                    problems.push(err.to_string());
                }
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {
                debug!(secret = %source, "pull secret is gone; not used");
            }
            Err(err) => problems.push(format!("pull secret {source} cannot be read: {err}")),
        }
    }
    (keyring, problems)
}

async fn publish(
    shared: &Shared,
    type_: EventType,
    reason: &str,
    note: String,
    regarding: &ObjectReference,
    related: Option<ObjectReference>,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(truncate(note, NOTE_MAX_BYTES)),
        action: "PullImage".into(),
        secondary: related,
    };
    if let Err(err) = shared.recorder.publish(&event, regarding).await {
        warn!(node = %shared.node, regarding = ?regarding.name, error = %err, "cannot publish event");
    }
}

fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut cut = max.saturating_sub(3);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("...");
    }
    text
}

/// Now, to the second: what the apiserver stores, so a status read back equals the one written.
pub(super) fn now_time() -> Time {
    let now = Timestamp::now();
    Time(Timestamp::from_second(now.as_second()).unwrap_or(now))
}

/// Whether `candidate` is a later resourceVersion than `held`. They are opaque strings, but
/// every apiserver backed by etcd writes integers; anything else counts as newer.
fn is_newer(candidate: Option<&str>, held: Option<&str>) -> bool {
    match (
        candidate.and_then(|c| c.parse::<u64>().ok()),
        held.and_then(|h| h.parse::<u64>().ok()),
    ) {
        (Some(candidate), Some(held)) => candidate > held,
        _ => true,
    }
}

fn strip(mut object: NodeImage) -> NodeImage {
    object.metadata.managed_fields = None;
    object
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_versions_compare_as_numbers_when_they_are_numbers() {
        assert!(is_newer(Some("10"), Some("9")));
        assert!(!is_newer(Some("9"), Some("10")));
        assert!(!is_newer(Some("9"), Some("9")));
        assert!(is_newer(Some("abc"), Some("9")));
        assert!(is_newer(None, Some("9")));
    }

    #[test]
    fn times_are_whole_seconds() {
        let t = now_time();
        assert_eq!(t.0.subsec_nanosecond(), 0);
    }

    #[test]
    fn notes_are_cut_on_a_char_boundary() {
        let long = "é".repeat(600);
        let cut = truncate(long, NOTE_MAX_BYTES);
        assert!(cut.len() <= NOTE_MAX_BYTES);
        assert!(cut.ends_with("..."));
        assert_eq!(truncate("short".into(), 10), "short");
    }
}
