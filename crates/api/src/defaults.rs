//! Admission defaulting of the `apps.kruise.io` kinds, as pure functions (upstream:
//! `apis/apps/defaults/v1beta1.go` and the mutating webhooks under `pkg/webhook/*/mutating`).
//!
//! The webhook calls these, then [`crate::validation`] on the result (upstream's order:
//! mutating webhooks run before validating ones). Each function is idempotent.
//!
//! What the CRD schema already guarantees: the apiserver applies OpenAPI defaults before any
//! webhook runs, so `updateStrategy` (`type: RollingUpdate`, `partition: 0`, `maxUnavailable: 1`),
//! `revisionHistoryLimit: 10`, each `patchPodMetadata[].patchPolicy: Retain` and
//! `injectionStrategy.revision.policy: Always` on a SidecarSet; `completionPolicy.type: Always`,
//! `pullPolicy {timeoutSeconds: 600, backoffLimit: 3}` and `imagePullPolicy: IfNotPresent` on an
//! ImagePullJob (on an ImageListPullJob all but `imagePullPolicy`, as upstream); and
//! `pullPolicy {600, 3}` on a NodeImage tag arrive already set. The functions
//! set them anyway (a no-op then), so they also hold for objects built in code and in tests.
//!
//! What only the webhook can do, and these functions are for: a SidecarSet's per-container
//! defaults (`podInjectPolicy` differs between containers and init containers, and the
//! containers are schemaless like upstream's), the Kubernetes container and volume defaults
//! upstream applies to sidecars, and a NodeImage tag's `createdAt` (the admission time) and tag
//! order. The SidecarSet hash annotations are computed elsewhere (`crates/sidecar/src/hash.rs`), after
//! these defaults.

use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, HTTPGetAction, ObjectFieldSelector, Probe, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::imagelistpulljob::ImageListPullJob;
use super::imagepulljob::{
    CompletionPolicyType, ImagePullJob, ImagePullJobTemplate, ImagePullPolicy, PullPolicy,
};
use super::nodeimage::{ImageTagPullPolicy, NodeImage};
use super::sidecarset::{
    PodInjectPolicy, ShareVolumePolicy, ShareVolumePolicyType, SidecarContainer,
    SidecarContainerUpgradeStrategy, SidecarContainerUpgradeType, SidecarSet,
    SidecarSetInjectRevisionPolicy, SidecarSetPatchPolicy, SidecarSetUpdateStrategyType,
};
use crate::image::ImageRef;

/// Upstream's (and Kubernetes') defaults.
pub(crate) const DEFAULT_REVISION_HISTORY_LIMIT: i32 = 10;
pub(crate) const DEFAULT_PULL_TIMEOUT_SECONDS: i32 = 600;
pub(crate) const DEFAULT_PULL_BACKOFF_LIMIT: i32 = 3;
/// `0644`, Kubernetes' default mode of secret, configMap, downwardAPI and projected files.
pub(crate) const DEFAULT_VOLUME_FILE_MODE: i32 = 0o644;
/// Kubernetes' default projected service-account token lifetime (one hour).
pub(crate) const DEFAULT_TOKEN_EXPIRATION_SECONDS: i64 = 3600;
pub(crate) const DEFAULT_TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";

// --- SidecarSet ---------------------------------------------------------------------------------

/// Upstream's `SetDefaultsSidecarSetV1beta1`.
pub fn default_sidecarset(set: &mut SidecarSet) {
    let spec = &mut set.spec;
    let strategy = &mut spec.update_strategy;
    strategy
        .type_
        .get_or_insert(SidecarSetUpdateStrategyType::RollingUpdate);
    strategy.max_unavailable.get_or_insert(IntOrString::Int(1));
    strategy.partition.get_or_insert(IntOrString::Int(0));

    for c in &mut spec.init_containers {
        default_sidecar_container(c, PodInjectPolicy::AfterAppContainer);
    }
    for c in &mut spec.containers {
        default_sidecar_container(c, PodInjectPolicy::BeforeAppContainer);
    }
    for v in &mut spec.volumes {
        default_volume(v);
    }
    spec.revision_history_limit
        .get_or_insert(DEFAULT_REVISION_HISTORY_LIMIT);
    for patch in &mut spec.patch_pod_metadata {
        patch
            .patch_policy
            .get_or_insert(SidecarSetPatchPolicy::Retain);
    }
    if let Some(revision) = &mut spec.injection_strategy.revision {
        revision
            .policy
            .get_or_insert(SidecarSetInjectRevisionPolicy::Always);
    }
}

