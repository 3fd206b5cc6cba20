//! At the edge (issue 26): the PROXY protocol on every path (the lean
//! stream, the lean `/dispatcher`, actix-web), `X-Forwarded-For` from
//! trusted proxies, and the limits per client address, against real
//! sockets bound to client addresses of their own (127.0.0.2, .3, ...)
//! and a real HAProxy in front.

mod common;

use std::io::{BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::time::{Duration, Instant};

use common::{READ_TIMEOUT, Response, StreamClient, TestServer, read_head, read_response, settings};
use switchboard::Settings;
use switchboard::config::ProxyProtocol;

/// A connection from `from` (a loopback address of its own) to `addr`.
fn connect_from(from: [u8; 4], addr: SocketAddr) -> TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket
        .bind(&SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(from), 0)).into())
        .unwrap();
    socket.connect(&addr.into()).unwrap();
    let s: TcpStream = socket.into();
    s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    s
}

/// Sends `bytes` on a new connection from `from` and reads one response.
fn exchange_from(from: [u8; 4], addr: SocketAddr, bytes: &[u8]) -> Response {
    let mut s = connect_from(from, addr);
    s.write_all(bytes).unwrap();
    read_response(&mut BufReader::new(s)).unwrap()
}

/// Opens a stream with `request` after `prefix` (a PROXY header, or
/// nothing) from `from`; reads the response head.
fn stream_from(from: [u8; 4], addr: SocketAddr, prefix: &[u8], request: &str) -> StreamClient {
    StreamClient::on(connect_from(from, addr), &[prefix, request.as_bytes()].concat())
}

fn get_stream(id: &str) -> String {
    format!("GET /test/{id} HTTP/1.1\r\nhost: t\r\n\r\n")
}

fn post(path: &str, body: &str, extra: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\ncontent-length: {}\r\n{extra}\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A v1 header for a client at `ip:port`.
fn v1(ip: &str, port: u16) -> Vec<u8> {
    format!("PROXY TCP4 {ip} 127.0.0.1 {port} 8000\r\n").into_bytes()
}

/// A v2 header for a client at `ip:port`, with `tlvs` after the addresses.
fn v2(ip: [u8; 4], port: u16, tlvs: &[u8]) -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.extend([0x21, 0x11]);
    h.extend(((12 + tlvs.len()) as u16).to_be_bytes());
    h.extend(ip);
    h.extend([127, 0, 0, 1]);
    h.extend(port.to_be_bytes());
    h.extend(8000u16.to_be_bytes());
    h.extend(tlvs);
    h
}

/// Limits off but the ones a test turns on; nothing exempt.
fn limited(mut s: Settings) -> Settings {
    s.limits.streams_per_ip = 0;
    s.limits.stream_opens_per_ip_per_s = 0;
    s.limits.publishes_per_ip_per_s = 0;
    s.limits.exempt = String::new();
    s
}

fn welcomed(c: &mut StreamClient, id: &str) {
    assert_eq!(c.status, 200, "{:?}", c.headers);
    assert_eq!(c.line(), format!("Switchboard welcomes you! Your Id: {id}"));
}

