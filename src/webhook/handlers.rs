//! Adapts admission requests to the pure decisions: decode the object, call the function, turn
//! its answer into a [`Verdict`].
//!
//! The pod webhook reads SidecarSets and Namespaces from caches (reflectors started by
//! [`Handlers::new`]); the SidecarSet cache is confirmed by a read of the version the apiserver's
//! cache stands at, or a metadata list of it, shared between admissions, and the SidecarSets the
//! cache lacks or holds stale are fetched (`confirmed_sidecarsets.rs`). Until the caches have
//! listed once, pod requests wait a moment and are then refused rather than admitted without
//! their sidecars. A SidecarSet using
//! a feature kruise-rs does not serve is left out of the pod with a warning and a throttled
//! event ([`kruise_rs_sidecar::unsupported`], [`super::unsupported_events`]), or refuses it when
//! annotated to.

use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, future};
use k8s_openapi::api::core::v1::Namespace;
use kube::core::admission::{AdmissionRequest, Operation};
use kube::core::{DynamicObject, ObjectMeta, PartialObjectMeta};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use super::configuration::{
    MUTATE_IMAGELISTPULLJOB, MUTATE_IMAGEPULLJOB, MUTATE_NODEIMAGE, MUTATE_POD, MUTATE_SIDECARSET,
    VALIDATE_IMAGELISTPULLJOB, VALIDATE_IMAGEPULLJOB, VALIDATE_NODEIMAGE, VALIDATE_SIDECARSET,
};
use super::confirmed_sidecarsets::{
    self, KnownVersions, Listed, Settled, SharedReads, SidecarSetCacheReads,
};
use super::dry_run;
use super::preserving_patch;
use super::secret_access;
use super::server::{Admit, AdmitFuture, Verdict};
use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::ObjectRef;

use kruise_rs_api::defaults;
use kruise_rs_api::imagelistpulljob::ImageListPullJob;
use kruise_rs_api::imagepulljob::ImagePullJob;
use kruise_rs_api::nodeimage::NodeImage;
use kruise_rs_api::sidecarset::SidecarSet;
use kruise_rs_api::validation::sidecarset::{
    KnownRevision, PatchPodMetadataPolicy, SidecarSetContext, WHITELIST_CONFIGMAP,
    WHITELIST_CONFIGMAP_KEY,
};
use kruise_rs_api::validation::{self, ValidationErrors};
use kruise_rs_api::well_known::{
    SIDECARSET_HASH, SIDECARSET_HASH_WITHOUT_IMAGE, SIDECARSET_NAME_LABEL,
};
use kruise_rs_controller::unreadable::{self, Guarded, Unreadable, UnreadableObject};
use kruise_rs_kube::error_chain::error_chain;
use kruise_rs_kube::events::Recorder;
use kruise_rs_sidecar::{self as sidecar, hash, unsupported};

use super::unreadable_sidecarsets::{self, UnreadableSidecarSetPolicy};
use super::unsupported_events::{self, Throttle};

/// How long a pod request waits for the caches before it is refused.
const CACHE_WAIT: Duration = Duration::from_secs(5);

/// What the manager's flags change in the webhooks' answers.
#[derive(Clone, Copy, Debug, Default)]
pub struct HandlerSettings {
    /// `patchPodMetadata` no whitelist rule covers is allowed (upstream's feature gate
    /// `SidecarSetPatchPodMetadataDefaultsAllowed`).
    pub patch_pod_metadata_defaults_allowed: bool,
    /// How sidecars go into pods (`--sidecarset-sort-containers-by-name`).
    pub injection: sidecar::InjectionOptions,
    /// What a pod an unreadable SidecarSet may select gets (decision 0027).
    pub unreadable_sidecarset_policy: UnreadableSidecarSetPolicy,
    /// Whether each admission confirms the SidecarSet cache first (decision 0046).
    pub sidecarset_cache_reads: SidecarSetCacheReads,
}

/// The webhooks' state: a client for the rare reads and the caches for the common ones.
pub struct Handlers {
    pub(super) client: Client,
    /// The manager's namespace: SidecarSet ControllerRevisions and the configuration ConfigMap.
    pub(super) namespace: String,
    pub(super) sidecarsets: Store<SidecarSet>,
    /// The apiserver cache's versions at which ours (`sidecarsets` and
    /// `unreadable_sidecarsets`) is known to hold what it held: our watch runs behind the
    /// apiserver, so a pod is admitted only once a read of the apiserver confirms the cache.
    sidecarset_versions: Arc<KnownVersions>,
    /// Reads of the version the apiserver's SidecarSet cache stands at.
    sidecarset_fences: Arc<SharedReads<Option<String>>>,
    /// Lists of the SidecarSets' metadata, when the fence is not a known version.
    sidecarset_lists: Arc<SharedReads<Listed>>,
    /// How admissions confirmed the cache.
    confirmations: ConfirmationCounts,
    /// Whether they confirm it at all (`--sidecarset-cache-fence`).
    sidecarset_cache_reads: SidecarSetCacheReads,
    /// The SidecarSets the cache above is missing because our type cannot read them, as raw
    /// JSON: pods they may select are admitted with a warning or refused ([`HandlerSettings`]).
    unreadable_sidecarsets: Store<UnreadableObject<SidecarSet>>,
    pub(super) namespaces: Store<PartialObjectMeta<Namespace>>,
    /// The ControllerRevisions of SidecarSets in `namespace`.
    revisions: Store<ControllerRevision>,
    synced: watch::Receiver<bool>,
    /// Events on SidecarSets left out of pods for an unsupported feature, and their throttle.
    recorder: Arc<Recorder>,
    unsupported_events: Mutex<Throttle>,
    /// `patchPodMetadata` no whitelist rule covers is allowed (upstream's feature gate
    /// `SidecarSetPatchPodMetadataDefaultsAllowed`).
    patch_pod_metadata_defaults_allowed: bool,
    injection: sidecar::InjectionOptions,
    unreadable_sidecarset_policy: UnreadableSidecarSetPolicy,
    /// The dry-run pods' verdicts, so an unchanged SidecarSet costs no second dry run.
    dry_runs: dry_run::Verdicts,
}

