//! bench: the benchmark harness behind `BENCHMARKS.md`. Each subcommand
//! starts every process it needs on loopback (switchboard, nginx with Nchan,
//! floodtest, wrk), measures one thing for a bounded time, stops exactly the
//! processes it started (by PID), prints a markdown table and writes a JSON
//! result; `report` turns the JSON results into `BENCHMARKS.md` and a chart.
//!
//! - [`Cli`], [`run`]: the command line and dispatch; [`Common`] and
//!   [`Ramp`] (and `servers::Servers`): flags several benchmarks share.
//! - `idle`, `dispatcher`, `latency`, `broadcast`, `connect`, `soak`,
//!   `cluster`: one benchmark each.
//! - `report`: `BENCHMARKS.md`, the targets, `docs/bytes-per-stream.svg` (`chart`).
//! - `servers`: starting and stopping switchboard and nginx + Nchan.
//! - `redis`: the `redis-server` that `cluster` joins switchboard processes with.
//! - `flood`, `wrk`: running the load tools and reading what they report.
//! - `procfs`: RSS, CPU time, slab memory, established sockets from `/proc`.
//! - `process`: child processes, temporary directories, interruption.
//! - `tls`: the test authority and server certificate of a run's TLS streams.
//! - `client`: a tiny blocking HTTP client for readiness, `/stats`, POSTs.
//! - `outcome`: the JSON result file every benchmark writes.
//! - `table`: markdown tables and number formatting.
//! - `machine`: what the machine and the checkout are.

mod broadcast;
mod c1m;
mod chart;
mod client;
mod cluster;
mod connect;
mod dispatcher;
mod flood;
mod idle;
mod latency;
mod machine;
mod outcome;
mod process;
mod procfs;
mod publish_flood;
mod redis;
mod report;
mod servers;
mod soak;
mod table;
mod tls;
mod wrk;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Descriptors a server or floodtest process keeps beyond the streams it
/// holds (listeners, stdio, epoll, stats connections, log files), with room.
const FD_MARGIN: u64 = 1_000;

/// Most streams one benchmark opens: one floodtest process and one server
/// process must each hold them under the hard open-file limit, which both
/// raise their soft limit to (20,000 here, so 19,000). Read at run time: a
/// machine with a higher limit measures more.
fn max_streams() -> u64 {
    // No limit readable: the figure this machine's 20,000 gives.
    let hard = rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(20_000, |(_, hard)| hard);
    hard.saturating_sub(FD_MARGIN).max(1)
}

/// The switchboard benchmarks, against Nchan (nginx) and nginx as peers.
#[derive(Parser, Debug)]
#[command(
    name = "bench",
    version,
    about = "The switchboard benchmarks: idle memory/CPU, /dispatcher throughput, routed latency, \
             broadcast, connect rate, soak, cluster; switchboard against nginx + Nchan on loopback.",
    after_help = "\
Each benchmark starts its own servers on free loopback ports, runs bounded in time, stops only what it \
started, prints a markdown table and writes OUT/<benchmark>.json. `bench report` turns those files into \
BENCHMARKS.md and docs/bytes-per-stream.svg.

Needs the release binaries beside this one (cargo build --release --bins), and nginx, \
libnginx-mod-nchan, wrk and redis-server (scripts/bench/peers.sh installs them).

  bench idle --counts 1000,10000        memory and CPU per idle stream
  bench dispatcher --duration 5s        GET /dispatcher req/s, switchboard vs nginx (wrk)
  bench latency                         10,000 streams, 1,000 routed messages/s
  bench broadcast                       one message to 19,000 streams
  bench connect                         streams established per second up to 19,000
  bench soak --duration 30m             churning streams, slowloris, never-readers: RSS flat, nothing lost
  bench cluster                         routed latency across 4 processes joined by Redis, beside 1 process
  bench report                          regenerate BENCHMARKS.md from bench/results
  scripts/bench/all.sh [--smoke]        all of the above (about 8 minutes, then the 30-minute soak; --smoke: about 5)"
)]
pub struct Cli {
    /// The benchmark to run.
    #[command(subcommand)]
    pub command: Command,
}

/// One benchmark, or the report.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Memory (RSS, kernel slab) and CPU per idle stream at several stream counts.
    Idle(idle::Args),
    /// `GET /dispatcher` requests per second with wrk, switchboard against nginx.
    Dispatcher(dispatcher::Args),
    /// Routed-message latency (POST → arrival) with many streams open.
    Latency(latency::Args),
    /// Time until one message reaches every one of many streams.
    Broadcast(broadcast::Args),
    /// A publisher faster than the streams: answers by status, RSS, drain;
    /// beside a baseline binary (the previous build) in the same run.
    Flood(publish_flood::Args),
    /// Streams established per second when many connect at once.
    Connect(connect::Args),
    /// A long mixed, hostile load: memory flat, nothing lost, back to baseline.
    Soak(soak::Args),
    /// Routed-message latency across several processes joined by Redis,
    /// beside one process on its own; Redis's CPU and RSS.
    Cluster(cluster::Args),
    /// Regenerates BENCHMARKS.md and the chart from the JSON results.
    Report(report::Args),
}

