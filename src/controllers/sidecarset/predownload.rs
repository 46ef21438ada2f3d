//! SidecarSet image pre-download: the new sidecar images are pulled on the nodes of the pods the
//! rollout will upgrade, in the order it will reach them, and each pod waits for its node's pull
//! before it is upgraded, so the in-place restart never waits on the registry. Upstream never
//! shipped this (kruise#1221; PR #1318 could not work: kruise.md §2.10.2).
//!
//! # When
//!
//! The *targets* are the pods of the rollout queue ([`next_batch`](super::rollout::next_batch)'s `queue`: upgradable in place,
//! within the update selector, not held back by the partition, in rollout order) whose sidecar
//! containers (native sidecars included) run another image than the SidecarSet's; for each such
//! container, the pod's node needs the new image. The decision ([`decide`]), in this order:
//! - the manager runs with `--sidecarset-predownload=false`: off, as upstream (which has no
//!   SidecarSet pre-download): no job, no pod waits, the annotations are not read (`knobs_when`);
//! - `updateStrategy.type: NotUpdate`: skipped, nothing will be upgraded;
//! - no target: nothing to pull (also once the rollout is done);
//! - every matched pod is upgraded in one batch (partition 0 and maxUnavailable ≥ matched pods,
//!   rounded as the rollout rounds them): skipped, pulling first would only slow the rollout;
//! - fewer than `apps.kruise.io/image-predownload-min-updated-ready-pods` pods updated and ready,
//!   and no job yet for this revision: waiting (the first pods are canaries);
//! - otherwise: pull. A paused rollout pulls too, to be ready when it resumes.
//!
//! # Jobs
//!
//! One ImagePullJob per changed container, listing the target nodes in rollout order
//! (`selector.names`; our ImagePullJob controller starts nodes in that order). When the SidecarSet
//! has `imagePullSecrets`, they exist in the pods' namespaces, so there is one job per container
//! and namespace, each node in the job of the namespace whose pod the rollout reaches first;
//! otherwise the jobs live in the manager's namespace. Jobs are named `<revision>-<container>`
//! (shortened with a hash past 63 characters), labelled with the SidecarSet's labels,
//! `kruise.io/sidecarset-name`, `controller-revision-hash` and
//! `apps.kruise.io/sidecarset-container`, owned by the SidecarSet, and never complete
//! (`completionPolicy: Never`) so that nodes appended later are pulled too: the controller deletes
//! them when nothing is left to pull or a newer revision supersedes them.
//!
//! # Waiting for the pull
//!
//! While the decision is to pull, a target pod is upgraded only once its node's NodeImage reports
//! every new image it needs `Succeeded` or `Failed` (a failed pull leaves the image to kubelet, as
//! without pre-download), or the node has no NodeImage (no daemon runs there), or the per-pull
//! timeout (`…-timeout-seconds`, default 300 s) has passed since the job's entry reached the
//! node, whatever the daemon reports (queued behind other pulls, still pulling): then the
//! kubelet pulls, as without pre-download (`wait_deadline`). A rollout never waits long on
//! one node.
//!
//! # Knobs
//!
//! Annotations on the SidecarSet, upstream's names: `apps.kruise.io/image-predownload-parallelism`
//! (a positive integer, default 1), `…-min-updated-ready-pods` (a non-negative integer or a
//! percent of the matched pods, rounded up; default 0), `…-timeout-seconds` (a positive integer,
//! default 300). A bad value gives a [`KnobWarning`] and the default (upstream silently used the
//! default, or passed a negative value on to a job the apiserver then refused).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kruise_rs_controller::pod_summary::PodSummary;
use kruise_rs_imagepull::lean_nodeimage::LeanNodeImage;

