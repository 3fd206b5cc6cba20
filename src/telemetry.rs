//! Logging through `tracing`, configured by `[log]`, with a rate limit.
//!
//! Every notable event carries a stable `event` field (`start`, `bind`,
//! `stop`, `fd_limit`, `slow_disconnects`, `restart`, `bus_down`, ...;
//! `docs/operations.md` lists them with their fields), so an operator can
//! match on it rather than on the message text.
//!
//! The rate limit: each log statement (callsite) writes at most
//! [`BURST`] lines per [`WINDOW`]; what is over is dropped and counted
//! (`/metrics` `switchboard_log_lines_suppressed_total`), and once per
//! window a `log_suppressed` line says how many lines each statement lost.
//! So a storm of one error (a client flood, Redis gone) cannot flood the
//! log, and what it hid is still visible.
//!
//! Hand-written on tracing-subscriber's own `Filter` trait (about 100
//! lines) rather than through `tracing-throttle`: that crate throttles by
//! signature, the event's field values included, so a storm whose lines
//! differ in one field (a stream id, a peer address) would pass it.
//! A statement is a `file:line` (lines of crates that log through the `log`
//! crate, such as actix, are told apart by their own file and line); a
//! panic counts by its location.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use tracing::{Event, Metadata};
use tracing_log::NormalizeEvent;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, Filter, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::{LogFormat, LogSettings};

/// Lines one log statement may write per [`WINDOW`].
pub const BURST: u64 = 20;

/// The rate limit's window, and how often suppressed lines are reported.
pub const WINDOW: Duration = Duration::from_secs(10);

/// Lines dropped by the rate limit since the process started.
static SUPPRESSED: AtomicU64 = AtomicU64::new(0);

/// The windows of every log statement that has written.
static LIMITER: LazyLock<Limiter> = LazyLock::new(Limiter::default);

/// Lines dropped by the rate limit since the process started (0 in a
/// process that did not call [`init`], such as the tests).
pub fn suppressed() -> u64 {
    SUPPRESSED.load(Relaxed)
}

/// Installs the global subscriber writing to stderr, and a thread that
/// reports suppressed lines every [`WINDOW`]. Called once, by the binary;
/// tests do not call it and stay quiet.
pub fn init(log: &LogSettings) -> anyhow::Result<()> {
    let filter = EnvFilter::try_new(&log.level)
        .map_err(|e| anyhow::anyhow!("configuration: log.level {:?}: {e}", log.level))?;
    let ansi = std::io::stderr().is_terminal();
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let layer = match log.format {
        LogFormat::Text => fmt.with_filter(RateLimit).boxed(),
        LogFormat::Json => fmt.json().with_filter(RateLimit).boxed(),
    };
    tracing_subscriber::registry()
        .with(filter)
        .with(layer)
        .try_init()
        .map_err(|e| anyhow::anyhow!("installing the log subscriber: {e}"))?;
    log_panics();
    std::thread::Builder::new()
        .name("log-limit".into())
        .spawn(|| {
            loop {
                std::thread::sleep(WINDOW);
                LIMITER.report();
            }
        })
        .map_err(|e| anyhow::anyhow!("starting the log rate limit's reporter: {e}"))?;
    Ok(())
}

/// The target of panic lines; they are limited by the panic hook itself
/// (per panic location), not again by the filter.
const PANIC_TARGET: &str = "switchboard::panic";

/// Sends panic messages through the log (one JSON line with
/// `event = "panic"`) instead of the default hook's lines of plain text on
/// stderr. The supervised actors recover from a panic in a handler, so a
/// panic is not the end of the process, and a storm of them must not flood
/// the log either: they are limited like any statement, but per panic
/// location, so a storm of one panic cannot hide a different one (such as
/// the one that ends the process). `RUST_BACKTRACE=1` adds the backtrace.
fn log_panics() {
    let backtraces = std::env::var_os("RUST_BACKTRACE").is_some_and(|v| v != "0");
    std::panic::set_hook(Box::new(move |info| {
        let cause = info
            .payload()
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| info.payload().downcast_ref::<String>().map(String::as_str))
            .unwrap_or("non-string panic payload");
        let location = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        if !LIMITER.admit(Statement {
            at: format!("panic at {location}"),
            level: tracing::Level::ERROR,
            target: PANIC_TARGET.to_owned(),
        }) {
            return;
        }
        let thread = std::thread::current();
        let thread = thread.name().unwrap_or("unnamed");
        if backtraces {
            let backtrace = std::backtrace::Backtrace::force_capture().to_string();
            tracing::error!(target: PANIC_TARGET, event = "panic", cause, location, thread, backtrace, "panic");
        } else {
            tracing::error!(target: PANIC_TARGET, event = "panic", cause, location, thread, "panic");
        }
    }));
}

