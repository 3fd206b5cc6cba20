//! https:// and wss:// served natively (`server.tls_*`), against the
//! clients people use: curl (OpenSSL) for chunked, HTTP/1.0 and SSE
//! streams, publishing, `/dispatcher`, `/metrics`, the dashboard and
//! resume; tokio-tungstenite over rustls for WebSocket; rustls itself for
//! a client that stops reading. Each server here keeps its first port plain
//! (for the test's own `/stats` requests) and serves TLS on its second
//! (`server.tls_ports`), so one process serving both is tested throughout.
//! Chromium's EventSource and WebSocket on an https page are in
//! `tests/browser.rs`.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::process::Proc;
use common::{Certificates, TestServer, make_certificates, make_expired_certificate, settings};
use rustls::pki_types::ServerName;

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("switchboard-tls-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The authorities in the PEM file `ca`.
fn roots(ca: &Path) -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    use rustls::pki_types::pem::PemObject as _;
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    roots
}

/// A rustls client configuration trusting only `ca`.
fn client_config(ca: &Path) -> Arc<rustls::ClientConfig> {
    let roots = roots(ca);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

type TlsClient = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A blocking TLS connection to `addr` for `127.0.0.1`, trusting `ca`;
/// the handshake is done (or failed) when this returns.
fn tls_connect(addr: SocketAddr, ca: &Path) -> Result<TlsClient, std::io::Error> {
    let tcp = TcpStream::connect(addr)?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    let name = ServerName::IpAddress(addr.ip().into());
    let conn = rustls::ClientConnection::new(client_config(ca), name).map_err(std::io::Error::other)?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock)?;
    }
    Ok(tls)
}

