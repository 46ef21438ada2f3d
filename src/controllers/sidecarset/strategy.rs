//! Which pods get their sidecars upgraded next: upstream's `sidecarset_strategy.go` as one pure
//! function, [`next_batch`], over plain [`PodView`]s.
//!
//! # What the words mean
//!
//! The SidecarSet's *current hash* is its `kruise.io/sidecarset-hash` annotation (written by the
//! SidecarSet webhook; computed from the spec when absent), likewise for the hash without
//! images. For one SidecarSet, every pod handed in (the controller's matched pods, §2.3 of the
//! reference) is in exactly one [`PodState`]:
//!
//! - **inactive**: being deleted, `Succeeded` or `Failed`. Ignored everywhere, as upstream drops
//!   such pods while listing. A pod that is going away can never hold the rollout (the shape of
//!   upstream #1168, where a vanished pod stayed "in flight").
//! - **updated**: the pod's hash entry for this SidecarSet equals the current hash. It is
//!   *in flight* (unavailable because of us) while it is not ready or one of its sidecar
//!   containers is not yet running its spec image.
//! - **not selected**: not updated, and outside `updateStrategy.selector`. Never touched.
//! - **not upgradable**: not updated, and its hash without images differs from the current one:
//!   something besides images changed (env, volumes, …), which Kubernetes cannot patch in place.
//!   Reported so the controller can set the pod condition `SidecarSetUpgradable=False`.
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

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;

use crate::apis::sidecarset::{
    SidecarSet, SidecarSetUpdateStrategy, SidecarSetUpdateStrategyType, UpdatePriorityStrategy,
    UpdateScatterTerm,
};
use crate::sidecar::hash::current_hashes;
use crate::sidecar::matching::{SelectorError, selector_matches};

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
    pub name: String,
    /// The container status says ready.
    pub ready: bool,
    /// The container runs the image its spec asks for (upstream's `IsPodStateConsistent` for
    /// this container: digest comparison, or the `kruise.io/sidecarset-inplace-update-state`
    /// record). Must be false when the pod's container statuses do not cover its containers.
    pub image_running: bool,
}

/// What the upgrade decision needs to know about one matched pod, filled by the controller.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodView<'a> {
    /// Borrowed from the stored pod (a reconcile over 10,000 pods would otherwise copy every
    /// pod's labels: about 1 KiB each, freed again at once).
    pub namespace: Cow<'a, str>,
    pub name: Cow<'a, str>,
    pub labels: Cow<'a, BTreeMap<String, String>>,
    /// `spec.nodeName`; unset or empty means unscheduled.
    pub node_name: Option<String>,
    pub phase: PodPhase,
    /// Running and Ready, and for hot-upgrade sidecars every idle twin on its empty image
    /// (upstream's `IsPodReady`).
    pub ready: bool,
    /// `lastTransitionTime` of the Ready condition.
    pub ready_since: Option<Timestamp>,
    /// The highest `restartCount` among the pod's containers.
    pub restarts: i32,
    pub created: Option<Timestamp>,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// This SidecarSet's entry in the pod's `kruise.io/sidecarset-hash` annotation.
    pub hash: Option<String>,
    /// This SidecarSet's entry in the pod's `kruise.io/sidecarset-hash-without-image`.
    pub hash_without_image: Option<String>,
    /// The SidecarSet's sidecar containers in this pod.
    pub sidecars: Vec<SidecarView>,
    /// The new sidecar images are being pre-downloaded to the pod's node and are not there
    /// yet: the pod stays in the queue but is not upgraded (see `predownload`).
    pub awaiting_images: bool,
}

impl PodView<'_> {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
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

    fn is_scheduled(&self) -> bool {
        self.node_name.as_deref().is_some_and(|n| !n.is_empty())
    }

    fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }
}

/// The SidecarSet version pods are upgraded to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CurrentHashes {
    pub hash: String,
    pub without_image: String,
}

impl CurrentHashes {
    /// The SidecarSet's hash annotations, or the hashes of its spec where an annotation is
    /// missing (as the injection side does, so both agree on what "current" is).
    pub fn of(set: &SidecarSet) -> Self {
        let (hash, without_image) = current_hashes(set);
        Self {
            hash,
            without_image,
        }
    }
}

