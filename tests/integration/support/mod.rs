//! Harness for the integration tests: one real kube-apiserver + etcd per test process.
//!
//! * `KUBECONFIG` set: the tests use that cluster (a real one, kind, k3d, ...) and `kubectl` from
//!   `PATH`.
//! * Otherwise `tests/controlplane/start.sh` starts a loopback-only etcd + kube-apiserver built by
//!   `tests/controlplane/build.sh`, with a watchdog that tears it down once this process is gone
//!   (normal exit, panic or kill alike): the shared harness's
//!   [`ControlPlane`](crate::harness::controlplane::ControlPlane), as the benches start it.
//!
//! Every `#[tokio::test]` has its own runtime, so the process-wide state holds only plain data
//! (the kubeconfig); clients are built per call, on the caller's runtime.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::harness::controlplane::{ControlPlane, Crds, config_of};
use crate::harness::objects::create_namespace;
pub(crate) use crate::harness::process::{KillOnDrop, terminate};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::config::Kubeconfig;
use kube::{Api, Client, Config};
use serde::Deserialize;

pub(crate) mod cri_proxy;
pub(crate) mod daemon;
pub(crate) mod in_process_manager;
pub(crate) use crate::harness::played_kubelet as kubelet;
pub(crate) use crate::harness::shared::{unique_name, wait_for};
pub(crate) use in_process_manager::{RunningManager, manager_options, start_manager};
pub(crate) mod node;
pub(crate) mod scrape;
pub(crate) mod webhook;

/// Field manager of everything the harness applies.
pub(crate) const FIELD_MANAGER: &str = "kruise-rs-tests";
/// Label put on every namespace the harness creates (handy to clean up a shared cluster).
pub(crate) const TEST_LABEL: &str = "kruise-rs-tests";

/// How long CRDs may take to become `Established`.
const CRD_TIMEOUT: Duration = Duration::from_secs(60);

/// The cluster the tests run against; see [`cluster`].
pub(crate) struct TestCluster {
    kubeconfig_path: PathBuf,
    kubeconfig: Kubeconfig,
    kubectl: PathBuf,
    /// The control plane this process started itself (held for the process's life: it is in a
    /// static, never dropped; its watchdog stops it once the process is gone).
    local: Option<ControlPlane>,
}

static CLUSTER: OnceLock<Result<TestCluster, String>> = OnceLock::new();
static CONTROLLERS: OnceLock<()> = OnceLock::new();

/// How long the test controllers let a node leave a requested image unanswered. Tests that play
/// the daemon answer within a second; the timeout test waits this long.
pub(crate) const TEST_RESPONSE_TIMEOUT: Duration = Duration::from_secs(8);

/// The label the test controllers are confined to: Nodes, NodeImages and ImagePullJobs meant
/// for them carry it (any value; tests use a unique one). Objects other tests make for other
/// purposes (a NodeImage read back field by field, a job with no selector) are left alone.
pub(crate) const CONTROLLED_LABEL: &str = "kruise-rs-test";

/// The seed of a randomized test: the u64 in the environment variable `var` when set (to replay
/// a printed run), else one from the clock. Panics on a value that is not a u64.
pub(crate) fn seed_from_env(var: &str) -> u64 {
    match std::env::var(var) {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|e| panic!("{var}={text:?} is not a u64: {e}")),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_nanos() as u64,
    }
}

/// The controller settings every integration test runs with.
pub(crate) fn test_controller_options() -> kruise_rs::controllers::ControllerOptions {
    kruise_rs::controllers::ControllerOptions {
        nodeimage_creation_delay: Duration::ZERO,
        nodeimage_response_timeout: TEST_RESPONSE_TIMEOUT,
        label_selector: Some(CONTROLLED_LABEL.to_owned()),
        ..Default::default()
    }
}
static CRDS: tokio::sync::OnceCell<Result<(), String>> = tokio::sync::OnceCell::const_new();

/// The process-wide test cluster, started (and its CRDs installed) on first use.
///
/// Panics with the reason when the cluster cannot be started: tests fail, they never skip.
pub(crate) async fn cluster() -> &'static TestCluster {
    // Starting runs a short blocking script (seconds); other tests block on the same OnceLock
    // meanwhile. Storing the error means later tests fail at once instead of retrying.
    let cluster = match CLUSTER.get_or_init(start) {
        Ok(cluster) => cluster,
        Err(e) => panic!("{e}"),
    };
    cluster.install_crds().await;
    cluster
}

