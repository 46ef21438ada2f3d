use super::*;
use serde_json::json;

fn dynamic(raw: &Value) -> DynamicObject {
    serde_json::from_value(raw.clone()).expect("a DynamicObject")
}

/// `patch` applied to `raw`.
fn applied(raw: &Value, patch: &Patch) -> Value {
    let mut patched = raw.clone();
    json_patch::patch(&mut patched, patch).expect("the patch applies");
    patched
}

#[test]
fn fields_the_typed_pod_does_not_know_survive_injection() {
    let raw = json!({
        "metadata": {"name": "p", "labels": {"app": "web"}},
        "spec": {
            "containers": [{"name": "main", "image": "nginx", "futureField": {"x": 1}}],
            "futureSpecField": true
        }
    });
    let before: Pod = serde_json::from_value(raw.clone()).unwrap();
    let mut after = before.clone();
    let spec = after.spec.as_mut().unwrap();
    spec.containers.insert(
        0,
        serde_json::from_value(json!({"name": "sidecar", "image": "busybox"})).unwrap(),
    );
    after
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("a".into(), "b".into());
    let patch = patch_preserving(&dynamic(&raw), &before, &after, &BTreeMap::new()).unwrap();
    let patched = applied(&raw, &patch);
    assert_eq!(patched["spec"]["containers"][0]["name"], "sidecar");
    assert_eq!(
        patched["spec"]["containers"][1]["futureField"],
        json!({"x": 1})
    );
    assert_eq!(patched["spec"]["futureSpecField"], true);
    assert_eq!(patched["metadata"]["annotations"]["a"], "b");
}

#[test]
fn changed_containers_keep_unknown_fields_and_injected_ones_get_their_sidecars() {
    let raw = json!({
        "metadata": {"name": "p"},
        "spec": {
            "containers": [{"name": "main", "image": "nginx", "futureField": 1}],
        }
    });
    let before: Pod = serde_json::from_value(raw.clone()).unwrap();
    let mut after = before.clone();
    let spec = after.spec.as_mut().unwrap();
    // The injection changes the app container (a shared mount) and adds a sidecar and a
    // volume of the same name.
    spec.containers[0].volume_mounts = Some(vec![
        serde_json::from_value(json!({"name": "proxy", "mountPath": "/p"})).unwrap(),
    ]);
    spec.containers.insert(
        0,
        serde_json::from_value(
            json!({"name": "proxy", "image": "envoy", "restartPolicy": "Never"}),
        )
        .unwrap(),
    );
    spec.volumes = Some(vec![
        serde_json::from_value(json!({"name": "proxy", "emptyDir": {}})).unwrap(),
    ]);
    let rules = json!([{"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]);
    let unknown = BTreeMap::from([(
        "proxy".to_owned(),
        BTreeMap::from([("restartPolicyRules".to_owned(), rules.clone())]),
    )]);
    let patch = patch_preserving(&dynamic(&raw), &before, &after, &unknown).unwrap();
    let patched = applied(&raw, &patch);
    assert_eq!(
        patched["spec"]["containers"],
        json!([
            {"name": "proxy", "image": "envoy", "restartPolicy": "Never", "restartPolicyRules": rules},
            {"name": "main", "image": "nginx", "futureField": 1,
             "volumeMounts": [{"name": "proxy", "mountPath": "/p"}]},
        ])
    );
    assert_eq!(
        patched["spec"]["volumes"],
        json!([{"name": "proxy", "emptyDir": {}}])
    );
}

#[test]
fn a_sidecar_replacing_a_pod_container_gets_its_own_unknown_fields_not_the_replaced_ones() {
    let raw = json!({
        "metadata": {"name": "p"},
        "spec": {"containers": [
            {"name": "proxy", "image": "old", "futureField": 1},
            {"name": "main", "image": "nginx"},
        ]}
    });
    let before: Pod = serde_json::from_value(raw.clone()).unwrap();
    let mut after = before.clone();
    after.spec.as_mut().unwrap().containers[0] =
        serde_json::from_value(json!({"name": "proxy", "image": "envoy"})).unwrap();
    let unknown = BTreeMap::from([(
        "proxy".to_owned(),
        BTreeMap::from([("otherField".to_owned(), json!(2))]),
    )]);
    let patch = patch_preserving(&dynamic(&raw), &before, &after, &unknown).unwrap();
    let patched = applied(&raw, &patch);
    assert_eq!(
        patched["spec"]["containers"],
        json!([
            {"name": "proxy", "image": "envoy", "otherField": 2},
            {"name": "main", "image": "nginx"},
        ])
    );
}

#[test]
fn an_untouched_pod_gives_an_empty_patch() {
    let raw = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "m", "image": "i", "new": 1}]}});
    let pod: Pod = serde_json::from_value(raw.clone()).unwrap();
    assert!(
        patch_preserving(&dynamic(&raw), &pod, &pod, &BTreeMap::new())
            .unwrap()
            .0
            .is_empty()
    );
}

