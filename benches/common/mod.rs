//! What the benches share: a loopback control plane of their own, a client, child processes
//! that die with the bench, Ready Nodes, and /proc memory figures. Included with `mod common;`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, Config};
use serde_json::json;

pub type Result<T, E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

/// A control plane started by `tests/controlplane/start.sh`, stopped when dropped (and by its
/// watchdog should the bench die).
pub struct ControlPlane {
    pub state: tempfile::TempDir,
    pub kubeconfig: String,
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let stop = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/controlplane/stop.sh");
        let _ = Command::new(stop).arg(self.state.path()).status();
    }
}

impl ControlPlane {
    pub fn start() -> Result<Self> {
        let state = tempfile::Builder::new()
            .prefix("kruise-rs-bench-")
            .tempdir()?;
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/controlplane/start.sh");
        let out = Command::new(script)
            .arg("--owner-pid")
            .arg(std::process::id().to_string())
            .arg(state.path())
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            return Err(
                format!("start.sh failed: {}", String::from_utf8_lossy(&out.stderr)).into(),
            );
        }
        let kubeconfig = String::from_utf8(out.stdout)?.trim().to_owned();
        Ok(Self { state, kubeconfig })
    }

    /// `kubectl` of this control plane, with its kubeconfig.
    pub fn kubectl(&self) -> Command {
        let mut c = Command::new(self.state.path().join("bin/kubectl"));
        c.args(["--kubeconfig", &self.kubeconfig]);
        c
    }

    /// `kruise-rs crds | kubectl apply --server-side -f -`, then waits until they are
    /// Established.
    pub fn install_crds(&self) -> Result<()> {
        let crds = Command::new(env!("CARGO_BIN_EXE_kruise-rs"))
            .arg("crds")
            .stdin(Stdio::null())
            .output()?;
        if !crds.status.success() {
            return Err("kruise-rs crds failed".into());
        }
        let mut apply = self
            .kubectl()
            .args(["apply", "--server-side", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()?;
        std::io::Write::write_all(apply.stdin.as_mut().ok_or("no stdin")?, &crds.stdout)?;
        if !apply.wait()?.success() {
            return Err("installing the CRDs failed".into());
        }
        let established = self
            .kubectl()
            .args(["wait", "--for=condition=Established", "crd", "--all"])
            .stdout(Stdio::null())
            .status()?;
        if !established.success() {
            return Err("the CRDs did not become Established".into());
        }
        Ok(())
    }

    /// `kruise-rs manager` against this control plane as a child process: webhooks off (the
    /// benches measure the controllers), NodeImages created at once, warnings only. `wrapper`
    /// (e.g. `heaptrack`) runs it under another program taking it as its first argument.
    /// Creates namespace `kruise-system` first, where the manager takes its leader Lease.
    pub fn spawn_manager(&self, wrapper: Option<&str>) -> Result<ChildGuard> {
        let created = self
            .kubectl()
            .args(["create", "namespace", "kruise-system"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        let exists = created.success()
            || self
                .kubectl()
                .args(["get", "namespace", "kruise-system"])
                .stdout(Stdio::null())
                .status()?
                .success();
        if !exists {
            return Err("cannot create namespace kruise-system".into());
        }
        let mut command = match wrapper {
            Some(wrapper) => {
                let mut c = Command::new(wrapper);
                c.arg(env!("CARGO_BIN_EXE_kruise-rs"));
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_kruise-rs")),
        };
        let child = command
            .args([
                "manager",
                "--kubeconfig",
                &self.kubeconfig,
                "--probe-addr",
                "127.0.0.1:0",
                "--nodeimage-creation-delay",
                "0",
                "--disable-webhooks",
            ])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()?;
        Ok(ChildGuard(child))
    }

    pub async fn client(&self) -> Result<Client> {
        let kc = kube::config::Kubeconfig::read_from(&self.kubeconfig)?;
        let mut config = Config::from_custom_kubeconfig(kc, &Default::default()).await?;
        // The bench measures the manager, not client-side timeouts of its own driver.
        config.read_timeout = Some(Duration::from_secs(120));
        Ok(Client::try_from(config)?)
    }
}

/// Writes the hash annotations the webhook would write onto `set` (already defaulted).
pub fn stamp_hashes(set: &mut kruise_rs::apis::sidecarset::SidecarSet) {
    use kruise_rs::apis::well_known::{SIDECARSET_HASH, SIDECARSET_HASH_WITHOUT_IMAGE};
    use kruise_rs::sidecar::hash::{sidecarset_hash, sidecarset_hash_without_image};
    let hash = sidecarset_hash(&set.spec);
    let without_image = sidecarset_hash_without_image(&set.spec);
    let annotations = set
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    annotations.insert(SIDECARSET_HASH.to_owned(), hash);
    annotations.insert(SIDECARSET_HASH_WITHOUT_IMAGE.to_owned(), without_image);
}

/// A child process, killed however the bench ends.
pub struct ChildGuard(pub std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `/proc/<pid>/status` memory figure (`VmHWM:` peak RSS, `VmRSS:` current) in MiB.
pub fn rss_mib(pid: u32, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

/// Creates `n` Nodes `bench-node-00000`.. labelled `labels` and reports them Ready, `concurrency`
/// requests at a time.
pub async fn create_ready_nodes(
    client: &Client,
    n: usize,
    labels: &BTreeMap<String, String>,
    concurrency: usize,
) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    futures::stream::iter(0..n)
        .map(|i| {
            let nodes = nodes.clone();
            async move {
                let name = format!("bench-node-{i:05}");
                let mut labels = labels.clone();
                labels.insert("kubernetes.io/hostname".to_owned(), name.clone());
                let node = Node {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        labels: Some(labels),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                nodes.create(&PostParams::default(), &node).await?;
                let status = NodeStatus {
                    conditions: Some(vec![NodeCondition {
                        type_: "Ready".into(),
                        status: "True".into(),
                        last_transition_time: Some(
                            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                                k8s_openapi::jiff::Timestamp::now(),
                            ),
                        ),
                        ..Default::default()
                    }]),
                    ..Default::default()
                };
                nodes
                    .patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({ "status": status })),
                    )
                    .await?;
                Ok::<_, kube::Error>(())
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}
