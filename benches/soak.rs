//! The manager under an hour of churn, against a real kube-apiserver on loopback: does its memory
//! or its count of open files grow with time?
//!
//! `cargo bench --bench soak` (env `SOAK_MINUTES`, default 60; `NODES` 20; `PODS` 120;
//! `MANAGER_WRAPPER`, e.g. `heaptrack`, runs the manager under it):
//! 1. starts a local control plane and `kruise-rs manager` (release build, webhooks on, leader
//!    election on) as a child process; NODES Ready Nodes, whose NodeImages it creates;
//! 2. a SidecarSet (maxUnavailable 5) selects the pods this bench creates; the bench plays the
//!    kubelet (each pod Running and Ready with the images of its spec) and every node's daemon
//!    (each NodeImage tag reported Succeeded);
//! 3. churn, every 2 s: 4 pods created through the webhook (injected), the 4 oldest deleted once
//!    there are PODS; every 60 s the sidecar's image changes (an in-place rollout over every pod);
//!    every 30 s an ImagePullJob of a new image over every node (TTL 10 s after it finishes, so
//!    jobs and their NodeImage tags come and go);
//! 4. every minute: the manager's RSS, its peak RSS, its open file descriptors, and what exists.
//!
//! At the end: the last minute's RSS and descriptors against the first's. Flat is the goal;
//! nothing is asserted.

use kruise_rs_testkit as harness;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use harness::bench::{Result, env_number};
use harness::controlplane::{ControlPlane, Crds};
use harness::objects::{create_namespace, create_ready_nodes};
use harness::played_daemon::{PlayedDaemons, play_node_image_daemons};
use harness::process::{ChildGuard, free_loopback_port};
use harness::procfs::rss_mib;
use k8s_openapi::api::core::v1::Pod;
use kruise_rs_api::imagepulljob::ImagePullJob;
use kruise_rs_api::nodeimage::NodeImage;
use kruise_rs_api::sidecarset::SidecarSet;
use kruise_rs_api::well_known::{SIDECARSET_HASH, SIDECARSET_INJECTED_LIST};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

const NAMESPACE: &str = "soak";
const SET: &str = "soak-agent";
const AGENT: &str = "registry.local/soak/agent";
const APP_IMAGE: &str = "registry.local/soak/web:1.0.0";
const TICK: Duration = Duration::from_secs(2);
const CHURN: usize = 4;
const ROLLOUT_EVERY: Duration = Duration::from_secs(60);
const JOB_EVERY: Duration = Duration::from_secs(30);
const REPORT_EVERY: Duration = Duration::from_secs(60);

fn main() -> Result<()> {
    if !harness::bench::requested("soak") {
        return Ok(());
    }
    let minutes = env_number("SOAK_MINUTES", 60, 1)?;
    let nodes = env_number("NODES", 20, 1)?;
    let pods = env_number("PODS", 120, CHURN)?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(soak(minutes, nodes, pods))
}

fn open_fds(pid: u32) -> Option<usize> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count())
}

fn sha256_hex(text: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// A sha256-shaped image ID that changes with the image, as a real runtime's would.
fn image_id(image: &str) -> String {
    let repo = image.rsplit_once(':').map_or(image, |(repo, _)| repo);
    format!("{repo}@sha256:{}", sha256_hex(image))
}

/// What the kubelet reports once every container of the spec runs its image.
fn running_status(pod: &Pod) -> Option<Value> {
    let spec = pod.spec.as_ref()?;
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let statuses: Vec<Value> = spec
        .containers
        .iter()
        .map(|c| {
            let image = c.image.clone().unwrap_or_default();
            json!({
                "name": c.name, "image": image, "imageID": image_id(&image),
                "ready": true, "started": true, "restartCount": 0,
                "containerID": format!("containerd://{}", sha256_hex(&format!("{}/{}/{image}", pod.name_any(), c.name))),
                "state": {"running": {"startedAt": now}},
            })
        })
        .collect();
    Some(json!({"status": {
        "phase": "Running", "hostIP": "127.0.0.1", "podIP": "127.0.0.1", "startTime": now,
        "conditions": [
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
            {"type": "Ready", "status": "True", "lastTransitionTime": now},
        ],
        "containerStatuses": statuses,
    }}))
}

/// Whether the pod's reported containers run what its spec names.
fn runs_its_spec(pod: &Pod) -> bool {
    let (Some(spec), Some(status)) = (pod.spec.as_ref(), pod.status.as_ref()) else {
        return false;
    };
    let statuses = status.container_statuses.as_deref().unwrap_or_default();
    spec.containers.iter().all(|c| {
        statuses.iter().any(|s| {
            s.name == c.name
                && Some(&s.image) == c.image.as_ref()
                && s.image_id == image_id(&s.image)
        })
    })
}

/// Plays the kubelet for the namespace's pods: any pod not running its spec's images is
/// reported running them.
fn play_kubelet(client: Client) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<Pod> = Api::namespaced(client, NAMESPACE);
        let stream = watcher(api.clone(), watcher::Config::default())
            .default_backoff()
            .applied_objects();
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            let Ok(pod) = item else { continue };
            if pod.metadata.deletion_timestamp.is_some() || runs_its_spec(&pod) {
                continue;
            }
            if let Some(status) = running_status(&pod) {
                let _ = api
                    .patch_status(
                        &pod.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&status),
                    )
                    .await;
            }
        }
    })
}