fn start() -> Result<TestCluster, String> {
    let kubectl_override = std::env::var_os("KUBECTL")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    match std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty()) {
        Some(value) => external(&value, kubectl_override),
        None => local(kubectl_override),
    }
}

/// Use the cluster `KUBECONFIG` points at.
fn external(value: &std::ffi::OsStr, kubectl: Option<PathBuf>) -> Result<TestCluster, String> {
    let kubeconfig = Kubeconfig::from_env()
        .map_err(|e| format!("reading KUBECONFIG={}: {e}", value.to_string_lossy()))?
        .ok_or_else(|| format!("KUBECONFIG={} names no file", value.to_string_lossy()))?;
    let paths: Vec<PathBuf> = std::env::split_paths(value)
        .filter(|p| !p.as_os_str().is_empty())
        .collect();
    let kubeconfig_path = match paths.as_slice() {
        [one] => one.clone(),
        // kubectl --kubeconfig and child processes want a single file: write the merged view.
        _ => {
            let dir = tempfile::Builder::new()
                .prefix("kruise-rs-kubeconfig-")
                .tempdir()
                .map_err(|e| format!("creating a temporary directory: {e}"))?
                .keep();
            let path = dir.join("kubeconfig");
            let yaml = serde_yaml::to_string(&kubeconfig)
                .map_err(|e| format!("serializing the merged KUBECONFIG: {e}"))?;
            std::fs::write(&path, yaml).map_err(|e| format!("writing {}: {e}", path.display()))?;
            path
        }
    };
    Ok(TestCluster {
        kubeconfig_path,
        kubeconfig,
        kubectl: kubectl.unwrap_or_else(|| PathBuf::from("kubectl")),
        local: None,
    })
}

/// The Kubernetes minor a local control plane runs: `KUBE_VERSION` (which start.sh and build.sh
/// read), default 1.36.
pub(crate) fn local_kube_minor() -> String {
    std::env::var("KUBE_VERSION")
        .ok()
        .map(|v| v.trim().trim_start_matches('v').to_owned())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "1.36".to_owned())
}

/// Start a private control plane with `tests/controlplane/start.sh` (it honours `KUBE_VERSION`
/// and `KRUISE_RS_APISERVER_ARGS` from this process's environment).
fn local(kubectl: Option<PathBuf>) -> Result<TestCluster, String> {
    let plane = ControlPlane::start("kruise-rs-cp-").map_err(|e| {
        format!(
            "starting the local control plane failed \
             (set KUBECONFIG to use an existing cluster instead): {e}"
        )
    })?;
    let stderr = plane.start_log();
    eprint!("{stderr}");
    // Which Kubernetes this run tests (start.sh reads /version): written past libtest's output
    // capture, so every run of the suite says it once, passing or not.
    if let Some(line) = stderr.lines().find(|l| l.contains("control plane ready")) {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "integration tests: {line}");
    }
    let kubeconfig_path = plane.kubeconfig().to_owned();
    let kubeconfig = Kubeconfig::read_from(&kubeconfig_path)
        .map_err(|e| format!("reading {}: {e}", kubeconfig_path.display()))?;
    Ok(TestCluster {
        kubeconfig_path,
        kubeconfig,
        kubectl: kubectl.unwrap_or_else(|| plane.kubectl_path()),
        local: Some(plane),
    })
}

impl TestCluster {
    /// Whether this process started the control plane (as opposed to using `KUBECONFIG`).
    pub(crate) fn is_local(&self) -> bool {
        self.local.is_some()
    }

