//! Hot upgrade on the controller side: which twin of a hot sidecar takes the new image, and
//! when the twin that served before goes back to the empty image (the *flip*). The twins and
//! their annotations are [`kruise_rs_sidecar::hot_upgrade`]'s; the rollout around it (batches,
//! maxUnavailable, status) is the cold one.
//!
//! A hot sidecar `mesh` runs as `mesh-1` and `mesh-2`. In steady state the working twin (the
//! pod's `kruise.io/sidecarset-working-hotupgrade-container` entry) runs the SidecarSet's image
//! and the other runs `hotUpgradeEmptyImage`. An upgrade gives the new image to one twin
//! (`twin_to_upgrade`) and records it as working; the kubelet restarts only that twin while
//! the old one keeps serving, and the sidecar image hands over between them (reading
//! `SIDECARSET_VERSION_ALT`). Once every sidecar container but the old twin runs its spec image
//! and the pod is ready, `flip_patch` puts the old twin back on the empty image. Until then
//! the pod counts as updated but not ready, so it holds a place in `maxUnavailable`.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::PodCondition;
use serde_json::{Value, json};

use super::pods::{
    InPlaceUpdateState, LastContainerStatus, parse_update_states, render_update_states,
};
use kruise_rs_api::sidecarset::{SidecarContainer, SidecarSet};
use kruise_rs_api::well_known::{
    SIDECARSET_INPLACE_UPDATE_STATE, SIDECARSET_WORKING_HOTUPGRADE_CONTAINER,
};
use kruise_rs_controller::pod_summary::{ContainerSummary, PodSummary};
use kruise_rs_sidecar::hot_upgrade::{
    Twin, TwinRoles, is_hot_upgrade, record_flip, twin_name, twin_of, twin_roles, working_twins,
};

/// The SidecarSet's hot-upgrade sidecars (`spec.containers` only: native-sidecar init
/// containers get twins at injection, as upstream's, but are never upgraded hot; validation
/// refuses that combination with a rolling update).
pub(crate) fn hot_sidecars(set: &SidecarSet) -> impl Iterator<Item = &SidecarContainer> {
    set.spec.containers.iter().filter(|c| is_hot_upgrade(c))
}

/// `hotUpgradeEmptyImage` of a hot sidecar (empty when unset).
pub(crate) fn empty_image(sidecar: &SidecarContainer) -> &str {
    sidecar
        .upgrade_strategy
        .as_ref()
        .and_then(|s| s.hot_upgrade_empty_image.as_deref())
        .unwrap_or_default()
}

fn containers(pod: &PodSummary) -> &[ContainerSummary] {
    pod.spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
}

/// The container `name` of `pod` and its index.
pub(crate) fn container<'a>(
    pod: &'a PodSummary,
    name: &str,
) -> Option<(usize, &'a ContainerSummary)> {
    containers(pod)
        .iter()
        .enumerate()
        .find(|(_, c)| *c.name == *name)
}

fn image_of<'a>(pod: &'a PodSummary, name: &str) -> Option<&'a str> {
    container(pod, name).and_then(|(_, c)| c.image.as_deref())
}

/// The roles of `sidecar`'s twins in `pod`, read from its working annotation.
pub(crate) fn roles(pod: &PodSummary, sidecar: &str) -> TwinRoles {
    twin_roles(
        sidecar,
        &working_twins(pod.annotation(SIDECARSET_WORKING_HOTUPGRADE_CONTAINER)),
    )
}

/// Every other twin of `set`'s hot sidecars runs its empty image in the pod's spec (upstream's
/// extra condition in `IsPodReady`).
pub(crate) fn others_on_empty_image(set: &SidecarSet, pod: &PodSummary) -> bool {
    hot_sidecars(set).all(|s| {
        let other = roles(pod, &s.container.name).other;
        image_of(pod, &other) == Some(empty_image(s))
    })
}

/// Which twin of the hot `sidecar` gets the SidecarSet's image (upstream's
/// `findContainerToHotUpgrade`): a twin on the empty image (`-1` looked at first); else, when
/// exactly one twin is ready and runs its spec image (`settled`), the other one; else the one
/// that is not working (the older). `None` when the twin that is *not* chosen already runs the
/// new image: that pod needs no image change for this sidecar.
pub(crate) fn twin_to_upgrade(
    sidecar: &SidecarContainer,
    pod: &PodSummary,
    settled: impl Fn(&str) -> bool,
) -> Option<Twin> {
    let name = &sidecar.container.name;
    let empty = empty_image(sidecar);
    let image = |twin: Twin| image_of(pod, &twin_name(name, twin));
    let chosen = if image(Twin::First) == Some(empty) {
        Twin::First
    } else if image(Twin::Second) == Some(empty) {
        Twin::Second
    } else {
        match (
            settled(&twin_name(name, Twin::First)),
            settled(&twin_name(name, Twin::Second)),
        ) {
            (true, false) => Twin::Second,
            (false, true) => Twin::First,
            _ => twin_of(&roles(pod, name).other, name).unwrap_or(Twin::Second),
        }
    };
    let wanted = sidecar.container.image.as_deref();
    (image(chosen.other()) != wanted).then_some(chosen)
}

