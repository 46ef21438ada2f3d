//! A SidecarSet's containers, init containers and volumes checked by Kubernetes' own pod
//! validation: a pod built from the SidecarSet ([`synthetic_pod`]) is created with
//! `dryRun=All` in the manager's namespace, and the apiserver's field errors are mapped back to
//! the SidecarSet's paths (`map_causes`). Upstream runs the same validation in-process; the
//! Rust checks in `kruise_rs_api::validation::pod_spec` cover the common rules, this covers the
//! rest (resources, quantities, securityContext, envFrom, lifecycle and probe handlers).
//! [Decision 0012](../../docs/decisions/0012-sidecarset-validated-by-a-dry-run-pod.md): a dry
//! run that cannot be made admits, with a warning.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::{Map, Value, json};

/// Name of the app container the synthetic pod carries besides the sidecars (suffixed if a
/// sidecar has the same name).
pub(crate) const PLACEHOLDER: &str = "kruise-rs-dry-run-app";
/// `generateName` of the synthetic pod (never stored: dry run).
pub const GENERATE_NAME: &str = "kruise-rs-sidecarset-dry-run-";
/// How long the dry run may take before the SidecarSet is admitted unchecked.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(5);
/// Verdicts remembered (one per SidecarSet name); past this the memory starts over.
const CACHE_LIMIT: usize = 4096;

/// Container fields that only a SidecarSet has: not sent to the pod.
const SIDECARSET_FIELDS: [&str; 6] = [
    "podInjectPolicy",
    "upgradeStrategy",
    "shareVolumePolicy",
    "shareVolumeDevicePolicy",
    "transferEnv",
    "resourcesPolicy",
];

