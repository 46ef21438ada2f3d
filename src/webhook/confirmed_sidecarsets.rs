//! The pod webhook's SidecarSets, confirmed against the apiserver before a pod is admitted.
//!
//! The SidecarSet cache is fed by a watch, which runs behind the apiserver: by milliseconds when
//! quiet, by seconds when the manager is busy or its watch is being re-established. A pod created
//! in that window after its SidecarSet was created or changed would be admitted without it, or
//! with the old one (upstream's informer lags the same way). So each admission lists the
//! SidecarSets' names and resource versions from the apiserver's own cache (metadata only,
//! `resourceVersion=0`), in a list that started after the request arrived; it uses the cached
//! objects the list names at the cached version, and fetches the ones the cache lacks or holds
//! at another version and the cached ones the list lacks (deleted, or the list came from an HA
//! peer whose cache is behind: the list may add to the cache, never take away unconfirmed;
//! decision 0031).
//!
//! Not a consistent (quorum) list: for a resource as quiet as SidecarSets, the apiserver answers
//! one only once its cache has caught up with etcd's latest revision, which it learns by a
//! progress notification requested every 100 ms, so while pods are being written each list
//! waited up to that long (93 ms per admission, measured). The apiserver's cache lags etcd by
//! its own watch, milliseconds, where ours can lag by seconds.
//!
//! Admissions share lists ([`SharedLists`]): a request that arrives while a list is in flight
//! waits for the next one, which starts when the one in flight ends. The apiserver sees at most
//! one of these lists at a time whatever the pod rate, and a request waits at most two.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use kube::Api;
use kube::api::ListParams;
use tokio::sync::watch;

use kruise_rs_api::sidecarset::SidecarSet;

/// How long one list may take before the admissions waiting for it are refused: well inside the
/// webhook's timeout (10 s by default), even for a request that waits out a list in flight.
const LIST_TIMEOUT: Duration = Duration::from_secs(3);

/// The SidecarSets a list saw: name → resource version.
pub(super) type Listed = BTreeMap<String, String>;

/// What an admission does with the cached SidecarSets, given a list.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Confirmation<T> {
    /// Cached at the version listed: used as cached.
    pub(super) current: Vec<T>,
    /// Listed, but missing from the cache or cached at another version (older, or newer than
    /// the list; either way a fetch returns what is current), or cached but not listed (deleted,
    /// or the list came from an apiserver whose cache is behind ours: only a fetch tells):
    /// read from the apiserver.
    pub(super) fetch: Vec<String>,
}

/// Sorts the cached SidecarSets (`name_and_version` of each) against `listed`.
pub(super) fn confirm<T>(
    listed: &Listed,
    cached: impl IntoIterator<Item = T>,
    name_and_version: impl Fn(&T) -> (Option<&str>, Option<&str>),
) -> Confirmation<T> {
    let mut current = Vec::new();
    let mut confirmed: Vec<&str> = Vec::new();
    let mut unlisted: Vec<String> = Vec::new();
    for object in cached {
        let (Some(name), version) = name_and_version(&object) else {
            continue;
        };
        match listed.get_key_value(name) {
            Some((listed_name, listed_version)) if version == Some(listed_version.as_str()) => {
                confirmed.push(listed_name.as_str());
                current.push(object);
            }
            Some(_) => {}
            None => unlisted.push(name.to_owned()),
        }
    }
    confirmed.sort_unstable();
    let mut fetch: Vec<String> = listed
        .keys()
        .filter(|name| confirmed.binary_search(&name.as_str()).is_err())
        .cloned()
        .chain(unlisted)
        .collect();
    fetch.sort_unstable();
    fetch.dedup();
    Confirmation { current, fetch }
}

/// One list's outcome, numbered: generation 0 is "none yet".
#[derive(Clone)]
struct Outcome {
    generation: u64,
    listed: Result<Arc<Listed>, Arc<str>>,
}

#[derive(Default)]
struct Schedule {
    /// The generation of the list in flight.
    running: Option<u64>,
    /// Someone arrived after it started and waits for the next.
    queued: bool,
}

type ListFn = dyn Fn() -> BoxFuture<'static, Result<Listed, String>> + Send + Sync;

/// Lists of the SidecarSets' metadata, shared by the admissions that wait for them.
pub(super) struct SharedLists {
    list: Box<ListFn>,
    schedule: Mutex<Schedule>,
    outcomes: watch::Sender<Outcome>,
}

