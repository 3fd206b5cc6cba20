//! Hostile and odd clients over real sockets: they hold nothing they do not
//! pay for, both stream paths apply one set of head rules, HTTP/1.0 gets a
//! body it can read, and the message books balance.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{TestServer, read_chunk, read_head, read_response, request, settings};
use proptest::prelude::*;

/// Reads whatever the server sends until it closes (or `within` passes);
/// returns the bytes and whether it closed.
fn read_until_closed(s: &mut TcpStream, within: Duration) -> (Vec<u8>, bool) {
    s.set_read_timeout(Some(within)).unwrap();
    let mut out = Vec::new();
    let closed = match s.read_to_end(&mut out) {
        Ok(_) => true,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    };
    (out, closed)
}

/// POSTs up to `count` 3 KB messages to `/send/{id}` over one keep-alive
/// connection, stopping early once `done` says so (checked every 500);
/// returns the sum of the answers' `delivered`.
fn publish_big(srv: &TestServer, id: &str, count: u32, done: impl Fn() -> bool) -> u64 {
    let mut publisher = BufReader::new(TcpStream::connect(srv.addr).unwrap());
    let mut handed = 0u64;
    for i in 0..count {
        if i % 500 == 0 && done() {
            break;
        }
        let body = format!("message number {i} {}", "x".repeat(3000));
        let req = format!(
            "POST /send/{id} HTTP/1.1\r\nhost: t\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        publisher.get_mut().write_all(req.as_bytes()).unwrap();
        let res = read_response(&mut publisher).unwrap();
        assert_eq!(res.status, 200, "{}", res.text());
        handed += res.json()["delivered"].as_u64().unwrap();
    }
    handed
}

/// Item 2: a body that stops arriving gets 408 within the body timeout and
/// the connection is closed; its permit and `http_active` slot come back.
#[test]
fn a_stalled_request_body_gets_408_and_is_closed() {
    let mut s = settings();
    s.server.body_timeout_ms = 300;
    let srv = TestServer::start(s);
    let mut stream = srv.open("listener");
    stream.line();
    for head in [
        "POST /send/listener HTTP/1.1\r\nhost: t\r\ncontent-length: 10\r\n\r\nabc",
        "POST /send/listener HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n",
        "POST /broadcast HTTP/1.1\r\nhost: t\r\ncontent-length: 10\r\n\r\n",
    ] {
        let started = Instant::now();
        let mut c = TcpStream::connect(srv.addr).unwrap();
        c.write_all(head.as_bytes()).unwrap();
        let (bytes, closed) = read_until_closed(&mut c, Duration::from_secs(3));
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.starts_with("HTTP/1.1 408"), "{head:?}: {text}");
        assert!(text.contains("request body not received within 300 ms"), "{text}");
        assert!(closed, "{head:?}: connection left open");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }
    // The one HTTP connection left is the `/stats` request itself.
    let stats = srv.wait_stats(Duration::from_secs(2), |s| s["connections"]["http_active"] == 1);
    assert_eq!(stats["connections"]["http_active"], 1, "{stats}");
    assert_eq!(stats["messages"]["routed"], 0, "{stats}");
}

/// Item 2: a stalled body does not hold graceful shutdown for its timeout:
/// it is cut with 503 and the server stops within a second.
#[test]
fn a_stalled_body_does_not_hold_shutdown() {
    let mut s = settings();
    s.server.body_timeout_ms = 60_000;
    s.server.shutdown_timeout_ms = 30_000;
    let mut srv = TestServer::start(s);
    let mut c = TcpStream::connect(srv.addr).unwrap();
    // `Expect: 100-continue`: the interim answer says the handler is
    // reading the body, so shutdown cannot come before the request exists
    // (a connection is counted in `http_active` before its head is read).
    c.write_all(b"POST /send/x HTTP/1.1\r\nhost: t\r\ncontent-length: 10\r\nexpect: 100-continue\r\n\r\n")
        .unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let continued = b"HTTP/1.1 100 Continue\r\n\r\n";
    let mut interim = vec![0u8; continued.len()];
    std::io::Read::read_exact(&mut c, &mut interim).unwrap();
    assert_eq!(interim, continued, "{}", String::from_utf8_lossy(&interim));
    c.write_all(b"abc").unwrap();
    let started = Instant::now();
    srv.shutdown();
    // Held up, shutdown would take its 30 s timeout.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "shutdown took {:?}",
        started.elapsed()
    );
    let (bytes, _) = read_until_closed(&mut c, Duration::from_secs(2));
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
}

