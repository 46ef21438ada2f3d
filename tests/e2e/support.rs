//! The real cluster the end-to-end tests run on, and kruise-rs installed on it with helm.
//!
//! `tests/cluster/e2e.sh` starts the cluster (`tests/cluster/start.sh`) and runs this binary
//! inside its network namespace with `KRUISE_RS_CLUSTER` (the cluster's env file),
//! `KRUISE_RS_PRODUCT_IMAGE` (the product image's OCI layout, `tests/cluster/image.sh`) and
//! `KRUISE_RS_HELM`. The first test to need kruise-rs pushes the images and installs the chart;
//! tests that only use it hold [`Installed`] (a shared lock), the ones that upgrade, uninstall
//! or kill it take the lock exclusively and leave it installed and ready again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::json;
use tokio::sync::{OnceCell, RwLock, RwLockReadGuard, RwLockWriteGuard};

pub(crate) use kruise_rs_testkit::shared::{unique_name, wait_for};

/// The chart's fixed names.
pub(crate) const RELEASE: &str = "kruise-rs";
pub(crate) const SYSTEM_NAMESPACE: &str = "kruise-system";
pub(crate) const MANAGER: &str = "kruise-rs-manager";
pub(crate) const DAEMON: &str = "kruise-rs-daemon";
pub(crate) const MUTATING_CONFIGURATION: &str = "kruise-rs-mutating-webhook-configuration";
/// The chart's default leader Lease, and the manager's lease duration.
pub(crate) const LEASE: &str = "kruise-rs-manager";
pub(crate) const LEASE_DURATION: Duration = Duration::from_secs(15);
/// Where the product image is pushed; tags [`FIRST_TAG`] and [`SECOND_TAG`] hold the same image.
pub(crate) const PRODUCT_REPOSITORY: &str = "kruise-rs/kruise-rs";
pub(crate) const FIRST_TAG: &str = "e2e-1";
pub(crate) const SECOND_TAG: &str = "e2e-2";
/// The test application images: busybox `sleep`, v2/v3 add a layer each (tests/node/images.sh).
pub(crate) const APP_REPOSITORY: &str = "e2e/app";

/// How long a real kubelet may take for what the tests wait on (pulls, restarts, rollouts).
pub(crate) const TIMEOUT: Duration = Duration::from_secs(180);

/// One node of the cluster (`NODE_i_*` in start.sh's env file).
pub(crate) struct ClusterNode {
    /// 1 for the node that hosts the control plane, then 2, 3 (`tests/cluster/node.sh` takes it).
    pub index: usize,
    pub name: String,
    /// Its containerd's socket, as seen from the tests.
    pub containerd_socket: PathBuf,
    /// Where its kubelet keeps the pods' logs (`/var/log/pods` on the node).
    pub pod_logs: PathBuf,
}

/// The cluster of `tests/cluster/start.sh`.
pub(crate) struct Cluster {
    pub registry: String,
    /// The open registry's log; its access-log lines show every fetch.
    pub registry_log: PathBuf,
    /// The htpasswd registry (`127.0.0.1:PORT`) containerd also pulls from, and its account.
    pub auth_registry: String,
    pub auth_user: String,
    pub auth_password: String,
    pub node_name: String,
    pub containerd_socket: PathBuf,
    /// Every node, node 1 (`node_name`) first: one unless started with `NODES=3`.
    pub nodes: Vec<ClusterNode>,
    /// containerd's registry hosts directory: a `<host:port>/hosts.toml` per registry.
    pub certs_d: PathBuf,
    /// start.sh's STATE_DIR: the pid files, the logs (`log/pods`: the kubelet's pod logs).
    pub state_dir: PathBuf,
    kubeconfig: PathBuf,
    helm: PathBuf,
    test_images: PathBuf,
    product_image: String,
    /// A config, not a client: a client's connection pool belongs to the runtime of the test
    /// that made it, and every `#[tokio::test]` has its own.
    config: Config,
}

static CLUSTER: OnceCell<Cluster> = OnceCell::const_new();
static INSTALLED: OnceCell<()> = OnceCell::const_new();
/// Shared by tests that use the installed system, exclusive for the ones that disturb it.
static SYSTEM: RwLock<()> = RwLock::const_new(());

fn required_env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: the end-to-end suite runs on a real cluster, inside its network \
             namespace; run it with `make test-e2e` (tests/cluster/e2e.sh), which starts one"
        )
    })
}

