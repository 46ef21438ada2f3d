use serde_json::{Value, json};

use super::*;

fn job(secrets: &[&str]) -> ImagePullJob {
    serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "ImagePullJob",
        "metadata": {"name": "pull", "namespace": "team"},
        "spec": {"image": "nginx:1.25", "pullSecrets": secrets}
    }))
    .expect("a job")
}

fn set(extra_spec: Value, secrets: &[&str]) -> SidecarSet {
    let mut spec = json!({
        "selector": {"matchLabels": {"app": "web"}},
        "containers": [{"name": "proxy", "image": "proxy:1"}],
        "imagePullSecrets": secrets.iter().map(|s| json!({"name": s})).collect::<Vec<_>>(),
    });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra_spec.as_object()) {
        spec.extend(extra.clone());
    }
    serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "SidecarSet",
        "metadata": {"name": "mesh"},
        "spec": spec
    }))
    .expect("a SidecarSet")
}

fn read(field: &str, namespace: &str, name: &str) -> SecretRead {
    SecretRead {
        field: field.to_owned(),
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    }
}

fn names(names: &[&str]) -> Scope {
    Scope::Namespaces(names.iter().map(|n| (*n).to_owned()).collect())
}

#[test]
fn a_new_job_checks_each_named_secret_once_in_its_namespace() {
    let reads = job_reads(&job(&["a", "b", "a", ""]), "team", None);
    assert_eq!(
        reads,
        [
            read("spec.pullSecrets[0]", "team", "a"),
            read("spec.pullSecrets[1]", "team", "b"),
        ]
    );
}

#[test]
fn a_job_update_checks_only_secrets_the_old_job_lacked() {
    let old = job(&["a"]);
    assert_eq!(
        job_reads(&job(&["a", "c"]), "team", Some(&old)),
        [read("spec.pullSecrets[1]", "team", "c")]
    );
    assert!(job_reads(&job(&["a"]), "team", Some(&old)).is_empty());
}

#[test]
fn a_job_update_that_moves_or_drops_a_uid_pin_checks_that_secret() {
    let pinned = |value: Option<&str>| {
        let mut j = job(&["a", "b"]);
        if let Some(value) = value {
            j.annotations_mut()
                .insert(PULL_SECRET_UIDS.into(), value.into());
        }
        j
    };
    let old = pinned(Some("a=u1,b=u2"));
    // The manager pinning, or any edit that leaves the pins alone: nothing to check.
    assert!(job_reads(&pinned(Some("a=u1,b=u2")), "team", Some(&pinned(None))).is_empty());
    assert!(job_reads(&pinned(Some("a=u1,b=u2")), "team", Some(&old)).is_empty());
    // Removing the annotation re-arms both; changing one entry re-arms that one.
    let reads = job_reads(&pinned(None), "team", Some(&old));
    assert_eq!(
        reads.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );
    assert_eq!(
        reads[1].field,
        "metadata.annotations[kruise-rs.io/pull-secret-uids] for spec.pullSecrets[1]"
    );
    assert_eq!(reads[1].namespace, "team");
    let reads = job_reads(&pinned(Some("a=u1,b=u3")), "team", Some(&old));
    assert_eq!(reads.len(), 1);
    assert_eq!(reads[0].name, "b");
}

#[test]
fn a_job_without_pull_secrets_needs_no_review() {
    assert!(job_reads(&job(&[]), "team", None).is_empty());
}

#[test]
fn a_sidecarset_without_a_namespace_is_checked_cluster_wide() {
    assert_eq!(sidecarset_scope(&set(json!({}), &[]).spec), Scope::Cluster);
    // Other labels can be put on any namespace after admission.
    let labelled = set(
        json!({"namespaceSelector": {"matchLabels": {"team": "a"}}}),
        &["regcred"],
    );
    assert_eq!(sidecarset_scope(&labelled.spec), Scope::Cluster);
    assert_eq!(
        sidecarset_reads(&labelled, None),
        [read("spec.imagePullSecrets[0]", "", "regcred")]
    );
}

#[test]
fn spec_namespace_limits_the_check_to_that_namespace_and_wins_over_the_selector() {
    let s = set(
        json!({"namespace": "payments", "namespaceSelector": {"matchLabels": {"team": "a"}}}),
        &["regcred"],
    );
    assert_eq!(sidecarset_scope(&s.spec), names(&["payments"]));
    assert_eq!(
        sidecarset_reads(&s, None),
        [read("spec.imagePullSecrets[0]", "payments", "regcred")]
    );
}

#[test]
fn a_selector_on_the_namespace_name_label_limits_the_check_to_those_names() {
    let s = set(
        json!({"namespaceSelector": {
            "matchLabels": {"team": "a"},
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["x", "y", "z"]},
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["y", "z", "w"]},
            ]
        }}),
        &["r"],
    );
    assert_eq!(sidecarset_scope(&s.spec), names(&["y", "z"]));
    assert_eq!(
        sidecarset_reads(&s, None),
        [
            read("spec.imagePullSecrets[0]", "y", "r"),
            read("spec.imagePullSecrets[0]", "z", "r"),
        ]
    );
    // NotIn or Exists on the name label pins nothing.
    let open = set(
        json!({"namespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}
        ]}}),
        &[],
    );
    assert_eq!(sidecarset_scope(&open.spec), Scope::Cluster);
    // An empty name selects no namespace: nothing to read, never "every namespace".
    let none = set(
        json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ""}}}),
        &["r"],
    );
    assert_eq!(sidecarset_scope(&none.spec), names(&[]));
    assert!(sidecarset_reads(&none, None).is_empty());
}

