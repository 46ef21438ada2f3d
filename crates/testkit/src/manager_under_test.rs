//! "A manager to bench": ours (the release-built `kruise-rs manager`), or a second one described
//! in a file named by `SECOND_MANAGER`, e.g. upstream's kruise-manager
//! (`benches/upstream-kruise-manager/manager.example.yaml`). A bench runs the same phases
//! against each, every one on a fresh control plane, and prints both columns.
//!
//! The description is YAML (serde_yaml is already a dependency; YAML takes comments):
//!
//! ```yaml
//! name: upstream v1.9.0          # the column's heading; default: the binary's file name
//! binary: ../kruise-manager      # relative paths are relative to the description's directory
//! args: ["--kubeconfig={kubeconfig}", "--metrics-addr=127.0.0.1:{port:metrics}"]
//! env: {WEBHOOK_PORT: "{port:webhook}", WEBHOOK_CERT_DIR: "{cert_dir}"}
//! namespaces: [kruise-system]    # created first
//! apply: [crds/, webhooks.yaml]  # then `kubectl apply --server-side -f` each, in order
//!                                # (`-k` for a directory with a kustomization.yaml)
//! ```
//!
//! Placeholders in `args` and `env` values take per-run values: `{kubeconfig}` the control
//! plane's admin kubeconfig, `{cert_dir}` a fresh empty directory, `{port:NAME}` a free loopback
//! port, the same one wherever the same NAME appears. Any other `{...}` is an error, as is an
//! unknown field, a missing file or a namespace that is not a DNS label; each error names the
//! field.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::Deserialize;

use crate::controlplane::ControlPlane;
use crate::process::{self, ChildGuard, free_loopback_port};

/// The environment variable naming a second manager's description file.
pub const SECOND_MANAGER: &str = "SECOND_MANAGER";

/// A manager binary and how to start it against a control plane.
#[derive(Clone, Debug, PartialEq)]
pub struct ManagerUnderTest {
    /// What the benches print above its column.
    pub name: String,
    pub binary: PathBuf,
    /// Arguments, placeholders unsubstituted.
    pub args: Vec<String>,
    /// Environment on top of the bench's own, placeholders unsubstituted.
    pub env: BTreeMap<String, String>,
    /// Manifest files or directories applied (server-side) before it starts.
    pub apply: Vec<PathBuf>,
    /// Namespaces created before it starts.
    pub namespaces: Vec<String>,
    /// A program (e.g. `heaptrack`) that runs the binary, taking it as its first argument.
    pub wrapper: Option<String>,
}

/// A manager started by [`ManagerUnderTest::spawn`]: killed when dropped, with the files it was
/// given.
pub struct RunningManager {
    pub child: ChildGuard,
    /// The ports `{port:NAME}` stood for, by NAME.
    pub ports: BTreeMap<String, u16>,
    /// Holds `{cert_dir}` and `manager.log` (its stdout and stderr); removed when dropped.
    pub files: tempfile::TempDir,
}

impl RunningManager {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_path(&self) -> PathBuf {
        self.files.path().join("manager.log")
    }

    /// The summed value of metric `name` (every series of it) on the manager's `/metrics`, served
    /// on the port `{port:probe}` stood for (ours serves its metrics with its probes); `None`
    /// when it has no such port or does not export `name`.
    pub fn metric(&self, name: &str) -> Option<f64> {
        self.metric_where(name, "")
    }

