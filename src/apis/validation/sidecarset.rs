//! SidecarSet admission validation (upstream: `pkg/webhook/sidecarset/validating`).
//!
//! [`validate_create`] and [`validate_update`] check one SidecarSet, after defaulting
//! ([`crate::apis::defaults::default_sidecarset`]), against every rule of upstream's validating
//! webhook, given what the caller looked up in the cluster: the other SidecarSets, this
//! SidecarSet's ControllerRevisions and the patch-metadata whitelist ([`SidecarSetContext`]).
//!
//! Rules, in the order they are checked:
//! 1. **metadata**: name required, an RFC 1123 label (≤ 63 characters); labels and annotations
//!    valid; no namespace (cluster-scoped).
//! 2. **canary** (`apps.kruise.io/sidecarset-canary: "true"` with `apps.kruise.io/sidecarset-base`):
//!    the base is not the SidecarSet itself, does not change on update, exists among the others
//!    and is not a canary itself; a canary uses `updateStrategy.type: NotUpdate`.
//! 3. **native sidecars**: an init container with `restartPolicy: Always` cannot be upgraded in
//!    place, so its SidecarSet must use `NotUpdate` (the default is `RollingUpdate`).
//! 4. **selectors**: `selector` required, valid, non-empty; `namespaceSelector` valid and
//!    non-empty when set; v1alpha1's `namespace` an RFC 1123 label when set.
//! 5. **injectionStrategy.revision**: `revisionName` or `customVersion` set, and naming one of
//!    this SidecarSet's ControllerRevisions (`revisionName` wins when both are set, as upstream).
//! 6. **updateStrategy** (RollingUpdate only): `partition` and `selector` not together; selector
//!    valid and non-empty; `partition`/`maxUnavailable` non-negative integers or percents;
//!    `priorityStrategy` one of weight/order, weights 0–100, non-empty valid selectors,
//!    non-empty ordered keys; `scatterStrategy` non-empty keys, no duplicate key/value.
//! 7. **containers**: at least one container or init container; per container: no `HotUpgrade`
//!    and no `resourcesPolicy` (not supported by kruise-rs yet: denied, never ignored); image a
//!    valid reference; `transferEnv[].sourceContainerNameFrom.fieldRef` `v1` and
//!    `metadata.labels['k']` / `metadata.annotations['k']` with a valid key; then Kubernetes' pod
//!    rules for containers, init containers and volumes ([`super::pod_spec`]).
//!    (`podInjectPolicy`, `shareVolumePolicy.type`, the update strategy type and the revision
//!    policy are enums in the Rust types: an unknown value cannot be deserialized, and
//!    [`validate_raw_enums`] reports it in Kubernetes' form from the raw JSON.)
//! 8. **patchPodMetadata**: allowed by the whitelist policy; each entry has annotations, valid
//!    keys, and, for `MergePatchJson`, JSON values; no key in two entries.
//! 9. **update**: no container added or renamed (removal is fine); a container's
//!    `upgradeStrategy.upgradeType` does not change.
//! 10. **conflicts** with every other SidecarSet whose namespace selector and pod selector may
//!     select the same pods (upstream's overlap test, [`super::is_selector_overlapping`]), except
//!     a canary and its base: no shared container or init container name, no shared volume name
//!     with a different definition, no shared patched annotation key where either side uses
//!     `Overwrite`.
//!
//! Deliberate differences from upstream are listed on each rule's function; in short: every
//! error is reported (upstream stops at the first error of some groups and skips the conflict
//! checks when anything else failed), paths name the exact field, names are RFC 1123 labels (the
//! apiserver's own rule for the name joined with upstream's), a canary's base may be updated
//! while the canary exists, container names clash across containers and init containers,
//! `MergePatchJson` values must be JSON, images must parse, and an update that leaves the spec,
//! labels and canary annotations alone is not re-validated against the cluster (so a
//! ControllerRevision pruned by history, or a conflicting SidecarSet created in a race, never
//! blocks a metadata-only update).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::Container;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::core::{Selector, SelectorExt};
use serde::Deserialize;

use super::pod_spec::{split_subscripted_path, validate_pod_parts};
use super::{
    FieldError, ValidationErrors, check_raw_enum, child, dns1123_label_errors, index, invalid_each,
    is_selector_overlapping, key, qualified_name_errors, selector_is_empty, validate_annotations,
    validate_int_or_percent, validate_label_selector, validate_labels,
};
use crate::apis::sidecarset::{
    SidecarContainer, SidecarContainerUpgradeType, SidecarSet, SidecarSetPatchPolicy,
    SidecarSetSpec, SidecarSetUpdateStrategy, SidecarSetUpdateStrategyType,
};
use crate::apis::well_known::{
    SIDECARSET_BASE, SIDECARSET_CANARY, SIDECARSET_CUSTOM_VERSION_LABEL,
};
use crate::image::ImageRef;

/// Name of the ConfigMap (in the manager's namespace) holding the patch-metadata whitelist.
pub const WHITELIST_CONFIGMAP: &str = "kruise-configuration";
/// Key of the whitelist in [`WHITELIST_CONFIGMAP`].
pub const WHITELIST_CONFIGMAP_KEY: &str = "SidecarSet_PatchPodMetadata_WhiteList";

// --- Context ------------------------------------------------------------------------------------

/// What the caller looked up in the cluster for one validation.
#[derive(Clone, Copy, Debug)]
pub struct SidecarSetContext<'a> {
    /// The ControllerRevisions of the SidecarSet being validated (those labelled
    /// `kruise.io/sidecarset-name: <name>`), for `injectionStrategy.revision`.
    pub revisions: &'a [KnownRevision],
    /// Which annotations `patchPodMetadata` may write.
    pub patch_pod_metadata: &'a PatchPodMetadataPolicy,
}

static NOT_CONFIGURED: PatchPodMetadataPolicy = PatchPodMetadataPolicy::NotConfigured;

impl Default for SidecarSetContext<'_> {
    /// No revisions, no whitelist.
    fn default() -> Self {
        Self {
            revisions: &[],
            patch_pod_metadata: &NOT_CONFIGURED,
        }
    }
}

/// A ControllerRevision of the SidecarSet, as `injectionStrategy.revision` refers to it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KnownRevision {
    pub name: String,
    /// Its `apps.kruise.io/sidecarset-custom-version` label.
    pub custom_version: Option<String>,
}

impl KnownRevision {
    pub fn from_controller_revision(revision: &ControllerRevision) -> Self {
        Self {
            name: revision.metadata.name.clone().unwrap_or_default(),
            custom_version: revision
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SIDECARSET_CUSTOM_VERSION_LABEL))
                .cloned(),
        }
    }
}

/// Which pod annotations a SidecarSet's `patchPodMetadata` may write.
///
/// Writing pod annotations is a privilege (other controllers act on them), so upstream refuses
/// `patchPodMetadata` unless the administrator whitelisted the keys in the ConfigMap
/// [`WHITELIST_CONFIGMAP`] / [`WHITELIST_CONFIGMAP_KEY`], or turned on the feature gate
/// `SidecarSetPatchPodMetadataDefaultsAllowed` (off by default). kruise-rs keeps that default,
/// [`PatchPodMetadataPolicy::NotConfigured`], because an OpenKruise administrator relies on it:
/// a cluster migrating from upstream either has the ConfigMap (read it into
/// [`PatchPodMetadataPolicy::Whitelist`]) or the gate ([`PatchPodMetadataPolicy::AllowAll`]), and
/// one that has neither never allowed patches.
#[derive(Clone, Debug, Default)]
pub enum PatchPodMetadataPolicy {
    /// No whitelist: `patchPodMetadata` is refused.
    #[default]
    NotConfigured,
    /// Any annotation may be patched (upstream's feature gate).
    AllowAll,
    /// The whitelist's rules.
    Whitelist(Vec<WhitelistRule>),
}

/// One whitelist rule: the SidecarSets it applies to and the annotation keys they may patch.
#[derive(Clone, Debug, Default)]
pub struct WhitelistRule {
    /// Matched against the SidecarSet's labels; `None` applies to every SidecarSet.
    pub selector: Option<LabelSelector>,
    pub allowed_annotation_keys: Vec<AnnotationKeyPattern>,
}

/// An allowed-annotation-key expression with its matcher.
///
/// Upstream's expressions are Go regular expressions, matched unanchored (`key.*` allows
/// `my-key-1`). This crate does not depend on a regex engine, so the caller compiles them (the
/// `regex` crate has the same syntax and unanchored `is_match`) and hands over the matcher.
#[derive(Clone)]
pub struct AnnotationKeyPattern {
    expression: String,
    matcher: Arc<dyn Fn(&str) -> bool + Send + Sync>,
}

impl AnnotationKeyPattern {
    /// A pattern for `expression`, matched by `matcher`.
    pub fn new(
        expression: impl Into<String>,
        matcher: impl Fn(&str) -> bool + Send + Sync + 'static,
    ) -> Self {
        Self {
            expression: expression.into(),
            matcher: Arc::new(matcher),
        }
    }

    /// A pattern allowing exactly `key`.
    pub fn exact(key: impl Into<String>) -> Self {
        let key = key.into();
        let wanted = key.clone();
        Self::new(key, move |k| k == wanted)
    }

    pub fn expression(&self) -> &str {
        &self.expression
    }

    pub fn matches(&self, key: &str) -> bool {
        (self.matcher)(key)
    }
}

impl fmt::Debug for AnnotationKeyPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("AnnotationKeyPattern")
            .field(&self.expression)
            .finish()
    }
}

/// The whitelist's JSON shape in the ConfigMap (upstream's `SidecarSetPatchMetadataWhiteList`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WhitelistJson {
    #[serde(default)]
    rules: Vec<WhitelistRuleJson>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WhitelistRuleJson {
    #[serde(default)]
    selector: Option<LabelSelector>,
    #[serde(default)]
    allowed_annotation_key_exprs: Vec<String>,
}

/// Why the whitelist in the ConfigMap cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum WhitelistError {
    #[error("{WHITELIST_CONFIGMAP_KEY} is not valid JSON of the form {{\"rules\": [...]}}: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{WHITELIST_CONFIGMAP_KEY} rule {rule}: expression {expression:?}: {reason}")]
    Expression {
        rule: usize,
        expression: String,
        reason: String,
    },
}

