use super::*;
use crate::defaults::default_sidecarset;
use crate::validation::ErrorKind;
use serde_json::{Value, json};

fn spec(v: Value) -> SidecarSetSpec {
    serde_json::from_value(v).expect("test SidecarSet spec")
}

/// A SidecarSet as the webhook sees it: deserialized, then defaulted.
fn set(name: &str, v: Value) -> SidecarSet {
    let mut s = SidecarSet::new(name, spec(v));
    default_sidecarset(&mut s);
    s
}

fn raw_set(name: &str, v: Value) -> SidecarSet {
    SidecarSet::new(name, spec(v))
}

/// Upstream's test fixture: NotUpdate, one plain container.
fn base_json() -> Value {
    json!({
        "selector": {"matchLabels": {"a": "b"}},
        "updateStrategy": {"type": "NotUpdate"},
        "containers": [{"name": "test-sidecar", "image": "test-image"}]
    })
}

fn with(mut base: Value, patch: Value) -> Value {
    json_patch::merge(&mut base, &patch);
    base
}

fn annotate(mut s: SidecarSet, pairs: &[(&str, &str)]) -> SidecarSet {
    let annotations = s.metadata.annotations.get_or_insert_with(BTreeMap::new);
    for (k, v) in pairs {
        annotations.insert((*k).to_owned(), (*v).to_owned());
    }
    s
}

fn canary(name: &str, base: &str, v: Value) -> SidecarSet {
    annotate(
        set(name, v),
        &[(SIDECARSET_CANARY, "true"), (SIDECARSET_BASE, base)],
    )
}

fn errors(r: Result<(), ValidationErrors>) -> Vec<FieldError> {
    r.err().map(|e| e.0).unwrap_or_default()
}

fn create(s: &SidecarSet) -> Vec<FieldError> {
    create_with(s, &[], &SidecarSetContext::default())
}

fn create_with(
    s: &SidecarSet,
    others: &[SidecarSet],
    ctx: &SidecarSetContext<'_>,
) -> Vec<FieldError> {
    errors(validate_create(s, others, ctx))
}

fn update(old: &SidecarSet, new: &SidecarSet, others: &[SidecarSet]) -> Vec<FieldError> {
    errors(validate_update(
        old,
        new,
        others,
        &SidecarSetContext::default(),
    ))
}

/// What the local copy of Kubernetes' pod validation finds (the webhook's advice when its
/// dry-run pod gets no answer; `validate_create` leaves these rules to the apiserver).
fn pod_rules(s: &SidecarSet) -> Vec<FieldError> {
    pod_rules_as_of_1_33(s)
}

fn paths(errs: &[FieldError]) -> Vec<&str> {
    errs.iter().map(|e| e.path.as_str()).collect()
}

fn revisions() -> Vec<KnownRevision> {
    vec![
        KnownRevision {
            name: "test-sidecarset-01234".into(),
            custom_version: None,
        },
        KnownRevision {
            name: "test-sidecarset-56789".into(),
            custom_version: Some("v2".into()),
        },
    ]
}

#[test]
fn the_base_fixture_is_valid() {
    assert_eq!(create(&set("test-sidecarset", base_json())), []);
}

// --- upstream TestValidateSidecarSet, scenario by scenario ---

#[test]
fn upstream_missing_selector() {
    let s = set(
        "test-sidecarset",
        with(base_json(), json!({"selector": null})),
    );
    let errs = create(&s);
    assert_eq!(
        errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["spec.selector: Required value: no selector defined for SidecarSet"]
    );
}

#[test]
fn upstream_wrong_update_strategy_duplicate_scatter() {
    let s = set(
        "test-sidecarset",
        with(
            base_json(),
            json!({"updateStrategy": {
                "type": "RollingUpdate",
                "scatterStrategy": [{"key": "key-1", "value": "value-1"}, {"key": "key-1", "value": "value-1"}]
            }}),
        ),
    );
    let errs = create(&s);
    assert_eq!(
        errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [r#"spec.updateStrategy.scatterStrategy[1]: Duplicate value: "key-1=value-1""#]
    );
}

#[test]
fn upstream_wrong_selector_and_namespace_selector() {
    // Upstream counts 2 errors for each (the same bad value, found by two parsers); one here.
    let bad = json!({"matchLabels": {"a": "b"}, "matchExpressions": [
            {"key": "app-name", "operator": "NotIn", "values": ["app-group", "app-risk-"]}]});
    let good = json!({"matchLabels": {"a": "b"}, "matchExpressions": [
            {"key": "app-name", "operator": "NotIn", "values": ["app-group", "app-risk"]}]});
    let s = set(
        "test-sidecarset",
        with(base_json(), json!({"selector": bad.clone()})),
    );
    assert_eq!(
        paths(&create(&s)),
        ["spec.selector.matchExpressions[0].values[1]"]
    );
    let s = set(
        "test-sidecarset",
        with(
            base_json(),
            json!({"selector": good.clone(), "namespaceSelector": bad}),
        ),
    );
    assert_eq!(
        paths(&create(&s)),
        ["spec.namespaceSelector.matchExpressions[0].values[1]"]
    );
    // wrong-namespace-selector: a valid namespace selector, no error.
    let s = set(
        "test-sidecarset",
        with(
            base_json(),
            json!({"selector": good, "namespaceSelector": {"matchLabels": {"a": "b"}}}),
        ),
    );
    assert_eq!(create(&s), []);
}

#[test]
fn upstream_wrong_init_container_without_image() {
    let s = set(
        "test-sidecarset",
        with(
            base_json(),
            json!({"containers": null, "initContainers": [{"name": "test-sidecar"}]}),
        ),
    );
    assert_eq!(
        create(&s)
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["spec.initContainers[0].image: Required value"]
    );
}

#[test]
fn upstream_missing_container() {
    let s = set(
        "test-sidecarset",
        with(base_json(), json!({"containers": null})),
    );
    assert_eq!(
        create(&s)
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["spec.containers: Required value: no initContainer or container defined for SidecarSet"]
    );
}

#[test]
fn upstream_wrong_containers_missing_share_volume_policy() {
    // Upstream validates what its mutating webhook defaulted; an unset policy is defaulted
    // here too, and an explicit empty one is an unsupported value in the raw JSON.
    let s = raw_set("test-sidecarset", base_json());
    assert_eq!(s.spec.containers[0].share_volume_policy, None);
    assert_eq!(create(&s), []);
    let raw = with(
        json!({"spec": base_json()}),
        json!({"spec": {"containers": [{"name": "test-sidecar", "image": "test-image", "shareVolumePolicy": {"type": ""}}]}}),
    );
    let errs = errors(validate_raw_enums(&raw));
    assert_eq!(
        errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            r#"spec.containers[0].shareVolumePolicy.type: Unsupported value: "": supported values: "enabled", "disabled""#
        ]
    );
}

