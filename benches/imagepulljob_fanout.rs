//! ImagePullJob fan-out at scale, against a real kube-apiserver on loopback.
//!
//! `cargo bench --bench imagepulljob_fanout` (env `NODES`, default 5000), for each manager in
//! turn, on a control plane of its own:
//! 1. starts a local control plane (tests/controlplane/start.sh) and the manager as a child
//!    process: ours is the release-built `kruise-rs manager` (`MANAGER_ARGS` adds arguments,
//!    `MANAGER_WRAPPER` runs it under a profiler);
//! 2. creates NODES Ready Node objects and waits for the manager to create their NodeImages;
//! 3. baseline: a plain client merge-patches one tag entry into every NodeImage, one after the
//!    other, timed until a watch has seen every NodeImage carry it; then (untimed) it takes the
//!    entries out again, so that the job writes into NodeImages holding what the baseline's
//!    writes found (the apiserver's cost of a write grows with the entries already there);
//! 4. an ImagePullJob over every node at parallelism NODES: time until the same watch has seen
//!    every NodeImage carry the tag, NodeImage writes (PATCH or PUT) per node (from the
//!    apiserver's own metrics), and the time our manager's requests waited for its client-side
//!    rate limit (its metrics);
//! 5. the same at parallelism 50, with this program playing the node daemons (each node reports
//!    Succeeded as soon as its entry appears);
//! 6. wake-ups: ten selector jobs over every node, each with ten nodes pulling, then
//!    `WAKE_REPORTS` (default 1000; 0 skips it) status writes as daemons write them while they
//!    pull, each raising one pulling tag's progress: the manager's CPU seconds and job
//!    reconciles over them;
//! 7. the manager's peak RSS (VmHWM).
//!
//! Each timed phase also prints the CPU seconds the manager, kube-apiserver, etcd and this
//! program spent, the apiserver's mean time serving one NodeImage write, its CPU per NodeImage
//! write (spec and status, from its own `process_cpu_seconds_total`), every request it served,
//! and the manager's job reconciles.
//!
//! `SECOND_MANAGER=<description file>` (format: crates/testkit/src/manager_under_test.rs; upstream's
//! kruise-manager: benches/upstream-kruise-manager/manager.example.yaml) runs the same phases
//! against that manager after ours, on a control plane of its own; a table then puts both
//! managers' figures side by side with their ratio.
//! `MANAGER_ARGS` (whitespace-separated, e.g. `--kube-api-qps 0`) are appended to our manager's
//! command line.
//!
//! Figures are printed with their ratio to the baseline; nothing is asserted.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kruise_rs_api::imagepulljob::{ImagePullJob, ImagePullJobSpec, ImagePullJobTemplate};
use kruise_rs_api::nodeimage::NodeImage;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

use kruise_rs_testkit as harness;

use harness::bench::Result;
use harness::controlplane::{
    ControlPlane, Crds, apiserver_metric, apiserver_request_metric, is_nodeimage_write,
    nodeimage_writes,
};
use harness::manager_under_test::{LimitWaits, ManagerUnderTest, RunningManager};
use harness::objects::create_ready_nodes;
use harness::played_daemon::{PlayedDaemons, play_node_image_daemons};
use harness::procfs::{cpu_total, rss_mib};

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
    // Read the second manager's description first: a mistake in it shows before any run.
    let second = ManagerUnderTest::second()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let ours = ManagerUnderTest::ours();
    let first = runtime.block_on(bench(nodes, &ours))?;
    if let Some(second) = second {
        let other = runtime.block_on(bench(nodes, &second))?;
        print_side_by_side(nodes, (&ours.name, &first), (&second.name, &other));
    }
    Ok(())
}

/// What one manager's run measured (seconds, MiB).
struct Figures {
    nodeimages_created: f64,
    rss_watched: Option<f64>,
    baseline: f64,
    baseline_costs: PhaseFigures,
    jobs: Vec<JobFigures>,
    wakes: Option<WakeFigures>,
    rss_peak: Option<f64>,
    rss_end: Option<f64>,
}

