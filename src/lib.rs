//! switchboard: a comet server for very many concurrent, mostly idle HTTP
//! streams, routing messages to any of them by id.
//!
//! The public API is what a program that embeds or tests the server needs:
//! [`Settings`] (and its sections), [`Server`], and [`telemetry::init`]. The
//! load tools and the benchmark harness are crates of their own beside this
//! one (`tools/`, `bench/`).
//!
//! # Layout
//!
//! Calls go one way, from the top of this list down:
//!
//! - `server`: binding, worker threads, the accept loop, graceful shutdown,
//!   and the one `match` that decides what becomes of a new connection.
//! - `classify`: peeks a new connection's request line (lean stream, lean
//!   `/dispatcher`, or actix-web) and reads a lean stream's head.
//! - `handshake`: what a stream request asks for beyond its id (transport:
//!   chunked, SSE or WebSocket; resume point; token; origin) and the
//!   response head each transport starts with.
//! - `token`: subscriber tokens (HS256 JWTs), checked before a stream starts.
//! - `dispatcher`: the lean `GET /dispatcher` path, numbers taken from the
//!   Counter in one message per worker per event-loop turn.
//! - `routes`: the actix-web routes (`/send`, `/broadcast`, `/dispatcher`,
//!   `/stats`, the fallback `/test`) and publish auth.
//! - `state`: what the workers and handlers of one server share.
//! - `stream`: the Stream actor (one per streaming connection), its sink and
//!   the per-worker tick wheel.
//! - `cluster`: cluster mode, the Redis pub/sub bus between processes: the
//!   command connection (publish, the fleet's count, heartbeats, `/cluster`)
//!   and the supervised Bus actor that holds this node's subscriptions.
//! - `idempotency`: `Idempotency-Key`s of publishes in one process.
//! - `router`: the Router actor, id -> streams; generic over the stream
//!   actor, so it never names it. It tells the bus which ids it holds.
//! - `history`: the Router's event ids and per-id rings of recent messages,
//!   and what a resuming stream is owed.
//! - `counter`: the Counter actor behind `/dispatcher`.
//! - `supervision`: how a panic in a Router or Counter handler becomes a
//!   restart that keeps the actor's state.
//! - `socket`: socket helpers for the lean paths (refusing, writing, handing
//!   a connection to actix-web with bytes put back in front).
//! - `error`: the one error vocabulary, for actix-web and the lean paths.
//! - `stats`: the counters behind `/stats`; `metrics`: the same in the
//!   Prometheus text format (`/metrics`), with the latency and lifetime
//!   histograms; `dashboard`: the live page at `/` and its feed.
//! - `id`: stream id rules.
//! - [`config`]: typed settings from `config/default.toml`, a file, and
//!   `SWITCHBOARD__*` environment variables.
//! - [`telemetry`]: logging setup for the binary, with the `event` field
//!   names and the per-statement rate limit.
//!
//! There is no `unsafe` in this crate.
#![forbid(unsafe_code)]

mod classify;
mod cluster;
pub mod config;
mod counter;
mod dashboard;
mod dispatcher;
mod error;
mod handshake;
mod history;
mod http_date;
mod id;
mod idempotency;
mod metrics;
mod router;
mod routes;
mod server;
mod socket;
mod state;
mod stats;
mod stream;
mod supervision;
pub mod telemetry;
pub mod token;

pub use config::{Settings, SettingsError};
pub use server::Server;

/// The property tests' settings: 10,000 cases each, or `PROPTEST_CASES`
/// (e.g. `PROPTEST_CASES=1000000 cargo test --lib properties` for a longer run).
#[cfg(test)]
fn proptest_config() -> proptest::test_runner::Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    proptest::test_runner::Config {
        cases,
        ..proptest::test_runner::Config::default()
    }
}
