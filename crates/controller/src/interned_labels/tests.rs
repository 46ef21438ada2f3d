use std::collections::BTreeMap;
use std::sync::Arc;

use kube::core::labels::Expression;
use kube::core::{Selector, SelectorExt};
use serde_json::json;

use super::*;

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn equal_strings_are_one_allocation() {
    let a = Labels::from(&map(&[("topology.kubernetes.io/zone", "eu-west-1a")]));
    let b: Labels = serde_json::from_value(json!({"topology.kubernetes.io/zone": "eu-west-1a"}))
        .expect("labels parse");
    assert_eq!(a, b);
    assert!(Arc::ptr_eq(&a.0[0].0, &b.0[0].0));
    assert!(Arc::ptr_eq(&a.0[0].1, &b.0[0].1));
}

#[test]
fn reads_and_round_trips_like_the_map() {
    let original = map(&[("b", "2"), ("a", "1"), ("kubernetes.io/hostname", "node-7")]);
    let labels = Labels::from(&original);
    assert_eq!(labels.len(), 3);
    assert_eq!(labels.get("a"), Some("1"));
    assert_eq!(labels.get("kubernetes.io/hostname"), Some("node-7"));
    assert_eq!(labels.get("c"), None);
    assert_eq!(labels.to_map(), original);
    assert_eq!(
        labels.iter().map(|(k, _)| k).collect::<Vec<_>>(),
        ["a", "b", "kubernetes.io/hostname"]
    );
    let json = serde_json::to_value(&labels).expect("serializes");
    assert_eq!(
        json,
        json!({"a": "1", "b": "2", "kubernetes.io/hostname": "node-7"})
    );
    let back: Labels = serde_json::from_value(json).expect("parses");
    assert_eq!(back, labels);
}

