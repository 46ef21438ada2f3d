//! Node-side harness: real docker registries and a real containerd (CRI) on loopback, and the
//! test images to push to them; see `tests/node/start.sh`.
//!
//! * [`node_env`] starts `tests/node/start.sh` once per test process (two registries, one with
//!   htpasswd auth, and a containerd pulling from both); its watchdog tears everything down when
//!   this process is gone. `KRUISE_RS_NODE_ENV=STATE_DIR/env` reuses an environment started by
//!   hand instead (it is left running).
//! * Tests isolate themselves by pushing to a repository name of their own
//!   ([`unique_name`](super::unique_name)): the containerd image store is shared.
//! * [`NodeEnv::start_containerd`] starts one more containerd of a test's own, to stop and start.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::harness::process::{self, parse_vars};
use crate::harness::procfs;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The test images, tags of the OCI layout `tests/node/images.sh` builds from busybox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Variant {
    /// busybox, entrypoint `/bin/busybox sleep 3600`.
    V1,
    /// V1 plus a small layer with `/etc/kruise-rs-variant` (`v2`): another digest, same base.
    V2,
    /// V1 plus a small layer with `/etc/kruise-rs-variant` (`v3`).
    V3,
}

impl Variant {
    pub(crate) const ALL: [Variant; 3] = [Variant::V1, Variant::V2, Variant::V3];

    /// The tag in the OCI layout.
    pub(crate) fn tag(self) -> &'static str {
        match self {
            Variant::V1 => "v1",
            Variant::V2 => "v2",
            Variant::V3 => "v3",
        }
    }
}

/// The process-wide node environment; see [`node_env`].
#[derive(Debug)]
pub(crate) struct NodeEnv {
    registry: String,
    registry_log: PathBuf,
    auth_registry: String,
    auth_registry_log: PathBuf,
    auth_user: String,
    auth_password: String,
    containerd_socket: PathBuf,
    certs_d: PathBuf,
    images: PathBuf,
    sandbox_image: String,
}

static NODE: OnceLock<Result<NodeEnv, String>> = OnceLock::new();

/// The node environment of this test process, started on first use.
///
/// Panics with the start script's output when it cannot be started: tests fail, never skip.
pub(crate) async fn node_env() -> &'static NodeEnv {
    // A blocking start of about a second; other tests wait on the same OnceLock meanwhile.
    // The error is kept, so later tests fail at once instead of retrying.
    match NODE.get_or_init(start) {
        Ok(env) => env,
        Err(e) => panic!("{e}"),
    }
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/node")
        .join(name)
}

fn start() -> Result<NodeEnv, String> {
    if let Some(file) = std::env::var_os("KRUISE_RS_NODE_ENV").filter(|v| !v.is_empty()) {
        let text = std::fs::read_to_string(&file)
            .map_err(|e| format!("reading KRUISE_RS_NODE_ENV={}: {e}", file.to_string_lossy()))?;
        return NodeEnv::from_vars(&parse_vars(&text));
    }
    let started =
        process::start_owned("tests/node/start.sh", "kruise-rs-node-", &[]).map_err(|e| {
            format!(
                "starting the node environment failed (tests/setup.sh installs what it needs): {e}"
            )
        })?;
    // Kept, not dropped: the watchdog removes it when this process exits.
    let _ = started.state.keep();
    eprint!("{}", started.stderr);
    NodeEnv::from_vars(&parse_vars(&started.stdout))
}

fn var<'a>(vars: &'a HashMap<String, String>, key: &str) -> Result<&'a str, String> {
    vars.get(key)
        .map(String::as_str)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| format!("the node start script printed no {key}= line; got {vars:?}"))
}

impl NodeEnv {
    fn from_vars(vars: &HashMap<String, String>) -> Result<NodeEnv, String> {
        let path = |key| var(vars, key).map(PathBuf::from);
        let string = |key| var(vars, key).map(str::to_owned);
        Ok(NodeEnv {
            registry: string("REGISTRY")?,
            registry_log: path("REGISTRY_LOG")?,
            auth_registry: string("AUTH_REGISTRY")?,
            auth_registry_log: path("AUTH_REGISTRY_LOG")?,
            auth_user: string("AUTH_USER")?,
            auth_password: string("AUTH_PASSWORD")?,
            containerd_socket: path("CONTAINERD_SOCKET")?,
            certs_d: path("CERTS_D")?,
            images: path("IMAGES")?,
            sandbox_image: string("SANDBOX_IMAGE")?,
        })
    }