/// With `proxy_protocol = "any"`: the address in the header is the client
/// (the socket's peer, 127.0.0.1, is the balancer), on the lean stream
/// path, the lean `/dispatcher` path and actix-web's; a header split over
/// several packets and a v2 header with TLVs are taken whole.
#[test]
fn proxy_headers_name_the_client_on_every_path() {
    let mut s = limited(settings());
    s.server.proxy_protocol = ProxyProtocol::Any;
    s.limits.streams_per_ip = 1;
    s.limits.publishes_per_ip_per_s = 1;
    s.limits.publishes_burst = 1;
    let srv = TestServer::start(s);
    let lb = [127, 0, 0, 1];
    // Lean streams: one per claimed address.
    let mut a = stream_from(lb, srv.addr, &v1("192.0.2.7", 4000), &get_stream("pa"));
    welcomed(&mut a, "pa");
    let again = stream_from(lb, srv.addr, &v1("192.0.2.7", 4001), &get_stream("pa"));
    assert_eq!(
        again.status, 429,
        "the same client address, through the same balancer"
    );
    assert!(again.header("retry-after").is_some());
    let tlvs = [0x01, 0x00, 0x02, b'h', b'2', 0x05, 0x00, 0x03, b'a', b'b', b'c'];
    let mut b = stream_from(lb, srv.addr, &v2([192, 0, 2, 8], 4002, &tlvs), &get_stream("pa"));
    welcomed(&mut b, "pa");
    // Split over packets, a byte at a time at first.
    let mut split = connect_from(lb, srv.addr);
    let header = v1("192.0.2.9", 4003);
    for byte in &header[..10] {
        split.write_all(&[*byte]).unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    split.write_all(&header[10..]).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    split.write_all(get_stream("pa").as_bytes()).unwrap();
    let mut split = BufReader::new(split);
    assert_eq!(read_head(&mut split).unwrap().0, 200);

    // actix-web (/send), its client the header's: one publish a second.
    let send = |ip: [u8; 4], n: u16| {
        let mut bytes = v2(ip, 5000 + n, &[]);
        bytes.extend(post("/send/pa", &format!("m{n}"), ""));
        exchange_from(lb, srv.addr, &bytes)
    };
    assert_eq!(send([198, 51, 100, 1], 1).status, 200);
    assert_eq!(a.line(), "Recvd msg #1: 'm1'");
    let refused = send([198, 51, 100, 1], 2);
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert!(refused.header("retry-after").is_some());
    assert_eq!(
        send([198, 51, 100, 2], 3).status,
        200,
        "another client, the same balancer"
    );
    // The lean /dispatcher path, and a keep-alive hand-off from it to
    // actix-web, behind a header.
    let mut d = connect_from(lb, srv.addr);
    d.write_all(&v1("192.0.2.10", 4004)).unwrap();
    d.write_all(b"GET /dispatcher HTTP/1.1\r\nhost: t\r\n\r\nGET /healthz HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
        .unwrap();
    let mut d = BufReader::new(d);
    assert_eq!(read_response(&mut d).unwrap().status, 200);
    assert_eq!(read_response(&mut d).unwrap().text(), "ok");

    let st = srv.stats();
    assert_eq!(st["limits"]["refused"]["streams"], 1, "{st}");
    assert_eq!(st["limits"]["refused"]["publishes"], 1, "{st}");
    assert_eq!(st["connections"]["proxy_refused"], 0, "{st}");
}

/// With the PROXY protocol on, a connection without a valid header is
/// refused with 400 before any of its request is read, and counted: no
/// header, garbage that claims to be one, the other version than the one
/// configured, one that never ends.
#[test]
fn connections_without_a_valid_proxy_header_are_refused() {
    let mut s = limited(settings());
    s.server.proxy_protocol = ProxyProtocol::V2;
    s.server.head_timeout_ms = 1000;
    let srv = TestServer::start(s);
    let from = [127, 0, 0, 2];
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("no header", get_stream("x").into_bytes()),
        (
            "garbage",
            b"PROXY TCP4 not-an-address\r\nGET /test/x HTTP/1.1\r\n\r\n".to_vec(),
        ),
        (
            "v1 where v2 is asked",
            [v1("192.0.2.7", 1), get_stream("x").into_bytes()].concat(),
        ),
        ("a bad v2 version", {
            let mut h = v2([192, 0, 2, 7], 1, &[]);
            h[12] = 0x31;
            h
        }),
    ];
    for (what, bytes) in &cases {
        let r = exchange_from(from, srv.addr, bytes);
        assert_eq!(r.status, 400, "{what}: {}", r.text());
        assert!(r.error().contains("PROXY"), "{what}: {}", r.error());
    }
    // Only the start of a header, then nothing: the head deadline.
    let r = exchange_from(from, srv.addr, b"\r\n\r\n\0\r\nQU");
    assert_eq!(r.status, 408);
    let st = srv.stats();
    assert_eq!(st["connections"]["proxy_refused"], cases.len(), "{st}");
    // A good one still works.
    let mut ok = stream_from(from, srv.addr, &v2([192, 0, 2, 7], 1, &[]), &get_stream("x"));
    welcomed(&mut ok, "x");
}

/// A v2 header whose TLV runs past the header's declared length is all
/// there once that length is in: refused with 400 at once and counted, not
/// held as the start of a header until the head deadline (408).
#[test]
fn a_v2_header_whose_tlv_overruns_it_is_refused_at_once() {
    let mut s = limited(settings());
    s.server.proxy_protocol = ProxyProtocol::V2;
    s.server.head_timeout_ms = 10_000;
    let srv = TestServer::start(s);
    // An ALPN TLV that says 16 bytes of value and has 2 before the end.
    let header = v2([192, 0, 2, 7], 4000, &[0x01, 0x00, 0x10, b'h', b'2']);
    for then in [&b""[..], get_stream("t").as_bytes()] {
        let started = Instant::now();
        let r = exchange_from([127, 0, 0, 2], srv.addr, &[&header[..], then].concat());
        let took = started.elapsed();
        assert_eq!(r.status, 400, "{}", r.text());
        assert!(r.error().contains("PROXY"), "{}", r.error());
        assert!(
            took < Duration::from_secs(5),
            "answered after {took:?}, the head timeout is 10 s"
        );
    }
    let st = srv.stats();
    assert_eq!(st["connections"]["proxy_refused"], 2, "{st}");
}

/// With `proxy_protocol = "any"` (v1 headers): a complete line that is not
/// a valid header is refused at once, not at the head deadline; a header
/// claiming a loopback address is not exempt from the limits, while a
/// socket's own loopback peer (an UNKNOWN header) is.
#[test]
fn bad_v1_lines_are_refused_at_once_and_claimed_loopback_is_limited() {
    let mut s = settings();
    s.server.proxy_protocol = ProxyProtocol::Any;
    s.server.head_timeout_ms = 30_000;
    s.limits.streams_per_ip = 1;
    assert!(
        s.limits.exempt.contains("127.0.0.0/8"),
        "the default exempts loopback"
    );
    let srv = TestServer::start(s);
    for line in [
        "PROXY TCP4 1.2.3.4\r\n",
        "PROXY TCP4 not-an-address 1.2.3.4 1 2\r\n",
        "PROXY\r\n",
    ] {
        let started = Instant::now();
        let r = exchange_from(
            [127, 0, 0, 2],
            srv.addr,
            format!("{line}{}", get_stream("v")).as_bytes(),
        );
        assert_eq!(r.status, 400, "{line:?}: {}", r.text());
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{line:?}: {:?}",
            started.elapsed()
        );
    }
    let mut first = stream_from([127, 0, 0, 2], srv.addr, &v1("127.0.0.9", 1), &get_stream("v"));
    welcomed(&mut first, "v");
    let second = stream_from([127, 0, 0, 2], srv.addr, &v1("127.0.0.9", 2), &get_stream("v"));
    assert_eq!(second.status, 429, "a claimed loopback address is limited");
    // The balancer's own UNKNOWN header keeps the socket's loopback peer,
    // which the default exempts: past the limit of 1, still served.
    for _ in 0..3 {
        let mut own = stream_from([127, 0, 0, 2], srv.addr, b"PROXY UNKNOWN\r\n", &get_stream("v"));
        welcomed(&mut own, "v");
    }
    assert_eq!(srv.stats()["connections"]["proxy_refused"], 3);
}

