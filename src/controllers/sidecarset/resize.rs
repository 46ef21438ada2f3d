//! What an in-place upgrade sends to `pods/resize` when a SidecarSet changed its sidecars'
//! resources (and nothing else but images): the sidecars' new `resources`, as one strategic
//! merge patch of the pod's containers and native-sidecar init containers by name.
//!
//! - A sidecar's new resources are what injection would give it now
//!   ([`kruise_rs_sidecar::sidecar_resources`]): the SidecarSet's `resources`, or what its
//!   `resourcesPolicy` computes from the pod's app containers, so a policy is re-evaluated when
//!   the SidecarSet changes.
//! - Both twins of a hot-upgrade sidecar are resized (injection gives both its resources).
//! - The containers are listed in the pod's order: the apiserver reads a list in another order
//!   as a reordering, which a resize may not do (seen on 1.36.3).
//! - A limit without a request also requests that much, as the apiserver defaults a new pod.
//! - A request or limit the pod has and the new resources do not is sent as `null`: the
//!   apiserver refuses to remove one, and says so, rather than the pod silently keeping it.
//! - The patch carries the pod's `resourceVersion`: a pod changed since it was read is refused
//!   (409) and the controller tries again from fresh data.
//! - The kubelet applies the resize following each container's `resizePolicy`
//!   (`NotRequired` in place, `RestartContainer` restarts only that container); the controller
//!   follows it through the pod's resize conditions (`super::pods::kubelet_resize`).

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use serde_json::{Map, Value, json};

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kruise_rs_api::quantity::Qty;
use kruise_rs_api::sidecarset::{SidecarContainer, SidecarSet};
use kruise_rs_api::well_known::SIDECARSET_HASH;
use kruise_rs_sidecar::annotations::parse_hashes;
use kruise_rs_sidecar::hash::is_native_sidecar;
use kruise_rs_sidecar::hot_upgrade::{is_hot_upgrade, twin_names};
use kruise_rs_sidecar::{ResourcesPolicyError, sidecar_resources};

#[cfg(test)]
mod tests;

/// Why a pod's sidecars cannot be given their new resources.
#[derive(Debug, thiserror::Error)]
#[error("container {container}: resourcesPolicy: {source}")]
pub(crate) struct ResizeError {
    container: String,
    #[source]
    source: ResourcesPolicyError,
}

/// The `pods/resize` patch that gives `pod`'s sidecars of `set` their new resources, or `None`
/// when every one already has them.
pub(crate) fn resize_patch(set: &SidecarSet, pod: &Pod) -> Result<Option<Value>, ResizeError> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(None);
    };
    let names = sidecar_names(set, pod);
    // In the pod's order: the apiserver refuses a resize whose list reads as a reordering.
    let mut containers = Vec::new();
    for c in &spec.containers {
        let sidecar = set.spec.containers.iter().find(|s| {
            s.container.name == c.name
                || (is_hot_upgrade(s) && twin_names(&s.container.name).contains(&c.name))
        });
        if let Some(sidecar) = sidecar {
            containers.extend(container_patch(sidecar, c, spec, &names)?);
        }
    }
    let mut init_containers = Vec::new();
    for c in spec.init_containers.iter().flatten() {
        let sidecar = set
            .spec
            .init_containers
            .iter()
            .find(|s| is_native_sidecar(s) && s.container.name == c.name);
        if let Some(sidecar) = sidecar {
            init_containers.extend(container_patch(sidecar, c, spec, &names)?);
        }
    }
    if containers.is_empty() && init_containers.is_empty() {
        return Ok(None);
    }
    let mut spec_patch = Map::new();
    if !containers.is_empty() {
        spec_patch.insert("containers".into(), Value::Array(containers));
    }
    if !init_containers.is_empty() {
        spec_patch.insert("initContainers".into(), Value::Array(init_containers));
    }
    Ok(Some(json!({
        "metadata": {"resourceVersion": pod.metadata.resource_version},
        "spec": spec_patch,
    })))
}

