//! Admission validation of the `apps.kruise.io` kinds, as pure functions.
//!
//! Each kind's module takes plain values (the object, the old object on update, whatever the
//! caller looked up in the cluster) and returns every problem it finds as a [`FieldError`], in
//! Kubernetes' own shape and wording, so a denial reads like any other apiserver rejection:
//!
//! ```text
//! spec.containers[1].podInjectPolicy: Unsupported value: "X": supported values: "BeforeAppContainer", "AfterAppContainer"
//! ```
//!
//! **Order: default, then validate.** Upstream runs its mutating webhook before its validating
//! webhook, and several rules only hold for defaulted objects (a NodeImage tag's `createdAt`, a
//! volume with no source becoming an `emptyDir`). The webhook must call
//! [`crate::defaults`] first and validate the result; the validators here accept a field
//! that defaulting fills (an unset `imagePullPolicy`, `podInjectPolicy`, …) rather than demand it.
//!
//! This module holds what the kinds share: the error types, Kubernetes' name/label/annotation
//! rules (`k8s.io/apimachinery/pkg/util/validation`), label-selector validation and upstream's
//! selector-overlap test.

pub mod imagelistpulljob;
pub mod imagepulljob;
pub mod nodeimage;
pub mod pod_spec;
pub mod sidecarset;

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

// --- Errors -----------------------------------------------------------------------------------

/// What is wrong with a field; the variants and their wording are Kubernetes'
/// (`k8s.io/apimachinery/pkg/util/validation/field`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A required field is missing or empty.
    Required,
    /// A value is malformed or out of range.
    Invalid,
    /// A value that must be unique appears twice.
    Duplicate,
    /// The field may not be set (here, or with these other fields, or at all in kruise-rs).
    Forbidden,
    /// A value outside a fixed set of supported values.
    NotSupported,
    /// A reference to something that does not exist.
    NotFound,
    /// A value longer than allowed.
    TooLong,
    /// A list or map with more items than allowed.
    TooMany,
}

