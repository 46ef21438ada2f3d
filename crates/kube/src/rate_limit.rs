//! A client-side token bucket in front of the Kubernetes client, as client-go's `rest.Config`
//! `QPS`/`Burst` give every Go controller: a runaway reconcile loop cannot flood the apiserver.
//!
//! Requests wait for a token; none fails for want of one. A watch is one request: opening it
//! takes a token, its events take none. [`LimitWaits`] counts what the waiting cost, so that
//! whether a limit holds a component back is read off its metrics, not guessed.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

/// How many requests may be sent: `qps` a second on average, `burst` at once after a quiet spell.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateLimit {
    /// Tokens added per second; must be positive and finite.
    pub qps: f64,
    /// The bucket's size, and what it holds at the start; at least 1.
    pub burst: u32,
}

impl RateLimit {
    /// `qps` and `burst` as the command line gives them: a `qps` of 0 means no limit.
    pub fn from_flags(qps: f64, burst: u32) -> Result<Option<Self>, String> {
        if qps == 0.0 {
            return Ok(None);
        }
        if !qps.is_finite() || qps < 0.0 {
            return Err(format!(
                "the API request rate must be a positive number of requests per second, or 0 \
                 for no limit (not {qps})"
            ));
        }
        if burst == 0 {
            return Err("the API request burst must be at least 1 when the rate is limited".into());
        }
        Ok(Some(Self { qps, burst }))
    }
}

/// Requests that found the bucket empty, and the time the limited client spent waiting for
/// tokens. Cheap to clone: clones share the counts.
#[derive(Clone, Debug, Default)]
pub struct LimitWaits {
    requests: Counter,
    seconds: Counter<f64, AtomicU64>,
}

impl LimitWaits {
    /// Registers `client_rate_limited_requests` and `client_rate_limit_wait_seconds` (both
    /// counters, `_total` added on export) in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        let client = registry.sub_registry_with_prefix("client");
        client.register(
            "rate_limited_requests",
            "API requests that waited for the client-side rate limit (--kube-api-qps, \
             --kube-api-burst)",
            self.requests.clone(),
        );
        client.register(
            "rate_limit_wait_seconds",
            "Time the client's requests were held back by the client-side rate limit: while \
             this grows, the limit, not the API server, sets the pace",
            self.seconds.clone(),
        );
    }

    /// Requests that waited so far.
    pub fn requests(&self) -> u64 {
        self.requests.get()
    }

    /// Seconds of waiting so far.
    pub fn seconds(&self) -> f64 {
        self.seconds.get()
    }

    fn waited(&self, wait: Duration) {
        self.requests.inc();
        self.seconds.inc_by(wait.as_secs_f64());
    }
}

/// A token bucket on a clock the caller passes: [`RateLimit::burst`] tokens, refilled at
/// [`RateLimit::qps`]. The client's request limit and the daemon's paced status writes both
/// count with one.
#[derive(Debug)]
pub struct TokenBucket {
    limit: RateLimit,
    tokens: f64,
    updated: Instant,
}

impl TokenBucket {
    /// A bucket holding its whole burst at `now`.
    pub fn full(limit: RateLimit, now: Instant) -> Self {
        Self {
            limit,
            tokens: f64::from(limit.burst),
            updated: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.limit.qps).min(f64::from(self.limit.burst));
        self.updated = now;
    }

    /// How long from `now` until a token is there; zero when one is.
    pub fn wait(&mut self, now: Instant) -> Duration {
        self.refill(now);
        if self.tokens >= 1.0 {
            return Duration::ZERO;
        }
        let wait = (1.0 - self.tokens) / self.limit.qps;
        // At least a microsecond, so that rounding cannot spin on a zero wait.
        Duration::try_from_secs_f64(wait)
            .unwrap_or(Duration::from_secs(1))
            .max(Duration::from_micros(1))
    }

    /// Spends a token at `now`, even one not there yet: the next [`Self::wait`] grows by it.
    pub fn spend(&mut self, now: Instant) {
        self.refill(now);
        self.tokens -= 1.0;
    }

    /// Takes a token at `now`, or says how long until one is there.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        match self.wait(now) {
            Duration::ZERO => {
                self.tokens -= 1.0;
                Ok(())
            }
            wait => Err(wait),
        }
    }
}

/// Wraps a service in a [`RateLimited`] one, whose waits are counted in a [`LimitWaits`].
#[derive(Clone, Debug)]
pub(crate) struct RateLimitLayer {
    limit: RateLimit,
    waits: LimitWaits,
}