/// Item 3: heads still arriving take no stream slot, and do not hold
/// shutdown.
#[test]
fn heads_still_arriving_take_no_stream_slot_and_do_not_hold_shutdown() {
    let mut s = settings();
    s.stream.max_streams = 5;
    s.server.head_timeout_ms = 60_000;
    s.server.shutdown_timeout_ms = 30_000;
    let mut srv = TestServer::start(s);
    let stalled: Vec<TcpStream> = (0..5)
        .map(|i| {
            let mut c = TcpStream::connect(srv.addr).unwrap();
            c.write_all(format!("GET /test/h{i} HTTP/1.1\r\nHost: x\r\n").as_bytes())
                .unwrap();
            c
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    let mut real = srv.open("real");
    assert_eq!(real.status, 200);
    assert!(real.line().starts_with("Switchboard welcomes you!"));
    assert_eq!(srv.stats()["connections"]["active"], 1);
    drop(real);
    srv.wait_stats(Duration::from_secs(2), |s| s["connections"]["active"] == 0);
    let started = Instant::now();
    srv.shutdown();
    // Held up, shutdown would take its 30 s timeout.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "shutdown took {:?}",
        started.elapsed()
    );
    drop(stalled);
}

/// Item 4: an HTTP/1.0 stream is close-delimited (no chunked encoding), on
/// the lean path and through actix-web, with the same lines.
#[test]
fn http10_streams_are_close_delimited() {
    let mut srv = TestServer::start(settings());
    // Status line, headers, and the reader positioned at the body.
    // `fallback`: the stream request comes second on a keep-alive
    // connection, which only actix-web's route serves.
    let open = |path: &str, fallback: bool| {
        let mut c = TcpStream::connect(srv.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut r = BufReader::new(c.try_clone().unwrap());
        if fallback {
            c.write_all(b"GET /healthz HTTP/1.1\r\nhost: t\r\n\r\n").unwrap();
            assert_eq!(common::read_response(&mut r).unwrap().text(), "ok");
        }
        c.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
            .unwrap();
        let mut status = String::new();
        r.read_line(&mut status).unwrap();
        let mut headers = Vec::new();
        loop {
            let mut l = String::new();
            r.read_line(&mut l).unwrap();
            match l.trim_end().split_once(':') {
                Some((k, v)) => headers.push((k.trim().to_owned(), v.trim().to_owned())),
                None => break,
            }
        }
        (status, headers, r)
    };
    let (lean_status, lean_headers, mut lean) = open("/test/ten", false);
    let (fb_status, fb_headers, mut fallback) = open("/test/ten", true);
    for (status, headers) in [(&lean_status, &lean_headers), (&fb_status, &fb_headers)] {
        assert!(
            status.starts_with("HTTP/1.0 200") || status.starts_with("HTTP/1.1 200"),
            "{status}"
        );
        let h = |n: &str| {
            headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(n))
                .map(|(_, v)| v.clone())
        };
        assert_eq!(h("transfer-encoding"), None, "{headers:?}");
        assert_eq!(h("content-length"), None, "{headers:?}");
        // Closing is HTTP/1.0's default; only keep-alive would be said.
        assert_ne!(h("connection").as_deref(), Some("keep-alive"), "{headers:?}");
    }
    assert!(lean_status.starts_with("HTTP/1.0 200"), "{lean_status}");
    for r in [&mut lean, &mut fallback] {
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        assert_eq!(l, "Switchboard welcomes you! Your Id: ten\n");
    }
    assert_eq!(srv.post("/send/ten", "hello").json()["delivered"], 2);
    for r in [&mut lean, &mut fallback] {
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        assert_eq!(l, "Recvd msg #1: 'hello'\n");
    }
    srv.shutdown();
    for r in [&mut lean, &mut fallback] {
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
    }
}

/// Item 6: the bearer scheme is case-insensitive; two `Authorization`
/// headers are refused with 400.
#[test]
fn auth_scheme_is_case_insensitive_and_repeats_are_refused() {
    let mut s = settings();
    s.auth.publish_token = "sekrit".into();
    let srv = TestServer::start(s);
    for value in ["Bearer sekrit", "bearer sekrit", "BEARER sekrit"] {
        let r = request(srv.addr, "POST", "/send/x", &[("authorization", value)], b"hi").unwrap();
        assert_eq!(r.status, 200, "{value}: {}", r.text());
    }
    let r = request(
        srv.addr,
        "POST",
        "/send/x",
        &[("authorization", "bearer wrong")],
        b"hi",
    )
    .unwrap();
    assert_eq!(r.status, 401);
    let two = [
        ("authorization", "Bearer sekrit"),
        ("authorization", "Bearer other"),
    ];
    let r = request(srv.addr, "POST", "/send/x", &two, b"hi").unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.error(), "more than one Authorization header");
    let two = [
        ("authorization", "Bearer sekrit"),
        ("authorization", "Bearer sekrit"),
    ];
    let r = request(srv.addr, "POST", "/broadcast", &two, b"hi").unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
}

