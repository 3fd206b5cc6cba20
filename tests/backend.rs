//! The application in the loop, as real processes: the identity provider's
//! JWKS served by a Python backend (tests/backend/app.py), its tokens
//! minted with PyJWT (tests/backend/idp.py), the server as its binary.

#[path = "common/app.rs"]
mod app;
mod common;

use std::io::BufReader;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use app::{Backend, HERE, hs256, idp, token};
use common::process::Proc;
use common::{StreamClient, request};

const BIN: &str = env!("CARGO_BIN_EXE_switchboard");

/// A request for `target` sent second on a keep-alive connection (after a
/// `/healthz`), so that actix-web's route serves it: the connection, its
/// answer next.
fn fallback(addr: SocketAddr, target: &str) -> BufReader<std::net::TcpStream> {
    use std::io::Write as _;
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"GET /healthz HTTP/1.1\r\nhost: t\r\n\r\n").unwrap();
    let mut reader = BufReader::new(c);
    assert_eq!(common::read_response(&mut reader).unwrap().text(), "ok");
    let req = format!("GET {target} HTTP/1.1\r\nhost: t\r\n\r\n");
    reader.get_mut().write_all(req.as_bytes()).unwrap();
    reader
}

/// curl's output for `args`, trusting the test authority `ca`.
fn curl_tls(ca: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new("curl")
        .args(["-sS", "--cacert"])
        .arg(ca)
        .args(args)
        .output()
        .expect("curl (apt-get install -y curl)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `cmd`'s output, once it exits; killed (and the test failed) if it has
/// not within 30 s.
fn output_within(mut cmd: Command) -> std::process::Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} still running after 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn server(jwks: &str) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env("SWITCHBOARD__SERVER__PORT", "0")
        .env("SWITCHBOARD__AUTH__JWKS_URL", jwks)
        .env("SWITCHBOARD__AUTH__SUBSCRIBE_AUDIENCE", "switchboard")
        .env("SWITCHBOARD__STREAM__TICK_INTERVAL_MS", "3600000");
    cmd
}

struct Running {
    p: Proc,
    addr: SocketAddr,
    admin: SocketAddr,
}

impl Running {
    fn start(cmd: Command) -> Running {
        let p = Proc::spawn(cmd);
        let addr = p.wait_listening()[0];
        let admin = p.wait_admin();
        Running { p, addr, admin }
    }

    fn stats(&self) -> serde_json::Value {
        request(self.admin, "GET", "/stats", &[], b"").unwrap().json()
    }

    /// A stream request with `token`, refused: its status, its error, and
    /// its `Retry-After`.
    fn refused(&self, id: &str, token: &str) -> (u16, String, Option<String>) {
        let r = request(self.addr, "GET", &format!("/test/{id}?token={token}"), &[], b"").unwrap();
        assert_ne!(r.status, 200, "admitted");
        (r.status, r.error(), r.header("retry-after").map(str::to_owned))
    }

    /// [`Running::refused`], through actix-web's route: the stream request
    /// second on a keep-alive connection.
    fn refused_fallback(&self, id: &str, token: &str) -> (u16, String, Option<String>) {
        let mut answer = fallback(self.addr, &format!("/test/{id}?token={token}"));
        let r = common::read_response(&mut answer).unwrap();
        assert_ne!(r.status, 200, "admitted");
        (r.status, r.error(), r.header("retry-after").map(str::to_owned))
    }

    /// A stream opened with `token`, its welcome read.
    fn opens(&self, id: &str, token: &str) -> StreamClient {
        let mut s = StreamClient::open_raw(
            self.addr,
            &format!("GET /test/{id}?token={token} HTTP/1.1\r\nhost: t\r\n\r\n"),
        );
        assert_eq!(s.status, 200, "{id} refused");
        assert_eq!(s.line(), format!("Switchboard welcomes you! Your Id: {id}"));
        s
    }
}

fn jwks_of(keys: &[&str]) -> String {
    let mut args = vec!["jwks"];
    args.extend_from_slice(keys);
    idp(&args)
}

