//! The NodeImage controller's decisions, as pure functions of plain values and `now`.
//!
//! * `lifecycle`: whether a Node's NodeImage should be created (now or later), kept (with
//!   which labels) or deleted.
//! * `collect`: garbage collection of `spec.images` (gone owner jobs, expired TTLs, empty
//!   images).
//! * `timeouts`: tags the node never answered, or answered but never finished, marked Failed
//!   in `status`, with the counts recomputed.
//! * `next_wake` / `requeue_after`: the next instant any of the above changes its mind.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;

use crate::lean_nodeimage::LeanNodeImage;
use crate::node_summary::NodeSummary;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::compact_nodeimage::{
    ImagePullPhase, ImageSpec, ImageStatuses, ImageTagSpec, ImageTagStatus, Images, NodeImageSpec,
    NodeImageStatus, SharedOwner,
};
pub use crate::tag_values::is_image_pull_job;
use crate::tag_values::{OwnerAsk, in_flight, refresh_image};
use kruise_rs_api::image::joined_ref;
use kruise_rs_api::well_known::{FAKE_NODEIMAGE, VIRTUAL_KUBELET_TYPE};

/// Never requeue sooner than this after a reconcile, even when an instant is closer (or past).
pub(crate) const MIN_REQUEUE: Duration = Duration::from_secs(1);
/// Requeue at least this often: a safety net for missed events, not a timer anything relies on.
pub(crate) const MAX_REQUEUE: Duration = Duration::from_secs(3600);

/// The message of a tag its node deadline passed for.
pub(crate) const DEADLINE_EXCEEDED: &str = "pulling exceeds the activeDeadlineSeconds";

/// The Node label whose value [`VIRTUAL_KUBELET_TYPE`] makes the controller ignore the Node.
const NODE_TYPE_LABEL: &str = "type";

// --- time ---------------------------------------------------------------------------------------

fn plus(t: Timestamp, d: Duration) -> Timestamp {
    t.saturating_add(d).unwrap_or(Timestamp::MAX)
}

fn plus_secs(t: Timestamp, secs: i64) -> Timestamp {
    t.saturating_add(SignedDuration::from_secs(secs))
        .unwrap_or(Timestamp::MAX)
}

fn earliest(a: Option<Timestamp>, b: Option<Timestamp>) -> Option<Timestamp> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// How long to wait before reconciling again for `wake`: at least [`MIN_REQUEUE`], at most
/// [`MAX_REQUEUE`] (also when nothing is pending).
pub(crate) fn requeue_after(wake: Option<Timestamp>, now: Timestamp) -> Duration {
    let Some(wake) = wake else {
        return MAX_REQUEUE;
    };
    let wait = Duration::try_from(now.duration_until(wake)).unwrap_or(Duration::ZERO);
    wait.clamp(MIN_REQUEUE, MAX_REQUEUE)
}

/// A duration the way Go prints one (`3s`, `10m0s`, `1h0m0s`, `1.5s`, `500ms`), as upstream's
/// messages and users' alerts expect.
pub(crate) fn go_duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        return match d.as_millis() {
            0 => "0s".to_owned(),
            ms => format!("{ms}ms"),
        };
    }
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, secs % 3600 / 60, secs % 60);
    let seconds = match d.subsec_millis() {
        0 => format!("{s}s"),
        ms => format!("{s}.{}s", format!("{ms:03}").trim_end_matches('0')),
    };
    if h > 0 {
        format!("{h}h{m}m{seconds}")
    } else if m > 0 {
        format!("{m}m{seconds}")
    } else {
        seconds
    }
}

/// The message of a tag its node did not answer within `timeout`.
pub fn not_responded(timeout: Duration) -> String {
    format!("node has not responded for {}", go_duration(timeout))
}

// --- lifecycle ----------------------------------------------------------------------------------

/// What should happen to the NodeImage of one node name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Lifecycle {
    /// None exists and none is wanted yet: no Node, a Node not Ready, being deleted, or of
    /// `type: virtual-kubelet`.
    Absent,
    /// Create it at this instant: the Node has not been Ready for the creation delay yet.
    CreateAt(Timestamp),
    /// Create it now, with these labels (the Node's) and an empty spec.
    Create(BTreeMap<String, String>),
    /// It stays. `labels` is `Some(node labels)` when its own labels differ from them.
    Keep {
        labels: Option<BTreeMap<String, String>>,
    },
    /// Its Node is gone or being deleted: delete it.
    Delete,
    /// It is being deleted already.
    Deleting,
}