impl Handlers {
    /// The handlers, and the future that keeps their caches filled (run it beside the server).
    pub fn new(
        client: Client,
        namespace: &str,
    ) -> (Arc<Self>, impl Future<Output = ()> + Send + 'static + use<>) {
        Self::with_settings(client, namespace, HandlerSettings::default())
    }

    /// [`Handlers::new`], with the manager's flags.
    pub fn with_settings(
        client: Client,
        namespace: &str,
        settings: HandlerSettings,
    ) -> (Arc<Self>, impl Future<Output = ()> + Send + 'static + use<>) {
        let (sidecarsets, sidecarset_writer) = reflector::store();
        let (unreadable_sidecarsets, unreadable_writer) = reflector::store();
        let (namespaces, namespace_writer) = reflector::store();
        let (revisions, revision_writer) = reflector::store();
        let (synced_tx, synced) = watch::channel(false);
        let recorder = Arc::new(Recorder::for_manager(client.clone()));
        // Guarded: one SidecarSet our type refuses must not keep every other one (and every pod
        // admission) waiting; it is reported and left out (decision 0018).
        // Both stores are applied between `before_stores` and `after_stores`, which tell the
        // known versions what the cache holds.
        let sidecarset_versions = KnownVersions::new();
        let sidecarset_stream = confirmed_sidecarsets::after_stores(
            sidecarset_versions.clone(),
            reflector::reflector(
                sidecarset_writer,
                unreadable::skip_unreadable_into(
                    confirmed_sidecarsets::before_stores(
                        sidecarset_versions.clone(),
                        watcher(
                            Api::<unreadable::Guarded<SidecarSet>>::all(client.clone()),
                            watcher::Config::default(),
                        )
                        .default_backoff(),
                    ),
                    unreadable::log_and_record::<SidecarSet>(recorder.clone(), "sidecar injection"),
                    unreadable_writer,
                ),
            ),
        )
        .for_each(|_| future::ready(()));
        let namespace_stream = reflector::reflector(
            namespace_writer,
            watcher(
                Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
                watcher::Config::default(),
            )
            .default_backoff(),
        )
        .for_each(|_| future::ready(()));
        // SidecarSet revisions, read for every pod a pinning SidecarSet selects: cached, so an
        // admission lists nothing.
        let revision_stream = reflector::reflector(
            revision_writer,
            watcher(
                Api::<ControllerRevision>::namespaced(client.clone(), namespace),
                watcher::Config::default().labels(SIDECARSET_NAME_LABEL),
            )
            .default_backoff(),
        )
        .for_each(|_| future::ready(()));
        let (s, n, r) = (sidecarsets.clone(), namespaces.clone(), revisions.clone());
        let caches = async move {
            let ready = async move {
                let _ = s.wait_until_ready().await;
                let _ = n.wait_until_ready().await;
                let _ = r.wait_until_ready().await;
                synced_tx.send_replace(true);
                // Keep the sender alive: a dropped one would read as "caches gone".
                std::future::pending::<()>().await;
            };
            tokio::select! {
                () = sidecarset_stream => {}
                () = namespace_stream => {}
                () = revision_stream => {}
                () = ready => {}
            }
        };
        let handlers = Arc::new(Self {
            sidecarset_versions,
            sidecarset_fences: confirmed_sidecarsets::fences(Api::all(client.clone())),
            sidecarset_lists: confirmed_sidecarsets::lists(Api::all(client.clone())),
            confirmations: ConfirmationCounts::default(),
            sidecarset_cache_reads: settings.sidecarset_cache_reads,
            recorder,
            revisions,
            unsupported_events: Mutex::default(),
            client,
            namespace: namespace.to_owned(),
            sidecarsets,
            unreadable_sidecarsets,
            namespaces,
            synced,
            patch_pod_metadata_defaults_allowed: settings.patch_pod_metadata_defaults_allowed,
            injection: settings.injection,
            unreadable_sidecarset_policy: settings.unreadable_sidecarset_policy,
            dry_runs: dry_run::Verdicts::default(),
        });
        (handlers, caches)
    }

    /// Whether the caches have listed once, and its changes (the manager's `/readyz` waits).
    pub fn synced(&self) -> watch::Receiver<bool> {
        self.synced.clone()
    }

