//! `GET /metrics` against the ecosystem's own tools: `promtool check
//! metrics` lints the exposition, and a real `prometheus` server scrapes a
//! real switchboard and answers a query through its HTTP API.
//!
//! Needs Debian's `prometheus` package (`promtool` and `prometheus`;
//! `apt-get install -y prometheus`, as `.ci/run` does). Without it these
//! tests fail and say so: they never skip.

mod common;

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{TestServer, request, settings};

fn tool(name: &str) -> String {
    let path = format!("/usr/bin/{name}");
    assert!(
        std::path::Path::new(&path).exists(),
        "{path} not found: install Debian's prometheus package (apt-get install -y prometheus); .ci/run does"
    );
    path
}

/// The value of the sample `line` starts with (name and labels), if any.
fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l[series.len()..].trim().parse().ok())
}

#[test]
fn metrics_are_typed_named_and_pass_promtool() {
    let srv = TestServer::start(settings());
    let mut plain = srv.open("m1");
    plain.line();
    let _sse = common::StreamClient::open_raw(
        srv.addr,
        "GET /test/m2 HTTP/1.1\r\nhost: t\r\naccept: text/event-stream\r\n\r\n",
    );
    assert_eq!(srv.post("/send/m1", "hello").status, 200);
    assert_eq!(plain.line(), "Recvd msg #1: 'hello'");
    // The client can read the message a moment before the writing worker
    // counts it written, and the SSE stream's welcome (unread here) may
    // still be on its way: wait for the books, as a scraper would see them
    // (two welcomes and the message).
    srv.wait_stats(Duration::from_secs(5), |s| {
        s["messages"]["written"] == 1 && s["chunks_sent"] == 3
    });
    let r = srv.admin_get("/metrics");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let body = r.text();
    assert_eq!(sample(&body, "switchboard_streams_active"), Some(2.0), "{body}");
    assert_eq!(
        sample(&body, "switchboard_streams_opened_total{transport=\"chunked\"}"),
        Some(1.0)
    );
    assert_eq!(
        sample(&body, "switchboard_streams_opened_total{transport=\"sse\"}"),
        Some(1.0)
    );
    assert_eq!(
        sample(&body, "switchboard_streams_opened_total{transport=\"ws\"}"),
        Some(0.0)
    );
    assert_eq!(sample(&body, "switchboard_messages_routed_total"), Some(1.0));
    assert_eq!(sample(&body, "switchboard_messages_written_total"), Some(1.0));
    assert!(body.contains("# TYPE switchboard_streams_active gauge"), "{body}");
    assert!(
        body.contains("# TYPE switchboard_messages_routed_total counter"),
        "{body}"
    );
    assert!(sample(&body, "switchboard_rss_bytes").unwrap() > 0.0);
    // What /stats says, /metrics says.
    let st = srv.stats();
    assert_eq!(
        sample(&body, "switchboard_chunks_sent_total"),
        st["chunks_sent"].as_f64(),
        "{st}"
    );

    // The histograms: the message was timed once (it reached one stream);
    // a stream's lifetime is observed when it ends.
    assert!(
        body.contains("# TYPE switchboard_message_latency_seconds histogram"),
        "{body}"
    );
    assert_eq!(
        sample(&body, "switchboard_message_latency_seconds_count"),
        Some(1.0)
    );
    assert_eq!(
        sample(&body, "switchboard_message_latency_seconds_bucket{le=\"+Inf\"}"),
        Some(1.0)
    );
    let inf: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("switchboard_message_latency_seconds_bucket"))
        .filter(|l| {
            !l.contains("le=\"0.")
                && !l.contains("le=\"1\"")
                && !l.contains("le=\"2.5\"")
                && !l.contains("le=\"5\"")
        })
        .collect();
    assert_eq!(
        inf,
        ["switchboard_message_latency_seconds_bucket{le=\"+Inf\"} 1"],
        "one bucket above the bounds: +Inf"
    );
    let took = sample(&body, "switchboard_message_latency_seconds_sum").unwrap();
    assert!(took > 0.0 && took < 1.0, "{took} s");
    assert_eq!(
        sample(&body, "switchboard_stream_lifetime_seconds_count"),
        Some(0.0)
    );
    drop(plain);
    srv.wait_stats(Duration::from_secs(5), |s| s["connections"]["closed"] == 1);
    let mut short = srv.open("m3");
    short.line();
    std::thread::sleep(Duration::from_millis(300));
    drop(short);
    let deadline = Instant::now() + Duration::from_secs(5);
    let ended = loop {
        let now = srv.admin_get("/metrics").text();
        if sample(&now, "switchboard_stream_lifetime_seconds_count") == Some(2.0) {
            break now;
        }
        assert!(Instant::now() < deadline, "no lifetime observed: {now}");
        std::thread::sleep(Duration::from_millis(20));
    };
    // Both lived a few hundred ms (on a loaded machine, seconds at most).
    let lived = sample(&ended, "switchboard_stream_lifetime_seconds_sum").unwrap();
    assert!((0.3..10.0).contains(&lived), "lived {lived} s");
    for le in ["10", "86400", "+Inf"] {
        let series = format!("switchboard_stream_lifetime_seconds_bucket{{le=\"{le}\"}}");
        assert_eq!(sample(&ended, &series), Some(2.0), "{ended}");
    }

    let mut lint = Command::new(tool("promtool"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    lint.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let out = lint.wait_with_output().unwrap();
    println!(
        "promtool check metrics on {} lines: {} {}{}",
        body.lines().count(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A `prometheus` process, stopped by PID, and its data directory.
struct Prometheus {
    child: Child,
    dir: std::path::PathBuf,
    port: u16,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn a_real_prometheus_scrapes_and_answers_a_query() {
    let srv = TestServer::start(settings());
    let mut s = srv.open("scraped");
    s.line();
    assert_eq!(srv.post("/send/scraped", "timed").status, 200);
    assert!(s.message().ends_with("'timed'"));
    let dir = std::env::temp_dir().join(format!("switchboard-prometheus-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
             scrape_configs: [{{job_name: switchboard, static_configs: [{{targets: ['{}']}}]}}]\n",
            // The internal listener: where /metrics is served.
            srv.admin
        ),
    )
    .unwrap();
    // Port 0: the kernel picks its port, and its one listening socket
    // (found by its pid) says which, so no other test can take it first.
    let log = dir.join("prometheus.log");
    let child = Command::new(tool("prometheus"))
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg("--web.listen-address=127.0.0.1:0")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start prometheus");
    let mut prom = Prometheus { child, dir, port: 0 };
    let deadline = Instant::now() + Duration::from_secs(30);
    while prom.port == 0 {
        let log = || std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            matches!(prom.child.try_wait(), Ok(None)),
            "prometheus exited:\n{}",
            log()
        );
        assert!(
            Instant::now() < deadline,
            "prometheus did not listen within 30 s:\n{}",
            log()
        );
        prom.port = common::listening_ports(prom.child.id())
            .first()
            .copied()
            .unwrap_or(0);
        std::thread::sleep(Duration::from_millis(50));
    }
    let ask = |query: &str| -> serde_json::Value {
        let path = format!("/api/v1/query?query={query}");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = request(([127, 0, 0, 1], prom.port).into(), "GET", &path, &[], b"")
                && r.status == 200
            {
                let v = r.json();
                if v["data"]["result"].as_array().is_some_and(|a| !a.is_empty()) {
                    println!("prometheus: {query} -> {v}");
                    return v;
                }
            }
            assert!(
                Instant::now() < deadline,
                "prometheus never had a sample of {query}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    };
    let answer = ask("switchboard_streams_active");
    assert_eq!(answer["status"], "success", "{answer}");
    let result = &answer["data"]["result"][0];
    assert_eq!(result["metric"]["job"], "switchboard", "{answer}");
    assert_eq!(result["value"][1], "1", "one stream held: {answer}");
    // The histogram, as Prometheus sees it: one message timed, under 1 s.
    let timed = ask("switchboard_message_latency_seconds_bucket%7Ble%3D%221%22%7D");
    assert_eq!(timed["data"]["result"][0]["value"][1], "1", "{timed}");
}
