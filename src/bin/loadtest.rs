//! loadtest: request throughput and latency against one URL. See README.md.

use clap::Parser;

fn main() -> anyhow::Result<()> {
    let args = switchboard::load::Args::parse();
    switchboard::load::run(args)?;
    Ok(())
}