    /// As [`Self::metric`], summing only the series whose line contains `filter` (e.g.
    /// `controller="imagepulljob"`); also read from the port `{port:metrics}` stood for, where
    /// upstream's manager serves its metrics.
    pub fn metric_where(&self, name: &str, filter: &str) -> Option<f64> {
        let port = *self
            .ports
            .get("probe")
            .or_else(|| self.ports.get("metrics"))?;
        let text = http_get(port, "/metrics").ok()?;
        let mut found = None;
        for line in text.lines() {
            if !line.contains(filter) {
                continue;
            }
            let Some(rest) = line.strip_prefix(name) else {
                continue;
            };
            // `name value` or `name{labels} value`, not a longer name sharing the prefix.
            let value = match rest.as_bytes().first() {
                Some(b' ') => rest,
                Some(b'{') => rest.rsplit_once('}').map_or("", |(_, v)| v),
                _ => continue,
            };
            if let Ok(v) = value.trim().parse::<f64>() {
                *found.get_or_insert(0.0) += v;
            }
        }
        found
    }

    /// Whether the manager's `/readyz` answers 200 now: ours on `{port:probe}`, upstream's on
    /// `{port:health}`; false when it has neither port.
    pub fn readyz(&self) -> bool {
        self.ports
            .get("probe")
            .or_else(|| self.ports.get("health"))
            .is_some_and(|port| http_get(*port, "/readyz").is_ok())
    }

    /// Our manager's client-side rate limit counters now.
    pub fn limit_waits(&self) -> Option<LimitWaits> {
        Some(LimitWaits {
            requests: self.metric("kruise_rs_client_rate_limited_requests_total")?,
            seconds: self.metric("kruise_rs_client_rate_limit_wait_seconds_total")?,
        })
    }

    /// An error naming the manager, with its log's last lines, once it has exited.
    pub fn check_alive(&mut self, name: &str) -> Result<(), String> {
        let log = self.log_path();
        self.child.check_alive(name).map_err(|e| {
            let tail = process::tail(&[log], 30).unwrap_or_default();
            format!("{e}; the last lines of its log:\n{tail}")
        })
    }
}

/// Our manager's counters of its client-side rate limit: requests that waited for it, and the
/// seconds they waited (a second manager exports neither).
#[derive(Clone, Copy, Debug)]
pub struct LimitWaits {
    pub requests: f64,
    pub seconds: f64,
}

impl LimitWaits {
    /// What the limit held back between two readings of [`RunningManager::limit_waits`].
    pub fn describe(before: Option<Self>, after: Option<Self>) -> String {
        match (before, after) {
            (Some(b), Some(a)) => format!(
                "the manager's client-side rate limit meanwhile: {:.0} requests waited for it, \
                 {:.2} s of waiting in all",
                a.requests - b.requests,
                a.seconds - b.seconds
            ),
            _ => "the manager exports no client-side rate limit counters".to_owned(),
        }
    }
}

/// The description file's fields, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Description {
    name: Option<String>,
    binary: PathBuf,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    apply: Vec<PathBuf>,
    #[serde(default)]
    namespaces: Vec<String>,
}

impl ManagerUnderTest {
    /// Our release-built `kruise-rs manager`: webhooks off (the benches measure the
    /// controllers), NodeImages created at once, warnings only, probes and metrics on a free
    /// loopback port (`{port:probe}`, read by [`RunningManager::metric`]), as
    /// [`ControlPlane::spawn_manager`] starts it; `MANAGER_ARGS` (split at whitespace) is added to
    /// its arguments, `MANAGER_WRAPPER` runs it under another program and `MANAGER_RUST_LOG`
    /// replaces its `RUST_LOG` (`warn`). `MANAGER_WEBHOOKS=1` runs it as deployed instead: its
    /// webhooks served on a free loopback port (`{port:webhook}`) and registered by the manager
    /// itself, so that every write of the kinds they cover (NodeImage spec writes included) goes
    /// through them, as in a cluster.
    pub fn ours() -> Self {
        let as_deployed = std::env::var("MANAGER_WEBHOOKS").is_ok_and(|v| v.trim() == "1");
        Self::ours_with_webhooks(as_deployed)
    }

