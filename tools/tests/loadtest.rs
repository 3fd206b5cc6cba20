//! The loadtest binary as a real process against a real server; connection
//! counts are checked on the server side.

// The server crate's test helpers: a real server in this process on a free
// port, and a small HTTP/1.1 client (shared, not copied).
#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::Command;

use common::{TestServer, settings};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_loadtest");

/// Runs loadtest against `path` with `args` (whitespace-separated); returns
/// its stdout, its JSON summary, and the connections the server accepted
/// meanwhile (its own `/stats` reads excluded).
fn load(srv: &TestServer, path: &str, args: &str) -> (String, Value, u64) {
    let accepted = || srv.stats()["connections"]["accepted"].as_u64().unwrap();
    let before = accepted();
    let args: Vec<&str> = args.split_whitespace().collect();
    let json = std::env::temp_dir().join(format!("loadtest-{}-{}.json", std::process::id(), args.join("_")));
    let out = Command::new(BIN)
        .arg("--url")
        .arg(format!("http://{}{path}", srv.addr))
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).unwrap();
    let conns = accepted() - before - 1;
    (stdout, v, conns)
}

#[test]
fn ibrowse_style_workers_share_a_bounded_pool() {
    let srv = TestServer::start(settings());
    let (stdout, report, conns) = load(&srv, "/dispatcher", "--workers 10 --requests 20 --max-sessions 3");
    assert_eq!(conns, 3, "pool of 3 sessions");
    assert_eq!(report["requests"], 200);
    assert_eq!(report["success"], 200);
    assert_eq!(report["workers"].as_array().unwrap().len(), 10);
    assert!(stdout.contains("worker   10:"), "{stdout}");
    assert!(report["latency_ms"]["p99"].as_f64().unwrap() > 0.0);
    assert_eq!(
        srv.stats()["counter"],
        200,
        "every request reached the Counter once"
    );
}

#[test]
fn pipelining_keeps_several_requests_on_one_connection() {
    let srv = TestServer::start(settings());
    let (_, report, conns) = load(
        &srv,
        "/dispatcher",
        "--workers 8 --requests 25 --max-sessions 1 --pipeline 4",
    );
    assert_eq!(conns, 1);
    assert_eq!(report["success"], 200);
    assert_eq!(srv.stats()["counter"], 200);
}

#[test]
fn no_keepalive_opens_a_connection_per_request() {
    let srv = TestServer::start(settings());
    let (_, report, conns) = load(
        &srv,
        "/dispatcher",
        "--workers 2 --requests 10 --max-sessions 2 --no-keepalive",
    );
    assert_eq!(conns, 20);
    assert_eq!(report["success"], 20);
}

#[test]
fn wrk_style_runs_for_a_duration_over_fixed_connections() {
    let srv = TestServer::start(settings());
    let (_, report, conns) = load(&srv, "/dispatcher", "--connections 8 --duration 1s");
    assert_eq!(conns, 8);
    let requests = report["requests"].as_u64().unwrap();
    assert!(requests > 100, "{report}");
    assert_eq!(report["success"], requests);
    assert!(report["rps"].as_f64().unwrap() > 100.0);
    // Requests still in flight at the deadline reached the server uncounted.
    let counter = srv.stats()["counter"].as_u64().unwrap();
    assert!(
        (requests..=requests + 8).contains(&counter),
        "{counter} vs {requests}"
    );
}

#[test]
fn errors_are_counted_by_kind() {
    let srv = TestServer::start(settings());
    let (stdout, report, _) = load(&srv, "/nope", "--workers 2 --requests 5");
    assert_eq!(report["success"], 0);
    assert_eq!(report["errors"]["http_404"], 10, "{stdout}");
}

#[test]
fn refuses_non_loopback_targets() {
    let out = Command::new(BIN)
        .args([
            "--url",
            "http://192.168.1.1/dispatcher",
            "--workers",
            "1",
            "--requests",
            "1",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a loopback address"));
}

#[test]
fn a_server_that_never_answers_counts_as_timeouts() {
    // Accepts and then says nothing.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let holder = std::thread::spawn(move || {
        let conns: Vec<_> = silent.incoming().take(2).collect();
        std::thread::sleep(std::time::Duration::from_secs(2));
        drop(conns);
    });
    let out = Command::new(BIN)
        .args([
            "--url",
            &format!("http://{addr}/dispatcher"),
            "--workers",
            "1",
            "--requests",
            "2",
        ])
        .args(["--max-sessions", "1", "--timeout", "300ms"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("success 0  errors: timeout=2"), "{stdout}");
    holder.join().unwrap();
}