use super::rollout::{Batch, PodView, max_unavailable_count, partition_count};
use kruise_rs_api::common::{ImagePullPolicy, SandboxConfig};
use kruise_rs_api::image::ImageRef;
use kruise_rs_api::imagepulljob::{
    CompletionPolicy, CompletionPolicyType, ImagePullJob, ImagePullJobNodeSelector,
    ImagePullJobSpec, ImagePullJobTemplate, PullPolicy,
};
use kruise_rs_api::limits;
use kruise_rs_api::nodeimage::ImagePullPhase;
use kruise_rs_api::sidecarset::{SidecarSet, SidecarSetUpdateStrategyType};
use kruise_rs_api::well_known::{
    CONTROLLER_REVISION_HASH, IMAGE_PREDOWNLOAD_MIN_UPDATED_READY_PODS,
    IMAGE_PREDOWNLOAD_PARALLELISM, IMAGE_PREDOWNLOAD_TIMEOUT_SECONDS, SIDECARSET_CONTAINER_LABEL,
    SIDECARSET_NAME_LABEL,
};
use kruise_rs_sidecar::hash::is_native_sidecar;
use kruise_rs_sidecar::hot_upgrade::{is_hot_upgrade, is_twin_of};

/// Status condition: where the pre-download stands.
pub(crate) const IMAGE_PREDOWNLOAD: &str = "ImagePreDownload";

const DEFAULT_PARALLELISM: i32 = 1;
const DEFAULT_TIMEOUT_SECONDS: i32 = 300;
/// Upstream's workload pre-download tries each node twice at most.
const BACKOFF_LIMIT: i32 = 1;
/// Object names that are also label values must fit 63 characters.
const MAX_NAME: usize = 63;

/// The pre-download knobs of a SidecarSet, from its annotations and the manager's switch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Knobs {
    /// The manager's `--sidecarset-predownload`: `false` turns pre-download off everywhere.
    pub enabled: bool,
    pub parallelism: i32,
    /// `None`: no gate.
    pub min_updated_ready: Option<IntOrString>,
    pub timeout_seconds: i32,
}

/// An annotation whose value cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnobWarning {
    pub annotation: &'static str,
    pub value: String,
    /// What the value must be.
    pub expected: &'static str,
    /// The default used instead.
    pub default: String,
}

impl fmt::Display for KnobWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "annotation {}: {:?} is not {}; using the default {}",
            self.annotation, self.value, self.expected, self.default
        )
    }
}

fn positive(value: &str) -> Option<i32> {
    value.parse::<i32>().ok().filter(|n| *n > 0)
}

/// One knob: `parse`d from the annotation when present, else (with a warning) `default`.
fn knob<T: ToString>(
    annotations: &BTreeMap<String, String>,
    annotation: &'static str,
    expected: &'static str,
    default: T,
    parse: impl Fn(&str) -> Option<T>,
    warnings: &mut Vec<KnobWarning>,
) -> Option<T> {
    let value = annotations.get(annotation)?;
    let parsed = parse(value.trim());
    if parsed.is_none() {
        warnings.push(KnobWarning {
            annotation,
            value: value.clone(),
            expected,
            default: default.to_string(),
        });
    }
    parsed
}

/// A non-negative integer or a percent the rollout's own parser accepts.
fn count_or_percent(value: &str) -> Option<IntOrString> {
    match value.parse::<i32>() {
        Ok(n) if n >= 0 => Some(IntOrString::Int(n)),
        Ok(_) => None,
        Err(_) => Some(IntOrString::String(value.to_owned()))
            .filter(|p| max_unavailable_count(Some(p), 100).is_ok()),
    }
}

/// The knobs of `set`, and a warning for every annotation that could not be used.
pub fn knobs(set: &SidecarSet) -> (Knobs, Vec<KnobWarning>) {
    let empty = BTreeMap::new();
    let annotations = set.metadata.annotations.as_ref().unwrap_or(&empty);
    let mut warnings = Vec::new();
    let parallelism = knob(
        annotations,
        IMAGE_PREDOWNLOAD_PARALLELISM,
        "a positive integer",
        DEFAULT_PARALLELISM,
        positive,
        &mut warnings,
    );
    let timeout_seconds = knob(
        annotations,
        IMAGE_PREDOWNLOAD_TIMEOUT_SECONDS,
        "a positive integer (seconds) up to 86400",
        DEFAULT_TIMEOUT_SECONDS,
        // Beyond the ImagePullJob's bound the job would be refused.
        |v| positive(v).filter(|s| *s <= limits::MAX_TIMEOUT_SECONDS),
        &mut warnings,
    );
    let min_updated_ready = knob(
        annotations,
        IMAGE_PREDOWNLOAD_MIN_UPDATED_READY_PODS,
        "a non-negative integer or a percent such as \"20%\"",
        0,
        |v| {
            count_or_percent(v).map(|c| match c {
                IntOrString::Int(n) => n,
                // Percents are kept as written below; only validity matters here.
                IntOrString::String(_) => 0,
            })
        },
        &mut warnings,
    )
    .and_then(|_| {
        annotations
            .get(IMAGE_PREDOWNLOAD_MIN_UPDATED_READY_PODS)
            .and_then(|v| count_or_percent(v.trim()))
    });
    (
        Knobs {
            enabled: true,
            parallelism: parallelism.unwrap_or(DEFAULT_PARALLELISM),
            min_updated_ready,
            timeout_seconds: timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS),
        },
        warnings,
    )
}

