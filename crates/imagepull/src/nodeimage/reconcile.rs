//! The two reconcilers: fetch from the stores, decide with [`plan`](super::plan), write the result.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, ObjectReference};

use crate::node_summary::NodeSummary;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams, Preconditions};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use tracing::instrument;
use tracing::{debug, info, warn};

use super::plan::{self, FailedTag, Lifecycle};
use super::{Context, FIELD_MANAGER, patches};
use crate::compact_nodeimage::NodeImageSpec;
use crate::lean_nodeimage::LeanNodeImage;
use crate::nodeimage_write::{ImagesWriteError, update_images};
use crate::tag_values::stored_owner_ask;
use kruise_rs_api::image::joined_ref;
use kruise_rs_api::imagepulljob::ImagePullJob;
use kruise_rs_api::nodeimage::NodeImage;
use kruise_rs_kube::backoff::jittered;
use kruise_rs_kube::error_chain::error_chain;

/// How often a refused status patch is re-read and retried within one reconcile.
const STATUS_ATTEMPTS: usize = 5;

/// Why a reconcile failed; the error policy retries it with backoff.
#[derive(Debug, thiserror::Error)]
pub(super) enum Error {
    #[error("creating NodeImage {name}")]
    Create {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting NodeImage {name}")]
    Delete {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("checking whether Node {name} still exists")]
    GetNode {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("setting the labels of NodeImage {name}")]
    Labels {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("collecting the images of NodeImage {name}")]
    Images {
        name: String,
        #[source]
        source: ImagesWriteError,
    },
    #[error("writing the status of NodeImage {name}")]
    Status {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "NodeImage {name}'s status kept changing under us; gave up after {STATUS_ATTEMPTS} attempts"
    )]
    StatusConflicts { name: String },
}

fn api_code(err: &kube::Error) -> Option<u16> {
    match err {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    }
}

// --- Node applier -------------------------------------------------------------------------------

/// Creates the Node's NodeImage once it is wanted, or requeues at the instant it will be.
#[instrument(skip_all, fields(node = %node.name_any()))]
pub(super) async fn node(node: Arc<NodeSummary>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.stores_ready().await;
    let name = node.name_any();
    let now = Timestamp::now();
    let existing = ctx.nodeimage_store.get(&ObjectRef::new(&name));
    let action = match plan::lifecycle(Some(&node), existing.as_deref(), ctx.creation_delay, now) {
        Lifecycle::CreateAt(at) => {
            let wait = Duration::try_from(now.duration_until(at)).unwrap_or(Duration::ZERO);
            debug!(node = %name, ?wait, "NodeImage wanted once the node has been Ready long enough");
            Action::requeue(wait.clamp(Duration::from_millis(10), plan::MAX_REQUEUE))
        }
        Lifecycle::Create(labels) => {
            create(&ctx, &name, labels).await?;
            Action::await_change()
        }
        // The rest is the NodeImage applier's.
        _ => Action::await_change(),
    };
    ctx.backoff.succeeded(&node_key(&name));
    Ok(action)
}

async fn create(
    ctx: &Context,
    name: &str,
    labels: std::collections::BTreeMap<String, String>,
) -> Result<(), Error> {
    let nodeimage: LeanNodeImage = NodeImage {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: Default::default(),
        status: None,
    }
    .into();
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    };
    match ctx.nodeimages.create(&params, &nodeimage).await {
        Ok(_) => info!(nodeimage = %name, "created NodeImage"),
        // Created meanwhile (our store lagged, or another manager was first): just as good.
        Err(err) if api_code(&err) == Some(409) => {
            debug!(nodeimage = %name, "NodeImage exists already")
        }
        Err(source) => {
            return Err(Error::Create {
                name: name.to_owned(),
                source,
            });
        }
    }
    Ok(())
}

/// Where Node keys start in the backoff.
pub(super) const NODE_KEY_SCOPE: &str = "node/";
/// Where NodeImage keys start in the backoff.
pub(super) const NODEIMAGE_KEY_SCOPE: &str = "nodeimage/";

