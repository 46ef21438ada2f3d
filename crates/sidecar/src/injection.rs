//! What a new pod looks like after sidecar injection (upstream's `sidecarsetMutatingPod` for
//! pod creation, kruise.md §3 steps 6–9).
//!
//! Given a pod and the SidecarSets selected for it (each at the version chosen by
//! [`super::revision`]), [`inject`] returns the mutated pod:
//!
//! 1. Each SidecarSet's `patchPodMetadata` is applied, in SidecarSet name order.
//! 2. For every init container and container of every SidecarSet, the injected container is
//!    built: with `shareVolumePolicy` enabled it also gets every app container's volume mounts
//!    (its own win on a mount path clash) plus the env vars their `subPathExpr`s reference; with
//!    `shareVolumeDevicePolicy` enabled, their volume devices; `IS_INJECTED=true` is set; then the
//!    `transferEnv` variables (own env wins on a name clash). "App containers" are the pod's
//!    containers without `IS_INJECTED=true`.
//! 3. Only the SidecarSet volumes the injected containers mount (or use as devices) are added,
//!    and the pod's own volume of the same name wins. Pull secrets are merged by name, pod's
//!    first.
//! 4. Injected init containers are sorted by name (containers too with
//!    [`InjectionOptions::sort_containers_by_name`], upstream's feature gate
//!    `EnableSortSidecarContainerByName`); then for init containers and containers alike, one whose name the pod already has replaces it in place, the others go in front
//!    (`BeforeAppContainer`, in encounter order) or at the end (`AfterAppContainer`). An unset
//!    policy means what defaulting writes: containers in front, init containers at the end.
//! 5. A hot-upgrade sidecar (`upgradeType: HotUpgrade`, on a container or a native-sidecar
//!    init container) is injected as its two twins, built from the container of step 2
//!    ([`super::hot_upgrade`]), with their version annotations and the pod's
//!    `kruise.io/sidecarset-working-hotupgrade-container` map (its old entries kept).
//! 6. When anything was injected, the hash annotations get an entry per injecting SidecarSet
//!    and `kruise.io/sidecarset-injected-list` becomes the union of the old list and every
//!    selected SidecarSet. When nothing was injected, only the metadata patches remain.
//!
//! SidecarSets using a feature kruise-rs does not serve are screened out before this runs
//! ([`super::unsupported`]); what is passed here is injected as asked.
//!
//! A sidecar with `resourcesPolicy` gets the resources computed from the pod's containers as
//! they were before injection ([`super::resources`]); the names of every selected SidecarSet's
//! containers are never its targets.
//!
//! Fixed upstream bugs: two SidecarSets injecting the same container name, or a container name
//! clashing between containers and init containers, is an error naming the culprits (upstream
//! builds a pod the apiserver rejects, or silently keeps the last one); a sidecar that already
//! defines `IS_INJECTED` gets it set to `true` rather than a second entry; SidecarSets are
//! processed in name order (upstream: informer order); a volume an injected container uses but
//! neither the SidecarSet nor the pod defines is reported as a warning.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use k8s_openapi::api::core::v1::{
    Container, EnvVar, LocalObjectReference, Pod, PodSpec, Volume, VolumeDevice, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use kruise_rs_api::sidecarset::{
    PodInjectPolicy, ShareVolumePolicy, ShareVolumePolicyType, SidecarContainer,
};
use kruise_rs_api::well_known::{
    SIDECARSET_HASH, SIDECARSET_HASH_WITHOUT_IMAGE, SIDECARSET_INJECTED_LIST,
    SIDECARSET_WORKING_HOTUPGRADE_CONTAINER,
};

use super::annotations::{
    AnnotationError, SidecarSetUpgradeSpec, parse_hashes, parse_injected_list, render_hashes,
    render_injected_list,
};
use super::hash::is_native_sidecar;
use super::hot_upgrade::{HotUpgradeError, expand, working_annotation, working_twins};
use super::metadata::{MetadataPatchError, patch_pod_metadata};
use super::resources::{ResourcesPolicyError, apply_resources_policy};
use super::revision::SelectedSidecarSet;

