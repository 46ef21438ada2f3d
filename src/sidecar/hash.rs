//! The `kruise.io/sidecarset-hash` and `kruise.io/sidecarset-hash-without-image` values.
//!
//! Pods record the hash of the SidecarSet version they were injected with; the upgrade
//! controller compares it with the SidecarSet's current hash to know which pods are outdated,
//! and compares the without-image variant to know whether an in-place (image-only) upgrade can
//! bring them up to date. Pods injected by upstream's kruise-manager carry upstream's values, so
//! ours must be equal for the same spec, or every such pod would look outdated (and, worse,
//! not upgradable) after a switch.
//!
//! Upstream's value is `SafeEncodeString(hex(sha256(json.Marshal({"containers": …}))))`, with
//! `"initContainers"` (all of them) added when at least one init container is a native sidecar
//! (`restartPolicy: Always`); the without-image variant blanks every image first. Volumes, pull
//! secrets and `patchPodMetadata` are not covered (upstream behaviour, kept so the values agree).
//!
//! **These values equal upstream's** for every spec whose fields exist in upstream's Kubernetes
//! API version: the JSON is produced in Go's byte order by `gojson`, quantities in Go's
//! canonical form by `quantity`; 400 random specs covering every container field were
//! checked against Go during development, and the tests keep upstream's own expected hashes and a
//! Go-produced vector for a feature-rich spec. Known differences, all at the edges:
//! - an explicit `containers: []` hashes as `null` (our type cannot tell it from an absent list,
//!   which Go also writes as `null`; upstream writes `[]` for the explicit form);
//! - container fields newer than upstream's `k8s.io/api` v0.32 (e.g. `lifecycle.stopSignal`):
//!   Go drops them before hashing, we hash them;
//! - JSON numbers inside fields unknown to the tables are rendered by serde_json.
//!
//! Upstream hashes the SidecarSet *after* its defaulting webhook ran; callers that set the
//! annotations must hash the defaulted spec to get upstream's value.

use serde_json::Value;

use crate::apis::defaults::default_sidecarset;
use crate::apis::sidecarset::{SidecarContainer, SidecarSet, SidecarSetSpec};
use crate::apis::well_known::{SIDECARSET_HASH, SIDECARSET_HASH_WITHOUT_IMAGE};

use super::gojson::{SIDECAR_CONTAINERS, write_typed};

/// `kruise.io/sidecarset-hash` of a SidecarSet with this spec.
pub fn sidecarset_hash(spec: &SidecarSetSpec) -> String {
    safe_encode_string(&sha256_hex(hash_input(spec, false).as_bytes()))
}

/// `kruise.io/sidecarset-hash-without-image` of a SidecarSet with this spec.
pub fn sidecarset_hash_without_image(spec: &SidecarSetSpec) -> String {
    safe_encode_string(&sha256_hex(hash_input(spec, true).as_bytes()))
}

/// The SidecarSet's current `(hash, hash without image)`: its annotations, which the mutating
/// webhook writes from the defaulted spec; where one is missing (a SidecarSet stored while no
/// webhook ran), the hash of the spec defaulted the same way. Hashing the stored spec instead
/// would disagree with the hashes the webhook writes at the SidecarSet's next update, and every
/// pod injected meanwhile would count as changed in more than its images.
pub fn current_hashes(set: &SidecarSet) -> (String, String) {
    let annotation = |key: &str| {
        set.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .filter(|v| !v.is_empty())
            .cloned()
    };
    match (
        annotation(SIDECARSET_HASH),
        annotation(SIDECARSET_HASH_WITHOUT_IMAGE),
    ) {
        (Some(hash), Some(without_image)) => (hash, without_image),
        (hash, without_image) => {
            let mut defaulted = set.clone();
            default_sidecarset(&mut defaulted);
            (
                hash.unwrap_or_else(|| sidecarset_hash(&defaulted.spec)),
                without_image.unwrap_or_else(|| sidecarset_hash_without_image(&defaulted.spec)),
            )
        }
    }
}

/// Lower-case hex SHA-256 of `data` (ring is already in the build for rustls).
fn sha256_hex(data: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, data);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The exact text upstream hashes: `{"containers":[…]}`, plus `"initContainers"` when any init
/// container is a native sidecar. Public so a mismatch can be diagnosed by comparing texts.
pub fn hash_input(spec: &SidecarSetSpec, without_image: bool) -> String {
    let mut out = String::from("{\"containers\":");
    write_containers(&mut out, &spec.containers, without_image);
    if spec.init_containers.iter().any(is_native_sidecar) {
        out.push_str(",\"initContainers\":");
        write_containers(&mut out, &spec.init_containers, without_image);
    }
    out.push('}');
    out
}

/// Whether an init container is a Kubernetes native sidecar (`restartPolicy: Always`).
pub fn is_native_sidecar(container: &SidecarContainer) -> bool {
    container.container.restart_policy.as_deref() == Some("Always")
}

fn write_containers(out: &mut String, containers: &[SidecarContainer], without_image: bool) {
    if containers.is_empty() {
        // An absent list decodes to a nil slice in Go, which marshals as `null`.
        out.push_str("null");
        return;
    }
    let items: Vec<Value> = containers
        .iter()
        .map(|c| {
            // Serializing plain data structs into a Value cannot fail (no non-string map keys,
            // no fallible custom serializers); Null keeps the function total regardless.
            let mut v = serde_json::to_value(c).unwrap_or(Value::Null);
            if without_image && let Value::Object(map) = &mut v {
                map.remove("image");
            }
            v
        })
        .collect();
    write_typed(out, SIDECAR_CONTAINERS, Some(&Value::Array(items)));
}

/// `k8s.io/apimachinery/pkg/util/rand.SafeEncodeString`: maps each character onto an alphabet
/// without vowels (so no words appear) and without look-alike characters.
pub fn safe_encode_string(s: &str) -> String {
    const ALPHANUMS: &[u8; 27] = b"bcdfghjklmnpqrstvwxz2456789";
    s.chars()
        .map(|c| char::from(ALPHANUMS[(c as usize) % ALPHANUMS.len()]))
        .collect()
}

#[cfg(test)]
mod tests {
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
}