#[test]
fn upstream_wrong_volumes() {
    let volumes = json!({"volumes": [
        {"name": "test-volume"},
        {"name": "istio-token", "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"audience": "istio-ca", "expirationSeconds": 43200, "path": "istio-token"}}]}}
    ]});
    // Undefaulted, as in upstream's test: the source-less volume is an error.
    // Kubernetes' rule, so the apiserver's to judge: only the local copy reports it.
    let s = raw_set("test-sidecarset", with(base_json(), volumes.clone()));
    assert_eq!(create(&s), []);
    assert_eq!(
        pod_rules(&s)
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["spec.volumes[0]: Required value: must specify a volume type"]
    );
    // Defaulted, as through the webhooks: it became an emptyDir.
    assert_eq!(
        create(&set("test-sidecarset", with(base_json(), volumes))),
        []
    );
}

#[test]
fn upstream_volume_device_scenarios() {
    let device = json!({"containers": [{"name": "test-sidecar", "image": "test-image",
            "volumeDevices": [{"name": "disk0", "devicePath": "/dev/nvme1"}]}]});
    // Kubernetes' rules, so the apiserver's to judge: only the local copy reports them.
    let s = set("test-sidecarset", with(base_json(), device.clone()));
    assert_eq!(create(&s), []);
    assert_eq!(
        paths(&pod_rules(&s)),
        ["spec.containers[0].volumeDevices[0].name"]
    );
    let s = set(
        "test-sidecarset",
        with(
            base_json(),
            with(
                device,
                json!({"volumes": [
            {"name": "disk0", "persistentVolumeClaim": {"claimName": "pvc-0"}}]}),
            ),
        ),
    );
    assert_eq!(create(&s), []);
    assert_eq!(pod_rules(&s), []);
    let s = set(
        "test-sidecarset",
        with(
            base_json(),
            json!({
                "containers": [{"name": "test-sidecar", "image": "test-image",
                    "volumeDevices": [{"name": "disk0", "devicePath": "/home/admin/log"}],
                    "volumeMounts": [{"name": "log", "mountPath": "/home/admin/log"}]}],
                "volumes": [{"name": "disk0", "persistentVolumeClaim": {"claimName": "pvc-0"}}, {"name": "log", "emptyDir": {}}]
            }),
        ),
    );
    assert_eq!(create(&s), []);
    assert_eq!(pod_rules(&s).len(), 2);
}

#[test]
fn upstream_wrong_metadata_duplicate_patch_key() {
    let s = set(
        "test-sidecarset",
        with(
            base_json(),
            json!({"patchPodMetadata": [
                {"annotations": {"key1": "value1"}, "patchPolicy": "MergePatchJson"},
                {"annotations": {"key1": "value1"}, "patchPolicy": "Overwrite"}
            ]}),
        ),
    );
    let ctx = SidecarSetContext {
        patch_pod_metadata: &PatchPodMetadataPolicy::AllowAll,
        ..Default::default()
    };
    let errs = create_with(&s, &[], &ctx);
    // Upstream: the duplicate. Here also: "value1" is not JSON, which MergePatchJson needs.
    assert_eq!(
        errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            r#"spec.patchPodMetadata[0].annotations[key1]: Invalid value: "value1": a MergePatchJson value must be JSON: expected value at line 1 column 1"#,
            r#"spec.patchPodMetadata[1].annotations[key1]: Duplicate value: "key1""#,
        ]
    );
}

#[test]
fn upstream_injection_strategy_revisions() {
    let revs = revisions();
    let ctx = SidecarSetContext {
        revisions: &revs,
        ..Default::default()
    };
    // wrong-name-injectionStrategy: no revision has this custom version.
    let s = set(
        "test-sidecarset",
        with(
            base_json(),
            json!({"injectionStrategy": {"revision": {"customVersion": "normal-sidecarset-01234"}}}),
        ),
    );
    let errs = create_with(&s, &[], &ctx);
    assert_eq!(
        paths(&errs),
        ["spec.injectionStrategy.revision.customVersion"]
    );
    assert_eq!(errs[0].kind, ErrorKind::NotFound);
    // not-existing-injectionStrategy: no revision has this name.
    let s = set(
        "test-sidecarset",
        with(
            base_json(),
            json!({"injectionStrategy": {"revision": {"revisionName": "test-sidecarset-678235", "policy": "Always"}}}),
        ),
    );
    assert_eq!(
        paths(&create_with(&s, &[], &ctx)),
        ["spec.injectionStrategy.revision.revisionName"]
    );
    // Resolvable by name or by custom version.
    let s = set(
        "test-sidecarset",
        with(
            base_json(),
            json!({"injectionStrategy": {"revision": {"revisionName": "test-sidecarset-01234"}}}),
        ),
    );
    assert_eq!(create_with(&s, &[], &ctx), []);
    let s = set(
        "test-sidecarset",
        with(
            base_json(),
            json!({"injectionStrategy": {"revision": {"customVersion": "v2", "policy": "Partial"}}}),
        ),
    );
    assert_eq!(create_with(&s, &[], &ctx), []);
    // revisionName wins when both are set, as upstream.
    let s = set(
        "test-sidecarset",
        with(
            base_json(),
            json!({"injectionStrategy": {"revision": {"revisionName": "nope", "customVersion": "v2"}}}),
        ),
    );
    assert_eq!(
        paths(&create_with(&s, &[], &ctx)),
        ["spec.injectionStrategy.revision.revisionName"]
    );
    // Neither set.
    let s = set(
        "test-sidecarset",
        with(
            base_json(),
            json!({"injectionStrategy": {"revision": {"policy": "Always"}}}),
        ),
    );
    let errs = create_with(&s, &[], &ctx);
    assert_eq!(
        errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            "spec.injectionStrategy.revision: Required value: revisionName and customVersion cannot be empty simultaneously"
        ]
    );
}

#[test]
fn known_revisions_come_from_controller_revisions() {
    let rev: ControllerRevision = serde_json::from_value(json!({
        "metadata": {"name": "r1", "labels": {"apps.kruise.io/sidecarset-custom-version": "v9"}},
        "revision": 1
    }))
    .expect("revision");
    assert_eq!(
        KnownRevision::from_controller_revision(&rev),
        KnownRevision {
            name: "r1".into(),
            custom_version: Some("v9".into())
        }
    );
}

/// Upstream refuses this spec (#1671); kruise-rs upgrades native sidecars in place.
#[test]
fn native_sidecars_accept_rolling_update() {
    let native = json!({"initContainers": [{"name": "test-sidecar", "image": "test-image", "restartPolicy": "Always"}], "containers": null});
    let s = set(
        "test-sidecarset",
        with(
            base_json(),
            with(
                native.clone(),
                json!({"updateStrategy": {"type": "RollingUpdate", "maxUnavailable": 1}}),
            ),
        ),
    );
    assert_eq!(create(&s), []);
    // The default type, RollingUpdate, too.
    let s = set(
        "test-sidecarset",
        with(
            with(base_json(), json!({"updateStrategy": null})),
            native.clone(),
        ),
    );
    assert_eq!(
        s.spec.update_strategy.type_,
        Some(SidecarSetUpdateStrategyType::RollingUpdate)
    );
    assert_eq!(create(&s), []);
    assert_eq!(
        create(&set("test-sidecarset", with(base_json(), native))),
        []
    );
}

#[test]
fn a_native_sidecar_asks_for_hot_upgrade_only_when_never_updated() {
    let init = |restart: Value, strategy: &str| {
        set(
            "test-sidecarset",
            with(
                base_json(),
                json!({
                    "initContainers": [
                        {"name": "plain", "image": "test-image"},
                        {"name": "native", "image": "test-image", "restartPolicy": restart,
                         "upgradeStrategy": {"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "empty:1"}},
                    ],
                    "updateStrategy": {"type": strategy},
                }),
            ),
        )
    };
    let text = |s: &SidecarSet| {
        create(s)
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
    };
    let errs = text(&init(json!("Always"), "RollingUpdate"));
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].starts_with(
            "spec.initContainers[1].upgradeStrategy.upgradeType: Forbidden: HotUpgrade is not supported for native sidecars"
        ) && errs[0].contains("use ColdUpgrade"),
        "{errs:?}"
    );
    // Under NotUpdate a native sidecar gets twins at injection and is never upgraded, as
    // upstream's; on a plain init container hot upgrade is refused as unsupported.
    assert_eq!(
        text(&init(json!("Always"), "NotUpdate")),
        Vec::<String>::new()
    );
    for s in [
        init(Value::Null, "RollingUpdate"),
        init(Value::Null, "NotUpdate"),
    ] {
        assert_eq!(
            text(&s),
            [
                "spec.initContainers[1].upgradeStrategy.upgradeType: Forbidden: HotUpgrade is not supported for init containers by kruise-rs; use ColdUpgrade"
            ]
        );
    }
    // ColdUpgrade, said or implied, is fine.
    let mut cold = init(json!("Always"), "RollingUpdate");
    cold.spec.init_containers[1].upgrade_strategy = None;
    assert_eq!(create(&cold), []);
}

