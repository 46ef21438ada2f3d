use super::*;
use k8s_openapi::api::core::v1::PodStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelectorRequirement, Time};
use kruise_rs_api::sidecarset::SidecarSetSpec;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn match_labels(pairs: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels(pairs)),
        match_expressions: None,
    }
}

fn expr(key: &str, op: &str, values: Option<&[&str]>) -> LabelSelector {
    LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: values.map(|v| v.iter().map(|s| s.to_string()).collect()),
        }]),
    }
}

fn set(name: &str, selector: Option<LabelSelector>) -> SidecarSet {
    SidecarSet::new(
        name,
        SidecarSetSpec {
            selector,
            ..Default::default()
        },
    )
}

fn pod(namespace: Option<&str>, pod_labels: &[(&str, &str)]) -> Pod {
    let mut p = Pod::default();
    p.metadata.name = Some("p".into());
    p.metadata.namespace = namespace.map(str::to_owned);
    p.metadata.labels = Some(labels(pod_labels));
    p
}

#[test]
fn match_labels_need_every_pair() {
    let s = match_labels(&[("app", "web"), ("tier", "fe")]);
    assert!(selector_matches(&s, &labels(&[("app", "web"), ("tier", "fe"), ("x", "y")])).unwrap());
    assert!(!selector_matches(&s, &labels(&[("app", "web")])).unwrap());
    assert!(!selector_matches(&s, &labels(&[("app", "web"), ("tier", "be")])).unwrap());
}

#[test]
fn operators_follow_kubernetes() {
    let l = labels(&[("env", "prod")]);
    let none = labels(&[]);
    assert!(selector_matches(&expr("env", "In", Some(&["prod", "qa"])), &l).unwrap());
    assert!(!selector_matches(&expr("env", "In", Some(&["qa"])), &l).unwrap());
    assert!(!selector_matches(&expr("env", "In", Some(&["prod"])), &none).unwrap());
    assert!(!selector_matches(&expr("env", "NotIn", Some(&["prod"])), &l).unwrap());
    assert!(selector_matches(&expr("env", "NotIn", Some(&["qa"])), &l).unwrap());
    assert!(
        selector_matches(&expr("env", "NotIn", Some(&["prod"])), &none).unwrap(),
        "NotIn holds when the key is absent"
    );
    assert!(selector_matches(&expr("env", "Exists", None), &l).unwrap());
    assert!(!selector_matches(&expr("env", "Exists", None), &none).unwrap());
    assert!(!selector_matches(&expr("env", "DoesNotExist", None), &l).unwrap());
    assert!(selector_matches(&expr("env", "DoesNotExist", None), &none).unwrap());
}

#[test]
fn in_and_notin_without_values_evaluate_like_upstream() {
    // Upstream's webhook builds requirements without validation: `In ()` matches nothing,
    // `NotIn ()` everything.
    let l = labels(&[("env", "prod")]);
    assert!(!selector_matches(&expr("env", "In", None), &l).unwrap());
    assert!(selector_matches(&expr("env", "NotIn", Some(&[])), &l).unwrap());
}

#[test]
fn an_unknown_operator_is_an_error_even_after_a_miss() {
    let mut s = expr("k", "badOp", None);
    s.match_labels = Some(labels(&[("a", "b")]));
    let err = selector_matches(&s, &labels(&[])).expect_err("bad operator");
    assert_eq!(err.operator, "badOp");
    assert!(err.to_string().contains("badOp"), "{err}");
}

#[test]
fn an_empty_selector_matches_everything_but_not_as_a_pod_selector() {
    let empty = LabelSelector::default();
    assert!(selector_matches(&empty, &labels(&[])).unwrap());
    assert!(selector_is_empty(&empty));
    let p = pod(Some("ns"), &[("app", "x")]);
    let ns = BTreeMap::new();
    assert!(!sidecarset_matches_pod(&set("s", Some(empty)), &p, &ns).unwrap());
    assert!(
        !sidecarset_matches_pod(&set("s", None), &p, &ns).unwrap(),
        "a nil selector matches nothing"
    );
}

#[test]
fn pod_selector_matches_pod_labels() {
    // Upstream TestPodHasNoMatchedSidecarSet / TestPodMatchedSidecarSet test1.
    let s = set("s", Some(match_labels(&[("app", "nginx")])));
    let ns = BTreeMap::new();
    assert!(sidecarset_matches_pod(&s, &pod(Some("app1"), &[("app", "nginx")]), &ns).unwrap());
    assert!(
        !sidecarset_matches_pod(&s, &pod(Some("app1"), &[("app", "doesnt-match")]), &ns).unwrap()
    );
    assert!(!sidecarset_matches_pod(&s, &pod(Some("app1"), &[]), &ns).unwrap());
}

#[test]
fn namespace_selector_matches_namespace_labels() {
    // Upstream TestPodMatchedSidecarSet test2..test4.
    let mut s = set("s", Some(match_labels(&[("app", "nginx")])));
    s.spec.namespace_selector = Some(match_labels(&[("ns", "app1")]));
    let p = pod(Some("app1"), &[("app", "nginx")]);
    assert!(sidecarset_matches_pod(&s, &p, &labels(&[("ns", "app1")])).unwrap());
    assert!(!sidecarset_matches_pod(&s, &p, &labels(&[("ns", "app2")])).unwrap());
    assert!(!sidecarset_matches_pod(&s, &p, &labels(&[])).unwrap());
}

