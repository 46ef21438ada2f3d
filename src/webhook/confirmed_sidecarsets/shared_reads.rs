//! Reads of the apiserver shared by the admissions that wait for them, each started after the
//! admissions it serves arrived.
//!
//! A request that arrives while a read is in flight waits for the next one, which starts when the
//! one in flight ends: the apiserver sees at most one read of a kind at a time whatever the pod
//! rate, and a request waits at most two.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::watch;

/// How long one read may take before the admissions waiting for it are refused: well inside the
/// webhook's timeout (10 s by default), even for a request that waits out a read in flight.
pub(in crate::webhook) const READ_TIMEOUT: Duration = Duration::from_secs(3);

/// One read's outcome, numbered: generation 0 is "none yet".
struct Outcome<T> {
    generation: u64,
    read: Result<Arc<T>, Arc<str>>,
}

#[derive(Default)]
struct Schedule {
    /// The generation of the read in flight.
    running: Option<u64>,
    /// Someone arrived after it started and waits for the next.
    queued: bool,
}

type ReadFn<T> = dyn Fn() -> BoxFuture<'static, Result<T, String>> + Send + Sync;

/// One kind of read (what `read` returns), shared by the admissions that wait for it.
pub(in crate::webhook) struct SharedReads<T> {
    /// What the reads are of, for the timeout's message ("listing the SidecarSets").
    what: &'static str,
    read: Box<ReadFn<T>>,
    schedule: Mutex<Schedule>,
    outcomes: watch::Sender<Outcome<T>>,
}

