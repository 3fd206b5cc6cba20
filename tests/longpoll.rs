//! Long-poll (`GET /test/{id}?transport=poll`, docs/transports.md) over
//! real sockets against a real server: an answer at once, a wait, a
//! timeout, a gap, the same on another process of a `--processes 4`
//! fleet, tokens and CORS, presence and its linger, the per-address
//! limit, and 1,000 polls waiting at once.

#[path = "common/app.rs"]
mod app;
#[path = "common/cluster.rs"]
mod cluster;
mod common;

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cluster::{WAIT, prefix, processes, send_ok, wait_cluster};
use common::{READ_TIMEOUT, RedisServer, Response, TestServer, read_response, request, settings};
use serde_json::Value;

/// One poll; its answer.
fn poll(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Response {
    request(addr, "GET", path, headers, b"").unwrap()
}

/// A poll's JSON answer, checked to be one.
fn answer(r: &Response) -> Value {
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("cache-control"), Some("no-store"));
    r.json()
}

/// The `data` of an answer's messages, in order.
fn data(v: &Value) -> Vec<String> {
    v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["data"].as_str().unwrap().to_owned())
        .collect()
}

/// A poll that runs while the test goes on.
fn poll_later(addr: SocketAddr, path: &str) -> JoinHandle<Response> {
    let path = path.to_owned();
    std::thread::spawn(move || poll(addr, &path, &[]))
}

/// Polls of `server` waiting now (`streams.active`: a waiting poll is a
/// stream).
fn wait_active(server: &TestServer, n: u64) {
    server.wait_stats(WAIT, |s| s["connections"]["active"] == n);
}

fn send(server: &TestServer, id: &str, text: &str) -> u64 {
    let r = server.post(&format!("/send/{id}"), text);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["event_id"].as_u64().unwrap()
}

fn short_polls() -> switchboard::config::Settings {
    let mut s = settings();
    s.stream.poll_timeout_ms = 1500;
    s
}

#[test]
fn kept_messages_are_answered_at_once_in_order_with_their_event_ids() {
    let server = TestServer::start(short_polls());
    let first = send(&server, "a", "zero");
    let e1 = send(&server, "a", "one");
    let e2 = send(&server, "a", "two 'quoted' \"and\" é");
    let started = Instant::now();
    let v = answer(&poll(
        server.addr,
        &format!("/test/a?transport=poll&since={first}"),
        &[],
    ));
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "did not answer at once"
    );
    assert_eq!(
        v,
        serde_json::json!({
            "id": "a",
            "messages": [{"event_id": e1, "data": "one"}, {"event_id": e2, "data": "two 'quoted' \"and\" é"}],
            "last_event_id": e2,
            "gap": false,
        })
    );
    // Last-Event-ID does the same as since.
    let v = answer(&poll(
        server.addr,
        "/test/a?transport=poll",
        &[("last-event-id", &e1.to_string())],
    ));
    assert_eq!(data(&v), ["two 'quoted' \"and\" é"]);
    // Nothing after the last: it waits, and times out empty.
    let started = Instant::now();
    let v = answer(&poll(
        server.addr,
        &format!("/test/a?transport=poll&since={e2}"),
        &[],
    ));
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(1400) && waited < Duration::from_millis(3000),
        "answered after {waited:?}, not after poll_timeout_ms (1500)"
    );
    assert_eq!(
        v,
        serde_json::json!({"id": "a", "messages": [], "last_event_id": e2, "gap": false})
    );
    assert_eq!(server.stats()["transports"]["poll_opened"], 3);
}

#[test]
fn a_waiting_poll_is_answered_by_the_next_message() {
    let server = TestServer::start(short_polls());
    let e0 = send(&server, "w", "before");
    let waiting = poll_later(server.addr, &format!("/test/w?transport=poll&since={e0}"));
    wait_active(&server, 1);
    let sent = Instant::now();
    let e1 = send(&server, "w", "next");
    let v = answer(&waiting.join().unwrap());
    assert!(
        sent.elapsed() < Duration::from_millis(500),
        "not answered when the message came"
    );
    assert_eq!(
        v["messages"],
        serde_json::json!([{"event_id": e1, "data": "next"}])
    );
    assert_eq!(v["last_event_id"], e1);
    assert_eq!(v["gap"], false);
    // Counted as a stream's message is.
    server.wait_stats(WAIT, |s| {
        s["messages"]["written"] == 1 && s["connections"]["active"] == 0
    });
}

