//! bench: the benchmark harness; `bench --help` lists the benchmarks.

use clap::Parser;

fn main() -> anyhow::Result<()> {
    switchboard::bench::run(switchboard::bench::Cli::parse())
}