/// Whether a Node's Ready condition is True, and since when (`Some(None)`: True, but with no
/// transition time, which counts as "long ago", as upstream's zero time does).
pub(crate) fn ready_since(node: &NodeSummary) -> Option<Option<Timestamp>> {
    let ready = node
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?;
    (ready.status == "True").then(|| ready.last_transition_time.as_ref().map(|t| t.0))
}

/// Whether the controller ignores this Node (`type: virtual-kubelet`).
pub(crate) fn is_virtual_kubelet(node: &NodeSummary) -> bool {
    node.labels.get(NODE_TYPE_LABEL) == Some(VIRTUAL_KUBELET_TYPE)
}

/// Whether a NodeImage may live without a Node: labelled `apps.kruise.io/fake-nodeimage`, with
/// any value (upstream checks only the key's presence).
pub(crate) fn is_fake(nodeimage: &LeanNodeImage) -> bool {
    nodeimage.labels().get(FAKE_NODEIMAGE).is_some()
}

/// The lifecycle decision for one name, from its Node and NodeImage (either may be absent).
pub(crate) fn lifecycle(
    node: Option<&NodeSummary>,
    nodeimage: Option<&LeanNodeImage>,
    creation_delay: Duration,
    now: Timestamp,
) -> Lifecycle {
    let node = node.filter(|n| n.metadata.deletion_timestamp.is_none());
    let node_labels = || node.map(|n| n.labels.to_map()).unwrap_or_default();
    match (node, nodeimage) {
        (_, Some(ni)) if ni.metadata.deletion_timestamp.is_some() => Lifecycle::Deleting,
        (None, Some(ni)) if is_fake(ni) => Lifecycle::Keep { labels: None },
        (None, Some(_)) => Lifecycle::Delete,
        (Some(node), Some(ni)) => {
            let same = ni.labels() == &node.labels;
            Lifecycle::Keep {
                labels: (!same).then(node_labels),
            }
        }
        (None, None) => Lifecycle::Absent,
        (Some(node), None) if is_virtual_kubelet(node) => Lifecycle::Absent,
        (Some(node), None) => match ready_since(node) {
            None => Lifecycle::Absent,
            Some(since) => {
                let at = since.map_or(now, |t| plus(t, creation_delay));
                if now >= at {
                    Lifecycle::Create(node_labels())
                } else {
                    Lifecycle::CreateAt(at)
                }
            }
        },
    }
}

// --- spec garbage collection --------------------------------------------------------------------

/// The ImagePullJob owner references of a spec, each once (by uid), for liveness checks.
pub(crate) fn job_owners(spec: &NodeImageSpec) -> Vec<&ObjectReference> {
    let mut seen = BTreeSet::new();
    spec.images
        .values()
        .flat_map(|image| &image.tags)
        .flat_map(|tag| &tag.owner_references)
        .filter(|r| is_image_pull_job(r))
        .filter(|r| r.uid.as_deref().is_some_and(|uid| seen.insert(uid)))
        .map(|r| &**r)
        .collect()
}

/// The status entry of `tag` at spec version `version` (absent versions count as 0, as in Go).
fn tag_status<'a>(
    status: &'a NodeImageStatus,
    image: &str,
    tag: &ImageTagSpec,
) -> Option<&'a ImageTagStatus> {
    status
        .image_statuses
        .get(image)?
        .tags
        .iter()
        .find(|s| s.tag == tag.tag)
}

fn same_version(spec: &ImageTagSpec, status: &ImageTagStatus) -> bool {
    spec.version.unwrap_or(0) == status.version.unwrap_or(0)
}

/// When a tag's TTL after finishing expires: its `ttlSecondsAfterFinished` after the
/// `completionTime` of its status at the same version. `None`: no TTL, or not finished.
fn ttl_expiry(status: &NodeImageStatus, image: &str, tag: &ImageTagSpec) -> Option<Timestamp> {
    let ttl = tag.pull_policy.as_ref()?.ttl_seconds_after_finished?;
    let done = tag_status(status, image, tag).filter(|s| same_version(tag, s))?;
    let completed = done.completion_time.as_ref()?.0;
    Some(plus_secs(completed, i64::from(ttl.max(0))))
}

/// The result of [`collect`].
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Collected {
    /// `spec.images` after collection (equal to the input when nothing was collected).
    pub images: Images,
    /// When a kept tag's TTL expires next.
    pub wake: Option<Timestamp>,
}