#[test]
fn without_since_a_poll_waits_for_the_next_message_and_tells_the_last_event_id() {
    let server = TestServer::start(short_polls());
    let e0 = send(&server, "n", "old");
    // Nothing comes: empty, with the id it stands at (the old message is
    // not replayed).
    let v = answer(&poll(server.addr, "/test/n?transport=poll", &[]));
    assert_eq!(data(&v), Vec::<String>::new());
    let at = v["last_event_id"].as_u64().unwrap();
    assert!(at >= e0, "last_event_id {at} is before the last message {e0}");
    let waiting = poll_later(server.addr, "/test/n?transport=poll");
    wait_active(&server, 1);
    let e1 = send(&server, "n", "new");
    let v = answer(&waiting.join().unwrap());
    assert_eq!(
        v["messages"],
        serde_json::json!([{"event_id": e1, "data": "new"}])
    );
    // Polling on from there loses nothing between polls.
    let e2 = send(&server, "n", "between");
    let v = answer(&poll(
        server.addr,
        &format!("/test/n?transport=poll&since={e1}"),
        &[],
    ));
    assert_eq!(
        v["messages"],
        serde_json::json!([{"event_id": e2, "data": "between"}])
    );
}

#[test]
fn since_beyond_history_is_answered_with_a_gap_and_what_is_kept() {
    let mut s = short_polls();
    s.history.size = 2;
    let server = TestServer::start(s);
    let e0 = send(&server, "g", "m0");
    for i in 1..=4 {
        send(&server, "g", &format!("m{i}"));
    }
    let v = answer(&poll(
        server.addr,
        &format!("/test/g?transport=poll&since={e0}"),
        &[],
    ));
    assert_eq!(v["gap"], true, "{v}");
    assert_eq!(data(&v), ["m3", "m4"]);
    // An event id from before this server started, with nothing kept for
    // the id: the gap is told with the next message (or the timeout), not
    // at once: a client would otherwise poll in a loop.
    let started = Instant::now();
    let waiting = poll_later(server.addr, "/test/empty?transport=poll&since=1");
    wait_active(&server, 1);
    let e5 = send(&server, "empty", "first");
    let v = answer(&waiting.join().unwrap());
    assert!(
        started.elapsed() < Duration::from_millis(1400),
        "not answered by the message"
    );
    assert_eq!(v["gap"], true, "{v}");
    assert_eq!(
        v["messages"],
        serde_json::json!([{"event_id": e5, "data": "first"}])
    );
    // A quiet id's timeout answer stands where the server is, so polling
    // on from there is not told of the same gap again, and a resume point
    // never falls behind the history's time to live.
    let v = answer(&poll(server.addr, "/test/quiet?transport=poll&since=1", &[]));
    assert_eq!(v["gap"], true, "{v}");
    let at = v["last_event_id"].as_u64().unwrap();
    assert!(
        at >= e5,
        "last_event_id {at} is still before this server's messages"
    );
    let v = answer(&poll(
        server.addr,
        &format!("/test/quiet?transport=poll&since={at}"),
        &[],
    ));
    assert_eq!(v["gap"], false, "{v}");
    assert!(v["last_event_id"].as_u64().unwrap() >= at);
}

/// An answer holds at most half of `stream.max_pending_bytes` of
/// messages (the first always): a large replay comes over several polls,
/// each from the last message of the one before, every message once, in
/// order. Without the budget, an answer too big to send would be cut poll
/// after poll, and the client would never get past it.
#[test]
fn a_large_replay_comes_over_several_answers() {
    let mut s = short_polls();
    s.stream.max_pending_bytes = 16_384;
    s.history.size = 100;
    let server = TestServer::start(s);
    let e0 = send(&server, "big", "start");
    let sent: Vec<String> = (0..40).map(|i| format!("{i:02}{}", "x".repeat(1500))).collect();
    for m in &sent {
        send(&server, "big", m);
    }
    let (mut since, mut got, mut answers) = (e0, Vec::new(), 0);
    while got.len() < sent.len() {
        answers += 1;
        assert!(answers <= 20, "{} of {} after 20 answers", got.len(), sent.len());
        let r = poll(
            server.addr,
            &format!("/test/big?transport=poll&since={since}"),
            &[],
        );
        assert!(r.body.len() <= 8192 + 1600, "an answer of {} bytes", r.body.len());
        let v = answer(&r);
        assert_eq!(v["gap"], false, "{v}");
        got.extend(data(&v));
        since = v["last_event_id"].as_u64().unwrap();
    }
    assert_eq!(got, sent);
    assert!(answers >= 5, "{answers} answers for 60 KB at 8 KB each");
    assert_eq!(server.stats()["connections"]["slow_disconnects"], 0);
}

