//! The ImagePullJob reconcile: fetch (the stores, the job's secrets), plan ([`super::plan`]),
//! write (NodeImage entries, started in target order, a few at a time; the job's status,
//! finalizer and events).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use tracing::{info, instrument, warn};

use super::entry::{JobRequest, with_job_entry};
use super::plan::{self, Step};
use super::status::{compute_status, next_deadline, nodes_to_start, with_notes};
use super::targets::{NodeState, Target};
use super::{Context, Error, FIELD_MANAGER, registry_budget, secrets};
use crate::lean_nodeimage;
use crate::nodeimage_write::{ImagesWriteError, update_images};
use crate::tag_values::stored_owner_ask;
use kruise_rs_api::imagepulljob::{ImagePullJob, ImagePullJobStatus};
use kruise_rs_api::pull_secret_pins::{self, Pins};
use kruise_rs_api::well_known::{DELETION_PROTECTION_FINALIZER, PULL_SECRET_UIDS};
use kruise_rs_kube::error_chain::error_chain;

/// How long a reconcile waits for the first lists of NodeImages and Pods.
const CACHE_WAIT: Duration = Duration::from_secs(10);

/// How many NodeImage writes of one reconcile are under way at once. One at a time, the writes
/// left the apiserver idle between them (a 5,000-node fan-out took as long as a plain client's
/// writes); 8 kept it busy on the benches' 2 cores (decision 0042).
const WRITES_IN_FLIGHT: usize = 8;

/// The key of `job`'s failures in the backoff.
pub(super) fn key(job: &ImagePullJob) -> String {
    format!("{}/{}", job.namespace().unwrap_or_default(), job.name_any())
}

