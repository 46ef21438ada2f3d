//! Which pods get their sidecars upgraded next: upstream's `sidecarset_strategy.go` as one pure
//! function, [`next_batch`], over plain [`PodView`]s.
//!
//! # What the words mean
//!
//! The SidecarSet's *current hash* is its `kruise.io/sidecarset-hash` annotation (written by the
//! SidecarSet webhook; computed from the spec when absent), likewise for the hash without
//! images. For one SidecarSet, every pod handed in (the controller's matched pods, §2.3 of the
//! reference) is in exactly one `PodState`:
//!
//! - **inactive**: being deleted, `Succeeded` or `Failed`. Ignored everywhere, as upstream drops
//!   such pods while listing. A pod that is going away can never hold the rollout (the shape of
//!   upstream #1168, where a vanished pod stayed "in flight").
//! - **updated**: the pod's hash entry for this SidecarSet equals the current hash. It is
//!   *in flight* (unavailable because of us) while it is not ready, one of its sidecar
//!   containers is not yet running its spec image, or its kubelet has not applied a resize
//!   ([`KubeletResize`]).
//! - **not selected**: not updated, and outside `updateStrategy.selector`. Never touched.
//! - **not upgradable**: not updated, and its hash without images differs from the current one:
//!   something besides images changed (env, volumes, …), which Kubernetes cannot patch in place.
//!   Reported so the controller can set the pod condition `SidecarSetUpgradable=False`. Except
//!   when only the sidecars' resources changed besides images ([`InPlaceResize::Needed`]: the
//!   pod's version has the current in-place hash) and the apiserver serves `pods/resize`: such a
//!   pod is upgraded in place, resized first (`super::resize`).
//! - **settling**: upgradable, but a *ready* sidecar container still runs an older image than its
//!   spec (an earlier in-place upgrade kubelet has not applied yet). Skipped this round. A
//!   sidecar that is not ready (say, stuck pulling a bad image) does not make the pod settle,
//!   so a fixed SidecarSet can replace the bad image.
//! - **candidate**: everything else; the pods the rollout still has to reach.
//!
//! # The batch
//!
//! 1. Nothing when `type: NotUpdate`, when `paused`, or when the strategy cannot be evaluated
//!    (a malformed partition, maxUnavailable or selector; upstream read a malformed partition
//!    as 0, i.e. "upgrade everything", where we hold and say why).
//! 2. Candidates are ordered as upstream orders them: first Kubernetes' `ActivePods` order
//!    (unscheduled before scheduled; `Pending` < `Unknown` < `Running`; not ready before ready;
//!    among ready pods, ready more recently first; more container restarts first; newer first,
//!    pods without a timestamp before all), then the pod's namespace and name so equal pods
//!    always come out the same way (upstream's sort is unstable); then a stable sort by
//!    `priorityStrategy`; then `scatterStrategy`: term by term (the one matching most
//!    candidates first), the candidates carrying the term's label are interleaved with the
//!    others in proportion to their share of all matched pods, so every batch cut from the
//!    front gets its share rather than one batch taking them all (upstream's `updatesort`).
//! 3. `partition` pods of the candidates stay behind: only the first `candidates − partition`
//!    may be upgraded at all (the *queue*).
//! 4. Walking the queue in order: a pod whose node is still pre-downloading the new images is
//!    passed over (it stays in the queue); a pod that is not ready is taken for free (it is
//!    unavailable already); a ready pod is taken only while fewer than `maxUnavailable` updated
//!    pods are in flight, each taken pod counting as one more; the walk stops at the first ready
//!    pod that does not fit. A paused rollout has its queue but takes nothing.
//!
//! # Rounding
//!
//! Percentages are of the number of active matched pods, computed exactly (no floating point):
//! - `maxUnavailable` (default 1): an integer as is; a percent rounds **up**, so any percent
//!   above 0% of a non-empty set allows at least one pod (5% of 5 pods is 1: the #1832 stall,
//!   fixed upstream by PR #1834). `0` and `"0%"` mean what they say: only pods that are not
//!   ready move.
//! - `partition` (default 0): an integer as is, capped at the matched pods; a percent rounds
//!   **up** (any percent above 0% keeps at least one old pod), except that a percent below 100%
//!   never keeps *every* pod of a set of two or more: it keeps one fewer, so the rollout always
//!   starts (upstream's `CalculatePartitionReplicas`, post #1834; 99% of 5 keeps 4, 1% of 5
//!   keeps 1). A single pod under any percent above 0% stays old: the rule that a partition
//!   keeps at least one pod wins there.
//!
//! # Guarantees (property-tested below)
//!
//! - Only candidates are upgraded; never more than `candidates − partition`, so at least
//!   `partition` matched pods stay on the old version.
//! - Ready pods taken ≤ `maxUnavailable − in flight` (none when already at or over it).
//! - The answer does not depend on the order of `pods`.
//! - With a candidate beyond the partition, nothing in flight and a non-zero maxUnavailable,
//!   the batch is never empty.
//!
//! # Deliberate differences from upstream
//!
//! - Malformed strategy values hold the rollout (see 1.) instead of reading as 0.
//! - Equal pods are ordered by namespace/name; `*` scatter terms expand to the label's values in
//!   sorted order (upstream: informer order, which is unspecified).
//! - `orderPriority`: pods carrying none of the ordered keys come *after* the ones that do, as
//!   the API documents; upstream's code ranks them first.
//! - The scatter density comparison is exact integer arithmetic (upstream compares `float32`s).
//! - Fractional percents (`"12.5%"`) work for both fields; upstream refused them for
//!   maxUnavailable (reading 0). Validation only admits whole percents anyway.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::sync::LazyLock;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use smallvec::SmallVec;