/// The env var that marks a container as injected by a SidecarSet.
pub(crate) const SIDECAR_ENV_KEY: &str = "IS_INJECTED";

/// The result of [`inject`].
#[derive(Clone, Debug, PartialEq)]
pub struct Injection {
    /// The pod to admit.
    pub pod: Pod,
    /// The SidecarSets whose containers went into the pod, in the order processed.
    pub injected: Vec<String>,
    /// Problems worth telling the user (admission warnings) that do not stop the pod.
    pub warnings: Vec<String>,
    /// Every injected container's name, with the fields of its sidecar the typed `Pod` cannot
    /// carry (newer than the API version this crate is built against; mostly none); the webhook
    /// writes them into its patch.
    pub unknown_fields: BTreeMap<String, BTreeMap<String, serde_json::Value>>,
}

/// Why a pod cannot be injected; the webhook denies the pod with this message.
#[derive(Debug, thiserror::Error)]
pub enum InjectionError {
    #[error("SidecarSet {sidecarset}: container {container}: resourcesPolicy: {source}")]
    ResourcesPolicy {
        sidecarset: String,
        container: String,
        #[source]
        source: Box<ResourcesPolicyError>,
    },
    #[error("SidecarSet {sidecarset}: patchPodMetadata cannot be applied: {source}")]
    PatchPodMetadata {
        sidecarset: String,
        #[source]
        source: MetadataPatchError,
    },
    #[error("SidecarSet {sidecarset}: {source}")]
    HotUpgrade {
        sidecarset: String,
        #[source]
        source: HotUpgradeError,
    },
    #[error(transparent)]
    Annotation(#[from] AnnotationError),
    #[error("container name {container:?} would appear twice in the pod: {detail}")]
    NameConflict { container: String, detail: String },
}

/// What the manager's flags change in [`inject_with`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InjectionOptions {
    /// Injected containers go in by name, as injected init containers always do, rather than in
    /// SidecarSet then declaration order (`--sidecarset-sort-containers-by-name`, upstream's
    /// feature gate `EnableSortSidecarContainerByName`; off by default, as upstream).
    pub sort_containers_by_name: bool,
}

/// Injects `sidecarsets` into `pod` (a pod being created). `now` stamps the hash annotations.
pub fn inject(
    pod: &Pod,
    sidecarsets: &[SelectedSidecarSet],
    now: Time,
) -> Result<Injection, InjectionError> {
    inject_with(pod, sidecarsets, now, InjectionOptions::default())
}

/// [`inject`] with the manager's [`InjectionOptions`].
pub fn inject_with(
    pod: &Pod,
    sidecarsets: &[SelectedSidecarSet],
    now: Time,
    options: InjectionOptions,
) -> Result<Injection, InjectionError> {
    let mut sets: Vec<&SelectedSidecarSet> = sidecarsets.iter().collect();
    sets.sort_by(|a, b| a.name.cmp(&b.name));
    sets.dedup_by(|a, b| a.name == b.name);

    let mut out = pod.clone();
    let mut warnings = Vec::new();

    // 1. Metadata patches, before anything reads the annotations (transferEnv may).
    let mut annotations = out.metadata.annotations.clone().unwrap_or_default();
    if patch_metadata(&sets, &mut annotations)? {
        out.metadata.annotations = Some(annotations.clone());
    }
    let mut records = Records::read(&annotations)?;

    // 2. and 3. Build every injected container, collecting volumes and pull secrets.
    let spec = out.spec.clone().unwrap_or_default();
    let mut built = build_sidecars(&sets, &out, &spec, &now, &mut records, &mut warnings)?;
    if built.init_containers.is_empty() && built.containers.is_empty() {
        return Ok(Injection {
            pod: out,
            injected: built.injected,
            warnings,
            unknown_fields: BTreeMap::new(),
        });
    }
    check_names(&spec, &built.init_containers, &built.containers)?;

    // 4. Merge into the pod.
    let injected = built.injected.clone();
    let unknown_fields = std::mem::take(&mut built.unknown_fields);
    if options.sort_containers_by_name {
        built
            .containers
            .sort_by(|a, b| a.container.name.cmp(&b.container.name));
    }
    out.spec = Some(merge_into(spec, built));

    // 5. Annotations.
    records.write(&mut annotations);
    out.metadata.annotations = Some(annotations);

    Ok(Injection {
        pod: out,
        injected,
        warnings,
        unknown_fields,
    })
}

