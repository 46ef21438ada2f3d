//! The pod annotations that record which SidecarSets were injected, and at which version.
//!
//! Upstream writes them at injection and the upgrade controller reads and rewrites them; a pod
//! injected by upstream's kruise-manager and one injected by kruise-rs must look the same, so
//! the shapes and the bytes are upstream's:
//!
//! - `kruise.io/sidecarset-hash` and `kruise.io/sidecarset-hash-without-image`: a JSON object
//!   mapping each SidecarSet name to a [`SidecarSetUpgradeSpec`]
//!   (`{"updateTimestamp","hash","sidecarSetName","sidecarList","controllerRevision"}`, the last
//!   one omitted when empty), keys sorted, written as Go's `json.Marshal` writes them. Pods from
//!   old Kruise versions hold a plain `{"name":"hash"}` map instead; it is still read.
//! - `kruise.io/sidecarset-injected-list`: the sorted, comma-joined SidecarSet names.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

use super::gojson::html_escape_compact_json;

/// One SidecarSet's entry in a pod's hash annotation (upstream's `SidecarSetUpgradeSpec`).
/// Field order is the JSON order upstream writes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SidecarSetUpgradeSpec {
    /// When the entry was written; `null` in entries converted from the old format.
    #[serde(rename = "updateTimestamp", default)]
    pub update_timestamp: Option<Time>,
    /// The SidecarSet hash (or hash without image) the pod's sidecars correspond to.
    #[serde(rename = "hash", default)]
    pub hash: String,
    #[serde(rename = "sidecarSetName", default)]
    pub sidecar_set_name: String,
    /// Names of the SidecarSet's containers and native-sidecar init containers, sorted.
    /// `null` (not `[]`) in entries converted from the old format, as upstream writes them.
    #[serde(rename = "sidecarList", default)]
    pub sidecar_list: Option<Vec<String>>,
    /// The ControllerRevision injected; only in the `kruise.io/sidecarset-hash` annotation.
    #[serde(
        rename = "controllerRevision",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub controller_revision: String,
}

/// A pod's hash annotation: SidecarSet name to its entry.
pub(crate) type SidecarSetHashes = BTreeMap<String, SidecarSetUpgradeSpec>;

/// Why an annotation on the pod cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("pod annotation {key} is not a JSON map of SidecarSet hashes: {reason}")]
pub struct AnnotationError {
    pub key: String,
    pub reason: String,
}

/// Reads a hash annotation value (either format). An empty value is an empty map.
pub fn parse_hashes(key: &str, value: &str) -> Result<SidecarSetHashes, AnnotationError> {
    if value.is_empty() {
        return Ok(SidecarSetHashes::new());
    }
    let current = match serde_json::from_str::<Option<SidecarSetHashes>>(value) {
        Ok(map) => return Ok(map.unwrap_or_default()),
        Err(e) => e,
    };
    // Kruise before v0.9 wrote `{"<sidecarset>": "<hash>"}`.
    match serde_json::from_str::<BTreeMap<String, String>>(value) {
        Ok(old) => Ok(old
            .into_iter()
            .map(|(name, hash)| {
                let spec = SidecarSetUpgradeSpec {
                    hash,
                    sidecar_set_name: name.clone(),
                    ..Default::default()
                };
                (name, spec)
            })
            .collect()),
        Err(_) => Err(AnnotationError {
            key: key.to_owned(),
            reason: current.to_string(),
        }),
    }
}

/// Writes a hash annotation value exactly as upstream's `json.Marshal` does.
pub fn render_hashes(hashes: &SidecarSetHashes) -> String {
    // The map and the struct serialize in declaration order without going through a `Value`,
    // so serde_json's text differs from Go's only in HTML-safe escaping.
    let json = serde_json::to_string(hashes).unwrap_or_else(|_| "{}".to_owned());
    html_escape_compact_json(&json)
}

/// One SidecarSet's entry in a pod hash annotation, read leniently (as upstream's
/// `GetPodSidecarSetUpgradeSpecInAnnotations`): absent or unreadable gives `None`.
pub fn pod_entry(
    value: Option<&str>,
    key: &str,
    sidecarset: &str,
) -> Option<SidecarSetUpgradeSpec> {
    parse_hashes(key, value?).ok()?.remove(sidecarset)
}

