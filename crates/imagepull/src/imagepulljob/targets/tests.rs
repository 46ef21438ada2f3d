use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use k8s_openapi::jiff::Timestamp;
use kruise_rs_controller::pod_summary::{PodSpecSummary, PodStatusSummary};

use super::*;
use crate::compact_nodeimage::{
    ImageSpec, ImageStatus, ImageTagSpec, ImageTagStatus, NodeImageStatus,
};
use kruise_rs_api::imagepulljob::{
    ImagePullJobNodeSelector, ImagePullJobSpec, ImagePullJobTemplate,
};
use kruise_rs_api::nodeimage::NodeImage;

fn nodeimage(name: &str, labels: &[(&str, &str)]) -> LeanNodeImage {
    let mut n = NodeImage::new(name, Default::default());
    n.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    n.into()
}

fn job(spec: ImagePullJobSpec) -> ImagePullJob {
    let mut j = ImagePullJob::new("j", spec);
    j.metadata.namespace = Some("ns".into());
    j.metadata.uid = Some("uid-1".into());
    j
}

fn pod(name: &str, ns: &str, node: &str, created: i64, phase: &str) -> PodSummary {
    PodSummary::new(
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            labels: Some(BTreeMap::from([("app".to_owned(), "web".to_owned())])),
            creation_timestamp: Some(Time(Timestamp::from_second(created).unwrap())),
            ..Default::default()
        },
        Some(PodSpecSummary {
            node_name: Some(node.into()),
            ..Default::default()
        }),
        Some(PodStatusSummary {
            phase: Some(phase.into()),
            ..Default::default()
        }),
    )
}
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

fn nodes() -> Vec<LeanNodeImage> {
    [
        nodeimage("n3", &[("zone", "a")]),
        nodeimage("n1", &[("zone", "b")]),
        nodeimage("n2", &[("zone", "a")]),
    ]
    .map(LeanNodeImage::from)
    .into()
}

#[test]
fn no_selector_means_every_node_by_name() {
    let j = job(ImagePullJobSpec {
        image: "nginx".into(),
        ..Default::default()
    });
    assert_eq!(select_nodes(&j, &nodes(), []).unwrap(), ["n1", "n2", "n3"]);
}

#[test]
fn names_keep_the_users_order_and_skip_unknown_and_repeated_nodes() {
    let j = job(ImagePullJobSpec {
        image: "nginx".into(),
        template: ImagePullJobTemplate {
            selector: Some(ImagePullJobNodeSelector {
                names: vec!["n3".into(), "gone".into(), "n1".into(), "n3".into()],
                ..Default::default()
            }),
            ..Default::default()
        },
    });
    assert_eq!(select_nodes(&j, &nodes(), []).unwrap(), ["n3", "n1"]);
}

#[test]
fn label_selector_matches_nodeimage_labels() {
    let j = job(ImagePullJobSpec {
        image: "nginx".into(),
        template: ImagePullJobTemplate {
            selector: Some(ImagePullJobNodeSelector {
                match_labels: Some(BTreeMap::from([("zone".to_owned(), "a".to_owned())])),
                ..Default::default()
            }),
            ..Default::default()
        },
    });
    assert_eq!(select_nodes(&j, &nodes(), []).unwrap(), ["n2", "n3"]);
}

#[test]
fn pod_selector_follows_pods_oldest_first_once_per_node() {
    let j = job(ImagePullJobSpec {
        image: "nginx".into(),
        template: ImagePullJobTemplate {
            pod_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([("app".to_owned(), "web".to_owned())])),
                ..Default::default()
            }),
            ..Default::default()
        },
    });
    let mut deleting = pod("d", "ns", "n1", 1, "Running");
    deleting.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(5).unwrap()));
    let pods = [
        pod("c", "ns", "n1", 30, "Running"),
        pod("a", "ns", "n3", 10, "Pending"),
        pod("b", "ns", "n3", 20, "Running"),
        pod("e", "other", "n2", 1, "Running"),
        pod("f", "ns", "n2", 5, "Succeeded"),
        pod("g", "ns", "unknown-node", 2, "Running"),
        deleting,
    ];
    assert_eq!(select_nodes(&j, &nodes(), &pods).unwrap(), ["n3", "n1"]);
}

