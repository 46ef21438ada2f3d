//! One reconcile of a SidecarSet: fetch from the stores, [`plan`](super::plan), write —
//! the revisions, the status and its events, the pods' upgradable conditions, the hot-upgrade
//! flips, the batch of pod upgrades and the pre-download jobs.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tracing::{debug, info, instrument, warn};

use super::expectations::pod_key;
use super::plan::{
    Plan, PreDownloadInputs, is_job, labelled_history, newly_not_upgradable, newly_skipped,
    own_jobs, owned_pods, plan, pod_condition, revisions_in_use, status_patch, unwanted_jobs,
};
use super::pods::namespace_labels;
use super::predownload::{self, Decision, KnobWarning, Knobs};
use super::resize::resize_patch;
use super::revisions;
use super::rollout::{CurrentHashes, InPlaceResize, PodView};
use super::status::PODS_UPGRADABLE;
use super::twin_flip::Flip;
use super::upgrade::{UpgradeError, upgrade_patch};
use super::{Context, Error, FIELD_MANAGER};
use kruise_rs_api::imagepulljob::ImagePullJob;
use kruise_rs_api::sidecarset::{SidecarSet, SidecarSetStatus};
use kruise_rs_controller::pod_summary::PodSummary;
use kruise_rs_kube::backoff::jittered;
use kruise_rs_kube::error_chain::error_chain;
use kruise_rs_sidecar::revision::history::revisions_to_delete;

/// How long a reconcile waits for the first lists of pods, namespaces and revisions.
const CACHE_WAIT: Duration = Duration::from_secs(10);

/// Pod patches in flight at once while a batch is upgraded.
const UPGRADE_CONCURRENCY: usize = 16;

/// When a pod patch was refused because the pod changed meanwhile: the next try, from fresh data.
const RETRY_CHANGED_POD: Duration = Duration::from_secs(1);

/// A periodic look even when nothing changed (level-based safety net).
const RESYNC: Duration = Duration::from_secs(300);