/// Item 7: 10,000 messages to a client that never reads. Every message
/// `/send` counted as delivered ends in exactly one of `written` and
/// `dropped`, and what the client finally reads is what was counted written.
#[test]
fn message_books_balance_for_a_client_that_never_reads() {
    // Messages large enough that 10,000 of them overflow any kernel buffer.
    let mut s = settings();
    s.stream.max_pending_bytes = 8192;
    let srv = TestServer::start(s);
    let mut reader = TcpStream::connect(srv.addr).unwrap();
    reader
        .write_all(b"GET /test/sink HTTP/1.1\r\nhost: t\r\n\r\n")
        .unwrap();
    srv.wait_stats(Duration::from_secs(2), |s| s["connections"]["active"] == 1);

    // Each answer says how many streams the message was handed to (1 while
    // the stream lives, then 0).
    let handed = publish_big(&srv, "sink", 10_000, || false);
    assert!(handed > 0);

    // The client reads at last: everything the kernel was given, then EOF.
    let (bytes, closed) = read_until_closed(&mut reader, Duration::from_secs(5));
    assert!(closed, "the slow stream should have been cut");
    // Count the whole chunks only: the last may have been cut mid-way.
    let mut body = std::io::Cursor::new(bytes);
    read_head(&mut body).unwrap();
    let mut received = 0u64;
    while let Ok(Some(chunk)) = read_chunk(&mut body) {
        received += u64::from(chunk.starts_with(b"Recvd msg #"));
    }

    let stats = srv.wait_stats(Duration::from_secs(2), |s| s["connections"]["active"] == 0);
    assert_eq!(stats["connections"]["slow_disconnects"], 1, "{stats}");
    let written = assert_books_balance(&stats, handed);
    assert_eq!(received, written, "{stats}");
}

/// The books of one cut stream at rest: `/stats` delivered is what `/send`
/// answered (`handed`), and each of those was written or dropped, some
/// dropped. Returns `written`.
fn assert_books_balance(stats: &serde_json::Value, handed: u64) -> u64 {
    let m = &stats["messages"];
    let (delivered, written, dropped) = (
        m["delivered"].as_u64().unwrap(),
        m["written"].as_u64().unwrap(),
        m["dropped"].as_u64().unwrap(),
    );
    assert_eq!(delivered, handed, "{stats}");
    assert_eq!(written + dropped, delivered, "{stats}");
    assert!(dropped > 0, "{stats}");
    written
}