/// Upstream's `setDefaultSidecarContainerV1beta1`. `shareVolumeDevicePolicy` stays unset, as
/// upstream leaves it, so that SidecarSets written before it existed keep their hashes.
fn default_sidecar_container(c: &mut SidecarContainer, inject: PodInjectPolicy) {
    c.pod_inject_policy.get_or_insert(inject);
    c.upgrade_strategy
        .get_or_insert_with(SidecarContainerUpgradeStrategy::default)
        .upgrade_type
        .get_or_insert(SidecarContainerUpgradeType::ColdUpgrade);
    c.share_volume_policy
        .get_or_insert_with(ShareVolumePolicy::default)
        .type_
        .get_or_insert(ShareVolumePolicyType::Disabled);
    for env in &mut c.transfer_env {
        if let Some(field_ref) = env
            .source_container_name_from
            .as_mut()
            .and_then(|f| f.field_ref.as_mut())
        {
            default_field_ref(field_ref);
        }
    }
    default_container(&mut c.container);
}

/// The Kubernetes container defaults upstream applies to a sidecar (`SetDefaults_Container` and
/// the per-field defaults of `setDefaultContainerV1beta1`). Like upstream, the startup probe is
/// left alone (the apiserver defaults it on the pod), so the SidecarSet hash matches upstream's;
/// resource quantities are not re-rounded to milli-units.
pub(crate) fn default_container(c: &mut Container) {
    if c.image_pull_policy.as_deref().is_none_or(str::is_empty) {
        c.image_pull_policy = Some(default_image_pull_policy(c.image.as_deref()).to_owned());
    }
    if c.termination_message_path
        .as_deref()
        .is_none_or(str::is_empty)
    {
        c.termination_message_path = Some(DEFAULT_TERMINATION_MESSAGE_PATH.to_owned());
    }
    if c.termination_message_policy
        .as_deref()
        .is_none_or(str::is_empty)
    {
        c.termination_message_policy = Some("File".to_owned());
    }
    for port in c.ports.iter_mut().flatten() {
        if port.protocol.as_deref().is_none_or(str::is_empty) {
            port.protocol = Some("TCP".to_owned());
        }
    }
    for env in c.env.iter_mut().flatten() {
        if let Some(field_ref) = env.value_from.as_mut().and_then(|f| f.field_ref.as_mut()) {
            default_field_ref(field_ref);
        }
    }
    for probe in [c.liveness_probe.as_mut(), c.readiness_probe.as_mut()]
        .into_iter()
        .flatten()
    {
        default_probe(probe);
    }
    if let Some(lifecycle) = &mut c.lifecycle {
        for handler in [lifecycle.post_start.as_mut(), lifecycle.pre_stop.as_mut()]
            .into_iter()
            .flatten()
        {
            if let Some(http) = &mut handler.http_get {
                default_http_get(http);
            }
        }
    }
}

/// Kubernetes' rule: `Always` for an image whose tag is `latest` or that has neither tag nor
/// digest, else `IfNotPresent` (also for a reference that does not parse, as Kubernetes does).
pub(crate) fn default_image_pull_policy(image: Option<&str>) -> &'static str {
    let latest = image
        .and_then(|i| ImageRef::parse(i).ok())
        .is_some_and(|r| match (r.tag(), r.digest()) {
            (Some(tag), _) => tag == "latest",
            (None, digest) => digest.is_none(),
        });
    if latest { "Always" } else { "IfNotPresent" }
}

/// Kubernetes' `SetDefaults_Probe`; zero counts as unset, as in Go.
fn default_probe(probe: &mut Probe) {
    let fill = |field: &mut Option<i32>, value: i32| {
        if field.is_none_or(|v| v == 0) {
            *field = Some(value);
        }
    };
    fill(&mut probe.timeout_seconds, 1);
    fill(&mut probe.period_seconds, 10);
    fill(&mut probe.success_threshold, 1);
    fill(&mut probe.failure_threshold, 3);
    if let Some(http) = &mut probe.http_get {
        default_http_get(http);
    }
}

/// Kubernetes' `SetDefaults_HTTPGetAction`.
fn default_http_get(http: &mut HTTPGetAction) {
    if http.path.as_deref().is_none_or(str::is_empty) {
        http.path = Some("/".to_owned());
    }
    if http.scheme.as_deref().is_none_or(str::is_empty) {
        http.scheme = Some("HTTP".to_owned());
    }
}

/// Kubernetes' `SetDefaults_ObjectFieldSelector`.
fn default_field_ref(field_ref: &mut ObjectFieldSelector) {
    if field_ref.api_version.as_deref().is_none_or(str::is_empty) {
        field_ref.api_version = Some("v1".to_owned());
    }
}