/// Tokens PyJWT signs with the keys of a JWKS (RS256, ES256, EdDSA) open
/// streams, their `kid` choosing the key. A key rotated in is fetched
/// again when a token first names it; `kid`s nobody published cost the
/// provider at most one fetch per 5 s. Algorithm confusion (HS256 signed
/// with the published RSA key), `alg: none`, another audience: refused.
#[test]
fn identity_provider_keys_from_a_jwks_rotate_by_kid() {
    use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
    let idp_app = Backend::start("jwks");
    idp_app.write("jwks.json", &jwks_of(&["rsa:r1"]));
    let s = Running::start(server(&idp_app.url("/jwks")));
    // The first fetch was over before the server said it listens.
    let started = Instant::now();
    assert_eq!(idp_app.asked("/jwks"), 1, "fetched at start-up");
    assert_eq!(s.stats()["auth"]["jwks_keys"], 1);

    let mut a = s.opens("foo", &token("rsa", "RS256", "r1", "foo"));
    // Another id than the token's, another audience: refused.
    let (status, why, _) = s.refused("bar", &token("rsa", "RS256", "r1", "foo"));
    assert_eq!((status, why.contains("not for id")), (401, true), "{why}");
    let other_aud = idp(&["token", "rsa", "RS256", "r1", "foo", "another-app"]);
    let (status, why, _) = s.refused("foo", &other_aud);
    assert_eq!((status, why.contains("audience")), (401, true), "{why}");

    // The classic confusion: HS256 with the published public key as secret.
    let exp = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        + Duration::from_secs(600))
    .as_secs();
    let claims = serde_json::json!({ "sub": "foo", "exp": exp, "aud": "switchboard" });
    let public = std::fs::read(format!("{HERE}/../fixtures/jwt/rsa.pub.pem")).unwrap();
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("r1".into());
    let confused = encode(&header, &claims, &EncodingKey::from_secret(&public).unwrap()).unwrap();
    let (status, why, _) = s.refused("foo", &confused);
    assert_eq!(
        (status, why.contains("token alg HS256 is not accepted")),
        (401, true),
        "{why}"
    );
    let none = {
        use base64::Engine as _;
        let b64 =
            |v: serde_json::Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        format!(
            "{}.{}.",
            b64(serde_json::json!({ "alg": "none", "kid": "r1" })),
            b64(claims)
        )
    };
    let (status, why, _) = s.refused("foo", &none);
    assert_eq!(
        (status, why.contains("token alg none is not accepted")),
        (401, true),
        "{why}"
    );
    assert_eq!(
        idp_app.asked("/jwks"),
        1,
        "no fetch for tokens refused by their alg"
    );

    // A kid nobody published, within 5 s of the last fetch: refused at
    // once, and no fetch.
    let es = token("p256", "ES256", "e1", "foo");
    let (status, why, _) = s.refused("foo", &es);
    assert_eq!(status, 401, "{why}");
    assert!(
        why.contains("kid \"e1\" names none of auth.jwks_url's keys"),
        "{why}"
    );
    assert_eq!(idp_app.asked("/jwks"), 1);

    // The provider rotates e1 and an Ed25519 key in. Past 5 s the first
    // token naming one fetches them again, and opens.
    idp_app.write("jwks.json", &jwks_of(&["rsa:r1", "p256:e1", "ed25519:d1"]));
    std::thread::sleep(Duration::from_secs(5).saturating_sub(started.elapsed()) + Duration::from_millis(300));
    let mut b = s.opens("foo", &es);
    assert_eq!(idp_app.asked("/jwks"), 2);
    let _c = s.opens("foo", &token("ed25519", "EdDSA", "d1", "foo"));
    assert_eq!(s.stats()["auth"]["jwks_keys"], 3);

    // A flood of made-up kids: one fetch at most per 5 s, each refused.
    for i in 0..20 {
        let (status, _, _) = s.refused("foo", &token("rsa", "RS256", &format!("made-up-{i}"), "foo"));
        assert_eq!(status, 401);
    }
    assert!(idp_app.asked("/jwks") <= 3, "{} fetches", idp_app.asked("/jwks"));

    // The streams opened with either key get what is published.
    let r = request(s.addr, "POST", "/send/foo", &[], b"rotated").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(a.line(), "Recvd msg #1: 'rotated'");
    assert_eq!(b.line(), "Recvd msg #1: 'rotated'");
}

