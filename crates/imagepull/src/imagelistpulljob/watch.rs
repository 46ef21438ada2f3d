//! The ImageListPullJob controller's watches: the lists, and every ImagePullJob (stored, managed
//! fields stripped), a change of which wakes the list that controls it.

use std::future::Future;
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use kube::api::Api;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::watch;
use tracing::warn;

use super::plan::KIND;
use super::reconcile::{error_policy, key, reconcile};
use super::{Context, NAME};
use kruise_rs_api::imagelistpulljob::ImageListPullJob;
use kruise_rs_api::imagepulljob::ImagePullJob;
use kruise_rs_api::well_known::GROUP;
use kruise_rs_controller::ControllerOptions;
use kruise_rs_controller::shutdown::run_until_shutdown;
use kruise_rs_kube::backoff::{self, Backoff};
use kruise_rs_kube::events::Recorder;

/// The list that controls `job`, if one does.
fn list_of(job: &ImagePullJob) -> Option<ObjectRef<ImageListPullJob>> {
    let owner = job.owner_references().iter().find(|o| {
        o.controller == Some(true)
            && o.kind == KIND
            && o.api_version.split('/').next() == Some(GROUP)
    })?;
    Some(ObjectRef::new(&owner.name).within(&job.namespace()?))
}

/// What the store keeps of an ImagePullJob: no managed fields, and of a job no list controls
/// (the SidecarSet's, the users') only its metadata: no decision here reads more of it.
fn strip(job: &mut ImagePullJob) {
    job.managed_fields_mut().clear();
    if list_of(job).is_none() {
        job.spec = Default::default();
        job.status = None;
    }
}

/// Runs the ImageListPullJob controller until `shutdown` resolves.
pub async fn run(
    client: Client,
    opts: ControllerOptions,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    // Children carry their list's labels, so the manager's label selector (sharding, tests)
    // selects a list and its children alike.
    let scoped = opts.scoped_watch_config();
    let workers = opts.workers.imagelistpulljob;
    let (jobs, job_writer) = reflector::store();
    let job_events = watcher(Api::<ImagePullJob>::all(client.clone()), scoped.clone())
        .default_backoff()
        .modify(strip)
        .reflect(job_writer)
        .touched_objects();

    let (list_reader, list_writer) = reflector::store();
    let (lists_listed, mut lists_listed_rx) = watch::channel(false);
    let backoff = Arc::new(Backoff::default());
    let forget_deleted = backoff::forget_deleted(backoff.clone(), list_reader.clone(), "", key);
    let list_events = watcher(Api::<ImageListPullJob>::all(client.clone()), scoped)
        .default_backoff()
        .modify(|l: &mut ImageListPullJob| l.managed_fields_mut().clear())
        .reflect(list_writer)
        .inspect(forget_deleted)
        .inspect(move |event| {
            if matches!(event, Ok(watcher::Event::InitDone)) {
                lists_listed.send_replace(true);
            }
        })
        .applied_objects();
    let controller = Controller::for_stream(list_events, list_reader);

    // `Store::wait_until_ready` wakes only one of several waiters; one task waits and tells all.
    let (jobs_ready, jobs_ready_rx) = watch::channel(false);
    let job_store = jobs.clone();
    let synced = opts.synced.clone();
    tokio::spawn(async move {
        if job_store.wait_until_ready().await.is_ok() {
            let _ = jobs_ready.send(true);
            if lists_listed_rx.wait_for(|listed| *listed).await.is_ok() {
                synced.mark(NAME);
            }
        }
    });
    let metrics = opts.metrics.clone();
    let ctx = Arc::new(Context {
        recorder: Recorder::for_manager(client.clone()),
        client,
        jobs,
        jobs_ready: jobs_ready_rx,
        overlays: Default::default(),
        backoff,
        pace: Default::default(),
    });
    let list_store = controller.store();
    let shutdown = shutdown.shared();
    let running = controller
        .watches_stream(job_events, |job| list_of(&job))
        // A list's children report together while it runs: the triggers that arrive while a list
        // reconciles are served by its next reconcile, at most `pace::MIN_GAP` after this one
        // started (crate::pace). A debounce, which starts over with each trigger, would wait
        // for its children to pause.
        .with_config(controller::Config::default().concurrency(workers))
        .graceful_shutdown_on(shutdown.clone())
        .run(
            move |list, ctx| metrics.timed(NAME, reconcile(list, ctx)),
            error_policy,
            ctx,
        )
        .for_each(|result| async move {
            if let Err(err) = result {
                warn!(error = %err, "imagelistpulljob controller");
            }
        });
    run_until_shutdown(running, shutdown, &list_store).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::imagelistpulljob::plan::child;
    use kruise_rs_api::imagelistpulljob::ImageListPullJobSpec;

    #[test]
    fn a_child_wakes_its_list_and_nothing_else_wakes_one() {
        let mut list = ImageListPullJob::new("list", ImageListPullJobSpec::default());
        list.metadata.namespace = Some("ns".into());
        list.metadata.uid = Some("uid".into());
        let mut job = child(&list, "nginx", "h");
        job.metadata.namespace = Some("ns".into());
        assert_eq!(list_of(&job), Some(ObjectRef::new("list").within("ns")));
        job.metadata
            .owner_references
            .as_mut()
            .unwrap()
            .iter_mut()
            .for_each(|o| o.controller = None);
        assert_eq!(list_of(&job), None);
        assert_eq!(list_of(&ImagePullJob::new("j", Default::default())), None);
    }

    #[test]
    fn only_children_keep_their_spec_and_status_in_the_store() {
        let mut list = ImageListPullJob::new("list", ImageListPullJobSpec::default());
        list.metadata.namespace = Some("ns".into());
        let mut kept = child(&list, "nginx", "h");
        kept.status = Some(Default::default());
        let mut stripped = kept.clone();
        stripped.metadata.owner_references = None;
        let before = kept.clone();
        strip(&mut kept);
        strip(&mut stripped);
        assert_eq!((&kept.spec, &kept.status), (&before.spec, &before.status));
        assert_eq!(stripped.spec, Default::default());
        assert_eq!(stripped.status, None);
        assert_eq!(stripped.metadata.labels, before.metadata.labels);
    }
}
