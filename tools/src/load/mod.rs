//! loadtest: request throughput against one URL (normally `/dispatcher`).
//!
//! Two shapes, after the originals:
//! - ibrowse-style: `--workers P --requests L`. P workers each make L
//!   requests one after another, sharing at most `--max-sessions S`
//!   connections, each carrying up to `--pipeline D` requests in flight.
//!   Prints every worker's elapsed time, like the Erlang test did.
//! - wrk-style: `--connections C --duration T`. C connections each keep
//!   `--pipeline D` requests in flight until the time is up.
//!
//! Everything runs on one thread per `--threads` (default 1, like `wrk -t1`),
//! with hand-rolled HTTP/1.1 so the tool is not the bottleneck.

mod conn;
mod report;

use std::cell::RefCell;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Parser;
use tokio::sync::{Notify, oneshot};

use crate::cli::{parse_duration, split_evenly};
use crate::target::Target;
pub use report::{Outcome, Report, Tally};

/// Measure request throughput and latency against one URL.
#[derive(Parser, Debug, Clone)]
#[command(name = "loadtest", version)]
pub struct Args {
    /// The URL to request (GET).
    #[arg(long, default_value = "http://127.0.0.1:8000/dispatcher")]
    pub url: String,
    /// ibrowse-style: number of workers, each making --requests requests in turn.
    #[arg(long, short = 'p', requires = "requests", conflicts_with_all = ["connections", "duration"])]
    pub workers: Option<u64>,
    /// ibrowse-style: requests per worker.
    #[arg(long, short = 'l', requires = "workers")]
    pub requests: Option<u64>,
    /// ibrowse-style: most connections to the host, shared by all workers.
    #[arg(long, short = 's', default_value_t = 10, conflicts_with = "connections")]
    pub max_sessions: u64,
    /// wrk-style: open connections, each looping until --duration is up.
    #[arg(long, short = 'c', requires = "duration")]
    pub connections: Option<u64>,
    /// wrk-style: how long to run.
    #[arg(long, short = 'd', value_parser = parse_duration, requires = "connections")]
    pub duration: Option<Duration>,
    /// Requests in flight per connection (HTTP/1.1 pipelining); 1 = none.
    #[arg(long, default_value_t = 1)]
    pub pipeline: u64,
    /// A new connection for every request (`connection: close`).
    #[arg(long, conflicts_with = "pipeline")]
    pub no_keepalive: bool,
    /// Give up on a request (and its connection) after this long.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Threads, each with its own share of connections.
    #[arg(long, default_value_t = 1)]
    pub threads: u64,
    /// Allow a target that is not a loopback address.
    #[arg(long)]
    pub allow_remote: bool,
    /// Write the summary as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Do not print per-worker times (ibrowse-style runs with many workers).
    #[arg(long)]
    pub quiet: bool,
}

/// The request shape for one run.
#[derive(Clone)]
pub struct Shape {
    /// Where to connect.
    pub target: Target,
    /// The request bytes, built once.
    pub request: Rc<[u8]>,
    /// Requests in flight per connection.
    pub pipeline: usize,
    /// Close after each request.
    pub close: bool,
    /// Per-request timeout.
    pub timeout: Duration,
}

/// Runs the test described by `args`, prints the report, returns it.
pub fn run(args: Args) -> anyhow::Result<Report> {
    let target = Target::parse(&args.url, args.allow_remote)?;
    if target.tls {
        bail!("loadtest speaks plain HTTP only: give an http:// URL");
    }
    if args.pipeline == 0 || args.threads == 0 {
        bail!("--pipeline and --threads must be at least 1");
    }
    crate::sys::raise_nofile()?;
    let started = Instant::now();
    let threads = args.threads;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let args = args.clone();
            let target = target.clone();
            std::thread::spawn(move || run_thread(&args, target, t, threads))
        })
        .collect();
    let mut tally = Tally::default();
    for h in handles {
        match h.join() {
            Ok(Ok(t)) => tally.merge(t),
            Ok(Err(e)) => return Err(e),
            Err(_) => bail!("a load thread panicked"),
        }
    }
    let report = Report::new(&args, tally, started.elapsed());
    report.print(args.quiet);
    if let Some(path) = &args.json {
        report.write_json(path)?;
    }
    Ok(report)
}

