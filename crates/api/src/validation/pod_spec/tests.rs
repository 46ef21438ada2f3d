use super::*;
use crate::validation::ErrorKind;
use serde_json::json;

fn container(v: serde_json::Value) -> Container {
    serde_json::from_value(v).expect("test container")
}

fn volume(v: serde_json::Value) -> Volume {
    serde_json::from_value(v).expect("test volume")
}

fn ok_container(name: &str) -> Container {
    container(json!({"name": name, "image": "busybox"}))
}

fn check(init: &[Container], containers: &[Container], volumes: &[Volume]) -> Vec<FieldError> {
    let init: Vec<&Container> = init.iter().collect();
    let containers: Vec<&Container> = containers.iter().collect();
    validate_pod_parts(&init, &containers, volumes, "spec")
}

fn paths(errs: &[FieldError]) -> Vec<&str> {
    errs.iter().map(|e| e.path.as_str()).collect()
}

#[test]
fn downward_api_volume_items_are_checked_like_kubernetes() {
    let volumes = vec![volume(json!({"name": "d", "downwardAPI": {"items": [
        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
        {"path": "app", "fieldRef": {"fieldPath": "metadata.labels['app']"}},
        {"path": "node", "fieldRef": {"fieldPath": "spec.nodeName"}},
        {"path": "../x", "fieldRef": {"fieldPath": "metadata.name"}},
        {"path": "/abs", "fieldRef": {"fieldPath": "metadata.uid"}},
        {"path": "cpu", "resourceFieldRef": {"resource": "limits.cpu"}},
        {"path": "none"}
    ]}}))];
    let paths: Vec<String> = validate_volumes(&volumes, "spec.volumes")
        .into_iter()
        .map(|e| e.path)
        .collect();
    assert_eq!(
        paths,
        [
            "spec.volumes[0].downwardAPI.items[2].fieldRef.fieldPath",
            "spec.volumes[0].downwardAPI.items[3].path",
            "spec.volumes[0].downwardAPI.items[4].path",
            "spec.volumes[0].downwardAPI.items[5].resourceFieldRef.containerName",
            "spec.volumes[0].downwardAPI.items[6].fieldRef",
        ]
    );
}

#[test]
fn a_plain_sidecar_is_valid() {
    let c = container(json!({
        "name": "proxy",
        "image": "envoy:1",
        "imagePullPolicy": "IfNotPresent",
        "terminationMessagePolicy": "File",
        "ports": [{"name": "admin", "containerPort": 9901, "protocol": "TCP"}],
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}}],
        "volumeMounts": [{"name": "conf", "mountPath": "/etc/envoy"}],
        "livenessProbe": {"httpGet": {"port": 9901}, "successThreshold": 1}
    }));
    let v = volume(json!({"name": "conf", "configMap": {"name": "envoy"}}));
    assert_eq!(check(&[], &[c], &[v]), []);
}

#[test]
fn container_names_are_required_labels_and_unique_across_both_lists() {
    let errs = check(
        &[ok_container("a"), ok_container("b")],
        &[
            ok_container("a"),
            ok_container("Bad_Name"),
            ok_container(""),
            ok_container("c"),
            ok_container("c"),
        ],
        &[],
    );
    assert_eq!(
        paths(&errs),
        [
            "spec.containers[1].name",
            "spec.containers[2].name",
            "spec.containers[4].name",
            "spec.initContainers[0].name",
        ]
    );
    assert_eq!(errs[0].kind, ErrorKind::Invalid);
    assert_eq!(
        errs[1].to_string(),
        "spec.containers[2].name: Required value"
    );
    assert_eq!(
        errs[2].to_string(),
        r#"spec.containers[4].name: Duplicate value: "c""#
    );
    assert_eq!(
        errs[3].to_string(),
        r#"spec.initContainers[0].name: Duplicate value: "a""#
    );
}

