//! SidecarSet admission validation (upstream: `pkg/webhook/sidecarset/validating`).
//!
//! [`validate_create`] and [`validate_update`] check one SidecarSet, after defaulting
//! ([`crate::defaults::default_sidecarset`]), against every rule of upstream's validating
//! webhook, given what the caller looked up in the cluster: the other SidecarSets, this
//! SidecarSet's ControllerRevisions and the patch-metadata whitelist ([`SidecarSetContext`]).
//!
//! Rules, in the order they are checked:
//! 1. **metadata**: name required, an RFC 1123 label (≤ 63 characters); labels and annotations
//!    valid; no namespace (cluster-scoped).
//! 2. **canary** (`apps.kruise.io/sidecarset-canary: "true"` with `apps.kruise.io/sidecarset-base`):
//!    the base is not the SidecarSet itself, does not change on update, exists among the others
//!    and is not a canary itself; a canary uses `updateStrategy.type: NotUpdate`.
//! 3. **native sidecars**: an init container with `restartPolicy: Always` is upgraded in place
//!    like a container, so any update strategy is accepted (upstream requires `NotUpdate`:
//!    #1671); `HotUpgrade` only on a native sidecar of a `NotUpdate` SidecarSet (injected as
//!    twins, never upgraded; for one that updates pods, the error names the in-place upgrade
//!    that applies instead; a plain init container never).
//! 4. **selectors**: `selector` required, valid, non-empty; `namespaceSelector` valid and
//!    non-empty when set; v1alpha1's `namespace` an RFC 1123 label when set.
//! 5. **injectionStrategy.revision**: `revisionName` or `customVersion` set, and naming one of
//!    this SidecarSet's ControllerRevisions (`revisionName` wins when both are set, as upstream).
//! 6. **updateStrategy** (RollingUpdate only): `partition` and `selector` not together; selector
//!    valid and non-empty; `partition`/`maxUnavailable` non-negative integers or percents;
//!    `priorityStrategy` one of weight/order, weights 0–100, non-empty valid selectors,
//!    non-empty ordered keys; `scatterStrategy` non-empty keys, no duplicate key/value.
//! 7. **containers**: at least one container or init container; per container: with
//!    `HotUpgrade`, a `hotUpgradeEmptyImage` that is a valid reference other than the sidecar's
//!    image (upstream checks nothing; stricter, see `docs/upstream-differences.md`);
//!    `resourcesPolicy` as upstream
//!    (only on native-sidecar init containers, never with explicit resources, a non-empty
//!    compilable regex, limits or requests, valid expressions); image a valid reference; `transferEnv[].sourceContainerNameFrom.fieldRef` `v1` and
//!    `metadata.labels['k']` / `metadata.annotations['k']` with a valid key; then the names and
//!    images kruise-rs relies on (required, RFC 1123 container and volume names, unique). The
//!    rest of Kubernetes' pod rules are the cluster apiserver's, asked by the webhook's dry-run
//!    pod; [`pod_rules_as_of_1_33`] re-states them for when it cannot answer.
//!    (`podInjectPolicy`, `shareVolumePolicy.type`, the update strategy type and the revision
//!    policy are enums in the Rust types: an unknown value cannot be deserialized, and
//!    [`validate_raw_enums`] reports it in Kubernetes' form from the raw JSON.)
//! 8. **patchPodMetadata**: allowed by the whitelist policy; each entry has annotations, valid
//!    keys, and, for `MergePatchJson`, JSON values; no key in two entries.
//! 9. **imagePullSecrets**: at most [`crate::limits::MAX_PULL_SECRETS`] (ours: the webhook
//!    asks one SubjectAccessReview per Secret and namespace within its timeout), checked when
//!    new or changed.
//! 10. **update**: no container added or renamed (removal is fine); a container's
//!     `upgradeStrategy.upgradeType` does not change.
//! 11. **conflicts** with every other SidecarSet whose namespace selector and pod selector may
//!     select the same pods (upstream's overlap test, `super::is_selector_overlapping`), except
//!     a canary and its base: no shared container or init container name, no shared volume name
//!     with a different definition, no shared patched annotation key where either side uses
//!     `Overwrite`.
//!
//! Deliberate differences from upstream are listed on each rule's function; in short: every
//! error is reported (upstream stops at the first error of some groups and skips the conflict
//! checks when anything else failed), paths name the exact field, names are RFC 1123 labels (the
//! apiserver's own rule for the name joined with upstream's), a canary's base may be updated
//! while the canary exists, container names clash across containers and init containers,
//! `MergePatchJson` values must be JSON, images must parse, `imagePullSecrets` are bounded, and
//! an update that leaves the spec, labels and canary annotations alone is not re-validated
//! against the cluster (so a ControllerRevision pruned by history, or a conflicting SidecarSet
//! created in a race, never blocks a metadata-only update).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::Container;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::core::{Selector, SelectorExt};
use serde::Deserialize;