/// `?wait=0` answers at once with where the id stands (what a client
/// that starts fresh anchors on); `?wait=<ms>` shortens the wait.
#[test]
fn wait_bounds_a_polls_wait() {
    let server = TestServer::start(short_polls());
    let e0 = send(&server, "at", "old");
    let started = Instant::now();
    let v = answer(&poll(server.addr, "/test/at?transport=poll&wait=0", &[]));
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "did not answer at once"
    );
    assert_eq!(data(&v), Vec::<String>::new());
    assert_eq!(v["gap"], false);
    let anchor = v["last_event_id"].as_u64().unwrap();
    assert!(anchor >= e0, "{anchor} is before the last message {e0}");
    // From the anchor, nothing is missed: what came since is answered.
    let e1 = send(&server, "at", "new");
    let v = answer(&poll(
        server.addr,
        &format!("/test/at?transport=poll&since={anchor}&wait=0"),
        &[],
    ));
    assert_eq!(
        v["messages"],
        serde_json::json!([{"event_id": e1, "data": "new"}])
    );
    let started = Instant::now();
    let v = answer(&poll(
        server.addr,
        &format!("/test/at?transport=poll&since={e1}&wait=300"),
        &[],
    ));
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_millis(1200),
        "answered after {waited:?}, not after wait=300"
    );
    assert_eq!(v["last_event_id"], e1);
    // More than poll_timeout_ms is poll_timeout_ms.
    let started = Instant::now();
    answer(&poll(
        server.addr,
        &format!("/test/at?transport=poll&since={e1}&wait=60000"),
        &[],
    ));
    assert!(started.elapsed() < Duration::from_millis(3000));
    for bad in ["/test/at?transport=poll&wait=soon", "/test/at?wait=0"] {
        let r = poll(server.addr, bad, &[]);
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert!(r.error().starts_with("wait must be a number"), "{}", r.text());
    }
}

#[test]
fn bad_requests_are_refused_with_a_reason() {
    let server = TestServer::start(short_polls());
    let r = poll(server.addr, "/test/x?transport=poll&since=abc", &[]);
    assert_eq!(r.status, 400);
    assert_eq!(r.error(), "since must be an event id (a decimal number)");
    let r = poll(server.addr, "/test/x?transport=pol", &[]);
    assert_eq!(r.status, 400);
    assert!(
        r.error().starts_with("transport must be \"poll\""),
        "{}",
        r.text()
    );
    let r = poll(
        server.addr,
        "/test/x?transport=poll",
        &[
            ("upgrade", "websocket"),
            ("connection", "upgrade"),
            ("sec-websocket-version", "13"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ],
    );
    assert_eq!(r.status, 400);
    assert!(r.error().contains("not a WebSocket upgrade"), "{}", r.text());
}

/// A poll that comes second on a keep-alive connection reaches
/// actix-web's route, which serves it the same, and keeps the
/// connection; an HTTP/1.0 poll (nginx's default to its upstream) gets
/// the answer close-delimited.
#[test]
fn a_poll_on_a_kept_alive_connection_and_on_http_1_0() {
    let server = TestServer::start(short_polls());
    let e0 = send(&server, "k", "a");
    let e1 = send(&server, "k", "b");
    let s = TcpStream::connect(server.addr).unwrap();
    s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    let mut r = BufReader::new(s);
    // The lean path takes a connection's first request (and answers a
    // poll with `connection: close`): a /healthz goes first.
    r.get_mut()
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: t\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&mut r).unwrap().text(), "ok");
    for round in 0..2 {
        r.get_mut()
            .write_all(
                format!("GET /test/k?transport=poll&since={e0} HTTP/1.1\r\nhost: t\r\n\r\n").as_bytes(),
            )
            .unwrap();
        let v = answer(&read_response(&mut r).unwrap());
        assert_eq!(
            v["messages"],
            serde_json::json!([{"event_id": e1, "data": "b"}]),
            "round {round}"
        );
    }
    assert_eq!(server.stats()["connections"]["fallback"], 2);
    let mut s = TcpStream::connect(server.addr).unwrap();
    s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    s.write_all(format!("GET /test/k?transport=poll&since={e0} HTTP/1.0\r\n\r\n").as_bytes())
        .unwrap();
    let r = read_response(&mut BufReader::new(s)).unwrap();
    assert_eq!(r.header("transfer-encoding"), None);
    assert_eq!(data(&answer(&r)), ["b"]);
}