/// The provider down: the keys held keep opening streams at once (no
/// network call on the stream path for a known kid), each failed fetch is
/// counted and logged; an unknown kid while it hangs waits at most 3 s and
/// is answered 503 with Retry-After, not 401. It comes back: the next
/// fetch takes its keys.
#[test]
fn a_jwks_endpoint_that_fails_keeps_the_keys_held() {
    let idp_app = Backend::start("jwks-down");
    idp_app.write("jwks.json", &jwks_of(&["rsa:r1"]));
    let mut cmd = server(&idp_app.url("/jwks"));
    cmd.env("SWITCHBOARD__AUTH__JWKS_REFRESH_MS", "1000");
    let s = Running::start(cmd);
    let known = token("rsa", "RS256", "r1", "foo");
    let _a = s.opens("foo", &known);

    for mode in ["500", "garbage"] {
        idp_app.write("jwks.mode", mode);
        let failures = s.stats()["auth"]["jwks_failures"].as_u64().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while s.stats()["auth"]["jwks_failures"].as_u64().unwrap() == failures {
            assert!(Instant::now() < deadline, "{mode}: no failure counted");
            std::thread::sleep(Duration::from_millis(100));
        }
        let _b = s.opens("foo", &known);
        assert_eq!(s.stats()["auth"]["jwks_keys"], 1);
    }
    s.p.wait_event("jwks_fetch_failed", Duration::from_secs(1), |e| {
        e["error"].as_str().is_some_and(|why| why.contains("500"))
    });
    s.p.wait_event("jwks_fetch_failed", Duration::from_secs(1), |e| {
        e["error"].as_str().is_some_and(|why| why.contains("not a JWKS"))
    });
    let metrics = request(s.admin, "GET", "/metrics", &[], b"").unwrap().text();
    let failed = metrics
        .lines()
        .find_map(|l| l.strip_prefix("switchboard_jwks_failures_total "))
        .expect("switchboard_jwks_failures_total");
    assert!(failed.parse::<u64>().unwrap() >= 2, "{failed}");

    // Hanging: a known kid opens at once, an unknown one waits for the
    // fetch at most 3 s and is told to retry.
    idp_app.write("jwks.mode", "hang");
    std::thread::sleep(Duration::from_millis(1500));
    let t = Instant::now();
    let _c = s.opens("foo", &known);
    assert!(t.elapsed() < Duration::from_millis(500), "{:?}", t.elapsed());
    let t = Instant::now();
    let (status, why, retry) = s.refused("foo", &token("p256", "ES256", "e1", "foo"));
    assert_eq!(status, 503, "{why}");
    assert!(why.contains("auth.jwks_url"), "{why}");
    assert_eq!(retry.as_deref(), Some("5"));
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    // The same through actix-web's route.
    let (status, why, retry) = s.refused_fallback("foo", &token("p256", "ES256", "e1", "foo"));
    assert_eq!((status, retry.as_deref()), (503, Some("5")), "{why}");
    assert_eq!(s.stats()["auth"]["jwks_kid_unavailable"], 2);

    // Back, with e1 rotated in: the next fetch takes it.
    idp_app.write("jwks.json", &jwks_of(&["rsa:r1", "p256:e1"]));
    idp_app.write("jwks.mode", "ok");
    let deadline = Instant::now() + Duration::from_secs(15);
    while s.stats()["auth"]["jwks_keys"] != 2 {
        assert!(Instant::now() < deadline, "the keys did not come back");
        std::thread::sleep(Duration::from_millis(200));
    }
    let _d = s.opens("foo", &token("p256", "ES256", "e1", "foo"));
}

/// At start-up: a JWKS that cannot be fetched stops the start when no
/// other key is set, naming the setting; with a secret beside it the
/// server starts, says so, and HS256 tokens work. A URL that is not
/// http(s) is refused before any fetch.
#[test]
fn an_unreachable_jwks_at_start_up() {
    let idp_app = Backend::start("jwks-start");
    idp_app.write("jwks.mode", "500");
    let out = output_within(server(&idp_app.url("/jwks")));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("auth.jwks_url") && err.contains("500") && err.contains("no other key"),
        "{err}"
    );
    for bad in ["ftp://127.0.0.1/jwks", "not a url"] {
        let out = output_within(server(bad));
        assert!(!out.status.success(), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("auth.jwks_url"), "{bad}: {err}");
    }

    let secret = "s".repeat(32);
    let mut cmd = server(&idp_app.url("/jwks"));
    cmd.env("SWITCHBOARD__AUTH__SUBSCRIBE_SECRET", &secret);
    let s = Running::start(cmd);
    s.p.wait_event("jwks_fetch_failed", Duration::from_secs(5), |_| true);
    let hs = {
        use jsonwebtoken::{EncodingKey, Header, encode};
        let exp = (std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            + Duration::from_secs(600))
        .as_secs();
        let claims = serde_json::json!({ "sub": "foo", "exp": exp, "aud": "switchboard" });
        encode(
            &Header::default(),
            &claims,
            &EncodingKey::from_secret(secret.as_bytes()).unwrap(),
        )
        .unwrap()
    };
    let _a = s.opens("foo", &hs);
    assert_eq!(s.stats()["auth"]["jwks_failures"], 1);
    // Unreachable, and fetched within 5 s: an RS256 token is told to retry.
    let (status, why, _) = s.refused("foo", &token("rsa", "RS256", "r1", "foo"));
    assert_eq!(status, 503, "{why}");
}

