//! How long one admission may take: the time the apiserver gives the call, less a margin for the
//! answer to reach it.
//!
//! The apiserver sends each webhook call with a `timeout` query parameter: the webhook's
//! `timeoutSeconds`, or what is left of the request's own time if less, rounded up to a whole
//! second. When it passes, the apiserver gives up and applies the `failurePolicy`; under
//! `Ignore` that admits a pod without its sidecars, for good. Bounding each read of the
//! apiserver is not enough: reads that each answer within their bound can still add up past
//! the call's time. So the server decides every admission within one deadline taken from that
//! parameter, and refuses when it passes, saying why (decision 0049).

use std::time::Duration;

use tokio::time::Instant;

/// The time a caller that sends no `timeout` is assumed to give: the default `timeoutSeconds`
/// of `admissionregistration.k8s.io/v1`.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest time a call is taken to give: the API's largest `timeoutSeconds`. The parameter
/// is whatever the caller wrote (anyone who reaches the port can write one), and a time past
/// the clock's range would panic when added to it.
const MAX_TIMEOUT: Duration = Duration::from_secs(30);

/// Kept back from the call's time: the apiserver rounds what it has left up to the next second
/// (so up to 1 s less than it says), and the answer still has to be written and read.
const MARGIN: Duration = Duration::from_millis(1500);

/// One admission's time: what the apiserver gives the call, and the part of it the decision may
/// take, counted from when the request arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdmissionDeadline {
    /// The apiserver's `timeout` (10 s when it sent none).
    pub(crate) timeout: Duration,
    /// How long the decision may take: the timeout less 1.5 s, and at least half of it.
    pub(crate) budget: Duration,
    /// When the budget runs out.
    pub(crate) at: Instant,
}

impl AdmissionDeadline {
    /// The deadline of a request with URI query `query` that arrived `now`.
    pub fn from_query(query: Option<&str>, now: Instant) -> Self {
        let timeout = query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .find_map(|pair| pair.strip_prefix("timeout="))
            .and_then(go_duration)
            .filter(|t| !t.is_zero())
            .unwrap_or(DEFAULT_TIMEOUT)
            .min(MAX_TIMEOUT);
        let budget = timeout.saturating_sub(MARGIN).max(timeout / 2);
        Self {
            timeout,
            budget,
            at: now + budget,
        }
    }

    /// The denial an admission that did not decide within its budget answers with.
    pub(crate) fn refusal(&self) -> String {
        format!(
            "kruise-rs could not decide within {} s of the {} s the apiserver waits for this \
             webhook: its calls to the apiserver were too slow; retry",
            seconds(self.budget),
            seconds(self.timeout)
        )
    }
}

/// `d` in seconds, without a fraction when it has none ("8.5", "10").
fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0}")
    } else {
        format!("{s:.1}")
    }
}

/// A duration as Go writes one (`10s`, `1m0s`, `1.5s`, `300ms`): numbers each followed by a unit
/// (`h`, `m`, `s`, `ms`, `us`, `ns`). `None` for anything else, including a sign.
fn go_duration(text: &str) -> Option<Duration> {
    if text.is_empty() {
        return None;
    }
    let mut rest = text;
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let seconds_per_unit = match unit {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        if number.is_empty() || number == "." {
            return None;
        }
        let value: f64 = number.parse().ok()?;
        let part = Duration::try_from_secs_f64(value * seconds_per_unit).ok()?;
        total = total.checked_add(part)?;
        rest = after;
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_are_read_as_go_writes_them() {
        let s = Duration::from_secs;
        assert_eq!(go_duration("10s"), Some(s(10)));
        assert_eq!(go_duration("30s"), Some(s(30)));
        assert_eq!(go_duration("1m0s"), Some(s(60)));
        assert_eq!(go_duration("1h2m3s"), Some(s(3723)));
        assert_eq!(go_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(go_duration("300ms"), Some(Duration::from_millis(300)));
        assert_eq!(go_duration("0s"), Some(Duration::ZERO));
        for bad in [
            "", "10", "s", "-1s", "+1s", "10x", "1..5s", ".s", "10 s", "1e3s",
        ] {
            assert_eq!(go_duration(bad), None, "{bad:?}");
        }
    }

    fn deadline(query: Option<&str>) -> (Duration, Duration) {
        let d = AdmissionDeadline::from_query(query, Instant::now());
        (d.timeout, d.budget)
    }

    #[test]
    fn the_budget_is_the_apiservers_timeout_less_a_margin() {
        let ms = Duration::from_millis;
        assert_eq!(deadline(Some("timeout=10s")), (ms(10_000), ms(8_500)));
        assert_eq!(deadline(Some("timeout=30s")), (ms(30_000), ms(28_500)));
        assert_eq!(
            deadline(Some("dryRun=All&timeout=4s")),
            (ms(4_000), ms(2_500))
        );
        // A short timeout keeps half of itself: the margin would leave nothing.
        assert_eq!(deadline(Some("timeout=2s")), (ms(2_000), ms(1_000)));
        assert_eq!(deadline(Some("timeout=1s")), (ms(1_000), ms(500)));
    }

    #[test]
    fn a_missing_zero_or_unreadable_timeout_is_the_apis_default() {
        let default = (Duration::from_secs(10), Duration::from_millis(8_500));
        for query in [
            None,
            Some(""),
            Some("timeout="),
            Some("timeout=0s"),
            Some("timeout=-5s"),
            Some("timeout=soon"),
            Some("timeouts=3s"),
        ] {
            assert_eq!(deadline(query), default, "{query:?}");
        }
    }

    /// Anyone who reaches the webhook's port can send a `timeout`: one past the clock's range
    /// panicked when added to the arrival time.
    #[test]
    fn a_huge_timeout_is_the_apis_largest() {
        let largest = (Duration::from_secs(30), Duration::from_millis(28_500));
        for query in [
            "timeout=4000000000000000h",
            "timeout=1m4000000000000000h",
            "timeout=31s",
        ] {
            let got = std::panic::catch_unwind(|| deadline(Some(query)))
                .unwrap_or_else(|_| panic!("{query}: panicked"));
            assert_eq!(got, largest, "{query}");
        }
        // Past what a duration holds: unreadable, so the default.
        let got = std::panic::catch_unwind(|| {
            deadline(Some("timeout=9999999999999999h9999999999999999h"))
        })
        .unwrap_or_else(|_| panic!("the sum of two huge parts panicked"));
        assert_eq!(got.0, Duration::from_secs(10));
    }

    #[test]
    fn the_budget_counts_from_the_requests_arrival() {
        let now = Instant::now();
        let d = AdmissionDeadline::from_query(Some("timeout=4s"), now);
        assert_eq!(d.at, now + Duration::from_millis(2_500));
    }

    #[test]
    fn the_refusal_gives_both_times() {
        let d = AdmissionDeadline::from_query(Some("timeout=4s"), Instant::now());
        assert_eq!(
            d.refusal(),
            "kruise-rs could not decide within 2.5 s of the 4 s the apiserver waits for this \
             webhook: its calls to the apiserver were too slow; retry"
        );
        let d = AdmissionDeadline::from_query(Some("timeout=2s"), Instant::now());
        assert!(
            d.refusal()
                .starts_with("kruise-rs could not decide within 1 s of the 2 s")
        );
    }
}
