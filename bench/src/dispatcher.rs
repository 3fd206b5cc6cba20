//! `bench dispatcher`: `GET /dispatcher` throughput, switchboard (its
//! Counter actor) against nginx answering a constant from its config. Both
//! servers run at once; wrk measures one then the other back to back, so
//! each pair shares the machine's state; the order flips every round.

use std::time::Duration;

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};

use super::outcome::{Outcome, Recorder};
use super::servers::{Server, ServerKind};
use super::table::{Table, fixed, opt, ratio, thousands, times, whole};
use super::wrk::{self, WrkStats};
use super::{Common, client, procfs};
use switchboard_tools::cli::parse_duration;

/// How the figures are computed, for the report.
pub(crate) const HOW: &str = "\
switchboard and nginx (the same nginx as the Nchan runs; `location = /dispatcher { return 200 \"1\"; }`) run \
side by side, 2 workers each. For every connection count and round, `wrk -t1 -cC -dD --latency` runs \
against one and then the other (the order flips every round), so each pair is measured back to back. \
**req/s** is wrk's `Requests/sec`, **p99** its 99% latency; **ratio** = switchboard req/s ÷ nginx req/s \
of the pair; per connection count, the ratio of the summed req/s. wrk runs on the same 2 cores as the \
server, as the original benchmarks did. Afterwards `GET /dispatcher` on switchboard must answer more than \
the requests wrk completed against it (the counter counts every request served, including the few still \
in flight when wrk stopped, at most one per connection per run). \
**µs/req** is the measured server's CPU time per request, less dependent than req/s on how the 2 cores \
happen to be shared with wrk: right before and right after each wrk run the harness reads \
utime and stime from `/proc/PID/stat` of the server's processes (switchboard: its one process; nginx: \
master and workers) and sums them; µs/req = (user + system CPU seconds in between × 10⁶) ÷ the requests \
wrk completed, shown as total (user+system). On loopback the system time includes the kernel's TCP work \
for the receiving end of the server's writes. `/proc` counts CPU time in 10 ms ticks, so each process's \
figure is ±10 ms ÷ requests (±0.02 µs at 500,000 requests). Per connection count, **CPU/request \
switchboard ÷ nginx** = (Σ switchboard CPU ÷ Σ its requests) ÷ (Σ nginx CPU ÷ Σ its requests) over the \
rounds; lower is better.";

/// `bench dispatcher` options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Options every benchmark takes.
    #[command(flatten)]
    pub common: Common,
    /// Length of each wrk run, whole seconds [default: 10s; --smoke: 1s].
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// wrk connection counts, comma-separated [default: 64,256; --smoke: 16].
    #[arg(long, value_delimiter = ',', value_name = "C,...")]
    pub connections: Option<Vec<u32>>,
    /// Pairs of runs per connection count [default: 2; --smoke: 1].
    #[arg(long)]
    pub rounds: Option<u32>,
}

/// What `bench dispatcher` measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct DispatcherData {
    /// One pair of wrk runs per (connections, round).
    pub pairs: Vec<Pair>,
    /// The Counter's plausibility check after all runs.
    pub counter: CounterCheck,
    /// Seconds per wrk run.
    pub duration_s: u64,
    /// Units of the CPU times read from `/proc` (0 in results from before
    /// CPU time was measured).
    #[serde(default)]
    pub clock_ticks_per_sec: u64,
}

/// switchboard and nginx at the same connection count, back to back.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Pair {
    /// wrk connections.
    pub connections: u32,
    /// Round number, from 1.
    pub round: u32,
    /// Which ran first.
    pub first: ServerKind,
    /// wrk against switchboard.
    pub switchboard: WrkStats,
    /// wrk against nginx.
    pub nginx: WrkStats,
    /// switchboard req/s ÷ nginx req/s.
    pub ratio: Option<f64>,
    /// switchboard's CPU time during its wrk run (absent in older results).
    #[serde(default)]
    pub switchboard_cpu: Option<RunCpu>,
    /// nginx's CPU time (master and workers) during its wrk run.
    #[serde(default)]
    pub nginx_cpu: Option<RunCpu>,
}