/// The errors (as text) of a SidecarSet whose one container in `list` is `container`.
fn resources_policy_errors(list: &str, container: Value) -> Vec<String> {
    let mut c = json!({"name": "test-sidecar", "image": "test-image"});
    json_patch::merge(&mut c, &container);
    let s = set(
        "test-sidecarset",
        with(base_json(), json!({"containers": null, list: [c]})),
    );
    create(&s).iter().map(ToString::to_string).collect()
}

fn resources_policy(regex: Value, limits: Value, requests: Value) -> Value {
    json!({"resourcesPolicy": {"targetContainersMode": "sum", "targetContainersNameRegex": regex,
        "resourcesExpr": {"limits": limits, "requests": requests}}})
}

#[test]
fn valid_resources_policies() {
    // Upstream TestValidateResourcesPolicy, the valid cases.
    for (regex, limits, requests) in [
        (
            "^app.*$",
            json!({"cpu": "max(cpu*50%, 50m)", "memory": "max(memory*50%, 100Mi)"}),
            json!({"cpu": "max(cpu*50%, 50m)", "memory": "max(memory*50%, 100Mi)"}),
        ),
        ("^app.*$", json!({"cpu": "cpu*50%"}), json!(null)),
        (
            ".*",
            json!(null),
            json!({"cpu": "max(cpu*50%, 50m)", "memory": "100Mi"}),
        ),
        (
            "^app.*$",
            json!({"cpu": "0.5*cpu - 0.3*max(0, cpu-4) + 0.3*max(0, cpu-8)", "memory": "max(memory*50%, 100Mi)"}),
            json!(null),
        ),
        ("^.*", json!({"memory": "memory*50%"}), json!(null)),
        ("^.*", json!(null), json!({"cpu": "", "memory": "100Mi"})),
    ] {
        let policy = resources_policy(json!(regex), limits, requests);
        assert_eq!(
            resources_policy_errors("containers", policy.clone()),
            Vec::<String>::new(),
            "{policy}"
        );
        let mut native = policy;
        native["restartPolicy"] = json!("Always");
        assert_eq!(
            resources_policy_errors("initContainers", native),
            Vec::<String>::new()
        );
    }
    // No regex: the CRD's default `.*` applies.
    let mut policy = resources_policy(json!(null), json!({"cpu": "cpu"}), json!(null));
    policy["resourcesPolicy"]
        .as_object_mut()
        .unwrap()
        .remove("targetContainersNameRegex");
    assert_eq!(
        resources_policy_errors("containers", policy),
        Vec::<String>::new()
    );
}

#[test]
fn invalid_resources_policies_name_the_field() {
    let p = "spec.containers[0].resourcesPolicy";
    let cpu = json!({"cpu": "cpu*50%"});
    let cases = [
        (
            resources_policy(json!(""), cpu.clone(), json!(null)),
            format!("{p}.targetContainersNameRegex: Required value: invalid empty regex"),
        ),
        (
            resources_policy(json!("[invalid(regex"), cpu.clone(), json!(null)),
            format!(
                "{p}.targetContainersNameRegex: Invalid value: \"[invalid(regex\": invalid regex pattern:"
            ),
        ),
        (
            resources_policy(json!("^app.*$"), json!(null), json!(null)),
            format!(
                "{p}.resourcesExpr: Invalid value: {{}}: at least one of limits or requests must be configured"
            ),
        ),
        (
            resources_policy(
                json!("^app.*$"),
                json!({"cpu": "invalid expression @#$"}),
                json!(null),
            ),
            format!(
                "{p}.resourcesExpr.limits.cpu: Invalid value: \"invalid expression @#$\": invalid expression: "
            ),
        ),
        (
            resources_policy(
                json!("^app.*$"),
                json!({"cpu": "max(cpu*50%, 50m"}),
                json!(null),
            ),
            format!(
                "{p}.resourcesExpr.limits.cpu: Invalid value: \"max(cpu*50%, 50m\": invalid expression: syntax error"
            ),
        ),
        (
            resources_policy(
                json!("^app.*$"),
                json!({"cpu": "max(cpu*50%)"}),
                json!(null),
            ),
            format!(
                "{p}.resourcesExpr.limits.cpu: Invalid value: \"max(cpu*50%)\": invalid expression: max function requires exactly 2 arguments, got 1"
            ),
        ),
        (
            resources_policy(
                json!("^app.*$"),
                json!({"cpu": "invalidvar * 50%"}),
                json!(null),
            ),
            format!(
                "{p}.resourcesExpr.limits.cpu: Invalid value: \"invalidvar * 50%\": invalid expression: undefined variable: invalidvar"
            ),
        ),
        (
            resources_policy(
                json!("^.*"),
                json!(null),
                json!({"cpu": "invalid_cpu_expr"}),
            ),
            format!(
                "{p}.resourcesExpr.requests.cpu: Invalid value: \"invalid_cpu_expr\": invalid expression: undefined variable"
            ),
        ),
        (
            resources_policy(
                json!("^.*"),
                json!({"memory": "bad_memory_expr"}),
                json!(null),
            ),
            format!(
                "{p}.resourcesExpr.limits.memory: Invalid value: \"bad_memory_expr\": invalid expression: undefined variable"
            ),
        ),
        (
            resources_policy(json!("^.*"), json!(null), json!({"memory": "cpu*50%"})),
            format!(
                "{p}.resourcesExpr.requests.memory: Invalid value: \"cpu*50%\": invalid expression: undefined variable: cpu"
            ),
        ),
        (
            resources_policy(json!("^.*"), json!({"memory": "memory*10Mi"}), json!(null)),
            format!(
                "{p}.resourcesExpr.limits.memory: Invalid value: \"memory*10Mi\": invalid expression: multiplication of two quantities"
            ),
        ),
        (
            resources_policy(json!("^.*"), json!({"cpu": "cpu/0"}), json!(null)),
            format!(
                "{p}.resourcesExpr.limits.cpu: Invalid value: \"cpu/0\": invalid expression: division by zero"
            ),
        ),
    ];
    for (policy, expected) in cases {
        let errs = resources_policy_errors("containers", policy.clone());
        assert_eq!(errs.len(), 1, "{policy}: {errs:?}");
        assert!(
            errs[0].starts_with(&expected),
            "{policy}: {errs:?}\nwanted {expected}"
        );
    }
}

#[test]
fn resources_policy_with_explicit_resources_is_one_error() {
    for resources in [
        json!({"limits": {"cpu": "100m", "memory": "100Mi"}}),
        json!({"requests": {"cpu": "50m"}}),
    ] {
        let mut c = resources_policy(json!(""), json!(null), json!(null));
        c["resources"] = resources;
        let errs = resources_policy_errors("containers", c);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with("spec.containers[0].resourcesPolicy: Invalid value: ")
                && errs[0].ends_with("resourcesPolicy and resources cannot be configured together"),
            "{errs:?}"
        );
    }
}

#[test]
fn resources_policy_on_a_plain_init_container_is_refused() {
    let errs = resources_policy_errors(
        "initContainers",
        resources_policy(json!(".*"), json!({"cpu": "cpu"}), json!(null)),
    );
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].starts_with("spec.initContainers[0].resourcesPolicy: Invalid value: ")
            && errs[0].ends_with("only supported for init containers with restartPolicy Always"),
        "{errs:?}"
    );
}

