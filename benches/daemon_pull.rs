//! The node daemon's memory and its pull time against the same pull issued straight to CRI, with
//! a real kube-apiserver, docker registry and containerd on loopback.
//!
//! `cargo bench --bench daemon_pull` (env `LAYER_MIB`, default 32; `ROUNDS`, default 5):
//! 1. builds (or reuses, from ~/.cache/kruise-rs/bench-images/) distinct single-layer images of
//!    LAYER_MIB random bytes each with umoci, so no two pulls share a blob, and pushes each to
//!    the node environment's open registry (tests/node/start.sh) as a repository of its own;
//! 2. starts a control plane (tests/controlplane/start.sh) and, for node `bench-node` (whose
//!    NodeImage has an empty spec), `kruise-rs daemon` (release build, the binary that also holds
//!    the manager) as the baseline: its idle RSS once `/readyz` answers and it has settled for
//!    3 s; stops it and starts `kruise-rs-daemon` (the daemon alone, what the chart runs) the
//!    same way: its idle RSS, printed with the ratio to the baseline's. The rest measures
//!    `kruise-rs-daemon`;
//! 3. ROUNDS rounds, each on fresh images, alternating which goes first: one `PullImage` straight
//!    to containerd's CRI socket, against one image added to the NodeImage spec, measured both
//!    inside the daemon (its `kruise_rs_daemon_pull_seconds` histogram) and end to end (spec
//!    patch until the status shows Succeeded, seen through a watch);
//! 4. 10 fresh images added in one patch: time until all are Succeeded, the daemon's RSS sampled
//!    every 20 ms meanwhile, and its VmHWM;
//! 5. idle RSS again at the end.
//!
//! `DAEMON_BIN` (a `kruise-rs-daemon` built another way, such as `cargo build --profile
//! release-daemon`) is measured instead of this build's, and this build's `kruise-rs-daemon`
//! becomes step 2's baseline.
//!
//! Figures are printed with their goals and ratios; nothing is asserted. The daemons log at
//! `DAEMON_RUST_LOG` (default `info`) into a temporary file, or into `DAEMON_LOG_FILE` (kept; the
//! second daemon's log replaces the first's); a failure prints its last lines.

use kruise_rs_testkit as harness;

use harness::bench::{Result, env_number, median};
use harness::controlplane::{ControlPlane, Crds};
use harness::process::{self, ChildGuard, run, tail};
use harness::procfs::{cpu_total, rss_mib, status_field};
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use k8s_cri::v1::PodSandboxConfig;
use kruise_rs_api::nodeimage::{ImagePullPhase, NodeImage};
use kruise_rs_daemon::cri::Cri;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

const NODE: &str = "bench-node";
/// Images pulled at once in step 4 (and the daemon's --max-concurrent-pulls).
const CONCURRENT: usize = 10;
const IDLE_RSS_GOAL_MIB: f64 = 10.0;
const PULL_RATIO_GOAL: f64 = 1.1;
/// Repository prefix of the bench images on the registry.
const REPO: &str = "kruise-rs-bench/img";
/// Longest wait for any one thing (a pull, readiness).
const WAIT: Duration = Duration::from_secs(300);
/// How long a ready daemon is left alone before its idle RSS is read.
const SETTLE: Duration = Duration::from_secs(3);

fn main() -> Result<()> {
    // Gigabytes of pulls are not something to start by accident.
    if !harness::bench::requested("daemon_pull") {
        return Ok(());
    }
    let layer_mib = env_number("LAYER_MIB", 32, 1)?;
    let rounds = env_number("ROUNDS", 5, 1)?;
    // Logs of the daemon, kept until the end so a failure can show their tail.
    let scratch = tempfile::Builder::new()
        .prefix("kruise-rs-bench-daemon-")
        .tempdir()?;
    let daemon_log = match std::env::var_os("DAEMON_LOG_FILE").filter(|v| !v.is_empty()) {
        Some(file) => PathBuf::from(file),
        None => scratch.path().join("daemon.log"),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(bench(layer_mib, rounds, &daemon_log));
    if let Err(err) = &result {
        eprintln!("daemon_pull failed: {err}");
        if let Some(tail) = tail(&[daemon_log], 40) {
            eprintln!("---- last lines of the daemon's log ----\n{tail}----");
        }
    }
    result
}

// --- environments ------------------------------------------------------------------------------

/// Registries and containerd from tests/node/start.sh, stopped when dropped.
struct NodeEnv {
    state: tempfile::TempDir,
    vars: HashMap<String, String>,
}

impl Drop for NodeEnv {
    fn drop(&mut self) {
        process::stop_owned("tests/node/stop.sh", self.state.path());
    }
}

impl NodeEnv {
    fn var(&self, key: &str) -> Result<&str> {
        self.vars
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| format!("tests/node/start.sh printed no {key}= line").into())
    }
}

