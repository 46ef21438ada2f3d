use super::*;
use crate::annotations::parse_hashes;
use kruise_rs_api::sidecarset::{SidecarSet, SidecarSetPatchPolicy};
use kruise_rs_api::well_known::{
    SIDECARSET_HASH, SIDECARSET_HASH_WITHOUT_IMAGE, SIDECARSET_INJECTED_LIST,
};
use serde_json::{Value, json};

fn now() -> Time {
    Time("2024-03-04T05:06:07Z".parse().expect("time"))
}

/// A selected SidecarSet (latest version) from a SidecarSet's JSON.
fn selected(v: Value) -> SelectedSidecarSet {
    let set: SidecarSet = serde_json::from_value(v).expect("sidecarset");
    SelectedSidecarSet::latest(&set)
}

fn pod(v: Value) -> Pod {
    serde_json::from_value(v).expect("pod")
}

fn run(p: &Pod, sets: &[SelectedSidecarSet]) -> Injection {
    inject(p, sets, now()).expect("injection succeeds")
}

fn spec(p: &Pod) -> &PodSpec {
    p.spec.as_ref().expect("spec")
}

fn names(containers: &[Container]) -> Vec<&str> {
    containers.iter().map(|c| c.name.as_str()).collect()
}

fn init_names(p: &Pod) -> Vec<&str> {
    names(spec(p).init_containers.as_deref().unwrap_or_default())
}

fn container_names(p: &Pod) -> Vec<&str> {
    names(&spec(p).containers)
}

fn env_names(c: &Container) -> Vec<&str> {
    c.env.iter().flatten().map(|e| e.name.as_str()).collect()
}

fn env_value<'a>(c: &'a Container, name: &str) -> Option<&'a str> {
    c.env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .and_then(|e| e.value.as_deref())
}

fn mount_paths(c: &Container) -> Vec<&str> {
    c.volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.as_str())
        .collect()
}

fn volume_names(p: &Pod) -> Vec<&str> {
    spec(p)
        .volumes
        .iter()
        .flatten()
        .map(|v| v.name.as_str())
        .collect()
}

fn annotation<'a>(p: &'a Pod, key: &str) -> Option<&'a str> {
    p.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

fn container<'a>(list: &'a [Container], name: &str) -> &'a Container {
    list.iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("container {name} in {:?}", names(list)))
}

// ---- Upstream fixtures (pkg/webhook/pod/mutating/sidecarset_test.go) --------------------------

fn sidecar_set1() -> Value {
    json!({
        "metadata": {"name": "sidecarset1", "annotations": {SIDECARSET_HASH: "c4k2dbb95d"}},
        "spec": {
            "selector": {"matchLabels": {"app": "suxing-test"}},
            "initContainers": [
                {"name": "init-2", "image": "busybox:1.0.0"},
                {"name": "init-1", "image": "busybox:1.0.0"}
            ],
            "containers": [
                {"name": "dns-f", "image": "dns-f-image:1.0", "podInjectPolicy": "BeforeAppContainer", "shareVolumePolicy": {"type": "disabled"}},
                {"name": "log-agent", "image": "log-agent-image:1.0", "podInjectPolicy": "AfterAppContainer", "shareVolumePolicy": {"type": "disabled"}}
            ]
        }
    })
}

fn sidecar_set_with_transfer_env() -> Value {
    json!({
        "metadata": {"name": "sidecarset2", "annotations": {SIDECARSET_HASH: "c4k2dbb95d"}},
        "spec": {
            "selector": {"matchLabels": {"app": "suxing-test"}},
            "initContainers": [{
                "name": "dns-e", "image": "dns-e-image:1.0",
                "volumeMounts": [{"name": "volume-1"}],
                "podInjectPolicy": "BeforeAppContainer",
                "transferEnv": [{"sourceContainerName": "nginx", "envName": "hello2"}]
            }],
            "containers": [{
                "name": "dns-f", "image": "dns-f-image:1.0",
                "volumeMounts": [{"name": "volume-1"}],
                "podInjectPolicy": "BeforeAppContainer",
                "shareVolumePolicy": {"type": "disabled"},
                "transferEnv": [{"sourceContainerName": "nginx", "envName": "hello2"}]
            }],
            "volumes": [{"name": "volume-1"}, {"name": "volume-2"}]
        }
    })
}

fn sidecar_set3() -> Value {
    json!({
        "metadata": {"name": "sidecarset3", "annotations": {SIDECARSET_HASH: "gm967682cm"}},
        "spec": {
            "selector": {"matchLabels": {"app": "suxing-test"}},
            "containers": [
                {
                    "name": "dns-f", "image": "dns-f-image:1.0",
                    "volumeMounts": [{"name": "volume-1", "mountPath": "/a/b/c"}, {"name": "volume-2", "mountPath": "/d/e/f"}],
                    "podInjectPolicy": "AfterAppContainer",
                    "shareVolumePolicy": {"type": "enabled"}
                },
                {"name": "log-agent", "image": "log-agent-image:1.0", "podInjectPolicy": "AfterAppContainer", "shareVolumePolicy": {"type": "disabled"}}
            ],
            "volumes": [{"name": "volume-1"}, {"name": "volume-2"}]
        }
    })
}

fn sidecar_set_with_staragent() -> Value {
    json!({
        "metadata": {"name": "sidecarset3", "annotations": {SIDECARSET_HASH: "gm967682cm"}},
        "spec": {
            "selector": {"matchLabels": {"app": "suxing-test"}},
            "initContainers": [{
                "name": "dns-e", "image": "dns-e-image:1.0",
                "volumeMounts": [
                    {"name": "volume-3", "mountPath": "/g/h/i"},
                    {"name": "volume-4", "mountPath": "/j/k/l"},
                    {"name": "volume-staragent", "mountPath": "/staragent"}
                ],
                "podInjectPolicy": "BeforeAppContainer",
                "shareVolumePolicy": {"type": "enabled"}
            }],
            "containers": [
                {
                    "name": "dns-f", "image": "dns-f-image:1.0",
                    "volumeMounts": [
                        {"name": "volume-1", "mountPath": "/a/b/c"},
                        {"name": "volume-2", "mountPath": "/d/e/f"},
                        {"name": "volume-staragent", "mountPath": "/staragent"}
                    ],
                    "podInjectPolicy": "AfterAppContainer",
                    "shareVolumePolicy": {"type": "enabled"}
                },
                {"name": "staragent", "image": "staragent-image:1.0", "podInjectPolicy": "AfterAppContainer", "shareVolumePolicy": {"type": "enabled"}},
                {"name": "log-agent", "image": "log-agent-image:1.0", "podInjectPolicy": "AfterAppContainer", "shareVolumePolicy": {"type": "disabled"}}
            ],
            "volumes": [
                {"name": "volume-1"}, {"name": "volume-2"}, {"name": "volume-staragent"},
                {"name": "volume-3"}, {"name": "volume-4"}
            ]
        }
    })
}

fn pod1() -> Value {
    json!({
        "metadata": {"name": "test-pod", "namespace": "default", "labels": {"app": "suxing-test"}},
        "spec": {
            "initContainers": [{"name": "init-0", "image": "busybox:1.0.0"}],
            "containers": [{
                "name": "nginx", "image": "nginx:1.15.1",
                "env": [{"name": "hello1", "value": "world1"}, {"name": "hello2", "value": "world2"}],
                "volumeMounts": [{"name": "volume-a", "mountPath": "/a/b"}, {"name": "volume-b", "mountPath": "/e/f"}]
            }],
            "volumes": [{"name": "volume-a"}, {"name": "volume-b"}]
        }
    })
}

fn pod_with_staragent() -> Value {
    json!({
        "metadata": {"name": "test-pod", "namespace": "default", "labels": {"app": "suxing-test"}},
        "spec": {
            "containers": [{
                "name": "nginx", "image": "nginx:1.15.1",
                "env": [{"name": "hello1", "value": "world1"}, {"name": "hello2", "value": "world2"}],
                "volumeMounts": [
                    {"name": "volume-a", "mountPath": "/a/b"},
                    {"name": "volume-b", "mountPath": "/e/f"},
                    {"name": "volume-staragent", "mountPath": "/staragent"}
                ]
            }],
            "volumes": [{"name": "volume-a"}, {"name": "volume-b"}, {"name": "volume-staragent"}]
        }
    })
}

// ---- Upstream scenarios -------------------------------------------------------------------------

#[test]
fn no_sidecarsets_leave_the_pod_untouched() {
    // Upstream TestPodHasNoMatchedSidecarSet (matching itself is tested in matching.rs).
    let p = pod(pod1());
    let out = run(&p, &[]);
    assert_eq!(out.pod, p);
    assert!(out.injected.is_empty());
    assert!(pod_patch(&p, &out.pod).expect("patch").0.is_empty());
}

