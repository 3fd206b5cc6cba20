//! What the machine and the checkout are, read when asked: CPU, memory,
//! kernel, open-file limit, peer package versions, the git commit.

use std::process::Command;

/// The machine, as the report describes it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Machine {
    /// CPU model name.
    pub cpu: String,
    /// Logical CPUs.
    pub cores: usize,
    /// MemTotal, bytes.
    pub mem_total: u64,
    /// Kernel release.
    pub kernel: String,
    /// This process's open-file limit (soft/hard), which caps streams per process.
    pub open_files: String,
    /// Debian package versions of the peers: (package, version).
    pub packages: Vec<(String, String)>,
    /// `rustc --version`.
    pub rustc: String,
}

/// Debian packages the benchmarks run against.
pub(crate) const PEER_PACKAGES: [&str; 4] = ["nginx", "libnginx-mod-nchan", "wrk", "redis-server"];

/// Reads the machine's description now.
pub(crate) fn describe() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let (cpu, cores) = cpu_model(&cpuinfo);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    Machine {
        cpu,
        cores,
        mem_total: super::procfs::kb_field(&meminfo, "MemTotal:").unwrap_or(0),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_or_else(|_| "unknown".into(), |s| s.trim().to_owned()),
        open_files: open_files(&std::fs::read_to_string("/proc/self/limits").unwrap_or_default()),
        packages: PEER_PACKAGES
            .iter()
            .map(|p| (p.to_string(), dpkg_version(p)))
            .collect(),
        rustc: output("rustc", &["--version"]).unwrap_or_else(|| "unknown".into()),
    }
}

/// The CPU model and the number of logical CPUs in `/proc/cpuinfo` text.
pub(crate) fn cpu_model(cpuinfo: &str) -> (String, usize) {
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")?
                .split_once(':')
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    let cores = cpuinfo.lines().filter(|l| l.starts_with("processor")).count();
    (model, cores)
}

/// `soft/hard` from the `Max open files` line of `/proc/self/limits`.
pub(crate) fn open_files(limits: &str) -> String {
    limits
        .lines()
        .find_map(|l| {
            let rest = l.strip_prefix("Max open files")?;
            let mut w = rest.split_whitespace();
            Some(format!("{}/{}", w.next()?, w.next()?))
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The installed version of a Debian package, or `not installed`.
pub(crate) fn dpkg_version(package: &str) -> String {
    output("dpkg-query", &["-W", "-f", "${Version}", package])
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "not installed".into())
}

/// The checked-out commit, short, with `-dirty` when tracked files differ
/// from it (the measured build may then not be that commit). The harness's
/// own outputs (results, BENCHMARKS.md, the chart) do not count: a run
/// rewrites them as it goes.
pub(crate) fn commit() -> String {
    let Some(head) = output("git", &["rev-parse", "--short=12", "HEAD"]) else {
        return "unknown".into();
    };
    let status = [
        "status",
        "--porcelain",
        "--untracked-files=no",
        "--",
        ".",
        ":(exclude)bench/results",
        ":(exclude)BENCHMARKS.md",
        ":(exclude)docs",
    ];
    let dirty = output("git", &status).is_some_and(|s| !s.is_empty());
    if dirty { format!("{head}-dirty") } else { head }
}

/// A command's trimmed stdout when it succeeds.
fn output(program: &str, args: &[&str]) -> Option<String> {
    let o = Command::new(program).args(args).output().ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpuinfo() {
        let text = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n\n\
                    processor\t: 1\nmodel name\t: AMD EPYC 7B13\n";
        assert_eq!(cpu_model(text), ("AMD EPYC 7B13".to_owned(), 2));
        assert_eq!(cpu_model(""), ("unknown".to_owned(), 0));
    }

    #[test]
    fn limits() {
        let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
                    Max open files            20000                20000                files     \n";
        assert_eq!(open_files(text), "20000/20000");
        assert_eq!(open_files(""), "unknown");
    }

    #[test]
    fn describes_this_machine() {
        let m = describe();
        assert!(m.cores >= 1);
        assert!(m.mem_total > 0);
        assert_eq!(m.packages.len(), PEER_PACKAGES.len());
    }
}