    /// A kubeconfig file for the cluster, e.g. for a controller run as a child process.
    pub(crate) fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// A client configuration for the kubeconfig's current context.
    pub(crate) async fn config(&self) -> Config {
        config_of(self.kubeconfig.clone(), &self.kubeconfig_path)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// A fresh client bound to the calling test's runtime.
    pub(crate) async fn client(&self) -> Client {
        Client::try_from(self.config().await).unwrap_or_else(|e| {
            panic!(
                "building a client for {}: {e}",
                self.kubeconfig_path.display()
            )
        })
    }

    /// `kubectl --kubeconfig <this cluster>`; the binary is `$KUBECTL` if set, else the one built
    /// next to kube-apiserver (local) or `kubectl` from `PATH` (`KUBECONFIG`).
    pub(crate) fn kubectl(&self) -> Command {
        let mut cmd = Command::new(&self.kubectl);
        cmd.arg("--kubeconfig").arg(&self.kubeconfig_path);
        cmd
    }

    /// Server-side apply every CustomResourceDefinition in `crds/*.yaml` and wait until all are
    /// `Established`. Done once per process; later calls return at once.
    pub(crate) async fn install_crds(&self) {
        let result = CRDS.get_or_init(|| self.apply_crds()).await;
        if let Err(e) = result {
            panic!("{e}");
        }
    }

    async fn apply_crds(&self) -> Result<(), String> {
        let crds = repository_crds()?;
        if crds.is_empty() {
            return Ok(());
        }
        let api: Api<CustomResourceDefinition> = Api::all(self.client().await);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let mut names = Vec::with_capacity(crds.len());
        for (file, crd) in &crds {
            let name = crd.metadata.name.clone().ok_or_else(|| {
                format!("{}: a CustomResourceDefinition has no name", file.display())
            })?;
            api.patch(&name, &params, &Patch::Apply(crd))
                .await
                .map_err(|e| format!("applying CRD {name} from {}: {e}", file.display()))?;
            names.push(name);
        }
        let deadline = tokio::time::Instant::now() + CRD_TIMEOUT;
        for name in &names {
            loop {
                let crd = api
                    .get(name)
                    .await
                    .map_err(|e| format!("reading CRD {name}: {e}"))?;
                let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
                let condition = |type_: &str| conditions.iter().find(|c| c.type_ == type_);
                if condition("Established").is_some_and(|c| c.status == "True") {
                    break;
                }
                if let Some(c) = condition("NamesAccepted").filter(|c| c.status == "False") {
                    return Err(format!(
                        "CRD {name} was rejected: {}: {}",
                        c.reason.as_deref().unwrap_or_default(),
                        c.message.as_deref().unwrap_or_default()
                    ));
                }
                if tokio::time::Instant::now() >= deadline {
                    return Err(format!(
                        "CRD {name} not Established within {CRD_TIMEOUT:?}; conditions: {conditions:?}"
                    ));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// Starts the manager's controllers against this cluster, once per test process, on a
    /// runtime of their own (each test's runtime ends with the test). Tests play the node daemon
    /// and the kubelet themselves. Only one set of controllers may run per cluster, or they
    /// would compete for the same objects.
    pub(crate) fn start_controllers(&self) {
        CONTROLLERS.get_or_init(|| {
            let kubeconfig = self.kubeconfig.clone();
            let path = self.kubeconfig_path.clone();
            std::thread::Builder::new()
                .name("controllers".into())
                .spawn(move || {
                    let runtime = tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(2)
                        .enable_all()
                        .build()
                        .expect("a runtime for the controllers");
                    runtime.block_on(async move {
                        let config = config_of(kubeconfig, &path)
                            .await
                            .unwrap_or_else(|e| panic!("{e}"));
                        let client =
                            Client::try_from(config).expect("a client for the controllers");
                        kruise_rs::controllers::run(
                            client,
                            test_controller_options(),
                            std::future::pending(),
                        )
                        .await;
                    });
                })
                .expect("the controllers thread starts");
        });
    }

    /// Create a namespace named `prefix-<unique suffix>`.
    ///
    /// On a `KUBECONFIG` cluster it is deleted (in the background) when the guard drops; a local
    /// control plane has no namespace controller to finish deletions and is thrown away anyway.
    pub(crate) async fn namespace(&self, prefix: &str) -> TestNamespace {
        let name = unique_name(prefix);
        create_namespace(&self.client().await, &name, &[(TEST_LABEL, "true")])
            .await
            .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
        let cleanup = (!self.is_local()).then(|| {
            let mut cmd = self.kubectl();
            cmd.args([
                "delete",
                "namespace",
                &name,
                "--wait=false",
                "--ignore-not-found",
            ]);
            cmd
        });
        TestNamespace { name, cleanup }
    }
}

/// A namespace created by [`TestCluster::namespace`].
pub(crate) struct TestNamespace {
    name: String,
    cleanup: Option<Command>,
}

impl TestNamespace {
    pub(crate) fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        // Best effort and non-blocking: the test's runtime is about to go away, so no async work;
        // a detached thread waits for kubectl (the process outlives us if we exit first).
        if let Some(mut cmd) = self.cleanup.take() {
            std::thread::spawn(move || {
                let _ = cmd
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            });
        }
    }
}

/// The CustomResourceDefinitions in `crds/` at the repository root, with the file of each.
pub(crate) fn repository_crds() -> Result<Vec<(PathBuf, CustomResourceDefinition)>, String> {
    read_crds(&Path::new(env!("CARGO_MANIFEST_DIR")).join("crds"))
}

/// Every CustomResourceDefinition in the `*.yaml`/`*.yml` files of `dir` (missing dir: none).
fn read_crds(dir: &Path) -> Result<Vec<(PathBuf, CustomResourceDefinition)>, String> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("reading {}: {e}", dir.display())),
    };
    let mut files = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(|e| format!("reading {}: {e}", dir.display()))?
            .path();
        if path.is_file() && path.extension().is_some_and(|x| x == "yaml" || x == "yml") {
            files.push(path);
        }
    }
    files.sort();
    let mut crds = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .map_err(|e| format!("reading {}: {e}", file.display()))?;
        for document in serde_yaml::Deserializer::from_str(&text) {
            let value = serde_json::Value::deserialize(document)
                .map_err(|e| format!("parsing {}: {e}", file.display()))?;
            if value.get("kind").and_then(|k| k.as_str()) != Some("CustomResourceDefinition") {
                continue; // empty documents and other kinds
            }
            let crd = serde_json::from_value(value).map_err(|e| {
                format!(
                    "{}: not a valid CustomResourceDefinition: {e}",
                    file.display()
                )
            })?;
            crds.push((file.clone(), crd));
        }
    }
    Ok(crds)
}

