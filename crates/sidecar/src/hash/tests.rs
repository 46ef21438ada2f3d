use super::*;
use serde_json::json;

fn spec(v: Value) -> SidecarSetSpec {
    serde_json::from_value(v).expect("valid spec")
}

// Expected values from upstream `pkg/control/sidecarcontrol/hash_test.go`.
const UPSTREAM_CONTAINERS: &str =
    "w26c4x8fz245642fdv499b464248f974xddx4x55z5dw55bc6x66464fxz77dc78";
const UPSTREAM_CONTAINERS_WITHOUT_IMAGE: &str =
    "8wzddb4dvv9c6x8zdc77z4z75987424f457dfv6724ddw6zbdx467wz5x24fc759";
const UPSTREAM_NATIVE_INIT: &str =
    "4xwx4d4844vd4v9x79wb4xbxf4xb29475cc4446v8cz2c2f2f5c5bw448vd42z8w";
const UPSTREAM_NATIVE_INIT_WITHOUT_IMAGE: &str =
    "5725fw8bwbx249bw57v5892c847dzf48bww9zb7c86xb95264fdz26654847b2c8";

#[test]
fn upstream_hash_test_containers() {
    let s = spec(json!({"containers": [{"name": "container1", "image": "test-image"}]}));
    assert_eq!(
        hash_input(&s, false),
        r#"{"containers":[{"name":"container1","image":"test-image","resources":{},"upgradeStrategy":{},"shareVolumePolicy":{}}]}"#
    );
    assert_eq!(sidecarset_hash(&s), UPSTREAM_CONTAINERS);
    assert_eq!(
        sidecarset_hash_without_image(&s),
        UPSTREAM_CONTAINERS_WITHOUT_IMAGE
    );
}

#[test]
fn upstream_hash_test_plain_init_containers_are_not_hashed() {
    let s = spec(json!({
        "containers": [{"name": "container1", "image": "test-image"}],
        "initContainers": [{"name": "container1", "image": "test-image"}],
    }));
    assert_eq!(sidecarset_hash(&s), UPSTREAM_CONTAINERS);
    assert_eq!(
        sidecarset_hash_without_image(&s),
        UPSTREAM_CONTAINERS_WITHOUT_IMAGE
    );
}

#[test]
fn upstream_hash_test_native_sidecar_init_containers_are_hashed() {
    let s = spec(json!({
        "containers": [{"name": "container1", "image": "test-image"}],
        "initContainers": [{"name": "container1", "image": "test-image", "restartPolicy": "Always"}],
    }));
    assert_eq!(sidecarset_hash(&s), UPSTREAM_NATIVE_INIT);
    assert_eq!(
        sidecarset_hash_without_image(&s),
        UPSTREAM_NATIVE_INIT_WITHOUT_IMAGE
    );
}

#[test]
fn image_changes_move_only_the_full_hash() {
    let a = spec(json!({"containers": [{"name": "c", "image": "i:1"}]}));
    let b = spec(json!({"containers": [{"name": "c", "image": "i:2"}]}));
    assert_ne!(sidecarset_hash(&a), sidecarset_hash(&b));
    assert_eq!(
        sidecarset_hash_without_image(&a),
        sidecarset_hash_without_image(&b)
    );
    let c = spec(json!({"containers": [{"name": "c", "image": "i:1", "args": ["-v"]}]}));
    assert_ne!(
        sidecarset_hash_without_image(&a),
        sidecarset_hash_without_image(&c)
    );
}

/// A native sidecar's new image is an in-place upgrade, as a container's: only the full hash
/// moves. Any other change to it is not.
#[test]
fn a_native_sidecar_image_change_moves_only_the_full_hash() {
    let native = |image: &str, args: Value| {
        spec(json!({
            "containers": [{"name": "c", "image": "i:1"}],
            "initContainers": [
                {"name": "setup", "image": "setup:1"},
                {"name": "agent", "image": image, "restartPolicy": "Always", "args": args},
            ],
        }))
    };
    let a = native("agent:1", Value::Null);
    let b = native("agent:2", Value::Null);
    assert_ne!(sidecarset_hash(&a), sidecarset_hash(&b));
    assert_eq!(
        sidecarset_hash_without_image(&a),
        sidecarset_hash_without_image(&b)
    );
    let c = native("agent:1", json!(["-v"]));
    assert_ne!(
        sidecarset_hash_without_image(&a),
        sidecarset_hash_without_image(&c)
    );
}

#[test]
fn volumes_secrets_and_metadata_do_not_change_the_hash() {
    let a = spec(json!({"containers": [{"name": "c", "image": "i"}]}));
    let b = spec(json!({
        "containers": [{"name": "c", "image": "i"}],
        "volumes": [{"name": "v", "emptyDir": {}}],
        "imagePullSecrets": [{"name": "s"}],
        "patchPodMetadata": [{"annotations": {"a": "b"}}],
    }));
    assert_eq!(sidecarset_hash(&a), sidecarset_hash(&b));
}

