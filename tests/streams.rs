//! Streams over real sockets: wire format, ticks, routing, broadcast, cleanup,
//! slow readers, graceful shutdown.

mod common;

use std::io::Write;
use std::time::Duration;

use common::{StreamClient, TestServer, settings};

#[test]
fn lean_stream_format_and_ticks() {
    let mut s = settings();
    s.stream.tick_interval_ms = 100;
    let srv = TestServer::start(s);
    let mut c = srv.open("foo");
    assert_eq!(c.status, 200);
    assert_eq!(c.header("transfer-encoding"), Some("chunked"));
    assert_eq!(c.header("content-type"), Some("text/plain; charset=utf-8"));
    assert_eq!(c.line(), "Switchboard welcomes you! Your Id: foo");
    assert_eq!(c.line(), "Chunk 1 for id foo");
    assert_eq!(c.line(), "Chunk 2 for id foo");
    let stats = srv.stats();
    assert_eq!(stats["connections"]["active"], 1);
    assert_eq!(
        stats["connections"]["fallback"], 0,
        "curl-style request takes the lean path"
    );
}

#[test]
fn fallback_stream_has_the_same_format() {
    let mut s = settings();
    s.stream.tick_interval_ms = 100;
    let srv = TestServer::start(s);
    let mut c = StreamClient::open_fallback(srv.addr, "bar");
    assert_eq!(c.status, 200);
    assert_eq!(c.header("transfer-encoding"), Some("chunked"));
    assert_eq!(c.line(), "Switchboard welcomes you! Your Id: bar");
    assert_eq!(c.line(), "Chunk 1 for id bar");
    let r = srv.post("/send/bar", "hi");
    assert_eq!(r.json()["delivered"], 1);
    assert_eq!(c.message(), "Recvd msg #2: 'hi'");
    assert_eq!(srv.stats()["connections"]["fallback"], 1);
}

#[test]
fn one_id_on_two_connections_gets_every_message() {
    let srv = TestServer::start(settings());
    let mut a = srv.open("dup");
    let mut b = StreamClient::open_fallback(srv.addr, "dup");
    let mut other = srv.open("other");
    for c in [&mut a, &mut b, &mut other] {
        c.line();
    }
    let r = srv.post("/send/dup", "hello");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.json_sans_event(),
        serde_json::json!({"id": "dup", "delivered": 2})
    );
    assert_eq!(a.line(), "Recvd msg #1: 'hello'");
    assert_eq!(b.line(), "Recvd msg #1: 'hello'");
    let r = srv.post("/send/other", "second");
    assert_eq!(r.json()["delivered"], 1);
    assert_eq!(other.line(), "Recvd msg #1: 'second'");
    assert_eq!(srv.post("/send/nobody", "x").json()["delivered"], 0);
}

#[test]
fn broadcast_reaches_every_stream() {
    let srv = TestServer::start(settings());
    let mut clients: Vec<_> = (0..5).map(|i| srv.open(&format!("b{i}"))).collect();
    clients.push(StreamClient::open_fallback(srv.addr, "bf"));
    for c in &mut clients {
        c.line();
    }
    let r = srv.post("/broadcast", "all 'of' you");
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), serde_json::json!({"delivered": 6}));
    for c in &mut clients {
        assert_eq!(c.line(), "Recvd msg #1: 'all 'of' you'");
    }
    // A stream counts its delivery just after the write the client has
    // already read: /stats catches up within microseconds, not before.
    let stats = srv.wait_stats(Duration::from_secs(1), |s| s["messages"]["delivered"] == 6);
    assert_eq!(stats["messages"]["routed"], 1);
    assert_eq!(stats["messages"]["delivered"], 6);
}

/// A broadcast to more streams than the Router hands out at once (its
/// window is 64) reaches each of them once, and broadcasts sent one after
/// the other arrive in that order on every stream.
#[test]
fn broadcasts_past_the_fanout_window_arrive_once_each_in_order() {
    let srv = TestServer::start(settings());
    let mut clients: Vec<_> = (0..300).map(|i| srv.open(&format!("w{i}"))).collect();
    for c in &mut clients {
        c.line();
    }
    for k in 1..=3 {
        assert_eq!(
            srv.post("/broadcast", &format!("round {k}")).json()["delivered"],
            300
        );
    }
    for c in &mut clients {
        for k in 1..=3 {
            assert_eq!(c.line(), format!("Recvd msg #{k}: 'round {k}'"));
        }
    }
    let stats = srv.wait_stats(Duration::from_secs(2), |s| s["messages"]["delivered"] == 900);
    assert_eq!(stats["messages"]["delivered"], 900, "{stats}");
    assert_eq!(stats["messages"]["dropped"], 0, "{stats}");
}