/// The pod whose validation stands for the SidecarSet's: the SidecarSet's containers (in order,
/// then a placeholder app container), init containers (native sidecars keep `restartPolicy:
/// Always`), volumes and imagePullSecrets, as written (`set` is the raw object, so fields this
/// crate's types do not know reach the apiserver too), without the SidecarSet-only fields.
/// The lists keep their indexes, so the pod's `spec.containers[i]` is the SidecarSet's.
pub fn synthetic_pod(set: &Value, namespace: &str) -> Value {
    let spec = &set["spec"];
    let strip = |list: &Value| -> Vec<Value> {
        list.as_array()
            .map(|items| {
                items
                    .iter()
                    .map(|item| match item {
                        Value::Object(fields) => Value::Object(
                            fields
                                .iter()
                                .filter(|(k, _)| !SIDECARSET_FIELDS.contains(&k.as_str()))
                                .map(|(k, v)| (k.clone(), v.clone()))
                                .collect::<Map<_, _>>(),
                        ),
                        other => other.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut containers = strip(&spec["containers"]);
    let init_containers = strip(&spec["initContainers"]);
    let taken = |name: &str| {
        containers
            .iter()
            .chain(&init_containers)
            .any(|c| c["name"].as_str() == Some(name))
    };
    let mut placeholder = PLACEHOLDER.to_owned();
    while taken(&placeholder) {
        placeholder.push('x');
    }
    containers.push(json!({"name": placeholder, "image": "placeholder"}));
    let mut pod_spec = json!({
        "containers": containers,
        // What ServiceAccount admission would set (projected tokens need it); no token volume.
        "serviceAccountName": "default",
        "automountServiceAccountToken": false,
    });
    if !init_containers.is_empty() {
        pod_spec["initContainers"] = Value::Array(init_containers);
    }
    for field in ["volumes", "imagePullSecrets"] {
        if let Some(list) = spec.get(field).filter(|v| !v.is_null()) {
            pod_spec[field] = list.clone();
        }
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": GENERATE_NAME, "namespace": namespace},
        "spec": pod_spec,
    })
}

/// The apiserver's field error `field` (a path in the synthetic pod) as a path in the
/// SidecarSet: containers, init containers, volumes and imagePullSecrets keep their indexes;
/// the placeholder (index `sidecars`, the SidecarSet's container count) and fields the
/// SidecarSet does not have are named as the pod's.
pub(crate) fn map_field(field: &str, sidecars: usize) -> String {
    let placeholder = format!("spec.containers[{sidecars}]");
    let is_list_item = |list: &str| {
        field
            .strip_prefix(list)
            .is_some_and(|rest| rest.starts_with('['))
    };
    if field.starts_with(&placeholder) {
        return format!("(the dry-run pod's app container) {field}");
    }
    if [
        "spec.containers",
        "spec.initContainers",
        "spec.volumes",
        "spec.imagePullSecrets",
    ]
    .iter()
    .any(|list| is_list_item(list))
    {
        return field.to_owned();
    }
    format!("(the dry-run pod) {field}")
}

/// The denial lines for an apiserver `Invalid` status: one `path: message` per cause, paths
/// mapped by [`map_field`]; the status message when there are no causes.
pub(crate) fn map_causes(status: &kube::core::Status, sidecars: usize) -> Vec<String> {
    let causes = status
        .details
        .as_ref()
        .map(|d| d.causes.as_slice())
        .unwrap_or_default();
    if causes.is_empty() {
        return vec![status.message.clone()];
    }
    causes
        .iter()
        .map(|cause| {
            if cause.field.is_empty() {
                cause.message.clone()
            } else {
                format!("{}: {}", map_field(&cause.field, sidecars), cause.message)
            }
        })
        .collect()
}

/// The quantities of `pod` (a [`synthetic_pod`]) that do not parse, as SidecarSet field
/// errors: the apiserver refuses such a pod while decoding it (400, without a field path), so
/// they are found here. Resources of the sidecars and init containers, `emptyDir.sizeLimit`.
pub(crate) fn unparseable_quantities(pod: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let mut check = |path: String, value: &Value| {
        let text = value
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| value.to_string());
        let parses = match value {
            Value::String(s) => kruise_rs_api::quantity::go_quantity_text(s).is_some(),
            Value::Number(_) => true,
            _ => false,
        };
        if !parses {
            out.push(format!(
                "{path}: Invalid value: {text:?}: quantities must match the regular expression \
                 '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
            ));
        }
    };
    for list in ["containers", "initContainers"] {
        let items = pod["spec"][list]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        for (i, c) in items.iter().enumerate() {
            for part in ["limits", "requests"] {
                if let Some(map) = c["resources"][part].as_object() {
                    for (name, value) in map {
                        check(format!("spec.{list}[{i}].resources.{part}[{name}]"), value);
                    }
                }
            }
        }
    }
    let volumes = pod["spec"]["volumes"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    for (i, v) in volumes.iter().enumerate() {
        if let Some(limit) = v["emptyDir"].get("sizeLimit").filter(|l| !l.is_null()) {
            check(format!("spec.volumes[{i}].emptyDir.sizeLimit"), limit);
        }
    }
    out
}

/// What the dry run said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The apiserver admits the pod.
    Valid,
    /// The apiserver refuses it as invalid (422): the SidecarSet's errors.
    Invalid(Vec<String>),
    /// No verdict (timeout, no permission, another admission plugin's refusal...): why.
    Unknown(String),
}

/// Remembered verdicts: per SidecarSet name, the digest of the synthetic pod judged and the
/// verdict (only [`Outcome::Valid`] and [`Outcome::Invalid`]: they depend on the pod alone).
#[derive(Default)]
pub(crate) struct Verdicts {
    by_name: Mutex<HashMap<String, ([u8; 32], Outcome)>>,
}

fn digest(pod: &Value) -> [u8; 32] {
    let bytes = serde_json::to_vec(pod).unwrap_or_default();
    let mut out = [0u8; 32];
    out.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, &bytes).as_ref());
    out
}

impl Verdicts {
    /// The remembered verdict for `name`'s `pod`, if the pod is the one judged.
    pub(crate) fn get(&self, name: &str, pod: &Value) -> Option<Outcome> {
        let key = digest(pod);
        let map = self.by_name.lock().unwrap_or_else(|e| e.into_inner());
        map.get(name)
            .filter(|(d, _)| *d == key)
            .map(|(_, o)| o.clone())
    }

    /// Remembers a definite verdict (an [`Outcome::Unknown`] is not remembered).
    pub(crate) fn put(&self, name: &str, pod: &Value, outcome: &Outcome) {
        if matches!(outcome, Outcome::Unknown(_)) {
            return;
        }
        let mut map = self.by_name.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= CACHE_LIMIT && !map.contains_key(name) {
            map.clear();
        }
        map.insert(name.to_owned(), (digest(pod), outcome.clone()));
    }
}

/// Creates `pod` with `dryRun=All` (bounded by `TIMEOUT`) and classifies the answer.
/// `sidecars` is the SidecarSet's container count (for `map_causes`).
pub async fn judge(client: &Client, pod: &Value, sidecars: usize) -> Outcome {
    let namespace = pod["metadata"]["namespace"].as_str().unwrap_or_default();
    let object: DynamicObject = match serde_json::from_value(pod.clone()) {
        Ok(object) => object,
        Err(e) => return Outcome::Unknown(format!("cannot encode the dry-run pod: {e}")),
    };
    let resource = ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&());
    let api = Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &resource);
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let answer = tokio::time::timeout(TIMEOUT, api.create(&params, &object)).await;
    classify(pod, sidecars, answer.map(|created| created.map(drop)))
}

