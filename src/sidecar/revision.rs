//! Which version of a SidecarSet a new pod gets (upstream's `getSuitableRevisionSidecarSet`,
//! CREATE branch).
//!
//! Without `injectionStrategy.revision` (or with neither `revisionName` nor `customVersion`),
//! a pod gets the latest spec. Otherwise the named historical version is restored from the
//! SidecarSet's ControllerRevisions (`revisionName` wins over `customVersion`; for a custom
//! version the newest revision labelled `apps.kruise.io/sidecarset-custom-version: <v>` is
//! used), and then:
//!
//! - `updateStrategy.paused` → the historical version;
//! - policy `Partial` → the historical version for pods outside `updateStrategy.selector` (when
//!   one is set); for the others, the historical version with probability `partition` when the
//!   partition is a percentage, else the latest;
//! - policy `Always` (the default) → the historical version.
//!
//! A revision's `data` is `{"spec":{"$patch":"replace","containers":…,"initContainers":…,
//! "volumes":…,"imagePullSecrets":…,"patchPodMetadata":…}}`; restoring takes those five fields
//! from it (absent or `null` meaning empty) and everything else from the current SidecarSet. The
//! hashes recorded on the revision's annotations are used when present, else computed.
//!
//! Differences from upstream, on purpose: a `revisionName` must name one of *this* SidecarSet's
//! revisions (upstream fetches any ControllerRevision of that name in its namespace); the random
//! draw uses `r < p` rather than `r <= p`, so `0%` never and `100%` always selects the historical
//! version; a missing revision is an error in both lookups, as upstream's behaviour in practice
//! (the pod is denied rather than silently given another version).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::{LocalObjectReference, Volume};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::apis::sidecarset::{
    SidecarContainer, SidecarSet, SidecarSetInjectRevisionPolicy, SidecarSetPatchPodMetadata,
    SidecarSetSpec,
};
use crate::apis::well_known::{
    SIDECARSET_CUSTOM_VERSION_LABEL, SIDECARSET_HASH, SIDECARSET_HASH_WITHOUT_IMAGE,
    SIDECARSET_NAME_LABEL,
};

use super::hash::{current_hashes, sidecarset_hash, sidecarset_hash_without_image};
use super::matching::{SelectorError, selector_matches};

/// A SidecarSet at the version chosen for one pod: what injection needs and records.
#[derive(Clone, Debug, PartialEq)]
pub struct SelectedSidecarSet {
    pub name: String,
    /// The spec to inject: the latest, or the latest with a historical revision's containers,
    /// init containers, volumes, pull secrets and metadata patches.
    pub spec: SidecarSetSpec,
    /// `kruise.io/sidecarset-hash` of that version.
    pub hash: String,
    /// `kruise.io/sidecarset-hash-without-image` of that version.
    pub hash_without_image: String,
    /// The ControllerRevision recorded on the pod (`controllerRevision` in the hash annotation).
    pub controller_revision: Option<String>,
}

impl SelectedSidecarSet {
    /// The latest version: the SidecarSet's own hash annotations (computed when missing, e.g.
    /// before the defaulting webhook has seen it) and `status.latestRevision`.
    pub fn latest(set: &SidecarSet) -> Self {
        let (hash, hash_without_image) = current_hashes(set);
        Self {
            name: set.metadata.name.clone().unwrap_or_default(),
            hash,
            hash_without_image,
            controller_revision: set
                .status
                .as_ref()
                .and_then(|s| s.latest_revision.clone())
                .filter(|r| !r.is_empty()),
            spec: set.spec.clone(),
        }
    }
}

/// Why the version to inject cannot be decided; the webhook denies the pod with it.
#[derive(Debug, thiserror::Error)]
pub enum RevisionError {
    #[error(
        "SidecarSet {sidecarset}: injectionStrategy.revision names {wanted}, but no such ControllerRevision of this SidecarSet exists"
    )]
    NotFound { sidecarset: String, wanted: String },
    #[error("SidecarSet {sidecarset}: ControllerRevision {revision} has unreadable data: {reason}")]
    BadData {
        sidecarset: String,
        revision: String,
        reason: String,
    },
    #[error(
        "SidecarSet {sidecarset}: updateStrategy.partition {value:?} is not a percentage usable by the Partial injection policy"
    )]
    InvalidPartition { sidecarset: String, value: String },
    #[error("SidecarSet {sidecarset}: updateStrategy.selector is invalid: {source}")]
    InvalidSelector {
        sidecarset: String,
        #[source]
        source: SelectorError,
    },
}