fn sidecarset(image: &str) -> Result<SidecarSet> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "SidecarSet",
        "metadata": {"name": SET},
        "spec": {
            "selector": {"matchLabels": {"app": "soak"}},
            "namespace": NAMESPACE,
            "updateStrategy": {"type": "RollingUpdate", "maxUnavailable": 5},
            "containers": [{
                "name": "agent", "image": image,
                "env": [{"name": "AGENT_MODE", "value": "soak"}],
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
            }],
        }
    }))?)
}

fn app_pod() -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"generateName": "web-", "labels": {"app": "soak"}},
        "spec": {"containers": [{"name": "web", "image": APP_IMAGE}]}
    }))?)
}

fn image_pull_job(n: usize) -> Result<ImagePullJob> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
        "metadata": {"name": format!("soak-{n}"), "namespace": NAMESPACE},
        "spec": {
            "image": format!("registry.local/soak/cache:{n}"),
            "parallelism": 5,
            "completionPolicy": {"type": "Always", "ttlSecondsAfterFinished": 10},
        }
    }))?)
}

/// Creates a pod through the webhook; `Ok(false)` while the webhook is not injecting yet.
async fn create_injected(pods: &Api<Pod>) -> Result<bool> {
    let created = pods.create(&PostParams::default(), &app_pod()?).await?;
    if created.annotations().contains_key(SIDECARSET_INJECTED_LIST) {
        return Ok(true);
    }
    pods.delete(&created.name_any(), &DeleteParams::default())
        .await?;
    Ok(false)
}