#[test]
fn pull_secrets_merge_by_name_pods_first() {
    // Upstream TestMergeSidecarSecrets: expected count = pod + sidecarset - repeated.
    let cases: [(&[&str], &[&str], usize); 4] = [
        (&["s2", "s3", "s3"], &["s0", "s1", "s2"], 4),
        (&["s3", "s4", "s5"], &["s0", "s1", "s2"], 6),
        (&[], &["s0", "s1", "s2"], 3),
        (&["s3", "s4", "s5"], &[], 3),
    ];
    for (pod_secrets, set_secrets, expected) in cases {
        let mut p = pod1();
        p["spec"]["imagePullSecrets"] = json!(
            pod_secrets
                .iter()
                .map(|n| json!({"name": n}))
                .collect::<Vec<_>>()
        );
        let mut s = sidecar_set1();
        s["spec"]["imagePullSecrets"] = json!(
            set_secrets
                .iter()
                .map(|n| json!({"name": n}))
                .collect::<Vec<_>>()
        );
        let out = run(&pod(p), &[selected(s)]);
        let got: Vec<&str> = spec(&out.pod)
            .image_pull_secrets
            .iter()
            .flatten()
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(
            got.len(),
            expected,
            "{pod_secrets:?} + {set_secrets:?} → {got:?}"
        );
        assert_eq!(
            got.first().copied(),
            pod_secrets.first().or(set_secrets.first()).copied()
        );
    }
}