#[test]
fn a_sidecarset_update_skips_names_checked_before_unless_the_scope_widened() {
    let old = set(json!({"namespace": "a"}), &["r", "s"]);
    // Same scope: only the new name.
    let same = set(json!({"namespace": "a"}), &["r", "s", "t"]);
    assert_eq!(
        sidecarset_reads(&same, Some(&old)),
        [read("spec.imagePullSecrets[2]", "a", "t")]
    );
    // Wider scope: every name again, cluster-wide.
    let wider = set(json!({}), &["r"]);
    assert_eq!(
        sidecarset_reads(&wider, Some(&old)),
        [read("spec.imagePullSecrets[0]", "", "r")]
    );
    // From cluster-wide to one namespace: covered.
    let cluster = set(json!({}), &["r"]);
    let narrower = set(json!({"namespace": "b"}), &["r"]);
    assert!(sidecarset_reads(&narrower, Some(&cluster)).is_empty());
    // Another namespace than before: checked there.
    let moved = set(json!({"namespace": "b"}), &["r"]);
    assert_eq!(
        sidecarset_reads(&moved, Some(&old)),
        [read("spec.imagePullSecrets[0]", "b", "r")]
    );
}

#[test]
fn every_allowed_read_admits() {
    let reads = [read("spec.pullSecrets[0]", "team", "a")];
    assert_eq!(
        verdict("alice", &reads, &[Answer::Allowed], JOB_RULE),
        Ok(())
    );
    assert_eq!(verdict("alice", &[], &[], JOB_RULE), Ok(()));
}

#[test]
fn a_refused_read_names_the_field_the_user_and_the_secret() {
    let reads = [
        read("spec.pullSecrets[0]", "team", "ok"),
        read("spec.pullSecrets[1]", "team", "regcred"),
    ];
    let message = verdict(
        "alice",
        &reads,
        &[Answer::Allowed, Answer::Refused],
        JOB_RULE,
    )
    .expect_err("refused");
    assert_eq!(
        message,
        "spec.pullSecrets[1]: user \"alice\" may not get Secret \"team/regcred\"; \
         a job may only name Secrets its author can read"
    );
}

#[test]
fn a_cluster_wide_refusal_says_every_namespace() {
    let reads = [read("spec.imagePullSecrets[0]", "", "regcred")];
    let message = verdict("bob", &reads, &[Answer::Refused], SIDECARSET_RULE).expect_err("refused");
    assert!(
        message.starts_with(
            "spec.imagePullSecrets[0]: user \"bob\" may not get Secret \"regcred\" in every namespace; a SidecarSet"
        ),
        "{message}"
    );
}

#[test]
fn a_failed_review_refuses_and_says_it_could_not_check() {
    let reads = [read("spec.pullSecrets[0]", "team", "a")];
    let message = verdict(
        "alice",
        &reads,
        &[Answer::Unknown("connection refused".into())],
        JOB_RULE,
    )
    .expect_err("fail closed");
    assert_eq!(
        message,
        "spec.pullSecrets[0]: cannot check whether user \"alice\" may get Secret \"team/a\": \
         connection refused"
    );
    // A missing answer is no permission either.
    assert!(verdict("alice", &reads, &[], JOB_RULE).is_err());
}

#[test]
fn the_review_carries_the_requesting_user_and_the_secret() {
    let user = UserInfo {
        username: Some("alice".into()),
        uid: Some("u-1".into()),
        groups: Some(vec!["devs".into(), "system:authenticated".into()]),
        extra: Some([("scopes".to_owned(), vec!["x".to_owned()])].into()),
    };
    let review = review(&user, &read("spec.pullSecrets[0]", "team", "regcred"));
    let spec = &review.spec;
    assert_eq!(spec.user.as_deref(), Some("alice"));
    assert_eq!(spec.uid.as_deref(), Some("u-1"));
    assert_eq!(spec.groups, user.groups);
    assert_eq!(spec.extra, user.extra);
    let attributes = spec.resource_attributes.as_ref().expect("attributes");
    assert_eq!(attributes.namespace.as_deref(), Some("team"));
    assert_eq!(attributes.verb.as_deref(), Some("get"));
    assert_eq!(attributes.group.as_deref(), Some(""));
    assert_eq!(attributes.resource.as_deref(), Some("secrets"));
    assert_eq!(attributes.name.as_deref(), Some("regcred"));
}

/// Issue 42: a SidecarSet's Secrets are reviewed in each namespace it pins by name, which no
/// schema bounds; more reviews than the webhook can ask within its timeout are refused, naming
/// the field and the counts.
#[test]
fn reviews_past_the_budget_are_refused_before_asking() {
    let namespaces: Vec<String> = (0..5).map(|i| format!("ns{i}")).collect();
    let names: Vec<String> = (0..16).map(|i| format!("s{i}")).collect();
    let pinned = |n: usize| {
        json!({"namespaceSelector": {"matchExpressions": [{
            "key": "kubernetes.io/metadata.name", "operator": "In", "values": &namespaces[..n]
        }]}})
    };
    let secrets: Vec<&str> = names.iter().map(String::as_str).collect();
    let four = sidecarset_reads(&set(pinned(4), &secrets), None);
    assert_eq!(four.len(), MAX_REVIEWS);
    assert_eq!(within_budget(&four), Ok(()));
    let five = sidecarset_reads(&set(pinned(5), &secrets), None);
    assert_eq!(five.len(), 80);
    let message = within_budget(&five).expect_err("80 reviews refused");
    assert!(
        message.starts_with(
            "spec.imagePullSecrets: checking that the author may read 16 Secret(s) in 5 \
             namespace(s) takes 80 access reviews, more than the 64"
        ),
        "{message}"
    );
    // A job names at most MAX_PULL_SECRETS Secrets: always within the budget.
    const { assert!(kruise_rs_api::limits::MAX_PULL_SECRETS <= MAX_REVIEWS) };
}
