use std::collections::VecDeque;
use std::sync::Mutex;

use super::*;
use crate::plan::TagKey;
use kruise_rs_api::nodeimage::SandboxConfig;

/// Answers from a script, records every call with the (paused) time it was made.
#[derive(Default)]
struct Scripted {
    present: Mutex<VecDeque<Option<PresentImage>>>,
    pulls: Mutex<VecDeque<Result<(), &'static str>>>,
    /// `Some(d)`: every pull takes `d`.
    pull_delay: Option<Duration>,
    calls: Mutex<Vec<(Duration, String)>>,
    started: Option<Instant>,
    /// `Some(t)`: the runtime does not answer a check before `t` after the start.
    down_until: Option<Duration>,
    /// The image filesystems the runtime names.
    filesystems: Vec<String>,
    /// When it was asked for them (apart from `calls`, which the other tests compare whole).
    filesystem_asks: Mutex<Vec<Duration>>,
}

/// A scripted pull result: the runtime could not be reached.
const DOWN: &str = "<transport error>";

impl Scripted {
    fn new() -> Self {
        Self {
            started: Some(Instant::now()),
            ..Self::default()
        }
    }
    fn record(&self, call: String) {
        let at = self.started.map(|s| s.elapsed()).unwrap_or_default();
        self.calls.lock().unwrap().push((at, call));
    }
    fn calls(&self) -> Vec<(Duration, String)> {
        self.calls.lock().unwrap().clone()
    }
}

fn present(id: &str, digests: &[&str]) -> PresentImage {
    PresentImage {
        id: id.into(),
        repo_digests: digests.iter().map(|d| d.to_string()).collect(),
    }
}

impl ImageRuntime for Scripted {
    async fn image_status(&self, image: &str) -> Result<Option<PresentImage>, CriError> {
        self.record(format!("status {image}"));
        Ok(self.present.lock().unwrap().pop_front().flatten())
    }
    async fn pull_image(
        &self,
        image: &str,
        auth: Option<AuthConfig>,
        sandbox: PodSandboxConfig,
    ) -> Result<String, CriError> {
        let who = auth
            .map(|a| a.username)
            .unwrap_or_else(|| "anonymous".into());
        let mut labels: Vec<_> = sandbox.labels.into_iter().collect();
        labels.sort();
        self.record(format!("pull {image} as {who} labels {labels:?}"));
        if let Some(delay) = self.pull_delay {
            tokio::time::sleep(delay).await;
        }
        match self.pulls.lock().unwrap().pop_front().unwrap_or(Ok(())) {
            Ok(()) => Ok("sha256:cfg".into()),
            Err(DOWN) => Err(CriError {
                message: "transport error".into(),
                unreachable: true,
            }),
            Err(message) => Err(CriError::answered(message)),
        }
    }
    async fn image_filesystems(&self) -> Result<Vec<String>, CriError> {
        let at = self.started.map(|s| s.elapsed()).unwrap_or_default();
        self.filesystem_asks.lock().unwrap().push(at);
        Ok(self.filesystems.clone())
    }
    async fn check(&self) -> Result<(), CriError> {
        let at = self.started.map(|s| s.elapsed()).unwrap_or_default();
        self.record("check".into());
        match self.down_until {
            Some(until) if at < until => Err(CriError {
                message: "connection refused".into(),
                unreachable: true,
            }),
            _ => Ok(()),
        }
    }
}

/// [`pull`] holding the only slot of a node of its own.
async fn pull<R: ImageRuntime>(
    runtime: &R,
    task: &PullTask,
    input: &PullInput<'_>,
) -> Result<ImageId, String> {
    let slots = FairSlots::new(1);
    let mut slot = Slot::acquire(&slots, "").await.unwrap();
    super::pull(runtime, &mut slot, task, input).await
}

/// The times of the calls that start with `what`, in whole seconds.
fn times_of(rt: &Scripted, what: &str) -> Vec<u64> {
    rt.calls()
        .iter()
        .filter(|c| c.1.starts_with(what))
        .map(|c| c.0.as_secs())
        .collect()
}

fn task(attempts: u32) -> PullTask {
    PullTask {
        key: TagKey::new("r/app", "v1"),
        version: 1,
        attempts,
        timeout: Duration::from_secs(600),
        active_deadline: None,
        if_not_present: false,
        sandbox: SandboxConfig {
            labels: [("app".to_owned(), "foo".to_owned())].into(),
            annotations: [("a".to_owned(), "b".to_owned())].into(),
        },
        pull_secrets: vec![],
        started_at: None,
        owners: vec![],
    }
}