/// Item 7, on actix-web's fallback route: a client that never reads is cut
/// there too (its connection closed, not held), and its books balance.
#[test]
fn a_fallback_stream_that_never_reads_is_cut_and_its_books_balance() {
    let mut s = settings();
    s.stream.max_pending_bytes = 8192;
    let srv = TestServer::start(s);
    // Second on a keep-alive connection: actix-web's route serves it.
    let mut reader = TcpStream::connect(srv.addr).unwrap();
    reader
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: t\r\n\r\nGET /test/sink HTTP/1.1\r\nhost: t\r\n\r\n")
        .unwrap();
    srv.wait_stats(Duration::from_secs(2), |s| s["connections"]["active"] == 1);
    let handed = publish_big(&srv, "sink", 5_000, || {
        srv.stats()["connections"]["slow_disconnects"] == 1
    });
    let stats = srv.wait_stats(Duration::from_secs(3), |s| {
        s["connections"]["active"] == 0 && s["connections"]["http_active"] == 1
    });
    assert_eq!(stats["connections"]["slow_disconnects"], 1, "{stats}");
    assert_eq!(stats["connections"]["fallback"], 1, "{stats}");
    // Only the `/stats` request itself: the cut stream's connection is gone.
    assert_eq!(stats["connections"]["http_active"], 1, "{stats}");
    let (_, closed) = read_until_closed(&mut reader, Duration::from_secs(5));
    assert!(closed, "the cut stream's connection is still open");
    assert_books_balance(&stats, handed);
}

/// Item 5: the same heads, sent to the lean path (`/test/p<n>` as a
/// connection's first request) and to actix-web's fallback route (the same
/// request second on a keep-alive connection, which the lean path never
/// sees), get the same status. One known difference: a repeated
/// `Content-Length` (every value 0) is legal (RFC 9112 §6.3) and the lean
/// path takes it, where actix-http's parser refuses it (400).
mod one_set_of_rules {
    use super::*;

    /// One server for every case (max head 1,024 bytes so heads cross it).
    fn server() -> SocketAddr {
        static SERVER: OnceLock<TestServer> = OnceLock::new();
        SERVER
            .get_or_init(|| {
                let mut s = settings();
                s.server.max_head_bytes = 1024;
                s.server.head_timeout_ms = 2000;
                TestServer::start(s)
            })
            .addr
    }

