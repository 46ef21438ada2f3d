//! Which SidecarSets apply to a pod at creation.
//!
//! A SidecarSet applies when injection is not paused, the pod's namespace matches its
//! namespace selector (v1alpha1's `spec.namespace` included, see
//! [`SidecarSetSpec::effective_namespace_selector`]), and the pod matches its `selector`. Among
//! those, a canary SidecarSet (`apps.kruise.io/sidecarset-canary: "true"` with
//! `apps.kruise.io/sidecarset-base: <B>`) takes the place of its base `B` for that pod.
//!
//! Label selectors are evaluated exactly as Kubernetes does: every `matchLabels` pair and every
//! `matchExpressions` requirement must hold; `In` needs the key present with a listed value,
//! `NotIn` holds when the key is absent or its value is not listed, `Exists`/`DoesNotExist` test
//! presence; an empty selector matches everything. The pod selector is stricter, as upstream's
//! webhook is: an unset or empty `spec.selector` matches no pod (validation requires one, and a
//! SidecarSet must never be injected into every pod of a cluster by accident). An unknown
//! operator is an error naming the SidecarSet rather than a silent non-match, so the webhook can
//! say why.
//!
//! Deliberate differences from upstream: the SidecarSets are returned in name order (upstream
//! follows its informer's order, which is unspecified); an invalid `namespaceSelector` is an
//! error like an invalid `selector` (upstream silently skips the SidecarSet); and the namespace
//! label `kubernetes.io/metadata.name` is assumed from the pod's namespace when the caller's labels
//! lack it (the apiserver always sets it, so this only makes the function total).
//!
//! [`SidecarSetSpec::effective_namespace_selector`]:
//! kruise_rs_api::sidecarset::SidecarSetSpec::effective_namespace_selector

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Resource;

use kruise_rs_api::sidecarset::SidecarSet;
use kruise_rs_api::well_known::{NAMESPACE_NAME_LABEL, SIDECARSET_BASE, SIDECARSET_CANARY};

/// Why a label selector cannot be evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{operator:?} is not a valid label selector operator (key {key:?})")]
pub struct SelectorError {
    pub key: String,
    pub operator: String,
}

/// Why a SidecarSet cannot be matched against a pod.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("SidecarSet {sidecarset}: spec.{field} is invalid: {source}")]
pub struct MatchError {
    pub sidecarset: String,
    pub field: &'static str,
    #[source]
    pub source: SelectorError,
}

/// A map of labels (or annotations) as decisions read it: the API types' `BTreeMap`, or the
/// controllers' interned `Labels` (whose `metadata.labels` is empty, so callers pass the map
/// they mean rather than a whole object).
pub trait LabelLookup {
    fn label(&self, key: &str) -> Option<&str>;
}

impl LabelLookup for BTreeMap<String, String> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

/// Whether `labels` satisfy `selector`, with Kubernetes' semantics (empty matches everything).
pub fn selector_matches(
    selector: &LabelSelector,
    labels: &(impl LabelLookup + ?Sized),
) -> Result<bool, SelectorError> {
    let mut matches = true;
    for (key, value) in selector.match_labels.iter().flatten() {
        matches &= labels.label(key) == Some(value.as_str());
    }
    // Every requirement is checked even after a miss, so a bad operator is always reported.
    for req in selector.match_expressions.iter().flatten() {
        let values = req.values.as_deref().unwrap_or_default();
        let actual = labels.label(&req.key);
        let listed = |v: &str| values.iter().any(|listed| listed == v);
        let holds = match req.operator.as_str() {
            "In" => actual.is_some_and(listed),
            "NotIn" => actual.is_none_or(|v| !listed(v)),
            "Exists" => actual.is_some(),
            "DoesNotExist" => actual.is_none(),
            other => {
                return Err(SelectorError {
                    key: req.key.clone(),
                    operator: other.to_owned(),
                });
            }
        };
        matches &= holds;
    }
    Ok(matches)
}

