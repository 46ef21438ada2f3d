//! A loopback HTTP proxy in front of a control plane's kube-apiserver that misbehaves on purpose:
//! it answers 429 or 5xx without asking the apiserver, delays requests, hangs them, cuts watch
//! streams and holds their events back. A component under test gets a kubeconfig naming the
//! proxy ([`FaultProxy::kubeconfig`]); the proxy talks to the apiserver as the admin.
//!
//! Faults are drawn from one seeded generator (the seed is the caller's, to print and replay),
//! only while [`FaultProxy::set`] has given them, and at most `budget` times in all: a test ends
//! them with [`FaultProxy::calm`] and everything that follows is forwarded untouched.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use futures::StreamExt;
use kube::Client;

/// What the proxy does to the requests it forwards, as chances between 0 and 1 per request.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// Answered `429 Too Many Requests` with `Retry-After: 1`.
    pub too_many_requests: f64,
    /// Answered `500` or `503`, at random.
    pub server_error: f64,
    /// Forwarded after a wait between `min_delay` and `max_delay` (at least `min_delay`, when
    /// that is the larger).
    pub delay: f64,
    pub min_delay: Duration,
    pub max_delay: Duration,
    /// Held for `hang_for`, then answered `504` (never forwarded).
    pub hang: f64,
    pub hang_for: Duration,
    /// A watch whose stream ends after a random time of up to `max_watch_life`.
    pub cut_watch: f64,
    pub max_watch_life: Duration,
    /// A watch whose every chunk of events is held up to `max_stall`.
    pub stall_watch: f64,
    pub max_stall: Duration,
    /// Only requests whose path and query contain this meet faults (and count towards the
    /// chances above); the others are forwarded untouched. `None`: every request.
    pub only_where: Option<String>,
}

impl Faults {
    /// Every kind of fault, often enough that a few minutes of a controller's traffic meet each
    /// many times, mild enough that work still gets done between them.
    pub fn everything() -> Self {
        Faults {
            too_many_requests: 0.05,
            server_error: 0.05,
            delay: 0.1,
            min_delay: Duration::ZERO,
            max_delay: Duration::from_millis(1500),
            hang: 0.02,
            hang_for: Duration::from_secs(5),
            cut_watch: 0.3,
            max_watch_life: Duration::from_secs(10),
            stall_watch: 0.2,
            max_stall: Duration::from_secs(2),
            only_where: None,
        }
    }
}

/// How many faults of each kind the proxy has injected, and how many requests it forwarded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Injected {
    pub forwarded: u64,
    pub too_many_requests: u64,
    pub server_errors: u64,
    pub delays: u64,
    pub hangs: u64,
    pub cut_watches: u64,
    pub stalled_watches: u64,
}

impl Injected {
    pub fn total(&self) -> u64 {
        self.too_many_requests
            + self.server_errors
            + self.delays
            + self.hangs
            + self.cut_watches
            + self.stalled_watches
    }
}

struct Shared {
    upstream: Client,
    state: Mutex<FaultState>,
    /// While true, no watch passes an event on ([`FaultProxy::hold_watch_events`]).
    held: tokio::sync::watch::Sender<bool>,
    /// Every request's method, path and query, in arrival order ([`FaultProxy::requests`]).
    seen: Mutex<Vec<String>>,
}

struct FaultState {
    faults: Faults,
    rng: fastrand::Rng,
    budget: u64,
    injected: Injected,
    /// Requests and watches decided while the budget was not spent, for [`FaultState::hit`].
    requests: u64,
    watches: u64,
}

/// What happens to one request, decided when it arrives.
#[derive(Debug)]
enum Fate {
    TooManyRequests,
    ServerError(u16),
    Hang(Duration),
    Forward {
        delay: Option<Duration>,
        cut_after: Option<Duration>,
        stall: Option<Duration>,
    },
}

impl FaultState {
    /// Draws `chance`, spending one fault of the budget when it hits. A kind not `met` yet after
    /// `1 / chance` of the `eligible` requests is due and hits without a draw: a test that asks
    /// for every kind meets every kind whatever the seed, once its traffic is that large (a
    /// 2 % hang missed all of 228 requests once in a while otherwise).
    fn hit(&mut self, chance: f64, met: u64, eligible: u64) -> bool {
        if self.budget == 0 || chance <= 0.0 {
            return false;
        }
        let due = met == 0 && eligible as f64 * chance >= 1.0;
        let hit = due || self.rng.f64() < chance;
        if hit {
            self.budget -= 1;
        }
        hit
    }