use kruise_rs_api::defaults::default_sidecarset;
use kruise_rs_api::sidecarset::{
    SidecarSet, SidecarSetSpec, SidecarSetUpdateStrategy, SidecarSetUpdateStrategyType,
    UpdatePriorityStrategy, UpdateScatterTerm,
};
use kruise_rs_controller::interned_labels::{Interned, Labels};
use kruise_rs_controller::pod_summary::PodSummary;
use kruise_rs_sidecar::hash::{current_hashes, sidecarset_hash_in_place};
use kruise_rs_sidecar::matching::{SelectorError, selector_matches};
use kruise_rs_sidecar::revision::restore;

/// A pod's lifecycle phase, as far as ordering and activity go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PodPhase {
    /// Also what an unset phase means.
    #[default]
    Pending,
    Unknown,
    Running,
    Succeeded,
    Failed,
}

impl PodPhase {
    /// Kubernetes' `podPhaseToOrdinal`: `Pending` < `Unknown` < `Running`; the finished phases
    /// rank with `Pending` (they never reach the sort: such pods are inactive).
    fn ordinal(self) -> u8 {
        match self {
            PodPhase::Unknown => 1,
            PodPhase::Running => 2,
            PodPhase::Pending | PodPhase::Succeeded | PodPhase::Failed => 0,
        }
    }
}

/// One sidecar container of a pod (for a hot-upgrade sidecar, each twin is one).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SidecarView {
    /// Shared with the stored pod's container (interned), not copied.
    pub name: Interned,
    /// The container status says ready.
    pub ready: bool,
    /// The container runs the image its spec asks for (upstream's `IsPodStateConsistent` for
    /// this container: digest comparison, or the `kruise.io/sidecarset-inplace-update-state`
    /// record). Must be false when the pod's container statuses do not cover its containers.
    pub image_running: bool,
    /// A native sidecar (an init container with `restartPolicy: Always`).
    pub native: bool,
}

/// Whether a pod that is not on the current version needs a resize besides new images.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InPlaceResize {
    /// No: only images changed since its version, or more than images and resources did.
    #[default]
    NotNeeded,
    /// Its sidecars' resources changed too (and nothing else but images): it is upgraded in
    /// place, the resources through the `pods/resize` subresource.
    Needed,
    /// As `Needed`, but the apiserver does not serve `pods/resize`: it cannot be upgraded in
    /// place.
    Unserved,
}

/// Where the kubelet is with the pod's spec, as far as a resize goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KubeletResize {
    /// Nothing pending: no resize condition, and the spec's generation observed (or not
    /// reported: Kubernetes 1.33 without `PodObservedGenerationTracking`).
    #[default]
    Settled,
    /// `status.observedGeneration` is behind `metadata.generation`: the kubelet has not seen the
    /// latest spec change yet.
    Unobserved,
    /// `PodResizeInProgress`.
    InProgress,
    /// `PodResizePending` with reason `Deferred`: the node cannot fit it now, it may later.
    Deferred,
    /// `PodResizePending` with reason `Infeasible`: the node can never fit it.
    Infeasible,
}