#[test]
fn a_refused_token_is_answered_with_cors_headers_and_the_preflight_allows_the_poll() {
    let mut s = short_polls();
    s.http.cors_origins = "http://app.example".into();
    s.auth.subscribe_secret = "poll-secret-0123456789-0123456789".into();
    let server = TestServer::start(s);
    let origin = [("origin", "http://app.example")];
    let r = poll(server.addr, "/test/t?transport=poll", &origin);
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://app.example")
    );
    assert!(
        r.header("www-authenticate")
            .is_some_and(|v| v.starts_with("Bearer"))
    );
    // The page may read why, and (on a 429 or 503) how long to wait.
    assert_eq!(
        r.header("access-control-expose-headers"),
        Some("Retry-After, WWW-Authenticate")
    );
    let other = app::hs256("poll-secret-0123456789-0123456789", "someone-else");
    let r = poll(
        server.addr,
        &format!("/test/t?transport=poll&token={other}"),
        &origin,
    );
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://app.example")
    );
    // The preflight of a fetch that polls with Authorization and
    // Last-Event-ID.
    let r = request(
        server.addr,
        "OPTIONS",
        "/test/t?transport=poll",
        &[
            ("origin", "http://app.example"),
            ("access-control-request-method", "GET"),
            ("access-control-request-headers", "authorization, last-event-id"),
        ],
        b"",
    )
    .unwrap();
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://app.example")
    );
    let allowed = r
        .header("access-control-allow-headers")
        .unwrap()
        .to_ascii_lowercase();
    assert!(
        allowed.contains("authorization") && allowed.contains("last-event-id"),
        "{allowed}"
    );
    // With the token: answered, with CORS.
    let token = app::hs256("poll-secret-0123456789-0123456789", "t");
    let e = send(&server, "t", "hi");
    let bearer = format!("Bearer {token}");
    let r = poll(
        server.addr,
        "/test/t?transport=poll&since=1",
        &[("origin", "http://app.example"), ("authorization", &bearer)],
    );
    let v = answer(&r);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://app.example")
    );
    assert_eq!(v["last_event_id"], e);
    assert_eq!(data(&v), ["hi"]);
}

/// A waiting poll counts in presence; its client stays present for
/// `stream.poll_linger_ms` after its answer and is not counted twice
/// when it polls again; then it is gone.
#[test]
fn a_poll_client_stays_present_between_its_polls() {
    let mut s = short_polls();
    s.stream.poll_linger_ms = 1500;
    s.debug.fault_injection = true;
    let server = TestServer::start(s);
    let presence = || {
        server.admin_get("/presence/p").json()["streams"]
            .as_u64()
            .unwrap()
    };
    let e0 = send(&server, "p", "x");
    let waiting = poll_later(server.addr, &format!("/test/p?transport=poll&since={e0}"));
    wait_active(&server, 1);
    assert_eq!(presence(), 1);
    send(&server, "p", "y");
    answer(&waiting.join().unwrap());
    wait_active(&server, 0);
    assert_eq!(presence(), 1, "gone from presence at once after its answer");
    // Its next poll takes the place back: still one.
    let waiting = poll_later(server.addr, "/test/p?transport=poll");
    wait_active(&server, 1);
    assert_eq!(presence(), 1, "counted twice while polling again");
    send(&server, "p", "z");
    answer(&waiting.join().unwrap());
    wait_active(&server, 0);
    assert_eq!(presence(), 1);
    // No poll within the linger: gone.
    let started = Instant::now();
    while presence() != 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "still present 5 s after its last answer"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        started.elapsed() >= Duration::from_millis(1000),
        "left before its linger"
    );
    // A question of where the id stands (`wait=0`, the client's first
    // ask) is no client between polls: it does not linger.
    answer(&poll(server.addr, "/test/p?transport=poll&wait=0", &[]));
    wait_active(&server, 0);
    assert_eq!(presence(), 0);
    // A Router that crashes and restarts while a client lingers still
    // lets it go when its time is up.
    let waiting = poll_later(server.addr, "/test/p?transport=poll");
    wait_active(&server, 1);
    send(&server, "p", "last");
    answer(&waiting.join().unwrap());
    wait_active(&server, 0);
    assert_eq!(presence(), 1);
    assert_eq!(server.admin_post("/admin/crash/router", "").status, 202);
    let started = Instant::now();
    while presence() != 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "lingers for ever after a Router restart"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Polls from one address are bounded by `limits.streams_per_ip` like
