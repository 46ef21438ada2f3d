use super::*;
use kruise_rs_api::sidecarset::{PodInjectPolicy, SidecarSetSpec};
use serde_json::json;

fn sidecar(value: serde_json::Value) -> SidecarContainer {
    serde_json::from_value(value).expect("sidecar")
}

fn hot(name: &str, image: &str, empty: &str) -> SidecarContainer {
    sidecar(json!({
        "name": name, "image": image,
        "upgradeStrategy": {"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": empty},
    }))
}

fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn env_json(c: &SidecarContainer) -> serde_json::Value {
    serde_json::to_value(&c.container.env).expect("env")
}

// --- names ------------------------------------------------------------------------------------

#[test]
fn twin_names_are_upstreams() {
    assert_eq!(twin_names("mesh"), ["mesh-1", "mesh-2"]);
    assert_eq!(twin_name("envoy", Twin::Second), "envoy-2");
    assert_eq!(Twin::First.other(), Twin::Second);
    assert_eq!(Twin::Second.other(), Twin::First);
}

#[test]
fn is_twin_of_accepts_exactly_the_two_twins() {
    assert!(is_twin_of("mesh-1", "mesh"));
    assert!(is_twin_of("mesh-2", "mesh"));
    assert_eq!(twin_of("mesh-2", "mesh"), Some(Twin::Second));
    for not in [
        "mesh", "mesh-3", "mesh-10", "mesh-", "mesh1", "xmesh-1", "mes-1", "", "-1",
    ] {
        assert!(!is_twin_of(not, "mesh"), "{not}");
    }
    // A sidecar whose own name ends in a digit still has exactly two twins.
    assert!(is_twin_of("mesh-1-1", "mesh-1"));
    assert!(!is_twin_of("mesh-1", "mesh-1"));
    // Empty sidecar names (never valid) do not panic.
    assert!(is_twin_of("-1", ""));
}

#[test]
fn annotation_keys_and_env_names_are_upstreams() {
    assert_eq!(
        version_annotation("mesh-1"),
        "version.sidecarset.kruise.io/mesh-1"
    );
    assert_eq!(
        version_alt_annotation("mesh-2"),
        "versionalt.sidecarset.kruise.io/mesh-2"
    );
    assert_eq!(
        SIDECARSET_WORKING_HOTUPGRADE_CONTAINER,
        "kruise.io/sidecarset-working-hotupgrade-container"
    );
    assert_eq!(SIDECARSET_VERSION_ENV, "SIDECARSET_VERSION");
    assert_eq!(SIDECARSET_VERSION_ALT_ENV, "SIDECARSET_VERSION_ALT");
}