#[test]
fn metadata_patches_of_several_sidecarsets_combine() {
    // Upstream TestInjectMetadata.
    let mut demo1 = sidecar_set1();
    demo1["spec"]["patchPodMetadata"] = json!([
        {"patchPolicy": "MergePatchJson", "annotations": {"key1": "{\"log-agent\":1}"}},
        {"patchPolicy": "Retain", "annotations": {"key": "envoy=1,log=2"}}
    ]);
    let mut demo2 = sidecar_set1();
    demo2["metadata"]["name"] = json!("sidecarset2");
    demo2["spec"]["containers"] = json!([]);
    demo2["spec"]["initContainers"] = json!([]);
    demo2["spec"]["patchPodMetadata"] = json!([
        {"patchPolicy": "MergePatchJson", "annotations": {"key1": "{\"envoy\":2}"}}
    ]);
    let out = run(&pod(pod1()), &[selected(demo1), selected(demo2)]);
    assert_eq!(
        annotation(&out.pod, "key1"),
        Some(r#"{"envoy":2,"log-agent":1}"#)
    );
    assert_eq!(annotation(&out.pod, "key"), Some("envoy=1,log=2"));
}

#[test]
fn metadata_patches_apply_even_when_nothing_is_injected() {
    let s = json!({
        "metadata": {"name": "meta-only"},
        "spec": {"patchPodMetadata": [{"patchPolicy": "Overwrite", "annotations": {"k": "v"}}]}
    });
    let out = run(&pod(pod1()), &[selected(s)]);
    assert_eq!(annotation(&out.pod, "k"), Some("v"));
    assert_eq!(
        annotation(&out.pod, SIDECARSET_HASH),
        None,
        "nothing injected, no hash"
    );
    assert_eq!(annotation(&out.pod, SIDECARSET_INJECTED_LIST), None);
    assert!(out.injected.is_empty());
}

#[test]
fn an_invalid_merge_patch_fails_naming_the_sidecarset() {
    let mut s = sidecar_set1();
    s["spec"]["patchPodMetadata"] =
        json!([{"patchPolicy": "MergePatchJson", "annotations": {"k": "{bad"}}]);
    let mut p = pod1();
    p["metadata"]["annotations"] = json!({"k": "{\"a\":1}"});
    let err = inject(&pod(p), &[selected(s)], now()).expect_err("invalid patch");
    assert!(matches!(err, InjectionError::PatchPodMetadata { .. }));
    assert!(err.to_string().contains("sidecarset1"), "{err}");
}

#[test]
fn a_restored_revision_injects_its_containers() {
    // Upstream TestInjectionStrategyRevision: the revision has one init container and one
    // container, so the pod gains two.
    let p = pod(pod1());
    let set: SidecarSet = serde_json::from_value(sidecar_set1()).expect("set");
    let revision: k8s_openapi::api::apps::v1::ControllerRevision = serde_json::from_value(json!({
        "metadata": {"name": "sidecarset1-12345", "labels": {"kruise.io/sidecarset-name": "sidecarset1"}},
        "revision": 1,
        "data": {"spec": {
            "$patch": "replace",
            "initContainers": [{"name": "init-2", "image": "busybox:1.0.0"}],
            "containers": [{"name": "dns-f", "image": "dns-f-image:1.0", "podInjectPolicy": "BeforeAppContainer"}]
        }}
    }))
    .expect("revision");
    let restored = crate::revision::restore(&set, &revision).expect("restore");
    let out = run(&p, &[restored]);
    let before = spec(&p).containers.len() + spec(&p).init_containers.as_ref().map_or(0, Vec::len);
    let after = spec(&out.pod).containers.len()
        + spec(&out.pod).init_containers.as_ref().map_or(0, Vec::len);
    assert_eq!(after, before + 2);
    let hashes = parse_hashes(
        SIDECARSET_HASH,
        annotation(&out.pod, SIDECARSET_HASH).unwrap(),
    )
    .unwrap();
    assert_eq!(
        hashes["sidecarset1"].controller_revision,
        "sidecarset1-12345"
    );
}

#[test]
fn inject_policy_places_containers_and_init_containers_sort_by_name() {
    // Upstream TestSidecarSetPodInjectPolicy.
    let out = run(&pod(pod1()), &[selected(sidecar_set1())]);
    assert_eq!(container_names(&out.pod), ["dns-f", "nginx", "log-agent"]);
    assert_eq!(init_names(&out.pod), ["init-0", "init-1", "init-2"]);
    let init = spec(&out.pod).init_containers.as_deref().unwrap();
    for c in &init[1..] {
        assert_eq!(env_value(c, SIDECAR_ENV_KEY), Some("true"), "{}", c.name);
    }
    assert_eq!(
        env_value(&init[0], SIDECAR_ENV_KEY),
        None,
        "the pod's own init container is untouched"
    );
}

#[test]
fn only_referenced_sidecarset_volumes_are_added() {
    // Upstream TestSidecarVolumesAppend: volume-2 is not mounted by any sidecar.
    let out = run(&pod(pod1()), &[selected(sidecar_set_with_transfer_env())]);
    assert_eq!(volume_names(&out.pod), ["volume-a", "volume-b", "volume-1"]);
}

#[test]
fn old_format_hash_annotations_are_kept_and_extended() {
    // Upstream TestPodSidecarSetHashCompatibility.
    let mut p = pod1();
    p["metadata"]["annotations"] = json!({
        SIDECARSET_HASH: r#"{"sidecarset-test":"bv6d2fbw97wz8xx5x4v4wddwbd5z744wcf7c786dd4dvxvd5w6w424df7vx47989"}"#,
        SIDECARSET_HASH_WITHOUT_IMAGE: r#"{"sidecarset-test":"54x5977vf9zz4248w7v44456zf655b8bcffv7x74w88f6dwb994fw48b8f9b8959"}"#
    });
    let out = run(&pod(p), &[selected(sidecar_set1())]);
    let hashes = parse_hashes(
        SIDECARSET_HASH,
        annotation(&out.pod, SIDECARSET_HASH).unwrap(),
    )
    .unwrap();
    assert_eq!(
        hashes["sidecarset-test"].hash,
        "bv6d2fbw97wz8xx5x4v4wddwbd5z744wcf7c786dd4dvxvd5w6w424df7vx47989"
    );
    assert_eq!(hashes["sidecarset1"].hash, "c4k2dbb95d");
    let without = parse_hashes(
        SIDECARSET_HASH_WITHOUT_IMAGE,
        annotation(&out.pod, SIDECARSET_HASH_WITHOUT_IMAGE).unwrap(),
    )
    .unwrap();
    assert!(without.contains_key("sidecarset-test") && without.contains_key("sidecarset1"));
}

#[test]
fn garbage_hash_annotations_are_an_error() {
    let mut p = pod1();
    p["metadata"]["annotations"] = json!({SIDECARSET_HASH: "not json"});
    let err = inject(&pod(p), &[selected(sidecar_set1())], now()).expect_err("garbage");
    assert!(matches!(err, InjectionError::Annotation(_)), "{err}");
}

/// Upstream TestPodVolumeMountsAppend: the init container (dns-e) and dns-f share the app's
/// mounts; subPathExpr variables travel with them.
#[test]
fn shared_volume_mounts_and_subpath_expr_envs() {
    let mut set = sidecar_set_with_staragent();
    set["spec"]["containers"] = json!([set["spec"]["containers"][0].clone()]);
    let with_expr = |expr: Option<&str>, envs: &[(&str, &str)]| {
        let mut p = pod_with_staragent();
        if let Some(expr) = expr {
            p["spec"]["containers"][0]["volumeMounts"]
                .as_array_mut()
                .unwrap()
                .push(json!({"name": "volume-expansion", "mountPath": "/e/expansion", "subPathExpr": expr}));
        }
        for (k, v) in envs {
            p["spec"]["containers"][0]["env"]
                .as_array_mut()
                .unwrap()
                .push(json!({"name": k, "value": v}));
        }
        pod(p)
    };
    let cases = [
        (with_expr(None, &[]), false, vec![]),
        (
            with_expr(
                Some("foo/$(POD_NAME)/$(OD_NAME)/conf"),
                &[("POD_NAME", "bar"), ("OD_NAME", "od_name")],
            ),
            true,
            vec!["POD_NAME", "OD_NAME"],
        ),
        (with_expr(Some("foo"), &[]), true, vec![]),
        (with_expr(Some(""), &[]), true, vec![]),
    ];
    for (p, expansion, envs) in cases {
        let out = run(&p, &[selected(set.clone())]);
        let init = &spec(&out.pod).init_containers.as_deref().unwrap()[0];
        let dns_f = &spec(&out.pod).containers[1];
        assert_eq!(dns_f.name, "dns-f");
        let mut init_expected = vec!["/g/h/i", "/j/k/l", "/staragent", "/a/b", "/e/f"];
        let mut expected = vec!["/a/b/c", "/d/e/f", "/staragent", "/a/b", "/e/f"];
        if expansion {
            init_expected.push("/e/expansion");
            expected.push("/e/expansion");
        }
        assert_eq!(
            mount_paths(init),
            init_expected,
            "own mounts first, /staragent not doubled"
        );
        assert_eq!(mount_paths(dns_f), expected);
        for env in envs {
            assert!(env_names(init).contains(&env), "{env} in init");
            assert!(env_names(dns_f).contains(&env), "{env} in dns-f");
        }
    }
}

#[test]
fn transfer_env_copies_from_the_source_container() {
    // Upstream TestSidecarSetTransferEnv.
    let mut s = sidecar_set_with_transfer_env();
    s["spec"]["initContainers"][0]["podInjectPolicy"] = Value::Null;
    let out = run(&pod(pod1()), &[selected(s)]);
    let init = spec(&out.pod).init_containers.as_deref().unwrap();
    assert_eq!(init_names(&out.pod), ["init-0", "dns-e"]);
    assert_eq!(env_names(&init[1]), [SIDECAR_ENV_KEY, "hello2"]);
    assert_eq!(env_value(&init[1], "hello2"), Some("world2"));
    let c = &spec(&out.pod).containers[0];
    assert_eq!(c.name, "dns-f");
    assert_eq!(env_names(c), [SIDECAR_ENV_KEY, "hello2"]);
    assert_eq!(env_value(c, "hello2"), Some("world2"));
}

/// Upstream's sidecarset3 and the other fixtures both inject `dns-f`: upstream builds a pod with
/// two `dns-f` containers (which the apiserver rejects) and only checks annotations. We refuse
/// that pod, so these scenarios rename sidecarset3's container.
fn sidecar_set3_renamed() -> Value {
    let mut s = sidecar_set3();
    s["spec"]["containers"][0]["name"] = json!("dns-g");
    s["spec"]["containers"][1]["name"] = json!("log-agent-3");
    s
}

#[test]
fn each_injecting_sidecarset_records_its_hash() {
    // Upstream TestSidecarSetHashInject (sidecarset1 does not match and is not passed in).
    let out = run(
        &pod(pod1()),
        &[
            selected(sidecar_set_with_transfer_env()),
            selected(sidecar_set3_renamed()),
        ],
    );
    let hashes = parse_hashes(
        SIDECARSET_HASH,
        annotation(&out.pod, SIDECARSET_HASH).unwrap(),
    )
    .unwrap();
    assert_eq!(hashes["sidecarset2"].hash, "c4k2dbb95d");
    assert_eq!(hashes["sidecarset3"].hash, "gm967682cm");
    assert_eq!(out.injected, ["sidecarset2", "sidecarset3"]);
}

#[test]
fn injected_list_names_every_selected_sidecarset() {
    // Upstream TestSidecarSetNameInject.
    let out = run(
        &pod(pod1()),
        &[selected(sidecar_set3_renamed()), selected(sidecar_set1())],
    );
    assert_eq!(
        annotation(&out.pod, SIDECARSET_INJECTED_LIST),
        Some("sidecarset1,sidecarset3")
    );
    // With upstream's fixtures verbatim, the duplicate `dns-f` is refused.
    let err = inject(
        &pod(pod1()),
        &[selected(sidecar_set3()), selected(sidecar_set1())],
        now(),
    )
    .expect_err("dns-f twice");
    assert!(
        matches!(err, InjectionError::NameConflict { ref container, .. } if container == "dns-f")
    );
}

#[test]
fn injected_list_is_a_union_with_the_existing_one() {
    let mut p = pod1();
    p["metadata"]["annotations"] = json!({SIDECARSET_INJECTED_LIST: "zzz,aaa"});
    let out = run(&pod(p), &[selected(sidecar_set1())]);
    assert_eq!(
        annotation(&out.pod, SIDECARSET_INJECTED_LIST),
        Some("aaa,sidecarset1,zzz")
    );
}

fn injected(name: &str, policy: PodInjectPolicy) -> Injected {
    Injected {
        container: Container {
            name: name.into(),
            ..Default::default()
        },
        policy,
        sidecarset: "s".into(),
    }
}

fn plain(names: &[&str]) -> Vec<Container> {
    names
        .iter()
        .map(|n| Container {
            name: n.to_string(),
            ..Default::default()
        })
        .collect()
}

#[test]
fn merge_containers_replaces_in_place_and_places_new_ones() {
    // Upstream TestMergeSidecarContainers (injected lists sorted by name, as there).
    use PodInjectPolicy::{AfterAppContainer as After, BeforeAppContainer as Before};
    let all = || {
        vec![
            injected("new-sidecar-1", Before),
            injected("sidecar-1", After),
            injected("sidecar-2", After),
        ]
    };
    let cases: Vec<(Vec<Container>, Vec<Injected>, Vec<&str>)> = vec![
        (
            plain(&["app-container"]),
            all(),
            vec!["new-sidecar-1", "app-container", "sidecar-1", "sidecar-2"],
        ),
        (
            plain(&["app-container"]),
            vec![injected("new-sidecar-1", Before)],
            vec!["new-sidecar-1", "app-container"],
        ),
        (
            plain(&["app-container"]),
            vec![injected("sidecar-1", After), injected("sidecar-2", After)],
            vec!["app-container", "sidecar-1", "sidecar-2"],
        ),
        (
            plain(&["sidecar-1", "app-container", "sidecar-2"]),
            vec![injected("sidecar-1", After), injected("sidecar-2", After)],
            vec!["sidecar-1", "app-container", "sidecar-2"],
        ),
        (
            plain(&["sidecar-1", "app-container", "sidecar-2"]),
            all(),
            vec!["new-sidecar-1", "sidecar-1", "app-container", "sidecar-2"],
        ),
        (
            vec![],
            all(),
            vec!["new-sidecar-1", "sidecar-1", "sidecar-2"],
        ),
    ];
    for (origins, inject, expected) in cases {
        let merged = merge_containers(origins, inject);
        assert_eq!(names(&merged), expected);
    }
}

#[test]
fn a_pod_container_with_the_sidecar_name_is_replaced_in_place() {
    let mut p = pod1();
    p["spec"]["containers"] = json!([
        {"name": "log-agent", "image": "old-log:0"},
        {"name": "nginx", "image": "nginx:1"}
    ]);
    let out = run(&pod(p), &[selected(sidecar_set1())]);
    assert_eq!(container_names(&out.pod), ["dns-f", "log-agent", "nginx"]);
    let log = container(&spec(&out.pod).containers, "log-agent");
    assert_eq!(log.image.as_deref(), Some("log-agent-image:1.0"));
    assert_eq!(env_value(log, SIDECAR_ENV_KEY), Some("true"));
}

#[test]
fn native_sidecar_init_containers_are_listed_in_the_hash_annotation() {
    // Upstream TestInjectInitContainer, without the hot-upgrade SidecarSet (see the next test).
    let mut s = json!({
        "metadata": {"name": "sidecarset-1", "annotations": {
            SIDECARSET_HASH: "sidecarset-1-hash",
            SIDECARSET_HASH_WITHOUT_IMAGE: "sidecarset-1-without-image-hash"
        }},
        "spec": {
            "selector": {"matchLabels": {"app": "suxing-test"}},
            "initContainers": [{
                "name": "init-1", "image": "dns-e-image:1.0", "restartPolicy": "Always",
                "volumeMounts": [{"name": "volume-1"}],
                "transferEnv": [{"sourceContainerName": "nginx", "envName": "hello2"}]
            }],
            "volumes": [{"name": "volume-1"}]
        }
    });
    let out = run(&pod(pod1()), &[selected(s.clone())]);
    let expected_hash = r#"{"sidecarset-1":{"updateTimestamp":"2024-03-04T05:06:07Z","hash":"sidecarset-1-hash","sidecarSetName":"sidecarset-1","sidecarList":["init-1"]}}"#;
    let expected_without = r#"{"sidecarset-1":{"updateTimestamp":"2024-03-04T05:06:07Z","hash":"sidecarset-1-without-image-hash","sidecarSetName":"sidecarset-1","sidecarList":["init-1"]}}"#;
    assert_eq!(annotation(&out.pod, SIDECARSET_HASH), Some(expected_hash));
    assert_eq!(
        annotation(&out.pod, SIDECARSET_HASH_WITHOUT_IMAGE),
        Some(expected_without)
    );
    assert_eq!(
        annotation(&out.pod, SIDECARSET_INJECTED_LIST),
        Some("sidecarset-1")
    );
    assert_eq!(init_names(&out.pod), ["init-0", "init-1"]);
    assert_eq!(volume_names(&out.pod), ["volume-a", "volume-b", "volume-1"]);

    // A plain init container is injected but not listed.
    s["spec"]["initContainers"][0]["restartPolicy"] = Value::Null;
    let out = run(&pod(pod1()), &[selected(s)]);
    let hashes = parse_hashes(
        SIDECARSET_HASH,
        annotation(&out.pod, SIDECARSET_HASH).unwrap(),
    )
    .unwrap();
    assert_eq!(hashes["sidecarset-1"].sidecar_list, Some(vec![]));
}

#[test]
fn resources_policy_computes_the_sidecar_resources_from_the_pod_before_injection() {
    // Two SidecarSets: the second's sidecar must not count the first's containers (nor its own),
    // nor the pod's plain init container; the pod's native sidecar counts.
    let mut s = sidecar_set1();
    s["spec"]["containers"][1]["resourcesPolicy"] = json!({
        "targetContainersMode": "sum",
        "resourcesExpr": {
            "limits": {"cpu": "cpu*50%", "memory": "max(memory*25%, 64Mi)"},
            "requests": {"cpu": "max(cpu*10%, 50m)"}
        }
    });
    s["spec"]["containers"][1]["resources"] = json!({"claims": [{"name": "gpu"}]});
    let mut p = pod1();
    p["spec"]["initContainers"] = json!([
        {"name": "init-0", "image": "busybox", "resources": {"limits": {"cpu": "8", "memory": "8Gi"}}},
        {"name": "native", "image": "envoy", "restartPolicy": "Always",
         "resources": {"limits": {"cpu": "200m", "memory": "256Mi"}, "requests": {"cpu": "100m"}}}
    ]);
    p["spec"]["containers"] = json!([
        {"name": "nginx", "image": "nginx", "resources": {"limits": {"cpu": "1", "memory": "768Mi"}, "requests": {"cpu": "400m"}}},
        {"name": "dns-f", "image": "dns-f-image:0.9", "resources": {"limits": {"cpu": "16", "memory": "16Gi"}}}
    ]);
    let out = run(&pod(p), &[selected(s)]);
    let log = spec(&out.pod)
        .containers
        .iter()
        .find(|c| c.name == "log-agent")
        .expect("log-agent injected");
    let resources = serde_json::to_value(log.resources.as_ref().expect("resources")).unwrap();
    assert_eq!(
        resources,
        json!({
            "claims": [{"name": "gpu"}],
            "limits": {"cpu": "600m", "memory": "256Mi"},
            "requests": {"cpu": "50m"}
        })
    );
    // The other sidecar is untouched.
    let dns = spec(&out.pod)
        .containers
        .iter()
        .find(|c| c.name == "dns-f")
        .unwrap();
    assert_eq!(dns.resources, None);
}

#[test]
fn resources_policy_without_a_target_denies_the_pod() {
    let mut s = sidecar_set1();
    s["spec"]["containers"][0]["resourcesPolicy"] = json!({
        "targetContainersMode": "max", "targetContainersNameRegex": "^nothing$",
        "resourcesExpr": {"limits": {"cpu": "cpu"}}
    });
    let err = inject(&pod(pod1()), &[selected(s)], now()).expect_err("no target");
    assert!(
        matches!(err, InjectionError::ResourcesPolicy { ref container, .. } if container == "dns-f"),
        "{err}"
    );
    assert!(err.to_string().contains("^nothing$"), "{err}");
}

#[test]
fn init_container_sort_and_placement() {
    // Upstream TestInjectInitContainerSort: injected init containers sorted by name first.
    use PodInjectPolicy::{AfterAppContainer as After, BeforeAppContainer as Before};
    let sorted = |mut v: Vec<Injected>| {
        v.sort_by(|a, b| a.container.name.cmp(&b.container.name));
        v
    };
    let abc = |a, b, c| {
        sorted(vec![
            injected("a-init", a),
            injected("c-init", c),
            injected("b-init", b),
        ])
    };
    assert_eq!(
        names(&merge_containers(vec![], abc(After, After, After))),
        ["a-init", "b-init", "c-init"]
    );
    assert_eq!(
        names(&merge_containers(
            plain(&["app1-init", "app2-init"]),
            abc(After, After, After)
        )),
        ["app1-init", "app2-init", "a-init", "b-init", "c-init"]
    );
    assert_eq!(
        names(&merge_containers(
            plain(&["app1-init", "app2-init"]),
            abc(After, Before, Before)
        )),
        ["b-init", "c-init", "app1-init", "app2-init", "a-init"]
    );
}

#[test]
fn init_containers_of_several_sidecarsets_sort_together() {
    let a = json!({"metadata": {"name": "a"}, "spec": {"initContainers": [{"name": "z-init"}]}});
    let b = json!({"metadata": {"name": "b"}, "spec": {"initContainers": [{"name": "m-init"}]}});
    let out = run(&pod(pod1()), &[selected(b), selected(a)]);
    assert_eq!(init_names(&out.pod), ["init-0", "m-init", "z-init"]);
}

/// Upstream TestPodVolumeDevicesAppend.
#[test]
fn volume_devices_own_and_shared() {
    let base_pod = || {
        let mut p = pod_with_staragent();
        p["spec"]["containers"][0]["volumeDevices"] = json!([
            {"name": "origin-pvc-1", "devicePath": "/origin-1"},
            {"name": "origin-pvc-share", "devicePath": "/share"}
        ]);
        p["spec"]["volumes"].as_array_mut().unwrap().extend([
            json!({"name": "origin-pvc-1"}),
            json!({"name": "origin-pvc-share"}),
        ]);
        pod(p)
    };
    let devices = |c: &Container| -> Vec<(String, String)> {
        c.volume_devices
            .iter()
            .flatten()
            .map(|d| (d.name.clone(), d.device_path.clone()))
            .collect()
    };
    let pair = |n: &str, p: &str| (n.to_owned(), p.to_owned());

    // Sharing disabled: only the sidecars' own devices.
    let mut s = sidecar_set_with_staragent();
    s["spec"]["containers"] = json!([s["spec"]["containers"][0].clone()]);
    s["spec"]["initContainers"][0]["volumeDevices"] =
        json!([{"name": "disk0", "devicePath": "/dev/nvme0"}]);
    s["spec"]["initContainers"][0]["volumeMounts"] = Value::Null;
    s["spec"]["initContainers"][0]["shareVolumePolicy"] = json!({});
    s["spec"]["containers"][0]["volumeDevices"] =
        json!([{"name": "disk0", "devicePath": "/dev/nvme1"}]);
    s["spec"]["containers"][0]["volumeMounts"] = Value::Null;
    s["spec"]["containers"][0]["shareVolumePolicy"] = json!({});
    s["spec"]["volumes"] = json!([{"name": "disk0"}]);
    let out = run(&base_pod(), &[selected(s)]);
    let init = &spec(&out.pod).init_containers.as_deref().unwrap()[0];
    assert_eq!(devices(init), [pair("disk0", "/dev/nvme0")]);
    assert_eq!(
        devices(&spec(&out.pod).containers[1]),
        [pair("disk0", "/dev/nvme1")]
    );
    assert_eq!(
        volume_names(&out.pod),
        [
            "volume-a",
            "volume-b",
            "volume-staragent",
            "origin-pvc-1",
            "origin-pvc-share",
            "disk0"
        ]
    );

    // Sharing enabled: the app's devices follow the sidecar's own.
    let mut s = sidecar_set_with_staragent();
    s["spec"]["containers"] = json!([s["spec"]["containers"][0].clone()]);
    s["spec"]["initContainers"][0]["volumeDevices"] =
        json!([{"name": "disk0", "devicePath": "/dev/nvme0"}]);
    s["spec"]["initContainers"][0]["shareVolumePolicy"] = json!({});
    s["spec"]["initContainers"][0]["shareVolumeDevicePolicy"] = json!({"type": "enabled"});
    s["spec"]["containers"][0]["volumeDevices"] =
        json!([{"name": "disk0", "devicePath": "/dev/nvme1"}]);
    s["spec"]["containers"][0]["volumeMounts"] = Value::Null;
    s["spec"]["containers"][0]["shareVolumePolicy"] = json!({});
    s["spec"]["containers"][0]["shareVolumeDevicePolicy"] = json!({"type": "enabled"});
    s["spec"]["volumes"] = json!([{"name": "volume-3"}, {"name": "volume-4"}, {"name": "volume-staragent"}, {"name": "disk0"}]);
    let out = run(&base_pod(), &[selected(s)]);
    let init = &spec(&out.pod).init_containers.as_deref().unwrap()[0];
    let shared = [
        pair("origin-pvc-1", "/origin-1"),
        pair("origin-pvc-share", "/share"),
    ];
    assert_eq!(
        devices(init),
        [
            pair("disk0", "/dev/nvme0"),
            shared[0].clone(),
            shared[1].clone()
        ]
    );
    assert_eq!(
        devices(&spec(&out.pod).containers[1]),
        [
            pair("disk0", "/dev/nvme1"),
            shared[0].clone(),
            shared[1].clone()
        ]
    );
    assert_eq!(
        volume_names(&out.pod),
        [
            "volume-a",
            "volume-b",
            "volume-staragent",
            "origin-pvc-1",
            "origin-pvc-share",
            "volume-3",
            "volume-4",
            "disk0"
        ]
    );
}

/// Upstream TestBuildSidecarVolumes_WithDifferentVolumeScenarios.
#[test]
fn volumes_are_collected_per_container_mounts_then_devices() {
    // Missing volumes: nothing is added, and the user is told.
    let mut s = sidecar_set_with_staragent();
    s["spec"]["volumes"] =
        json!([{"name": "volume-a1"}, {"name": "volume-b2"}, {"name": "volume-c3"}]);
    s["spec"]["initContainers"][0]["volumeDevices"] =
        json!([{"name": "disk0", "devicePath": "/dev/nvme0"}]);
    s["spec"]["containers"][0]["volumeDevices"] =
        json!([{"name": "disk0", "devicePath": "/dev/nvme1"}]);
    let out = run(&pod(pod1()), &[selected(s)]);
    assert_eq!(volume_names(&out.pod), ["volume-a", "volume-b"]);
    assert!(
        out.warnings.iter().any(|w| w.contains("\"disk0\"")),
        "{:?}",
        out.warnings
    );
    assert!(
        out.warnings.iter().any(|w| w.contains("\"volume-3\"")),
        "{:?}",
        out.warnings
    );

    // Existing volumes: in order of init mounts, init devices, container mounts, devices.
    let mut s = sidecar_set_with_staragent();
    s["spec"]["initContainers"][0]["volumeMounts"] = json!([{"name": "volume-1", "mountPath": "/a/b"}, {"name": "volume-2", "mountPath": "/c/d"}]);
    s["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "volume-3", "mountPath": "/a/b"}, {"name": "volume-4", "mountPath": "/c/d"}]);
    s["spec"]["initContainers"][0]["volumeDevices"] =
        json!([{"name": "disk0", "devicePath": "/dev/nvme0"}]);
    s["spec"]["containers"][0]["volumeDevices"] =
        json!([{"name": "disk1", "devicePath": "/dev/nvme1"}]);
    s["spec"]["volumes"]
        .as_array_mut()
        .unwrap()
        .extend([json!({"name": "disk0"}), json!({"name": "disk1"})]);
    let out = run(&pod(pod1()), &[selected(s)]);
    assert_eq!(
        volume_names(&out.pod),
        [
            "volume-a", "volume-b", "volume-1", "volume-2", "disk0", "volume-3", "volume-4",
            "disk1"
        ]
    );
    assert!(out.warnings.is_empty(), "{:?}", out.warnings);
}

// ---- Further behaviours --------------------------------------------------------------------------

#[test]
fn the_pods_own_volume_wins_a_name_clash() {
    let mut s = sidecar_set3();
    s["spec"]["volumes"] = json!([{"name": "volume-a", "emptyDir": {}}, {"name": "volume-2"}]);
    s["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "volume-a", "mountPath": "/x"}]);
    let out = run(&pod(pod1()), &[selected(s)]);
    let volumes = spec(&out.pod).volumes.as_deref().unwrap();
    assert_eq!(volume_names(&out.pod), ["volume-a", "volume-b"]);
    assert!(
        volumes[0].empty_dir.is_none(),
        "the pod's definition is kept"
    );
}

#[test]
fn own_env_wins_over_transferred_env() {
    let mut s = sidecar_set_with_transfer_env();
    s["spec"]["containers"][0]["env"] = json!([{"name": "hello2", "value": "mine"}]);
    s["spec"]["containers"][0]["transferEnv"] =
        json!([{"sourceContainerName": "nginx", "envNames": ["hello2", "hello1", "missing"]}]);
    let out = run(&pod(pod1()), &[selected(s)]);
    let c = container(&spec(&out.pod).containers, "dns-f");
    assert_eq!(env_names(c), ["hello2", SIDECAR_ENV_KEY, "hello1"]);
    assert_eq!(env_value(c, "hello2"), Some("mine"));
    assert_eq!(env_value(c, "hello1"), Some("world1"));
}

#[test]
fn transfer_env_source_from_pod_labels_and_annotations() {
    // Upstream TestGetSidecarTransferEnvs cases 2 and 3.
    for (field_path, labels, annotations) in [
        ("metadata.labels['app']", json!({"app": "main"}), json!({})),
        (
            "metadata.annotations['app']",
            json!({"app": "nginx-label"}),
            json!({"app": "main"}),
        ),
    ] {
        let p = pod(json!({
            "metadata": {"name": "p", "labels": labels, "annotations": annotations},
            "spec": {"containers": [{"name": "main", "image": "main:v1", "env": [{"name": "test-env", "value": "test-value"}]}]}
        }));
        let s = json!({"metadata": {"name": "s"}, "spec": {"containers": [{
            "name": "cold-sidecar", "image": "cold-image:v1",
            "transferEnv": [{"envName": "test-env", "sourceContainerNameFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": field_path}}}]
        }]}});
        let out = run(&p, &[selected(s)]);
        let c = container(&spec(&out.pod).containers, "cold-sidecar");
        assert_eq!(env_value(c, "test-env"), Some("test-value"), "{field_path}");
    }
}

#[test]
fn transfer_env_with_an_unusable_field_ref_is_skipped_with_a_warning() {
    for field_path in [
        "metadata.name",
        "spec.nodeName['x']",
        "metadata.labels['bad key!']",
    ] {
        let s = json!({"metadata": {"name": "s"}, "spec": {"containers": [{
            "name": "side",
            "transferEnv": [{"envName": "hello1", "sourceContainerNameFrom": {"fieldRef": {"fieldPath": field_path}}}]
        }]}});
        let out = run(&pod(pod1()), &[selected(s)]);
        let c = container(&spec(&out.pod).containers, "side");
        assert_eq!(env_names(c), [SIDECAR_ENV_KEY], "{field_path}");
        assert_eq!(out.warnings.len(), 1, "{field_path}: {:?}", out.warnings);
    }
}

#[test]
fn injected_containers_are_not_app_containers() {
    // A pod container already marked IS_INJECTED=true does not share its mounts or devices.
    let mut p = pod1();
    p["spec"]["containers"].as_array_mut().unwrap().push(json!({
        "name": "old-sidecar", "image": "x",
        "env": [{"name": SIDECAR_ENV_KEY, "value": "true"}],
        "volumeMounts": [{"name": "volume-a", "mountPath": "/sidecar-only"}],
        "volumeDevices": [{"name": "volume-b", "devicePath": "/dev/sidecar-only"}]
    }));
    let s = json!({"metadata": {"name": "s"}, "spec": {"containers": [{
        "name": "side", "shareVolumePolicy": {"type": "enabled"}, "shareVolumeDevicePolicy": {"type": "enabled"}
    }]}});
    let out = run(&pod(p), &[selected(s)]);
    let c = container(&spec(&out.pod).containers, "side");
    assert_eq!(mount_paths(c), ["/a/b", "/e/f"]);
    assert!(c.volume_devices.is_none());
}

#[test]
fn is_injected_is_set_exactly_once() {
    let s = json!({"metadata": {"name": "s"}, "spec": {"containers": [{
        "name": "side",
        "env": [
            {"name": "A", "value": "1"},
            {"name": SIDECAR_ENV_KEY, "value": "false"},
            {"name": SIDECAR_ENV_KEY, "value": "maybe"}
        ]
    }]}});
    let out = run(&pod(pod1()), &[selected(s)]);
    let c = container(&spec(&out.pod).containers, "side");
    assert_eq!(env_names(c), ["A", SIDECAR_ENV_KEY]);
    assert_eq!(env_value(c, SIDECAR_ENV_KEY), Some("true"));
}

#[test]
fn an_unset_inject_policy_means_the_defaulted_one() {
    let s = json!({"metadata": {"name": "s"}, "spec": {
        "containers": [{"name": "side"}],
        "initContainers": [{"name": "side-init"}]
    }});
    let out = run(&pod(pod1()), &[selected(s)]);
    assert_eq!(container_names(&out.pod), ["side", "nginx"]);
    assert_eq!(init_names(&out.pod), ["init-0", "side-init"]);
}

#[test]
fn two_sidecarsets_injecting_one_name_is_an_error() {
    let a = json!({"metadata": {"name": "a"}, "spec": {"containers": [{"name": "proxy"}]}});
    let b = json!({"metadata": {"name": "b"}, "spec": {"containers": [{"name": "proxy"}]}});
    let err = inject(&pod(pod1()), &[selected(a), selected(b)], now()).expect_err("conflict");
    let message = err.to_string();
    assert!(
        message.contains("proxy") && message.contains(" a ") && message.contains(" b"),
        "{message}"
    );
}

#[test]
fn names_may_not_clash_between_containers_and_init_containers() {
    // Upstream's own hash_test fixture has an init container and a container both named
    // container1; injecting it would give the apiserver an invalid pod.
    let s = json!({"metadata": {"name": "s"}, "spec": {
        "containers": [{"name": "container1"}],
        "initContainers": [{"name": "container1"}]
    }});
    assert!(inject(&pod(pod1()), &[selected(s)], now()).is_err());
    let s = json!({"metadata": {"name": "s"}, "spec": {"containers": [{"name": "init-0"}]}});
    assert!(inject(&pod(pod1()), &[selected(s)], now()).is_err());
    let s = json!({"metadata": {"name": "s"}, "spec": {"initContainers": [{"name": "nginx"}]}});
    assert!(inject(&pod(pod1()), &[selected(s)], now()).is_err());
}

#[test]
fn sidecarsets_are_processed_in_name_order_once() {
    let b = json!({"metadata": {"name": "b"}, "spec": {"containers": [{"name": "b-side"}]}});
    let a = json!({"metadata": {"name": "a"}, "spec": {"containers": [{"name": "a-side"}]}});
    let out = run(
        &pod(pod1()),
        &[selected(b.clone()), selected(a), selected(b)],
    );
    assert_eq!(container_names(&out.pod), ["a-side", "b-side", "nginx"]);
    assert_eq!(out.injected, ["a", "b"]);
}

#[test]
fn untouched_lists_stay_unset() {
    // Only containers are injected: the pod's unset init containers, volumes and pull secrets
    // must not become empty lists (that would be noise in the admission patch).
    let p = pod(json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "app"}]}}));
    let s = json!({"metadata": {"name": "s"}, "spec": {"containers": [{"name": "side"}]}});
    let out = run(&p, &[selected(s)]);
    let spec = spec(&out.pod);
    assert!(spec.init_containers.is_none());
    assert!(spec.volumes.is_none());
    assert!(spec.image_pull_secrets.is_none());
    let patch = serde_json::to_value(pod_patch(&p, &out.pod).expect("patch")).expect("json");
    let paths: Vec<&str> = patch
        .as_array()
        .expect("ops")
        .iter()
        .filter_map(|op| op["path"].as_str())
        .collect();
    assert!(
        paths
            .iter()
            .all(|p| p.starts_with("/spec/containers") || p.starts_with("/metadata/annotations")),
        "{paths:?}"
    );
}