    /// [`Self::ours`], its webhooks on or off whatever `MANAGER_WEBHOOKS` says.
    fn ours_with_webhooks(as_deployed: bool) -> Self {
        let var = |name| {
            std::env::var(name)
                .ok()
                .filter(|v: &String| !v.trim().is_empty())
        };
        let mut args: Vec<String> = [
            "manager",
            "--kubeconfig",
            "{kubeconfig}",
            "--probe-addr",
            "127.0.0.1:{port:probe}",
            "--nodeimage-creation-delay",
            "0",
        ]
        .map(str::to_owned)
        .into();
        if as_deployed {
            args.extend(
                [
                    "--namespace",
                    "kruise-system",
                    "--webhook-addr",
                    "127.0.0.1:{port:webhook}",
                    "--webhook-url",
                    "https://127.0.0.1:{port:webhook}",
                ]
                .map(str::to_owned),
            );
        } else {
            args.push("--disable-webhooks".to_owned());
        }
        if let Some(extra) = var("MANAGER_ARGS") {
            args.extend(extra.split_whitespace().map(str::to_owned));
        }
        ManagerUnderTest {
            name: if as_deployed {
                "kruise-rs with its webhooks".into()
            } else {
                "kruise-rs".into()
            },
            binary: crate::kruise_rs_binary(),
            args,
            env: BTreeMap::from([(
                "RUST_LOG".to_owned(),
                var("MANAGER_RUST_LOG").unwrap_or_else(|| "warn".to_owned()),
            )]),
            apply: Vec::new(),
            namespaces: vec!["kruise-system".into()],
            wrapper: var("MANAGER_WRAPPER"),
        }
    }