    /// The status the server answers `request` with; `second`: sent as the
    /// second request on a keep-alive connection, after a `/healthz`.
    fn status(addr: SocketAddr, request: &[u8], second: bool) -> u16 {
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut r = BufReader::new(c.try_clone().unwrap());
        if second {
            c.write_all(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
            let first = common::read_response(&mut r).unwrap();
            assert_eq!((first.status, first.text()), (200, "ok".to_owned()));
        }
        // The server may answer and close before it has read everything.
        let _ = c.write_all(request);
        let mut line = String::new();
        let _ = r.read_line(&mut line);
        line.split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "no status line: {line:?} for {:?}",
                    String::from_utf8_lossy(request)
                )
            })
    }

    /// Complete header lines, good and bad, with either line end.
    fn line() -> impl Strategy<Value = Vec<u8>> {
        let text = prop_oneof![
            6 => Just(&b"Host: a"[..]),
            4 => Just(&b"X-A: b c"[..]),
            2 => Just(&b"x:"[..]),
            1 => Just(&b"Content-Length: 0"[..]),
            1 => Just(&b"Transfer-Encoding: chunked"[..]),
            1 => Just(&b" folded"[..]),
            1 => Just(&b"Bad Name: x"[..]),
            1 => Just(&b":empty"[..]),
            1 => Just(&b"nocolon"[..]),
            1 => Just(&b"V: a\0b"[..]),
            1 => Just(&b"V: \x01"[..]),
            1 => Just(&b"V: a\rb"[..]),
            1 => Just(&b"V: \t\x80\xff~"[..]),
        ];
        let end = prop_oneof![Just(&b"\r\n"[..]), Just(&b"\n"[..])];
        (text, end).prop_map(|(t, e)| [t, e].concat())
    }

    /// A head's header lines and blank line: arbitrary lines; or a valid
    /// head with a header that takes it past the limit (last, since the two
    /// paths stop reading at different places and a refused byte after the
    /// limit would be judged by one and not the other); or too many lines.
    fn headers() -> impl Strategy<Value = Vec<u8>> {
        let end = prop_oneof![Just(&b"\r\n"[..]), Just(&b"\n"[..])];
        let lines = proptest::collection::vec(line(), 0..12).prop_map(|l| l.concat());
        let big = Just(format!("Host: a\r\nX-Big: {}\r\n", "b".repeat(1100)).into_bytes());
        let many = Just(format!("Host: a\r\n{}", "a: b\r\n".repeat(100)).into_bytes());
        (prop_oneof![8 => lines, 1 => big, 1 => many], end).prop_map(|(h, e)| [&h[..], e].concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

        #[test]
        fn both_paths_answer_the_same(headers in headers(), n in 0u32..1000, http10 in any::<bool>()) {
            let addr = server();
            let version = if http10 { "HTTP/1.0" } else { "HTTP/1.1" };
            let request = [format!("GET /test/p{n} {version}\r\n").as_bytes(), &headers].concat();
            let (a, b) = (status(addr, &request, false), status(addr, &request, true));
            let lengths = String::from_utf8_lossy(&headers).to_ascii_lowercase().matches("content-length").count();
            if lengths > 1 {
                prop_assert_eq!(b, 400, "actix-http refuses a repeated Content-Length");
            } else {
                prop_assert_eq!(a, b, "lean {} vs actix-web {} for {:?}", a, b, String::from_utf8_lossy(&headers));
            }
        }
    }

    /// Issue 22: one admission decision for both paths. With subscriber
    /// tokens and a CORS list, the same stream requests get the same status
    /// as a connection's first request (lean) and as its second (actix-web):
    /// a missing, bad or conflicting token, a resume point that is not a
    /// number, two `Authorization` headers, a WebSocket from a page not on
    /// the list; and a good token.
    #[test]
    fn both_paths_admit_and_refuse_streams_alike() {
        let mut s = settings();
        s.auth.subscribe_secret = "issue-22-admission-secret".into();
        s.http.cors_origins = "http://good.example".into();
        let srv = TestServer::start(s);
        let token = |id: &str| {
            switchboard::token::mint(
                "issue-22-admission-secret",
                &[id.to_owned()],
                Duration::from_secs(600),
            )
            .unwrap()
        };
        let good = token("adm");
        let ws = "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\
                  Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";
        let cases: Vec<(String, u16)> = vec![
            (String::new(), 401),
            (format!("Authorization: Bearer {}x\r\n", good), 401),
            (format!("Authorization: Bearer {}\r\n", token("other")), 401),
            (
                format!("Authorization: Bearer {good}\r\nLast-Event-ID: soon\r\n"),
                400,
            ),
            (
                format!("Authorization: Bearer {good}\r\nAuthorization: Bearer {good}\r\n"),
                400,
            ),
            (
                format!("Authorization: Bearer {good}\r\nOrigin: http://evil.example\r\n"),
                200,
            ),
            (format!("Authorization: Bearer {good}\r\n"), 200),
        ];
        for (headers, want) in &cases {
            let request = format!("GET /test/adm HTTP/1.1\r\nHost: a\r\n{headers}\r\n");
            let (lean, fallback) = (
                status(srv.addr, request.as_bytes(), false),
                status(srv.addr, request.as_bytes(), true),
            );
            assert_eq!((lean, fallback), (*want, *want), "{headers:?}");
        }
        // A WebSocket: refused for an origin not on the list on the lean
        // path; on the fallback path it cannot be one at all (400), since
        // only a connection's first request can upgrade.
        let request = format!(
            "GET /test/adm?token={good} HTTP/1.1\r\nHost: a\r\nOrigin: http://evil.example\r\n{ws}\r\n"
        );
        assert_eq!(status(srv.addr, request.as_bytes(), false), 403);
        let request = format!("GET /test/adm?token={good} HTTP/1.1\r\nHost: a\r\n{ws}\r\n");
        assert_eq!(status(srv.addr, request.as_bytes(), false), 101);
        assert_eq!(status(srv.addr, request.as_bytes(), true), 400);
    }
}