#[test]
fn image_is_required_without_surrounding_whitespace() {
    let errs = check(
        &[container(json!({"name": "init"}))],
        &[
            container(json!({"name": "a", "image": ""})),
            container(json!({"name": "b", "image": " busybox"})),
        ],
        &[],
    );
    assert_eq!(
        paths(&errs),
        [
            "spec.containers[0].image",
            "spec.containers[1].image",
            "spec.initContainers[0].image"
        ]
    );
    assert_eq!(errs[0].kind, ErrorKind::Required);
    assert_eq!(
        errs[1].message,
        "must not have leading or trailing whitespace"
    );
}

#[test]
fn pull_and_termination_policies_are_known_values_when_set() {
    let errs = check(
        &[],
        &[container(json!({
            "name": "a", "image": "x",
            "imagePullPolicy": "Sometimes",
            "terminationMessagePolicy": "Never"
        }))],
        &[],
    );
    assert_eq!(
        errs[0].to_string(),
        r#"spec.containers[0].imagePullPolicy: Unsupported value: "Sometimes": supported values: "Always", "IfNotPresent", "Never""#
    );
    assert_eq!(errs[1].path, "spec.containers[0].terminationMessagePolicy");
    assert_eq!(errs.len(), 2);
}

#[test]
fn restart_policy_only_always_and_only_on_init_containers() {
    let errs = check(
        &[
            container(json!({"name": "i1", "image": "x", "restartPolicy": "Always"})),
            container(json!({"name": "i2", "image": "x", "restartPolicy": "OnFailure"})),
        ],
        &[container(
            json!({"name": "a", "image": "x", "restartPolicy": "Always"}),
        )],
        &[],
    );
    assert_eq!(
        errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            "spec.containers[0].restartPolicy: Forbidden: may not be set for non-init containers",
            r#"spec.initContainers[1].restartPolicy: Unsupported value: "OnFailure": supported values: "Always""#,
        ]
    );
}

#[test]
fn plain_init_containers_may_not_have_probes_or_lifecycle_but_native_sidecars_may() {
    let probe = json!({"exec": {"command": ["true"]}});
    let errs = check(
        &[
            container(
                json!({"name": "plain", "image": "x", "readinessProbe": probe, "lifecycle": {}}),
            ),
            container(
                json!({"name": "native", "image": "x", "restartPolicy": "Always", "readinessProbe": probe}),
            ),
        ],
        &[],
        &[],
    );
    assert_eq!(
        paths(&errs),
        [
            "spec.initContainers[0].lifecycle",
            "spec.initContainers[0].readinessProbe"
        ]
    );
    assert_eq!(
        errs[0].message,
        "may not be set for init containers without restartPolicy=Always"
    );
}

#[test]
fn ports() {
    let errs = check(
        &[],
        &[container(json!({"name": "a", "image": "x", "ports": [
            {"name": "http", "containerPort": 80},
            {"name": "http", "containerPort": 81},
            {"name": "Bad--", "containerPort": 0},
            {"containerPort": 70000, "hostPort": 70000, "protocol": "HTTP"},
            {"containerPort": 82, "hostPort": 0}
        ]}))],
        &[],
    );
    assert_eq!(
        paths(&errs),
        [
            "spec.containers[0].ports[1].name",
            "spec.containers[0].ports[2].name",
            "spec.containers[0].ports[2].name",
            "spec.containers[0].ports[2].name",
            "spec.containers[0].ports[2].containerPort",
            "spec.containers[0].ports[3].containerPort",
            "spec.containers[0].ports[3].hostPort",
            "spec.containers[0].ports[3].protocol",
        ]
    );
    assert_eq!(errs[0].kind, ErrorKind::Duplicate);
    assert_eq!(
        errs[5].to_string(),
        "spec.containers[0].ports[3].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive"
    );
    assert_eq!(port_name_errors("a-b"), Vec::<String>::new());
    assert_eq!(
        port_name_errors("123"),
        ["must contain at least one letter (a-z)"]
    );
    assert_eq!(
        port_name_errors("abcdefghijklmnop"),
        ["must be no more than 15 characters"]
    );
}