/// `streams_per_ip`: one address past its limit gets 429 with
/// `Retry-After` while another still opens streams and gets messages;
/// closing a stream gives its place back.
#[test]
fn an_address_past_its_stream_limit_gets_429_and_others_go_on() {
    let mut s = limited(settings());
    s.limits.streams_per_ip = 2;
    let srv = TestServer::start(s);
    let (two, three) = ([127, 0, 0, 2], [127, 0, 0, 3]);
    let mut held: Vec<StreamClient> = (0..2)
        .map(|_| {
            let mut c = stream_from(two, srv.addr, b"", &get_stream("lim"));
            welcomed(&mut c, "lim");
            c
        })
        .collect();
    let over = stream_from(two, srv.addr, b"", &get_stream("lim"));
    assert_eq!(over.status, 429);
    assert!(over.header("retry-after").is_some());
    // Through actix-web's fallback route (a stream as a second request).
    let mut s = connect_from(two, srv.addr);
    s.write_all(b"GET /healthz HTTP/1.1\r\nhost: t\r\n\r\nGET /test/lim HTTP/1.1\r\nhost: t\r\n\r\n")
        .unwrap();
    let mut r = BufReader::new(s);
    assert_eq!(read_response(&mut r).unwrap().status, 200);
    assert_eq!(read_head(&mut r).unwrap().0, 429);
    let mut other = stream_from(three, srv.addr, b"", &get_stream("lim"));
    welcomed(&mut other, "lim");
    let sent = exchange_from(three, srv.addr, &post("/send/lim", "hello", ""));
    assert_eq!(sent.status, 200);
    assert_eq!(other.line(), "Recvd msg #1: 'hello'");
    for c in &mut held {
        assert_eq!(c.line(), "Recvd msg #1: 'hello'");
    }
    let st = srv.stats();
    assert_eq!(st["limits"]["refused"]["streams"], 2, "{st}");
    assert_eq!(st["connections"]["bad_heads"], 0, "a 429 is not a bad head: {st}");
    assert_eq!(st["limits"]["addresses_with_streams"], 2, "{st}");
    // No publish token set: the addresses refused are shown.
    assert_eq!(st["limits"]["refusing"][0]["address"], "127.0.0.2", "{st}");
    assert_eq!(st["limits"]["refusing"][0]["limit"], "streams", "{st}");
    // A place given back when a stream closes.
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut c = stream_from(two, srv.addr, b"", &get_stream("lim"));
        if c.status == 200 {
            welcomed(&mut c, "lim");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the closed stream's place never came back"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `stream_opens_per_ip_per_s` and `publishes_per_ip_per_s`, with their
/// bursts: past them 429 with `Retry-After`, for that address only.
#[test]
fn opening_and_publishing_too_fast_gets_429_per_address() {
    let mut s = limited(settings());
    s.limits.stream_opens_per_ip_per_s = 1;
    s.limits.stream_opens_burst = 2;
    s.limits.publishes_per_ip_per_s = 1;
    s.limits.publishes_burst = 2;
    let srv = TestServer::start(s);
    let (two, three) = ([127, 0, 0, 2], [127, 0, 0, 3]);
    let opened: Vec<u16> = (0..3)
        .map(|_| stream_from(two, srv.addr, b"", &get_stream("r")).status)
        .collect();
    assert_eq!(opened, [200, 200, 429]);
    assert_eq!(stream_from(three, srv.addr, b"", &get_stream("r")).status, 200);
    let sent: Vec<Response> = (0..3)
        .map(|n| exchange_from(two, srv.addr, &post("/send/r", &format!("{n}"), "")))
        .collect();
    assert_eq!(sent.iter().map(|r| r.status).collect::<Vec<_>>(), [200, 200, 429]);
    let retry: u64 = sent[2].header("retry-after").unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry), "{retry}");
    assert!(sent[2].error().contains("publishes"), "{}", sent[2].error());
    assert_eq!(
        exchange_from(three, srv.addr, &post("/broadcast", "b", "")).status,
        200
    );
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(
        exchange_from(two, srv.addr, &post("/send/r", "later", "")).status,
        200
    );
    let st = srv.stats();
    assert_eq!(st["limits"]["refused"]["stream_opens"], 1, "{st}");
    assert_eq!(st["limits"]["refused"]["publishes"], 1, "{st}");
}