/// Item 1: a client that sends part of a request line and goes away (FIN or
/// RST) frees its server socket at once, not at the head timeout: a flood
/// of them against a server with few descriptors does not lock others out.
#[test]
fn partial_request_lines_that_close_free_their_socket_at_once() {
    use std::os::unix::process::CommandExt as _;
    // The real binary, with few descriptors and a long head timeout.
    let mut cmd = std::process::Command::new("sh");
    cmd.args([
        "-c",
        &format!("ulimit -n 128 && exec {}", env!("CARGO_BIN_EXE_switchboard")),
    ])
    .env("SWITCHBOARD__SERVER__PORT", "0")
    // Not the default 9000: another process (or test) may hold it.
    .env("SWITCHBOARD__SERVER__ADMIN_PORT", "0")
    .env("SWITCHBOARD__SERVER__WORKERS", "1")
    .env("SWITCHBOARD__SERVER__HEAD_TIMEOUT_MS", "20000")
    .env("SWITCHBOARD__LOG__FORMAT", "json")
    .env("SWITCHBOARD__LOG__LEVEL", "info")
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped());
    // Its own process group, so nothing it leaves behind outlives the test.
    cmd.process_group(0);
    let mut child = cmd.spawn().unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let addr: SocketAddr = loop {
        let mut line = String::new();
        assert!(err.read_line(&mut line).unwrap() > 0, "server exited");
        if line.contains("switchboard listening") {
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            let addrs = v["fields"]["addrs"]
                .as_str()
                .unwrap()
                .trim_matches(['[', ']'])
                .to_owned();
            break addrs.split(", ").next().unwrap().parse().unwrap();
        }
    };
    std::thread::spawn(move || for _ in err.lines() {});
    let fds = || {
        std::fs::read_dir(format!("/proc/{}/fd", child.id()))
            .unwrap()
            .count()
    };
    let baseline = fds();

    // 400 connections, more than the server has descriptors: each sends a
    // partial request line, half close (FIN), half reset (RST).
    let started = Instant::now();
    for i in 0..400 {
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(b"GET /test/x").unwrap();
        if i % 2 == 0 {
            socket2::SockRef::from(&c)
                .set_linger(Some(Duration::ZERO))
                .unwrap();
        }
    }
    // A real client is served well before the head timeout.
    let r = request(addr, "GET", "/healthz", &[], b"").unwrap();
    assert_eq!(r.status, 200);
    let served = started.elapsed();
    assert!(served < Duration::from_secs(3), "served after {served:?}");
    // And the server holds no socket for the clients that left.
    let deadline = Instant::now() + Duration::from_secs(2);
    while fds() > baseline && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(fds() <= baseline, "{} descriptors, baseline {baseline}", fds());

    // Gone within 100 ms (the peek backoff is at most 50 ms): one at a time.
    let mut worst = Duration::ZERO;
    for _ in 0..20 {
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(b"GET /test/y HTTP/1").unwrap();
        let deadline = Instant::now() + Duration::from_secs(1);
        while fds() == baseline && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(c);
        let closed = Instant::now();
        while fds() > baseline && Instant::now() < deadline + Duration::from_secs(1) {
            std::thread::sleep(Duration::from_millis(1));
        }
        worst = worst.max(closed.elapsed());
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        worst < Duration::from_millis(200),
        "slowest noticed after {worst:?}"
    );
    eprintln!("flood served after {served:?}; slowest close noticed after {worst:?}");
}