/// What `flip_patch` resets.
#[derive(Debug)]
pub struct Flip {
    pub patch: json_patch::Patch,
    /// The twins put back on their empty image.
    pub reset: Vec<String>,
}

/// Whether the pod may flip, apart from the twins to reset (upstream's `isHotUpgradingReady`):
/// Running and Ready, or every container status but those of `resetting` ready.
fn ready_but(pod: &PodSummary, resetting: &BTreeSet<&str>) -> bool {
    let status = pod.status.as_ref();
    let running = status.and_then(|s| s.phase.as_deref()) == Some("Running");
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|all| all.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c: &PodCondition| c.status == "True");
    if running && ready {
        return true;
    }
    status
        .and_then(|s| s.container_statuses.as_deref())
        .unwrap_or_default()
        .iter()
        .filter(|s| !resetting.contains(&*s.name))
        .all(|s| s.ready)
}

/// The patch that puts the old twins of `set`'s hot sidecars in `pod` back on the empty image,
/// or `None` when there is none to reset or the pod is not there yet. `settled(container)`
/// says a sidecar container runs its spec image (the controller's state consistency): every
/// sidecar container but the twins being reset must, and the pod must be ready apart from
/// them. The patch tests the working annotation it read, the name and image of each container
/// it resets and the annotations it changes; records each reset twin's imageID in
/// `kruise.io/sidecarset-inplace-update-state` (so the pod counts as settled only once the
/// kubelet restarted it); and sets `version.<old>` = `"0"`, `versionalt.<working>` = `"0"`.
pub(crate) fn flip_patch(
    set: &SidecarSet,
    pod: &PodSummary,
    sidecar_containers: &[String],
    settled: impl Fn(&str) -> bool,
) -> Option<Flip> {
    let mut resets: Vec<(TwinRoles, &SidecarContainer)> = Vec::new();
    for sidecar in hot_sidecars(set) {
        let roles = roles(pod, &sidecar.container.name);
        let on = image_of(pod, &roles.other)?;
        if on != empty_image(sidecar) {
            resets.push((roles, sidecar));
        }
    }
    if resets.is_empty() {
        return None;
    }
    let resetting: BTreeSet<&str> = resets.iter().map(|(r, _)| r.other.as_str()).collect();
    let others_settled = sidecar_containers
        .iter()
        .filter(|c| !resetting.contains(c.as_str()))
        .all(|c| settled(c));
    if !others_settled || !ready_but(pod, &resetting) {
        return None;
    }

    let set_name = set.metadata.name.clone().unwrap_or_default();
    let annotations = &pod.annotation_map().unwrap_or_default();
    let mut tests = Vec::new();
    let mut writes = Vec::new();
    // The roles were read from it: a concurrent upgrade changes them.
    match annotations.get(SIDECARSET_WORKING_HOTUPGRADE_CONTAINER) {
        Some(value) => tests.push(json!({"op": "test",
            "path": super::upgrade::annotation_path(SIDECARSET_WORKING_HOTUPGRADE_CONTAINER),
            "value": value})),
        // Only a pod with a working entry per hot sidecar is owned; kept for safety.
        None => return None,
    }
    let mut after = annotations.clone();
    let mut states = annotations
        .get(SIDECARSET_INPLACE_UPDATE_STATE)
        .and_then(|v| parse_update_states(v))
        .unwrap_or_default();
    let state = states
        .entry(set_name)
        .or_insert_with(|| InPlaceUpdateState {
            revision: String::new(),
            ..Default::default()
        });
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_deref())
        .unwrap_or_default();
    let mut reset = Vec::new();
    for (roles, sidecar) in &resets {
        let (i, c) = container(pod, &roles.other)?;
        tests.push(
            json!({"op": "test", "path": format!("/spec/containers/{i}/name"), "value": &*c.name}),
        );
        tests.push(
            json!({"op": "test", "path": format!("/spec/containers/{i}/image"), "value": c.image.as_deref()}),
        );
        writes.push(
            json!({"op": "replace", "path": format!("/spec/containers/{i}/image"),
            "value": empty_image(sidecar)}),
        );
        let image_id = statuses
            .iter()
            .find(|s| s.name == c.name)
            .map(|s| s.image_id.to_string())
            .unwrap_or_default();
        state
            .last_container_statuses
            .insert(c.name.to_string(), LastContainerStatus { image_id });
        record_flip(&mut after, roles);
        reset.push(c.name.to_string());
    }
    after.insert(
        SIDECARSET_INPLACE_UPDATE_STATE.to_owned(),
        render_update_states(&states),
    );
    if !pod.has_annotations() {
        writes.insert(
            0,
            json!({"op": "add", "path": "/metadata/annotations", "value": {}}),
        );
    }
    super::upgrade::annotation_ops(annotations, &after, &mut tests, &mut writes);
    tests.extend(writes);
    let patch = serde_json::from_value(Value::Array(tests))
        .expect("the operations are well-formed JSON patch operations");
    Some(Flip { patch, reset })
}

#[cfg(test)]
mod tests;