/// Applies every set's `patchPodMetadata` to `annotations`; whether any changed.
fn patch_metadata(
    sets: &[&SelectedSidecarSet],
    annotations: &mut BTreeMap<String, String>,
) -> Result<bool, InjectionError> {
    let mut changed = false;
    for set in sets {
        changed |=
            patch_pod_metadata(annotations, &set.spec.patch_pod_metadata).map_err(|source| {
                InjectionError::PatchPodMetadata {
                    sidecarset: set.name.clone(),
                    source,
                }
            })?;
    }
    Ok(changed)
}

/// What the pod's annotations record about injection, read before and written after it.
struct Records {
    hashes: BTreeMap<String, SidecarSetUpgradeSpec>,
    hashes_without_image: BTreeMap<String, SidecarSetUpgradeSpec>,
    injected_list: BTreeSet<String>,
    /// Hot-upgrade twins: the pod's working map (carried across SidecarSets) and their
    /// versions.
    hot: HotTwins,
}

impl Records {
    fn read(annotations: &BTreeMap<String, String>) -> Result<Self, InjectionError> {
        let get = |key: &str| annotations.get(key).map_or("", String::as_str);
        Ok(Self {
            hashes: parse_hashes(SIDECARSET_HASH, get(SIDECARSET_HASH))?,
            hashes_without_image: parse_hashes(
                SIDECARSET_HASH_WITHOUT_IMAGE,
                get(SIDECARSET_HASH_WITHOUT_IMAGE),
            )?,
            injected_list: parse_injected_list(get(SIDECARSET_INJECTED_LIST)),
            hot: HotTwins {
                working: working_twins(
                    annotations
                        .get(SIDECARSET_WORKING_HOTUPGRADE_CONTAINER)
                        .map(String::as_str),
                ),
                ..Default::default()
            },
        })
    }

    /// Records that `set` injected the sidecars `sidecar_list` at `now`.
    fn injected(&mut self, set: &SelectedSidecarSet, sidecar_list: Vec<String>, now: &Time) {
        self.hashes.insert(
            set.name.clone(),
            SidecarSetUpgradeSpec {
                update_timestamp: Some(now.clone()),
                hash: set.hash.clone(),
                sidecar_set_name: set.name.clone(),
                sidecar_list: Some(sidecar_list.clone()),
                controller_revision: set.controller_revision.clone().unwrap_or_default(),
            },
        );
        self.hashes_without_image.insert(
            set.name.clone(),
            SidecarSetUpgradeSpec {
                update_timestamp: Some(now.clone()),
                hash: set.hash_without_image.clone(),
                sidecar_set_name: set.name.clone(),
                sidecar_list: Some(sidecar_list),
                controller_revision: String::new(),
            },
        );
    }

    fn write(self, annotations: &mut BTreeMap<String, String>) {
        annotations.insert(SIDECARSET_HASH.to_owned(), render_hashes(&self.hashes));
        annotations.insert(
            SIDECARSET_HASH_WITHOUT_IMAGE.to_owned(),
            render_hashes(&self.hashes_without_image),
        );
        annotations.insert(
            SIDECARSET_INJECTED_LIST.to_owned(),
            render_injected_list(&self.injected_list),
        );
        if self.hot.any {
            annotations.extend(self.hot.versions);
            annotations.insert(
                SIDECARSET_WORKING_HOTUPGRADE_CONTAINER.to_owned(),
                working_annotation(&self.hot.working),
            );
        }
    }
}

/// Everything the SidecarSets add to the pod, before it is merged in.
struct Built {
    init_containers: Vec<Injected>,
    containers: Vec<Injected>,
    volumes: Vec<Volume>,
    secrets: Vec<LocalObjectReference>,
    /// The SidecarSets that injected at least one container.
    injected: Vec<String>,
    /// [`SidecarContainer::unknown_fields`] of each injected container, by its name in the pod.
    unknown_fields: BTreeMap<String, BTreeMap<String, serde_json::Value>>,
}