/// A server's CPU time during one wrk run, from `/proc/PID/stat` summed over
/// its processes.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct RunCpu {
    /// User-mode CPU seconds.
    pub cpu_user_s: f64,
    /// Kernel-mode CPU seconds.
    pub cpu_sys_s: f64,
    /// (cpu_user_s + cpu_sys_s) × 10⁶ ÷ requests wrk completed.
    pub us_per_request: Option<f64>,
    /// cpu_user_s × 10⁶ ÷ requests.
    pub user_us_per_request: Option<f64>,
    /// cpu_sys_s × 10⁶ ÷ requests.
    pub sys_us_per_request: Option<f64>,
}

impl RunCpu {
    /// From `(utime, stime)` tick sums before and after a run that completed
    /// `requests` requests.
    pub(crate) fn new(before: (u64, u64), after: (u64, u64), ticks_per_sec: u64, requests: u64) -> Self {
        let secs = |b: u64, a: u64| a.saturating_sub(b) as f64 / ticks_per_sec.max(1) as f64;
        Self::from_secs(secs(before.0, after.0), secs(before.1, after.1), requests)
    }

    /// From CPU seconds spent serving `requests` requests.
    pub(crate) fn from_secs(cpu_user_s: f64, cpu_sys_s: f64, requests: u64) -> Self {
        let per = |s: f64| ratio(s * 1e6, requests as f64);
        RunCpu {
            cpu_user_s,
            cpu_sys_s,
            us_per_request: per(cpu_user_s + cpu_sys_s),
            user_us_per_request: per(cpu_user_s),
            sys_us_per_request: per(cpu_sys_s),
        }
    }
}

/// `12.3 (4.5+7.8)`: µs/request, user + system; `n/a` when not measured.
pub(crate) fn us_cell(cpu: Option<&RunCpu>) -> String {
    let Some(c) = cpu else { return "n/a".into() };
    match (c.us_per_request, c.user_us_per_request, c.sys_us_per_request) {
        (Some(t), Some(u), Some(s)) => format!("{} ({}+{})", fixed(t, 1), fixed(u, 1), fixed(s, 1)),
        _ => "n/a".into(),
    }
}

/// Is switchboard's counter consistent with what wrk saw?
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct CounterCheck {
    /// What `GET /dispatcher` answered after the runs (it counts itself).
    pub answer: u64,
    /// Requests the counter served before that: answer − 1.
    pub served: u64,
    /// Requests wrk completed against switchboard, all runs.
    pub wrk_completed: u64,
    /// Requests wrk may have had in flight when its runs stopped (Σ connections).
    pub in_flight_bound: u64,
    /// wrk_completed ≤ served ≤ wrk_completed + in_flight_bound.
    pub plausible: bool,
}

impl CounterCheck {
    /// Checks a counter answer against wrk's totals.
    pub(crate) fn new(answer: u64, wrk_completed: u64, in_flight_bound: u64) -> Self {
        let served = answer.saturating_sub(1);
        CounterCheck {
            answer,
            served,
            wrk_completed,
            in_flight_bound,
            plausible: served >= wrk_completed && served <= wrk_completed + in_flight_bound,
        }
    }
}

