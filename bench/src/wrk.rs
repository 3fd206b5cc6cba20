//! wrk as the request-throughput client: `wrk -t1 -cC -dD --latency URL`,
//! bounded in time, and a parser for what it prints.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};

use super::process::{Spawned, TempDir, shell_line};
use super::servers::find_program;

/// Extra time wrk gets past its `-d` before it is stopped.
const GRACE: Duration = Duration::from_secs(15);

/// What one wrk run measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct WrkStats {
    /// Completed requests (`N requests in ...`).
    pub requests: u64,
    /// Its measured run time, seconds.
    pub duration_s: f64,
    /// `Requests/sec:`.
    pub rps: f64,
    /// Median latency, ms (`--latency` distribution).
    pub p50_ms: Option<f64>,
    /// 99th-percentile latency, ms.
    pub p99_ms: Option<f64>,
    /// Connect, read, write and timeout errors together.
    pub socket_errors: u64,
    /// `Non-2xx or 3xx responses:`.
    pub non_2xx: u64,
}

/// Runs `wrk -t1 -c<connections> -d<secs>s --latency <url>`; returns what it
/// measured and the command line.
pub(crate) fn run(url: &str, connections: u32, duration: Duration) -> anyhow::Result<(WrkStats, String)> {
    let wrk = find_program("wrk").context("wrk not found; run scripts/bench/peers.sh")?;
    let args: Vec<String> = vec![
        "-t1".into(),
        format!("-c{connections}"),
        format!("-d{}s", duration.as_secs().max(1)),
        "--latency".into(),
        url.into(),
    ];
    let dir = TempDir::new("wrk")?;
    let out_path = dir.path().join("wrk.out");
    let mut proc = Spawned::logged("wrk", Command::new(&wrk).args(&args), &out_path)?;
    let status = proc.wait_for_exit(duration + GRACE)?;
    let text = std::fs::read_to_string(&out_path)?;
    match status {
        Some(st) if st.success() => {}
        Some(st) => bail!("wrk failed ({st}):\n{text}"),
        None => {
            proc.stop()?;
            bail!("wrk ran {GRACE:?} past its duration");
        }
    }
    let stats = parse(&text).map_err(|e| anyhow::anyhow!("{e}; wrk printed:\n{text}"))?;
    Ok((stats, shell_line("wrk", &args)))
}

/// Parses wrk's report.
pub(crate) fn parse(text: &str) -> Result<WrkStats, String> {
    let mut s = WrkStats::default();
    let (mut saw_requests, mut saw_rps) = (false, false);
    for line in text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("Requests/sec:") {
            s.rps = number(rest.trim()).ok_or(format!("bad Requests/sec: {rest:?}"))?;
            saw_rps = true;
        } else if let Some((n, rest)) = line.split_once(" requests in ") {
            s.requests = number(n).ok_or(format!("bad request count {n:?}"))? as u64;
            let d = rest.split(',').next().unwrap_or(rest);
            s.duration_s = time_ms(d).ok_or(format!("bad duration {d:?}"))? / 1000.0;
            saw_requests = true;
        } else if let Some(rest) = line.strip_prefix("Socket errors:") {
            // "connect 0, read 0, write 0, timeout 0"
            for part in rest.split(',') {
                let n = part.split_whitespace().nth(1).and_then(number);
                s.socket_errors += n.ok_or(format!("bad socket errors {rest:?}"))? as u64;
            }
        } else if let Some(rest) = line.strip_prefix("Non-2xx or 3xx responses:") {
            s.non_2xx = number(rest.trim()).ok_or(format!("bad Non-2xx {rest:?}"))? as u64;
        } else if let Some(rest) = line.strip_prefix("50%") {
            s.p50_ms = time_ms(rest.trim());
        } else if let Some(rest) = line.strip_prefix("99%") {
            s.p99_ms = time_ms(rest.trim());
        }
    }
    if !(saw_requests && saw_rps) {
        return Err("no `requests in` or `Requests/sec:` line in wrk's output".into());
    }
    Ok(s)
}

/// A wrk count: `52321.90`, `58.44k`, `1.20M`, `3G`.
pub(crate) fn number(s: &str) -> Option<f64> {
    let s = s.trim();
    let (digits, scale) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 1e3),
        'M' => (&s[..s.len() - 1], 1e6),
        'G' => (&s[..s.len() - 1], 1e9),
        _ => (s, 1.0),
    };
    let n: f64 = digits.parse().ok()?;
    n.is_finite().then_some(n * scale)
}

/// A wrk time (`235.42us`, `1.92ms`, `10.00s`, `1.50m`, `1.00h`) in ms.
pub(crate) fn time_ms(s: &str) -> Option<f64> {
    let s = s.trim();
    let split = s.find(|c: char| c.is_ascii_alphabetic())?;
    let n: f64 = s[..split].parse().ok()?;
    let scale = match &s[split..] {
        "us" => 1e-3,
        "ms" => 1.0,
        "s" => 1e3,
        "m" => 60e3,
        "h" => 3600e3,
        _ => return None,
    };
    Some(n * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "Running 10s test @ http://127.0.0.1:8000/dispatcher
  1 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.10ms  235.42us   7.56ms   89.16%
    Req/Sec    58.44k     3.21k   62.51k    79.00%
  Latency Distribution
     50%  812.00us
     75%    1.16ms
     90%    1.32ms
     99%    1.92ms
  581556 requests in 10.00s, 47.14MB read
  Socket errors: connect 0, read 3, write 0, timeout 2
  Non-2xx or 3xx responses: 12
Requests/sec:  58153.15
Transfer/sec:      4.71MB
";

    #[test]
    fn parses_a_report() {
        let s = parse(SAMPLE).unwrap();
        assert_eq!(s.requests, 581_556);
        assert!((s.duration_s - 10.0).abs() < 1e-9);
        assert!((s.rps - 58_153.15).abs() < 1e-6);
        assert!((s.p50_ms.unwrap() - 0.812).abs() < 1e-9);
        assert!((s.p99_ms.unwrap() - 1.92).abs() < 1e-9);
        assert_eq!((s.socket_errors, s.non_2xx), (5, 12));
    }

    #[test]
    fn a_clean_run_without_latency_or_errors() {
        let text = "  1 threads and 8 connections\n  1200 requests in 1.01s, 100.00KB read\nRequests/sec:   1188.12\n";
        let s = parse(text).unwrap();
        assert_eq!(
            (s.requests, s.socket_errors, s.non_2xx, s.p99_ms),
            (1200, 0, 0, None)
        );
        assert!((s.duration_s - 1.01).abs() < 1e-9);
        assert!(parse("wrk: connection refused\n").is_err());
        assert!(parse("  10 requests in 1.00s\nRequests/sec: lots\n").is_err());
    }

    #[test]
    fn suffixes_and_units() {
        assert_eq!(number("58.44k"), Some(58_440.0));
        assert_eq!(number("1.2M"), Some(1_200_000.0));
        assert_eq!(number("3G"), Some(3e9));
        assert_eq!(number("52321.90"), Some(52_321.9));
        assert_eq!(number("k"), None);
        assert_eq!(number(""), None);
        assert_eq!(time_ms("235.42us"), Some(0.23542));
        assert_eq!(time_ms("1.92ms"), Some(1.92));
        assert_eq!(time_ms("2.00s"), Some(2000.0));
        assert_eq!(time_ms("1.50m"), Some(90_000.0));
        assert_eq!(time_ms("1.00h"), Some(3_600_000.0));
        assert_eq!(time_ms("12"), None);
        assert_eq!(time_ms("3parsecs"), None);
    }
}