/// The cluster, read from `KRUISE_RS_CLUSTER`; panics (never skips) when it is missing.
pub(crate) async fn cluster() -> &'static Cluster {
    CLUSTER.get_or_init(connect).await
}

async fn connect() -> Cluster {
    let env_file = PathBuf::from(required_env("KRUISE_RS_CLUSTER"));
    let text = std::fs::read_to_string(&env_file)
        .unwrap_or_else(|e| panic!("reading {}: {e}", env_file.display()));
    let vars: BTreeMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
    let var = |name: &str| {
        vars.get(name)
            .map(|v| v.to_string())
            .unwrap_or_else(|| panic!("{} has no {name}", env_file.display()))
    };
    let kubeconfig = PathBuf::from(var("KUBECONFIG"));
    let parsed = Kubeconfig::read_from(&kubeconfig).expect("the cluster's kubeconfig");
    let config = Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default())
        .await
        .expect("a client config from the cluster's kubeconfig");
    let client = Client::try_from(config.clone()).expect("a client");
    if let Err(e) = client.apiserver_version().await {
        panic!(
            "the cluster's apiserver does not answer ({e}): is this process inside the cluster's \
             network namespace (tests/cluster/e2e.sh runs it there)?"
        );
    }
    let count: usize = var("NODES")
        .parse()
        .unwrap_or_else(|e| panic!("{} has a NODES that is no count: {e}", env_file.display()));
    let nodes = (1..=count)
        .map(|i| ClusterNode {
            index: i,
            name: var(&format!("NODE_{i}_NAME")),
            containerd_socket: PathBuf::from(var(&format!("NODE_{i}_CONTAINERD_SOCKET"))),
            // start.sh bind-mounts these over each node's /var/log.
            pod_logs: match i {
                1 => PathBuf::from(var("STATE_DIR")).join("log/pods"),
                i => PathBuf::from(var("STATE_DIR")).join(format!("node-{i}/log/pods")),
            },
        })
        .collect();
    Cluster {
        nodes,
        registry: var("REGISTRY"),
        registry_log: PathBuf::from(var("REGISTRY_LOG")),
        auth_registry: var("AUTH_REGISTRY"),
        auth_user: var("AUTH_USER"),
        auth_password: var("AUTH_PASSWORD"),
        node_name: var("NODE_NAME"),
        containerd_socket: PathBuf::from(var("CONTAINERD_SOCKET")),
        certs_d: PathBuf::from(var("CERTS_D")),
        state_dir: PathBuf::from(var("STATE_DIR")),
        test_images: PathBuf::from(var("IMAGES")),
        kubeconfig,
        helm: PathBuf::from(required_env("KRUISE_RS_HELM")),
        product_image: required_env("KRUISE_RS_PRODUCT_IMAGE"),
        config,
    }
}

/// kruise-rs installed and ready, held for the test's duration (others may hold it too).
pub(crate) struct Installed {
    pub cluster: &'static Cluster,
    _guard: RwLockReadGuard<'static, ()>,
}

/// kruise-rs installed and ready, held by this test alone: it may upgrade, kill or uninstall it,
/// and must leave it installed and ready (see [`Cluster::install`]).
pub(crate) struct Exclusive {
    pub cluster: &'static Cluster,
    _guard: RwLockWriteGuard<'static, ()>,
}

pub(crate) async fn installed() -> Installed {
    let cluster = cluster().await;
    let guard = SYSTEM.read().await;
    INSTALLED.get_or_init(|| cluster.first_install()).await;
    Installed {
        cluster,
        _guard: guard,
    }
}

pub(crate) async fn exclusive() -> Exclusive {
    let cluster = cluster().await;
    let guard = SYSTEM.write().await;
    INSTALLED.get_or_init(|| cluster.first_install()).await;
    Exclusive {
        cluster,
        _guard: guard,
    }
}

impl Cluster {
    pub(crate) fn client(&self) -> Client {
        Client::try_from(self.config.clone()).expect("a client")
    }

    /// Lets the nodes' containerd pull from `registry` (a slow link or proxy a test runs in
    /// front of the cluster's registry) over plain HTTP: its `certs.d` entry.
    pub(crate) fn add_plain_http_registry(&self, registry: impl std::fmt::Display) {
        let host_dir = self.certs_d.join(registry.to_string());
        std::fs::create_dir_all(&host_dir).expect("certs.d entry");
        std::fs::write(
            host_dir.join("hosts.toml"),
            format!(
                "server = \"http://{registry}\"\n\n[host.\"http://{registry}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
            ),
        )
        .expect("writing hosts.toml");
    }

