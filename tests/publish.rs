//! Issue 21: a publisher cannot exhaust the server. A flood of broadcasts
//! against the real binary is pushed back with 503s, memory stays bounded
//! and comes back, the server keeps answering; an `Idempotency-Key` makes
//! a repeated publish harmless.

mod common;

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use common::process::Proc;
use common::{StreamClient, TestServer, request, settings};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_switchboard");

/// Streams held during the flood.
const STREAMS: usize = 2000;

/// Connections pipelining broadcasts.
const PUBLISHERS: usize = 4;

/// How long they flood.
const FLOOD: Duration = Duration::from_secs(6);

/// Requests each publisher writes before it reads their answers.
const PIPELINE: usize = 32;

fn stats(addr: SocketAddr) -> Value {
    request(addr, "GET", "/stats", &[], b"").unwrap().json()
}

/// Holds `n` streams from a few threads that read everything they get.
fn readers(addr: SocketAddr, n: usize, stop: &Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<u64>> {
    (0..4)
        .map(|t| {
            let stop = Arc::clone(stop);
            std::thread::spawn(move || {
                let mut socks: Vec<TcpStream> = (0..n / 4)
                    .map(|i| {
                        let mut s = TcpStream::connect(addr).unwrap();
                        write!(s, "GET /test/r{t}x{i} HTTP/1.1\r\nhost: t\r\n\r\n").unwrap();
                        s.set_nonblocking(true).unwrap();
                        s
                    })
                    .collect();
                let mut buf = vec![0u8; 64 * 1024];
                let mut total = 0u64;
                while !stop.load(Relaxed) {
                    let mut idle = true;
                    for s in &mut socks {
                        while let Ok(k) = s.read(&mut buf) {
                            if k == 0 {
                                break;
                            }
                            total += k as u64;
                            idle = false;
                        }
                    }
                    if idle {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                }
                total
            })
        })
        .collect()
}

/// Pipelines `POST /broadcast` for [`FLOOD`]; counts the answers by status.
fn publisher(addr: SocketAddr, statuses: Arc<[AtomicU64; 600]>, retry_after: Arc<AtomicU64>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let body = "b".repeat(100);
    let one = format!("POST /broadcast HTTP/1.1\r\nhost: t\r\ncontent-length: 100\r\n\r\n{body}");
    let batch = one.repeat(PIPELINE);
    let end = Instant::now() + FLOOD;
    while Instant::now() < end {
        s.write_all(batch.as_bytes()).unwrap();
        for _ in 0..PIPELINE {
            let res = common::read_response(&mut r).unwrap();
            statuses[usize::from(res.status)].fetch_add(1, Relaxed);
            if res.status == 503 && res.header("retry-after") == Some("1") {
                retry_after.fetch_add(1, Relaxed);
            }
        }
    }
}

/// The flood of issue 21, bounded: 2,000 streams that read everything, and
/// 4 connections pipelining 100-byte broadcasts for 6 s. The old server
/// answered every one 200 and grew from 10 to ~500 MB; now the backlog
/// bound (`publish.max_backlog`, 20,000 deliveries here) answers the
/// excess 503 with `Retry-After`, RSS stays within a stated bound, `/healthz`
/// answers within a second throughout, and afterwards the backlog is empty,
/// the books balance, and the memory has come back.
#[test]
fn a_broadcast_flood_is_pushed_back_and_memory_stays_bounded() {
    let mut cmd = Command::new(BIN);
    cmd.env("SWITCHBOARD__SERVER__PORT", "0")
        .env("SWITCHBOARD__SERVER__WORKERS", "2")
        .env("SWITCHBOARD__PUBLISH__MAX_BACKLOG", "20000")
        .env("SWITCHBOARD__PUBLISH__WAIT_MS", "200");
    let (server, addrs) = Proc::start(cmd);
    let addr = addrs[0];
    // `/stats` is on the internal listener.
    let admin = server.wait_admin();
    let stop = Arc::new(AtomicBool::new(false));
    let held = readers(addr, STREAMS, &stop);
    let deadline = Instant::now() + Duration::from_secs(20);
    while stats(admin)["connections"]["active"] != STREAMS {
        assert!(Instant::now() < deadline, "streams not open: {}", stats(admin));
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    let before = stats(admin)["memory"]["rss_bytes"].as_u64().unwrap();

    let statuses: Arc<[AtomicU64; 600]> = Arc::new(std::array::from_fn(|_| AtomicU64::new(0)));
    let retry_after = Arc::new(AtomicU64::new(0));
    let floods: Vec<_> = (0..PUBLISHERS)
        .map(|_| {
            let (statuses, retry_after) = (Arc::clone(&statuses), Arc::clone(&retry_after));
            std::thread::spawn(move || publisher(addr, statuses, retry_after))
        })
        .collect();
    // Meanwhile: health within a second, and the peak RSS and backlog.
    let (mut peak, mut peak_backlog, mut slowest) = (before, 0, Duration::ZERO);
    let end = Instant::now() + FLOOD;
    while Instant::now() < end {
        let t = Instant::now();
        let h = request(addr, "GET", "/healthz", &[], b"").unwrap();
        slowest = slowest.max(t.elapsed());
        assert_eq!(h.status, 200);
        let st = stats(admin);
        peak = peak.max(st["memory"]["rss_bytes"].as_u64().unwrap());
        peak_backlog = peak_backlog.max(st["publish"]["backlog"].as_u64().unwrap());
        std::thread::sleep(Duration::from_millis(100));
    }
    for f in floods {
        f.join().unwrap();
    }
    let ok = statuses[200].load(Relaxed);
    let refused = statuses[503].load(Relaxed);
    let other: u64 = statuses.iter().map(|s| s.load(Relaxed)).sum::<u64>() - ok - refused;
    // The books: every accepted broadcast is written or dropped, none lost.
    let deadline = Instant::now() + Duration::from_secs(30);
    let after = loop {
        let st = stats(admin);
        let m = &st["messages"];
        let done = m["written"].as_u64().unwrap() + m["dropped"].as_u64().unwrap();
        if st["publish"]["backlog"] == 0 && done == m["delivered"].as_u64().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "the backlog did not drain: {st}");
        std::thread::sleep(Duration::from_millis(100));
    };
    std::thread::sleep(Duration::from_secs(1));
    let settled = stats(admin)["memory"]["rss_bytes"].as_u64().unwrap();
    stop.store(true, Relaxed);
    let read: u64 = held.into_iter().map(|h| h.join().unwrap()).sum();
    drop(server);
    let mb = |b: u64| b / 1_000_000;
    println!(
        "broadcasts: {ok} answered 200, {refused} answered 503 ({} with Retry-After), {other} other; \
         RSS before {} MB, peak {} MB, after {} MB; backlog peak {peak_backlog}; slowest /healthz {slowest:?}; \
         {} MB read by the streams; {}",
        retry_after.load(Relaxed),
        mb(before),
        mb(peak),
        mb(settled),
        mb(read),
        after["messages"]
    );
    assert_eq!(other, 0, "only 200 and 503");
    assert!(ok > 0, "some broadcasts were taken");
    assert!(
        refused > 0,
        "the publisher outran 2,000 streams and was pushed back"
    );
    assert_eq!(retry_after.load(Relaxed), refused, "every 503 says Retry-After");
    assert_eq!(after["publish"]["rejected"], refused);
    // 20,000 queued deliveries and what the streams hold pending: well
    // under 100 MB (the old server grew by ~500 MB in this flood).
    assert!(
        peak - before < 100_000_000,
        "RSS grew by {} MB",
        mb(peak - before)
    );
    assert!(peak_backlog <= 20_000, "backlog {peak_backlog}");
    assert!(
        settled < before + 40_000_000,
        "RSS {} MB after, {} MB before",
        mb(settled),
        mb(before)
    );
    assert!(slowest < Duration::from_secs(1), "/healthz took {slowest:?}");
    assert_eq!(
        after["messages"]["delivered"].as_u64().unwrap(),
        ok * STREAMS as u64,
        "every accepted broadcast went to every stream"
    );
}

/// A publish repeated with the same `Idempotency-Key` gets the first
/// answer and delivers nothing; a malformed key is refused; a publish the
/// backlog refused does not keep its key.
#[test]
fn an_idempotency_key_delivers_once() {
    let mut s = settings();
    s.publish.max_backlog = 1;
    s.publish.wait_ms = 0;
    let srv = TestServer::start(s);
    let mut c = StreamClient::open(srv.addr, "idem");
    c.line();
    // As a client that honours Retry-After would: with a backlog of one and
    // no wait, a send right behind another may find its delivery not yet
    // taken (503, nothing delivered, the key not kept) and is sent again.
    let send = |key: &str, body: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let r = request(
                srv.addr,
                "POST",
                "/send/idem",
                &[("idempotency-key", key)],
                body.as_bytes(),
            )
            .unwrap();
            if r.status != 503 || Instant::now() > deadline {
                return r;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let first = send("a1", "one");
    assert_eq!(first.status, 200);
    assert_eq!(first.header("idempotent-replayed"), None);
    let again = send("a1", "one");
    assert_eq!(
        (again.status, again.header("idempotent-replayed")),
        (200, Some("true"))
    );
    assert_eq!(again.json(), first.json());
    // The same key for another message, or another id: refused, not replayed.
    let reused = send("a1", "not one");
    assert_eq!(reused.status, 422, "{}", reused.text());
    assert!(reused.error().contains("different request"), "{}", reused.error());
    let other_id = request(
        srv.addr,
        "POST",
        "/send/other",
        &[("idempotency-key", "a1")],
        b"one",
    )
    .unwrap();
    assert_eq!(other_id.status, 422);
    assert_eq!(send("a2", "two").status, 200);
    assert_eq!(c.line(), "Recvd msg #1: 'one'");
    assert_eq!(c.line(), "Recvd msg #2: 'two'");
    let st = srv.stats();
    assert_eq!(st["messages"]["routed"], 2, "{st}");
    assert_eq!(st["publish"]["idempotent_replays"], 1, "{st}");
    for (headers, why) in [
        (vec![("idempotency-key", "")], "1 to 255"),
        (vec![("idempotency-key", "a b")], "1 to 255"),
        (
            vec![("idempotency-key", "x"), ("idempotency-key", "y")],
            "more than once",
        ),
    ] {
        let r = request(srv.addr, "POST", "/send/idem", &headers, b"x").unwrap();
        assert_eq!(r.status, 400, "{headers:?}");
        assert!(r.error().contains(why), "{}", r.error());
    }
    // 1,000 more streams, a backlog of one and no wait: a keyed send
    // pipelined right behind a broadcast to them finds the backlog full
    // and is refused (503), and its key is not kept.
    let stop = Arc::new(AtomicBool::new(false));
    let held = readers(srv.addr, 1000, &stop);
    let deadline = Instant::now() + Duration::from_secs(20);
    while srv.stats()["connections"]["active"] != 1001 {
        assert!(Instant::now() < deadline, "streams not open");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut refused = None;
    for n in 0..50 {
        let mut p = TcpStream::connect(srv.addr).unwrap();
        p.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(
            p,
            "POST /broadcast HTTP/1.1\r\nhost: t\r\ncontent-length: 1\r\n\r\nb\
             POST /send/idem HTTP/1.1\r\nhost: t\r\nidempotency-key: s{n}\r\ncontent-length: 7\r\n\r\nthree{n:02}"
        )
        .unwrap();
        let mut r = BufReader::new(p);
        assert_eq!(common::read_response(&mut r).unwrap().status, 200);
        let res = common::read_response(&mut r).unwrap();
        if res.status == 503 {
            refused = Some((n, res));
            break;
        }
        assert_eq!(res.status, 200, "{}", res.text());
    }
    let (n, res) = refused.expect("a full backlog refuses");
    assert_eq!(res.header("retry-after"), Some("1"));
    assert!(res.error().starts_with("publish backlog full"), "{}", res.error());
    stop.store(true, Relaxed);
    for h in held {
        h.join().unwrap();
    }
    // Its retry with the same key is a first attempt, once there is room.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let retry = send(&format!("s{n}"), &format!("three{n:02}"));
        if retry.status == 200 {
            assert_eq!(retry.header("idempotent-replayed"), None);
            break;
        }
        assert!(Instant::now() < deadline, "{}", retry.text());
        std::thread::sleep(Duration::from_millis(20));
    }
    // The stream also got the broadcasts and the attempts before the refused
    // one; up to a last marker, the refused one's message once.
    // (With a backlog of one and no wait, the marker is retried until the
    // retry's own delivery has been taken.)
    let deadline = Instant::now() + Duration::from_secs(10);
    while request(srv.addr, "POST", "/send/idem", &[], b"end")
        .unwrap()
        .status
        != 200
    {
        assert!(Instant::now() < deadline, "the end marker was never taken");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut lines: Vec<String> = Vec::new();
    while !lines.last().is_some_and(|l| l.ends_with("'end'")) {
        lines.push(c.line());
    }
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.ends_with(&format!("'three{n:02}'")))
            .count(),
        1,
        "{lines:?}"
    );
}
