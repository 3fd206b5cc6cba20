//! loadtest: request throughput and latency against one URL. See docs/tools.md.

use clap::Parser;

fn main() -> anyhow::Result<()> {
    switchboard_tools::load::run(switchboard_tools::load::Args::parse())?;
    Ok(())
}