/// The knobs of `set` when the manager's switch is `enabled`, as [`knobs`]; when it is off,
/// the annotations are not read (and never warned about): [`decide`] skips at once.
pub(crate) fn knobs_when(set: &SidecarSet, enabled: bool) -> (Knobs, Vec<KnobWarning>) {
    if enabled {
        return knobs(set);
    }
    let off = Knobs {
        enabled: false,
        parallelism: DEFAULT_PARALLELISM,
        min_updated_ready: None,
        timeout_seconds: DEFAULT_TIMEOUT_SECONDS,
    };
    (off, Vec::new())
}

/// Why pre-download does not run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Skip {
    /// Turned off for the whole manager (`--sidecarset-predownload=false`).
    Disabled,
    NotUpdate,
    /// Every pod is upgraded in one batch.
    OneBatch {
        matched: usize,
    },
}

/// One ImagePullJob to have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobPlan {
    pub namespace: String,
    pub name: String,
    pub container: String,
    pub image: String,
    /// Target nodes, in rollout order.
    pub nodes: Vec<String>,
    pub pull_secrets: Vec<String>,
}

/// What pre-download does for a SidecarSet now; see the module documentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    NothingToPull,
    Skipped(Skip),
    WaitingForUpdatedReadyPods { needed: usize, ready: usize },
    Pull(Vec<JobPlan>),
}

impl Decision {
    pub fn jobs(&self) -> &[JobPlan] {
        match self {
            Decision::Pull(jobs) => jobs,
            _ => &[],
        }
    }

    pub fn jobs_mut(&mut self) -> &mut [JobPlan] {
        match self {
            Decision::Pull(jobs) => jobs,
            _ => &mut [],
        }
    }
}

/// The `controller-revision-hash` part of the SidecarSet's latest revision name.
pub(crate) fn revision_hash(set: &SidecarSet) -> String {
    let name = set.metadata.name.as_deref().unwrap_or_default();
    let revision = latest_revision(set);
    revision
        .strip_prefix(name)
        .and_then(|r| r.strip_prefix('-'))
        .unwrap_or(revision)
        .to_owned()
}

fn latest_revision(set: &SidecarSet) -> &str {
    set.status
        .as_ref()
        .and_then(|s| s.latest_revision.as_deref())
        .unwrap_or_default()
}

/// `base`, or when longer than 63 characters, its start and a hash of the whole.
pub(crate) fn job_name(base: &str) -> String {
    if base.len() <= MAX_NAME {
        return base.to_owned();
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, base.as_bytes());
    let hash: String = digest.as_ref()[..5]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut keep = MAX_NAME - hash.len() - 1;
    while !base.is_char_boundary(keep) {
        keep -= 1;
    }
    let start = base[..keep].trim_end_matches(['-', '.']);
    format!("{start}-{hash}")
}