/// Where one pod stands in the rollout; see the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodState {
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
pub fn classify(pod: &PodView, current: &CurrentHashes, selected: bool) -> PodState {
    if !pod.is_active() {
        PodState::Inactive
    } else if pod.hash.as_deref() == Some(current.hash.as_str()) {
        PodState::Updated {
            in_flight: !pod.is_available(),
        }
    } else if !selected {
        PodState::NotSelected
    } else if pod.hash_without_image.as_deref() != Some(current.without_image.as_str()) {
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
pub fn partition_count(
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
pub fn max_unavailable_count(
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
    let current = CurrentHashes::of(set);
    let mut batch = Batch::default();

    let selected = |pod: &PodView| match &strategy.selector {
        None => Ok(true),
        Some(selector) => selector_matches(selector, &pod.labels),
    };
    let mut selector_error = None;
    let mut active = Vec::new();
    let mut candidates = Vec::new();
    for (i, pod) in pods.iter().enumerate() {
        let is_selected = selected(pod).unwrap_or_else(|e| {
            selector_error.get_or_insert(e);
            false
        });
        match classify(pod, &current, is_selected) {
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
    (&*a.namespace, &*a.name).cmp(&(&*b.namespace, &*b.name))
}

/// `None` first, then later first (Kubernetes' `afterOrZero` as an ordering).
fn zero_then_latest(a: Option<Timestamp>, b: Option<Timestamp>) -> Ordering {
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some(a), Some(b)) => b.cmp(&a),
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
        let labels: Vec<&BTreeMap<String, String>> = pods.iter().map(|p| &*p.labels).collect();
        candidates = scatter(&terms, &labels, active, candidates);
    }
    candidates
}

/// The sum of the weights whose selector matches (a selector that cannot be evaluated counts
/// nothing, as upstream).
fn weight(priority: &UpdatePriorityStrategy, labels: &BTreeMap<String, String>) -> i64 {
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
fn order_rank(
    priority: &UpdatePriorityStrategy,
    labels: &BTreeMap<String, String>,
) -> Option<(usize, i64)> {
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
        order.sort_by_cached_key(|&i| std::cmp::Reverse(weight(priority, &pods[i].labels)));
    } else if !priority.order_priority.is_empty() {
        order.sort_by_cached_key(|&i| match order_rank(priority, &pods[i].labels) {
            Some((level, number)) => (false, level, std::cmp::Reverse(number)),
            None => (true, 0, std::cmp::Reverse(0)),
        });
    }
}

/// Scatter terms with `*` replaced by each value of that key on `pods`, in sorted order;
/// duplicates dropped, first occurrence kept.
pub fn expand_scatter_terms<'a, 'p: 'a>(
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

fn has_label(labels: &BTreeMap<String, String>, term: &UpdateScatterTerm) -> bool {
    labels.get(&term.key) == Some(&term.value)
}

/// Upstream's scatter sort (`updatesort.scatterSort`): spreads the pods carrying each term's
/// label through `order` in proportion to how they are spread among all `population` pods, so
/// every batch cut from the front gets its share. Terms are applied one after the other, the
/// one matching most of `order` first (ties in the order given).
fn scatter(
    terms: &[UpdateScatterTerm],
    labels: &[&BTreeMap<String, String>],
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
fn count_terms(
    terms: &[UpdateScatterTerm],
    labels: &[&BTreeMap<String, String>],
    positions: &[usize],
) -> Vec<usize> {
    let mut per_key: BTreeMap<&str, BTreeMap<&str, usize>> = terms
        .iter()
        .map(|t| (t.key.as_str(), BTreeMap::new()))
        .collect();
    for &i in positions {
        for (key, counts) in per_key.iter_mut() {
            if let Some(value) = labels[i].get(*key) {
                *counts.entry(value.as_str()).or_default() += 1;
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
    labels: &[&BTreeMap<String, String>],
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
mod tests {
    use super::*;
    use crate::apis::sidecarset::SidecarSetSpec;
    use crate::apis::well_known::{SIDECARSET_HASH, SIDECARSET_HASH_WITHOUT_IMAGE};
    use serde_json::json;

    const CURRENT: &str = "bbb";
    const OLD: &str = "aaa";
    const WITHOUT_IMAGE: &str = "without-aaa";

    fn time(second: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + second).expect("valid second")
    }

    /// A SidecarSet at hash `bbb` whose image-less hash matches the pods', with `strategy`.
    fn set_with(strategy: serde_json::Value, without_image: &str) -> SidecarSet {
        let spec: SidecarSetSpec = serde_json::from_value(json!({
            "selector": {"matchLabels": {"app": "sidecar"}},
            "containers": [{"name": "test-sidecar", "image": "test-image:v2"}],
            "updateStrategy": strategy,
        }))
        .expect("spec");
        let mut set = SidecarSet::new("test-sidecarset", spec);
        set.metadata.annotations = Some(BTreeMap::from([
            (SIDECARSET_HASH.to_owned(), CURRENT.to_owned()),
            (
                SIDECARSET_HASH_WITHOUT_IMAGE.to_owned(),
                without_image.to_owned(),
            ),
        ]));
        set
    }

    fn set(strategy: serde_json::Value) -> SidecarSet {
        set_with(strategy, WITHOUT_IMAGE)
    }

    /// A running, ready pod on the old version, created `i` seconds after the epoch of the
    /// tests (so higher numbers are newer).
    fn pod(i: usize) -> PodView<'static> {
        PodView {
            namespace: "default".into(),
            name: format!("pod-{i}").into(),
            labels: Cow::Owned(BTreeMap::from([("app".to_owned(), "sidecar".to_owned())])),
            node_name: Some("node-1".into()),
            phase: PodPhase::Running,
            ready: true,
            created: Some(time(i as i64)),
            hash: Some(OLD.into()),
            hash_without_image: Some(WITHOUT_IMAGE.into()),
            sidecars: vec![SidecarView {
                name: "test-sidecar".into(),
                ready: true,
                image_running: true,
            }],
            ..Default::default()
        }
    }

    /// Upstream's `factoryPods(count, upgraded, upgradedAndReady)`: the first `upgraded` pods
    /// carry the current hash, of which the first `running` already run the new image (the
    /// others are in flight: patched, kubelet not done yet).
    fn pods(count: usize, upgraded: usize, running: usize) -> Vec<PodView<'static>> {
        let mut out: Vec<PodView> = (0..count).map(pod).collect();
        for (i, p) in out.iter_mut().enumerate().take(upgraded) {
            p.hash = Some(CURRENT.into());
            p.sidecars[0].image_running = i < running;
        }
        out
    }

    /// A deterministic xorshift generator: the tests need variety, not new crates.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
        fn chance(&mut self, percent: usize) -> bool {
            self.below(100) < percent
        }
    }

    fn shuffled<T>(mut items: Vec<T>, seed: u64) -> Vec<T> {
        let mut rng = Rng(seed | 1);
        for i in (1..items.len()).rev() {
            items.swap(i, rng.below(i + 1));
        }
        items
    }

    fn names(pods: &[PodView], positions: &[usize]) -> Vec<String> {
        positions
            .iter()
            .map(|&i| pods[i].name.to_string())
            .collect()
    }

    // --- upstream's TestGetNextUpgradePods, scenario by scenario ---------------------------------

    #[test]
    fn upstream_next_upgrade_pods_scenarios() {
        let selector_pods = || {
            let mut p = pods(1000, 0, 0);
            for pod in p.iter_mut().take(30) {
                pod.labels.to_mut().insert("app".into(), "test".into());
            }
            p
        };
        let not_upgradable = set_with(json!({"maxUnavailable": 100}), "without-bbb");
        #[allow(clippy::type_complexity)]
        let cases: Vec<(&str, Vec<PodView>, SidecarSet, usize, usize)> = vec![
            (
                "maxUnavailable 10, 100 pods, 30 updated, 26 running",
                pods(100, 30, 26),
                set(json!({"maxUnavailable": 10})),
                6,
                0,
            ),
            (
                "maxUnavailable 10%, 1000 pods, 300 updated, 260 running",
                pods(1000, 300, 260),
                set(json!({"maxUnavailable": "10%"})),
                60,
                0,
            ),
            (
                "maxUnavailable 5%, 1000 pods, 300 updated, 250 running",
                pods(1000, 300, 250),
                set(json!({"maxUnavailable": "5%"})),
                0,
                0,
            ),
            (
                "maxUnavailable 100, 100 pods, 30 updated, 27 running",
                pods(100, 30, 27),
                set(json!({"maxUnavailable": 100})),
                70,
                0,
            ),
            (
                "partition 180, maxUnavailable 100, 1000/800/760",
                pods(1000, 800, 760),
                set(json!({"maxUnavailable": 100, "partition": 180})),
                20,
                0,
            ),
            (
                "partition 100, maxUnavailable 100, 1000/800/760",
                pods(1000, 800, 760),
                set(json!({"maxUnavailable": 100, "partition": 100})),
                60,
                0,
            ),
            (
                "partition 18%, maxUnavailable 100, 1000/800/760",
                pods(1000, 800, 760),
                set(json!({"maxUnavailable": 100, "partition": "18%"})),
                20,
                0,
            ),
            (
                "partition 10%, maxUnavailable 100, 1000/800/760",
                pods(1000, 800, 760),
                set(json!({"maxUnavailable": 100, "partition": "10%"})),
                60,
                0,
            ),
            (
                "selector app=test (30 pods), maxUnavailable 100",
                selector_pods(),
                set(json!({"maxUnavailable": 100, "selector": {"matchLabels": {"app": "test"}}})),
                30,
                0,
            ),
            (
                "more than the image changed, maxUnavailable 100",
                pods(100, 0, 0),
                not_upgradable,
                0,
                100,
            ),
            (
                "maxUnavailable 5% of 5 pods (#1832)",
                pods(5, 0, 0),
                set(json!({"maxUnavailable": "5%"})),
                1,
                0,
            ),
            (
                "maxUnavailable 5, partition 99% of 5 pods",
                pods(5, 0, 0),
                set(json!({"maxUnavailable": 5, "partition": "99%"})),
                1,
                0,
            ),
            (
                "maxUnavailable 5, partition 1% of 5 pods",
                pods(5, 0, 0),
                set(json!({"maxUnavailable": 5, "partition": "1%"})),
                4,
                0,
            ),
        ];
        for (name, pods, set, upgrade, not_upgradable) in cases {
            for seed in [1, 7, 99] {
                let pods = shuffled(pods.clone(), seed);
                let batch = next_batch(&set, &pods);
                assert_eq!(batch.upgrade.len(), upgrade, "{name}");
                assert_eq!(batch.not_upgradable.len(), not_upgradable, "{name}");
            }
        }
    }

    // --- upstream's TestSortNextUpgradePods ------------------------------------------------------

    #[test]
    fn newest_pods_go_first() {
        let p = shuffled(pods(20, 10, 5), 3);
        let batch = next_batch(&set(json!({"maxUnavailable": 10})), &p);
        assert_eq!(
            names(&p, &batch.upgrade),
            ["pod-19", "pod-18", "pod-17", "pod-16", "pod-15"]
        );
    }

    #[test]
    fn pods_that_are_not_ready_go_first_and_cost_nothing() {
        let mut p = pods(20, 10, 5);
        p[10].ready = false;
        p[13].ready = false;
        let p = shuffled(p, 5);
        let batch = next_batch(&set(json!({"maxUnavailable": 10})), &p);
        assert_eq!(
            names(&p, &batch.upgrade),
            [
                "pod-13", "pod-10", "pod-19", "pod-18", "pod-17", "pod-16", "pod-15"
            ]
        );
    }

    #[test]
    fn weight_priority_goes_first() {
        let mut p = pods(20, 10, 2);
        p[15]
            .labels
            .to_mut()
            .insert("test-key".into(), "bar".into());
        p[16]
            .labels
            .to_mut()
            .insert("test-key".into(), "foo".into());
        let p = shuffled(p, 11);
        let s = set(
            json!({"maxUnavailable": 10, "priorityStrategy": {"weightPriority": [
                {"weight": 50, "matchSelector": {"matchLabels": {"test-key": "foo"}}},
                {"weight": 30, "matchSelector": {"matchLabels": {"test-key": "bar"}}},
            ]}}),
        );
        assert_eq!(names(&p, &next_batch(&s, &p).upgrade), ["pod-16", "pod-15"]);
    }

    #[test]
    fn order_priority_goes_first() {
        let mut p = pods(20, 10, 2);
        for pod in &mut p {
            pod.labels.to_mut().insert("key1".into(), "5".into());
        }
        p[17].labels.to_mut().insert("key1".into(), "10".into());
        p[18].labels.to_mut().insert("key1".into(), "20".into());
        let p = shuffled(p, 13);
        let s = set(
            json!({"maxUnavailable": 10, "priorityStrategy": {"orderPriority": [{"orderedKey": "key1"}]}}),
        );
        assert_eq!(names(&p, &next_batch(&s, &p).upgrade), ["pod-18", "pod-17"]);
    }

    // --- rounding ----------------------------------------------------------------------------------

    fn int(n: i32) -> IntOrString {
        IntOrString::Int(n)
    }
    fn pct(s: &str) -> IntOrString {
        IntOrString::String(s.into())
    }

    #[test]
    fn max_unavailable_rounds_percentages_up() {
        let cases = [
            (None, 10, 1),
            (Some(int(0)), 10, 0),
            (Some(int(3)), 10, 3),
            (Some(int(50)), 10, 50),
            (Some(pct("0%")), 10, 0),
            (Some(pct("5%")), 5, 1), // #1832: 0.25 must not become 0
            (Some(pct("1%")), 1, 1),
            (Some(pct("5%")), 0, 0),
            (Some(pct("10%")), 1000, 100),
            (Some(pct("33%")), 3, 1),
            (Some(pct("34%")), 3, 2),
            (Some(pct("100%")), 7, 7),
            (Some(pct("200%")), 7, 14),
            (Some(pct("12.5%")), 10, 2),
            // Exact: 64.4% of 250 is 161; Go's float64 arithmetic gives 162.
            (Some(pct("64.4%")), 250, 161),
        ];
        for (value, matched, want) in cases {
            assert_eq!(
                max_unavailable_count(value.as_ref(), matched),
                Ok(want),
                "{value:?} of {matched}"
            );
        }
    }

    #[test]
    fn partition_rounds_up_but_a_percent_below_100_always_leaves_one_pod_to_upgrade() {
        let cases = [
            (None, 10, 0),
            (Some(int(0)), 10, 0),
            (Some(int(3)), 5, 3),
            (Some(int(10)), 5, 5),
            (Some(pct("0%")), 5, 0),
            (Some(pct("1%")), 5, 1),
            (Some(pct("99%")), 5, 4),
            (Some(pct("99%")), 2, 1),
            (Some(pct("99.99%")), 1000, 999),
            (Some(pct("99.9%")), 1000, 999),
            (Some(pct("100%")), 5, 5),
            (Some(pct("100.0%")), 5, 5),
            (Some(pct("150%")), 5, 5),
            (Some(pct("18%")), 1000, 180),
            (Some(pct("10%")), 1000, 100),
            (Some(pct("15%")), 10, 2),
            // One pod: "keeps at least one old pod" wins over "upgrades at least one".
            (Some(pct("50%")), 1, 1),
            (Some(pct("50%")), 0, 0),
            (Some(pct("64.4%")), 250, 161),
        ];
        for (value, matched, want) in cases {
            assert_eq!(
                partition_count(value.as_ref(), matched),
                Ok(want),
                "{value:?} of {matched}"
            );
        }
    }

    #[test]
    fn malformed_values_are_errors_naming_the_field() {
        for bad in [
            int(-1),
            pct("abc"),
            pct("5"),
            pct("%"),
            pct("1.%"),
            pct(".5%"),
            pct("-5%"),
            pct("1e2%"),
            pct("5 %"),
            pct("1234567890%"),
        ] {
            let err = partition_count(Some(&bad), 10).expect_err("partition");
            assert!(
                err.to_string().contains("updateStrategy.partition"),
                "{err}"
            );
            let err = max_unavailable_count(Some(&bad), 10).expect_err("maxUnavailable");
            assert!(
                err.to_string().contains("updateStrategy.maxUnavailable"),
                "{err}"
            );
        }
    }

    // --- what is held, and why ---------------------------------------------------------------------

    #[test]
    fn not_update_and_paused_upgrade_nothing_but_still_report_not_upgradable_pods() {
        let mut p = pods(4, 0, 0);
        p[3].hash_without_image = Some("other".into());
        let batch = next_batch(&set(json!({"type": "NotUpdate"})), &p);
        assert!(batch.upgrade.is_empty() && batch.queue.is_empty());
        assert_eq!(batch.hold, Some(Hold::NotUpdate));
        assert_eq!(names(&p, &batch.not_upgradable), ["pod-3"]);
        assert_eq!(batch.waiting, 3);

        let batch = next_batch(&set(json!({"paused": true, "maxUnavailable": 4})), &p);
        assert!(batch.upgrade.is_empty());
        assert_eq!(
            batch.queue.len(),
            3,
            "a paused rollout still knows its queue"
        );
        assert_eq!(batch.hold, Some(Hold::Paused));
        assert_eq!(names(&p, &batch.not_upgradable), ["pod-3"]);
    }

    #[test]
    fn pods_awaiting_their_images_stay_queued_and_the_next_ones_go() {
        let mut p = pods(4, 0, 0);
        p[0].awaiting_images = true;
        p[2].awaiting_images = true;
        let batch = next_batch(&set(json!({"maxUnavailable": 4})), &p);
        let queued_and_free: Vec<usize> = batch
            .queue
            .iter()
            .copied()
            .filter(|&i| !p[i].awaiting_images)
            .collect();
        assert_eq!(batch.upgrade, queued_and_free, "the rest, in queue order");
        assert_eq!(names(&p, &batch.upgrade), ["pod-3", "pod-1"]);
        assert_eq!(batch.queue.len(), 4, "they stay in the queue");
        assert_eq!(batch.hold, Some(Hold::PreDownload { pods: 2 }));

        // Waiting pods do not count against maxUnavailable.
        let batch = next_batch(&set(json!({"maxUnavailable": 1})), &p);
        assert_eq!(names(&p, &batch.upgrade), ["pod-3"]);
        assert_eq!(
            batch.hold,
            Some(Hold::MaxUnavailable {
                unavailable: 1,
                max_unavailable: 1
            })
        );

        for pod in &mut p {
            pod.awaiting_images = true;
        }
        let batch = next_batch(&set(json!({"maxUnavailable": 4})), &p);
        assert!(batch.upgrade.is_empty());
        assert_eq!(batch.hold, Some(Hold::PreDownload { pods: 4 }));
    }

    #[test]
    fn a_malformed_strategy_holds_instead_of_upgrading_everything() {
        let p = pods(10, 0, 0);
        // Upstream read a bad partition as 0 and upgraded every pod (within maxUnavailable).
        let batch = next_batch(&set(json!({"partition": "half", "maxUnavailable": 10})), &p);
        assert!(batch.upgrade.is_empty());
        assert!(matches!(
            batch.hold,
            Some(Hold::Invalid(StrategyError::IntOrPercent {
                field: "partition",
                ..
            }))
        ));
        let batch = next_batch(&set(json!({"maxUnavailable": -2})), &p);
        assert!(matches!(
            batch.hold,
            Some(Hold::Invalid(StrategyError::IntOrPercent {
                field: "maxUnavailable",
                ..
            }))
        ));
        let bad_selector =
            json!({"selector": {"matchExpressions": [{"key": "app", "operator": "Near"}]}});
        let batch = next_batch(&set(bad_selector), &p);
        assert!(batch.upgrade.is_empty());
        assert!(matches!(
            batch.hold,
            Some(Hold::Invalid(StrategyError::Selector(_)))
        ));
    }

    #[test]
    fn the_hold_says_what_stopped_the_batch() {
        let p = pods(10, 2, 0);
        let batch = next_batch(&set(json!({"maxUnavailable": 3})), &p);
        assert_eq!(batch.upgrade.len(), 1);
        assert_eq!(
            batch.hold,
            Some(Hold::MaxUnavailable {
                unavailable: 3,
                max_unavailable: 3
            })
        );
        assert_eq!(names(&p, &batch.in_flight), ["pod-0", "pod-1"]);

        let p = pods(10, 2, 2);
        let batch = next_batch(&set(json!({"maxUnavailable": 10, "partition": 5})), &p);
        assert_eq!(batch.upgrade.len(), 3);
        assert_eq!(batch.hold, Some(Hold::Partition { partition: 5 }));

        let batch = next_batch(&set(json!({"maxUnavailable": 10})), &p);
        assert_eq!(batch.upgrade.len(), 8);
        assert_eq!(batch.hold, None);

        let done = pods(3, 3, 3);
        let batch = next_batch(&set(json!({})), &done);
        assert!(batch.upgrade.is_empty() && batch.hold.is_none());
        assert_eq!(batch.waiting, 0);
    }

    #[test]
    fn the_queue_is_every_pod_the_rollout_will_reach_in_order() {
        let p = pods(8, 0, 0);
        let batch = next_batch(&set(json!({"maxUnavailable": 2, "partition": 3})), &p);
        assert_eq!(
            names(&p, &batch.queue),
            ["pod-7", "pod-6", "pod-5", "pod-4", "pod-3"]
        );
        assert_eq!(names(&p, &batch.upgrade), ["pod-7", "pod-6"]);
    }

    #[test]
    fn max_unavailable_zero_moves_only_pods_that_are_not_ready() {
        let mut p = pods(5, 0, 0);
        p[1].ready = false;
        let batch = next_batch(&set(json!({"maxUnavailable": 0})), &p);
        assert_eq!(names(&p, &batch.upgrade), ["pod-1"]);
        let batch = next_batch(&set(json!({"maxUnavailable": "0%"})), &p);
        assert_eq!(names(&p, &batch.upgrade), ["pod-1"]);
    }

    #[test]
    fn a_ready_pod_that_does_not_fit_stops_the_walk() {
        // Priority puts the ready pod-4 before the unready pod-1: the walk stops at pod-4 and
        // pod-1 waits, as upstream (priority order is kept even for free pods).
        let mut p = pods(5, 1, 0);
        p[1].ready = false;
        p[4].labels.to_mut().insert("first".into(), "yes".into());
        let s = set(json!({"priorityStrategy": {"weightPriority": [
            {"weight": 10, "matchSelector": {"matchLabels": {"first": "yes"}}}]}}));
        let batch = next_batch(&s, &p);
        assert!(batch.upgrade.is_empty());
        assert_eq!(names(&p, &batch.queue)[..2], ["pod-4", "pod-1"]);
    }

    // --- which pods are candidates -----------------------------------------------------------------

    #[test]
    fn only_pods_matching_the_update_selector_are_upgraded() {
        let mut p = pods(6, 0, 0);
        for i in [1, 4] {
            p[i].labels.to_mut().insert("canary".into(), "true".into());
        }
        let s = set(json!({"maxUnavailable": 10, "selector": {"matchLabels": {"canary": "true"}}}));
        let batch = next_batch(&s, &p);
        assert_eq!(names(&p, &batch.upgrade), ["pod-4", "pod-1"]);
        assert_eq!(batch.waiting, 2);
    }

    #[test]
    fn pods_going_away_are_ignored_and_never_hold_the_rollout() {
        // #1168: an in-flight pod that is being deleted must not block the next batch.
        let mut p = pods(4, 1, 0);
        p[0].deleting = true;
        p[1].phase = PodPhase::Succeeded;
        p[2].phase = PodPhase::Failed;
        let batch = next_batch(&set(json!({})), &p);
        assert_eq!(batch.matched, 1);
        assert!(batch.in_flight.is_empty());
        assert_eq!(names(&p, &batch.upgrade), ["pod-3"]);
    }

    #[test]
    fn a_pod_without_an_entry_for_this_sidecarset_is_not_upgradable() {
        let mut p = pods(2, 0, 0);
        p[0].hash = None;
        p[0].hash_without_image = None;
        let batch = next_batch(&set(json!({"maxUnavailable": 2})), &p);
        assert_eq!(names(&p, &batch.not_upgradable), ["pod-0"]);
        assert_eq!(names(&p, &batch.upgrade), ["pod-1"]);
    }

    #[test]
    fn a_ready_sidecar_still_switching_images_settles_first() {
        let mut p = pods(3, 0, 0);
        // pod-2: an earlier upgrade kubelet has not applied; the container still runs, ready.
        p[2].sidecars[0].image_running = false;
        // pod-1: stuck on a bad image (not ready): the new version may replace it.
        p[1].sidecars[0].image_running = false;
        p[1].sidecars[0].ready = false;
        let batch = next_batch(&set(json!({"maxUnavailable": 3})), &p);
        assert_eq!(names(&p, &batch.upgrade), ["pod-1", "pod-0"]);
        assert_eq!(batch.waiting, 3);
        assert_eq!(
            classify(&p[2], &CurrentHashes::of(&set(json!({}))), true),
            PodState::Settling
        );
    }

    #[test]
    fn in_flight_means_updated_and_not_ready_or_not_running_the_new_image() {
        let current = CurrentHashes::of(&set(json!({})));
        let mut p = pod(0);
        p.hash = Some(CURRENT.into());
        assert_eq!(
            classify(&p, &current, false),
            PodState::Updated { in_flight: false }
        );
        p.ready = false;
        assert_eq!(
            classify(&p, &current, true),
            PodState::Updated { in_flight: true }
        );
        p.ready = true;
        p.sidecars.push(SidecarView {
            name: "second".into(),
            ready: true,
            image_running: false,
        });
        assert_eq!(
            classify(&p, &current, true),
            PodState::Updated { in_flight: true }
        );
        assert_eq!(classify(&pod(1), &current, false), PodState::NotSelected);
    }

    #[test]
    fn current_hashes_come_from_the_annotations_or_else_the_defaulted_spec() {
        let annotated = set(json!({}));
        assert_eq!(
            CurrentHashes::of(&annotated),
            CurrentHashes {
                hash: CURRENT.into(),
                without_image: WITHOUT_IMAGE.into()
            }
        );
        let mut bare = annotated.clone();
        bare.metadata.annotations = None;
        // As the webhook would write them at the next update: from the defaulted spec.
        let mut defaulted = bare.clone();
        crate::apis::defaults::default_sidecarset(&mut defaulted);
        use crate::sidecar::hash::{sidecarset_hash, sidecarset_hash_without_image};
        assert_eq!(
            CurrentHashes::of(&bare),
            CurrentHashes {
                hash: sidecarset_hash(&defaulted.spec),
                without_image: sidecarset_hash_without_image(&defaulted.spec)
            }
        );
        assert_ne!(
            sidecarset_hash_without_image(&bare.spec),
            sidecarset_hash_without_image(&defaulted.spec),
            "defaulting changes what is hashed (imagePullPolicy…), so the stored spec would not do"
        );
    }

    // --- ordering ------------------------------------------------------------------------------------

    #[test]
    fn active_pods_order_step_by_step() {
        let base = pod(5);
        let with = |f: &dyn Fn(&mut PodView)| {
            let mut p = base.clone();
            f(&mut p);
            p
        };
        let before = |a: &PodView, b: &PodView| active_pods_order(a, b) == Ordering::Less;
        assert!(before(&with(&|p| p.node_name = None), &base));
        assert!(before(&with(&|p| p.node_name = Some(String::new())), &base));
        let pending = with(&|p| p.phase = PodPhase::Pending);
        let unknown = with(&|p| p.phase = PodPhase::Unknown);
        assert!(before(&pending, &unknown) && before(&unknown, &base));
        assert!(before(&with(&|p| p.ready = false), &base));
        let recent = with(&|p| p.ready_since = Some(time(100)));
        let older = with(&|p| p.ready_since = Some(time(50)));
        assert!(before(&base, &recent), "never-ready time first");
        assert!(before(&recent, &older), "ready for less time first");
        assert!(
            !before(
                &with(&|p| {
                    p.ready = false;
                    p.ready_since = Some(time(1))
                }),
                &with(&|p| p.ready = false)
            ) && !before(
                &with(&|p| p.ready = false),
                &with(&|p| {
                    p.ready = false;
                    p.ready_since = Some(time(1))
                })
            ),
            "ready time only counts between ready pods"
        );
        assert!(before(&with(&|p| p.restarts = 3), &base));
        assert!(before(&with(&|p| p.created = None), &base));
        assert!(before(&with(&|p| p.created = Some(time(9))), &base));
        let twin = with(&|p| p.name = "pod-50".into());
        assert!(before(&base, &twin), "equal pods by name");
        let other_ns = with(&|p| p.namespace = "a".into());
        assert!(before(&other_ns, &base), "then by namespace first");
    }

    #[test]
    fn priority_comparisons_match_upstream() {
        // Upstream's TestCompare: `true` means the first pod goes first (or they are equal).
        let weights = json!({"weightPriority": [
            {"weight": 20, "matchSelector": {"matchLabels": {"key": "foo"}}},
            {"weight": 10, "matchSelector": {"matchLabels": {"key": "bar"}}}]});
        let weights3 = |w3: i32| {
            json!({"weightPriority": [
            {"weight": 20, "matchSelector": {"matchLabels": {"key1": "foo"}}},
            {"weight": 10, "matchSelector": {"matchLabels": {"key2": "bar"}}},
            {"weight": w3, "matchSelector": {"matchLabels": {"key3": "baz"}}}]})
        };
        let orders = json!({"orderPriority": [{"orderedKey": "key1"}, {"orderedKey": "key2"}]});
        let cases = [
            (&weights, vec![], vec![], true),
            (&weights, vec![("key", "foo")], vec![("key", "foo")], true),
            (&weights, vec![("key", "bar")], vec![("key", "foo")], false),
            (&weights, vec![], vec![("key", "bar")], false),
            (&weights, vec![], vec![("key", "foo")], false),
            (
                &weights3(15),
                vec![("key1", "foo")],
                vec![("key2", "bar"), ("key3", "baz")],
                false,
            ),
            (
                &weights3(5),
                vec![("key2", "bar"), ("key3", "baz")],
                vec![("key1", "foo")],
                false,
            ),
            (&orders, vec![], vec![], true),
            (&orders, vec![("key1", "o-10")], vec![("key1", "o-5")], true),
            (
                &orders,
                vec![("key1", "o-10")],
                vec![("key1", "o-10")],
                true,
            ),
            (
                &orders,
                vec![("key1", "o-10")],
                vec![("key1", "o-20")],
                false,
            ),
            (
                &orders,
                vec![("key2", "o-20")],
                vec![("key1", "o-10")],
                false,
            ),
            (
                &orders,
                vec![("key2", "o-20")],
                vec![("key2", "o-10")],
                true,
            ),
        ];
        for (n, (strategy, i, j, first)) in cases.into_iter().enumerate() {
            let priority: UpdatePriorityStrategy =
                serde_json::from_value(strategy.clone()).expect("priority");
            let view = |labels: Vec<(&str, &str)>| PodView {
                labels: Cow::Owned(
                    labels
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v.to_owned()))
                        .collect(),
                ),
                ..Default::default()
            };
            let p = [view(i), view(j)];
            let mut order = vec![0, 1];
            sort_by_priority(&priority, &p, &mut order);
            assert_eq!(order == [0, 1], first, "case {n}");
        }
    }

    #[test]
    fn pods_without_any_ordered_key_come_last_as_documented() {
        let priority: UpdatePriorityStrategy =
            serde_json::from_value(json!({"orderPriority": [{"orderedKey": "k"}]})).expect("p");
        let mut p = vec![pod(0), pod(1), pod(2)];
        p[1].labels.to_mut().insert("k".into(), "1".into());
        p[2].labels.to_mut().insert("k".into(), "x".into());
        let mut order = vec![0, 1, 2];
        sort_by_priority(&priority, &p, &mut order);
        assert_eq!(order, [1, 2, 0]);
    }

    #[test]
    fn a_weight_term_that_cannot_be_evaluated_counts_nothing() {
        let priority: UpdatePriorityStrategy = serde_json::from_value(json!({"weightPriority": [
            {"weight": 90, "matchSelector": {"matchExpressions": [{"key": "k", "operator": "Near"}]}},
            {"weight": 10, "matchSelector": {"matchLabels": {"k": "v"}}}]}))
        .expect("p");
        let mut p = vec![pod(0), pod(1)];
        p[1].labels.to_mut().insert("k".into(), "v".into());
        let mut order = vec![0, 1];
        sort_by_priority(&priority, &p, &mut order);
        assert_eq!(order, [1, 0]);
    }

    #[test]
    fn trailing_numbers() {
        for (value, want) in [
            ("5", 5),
            ("sts-10", 10),
            ("o-007", 7),
            ("abc", 0),
            ("", 0),
            ("1a", 0),
            ("x99999999999999999999", 0),
        ] {
            assert_eq!(trailing_number(value), want, "{value}");
        }
    }

    // --- scatter (upstream's updatesort tests) -----------------------------------------------------

    /// `"labelA=AAA,labelB=BBB"` → labels; bare words without `=` are ignored, as upstream's
    /// test helper does. `A`, `B`, `C` abbreviate `labelA=AAA` etc.
    fn labels(spec: &str) -> BTreeMap<String, String> {
        spec.split(',')
            .filter_map(|kv| match kv {
                "A" => Some(("labelA", "AAA")),
                "B" => Some(("labelB", "BBB")),
                "C" => Some(("labelC", "CCC")),
                _ => kv.split_once('='),
            })
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    fn terms(spec: &str) -> Vec<UpdateScatterTerm> {
        labels(spec)
            .into_iter()
            .map(|(key, value)| UpdateScatterTerm { key, value })
            .collect()
    }

    #[test]
    fn scatter_by_one_term_matches_upstream() {
        let term = UpdateScatterTerm {
            key: "labelA".into(),
            value: "AAA".into(),
        };
        let cases: [(&[&str], &[usize]); 11] = [
            (&[""], &[0]),
            (&["A"], &[0]),
            (&["A", "bbb"], &[0, 1]),
            (&["", "", "", "", "A", "A"], &[4, 0, 1, 2, 3, 5]),
            (&["", "", "", "A", "A", "A"], &[3, 0, 1, 4, 2, 5]),
            (&["", "", "", "A", "", "", "A"], &[3, 0, 1, 2, 4, 5, 6]),
            (
                &["", "", "", "", "", "", "A", "A", "A"],
                &[6, 0, 1, 2, 7, 3, 4, 5, 8],
            ),
            (&["", "", "A", "A", "A", "A"], &[2, 3, 0, 4, 1, 5]),
            (
                &["", "", "A", "", "A", "A", "A", "A", "A"],
                &[2, 4, 0, 5, 6, 1, 7, 3, 8],
            ),
            (
                &["", "A", "", "A", "", "", "A", "A", "A"],
                &[1, 0, 3, 2, 6, 4, 7, 5, 8],
            ),
            (
                &["", "", "", "", "ee", "a", "", "A", "A", "A,labelB=BBB"],
                &[7, 0, 1, 2, 3, 8, 4, 5, 6, 9],
            ),
        ];
        for (specs, want) in cases {
            let owned: Vec<_> = specs.iter().map(|s| labels(s)).collect();
            let refs: Vec<_> = owned.iter().collect();
            let all: Vec<usize> = (0..specs.len()).collect();
            let total = refs.iter().filter(|l| has_label(l, &term)).count();
            assert_eq!(
                scatter_by_term(&term, &refs, (total, all.len()), all.clone()),
                want,
                "{specs:?}"
            );
        }
    }

    #[test]
    fn scatter_sort_matches_upstream() {
        // (pod labels, "nil" for an absent pod; terms; expected order of the first pods).
        let cases: Vec<(Vec<&str>, &str, Vec<usize>)> = vec![
            (vec!["A,B"], "A", vec![0]),
            (vec!["", "", "", "", "", ""], "", vec![0, 1, 2, 3, 4, 5]),
            (vec!["", "", "", "", "A", "A"], "A", vec![4, 0, 1, 2, 3, 5]),
            (
                vec!["", "", "", "", "sdfb=eee", "dsf=same", "B", "A", "A", "A,B"],
                "B",
                vec![6, 0, 1, 2, 3, 4, 5, 7, 8, 9],
            ),
            (
                vec!["B", "B", "", "", "A", "A"],
                "A,B",
                vec![0, 4, 2, 3, 5, 1],
            ),
            (
                vec!["", "", "", "B", "A,B", "A"],
                "A,B",
                vec![4, 0, 1, 2, 5, 3],
            ),
            (
                vec!["", "", "", "", "sdfb=eee", "dsf=same", "B", "A", "A", "B"],
                "B,A",
                vec![7, 6, 0, 1, 2, 3, 4, 5, 9, 8],
            ),
            (
                vec!["", "", "", "", "sdfb=eee", "dsf=same", "B", "A", "A", "B"],
                "A,B",
                vec![6, 7, 0, 1, 2, 3, 4, 5, 8, 9],
            ),
            (
                vec!["", "", "", "", "sdfb=eee", "dsf=same", "A,B", "", "", "A,B"],
                "A,B",
                vec![6, 0, 1, 2, 3, 4, 5, 7, 8, 9],
            ),
            (
                vec!["", "", "", "sdfb=eee", "dsf=same", "A,B", "", "", "A,B"],
                "A,B",
                vec![5, 0, 1, 2, 3, 4, 6, 7, 8],
            ),
            (
                vec!["", "", "", "A", "sdfb=eee", "dsf=same", "A,B", "", "", ""],
                "A,B",
                vec![3, 0, 1, 2, 4, 5, 7, 6],
            ),
            (
                vec![
                    "", "", "", "A", "", "", "sdfb=eee", "dsf=same", "A,B", "", "", "A,B",
                ],
                "A,B",
                vec![0, 1, 2, 4, 3, 5, 6, 7, 9, 10, 8],
            ),
            (
                vec![
                    "",
                    "",
                    "",
                    "A",
                    "sdfb=eee,A",
                    "dsf=same",
                    "A,B",
                    "",
                    "",
                    "A,B",
                ],
                "A,B",
                vec![6, 3, 0, 1, 4, 2, 5, 7, 8, 9],
            ),
            (
                vec!["", "A", "A", "sdfb=eee", "dsf=same", "A,B", "", "", "A,B"],
                "A,B",
                vec![5, 1, 0, 3, 2, 4, 6, 7, 8],
            ),
            (
                vec![
                    "A",
                    "",
                    "",
                    "A",
                    "sdfb=eee,A",
                    "dsf=same",
                    "A,B",
                    "",
                    "",
                    "A,B",
                ],
                "A,B",
                vec![1, 0, 2, 3, 5, 4, 7, 6],
            ),
            (
                vec![
                    "", "", "A", "A", "", "A", "sdfb=eee", "dsf=same", "A,B", "", "", "A,B",
                ],
                "A,B",
                vec![0, 2, 1, 4, 3, 6, 7, 5, 9, 10, 8],
            ),
            (
                vec!["", "A", "A", "B", "B", "C", "C", "C", "C", "C"],
                "A,B,C",
                vec![3, 1, 5, 0, 6, 7, 8, 9, 2, 4],
            ),
            (
                vec!["", "A", "A,C", "B,C", "B", "", "", "C", "C", "C"],
                "A,B,C",
                vec![3, 2, 0, 7, 8, 5, 6, 9, 1, 4],
            ),
            (
                vec!["", "", "", "", "A", "A", "A"],
                "A",
                vec![0, 1, 4, 2, 3, 5],
            ),
            (
                vec!["A", "A", "", "", "", "", "", "", "", "A"],
                "A",
                vec![2, 0, 3, 4, 5, 6, 1],
            ),
            (
                vec!["", "A", "A,C", "B,C", "B", "nil", "", "", "C", "C", "C"],
                "A,B,C",
                vec![3, 2, 0, 8, 9, 6, 7, 10, 1, 4],
            ),
        ];
        for (n, (specs, term_spec, want)) in cases.into_iter().enumerate() {
            let owned: Vec<_> = specs.iter().map(|s| labels(s)).collect();
            let refs: Vec<_> = owned.iter().collect();
            let population: Vec<usize> = (0..specs.len()).filter(|&i| specs[i] != "nil").collect();
            // Upstream sorts the first pods (as many as expected, skipping absent ones).
            let order: Vec<usize> = population.iter().copied().take(want.len()).collect();
            // Upstream's terms are in the order written: "B,A" means B first.
            let mut t = Vec::new();
            for part in term_spec.split(',').filter(|p| !p.is_empty()) {
                t.extend(terms(part));
            }
            assert_eq!(
                scatter(&t, &refs, &population, order),
                want,
                "case {n}: {specs:?} {term_spec}"
            );
        }
    }

    #[test]
    fn star_terms_expand_to_every_value_in_sorted_order() {
        let mut p = pods(10, 0, 0);
        for (i, v) in [
            "value-4-0",
            "value-4-1",
            "value-4-2",
            "value-4",
            "value-4",
            "value-4",
        ]
        .iter()
        .enumerate()
        {
            p[i].labels.to_mut().insert("key-4".into(), (*v).to_owned());
        }
        let written = [
            ("key-1", "value-1"),
            ("key-2", "value-2"),
            ("key-1", "value-1"),
            ("key-4", "*"),
            ("key-4", "value-4"),
            ("missing", "*"),
        ]
        .map(|(k, v)| UpdateScatterTerm {
            key: k.into(),
            value: v.into(),
        });
        let got: Vec<String> = expand_scatter_terms(&written, p.iter())
            .into_iter()
            .map(|t| format!("{}={}", t.key, t.value))
            .collect();
        assert_eq!(
            got,
            [
                "key-1=value-1",
                "key-2=value-2",
                "key-4=value-4",
                "key-4=value-4-0",
                "key-4=value-4-1",
                "key-4=value-4-2"
            ]
        );
    }

    #[test]
    fn scatter_spreads_a_zone_across_batches() {
        // 12 pods, 4 in zone a (the newest four would otherwise go first together).
        let mut p = pods(12, 0, 0);
        for (i, pod) in p.iter_mut().enumerate() {
            let zone = if i >= 8 { "a" } else { "b" };
            pod.labels.to_mut().insert("zone".into(), zone.into());
        }
        let s =
            set(json!({"maxUnavailable": 3, "scatterStrategy": [{"key": "zone", "value": "a"}]}));
        let batch = next_batch(&s, &p);
        let zone_a_in_batch = batch
            .upgrade
            .iter()
            .filter(|&&i| p[i].labels["zone"] == "a")
            .count();
        assert_eq!(batch.upgrade.len(), 3);
        assert_eq!(zone_a_in_batch, 1, "{:?}", names(&p, &batch.upgrade));
        // Without scatter the first batch is the three newest: all zone a.
        let plain = next_batch(&set(json!({"maxUnavailable": 3})), &p);
        assert!(plain.upgrade.iter().all(|&i| p[i].labels["zone"] == "a"));
    }

    // --- properties ------------------------------------------------------------------------------------

    fn random_case(rng: &mut Rng) -> (SidecarSet, Vec<PodView<'static>>) {
        let n = rng.below(40);
        let zones = ["a", "b", "c"];
        let pods: Vec<PodView> = (0..n)
            .map(|i| {
                let mut p = pod(i);
                p.namespace = ["default", "other"][rng.below(2)].into();
                p.labels
                    .to_mut()
                    .insert("zone".into(), zones[rng.below(3)].into());
                if rng.chance(30) {
                    p.labels
                        .to_mut()
                        .insert("rank".into(), format!("r-{}", rng.below(5)));
                }
                p.hash = match rng.below(10) {
                    0 => None,
                    1..=4 => Some(CURRENT.into()),
                    _ => Some(OLD.into()),
                };
                if rng.chance(10) {
                    p.hash_without_image = Some("changed".into());
                }
                p.ready = rng.chance(80);
                p.ready_since = rng.chance(50).then(|| time(rng.below(100) as i64));
                p.created = rng.chance(90).then(|| time(rng.below(20) as i64));
                p.restarts = rng.below(3) as i32;
                p.node_name = rng.chance(95).then(|| "n".into());
                p.phase = [
                    PodPhase::Running,
                    PodPhase::Running,
                    PodPhase::Running,
                    PodPhase::Pending,
                    PodPhase::Unknown,
                    PodPhase::Succeeded,
                ][rng.below(6)];
                p.deleting = rng.chance(5);
                p.sidecars = (0..1 + rng.below(2))
                    .map(|c| SidecarView {
                        name: format!("s{c}"),
                        ready: rng.chance(85),
                        image_running: rng.chance(85),
                    })
                    .collect();
                p
            })
            .collect();
        let int_or_pct = |rng: &mut Rng, ints: usize| match rng.below(3) {
            0 => serde_json::Value::Null,
            1 => json!(rng.below(ints)),
            _ => json!(format!("{}%", rng.below(101))),
        };
        let mut strategy = json!({
            "partition": int_or_pct(rng, n + 3),
            "maxUnavailable": int_or_pct(rng, 6),
            "paused": rng.chance(5),
        });
        if rng.chance(5) {
            strategy["type"] = json!("NotUpdate");
        }
        if rng.chance(20) {
            strategy["selector"] = json!({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]});
        }
        match rng.below(4) {
            0 => strategy["priorityStrategy"] = json!({"orderPriority": [{"orderedKey": "rank"}]}),
            1 => {
                strategy["priorityStrategy"] = json!({"weightPriority": [{"weight": 30, "matchSelector": {"matchLabels": {"zone": "c"}}}]})
            }
            _ => {}
        }
        match rng.below(3) {
            0 => strategy["scatterStrategy"] = json!([{"key": "zone", "value": "*"}]),
            1 => {
                strategy["scatterStrategy"] =
                    json!([{"key": "zone", "value": "a"}, {"key": "rank", "value": "r-1"}])
            }
            _ => {}
        }
        (set(strategy), pods)
    }

    #[test]
    fn property_the_batch_respects_max_unavailable_and_partition() {
        let mut rng = Rng(0x5eed_cafe_f00d_1234);
        let mut moved = 0;
        for case in 0..3000 {
            let (set, pods) = random_case(&mut rng);
            let strategy = &set.spec.update_strategy;
            let batch = next_batch(&set, &pods);
            let current = CurrentHashes::of(&set);
            let active: Vec<&PodView> = pods.iter().filter(|p| p.is_active()).collect();
            let matched = active.len();
            let updated = active
                .iter()
                .filter(|p| p.hash.as_deref() == Some(CURRENT))
                .count();
            let in_flight = active
                .iter()
                .filter(|p| {
                    p.hash.as_deref() == Some(CURRENT)
                        && !(p.ready && p.sidecars.iter().all(|s| s.image_running))
                })
                .count();
            let selected = |p: &PodView| match &strategy.selector {
                None => true,
                Some(s) => selector_matches(s, &p.labels).expect("valid selector"),
            };
            let candidates: Vec<usize> = (0..pods.len())
                .filter(|&i| {
                    classify(&pods[i], &current, selected(&pods[i])) == PodState::Candidate
                })
                .collect();
            let ctx = format!("case {case}: {:?}", strategy);

            assert_eq!(batch.matched, matched, "{ctx}");
            assert_eq!(batch.in_flight.len(), in_flight, "{ctx}");
            assert!(
                batch.upgrade.len() <= batch.queue.len() && batch.queue.starts_with(&batch.upgrade),
                "{ctx}"
            );
            let mut distinct = batch.queue.clone();
            distinct.sort_unstable();
            distinct.dedup();
            assert_eq!(distinct.len(), batch.queue.len(), "{ctx}");
            for &i in &batch.queue {
                assert!(
                    candidates.contains(&i),
                    "{ctx}: {} is not a candidate",
                    pods[i].key()
                );
            }

            if strategy.paused || strategy.type_ == Some(SidecarSetUpdateStrategyType::NotUpdate) {
                assert!(batch.upgrade.is_empty(), "{ctx}");
                continue;
            }
            let max =
                max_unavailable_count(strategy.max_unavailable.as_ref(), matched).expect("valid");
            let partition = partition_count(strategy.partition.as_ref(), matched).expect("valid");
            if let Some(IntOrString::Int(n)) = &strategy.partition {
                assert_eq!(partition, (*n as usize).min(matched), "{ctx}");
            }
            if let Some(IntOrString::String(s)) = &strategy.max_unavailable
                && s != "0%"
                && matched > 0
            {
                assert!(
                    max >= 1,
                    "{ctx}: #1832, a percent rounded a rollout to zero"
                );
            }

            // maxUnavailable: ready pods taken only while fewer than max are in flight.
            let ready_taken = batch.upgrade.iter().filter(|&&i| pods[i].ready).count();
            assert!(
                ready_taken <= max.saturating_sub(in_flight),
                "{ctx}: {ready_taken} ready pods taken, {in_flight} in flight, max {max}"
            );
            // partition: the batch never leaves fewer than `partition` pods on the old version.
            assert!(
                batch.upgrade.len() <= (matched - updated).saturating_sub(partition),
                "{ctx}"
            );
            assert_eq!(
                batch.queue.len(),
                candidates.len().saturating_sub(partition),
                "{ctx}"
            );
            // Progress: with room under both limits, something always moves.
            if candidates.len() > partition && in_flight == 0 && max >= 1 {
                assert!(!batch.upgrade.is_empty(), "{ctx}: stalled");
            }
            moved += usize::from(!batch.upgrade.is_empty());

            // The order of the input does not matter.
            let reordered = shuffled(pods.clone(), case as u64 + 1);
            let again = next_batch(&set, &reordered);
            let keys =
                |ps: &[PodView], is: &[usize]| is.iter().map(|&i| ps[i].key()).collect::<Vec<_>>();
            assert_eq!(
                keys(&pods, &batch.upgrade),
                keys(&reordered, &again.upgrade),
                "{ctx}"
            );
            assert_eq!(
                keys(&pods, &batch.queue),
                keys(&reordered, &again.queue),
                "{ctx}"
            );
            assert_eq!(batch.hold, again.hold, "{ctx}");
        }
        assert!(
            moved > 500,
            "the generator must exercise real batches ({moved})"
        );
    }
}