    /// Waits (up to [`CACHE_WAIT`]) until the caches have listed once.
    pub(super) async fn caches_ready(&self) -> bool {
        let mut synced = self.synced.clone();
        tokio::time::timeout(CACHE_WAIT, synced.wait_for(|ready| *ready))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

impl Admit for Handlers {
    fn admit<'a>(
        &'a self,
        path: &'static str,
        request: &'a AdmissionRequest<DynamicObject>,
    ) -> AdmitFuture<'a> {
        Box::pin(async move {
            match path {
                MUTATE_POD => self.mutate_pod(request).await,
                MUTATE_SIDECARSET => self.mutate_sidecarset(request),
                VALIDATE_SIDECARSET => self.validate_sidecarset(request).await,
                MUTATE_IMAGEPULLJOB => self.mutate_imagepulljob(request),
                VALIDATE_IMAGEPULLJOB => self.validate_imagepulljob(request).await,
                MUTATE_IMAGELISTPULLJOB => self.mutate_imagelistpulljob(request),
                VALIDATE_IMAGELISTPULLJOB => self.validate_imagelistpulljob(request).await,
                MUTATE_NODEIMAGE => self.mutate_nodeimage(request),
                VALIDATE_NODEIMAGE => self.validate_nodeimage(request),
                other => Verdict::Deny(format!("kruise-rs has no webhook at {other}")),
            }
        })
    }
}

/// The request's object (and old object) as `T`; a Verdict to return at once when absent or
/// undecodable.
pub(super) fn decode<T: DeserializeOwned>(
    request: &AdmissionRequest<DynamicObject>,
) -> Result<(T, Option<T>), Verdict> {
    let kind = &request.kind.kind;
    let convert = |object: &DynamicObject| -> Result<T, Verdict> {
        let value = serde_json::to_value(object)
            .map_err(|e| Verdict::Deny(format!("cannot read the {kind}: {e}")))?;
        serde_json::from_value(value)
            .map_err(|e| Verdict::Deny(format!("cannot read the {kind}: {e}")))
    };
    let Some(object) = &request.object else {
        return Err(Verdict::Allow);
    };
    let old = match (&request.operation, &request.old_object) {
        (Operation::Update, Some(old)) => Some(convert(old)?),
        _ => None,
    };
    Ok((convert(object)?, old))
}

/// The JSON Patch turning `before` into `after` (both serialized), or Allow when equal.
pub(super) fn patch_between<T: serde::Serialize>(before: &T, after: &T) -> Verdict {
    match (serde_json::to_value(before), serde_json::to_value(after)) {
        (Ok(before), Ok(after)) => {
            let patch = json_patch::diff(&before, &after);
            if patch.0.is_empty() {
                Verdict::Allow
            } else {
                Verdict::Patch(patch, Vec::new())
            }
        }
        (Err(e), _) | (_, Err(e)) => {
            Verdict::Deny(format!("cannot encode the defaulted object: {e}"))
        }
    }
}

/// A denial naming every field that is wrong.
/// The namespace of a namespaced object under admission: its own, or the request's when the
/// object leaves it out (a create through a namespaced URL).
fn namespace_of(meta: &ObjectMeta, request: &AdmissionRequest<DynamicObject>) -> String {
    meta.namespace
        .clone()
        .filter(|ns| !ns.is_empty())
        .or_else(|| request.namespace.clone())
        .unwrap_or_default()
}

fn deny(kind: &str, name: &str, errors: &ValidationErrors) -> Verdict {
    Verdict::Deny(format!("{kind} {name:?} is invalid: {errors}"))
}

/// Decodes the request's object as `T`, turning a serde failure into Kubernetes-style enum
/// errors where `raw_enums` recognizes them.
fn decode_checked<T: DeserializeOwned>(
    request: &AdmissionRequest<DynamicObject>,
    raw_enums: fn(&serde_json::Value) -> Result<(), ValidationErrors>,
) -> Result<(T, Option<T>), Verdict> {
    decode(request).map_err(|verdict| {
        if let Some(object) = &request.object
            && let Ok(raw) = serde_json::to_value(object)
            && let Err(errors) = raw_enums(&raw)
        {
            return deny(&request.kind.kind, &request.name, &errors);
        }
        verdict
    })
}

impl Handlers {
    fn mutate_sidecarset(&self, request: &AdmissionRequest<DynamicObject>) -> Verdict {
        let (set, _) =
            match decode_checked::<SidecarSet>(request, validation::sidecarset::validate_raw_enums)
            {
                Ok(decoded) => decoded,
                Err(verdict) => return verdict,
            };
        let mut defaulted = set.clone();
        defaults::default_sidecarset(&mut defaulted);
        let annotations = defaulted
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        annotations.insert(
            SIDECARSET_HASH.to_owned(),
            hash::sidecarset_hash(&defaulted.spec),
        );
        annotations.insert(
            SIDECARSET_HASH_WITHOUT_IMAGE.to_owned(),
            hash::sidecarset_hash_without_image(&defaulted.spec),
        );
        patch_between(&set, &defaulted)
    }