    /// A client that impersonates `user` (the cluster's admin may).
    pub(crate) fn client_as(&self, user: &str) -> Client {
        let mut config = self.config.clone();
        config.auth_info.impersonate = Some(user.to_owned());
        Client::try_from(config).expect("an impersonating client")
    }

    pub(crate) fn app_image(&self, tag: &str) -> String {
        format!("{}/{APP_REPOSITORY}:{tag}", self.registry)
    }

    /// The test application image `tag` (v1, v2, v3) in its OCI layout, for [`skopeo_copy`].
    pub(crate) fn test_image_source(&self, tag: &str) -> String {
        format!("oci:{}:{tag}", self.test_images.display())
    }

    pub(crate) fn product_image(&self, tag: &str) -> String {
        format!("{}/{PRODUCT_REPOSITORY}:{tag}", self.registry)
    }

    async fn first_install(&self) {
        for tag in [FIRST_TAG, SECOND_TAG] {
            skopeo_copy(&self.product_image, &self.product_image(tag));
        }
        for tag in ["v1", "v2", "v3"] {
            skopeo_copy(&self.test_image_source(tag), &self.app_image(tag));
        }
        // A later test process on the same cluster (e2e.sh runs the chaos round after the
        // suite) finds the release the suite installed and left at the first tag.
        if self.release_exists() {
            self.wait_ready(FIRST_TAG).await;
        } else {
            self.install(FIRST_TAG).await;
        }
    }

    fn release_exists(&self) -> bool {
        self.helm_output(&["status", RELEASE]).status.success()
    }

    /// `helm install` the chart with the image `tag` (only the image values set), then wait
    /// for [`Cluster::wait_ready`].
    pub(crate) async fn install(&self, tag: &str) {
        self.helm(&[
            "install",
            RELEASE,
            chart_dir().to_str().expect("UTF-8 path"),
            "--set",
            &format!("image.repository={}/{PRODUCT_REPOSITORY}", self.registry),
            "--set",
            &format!("image.tag={tag}"),
        ]);
        self.wait_ready(tag).await;
    }