/// The verdict of the dry run's answer: `Err(Elapsed)` when none came within [`TIMEOUT`].
pub(crate) fn classify(
    pod: &Value,
    sidecars: usize,
    answer: Result<Result<(), kube::Error>, tokio::time::error::Elapsed>,
) -> Outcome {
    let namespace = pod["metadata"]["namespace"].as_str().unwrap_or_default();
    match answer {
        Ok(Ok(())) => Outcome::Valid,
        Ok(Err(kube::Error::Api(status))) => classify_status(pod, sidecars, &status),
        Ok(Err(e)) => Outcome::Unknown(format!(
            "the dry-run pod in namespace {namespace} was not judged: {e}"
        )),
        Err(_) => Outcome::Unknown(format!(
            "the dry-run pod in namespace {namespace} got no answer within {}s",
            TIMEOUT.as_secs()
        )),
    }
}

/// The verdict of a refusal. Only the apiserver's own checks of the pod judge the SidecarSet:
/// its validation (422 with causes on the fields the SidecarSet contributes) and its decoding
/// (400, "cannot be handled as a Pod"). An admission webhook, a ValidatingAdmissionPolicy or
/// anything else refusing the pod (whatever code and reason it chose: a policy's default
/// reason is `Invalid`) says nothing about the SidecarSet, so it gives no verdict.
fn classify_status(pod: &Value, sidecars: usize, status: &kube::core::Status) -> Outcome {
    let namespace = pod["metadata"]["namespace"].as_str().unwrap_or_default();
    let not_judged = |by: &str| {
        Outcome::Unknown(format!(
            "the dry-run pod in namespace {namespace} was refused by {by}, not by pod \
             validation, so it was not judged: {} ({})",
            status.message, status.code
        ))
    };
    if let Some(refuser) = admission_refuser(&status.message) {
        return not_judged(&refuser);
    }
    match status.code {
        422 if causes_point_at_sidecars(status, sidecars) => {
            Outcome::Invalid(map_causes(status, sidecars))
        }
        // The pod as written does not decode (a quantity that does not parse, a value of the
        // wrong type): the rest of the pod is ours and well formed, so the SidecarSet is at fault.
        400 if status.message.contains(UNDECODABLE) => {
            let located = unparseable_quantities(pod);
            Outcome::Invalid(if located.is_empty() {
                vec![status.message.clone()]
            } else {
                located
            })
        }
        422 | 400 => not_judged("an admission check other than pod validation"),
        _ => Outcome::Unknown(format!(
            "the dry-run pod in namespace {namespace} was not judged: {} ({}: {})",
            status.message, status.code, status.reason
        )),
    }
}

/// What the apiserver says when a request body does not decode as the kind
/// (`<Kind> in version "v1" cannot be handled as a <Kind>: ...`).
const UNDECODABLE: &str = "cannot be handled as a Pod";

/// The admission plugin a refusal's message names, in the words the apiserver puts in front
/// of it: `admission webhook "<name>" denied the request` or `ValidatingAdmissionPolicy
/// '<name>' [with binding '<binding>'] denied request`.
pub(crate) fn admission_refuser(message: &str) -> Option<String> {
    let quoted_after = |marker: &str, quote: char| -> Option<(String, usize)> {
        let start = message.find(marker)? + marker.len();
        let rest = message.get(start..)?;
        let end = rest.find(quote)?;
        Some((rest.get(..end)?.to_owned(), start + end + 1))
    };
    if let Some((name, after)) = quoted_after("admission webhook \"", '"')
        && message
            .get(after..)
            .is_some_and(|rest| rest.starts_with(" denied the request"))
    {
        return Some(format!("admission webhook {name:?}"));
    }
    if let Some((policy, after)) = quoted_after("ValidatingAdmissionPolicy '", '\'') {
        let rest = message.get(after..).unwrap_or_default();
        if rest.starts_with(" denied request") {
            return Some(format!("ValidatingAdmissionPolicy '{policy}'"));
        }
        if let Some(binding) = rest.strip_prefix(" with binding '")
            && let Some((binding, tail)) = binding.split_once('\'')
            && tail.starts_with(" denied request")
        {
            return Some(format!(
                "ValidatingAdmissionPolicy '{policy}' with binding '{binding}'"
            ));
        }
    }
    None
}

/// Whether one of an `Invalid` status's causes is a field the SidecarSet put in the pod (its
/// containers, init containers, volumes, imagePullSecrets): Kubernetes' pod validation names
/// the field it refuses; a refusal without such a cause is not about the SidecarSet.
fn causes_point_at_sidecars(status: &kube::core::Status, sidecars: usize) -> bool {
    status.details.as_ref().is_some_and(|d| {
        d.causes
            .iter()
            .any(|c| is_sidecarset_field(&c.field, sidecars))
    })
}

/// Whether `field` (a path in the synthetic pod) is inside what the SidecarSet contributes:
/// [`map_field`] keeps it as the SidecarSet's own path.
fn is_sidecarset_field(field: &str, sidecars: usize) -> bool {
    !field.is_empty() && !map_field(field, sidecars).starts_with('(')
}

#[cfg(test)]
mod tests;
