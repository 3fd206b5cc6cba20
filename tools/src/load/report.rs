//! loadtest's tally and report.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use super::Args;
use crate::flood::report::ErrorKind;
use crate::latency::Latency;

/// How one request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// 2xx with a body.
    Success,
    /// Anything else.
    Error(ErrorKind),
}

/// Counts of one thread, then of the whole run.
#[derive(Default)]
pub struct Tally {
    /// Requests that completed or failed.
    pub requests: u64,
    /// Of those, 2xx with a body.
    pub success: u64,
    /// Failures by kind.
    pub errors: BTreeMap<ErrorKind, u64>,
    /// Latency of successful requests.
    pub latency: Latency,
    /// ibrowse-style: each worker's elapsed time and successes.
    pub workers: Vec<(Duration, u64)>,
}

impl Tally {
    /// Counts one request.
    pub fn record(&mut self, outcome: Outcome, latency: Duration) {
        self.requests += 1;
        match outcome {
            Outcome::Success => {
                self.success += 1;
                self.latency.record_micros(latency.as_micros() as u64);
            }
            Outcome::Error(kind) => *self.errors.entry(kind).or_default() += 1,
        }
    }

    /// Adds another thread's counts.
    pub fn merge(&mut self, other: Tally) {
        self.requests += other.requests;
        self.success += other.success;
        for (k, v) in other.errors {
            *self.errors.entry(k).or_default() += v;
        }
        self.latency.merge(&other.latency);
        self.workers.extend(other.workers);
    }
}

/// The outcome of a run.
pub struct Report {
    tally: Tally,
    elapsed: Duration,
    shape: String,
}

impl Report {
    /// Summarizes `tally` over `elapsed`.
    pub fn new(args: &Args, tally: Tally, elapsed: Duration) -> Self {
        let shape = match (args.workers, args.requests, args.connections) {
            (Some(p), Some(l), _) => format!(
                "{p} workers x {l} requests, max {} sessions, pipeline {}{}",
                args.max_sessions,
                args.pipeline,
                if args.no_keepalive { ", no keep-alive" } else { "" }
            ),
            (_, _, Some(c)) => format!(
                "{c} connections, pipeline {}, {:.1} s{}",
                args.pipeline,
                args.duration.unwrap_or_default().as_secs_f64(),
                if args.no_keepalive { ", no keep-alive" } else { "" }
            ),
            _ => String::new(),
        };
        Report {
            tally,
            elapsed,
            shape,
        }
    }

    /// Requests per second over the whole run.
    pub fn rps(&self) -> f64 {
        self.tally.requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The `--json` document.
    pub fn to_json(&self) -> Value {
        let t = &self.tally;
        let errors: BTreeMap<String, u64> = t.errors.iter().map(|(k, v)| (k.name(), *v)).collect();
        json!({
            "requests": t.requests,
            "success": t.success,
            "errors": errors,
            "rps": self.rps(),
            "duration_s": self.elapsed.as_secs_f64(),
            "latency_ms": t.latency.summary(),
            "workers": t.workers.iter().map(|(d, ok)| json!({"elapsed_s": d.as_secs_f64(), "success": ok})).collect::<Vec<_>>(),
        })
    }

    /// Prints the report; `quiet` leaves out per-worker lines.
    pub fn print(&self, quiet: bool) {
        let t = &self.tally;
        println!("loadtest: {}", self.shape);
        if !quiet {
            for (i, (d, ok)) in t.workers.iter().enumerate() {
                println!("  worker {:>4}: {:>8.3} s  {ok} ok", i + 1, d.as_secs_f64());
            }
        }
        let errors = if t.errors.is_empty() {
            "none".to_owned()
        } else {
            t.errors
                .iter()
                .map(|(k, v)| format!("{}={v}", k.name()))
                .collect::<Vec<_>>()
                .join(" ")
        };
        println!(
            "total {:.3} s  requests {}  success {}  errors: {errors}",
            self.elapsed.as_secs_f64(),
            t.requests,
            t.success
        );
        if t.requests > 0 {
            println!(
                "avg {:.3} ms/request  {:.0} req/s",
                self.elapsed.as_secs_f64() * 1000.0 / t.requests as f64,
                self.rps()
            );
        }
        if !t.latency.is_empty() {
            println!(
                "latency ms: p50 {:.3}  p90 {:.3}  p99 {:.3}  max {:.3}",
                t.latency.ms(0.5),
                t.latency.ms(0.9),
                t.latency.ms(0.99),
                t.latency.max_ms()
            );
        }
    }

    /// Writes the `--json` file.
    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        std::fs::write(path, serde_json::to_string_pretty(&self.to_json())? + "\n")?;
        Ok(())
    }
}