    async fn validate_sidecarset(&self, request: &AdmissionRequest<DynamicObject>) -> Verdict {
        let (set, old) =
            match decode_checked::<SidecarSet>(request, validation::sidecarset::validate_raw_enums)
            {
                Ok(decoded) => decoded,
                Err(verdict) => return verdict,
            };
        if !self.caches_ready().await {
            return Verdict::Deny(
                "the kruise-rs webhook is starting (SidecarSet cache not synced); retry".into(),
            );
        }
        let cached = self.sidecarsets.state();
        let others = cached.iter().map(|set| set.as_ref());
        let name = set.metadata.name.clone().unwrap_or_default();
        let revisions = self.revisions(&name);
        let known: Vec<KnownRevision> = revisions
            .iter()
            .map(KnownRevision::from_controller_revision)
            .collect();
        let policy = match self.patch_pod_metadata_policy().await {
            Ok(policy) => policy.with_defaults_allowed(self.patch_pod_metadata_defaults_allowed),
            Err(message) => return Verdict::Deny(message),
        };
        let ctx = SidecarSetContext {
            revisions: &known,
            patch_pod_metadata: &policy,
        };
        let result = match &old {
            Some(old) => validation::sidecarset::validate_update(old, &set, others, &ctx),
            None => validation::sidecarset::validate_create(&set, others, &ctx),
        };
        if let Err(errors) = result {
            return deny("SidecarSet", &name, &errors);
        }
        let warnings = match self.dry_run_pod(request, &name, &set).await {
            Ok(warnings) => warnings,
            Err(verdict) => return verdict,
        };
        // The pre-download jobs carrying these Secrets are created by the manager, whose own
        // access the job webhook would check: the author is checked here, for every namespace
        // the SidecarSet can reach (decision 0009).
        let reads = secret_access::sidecarset_reads(&set, old.as_ref());
        match self
            .author_may_read(
                request,
                &reads,
                secret_access::SIDECARSET_RULE,
                "SidecarSet",
            )
            .await
        {
            Verdict::Allow if !warnings.is_empty() => {
                Verdict::Patch(json_patch::Patch(Vec::new()), warnings)
            }
            verdict => verdict,
        }
    }

    /// Kubernetes' pod validation of the SidecarSet's containers, init containers and volumes:
    /// a pod built from the request's object as written, created with `dryRun=All` in the
    /// manager's namespace (decision 0012). `Err` is the denial naming the SidecarSet's
    /// fields; `Ok` carries a warning when the dry run could not be made (admitted: fail open),
    /// with what the local copy of the pod rules finds (advice only: decision 0033).
    async fn dry_run_pod(
        &self,
        request: &AdmissionRequest<DynamicObject>,
        name: &str,
        set: &SidecarSet,
    ) -> Result<Vec<String>, Verdict> {
        let sidecars = set.spec.containers.len();
        let Some(raw) = request
            .object
            .as_ref()
            .and_then(|o| serde_json::to_value(o).ok())
        else {
            return Ok(Vec::new());
        };
        let pod = dry_run::synthetic_pod(&raw, &self.namespace);
        // An update that leaves the sidecars alone (a label, a finalizer, the strategy) is not
        // judged again: a SidecarSet admitted before this check can still be edited and deleted.
        let old_pod = request
            .old_object
            .as_ref()
            .filter(|_| request.operation == Operation::Update)
            .and_then(|o| serde_json::to_value(o).ok())
            .map(|old| dry_run::synthetic_pod(&old, &self.namespace));
        if old_pod.as_ref() == Some(&pod) {
            return Ok(Vec::new());
        }
        let outcome = match self.dry_runs.get(name, &pod) {
            Some(outcome) => outcome,
            None => {
                let outcome = dry_run::judge(&self.client, &pod, sidecars).await;
                self.dry_runs.put(name, &pod, &outcome);
                outcome
            }
        };
        match outcome {
            dry_run::Outcome::Valid => Ok(Vec::new()),
            dry_run::Outcome::Invalid(errors) => {
                let listed = match errors.as_slice() {
                    [one] => one.clone(),
                    many => format!("[{}]", many.join(", ")),
                };
                Err(Verdict::Deny(format!(
                    "SidecarSet {name:?} is invalid: {listed} (Kubernetes' pod validation, run on \
                     a dry-run pod holding the SidecarSet's containers, init containers and volumes)"
                )))
            }
            dry_run::Outcome::Unknown(why) => {
                tracing::warn!(
                    sidecarset = name,
                    "SidecarSet admitted without its pod check: {why}"
                );
                let mut warnings = vec![format!(
                    "SidecarSet {name:?}: its containers were not checked by Kubernetes' pod \
                     validation ({why}); pods it is injected into may be refused"
                )];
                let findings = validation::sidecarset::pod_rules_as_of_1_33(set);
                if !findings.is_empty() {
                    let listed: Vec<String> = findings.iter().map(ToString::to_string).collect();
                    warnings.push(format!(
                        "SidecarSet {name:?}: Kubernetes 1.33 would refuse pods with these \
                         sidecars (a newer Kubernetes may not): [{}]",
                        listed.join(", ")
                    ));
                }
                Ok(warnings)
            }
        }
    }

    /// Allow when the requesting user may `get` every Secret of `reads`, else a denial naming
    /// the ones they may not (or that could not be checked).
    async fn author_may_read(
        &self,
        request: &AdmissionRequest<DynamicObject>,
        reads: &[secret_access::SecretRead],
        rule: &str,
        kind: &str,
    ) -> Verdict {
        if reads.is_empty() {
            return Verdict::Allow;
        }
        if let Err(message) = secret_access::within_budget(reads) {
            return Verdict::Deny(format!("{kind} {:?} is refused: {message}", request.name));
        }
        let answers = secret_access::ask(&self.client, &request.user_info, reads).await;
        let user = request.user_info.username.as_deref().unwrap_or_default();
        match secret_access::verdict(user, reads, &answers, rule) {
            Ok(()) => Verdict::Allow,
            Err(message) => {
                Verdict::Deny(format!("{kind} {:?} is refused: {message}", request.name))
            }
        }
    }

