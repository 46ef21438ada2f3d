use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, Time,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::*;
use crate::compact_nodeimage::{ImageSpec, ImageTagSpec};
use crate::imagepulljob::targets::NodeState;
use kruise_rs_api::imagepulljob::{
    CompletionPolicy, ImagePullJobNodeSelector, ImagePullJobSpec, ImagePullJobStatus,
};
use kruise_rs_api::nodeimage::NodeImage;

fn job(image: &str) -> ImagePullJob {
    let mut j = ImagePullJob::new(
        "j",
        ImagePullJobSpec {
            image: image.into(),
            ..Default::default()
        },
    );
    j.metadata.namespace = Some("ns".into());
    j.metadata.uid = Some("uid-1".into());
    j
}

fn t(seconds: i64) -> Time {
    Time(Timestamp::from_second(seconds).unwrap())
}

fn nodeimage(name: &str) -> Arc<LeanNodeImage> {
    Arc::new(NodeImage::new(name, Default::default()).into())
}

fn request(job: &ImagePullJob) -> JobRequest {
    JobRequest::new(job, "nginx".into(), "1.27".into(), Vec::new())
}

#[test]
fn a_job_being_deleted_is_let_go_whatever_else_it_says() {
    let mut j = job("not an image!");
    j.metadata.deletion_timestamp = Some(t(10));
    assert_eq!(next_step(&j), Step::LetGo);
}

#[test]
fn a_finished_job_expires_ttl_seconds_after_its_completion() {
    let mut j = job("nginx:1.27");
    j.status = Some(ImagePullJobStatus {
        completion_time: Some(t(100)),
        ..Default::default()
    });
    assert_eq!(next_step(&j), Step::Finished { expiry: None });
    j.spec.template.completion_policy = CompletionPolicy {
        ttl_seconds_after_finished: Some(30),
        ..Default::default()
    };
    assert_eq!(
        next_step(&j),
        Step::Finished {
            expiry: Some(Timestamp::from_second(130).unwrap())
        }
    );
}

#[test]
fn a_finished_job_an_imagelistpulljob_controls_never_expires_by_its_own_ttl() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    let owner = |kind: &str, api_version: &str, controller: Option<bool>| OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: "list".into(),
        uid: "uid-list".into(),
        controller,
        block_owner_deletion: Some(true),
    };
    let mut j = job("nginx:1.27");
    j.spec.template.completion_policy = CompletionPolicy {
        ttl_seconds_after_finished: Some(0),
        ..Default::default()
    };
    j.status = Some(ImagePullJobStatus {
        completion_time: Some(t(100)),
        ..Default::default()
    });
    let expires = Step::Finished {
        expiry: Some(Timestamp::from_second(100).unwrap()),
    };
    for version in ["apps.kruise.io/v1beta1", "apps.kruise.io/v1alpha1"] {
        j.metadata.owner_references = Some(vec![owner("ImageListPullJob", version, Some(true))]);
        assert_eq!(next_step(&j), Step::Finished { expiry: None }, "{version}");
    }
    // Only a controller owner of that kind and group counts.
    for other in [
        owner("ImageListPullJob", "apps.kruise.io/v1beta1", None),
        owner("ImageListPullJob", "example.com/v1", Some(true)),
        owner("SidecarSet", "apps.kruise.io/v1beta1", Some(true)),
    ] {
        j.metadata.owner_references = Some(vec![other.clone()]);
        assert_eq!(next_step(&j), expires, "{other:?}");
    }
    j.metadata.owner_references = None;
    assert_eq!(next_step(&j), expires);
}

#[test]
fn a_bad_image_or_parallelism_refuses_the_job_naming_the_field() {
    let Step::Refuse { reason, message } = next_step(&job("Bad Image")) else {
        panic!("an unparsable image is refused");
    };
    assert_eq!(reason, "InvalidImage");
    assert!(message.starts_with("spec.image: "), "{message}");

    let mut j = job("nginx:1.27");
    j.spec.template.parallelism = Some(IntOrString::String("many".into()));
    let Step::Refuse { reason, message } = next_step(&j) else {
        panic!("a non-numeric parallelism is refused");
    };
    assert_eq!(reason, "InvalidParallelism");
    assert!(message.contains("spec.parallelism"), "{message}");
}

#[test]
fn a_valid_running_job_runs_with_its_parallelism() {
    let mut j = job("nginx:1.27");
    j.spec.template.parallelism = Some(IntOrString::Int(3));
    let Step::Run { image, parallelism } = next_step(&j) else {
        panic!("a valid job runs");
    };
    assert_eq!(image.nodeimage_tag(), "1.27");
    assert_eq!(parallelism, 3);
    // A started, unfinished job keeps running.
    j.status = Some(ImagePullJobStatus {
        start_time: Some(t(5)),
        ..Default::default()
    });
    assert!(matches!(next_step(&j), Step::Run { .. }));
}

#[test]
fn targets_are_the_named_nodes_that_have_a_nodeimage_in_their_order() {
    let mut j = job("nginx:1.27");
    j.spec.template.selector = Some(ImagePullJobNodeSelector {
        names: vec!["c".into(), "gone".into(), "a".into()],
        ..Default::default()
    });
    let nodeimages = [nodeimage("a"), nodeimage("b"), nodeimage("c")];
    let got = targets(&j, &request(&j), &by_name(nodeimages), []).expect("valid selector");
    let nodes: Vec<&str> = got.iter().map(|t| t.node.as_str()).collect();
    assert_eq!(nodes, ["c", "a"]);
    assert!(got.iter().all(|t| t.state == NodeState::NotSynced));
}

#[test]
fn a_node_whose_entry_lists_the_job_is_pulling() {
    let j = job("nginx:1.27");
    let mut ni = LeanNodeImage::from(NodeImage::new("a", Default::default()));
    let owner = request(&j).owner;
    ni.spec.images = crate::compact_nodeimage::Images::from([(
        "nginx".into(),
        ImageSpec {
            tags: vec![ImageTagSpec {
                tag: "1.27".into(),
                owner_references: vec![owner],
                ..Default::default()
            }],
            ..Default::default()
        },
    )]);
    let got = targets(
        &j,
        &request(&j),
        &by_name([Arc::new(ni), nodeimage("b")]),
        [],
    )
    .expect("ok");
    let states: Vec<(&str, NodeState)> = got.iter().map(|t| (t.node.as_str(), t.state)).collect();
    assert_eq!(
        states,
        [("a", NodeState::Pulling), ("b", NodeState::NotSynced)]
    );
}

#[test]
fn a_selector_that_does_not_parse_is_an_error() {
    let mut j = job("nginx:1.27");
    j.spec.template.pod_selector = Some(LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: "a".into(),
            operator: "Sometimes".into(),
            values: None,
        }]),
        ..Default::default()
    });
    let err = targets(&j, &request(&j), &by_name([nodeimage("a")]), []).unwrap_err();
    assert!(err.to_string().starts_with("spec.podSelector"), "{err}");
}
