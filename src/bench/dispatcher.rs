//! `bench dispatcher`: `GET /dispatcher` throughput, switchboard (its
//! Counter actor) against nginx answering a constant from its config. Both
//! servers run at once; wrk measures one then the other back to back, so
//! each pair shares the machine's state; the order flips every round.

use std::time::Duration;

use anyhow::bail;
use serde::{Deserialize, Serialize};

use super::outcome::{Outcome, Recorder};
use super::servers::{Server, ServerKind};
use super::table::{Table, fixed, opt, ratio, thousands, times, whole};
use super::wrk::{self, WrkStats};
use super::{Common, client};
use crate::units::parse_duration;

/// How the figures are computed, for the report.
pub const HOW: &str = "\
switchboard and nginx (the same nginx as the Nchan runs; `location = /dispatcher { return 200 \"1\"; }`) run \
side by side, 2 workers each. For every connection count and round, `wrk -t1 -cC -dD --latency` runs \
against one and then the other (the order flips every round), so each pair is measured back to back. \
**req/s** is wrk's `Requests/sec`, **p99** its 99% latency; **ratio** = switchboard req/s ÷ nginx req/s \
of the pair; per connection count, the ratio of the summed req/s. wrk runs on the same 2 cores as the \
server, as the original benchmarks did. Afterwards `GET /dispatcher` on switchboard must answer more than \
the requests wrk completed against it (the counter counts every request served, including the few still \
in flight when wrk stopped, at most one per connection per run).";

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
pub struct DispatcherData {
    /// One pair of wrk runs per (connections, round).
    pub pairs: Vec<Pair>,
    /// The Counter's plausibility check after all runs.
    pub counter: CounterCheck,
    /// Seconds per wrk run.
    pub duration_s: u64,
}

/// switchboard and nginx at the same connection count, back to back.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Pair {
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
}

/// Is switchboard's counter consistent with what wrk saw?
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CounterCheck {
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
    pub fn new(answer: u64, wrk_completed: u64, in_flight_bound: u64) -> Self {
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
pub fn run(args: &Args) -> anyhow::Result<()> {
    let c = &args.common;
    let duration = c.pick(args.duration, Duration::from_secs(10), Duration::from_secs(1));
    let connections = c.pick(args.connections.clone(), vec![64, 256], vec![16]);
    let rounds = c.pick(args.rounds, 2, 1);
    if duration < Duration::from_secs(1) || connections.contains(&0) || rounds == 0 {
        bail!("--duration must be at least 1s, --connections and --rounds at least 1");
    }
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
            let mut measure = |s: &Server| -> anyhow::Result<WrkStats> {
                let (stats, cmd) = wrk::run(&url(s), conns, duration)?;
                rec.tool(&cmd);
                println!(
                    "dispatcher: {:<11} c={conns:<4} round {round}: {} req/s, p99 {} ms",
                    if s.kind == ServerKind::Switchboard {
                        "switchboard"
                    } else {
                        "nginx"
                    },
                    whole(stats.rps),
                    opt(stats.p99_ms, |x| fixed(x, 2))
                );
                Ok(stats)
            };
            let (sb, ng) = if first == ServerKind::Switchboard {
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
    println!(
        "dispatcher: GET /dispatcher answered {} after wrk completed {} requests against it: {}",
        thousands(counter.answer),
        thousands(counter.wrk_completed),
        if counter.plausible {
            "plausible"
        } else {
            "NOT plausible"
        }
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
    });
    outcome.publish(&c.out, &render(&outcome))
}

/// Summed switchboard req/s ÷ summed nginx req/s per connection count.
pub fn ratios_by_connections(pairs: &[Pair]) -> Vec<(u32, Option<f64>)> {
    let mut conns: Vec<u32> = pairs.iter().map(|p| p.connections).collect();
    conns.dedup();
    conns
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

/// The tables: every pair, then the ratio per connection count, then the
/// counter check.
pub fn render(o: &Outcome<DispatcherData>) -> String {
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
        ]);
    }
    let mut out = t.render();
    let mut summary = Table::new(&[">connections", ">switchboard ÷ nginx (summed req/s)"]);
    for (c, r) in ratios_by_connections(&o.data.pairs) {
        summary.row(vec![c.to_string(), times(r)]);
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

    pub fn pair(connections: u32, round: u32, sb: f64, ng: f64) -> Pair {
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
        }
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
        });
        let text = render(&o);
        let rows = crate::bench::table::cells(&text);
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
                "0 / 0"
            ]
        );
        assert_eq!(rows[4][5], "n/a");
        assert_eq!(rows[8], ["256", "n/a"]);
        assert!(text.contains("answered 900,001 after wrk completed 900,000"));
        assert!(text.contains(": plausible."));
    }
}