    /// The ControllerRevisions of SidecarSet `name`, from the cache.
    fn revisions(&self, name: &str) -> Vec<ControllerRevision> {
        if name.is_empty() {
            return Vec::new();
        }
        self.revisions
            .state()
            .iter()
            .filter(|r| r.labels().get(SIDECARSET_NAME_LABEL).map(String::as_str) == Some(name))
            .map(|r| r.as_ref().clone())
            .collect()
    }

    /// Which annotations `patchPodMetadata` may write, from the ConfigMap upstream uses (before
    /// `--sidecarset-patch-pod-metadata-defaults-allowed` widens it).
    async fn patch_pod_metadata_policy(&self) -> Result<PatchPodMetadataPolicy, String> {
        let configmaps = Api::<ConfigMap>::namespaced(self.client.clone(), &self.namespace);
        let found = configmaps.get_opt(WHITELIST_CONFIGMAP).await.map_err(|e| {
            format!(
                "cannot read the ConfigMap {}/{WHITELIST_CONFIGMAP}: {}",
                self.namespace,
                error_chain(&e)
            )
        })?;
        let Some(json) = found
            .and_then(|c| c.data)
            .and_then(|mut d| d.remove(WHITELIST_CONFIGMAP_KEY))
        else {
            return Ok(PatchPodMetadataPolicy::NotConfigured);
        };
        PatchPodMetadataPolicy::from_whitelist_json(&json, |expression| {
            let regex = regex::Regex::new(expression).map_err(|e| e.to_string())?;
            Ok(move |key: &str| regex.is_match(key))
        })
        .map_err(|e| {
            format!(
                "the ConfigMap {}/{WHITELIST_CONFIGMAP} is invalid: {e}",
                self.namespace
            )
        })
    }

    fn mutate_imagepulljob(&self, request: &AdmissionRequest<DynamicObject>) -> Verdict {
        let (job, _) = match decode_checked::<ImagePullJob>(
            request,
            validation::imagepulljob::validate_raw_enums,
        ) {
            Ok(decoded) => decoded,
            Err(verdict) => return verdict,
        };
        let mut defaulted = job.clone();
        defaults::default_imagepulljob(&mut defaulted);
        patch_between(&job, &defaulted)
    }

    async fn validate_imagepulljob(&self, request: &AdmissionRequest<DynamicObject>) -> Verdict {
        let (job, old) = match decode_checked::<ImagePullJob>(
            request,
            validation::imagepulljob::validate_raw_enums,
        ) {
            Ok(decoded) => decoded,
            Err(verdict) => return verdict,
        };
        let result = match &old {
            Some(old) => validation::imagepulljob::validate_update(old, &job),
            None => validation::imagepulljob::validate_create(&job),
        };
        if let Err(errors) = result {
            return deny("ImagePullJob", &request.name, &errors);
        }
        // The manager copies these Secrets where every node can read them: only their readers
        // may name them (decision 0009).
        let namespace = namespace_of(&job.metadata, request);
        let reads = secret_access::job_reads(&job, &namespace, old.as_ref());
        self.author_may_read(request, &reads, secret_access::JOB_RULE, "ImagePullJob")
            .await
    }

    fn mutate_imagelistpulljob(&self, request: &AdmissionRequest<DynamicObject>) -> Verdict {
        let (job, _) = match decode_checked::<ImageListPullJob>(
            request,
            validation::imagelistpulljob::validate_raw_enums,
        ) {
            Ok(decoded) => decoded,
            Err(verdict) => return verdict,
        };
        let mut defaulted = job.clone();
        defaults::default_imagelistpulljob(&mut defaulted);
        patch_between(&job, &defaulted)
    }

    async fn validate_imagelistpulljob(
        &self,
        request: &AdmissionRequest<DynamicObject>,
    ) -> Verdict {
        let (job, old) = match decode_checked::<ImageListPullJob>(
            request,
            validation::imagelistpulljob::validate_raw_enums,
        ) {
            Ok(decoded) => decoded,
            Err(verdict) => return verdict,
        };
        let result = match &old {
            Some(old) => validation::imagelistpulljob::validate_update(old, &job),
            None => validation::imagelistpulljob::validate_create(&job),
        };
        if let Err(errors) = result {
            return deny("ImageListPullJob", &request.name, &errors);
        }
        // The manager gives these Secrets to the ImagePullJob of each image, which copies them
        // where every node can read them: only their readers may name them (decision 0009).
        let namespace = namespace_of(&job.metadata, request);
        let reads = secret_access::pull_secret_reads(
            &job.spec.template.pull_secrets,
            &namespace,
            old.as_ref()
                .map(|old| old.spec.template.pull_secrets.as_slice()),
        );
        self.author_may_read(request, &reads, secret_access::JOB_RULE, "ImageListPullJob")
            .await
    }

    fn mutate_nodeimage(&self, request: &AdmissionRequest<DynamicObject>) -> Verdict {
        let (node, _) =
            match decode_checked::<NodeImage>(request, validation::nodeimage::validate_raw_enums) {
                Ok(decoded) => decoded,
                Err(verdict) => return verdict,
            };
        let mut defaulted = node.clone();
        defaults::default_nodeimage(&mut defaulted, &Time(Timestamp::now()));
        patch_between(&node, &defaulted)
    }

    fn validate_nodeimage(&self, request: &AdmissionRequest<DynamicObject>) -> Verdict {
        let (node, old) =
            match decode_checked::<NodeImage>(request, validation::nodeimage::validate_raw_enums) {
                Ok(decoded) => decoded,
                Err(verdict) => return verdict,
            };
        let result = match &old {
            Some(old) => validation::nodeimage::validate_update(old, &node),
            None => validation::nodeimage::validate_create(&node),
        };
        match result {
            Ok(()) => Verdict::Allow,
            Err(errors) => deny("NodeImage", &request.name, &errors),
        }
    }