/// The daemons' progress reports while ten selector jobs run (`WAKE_JOBS`).
struct WakeFigures {
    reports: usize,
    /// The manager's CPU seconds over the reports (and the settling after them).
    manager_cpu: Option<f64>,
    reconciles: Option<f64>,
}

struct JobFigures {
    parallelism: i32,
    took: f64,
    writes_per_node: f64,
    refused: f64,
    costs: PhaseFigures,
    rss_after: Option<f64>,
}

/// Both managers' figures in columns, with the second's over the first's.
fn print_side_by_side(n: usize, (a_name, a): (&str, &Figures), (b_name, b): (&str, &Figures)) {
    let secs: Format = |v| format!("{v:.2} s");
    let times: Format = |v| format!("{v:.2}x");
    let mib: Format = |v| format!("{v:.1} MiB");
    let ms: Format = |v| format!("{v:.2} ms");
    let count: Format = |v| format!("{v:.0}");
    let mut rows: Vec<[String; 4]> = vec![[
        String::new(),
        a_name.to_owned(),
        b_name.to_owned(),
        format!("{b_name} / {a_name}"),
    ]];
    let r = &mut rows;
    figure(
        r,
        format!("{n} NodeImages created, after the last Node"),
        (Some(a.nodeimages_created), Some(b.nodeimages_created)),
        secs,
    );
    figure(
        r,
        "RSS with the Nodes and NodeImages watched".into(),
        (a.rss_watched, b.rss_watched),
        mib,
    );
    figure(
        r,
        "baseline: a plain client writes every NodeImage".into(),
        (Some(a.baseline), Some(b.baseline)),
        secs,
    );
    let (x, y) = (&a.baseline_costs, &b.baseline_costs);
    figure(
        r,
        "  the apiserver's mean NodeImage write".into(),
        (x.write_ms, y.write_ms),
        ms,
    );
    figure(
        r,
        "  the apiserver's CPU per NodeImage write".into(),
        (x.apiserver_cpu_per_write_ms, y.apiserver_cpu_per_write_ms),
        ms,
    );
    for (x, y) in a.jobs.iter().zip(&b.jobs) {
        let p = x.parallelism;
        figure(
            r,
            format!("job at parallelism {p}: every NodeImage tagged"),
            (Some(x.took), Some(y.took)),
            secs,
        );
        figure(
            r,
            "  the same over its run's baseline".into(),
            (Some(x.took / a.baseline), Some(y.took / b.baseline)),
            times,
        );
        r.push([
            "  NodeImage writes per node (refused)".into(),
            format!("{:.3} ({:.0})", x.writes_per_node, x.refused),
            format!("{:.3} ({:.0})", y.writes_per_node, y.refused),
            "-".into(),
        ]);
        let (xc, yc) = (&x.costs, &y.costs);
        figure(
            r,
            "  the apiserver's mean NodeImage write (latency)".into(),
            (xc.write_ms, yc.write_ms),
            ms,
        );
        figure(
            r,
            "  the apiserver's CPU per NodeImage write, spec and status".into(),
            (xc.apiserver_cpu_per_write_ms, yc.apiserver_cpu_per_write_ms),
            ms,
        );
        figure(
            r,
            "  the manager's job reconciles".into(),
            (xc.reconciles, yc.reconciles),
            count,
        );
        figure(
            r,
            "  CPU of every process (manager, apiserver, etcd, bench)".into(),
            (xc.cpu_total, yc.cpu_total),
            |v| format!("{v:.1} s"),
        );
        figure(r, "  RSS after it".into(), (x.rss_after, y.rss_after), mib);
    }
    if let (Some(x), Some(y)) = (&a.wakes, &b.wakes) {
        let per = |w: &WakeFigures, v: Option<f64>| v.map(|v| v / w.reports as f64 * 1000.0);
        figure(
            r,
            format!("{WAKE_JOBS} running selector jobs: manager CPU per 1,000 progress reports"),
            (per(x, x.manager_cpu), per(y, y.manager_cpu)),
            secs,
        );
        figure(
            r,
            "  job reconciles per 1,000 progress reports".into(),
            (per(x, x.reconciles), per(y, y.reconciles)),
            count,
        );
    }
    figure(r, "peak RSS (VmHWM)".into(), (a.rss_peak, b.rss_peak), mib);
    figure(r, "RSS at the end".into(), (a.rss_end, b.rss_end), mib);
    let mut widths = [0; 4];
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    println!("side by side, {n} nodes, each manager on a control plane of its own:");
    for [what, x, y, r] in &rows {
        println!(
            "  {what:<w0$}  {x:>w1$}  {y:>w2$}  {r:>w3$}",
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3]
        );
    }
}