/// The version of `set` a new pod with `pod_labels` gets.
///
/// `history` holds the SidecarSet's ControllerRevisions (those labelled
/// `kruise.io/sidecarset-name: <name>`; others are ignored). `random` is a number drawn
/// uniformly from `[0, 1)`, used only by the `Partial` policy with a percentage partition.
pub fn version_for_new_pod(
    set: &SidecarSet,
    history: &[ControllerRevision],
    pod_labels: &BTreeMap<String, String>,
    random: f64,
) -> Result<SelectedSidecarSet, RevisionError> {
    let latest = SelectedSidecarSet::latest(set);
    let Some(wanted) = set.spec.injection_strategy.revision.as_ref() else {
        return Ok(latest);
    };
    if wanted.revision_name.is_none() && wanted.custom_version.is_none() {
        return Ok(latest);
    }
    let name = latest.name.clone();
    let own: Vec<&ControllerRevision> = history
        .iter()
        .filter(|r| label(r, SIDECARSET_NAME_LABEL) == Some(name.as_str()))
        .collect();
    let revision = if let Some(revision_name) = &wanted.revision_name {
        own.into_iter()
            .find(|r| r.metadata.name.as_deref() == Some(revision_name.as_str()))
            .ok_or_else(|| RevisionError::NotFound {
                sidecarset: name.clone(),
                wanted: format!("revisionName {revision_name:?}"),
            })?
    } else {
        let version = wanted.custom_version.as_deref().unwrap_or_default();
        own.into_iter()
            .filter(|r| label(r, SIDECARSET_CUSTOM_VERSION_LABEL) == Some(version))
            .max_by(|a, b| revision_order(a).cmp(&revision_order(b)))
            .ok_or_else(|| RevisionError::NotFound {
                sidecarset: name.clone(),
                wanted: format!("customVersion {version:?}"),
            })?
    };
    let historical = restore(set, revision)?;

    let strategy = &set.spec.update_strategy;
    if strategy.paused {
        return Ok(historical);
    }
    match wanted.policy {
        Some(SidecarSetInjectRevisionPolicy::Partial) => {
            if let Some(selector) = &strategy.selector {
                let selected = selector_matches(selector, pod_labels).map_err(|source| {
                    RevisionError::InvalidSelector {
                        sidecarset: name.clone(),
                        source,
                    }
                })?;
                if !selected {
                    return Ok(historical);
                }
            }
            let probability = match &strategy.partition {
                None | Some(IntOrString::Int(_)) => return Ok(latest),
                Some(IntOrString::String(p)) => {
                    parse_percentage(p).ok_or_else(|| RevisionError::InvalidPartition {
                        sidecarset: name.clone(),
                        value: p.clone(),
                    })?
                }
            };
            Ok(if random < probability {
                historical
            } else {
                latest
            })
        }
        Some(SidecarSetInjectRevisionPolicy::Always) | None => Ok(historical),
    }
}

/// The SidecarSet at `revision`: its recorded fields over the current spec.
pub fn restore(
    set: &SidecarSet,
    revision: &ControllerRevision,
) -> Result<SelectedSidecarSet, RevisionError> {
    let name = set.metadata.name.clone().unwrap_or_default();
    let revision_name = revision.metadata.name.clone().unwrap_or_default();
    let bad = |reason: String| RevisionError::BadData {
        sidecarset: name.clone(),
        revision: revision_name.clone(),
        reason,
    };
    let data = revision.data.as_ref().map(|d| &d.0);
    let Some(Value::Object(spec)) = data.and_then(|d| d.get("spec")) else {
        return Err(bad("no \"spec\" object".to_owned()));
    };
    let mut restored = set.spec.clone();
    restored.containers = field::<Vec<SidecarContainer>>(spec, "containers").map_err(&bad)?;
    restored.init_containers =
        field::<Vec<SidecarContainer>>(spec, "initContainers").map_err(&bad)?;
    restored.volumes = field::<Vec<Volume>>(spec, "volumes").map_err(&bad)?;
    restored.image_pull_secrets =
        field::<Vec<LocalObjectReference>>(spec, "imagePullSecrets").map_err(&bad)?;
    restored.patch_pod_metadata =
        field::<Vec<SidecarSetPatchPodMetadata>>(spec, "patchPodMetadata").map_err(&bad)?;

    let annotation = |key: &str| {
        revision
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .filter(|v| !v.is_empty())
            .cloned()
    };
    Ok(SelectedSidecarSet {
        hash: annotation(SIDECARSET_HASH).unwrap_or_else(|| sidecarset_hash(&restored)),
        hash_without_image: annotation(SIDECARSET_HASH_WITHOUT_IMAGE)
            .unwrap_or_else(|| sidecarset_hash_without_image(&restored)),
        controller_revision: Some(revision_name.clone()).filter(|n| !n.is_empty()),
        name,
        spec: restored,
    })
}