impl PatchPodMetadataPolicy {
    /// Reads the whitelist from the ConfigMap value `json`, compiling each expression with
    /// `compile` (typically `regex::Regex::new`, wrapped into a matcher).
    pub fn from_whitelist_json<F, M>(json: &str, compile: F) -> Result<Self, WhitelistError>
    where
        F: Fn(&str) -> Result<M, String>,
        M: Fn(&str) -> bool + Send + Sync + 'static,
    {
        let parsed: WhitelistJson = serde_json::from_str(json)?;
        let mut rules = Vec::with_capacity(parsed.rules.len());
        for (i, rule) in parsed.rules.into_iter().enumerate() {
            let mut keys = Vec::with_capacity(rule.allowed_annotation_key_exprs.len());
            for expression in rule.allowed_annotation_key_exprs {
                let matcher =
                    compile(&expression).map_err(|reason| WhitelistError::Expression {
                        rule: i,
                        expression: expression.clone(),
                        reason,
                    })?;
                keys.push(AnnotationKeyPattern::new(expression, matcher));
            }
            rules.push(WhitelistRule {
                selector: rule.selector,
                allowed_annotation_keys: keys,
            });
        }
        Ok(Self::Whitelist(rules))
    }
}

// --- Entry points -------------------------------------------------------------------------------

/// Validates a SidecarSet being created. `others` are the SidecarSets in the cluster (the one
/// being validated may be among them; it is skipped by name).
pub fn validate_create<'a>(
    new: &SidecarSet,
    others: impl IntoIterator<Item = &'a SidecarSet>,
    ctx: &SidecarSetContext<'_>,
) -> Result<(), ValidationErrors> {
    let others: Vec<&SidecarSet> = others.into_iter().collect();
    let mut errs = Vec::new();
    validate_metadata(new, &mut errs);
    validate_canary(new, None, &others, &mut errs);
    validate_spec(new, ctx, &mut errs);
    validate_conflicts(new, &others, &mut errs);
    ValidationErrors(errs).into_result()
}

/// Validates an update from `old` to `new`: [`validate_create`]'s rules plus the update rules.
///
/// When the update leaves the spec, the labels and the canary annotations as they were (a
/// finalizer, another annotation, the hash annotations), only the metadata is checked: the rest
/// was admitted before, and what it depends on in the cluster (revisions, other SidecarSets)
/// may have changed since without the SidecarSet becoming any less valid.
pub fn validate_update<'a>(
    old: &SidecarSet,
    new: &SidecarSet,
    others: impl IntoIterator<Item = &'a SidecarSet>,
    ctx: &SidecarSetContext<'_>,
) -> Result<(), ValidationErrors> {
    let mut errs = Vec::new();
    validate_metadata(new, &mut errs);
    if old.spec == new.spec
        && old.metadata.labels == new.metadata.labels
        && annotation(old, SIDECARSET_CANARY) == annotation(new, SIDECARSET_CANARY)
        && annotation(old, SIDECARSET_BASE) == annotation(new, SIDECARSET_BASE)
    {
        return ValidationErrors(errs).into_result();
    }
    let others: Vec<&SidecarSet> = others.into_iter().collect();
    validate_canary(new, Some(old), &others, &mut errs);
    validate_spec(new, ctx, &mut errs);
    validate_container_changes(old, new, &mut errs);
    validate_conflicts(new, &others, &mut errs);
    ValidationErrors(errs).into_result()
}

/// Reports, from a SidecarSet's raw JSON, enum fields the typed struct cannot hold, in
/// Kubernetes' form. Run it when deserializing the request fails (or before).
pub fn validate_raw_enums(raw: &serde_json::Value) -> Result<(), ValidationErrors> {
    const INJECT: [&str; 2] = ["BeforeAppContainer", "AfterAppContainer"];
    const UPGRADE: [&str; 2] = ["ColdUpgrade", "HotUpgrade"];
    const SHARE: [&str; 2] = ["enabled", "disabled"];
    let mut errs = Vec::new();
    for list in ["containers", "initContainers"] {
        let p = |field: &str| format!("spec.{list}[*].{field}");
        errs.extend(check_raw_enum(raw, &p("podInjectPolicy"), &INJECT));
        errs.extend(check_raw_enum(
            raw,
            &p("upgradeStrategy.upgradeType"),
            &UPGRADE,
        ));
        errs.extend(check_raw_enum(raw, &p("shareVolumePolicy.type"), &SHARE));
        errs.extend(check_raw_enum(
            raw,
            &p("shareVolumeDevicePolicy.type"),
            &SHARE,
        ));
        errs.extend(check_raw_enum(
            raw,
            &p("resourcesPolicy.targetContainersMode"),
            &["sum", "max"],
        ));
    }
    errs.extend(check_raw_enum(
        raw,
        "spec.updateStrategy.type",
        &["RollingUpdate", "NotUpdate"],
    ));
    errs.extend(check_raw_enum(
        raw,
        "spec.injectionStrategy.revision.policy",
        &["Always", "Partial"],
    ));
    errs.extend(check_raw_enum(
        raw,
        "spec.patchPodMetadata[*].patchPolicy",
        &["Retain", "Overwrite", "MergePatchJson"],
    ));
    ValidationErrors(errs).into_result()
}

// --- Helpers ------------------------------------------------------------------------------------

fn annotation<'s>(set: &'s SidecarSet, name: &str) -> Option<&'s str> {
    set.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(name))
        .map(String::as_str)
}

/// The base's name when `set` is a canary SidecarSet (upstream's `IsCanarySidecarSet`).
pub fn canary_base(set: &SidecarSet) -> Option<&str> {
    match (
        annotation(set, SIDECARSET_CANARY),
        annotation(set, SIDECARSET_BASE),
    ) {
        (Some("true"), Some(base)) if !base.is_empty() => Some(base),
        _ => None,
    }
}

fn name(set: &SidecarSet) -> &str {
    set.metadata.name.as_deref().unwrap_or_default()
}

fn update_type(strategy: &SidecarSetUpdateStrategy) -> SidecarSetUpdateStrategyType {
    strategy
        .type_
        .unwrap_or(SidecarSetUpdateStrategyType::RollingUpdate)
}

fn is_native_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

fn upgrade_type(c: &SidecarContainer) -> SidecarContainerUpgradeType {
    c.upgrade_strategy
        .as_ref()
        .and_then(|s| s.upgrade_type)
        .unwrap_or(SidecarContainerUpgradeType::ColdUpgrade)
}

// --- 1. Metadata --------------------------------------------------------------------------------

/// Upstream requires `^[a-zA-Z0-9\-]+$` and ≤ 63 characters; the apiserver requires custom
/// resource names to be RFC 1123 subdomains. A name passing both is an RFC 1123 label, which is
/// what we check, so the message names the rule that really applies.
fn validate_metadata(set: &SidecarSet, errs: &mut Vec<FieldError>) {
    let meta = &set.metadata;
    match meta.name.as_deref() {
        None | Some("") => errs.push(FieldError::required(
            "metadata.name",
            "name or generateName is required",
        )),
        Some(n) => errs.extend(invalid_each("metadata.name", n, dns1123_label_errors(n))),
    }
    if meta.namespace.as_deref().is_some_and(|ns| !ns.is_empty()) {
        errs.push(FieldError::forbidden(
            "metadata.namespace",
            "not allowed on this type",
        ));
    }
    if let Some(labels) = &meta.labels {
        errs.extend(validate_labels(labels, "metadata.labels"));
    }
    if let Some(annotations) = &meta.annotations {
        errs.extend(validate_annotations(annotations, "metadata.annotations"));
    }
}

// --- 2. Canary ----------------------------------------------------------------------------------

/// Upstream reports all of these at path `metadata` with the whole annotation map as value; we
/// name the annotation (or the strategy type). An update that makes a SidecarSet a canary, or
/// gives it another base, is refused, as upstream does.
fn validate_canary(
    set: &SidecarSet,
    old: Option<&SidecarSet>,
    others: &[&SidecarSet],
    errs: &mut Vec<FieldError>,
) {
    let Some(base) = canary_base(set) else {
        return;
    };
    let base_path = key("metadata.annotations", SIDECARSET_BASE);
    if base == name(set) {
        errs.push(FieldError::invalid(
            &base_path,
            base,
            "base sidecarSet cannot be itself",
        ));
    }
    if let Some(old) = old {
        let old_base = annotation(old, SIDECARSET_BASE).unwrap_or_default();
        if old_base != base {
            errs.push(FieldError::invalid(
                &base_path,
                base,
                format!("field is immutable (was {:?})", old_base),
            ));
        }
    }
    match others.iter().find(|o| name(o) == base) {
        None => errs.push(FieldError::not_found(
            &base_path,
            base,
            "the base SidecarSet does not exist",
        )),
        Some(found) if canary_base(found).is_some() => errs.push(FieldError::invalid(
            &base_path,
            base,
            "base sidecarSet cannot be canary",
        )),
        Some(_) => {}
    }
    if update_type(&set.spec.update_strategy) != SidecarSetUpdateStrategyType::NotUpdate {
        errs.push(FieldError::invalid(
            "spec.updateStrategy.type",
            "RollingUpdate",
            "RollingUpdate is not supported for canary sidecarSet: use NotUpdate",
        ));
    }
}

// --- 3–8. Spec ----------------------------------------------------------------------------------

fn validate_spec(set: &SidecarSet, ctx: &SidecarSetContext<'_>, errs: &mut Vec<FieldError>) {
    let spec = &set.spec;
    validate_native_sidecars(spec, errs);
    validate_selectors(spec, errs);
    validate_injection_revision(spec, ctx, errs);
    if update_type(&spec.update_strategy) == SidecarSetUpdateStrategyType::RollingUpdate {
        validate_update_strategy(&spec.update_strategy, "spec.updateStrategy", errs);
    }
    validate_containers(spec, errs);
    validate_patch_pod_metadata(set, ctx.patch_pod_metadata, errs);
}

/// Upstream reports one `Required` error at `spec.updateStrategy` per native sidecar; we report
/// one error at the type, naming them.
fn validate_native_sidecars(spec: &SidecarSetSpec, errs: &mut Vec<FieldError>) {
    if update_type(&spec.update_strategy) != SidecarSetUpdateStrategyType::RollingUpdate {
        return;
    }
    let native: Vec<&str> = spec
        .init_containers
        .iter()
        .filter(|c| is_native_sidecar(&c.container))
        .map(|c| c.container.name.as_str())
        .collect();
    if !native.is_empty() {
        errs.push(FieldError::invalid(
            "spec.updateStrategy.type",
            "RollingUpdate",
            format!(
                "the initContainer in-place upgrade is not currently supported: init containers {:?} have restartPolicy Always (native sidecars); use NotUpdate",
                native
            ),
        ));
    }
}

/// Valid and non-empty (upstream's `validateSelector`, minus its duplicate report of the same
/// problem from a second parser).
fn validate_nonempty_selector(selector: &LabelSelector, path: &str, errs: &mut Vec<FieldError>) {
    errs.extend(validate_label_selector(selector, path));
    if selector_is_empty(selector) {
        errs.push(FieldError::invalid_json(
            path,
            selector,
            "empty selector is not valid for sidecarset.",
        ));
    }
}