/// The images `pod` needs on its node: the SidecarSet's containers and native sidecars (init
/// containers with `restartPolicy: Always`) whose image the pod does not run in its spec yet,
/// as (container, image). A hot-upgrade sidecar needs it when neither twin has it (its empty
/// image is on the node already: a twin runs it); the job keeps the sidecar's own name.
fn missing_images<'a>(set: &'a SidecarSet, pod: &PodSummary) -> Vec<(&'a str, &'a str)> {
    let spec = pod.spec.as_ref();
    let containers = spec.map(|s| s.containers.as_slice()).unwrap_or_default();
    let init = spec
        .map(|s| s.init_containers.as_slice())
        .unwrap_or_default();
    let native = set
        .spec
        .init_containers
        .iter()
        .filter(|c| is_native_sidecar(c));
    set.spec
        .containers
        .iter()
        .map(|c| (c, containers))
        .chain(native.map(|c| (c, init)))
        .filter_map(|(sidecar, containers)| {
            let wanted = sidecar.container.image.as_deref()?;
            let name = sidecar.container.name.as_str();
            let mut current = containers.iter().filter(|c| {
                if is_hot_upgrade(sidecar) {
                    is_twin_of(&c.name, name)
                } else {
                    *c.name == *name
                }
            });
            let first = current.next()?;
            let has = std::iter::once(first)
                .chain(current)
                .any(|c| c.image.as_deref() == Some(wanted));
            (!has).then_some((name, wanted))
        })
        .collect()
}

fn node(pod: &PodSummary) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

/// Whether every matched pod is upgraded in the first batch.
fn one_batch(set: &SidecarSet, matched: usize) -> bool {
    let strategy = &set.spec.update_strategy;
    let partition = partition_count(strategy.partition.as_ref(), matched);
    let max = max_unavailable_count(strategy.max_unavailable.as_ref(), matched);
    matches!((partition, max), (Ok(0), Ok(max)) if max >= matched)
}

/// What pre-download does for `set` over its `owned` pods, given the ungated `batch` and how
/// many pods are updated and ready. `started`: jobs for the latest revision exist already.
pub fn decide(
    set: &SidecarSet,
    owned: &[Arc<PodSummary>],
    batch: &Batch,
    updated_ready: usize,
    knobs: &Knobs,
    manager_namespace: &str,
    started: bool,
) -> Decision {
    if !knobs.enabled {
        return Decision::Skipped(Skip::Disabled);
    }
    if set.spec.update_strategy.type_ == Some(SidecarSetUpdateStrategyType::NotUpdate) {
        // The rollout has no queue then; say "skipped" only where there would be work.
        let would_pull = owned
            .iter()
            .any(|p| node(p).is_some() && !missing_images(set, p).is_empty());
        return if would_pull {
            Decision::Skipped(Skip::NotUpdate)
        } else {
            Decision::NothingToPull
        };
    }
    let per_namespace = !set.spec.image_pull_secrets.is_empty();
    let revision = latest_revision(set);
    // (namespace, container) -> job; BTreeMap for a stable order of jobs.
    let mut jobs: BTreeMap<(String, String), JobPlan> = BTreeMap::new();
    let mut seen: HashSet<(&str, &str)> = HashSet::new();
    for &i in &batch.queue {
        let pod = &owned[i];
        let Some(node) = node(pod) else { continue };
        for (container, image) in missing_images(set, pod) {
            if !seen.insert((container, node)) {
                continue;
            }
            let namespace = if per_namespace {
                pod.metadata.namespace.clone().unwrap_or_default()
            } else {
                manager_namespace.to_owned()
            };
            let job = jobs
                .entry((namespace.clone(), container.to_owned()))
                .or_insert_with(|| JobPlan {
                    namespace,
                    name: job_name(&format!("{revision}-{container}")),
                    container: container.to_owned(),
                    image: image.to_owned(),
                    nodes: Vec::new(),
                    pull_secrets: if per_namespace {
                        set.spec
                            .image_pull_secrets
                            .iter()
                            .map(|s| s.name.clone())
                            .filter(|n| !n.is_empty())
                            .collect()
                    } else {
                        Vec::new()
                    },
                });
            job.nodes.push(node.to_owned());
        }
    }
    if jobs.is_empty() {
        return Decision::NothingToPull;
    }
    if one_batch(set, batch.matched) {
        return Decision::Skipped(Skip::OneBatch {
            matched: batch.matched,
        });
    }
    if !started && let Some(min) = &knobs.min_updated_ready {
        // The knob was checked by the same parser: an error cannot happen here.
        let needed = max_unavailable_count(Some(min), batch.matched).unwrap_or(0);
        if updated_ready < needed {
            return Decision::WaitingForUpdatedReadyPods {
                needed,
                ready: updated_ready,
            };
        }
    }
    Decision::Pull(jobs.into_values().collect())
}