/// Garbage-collects `spec.images`:
/// * owner references to ImagePullJobs whose uid is in `gone_jobs` (deleted, or replaced by a
///   job of the same name) are dropped; other kinds are kept. A tag that had owners and has
///   none left is dropped. (A tag that never had owners is left alone, as upstream does.)
/// * a tag whose `ttlSecondsAfterFinished` has passed (at `now` exactly, too) since the status
///   of the same version completed is dropped.
/// * an image without tags is dropped.
///
/// Liveness is passed as the set of uids *known* gone, not the set known alive: a job the
/// caller could not check (an API error, a reference that appeared after a re-read) stays.
///
/// An image that lost an owner or a tag has its tags' values recomputed from the owners left
/// ([`refresh_image`], `ask` answering for one owner): what only the gone job asked for —
/// patience, `Always`, sandbox metadata — goes with it.
///
/// Unlike upstream, a tag without `createdAt` is not dropped: an older writer or a user may
/// omit it, and it says nothing about whether the tag is still wanted. It only means its
/// creation time is unknown, so [`timeouts`] cannot time it out.
pub(crate) fn collect(
    spec: &NodeImageSpec,
    status: &NodeImageStatus,
    gone_jobs: &BTreeSet<String>,
    ask: impl Fn(&ObjectReference) -> Option<OwnerAsk>,
    now: Timestamp,
) -> Collected {
    let mut wake = None;
    let mut images = Images::new();
    for (name, image) in &spec.images {
        let mut tags = Vec::with_capacity(image.tags.len());
        for tag in &image.tags {
            let mut tag = tag.clone();
            let owners = tag.owner_references.len();
            tag.owner_references.retain(|owner| {
                let gone = is_image_pull_job(owner)
                    && owner
                        .uid
                        .as_ref()
                        .is_some_and(|uid| gone_jobs.contains(uid));
                !gone
            });
            if owners > 0 && tag.owner_references.is_empty() {
                continue;
            }
            if let Some(expiry) = ttl_expiry(status, name, &tag) {
                if now >= expiry {
                    continue;
                }
                wake = earliest(wake, Some(expiry));
            }
            tags.push(tag);
        }
        if tags.is_empty() {
            continue;
        }
        let collected = ImageSpec {
            tags,
            ..(**image).clone()
        };
        // An unchanged entry stays the stored (shared) copy.
        let image = if collected == **image {
            image.clone()
        } else {
            refresh_image(&collected, &ask, |tag| in_flight(Some(status), name, tag)).into()
        };
        images.insert(name.clone(), image);
    }
    Collected { images, wake }
}

// --- status timeouts ----------------------------------------------------------------------------

/// A tag [`timeouts`] marked Failed, for the events.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct FailedTag {
    pub image: String,
    pub tag: String,
    pub message: String,
    /// The tag's owners (its ImagePullJobs), which get a Warning event each.
    pub owners: Vec<SharedOwner>,
}

impl FailedTag {
    /// The event note, for the owners and the NodeImage alike.
    pub(crate) fn note(&self, node: &str) -> String {
        format!(
            "Failed to pull image {} on node {node}: {}",
            joined_ref(&self.image, &self.tag),
            self.message
        )
    }
}

/// The result of [`timeouts`].
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Timeouts {
    /// The new status, when a tag was marked Failed; `None` when nothing changes.
    pub status: Option<NodeImageStatus>,
    /// The tags marked Failed now.
    pub failed: Vec<FailedTag>,
    /// When the next tag times out, if nothing else happens.
    pub wake: Option<Timestamp>,
}