/// How one figure is written in the side-by-side table.
type Format = fn(f64) -> String;

/// A row of both managers' figure `(x, y)`, each written by `format` ("unknown" when missing),
/// with `y / x`.
fn figure(
    rows: &mut Vec<[String; 4]>,
    what: String,
    (x, y): (Option<f64>, Option<f64>),
    format: Format,
) {
    let cell = |v: Option<f64>| v.map_or("unknown".to_owned(), format);
    let ratio = match (x, y) {
        (Some(x), Some(y)) if x > 0.0 => format!("{:.2}x", y / x),
        _ => "-".to_owned(),
    };
    rows.push([what, cell(x), cell(y), ratio]);
}

fn diff(after: &BTreeMap<String, f64>, before: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .collect()
}

/// Waits until `count(nodeimages)` reaches `want`, watching rather than re-listing; fails once
/// the manager has exited, or after 300 s without progress.
async fn wait_until(
    client: &Client,
    manager: &mut RunningManager,
    what: &str,
    want: usize,
    count: impl Fn(&NodeImage) -> bool,
) -> Result<Duration> {
    let start = Instant::now();
    let api: Api<NodeImage> = Api::all(client.clone());
    let stream = watcher(api, watcher::Config::default()).applied_objects();
    let mut stream = std::pin::pin!(stream);
    let mut done = HashSet::new();
    let mut progress = Instant::now();
    while done.len() < want {
        // A watch stream's next item may be waited for again after a timeout.
        match tokio::time::timeout(Duration::from_secs(1), stream.try_next()).await {
            Ok(item) => {
                let ni = item?.ok_or("watch ended")?;
                if count(&ni) && done.insert(ni.name_any()) {
                    progress = Instant::now();
                    if done.len() == 1 {
                        println!(
                            "    {what}: the first after {:.2} s",
                            start.elapsed().as_secs_f64()
                        );
                    }
                }
            }
            Err(_) => {
                manager.check_alive("the manager")?;
                if progress.elapsed() > Duration::from_secs(300) {
                    return Err(format!("{what}: stalled at {}/{want}", done.len()).into());
                }
            }
        }
    }
    Ok(start.elapsed())
}

/// What a phase cost: CPU seconds of each process (the apiserver's also from its own
/// `process_cpu_seconds_total`), the apiserver's time serving NodeImage writes (PATCH, PUT or
/// APPLY of the object itself), every request it served, and the manager's job reconciles.
struct PhaseCosts {
    cpu: Vec<(&'static str, Option<f64>)>,
    apiserver_cpu: Option<f64>,
    write_seconds: f64,
    writes: f64,
    /// Every request the apiserver served so far, by `VERB resource[/subresource]`.
    requests: BTreeMap<String, f64>,
    reconciles: Option<f64>,
}

/// What [`PhaseCosts::print_since`] read from the difference of two readings.
#[derive(Clone, Copy, Default)]
struct PhaseFigures {
    /// The apiserver's mean time serving one NodeImage write (ms).
    write_ms: Option<f64>,
    /// The apiserver's CPU over the phase per NodeImage write, spec and status (ms).
    apiserver_cpu_per_write_ms: Option<f64>,
    /// The manager's ImagePullJob reconciles.
    reconciles: Option<f64>,
    /// Every process's CPU seconds (manager, kube-apiserver, etcd, bench), summed.
    cpu_total: Option<f64>,
}

/// The manager's ImagePullJob reconciles so far: ours under its own name, upstream's under
/// controller-runtime's.
fn job_reconciles(manager: &RunningManager) -> Option<f64> {
    manager
        .metric_where(
            "kruise_rs_manager_reconciles_total",
            "controller=\"imagepulljob\"",
        )
        .or_else(|| {
            manager.metric_where(
                "controller_runtime_reconcile_total",
                "controller=\"imagepulljob-controller\"",
            )
        })
}

impl PhaseCosts {
    async fn read(cp: &ControlPlane, client: &Client, manager: &RunningManager) -> Result<Self> {
        let cpu = vec![
            ("manager", cpu_total(manager.pid())),
            (
                "kube-apiserver",
                cp.pid("kube-apiserver").and_then(cpu_total),
            ),
            ("etcd", cp.pid("etcd").and_then(cpu_total)),
            ("bench", cpu_total(std::process::id())),
        ];
        let metric = |name| async move {
            let sums = apiserver_request_metric(client, name, "nodeimages", |label| {
                is_nodeimage_write(label).then(String::new)
            })
            .await?;
            Result::<f64>::Ok(sums.values().sum())
        };
        let apiserver_cpu = apiserver_metric(client, "process_cpu_seconds_total")
            .await?
            .first()
            .map(|(_, v)| *v);
        Ok(Self {
            cpu,
            apiserver_cpu,
            write_seconds: metric("apiserver_request_duration_seconds_sum").await?,
            writes: metric("apiserver_request_duration_seconds_count").await?,
            requests: apiserver_requests(client).await?,
            reconciles: job_reconciles(manager),
        })
    }

