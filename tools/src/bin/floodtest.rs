//! floodtest: many long-lived streams, `{Active, Closed, Chunks}` every
//! interval, optional routed-message latency. See README.md.

use clap::Parser;

fn main() -> anyhow::Result<()> {
    switchboard_tools::flood::run(switchboard_tools::flood::Args::parse())?;
    Ok(())
}
