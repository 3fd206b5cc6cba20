//! The official JavaScript client, `clients/js/` (npm `switchboard-client`),
//! against real switchboard processes. The package is packed (`npm pack`)
//! and installed from its tarball into a fresh project, as a user gets it,
//! and the scripts of `tests/js_client/` run there in Node:
//!
//! - every message arrives, in order and byte for byte, over SSE read from
//!   `fetch`, over long-poll and over WebSocket;
//! - a server killed mid-stream and started again on the same port: the
//!   client resumes from its last event id, is told of the hole once
//!   (`onGap`: the new process's history starts after it), gets what is
//!   published next, and a long-poll does not spin meanwhile; a client
//!   resuming later gets the kept messages after the gap;
//! - 200 clients whose server restarts spread their reconnects (full
//!   jitter) instead of coming back in one burst;
//! - `getToken` is asked again before the token's `exp` (the server never
//!   has to end a stream for an expired token) and after a 401; a refused
//!   static token closes the subscription with the reason;
//! - `Retry-After` of a 429 (`max_streams_per_id`) and of a 503 (a failing
//!   subscribe hook) is waited out, as the server sees it;
//! - the TypeScript declarations type-check a user's code, and refuse a
//!   wrong one.
//!
//! And in headless Chromium: a page loads the packed module and subscribes
//! through nginx with `proxy_buffering on` (which ignores switchboard's
//! `X-Accel-Buffering: no`, as a company's proxy does): no welcome gets
//! through, the client falls back to long-poll and gets every message in
//! order, those published while it waited for the welcome included; straight to switchboard it stays on SSE, and on WebSocket when
//! asked; an `EventSource` refused 429 is retried, its status learnt by
//! the client's probe.
//!
//! Needs node (20+) and npm, nginx (`/usr/sbin/nginx`), Debian's chromium,
//! and `npm ci` in `clients/js` (TypeScript, for the declarations). Without
//! one a test fails and says what to install: none is skipped.

mod common;
// Only the browser test needs Chromium's helper (and its dependencies).
#[path = "common/chromium.rs"]
mod chromium;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::process::Proc;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_switchboard");
/// The package's sources.
const PACKAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/js");
/// This test's scripts, page and nginx configuration.
const HERE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/js_client");