/// What the upgrade decision needs to know about one matched pod, filled by the controller.
///
/// A reconcile holds one for every pod the SidecarSet owns at once (10,000 in the rollout
/// bench), so it is kept small: the stored pod is borrowed for its names, labels and node, the
/// hash entries are read against the SidecarSet's current hashes once (two flags, not two
/// strings), times are to the second, the usual single sidecar is inline.
#[derive(Clone, Debug, PartialEq)]
pub struct PodView<'a> {
    /// The stored pod: namespace, name, labels and node name are read from it.
    pub pod: &'a PodSummary,
    pub phase: PodPhase,
    /// Running and Ready, and for hot-upgrade sidecars every idle twin on its empty image
    /// (upstream's `IsPodReady`).
    pub ready: bool,
    /// `deletionTimestamp` is set.
    pub deleting: bool,
    /// The new sidecar images are being pre-downloaded to the pod's node and are not there
    /// yet: the pod stays in the queue but is not upgraded (see `predownload`).
    pub awaiting_images: bool,
    /// This SidecarSet's entry in the pod's `kruise.io/sidecarset-hash` annotation is the
    /// current hash ([`CurrentHashes::hash`]): the pod is on the version being rolled out.
    pub hash_current: bool,
    /// Likewise for `kruise.io/sidecarset-hash-without-image`: only images changed since the
    /// pod's version, so it can be upgraded in place.
    pub hash_without_image_current: bool,
    /// Whether bringing the pod up to date takes a resize (see [`InPlaceResize`]).
    pub resize: InPlaceResize,
    /// Where the kubelet is with the pod's last resize; anything but `Settled` keeps an
    /// updated pod in flight.
    pub kubelet_resize: KubeletResize,
    /// The highest `restartCount` among the pod's containers.
    pub restarts: i32,
    /// `lastTransitionTime` of the Ready condition.
    pub ready_since: OptionalTime,
    pub created: OptionalTime,
    /// When the `kruise.io/sidecarset-hash` entry was written: the last upgrade (or injection).
    pub hash_written: OptionalTime,
    /// The SidecarSet's sidecar containers in this pod.
    pub sidecars: SmallVec<[SidecarView; 1]>,
}

static NO_POD: LazyLock<PodSummary> = LazyLock::new(PodSummary::default);

impl Default for PodView<'_> {
    fn default() -> Self {
        PodView {
            pod: &NO_POD,
            phase: PodPhase::default(),
            ready: false,
            deleting: false,
            awaiting_images: false,
            hash_current: false,
            hash_without_image_current: false,
            resize: InPlaceResize::NotNeeded,
            kubelet_resize: KubeletResize::Settled,
            restarts: 0,
            ready_since: OptionalTime::NONE,
            created: OptionalTime::NONE,
            hash_written: OptionalTime::NONE,
            sidecars: SmallVec::new(),
        }
    }
}

/// A time to the second (all the Kubernetes API carries), or none: 8 bytes where an
/// `Option<Timestamp>` takes 24, for the three times of every [`PodView`].
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OptionalTime(i64);

impl OptionalTime {
    pub const NONE: OptionalTime = OptionalTime(i64::MIN);

    pub fn get(self) -> Option<Timestamp> {
        if self == Self::NONE {
            return None;
        }
        Timestamp::from_second(self.0).ok()
    }
}

impl Default for OptionalTime {
    fn default() -> Self {
        Self::NONE
    }
}

impl From<Option<Timestamp>> for OptionalTime {
    /// Fractions of a second are dropped.
    fn from(time: Option<Timestamp>) -> Self {
        time.map_or(Self::NONE, |t| OptionalTime(t.as_second()))
    }
}

impl fmt::Debug for OptionalTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.get(), f)
    }
}

impl<'a> PodView<'a> {
    pub fn namespace(&self) -> &'a str {
        self.pod.metadata.namespace.as_deref().unwrap_or_default()
    }

    pub fn name(&self) -> &'a str {
        self.pod.metadata.name.as_deref().unwrap_or_default()
    }

    pub fn labels(&self) -> &'a Labels {
        self.pod.labels()
    }

    /// `spec.nodeName`; unset or empty means unscheduled.
    pub fn node_name(&self) -> Option<&'a str> {
        self.pod.spec.as_ref()?.node_name.as_deref()
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace(), self.name())
    }

    /// Not being deleted and not finished (Kubernetes' `IsPodActive`).
    pub fn is_active(&self) -> bool {
        !self.deleting && !matches!(self.phase, PodPhase::Succeeded | PodPhase::Failed)
    }

    /// Every sidecar container runs its spec image.
    pub fn images_running(&self) -> bool {
        self.sidecars.iter().all(|s| s.image_running)
    }

    /// Ready and every sidecar on its spec image: what the status counts as ready.
    pub fn is_available(&self) -> bool {
        self.ready && self.images_running()
    }

    /// Available, and no resize pending in the kubelet: an updated pod no longer in flight.
    pub fn is_settled(&self) -> bool {
        self.is_available() && self.kubelet_resize == KubeletResize::Settled
    }

    fn is_scheduled(&self) -> bool {
        self.node_name().is_some_and(|n| !n.is_empty())
    }

    fn label(&self, key: &str) -> Option<&'a str> {
        self.labels().get(key)
    }
}