impl ErrorKind {
    /// Kubernetes' text for the kind (`field.ErrorType.String()`).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Required => "Required value",
            ErrorKind::Invalid => "Invalid value",
            ErrorKind::Duplicate => "Duplicate value",
            ErrorKind::Forbidden => "Forbidden",
            ErrorKind::NotSupported => "Unsupported value",
            ErrorKind::NotFound => "Not found",
            ErrorKind::TooLong => "Too long",
            ErrorKind::TooMany => "Too many",
        }
    }

    /// Kinds whose rendering never shows the offending value (as in Kubernetes).
    fn omits_value(self) -> bool {
        matches!(
            self,
            ErrorKind::Required | ErrorKind::Forbidden | ErrorKind::TooLong
        )
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One problem with one field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct FieldError {
    /// The field, in Kubernetes' path syntax: `spec.containers[1].podInjectPolicy`,
    /// `metadata.annotations[apps.kruise.io/sidecarset-base]`.
    pub path: String,
    pub kind: ErrorKind,
    /// The offending value, already rendered (strings quoted, numbers bare, structures as JSON);
    /// `None` when there is nothing useful to show.
    pub value: Option<String>,
    /// What is wrong, or what would be right. May be empty.
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.kind)?;
        if !self.kind.omits_value()
            && let Some(value) = &self.value
        {
            write!(f, ": {value}")?;
        }
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

pub use crate::quote::quote;

impl FieldError {
    fn new(
        path: impl Into<String>,
        kind: ErrorKind,
        value: Option<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            path: path.into(),
            kind,
            value,
            message: message.into(),
        }
    }

    /// `Required value`; `message` may be empty.
    pub fn required(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(path, ErrorKind::Required, None, message)
    }

    /// `Invalid value` for a string value (shown quoted).
    pub fn invalid(path: impl Into<String>, value: &str, message: impl Into<String>) -> Self {
        Self::new(path, ErrorKind::Invalid, Some(quote(value)), message)
    }

    /// `Invalid value` for a number.
    pub fn invalid_int(path: impl Into<String>, value: i64, message: impl Into<String>) -> Self {
        Self::new(path, ErrorKind::Invalid, Some(value.to_string()), message)
    }

    /// `Invalid value` for a structured value, shown as JSON.
    pub fn invalid_json(
        path: impl Into<String>,
        value: &impl serde::Serialize,
        message: impl Into<String>,
    ) -> Self {
        let rendered = serde_json::to_string(value).unwrap_or_else(|_| "<unprintable>".into());
        Self::new(path, ErrorKind::Invalid, Some(rendered), message)
    }

    /// `Duplicate value`.
    pub fn duplicate(path: impl Into<String>, value: &str) -> Self {
        Self::new(path, ErrorKind::Duplicate, Some(quote(value)), "")
    }

    /// `Forbidden`; the message says why.
    pub fn forbidden(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(path, ErrorKind::Forbidden, None, message)
    }

    /// `Unsupported value`, listing the supported values as Kubernetes does.
    pub fn not_supported(path: impl Into<String>, value: &str, supported: &[&str]) -> Self {
        let list = supported
            .iter()
            .map(|s| quote(s))
            .collect::<Vec<_>>()
            .join(", ");
        Self::new(
            path,
            ErrorKind::NotSupported,
            Some(quote(value)),
            format!("supported values: {list}"),
        )
    }

    /// `Not found`.
    pub fn not_found(path: impl Into<String>, value: &str, message: impl Into<String>) -> Self {
        Self::new(path, ErrorKind::NotFound, Some(quote(value)), message)
    }

    /// `Too long`, in bytes.
    pub fn too_long(path: impl Into<String>, max_bytes: usize) -> Self {
        Self::new(
            path,
            ErrorKind::TooLong,
            None,
            format!("may not be more than {max_bytes} bytes"),
        )
    }

    /// `Too many`: `actual` items where at most `max` are allowed.
    pub fn too_many(path: impl Into<String>, actual: usize, max: usize) -> Self {
        Self::new(
            path,
            ErrorKind::TooMany,
            Some(actual.to_string()),
            format!("must have at most {max} items"),
        )
    }
}

/// Every problem found in one object. Displayed as Kubernetes aggregates field errors: one error
/// alone, several as `[first, second]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, thiserror::Error)]
pub struct ValidationErrors(pub Vec<FieldError>);

impl ValidationErrors {
    /// `Ok` when there is nothing to report.
    pub fn into_result(self) -> Result<(), ValidationErrors> {
        if self.0.is_empty() { Ok(()) } else { Err(self) }
    }

    pub fn errors(&self) -> &[FieldError] {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}

impl From<Vec<FieldError>> for ValidationErrors {
    fn from(errors: Vec<FieldError>) -> Self {
        Self(errors)
    }
}

impl IntoIterator for ValidationErrors {
    type Item = FieldError;
    type IntoIter = std::vec::IntoIter<FieldError>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // As Kubernetes' aggregate: identical messages once, one error bare, several bracketed.
        let mut seen = std::collections::HashSet::new();
        let messages: Vec<String> = self
            .0
            .iter()
            .map(ToString::to_string)
            .filter(|m| seen.insert(m.clone()))
            .collect();
        match messages.as_slice() {
            [] => f.write_str("no errors"),
            [one] => f.write_str(one),
            many => write!(f, "[{}]", many.join(", ")),
        }
    }
}

// --- Paths ------------------------------------------------------------------------------------

/// `parent.child`.
pub(crate) fn child(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_owned()
    } else {
        format!("{parent}.{name}")
    }
}

/// `parent[index]`.
pub(crate) fn index(parent: &str, i: usize) -> String {
    format!("{parent}[{i}]")
}

/// `parent[key]`, Kubernetes' spelling of a map entry.
pub(crate) fn key(parent: &str, key: &str) -> String {
    format!("{parent}[{key}]")
}