#[test]
fn a_bad_selector_is_an_error_naming_the_field() {
    let j = job(ImagePullJobSpec {
        image: "nginx".into(),
        template: ImagePullJobTemplate {
            pod_selector: Some(LabelSelector {
                match_expressions: Some(vec![
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                        key: "a".into(),
                        operator: "Sometimes".into(),
                        values: None,
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        },
    });
    let err = select_nodes(&j, &nodes(), []).unwrap_err();
    assert!(err.to_string().starts_with("spec.podSelector"), "{err}");
}

fn with_tag(owner: &str, version: i64, reported: Option<(i64, ImagePullPhase)>) -> LeanNodeImage {
    let mut n = nodeimage("n", &[]);
    n.spec.images.insert(
        "nginx".into(),
        ImageSpec {
            tags: vec![ImageTagSpec {
                tag: "1".into(),
                version: Some(version),
                owner_references: vec![
                    ObjectReference {
                        uid: Some(owner.into()),
                        ..Default::default()
                    }
                    .into(),
                ],
                ..Default::default()
            }],
            ..Default::default()
        },
    );
    if let Some((v, phase)) = reported {
        n.status = Some(NodeImageStatus {
            image_statuses: crate::compact_nodeimage::ImageStatuses::from([(
                "nginx".into(),
                ImageStatus {
                    tags: vec![ImageTagStatus {
                        version: Some(v),
                        ..ImageTagStatus::new("1", phase)
                    }],
                },
            )]),
            ..Default::default()
        });
    }
    n
}

#[test]
fn node_state_needs_our_owner_reference_and_a_report_for_the_current_version() {
    let state = |n: &LeanNodeImage| node_state(n, "nginx", "1", "me", &[]);
    assert_eq!(state(&nodeimage("n", &[])), NodeState::NotSynced);
    assert_eq!(
        state(&with_tag("someone-else", 1, None)),
        NodeState::NotSynced
    );
    assert_eq!(state(&with_tag("me", 1, None)), NodeState::Pulling);
    assert_eq!(
        state(&with_tag("me", 2, Some((1, ImagePullPhase::Succeeded)))),
        NodeState::Pulling,
        "an old round's result"
    );
    assert_eq!(
        state(&with_tag("me", 2, Some((2, ImagePullPhase::Succeeded)))),
        NodeState::Succeeded
    );
    assert_eq!(
        state(&with_tag("me", 2, Some((2, ImagePullPhase::Failed)))),
        NodeState::Failed
    );
    assert_eq!(
        state(&with_tag("me", 2, Some((2, ImagePullPhase::Waiting)))),
        NodeState::Pulling
    );
    let secret = ReferenceObject {
        namespace: Some("d".into()),
        name: Some("s".into()),
        mode: None,
    };
    assert_eq!(
        node_state(&with_tag("me", 1, None), "nginx", "1", "me", &[secret]),
        NodeState::NotSynced,
        "a secret is missing"
    );
    assert_eq!(
        node_state(&with_tag("me", 1, None), "nginx", "2", "me", &[]),
        NodeState::NotSynced,
        "another tag"
    );
}

#[test]
fn node_progress_is_the_current_rounds_report_while_pulling() {
    let started = k8s_openapi::jiff::Timestamp::from_second(1_000).unwrap();
    let reporting = |version: i64, phase, progress: Option<i32>| {
        let mut n = with_tag("me", 2, Some((version, phase)));
        let tag = &mut n
            .status
            .as_mut()
            .unwrap()
            .image_statuses
            .get_mut("nginx")
            .unwrap()
            .tags[0];
        tag.progress = progress;
        tag.start_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            started,
        ));
        n
    };
    assert_eq!(
        node_progress(
            &reporting(2, ImagePullPhase::Pulling, Some(40)),
            "nginx",
            "1"
        ),
        Some(NodeProgress {
            percent: 40,
            started
        })
    );
    assert_eq!(
        node_progress(
            &reporting(1, ImagePullPhase::Pulling, Some(40)),
            "nginx",
            "1"
        ),
        None,
        "an old round's"
    );
    assert_eq!(
        node_progress(
            &reporting(2, ImagePullPhase::Succeeded, Some(100)),
            "nginx",
            "1"
        ),
        None,
        "finished"
    );
    assert_eq!(
        node_progress(&reporting(2, ImagePullPhase::Pulling, None), "nginx", "1"),
        None,
        "a daemon that says nothing (upstream's, CRI-O)"
    );
    assert_eq!(
        node_progress(
            &reporting(2, ImagePullPhase::Pulling, Some(40)),
            "nginx",
            "2"
        ),
        None,
        "another tag"
    );
}