#[test]
fn a_pod_without_spec_gets_one() {
    let p = pod(json!({"metadata": {"name": "bare"}}));
    let out = run(&p, &[selected(sidecar_set1())]);
    assert_eq!(container_names(&out.pod), ["dns-f", "log-agent"]);
    assert_eq!(init_names(&out.pod), ["init-1", "init-2"]);
}

#[test]
fn the_patch_turns_the_old_pod_into_the_new_one() {
    let p = pod(pod1());
    let out = run(
        &p,
        &[
            selected(sidecar_set3_renamed()),
            selected(sidecar_set_with_transfer_env()),
        ],
    );
    let patch = pod_patch(&p, &out.pod).expect("patch");
    let mut doc = serde_json::to_value(&p).expect("json");
    json_patch::patch(&mut doc, &patch.0).expect("patch applies");
    assert_eq!(doc, serde_json::to_value(&out.pod).expect("json"));
}

#[test]
fn subpath_expr_variables_are_found_like_upstreams_pattern() {
    assert_eq!(
        subpath_expr_vars("foo/$(POD_NAME)/$(OD_NAME)/conf"),
        ["POD_NAME", "OD_NAME"]
    );
    assert_eq!(subpath_expr_vars("$($(A)"), ["A"]);
    assert_eq!(subpath_expr_vars("$(1A)$(a.b-c_9)$()$(x"), ["a.b-c_9"]);
    assert!(subpath_expr_vars("").is_empty());
    assert!(subpath_expr_vars("$(é)").is_empty());
}