/// A defaulted, feature-rich spec. Expected JSON and hashes produced by Go `json.Marshal`
/// of kruise's v1beta1 structs decoded from this same input (k8s.io/api v0.36.3).
#[test]
fn a_rich_spec_matches_go_byte_for_byte() {
    let s = spec(rich_spec());
    assert_eq!(hash_input(&s, false), RICH_JSON);
    assert_eq!(sidecarset_hash(&s), RICH_HASH);
    assert_eq!(sidecarset_hash_without_image(&s), RICH_HASH_WITHOUT_IMAGE);
}

#[test]
fn an_empty_spec_hashes_null_containers() {
    assert_eq!(
        hash_input(&SidecarSetSpec::default(), false),
        r#"{"containers":null}"#
    );
}

#[test]
fn safe_encode_maps_hex_digits() {
    // Character codes modulo 27 index the alphabet: `0` is 48 → 21 → `4`, `a` is 97 → 16 → `v`.
    assert_eq!(safe_encode_string("0123456789abcdef"), "456789bcdfvwxz24");
}

fn rich_spec() -> Value {
    json!({
        "containers": [{
            "name": "envoy",
            "image": "envoyproxy/envoy:v1.30 <&>",
            "imagePullPolicy": "IfNotPresent",
            "command": ["/usr/local/bin/envoy"],
            "args": ["-c", "/etc/envoy/envoy.yaml"],
            "ports": [{"containerPort": 15001, "name": "proxy", "protocol": "TCP"}],
            "env": [
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
                {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
                {"name": "PLAIN", "value": "x"}
            ],
            "envFrom": [{"configMapRef": {"name": "cm", "optional": false}, "prefix": "P_"}],
            "resources": {
                "limits": {"memory": "1024Mi", "cpu": "0.5"},
                "requests": {"cpu": "100m", "memory": "64Mi"}
            },
            "volumeMounts": [{"name": "conf", "mountPath": "/etc/envoy", "readOnly": true}],
            "livenessProbe": {
                "httpGet": {"path": "/ready", "port": 15021, "scheme": "HTTP"},
                "periodSeconds": 10, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3
            },
            "readinessProbe": {"grpc": {"port": 15020}, "initialDelaySeconds": 1},
            "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}},
            "securityContext": {"runAsUser": 1337, "runAsNonRoot": true, "capabilities": {"drop": ["ALL"]}, "allowPrivilegeEscalation": false},
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File",
            "podInjectPolicy": "BeforeAppContainer",
            "upgradeStrategy": {"upgradeType": "ColdUpgrade"},
            "shareVolumePolicy": {"type": "disabled"},
            "shareVolumeDevicePolicy": {"type": "enabled"},
            "transferEnv": [
                {"sourceContainerName": "app", "envName": "TZ"},
                {"sourceContainerNameFrom": {"fieldRef": {"fieldPath": "metadata.labels['main']"}}, "envNames": ["A", "B"]}
            ]
        }, {
            "name": "log",
            "image": "fluent-bit:2",
            "resources": {"limits": {"cpu": "1.5"}},
            "podInjectPolicy": "AfterAppContainer",
            "upgradeStrategy": {},
            "shareVolumePolicy": {"type": "enabled"},
            "stdin": true,
            "tty": false
        }],
        "initContainers": [{
            "name": "native",
            "image": "busybox:1",
            "restartPolicy": "Always",
            "startupProbe": {"tcpSocket": {"port": "http"}},
            "resourcesPolicy": {
                "targetContainersMode": "sum",
                "resourcesExpr": {"limits": {"cpu": "cpu*50%"}}
            }
        }, {
            "name": "plain-init",
            "image": "busybox:1",
            "command": ["sh", "-c", "echo \"hi\"\n"]
        }]
    })
}

const RICH_JSON: &str = r#"{"containers":[{"name":"envoy","image":"envoyproxy/envoy:v1.30 \u003c\u0026\u003e","command":["/usr/local/bin/envoy"],"args":["-c","/etc/envoy/envoy.yaml"],"ports":[{"name":"proxy","containerPort":15001,"protocol":"TCP"}],"envFrom":[{"prefix":"P_","configMapRef":{"name":"cm","optional":false}}],"env":[{"name":"POD_NAME","valueFrom":{"fieldRef":{"apiVersion":"v1","fieldPath":"metadata.name"}}},{"name":"CPU","valueFrom":{"resourceFieldRef":{"resource":"limits.cpu","divisor":"0"}}},{"name":"PLAIN","value":"x"}],"resources":{"limits":{"cpu":"500m","memory":"1Gi"},"requests":{"cpu":"100m","memory":"64Mi"}},"volumeMounts":[{"name":"conf","readOnly":true,"mountPath":"/etc/envoy"}],"livenessProbe":{"httpGet":{"path":"/ready","port":15021,"scheme":"HTTP"},"timeoutSeconds":1,"periodSeconds":10,"successThreshold":1,"failureThreshold":3},"readinessProbe":{"grpc":{"port":15020,"service":null},"initialDelaySeconds":1},"lifecycle":{"preStop":{"exec":{"command":["sleep","5"]}}},"terminationMessagePath":"/dev/termination-log","terminationMessagePolicy":"File","imagePullPolicy":"IfNotPresent","securityContext":{"capabilities":{"drop":["ALL"]},"runAsUser":1337,"runAsNonRoot":true,"allowPrivilegeEscalation":false},"podInjectPolicy":"BeforeAppContainer","upgradeStrategy":{"upgradeType":"ColdUpgrade"},"shareVolumePolicy":{"type":"disabled"},"shareVolumeDevicePolicy":{"type":"enabled"},"transferEnv":[{"sourceContainerName":"app","envName":"TZ"},{"sourceContainerNameFrom":{"fieldRef":{"fieldPath":"metadata.labels['main']"}},"envNames":["A","B"]}]},{"name":"log","image":"fluent-bit:2","resources":{"limits":{"cpu":"1500m"}},"stdin":true,"podInjectPolicy":"AfterAppContainer","upgradeStrategy":{},"shareVolumePolicy":{"type":"enabled"}}],"initContainers":[{"name":"native","image":"busybox:1","resources":{},"restartPolicy":"Always","startupProbe":{"tcpSocket":{"port":"http"}},"upgradeStrategy":{},"shareVolumePolicy":{},"resourcesPolicy":{"targetContainersMode":"sum","resourcesExpr":{"limits":{"cpu":"cpu*50%"}}}},{"name":"plain-init","image":"busybox:1","command":["sh","-c","echo \"hi\"\n"],"resources":{},"upgradeStrategy":{},"shareVolumePolicy":{}}]}"#;
const RICH_HASH: &str = "w49v8dcxzv6z5v59bdx6vv59cfb79f65xf45x6bvw56cdzc467275242d6x242b7";
const RICH_HASH_WITHOUT_IMAGE: &str =
    "c7x59564784w8z676v4b8d854z2994278722dv9cd54w76ww8bcfbz965474z8zz";

#[test]
fn the_in_place_hash_ignores_images_and_resources_and_nothing_else() {
    let base = json!({"containers": [{
        "name": "sidecar",
        "image": "sidecar:1",
        "resources": {"requests": {"cpu": "100m"}, "limits": {"memory": "64Mi"}},
    }]});
    let with = |f: &dyn Fn(&mut Value)| {
        let mut v = base.clone();
        f(&mut v);
        spec(v)
    };
    let original = sidecarset_hash_in_place(&spec(base.clone()));
    let resized = with(&|v| v["containers"][0]["resources"]["requests"]["cpu"] = json!("200m"));
    let reimaged = with(&|v| v["containers"][0]["image"] = json!("sidecar:2"));
    let no_resources = with(&|v| {
        v["containers"][0]
            .as_object_mut()
            .unwrap()
            .remove("resources");
    });
    let policy = with(&|v| {
        v["containers"][0]
            .as_object_mut()
            .unwrap()
            .remove("resources");
        v["containers"][0]["resourcesPolicy"] = json!({
            "targetContainersMode": "sum",
            "resourcesExpr": {"limits": {"cpu": "cpu*50%"}},
        });
    });
    for (what, s) in [
        ("resources changed", &resized),
        ("image changed", &reimaged),
        ("resources removed", &no_resources),
        ("a resourcesPolicy instead", &policy),
    ] {
        assert_eq!(sidecarset_hash_in_place(s), original, "{what}");
    }
    assert_ne!(
        sidecarset_hash_without_image(&resized),
        sidecarset_hash_without_image(&spec(base.clone())),
        "the without-image hash sees resources"
    );
    let env = with(&|v| v["containers"][0]["env"] = json!([{"name": "A", "value": "1"}]));
    assert_ne!(sidecarset_hash_in_place(&env), original, "env changed");
    let renamed = with(&|v| v["containers"][0]["name"] = json!("other"));
    assert_ne!(sidecarset_hash_in_place(&renamed), original, "renamed");
    let native = with(&|v| {
        v["initContainers"] = json!([{"name": "n", "image": "n:1", "restartPolicy": "Always",
            "resources": {"limits": {"cpu": "1"}}}]);
    });
    let native_resized = with(&|v| {
        v["initContainers"] = json!([{"name": "n", "image": "n:2", "restartPolicy": "Always",
            "resources": {"limits": {"cpu": "2"}}}]);
    });
    assert_eq!(
        sidecarset_hash_in_place(&native),
        sidecarset_hash_in_place(&native_resized),
        "native sidecars alike"
    );
}
