//! The ImageListPullJob reconcile: fetch (the list's children from the store), plan
//! ([`super::plan`]), write (the hash label, deletions, creations in slow-start batches,
//! relabels, the status; the list itself once its TTL has passed).

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use tracing::{info, instrument, warn};

use super::plan::{self, Doomed, Step};
use super::{Context, Error, FIELD_MANAGER};
use kruise_rs_api::imagelistpulljob::{ImageListPullJob, ImageListPullJobStatus};
use kruise_rs_api::imagepulljob::ImagePullJob;
use kruise_rs_api::well_known::CONTROLLER_REVISION_HASH;
use kruise_rs_kube::error_chain::error_chain;

/// How long a reconcile waits for the first list of ImagePullJobs.
const CACHE_WAIT: Duration = Duration::from_secs(10);

/// Upstream's event reasons (with spaces; events.k8s.io/v1 limits a reason's length only).
pub(super) const CREATED_REASON: &str = "Successful create ImagePullJob";
pub(super) const DELETED_REASON: &str = "Successful delete ImagePullJob";
pub(super) const CREATE_FAILED_REASON: &str = "FailedCreateImagePullJob";
pub(super) const DELETE_FAILED_REASON: &str = "FailedDeleteImagePullJob";

/// The key of `list`'s failures in the backoff.
pub(super) fn key(list: &ImageListPullJob) -> String {
    format!(
        "{}/{}",
        list.namespace().unwrap_or_default(),
        list.name_any()
    )
}

pub(super) fn error_policy(list: Arc<ImageListPullJob>, err: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.backoff.failed(&key(&list));
    warn!(list = %key(&list), error = %error_chain(err), retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

fn until(at: Timestamp) -> Duration {
    let wait = at.duration_since(Timestamp::now());
    Duration::try_from(wait)
        .unwrap_or(Duration::ZERO)
        .max(Duration::from_secs(1))
}

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    }
}

#[instrument(skip_all, fields(imagelistpulljob = %key(&list)))]
pub(super) async fn reconcile(
    list: Arc<ImageListPullJob>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    // An empty store would read as "no children": every image would get a second one.
    let mut ready = ctx.jobs_ready.clone();
    match tokio::time::timeout(CACHE_WAIT, ready.wait_for(|r| *r)).await {
        Ok(Ok(_)) => {}
        _ => return Err(Error::CachesNotReady),
    }
    ctx.pace.wait_turn(&key(&list)).await;
    let action = reconcile_list(&list, &ctx).await?;
    ctx.backoff.succeeded(&key(&list));
    Ok(action)
}