/// Keeps the nodes a job already lists, in their order, and appends the new targets: nodes whose
/// pods were upgraded meanwhile stay (no job write, no NodeImage churn per upgraded pod).
pub(crate) fn keep_listed_nodes(plans: &mut [JobPlan], existing: &[Arc<ImagePullJob>]) {
    for plan in plans {
        let Some(job) = existing.iter().find(|j| {
            j.metadata.namespace.as_deref() == Some(plan.namespace.as_str())
                && j.metadata.name.as_deref() == Some(plan.name.as_str())
        }) else {
            continue;
        };
        let mut nodes: Vec<String> = job
            .spec
            .template
            .selector
            .as_ref()
            .map(|s| s.names.clone())
            .unwrap_or_default();
        let listed: HashSet<String> = nodes.iter().cloned().collect();
        nodes.extend(plan.nodes.drain(..).filter(|n| !listed.contains(n)));
        plan.nodes = nodes;
    }
}

/// Whether `node` has finished pulling `image`: its NodeImage reports the tag succeeded or
/// failed, or there is no NodeImage (no daemon to wait for).
pub(crate) fn pulled(nodeimage: Option<&LeanNodeImage>, image: &str) -> bool {
    let Some(nodeimage) = nodeimage else {
        return true;
    };
    let Ok(reference) = ImageRef::parse(image) else {
        // Not pullable by a daemon either: nothing to wait for.
        return true;
    };
    nodeimage
        .status
        .as_ref()
        .and_then(|s| s.image_statuses.get(reference.familiar_name()))
        .and_then(|i| i.tags.iter().find(|t| t.tag == reference.nodeimage_tag()))
        .is_some_and(|t| matches!(t.phase, ImagePullPhase::Succeeded | ImagePullPhase::Failed))
}

/// How long a pod waits for its node's pull at most: the SidecarSet's per-pull timeout
/// (`apps.kruise.io/image-predownload-timeout-seconds`, default 300 s). A pull that takes longer
/// would be cut by the daemon anyway; waiting longer only holds the rollout up.
pub(crate) fn max_wait(knobs: &Knobs) -> std::time::Duration {
    std::time::Duration::from_secs(u64::from(knobs.timeout_seconds.max(1).unsigned_abs()))
}

/// Until when a pod waits for `node`'s pull of `image`: `max_wait` after the job's entry for it
/// reached the node's NodeImage (its `createdAt`); `None` while it has not (the job has not
/// reached the node yet, which it does as the nodes before it finish or give up).
///
/// Without this bound a tag the daemon reports `Waiting` (queued behind other pulls, say
/// another tenant's slow ones holding both pull slots) held its pod until the tag's own
/// deadline, which pre-download jobs (completion `Never`) set to at least 30 minutes, plus the
/// NodeImage response timeout. After it the kubelet pulls, as without pre-download.
pub(crate) fn wait_deadline(
    nodeimage: &LeanNodeImage,
    image: &str,
    max_wait: std::time::Duration,
) -> Option<k8s_openapi::jiff::Timestamp> {
    let reference = ImageRef::parse(image).ok()?;
    let created = nodeimage
        .spec
        .images
        .get(reference.familiar_name())?
        .tags
        .iter()
        .find(|t| t.tag == reference.nodeimage_tag())?
        .created_at
        .as_ref()?;
    let wait = k8s_openapi::jiff::SignedDuration::try_from(max_wait).ok()?;
    created.0.checked_add(wait).ok()
}

/// What [`mark_awaiting`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Awaiting {
    /// Queued pods held back for their nodes' pulls.
    pub pods: usize,
    /// When the first of them stops waiting, whatever its node reports by then.
    pub wake: Option<k8s_openapi::jiff::Timestamp>,
}