/// What real clients send on a GET is accepted on both paths
/// (`Content-Length: 0`, an empty `te:`); a real body is not; too many
/// header lines are called that; a fragment in a target is refused, not
/// cut off; and the fallback's 431 closes its connection like the lean one.
#[test]
fn legal_heads_pass_and_the_refusals_say_what_they_are() {
    let mut s = settings();
    s.server.max_head_bytes = 1024;
    let srv = TestServer::start(s);
    let erlang = "content-length: 0\r\nte: \r\nhost: 127.0.0.1\r\nconnection: keep-alive\r\n\r\n";
    let lean = common::StreamClient::open_raw(srv.addr, &format!("GET /test/erl HTTP/1.1\r\n{erlang}"));
    assert_eq!(lean.status, 200);
    let mut c = TcpStream::connect(srv.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        c,
        "GET /healthz HTTP/1.1\r\nhost: t\r\n\r\nGET /test/erl HTTP/1.1\r\n{erlang}"
    )
    .unwrap();
    let mut r = BufReader::new(c);
    assert_eq!(read_response(&mut r).unwrap().status, 200);
    assert_eq!(read_head(&mut r).unwrap().0, 200);
    let body = request(srv.addr, "GET", "/test/x", &[("content-length", "3")], b"abc").unwrap();
    assert_eq!(
        (body.status, body.error()),
        (
            400,
            "invalid request head: a stream request has no body (Content-Length other than 0)".to_owned()
        )
    );
    let many = (0..97).map(|n| format!("x{n}: y\r\n")).collect::<String>();
    let mut c = TcpStream::connect(srv.addr).unwrap();
    write!(c, "GET /test/x HTTP/1.1\r\nhost: t\r\n{many}\r\n").unwrap();
    let res = read_response(&mut BufReader::new(c)).unwrap();
    assert_eq!(
        (res.status, res.error()),
        (431, "request head has more than 96 header lines".to_owned())
    );
    let r = request(srv.addr, "POST", "/send/a#b", &[], b"hi").unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.error().contains("fragment"), "{}", r.error());
    assert_eq!(srv.stats()["messages"]["routed"], 0);
    // The fallback's 431 (a second request whose head is over the limit).
    let mut c = TcpStream::connect(srv.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let big = "b".repeat(1100);
    write!(
        c,
        "GET /healthz HTTP/1.1\r\nhost: t\r\n\r\nGET /test/x HTTP/1.1\r\nhost: t\r\nx-big: {big}\r\n\r\n"
    )
    .unwrap();
    let mut r = BufReader::new(c);
    assert_eq!(read_response(&mut r).unwrap().status, 200);
    assert_eq!(read_response(&mut r).unwrap().status, 431);
    let (_, closed) = read_until_closed(r.get_mut(), Duration::from_secs(3));
    assert!(closed, "the fallback's 431 leaves its connection open");
}

/// Issue 40: refusals of stream requests, asked as a connection's first
/// request (the lean path) and as its second on a keep-alive connection
/// (actix-web's fallback route).
mod issue_40 {
    use super::*;