/// streams: one more waiting poll is 429.
#[test]
fn polls_from_one_address_are_bounded_by_the_per_address_limit() {
    let mut s = short_polls();
    s.limits.streams_per_ip = 3;
    s.limits.exempt = String::new();
    let server = TestServer::start(s);
    let waiting: Vec<_> = (0..3)
        .map(|_| poll_later(server.addr, "/test/l?transport=poll"))
        .collect();
    wait_active(&server, 3);
    let r = poll(server.addr, "/test/l?transport=poll", &[]);
    assert_eq!(r.status, 429, "{}", r.text());
    assert!(r.header("retry-after").is_some());
    send(&server, "l", "go");
    for w in waiting {
        assert_eq!(data(&answer(&w.join().unwrap())), ["go"]);
    }
    // The places are given back with the answers.
    wait_active(&server, 0);
    assert_eq!(
        poll(server.addr, "/test/l?transport=poll&since=1", &[]).status,
        200
    );
}

/// 1,000 polls wait at once over 100 ids; one message to each id
/// answers every one of them, and each gets exactly its id's message.
#[test]
fn a_thousand_polls_wait_at_once_and_each_gets_its_message() {
    let mut s = settings();
    s.stream.poll_timeout_ms = 30_000;
    let server = TestServer::start(s);
    let mut polls = Vec::new();
    for i in 0..1000 {
        let mut c = TcpStream::connect(server.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let head = format!(
            "GET /test/many{}?transport=poll HTTP/1.1\r\nhost: t\r\n\r\n",
            i % 100
        );
        c.write_all(head.as_bytes()).unwrap();
        polls.push((i % 100, c));
    }
    server.wait_stats(Duration::from_secs(10), |s| s["connections"]["active"] == 1000);
    let presence = server.admin_get("/presence/many7").json();
    assert_eq!(presence["streams"], 10, "{presence}");
    let events: Vec<u64> = (0..100)
        .map(|id| {
            let r = server.post(&format!("/send/many{id}"), &format!("for {id}"));
            assert_eq!(r.json()["delivered"], 10);
            r.json()["event_id"].as_u64().unwrap()
        })
        .collect();
    for (id, c) in polls {
        let v = answer(&read_response(&mut BufReader::new(c)).unwrap());
        assert_eq!(
            v["messages"],
            serde_json::json!([{"event_id": events[id], "data": format!("for {id}")}]),
            "poll of many{id}"
        );
    }
    server.wait_stats(WAIT, |s| {
        s["connections"]["active"] == 0 && s["messages"]["written"] == 1000
    });
}

/// On a `--processes 4` fleet, polls go to whichever process the kernel
/// picks: every poll gets exactly what came after its `since`, from the
/// fleet's history, whichever process published it.
#[test]
fn polls_through_a_four_process_fleet_are_exact() {
    let redis = RedisServer::start();
    let p = prefix("poll4");
    let (_parent, addr) = processes(&redis, &p, 4);
    let mut last = send_ok(addr, "fp", "start");
    let mut got = Vec::new();
    let mut sent = Vec::new();
    for round in 0..12 {
        for i in 0..2 {
            let text = format!("r{round}m{i}");
            sent.push((send_ok(addr, "fp", &text), text));
        }
        let v = answer(&poll(addr, &format!("/test/fp?transport=poll&since={last}"), &[]));
        assert_eq!(v["gap"], false, "round {round}: {v}");
        for m in v["messages"].as_array().unwrap() {
            got.push((
                m["event_id"].as_u64().unwrap(),
                m["data"].as_str().unwrap().to_owned(),
            ));
        }
        last = v["last_event_id"].as_u64().unwrap();
    }
    assert_eq!(got, sent);
    // And a waiting poll is answered by a publish to whichever process:
    // several rounds, so both the poll and the publish land elsewhere.
    for round in 0..6 {
        let waiting = poll_later(addr, &format!("/test/fp?transport=poll&since={last}"));
        wait_cluster(addr, WAIT, "the poll waiting", |c| c["totals"]["streams"] == 1);
        let e = send_ok(addr, "fp", &format!("live{round}"));
        let v = answer(&waiting.join().unwrap());
        assert_eq!(
            v["messages"],
            serde_json::json!([{"event_id": e, "data": format!("live{round}")}])
        );
        last = e;
        wait_cluster(addr, WAIT, "the poll answered", |c| c["totals"]["streams"] == 0);
    }
    // The polls were served by more than one process (the test proves
    // nothing if the kernel gave every one to the process that published).
    let c = wait_cluster(addr, WAIT, "18 polls counted", |c| {
        c["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["opened"].as_u64().unwrap())
            .sum::<u64>()
            == 18
    });
    let serving = c["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["opened"] != 0)
        .count();
    assert!(serving >= 2, "all on one process: {c}");
}
