//! `switchboard --processes N`: a parent that runs N server processes on the
//! same ports.
//!
//! Each child is this binary again, with the same `--config`, and
//! `SWITCHBOARD__SERVER__PROCESSES=1` and `SWITCHBOARD__SERVER__REUSE_PORT=true`
//! on top, so the kernel spreads connections over them (SO_REUSEPORT) and
//! the Redis bus routes messages between them. The parent holds no socket:
//! it starts the children, logs their pids, restarts one that dies (with a
//! backoff, counted and logged), forwards SIGINT/SIGTERM as SIGTERM and
//! SIGHUP (reload the TLS certificate) as it is, and
//! exits 0 once every child has drained and exited 0.

use std::path::Path;
use std::process::{ExitCode, ExitStatus};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use switchboard::Settings;
use tokio::process::Command;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep};

/// First delay before restarting a child that died.
const RESTART_MIN: Duration = Duration::from_millis(100);
/// Longest delay between restarts of a child that keeps dying.
const RESTART_MAX: Duration = Duration::from_secs(10);
/// A child that lived this long before dying restarts after `RESTART_MIN`.
const HEALTHY_RUN: Duration = Duration::from_secs(30);
/// A child that exits with an error this soon after the first start is a
/// configuration or bind problem: the fleet stops rather than loop.
const FAILED_START: Duration = Duration::from_secs(2);
/// Time beyond `server.shutdown_timeout_ms` a child gets to exit after
/// SIGTERM before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(3);

/// Set in a child's environment to the parent's pid: the child asks the
/// kernel for SIGTERM when the parent dies ([`follow_parent`]).
pub(crate) const PARENT_ENV: &str = "SWITCHBOARD_FLEET_PARENT";

/// In a child of a fleet: SIGTERM (a graceful drain) when the parent dies,
/// even by SIGKILL, so no orphan keeps serving the port. Exits at once if
/// the parent is already gone.
pub(crate) fn follow_parent() -> anyhow::Result<()> {
    let Ok(parent) = std::env::var(PARENT_ENV) else {
        return Ok(());
    };
    nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?;
    if nix::unistd::getppid().as_raw().to_string() != parent {
        anyhow::bail!("the fleet parent (pid {parent}) is gone");
    }
    Ok(())
}

/// The kernel's host name.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// What the parent hears about.
enum ChildEvent {
    Exited {
        index: usize,
        pid: u32,
        status: std::io::Result<ExitStatus>,
    },
    Restart(usize),
}

/// One child slot.
struct Slot {
    pid: Option<u32>,
    started: Instant,
    first_start: bool,
    restarts: u64,
    delay: Duration,
}