fn validate_selectors(spec: &SidecarSetSpec, errs: &mut Vec<FieldError>) {
    match &spec.selector {
        None => errs.push(FieldError::required(
            "spec.selector",
            "no selector defined for SidecarSet",
        )),
        Some(selector) => validate_nonempty_selector(selector, "spec.selector", errs),
    }
    if let Some(selector) = &spec.namespace_selector {
        validate_nonempty_selector(selector, "spec.namespaceSelector", errs);
    }
    if let Some(ns) = spec.namespace.as_deref().filter(|ns| !ns.is_empty()) {
        errs.extend(invalid_each("spec.namespace", ns, dns1123_label_errors(ns)));
    }
}

/// Upstream looks a `revisionName` up among every ControllerRevision in its namespace, whoever
/// owns it, so a SidecarSet could pin another SidecarSet's containers. We require one of this
/// SidecarSet's own revisions.
fn validate_injection_revision(
    spec: &SidecarSetSpec,
    ctx: &SidecarSetContext<'_>,
    errs: &mut Vec<FieldError>,
) {
    let Some(revision) = &spec.injection_strategy.revision else {
        return;
    };
    let path = "spec.injectionStrategy.revision";
    match (&revision.revision_name, &revision.custom_version) {
        (None, None) => errs.push(FieldError::required(
            path,
            "revisionName and customVersion cannot be empty simultaneously",
        )),
        (Some(wanted), _) => {
            if !ctx.revisions.iter().any(|r| &r.name == wanted) {
                errs.push(FieldError::not_found(
                    child(path, "revisionName"),
                    wanted,
                    "Cannot find specific ControllerRevision: no revision of this SidecarSet has this name",
                ));
            }
        }
        (None, Some(wanted)) => {
            if !ctx
                .revisions
                .iter()
                .any(|r| r.custom_version.as_ref() == Some(wanted))
            {
                errs.push(FieldError::not_found(
                    child(path, "customVersion"),
                    wanted,
                    "Cannot find specific ControllerRevision: no revision of this SidecarSet has this custom version",
                ));
            }
        }
    }
}

/// Upstream stops at the first priority or scatter problem; we report each.
fn validate_update_strategy(
    strategy: &SidecarSetUpdateStrategy,
    path: &str,
    errs: &mut Vec<FieldError>,
) {
    let partition_set = match &strategy.partition {
        None | Some(IntOrString::Int(0)) => false,
        Some(_) => true,
    };
    if partition_set && strategy.selector.is_some() {
        errs.push(FieldError::forbidden(
            path,
            "Partition and Selector cannot be used together",
        ));
    }
    if let Some(selector) = &strategy.selector {
        validate_nonempty_selector(selector, &child(path, "selector"), errs);
    }
    if let Some(partition) = &strategy.partition {
        errs.extend(validate_int_or_percent(
            partition,
            &child(path, "partition"),
        ));
    }
    if let Some(max) = &strategy.max_unavailable {
        errs.extend(validate_int_or_percent(max, &child(path, "maxUnavailable")));
    }
    if let Some(priority) = &strategy.priority_strategy {
        let pp = child(path, "priorityStrategy");
        if !priority.weight_priority.is_empty() && !priority.order_priority.is_empty() {
            errs.push(FieldError::forbidden(
                &pp,
                "only one of weightPriority and orderPriority can be used",
            ));
        }
        for (i, term) in priority.weight_priority.iter().enumerate() {
            let tp = index(&child(&pp, "weightPriority"), i);
            if !(0..=100).contains(&term.weight) {
                errs.push(FieldError::invalid_int(
                    child(&tp, "weight"),
                    i64::from(term.weight),
                    "weight must be valid number in the range 1-100",
                ));
            }
            let sp = child(&tp, "matchSelector");
            if selector_is_empty(&term.match_selector) {
                errs.push(FieldError::required(sp, "selector can not be empty"));
            } else {
                errs.extend(validate_label_selector(&term.match_selector, &sp));
            }
        }
        for (i, term) in priority.order_priority.iter().enumerate() {
            if term.ordered_key.is_empty() {
                errs.push(FieldError::required(
                    child(&index(&child(&pp, "orderPriority"), i), "orderedKey"),
                    "order key can not be empty",
                ));
            }
        }
    }
    let sp = child(path, "scatterStrategy");
    let mut seen = HashSet::new();
    for (i, term) in strategy.scatter_strategy.iter().enumerate() {
        let tp = index(&sp, i);
        if term.key.is_empty() {
            errs.push(FieldError::required(
                child(&tp, "key"),
                "key should not be empty",
            ));
        } else if !seen.insert((term.key.as_str(), term.value.as_str())) {
            errs.push(FieldError::duplicate(
                tp,
                &format!("{}={}", term.key, term.value),
            ));
        }
    }
}

fn validate_containers(spec: &SidecarSetSpec, errs: &mut Vec<FieldError>) {
    if spec.containers.is_empty() && spec.init_containers.is_empty() {
        errs.push(FieldError::required(
            "spec.containers",
            "no initContainer or container defined for SidecarSet",
        ));
        // Volumes are still checked on their own.
        errs.extend(super::pod_spec::validate_volumes(
            &spec.volumes,
            "spec.volumes",
        ));
        return;
    }
    for (list, containers) in [
        ("spec.initContainers", &spec.init_containers),
        ("spec.containers", &spec.containers),
    ] {
        for (i, c) in containers.iter().enumerate() {
            validate_sidecar_fields(c, &index(list, i), errs);
        }
    }
    let init: Vec<&Container> = spec.init_containers.iter().map(|c| &c.container).collect();
    let containers: Vec<&Container> = spec.containers.iter().map(|c| &c.container).collect();
    errs.extend(validate_pod_parts(
        &init,
        &containers,
        &spec.volumes,
        "spec",
    ));
}

/// The SidecarSet-specific fields of one container. Upstream checks transferEnv on containers
/// only and reports it at `…transferEnv.fieldRef`; we check both lists at the exact index.
fn validate_sidecar_fields(c: &SidecarContainer, path: &str, errs: &mut Vec<FieldError>) {
    if upgrade_type(c) == SidecarContainerUpgradeType::HotUpgrade {
        errs.push(FieldError::forbidden(
            child(&child(path, "upgradeStrategy"), "upgradeType"),
            "HotUpgrade is not supported by kruise-rs yet; use ColdUpgrade",
        ));
    }
    if c.resources_policy.is_some() {
        errs.push(FieldError::forbidden(
            child(path, "resourcesPolicy"),
            "resourcesPolicy is not supported by kruise-rs yet; set resources instead",
        ));
    }
    // Docker's grammar: a reference no runtime can pull fails every injected pod at pull time
    // and the image pre-download at once; refuse it here. (Empty is pod_spec's "Required".)
    if let Some(image) = c
        .container
        .image
        .as_deref()
        .filter(|i| !i.trim().is_empty())
        && image.trim() == image
        && let Err(e) = ImageRef::parse(image)
    {
        errs.push(FieldError::invalid(
            child(path, "image"),
            image,
            e.kind().to_string(),
        ));
    }
    let tp = child(path, "transferEnv");
    for (i, env) in c.transfer_env.iter().enumerate() {
        let Some(field_ref) = env
            .source_container_name_from
            .as_ref()
            .and_then(|f| f.field_ref.as_ref())
        else {
            continue;
        };
        let fp = child(
            &child(&index(&tp, i), "sourceContainerNameFrom"),
            "fieldRef",
        );
        match field_ref.api_version.as_deref() {
            None | Some("") => {
                errs.push(FieldError::required(child(&fp, "apiVersion"), ""));
                continue;
            }
            Some("v1") => {}
            Some(other) => {
                errs.push(FieldError::not_supported(
                    child(&fp, "apiVersion"),
                    other,
                    &["v1"],
                ));
                continue;
            }
        }
        let field_path = field_ref.field_path.as_str();
        let fpp = child(&fp, "fieldPath");
        if field_path.is_empty() {
            errs.push(FieldError::required(fpp, ""));
            continue;
        }
        match split_subscripted_path(field_path) {
            Some(("metadata.annotations", k)) => {
                errs.extend(invalid_each(
                    &fpp,
                    k,
                    qualified_name_errors(&k.to_lowercase()),
                ));
            }
            Some(("metadata.labels", k)) => {
                errs.extend(invalid_each(&fpp, k, qualified_name_errors(k)));
            }
            _ => errs.push(FieldError::not_supported(
                fpp,
                field_path,
                &["metadata.labels['<key>']", "metadata.annotations['<key>']"],
            )),
        }
    }
}

/// Upstream reports everything at `spec.patchPodMetadata` as `Required`; we name the entry and
/// key. `MergePatchJson` values must be JSON (upstream finds out when a pod already carries the
/// annotation, and then fails that pod's creation).
fn validate_patch_pod_metadata(
    set: &SidecarSet,
    policy: &PatchPodMetadataPolicy,
    errs: &mut Vec<FieldError>,
) {
    let patches = &set.spec.patch_pod_metadata;
    if patches.is_empty() {
        return;
    }
    validate_whitelist(set, policy, errs);
    let path = "spec.patchPodMetadata";
    let mut seen = HashSet::new();
    for (i, patch) in patches.iter().enumerate() {
        let ep = index(path, i);
        let ap = child(&ep, "annotations");
        if patch.annotations.is_empty() {
            errs.push(FieldError::required(
                &ap,
                "no annotations defined for SidecarSet",
            ));
        }
        errs.extend(validate_annotations(&patch.annotations, &ap));
        for (k, v) in &patch.annotations {
            if !seen.insert(k.as_str()) {
                errs.push(FieldError::duplicate(key(&ap, k), k));
            }
            if patch.patch_policy == Some(SidecarSetPatchPolicy::MergePatchJson)
                && let Err(e) = serde_json::from_str::<serde_json::Value>(v)
            {
                errs.push(FieldError::invalid(
                    key(&ap, k),
                    v,
                    format!("a MergePatchJson value must be JSON: {e}"),
                ));
            }
        }
    }
}