#[test]
fn qualified_names() {
    for ok in ["app", "a.b_c-d", "example.com/app", "A1"] {
        assert!(is_qualified_name(ok), "{ok}");
    }
    for bad in [
        "",
        "-a",
        "a-",
        "bad key!",
        "/a",
        "Example.com/a",
        "a/b/c",
        &"x".repeat(64),
    ] {
        assert!(!is_qualified_name(bad), "{bad}");
    }
}

// ---- Property: never panics, names stay unique ----------------------------------------------------

/// A small deterministic generator (xorshift64*), so failures reproduce.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

const NAMES: &[&str] = &[
    "app", "web", "proxy", "log", "dns", "init-a", "init-b", "envoy", "side",
];
const PATHS: &[&str] = &["/a", "/b", "/c/d", "/data", "/dev/x", "/logs"];
const VOLUMES: &[&str] = &["v1", "v2", "v3", "shared", "logs"];
const ENVS: &[&str] = &["A", "B", "POD_NAME", IS_INJECTED_ENV];
const IS_INJECTED_ENV: &str = SIDECAR_ENV_KEY;
const JSONISH: &[&str] = &[
    "{\"a\":1}",
    "{\"b\":null}",
    "[1]",
    "7",
    "null",
    "{oops",
    "",
    "text",
];