/// Marks the queued pods whose node has not finished pulling their new images, each for at
/// most `max_wait` after its node's entry was written ([`wait_deadline`]).
pub(crate) fn mark_awaiting(
    set: &SidecarSet,
    owned: &[Arc<PodSummary>],
    views: &mut [PodView],
    batch: &Batch,
    nodeimage: &dyn Fn(&str) -> Option<Arc<LeanNodeImage>>,
    now: &Time,
    max_wait: std::time::Duration,
) -> Awaiting {
    let mut awaiting = Awaiting::default();
    for &i in &batch.queue {
        let Some(node) = node(&owned[i]) else {
            continue;
        };
        let images = missing_images(set, &owned[i]);
        if images.is_empty() {
            continue;
        }
        let nodeimage = nodeimage(node);
        let nodeimage = nodeimage.as_deref();
        let mut waits = false;
        let mut until: Option<k8s_openapi::jiff::Timestamp> = None;
        for (_, image) in &images {
            if pulled(nodeimage, image) {
                continue;
            }
            match nodeimage.and_then(|n| wait_deadline(n, image, max_wait)) {
                // Waited long enough: the kubelet pulls this one.
                Some(deadline) if deadline <= now.0 => {}
                Some(deadline) => {
                    waits = true;
                    until = Some(until.map_or(deadline, |u| u.max(deadline)));
                }
                None => waits = true,
            }
        }
        if waits {
            views[i].awaiting_images = true;
            awaiting.pods += 1;
            if let Some(until) = until {
                awaiting.wake = Some(awaiting.wake.map_or(until, |w| w.min(until)));
            }
        }
    }
    awaiting
}

/// The ImagePullJob for `plan`.
pub(crate) fn job(set: &SidecarSet, plan: &JobPlan, knobs: &Knobs) -> ImagePullJob {
    let set_name = set.metadata.name.clone().unwrap_or_default();
    let hash = revision_hash(set);
    let mut labels = set.metadata.labels.clone().unwrap_or_default();
    labels.insert(SIDECARSET_NAME_LABEL.to_owned(), set_name.clone());
    labels.insert(CONTROLLER_REVISION_HASH.to_owned(), hash.clone());
    labels.insert(
        SIDECARSET_CONTAINER_LABEL.to_owned(),
        plan.container.clone(),
    );
    let owner = OwnerReference {
        api_version: "apps.kruise.io/v1beta1".to_owned(),
        kind: "SidecarSet".to_owned(),
        name: set_name.clone(),
        uid: set.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    ImagePullJob {
        metadata: ObjectMeta {
            name: Some(plan.name.clone()),
            namespace: Some(plan.namespace.clone()),
            labels: Some(labels),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: job_spec(plan, knobs, &set_name, &hash),
        status: None,
    }
}

fn job_spec(plan: &JobPlan, knobs: &Knobs, set_name: &str, hash: &str) -> ImagePullJobSpec {
    ImagePullJobSpec {
        image: plan.image.clone(),
        template: ImagePullJobTemplate {
            pull_secrets: plan.pull_secrets.clone(),
            selector: Some(ImagePullJobNodeSelector {
                names: plan.nodes.clone(),
                ..Default::default()
            }),
            pod_selector: None,
            parallelism: Some(IntOrString::Int(knobs.parallelism)),
            pull_policy: Some(PullPolicy {
                timeout_seconds: Some(knobs.timeout_seconds),
                backoff_limit: Some(BACKOFF_LIMIT),
            }),
            completion_policy: CompletionPolicy {
                type_: Some(CompletionPolicyType::Never),
                active_deadline_seconds: None,
                ttl_seconds_after_finished: None,
            },
            sandbox_config: Some(SandboxConfig {
                labels: BTreeMap::from([
                    (SIDECARSET_NAME_LABEL.to_owned(), set_name.to_owned()),
                    (CONTROLLER_REVISION_HASH.to_owned(), hash.to_owned()),
                ]),
                annotations: BTreeMap::new(),
            }),
            image_pull_policy: Some(ImagePullPolicy::IfNotPresent),
        },
    }
}

/// What an existing job must change to match `wanted` (the fields the controller owns), as a
/// merge patch of its spec; `None` when nothing.
pub(crate) fn job_update(
    existing: &ImagePullJob,
    wanted: &ImagePullJob,
) -> Option<serde_json::Value> {
    let (have, want) = (&existing.spec, &wanted.spec);
    let mut spec = serde_json::Map::new();
    let names = |s: &ImagePullJobSpec| s.template.selector.as_ref().map(|s| s.names.clone());
    if names(have) != names(want) {
        spec.insert("selector".into(), serde_json::json!({"names": names(want)}));
    }
    if have.template.parallelism != want.template.parallelism {
        spec.insert(
            "parallelism".into(),
            serde_json::json!(want.template.parallelism),
        );
    }
    let timeout = |s: &ImagePullJobSpec| {
        s.template
            .pull_policy
            .as_ref()
            .and_then(|p| p.timeout_seconds)
    };
    if timeout(have) != timeout(want) {
        spec.insert(
            "pullPolicy".into(),
            serde_json::json!({"timeoutSeconds": timeout(want)}),
        );
    }
    if have.template.pull_secrets != want.template.pull_secrets {
        spec.insert(
            "pullSecrets".into(),
            serde_json::json!(want.template.pull_secrets),
        );
    }
    (!spec.is_empty()).then(|| serde_json::json!({ "spec": spec }))
}

/// Progress of the jobs, for the condition: target nodes, and how many finished each way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Progress {
    pub nodes: usize,
    pub succeeded: usize,
    pub failed: usize,
}

impl Progress {
    /// Sums the status of `jobs` (the existing ones the decision wants).
    pub(crate) fn of<'a>(
        plans: &[JobPlan],
        jobs: impl IntoIterator<Item = &'a ImagePullJob>,
    ) -> Self {
        let mut progress = Progress {
            nodes: plans.iter().map(|p| p.nodes.len()).sum(),
            ..Default::default()
        };
        for job in jobs {
            if let Some(status) = &job.status {
                progress.succeeded += usize::try_from(status.succeeded).unwrap_or(0);
                progress.failed += usize::try_from(status.failed).unwrap_or(0);
            }
        }
        progress
    }
}