/// A folder of this test run's own, made anew.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir()
        .join(format!("switchboard-js-client-{}", std::process::id()))
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `cmd` to its end; its stdout. Fails with its output if it failed,
/// and with what to install if it is not there.
fn run(cmd: &mut Command, install: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}; install {install}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The package packed and installed from its tarball into a fresh
/// project, with this test's scripts beside it (so their
/// `import 'switchboard-client'` is what a user's gets). Once per run.
fn project() -> &'static Path {
    static PROJECT: OnceLock<PathBuf> = OnceLock::new();
    PROJECT.get_or_init(|| {
        let dir = scratch("project");
        let packed = run(
            Command::new("npm")
                .args(["pack", "--json", "--pack-destination"])
                .arg(&dir)
                .current_dir(PACKAGE),
            "node and npm (apt-get install -y nodejs npm)",
        );
        let packed: Value = serde_json::from_str(&packed).unwrap();
        let mut files: Vec<&str> = packed[0]["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["path"].as_str().unwrap())
            .collect();
        files.sort_unstable();
        assert_eq!(
            files,
            ["README.md", "index.d.ts", "index.js", "package.json"],
            "what the tarball holds"
        );
        let tarball = dir.join(packed[0]["filename"].as_str().unwrap());
        std::fs::write(
            dir.join("package.json"),
            r#"{"name": "js-client-test", "private": true, "type": "module"}"#,
        )
        .unwrap();
        run(
            Command::new("npm")
                .args(["install", "--offline", "--no-audit", "--no-fund", "--silent"])
                .arg(&tarball)
                .current_dir(&dir),
            "node and npm (apt-get install -y nodejs npm)",
        );
        let installed = dir.join("node_modules/switchboard-client/package.json");
        let installed: Value = serde_json::from_str(&std::fs::read_to_string(installed).unwrap()).unwrap();
        assert!(
            installed.get("dependencies").is_none(),
            "no runtime dependencies: {installed}"
        );
        for script in ["subscribe.mjs", "herd.mjs"] {
            std::fs::copy(Path::new(HERE).join(script), dir.join(script)).unwrap();
        }
        dir
    })
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// A switchboard process and the addresses it wrote to its address file.
struct Server {
    proc: Proc,
    addr: SocketAddr,
    admin: SocketAddr,
}

impl Server {
    /// switchboard on a port it picks, with `env`.
    fn start(env: &[(&str, &str)]) -> Server {
        Server::try_start(0, env).unwrap_or_else(|log| panic!("switchboard did not start:\n{log}"))
    }

    /// switchboard on `port` again (a restart): tried for up to 10 s while
    /// something else still holds the port.
    fn restart_on(port: u16, env: &[(&str, &str)]) -> Server {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match Server::try_start(port, env) {
                Ok(s) => return s,
                Err(log) if log.contains("Address already in use") && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(log) => panic!("switchboard did not start again on port {port}:\n{log}"),
            }
        }
    }

    /// Starts it on `port` (0: any) and reads its addresses from its
    /// "switchboard listening" log line; its log if it exited first.
    fn try_start(port: u16, env: &[(&str, &str)]) -> Result<Server, String> {
        let mut cmd = Command::new(BIN);
        cmd.env("SWITCHBOARD__SERVER__PORT", port.to_string())
            .env("SWITCHBOARD__SERVER__WORKERS", "2");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut proc = Proc::spawn(cmd);
        let deadline = Instant::now() + Duration::from_secs(20);
        while proc.log_fields("switchboard listening").is_empty() {
            if !proc.child_alive() {
                std::thread::sleep(Duration::from_millis(100));
                return Err(proc.log_text());
            }
            assert!(Instant::now() < deadline, "not listening:\n{}", proc.log_text());
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(Server {
            addr: proc.wait_listening()[0],
            admin: proc.wait_admin(),
            proc,
        })
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `POST /send/{id}`: the message's event id.
    fn send(&self, id: &str, msg: &str) -> u64 {
        let r = common::request(self.addr, "POST", &format!("/send/{id}"), &[], msg.as_bytes()).unwrap();
        assert_eq!(r.status, 200, "/send/{id}: {}", r.text());
        r.json()["event_id"].as_u64().expect("an event id")
    }

    fn stats(&self) -> Value {
        common::request(self.admin, "GET", "/stats", &[], b"")
            .unwrap()
            .json()
    }

    /// SIGKILL, as a crash: the streams drop with no final chunk.
    fn crash(mut self) -> u16 {
        self.proc.signal("KILL");
        self.proc.wait_exit(Duration::from_secs(10));
        self.addr.port()
    }
}

/// A Node script of `tests/js_client/` running in the project, its JSON
/// lines read as they come.
struct Node {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<Value>,
    stderr: Arc<Mutex<String>>,
    /// Every line so far.
    seen: Vec<Value>,
}

impl Node {
    fn start(script: &str, config: Value) -> Node {
        Node::start_with(&[], script, config)
    }

    fn start_with(node_args: &[&str], script: &str, config: Value) -> Node {
        let mut child = Command::new("node")
            .args(node_args)
            .arg(script)
            .arg(config.to_string())
            .current_dir(project())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("node (apt-get install -y nodejs npm)");
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let v = serde_json::from_str(&line).unwrap_or_else(|_| json!({ "ev": "text", "line": line }));
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&stderr);
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        Node {
            stdin: child.stdin.take(),
            child,
            lines,
            stderr,
            seen: Vec::new(),
        }
    }

    /// Reads lines until `done` holds for all seen so far (or fails after
    /// `within`, with what it saw).
    fn wait(&mut self, within: Duration, what: &str, done: impl Fn(&[Value]) -> bool) {
        let deadline = Instant::now() + within;
        while !done(&self.seen) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(v) => self.seen.push(v),
                Err(_) => panic!(
                    "{what}: not within {within:?}; the script said:\n{}\nstderr:\n{}",
                    self.seen
                        .iter()
                        .map(Value::to_string)
                        .collect::<Vec<_>>()
                        .join("\n"),
                    self.stderr.lock().unwrap()
                ),
            }
        }
    }

    /// The lines of one kind (`message`, `state`, `gap`, ...).
    fn of(&self, ev: &str) -> Vec<&Value> {
        self.seen.iter().filter(|v| v["ev"] == ev).collect()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // stdin's end closes the subscription; the script exits.
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn is_state(v: &Value, state: &str) -> bool {
    v["ev"] == "state" && v["state"] == state
}

fn count(seen: &[Value], ev: &str) -> usize {
    seen.iter().filter(|v| v["ev"] == ev).count()
}

/// Messages a parser could trip on: quotes (the line's own delimiter),
/// a colon and an `id:` inside, non-ASCII, leading and trailing spaces,
/// a backslash, and one of 3,000 bytes.
fn tricky(n: usize) -> String {
    match n % 7 {
        0 => format!("plain {n}"),
        1 => format!("it's {n}: 'quoted' and \"double\" '"),
        2 => format!("ünïcödé ☃ 🚀 {n}"),
        3 => format!("  spaced {n}  "),
        4 => format!("id: {n}\\nevent: gap"),
        5 => format!("{n}{}", "x".repeat(3000)),
        _ => format!("'{n}'"),
    }
}

/// A long-poll that starts without a resume point receives what is
/// published once its request reached the server: publishes `primer-k`
/// until the client has one (then every later message must arrive).
fn prime(srv: &Server, id: &str, node: &mut Node) {
    for k in 1..=50 {
        srv.send(id, &format!("primer-{k}"));
        let deadline = Instant::now() + Duration::from_millis(300);
        while Instant::now() < deadline && count(&node.seen, "message") == 0 {
            if let Ok(v) = node.lines.recv_timeout(Duration::from_millis(20)) {
                node.seen.push(v);
            }
        }
        if count(&node.seen, "message") > 0 {
            return;
        }
    }
    panic!("no primer arrived in 15 s: {:?}", node.seen);
}

/// The messages after the primers, which must themselves be consecutive.
fn after_primers(node: &Node) -> Vec<&Value> {
    let msgs = node.of("message");
    let primers: Vec<u32> = msgs
        .iter()
        .filter_map(|m| m["data"].as_str().unwrap().strip_prefix("primer-"))
        .map(|k| k.parse().unwrap())
        .collect();
    assert!(
        primers.windows(2).all(|w| w[1] == w[0] + 1),
        "primers from the first received on: {primers:?}"
    );
    msgs.into_iter()
        .filter(|m| !m["data"].as_str().unwrap().starts_with("primer-"))
        .collect()
}

/// Each message's data and event id.
fn received(messages: &[&Value]) -> Vec<(String, u64)> {
    messages
        .iter()
        .map(|m| {
            (
                m["data"].as_str().unwrap().to_owned(),
                m["eventId"].as_str().unwrap().parse().unwrap(),
            )
        })
        .collect()
}

/// A client on `transport` gets 100 messages published as fast as the
/// test can, every one once, in order, byte for byte, with its event id.
fn every_message_in_order(transport: &str, node_args: &[&str]) {
    let srv = Server::start(&[]);
    let id = format!("in-order-{transport}");
    let mut node = Node::start_with(
        node_args,
        "subscribe.mjs",
        json!({ "base": srv.url(), "id": id, "options": { "transports": [transport] } }),
    );
    node.wait(Duration::from_secs(15), "open", |seen| {
        seen.iter().any(|v| is_state(v, "open"))
    });
    if transport == "poll" {
        prime(&srv, &id, &mut node);
    }
    let primed = count(&node.seen, "message");
    let sent: Vec<(String, u64)> = (1..=100)
        .map(|n| {
            let msg = tricky(n);
            let event = srv.send(&id, &msg);
            (msg, event)
        })
        .collect();
    node.wait(Duration::from_secs(30), "100 messages", |seen| {
        count(seen, "message") >= primed + 100
    });
    let got = received(&after_primers(&node));
    assert_eq!(got, sent, "{transport}: every message, once, in order");
    assert!(
        node.of("message").iter().all(|m| m["transport"] == transport),
        "all over {transport}"
    );
    assert!(node.of("gap").is_empty(), "no gap: {:?}", node.of("gap"));
    let opens: Vec<&Value> = node.seen.iter().filter(|v| is_state(v, "open")).collect();
    assert_eq!(
        opens.len(),
        1,
        "one connection, no reconnect: {:?}",
        node.of("state")
    );
    assert_eq!(opens[0]["transport"], transport);
    let st = srv.stats();
    println!("{transport}: 100 messages in order; server: {}", st["transports"]);
}

#[test]
fn node_receives_every_message_in_order_over_fetch_sse() {
    every_message_in_order("sse", &[]);
}

#[test]
fn node_receives_every_message_in_order_over_long_poll() {
    every_message_in_order("poll", &[]);
}

#[test]
fn node_receives_every_message_in_order_over_websocket() {
    // Node 20's WebSocket (undici's, as browsers have it) is behind a flag;
    // the client uses the global one.
    every_message_in_order("websocket", &["--experimental-websocket", "--no-warnings"]);
}

/// In Node, behind the buffering nginx: the client's defaults (SSE read
/// from `fetch`, then long-poll) see no welcome, fall back to long-poll,
/// and get every message in order, those published while they waited for
/// the welcome first (the client anchored on where the id stood). Straight
/// to switchboard, the same client stays on SSE.
#[test]
fn node_falls_back_to_long_poll_behind_a_buffering_proxy_and_stays_on_sse_without_it() {
    let srv = Server::start(&[]);
    let nginx = Nginx::start(srv.addr);
    let options = json!({ "fallbackAfterMs": 1500 });
    let proxied = format!("http://127.0.0.1:{}", nginx.port);
    let mut behind = Node::start(
        "subscribe.mjs",
        json!({ "base": proxied, "id": "node-proxied", "options": options }),
    );
    let mut direct = Node::start(
        "subscribe.mjs",
        json!({ "base": srv.url(), "id": "node-direct", "options": options }),
    );
    behind.wait(Duration::from_secs(15), "connecting over SSE", |seen| {
        seen.iter()
            .any(|v| is_state(v, "connecting") && v["transport"] == "sse")
    });
    std::thread::sleep(Duration::from_millis(500));
    let mut sent = vec![("early".to_owned(), srv.send("node-proxied", "early"))];
    behind.wait(Duration::from_secs(15), "open on long-poll", |seen| {
        seen.iter()
            .any(|v| is_state(v, "open") && v["transport"] == "poll")
    });
    direct.wait(Duration::from_secs(15), "open on SSE", |seen| {
        seen.iter().any(|v| is_state(v, "open"))
    });
    let mut direct_sent = Vec::new();
    for n in 1..=20 {
        let msg = tricky(n);
        sent.push((msg.clone(), srv.send("node-proxied", &msg)));
        direct_sent.push((msg.clone(), srv.send("node-direct", &msg)));
    }
    behind.wait(Duration::from_secs(20), "21 messages behind the proxy", |seen| {
        count(seen, "message") >= sent.len()
    });
    direct.wait(Duration::from_secs(20), "20 messages straight", |seen| {
        count(seen, "message") >= direct_sent.len()
    });
    assert_eq!(
        received(&behind.of("message")),
        sent,
        "behind the proxy: every message once, in order"
    );
    assert!(behind.of("message").iter().all(|m| m["transport"] == "poll"));
    assert!(behind.of("gap").is_empty(), "{:?}", behind.of("gap"));
    assert!(
        !behind
            .seen
            .iter()
            .any(|v| is_state(v, "open") && v["transport"] == "sse"),
        "the proxy let a welcome through: {:?}",
        behind.of("state")
    );
    assert_eq!(received(&direct.of("message")), direct_sent);
    assert!(direct.of("message").iter().all(|m| m["transport"] == "sse"));
    assert!(
        !direct.seen.iter().any(|v| v["transport"] == "poll"),
        "fell back without a proxy: {:?}",
        direct.of("state")
    );
}

/// The server crashes after m1..m3 and starts again on the same port. The
/// client reconnects, resumes with m3's id, and the new process, whose
/// history starts after it, says so: one gap, after m3 (a long-poll with
/// the next message: it must not spin meanwhile). 1.5 s later m4..m6 are
/// published: the client ends with m1, m2, m3, the gap, m4, m5, m6. And a second client that
/// resumes from m3 once m4..m6 are kept is told the gap with where the
/// history resumes (m4), then gets m4..m6 from it.
fn restart_mid_stream(transport: &str) {
    let srv = Server::start(&[]);
    let id = format!("restart-{transport}");
    let options = json!({ "transports": [transport], "retryBaseMs": 200, "retryMaxMs": 1000 });
    let mut node = Node::start(
        "subscribe.mjs",
        json!({ "base": srv.url(), "id": id, "options": options }),
    );
    node.wait(Duration::from_secs(15), "open", |seen| {
        seen.iter().any(|v| is_state(v, "open"))
    });
    if transport == "poll" {
        prime(&srv, &id, &mut node);
    }
    let primed = count(&node.seen, "message");
    let mut sent: Vec<(String, u64)> = (1..=3)
        .map(|n| (format!("m{n}"), srv.send(&id, &format!("m{n}"))))
        .collect();
    node.wait(Duration::from_secs(10), "m1..m3", |seen| {
        count(seen, "message") >= primed + 3
    });
    let m3 = sent[2].1;

    let port = srv.crash();
    let srv = Server::restart_on(port, &[]);
    if transport == "poll" {
        // A long-poll is told of a gap with nothing kept when the next
        // message comes (answering at once, poll after poll, would be a
        // loop): it waits quietly meanwhile.
        node.wait(Duration::from_secs(10), "polling the new server", |seen| {
            seen.iter().filter(|v| is_state(v, "open")).count() >= 2
        });
    } else {
        node.wait(Duration::from_secs(10), "the gap, once back", |seen| {
            count(seen, "gap") > 0
        });
    }
    std::thread::sleep(Duration::from_millis(1500));
    let polls_while_quiet = srv.stats()["transports"]["poll_opened"].as_u64().unwrap();
    sent.extend((4..=6).map(|n| (format!("m{n}"), srv.send(&id, &format!("m{n}")))));
    node.wait(Duration::from_secs(15), "m4..m6 after the restart", |seen| {
        count(seen, "message") >= primed + 6
    });

    let got = received(&after_primers(&node));
    assert_eq!(got, sent, "{transport}: m1..m6, once, in order");
    let gaps = node.of("gap");
    assert_eq!(gaps.len(), 1, "{transport}: the restart is one gap: {gaps:?}");
    assert_eq!(
        gaps[0]["after"],
        m3.to_string(),
        "{transport}: the gap is after m3"
    );
    // SSE is told at its welcome that new messages follow; a long-poll
    // with the answer that brings m4, where the kept messages resume.
    let next = if transport == "poll" {
        json!(sent[3].1.to_string())
    } else {
        Value::Null
    };
    assert_eq!(gaps[0]["next"], next, "{transport}: {}", gaps[0]);
    let order: Vec<String> = node
        .seen
        .iter()
        .filter_map(|v| match v["ev"].as_str() {
            Some("gap") => Some("gap".to_owned()),
            Some("message") => v["data"].as_str().map(str::to_owned),
            _ => None,
        })
        .filter(|s| !s.starts_with("primer-"))
        .collect();
    assert_eq!(order, ["m1", "m2", "m3", "gap", "m4", "m5", "m6"], "{transport}");
    // 1.5 s with nothing to say: a poll that waits, not a loop.
    assert!(
        polls_while_quiet <= 5,
        "{transport}: {polls_while_quiet} polls while nothing was published"
    );
    println!(
        "{transport}: across the restart: {order:?}, {}; polls on the new server while quiet: {polls_while_quiet}",
        gaps[0]["raw"]
    );

    // Resuming from m3 now: the history (m4..m6) resumes at m4.
    let mut resuming = options.clone();
    resuming["lastEventId"] = json!(m3.to_string());
    let mut late = Node::start(
        "subscribe.mjs",
        json!({ "base": srv.url(), "id": id, "options": resuming }),
    );
    late.wait(Duration::from_secs(15), "m4..m6 from history", |seen| {
        count(seen, "message") >= 3
    });
    let gaps = late.of("gap");
    assert_eq!(gaps.len(), 1, "{transport}: {gaps:?}");
    assert_eq!(gaps[0]["after"], m3.to_string());
    assert_eq!(gaps[0]["next"], sent[3].1.to_string(), "history resumes at m4");
    let got = received(&late.of("message"));
    assert_eq!(got, sent[3..], "{transport}: m4..m6 from history");
}

#[test]
fn node_resumes_across_a_server_restart_over_fetch_sse() {
    restart_mid_stream("sse");
}

#[test]
fn node_resumes_across_a_server_restart_over_long_poll() {
    restart_mid_stream("poll");
}

/// 200 clients (SSE over fetch, backoff base 1 s) lose their server at
/// once; it starts again on the same port. Full jitter spreads both their
/// first reconnect attempts and their successful reconnects over time:
/// no 100 ms holds more than a quarter of them (without jitter all 200
/// would come back within one).
#[test]
fn two_hundred_clients_spread_their_reconnects_after_a_restart() {
    const CLIENTS: usize = 200;
    let srv = Server::start(&[]);
    let mut herd = Node::start(
        "herd.mjs",
        json!({
            "base": srv.url(),
            "count": CLIENTS,
            "prefix": "herd-",
            "options": { "retryBaseMs": 1000, "retryMaxMs": 8000 },
        }),
    );
    herd.wait(Duration::from_secs(30), "200 clients open", |seen| {
        count(seen, "open") == 1
    });
    let killed = now_ms();
    let port = srv.crash();
    let _srv = Server::restart_on(port, &[]);
    let restarted = now_ms() - killed;
    herd.wait(Duration::from_secs(40), "200 clients open again", |seen| {
        count(seen, "reopened") == 1
    });
    let clients = herd.of("reopened")[0]["clients"].as_array().unwrap().clone();
    assert_eq!(clients.len(), CLIENTS);
    let first_attempts: Vec<u64> = clients
        .iter()
        .map(|c| c["attempts"][0].as_u64().expect("an attempt after the drop") - killed)
        .collect();
    let reopened: Vec<u64> = clients
        .iter()
        .map(|c| c["open"].as_u64().unwrap() - killed)
        .collect();
    let tries: usize = clients
        .iter()
        .map(|c| c["attempts"].as_array().unwrap().len())
        .sum();
    for (what, times) in [("first attempts", &first_attempts), ("reconnects", &reopened)] {
        let (lo, hi) = (*times.iter().min().unwrap(), *times.iter().max().unwrap());
        let mut buckets = std::collections::BTreeMap::<u64, usize>::new();
        for t in times {
            *buckets.entry(t / 100).or_default() += 1;
        }
        let busiest = *buckets.values().max().unwrap();
        println!(
            "{what}: {lo}..{hi} ms after the kill (span {} ms), {} buckets of 100 ms, busiest {busiest}/{CLIENTS}: {:?}",
            hi - lo,
            buckets.len(),
            buckets.iter().map(|(b, n)| (b * 100, *n)).collect::<Vec<_>>()
        );
        assert!(hi - lo >= 500, "{what} spread over at least 500 ms: {lo}..{hi}");
        assert!(
            busiest <= CLIENTS / 4,
            "{what}: no 100 ms bucket holds more than a quarter: {buckets:?}"
        );
    }
    println!("the server was back {restarted} ms after the kill; {tries} attempts for {CLIENTS} clients");
}

/// getToken mints tokens of 4 s (the first one already expired): the
/// client is refused once (401), asks again at once, and then asks again
/// before each token's `exp` and reconnects with the new one, resuming:
/// 320 messages over 8 s (one every 25 ms, so a reconnect without resume
/// would likely lose one) arrive in order without a gap, and the server
/// never ends a stream for an expired token.
fn token_refresh(transport: &str) {
    const SECRET: &str = "js-client-secret";
    let srv = Server::start(&[("SWITCHBOARD__AUTH__SUBSCRIBE_SECRET", SECRET)]);
    let id = format!("token-{transport}");
    let mut node = Node::start(
        "subscribe.mjs",
        json!({
            "base": srv.url(),
            "id": id,
            "options": { "transports": [transport], "retryBaseMs": 200 },
            "token": { "secret": SECRET, "ttlSec": 4, "firstExpired": true },
        }),
    );
    node.wait(Duration::from_secs(15), "open", |seen| {
        seen.iter().any(|v| is_state(v, "open"))
    });
    if transport == "poll" {
        prime(&srv, &id, &mut node);
    }
    let primed = count(&node.seen, "message");
    let mut sent = Vec::new();
    for n in 1..=320 {
        sent.push(format!("t{n}"));
        srv.send(&id, &format!("t{n}"));
        std::thread::sleep(Duration::from_millis(25));
    }
    node.wait(Duration::from_secs(15), "320 messages", |seen| {
        count(seen, "message") >= primed + 320
    });
    let got: Vec<String> = after_primers(&node)
        .iter()
        .map(|m| m["data"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(got, sent, "{transport}: every message across the refreshes");
    assert!(node.of("gap").is_empty(), "no gap: {:?}", node.of("gap"));
    assert!(node.of("error").is_empty(), "{:?}", node.of("error"));

    let refused = node.of("state").into_iter().find(|v| v["status"] == 401).cloned();
    let refused = refused.expect("the expired token refused");
    assert_eq!(
        refused["delayMs"], 0,
        "a 401 is retried at once, with a new token: {refused}"
    );
    let tokens = node.of("token");
    let refreshed = node.of("refreshed");
    // 1: expired, refused; 2: after the 401; then one every ~2 s.
    assert!(tokens.len() >= 5, "getToken calls: {tokens:?}");
    assert!(refreshed.len() >= 3, "refreshes before exp: {refreshed:?}");
    // Each valid token was replaced before its exp.
    for pair in tokens.windows(2).skip(1) {
        let (old_exp_ms, asked_at) = (
            pair[0]["exp"].as_u64().unwrap() * 1000,
            pair[1]["at"].as_u64().unwrap(),
        );
        assert!(
            asked_at < old_exp_ms,
            "getToken asked again before the old token's exp: {pair:?}"
        );
    }
    let st = srv.stats();
    assert_eq!(
        st["auth"]["tokens_refused"], 1,
        "only the expired token: {}",
        st["auth"]
    );
    assert_eq!(
        st["auth"]["tokens_expired"], 0,
        "no stream outlived its token: {}",
        st["auth"]
    );
    println!(
        "{transport}: {} getToken calls, {} refreshes before exp; server: {} {}",
        tokens.len(),
        refreshed.len(),
        st["auth"],
        st["transports"]
    );
}

#[test]
fn get_token_is_asked_before_exp_and_after_a_401_over_fetch_sse() {
    token_refresh("sse");
}

#[test]
fn get_token_is_asked_before_exp_and_after_a_401_over_long_poll() {
    token_refresh("poll");
}

/// A static token (no getToken) that the server refuses: the client
/// cannot get another, so it closes and says why (`onError`, 401) instead
/// of retrying forever.
#[test]
fn a_refused_static_token_closes_the_subscription() {
    const SECRET: &str = "js-client-secret";
    let srv = Server::start(&[("SWITCHBOARD__AUTH__SUBSCRIBE_SECRET", SECRET)]);
    let mut node = Node::start(
        "subscribe.mjs",
        json!({
            "base": srv.url(),
            "id": "static",
            "options": { "transports": ["sse"], "retryBaseMs": 50 },
            "token": { "secret": SECRET, "ttlSec": -60, "static": true },
        }),
    );
    node.wait(Duration::from_secs(10), "closed", |seen| {
        seen.iter().any(|v| is_state(v, "closed"))
    });
    let errors = node.of("error");
    assert_eq!(errors.len(), 1, "{:?}", node.seen);
    assert_eq!(errors[0]["status"], 401, "{}", errors[0]);
    assert!(
        errors[0]["message"].as_str().unwrap().contains("expired"),
        "the server's reason: {}",
        errors[0]
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        srv.stats()["auth"]["tokens_refused"],
        1,
        "one attempt, no retries"
    );
}

/// A 429 with `Retry-After: 5` (the id's one stream slot is taken): the
/// client, whose own backoff would retry within 400 ms, waits 5 s. The
/// slot is freed after 2 s: the server refuses only the first attempt,
/// and the client is in within 5 s and its jitter.
#[test]
fn retry_after_of_a_429_is_waited_out() {
    let srv = Server::start(&[("SWITCHBOARD__NAMESPACES__LIM__MAX_STREAMS_PER_ID", "1")]);
    let held = common::StreamClient::open(srv.addr, "lim:a");
    assert_eq!(held.status, 200);
    let mut node = Node::start(
        "subscribe.mjs",
        json!({
            "base": srv.url(),
            "id": "lim:a",
            "options": { "transports": ["sse"], "retryBaseMs": 50, "retryMaxMs": 400 },
        }),
    );
    node.wait(Duration::from_secs(10), "a 429", |seen| {
        seen.iter().any(|v| v["status"] == 429)
    });
    let refused = node
        .of("state")
        .into_iter()
        .find(|v| v["status"] == 429)
        .unwrap()
        .clone();
    assert_eq!(refused["state"], "reconnecting");
    assert_eq!(refused["retryAfterMs"], 5000, "{refused}");
    std::thread::sleep(Duration::from_secs(2));
    drop(held);
    node.wait(Duration::from_secs(10), "open", |seen| {
        seen.iter().any(|v| is_state(v, "open"))
    });
    let open = node.seen.iter().find(|v| is_state(v, "open")).unwrap();
    let waited = open["at"].as_u64().unwrap() - refused["at"].as_u64().unwrap();
    let st = srv.stats();
    println!(
        "429: waited {waited} ms (Retry-After: 5); per_id: {}",
        st["per_id"]
    );
    assert_eq!(st["per_id"]["refused"], 1, "one attempt while the slot was held");
    assert!(
        (5000..7000).contains(&waited),
        "waited {waited} ms: at least Retry-After, plus at most the jitter"
    );
}

/// A 503 with `Retry-After: 1` (the subscribe hook fails twice, then
/// admits): as the hook sees them, the client's attempts are at least 1 s
/// apart, though its own backoff would retry within 400 ms.
#[test]
fn retry_after_of_a_503_is_waited_out() {
    let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let hook = listener.local_addr().unwrap();
    let calls = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let seen = Arc::clone(&calls);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut len = 0;
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                if let Some((k, v)) = line.split_once(':')
                    && k.eq_ignore_ascii_case("content-length")
                {
                    len = v.trim().parse().unwrap_or(0);
                }
                line.clear();
            }
            let mut body = vec![0; len];
            let _ = reader.read_exact(&mut body);
            let n = {
                let mut calls = seen.lock().unwrap();
                calls.push(Instant::now());
                calls.len()
            };
            let status = if n <= 2 {
                "500 Internal Server Error"
            } else {
                "200 OK"
            };
            let _ = write!(
                conn,
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}"
            );
        }
    });
    let srv = Server::start(&[(
        "SWITCHBOARD__HOOKS__SUBSCRIBE_URL",
        &format!("http://{hook}/hook"),
    )]);
    let mut node = Node::start(
        "subscribe.mjs",
        json!({
            "base": srv.url(),
            "id": "hooked",
            "options": { "transports": ["sse"], "retryBaseMs": 50, "retryMaxMs": 400 },
        }),
    );
    node.wait(Duration::from_secs(15), "open", |seen| {
        seen.iter().any(|v| is_state(v, "open"))
    });
    let calls = calls.lock().unwrap().clone();
    let apart: Vec<u128> = calls.windows(2).map(|w| (w[1] - w[0]).as_millis()).collect();
    println!("503: the hook's calls were {apart:?} ms apart (Retry-After: 1)");
    assert_eq!(calls.len(), 3, "two refusals, then in");
    assert!(apart.iter().all(|&ms| ms >= 1000), "{apart:?}");
    let refusals: Vec<&Value> = node
        .of("state")
        .into_iter()
        .filter(|v| v["status"] == 503)
        .collect();
    assert_eq!(refusals.len(), 2, "{refusals:?}");
    assert!(refusals.iter().all(|r| r["retryAfterMs"] == 1000), "{refusals:?}");
}