/// Runs `bench dispatcher`.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let c = &args.common;
    let duration = c.pick(args.duration, Duration::from_secs(10), Duration::from_secs(1));
    let connections = c.pick(args.connections.clone(), vec![64, 256], vec![16]);
    let rounds = c.pick(args.rounds, 2, 1);
    if duration < Duration::from_secs(1) || connections.contains(&0) || rounds == 0 {
        bail!("--duration must be at least 1s, --connections and --rounds at least 1");
    }
    let ticks_per_sec = procfs::clock_ticks_per_sec();
    let mut rec = Recorder::new("dispatcher", c.smoke);
    let switchboard = Server::start(ServerKind::Switchboard)?;
    rec.tool(&switchboard.command);
    let nginx = Server::start(ServerKind::Nchan)?;
    rec.tool(&nginx.command);
    let url = |s: &Server| s.url("/dispatcher");

    let mut pairs = Vec::new();
    for &conns in &connections {
        for round in 1..=rounds {
            let first = if round % 2 == 1 {
                ServerKind::Switchboard
            } else {
                ServerKind::Nchan
            };
            let mut measure = |s: &Server| -> anyhow::Result<(WrkStats, RunCpu)> {
                let name = if s.kind == ServerKind::Switchboard {
                    "switchboard"
                } else {
                    "nginx"
                };
                let pids = s.pids();
                let before = procfs::cpu_ticks(&pids).with_context(|| format!("{name}'s CPU time"))?;
                let (stats, cmd) = wrk::run(&url(s), conns, duration)?;
                let after = procfs::cpu_ticks(&pids)
                    .with_context(|| format!("{name}'s CPU time after wrk (did a process exit?)"))?;
                let cpu = RunCpu::new(before, after, ticks_per_sec, stats.requests);
                rec.tool(&cmd);
                println!(
                    "dispatcher: {name:<11} c={conns:<4} round {round}: {} req/s, p99 {} ms, {} µs/req (user+sys)",
                    whole(stats.rps),
                    opt(stats.p99_ms, |x| fixed(x, 2)),
                    us_cell(Some(&cpu))
                );
                Ok((stats, cpu))
            };
            let ((sb, sb_cpu), (ng, ng_cpu)) = if first == ServerKind::Switchboard {
                let sb = measure(&switchboard)?;
                (sb, measure(&nginx)?)
            } else {
                let ng = measure(&nginx)?;
                (measure(&switchboard)?, ng)
            };
            pairs.push(Pair {
                connections: conns,
                round,
                first,
                ratio: ratio(sb.rps, ng.rps),
                switchboard: sb,
                nginx: ng,
                switchboard_cpu: Some(sb_cpu),
                nginx_cpu: Some(ng_cpu),
            });
        }
    }

    let reply = client::request(switchboard.addr(), "GET", "/dispatcher", "")?;
    let answer: u64 = reply.body.trim().parse().unwrap_or(0);
    let counter = CounterCheck::new(
        answer,
        pairs.iter().map(|p| p.switchboard.requests).sum(),
        pairs.iter().map(|p| u64::from(p.connections)).sum(),
    );
    for s in [switchboard, nginx] {
        if let Some(note) = s.stop() {
            rec.note(note);
        }
    }
    if !counter.plausible {
        rec.note(format!(
            "switchboard's counter answered {} but wrk completed {} requests (+ at most {} in flight)",
            counter.answer, counter.wrk_completed, counter.in_flight_bound
        ));
    }
    let outcome = rec.finish(DispatcherData {
        pairs,
        counter,
        duration_s: duration.as_secs().max(1),
        clock_ticks_per_sec: ticks_per_sec,
    });
    outcome.publish(&c.out, &render(&outcome))
}

/// The distinct connection counts of `pairs`, ascending.
fn connection_counts(pairs: &[Pair]) -> Vec<u32> {
    let mut conns: Vec<u32> = pairs.iter().map(|p| p.connections).collect();
    conns.sort_unstable();
    conns.dedup();
    conns
}

/// Summed switchboard req/s ÷ summed nginx req/s per connection count.
pub(crate) fn ratios_by_connections(pairs: &[Pair]) -> Vec<(u32, Option<f64>)> {
    connection_counts(pairs)
        .into_iter()
        .map(|c| {
            let (sb, ng) = pairs
                .iter()
                .filter(|p| p.connections == c)
                .fold((0.0, 0.0), |(a, b), p| (a + p.switchboard.rps, b + p.nginx.rps));
            (c, ratio(sb, ng))
        })
        .collect()
}

/// One server's CPU per request over several runs: Σ CPU ÷ Σ requests
/// (`None` if any run lacks its CPU time or no request completed).
pub(crate) fn summed_cpu<'a>(
    runs: impl IntoIterator<Item = (&'a WrkStats, Option<&'a RunCpu>)>,
) -> Option<RunCpu> {
    let (user, sys, requests) = runs.into_iter().try_fold((0.0, 0.0, 0), |(u, s, n), (w, c)| {
        let c = c?;
        Some((u + c.cpu_user_s, s + c.cpu_sys_s, n + w.requests))
    })?;
    let sum = RunCpu::from_secs(user, sys, requests);
    sum.us_per_request.is_some().then_some(sum)
}

