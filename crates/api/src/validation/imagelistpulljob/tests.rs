use super::*;
use crate::defaults::default_imagelistpulljob;
use serde_json::{Value, json};

fn job(spec: Value) -> ImageListPullJob {
    let mut job = ImageListPullJob::new("list", serde_json::from_value(spec).expect("test spec"));
    default_imagelistpulljob(&mut job);
    job
}

fn errors(r: Result<(), ValidationErrors>) -> Vec<String> {
    r.err()
        .map(|e| e.0.iter().map(ToString::to_string).collect())
        .unwrap_or_default()
}

fn create(spec: Value) -> Vec<String> {
    errors(validate_create(&job(spec)))
}

#[test]
fn a_plain_list_is_valid() {
    assert_eq!(
        create(
            json!({"images": ["nginx:1.25", "busybox", "127.0.0.1:5000/app@sha256:0000000000000000000000000000000000000000000000000000000000000000"]})
        ),
        Vec::<String>::new()
    );
    assert_eq!(
        create(
            json!({"images": ["nginx"], "selector": {"names": ["a", "b"]}, "parallelism": "2",
            "completionPolicy": {"type": "Always", "activeDeadlineSeconds": 600, "ttlSecondsAfterFinished": 0}})
        ),
        Vec::<String>::new()
    );
}

#[test]
fn images_must_be_there() {
    assert_eq!(
        create(json!({"images": []})),
        ["spec.images: Required value: images can not be empty"]
    );
}

#[test]
fn each_bad_image_is_named_by_its_index() {
    let got = create(json!({"images": ["nginx", "", "Bad Image", "nginx", "busybox"]}));
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(
        got[0],
        "spec.images[1]: Required value: image can not be empty"
    );
    assert!(
        got[1].starts_with(r#"spec.images[2]: Invalid value: "Bad Image": "#),
        "{}",
        got[1]
    );
    assert_eq!(got[2], r#"spec.images[3]: Duplicate value: "nginx""#);
}

#[test]
fn at_most_255_images() {
    let images = |n: usize| -> Vec<String> { (0..n).map(|i| format!("app-{i}:1")).collect() };
    assert_eq!(create(json!({"images": images(255)})), Vec::<String>::new());
    assert_eq!(
        create(json!({"images": images(256)})),
        ["spec.images: Too many: 256: must have at most 255 items"]
    );
}

#[test]
fn the_template_follows_the_imagepulljob_rules() {
    let got = create(json!({
        "images": ["nginx"],
        "selector": {"names": ["a", "a"], "matchLabels": {"zone": "z"}},
        "podSelector": {"matchLabels": {"app": "x"}},
        "parallelism": "50%",
        "completionPolicy": {"type": "Never", "ttlSecondsAfterFinished": 5}
    }));
    let fields: Vec<&str> = got
        .iter()
        .map(|e| e.split(':').next().unwrap_or_default())
        .collect();
    assert_eq!(
        fields,
        [
            "spec.selector",
            "spec.selector.names[1]",
            "spec.podSelector",
            "spec.parallelism",
            "spec.completionPolicy.ttlSecondsAfterFinished",
        ],
        "{got:?}"
    );
    // Always: the deadline must leave room for one pull, as for an ImagePullJob (which every
    // image's job is, and which would be refused otherwise).
    assert_eq!(
        create(
            json!({"images": ["nginx"], "pullPolicy": {"timeoutSeconds": 60},
            "completionPolicy": {"activeDeadlineSeconds": 30}})
        ),
        [
            "spec.completionPolicy.activeDeadlineSeconds: Invalid value: 30: completionPolicy.activeDeadlineSeconds must be greater than pullPolicy.timeoutSeconds(60)"
        ]
    );
}

#[test]
fn an_update_that_leaves_the_spec_alone_is_not_revalidated() {
    let mut old = job(json!({"images": ["nginx"]}));
    // Admitted under older rules, say: still free to change labels and finalizers.
    old.spec.images = vec!["Bad Image".into()];
    let mut new = old.clone();
    new.metadata.labels = Some([("a".to_owned(), "b".to_owned())].into());
    assert_eq!(errors(validate_update(&old, &new)), Vec::<String>::new());
    new.spec.images.push("busybox".into());
    assert_eq!(errors(validate_update(&old, &new)).len(), 1);
    // Changing the pull secrets is allowed: the images' jobs are replaced.
    let old = job(json!({"images": ["nginx"], "pullSecrets": ["a"]}));
    let new = job(json!({"images": ["nginx"], "pullSecrets": ["b"]}));
    assert_eq!(errors(validate_update(&old, &new)), Vec::<String>::new());
}

#[test]
fn the_template_durations_and_counts_are_bounded() {
    assert_eq!(
        create(
            json!({"images": ["nginx"], "pullPolicy": {"backoffLimit": 2_000_000_000},
            "completionPolicy": {"activeDeadlineSeconds": 40_000_000}})
        ),
        [
            "spec.pullPolicy.backoffLimit: Invalid value: 2000000000: must be between 0 and 1000, inclusive",
            "spec.completionPolicy.activeDeadlineSeconds: Invalid value: 40000000: must be between 1 and 31536000, inclusive",
        ]
    );
}

/// Issue 42: a list's pull Secrets are bounded as a job's (each of its jobs gets them), checked
/// when new or changed.
#[test]
fn at_most_sixteen_pull_secrets() {
    let secrets = |n: usize| json!((0..n).map(|i| format!("s{i}")).collect::<Vec<_>>());
    assert_eq!(
        create(json!({"images": ["nginx"], "pullSecrets": secrets(16)})),
        Vec::<String>::new()
    );
    assert_eq!(
        create(json!({"images": ["nginx"], "pullSecrets": secrets(17)})),
        ["spec.pullSecrets: Too many: 17: must have at most 16 items"]
    );
    let old = job(json!({"images": ["nginx"], "pullSecrets": secrets(17)}));
    let mut edited = old.clone();
    edited.spec.images.push("busybox".to_owned());
    assert_eq!(errors(validate_update(&old, &edited)), Vec::<String>::new());
    let mut more = old.clone();
    more.spec.template.pull_secrets.push("s17".to_owned());
    assert_eq!(
        errors(validate_update(&old, &more)),
        ["spec.pullSecrets: Too many: 18: must have at most 16 items"]
    );
}
