//! The request API over real sockets: bad input, auth, `/dispatcher`
//! uniqueness, supervision of the Router and Counter.

mod common;

use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{StreamClient, TestServer, read_response, request, settings};

/// Sends raw bytes, returns the response and whether the server then closed.
fn raw(srv: &TestServer, bytes: &[u8]) -> (common::Response, bool) {
    let mut s = TcpStream::connect(srv.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(bytes).unwrap();
    let mut r = BufReader::new(s);
    let res = read_response(&mut r).unwrap();
    let mut rest = Vec::new();
    // EOF or a reset both mean closed; only a read timeout means still open.
    let closed = match r.read_to_end(&mut rest) {
        Ok(_) => true,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    };
    (res, closed)
}

#[test]
fn bad_input_gets_a_clear_4xx_and_disturbs_no_stream() {
    let mut s = settings();
    s.stream.max_id_len = 16;
    s.message.max_bytes = 100;
    s.server.head_timeout_ms = 1000;
    let srv = TestServer::start(s);
    let mut bystander = srv.open("bystander");
    bystander.line();

    let long_id = "a".repeat(17);
    for path in [
        "/test/",
        "/send/",
        &format!("/test/{long_id}"),
        "/test/a%20b",
        "/test/sp%C3%A9cial",
    ] {
        let r = if path.starts_with("/send") {
            srv.post(path, "x")
        } else {
            srv.get(path)
        };
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        assert!(r.error().starts_with("invalid id"), "{path}: {}", r.text());
    }
    let r = srv.post(&format!("/send/{long_id}"), "x");
    assert_eq!(
        (r.status, r.error()),
        (400, "invalid id: longer than 16 characters".into())
    );
    let r = srv.post("/send/a.b", "x");
    assert_eq!(r.status, 200, "dots are allowed");

    let r = srv.post("/send/bystander", &"x".repeat(101));
    assert_eq!(r.status, 413);
    assert!(r.error().contains("larger than 100 bytes"));
    let r = request(srv.addr, "POST", "/send/bystander", &[], &[0xff, 0xfe]).unwrap();
    assert_eq!(
        (r.status, r.error()),
        (400, "message body is not valid UTF-8".into())
    );
    for body in ["a\nb", "a\rb", "a\r\n"] {
        let r = srv.post("/send/bystander", body);
        assert_eq!(r.status, 400, "{body:?}");
        assert!(r.error().contains("CR or LF"));
    }
    assert_eq!(srv.post("/broadcast", "").status, 400);
    assert_eq!(srv.post("/broadcast", &"y".repeat(101)).status, 413);

    assert_eq!(srv.get("/nope").status, 404);
    assert_eq!(
        srv.admin_get("/admin/crash/router").status,
        404,
        "no fault injection by default"
    );
    let r = srv.get("/send/x");
    assert_eq!((r.status, r.header("allow")), (405, Some("POST")));
    let r = srv.post("/dispatcher", "");
    assert_eq!((r.status, r.header("allow")), (405, Some("GET")));
    assert_eq!(srv.post("/test/foo", "").status, 405);

    // Malformed heads: 4xx and the socket closed.
    let (r, closed) = raw(&srv, b"THIS IS NOT HTTP\r\n\r\n");
    assert_eq!(r.status, 400);
    assert!(closed);
    // Oversized head on the lean path.
    let big = format!("GET /test/big HTTP/1.1\r\nx-pad: {}\r\n\r\n", "p".repeat(10_000));
    let (r, closed) = raw(&srv, big.as_bytes());
    assert_eq!(r.status, 431, "{}", r.text());
    assert!(closed);
    // Oversized head through actix-web.
    let big = format!(
        "GET /dispatcher HTTP/1.1\r\nx-pad: {}\r\n\r\n",
        "p".repeat(200_000)
    );
    let (r, closed) = raw(&srv, big.as_bytes());
    assert!(r.status == 431 || r.status == 400, "{}", r.status);
    assert!(closed);
    // Heads that never complete: nothing at all, half a request line, half the headers.
    let partials = [
        &b""[..],
        b"GET /te",
        b"GET /test/slow HTTP/1.1\r\nhost: x\r\n",
        b"POST /send/x HTTP/1.1\r\n",
    ];
    std::thread::scope(|scope| {
        for partial in partials {
            let srv = &srv;
            scope.spawn(move || {
                let started = std::time::Instant::now();
                let (r, closed) = raw(srv, partial);
                let what = String::from_utf8_lossy(partial);
                assert_eq!(r.status, 408, "{what:?}");
                assert!(closed, "{what:?}");
                assert!(started.elapsed() < Duration::from_secs(3), "{what:?}");
            });
        }
    });

    // The bystander saw none of it and still gets its messages.
    assert_eq!(srv.post("/send/bystander", "fine").json()["delivered"], 1);
    assert_eq!(bystander.message(), "Recvd msg #1: 'fine'");
    assert_eq!(srv.stats()["connections"]["active"], 1);
}

#[test]
fn publish_token_guards_send_broadcast_and_admin() {
    let mut s = settings();
    s.auth.publish_token = "s3cret".into();
    s.debug.fault_injection = true;
    let srv = TestServer::start(s);
    let mut c = srv.open("auth");
    c.line();
    // /admin/* is an operator page: on the internal listener.
    for (addr, path) in [
        (srv.addr, "/send/auth"),
        (srv.addr, "/broadcast"),
        (srv.admin, "/admin/crash/counter"),
    ] {
        let r = request(addr, "POST", path, &[], b"m").unwrap();
        assert_eq!(r.status, 401, "{path}");
        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
        let r = request(addr, "POST", path, &[("authorization", "Bearer nope")], b"m").unwrap();
        assert_eq!(r.status, 401, "{path}");
    }
    assert_eq!(
        srv.stats()["actors"]["counter"]["restarts"],
        0,
        "unauthorized crash did nothing"
    );
    let ok = [("authorization", "Bearer s3cret")];
    let r = request(srv.addr, "POST", "/send/auth", &ok, b"m").unwrap();
    assert_eq!(r.json()["delivered"], 1);
    assert_eq!(c.line(), "Recvd msg #1: 'm'");
    let r = request(srv.addr, "POST", "/broadcast", &ok, b"b").unwrap();
    assert_eq!(r.json()["delivered"], 1);
    // Reading needs no token.
    assert_eq!(srv.get("/dispatcher").status, 200);
    assert_eq!(srv.admin_get("/stats").status, 200);
}

#[test]
fn no_token_means_open_publishing() {
    let srv = TestServer::start(settings());
    assert_eq!(srv.post("/send/x", "m").status, 200);
    assert_eq!(srv.post("/broadcast", "m").status, 200);
}

#[test]
fn dispatcher_counts_exactly_under_concurrency() {
    let srv = TestServer::start(settings());
    let addr = srv.addr;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut values: Vec<u64> = rt.block_on(async move {
        let tasks: Vec<_> = (0..1000)
            .map(|_| {
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
                    s.write_all(b"GET /dispatcher HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
                        .await
                        .unwrap();
                    let mut buf = Vec::new();
                    s.read_to_end(&mut buf).await.unwrap();
                    let text = String::from_utf8(buf).unwrap();
                    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
                    text.rsplit("\r\n\r\n").next().unwrap().parse::<u64>().unwrap()
                })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    });
    values.sort_unstable();
    assert_eq!(values, (1..=1000).collect::<Vec<_>>());
    assert_eq!(srv.stats()["counter"], 1000);
}

#[test]
fn crashed_router_restarts_with_its_registrations() {
    let mut s = settings();
    s.debug.fault_injection = true;
    let srv = TestServer::start(s);
    let mut a = srv.open("keep");
    let mut b = StreamClient::open_fallback(srv.addr, "keep");
    a.line();
    b.line();
    srv.wait_stats(Duration::from_secs(1), |s| s["connections"]["active"] == 2);

    let r = srv.admin_post("/admin/crash/router", "");
    assert_eq!(r.status, 202);
    let stats = srv.wait_stats(Duration::from_secs(2), |s| s["actors"]["router"]["restarts"] == 1);
    assert_eq!(stats["actors"]["router"]["restarts"], 1);

    // Registrations from before the crash still route.
    assert_eq!(srv.post("/send/keep", "after").json()["delivered"], 2);
    assert_eq!(a.line(), "Recvd msg #1: 'after'");
    assert_eq!(b.line(), "Recvd msg #1: 'after'");
    // And new streams register with the restarted Router.
    let mut c = srv.open("new");
    c.line();
    srv.wait_stats(Duration::from_secs(1), |s| s["connections"]["active"] == 3);
    assert_eq!(srv.post("/broadcast", "all").json()["delivered"], 3);
    assert_eq!(c.line(), "Recvd msg #1: 'all'");
    // A second crash is survived too.
    assert_eq!(srv.admin_post("/admin/crash/router", "").status, 202);
    assert_eq!(srv.post("/send/new", "again").json()["delivered"], 1);
    assert_eq!(srv.stats()["actors"]["router"]["restarts"], 2);
}

#[test]
fn crashed_counter_restarts_and_continues_the_count() {
    let mut s = settings();
    s.debug.fault_injection = true;
    let srv = TestServer::start(s);
    for expect in 1..=3 {
        assert_eq!(srv.get("/dispatcher").text(), expect.to_string());
    }
    assert_eq!(srv.admin_post("/admin/crash/counter", "").status, 202);
    assert_eq!(srv.get("/dispatcher").text(), "4");
    assert_eq!(srv.stats()["actors"]["counter"]["restarts"], 1);
    assert_eq!(srv.admin_post("/admin/crash/nothing", "").status, 404);
}

/// One keep-alive connection, as a client sees it.
struct Conn(BufReader<TcpStream>);

impl Conn {
    fn open(srv: &TestServer) -> Self {
        let s = TcpStream::connect(srv.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        Conn(BufReader::new(s))
    }

    fn send(&mut self, bytes: &[u8]) {
        self.0.get_mut().write_all(bytes).unwrap();
    }

    fn response(&mut self) -> common::Response {
        read_response(&mut self.0).unwrap()
    }

    fn closed(&mut self) -> bool {
        let mut rest = Vec::new();
        self.0.read_to_end(&mut rest).is_ok() && rest.is_empty()
    }
}

const PLAIN: &[u8] = b"GET /dispatcher HTTP/1.1\r\nhost: t\r\n\r\n";

#[test]
fn pipelined_dispatcher_requests_get_consecutive_numbers() {
    let srv = TestServer::start(settings());
    let mut c = Conn::open(&srv);
    c.send(&PLAIN.repeat(3));
    for n in 1..=3 {
        let r = c.response();
        assert_eq!((r.status, r.text()), (200, n.to_string()));
        assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
        assert!(r.header("date").is_some());
    }
    // Still open: a fourth request on the same connection.
    c.send(PLAIN);
    assert_eq!(c.response().text(), "4");
}

#[test]
fn a_dispatcher_request_split_across_writes_is_answered() {
    let srv = TestServer::start(settings());
    let mut c = Conn::open(&srv);
    let (a, b) = PLAIN.split_at(20);
    c.send(a);
    std::thread::sleep(Duration::from_millis(100));
    c.send(b);
    assert_eq!(c.response().text(), "1");
    // Split inside the request line of a later request too.
    c.send(&PLAIN[..5]);
    std::thread::sleep(Duration::from_millis(100));
    c.send(&PLAIN[5..]);
    assert_eq!(c.response().text(), "2");
}

#[test]
fn other_requests_after_dispatcher_ones_reach_actix_web() {
    let srv = TestServer::start(settings());
    let mut c = Conn::open(&srv);
    // Plain, then /healthz and a /dispatcher with a body in the same write:
    // the first is answered on the lean path, the rest by actix-web from
    // the bytes already read.
    let mut batch = PLAIN.to_vec();
    batch.extend_from_slice(b"GET /healthz HTTP/1.1\r\nhost: t\r\n\r\n");
    batch.extend_from_slice(b"GET /dispatcher HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\n\r\nhi");
    c.send(&batch);
    assert_eq!(c.response().text(), "1");
    let r = c.response();
    assert_eq!((r.status, r.text()), (200, "ok".to_owned()));
    assert_eq!(c.response().text(), "2");
    // actix-web keeps the connection and its keep-alive semantics.
    c.send(b"GET /nope HTTP/1.1\r\nhost: t\r\n\r\n");
    assert_eq!(c.response().status, 404);
    c.send(PLAIN);
    assert_eq!(c.response().text(), "3");
}

#[test]
fn dispatcher_honours_connection_close() {
    let srv = TestServer::start(settings());
    let mut c = Conn::open(&srv);
    c.send(b"GET /dispatcher HTTP/1.1\r\nConnection: close\r\n\r\n");
    let r = c.response();
    assert_eq!(r.text(), "1");
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.closed());
    // With keep-alive disabled every answer closes.
    let mut s = settings();
    s.server.keep_alive_ms = 0;
    let srv = TestServer::start(s);
    let mut c = Conn::open(&srv);
    c.send(PLAIN);
    assert_eq!(c.response().header("connection"), Some("close"));
    assert!(c.closed());
}

#[test]
fn an_idle_dispatcher_connection_is_closed_after_keep_alive() {
    let mut s = settings();
    s.server.keep_alive_ms = 300;
    let srv = TestServer::start(s);
    let mut c = Conn::open(&srv);
    c.send(PLAIN);
    assert_eq!(c.response().text(), "1");
    let t = std::time::Instant::now();
    assert!(c.closed());
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}

#[test]
fn a_stalled_dispatcher_request_gets_408() {
    let mut s = settings();
    s.server.head_timeout_ms = 4000;
    let srv = TestServer::start(s);
    let mut c = Conn::open(&srv);
    c.send(PLAIN);
    assert_eq!(c.response().text(), "1");
    let sent = std::time::Instant::now();
    c.send(b"GET /dispatcher HTTP/1.1\r\nhost:");
    let r = c.response();
    assert_eq!(r.status, 408, "{}", r.text());
    // Answered at the head timeout, not after a second timer elsewhere
    // (which would be 8 s).
    assert!(
        sent.elapsed() < Duration::from_millis(7000),
        "{:?}",
        sent.elapsed()
    );
    assert!(c.closed());
}