    /// The manager `SECOND_MANAGER` describes, `None` when it is unset or blank.
    pub fn second() -> Result<Option<Self>, String> {
        match std::env::var(SECOND_MANAGER) {
            Ok(path) if !path.trim().is_empty() => {
                Self::from_file(Path::new(path.trim())).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// Reads and checks the description in file `path`.
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("{SECOND_MANAGER}: reading {}: {e}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::parse(&text, base).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses and checks a description whose relative paths are relative to `base`.
    pub fn parse(text: &str, base: &Path) -> Result<Self, String> {
        let d: Description = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
        let resolve = |p: &Path| {
            if p.is_absolute() {
                p.to_owned()
            } else {
                base.join(p)
            }
        };
        let binary = resolve(&d.binary);
        if !binary.is_file() {
            return Err(format!("binary: {} is not a file", binary.display()));
        }
        for (i, arg) in d.args.iter().enumerate() {
            placeholders(arg).map_err(|e| format!("args[{i}]: {e}"))?;
        }
        for (key, value) in &d.env {
            if key.is_empty() || key.contains('=') {
                return Err(format!("env: {key:?} is not a variable name"));
            }
            placeholders(value).map_err(|e| format!("env.{key}: {e}"))?;
        }
        let mut apply = Vec::new();
        for (i, path) in d.apply.iter().enumerate() {
            let path = resolve(path);
            if !path.exists() {
                return Err(format!("apply[{i}]: {} does not exist", path.display()));
            }
            apply.push(path);
        }
        for (i, namespace) in d.namespaces.iter().enumerate() {
            if !is_dns_label(namespace) {
                return Err(format!(
                    "namespaces[{i}]: {namespace:?} is not a namespace name (a DNS label)"
                ));
            }
        }
        let name = match d.name {
            Some(name) if name.trim().is_empty() => return Err("name: is blank".into()),
            Some(name) => name,
            None => binary
                .file_name()
                .map_or_else(|| "second".into(), |n| n.to_string_lossy().into_owned()),
        };
        Ok(ManagerUnderTest {
            name,
            binary,
            args: d.args,
            env: d.env,
            apply,
            namespaces: d.namespaces,
            wrapper: None,
        })
    }

    /// Prepares control plane `cp` (creates `namespaces`, so what is applied may live in them;
    /// applies `apply`, a directory holding a `kustomization.yaml` as a kustomization, and waits
    /// for its CRDs to be Established) and starts the manager against it, stdout and stderr into
    /// [`RunningManager::log_path`].
    pub fn spawn(&self, cp: &ControlPlane) -> Result<RunningManager, String> {
        for namespace in &self.namespaces {
            create_namespace(cp, namespace)?;
        }
        for path in &self.apply {
            let form = if path.join("kustomization.yaml").is_file() {
                "-k"
            } else {
                "-f"
            };
            process::run(
                cp.kubectl()
                    .args(["apply", "--server-side", "--force-conflicts", form])
                    .arg(path),
            )
            .map_err(|e| format!("{}: applying {} failed: {e}", self.name, path.display()))?;
        }
        if !self.apply.is_empty() {
            cp.wait_crds_established()?;
        }
        let files = tempfile::Builder::new()
            .prefix("kruise-rs-bench-manager-")
            .tempdir()
            .map_err(|e| format!("creating a temporary directory: {e}"))?;
        let cert_dir = files.path().join("certs");
        std::fs::create_dir(&cert_dir)
            .map_err(|e| format!("creating {}: {e}", cert_dir.display()))?;
        let mut values = Values {
            kubeconfig: cp.kubeconfig().to_string_lossy().into_owned(),
            cert_dir: cert_dir.to_string_lossy().into_owned(),
            ports: BTreeMap::new(),
        };
        let args = self
            .args
            .iter()
            .map(|a| values.substitute(a))
            .collect::<Result<Vec<_>, _>>()?;
        let env = self
            .env
            .iter()
            .map(|(k, v)| Ok((k.clone(), values.substitute(v)?)))
            .collect::<Result<Vec<_>, String>>()?;
        let log_path = files.path().join("manager.log");
        let log = std::fs::File::create(&log_path)
            .map_err(|e| format!("creating {}: {e}", log_path.display()))?;
        let log_err = log
            .try_clone()
            .map_err(|e| format!("opening {}: {e}", log_path.display()))?;
        let mut command = match &self.wrapper {
            Some(wrapper) => {
                let mut c = Command::new(wrapper);
                c.arg(&self.binary);
                c
            }
            None => Command::new(&self.binary),
        };
        command
            .args(&args)
            .envs(env)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        let child = ChildGuard::spawn(&mut command)?;
        Ok(RunningManager {
            child,
            ports: values.ports,
            files,
        })
    }
}

/// The body of `GET path` from 127.0.0.1:`port`, over plain HTTP/1.0.
fn http_get(port: u16, path: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))
        .map_err(|e| format!("connecting to 127.0.0.1:{port}: {e}"))?;
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .map_err(|e| format!("asking 127.0.0.1:{port} for {path}: {e}"))?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .map_err(|e| format!("reading {path} from 127.0.0.1:{port}: {e}"))?;
    match answer.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.") && head.contains(" 200 ") => {
            Ok(body.to_owned())
        }
        _ => Err(format!(
            "127.0.0.1:{port}{path} answered {:?}",
            answer.lines().next()
        )),
    }
}

