use super::*;
use crate::hash::{sidecarset_hash, sidecarset_hash_without_image};
use crate::revision::restore;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kruise_rs_api::sidecarset::SidecarSetInjectRevision;
use kruise_rs_api::well_known::{SIDECARSET_HASH, SIDECARSET_HASH_WITHOUT_IMAGE};
use std::collections::BTreeMap;

use super::fixtures::*;

// --- Names and data, against Go --------------------------------------------------------------
//
// Expected texts and names were produced by Go 1.26 running upstream's steps (kruise
// v1beta1 field tags, `json.Marshal` → map → `json.Marshal`, then k8s.io/kubernetes v1.36.3
// `history.HashControllerRevision` and `ControllerRevisionName`) on the same input JSON.

#[test]
fn fnv1_matches_the_published_vectors() {
    assert_eq!(fnv1_32(&[]), 0x811c_9dc5);
    assert_eq!(fnv1_32(&[b"a"]), 0x050c_5d7e);
    assert_eq!(fnv1_32(&[b"foobar"]), 0x31f0_b262);
    assert_eq!(
        fnv1_32(&[b"foo", b"", b"bar"]),
        0x31f0_b262,
        "parts are one stream"
    );
}

#[test]
fn a_minimal_spec_is_named_as_upstream_names_it() {
    let s = spec(minimal());
    let text = text_of(&s);
    assert_eq!(
        text,
        r#"{"spec":{"$patch":"replace","containers":[{"image":"i","name":"c","resources":{},"shareVolumePolicy":{},"upgradeStrategy":{}}],"imagePullSecrets":null,"initContainers":null,"patchPodMetadata":null,"volumes":null}}"#
    );
    let name = |cc| revision_name("sidecarset1", text.as_bytes(), cc);
    assert_eq!(name(0), "sidecarset1-65fd5cd67c");
    assert_eq!(name(1), "sidecarset1-65fd5cd67b");
    assert_eq!(name(7), "sidecarset1-65fd5cd678");
    assert_eq!(name(-1), "sidecarset1-7cdbf4f7f7");
}

#[test]
fn a_rich_spec_is_written_and_named_byte_for_byte_as_upstream() {
    let s = spec(rich());
    let text = text_of(&s);
    assert_eq!(
        text,
        r#"{"spec":{"$patch":"replace","containers":[{"command":["/bin/sh","-c","run \u003ca\u003e \u0026\u0026 b"],"env":[{"name":"A","value":"1"}],"image":"example.com/proxy:1.2","name":"proxy","podInjectPolicy":"AfterAppContainer","ports":[{"containerPort":15000,"name":"admin"}],"resources":{"limits":{"cpu":"500m","memory":"1Gi"}},"shareVolumePolicy":{"type":"enabled"},"transferEnv":[{"envNames":["X"],"sourceContainerName":"app"}],"upgradeStrategy":{"hotUpgradeEmptyImage":"example.com/empty:1","upgradeType":"HotUpgrade"},"volumeMounts":[{"mountPath":"/etc/cfg","name":"cfg"}]}],"imagePullSecrets":[{"name":"regcred"}],"initContainers":[{"image":"busybox","name":"init","resources":{},"restartPolicy":"Always","shareVolumePolicy":{},"upgradeStrategy":{}},{"args":["x"],"image":"busybox","name":"plain","resources":{},"shareVolumePolicy":{},"upgradeStrategy":{}}],"patchPodMetadata":[{"annotations":{"b":"2","oom-score":"{\"log-agent\": 1}"},"patchPolicy":"MergePatchJson"}],"volumes":[{"configMap":{"defaultMode":420,"name":"cfg","optional":false},"name":"cfg"},{"emptyDir":{},"name":"scratch"},{"hostPath":{"path":"/var/log","type":"Directory"},"name":"host"},{"name":"sec","secret":{"items":[{"key":"k","path":"p"}],"secretName":"s"}}]}}"#
    );
    assert_eq!(
        revision_name("sidecarset-rich", text.as_bytes(), 0),
        "sidecarset-rich-7868cf7968"
    );
    assert_eq!(
        revision_name("sidecarset-rich", text.as_bytes(), 3),
        "sidecarset-rich-7868cf796c"
    );
}