#[test]
fn env_names_follow_the_relaxed_rule() {
    assert!(env_var_name_errors("1-weird.name with spaces").is_empty());
    assert_eq!(
        env_var_name_errors("A=B"),
        [
            "a valid environment variable name must consist only of printable ASCII characters other than '='"
        ]
    );
    assert_eq!(env_var_name_errors("é").len(), 1);
    assert_eq!(env_var_name_errors("tab\t").len(), 1);
    let errs = check(
        &[],
        &[container(
            json!({"name": "a", "image": "x", "env": [{"name": ""}, {"name": "X=1"}]}),
        )],
        &[],
    );
    assert_eq!(
        paths(&errs),
        [
            "spec.containers[0].env[0].name",
            "spec.containers[0].env[1].name"
        ]
    );
    assert_eq!(errs[0].kind, ErrorKind::Required);
}

#[test]
fn env_value_from_has_exactly_one_valid_source() {
    let errs = check(
        &[],
        &[container(json!({"name": "a", "image": "x", "env": [
            {"name": "A", "valueFrom": {}},
            {"name": "B", "value": "v", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}, "secretKeyRef": {"name": "s", "key": "k"}}},
            {"name": "D", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.containers"}}},
            {"name": "E", "valueFrom": {"fieldRef": {"apiVersion": "v2", "fieldPath": "metadata.name"}}},
            {"name": "F", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['bad key']"}}},
            {"name": "G", "valueFrom": {"configMapKeyRef": {"name": "Bad", "key": ".."}}},
            {"name": "H", "valueFrom": {"secretKeyRef": {"name": "s", "key": ""}}},
            {"name": "I", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['Example.com/Key']"}}},
            {"name": "J", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}}
        ]}))],
        &[],
    );
    let env = |s: &str| format!("spec.containers[0].env{s}");
    assert_eq!(
        paths(&errs),
        [
            env("[0].valueFrom"),
            env("[1].valueFrom"),
            env("[2].valueFrom"),
            env("[3].valueFrom.fieldRef.fieldPath"),
            env("[4].valueFrom.fieldRef.apiVersion"),
            env("[5].valueFrom.fieldRef"),
            env("[6].valueFrom.configMapKeyRef.name"),
            env("[6].valueFrom.configMapKeyRef.key"),
            env("[7].valueFrom.secretKeyRef.key"),
        ]
    );
    assert_eq!(
        errs[0].message,
        "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`"
    );
    assert_eq!(
        errs[1].message,
        "may not be specified when `value` is not empty"
    );
    assert_eq!(
        errs[2].message,
        "may not have more than one field specified at a time"
    );
    assert_eq!(errs[3].kind, ErrorKind::NotSupported);
    assert_eq!(errs[7].message, "must not be '..'");
}

#[test]
fn probes_need_one_handler_and_sane_numbers() {
    let errs = check(
        &[],
        &[container(json!({"name": "a", "image": "x",
            "livenessProbe": {"successThreshold": 2},
            "readinessProbe": {"exec": {"command": ["true"]}, "tcpSocket": {"port": 1}, "periodSeconds": -1, "successThreshold": 3},
            "startupProbe": {"grpc": {"port": 1}}
        }))],
        &[],
    );
    assert_eq!(
        errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            "spec.containers[0].livenessProbe: Required value: must specify a handler type",
            "spec.containers[0].livenessProbe.successThreshold: Invalid value: 2: must be 1",
            "spec.containers[0].readinessProbe.tcpSocket: Forbidden: may not specify more than 1 handler type",
            "spec.containers[0].readinessProbe.periodSeconds: Invalid value: -1: must be greater than or equal to 0",
        ]
    );
}

