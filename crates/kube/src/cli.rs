//! What the command lines of both binaries (`kruise-rs` and `kruise-rs-daemon`) share: duration
//! flags, the log format and logging set-up, and the shutdown signals.

use std::{future::Future, io::IsTerminal, time::Duration};

use anyhow::Context as _;
use tokio::signal::unix::{SignalKind, signal};
use tracing::info;
use tracing_subscriber::{EnvFilter, filter::LevelFilter};

/// How logs are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Parses `90`, `90s`, `10m`, `1h`, `500ms` (a plain number is seconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (digits, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 30s, 10m or 1h"))?;
    if unit == "ms" {
        return Ok(Duration::from_millis(n));
    }
    let seconds = match unit {
        "" | "s" => Some(n),
        "m" => n.checked_mul(60),
        "h" => n.checked_mul(3600),
        _ => {
            return Err(format!(
                "{text:?}: unknown unit {unit:?}; use ms, s, m or h"
            ));
        }
    };
    seconds
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?} is too long"))
}

/// Logs go to stderr so that `kruise-rs crds` keeps stdout for the YAML; colours only on a
/// terminal. Verbosity comes from RUST_LOG (default `info`).
pub fn init_logging(format: LogFormat) -> anyhow::Result<()> {
    let filter = EnvFilter::builder()
        .with_default_directive(LevelFilter::INFO.into())
        .from_env()
        .context("invalid RUST_LOG")?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    }
    .map_err(|err| anyhow::anyhow!(err))
    .context("cannot set up logging")
}

/// `outer: inner: …`, how both binaries report the error they stop on (see
/// [`crate::error_chain::error_chain`]).
pub fn error_chain(err: &anyhow::Error) -> String {
    crate::error_chain::error_chain(err.as_ref())
}

/// Resolves on the first SIGTERM or SIGINT. The handlers are installed now, so a signal that
/// arrives during start-up is not lost.
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = ()>> {
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        let name = tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = interrupt.recv() => "SIGINT",
        };
        info!(signal = name, "received a shutdown signal");
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_seconds_minutes_and_hours() {
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("5d").unwrap_err().contains("unknown unit"));
        assert!(
            parse_duration("soon")
                .unwrap_err()
                .contains("not a duration")
        );
        assert!(parse_duration("").is_err());
    }
}