/// Builds every sidecar of `sets` for the pod `out` (whose spec is `spec`), and records each
/// SidecarSet that injected something in `records`.
fn build_sidecars(
    sets: &[&SelectedSidecarSet],
    out: &Pod,
    spec: &PodSpec,
    now: &Time,
    records: &mut Records,
    warnings: &mut Vec<String>,
) -> Result<Built, InjectionError> {
    let context = PodContext::new(out, spec);
    let mut built = Built {
        init_containers: Vec::new(),
        containers: Vec::new(),
        volumes: Vec::new(),
        secrets: Vec::new(),
        injected: Vec::new(),
        unknown_fields: BTreeMap::new(),
    };
    // Kruise's own sidecars are never the targets of a resourcesPolicy.
    let sidecar_names: HashSet<&str> = sets
        .iter()
        .flat_map(|set| set.spec.init_containers.iter().chain(&set.spec.containers))
        .map(|c| c.container.name.as_str())
        .collect();
    let with_resources = |sidecar: &SidecarContainer,
                          mut container: Container,
                          sidecarset: &str|
     -> Result<Container, InjectionError> {
        if let Some(policy) = &sidecar.resources_policy {
            apply_resources_policy(&mut container, policy, spec, &sidecar_names).map_err(
                |source| InjectionError::ResourcesPolicy {
                    sidecarset: sidecarset.to_owned(),
                    container: sidecar.container.name.clone(),
                    source: Box::new(source),
                },
            )?;
        }
        Ok(container)
    };

    for set in sets {
        records.injected_list.insert(set.name.clone());
        // Later definitions of a volume name win, as in upstream's map.
        let set_volumes: HashMap<&str, &Volume> = set
            .spec
            .volumes
            .iter()
            .map(|v| (v.name.as_str(), v))
            .collect();
        let mut sidecar_list = BTreeSet::new();
        let mut injected_any = false;

        // Init containers first (only native sidecars count as sidecars of the pod), then
        // containers; each kind has its own default place in the pod.
        for (sidecars, init) in [
            (&set.spec.init_containers, true),
            (&set.spec.containers, false),
        ] {
            for sidecar in sidecars {
                if !init || is_native_sidecar(sidecar) {
                    sidecar_list.insert(sidecar.container.name.clone());
                }
                collect_volumes(
                    sidecar,
                    &set_volumes,
                    spec,
                    &set.name,
                    &mut built.volumes,
                    warnings,
                );
                let container = build_container(sidecar, &context, &set.name, warnings);
                let container = with_resources(sidecar, container, &set.name)?;
                let (policy, into) = if init {
                    (
                        PodInjectPolicy::AfterAppContainer,
                        &mut built.init_containers,
                    )
                } else {
                    (PodInjectPolicy::BeforeAppContainer, &mut built.containers)
                };
                let policy = sidecar.pod_inject_policy.unwrap_or(policy);
                for container in twins(sidecar, container, init, &set.name, &mut records.hot)? {
                    built
                        .unknown_fields
                        .insert(container.name.clone(), sidecar.unknown_fields.clone());
                    into.push(Injected {
                        container,
                        policy,
                        sidecarset: set.name.clone(),
                    });
                }
                injected_any = true;
            }
        }
        built
            .secrets
            .extend(set.spec.image_pull_secrets.iter().cloned());

        if injected_any {
            records.injected(set, sidecar_list.into_iter().collect(), now);
            built.injected.push(set.name.clone());
        }
    }
    Ok(built)
}

