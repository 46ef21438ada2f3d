use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::*;
use kruise_rs_api::imagelistpulljob::ImageListPullJobSpec;
use kruise_rs_api::imagepulljob::{CompletionPolicy, ImagePullJobStatus, ImagePullPolicy};

fn t(seconds: i64) -> Time {
    Time(Timestamp::from_second(seconds).unwrap())
}

fn list(images: &[&str]) -> ImageListPullJob {
    let mut l = ImageListPullJob::new(
        "list",
        ImageListPullJobSpec {
            images: images.iter().map(|i| (*i).to_owned()).collect(),
            template: ImagePullJobTemplate {
                parallelism: Some(IntOrString::Int(2)),
                ..Default::default()
            },
        },
    );
    l.metadata.namespace = Some("ns".into());
    l.metadata.uid = Some("uid-list".into());
    l
}

/// A child of `l` for `image`, created at `created`, as the apiserver would hold it.
fn child_of(l: &ImageListPullJob, name: &str, image: &str, created: i64) -> ImagePullJob {
    let mut c = child(l, image, &template_hash(&l.spec.template));
    c.metadata.name = Some(name.into());
    c.metadata.uid = Some(format!("uid-{name}"));
    c.metadata.creation_timestamp = Some(t(created));
    c
}

fn started(
    mut c: ImagePullJob,
    desired: i32,
    active: i32,
    succeeded: i32,
    failed: i32,
) -> ImagePullJob {
    c.status = Some(ImagePullJobStatus {
        start_time: Some(t(1)),
        desired,
        active,
        succeeded,
        failed,
        ..Default::default()
    });
    c
}

fn arcs(children: Vec<ImagePullJob>) -> Vec<Arc<ImagePullJob>> {
    children.into_iter().map(Arc::new).collect()
}

fn hash(l: &ImageListPullJob) -> String {
    template_hash(&l.spec.template)
}

fn names(doomed: &[Doomed]) -> Vec<(&str, Why)> {
    doomed.iter().map(|d| (d.name.as_str(), d.why)).collect()
}

#[test]
fn a_child_is_the_image_plus_the_whole_template_controlled_by_the_list() {
    let mut l = list(&["nginx:1.27"]);
    l.metadata.labels = Some([("team".to_owned(), "a".to_owned())].into());
    l.spec.template.pull_secrets = vec!["s".into()];
    l.spec.template.completion_policy.ttl_seconds_after_finished = Some(30);
    let c = child(&l, "nginx:1.27", "h1");
    assert_eq!(c.metadata.generate_name.as_deref(), Some("list-"));
    assert_eq!(c.metadata.name, None);
    assert_eq!(c.metadata.namespace.as_deref(), Some("ns"));
    assert_eq!(
        c.metadata.labels,
        Some(
            [
                ("team".to_owned(), "a".to_owned()),
                ("controller-revision-hash".to_owned(), "h1".to_owned())
            ]
            .into()
        )
    );
    assert_eq!(
        c.metadata.owner_references,
        Some(vec![OwnerReference {
            api_version: "apps.kruise.io/v1beta1".into(),
            kind: "ImageListPullJob".into(),
            name: "list".into(),
            uid: "uid-list".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }])
    );
    assert_eq!(c.spec.image, "nginx:1.27");
    assert_eq!(c.spec.template, child_template(&l.spec.template));
    assert_eq!(c.spec.template.pull_secrets, ["s"]);
    assert_eq!(
        c.spec.template.completion_policy.ttl_seconds_after_finished,
        Some(30)
    );
    assert!(controlled_by(&c, "uid-list"));
    assert!(!controlled_by(&c, "uid-other"));
}

#[test]
fn the_hash_is_a_label_value_that_follows_the_template() {
    let l = list(&["a"]);
    let h = hash(&l);
    assert_eq!(h.len(), 16);
    assert!(h.chars().all(|c| c.is_ascii_alphanumeric()), "{h}");
    assert_eq!(h, hash(&l.clone()), "stable");
    let mut other = l.clone();
    other.spec.images.push("b".into());
    assert_eq!(hash(&other), h, "the images are not in it");
    other.spec.template.parallelism = Some(IntOrString::Int(3));
    assert_ne!(hash(&other), h);
}