    fn decide(&mut self, is_watch: bool, path_and_query: &str) -> Fate {
        let f = self.faults.clone();
        if f.only_where
            .as_deref()
            .is_some_and(|part| !path_and_query.contains(part))
        {
            self.injected.forwarded += 1;
            return Fate::Forward {
                delay: None,
                cut_after: None,
                stall: None,
            };
        }
        if self.budget > 0 {
            self.requests += 1;
            self.watches += u64::from(is_watch);
        }
        let (requests, watches) = (self.requests, self.watches);
        if self.hit(
            f.too_many_requests,
            self.injected.too_many_requests,
            requests,
        ) {
            self.injected.too_many_requests += 1;
            return Fate::TooManyRequests;
        }
        if self.hit(f.server_error, self.injected.server_errors, requests) {
            self.injected.server_errors += 1;
            return Fate::ServerError(if self.rng.bool() { 500 } else { 503 });
        }
        if self.hit(f.hang, self.injected.hangs, requests) {
            self.injected.hangs += 1;
            return Fate::Hang(f.hang_for);
        }
        let delay = self.hit(f.delay, self.injected.delays, requests).then(|| {
            self.injected.delays += 1;
            f.min_delay + up_to(&mut self.rng, f.max_delay.saturating_sub(f.min_delay))
        });
        let cut_after = (is_watch && self.hit(f.cut_watch, self.injected.cut_watches, watches))
            .then(|| {
                self.injected.cut_watches += 1;
                up_to(&mut self.rng, f.max_watch_life)
            });
        let stall = (is_watch && self.hit(f.stall_watch, self.injected.stalled_watches, watches))
            .then(|| {
                self.injected.stalled_watches += 1;
                up_to(&mut self.rng, f.max_stall)
            });
        self.injected.forwarded += 1;
        Fate::Forward {
            delay,
            cut_after,
            stall,
        }
    }
}

fn up_to(rng: &mut fastrand::Rng, max: Duration) -> Duration {
    max.mul_f64(rng.f64())
}

/// How many requests [`FaultProxy::requests`] keeps between two calls.
const MAX_SEEN: usize = 100_000;