/// A burst left unset follows its rate: with `publishes_per_ip_per_s = 5`
/// and no `publishes_burst`, five publishes from one address go through at
/// once and the sixth and after are refused with 429 and a reason naming
/// the rate and the burst (not 2,000 through at once, the old default).
/// A burst that is set is honoured as given: 8 at once, then 429.
#[test]
fn an_unset_burst_follows_its_rate_and_a_set_one_is_honoured() {
    // Publishes sent back to back take far less than the 200 ms in which
    // 5 a second gives one back; on a slow run, each 200 ms gone may have
    // let one more through.
    let publish_at_once = |srv: &TestServer, n: usize| {
        let from = [127, 0, 0, 2];
        let started = Instant::now();
        let answers: Vec<Response> = (0..n)
            .map(|i| exchange_from(from, srv.addr, &post("/send/b", &format!("{i}"), "")))
            .collect();
        let given_back = (started.elapsed().as_millis() / 200) as usize;
        (answers, given_back)
    };
    for (burst, expected) in [(None, 5), (Some(8), 8)] {
        let mut s = limited(settings());
        s.limits.publishes_per_ip_per_s = 5;
        if let Some(burst) = burst {
            s.limits.publishes_burst = burst;
        }
        let srv = TestServer::start(s);
        let (answers, given_back) = publish_at_once(&srv, expected + 4);
        let statuses: Vec<u16> = answers.iter().map(|r| r.status).collect();
        let admitted = statuses.iter().filter(|s| **s == 200).count();
        assert!(
            statuses[..expected].iter().all(|s| *s == 200),
            "burst {burst:?}: the first {expected} at once: {statuses:?}"
        );
        assert!(
            admitted <= expected + given_back,
            "burst {burst:?}: {admitted} admitted at once, {given_back} given back: {statuses:?}"
        );
        let refused = answers
            .iter()
            .find(|r| r.status == 429)
            .unwrap_or_else(|| panic!("burst {burst:?}: nothing refused: {statuses:?}"));
        assert!(refused.header("retry-after").is_some());
        let reason = refused.error();
        assert!(
            reason.contains(&format!("5 publishes a second (bursts of {expected})")),
            "{reason}"
        );
        let st = srv.stats();
        assert_eq!(
            st["limits"]["refused"]["publishes"],
            statuses.len() - admitted,
            "{st}"
        );
    }
}