fn gen_env(g: &mut Gen) -> Value {
    let n = g.below(3);
    json!(
        (0..n)
            .map(|_| json!({"name": g.pick(ENVS), "value": g.pick(&["true", "x", ""])}))
            .collect::<Vec<_>>()
    )
}

fn gen_mounts(g: &mut Gen) -> Value {
    let n = g.below(3);
    json!(
        (0..n)
            .map(|_| {
                let mut m = json!({"name": g.pick(VOLUMES), "mountPath": g.pick(PATHS)});
                if g.chance(30) {
                    m["subPathExpr"] =
                        json!(g.pick(&["x/$(A)", "$(POD_NAME)/$(B)", "$(", "plain"]));
                }
                m
            })
            .collect::<Vec<_>>()
    )
}

fn gen_devices(g: &mut Gen) -> Value {
    let n = g.below(2);
    json!(
        (0..n)
            .map(|_| json!({"name": g.pick(VOLUMES), "devicePath": g.pick(PATHS)}))
            .collect::<Vec<_>>()
    )
}

fn gen_pod(g: &mut Gen) -> Pod {
    // Distinct names across containers and init containers, as the apiserver requires.
    let mut pool: Vec<&str> = NAMES.to_vec();
    let mut take = |g: &mut Gen| pool.remove(g.below(pool.len()));
    let containers: Vec<Value> = (0..1 + g.below(3))
        .map(|_| json!({"name": take(g), "image": "img", "env": gen_env(g), "volumeMounts": gen_mounts(g), "volumeDevices": gen_devices(g)}))
        .collect();
    let init: Vec<Value> = (0..g.below(3)).map(|_| json!({"name": take(g)})).collect();
    let mut annotations = serde_json::Map::new();
    if g.chance(20) {
        annotations.insert(
            SIDECARSET_HASH.into(),
            json!(g.pick(&["{\"old\":\"h\"}", "garbage", "", "{\"s\":{\"hash\":\"x\"}}"])),
        );
    }
    if g.chance(20) {
        annotations.insert(
            SIDECARSET_INJECTED_LIST.into(),
            json!(g.pick(&["a,b", ",", "zzz"])),
        );
    }
    if g.chance(40) {
        annotations.insert("meta".into(), json!(g.pick(JSONISH)));
    }
    let volumes: Vec<Value> = VOLUMES
        .iter()
        .filter(|_| g.chance(40))
        .map(|v| json!({"name": v}))
        .collect();
    pod(json!({
        "metadata": {"name": "gen", "labels": {"main": g.pick(NAMES)}, "annotations": annotations},
        "spec": {
            "containers": containers,
            "initContainers": init,
            "volumes": volumes,
            "imagePullSecrets": (0..g.below(3)).map(|_| json!({"name": g.pick(&["s1", "s2"])})).collect::<Vec<_>>()
        }
    }))
}

