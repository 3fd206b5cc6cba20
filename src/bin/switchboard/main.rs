//! The switchboard server binary: parses the command line, then prints a
//! subscriber token (`token`), runs the fleet parent (`--processes`, see
//! [`fleet`]), or binds one [`Server`] and runs it until SIGINT or SIGTERM.
//! `cargo run --release`; see README.md.

mod fleet;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use switchboard::{Server, Settings};

/// A comet server for very many concurrent, mostly idle HTTP streams.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// A TOML file with settings on top of the defaults (any subset of the
    /// keys in config/default.toml). SWITCHBOARD__SECTION__KEY environment
    /// variables override both.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Run N server processes on the same ports (server.processes): a parent
    /// starts them, restarts one that dies and forwards SIGINT/SIGTERM.
    /// Needs cluster.redis_url.
    #[arg(long, value_name = "N")]
    processes: Option<usize>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Print a subscriber token (a JWT signed with auth.subscribe_secret,
    /// from the same config file and environment as the server) that opens
    /// streams of the given ids, then exit.
    Token {
        /// A stream id the token opens; repeat for several.
        #[arg(long = "id", value_name = "ID", required = true)]
        ids: Vec<String>,
        /// How long the token is valid: "90s", "30m", "1h", "7d".
        #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = humantime::parse_duration)]
        ttl: std::time::Duration,
        /// Sign with this secret instead of auth.subscribe_secret.
        #[arg(long, value_name = "SECRET")]
        secret: Option<String>,
    },
}

/// mimalloc: every stream's small allocations share a heap with
/// short-lived request state, and it leaves fewer bytes per idle stream
/// than glibc's. `no_thp`: huge pages about doubled an idle server's RSS
/// (a host whose `transparent_hugepage/enabled` is `always` gives them
/// anyway: there set `MIMALLOC_ALLOW_THP=0`). See docs/design-notes.md,
/// section "Allocator".
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    if let Some(Command::Token { ids, ttl, secret }) = &cli.command {
        let secret = match secret {
            Some(s) => s.clone(),
            None => Settings::load(cli.config.as_deref())?.auth.subscribe_secret,
        };
        println!("{}", switchboard::token::mint(&secret, ids, *ttl)?);
        return Ok(ExitCode::SUCCESS);
    }
    fleet::follow_parent()?;
    // The flag wins over the file and the environment, and is validated
    // with them.
    let settings = Settings::load_then(cli.config.as_deref(), |s| {
        if let Some(n) = cli.processes {
            s.server.processes = n;
        }
    })?;
    switchboard::telemetry::init(&settings.log)?;
    let (version, pid) = (env!("CARGO_PKG_VERSION"), std::process::id());
    if settings.server.processes > 1 {
        tracing::info!(
            event = "start",
            version,
            pid,
            processes = settings.server.processes,
            "switchboard fleet starting"
        );
        return fleet::run(&settings, cli.config.as_deref());
    }
    // Streams are file descriptors: use the whole hard limit, not the soft one.
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(open_files) => tracing::info!(event = "start", version, pid, open_files, "switchboard starting"),
        Err(e) => tracing::warn!(
            event = "start",
            version,
            pid,
            cause = %e,
            "switchboard starting; could not read or raise the open-file limit"
        ),
    }
    // From here the log is set up: a failure (the port taken, say) is a
    // log line like any other, not plain text on stderr.
    // The signal handlers go in before the server starts: a SIGINT that
    // comes as soon as it says it listens is a shutdown, not a kill.
    let served = Server::bind(settings).and_then(|server| {
        actix::System::new().block_on(async move {
            let signals = shutdown_signal();
            server.run(signals).await
        })
    });
    if let Err(e) = served {
        tracing::error!(event = "fatal", cause = %format!("{e:#}"), "switchboard cannot serve; exiting");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// Installs the SIGINT and SIGTERM handlers now (inside the runtime) and
/// answers a future that resolves on the first of them.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let installed = (signal(SignalKind::interrupt()), signal(SignalKind::terminate()));
    // SIGHUP too, now: its handler stays for the process's life, so a
    // SIGHUP a fleet parent passes on while this process is still starting
    // does not end it (the server reloads TLS on it once running).
    let _hangup = signal(SignalKind::hangup());
    async move {
        let (Ok(mut int), Ok(mut term)) = installed else {
            tracing::error!(
                event = "signal_handlers",
                "cannot install signal handlers; stop the server with SIGKILL"
            );
            return std::future::pending().await;
        };
        tokio::select! {
            _ = int.recv() => tracing::info!(event = "signal", signal = "SIGINT", "signal received"),
            _ = term.recv() => tracing::info!(event = "signal", signal = "SIGTERM", "signal received"),
        }
    }
}