pub(super) fn error_policy(set: Arc<SidecarSet>, err: &Error, ctx: Arc<Context>) -> Action {
    let name = set.name_any();
    let delay = ctx.backoff.failed(&name);
    warn!(sidecarset = %name, error = %error_chain(err), retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

#[instrument(skip_all, fields(sidecarset = %set.name_any()))]
pub(super) async fn reconcile(set: Arc<SidecarSet>, ctx: Arc<Context>) -> Result<Action, Error> {
    // An empty pod store would read as "no pods": the status would drop to zero.
    let mut ready = ctx.caches_ready.clone();
    match tokio::time::timeout(CACHE_WAIT, ready.wait_for(|r| *r)).await {
        Ok(Ok(_)) => {}
        _ => return Err(Error::CachesNotReady),
    }
    let action = reconcile_set(&set, &ctx).await;
    ctx.written.forget_caught_up(&ctx.pods);
    // The SidecarSet watch removes a deleted one's series; this catches a reconcile that was
    // in flight then and set them again after.
    let sidecarsets = &ctx.sidecarsets;
    ctx.metrics
        .retain_sidecarsets(|name| sidecarsets.get(&ObjectRef::new(name)).is_some());
    let action = action?;
    ctx.backoff.succeeded(&set.name_any());
    Ok(action)
}

async fn reconcile_set(set: &SidecarSet, ctx: &Context) -> Result<Action, Error> {
    if set.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let name = set.name_any();
    let namespaces = namespace_labels(ctx.namespaces.state().iter().map(|n| &**n));
    let owned = owned_pods(set, ctx.written.overlay(&ctx.pods), &namespaces);

    let history = labelled_history(&name, ctx.revisions.state().iter().map(|r| &**r));
    let revision_api = Api::<ControllerRevision>::namespaced(ctx.client.clone(), &ctx.namespace);
    let registered = revisions::register(&revision_api, set, &history, &ctx.namespace).await?;
    let latest = registered.latest.name_any();

    let previous = set.status.clone();
    // The pods' hash entries record the revision they were upgraded to.
    let mut set = set.clone();
    set.status
        .get_or_insert_with(SidecarSetStatus::default)
        .latest_revision = Some(latest.clone());
    let set = &set;

    let now = Time(Timestamp::now());
    let (knobs, knob_warnings) = predownload::knobs_when(set, ctx.predownload);
    warn_knobs(ctx, set, &knob_warnings).await;
    let jobs = own_jobs(set, ctx.jobs.state());
    let nodeimage = |node: &str| ctx.nodeimages.get(&ObjectRef::new(node));
    let resize_served = ctx.resize_served().await?;
    let current = CurrentHashes::with_resize(
        set,
        history.iter().chain(std::iter::once(&registered.latest)),
        resize_served,
    );
    let Plan {
        current,
        views,
        batch,
        report,
        predownload: decision,
        predownload_wake,
        flips,
    } = plan(
        set,
        current,
        &owned,
        registered.collision_count,
        &now,
        &PreDownloadInputs {
            knobs: &knobs,
            manager_namespace: &ctx.namespace,
            jobs: &jobs,
            nodeimage: &nodeimage,
        },
    );
    let s = &report.status;
    ctx.metrics.set_sidecarset_pods(
        &name,
        [
            s.matched_pods,
            s.updated_pods,
            s.ready_pods,
            s.updated_ready_pods,
        ],
    );
    if previous.as_ref() != Some(&report.status) {
        write_status(ctx, set, &report.status).await?;
        announce_not_upgradable(ctx, set, previous.as_ref(), &report.status).await;
        announce_skipped(ctx, set, previous.as_ref(), &report.status).await;
    }
    let jobs_synced = sync_jobs(ctx, set, &knobs, &decision, &jobs).await;

    mark_upgradable(ctx, set, &views, &now).await?;

    let flipped = flip_pods(ctx, set, &owned, flips).await;
    let targets: Vec<Target> = batch
        .upgrade
        .iter()
        .map(|&i| Target {
            pod: owned[i].clone(),
            resize: views[i].resize == InPlaceResize::Needed,
        })
        .collect();
    let in_use = revisions_in_use(&owned, &name);
    // The snapshot goes before the batch: as each pod's new version replaces it in the store,
    // its old one is freed, instead of every pod being held twice until the batch ends.
    drop(views);
    drop(owned);
    let outcome = upgrade_pods(ctx, set, &current, targets, &now).await;

    let mut all = history;
    if !all.iter().any(|r| r.name_any() == latest) {
        all.push(registered.latest.clone());
    }
    let stale = revisions_to_delete(set, &all, &latest, &in_use);
    if !stale.is_empty() {
        revisions::delete_revisions(&revision_api, &stale).await?;
    }

    jobs_synced?;
    let flips_refused = flipped?;
    match outcome? {
        // Jittered: SidecarSets reconciled together (a restart) do not resync together, and
        // sets whose pods changed under them do not retry in step.
        UpgradeOutcome { refused: 0, .. } if flips_refused == 0 => {
            // Back when a pod stops waiting for its node's pre-download, if that comes first.
            let resync = jittered(RESYNC, 0.1);
            Ok(Action::requeue(match predownload_wake {
                Some(wake) => resync.min(until(wake)),
                None => resync,
            }))
        }
        UpgradeOutcome { refused, .. } => {
            debug!(sidecarset = %name, refused, "pods changed while being upgraded; trying again");
            Ok(Action::requeue(jittered(RETRY_CHANGED_POD, 0.5)))
        }
    }
}

/// The time from now until `at`, at least a second (it is never in the past when planned, and
/// a zero requeue would spin).
fn until(at: k8s_openapi::jiff::Timestamp) -> Duration {
    let wait = at.duration_since(Timestamp::now());
    Duration::try_from(wait)
        .unwrap_or(Duration::ZERO)
        .max(Duration::from_secs(1))
}

async fn write_status(
    ctx: &Context,
    set: &SidecarSet,
    status: &SidecarSetStatus,
) -> Result<(), Error> {
    let name = set.name_any();
    let patch = status_patch(status);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    };
    Api::<SidecarSet>::all(ctx.client.clone())
        .patch_status(&name, &params, &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(|source| Error::WriteStatus { name, source })
}

/// The event `NotUpgradablePods` (Normal, as upstream types it) when the pods that cannot be
/// upgraded in place change, naming them, so `kubectl describe` shows it without repeating it
/// every reconcile; likewise with the `PodsUpgradable` condition's other reasons (resizes the
/// apiserver cannot take, or the kubelet has not applied).
async fn announce_not_upgradable(
    ctx: &Context,
    set: &SidecarSet,
    previous: Option<&SidecarSetStatus>,
    status: &SidecarSetStatus,
) {
    let Some(message) = newly_not_upgradable(previous, status) else {
        return;
    };
    // The condition's reason: NotUpgradablePods, ResizeNotServed, ResizeInfeasible or
    // ResizeDeferred. A resize the kubelet will never apply is a Warning.
    let reason = status
        .conditions
        .iter()
        .find(|c| c.type_ == PODS_UPGRADABLE)
        .map_or("NotUpgradablePods", |c| c.reason.as_str());
    let type_ = if reason == "ResizeInfeasible" {
        EventType::Warning
    } else {
        EventType::Normal
    };
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(message),
        action: "Upgrade".into(),
        secondary: None,
    };
    if let Err(err) = ctx.recorder.publish(&event, &set.object_ref(&())).await {
        warn!(sidecarset = %set.name_any(), error = %err, "cannot publish an event");
    }
}

/// Sets the `SidecarSetUpgradable` condition of pods this SidecarSet cannot upgrade in place,
/// clears this SidecarSet's `false` from pods it can upgrade again, and with
/// `--sidecarset-upgradable-condition-on-upgrade` marks the pods it upgraded ([`pod_condition`]).
async fn mark_upgradable(
    ctx: &Context,
    set: &SidecarSet,
    views: &[PodView<'_>],
    now: &Time,
) -> Result<(), Error> {
    let name = set.name_any();
    for v in views {
        let Some(condition) = pod_condition(v, &name, ctx.upgradable_on_upgrade, now) else {
            continue;
        };
        let pod = v.pod;
        let api = Api::<PodSummary>::namespaced(
            ctx.client.clone(),
            pod.metadata.namespace.as_deref().unwrap_or_default(),
        );
        let patch = serde_json::json!({ "status": { "conditions": [condition] } });
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..Default::default()
        };
        match api
            .patch_status(&pod.name_any(), &params, &Patch::Strategic(&patch))
            .await
        {
            Ok(written) => ctx.remember(written),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(source) => {
                return Err(Error::PodCondition {
                    pod: pod_key(pod),
                    source,
                });
            }
        }
    }
    Ok(())
}

/// A pod of the batch.
struct Target {
    pod: Arc<PodSummary>,
    /// Its sidecars' resources changed too: it is resized before its images are patched.
    resize: bool,
}

#[derive(Debug, Default)]
struct UpgradeOutcome {
    upgraded: usize,
    /// Patches the apiserver refused because the pod changed since it was read.
    refused: usize,
}

/// What became of one pod of a batch.
enum PodUpgrade {
    Upgraded,
    /// It changed since it was read, or is gone: the next reconcile sees it afresh.
    Changed,
    /// Its annotations make an upgrade impossible; said in a Warning event.
    Impossible,
}

/// Upgrades `targets`, a few at a time. A pod that changed meanwhile is left for the next try;
/// the first other failure is returned after the rest were tried.
async fn upgrade_pods(
    ctx: &Context,
    set: &SidecarSet,
    current: &CurrentHashes,
    targets: Vec<Target>,
    now: &Time,
) -> Result<UpgradeOutcome, Error> {
    let set_name = set.name_any();
    // Counted as they come rather than collected: a batch of 10,000 results took 2 MiB, grown
    // by doubling, at the end of a rollout (measured with heaptrack).
    let mut results = std::pin::pin!(
        futures::stream::iter(targets)
            .map(|target| upgrade_one(ctx, set, current, target, now))
            .buffer_unordered(UPGRADE_CONCURRENCY)
    );
    let mut outcome = UpgradeOutcome::default();
    let mut first_error = None;
    while let Some(result) = results.next().await {
        match result {
            Ok(PodUpgrade::Upgraded) => outcome.upgraded += 1,
            Ok(PodUpgrade::Changed) => outcome.refused += 1,
            Ok(PodUpgrade::Impossible) => {}
            Err(err) => {
                first_error.get_or_insert(err);
            }
        }
    }
    if outcome.upgraded > 0 {
        info!(sidecarset = %set_name, pods = outcome.upgraded, "upgraded sidecars in place");
    }
    match first_error {
        Some(err) => Err(err),
        None => Ok(outcome),
    }
}

/// Upgrades one pod.
async fn upgrade_one(
    ctx: &Context,
    set: &SidecarSet,
    current: &CurrentHashes,
    Target { pod, resize }: Target,
    now: &Time,
) -> Result<PodUpgrade, Error> {
    // A batch of thousands of pods takes a while: once the SidecarSet has changed, the rest
    // waits for the next reconcile rather than getting a version that is already old.
    let changed = ctx
        .sidecarsets
        .get(&ObjectRef::from_obj(set))
        .is_some_and(|now| now.metadata.generation != set.metadata.generation);
    if changed {
        return Ok(PodUpgrade::Changed);
    }
    let key = pod_key(&pod);
    let api = Api::<PodSummary>::namespaced(
        ctx.client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
    );
    if resize && let Some(stopped) = resize_one(ctx, set, &pod).await? {
        return Ok(stopped);
    }
    // patchPodMetadata reads annotations the cache does not keep.
    let pod = if set.spec.patch_pod_metadata.is_empty() {
        pod
    } else {
        match api.get(&pod.name_any()).await {
            Ok(live) => Arc::new(live),
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(PodUpgrade::Changed),
            Err(source) => return Err(upgrade_failed(ctx, set, key, source).await),
        }
    };
    let upgrade = match upgrade_patch(&pod, set, current, now) {
        Ok(upgrade) => upgrade,
        Err(err) => {
            refuse_pod(ctx, set, &key, &err).await;
            return Ok(PodUpgrade::Impossible);
        }
    };
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    };
    match api
        .patch(&pod.name_any(), &params, &Patch::<()>::Json(upgrade.patch))
        .await
    {
        Ok(written) => {
            debug!(pod = %key, containers = ?upgrade.changed, "sidecars upgraded");
            ctx.remember(written);
            Ok(PodUpgrade::Upgraded)
        }
        // A failed `test` (the pod changed since it was read), a conflict, or a pod gone.
        Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409 | 422) => Ok(PodUpgrade::Changed),
        Err(source) => Err(upgrade_failed(ctx, set, key, source).await),
    }
}

