//! Logging through `tracing`, configured by `[log]`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, LogSettings};

/// Installs the global subscriber writing to stderr. Called once, by the
/// binary; tests do not call it and stay quiet.
pub fn init(log: &LogSettings) -> anyhow::Result<()> {
    let filter = EnvFilter::try_new(&log.level)
        .map_err(|e| anyhow::anyhow!("configuration: log.level {:?}: {e}", log.level))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let result = match log.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    result.map_err(|e| anyhow::anyhow!("installing the log subscriber: {e}"))
}
