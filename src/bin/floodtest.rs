//! floodtest: many long-lived streams, `{Active, Closed, Chunks}` every
//! interval, optional routed-message latency. See README.md.

use clap::Parser;

fn main() -> anyhow::Result<()> {
    let args = switchboard::flood::Args::parse();
    switchboard::flood::run(args)?;
    Ok(())
}