async fn reconcile_list(list: &ImageListPullJob, ctx: &Context) -> Result<Action, Error> {
    let name = list.name_any();
    let namespace = list.namespace().unwrap_or_default();
    let uid = list.metadata.uid.clone().unwrap_or_default();
    let lists: Api<ImageListPullJob> = Api::namespaced(ctx.client.clone(), &namespace);
    let jobs: Api<ImagePullJob> = Api::namespaced(ctx.client.clone(), &namespace);

    let hash = plan::template_hash(&list.spec.template);
    match plan::next_step(list) {
        Step::LetGo => {
            ctx.forget(&uid);
            return Ok(Action::await_change());
        }
        Step::Finished { expiry } => {
            set_label(&lists, &name, list, &hash)
                .await
                .map_err(|source| Error::Label {
                    name: name.clone(),
                    source,
                })?;
            return match expiry {
                Some(at) if at <= Timestamp::now() => {
                    info!(list = %key(list), "deleting the finished list: ttlSecondsAfterFinished passed");
                    let params = DeleteParams {
                        preconditions: Some(Preconditions {
                            uid: Some(uid.clone()),
                            resource_version: None,
                        }),
                        ..DeleteParams::background()
                    };
                    match lists.delete(&name, &params).await {
                        Ok(_) => {
                            ctx.forget(&uid);
                            Ok(Action::await_change())
                        }
                        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {
                            Ok(Action::await_change())
                        }
                        Err(source) => Err(Error::Delete { name, source }),
                    }
                }
                Some(at) => Ok(Action::requeue(until(at))),
                None => Ok(Action::await_change()),
            };
        }
        Step::Run => {}
    }
    set_label(&lists, &name, list, &hash)
        .await
        .map_err(|source| Error::Label {
            name: name.clone(),
            source,
        })?;

    let children = ctx.family(&uid);
    let plan = plan::plan(list, &children, &hash, &Time(Timestamp::now()));
    let mut first_error = None;

    // Deletions first: a replaced child goes before its successor starts pulling.
    if !plan.delete.is_empty() {
        let results = join_all(plan.delete.iter().map(|d| delete_child(&jobs, d))).await;
        let mut deleted = 0usize;
        for (doomed, result) in plan.delete.iter().zip(results) {
            match result {
                Ok(()) => {
                    ctx.deleted(&uid, &doomed.uid);
                    deleted += 1;
                }
                Err(source) => {
                    let err = Error::Child {
                        verb: "deleting",
                        name: doomed.name.clone(),
                        list: name.clone(),
                        source,
                    };
                    publish(
                        ctx,
                        list,
                        EventType::Warning,
                        DELETE_FAILED_REASON,
                        error_chain(&err),
                    )
                    .await;
                    first_error.get_or_insert(err);
                }
            }
        }
        if deleted > 0 {
            let note = format!("Delete {deleted} ImagePullJob");
            publish(ctx, list, EventType::Normal, DELETED_REASON, note).await;
        }
    }

    // Creations in slow-start batches (1, 2, 4, …); a batch with a failure ends them.
    let mut pending = plan.create.iter();
    let mut created = 0usize;
    'batches: for size in plan::slow_start_batches(plan.create.len()) {
        let batch: Vec<&String> = pending.by_ref().take(size).collect();
        let results = join_all(batch.iter().map(|image| {
            let child = plan::child(list, image, &hash);
            let jobs = jobs.clone();
            async move {
                let params = PostParams {
                    field_manager: Some(FIELD_MANAGER.to_owned()),
                    ..Default::default()
                };
                jobs.create(&params, &child).await
            }
        }))
        .await;
        let mut failed = false;
        for (image, result) in batch.into_iter().zip(results) {
            match result {
                Ok(job) => {
                    ctx.created(&uid, job);
                    created += 1;
                }
                Err(source) => {
                    failed = true;
                    let err = Error::Child {
                        verb: "creating",
                        name: format!("{name}-… for {image}"),
                        list: name.clone(),
                        source,
                    };
                    publish(
                        ctx,
                        list,
                        EventType::Warning,
                        CREATE_FAILED_REASON,
                        error_chain(&err),
                    )
                    .await;
                    first_error.get_or_insert(err);
                }
            }
        }
        if failed {
            break 'batches;
        }
    }
    if created > 0 {
        let note = format!("Create {created} ImagePullJob");
        publish(ctx, list, EventType::Normal, CREATED_REASON, note).await;
    }

    for child in &plan.relabel {
        let patch = serde_json::json!({"metadata": {"labels": {CONTROLLER_REVISION_HASH: hash}}});
        match jobs.patch(child, &params(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(source) => {
                first_error.get_or_insert(Error::Child {
                    verb: "relabelling",
                    name: child.clone(),
                    list: name.clone(),
                    source,
                });
            }
        }
    }

    write_status(&lists, list, &plan.status).await?;
    if let Some(err) = first_error {
        return Err(err);
    }
    // Just finished: come back when the TTL passes (the status event brings us back anyway).
    let mut now_list = list.clone();
    now_list.status = Some(plan.status);
    Ok(match plan::next_step(&now_list) {
        Step::Finished { expiry: Some(at) } => Action::requeue(until(at)),
        _ => Action::await_change(),
    })
}

/// Deletes a child, if it is still the one planned for (uid precondition). Gone already: fine.
async fn delete_child(jobs: &Api<ImagePullJob>, doomed: &Doomed) -> Result<(), kube::Error> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(doomed.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match jobs.delete(&doomed.name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Sets the list's `controller-revision-hash` label to `hash`, unless it has it already.
async fn set_label(
    lists: &Api<ImageListPullJob>,
    name: &str,
    list: &ImageListPullJob,
    hash: &str,
) -> Result<(), kube::Error> {
    if list
        .labels()
        .get(CONTROLLER_REVISION_HASH)
        .map(String::as_str)
        == Some(hash)
    {
        return Ok(());
    }
    let patch = serde_json::json!({"metadata": {"labels": {CONTROLLER_REVISION_HASH: hash}}});
    match lists.patch(name, &params(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Writes `status` unless it is what the list already has.
async fn write_status(
    lists: &Api<ImageListPullJob>,
    list: &ImageListPullJob,
    status: &ImageListPullJobStatus,
) -> Result<(), Error> {
    if list.status.as_ref() == Some(status) {
        return Ok(());
    }
    let name = list.name_any();
    // A merge patch leaves out what it does not mention: name every optional field, null when
    // empty, so an image that stopped failing really leaves `failedImageStatuses`.
    let mut fields = serde_json::to_value(status).unwrap_or_default();
    if let Some(map) = fields.as_object_mut() {
        for key in ["startTime", "completionTime", "failedImageStatuses"] {
            map.entry(key).or_insert(serde_json::Value::Null);
        }
    }
    let patch = serde_json::json!({ "status": fields });
    match lists
        .patch_status(&name, &params(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(Error::WriteStatus { name, source }),
    }
}

/// Publishes an event on the list; failing to is logged, never fatal.
async fn publish(
    ctx: &Context,
    list: &ImageListPullJob,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(err) = ctx.recorder.publish(&event, &list.object_ref(&())).await {
        warn!(list = %key(list), error = %err, "cannot publish an event");
    }
}
