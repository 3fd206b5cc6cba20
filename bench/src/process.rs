//! The processes the harness starts, and only those: each is held as a
//! [`Spawned`] (its `Child` stays unreaped until we wait for it, so its PID
//! cannot be reused under us), stopped by SIGTERM to that PID and waited for,
//! SIGKILLed only if it outlives a grace period, and stopped on drop too, so
//! an error return leaves nothing running. SIGINT/SIGTERM to the harness set
//! a flag that every wait checks ([`pause`]), so an interrupted run also
//! unwinds through those drops.

use std::io;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

/// Set when the harness got SIGINT or SIGTERM.
static STOP: AtomicBool = AtomicBool::new(false);

/// Longest single sleep between checks of the stop flag.
const PAUSE_STEP: Duration = Duration::from_millis(50);

/// How long a process gets to exit after SIGTERM before it is SIGKILLed.
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(15);

/// Turns SIGINT and SIGTERM into the stop flag (a thread waits for them).
pub(crate) fn stop_on_signal() {
    std::thread::spawn(|| {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
            return;
        };
        rt.block_on(async {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut int), Ok(mut term)) =
                (signal(SignalKind::interrupt()), signal(SignalKind::terminate()))
            else {
                return;
            };
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            eprintln!("bench: interrupted; stopping the processes it started");
            STOP.store(true, Ordering::SeqCst);
        });
    });
}

/// True once the harness got SIGINT or SIGTERM.
pub(crate) fn interrupted() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// Sleeps `d`, failing early if the harness was told to stop.
pub(crate) fn pause(d: Duration) -> anyhow::Result<()> {
    let end = Instant::now() + d;
    loop {
        if interrupted() {
            bail!("interrupted");
        }
        let now = Instant::now();
        if now >= end {
            return Ok(());
        }
        std::thread::sleep((end - now).min(PAUSE_STEP));
    }
}

/// A child process this harness started.
pub(crate) struct Spawned {
    /// What it is, for messages.
    name: String,
    /// The process; unreaped until it has been waited for.
    child: Child,
    /// Its exit status once seen.
    status: Option<ExitStatus>,
}

impl Spawned {
    /// Starts `cmd`.
    pub(crate) fn start(name: &str, cmd: &mut Command) -> anyhow::Result<Self> {
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name} ({:?})", cmd.get_program()))?;
        Ok(Spawned {
            name: name.to_owned(),
            child,
            status: None,
        })
    }

    /// Starts `cmd` with no stdin and its stdout and stderr both going to a
    /// new file at `log`.
    pub(crate) fn logged(name: &str, cmd: &mut Command, log: &Path) -> anyhow::Result<Self> {
        let out = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        cmd.stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out);
        Self::start(name, cmd)
    }

    /// Its PID.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its exit status if it has exited (reaps it).
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
        }
        self.status
    }

    /// Waits up to `limit` for it to exit by itself.
    pub(crate) fn wait_for_exit(&mut self, limit: Duration) -> anyhow::Result<Option<ExitStatus>> {
        let end = Instant::now() + limit;
        loop {
            if let Some(st) = self.exited() {
                return Ok(Some(st));
            }
            if Instant::now() >= end {
                return Ok(None);
            }
            pause(PAUSE_STEP)?;
        }
    }

    /// SIGTERM, then wait up to [`STOP_GRACE`]; SIGKILL if it is still there.
    /// Returns its exit status (already exited: that status).
    pub(crate) fn stop(&mut self) -> anyhow::Result<ExitStatus> {
        if let Some(st) = self.exited() {
            return Ok(st);
        }
        send_sigterm(self.pid()).with_context(|| format!("SIGTERM to {} ({})", self.name, self.pid()))?;
        let end = Instant::now() + STOP_GRACE;
        while Instant::now() < end {
            if let Some(st) = self.exited() {
                return Ok(st);
            }
            // Not `pause`: stopping must finish even after an interrupt.
            std::thread::sleep(PAUSE_STEP);
        }
        eprintln!(
            "bench: {} ({}) ignored SIGTERM for {:?}; killing it",
            self.name,
            self.pid(),
            STOP_GRACE
        );
        let _ = self.child.kill();
        let st = self.child.wait()?;
        self.status = Some(st);
        Ok(st)
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if self.exited().is_none() {
            let _ = self.stop();
        }
    }
}

/// Sends SIGTERM to one PID (with `kill(1)`: the crate keeps `unsafe` out of
/// this module). Only ever called for an unreaped child of ours.
fn send_sigterm(pid: u32) -> io::Result<()> {
    let st = Command::new("kill")
        .args(["-s", "TERM", &pid.to_string()])
        .status()?;
    if st.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("kill -s TERM {pid}: {st}")))
    }
}

/// A directory for one server's or tool's files, removed on drop.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    /// A new empty directory under the system temp dir.
    pub(crate) fn new(label: &str) -> io::Result<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path = std::env::temp_dir().join(format!(
            "switchboard-bench-{label}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&path)?;
        Ok(TempDir(path))
    }

    /// Where it is.
    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A loopback port nobody listens on right now.
pub(crate) fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The last `n` lines of a log file, for error messages.
pub(crate) fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A command line as one would type it: the program, then the arguments,
/// single-quoted where the shell would otherwise touch them.
pub(crate) fn shell_line(program: &str, args: &[String]) -> String {
    std::iter::once(program.to_owned())
        .chain(args.iter().map(|a| shell_quote(a)))
        .collect::<Vec<_>>()
        .join(" ")
}

fn shell_quote(a: &str) -> String {
    let plain = !a.is_empty()
        && a.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@%+".contains(c));
    if plain {
        a.to_owned()
    } else {
        format!("'{}'", a.replace('\'', r"'\''"))
    }
}

/// `path` relative to the current directory when it is under it (shorter
/// commands in the report), else as it is.
pub(crate) fn display_path(path: &Path) -> String {
    std::env::current_dir()
        .ok()
        .and_then(|cwd| path.strip_prefix(cwd).ok().map(Path::to_path_buf))
        .unwrap_or_else(|| path.to_path_buf())
        .display()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        let args = ["--url", "http://127.0.0.1:80/test/c{n}", "it's", ""].map(String::from);
        assert_eq!(
            shell_line("floodtest", &args),
            r"floodtest --url 'http://127.0.0.1:80/test/c{n}' 'it'\''s' ''"
        );
        assert_eq!(shell_quote("127.0.0.2-127.0.0.5"), "127.0.0.2-127.0.0.5");
    }

    #[test]
    fn stops_its_child() {
        let mut p = Spawned::start("sleep", Command::new("sleep").arg("30")).unwrap();
        assert!(p.exited().is_none());
        let t = Instant::now();
        let st = p.stop().unwrap();
        assert!(!st.success());
        assert!(t.elapsed() < Duration::from_secs(5));
        // A second stop reports the same status.
        assert_eq!(p.stop().unwrap(), st);
    }

    #[test]
    fn temp_dir_is_removed() {
        let d = TempDir::new("test").unwrap();
        let p = d.path().to_path_buf();
        std::fs::write(p.join("x"), "y").unwrap();
        assert!(tail(&p.join("x"), 5).contains('y'));
        drop(d);
        assert!(!p.exists());
    }
}