fn validate_whitelist(
    set: &SidecarSet,
    policy: &PatchPodMetadataPolicy,
    errs: &mut Vec<FieldError>,
) {
    let path = "spec.patchPodMetadata";
    let rules = match policy {
        PatchPodMetadataPolicy::AllowAll => return,
        PatchPodMetadataPolicy::NotConfigured => {
            errs.push(FieldError::forbidden(
                path,
                format!(
                    "SidecarSet patch metadata whitelist not found: an administrator allows annotation keys in ConfigMap {WHITELIST_CONFIGMAP}, key {WHITELIST_CONFIGMAP_KEY}"
                ),
            ));
            return;
        }
        PatchPodMetadataPolicy::Whitelist(rules) => rules,
    };
    let empty = BTreeMap::new();
    let labels = set.metadata.labels.as_ref().unwrap_or(&empty);
    let mut allowed: Vec<&AnnotationKeyPattern> = Vec::new();
    for (i, rule) in rules.iter().enumerate() {
        if let Some(selector) = &rule.selector {
            match Selector::try_from(selector.clone()) {
                Ok(s) if s.matches(labels) => {}
                Ok(_) => continue,
                Err(e) => {
                    // A broken whitelist refuses rather than allows.
                    errs.push(FieldError::forbidden(
                        path,
                        format!("{WHITELIST_CONFIGMAP_KEY} rule {i} has an invalid selector: {e}"),
                    ));
                    return;
                }
            }
        }
        allowed.extend(&rule.allowed_annotation_keys);
    }
    if allowed.is_empty() {
        errs.push(FieldError::forbidden(
            path,
            format!(
                "sidecarSet patch metadata annotation is not allowed: no rule of {WHITELIST_CONFIGMAP_KEY} applies to this SidecarSet's labels"
            ),
        ));
        return;
    }
    for (i, patch) in set.spec.patch_pod_metadata.iter().enumerate() {
        for k in patch.annotations.keys() {
            if !allowed.iter().any(|p| p.matches(k)) {
                errs.push(FieldError::forbidden(
                    key(&child(&index(path, i), "annotations"), k),
                    format!("sidecarSet patch metadata annotation({k}) is not allowed by {WHITELIST_CONFIGMAP_KEY}"),
                ));
            }
        }
    }
}

// --- 9. Update ----------------------------------------------------------------------------------

/// Upstream's check, including its blind spot: init containers may be added.
fn validate_container_changes(old: &SidecarSet, new: &SidecarSet, errs: &mut Vec<FieldError>) {
    let old_types: HashMap<&str, Option<SidecarContainerUpgradeType>> = old
        .spec
        .containers
        .iter()
        .map(|c| {
            (
                c.container.name.as_str(),
                c.upgrade_strategy.as_ref().and_then(|s| s.upgrade_type),
            )
        })
        .collect();
    for (i, c) in new.spec.containers.iter().enumerate() {
        let path = index("spec.containers", i);
        match old_types.get(c.container.name.as_str()) {
            None => errs.push(FieldError::forbidden(
                child(&path, "name"),
                format!(
                    "container {} is not found in the SidecarSet before this update: containers cannot be added or renamed",
                    c.container.name
                ),
            )),
            Some(Some(was)) if *was != upgrade_type(c) => errs.push(FieldError::invalid(
                child(&child(&path, "upgradeStrategy"), "upgradeType"),
                &format!("{:?}", upgrade_type(c)),
                format!("container {} upgradeType is immutable", c.container.name),
            )),
            Some(_) => {}
        }
    }
}

// --- 10. Conflicts ------------------------------------------------------------------------------

/// Whether two SidecarSets may inject into the same pod: their namespace selectors overlap (or
/// either selects every namespace) and their pod selectors overlap. A SidecarSet without a
/// selector selects no pod.
pub fn may_select_same_pods(a: &SidecarSet, b: &SidecarSet) -> bool {
    let namespaces = match (
        a.spec.effective_namespace_selector(),
        b.spec.effective_namespace_selector(),
    ) {
        (Some(x), Some(y)) => is_selector_overlapping(&x, &y),
        _ => true,
    };
    namespaces
        && match (&a.spec.selector, &b.spec.selector) {
            (Some(x), Some(y)) => is_selector_overlapping(x, y),
            _ => false,
        }
}

