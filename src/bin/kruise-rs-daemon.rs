//! `kruise-rs-daemon`: the node daemon on its own, the same as `kruise-rs daemon` (same flags)
//! in a binary that links none of the manager's code. What it maps and touches is its idle
//! memory on every node, so the DaemonSet runs this one.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use kruise_rs_daemon::{self as daemon, DaemonArgs};
use kruise_rs_kube::cli::{LogFormat, error_chain, init_logging, shutdown_signal};
use tracing::error;

/// Pulls what this node's NodeImage asks for through CRI (`kruise-rs daemon`, on its own).
#[derive(Debug, Parser)]
#[command(name = "kruise-rs-daemon", version, about)]
struct Cli {
    /// Log format. Verbosity comes from RUST_LOG (default `info`), e.g. `RUST_LOG=kruise_rs=debug`.
    #[arg(
        long,
        value_enum,
        env = "KRUISE_RS_LOG_FORMAT",
        default_value_t = LogFormat::Text
    )]
    log_format: LogFormat,

    #[command(flatten)]
    daemon: DaemonArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(err) = init_logging(cli.log_format) {
        eprintln!("kruise-rs-daemon: {}", error_chain(&err));
        return ExitCode::FAILURE;
    }
    match run(cli.daemon) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            error!("{}", error_chain(&err));
            ExitCode::FAILURE
        }
    }
}

fn run(args: DaemonArgs) -> anyhow::Result<()> {
    let opts = args.options().map_err(anyhow::Error::msg)?;
    // One thread: the daemon waits on the API server and the runtime (which does the pulling),
    // and a worker per core would each hold a stack and, with glibc, an arena.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let shutdown =
            shutdown_signal().context("cannot install the SIGTERM and SIGINT handlers")?;
        daemon::run(opts, shutdown, None).await?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn takes_the_daemon_flags_without_a_subcommand() {
        let cli = Cli::try_parse_from([
            "kruise-rs-daemon",
            "--node-name",
            "n1",
            "--log-format",
            "json",
            "--max-concurrent-pulls",
            "10",
        ])
        .unwrap();
        assert_eq!(cli.log_format, LogFormat::Json);
        let opts = cli.daemon.options().unwrap();
        assert_eq!(opts.node_name, "n1");
        assert_eq!(opts.max_concurrent_pulls, 10);
        assert_eq!(opts.kube_api_rate, Some(daemon::DEFAULT_KUBE_API_RATE));
        assert!(Cli::try_parse_from(["kruise-rs-daemon", "daemon", "--node-name", "n1"]).is_err());
    }
}