/// With a publish token set, `/stats` shows the refused addresses only to
/// who sends it: anyone can read the rest of `/stats`.
#[test]
fn refused_addresses_are_shown_only_with_the_publish_token() {
    let mut s = limited(settings());
    s.auth.publish_token = "t0ken".into();
    s.limits.streams_per_ip = 1;
    let srv = TestServer::start(s);
    let mut one = stream_from([127, 0, 0, 2], srv.addr, b"", &get_stream("tok"));
    welcomed(&mut one, "tok");
    assert_eq!(
        stream_from([127, 0, 0, 2], srv.addr, b"", &get_stream("tok")).status,
        429
    );
    let open = srv.stats();
    assert_eq!(open["limits"]["refused"]["streams"], 1, "{open}");
    assert!(open["limits"]["refusing"].is_null(), "{open}");
    let with = common::request(
        srv.admin,
        "GET",
        "/stats",
        &[("authorization", "Bearer t0ken")],
        b"",
    )
    .unwrap();
    let with = with.json();
    assert_eq!(with["limits"]["refusing"][0]["address"], "127.0.0.2", "{with}");
}

/// `X-Forwarded-For` is believed only from `http.trusted_proxies`: from
/// 127.0.0.2 (trusted) it names the client, on the lean path and on
/// actix-web's; from 127.0.0.3 it is ignored.
#[test]
fn forwarded_for_counts_only_from_a_trusted_proxy() {
    let mut s = limited(settings());
    s.http.trusted_proxies = "127.0.0.2".into();
    s.limits.streams_per_ip = 1;
    s.limits.publishes_per_ip_per_s = 1;
    s.limits.publishes_burst = 1;
    let srv = TestServer::start(s);
    let (proxy, direct) = ([127, 0, 0, 2], [127, 0, 0, 3]);
    let via = |client: &str| format!("GET /test/f HTTP/1.1\r\nhost: t\r\nx-forwarded-for: {client}\r\n\r\n");
    let mut a = stream_from(proxy, srv.addr, b"", &via("203.0.113.5"));
    welcomed(&mut a, "f");
    assert_eq!(stream_from(proxy, srv.addr, b"", &via("203.0.113.5")).status, 429);
    // A client's own forged entry left of the proxy's is not believed.
    let mut b = stream_from(proxy, srv.addr, b"", &via("203.0.113.5, 203.0.113.6"));
    welcomed(&mut b, "f");
    // Not from a trusted proxy: the header is the client's own words.
    let mut c = stream_from(direct, srv.addr, b"", &via("203.0.113.7"));
    welcomed(&mut c, "f");
    assert_eq!(
        stream_from(direct, srv.addr, b"", &via("203.0.113.8")).status,
        429
    );
    let send = |from, client: &str| {
        exchange_from(
            from,
            srv.addr,
            &post("/send/f", "x", &format!("x-forwarded-for: {client}\r\n")),
        )
        .status
    };
    assert_eq!(send(proxy, "198.51.100.1"), 200);
    assert_eq!(send(proxy, "198.51.100.1"), 429);
    assert_eq!(send(proxy, "198.51.100.2"), 200);
}