/// The Kubernetes volume defaults upstream applies (`SetDefaultPodVolumes`): a volume without a
/// source is an `emptyDir`; hostPath `type` `""`; file modes `0644`; downward API field
/// references `v1`; projected token lifetime one hour.
pub(crate) fn default_volume(v: &mut Volume) {
    if super::validation::pod_spec::volume_sources(v).is_empty() {
        v.empty_dir = Some(EmptyDirVolumeSource::default());
    }
    if let Some(host_path) = &mut v.host_path {
        host_path.type_.get_or_insert_with(String::new);
    }
    if let Some(secret) = &mut v.secret {
        secret.default_mode.get_or_insert(DEFAULT_VOLUME_FILE_MODE);
    }
    if let Some(config_map) = &mut v.config_map {
        config_map
            .default_mode
            .get_or_insert(DEFAULT_VOLUME_FILE_MODE);
    }
    if let Some(downward) = &mut v.downward_api {
        downward
            .default_mode
            .get_or_insert(DEFAULT_VOLUME_FILE_MODE);
        for item in downward.items.iter_mut().flatten() {
            if let Some(field_ref) = &mut item.field_ref {
                default_field_ref(field_ref);
            }
        }
    }
    if let Some(projected) = &mut v.projected {
        projected
            .default_mode
            .get_or_insert(DEFAULT_VOLUME_FILE_MODE);
        for source in projected.sources.iter_mut().flatten() {
            if let Some(downward) = &mut source.downward_api {
                for item in downward.items.iter_mut().flatten() {
                    if let Some(field_ref) = &mut item.field_ref {
                        default_field_ref(field_ref);
                    }
                }
            }
            if let Some(token) = &mut source.service_account_token {
                token
                    .expiration_seconds
                    .get_or_insert(DEFAULT_TOKEN_EXPIRATION_SECONDS);
            }
        }
    }
}

// --- ImagePullJob -------------------------------------------------------------------------------

/// Upstream's `SetDefaultsImagePullJobV1beta1`. Like upstream's v1beta1 path, no finalizer is
/// added here: the controller adds it when the job holds secret copies.
pub fn default_imagepulljob(job: &mut ImagePullJob) {
    default_imagepulljob_template(&mut job.spec.template);
}

/// The defaults of an ImagePullJob, all in its template: `completionPolicy.type` Always,
/// `pullPolicy {600, 3}`, `imagePullPolicy` IfNotPresent. What an ImageListPullJob's template
/// becomes in the ImagePullJob of each image.
pub fn default_imagepulljob_template(template: &mut ImagePullJobTemplate) {
    template
        .completion_policy
        .type_
        .get_or_insert(CompletionPolicyType::Always);
    let pull = template.pull_policy.get_or_insert_with(PullPolicy::default);
    pull.timeout_seconds
        .get_or_insert(DEFAULT_PULL_TIMEOUT_SECONDS);
    pull.backoff_limit.get_or_insert(DEFAULT_PULL_BACKOFF_LIMIT);
    template
        .image_pull_policy
        .get_or_insert(ImagePullPolicy::IfNotPresent);
}

// --- ImageListPullJob ---------------------------------------------------------------------------

/// Upstream's ImageListPullJob defaulting: `completionPolicy.type` Always, `pullPolicy {600, 3}`.
/// `imagePullPolicy` is left alone, as upstream does, here and in the schema: unset, each image's
/// ImagePullJob gets IfNotPresent from its own defaulting.
pub fn default_imagelistpulljob(job: &mut ImageListPullJob) {
    let template = &mut job.spec.template;
    template
        .completion_policy
        .type_
        .get_or_insert(CompletionPolicyType::Always);
    let pull = template.pull_policy.get_or_insert_with(PullPolicy::default);
    pull.timeout_seconds
        .get_or_insert(DEFAULT_PULL_TIMEOUT_SECONDS);
    pull.backoff_limit.get_or_insert(DEFAULT_PULL_BACKOFF_LIMIT);
}

// --- NodeImage ----------------------------------------------------------------------------------

/// Upstream's `SetDefaultsNodeImageV1beta1` plus its webhook's tag sorting: every tag gets
/// `createdAt` (`now`, the admission time) and a `pullPolicy` with timeout 600 and backoff 3
/// (the TTL is not defaulted; validation requires it). Tags in the spec and in the status are
/// sorted by tag string (a total order; upstream's comparator is not strict).
pub fn default_nodeimage(node: &mut NodeImage, now: &Time) {
    for image in node.spec.images.values_mut() {
        for tag in &mut image.tags {
            tag.created_at.get_or_insert_with(|| now.clone());
            let policy = tag
                .pull_policy
                .get_or_insert_with(ImageTagPullPolicy::default);
            policy
                .timeout_seconds
                .get_or_insert(DEFAULT_PULL_TIMEOUT_SECONDS);
            policy
                .backoff_limit
                .get_or_insert(DEFAULT_PULL_BACKOFF_LIMIT);
        }
        image.tags.sort_by(|a, b| a.tag.cmp(&b.tag));
    }
    if let Some(status) = &mut node.status {
        for image in status.image_statuses.values_mut() {
            image.tags.sort_by(|a, b| a.tag.cmp(&b.tag));
        }
    }
}

#[cfg(test)]
mod tests;
