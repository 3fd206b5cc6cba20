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
//! Calls go one way, from the top of this list down (`.ci/run` checks that
//! no modules import each other in a circle):
//!
//! - `server`: binding (the public listeners and the internal one for
//!   operators), worker threads, signals (SIGHUP reloads the TLS
//!   certificate), graceful shutdown, and the start-up decision on
//!   protected mode.
//! - `conn`: the connection pipeline, over one wire (plain or TLS), its
//!   steps in order: the accept loop and the one `match` that decides what
//!   becomes of a new connection (`conn::serve`); the PROXY protocol, the
//!   client's real address (`X-Forwarded-For` from a trusted proxy) and the
//!   limits per client address (`conn::edge`); https:// and wss:// served
//!   natively, with the compact rustls session every TLS connection starts
//!   with, the record layer an idle TLS 1.3 stream keeps, and the
//!   certificate SIGHUP reloads (`conn::tls`); the request line peeked
//!   (lean stream, lean `/dispatcher`, or actix-web) and a lean stream's
//!   head read (`conn::classify`); what a stream request asks for beyond its
//!   id (`conn::handshake`); the lean `GET /dispatcher` path, numbers taken
//!   from the Counter in one message per worker per event-loop turn
//!   (`conn::dispatcher`); socket I/O for the lean paths (`conn::socket`,
//!   `conn::wire`) and the `Date` header of the answers they write,
//!   formatted once a second per worker (`conn::http_date`). Its lower
//!   steps (`tls`, `classify`, `handshake`, `socket`, `edge`,
//!   `http_date`) are leaves the modules below use; `.ci/run` checks its
//!   files one by one.
//! - `routes`: the actix-web routes (`/send`, `/broadcast`, `/dispatcher`,
//!   `/stats`, the fallback `/test`) and the guard of the operator pages
//!   (internal listener, `admin_public`, `admin_token`); `dashboard`: the live
//!   page at `/` and its feed; `metrics`: the counters in the Prometheus
//!   text format (`/metrics`), with the latency and lifetime histograms.
//! - `state`: what the workers and handlers of one server share.
//! - `admission`: who gets in: the one admission decision for every stream,
//!   lean or fallback, and for every publish; it owns their inputs (limits,
//!   token verifier, trusted proxies, CORS rule, `stream.max_streams`
//!   slots, publish token with protected mode, shutdown).
//! - `jwks`: the identity provider's keys (`auth.jwks_url`), fetched at
//!   start-up, on a timer, and when a token names a `kid` not held;
//!   `backend`: the thread (its own runtime and HTTP client with a
//!   keep-alive pool) the application's endpoints are called from;
//!   `hooks`: the subscribe hook (`hooks.subscribe_url`), asked before a
//!   stream is admitted.
//! - `counter`: the Counter actor behind `/dispatcher` (in cluster mode its
//!   numbers come from Redis, through the hub's command connection).
//! - `stream`: the Stream actor (one per streaming connection), the one
//!   place its response head is decided, its sink and the per-worker tick
//!   wheel.
//! - `hub`: where a message is published and a stream resumes: the Router
//!   (id -> streams, the fan-out; it names no engine), and the broker
//!   under it behind one trait: `memory` (one process: event ids and
//!   history) or `redis` (a fleet: the Redis command connection, whose
//!   publish script mints the fleet's event ids and keeps its history, and
//!   the supervised Bus that holds this node's subscriptions). Route
//!   handlers publish through `Hub::publish`; nothing above the hub touches
//!   the broker, the bus, the lingering table or the history.
//! - `token`: subscriber tokens (JWTs: HS256, or a public key's), bearer credentials, the
//!   constant-time compare.
//! - `idempotency`: `Idempotency-Key`s of publishes in one process.
//! - `supervision`: how a panic in a Router, Counter or Bus handler becomes
//!   a restart that keeps the actor's state.
//! - `stats`: the counters behind `/stats`.
//! - [`telemetry`]: logging setup for the binary, with the `event` field
//!   names and the per-statement rate limit.
//! - [`config`]: typed settings from `config/default.toml`, a file, and
//!   `SWITCHBOARD__*` environment variables.
//! - `error`: the one error vocabulary, for actix-web and the lean paths.
//! - `namespace`: `[namespaces.<name>]`, the policy of each id (history,
//!   token, hook), looked up by the id's prefix.
//! - `id`: stream id rules, connection ids, the shrink rule of tables keyed
//!   by id.
//!
//! Measurements behind constants and choices in the code:
//! `docs/design-notes.md`.
//!
//! There is no `unsafe` in this crate.
#![forbid(unsafe_code)]

mod admission;
mod backend;
mod conn;

pub mod config;
mod counter;
mod dashboard;
mod error;
mod events;
mod hooks;
mod hub;
mod id;
mod idempotency;
mod jwks;
mod metrics;
mod namespace;
mod per_id;
mod routes;
mod server;
mod state;
mod stats;
mod stream;
mod supervision;
pub mod telemetry;
pub mod token;
mod webhooks;

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