/// The declarations (from the tarball, found through `exports`) accept a
/// user's code under `--strict`, and refuse a transport that does not
/// exist: tsc really reads them.
#[test]
fn typescript_declarations_check_a_users_code() {
    let tsc = Path::new(PACKAGE).join("node_modules/.bin/tsc");
    assert!(
        tsc.exists(),
        "{} not found: run `npm ci` in clients/js (TypeScript)",
        tsc.display()
    );
    let dir = project();
    let check = |file: &str| {
        Command::new(&tsc)
            .args([
                "--noEmit",
                "--strict",
                "--module",
                "nodenext",
                "--moduleResolution",
                "nodenext",
                "--target",
                "es2022",
                "--lib",
                "es2022,dom",
                file,
            ])
            .current_dir(dir)
            .output()
            .unwrap()
    };
    std::fs::copy(Path::new(HERE).join("usage.ts"), dir.join("usage.ts")).unwrap();
    let ok = check("usage.ts");
    assert!(
        ok.status.success(),
        "usage.ts: {}{}",
        String::from_utf8_lossy(&ok.stdout),
        String::from_utf8_lossy(&ok.stderr)
    );
    std::fs::write(
        dir.join("wrong.ts"),
        "import { connect } from 'switchboard-client';\nconnect('http://x', 'a', { transports: ['pigeon'] });\n",
    )
    .unwrap();
    let wrong = check("wrong.ts");
    let said = String::from_utf8_lossy(&wrong.stdout);
    assert!(!wrong.status.success() && said.contains("pigeon"), "{said}");
}