#[test]
fn an_empty_spec_records_nulls() {
    let text = text_of(&SidecarSetSpec::default());
    assert_eq!(
        text,
        r#"{"spec":{"$patch":"replace","containers":null,"imagePullSecrets":null,"initContainers":null,"patchPodMetadata":null,"volumes":null}}"#
    );
    assert_eq!(
        revision_name("empty", text.as_bytes(), 0),
        "empty-5c7c857c5f"
    );
}

#[test]
fn a_nameless_pull_secret_is_written_as_go_omits_it() {
    let s = spec(json!({
        "containers": [{"name": "c", "image": "i"}],
        "imagePullSecrets": [{"name": ""}],
    }));
    let text = text_of(&s);
    assert!(text.contains(r#""imagePullSecrets":[{}]"#), "{text}");
    assert_eq!(revision_name("sec", text.as_bytes(), 0), "sec-65f7465d4b");
}

#[test]
fn long_sidecarset_names_are_cut_to_223_bytes() {
    let long = "s".repeat(240);
    let name = revision_name(&long, text_of(&spec(minimal())).as_bytes(), 1);
    assert_eq!(name, format!("{}-65fd5cd67b", "s".repeat(223)));
    assert_eq!(controller_revision_name("short", "h"), "short-h");
    // Never split a character, whatever the input.
    let odd = format!("{}é", "x".repeat(222));
    assert_eq!(
        controller_revision_name(&odd, "h"),
        format!("{}-h", "x".repeat(222))
    );
}

#[test]
fn go_strings_escape_html_and_control_characters() {
    assert_eq!(
        go_json_text(&json!({"b": "a<b>&c\u{2028}\u{2029}\u{1}\n\"\\é", "a": [1, -2, true, null]})),
        r#"{"a":[1,-2,true,null],"b":"a\u003cb\u003e\u0026c\u2028\u2029\u0001\n\"\\é"}"#
    );
}

#[test]
fn the_data_restores_to_the_same_version() {
    let mut set = sidecarset("rich", rich());
    set.metadata.annotations = Some(BTreeMap::from([
        (SIDECARSET_HASH.to_owned(), sidecarset_hash(&set.spec)),
        (
            SIDECARSET_HASH_WITHOUT_IMAGE.to_owned(),
            sidecarset_hash_without_image(&set.spec),
        ),
    ]));
    let revision = new_revision(&set, NS, 1, 0);
    // Restore over a different current spec, as injection of an old version does.
    let mut current = set.clone();
    current.spec = spec(minimal());
    current.spec.selector = set.spec.selector.clone();
    let restored = restore(&current, &revision).expect("restorable");
    assert_eq!(restored.spec.volumes, set.spec.volumes);
    assert_eq!(
        restored.spec.image_pull_secrets,
        set.spec.image_pull_secrets
    );
    assert_eq!(
        restored.spec.patch_pod_metadata,
        set.spec.patch_pod_metadata
    );
    assert_eq!(restored.spec.init_containers.len(), 2);
    // Go's always-written `{}` structs and canonical quantities decode to the same version.
    assert_eq!(
        sidecarset_hash(&restored.spec),
        sidecarset_hash(&set.spec),
        "containers and native-sidecar init containers"
    );
    assert_eq!(
        sidecarset_hash_without_image(&restored.spec),
        sidecarset_hash_without_image(&set.spec)
    );
    assert_eq!(restored.hash, sidecarset_hash(&set.spec));
    assert_eq!(revision_data(&restored.spec), revision_data(&set.spec));
    assert_eq!(
        restored.controller_revision.as_deref(),
        Some(name_of(&revision))
    );
}

#[test]
fn an_empty_revision_restores_to_empty_lists() {
    let set = sidecarset("s", json!({}));
    let mut current = set.clone();
    current.spec = spec(rich());
    let restored = restore(&current, &new_revision(&set, NS, 1, 0)).expect("restorable");
    assert!(restored.spec.containers.is_empty());
    assert!(restored.spec.init_containers.is_empty());
    assert!(restored.spec.volumes.is_empty());
    assert!(restored.spec.image_pull_secrets.is_empty());
    assert!(restored.spec.patch_pod_metadata.is_empty());
}

// --- The revision object ---------------------------------------------------------------------

#[test]
fn a_new_revision_carries_labels_annotations_owner_and_data() {
    let mut set = sidecarset("sidecarset1", minimal());
    set.metadata.labels = Some(BTreeMap::from([
        ("team".to_owned(), "a".to_owned()),
        (SIDECARSET_NAME_LABEL.to_owned(), "spoofed".to_owned()),
    ]));
    set.metadata.annotations = Some(BTreeMap::from([
        (SIDECARSET_HASH.to_owned(), "h1".to_owned()),
        (SIDECARSET_HASH_WITHOUT_IMAGE.to_owned(), "h2".to_owned()),
        ("note".to_owned(), "x".to_owned()),
    ]));
    let r = new_revision(&set, NS, 4, 1);
    assert_eq!(name_of(&r), "sidecarset1-65fd5cd67b");
    assert_eq!(r.metadata.namespace.as_deref(), Some(NS));
    assert_eq!(r.revision, 4);
    let labels = r.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels,
        BTreeMap::from([
            ("team".to_owned(), "a".to_owned()),
            (SIDECARSET_NAME_LABEL.to_owned(), "sidecarset1".to_owned()),
            (HISTORY_HASH_LABEL.to_owned(), "65fd5cd67b".to_owned()),
            (CONTROLLER_REVISION_HASH.to_owned(), "65fd5cd67b".to_owned()),
        ])
    );
    assert_eq!(r.metadata.annotations, set.metadata.annotations);
    assert_eq!(
        r.metadata.owner_references,
        Some(vec![OwnerReference {
            api_version: "apps.kruise.io/v1beta1".into(),
            kind: "SidecarSet".into(),
            name: "sidecarset1".into(),
            uid: UID.into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }])
    );
    assert_eq!(r.data, Some(RawExtension(revision_data(&set.spec))));
}

#[test]
fn the_custom_version_label_comes_from_the_spec_or_the_v1alpha1_label() {
    let mut set = sidecarset("s", minimal());
    set.metadata.labels = Some(BTreeMap::from([(
        SIDECARSET_CUSTOM_VERSION_LABEL.to_owned(),
        "old".to_owned(),
    )]));
    let version = |set: &SidecarSet| {
        label(
            &new_revision(set, NS, 1, 0),
            SIDECARSET_CUSTOM_VERSION_LABEL,
        )
        .map(str::to_owned)
    };
    assert_eq!(version(&set).as_deref(), Some("old"));
    set.spec.custom_version = Some("v2".into());
    assert_eq!(version(&set).as_deref(), Some("v2"));
    set.metadata.labels = None;
    set.spec.custom_version = None;
    assert_eq!(version(&set), None);
}

#[test]
fn without_a_uid_there_is_no_owner_reference() {
    let mut set = sidecarset("s", minimal());
    set.metadata.uid = None;
    assert_eq!(new_revision(&set, NS, 1, 0).metadata.owner_references, None);
}

// --- Ownership and equality ------------------------------------------------------------------

fn owned_by(mut r: ControllerRevision, uid: &str, controller: bool) -> ControllerRevision {
    r.metadata.owner_references = Some(vec![OwnerReference {
        uid: uid.into(),
        controller: Some(controller),
        ..OwnerReference::default()
    }]);
    r
}

#[test]
fn own_revisions_are_labelled_and_not_controlled_by_others() {
    let set = sidecarset("s", minimal());
    let r = new_revision(&set, NS, 1, 0);
    assert!(is_own_revision(&set, &r));
    assert!(is_own_revision(&set, &owned_by(r.clone(), UID, true)));
    assert!(
        is_own_revision(&set, &owned_by(r.clone(), "other", false)),
        "only a controller reference excludes"
    );
    let mut orphan = r.clone();
    orphan.metadata.owner_references = None;
    assert!(is_own_revision(&set, &orphan), "orphans are adopted");
    assert!(!is_own_revision(&set, &owned_by(r.clone(), "other", true)));
    let other = sidecarset("other", minimal());
    assert!(!is_own_revision(&other, &r));
    let mut unlabelled = r.clone();
    unlabelled.metadata.labels = None;
    assert!(!is_own_revision(&set, &unlabelled));
    let mut nameless = set.clone();
    nameless.metadata.name = None;
    assert!(!is_own_revision(&nameless, &unlabelled));
}

fn with_data(data: Value) -> ControllerRevision {
    ControllerRevision {
        data: Some(RawExtension(data)),
        ..ControllerRevision::default()
    }
}

#[test]
fn revisions_are_equal_by_meaning() {
    let set = sidecarset("s", rich());
    let ours = new_revision(&set, NS, 1, 0);
    assert!(equal_revisions(&ours, &new_revision(&set, NS, 7, 3)));

    // As upstream's kruise-manager writes it (parsed from its text).
    let upstream: Value = serde_json::from_str(&text_of(&set.spec)).expect("json");
    assert!(equal_revisions(&ours, &with_data(upstream)));

    // As serde writes the spec (the integration tests' `record_revision`): no Go-only
    // `{}` structs, quantities as written.
    let plain = serde_json::to_value(&set.spec).expect("json");
    let field = |k: &str| plain.get(k).cloned().unwrap_or(Value::Null);
    let serde_form = json!({"spec": {
        "$patch": "replace",
        "volumes": field("volumes"),
        "containers": field("containers"),
        "initContainers": field("initContainers"),
        "imagePullSecrets": field("imagePullSecrets"),
        "patchPodMetadata": field("patchPodMetadata"),
    }});
    assert_ne!(serde_form, revision_data(&set.spec));
    assert!(equal_revisions(&ours, &with_data(serde_form)));

    // Absent and null lists are the same empty list.
    let empty = new_revision(&sidecarset("s", json!({})), NS, 1, 0);
    assert!(equal_revisions(
        &empty,
        &with_data(json!({"spec": {"$patch": "replace"}}))
    ));
}

#[test]
fn different_versions_are_not_equal() {
    let a = new_revision(&sidecarset("s", minimal()), NS, 1, 0);
    let b = new_revision(
        &sidecarset("s", json!({"containers": [{"name": "c", "image": "j"}]})),
        NS,
        1,
        0,
    );
    assert!(!equal_revisions(&a, &b));
    let mut c_spec = minimal();
    c_spec["volumes"] = json!([{"name": "v", "emptyDir": {}}]);
    let c = new_revision(&sidecarset("s", c_spec), NS, 1, 0);
    assert!(!equal_revisions(&a, &c), "volumes count");
    let mut d_spec = minimal();
    d_spec["patchPodMetadata"] = json!([{"annotations": {"a": "b"}}]);
    let d = new_revision(&sidecarset("s", d_spec), NS, 1, 0);
    assert!(!equal_revisions(&a, &d), "metadata patches count");
}

#[test]
fn odd_data_is_compared_as_it_is() {
    let a = new_revision(&sidecarset("s", minimal()), NS, 1, 0);
    assert!(!equal_revisions(&a, &ControllerRevision::default()));
    assert!(!equal_revisions(
        &ControllerRevision::default(),
        &ControllerRevision::default()
    ));
    // Without `$patch: replace`, or with fields this version does not record, data is not
    // reinterpreted: only identical JSON is equal.
    let merge = json!({"spec": {"containers": [{"name": "c", "image": "i"}]}});
    assert!(!equal_revisions(&a, &with_data(merge.clone())));
    assert!(equal_revisions(
        &with_data(merge.clone()),
        &with_data(merge)
    ));
    let mut extra = revision_data(&spec(minimal()));
    extra["spec"]["selector"] = json!({});
    assert!(!equal_revisions(&a, &with_data(extra)));
    let bad = json!({"spec": {"$patch": "replace", "containers": "nope"}});
    assert!(!equal_revisions(&a, &with_data(bad.clone())));
    assert!(equal_revisions(&with_data(bad.clone()), &with_data(bad)));
}

// --- Registration ----------------------------------------------------------------------------

/// What the apiserver would hold after the plan is carried out; returns the latest name.
fn apply(store: &mut Vec<ControllerRevision>, plan: Registration) -> String {
    let (name, number, custom_version) = match plan {
        Registration::Create { revision } => {
            let name = name_of(&revision).to_owned();
            store.push(revision);
            return name;
        }
        Registration::Current {
            revision,
            custom_version,
        } => (name_of(&revision).to_owned(), None, custom_version),
        Registration::RollBack {
            revision,
            number,
            custom_version,
        } => (name_of(&revision).to_owned(), Some(number), custom_version),
    };
    let stored = store
        .iter_mut()
        .find(|r| name_of(r) == name)
        .expect("planned revision is stored");
    if let Some(number) = number {
        stored.revision = number;
    }
    if let Some(version) = custom_version {
        stored
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(SIDECARSET_CUSTOM_VERSION_LABEL.to_owned(), version);
    }
    name
}

/// Upstream's reconcile step: register, then truncate (no pods use anything).
fn reconcile(store: &mut Vec<ControllerRevision>, set: &SidecarSet) -> (String, i64) {
    let latest = apply(store, plan_registration(set, store, NS, 0));
    let doomed = revisions_to_delete(set, store, &latest, &BTreeSet::new());
    store.retain(|r| !doomed.iter().any(|d| d == name_of(r)));
    let number = store
        .iter()
        .find(|r| name_of(r) == latest)
        .map(|r| r.revision)
        .unwrap_or_default();
    (latest, number)
}

#[test]
fn upstream_get_active_revisions_create_update_rollback_and_limit() {
    // Upstream TestGetActiveRevisions.
    let mut store = Vec::new();
    let mut set = sidecarset("sidecarset1", minimal());
    assert_eq!(reconcile(&mut store, &set).1, 1, "create");

    let mut updated = set.clone();
    updated.spec.init_containers =
        spec(json!({"initContainers": [{"name": "emptyInitC"}]})).init_containers;
    updated.spec.volumes = spec(json!({"volumes": [{"name": "emptyVolume"}]})).volumes;
    updated.spec.image_pull_secrets = vec![LocalObjectReference {
        name: "emptySecret".into(),
    }];
    for _ in 0..5 {
        let (latest, number) = reconcile(&mut store, &updated);
        assert_eq!(number, 2, "update, then unchanged");
        let stored = store.iter().find(|r| name_of(r) == latest).expect("stored");
        let data = &stored.data.as_ref().expect("data").0["spec"];
        for key in [
            "volumes",
            "containers",
            "initContainers",
            "imagePullSecrets",
        ] {
            assert!(!data[key].is_null(), "{key} recorded");
        }
    }
    for _ in 0..5 {
        assert_eq!(reconcile(&mut store, &set).1, 3, "rollback, then unchanged");
    }
    assert_eq!(store.len(), 2, "a rollback creates nothing");

    for i in 0..100 {
        set.spec.containers[0].container.image = Some(i.to_string());
        reconcile(&mut store, &set);
    }
    assert_eq!(store.len(), 10, "revisionHistoryLimit");
}

#[test]
fn an_empty_history_creates_revision_one() {
    let set = sidecarset("s", minimal());
    match plan_registration(&set, &[], NS, 2) {
        Registration::Create { revision } => {
            assert_eq!(revision.revision, 1);
            assert_eq!(
                revision,
                new_revision(&set, NS, 1, 2),
                "collision count used"
            );
        }
        other => panic!("expected Create, got {other:?}"),
    }
}

#[test]
fn a_changed_spec_gets_the_next_number() {
    let old = sidecarset("s", minimal());
    let history = [new_revision(&old, NS, 5, 0)];
    let new = sidecarset("s", json!({"containers": [{"name": "c", "image": "j"}]}));
    let plan = plan_registration(&new, &history, NS, 0);
    assert!(matches!(&plan, Registration::Create { revision } if revision.revision == 6));
}

#[test]
fn the_newest_equal_revision_is_kept_even_from_upstream() {
    let set = sidecarset("s", rich());
    let mut upstream = new_revision(&set, NS, 3, 0);
    upstream.data = Some(RawExtension(
        serde_json::from_str(&text_of(&set.spec)).expect("json"),
    ));
    upstream.metadata.name = Some("s-written-by-upstream".into());
    let older = new_revision(&sidecarset("s", minimal()), NS, 2, 0);
    let plan = plan_registration(&set, &[upstream.clone(), older], NS, 0);
    assert_eq!(
        plan,
        Registration::Current {
            revision: upstream,
            custom_version: None
        }
    );
}

#[test]
fn an_older_equal_revision_is_rolled_back_to_the_front() {
    let v1 = sidecarset("s", minimal());
    let v2 = sidecarset("s", json!({"containers": [{"name": "c", "image": "j"}]}));
    let history = [new_revision(&v2, NS, 2, 0), new_revision(&v1, NS, 1, 0)];
    match plan_registration(&v1, &history, NS, 0) {
        Registration::RollBack {
            revision,
            number,
            custom_version,
        } => {
            assert_eq!(name_of(&revision), name_of(&history[1]));
            assert_eq!(number, 3);
            assert_eq!(custom_version, None);
        }
        other => panic!("expected RollBack, got {other:?}"),
    }
}

#[test]
fn of_several_equal_revisions_the_newest_is_rolled_back() {
    let v1 = sidecarset("s", minimal());
    let v2 = sidecarset("s", json!({"containers": [{"name": "c", "image": "j"}]}));
    let mut dup = new_revision(&v1, NS, 3, 1);
    dup.metadata.name = Some("s-dup".into());
    let history = [
        new_revision(&v1, NS, 1, 0),
        dup,
        new_revision(&v2, NS, 4, 0),
    ];
    let plan = plan_registration(&v1, &history, NS, 0);
    assert!(
        matches!(
            &plan,
            Registration::RollBack { revision, number: 5, .. } if name_of(revision) == "s-dup"
        ),
        "{plan:?}"
    );
}

#[test]
fn equal_numbers_are_ordered_by_creation_time_then_name() {
    let v1 = sidecarset("s", minimal());
    let v2 = sidecarset("s", json!({"containers": [{"name": "c", "image": "j"}]}));
    let mut a = new_revision(&v1, NS, 2, 0);
    a.metadata.name = Some("s-b".into());
    let mut b = new_revision(&v2, NS, 2, 0);
    b.metadata.name = Some("s-a".into());
    // Same number, no timestamps: "s-b" (v1) sorts last, so v1 is current.
    let plan = plan_registration(&v1, &[a.clone(), b.clone()], NS, 0);
    assert!(matches!(plan, Registration::Current { .. }), "{plan:?}");
    // A later creation time wins over the name.
    b.metadata.creation_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    let plan = plan_registration(&v1, &[a, b], NS, 0);
    assert!(
        matches!(plan, Registration::RollBack { number: 3, .. }),
        "{plan:?}"
    );
}

#[test]
fn other_sidecarsets_revisions_are_ignored() {
    let set = sidecarset("s", minimal());
    let mut foreign = new_revision(&sidecarset("t", minimal()), NS, 50, 0);
    foreign.metadata.name = Some("t-x".into());
    let stolen = owned_by(new_revision(&set, NS, 40, 0), "another-uid", true);
    let plan = plan_registration(&set, &[foreign, stolen], NS, 0);
    assert!(
        matches!(&plan, Registration::Create { revision } if revision.revision == 1),
        "{plan:?}"
    );
}

#[test]
fn a_missing_custom_version_label_is_reported() {
    let mut set = sidecarset("s", minimal());
    let stored = new_revision(&set, NS, 1, 0);
    set.spec.custom_version = Some("v1".into());
    let plan = plan_registration(&set, std::slice::from_ref(&stored), NS, 0);
    assert_eq!(
        plan,
        Registration::Current {
            revision: stored.clone(),
            custom_version: Some("v1".into())
        }
    );
    // Labelled already: nothing to do.
    let labelled = new_revision(&set, NS, 1, 0);
    assert!(matches!(
        plan_registration(&set, &[labelled], NS, 0),
        Registration::Current {
            custom_version: None,
            ..
        }
    ));
    // A rollback carries the label too.
    let other = new_revision(
        &sidecarset("s", json!({"containers": [{"name": "c", "image": "j"}]})),
        NS,
        2,
        0,
    );
    assert!(matches!(
        plan_registration(&set, &[stored, other], NS, 0),
        Registration::RollBack { custom_version: Some(v), number: 3, .. } if v == "v1"
    ));
}

// --- Truncation ------------------------------------------------------------------------------

fn numbered(set: &SidecarSet, count: i64) -> Vec<ControllerRevision> {
    (1..=count)
        .map(|i| {
            let mut r = new_revision(set, NS, i, 0);
            r.metadata.name = Some(format!("sidecar-{i}"));
            r
        })
        .collect()
}

/// Upstream TestTruncateHistory: 15 revisions, 100 pods recording `sidecar-(i % used + 1)`.
fn in_use(used: usize) -> BTreeSet<String> {
    (0..100)
        .map(|i| format!("sidecar-{}", i % used + 1))
        .collect()
}

#[test]
fn upstream_truncate_history_cases() {
    let set = sidecarset("sidecar", minimal());
    let history = numbered(&set, 15);
    for used in 1..=9 {
        let doomed = revisions_to_delete(&set, &history, "sidecar-15", &in_use(used));
        assert_eq!(doomed.len(), 5, "used {used}: back to the limit");
    }
    for (used, left) in [(10, 11), (11, 12), (14, 15), (15, 15), (20, 15)] {
        let doomed = revisions_to_delete(&set, &history, "sidecar-15", &in_use(used));
        assert_eq!(15 - doomed.len(), left, "used {used}");
    }
    let doomed = revisions_to_delete(&set, &history, "sidecar-15", &in_use(8));
    assert_eq!(
        doomed,
        [
            "sidecar-9",
            "sidecar-10",
            "sidecar-11",
            "sidecar-12",
            "sidecar-13"
        ],
        "oldest unused first; 1-8, 14 and 15 stay"
    );
}

#[test]
fn the_limit_defaults_to_ten_and_is_at_least_one() {
    let mut set = sidecarset("sidecar", minimal());
    let history = numbered(&set, 12);
    let none = BTreeSet::new();
    set.spec.revision_history_limit = None;
    assert_eq!(
        revisions_to_delete(&set, &history, "sidecar-12", &none),
        ["sidecar-1", "sidecar-2"]
    );
    for limit in [0, -3, 1] {
        set.spec.revision_history_limit = Some(limit);
        let doomed = revisions_to_delete(&set, &history, "sidecar-12", &none);
        assert_eq!(doomed.len(), 11, "limit {limit}");
        assert!(!doomed.contains(&"sidecar-12".to_owned()));
    }
    set.spec.revision_history_limit = Some(12);
    assert!(revisions_to_delete(&set, &history, "sidecar-12", &none).is_empty());
}

#[test]
fn the_latest_is_never_deleted_and_counts_even_if_unlisted() {
    let mut set = sidecarset("sidecar", minimal());
    set.spec.revision_history_limit = Some(3);
    let history = numbered(&set, 3);
    let none = BTreeSet::new();
    // Rolled back: the oldest listed number is the latest.
    assert_eq!(
        revisions_to_delete(&set, &history, "sidecar-1", &none),
        Vec::<String>::new()
    );
    // Just created, not yet in the listing: four stored.
    assert_eq!(
        revisions_to_delete(&set, &history, "sidecar-new", &none),
        ["sidecar-1"]
    );
    // Listed twice (before and after renumbering): one revision.
    let mut twice = history.clone();
    let mut bumped = twice[0].clone();
    bumped.revision = 4;
    twice.push(bumped);
    assert!(revisions_to_delete(&set, &twice, "sidecar-1", &none).is_empty());
}

#[test]
fn injection_strategy_revisions_are_kept() {
    let mut set = sidecarset("sidecar", minimal());
    set.spec.revision_history_limit = Some(2);
    let mut history = numbered(&set, 6);
    for r in &mut history[..3] {
        r.metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(SIDECARSET_CUSTOM_VERSION_LABEL.to_owned(), "v1".to_owned());
    }
    set.spec.injection_strategy.revision = Some(SidecarSetInjectRevision {
        custom_version: Some("v1".into()),
        revision_name: Some("sidecar-2".into()),
        policy: None,
    });
    assert_eq!(
        revisions_to_delete(&set, &history, "sidecar-6", &BTreeSet::new()),
        ["sidecar-1", "sidecar-4", "sidecar-5"],
        "sidecar-2 by name, sidecar-3 as the newest v1"
    );
}

#[test]
fn other_sidecarsets_revisions_are_neither_counted_nor_deleted() {
    let mut set = sidecarset("sidecar", minimal());
    set.spec.revision_history_limit = Some(2);
    let mut history = numbered(&set, 2);
    let mut foreign = numbered(&sidecarset("other", minimal()), 5);
    for r in &mut foreign {
        r.metadata.name = Some(format!("other-{}", r.revision));
    }
    history.extend(foreign);
    history.push(owned_by(
        {
            let mut r = new_revision(&set, NS, 0, 0);
            r.metadata.name = Some("stolen".into());
            r
        },
        "another-uid",
        true,
    ));
    assert!(revisions_to_delete(&set, &history, "sidecar-2", &BTreeSet::new()).is_empty());
}

// --- Writing, against a scripted apiserver ---------------------------------------------------