    /// `127.0.0.1:PORT` of the registry without authentication.
    pub(crate) fn registry(&self) -> &str {
        &self.registry
    }

    /// `127.0.0.1:PORT` of the registry with htpasswd authentication ([`Self::auth_user`]).
    pub(crate) fn auth_registry(&self) -> &str {
        &self.auth_registry
    }

    pub(crate) fn auth_user(&self) -> &str {
        &self.auth_user
    }

    /// containerd's CRI pause image, on the open registry.
    pub(crate) fn sandbox_image(&self) -> &str {
        &self.sandbox_image
    }

    pub(crate) fn auth_password(&self) -> &str {
        &self.auth_password
    }

    /// The shared containerd's CRI socket (image store shared by every test of this process).
    pub(crate) fn containerd_socket(&self) -> &Path {
        &self.containerd_socket
    }

    /// Push `variant` to `dest` (`127.0.0.1:PORT/repo:tag`, `docker://` optional) with skopeo,
    /// with the credentials when `dest` is on [`Self::auth_registry`]. Returns the manifest
    /// digest (`sha256:...`), the same as [`Self::manifest_digest`]. Panics when the push fails.
    pub(crate) fn push(&self, variant: Variant, dest: &str) -> String {
        let dest = dest.strip_prefix("docker://").unwrap_or(dest);
        let digest_file = tempfile::NamedTempFile::new().expect("a temporary file");
        let mut cmd = Command::new("skopeo");
        cmd.args(["copy", "-q", "--dest-tls-verify=false", "--digestfile"])
            .arg(digest_file.path());
        if dest.starts_with(&format!("{}/", self.auth_registry)) {
            cmd.arg("--dest-creds")
                .arg(format!("{}:{}", self.auth_user, self.auth_password));
        }
        let output = cmd
            .arg(format!(
                "oci:{}:{}",
                self.images.to_str().expect("a UTF-8 cache path"),
                variant.tag()
            ))
            .arg(format!("docker://{dest}"))
            .stdin(Stdio::null())
            .output()
            .expect("skopeo runs");
        assert!(
            output.status.success(),
            "skopeo copy {variant:?} to {dest} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        let digest = std::fs::read_to_string(digest_file.path()).expect("skopeo's digest file");
        let digest = digest.trim();
        assert!(
            digest.starts_with("sha256:"),
            "skopeo wrote {digest:?} as the digest of {dest}"
        );
        digest.to_owned()
    }

    /// The manifest digest of `variant` in the OCI layout (what a registry serves after
    /// [`Self::push`]).
    pub(crate) fn manifest_digest(&self, variant: Variant) -> String {
        let index = self.read_json(&self.images.join("index.json"));
        index["manifests"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == variant.tag())
            .and_then(|m| m["digest"].as_str())
            .unwrap_or_else(|| panic!("no {variant:?} in {}", self.images.display()))
            .to_owned()
    }

    /// The config digest of `variant`: the image ID containerd reports (`PullImage`'s
    /// `image_ref`, `ImageStatus`'s `id`).
    pub(crate) fn image_id(&self, variant: Variant) -> String {
        let digest = self.manifest_digest(variant);
        let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
        let manifest = self.read_json(&self.images.join("blobs/sha256").join(hex));
        manifest["config"]["digest"]
            .as_str()
            .unwrap_or_else(|| panic!("manifest {digest} has no config digest"))
            .to_owned()
    }

    fn read_json(&self, path: &Path) -> serde_json::Value {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
    }

    /// The access-log lines of `registry` ([`Self::registry`] or [`Self::auth_registry`])
    /// that contain `needle`, oldest first, e.g. with `needle` = `/v2/<repo>/manifests/`:
    /// `127.0.0.1 - - [29/Nov/2026:17:24:43 +0000] "HEAD /v2/<repo>/manifests/v1 HTTP/1.1" 200 ...`.
    ///
    /// The registry writes a line just after its response, so poll for lines you expect
    /// ([`wait_for`](super::wait_for)) rather than reading once right after a pull.
    pub(crate) fn registry_log_lines(&self, registry: &str, needle: &str) -> Vec<String> {
        let log = if registry == self.registry {
            &self.registry_log
        } else if registry == self.auth_registry {
            &self.auth_registry_log
        } else {
            panic!(
                "{registry} is neither {} nor {}",
                self.registry, self.auth_registry
            )
        };
        let text = std::fs::read(log).unwrap_or_else(|e| panic!("reading {}: {e}", log.display()));
        String::from_utf8_lossy(&text)
            .lines()
            // Access-log lines (combined log format); the others are the app log (`time=...`).
            .filter(|line| line.starts_with("127.0.0.1 - ") && line.contains(needle))
            .map(str::to_owned)
            .collect()
    }

    /// Makes every containerd of this environment pull from `addr` (`127.0.0.1:PORT`, a proxy in
    /// front of a registry) over plain HTTP: containerd reads the hosts at every pull.
    pub(crate) fn add_plain_http_registry(&self, addr: &str) {
        let dir = self.certs_d.join(addr);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        std::fs::write(
            dir.join("hosts.toml"),
            format!(
                "server = \"http://{addr}\"\n\n[host.\"http://{addr}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
            ),
        )
        .unwrap_or_else(|e| panic!("writing {}/hosts.toml: {e}", dir.display()));
    }

    /// From the open registry's own log (its "response completed" lines: when each response
    /// ended and how long it took): the blob downloads of more than `min_bytes` whose URI
    /// contains `needle`, as (start, end) times.
    pub(crate) fn registry_downloads(
        &self,
        needle: &str,
        min_bytes: u64,
    ) -> Vec<(std::time::SystemTime, std::time::SystemTime)> {
        let text = std::fs::read(&self.registry_log)
            .unwrap_or_else(|e| panic!("reading {}: {e}", self.registry_log.display()));
        let field = |line: &str, key: &str| -> Option<String> {
            let at = line.find(&format!(" {key}="))? + key.len() + 2;
            let rest = &line[at..];
            Some(match rest.strip_prefix('"') {
                Some(quoted) => quoted[..quoted.find('"')?].to_owned(),
                None => rest.split(' ').next()?.to_owned(),
            })
        };
        String::from_utf8_lossy(&text)
            .lines()
            .filter(|l| {
                l.contains("msg=\"response completed\"") && l.contains("http.request.method=GET")
            })
            .filter_map(|l| {
                let uri = field(l, "http.request.uri")?;
                let written: u64 = field(l, "http.response.written")?.parse().ok()?;
                if !uri.contains(needle) || !uri.contains("/blobs/") || written <= min_bytes {
                    return None;
                }
                let end: k8s_openapi::jiff::Timestamp =
                    l.strip_prefix("time=\"")?.split('"').next()?.parse().ok()?;
                let took =
                    kruise_rs_testkit::shared::go_duration(&field(l, "http.response.duration")?)?;
                let end = std::time::SystemTime::from(end);
                Some((end - took, end))
            })
            .collect()
    }

    /// Start another containerd with its root, state, socket and log under `dir` (keep the path
    /// short: the socket path must stay under 100 bytes), pulling from the same registries.
    /// Stopped when dropped; this process's exit stops it too.
    pub(crate) fn start_containerd(&self, dir: &Path) -> ExtraContainerd {
        self.start_containerd_of(dir, None)
    }

    /// The same with containerd 2 (tests/node/build-containerd.sh, what the real node runs)
    /// instead of Debian's 1.6.
    pub(crate) fn start_containerd_2(&self, dir: &Path) -> ExtraContainerd {
        self.start_containerd_of(dir, Some(containerd_2_bin()))
    }

    fn start_containerd_of(&self, dir: &Path, bin: Option<PathBuf>) -> ExtraContainerd {
        let dir = std::path::absolute(dir)
            .unwrap_or_else(|e| panic!("making {} absolute: {e}", dir.display()));
        let extra = ExtraContainerd {
            certs_d: self.certs_d.clone(),
            sandbox_image: self.sandbox_image.clone(),
            socket: dir.join("containerd.sock"),
            dir,
            bin,
            pid: Mutex::new(None),
        };
        extra.start();
        extra
    }
}

/// The directory of containerd 2's binaries, built on first use (cached by version).
fn containerd_2_bin() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        let script = script("build-containerd.sh");
        let output = Command::new(&script)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
        assert!(
            output.status.success(),
            "building containerd 2 failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
    })
    .clone()
}