/// What the limit counts lines of: a log statement (`file:line`; for a
/// panic, its location), with its level and target for the report.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Statement {
    at: String,
    level: tracing::Level,
    target: String,
}

impl Statement {
    /// The statement that wrote `event`. Lines from crates that use the
    /// `log` crate (actix, actix-web) all come through one callsite per
    /// level; their own target, file and line tell them apart.
    fn of(event: &Event<'_>) -> Self {
        let normalized = event.normalized_metadata();
        let meta = normalized.as_ref().unwrap_or_else(|| event.metadata());
        Statement {
            at: format!("{}:{}", meta.file().unwrap_or("?"), meta.line().unwrap_or(0)),
            level: *meta.level(),
            target: meta.target().to_owned(),
        }
    }
}

/// One statement's window.
struct Window {
    /// When it began.
    start: Instant,
    /// Lines written in it.
    lines: u64,
    /// Lines dropped and not yet reported.
    dropped: u64,
}

/// Every statement's window.
#[derive(Default)]
struct Limiter(Mutex<HashMap<Statement, Window>>);

impl Limiter {
    /// Whether one more line of `statement` may be written now.
    fn admit(&self, statement: Statement) -> bool {
        let now = Instant::now();
        let mut windows = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let w = windows.entry(statement).or_insert(Window {
            start: now,
            lines: 0,
            dropped: 0,
        });
        if now.duration_since(w.start) >= WINDOW {
            w.start = now;
            w.lines = 0;
        }
        if w.lines < BURST {
            w.lines += 1;
            true
        } else {
            w.dropped += 1;
            SUPPRESSED.fetch_add(1, Relaxed);
            false
        }
    }

    /// Logs, for each statement that lost lines since the last report, how
    /// many. (The lock is not held while logging: the line goes through
    /// [`Limiter::admit`] too.)
    fn report(&self) {
        let lost: Vec<(Statement, u64)> = {
            let mut windows = self.0.lock().unwrap_or_else(|p| p.into_inner());
            windows
                .iter_mut()
                .filter(|(_, w)| w.dropped > 0)
                .map(|(s, w)| (s.clone(), std::mem::take(&mut w.dropped)))
                .collect()
        };
        for (statement, lines) in lost {
            tracing::warn!(
                event = "log_suppressed",
                lines,
                statement = %statement.at,
                level = %statement.level,
                target = %statement.target,
                window_s = WINDOW.as_secs(),
                "log lines dropped by the rate limit ({BURST} per statement per {}s)",
                WINDOW.as_secs()
            );
        }
    }
}

/// The per-layer filter that applies the [`Limiter`] to events.
struct RateLimit;

impl<S> Filter<S> for RateLimit {
    fn enabled(&self, _meta: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        true
    }

    fn callsite_enabled(&self, _meta: &'static Metadata<'static>) -> tracing::subscriber::Interest {
        // Decided per event, in `event_enabled`.
        tracing::subscriber::Interest::sometimes()
    }

    fn event_enabled(&self, event: &Event<'_>, _cx: &Context<'_, S>) -> bool {
        event.metadata().target() == PANIC_TARGET || LIMITER.admit(Statement::of(event))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_statement_writes_at_most_a_burst_per_window() {
        struct Cs;
        impl tracing::callsite::Callsite for Cs {
            fn set_interest(&self, _: tracing::subscriber::Interest) {}
            fn metadata(&self) -> &Metadata<'_> {
                &META
            }
        }
        static CS: Cs = Cs;
        static META: Metadata<'static> = tracing::metadata!(
            name: "test",
            target: "t",
            level: tracing::Level::WARN,
            fields: &[],
            callsite: &CS,
            kind: tracing::metadata::Kind::EVENT
        );
        let limiter = Limiter::default();
        let before = suppressed();
        let values = META.fields().value_set(&[]);
        let event = Event::new(&META, &values);
        let admitted = (0..BURST + 30)
            .filter(|_| limiter.admit(Statement::of(&event)))
            .count() as u64;
        assert_eq!(admitted, BURST);
        assert!(suppressed() - before >= 30);
        // Another statement has its own budget.
        let other = Statement {
            at: "elsewhere:1".into(),
            level: tracing::Level::WARN,
            target: "t".into(),
        };
        assert!(limiter.admit(other));
        let windows = limiter.0.lock().unwrap();
        assert_eq!(windows[&Statement::of(&event)].dropped, 30);
    }
}
