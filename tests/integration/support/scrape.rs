//! Reading a component's `/metrics` in the tests: the whole scrape, one sample, a wait for one.

use std::net::SocketAddr;
use std::time::Duration;

use super::{http_get, wait_for};

/// The text `/metrics` on `addr` serves; panics unless it answers 200.
pub(crate) async fn scrape(addr: SocketAddr) -> String {
    let (status, body) = tokio::task::spawn_blocking(move || http_get(addr, "/metrics"))
        .await
        .expect("join")
        .expect("GET /metrics");
    assert_eq!(status, 200, "{body}");
    body
}

/// The value of the sample `series` (name and labels exactly as encoded), if present.
pub(crate) fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

/// Waits up to `timeout` until `series` is present on `addr` and `accept`s its value; returns
/// the scrape.
pub(crate) async fn wait_sample(
    addr: SocketAddr,
    series: &str,
    timeout: Duration,
    accept: impl Fn(f64) -> bool,
) -> String {
    wait_for(&format!("{series} on /metrics"), timeout, || async {
        let text = scrape(addr).await;
        sample(&text, series).filter(|v| accept(*v)).map(|_| text)
    })
    .await
}
