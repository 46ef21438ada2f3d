//! The README's `make run` demo, run to its end as a newcomer would see it:
//! `tests/controlplane/run-local.sh` with `KRUISE_RS_DEMO=once` starts a control plane of its own,
//! three Nodes, the manager, a real containerd + registry + `kruise-rs daemon` for node-c, applies
//! `examples/`, and waits for the ImagePullJob and the SidecarSet upgrade (with pre-download) to
//! finish. Its exit status says whether they did; its output says what node-c really pulled.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The demo's own bound for each of its two steps (seconds); it finishes in ~20 s here.
const STEP_TIMEOUT: &str = "150";
/// Everything, control plane start included; beyond it the demo's processes are killed.
const TIMEOUT: Duration = Duration::from_secs(420);

/// Kills a whole process group (the demo script and everything it started) when dropped.
struct KillGroup(u32);

impl Drop for KillGroup {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.0)])
            .stderr(Stdio::null())
            .status();
    }
}

fn free_addr() -> String {
    crate::support::free_loopback_port().to_string()
}

fn append(path: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .expect("the demo's log file")
}

#[test]
fn the_demo_pulls_on_a_real_node_and_finishes_the_rollout() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let log = tempfile::NamedTempFile::new().expect("a log file");
    let mut command = Command::new("bash");
    // What cargo sets for this test (CARGO_MANIFEST_DIR, CARGO_PKG_*, ...) must not reach the
    // `cargo build` of run-local.sh: build scripts that read those variables (ring's) would run
    // again for it, and again for the next `cargo test`, rebuilding ring and everything above
    // it each time (half a minute of each of CI's integration runs).
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        let set_for_the_crate = [
            "CARGO_PKG_",
            "CARGO_MANIFEST_",
            "CARGO_BIN_",
            "CARGO_CRATE_NAME",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_TARGET_TMPDIR",
            "CARGO_RUSTC_CURRENT_DIR",
        ]
        .iter()
        .any(|prefix| name.starts_with(prefix));
        if set_for_the_crate || name == "OUT_DIR" {
            command.env_remove(&*name);
        }
    }
    let mut child = command
        .arg(repo.join("tests/controlplane/run-local.sh"))
        .current_dir(repo)
        .env("KRUISE_RS_DEMO", "once")
        // The played kubelet: the real node's demo runs in tests/cluster/e2e.sh.
        .env("KRUISE_RS_NODE", "played")
        .env("KRUISE_RS_DEMO_TIMEOUT", STEP_TIMEOUT)
        // node-c's containerd and registry start while the whole suite starts too: patience, or
        // node-c would quietly be played and the checks below fail for no fault of the demo.
        .env("KRUISE_RS_NODE_TIMEOUT", "180")
        .env("KRUISE_RS_BIN", env!("CARGO_BIN_EXE_kruise-rs"))
        .env("KRUISE_RS_PROBE_ADDR", free_addr())
        .env("KRUISE_RS_WEBHOOK_ADDR", free_addr())
        .env("KRUISE_RS_DAEMON_PROBE_ADDR", free_addr())
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        // Both into one file, each handle appending: two handles with offsets of their own
        // would overwrite each other's lines (and lose the reason of a failure).
        .stdout(append(log.path()))
        .stderr(append(log.path()))
        .process_group(0)
        .spawn()
        .expect("run-local.sh starts");
    let _group = KillGroup(child.id());

    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let mut output = String::new();
    log.reopen()
        .expect("log")
        .read_to_string(&mut output)
        .expect("read the demo's output");
    let status = status.unwrap_or_else(|| panic!("the demo ran past {TIMEOUT:?}:\n{output}"));
    assert!(status.success(), "the demo failed ({status}):\n{output}");

    for expected in [
        // node-c ran the real daemon; the stand-in played only the other two.
        "the node daemon for node-a and node-b",
        "the demo finished",
        // What node-c's daemon reported on its NodeImage, from its containerd's answers.
        "PullImageSucceed: Image registry.example.com/storefront/web:2.7.0,",
        "PullImageSucceed: Image registry.example.com/infra/log-agent:1.5.0,",
        // What that containerd holds: the ImagePullJob's image and the pre-downloaded sidecar.
        "containerd: registry.example.com/storefront/web:2.7.0",
        "containerd: registry.example.com/infra/log-agent:1.5.0",
    ] {
        assert!(output.contains(expected), "{expected:?} missing:\n{output}");
    }
    assert!(
        !output.contains("still not finished"),
        "a step timed out:\n{output}"
    );
}