    async fn mutate_pod(&self, request: &AdmissionRequest<DynamicObject>) -> Verdict {
        if request.sub_resource.is_some() || request.operation != Operation::Create {
            return Verdict::Allow;
        }
        // The apiserver's round trip runs while the pod is decoded.
        let fence = match self.sidecarset_cache_reads {
            SidecarSetCacheReads::Confirmed => Some(self.sidecarset_fences.start_after_now()),
            SidecarSetCacheReads::AsTheyStand => None,
        };
        let (mut pod, _) = match decode::<Pod>(request) {
            Ok(decoded) => decoded,
            Err(verdict) => return verdict,
        };
        if pod
            .metadata
            .namespace
            .as_deref()
            .unwrap_or_default()
            .is_empty()
        {
            pod.metadata.namespace = request.namespace.clone();
        }
        if !self.caches_ready().await {
            return Verdict::Deny(
                "the kruise-rs webhook is starting (SidecarSet cache not synced); retry".into(),
            );
        }
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let namespace_labels = match self.namespace_labels(&namespace).await {
            Ok(labels) => labels,
            Err(message) => return Verdict::Deny(message),
        };
        let sidecarsets = match fence {
            Some(fence) => self.confirmed_sidecarsets(fence).await,
            None => Ok(self.sidecarsets_as_they_stand().await),
        };
        let (candidates, unreadable) = match sidecarsets {
            Ok(sidecarsets) => sidecarsets,
            Err(message) => return Verdict::Deny(message),
        };
        // What the SidecarSet cache is missing, before what it holds (decision 0027).
        let unreadable_warnings =
            match self.unreadable_selecting(&pod, &namespace_labels, &unreadable) {
                Ok(warnings) => warnings,
                Err(refusal) => return Verdict::Deny(refusal),
            };
        // History only for SidecarSets that pin a revision (rare): fetched before planning.
        let mut histories: BTreeMap<String, Vec<ControllerRevision>> = BTreeMap::new();
        for set in candidates.iter() {
            let pins = set
                .spec
                .injection_strategy
                .revision
                .as_ref()
                .is_some_and(|r| r.revision_name.is_some() || r.custom_version.is_some());
            if pins && let Some(name) = &set.metadata.name {
                histories.insert(name.clone(), self.revisions(name));
            }
        }
        let plan = sidecar::plan_for_new_pod(
            candidates.iter().map(|set| set.as_ref()),
            &pod,
            &namespace_labels,
            |name| histories.get(name).map(Vec::as_slice).unwrap_or(&[]),
            random_unit,
        );
        let selected = match plan {
            Ok(selected) if selected.is_empty() && unreadable_warnings.is_empty() => {
                return Verdict::Allow;
            }
            Ok(selected) if selected.is_empty() => {
                return Verdict::Patch(json_patch::Patch(Vec::new()), unreadable_warnings);
            }
            Ok(selected) => selected,
            Err(err) => return Verdict::Deny(format!("cannot inject sidecars: {err}")),
        };
        // SidecarSets using a feature kruise-rs does not serve are left out, with a warning,
        // unless annotated to refuse the pod.
        let screened = unsupported::screen(selected, |name| {
            let set = candidates
                .iter()
                .find(|s| s.metadata.name.as_deref() == Some(name));
            let value = set.and_then(|s| s.annotations().get(unsupported::UNSUPPORTED_FEATURES));
            unsupported::refuses(value.map(String::as_str))
        });
        if let Some(refusal) = screened.refusal() {
            return Verdict::Deny(format!("cannot inject sidecars: {}", refusal.message()));
        }
        if !request.dry_run {
            self.record_skipped(&screened.skipped, &pod, &candidates);
        }
        let now = Time(Timestamp::now());
        let injection = match sidecar::inject_with(&pod, &screened.inject, now, self.injection) {
            Ok(injection) => injection,
            Err(err) => return Verdict::Deny(format!("cannot inject sidecars: {err}")),
        };
        let mut warnings = unreadable_warnings;
        warnings.extend(screened.warnings());
        warnings.extend(injection.warnings);
        let patched = request.object.as_ref().map(|raw| {
            preserving_patch::patch_preserving(raw, &pod, &injection.pod, &injection.unknown_fields)
        });
        match patched {
            Some(Ok(patch)) => Verdict::Patch(patch, warnings),
            Some(Err(err)) => Verdict::Deny(format!("cannot encode the injected pod: {err}")),
            None => Verdict::Deny("cannot encode the injected pod".into()),
        }
    }

    /// Records a Warning event on each SidecarSet `pod` goes without, throttled
    /// ([`unsupported_events`]); sent in the background so the admission does not wait.
    fn record_skipped(
        &self,
        skipped: &[unsupported::Skipped],
        pod: &Pod,
        candidates: &[Arc<SidecarSet>],
    ) {
        let now = Instant::now();
        let key = unsupported_events::pod_key(pod);
        for skip in skipped {
            let Some(set) = candidates
                .iter()
                .find(|s| s.metadata.name.as_deref() == Some(skip.sidecarset.as_str()))
            else {
                continue;
            };
            for found in &skip.found {
                let admitted = self
                    .unsupported_events
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .admit(&skip.sidecarset, found.feature, now);
                let Some(unreported) = admitted else {
                    continue;
                };
                let event = unsupported_events::event(found, &key, unreported);
                let regarding = set.object_ref(&());
                let recorder = self.recorder.clone();
                tokio::spawn(async move {
                    if let Err(err) = recorder.publish(&event, &regarding).await {
                        tracing::warn!(error = %err, "cannot record the unsupported-feature event");
                    }
                });
            }
        }
    }