#[test]
fn hot_upgrade_needs_an_empty_image_of_its_own() {
    let hot = |list: &str, strategy: Value, extra: Value| {
        let mut container = json!({"name": "test-sidecar", "image": "test-image",
            "upgradeStrategy": strategy});
        for (k, v) in extra.as_object().expect("object") {
            container[k] = v.clone();
        }
        set(
            "test-sidecarset",
            with(base_json(), json!({ list: [container] })),
        )
    };
    let errors = |s: &SidecarSet| {
        create(s)
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
    };
    let served = json!({"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "empty:1"});
    assert_eq!(
        errors(&hot("containers", served.clone(), json!({}))),
        Vec::<String>::new()
    );
    assert_eq!(
        errors(&hot(
            "containers",
            json!({"upgradeType": "HotUpgrade"}),
            json!({})
        )),
        [
            "spec.containers[0].upgradeStrategy.hotUpgradeEmptyImage: Required value: upgradeType HotUpgrade needs the image the idle twin runs"
        ]
    );
    assert_eq!(
        errors(&hot(
            "containers",
            json!({"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "Bad Image"}),
            json!({})
        )),
        [
            r#"spec.containers[0].upgradeStrategy.hotUpgradeEmptyImage: Invalid value: "Bad Image": repository path component "Bad Image" must be lowercase letters and digits separated by '.', '_', '__' or dashes"#
        ]
    );
    assert_eq!(
        errors(&hot(
            "containers",
            json!({"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "test-image"}),
            json!({})
        )),
        [
            r#"spec.containers[0].upgradeStrategy.hotUpgradeEmptyImage: Invalid value: "test-image": must differ from the sidecar's image: the idle twin is told apart by it"#
        ]
    );
    let long = hot(
        "containers",
        served.clone(),
        json!({"name": "n".repeat(62)}),
    );
    assert_eq!(
        errors(&long),
        [format!(
            r#"spec.containers[0].name: Invalid value: "{}": must be no more than 61 characters with upgradeType HotUpgrade: its twins add "-1" and "-2""#,
            "n".repeat(62)
        )]
    );
    // A native-sidecar init container gets twins too (with NotUpdate, the only update type
    // its hot upgrade allows), a plain init container does not (upstream ignores the field).
    let not_update = json!({"updateStrategy": {"type": "NotUpdate"}});
    let native = hot(
        "initContainers",
        json!({"upgradeType": "HotUpgrade"}),
        json!({"restartPolicy": "Always"}),
    );
    let native = set(
        "test-sidecarset",
        with(
            serde_json::to_value(&native.spec).expect("spec"),
            not_update,
        ),
    );
    assert!(
        errors(&native).iter().any(|e| e.starts_with(
            "spec.initContainers[0].upgradeStrategy.hotUpgradeEmptyImage: Required value"
        )),
        "{:?}",
        errors(&native)
    );
    let plain = hot(
        "initContainers",
        json!({"upgradeType": "HotUpgrade"}),
        json!({}),
    );
    assert!(
        !errors(&plain)
            .iter()
            .any(|e| e.contains("hotUpgradeEmptyImage")),
        "{:?}",
        errors(&plain)
    );
}

// --- metadata ---

#[test]
fn the_name_is_an_rfc1123_label() {
    for bad in ["Test", "a.b", "-a", &"a".repeat(64)] {
        let errs = create(&set(bad, base_json()));
        assert_eq!(paths(&errs), ["metadata.name"], "{bad}");
    }
    let mut s = set("x", base_json());
    s.metadata.name = None;
    assert_eq!(
        create(&s)
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["metadata.name: Required value: name or generateName is required"]
    );
}

#[test]
fn metadata_namespace_labels_and_annotations() {
    let mut s = set("x", base_json());
    s.metadata.namespace = Some("default".into());
    s.metadata.labels = Some(BTreeMap::from([("bad key".into(), "v".into())]));
    s.metadata.annotations = Some(BTreeMap::from([("a//b".into(), "v".into())]));
    assert_eq!(
        paths(&create(&s)),
        [
            "metadata.namespace",
            "metadata.labels",
            "metadata.annotations"
        ]
    );
}

// --- canary: upstream TestValidateSidecarSetCanaryAnnotations ---

#[test]
fn upstream_canary_scenarios() {
    let base = set(
        "base-sidecarset",
        with(
            base_json(),
            json!({"containers": [{"name": "other", "image": "x"}]}),
        ),
    );
    let canary_base = canary(
        "base1-sidecarset",
        "other-base-sidecarset",
        with(
            base_json(),
            json!({"containers": [{"name": "third", "image": "x"}]}),
        ),
    );
    let others = [base.clone(), canary_base];
    let check = |s: &SidecarSet| -> Vec<String> {
        create_with(s, &others, &SidecarSetContext::default())
            .iter()
            .map(ToString::to_string)
            .collect()
    };
    // non-canary
    assert_eq!(
        check(&set("test-sidecarset", base_json())),
        Vec::<String>::new()
    );
    // base is itself
    let s = canary("test-sidecarset", "test-sidecarset", base_json());
    let errs = check(&s);
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert_eq!(
        errs[0],
        r#"metadata.annotations[apps.kruise.io/sidecarset-base]: Invalid value: "test-sidecarset": base sidecarSet cannot be itself"#
    );
    // valid base
    assert_eq!(
        check(&canary("test-sidecarset", "base-sidecarset", base_json())),
        Vec::<String>::new()
    );
    // base is a canary
    assert_eq!(
        check(&canary("test-sidecarset", "base1-sidecarset", base_json())),
        [
            r#"metadata.annotations[apps.kruise.io/sidecarset-base]: Invalid value: "base1-sidecarset": base sidecarSet cannot be canary"#
        ]
    );
    // base does not exist
    assert_eq!(
        check(&canary(
            "test-sidecarset",
            "nonexistent-sidecarset",
            base_json()
        )),
        [
            r#"metadata.annotations[apps.kruise.io/sidecarset-base]: Not found: "nonexistent-sidecarset": the base SidecarSet does not exist"#
        ]
    );
    // RollingUpdate
    let s = canary(
        "test-sidecarset",
        "base-sidecarset",
        with(
            base_json(),
            json!({"updateStrategy": {"type": "RollingUpdate"}}),
        ),
    );
    assert_eq!(
        check(&s),
        [
            r#"spec.updateStrategy.type: Invalid value: "RollingUpdate": RollingUpdate is not supported for canary sidecarSet: use NotUpdate"#
        ]
    );
}

#[test]
fn upstream_canary_update_scenarios() {
    let others = [
        set(
            "base-sidecarset",
            with(
                base_json(),
                json!({"containers": [{"name": "other", "image": "x"}]}),
            ),
        ),
        set(
            "new-base-sidecarset",
            with(
                base_json(),
                json!({"containers": [{"name": "other2", "image": "x"}]}),
            ),
        ),
    ];
    let old = canary("test-sidecarset", "base-sidecarset", base_json());
    // Unchanged base, changed spec: fine.
    let new = canary(
        "test-sidecarset",
        "base-sidecarset",
        with(
            base_json(),
            json!({"containers": [{"name": "test-sidecar", "image": "test-image:2"}]}),
        ),
    );
    assert_eq!(update(&old, &new, &others), []);
    // Changed base.
    let new = canary("test-sidecarset", "new-base-sidecarset", base_json());
    let errs = update(&old, &new, &others);
    assert_eq!(
        errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            r#"metadata.annotations[apps.kruise.io/sidecarset-base]: Invalid value: "new-base-sidecarset": field is immutable (was "base-sidecarset")"#
        ]
    );
    // Turning an existing SidecarSet into a canary is refused, as upstream.
    let plain = set("test-sidecarset", base_json());
    assert_eq!(
        paths(&update(&plain, &old, &others)),
        ["metadata.annotations[apps.kruise.io/sidecarset-base]"]
    );
}

#[test]
fn canary_true_without_a_base_is_not_a_canary() {
    let s = annotate(
        set("test-sidecarset", base_json()),
        &[(SIDECARSET_CANARY, "true")],
    );
    assert_eq!(canary_base(&s), None);
    assert_eq!(create(&s), []);
    let s = annotate(
        set("t", base_json()),
        &[(SIDECARSET_CANARY, "false"), (SIDECARSET_BASE, "b")],
    );
    assert_eq!(canary_base(&s), None);
}

// --- selectors ---

#[test]
fn selectors_must_not_be_empty() {
    let mut s = set(
        "x",
        with(
            base_json(),
            json!({"namespaceSelector": {"matchLabels": {}}}),
        ),
    );
    s.spec.selector = Some(LabelSelector::default());
    let errs = create(&s);
    assert_eq!(
        errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            "spec.selector: Invalid value: {}: empty selector is not valid for sidecarset.",
            r#"spec.namespaceSelector: Invalid value: {"matchLabels":{}}: empty selector is not valid for sidecarset."#,
        ]
    );
}

#[test]
fn v1alpha1_namespace_is_a_namespace_name() {
    assert_eq!(
        create(&set(
            "x",
            with(base_json(), json!({"namespace": "payments"}))
        )),
        []
    );
    let errs = create(&set(
        "x",
        with(base_json(), json!({"namespace": "Payments"})),
    ));
    assert_eq!(paths(&errs), ["spec.namespace"]);
}

// --- update strategy ---

fn rolling(strategy: Value) -> SidecarSet {
    let mut s = with(json!({"type": "RollingUpdate"}), strategy);
    if let Some(obj) = s.as_object_mut() {
        obj.retain(|_, v| !v.is_null());
    }
    set("x", with(base_json(), json!({"updateStrategy": s})))
}

#[test]
fn partition_and_selector_cannot_be_used_together() {
    let selector = json!({"matchLabels": {"canary": "true"}});
    let errs = create(&rolling(json!({"partition": 2, "selector": selector})));
    assert_eq!(
        errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["spec.updateStrategy: Forbidden: Partition and Selector cannot be used together"]
    );
    // A string partition counts as set even at "0%" (upstream's intStrIsSet).
    assert_eq!(
        create(&rolling(json!({"partition": "0%", "selector": selector}))).len(),
        1
    );
    assert_eq!(
        create(&rolling(json!({"partition": 0, "selector": selector}))),
        []
    );
    // The update selector must be valid and non-empty.
    assert_eq!(
        paths(&create(&rolling(json!({"selector": {}})))),
        ["spec.updateStrategy.selector"]
    );
}

#[test]
fn partition_and_max_unavailable_are_non_negative_ints_or_percents() {
    let errs = create(&rolling(json!({"partition": -1, "maxUnavailable": "abc"})));
    assert_eq!(
        paths(&errs),
        [
            "spec.updateStrategy.partition",
            "spec.updateStrategy.maxUnavailable"
        ]
    );
    assert_eq!(
        create(&rolling(json!({"partition": "50%", "maxUnavailable": 0}))),
        []
    );
    // Not checked under NotUpdate, as upstream.
    let s = set(
        "x",
        with(
            base_json(),
            json!({"updateStrategy": {"type": "NotUpdate", "partition": -1}}),
        ),
    );
    assert_eq!(create(&s), []);
}

#[test]
fn priority_strategy() {
    let errs = create(&rolling(json!({"priorityStrategy": {
        "weightPriority": [
            {"weight": 101, "matchSelector": {"matchLabels": {"a": "b"}}},
            {"weight": 50, "matchSelector": {}},
            {"weight": 50, "matchSelector": {"matchLabels": {"a": "-bad"}}}
        ],
        "orderPriority": [{"orderedKey": ""}]
    }})));
    let p = |s: &str| format!("spec.updateStrategy.priorityStrategy{s}");
    assert_eq!(
        paths(&errs),
        [
            p(""),
            p(".weightPriority[0].weight"),
            p(".weightPriority[1].matchSelector"),
            p(".weightPriority[2].matchSelector.matchLabels"),
            p(".orderPriority[0].orderedKey"),
        ]
    );
    assert_eq!(
        errs[0].message,
        "only one of weightPriority and orderPriority can be used"
    );
    let ok = rolling(json!({"priorityStrategy": {"orderPriority": [{"orderedKey": "rank"}]}}));
    assert_eq!(create(&ok), []);
}

#[test]
fn scatter_strategy_keys() {
    let errs = create(&rolling(json!({"scatterStrategy": [
        {"key": "", "value": "x"}, {"key": "zone", "value": "*"}, {"key": "zone", "value": "a"}
    ]})));
    assert_eq!(
        errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["spec.updateStrategy.scatterStrategy[0].key: Required value: key should not be empty"]
    );
}

// --- containers ---

#[test]
fn sidecar_images_must_parse() {
    let s = set(
        "x",
        with(
            base_json(),
            json!({"containers": [{"name": "a", "image": "Example/App:1"}]}),
        ),
    );
    let errs = create(&s);
    assert_eq!(paths(&errs), ["spec.containers[0].image"]);
    assert!(errs[0].message.contains("lowercase"), "{}", errs[0]);
    let s = set(
        "x",
        with(
            base_json(),
            json!({"containers": [{"name": "a", "image": "127.0.0.1:5000/app@sha256:0000000000000000000000000000000000000000000000000000000000000000"}]}),
        ),
    );
    assert_eq!(create(&s), []);
}

#[test]
fn transfer_env_field_refs() {
    let te = |field_ref: Value| {
        set(
            "x",
            with(
                base_json(),
                json!({"containers": [{"name": "a", "image": "x",
                "transferEnv": [{"sourceContainerNameFrom": {"fieldRef": field_ref}, "envName": "E"}]}]}),
            ),
        )
    };
    let p = "spec.containers[0].transferEnv[0].sourceContainerNameFrom.fieldRef";
    // Defaulting sets apiVersion v1.
    assert_eq!(
        create(&te(json!({"fieldPath": "metadata.labels['app']"}))),
        []
    );
    assert_eq!(
        create(&te(
            json!({"fieldPath": "metadata.annotations['Example.com/Main']"})
        )),
        []
    );
    let errs = create(&te(json!({"fieldPath": "metadata.name"})));
    assert_eq!(
        errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [format!(
            r#"{p}.fieldPath: Unsupported value: "metadata.name": supported values: "metadata.labels['<key>']", "metadata.annotations['<key>']""#
        )]
    );
    assert_eq!(
        paths(&create(&te(
            json!({"fieldPath": "metadata.labels['bad key']"})
        ))),
        [format!("{p}.fieldPath")]
    );
    assert_eq!(
        paths(&create(&te(json!({"fieldPath": ""})))),
        [format!("{p}.fieldPath")]
    );
    assert_eq!(
        paths(&create(&te(
            json!({"apiVersion": "v2", "fieldPath": "metadata.labels['a']"})
        ))),
        [format!("{p}.apiVersion")]
    );
    // Without defaulting, a missing apiVersion is reported.
    let s = raw_set(
        "x",
        with(
            base_json(),
            json!({"containers": [{"name": "a", "image": "x",
            "transferEnv": [{"sourceContainerNameFrom": {"fieldRef": {"fieldPath": "metadata.labels['a']"}}}]}]}),
        ),
    );
    assert_eq!(paths(&create(&s)), [format!("{p}.apiVersion")]);
}

#[test]
fn names_kruise_rs_relies_on_are_refused_and_other_pod_rules_are_left_to_kubernetes() {
    let s = set(
        "x",
        with(
            base_json(),
            json!({
                "initContainers": [{"name": "dup", "image": "x"}],
                "containers": [{"name": "dup", "image": "x", "volumeMounts": [{"name": "nope", "mountPath": "/x"}]}]
            }),
        ),
    );
    assert_eq!(paths(&create(&s)), ["spec.initContainers[0].name"]);
    assert_eq!(
        paths(&pod_rules(&s)),
        [
            "spec.containers[0].volumeMounts[0].name",
            "spec.initContainers[0].name"
        ]
    );
    // What newer Kubernetes allows (ContainerRestartRules, 1.35) is not refused here: the
    // apiserver's dry run judges it. The 1.33 copy would refuse it.
    let s = raw_set(
        "x",
        with(
            base_json(),
            json!({"containers": [{"name": "c", "image": "x", "restartPolicy": "Never",
                "restartPolicyRules": [{"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]}]}),
        ),
    );
    assert_eq!(create(&s), []);
    assert_eq!(paths(&pod_rules(&s)), ["spec.containers[0].restartPolicy"]);
    // Names, images and volume names stay refused.
    let s = raw_set(
        "x",
        with(
            base_json(),
            json!({"containers": [{"name": "Bad_Name", "image": " x"}, {"name": "", "image": ""}],
                   "volumes": [{"name": "v", "emptyDir": {}}, {"name": "v", "emptyDir": {}}, {"name": "", "emptyDir": {}}]}),
        ),
    );
    assert_eq!(
        paths(&create(&s)),
        [
            "spec.containers[0].name",
            "spec.containers[0].image",
            "spec.containers[1].name",
            "spec.containers[1].image",
            "spec.volumes[1].name",
            "spec.volumes[2].name"
        ]
    );
}

#[test]
fn raw_enum_values_are_reported_in_kubernetes_form() {
    let raw = json!({"spec": {
        "containers": [
            {"name": "a", "podInjectPolicy": "BeforeAppContainer"},
            {"name": "b", "podInjectPolicy": "X", "upgradeStrategy": {"upgradeType": "Warm"}}
        ],
        "updateStrategy": {"type": "Sometimes"},
        "injectionStrategy": {"revision": {"policy": "Never"}},
        "patchPodMetadata": [{"patchPolicy": "Replace"}]
    }});
    let errs = errors(validate_raw_enums(&raw));
    assert_eq!(
        errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            r#"spec.containers[1].podInjectPolicy: Unsupported value: "X": supported values: "BeforeAppContainer", "AfterAppContainer""#,
            r#"spec.containers[1].upgradeStrategy.upgradeType: Unsupported value: "Warm": supported values: "ColdUpgrade", "HotUpgrade""#,
            r#"spec.updateStrategy.type: Unsupported value: "Sometimes": supported values: "RollingUpdate", "NotUpdate""#,
            r#"spec.injectionStrategy.revision.policy: Unsupported value: "Never": supported values: "Always", "Partial""#,
            r#"spec.patchPodMetadata[0].patchPolicy: Unsupported value: "Replace": supported values: "Retain", "Overwrite", "MergePatchJson""#,
        ]
    );
    assert_eq!(validate_raw_enums(&json!({"spec": base_json()})), Ok(()));
}

// --- patchPodMetadata ---

fn patched(labels: &[(&str, &str)], patches: Value) -> SidecarSet {
    let mut s = set("x", with(base_json(), json!({"patchPodMetadata": patches})));
    s.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect(),
    );
    s
}

#[test]
fn patch_pod_metadata_needs_a_whitelist_by_default() {
    let s = patched(&[], json!([{"annotations": {"oom-score": "1"}}]));
    let errs = create(&s);
    assert_eq!(paths(&errs), ["spec.patchPodMetadata"]);
    assert_eq!(errs[0].kind, ErrorKind::Forbidden);
    assert!(errs[0].message.contains(WHITELIST_CONFIGMAP_KEY));
    let allow_all = PatchPodMetadataPolicy::AllowAll;
    let ctx = SidecarSetContext {
        patch_pod_metadata: &allow_all,
        ..Default::default()
    };
    assert_eq!(create_with(&s, &[], &ctx), []);
}

#[test]
fn the_whitelist_applies_rules_by_sidecarset_labels() {
    let policy = PatchPodMetadataPolicy::Whitelist(vec![
        WhitelistRule {
            selector: None,
            allowed_annotation_keys: vec![AnnotationKeyPattern::exact("oom-score")],
        },
        WhitelistRule {
            selector: Some(
                serde_json::from_value(json!({"matchLabels": {"sidecar": "demo"}}))
                    .expect("selector"),
            ),
            allowed_annotation_keys: vec![AnnotationKeyPattern::new("key.*", |k: &str| {
                k.contains("key")
            })],
        },
    ]);
    let ctx = SidecarSetContext {
        patch_pod_metadata: &policy,
        ..Default::default()
    };
    let patches = json!([{"annotations": {"oom-score": "1", "my-key": "v"}}]);
    assert_eq!(
        create_with(&patched(&[("sidecar", "demo")], patches.clone()), &[], &ctx),
        []
    );
    let errs = create_with(&patched(&[], patches), &[], &ctx);
    assert_eq!(
        errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [format!(
            "spec.patchPodMetadata[0].annotations[my-key]: Forbidden: sidecarSet patch metadata annotation(my-key) is not allowed by {WHITELIST_CONFIGMAP_KEY}"
        )]
    );
    // No rule applies at all.
    let only_selected = PatchPodMetadataPolicy::Whitelist(vec![WhitelistRule {
        selector: Some(
            serde_json::from_value(json!({"matchLabels": {"sidecar": "demo"}})).expect("selector"),
        ),
        allowed_annotation_keys: vec![AnnotationKeyPattern::exact("oom-score")],
    }]);
    let ctx = SidecarSetContext {
        patch_pod_metadata: &only_selected,
        ..Default::default()
    };
    let errs = create_with(
        &patched(&[], json!([{"annotations": {"oom-score": "1"}}])),
        &[],
        &ctx,
    );
    assert!(errs[0].message.contains("no rule"), "{}", errs[0]);
    // An empty whitelist refuses, as upstream.
    let empty = PatchPodMetadataPolicy::Whitelist(vec![]);
    let ctx = SidecarSetContext {
        patch_pod_metadata: &empty,
        ..Default::default()
    };
    assert_eq!(
        create_with(
            &patched(&[], json!([{"annotations": {"a": "1"}}])),
            &[],
            &ctx
        )
        .len(),
        1
    );
}

#[test]
fn defaults_allowed_covers_what_no_whitelist_rule_does() {
    let demo_only = || {
        vec![WhitelistRule {
            selector: Some(
                serde_json::from_value(json!({"matchLabels": {"sidecar": "demo"}}))
                    .expect("selector"),
            ),
            allowed_annotation_keys: vec![AnnotationKeyPattern::exact("oom-score")],
        }]
    };
    let check = |policy: &PatchPodMetadataPolicy, labels: &[(&str, &str)], key: &str| {
        let ctx = SidecarSetContext {
            patch_pod_metadata: policy,
            ..Default::default()
        };
        create_with(
            &patched(labels, json!([{"annotations": {key: "1"}}])),
            &[],
            &ctx,
        )
    };
    // Off: every policy as it was.
    assert!(matches!(
        PatchPodMetadataPolicy::NotConfigured.with_defaults_allowed(false),
        PatchPodMetadataPolicy::NotConfigured
    ));
    let off = PatchPodMetadataPolicy::Whitelist(demo_only()).with_defaults_allowed(false);
    assert_eq!(check(&off, &[], "oom-score").len(), 1);
    // On without a whitelist (no ConfigMap, or no key in it): anything goes.
    let on = PatchPodMetadataPolicy::NotConfigured.with_defaults_allowed(true);
    assert!(matches!(on, PatchPodMetadataPolicy::AllowAll));
    assert_eq!(check(&on, &[], "any-key"), []);
    // On beside a whitelist: a SidecarSet no rule applies to may patch anything...
    let on = PatchPodMetadataPolicy::Whitelist(demo_only()).with_defaults_allowed(true);
    assert_eq!(check(&on, &[], "any-key"), []);
    // ... one a rule applies to only what the rule allows, as upstream.
    assert_eq!(check(&on, &[("sidecar", "demo")], "oom-score"), []);
    let errs = check(&on, &[("sidecar", "demo")], "any-key");
    assert_eq!(
        paths(&errs),
        ["spec.patchPodMetadata[0].annotations[any-key]"]
    );
    // An empty whitelist is one no rule of applies.
    let on = PatchPodMetadataPolicy::Whitelist(vec![]).with_defaults_allowed(true);
    assert_eq!(check(&on, &[], "any-key"), []);
    // Turning it on twice changes nothing.
    let twice = on.with_defaults_allowed(true);
    assert!(matches!(twice, PatchPodMetadataPolicy::WhitelistElseAllowAll(ref r) if r.is_empty()));
    // The refusal without either names both ways out.
    let errs = check(&PatchPodMetadataPolicy::NotConfigured, &[], "any-key");
    assert!(
        errs[0].message.contains(DEFAULTS_ALLOWED_FLAG),
        "{}",
        errs[0]
    );
}

#[test]
fn the_whitelist_reads_upstreams_configmap_json() {
    let json = r#"{"rules": [
            {"allowedAnnotationKeyExprs": ["^oom-score$"]},
            {"selector": {"matchLabels": {"sidecar": "sidecar-demo"}}, "allowedAnnotationKeyExprs": ["key.*"]}
        ]}"#;
    // A stand-in compiler: `^x$` exact, `x.*` prefix.
    type Matcher = Box<dyn Fn(&str) -> bool + Send + Sync>;
    let compile = |e: &str| -> Result<Matcher, String> {
        if let Some(exact) = e.strip_prefix('^').and_then(|e| e.strip_suffix('$')) {
            let exact = exact.to_owned();
            Ok(Box::new(move |k: &str| k == exact))
        } else if let Some(prefix) = e.strip_suffix(".*") {
            let prefix = prefix.to_owned();
            Ok(Box::new(move |k: &str| k.contains(&prefix)))
        } else {
            Err("unsupported".into())
        }
    };
    let policy = PatchPodMetadataPolicy::from_whitelist_json(json, compile).expect("parses");
    let PatchPodMetadataPolicy::Whitelist(rules) = &policy else {
        panic!("whitelist expected");
    };
    assert_eq!(rules.len(), 2);
    assert_eq!(
        rules[0].allowed_annotation_keys[0].expression(),
        "^oom-score$"
    );
    assert!(rules[1].allowed_annotation_keys[0].matches("a-key-1"));
    let bad = PatchPodMetadataPolicy::from_whitelist_json(
        r#"{"rules": [{"allowedAnnotationKeyExprs": ["("]}]}"#,
        compile,
    );
    assert!(matches!(
        bad,
        Err(WhitelistError::Expression { rule: 0, .. })
    ));
    assert!(matches!(
        PatchPodMetadataPolicy::from_whitelist_json("not json", compile),
        Err(WhitelistError::Json(_))
    ));
}

#[test]
fn patch_entries_need_valid_annotations() {
    let ctx = SidecarSetContext {
        patch_pod_metadata: &PatchPodMetadataPolicy::AllowAll,
        ..Default::default()
    };
    let s = patched(
        &[],
        json!([
            {"annotations": {}},
            {"annotations": {"bad key": "v"}},
            {"annotations": {"merge": "{\"a\": 1}"}, "patchPolicy": "MergePatchJson"}
        ]),
    );
    let errs = create_with(&s, &[], &ctx);
    assert_eq!(
        paths(&errs),
        [
            "spec.patchPodMetadata[0].annotations",
            "spec.patchPodMetadata[1].annotations"
        ]
    );
    assert_eq!(errs[0].kind, ErrorKind::Required);
}

// --- update rules: upstream TestSidecarSetUpdateConflict and more ---

#[test]
fn upgrade_type_is_immutable() {
    let old = raw_set(
        "x",
        with(
            base_json(),
            json!({"containers": [{"name": "test", "image": "x", "upgradeStrategy": {"upgradeType": "ColdUpgrade"}}]}),
        ),
    );
    let new = raw_set(
        "x",
        with(
            base_json(),
            json!({"containers": [{"name": "test", "image": "x", "upgradeStrategy": {"upgradeType": "HotUpgrade"}}]}),
        ),
    );
    let errs = update(&old, &new, &[]);
    assert_eq!(
        errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            "spec.containers[0].upgradeStrategy.hotUpgradeEmptyImage: Required value: upgradeType HotUpgrade needs the image the idle twin runs",
            r#"spec.containers[0].upgradeStrategy.upgradeType: Invalid value: "HotUpgrade": container test upgradeType is immutable"#,
        ]
    );
    // Unset before (upstream: "") and defaulted now: not a change.
    let old = raw_set("x", base_json());
    let new = set(
        "x",
        with(
            base_json(),
            json!({"containers": [{"name": "test-sidecar", "image": "test-image:2"}]}),
        ),
    );
    assert_eq!(update(&old, &new, &[]), []);
}

#[test]
fn containers_cannot_be_added_or_renamed_but_may_be_removed() {
    let old = set(
        "x",
        with(
            base_json(),
            json!({"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "x"}]}),
        ),
    );
    let removed = set(
        "x",
        with(
            base_json(),
            json!({"containers": [{"name": "a", "image": "x"}]}),
        ),
    );
    assert_eq!(update(&old, &removed, &[]), []);
    let added = set(
        "x",
        with(
            base_json(),
            json!({"containers": [{"name": "a", "image": "x"}, {"name": "c", "image": "x"}]}),
        ),
    );
    let errs = update(&old, &added, &[]);
    assert_eq!(paths(&errs), ["spec.containers[1].name"]);
    assert_eq!(errs[0].kind, ErrorKind::Forbidden);
    // Init containers may be added (upstream does not check them).
    let init = set(
        "x",
        with(
            base_json(),
            json!({"containers": [{"name": "a", "image": "x"}], "initContainers": [{"name": "i", "image": "x"}]}),
        ),
    );
    assert_eq!(update(&old, &init, &[]), []);
}

#[test]
fn a_metadata_only_update_is_not_revalidated_against_the_cluster() {
    let conflicting = set("other", base_json());
    // Admitted earlier (say, created in a race with `other`), pinned to a pruned revision.
    let old = set(
        "x",
        with(
            base_json(),
            json!({"injectionStrategy": {"revision": {"revisionName": "gone"}}}),
        ),
    );
    let mut new = old.clone();
    new.metadata.annotations = Some(BTreeMap::from([("note".into(), "hello".into())]));
    assert_eq!(update(&old, &new, std::slice::from_ref(&conflicting)), []);
    // Its metadata is still checked.
    new.metadata.annotations = Some(BTreeMap::from([("a//b".into(), String::new())]));
    assert_eq!(paths(&update(&old, &new, &[])), ["metadata.annotations"]);
    // A spec change re-checks everything.
    let mut changed = old.clone();
    changed.spec.containers[0].container.image = Some("test-image:2".into());
    assert_eq!(
        paths(&update(&old, &changed, std::slice::from_ref(&conflicting))),
        [
            "spec.injectionStrategy.revision.revisionName",
            "spec.containers[0].name"
        ]
    );
}

// --- conflicts: upstream TestSidecarSetNameConflict, …PodMetadataConflict, …VolumeConflict ---

fn conflict_set(name: &str, v: Value) -> SidecarSet {
    set(
        name,
        with(
            json!({"selector": {"matchLabels": {"a": "b"}}, "updateStrategy": {"type": "NotUpdate"}}),
            v,
        ),
    )
}

fn conflicts(new: &SidecarSet, others: &[SidecarSet]) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let others: Vec<&SidecarSet> = others.iter().collect();
    validate_conflicts(new, &others, &mut errs);
    errs
}

#[test]
fn upstream_name_conflicts() {
    let names = json!({
        "containers": [{"name": "container-name", "image": "x"}],
        "initContainers": [{"name": "init-name", "image": "x"}],
        "volumes": [{"name": "volume-name"}]
    });
    let errs = conflicts(
        &conflict_set("sidecarset2", names.clone()),
        &[conflict_set("sidecarset1", names)],
    );
    assert_eq!(
        errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            r#"spec.initContainers[0].name: Invalid value: "init-name": container init-name already exist in sidecarset1"#,
            r#"spec.containers[0].name: Invalid value: "container-name": container container-name already exist in sidecarset1"#,
        ]
    );
    let ns = |app: &str| json!({"namespaceSelector": {"matchLabels": {"app": app}}, "containers": [{"name": "container-name", "image": "x"}]});
    assert_eq!(
        conflicts(
            &conflict_set("sidecarset2", ns("nginx")),
            &[conflict_set("sidecarset1", ns("nginx"))]
        )
        .len(),
        1
    );
    assert_eq!(
        conflicts(
            &conflict_set("sidecarset2", ns("nginx")),
            &[conflict_set("sidecarset1", ns("redis"))]
        )
        .len(),
        0
    );
    // v1alpha1's namespace counts as a namespace selector.
    let alpha =
        |n: &str| json!({"namespace": n, "containers": [{"name": "container-name", "image": "x"}]});
    assert_eq!(
        conflicts(
            &conflict_set("s2", alpha("a")),
            &[conflict_set("s1", alpha("b"))]
        )
        .len(),
        0
    );
    assert_eq!(
        conflicts(
            &conflict_set("s2", alpha("a")),
            &[conflict_set("s1", alpha("a"))]
        )
        .len(),
        1
    );
}

#[test]
fn upstream_pod_metadata_conflicts() {
    let patch = |policy: &str, k: &str, v: &str| json!({"containers": [], "patchPodMetadata": [{"patchPolicy": policy, "annotations": {k: v}}]});
    let errs = conflicts(
        &conflict_set("sidecarset2", patch("Overwrite", "key1", "value1")),
        &[conflict_set(
            "sidecarset1",
            patch("MergePatchJson", "key1", "value1"),
        )],
    );
    assert_eq!(
        errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            r#"spec.patchPodMetadata[0].annotations[key1]: Invalid value: "key1": annotation key1 is in conflict with sidecarset sidecarset1"#
        ]
    );
    assert_eq!(
        conflicts(
            &conflict_set("sidecarset2", patch("Retain", "key1", "value1")),
            &[conflict_set(
                "sidecarset1",
                patch("Overwrite", "key2", "value2")
            )],
        ),
        []
    );
    assert_eq!(
        conflicts(
            &conflict_set(
                "sidecarset2",
                patch("MergePatchJson", "oom-score", r#"{"log-agent": 1}"#)
            ),
            &[conflict_set(
                "sidecarset1",
                patch("MergePatchJson", "oom-score", r#"{"envoy": 1}"#)
            )],
        ),
        []
    );
    // Retain on either side never conflicts; Overwrite against MergePatchJson does.
    assert_eq!(
        conflicts(
            &conflict_set("s2", patch("Retain", "k", "v")),
            &[conflict_set("s1", patch("Overwrite", "k", "v"))],
        ),
        []
    );
    assert_eq!(
        conflicts(
            &conflict_set("s2", patch("MergePatchJson", "k", "{}")),
            &[conflict_set("s1", patch("Overwrite", "k", "v"))],
        )
        .len(),
        1
    );
}

#[test]
fn upstream_volume_conflicts() {
    let vols = |v: Value| json!({"containers": [], "volumes": v});
    assert_eq!(
        conflicts(
            &conflict_set(
                "s2",
                vols(json!([{"name": "volume-1"}, {"name": "volume-2"}]))
            ),
            &[conflict_set(
                "s1",
                vols(json!([{"name": "volume-3"}, {"name": "volume-4"}]))
            )],
        ),
        []
    );
    assert_eq!(
        conflicts(
            &conflict_set(
                "s2",
                vols(
                    json!([{"name": "volume-1"}, {"name": "volume-2", "hostPath": {"path": "/home/work"}}])
                )
            ),
            &[conflict_set(
                "s1",
                vols(
                    json!([{"name": "volume-2", "hostPath": {"path": "/home/work"}}, {"name": "volume-3"}])
                )
            )],
        ),
        []
    );
    let errs = conflicts(
        &conflict_set(
            "s2",
            vols(
                json!([{"name": "volume-1"}, {"name": "volume-2", "hostPath": {"path": "/home/work-1"}}]),
            ),
        ),
        &[conflict_set(
            "s1",
            vols(
                json!([{"name": "volume-2", "hostPath": {"path": "/home/work-2"}}, {"name": "volume-3"}]),
            ),
        )],
    );
    assert_eq!(
        errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            r#"spec.volumes[1].name: Invalid value: "volume-2": volume volume-2 is in conflict with sidecarset s1"#
        ]
    );
}

#[test]
fn a_name_shared_between_a_container_and_an_init_container_conflicts() {
    let errs = conflicts(
        &conflict_set(
            "s2",
            json!({"initContainers": [{"name": "proxy", "image": "x"}]}),
        ),
        &[conflict_set(
            "s1",
            json!({"containers": [{"name": "proxy", "image": "x"}]}),
        )],
    );
    assert_eq!(paths(&errs), ["spec.initContainers[0].name"]);
}

#[test]
fn disjoint_selectors_do_not_conflict_and_self_is_skipped() {
    let c = json!({"containers": [{"name": "proxy", "image": "x"}]});
    let other = set(
        "s1",
        with(
            with(base_json(), c.clone()),
            json!({"selector": {"matchLabels": {"a": "c"}}}),
        ),
    );
    let mine = set("s2", with(base_json(), c.clone()));
    assert_eq!(conflicts(&mine, &[other]), []);
    assert_eq!(conflicts(&mine, std::slice::from_ref(&mine)), []);
    // A stored SidecarSet without a selector selects no pod.
    let mut no_selector = set("s3", with(base_json(), c));
    no_selector.spec.selector = None;
    assert_eq!(conflicts(&mine, &[no_selector]), []);
}

#[test]
fn a_canary_and_its_base_do_not_conflict_either_way() {
    let c = json!({"containers": [{"name": "proxy", "image": "proxy:1"}]});
    let base = set("base", with(base_json(), c.clone()));
    let canary = canary(
        "base-canary",
        "base",
        with(
            with(base_json(), c),
            json!({"selector": {"matchLabels": {"a": "b", "canary": "true"}}}),
        ),
    );
    assert_eq!(
        create_with(
            &canary,
            std::slice::from_ref(&base),
            &SidecarSetContext::default()
        ),
        []
    );
    // Upstream refuses any change to the base while its canary exists; we do not.
    let mut new_base = base.clone();
    new_base.spec.containers[0].container.image = Some("proxy:2".into());
    assert_eq!(update(&base, &new_base, std::slice::from_ref(&canary)), []);
    // Another SidecarSet still conflicts with both.
    let third = set(
        "third",
        with(
            base_json(),
            json!({"containers": [{"name": "proxy", "image": "x"}]}),
        ),
    );
    assert_eq!(
        create_with(&third, &[base, canary], &SidecarSetContext::default()).len(),
        1
    );
}

#[test]
fn every_error_is_reported_at_once() {
    let s = set(
        "Bad",
        json!({"containers": [{"name": "a", "image": ""}], "updateStrategy": {"partition": -1}}),
    );
    let e = validate_create(&s, &[], &SidecarSetContext::default()).expect_err("invalid");
    assert_eq!(
        paths(&e.0),
        [
            "metadata.name",
            "spec.selector",
            "spec.updateStrategy.partition",
            "spec.containers[0].image"
        ]
    );
    assert!(
        e.to_string()
            .starts_with("[metadata.name: Invalid value: \"Bad\""),
        "{e}"
    );
}

/// Issue 42: the webhook reviews each pull Secret (in each namespace the SidecarSet pins)
/// within its timeout, so `imagePullSecrets` is bounded; a SidecarSet stored before the bound
/// can still be edited without touching them.
#[test]
fn at_most_sixteen_image_pull_secrets() {
    let secrets = |n: usize| json!({"imagePullSecrets": (0..n).map(|i| json!({"name": format!("s{i}")})).collect::<Vec<_>>()});
    assert!(create(&set("ok", with(base_json(), secrets(16)))).is_empty());
    let too_many = set("many", with(base_json(), secrets(17)));
    let errs = create(&too_many);
    assert_eq!(
        errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["spec.imagePullSecrets: Too many: 17: must have at most 16 items"]
    );
    let mut edited = too_many.clone();
    edited.spec.revision_history_limit = Some(3);
    assert!(update(&too_many, &edited, &[]).is_empty());
    // Changed, and still past the bound: refused.
    let mut more = too_many.clone();
    more.spec.image_pull_secrets.pop();
    more.spec
        .image_pull_secrets
        .push(serde_json::from_value(json!({"name": "other"})).expect("a reference"));
    assert_eq!(
        paths(&update(&too_many, &more, &[])),
        ["spec.imagePullSecrets"]
    );
}