#[test]
fn disconnected_streams_leave_the_router_within_a_second() {
    // Ticks are a minute apart: detection must come from the read side.
    let srv = TestServer::start(settings());
    let mut lean = srv.open("gone");
    let mut fallback = StreamClient::open_fallback(srv.addr, "gone");
    lean.line();
    fallback.line();
    assert_eq!(srv.stats()["connections"]["active"], 2);
    drop(lean);
    drop(fallback);
    let s = srv.wait_stats(Duration::from_secs(1), |s| s["connections"]["active"] == 0);
    assert_eq!(s["connections"]["active"], 0, "{s}");
    assert_eq!(s["connections"]["closed"], 2);
    assert_eq!(srv.post("/send/gone", "x").json()["delivered"], 0);
}

#[test]
fn stream_limit_answers_503() {
    let mut s = settings();
    s.stream.max_streams = 2;
    let srv = TestServer::start(s);
    let mut a = srv.open("l1");
    let mut b = srv.open("l2");
    a.line();
    b.line();
    let r = srv.get("/test/l3");
    assert_eq!(r.status, 503);
    assert!(r.error().contains("stream limit of 2"), "{}", r.text());
    drop(a);
    srv.wait_stats(Duration::from_secs(1), |s| s["connections"]["active"] == 1);
    let mut c = srv.open("l3");
    assert_eq!(c.line(), "Switchboard welcomes you! Your Id: l3");
}

#[test]
fn slow_reader_is_disconnected_at_the_bound_and_fast_readers_keep_up() {
    let mut s = settings();
    s.stream.max_pending_bytes = 256 * 1024;
    s.message.max_bytes = 60_000;
    let srv = TestServer::start(s);

    // A client with a tiny receive window that never reads.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(&srv.addr.into()).unwrap();
    let mut slow: std::net::TcpStream = sock.into();
    slow.write_all(b"GET /test/slow HTTP/1.1\r\nhost: t\r\n\r\n")
        .unwrap();

    let mut fast = srv.open("fast");
    fast.line();
    srv.wait_stats(Duration::from_secs(2), |s| s["connections"]["active"] == 2);

    let msg = "x".repeat(50_000);
    let mut sent = 0;
    // Enough to fill both kernels' socket buffers and then the pending bound.
    while sent < 400 && srv.stats()["connections"]["slow_disconnects"] == 0 {
        assert_eq!(srv.post("/broadcast", &msg).status, 200);
        sent += 1;
        assert_eq!(fast.line(), format!("Recvd msg #{sent}: '{msg}'"));
    }
    // More than the bound went out before the cut: the kernel took its share.
    assert!(
        sent * msg.len() > 256 * 1024,
        "disconnected after only {sent} messages"
    );
    let s = srv.wait_stats(Duration::from_secs(2), |s| {
        s["connections"]["slow_disconnects"] == 1
    });
    assert_eq!(s["connections"]["slow_disconnects"], 1, "{s}");
    assert!(s["messages"]["dropped"].as_u64().unwrap() >= 1, "{s}");
    assert_eq!(s["connections"]["active"], 1, "only the fast reader is left: {s}");
    // The fast reader is unaffected.
    assert_eq!(srv.post("/send/fast", "still here").json()["delivered"], 1);
    assert!(fast.message().ends_with("'still here'"));
    drop(slow);
}

#[test]
fn shutdown_ends_every_stream_with_a_final_chunk() {
    let mut s = settings();
    s.server.shutdown_timeout_ms = 30_000;
    s.server.head_timeout_ms = 30_000;
    let mut srv = TestServer::start(s);
    // A client that connects and never sends a head must not hold shutdown
    // up until its 30 s head timeout (nor the 30 s shutdown timeout).
    let _silent = std::net::TcpStream::connect(srv.addr).unwrap();
    let mut lean = srv.open("s1");
    let mut fallback = StreamClient::open_fallback(srv.addr, "s2");
    lean.line();
    fallback.line();
    let started = std::time::Instant::now();
    srv.shutdown();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(lean.read_to_end().unwrap(), Vec::<String>::new());
    assert_eq!(fallback.read_to_end().unwrap(), Vec::<String>::new());
    assert!(
        std::net::TcpStream::connect(srv.addr).is_err(),
        "no longer accepting"
    );
}