impl<T: Send + Sync + 'static> SharedReads<T> {
    pub(in crate::webhook) fn new(
        what: &'static str,
        read: impl Fn() -> BoxFuture<'static, Result<T, String>> + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Self {
            what,
            read: Box::new(read),
            schedule: Mutex::default(),
            outcomes: watch::Sender::new(Outcome {
                generation: 0,
                read: Err("no read yet".into()),
            }),
        })
    }

    /// What a read that started after this call returned.
    pub(in crate::webhook) async fn started_after_now(self: &Arc<Self>) -> Result<Arc<T>, String> {
        self.start_after_now().await
    }

    /// Joins (or starts) a read that starts after this call, now; the future returns what it
    /// read. An admission calls it first, so the read runs while it decodes the object.
    pub(in crate::webhook) fn start_after_now(
        self: &Arc<Self>,
    ) -> impl Future<Output = Result<Arc<T>, String>> + Send + 'static {
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
        let what = self.what;
        async move {
            let outcome = outcomes
                .wait_for(|outcome| outcome.generation >= wanted)
                .await
                .map_err(|_| format!("{what} stopped"))?;
            outcome.read.clone().map_err(|e| e.to_string())
        }
    }

    /// Runs read `generation` in a task of its own, so that an admission the apiserver gave up on
    /// (its future dropped) cannot strand the others waiting for the same read.
    fn start(self: &Arc<Self>, generation: u64) {
        let this = self.clone();
        tokio::spawn(async move {
            let read = match tokio::time::timeout(READ_TIMEOUT, (this.read)()).await {
                Ok(Ok(read)) => Ok(Arc::new(read)),
                Ok(Err(e)) => Err(e.into()),
                Err(_) => {
                    Err(format!("{} took over {} s", this.what, READ_TIMEOUT.as_secs()).into())
                }
            };
            let mut schedule = this.lock();
            this.outcomes.send_replace(Outcome { generation, read });
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

    /// Reads that each wait for the test to let them end, counting how many started; read n
    /// returns n.
    struct Gate {
        started: std::sync::atomic::AtomicU64,
        release: tokio::sync::Semaphore,
    }

    fn gated() -> (Arc<SharedReads<u64>>, Arc<Gate>) {
        let gate = Arc::new(Gate {
            started: 0.into(),
            release: tokio::sync::Semaphore::new(0),
        });
        let g = gate.clone();
        let reads = SharedReads::new("listing the SidecarSets", move || {
            let g = g.clone();
            Box::pin(async move {
                use std::sync::atomic::Ordering::SeqCst;
                let n = g.started.fetch_add(1, SeqCst) + 1;
                g.release
                    .acquire()
                    .await
                    .map_err(|e| e.to_string())?
                    .forget();
                Ok(n)
            })
        });
        (reads, gate)
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
    async fn requests_that_arrive_during_a_read_share_the_next_one() {
        let (reads, gate) = gated();
        let first = tokio::spawn({
            let reads = reads.clone();
            async move { reads.started_after_now().await }
        });
        until("the first read to start", || started(&gate) == 1).await;
        // Three arrive while read 1 is in flight: none may take it, all take read 2.
        let later: Vec<_> = (0..3)
            .map(|_| {
                let reads = reads.clone();
                tokio::spawn(async move { reads.started_after_now().await })
            })
            .collect();
        tokio::task::yield_now().await;
        assert_eq!(started(&gate), 1, "a second read while the first runs");
        gate.release.add_permits(1);
        assert_eq!(*first.await.expect("task").expect("read 1"), 1);
        until("the queued read to start", || started(&gate) == 2).await;
        gate.release.add_permits(1);
        for task in later {
            assert_eq!(*task.await.expect("task").expect("read 2"), 2);
        }
        // Nobody waits now: the next request starts read 3 at once.
        let next = tokio::spawn({
            let reads = reads.clone();
            async move { reads.started_after_now().await }
        });
        until("a fresh read to start", || started(&gate) == 3).await;
        gate.release.add_permits(1);
        assert_eq!(*next.await.expect("task").expect("read 3"), 3);
    }

    #[tokio::test]
    async fn a_read_is_joined_when_asked_for_not_when_awaited() {
        let (reads, gate) = gated();
        // Asked for before read 1 starts (the admission has not decoded its pod yet)...
        let early = reads.start_after_now();
        until("the read to start without being awaited", || {
            started(&gate) == 1
        })
        .await;
        // ...it takes read 1, though awaited only after it started.
        let late = reads.start_after_now();
        gate.release.add_permits(1);
        assert_eq!(*early.await.expect("read 1"), 1);
        gate.release.add_permits(1);
        assert_eq!(*late.await.expect("read 2"), 2);
    }

    #[tokio::test]
    async fn a_dropped_request_does_not_strand_the_others() {
        let (reads, gate) = gated();
        let dropped = tokio::spawn({
            let reads = reads.clone();
            async move { reads.started_after_now().await }
        });
        until("the read to start", || started(&gate) == 1).await;
        let waiting = tokio::spawn({
            let reads = reads.clone();
            async move { reads.started_after_now().await }
        });
        tokio::task::yield_now().await;
        dropped.abort();
        gate.release.add_permits(2);
        assert_eq!(*waiting.await.expect("task").expect("read 2"), 2);
    }

    #[tokio::test]
    async fn a_failed_read_is_an_error_for_its_waiters_and_the_next_one_is_tried_afresh() {
        let calls = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let c = calls.clone();
        let reads = SharedReads::new("listing the SidecarSets", move || {
            let n = c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async move {
                if n == 0 {
                    Err("listing the SidecarSets: 503".to_owned())
                } else {
                    Ok(7)
                }
            })
        });
        let err = reads
            .started_after_now()
            .await
            .expect_err("the first read fails");
        assert!(err.contains("503"), "{err}");
        assert_eq!(
            *reads.started_after_now().await.expect("the second read"),
            7
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_that_never_answers_is_refused_after_the_timeout() {
        let reads: Arc<SharedReads<u64>> = SharedReads::new("listing the SidecarSets", || {
            Box::pin(std::future::pending())
        });
        let err = reads.started_after_now().await.expect_err("timed out");
        assert_eq!(err, "listing the SidecarSets took over 3 s");
    }
}
