//! ImagePullJob fan-out at scale, against a real kube-apiserver on loopback.
//!
//! `cargo bench --bench imagepulljob_fanout` (env `NODES`, default 5000):
//! 1. starts a local control plane (tests/controlplane/start.sh) and `kruise-rs manager` as a
//!    child process (release build);
//! 2. creates NODES Ready Node objects and waits for the manager to create their NodeImages;
//! 3. baseline: a plain client merge-patches one tag entry into every NodeImage, one after the
//!    other, and is timed;
//! 4. an ImagePullJob over every node at parallelism NODES: time until every NodeImage carries
//!    the tag, and NodeImage PATCH requests per node (from the apiserver's own metrics);
//! 5. the same at parallelism 50, with this program playing the node daemons (each node reports
//!    Succeeded as soon as its entry appears);
//! 6. the manager's peak RSS (VmHWM).
//!
//! Figures are printed with their ratio to the baseline; nothing is asserted.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use kruise_rs::apis::imagepulljob::{ImagePullJob, ImagePullJobSpec, ImagePullJobTemplate};
use kruise_rs::apis::nodeimage::NodeImage;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

#[path = "../tests/harness/mod.rs"]
mod harness;

use harness::bench::Result;
use harness::controlplane::{ControlPlane, Crds, apiserver_requests};
use harness::objects::create_ready_nodes;
use harness::played_daemon::{PlayedDaemons, play_node_image_daemons};
use harness::procfs::rss_mib;

const NAMESPACE: &str = "default";
const LABEL: &str = "kruise-rs-bench";