/// HAProxy (Debian's) in TCP mode in front, sending the PROXY protocol
/// (`send-proxy-v2`, then `send-proxy`): a plain stream, an SSE stream
/// and a WebSocket stream through it get a message sent through it, and
/// the per-address limits apply to the addresses the clients bound
/// (127.0.0.2, .3), not to HAProxy's.
#[test]
fn through_haproxy_the_limits_see_the_clients_addresses() {
    for (version, send_proxy) in [("v2", "send-proxy-v2"), ("v1", "send-proxy")] {
        let mut s = limited(settings());
        s.server.proxy_protocol = if version == "v2" {
            ProxyProtocol::V2
        } else {
            ProxyProtocol::V1
        };
        s.limits.streams_per_ip = 3;
        s.limits.publishes_per_ip_per_s = 1;
        s.limits.publishes_burst = 2;
        let srv = TestServer::start(s);
        let haproxy = Haproxy::start(srv.addr, send_proxy);
        let front = haproxy.addr;
        let (two, three) = ([127, 0, 0, 2], [127, 0, 0, 3]);
        let mut plain = stream_from(two, front, b"", &get_stream("hp"));
        welcomed(&mut plain, "hp");
        let mut sse = stream_from(
            two,
            front,
            b"",
            "GET /test/hp HTTP/1.1\r\nhost: t\r\naccept: text/event-stream\r\n\r\n",
        );
        assert_eq!(sse.status, 200, "{version}");
        assert_eq!(sse.header("content-type"), Some("text/event-stream"));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut ws = rt.block_on(async {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
            let tcp = socket.connect(front).await.unwrap();
            let (ws, resp) = tokio_tungstenite::client_async(format!("ws://{front}/test/hp"), tcp)
                .await
                .unwrap();
            assert_eq!(resp.status(), 101);
            ws
        });
        // Three streams from 127.0.0.2: its fourth is refused, 127.0.0.3's
        // first is not.
        assert_eq!(
            stream_from(two, front, b"", &get_stream("hp")).status,
            429,
            "{version}"
        );
        let mut other = stream_from(three, front, b"", &get_stream("hp"));
        welcomed(&mut other, "hp");
        let r = exchange_from(three, front, &post("/send/hp", "via haproxy", ""));
        assert_eq!(r.status, 200, "{version}: {}", r.text());
        assert_eq!(plain.line(), "Recvd msg #1: 'via haproxy'");
        assert_eq!(other.line(), "Recvd msg #1: 'via haproxy'");
        let mut sse_text = String::new();
        while !sse_text.contains("via haproxy") {
            let chunk = common::read_chunk(&mut sse.reader).unwrap().unwrap();
            sse_text.push_str(&String::from_utf8_lossy(&chunk));
        }
        rt.block_on(async {
            use futures_util::StreamExt as _;
            loop {
                let m = tokio::time::timeout(READ_TIMEOUT, ws.next())
                    .await
                    .unwrap()
                    .unwrap()
                    .unwrap();
                if m.to_text().unwrap().contains("via haproxy") {
                    break;
                }
            }
        });
        // Publishes: two from .3 already in its burst after one more; .2's own.
        assert_eq!(
            exchange_from(three, front, &post("/send/hp", "2", "")).status,
            200
        );
        assert_eq!(
            exchange_from(three, front, &post("/send/hp", "3", "")).status,
            429,
            "{version}"
        );
        assert_eq!(
            exchange_from(two, front, &post("/send/hp", "4", "")).status,
            200,
            "{version}"
        );
        let st = srv.stats();
        assert_eq!(st["limits"]["addresses_with_streams"], 2, "{version}: {st}");
        assert_eq!(st["connections"]["proxy_refused"], 0, "{version}: {st}");
    }
}

