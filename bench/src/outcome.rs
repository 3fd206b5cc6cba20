//! The JSON result file every benchmark writes, `OUT/<benchmark>.json`: what
//! was run (the harness command and every server and tool command line),
//! on which commit, whether it was a smoke run, notes, and the benchmark's
//! own data.

use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::machine;
use super::process::{display_path, shell_line};

/// One benchmark's result.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub(crate) struct Outcome<D> {
    /// Which benchmark (`idle`, `dispatcher`, ...); also the file name.
    pub benchmark: String,
    /// A `--smoke` run: the numbers only show the harness works.
    pub smoke: bool,
    /// The harness command line.
    pub command: String,
    /// Every server and tool command line the harness ran, in order.
    pub tools: Vec<String>,
    /// `git describe`-style commit of the checkout that was measured.
    pub commit: String,
    /// When the run started, seconds since the Unix epoch.
    pub started_unix: u64,
    /// How long it took, seconds.
    pub elapsed_s: f64,
    /// Anything odd seen during the run (incomplete ramps, unclean exits).
    pub notes: Vec<String>,
    /// The benchmark's measurements.
    pub data: D,
}

/// Collects commands and notes while a benchmark runs.
pub(crate) struct Recorder {
    /// Which benchmark.
    benchmark: String,
    /// `--smoke`.
    smoke: bool,
    /// For `elapsed_s`.
    started: Instant,
    /// For `started_unix`.
    started_unix: u64,
    /// Commands run so far.
    tools: Vec<String>,
    /// Notes so far.
    notes: Vec<String>,
}

impl Recorder {
    /// Starts recording `benchmark`.
    pub(crate) fn new(benchmark: &str, smoke: bool) -> Self {
        Recorder {
            benchmark: benchmark.into(),
            smoke,
            started: Instant::now(),
            started_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            tools: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// A command the harness ran.
    pub(crate) fn tool(&mut self, command: &str) {
        self.tools.push(command.to_owned());
    }

    /// Something worth knowing about the run; also printed now.
    pub(crate) fn note(&mut self, note: String) {
        eprintln!("bench: note: {note}");
        self.notes.push(note);
    }

    /// The finished outcome.
    pub(crate) fn finish<D>(self, data: D) -> Outcome<D> {
        let mut args = std::env::args();
        let program = args
            .next()
            .map(|p| display_path(Path::new(&p)))
            .unwrap_or_else(|| "bench".into());
        Outcome {
            benchmark: self.benchmark,
            smoke: self.smoke,
            command: shell_line(&program, &args.collect::<Vec<_>>()),
            tools: self.tools,
            commit: machine::commit(),
            started_unix: self.started_unix,
            elapsed_s: self.started.elapsed().as_secs_f64(),
            notes: self.notes,
            data,
        }
    }
}

impl<D: Serialize + DeserializeOwned> Outcome<D> {
    /// The file for `benchmark` in `dir`.
    pub(crate) fn path(dir: &Path, benchmark: &str) -> PathBuf {
        dir.join(format!("{benchmark}.json"))
    }

    /// Writes `dir/<benchmark>.json` (creating `dir`); returns the path.
    pub(crate) fn write(&self, dir: &Path) -> anyhow::Result<PathBuf> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = Self::path(dir, &self.benchmark);
        std::fs::write(&path, serde_json::to_string_pretty(self)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// Prints `rendered` (the benchmark's tables) and the notes, writes the
    /// file, and says where.
    pub(crate) fn publish(&self, dir: &Path, rendered: &str) -> anyhow::Result<()> {
        println!("\n{rendered}");
        for n in &self.notes {
            println!("note: {n}");
        }
        let path = self.write(dir)?;
        println!("wrote {}", path.display());
        Ok(())
    }

    /// Reads `dir/<benchmark>.json`; `None` if there is no such file.
    pub(crate) fn read(dir: &Path, benchmark: &str) -> anyhow::Result<Option<Self>> {
        let path = Self::path(dir, benchmark);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        serde_json::from_str(&text)
            .with_context(|| format!("parsing {}", path.display()))
            .map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let dir = super::super::process::TempDir::new("outcome").unwrap();
        let mut r = Recorder::new("demo", true);
        r.tool("wrk -t1 -c64 -d1s --latency http://127.0.0.1:1/dispatcher");
        r.note("something odd".into());
        let o = r.finish(vec![1u32, 2, 3]);
        let path = o.write(dir.path()).unwrap();
        assert!(path.ends_with("demo.json"));
        let back = Outcome::<Vec<u32>>::read(dir.path(), "demo").unwrap().unwrap();
        assert_eq!(
            (back.data, back.smoke, back.notes.len(), back.tools.len()),
            (vec![1, 2, 3], true, 1, 1)
        );
        assert!(Outcome::<Vec<u32>>::read(dir.path(), "absent").unwrap().is_none());
    }
}