fn start_node_env() -> Result<NodeEnv> {
    // Short: containerd's socket path under it must stay below 100 bytes.
    let started = process::start_owned("tests/node/start.sh", "kruise-rs-bench-node-", &[])
        .map_err(|e| format!("{e}(tests/setup.sh installs what it needs)"))?;
    Ok(NodeEnv {
        vars: process::parse_vars(&started.stdout),
        state: started.state,
    })
}

// --- test images -------------------------------------------------------------------------------

/// OCI layouts (tag `v1`), one per image, each a single layer holding `/data`: `layer_mib` MiB
/// of random bytes. Cached under KRUISE_RS_CACHE (default ~/.cache/kruise-rs)/bench-images/,
/// keyed by size and index; only missing ones are built. Returns the layouts and how many were
/// built now.
fn prepare_layouts(layer_mib: usize, count: usize) -> Result<(Vec<PathBuf>, usize)> {
    let cache = match std::env::var_os("KRUISE_RS_CACHE").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").ok_or("HOME is not set")?)
            .join(".cache/kruise-rs"),
    };
    let dir = cache.join(format!("bench-images/{layer_mib}mib"));
    std::fs::create_dir_all(&dir)?;
    let layouts: Vec<PathBuf> = (0..count).map(|i| dir.join(format!("img-{i}"))).collect();
    let missing: Vec<&PathBuf> = layouts
        .iter()
        .filter(|l| !l.join("index.json").exists())
        .collect();
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    for chunk in missing.chunks(workers) {
        std::thread::scope(|s| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|layout| s.spawn(|| build_layout(layout, layer_mib)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().map_err(|_| "an image build panicked")?)
                .collect::<Result<Vec<()>>>()
        })?;
    }
    let built = missing.len();
    Ok((layouts, built))
}