/// A real `haproxy` in TCP mode on a free port, forwarding to `backend`
/// with `send_proxy` (`send-proxy` or `send-proxy-v2`); stopped (SIGKILL
/// to the process this started) on drop.
struct Haproxy {
    addr: SocketAddr,
    child: std::process::Child,
    dir: std::path::PathBuf,
}

impl Haproxy {
    /// Retries on another port if its port was taken meanwhile: haproxy
    /// refuses port 0 (`invalid port '0'`), so it is given a free one.
    fn start(backend: SocketAddr, send_proxy: &str) -> Haproxy {
        let mut last = String::new();
        for _ in 0..3 {
            match Self::try_start(backend, send_proxy) {
                Ok(h) => return h,
                Err(e) => last = e,
            }
        }
        panic!("haproxy did not start: {last}");
    }

    fn try_start(backend: SocketAddr, send_proxy: &str) -> Result<Haproxy, String> {
        let port = common::free_port();
        let dir = std::env::temp_dir().join(format!("sb-haproxy-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("haproxy.cfg");
        std::fs::write(
            &conf,
            format!(
                "global\n  maxconn 1000\ndefaults\n  mode tcp\n  timeout connect 5s\n  timeout client 1h\n  \
                 timeout server 1h\nfrontend f\n  bind 127.0.0.1:{port}\n  default_backend b\n\
                 backend b\n  server s {backend} {send_proxy}\n"
            ),
        )
        .unwrap();
        let log = dir.join("haproxy.log");
        let mut child = std::process::Command::new("haproxy")
            .args(["-f", &conf.display().to_string(), "-db"])
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("haproxy (apt-get install -y haproxy): {e}"));
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let _ = std::fs::remove_dir_all(&dir);
                return Err(format!("exited with {status}: {text}"));
            }
            // Listening, and it is this haproxy that listens there (a
            // server of another test on a port taken first would answer
            // a connect too).
            if common::listening_ports(child.id()).contains(&port) {
                return Ok(Haproxy { addr, child, dir });
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("did not listen on {addr} within 5 s"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
