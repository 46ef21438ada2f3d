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

use kruise_rs_api::defaults::default_sidecarset;
use kruise_rs_api::sidecarset::{SidecarContainer, SidecarSet, SidecarSetSpec};
use kruise_rs_api::well_known::{SIDECARSET_HASH, SIDECARSET_HASH_WITHOUT_IMAGE};

use super::gojson::{SIDECAR_CONTAINERS, write_typed};

/// `kruise.io/sidecarset-hash` of a SidecarSet with this spec.
pub fn sidecarset_hash(spec: &SidecarSetSpec) -> String {
    safe_encode_string(&sha256_hex(hash_input(spec, false).as_bytes()))
}

/// `kruise.io/sidecarset-hash-without-image` of a SidecarSet with this spec.
pub fn sidecarset_hash_without_image(spec: &SidecarSetSpec) -> String {
    safe_encode_string(&sha256_hex(hash_input(spec, true).as_bytes()))
}

/// The hash of the spec with the sidecars' images, `resources` and `resourcesPolicy` blanked: two
/// versions with equal values differ at most in what an in-place upgrade can change (the image
/// by a pod patch, the resources through the `pods/resize` subresource). kruise-rs's own: pods
/// carry no such annotation; the controller finds the ControllerRevision of the hash a pod
/// records and compares its value with the current one's, so pods injected before (or by
/// upstream) qualify too.
pub fn sidecarset_hash_in_place(spec: &SidecarSetSpec) -> String {
    safe_encode_string(&sha256_hex(
        hash_text(spec, Blank::ImagesAndResources).as_bytes(),
    ))
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
pub(crate) fn hash_input(spec: &SidecarSetSpec, without_image: bool) -> String {
    let blank = if without_image {
        Blank::Images
    } else {
        Blank::Nothing
    };
    hash_text(spec, blank)
}

/// What a hash leaves out of each container.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Blank {
    Nothing,
    Images,
    ImagesAndResources,
}

impl Blank {
    fn fields(self) -> &'static [&'static str] {
        match self {
            Blank::Nothing => &[],
            Blank::Images => &["image"],
            Blank::ImagesAndResources => &["image", "resources", "resourcesPolicy"],
        }
    }
}

fn hash_text(spec: &SidecarSetSpec, blank: Blank) -> String {
    let mut out = String::from("{\"containers\":");
    write_containers(&mut out, &spec.containers, blank);
    if spec.init_containers.iter().any(is_native_sidecar) {
        out.push_str(",\"initContainers\":");
        write_containers(&mut out, &spec.init_containers, blank);
    }
    out.push('}');
    out
}

/// Whether an init container is a Kubernetes native sidecar (`restartPolicy: Always`).
pub fn is_native_sidecar(container: &SidecarContainer) -> bool {
    container.container.restart_policy.as_deref() == Some("Always")
}

fn write_containers(out: &mut String, containers: &[SidecarContainer], blank: Blank) {
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
            if let Value::Object(map) = &mut v {
                for field in blank.fields() {
                    map.remove(*field);
                }
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
mod tests;
