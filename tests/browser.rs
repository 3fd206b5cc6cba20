//! A real browser: headless Chromium loads `tests/browser/resume.html` from
//! a page server on another origin, opens an `EventSource` and a
//! `WebSocket` to switchboard, has the server cut both connections, and
//! posts its DOM back when done. The test reads from that DOM that each
//! transport got every message once, in order, across the reconnect.
//!
//! Needs Debian's `chromium` (`apt-get install -y chromium`; `.ci/run`
//! installs it). Without it the test fails and says so: it never skips.

mod common;
// Only the browser tests: the other test crates (tools' too) share
// `common` but not Chromium's dependencies.
#[path = "common/chromium.rs"]
mod chromium;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::process::Command;
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use chromium::Browser;
use common::process::Proc;
use common::{RedisServer, TestServer, settings};

/// What the page server does for `POST /cut/<id>`.
type Cut = Box<dyn Fn(&str) + Send>;

/// Serves the page at `/` and takes the DOM the page posts to `/result`;
/// `POST /cut/<id>` runs `cut` (when given) before it answers.
fn page_server(page: Arc<Mutex<String>>, cut: Option<Cut>) -> (SocketAddr, mpsc::Receiver<String>) {
    page_server_on(page, cut, None)
}

/// [`page_server`], over https with `tls` when given. It keeps the
/// listener it bound (port 0) and answers its address.
fn page_server_on(
    page: Arc<Mutex<String>>,
    cut: Option<Cut>,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> (SocketAddr, mpsc::Receiver<String>) {
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
            match &tls {
                None => serve_page(conn, &page, &tx, &cut),
                Some(config) => {
                    let Ok(session) = rustls::ServerConnection::new(Arc::clone(config)) else {
                        continue;
                    };
                    serve_page(rustls::StreamOwned::new(session, conn), &page, &tx, &cut);
                }
            }
        }
    });
    (addr, rx)
}

/// One request of the page server.
fn serve_page<S: Read + Write>(conn: S, page: &Mutex<String>, tx: &mpsc::Sender<String>, cut: &Option<Cut>) {
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let mut len = 0;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            len = v.trim().parse().unwrap_or(0);
        }
    }
    let (status, body) = if line.starts_with("GET / ") {
        ("200 OK", page.lock().unwrap().clone())
    } else if line.starts_with("POST /result ") {
        let mut body = vec![0u8; len];
        let _ = reader.read_exact(&mut body);
        let _ = tx.send(String::from_utf8_lossy(&body).into_owned());
        ("200 OK", String::new())
    } else if let (Some(id), Some(cut)) = (
        line.strip_prefix("POST /cut/").and_then(|r| r.split(' ').next()),
        cut,
    ) {
        // A cut that fails answers why, and the page reports it.
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cut(id))) {
            Ok(()) => ("200 OK", "{}".to_owned()),
            Err(e) => {
                let why = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                ("500 Internal Server Error", why)
            }
        }
    } else {
        ("404 Not Found", String::new())
    };
    let conn = reader.get_mut();
    let _ = write!(
        conn,
        "HTTP/1.1 {status}\r\ncontent-type: text/html; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = conn.flush();
}

/// Opens the page server's page in headless Chromium and waits for the
/// DOM the page posts back when it is done.
fn run_page(page: SocketAddr, results: &mpsc::Receiver<String>) -> String {
    run_page_at(&format!("http://{page}/"), &[], results)
}

/// [`run_page`] for the page at `url`, Chromium started with `args`.
fn run_page_at(url: &str, args: &[String], results: &mpsc::Receiver<String>) -> String {
    let browser = Browser::open_with(url, args);
    let dom = results
        .recv_timeout(Duration::from_secs(60))
        .expect("the page posted no result within 60 s");
    drop(browser);
    println!("{dom}");
    dom
}