/// Options every benchmark takes.
#[derive(clap::Args, Debug, Clone)]
pub struct Common {
    /// Directory for the JSON result, `<benchmark>.json` (created if missing).
    #[arg(long, value_name = "DIR", default_value = "bench/results")]
    pub out: PathBuf,
    /// Tiny counts and short durations: checks the harness end to end in
    /// seconds; the numbers mean nothing. Explicit flags still win.
    #[arg(long)]
    pub smoke: bool,
}

/// How fast floodtest opens the streams, for the benchmarks that ramp up to
/// a number of streams (`idle`, `latency`, `broadcast`, `cluster`; `connect`
/// measures the opening itself and has its own `--rate`).
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct Ramp {
    /// Streams opened per second.
    #[arg(long, default_value_t = 5000.0)]
    pub rate: f64,
}

fn main() -> anyhow::Result<()> {
    run(Cli::parse())
}

/// Runs one subcommand.
fn run(cli: Cli) -> anyhow::Result<()> {
    process::stop_on_signal();
    match cli.command {
        Command::Idle(a) => idle::run(&a),
        Command::Dispatcher(a) => dispatcher::run(&a),
        Command::Latency(a) => latency::run(&a),
        Command::Broadcast(a) => broadcast::run(&a),
        Command::Flood(a) => publish_flood::run(&a),
        Command::Connect(a) => connect::run(&a),
        Command::Soak(a) => soak::run(&a),
        Command::Cluster(a) => cluster::run(&a),
        Command::Report(a) => report::run(&a),
    }
}

/// Checks a stream count (1 to [`max_streams`]) and an opening rate.
fn check_streams(streams: u64, rate: f64) -> anyhow::Result<()> {
    let max = max_streams();
    if streams == 0 || streams > max {
        anyhow::bail!("--streams must be between 1 and {max} (the open-file limit less {FD_MARGIN})");
    }
    check_positive("--rate", rate)
}

/// Checks that a rate flag is a positive number.
pub fn check_positive(flag: &str, x: f64) -> anyhow::Result<()> {
    if x.is_nan() || x <= 0.0 {
        anyhow::bail!("{flag} must be positive");
    }
    Ok(())
}

impl Common {
    /// `given` if the flag was passed, else the full or the smoke default.
    pub fn pick<T>(&self, given: Option<T>, full: T, smoke: T) -> T {
        given.unwrap_or(if self.smoke { smoke } else { full })
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;
    use crate::servers::ServerKind;

    #[test]
    fn command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn shared_flags_reach_each_benchmark() {
        let parse = |args: &[&str]| Cli::try_parse_from([&["bench"], args].concat()).unwrap().command;
        let both = vec![ServerKind::Switchboard, ServerKind::Nchan];
        match parse(&["idle", "--rate", "250", "--servers", "nchan", "--transport", "ws"]) {
            Command::Idle(a) => {
                assert_eq!(a.ramp.rate, 250.0);
                assert_eq!(a.matrix.servers.chosen(), vec![ServerKind::Nchan]);
            }
            c => panic!("{c:?}"),
        }
        match parse(&["latency"]) {
            Command::Latency(a) => {
                assert_eq!((a.ramp.rate, a.matrix.servers.chosen()), (5000.0, both.clone()))
            }
            c => panic!("{c:?}"),
        }
        match parse(&["broadcast", "--servers", "switchboard"]) {
            Command::Broadcast(a) => {
                assert_eq!(
                    (a.ramp.rate, a.servers.chosen()),
                    (5000.0, vec![ServerKind::Switchboard])
                )
            }
            c => panic!("{c:?}"),
        }
        match parse(&["cluster", "--rate", "100"]) {
            Command::Cluster(a) => assert_eq!(a.ramp.rate, 100.0),
            c => panic!("{c:?}"),
        }
        // connect opens as fast as it can: its own --rate, its own default.
        match parse(&["connect"]) {
            Command::Connect(a) => assert_eq!((a.rate, a.servers.chosen()), (1_000_000.0, both)),
            c => panic!("{c:?}"),
        }
        assert!(Cli::try_parse_from(["bench", "dispatcher", "--rate", "1"]).is_err());
    }
}