/// Gives `pod`'s sidecars their new resources through `pods/resize` ([`resize_patch`]), before
/// the upgrade patch records the new version. `None` when the upgrade goes on (resized, or
/// nothing to resize); otherwise what became of the pod.
async fn resize_one(
    ctx: &Context,
    set: &SidecarSet,
    pod: &PodSummary,
) -> Result<Option<PodUpgrade>, Error> {
    let key = pod_key(pod);
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    // The full pod: its current resources, and the app containers a resourcesPolicy reads.
    let live = match Api::<Pod>::namespaced(ctx.client.clone(), namespace)
        .get(&pod.name_any())
        .await
    {
        Ok(live) => live,
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Some(PodUpgrade::Changed)),
        Err(source) => return Err(upgrade_failed(ctx, set, key, source).await),
    };
    let patch = match resize_patch(set, &live) {
        Ok(Some(patch)) => patch,
        Ok(None) => return Ok(None),
        Err(err) => {
            warn!(sidecarset = %set.name_any(), pod = %key, error = %err, "cannot compute the sidecars' resources");
            upgrade_failed_event(ctx, set, format!("pod {key}: {err}")).await;
            return Ok(Some(PodUpgrade::Impossible));
        }
    };
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    };
    match Api::<PodSummary>::namespaced(ctx.client.clone(), namespace)
        .patch_subresource(
            "resize",
            &pod.name_any(),
            &params,
            &Patch::Strategic(&patch),
        )
        .await
    {
        Ok(written) => {
            debug!(pod = %key, "sidecars resized");
            ctx.remember(written);
            Ok(None)
        }
        // Gone, or changed since it was read.
        Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409) => Ok(Some(PodUpgrade::Changed)),
        // The apiserver's resize rules (a request removed, the QoS class changed, a resource
        // other than cpu and memory...): said on the SidecarSet, tried again at later reconciles.
        Err(kube::Error::Api(s)) if matches!(s.code, 400 | 422) => {
            warn!(sidecarset = %set.name_any(), pod = %key, error = %s.message, "resize refused");
            let note = format!(
                "pod {key}: the apiserver refused to resize its sidecars: {}; give the sidecars \
                 resources a resize can reach (cpu and memory only, no request or limit removed, \
                 the same QoS class) or recreate the pod",
                s.message
            );
            upgrade_failed_event(ctx, set, note).await;
            Ok(Some(PodUpgrade::Impossible))
        }
        Err(source) => Err(upgrade_failed(ctx, set, key, source).await),
    }
}