/// The proxy, serving until dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    kubeconfig: tempfile::NamedTempFile,
    server: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Starts one on a free loopback port, forwarding to the apiserver `upstream` talks to (a
    /// client without a read timeout of its own: watches last as long as their callers ask).
    /// No faults until [`set`](Self::set).
    pub async fn start(upstream: Client, seed: u64) -> Result<Self, String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("binding the fault proxy: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("the fault proxy's address: {e}"))?;
        let shared = Arc::new(Shared {
            upstream,
            state: Mutex::new(FaultState {
                faults: Faults::default(),
                rng: fastrand::Rng::with_seed(seed),
                budget: 0,
                injected: Injected::default(),
                requests: 0,
                watches: 0,
            }),
            held: tokio::sync::watch::Sender::new(false),
            seen: Mutex::default(),
        });
        let app = axum::Router::new()
            .fallback(forward)
            .with_state(shared.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let kubeconfig = write_kubeconfig(addr)?;
        Ok(FaultProxy {
            addr,
            shared,
            kubeconfig,
            server,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A kubeconfig whose only cluster is this proxy (plain HTTP on loopback, no credentials).
    pub fn kubeconfig(&self) -> &Path {
        self.kubeconfig.path()
    }

    /// From now on, `faults`, at most `budget` more of them.
    pub fn set(&self, faults: Faults, budget: u64) {
        let mut state = self.lock();
        state.faults = faults;
        state.budget = budget;
    }

    /// No more faults: every request from now on is forwarded as it came. Streams already
    /// cut short or stalled keep their fate.
    pub fn calm(&self) {
        self.set(Faults::default(), 0);
    }

    /// Holds back every event of every watch, open or opened later, until
    /// [`release_watch_events`](Self::release_watch_events): the caches behind the proxy stop
    /// seeing changes (how far behind a watch can fall), while lists and reads stay current.
    pub fn hold_watch_events(&self) {
        self.shared.held.send_replace(true);
    }

    /// Lets the held events through, in order.
    pub fn release_watch_events(&self) {
        self.shared.held.send_replace(false);
    }

    pub fn injected(&self) -> Injected {
        self.lock().injected.clone()
    }

    /// The requests that arrived so far (`GET /api/v1/pods?watch=true&...`), oldest first (the
    /// first 100,000 since the last call), and forgets them: what the next call returns
    /// starts after this one.
    pub fn requests(&self) -> Vec<String> {
        std::mem::take(&mut *self.shared.seen.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FaultState> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn write_kubeconfig(addr: SocketAddr) -> Result<tempfile::NamedTempFile, String> {
    use std::io::Write;
    let mut file = tempfile::Builder::new()
        .prefix("kruise-rs-fault-proxy-")
        .suffix(".kubeconfig")
        .tempfile()
        .map_err(|e| format!("creating the fault proxy's kubeconfig: {e}"))?;
    write!(
        file,
        "apiVersion: v1\nkind: Config\n\
         clusters: [{{name: fault-proxy, cluster: {{server: 'http://{addr}'}}}}]\n\
         users: [{{name: fault-proxy, user: {{}}}}]\n\
         contexts: [{{name: fault-proxy, context: {{cluster: fault-proxy, user: fault-proxy}}}}]\n\
         current-context: fault-proxy\n"
    )
    .map_err(|e| format!("writing the fault proxy's kubeconfig: {e}"))?;
    Ok(file)
}

fn is_watch(query: Option<&str>) -> bool {
    query.is_some_and(|q| {
        q.split('&')
            .any(|pair| pair == "watch=true" || pair == "watch=1")
    })
}

/// A `Status` body, as the apiserver would send it, so that clients parse the refusal.
fn status(code: u16, reason: &str, message: &str) -> Response {
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
    });
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() =
        http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    if code == 429 {
        headers.insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("1"),
        );
    }
    response
}

async fn forward(
    State(shared): State<Arc<Shared>>,
    request: Request,
) -> Result<Response, Infallible> {
    let watch = is_watch(request.uri().query());
    {
        let mut seen = shared.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.len() < MAX_SEEN {
            seen.push(format!("{} {}", request.method(), request.uri()));
        }
    }
    let target = request.uri().path_and_query().map_or("/", |p| p.as_str());
    let fate = shared
        .state
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .decide(watch, target);
    let (delay, cut_after, stall) = match fate {
        Fate::TooManyRequests => {
            return Ok(status(
                429,
                "TooManyRequests",
                "fault proxy: too many requests",
            ));
        }
        Fate::ServerError(code) => {
            return Ok(status(code, "InternalError", "fault proxy: server error"));
        }
        Fate::Hang(duration) => {
            tokio::time::sleep(duration).await;
            return Ok(status(504, "Timeout", "fault proxy: the request hung"));
        }
        Fate::Forward {
            delay,
            cut_after,
            stall,
        } => (delay, cut_after, stall),
    };
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }

    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, 64 << 20).await else {
        return Ok(status(
            413,
            "RequestEntityTooLarge",
            "fault proxy: body unreadable",
        ));
    };
    let path_and_query = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let mut upstream_request = http::Request::builder()
        .method(parts.method.clone())
        .uri(path_and_query);
    for (name, value) in &parts.headers {
        // The proxy's own connection and credentials are its business, not the caller's.
        if !matches!(
            name.as_str(),
            "host" | "authorization" | "connection" | "content-length" | "transfer-encoding"
        ) {
            upstream_request = upstream_request.header(name, value);
        }
    }
    let Ok(upstream_request) = upstream_request.body(kube::client::Body::from(body.to_vec()))
    else {
        return Ok(status(
            400,
            "BadRequest",
            "fault proxy: cannot rebuild the request",
        ));
    };
    let response = match shared.upstream.send(upstream_request).await {
        Ok(response) => response,
        Err(e) => {
            return Ok(status(
                503,
                "ServiceUnavailable",
                &format!("fault proxy: the apiserver did not answer: {e}"),
            ));
        }
    };
    let (parts, body) = response.into_parts();
    let mut chunks = Body::new(body).into_data_stream().boxed();
    if let Some(stall) = stall {
        chunks = chunks
            .then(move |chunk| async move {
                tokio::time::sleep(stall).await;
                chunk
            })
            .boxed();
    }
    if watch {
        let held = shared.held.subscribe();
        chunks = chunks
            .then(move |chunk| {
                let mut held = held.clone();
                async move {
                    let _ = held.wait_for(|held| !*held).await;
                    chunk
                }
            })
            .boxed();
    }
    if let Some(life) = cut_after {
        let end = tokio::time::sleep(life);
        chunks = chunks.take_until(end).boxed();
    }
    let mut out = Response::new(Body::from_stream(chunks));
    *out.status_mut() = parts.status;
    for (name, value) in &parts.headers {
        if !matches!(
            name.as_str(),
            "connection" | "content-length" | "transfer-encoding"
        ) {
            out.headers_mut().append(name, value.clone());
        }
    }
    Ok(out)
}

/// The pids file of a control plane started by `tests/controlplane/start.sh` names its
/// processes; this restarts one of them (`etcd`, `kube-apiserver`) with the command line it
/// was started with: TERM (KILL after 20 s), then the same argv in a session of its own, its
/// output appended to `<state>/<name>.restarted.log`, and the pids file updated so that
/// `stop.sh` stops the new process. Returns once the old one is gone and the new one started;
/// readiness is the caller's to wait for.
pub fn restart_control_plane_process(state: &Path, name: &str) -> Result<u32, String> {
    let pids_file = state.join("pids");
    let pids = std::fs::read_to_string(&pids_file)
        .map_err(|e| format!("reading {}: {e}", pids_file.display()))?;
    let pid: u32 = pids
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .ok_or_else(|| format!("{name} is not in {}", pids_file.display()))?;
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let cmdline = std::fs::read(proc_dir.join("cmdline"))
        .map_err(|e| format!("reading {name}'s command line: {e}"))?;
    let argv: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let cwd = std::fs::read_link(proc_dir.join("cwd"))
        .map_err(|e| format!("reading {name}'s working directory: {e}"))?;
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| format!("{name} ({pid}) has an empty command line"))?;

    let signal = |sig: &str| {
        let _ = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .stderr(std::process::Stdio::null())
            .status();
    };
    signal("-TERM");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while proc_dir.exists() && !is_zombie(&proc_dir) {
        if std::time::Instant::now() >= deadline {
            signal("-KILL");
        }
        std::thread::sleep(Duration::from_millis(50));
    }

    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(state.join(format!("{name}.restarted.log")))
        .map_err(|e| format!("opening {name}'s log: {e}"))?;
    let log_err = log
        .try_clone()
        .map_err(|e| format!("opening {name}'s log: {e}"))?;
    let mut child = std::process::Command::new("setsid")
        .arg(program)
        .args(args)
        .current_dir(cwd)
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .spawn()
        .map_err(|e| format!("starting {name} again: {e}"))?;
    let new_pid = child.id();
    // Reaped when it ends (stop.sh), so that no zombie outlives it and fools stop.sh's wait.
    std::thread::spawn(move || child.wait());

    let updated: Vec<String> = pids
        .lines()
        .map(|l| {
            if l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' '))
            {
                format!("{name} {new_pid}")
            } else {
                l.to_owned()
            }
        })
        .collect();
    std::fs::write(&pids_file, updated.join("\n") + "\n")
        .map_err(|e| format!("writing {}: {e}", pids_file.display()))?;
    Ok(new_pid)
}