    /// Prints what was spent since `before`.
    fn print_since(&self, before: &Self) -> PhaseFigures {
        let spent: Vec<(&str, Option<f64>)> = self
            .cpu
            .iter()
            .zip(&before.cpu)
            .map(|((name, after), (_, before))| (*name, after.zip(*before).map(|(a, b)| a - b)))
            .collect();
        let cpu: Vec<String> = spent
            .iter()
            .map(|(name, s)| s.map_or(format!("{name} unknown"), |s| format!("{name} {s:.1}")))
            .collect();
        let writes = self.writes - before.writes;
        let mean_ms =
            (writes > 0.0).then(|| (self.write_seconds - before.write_seconds) / writes * 1000.0);
        println!(
            "    CPU seconds: {}; the apiserver served {writes:.0} NodeImage writes, {} each on average",
            cpu.join(", "),
            mean_ms.map_or("-".to_owned(), |ms| format!("{ms:.2} ms")),
        );
        // Where the apiserver's time went: every kind of request served in the phase.
        let served_since = diff(&self.requests, &before.requests);
        let mut served: Vec<(&String, &f64)> =
            served_since.iter().filter(|(_, n)| **n >= 1.0).collect();
        served.sort_by(|a, b| b.1.total_cmp(a.1));
        let listed: Vec<String> = served.iter().map(|(k, n)| format!("{k} {n:.0}")).collect();
        println!("    requests served: {}", listed.join(", "));
        // Spec and status writes alike: the daemons' answers are part of a fan-out's cost.
        let all_writes: f64 = served_since
            .iter()
            .filter(|(k, _)| {
                ["PATCH nodeimages", "PUT nodeimages", "APPLY nodeimages"]
                    .iter()
                    .any(|w| k.starts_with(w))
            })
            .map(|(_, n)| n)
            .sum();
        let apiserver_cpu_per_write_ms = self
            .apiserver_cpu
            .zip(before.apiserver_cpu)
            .filter(|_| all_writes > 0.0)
            .map(|(a, b)| (a - b) / all_writes * 1000.0);
        let reconciles = self.reconciles.zip(before.reconciles).map(|(a, b)| a - b);
        println!(
            "    the apiserver's CPU (its own metric) per NodeImage write, spec and status ({all_writes:.0}): {}; job reconciles: {}",
            apiserver_cpu_per_write_ms.map_or("unknown".to_owned(), |ms| format!("{ms:.2} ms")),
            reconciles.map_or("unknown".to_owned(), |n| format!("{n:.0}")),
        );
        PhaseFigures {
            write_ms: mean_ms,
            apiserver_cpu_per_write_ms,
            reconciles,
            cpu_total: spent.iter().map(|(_, s)| *s).sum(),
        }
    }
}

/// Every request `apiserver_request_total` counted, by `VERB resource[/subresource]` (WATCH
/// counts a watch once, when it starts).
async fn apiserver_requests(client: &Client) -> Result<BTreeMap<String, f64>> {
    let mut sums = BTreeMap::new();
    for (labels, value) in apiserver_metric(client, "apiserver_request_total").await? {
        let label = |name: &str| {
            labels
                .split(&format!("{name}=\""))
                .nth(1)
                .and_then(|s| s.split('"').next())
                .unwrap_or_default()
                .to_owned()
        };
        let (resource, sub) = (label("resource"), label("subresource"));
        if resource.is_empty() {
            continue;
        }
        let key = match sub.as_str() {
            "" => format!("{} {resource}", label("verb")),
            sub => format!("{} {resource}/{sub}", label("verb")),
        };
        *sums.entry(key).or_insert(0.0) += value;
    }
    Ok(sums)
}

/// How many running selector jobs the progress-report phase keeps, each pulling on
/// `WAKE_PARALLELISM` nodes.
const WAKE_JOBS: usize = 10;
const WAKE_PARALLELISM: usize = 10;

/// Ten selector jobs over every node, each with `WAKE_PARALLELISM` nodes pulling (nobody answers
/// them); then `reports` status writes as the daemons write them while they pull, each raising
/// one pulling tag's progress, one after the other. Measures the manager's CPU and its job
/// reconciles over the writes and the 2 s after them.
async fn progress_reports(
    client: &Client,
    jobs: &Api<ImagePullJob>,
    manager: &RunningManager,
    reports: usize,
) -> Result<WakeFigures> {
    let images: Vec<String> = (0..WAKE_JOBS)
        .map(|k| format!("bench-running-{k}"))
        .collect();
    for image in &images {
        let spec = ImagePullJobSpec {
            image: format!("{image}:1"),
            template: ImagePullJobTemplate {
                parallelism: Some(
                    k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(
                        WAKE_PARALLELISM as i32,
                    ),
                ),
                selector: Some(kruise_rs_api::imagepulljob::ImagePullJobNodeSelector {
                    match_labels: Some(BTreeMap::from([(LABEL.to_owned(), "true".to_owned())])),
                    ..Default::default()
                }),
                ..Default::default()
            },
        };
        jobs.create(&PostParams::default(), &ImagePullJob::new(image, spec))
            .await?;
    }
    // The nodes each job writes, read until every job has its parallelism's worth.
    let api: Api<NodeImage> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(120);
    let pulling: Vec<(String, String, usize)> = loop {
        let mut found = Vec::new();
        for ni in api.list(&ListParams::default().labels(LABEL)).await?.items {
            let desired: usize = ni.spec.images.values().map(|i| i.tags.len()).sum();
            for image in &images {
                if has_tag(&ni, image, "1") {
                    found.push((ni.name_any(), image.clone(), desired));
                }
            }
        }
        if found.len() >= WAKE_JOBS * WAKE_PARALLELISM {
            break found;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{WAKE_JOBS} jobs wrote {} entries in 120 s, not {}",
                found.len(),
                WAKE_JOBS * WAKE_PARALLELISM
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    // Settle: the jobs' own writes and status done.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let started = k8s_openapi::jiff::fmt::strtime::format(
        "%Y-%m-%dT%H:%M:%SZ",
        k8s_openapi::jiff::Timestamp::now(),
    )?;
    let cpu_before = cpu_total(manager.pid());
    let reconciles_before = job_reconciles(manager);
    let t = Instant::now();
    for i in 0..reports {
        let (node, image, desired) = &pulling[i % pulling.len()];
        let progress = 1 + (i / pulling.len()) % 99;
        let patch = json!({"status": {"desired": desired, "imageStatuses": {image: {"tags": [{
            "tag": "1", "phase": "Pulling", "progress": progress, "version": 0, "startTime": started,
        }]}}}});
        api.patch_status(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    let took = t.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let manager_cpu = cpu_total(manager.pid()).zip(cpu_before).map(|(a, b)| a - b);
    let reconciles = job_reconciles(manager)
        .zip(reconciles_before)
        .map(|(a, b)| a - b);
    println!(
        "  {WAKE_JOBS} running selector jobs, {reports} progress reports on their {} pulling tags in {:.2} s: manager CPU {}, job reconciles {}",
        pulling.len(),
        took.as_secs_f64(),
        manager_cpu.map_or("unknown".to_owned(), |c| format!("{c:.2} s")),
        reconciles.map_or("unknown".to_owned(), |n| format!("{n:.0}")),
    );
    Ok(WakeFigures {
        reports,
        manager_cpu,
        reconciles,
    })
}

fn has_tag(ni: &NodeImage, image: &str, tag: &str) -> bool {
    ni.spec
        .images
        .get(image)
        .is_some_and(|i| i.tags.iter().any(|t| t.tag == tag))
}

async fn bench(n: usize, under_test: &ManagerUnderTest) -> Result<Figures> {
    println!(
        "imagepulljob fan-out over {n} nodes, manager {}: {} {}",
        under_test.name,
        under_test.binary.display(),
        under_test.args.join(" ")
    );
    let cp = ControlPlane::start("kruise-rs-bench-")?;
    let client = cp.client().await?;
    cp.install_crds(Crds::Repository)?;

    // `MANAGER_WRAPPER=heaptrack` (any command taking the program as its first argument) runs our
    // manager under a profiler; the RSS figures are then the wrapper's, and the manager may
    // outlive the killed wrapper: `pkill -f "kruise-rs manager"` afterwards.
    let mut manager = under_test.spawn(&cp)?;
    println!("  its log: {}", manager.log_path().display());

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
    // Upstream's manager labels a NodeImage after creating it: the baseline needs them all.
    let d = wait_until(&client, &mut manager, "NodeImages created", n, |ni| {
        ni.labels().contains_key(LABEL)
    })
    .await?;
    println!(
        "  {n} NodeImages created (and labelled) by the manager {:.1} s after the last node",
        d.as_secs_f64()
    );
    let pid = manager.pid();
    let mib = |field| rss_mib(pid, field).map_or("unknown".into(), |r| format!("{r:.1} MiB"));
    let rss_watched = rss_mib(pid, "VmRSS:");
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
            selector: Some(kruise_rs_api::imagepulljob::ImagePullJobNodeSelector {
                names: vec!["no-such-node".into()],
                ..Default::default()
            }),
            completion_policy: kruise_rs_api::imagepulljob::CompletionPolicy {
                type_: Some(kruise_rs_api::imagepulljob::CompletionPolicyType::Never),
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
    let costs = PhaseCosts::read(&cp, &client, &manager).await?;
    let t = Instant::now();
    let writes = async {
        for name in &names {
            let entry = json!({"spec": {"images": {"baseline": {"tags": [{
                "tag": "1", "createdAt": now, "version": 0,
                "ownerReferences": [{"apiVersion": "apps.kruise.io/v1beta1", "kind": "ImagePullJob", "name": "baseline", "namespace": NAMESPACE, "uid": owner_uid}],
                "pullPolicy": {"timeoutSeconds": 600, "backoffLimit": 3, "ttlSecondsAfterFinished": 2100}
            }]}}}});
            api.patch(name, &PatchParams::default(), &Patch::Merge(&entry))
                .await?;
        }
        Result::<Duration>::Ok(t.elapsed())
    };
    let (written, seen) = tokio::join!(
        writes,
        wait_until(&client, &mut manager, "baseline tags written", n, |ni| {
            has_tag(ni, "baseline", "1")
        })
    );
    let (written, baseline) = (written?, seen?);
    println!(
        "  baseline: a plain client wrote {} NodeImages in {:.2} s; every NodeImage seen carrying its tag after {:.2} s",
        names.len(),
        written.as_secs_f64(),
        baseline.as_secs_f64()
    );
    let baseline_costs = PhaseCosts::read(&cp, &client, &manager)
        .await?
        .print_since(&costs);

    // The job then writes into NodeImages as the baseline found them: the apiserver's cost of a
    // write grows with the entries a NodeImage already holds (about 2.5 ms each on this machine),
    // so a job adding a second entry would be timed against a baseline that added the first.
    // Untimed, a few at a time; the job starts once a watch has seen every entry gone.
    let taken_out = futures::stream::iter(&names)
        .map(|name| {
            let api = api.clone();
            async move {
                let patch = json!({"spec": {"images": {"baseline": null}}});
                api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
            }
        })
        .buffer_unordered(8)
        .try_collect::<Vec<_>>();
    let (taken_out, seen) = tokio::join!(
        taken_out,
        wait_until(&client, &mut manager, "baseline tags taken out", n, |ni| {
            !ni.spec.images.contains_key("baseline")
        })
    );
    taken_out?;
    seen?;

    let mut jobs_figures = Vec::new();
    for (parallelism, image, tag) in [(n as i32, "bench-wide", "1"), (50, "bench-narrow", "1")] {
        let daemons = (parallelism < n as i32).then(|| {
            let only = PlayedDaemons {
                image: Some(image.to_owned()),
                ..PlayedDaemons::default()
            };
            play_node_image_daemons(client.clone(), only)
        });
        let before = nodeimage_writes(&client).await?;
        let waits_before = manager.limit_waits();
        let spec = ImagePullJobSpec {
            image: format!("{image}:{tag}"),
            template: ImagePullJobTemplate {
                parallelism: Some(
                    k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(parallelism),
                ),
                selector: Some(kruise_rs_api::imagepulljob::ImagePullJobNodeSelector {
                    match_labels: Some(BTreeMap::from([(LABEL.to_owned(), "true".to_owned())])),
                    ..Default::default()
                }),
                ..Default::default()
            },
        };
        let costs = PhaseCosts::read(&cp, &client, &manager).await?;
        let t = Instant::now();
        jobs.create(
            &PostParams::default(),
            &ImagePullJob::new(&format!("{image}-job"), spec),
        )
        .await?;
        wait_until(&client, &mut manager, "tags written", n, |ni| {
            has_tag(ni, image, tag)
        })
        .await?;
        let took = t.elapsed();
        let costs = PhaseCosts::read(&cp, &client, &manager)
            .await?
            .print_since(&costs);
        // Let in-flight reconciles finish before reading the counters.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let writes = diff(&nodeimage_writes(&client).await?, &before);
        if let Some(d) = daemons {
            d.abort();
        }
        let ok = writes.get("200").copied().unwrap_or(0.0);
        let refused: f64 = writes
            .iter()
            .filter(|(c, _)| c.as_str() != "200")
            .map(|(_, v)| v)
            .sum();
        println!(
            "  job at parallelism {parallelism}: every NodeImage carries the tag after {:.2} s ({:.2}x baseline); \
             NodeImage writes per node: {:.3} (refused writes: {:.0})",
            took.as_secs_f64(),
            took.as_secs_f64() / baseline.as_secs_f64(),
            ok / n as f64,
            refused.max(0.0),
        );
        println!("    manager RSS now: {}", mib("VmRSS:"));
        println!(
            "    {}",
            LimitWaits::describe(waits_before, manager.limit_waits())
        );
        jobs_figures.push(JobFigures {
            parallelism,
            took: took.as_secs_f64(),
            writes_per_node: ok / n as f64,
            refused: refused.max(0.0),
            costs,
            rss_after: rss_mib(pid, "VmRSS:"),
        });
    }
    let wakes = match std::env::var("WAKE_REPORTS").map_or(Ok(1000), |v| v.parse::<usize>()) {
        Ok(0) => None,
        Ok(reports) => Some(progress_reports(&client, &jobs, &manager, reports).await?),
        Err(e) => return Err(format!("WAKE_REPORTS: {e}").into()),
    };
    println!(
        "  manager RSS: peak {}, at the end {}",
        mib("VmHWM:"),
        mib("VmRSS:")
    );
    Ok(Figures {
        nodeimages_created: d.as_secs_f64(),
        rss_watched,
        baseline: baseline.as_secs_f64(),
        baseline_costs,
        jobs: jobs_figures,
        wakes,
        rss_peak: rss_mib(pid, "VmHWM:"),
        rss_end: rss_mib(pid, "VmRSS:"),
    })
}