/// Puts the old hot-upgrade twins of `flips` back on their empty image, a few pods at a time,
/// with a `ResetContainerSucceed` / `ResetContainerFailed` event on each pod. Returns how many
/// patches were refused because the pod changed since it was read; the first other failure is
/// returned after the rest were tried.
async fn flip_pods(
    ctx: &Context,
    set: &SidecarSet,
    owned: &[Arc<PodSummary>],
    flips: Vec<(usize, Flip)>,
) -> Result<usize, Error> {
    let mut results = std::pin::pin!(
        futures::stream::iter(flips)
            .map(|(i, flip)| flip_one(ctx, set, owned[i].clone(), flip))
            .buffer_unordered(UPGRADE_CONCURRENCY)
    );
    let mut refused = 0;
    let mut first_error = None;
    while let Some(result) = results.next().await {
        match result {
            Ok(true) => {}
            Ok(false) => refused += 1,
            Err(err) => {
                first_error.get_or_insert(err);
            }
        }
    }
    first_error.map_or(Ok(refused), Err)
}

/// One pod's flip; `Ok(false)` when the pod changed or is gone.
async fn flip_one(
    ctx: &Context,
    set: &SidecarSet,
    pod: Arc<PodSummary>,
    flip: Flip,
) -> Result<bool, Error> {
    let key = pod_key(&pod);
    let api = Api::<PodSummary>::namespaced(
        ctx.client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
    );
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    };
    let containers = flip.reset.join(", ");
    let (result, event) = match api
        .patch(&pod.name_any(), &params, &Patch::<()>::Json(flip.patch))
        .await
    {
        Ok(written) => {
            debug!(pod = %key, containers, "old hot-upgrade twins reset to the empty image");
            ctx.remember(written);
            let note = format!(
                "SidecarSet {}: reset sidecar container(s) {containers} to the hot-upgrade empty image",
                set.name_any()
            );
            (
                Ok(true),
                Some((EventType::Normal, "ResetContainerSucceed", note)),
            )
        }
        Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409 | 422) => (Ok(false), None),
        Err(source) => {
            let cause = match &source {
                kube::Error::Api(status) => status.message.clone(),
                other => error_chain(other),
            };
            let note = format!(
                "SidecarSet {}: cannot reset sidecar container(s) {containers} to the hot-upgrade empty image: {cause}",
                set.name_any()
            );
            let err = Error::UpgradePod { pod: key, source };
            (
                Err(err),
                Some((EventType::Warning, "ResetContainerFailed", note)),
            )
        }
    };
    if let Some((type_, reason, note)) = event {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: "HotUpgrade".into(),
            secondary: Some(set.object_ref(&())),
        };
        if let Err(e) = ctx.recorder.publish(&event, &pod.object_ref(&())).await {
            warn!(error = %e, "cannot publish an event");
        }
    }
    result
}