/// `spec` with the built containers, volumes and pull secrets merged in.
fn merge_into(mut spec: PodSpec, built: Built) -> PodSpec {
    let Built {
        mut init_containers,
        containers,
        volumes,
        secrets,
        ..
    } = built;
    init_containers.sort_by(|a, b| a.container.name.cmp(&b.container.name));
    let init = merge_containers(
        spec.init_containers.clone().unwrap_or_default(),
        init_containers,
    );
    set_list(&mut spec.init_containers, init);
    spec.containers = merge_containers(std::mem::take(&mut spec.containers), containers);
    if !volumes.is_empty() {
        spec.volumes = Some(merge_volumes(
            spec.volumes.take().unwrap_or_default(),
            volumes,
        ));
    }
    if !secrets.is_empty() {
        let merged = merge_by_name(
            spec.image_pull_secrets.take().unwrap_or_default(),
            secrets,
            |s| s.name.as_str(),
        );
        spec.image_pull_secrets = Some(merged);
    }
    spec
}

/// The hot-upgrade twins injected so far into one pod.
#[derive(Default)]
struct HotTwins {
    /// Sidecar name to working twin: the pod's annotation, plus each sidecar injected here.
    working: BTreeMap<String, String>,
    /// The version annotations of every twin injected.
    versions: BTreeMap<String, String>,
    any: bool,
}

/// The containers injected for `sidecar` once built as `container`: itself, or for a
/// hot-upgrade sidecar its two twins ([`expand`]), recorded in `hot`.
fn twins(
    sidecar: &SidecarContainer,
    container: Container,
    init_container: bool,
    sidecarset: &str,
    hot: &mut HotTwins,
) -> Result<Vec<Container>, InjectionError> {
    let built = SidecarContainer {
        container,
        ..sidecar.clone()
    };
    let mut expansion = expand([built], init_container, &mut hot.working).map_err(|source| {
        InjectionError::HotUpgrade {
            sidecarset: sidecarset.to_owned(),
            source,
        }
    })?;
    // The working map's annotation is written once, from the whole map, at the end.
    hot.any |= expansion
        .annotations
        .remove(SIDECARSET_WORKING_HOTUPGRADE_CONTAINER)
        .is_some();
    hot.versions.extend(expansion.annotations);
    Ok(expansion
        .containers
        .into_iter()
        .map(|c| c.container)
        .collect())
}

/// The RFC 6902 patch that turns `old` into `new` (what the webhook returns).
pub fn pod_patch(old: &Pod, new: &Pod) -> Result<json_patch::Patch, serde_json::Error> {
    Ok(json_patch::diff(
        &serde_json::to_value(old)?,
        &serde_json::to_value(new)?,
    ))
}

/// A container ready to be merged into the pod.
struct Injected {
    container: Container,
    policy: PodInjectPolicy,
    sidecarset: String,
}

/// What building a sidecar reads from the pod.
struct PodContext<'a> {
    pod: &'a Pod,
    /// The pod's containers without `IS_INJECTED=true`.
    app_containers: Vec<&'a Container>,
    /// `container/env` → env var, over all the pod's containers (later duplicates win).
    env_by_container: HashMap<(&'a str, &'a str), &'a EnvVar>,
}

impl<'a> PodContext<'a> {
    fn new(pod: &'a Pod, spec: &'a PodSpec) -> Self {
        let app_containers = spec
            .containers
            .iter()
            .filter(|c| !is_injected_container(c))
            .collect();
        let env_by_container = spec
            .containers
            .iter()
            .flat_map(|c| {
                c.env
                    .iter()
                    .flatten()
                    .map(move |e| ((c.name.as_str(), e.name.as_str()), e))
            })
            .collect();
        Self {
            pod,
            app_containers,
            env_by_container,
        }
    }
}

/// Whether a pod container was put there by a SidecarSet (its first `IS_INJECTED` says `true`).
pub(crate) fn is_injected_container(container: &Container) -> bool {
    container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == SIDECAR_ENV_KEY)
        .and_then(|e| e.value.as_deref())
        == Some("true")
}

fn policy_enabled(policy: Option<&ShareVolumePolicy>) -> bool {
    policy.and_then(|p| p.type_) == Some(ShareVolumePolicyType::Enabled)
}

