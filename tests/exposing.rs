//! Issue 41: safe by default when exposed (docs/exposing.md).
//!
//! - Protected mode: bound beyond loopback with no `auth.publish_token`,
//!   `/send`, `/broadcast` and `/presence` refuse clients that are not
//!   loopback (403, naming both ways out), unless `auth.publish_open`.
//! - The operator pages (`/metrics`, `/stats`, `/cluster`, the dashboard,
//!   `/admin/*`) are served on the internal listener, and on a public one
//!   only with `server.admin_public` or the `auth.admin_token` bearer.
//!
//! A client that is not loopback needs a second host: connecting from
//! 127.0.0.2 to a server on 0.0.0.0 is still loopback. So the client runs
//! in a network namespace of the test's own (`common::netns`: a veth
//! pair on 10.251.X.0/30, made and removed by the test) and talks to the
//! server, bound to 0.0.0.0, at this side's veth address; the server
//! sees the namespace's address as the peer. curl, run inside the
//! namespace with `ip netns exec`, is that client. Where no namespace can
//! be made (no CAP_NET_ADMIN), the client is curl on this machine bound to
//! its own non-loopback interface address, if it has one; else the test
//! says so and stops.

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use common::netns::{Netns, can_make_namespaces};
use common::process::Proc;
use common::{TestServer, request, settings};

/// Where the client from elsewhere runs.
enum Elsewhere {
    /// In a network namespace: it reaches this host at `ns.outside`.
    Namespace(Netns),
    /// On this machine, from (and to) its own address `ip`, not loopback.
    OwnAddress(String),
}

impl Elsewhere {
    /// A namespace, else this machine's own non-loopback address; `None`
    /// (with the reason printed) when neither can be had.
    fn find(tag: &str) -> Option<Elsewhere> {
        match Netns::create(tag) {
            Ok(ns) => return Some(Elsewhere::Namespace(ns)),
            Err(e) if can_make_namespaces() => panic!("a network namespace: {e}"),
            Err(e) => println!("no network namespace here ({e}); trying an own address"),
        }
        let out = Command::new("ip")
            .args(["-o", "-4", "addr", "show", "scope", "global"])
            .output()
            .ok()?;
        let own = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .skip_while(|w| *w != "inet")
            .nth(1)
            .and_then(|a| a.split('/').next().map(str::to_owned));
        if own.is_none() {
            println!("SKIPPED: no network namespace and no non-loopback address here");
        }
        own.map(Elsewhere::OwnAddress)
    }

    /// The address the client connects to for a server on 0.0.0.0:`port`.
    fn target(&self, port: u16) -> String {
        match self {
            Elsewhere::Namespace(ns) => format!("{}:{port}", ns.outside),
            Elsewhere::OwnAddress(ip) => format!("{ip}:{port}"),
        }
    }