/// The names no `resourcesPolicy` targets: every sidecar the pod's SidecarSets injected (their
/// hash entries list them) and this SidecarSet's, twins included.
fn sidecar_names(set: &SidecarSet, pod: &Pod) -> HashSet<String> {
    let mut names: HashSet<String> = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SIDECARSET_HASH))
        .and_then(|v| parse_hashes(SIDECARSET_HASH, v).ok())
        .into_iter()
        .flat_map(|entries| entries.into_values())
        .flat_map(|e| e.sidecar_list.unwrap_or_default())
        .collect();
    for sidecar in set.spec.containers.iter().chain(&set.spec.init_containers) {
        names.insert(sidecar.container.name.clone());
        if is_hot_upgrade(sidecar) {
            names.extend(twin_names(&sidecar.container.name));
        }
    }
    names
}

/// `{name, resources}` for `container` when its resources are not `sidecar`'s.
fn container_patch(
    sidecar: &SidecarContainer,
    container: &Container,
    spec: &PodSpec,
    names: &HashSet<String>,
) -> Result<Option<Value>, ResizeError> {
    let names: HashSet<&str> = names.iter().map(String::as_str).collect();
    let wanted = sidecar_resources(sidecar, spec, &names)
        .map_err(|source| ResizeError {
            container: container.name.clone(),
            source,
        })?
        .unwrap_or_default();
    let wanted = with_defaulted_requests(wanted);
    let have = container.resources.clone().unwrap_or_default();
    if same_cpu_memory(&have, &wanted) {
        return Ok(None);
    }
    Ok(Some(json!({
        "name": container.name,
        "resources": {
            "requests": with_removals(have.requests.as_ref(), wanted.requests.as_ref()),
            "limits": with_removals(have.limits.as_ref(), wanted.limits.as_ref()),
        },
    })))
}

/// `resources` as the apiserver stores them in a new pod: a limit without a request also
/// requests that much. Without this, a sidecar that sets only limits would send its request as
/// removed.
fn with_defaulted_requests(mut resources: ResourceRequirements) -> ResourceRequirements {
    let limits = resources.limits.clone().unwrap_or_default();
    if !limits.is_empty() {
        let requests = resources.requests.get_or_insert_with(Default::default);
        for (key, value) in limits {
            requests.entry(key).or_insert(value);
        }
    }
    resources
}

type Quantities = std::collections::BTreeMap<String, Quantity>;

/// `wanted`, with a `null` for each resource `have` sets and `wanted` does not.
fn with_removals(have: Option<&Quantities>, wanted: Option<&Quantities>) -> Value {
    let mut out = Map::new();
    for key in have.into_iter().flat_map(|h| h.keys()) {
        out.insert(key.clone(), Value::Null);
    }
    for (key, value) in wanted.into_iter().flatten() {
        out.insert(key.clone(), Value::String(value.0.clone()));
    }
    Value::Object(out)
}

/// Whether `a` and `b` ask for the same requests and limits, quantities compared by value
/// (`0.2` and `200m` are one CPU amount; the apiserver stores the canonical form, a SidecarSet
/// keeps what its author wrote).
fn same_cpu_memory(a: &ResourceRequirements, b: &ResourceRequirements) -> bool {
    same_quantities(a.requests.as_ref(), b.requests.as_ref())
        && same_quantities(a.limits.as_ref(), b.limits.as_ref())
}

fn same_quantities(a: Option<&Quantities>, b: Option<&Quantities>) -> bool {
    let empty = Quantities::new();
    let (a, b) = (a.unwrap_or(&empty), b.unwrap_or(&empty));
    a.len() == b.len()
        && a.iter().all(|(key, value)| {
            b.get(key)
                .is_some_and(|other| same_quantity(&value.0, &other.0))
        })
}

fn same_quantity(a: &str, b: &str) -> bool {
    a == b
        || match (Qty::parse(a), Qty::parse(b)) {
            (Some(a), Some(b)) => !a.exceeds(&b) && !b.exceeds(&a),
            _ => false,
        }
}
