//! Pods an unreadable SidecarSet may select (decision 0027). Such a SidecarSet is out of the
//! pod webhook's cache (decision 0018), but its raw JSON is kept: its selection fields
//! (`spec.selector`, `spec.namespace`, `spec.namespaceSelector`, `spec.injectionStrategy.paused`)
//! are read one by one, so a broken container does not hide whom it selects. A part that does
//! not read either may select anything. What the webhook then does is
//! `--unreadable-sidecarset-policy`: admit with a warning (default) or refuse.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::de::DeserializeOwned;
use serde_json::Value;

use kruise_rs_api::well_known::NAMESPACE_NAME_LABEL;
use kruise_rs_controller::unreadable::read_with_path;
use kruise_rs_sidecar::matching::{selector_is_empty, selector_matches};

/// What the pod webhook does with a pod an unreadable SidecarSet may select.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum UnreadableSidecarSetPolicy {
    /// Admit the pod without that SidecarSet, with an admission warning naming it.
    #[default]
    Admit,
    /// Refuse the pod, naming the SidecarSet and the field that cannot be read.
    Refuse,
}

/// Whether an unreadable SidecarSet selects a pod, as far as its raw JSON tells.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Selection {
    /// A part that reads rules the pod out.
    No,
    /// Every selection part reads, and they select the pod.
    Yes,
    /// The parts that read do not rule the pod out; these could not be read (`path: why`).
    Maybe(Vec<String>),
}

/// Whether the SidecarSet whose raw object (without metadata) is `raw` selects a pod labelled
/// `pod_labels` in `namespace` labelled `namespace_labels`, with the webhook's rules
/// (`kruise_rs_sidecar::matching`): paused injection selects nothing, `spec.namespace` (when set)
/// stands for the namespace selector, an empty or unset pod selector matches no pod.
pub(crate) fn selects(
    raw: &Value,
    namespace: &str,
    pod_labels: &BTreeMap<String, String>,
    namespace_labels: &BTreeMap<String, String>,
) -> Selection {
    let spec = &raw["spec"];
    if !spec.is_object() && !spec.is_null() {
        return Selection::Maybe(vec![format!("spec: not an object: {spec}")]);
    }
    let mut unread = Vec::new();
    let paused: Option<Option<bool>> = read_part(
        "spec.injectionStrategy.paused",
        &spec["injectionStrategy"]["paused"],
        &mut unread,
    );
    if paused == Some(Some(true)) {
        return Selection::No;
    }
    let ns_name: Option<Option<String>> =
        read_part("spec.namespace", &spec["namespace"], &mut unread);
    let ns_selector: Option<Option<LabelSelector>> = read_part(
        "spec.namespaceSelector",
        &spec["namespaceSelector"],
        &mut unread,
    );
    let pod_selector: Option<Option<LabelSelector>> =
        read_part("spec.selector", &spec["selector"], &mut unread);

    let mut labels = namespace_labels.clone();
    labels
        .entry(NAMESPACE_NAME_LABEL.to_owned())
        .or_insert_with(|| namespace.to_owned());
    // Each constraint: Some(holds) when it can be evaluated, None when not.
    let namespace_holds = match (ns_name, ns_selector) {
        (Some(Some(name)), _) if !name.is_empty() => Some(name == namespace),
        (Some(_), Some(None)) => Some(true),
        (Some(_), Some(Some(selector))) => {
            evaluate("spec.namespaceSelector", &selector, &labels, &mut unread)
        }
        // `spec.namespace` unread (it could name any namespace) or its selector unread.
        _ => None,
    };
    let pod_holds = match pod_selector {
        Some(None) => Some(false),
        Some(Some(selector)) if selector_is_empty(&selector) => Some(false),
        Some(Some(selector)) => evaluate("spec.selector", &selector, pod_labels, &mut unread),
        None => None,
    };
    match (namespace_holds, pod_holds) {
        (Some(false), _) | (_, Some(false)) => Selection::No,
        (Some(true), Some(true)) => Selection::Yes,
        _ => Selection::Maybe(unread),
    }
}

/// `value` (absent: `Null`) read as an optional `T`; `None` when it does not read, with
/// `path: why` (naming the inner field) added to `unread`.
fn read_part<T: DeserializeOwned>(
    path: &str,
    value: &Value,
    unread: &mut Vec<String>,
) -> Option<Option<T>> {
    read_with_path::<Option<T>>(value)
        .map_err(|e| unread.push(e.under(path).to_string()))
        .ok()
}

fn evaluate(
    path: &str,
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
    unread: &mut Vec<String>,
) -> Option<bool> {
    selector_matches(selector, labels)
        .map_err(|e| unread.push(format!("{path}: {e}")))
        .ok()
}

/// The admission warning for a pod admitted although the unreadable SidecarSet `name` may
/// select it (`error`: why the SidecarSet cannot be read).
pub(crate) fn warning(name: &str, error: &str, selection: &Selection) -> String {
    format!(
        "SidecarSet {name:?} cannot be read ({error}){}, so this pod is admitted without its \
         sidecars; fix the SidecarSet, then recreate the pod",
        may_select(selection)
    )
}

/// The denial of a pod the unreadable SidecarSet `name` may select, under
/// `--unreadable-sidecarset-policy=refuse`.
pub(crate) fn refusal(name: &str, error: &str, selection: &Selection) -> String {
    format!(
        "SidecarSet {name:?} cannot be read ({error}){}; the manager refuses such pods until \
         it is fixed (--unreadable-sidecarset-policy=refuse)",
        may_select(selection)
    )
}