/// Whether a selector has no terms at all.
pub fn selector_is_empty(selector: &LabelSelector) -> bool {
    selector
        .match_labels
        .as_ref()
        .is_none_or(BTreeMap::is_empty)
        && selector
            .match_expressions
            .as_ref()
            .is_none_or(Vec::is_empty)
}

/// Whether a pod is still a candidate for injection: not finished and not being deleted
/// (Kubernetes' `IsPodActive`).
pub fn pod_is_active(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    pod.metadata.deletion_timestamp.is_none() && !matches!(phase, Some("Succeeded" | "Failed"))
}

/// The pod's namespace as the webhook sees it: an unset namespace is `default`. `pod` is a
/// `Pod` or the controllers' `PodSummary`.
pub fn pod_namespace(pod: &impl Resource) -> &str {
    match pod.meta().namespace.as_deref() {
        Some(ns) if !ns.is_empty() => ns,
        _ => "default",
    }
}

/// Whether `set` selects `pod`, given the labels of the pod's Namespace object.
pub(crate) fn sidecarset_matches_pod(
    set: &SidecarSet,
    pod: &Pod,
    namespace_labels: &BTreeMap<String, String>,
) -> Result<bool, MatchError> {
    let empty = BTreeMap::new();
    let pod_labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    sidecarset_matches(set, pod_namespace(pod), pod_labels, namespace_labels)
}

/// Whether `set` selects a pod in `namespace` (as [`pod_namespace`] reads it) labelled
/// `pod_labels`, given the labels of the pod's Namespace object.
pub fn sidecarset_matches(
    set: &SidecarSet,
    namespace: &str,
    pod_labels: &(impl LabelLookup + ?Sized),
    namespace_labels: &BTreeMap<String, String>,
) -> Result<bool, MatchError> {
    let name = set.metadata.name.as_deref().unwrap_or_default();
    let error = |field, source| MatchError {
        sidecarset: name.to_owned(),
        field,
        source,
    };
    if let Some(ns_selector) = set.spec.effective_namespace_selector() {
        let mut labels = namespace_labels.clone();
        labels
            .entry(NAMESPACE_NAME_LABEL.to_owned())
            .or_insert_with(|| namespace.to_owned());
        if !selector_matches(&ns_selector, &labels).map_err(|e| error("namespaceSelector", e))? {
            return Ok(false);
        }
    }
    let Some(selector) = set.spec.selector.as_ref() else {
        return Ok(false);
    };
    let matched = selector_matches(selector, pod_labels).map_err(|e| error("selector", e))?;
    Ok(matched && !selector_is_empty(selector))
}

/// The base SidecarSet a canary SidecarSet replaces, if `set` is a canary.
pub(crate) fn canary_base(set: &SidecarSet) -> Option<&str> {
    let annotations = set.metadata.annotations.as_ref()?;
    let is_canary = annotations.get(SIDECARSET_CANARY).map(String::as_str) == Some("true");
    let base = annotations.get(SIDECARSET_BASE).map(String::as_str)?;
    (is_canary && !base.is_empty()).then_some(base)
}

/// The SidecarSets to inject into a new pod, in name order: not paused, matching the pod and its
/// namespace, with every base named by a matching canary removed.
pub(crate) fn sidecarsets_for_pod<'a>(
    candidates: impl IntoIterator<Item = &'a SidecarSet>,
    pod: &Pod,
    namespace_labels: &BTreeMap<String, String>,
) -> Result<Vec<&'a SidecarSet>, MatchError> {
    let mut matched = Vec::new();
    for set in candidates {
        if set.spec.injection_strategy.paused {
            continue;
        }
        if sidecarset_matches_pod(set, pod, namespace_labels)? {
            matched.push(set);
        }
    }
    let bases: BTreeSet<&str> = matched.iter().filter_map(|s| canary_base(s)).collect();
    matched.retain(|s| !bases.contains(s.metadata.name.as_deref().unwrap_or_default()));
    matched.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    matched.dedup_by(|a, b| a.metadata.name == b.metadata.name);
    Ok(matched)
}

#[cfg(test)]
mod tests;