/// The SidecarSet version pods are upgraded to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CurrentHashes {
    pub hash: String,
    pub without_image: String,
    /// The `kruise.io/sidecarset-hash` values of the ControllerRevisions whose pods differ from
    /// this version in nothing but sidecar images and resources (their
    /// `sidecarset_hash_in_place` is the current one's); empty unless built
    /// [`CurrentHashes::with_resize`]. By hash rather than revision name: a pod injected
    /// before the SidecarSet's first revision was written records no revision name.
    pub resizable_hashes: HashSet<String>,
    /// Whether the apiserver serves `pods/resize`.
    pub resize_served: bool,
}

impl CurrentHashes {
    /// The SidecarSet's hash annotations, or the hashes of its spec where an annotation is
    /// missing (as the injection side does, so both agree on what "current" is). No revision
    /// counts as resizable.
    pub fn of(set: &SidecarSet) -> Self {
        let (hash, without_image) = current_hashes(set);
        Self {
            hash,
            without_image,
            ..Self::default()
        }
    }

    /// [`CurrentHashes::of`], with the `revisions` of `set` whose pods a resize (and new images)
    /// brings up to date. A revision whose data cannot be read is not one of them.
    pub fn with_resize<'r>(
        set: &SidecarSet,
        revisions: impl IntoIterator<Item = &'r ControllerRevision>,
        resize_served: bool,
    ) -> Self {
        let current = in_place_hash(set, &set.spec);
        let resizable_hashes = revisions
            .into_iter()
            .filter_map(|r| {
                let restored = restore(set, r).ok()?;
                (in_place_hash(set, &restored.spec) == current).then(|| {
                    // The revision's hash annotation, else the hash of its defaulted spec: what
                    // the webhook wrote on the pods it injected (`restore` hashes the spec as
                    // recorded, which a SidecarSet stored while no webhook ran is not).
                    let mut version = set.clone();
                    version.spec = restored.spec;
                    version.metadata.annotations = r.metadata.annotations.clone();
                    current_hashes(&version).0
                })
            })
            .collect();
        Self {
            resizable_hashes,
            resize_served,
            ..Self::of(set)
        }
    }
}

/// `set` with `spec`, defaulted as the webhook defaults it, hashed without images and resources.
fn in_place_hash(set: &SidecarSet, spec: &SidecarSetSpec) -> String {
    let mut defaulted = set.clone();
    defaulted.spec = spec.clone();
    default_sidecarset(&mut defaulted);
    sidecarset_hash_in_place(&defaulted.spec)
}

/// Where one pod stands in the rollout; see the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PodState {
    Inactive,
    /// `in_flight`: not ready, or a sidecar not yet on its new image.
    Updated {
        in_flight: bool,
    },
    NotSelected,
    NotUpgradable,
    Settling,
    Candidate,
}

/// Where `pod` stands. `selected` says whether the pod matches `updateStrategy.selector`.
pub(crate) fn classify(pod: &PodView, selected: bool) -> PodState {
    if !pod.is_active() {
        PodState::Inactive
    } else if pod.hash_current {
        PodState::Updated {
            in_flight: !pod.is_settled(),
        }
    } else if !selected {
        PodState::NotSelected
    } else if !pod.hash_without_image_current && pod.resize != InPlaceResize::Needed {
        PodState::NotUpgradable
    } else if pod.sidecars.iter().any(|s| s.ready && !s.image_running) {
        PodState::Settling
    } else {
        PodState::Candidate
    }
}