#[test]
fn escaped_strings_and_null_parse() {
    let labels: Labels =
        serde_json::from_str(r#"{"a\"b": "c\\d"}"#).expect("escaped strings parse");
    assert_eq!(labels.get("a\"b"), Some("c\\d"));
    let none: Labels = serde_json::from_str("null").expect("null parses");
    assert!(none.is_empty());
    let err = serde_json::from_str::<Labels>(r#"{"a": 1}"#).expect_err("a number is no label");
    assert!(err.to_string().contains("a string"), "{err}");
}

#[test]
fn a_map_larger_than_the_stack_room_reads_whole() {
    // Past `PAIRS_ON_STACK` entries the pairs move to the heap; nothing is lost, the last of a
    // repeated key still wins.
    let mut json: Vec<String> = (0..PAIRS_ON_STACK + 9)
        .map(|i| format!(r#""key-{i:03}": "value-{i}""#))
        .collect();
    json.push(r#""key-000": "last""#.to_owned());
    let json = format!("{{{}}}", json.join(", "));
    let labels: Labels = serde_json::from_str(&json).expect("parses");
    let as_map: BTreeMap<String, String> = serde_json::from_str(&json).expect("parses");
    assert_eq!(labels.len(), PAIRS_ON_STACK + 9);
    assert_eq!(labels.get("key-000"), Some("last"));
    assert_eq!(labels.to_map(), as_map);
}

#[test]
fn a_repeated_key_keeps_its_last_value_as_a_map_does() {
    let labels: Labels = serde_json::from_str(r#"{"a": "1", "b": "x", "a": "2"}"#).expect("parses");
    let as_map: BTreeMap<String, String> =
        serde_json::from_str(r#"{"a": "1", "b": "x", "a": "2"}"#).expect("parses");
    assert_eq!(labels.to_map(), as_map);
}

#[test]
fn selectors_match_as_on_a_map() {
    let labels_ = map(&[("zone", "a"), ("tier", "web"), ("gpu", "")]);
    let labels = Labels::from(&labels_);
    let cases: Vec<Expression> = vec![
        Expression::In("zone".into(), ["a".into(), "b".into()].into()),
        Expression::In("zone".into(), ["b".into()].into()),
        Expression::In("missing".into(), ["a".into()].into()),
        Expression::NotIn("zone".into(), ["b".into()].into()),
        Expression::NotIn("zone".into(), ["a".into()].into()),
        Expression::NotIn("missing".into(), ["a".into()].into()),
        Expression::Equal("tier".into(), "web".into()),
        Expression::Equal("tier".into(), "db".into()),
        Expression::NotEqual("tier".into(), "db".into()),
        Expression::NotEqual("missing".into(), "db".into()),
        Expression::Exists("gpu".into()),
        Expression::Exists("missing".into()),
        Expression::DoesNotExist("missing".into()),
        Expression::DoesNotExist("gpu".into()),
    ];
    for expression in cases {
        let selector = Selector::from(expression.clone());
        let requirements: Vec<Expression> = selector.clone().into_iter().collect();
        assert_eq!(
            labels.matches(&requirements),
            selector.matches(&labels_),
            "{expression:?}"
        );
    }
    assert!(labels.matches(&[]), "an empty selector selects everything");
}

#[test]
fn label_selectors_match_as_on_a_map() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

    use kruise_rs_sidecar::matching::selector_matches;
    let labels_ = map(&[("zone", "a"), ("tier", "web"), ("gpu", "")]);
    let labels = Labels::from(&labels_);
    let requirement = |key: &str, operator: &str, values: &[&str]| LabelSelectorRequirement {
        key: key.into(),
        operator: operator.into(),
        values: Some(values.iter().map(|v| v.to_string()).collect()),
    };
    let selectors = [
        LabelSelector::default(),
        LabelSelector {
            match_labels: Some(map(&[("zone", "a")])),
            ..Default::default()
        },
        LabelSelector {
            match_labels: Some(map(&[("zone", "b")])),
            ..Default::default()
        },
        LabelSelector {
            match_expressions: Some(vec![
                requirement("tier", "In", &["web", "db"]),
                requirement("gpu", "Exists", &[]),
            ]),
            ..Default::default()
        },
        LabelSelector {
            match_expressions: Some(vec![requirement("zone", "NotIn", &["a"])]),
            ..Default::default()
        },
        LabelSelector {
            match_expressions: Some(vec![requirement("missing", "DoesNotExist", &[])]),
            ..Default::default()
        },
        LabelSelector {
            match_expressions: Some(vec![requirement("zone", "Near", &[])]),
            ..Default::default()
        },
    ];
    for selector in selectors {
        assert_eq!(
            selector_matches(&selector, &labels),
            selector_matches(&selector, &labels_),
            "{selector:?}"
        );
    }
}

#[test]
fn insert_and_retain_shared() {
    let mut labels = Labels::from(&map(&[("b", "2"), ("a", "1")]));
    labels.insert("c", "3");
    labels.insert("a", "9");
    assert_eq!(labels.to_map(), map(&[("a", "9"), ("b", "2"), ("c", "3")]));
    labels.retain_shared(|k| k != "b");
    assert_eq!(labels.to_map(), map(&[("a", "9"), ("c", "3")]));
}

#[test]
fn an_unshared_map_keeps_its_strings_out_of_the_table_until_retained() {
    #[derive(serde::Deserialize)]
    struct Holder {
        #[serde(default, deserialize_with = "Labels::deserialize_unshared")]
        map: Option<Labels>,
    }
    let value = "interned-unshared-test-value";
    let held: Holder =
        serde_json::from_value(serde_json::json!({"map": {"k": value}})).expect("parses");
    let mut labels = held.map.expect("a map");
    assert!(!crate::interned::in_table(value));
    labels.retain_shared(|_| true);
    let shared = intern(value);
    assert!(std::ptr::eq(labels.get("k").expect("kept"), &*shared));
    for absent in [r#"{}"#, r#"{"map": null}"#] {
        let held: Holder = serde_json::from_str(absent).expect("parses");
        assert!(held.map.is_none(), "{absent}");
    }
}
