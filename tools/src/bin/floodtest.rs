//! floodtest: many long-lived streams, `{Active, Closed, Chunks}` every
//! interval, optional routed-message latency. See README.md.

use clap::Parser;

/// Each held stream is one tokio task (384 B) and one socket registration
/// (256 B), both 128-byte aligned allocations. glibc's `posix_memalign`
/// splits a chunk for each and leaves the cut-off pieces between them:
/// 1,073 B of RSS per stream at 10,000 (`floodtest --count 10000`). mimalloc
/// serves those sizes from size classes whose blocks are already aligned.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    switchboard_tools::flood::run(switchboard_tools::flood::Args::parse())?;
    Ok(())
}