/// Both servers' CPU per request at one connection count, over its rounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct CpuAt {
    /// wrk connections.
    pub connections: u32,
    /// switchboard's summed CPU time and requests.
    pub switchboard: Option<RunCpu>,
    /// nginx's.
    pub nginx: Option<RunCpu>,
    /// switchboard µs/request ÷ nginx µs/request (lower is better).
    pub ratio: Option<f64>,
}

/// Per connection count: switchboard's and nginx's CPU per request summed
/// over the rounds, and switchboard ÷ nginx (lower is better).
pub(crate) fn cpu_by_connections(pairs: &[Pair]) -> Vec<CpuAt> {
    connection_counts(pairs)
        .into_iter()
        .map(|c| {
            let of = || pairs.iter().filter(move |p| p.connections == c);
            let sb = summed_cpu(of().map(|p| (&p.switchboard, p.switchboard_cpu.as_ref())));
            let ng = summed_cpu(of().map(|p| (&p.nginx, p.nginx_cpu.as_ref())));
            let r = sb
                .and_then(|s| s.us_per_request)
                .zip(ng.and_then(|n| n.us_per_request))
                .and_then(|(s, n)| ratio(s, n));
            CpuAt {
                connections: c,
                switchboard: sb,
                nginx: ng,
                ratio: r,
            }
        })
        .collect()
}