/// The key of Node `name`'s failures in the backoff.
pub(super) fn node_key(name: &str) -> String {
    format!("{NODE_KEY_SCOPE}{name}")
}

/// The key of NodeImage `name`'s failures in the backoff.
pub(super) fn nodeimage_key(name: &str) -> String {
    format!("{NODEIMAGE_KEY_SCOPE}{name}")
}

pub(super) fn node_error_policy(node: Arc<NodeSummary>, err: &Error, ctx: Arc<Context>) -> Action {
    let name = node.name_any();
    let wait = ctx.backoff.failed(&node_key(&name));
    warn!(node = %name, error = %error_chain(err), ?wait, "reconcile failed; retrying");
    Action::requeue(wait)
}

// --- NodeImage applier --------------------------------------------------------------------------

/// Deletes a NodeImage without a Node, syncs its labels, collects its images and times out its
/// unanswered tags; requeues at the next instant one of those would change.
#[instrument(skip_all, fields(nodeimage = %nodeimage.name_any()))]
pub(super) async fn nodeimage(
    nodeimage: Arc<LeanNodeImage>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    ctx.stores_ready().await;
    let name = nodeimage.name_any();
    let now = Timestamp::now();
    let node = ctx.nodes.get(&ObjectRef::new(&name));
    let action = match plan::lifecycle(node.as_deref(), Some(&nodeimage), ctx.creation_delay, now) {
        Lifecycle::Deleting => Action::await_change(),
        Lifecycle::Delete => {
            delete(&ctx, &nodeimage, node.is_some()).await?;
            Action::await_change()
        }
        Lifecycle::Keep { labels } => {
            if let Some(labels) = labels {
                sync_labels(&ctx, &nodeimage, &labels).await?;
            }
            match maintain(&ctx, (*nodeimage).clone(), now).await? {
                Some(current) => {
                    let wake = plan::next_wake(&current, now, ctx.response_timeout);
                    let after = plan::requeue_after(wake, now);
                    // A deadline is kept exactly; the hourly look is spread out, or every
                    // NodeImage created in one fan-out would be looked at in the same second.
                    if after == plan::MAX_REQUEUE {
                        Action::requeue(jittered(after, 0.1))
                    } else {
                        Action::requeue(after)
                    }
                }
                None => Action::await_change(),
            }
        }
        // Not reachable with a NodeImage in hand; nothing to do either way.
        Lifecycle::Absent | Lifecycle::CreateAt(_) | Lifecycle::Create(_) => Action::await_change(),
    };
    ctx.backoff.succeeded(&nodeimage_key(&name));
    Ok(action)
}

pub(super) fn nodeimage_error_policy(
    nodeimage: Arc<LeanNodeImage>,
    err: &Error,
    ctx: Arc<Context>,
) -> Action {
    let name = nodeimage.name_any();
    let wait = ctx.backoff.failed(&nodeimage_key(&name));
    warn!(nodeimage = %name, error = %error_chain(err), ?wait, "reconcile failed; retrying");
    Action::requeue(wait)
}

