//! A sidecar's resources computed from the pod's containers at creation (`resourcesPolicy`;
//! upstream's `pkg/webhook/pod/mutating/sidecarset_resources.go`, kruise.md §3).
//!
//! [`apply_resources_policy`] gives one injected sidecar its `resources`:
//!
//! 1. **Targets**: the pod's native-sidecar init containers (`restartPolicy: Always`), then its
//!    containers, whose names match `targetContainersNameRegex` (unanchored, default `.*`),
//!    leaving out every container or init container name of the SidecarSets selected for the
//!    pod (Kruise's own sidecars) and plain init containers. No target is an error: the pod is
//!    denied.
//! 2. **Aggregation**, per resource (`cpu`, `memory`), by `targetContainersMode`: `sum` adds the
//!    targets' values, `max` takes the largest. A request a target does not set counts as 0;
//!    a limit a target does not set is unlimited, which makes the aggregate limit unlimited.
//! 3. **Expressions** ([`expr`]): each non-empty expression of `resourcesExpr.limits` and
//!    `resourcesExpr.requests` is evaluated with its variable bound to the aggregate. A limit
//!    whose aggregate is unlimited is left unset; a request whose aggregate is missing is
//!    computed from 0.
//!
//! The sidecar's `limits` and `requests` become exactly the computed values (validation forbids
//! setting them by hand next to `resourcesPolicy`); its `claims` are kept (upstream drops them).
//! Quantities are computed as Go's `resource.Quantity` computes them, format included, so the
//! admitted values read as upstream's (`100Mi × 40%` is `40Mi`, not `41943040`).

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use kruise_rs_api::sidecarset::{
    ResourceExpressions, ResourcesPolicy, SidecarContainer, TargetContainersMode,
};

pub(crate) use kruise_rs_api::quantity::Qty;
pub(crate) use kruise_rs_api::quantity::expr::{ExprError, Resource, ResourceExpr};

/// Why a sidecar's resources cannot be computed; the pod is denied.
#[derive(Debug, thiserror::Error)]
pub enum ResourcesPolicyError {
    #[error("targetContainersNameRegex {regex:?} is not a valid regular expression: {reason}")]
    Regex { regex: String, reason: String },
    #[error("no container of the pod matches targetContainersNameRegex {0:?}")]
    NoTarget(String),
    #[error("container {container}: resources.{field} {value:?} is not a valid quantity")]
    TargetQuantity {
        container: String,
        field: String,
        value: String,
    },
    #[error("the aggregated {0} of the target containers is too large")]
    Overflow(&'static str),
    #[error("resourcesExpr.{field} {expr:?}: {source}")]
    Expression {
        field: String,
        expr: String,
        #[source]
        source: ExprError,
    },
}

/// The target containers' `cpu` and `memory`: limits (`None`: unlimited) and requests (`None`:
/// no target requests any).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Aggregate {
    pub limits: BTreeMap<Resource, Option<Qty>>,
    pub requests: BTreeMap<Resource, Option<Qty>>,
}

/// The resources `sidecar` gets in a pod with spec `pod`: its own, or what its
/// `resourcesPolicy` computes from the pod's containers, exactly as at injection. The SidecarSet
/// controller resizes running pods to this when only a sidecar's resources changed.
pub fn sidecar_resources(
    sidecar: &SidecarContainer,
    pod: &PodSpec,
    sidecar_names: &HashSet<&str>,
) -> Result<Option<ResourceRequirements>, ResourcesPolicyError> {
    let mut container = sidecar.container.clone();
    if let Some(policy) = &sidecar.resources_policy {
        apply_resources_policy(&mut container, policy, pod, sidecar_names)?;
    }
    Ok(container.resources)
}

/// Gives `container` (the sidecar being injected) the resources `policy` computes from `pod`.
/// `sidecar_names` are the container and init container names of every SidecarSet selected for
/// the pod; containers of the pod with those names are never targets.
pub(crate) fn apply_resources_policy(
    container: &mut Container,
    policy: &ResourcesPolicy,
    pod: &PodSpec,
    sidecar_names: &HashSet<&str>,
) -> Result<(), ResourcesPolicyError> {
    let targets = target_containers(pod, policy, sidecar_names)?;
    let aggregate = aggregate(&targets, policy.target_containers_mode)?;
    let limits = compute(
        policy.resources_expr.limits.as_ref(),
        &aggregate.limits,
        "limits",
    )?;
    let requests = compute(
        policy.resources_expr.requests.as_ref(),
        &aggregate.requests,
        "requests",
    )?;
    let claims = container.resources.take().and_then(|r| r.claims);
    container.resources = Some(ResourceRequirements {
        claims,
        limits,
        requests,
    });
    Ok(())
}