    /// The warnings for `pod` from the unreadable SidecarSets that may select it, or under
    /// [`UnreadableSidecarSetPolicy::Refuse`] the denial naming them.
    fn unreadable_selecting(
        &self,
        pod: &Pod,
        namespace_labels: &BTreeMap<String, String>,
        unreadable: &[Arc<Unreadable>],
    ) -> Result<Vec<String>, String> {
        if unreadable.is_empty() || !sidecar::matching::pod_is_active(pod) {
            return Ok(Vec::new());
        }
        // As the readable SidecarSets are matched (an unset namespace is `default`).
        let namespace = sidecar::matching::pod_namespace(pod);
        let no_labels = BTreeMap::new();
        let pod_labels = pod.metadata.labels.as_ref().unwrap_or(&no_labels);
        let mut found: Vec<(&str, &str, unreadable_sidecarsets::Selection)> = unreadable
            .iter()
            .filter_map(|set| {
                let selection = unreadable_sidecarsets::selects(
                    &set.raw,
                    namespace,
                    pod_labels,
                    namespace_labels,
                );
                (selection != unreadable_sidecarsets::Selection::No).then(|| {
                    let name = set.metadata.name.as_deref().unwrap_or_default();
                    (name, set.error.as_str(), selection)
                })
            })
            .collect();
        found.sort_by_key(|(name, _, _)| *name);
        match self.unreadable_sidecarset_policy {
            UnreadableSidecarSetPolicy::Admit => Ok(found
                .iter()
                .map(|(name, error, selection)| {
                    unreadable_sidecarsets::warning(name, error, selection)
                })
                .collect()),
            UnreadableSidecarSetPolicy::Refuse if found.is_empty() => Ok(Vec::new()),
            UnreadableSidecarSetPolicy::Refuse => Err(found
                .iter()
                .map(|(name, error, selection)| {
                    unreadable_sidecarsets::refusal(name, error, selection)
                })
                .collect::<Vec<_>>()
                .join("; ")),
        }
    }

    /// The SidecarSets as they are now, readable and not: the cache as it is when the
    /// apiserver's stands (the `fence`, started when the request came in) at a version ours is
    /// known to hold; otherwise, once our watch reaches it or a list comes first, the cached
    /// objects the list confirms and the others read from the apiserver
    /// (`confirmed_sidecarsets.rs`). The cached objects are used themselves, not
    /// copies: cloning 50 SidecarSets cost more than the whole injection (benches/admission.rs).
    async fn confirmed_sidecarsets(
        &self,
        fence: impl Future<Output = Result<Arc<Option<String>>, String>>,
    ) -> Result<ConfirmedSidecarSets, String> {
        let refusal = |e: String| {
            format!("cannot confirm which SidecarSets may select this pod ({e}); retry")
        };
        let fence = fence.await.map_err(refusal)?;
        let versions = &self.sidecarset_versions;
        if let Some(version) = fence.as_deref()
            && let Some(settled) = versions.holds(version)
            && let Some(cached) = self.cached_at(settled)
        {
            self.confirmations.fence.fetch_add(1, Relaxed);
            return Ok(cached);
        }
        // Our watch is behind the fence, or the apiserver's cache moved on by a progress
        // notification (no event will come): whichever settles it first.
        let caught_up = async {
            match fence.as_deref() {
                Some(version) => versions.reached(version).await,
                None => std::future::pending().await,
            }
        };
        let listed = tokio::select! {
            settled = caught_up => match self.cached_at(settled) {
                Some(cached) => {
                    self.confirmations.caught_up.fetch_add(1, Relaxed);
                    return Ok(cached);
                }
                // An event came in between: list.
                None => self.sidecarset_lists.started_after_now().await,
            },
            listed = self.sidecarset_lists.started_after_now() => listed,
        }
        .map_err(refusal)?;
        self.confirmations.listed.fetch_add(1, Relaxed);
        let settled = versions.settled();
        let cached = self
            .sidecarsets
            .state()
            .into_iter()
            .map(Confirmed::Readable)
            .chain(
                self.unreadable_sidecarsets
                    .state()
                    .into_iter()
                    .map(|u| Confirmed::Unreadable(Arc::new(u.unreadable.clone()))),
            );
        let confirmation = confirmed_sidecarsets::confirm(&listed.sets, cached, |c| {
            let meta = c.metadata();
            (meta.name.as_deref(), meta.resource_version.as_deref())
        });
        // The cache held exactly what the list did: the list's version is one ours holds.
        if confirmation.fetch.is_empty()
            && let (Some(settled), Some(version)) = (settled, listed.version.as_deref())
        {
            versions.matched(settled, version);
        }
        let mut confirmed = confirmation.current;
        // Read together, and bounded as the fence and the list are: an admission the apiserver
        // gives up on is left to the failurePolicy, and `Ignore` would admit the pod without
        // its sidecars.
        let api = Api::<Guarded<SidecarSet>>::all(self.client.clone());
        let reads = futures::future::join_all(confirmation.fetch.iter().map(|name| {
            let api = &api;
            async move { (name, api.get_opt(name).await) }
        }));
        let fetched = tokio::time::timeout(confirmed_sidecarsets::READ_TIMEOUT, reads)
            .await
            .map_err(|_| {
                let noun = if confirmation.fetch.len() == 1 {
                    "SidecarSet"
                } else {
                    "SidecarSets"
                };
                refusal(format!(
                    "reading {noun} {} took over {} s",
                    confirmation.fetch.join(", "),
                    confirmed_sidecarsets::READ_TIMEOUT.as_secs()
                ))
            })?;
        for (name, got) in fetched {
            match got {
                Ok(Some(Guarded(Ok(set)))) => confirmed.push(Confirmed::Readable(Arc::new(set))),
                Ok(Some(Guarded(Err(unreadable)))) => {
                    confirmed.push(Confirmed::Unreadable(Arc::new(unreadable)));
                }
                // Deleted.
                Ok(None) => {}
                Err(e) => {
                    return Err(refusal(format!(
                        "reading SidecarSet {name}: {}",
                        error_chain(&e)
                    )));
                }
            }
        }
        let (mut readable, mut unreadable) = (Vec::new(), Vec::new());
        for c in confirmed {
            match c {
                Confirmed::Readable(set) => readable.push(set),
                Confirmed::Unreadable(u) => unreadable.push(u),
            }
        }
        Ok((readable, unreadable))
    }