#[test]
fn a_new_list_creates_one_child_per_image_in_order_and_starts() {
    let l = list(&["a", "b", "c"]);
    let p = plan(&l, &[], &hash(&l), &t(10));
    assert_eq!(p.create, ["a", "b", "c"]);
    assert!(p.delete.is_empty() && p.relabel.is_empty());
    assert_eq!(
        p.status,
        ImageListPullJobStatus {
            start_time: Some(t(10)),
            desired: 3,
            ..Default::default()
        }
    );
}

#[test]
fn current_children_are_kept_and_only_missing_images_created() {
    let l = list(&["a", "b"]);
    let p = plan(
        &l,
        &arcs(vec![child_of(&l, "list-1", "a", 1)]),
        &hash(&l),
        &t(10),
    );
    assert_eq!(p.create, ["b"]);
    assert!(p.delete.is_empty() && p.relabel.is_empty());
}

#[test]
fn a_changed_template_replaces_every_child() {
    let old = list(&["a", "b"]);
    let children = arcs(vec![
        child_of(&old, "list-1", "a", 1),
        child_of(&old, "list-2", "b", 2),
    ]);
    let mut l = old.clone();
    l.spec.template.parallelism = Some(IntOrString::Int(5));
    let p = plan(&l, &children, &hash(&l), &t(10));
    assert_eq!(p.create, ["a", "b"]);
    assert_eq!(
        names(&p.delete),
        [("list-1", Why::Outdated), ("list-2", Why::Outdated)]
    );
    // The replaced children count no more.
    assert_eq!(p.status.completed, 0);
}

#[test]
fn an_image_that_left_the_list_loses_its_child() {
    let old = list(&["a", "b"]);
    let children = arcs(vec![
        child_of(&old, "list-1", "a", 1),
        child_of(&old, "list-2", "b", 2),
    ]);
    let l = list(&["a"]);
    let p = plan(&l, &children, &hash(&l), &t(10));
    assert!(p.create.is_empty());
    assert_eq!(names(&p.delete), [("list-2", Why::Unlisted)]);
    let d = &p.delete[0];
    assert_eq!((d.uid.as_str(), d.image.as_str()), ("uid-list-2", "b"));
}

#[test]
fn of_duplicates_the_oldest_current_child_is_kept() {
    let l = list(&["a"]);
    let mut stale = child_of(&l, "list-0", "a", 0);
    stale.spec.template.parallelism = None;
    let children = arcs(vec![
        child_of(&l, "list-3", "a", 3),
        stale,
        child_of(&l, "list-2b", "a", 2),
        child_of(&l, "list-2a", "a", 2),
    ]);
    let p = plan(&l, &children, &hash(&l), &t(10));
    assert!(p.create.is_empty());
    // list-2a: created first among the current ones (by time, then name).
    let mut got = names(&p.delete);
    got.sort();
    assert_eq!(
        got,
        [
            ("list-0", Why::Outdated),
            ("list-2b", Why::Duplicate),
            ("list-3", Why::Duplicate)
        ]
    );
}

#[test]
fn a_child_with_an_equal_template_and_a_foreign_hash_is_adopted_and_relabelled() {
    let l = list(&["a", "b"]);
    // Made by upstream's kruise-manager: its FNV hash.
    let mut upstream = child_of(&l, "list-up", "a", 1);
    upstream
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(CONTROLLER_REVISION_HASH.into(), "6c5d8b9f7".into());
    let mut unlabelled = child_of(&l, "list-bare", "b", 1);
    unlabelled.metadata.labels = None;
    let p = plan(&l, &arcs(vec![upstream, unlabelled]), &hash(&l), &t(10));
    assert!(p.create.is_empty(), "{:?}", p.create);
    assert!(p.delete.is_empty(), "{:?}", p.delete);
    assert_eq!(p.relabel, ["list-up", "list-bare"]);
}