    /// Runs helm against the cluster; returns stdout, panics with the output on failure.
    pub(crate) fn helm(&self, args: &[&str]) -> String {
        let out = self.helm_output(args);
        assert!(
            out.status.success(),
            "helm {} failed ({}):\n{}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn helm_output(&self, args: &[&str]) -> std::process::Output {
        let homes = tempfile::tempdir().expect("temporary directory");
        Command::new(&self.helm)
            .args(args)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .env("HELM_CACHE_HOME", homes.path().join("cache"))
            .env("HELM_CONFIG_HOME", homes.path().join("config"))
            .env("HELM_DATA_HOME", homes.path().join("data"))
            .output()
            .unwrap_or_else(|e| panic!("helm {}: {e}", args.join(" ")))
    }

    /// Both workloads rolled out with image `tag` and ready (their real readiness probes), the
    /// node's NodeImage created and the mutating configuration holding a caBundle.
    pub(crate) async fn wait_ready(&self, tag: &str) {
        let image = self.product_image(tag);
        let deployments: Api<Deployment> = Api::namespaced(self.client(), SYSTEM_NAMESPACE);
        let daemonsets: Api<DaemonSet> = Api::namespaced(self.client(), SYSTEM_NAMESPACE);
        let pods: Api<Pod> = Api::namespaced(self.client(), SYSTEM_NAMESPACE);
        wait_for(
            "the manager Deployment and daemon DaemonSet ready",
            TIMEOUT,
            || async {
                let deployment = deployments.get(MANAGER).await.ok()?;
                let status = deployment.status.as_ref()?;
                let want = deployment.spec.as_ref()?.replicas.unwrap_or(1);
                let rolled = status.observed_generation == deployment.metadata.generation
                    && status.updated_replicas == Some(want)
                    && status.ready_replicas == Some(want)
                    && status.replicas == Some(want);
                let daemonset = daemonsets.get(DAEMON).await.ok()?;
                let ds = daemonset.status.as_ref()?;
                // A daemon on every node.
                let nodes = i32::try_from(self.nodes.len()).expect("a few nodes");
                let daemon_rolled = ds.observed_generation == daemonset.metadata.generation
                    && ds.desired_number_scheduled == nodes
                    && ds.updated_number_scheduled == Some(nodes)
                    && ds.number_ready == nodes
                    && ds.number_available == Some(nodes);
                // Old pods may still be terminating after a rollout: all running ones are `tag`'s.
                let running = pods.list(&Default::default()).await.ok()?;
                let stale = running.items.iter().any(|p| {
                    p.spec.as_ref().is_some_and(|s| {
                        s.containers
                            .iter()
                            .any(|c| c.image.as_deref() != Some(&image))
                    })
                });
                (rolled && daemon_rolled && !stale).then_some(())
            },
        )
        .await;
        // Each node's NodeImage, which the manager creates once the node is 30 s old
        // (--nodeimage-creation-delay): ImagePullJobs and pre-download select nodes through it.
        let nodeimages: Api<kruise_rs_api::NodeImage> = Api::all(self.client());
        for node in &self.nodes {
            wait_for(&format!("{}'s NodeImage", node.name), TIMEOUT, || async {
                nodeimages.get_opt(&node.name).await.ok().flatten()
            })
            .await;
        }
        let configurations: Api<MutatingWebhookConfiguration> = Api::all(self.client());
        wait_for("the mutating webhooks with a caBundle", TIMEOUT, || async {
            let configuration = configurations.get(MUTATING_CONFIGURATION).await.ok()?;
            let webhooks = configuration.webhooks?;
            (!webhooks.is_empty()
                && webhooks.iter().all(|w| {
                    w.client_config
                        .ca_bundle
                        .as_ref()
                        .is_some_and(|b| !b.0.is_empty())
                }))
            .then_some(())
        })
        .await;
    }

    /// `tests/cluster/node.sh STATE_DIR ACTION INDEX`: node `index` goes `down`, comes `up`,
    /// is `cut` off the network or `mend`ed; panics with the script's output when it fails.
    pub(crate) async fn node_action(&self, action: &str, index: usize) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cluster/node.sh");
        let state = self.state_dir.clone();
        let (action, index) = (action.to_owned(), index.to_string());
        let out = tokio::task::spawn_blocking(move || {
            Command::new(script)
                .arg(&state)
                .arg(&action)
                .arg(&index)
                .output()
                .map(|out| (action, index, out))
        })
        .await
        .expect("the node.sh task")
        .expect("running tests/cluster/node.sh");
        let (action, index, out) = out;
        assert!(
            out.status.success(),
            "node.sh {action} {index} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// [`restart_process`] without blocking the runtime.
    pub(crate) async fn restart(&self, process: &str) -> Result<String, String> {
        let (state, process) = (self.state_dir.clone(), process.to_owned());
        tokio::task::spawn_blocking(move || restart_process(&state, &process))
            .await
            .expect("the restart.sh task")
    }

    /// A fresh namespace with `labels`. Left in place: the cluster goes away after the suite, and
    /// a later test's pods never depend on an earlier one's being gone.
    pub(crate) async fn namespace(&self, prefix: &str, labels: serde_json::Value) -> TestNamespace {
        let name = unique_name(prefix);
        let namespaces: Api<Namespace> = Api::all(self.client());
        let ns: Namespace = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels}
        }))
        .expect("a namespace");
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
        // Pods need the namespace's default ServiceAccount, which the controller-manager adds.
        let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(self.client(), &name);
        wait_for(
            "the namespace's default ServiceAccount",
            TIMEOUT,
            || async { accounts.get_opt("default").await.ok().flatten() },
        )
        .await;
        TestNamespace { name }
    }
}

/// The replica holding the leader Lease (its pod's name), if any.
pub(crate) async fn lease_holder(client: &Client) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    leases
        .get_opt(LEASE)
        .await
        .ok()??
        .spec?
        .holder_identity
        .filter(|h| !h.is_empty())
}

/// The live manager pods (not terminating).
pub(crate) async fn manager_pods(client: &Client) -> Option<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let list = pods
        .list(&ListParams::default().labels("app.kubernetes.io/component=manager"))
        .await
        .ok()?;
    Some(
        list.items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect(),
    )
}

/// Whether a log line of manager pod `pod` says it lost the Lease, in the pod logs under
/// `log_dir` (a node's [`ClusterNode::pod_logs`]).
pub(crate) fn logged_lost_lease(log_dir: &Path, pod: &str) -> bool {
    manager_logged_at(log_dir, pod, "lost the leader lease").is_some()
}