fn may_select(selection: &Selection) -> String {
    match selection {
        Selection::Maybe(unread) if !unread.is_empty() => format!(
            " and may select this pod: its selection cannot be read either ({})",
            unread.join("; ")
        ),
        Selection::Maybe(_) => " and may select this pod".to_owned(),
        Selection::Yes | Selection::No => " and selects this pod".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn on(raw: Value, namespace: &str, pod: &[(&str, &str)], ns: &[(&str, &str)]) -> Selection {
        selects(&raw, namespace, &labels(pod), &labels(ns))
    }

    /// A SidecarSet whose container does not read, with `selection` as its other spec fields.
    fn broken(selection: Value) -> Value {
        let mut spec = json!({"containers": [{"name": "c", "image": "i", "ports": "80"}]});
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), selection.as_object()) {
            spec.extend(extra.clone());
        }
        json!({"apiVersion": "apps.kruise.io/v1beta1", "kind": "SidecarSet", "spec": spec})
    }

    #[test]
    fn a_readable_selector_decides_despite_a_broken_container() {
        let set = broken(json!({"selector": {"matchLabels": {"app": "web"}}}));
        assert_eq!(on(set.clone(), "a", &[("app", "web")], &[]), Selection::Yes);
        assert_eq!(on(set, "a", &[("app", "db")], &[]), Selection::No);
    }

    #[test]
    fn namespaces_rule_pods_out_as_the_webhook_does() {
        let named =
            broken(json!({"namespace": "team-a", "selector": {"matchLabels": {"app": "web"}}}));
        assert_eq!(
            on(named.clone(), "team-a", &[("app", "web")], &[]),
            Selection::Yes
        );
        assert_eq!(on(named, "team-b", &[("app", "web")], &[]), Selection::No);
        let selected = broken(json!({
            "namespaceSelector": {"matchLabels": {"env": "prod"}},
            "selector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]}
        }));
        assert_eq!(
            on(selected.clone(), "x", &[("app", "web")], &[("env", "prod")]),
            Selection::Yes
        );
        assert_eq!(
            on(selected, "x", &[("app", "web")], &[("env", "dev")]),
            Selection::No
        );
        let by_name_label = broken(json!({
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "x"}},
            "selector": {"matchLabels": {"app": "web"}}
        }));
        assert_eq!(
            on(by_name_label, "x", &[("app", "web")], &[]),
            Selection::Yes
        );
    }

    #[test]
    fn no_selector_and_paused_injection_select_nothing() {
        assert_eq!(
            on(broken(json!({})), "a", &[("app", "web")], &[]),
            Selection::No
        );
        assert_eq!(
            on(broken(json!({"selector": {}})), "a", &[("app", "web")], &[]),
            Selection::No
        );
        let paused = broken(json!({
            "selector": {"matchLabels": {"app": "web"}},
            "injectionStrategy": {"paused": true}
        }));
        assert_eq!(on(paused, "a", &[("app", "web")], &[]), Selection::No);
    }

    #[test]
    fn an_unreadable_selector_may_select_any_pod_the_rest_allows() {
        let set = broken(json!({"selector": {"matchLabels": "app=web"}}));
        match on(set.clone(), "a", &[("app", "db")], &[]) {
            Selection::Maybe(unread) => assert_eq!(
                unread,
                ["spec.selector.matchLabels: invalid type: string \"app=web\", expected a map"]
            ),
            other => panic!("{other:?}"),
        }
        // A readable namespace still rules pods out.
        let elsewhere = broken(json!({"namespace": "team-a", "selector": 7}));
        assert_eq!(on(elsewhere.clone(), "team-b", &[], &[]), Selection::No);
        match on(elsewhere, "team-a", &[], &[]) {
            Selection::Maybe(unread) => {
                assert_eq!(unread.len(), 1, "{unread:?}");
                assert!(
                    unread[0].starts_with("spec.selector: invalid type: integer `7`"),
                    "{unread:?}"
                );
            }
            other => panic!("{other:?}"),
        }
        // An unreadable namespace could be any namespace.
        let any_namespace =
            broken(json!({"namespace": ["a"], "selector": {"matchLabels": {"app": "web"}}}));
        assert!(matches!(
            on(any_namespace, "z", &[("app", "web")], &[]),
            Selection::Maybe(_)
        ));
        // A bad operator cannot be evaluated either.
        let bad_operator =
            broken(json!({"selector": {"matchExpressions": [{"key": "app", "operator": "Near"}]}}));
        match on(bad_operator, "a", &[("app", "web")], &[]) {
            Selection::Maybe(unread) => assert!(
                unread[0].starts_with("spec.selector: \"Near\""),
                "{unread:?}"
            ),
            other => panic!("{other:?}"),
        }
        // Nothing readable at all: any pod.
        assert!(matches!(
            on(json!({"spec": "garbage"}), "a", &[], &[]),
            Selection::Maybe(_)
        ));
    }

    #[test]
    fn messages_name_the_sidecarset_and_the_fields() {
        let error = "spec.containers[0].ports: invalid type: string \"80\", expected a sequence";
        let warning = warning("bad", error, &Selection::Yes);
        assert!(
            warning.starts_with(
                "SidecarSet \"bad\" cannot be read (spec.containers[0].ports: invalid type"
            ),
            "{warning}"
        );
        assert!(
            warning.contains("admitted without its sidecars"),
            "{warning}"
        );
        let refusal = refusal(
            "bad",
            error,
            &Selection::Maybe(vec!["spec.selector: x".into()]),
        );
        assert!(refusal.contains("(spec.containers[0].ports:"), "{refusal}");
        assert!(
            refusal.contains(
                "may select this pod: its selection cannot be read either (spec.selector: x)"
            ),
            "{refusal}"
        );
        assert!(
            refusal.contains("--unreadable-sidecarset-policy=refuse"),
            "{refusal}"
        );
    }
}