// --- Kubernetes' string rules (k8s.io/apimachinery/pkg/util/validation) -----------------------

const DNS1123_LABEL_MAX: usize = 63;
const DNS1123_SUBDOMAIN_MAX: usize = 253;
const QUALIFIED_NAME_MAX: usize = 63;
const LABEL_VALUE_MAX: usize = 63;
/// Total size of an object's annotations (keys and values).
pub(crate) const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";

/// Kubernetes' `RegexError` wording.
fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    let mut out = msg.to_owned();
    out.push_str(" (e.g. ");
    for (i, example) in examples.iter().enumerate() {
        if i > 0 {
            out.push_str(" or ");
        }
        out.push('\'');
        out.push_str(example);
        out.push_str("', ");
    }
    out.push_str("regex used for validation is '");
    out.push_str(fmt);
    out.push_str("')");
    out
}

fn max_len_error(max: usize) -> String {
    format!("must be no more than {max} characters")
}

fn is_lower_alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`
fn matches_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(&first), Some(&last)) => {
            is_lower_alnum(first)
                && is_lower_alnum(last)
                && b.iter().all(|&c| is_lower_alnum(c) || c == b'-')
        }
        _ => false,
    }
}

fn matches_dns1123_subdomain(s: &str) -> bool {
    s.split('.').all(matches_dns1123_label)
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`
fn matches_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && b.iter()
                    .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// Problems with `value` as an RFC 1123 label (container, volume, namespace names); empty when
/// valid. Kubernetes' `IsDNS1123Label`.
pub(crate) fn dns1123_label_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_LABEL_MAX {
        errs.push(max_len_error(DNS1123_LABEL_MAX));
    }
    if !matches_dns1123_label(value) {
        if matches_dns1123_subdomain(value) {
            errs.push("must not contain dots".to_owned());
        } else {
            errs.push(regex_error(
                DNS1123_LABEL_MSG,
                DNS1123_LABEL_FMT,
                &["my-name", "123-abc"],
            ));
        }
    }
    errs
}

/// Problems with `value` as an RFC 1123 subdomain (object names, qualified-name prefixes).
/// Kubernetes' `IsDNS1123Subdomain`.
pub(crate) fn dns1123_subdomain_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX));
    }
    if !matches_dns1123_subdomain(value) {
        errs.push(regex_error(
            DNS1123_SUBDOMAIN_MSG,
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errs
}

/// Problems with `value` as a qualified name (label keys, annotation keys after lower-casing):
/// an optional DNS subdomain prefix and `/`, then a name part. Kubernetes' `IsQualifiedName`.
pub(crate) fn qualified_name_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_owned());
            } else {
                errs.extend(
                    dns1123_subdomain_errors(prefix)
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(
                    QUALIFIED_NAME_MSG,
                    QUALIFIED_NAME_FMT,
                    &["MyName", "my.name", "123-abc"]
                )
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_owned());
    } else if name.len() > QUALIFIED_NAME_MAX {
        errs.push(format!("name part {}", max_len_error(QUALIFIED_NAME_MAX)));
    }
    if !matches_qualified_name_part(name) {
        errs.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_MSG,
                QUALIFIED_NAME_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    errs
}