fn images(plans: &[JobPlan]) -> String {
    let set: BTreeSet<&str> = plans.iter().map(|p| p.image.as_str()).collect();
    set.into_iter().collect::<Vec<_>>().join(", ")
}

/// The `ImagePreDownload` condition for `decision`; keeps the transition time of `previous`
/// when its status is unchanged.
pub(crate) fn condition(
    decision: &Decision,
    progress: Progress,
    previous: Option<&Condition>,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let (status, reason, message) = match decision {
        Decision::Pull(plans) => {
            let done = progress.succeeded + progress.failed;
            let summary = format!(
                "{} on {} node(s): {} succeeded, {} failed",
                images(plans),
                progress.nodes,
                progress.succeeded,
                progress.failed
            );
            if done >= progress.nodes {
                ("True", "Pulled", format!("pulled {summary}"))
            } else {
                ("True", "Pulling", format!("pulling {summary}"))
            }
        }
        Decision::WaitingForUpdatedReadyPods { needed, ready } => (
            "False",
            "WaitingForUpdatedReadyPods",
            format!(
                "starts once {needed} pod(s) are updated and ready ({IMAGE_PREDOWNLOAD_MIN_UPDATED_READY_PODS}); {ready} are"
            ),
        ),
        Decision::Skipped(Skip::Disabled) => (
            "False",
            "Disabled",
            "skipped: pre-download is turned off for this manager (--sidecarset-predownload=false)"
                .to_owned(),
        ),
        Decision::Skipped(Skip::NotUpdate) => (
            "False",
            "NotUpdateStrategy",
            "skipped: updateStrategy.type is NotUpdate, running pods are never upgraded".to_owned(),
        ),
        Decision::Skipped(Skip::OneBatch { matched }) => (
            "False",
            "OneBatch",
            format!(
                "skipped: all {matched} pod(s) are upgraded in one batch (partition 0, maxUnavailable covers them all)"
            ),
        ),
        Decision::NothingToPull => (
            "False",
            "NothingToPull",
            "no pod the rollout will upgrade needs a new sidecar image".to_owned(),
        ),
    };
    let since = previous
        .filter(|c| c.status == status)
        .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
    Condition {
        type_: IMAGE_PREDOWNLOAD.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message,
        observed_generation: generation,
        last_transition_time: since,
    }
}

#[cfg(test)]
mod tests;