pub(super) fn error_policy(job: Arc<ImagePullJob>, err: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.backoff.failed(&key(&job));
    warn!(job = %key(&job), error = %error_chain(err), retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

fn now() -> Time {
    Time(Timestamp::now())
}

/// How often a running job holding pull-secret copies reads its sources again, so a rotated
/// credential reaches the daemons' copy within this: the manager lists and watches no Secrets
/// (it may only `get` them by name), where upstream's watch of every Secret answers at once.
const SOURCE_RECHECK: Duration = Duration::from_secs(5);

/// How often a job with nodes pulling reads their progress again (`status.progress`): the
/// daemons' progress reports do not wake it (nodeimage_changes.rs), so that a cluster of pulling
/// nodes costs each job one reconcile per period rather than one per report.
pub(super) const PROGRESS_REFRESH: Duration = Duration::from_secs(5);

/// When to reconcile a job again by itself: at its next deadline, and no later than
/// [`SOURCE_RECHECK`] while it runs holding copies of pull secrets.
fn next_wake(deadline: Option<Duration>, running_with_copies: bool) -> Option<Duration> {
    let recheck = running_with_copies.then_some(SOURCE_RECHECK);
    match (deadline, recheck) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn until(at: Timestamp) -> Duration {
    let now = Timestamp::now();
    let wait = at.duration_since(now);
    Duration::try_from(wait)
        .unwrap_or(Duration::ZERO)
        .max(Duration::from_secs(1))
}

#[instrument(skip_all, fields(imagepulljob = %key(&job)))]
pub(super) async fn reconcile(job: Arc<ImagePullJob>, ctx: Arc<Context>) -> Result<Action, Error> {
    // An empty store would read as "no nodes": an Always job would complete at once. Bounded,
    // so a shutdown never waits on a cache that will not fill.
    let mut ready = ctx.caches_ready.clone();
    match tokio::time::timeout(CACHE_WAIT, ready.wait_for(|r| *r)).await {
        Ok(Ok(_)) => {}
        _ => return Err(Error::CachesNotReady),
    }
    ctx.pace.wait_turn(&key(&job)).await;
    let action = reconcile_job(&job, &ctx).await;
    ctx.forget_caught_up();
    let action = action?;
    ctx.backoff.succeeded(&key(&job));
    Ok(action)
}

async fn reconcile_job(job: &ImagePullJob, ctx: &Context) -> Result<Action, Error> {
    let name = job.name_any();
    let namespace = job.namespace().unwrap_or_default();
    let jobs: Api<ImagePullJob> = Api::namespaced(ctx.client.clone(), &namespace);
    let daemon_ns = ctx.opts.daemon_config_namespace.as_str();

    let (image, parallelism) = match plan::next_step(job) {
        Step::LetGo => {
            ctx.refreshed(job, None);
            let_go(ctx, &jobs, job).await?;
            return Ok(Action::await_change());
        }
        Step::Finished { expiry } => {
            ctx.refreshed(job, None);
            let_go(ctx, &jobs, job).await?;
            return match expiry {
                Some(expiry) if expiry <= Timestamp::now() => {
                    info!(job = %key(job), "deleting the finished job: ttlSecondsAfterFinished passed");
                    match jobs.delete(&name, &DeleteParams::background()).await {
                        Ok(_) => Ok(Action::await_change()),
                        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Action::await_change()),
                        Err(source) => Err(Error::Delete { name, source }),
                    }
                }
                Some(expiry) => Ok(Action::requeue(until(expiry))),
                None => Ok(Action::await_change()),
            };
        }
        Step::Refuse { reason, message } => return refuse(job, ctx, &jobs, reason, message).await,
        Step::Run { image, parallelism } => (image, parallelism),
    };

    // Earlier versions kept a job with pull secrets from vanishing before its copies were
    // released; nothing needs that now (decision 0030). The write's event brings the job back
    // with the resourceVersion the pin write below is guarded by.
    if has_old_finalizer(job) {
        drop_old_finalizer(&jobs, job).await?;
        return Ok(Action::await_change());
    }
    // The daemons may read secrets only in their own namespace: copy the job's there.
    let (pull_secrets, notes) = if job.spec.template.pull_secrets.is_empty() {
        (Vec::new(), Vec::new())
    } else {
        let sources =
            secrets::read_sources(&ctx.client, &namespace, &job.spec.template.pull_secrets).await?;
        // Each Secret is pinned (by uid) to the job before its first copy: later a Secret of
        // that name is copied only if it is the same one (decision 0029).
        let (pins, unreadable) = match pull_secret_pins::of(job.annotations()) {
            Ok(pins) => (pins, None),
            Err(error) => (
                Pins::new(),
                Some(secrets::Problem::PinsUnreadable { error }),
            ),
        };
        let added = match (&unreadable, namespace == daemon_ns) {
            (None, false) => secrets::pins_to_add(&pins, &sources),
            _ => None,
        };
        if let Some(added) = &added
            && !write_pins(&jobs, job, added).await?
        {
            // Gone: a copy made now would list a job that no longer exists.
            return Ok(Action::await_change());
        }
        let claimed = secrets::claim(
            &ctx.client,
            daemon_ns,
            &namespace,
            &name,
            &sources,
            added.as_ref().unwrap_or(&pins),
        )
        .await?;
        if claimed.added_reference && !still_exists(&jobs, job).await? {
            // Deleted while its copies were claimed: the sweep its deletion made may have run
            // before this reference was written.
            secrets::release(&ctx.client, daemon_ns, &namespace, &name).await?;
            return Ok(Action::await_change());
        }
        // Each Secret left out: a Warning event, and the reason in the status message.
        let mut notes = Vec::with_capacity(claimed.problems.len() + 1);
        for problem in unreadable.into_iter().chain(claimed.problems) {
            let note = problem.to_string();
            publish(ctx, job, EventType::Warning, problem.reason(), note.clone()).await;
            notes.push(note);
        }
        (claimed.refs, notes)
    };

    // Under a registry budget, the jobs of this registry count and write one at a time, from
    // here to the last write (registry_budget.rs).
    let budget = match registry_budget::budget_for(job, ctx.opts.max_pulls_per_registry) {
        Ok(budget) => budget,
        Err(message) => return refuse(job, ctx, &jobs, "InvalidAnnotation", message).await,
    };
    let host = image.registry().to_owned();
    let turn = match budget {
        Some(_) => Some(ctx.host_locks.lock(&host).await),
        None => None,
    };
    // Our own writes the store has not caught up with yet count as written.
    let fresh = ctx.fresh_nodeimages();
    let in_flight = budget.map(|_| registry_budget::in_flight(fresh.iter().map(|n| &**n), &host));
    let by_name = plan::by_name(fresh);
    let pods = ctx.pods.state();
    let holds_copies = !pull_secrets.is_empty();
    let req = JobRequest::new(
        job,
        image.familiar_name().to_owned(),
        image.nodeimage_tag().to_owned(),
        pull_secrets,
    );
    let mut targets: Vec<Target> =
        match plan::targets(job, &req, &by_name, pods.iter().map(|p| &**p)) {
            Ok(targets) => targets,
            Err(err) => return refuse(job, ctx, &jobs, "InvalidSelector", err.to_string()).await,
        };

    // Start the next nodes, within the parallelism and the registry's budget; after a spec change
    // (and once after the manager starts), bring the nodes already written up to date too (#2221).
    let pulling = targets
        .iter()
        .filter(|t| t.state == NodeState::Pulling)
        .count();
    let room = parallelism.saturating_sub(pulling);
    let allowed = registry_budget::starts_allowed(room, budget, in_flight.unwrap_or(0));
    let waiting = targets
        .iter()
        .filter(|t| t.state == NodeState::NotSynced)
        .count();
    let held_by_budget = allowed < room.min(waiting);
    let start: HashSet<&str> = nodes_to_start(&targets, pulling + allowed)
        .into_iter()
        .collect();
    let generation = job.metadata.generation.unwrap_or_default();
    let refresh_all = ctx.refreshed_generation(job) != Some(generation);
    // Positions in `targets`, ascending (8 bytes a node where names took 24 and their text).
    let write: Vec<usize> = targets
        .iter()
        .enumerate()
        .filter(|(_, t)| {
            start.contains(&t.node.as_str()) || (refresh_all && t.state != NodeState::NotSynced)
        })
        .map(|(i, _)| i)
        .collect();
    drop(start);
    let api = lean_nodeimage::api(ctx.client.clone());
    let now_time = now();
    let extra_ttl = ctx.opts.default_ttl_for_always_nodeimage;
    // Started in target order, a few at a time: the order of the writes is the order in which
    // nodes start pulling, which is the point of keeping the order at all (a node may start up
    // to WRITES_IN_FLIGHT - 1 places early).
    // Each write starts from the stored NodeImage as it is then, not from the snapshot planned
    // from: the snapshot goes first, so that a fan-out over thousands of nodes does not hold
    // every NodeImage's old version while the store fills with new ones.
    drop(by_name);
    drop(pods);
    // Each result is applied as it comes: a fan-out's thousands of them, kept until the loop
    // ended, took 112 bytes a node (heaptrack).
    let mut gone = Vec::new();
    let mut first_error = None;
    // Nodes whose NodeImage refused the entry by its schema (most often: already 256 images):
    // not retried until the NodeImage changes, which wakes this job again.
    let mut refused = Vec::new();
    // Positions started, applied to `targets` once the writes, which read it, are done.
    let mut started = Vec::new();
    {
        let targets = &targets;
        let writes = futures::stream::iter(write)
            .map(|i| {
                let node = targets[i].node.clone();
                let api = &api;
                let req = &req;
                let now_time = &now_time;
                async move {
                    let result = match ctx.fresh_nodeimage(&node) {
                        None => Err(ImagesWriteError::NotFound { name: node.clone() }),
                        Some(current) => {
                            let current = (*current).clone();
                            let others = |owner: &ObjectReference| {
                                stored_owner_ask(&ctx.jobs, owner, &node, extra_ttl, daemon_ns)
                            };
                            update_images(api, FIELD_MANAGER, current, |ni| {
                                with_job_entry(
                                    &ni.spec.images,
                                    ni.status.as_ref(),
                                    req,
                                    others,
                                    &node,
                                    now_time,
                                    extra_ttl,
                                )
                            })
                            .await
                            .map(|written| written.map(|written| ctx.remember(written)))
                        }
                    };
                    (i, node, result)
                }
            })
            // Started in target order, WRITES_IN_FLIGHT at a time, and their results taken in
            // the same order.
            .buffered(WRITES_IN_FLIGHT);
        let mut writes = std::pin::pin!(writes);
        while let Some((i, node, result)) = writes.next().await {
            match result {
                Ok(_) => started.push(i),
                // The node went away meanwhile: it is no target any more.
                Err(ImagesWriteError::NotFound { .. }) => gone.push(i),
                Err(ImagesWriteError::Invalid { message, .. }) => refused.push((node, message)),
                Err(err) => {
                    warn!(job = %key(job), node, error = %err, "cannot start the pull on a node");
                    first_error.get_or_insert(err);
                }
            }
        }
    }
    for i in started {
        if targets[i].state == NodeState::NotSynced {
            targets[i].state = NodeState::Pulling;
        }
    }
    // The writes are done: the next job of this registry may count.
    drop(turn);
    // `gone` is ascending, as `write` was.
    let mut position = 0;
    targets.retain(|_| {
        let keep = gone.binary_search(&position).is_err();
        position += 1;
        keep
    });

    if first_error.is_none() {
        ctx.refreshed(job, Some(generation));
    }
    let mut notes = notes;
    // Without the count under way, which changes on every look: the status is written when
    // it says something new.
    if held_by_budget && let Some(budget) = budget {
        notes.push(format!(
            "waiting for room at {host}: at most {budget} pulls from it at once"
        ));
    }
    if let Some(note) = refused_note(&req.name, &refused) {
        publish(
            ctx,
            job,
            EventType::Warning,
            "NodeImageRefused",
            note.clone(),
        )
        .await;
        notes.push(note);
    }
    let status = with_notes(compute_status(job, &targets, &now_time), &notes);
    write_status(&jobs, job, &status).await?;
    if let Some(err) = first_error {
        return Err(err.into());
    }
    let running = status.completion_time.is_none();
    // The room comes from other jobs' nodes finishing, whose events do not wake this job.
    let held = (running && held_by_budget).then_some(registry_budget::HELD_RETRY);
    // Reports of progress alone wake no job (nodeimage_changes.rs): read them again meanwhile.
    let pulling = running && targets.iter().any(|t| t.state == NodeState::Pulling);
    Ok(
        match [
            next_wake(
                next_deadline(job, &status).map(until),
                running && holds_copies,
            ),
            held,
            pulling.then_some(PROGRESS_REFRESH),
        ]
        .into_iter()
        .flatten()
        .min()
        {
            Some(wait) => Action::requeue(wait),
            None => Action::await_change(),
        },
    )
}

/// What to tell the job's author about the nodes whose NodeImage refused its entry.
fn refused_note(image: &str, refused: &[(String, String)]) -> Option<String> {
    let (node, message) = refused.first()?;
    let others = match refused.len() {
        1 => String::new(),
        n => format!(" (and {} other nodes)", n - 1),
    };
    // The schema's own words name the limit (`spec.images: Too many: 257: must have at most
    // 256 items`).
    Some(format!(
        "NodeImage {node}{others} cannot take {image}: {message}; tried again when that \
         NodeImage changes (other jobs' entries expiring)"
    ))
}

/// Writes `status` unless it is what the job already has.
async fn write_status(
    jobs: &Api<ImagePullJob>,
    job: &ImagePullJob,
    status: &ImagePullJobStatus,
) -> Result<(), Error> {
    if job.status.as_ref() == Some(status) {
        return Ok(());
    }
    let name = job.name_any();
    // A merge patch leaves out what it does not mention: name every field, null for the empty
    // ones, so a node that left `failedNodes` or a cleared message really goes.
    let mut fields = serde_json::to_value(status).expect("a status always serializes");
    if let Some(map) = fields.as_object_mut() {
        for key in ["startTime", "completionTime", "message", "failedNodes"] {
            map.entry(key).or_insert(serde_json::Value::Null);
        }
    }
    let patch = serde_json::json!({ "status": fields });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    };
    jobs.patch_status(&name, &params, &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(|source| Error::WriteStatus { name, source })
}

/// A job that cannot run as written: a Warning event and the reason in `status.message`, then
/// nothing until the job changes.
async fn refuse(
    job: &ImagePullJob,
    ctx: &Context,
    jobs: &Api<ImagePullJob>,
    reason: &str,
    message: String,
) -> Result<Action, Error> {
    warn!(job = %key(job), reason, %message, "job cannot run");
    publish(ctx, job, EventType::Warning, reason, message.clone()).await;
    let mut status = job.status.clone().unwrap_or_default();
    status.message = Some(message);
    write_status(jobs, job, &status).await?;
    Ok(Action::await_change())
}

/// A job done pulling (finished or being deleted) releases its secret copies, then drops the
/// finalizer earlier versions put on it.
async fn let_go(ctx: &Context, jobs: &Api<ImagePullJob>, job: &ImagePullJob) -> Result<(), Error> {
    // A finished job is reconciled on every change of the NodeImages it owns: it releases once
    // per manager start (and whenever it still carries the old finalizer), not on each.
    let old_finalizer = has_old_finalizer(job);
    let wants_release = !job.spec.template.pull_secrets.is_empty() && !ctx.was_released(job);
    if !old_finalizer && !wants_release {
        return Ok(());
    }
    let namespace = job.namespace().unwrap_or_default();
    let daemon_ns = &ctx.opts.daemon_config_namespace;
    secrets::release(&ctx.client, daemon_ns, &namespace, &job.name_any()).await?;
    ctx.released(job);
    drop_old_finalizer(jobs, job).await.map(|_| ())
}

/// Publishes an event on the job; failing to is logged, never fatal.
async fn publish(ctx: &Context, job: &ImagePullJob, type_: EventType, reason: &str, note: String) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(err) = ctx.recorder.publish(&event, &job.object_ref(&())).await {
        warn!(job = %key(job), error = %err, "cannot publish an event");
    }
}

fn has_old_finalizer(job: &ImagePullJob) -> bool {
    job.finalizers()
        .iter()
        .any(|f| f == DELETION_PROTECTION_FINALIZER)
}

/// Removes upstream's `apps.kruise.io/deletion-protection` finalizer, which earlier versions put
/// on jobs with pull secrets, guarded by the job's resourceVersion so a concurrent change to the
/// list is never overwritten. `false`: the job is gone.
async fn drop_old_finalizer(jobs: &Api<ImagePullJob>, job: &ImagePullJob) -> Result<bool, Error> {
    if !has_old_finalizer(job) {
        return Ok(true);
    }
    let finalizers: Vec<&String> = job
        .finalizers()
        .iter()
        .filter(|f| *f != DELETION_PROTECTION_FINALIZER)
        .collect();
    patch_metadata(jobs, job, serde_json::json!({ "finalizers": finalizers })).await
}

/// Before the job's first copy of a Secret: `pins` in the job's pin annotation (decision 0029).
/// `false`: the job is gone.
async fn write_pins(
    jobs: &Api<ImagePullJob>,
    job: &ImagePullJob,
    pins: &Pins,
) -> Result<bool, Error> {
    let annotations = serde_json::json!({ PULL_SECRET_UIDS: pull_secret_pins::render(pins) });
    patch_metadata(jobs, job, serde_json::json!({ "annotations": annotations })).await
}

/// Merges `metadata` into the job's, guarded by its resourceVersion so a concurrent change is
/// never overwritten. `false`: the job is gone.
async fn patch_metadata(
    jobs: &Api<ImagePullJob>,
    job: &ImagePullJob,
    mut metadata: serde_json::Value,
) -> Result<bool, Error> {
    metadata["resourceVersion"] = serde_json::json!(job.resource_version());
    let patch = serde_json::json!({ "metadata": metadata });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    };
    match jobs
        .patch(&job.name_any(), &params, &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(source) => Err(Error::Metadata {
            name: job.name_any(),
            source,
        }),
    }
}

/// Whether `job` (this very object: same uid) still exists and is not being deleted.
async fn still_exists(jobs: &Api<ImagePullJob>, job: &ImagePullJob) -> Result<bool, Error> {
    match jobs.get_metadata_opt(&job.name_any()).await {
        Ok(found) => Ok(found.is_some_and(|found| {
            found.metadata.uid == job.metadata.uid && found.metadata.deletion_timestamp.is_none()
        })),
        Err(source) => Err(Error::Read {
            name: job.name_any(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_job_with_copies_wakes_by_the_source_recheck_at_the_latest() {
        let long = Duration::from_secs(600);
        let short = Duration::from_secs(2);
        assert_eq!(next_wake(None, false), None);
        assert_eq!(next_wake(Some(long), false), Some(long));
        assert_eq!(next_wake(None, true), Some(SOURCE_RECHECK));
        assert_eq!(next_wake(Some(long), true), Some(SOURCE_RECHECK));
        assert_eq!(next_wake(Some(short), true), Some(short));
    }
}