/// When the kubelet recorded the first line of kruise-system pod `pod`'s logs under `log_dir` (a
/// node's [`ClusterNode::pod_logs`]) that holds `text`.
pub(crate) fn manager_logged_at(
    log_dir: &Path,
    pod: &str,
    text: &str,
) -> Option<k8s_openapi::jiff::Timestamp> {
    let prefix = format!("{SYSTEM_NAMESPACE}_{pod}_");
    let mut stack: Vec<PathBuf> = std::fs::read_dir(log_dir)
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect();
    let mut first = None;
    while let Some(path) = stack.pop() {
        if path.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&path) {
                stack.extend(entries.flatten().map(|e| e.path()));
            }
            continue;
        }
        let Ok(text_of_file) = std::fs::read_to_string(&path) else {
            continue;
        };
        // CRI log lines: "<RFC 3339 time> <stream> <tag> <message>".
        let at = text_of_file
            .lines()
            .filter(|l| l.contains(text))
            .find_map(|l| l.split(' ').next()?.parse().ok());
        first = match (first, at) {
            (Some(a), Some(b)) => Some(std::cmp::min(a, b)),
            (a, b) => a.or(b),
        };
    }
    first
}

pub(crate) struct TestNamespace {
    pub name: String,
}

/// Restarts one process of the cluster in `state_dir` with tests/cluster/restart.sh (`kubelet`,
/// `kube-apiserver`, `containerd-3`: node 3's containerd); returns once the new process answers,
/// with the seconds it was down as restart.sh prints them.
pub(crate) fn restart_process(state_dir: &Path, process: &str) -> Result<String, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cluster/restart.sh");
    kruise_rs_testkit::process::stdout_of(Command::new(script).arg(state_dir).arg(process))
}

pub(crate) fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/chart/kruise-rs")
}

/// Copies an image to the cluster's (plain HTTP, loopback) registry.
pub(crate) fn skopeo_copy(source: &str, destination: &str) {
    skopeo_copy_as(None, source, destination);
}

/// [`skopeo_copy`] to a registry that wants `user:password` (the htpasswd one), or to the open
/// one with `None`.
pub(crate) fn skopeo_copy_as(credentials: Option<&str>, source: &str, destination: &str) {
    let mut command = Command::new("skopeo");
    command.args(["copy", "-q", "--dest-tls-verify=false"]);
    if let Some(credentials) = credentials {
        command.arg(format!("--dest-creds={credentials}"));
    }
    let out = command
        .arg(source)
        .arg(format!("docker://{destination}"))
        .output()
        .expect("running skopeo");
    assert!(
        out.status.success(),
        "skopeo copy {source} {destination}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The digest the registry serves for `image` (`REGISTRY/REPO:TAG`), as `sha256:...`.
pub(crate) fn registry_digest(image: &str) -> String {
    let out = Command::new("skopeo")
        .args(["inspect", "--tls-verify=false", "--format", "{{.Digest}}"])
        .arg(format!("docker://{image}"))
        .output()
        .expect("running skopeo");
    assert!(
        out.status.success(),
        "skopeo inspect {image}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A CRI `ImageService` client for containerd's socket (connects on first use).
pub(crate) fn image_client(
    socket: &Path,
) -> k8s_cri::v1::image_service_client::ImageServiceClient<tonic::transport::Channel> {
    let socket = socket.to_path_buf();
    let channel = tonic::transport::Endpoint::from_static("http://[::]")
        .connect_with_connector_lazy(tower::service_fn(move |_: tonic::transport::Uri| {
            let socket = socket.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(socket).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }));
    k8s_cri::v1::image_service_client::ImageServiceClient::new(channel)
}

/// Waits until `check` accepts the pods of the Deployment `app` (`count` of them, none going),
/// each seen as `describe` says; on timeout, panics with how they were seen last.
pub(crate) async fn wait_app_pods(
    pods: &Api<Pod>,
    app: &str,
    count: usize,
    what: &str,
    describe: impl Fn(&Pod) -> String,
    check: impl Fn(&[Pod]) -> bool,
) -> Vec<Pod> {
    let selector = ListParams::default().labels(&format!("app={app}"));
    let last = std::sync::Mutex::new(String::new());
    let (check, describe, last_ref, selector) = (&check, &describe, &last, &selector);
    let found = tokio::time::timeout(
        TIMEOUT,
        wait_for(what, TIMEOUT * 2, || async move {
            let mut list: Vec<Pod> = pods
                .list(selector)
                .await
                .ok()?
                .items
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            list.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
            *last_ref.lock().expect("lock") =
                list.iter().map(describe).collect::<Vec<_>>().join("; ");
            (list.len() == count && check(&list)).then_some(list)
        }),
    )
    .await;
    found.unwrap_or_else(|_| {
        panic!(
            "timed out after {TIMEOUT:?} waiting for {what}; last seen: {}",
            last.lock().expect("lock")
        )
    })
}
