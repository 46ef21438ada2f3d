use k8s_openapi::ByteString;

use super::*;

fn secret(ns: &str, name: &str, data: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            namespace: Some(ns.into()),
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            ".dockerconfigjson".to_owned(),
            ByteString(data.as_bytes().to_vec()),
        )])),
        type_: Some("kubernetes.io/dockerconfigjson".into()),
        ..Default::default()
    }
}

fn typed(type_: Option<&str>) -> Secret {
    let mut s = secret("team", "s", "{}");
    s.type_ = type_.map(str::to_owned);
    s
}

/// A DNS subdomain (RFC 1123), as the apiserver validates Secret names.
fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

#[test]
fn only_registry_credentials_are_pull_secrets() {
    assert_eq!(
        check_type(&typed(Some("kubernetes.io/dockerconfigjson"))),
        Ok(())
    );
    assert_eq!(check_type(&typed(Some("kubernetes.io/dockercfg"))), Ok(()));
    for t in [
        Some("Opaque"),
        Some("kubernetes.io/service-account-token"),
        Some("kubernetes.io/basic-auth"),
        Some("kubernetes.io/tls"),
        Some(""),
        None,
    ] {
        let problem = check_type(&typed(t)).expect_err("not a pull secret");
        assert_eq!(problem.reason(), "PullSecretWrongType");
        let text = problem.to_string();
        assert!(text.contains("team/s"), "{text}");
        assert!(text.contains(t.unwrap_or("(none)")), "{text}");
    }
}

#[test]
fn copy_name_is_pinned() {
    // Computed once (`printf team/regcred | sha256sum`, first 16 hex). A change here renames
    // every copy in existing clusters: old copies would then be found only by annotation.
    assert_eq!(copy_name("team", "regcred"), "regcred-1aa7dafbeda99ffd");
    assert_eq!(copy_name("team", "regcred"), copy_name("team", "regcred"));
    assert_ne!(copy_name("a", "reg"), copy_name("b", "reg"));
    assert_ne!(copy_name("a", "b-c"), copy_name("a-b", "c"));
}

#[test]
fn copy_names_are_valid_secret_names_whatever_the_source_name() {
    let long = "x".repeat(253);
    let dotted = format!("{}.{}", "a".repeat(230), "b".repeat(22));
    let cases = [
        "reg",
        long.as_str(),
        dotted.as_str(),
        "ends-",
        "ends.",
        "a.-b",
        "Upper_Case",
        "-",
        ".",
        "",
        "ünïcode",
    ];
    for name in cases {
        let copy = copy_name("team", name);
        assert!(is_dns_subdomain(&copy), "{name:?} gives {copy:?}");
        assert!(copy.len() <= 253, "{name:?}");
    }
    assert_eq!(copy_name("team", &long).len(), 253);
    assert!(copy_name("team", "reg").starts_with("reg-"));
    assert_eq!(copy_name("team", "").len(), HASH_HEX, "no prefix, no dash");
    // The prefix is cut so the whole fits; names differing past the cut still differ.
    let (a, b) = (format!("{long}a"), format!("{long}b"));
    assert_ne!(copy_name("team", &a), copy_name("team", &b));
}

#[test]
fn a_new_copy_names_its_source_and_first_job() {
    let copy = new_copy(
        &secret("team", "reg", "{}"),
        "kruise-daemon-config",
        "team/job1",
    );
    let a = copy.annotations();
    assert_eq!(a[SECRET_SOURCE_KEY], "team/reg");
    assert_eq!(a[SECRET_REFERENCES], "team/job1");
    assert_eq!(a[SECRET_MODE], "batch");
    assert_eq!(copy.namespace().as_deref(), Some("kruise-daemon-config"));
    assert_eq!(copy.name_any(), copy_name("team", "reg"));
    assert_eq!(copy.data, secret("team", "reg", "{}").data);
}

#[test]
fn refreshing_adds_the_job_and_new_data_once() {
    let source = secret("team", "reg", "{}");
    let copy = new_copy(&source, "d", "team/job1");
    assert_eq!(
        refresh_copy(&copy, &source, "team/job1"),
        CopyUpdate::Current,
        "nothing to do"
    );
    let CopyUpdate::Update(both) = refresh_copy(&copy, &source, "team/job2") else {
        panic!("job2 added")
    };
    assert_eq!(
        references(&both),
        BTreeSet::from(["team/job1".to_owned(), "team/job2".to_owned()])
    );
    let rotated = secret("team", "reg", "{\"auths\":{}}");
    let CopyUpdate::Update(updated) = refresh_copy(&both, &rotated, "team/job2") else {
        panic!("data refreshed")
    };
    assert_eq!(updated.data, rotated.data);
}

