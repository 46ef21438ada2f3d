use super::*;

fn owner(namespace: &str, name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("apps.kruise.io/v1beta1".into()),
        kind: Some("ImagePullJob".into()),
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        uid: Some(format!("uid-{namespace}-{name}")),
        ..Default::default()
    }
}

fn copy_of(source: &str, references: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (SECRET_SOURCE_KEY.to_owned(), source.to_owned()),
        (SECRET_REFERENCES.to_owned(), references.to_owned()),
    ])
}

const DAEMON_NS: &str = "kruise-daemon-config";

#[test]
fn a_copy_serves_the_jobs_it_names() {
    let copy = copy_of("tenant-a/registry", "tenant-a/pull-v1,tenant-a/pull-v3");
    assert!(serves(DAEMON_NS, &copy, &[owner("tenant-a", "pull-v1")]));
    assert!(serves(DAEMON_NS, &copy, &[owner("tenant-a", "pull-v3")]));
}

#[test]
fn a_copy_does_not_serve_another_tenants_job_on_the_same_image() {
    // Tenant B's tag of the same image, on the same node: not listed in A's copy.
    let copy = copy_of("tenant-a/registry", "tenant-a/pull-v1");
    assert!(!serves(DAEMON_NS, &copy, &[owner("tenant-b", "pull-v1")]));
    assert!(!serves(DAEMON_NS, &copy, &[owner("tenant-b", "pull-v2")]));
}

#[test]
fn a_copy_does_not_serve_another_job_of_the_same_namespace() {
    let copy = copy_of("tenant-a/registry", "tenant-a/pull-v1");
    assert!(!serves(DAEMON_NS, &copy, &[owner("tenant-a", "other")]));
}

#[test]
fn a_tag_shared_with_a_listed_job_is_served() {
    // B joined A's tag: the tag is pulled once, with A's credentials, for both.
    let copy = copy_of("tenant-a/registry", "tenant-a/pull-v1");
    assert!(serves(
        DAEMON_NS,
        &copy,
        &[owner("tenant-b", "pull-v1"), owner("tenant-a", "pull-v1")]
    ));
}

#[test]
fn a_released_copy_serves_nobody() {
    // Its last job let go; the copy is about to be deleted, or an older writer left it empty.
    let copy = copy_of("tenant-a/registry", "");
    assert!(!serves(DAEMON_NS, &copy, &[owner("tenant-a", "pull-v1")]));
    let copy = BTreeMap::from([(SECRET_SOURCE_KEY.to_owned(), "tenant-a/registry".to_owned())]);
    assert!(!serves(DAEMON_NS, &copy, &[owner("tenant-a", "pull-v1")]));
}

#[test]
fn names_are_matched_whole_not_by_prefix_or_with_spaces_lost() {
    let copy = copy_of("a/registry", " a/pull , a/pull-v1x ");
    assert!(serves(DAEMON_NS, &copy, &[owner("a", "pull")]));
    assert!(!serves(DAEMON_NS, &copy, &[owner("a", "pull-v1")]));
    assert!(!serves(DAEMON_NS, &copy, &[owner("a/pull", "")]));
    // A reference without a namespace never matches.
    let copy = copy_of("a/registry", "pull");
    assert!(!serves(DAEMON_NS, &copy, &[owner("", "pull")]));
}

#[test]
fn a_secret_that_is_no_copy_serves_only_owners_of_its_namespace() {
    let own = BTreeMap::new();
    assert!(serves(DAEMON_NS, &own, &[owner(DAEMON_NS, "job")]));
    assert!(!serves(DAEMON_NS, &own, &[owner("tenant-a", "job")]));
}

#[test]
fn an_owner_without_a_namespace_or_name_is_served_by_nothing() {
    let copy = copy_of("a/registry", "a/job");
    let mut nameless = owner("a", "job");
    nameless.name = None;
    assert!(!serves(DAEMON_NS, &copy, &[nameless.clone()]));
    assert!(!serves(DAEMON_NS, &BTreeMap::new(), &[nameless]));
}

#[test]
fn a_tag_nobody_owns_was_written_by_an_admin_and_gets_every_listed_secret() {
    assert!(serves(DAEMON_NS, &copy_of("a/registry", "a/job"), &[]));
    assert!(serves("team", &BTreeMap::new(), &[]));
}
