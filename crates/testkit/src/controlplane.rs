//! A loopback etcd + kube-apiserver of this process's own, from `tests/controlplane/start.sh`
//! (built by `tests/controlplane/build.sh`; `KUBE_VERSION` and `KRUISE_RS_APISERVER_ARGS` from
//! the environment apply). Stopped when dropped, and by the script's watchdog once this process
//! is gone, however it ends.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::process::{self, ChildGuard, output_with_stdin};
use crate::repo_path;

const START: &str = "tests/controlplane/start.sh";
const STOP: &str = "tests/controlplane/stop.sh";

pub struct ControlPlane {
    state: tempfile::TempDir,
    kubeconfig: PathBuf,
    /// start.sh's stderr: its progress, and the `control plane ready` line naming the version.
    start_log: String,
}

/// Where [`ControlPlane::install_crds`] takes the CustomResourceDefinitions from.
#[derive(Clone, Copy, Debug)]
pub enum Crds {
    /// `kruise-rs crds`: what the binary under test generates from its types.
    Generated,
    /// The `crds/` directory checked into the repository.
    Repository,
}

impl ControlPlane {
    /// Starts one whose state directory is `<tmp>/<prefix>XXXXXX`.
    pub fn start(prefix: &str) -> Result<Self, String> {
        Self::start_with_apiserver_args(prefix, None)
    }

    /// Starts one whose kube-apiserver gets `args` on top of start.sh's (through
    /// `KRUISE_RS_APISERVER_ARGS`, replacing what this process's environment set there), e.g.
    /// `--feature-gates=WatchList=false`.
    pub fn start_with_apiserver_args(prefix: &str, args: Option<&str>) -> Result<Self, String> {
        let env: Vec<(&str, &str)> = args
            .map(|args| ("KRUISE_RS_APISERVER_ARGS", args))
            .into_iter()
            .collect();
        let started = process::start_owned(START, prefix, &env)?;
        Ok(ControlPlane {
            kubeconfig: PathBuf::from(started.stdout.trim()),
            state: started.state,
            start_log: started.stderr,
        })
    }

    /// Where start.sh keeps the processes' data, logs, PKI and `bin/`.
    pub fn state_dir(&self) -> &Path {
        self.state.path()
    }

    /// The admin kubeconfig file (loopback server, client certificate).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// What start.sh wrote to stderr.
    pub fn start_log(&self) -> &str {
        &self.start_log
    }

    /// The kubectl built next to kube-apiserver.
    pub fn kubectl_path(&self) -> PathBuf {
        self.state.path().join("bin/kubectl")
    }

    /// `kubectl --kubeconfig <this control plane>`.
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(self.kubectl_path());
        cmd.arg("--kubeconfig").arg(&self.kubeconfig);
        cmd
    }

    /// The pid of `name` (kube-apiserver, etcd) from the state directory's `pids` file.
    pub fn pid(&self, name: &str) -> Option<u32> {
        std::fs::read_to_string(self.state.path().join("pids"))
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }

    /// `kubectl apply --server-side` of the CRDs, then waits (60 s at most) until every CRD is
    /// Established. Failures carry kubectl's stderr.
    pub fn install_crds(&self, crds: Crds) -> Result<(), String> {
        let applied = match crds {
            Crds::Generated => {
                let manifests = Command::new(crate::kruise_rs_binary())
                    .arg("crds")
                    .stdin(Stdio::null())
                    .output()
                    .map_err(|e| format!("running kruise-rs crds: {e}"))?;
                if !manifests.status.success() {
                    return Err(format!(
                        "kruise-rs crds failed: {}",
                        String::from_utf8_lossy(&manifests.stderr)
                    ));
                }
                output_with_stdin(
                    self.kubectl().args(["apply", "--server-side", "-f", "-"]),
                    &manifests.stdout,
                )?
            }
            Crds::Repository => self
                .kubectl()
                .args(["apply", "--server-side", "-f"])
                .arg(repo_path("crds"))
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("running kubectl: {e}"))?,
        };
        if !applied.status.success() {
            return Err(format!(
                "installing the CRDs failed: {}",
                String::from_utf8_lossy(&applied.stderr)
            ));
        }
        self.wait_crds_established()
    }

    /// Waits (60 s at most) until every CRD is Established.
    pub fn wait_crds_established(&self) -> Result<(), String> {
        // `kubectl wait` fails at once, instead of waiting, on a CRD whose status has no
        // conditions yet ("accessor error: <nil> is of the type <nil>"): ask again until the
        // apiserver has written them.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match process::run(self.kubectl().args([
                "wait",
                "--for=condition=Established",
                "crd",
                "--all",
                "--timeout=60s",
            ])) {
                Ok(()) => return Ok(()),
                Err(e) if e.contains("accessor error") && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(format!("waiting for the CRDs to be Established: {e}")),
            }
        }
    }

    /// A client of its own (its own connection pool) with a 120 s read timeout: the benches
    /// measure the apiserver and the manager, not client-side timeouts of their own driver.
    pub async fn client(&self) -> Result<Client, String> {
        let mut config = config_for(&self.kubeconfig).await?;
        config.read_timeout = Some(Duration::from_secs(120));
        Client::try_from(config)
            .map_err(|e| format!("a client for {}: {e}", self.kubeconfig.display()))
    }

    /// `kruise-rs manager` against this control plane as a child process: webhooks off (the
    /// benches measure the controllers), NodeImages created at once, warnings only. `wrapper`
    /// (e.g. `heaptrack`) runs it under another program taking it as its first argument;
    /// `extra_args` go after the harness's own (flags the harness passes must not be repeated).
    /// Creates namespace `kruise-system` first, where the manager takes its leader Lease.
    pub fn spawn_manager(
        &self,
        wrapper: Option<&str>,
        extra_args: &[String],
    ) -> Result<ChildGuard, String> {
        let quiet = |cmd: &mut Command| {
            cmd.stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let exists = quiet(
            self.kubectl()
                .args(["create", "namespace", "kruise-system"]),
        ) || quiet(self.kubectl().args(["get", "namespace", "kruise-system"]));
        if !exists {
            return Err("cannot create namespace kruise-system".into());
        }
        let mut command = match wrapper {
            Some(wrapper) => {
                let mut c = Command::new(wrapper);
                c.arg(crate::kruise_rs_binary());
                c
            }
            None => Command::new(crate::kruise_rs_binary()),
        };
        ChildGuard::spawn(
            command
                .arg("manager")
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .args(["--probe-addr", "127.0.0.1:0"])
                .args(["--nodeimage-creation-delay", "0", "--disable-webhooks"])
                .args(extra_args)
                .env("RUST_LOG", "warn")
                .stdout(Stdio::null()),
        )
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        process::stop_owned(STOP, self.state.path());
    }
}