/// The text of the element with this `id`, up to its first child tag.
fn text_of<'a>(dom: &'a str, id: &str) -> Option<&'a str> {
    dom.split(&format!("id=\"{id}\">"))
        .nth(1)
        .and_then(|s| s.split('<').next())
}

/// The text of each `<li>` in the list with this `id`.
fn items(dom: &str, id: &str) -> Vec<String> {
    let start = dom
        .find(&format!("id=\"{id}\">"))
        .unwrap_or_else(|| panic!("no #{id} in {dom}"));
    let list = &dom[start..];
    let end = list.find("</ol>").or_else(|| list.find("</ul>")).unwrap();
    list[..end]
        .split("<li>")
        .skip(1)
        .map(|li| {
            li.split("</li>")
                .next()
                .unwrap()
                .replace("&#39;", "'")
                .replace("&amp;", "&")
        })
        .collect()
}

#[test]
fn chromium_resumes_eventsource_and_websocket_after_the_server_cuts_them() {
    // The page names the server, and the server allows the page's origin:
    // the page server starts first and gets its page once the server runs.
    let page = Arc::new(Mutex::new(String::new()));
    let (page_addr, results) = page_server(Arc::clone(&page), None);
    let mut s = settings();
    s.debug.fault_injection = true;
    s.stream.sse_retry_ms = 300;
    s.http.cors_origins = format!("http://{page_addr}");
    let srv = TestServer::start(s);
    *page.lock().unwrap() = resume_page(&format!("http://{}", srv.addr), srv.admin, None);

    let dom = run_page(page_addr, &results);
    every_message_once_in_order(&dom);
    let st = srv.stats();
    // m3 and m4 were sent while each client was away: from history.
    assert!(st["history"]["replayed"].as_u64().unwrap() >= 2, "{st}");
    assert_eq!(st["transports"]["sse_opened"], 2, "{st}");
    assert_eq!(st["transports"]["ws_opened"], 2, "{st}");
}

/// `tests/browser/resume.html` for the server at `server`; `cut`: where
/// the page asks for its stream to be cut (`None`: `/admin/cut` on the
/// server's internal listener `admin`, both transports at once).
fn resume_page(server: &str, admin: std::net::SocketAddr, cut: Option<&str>) -> String {
    include_str!("browser/resume.html")
        .replace("{{SERVER}}", server)
        .replace("{{CUT}}", cut.unwrap_or(&format!("http://{admin}/admin/cut/")))
        .replace("{{ONE_AT_A_TIME}}", if cut.is_some() { "true" } else { "false" })
}

/// The page is done, and each transport got m1..m5 once, in order, with
/// increasing event ids, across one reconnect, without a gap.
fn every_message_once_in_order(dom: &str) {
    assert_eq!(text_of(dom, "status"), Some("done"), "{dom}");
    for transport in ["sse", "ws"] {
        let got = items(dom, transport);
        let texts: Vec<&str> = got.iter().map(|l| l.split_once(' ').unwrap().1).collect();
        let expected: Vec<String> = (1..=5).map(|n| format!("Recvd msg #{n}: 'm{n}'")).collect();
        // Every message once, in order: the two the cut stream missed came
        // from history on the new connection (so its count starts again).
        let bodies: Vec<&str> = texts.iter().map(|t| t.rsplit(": ").next().unwrap()).collect();
        assert_eq!(
            bodies,
            ["'m1'", "'m2'", "'m3'", "'m4'", "'m5'"],
            "{transport}: {got:?}"
        );
        assert_eq!(texts[..2], expected[..2], "{transport}: {got:?}");
        let ids: Vec<u64> = got
            .iter()
            .map(|l| l.split(' ').next().unwrap().parse().unwrap())
            .collect();
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "{transport}: event ids increase: {ids:?}"
        );
        let notes = items(dom, &format!("{transport}-notes"));
        assert!(
            notes.contains(&"connected #2".to_owned()),
            "{transport} reconnected: {notes:?}"
        );
        assert!(
            !notes.iter().any(|n| n.starts_with("Gap")),
            "{transport}: no gap: {notes:?}"
        );
    }
}