#[test]
fn volume_mounts_reference_volumes_with_unique_paths() {
    let errs = check(
        &[],
        &[container(
            json!({"name": "a", "image": "x", "volumeMounts": [
                {"name": "v", "mountPath": "/a"},
                {"name": "v", "mountPath": "/a"},
                {"name": "missing", "mountPath": "/b"},
                {"name": "", "mountPath": ""},
                {"name": "v", "mountPath": "/c", "subPath": "/abs"},
                {"name": "v", "mountPath": "/d", "subPath": "a/../b", "subPathExpr": "$(X)"},
                {"name": "v", "mountPath": "/e", "mountPropagation": "Bidirectional"},
                {"name": "v", "mountPath": "/f", "mountPropagation": "Sideways"}
            ]}),
        )],
        &[volume(json!({"name": "v", "emptyDir": {}}))],
    );
    let m = |s: &str| format!("spec.containers[0].volumeMounts{s}");
    assert_eq!(
        paths(&errs),
        [
            m("[1].mountPath"),
            m("[2].name"),
            m("[3].name"),
            m("[3].mountPath"),
            m("[4].subPath"),
            m("[5].subPath"),
            m("[5].subPathExpr"),
            m("[6].mountPropagation"),
            m("[7].mountPropagation"),
        ]
    );
    assert_eq!(errs[0].message, "must be unique");
    assert_eq!(
        errs[1].to_string(),
        r#"spec.containers[0].volumeMounts[2].name: Not found: "missing": no volume of this name in spec.volumes"#
    );
    assert_eq!(errs[4].message, "must be a relative path");
    assert_eq!(errs[5].message, "must not contain '..'");
    assert_eq!(
        errs[6].message,
        "subPathExpr and subPath are mutually exclusive"
    );
    assert_eq!(errs[7].kind, ErrorKind::Forbidden);
    assert_eq!(errs[8].kind, ErrorKind::NotSupported);

    // A privileged container may use Bidirectional propagation.
    let privileged = container(json!({"name": "a", "image": "x",
            "securityContext": {"privileged": true},
            "volumeMounts": [{"name": "v", "mountPath": "/e", "mountPropagation": "Bidirectional"}]}));
    assert_eq!(
        check(
            &[],
            &[privileged],
            &[volume(json!({"name": "v", "emptyDir": {}}))]
        ),
        []
    );
}

#[test]
fn upstream_volume_device_scenarios() {
    let pvc = volume(json!({"name": "disk0", "persistentVolumeClaim": {"claimName": "pvc-0"}}));
    let log = volume(json!({"name": "log", "emptyDir": {}}));
    // wrong-volumeDevice-volumes: the device names no volume.
    let c = container(json!({"name": "a", "image": "x",
            "volumeDevices": [{"name": "disk0", "devicePath": "/dev/nvme1"}]}));
    let errs = check(&[], std::slice::from_ref(&c), &[]);
    assert_eq!(paths(&errs), ["spec.containers[0].volumeDevices[0].name"]);
    assert_eq!(errs[0].kind, ErrorKind::NotFound);
    // right-volumeDevice-volumes
    assert_eq!(check(&[], &[c], std::slice::from_ref(&pvc)), []);
    // volumeDevice-volumeMount-path-conflict: reported from both sides.
    let c = container(json!({"name": "a", "image": "x",
            "volumeDevices": [{"name": "disk0", "devicePath": "/home/admin/log"}],
            "volumeMounts": [{"name": "log", "mountPath": "/home/admin/log"}]}));
    let errs = check(&[], &[c], &[pvc, log.clone()]);
    assert_eq!(
        paths(&errs),
        [
            "spec.containers[0].volumeMounts[0].mountPath",
            "spec.containers[0].volumeDevices[0].devicePath",
        ]
    );
    // A device on a non-PVC volume, a duplicate, an empty path and a backstep.
    let c = container(json!({"name": "a", "image": "x", "volumeDevices": [
        {"name": "log", "devicePath": "/dev/a"},
        {"name": "log", "devicePath": "/dev/a"},
        {"name": "log", "devicePath": ""},
        {"name": "log", "devicePath": "/dev/../x"}
    ]}));
    let errs = check(&[], &[c], &[log]);
    let messages: Vec<&str> = errs.iter().map(|e| e.message.as_str()).collect();
    assert!(messages.contains(
        &"can only use volume source type of PersistentVolumeClaim or Ephemeral for block mode"
    ));
    assert!(messages.contains(&"must be unique"));
    assert!(messages.contains(&"can not contain backsteps ('..')"));
    assert!(
        errs.iter()
            .any(|e| e.kind == ErrorKind::Required && e.path.ends_with("[2].devicePath"))
    );
}