/// Deletes a NodeImage whose Node is gone or going. When the Node store has no such Node, a GET
/// confirms it first: the store may not have seen a Node created a moment ago.
async fn delete(
    ctx: &Context,
    nodeimage: &LeanNodeImage,
    node_in_store: bool,
) -> Result<(), Error> {
    let name = nodeimage.name_any();
    if !node_in_store {
        let nodes: Api<PartialObjectMeta<Node>> = Api::all(ctx.client.clone());
        match nodes.get_opt(&name).await {
            Ok(Some(node)) if node.metadata.deletion_timestamp.is_none() => {
                debug!(nodeimage = %name, "its Node exists after all (not in our store yet, or out of scope)");
                return Ok(());
            }
            Ok(_) => {}
            Err(source) => return Err(Error::GetNode { name, source }),
        }
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: nodeimage.uid(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match ctx.nodeimages.delete(&name, &params).await {
        Ok(_) => info!(nodeimage = %name, "deleted NodeImage: its Node is gone"),
        // Gone already, or replaced by a new one (uid precondition): not ours to delete.
        Err(err) if matches!(api_code(&err), Some(404 | 409)) => {}
        Err(source) => return Err(Error::Delete { name, source }),
    }
    Ok(())
}

async fn sync_labels(
    ctx: &Context,
    nodeimage: &LeanNodeImage,
    labels: &std::collections::BTreeMap<String, String>,
) -> Result<(), Error> {
    let name = nodeimage.name_any();
    let Some(patch) = patches::labels_patch(&nodeimage.labels().to_map(), labels) else {
        return Ok(());
    };
    match ctx
        .nodeimages
        .patch(&name, &params(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            info!(nodeimage = %name, "labels set to the Node's");
            Ok(())
        }
        Err(err) if api_code(&err) == Some(404) => Ok(()),
        Err(source) => Err(Error::Labels { name, source }),
    }
}

/// Garbage-collects the spec, then times out the status; returns the object as last written or
/// read, or `None` when it vanished meanwhile.
async fn maintain(
    ctx: &Context,
    current: LeanNodeImage,
    now: Timestamp,
) -> Result<Option<LeanNodeImage>, Error> {
    let Some(current) = collect_garbage(ctx, current, now).await? else {
        return Ok(None);
    };
    time_out(ctx, current, now).await
}

/// The uids of the ImagePullJobs owning tags in `spec` that are known to be gone: missing from
/// the job store (or there with another uid) and confirmed by a GET answering 404 or another
/// uid. A job that cannot be checked is not listed, so its tags stay.
async fn gone_jobs(ctx: &Context, spec: &NodeImageSpec) -> BTreeSet<String> {
    let mut gone = BTreeSet::new();
    for owner in plan::job_owners(spec) {
        let (Some(uid), Some(name), Some(namespace)) = (
            owner.uid.as_deref(),
            owner.name.as_deref(),
            owner.namespace.as_deref(),
        ) else {
            continue;
        };
        let cached = ctx.jobs.get(&ObjectRef::new(name).within(namespace));
        if cached.is_some_and(|job| job.uid().as_deref() == Some(uid)) {
            continue;
        }
        let jobs: Api<PartialObjectMeta<ImagePullJob>> =
            Api::namespaced(ctx.client.clone(), namespace);
        match jobs.get_opt(name).await {
            Ok(Some(job)) if job.uid().as_deref() == Some(uid) => {}
            Ok(_) => {
                gone.insert(uid.to_owned());
            }
            Err(err) => warn!(
                job = %format!("{namespace}/{name}"), error = %error_chain(&err),
                "cannot check whether an owner job exists; keeping its tags for now"
            ),
        }
    }
    gone
}

async fn collect_garbage(
    ctx: &Context,
    current: LeanNodeImage,
    now: Timestamp,
) -> Result<Option<LeanNodeImage>, Error> {
    let name = current.name_any();
    let gone = gone_jobs(ctx, &current.spec).await;
    let ask = |owner: &ObjectReference| {
        let gone_now = owner.uid.as_ref().is_some_and(|uid| gone.contains(uid));
        if gone_now {
            return None;
        }
        stored_owner_ask(
            &ctx.jobs,
            owner,
            &name,
            ctx.extra_ttl,
            &ctx.daemon_config_namespace,
        )
    };
    let decide = |ni: &LeanNodeImage| {
        let status = ni.status.clone().unwrap_or_default();
        let collected = plan::collect(&ni.spec, &status, &gone, ask, now);
        (collected.images != ni.spec.images).then_some(collected.images)
    };
    if decide(&current).is_none() {
        return Ok(Some(current));
    }
    let before = tag_names(&current.spec);
    match update_images(&ctx.nodeimages, FIELD_MANAGER, current.clone(), decide).await {
        Ok(Some(written)) => {
            let after = tag_names(&written.spec);
            let removed: Vec<_> = before.difference(&after).collect();
            info!(nodeimage = %name, ?removed, gone_jobs = ?gone, "collected tags");
            Ok(Some(written))
        }
        Ok(None) => Ok(Some(current)),
        Err(ImagesWriteError::NotFound { .. }) => Ok(None),
        Err(source) => Err(Error::Images { name, source }),
    }
}

fn tag_names(spec: &NodeImageSpec) -> BTreeSet<String> {
    spec.images
        .iter()
        .flat_map(|(image, s)| s.tags.iter().map(move |t| joined_ref(image, &t.tag)))
        .collect()
}

/// Marks timed-out tags Failed with a guarded status patch, re-reading and deciding again when
/// the daemon wrote meanwhile; then publishes the events.
async fn time_out(
    ctx: &Context,
    mut current: LeanNodeImage,
    now: Timestamp,
) -> Result<Option<LeanNodeImage>, Error> {
    let name = current.name_any();
    let status_err = |source| Error::Status {
        name: name.clone(),
        source,
    };
    let mut whole = false;
    for _ in 0..STATUS_ATTEMPTS {
        let old = current.status.clone().unwrap_or_default();
        let decision = plan::timeouts(&current.spec, &old, now, ctx.response_timeout);
        let Some(new) = decision.status else {
            return Ok(Some(current));
        };
        let rv = current.resource_version();
        let Some(patch) = patches::status_patch(&old, rv.as_deref(), &new, whole) else {
            return Ok(Some(current));
        };
        let refused = match ctx
            .nodeimages
            .patch_status(&name, &params(), &Patch::Json::<()>(patch))
            .await
        {
            Ok(written) => {
                for failed in &decision.failed {
                    warn!(nodeimage = %name, image = %failed.image, tag = %failed.tag, message = %failed.message, "marked tag Failed");
                }
                publish(ctx, &written, &decision.failed).await;
                return Ok(Some(written));
            }
            Err(err) => err,
        };
        let code = api_code(&refused);
        match code {
            Some(404) => return Ok(None),
            Some(409 | 422) => {}
            _ => return Err(status_err(refused)),
        }
        let fresh = match ctx.nodeimages.get_opt(&name).await {
            Ok(Some(fresh)) => fresh,
            Ok(None) => return Ok(None),
            Err(source) => return Err(status_err(source)),
        };
        // Refused although nothing changed: the stored JSON differs from ours in form only.
        whole = code == Some(422) && fresh.resource_version() == rv;
        debug!(nodeimage = %name, whole, "status patch refused; deciding again");
        current = fresh;
    }
    Err(Error::StatusConflicts { name })
}

/// A Warning `PullImageFailed` for each failed tag, on each of its owners and on the NodeImage.
/// Failures to publish are logged: the status, which matters, is written already.
async fn publish(ctx: &Context, nodeimage: &LeanNodeImage, failed: &[FailedTag]) {
    let node = nodeimage.name_any();
    let this = nodeimage.object_ref(&());
    for tag in failed {
        let note = tag.note(&node);
        let event = |secondary: Option<ObjectReference>| Event {
            type_: EventType::Warning,
            reason: "PullImageFailed".into(),
            note: Some(note.clone()),
            action: "PullImage".into(),
            secondary,
        };
        // On each job the related object names the node; on the NodeImage, the job.
        for owner in &tag.owners {
            if let Err(err) = ctx
                .recorder
                .publish(&event(Some(this.clone())), owner)
                .await
            {
                warn!(nodeimage = %node, owner = ?owner.name, error = %error_chain(&err), "cannot publish event");
            }
        }
        if let Err(err) = ctx
            .recorder
            .publish(&event(tag.owners.first().map(|o| (**o).clone())), &this)
            .await
        {
            warn!(nodeimage = %node, error = %error_chain(&err), "cannot publish event");
        }
    }
}