use super::pod_spec::{split_subscripted_path, validate_identities, validate_pod_parts};
use super::{
    FieldError, ValidationErrors, check_raw_enum, child, dns1123_label_errors, index, invalid_each,
    is_selector_overlapping, key, qualified_name_errors, selector_is_empty, validate_annotations,
    validate_int_or_percent, validate_label_selector, validate_labels, validate_max_items,
};
use crate::image::ImageRef;
use crate::quantity::expr::{Resource, validate as validate_expression};
use crate::sidecarset::{
    ResourcesPolicy, SidecarContainer, SidecarContainerUpgradeType, SidecarSet,
    SidecarSetPatchPolicy, SidecarSetSpec, SidecarSetUpdateStrategy, SidecarSetUpdateStrategyType,
};
use crate::well_known::{SIDECARSET_BASE, SIDECARSET_CANARY, SIDECARSET_CUSTOM_VERSION_LABEL};

/// Name of the ConfigMap (in the manager's namespace) holding the patch-metadata whitelist.
pub const WHITELIST_CONFIGMAP: &str = "kruise-configuration";
/// Key of the whitelist in [`WHITELIST_CONFIGMAP`].
pub const WHITELIST_CONFIGMAP_KEY: &str = "SidecarSet_PatchPodMetadata_WhiteList";
/// The manager flag that allows `patchPodMetadata` no whitelist rule covers (upstream's feature
/// gate `SidecarSetPatchPodMetadataDefaultsAllowed`); named in the refusals.
pub(crate) const DEFAULTS_ALLOWED_FLAG: &str = "--sidecarset-patch-pod-metadata-defaults-allowed";

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
/// `SidecarSetPatchPodMetadataDefaultsAllowed` (off by default; kruise-rs's manager flag
/// `--sidecarset-patch-pod-metadata-defaults-allowed`). kruise-rs keeps that default,
/// [`PatchPodMetadataPolicy::NotConfigured`], because an OpenKruise administrator relies on it:
/// a cluster migrating from upstream either has the ConfigMap (read it into
/// [`PatchPodMetadataPolicy::Whitelist`]) or the gate
/// ([`PatchPodMetadataPolicy::with_defaults_allowed`]), and one that has neither never allowed
/// patches.
#[derive(Clone, Debug, Default)]
pub enum PatchPodMetadataPolicy {
    /// No whitelist: `patchPodMetadata` is refused.
    #[default]
    NotConfigured,
    /// Any annotation may be patched (upstream's feature gate, no whitelist).
    AllowAll,
    /// The whitelist's rules.
    Whitelist(Vec<WhitelistRule>),
    /// The whitelist's rules for a SidecarSet some rule applies to, any annotation for the
    /// others (upstream's feature gate beside a whitelist: the gate never widens a rule that
    /// applies).
    WhitelistElseAllowAll(Vec<WhitelistRule>),
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
    /// This policy once the administrator allows `patchPodMetadata` by default (`allowed`;
    /// upstream's feature gate `SidecarSetPatchPodMetadataDefaultsAllowed`): a SidecarSet no
    /// whitelist rule applies to may patch any annotation, one a rule applies to still only the
    /// keys the rules allow. Unchanged when not `allowed`.
    pub fn with_defaults_allowed(self, allowed: bool) -> Self {
        if !allowed {
            return self;
        }
        match self {
            Self::NotConfigured | Self::AllowAll => Self::AllowAll,
            Self::Whitelist(rules) | Self::WhitelistElseAllowAll(rules) => {
                Self::WhitelistElseAllowAll(rules)
            }
        }
    }

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
    validate_pull_secret_count(new, None, &mut errs);
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
    validate_pull_secret_count(new, Some(old), &mut errs);
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
pub(crate) fn canary_base(set: &SidecarSet) -> Option<&str> {
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

/// `spec.imagePullSecrets` names at most [`crate::limits::MAX_PULL_SECRETS`] Secrets, when
/// new or changed from `old`'s.
fn validate_pull_secret_count(
    set: &SidecarSet,
    old: Option<&SidecarSet>,
    errs: &mut Vec<FieldError>,
) {
    errs.extend(validate_max_items(
        &set.spec.image_pull_secrets,
        old.map(|old| old.spec.image_pull_secrets.as_slice()),
        "spec.imagePullSecrets",
        crate::limits::MAX_PULL_SECRETS,
    ));
}

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

/// Native sidecars are upgraded in place by their image, as containers are, so `RollingUpdate`
/// is accepted with them (upstream refuses it with one `Required` error at
/// `spec.updateStrategy` per native sidecar: #1671). `HotUpgrade` on an init container is
/// refused at its `upgradeStrategy.upgradeType`: on a native sidecar of a SidecarSet that
/// updates pods, naming the in-place upgrade that applies instead; on a plain init container
/// as not supported (upstream ignores it there). A native sidecar of a `NotUpdate` SidecarSet
/// may use it: it is injected as twins, as upstream does, and never upgraded.
fn validate_native_sidecars(spec: &SidecarSetSpec, errs: &mut Vec<FieldError>) {
    let updates = update_type(&spec.update_strategy) != SidecarSetUpdateStrategyType::NotUpdate;
    for (i, c) in spec.init_containers.iter().enumerate() {
        let native = is_native_sidecar(&c.container);
        // Twins at injection, as upstream's; never upgraded (`validate_sidecar_fields` checks
        // the empty image).
        if upgrade_type(c) != SidecarContainerUpgradeType::HotUpgrade || (native && !updates) {
            continue;
        }
        let path = child(
            &child(&index("spec.initContainers", i), "upgradeStrategy"),
            "upgradeType",
        );
        errs.push(FieldError::forbidden(
            path,
            if native {
                "HotUpgrade is not supported for native sidecars (init containers with restartPolicy Always) of a SidecarSet that updates pods: kruise-rs upgrades them in place by their image; use ColdUpgrade"
            } else {
                "HotUpgrade is not supported for init containers by kruise-rs; use ColdUpgrade"
            },
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
        // Volume names are still checked on their own.
        errs.extend(validate_identities(&[], &[], &spec.volumes, "spec"));
        return;
    }
    for (list, containers) in [
        ("spec.initContainers", &spec.init_containers),
        ("spec.containers", &spec.containers),
    ] {
        for (i, c) in containers.iter().enumerate() {
            validate_sidecar_fields(c, &index(list, i), errs);
            if let Some(policy) = &c.resources_policy {
                let path = child(&index(list, i), "resourcesPolicy");
                let init = list == "spec.initContainers";
                validate_resources_policy(c, policy, init, &path, errs);
            }
        }
    }
    let init: Vec<&Container> = spec.init_containers.iter().map(|c| &c.container).collect();
    let containers: Vec<&Container> = spec.containers.iter().map(|c| &c.container).collect();
    errs.extend(validate_identities(
        &init,
        &containers,
        &spec.volumes,
        "spec",
    ));
}

/// Kubernetes' pod validation of the SidecarSet's containers, init containers and volumes as
/// this crate re-states it (the rules of 1.33, [`super::pod_spec`]). The webhook asks the
/// cluster's apiserver instead (a dry-run pod) and consults this only when that cannot answer,
/// turning what it finds into warnings: a newer Kubernetes may accept what these rules refuse
/// (decision 0033). The rules kruise-rs relies on itself are in `validate_create`.
pub fn pod_rules_as_of_1_33(set: &SidecarSet) -> Vec<FieldError> {
    let spec = &set.spec;
    let init: Vec<&Container> = spec.init_containers.iter().map(|c| &c.container).collect();
    let containers: Vec<&Container> = spec.containers.iter().map(|c| &c.container).collect();
    validate_pod_parts(&init, &containers, &spec.volumes, "spec")
}

/// `resourcesPolicy` (upstream's `validateResourcesPolicy`): only on native-sidecar init
/// containers among init containers; not together with explicit `resources` limits or requests
/// (then nothing else is checked, as upstream); a non-empty regex that compiles; at least one of
/// `limits` and `requests`; every non-empty expression parses, type-checks and evaluates for a
/// variable of 1 ([`crate::quantity::expr`]). Stricter than upstream: an expression
/// that multiplies or divides by the variable (a quantity) is refused here rather than failing
/// every pod.
fn validate_resources_policy(
    c: &SidecarContainer,
    policy: &ResourcesPolicy,
    init: bool,
    path: &str,
    errs: &mut Vec<FieldError>,
) {
    let resources = c.container.resources.as_ref();
    let set = |list: Option<&BTreeMap<String, Quantity>>| list.is_some_and(|l| !l.is_empty());
    if set(resources.and_then(|r| r.limits.as_ref()))
        || set(resources.and_then(|r| r.requests.as_ref()))
    {
        errs.push(FieldError::invalid_json(
            path,
            policy,
            "resourcesPolicy and resources cannot be configured together",
        ));
        return;
    }
    if init && c.container.restart_policy.as_deref() != Some("Always") {
        errs.push(FieldError::invalid_json(
            path,
            policy,
            "resourcesPolicy is only supported for init containers with restartPolicy Always",
        ));
    }
    let rp = child(path, "targetContainersNameRegex");
    match policy.target_containers_name_regex.as_deref() {
        Some("") => errs.push(FieldError::required(rp, "invalid empty regex")),
        Some(regex) => {
            if let Err(e) = regex::Regex::new(regex) {
                errs.push(FieldError::invalid(
                    rp,
                    regex,
                    format!("invalid regex pattern: {e}"),
                ));
            }
        }
        // The CRD's default is `.*`.
        None => {}
    }
    let ep = child(path, "resourcesExpr");
    let expr = &policy.resources_expr;
    if expr.limits.is_none() && expr.requests.is_none() {
        errs.push(FieldError::invalid_json(
            ep,
            expr,
            "at least one of limits or requests must be configured",
        ));
        return;
    }
    for (list, expressions) in [("limits", &expr.limits), ("requests", &expr.requests)] {
        let Some(expressions) = expressions else {
            continue;
        };
        for (resource, text) in [
            (Resource::Cpu, &expressions.cpu),
            (Resource::Memory, &expressions.memory),
        ] {
            let Some(text) = text.as_deref().filter(|t| !t.is_empty()) else {
                continue;
            };
            if let Err(e) = validate_expression(text, resource) {
                errs.push(FieldError::invalid(
                    child(&child(&ep, list), resource.as_str()),
                    text,
                    format!("invalid expression: {e}"),
                ));
            }
        }
    }
}

/// A hot-upgrade sidecar (a container, or a native-sidecar init container) needs
/// `hotUpgradeEmptyImage`, a valid reference other than its own image: its idle twin runs it.
/// Upstream checks none of it and injects an idle twin the apiserver refuses (an empty image),
/// or two twins of the same image that never go idle; we refuse the SidecarSet instead.
fn validate_hot_upgrade(c: &SidecarContainer, path: &str, errs: &mut Vec<FieldError>) {
    // The twins are `<name>-1` and `<name>-2`, and container names are DNS labels (63 at most).
    let name = &c.container.name;
    if name.len() > 61 {
        errs.push(FieldError::invalid(
            child(path.trim_end_matches(".upgradeStrategy"), "name"),
            name,
            "must be no more than 61 characters with upgradeType HotUpgrade: its twins add \"-1\" and \"-2\"",
        ));
    }
    let field = child(path, "hotUpgradeEmptyImage");
    let empty = c
        .upgrade_strategy
        .as_ref()
        .and_then(|s| s.hot_upgrade_empty_image.as_deref())
        .unwrap_or_default();
    if empty.trim().is_empty() {
        errs.push(FieldError::required(
            field,
            "upgradeType HotUpgrade needs the image the idle twin runs",
        ));
    } else if let Err(e) = ImageRef::parse(empty) {
        errs.push(FieldError::invalid(field, empty, e.kind().to_string()));
    } else if c.container.image.as_deref() == Some(empty) {
        errs.push(FieldError::invalid(
            field,
            empty,
            "must differ from the sidecar's image: the idle twin is told apart by it",
        ));
    }
}

/// The SidecarSet-specific fields of one container. Upstream checks transferEnv on containers
/// only and reports it at `…transferEnv.fieldRef`; we check both lists at the exact index.
fn validate_sidecar_fields(c: &SidecarContainer, path: &str, errs: &mut Vec<FieldError>) {
    let init = path.starts_with("spec.initContainers");
    if upgrade_type(c) == SidecarContainerUpgradeType::HotUpgrade
        && (!init || is_native_sidecar(&c.container))
    {
        validate_hot_upgrade(c, &child(path, "upgradeStrategy"), errs);
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
    let (rules, else_allow_all) = match policy {
        PatchPodMetadataPolicy::AllowAll => return,
        PatchPodMetadataPolicy::NotConfigured => {
            errs.push(FieldError::forbidden(
                path,
                format!(
                    "SidecarSet patch metadata whitelist not found: an administrator allows annotation keys in ConfigMap {WHITELIST_CONFIGMAP}, key {WHITELIST_CONFIGMAP_KEY}, or all of them with the manager flag {DEFAULTS_ALLOWED_FLAG}"
                ),
            ));
            return;
        }
        PatchPodMetadataPolicy::Whitelist(rules) => (rules, false),
        PatchPodMetadataPolicy::WhitelistElseAllowAll(rules) => (rules, true),
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
        if else_allow_all {
            return;
        }
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
pub(crate) fn may_select_same_pods(a: &SidecarSet, b: &SidecarSet) -> bool {
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
mod tests;