/// Runs `cmd` with `input` on its standard input and returns its output.
pub(crate) fn run_with_stdin(mut cmd: Command, input: &str) -> std::process::Output {
    crate::harness::process::output_with_stdin(&mut cmd, input.as_bytes())
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A second, empty control plane (no CRDs) for tests that need a cluster in another state than
/// the shared one: the harness's [`ControlPlane`], panicking instead of returning errors.
/// Stopped when dropped; the start script's watchdog covers a crash.
pub(crate) struct ExtraControlPlane(ControlPlane);

impl ExtraControlPlane {
    pub(crate) fn start() -> Self {
        Self::start_with_apiserver_args(None)
    }

    /// Starts one and installs `crds/`, on a blocking thread (the start script takes seconds).
    pub(crate) async fn start_with_crds() -> Self {
        tokio::task::spawn_blocking(|| {
            let plane = Self::start();
            plane.install_crds();
            plane
        })
        .await
        .expect("join")
    }

    /// Starts one whose kube-apiserver gets `args` on top of start.sh's (through
    /// `KRUISE_RS_APISERVER_ARGS`, replacing what the suite's environment set there), e.g.
    /// `--feature-gates=WatchList=false`.
    pub(crate) fn start_with_apiserver_args(args: Option<&str>) -> Self {
        let plane = ControlPlane::start_with_apiserver_args("kruise-rs-extra-cp-", args)
            .unwrap_or_else(|e| panic!("starting an extra control plane failed: {e}"));
        ExtraControlPlane(plane)
    }

    pub(crate) fn kubeconfig_path(&self) -> &Path {
        self.0.kubeconfig()
    }

    /// `kubectl --kubeconfig <this control plane>`, with the kubectl built next to it.
    pub(crate) fn kubectl(&self) -> Command {
        self.0.kubectl()
    }

    /// Runs `kubectl ARGS` against this control plane with `input` on its stdin.
    pub(crate) fn kubectl_with_stdin(&self, args: &[&str], input: &str) -> std::process::Output {
        let mut cmd = self.kubectl();
        cmd.args(args);
        run_with_stdin(cmd, input)
    }

    /// The kubectl built next to this control plane's kube-apiserver.
    pub(crate) fn kubectl_path(&self) -> PathBuf {
        self.0.kubectl_path()
    }

    /// Installs `crds/` and waits until they are Established.
    pub(crate) fn install_crds(&self) {
        self.0
            .install_crds(Crds::Repository)
            .unwrap_or_else(|e| panic!("on the extra control plane: {e}"));
    }
}

/// What the apiserver answered a create: the status code, the body, and the admission
/// warnings (the `Warning` headers' texts), which kube's typed calls drop.
pub(crate) struct Created {
    pub code: u16,
    pub body: serde_json::Value,
    pub warnings: Vec<String>,
}

impl Created {
    /// The apiserver's message when it refused.
    pub(crate) fn message(&self) -> &str {
        self.body["message"].as_str().unwrap_or_default()
    }
}

/// POSTs `object` to the collection at `path` (`/api/v1/namespaces/ns/pods`; `?dryRun=All`
/// may follow) and returns the whole answer, warnings included.
pub(crate) async fn create_with_warnings(
    client: &Client,
    path: &str,
    object: &serde_json::Value,
) -> Created {
    let body = serde_json::to_vec(object).expect("an object encodes");
    let request = http::Request::post(path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(kube::client::Body::from(body))
        .expect("a request");
    let response = client
        .send(request)
        .await
        .unwrap_or_else(|e| panic!("POST {path}: {e}"));
    let code = response.status().as_u16();
    let warnings = response
        .headers()
        .get_all(http::header::WARNING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        // `299 - "text"` (RFC 7234), the text a quoted-string: `\"` and `\\` escaped.
        .map(|v| {
            let quoted = v
                .strip_prefix("299 - \"")
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(v);
            let mut text = String::with_capacity(quoted.len());
            let mut chars = quoted.chars();
            while let Some(c) = chars.next() {
                text.push(if c == '\\' {
                    chars.next().unwrap_or(c)
                } else {
                    c
                });
            }
            text
        })
        .collect();
    let bytes = response
        .into_body()
        .collect_bytes()
        .await
        .unwrap_or_else(|e| panic!("POST {path}: reading the answer: {e}"));
    let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    Created {
        code,
        body,
        warnings,
    }
}

/// Polls `events` (events.k8s.io) until one with `reason` is about an object named `name`, and
/// returns it.
pub(crate) async fn wait_for_event(
    events: &Api<k8s_openapi::api::events::v1::Event>,
    reason: &str,
    name: &str,
    timeout: Duration,
) -> k8s_openapi::api::events::v1::Event {
    wait_for(&format!("event {reason} about {name}"), timeout, || async {
        events
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
            })
    })
    .await
}

/// A minimal HTTP/1.1 GET against a loopback server: status code and body.
pub(crate) fn http_get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP response: {response:?}")))?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// Creates a Node with `labels` and a Ready condition, as the kubelet would report it.
pub(crate) async fn create_ready_node(
    client: &Client,
    name: &str,
    labels: BTreeMap<String, String>,
) {
    crate::harness::objects::create_ready_node(client, name, labels)
        .await
        .unwrap_or_else(|e| panic!("creating Ready Node {name}: {e}"));
}

/// A loopback port nothing listens on right now.
pub(crate) fn free_loopback_port() -> std::net::SocketAddr {
    crate::harness::process::free_loopback_port().unwrap_or_else(|e| panic!("{e}"))
}

/// A client for the cluster a kubeconfig file names.
pub(crate) async fn client_for(kubeconfig: &Path) -> Client {
    crate::harness::controlplane::client_for(kubeconfig)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

#[cfg(test)]
mod tests {
    use super::unique_name;

    #[test]
    fn unique_names_are_dns_labels() {
        let long = "X".repeat(100);
        for prefix in ["sidecar-set", "Image_Pull.Job", "", "--", long.as_str()] {
            let name = unique_name(prefix);
            assert!(name.len() <= 63, "{name}");
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            );
            assert!(!name.starts_with('-') && !name.ends_with('-'), "{name}");
        }
        assert_ne!(unique_name("a"), unique_name("a"));
        assert!(unique_name("image-pull").starts_with("image-pull-"));
    }
}