/// curl with the test authority, its exit status and output.
fn curl(ca: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert"])
        .arg(ca)
        .args(args)
        .output()
        .expect("curl (apt-get install -y curl)");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A curl holding a stream: its output, collected as it comes.
struct Held {
    child: Child,
    out: Arc<Mutex<String>>,
}

impl Held {
    fn start(ca: &Path, args: &[&str]) -> Held {
        let mut child = Command::new("curl")
            .args(["-sSN", "--max-time", "30", "--cacert"])
            .arg(ca)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("curl (apt-get install -y curl)");
        let mut stdout = child.stdout.take().unwrap();
        let out = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&out);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Held { child, out }
    }

    /// Waits up to 10 s for the output to contain `text`.
    fn wait_for(&self, text: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let out = self.out.lock().unwrap().clone();
            if out.contains(text) {
                return out;
            }
            assert!(Instant::now() < deadline, "no {text:?} within 10 s; got: {out:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn url(addr: SocketAddr, path: &str) -> String {
    format!("https://{addr}{path}")
}

/// Every stream transport curl speaks, over TLS, from one process that
/// also serves plain HTTP: each gets its welcome and a published message;
/// publishing, `/dispatcher`, `/metrics`, the dashboard and a resume work
/// over TLS as well.
#[test]
fn curl_holds_every_transport_over_tls_and_every_route_answers() {
    let dir = temp_dir("curl");
    let certs = make_certificates(&dir, "curl");
    let mut s = settings();
    // The operator pages on a public (here TLS) port: with the admin token.
    s.auth.admin_token = "ops-token".into();
    let srv = TestServer::start_tls(s, &certs);
    let tls = srv.addrs[1];
    let ops = "Authorization: Bearer ops-token";
    let chunked = Held::start(&certs.ca, &[&url(tls, "/test/a")]);
    let http10 = Held::start(&certs.ca, &["--http1.0", &url(tls, "/test/a")]);
    let localhost = format!("https://localhost:{}/test/a", tls.port());
    let sse = Held::start(&certs.ca, &["-H", "Accept: text/event-stream", &localhost]);
    for held in [&chunked, &http10] {
        held.wait_for("Switchboard welcomes you! Your Id: a\n");
    }
    sse.wait_for("data: Switchboard welcomes you! Your Id: a");
    srv.wait_stats(Duration::from_secs(5), |s| s["connections"]["active"] == 3);

    let (code, sent, err) = curl(&certs.ca, &["-d", "over tls", &url(tls, "/send/a")]);
    assert_eq!(code, 0, "{err}");
    let sent: serde_json::Value = serde_json::from_str(&sent).unwrap();
    assert_eq!(sent["delivered"], 3, "{sent}");
    for held in [&chunked, &http10, &sse] {
        held.wait_for("Recvd msg #1: 'over tls'");
    }
    // Chunked framing inside TLS: curl would fail on a bad chunk.
    assert!(
        chunked
            .out
            .lock()
            .unwrap()
            .ends_with("Recvd msg #1: 'over tls'\n")
    );

    // Resume over TLS: the message after the first is replayed.
    let first = sent["event_id"].as_u64().unwrap();
    let (_, second, _) = curl(&certs.ca, &["-d", "missed", &url(tls, "/send/a")]);
    assert!(second.contains("\"delivered\":3"), "{second}");
    let resumed = Held::start(
        &certs.ca,
        &[
            "-H",
            "Accept: text/event-stream",
            "-H",
            &format!("Last-Event-ID: {first}"),
            &url(tls, "/test/a"),
        ],
    );
    // A new connection counts its messages from 1.
    let replay = resumed.wait_for("data: Recvd msg #1: 'missed'");
    assert!(!replay.contains("over tls"), "{replay}");

    for path in ["/dispatcher", "/dispatcher"] {
        let (code, n, err) = curl(&certs.ca, &[&url(tls, path)]);
        assert_eq!(code, 0, "{err}");
        assert!(n.trim().parse::<u64>().is_ok(), "{n}");
    }
    let (_, metrics, _) = curl(&certs.ca, &["-H", ops, &url(tls, "/metrics")]);
    let handshakes = metrics
        .lines()
        .find_map(|l| l.strip_prefix("switchboard_tls_handshakes_total "))
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(handshakes.parse::<u64>().unwrap() >= 7, "{handshakes}");
    let (code, page, err) = curl(&certs.ca, &["-H", ops, "-w", "%{http_code}", &url(tls, "/")]);
    assert_eq!(code, 0, "{err}");
    assert!(page.ends_with("200") && page.contains("<html"), "{page}");

    // Plain HTTP on the TLS port is not a handshake: refused and counted.
    let mut plain = TcpStream::connect(tls).unwrap();
    plain
        .write_all(b"GET /test/x HTTP/1.1\r\nhost: t\r\n\r\n")
        .unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut rest = Vec::new();
    let _ = plain.read_to_end(&mut rest);
    assert!(!String::from_utf8_lossy(&rest).contains("welcomes"));
    let s = srv.wait_stats(Duration::from_secs(5), |s| s["tls"]["handshake_failures"] == 1);
    assert_eq!(s["tls"]["handshake_failures"], 1, "{s}");
    drop((chunked, http10, sse, resumed));
    let _ = std::fs::remove_dir_all(&dir);
}

/// WebSocket over TLS with tokio-tungstenite's rustls connector: the
/// welcome, a message, a ping answered, a client message ignored, a clean
/// close; and a token checked over TLS as on plain HTTP.
#[test]
fn tokio_tungstenite_streams_over_wss_with_a_token() {
    use futures_util::{SinkExt as _, StreamExt as _};
    use tokio_tungstenite::tungstenite::Message;
    let dir = temp_dir("wss");
    let certs = make_certificates(&dir, "wss");
    let mut s = settings();
    s.auth.subscribe_secret = "k".into();
    let srv = TestServer::start_tls(s, &certs);
    let tls = srv.addrs[1];
    let token = switchboard::token::mint("k", &["w".to_owned()], Duration::from_secs(60)).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let connector = tokio_tungstenite::Connector::Rustls(client_config(&certs.ca));
        let wss = format!("wss://{tls}/test/w?token={token}");
        let (mut ws, response) =
            tokio_tungstenite::connect_async_tls_with_config(wss, None, false, Some(connector.clone()))
                .await
                .expect("wss handshake");
        assert_eq!(response.status(), 101);
        let next = |m: Option<Result<Message, _>>| match m {
            Some(Ok(Message::Text(t))) => t.to_string(),
            other => panic!("{other:?}"),
        };
        assert_eq!(next(ws.next().await), "Switchboard welcomes you! Your Id: w");
        let post = tokio::task::spawn_blocking({
            let srv_addr = srv.addr;
            move || {
                common::request(srv_addr, "POST", "/send/w", &[], b"secure")
                    .unwrap()
                    .json()
            }
        });
        assert_eq!(post.await.unwrap()["delivered"], 1);
        assert_eq!(next(ws.next().await), "Recvd msg #1: 'secure'");
        ws.send(Message::Ping(b"p".to_vec().into())).await.unwrap();
        ws.send(Message::Text("ignored".into())).await.unwrap();
        match ws.next().await {
            Some(Ok(Message::Pong(p))) => assert_eq!(&p[..], b"p"),
            other => panic!("{other:?}"),
        }
        ws.close(None).await.unwrap();
        while let Some(Ok(m)) = ws.next().await {
            assert!(matches!(m, Message::Close(_)), "{m:?}");
        }

        // No token: refused over TLS with the same 401 as in plain text.
        let refused = tokio_tungstenite::connect_async_tls_with_config(
            format!("wss://{tls}/test/w"),
            None,
            false,
            Some(connector),
        )
        .await;
        match refused {
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 401),
            other => panic!("{other:?}"),
        }
    });
    let s = srv.wait_stats(Duration::from_secs(5), |s| s["connections"]["active"] == 0);
    assert_eq!(s["transports"]["ws_opened"], 1, "{s}");
    assert_eq!(s["transports"]["ws_frames_ignored"], 1, "{s}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The client checks the certificate: one for another host, or expired,
/// is refused by curl and by rustls; the right one is accepted.
#[test]
fn clients_refuse_a_wrong_host_or_an_expired_certificate() {
    let dir = temp_dir("refuse");
    let certs = make_certificates(&dir, "refuse");
    let srv = TestServer::start_tls(settings(), &certs);
    let tls = srv.addrs[1];
    // The certificate names 127.0.0.1 and localhost, not wrong.example.
    let resolve = format!("wrong.example:{}:127.0.0.1", tls.port());
    let other = format!("https://wrong.example:{}/dispatcher", tls.port());
    let (code, _, err) = curl(&certs.ca, &["--resolve", &resolve, &other]);
    assert_eq!(code, 60, "curl refuses the name: {err}");
    let tcp = TcpStream::connect(tls).unwrap();
    let name = ServerName::try_from("example.com").unwrap();
    let conn = rustls::ClientConnection::new(client_config(&certs.ca), name).unwrap();
    let mut wrong = rustls::StreamOwned::new(conn, tcp);
    let e = wrong
        .conn
        .complete_io(&mut wrong.sock)
        .and_then(|_| wrong.conn.complete_io(&mut wrong.sock));
    assert!(format!("{e:?}").contains("NotValidForName"), "{e:?}");
    assert!(tls_connect(tls, &certs.ca).is_ok());
    drop(srv);

    let expired = make_expired_certificate(&dir, "refuse", &certs);
    let stale = Certificates {
        ca: certs.ca.clone(),
        cert: expired,
        key: certs.key.clone(),
    };
    let srv = TestServer::start_tls(settings(), &stale);
    let tls = srv.addrs[1];
    let (code, _, err) = curl(&certs.ca, &[&url(tls, "/dispatcher")]);
    assert_eq!(code, 60, "curl refuses an expired certificate: {err}");
    assert!(err.contains("expired"), "{err}");
    let e = tls_connect(tls, &certs.ca).err().map(|e| format!("{e:?}"));
    assert!(e.as_deref().is_some_and(|e| e.contains("Expired")), "{e:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A handshake that never finishes (nothing sent, or half a ClientHello)
/// is cut at `server.head_timeout_ms` and holds no stream slot meanwhile.
#[test]
fn a_stalled_handshake_is_cut_at_the_head_timeout_and_holds_no_stream_slot() {
    let dir = temp_dir("stall");
    let certs = make_certificates(&dir, "stall");
    let mut s = settings();
    s.server.head_timeout_ms = 2000;
    s.stream.max_streams = 1;
    let srv = TestServer::start_tls(s, &certs);
    let tls = srv.addrs[1];
    let started = Instant::now();
    let silent = TcpStream::connect(tls).unwrap();
    let mut half = TcpStream::connect(tls).unwrap();
    // A TLS record header announcing a 512-byte ClientHello, and 4 bytes of it.
    half.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc])
        .unwrap();
    // The one stream slot is free for a real client meanwhile.
    let mut real = tls_connect(tls, &certs.ca).unwrap();
    real.write_all(b"GET /test/real HTTP/1.1\r\nhost: t\r\n\r\n")
        .unwrap();
    let mut reader = BufReader::new(real);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert_eq!(line, "HTTP/1.1 200 OK\r\n");
    for mut stalled in [silent, half] {
        stalled.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut rest = Vec::new();
        // Closed by the server: EOF (or a reset), not our read timeout.
        match stalled.read_to_end(&mut rest) {
            Ok(_) => assert!(rest.is_empty(), "{rest:?}"),
            Err(e) => assert_ne!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}"),
        }
    }
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(1900) && waited < Duration::from_secs(15),
        "{waited:?}"
    );
    let s = srv.wait_stats(Duration::from_secs(5), |s| s["tls"]["handshake_timeouts"] == 2);
    assert_eq!(s["tls"]["handshake_timeouts"], 2, "{s}");
    assert_eq!(s["connections"]["active"], 1, "{s}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `limits.tls_handshakes_per_ip_per_s`: past the rate and its burst, a
/// connection to a TLS port from the same address is closed before any
/// handshake, and counted in `/stats` and `/metrics`; `limits.exempt`
/// covering the address lets every handshake through.
#[test]
fn tls_handshakes_past_the_rate_per_address_are_refused_unless_exempt() {
    let dir = temp_dir("handshake-rate");
    let certs = make_certificates(&dir, "rate");
    let mut s = settings();
    s.limits.tls_handshakes_per_ip_per_s = 2;
    s.limits.tls_handshakes_burst = 2;
    s.limits.exempt = String::new();
    let srv = TestServer::start_tls(s.clone(), &certs);
    let tls = srv.addrs[1];
    for n in 0..2 {
        let mut c = tls_connect(tls, &certs.ca).unwrap_or_else(|e| panic!("handshake {n}: {e}"));
        c.write_all(b"GET /healthz HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
            .unwrap();
        let mut line = String::new();
        BufReader::new(c).read_line(&mut line).unwrap();
        assert_eq!(line, "HTTP/1.1 200 OK\r\n", "handshake {n}");
    }
    assert!(tls_connect(tls, &certs.ca).is_err(), "the third within a second");
    let st = srv.stats();
    assert_eq!(st["limits"]["refused"]["tls_handshakes"], 1, "{st}");
    assert_eq!(st["tls"]["handshakes"], 2, "{st}");
    let metrics = srv.admin_get("/metrics").text();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("switchboard_limits_refused_total{")
                && l.contains("kind=\"tls_handshakes\"")
                && l.ends_with(" 1")),
        "{metrics}"
    );
    // The same rate, with loopback exempt.
    s.limits.exempt = "127.0.0.0/8".into();
    let srv = TestServer::start_tls(s, &certs);
    for n in 0..5 {
        tls_connect(srv.addrs[1], &certs.ca).unwrap_or_else(|e| panic!("exempt handshake {n}: {e}"));
    }
    let st = srv.stats();
    assert_eq!(st["limits"]["refused"]["tls_handshakes"], 0, "{st}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Behind a balancer (`server.proxy_protocol`), the TLS handshake rate is
/// the PROXY header's client's, not the balancer's: two clients through
/// one balancer address each get their handshake, and the same client's
/// second within the second is closed.
#[test]
fn the_tls_handshake_rate_is_the_proxied_clients() {
    let dir = temp_dir("handshake-rate-proxied");
    let certs = make_certificates(&dir, "proxied");
    let mut s = settings();
    s.server.proxy_protocol = switchboard::config::ProxyProtocol::V1;
    s.limits.tls_handshakes_per_ip_per_s = 1;
    s.limits.tls_handshakes_burst = 1;
    s.limits.exempt = String::new();
    let srv = TestServer::start_tls(s, &certs);
    let tls = srv.addrs[1];
    let via_balancer = |client: &str| {
        let mut tcp = TcpStream::connect(tls).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        tcp.write_all(format!("PROXY TCP4 {client} 127.0.0.1 4000 443\r\n").as_bytes())
            .unwrap();
        let name = ServerName::IpAddress(tls.ip().into());
        let conn = rustls::ClientConnection::new(client_config(&certs.ca), name).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        while tls.conn.is_handshaking() {
            tls.conn.complete_io(&mut tls.sock)?;
        }
        Ok::<_, std::io::Error>(tls)
    };
    via_balancer("192.0.2.1").expect("the first client");
    via_balancer("192.0.2.2").expect("another client, the same balancer");
    assert!(via_balancer("192.0.2.1").is_err(), "the first client again");
    let st = srv.stats();
    assert_eq!(st["limits"]["refused"]["tls_handshakes"], 1, "{st}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A TLS client that stops reading is cut at `stream.max_pending_bytes` of
/// ciphertext, as on plain HTTP; a reader beside it keeps up.
#[test]
fn a_tls_client_that_never_reads_is_cut() {
    let dir = temp_dir("slow");
    let certs = make_certificates(&dir, "slow");
    let mut s = settings();
    s.stream.max_pending_bytes = 256 * 1024;
    s.message.max_bytes = 60_000;
    let srv = TestServer::start_tls(s, &certs);
    let tls = srv.addrs[1];
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(&tls.into()).unwrap();
    let tcp: TcpStream = sock.into();
    let conn =
        rustls::ClientConnection::new(client_config(&certs.ca), ServerName::IpAddress(tls.ip().into()))
            .unwrap();
    let mut slow = rustls::StreamOwned::new(conn, tcp);
    slow.write_all(b"GET /test/slow HTTP/1.1\r\nhost: t\r\n\r\n")
        .unwrap();
    slow.flush().unwrap();
    let mut fast = BufReader::new(tls_connect(tls, &certs.ca).unwrap());
    fast.get_mut()
        .write_all(b"GET /test/fast HTTP/1.1\r\nhost: t\r\n\r\n")
        .unwrap();
    let mut line = String::new();
    while line != "\r\n" {
        line.clear();
        fast.read_line(&mut line).unwrap();
    }
    srv.wait_stats(Duration::from_secs(5), |s| s["connections"]["active"] == 2);
    let msg = "x".repeat(50_000);
    let mut sent = 0;
    while sent < 400 && srv.stats()["connections"]["slow_disconnects"] == 0 {
        assert_eq!(srv.post("/broadcast", &msg).status, 200);
        sent += 1;
    }
    assert!(sent * msg.len() > 256 * 1024, "cut after only {sent} messages");
    let s = srv.wait_stats(Duration::from_secs(5), |s| {
        s["connections"]["slow_disconnects"] == 1
    });
    assert_eq!(s["connections"]["slow_disconnects"], 1, "{s}");
    assert_eq!(s["connections"]["active"], 1, "the reader stays: {s}");
    // The reader got every message, in chunked framing.
    let mut got = 0;
    while got < sent {
        line.clear();
        fast.read_line(&mut line).unwrap();
        if line.starts_with("Recvd msg #") {
            got += 1;
        }
    }
    drop(slow);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The binary: SIGHUP reads the certificate again. New connections get the
/// new one; a stream opened before keeps its connection and its messages;
/// a file that does not load leaves the certificate in use.
#[test]
fn sighup_reloads_the_certificate_while_streams_stay_open() {
    let dir = temp_dir("hup");
    let first = make_certificates(&dir, "first");
    let second = make_certificates(&dir, "second");
    let (cert, key) = (dir.join("served.crt"), dir.join("served.key"));
    std::fs::copy(&first.cert, &cert).unwrap();
    std::fs::copy(&first.key, &key).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_switchboard"));
    cmd.env("SWITCHBOARD__SERVER__PORT", "0")
        .env("SWITCHBOARD__SERVER__TLS_CERT_FILE", &cert)
        .env("SWITCHBOARD__SERVER__TLS_KEY_FILE", &key);
    let (p, addrs) = Proc::start(cmd);
    let addr = addrs[0];
    let mut old = BufReader::new(tls_connect(addr, &first.ca).unwrap());
    old.get_mut()
        .write_all(b"GET /test/kept HTTP/1.1\r\nhost: t\r\n\r\n")
        .unwrap();
    let mut line = String::new();
    while !line.contains("welcomes") {
        line.clear();
        old.read_line(&mut line).unwrap();
    }

    std::fs::copy(&second.cert, &cert).unwrap();
    std::fs::copy(&second.key, &key).unwrap();
    p.signal("HUP");
    p.wait_event("tls_reloaded", Duration::from_secs(10), |_| true);
    assert!(
        tls_connect(addr, &second.ca).is_ok(),
        "the new certificate is served"
    );
    let e = tls_connect(addr, &first.ca).err().map(|e| format!("{e:?}"));
    assert!(e.as_deref().is_some_and(|e| e.contains("UnknownIssuer")), "{e:?}");
    // The stream from before still gets its messages.
    let (code, out, err) = curl(&second.ca, &["-d", "after reload", &url(addr, "/send/kept")]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"delivered\":1"), "{out}");
    line.clear();
    while !line.contains("after reload") {
        line.clear();
        old.read_line(&mut line).unwrap();
    }

    // A key file that does not load: the certificate in use stays.
    std::fs::write(&key, "not a key").unwrap();
    p.signal("HUP");
    let failed = p.wait_event("tls_reload_failed", Duration::from_secs(10), |_| true);
    assert!(
        failed["cause"].as_str().unwrap().contains("server.tls_key_file"),
        "{failed}"
    );
    assert!(tls_connect(addr, &second.ca).is_ok());
    let stats = common::request(p.wait_admin(), "GET", "/stats", &[], b"")
        .unwrap()
        .json();
    assert_eq!(stats["tls"]["reloads"], 1, "{stats}");
    assert_eq!(stats["tls"]["reload_failures"], 1, "{stats}");
    drop(p);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Misconfigured TLS is refused at start, naming the key to fix.
#[test]
fn bad_tls_settings_are_refused_naming_the_key() {
    let dir = temp_dir("config");
    let a = make_certificates(&dir, "a");
    let b = make_certificates(&dir, "b");
    let check = |cert: &Path, key: &Path, ports: &str| {
        let mut s = switchboard::Settings::defaults();
        s.server.tls_cert_file = cert.display().to_string();
        s.server.tls_key_file = key.display().to_string();
        s.server.tls_ports = ports.into();
        s.validate().map_err(|e| e.to_string())
    };
    let none = Path::new("");
    assert!(check(&a.cert, &a.key, "").is_ok());
    assert!(check(&a.cert, &a.key, "8000").is_ok());
    for (cert, key, ports, names, why) in [
        (&*a.cert, none, "", "server.tls_key_file", "needed"),
        (none, &*a.key, "", "server.tls_cert_file", "needed"),
        (none, none, "8443", "server.tls_ports", "needs"),
        (&*a.cert, &*a.key, "8443", "server.tls_ports", "8443"),
        (&*a.cert, &*b.key, "", "server.tls_key_file", "is not the key"),
        (&*a.key, &*a.key, "", "server.tls_cert_file", "no certificate"),
        (
            Path::new("/nonexistent.pem"),
            &*a.key,
            "",
            "server.tls_cert_file",
            "cannot read",
        ),
        (
            &*a.cert,
            &*a.cert,
            "",
            "server.tls_key_file",
            "no PEM private key",
        ),
    ] {
        let e = check(cert, key, ports).unwrap_err();
        assert!(
            e.contains(names) && e.contains(why),
            "{cert:?} {key:?} {ports:?}: {e}"
        );
    }
    // With server.port 0 (a free port) only extra ports can be TLS ports.
    let mut s = switchboard::Settings::defaults();
    s.server.port = 0;
    s.server.extra_ports = "8443".into();
    s.server.tls_cert_file = a.cert.display().to_string();
    s.server.tls_key_file = a.key.display().to_string();
    s.server.tls_ports = "8443".into();
    assert!(s.validate().is_ok());
    s.server.tls_ports = "8444".into();
    let e = s.validate().unwrap_err().to_string();
    assert!(e.contains("server.tls_ports") && e.contains("8444"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client on `version` holding `/test/{id}`, past its response head.
fn tls_stream(
    addr: SocketAddr,
    ca: &Path,
    version: &'static rustls::SupportedProtocolVersion,
    id: &str,
) -> BufReader<TlsClient> {
    tls_stream_with(addr, ca, version, None, id)
}

/// [`tls_stream`] offering only `suite` when given.
fn tls_stream_with(
    addr: SocketAddr,
    ca: &Path,
    version: &'static rustls::SupportedProtocolVersion,
    suite: Option<rustls::CipherSuite>,
    id: &str,
) -> BufReader<TlsClient> {
    let roots = roots(ca);
    let mut provider = rustls::crypto::ring::default_provider();
    if let Some(suite) = suite {
        provider.cipher_suites.retain(|s| s.suite() == suite);
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[version])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let conn =
        rustls::ClientConnection::new(Arc::new(config), ServerName::IpAddress(addr.ip().into())).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    write!(tls, "GET /test/{id} HTTP/1.1\r\nhost: t\r\n\r\n").unwrap();
    let mut reader = BufReader::new(tls);
    let mut line = String::new();
    while line != "\r\n" {
        line.clear();
        reader.read_line(&mut line).unwrap();
    }
    reader
}

/// TLS 1.3 streams keep only their record keys, TLS 1.2 streams their
/// rustls session: both get their messages, and at shutdown the final
/// chunk and a close_notify (rustls reports a close without one as an
/// error). A TLS 1.3 client's KeyUpdate ends its stream (the keys were
/// handed over without the key schedule), and nothing else.
#[test]
fn tls12_and_tls13_streams_end_with_close_notify_and_a_key_update_ends_one() {
    let dir = temp_dir("versions");
    let certs = make_certificates(&dir, "versions");
    let mut s = settings();
    s.server.shutdown_timeout_ms = 10_000;
    let mut srv = TestServer::start_tls(s, &certs);
    let tls = srv.addrs[1];
    let mut v13 = tls_stream(tls, &certs.ca, &rustls::version::TLS13, "v");
    let mut v12 = tls_stream(tls, &certs.ca, &rustls::version::TLS12, "v");
    let mut rekeyed = tls_stream(tls, &certs.ca, &rustls::version::TLS13, "k");
    // Each TLS 1.3 suite: AES-128-GCM's key is kept expanded, the others'
    // as secrets.
    let mut suites: Vec<_> = [
        rustls::CipherSuite::TLS13_AES_128_GCM_SHA256,
        rustls::CipherSuite::TLS13_AES_256_GCM_SHA384,
        rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256,
    ]
    .into_iter()
    .map(|suite| {
        let reader = tls_stream_with(tls, &certs.ca, &rustls::version::TLS13, Some(suite), "v");
        assert_eq!(
            reader.get_ref().conn.negotiated_cipher_suite().unwrap().suite(),
            suite
        );
        reader
    })
    .collect();
    // With every suite offered, the server picks AES-256-GCM.
    assert_eq!(
        v13.get_ref().conn.negotiated_cipher_suite().unwrap().suite(),
        rustls::CipherSuite::TLS13_AES_256_GCM_SHA384
    );
    assert_eq!(
        v12.get_ref().conn.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_2)
    );
    srv.wait_stats(Duration::from_secs(5), |s| s["connections"]["active"] == 6);
    assert_eq!(srv.post("/send/v", "both").json()["delivered"], 5);
    let mut line = String::new();
    for reader in [&mut v13, &mut v12].into_iter().chain(suites.iter_mut()) {
        // Each chunk: its size line, then the event line.
        while !line.contains("Recvd msg #1: 'both'") {
            line.clear();
            reader.read_line(&mut line).unwrap();
        }
        line.clear();
    }

    rekeyed.get_mut().conn.refresh_traffic_keys().unwrap();
    rekeyed.get_mut().flush().unwrap();
    let mut rest = Vec::new();
    let _ = rekeyed.read_to_end(&mut rest);
    let s = srv.wait_stats(Duration::from_secs(5), |s| s["connections"]["active"] == 5);
    assert_eq!(
        s["connections"]["active"], 5,
        "only the rekeyed stream ended: {s}"
    );

    srv.shutdown();
    for reader in [&mut v13, &mut v12].into_iter().chain(suites.iter_mut()) {
        let mut rest = Vec::new();
        // Ok only if the server's close_notify came before the close.
        reader.read_to_end(&mut rest).expect("a clean TLS close");
        let rest = String::from_utf8_lossy(&rest).into_owned();
        assert!(rest.ends_with("0\r\n\r\n"), "the final chunk: {rest:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A handshake the server refuses tells the client why (the alert rustls
/// queued), instead of a bare close: a client offering only HTTP/2 gets
/// `no_application_protocol`.
#[test]
fn a_refused_handshake_sends_its_alert() {
    let dir = temp_dir("alert");
    let certs = make_certificates(&dir, "alert");
    let srv = TestServer::start_tls(settings(), &certs);
    let tls = srv.addrs[1];
    let mut config = (*client_config(&certs.ca)).clone();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = TcpStream::connect(tls).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let conn =
        rustls::ClientConnection::new(Arc::new(config), ServerName::IpAddress(tls.ip().into())).unwrap();
    let mut client = rustls::StreamOwned::new(conn, tcp);
    let mut e = None;
    for _ in 0..4 {
        if let Err(err) = client.conn.complete_io(&mut client.sock) {
            e = Some(err);
            break;
        }
    }
    let e = format!("{e:?}");
    assert!(e.contains("NoApplicationProtocol"), "{e}");
    let s = srv.wait_stats(Duration::from_secs(5), |s| s["tls"]["handshake_failures"] == 1);
    assert_eq!(s["tls"]["handshake_failures"], 1, "{s}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A connection to write to and read from, plain or TLS.
trait Conn: Read + Write {}
impl<T: Read + Write> Conn for T {}

/// Writes `pieces` to `conn` one at a time (one TLS record each, a pause
/// between them, so the server reads them apart) and reads the answer's
/// status and, unless it is a stream (200), its `error`.
fn lean_exchange(mut conn: Box<dyn Conn>, pieces: &[&str]) -> (u16, String) {
    for piece in pieces {
        conn.write_all(piece.as_bytes()).unwrap();
        conn.flush().unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut reader = BufReader::new(conn);
    let (status, headers) = common::read_head(&mut reader).unwrap();
    if status == 200 {
        return (status, String::new());
    }
    let length = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.parse().unwrap())
        .unwrap();
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    let response = common::Response {
        status,
        headers,
        body,
    };
    (status, response.error())
}

/// The lean path reads and refuses a head in the same steps over TLS as on
/// a plain port: a stream head sent in pieces opens the stream, and a
/// request target with a fragment, a head without `Host` sent in pieces, and
/// a stream request with a body get the plain port's answers.
#[test]
fn lean_heads_and_refusals_over_tls_answer_as_over_plain() {
    let dir = temp_dir("lean-heads");
    let certs = make_certificates(&dir, "lean-heads");
    let srv = TestServer::start_tls(settings(), &certs);
    let (plain, tls) = (srv.addrs[0], srv.addrs[1]);
    let cases: [(&[&str], u16); 4] = [
        (&["GET /test/p HTTP/1.1\r\n", "host: t\r\n", "\r\n"], 200),
        (&["GET /test/a#b HTTP/1.1\r\nhost: x\r\n\r\n"], 400),
        (&["GET /test/p HTTP/1.1\r\n", "x: y\r\n\r\n"], 400),
        (
            &["GET /test/p HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\n"],
            400,
        ),
    ];
    for (pieces, status) in cases {
        let on_plain = {
            let tcp = TcpStream::connect(plain).unwrap();
            tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            lean_exchange(Box::new(tcp), pieces)
        };
        let on_tls = lean_exchange(Box::new(tls_connect(tls, &certs.ca).unwrap()), pieces);
        assert_eq!(on_plain.0, status, "{pieces:?} on the plain port: {on_plain:?}");
        assert_eq!(on_tls, on_plain, "{pieces:?} over TLS");
    }
    let fragment = lean_exchange(
        Box::new(tls_connect(tls, &certs.ca).unwrap()),
        &["GET /test/a#b HTTP/1.1\r\nhost: x\r\n\r\n"],
    );
    assert!(fragment.1.contains("fragment"), "{fragment:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `/dispatcher` over TLS answers as on the plain port (the lean path on
/// both): the same status and headers, the Counter's next number, two
/// requests on one kept-alive connection, a request of another kind after
/// them still served, by actix-web, on that connection, and a client that
/// asks to close getting a close_notify after its answer.
#[test]
fn dispatcher_over_tls_answers_as_over_plain_and_keeps_alive() {
    let dir = temp_dir("dispatcher");
    let certs = make_certificates(&dir, "dispatcher");
    let srv = TestServer::start_tls(settings(), &certs);
    let (plain, tls) = (srv.addrs[0], srv.addrs[1]);
    let ask = b"GET /dispatcher HTTP/1.1\r\nhost: t\r\n\r\n";
    let sans_date = |r: &common::Response| -> Vec<(String, String)> {
        let date = |k: &str| k.eq_ignore_ascii_case("date");
        r.headers.iter().filter(|(k, _)| !date(k)).cloned().collect()
    };
    let tcp = TcpStream::connect(plain).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut on_plain = BufReader::new(tcp);
    on_plain.get_mut().write_all(ask).unwrap();
    let first = common::read_response(&mut on_plain).unwrap();
    assert_eq!(first.status, 200, "{}", first.text());
    let mut numbers = vec![first.text().parse::<u64>().unwrap()];
    let mut on_tls = BufReader::new(tls_connect(tls, &certs.ca).unwrap());
    for _ in 0..2 {
        on_tls.get_mut().write_all(ask).unwrap();
        on_tls.get_mut().flush().unwrap();
        let r = common::read_response(&mut on_tls).unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(sans_date(&r), sans_date(&first), "the plain port's headers");
        numbers.push(r.text().parse().unwrap());
    }
    on_tls
        .get_mut()
        .write_all(b"GET /dispatcher?x HTTP/1.1\r\nhost: t\r\n\r\n")
        .unwrap();
    on_tls.get_mut().flush().unwrap();
    let other = common::read_response(&mut on_tls).unwrap();
    assert_eq!(other.status, 200, "{}", other.text());
    numbers.push(other.text().parse().unwrap());
    // A client that asks to close gets its answer, then a close_notify.
    let mut closing = BufReader::new(tls_connect(tls, &certs.ca).unwrap());
    let close = b"GET /dispatcher HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n";
    closing.get_mut().write_all(close).unwrap();
    closing.get_mut().flush().unwrap();
    let last = common::read_response(&mut closing).unwrap();
    assert_eq!(last.status, 200, "{}", last.text());
    numbers.push(last.text().parse().unwrap());
    let mut rest = Vec::new();
    closing.read_to_end(&mut rest).expect("a clean TLS close");
    assert!(rest.is_empty(), "{rest:?}");
    let from = numbers[0];
    assert_eq!(
        numbers,
        (from..from + 5).collect::<Vec<_>>(),
        "each the next number"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