    /// Sends `request` as a connection's first request or, with `second`,
    /// after a `/healthz` on the same connection; answers the status and,
    /// for a refusal, the `error` of its body.
    fn answer(addr: SocketAddr, request: &str, second: bool) -> (u16, String) {
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut r = BufReader::new(c.try_clone().unwrap());
        if second {
            c.write_all(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
            assert_eq!(read_response(&mut r).unwrap().status, 200);
        }
        c.write_all(request.as_bytes()).unwrap();
        let (status, headers) = read_head(&mut r).unwrap();
        if status == 200 {
            return (status, String::new());
        }
        let len = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; len];
        r.read_exact(&mut body).unwrap();
        let error = serde_json::from_slice::<serde_json::Value>(&body).unwrap()["error"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        (status, error)
    }

    /// A JWT of `header` and `claims`, signed with HS256 and `secret`
    /// whatever the header says (`alg: none` gets no signature at all).
    fn jwt(header: serde_json::Value, claims: serde_json::Value, secret: &str) -> String {
        use base64::Engine as _;
        let b64 = |v: &serde_json::Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap())
        };
        let message = format!("{}.{}", b64(&header), b64(&claims));
        if header["alg"] == "none" {
            return format!("{message}.");
        }
        let key = jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()).unwrap();
        let signature =
            jsonwebtoken::crypto::sign(message.as_bytes(), &key, jsonwebtoken::Algorithm::HS256).unwrap();
        format!("{message}.{signature}")
    }

    fn now() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    /// Findings 2 and 3: an `alg: none` token is refused for its algorithm,
    /// one without `exp` for that, not as "claims not of the expected
    /// form"; with `auth.subscribe_issuer` set, an `iss` given as a list
    /// (even one holding the issuer) is refused; unset, it is not looked at.
    #[test]
    fn tokens_are_refused_for_what_is_wrong_with_them() {
        let secret = "issue-40-secret";
        let mut s = settings();
        s.auth.subscribe_secret = secret.into();
        s.auth.subscribe_issuer = "https://id.example/".into();
        let strict = TestServer::start(s);
        let mut s = settings();
        s.auth.subscribe_secret = secret.into();
        let open = TestServer::start(s);
        let hs256 = serde_json::json!({"alg": "HS256", "typ": "JWT"});
        let exp = now() + 600;
        let iss = "https://id.example/";
        let none = jwt(
            serde_json::json!({"alg": "none", "typ": "JWT"}),
            serde_json::json!({"sub": "t40", "exp": exp, "iss": iss}),
            secret,
        );
        let no_exp = jwt(
            hs256.clone(),
            serde_json::json!({"sub": "t40", "iss": iss}),
            secret,
        );
        let listed = jwt(
            hs256.clone(),
            serde_json::json!({"sub": "t40", "exp": exp, "iss": [iss]}),
            secret,
        );
        let good = jwt(
            hs256,
            serde_json::json!({"sub": "t40", "exp": exp, "iss": iss}),
            secret,
        );
        let get = |token: &str| format!("GET /test/t40?token={token} HTTP/1.1\r\nHost: a\r\n\r\n");
        for second in [false, true] {
            let path = if second { "fallback" } else { "lean" };
            for (srv, token, want) in [
                (&strict, &none, "token alg none is not accepted"),
                (&open, &none, "token alg none is not accepted"),
                (&strict, &no_exp, "token has no exp claim"),
                (&open, &no_exp, "token has no exp claim"),
                (&strict, &listed, "token iss is not a string"),
            ] {
                let (status, error) = answer(srv.addr, &get(token), second);
                assert_eq!(status, 401, "{path}: {want}: {error}");
                assert!(
                    error.starts_with(&format!("subscriber token refused: {want}")),
                    "{path}: {error}"
                );
            }
            assert_eq!(
                answer(open.addr, &get(&listed), second).0,
                200,
                "{path}: iss not looked at"
            );
            assert_eq!(answer(strict.addr, &get(&good), second).0, 200, "{path}");
        }
    }

    /// Finding 4: a resume point is exactly a decimal number, after the
    /// query's percent-escapes are decoded (as the path's are), with the
    /// same answer on both paths; `Last-Event-ID` the same (no escapes in
    /// a header).
    #[test]
    fn since_and_last_event_id_are_exactly_decimal_numbers() {
        let srv = TestServer::start(settings());
        let query = |since: &str| format!("GET /test/s40?since={since} HTTP/1.1\r\nHost: a\r\n\r\n");
        let header = |id: &str| format!("GET /test/s40 HTTP/1.1\r\nHost: a\r\nLast-Event-ID: {id}\r\n\r\n");
        for second in [false, true] {
            let path = if second { "fallback" } else { "lean" };
            for since in ["12", "007", "%31%32", "18446744073709551615"] {
                assert_eq!(
                    answer(srv.addr, &query(since), second).0,
                    200,
                    "{path}: {since:?}"
                );
            }
            for since in [
                "+5",
                "%2B5",
                "-1",
                "%205",
                "5%20",
                "",
                "1e3",
                "0x5",
                "%3",
                "%",
                "18446744073709551616",
            ] {
                let (status, error) = answer(srv.addr, &query(since), second);
                assert_eq!(
                    (status, error.as_str()),
                    (400, "since must be an event id (a decimal number)"),
                    "{path}: {since:?}"
                );
            }
            for id in ["12", " 12 "] {
                assert_eq!(answer(srv.addr, &header(id), second).0, 200, "{path}: {id:?}");
            }
            for id in ["+5", "-1", "%31", "1 2", "18446744073709551616"] {
                let (status, error) = answer(srv.addr, &header(id), second);
                assert_eq!(
                    (status, error.as_str()),
                    (400, "Last-Event-ID must be an event id (a decimal number)"),
                    "{path}: {id:?}"
                );
            }
        }
    }
}