/// Why the update strategy cannot be evaluated.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StrategyError {
    #[error(
        "spec.updateStrategy.{field}: {value} is neither a non-negative integer nor a percent such as \"20%\""
    )]
    IntOrPercent { field: &'static str, value: String },
    #[error("spec.updateStrategy.selector is invalid: {0}")]
    Selector(#[source] SelectorError),
}

/// A percent string as an exact fraction of 100: `"12.5%"` is `(125, 10)`, i.e. 125/10 %.
/// At most nine digits on each side of the point, so later products fit in a `u128`.
fn parse_percent(s: &str) -> Option<(u128, u128)> {
    let number = s.strip_suffix('%')?;
    let (whole, fraction) = match number.split_once('.') {
        Some((w, f)) if !f.is_empty() => (w, f),
        Some(_) => return None,
        None => (number, ""),
    };
    let digits = |d: &str| d.len() <= 9 && d.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !digits(whole) || !digits(fraction) {
        return None;
    }
    let scale = 10u128.pow(fraction.len() as u32);
    let numerator = format!("{whole}{fraction}").parse::<u128>().ok()?;
    Some((numerator, scale))
}

/// `percent` of `total`, rounded up or down; `None` for a malformed percent.
fn scaled(percent: &str, total: usize, round_up: bool) -> Option<(usize, bool)> {
    let (numerator, scale) = parse_percent(percent)?;
    let dividend = numerator * total as u128;
    let divisor = scale * 100;
    let value = if round_up {
        dividend.div_ceil(divisor)
    } else {
        dividend / divisor
    };
    let below_100 = numerator < divisor;
    Some((usize::try_from(value).unwrap_or(usize::MAX), below_100))
}

/// How many of `matched` pods `partition` keeps on the old version; see "Rounding".
pub(crate) fn partition_count(
    partition: Option<&IntOrString>,
    matched: usize,
) -> Result<usize, StrategyError> {
    let error = |value: String| StrategyError::IntOrPercent {
        field: "partition",
        value,
    };
    let kept = match partition {
        None => 0,
        Some(IntOrString::Int(n)) => usize::try_from(*n).map_err(|_| error(n.to_string()))?,
        Some(IntOrString::String(s)) => {
            let (kept, below_100) =
                scaled(s, matched, true).ok_or_else(|| error(format!("{s:?}")))?;
            // A percent below 100% must leave the rollout something to do.
            if below_100 && matched > 1 && kept >= matched {
                matched - 1
            } else {
                kept
            }
        }
    };
    Ok(kept.min(matched))
}

/// How many updated pods may be unavailable at once, out of `matched`; see "Rounding".
pub(crate) fn max_unavailable_count(
    max_unavailable: Option<&IntOrString>,
    matched: usize,
) -> Result<usize, StrategyError> {
    let error = |value: String| StrategyError::IntOrPercent {
        field: "maxUnavailable",
        value,
    };
    match max_unavailable {
        None => Ok(1),
        Some(IntOrString::Int(n)) => usize::try_from(*n).map_err(|_| error(n.to_string())),
        Some(IntOrString::String(s)) => scaled(s, matched, true)
            .map(|(value, _)| value)
            .ok_or_else(|| error(format!("{s:?}"))),
    }
}

/// Why a batch stops where it does (or is empty).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hold {
    /// `updateStrategy.type: NotUpdate`: running pods are never upgraded.
    NotUpdate,
    /// `updateStrategy.paused`.
    Paused,
    /// The strategy cannot be evaluated; nothing moves until it is fixed.
    Invalid(StrategyError),
    /// The remaining candidates are the last `partition` in rollout order: they stay on the
    /// old version.
    Partition { partition: usize },
    /// `pods` pods of the queue wait for their node to pull the new sidecar images.
    PreDownload { pods: usize },
    /// The next pod is ready and `unavailable` updated pods are already in flight (counting
    /// this batch), which is at least `max_unavailable`.
    MaxUnavailable {
        unavailable: usize,
        max_unavailable: usize,
    },
}

/// The next step of a rollout. Pods are named by their position in the `pods` slice given to
/// [`next_batch`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    /// Pods to upgrade now, in this order.
    pub upgrade: Vec<usize>,
    /// Every pod the rollout will reach under the current strategy, in the order it will reach
    /// them (`upgrade` is its beginning): the pre-download targets.
    pub queue: Vec<usize>,
    /// Selected pods that an image-only patch cannot bring up to date, by namespace/name.
    pub not_upgradable: Vec<usize>,
    /// Updated pods that are not available yet, by namespace/name.
    pub in_flight: Vec<usize>,
    /// Active pods considered (percentages are of this number).
    pub matched: usize,
    /// Selected, upgradable pods not on the current version yet (candidates and settling
    /// pods), whatever the strategy allows this round.
    pub waiting: usize,
    /// Why the batch is not the whole queue, or the queue not every candidate; `None` when
    /// every candidate is being upgraded (or none is left).
    pub hold: Option<Hold>,
}

