//! switchboard: a comet server for very many concurrent, mostly idle HTTP
//! streams, routing messages to any of them by id.
//!
//! # Layout
//!
//! - [`config`]: typed settings from `config/default.toml`, a file, and
//!   `SWITCHBOARD__*` environment variables.
//! - [`server`]: binding, worker threads, the accept loop, graceful shutdown.
//! - [`handoff`]: peeks each new connection's request line and sends lean
//!   `GET /test/{id}` streams to a [`stream::Stream`] actor that owns the
//!   socket, keep-alive `GET /dispatcher` connections to [`dispatch`],
//!   everything else to actix-web.
//! - [`dispatch`]: the lean `/dispatcher` path, numbers taken from the Counter
//!   in one message per worker per event-loop turn.
//! - [`http`]: the actix-web routes (`/send`, `/broadcast`, `/dispatcher`,
//!   `/stats`, the fallback `/test`), their errors and auth.
//! - [`stream`]: the Stream actor (one per streaming connection) and its sink.
//! - [`router`]: the Router actor, id -> streams.
//! - [`counter`]: the Counter actor behind `/dispatcher`.
//! - [`supervision`]: how a panic in a Router or Counter handler becomes a
//!   restart that keeps the actor's state.
//! - [`stats`]: the counters behind `/stats`.
//! - [`state`]: what the pieces of one server share.
//! - [`id`]: stream id rules.
//! - [`telemetry`]: logging setup for the binary.
//!
//! The load tools (binaries `floodtest` and `loadtest`):
//!
//! - [`flood`]: floodtest, many long-lived streams and message latency.
//! - [`load`]: loadtest, request throughput (ibrowse- and wrk-style).
//! - [`target`]: loopback-checked target URLs.
//! - [`latency`]: HDR latency histograms.
//! - [`limits`]: open-file limit and source-address socket options.
//! - [`units`]: durations on the command line, splitting work evenly.
//! - [`wire`]: HTTP/1.1 framing shared by the lean path and the tools.
//! - [`bench`]: the benchmark harness (binary `bench`) behind BENCHMARKS.md.

pub mod bench;
pub mod config;
pub mod counter;
pub mod dispatch;
pub mod flood;
pub mod handoff;
pub mod http;
pub mod id;
pub mod latency;
pub mod limits;
pub mod load;
pub mod router;
pub mod server;
pub mod state;
pub mod stats;
pub mod stream;
mod supervision;
pub mod target;
pub mod telemetry;
pub mod units;
pub mod wire;

pub use config::Settings;
pub use server::Server;