fn gen_sidecar(g: &mut Gen, init: bool) -> Value {
    let mut c = json!({
        "name": g.pick(NAMES),
        "image": "side:1",
        "env": gen_env(g),
        "volumeMounts": gen_mounts(g),
        "volumeDevices": gen_devices(g),
    });
    if g.chance(50) {
        c["podInjectPolicy"] = json!(g.pick(&["BeforeAppContainer", "AfterAppContainer"]));
    }
    if g.chance(40) {
        c["shareVolumePolicy"] = json!({"type": g.pick(&["enabled", "disabled"])});
    }
    if g.chance(30) {
        c["shareVolumeDevicePolicy"] = json!({"type": g.pick(&["enabled", "disabled"])});
    }
    if g.chance(40) {
        let mut t = json!({"envName": g.pick(ENVS), "envNames": [g.pick(ENVS)]});
        if g.chance(50) {
            t["sourceContainerName"] = json!(g.pick(NAMES));
        } else {
            t["sourceContainerNameFrom"] = json!({"fieldRef": {"fieldPath": g.pick(&[
                "metadata.labels['main']", "metadata.annotations['meta']", "metadata.name", "x['y']", "metadata.labels['']"
            ])}});
        }
        c["transferEnv"] = json!([t]);
    }
    if init && g.chance(40) {
        c["restartPolicy"] = json!("Always");
    }
    if g.chance(3) {
        c["upgradeStrategy"] = json!({"upgradeType": "HotUpgrade"});
    }
    if g.chance(3) {
        c["resourcesPolicy"] = json!({"targetContainersMode": "max", "resourcesExpr": {}});
    }
    c
}

fn gen_sidecarset(g: &mut Gen) -> SelectedSidecarSet {
    let containers: Vec<Value> = (0..g.below(3)).map(|_| gen_sidecar(g, false)).collect();
    let init: Vec<Value> = (0..g.below(2)).map(|_| gen_sidecar(g, true)).collect();
    let volumes: Vec<Value> = VOLUMES
        .iter()
        .filter(|_| g.chance(50))
        .map(|v| json!({"name": v, "emptyDir": {}}))
        .collect();
    let patches: Vec<Value> = (0..g.below(2))
        .map(|_| {
            json!({
                "patchPolicy": g.pick(&["Retain", "Overwrite", "MergePatchJson"]),
                "annotations": {g.pick(&["meta", "other"]): g.pick(JSONISH)}
            })
        })
        .collect();
    selected(json!({
        "metadata": {"name": g.pick(&["s-a", "s-b", "s-c", "s-d"])},
        "spec": {
            "containers": containers,
            "initContainers": init,
            "volumes": volumes,
            "imagePullSecrets": [{"name": g.pick(&["s1", "s3"])}],
            "patchPodMetadata": patches
        }
    }))
}

#[test]
fn never_panics_and_keeps_container_names_unique() {
    let mut g = Gen(0x9e37_79b9_7f4a_7c15);
    let mut ok = 0;
    let mut injected_some = 0;
    for round in 0..3000 {
        let p = gen_pod(&mut g);
        let sets: Vec<SelectedSidecarSet> =
            (0..g.below(4)).map(|_| gen_sidecarset(&mut g)).collect();
        for set in &sets {
            // Hashing any spec is total too.
            assert_eq!(crate::hash::sidecarset_hash(&set.spec).len(), 64);
        }
        let Ok(out) = inject(&p, &sets, now()) else {
            continue;
        };
        ok += 1;
        let spec = out.pod.spec.clone().unwrap_or_default();
        let all: Vec<&str> = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .map(|c| c.name.as_str())
            .collect();
        let unique: BTreeSet<&str> = all.iter().copied().collect();
        assert_eq!(
            unique.len(),
            all.len(),
            "round {round}: duplicate names {all:?}"
        );

        let volumes: Vec<&str> = spec
            .volumes
            .iter()
            .flatten()
            .map(|v| v.name.as_str())
            .collect();
        let unique_volumes: BTreeSet<&str> = volumes.iter().copied().collect();
        assert_eq!(
            unique_volumes.len(),
            volumes.len(),
            "round {round}: {volumes:?}"
        );

        // Every injected sidecar is in the pod, marked as injected (of SidecarSets given twice,
        // the first one counts).
        let mut seen = BTreeSet::new();
        let firsts = sets.iter().filter(|s| seen.insert(s.name.clone()));
        for set in firsts.filter(|s| out.injected.contains(&s.name)) {
            for sidecar in set.spec.containers.iter().chain(&set.spec.init_containers) {
                let c = spec
                    .containers
                    .iter()
                    .chain(spec.init_containers.iter().flatten())
                    .find(|c| c.name == sidecar.container.name)
                    .unwrap_or_else(|| panic!("round {round}: {} missing", sidecar.container.name));
                assert_eq!(env_value(c, SIDECAR_ENV_KEY), Some("true"), "round {round}");
                assert_eq!(
                    c.env
                        .iter()
                        .flatten()
                        .filter(|e| e.name == SIDECAR_ENV_KEY)
                        .count(),
                    1,
                    "round {round}"
                );
            }
        }
        if out.injected.is_empty() {
            assert_eq!(
                annotation(&out.pod, SIDECARSET_HASH),
                annotation(&p, SIDECARSET_HASH)
            );
        } else {
            injected_some += 1;
            for key in [SIDECARSET_HASH, SIDECARSET_HASH_WITHOUT_IMAGE] {
                let hashes = parse_hashes(key, annotation(&out.pod, key).unwrap_or_default())
                    .expect("our own annotation parses");
                for name in &out.injected {
                    assert!(
                        hashes.contains_key(name),
                        "round {round}: {key} lacks {name}"
                    );
                }
            }
        }
        let patch = pod_patch(&p, &out.pod).expect("patch");
        let mut doc = serde_json::to_value(&p).expect("json");
        json_patch::patch(&mut doc, &patch.0).expect("patch applies");
        assert_eq!(
            doc,
            serde_json::to_value(&out.pod).expect("json"),
            "round {round}"
        );
    }
    // The generator must exercise the success path, not just the refusals.
    assert!(ok > 1000, "only {ok} successful injections");
    assert!(
        injected_some > 500,
        "only {injected_some} injections with containers"
    );
}

/// Whether a `transferEnv` of `sets` may read a container that `sets` inject (named, or named
/// through a pod field): the second injection then reads that container as injected.
fn transfers_env_from_a_sidecar(sets: &[SelectedSidecarSet]) -> bool {
    let all = || {
        sets.iter()
            .flat_map(|s| s.spec.containers.iter().chain(&s.spec.init_containers))
    };
    let injected: BTreeSet<&str> = all().map(|c| c.container.name.as_str()).collect();
    all().flat_map(|c| &c.transfer_env).any(|t| {
        t.source_container_name_from.is_some()
            || injected.contains(t.source_container_name.as_deref().unwrap_or_default())
    })
}

/// Whether the `patchPodMetadata` of `sets` cannot be applied twice: two entries write one
/// annotation (applied again, the later one's value meets the earlier one's policy), or a
/// `MergePatchJson` value is not JSON (set as is on a pod without the annotation, then refused
/// as the base of the merge, by upstream too; our validation refuses such a SidecarSet), is not
/// an object or an array (the merge refuses it then), or has a `null`.
fn patches_that_cannot_repeat(sets: &[SelectedSidecarSet]) -> bool {
    let patches = || sets.iter().flat_map(|s| &s.spec.patch_pod_metadata);
    let mut keys = BTreeSet::new();
    let twice = patches()
        .flat_map(|p| p.annotations.keys())
        .any(|key| !keys.insert(key));
    // Set as is on a pod without the annotation, then merged into itself: only the same if the
    // value has no `null` (which a merge patch reads as "remove").
    let not_idempotent = patches()
        .filter(|p| p.patch_policy == Some(SidecarSetPatchPolicy::MergePatchJson))
        .flat_map(|p| p.annotations.values())
        .any(|v| match serde_json::from_str::<Value>(v) {
            Ok(value) if value.is_object() || value.is_array() => {
                let mut merged = value.clone();
                json_patch::merge(&mut merged, &value);
                merged != value
            }
            _ => true,
        });
    twice || not_idempotent
}