/// Marks Failed, in `status`, each spec tag that
/// * has no status at its spec version by `createdAt + response_timeout`: "node has not
///   responded for `<timeout>`";
/// * has one, not completed by `createdAt + activeDeadlineSeconds + response_timeout`:
///   [`DEADLINE_EXCEEDED`].
///
/// A failed tag gets `completionTime` = `now` and `version` = its spec version, so the daemon
/// sees it as finished and the TTL starts. When any tag failed, the status entries of tags no
/// longer in the spec are dropped and `desired`, `pulling`, `succeeded` and `failed` recounted
/// (`waiting` is the daemon's alone). Tags without `createdAt` never time out (when they were
/// asked for is unknown).
pub(crate) fn timeouts(
    spec: &NodeImageSpec,
    status: &NodeImageStatus,
    now: Timestamp,
    response_timeout: Duration,
) -> Timeouts {
    let mut new = status.clone();
    let mut failed = Vec::new();
    let mut wake = None;
    for (name, image) in &spec.images {
        for tag in &image.tags {
            let Some(created) = tag.created_at.as_ref().map(|t| t.0) else {
                continue;
            };
            let current = tag_status(status, name, tag);
            let message = match current {
                Some(s) if same_version(tag, s) => {
                    let deadline = tag
                        .pull_policy
                        .as_ref()
                        .and_then(|p| p.active_deadline_seconds);
                    let Some(deadline) = deadline.filter(|_| s.completion_time.is_none()) else {
                        continue;
                    };
                    let due = plus(plus_secs(created, deadline), response_timeout);
                    if now < due {
                        wake = earliest(wake, Some(due));
                        continue;
                    }
                    DEADLINE_EXCEEDED.to_owned()
                }
                _ => {
                    let due = plus(created, response_timeout);
                    if now < due {
                        wake = earliest(wake, Some(due));
                        continue;
                    }
                    not_responded(response_timeout)
                }
            };
            mark_failed(&mut new, name, tag, &message, now);
            failed.push(FailedTag {
                image: name.to_string(),
                tag: tag.tag.to_string(),
                message,
                owners: tag.owner_references.clone(),
            });
        }
    }
    if failed.is_empty() {
        return Timeouts {
            status: None,
            failed,
            wake,
        };
    }
    prune_and_count(spec, &mut new);
    Timeouts {
        status: Some(new),
        failed,
        wake,
    }
}

fn mark_failed(
    status: &mut NodeImageStatus,
    image: &str,
    tag: &ImageTagSpec,
    message: &str,
    now: Timestamp,
) {
    let tags = &mut status
        .image_statuses
        .get_or_insert_with(image.into(), Default::default)
        .tags;
    let failed = |old: Option<&ImageTagStatus>| ImageTagStatus {
        phase: ImagePullPhase::Failed,
        completion_time: Some(Time(now)),
        version: tag.version,
        message: Some(message.to_owned()),
        ..old
            .cloned()
            .unwrap_or_else(|| ImageTagStatus::new(tag.tag.clone(), ImagePullPhase::Failed))
    };
    match tags.iter().position(|s| s.tag == tag.tag) {
        Some(i) => tags[i] = failed(Some(&tags[i])),
        None => {
            // Keep the list sorted by tag (a strict order, unlike upstream's `<=`, §10.17).
            let at = tags.partition_point(|s| s.tag < tag.tag);
            tags.insert(at, failed(None));
        }
    }
}

/// Drops status entries of tags not in the spec and recounts everything but `waiting`.
pub(crate) fn prune_and_count(spec: &NodeImageSpec, status: &mut NodeImageStatus) {
    status.image_statuses.retain(|name, image_status| {
        let Some(image) = spec.images.get(name) else {
            return false;
        };
        image_status
            .tags
            .retain(|s| image.tags.iter().any(|t| t.tag == s.tag));
        !image_status.tags.is_empty()
    });
    let counts = count(spec, &status.image_statuses);
    status.desired = counts.desired;
    status.pulling = counts.pulling;
    status.succeeded = counts.succeeded;
    status.failed = counts.failed;
}

/// The counts [`prune_and_count`] writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub desired: i32,
    pub pulling: i32,
    pub succeeded: i32,
    pub failed: i32,
}

/// `desired` = tags in the spec; the others = status tags in that phase.
pub(crate) fn count(spec: &NodeImageSpec, statuses: &ImageStatuses) -> Counts {
    let to_i32 = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    let desired = to_i32(spec.images.values().map(|i| i.tags.len()).sum());
    let phases = statuses.values().flat_map(|s| &s.tags).map(|t| t.phase);
    let mut counts = Counts {
        desired,
        ..Counts::default()
    };
    for phase in phases {
        match phase {
            ImagePullPhase::Pulling => counts.pulling += 1,
            ImagePullPhase::Succeeded => counts.succeeded += 1,
            ImagePullPhase::Failed => counts.failed += 1,
            ImagePullPhase::Waiting => {}
        }
    }
    counts
}

/// The next instant a reconcile of this NodeImage would change something by time alone: a TTL
/// expiry, a response timeout or a deadline.
pub(crate) fn next_wake(
    nodeimage: &LeanNodeImage,
    now: Timestamp,
    response_timeout: Duration,
) -> Option<Timestamp> {
    let status = nodeimage.status.clone().unwrap_or_default();
    let gc = collect(&nodeimage.spec, &status, &BTreeSet::new(), |_| None, now).wake;
    let timeouts = timeouts(&nodeimage.spec, &status, now, response_timeout).wake;
    earliest(gc, timeouts)
}

#[cfg(test)]
mod tests;
