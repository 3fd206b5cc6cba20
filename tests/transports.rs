//! SSE, WebSocket, subscriber tokens, history and resume, CORS: over real
//! sockets, with a generic SSE parser and tokio-tungstenite as the
//! WebSocket client.

mod common;

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{READ_TIMEOUT, StreamClient, TestServer, read_chunk, read_head, request, settings};
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{self, Message};

/// One server-sent event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct SseEvent {
    id: Option<String>,
    event: Option<String>,
    data: String,
}

/// An SSE client over a raw socket: it de-chunks the body and parses the
/// event stream format (WHATWG HTML §9.2.6) from the bytes, however they
/// are split.
struct Sse {
    reader: BufReader<TcpStream>,
    status: u16,
    headers: Vec<(String, String)>,
    /// De-chunked bytes not parsed yet.
    buf: Vec<u8>,
    retry: Option<u64>,
}

impl Sse {
    fn open(addr: SocketAddr, path: &str, extra: &[(&str, &str)]) -> Self {
        Self::open_after(addr, path, extra, false)
    }

    /// `fallback`: the stream request comes second on a keep-alive
    /// connection, after a `/healthz`, so actix-web's route serves it.
    fn open_after(addr: SocketAddr, path: &str, extra: &[(&str, &str)], fallback: bool) -> Self {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        let mut reader = BufReader::new(s);
        if fallback {
            reader
                .get_mut()
                .write_all(b"GET /healthz HTTP/1.1\r\nhost: test\r\n\r\n")
                .unwrap();
            assert_eq!(common::read_response(&mut reader).unwrap().text(), "ok");
        }
        let mut req = format!("GET {path} HTTP/1.1\r\nhost: test\r\naccept: text/event-stream\r\n");
        for (k, v) in extra {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        reader.get_mut().write_all(req.as_bytes()).unwrap();
        let (status, headers) = read_head(&mut reader).unwrap();
        Sse {
            reader,
            status,
            headers,
            buf: Vec::new(),
            retry: None,
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The next event; `None` once the body has ended.
    fn next(&mut self) -> Option<SseEvent> {
        let mut ev = SseEvent::default();
        let mut fields = false;
        loop {
            while let Some(lf) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=lf).collect();
                let line = String::from_utf8(line).unwrap();
                let line = line.trim_end_matches('\n').trim_end_matches('\r');
                if line.is_empty() {
                    if fields {
                        ev.data = ev.data.strip_suffix('\n').unwrap_or(&ev.data).to_owned();
                        return Some(ev);
                    }
                    continue;
                }
                if line.starts_with(':') {
                    continue;
                }
                let (name, value) = line.split_once(':').unwrap_or((line, ""));
                let value = value.strip_prefix(' ').unwrap_or(value);
                match name {
                    "id" => ev.id = Some(value.to_owned()),
                    "event" => ev.event = Some(value.to_owned()),
                    "data" => {
                        ev.data.push_str(value);
                        ev.data.push('\n');
                    }
                    "retry" => {
                        self.retry = value.parse().ok();
                        continue;
                    }
                    _ => continue,
                }
                fields = true;
            }
            match read_chunk(&mut self.reader).unwrap() {
                Some(chunk) => self.buf.extend(chunk),
                None => return None,
            }
        }
    }

    /// The next event that is not a tick.
    fn next_event(&mut self) -> SseEvent {
        loop {
            let ev = self.next().expect("stream ended");
            if ev.event.as_deref() != Some("tick") {
                return ev;
            }
        }
    }
}

fn send(srv: &TestServer, id: &str, msg: &str) -> u64 {
    let r = srv.post(&format!("/send/{id}"), msg);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["event_id"].as_u64().unwrap()
}

#[test]
fn sse_events_carry_ids_kinds_and_the_same_lines() {
    let mut s = settings();
    s.stream.tick_interval_ms = 200;
    let srv = TestServer::start(s);
    let mut c = Sse::open(srv.addr, "/test/ev", &[]);
    assert_eq!(c.status, 200);
    assert_eq!(c.header("content-type"), Some("text/event-stream"));
    assert_eq!(c.header("cache-control"), Some("no-store"));
    let welcome = c.next().unwrap();
    assert_eq!(c.retry, Some(2000), "the retry hint comes first");
    assert_eq!(welcome.event.as_deref(), Some("welcome"));
    assert_eq!(welcome.data, "Switchboard welcomes you! Your Id: ev");
    let start: u64 = welcome.id.unwrap().parse().unwrap();
    let tick = c.next().unwrap();
    assert_eq!(tick.event.as_deref(), Some("tick"));
    assert_eq!(tick.data, "Chunk 1 for id ev");
    assert_eq!(tick.id, Some(start.to_string()), "a tick repeats the position");
    let ev = send(&srv, "ev", "hello");
    assert!(ev > start);
    let m = c.next_event();
    assert_eq!(
        m,
        SseEvent {
            id: Some(ev.to_string()),
            event: Some("message".into()),
            data: format!("Recvd msg #{}: 'hello'", 2),
        }
    );
    let st = srv.stats();
    assert_eq!(st["transports"]["sse_opened"], 1, "{st}");
    assert_eq!(st["connections"]["fallback"], 0, "{st}");
}

#[test]
fn sse_resume_replays_what_was_missed_in_order_then_goes_live() {
    let srv = TestServer::start(settings());
    let mut c = Sse::open(srv.addr, "/test/res", &[]);
    c.next().unwrap();
    let e1 = send(&srv, "res", "m1");
    let got = c.next_event();
    assert_eq!(
        (got.id, got.data.as_str()),
        (Some(e1.to_string()), "Recvd msg #1: 'm1'")
    );
    drop(c);
    let missed: Vec<u64> = (2..=4).map(|n| send(&srv, "res", &format!("m{n}"))).collect();
    let last = e1.to_string();
    let mut c = Sse::open(srv.addr, "/test/res", &[("last-event-id", &last)]);
    let welcome = c.next().unwrap();
    assert_eq!(
        (welcome.event.as_deref(), welcome.id),
        (Some("welcome"), Some(last))
    );
    for (n, ev) in (2..=4).zip(&missed) {
        let m = c.next_event();
        assert_eq!(m.event.as_deref(), Some("message"));
        assert_eq!(m.id, Some(ev.to_string()));
        assert_eq!(m.data, format!("Recvd msg #{}: 'm{n}'", n - 1));
    }
    let e5 = send(&srv, "res", "m5");
    let live = c.next_event();
    assert_eq!(
        (live.id, live.data.as_str()),
        (Some(e5.to_string()), "Recvd msg #4: 'm5'")
    );
    let st = srv.stats();
    assert_eq!(st["history"]["replayed"], 3, "{st}");
    assert_eq!(st["history"]["gaps"], 0, "{st}");
    // Up to date: nothing replayed, no gap.
    let mut c = Sse::open(srv.addr, &format!("/test/res?since={e5}"), &[]);
    c.next().unwrap();
    let e6 = send(&srv, "res", "m6");
    assert_eq!(c.next_event().id, Some(e6.to_string()));
}

#[test]
fn evicted_history_is_announced_as_a_gap_naming_the_next_id() {
    let mut s = settings();
    s.history.size = 2;
    let srv = TestServer::start(s);
    let mut c = Sse::open(srv.addr, "/test/g", &[]);
    let start = c.next().unwrap().id.unwrap();
    drop(c);
    let ids: Vec<u64> = (1..=5).map(|n| send(&srv, "g", &format!("m{n}"))).collect();
    let mut c = Sse::open(srv.addr, "/test/g", &[("last-event-id", &start)]);
    c.next().unwrap();
    let gap = c.next_event();
    assert_eq!(gap.event.as_deref(), Some("gap"));
    assert_eq!(
        gap.data,
        format!(
            "Gap: messages after event {start} may be missing; history resumes at event {}",
            ids[3]
        )
    );
    assert_eq!(c.next_event().data, "Recvd msg #1: 'm4'");
    assert_eq!(c.next_event().data, "Recvd msg #2: 'm5'");
    // The same on the plain stream, ids on.
    let mut p = StreamClient::open_raw(
        srv.addr,
        &format!("GET /test/g?since={start}&ids=1 HTTP/1.1\r\nhost: t\r\n\r\n"),
    );
    assert_eq!(p.line(), format!("{start} Switchboard welcomes you! Your Id: g"));
    assert!(
        p.line()
            .starts_with(&format!("{start} Gap: messages after event {start}"))
    );
    assert_eq!(p.line(), format!("{} Recvd msg #1: 'm4'", ids[3]));
    assert_eq!(p.line(), format!("{} Recvd msg #2: 'm5'", ids[4]));
    assert_eq!(srv.stats()["history"]["gaps"], 2);
}

#[test]
fn plain_stream_resumes_with_since_and_lines_stay_as_they_were() {
    let srv = TestServer::start(settings());
    let e1 = send(&srv, "p", "before");
    let e2 = send(&srv, "p", "after");
    let mut c = StreamClient::open_raw(
        srv.addr,
        &format!("GET /test/p?since={e1} HTTP/1.1\r\nhost: t\r\n\r\n"),
    );
    assert_eq!(c.header("content-type"), Some("text/plain; charset=utf-8"));
    assert_eq!(c.line(), "Switchboard welcomes you! Your Id: p");
    assert_eq!(c.line(), "Recvd msg #1: 'after'");
    let _ = e2;
}

#[test]
fn history_stays_bounded_under_100k_messages_to_one_id() {
    let mut s = settings();
    s.history.size = 64;
    let srv = TestServer::start(s);
    let mut c = StreamClient::open_raw(srv.addr, "GET /test/flood?ids=1 HTTP/1.1\r\nhost: t\r\n\r\n");
    let start: u64 = c.line().split(' ').next().unwrap().parse().unwrap();
    drop(c);
    // 100,000 POSTs pipelined on one keep-alive connection, 1,000 at a time.
    let mut conn = TcpStream::connect(srv.addr).unwrap();
    conn.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut last = 0;
    for batch in 0..100 {
        let mut out = Vec::new();
        for i in 0..1000 {
            let body = format!("n{}", batch * 1000 + i);
            write!(
                out,
                "POST /send/flood HTTP/1.1\r\nhost: t\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
        }
        conn.write_all(&out).unwrap();
        for _ in 0..1000 {
            let r = common::read_response(&mut reader).unwrap();
            assert_eq!(r.status, 200, "{}", r.text());
            let ev = r.json()["event_id"].as_u64().unwrap();
            assert!(ev > last, "event ids increase");
            last = ev;
        }
    }
    let st = srv.stats();
    assert_eq!(st["history"]["ids"], 1, "{st}");
    assert_eq!(st["history"]["messages"], 64, "{st}");
    let mut c = StreamClient::open_raw(
        srv.addr,
        &format!("GET /test/flood?since={start} HTTP/1.1\r\nhost: t\r\n\r\n"),
    );
    c.line();
    assert!(c.line().starts_with("Gap: "));
    let replay: Vec<String> = (0..64).map(|_| c.line()).collect();
    assert_eq!(replay[0], "Recvd msg #1: 'n99936'");
    assert_eq!(replay[63], "Recvd msg #64: 'n99999'");
}

fn ws_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn ws_text(ws: &mut Ws) -> String {
    loop {
        match tokio::time::timeout(READ_TIMEOUT, ws.next()).await {
            Ok(Some(Ok(Message::Text(t)))) if !t.starts_with("Chunk ") => return t.to_string(),
            Ok(Some(Ok(Message::Text(_) | Message::Pong(_)))) => {}
            other => panic!("expected a text frame, got {other:?}"),
        }
    }
}

#[test]
fn websocket_frames_pings_ignored_input_and_the_close_handshake() {
    let srv = TestServer::start(settings());
    let addr = srv.addr;
    ws_runtime().block_on(async {
        let (mut ws, resp) = tokio_tungstenite::connect_async(format!("ws://{addr}/test/sock"))
            .await
            .unwrap();
        assert_eq!(resp.status(), 101);
        assert_eq!(ws_text(&mut ws).await, "Switchboard welcomes you! Your Id: sock");
        let srv_addr = addr;
        let ev = tokio::task::spawn_blocking(move || {
            let r = request(srv_addr, "POST", "/send/sock", &[], b"over ws").unwrap();
            r.json()["event_id"].as_u64().unwrap()
        })
        .await
        .unwrap();
        assert!(ev > 0);
        assert_eq!(ws_text(&mut ws).await, "Recvd msg #1: 'over ws'");
        ws.send(Message::Ping(b"are you there".to_vec().into()))
            .await
            .unwrap();
        let pong = tokio::time::timeout(READ_TIMEOUT, ws.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(pong, Message::Pong(b"are you there".to_vec().into()));
        ws.send(Message::Text("ignored".into())).await.unwrap();
        ws.send(Message::Binary(vec![1, 2, 3].into())).await.unwrap();
        ws.close(Some(CloseFrame {
            code: CloseCode::Normal,
            reason: "done".into(),
        }))
        .await
        .unwrap();
        // The server answers with its close frame, then ends the connection.
        loop {
            match tokio::time::timeout(READ_TIMEOUT, ws.next()).await.unwrap() {
                Some(Ok(Message::Close(Some(f)))) => assert_eq!(f.code, CloseCode::Normal),
                Some(Ok(Message::Close(None))) => panic!("the close code is echoed"),
                Some(Ok(_)) => {}
                None | Some(Err(tungstenite::Error::ConnectionClosed)) => break,
                Some(Err(e)) => panic!("{e}"),
            }
        }
    });
    let st = srv.wait_stats(Duration::from_secs(2), |s| s["connections"]["active"] == 0);
    assert_eq!(st["connections"]["active"], 0, "{st}");
    assert_eq!(st["transports"]["ws_opened"], 1, "{st}");
    assert_eq!(st["transports"]["ws_pings"], 1, "{st}");
    assert_eq!(st["transports"]["ws_frames_ignored"], 2, "{st}");
    assert_eq!(st["messages"]["written"], 1, "{st}");
}

#[test]
fn websocket_resume_with_since_and_ids() {
    let srv = TestServer::start(settings());
    let addr = srv.addr;
    let e1 = send(&srv, "wr", "one");
    let e2 = send(&srv, "wr", "two");
    ws_runtime().block_on(async {
        let url = format!("ws://{addr}/test/wr?since={e1}&ids=1");
        let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
        assert_eq!(
            ws_text(&mut ws).await,
            format!("{e1} Switchboard welcomes you! Your Id: wr")
        );
        assert_eq!(ws_text(&mut ws).await, format!("{e2} Recvd msg #1: 'two'"));
    });
}

#[test]
fn server_shutdown_closes_websockets_with_1001() {
    let mut srv = TestServer::start(settings());
    let addr = srv.addr;
    let rt = ws_runtime();
    let mut ws = rt.block_on(async {
        let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/test/bye"))
            .await
            .unwrap();
        ws_text(&mut ws).await;
        ws
    });
    let stopper = std::thread::spawn(move || {
        srv.shutdown();
        srv
    });
    rt.block_on(async {
        loop {
            match tokio::time::timeout(READ_TIMEOUT, ws.next()).await.unwrap() {
                Some(Ok(Message::Close(Some(f)))) => {
                    assert_eq!(f.code, CloseCode::Away);
                    assert_eq!(f.reason, "server shutting down");
                    break;
                }
                Some(Ok(Message::Text(_))) => {}
                other => panic!("expected close 1001, got {other:?}"),
            }
        }
        // Our close reply lets the server end the connection at once.
        let _ = ws.close(None).await;
    });
    drop(stopper.join().unwrap());
}

/// A raw WebSocket: the upgrade by hand, then bytes.
fn raw_ws(addr: SocketAddr, path: &str) -> BufReader<TcpStream> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: t\r\nupgrade: websocket\r\nconnection: Upgrade\r\n\
         sec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let (status, headers) = read_head(&mut r).unwrap();
    assert_eq!(status, 101);
    assert!(
        headers
            .iter()
            .any(|(k, v)| k == "sec-websocket-accept" && v == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
    );
    r
}

/// Reads server frames until a close; returns its code.
fn close_code(r: &mut BufReader<TcpStream>) -> u16 {
    let payload = frame_of(r, 0x8);
    u16::from_be_bytes([payload[0], payload[1]])
}

#[test]
fn websocket_clients_that_break_the_protocol_are_closed_with_its_codes() {
    let srv = TestServer::start(settings());
    // Unmasked frame: 1002.
    let mut r = raw_ws(srv.addr, "/test/bad");
    r.get_mut().write_all(&[0x81, 0x02, b'h', b'i']).unwrap();
    assert_eq!(close_code(&mut r), 1002);
    // A 5,000-byte frame (over the 4,096 a client may send): 1009.
    let mut r = raw_ws(srv.addr, "/test/bad");
    r.get_mut()
        .write_all(&[0x81, 0xfe, 0x13, 0x88, 1, 2, 3, 4])
        .unwrap();
    assert_eq!(close_code(&mut r), 1009);
    // A reserved opcode: 1002.
    let mut r = raw_ws(srv.addr, "/test/bad");
    r.get_mut().write_all(&[0x83, 0x80, 1, 2, 3, 4]).unwrap();
    assert_eq!(close_code(&mut r), 1002);
    let st = srv.wait_stats(Duration::from_secs(2), |s| s["connections"]["active"] == 0);
    assert_eq!(st["transports"]["ws_protocol_errors"], 3, "{st}");
}

fn mint(secret: &str, id: &str, ttl: Duration) -> String {
    switchboard::token::mint(secret, &[id.to_owned()], ttl).unwrap()
}

#[test]
fn bad_handshakes_get_their_status_and_a_bystander_is_unaffected() {
    let mut s = settings();
    s.auth.subscribe_secret = "test-secret".into();
    let srv = TestServer::start(s);
    let ok = mint("test-secret", "by", Duration::from_secs(60));
    let mut bystander = StreamClient::open_raw(
        srv.addr,
        &format!("GET /test/by?token={ok} HTTP/1.1\r\nhost: t\r\n\r\n"),
    );
    assert_eq!(bystander.status, 200);
    bystander.line();
    let ws = "upgrade: websocket\r\nconnection: Upgrade\r\n";
    let token = mint("test-secret", "x", Duration::from_secs(60));
    let expired = {
        use jsonwebtoken::{EncodingKey, Header, encode};
        let exp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            - 10;
        let claims = switchboard::token::Claims {
            sub: Some("x".into()),
            exp,
            ..Default::default()
        };
        encode(
            &Header::default(),
            &claims,
            &EncodingKey::from_secret(b"test-secret").unwrap(),
        )
        .unwrap()
    };
    let cases: Vec<(String, u16, &str)> = vec![
        (
            format!(
                "GET /test/x?token={token} HTTP/1.1\r\nhost: t\r\n{ws}sec-websocket-version: 8\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
            ),
            426,
            "WebSocket version not supported; use 13",
        ),
        (
            format!("GET /test/x?token={token} HTTP/1.1\r\nhost: t\r\n{ws}sec-websocket-version: 13\r\n\r\n"),
            400,
            "WebSocket handshake refused",
        ),
        (
            "GET /test/x HTTP/1.1\r\nhost: t\r\n\r\n".to_owned(),
            401,
            "subscriber token refused: none given",
        ),
        (
            "GET /test/x?token=garbage HTTP/1.1\r\nhost: t\r\n\r\n".to_owned(),
            401,
            "subscriber token refused: token is not a valid JWT",
        ),
        (
            format!("GET /test/x HTTP/1.1\r\nhost: t\r\nauthorization: Bearer {expired}\r\n\r\n"),
            401,
            "subscriber token refused: token expired",
        ),
        (
            format!("GET /test/other?token={token} HTTP/1.1\r\nhost: t\r\n\r\n"),
            401,
            "subscriber token refused: token is not for id \"other\"",
        ),
        (
            format!("GET /test/x?token={token}&since=abc HTTP/1.1\r\nhost: t\r\n\r\n"),
            400,
            "since must be an event id",
        ),
    ];
    for (req, status, error) in &cases {
        let mut s = TcpStream::connect(srv.addr).unwrap();
        s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let r = common::read_response(&mut BufReader::new(s)).unwrap();
        assert_eq!(r.status, *status, "{req}: {}", r.text());
        assert!(r.error().starts_with(error), "{req}: {}", r.error());
        if *status == 426 {
            assert_eq!(r.header("sec-websocket-version"), Some("13"));
        }
        if *status == 401 {
            assert_eq!(r.header("www-authenticate"), Some("Bearer"));
        }
    }
    let st = srv.stats();
    assert_eq!(
        st["connections"]["active"], 1,
        "no stream state for a refused one: {st}"
    );
    assert_eq!(st["auth"]["tokens_refused"], 4, "{st}");
    let r = srv.post("/send/by", "still here");
    assert_eq!(r.json()["delivered"], 1);
    assert_eq!(bystander.message(), "Recvd msg #1: 'still here'");
    // A good token, in the header or the query, on every transport.
    let mut c = StreamClient::open_raw(
        srv.addr,
        &format!("GET /test/x HTTP/1.1\r\nhost: t\r\nauthorization: bearer {token}\r\n\r\n"),
    );
    assert_eq!(c.line(), "Switchboard welcomes you! Your Id: x");
    let mut e = Sse::open(srv.addr, &format!("/test/x?token={token}"), &[]);
    assert_eq!(e.next().unwrap().event.as_deref(), Some("welcome"));
}

#[test]
fn a_stream_ends_when_its_token_expires() {
    let mut s = settings();
    s.auth.subscribe_secret = "k".into();
    let srv = TestServer::start(s);
    let token = mint("k", "t", Duration::from_secs(2));
    let started = Instant::now();
    let mut c = StreamClient::open_raw(
        srv.addr,
        &format!("GET /test/t?token={token} HTTP/1.1\r\nhost: t\r\n\r\n"),
    );
    c.reader
        .get_mut()
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    assert_eq!(c.line(), "Switchboard welcomes you! Your Id: t");
    assert_eq!(c.read_to_end().unwrap(), vec!["Token expired\n".to_owned()]);
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    let st = srv.wait_stats(Duration::from_secs(2), |s| s["connections"]["active"] == 0);
    assert_eq!(st["auth"]["tokens_expired"], 1, "{st}");
}

#[test]
fn cors_for_allowed_origins_only() {
    let mut s = settings();
    s.http.cors_origins = "http://app.test, http://other.test".into();
    let srv = TestServer::start(s);
    let c = Sse::open(srv.addr, "/test/c", &[("origin", "http://app.test")]);
    assert_eq!(c.header("access-control-allow-origin"), Some("http://app.test"));
    let c = Sse::open(srv.addr, "/test/c", &[("origin", "http://evil.test")]);
    assert_eq!(c.header("access-control-allow-origin"), None);
    let pre = request(
        srv.addr,
        "OPTIONS",
        "/send/c",
        &[
            ("origin", "http://other.test"),
            ("access-control-request-method", "POST"),
        ],
        b"",
    )
    .unwrap();
    assert_eq!(pre.status, 204, "{}", pre.text());
    assert_eq!(
        pre.header("access-control-allow-origin"),
        Some("http://other.test")
    );
    assert!(
        pre.header("access-control-allow-methods")
            .unwrap()
            .contains("POST")
    );
    let post = request(
        srv.addr,
        "POST",
        "/send/c",
        &[("origin", "http://app.test")],
        b"x",
    )
    .unwrap();
    assert_eq!(
        post.header("access-control-allow-origin"),
        Some("http://app.test")
    );
    // A WebSocket from a page the list does not name is refused: browsers
    // apply no CORS to it.
    let mut s = TcpStream::connect(srv.addr).unwrap();
    s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    s.write_all(
        b"GET /test/c HTTP/1.1\r\nhost: t\r\norigin: http://evil.test\r\nupgrade: websocket\r\nconnection: Upgrade\r\n\
          sec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .unwrap();
    let r = common::read_response(&mut BufReader::new(s)).unwrap();
    assert_eq!(r.status, 403, "{}", r.text());
}

#[test]
fn fallback_path_speaks_sse_too() {
    let srv = TestServer::start(settings());
    // A second request on a keep-alive connection goes through actix-web.
    let mut c = Sse::open_after(srv.addr, "/test/foo", &[], true);
    assert_eq!(c.status, 200);
    assert_eq!(c.header("content-type"), Some("text/event-stream"));
    let w = c.next().unwrap();
    assert_eq!(w.event.as_deref(), Some("welcome"));
    assert_eq!(w.data, "Switchboard welcomes you! Your Id: foo");
    let ev = send(&srv, "foo", "via actix");
    assert_eq!(c.next_event().id, Some(ev.to_string()));
    assert_eq!(srv.stats()["connections"]["fallback"], 1);
}

#[test]
fn a_websocket_closes_with_1008_when_its_token_expires() {
    let mut s = settings();
    s.auth.subscribe_secret = "k".into();
    let srv = TestServer::start(s);
    let token = mint("k", "wt", Duration::from_secs(2));
    let addr = srv.addr;
    ws_runtime().block_on(async {
        let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/test/wt?token={token}"))
            .await
            .unwrap();
        assert_eq!(ws_text(&mut ws).await, "Switchboard welcomes you! Your Id: wt");
        match tokio::time::timeout(Duration::from_secs(4), ws.next())
            .await
            .unwrap()
        {
            Some(Ok(Message::Close(Some(f)))) => {
                assert_eq!(f.code, CloseCode::Policy);
                assert_eq!(f.reason, "token expired");
            }
            other => panic!("expected close 1008, got {other:?}"),
        }
    });
}

/// Reads server frames until one with `opcode`; returns its payload.
fn frame_of(r: &mut BufReader<TcpStream>, opcode: u8) -> Vec<u8> {
    loop {
        let mut h = [0u8; 2];
        r.read_exact(&mut h).unwrap();
        let mut len = u64::from(h[1] & 0x7f);
        if len == 126 {
            let mut b = [0u8; 2];
            r.read_exact(&mut b).unwrap();
            len = u64::from(u16::from_be_bytes(b));
        }
        let mut payload = vec![0u8; len as usize];
        r.read_exact(&mut payload).unwrap();
        if h[0] & 0x0f == opcode {
            return payload;
        }
    }
}

/// RFC 6455 §7.4 and §8.1: a close with a code nobody may send is answered
/// 1002, a close reason that is not UTF-8 1007; a valid code is echoed.
/// Frames a client writes right behind its handshake are read as frames.
#[test]
fn websocket_close_rules_and_frames_pipelined_behind_the_handshake() {
    let srv = TestServer::start(settings());
    // Masked with a zero key, so the payload reads as written.
    let close = |payload: &[u8]| {
        let mut f = vec![0x88, 0x80 | payload.len() as u8, 0, 0, 0, 0];
        f.extend_from_slice(payload);
        f
    };
    for (payload, answer) in [
        (vec![0x03, 0xe7], 1002),             // 999
        (vec![0x13, 0x88], 1002),             // 5000
        (vec![0x03, 0xed], 1002),             // 1005, never sent
        (vec![0x03, 0xe8, 0xff, 0xfe], 1007), // 1000, reason not UTF-8
        (vec![0x0f, 0xa0], 4000),             // an application's code: echoed
    ] {
        let mut r = raw_ws(srv.addr, "/test/closer");
        r.get_mut().write_all(&close(&payload)).unwrap();
        assert_eq!(close_code(&mut r), answer, "{payload:?}");
    }
    // A ping and a text frame in the same write as the handshake.
    let mut s = TcpStream::connect(srv.addr).unwrap();
    s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    let mut bytes = b"GET /test/eager HTTP/1.1\r\nhost: t\r\nupgrade: websocket\r\nconnection: Upgrade\r\n\
         sec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        .to_vec();
    bytes.extend_from_slice(&[0x89, 0x82, 0, 0, 0, 0, b'h', b'i']);
    bytes.extend_from_slice(&[0x81, 0x81, 0, 0, 0, 0, b'x']);
    s.write_all(&bytes).unwrap();
    let mut r = BufReader::new(s);
    assert_eq!(read_head(&mut r).unwrap().0, 101);
    assert_eq!(frame_of(&mut r, 0xa), b"hi");
    let st = srv.wait_stats(Duration::from_secs(2), |s| {
        s["transports"]["ws_frames_ignored"] == 1
    });
    assert_eq!(st["transports"]["ws_pings"], 1, "{st}");
    assert_eq!(st["transports"]["ws_protocol_errors"], 4, "{st}");
}

/// Tokens as identity providers mint them, given once or twice, and CORS on
/// every answer of the stream path.
#[test]
fn identity_provider_tokens_and_cors_on_refusals() {
    let mut s = settings();
    s.auth.subscribe_secret = "idp-secret".into();
    s.auth.subscribe_audience = "switchboard".into();
    s.http.cors_origins = "http://app.example".into();
    let srv = TestServer::start(s);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let sign = |claims: serde_json::Value| {
        use jsonwebtoken::{EncodingKey, Header, encode};
        encode(
            &Header::default(),
            &claims,
            &EncodingKey::from_secret(b"idp-secret").unwrap(),
        )
        .unwrap()
    };
    let idp = |aud: &str, nbf: u64| {
        sign(serde_json::json!({
            "iss": "https://id.example", "sub": "user-1", "ids": ["room"], "aud": aud,
            "iat": now, "nbf": nbf, "exp": now + 600
        }))
    };
    let open = |query: &str, extra: &str| {
        StreamClient::open_raw(
            srv.addr,
            &format!(
                "GET /test/room{query} HTTP/1.1\r\nhost: t\r\norigin: http://app.example\r\n{extra}\r\n"
            ),
        )
    };
    let good = idp("switchboard", now);
    let mut ok = open(
        &format!("?token={good}"),
        &format!("authorization: Bearer {good}\r\n"),
    );
    assert_eq!(ok.status, 200);
    assert_eq!(
        ok.header("access-control-allow-origin"),
        Some("http://app.example")
    );
    assert_eq!(ok.header("vary"), Some("Origin"));
    assert_eq!(ok.line(), "Switchboard welcomes you! Your Id: room");
    for (query, extra, status, why) in [
        (
            format!("?token={}", idp("other", now)),
            String::new(),
            401,
            "token is not for this audience (aud)",
        ),
        (
            format!("?token={}", idp("switchboard", now + 3600)),
            String::new(),
            401,
            "token not valid yet (its nbf is in the future)",
        ),
        (
            format!("?token={good}"),
            format!("authorization: Bearer {}\r\n", idp("switchboard", now - 1)),
            400,
            "two different subscriber tokens given",
        ),
        (
            format!("?token={good}&token=x"),
            String::new(),
            400,
            "two different subscriber tokens given",
        ),
        (
            String::new(),
            String::new(),
            401,
            "subscriber token refused: none given",
        ),
    ] {
        let mut c = open(&query, &extra);
        assert_eq!(c.status, status, "{query} {extra}");
        // The page can read why: the refusal carries the CORS headers.
        assert_eq!(
            c.header("access-control-allow-origin"),
            Some("http://app.example")
        );
        assert_eq!(c.header("vary"), Some("Origin"));
        let mut body = String::new();
        c.reader.read_to_string(&mut body).unwrap();
        assert!(body.contains(why), "{body}");
    }
    // An origin the list does not name: no CORS header, but Vary.
    let c = StreamClient::open_raw(
        srv.addr,
        &format!("GET /test/room?token={good} HTTP/1.1\r\nhost: t\r\norigin: http://evil.example\r\n\r\n"),
    );
    assert_eq!((c.status, c.header("access-control-allow-origin")), (200, None));
    assert_eq!(c.header("vary"), Some("Origin"));
    // Two Origin headers: which page asked is unknown (the lean path, and
    // actix-web's routes).
    let c = StreamClient::open_raw(
        srv.addr,
        &format!(
            "GET /test/room?token={good} HTTP/1.1\r\nhost: t\r\norigin: http://evil.example\r\norigin: http://app.example\r\n\r\n"
        ),
    );
    assert_eq!(c.status, 400);
    assert_eq!(
        (c.header("access-control-allow-origin"), c.header("vary")),
        (None, Some("Origin")),
        "no page is named, and the answer still depends on Origin"
    );
    let r = request(
        srv.addr,
        "POST",
        "/send/room",
        &[
            ("origin", "http://evil.example"),
            ("origin", "http://app.example"),
        ],
        b"x",
    )
    .unwrap();
    assert_eq!(
        (r.status, r.error()),
        (400, "more than one Origin header".to_owned())
    );
    // The preflight of a cross-origin fetch with Authorization.
    let r = request(
        srv.addr,
        "OPTIONS",
        "/test/room",
        &[
            ("origin", "http://app.example"),
            ("access-control-request-method", "GET"),
            ("access-control-request-headers", "authorization"),
        ],
        b"",
    )
    .unwrap();
    assert_eq!(r.status, 204);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://app.example")
    );
    assert!(
        r.header("access-control-allow-headers")
            .unwrap()
            .contains("Authorization")
    );
    assert!(r.header("access-control-allow-methods").unwrap().contains("GET"));
}