/// A client configuration for the current context of the kubeconfig file `path`.
pub async fn config_for(path: &Path) -> Result<Config, String> {
    let kubeconfig =
        Kubeconfig::read_from(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    config_of(kubeconfig, path).await
}

/// A client configuration for the current context of `kubeconfig`, read from `path`.
pub async fn config_of(kubeconfig: Kubeconfig, path: &Path) -> Result<Config, String> {
    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| format!("loading {}: {e}", path.display()))
}

/// A client for the cluster the kubeconfig file `path` names.
pub async fn client_for(path: &Path) -> Result<Client, String> {
    Client::try_from(config_for(path).await?)
        .map_err(|e| format!("a client for {}: {e}", path.display()))
}

/// The series of metric `name` in the apiserver's `/metrics`: each one's labels (what stands
/// between the braces, empty for a series without) and value.
pub async fn apiserver_metric(client: &Client, name: &str) -> Result<Vec<(String, f64)>, String> {
    let req = http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    let text = client
        .request_text(req)
        .await
        .map_err(|e| format!("reading the apiserver's /metrics: {e}"))?;
    Ok(text
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            // `name{labels} value`, or `name value` for a series without labels.
            let (labels, value) = match rest.strip_prefix('{') {
                Some(rest) => rest.rsplit_once("} ")?,
                None => ("", rest.strip_prefix(' ')?),
            };
            Some((labels.to_owned(), value.trim().parse().unwrap_or(0.0)))
        })
        .collect())
}

/// The apiserver's metric `name` (a counter, or a histogram's `_sum` or `_count`) for requests on
/// `resource`, summed by `key`: `key` gets a label's value by name (`?` when the series has no
/// such label) and returns the group a series counts in, or `None` to leave it out.
pub async fn apiserver_request_metric(
    client: &Client,
    name: &str,
    resource: &str,
    key: impl Fn(&dyn Fn(&str) -> String) -> Option<String>,
) -> Result<std::collections::BTreeMap<String, f64>, String> {
    let mut sums = std::collections::BTreeMap::new();
    for (labels, value) in apiserver_metric(client, name).await? {
        let label = |name: &str| {
            labels
                .split(&format!("{name}=\""))
                .nth(1)
                .and_then(|s| s.split('"').next())
                .unwrap_or("?")
                .to_owned()
        };
        if label("resource") != resource {
            continue;
        }
        if let Some(group) = key(&label) {
            *sums.entry(group).or_insert(0.0) += value;
        }
    }
    Ok(sums)
}

/// The apiserver's `apiserver_request_total` for `verb` requests on `resource`, summed by `key`
/// (as [`apiserver_request_metric`]'s).
pub async fn apiserver_requests(
    client: &Client,
    resource: &str,
    verb: &str,
    key: impl Fn(&dyn Fn(&str) -> String) -> Option<String>,
) -> Result<std::collections::BTreeMap<String, f64>, String> {
    apiserver_request_metric(client, "apiserver_request_total", resource, |label| {
        if label("verb") == verb {
            key(label)
        } else {
            None
        }
    })
    .await
}

/// Whether a series of the apiserver's request metrics counts a write of a NodeImage object (not
/// its status, which daemons write): PATCHes and server-side applies (ours) and PUTs (upstream's
/// manager updates whole objects).
pub fn is_nodeimage_write(label: &dyn Fn(&str) -> String) -> bool {
    label("subresource").is_empty() && ["PATCH", "PUT", "APPLY"].contains(&label("verb").as_str())
}

/// Writes of NodeImage objects by status code, from the apiserver's `apiserver_request_total`
/// (see [`is_nodeimage_write`]).
pub async fn nodeimage_writes(
    client: &Client,
) -> Result<std::collections::BTreeMap<String, f64>, String> {
    apiserver_request_metric(client, "apiserver_request_total", "nodeimages", |label| {
        is_nodeimage_write(label).then(|| label("code"))
    })
    .await
}