/// The tables: every pair, then the ratio per connection count, then the
/// counter check.
pub(crate) fn render(o: &Outcome<DispatcherData>) -> String {
    let mut t = Table::new(&[
        ">connections",
        ">round",
        "first",
        ">switchboard req/s",
        ">nginx req/s",
        ">ratio",
        ">switchboard p99 ms",
        ">nginx p99 ms",
        ">errors (sb / nginx)",
        ">sb µs/req (user+sys)",
        ">nginx µs/req (user+sys)",
    ]);
    let errors = |w: &WrkStats| w.socket_errors + w.non_2xx;
    for p in &o.data.pairs {
        t.row(vec![
            p.connections.to_string(),
            p.round.to_string(),
            if p.first == ServerKind::Switchboard {
                "switchboard"
            } else {
                "nginx"
            }
            .into(),
            whole(p.switchboard.rps),
            whole(p.nginx.rps),
            times(p.ratio),
            opt(p.switchboard.p99_ms, |x| fixed(x, 2)),
            opt(p.nginx.p99_ms, |x| fixed(x, 2)),
            format!("{} / {}", errors(&p.switchboard), errors(&p.nginx)),
            us_cell(p.switchboard_cpu.as_ref()),
            us_cell(p.nginx_cpu.as_ref()),
        ]);
    }
    let mut out = t.render();
    let mut summary = Table::new(&[
        ">connections",
        ">switchboard ÷ nginx (summed req/s)",
        ">sb µs/req (user+sys)",
        ">nginx µs/req (user+sys)",
        ">CPU/request sb ÷ nginx (lower is better)",
    ]);
    let cpu = cpu_by_connections(&o.data.pairs);
    for ((c, r), at) in ratios_by_connections(&o.data.pairs).into_iter().zip(&cpu) {
        summary.row(vec![
            c.to_string(),
            times(r),
            us_cell(at.switchboard.as_ref()),
            us_cell(at.nginx.as_ref()),
            times(at.ratio),
        ]);
    }
    out += "\n";
    out += &summary.render();
    let k = &o.data.counter;
    out += &format!(
        "\nCounter check: `GET /dispatcher` answered {} after wrk completed {} requests against switchboard \
         (at most {} more in flight): {}.\n",
        thousands(k.answer),
        thousands(k.wrk_completed),
        thousands(k.in_flight_bound),
        if k.plausible {
            "plausible"
        } else {
            "**not plausible**"
        }
    );
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A pair where switchboard spends 10 µs per request (4 user + 6
    /// system) and nginx 12.5 µs (5 + 7.5).
    pub(crate) fn pair(connections: u32, round: u32, sb: f64, ng: f64) -> Pair {
        let w = |rps: f64| WrkStats {
            requests: (rps * 10.0) as u64,
            duration_s: 10.0,
            rps,
            p50_ms: Some(0.5),
            p99_ms: Some(2.0),
            socket_errors: 0,
            non_2xx: 0,
        };
        Pair {
            connections,
            round,
            first: ServerKind::Switchboard,
            switchboard: w(sb),
            nginx: w(ng),
            ratio: ratio(sb, ng),
            switchboard_cpu: Some(cpu(w(sb).requests, 4.0, 6.0)),
            nginx_cpu: Some(cpu(w(ng).requests, 5.0, 7.5)),
        }
    }

    /// CPU time of `requests` requests at `user` + `sys` µs each.
    fn cpu(requests: u64, user: f64, sys: f64) -> RunCpu {
        let n = requests as f64;
        RunCpu::from_secs(n * user / 1e6, n * sys / 1e6, requests)
    }

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-9)
    }

    #[test]
    fn cpu_per_request_from_ticks() {
        // 250 user and 100 system ticks at 100/s over 500,000 requests.
        let c = RunCpu::new((100, 50), (350, 150), 100, 500_000);
        assert_eq!((c.cpu_user_s, c.cpu_sys_s), (2.5, 1.0));
        assert_eq!(c.us_per_request, Some(7.0));
        assert_eq!(c.user_us_per_request, Some(5.0));
        assert_eq!(c.sys_us_per_request, Some(2.0));
        assert_eq!(us_cell(Some(&c)), "7.0 (5.0+2.0)");
        // Another tick rate; a counter that went backwards counts nothing.
        let c = RunCpu::new((0, 90), (1000, 10), 1000, 1000);
        assert_eq!((c.cpu_user_s, c.cpu_sys_s), (1.0, 0.0));
        assert_eq!(c.us_per_request, Some(1000.0));
        // No completed requests: no per-request figure.
        let none = RunCpu::new((0, 0), (10, 10), 100, 0);
        assert_eq!((none.us_per_request, none.sys_us_per_request), (None, None));
        assert_eq!(us_cell(Some(&none)), "n/a");
        assert_eq!(us_cell(None), "n/a");
    }

    #[test]
    fn cpu_sums_before_dividing() {
        let w = |requests| WrkStats {
            requests,
            ..WrkStats::default()
        };
        let (a, b) = (w(100_000), w(300_000));
        // 1 s over 100,000 (10 µs) and 1 s over 300,000 (3.3 µs): 2 s over
        // 400,000 = 5 µs, not the mean of the two (6.7 µs).
        let (ca, cb) = (
            RunCpu::from_secs(0.4, 0.6, 100_000),
            RunCpu::from_secs(0.25, 0.75, 300_000),
        );
        let sum = summed_cpu([(&a, Some(&ca)), (&b, Some(&cb))]).unwrap();
        assert!(close(Some(sum.cpu_user_s), 0.65) && close(Some(sum.cpu_sys_s), 1.35));
        assert!(close(sum.us_per_request, 5.0));
        assert!(close(sum.user_us_per_request, 1.625));
        assert!(close(sum.sys_us_per_request, 3.375));
        // A run without CPU time (an older result) or no requests at all: none.
        assert_eq!(summed_cpu([(&a, Some(&ca)), (&b, None)]), None);
        assert_eq!(summed_cpu([(&w(0), Some(&ca))]), None);
    }

    #[test]
    fn cpu_ratio_per_connection_count() {
        let mut pairs = vec![
            pair(64, 1, 50_000.0, 40_000.0),
            pair(64, 2, 30_000.0, 40_000.0),
            pair(256, 1, 10_000.0, 20_000.0),
        ];
        // 64: 10 µs against 12.5 µs in both rounds.
        let by = cpu_by_connections(&pairs);
        assert_eq!(by.len(), 2);
        assert_eq!(by[0].connections, 64);
        assert!(close(by[0].switchboard.and_then(|c| c.us_per_request), 10.0));
        assert!(close(by[0].nginx.and_then(|c| c.us_per_request), 12.5));
        assert!(close(by[0].ratio, 0.8));
        // 256: nginx at 5 µs/request instead (1 s over 200,000 requests): 10 ÷ 5.
        pairs[2].nginx_cpu = Some(RunCpu::from_secs(0.5, 0.5, 200_000));
        let by = cpu_by_connections(&pairs);
        assert!(close(by[1].ratio, 2.0));
        // Round 2 at 64 without CPU time: no figure for 64, 256 unaffected.
        pairs[1].switchboard_cpu = None;
        let by = cpu_by_connections(&pairs);
        assert_eq!((by[0].switchboard, by[0].ratio), (None, None));
        assert!(by[0].nginx.is_some());
        assert!(close(by[1].ratio, 2.0));
    }

    #[test]
    fn results_from_before_cpu_time_still_read_and_render() {
        let old = r#"{"pairs":[{"connections":64,"round":1,"first":"switchboard",
            "switchboard":{"requests":490878,"duration_s":10.01,"rps":49037.48,"p50_ms":0.69,
              "p99_ms":5.62,"socket_errors":0,"non_2xx":0},
            "nginx":{"requests":500000,"duration_s":10.0,"rps":50000.0,"p50_ms":0.6,
              "p99_ms":4.0,"socket_errors":0,"non_2xx":0},
            "ratio":0.98}],
          "counter":{"answer":490900,"served":490899,"wrk_completed":490878,"in_flight_bound":64,
            "plausible":true},
          "duration_s":10}"#;
        let data: DispatcherData = serde_json::from_str(old).unwrap();
        assert_eq!(data.clock_ticks_per_sec, 0);
        assert_eq!(
            (data.pairs[0].switchboard_cpu, data.pairs[0].nginx_cpu),
            (None, None)
        );
        let text = render(&Recorder::new("dispatcher", false).finish(data));
        let rows = crate::table::cells(&text);
        assert_eq!(rows[2][9..], ["n/a", "n/a"]);
        assert_eq!(rows[5], ["64", "0.98×", "n/a", "n/a", "n/a"]);
        // And the new fields go out and come back.
        let p = pair(64, 1, 50_000.0, 40_000.0);
        let back: Pair = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn counter_check() {
        assert!(CounterCheck::new(1001, 1000, 64).plausible);
        assert!(CounterCheck::new(1065, 1000, 64).plausible);
        assert!(!CounterCheck::new(1066, 1000, 64).plausible);
        let low = CounterCheck::new(900, 1000, 64);
        assert_eq!((low.served, low.plausible), (899, false));
        assert!(!CounterCheck::new(0, 1, 64).plausible);
    }

    #[test]
    fn a_connection_count_given_twice_is_one_group() {
        // `--connections 64,256,64`: the 64 runs are not adjacent.
        let pairs = [
            pair(64, 1, 40_000.0, 40_000.0),
            pair(256, 1, 10_000.0, 20_000.0),
            pair(64, 1, 20_000.0, 40_000.0),
        ];
        assert_eq!(
            ratios_by_connections(&pairs),
            vec![(64, Some(0.75)), (256, Some(0.5))]
        );
    }

    #[test]
    fn ratios_sum_each_connection_count() {
        let pairs = [
            pair(64, 1, 50_000.0, 40_000.0),
            pair(64, 2, 30_000.0, 40_000.0),
            pair(256, 1, 10_000.0, 0.0),
        ];
        assert_eq!(ratios_by_connections(&pairs), vec![(64, Some(1.0)), (256, None)]);
        let o = Recorder::new("dispatcher", false).finish(DispatcherData {
            pairs: pairs.to_vec(),
            counter: CounterCheck::new(900_001, 900_000, 384),
            duration_s: 10,
            clock_ticks_per_sec: 100,
        });
        let text = render(&o);
        let rows = crate::table::cells(&text);
        assert_eq!(
            rows[2],
            [
                "64",
                "1",
                "switchboard",
                "50,000",
                "40,000",
                "1.25×",
                "2.00",
                "2.00",
                "0 / 0",
                "10.0 (4.0+6.0)",
                "12.5 (5.0+7.5)"
            ]
        );
        assert_eq!(rows[4][5], "n/a");
        assert_eq!(
            rows[7],
            ["64", "1.00×", "10.0 (4.0+6.0)", "12.5 (5.0+7.5)", "0.80×"]
        );
        // nginx completed no requests at 256: no CPU per request, no ratio.
        assert_eq!(rows[8], ["256", "n/a", "10.0 (4.0+6.0)", "n/a", "n/a"]);
        assert!(text.contains("answered 900,001 after wrk completed 900,000"));
        assert!(text.contains(": plausible."));
    }
}