/// The pods to upgrade next for `set`, among its matched `pods`. See the module documentation.
pub fn next_batch(set: &SidecarSet, pods: &[PodView]) -> Batch {
    let strategy = &set.spec.update_strategy;
    let mut batch = Batch::default();

    let selected = |pod: &PodView| match &strategy.selector {
        None => Ok(true),
        Some(selector) => selector_matches(selector, pod.labels()),
    };
    let mut selector_error = None;
    let mut active = Vec::new();
    let mut candidates = Vec::new();
    for (i, pod) in pods.iter().enumerate() {
        let is_selected = selected(pod).unwrap_or_else(|e| {
            selector_error.get_or_insert(e);
            false
        });
        match classify(pod, is_selected) {
            PodState::Inactive => continue,
            PodState::Updated { in_flight: true } => batch.in_flight.push(i),
            PodState::NotUpgradable => batch.not_upgradable.push(i),
            PodState::Candidate => candidates.push(i),
            PodState::Settling => batch.waiting += 1,
            PodState::Updated { .. } | PodState::NotSelected => {}
        }
        active.push(i);
    }
    batch.matched = active.len();
    batch.waiting += candidates.len();
    let by_key = |&a: &usize, &b: &usize| by_name(&pods[a], &pods[b]);
    batch.in_flight.sort_by(by_key);
    batch.not_upgradable.sort_by(by_key);

    let limits = selector_error
        .map_or(Ok(()), |e| Err(StrategyError::Selector(e)))
        .and_then(|()| {
            let partition = partition_count(strategy.partition.as_ref(), batch.matched)?;
            let max = max_unavailable_count(strategy.max_unavailable.as_ref(), batch.matched)?;
            Ok((partition, max))
        });
    if strategy.type_ == Some(SidecarSetUpdateStrategyType::NotUpdate) {
        batch.hold = Some(Hold::NotUpdate);
        return batch;
    }
    let (partition, max_unavailable) = match limits {
        Ok(limits) => limits,
        Err(e) => {
            batch.hold = Some(Hold::Invalid(e));
            return batch;
        }
    };

    let order = sort_for_update(strategy, pods, &active, candidates);
    let reachable = order.len().saturating_sub(partition);
    batch.queue = order[..reachable].to_vec();
    // A paused rollout still knows where it will go (pre-download prepares those nodes).
    if strategy.paused {
        batch.hold = Some(Hold::Paused);
        return batch;
    }
    let mut unavailable = batch.in_flight.len();
    let mut awaiting_images = 0;
    for &i in &batch.queue {
        if pods[i].awaiting_images {
            awaiting_images += 1;
            continue;
        }
        if pods[i].ready {
            if unavailable >= max_unavailable {
                batch.hold = Some(Hold::MaxUnavailable {
                    unavailable,
                    max_unavailable,
                });
                break;
            }
            unavailable += 1;
        }
        batch.upgrade.push(i);
    }
    if batch.hold.is_none() && awaiting_images > 0 {
        batch.hold = Some(Hold::PreDownload {
            pods: awaiting_images,
        });
    }
    if batch.hold.is_none() && reachable < order.len() {
        batch.hold = Some(Hold::Partition { partition });
    }
    batch
}

fn by_name(a: &PodView, b: &PodView) -> Ordering {
    (a.namespace(), a.name()).cmp(&(b.namespace(), b.name()))
}

/// `None` first, then later first (Kubernetes' `afterOrZero` as an ordering).
fn zero_then_latest(a: OptionalTime, b: OptionalTime) -> Ordering {
    // Compared as stored: it runs for every comparison of a sort over thousands of pods.
    match (a == OptionalTime::NONE, b == OptionalTime::NONE) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        (false, false) => b.cmp(&a),
    }
}

/// Kubernetes' `ActivePods` order (pods to act on first come first), completed by namespace and
/// name so that it is total.
fn active_pods_order(a: &PodView, b: &PodView) -> Ordering {
    a.is_scheduled()
        .cmp(&b.is_scheduled())
        .then_with(|| a.phase.ordinal().cmp(&b.phase.ordinal()))
        .then_with(|| a.ready.cmp(&b.ready))
        .then_with(|| {
            if a.ready && b.ready {
                zero_then_latest(a.ready_since, b.ready_since)
            } else {
                Ordering::Equal
            }
        })
        .then_with(|| b.restarts.cmp(&a.restarts))
        .then_with(|| zero_then_latest(a.created, b.created))
        .then_with(|| by_name(a, b))
}