/// A containerd of a test's own, from [`NodeEnv::start_containerd`]: it can be stopped and
/// started again on the same root and state (images pulled before stay).
#[derive(Debug)]
pub(crate) struct ExtraContainerd {
    dir: PathBuf,
    certs_d: PathBuf,
    sandbox_image: String,
    socket: PathBuf,
    /// containerd's binaries when not those on PATH.
    bin: Option<PathBuf>,
    pid: Mutex<Option<u32>>,
}

/// How long containerd may take to exit after SIGTERM before the harness gives up.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

impl ExtraContainerd {
    /// The CRI socket (the same path across restarts).
    pub(crate) fn socket(&self) -> &Path {
        &self.socket
    }

    /// containerd's log, appended to by every start.
    pub(crate) fn log(&self) -> PathBuf {
        self.dir.join("containerd.log")
    }

    /// The pid while running (as far as this handle knows).
    pub(crate) fn pid(&self) -> Option<u32> {
        *self.pid.lock().expect("pid lock")
    }

    /// Start containerd (again) and wait until it serves. Panics when it is running already or
    /// does not come up.
    pub(crate) fn start(&self) {
        let script = script("containerd.sh");
        let mut command = Command::new(&script);
        if let Some(bin) = &self.bin {
            command.env("KRUISE_RS_CONTAINERD_BIN", bin);
        }
        let output = command
            .arg("--owner-pid")
            .arg(std::process::id().to_string())
            .arg("--sandbox-image")
            .arg(&self.sandbox_image)
            .arg(&self.dir)
            .arg(&self.certs_d)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
        assert!(
            output.status.success(),
            "starting containerd in {} failed ({}): {}",
            self.dir.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        let vars = parse_vars(&String::from_utf8_lossy(&output.stdout));
        let pid = var(&vars, "CONTAINERD_PID")
            .and_then(|p| {
                p.parse::<u32>()
                    .map_err(|e| format!("CONTAINERD_PID={p}: {e}"))
            })
            .unwrap_or_else(|e| panic!("{e}"));
        *self.pid.lock().expect("pid lock") = Some(pid);
    }

    /// SIGTERM, then wait until the process is gone. A no-op when it is not running.
    pub(crate) fn stop(&self) {
        self.signal_and_wait("TERM");
    }

    /// SIGKILL (a crash: no cleanup, the socket file stays), then wait until the process is gone.
    pub(crate) fn kill(&self) {
        self.signal_and_wait("KILL");
    }

    fn signal_and_wait(&self, signal: &str) {
        let Some(pid) = self.pid.lock().expect("pid lock").take() else {
            return;
        };
        if !self.runs(pid) {
            return;
        }
        let _ = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status();
        let deadline = Instant::now() + STOP_TIMEOUT;
        while self.runs(pid) {
            if Instant::now() >= deadline {
                let _ = Command::new("kill")
                    .arg("-KILL")
                    .arg(pid.to_string())
                    .status();
                panic!(
                    "containerd {pid} in {} did not exit within {STOP_TIMEOUT:?} of SIG{signal}",
                    self.dir.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether `pid` is still our containerd: alive, not a zombie, and not a reused pid.
    fn runs(&self, pid: u32) -> bool {
        match procfs::state(pid) {
            None | Some('Z') => return false,
            Some(_) => {}
        }
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|cmdline| String::from_utf8_lossy(&cmdline).contains(&*self.dir.to_string_lossy()))
            .unwrap_or(false)
    }

    /// Whether containerd is running.
    pub(crate) fn is_running(&self) -> bool {
        self.pid().is_some_and(|pid| self.runs(pid))
    }
}

impl Drop for ExtraContainerd {
    fn drop(&mut self) {
        // Stops containerd and its watchdog (TERM, KILL after a grace period).
        process::stop_owned("tests/node/stop.sh", &self.dir);
    }
}