/// Runs the fleet until a signal, then drains it. Blocks.
pub(crate) fn run(settings: &Settings, config: Option<&Path>) -> anyhow::Result<ExitCode> {
    // The ports must be free before any child starts. The probe binds
    // without SO_REUSEPORT, so it also fails where another fleet's (or any
    // reuse_port server's) listeners are: this fleet would otherwise share
    // their connections and route none of their messages.
    let mut probe = settings.clone();
    probe.server.reuse_port = false;
    if let Err(e) = switchboard::Server::bind(probe) {
        anyhow::bail!("{e} (is another switchboard, or another fleet, on it?)");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(supervise(settings, config))
}

async fn supervise(settings: &Settings, config: Option<&Path>) -> anyhow::Result<ExitCode> {
    let n = settings.server.processes;
    let exe = std::env::current_exe()?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (mut int, mut term) = (signal(SignalKind::interrupt())?, signal(SignalKind::terminate())?);
    // SIGHUP (reload the TLS certificate) goes on to every child; without
    // a handler it would end the parent.
    let mut hangup = signal(SignalKind::hangup())?;
    // Child i is "<name>-<i>", by default "<hostname>-<parent pid>-<i>": a
    // restarted child takes its slot's name, so /cluster lists it in place
    // of the one that died instead of beside it until the TTL.
    let base = if settings.cluster.node_name.is_empty() {
        format!("{}-{}", hostname(), std::process::id())
    } else {
        settings.cluster.node_name.clone()
    };
    let start = |index: usize| -> anyhow::Result<u32> {
        let mut cmd = Command::new(&exe);
        if let Some(config) = config {
            cmd.arg("--config").arg(config);
        }
        cmd.env("SWITCHBOARD__SERVER__PROCESSES", "1")
            .env("SWITCHBOARD__SERVER__REUSE_PORT", "true")
            .env(PARENT_ENV, std::process::id().to_string())
            .env("SWITCHBOARD__CLUSTER__NODE_NAME", format!("{base}-{index}"));
        let mut child = cmd.spawn()?;
        let pid = child.id().unwrap_or(0);
        let tx = tx.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            let _ = tx.send(ChildEvent::Exited { index, pid, status });
        });
        Ok(pid)
    };
    let mut slots = Vec::with_capacity(n);
    for index in 0..n {
        let pid = start(index)?;
        tracing::info!(event = "process_start", index, pid, "started server process");
        slots.push(Slot {
            pid: Some(pid),
            started: Instant::now(),
            first_start: true,
            restarts: 0,
            delay: RESTART_MIN,
        });
    }
    tracing::info!(event = "fleet", processes = n, pids = ?slots.iter().filter_map(|s| s.pid).collect::<Vec<_>>(), "fleet running");
    let signal = loop {
        let event = tokio::select! {
            _ = int.recv() => break "SIGINT",
            _ = term.recv() => break "SIGTERM",
            _ = hangup.recv() => {
                let pids: Vec<u32> = slots.iter().filter_map(|s| s.pid).collect();
                tracing::info!(event = "signal", signal = "SIGHUP", ?pids, "SIGHUP passed on to every server process");
                for pid in pids {
                    signal_pid(pid, Signal::SIGHUP);
                }
                continue;
            }
            e = rx.recv() => e,
        };
        match event {
            Some(ChildEvent::Exited { index, pid, status }) => {
                let slot = &mut slots[index];
                slot.pid = None;
                let lived = slot.started.elapsed();
                let failed_code = status
                    .as_ref()
                    .ok()
                    .and_then(ExitStatus::code)
                    .filter(|c| *c != 0);
                if slot.first_start && lived < FAILED_START && failed_code.is_some() {
                    tracing::error!(
                        event = "process_failed",
                        index,
                        pid,
                        code = failed_code,
                        "server process failed at start (see its log above); stopping the fleet"
                    );
                    stop_all(&mut slots, &mut rx, settings).await;
                    return Ok(ExitCode::FAILURE);
                }
                slot.delay = if lived >= HEALTHY_RUN {
                    RESTART_MIN
                } else {
                    slot.delay
                };
                slot.restarts += 1;
                tracing::warn!(
                    event = "process_exit",
                    index,
                    pid,
                    status = %describe(&status),
                    restarts = slot.restarts,
                    delay_ms = slot.delay.as_millis() as u64,
                    "server process exited; restarting"
                );
                let (tx, delay) = (tx.clone(), slot.delay);
                slot.delay = (slot.delay * 2).min(RESTART_MAX);
                tokio::spawn(async move {
                    sleep(delay).await;
                    let _ = tx.send(ChildEvent::Restart(index));
                });
            }
            Some(ChildEvent::Restart(index)) => match start(index) {
                Ok(pid) => {
                    let slot = &mut slots[index];
                    (slot.pid, slot.started, slot.first_start) = (Some(pid), Instant::now(), false);
                    tracing::info!(
                        event = "restart",
                        actor = "process",
                        index,
                        pid,
                        restarts = slot.restarts,
                        "restarted server process"
                    );
                }
                Err(e) => {
                    tracing::error!(
                        event = "process_failed",
                        index,
                        cause = %e,
                        "could not start a server process; retrying"
                    );
                    let tx = tx.clone();
                    let delay = slots[index].delay;
                    tokio::spawn(async move {
                        sleep(delay).await;
                        let _ = tx.send(ChildEvent::Restart(index));
                    });
                }
            },
            None => unreachable!("the parent holds a sender"),
        }
    };
    tracing::info!(
        event = "stop",
        signal,
        "signal received; stopping every server process"
    );
    Ok(if stop_all(&mut slots, &mut rx, settings).await {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// SIGTERM to every running child, then waits for them (SIGKILL past the
/// grace time). True if every one exited 0.
async fn stop_all(
    slots: &mut [Slot],
    rx: &mut mpsc::UnboundedReceiver<ChildEvent>,
    settings: &Settings,
) -> bool {
    let deadline = Instant::now() + Duration::from_millis(settings.server.shutdown_timeout_ms) + EXIT_GRACE;
    for pid in slots.iter().filter_map(|s| s.pid) {
        signal_pid(pid, Signal::SIGTERM);
    }
    let (mut clean, mut killed) = (true, false);
    while slots.iter().any(|s| s.pid.is_some()) {
        let event = tokio::select! {
            e = rx.recv() => e,
            () = tokio::time::sleep_until(deadline), if !killed => {
                for pid in slots.iter().filter_map(|s| s.pid) {
                    tracing::error!(event = "process_killed", pid, "server process did not exit in time; killing it");
                    signal_pid(pid, Signal::SIGKILL);
                }
                (clean, killed) = (false, true);
                continue;
            }
        };
        match event {
            Some(ChildEvent::Exited { index, pid, status }) => {
                slots[index].pid = None;
                let ok = status.as_ref().is_ok_and(ExitStatus::success);
                clean &= ok;
                tracing::info!(
                    event = "process_exit",
                    index,
                    pid,
                    status = %describe(&status),
                    "server process exited"
                );
            }
            Some(ChildEvent::Restart(_)) => {}
            None => break,
        }
    }
    clean
}

fn signal_pid(pid: u32, signal: Signal) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = kill(Pid::from_raw(pid), signal);
    }
}

fn describe(status: &std::io::Result<ExitStatus>) -> String {
    match status {
        Ok(s) => s.to_string(),
        Err(e) => format!("unknown ({e})"),
    }
}