fn main() -> Result<()> {
    if !harness::bench::requested("imagepulljob_fanout") {
        return Ok(());
    }
    let nodes: usize = std::env::var("NODES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(5000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench(nodes))
}

/// Sum of the apiserver's `apiserver_request_total` for PATCHes of NodeImage objects (not their
/// status, which the played daemons write), by status code.
async fn nodeimage_patches(client: &Client) -> Result<BTreeMap<String, f64>> {
    Ok(apiserver_requests(client, "nodeimages", "PATCH", |label| {
        label("subresource").is_empty().then(|| label("code"))
    })
    .await?)
}

fn diff(after: &BTreeMap<String, f64>, before: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .collect()
}

/// Waits until `count(nodeimages)` reaches `want`, watching rather than re-listing.
async fn wait_until(
    client: &Client,
    what: &str,
    want: usize,
    count: impl Fn(&NodeImage) -> bool,
) -> Result<Duration> {
    let start = Instant::now();
    let api: Api<NodeImage> = Api::all(client.clone());
    let stream = watcher(api, watcher::Config::default()).applied_objects();
    let mut stream = std::pin::pin!(stream);
    let mut done = HashSet::new();
    while done.len() < want {
        let ni = tokio::time::timeout(Duration::from_secs(300), stream.try_next())
            .await
            .map_err(|_| format!("{what}: stalled at {}/{want}", done.len()))??
            .ok_or("watch ended")?;
        if count(&ni) {
            done.insert(ni.name_any());
        }
    }
    Ok(start.elapsed())
}

fn has_tag(ni: &NodeImage, image: &str, tag: &str) -> bool {
    ni.spec
        .images
        .get(image)
        .is_some_and(|i| i.tags.iter().any(|t| t.tag == tag))
}

async fn bench(n: usize) -> Result<()> {
    println!("imagepulljob fan-out over {n} nodes");
    let cp = ControlPlane::start("kruise-rs-bench-")?;
    let client = cp.client().await?;
    cp.install_crds(Crds::Repository)?;

    // `MANAGER_WRAPPER=heaptrack` (any command taking the program as its first argument) runs the
    // manager under a profiler; the RSS figures are then the wrapper's, and the manager may
    // outlive the killed wrapper: `pkill -f "kruise-rs manager"` afterwards.
    let wrapper = std::env::var("MANAGER_WRAPPER")
        .ok()
        .filter(|w| !w.is_empty());
    let manager = cp.spawn_manager(wrapper.as_deref())?;

    let t = Instant::now();
    create_ready_nodes(
        &client,
        n,
        &BTreeMap::from([(LABEL.to_owned(), "true".to_owned())]),
        32,
    )
    .await?;
    println!(
        "  {n} Ready nodes created in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let d = wait_until(&client, "NodeImages created", n, |_| true).await?;
    println!(
        "  {n} NodeImages created by the manager {:.1} s after the last node",
        d.as_secs_f64()
    );
    let mib =
        |field| rss_mib(manager.id(), field).map_or("unknown".into(), |r| format!("{r:.1} MiB"));
    println!(
        "  manager RSS with {n} Nodes and NodeImages watched: {}",
        mib("VmRSS:")
    );

    // Baseline: a plain client writing one tag entry into every NodeImage, one after the other.
    // Its entries name a real job (one that targets no node), so the NodeImage controller keeps
    // them, and carry the same fields a job's entry does.
    let jobs: Api<ImagePullJob> = Api::namespaced(client.clone(), NAMESPACE);
    let idle = ImagePullJobSpec {
        image: "baseline:1".into(),
        template: ImagePullJobTemplate {
            selector: Some(kruise_rs::apis::imagepulljob::ImagePullJobNodeSelector {
                names: vec!["no-such-node".into()],
                ..Default::default()
            }),
            completion_policy: kruise_rs::apis::imagepulljob::CompletionPolicy {
                type_: Some(kruise_rs::apis::imagepulljob::CompletionPolicyType::Never),
                ..Default::default()
            },
            ..Default::default()
        },
    };
    let owner = jobs
        .create(&PostParams::default(), &ImagePullJob::new("baseline", idle))
        .await?;
    let owner_uid = owner.metadata.uid.clone().unwrap_or_default();
    let api: Api<NodeImage> = Api::all(client.clone());
    let names: Vec<String> = api
        .list(&ListParams::default().labels(LABEL))
        .await?
        .items
        .iter()
        .map(|n| n.name_any())
        .collect();
    let now = k8s_openapi::jiff::fmt::strtime::format(
        "%Y-%m-%dT%H:%M:%SZ",
        k8s_openapi::jiff::Timestamp::now(),
    )?;
    let t = Instant::now();
    for name in &names {
        let entry = json!({"spec": {"images": {"baseline": {"tags": [{
            "tag": "1", "createdAt": now, "version": 0,
            "ownerReferences": [{"apiVersion": "apps.kruise.io/v1beta1", "kind": "ImagePullJob", "name": "baseline", "namespace": NAMESPACE, "uid": owner_uid}],
            "pullPolicy": {"timeoutSeconds": 600, "backoffLimit": 3, "ttlSecondsAfterFinished": 2100}
        }]}}}});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&entry))
            .await?;
    }
    let baseline = t.elapsed();
    println!(
        "  baseline: a plain client wrote {} NodeImages in {:.2} s",
        names.len(),
        baseline.as_secs_f64()
    );

    for (parallelism, image, tag) in [(n as i32, "bench-wide", "1"), (50, "bench-narrow", "1")] {
        let daemons = (parallelism < n as i32).then(|| {
            let only = PlayedDaemons {
                image: Some(image.to_owned()),
                ..PlayedDaemons::default()
            };
            play_node_image_daemons(client.clone(), only)
        });
        let before = nodeimage_patches(&client).await?;
        let spec = ImagePullJobSpec {
            image: format!("{image}:{tag}"),
            template: ImagePullJobTemplate {
                parallelism: Some(
                    k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(parallelism),
                ),
                selector: Some(kruise_rs::apis::imagepulljob::ImagePullJobNodeSelector {
                    match_labels: Some(BTreeMap::from([(LABEL.to_owned(), "true".to_owned())])),
                    ..Default::default()
                }),
                ..Default::default()
            },
        };
        let t = Instant::now();
        jobs.create(
            &PostParams::default(),
            &ImagePullJob::new(&format!("{image}-job"), spec),
        )
        .await?;
        wait_until(&client, "tags written", n, |ni| has_tag(ni, image, tag)).await?;
        let took = t.elapsed();
        // Let in-flight reconciles finish before reading the counters.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let patches = diff(&nodeimage_patches(&client).await?, &before);
        if let Some(d) = daemons {
            d.abort();
        }
        let ok = patches.get("200").copied().unwrap_or(0.0);
        let refused: f64 = patches
            .iter()
            .filter(|(c, _)| c.as_str() != "200")
            .map(|(_, v)| v)
            .sum();
        println!(
            "  job at parallelism {parallelism}: every NodeImage carries the tag after {:.2} s ({:.2}x baseline); \
             NodeImage writes per node: {:.3} (refused patches: {:.0})",
            took.as_secs_f64(),
            took.as_secs_f64() / baseline.as_secs_f64(),
            ok / n as f64,
            refused.max(0.0),
        );
        println!("    manager RSS now: {}", mib("VmRSS:"));
    }
    println!(
        "  manager RSS: peak {}, at the end {}",
        mib("VmHWM:"),
        mib("VmRSS:")
    );
    Ok(())
}