impl SharedLists {
    /// Lists of `api`'s SidecarSets: metadata only, from the apiserver's cache as it is
    /// (`resourceVersion=0`, no wait for freshness; see the module documentation).
    pub(super) fn of(api: Api<SidecarSet>) -> Arc<Self> {
        Self::new(move || {
            let api = api.clone();
            Box::pin(async move {
                let list = api
                    .list_metadata(&ListParams::default().match_any())
                    .await
                    .map_err(|e| format!("listing the SidecarSets: {e}"))?;
                Ok(list
                    .items
                    .into_iter()
                    .filter_map(|set| Some((set.metadata.name?, set.metadata.resource_version?)))
                    .collect())
            })
        })
    }

    fn new(
        list: impl Fn() -> BoxFuture<'static, Result<Listed, String>> + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Self {
            list: Box::new(list),
            schedule: Mutex::default(),
            outcomes: watch::Sender::new(Outcome {
                generation: 0,
                listed: Err("no list yet".into()),
            }),
        })
    }

    /// The SidecarSets as a list that started after this call saw them.
    pub(super) async fn started_after_now(self: &Arc<Self>) -> Result<Arc<Listed>, String> {
        let mut outcomes = self.outcomes.subscribe();
        let wanted = {
            let mut schedule = self.lock();
            match schedule.running {
                // Started before this request arrived: it may not see what the request's
                // author saw. Wait for the next.
                Some(running) => {
                    schedule.queued = true;
                    running + 1
                }
                None => {
                    let next = self.outcomes.borrow().generation + 1;
                    schedule.running = Some(next);
                    self.start(next);
                    next
                }
            }
        };
        let outcome = outcomes
            .wait_for(|outcome| outcome.generation >= wanted)
            .await
            .map_err(|_| "the SidecarSet lists stopped".to_owned())?
            .clone();
        outcome.listed.map_err(|e| e.to_string())
    }

    /// Runs list `generation` in a task of its own, so that an admission the apiserver gave up on
    /// (its future dropped) cannot strand the others waiting for the same list.
    fn start(self: &Arc<Self>, generation: u64) {
        let this = self.clone();
        tokio::spawn(async move {
            let listed = match tokio::time::timeout(LIST_TIMEOUT, (this.list)()).await {
                Ok(Ok(listed)) => Ok(Arc::new(listed)),
                Ok(Err(e)) => Err(e.into()),
                Err(_) => Err(format!(
                    "listing the SidecarSets took over {} s",
                    LIST_TIMEOUT.as_secs()
                )
                .into()),
            };
            let mut schedule = this.lock();
            this.outcomes.send_replace(Outcome { generation, listed });
            if std::mem::take(&mut schedule.queued) {
                schedule.running = Some(generation + 1);
                this.start(generation + 1);
            } else {
                schedule.running = None;
            }
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Schedule> {
        self.schedule.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(pairs: &[(&str, &str)]) -> Listed {
        pairs
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect()
    }

    type Cached = (Option<&'static str>, Option<&'static str>);

    fn sort(listed: &Listed, cached: &[Cached]) -> Confirmation<Cached> {
        confirm(listed, cached.iter().copied(), |c| (c.0, c.1))
    }

    #[test]
    fn a_cache_that_agrees_with_the_list_is_used_as_it_is() {
        let got = sort(
            &listed(&[("a", "1"), ("b", "7")]),
            &[(Some("b"), Some("7")), (Some("a"), Some("1"))],
        );
        assert_eq!(
            got.current,
            vec![(Some("b"), Some("7")), (Some("a"), Some("1"))]
        );
        assert!(got.fetch.is_empty());
    }

    #[test]
    fn a_sidecarset_created_a_moment_ago_is_fetched() {
        let got = sort(
            &listed(&[("a", "1"), ("new", "9")]),
            &[(Some("a"), Some("1"))],
        );
        assert_eq!(got.current, vec![(Some("a"), Some("1"))]);
        assert_eq!(got.fetch, vec!["new".to_owned()]);
    }

    #[test]
    fn a_sidecarset_cached_at_another_version_is_fetched_not_used() {
        // Older (an update the watch has not delivered) or newer than the list: a fetch is
        // current either way.
        let got = sort(
            &listed(&[("a", "5"), ("b", "5")]),
            &[(Some("a"), Some("4")), (Some("b"), Some("6"))],
        );
        assert!(got.current.is_empty());
        assert_eq!(got.fetch, vec!["a".to_owned(), "b".to_owned()]);
    }

    #[test]
    fn a_cached_sidecarset_the_list_lacks_is_fetched_not_dropped() {
        // Deleted, or listed by an apiserver whose cache is behind ours: a fetch tells.
        let got = sort(
            &listed(&[("a", "1")]),
            &[(Some("a"), Some("1")), (Some("gone"), Some("3"))],
        );
        assert_eq!(got.current, vec![(Some("a"), Some("1"))]);
        assert_eq!(got.fetch, vec!["gone".to_owned()]);
    }

    #[test]
    fn cached_objects_without_a_name_or_version_are_never_used() {
        let got = sort(
            &listed(&[("a", "1")]),
            &[(None, Some("1")), (Some("a"), None)],
        );
        assert!(got.current.is_empty());
        assert_eq!(got.fetch, vec!["a".to_owned()]);
    }

    #[test]
    fn an_empty_list_has_every_cached_sidecarset_fetched() {
        let got = sort(&Listed::new(), &[(Some("a"), Some("1"))]);
        assert!(got.current.is_empty());
        assert_eq!(got.fetch, vec!["a".to_owned()]);
    }

    /// Lists that each wait for the test to let them end, counting how many started.
    struct Gate {
        started: std::sync::atomic::AtomicU64,
        release: tokio::sync::Semaphore,
    }

    fn gated() -> (Arc<SharedLists>, Arc<Gate>) {
        let gate = Arc::new(Gate {
            started: 0.into(),
            release: tokio::sync::Semaphore::new(0),
        });
        let g = gate.clone();
        let lists = SharedLists::new(move || {
            let g = g.clone();
            Box::pin(async move {
                use std::sync::atomic::Ordering::SeqCst;
                let n = g.started.fetch_add(1, SeqCst) + 1;
                g.release
                    .acquire()
                    .await
                    .map_err(|e| e.to_string())?
                    .forget();
                Ok(listed(&[("list", &n.to_string())]))
            })
        });
        (lists, gate)
    }

    fn started(gate: &Gate) -> u64 {
        gate.started.load(std::sync::atomic::Ordering::SeqCst)
    }

    async fn until(what: &str, done: impl Fn() -> bool) {
        tokio::time::timeout(Duration::from_secs(5), async {
            while !done() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{what}"));
    }

    #[tokio::test]
    async fn requests_that_arrive_during_a_list_share_the_next_one() {
        let (lists, gate) = gated();
        let first = tokio::spawn({
            let lists = lists.clone();
            async move { lists.started_after_now().await }
        });
        until("the first list to start", || started(&gate) == 1).await;
        // Three arrive while list 1 is in flight: none may take it, all take list 2.
        let later: Vec<_> = (0..3)
            .map(|_| {
                let lists = lists.clone();
                tokio::spawn(async move { lists.started_after_now().await })
            })
            .collect();
        tokio::task::yield_now().await;
        assert_eq!(started(&gate), 1, "a second list while the first runs");
        gate.release.add_permits(1);
        let first = first.await.expect("task").expect("list 1");
        assert_eq!(first.get("list").map(String::as_str), Some("1"));
        until("the queued list to start", || started(&gate) == 2).await;
        gate.release.add_permits(1);
        for task in later {
            let got = task.await.expect("task").expect("list 2");
            assert_eq!(got.get("list").map(String::as_str), Some("2"));
        }
        // Nobody waits now: the next request starts list 3 at once.
        let next = tokio::spawn({
            let lists = lists.clone();
            async move { lists.started_after_now().await }
        });
        until("a fresh list to start", || started(&gate) == 3).await;
        gate.release.add_permits(1);
        let got = next.await.expect("task").expect("list 3");
        assert_eq!(got.get("list").map(String::as_str), Some("3"));
    }

    #[tokio::test]
    async fn a_dropped_request_does_not_strand_the_others() {
        let (lists, gate) = gated();
        let dropped = tokio::spawn({
            let lists = lists.clone();
            async move { lists.started_after_now().await }
        });
        until("the list to start", || started(&gate) == 1).await;
        let waiting = tokio::spawn({
            let lists = lists.clone();
            async move { lists.started_after_now().await }
        });
        tokio::task::yield_now().await;
        dropped.abort();
        gate.release.add_permits(2);
        let got = waiting.await.expect("task").expect("list 2");
        assert_eq!(got.get("list").map(String::as_str), Some("2"));
    }

    #[tokio::test]
    async fn a_failed_list_is_an_error_for_its_waiters_and_the_next_one_is_tried_afresh() {
        let calls = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let c = calls.clone();
        let lists = SharedLists::new(move || {
            let n = c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async move {
                if n == 0 {
                    Err("listing the SidecarSets: 503".to_owned())
                } else {
                    Ok(listed(&[("a", "1")]))
                }
            })
        });
        let err = lists
            .started_after_now()
            .await
            .expect_err("the first list fails");
        assert!(err.contains("503"), "{err}");
        let ok = lists.started_after_now().await.expect("the second list");
        assert_eq!(ok.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_list_that_never_answers_is_refused_after_the_timeout() {
        let lists = SharedLists::new(|| Box::pin(std::future::pending()));
        let err = lists.started_after_now().await.expect_err("timed out");
        assert!(err.contains("took over 3 s"), "{err}");
    }
}
