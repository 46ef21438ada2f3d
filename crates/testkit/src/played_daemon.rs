//! Every node's image daemon, played: each tag a NodeImage's spec asks for is reported pulled.
//! The benches and the fault suite need nodes that answer, not real pulls.

use std::collections::HashSet;
use std::ops::Range;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kruise_rs_api::nodeimage::{ImagePullPhase, ImageTagStatus, NodeImage};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

/// How the played daemons answer.
#[derive(Clone, Debug, Default)]
pub struct PlayedDaemons {
    /// Only NodeImages this label selector selects (`None`: every one).
    pub label_selector: Option<String>,
    /// Only this image's tags (`None`: every image's).
    pub image: Option<String>,
    /// Each answer waits a random number of milliseconds in this range, drawn from `seed`
    /// (an empty range: answers at once), so answers arrive out of order as real pulls do.
    pub delay_ms: Range<u64>,
    pub seed: u64,
    /// NodeImages left alone (their nodes run a real daemon).
    pub except_nodes: HashSet<String>,
}

/// A version of a tag asked for and not yet reported finished.
type Ask = (String, String, String, i64);

/// Watches NodeImages and reports each (image, tag, version) the spec asks for, and the status
/// has not finished, as `Succeeded` with a completion time, once. The write keeps the image's
/// other tags the spec still asks for, and drops the rest, as a daemon does (a merge patch
/// replaces the whole list, so it carries them, guarded by the resourceVersion it read). A
/// write that fails (a conflict, an apiserver restarting, a fault injected) is read again and
/// retried every 250 ms until it lands or the NodeImage is gone, so no ask is dropped. Runs
/// until the handle is aborted.
pub fn play_node_image_daemons(client: Client, how: PlayedDaemons) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<NodeImage> = Api::all(client);
        let mut config = watcher::Config::default();
        if let Some(selector) = &how.label_selector {
            config = config.labels(selector);
        }
        let stream = watcher(api.clone(), config)
            .default_backoff()
            .applied_objects();
        let mut stream = std::pin::pin!(stream);
        let mut answered: HashSet<Ask> = HashSet::new();
        let mut rng = fastrand::Rng::with_seed(how.seed);
        while let Some(item) = stream.next().await {
            let Ok(ni) = item else { continue };
            if how.except_nodes.contains(&ni.name_any()) {
                continue;
            }
            for ask in unanswered(&ni) {
                if how.image.as_ref().is_some_and(|only| *only != ask.1) {
                    continue;
                }
                if !answered.insert(ask.clone()) {
                    continue;
                }
                let delay = match how.delay_ms.is_empty() {
                    true => Duration::ZERO,
                    false => Duration::from_millis(rng.u64(how.delay_ms.clone())),
                };
                tokio::spawn(answer(api.clone(), ask, ni.clone(), delay));
            }
        }
    })
}

/// The asks in `ni`'s spec whose version its status does not report finished.
fn unanswered(ni: &NodeImage) -> Vec<Ask> {
    let reported = ni.status.as_ref().map(|s| &s.image_statuses);
    let mut asks = Vec::new();
    for (image, spec) in &ni.spec.images {
        for tag in &spec.tags {
            let version = tag.version.unwrap_or(0);
            let finished = reported
                .and_then(|r| r.get(image))
                .and_then(|i| i.tags.iter().find(|t| t.tag == tag.tag))
                .is_some_and(|t| t.completion_time.is_some() && t.version.unwrap_or(0) == version);
            if !finished {
                asks.push((
                    ni.name_any(),
                    image.to_string(),
                    tag.tag.to_string(),
                    version,
                ));
            }
        }
    }
    asks
}

/// Writes `ask` Succeeded into `seen`'s status (starting from the watched copy, re-read after
/// a failed write).
async fn answer(api: Api<NodeImage>, ask: Ask, mut seen: NodeImage, delay: Duration) {
    let (node, image, tag, version) = ask;
    tokio::time::sleep(delay).await;
    loop {
        let mut tags = seen
            .status
            .as_ref()
            .and_then(|s| s.image_statuses.get(image.as_str()))
            .map(|i| i.tags.clone())
            .unwrap_or_default();
        // A daemon reports the tags the spec asks for, no others.
        let asked = seen.spec.images.get(image.as_str()).map(|i| &i.tags);
        tags.retain(|t| t.tag != tag && asked.is_some_and(|a| a.iter().any(|s| s.tag == t.tag)));
        let mut done = ImageTagStatus::new(tag.clone(), ImagePullPhase::Succeeded);
        done.version = Some(version);
        done.progress = Some(100);
        done.completion_time = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        tags.push(done);
        // `desired` as a daemon counts it: upstream's CRD refuses a status without it.
        let desired: usize = seen.spec.images.values().map(|i| i.tags.len()).sum();
        let patch = json!({
            "metadata": {"resourceVersion": seen.resource_version()},
            "status": {"desired": desired, "imageStatuses": {&image: {"tags": tags}}},
        });
        match api
            .patch_status(&node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 404 => return,
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
        match api.get_opt(&node).await {
            Ok(Some(fresh)) => seen = fresh,
            Ok(None) => return,
            Err(_) => {}
        }
    }
}
