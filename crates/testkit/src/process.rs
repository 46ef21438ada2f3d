//! Child processes: the `start.sh` scripts whose watchdog tears down what they start once this
//! process is gone, children killed however their owner ends, and running commands.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::repo_path;

/// What a `start.sh` printed, and the state directory it keeps its processes' files in.
pub struct Started {
    pub state: tempfile::TempDir,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `script` (a path inside the repository, e.g. `tests/controlplane/start.sh`) as
/// `script --owner-pid <this process> STATE_DIR`, STATE_DIR a fresh `<tmp>/<prefix>XXXXXX`, with
/// `env` on top of this process's environment. The script's watchdog stops what it started once
/// this process is gone (normal exit, panic or kill alike). A failed start leaves STATE_DIR
/// behind, for its logs; the error names it and carries the script's stderr.
pub fn start_owned(script: &str, prefix: &str, env: &[(&str, &str)]) -> Result<Started, String> {
    let path = repo_path(script);
    let state = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(|e| format!("creating a temporary directory: {e}"))?;
    let out = Command::new(&path)
        .envs(env.iter().copied())
        .arg("--owner-pid")
        .arg(std::process::id().to_string())
        .arg(state.path())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {}: {e}", path.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        let state = state.keep();
        return Err(format!(
            "{script} --owner-pid {} {} failed ({}):\n{stderr}",
            std::process::id(),
            state.display(),
            out.status,
        ));
    }
    Ok(Started {
        state,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr,
    })
}

/// Runs the `stop.sh` matching a [`start_owned`] (`tests/controlplane/stop.sh STATE_DIR`): its
/// processes and their watchdog get TERM, KILL after a grace period. Best effort, silent.
pub fn stop_owned(script: &str, state: &Path) {
    let _ = Command::new(repo_path(script))
        .arg(state)
        .stdin(Stdio::null())
        .output();
}

/// `KEY=VALUE` lines, as the scripts in `tests/node` print them.
pub fn parse_vars(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

/// A child process, killed (and reaped) however its owner ends: dropped, returning early on an
/// error, or unwinding from a panic.
pub struct ChildGuard(Child);

impl ChildGuard {
    pub fn new(child: Child) -> Self {
        ChildGuard(child)
    }

    /// Spawns `cmd` under a guard.
    pub fn spawn(cmd: &mut Command) -> Result<Self, String> {
        cmd.spawn()
            .map(ChildGuard)
            .map_err(|e| format!("starting {cmd:?}: {e}"))
    }

    pub fn id(&self) -> u32 {
        self.0.id()
    }

    /// An error naming `what` with its exit status once the child has exited.
    pub fn check_alive(&mut self, what: &str) -> Result<(), String> {
        match self.0.try_wait() {
            Ok(Some(status)) => Err(format!("{what} exited ({status})")),
            Ok(None) => Ok(()),
            Err(e) => Err(format!("waiting for {what}: {e}")),
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Kills process `pid` (SIGKILL) when dropped, e.g. when a failing test unwinds, so no binary
/// outlives its test; for a child whose `Child` is handed on (to [`terminate`], say).
pub struct KillOnDrop(pub u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", &self.0.to_string()])
            .stderr(Stdio::null())
            .status();
    }
}

/// Sends SIGTERM to `child` and returns its output once it exits; panics naming `what` unless
/// it exits within 15 s.
pub async fn terminate(mut child: Child, what: &str) -> Output {
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(kill.success());
    let output = tokio::task::spawn_blocking(move || {
        // wait_with_output closes stdin and reads stderr to the end, i.e. until the process exits.
        child.stdin.take();
        child.wait_with_output()
    });
    tokio::time::timeout(Duration::from_secs(15), output)
        .await
        .unwrap_or_else(|_| panic!("{what} exits within 15 s of SIGTERM"))
        .expect("join")
        .expect("wait")
}

/// Runs `cmd` to completion, stdin closed; a failure carries its stderr.
pub fn run(cmd: &mut Command) -> Result<(), String> {
    stdout_of(cmd).map(drop)
}

/// Runs `cmd` to completion, stdin closed, and returns its standard output, trimmed; a failure
/// carries its stderr.
pub fn stdout_of(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Runs `cmd` with `input` on its standard input and returns its output (stdout and stderr
/// captured), whatever its exit status.
pub fn output_with_stdin(cmd: &mut Command, input: &[u8]) -> Result<Output, String> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting {cmd:?}: {e}"))?;
    child
        .stdin
        .take()
        .ok_or("stdin is piped")?
        .write_all(input)
        .map_err(|e| format!("writing to {cmd:?}: {e}"))?;
    child
        .wait_with_output()
        .map_err(|e| format!("waiting for {cmd:?}: {e}"))
}

/// Writes `content` to `path` as an executable file, through a child `sh`, so that this process
/// never holds a write descriptor to it. A test thread that forks while another holds one
/// carries it into its child until that child execs, and running the file in that window fails
/// with ETXTBSY ("Text file busy").
pub fn write_executable(path: &Path, content: &str) -> Result<(), String> {
    let mut sh = Command::new("sh");
    sh.args(["-c", "cat > \"$1\" && chmod 755 \"$1\"", "sh"])
        .arg(path);
    let out = output_with_stdin(&mut sh, content.as_bytes())?;
    if !out.status.success() {
        return Err(format!(
            "writing {} failed ({}): {}",
            path.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// A loopback address nothing listens on right now, below the kernel's ephemeral port range.
/// A port from that range (what binding port 0 gives) can become the local end of any outgoing
/// connection once released, and a server restarted on it (the fault tests restart the manager
/// on one webhook port) then fails with EADDRINUSE; seen in CI.
pub fn free_loopback_port() -> Result<std::net::SocketAddr, String> {
    const LOWEST: u16 = 10_000;
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    if ephemeral_low > LOWEST {
        for _ in 0..100 {
            let port = fastrand::u16(LOWEST..ephemeral_low);
            if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", port)) {
                return listener
                    .local_addr()
                    .map_err(|e| format!("no free loopback port: {e}"));
            }
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free loopback port: {e}"))
}

/// The last `lines` lines of `files` read one after the other (missing ones skipped), with a
/// final newline; `None` when there is nothing to show.
pub fn tail(files: &[PathBuf], lines: usize) -> Option<String> {
    let mut text = String::new();
    for file in files {
        if let Ok(bytes) = std::fs::read(file) {
            text.push_str(&String::from_utf8_lossy(&bytes));
        }
    }
    if text.is_empty() {
        return None;
    }
    let all: Vec<&str> = text.lines().collect();
    let mut out = all[all.len().saturating_sub(lines)..].join("\n");
    out.push('\n');
    Some(out)
}