/// A pod the apiserver would not let us read or patch (RBAC, a webhook, a timeout): said on the
/// SidecarSet as well as in the log, since the rollout stalls on it until it is fixed.
async fn upgrade_failed(
    ctx: &Context,
    set: &SidecarSet,
    pod: String,
    source: kube::Error,
) -> Error {
    // The apiserver's own message says it best ("... cannot get resource pods ..."); kube's
    // rendering of the whole Status would not fit an event.
    let cause = match &source {
        kube::Error::Api(status) => status.message.clone(),
        other => error_chain(other),
    };
    upgrade_failed_event(ctx, set, format!("pod {pod}: {cause}")).await;
    Error::UpgradePod { pod, source }
}

/// Creates, updates and deletes the SidecarSet's pre-download jobs to match `decision`. Every
/// job is tried; the first failure is returned (the reconcile is retried with backoff).
async fn sync_jobs(
    ctx: &Context,
    set: &SidecarSet,
    knobs: &Knobs,
    decision: &Decision,
    existing: &[Arc<ImagePullJob>],
) -> Result<(), Error> {
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    };
    let mut first_error = None;
    for plan in decision.jobs() {
        let wanted = predownload::job(set, plan, knobs);
        let api = Api::<ImagePullJob>::namespaced(ctx.client.clone(), &plan.namespace);
        let key = format!("{}/{}", plan.namespace, plan.name);
        match existing
            .iter()
            .find(|j| is_job(j, &plan.namespace, &plan.name))
        {
            Some(job) => {
                let Some(patch) = predownload::job_update(job, &wanted) else {
                    continue;
                };
                if let Err(source) = api.patch(&plan.name, &params, &Patch::Merge(&patch)).await {
                    first_error.get_or_insert(Error::Job { job: key, source });
                }
            }
            None => match api.create(&PostParams::default(), &wanted).await {
                Ok(created) => {
                    let note = format!(
                        "created ImagePullJob {key} to pull {} on {} node(s) before their pods are upgraded",
                        plan.image,
                        plan.nodes.len()
                    );
                    let related = Some(created.object_ref(&()));
                    let reason = "CreatedImagePullJob";
                    publish(ctx, set, EventType::Normal, reason, note, related).await;
                }
                // Our store lags behind an earlier create: nothing to do.
                Err(kube::Error::Api(s)) if s.code == 409 && s.reason == "AlreadyExists" => {
                    let ours = api.get(&plan.name).await.ok().is_some_and(|j| {
                        j.owner_references()
                            .iter()
                            .any(|o| Some(o.uid.as_str()) == set.metadata.uid.as_deref())
                    });
                    if !ours {
                        let note = format!(
                            "cannot create ImagePullJob {key} for {}: an ImagePullJob of that name exists and is not this SidecarSet's",
                            plan.image
                        );
                        publish(
                            ctx,
                            set,
                            EventType::Warning,
                            "FailedCreateImagePullJob",
                            note,
                            Some(wanted.object_ref(&())),
                        )
                        .await;
                        first_error.get_or_insert(Error::JobTaken { job: key });
                    }
                }
                Err(source) => {
                    let note = format!(
                        "cannot create ImagePullJob {key} for {}: {source}",
                        plan.image
                    );
                    publish(
                        ctx,
                        set,
                        EventType::Warning,
                        "FailedCreateImagePullJob",
                        note,
                        Some(wanted.object_ref(&())),
                    )
                    .await;
                    first_error.get_or_insert(Error::Job { job: key, source });
                }
            },
        }
    }
    for job in unwanted_jobs(decision, existing) {
        let namespace = job.metadata.namespace.clone().unwrap_or_default();
        let name = job.name_any();
        let api = Api::<ImagePullJob>::namespaced(ctx.client.clone(), &namespace);
        match api.delete(&name, &DeleteParams::background()).await {
            Ok(_) => {
                debug!(sidecarset = %set.name_any(), job = %name, "deleted a pre-download job")
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(source) => {
                first_error.get_or_insert(Error::Job {
                    job: format!("{namespace}/{name}"),
                    source,
                });
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// One Warning event naming every pre-download annotation that cannot be used, once per set of
/// values.
async fn warn_knobs(ctx: &Context, set: &SidecarSet, warnings: &[KnobWarning]) {
    if warnings.is_empty() {
        return;
    }
    let note = warnings
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    let key = format!("{}/{note}", set.metadata.uid.as_deref().unwrap_or_default());
    let first = ctx
        .warned
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key);
    if first {
        let reason = "InvalidPreDownloadAnnotation";
        publish(ctx, set, EventType::Warning, reason, note, None).await;
    }
}

/// A Normal event when pre-download turns to skipped, saying why.
async fn announce_skipped(
    ctx: &Context,
    set: &SidecarSet,
    previous: Option<&SidecarSetStatus>,
    status: &SidecarSetStatus,
) {
    let Some((now, message)) = newly_skipped(previous, status) else {
        return;
    };
    // One series per skip reason: a later, different skip keeps its own message.
    let event = Event {
        type_: EventType::Normal,
        reason: "ImagePreDownloadSkipped".into(),
        note: Some(message),
        action: now,
        secondary: None,
    };
    if let Err(err) = ctx.recorder.publish(&event, &set.object_ref(&())).await {
        warn!(sidecarset = %set.name_any(), error = %err, "cannot publish an event");
    }
}

/// Publishes an event on the SidecarSet; failing to is logged, never fatal.
async fn publish(
    ctx: &Context,
    set: &SidecarSet,
    type_: EventType,
    reason: &str,
    note: String,
    related: Option<ObjectReference>,
) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: related,
    };
    if let Err(err) = ctx.recorder.publish(&event, &set.object_ref(&())).await {
        warn!(sidecarset = %set.name_any(), error = %err, "cannot publish an event");
    }
}

/// A pod whose annotations make an upgrade impossible: said on the SidecarSet.
async fn refuse_pod(ctx: &Context, set: &SidecarSet, pod: &str, err: &UpgradeError) {
    warn!(sidecarset = %set.name_any(), pod, error = %err, "cannot upgrade the pod");
    upgrade_failed_event(ctx, set, format!("pod {pod}: {err}")).await;
}

/// The Warning event `UpgradeFailed` on the SidecarSet.
async fn upgrade_failed_event(ctx: &Context, set: &SidecarSet, note: String) {
    let event = Event {
        type_: EventType::Warning,
        reason: "UpgradeFailed".into(),
        note: Some(note),
        action: "Upgrade".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &set.object_ref(&())).await {
        warn!(error = %e, "cannot publish an event");
    }
}