#[test]
fn v1alpha1_namespace_matches_by_name_even_without_the_label() {
    let mut s = set("s", Some(match_labels(&[("app", "nginx")])));
    s.spec.namespace = Some("payments".into());
    let ns = BTreeMap::new();
    assert!(sidecarset_matches_pod(&s, &pod(Some("payments"), &[("app", "nginx")]), &ns).unwrap());
    assert!(!sidecarset_matches_pod(&s, &pod(Some("other"), &[("app", "nginx")]), &ns).unwrap());
}

#[test]
fn a_pod_without_namespace_is_in_default() {
    let mut s = set("s", Some(match_labels(&[("app", "nginx")])));
    s.spec.namespace = Some("default".into());
    assert!(sidecarset_matches_pod(&s, &pod(None, &[("app", "nginx")]), &BTreeMap::new()).unwrap());
    assert_eq!(pod_namespace(&pod(Some(""), &[])), "default");
}

#[test]
fn invalid_selectors_name_the_sidecarset_and_field() {
    let s = set("broken", Some(expr("k", "Near", None)));
    let err = sidecarset_matches_pod(&s, &pod(Some("a"), &[]), &BTreeMap::new()).expect_err("bad");
    assert_eq!(err.field, "selector");
    assert!(err.to_string().contains("broken"), "{err}");
    let mut s = set("broken-ns", Some(match_labels(&[("a", "b")])));
    s.spec.namespace_selector = Some(expr("k", "Near", None));
    let err = sidecarset_matches_pod(&s, &pod(Some("a"), &[]), &BTreeMap::new()).expect_err("bad");
    assert_eq!(err.field, "namespaceSelector");
}

#[test]
fn inactive_pods_are_not_candidates() {
    let mut p = pod(Some("a"), &[]);
    assert!(pod_is_active(&p));
    p.status = Some(PodStatus {
        phase: Some("Succeeded".into()),
        ..Default::default()
    });
    assert!(!pod_is_active(&p));
    let mut p = pod(Some("a"), &[]);
    p.metadata.deletion_timestamp = Some(Time("2024-01-01T00:00:00Z".parse().unwrap()));
    assert!(!pod_is_active(&p));
}

fn canary(name: &str, base: &str) -> SidecarSet {
    let mut s = set(name, Some(match_labels(&[("app", "x")])));
    s.metadata.annotations = Some(labels(&[
        (SIDECARSET_CANARY, "true"),
        (SIDECARSET_BASE, base),
    ]));
    s
}

#[test]
fn canary_annotations_need_both_keys() {
    assert_eq!(canary_base(&canary("c", "b")), Some("b"));
    assert_eq!(canary_base(&canary("c", "")), None);
    let mut not_canary = canary("c", "b");
    not_canary
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(SIDECARSET_CANARY.into(), "false".into());
    assert_eq!(canary_base(&not_canary), None);
    assert_eq!(canary_base(&set("s", None)), None);
}

#[test]
fn a_matching_canary_replaces_its_base() {
    let base = set("base", Some(match_labels(&[("app", "x")])));
    let other = set("other", Some(match_labels(&[("app", "x")])));
    let c = canary("canary", "base");
    let all = [c.clone(), other.clone(), base.clone()];
    let p = pod(Some("ns"), &[("app", "x")]);
    let names: Vec<_> = sidecarsets_for_pod(&all, &p, &BTreeMap::new())
        .unwrap()
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["canary", "other"]);

    // A canary that does not match the pod leaves the base in place.
    let mut c = canary("canary", "base");
    c.spec.selector = Some(match_labels(&[("app", "y")]));
    let all = [c, base];
    let names: Vec<_> = sidecarsets_for_pod(&all, &p, &BTreeMap::new())
        .unwrap()
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["base"]);
}

#[test]
fn paused_injection_skips_the_sidecarset_and_its_canary_role() {
    // Upstream TestInjectionStrategyPaused.
    let mut paused = set("paused", Some(match_labels(&[("app", "x")])));
    paused.spec.injection_strategy.paused = true;
    let mut paused_canary = canary("canary", "base");
    paused_canary.spec.injection_strategy.paused = true;
    let base = set("base", Some(match_labels(&[("app", "x")])));
    let all = [paused, paused_canary, base];
    let p = pod(Some("ns"), &[("app", "x")]);
    let names: Vec<_> = sidecarsets_for_pod(&all, &p, &BTreeMap::new())
        .unwrap()
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["base"]);
}

#[test]
fn results_come_in_name_order_without_duplicates() {
    let a = set("a", Some(match_labels(&[("app", "x")])));
    let b = set("b", Some(match_labels(&[("app", "x")])));
    let all = [b.clone(), a.clone(), b];
    let p = pod(Some("ns"), &[("app", "x")]);
    let names: Vec<_> = sidecarsets_for_pod(&all, &p, &BTreeMap::new())
        .unwrap()
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["a", "b"]);
}