fn with_uid(mut secret: Secret, uid: &str) -> Secret {
    secret.metadata.uid = Some(uid.to_owned());
    secret
}

#[test]
fn a_copy_records_its_sources_uid_and_a_replacement_serves_only_the_job_checked_for_it() {
    let first = with_uid(secret("team", "reg", "old"), "u1");
    let copy = new_copy(&first, "d", "team/job1");
    assert_eq!(copy.annotations()[SECRET_SOURCE_UID], "u1");
    let CopyUpdate::Update(shared) = refresh_copy(&copy, &first, "team/job2") else {
        panic!("job2 added")
    };
    // The Secret deleted and made again: job3 was checked against the new one (it pins u2),
    // job1 and job2 against the old one only.
    let second = with_uid(secret("team", "reg", "new"), "u2");
    let CopyUpdate::Update(replaced) = refresh_copy(&shared, &second, "team/job3") else {
        panic!("the copy follows the Secret job3 pins")
    };
    assert_eq!(replaced.data, second.data);
    assert_eq!(replaced.annotations()[SECRET_SOURCE_UID], "u2");
    assert_eq!(
        references(&replaced),
        BTreeSet::from(["team/job3".to_owned()])
    );
    assert_eq!(
        refresh_copy(&replaced, &second, "team/job3"),
        CopyUpdate::Current
    );
}

#[test]
fn a_copy_made_before_uids_were_recorded_keeps_its_jobs_and_learns_the_uid() {
    let source = with_uid(secret("team", "reg", "{}"), "u1");
    let mut legacy = new_copy(&source, "d", "team/job1");
    legacy.annotations_mut().remove(SECRET_SOURCE_UID);
    let CopyUpdate::Update(updated) = refresh_copy(&legacy, &source, "team/job2") else {
        panic!("job2 added")
    };
    assert_eq!(updated.annotations()[SECRET_SOURCE_UID], "u1");
    assert_eq!(
        references(&updated),
        BTreeSet::from(["team/job1".to_owned(), "team/job2".to_owned()])
    );
}

#[test]
fn only_copied_secrets_not_yet_pinned_are_pinned() {
    let reg = with_uid(secret("team", "reg", "{}"), "u1");
    let mut opaque = with_uid(secret("team", "opaque", "{}"), "u9");
    opaque.type_ = Some("Opaque".into());
    let sources = vec![
        ("reg".to_owned(), Some(reg)),
        ("missing".to_owned(), None),
        ("opaque".to_owned(), Some(opaque)),
    ];
    let added = pins_to_add(&Pins::new(), &sources).expect("reg is new");
    assert_eq!(added, Pins::from([("reg".to_owned(), "u1".to_owned())]));
    assert_eq!(pins_to_add(&added, &sources), None, "nothing more to pin");
    // A pin is never moved: the replaced Secret stays unpinned-for.
    let old = Pins::from([("reg".to_owned(), "u0".to_owned())]);
    assert_eq!(pins_to_add(&old, &sources), None);
}

#[test]
fn a_replaced_secret_is_reported_with_both_uids_and_how_to_re_arm() {
    let problem = Problem::Replaced {
        namespace: "team".into(),
        name: "reg".into(),
        pinned: Some("u1".into()),
        found: "u2".into(),
    };
    assert_eq!(problem.reason(), "PullSecretReplaced");
    let text = problem.to_string();
    for words in ["team/reg", "u1", "u2", PULL_SECRET_UIDS, "recreate the job"] {
        assert!(text.contains(words), "{words:?} missing: {text}");
    }
}

#[test]
fn a_secret_at_the_copy_name_is_reused_only_if_it_names_this_source() {
    let source = secret("team", "reg", "{}");
    let mut other = new_copy(&secret("elsewhere", "reg", "{}"), "d", "elsewhere/j");
    assert_eq!(
        refresh_copy(&other, &source, "team/job1"),
        CopyUpdate::Conflict {
            found: Some("elsewhere/reg".into())
        }
    );
    other.annotations_mut().remove(SECRET_SOURCE_KEY);
    assert_eq!(
        refresh_copy(&other, &source, "team/job1"),
        CopyUpdate::Conflict { found: None }
    );
    // Exactly this source: a prefix or suffix of it is another source.
    other
        .annotations_mut()
        .insert(SECRET_SOURCE_KEY.into(), "team/reg2".into());
    assert!(matches!(
        refresh_copy(&other, &source, "team/job1"),
        CopyUpdate::Conflict { .. }
    ));
    let text = Problem::CopyConflict {
        source: "team/reg".into(),
        copy_namespace: "d".into(),
        copy: copy_name("team", "reg"),
        found: Some("team/reg2".into()),
    }
    .to_string();
    assert!(text.contains("team/reg2") && text.contains(&copy_name("team", "reg")));
}