/// The pod's containers `policy` reads, in upstream's order: native-sidecar init containers,
/// then containers.
pub(crate) fn target_containers<'p>(
    pod: &'p PodSpec,
    policy: &ResourcesPolicy,
    sidecar_names: &HashSet<&str>,
) -> Result<Vec<&'p Container>, ResourcesPolicyError> {
    let source = policy
        .target_containers_name_regex
        .as_deref()
        .unwrap_or(".*");
    let regex = regex::Regex::new(source).map_err(|e| ResourcesPolicyError::Regex {
        regex: source.to_owned(),
        reason: e.to_string(),
    })?;
    let native = pod
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"));
    let targets: Vec<&Container> = native
        .chain(&pod.containers)
        .filter(|c| !sidecar_names.contains(c.name.as_str()) && regex.is_match(&c.name))
        .collect();
    if targets.is_empty() {
        return Err(ResourcesPolicyError::NoTarget(source.to_owned()));
    }
    Ok(targets)
}

/// Aggregates the targets' `cpu` and `memory` by `mode`.
pub(crate) fn aggregate(
    targets: &[&Container],
    mode: TargetContainersMode,
) -> Result<Aggregate, ResourcesPolicyError> {
    let mut out = Aggregate::default();
    for resource in [Resource::Cpu, Resource::Memory] {
        let read = |c: &Container, list: &str| -> Result<Option<Qty>, ResourcesPolicyError> {
            let requirements = c.resources.as_ref();
            let values = match list {
                "limits" => requirements.and_then(|r| r.limits.as_ref()),
                _ => requirements.and_then(|r| r.requests.as_ref()),
            };
            let Some(Quantity(text)) = values.and_then(|v| v.get(resource.as_str())) else {
                return Ok(None);
            };
            Qty::parse(text)
                .map(Some)
                .ok_or_else(|| ResourcesPolicyError::TargetQuantity {
                    container: c.name.clone(),
                    field: format!("{list}.{}", resource.as_str()),
                    value: text.clone(),
                })
        };
        let mut limits = Vec::new();
        let mut unlimited = false;
        let mut requests = Vec::new();
        for c in targets {
            match read(c, "limits")? {
                Some(q) => limits.push(q),
                None => unlimited = true,
            }
            requests.extend(read(c, "requests")?);
        }
        let combine = |values: Vec<Qty>| -> Result<Option<Qty>, ResourcesPolicyError> {
            match mode {
                TargetContainersMode::Sum => {
                    let mut sum = Qty::zero();
                    for v in &values {
                        sum = sum
                            .add(v)
                            .map_err(|_| ResourcesPolicyError::Overflow(resource.as_str()))?;
                    }
                    Ok(Some(sum))
                }
                // The first of equal values wins, as upstream.
                TargetContainersMode::Max => Ok(values
                    .into_iter()
                    .reduce(|best, v| if v.exceeds(&best) { v } else { best })),
            }
        };
        let limit = if unlimited { None } else { combine(limits)? };
        let request = combine(requests)?;
        out.limits.insert(resource, limit);
        out.requests.insert(resource, request);
    }
    Ok(out)
}

/// The values of one list (`limits` or `requests`) of `resourcesExpr`.
fn compute(
    expressions: Option<&ResourceExpressions>,
    aggregate: &BTreeMap<Resource, Option<Qty>>,
    list: &'static str,
) -> Result<Option<BTreeMap<String, Quantity>>, ResourcesPolicyError> {
    let Some(expressions) = expressions else {
        return Ok(None);
    };
    let mut out = BTreeMap::new();
    for (resource, text) in [
        (Resource::Cpu, &expressions.cpu),
        (Resource::Memory, &expressions.memory),
    ] {
        let Some(text) = text.as_deref().filter(|t| !t.is_empty()) else {
            continue;
        };
        let value = match aggregate.get(&resource).cloned().flatten() {
            Some(v) => v,
            // An unlimited aggregate limit leaves the sidecar's limit unset.
            None if list == "limits" => continue,
            None => Qty::zero(),
        };
        let fail = |source| ResourcesPolicyError::Expression {
            field: format!("{list}.{}", resource.as_str()),
            expr: text.to_owned(),
            source,
        };
        let result = ResourceExpr::parse(text, resource)
            .and_then(|e| e.evaluate(&value))
            .map_err(fail)?;
        out.insert(resource.as_str().to_owned(), Quantity(result.to_text()));
    }
    Ok((!out.is_empty()).then_some(out))
}