/// Upstream skips only the validated canary's base; we also skip the canaries of the validated
/// SidecarSet, or updating a base would conflict with its own canary. Upstream compares init
/// containers with init containers and containers with containers; a name shared across the two
/// lists fails every pod both inject into, so we compare all names.
fn validate_conflicts(set: &SidecarSet, others: &[&SidecarSet], errs: &mut Vec<FieldError>) {
    let own_name = name(set);
    let base = canary_base(set);
    let matched: Vec<&SidecarSet> = others
        .iter()
        .copied()
        .filter(|o| name(o) != own_name)
        .filter(|o| Some(name(o)) != base)
        .filter(|o| canary_base(o) != Some(own_name))
        .filter(|o| may_select_same_pods(set, o))
        .collect();
    if matched.is_empty() {
        return;
    }

    let mut container_owner: HashMap<&str, &str> = HashMap::new();
    let mut volume_owner: HashMap<&str, (&str, &k8s_openapi::api::core::v1::Volume)> =
        HashMap::new();
    let mut annotation_owner: HashMap<&str, Vec<(&str, SidecarSetPatchPolicy)>> = HashMap::new();
    for other in &matched {
        for c in other
            .spec
            .init_containers
            .iter()
            .chain(&other.spec.containers)
        {
            container_owner
                .entry(&c.container.name)
                .or_insert(name(other));
        }
        for v in &other.spec.volumes {
            volume_owner.entry(&v.name).or_insert((name(other), v));
        }
        for patch in &other.spec.patch_pod_metadata {
            let policy = patch.patch_policy.unwrap_or(SidecarSetPatchPolicy::Retain);
            if policy == SidecarSetPatchPolicy::Retain {
                continue;
            }
            for k in patch.annotations.keys() {
                annotation_owner
                    .entry(k)
                    .or_default()
                    .push((name(other), policy));
            }
        }
    }

    for (list, containers) in [
        ("spec.initContainers", &set.spec.init_containers),
        ("spec.containers", &set.spec.containers),
    ] {
        for (i, c) in containers.iter().enumerate() {
            if let Some(owner) = container_owner.get(c.container.name.as_str()) {
                errs.push(FieldError::invalid(
                    child(&index(list, i), "name"),
                    &c.container.name,
                    format!("container {} already exist in {owner}", c.container.name),
                ));
            }
        }
    }
    for (i, v) in set.spec.volumes.iter().enumerate() {
        if let Some((owner, theirs)) = volume_owner.get(v.name.as_str())
            && *theirs != v
        {
            errs.push(FieldError::invalid(
                child(&index("spec.volumes", i), "name"),
                &v.name,
                format!("volume {} is in conflict with sidecarset {owner}", v.name),
            ));
        }
    }
    for (i, patch) in set.spec.patch_pod_metadata.iter().enumerate() {
        let policy = patch.patch_policy.unwrap_or(SidecarSetPatchPolicy::Retain);
        if policy == SidecarSetPatchPolicy::Retain {
            continue;
        }
        for k in patch.annotations.keys() {
            let Some(owners) = annotation_owner.get(k.as_str()) else {
                continue;
            };
            let clash = owners.iter().find(|(_, theirs)| {
                policy == SidecarSetPatchPolicy::Overwrite
                    || *theirs == SidecarSetPatchPolicy::Overwrite
            });
            if let Some((owner, _)) = clash {
                errs.push(FieldError::invalid(
                    key(&child(&index("spec.patchPodMetadata", i), "annotations"), k),
                    k,
                    format!("annotation {k} is in conflict with sidecarset {owner}"),
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::defaults::default_sidecarset;
    use crate::apis::validation::ErrorKind;
    use serde_json::{Value, json};

    fn spec(v: Value) -> SidecarSetSpec {
        serde_json::from_value(v).expect("test SidecarSet spec")
    }

    /// A SidecarSet as the webhook sees it: deserialized, then defaulted.
    fn set(name: &str, v: Value) -> SidecarSet {
        let mut s = SidecarSet::new(name, spec(v));
        default_sidecarset(&mut s);
        s
    }

    fn raw_set(name: &str, v: Value) -> SidecarSet {
        SidecarSet::new(name, spec(v))
    }

    /// Upstream's test fixture: NotUpdate, one plain container.
    fn base_json() -> Value {
        json!({
            "selector": {"matchLabels": {"a": "b"}},
            "updateStrategy": {"type": "NotUpdate"},
            "containers": [{"name": "test-sidecar", "image": "test-image"}]
        })
    }

    fn with(mut base: Value, patch: Value) -> Value {
        json_patch::merge(&mut base, &patch);
        base
    }

    fn annotate(mut s: SidecarSet, pairs: &[(&str, &str)]) -> SidecarSet {
        let annotations = s.metadata.annotations.get_or_insert_with(BTreeMap::new);
        for (k, v) in pairs {
            annotations.insert((*k).to_owned(), (*v).to_owned());
        }
        s
    }

    fn canary(name: &str, base: &str, v: Value) -> SidecarSet {
        annotate(
            set(name, v),
            &[(SIDECARSET_CANARY, "true"), (SIDECARSET_BASE, base)],
        )
    }

    fn errors(r: Result<(), ValidationErrors>) -> Vec<FieldError> {
        r.err().map(|e| e.0).unwrap_or_default()
    }

    fn create(s: &SidecarSet) -> Vec<FieldError> {
        create_with(s, &[], &SidecarSetContext::default())
    }

    fn create_with(
        s: &SidecarSet,
        others: &[SidecarSet],
        ctx: &SidecarSetContext<'_>,
    ) -> Vec<FieldError> {
        errors(validate_create(s, others, ctx))
    }

    fn update(old: &SidecarSet, new: &SidecarSet, others: &[SidecarSet]) -> Vec<FieldError> {
        errors(validate_update(
            old,
            new,
            others,
            &SidecarSetContext::default(),
        ))
    }

    fn paths(errs: &[FieldError]) -> Vec<&str> {
        errs.iter().map(|e| e.path.as_str()).collect()
    }

    fn revisions() -> Vec<KnownRevision> {
        vec![
            KnownRevision {
                name: "test-sidecarset-01234".into(),
                custom_version: None,
            },
            KnownRevision {
                name: "test-sidecarset-56789".into(),
                custom_version: Some("v2".into()),
            },
        ]
    }

    #[test]
    fn the_base_fixture_is_valid() {
        assert_eq!(create(&set("test-sidecarset", base_json())), []);
    }

    // --- upstream TestValidateSidecarSet, scenario by scenario ---

    #[test]
    fn upstream_missing_selector() {
        let s = set(
            "test-sidecarset",
            with(base_json(), json!({"selector": null})),
        );
        let errs = create(&s);
        assert_eq!(
            errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["spec.selector: Required value: no selector defined for SidecarSet"]
        );
    }

    #[test]
    fn upstream_wrong_update_strategy_duplicate_scatter() {
        let s = set(
            "test-sidecarset",
            with(
                base_json(),
                json!({"updateStrategy": {
                    "type": "RollingUpdate",
                    "scatterStrategy": [{"key": "key-1", "value": "value-1"}, {"key": "key-1", "value": "value-1"}]
                }}),
            ),
        );
        let errs = create(&s);
        assert_eq!(
            errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [r#"spec.updateStrategy.scatterStrategy[1]: Duplicate value: "key-1=value-1""#]
        );
    }

    #[test]
    fn upstream_wrong_selector_and_namespace_selector() {
        // Upstream counts 2 errors for each (the same bad value, found by two parsers); one here.
        let bad = json!({"matchLabels": {"a": "b"}, "matchExpressions": [
            {"key": "app-name", "operator": "NotIn", "values": ["app-group", "app-risk-"]}]});
        let good = json!({"matchLabels": {"a": "b"}, "matchExpressions": [
            {"key": "app-name", "operator": "NotIn", "values": ["app-group", "app-risk"]}]});
        let s = set(
            "test-sidecarset",
            with(base_json(), json!({"selector": bad.clone()})),
        );
        assert_eq!(
            paths(&create(&s)),
            ["spec.selector.matchExpressions[0].values[1]"]
        );
        let s = set(
            "test-sidecarset",
            with(
                base_json(),
                json!({"selector": good.clone(), "namespaceSelector": bad}),
            ),
        );
        assert_eq!(
            paths(&create(&s)),
            ["spec.namespaceSelector.matchExpressions[0].values[1]"]
        );
        // wrong-namespace-selector: a valid namespace selector, no error.
        let s = set(
            "test-sidecarset",
            with(
                base_json(),
                json!({"selector": good, "namespaceSelector": {"matchLabels": {"a": "b"}}}),
            ),
        );
        assert_eq!(create(&s), []);
    }

    #[test]
    fn upstream_wrong_init_container_without_image() {
        let s = set(
            "test-sidecarset",
            with(
                base_json(),
                json!({"containers": null, "initContainers": [{"name": "test-sidecar"}]}),
            ),
        );
        assert_eq!(
            create(&s)
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["spec.initContainers[0].image: Required value"]
        );
    }

    #[test]
    fn upstream_missing_container() {
        let s = set(
            "test-sidecarset",
            with(base_json(), json!({"containers": null})),
        );
        assert_eq!(
            create(&s)
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            [
                "spec.containers: Required value: no initContainer or container defined for SidecarSet"
            ]
        );
    }

    #[test]
    fn upstream_wrong_containers_missing_share_volume_policy() {
        // Upstream validates what its mutating webhook defaulted; an unset policy is defaulted
        // here too, and an explicit empty one is an unsupported value in the raw JSON.
        let s = raw_set("test-sidecarset", base_json());
        assert_eq!(s.spec.containers[0].share_volume_policy, None);
        assert_eq!(create(&s), []);
        let raw = with(
            json!({"spec": base_json()}),
            json!({"spec": {"containers": [{"name": "test-sidecar", "image": "test-image", "shareVolumePolicy": {"type": ""}}]}}),
        );
        let errs = errors(validate_raw_enums(&raw));
        assert_eq!(
            errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                r#"spec.containers[0].shareVolumePolicy.type: Unsupported value: "": supported values: "enabled", "disabled""#
            ]
        );
    }

    #[test]
    fn upstream_wrong_volumes() {
        let volumes = json!({"volumes": [
            {"name": "test-volume"},
            {"name": "istio-token", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"audience": "istio-ca", "expirationSeconds": 43200, "path": "istio-token"}}]}}
        ]});
        // Undefaulted, as in upstream's test: the source-less volume is an error.
        let s = raw_set("test-sidecarset", with(base_json(), volumes.clone()));
        let errs = create(&s);
        assert_eq!(
            errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["spec.volumes[0]: Required value: must specify a volume type"]
        );
        // Defaulted, as through the webhooks: it became an emptyDir.
        assert_eq!(
            create(&set("test-sidecarset", with(base_json(), volumes))),
            []
        );
    }

    #[test]
    fn upstream_volume_device_scenarios() {
        let device = json!({"containers": [{"name": "test-sidecar", "image": "test-image",
            "volumeDevices": [{"name": "disk0", "devicePath": "/dev/nvme1"}]}]});
        let s = set("test-sidecarset", with(base_json(), device.clone()));
        assert_eq!(
            paths(&create(&s)),
            ["spec.containers[0].volumeDevices[0].name"]
        );
        let s = set(
            "test-sidecarset",
            with(
                base_json(),
                with(
                    device,
                    json!({"volumes": [
            {"name": "disk0", "persistentVolumeClaim": {"claimName": "pvc-0"}}]}),
                ),
            ),
        );
        assert_eq!(create(&s), []);
        let s = set(
            "test-sidecarset",
            with(
                base_json(),
                json!({
                    "containers": [{"name": "test-sidecar", "image": "test-image",
                        "volumeDevices": [{"name": "disk0", "devicePath": "/home/admin/log"}],
                        "volumeMounts": [{"name": "log", "mountPath": "/home/admin/log"}]}],
                    "volumes": [{"name": "disk0", "persistentVolumeClaim": {"claimName": "pvc-0"}}, {"name": "log", "emptyDir": {}}]
                }),
            ),
        );
        assert_eq!(create(&s).len(), 2);
    }

    #[test]
    fn upstream_wrong_metadata_duplicate_patch_key() {
        let s = set(
            "test-sidecarset",
            with(
                base_json(),
                json!({"patchPodMetadata": [
                    {"annotations": {"key1": "value1"}, "patchPolicy": "MergePatchJson"},
                    {"annotations": {"key1": "value1"}, "patchPolicy": "Overwrite"}
                ]}),
            ),
        );
        let ctx = SidecarSetContext {
            patch_pod_metadata: &PatchPodMetadataPolicy::AllowAll,
            ..Default::default()
        };
        let errs = create_with(&s, &[], &ctx);
        // Upstream: the duplicate. Here also: "value1" is not JSON, which MergePatchJson needs.
        assert_eq!(
            errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                r#"spec.patchPodMetadata[0].annotations[key1]: Invalid value: "value1": a MergePatchJson value must be JSON: expected value at line 1 column 1"#,
                r#"spec.patchPodMetadata[1].annotations[key1]: Duplicate value: "key1""#,
            ]
        );
    }

    #[test]
    fn upstream_injection_strategy_revisions() {
        let revs = revisions();
        let ctx = SidecarSetContext {
            revisions: &revs,
            ..Default::default()
        };
        // wrong-name-injectionStrategy: no revision has this custom version.
        let s = set(
            "test-sidecarset",
            with(
                base_json(),
                json!({"injectionStrategy": {"revision": {"customVersion": "normal-sidecarset-01234"}}}),
            ),
        );
        let errs = create_with(&s, &[], &ctx);
        assert_eq!(
            paths(&errs),
            ["spec.injectionStrategy.revision.customVersion"]
        );
        assert_eq!(errs[0].kind, ErrorKind::NotFound);
        // not-existing-injectionStrategy: no revision has this name.
        let s = set(
            "test-sidecarset",
            with(
                base_json(),
                json!({"injectionStrategy": {"revision": {"revisionName": "test-sidecarset-678235", "policy": "Always"}}}),
            ),
        );
        assert_eq!(
            paths(&create_with(&s, &[], &ctx)),
            ["spec.injectionStrategy.revision.revisionName"]
        );
        // Resolvable by name or by custom version.
        let s = set(
            "test-sidecarset",
            with(
                base_json(),
                json!({"injectionStrategy": {"revision": {"revisionName": "test-sidecarset-01234"}}}),
            ),
        );
        assert_eq!(create_with(&s, &[], &ctx), []);
        let s = set(
            "test-sidecarset",
            with(
                base_json(),
                json!({"injectionStrategy": {"revision": {"customVersion": "v2", "policy": "Partial"}}}),
            ),
        );
        assert_eq!(create_with(&s, &[], &ctx), []);
        // revisionName wins when both are set, as upstream.
        let s = set(
            "test-sidecarset",
            with(
                base_json(),
                json!({"injectionStrategy": {"revision": {"revisionName": "nope", "customVersion": "v2"}}}),
            ),
        );
        assert_eq!(
            paths(&create_with(&s, &[], &ctx)),
            ["spec.injectionStrategy.revision.revisionName"]
        );
        // Neither set.
        let s = set(
            "test-sidecarset",
            with(
                base_json(),
                json!({"injectionStrategy": {"revision": {"policy": "Always"}}}),
            ),
        );
        let errs = create_with(&s, &[], &ctx);
        assert_eq!(
            errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "spec.injectionStrategy.revision: Required value: revisionName and customVersion cannot be empty simultaneously"
            ]
        );
    }

    #[test]
    fn known_revisions_come_from_controller_revisions() {
        let rev: ControllerRevision = serde_json::from_value(json!({
            "metadata": {"name": "r1", "labels": {"apps.kruise.io/sidecarset-custom-version": "v9"}},
            "revision": 1
        }))
        .expect("revision");
        assert_eq!(
            KnownRevision::from_controller_revision(&rev),
            KnownRevision {
                name: "r1".into(),
                custom_version: Some("v9".into())
            }
        );
    }

    #[test]
    fn upstream_native_sidecar_with_rolling_update() {
        let native = json!({"initContainers": [{"name": "test-sidecar", "image": "test-image", "restartPolicy": "Always"}], "containers": null});
        let s = set(
            "test-sidecarset",
            with(
                base_json(),
                with(
                    native.clone(),
                    json!({"updateStrategy": {"type": "RollingUpdate"}}),
                ),
            ),
        );
        let errs = create(&s);
        assert_eq!(paths(&errs), ["spec.updateStrategy.type"]);
        assert!(
            errs[0]
                .message
                .contains("in-place upgrade is not currently supported"),
            "{}",
            errs[0]
        );
        assert!(errs[0].message.contains("test-sidecar"));
        // The default type is RollingUpdate, so an unset type is refused too.
        let s = set(
            "test-sidecarset",
            with(
                with(base_json(), json!({"updateStrategy": null})),
                native.clone(),
            ),
        );
        assert_eq!(
            s.spec.update_strategy.type_,
            Some(SidecarSetUpdateStrategyType::RollingUpdate)
        );
        assert_eq!(paths(&create(&s)), ["spec.updateStrategy.type"]);
        // NotUpdate is the way.
        assert_eq!(
            create(&set("test-sidecarset", with(base_json(), native))),
            []
        );
    }

    #[test]
    fn resources_policy_is_denied_not_ignored() {
        // Upstream's resources-policy scenarios all end here: kruise-rs does not implement it.
        for (list, extra) in [
            ("containers", json!({})),
            ("initContainers", json!({"restartPolicy": "Always"})),
        ] {
            let mut container = json!({"name": "test-sidecar", "image": "test-image",
                "resourcesPolicy": {"targetContainersMode": "sum", "targetContainersNameRegex": ".*",
                    "resourcesExpr": {"limits": {"cpu": "cpu*50%"}}}});
            json_patch::merge(&mut container, &extra);
            let s = set(
                "test-sidecarset",
                with(base_json(), json!({"containers": null, list: [container]})),
            );
            let errs = create(&s);
            assert_eq!(
                errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
                [format!(
                    "spec.{list}[0].resourcesPolicy: Forbidden: resourcesPolicy is not supported by kruise-rs yet; set resources instead"
                )]
            );
        }
    }

    #[test]
    fn hot_upgrade_is_denied_not_ignored() {
        let s = set(
            "test-sidecarset",
            with(
                base_json(),
                json!({"containers": [{"name": "test-sidecar", "image": "test-image",
            "upgradeStrategy": {"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "empty:1"}}]}),
            ),
        );
        assert_eq!(
            create(&s)
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            [
                "spec.containers[0].upgradeStrategy.upgradeType: Forbidden: HotUpgrade is not supported by kruise-rs yet; use ColdUpgrade"
            ]
        );
    }

    // --- metadata ---

    #[test]
    fn the_name_is_an_rfc1123_label() {
        for bad in ["Test", "a.b", "-a", &"a".repeat(64)] {
            let errs = create(&set(bad, base_json()));
            assert_eq!(paths(&errs), ["metadata.name"], "{bad}");
        }
        let mut s = set("x", base_json());
        s.metadata.name = None;
        assert_eq!(
            create(&s)
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["metadata.name: Required value: name or generateName is required"]
        );
    }

    #[test]
    fn metadata_namespace_labels_and_annotations() {
        let mut s = set("x", base_json());
        s.metadata.namespace = Some("default".into());
        s.metadata.labels = Some(BTreeMap::from([("bad key".into(), "v".into())]));
        s.metadata.annotations = Some(BTreeMap::from([("a//b".into(), "v".into())]));
        assert_eq!(
            paths(&create(&s)),
            [
                "metadata.namespace",
                "metadata.labels",
                "metadata.annotations"
            ]
        );
    }

    // --- canary: upstream TestValidateSidecarSetCanaryAnnotations ---

    #[test]
    fn upstream_canary_scenarios() {
        let base = set(
            "base-sidecarset",
            with(
                base_json(),
                json!({"containers": [{"name": "other", "image": "x"}]}),
            ),
        );
        let canary_base = canary(
            "base1-sidecarset",
            "other-base-sidecarset",
            with(
                base_json(),
                json!({"containers": [{"name": "third", "image": "x"}]}),
            ),
        );
        let others = [base.clone(), canary_base];
        let check = |s: &SidecarSet| -> Vec<String> {
            create_with(s, &others, &SidecarSetContext::default())
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        // non-canary
        assert_eq!(
            check(&set("test-sidecarset", base_json())),
            Vec::<String>::new()
        );
        // base is itself
        let s = canary("test-sidecarset", "test-sidecarset", base_json());
        let errs = check(&s);
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert_eq!(
            errs[0],
            r#"metadata.annotations[apps.kruise.io/sidecarset-base]: Invalid value: "test-sidecarset": base sidecarSet cannot be itself"#
        );
        // valid base
        assert_eq!(
            check(&canary("test-sidecarset", "base-sidecarset", base_json())),
            Vec::<String>::new()
        );
        // base is a canary
        assert_eq!(
            check(&canary("test-sidecarset", "base1-sidecarset", base_json())),
            [
                r#"metadata.annotations[apps.kruise.io/sidecarset-base]: Invalid value: "base1-sidecarset": base sidecarSet cannot be canary"#
            ]
        );
        // base does not exist
        assert_eq!(
            check(&canary(
                "test-sidecarset",
                "nonexistent-sidecarset",
                base_json()
            )),
            [
                r#"metadata.annotations[apps.kruise.io/sidecarset-base]: Not found: "nonexistent-sidecarset": the base SidecarSet does not exist"#
            ]
        );
        // RollingUpdate
        let s = canary(
            "test-sidecarset",
            "base-sidecarset",
            with(
                base_json(),
                json!({"updateStrategy": {"type": "RollingUpdate"}}),
            ),
        );
        assert_eq!(
            check(&s),
            [
                r#"spec.updateStrategy.type: Invalid value: "RollingUpdate": RollingUpdate is not supported for canary sidecarSet: use NotUpdate"#
            ]
        );
    }

    #[test]
    fn upstream_canary_update_scenarios() {
        let others = [
            set(
                "base-sidecarset",
                with(
                    base_json(),
                    json!({"containers": [{"name": "other", "image": "x"}]}),
                ),
            ),
            set(
                "new-base-sidecarset",
                with(
                    base_json(),
                    json!({"containers": [{"name": "other2", "image": "x"}]}),
                ),
            ),
        ];
        let old = canary("test-sidecarset", "base-sidecarset", base_json());
        // Unchanged base, changed spec: fine.
        let new = canary(
            "test-sidecarset",
            "base-sidecarset",
            with(
                base_json(),
                json!({"containers": [{"name": "test-sidecar", "image": "test-image:2"}]}),
            ),
        );
        assert_eq!(update(&old, &new, &others), []);
        // Changed base.
        let new = canary("test-sidecarset", "new-base-sidecarset", base_json());
        let errs = update(&old, &new, &others);
        assert_eq!(
            errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                r#"metadata.annotations[apps.kruise.io/sidecarset-base]: Invalid value: "new-base-sidecarset": field is immutable (was "base-sidecarset")"#
            ]
        );
        // Turning an existing SidecarSet into a canary is refused, as upstream.
        let plain = set("test-sidecarset", base_json());
        assert_eq!(
            paths(&update(&plain, &old, &others)),
            ["metadata.annotations[apps.kruise.io/sidecarset-base]"]
        );
    }

    #[test]
    fn canary_true_without_a_base_is_not_a_canary() {
        let s = annotate(
            set("test-sidecarset", base_json()),
            &[(SIDECARSET_CANARY, "true")],
        );
        assert_eq!(canary_base(&s), None);
        assert_eq!(create(&s), []);
        let s = annotate(
            set("t", base_json()),
            &[(SIDECARSET_CANARY, "false"), (SIDECARSET_BASE, "b")],
        );
        assert_eq!(canary_base(&s), None);
    }

    // --- selectors ---

    #[test]
    fn selectors_must_not_be_empty() {
        let mut s = set(
            "x",
            with(
                base_json(),
                json!({"namespaceSelector": {"matchLabels": {}}}),
            ),
        );
        s.spec.selector = Some(LabelSelector::default());
        let errs = create(&s);
        assert_eq!(
            errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "spec.selector: Invalid value: {}: empty selector is not valid for sidecarset.",
                r#"spec.namespaceSelector: Invalid value: {"matchLabels":{}}: empty selector is not valid for sidecarset."#,
            ]
        );
    }

    #[test]
    fn v1alpha1_namespace_is_a_namespace_name() {
        assert_eq!(
            create(&set(
                "x",
                with(base_json(), json!({"namespace": "payments"}))
            )),
            []
        );
        let errs = create(&set(
            "x",
            with(base_json(), json!({"namespace": "Payments"})),
        ));
        assert_eq!(paths(&errs), ["spec.namespace"]);
    }

    // --- update strategy ---

    fn rolling(strategy: Value) -> SidecarSet {
        let mut s = with(json!({"type": "RollingUpdate"}), strategy);
        if let Some(obj) = s.as_object_mut() {
            obj.retain(|_, v| !v.is_null());
        }
        set("x", with(base_json(), json!({"updateStrategy": s})))
    }

    #[test]
    fn partition_and_selector_cannot_be_used_together() {
        let selector = json!({"matchLabels": {"canary": "true"}});
        let errs = create(&rolling(json!({"partition": 2, "selector": selector})));
        assert_eq!(
            errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["spec.updateStrategy: Forbidden: Partition and Selector cannot be used together"]
        );
        // A string partition counts as set even at "0%" (upstream's intStrIsSet).
        assert_eq!(
            create(&rolling(json!({"partition": "0%", "selector": selector}))).len(),
            1
        );
        assert_eq!(
            create(&rolling(json!({"partition": 0, "selector": selector}))),
            []
        );
        // The update selector must be valid and non-empty.
        assert_eq!(
            paths(&create(&rolling(json!({"selector": {}})))),
            ["spec.updateStrategy.selector"]
        );
    }

    #[test]
    fn partition_and_max_unavailable_are_non_negative_ints_or_percents() {
        let errs = create(&rolling(json!({"partition": -1, "maxUnavailable": "abc"})));
        assert_eq!(
            paths(&errs),
            [
                "spec.updateStrategy.partition",
                "spec.updateStrategy.maxUnavailable"
            ]
        );
        assert_eq!(
            create(&rolling(json!({"partition": "50%", "maxUnavailable": 0}))),
            []
        );
        // Not checked under NotUpdate, as upstream.
        let s = set(
            "x",
            with(
                base_json(),
                json!({"updateStrategy": {"type": "NotUpdate", "partition": -1}}),
            ),
        );
        assert_eq!(create(&s), []);
    }

    #[test]
    fn priority_strategy() {
        let errs = create(&rolling(json!({"priorityStrategy": {
            "weightPriority": [
                {"weight": 101, "matchSelector": {"matchLabels": {"a": "b"}}},
                {"weight": 50, "matchSelector": {}},
                {"weight": 50, "matchSelector": {"matchLabels": {"a": "-bad"}}}
            ],
            "orderPriority": [{"orderedKey": ""}]
        }})));
        let p = |s: &str| format!("spec.updateStrategy.priorityStrategy{s}");
        assert_eq!(
            paths(&errs),
            [
                p(""),
                p(".weightPriority[0].weight"),
                p(".weightPriority[1].matchSelector"),
                p(".weightPriority[2].matchSelector.matchLabels"),
                p(".orderPriority[0].orderedKey"),
            ]
        );
        assert_eq!(
            errs[0].message,
            "only one of weightPriority and orderPriority can be used"
        );
        let ok = rolling(json!({"priorityStrategy": {"orderPriority": [{"orderedKey": "rank"}]}}));
        assert_eq!(create(&ok), []);
    }

    #[test]
    fn scatter_strategy_keys() {
        let errs = create(&rolling(json!({"scatterStrategy": [
            {"key": "", "value": "x"}, {"key": "zone", "value": "*"}, {"key": "zone", "value": "a"}
        ]})));
        assert_eq!(
            errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["spec.updateStrategy.scatterStrategy[0].key: Required value: key should not be empty"]
        );
    }

    // --- containers ---

    #[test]
    fn sidecar_images_must_parse() {
        let s = set(
            "x",
            with(
                base_json(),
                json!({"containers": [{"name": "a", "image": "Example/App:1"}]}),
            ),
        );
        let errs = create(&s);
        assert_eq!(paths(&errs), ["spec.containers[0].image"]);
        assert!(errs[0].message.contains("lowercase"), "{}", errs[0]);
        let s = set(
            "x",
            with(
                base_json(),
                json!({"containers": [{"name": "a", "image": "127.0.0.1:5000/app@sha256:0000000000000000000000000000000000000000000000000000000000000000"}]}),
            ),
        );
        assert_eq!(create(&s), []);
    }

    #[test]
    fn transfer_env_field_refs() {
        let te = |field_ref: Value| {
            set(
                "x",
                with(
                    base_json(),
                    json!({"containers": [{"name": "a", "image": "x",
                "transferEnv": [{"sourceContainerNameFrom": {"fieldRef": field_ref}, "envName": "E"}]}]}),
                ),
            )
        };
        let p = "spec.containers[0].transferEnv[0].sourceContainerNameFrom.fieldRef";
        // Defaulting sets apiVersion v1.
        assert_eq!(
            create(&te(json!({"fieldPath": "metadata.labels['app']"}))),
            []
        );
        assert_eq!(
            create(&te(
                json!({"fieldPath": "metadata.annotations['Example.com/Main']"})
            )),
            []
        );
        let errs = create(&te(json!({"fieldPath": "metadata.name"})));
        assert_eq!(
            errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [format!(
                r#"{p}.fieldPath: Unsupported value: "metadata.name": supported values: "metadata.labels['<key>']", "metadata.annotations['<key>']""#
            )]
        );
        assert_eq!(
            paths(&create(&te(
                json!({"fieldPath": "metadata.labels['bad key']"})
            ))),
            [format!("{p}.fieldPath")]
        );
        assert_eq!(
            paths(&create(&te(json!({"fieldPath": ""})))),
            [format!("{p}.fieldPath")]
        );
        assert_eq!(
            paths(&create(&te(
                json!({"apiVersion": "v2", "fieldPath": "metadata.labels['a']"})
            ))),
            [format!("{p}.apiVersion")]
        );
        // Without defaulting, a missing apiVersion is reported.
        let s = raw_set(
            "x",
            with(
                base_json(),
                json!({"containers": [{"name": "a", "image": "x",
            "transferEnv": [{"sourceContainerNameFrom": {"fieldRef": {"fieldPath": "metadata.labels['a']"}}}]}]}),
            ),
        );
        assert_eq!(paths(&create(&s)), [format!("{p}.apiVersion")]);
    }

    #[test]
    fn pod_rules_apply_to_sidecars() {
        let s = set(
            "x",
            with(
                base_json(),
                json!({
                    "initContainers": [{"name": "dup", "image": "x"}],
                    "containers": [{"name": "dup", "image": "x", "volumeMounts": [{"name": "nope", "mountPath": "/x"}]}]
                }),
            ),
        );
        assert_eq!(
            paths(&create(&s)),
            [
                "spec.containers[0].volumeMounts[0].name",
                "spec.initContainers[0].name"
            ]
        );
    }

    #[test]
    fn raw_enum_values_are_reported_in_kubernetes_form() {
        let raw = json!({"spec": {
            "containers": [
                {"name": "a", "podInjectPolicy": "BeforeAppContainer"},
                {"name": "b", "podInjectPolicy": "X", "upgradeStrategy": {"upgradeType": "Warm"}}
            ],
            "updateStrategy": {"type": "Sometimes"},
            "injectionStrategy": {"revision": {"policy": "Never"}},
            "patchPodMetadata": [{"patchPolicy": "Replace"}]
        }});
        let errs = errors(validate_raw_enums(&raw));
        assert_eq!(
            errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                r#"spec.containers[1].podInjectPolicy: Unsupported value: "X": supported values: "BeforeAppContainer", "AfterAppContainer""#,
                r#"spec.containers[1].upgradeStrategy.upgradeType: Unsupported value: "Warm": supported values: "ColdUpgrade", "HotUpgrade""#,
                r#"spec.updateStrategy.type: Unsupported value: "Sometimes": supported values: "RollingUpdate", "NotUpdate""#,
                r#"spec.injectionStrategy.revision.policy: Unsupported value: "Never": supported values: "Always", "Partial""#,
                r#"spec.patchPodMetadata[0].patchPolicy: Unsupported value: "Replace": supported values: "Retain", "Overwrite", "MergePatchJson""#,
            ]
        );
        assert_eq!(validate_raw_enums(&json!({"spec": base_json()})), Ok(()));
    }

    // --- patchPodMetadata ---

    fn patched(labels: &[(&str, &str)], patches: Value) -> SidecarSet {
        let mut s = set("x", with(base_json(), json!({"patchPodMetadata": patches})));
        s.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
        );
        s
    }

    #[test]
    fn patch_pod_metadata_needs_a_whitelist_by_default() {
        let s = patched(&[], json!([{"annotations": {"oom-score": "1"}}]));
        let errs = create(&s);
        assert_eq!(paths(&errs), ["spec.patchPodMetadata"]);
        assert_eq!(errs[0].kind, ErrorKind::Forbidden);
        assert!(errs[0].message.contains(WHITELIST_CONFIGMAP_KEY));
        let allow_all = PatchPodMetadataPolicy::AllowAll;
        let ctx = SidecarSetContext {
            patch_pod_metadata: &allow_all,
            ..Default::default()
        };
        assert_eq!(create_with(&s, &[], &ctx), []);
    }

    #[test]
    fn the_whitelist_applies_rules_by_sidecarset_labels() {
        let policy = PatchPodMetadataPolicy::Whitelist(vec![
            WhitelistRule {
                selector: None,
                allowed_annotation_keys: vec![AnnotationKeyPattern::exact("oom-score")],
            },
            WhitelistRule {
                selector: Some(
                    serde_json::from_value(json!({"matchLabels": {"sidecar": "demo"}}))
                        .expect("selector"),
                ),
                allowed_annotation_keys: vec![AnnotationKeyPattern::new("key.*", |k: &str| {
                    k.contains("key")
                })],
            },
        ]);
        let ctx = SidecarSetContext {
            patch_pod_metadata: &policy,
            ..Default::default()
        };
        let patches = json!([{"annotations": {"oom-score": "1", "my-key": "v"}}]);
        assert_eq!(
            create_with(&patched(&[("sidecar", "demo")], patches.clone()), &[], &ctx),
            []
        );
        let errs = create_with(&patched(&[], patches), &[], &ctx);
        assert_eq!(
            errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [format!(
                "spec.patchPodMetadata[0].annotations[my-key]: Forbidden: sidecarSet patch metadata annotation(my-key) is not allowed by {WHITELIST_CONFIGMAP_KEY}"
            )]
        );
        // No rule applies at all.
        let only_selected = PatchPodMetadataPolicy::Whitelist(vec![WhitelistRule {
            selector: Some(
                serde_json::from_value(json!({"matchLabels": {"sidecar": "demo"}}))
                    .expect("selector"),
            ),
            allowed_annotation_keys: vec![AnnotationKeyPattern::exact("oom-score")],
        }]);
        let ctx = SidecarSetContext {
            patch_pod_metadata: &only_selected,
            ..Default::default()
        };
        let errs = create_with(
            &patched(&[], json!([{"annotations": {"oom-score": "1"}}])),
            &[],
            &ctx,
        );
        assert!(errs[0].message.contains("no rule"), "{}", errs[0]);
        // An empty whitelist refuses, as upstream.
        let empty = PatchPodMetadataPolicy::Whitelist(vec![]);
        let ctx = SidecarSetContext {
            patch_pod_metadata: &empty,
            ..Default::default()
        };
        assert_eq!(
            create_with(
                &patched(&[], json!([{"annotations": {"a": "1"}}])),
                &[],
                &ctx
            )
            .len(),
            1
        );
    }

    #[test]
    fn the_whitelist_reads_upstreams_configmap_json() {
        let json = r#"{"rules": [
            {"allowedAnnotationKeyExprs": ["^oom-score$"]},
            {"selector": {"matchLabels": {"sidecar": "sidecar-demo"}}, "allowedAnnotationKeyExprs": ["key.*"]}
        ]}"#;
        // A stand-in compiler: `^x$` exact, `x.*` prefix.
        type Matcher = Box<dyn Fn(&str) -> bool + Send + Sync>;
        let compile = |e: &str| -> Result<Matcher, String> {
            if let Some(exact) = e.strip_prefix('^').and_then(|e| e.strip_suffix('$')) {
                let exact = exact.to_owned();
                Ok(Box::new(move |k: &str| k == exact))
            } else if let Some(prefix) = e.strip_suffix(".*") {
                let prefix = prefix.to_owned();
                Ok(Box::new(move |k: &str| k.contains(&prefix)))
            } else {
                Err("unsupported".into())
            }
        };
        let policy = PatchPodMetadataPolicy::from_whitelist_json(json, compile).expect("parses");
        let PatchPodMetadataPolicy::Whitelist(rules) = &policy else {
            panic!("whitelist expected");
        };
        assert_eq!(rules.len(), 2);
        assert_eq!(
            rules[0].allowed_annotation_keys[0].expression(),
            "^oom-score$"
        );
        assert!(rules[1].allowed_annotation_keys[0].matches("a-key-1"));
        let bad = PatchPodMetadataPolicy::from_whitelist_json(
            r#"{"rules": [{"allowedAnnotationKeyExprs": ["("]}]}"#,
            compile,
        );
        assert!(matches!(
            bad,
            Err(WhitelistError::Expression { rule: 0, .. })
        ));
        assert!(matches!(
            PatchPodMetadataPolicy::from_whitelist_json("not json", compile),
            Err(WhitelistError::Json(_))
        ));
    }

    #[test]
    fn patch_entries_need_valid_annotations() {
        let ctx = SidecarSetContext {
            patch_pod_metadata: &PatchPodMetadataPolicy::AllowAll,
            ..Default::default()
        };
        let s = patched(
            &[],
            json!([
                {"annotations": {}},
                {"annotations": {"bad key": "v"}},
                {"annotations": {"merge": "{\"a\": 1}"}, "patchPolicy": "MergePatchJson"}
            ]),
        );
        let errs = create_with(&s, &[], &ctx);
        assert_eq!(
            paths(&errs),
            [
                "spec.patchPodMetadata[0].annotations",
                "spec.patchPodMetadata[1].annotations"
            ]
        );
        assert_eq!(errs[0].kind, ErrorKind::Required);
    }

    // --- update rules: upstream TestSidecarSetUpdateConflict and more ---

    #[test]
    fn upgrade_type_is_immutable() {
        let old = raw_set(
            "x",
            with(
                base_json(),
                json!({"containers": [{"name": "test", "image": "x", "upgradeStrategy": {"upgradeType": "ColdUpgrade"}}]}),
            ),
        );
        let new = raw_set(
            "x",
            with(
                base_json(),
                json!({"containers": [{"name": "test", "image": "x", "upgradeStrategy": {"upgradeType": "HotUpgrade"}}]}),
            ),
        );
        let errs = update(&old, &new, &[]);
        assert_eq!(
            errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "spec.containers[0].upgradeStrategy.upgradeType: Forbidden: HotUpgrade is not supported by kruise-rs yet; use ColdUpgrade",
                r#"spec.containers[0].upgradeStrategy.upgradeType: Invalid value: "HotUpgrade": container test upgradeType is immutable"#,
            ]
        );
        // Unset before (upstream: "") and defaulted now: not a change.
        let old = raw_set("x", base_json());
        let new = set(
            "x",
            with(
                base_json(),
                json!({"containers": [{"name": "test-sidecar", "image": "test-image:2"}]}),
            ),
        );
        assert_eq!(update(&old, &new, &[]), []);
    }

    #[test]
    fn containers_cannot_be_added_or_renamed_but_may_be_removed() {
        let old = set(
            "x",
            with(
                base_json(),
                json!({"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "x"}]}),
            ),
        );
        let removed = set(
            "x",
            with(
                base_json(),
                json!({"containers": [{"name": "a", "image": "x"}]}),
            ),
        );
        assert_eq!(update(&old, &removed, &[]), []);
        let added = set(
            "x",
            with(
                base_json(),
                json!({"containers": [{"name": "a", "image": "x"}, {"name": "c", "image": "x"}]}),
            ),
        );
        let errs = update(&old, &added, &[]);
        assert_eq!(paths(&errs), ["spec.containers[1].name"]);
        assert_eq!(errs[0].kind, ErrorKind::Forbidden);
        // Init containers may be added (upstream does not check them).
        let init = set(
            "x",
            with(
                base_json(),
                json!({"containers": [{"name": "a", "image": "x"}], "initContainers": [{"name": "i", "image": "x"}]}),
            ),
        );
        assert_eq!(update(&old, &init, &[]), []);
    }

    #[test]
    fn a_metadata_only_update_is_not_revalidated_against_the_cluster() {
        let conflicting = set("other", base_json());
        // Admitted earlier (say, created in a race with `other`), pinned to a pruned revision.
        let old = set(
            "x",
            with(
                base_json(),
                json!({"injectionStrategy": {"revision": {"revisionName": "gone"}}}),
            ),
        );
        let mut new = old.clone();
        new.metadata.annotations = Some(BTreeMap::from([("note".into(), "hello".into())]));
        assert_eq!(update(&old, &new, std::slice::from_ref(&conflicting)), []);
        // Its metadata is still checked.
        new.metadata.annotations = Some(BTreeMap::from([("a//b".into(), String::new())]));
        assert_eq!(paths(&update(&old, &new, &[])), ["metadata.annotations"]);
        // A spec change re-checks everything.
        let mut changed = old.clone();
        changed.spec.containers[0].container.image = Some("test-image:2".into());
        assert_eq!(
            paths(&update(&old, &changed, std::slice::from_ref(&conflicting))),
            [
                "spec.injectionStrategy.revision.revisionName",
                "spec.containers[0].name"
            ]
        );
    }

    // --- conflicts: upstream TestSidecarSetNameConflict, …PodMetadataConflict, …VolumeConflict ---

    fn conflict_set(name: &str, v: Value) -> SidecarSet {
        set(
            name,
            with(
                json!({"selector": {"matchLabels": {"a": "b"}}, "updateStrategy": {"type": "NotUpdate"}}),
                v,
            ),
        )
    }

    fn conflicts(new: &SidecarSet, others: &[SidecarSet]) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let others: Vec<&SidecarSet> = others.iter().collect();
        validate_conflicts(new, &others, &mut errs);
        errs
    }

    #[test]
    fn upstream_name_conflicts() {
        let names = json!({
            "containers": [{"name": "container-name", "image": "x"}],
            "initContainers": [{"name": "init-name", "image": "x"}],
            "volumes": [{"name": "volume-name"}]
        });
        let errs = conflicts(
            &conflict_set("sidecarset2", names.clone()),
            &[conflict_set("sidecarset1", names)],
        );
        assert_eq!(
            errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                r#"spec.initContainers[0].name: Invalid value: "init-name": container init-name already exist in sidecarset1"#,
                r#"spec.containers[0].name: Invalid value: "container-name": container container-name already exist in sidecarset1"#,
            ]
        );
        let ns = |app: &str| json!({"namespaceSelector": {"matchLabels": {"app": app}}, "containers": [{"name": "container-name", "image": "x"}]});
        assert_eq!(
            conflicts(
                &conflict_set("sidecarset2", ns("nginx")),
                &[conflict_set("sidecarset1", ns("nginx"))]
            )
            .len(),
            1
        );
        assert_eq!(
            conflicts(
                &conflict_set("sidecarset2", ns("nginx")),
                &[conflict_set("sidecarset1", ns("redis"))]
            )
            .len(),
            0
        );
        // v1alpha1's namespace counts as a namespace selector.
        let alpha = |n: &str| json!({"namespace": n, "containers": [{"name": "container-name", "image": "x"}]});
        assert_eq!(
            conflicts(
                &conflict_set("s2", alpha("a")),
                &[conflict_set("s1", alpha("b"))]
            )
            .len(),
            0
        );
        assert_eq!(
            conflicts(
                &conflict_set("s2", alpha("a")),
                &[conflict_set("s1", alpha("a"))]
            )
            .len(),
            1
        );
    }

    #[test]
    fn upstream_pod_metadata_conflicts() {
        let patch = |policy: &str, k: &str, v: &str| json!({"containers": [], "patchPodMetadata": [{"patchPolicy": policy, "annotations": {k: v}}]});
        let errs = conflicts(
            &conflict_set("sidecarset2", patch("Overwrite", "key1", "value1")),
            &[conflict_set(
                "sidecarset1",
                patch("MergePatchJson", "key1", "value1"),
            )],
        );
        assert_eq!(
            errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                r#"spec.patchPodMetadata[0].annotations[key1]: Invalid value: "key1": annotation key1 is in conflict with sidecarset sidecarset1"#
            ]
        );
        assert_eq!(
            conflicts(
                &conflict_set("sidecarset2", patch("Retain", "key1", "value1")),
                &[conflict_set(
                    "sidecarset1",
                    patch("Overwrite", "key2", "value2")
                )],
            ),
            []
        );
        assert_eq!(
            conflicts(
                &conflict_set(
                    "sidecarset2",
                    patch("MergePatchJson", "oom-score", r#"{"log-agent": 1}"#)
                ),
                &[conflict_set(
                    "sidecarset1",
                    patch("MergePatchJson", "oom-score", r#"{"envoy": 1}"#)
                )],
            ),
            []
        );
        // Retain on either side never conflicts; Overwrite against MergePatchJson does.
        assert_eq!(
            conflicts(
                &conflict_set("s2", patch("Retain", "k", "v")),
                &[conflict_set("s1", patch("Overwrite", "k", "v"))],
            ),
            []
        );
        assert_eq!(
            conflicts(
                &conflict_set("s2", patch("MergePatchJson", "k", "{}")),
                &[conflict_set("s1", patch("Overwrite", "k", "v"))],
            )
            .len(),
            1
        );
    }

    #[test]
    fn upstream_volume_conflicts() {
        let vols = |v: Value| json!({"containers": [], "volumes": v});
        assert_eq!(
            conflicts(
                &conflict_set(
                    "s2",
                    vols(json!([{"name": "volume-1"}, {"name": "volume-2"}]))
                ),
                &[conflict_set(
                    "s1",
                    vols(json!([{"name": "volume-3"}, {"name": "volume-4"}]))
                )],
            ),
            []
        );
        assert_eq!(
            conflicts(
                &conflict_set(
                    "s2",
                    vols(
                        json!([{"name": "volume-1"}, {"name": "volume-2", "hostPath": {"path": "/home/work"}}])
                    )
                ),
                &[conflict_set(
                    "s1",
                    vols(
                        json!([{"name": "volume-2", "hostPath": {"path": "/home/work"}}, {"name": "volume-3"}])
                    )
                )],
            ),
            []
        );
        let errs = conflicts(
            &conflict_set(
                "s2",
                vols(
                    json!([{"name": "volume-1"}, {"name": "volume-2", "hostPath": {"path": "/home/work-1"}}]),
                ),
            ),
            &[conflict_set(
                "s1",
                vols(
                    json!([{"name": "volume-2", "hostPath": {"path": "/home/work-2"}}, {"name": "volume-3"}]),
                ),
            )],
        );
        assert_eq!(
            errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                r#"spec.volumes[1].name: Invalid value: "volume-2": volume volume-2 is in conflict with sidecarset s1"#
            ]
        );
    }

    #[test]
    fn a_name_shared_between_a_container_and_an_init_container_conflicts() {
        let errs = conflicts(
            &conflict_set(
                "s2",
                json!({"initContainers": [{"name": "proxy", "image": "x"}]}),
            ),
            &[conflict_set(
                "s1",
                json!({"containers": [{"name": "proxy", "image": "x"}]}),
            )],
        );
        assert_eq!(paths(&errs), ["spec.initContainers[0].name"]);
    }

    #[test]
    fn disjoint_selectors_do_not_conflict_and_self_is_skipped() {
        let c = json!({"containers": [{"name": "proxy", "image": "x"}]});
        let other = set(
            "s1",
            with(
                with(base_json(), c.clone()),
                json!({"selector": {"matchLabels": {"a": "c"}}}),
            ),
        );
        let mine = set("s2", with(base_json(), c.clone()));
        assert_eq!(conflicts(&mine, &[other]), []);
        assert_eq!(conflicts(&mine, std::slice::from_ref(&mine)), []);
        // A stored SidecarSet without a selector selects no pod.
        let mut no_selector = set("s3", with(base_json(), c));
        no_selector.spec.selector = None;
        assert_eq!(conflicts(&mine, &[no_selector]), []);
    }

    #[test]
    fn a_canary_and_its_base_do_not_conflict_either_way() {
        let c = json!({"containers": [{"name": "proxy", "image": "proxy:1"}]});
        let base = set("base", with(base_json(), c.clone()));
        let canary = canary(
            "base-canary",
            "base",
            with(
                with(base_json(), c),
                json!({"selector": {"matchLabels": {"a": "b", "canary": "true"}}}),
            ),
        );
        assert_eq!(
            create_with(
                &canary,
                std::slice::from_ref(&base),
                &SidecarSetContext::default()
            ),
            []
        );
        // Upstream refuses any change to the base while its canary exists; we do not.
        let mut new_base = base.clone();
        new_base.spec.containers[0].container.image = Some("proxy:2".into());
        assert_eq!(update(&base, &new_base, std::slice::from_ref(&canary)), []);
        // Another SidecarSet still conflicts with both.
        let third = set(
            "third",
            with(
                base_json(),
                json!({"containers": [{"name": "proxy", "image": "x"}]}),
            ),
        );
        assert_eq!(
            create_with(&third, &[base, canary], &SidecarSetContext::default()).len(),
            1
        );
    }

    #[test]
    fn every_error_is_reported_at_once() {
        let s = set(
            "Bad",
            json!({"containers": [{"name": "a", "image": ""}], "updateStrategy": {"partition": -1}}),
        );
        let e = validate_create(&s, &[], &SidecarSetContext::default()).expect_err("invalid");
        assert_eq!(
            paths(&e.0),
            [
                "metadata.name",
                "spec.selector",
                "spec.updateStrategy.partition",
                "spec.containers[0].image"
            ]
        );
        assert!(
            e.to_string()
                .starts_with("[metadata.name: Invalid value: \"Bad\""),
            "{e}"
        );
    }
}