#[test]
fn releasing_drops_the_job_and_deletes_with_the_last_reference() {
    let source = secret("team", "reg", "{}");
    let mut copy = new_copy(&source, "d", "team/job1");
    assert_eq!(
        release_action(&copy, "team", "team/job1"),
        Some(Release::Delete)
    );
    assert_eq!(
        release_action(&copy, "team", "team/job2"),
        None,
        "not listed"
    );
    copy.annotations_mut()
        .insert(SECRET_REFERENCES.into(), "team/job1,team/job2".into());
    let Some(Release::Update(updated)) = release_action(&copy, "team", "team/job1") else {
        panic!("job1 dropped")
    };
    assert_eq!(
        references(&updated),
        BTreeSet::from(["team/job2".to_owned()])
    );
}

#[test]
fn releasing_finds_copies_by_annotation_whatever_their_name() {
    // A copy named the way earlier versions did (a 32-bit DefaultHasher suffix).
    let mut old = new_copy(&secret("team", "reg", "{}"), "d", "team/job1");
    old.metadata.name = Some("reg-1a2b3c4d".into());
    assert_eq!(
        release_action(&old, "team", "team/job1"),
        Some(Release::Delete)
    );
    // Another namespace's copy that happens to list a job key of ours: not ours to touch.
    let foreign = new_copy(&secret("other", "reg", "{}"), "d", "team/job1");
    assert_eq!(release_action(&foreign, "team", "team/job1"), None);
    // A Secret that is no copy at all.
    let mut plain = secret("d", "reg", "{}");
    plain
        .annotations_mut()
        .insert(SECRET_REFERENCES.into(), "team/job1".into());
    assert_eq!(release_action(&plain, "team", "team/job1"), None);
}

#[test]
fn references_tolerate_spaces_and_empty_entries() {
    let mut s = secret("d", "c", "");
    s.annotations_mut()
        .insert(SECRET_REFERENCES.into(), " a/x, ,b/y,".into());
    assert_eq!(
        references(&s),
        BTreeSet::from(["a/x".to_owned(), "b/y".to_owned()])
    );
}

fn listing(refs: &str) -> Secret {
    let mut copy = new_copy(&secret("team", "reg", "{}"), "d", "team/job1");
    copy.annotations_mut()
        .insert(SECRET_REFERENCES.into(), refs.into());
    copy
}

fn gone(keys: &[&str]) -> BTreeSet<String> {
    keys.iter().map(|k| (*k).to_owned()).collect()
}

#[test]
fn the_sweep_looks_up_only_the_jobs_the_store_lacks() {
    let copy = listing(
        "team/kept,team/vanished,other/vanished,no-slash,/x,y/,a/b/c,team/..,Team/x,team/x y,-a/b",
    );
    let in_store = |ns: &str, name: &str| (ns, name) == ("team", "kept");
    assert_eq!(
        sweep_candidates(&copy, in_store),
        gone(&["other/vanished", "team/vanished"]),
        "references naming no job are never candidates"
    );
    // A Secret that is no copy (no source annotation) is never swept, whatever it lists.
    let mut plain = secret("d", "reg", "{}");
    plain
        .annotations_mut()
        .insert(SECRET_REFERENCES.into(), "team/vanished".into());
    assert!(sweep_candidates(&plain, |_, _| false).is_empty());
    assert_eq!(sweep_action(&plain, &gone(&["team/vanished"])), None);
}

#[test]
fn the_sweep_drops_gone_jobs_and_deletes_a_copy_serving_none() {
    assert_eq!(
        sweep_action(&listing("team/a,team/b"), &gone(&["team/a", "team/b"])),
        Some(Release::Delete)
    );
    let Some(Release::Update(updated)) =
        sweep_action(&listing("team/a,team/b"), &gone(&["team/a", "other/c"]))
    else {
        panic!("team/a dropped")
    };
    assert_eq!(references(&updated), gone(&["team/b"]));
    assert_eq!(
        updated.annotations()[SECRET_SOURCE_KEY],
        "team/reg",
        "the rest of the copy is kept"
    );
    assert_eq!(
        sweep_action(&listing("team/a"), &gone(&["team/b"])),
        None,
        "nothing it lists is gone"
    );
    // No references at all: not something a job left, so not the sweep's to delete.
    assert_eq!(sweep_action(&listing(""), &gone(&["team/a"])), None);
}
