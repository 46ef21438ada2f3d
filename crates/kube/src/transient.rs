//! Start-up requests that a busy or restarting API server may refuse for a moment: asked again
//! for a while rather than ending the process on the first 429, 5xx or refused connection (a
//! manager that exits there only trades a blip for a CrashLoopBackOff). Answers that will not
//! change by asking again (403, 404, a body that does not parse) are returned at once.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

use crate::backoff::{Doubling, jittered};

/// How long start-up keeps asking before it gives up with the last error.
pub const START_UP_PATIENCE: Duration = Duration::from_secs(60);
const FIRST_WAIT: Duration = Duration::from_millis(250);
const LONGEST_WAIT: Duration = Duration::from_secs(8);

/// Whether asking again may get another answer: the apiserver was overloaded (429), failed or
/// was unavailable (5xx), or could not be reached at all (connection, TLS or timeout errors
/// below HTTP).
pub fn is_transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code == 429 || status.code >= 500,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// Runs `request` until it succeeds, fails for good ([`is_transient`] false), or `patience`
/// has passed since the first attempt (then the last error). Waits between attempts double from
/// 250 ms to 8 s, with jitter; each retry is logged with `what`.
pub async fn retry_transient<T, F, Fut>(
    what: &str,
    patience: Duration,
    request: F,
) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    retry_while(what, patience, is_transient, request).await
}

/// [`retry_transient`] for steps whose errors wrap a [`kube::Error`]: `transient` tells which
/// are worth another attempt.
pub async fn retry_while<T, E, F, Fut>(
    what: &str,
    patience: Duration,
    transient: impl Fn(&E) -> bool,
    mut request: F,
) -> Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let give_up = Instant::now() + patience;
    let waits = Doubling::new(FIRST_WAIT, LONGEST_WAIT, 0.2);
    let mut failures = 0;
    loop {
        failures += 1;
        let wait = waits.unjittered(failures);
        match request().await {
            Ok(value) => return Ok(value),
            Err(error) if transient(&error) && Instant::now() + wait < give_up => {
                warn!(%error, retry_in = ?wait, "{what}: the API server did not answer; asking again");
                tokio::time::sleep(jittered(wait, waits.jitter)).await;
            }
            Err(error) => return Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(
            kube::core::Status::failure("refused", "Test").with_code(code),
        ))
    }

    #[test]
    fn overload_server_errors_and_transport_failures_are_transient() {
        for code in [429, 500, 503, 504] {
            assert!(is_transient(&api_error(code)), "{code}");
        }
        for code in [400, 401, 403, 404, 409, 422] {
            assert!(!is_transient(&api_error(code)), "{code}");
        }
        assert!(is_transient(&kube::Error::Service(
            "connection refused".into()
        )));
        let parse = serde_json::from_str::<u8>("x").unwrap_err();
        assert!(!is_transient(&kube::Error::SerdeError(parse)));
    }

    #[tokio::test(start_paused = true)]
    async fn transient_errors_are_asked_again_until_an_answer() {
        let calls = AtomicU32::new(0);
        let answer = retry_transient("test", START_UP_PATIENCE, || async {
            match calls.fetch_add(1, Ordering::SeqCst) {
                0 => Err(api_error(503)),
                1 => Err(api_error(429)),
                _ => Ok("version"),
            }
        })
        .await;
        assert_eq!(answer.unwrap(), "version");
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lasting_answer_is_returned_at_once() {
        let calls = AtomicU32::new(0);
        let answer: Result<(), _> = retry_transient("test", START_UP_PATIENCE, || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(api_error(403))
        })
        .await;
        assert!(matches!(answer, Err(kube::Error::Api(s)) if s.code == 403));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn patience_bounds_the_asking() {
        let started = Instant::now();
        let calls = AtomicU32::new(0);
        let answer: Result<(), _> = retry_transient("test", Duration::from_secs(30), || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(api_error(500))
        })
        .await;
        assert!(matches!(answer, Err(kube::Error::Api(s)) if s.code == 500));
        assert!(started.elapsed() <= Duration::from_secs(30));
        // 0.25 + 0.5 + 1 + 2 + 4 + 8 + 8 s of waits (before jitter) fit in 30 s: 7 or 8 asks.
        assert!((6..=8).contains(&calls.load(Ordering::SeqCst)), "{calls:?}");
    }
}