/// The candidates in the order the rollout reaches them: `ActivePods`, then priority, then
/// scatter. `active` are all active matched pods (scatter balances against all of them).
fn sort_for_update(
    strategy: &SidecarSetUpdateStrategy,
    pods: &[PodView],
    active: &[usize],
    mut candidates: Vec<usize>,
) -> Vec<usize> {
    candidates.sort_by(|&a, &b| active_pods_order(&pods[a], &pods[b]));
    if let Some(priority) = &strategy.priority_strategy {
        sort_by_priority(priority, pods, &mut candidates);
    }
    if !strategy.scatter_strategy.is_empty() {
        let terms =
            expand_scatter_terms(&strategy.scatter_strategy, active.iter().map(|&i| &pods[i]));
        let labels: Vec<&Labels> = pods.iter().map(PodView::labels).collect();
        candidates = scatter(&terms, &labels, active, candidates);
    }
    candidates
}

/// The sum of the weights whose selector matches (a selector that cannot be evaluated counts
/// nothing, as upstream).
fn weight(priority: &UpdatePriorityStrategy, labels: &Labels) -> i64 {
    priority
        .weight_priority
        .iter()
        .filter(|term| selector_matches(&term.match_selector, labels).unwrap_or(false))
        .map(|term| i64::from(term.weight))
        .sum()
}

/// The number at the end of a label value (`"sts-10"` is 10); 0 without one or on overflow.
fn trailing_number(value: &str) -> i64 {
    let digits = value.len() - value.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    value[value.len() - digits..].parse().unwrap_or(0)
}

/// `(term index, number)` of the first ordered key the pod carries; `None` without any.
fn order_rank(priority: &UpdatePriorityStrategy, labels: &Labels) -> Option<(usize, i64)> {
    priority
        .order_priority
        .iter()
        .enumerate()
        .find_map(|(i, term)| {
            labels
                .get(&term.ordered_key)
                .map(|v| (i, trailing_number(v)))
        })
}

/// Stable sort by `priorityStrategy`: heavier weight first; or by the first ordered key the pod
/// has (earlier keys first, larger numbers first, pods with no key last). `weightPriority` wins
/// when both are set, as upstream (validation forbids it).
fn sort_by_priority(priority: &UpdatePriorityStrategy, pods: &[PodView], order: &mut [usize]) {
    if !priority.weight_priority.is_empty() {
        order.sort_by_cached_key(|&i| std::cmp::Reverse(weight(priority, pods[i].labels())));
    } else if !priority.order_priority.is_empty() {
        order.sort_by_cached_key(|&i| match order_rank(priority, pods[i].labels()) {
            Some((level, number)) => (false, level, std::cmp::Reverse(number)),
            None => (true, 0, std::cmp::Reverse(0)),
        });
    }
}

/// Scatter terms with `*` replaced by each value of that key on `pods`, in sorted order;
/// duplicates dropped, first occurrence kept.
pub(crate) fn expand_scatter_terms<'a, 'p: 'a>(
    terms: &[UpdateScatterTerm],
    pods: impl Iterator<Item = &'a PodView<'p>> + Clone,
) -> Vec<UpdateScatterTerm> {
    let mut out: Vec<UpdateScatterTerm> = Vec::new();
    // A `*` over a label like the hostname expands to thousands of terms: no quadratic dedup.
    let mut seen = BTreeSet::new();
    let mut push = |term: UpdateScatterTerm| {
        if seen.insert((term.key.clone(), term.value.clone())) {
            out.push(term);
        }
    };
    for term in terms {
        if term.value != "*" {
            push(term.clone());
            continue;
        }
        let mut values: Vec<&str> = pods.clone().filter_map(|p| p.label(&term.key)).collect();
        values.sort_unstable();
        values.dedup();
        for value in values {
            push(UpdateScatterTerm {
                key: term.key.clone(),
                value: value.to_owned(),
            });
        }
    }
    out
}

fn has_label(labels: &Labels, term: &UpdateScatterTerm) -> bool {
    labels.get(&term.key) == Some(term.value.as_str())
}

/// Upstream's scatter sort (`updatesort.scatterSort`): spreads the pods carrying each term's
/// label through `order` in proportion to how they are spread among all `population` pods, so
/// every batch cut from the front gets its share. Terms are applied one after the other, the
/// one matching most of `order` first (ties in the order given).
fn scatter(
    terms: &[UpdateScatterTerm],
    labels: &[&Labels],
    population: &[usize],
    mut order: Vec<usize>,
) -> Vec<usize> {
    if terms.is_empty() || order.len() <= 1 {
        return order;
    }
    let counts = count_terms(terms, labels, &order);
    let totals = count_terms(terms, labels, population);
    let mut ranked: Vec<(&UpdateScatterTerm, usize, usize)> = terms
        .iter()
        .zip(counts)
        .zip(totals)
        .map(|((term, count), total)| (term, count, total))
        .filter(|&(_, count, _)| count > 0 || terms.len() == 1)
        .collect();
    ranked.sort_by_key(|&(_, count, _)| std::cmp::Reverse(count));
    for (term, count, total) in ranked {
        // Reordering does not change how many candidates carry a label, and a term with at
        // most one candidate on either side leaves the order as it is: skip the pass.
        if count <= 1 || order.len() - count <= 1 {
            continue;
        }
        order = scatter_by_term(term, labels, (total, population.len()), order);
    }
    order
}

