//! The floodtest binary as a real process against a real server.

// The server crate's test helpers: a real server in this process on a free
// port, and a small HTTP/1.1 client (shared, not copied).
#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{TestServer, settings};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_floodtest");

/// Runs floodtest to the end.
fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

/// Runs floodtest with `--json`; returns its output and the summary.
fn flood(args: &[&str]) -> (Output, Option<Value>) {
    let json = std::env::temp_dir().join(format!(
        "floodtest-{}-{:?}.json",
        std::process::id(),
        Instant::now()
    ));
    let json_arg = json.to_str().unwrap();
    let out = run(&[args, &["--json", json_arg]].concat());
    let summary = std::fs::read(&json)
        .ok()
        .map(|b| serde_json::from_slice(&b).unwrap());
    let _ = std::fs::remove_file(&json);
    (out, summary)
}

#[test]
fn holds_streams_counts_chunks_and_measures_message_latency() {
    let mut s = settings();
    s.stream.tick_interval_ms = 100;
    // floodtest reads /stats on the streams' own port unless told where.
    s.server.admin_public = true;
    let srv = TestServer::start(s);
    let url = format!("http://{}/test/f{{n}}", srv.addr);
    let (out, summary) = flood(&[
        "--url",
        &url,
        "--count",
        "200",
        "--rate",
        "1000",
        "--duration",
        "3s",
        "--interval",
        "1s",
        "--msg-rate",
        "50",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("Stats: {200, 0, "), "{stdout}");
    let j = summary.unwrap();
    assert_eq!(j["active"], 200, "{j}");
    assert_eq!(j["closed"], 0);
    assert_eq!(j["errors"], serde_json::json!({}));
    // Welcome + ~25 ticks each over ~2.8 s held; allow for slow machines.
    assert!(j["chunks"].as_u64().unwrap() >= 200 * 10, "{j}");
    let sent = j["messages"]["sent"].as_u64().unwrap();
    assert!(sent >= 50, "{j}");
    assert_eq!(j["messages"]["received"], sent, "every message delivered: {j}");
    assert_eq!(j["messages"]["lost"], 0);
    assert!(j["latency_ms"]["p99"].as_f64().unwrap() > 0.0);
    assert!(j["server_bytes_per_connection"].as_u64().is_some(), "{j}");
    assert!(j["client_bytes_per_connection"].as_u64().is_some(), "{j}");
    // The timeline charges each message to the second it was sent: its
    // rows add up to the totals, and every arrival is in a latency bucket.
    let rows = j["timeline"]["seconds"].as_array().expect("timeline");
    let col = |i: usize| rows.iter().map(|r| r[i].as_u64().unwrap()).sum::<u64>();
    assert_eq!(col(1), sent, "{j}");
    assert_eq!(col(2), sent, "{j}");
    let bucketed: u64 = rows
        .iter()
        .flat_map(|r| r[3].as_array().unwrap())
        .map(|c| c.as_u64().unwrap())
        .sum();
    assert_eq!(bucketed, sent, "{j}");
    assert_eq!(j["timeline"]["bounds_ms"][5], 50.0, "{j}");
    // The server agrees: every message routed was delivered.
    let stats = srv.stats();
    assert_eq!(stats["messages"]["delivered"].as_u64().unwrap(), sent);
}

/// `--tick-interval` measures how late each tick arrives against the
/// stream's schedule (welcome + k × interval), across child processes too.
#[test]
fn measures_tick_lag_against_the_schedule() {
    let mut s = settings();
    s.stream.tick_interval_ms = 300;
    let srv = TestServer::start(s);
    let url = format!("http://{}/test/t{{n}}", srv.addr);
    let (out, summary) = flood(&[
        "--url",
        &url,
        "--count",
        "100",
        "--rate",
        "1000",
        "--duration",
        "2s",
        "--interval",
        "1s",
        "--tick-interval",
        "300ms",
        "--max-per-process",
        "50",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let j = summary.expect("summary");
    // 100 streams, about 5 ticks each in 2 s (the first at ~300 ms).
    let ticks = j["ticks"].as_u64().unwrap();
    assert!((300..=700).contains(&ticks), "{ticks} ticks: {j}");
    let p99 = j["tick_lag_ms"]["p99"].as_f64().unwrap();
    // The server's wheel has ~10 ms slots: lag is tens of ms, not a period.
    assert!(p99 < 150.0, "tick lag p99 {p99} ms: {j}");
    assert!(stdout.contains(&format!("ticks {ticks} lag ms: ")), "{stdout}");
    // Every tick is in the timeline, in the second it was due, from both
    // child processes.
    let rows = j["timeline"]["seconds"].as_array().expect("timeline");
    let in_timeline: u64 = rows
        .iter()
        .flat_map(|r| r[4].as_array().unwrap())
        .map(|c| c.as_u64().unwrap())
        .sum();
    assert_eq!(in_timeline, ticks, "{j}");
    // Without the flag nothing is measured.
    let (_, plain) = flood(&["--url", &url, "--count", "10", "--duration", "1s"]);
    assert!(plain.unwrap()["tick_lag_ms"].is_null());
}

/// A broadcast probe (`B@<send time>`) is counted on every stream as a
/// broadcast with its arrival time, not as a routed message.
#[test]
fn times_a_broadcast_probe_on_every_stream() {
    let srv = TestServer::start(settings());
    let url = format!("http://{}/test/b{{n}}", srv.addr);
    let json = std::env::temp_dir().join(format!("floodtest-bc-{}.json", std::process::id()));
    let child = Command::new(BIN)
        .args([
            "--url",
            &url,
            "--count",
            "50",
            "--duration",
            "2s",
            "--interval",
            "1s",
        ])
        .arg("--json")
        .arg(&json)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Sent while floodtest holds the streams (it opens them in ~50 ms).
    let sender = std::thread::spawn({
        let addr = srv.addr;
        move || {
            std::thread::sleep(Duration::from_millis(800));
            let stamp = format!("B@{}", switchboard_tools::flood::now_micros());
            common::request(addr, "POST", "/broadcast", &[], stamp.as_bytes())
                .unwrap()
                .json()
        }
    });
    let answer = sender.join().unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(answer["delivered"], 50, "{answer}");
    let j: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    assert!(out.status.success());
    assert_eq!(j["broadcast"]["received"], 50, "{j}");
    assert!(j["broadcast"]["last_ms"].as_f64().unwrap() < 1000.0, "{j}");
    assert_eq!(j["messages"]["received"], 0, "{j}");
}

#[test]
fn churns_streams_without_losing_messages() {
    let srv = TestServer::start(settings());
    let url = format!("http://{}/test/ch{{n}}", srv.addr);
    let (out, summary) = flood(&[
        "--url",
        &url,
        "--count",
        "100",
        "--rate",
        "1000",
        "--duration",
        "5s",
        "--interval",
        "1s",
        "--lifetime",
        "1s",
        "--msg-rate",
        "100",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = summary.unwrap();
    // Each stream lives 0.5-1.5 s plus a 1 s drain: ~2 lives each in 5 s.
    let churned = j["churned"].as_u64().unwrap();
    assert!(churned >= 100, "{j}");
    assert_eq!(
        j["established"].as_u64().unwrap(),
        churned + j["active"].as_u64().unwrap(),
        "{j}"
    );
    assert_eq!(j["closed"], 0, "{j}");
    let sent = j["messages"]["sent"].as_u64().unwrap();
    assert!(sent >= 200, "{j}");
    assert_eq!(j["messages"]["lost"], 0, "{j}");
    // The server saw every churned stream go.
    let stats = srv.wait_stats(std::time::Duration::from_secs(3), |s| {
        s["connections"]["active"] == 0
    });
    assert_eq!(stats["connections"]["active"], 0, "{stats}");
    // Every stream floodtest counted, the server opened. The server may have
    // opened a few more: a stream reopening as the run ends is admitted
    // while floodtest, stopping, never reads its response head (seen once
    // on a loaded CI machine: 302 against 301).
    let opened = stats["connections"]["opened"].as_u64().unwrap();
    let established = j["established"].as_u64().unwrap();
    assert!(
        (established..=established + 5).contains(&opened),
        "server opened {opened}, floodtest established {established}"
    );
}

#[test]
fn reports_the_fleet_from_the_cluster_endpoint() {
    // A single-process server answers /cluster too: one node (this test
    // process, where the server runs) holding every stream. On the
    // streams' port, as the default /stats below.
    let mut s = settings();
    s.server.admin_public = true;
    let srv = TestServer::start(s);
    let url = format!("http://{}/test/k{{n}}", srv.addr);
    let stats_url = format!("http://{}/cluster", srv.addr);
    let args = [
        "--url",
        &url,
        "--count",
        "30",
        "--rate",
        "1000",
        "--duration",
        "2s",
        "--interval",
        "500ms",
        "--stats-url",
        &stats_url,
    ];
    let (out, summary) = flood(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pid = std::process::id();
    // Every interval and the closing lines name the fleet.
    assert!(stdout.contains("  cluster (single, from "), "{stdout}");
    assert!(stdout.contains(": 1 node, 30 streams; per node: "), "{stdout}");
    assert!(stdout.contains(&format!(" (pid {pid}) 30")), "{stdout}");
    let j = summary.unwrap();
    assert_eq!(j["active"], 30, "{j}");
    let c = &j["cluster"];
    assert_eq!(c["mode"], "single", "{j}");
    assert_eq!(c["totals"]["nodes"], 1, "{j}");
    assert_eq!(c["totals"]["streams"], 30, "{j}");
    assert_eq!(c["nodes"].as_array().map(Vec::len), Some(1), "{j}");
    assert_eq!(c["nodes"][0]["pid"], pid, "{j}");
    assert_eq!(c["nodes"][0]["streams"], 30, "{j}");
    assert_eq!(c["nodes"][0]["name"], c["node"], "{j}");
    assert_eq!(j["server_error"], Value::Null, "{j}");
    // /cluster has no memory figures.
    assert_eq!(j["server_bytes_per_connection"], Value::Null, "{j}");

    // Split over child processes, the parent still reads the fleet (once
    // the first run's streams are gone, so it counts only its own).
    let idle = |s: &Value| s["connections"]["active"] == 0;
    assert!(idle(&srv.wait_stats(Duration::from_secs(5), idle)));
    let (out, summary) = flood(&[&args[..], &["--max-per-process", "10"]].concat());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("30 streams over 3 processes"), "{stdout}");
    let j = summary.unwrap();
    assert_eq!(j["cluster"]["totals"]["streams"], 30, "{j}");
    // The default stays /stats: bytes per connection, no fleet.
    assert!(idle(&srv.wait_stats(Duration::from_secs(5), idle)));
    let (_, summary) = flood(&args[..10]);
    let j = summary.unwrap();
    assert_eq!(j["cluster"], Value::Null, "{j}");
    assert!(j["server_bytes_per_connection"].as_u64().is_some(), "{j}");
}

#[test]
fn splits_over_processes_past_the_per_process_cap() {
    let srv = TestServer::start(settings());
    let url = format!("http://{}/test/m{{n}}", srv.addr);
    let (out, summary) = flood(&[
        "--url",
        &url,
        "--count",
        "150",
        "--rate",
        "1000",
        "--duration",
        "2s",
        "--interval",
        "500ms",
        "--max-per-process",
        "60",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("150 streams over 3 processes"), "{stdout}");
    let j = summary.unwrap();
    assert_eq!(j["processes"], 3);
    assert_eq!(j["active"], 150, "{j}");
    assert_eq!(j["closed"], 0);
    assert!(
        j["chunks"].as_u64().unwrap() >= 150,
        "every stream got its welcome: {j}"
    );
    // Distinct ids across processes: the server saw 150 streams.
    assert_eq!(srv.stats()["connections"]["opened"], 150);
}

#[test]
fn spreads_over_server_ports_and_source_addresses() {
    let srv = TestServer::start_on_ports(settings(), 2);
    let ports = format!("{},{}", srv.addrs[0].port(), srv.addrs[1].port());
    let url = format!("http://{}/test/p{{n}}", srv.addr);
    let (out, summary) = flood(&[
        "--url",
        &url,
        "--count",
        "40",
        "--rate",
        "1000",
        "--duration",
        "2s",
        "--interval",
        "1s",
        "--ports",
        &ports,
        "--source-ips",
        "127.0.0.2-127.0.0.3",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j = summary.unwrap();
    assert_eq!(j["active"], 40, "{j}");
    assert_eq!(j["errors"], serde_json::json!({}));
    assert_eq!(srv.stats()["connections"]["opened"], 40);
}

#[test]
fn counts_closed_streams_and_http_errors() {
    let mut s = settings();
    s.stream.max_streams = 30;
    let mut srv = TestServer::start(s);
    let url = format!("http://{}/test/e{{n}}", srv.addr);
    let out = run(&[
        "--url",
        &url,
        "--count",
        "40",
        "--rate",
        "1000",
        "--duration",
        "3s",
        "--interval",
        "1s",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("http_503=10"), "10 over the limit: {stdout}");
    assert!(stdout.contains("Final: {30, 0, "), "{stdout}");
    // Now a server that goes away mid-run: every stream counts as Closed,
    // and --until-drained ends the run then, long before --duration.
    let url = format!("http://{}/test/c{{n}}", srv.addr);
    let launched = Instant::now();
    let flood = Command::new(BIN)
        .args([
            "--url",
            &url,
            "--count",
            "20",
            "--rate",
            "1000",
            "--duration",
            "60s",
            "--interval",
            "1s",
            "--until-drained",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let s = srv.wait_stats(Duration::from_secs(5), |s| s["connections"]["active"] == 20);
    assert_eq!(s["connections"]["active"], 20, "{s}");
    srv.shutdown();
    let out = flood.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("Final: {0, 20, "), "{stdout}");
    assert!(
        launched.elapsed() < Duration::from_secs(30),
        "{:?}",
        launched.elapsed()
    );
}

#[test]
fn refuses_non_loopback_targets() {
    let started = Instant::now();
    let out = run(&[
        "--url",
        "http://10.1.2.3:8000/test/{n}",
        "--count",
        "1",
        "--duration",
        "60s",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a loopback address"), "{err}");
    // A run that connected would hold for its 60 s duration; the bound is
    // far from both that and a loaded CI machine's process start.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "refused before connecting, not after {:?}",
        started.elapsed()
    );
    let out = run(&[
        "--url",
        "http://127.0.0.1:1/test/same",
        "--count",
        "2",
        "--msg-rate",
        "5",
    ]);
    assert!(!out.status.success(), "one shared id cannot measure delivery");
    assert!(String::from_utf8_lossy(&out.stderr).contains("distinct id per stream"));
    let out = run(&[
        "--url",
        "http://127.0.0.1:1/test/{n}",
        "--source-ips",
        "10.0.0.1",
        "--duration",
        "1s",
    ]);
    assert!(!out.status.success());
}

/// `--transport sse` and `--transport ws`: the same run over each
/// transport holds every stream, gets every message and times every tick.
#[test]
fn every_transport_holds_streams_and_gets_every_message() {
    let mut s = settings();
    s.stream.tick_interval_ms = 300;
    let srv = TestServer::start(s);
    let url = format!("http://{}/test/x{{n}}", srv.addr);
    let mut opened = serde_json::Map::new();
    for transport in ["chunked", "sse", "ws"] {
        let (out, summary) = flood(&[
            "--url",
            &url,
            "--count",
            "100",
            "--rate",
            "1000",
            "--duration",
            "2s",
            "--interval",
            "1s",
            "--msg-rate",
            "50",
            "--tick-interval",
            "300ms",
            "--transport",
            transport,
        ]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{transport}: {stdout}");
        let j = summary.expect("summary");
        assert_eq!(j["active"], 100, "{transport}: {j}");
        assert_eq!(j["errors"], serde_json::json!({}), "{transport}: {j}");
        let sent = j["messages"]["sent"].as_u64().unwrap();
        assert!(sent >= 40, "{transport}: {j}");
        assert_eq!(j["messages"]["received"], sent, "{transport}: {j}");
        assert_eq!(j["messages"]["lost"], 0, "{transport}: {j}");
        let ticks = j["ticks"].as_u64().unwrap();
        assert!(ticks >= 300, "{transport}: ticks seen as ticks: {j}");
        let st = srv.stats();
        opened.insert(transport.into(), st["transports"].clone());
    }
    let last = &opened["ws"];
    assert_eq!(last["sse_opened"], 100, "{last}");
    assert_eq!(last["ws_opened"], 100, "{last}");
}

/// True if the connection's request (peeked) opens a stream.
fn is_stream(c: &std::net::TcpStream) -> bool {
    let mut head = [0u8; 10];
    c.set_nonblocking(false).unwrap();
    c.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let n = c.peek(&mut head).unwrap_or(0);
    &head[..n] == b"GET /test/"
}

#[test]
fn the_opening_window_holds_the_ramp_to_what_the_server_answers() {
    use std::io::Write as _;
    // A server that accepts and says nothing for its first 1.5 s, then
    // answers every stream it holds and every later one at once: no more
    // than --max-opening connections may reach it while it is silent.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    let server = std::thread::spawn(move || {
        let started = Instant::now();
        let silent = Duration::from_millis(1500);
        let (mut held, mut waiting, mut during_silence) = (Vec::new(), Vec::new(), 0);
        while started.elapsed() < Duration::from_secs(6) {
            match listener.accept() {
                Ok((c, _)) => waiting.push(c),
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
            if started.elapsed() < silent {
                // Streams only: floodtest also polls the server's /stats.
                during_silence = waiting.iter().filter(|c| is_stream(c)).count();
                continue;
            }
            for mut c in waiting.drain(..) {
                let _ = c.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n");
                held.push(c);
            }
        }
        during_silence
    });
    let url = format!("http://{addr}/test/w{{n}}");
    let (out, summary) = flood(&[
        "--url",
        &url,
        "--count",
        "40",
        "--rate",
        "1000",
        "--max-opening",
        "5",
        "--duration",
        "4s",
        "--interval",
        "1s",
        "--connect-timeout",
        "10s",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let during_silence = server.join().unwrap();
    assert_eq!(during_silence, 5, "connections while silent; {stdout}");
    let j = summary.unwrap();
    assert_eq!(j["established"], 40, "{j}");
    assert_eq!(j["errors"], serde_json::json!({}), "{j}");
    let held_back = j["ramp_held_back_s"].as_f64().unwrap();
    assert!((1.0..3.0).contains(&held_back), "held back {held_back} s: {j}");
    assert!(stdout.contains("held the ramp back"), "{stdout}");
}

/// A fresh directory for one test's certificates.
fn cert_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("floodtest-tls-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// https:// streams (`--tls-ca`): every transport holds its streams inside
/// TLS (ws: wss), messages are POSTed over TLS and arrive, `/stats` is read
/// over TLS, across child processes too; the server counts the handshakes.
#[test]
fn holds_streams_over_tls_on_every_transport() {
    let dir = cert_dir("hold");
    let certs = common::make_certificates(&dir, "flood");
    // The default statistics URL (below) is on the streams' TLS port.
    let mut s = settings();
    s.server.admin_public = true;
    let srv = TestServer::start_tls(s, &certs);
    let tls_port = srv.addrs[1].port();
    let ca = certs.ca.to_str().unwrap();
    // `localhost` checks the certificate's DNS name, the others its IP address.
    for (transport, host, extra) in [
        ("chunked", "127.0.0.1", &[][..]),
        ("sse", "localhost", &[][..]),
        ("ws", "127.0.0.1", &["--max-per-process", "10"][..]),
    ] {
        let url = format!("https://{host}:{tls_port}/test/{transport}{{n}}");
        let args = [
            &[
                "--url",
                &url,
                "--tls-ca",
                ca,
                "--transport",
                transport,
                "--count",
                "20",
                "--rate",
                "1000",
                "--duration",
                "3s",
                "--interval",
                "1s",
                "--msg-rate",
                "30",
            ][..],
            extra,
        ]
        .concat();
        let (out, summary) = flood(&args);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{transport}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("Final: {20, 0, "), "{transport}: {stdout}");
        let j = summary.expect("summary");
        assert_eq!(j["active"], 20, "{transport}: {j}");
        assert_eq!(j["errors"], serde_json::json!({}), "{transport}: {j}");
        assert!(
            j["chunks"].as_u64().unwrap() >= 20,
            "every welcome: {transport}: {j}"
        );
        let sent = j["messages"]["sent"].as_u64().unwrap();
        assert!(sent >= 10, "{transport}: {j}");
        assert_eq!(j["messages"]["send_errors"], 0, "{transport}: {j}");
        assert_eq!(j["messages"]["received"], sent, "{transport}: {j}");
        // The default statistics URL is the streams' own https:// origin.
        assert!(
            j["server_bytes_per_connection"].as_u64().is_some(),
            "/stats read over TLS: {transport}: {j}"
        );
    }
    let st = srv.stats();
    // 60 streams, 4 sender connections per run and the /stats reads.
    assert!(st["tls"]["handshakes"].as_u64().unwrap() >= 60, "{st}");
    assert_eq!(st["tls"]["handshake_failures"], 0, "{st}");
    assert_eq!(st["transports"]["ws_opened"], 20, "{st}");
    assert_eq!(st["transports"]["sse_opened"], 20, "{st}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A server whose certificate `--tls-ca` does not vouch for: every stream
/// fails its handshake at once and is counted as a TLS error; nothing is
/// held and nothing waits for a timeout. A plain http:// URL stays plain.
#[test]
fn an_untrusted_certificate_is_a_tls_error_not_a_hang() {
    let dir = cert_dir("untrusted");
    let certs = common::make_certificates(&dir, "server");
    let stranger = common::make_certificates(&dir, "stranger");
    let srv = TestServer::start_tls(settings(), &certs);
    let url = format!("https://127.0.0.1:{}/test/u{{n}}", srv.addrs[1].port());
    let started = Instant::now();
    let (out, summary) = flood(&[
        "--url",
        &url,
        "--tls-ca",
        stranger.ca.to_str().unwrap(),
        "--count",
        "20",
        "--rate",
        "1000",
        "--duration",
        "2s",
        "--interval",
        "1s",
        "--connect-timeout",
        "30s",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("Final: {0, 0, 0}"), "{stdout}");
    let j = summary.expect("summary");
    assert_eq!(j["errors"], serde_json::json!({"tls": 20}), "{j}");
    assert_eq!(j["established"], 0, "{j}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "refused at the handshake, not after the 30 s timeout: {:?}",
        started.elapsed()
    );
    // The server saw every stream give up on its certificate (and the
    // /stats reads, which trust the same stranger).
    let failures = |s: &Value| s["tls"]["handshake_failures"].as_u64().unwrap_or(0);
    let st = srv.wait_stats(Duration::from_secs(5), |s| failures(s) >= 20);
    assert!(failures(&st) >= 20, "{st}");
    assert_eq!(st["tls"]["handshakes"], 0, "{st}");
    // A CA file without a certificate is refused before anything connects.
    let empty = dir.join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let out = run(&[
        "--url",
        &url,
        "--tls-ca",
        empty.to_str().unwrap(),
        "--count",
        "1",
        "--duration",
        "60s",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("holds no PEM certificate"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