/// Creates `namespace` in `cp` unless it exists.
fn create_namespace(cp: &ControlPlane, namespace: &str) -> Result<(), String> {
    let quiet = |cmd: &mut Command| {
        cmd.stdout(Stdio::null())
            .stderr(Stdio::null())
            .stdin(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if quiet(cp.kubectl().args(["create", "namespace", namespace]))
        || quiet(cp.kubectl().args(["get", "namespace", namespace]))
    {
        Ok(())
    } else {
        Err(format!("cannot create namespace {namespace}"))
    }
}

/// What a placeholder stands for in one run.
struct Values {
    kubeconfig: String,
    cert_dir: String,
    ports: BTreeMap<String, u16>,
}

impl Values {
    /// `text` with its placeholders replaced; a port is picked the first time its name appears.
    fn substitute(&mut self, text: &str) -> Result<String, String> {
        let mut out = String::new();
        let mut copied = 0;
        for (start, end, placeholder) in placeholders(text)? {
            out.push_str(&text[copied..start]);
            out.push_str(&match placeholder {
                Placeholder::Kubeconfig => self.kubeconfig.clone(),
                Placeholder::CertDir => self.cert_dir.clone(),
                Placeholder::Port(name) => match self.ports.get(name) {
                    Some(port) => port.to_string(),
                    None => {
                        let port = free_loopback_port()?.port();
                        self.ports.insert(name.to_owned(), port);
                        port.to_string()
                    }
                },
            });
            copied = end;
        }
        out.push_str(&text[copied..]);
        Ok(out)
    }
}

#[derive(Debug, PartialEq)]
enum Placeholder<'a> {
    Kubeconfig,
    CertDir,
    Port(&'a str),
}

/// The placeholders in `text`, each with the byte range it spans.
fn placeholders(text: &str) -> Result<Vec<(usize, usize, Placeholder<'_>)>, String> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(open) = text[from..].find('{').map(|i| from + i) {
        let close = text[open..]
            .find('}')
            .map(|i| open + i)
            .ok_or_else(|| format!("{{ at byte {open} is not closed"))?;
        let inner = &text[open + 1..close];
        let placeholder = match inner {
            "kubeconfig" => Placeholder::Kubeconfig,
            "cert_dir" => Placeholder::CertDir,
            _ => match inner.strip_prefix("port:") {
                Some(name) if is_port_name(name) => Placeholder::Port(name),
                _ => {
                    return Err(format!(
                        "unknown placeholder {{{inner}}} (known: {{kubeconfig}}, {{cert_dir}}, \
                         {{port:NAME}} with NAME of letters, digits, '-' and '_')"
                    ));
                }
            },
        };
        found.push((open, close + 1, placeholder));
        from = close + 1;
    }
    if let Some(close) = text[from..].find('}') {
        return Err(format!("}} at byte {} has no {{", from + close));
    }
    Ok(found)
}

fn is_port_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

fn is_dns_label(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory holding an executable-looking `manager` file and a `crds/` directory.
    fn base() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("manager"), "").expect("write");
        std::fs::create_dir(dir.path().join("crds")).expect("mkdir");
        dir
    }

    fn parse(text: &str) -> Result<ManagerUnderTest, String> {
        let dir = base();
        ManagerUnderTest::parse(text, dir.path()).map(|mut m| {
            // Paths inside the deleted directory: keep only what follows it.
            let strip = |p: &Path| p.strip_prefix(dir.path()).unwrap_or(p).to_owned();
            m.binary = strip(&m.binary);
            m.apply = m.apply.iter().map(|p| strip(p)).collect();
            m
        })
    }

    #[test]
    fn a_full_description_is_read_with_paths_relative_to_its_directory() {
        let m = parse(
            "# upstream\n\
             name: upstream v1.9.0\n\
             binary: manager\n\
             args: [\"--kubeconfig={kubeconfig}\", \"--metrics-addr=127.0.0.1:{port:metrics}\"]\n\
             env:\n  WEBHOOK_PORT: \"{port:webhook}\"\n  WEBHOOK_CERT_DIR: \"{cert_dir}\"\n\
             apply: [crds]\n\
             namespaces: [kruise-system, kruise-daemon-config]\n",
        )
        .expect("valid");
        assert_eq!(
            m,
            ManagerUnderTest {
                name: "upstream v1.9.0".into(),
                binary: "manager".into(),
                args: vec![
                    "--kubeconfig={kubeconfig}".into(),
                    "--metrics-addr=127.0.0.1:{port:metrics}".into()
                ],
                env: BTreeMap::from([
                    ("WEBHOOK_CERT_DIR".into(), "{cert_dir}".into()),
                    ("WEBHOOK_PORT".into(), "{port:webhook}".into()),
                ]),
                apply: vec!["crds".into()],
                namespaces: vec!["kruise-system".into(), "kruise-daemon-config".into()],
                wrapper: None,
            }
        );
    }

    #[test]
    fn only_the_binary_is_required_and_names_the_column_by_default() {
        let m = parse("binary: manager").expect("valid");
        assert_eq!(m.name, "manager");
        assert!(m.args.is_empty() && m.env.is_empty() && m.apply.is_empty());
    }

    /// Each mistake's error names the field it is in.
    #[test]
    fn a_bad_description_is_refused_naming_the_field() {
        let cases = [
            ("args: [a]", "binary"),
            ("binary: manager\nargz: [a]", "argz"),
            ("binary: no-such-file", "binary: "),
            ("binary: crds", "binary: "),
            ("binary: manager\nargs: --flag", "args"),
            (
                "binary: manager\nargs: [\"--x={kubecfg}\"]",
                "args[0]: unknown placeholder {kubecfg}",
            ),
            (
                "binary: manager\nargs: [ok, \"--p={port:}\"]",
                "args[1]: unknown placeholder {port:}",
            ),
            (
                "binary: manager\nargs: [\"--x={kubeconfig\"]",
                "args[0]: { at byte 4 is not closed",
            ),
            (
                "binary: manager\nargs: [\"--x=}\"]",
                "args[0]: } at byte 4 has no {",
            ),
            (
                "binary: manager\nenv: {PORT: \"{port:a b}\"}",
                "env.PORT: unknown placeholder",
            ),
            ("binary: manager\nenv: {\"A=B\": x}", "env: \"A=B\""),
            ("binary: manager\napply: [crds, missing]", "apply[1]: "),
            (
                "binary: manager\nnamespaces: [Kruise]",
                "namespaces[0]: \"Kruise\"",
            ),
            ("binary: manager\nname: \" \"", "name: is blank"),
        ];
        for (text, want) in cases {
            let err = parse(text).expect_err(text);
            assert!(
                err.contains(want),
                "{text:?}: {err:?} should contain {want:?}"
            );
        }
    }

    #[test]
    fn placeholders_take_this_runs_values_and_a_port_name_one_port() {
        let mut values = Values {
            kubeconfig: "/k".into(),
            cert_dir: "/c".into(),
            ports: BTreeMap::new(),
        };
        let a = values
            .substitute("{kubeconfig}:{port:a}/{cert_dir}-{port:b}")
            .expect("valid");
        let again = values.substitute("{port:a}").expect("valid");
        let (a_port, b_port) = (values.ports["a"], values.ports["b"]);
        assert_eq!(a, format!("/k:{a_port}//c-{b_port}"));
        assert_eq!(again, a_port.to_string());
        assert_ne!(a_port, b_port);
        assert_eq!(values.substitute("plain").expect("valid"), "plain");
    }

    #[test]
    fn ours_runs_the_built_binary_with_the_benches_flags() {
        let m = ManagerUnderTest::ours();
        assert_eq!(m.binary, crate::kruise_rs_binary());
        assert_eq!(m.args[..3], ["manager", "--kubeconfig", "{kubeconfig}"]);
        assert!(m.args.iter().all(|a| placeholders(a).is_ok()));
    }

    #[test]
    fn ours_as_deployed_serves_and_registers_its_webhooks() {
        let bare = ManagerUnderTest::ours_with_webhooks(false);
        assert!(bare.args.iter().any(|a| a == "--disable-webhooks"));
        let deployed = ManagerUnderTest::ours_with_webhooks(true);
        assert!(!deployed.args.iter().any(|a| a == "--disable-webhooks"));
        let after = |flag: &str| {
            let i = deployed.args.iter().position(|a| a == flag)?;
            deployed.args.get(i + 1).cloned()
        };
        assert_eq!(
            after("--webhook-url").as_deref(),
            Some("https://127.0.0.1:{port:webhook}")
        );
        assert_eq!(
            after("--webhook-addr").as_deref(),
            Some("127.0.0.1:{port:webhook}")
        );
        assert_ne!(bare.name, deployed.name);
    }
}