/// One field of the revision's spec; absent or `null` is the type's default (empty).
fn field<T: DeserializeOwned + Default>(
    spec: &serde_json::Map<String, Value>,
    key: &str,
) -> Result<T, String> {
    match spec.get(key) {
        None | Some(Value::Null) => Ok(T::default()),
        Some(v) => T::deserialize(v).map_err(|e| format!("spec.{key}: {e}")),
    }
}

fn label<'a>(revision: &'a ControllerRevision, key: &str) -> Option<&'a str> {
    revision
        .metadata
        .labels
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// Kubernetes' ControllerRevision order: by `.revision`, then creation time, then name.
fn revision_order(r: &ControllerRevision) -> (i64, Option<&k8s_openapi::jiff::Timestamp>, &str) {
    (
        r.revision,
        r.metadata.creation_timestamp.as_ref().map(|t| &t.0),
        r.metadata.name.as_deref().unwrap_or_default(),
    )
}

/// `"25%"` → 0.25; anything else (no `%`, not a finite number) → `None`.
fn parse_percentage(s: &str) -> Option<f64> {
    let number: f64 = s.strip_suffix('%')?.parse().ok()?;
    number.is_finite().then_some(number / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::sidecarset::{SidecarSetInjectRevision, SidecarSetStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
    use serde_json::json;

    const LATEST_IMAGE: &str = "sidecar-image:canary";
    const OLD_IMAGE: &str = "sidecar-image:stable";

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn sidecarset(revision: Option<SidecarSetInjectRevision>) -> SidecarSet {
        let spec: SidecarSetSpec = serde_json::from_value(json!({
            "selector": {"matchLabels": {"app": "demo"}},
            "containers": [{"name": "sidecar", "image": LATEST_IMAGE}],
            "updateStrategy": {"selector": {"matchLabels": {"canary": "true"}}},
        }))
        .expect("spec");
        let mut set = SidecarSet::new("sidecarset1", spec);
        set.spec.injection_strategy.revision = revision;
        set.metadata.annotations = Some(labels(&[
            (SIDECARSET_HASH, "latest-hash"),
            (SIDECARSET_HASH_WITHOUT_IMAGE, "latest-hash-noimg"),
        ]));
        set.status = Some(SidecarSetStatus {
            latest_revision: Some("sidecarset1-latest".into()),
            ..Default::default()
        });
        set
    }

    fn custom(version: &str, policy: SidecarSetInjectRevisionPolicy) -> SidecarSetInjectRevision {
        SidecarSetInjectRevision {
            custom_version: Some(version.into()),
            revision_name: None,
            policy: Some(policy),
        }
    }

    fn revision(
        name: &str,
        number: i64,
        custom_version: Option<&str>,
        image: &str,
    ) -> ControllerRevision {
        let mut r = ControllerRevision {
            revision: number,
            data: Some(RawExtension(json!({"spec": {
                "$patch": "replace",
                "containers": [{"name": "sidecar", "image": image}],
                "volumes": null,
            }}))),
            ..Default::default()
        };
        r.metadata.name = Some(name.into());
        let mut l = labels(&[(SIDECARSET_NAME_LABEL, "sidecarset1")]);
        if let Some(v) = custom_version {
            l.insert(SIDECARSET_CUSTOM_VERSION_LABEL.into(), v.into());
        }
        r.metadata.labels = Some(l);
        r
    }

    fn image(s: &SelectedSidecarSet) -> &str {
        s.spec.containers[0]
            .container
            .image
            .as_deref()
            .unwrap_or_default()
    }

    fn history() -> Vec<ControllerRevision> {
        vec![revision(
            "sidecarset1-12345",
            1,
            Some("sidecarset1-12345"),
            OLD_IMAGE,
        )]
    }

    #[test]
    fn without_a_revision_the_latest_is_injected() {
        let s = sidecarset(None);
        let chosen = version_for_new_pod(&s, &history(), &labels(&[]), 0.0).expect("ok");
        assert_eq!(image(&chosen), LATEST_IMAGE);
        assert_eq!(chosen.hash, "latest-hash");
        assert_eq!(chosen.hash_without_image, "latest-hash-noimg");
        assert_eq!(
            chosen.controller_revision.as_deref(),
            Some("sidecarset1-latest")
        );
        let empty = SidecarSetInjectRevision::default();
        let s = sidecarset(Some(empty));
        let chosen = version_for_new_pod(&s, &history(), &labels(&[]), 0.0).expect("ok");
        assert_eq!(image(&chosen), LATEST_IMAGE);
    }

    #[test]
    fn the_latest_without_hash_annotations_computes_them_from_the_defaulted_spec() {
        let mut s = sidecarset(None);
        s.metadata.annotations = None;
        let chosen = SelectedSidecarSet::latest(&s);
        // What the webhook writes at the SidecarSet's next update.
        let mut defaulted = s.clone();
        crate::apis::defaults::default_sidecarset(&mut defaulted);
        assert_eq!(chosen.hash, sidecarset_hash(&defaulted.spec));
        assert_eq!(
            chosen.hash_without_image,
            sidecarset_hash_without_image(&defaulted.spec)
        );
    }

    #[test]
    fn always_injects_the_custom_version() {
        // Upstream TestInjectionStrategyRevision.
        let s = sidecarset(Some(custom(
            "sidecarset1-12345",
            SidecarSetInjectRevisionPolicy::Always,
        )));
        let chosen =
            version_for_new_pod(&s, &history(), &labels(&[("canary", "true")]), 0.99).expect("ok");
        assert_eq!(image(&chosen), OLD_IMAGE);
        assert_eq!(
            chosen.controller_revision.as_deref(),
            Some("sidecarset1-12345")
        );
        assert_eq!(
            chosen.hash,
            sidecarset_hash(&chosen.spec),
            "hash computed from the restored spec"
        );
        assert_eq!(
            chosen.spec.selector, s.spec.selector,
            "fields not in the revision are kept"
        );
    }

    #[test]
    fn revision_hash_annotations_win_over_computing() {
        let s = sidecarset(Some(custom("v", SidecarSetInjectRevisionPolicy::Always)));
        let mut r = revision("r1", 1, Some("v"), OLD_IMAGE);
        r.metadata.annotations = Some(labels(&[
            (SIDECARSET_HASH, "old-hash"),
            (SIDECARSET_HASH_WITHOUT_IMAGE, "old-noimg"),
        ]));
        let chosen = version_for_new_pod(&s, &[r], &labels(&[]), 0.0).expect("ok");
        assert_eq!(chosen.hash, "old-hash");
        assert_eq!(chosen.hash_without_image, "old-noimg");
    }

    #[test]
    fn revision_name_wins_over_custom_version() {
        let mut wanted = custom("v2", SidecarSetInjectRevisionPolicy::Always);
        wanted.revision_name = Some("r1".into());
        let s = sidecarset(Some(wanted));
        let history = [
            revision("r1", 1, Some("v1"), "img:r1"),
            revision("r2", 2, Some("v2"), "img:r2"),
        ];
        let chosen = version_for_new_pod(&s, &history, &labels(&[]), 0.0).expect("ok");
        assert_eq!(image(&chosen), "img:r1");
    }

    #[test]
    fn the_newest_revision_of_a_custom_version_is_used() {
        let s = sidecarset(Some(custom("v", SidecarSetInjectRevisionPolicy::Always)));
        let history = [
            revision("r3", 3, Some("v"), "img:r3"),
            revision("r5", 5, Some("v"), "img:r5"),
            revision("r9", 9, Some("other"), "img:r9"),
            revision("r4", 4, Some("v"), "img:r4"),
        ];
        let chosen = version_for_new_pod(&s, &history, &labels(&[]), 0.0).expect("ok");
        assert_eq!(image(&chosen), "img:r5");
    }

    #[test]
    fn a_missing_revision_is_an_error() {
        // Upstream "canary no history".
        let s = sidecarset(Some(custom(
            "sidecarset1-12345",
            SidecarSetInjectRevisionPolicy::Partial,
        )));
        let err = version_for_new_pod(&s, &[], &labels(&[]), 0.0).expect_err("no history");
        assert!(matches!(err, RevisionError::NotFound { .. }), "{err}");
        let by_name = SidecarSetInjectRevision {
            revision_name: Some("nope".into()),
            ..Default::default()
        };
        let s = sidecarset(Some(by_name));
        let err = version_for_new_pod(&s, &history(), &labels(&[]), 0.0).expect_err("no such name");
        assert!(err.to_string().contains("nope"), "{err}");
    }

    #[test]
    fn revisions_of_other_sidecarsets_are_ignored() {
        let by_name = SidecarSetInjectRevision {
            revision_name: Some("foreign".into()),
            ..Default::default()
        };
        let s = sidecarset(Some(by_name));
        let mut foreign = revision("foreign", 1, None, OLD_IMAGE);
        foreign.metadata.labels = Some(labels(&[(SIDECARSET_NAME_LABEL, "someone-else")]));
        assert!(version_for_new_pod(&s, &[foreign], &labels(&[]), 0.0).is_err());
    }

    #[test]
    fn unreadable_revision_data_is_an_error() {
        let s = sidecarset(Some(custom("v", SidecarSetInjectRevisionPolicy::Always)));
        let mut r = revision("r1", 1, Some("v"), OLD_IMAGE);
        r.data = Some(RawExtension(json!({"spec": {"containers": "not a list"}})));
        let err = version_for_new_pod(&s, &[r.clone()], &labels(&[]), 0.0).expect_err("bad data");
        assert!(matches!(err, RevisionError::BadData { .. }), "{err}");
        r.data = None;
        assert!(version_for_new_pod(&s, &[r], &labels(&[]), 0.0).is_err());
    }

    #[test]
    fn restoring_replaces_the_recorded_fields_only() {
        let mut s = sidecarset(None);
        s.spec.volumes =
            serde_json::from_value(json!([{"name": "v-latest", "emptyDir": {}}])).unwrap();
        s.spec.image_pull_secrets = vec![LocalObjectReference {
            name: "latest".into(),
        }];
        let mut r = revision("r1", 1, None, OLD_IMAGE);
        r.data = Some(RawExtension(json!({"spec": {
            "$patch": "replace",
            "containers": [{"name": "sidecar", "image": OLD_IMAGE}],
            "initContainers": [{"name": "init", "image": "init:1"}],
            "imagePullSecrets": [{"name": "old"}],
            "patchPodMetadata": [{"annotations": {"a": "b"}, "patchPolicy": "Overwrite"}],
        }})));
        let restored = restore(&s, &r).expect("ok");
        assert_eq!(restored.spec.init_containers[0].container.name, "init");
        assert!(
            restored.spec.volumes.is_empty(),
            "absent volumes are empty, as with $patch: replace"
        );
        assert_eq!(restored.spec.image_pull_secrets[0].name, "old");
        assert_eq!(restored.spec.patch_pod_metadata[0].annotations["a"], "b");
        assert_eq!(restored.spec.selector, s.spec.selector);
    }

    // Upstream TestCanarySidecarSetInjection, case by case.

    fn canary_set(partition: Option<&str>, paused: bool) -> SidecarSet {
        let mut s = sidecarset(Some(custom(
            "sidecarset1-12345",
            SidecarSetInjectRevisionPolicy::Partial,
        )));
        s.spec.update_strategy.partition = partition.map(|p| IntOrString::String(p.into()));
        s.spec.update_strategy.paused = paused;
        s
    }

    const STABLE_POD: &[(&str, &str)] = &[("app", "demo")];
    const CANARY_POD: &[(&str, &str)] = &[("app", "demo"), ("canary", "true")];

    #[test]
    fn partial_pods_outside_the_update_selector_get_the_old_version() {
        let chosen = version_for_new_pod(
            &canary_set(None, false),
            &history(),
            &labels(STABLE_POD),
            0.0,
        )
        .expect("ok");
        assert_eq!(image(&chosen), OLD_IMAGE);
    }

    #[test]
    fn partial_selected_pods_without_partition_get_the_latest() {
        let chosen = version_for_new_pod(
            &canary_set(None, false),
            &history(),
            &labels(CANARY_POD),
            0.0,
        )
        .expect("ok");
        assert_eq!(image(&chosen), LATEST_IMAGE);
        let mut s = canary_set(None, false);
        s.spec.update_strategy.partition = Some(IntOrString::Int(5));
        let chosen = version_for_new_pod(&s, &history(), &labels(CANARY_POD), 0.0).expect("ok");
        assert_eq!(
            image(&chosen),
            LATEST_IMAGE,
            "an integer partition counts as 0%"
        );
    }

    #[test]
    fn partial_percentage_partition_is_the_chance_of_the_old_version() {
        for r in [0.0, 0.5, 0.999_999] {
            let chosen = version_for_new_pod(
                &canary_set(Some("100%"), false),
                &history(),
                &labels(CANARY_POD),
                r,
            )
            .expect("ok");
            assert_eq!(image(&chosen), OLD_IMAGE, "100% at r={r}");
            let chosen = version_for_new_pod(
                &canary_set(Some("0%"), false),
                &history(),
                &labels(CANARY_POD),
                r,
            )
            .expect("ok");
            assert_eq!(image(&chosen), LATEST_IMAGE, "0% at r={r}");
        }
        let s = canary_set(Some("30%"), false);
        let old = version_for_new_pod(&s, &history(), &labels(CANARY_POD), 0.29).expect("ok");
        let new = version_for_new_pod(&s, &history(), &labels(CANARY_POD), 0.30).expect("ok");
        assert_eq!((image(&old), image(&new)), (OLD_IMAGE, LATEST_IMAGE));
    }

    #[test]
    fn partial_with_a_bad_partition_is_an_error() {
        for bad in ["abc%", "30", "NaN%", "inf%"] {
            let err = version_for_new_pod(
                &canary_set(Some(bad), false),
                &history(),
                &labels(CANARY_POD),
                0.0,
            )
            .expect_err(bad);
            assert!(
                matches!(err, RevisionError::InvalidPartition { .. }),
                "{err}"
            );
        }
    }

    #[test]
    fn partial_with_a_bad_update_selector_is_an_error() {
        let mut s = canary_set(None, false);
        s.spec.update_strategy.selector = Some(LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                    key: "somekey".into(),
                    operator: "badOp".into(),
                    values: None,
                },
            ]),
        });
        let err = version_for_new_pod(&s, &history(), &labels(CANARY_POD), 0.0)
            .expect_err("bad selector");
        assert!(
            matches!(err, RevisionError::InvalidSelector { .. }),
            "{err}"
        );
    }

    #[test]
    fn paused_updates_always_inject_the_old_version() {
        let chosen = version_for_new_pod(
            &canary_set(Some("0%"), true),
            &history(),
            &labels(CANARY_POD),
            0.5,
        )
        .expect("ok");
        assert_eq!(image(&chosen), OLD_IMAGE);
    }

    #[test]
    fn partial_without_update_selector_draws_for_every_pod() {
        let mut s = canary_set(Some("50%"), false);
        s.spec.update_strategy.selector = None;
        let a = version_for_new_pod(&s, &history(), &labels(STABLE_POD), 0.1).expect("ok");
        let b = version_for_new_pod(&s, &history(), &labels(STABLE_POD), 0.9).expect("ok");
        assert_eq!((image(&a), image(&b)), (OLD_IMAGE, LATEST_IMAGE));
    }

    #[test]
    fn percentages_parse_like_upstream() {
        assert_eq!(parse_percentage("25%"), Some(0.25));
        assert_eq!(parse_percentage("12.5%"), Some(0.125));
        assert_eq!(parse_percentage("25"), None);
        assert_eq!(parse_percentage("%"), None);
    }
}