fn is_zombie(proc_dir: &Path) -> bool {
    std::fs::read_to_string(proc_dir.join("stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

/// Counts, by label, for a test's summary line.
pub fn describe(injected: &Injected) -> String {
    let counts = BTreeMap::from([
        ("forwarded", injected.forwarded),
        ("429", injected.too_many_requests),
        ("5xx", injected.server_errors),
        ("delayed", injected.delays),
        ("hung", injected.hangs),
        ("watch cut", injected.cut_watches),
        ("watch stalled", injected.stalled_watches),
    ]);
    counts
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(faults: Faults, budget: u64, seed: u64) -> FaultState {
        FaultState {
            faults,
            rng: fastrand::Rng::with_seed(seed),
            budget,
            injected: Injected::default(),
            requests: 0,
            watches: 0,
        }
    }

    fn fates(state: &mut FaultState, n: usize, watch: bool) -> Vec<String> {
        fates_at(state, n, watch, "/api/v1/pods")
    }

    fn fates_at(state: &mut FaultState, n: usize, watch: bool, target: &str) -> Vec<String> {
        (0..n)
            .map(|_| format!("{:?}", state.decide(watch, target)))
            .collect()
    }

    #[test]
    fn the_budget_bounds_the_faults_and_then_everything_is_forwarded() {
        let mut s = state(Faults::everything(), 25, 7);
        fates(&mut s, 2000, true);
        assert_eq!(s.injected.total(), 25);
        assert_eq!(s.budget, 0);
        let after = fates(&mut s, 100, true);
        assert!(
            after
                .iter()
                .all(|f| f.starts_with("Forward { delay: None, cut_after: None, stall: None")),
            "{after:?}"
        );
    }

    #[test]
    fn no_faults_while_none_are_given() {
        let mut s = state(Faults::default(), 1000, 7);
        fates(&mut s, 500, true);
        assert_eq!(s.injected.total(), 0);
        assert_eq!(s.injected.forwarded, 500);
    }

    #[test]
    fn one_seed_one_sequence_of_fates() {
        let a = fates(&mut state(Faults::everything(), 1000, 42), 300, true);
        let b = fates(&mut state(Faults::everything(), 1000, 42), 300, true);
        let c = fates(&mut state(Faults::everything(), 1000, 43), 300, true);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn watch_faults_only_meet_watches() {
        let faults = Faults {
            cut_watch: 1.0,
            stall_watch: 1.0,
            max_watch_life: Duration::from_secs(1),
            max_stall: Duration::from_secs(1),
            ..Faults::default()
        };
        let mut s = state(faults, 1000, 1);
        fates(&mut s, 50, false);
        assert_eq!(s.injected.total(), 0);
        fates(&mut s, 50, true);
        assert_eq!(
            (s.injected.cut_watches, s.injected.stalled_watches),
            (50, 50)
        );
    }

    #[test]
    fn every_kind_given_is_met_once_its_share_of_the_traffic_has_come() {
        // Hangs at 2 %: due by the 50th request whatever the seed; cuts at 30 % by the 4th watch.
        for seed in 0..200 {
            let mut s = state(Faults::everything(), 1000, seed);
            fates(&mut s, 60, true);
            let i = &s.injected;
            assert!(
                [
                    i.too_many_requests,
                    i.server_errors,
                    i.delays,
                    i.hangs,
                    i.cut_watches,
                    i.stalled_watches
                ]
                .iter()
                .all(|n| *n > 0),
                "seed {seed}: {i:?}"
            );
        }
        // A kind not given is never due.
        let mut s = state(
            Faults {
                hang: 0.5,
                ..Faults::default()
            },
            1000,
            3,
        );
        fates(&mut s, 100, true);
        assert_eq!(s.injected.total(), s.injected.hangs);
    }

    #[test]
    fn faults_given_for_some_requests_meet_only_those() {
        let faults = Faults {
            server_error: 1.0,
            only_where: Some("fieldSelector=metadata.name%3Dx".to_owned()),
            ..Faults::default()
        };
        let mut s = state(faults, 3, 1);
        fates_at(&mut s, 50, false, "/apis/g/v1/things?limit=500");
        assert_eq!((s.injected.total(), s.budget), (0, 3), "other requests");
        let hit = fates_at(
            &mut s,
            4,
            false,
            "/apis/g/v1/things?fieldSelector=metadata.name%3Dx",
        );
        assert_eq!(s.injected.server_errors, 3, "{hit:?}");
        assert!(hit[3].starts_with("Forward"), "the budget spent: {hit:?}");
    }

    #[test]
    fn watches_are_told_by_their_query() {
        assert!(is_watch(Some("watch=true&resourceVersion=5")));
        assert!(is_watch(Some("labelSelector=a&watch=1")));
        assert!(!is_watch(Some("labelSelector=watch%3Dtrue")));
        assert!(!is_watch(Some("watch=false")));
        assert!(!is_watch(None));
    }
}