#[test]
fn version_env_is_upstreams_downward_api_reference() {
    let golden = json!([
        {"name": "SIDECARSET_VERSION", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['version.sidecarset.kruise.io/dns-f-1']"}}},
        {"name": "SIDECARSET_VERSION_ALT", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['versionalt.sidecarset.kruise.io/dns-f-1']"}}},
    ]);
    assert_eq!(
        serde_json::to_value(version_env("dns-f-1")).expect("json"),
        golden
    );
}

// --- injection --------------------------------------------------------------------------------

#[test]
fn twins_are_the_sidecar_twice_with_the_idle_one_on_the_empty_image() {
    let mut s = hot("mesh", "mesh:1", "mesh:empty");
    s.container.env = Some(vec![EnvVar {
        name: "A".into(),
        value: Some("b".into()),
        ..Default::default()
    }]);
    s.container.args = Some(vec!["--serve".into()]);
    let twins = inject_twins(&s).expect("twins");

    assert_eq!(twins.working.container.name, "mesh-1");
    assert_eq!(twins.working.container.image.as_deref(), Some("mesh:1"));
    assert_eq!(twins.idle.container.name, "mesh-2");
    assert_eq!(twins.idle.container.image.as_deref(), Some("mesh:empty"));
    // Everything else is the sidecar's, upgrade strategy included (upstream deep-copies).
    for t in [&twins.working, &twins.idle] {
        assert_eq!(t.container.args, s.container.args);
        assert_eq!(t.upgrade_strategy, s.upgrade_strategy);
    }
    // Own env first, then the two version vars pointing at the twin's own annotations.
    assert_eq!(
        env_json(&twins.idle),
        json!([
            {"name": "A", "value": "b"},
            {"name": "SIDECARSET_VERSION", "valueFrom": {"fieldRef": {
                "fieldPath": "metadata.annotations['version.sidecarset.kruise.io/mesh-2']"}}},
            {"name": "SIDECARSET_VERSION_ALT", "valueFrom": {"fieldRef": {
                "fieldPath": "metadata.annotations['versionalt.sidecarset.kruise.io/mesh-2']"}}},
        ])
    );
    assert_eq!(
        twins.annotations,
        annotations(&[
            ("version.sidecarset.kruise.io/mesh-1", "1"),
            ("versionalt.sidecarset.kruise.io/mesh-1", "0"),
            ("version.sidecarset.kruise.io/mesh-2", "0"),
            ("versionalt.sidecarset.kruise.io/mesh-2", "1"),
        ])
    );
    assert_eq!(
        twins.working_entry("mesh"),
        ("mesh".to_owned(), "mesh-1".to_owned())
    );
}

#[test]
fn a_sidecar_without_env_gets_just_the_version_vars() {
    let twins = inject_twins(&hot("mesh", "mesh:1", "e:1")).expect("twins");
    let env = twins.working.container.env.expect("env");
    let names: Vec<_> = env.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["SIDECARSET_VERSION", "SIDECARSET_VERSION_ALT"]);
}

#[test]
fn a_missing_or_empty_empty_image_is_an_error_naming_the_field() {
    for strategy in [
        json!({"upgradeType": "HotUpgrade"}),
        json!({"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": ""}),
    ] {
        let s = sidecar(json!({"name": "mesh", "image": "m:1", "upgradeStrategy": strategy}));
        let err = inject_twins(&s).expect_err("no empty image");
        assert_eq!(err, HotUpgradeError::MissingEmptyImage("mesh".into()));
        assert!(
            err.to_string()
                .contains("upgradeStrategy.hotUpgradeEmptyImage"),
            "{err}"
        );
        let mut working = BTreeMap::new();
        assert!(expand([s], false, &mut working).is_err());
    }
}

/// Upstream's TestInjectHotUpgradeSidecar, re-expressed: sidecarset1's `dns-f`
/// (BeforeAppContainer) made HotUpgrade with empty image `busy:hotupgrade-empty`, beside the
/// cold `log-agent` (AfterAppContainer), injected into a pod with one app container `nginx`.
/// Upstream checks: four containers; the first on the real image, the second on the empty one;
/// the working map says `dns-f` → `dns-f-1`; `dns-f-1` version "1", `dns-f-2` version "0".
#[test]
fn upstream_inject_hot_upgrade_sidecar() {
    let spec: SidecarSetSpec = serde_json::from_value(json!({
        "selector": {"matchLabels": {"app": "suxing-test"}},
        "containers": [
            {"name": "dns-f", "image": "dns-f-image:1.0", "podInjectPolicy": "BeforeAppContainer",
             "shareVolumePolicy": {"type": "disabled"},
             "upgradeStrategy": {"upgradeType": "HotUpgrade",
                                 "hotUpgradeEmptyImage": "busy:hotupgrade-empty"}},
            {"name": "log-agent", "image": "log-agent-image:1.0",
             "podInjectPolicy": "AfterAppContainer", "shareVolumePolicy": {"type": "disabled"}},
        ],
    }))
    .expect("spec");
    let mut working = BTreeMap::new();
    let out = expand(spec.containers.clone(), false, &mut working).expect("expand");

    // Placement as injection does it: BeforeAppContainer first, the app, then the rest.
    let before: Vec<_> = out
        .containers
        .iter()
        .filter(|c| c.pod_inject_policy == Some(PodInjectPolicy::BeforeAppContainer))
        .map(|c| (c.container.name.as_str(), c.container.image.as_deref()))
        .collect();
    let after: Vec<_> = out
        .containers
        .iter()
        .filter(|c| c.pod_inject_policy != Some(PodInjectPolicy::BeforeAppContainer))
        .map(|c| (c.container.name.as_str(), c.container.image.as_deref()))
        .collect();
    let pod: Vec<_> = before
        .into_iter()
        .chain([("nginx", Some("nginx:1.15.1"))])
        .chain(after)
        .collect();
    assert_eq!(
        pod,
        [
            ("dns-f-1", Some("dns-f-image:1.0")),
            ("dns-f-2", Some("busy:hotupgrade-empty")),
            ("nginx", Some("nginx:1.15.1")),
            ("log-agent", Some("log-agent-image:1.0")),
        ]
    );
    assert_eq!(
        twins_of(&out.annotations).get("dns-f").map(String::as_str),
        Some("dns-f-1")
    );
    assert_eq!(
        twin_versions("dns-f-1", Some(&out.annotations)).version,
        Some("1")
    );
    assert_eq!(
        twin_versions("dns-f-2", Some(&out.annotations)).version,
        Some("0")
    );
    // The whole annotation set, in upstream's bytes.
    assert_eq!(
        out.annotations,
        annotations(&[
            (
                "kruise.io/sidecarset-working-hotupgrade-container",
                r#"{"dns-f":"dns-f-1"}"#
            ),
            ("version.sidecarset.kruise.io/dns-f-1", "1"),
            ("versionalt.sidecarset.kruise.io/dns-f-1", "0"),
            ("version.sidecarset.kruise.io/dns-f-2", "0"),
            ("versionalt.sidecarset.kruise.io/dns-f-2", "1"),
        ])
    );
    // The cold sidecar is untouched: no version env.
    assert_eq!(out.containers[2], spec.containers[1]);
}

#[test]
fn expand_without_hot_upgrade_writes_no_annotation() {
    let cold = sidecar(json!({"name": "log", "image": "l:1"}));
    let mut working = annotations(&[("mesh", "mesh-2")]);
    let out = expand([cold.clone()], false, &mut working).expect("expand");
    assert_eq!(out.containers, [cold]);
    assert!(out.annotations.is_empty());
    assert_eq!(working, annotations(&[("mesh", "mesh-2")]));
}

#[test]
fn the_working_map_carries_across_sidecarsets_and_existing_entries() {
    // The pod already records envoy (from its annotation, or an earlier SidecarSet).
    let mut working = annotations(&[("envoy", "envoy-2")]);
    let out = expand(
        [hot("mesh", "m:1", "e:1"), hot("dns", "d:1", "e:1")],
        false,
        &mut working,
    )
    .expect("expand");
    assert_eq!(
        out.annotations[SIDECARSET_WORKING_HOTUPGRADE_CONTAINER],
        r#"{"dns":"dns-1","envoy":"envoy-2","mesh":"mesh-1"}"#
    );
    let names: Vec<_> = out.containers.iter().map(|c| &c.container.name).collect();
    assert_eq!(names, ["mesh-1", "mesh-2", "dns-1", "dns-2"]);
    assert_eq!(out.annotations.len(), 9);
}

#[test]
fn init_containers_get_twins_only_when_native_sidecars() {
    let mut native = hot("proxy", "p:1", "e:1");
    native.container.restart_policy = Some("Always".into());
    let plain = hot("setup", "s:1", "e:1");
    assert!(injects_twins(&native, true));
    assert!(!injects_twins(&plain, true));
    assert!(injects_twins(&plain, false));

    let mut working = BTreeMap::new();
    let out = expand([plain.clone(), native], true, &mut working).expect("expand");
    let names: Vec<_> = out.containers.iter().map(|c| &c.container.name).collect();
    assert_eq!(names, ["setup", "proxy-1", "proxy-2"]);
    assert_eq!(out.containers[0], plain);
    assert_eq!(working, annotations(&[("proxy", "proxy-1")]));
}

// --- reading what upstream wrote --------------------------------------------------------------

#[test]
fn working_annotation_is_gos_marshal_of_the_map() {
    assert_eq!(working_annotation(&BTreeMap::new()), "{}");
    assert_eq!(
        working_annotation(&annotations(&[("mesh", "mesh-1"), ("envoy", "envoy-2")])),
        r#"{"envoy":"envoy-2","mesh":"mesh-1"}"#
    );
    // Go escapes HTML characters; names are DNS labels, but the writer is total.
    assert_eq!(
        working_annotation(&annotations(&[("a<b", "c&d")])),
        r#"{"a\u003cb":"c\u0026d"}"#
    );
}

#[test]
fn working_twins_reads_upstreams_annotation() {
    let pod = annotations(&[(
        "kruise.io/sidecarset-working-hotupgrade-container",
        r#"{"envoy":"envoy-2","mesh":"mesh-1"}"#,
    )]);
    let working = twins_of(&pod);
    assert_eq!(
        working,
        annotations(&[("envoy", "envoy-2"), ("mesh", "mesh-1")])
    );
    // Round trip, byte for byte.
    assert_eq!(
        working_annotation(&working),
        pod[SIDECARSET_WORKING_HOTUPGRADE_CONTAINER]
    );
    assert_eq!(
        twin_roles("envoy", &working),
        TwinRoles {
            working: "envoy-2".into(),
            other: "envoy-1".into()
        }
    );
    assert_eq!(
        twin_roles("mesh", &working),
        TwinRoles {
            working: "mesh-1".into(),
            other: "mesh-2".into()
        }
    );
}

#[test]
fn working_twins_is_lenient_like_upstream() {
    let read = |v: &str| {
        twins_of(&annotations(&[(
            SIDECARSET_WORKING_HOTUPGRADE_CONTAINER,
            v,
        )]))
    };
    assert!(working_twins(None).is_empty());
    assert!(twins_of(&BTreeMap::new()).is_empty());
    for bad in [
        "",
        "not json",
        "null",
        "[]",
        r#""mesh-1""#,
        "{",
        r#"{"mesh":"mesh-1""#,
    ] {
        assert!(read(bad).is_empty(), "{bad}");
    }
    // Non-string values are skipped, the other entries kept.
    assert_eq!(
        read(r#"{"mesh":"mesh-1","bad":1,"worse":{"x":"y"},"gone":null}"#),
        annotations(&[("mesh", "mesh-1")])
    );
    // Unicode escapes as Go may write them.
    assert_eq!(
        read(r#"{"m\u0065sh":"mesh-2"}"#),
        annotations(&[("mesh", "mesh-2")])
    );
}

#[test]
fn twin_roles_falls_back_to_the_second_twin_as_upstream_does() {
    let none = BTreeMap::new();
    assert_eq!(
        twin_roles("mesh", &none),
        TwinRoles {
            working: "mesh-2".into(),
            other: "mesh-1".into()
        }
    );
    let odd = annotations(&[("mesh", "envoy-1")]);
    assert_eq!(twin_roles("mesh", &odd).working, "mesh-2");
}

#[test]
fn twin_versions_read_each_twin_and_know_the_empty_one() {
    // A pod mid-way through upstream's upgrade: mesh-2 upgraded at resourceVersion 3456,
    // mesh-1 still on the older version, not yet flipped to the empty image.
    let pod = annotations(&[
        ("version.sidecarset.kruise.io/mesh-1", "1"),
        ("versionalt.sidecarset.kruise.io/mesh-1", "3456"),
        ("version.sidecarset.kruise.io/mesh-2", "3456"),
        ("versionalt.sidecarset.kruise.io/mesh-2", "1"),
    ]);
    let v1 = twin_versions("mesh-1", Some(&pod));
    assert_eq!((v1.version, v1.alt), (Some("1"), Some("3456")));
    assert!(!v1.is_empty());
    let v2 = twin_versions("mesh-2", Some(&pod));
    assert_eq!((v2.version, v2.alt), (Some("3456"), Some("1")));
    // After the flip upstream writes "0" on the old twin and on the working twin's alt.
    let flipped = annotations(&[
        ("version.sidecarset.kruise.io/mesh-1", "0"),
        ("versionalt.sidecarset.kruise.io/mesh-2", "0"),
    ]);
    assert!(twin_versions("mesh-1", Some(&flipped)).is_empty());
    assert_eq!(twin_versions("mesh-2", Some(&flipped)).alt, Some("0"));
    assert_eq!(twin_versions("mesh-3", Some(&pod)), TwinVersions::default());
    assert_eq!(twin_versions("mesh-1", None), TwinVersions::default());
}

#[test]
fn pod_has_twins_needs_both_twins_and_a_working_entry() {
    let working = annotations(&[("mesh", "mesh-1")]);
    assert!(pod_has_twins("mesh", ["app", "mesh-2", "mesh-1"], &working));
    assert!(!pod_has_twins("mesh", ["app", "mesh-1"], &working));
    assert!(!pod_has_twins("mesh", ["app", "mesh"], &working));
    assert!(!pod_has_twins(
        "mesh",
        ["mesh-1", "mesh-2"],
        &BTreeMap::new()
    ));
    // Upstream checks only that an entry exists, whatever it names.
    let odd = annotations(&[("mesh", "")]);
    assert!(pod_has_twins("mesh", ["mesh-1", "mesh-2"], &odd));
}

#[test]
fn an_injected_pod_reads_back_consistently() {
    let mut working = BTreeMap::new();
    let out = expand([hot("mesh", "m:1", "e:1")], false, &mut working).expect("expand");
    let read = twins_of(&out.annotations);
    let names: Vec<&str> = out
        .containers
        .iter()
        .map(|c| c.container.name.as_str())
        .collect();
    assert!(pod_has_twins("mesh", names, &read));
    let roles = twin_roles("mesh", &read);
    assert_eq!(roles.working, "mesh-1");
    assert_eq!(
        twin_versions(&roles.working, Some(&out.annotations)).version,
        Some("1")
    );
    assert!(twin_versions(&roles.other, Some(&out.annotations)).is_empty());
}

// --- the annotations the controller will write (upstream's e2e sequence) ------------------------

#[test]
fn upgrade_then_flip_then_upgrade_back_as_upstreams_e2e() {
    let mut working = BTreeMap::new();
    let mut pod = expand([hot("nginx", "nginx:1", "busybox:1")], false, &mut working)
        .expect("expand")
        .annotations;

    // New image: the twin on the empty image (-2) is upgraded at resourceVersion 100.
    record_upgrade(&mut pod, "nginx", Twin::Second, "100");
    assert_eq!(
        pod,
        annotations(&[
            (
                "kruise.io/sidecarset-working-hotupgrade-container",
                r#"{"nginx":"nginx-2"}"#
            ),
            ("version.sidecarset.kruise.io/nginx-1", "1"),
            ("versionalt.sidecarset.kruise.io/nginx-1", "100"),
            ("version.sidecarset.kruise.io/nginx-2", "100"),
            ("versionalt.sidecarset.kruise.io/nginx-2", "1"),
        ])
    );
    let roles = twin_roles("nginx", &twins_of(&pod));
    assert_eq!(roles.working, "nginx-2");

    // Flip: the old twin goes to the empty image.
    record_flip(&mut pod, &roles);
    assert!(twin_versions("nginx-1", Some(&pod)).is_empty());
    assert_eq!(
        twin_versions("nginx-2", Some(&pod)),
        TwinVersions {
            version: Some("100"),
            alt: Some("0")
        }
    );

    // Back to the first image at resourceVersion 200: -1 (now empty) is upgraded.
    record_upgrade(&mut pod, "nginx", Twin::First, "200");
    assert_eq!(
        pod[SIDECARSET_WORKING_HOTUPGRADE_CONTAINER],
        r#"{"nginx":"nginx-1"}"#
    );
    assert_eq!(
        twin_versions("nginx-1", Some(&pod)),
        TwinVersions {
            version: Some("200"),
            alt: Some("100")
        }
    );
    assert_eq!(twin_versions("nginx-2", Some(&pod)).alt, Some("200"));
}

#[test]
fn record_upgrade_keeps_other_sidecars_and_copies_a_missing_version_as_empty() {
    let mut pod = annotations(&[(
        SIDECARSET_WORKING_HOTUPGRADE_CONTAINER,
        r#"{"envoy":"envoy-1","mesh":"mesh-1"}"#,
    )]);
    record_upgrade(&mut pod, "mesh", Twin::Second, "7");
    assert_eq!(
        pod[SIDECARSET_WORKING_HOTUPGRADE_CONTAINER],
        r#"{"envoy":"envoy-1","mesh":"mesh-2"}"#
    );
    assert_eq!(twin_versions("mesh-2", Some(&pod)).alt, Some(""));
    assert_eq!(twin_versions("mesh-1", Some(&pod)).alt, Some("7"));
}

/// The working twins recorded in `annotations`.
fn twins_of(annotations: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    working_twins(
        annotations
            .get(SIDECARSET_WORKING_HOTUPGRADE_CONTAINER)
            .map(String::as_str),
    )
}