/// Reads `kruise.io/sidecarset-injected-list` (empty names, e.g. from `a,,b`, are dropped).
pub fn parse_injected_list(value: &str) -> BTreeSet<String> {
    value
        .split(',')
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Writes `kruise.io/sidecarset-injected-list`: sorted, comma-joined.
pub(crate) fn render_injected_list(names: &BTreeSet<String>) -> String {
    names
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use kruise_rs_api::well_known::{SIDECARSET_HASH, SIDECARSET_HASH_WITHOUT_IMAGE};

    fn time(s: &str) -> Time {
        Time(s.parse().expect("valid timestamp"))
    }

    #[test]
    fn renders_the_bytes_upstream_writes() {
        // Upstream: json.Marshal(map[string]SidecarSetUpgradeSpec{...}).
        let hashes = SidecarSetHashes::from([
            (
                "b-set".to_owned(),
                SidecarSetUpgradeSpec {
                    update_timestamp: Some(time("2024-05-06T07:08:09Z")),
                    hash: "hash-b".into(),
                    sidecar_set_name: "b-set".into(),
                    sidecar_list: Some(vec!["envoy".into(), "init".into()]),
                    controller_revision: "b-set-7d9f".into(),
                },
            ),
            (
                "a-set".to_owned(),
                SidecarSetUpgradeSpec {
                    update_timestamp: Some(time("2024-05-06T07:08:09Z")),
                    hash: "hash-a".into(),
                    sidecar_set_name: "a-set".into(),
                    sidecar_list: Some(vec![]),
                    controller_revision: String::new(),
                },
            ),
        ]);
        assert_eq!(
            render_hashes(&hashes),
            concat!(
                r#"{"a-set":{"updateTimestamp":"2024-05-06T07:08:09Z","hash":"hash-a","sidecarSetName":"a-set","sidecarList":[]},"#,
                r#""b-set":{"updateTimestamp":"2024-05-06T07:08:09Z","hash":"hash-b","sidecarSetName":"b-set","sidecarList":["envoy","init"],"controllerRevision":"b-set-7d9f"}}"#
            )
        );
    }

    #[test]
    fn round_trips_an_upstream_annotation() {
        let upstream = r#"{"sidecarset1":{"updateTimestamp":"2023-01-02T03:04:05Z","hash":"c4k2dbb95d","sidecarSetName":"sidecarset1","sidecarList":["dns-f","log-agent"],"controllerRevision":"sidecarset1-59d9f"}}"#;
        let parsed = parse_hashes(SIDECARSET_HASH, upstream).expect("parses");
        let entry = &parsed["sidecarset1"];
        assert_eq!(entry.hash, "c4k2dbb95d");
        assert_eq!(entry.controller_revision, "sidecarset1-59d9f");
        assert_eq!(render_hashes(&parsed), upstream);
    }

    #[test]
    fn reads_the_old_plain_map_format_like_upstream() {
        // Upstream TestPodSidecarSetHashCompatibility.
        let old = r#"{"sidecarset-test":"bv6d2fbw97wz8xx5x4v4wddwbd5z744wcf7c786dd4dvxvd5w6w424df7vx47989"}"#;
        let parsed = parse_hashes(SIDECARSET_HASH, old).expect("parses");
        let entry = &parsed["sidecarset-test"];
        assert_eq!(
            entry.hash,
            "bv6d2fbw97wz8xx5x4v4wddwbd5z744wcf7c786dd4dvxvd5w6w424df7vx47989"
        );
        assert_eq!(entry.sidecar_set_name, "sidecarset-test");
        // Upstream re-marshals converted entries with a zero time and a nil list.
        assert_eq!(
            render_hashes(&parsed),
            r#"{"sidecarset-test":{"updateTimestamp":null,"hash":"bv6d2fbw97wz8xx5x4v4wddwbd5z744wcf7c786dd4dvxvd5w6w424df7vx47989","sidecarSetName":"sidecarset-test","sidecarList":null}}"#
        );
    }

    #[test]
    fn empty_and_null_values_are_empty_maps() {
        assert!(parse_hashes(SIDECARSET_HASH, "").expect("ok").is_empty());
        assert!(
            parse_hashes(SIDECARSET_HASH, "null")
                .expect("ok")
                .is_empty()
        );
        assert!(parse_hashes(SIDECARSET_HASH, "{}").expect("ok").is_empty());
    }

    #[test]
    fn garbage_is_an_error_naming_the_annotation() {
        for bad in ["{", "[1,2]", "\"x\"", r#"{"a":{"hash":5}}"#, r#"{"a":7}"#] {
            let err = parse_hashes(SIDECARSET_HASH_WITHOUT_IMAGE, bad).expect_err(bad);
            assert!(
                err.to_string().contains(SIDECARSET_HASH_WITHOUT_IMAGE),
                "{err}"
            );
        }
    }

    #[test]
    fn html_characters_are_escaped_as_go_does() {
        let hashes = SidecarSetHashes::from([(
            "x".to_owned(),
            SidecarSetUpgradeSpec {
                hash: "<&>".into(),
                sidecar_set_name: "x".into(),
                sidecar_list: Some(vec![]),
                ..Default::default()
            },
        )]);
        assert!(render_hashes(&hashes).contains(r#""hash":"\u003c\u0026\u003e""#));
    }

    #[test]
    fn lenient_pod_entry_lookup() {
        let annotations = BTreeMap::from([
            (
                SIDECARSET_HASH.to_owned(),
                r#"{"s":{"hash":"h"}}"#.to_owned(),
            ),
            (
                SIDECARSET_HASH_WITHOUT_IMAGE.to_owned(),
                "garbage".to_owned(),
            ),
        ]);
        assert_eq!(
            pod_entry(
                annotations.get(SIDECARSET_HASH).map(String::as_str),
                SIDECARSET_HASH,
                "s"
            )
            .map(|e| e.hash),
            Some("h".to_owned())
        );
        assert_eq!(
            pod_entry(
                annotations.get(SIDECARSET_HASH).map(String::as_str),
                SIDECARSET_HASH,
                "other"
            ),
            None
        );
        assert_eq!(
            pod_entry(
                annotations
                    .get(SIDECARSET_HASH_WITHOUT_IMAGE)
                    .map(String::as_str),
                SIDECARSET_HASH_WITHOUT_IMAGE,
                "s"
            ),
            None
        );
        assert_eq!(pod_entry(None, SIDECARSET_HASH, "s"), None);
    }

    #[test]
    fn injected_list_is_a_sorted_union_without_empty_names() {
        let mut names = parse_injected_list("b,,a");
        assert_eq!(render_injected_list(&names), "a,b");
        names.insert("c".into());
        names.insert("a".into());
        assert_eq!(render_injected_list(&names), "a,b,c");
        assert!(parse_injected_list("").is_empty());
        assert_eq!(render_injected_list(&BTreeSet::new()), "");
    }
}