/// The container to inject for `sidecar`.
fn build_container(
    sidecar: &SidecarContainer,
    pod: &PodContext<'_>,
    sidecarset: &str,
    warnings: &mut Vec<String>,
) -> Container {
    let mut container = sidecar.container.clone();

    // Shared volume mounts, and the env vars their subPathExpr expansions need.
    let mut shared_mounts: Vec<VolumeMount> = Vec::new();
    let mut subpath_envs: Vec<EnvVar> = Vec::new();
    if policy_enabled(sidecar.share_volume_policy.as_ref()) {
        for app in &pod.app_containers {
            for mount in app.volume_mounts.iter().flatten() {
                shared_mounts.push(mount.clone());
                for name in subpath_expr_vars(mount.sub_path_expr.as_deref().unwrap_or_default()) {
                    if let Some(env) = app.env.iter().flatten().find(|e| e.name == name) {
                        subpath_envs.push(env.clone());
                    }
                }
            }
        }
    }
    let transfer = merge_env(
        transfer_envs(sidecar, pod, sidecarset, warnings),
        subpath_envs,
    );

    let mounts = merge_volume_mounts(&container, shared_mounts);
    set_list(&mut container.volume_mounts, mounts);

    let mut env = container.env.take().unwrap_or_default();
    mark_injected(&mut env);
    container.env = Some(merge_env(env, transfer));

    if policy_enabled(sidecar.share_volume_device_policy.as_ref()) {
        let shared: Vec<VolumeDevice> = pod
            .app_containers
            .iter()
            .flat_map(|c| c.volume_devices.iter().flatten().cloned())
            .collect();
        let devices = merge_volume_devices(&container, shared);
        set_list(&mut container.volume_devices, devices);
    }
    container
}

/// Sets `IS_INJECTED=true`: appended, or (when the sidecar already defines it) overriding the
/// first definition and dropping any others, so the pod says exactly one thing.
fn mark_injected(env: &mut Vec<EnvVar>) {
    let injected = EnvVar {
        name: SIDECAR_ENV_KEY.to_owned(),
        value: Some("true".to_owned()),
        value_from: None,
    };
    match env.iter().position(|e| e.name == SIDECAR_ENV_KEY) {
        Some(first) => {
            env[first] = injected;
            let mut index = 0;
            env.retain(|e| {
                let keep = index <= first || e.name != SIDECAR_ENV_KEY;
                index += 1;
                keep
            });
        }
        None => env.push(injected),
    }
}

/// The `transferEnv` variables, in upstream's order: per entry, its names sorted and deduped.
fn transfer_envs(
    sidecar: &SidecarContainer,
    pod: &PodContext<'_>,
    sidecarset: &str,
    warnings: &mut Vec<String>,
) -> Vec<EnvVar> {
    let mut out = Vec::new();
    for transfer in &sidecar.transfer_env {
        let mut names: BTreeSet<&str> = transfer.env_names.iter().map(String::as_str).collect();
        if let Some(name) = transfer.env_name.as_deref().filter(|n| !n.is_empty()) {
            names.insert(name);
        }
        let mut source = transfer.source_container_name.clone().unwrap_or_default();
        if let Some(field_ref) = transfer
            .source_container_name_from
            .as_ref()
            .and_then(|f| f.field_ref.as_ref())
        {
            match container_name_from_field(&field_ref.field_path, pod.pod) {
                Ok(name) => source = name,
                Err(reason) => {
                    warnings.push(format!(
                        "SidecarSet {sidecarset}: container {}: transferEnv skipped: {reason}",
                        sidecar.container.name
                    ));
                    continue;
                }
            }
        }
        for name in names {
            if let Some(env) = pod.env_by_container.get(&(source.as_str(), name)) {
                out.push((*env).clone());
            }
        }
    }
    out
}

/// Reads `metadata.labels['k']` or `metadata.annotations['k']` of the pod (a missing key is the
/// empty name, which matches no container).
fn container_name_from_field(field_path: &str, pod: &Pod) -> Result<String, String> {
    let subscripted = field_path
        .strip_suffix("']")
        .and_then(|s| s.split_once("['"))
        .filter(|(path, _)| !path.is_empty());
    let Some((path, key)) = subscripted else {
        return Err(format!("unsupported fieldPath {field_path:?}"));
    };
    let (map, valid) = match path {
        "metadata.labels" => (&pod.metadata.labels, is_qualified_name(key)),
        "metadata.annotations" => (
            &pod.metadata.annotations,
            is_qualified_name(&key.to_lowercase()),
        ),
        _ => {
            return Err(format!(
                "fieldPath {field_path:?} does not support subscript"
            ));
        }
    };
    if !valid {
        return Err(format!("invalid key subscript in {field_path:?}"));
    }
    Ok(map
        .as_ref()
        .and_then(|m| m.get(key))
        .cloned()
        .unwrap_or_default())
}