/// Serves the page at `/` and the installed package's module at
/// `/switchboard-client.js`, on a port it bound itself.
fn page_server() -> SocketAddr {
    let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    let page = std::fs::read(Path::new(HERE).join("page.html")).unwrap();
    let module = std::fs::read(project().join("node_modules/switchboard-client/index.js")).unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut request = String::new();
            let _ = reader.read_line(&mut request);
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let path = request.split(' ').nth(1).unwrap_or_default();
            let (status, kind, body): (&str, &str, &[u8]) = match path.split('?').next() {
                Some("/") => ("200 OK", "text/html; charset=utf-8", &page),
                Some("/switchboard-client.js") => ("200 OK", "text/javascript", &module),
                _ => ("404 Not Found", "text/plain", b""),
            };
            let _ = write!(
                conn,
                "HTTP/1.1 {status}\r\ncontent-type: {kind}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(body);
        }
    });
    addr
}

/// nginx in front of `upstream`, buffering its streams
/// (`tests/js_client/nginx.conf`), one process, stopped by its pid.
struct Nginx {
    child: Child,
    port: u16,
}

impl Nginx {
    fn start(upstream: SocketAddr) -> Nginx {
        const NGINX: &str = "/usr/sbin/nginx";
        assert!(
            Path::new(NGINX).exists(),
            "{NGINX} not found: apt-get install -y nginx"
        );
        let template = std::fs::read_to_string(Path::new(HERE).join("nginx.conf")).unwrap();
        // nginx cannot bind port 0 and say which: a free port, and another
        // one if something took it before nginx bound it.
        for _ in 0..5 {
            let dir = scratch("nginx");
            std::fs::create_dir_all(dir.join("tmp")).unwrap();
            let port = common::free_port();
            let conf = template
                .replace("{{DIR}}", &dir.display().to_string())
                .replace("{{PORT}}", &port.to_string())
                .replace("{{UPSTREAM}}", &upstream.to_string());
            std::fs::write(dir.join("nginx.conf"), conf).unwrap();
            let mut child = Command::new(NGINX)
                .arg("-p")
                .arg(&dir)
                .arg("-c")
                .arg(dir.join("nginx.conf"))
                .arg("-g")
                .arg(format!(
                    "daemon off; master_process off; pid {}/nginx.pid;",
                    dir.display()
                ))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(dir.join("stderr.log")).unwrap())
                .spawn()
                .expect("start nginx");
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let log = std::fs::read_to_string(dir.join("stderr.log")).unwrap_or_default()
                    + &std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
                if let Ok(r) = common::request(([127, 0, 0, 1], port).into(), "GET", "/ready", &[], b"")
                    && r.status == 200
                    && r.text() == "nginx"
                {
                    return Nginx { child, port };
                }
                if let Ok(Some(status)) = child.try_wait() {
                    assert!(
                        log.contains("Address already in use"),
                        "nginx exited ({status}):\n{log}"
                    );
                    break;
                }
                assert!(Instant::now() < deadline, "nginx not ready in 10 s:\n{log}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        panic!("5 ports tried, each taken before nginx bound it");
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        common::process::send_signal(self.child.id(), "TERM");
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The page's `window.report` as it is now.
fn read_report(dt: &mut chromium::Devtools) -> Value {
    let report = dt.eval("JSON.stringify(window.report ?? null)");
    serde_json::from_str(report.as_str().unwrap_or("null")).unwrap()
}

/// The page's `window.report`, read over DevTools until `done` holds.
fn wait_report(
    dt: &mut chromium::Devtools,
    within: Duration,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let report = read_report(dt);
        if done(&report) {
            return report;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {within:?}: {report}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn states<'a>(report: &'a Value, run: &str) -> &'a [Value] {
    report[run]["states"].as_array().map_or(&[], Vec::as_slice)
}

fn message_count(report: &Value, run: &str) -> usize {
    report[run]["messages"].as_array().map_or(0, Vec::len)
}

#[test]
fn chromium_falls_back_to_long_poll_behind_a_buffering_proxy_and_stays_on_sse_without_it() {
    let page = page_server();
    let srv = Server::start(&[
        ("SWITCHBOARD__HTTP__CORS_ORIGINS", &format!("http://{page}")),
        ("SWITCHBOARD__NAMESPACES__LIM__MAX_STREAMS_PER_ID", "1"),
    ]);
    let nginx = Nginx::start(srv.addr);
    // The "limited" subscription's one slot, taken: it is refused 429.
    let held = common::StreamClient::open(srv.addr, "lim:chromium");
    assert_eq!(held.status, 200);
    let browser = chromium::Browser::open(&format!(
        "http://{page}/?proxy=http://127.0.0.1:{}&direct={}&fallback=1500",
        nginx.port,
        srv.url()
    ));
    let mut dt = browser.devtools();
    // While the proxied subscription waits for a welcome the proxy holds,
    // messages are published to it: the fallback must not lose them (the
    // client anchored on the id's position before it opened the stream).
    wait_report(
        &mut dt,
        Duration::from_secs(20),
        "the proxied one connecting",
        |r| {
            states(r, "proxied")
                .iter()
                .any(|s| s["state"] == "connecting" && s["transport"] == "sse")
        },
    );
    std::thread::sleep(Duration::from_millis(1000));
    let early: Vec<String> = (1..=3).map(|k| format!("early-{k}")).collect();
    for msg in &early {
        srv.send("chromium-proxied", msg);
    }
    let open_on = |r: &Value, run: &str, transport: &str| {
        states(r, run)
            .iter()
            .any(|s| s["state"] == "open" && s["transport"] == transport)
    };
    wait_report(&mut dt, Duration::from_secs(30), "every subscription open", |r| {
        open_on(r, "proxied", "poll") && open_on(r, "direct", "sse") && open_on(r, "ws", "websocket")
    });
    // EventSource hid the 429; the client's probe (one fetch) learnt it.
    let refused = wait_report(&mut dt, Duration::from_secs(10), "the 429 learnt", |r| {
        states(r, "limited").iter().any(|s| s["status"] == 429)
    });
    drop(held);
    wait_report(
        &mut dt,
        Duration::from_secs(20),
        "limited open once the slot is free",
        |r| open_on(r, "limited", "sse"),
    );
    let limited = states(&refused, "limited");
    assert!(
        limited.iter().all(|s| s["state"] != "closed"),
        "a 429 is retried: {limited:?}"
    );
    println!("limited: {}", json!(limited));
    // What was published before the fallback reaches the page first.
    let r = wait_report(&mut dt, Duration::from_secs(20), "the early messages", |r| {
        message_count(r, "proxied") >= early.len()
    });
    let got: Vec<&str> = r["proxied"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["data"].as_str().unwrap())
        .collect();
    assert_eq!(got, early, "the messages published before the fallback");
    let runs = ["proxied", "direct", "ws"];
    let before: Vec<usize> = {
        let r = read_report(&mut dt);
        runs.iter().map(|run| message_count(&r, run)).collect()
    };
    let sent: Vec<String> = (1..=30).map(tricky).collect();
    for msg in &sent {
        for run in runs {
            srv.send(&format!("chromium-{run}"), msg);
        }
    }
    let report = wait_report(&mut dt, Duration::from_secs(40), "30 messages each", |r| {
        runs.iter()
            .zip(&before)
            .all(|(run, n)| message_count(r, run) >= n + sent.len())
    });
    drop(browser);
    for (run, transport) in [("proxied", "poll"), ("direct", "sse"), ("ws", "websocket")] {
        let got: Vec<&Value> = report[run]["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| !m["data"].as_str().unwrap().starts_with("early-"))
            .collect();
        let datas: Vec<&str> = got.iter().map(|m| m["data"].as_str().unwrap()).collect();
        assert_eq!(datas, sent, "{run}: every message once, in order");
        assert!(got.iter().all(|m| m["transport"] == transport), "{run}: {got:?}");
        assert_eq!(report[run]["gaps"], json!([]), "{run}");
        assert_eq!(report[run]["errors"], json!([]), "{run}");
        println!(
            "{run}: {} messages over {transport}; states {}",
            datas.len(),
            report[run]["states"]
        );
    }
    // Behind the buffering proxy: SSE first, never open (the welcome was
    // held), then long-poll for good.
    let proxied = states(&report, "proxied");
    assert_eq!(proxied[0]["transport"], "sse", "{proxied:?}");
    assert!(
        proxied
            .iter()
            .any(|s| s["state"] == "connecting" && s["transport"] == "poll" && s["fallbackFrom"] == "sse"),
        "{proxied:?}"
    );
    assert!(
        !proxied
            .iter()
            .any(|s| s["state"] == "open" && s["transport"] == "sse"),
        "{proxied:?}"
    );
    // Straight to switchboard: SSE throughout (it had as long to fall back).
    let direct = states(&report, "direct");
    assert!(direct.iter().all(|s| s["transport"] == "sse"), "{direct:?}");
    let st = srv.stats();
    println!("server: {}", st["transports"]);
}