const IMAGE: &str = "127.0.0.1:5000/r/app:v1";
const NAME: &str = "127.0.0.1:5000/r/app";

/// No limit on the image filesystem (the scripted runtime names none anyway).
static NO_LIMIT: std::sync::LazyLock<ImageFsGuard> =
    std::sync::LazyLock::new(|| ImageFsGuard::new(100));

fn input<'a>(credentials: &'a [&'a Credential]) -> PullInput<'a> {
    PullInput {
        image: IMAGE,
        name: NAME,
        credentials,
        credential_problems: &[],
        elapsed: Duration::ZERO,
        image_fs: &NO_LIMIT,
        kubelet_busy: None,
    }
}

fn credential(user: &str) -> Credential {
    Credential {
        username: user.into(),
        password: "pw".into(),
        identity_token: String::new(),
        registry_token: String::new(),
        server_address: "127.0.0.1:5000".into(),
        source: format!("ns/{user}"),
    }
}

#[tokio::test(start_paused = true)]
async fn success_reports_the_repo_digest_under_the_pulled_name() {
    let rt = Scripted::new();
    rt.present.lock().unwrap().push_back(Some(present(
        "sha256:cfg",
        &["other/name@sha256:x", "127.0.0.1:5000/r/app@sha256:abc"],
    )));
    let id = pull(&rt, &task(1), &input(&[])).await.unwrap();
    assert_eq!(id, "127.0.0.1:5000/r/app@sha256:abc");
    let calls: Vec<String> = rt.calls().into_iter().map(|c| c.1).collect();
    assert_eq!(
        calls,
        [
            format!("pull {IMAGE} as anonymous labels [(\"app\", \"foo\")]"),
            format!("status {IMAGE}")
        ]
    );
}

#[test]
fn without_repo_digests_the_id_is_name_at_image_id() {
    assert_eq!(
        image_id(NAME, &present("sha256:cfg", &[])),
        "127.0.0.1:5000/r/app@sha256:cfg"
    );
}

#[tokio::test(start_paused = true)]
async fn if_not_present_with_the_image_there_does_not_pull() {
    let rt = Scripted::new();
    rt.present.lock().unwrap().push_back(Some(present(
        "sha256:cfg",
        &["127.0.0.1:5000/r/app@sha256:abc"],
    )));
    let mut t = task(3);
    t.if_not_present = true;
    assert_eq!(
        pull(&rt, &t, &input(&[])).await.unwrap(),
        "127.0.0.1:5000/r/app@sha256:abc"
    );
    assert_eq!(rt.calls().len(), 1, "{:?}", rt.calls());
}

#[tokio::test(start_paused = true)]
async fn if_not_present_without_the_image_pulls() {
    let rt = Scripted::new();
    rt.present
        .lock()
        .unwrap()
        .extend([None, Some(present("sha256:cfg", &[]))]);
    let mut t = task(3);
    t.if_not_present = true;
    pull(&rt, &t, &input(&[])).await.unwrap();
    let calls: Vec<String> = rt.calls().into_iter().map(|c| c.1).collect();
    assert!(calls[1].starts_with("pull "), "{calls:?}");
    assert_eq!(calls.len(), 3);
}

#[tokio::test(start_paused = true)]
async fn failures_retry_with_growing_backoff_then_report_the_last_error() {
    let rt = Scripted::new();
    rt.pulls.lock().unwrap().extend([
        Err("e1"),
        Err("e2"),
        Err("e3"),
        Err("not found: manifest unknown"),
    ]);
    let err = pull(&rt, &task(4), &input(&[])).await.unwrap_err();
    assert_eq!(
        err,
        format!("pulling {IMAGE} failed after 4 attempts: not found: manifest unknown")
    );
    let times: Vec<u64> = rt.calls().iter().map(|c| c.0.as_secs()).collect();
    // Attempts at 0s, then after 1s, 2s and 4s of backoff.
    assert_eq!(times, [0, 1, 3, 7]);
}

#[test]
fn backoff_doubles_and_caps() {
    let secs: Vec<u64> = (1..=8).map(|a| backoff(a).as_secs()).collect();
    assert_eq!(secs, [1, 2, 4, 8, 16, 30, 30, 30]);
    assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
}

#[tokio::test(start_paused = true)]
async fn a_slow_attempt_times_out_and_counts_as_a_failure() {
    let rt = Scripted {
        pull_delay: Some(Duration::from_secs(100)),
        ..Scripted::new()
    };
    let mut t = task(2);
    t.timeout = Duration::from_secs(5);
    let err = pull(&rt, &t, &input(&[])).await.unwrap_err();
    assert_eq!(
        err,
        format!("pulling {IMAGE} failed after 2 attempts: pull attempt timed out after 5s")
    );
    let times: Vec<u64> = rt.calls().iter().map(|c| c.0.as_secs()).collect();
    assert_eq!(times, [0, 6]);
}

#[tokio::test(start_paused = true)]
async fn the_active_deadline_clips_the_attempt_and_ends_the_retries() {
    let rt = Scripted {
        pull_delay: Some(Duration::from_secs(100)),
        ..Scripted::new()
    };
    let mut t = task(10);
    t.timeout = Duration::from_secs(60);
    t.active_deadline = Some(Duration::from_secs(20));
    let started = Instant::now();
    let mut inp = input(&[]);
    // 12s were spent before a restart: 8s are left.
    inp.elapsed = Duration::from_secs(12);
    let err = pull(&rt, &t, &inp).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_secs(8));
    assert_eq!(
        err,
        format!(
            "pulling {IMAGE} exceeded activeDeadlineSeconds (20s): pull attempt timed out after 8s"
        )
    );
    assert_eq!(rt.calls().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_deadline_already_past_fails_without_pulling() {
    let rt = Scripted::new();
    let mut t = task(3);
    t.active_deadline = Some(Duration::from_secs(10));
    let mut inp = input(&[]);
    inp.elapsed = Duration::from_secs(11);
    let err = pull(&rt, &t, &inp).await.unwrap_err();
    assert_eq!(
        err,
        format!("pulling {IMAGE} exceeded activeDeadlineSeconds (10s)")
    );
    assert!(rt.calls().is_empty());
}

#[tokio::test(start_paused = true)]
async fn each_matching_credential_is_tried_and_never_anonymous() {
    let rt = Scripted::new();
    rt.pulls
        .lock()
        .unwrap()
        .extend([Err("401 Unauthorized"), Err("401 Unauthorized")]);
    let (a, b) = (credential("alice"), credential("bob"));
    let creds = [&a, &b];
    let err = pull(&rt, &task(1), &input(&creds)).await.unwrap_err();
    assert_eq!(
        err,
        format!(
            "pulling {IMAGE} failed after 1 attempt: with the credentials of ns/alice for \
                 127.0.0.1:5000: 401 Unauthorized; with the credentials of ns/bob for \
                 127.0.0.1:5000: 401 Unauthorized"
        )
    );
    let who: Vec<String> = rt.calls().into_iter().map(|c| c.1).collect();
    assert!(
        who[0].contains("as alice") && who[1].contains("as bob"),
        "{who:?}"
    );
    assert_eq!(who.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_second_credential_can_succeed() {
    let rt = Scripted::new();
    rt.pulls.lock().unwrap().push_back(Err("401 Unauthorized"));
    rt.present
        .lock()
        .unwrap()
        .push_back(Some(present("sha256:cfg", &[])));
    let (a, b) = (credential("alice"), credential("bob"));
    let creds = [&a, &b];
    pull(&rt, &task(1), &input(&creds)).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn credential_problems_are_part_of_the_failure() {
    let rt = Scripted::new();
    rt.pulls.lock().unwrap().push_back(Err("401 Unauthorized"));
    let problems = ["pull secret ns/s cannot be read: secrets \"s\" not found".to_owned()];
    let mut inp = input(&[]);
    inp.credential_problems = &problems;
    let err = pull(&rt, &task(1), &inp).await.unwrap_err();
    assert!(
        err.ends_with(
            ": 401 Unauthorized; pull secret ns/s cannot be read: secrets \"s\" not found"
        ),
        "{err}"
    );
}

#[test]
fn credentials_reach_cri_without_a_server_address() {
    let auth = auth_config(&credential("alice"));
    assert_eq!(
        (auth.username.as_str(), auth.password.as_str()),
        ("alice", "pw")
    );
    assert!(auth.server_address.is_empty());
}

#[test]
fn sandbox_config_carries_labels_annotations_and_the_daemon_mark() {
    let config = sandbox_config(&task(1));
    assert_eq!(config.labels["app"], "foo");
    assert_eq!(config.annotations["a"], "b");
    assert_eq!(config.annotations[PULLING_IMAGE_BY], PULLING_IMAGE_BY_VALUE);
    assert!(config.metadata.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_deadline_beyond_the_clock_is_no_deadline() {
    for limit in [Duration::from_secs(i64::MAX.unsigned_abs()), Duration::MAX] {
        let rt = Scripted::new();
        rt.present
            .lock()
            .unwrap()
            .push_back(Some(present("sha256:cfg", &[])));
        let mut t = task(1);
        t.active_deadline = Some(limit);
        pull(&rt, &t, &input(&[])).await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_failing_tag_in_backoff_lets_another_tag_pull() {
    // One slot on the node. The failing tag holds it for a 1s attempt, then backs off.
    let slots = FairSlots::new(1);
    let failing = Scripted {
        pull_delay: Some(Duration::from_secs(1)),
        ..Scripted::new()
    };
    failing
        .pulls
        .lock()
        .unwrap()
        .extend([Err("not found"), Err("not found"), Err("not found")]);
    let other = Scripted::new();
    other
        .present
        .lock()
        .unwrap()
        .push_back(Some(present("sha256:cfg", &[])));
    let first = async {
        let mut slot = Slot::acquire(&slots, "").await.unwrap();
        super::pull(&failing, &mut slot, &task(3), &input(&[])).await
    };
    let second = async {
        // Queued behind the failing tag's first attempt.
        tokio::task::yield_now().await;
        let mut slot = Slot::acquire(&slots, "").await.unwrap();
        super::pull(&other, &mut slot, &task(1), &input(&[])).await
    };
    let (failed, pulled) = tokio::join!(first, second);
    assert!(failed.is_err());
    pulled.unwrap();
    // The failing tag's attempts at 0s, 2s (1s of pull, 1s of backoff) and 5s; the other tag
    // pulls during the first backoff, not after the last attempt.
    assert_eq!(times_of(&failing, "pull "), [0, 2, 5]);
    assert_eq!(times_of(&other, "pull "), [1]);
}

#[tokio::test(start_paused = true)]
async fn a_runtime_that_cannot_be_reached_costs_no_attempt() {
    let rt = Scripted {
        down_until: Some(Duration::from_secs(20)),
        ..Scripted::new()
    };
    rt.pulls.lock().unwrap().push_back(Err(DOWN));
    rt.present
        .lock()
        .unwrap()
        .push_back(Some(present("sha256:cfg", &[])));
    // A single attempt, spent neither on the failed call nor on the wait.
    pull(&rt, &task(1), &input(&[])).await.unwrap();
    // Checks after 1s, 2s, 4s, then every 5s: the first one answered is at 22s.
    assert_eq!(times_of(&rt, "check"), [1, 3, 7, 12, 17, 22]);
    assert_eq!(times_of(&rt, "pull "), [0, 22]);
}

#[tokio::test(start_paused = true)]
async fn the_slot_is_free_while_the_runtime_is_waited_for() {
    let slots = FairSlots::new(1);
    let rt = Scripted {
        down_until: Some(Duration::from_secs(20)),
        ..Scripted::new()
    };
    rt.pulls.lock().unwrap().push_back(Err(DOWN));
    let waiting = async {
        let mut slot = Slot::acquire(&slots, "").await.unwrap();
        super::pull(&rt, &mut slot, &task(1), &input(&[])).await
    };
    let free_at = async {
        tokio::task::yield_now().await;
        assert!(slots.acquire("other").await);
        let at = Instant::now();
        slots.release();
        at
    };
    let started = Instant::now();
    let (_, free_at) = tokio::join!(waiting, free_at);
    assert_eq!(free_at - started, Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_runtime_that_goes_down_on_every_pull_ends_up_counting() {
    let rt = Scripted::new();
    rt.pulls
        .lock()
        .unwrap()
        .extend(std::iter::repeat_n(Err(DOWN), 20));
    let err = pull(&rt, &task(1), &input(&[])).await.unwrap_err();
    assert_eq!(
        err,
        format!("pulling {IMAGE} failed after 1 attempt: transport error")
    );
    assert_eq!(
        times_of(&rt, "pull ").len(),
        usize::try_from(MAX_UNCOUNTED).unwrap() + 1
    );
}

#[tokio::test(start_paused = true)]
async fn the_active_deadline_ends_a_wait_for_the_runtime() {
    let rt = Scripted {
        down_until: Some(Duration::from_secs(3600)),
        ..Scripted::new()
    };
    rt.pulls.lock().unwrap().push_back(Err(DOWN));
    let mut t = task(3);
    t.active_deadline = Some(Duration::from_secs(10));
    let started = Instant::now();
    let err = pull(&rt, &t, &input(&[])).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_secs(10));
    assert_eq!(
        err,
        format!("pulling {IMAGE} exceeded activeDeadlineSeconds (10s): transport error")
    );
}

/// A full image filesystem: every attempt asks where the images live and refuses without
/// pulling, the tag failing with the named reason; an image already present under
/// `IfNotPresent` needs no room and is reported as before.
#[tokio::test(start_paused = true)]
async fn a_full_image_filesystem_refuses_every_attempt_without_pulling() {
    let rt = Scripted {
        // "/" is in use (this test runs from it): at a limit of 0% it counts as full.
        filesystems: vec!["/".into()],
        ..Scripted::new()
    };
    let full = ImageFsGuard::new(0);
    let refused = pull(
        &rt,
        &task(2),
        &PullInput {
            image_fs: &full,
            ..input(&[])
        },
    )
    .await
    .expect_err("no room");
    assert!(
        refused.starts_with("pulling 127.0.0.1:5000/r/app:v1 failed after 2 attempts: ImageFilesystemFull: not pulling: the image filesystem / is"),
        "{refused}"
    );
    assert_eq!(times_of(&rt, "pull"), Vec::<u64>::new(), "never pulled");
    let asks: Vec<u64> = rt
        .filesystem_asks
        .lock()
        .unwrap()
        .iter()
        .map(Duration::as_secs)
        .collect();
    assert_eq!(asks, [0, 1], "asked at each attempt, the backoff between");

    let rt = Scripted {
        filesystems: vec!["/".into()],
        present: Mutex::new([Some(present("sha256:cfg", &[]))].into()),
        ..Scripted::new()
    };
    let mut if_not_present = task(1);
    if_not_present.if_not_present = true;
    let reported = pull(
        &rt,
        &if_not_present,
        &PullInput {
            image_fs: &full,
            ..input(&[])
        },
    )
    .await
    .expect("present: nothing to write");
    assert_eq!(reported, format!("{NAME}@sha256:cfg"));
}

/// While the kubelet starts a pod no attempt starts; once it is done the pull goes ahead.
#[tokio::test(start_paused = true)]
async fn no_attempt_starts_while_the_kubelet_starts_a_pod() {
    let rt = Scripted::new();
    rt.present
        .lock()
        .unwrap()
        .push_back(Some(present("sha256:cfg", &[])));
    let (busy_tx, busy) = watch::channel(true);
    let mut with_busy = input(&[]);
    with_busy.kubelet_busy = Some(&busy);
    let t = task(1);
    let pulling = pull(&rt, &t, &with_busy);
    let done = async {
        tokio::time::sleep(Duration::from_secs(7)).await;
        busy_tx.send_replace(false);
    };
    let (result, ()) = tokio::join!(pulling, done);
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(
        times_of(&rt, "pull"),
        [7],
        "pulled once the kubelet was done"
    );
}

/// An attempt under way when the kubelet starts a pod is dropped (the runtime's pull cancelled)
/// and made again once it is done, without counting: one attempt allowed, and it succeeds.
#[tokio::test(start_paused = true)]
async fn an_attempt_under_way_steps_aside_uncounted_when_the_kubelet_starts_a_pod() {
    let rt = Scripted {
        pull_delay: Some(Duration::from_secs(10)),
        ..Scripted::new()
    };
    rt.present
        .lock()
        .unwrap()
        .push_back(Some(present("sha256:cfg", &[])));
    let (busy_tx, busy) = watch::channel(false);
    let mut with_busy = input(&[]);
    with_busy.kubelet_busy = Some(&busy);
    let t = task(1);
    let pulling = pull(&rt, &t, &with_busy);
    let kubelet = async {
        tokio::time::sleep(Duration::from_secs(3)).await;
        busy_tx.send_replace(true);
        tokio::time::sleep(Duration::from_secs(5)).await;
        busy_tx.send_replace(false);
    };
    let (result, ()) = tokio::join!(pulling, kubelet);
    assert!(result.is_ok(), "{result:?}");
    // Started at 0, given up at 3, started again at 8 and done at 18.
    assert_eq!(times_of(&rt, "pull"), [0, 8]);
}

/// A watch whose sender is gone (the activity reader stopped) never holds pulls.
#[tokio::test(start_paused = true)]
async fn a_gone_activity_reader_holds_nothing() {
    let rt = Scripted::new();
    rt.present
        .lock()
        .unwrap()
        .push_back(Some(present("sha256:cfg", &[])));
    let (busy_tx, busy) = watch::channel(true);
    drop(busy_tx);
    let mut with_busy = input(&[]);
    with_busy.kubelet_busy = Some(&busy);
    // The last value said busy; with nobody to change it, the pull still goes ahead.
    let result =
        tokio::time::timeout(Duration::from_secs(60), pull(&rt, &task(1), &with_busy)).await;
    assert!(matches!(result, Ok(Ok(_))), "{result:?}");
}
