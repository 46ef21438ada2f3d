//! What every test binary uses: unique object names, and polling with a deadline instead of
//! sleeping.

use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

/// A name unique to this process run, `prefix-<suffix>`, valid as a DNS-1123 label (and so as
/// a namespace or most cluster-scoped object names): lowercase alphanumerics and '-', at most
/// 63 characters, starting and ending with an alphanumeric.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    // Random per process, so runs against a shared cluster do not collide with earlier ones.
    static RUN_TAG: OnceLock<String> = OnceLock::new();
    let tag = RUN_TAG.get_or_init(|| {
        let seed = RandomState::new().hash_one((std::process::id(), SystemTime::now()));
        base36(seed % 36u64.pow(5), 5)
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let suffix = format!("{tag}{}", base36(u64::from(n), 1));

    let mut clean: String = prefix
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9') => c,
            _ => '-',
        })
        .collect();
    clean.truncate(63 - 1 - suffix.len());
    let clean = clean.trim_matches('-');
    if clean.is_empty() {
        suffix
    } else {
        format!("{clean}-{suffix}")
    }
}

fn base36(mut n: u64, min_len: usize) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    while n > 0 || out.len() < min_len {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
    }
    out.reverse();
    String::from_utf8(out).expect("ASCII")
}

/// Poll `f` until it returns `Some`, at short intervals; panics mentioning `what` once `timeout`
/// has passed (a call still running at the deadline is abandoned).
pub async fn wait_for<F, Fut, T>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut interval = Duration::from_millis(20);
    loop {
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(remaining, f()).await {
            Ok(Some(value)) => return value,
            Ok(None) if !remaining.is_zero() => {}
            _ => panic!("timed out after {timeout:?} waiting for {what}"),
        }
        tokio::time::sleep(interval.min(remaining)).await;
        interval = (interval * 2).min(Duration::from_millis(250));
    }
}

/// A Go duration as Go's `%v` prints it (`850ms`, `2.5s`, `1m2.5s`, `1h0m3s`), as the kubelet's
/// events and the registry's log write them.
pub fn go_duration(text: &str) -> Option<Duration> {
    let mut total = 0f64;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let value: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let units = [
            ("ns", 1e-9),
            ("µs", 1e-6),
            ("us", 1e-6),
            ("ms", 1e-3),
            ("h", 3600.0),
            ("m", 60.0),
            ("s", 1.0),
        ];
        let (unit, len) = units
            .iter()
            .find(|(u, _)| rest.starts_with(u))
            .map(|(u, f)| (*f, u.len()))?;
        total += value * unit;
        rest = &rest[len..];
    }
    Some(Duration::from_secs_f64(total))
}

#[cfg(test)]
mod go_duration_tests {
    use super::*;

    #[test]
    fn go_durations_read_as_go_prints_them() {
        assert_eq!(go_duration("1m2.5s"), Some(Duration::from_millis(62_500)));
        assert_eq!(go_duration("850ms"), Some(Duration::from_millis(850)));
        assert_eq!(
            go_duration("1.644013ms"),
            Some(Duration::from_nanos(1_644_013))
        );
        assert_eq!(go_duration("1h0m3s"), Some(Duration::from_secs(3603)));
        assert_eq!(go_duration("2.5"), None, "no unit");
        assert_eq!(go_duration("x"), None);
    }
}