/// Whether a SidecarSet injects a container named like one of the pod's own (not injected)
/// containers: it replaces that one, which the second injection then no longer sees as an app
/// container to share volumes with.
fn replaces_an_app_container(pod: &Pod, sets: &[SelectedSidecarSet]) -> bool {
    let spec = pod.spec.clone().unwrap_or_default();
    let own: BTreeSet<String> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter(|c| env_value(c, SIDECAR_ENV_KEY) != Some("true"))
        .map(|c| c.name.clone())
        .collect();
    sets.iter()
        .flat_map(|s| s.spec.containers.iter().chain(&s.spec.init_containers))
        .any(|c| own.contains(&c.container.name))
}

/// Two webhooks injecting the same SidecarSets into one pod — upstream's
/// `kruise-mutating-webhook-configuration` first (configurations are called in name order), then
/// ours, while both are installed during a switch — must give the pod the first one gave it:
/// injecting an injected pod changes nothing (the hash annotations' timestamps aside, equal here).
/// The exceptions, as upstream's: a `transferEnv` whose source is itself an injected sidecar
/// reads it as injected the second time, `patchPodMetadata` that cannot be applied twice
/// ([`patches_that_cannot_repeat`]), and a sidecar replacing an app container of its name.
#[test]
fn injecting_an_injected_pod_changes_nothing() {
    let mut g = Gen(0x2545_f491_4f6c_dd1d);
    let mut checked = 0;
    for round in 0..3000 {
        let p = gen_pod(&mut g);
        let sets: Vec<SelectedSidecarSet> =
            (0..g.below(4)).map(|_| gen_sidecarset(&mut g)).collect();
        if transfers_env_from_a_sidecar(&sets)
            || patches_that_cannot_repeat(&sets)
            || replaces_an_app_container(&p, &sets)
        {
            continue;
        }
        let Ok(once) = inject(&p, &sets, now()) else {
            continue;
        };
        if once.injected.is_empty() {
            continue;
        }
        let twice = inject(&once.pod, &sets, now())
            .unwrap_or_else(|e| panic!("round {round}: the second injection fails: {e}"));
        assert_eq!(
            serde_json::to_value(&twice.pod).expect("json"),
            serde_json::to_value(&once.pod).expect("json"),
            "round {round}"
        );
        assert_eq!(twice.injected, once.injected, "round {round}");
        checked += 1;
    }
    assert!(checked > 200, "only {checked} pods injected");
}

#[test]
fn hot_upgrade_sidecars_are_injected_as_twins_built_like_any_sidecar() {
    let hot = json!({"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "empty:1"});
    let mesh = selected(json!({
        "metadata": {"name": "mesh"},
        "spec": {
            "selector": {"matchLabels": {"app": "suxing-test"}},
            "containers": [{"name": "proxy", "image": "proxy:1", "upgradeStrategy": hot,
                            "shareVolumePolicy": {"type": "enabled"}}],
        }
    }));
    let edge = selected(json!({
        "metadata": {"name": "edge"},
        "spec": {
            "selector": {"matchLabels": {"app": "suxing-test"}},
            "initContainers": [{"name": "envoy", "image": "envoy:1", "restartPolicy": "Always",
                                "upgradeStrategy": hot}],
        }
    }));
    let mut p = pod1();
    // An entry from an earlier injection stays in the working map.
    p["metadata"]["annotations"] =
        json!({"kruise.io/sidecarset-working-hotupgrade-container": r#"{"old":"old-2"}"#});
    let out = run(&pod(p), &[mesh, edge]).pod;

    assert_eq!(container_names(&out), ["proxy-1", "proxy-2", "nginx"]);
    assert_eq!(init_names(&out), ["init-0", "envoy-1", "envoy-2"]);
    let spec = spec(&out);
    let (first, second) = (
        container(&spec.containers, "proxy-1"),
        container(&spec.containers, "proxy-2"),
    );
    assert_eq!(first.image.as_deref(), Some("proxy:1"));
    assert_eq!(second.image.as_deref(), Some("empty:1"));
    for twin in [first, second] {
        // Built from the injected container: shared mounts and IS_INJECTED, then the versions.
        assert_eq!(mount_paths(twin), ["/a/b", "/e/f"]);
        assert_eq!(
            env_names(twin),
            [
                SIDECAR_ENV_KEY,
                "SIDECARSET_VERSION",
                "SIDECARSET_VERSION_ALT"
            ]
        );
    }
    let init = spec.init_containers.as_deref().expect("init containers");
    assert_eq!(container(init, "envoy-2").image.as_deref(), Some("empty:1"));
    assert_eq!(
        container(init, "envoy-2").restart_policy.as_deref(),
        Some("Always")
    );

    assert_eq!(
        annotation(&out, "kruise.io/sidecarset-working-hotupgrade-container"),
        Some(r#"{"envoy":"envoy-1","old":"old-2","proxy":"proxy-1"}"#)
    );
    for (twin, version, alt) in [
        ("proxy-1", "1", "0"),
        ("proxy-2", "0", "1"),
        ("envoy-1", "1", "0"),
    ] {
        assert_eq!(
            annotation(&out, &format!("version.sidecarset.kruise.io/{twin}")),
            Some(version)
        );
        assert_eq!(
            annotation(&out, &format!("versionalt.sidecarset.kruise.io/{twin}")),
            Some(alt)
        );
    }
    // The hash entry lists the sidecar, not its twins.
    let hashes = parse_hashes(
        SIDECARSET_HASH,
        annotation(&out, SIDECARSET_HASH).expect("hash"),
    )
    .expect("hashes");
    assert_eq!(hashes["mesh"].sidecar_list, Some(vec!["proxy".to_owned()]));
}

#[test]
fn a_twin_named_like_a_pod_container_is_a_conflict() {
    let mesh = selected(json!({
        "metadata": {"name": "mesh"},
        "spec": {
            "selector": {"matchLabels": {"app": "suxing-test"}},
            "containers": [{"name": "nginx", "image": "proxy:1",
                "upgradeStrategy": {"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "empty:1"}}],
        }
    }));
    let mut p = pod1();
    p["spec"]["initContainers"] = json!([{"name": "nginx-2", "image": "busybox"}]);
    let err = inject(&pod(p), &[mesh], now()).expect_err("conflict");
    assert!(err.to_string().contains("nginx-2"), "{err}");
}

#[test]
fn container_fields_newer_than_the_types_are_handed_on_for_every_injected_copy() {
    let rules = json!([{"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]);
    let mesh = selected(json!({
        "metadata": {"name": "mesh"},
        "spec": {
            "selector": {"matchLabels": {"app": "suxing-test"}},
            "containers": [
                {"name": "proxy", "image": "proxy:1", "restartPolicy": "Never",
                 "restartPolicyRules": rules,
                 "upgradeStrategy": {"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "empty:1"}},
                {"name": "plain", "image": "plain:1"},
            ],
        }
    }));
    let injection = run(&pod(pod1()), &[mesh]);
    let expected = BTreeMap::from([("restartPolicyRules".to_owned(), rules)]);
    assert_eq!(
        injection.unknown_fields,
        BTreeMap::from([
            ("plain".to_owned(), BTreeMap::new()),
            ("proxy-1".to_owned(), expected.clone()),
            ("proxy-2".to_owned(), expected),
        ])
    );
    // The typed container keeps what it knows.
    assert_eq!(
        container(&spec(&injection.pod).containers, "proxy-1")
            .restart_policy
            .as_deref(),
        Some("Never")
    );
}

#[test]
fn containers_go_in_by_name_only_when_asked() {
    let set = |name: &str, containers: Value| {
        selected(json!({
            "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": "suxing-test"}}, "containers": containers}
        }))
    };
    let sets = [
        set(
            "a-set",
            json!([{"name": "zeta", "image": "z:1"}, {"name": "beta", "image": "b:1"},
                   {"name": "omega", "image": "o:1", "podInjectPolicy": "AfterAppContainer"},
                   {"name": "gamma", "image": "g:1", "podInjectPolicy": "AfterAppContainer"}]),
        ),
        set("b-set", json!([{"name": "alpha", "image": "a:1"}])),
    ];
    let p = pod(pod1());
    let app = container_names(&p);
    let with_app = |before: &[&str], after: &[&str]| -> Vec<String> {
        before
            .iter()
            .chain(&app)
            .chain(after)
            .map(|s| s.to_string())
            .collect()
    };
    // By default: SidecarSet name, then the order each declares.
    let default = run(&p, &sets);
    assert_eq!(
        container_names(&default.pod),
        with_app(&["zeta", "beta", "alpha"], &["omega", "gamma"])
    );
    let sorted = inject_with(
        &p,
        &sets,
        now(),
        InjectionOptions {
            sort_containers_by_name: true,
        },
    )
    .expect("injection succeeds");
    assert_eq!(
        container_names(&sorted.pod),
        with_app(&["alpha", "beta", "zeta"], &["gamma", "omega"])
    );
}