fn build_layout(layout: &Path, layer_mib: usize) -> Result<()> {
    let name = layout.file_name().ok_or("a layout needs a name")?;
    let partial = layout.with_file_name(format!(
        ".partial-{}-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&partial);
    std::fs::create_dir_all(&partial)?;
    let result = (|| -> Result<()> {
        let data = partial.join("data");
        let mut random = std::fs::File::open("/dev/urandom")?.take(layer_mib as u64 * 1024 * 1024);
        std::io::copy(&mut random, &mut std::fs::File::create(&data)?)?;
        let oci = partial.join("oci");
        let image = format!("{}:v1", oci.display());
        run(Command::new("umoci").arg("init").arg("--layout").arg(&oci))?;
        run(Command::new("umoci").args(["new", "--image", &image]))?;
        run(Command::new("umoci")
            .args(["insert", "--image", &image])
            .arg(&data)
            .arg("/data"))?;
        run(Command::new("umoci").arg("gc").arg("--layout").arg(&oci))?;
        let _ = std::fs::remove_dir_all(layout);
        std::fs::rename(&oci, layout)?;
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&partial);
    result.map_err(|e| format!("building {}: {e}", layout.display()).into())
}

/// Pushes each layout to `registry` as `REPO-<i>:v1`, a few at a time; returns the image names
/// (`registry/repo`, the NodeImage spec's keys).
fn push_images(registry: &str, layouts: &[PathBuf]) -> Result<Vec<String>> {
    let names: Vec<String> = (0..layouts.len())
        .map(|i| format!("{registry}/{REPO}-{i}"))
        .collect();
    let jobs: Vec<(&PathBuf, &String)> = layouts.iter().zip(&names).collect();
    for chunk in jobs.chunks(4) {
        std::thread::scope(|s| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|(layout, name)| {
                    s.spawn(move || {
                        run(Command::new("skopeo")
                            .args(["copy", "-q", "--dest-tls-verify=false"])
                            .arg(format!("oci:{}:v1", layout.display()))
                            .arg(format!("docker://{name}:v1")))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().map_err(|_| "a push panicked")?)
                .collect::<Result<Vec<()>, String>>()
        })?;
    }
    Ok(names)
}

// --- the daemon --------------------------------------------------------------------------------

/// What the RSS is made of (anonymous memory, mapped files: mostly the binary's own pages) and
/// the thread count, from `/proc/<pid>/status`.
fn breakdown(pid: u32) -> String {
    let field = |name| rss_mib(pid, name).map_or("?".into(), |v| format!("{v:.1}"));
    let threads = status_field(pid, "Threads:").unwrap_or_else(|| "?".into());
    format!(
        "anonymous {} MiB, file-backed {} MiB, {threads} threads",
        field("RssAnon:"),
        field("RssFile:")
    )
}

/// Starts `command` (a daemon binary, with its subcommand if any) with `args` plus a probe
/// address of its own unless `args` has one, logging into `log`; returns it once `/readyz`
/// answers 200, with how long that took in seconds.
async fn start_daemon(
    command: &mut Command,
    args: &[std::ffi::OsString],
    log: &Path,
) -> Result<(ChildGuard, f64)> {
    let probe = match args.iter().position(|a| a == "--probe-addr") {
        Some(i) => args[i + 1].to_string_lossy().into_owned(),
        None => {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            command.args(["--probe-addr", &format!("127.0.0.1:{port}")]);
            format!("127.0.0.1:{port}")
        }
    };
    let mut daemon = ChildGuard::spawn(
        command
            .args(args)
            .env(
                "RUST_LOG",
                std::env::var("DAEMON_RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log)?),
    )?;
    let t = Instant::now();
    loop {
        daemon
            .check_alive("the daemon")
            .map_err(|e| format!("{e} before it was ready"))?;
        if matches!(http_get(&probe, "/readyz").await, Ok((200, _))) {
            return Ok((daemon, t.elapsed().as_secs_f64()));
        }
        if t.elapsed() > Duration::from_secs(60) {
            return Err("the daemon's /readyz did not answer 200 within 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `GET path` over HTTP/1.0 (no chunked body) to the daemon's probe server.
async fn http_get(addr: &str, path: &str) -> Result<(u16, String)> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .map_err(|_| format!("GET {path} from {addr} timed out"))??;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("not an HTTP response: {response:?}"))?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// `kruise_rs_daemon_pull_seconds` `(sum, count)`.
async fn pull_histogram(addr: &str) -> Result<(f64, f64)> {
    let (_, body) = http_get(addr, "/metrics").await?;
    let value = |name: &str| {
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .ok_or_else(|| format!("/metrics has no {name}"))
    };
    Ok((
        value("kruise_rs_daemon_pull_seconds_sum")?,
        value("kruise_rs_daemon_pull_seconds_count")?,
    ))
}

/// Waits until the daemon has recorded `count` pulls; returns the histogram then.
async fn wait_pull_count(addr: &str, count: f64) -> Result<(f64, f64)> {
    let deadline = Instant::now() + WAIT;
    loop {
        let (sum, n) = pull_histogram(addr).await?;
        if n >= count {
            return Ok((sum, n));
        }
        if Instant::now() >= deadline {
            return Err(format!("the daemon recorded {n} pulls, not {count}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// --- NodeImage status, as seen through a watch ---------------------------------------------------

/// When each image's tag `v1` was first seen Succeeded or Failed (with the message) in the
/// NodeImage status.
type Finished = HashMap<String, (ImagePullPhase, Instant, Option<String>)>;

/// Watches NodeImage `NODE` and records finished tags; `synced` turns true once the watch has
/// listed.
fn track_status(
    api: Api<NodeImage>,
    synced: watch::Sender<bool>,
    finished: watch::Sender<Finished>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let config = watcher::Config::default().fields(&format!("metadata.name={NODE}"));
        let stream = watcher(api, config);
        let mut stream = std::pin::pin!(stream);
        while let Ok(Some(event)) = stream.try_next().await {
            let now = Instant::now();
            let object = match event {
                watcher::Event::Apply(o) | watcher::Event::InitApply(o) => o,
                watcher::Event::InitDone => {
                    synced.send_replace(true);
                    continue;
                }
                _ => continue,
            };
            let Some(status) = object.status else {
                continue;
            };
            finished.send_if_modified(|seen| {
                let mut changed = false;
                for (image, s) in &status.image_statuses {
                    for tag in s.tags.iter().filter(|t| t.tag == "v1") {
                        if matches!(
                            tag.phase,
                            ImagePullPhase::Succeeded | ImagePullPhase::Failed
                        ) && !seen.contains_key(image.as_str())
                        {
                            seen.insert(image.to_string(), (tag.phase, now, tag.message.clone()));
                            changed = true;
                        }
                    }
                }
                changed
            });
        }
    })
}

/// Waits until every one of `images` has finished; returns the latest finish. A failed pull is
/// an error with the daemon's message.
async fn wait_finished(
    finished: &mut watch::Receiver<Finished>,
    images: &[String],
) -> Result<Instant> {
    let all = tokio::time::timeout(
        WAIT,
        finished.wait_for(|seen| images.iter().all(|i| seen.contains_key(i))),
    )
    .await
    .map_err(|_| format!("{} not Succeeded within {WAIT:?}", images.join(", ")))?
    .map_err(|_| "the NodeImage watch ended")?;
    let mut last = None;
    for image in images {
        let (phase, at, message) = &all[image];
        if *phase != ImagePullPhase::Succeeded {
            return Err(
                format!("{image}:v1 {phase:?}: {}", message.as_deref().unwrap_or("")).into(),
            );
        }
        last = last.max(Some(*at));
    }
    last.ok_or_else(|| "no images to wait for".into())
}

async fn add_to_spec(api: &Api<NodeImage>, images: &[String]) -> Result<()> {
    let entries: serde_json::Map<String, serde_json::Value> = images
        .iter()
        .map(|image| {
            (
                image.clone(),
                json!({"tags": [{"tag": "v1", "version": 1, "imagePullPolicy": "Always"}]}),
            )
        })
        .collect();
    api.patch(
        NODE,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"images": entries}})),
    )
    .await?;
    Ok(())
}

// --- the bench ---------------------------------------------------------------------------------

async fn bench(layer_mib: usize, rounds: usize, daemon_log: &Path) -> Result<()> {
    let count = 2 * rounds + CONCURRENT;
    println!(
        "daemon pull: {count} images of one {layer_mib} MiB layer each, {rounds} rounds, \
         {CONCURRENT} concurrent"
    );

    // 1. Images and environments.
    let t = Instant::now();
    let (layouts, built) = prepare_layouts(layer_mib, count)?;
    let build_took = t.elapsed();
    let t = Instant::now();
    let node = start_node_env()?;
    let node_took = t.elapsed();
    let t = Instant::now();
    let images = push_images(node.var("REGISTRY")?, &layouts)?;
    // Write the pushed blobs back now, not during the measured pulls.
    run(&mut Command::new("sync"))?;
    println!(
        "  preparation: {built} of {count} images built in {:.1} s (the rest cached), node \
         environment started in {:.1} s, {count} images pushed in {:.1} s",
        build_took.as_secs_f64(),
        node_took.as_secs_f64(),
        t.elapsed().as_secs_f64()
    );
    let socket = PathBuf::from(node.var("CONTAINERD_SOCKET")?);
    let t = Instant::now();
    let cp = ControlPlane::start("kruise-rs-bench-cp-")?;
    cp.install_crds(Crds::Generated)?;
    println!(
        "  control plane started and CRDs installed in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let client = cp.client().await?;
    let api: Api<NodeImage> = Api::all(client.clone());
    let object: NodeImage = serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "NodeImage",
        "metadata": {"name": NODE},
        "spec": {"images": {}},
    }))?;
    api.create(&PostParams::default(), &object).await?;
    let (synced_tx, mut synced) = watch::channel(false);
    let (finished_tx, mut finished) = watch::channel(Finished::new());
    let tracker = track_status(api.clone(), synced_tx, finished_tx);
    let _stop_tracker = AbortOnDrop(tracker);

    // 2. The daemon, idle: first `kruise-rs daemon` (the combined binary, which also holds the
    // manager) as the baseline, stopped again; then `kruise-rs-daemon`, measured from here on.
    let mut daemon_args = vec![
        "--node-name".into(),
        NODE.into(),
        "--kubeconfig".into(),
        cp.kubeconfig().as_os_str().to_owned(),
        "--cri-socket".into(),
        socket.clone().into_os_string(),
        "--max-concurrent-pulls".into(),
        CONCURRENT.to_string().into(),
    ];
    let other_daemon = std::env::var_os("DAEMON_BIN").filter(|v| !v.is_empty());
    let (mut baseline, baseline_name) = match &other_daemon {
        Some(_) => (
            Command::new(env!("CARGO_BIN_EXE_kruise-rs-daemon")),
            "this build's `kruise-rs-daemon`",
        ),
        None => {
            let mut combined = Command::new(env!("CARGO_BIN_EXE_kruise-rs"));
            combined.arg("daemon");
            (combined, "`kruise-rs daemon`")
        }
    };
    let (combined, _) = start_daemon(&mut baseline, &daemon_args, daemon_log).await?;
    tokio::time::timeout(Duration::from_secs(60), synced.wait_for(|s| *s))
        .await
        .map_err(|_| "the bench's own NodeImage watch did not sync")??;
    tokio::time::sleep(SETTLE).await;
    let combined_rss = rss_mib(combined.id(), "VmRSS:").unwrap_or(f64::NAN);
    println!(
        "  idle RSS of {baseline_name} (baseline): {combined_rss:.1} MiB ({})",
        breakdown(combined.id())
    );
    drop(combined);

    let probe_port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let probe = format!("127.0.0.1:{probe_port}");
    daemon_args.extend(["--probe-addr".into(), probe.clone().into()]);
    let measured = match &other_daemon {
        Some(path) => std::path::PathBuf::from(path),
        None => std::path::PathBuf::from(env!("CARGO_BIN_EXE_kruise-rs-daemon")),
    };
    let (daemon, ready_in) =
        start_daemon(&mut Command::new(&measured), &daemon_args, daemon_log).await?;
    let pid = daemon.id();
    println!(
        "  {} ready in {ready_in:.2} s ({} bytes)",
        measured.display(),
        std::fs::metadata(&measured).map_or(0, |m| m.len())
    );
    tokio::time::sleep(SETTLE).await;
    let mib = |field| rss_mib(pid, field).unwrap_or(f64::NAN);
    let idle_rss = mib("VmRSS:");
    println!(
        "  idle RSS: {idle_rss:.1} MiB ({}; VmHWM so far {:.1} MiB)",
        breakdown(pid),
        mib("VmHWM:")
    );

    // 3. Direct against through the daemon, alternating, fresh images every round.
    let cri = Cri::connect(&socket)
        .await
        .map_err(|e| format!("connecting to {}: {e}", socket.display()))?;
    let cpu_before = cpu_total(pid);
    let (mut direct, mut inside, mut end_to_end) = (Vec::new(), Vec::new(), Vec::new());
    let mut status_calls = Vec::new();
    println!("  round   direct   (then ImageStatus)   daemon(inside)   daemon(end to end)   [s]");
    for round in 0..rounds {
        let a = &images[2 * round];
        let b = &images[2 * round + 1];
        let mut d = 0.0;
        let mut through = (0.0, 0.0);
        // Alternate which goes first, so neither always runs on a warmer machine.
        for direct_now in [round % 2 == 0, round % 2 != 0] {
            if direct_now {
                let t = Instant::now();
                cri.pull_image(&format!("{a}:v1"), None, PodSandboxConfig::default())
                    .await
                    .map_err(|e| format!("direct pull of {a}:v1: {e}"))?;
                d = t.elapsed().as_secs_f64();
                // The daemon asks for the image's status after each pull (for its image id):
                // part of its figure, not of this one; timed to show what it adds.
                let t = Instant::now();
                cri.image_status(&format!("{a}:v1"))
                    .await
                    .map_err(|e| format!("ImageStatus of {a}:v1: {e}"))?;
                status_calls.push(t.elapsed().as_secs_f64());
            } else {
                let (sum_before, count_before) = pull_histogram(&probe).await?;
                let t = Instant::now();
                add_to_spec(&api, std::slice::from_ref(b)).await?;
                let done = wait_finished(&mut finished, std::slice::from_ref(b)).await?;
                let e2e = done.duration_since(t).as_secs_f64();
                let (sum_after, _) = wait_pull_count(&probe, count_before + 1.0).await?;
                through = (sum_after - sum_before, e2e);
            }
        }
        println!(
            "  {:>5}   {d:>6.3}   {:>18.4}   {:>14.3}   {:>18.3}",
            round + 1,
            status_calls.last().copied().unwrap_or(f64::NAN),
            through.0,
            through.1
        );
        direct.push(d);
        inside.push(through.0);
        end_to_end.push(through.1);
    }
    let cpu_rounds = cpu_total(pid)
        .zip(cpu_before)
        .map(|(after, before)| after - before);
    let (md, mi, me) = (median(&direct), median(&inside), median(&end_to_end));
    println!(
        "  median  {md:>6.3}   {:>18.4}   {mi:>14.3}   {me:>18.3}   (daemon/direct: {:.3}x \
         inside, {:.3}x end to end)",
        median(&status_calls),
        mi / md,
        me / md
    );
    if let Some(cpu) = cpu_rounds {
        println!(
            "  daemon CPU time over the {rounds} rounds: {cpu:.2} s ({:.3} s per pull)",
            cpu / rounds as f64
        );
    }
    println!("  daemon RSS after the rounds: {:.1} MiB", mib("VmRSS:"));

    // 4. CONCURRENT pulls at once.
    let batch = &images[2 * rounds..];
    let (sum_before, count_before) = pull_histogram(&probe).await?;
    let cpu_before = cpu_total(pid);
    let t = Instant::now();
    add_to_spec(&api, batch).await?;
    let mut peak = 0.0_f64;
    let mut samples = 0usize;
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let done = loop {
        tick.tick().await;
        if let Some(rss) = rss_mib(pid, "VmRSS:") {
            peak = peak.max(rss);
            samples += 1;
        }
        let all_done = batch.iter().all(|i| finished.borrow().contains_key(i));
        if all_done {
            break wait_finished(&mut finished, batch).await?;
        }
        if t.elapsed() > WAIT {
            return Err(format!("{CONCURRENT} concurrent pulls not done within {WAIT:?}").into());
        }
    };
    let concurrent_took = done.duration_since(t).as_secs_f64();
    let (sum_after, _) = wait_pull_count(&probe, count_before + batch.len() as f64).await?;
    let cpu_concurrent = cpu_total(pid)
        .zip(cpu_before)
        .map(|(after, before)| after - before);
    let hwm = mib("VmHWM:");
    println!(
        "  {CONCURRENT} concurrent pulls: all Succeeded {concurrent_took:.2} s after the patch \
         ({:.0} MiB/s); inside the daemon {:.2} s per pull on average; daemon CPU {}",
        (batch.len() * layer_mib) as f64 / concurrent_took,
        (sum_after - sum_before) / batch.len() as f64,
        cpu_concurrent.map_or("unknown".into(), |c| format!("{c:.2} s")),
    );
    println!(
        "    daemon RSS: sampled peak {peak:.1} MiB ({samples} samples every 20 ms), VmHWM \
         {hwm:.1} MiB"
    );

    // 5. Idle again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle_after = mib("VmRSS:");
    println!(
        "  idle RSS after all pulls: {idle_after:.1} MiB ({})",
        breakdown(pid)
    );

    println!("summary (figures, not assertions):");
    println!(
        "  idle RSS at start          {idle_rss:>8.1} MiB   goal <= {IDLE_RSS_GOAL_MIB} MiB   \
         ratio {:.2}; {:.2}x {baseline_name}'s {combined_rss:.1} MiB",
        idle_rss / IDLE_RSS_GOAL_MIB,
        idle_rss / combined_rss
    );
    println!(
        "  idle RSS after pulls       {idle_after:>8.1} MiB   goal <= {IDLE_RSS_GOAL_MIB} MiB   \
         ratio {:.2}",
        idle_after / IDLE_RSS_GOAL_MIB
    );
    println!(
        "  pull inside the daemon     {:>8.3}x direct  goal <= {PULL_RATIO_GOAL}x   (medians \
         {mi:.3} s vs {md:.3} s)",
        mi / md
    );
    println!(
        "  pull end to end (NodeImage){:>8.3}x direct  informative (median {me:.3} s; \
         includes the daemon's status-write pacing)",
        me / md
    );
    println!(
        "  {CONCURRENT} concurrent pulls       {concurrent_took:>8.2} s      peak RSS sampled \
         {peak:.1} MiB, VmHWM {hwm:.1} MiB"
    );

    drop(daemon);
    Ok(())
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