impl RateLimitLayer {
    pub(crate) fn new(limit: RateLimit, waits: LimitWaits) -> Self {
        Self { limit, waits }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> RateLimited<S> {
        RateLimited {
            inner,
            bucket: TokenBucket::full(self.limit, Instant::now()),
            holding: false,
            sleep: None,
            waiting_since: None,
            waits: self.waits.clone(),
        }
    }
}

/// A service that is ready only when its bucket holds a token for the next request.
///
/// The kube `Client` puts a buffer in front of its stack, so one `RateLimited` (one bucket)
/// serves every clone of the client, and callers queue in the buffer while it waits.
pub(crate) struct RateLimited<S> {
    inner: S,
    bucket: TokenBucket,
    /// A token was taken for the next `call` (readiness may be asked several times first).
    holding: bool,
    /// Made at the first wait (a `Sleep` needs the runtime), reset at each one after.
    sleep: Option<Pin<Box<Sleep>>>,
    /// When the request now waiting found the bucket empty.
    waiting_since: Option<Instant>,
    waits: LimitWaits,
}

impl<S, R> Service<R> for RateLimited<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        while !self.holding {
            let now = Instant::now();
            match self.bucket.take(now) {
                Ok(()) => {
                    self.holding = true;
                    if let Some(since) = self.waiting_since.take() {
                        self.waits.waited(now.saturating_duration_since(since));
                    }
                }
                Err(wait) => {
                    self.waiting_since.get_or_insert(now);
                    let sleep = match &mut self.sleep {
                        Some(sleep) => {
                            sleep.as_mut().reset(now + wait);
                            sleep
                        }
                        None => self
                            .sleep
                            .insert(Box::pin(tokio::time::sleep_until(now + wait))),
                    };
                    ready!(sleep.as_mut().poll(cx));
                }
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> S::Future {
        // Only after `poll_ready` said ready, i.e. with a token in hand.
        self.holding = false;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tower::{ServiceBuilder, ServiceExt};

    use super::*;

    fn limit(qps: f64, burst: u32) -> RateLimit {
        RateLimit { qps, burst }
    }

    #[test]
    fn flags_zero_is_no_limit_and_nonsense_is_refused() {
        assert_eq!(RateLimit::from_flags(0.0, 0), Ok(None));
        assert_eq!(RateLimit::from_flags(30.0, 50), Ok(Some(limit(30.0, 50))));
        assert_eq!(RateLimit::from_flags(0.5, 1), Ok(Some(limit(0.5, 1))));
        assert!(RateLimit::from_flags(-1.0, 10).is_err());
        assert!(RateLimit::from_flags(f64::NAN, 10).is_err());
        assert!(RateLimit::from_flags(f64::INFINITY, 10).is_err());
        assert!(RateLimit::from_flags(5.0, 0).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_bucket_lets_a_burst_through_then_refills_at_the_rate() {
        let start = Instant::now();
        let mut bucket = TokenBucket::full(limit(10.0, 3), start);
        for _ in 0..3 {
            assert_eq!(bucket.take(start), Ok(()));
        }
        assert_eq!(bucket.take(start), Err(Duration::from_millis(100)));
        assert_eq!(bucket.take(start + Duration::from_millis(100)), Ok(()));
        // A long pause refills up to the burst, no more.
        let later = start + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(bucket.take(later), Ok(()));
        }
        assert!(bucket.take(later).is_err());
    }

    /// Sends `n` requests at once through a limited service on tokio's paused clock; returns
    /// when each was answered, relative to the start.
    async fn send_all(limit: RateLimit, n: usize) -> Vec<Duration> {
        send_all_counted(limit, n, LimitWaits::default()).await
    }

    async fn send_all_counted(limit: RateLimit, n: usize, waits: LimitWaits) -> Vec<Duration> {
        let start = Instant::now();
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let service = ServiceBuilder::new()
            .buffer(1024)
            .layer(RateLimitLayer::new(limit, waits))
            .service_fn(move |()| {
                counted.fetch_add(1, Ordering::SeqCst);
                async move { Ok::<_, std::convert::Infallible>(start.elapsed()) }
            });
        let answers = futures::future::join_all((0..n).map(|_| service.clone().oneshot(())));
        let times: Vec<_> = answers
            .await
            .into_iter()
            .map(|r| r.expect("a limited request waits, it does not fail"))
            .collect();
        assert_eq!(calls.load(Ordering::SeqCst), n);
        times
    }

    #[tokio::test(start_paused = true)]
    async fn requests_over_the_burst_wait_their_turn_and_none_fails() {
        let mut times = send_all(limit(5.0, 10), 20).await;
        times.sort();
        // The first 10 at once; the other 10 one every 200 ms.
        assert!(
            times[..10].iter().all(|t| *t == Duration::ZERO),
            "{times:?}"
        );
        for (i, t) in times[10..].iter().enumerate() {
            let expected = Duration::from_millis(200 * (i as u64 + 1));
            let diff = t.abs_diff(expected);
            assert!(
                diff < Duration::from_millis(5),
                "request {} at {t:?}, not {expected:?}",
                i + 10
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_fractional_rate_spaces_requests_by_its_inverse() {
        let mut times = send_all(limit(0.5, 1), 3).await;
        times.sort();
        assert_eq!(times[0], Duration::ZERO);
        assert!(
            times[1].abs_diff(Duration::from_secs(2)) < Duration::from_millis(5),
            "{times:?}"
        );
        assert!(
            times[2].abs_diff(Duration::from_secs(4)) < Duration::from_millis(5),
            "{times:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn waits_are_counted_with_the_time_they_took() {
        let waits = LimitWaits::default();
        // 10 at once, 5 a second after the first 2: 8 wait, 200 ms apart, 1.6 s in all.
        send_all_counted(limit(5.0, 2), 10, waits.clone()).await;
        assert_eq!(waits.requests(), 8);
        assert!(
            (waits.seconds() - 1.6).abs() < 0.01,
            "{} s of waiting",
            waits.seconds()
        );
        // Within the burst nothing waits, and nothing is counted.
        let idle = LimitWaits::default();
        send_all_counted(limit(5.0, 10), 10, idle.clone()).await;
        assert_eq!((idle.requests(), idle.seconds()), (0, 0.0));
    }

    #[test]
    fn the_counters_are_exported_under_the_client_prefix() {
        let waits = LimitWaits::default();
        waits.waited(Duration::from_millis(250));
        let mut registry = Registry::with_prefix("kruise_rs");
        waits.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("kruise_rs_client_rate_limited_requests_total 1\n"),
            "{text}"
        );
        assert!(
            text.contains("kruise_rs_client_rate_limit_wait_seconds_total 0.25\n"),
            "{text}"
        );
    }
}