/// Thread `t` of `threads`: its share of workers or connections.
fn run_thread(args: &Args, target: Target, t: u64, threads: u64) -> anyhow::Result<Tally> {
    let share = |total: u64| split_evenly(total, threads, t);
    let close = args.no_keepalive;
    let request = format!(
        "GET {} HTTP/1.1\r\nhost: {}\r\nuser-agent: loadtest\r\n{}\r\n",
        target.path,
        target.host_header(),
        if close { "connection: close\r\n" } else { "" }
    );
    let shape = Shape {
        target,
        request: Rc::from(request.into_bytes()),
        pipeline: if close { 1 } else { args.pipeline as usize },
        close,
        timeout: args.timeout,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    let tally = match (args.workers, args.requests, args.connections, args.duration) {
        (Some(p), Some(l), _, _) => {
            local.block_on(&rt, workers(shape, share(p), l, share(args.max_sessions).max(1)))
        }
        (_, _, Some(c), Some(d)) => local.block_on(&rt, timed(shape, share(c), d)),
        _ => bail!("give --workers P --requests L, or --connections C --duration T"),
    };
    Ok(tally)
}

/// wrk-style: `conns` connections looping until `duration` is up.
async fn timed(shape: Shape, conns: u64, duration: Duration) -> Tally {
    let tally = Rc::new(RefCell::new(Tally::default()));
    let deadline = Instant::now() + duration;
    let tasks: Vec<_> = (0..conns)
        .map(|_| tokio::task::spawn_local(conn::run_until(shape.clone(), deadline, Rc::clone(&tally))))
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    Rc::try_unwrap(tally).map(RefCell::into_inner).unwrap_or_default()
}

/// A request a worker hands to the shared pool; answered when complete.
pub struct Job {
    /// Where to report the outcome.
    pub done: oneshot::Sender<Outcome>,
}

/// The pool's queue: workers push, connections pop.
#[derive(Default)]
pub struct Queue {
    /// Waiting requests.
    pub jobs: RefCell<VecDeque<Job>>,
    /// Wakes an idle connection.
    pub ready: Notify,
    /// No more jobs will come.
    pub closed: std::cell::Cell<bool>,
}

/// ibrowse-style: `p` workers × `l` requests over at most `sessions` connections.
async fn workers(shape: Shape, p: u64, l: u64, sessions: u64) -> Tally {
    let queue = Rc::new(Queue::default());
    let tally = Rc::new(RefCell::new(Tally::default()));
    let pool: Vec<_> = (0..sessions.min(p.max(1)))
        .map(|_| {
            tokio::task::spawn_local(conn::serve_queue(
                shape.clone(),
                Rc::clone(&queue),
                Rc::clone(&tally),
            ))
        })
        .collect();
    let workers: Vec<_> = (0..p)
        .map(|_| {
            let queue = Rc::clone(&queue);
            tokio::task::spawn_local(async move {
                let started = Instant::now();
                let mut ok = 0;
                for _ in 0..l {
                    let (done, rx) = oneshot::channel();
                    queue.jobs.borrow_mut().push_back(Job { done });
                    queue.ready.notify_one();
                    if matches!(rx.await, Ok(Outcome::Success)) {
                        ok += 1;
                    }
                }
                (started.elapsed(), ok)
            })
        })
        .collect();
    let mut elapsed = Vec::new();
    for w in workers {
        if let Ok(e) = w.await {
            elapsed.push(e);
        }
    }
    queue.closed.set(true);
    queue.ready.notify_waiters();
    for c in pool {
        let _ = c.await;
    }
    let mut tally = Rc::try_unwrap(tally).map(RefCell::into_inner).unwrap_or_default();
    tally.workers = elapsed;
    tally
}