/// Kubernetes' qualified name: `[prefix/]name`, prefix a DNS subdomain, name ≤ 63 characters of
/// alphanumerics, `-`, `_`, `.`, starting and ending with an alphanumeric.
fn is_qualified_name(s: &str) -> bool {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|label| {
                !label.is_empty()
                    && label.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && label.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && label
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            })
    });
    name_ok && prefix_ok
}

/// Names `$(NAME)` referenced by a `subPathExpr` (NAME as upstream's pattern
/// `[-._a-zA-Z][-._a-zA-Z0-9]*`), leftmost first, non-overlapping.
fn subpath_expr_vars(expr: &str) -> Vec<&str> {
    let first = |c: char| c.is_ascii_alphabetic() || matches!(c, '-' | '.' | '_');
    let rest = |c: char| first(c) || c.is_ascii_digit();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(offset) = expr.get(i..).and_then(|s| s.find("$(")) {
        let start = i + offset + 2;
        let tail = expr.get(start..).unwrap_or_default();
        let len = tail
            .char_indices()
            .find(|&(j, c)| if j == 0 { !first(c) } else { !rest(c) })
            .map_or(tail.len(), |(j, _)| j);
        if len > 0 && tail[len..].starts_with(')') {
            out.push(&tail[..len]);
            i = start + len + 1;
        } else {
            i = start - 1;
        }
    }
    out
}

/// The sidecar's own mounts, then the shared ones whose mount path is not taken (by a mount or
/// a device of the sidecar, or an earlier shared mount).
fn merge_volume_mounts(container: &Container, additional: Vec<VolumeMount>) -> Vec<VolumeMount> {
    let mut out: Vec<VolumeMount> = container.volume_mounts.clone().unwrap_or_default();
    let mut paths: BTreeSet<String> = out.iter().map(|m| m.mount_path.clone()).collect();
    paths.extend(
        container
            .volume_devices
            .iter()
            .flatten()
            .map(|d| d.device_path.clone()),
    );
    for mount in additional {
        if paths.insert(mount.mount_path.clone()) {
            out.push(mount);
        }
    }
    out
}

/// The sidecar's own devices, then the shared ones whose path is not taken.
fn merge_volume_devices(container: &Container, additional: Vec<VolumeDevice>) -> Vec<VolumeDevice> {
    let mut out: Vec<VolumeDevice> = container.volume_devices.clone().unwrap_or_default();
    let mut paths: BTreeSet<String> = out.iter().map(|d| d.device_path.clone()).collect();
    paths.extend(
        container
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| m.mount_path.clone()),
    );
    for device in additional {
        if paths.insert(device.device_path.clone()) {
            out.push(device);
        }
    }
    out
}

/// `original`, then each of `additional` whose name is not yet present.
fn merge_env(original: Vec<EnvVar>, additional: Vec<EnvVar>) -> Vec<EnvVar> {
    let mut names: BTreeSet<String> = original.iter().map(|e| e.name.clone()).collect();
    let mut out = original;
    for env in additional {
        if names.insert(env.name.clone()) {
            out.push(env);
        }
    }
    out
}

/// Writes a list back, leaving an unset list unset when there is nothing to put in it.
fn set_list<T>(field: &mut Option<Vec<T>>, list: Vec<T>) {
    if !(list.is_empty() && field.is_none()) {
        *field = Some(list);
    }
}