/// A pod as the apiserver hands it over, with labels, no annotations and two containers.
fn app_pod() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "labels": {"app": "web"}},
        "spec": {
            "containers": [
                {"name": "main", "image": "nginx", "env": [{"name": "A", "value": "1"}]},
                {"name": "helper", "image": "busybox"},
            ],
            "restartPolicy": "Always",
        }
    })
}

fn container(name: &str) -> k8s_openapi::api::core::v1::Container {
    serde_json::from_value(json!({"name": name, "image": format!("{name}:1")})).unwrap()
}

#[test]
fn each_changed_field_is_one_operation_and_the_result_is_the_injected_pod() {
    let raw = app_pod();
    let before: Pod = serde_json::from_value(raw.clone()).unwrap();
    let mut after = before.clone();
    let spec = after.spec.as_mut().unwrap();
    for (i, name) in ["s1", "s2", "s3"].into_iter().enumerate() {
        spec.containers.insert(i, container(name));
    }
    spec.init_containers = Some(vec![container("init")]);
    spec.volumes = Some(vec![
        serde_json::from_value(json!({"name": "shared", "emptyDir": {}})).unwrap(),
    ]);
    after.metadata.annotations = Some(BTreeMap::from([("k".into(), "v".into())]));
    let patch = patch_preserving(&dynamic(&raw), &before, &after, &BTreeMap::new()).unwrap();
    let ops: Vec<(String, String)> = patch
        .0
        .iter()
        .map(|op| {
            let op = serde_json::to_value(op).unwrap();
            (
                op["op"].as_str().unwrap().to_owned(),
                op["path"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expected = [
        ("add", "/metadata/annotations"),
        ("replace", "/spec/containers"),
        ("add", "/spec/initContainers"),
        ("add", "/spec/volumes"),
    ]
    .map(|(op, path)| (op.to_owned(), path.to_owned()));
    assert_eq!(ops, expected);
    let patched: Pod = serde_json::from_value(applied(&raw, &patch)).unwrap();
    assert_eq!(patched, after);
}

#[test]
fn labels_and_annotations_there_are_replaced_and_left_alone_when_unchanged() {
    let mut raw = app_pod();
    raw["metadata"]["annotations"] = json!({"old": "x"});
    let before: Pod = serde_json::from_value(raw.clone()).unwrap();
    let mut after = before.clone();
    after
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("new".into(), "y".into());
    let patch = patch_preserving(&dynamic(&raw), &before, &after, &BTreeMap::new()).unwrap();
    assert_eq!(
        serde_json::to_value(&patch).unwrap(),
        json!([{"op": "replace", "path": "/metadata/annotations", "value": {"old": "x", "new": "y"}}])
    );
}

#[test]
fn a_change_beyond_the_injected_fields_falls_back_to_the_whole_diff() {
    let raw = app_pod();
    let before: Pod = serde_json::from_value(raw.clone()).unwrap();
    let mut after = before.clone();
    let spec = after.spec.as_mut().unwrap();
    spec.containers.insert(0, container("s1"));
    spec.hostname = Some("changed".into());
    let patch = patch_preserving(&dynamic(&raw), &before, &after, &BTreeMap::new()).unwrap();
    let patched: Pod = serde_json::from_value(applied(&raw, &patch)).unwrap();
    assert_eq!(patched, after);
}

#[test]
fn a_list_the_injection_empties_is_removed() {
    let mut raw = app_pod();
    raw["spec"]["imagePullSecrets"] = json!([{"name": "s"}]);
    let before: Pod = serde_json::from_value(raw.clone()).unwrap();
    let mut after = before.clone();
    after.spec.as_mut().unwrap().image_pull_secrets = None;
    let patch = patch_preserving(&dynamic(&raw), &before, &after, &BTreeMap::new()).unwrap();
    assert_eq!(
        serde_json::to_value(&patch).unwrap(),
        json!([{"op": "remove", "path": "/spec/imagePullSecrets"}])
    );
}