// --- The subscribe hook (hooks.subscribe_url) ---

/// A server in this process asking `app`'s hook, with `edit` applied.
fn hooked(app: &Backend, edit: impl FnOnce(&mut switchboard::Settings)) -> common::TestServer {
    let mut s = common::settings();
    s.hooks.subscribe_url = app.url("/hook");
    edit(&mut s);
    common::TestServer::start(s)
}

/// The hook's requests so far, as JSON.
fn hook_log(app: &Backend) -> Vec<serde_json::Value> {
    std::fs::read_to_string(app.state.join("hook.log"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A refused stream request: status, error, `Retry-After`, and the CORS
/// origin allowed.
fn refused_at(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, String, Option<String>, Option<String>) {
    let r = request(addr, "GET", path, headers, b"").unwrap();
    assert_ne!(r.status, 200, "{path} admitted");
    (
        r.status,
        r.error(),
        r.header("retry-after").map(str::to_owned),
        r.header("access-control-allow-origin").map(str::to_owned),
    )
}

/// The application decides on every transport, lean, fallback and TLS:
/// it is asked with the id, the transport, the client's address, the
/// verified token's claims and the forwarded headers; its 2xx admits, its
/// 403 and 401 refuse with its reason, CORS headers included.
#[test]
fn the_subscribe_hook_decides_on_every_transport() {
    let app = Backend::start("hook");
    let secret = "k".repeat(32);
    let dir = std::env::temp_dir().join(format!("switchboard-hook-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let certs = common::make_certificates(&dir, "hook");
    let mut s = common::settings();
    s.hooks.subscribe_url = app.url("/hook");
    s.auth.subscribe_secret = secret.clone();
    s.http.cors_origins = "http://app.example".into();
    let srv = common::TestServer::start_tls(s, &certs);
    let token = |id: &str| hs256(&secret, id);

    // Chunked, with the forwarded headers.
    let req = format!(
        "GET /test/allow-1 HTTP/1.1\r\nhost: t\r\nAuthorization: Bearer {}\r\nCookie: session=abc\r\nOrigin: http://app.example\r\nX-Other: no\r\n\r\n",
        token("allow-1")
    );
    let mut chunked = StreamClient::open_raw(srv.addr, &req);
    assert_eq!(chunked.status, 200);
    assert_eq!(chunked.line(), "Switchboard welcomes you! Your Id: allow-1");
    let asked = hook_log(&app).pop().unwrap();
    assert_eq!(asked["id"], "allow-1");
    assert_eq!(asked["transport"], "chunked");
    assert_eq!(asked["client"], "127.0.0.1");
    assert_eq!(asked["claims"]["sub"], "allow-1");
    assert_eq!(asked["claims"]["role"], "reader");
    assert_eq!(asked["headers"]["cookie"], "session=abc");
    assert_eq!(asked["headers"]["origin"], "http://app.example");
    assert!(
        asked["headers"]["authorization"]
            .as_str()
            .unwrap()
            .starts_with("Bearer ")
    );
    assert!(asked["headers"].get("x-other").is_none(), "{asked}");

    // SSE and WebSocket on the lean path, chunked on the fallback.
    let sse = StreamClient::open_raw(
        srv.addr,
        &format!(
            "GET /test/allow-2?token={} HTTP/1.1\r\nhost: t\r\nAccept: text/event-stream\r\n\r\n",
            token("allow-2")
        ),
    );
    assert_eq!(sse.status, 200);
    assert_eq!(hook_log(&app).pop().unwrap()["transport"], "sse");
    let ws = StreamClient::open_raw(
        srv.addr,
        &format!(
            "GET /test/allow-3?token={} HTTP/1.1\r\nhost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
            token("allow-3")
        ),
    );
    assert_eq!(ws.status, 101);
    assert_eq!(hook_log(&app).pop().unwrap()["transport"], "ws");
    let before = hook_log(&app).len();
    {
        let mut answer = fallback(srv.addr, &format!("/test/deny-fb?token={}", token("deny-fb")));
        let r = common::read_response(&mut answer).unwrap();
        assert_eq!(r.status, 403, "the fallback path asks too: {}", r.text());
        assert!(r.error().contains("not a member of deny-fb"), "{}", r.text());
    }
    assert_eq!(hook_log(&app).len(), before + 1);

    // Refusals: the application's status and reason, CORS named.
    let origin = [("Origin", "http://app.example")];
    for (id, status) in [("deny-1", 403), ("unauth-1", 401)] {
        let (got, why, _, cors) = refused_at(srv.addr, &format!("/test/{id}?token={}", token(id)), &origin);
        assert_eq!(got, status, "{why}");
        assert_eq!(
            why,
            format!("the application refused this stream: not a member of {id}")
        );
        assert_eq!(cors.as_deref(), Some("http://app.example"));
    }
    // A long-poll is asked about as a stream is, on each poll.
    let r = request(
        srv.addr,
        "GET",
        &format!("/test/allow-4?transport=poll&wait=0&token={}", token("allow-4")),
        &[],
        b"",
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(hook_log(&app).pop().unwrap()["transport"], "poll");
    let path = format!("/test/deny-poll?transport=poll&token={}", token("deny-poll"));
    let (got, why, _, cors) = refused_at(srv.addr, &path, &origin);
    assert_eq!(
        (got, why.as_str()),
        (
            403,
            "the application refused this stream: not a member of deny-poll"
        )
    );
    assert_eq!(cors.as_deref(), Some("http://app.example"));
    // A bad token is refused before the application is asked.
    let asked = hook_log(&app).len();
    let (status, _, _, _) = refused_at(srv.addr, "/test/allow-9?token=nope", &[]);
    assert_eq!(status, 401);
    assert_eq!(hook_log(&app).len(), asked);

    // Over TLS, with curl.
    let tls = srv.addrs[1];
    let curl = |args: &[&str]| curl_tls(&certs.ca, args);
    let held = curl(&[
        "-N",
        "--max-time",
        "2",
        &format!(
            "https://127.0.0.1:{}/test/allow-tls?token={}",
            tls.port(),
            token("allow-tls")
        ),
    ]);
    assert!(
        held.starts_with("Switchboard welcomes you! Your Id: allow-tls"),
        "{held}"
    );
    assert_eq!(hook_log(&app).pop().unwrap()["id"], "allow-tls");
    let denied = curl(&[
        "-w",
        " %{http_code}",
        &format!(
            "https://127.0.0.1:{}/test/deny-tls?token={}",
            tls.port(),
            token("deny-tls")
        ),
    ]);
    assert!(
        denied.ends_with(" 403") && denied.contains("not a member of deny-tls"),
        "{denied}"
    );

    let st = srv.stats();
    assert_eq!(st["hooks"]["refused"], 5, "{st}");
    assert_eq!(st["hooks"]["admitted"], 5, "{st}");
    // The streams it admitted are streams like any other.
    let r = srv.post("/send/allow-1", "hooked");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(chunked.line(), "Recvd msg #1: 'hooked'");
    drop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every way the application can fail, with `hooks.on_failure = "refuse"`:
/// 503 with `Retry-After: 1` and why, counted; nothing else waits for it
/// (streams of other ids open and publishes are answered while a call
/// hangs); a redirect is not followed.
#[test]
fn a_failing_subscribe_hook_refuses_with_503_and_blocks_nothing() {
    let app = Backend::start("hook-fail");
    // One worker: a call that held its worker would hold everything.
    let srv = hooked(&app, |s| {
        s.hooks.timeout_ms = 700;
        s.server.workers = 1;
    });
    let hang = std::thread::spawn({
        let addr = srv.addr;
        move || {
            let t = Instant::now();
            let r = refused_at(addr, "/test/hang-1", &[]);
            (r, t.elapsed())
        }
    });
    std::thread::sleep(Duration::from_millis(100));
    // While it hangs: another id opens, a publish is answered.
    let t = Instant::now();
    let mut other = srv.open("allow-during");
    assert_eq!(other.status, 200);
    assert_eq!(other.line(), "Switchboard welcomes you! Your Id: allow-during");
    let r = srv.post("/send/allow-during", "meanwhile");
    assert_eq!(r.status, 200);
    assert_eq!(other.line(), "Recvd msg #1: 'meanwhile'");
    assert!(t.elapsed() < Duration::from_millis(500), "{:?}", t.elapsed());
    let ((status, why, retry, _), took) = hang.join().unwrap();
    assert_eq!((status, retry.as_deref()), (503, Some("1")), "{why}");
    assert!(why.contains("no answer within 700 ms"), "{why}");
    assert!(took < Duration::from_millis(1500), "{took:?}");

    for (id, expect) in [
        ("error-1", "answered 500"),
        ("garbage-1", "error"),
        ("huge-1", "over 65536 bytes"),
        ("redirect-1", "302"),
    ] {
        let (status, why, retry, _) = refused_at(srv.addr, &format!("/test/{id}"), &[]);
        assert_eq!((status, retry.as_deref()), (503, Some("1")), "{id}: {why}");
        assert!(
            why.contains("hooks.subscribe_url") && why.contains(expect),
            "{id}: {why}"
        );
        // The endpoint (which may carry a password or a key) is not told.
        assert!(!why.contains(&app.addr.to_string()), "{id}: {why}");
    }
    assert_eq!(app.asked("/hook-followed"), 0, "a redirect was followed");
    let st = srv.stats();
    assert_eq!(st["hooks"]["failures"], 5, "{st}");
    assert_eq!(st["hooks"]["failures_admitted"], 0, "{st}");
    let metrics = srv.admin_get("/metrics").text();
    assert!(metrics.contains("switchboard_hook_failures_total 5"), "{metrics}");
    assert!(metrics.contains("switchboard_hook_seconds_count 6"), "{metrics}");
}

/// `hooks.on_failure = "admit"`: a hook that fails lets the stream in,
/// counted; `hooks.max_in_flight`: calls past it are refused 503 at once.
#[test]
fn a_failing_hook_can_admit_and_calls_in_flight_are_bounded() {
    let app = Backend::start("hook-admit");
    let srv = hooked(&app, |s| {
        s.hooks.timeout_ms = 500;
        s.hooks.on_failure = switchboard::config::OnHookFailure::Admit;
        s.hooks.max_in_flight = 2;
    });
    let mut a = srv.open("error-2");
    assert_eq!(a.status, 200);
    assert_eq!(a.line(), "Switchboard welcomes you! Your Id: error-2");
    // Two hang; the third is refused at once.
    let hanging: Vec<_> = (0..2)
        .map(|i| {
            let addr = srv.addr;
            std::thread::spawn(move || StreamClient::open(addr, &format!("hang-{i}")).status)
        })
        .collect();
    srv.wait_stats(Duration::from_secs(5), |s| s["hooks"]["calls"] == 3);
    let t = Instant::now();
    let (status, why, retry, _) = refused_at(srv.addr, "/test/allow-3", &[]);
    assert_eq!((status, retry.as_deref()), (503, Some("1")), "{why}");
    assert!(why.contains("hooks.max_in_flight = 2"), "{why}");
    assert!(t.elapsed() < Duration::from_millis(300), "{:?}", t.elapsed());
    for h in hanging {
        assert_eq!(h.join().unwrap(), 200, "admitted when the hook timed out");
    }
    // Their places are given back.
    assert_eq!(srv.open("allow-4").status, 200);
    let st = srv.stats();
    assert_eq!(st["hooks"]["failures_admitted"], 3, "{st}");
    assert_eq!(st["hooks"]["busy"], 1, "{st}");
}

/// `hooks.cache_ms`: a yes is remembered per (id, credentials), a no never.
#[test]
fn a_hooks_yes_is_remembered_per_id_and_credentials() {
    let app = Backend::start("hook-cache");
    let srv = hooked(&app, |s| s.hooks.cache_ms = 60_000);
    let open = |id: &str, cookie: &str| {
        StreamClient::open_raw(
            srv.addr,
            &format!("GET /test/{id} HTTP/1.1\r\nhost: t\r\nCookie: {cookie}\r\n\r\n"),
        )
        .status
    };
    assert_eq!(open("allow-c", "u=1"), 200);
    assert_eq!(open("allow-c", "u=1"), 200);
    assert_eq!(hook_log(&app).len(), 1, "remembered");
    assert_eq!(open("allow-c", "u=2"), 200);
    assert_eq!(open("allow-d", "u=1"), 200);
    assert_eq!(hook_log(&app).len(), 3, "other credentials, another id: asked");
    assert_eq!(open("deny-c", "u=1"), 403);
    assert_eq!(open("deny-c", "u=1"), 403);
    assert_eq!(hook_log(&app).len(), 5, "a no is not remembered");
    // Another transport is another request as the application sees it.
    let sse = StreamClient::open_raw(
        srv.addr,
        "GET /test/allow-c HTTP/1.1\r\nhost: t\r\nCookie: u=1\r\nAccept: text/event-stream\r\n\r\n",
    );
    assert_eq!(sse.status, 200);
    assert_eq!(hook_log(&app).len(), 6, "asked again for SSE");
    assert_eq!(srv.stats()["hooks"]["remembered"], 1);
}

/// Shutting down while a stream request waits for the application: it is
/// answered 503 at once, not left to the socket's close.
#[test]
fn a_request_waiting_for_the_hook_is_answered_at_shutdown() {
    let app = Backend::start("hook-stop");
    let mut srv = hooked(&app, |s| s.hooks.timeout_ms = 20_000);
    let addr = srv.addr;
    let waiting = std::thread::spawn(move || {
        let t = Instant::now();
        (refused_at(addr, "/test/hang-stop", &[]), t.elapsed())
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while hook_log(&app).is_empty() {
        assert!(Instant::now() < deadline, "the hook was not asked");
        std::thread::sleep(Duration::from_millis(20));
    }
    srv.shutdown();
    let ((status, why, _, _), took) = waiting.join().unwrap();
    assert_eq!(status, 503, "{why}");
    assert!(why.contains("shutting down"), "{why}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}

/// With no subscriber key, nobody checks a token: the hook is given no
/// claims for one (a forged `alg: none` token names anyone).
#[test]
fn the_hook_is_never_given_claims_nobody_checked() {
    use base64::Engine as _;
    let app = Backend::start("hook-claims");
    let srv = hooked(&app, |_| {});
    let b64 = |v: serde_json::Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    let forged = format!(
        "{}.{}.",
        b64(serde_json::json!({ "alg": "none" })),
        b64(serde_json::json!({ "sub": "victim", "exp": 9_999_999_999u64 }))
    );
    let s = StreamClient::open_raw(
        srv.addr,
        &format!("GET /test/allow-f?token={forged} HTTP/1.1\r\nhost: t\r\n\r\n"),
    );
    assert_eq!(s.status, 200);
    let asked = hook_log(&app).pop().unwrap();
    assert_eq!(asked["claims"], serde_json::Value::Null, "{asked}");
}

// --- Namespaces ---

/// `[namespaces.<name>]`: a namespace whose ids need no token and whose
/// streams the hook is not asked about, beside one that keeps the server's
/// rules (token and hook), on every transport, lean and fallback, and over
/// TLS; ids outside every namespace keep the server's rules too.
#[test]
fn namespaces_set_the_token_and_hook_rules_on_every_transport() {
    use switchboard::config::NamespaceSettings;
    let app = Backend::start("ns");
    let secret = "n".repeat(32);
    let dir = std::env::temp_dir().join(format!("switchboard-ns-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let certs = common::make_certificates(&dir, "ns");
    let mut s = common::settings();
    s.auth.subscribe_secret = secret.clone();
    s.hooks.subscribe_url = app.url("/hook");
    s.namespaces.insert(
        "public".into(),
        NamespaceSettings {
            token_required: Some(false),
            subscribe_hook: Some(false),
            ..NamespaceSettings::default()
        },
    );
    s.namespaces.insert("chat".into(), NamespaceSettings::default());
    s.namespaces.insert(
        "room".into(),
        NamespaceSettings {
            token_required: Some(false),
            subscribe_hook: Some(false),
            presence_events: Some(true),
            max_streams_per_id: Some(2),
            ..NamespaceSettings::default()
        },
    );
    let srv = common::TestServer::start_tls(s, &certs);
    let ws = "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";

    // public: no token, no hook, on each transport.
    for (extra, status) in [("", 200), ("Accept: text/event-stream\r\n", 200), (ws, 101)] {
        let s = StreamClient::open_raw(
            srv.addr,
            &format!("GET /test/public:news HTTP/1.1\r\nhost: t\r\n{extra}\r\n"),
        );
        assert_eq!(s.status, status, "{extra}");
    }
    let via_route = |path: &str| common::read_head(&mut fallback(srv.addr, path)).unwrap().0;
    assert_eq!(via_route("/test/public:news"), 200);
    let tls = srv.addrs[1];
    let curl = |args: &[&str]| curl_tls(&certs.ca, args);
    let held = curl(&[
        "-N",
        "--max-time",
        "2",
        &format!("https://127.0.0.1:{}/test/public:news", tls.port()),
    ]);
    assert!(
        held.starts_with("Switchboard welcomes you! Your Id: public:news"),
        "{held}"
    );
    assert!(hook_log(&app).is_empty(), "the hook was asked about public:");
    // A token given in an open namespace is still checked.
    let (status, why, _, _) = refused_at(srv.addr, "/test/public:news?token=nope", &[]);
    assert_eq!(status, 401, "{why}");

    // Outside every namespace, and in chat: a token, and the hook.
    for path in ["/test/allow-1", "/test/chat:allow-1"] {
        let (status, why, _, _) = refused_at(srv.addr, path, &[]);
        assert_eq!(status, 401, "{path}: {why}");
        assert_eq!(via_route(path), 401, "{path}");
        let denied = curl(&[
            "-w",
            " %{http_code}",
            &format!("https://127.0.0.1:{}{path}", tls.port()),
        ]);
        assert!(denied.ends_with(" 401"), "{path}: {denied}");
    }
    let token = hs256(&secret, "chat:allow-1");
    let mut chat = StreamClient::open_raw(
        srv.addr,
        &format!("GET /test/chat:allow-1?token={token} HTTP/1.1\r\nhost: t\r\n\r\n"),
    );
    assert_eq!(chat.status, 200);
    assert_eq!(chat.line(), "Switchboard welcomes you! Your Id: chat:allow-1");
    assert_eq!(hook_log(&app).pop().unwrap()["id"], "chat:allow-1");
    let r = srv.post("/send/chat:allow-1", "in chat");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(chat.line(), "Recvd msg #1: 'in chat'");

    // room: over TLS, a stream hears another join, and a third is one
    // too many (429), over TLS too.
    let room = format!("https://127.0.0.1:{}/test/room:tls", tls.port());
    let listener = {
        let (ca, room) = (certs.ca.clone(), room.clone());
        std::thread::spawn(move || curl_tls(&ca, &["-N", "--max-time", "3", &room]))
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while srv.get("/presence/room:tls").json()["streams"] != 1 {
        assert!(Instant::now() < deadline, "the TLS stream of room:tls not open");
        std::thread::sleep(Duration::from_millis(20));
    }
    let _joining = StreamClient::open_raw(srv.addr, "GET /test/room:tls HTTP/1.1\r\nhost: t\r\n\r\n");
    let full = curl(&["-w", " %{http_code}", &room]);
    assert!(full.ends_with(" 429"), "{full}");
    let heard = listener.join().unwrap();
    assert!(heard.contains("\nJoin: {\"node\":"), "{heard}");
    drop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A key a namespace does not have, or a rule it cannot keep, stops the
/// start with the key named.
#[test]
fn a_namespace_key_that_does_not_exist_stops_the_start() {
    for (var, value, expect) in [
        (
            "SWITCHBOARD__NAMESPACES__CHAT__HISTORY_SIZES",
            "5",
            "history_sizes",
        ),
        (
            "SWITCHBOARD__NAMESPACES__CHAT__TOKEN_REQUIRED",
            "true",
            "namespaces.*.token_required",
        ),
        (
            "SWITCHBOARD__NAMESPACES__CHAT__SUBSCRIBE_HOOK",
            "true",
            "hooks.subscribe_url",
        ),
        (
            "SWITCHBOARD__NAMESPACES__CHAT__HISTORY_SIZE",
            "1000001",
            "at most 100000",
        ),
    ] {
        let out = Command::new(BIN)
            .env("SWITCHBOARD__SERVER__PORT", "0")
            .env(var, value)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{var} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expect), "{var}: {err}");
    }
}