/// Polls until `name` is gone (a SidecarSet may carry the manager's finalizer a moment).
async fn wait_deleted(sets: &Api<SidecarSet>, name: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while sets.get_opt(name).await?.is_some() {
        if Instant::now() > deadline {
            return Err(format!("SidecarSet {name} still there 60 s after its deletion").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

struct Sample {
    minute: u64,
    rss: f64,
    peak: f64,
    fds: usize,
}

async fn soak(minutes: usize, nodes: usize, pods_wanted: usize) -> Result<()> {
    println!("soak: {minutes} min of churn, {nodes} nodes, {pods_wanted} pods");
    let cp = ControlPlane::start("kruise-rs-soak-")?;
    cp.install_crds(Crds::Generated)?;
    let client = cp.client().await?;
    create_namespace(&client, "kruise-system", &[]).await?;
    create_namespace(&client, NAMESPACE, &[]).await?;
    create_ready_nodes(&client, nodes, &BTreeMap::new(), 16).await?;

    let webhook = free_loopback_port()?;
    let log = tempfile::NamedTempFile::new()?;
    // `MANAGER_WRAPPER=heaptrack` (any command taking the program as its first argument) runs
    // the manager under a profiler, to see what a growth is made of; the RSS and descriptor
    // figures are then the wrapper's process's.
    let mut command = match std::env::var("MANAGER_WRAPPER")
        .ok()
        .filter(|w| !w.is_empty())
    {
        Some(wrapper) => {
            let mut c = Command::new(wrapper);
            c.arg(env!("CARGO_BIN_EXE_kruise-rs"));
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_kruise-rs")),
    };
    let manager = ChildGuard::spawn(
        command
            .arg("manager")
            .arg("--kubeconfig")
            .arg(cp.kubeconfig())
            .args(["--probe-addr", "127.0.0.1:0"])
            .args(["--webhook-addr", &webhook.to_string()])
            .args(["--webhook-url", &format!("https://{webhook}")])
            .args(["--nodeimage-creation-delay", "0"])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log.reopen()?),
    )?;
    let pid = manager.id();

    let sets: Api<SidecarSet> = Api::all(client.clone());
    let mut version = 1;
    let started = Instant::now();
    // Until the apiserver calls the manager's webhooks, a SidecarSet is stored undefaulted and
    // pods are admitted without anyone asking: a SidecarSet that comes back without its hash was
    // not seen by the webhook, and pods created then would count as lost (the first runs'
    // "lost" pods, all within 0.25 s of the start).
    let mut undefaulted = 0;
    loop {
        let created = sets
            .create(
                &PostParams::default(),
                &sidecarset(&format!("{AGENT}:{version}"))?,
            )
            .await;
        match created {
            Ok(set) if set.annotations().contains_key(SIDECARSET_HASH) => break,
            Ok(_) => {
                undefaulted += 1;
                sets.delete(SET, &DeleteParams::default()).await?;
                wait_deleted(&sets, SET).await?;
            }
            Err(e) if started.elapsed() < Duration::from_secs(120) => {
                let _ = e;
            }
            Err(e) => return Err(format!("the webhooks never admitted the SidecarSet: {e}").into()),
        }
        if started.elapsed() > Duration::from_secs(120) {
            return Err("the webhooks never defaulted the SidecarSet within 120 s".into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "the SidecarSet was stored undefaulted (the webhooks not called yet) {undefaulted} times \
         before the webhooks answered, {:.1} s after the manager started",
        started.elapsed().as_secs_f64()
    );
    let kubelet = play_kubelet(client.clone());
    let daemons = play_node_image_daemons(client.clone(), PlayedDaemons::default());
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);

    let start = Instant::now();
    let end = start + Duration::from_secs(60 * minutes as u64);
    // Jobs at 25 s, 55 s, ...: each report (every 60 s) falls 5 s after a job was created,
    // while its tags are in the NodeImages, instead of the moment before the manager adds them.
    let (mut next_rollout, mut next_job, mut next_report) = (
        start + ROLLOUT_EVERY,
        start + Duration::from_secs(25),
        start + REPORT_EVERY,
    );
    let (mut jobs_created, mut created, mut deleted, mut refused) =
        (0usize, 0usize, 0usize, 0usize);
    let mut samples = Vec::new();
    let jobs: Api<ImagePullJob> = Api::namespaced(client.clone(), NAMESPACE);
    let nodeimages: Api<NodeImage> = Api::all(client.clone());
    println!(" min   RSS MiB  peak MiB  fds  pods  jobs  tags  created  deleted  rollouts");
    while Instant::now() < end {
        let tick = Instant::now();
        for _ in 0..CHURN {
            match create_injected(&pods).await {
                Ok(true) => created += 1,
                // Each one said with its time, to tell a start-up race from a failure.
                Ok(false) => {
                    refused += 1;
                    eprintln!(
                        "{:.0?}: a pod admitted without its sidecar",
                        start.elapsed()
                    );
                }
                Err(e) => {
                    refused += 1;
                    eprintln!("{:.0?}: a pod refused: {e}", start.elapsed());
                }
            }
        }
        let mut existing = pods.list(&ListParams::default()).await?.items;
        existing.retain(|p| p.metadata.deletion_timestamp.is_none());
        if existing.len() > pods_wanted {
            existing.sort_by_key(|p| p.metadata.creation_timestamp.clone().map(|t| t.0));
            for pod in existing.iter().take(existing.len() - pods_wanted) {
                if pods
                    .delete(&pod.name_any(), &DeleteParams::default().grace_period(0))
                    .await
                    .is_ok()
                {
                    deleted += 1;
                }
            }
        }
        if Instant::now() >= next_rollout {
            version += 1;
            let patch = json!({"spec": {"containers": [{"name": "agent", "image": format!("{AGENT}:{version}"),
                "env": [{"name": "AGENT_MODE", "value": "soak"}],
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}});
            sets.patch(SET, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            next_rollout += ROLLOUT_EVERY;
        }
        if Instant::now() >= next_job {
            jobs.create(&PostParams::default(), &image_pull_job(jobs_created)?)
                .await?;
            jobs_created += 1;
            next_job += JOB_EVERY;
        }
        if Instant::now() >= next_report {
            let minute = start.elapsed().as_secs() / 60;
            let rss = rss_mib(pid, "VmRSS").unwrap_or(f64::NAN);
            let peak = rss_mib(pid, "VmHWM").unwrap_or(f64::NAN);
            let fds = open_fds(pid).unwrap_or(0);
            let job_count = jobs.list(&ListParams::default()).await?.items.len();
            let tags: usize = nodeimages
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .map(|ni| ni.spec.images.values().map(|i| i.tags.len()).sum::<usize>())
                .sum();
            println!(
                "{minute:>4}  {rss:>8.1}  {peak:>8.1}  {fds:>3}  {:>4}  {job_count:>4}  {tags:>4}  {created:>7}  {deleted:>7}  {:>8}",
                existing.len(),
                version - 1
            );
            samples.push(Sample {
                minute,
                rss,
                peak,
                fds,
            });
            next_report += REPORT_EVERY;
        }
        if let Some(rest) = TICK.checked_sub(tick.elapsed()) {
            tokio::time::sleep(rest).await;
        }
    }
    kubelet.abort();
    daemons.abort();

    let log_text = std::fs::read_to_string(log.path()).unwrap_or_default();
    let panics = log_text.lines().filter(|l| l.contains("panicked")).count();
    let errors = log_text.lines().filter(|l| l.contains("ERROR")).count();
    if let (Some(first), Some(last)) = (samples.first(), samples.last()) {
        println!(
            "soak: RSS {:.1} MiB at minute {} and {:.1} MiB at minute {} ({:.2}x), peak {:.1} MiB; \
             open files {} and {} ({:+}); {created} pods created, {deleted} deleted, {refused} \
             refused or not injected, {} rollouts, {jobs_created} ImagePullJobs; manager log: \
             {panics} panics, {errors} ERROR lines",
            first.rss,
            first.minute,
            last.rss,
            last.minute,
            last.rss / first.rss,
            last.peak,
            first.fds,
            last.fds,
            last.fds as i64 - first.fds as i64,
            version - 1,
        );
    }
    drop(manager);
    Ok(())
}