/// The same page served over https, against switchboard's TLS port:
/// Chromium's EventSource and WebSocket (`wss://`) get every message once
/// across the cut, and its `fetch` publishes over TLS. The test authority
/// is trusted on Chromium's command line (the page's and the server's
/// certificate share it).
#[test]
fn chromium_on_an_https_page_streams_eventsource_and_wss_over_tls() {
    let dir = std::env::temp_dir().join(format!("switchboard-browser-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let certs = common::make_certificates(&dir, "browser");
    let page_tls = {
        use rustls::pki_types::pem::PemObject as _;
        let chain = rustls::pki_types::CertificateDer::pem_file_iter(&certs.cert)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&certs.key).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap()
    };
    let page = Arc::new(Mutex::new(String::new()));
    let (page_addr, results) = page_server_on(Arc::clone(&page), None, Some(Arc::new(page_tls)));
    let mut s = settings();
    s.debug.fault_injection = true;
    s.stream.sse_retry_ms = 300;
    s.http.cors_origins = format!("https://{page_addr}");
    let srv = TestServer::start_tls(s, &certs);
    *page.lock().unwrap() = resume_page(&format!("https://{}", srv.addrs[1]), srv.admin, None);

    let trust = format!(
        "--ignore-certificate-errors-spki-list={}",
        common::spki_hash(&certs.cert)
    );
    let dom = run_page_at(&format!("https://{page_addr}/"), &[trust], &results);
    every_message_once_in_order(&dom);
    let st = srv.stats();
    assert_eq!(st["transports"]["sse_opened"], 2, "{st}");
    assert_eq!(st["transports"]["ws_opened"], 2, "{st}");
    // Both transports' streams and the page's publishes came over TLS.
    assert!(st["tls"]["handshakes"].as_u64().unwrap() >= 5, "{st}");
    assert_eq!(st["tls"]["handshake_failures"], 0, "{st}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 23: the same page against a `--processes 4` fleet on one port:
/// its cut kills the process that holds the stream (found with
/// `/presence` and `/cluster`), and the browser reconnects to whichever
/// process the kernel gives it, which resumes from the fleet's history.
#[test]
fn chromium_resumes_on_another_process_of_a_fleet() {
    let redis = RedisServer::start();
    // The fleet shares its main port and its internal listener
    // (SO_REUSEPORT), so both are named before it starts: `/cluster` is
    // read on the internal one. Picked again if taken meanwhile.
    let chosen: Arc<std::sync::OnceLock<(u16, u16)>> = Arc::default();
    let cut: Cut = {
        let chosen = Arc::clone(&chosen);
        Box::new(move |id| {
            let (port, admin_port) = *chosen.get().expect("the fleet is up before the page runs");
            kill_holder(&format!("http://127.0.0.1:{port}"), port, admin_port, id)
        })
    };
    let page = Arc::new(Mutex::new(String::new()));
    let (page_addr, results) = page_server(Arc::clone(&page), Some(cut));
    let fleet_on = |ports: &[u16]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_switchboard"));
        cmd.args(["--processes", "4"])
            .env("SWITCHBOARD__SERVER__PORT", ports[0].to_string())
            .env("SWITCHBOARD__SERVER__ADMIN_PORT", ports[1].to_string())
            .env("SWITCHBOARD__SERVER__WORKERS", "1")
            .env("SWITCHBOARD__STREAM__SSE_RETRY_MS", "300")
            .env("SWITCHBOARD__HTTP__CORS_ORIGINS", format!("http://{page_addr}"))
            .env("SWITCHBOARD__CLUSTER__REDIS_URL", redis.url())
            .env(
                "SWITCHBOARD__CLUSTER__PREFIX",
                format!("browser-{}", std::process::id()),
            )
            .env("SWITCHBOARD__CLUSTER__HEARTBEAT_INTERVAL_MS", "200")
            .env("SWITCHBOARD__CLUSTER__HEARTBEAT_TTL_MS", "1500");
        cmd
    };
    // Ready: 4 processes in /cluster.
    let (_parent, ports) = Proc::start_on_free_ports(2, fleet_on, |_, ports| {
        get_json(ports[1], "/cluster").is_some_and(|c| c["totals"]["nodes"] == 4)
    });
    let (port, admin_port) = (ports[0], ports[1]);
    chosen.set((port, admin_port)).expect("set once");
    let fleet = format!("http://127.0.0.1:{port}");
    let admin = ([127, 0, 0, 1], admin_port).into();
    *page.lock().unwrap() = resume_page(&fleet, admin, Some(&format!("http://{page_addr}/cut/")));

    let dom = run_page(page_addr, &results);
    every_message_once_in_order(&dom);
}

/// `GET path` on `port` of 127.0.0.1, as JSON (`None` if it failed).
fn get_json(port: u16, path: &str) -> Option<serde_json::Value> {
    let r = common::request(([127, 0, 0, 1], port).into(), "GET", path, &[], b"").ok()?;
    (r.status == 200).then(|| r.json())
}

fn wait_for(within: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGKILLs the fleet process that holds `id`'s stream (its parent starts
/// another), so the browser's connection drops as it would in a crash.
fn kill_holder(fleet: &str, port: u16, admin_port: u16, id: &str) {
    let mut holder = None;
    wait_for(Duration::from_secs(5), &format!("{id} held on {fleet}"), || {
        holder = get_json(port, &format!("/presence/{id}"))
            .and_then(|p| p["nodes"][0]["node"].as_str().map(str::to_owned));
        holder.is_some()
    });
    let name = holder.unwrap();
    let cluster = get_json(admin_port, "/cluster").expect("/cluster");
    let pid = cluster["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == name.as_str())
        .and_then(|n| n["pid"].as_u64())
        .unwrap_or_else(|| panic!("{name} not in {cluster}"));
    common::process::send_signal(pid as u32, "KILL");
}

/// A page on another origin opens a stream with `fetch` and
/// `Authorization: Bearer`: Chromium preflights it (`OPTIONS /test/{id}`),
/// then reads the stream and a message; and it can read the reason of a
/// 401, which only a refusal with the CORS header lets it see.
#[test]
fn chromium_opens_a_stream_with_a_bearer_token_through_the_preflight() {
    let page = Arc::new(Mutex::new(String::new()));
    let (page_addr, results) = page_server(Arc::clone(&page), None);
    let mut s = settings();
    s.auth.subscribe_secret = "browser-secret".into();
    s.http.cors_origins = format!("http://{page_addr}");
    let srv = TestServer::start(s);
    let token = switchboard::token::mint(
        "browser-secret",
        &["cors-fetch".to_owned()],
        Duration::from_secs(600),
    )
    .unwrap();
    *page.lock().unwrap() = include_str!("browser/preflight.html")
        .replace("{{SERVER}}", &format!("http://{}", srv.addr))
        .replace("{{TOKEN}}", &token);

    let dom = run_page(page_addr, &results);
    assert_eq!(text_of(&dom, "status"), Some("done"), "{dom}");
    let lines = items(&dom, "lines");
    assert_eq!(
        lines[0], "Switchboard welcomes you! Your Id: cors-fetch",
        "{lines:?}"
    );
    assert!(
        lines.iter().any(|l| l.ends_with("'through the preflight'")),
        "{lines:?}"
    );
    let refused = text_of(&dom, "refused").unwrap();
    assert!(
        refused.starts_with("401 subscriber token refused: token is not a valid JWT"),
        "{refused}"
    );
    assert_eq!(srv.stats()["auth"]["tokens_refused"], 1);
}