/// Upstream leaves a list's `imagePullPolicy` unset when its author did, and each image's job
/// gets `IfNotPresent` from the ImagePullJob defaults: such a child is the list's, not outdated.
#[test]
fn a_list_without_image_pull_policy_keeps_its_children_with_if_not_present() {
    let l = list(&["a", "b"]);
    assert_eq!(l.spec.template.image_pull_policy, None);
    let mut upstream = ImagePullJob::new(
        "list-up",
        ImagePullJobSpec {
            image: "a".into(),
            template: l.spec.template.clone(),
        },
    );
    kruise_rs_api::defaults::default_imagepulljob(&mut upstream);
    assert_eq!(
        upstream.spec.template.image_pull_policy,
        Some(ImagePullPolicy::IfNotPresent)
    );
    upstream.metadata = child_of(&l, "list-up", "a", 1).metadata;
    let ours = child_of(&l, "list-b", "b", 2);
    assert_eq!(
        ours.spec.template.image_pull_policy,
        Some(ImagePullPolicy::IfNotPresent),
        "a child is created as it will be stored"
    );
    let p = plan(&l, &arcs(vec![upstream, ours]), &hash(&l), &t(10));
    assert!(p.create.is_empty(), "{:?}", p.create);
    assert!(p.delete.is_empty(), "{:?}", p.delete);
    assert!(p.relabel.is_empty(), "{:?}", p.relabel);
}

#[test]
fn a_list_without_image_pull_policy_hashes_as_one_with_if_not_present() {
    let unset = list(&["a"]);
    let mut explicit = unset.clone();
    explicit.spec.template.image_pull_policy = Some(ImagePullPolicy::IfNotPresent);
    assert_eq!(hash(&unset), hash(&explicit));
    let mut always = unset.clone();
    always.spec.template.image_pull_policy = Some(ImagePullPolicy::Always);
    assert_ne!(hash(&unset), hash(&always));
    let child = child_of(&always, "list-1", "a", 1);
    assert_eq!(
        child.spec.template.image_pull_policy,
        Some(ImagePullPolicy::Always)
    );
    // A list that changes from unset to Always replaces its children.
    let p = plan(
        &always,
        &arcs(vec![child_of(&unset, "list-0", "a", 0)]),
        &hash(&always),
        &t(10),
    );
    assert_eq!(names(&p.delete), [("list-0", Why::Outdated)]);
    assert_eq!(p.create, ["a"]);
}

#[test]
fn a_child_being_deleted_is_not_counted_nor_kept() {
    let l = list(&["a"]);
    let mut going = started(child_of(&l, "list-1", "a", 1), 1, 0, 1, 0);
    going.metadata.deletion_timestamp = Some(t(5));
    let p = plan(&l, &arcs(vec![going]), &hash(&l), &t(10));
    assert_eq!(p.create, ["a"]);
    assert!(p.delete.is_empty());
    assert_eq!(p.status.completed, 0);
}

#[test]
fn a_repeated_image_in_the_spec_wants_one_child() {
    let l = list(&["a", "a"]);
    let p = plan(&l, &[], &hash(&l), &t(10));
    assert_eq!(p.create, ["a"]);
    assert_eq!(p.status.desired, 1);
}

#[test]
fn status_sums_the_started_children() {
    let l = list(&["a", "b", "c", "d", "e"]);
    let children = arcs(vec![
        // Pulling on 2 of 3 nodes, one done.
        started(child_of(&l, "list-a", "a", 1), 3, 2, 1, 0),
        // Done: 2 succeeded, 1 failed.
        started(child_of(&l, "list-b", "b", 1), 3, 0, 2, 1),
        // Done, all succeeded.
        started(child_of(&l, "list-c", "c", 1), 3, 0, 3, 0),
        // Not started: does not count whatever it says.
        {
            let mut c = child_of(&l, "list-d", "d", 1);
            c.status = Some(ImagePullJobStatus {
                desired: 0,
                ..Default::default()
            });
            c
        },
    ]);
    let p = plan(&l, &children, &hash(&l), &t(10));
    assert_eq!(p.create, ["e"]);
    assert_eq!(
        p.status,
        ImageListPullJobStatus {
            start_time: Some(t(10)),
            completion_time: None,
            desired: 5,
            active: 1,
            completed: 2,
            succeeded: 1,
            failed_image_statuses: vec![FailedImageStatus {
                image_pull_job: "list-b".into(),
                name: "b".into(),
                message: "Please check for details which nodes failed by 'kubectl get ImagePullJob list-b'.".into(),
            }],
        }
    );
}