#[test]
fn volumes_need_a_valid_unique_name_and_exactly_one_source() {
    let errs = validate_volumes(
        &[
            volume(json!({"name": "test-volume"})),
            volume(
                json!({"name": "a", "emptyDir": {}, "hostPath": {"path": "/x"}, "secret": {"secretName": "s"}}),
            ),
            volume(json!({"name": "a", "emptyDir": {}})),
            volume(json!({"name": "Bad.Name", "emptyDir": {}})),
            volume(json!({"name": "", "emptyDir": {}})),
        ],
        "spec.volumes",
    );
    assert_eq!(
        errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            "spec.volumes[0]: Required value: must specify a volume type",
            "spec.volumes[1].emptyDir: Forbidden: may not specify more than 1 volume type",
            "spec.volumes[1].secret: Forbidden: may not specify more than 1 volume type",
            r#"spec.volumes[2].name: Duplicate value: "a""#,
            r#"spec.volumes[3].name: Invalid value: "Bad.Name": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"#,
            "spec.volumes[4].name: Required value",
        ]
    );
}

#[test]
fn volume_sources_are_checked() {
    let errs = validate_volumes(
        &[
            volume(json!({"name": "a", "hostPath": {"path": "", "type": "Pipe"}})),
            volume(json!({"name": "b", "secret": {"defaultMode": 1000}})),
            volume(json!({"name": "c", "configMap": {"name": "", "defaultMode": -1}})),
            volume(json!({"name": "d", "persistentVolumeClaim": {"claimName": ""}})),
            volume(json!({"name": "e", "downwardAPI": {"defaultMode": 512}})),
            volume(
                json!({"name": "f", "projected": {"defaultMode": 420, "sources": [
                    {"serviceAccountToken": {"path": "", "expirationSeconds": 60}},
                    {"serviceAccountToken": {"path": "t", "expirationSeconds": 5_000_000_000_i64}},
                    {"serviceAccountToken": {"audience": "istio-ca", "expirationSeconds": 43200, "path": "istio-token"}}
                ]}}),
            ),
            volume(json!({"name": "g", "hostPath": {"path": "/x", "type": ""}})),
        ],
        "spec.volumes",
    );
    assert_eq!(
        paths(&errs),
        [
            "spec.volumes[0].hostPath.path",
            "spec.volumes[0].hostPath.type",
            "spec.volumes[1].secret.secretName",
            "spec.volumes[1].secret.defaultMode",
            "spec.volumes[2].configMap.name",
            "spec.volumes[2].configMap.defaultMode",
            "spec.volumes[3].persistentVolumeClaim.claimName",
            "spec.volumes[4].downwardAPI.defaultMode",
            "spec.volumes[5].projected.sources[0].serviceAccountToken.path",
            "spec.volumes[5].projected.sources[0].serviceAccountToken.expirationSeconds",
            "spec.volumes[5].projected.sources[1].serviceAccountToken.expirationSeconds",
        ]
    );
    assert_eq!(
        errs[3].message,
        "must be a number between 0 and 0777 (octal), both inclusive"
    );
    assert_eq!(
        errs[9].message,
        "may not specify a duration less than 10 minutes"
    );
}

#[test]
fn subscripted_paths_split() {
    assert_eq!(
        split_subscripted_path("metadata.labels['app']"),
        Some(("metadata.labels", "app"))
    );
    assert_eq!(split_subscripted_path("metadata.name"), None);
    assert_eq!(split_subscripted_path("metadata.labels['app'"), None);
}