    /// Both SidecarSet caches as they stand, read between two events (an object moving
    /// between them is never missed), without asking the apiserver: upstream's way, chosen by
    /// `--sidecarset-cache-fence=false` (decision 0046).
    async fn sidecarsets_as_they_stand(&self) -> ConfirmedSidecarSets {
        loop {
            if let Some(settled) = self.sidecarset_versions.settled()
                && let Some(cached) = self.cached_at(settled)
            {
                return cached;
            }
            // An event is being applied: its stream finishes it within this poll.
            tokio::task::yield_now().await;
        }
    }

    /// Both SidecarSet caches as they were at `settled`, or `None` if an event has changed
    /// them since.
    fn cached_at(&self, settled: Settled) -> Option<ConfirmedSidecarSets> {
        let readable = self.sidecarsets.state();
        let unreadable = self
            .unreadable_sidecarsets
            .state()
            .iter()
            .map(|u| Arc::new(u.unreadable.clone()))
            .collect();
        self.sidecarset_versions
            .still(settled)
            .then_some((readable, unreadable))
    }

    /// How admissions have confirmed the SidecarSet cache so far: by a fence at a version the
    /// cache held, by waiting for the watch to reach it, and by a list.
    pub fn sidecarset_confirmations(&self) -> (u64, u64, u64) {
        let c = &self.confirmations;
        (
            c.fence.load(Relaxed),
            c.caught_up.load(Relaxed),
            c.listed.load(Relaxed),
        )
    }

    /// The labels of namespace `name`, from the cache or (for a namespace created a moment ago)
    /// from the apiserver, bounded as the SidecarSets' reads are.
    async fn namespace_labels(&self, name: &str) -> Result<BTreeMap<String, String>, String> {
        if let Some(namespace) = self.namespaces.get(&ObjectRef::new(name)) {
            return Ok(namespace.metadata.labels.clone().unwrap_or_default());
        }
        let namespaces = Api::<Namespace>::all(self.client.clone());
        let read = namespaces.get_metadata(name);
        match tokio::time::timeout(confirmed_sidecarsets::READ_TIMEOUT, read).await {
            Ok(Ok(namespace)) => Ok(namespace.metadata.labels.unwrap_or_default()),
            Ok(Err(e)) => Err(format!(
                "cannot read the labels of namespace {name}: {}",
                error_chain(&e)
            )),
            Err(_) => Err(format!(
                "cannot read the labels of namespace {name}: no answer within {} s; retry",
                confirmed_sidecarsets::READ_TIMEOUT.as_secs()
            )),
        }
    }
}

/// The SidecarSets a pod is weighed against: those our type reads, and those it does not.
type ConfirmedSidecarSets = (Vec<Arc<SidecarSet>>, Vec<Arc<Unreadable>>);

/// Counts of [`Handlers::sidecarset_confirmations`].
#[derive(Default)]
struct ConfirmationCounts {
    fence: AtomicU64,
    caught_up: AtomicU64,
    listed: AtomicU64,
}

/// A SidecarSet the pod webhook weighs: one our type reads, or one it does not (decision 0027).
enum Confirmed {
    Readable(Arc<SidecarSet>),
    Unreadable(Arc<Unreadable>),
}

impl Confirmed {
    fn metadata(&self) -> &ObjectMeta {
        match self {
            Confirmed::Readable(set) => &set.metadata,
            Confirmed::Unreadable(u) => &u.metadata,
        }
    }
}

/// A number drawn uniformly from `[0, 1)`, for the `Partial` injection policy. It only splits
/// pods between two revisions, so the clock's nanoseconds mixed through a hash are random
/// enough, and no RNG dependency is needed.
fn random_unit() -> f64 {
    use std::hash::{BuildHasher, RandomState};
    let bits = RandomState::new().hash_one(std::time::SystemTime::now());
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_draws_stay_in_the_unit_interval() {
        for _ in 0..1000 {
            let r = random_unit();
            assert!((0.0..1.0).contains(&r), "{r}");
        }
    }
}