    /// curl from elsewhere: `method` `path` on 0.0.0.0:`port` with
    /// `headers`, and `body` when given; answers (status, body).
    fn curl(
        &self,
        method: &str,
        port: u16,
        path: &str,
        headers: &[&str],
        body: Option<&str>,
    ) -> (u16, String) {
        let mut cmd = match self {
            Elsewhere::Namespace(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &ns.name, "curl"]);
                c
            }
            Elsewhere::OwnAddress(ip) => {
                let mut c = Command::new("curl");
                c.args(["--interface", ip]);
                c
            }
        };
        cmd.args(["-s", "-m", "5", "-X", method, "-w", "\n%{http_code}"]);
        for h in headers {
            cmd.args(["-H", h]);
        }
        if let Some(body) = body {
            cmd.args(["--data-binary", body]);
        }
        cmd.arg(format!("http://{}{path}", self.target(port)));
        let out = cmd.output().expect("curl (apt-get install -y curl)");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        let code = code.trim().parse().unwrap_or_else(|_| {
            panic!(
                "curl {method} {path}: no status ({})",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (code, body.to_owned())
    }
}

/// The operator pages, each a GET.
const OPERATOR_PAGES: [&str; 5] = ["/metrics", "/stats", "/cluster", "/", "/dashboard/events"];

/// An in-process server on 0.0.0.0 (a free port) with `settings`.
fn on_every_address(s: switchboard::Settings) -> TestServer {
    let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    TestServer::start_on_listeners(s, vec![listener])
}

/// The binary on 0.0.0.0 with no publish token: it says so in one WARN
/// line (`protected_mode`), and from another host `/send`, `/broadcast`
/// and `/presence` answer 403 naming `auth.publish_token` and
/// `auth.publish_open`; from loopback they work as ever. With the token,
/// the other host publishes (200) and without it gets 401; with
/// `auth.publish_open` it publishes without one (and the WARN line says
/// that instead).
#[test]
fn from_another_host_publishing_needs_the_token_or_publish_open() {
    let Some(elsewhere) = Elsewhere::find("x") else {
        return;
    };
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_switchboard"));
    cmd.env("SWITCHBOARD__SERVER__HOST", "0.0.0.0")
        .env("SWITCHBOARD__SERVER__PORT", "0");
    let (p, addrs) = Proc::start(cmd);
    let port = addrs[0].port();
    p.wait_event("protected_mode", Duration::from_secs(5), |_| true);
    let log = p.log_text();
    let line = log.lines().find(|l| l.contains("protected_mode")).unwrap();
    assert!(line.contains("\"level\":\"WARN\""), "{line}");
    assert_eq!(log.matches("protected mode").count(), 1, "one line: {log}");
    assert!(p.events("publish_open").is_empty());
    let mut stream = common::StreamClient::open(([127, 0, 0, 1], port).into(), "guarded");
    assert_eq!(stream.status, 200);
    stream.line();

    for (method, path) in [
        ("POST", "/send/guarded"),
        ("POST", "/broadcast"),
        ("GET", "/presence/guarded"),
    ] {
        let body = (method == "POST").then_some("from afar");
        let (code, text) = elsewhere.curl(method, port, path, &[], body);
        assert_eq!(code, 403, "{method} {path}: {text}");
        let error: serde_json::Value = serde_json::from_str(&text).unwrap();
        let why = error["error"].as_str().unwrap();
        assert!(
            why.contains("auth.publish_token") && why.contains("auth.publish_open = true"),
            "{why}"
        );
    }
    // Reading is not publishing: a stream and /dispatcher from afar work.
    assert_eq!(elsewhere.curl("GET", port, "/dispatcher", &[], None).0, 200);
    assert_eq!(elsewhere.curl("GET", port, "/healthz", &[], None).0, 200);
    // Loopback clients keep publishing (the README's quick start).
    let here: SocketAddr = ([127, 0, 0, 1], port).into();
    let r = request(here, "POST", "/send/guarded", &[], b"from here").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(stream.line(), "Recvd msg #1: 'from here'");
    drop(p);

    // With a token: the other host publishes with it, not without.
    let mut s = settings();
    s.auth.publish_token = "t0ken".into();
    let srv = on_every_address(s);
    let port = srv.addr.port();
    let (code, text) = elsewhere.curl("POST", port, "/send/x", &[], Some("m"));
    assert_eq!(code, 401, "{text}");
    let bearer = ["Authorization: Bearer t0ken"];
    let (code, text) = elsewhere.curl("POST", port, "/send/x", &bearer, Some("m"));
    assert_eq!(code, 200, "{text}");
    assert_eq!(
        elsewhere.curl("POST", port, "/broadcast", &bearer, Some("m")).0,
        200
    );
    drop(srv);

    // publish_open: the operator accepts the risk.
    let mut s = settings();
    s.auth.publish_open = true;
    let srv = on_every_address(s);
    let (code, text) = elsewhere.curl("POST", srv.addr.port(), "/send/x", &[], Some("m"));
    assert_eq!(code, 200, "{text}");
    drop(srv);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_switchboard"));
    cmd.env("SWITCHBOARD__SERVER__HOST", "0.0.0.0")
        .env("SWITCHBOARD__SERVER__PORT", "0")
        .env("SWITCHBOARD__AUTH__PUBLISH_OPEN", "true");
    let (p, _) = Proc::start(cmd);
    p.wait_event("publish_open", Duration::from_secs(5), |_| true);
    assert!(p.events("protected_mode").is_empty());
}

/// A proxy in front does not make every client loopback: with
/// `http.trusted_proxies` the client is who `X-Forwarded-For` names, and
/// an address a proxy claims never counts as loopback.
#[test]
fn behind_a_trusted_proxy_the_forwarded_client_decides() {
    let mut s = settings();
    s.http.trusted_proxies = "127.0.0.1".into();
    let srv = on_every_address(s);
    let here: SocketAddr = ([127, 0, 0, 1], srv.addr.port()).into();
    let publish = |forwarded: &str| {
        request(here, "POST", "/send/x", &[("x-forwarded-for", forwarded)], b"m")
            .unwrap()
            .status
    };
    assert_eq!(publish("203.0.113.7"), 403, "the proxy's client is not loopback");
    assert_eq!(publish("127.0.0.5"), 403, "a claimed loopback address is a claim");
    assert_eq!(
        request(here, "POST", "/send/x", &[], b"m").unwrap().status,
        200,
        "the proxy's own requests come from loopback"
    );
}

/// The operator pages are on the internal listener: there 200, on the
/// public port 403 with where to find them (a loopback server too: the
/// rule is the listener's, not the client's); `/healthz` and `/readyz` on
/// both. `server.admin_public` serves them on the public port too, and so
/// does the `auth.admin_token` bearer (a wrong one is 403).
#[test]
fn operator_pages_answer_on_the_internal_listener_only_unless_configured() {
    let mut s = settings();
    s.debug.fault_injection = true;
    let srv = TestServer::start(s);
    assert_ne!(srv.admin.port(), srv.addr.port());
    assert!(srv.admin.ip().is_loopback(), "loopback by default");
    let get = |addr: SocketAddr, path: &str, headers: &[(&str, &str)]| {
        if path == "/dashboard/events" {
            // A feed that goes on: its head is enough.
            use std::io::Write;
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            c.set_read_timeout(Some(common::READ_TIMEOUT)).unwrap();
            let mut head = format!("GET {path} HTTP/1.1\r\nhost: t\r\n");
            for (k, v) in headers {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            c.write_all(format!("{head}\r\n").as_bytes()).unwrap();
            return common::read_head(&mut std::io::BufReader::new(c)).unwrap().0;
        }
        request(addr, "GET", path, headers, b"").unwrap().status
    };
    for path in OPERATOR_PAGES {
        assert_eq!(get(srv.admin, path, &[]), 200, "{path} on the internal listener");
        assert_eq!(get(srv.addr, path, &[]), 403, "{path} on the public port");
    }
    let r = srv.get("/metrics");
    assert!(
        r.error().contains("server.admin_port") && r.error().contains("auth.admin_token"),
        "{}",
        r.text()
    );
    let r = srv.post("/admin/cut/x", "");
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(srv.admin_post("/admin/cut/x", "").status, 200);
    for addr in [srv.addr, srv.admin] {
        assert_eq!(get(addr, "/healthz", &[]), 200);
        assert_eq!(get(addr, "/readyz", &[]), 200);
    }
    drop(srv);

    let mut s = settings();
    s.server.admin_public = true;
    let srv = TestServer::start(s);
    for path in OPERATOR_PAGES {
        assert_eq!(get(srv.addr, path, &[]), 200, "{path} with admin_public");
    }
    drop(srv);

    let mut s = settings();
    s.auth.admin_token = "ops".into();
    let srv = TestServer::start(s);
    for path in OPERATOR_PAGES {
        let ok = [("authorization", "Bearer ops")];
        assert_eq!(get(srv.addr, path, &ok), 200, "{path} with the admin token");
        let wrong = [("authorization", "Bearer nope")];
        assert_eq!(get(srv.addr, path, &wrong), 403, "{path} with a wrong token");
        assert_eq!(get(srv.admin, path, &[]), 200, "{path} on the internal listener");
    }
}

/// The binary names its internal listener in the "listening" line; with
/// `server.admin_port` 0 it is a free port, and `/metrics` answers there.
#[test]
fn the_binary_says_where_its_internal_listener_is() {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_switchboard"));
    cmd.env("SWITCHBOARD__SERVER__PORT", "0");
    let (p, addrs) = Proc::start(cmd);
    let admin = p.wait_admin();
    assert!(admin.ip().is_loopback() && admin.port() != 0 && admin.port() != addrs[0].port());
    let r = request(admin, "GET", "/metrics", &[], b"").unwrap();
    assert_eq!(r.status, 200);
    assert!(r.text().contains("switchboard_streams_active"), "{}", r.text());
    assert_eq!(
        request(addrs[0], "GET", "/metrics", &[], b"").unwrap().status,
        403
    );
    assert!(
        p.events("protected_mode").is_empty(),
        "loopback only: nothing to warn of"
    );
}