/// How many of `positions` carry each term's label: one pass per distinct key, not per term
/// (a `*` over a high-cardinality label makes thousands of terms).
fn count_terms(terms: &[UpdateScatterTerm], labels: &[&Labels], positions: &[usize]) -> Vec<usize> {
    let mut per_key: BTreeMap<&str, BTreeMap<&str, usize>> = terms
        .iter()
        .map(|t| (t.key.as_str(), BTreeMap::new()))
        .collect();
    for &i in positions {
        for (key, counts) in per_key.iter_mut() {
            if let Some(value) = labels[i].get(key) {
                *counts.entry(value).or_default() += 1;
            }
        }
    }
    terms
        .iter()
        .map(|t| {
            per_key
                .get(t.key.as_str())
                .and_then(|counts| counts.get(t.value.as_str()))
                .copied()
                .unwrap_or(0)
        })
        .collect()
}

/// Group sizes for interleaving `matched` pods with `unmatched` ones.
#[derive(Debug, PartialEq, Eq)]
struct Groups {
    count: usize,
    matched_size: usize,
    unmatched_size: usize,
    unmatched_first: usize,
}

/// `round(a / b)`, halves away from zero, for `b > 0`.
fn round_div(a: usize, b: usize) -> usize {
    (2 * a + b) / (2 * b)
}

fn even_groups(matched: usize, unmatched: usize) -> Groups {
    let count = matched.min(unmatched).max(1);
    Groups {
        count,
        matched_size: round_div(matched, count),
        unmatched_size: round_div(unmatched, count),
        unmatched_first: 0,
    }
}

/// Upstream's `calculateGroupByDensity`: interleave in the proportion of the pods to update,
/// unless the whole population has relatively more unmatched pods, then in the population's
/// proportion with the surplus unmatched pods up front.
fn groups_by_density(
    total_matched: usize,
    total_unmatched: usize,
    matched: usize,
    unmatched: usize,
) -> Groups {
    // total_unmatched / total_matched >= unmatched / matched, without rounding.
    if total_unmatched * matched >= unmatched * total_matched {
        return even_groups(matched, unmatched);
    }
    let total = even_groups(total_matched, total_unmatched);
    let matched_size = total.matched_size.max(1);
    let unmatched_size = total.unmatched_size.max(1);
    let count = (matched / matched_size).min(unmatched / unmatched_size);
    Groups {
        count,
        matched_size,
        unmatched_size,
        unmatched_first: unmatched - count * unmatched_size,
    }
}

/// One term of [`scatter`]: `total_matched` of the `population` active pods carry its label.
fn scatter_by_term(
    term: &UpdateScatterTerm,
    labels: &[&Labels],
    (total_matched, population): (usize, usize),
    order: Vec<usize>,
) -> Vec<usize> {
    let (mut matched, mut unmatched): (Vec<usize>, Vec<usize>) =
        order.iter().partition(|&&i| has_label(labels[i], term));
    if matched.len() <= 1 || unmatched.len() <= 1 {
        return order;
    }
    let total_unmatched = population.saturating_sub(total_matched);
    // The last matched pod goes to the very end; the rest are interleaved.
    let Some(last) = matched.pop() else {
        return order;
    };
    let groups = groups_by_density(
        total_matched.saturating_sub(1).max(1),
        total_unmatched.max(1),
        matched.len(),
        unmatched.len(),
    );
    let mut out = Vec::with_capacity(order.len());
    out.extend(unmatched.drain(..groups.unmatched_first.min(unmatched.len())));
    let mut matched = matched.into_iter();
    let mut unmatched = unmatched.into_iter();
    for _ in 0..groups.count {
        out.extend(matched.by_ref().take(groups.matched_size));
        out.extend(unmatched.by_ref().take(groups.unmatched_size));
    }
    out.extend(matched);
    out.extend(unmatched);
    out.push(last);
    out
}

#[cfg(test)]
mod tests;
