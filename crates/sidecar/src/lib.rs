//! Pure SidecarSet logic, shared by the pod-injection webhook and the upgrade controller.
//!
//! Nothing here does I/O: callers fetch the SidecarSets, the Namespace's labels, the
//! ControllerRevisions and a random number, and get back decisions and objects to write.
//!
//! - [`matching`]: which SidecarSets apply to a pod (selectors, namespaces, pause, canaries).
//! - [`revision`]: which version of a SidecarSet a new pod gets (`injectionStrategy.revision`).
//! - `injection`: the pod after injection, and the JSON patch the webhook returns.
//! - [`metadata`]: `patchPodMetadata` (Retain / Overwrite / MergePatchJson).
//! - [`annotations`]: the pod annotations recording what was injected, in upstream's bytes.
//! - [`hash`]: the SidecarSet hashes, equal to upstream's.
//! - [`hot_upgrade`]: the twins of a `HotUpgrade` sidecar and their pod annotations, used by
//!   injection and by the controller's twin flips (`controllers::sidecarset::twin_flip`).
//! - [`unsupported`]: SidecarSet features kruise-rs does not serve yet, and which SidecarSets a
//!   new pod goes without because of them.
//!
//! For a pod being created, [`plan_for_new_pod`] chains matching and revision choice,
//! [`unsupported::screen`] sets aside the SidecarSets using an unsupported feature; then
//! [`injection::inject`] builds the pod and [`injection::pod_patch`] the admission patch.

pub mod annotations;
pub mod gojson;
pub mod hash;
pub mod hot_upgrade;
mod injection;
pub mod matching;
pub mod metadata;
mod resources;
pub mod revision;
pub mod unsupported;

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::Pod;

use kruise_rs_api::sidecarset::{SidecarSet, SidecarSetInjectRevisionPolicy};

pub use injection::{Injection, InjectionError, InjectionOptions, inject, inject_with, pod_patch};
pub use matching::MatchError;
pub use resources::{ResourcesPolicyError, sidecar_resources};
pub use revision::{RevisionError, SelectedSidecarSet};

/// Why the SidecarSets for a new pod cannot be decided.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Match(#[from] MatchError),
    #[error(transparent)]
    Revision(#[from] RevisionError),
}

/// The SidecarSets to inject into a new pod, each at its chosen version, in name order; none
/// for a pod that is finished or being deleted (upstream skips those too).
///
/// `history(name)` returns that SidecarSet's ControllerRevisions; it is called only for
/// SidecarSets that pin a revision. `random()` returns a number uniformly drawn from `[0, 1)`;
/// it is called only for the `Partial` injection policy. A canary's base is dropped before its
/// revision is looked up, so a base with broken history cannot block pods its canary serves
/// (upstream looks the revision up first).
pub fn plan_for_new_pod<'a, 'h>(
    candidates: impl IntoIterator<Item = &'a SidecarSet>,
    pod: &Pod,
    namespace_labels: &BTreeMap<String, String>,
    mut history: impl FnMut(&str) -> &'h [ControllerRevision],
    mut random: impl FnMut() -> f64,
) -> Result<Vec<SelectedSidecarSet>, PlanError> {
    if !matching::pod_is_active(pod) {
        return Ok(Vec::new());
    }
    let empty = BTreeMap::new();
    let pod_labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    let mut out = Vec::new();
    for set in matching::sidecarsets_for_pod(candidates, pod, namespace_labels)? {
        let wanted = set.spec.injection_strategy.revision.as_ref();
        let pins = wanted.is_some_and(|r| r.revision_name.is_some() || r.custom_version.is_some());
        let selected = if pins {
            let partial =
                wanted.and_then(|r| r.policy) == Some(SidecarSetInjectRevisionPolicy::Partial);
            let draw = if partial { random() } else { 0.0 };
            let name = set.metadata.name.as_deref().unwrap_or_default();
            revision::version_for_new_pod(set, history(name), pod_labels, draw)?
        } else {
            SelectedSidecarSet::latest(set)
        };
        out.push(selected);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kruise_rs_api::sidecarset::{SidecarSetInjectRevision, SidecarSetSpec};
    use kruise_rs_api::well_known::{SIDECARSET_BASE, SIDECARSET_CANARY};
    use serde_json::json;

    fn set(name: &str, image: &str) -> SidecarSet {
        let spec: SidecarSetSpec = serde_json::from_value(json!({
            "selector": {"matchLabels": {"app": "web"}},
            "containers": [{"name": format!("{name}-c"), "image": image}],
        }))
        .expect("spec");
        SidecarSet::new(name, spec)
    }

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "app", "image": "app:1"}]},
        }))
        .expect("pod")
    }

    #[test]
    fn plans_matching_sidecarsets_without_touching_history_or_randomness() {
        let sets = [set("b", "b:1"), set("a", "a:1")];
        let plan = plan_for_new_pod(
            &sets,
            &pod(),
            &BTreeMap::new(),
            |_| panic!("no revision is pinned"),
            || panic!("no Partial policy"),
        )
        .expect("plan");
        let names: Vec<_> = plan.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
    }

    #[test]
    fn inactive_pods_get_nothing() {
        let mut p = pod();
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2024-01-01T00:00:00Z".parse().expect("time"),
        ));
        let plan = plan_for_new_pod(&[set("a", "a:1")], &p, &BTreeMap::new(), |_| &[], || 0.0)
            .expect("plan");
        assert!(plan.is_empty());
    }

    #[test]
    fn a_dropped_canary_base_never_needs_its_history() {
        let mut base = set("base", "b:1");
        base.spec.injection_strategy.revision = Some(SidecarSetInjectRevision {
            revision_name: Some("gone".into()),
            ..Default::default()
        });
        let mut canary = set("canary", "c:1");
        canary.metadata.annotations = Some(BTreeMap::from([
            (SIDECARSET_CANARY.to_owned(), "true".to_owned()),
            (SIDECARSET_BASE.to_owned(), "base".to_owned()),
        ]));
        let plan = plan_for_new_pod(&[base, canary], &pod(), &BTreeMap::new(), |_| &[], || 0.5)
            .expect("plan");
        assert_eq!(plan.len(), 1);
        assert_eq!(plan[0].name, "canary");
    }

    #[test]
    fn a_missing_pinned_revision_fails_the_plan() {
        let mut s = set("s", "s:1");
        s.spec.injection_strategy.revision = Some(SidecarSetInjectRevision {
            custom_version: Some("v1".into()),
            ..Default::default()
        });
        let err = plan_for_new_pod(&[s], &pod(), &BTreeMap::new(), |_| &[], || 0.5)
            .expect_err("no history");
        assert!(matches!(err, PlanError::Revision(_)), "{err}");
    }

    #[test]
    fn the_whole_pipeline_produces_an_admission_patch() {
        let sets = [set("a", "a:1")];
        let p = pod();
        let plan = plan_for_new_pod(&sets, &p, &BTreeMap::new(), |_| &[], || 0.0).expect("plan");
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2024-01-01T00:00:00Z".parse().expect("time"),
        );
        let injection = inject(&p, &plan, now).expect("inject");
        let patch = pod_patch(&p, &injection.pod).expect("patch");
        let mut patched = serde_json::to_value(&p).expect("json");
        json_patch::patch(&mut patched, &patch.0).expect("applies");
        assert_eq!(patched, serde_json::to_value(&injection.pod).expect("json"));
        assert!(!patch.0.is_empty());
    }
}