/// Adds the SidecarSet volumes the sidecar uses (by its own mounts, then devices).
fn collect_volumes(
    sidecar: &SidecarContainer,
    set_volumes: &HashMap<&str, &Volume>,
    pod_spec: &PodSpec,
    sidecarset: &str,
    volumes: &mut Vec<Volume>,
    warnings: &mut Vec<String>,
) {
    let c = &sidecar.container;
    let used = c
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.name.as_str())
        .chain(c.volume_devices.iter().flatten().map(|d| d.name.as_str()));
    for name in used {
        match set_volumes.get(name) {
            Some(volume) => volumes.push((*volume).clone()),
            None => {
                let in_pod = pod_spec.volumes.iter().flatten().any(|v| v.name == name);
                if !in_pod {
                    warnings.push(format!(
                        "SidecarSet {sidecarset}: container {} uses volume {name:?}, which neither the SidecarSet nor the pod defines",
                        c.name
                    ));
                }
            }
        }
    }
}

/// Refuses injections that would give two containers of the pod the same name.
fn check_names(
    spec: &PodSpec,
    init: &[Injected],
    containers: &[Injected],
) -> Result<(), InjectionError> {
    let conflict = |container: &str, detail: String| InjectionError::NameConflict {
        container: container.to_owned(),
        detail,
    };
    for list in [init, containers] {
        let mut seen: HashMap<&str, &str> = HashMap::new();
        for c in list {
            if let Some(other) = seen.insert(c.container.name.as_str(), c.sidecarset.as_str()) {
                return Err(conflict(
                    &c.container.name,
                    format!(
                        "injected by SidecarSet {other} and by SidecarSet {}",
                        c.sidecarset
                    ),
                ));
            }
        }
    }
    for c in containers {
        if spec
            .init_containers
            .iter()
            .flatten()
            .any(|i| i.name == c.container.name)
        {
            return Err(conflict(
                &c.container.name,
                format!(
                    "SidecarSet {} injects a container named like one of the pod's init containers",
                    c.sidecarset
                ),
            ));
        }
        if let Some(i) = init.iter().find(|i| i.container.name == c.container.name) {
            return Err(conflict(
                &c.container.name,
                format!(
                    "SidecarSet {} injects it as an init container and SidecarSet {} as a container",
                    i.sidecarset, c.sidecarset
                ),
            ));
        }
    }
    for i in init {
        if spec.containers.iter().any(|c| c.name == i.container.name) {
            return Err(conflict(
                &i.container.name,
                format!(
                    "SidecarSet {} injects an init container named like one of the pod's containers",
                    i.sidecarset
                ),
            ));
        }
    }
    Ok(())
}

/// Upstream's `mergeSidecarContainers`: replace same-named containers in place, then
/// `BeforeAppContainer` ones in front and the rest at the end, each in encounter order.
fn merge_containers(origins: Vec<Container>, injected: Vec<Injected>) -> Vec<Container> {
    let mut origins = origins;
    let index: HashMap<String, usize> = origins
        .iter()
        .enumerate()
        .map(|(i, c)| (c.name.clone(), i))
        .collect();
    let mut before = Vec::new();
    let mut after = Vec::new();
    for item in injected {
        if let Some(&i) = index.get(&item.container.name) {
            origins[i] = item.container;
            continue;
        }
        match item.policy {
            PodInjectPolicy::BeforeAppContainer => before.push(item.container),
            PodInjectPolicy::AfterAppContainer => after.push(item.container),
        }
    }
    before.extend(origins);
    before.extend(after);
    before
}

/// The pod's volumes as they are, then each collected volume whose name is new.
fn merge_volumes(original: Vec<Volume>, additional: Vec<Volume>) -> Vec<Volume> {
    let mut seen: BTreeSet<String> = original.iter().map(|v| v.name.clone()).collect();
    let mut out = original;
    for volume in additional {
        if seen.insert(volume.name.clone()) {
            out.push(volume);
        }
    }
    out
}

/// `original` (deduplicated by name, as upstream does for pull secrets), then each of
/// `additional` whose name is new.
fn merge_by_name<T>(original: Vec<T>, additional: Vec<T>, name: impl Fn(&T) -> &str) -> Vec<T> {
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut out = Vec::new();
    for item in original.into_iter().chain(additional) {
        if seen.insert(name(&item).to_owned()) {
            out.push(item);
        }
    }
    out
}

#[cfg(test)]
mod tests;
