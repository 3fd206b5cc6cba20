//! Going past one process's open-file limit: the flood is split over child
//! processes (this same binary with `--child I/K`), each holding at most the
//! per-process budget. Children print a JSON snapshot each interval and a
//! final one with their latency histogram; the parent adds them up and
//! reports as if it were one process.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::Value;

use super::Args;
use super::report::{Reporter, Snapshot, Summary, stats_target, stats_tls};
use crate::target::Target;

/// Extra time a child gets past `--duration` before the parent kills it.
const CHILD_GRACE: Duration = Duration::from_secs(30);

/// The parent reads the server's statistics a last time this long before
/// the run ends (at most half of it), while the children still hold their
/// streams: once they have exited, the server counts none.
const FINAL_READ_LEAD: Duration = Duration::from_millis(500);

/// What the parent knows of one child.
#[derive(Default)]
struct Seen {
    latest: Snapshot,
    last: Option<Snapshot>,
}

/// Runs `args` as `ceil(count / budget)` children and aggregates them.
pub(super) fn run(args: &Args, budget: u64) -> anyhow::Result<Summary> {
    let k = args.count.div_ceil(budget);
    let exe = std::env::current_exe().context("locating this executable")?;
    let passthrough = child_args();
    let started = Instant::now();
    let mut children = Children(Vec::new());
    let mut readers = Vec::new();
    let seen: Vec<Arc<Mutex<Seen>>> = (0..k).map(|_| Arc::default()).collect();
    for i in 0..k {
        let mut child = Command::new(&exe)
            .args(&passthrough)
            .arg("--child")
            .arg(format!("{i}/{k}"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting child {i}"))?;
        let out = child.stdout.take().context("child stdout")?;
        let seen = Arc::clone(&seen[i as usize]);
        readers.push(std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                let mut s = seen.lock().unwrap_or_else(|p| p.into_inner());
                match v.get("final") {
                    Some(f) => s.last = Some(Snapshot::from_json(f)),
                    None => s.latest = Snapshot::from_json(&v),
                }
            }
        }));
        children.0.push(child);
    }
    println!(
        "floodtest: {} streams over {k} processes (at most {budget} each)",
        args.count
    );

    let first = match (&args.url, &args.urls) {
        (Some(u), _) => Target::parse(u, args.allow_remote)?,
        _ => Target::parse("http://127.0.0.1/", true)?,
    };
    let stats_url = if args.urls.is_some() && args.stats_url.is_none() {
        None
    } else {
        stats_target(args, &first)?
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let tls = stats_tls(args, stats_url.as_ref(), None)?;
    let mut reporter = Reporter::new(args, stats_url, tls);
    let sum = |final_only: bool| {
        let mut total = Snapshot::default();
        for s in &seen {
            let s = s.lock().unwrap_or_else(|p| p.into_inner());
            match (&s.last, final_only) {
                (Some(last), _) => total.add(last),
                (None, false) => total.add(&s.latest),
                (None, true) => {}
            }
        }
        total
    };
    let kill_at = started + args.duration + CHILD_GRACE;
    let final_read_at = started + args.duration - FINAL_READ_LEAD.min(args.duration / 2);
    let mut final_read = false;
    let mut next = started + args.interval;
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; children.0.len()];
    while statuses.iter().any(Option::is_none) {
        std::thread::sleep(Duration::from_millis(50));
        for (c, status) in children.0.iter_mut().zip(statuses.iter_mut()) {
            if status.is_none() {
                *status = c.try_wait()?;
            }
        }
        if Instant::now() >= next && Instant::now() < started + args.duration {
            rt.block_on(reporter.report(sum(false)));
            next += args.interval;
        } else if reporter.is_live() {
            reporter.show(&sum(false));
        }
        if !final_read && Instant::now() >= final_read_at && statuses.iter().all(Option::is_none) {
            rt.block_on(reporter.fetch_server());
            final_read = true;
        }
        if Instant::now() > kill_at {
            children.kill();
        }
    }
    // Each reader ends at its child's end of output, after the final line.
    for r in readers {
        let _ = r.join();
    }
    let total = sum(true);
    let summary = rt.block_on(reporter.summarize(total, started.elapsed(), k, !final_read));
    summary.print();
    if let Some(path) = &args.json {
        summary.write_json(path)?;
    }
    let failed: Vec<String> = statuses
        .iter()
        .enumerate()
        .filter(|(_, st)| !st.is_some_and(|st| st.success()))
        .map(|(i, st)| format!("child {i}: {st:?}"))
        .collect();
    if !failed.is_empty() {
        anyhow::bail!(
            "not every child finished cleanly, so the totals miss their share: {}",
            failed.join(", ")
        );
    }
    Ok(summary)
}

/// The child processes; any still running when this is dropped (an early
/// error return in the parent) are killed, so none outlives the run.
struct Children(Vec<Child>);

impl Children {
    fn kill(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
        }
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        self.kill();
        for c in &mut self.0 {
            let _ = c.wait();
        }
    }
}

/// This process's arguments minus `--json` (the parent writes it).
fn child_args() -> Vec<String> {
    let mut out = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--json" {
            args.next();
        } else if !a.starts_with("--json=") {
            out.push(a);
        }
    }
    out
}
