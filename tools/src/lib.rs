//! The switchboard load tools, behind the `floodtest` and `loadtest`
//! binaries (and the benchmark harness, which runs them).
//!
//! They are clients with their own HTTP/1.1 parsing: nothing here comes from
//! the server crate, so a bug in the server's parser cannot hide behind the
//! same bug in the tools'.
//!
//! # Layout
//!
//! - [`flood`]: floodtest, many long-lived streams and message latency.
//! - [`load`]: loadtest, request throughput (ibrowse- and wrk-style).
//! - [`cli`]: values as users type them on the command line: durations,
//!   address and port lists; splitting work evenly over processes.
//! - `target`: loopback-checked target URLs (`http://` and `https://`).
//! - `tls`: the rustls client configuration and connections for `https://`.
//! - `http`: the client side of HTTP/1.1, finding the end of a head and
//!   reading a `content-length` response.
//! - `latency`: HDR latency histograms.
//! - `sys`: the open-file limit, this process's RSS, and the one socket option
//!   std, tokio and socket2 do not expose (the only `unsafe` in the crate).

pub mod cli;
pub mod flood;
mod http;
mod latency;
pub mod load;
mod sys;
mod target;
mod tls;