/// Problems with `value` as a label value (empty is valid). Kubernetes' `IsValidLabelValue`.
pub(crate) fn label_value_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > LABEL_VALUE_MAX {
        errs.push(max_len_error(LABEL_VALUE_MAX));
    }
    if !value.is_empty() && !matches_qualified_name_part(value) {
        errs.push(regex_error(
            LABEL_VALUE_MSG,
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

/// `Invalid` errors at `path` for each of `messages` about `value`.
pub(crate) fn invalid_each(path: &str, value: &str, messages: Vec<String>) -> Vec<FieldError> {
    messages
        .into_iter()
        .map(|m| FieldError::invalid(path, value, m))
        .collect()
}

/// A label key (Kubernetes' `ValidateLabelName`): errors at `path`.
pub(crate) fn validate_label_key(k: &str, path: &str) -> Vec<FieldError> {
    invalid_each(path, k, qualified_name_errors(k))
}

/// A label map (Kubernetes' `ValidateLabels`): keys are qualified names, values label values.
pub(crate) fn validate_labels(labels: &BTreeMap<String, String>, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for (k, v) in labels {
        errs.extend(validate_label_key(k, path));
        errs.extend(invalid_each(path, v, label_value_errors(v)));
    }
    errs
}

/// An annotation map (Kubernetes' `ValidateAnnotations`): keys are qualified names once
/// lower-cased; keys and values together at most 256 KiB.
pub(crate) fn validate_annotations(
    annotations: &BTreeMap<String, String>,
    path: &str,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut total = 0usize;
    for (k, v) in annotations {
        errs.extend(invalid_each(
            path,
            k,
            qualified_name_errors(&k.to_lowercase()),
        ));
        total = total.saturating_add(k.len()).saturating_add(v.len());
    }
    if total > TOTAL_ANNOTATION_SIZE_LIMIT {
        errs.push(FieldError::too_long(path, TOTAL_ANNOTATION_SIZE_LIMIT));
    }
    errs
}

const SELECTOR_OPERATORS: [&str; 4] = ["In", "NotIn", "Exists", "DoesNotExist"];

/// A label selector (Kubernetes' `ValidateLabelSelector` with default options): label keys and
/// values valid, operators known, `values` set exactly for `In`/`NotIn`. An empty selector is
/// valid here; kinds that forbid it say so themselves.
pub(crate) fn validate_label_selector(selector: &LabelSelector, path: &str) -> Vec<FieldError> {
    validate_selector_parts(
        selector.match_labels.as_ref(),
        selector.match_expressions.as_deref(),
        path,
    )
}

/// [`validate_label_selector`] for the parts of a selector inlined into another object
/// (ImagePullJob's `selector` carries `names` next to them).
pub(crate) fn validate_selector_parts(
    match_labels: Option<&BTreeMap<String, String>>,
    match_expressions: Option<&[LabelSelectorRequirement]>,
    path: &str,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(labels) = match_labels {
        errs.extend(validate_labels(labels, &child(path, "matchLabels")));
    }
    for (i, req) in match_expressions.unwrap_or_default().iter().enumerate() {
        let req_path = index(&child(path, "matchExpressions"), i);
        let values = req.values.as_deref().unwrap_or_default();
        match req.operator.as_str() {
            "In" | "NotIn" => {
                if values.is_empty() {
                    errs.push(FieldError::required(
                        child(&req_path, "values"),
                        "must be specified when `operator` is 'In' or 'NotIn'",
                    ));
                }
            }
            "Exists" | "DoesNotExist" => {
                if !values.is_empty() {
                    errs.push(FieldError::forbidden(
                        child(&req_path, "values"),
                        "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                    ));
                }
            }
            other => errs.push(FieldError::not_supported(
                child(&req_path, "operator"),
                other,
                &SELECTOR_OPERATORS,
            )),
        }
        errs.extend(validate_label_key(&req.key, &child(&req_path, "key")));
        for (j, value) in values.iter().enumerate() {
            errs.extend(invalid_each(
                &index(&child(&req_path, "values"), j),
                value,
                label_value_errors(value),
            ));
        }
    }
    errs
}

/// Whether a selector says nothing (matches everything).
pub(crate) fn selector_is_empty(selector: &LabelSelector) -> bool {
    selector
        .match_labels
        .as_ref()
        .is_none_or(BTreeMap::is_empty)
        && selector
            .match_expressions
            .as_ref()
            .is_none_or(Vec::is_empty)
}

// --- Numbers ----------------------------------------------------------------------------------

/// `must be greater than or equal to 0` when negative (Kubernetes' `ValidateNonnegativeField`).
pub(crate) fn validate_nonnegative(value: i64, path: &str) -> Vec<FieldError> {
    if value < 0 {
        vec![FieldError::invalid_int(
            path,
            value,
            "must be greater than or equal to 0",
        )]
    } else {
        Vec::new()
    }
}

/// At most `max` items in the list at `path` (Kubernetes' `TooMany` wording). Checked only when
/// the list is new or changed (`old` is the list before an update), so an object stored before
/// the bound can still be edited, as the apiserver's CRD validation ratchets.
pub(crate) fn validate_max_items<T: PartialEq>(
    items: &[T],
    old: Option<&[T]>,
    path: &str,
    max: usize,
) -> Vec<FieldError> {
    if items.len() <= max || old == Some(items) {
        Vec::new()
    } else {
        vec![FieldError::too_many(path, items.len(), max)]
    }
}

/// A number within `min..=max` (Kubernetes' `InclusiveRangeError` wording).
pub(crate) fn validate_range(value: i64, path: &str, min: i64, max: i64) -> Vec<FieldError> {
    if (min..=max).contains(&value) {
        Vec::new()
    } else {
        vec![FieldError::invalid_int(
            path,
            value,
            format!("must be between {min} and {max}, inclusive"),
        )]
    }
}

/// A non-negative integer or a percent string such as `"20%"` (Kubernetes'
/// `ValidatePositiveIntOrPercent`, which despite its name accepts 0).
pub(crate) fn validate_int_or_percent(value: &IntOrString, path: &str) -> Vec<FieldError> {
    match value {
        IntOrString::Int(i) => validate_nonnegative(i64::from(*i), path),
        IntOrString::String(s) => {
            let valid = s.strip_suffix('%').is_some_and(|digits| {
                !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
            });
            if valid {
                Vec::new()
            } else {
                vec![FieldError::invalid(
                    path,
                    s,
                    regex_error(
                        "a valid percent string must be a numeric string followed by an ending '%'",
                        "[0-9]+%",
                        &["1%", "93%"],
                    ),
                )]
            }
        }
    }
}

// --- Enum fields before deserialization ---------------------------------------------------------

/// Checks a string-enum field in raw JSON, before it is deserialized into the typed API structs.
///
/// The typed structs cannot hold an unknown enum value, so serde rejects the whole object with a
/// bare message. A webhook that first runs the kind's `validate_raw_enums` on the request's JSON
/// can answer in Kubernetes' form instead (`spec.updateStrategy.type: Unsupported value: "Sometimes":
/// supported values: "RollingUpdate", "NotUpdate"`).
///
/// `pattern` is a dotted path where `name[*]` walks every item of a list and `name{*}` every value
/// of a map; absent and `null` fields are skipped.
pub(crate) fn check_raw_enum(
    raw: &serde_json::Value,
    pattern: &str,
    supported: &[&str],
) -> Vec<FieldError> {
    let segments: Vec<&str> = pattern.split('.').collect();
    let mut errs = Vec::new();
    walk_raw(raw, &segments, String::new(), supported, &mut errs);
    errs
}

fn walk_raw(
    value: &serde_json::Value,
    segments: &[&str],
    path: String,
    supported: &[&str],
    errs: &mut Vec<FieldError>,
) {
    use serde_json::Value;
    let Some((segment, rest)) = segments.split_first() else {
        match value {
            Value::Null => {}
            Value::String(s) if supported.contains(&s.as_str()) => {}
            Value::String(s) => errs.push(FieldError::not_supported(path, s, supported)),
            other => errs.push(FieldError::new(
                path,
                ErrorKind::Invalid,
                Some(other.to_string()),
                "must be a string",
            )),
        }
        return;
    };
    let (name, each) = if let Some(name) = segment.strip_suffix("[*]") {
        (name, Some(false))
    } else if let Some(name) = segment.strip_suffix("{*}") {
        (name, Some(true))
    } else {
        (*segment, None)
    };
    let Some(field) = value.get(name) else {
        return;
    };
    let field_path = child(&path, name);
    match (each, field) {
        (None, _) => walk_raw(field, rest, field_path, supported, errs),
        (Some(false), Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                walk_raw(item, rest, index(&field_path, i), supported, errs);
            }
        }
        (Some(true), Value::Object(entries)) => {
            for (k, item) in entries {
                walk_raw(item, rest, key(&field_path, k), supported, errs);
            }
        }
        // A list or map of the wrong shape is serde's (or the schema's) to report.
        _ => {}
    }
}

// --- Selector overlap (upstream's util.IsSelectorOverlapping) -----------------------------------

/// What one selector demands of one label key, as far as the overlap test cares.
#[derive(Debug)]
enum KeyDemand<'a> {
    /// The key must exist, with any value (`Exists`).
    Any,
    /// The key must have one of these values (`matchLabels`, `In`).
    OneOf(Vec<&'a str>),
}

/// Upstream's notion of "these two label selectors may select the same object", used to find
/// SidecarSets that could inject into the same pod. Deliberately loose, as upstream's: it is
/// `false` only when some key settles it, e.g. `a=b` vs `a=c`, `a In [b,c]` vs `a NotIn [b,c]`,
/// `a Exists` vs `a DoesNotExist`, `a=b` vs `a DoesNotExist`. Selectors on different keys overlap.
///
/// Two fixes over upstream (kruise `pkg/util/selector.go`): an `Exists` on a key the other
/// selector does not mention is an overlap (upstream calls it disjoint, so `{a Exists}` and
/// `{b=c}` never conflict although a pod with both labels matches both); and "any value" is a
/// marker, not the literal label value `"ALL"`, which upstream confuses with it.
pub(crate) fn is_selector_overlapping(a: &LabelSelector, b: &LabelSelector) -> bool {
    !(is_disjoint(a, b) || is_disjoint(b, a))
}

/// Whether the demands `a` makes (by `matchLabels`, `In`, `Exists`) contradict `b`.
fn is_disjoint(a: &LabelSelector, b: &LabelSelector) -> bool {
    let mut demands: BTreeMap<&str, KeyDemand<'_>> = BTreeMap::new();
    for (k, v) in a.match_labels.iter().flatten() {
        demands.insert(k, KeyDemand::OneOf(vec![v]));
    }
    for req in a.match_expressions.iter().flatten() {
        match req.operator.as_str() {
            "In" => {
                let values = req.values.iter().flatten().map(String::as_str);
                match demands.entry(&req.key) {
                    std::collections::btree_map::Entry::Vacant(e) => {
                        e.insert(KeyDemand::OneOf(values.collect()));
                    }
                    std::collections::btree_map::Entry::Occupied(mut e) => {
                        if let KeyDemand::OneOf(existing) = e.get_mut() {
                            existing.extend(values);
                        }
                    }
                }
            }
            "Exists" => {
                demands.insert(&req.key, KeyDemand::Any);
            }
            _ => {}
        }
    }

    for (k, v) in b.match_labels.iter().flatten() {
        if let Some(KeyDemand::OneOf(values)) = demands.get(k.as_str())
            && !values.contains(&v.as_str())
        {
            return true;
        }
    }
    for req in b.match_expressions.iter().flatten() {
        let demand = demands.get(req.key.as_str());
        let values: Vec<&str> = req.values.iter().flatten().map(String::as_str).collect();
        let disjoint = match (req.operator.as_str(), demand) {
            ("In", Some(KeyDemand::OneOf(wanted))) => !wanted.iter().any(|w| values.contains(w)),
            ("NotIn", Some(KeyDemand::OneOf(wanted))) => wanted.iter().all(|w| values.contains(w)),
            ("DoesNotExist", Some(_)) => true,
            _ => false,
        };
        if disjoint {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests;