#[test]
fn the_list_completes_when_every_child_has_and_keeps_its_start_time() {
    let mut l = list(&["a", "b"]);
    l.status = Some(ImageListPullJobStatus {
        start_time: Some(t(3)),
        ..Default::default()
    });
    let children = vec![
        started(child_of(&l, "list-a", "a", 1), 2, 0, 2, 0),
        started(child_of(&l, "list-b", "b", 1), 2, 0, 1, 1),
    ];
    let p = plan(&l, &arcs(children.clone()), &hash(&l), &t(10));
    assert_eq!(p.status.start_time, Some(t(3)));
    assert_eq!(p.status.completion_time, Some(t(10)));
    assert_eq!((p.status.completed, p.status.succeeded), (2, 1));

    // Never: never (its children carry Never too).
    l.spec.template.completion_policy.type_ = Some(CompletionPolicyType::Never);
    let children = children.into_iter().map(|mut c| {
        c.spec.template = child_template(&l.spec.template);
        c
    });
    let p = plan(&l, &arcs(children.collect()), &hash(&l), &t(10));
    assert_eq!(p.status.completed, 2);
    assert_eq!(p.status.completion_time, None);
}

#[test]
fn a_child_finished_by_its_deadline_counts_as_completed() {
    let l = list(&["a"]);
    let mut c = started(child_of(&l, "list-a", "a", 1), 3, 1, 1, 0);
    c.status.as_mut().unwrap().completion_time = Some(t(9));
    let p = plan(&l, &arcs(vec![c]), &hash(&l), &t(10));
    assert_eq!((p.status.completed, p.status.succeeded), (1, 0));
    assert_eq!(p.status.completion_time, Some(t(10)));
}

#[test]
fn a_child_matching_no_node_is_done_at_once() {
    let l = list(&["a"]);
    let c = started(child_of(&l, "list-a", "a", 1), 0, 0, 0, 0);
    let p = plan(&l, &arcs(vec![c]), &hash(&l), &t(10));
    assert_eq!((p.status.completed, p.status.succeeded), (1, 1));
    assert!(p.status.completion_time.is_some());
}

#[test]
fn next_step_lets_go_runs_or_waits_for_the_ttl() {
    let mut l = list(&["a"]);
    assert_eq!(next_step(&l), Step::Run);
    l.status = Some(ImageListPullJobStatus {
        completion_time: Some(t(100)),
        ..Default::default()
    });
    assert_eq!(next_step(&l), Step::Finished { expiry: None });
    l.spec.template.completion_policy = CompletionPolicy {
        ttl_seconds_after_finished: Some(0),
        ..Default::default()
    };
    assert_eq!(
        next_step(&l),
        Step::Finished {
            expiry: Some(Timestamp::from_second(100).unwrap())
        }
    );
    l.spec.template.completion_policy.ttl_seconds_after_finished = Some(30);
    assert_eq!(
        next_step(&l),
        Step::Finished {
            expiry: Some(Timestamp::from_second(130).unwrap())
        }
    );
    l.metadata.deletion_timestamp = Some(t(200));
    assert_eq!(next_step(&l), Step::LetGo);
}

#[test]
fn creations_start_slow() {
    assert_eq!(slow_start_batches(0), Vec::<usize>::new());
    assert_eq!(slow_start_batches(1), [1]);
    assert_eq!(slow_start_batches(3), [1, 2]);
    assert_eq!(slow_start_batches(10), [1, 2, 4, 3]);
    assert_eq!(slow_start_batches(255).iter().sum::<usize>(), 255);
}
