//! The dashboard at `GET /`: headless Chromium loads it from a real
//! server, the test drives traffic (streams, messages), and reads from the
//! page's DOM, dumped through the DevTools protocol, that the figures and
//! the chart follow. It keeps a screenshot of the live page as a CI
//! artifact (`target/artifacts/dashboard.png`, or `$SWITCHBOARD_ARTIFACTS`).
//! In cluster mode (a real `redis-server`, two nodes) the page has a row
//! per node with that node's own figures.
//!
//! Needs Debian's `chromium`; without it these fail and say so.

mod common;
// Only the browser tests: the other test crates (tools' too) share
// `common` but not Chromium's dependencies.
#[path = "common/chromium.rs"]
mod chromium;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use chromium::{Browser, Devtools};
use common::{RedisServer, StreamClient, TestServer, request, settings};

/// Where screenshots go.
fn artifacts() -> PathBuf {
    let dir = std::env::var_os("SWITCHBOARD_ARTIFACTS").map_or_else(
        || {
            let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
            tmp.parent().unwrap_or(&tmp).join("artifacts")
        },
        PathBuf::from,
    );
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The value of attribute `attr` in the tag with `id="<id>"`.
fn attr(dom: &str, id: &str, attr: &str) -> String {
    let at = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id} in the DOM"));
    let tag_start = dom[..at].rfind('<').unwrap();
    let tag = &dom[tag_start..tag_start + dom[tag_start..].find('>').unwrap()];
    tag.split(&format!("{attr}=\""))
        .nth(1)
        .and_then(|v| v.split('"').next())
        .unwrap_or_else(|| panic!("#{id} has no {attr}: {tag}"))
        .to_owned()
}

/// The text of the element with `id="<id>"` up to its first child tag.
fn text(dom: &str, id: &str) -> String {
    let at = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id}"));
    let rest = &dom[at..];
    let rest = &rest[rest.find('>').unwrap() + 1..];
    rest[..rest.find('<').unwrap()].to_owned()
}

/// The cells (`<th>` and `<td>` texts) of each row of the table body with
/// `id="<id>"`.
fn rows(dom: &str, id: &str) -> Vec<Vec<String>> {
    let at = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id}"));
    let body = &dom[at..at + dom[at..].find("</tbody>").unwrap()];
    body.split("<tr")
        .skip(1)
        .map(|row| {
            let mut cells = Vec::new();
            let mut rest = row;
            while let Some(i) = rest.find("<t") {
                let after = &rest[i + 2..];
                if after.starts_with('d') || after.starts_with('h') {
                    let t = &after[after.find('>').unwrap() + 1..];
                    let end = t.find('<').unwrap_or(t.len());
                    cells.push(t[..end].to_owned());
                    rest = &t[end..];
                } else {
                    rest = after;
                }
            }
            cells
        })
        .collect()
}

/// Dumps the DOM until `ok` holds of it, for at most `within`.
fn dom_until(dt: &mut Devtools, within: Duration, what: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + within;
    loop {
        let dom = dt.dom();
        if ok(&dom) {
            return dom;
        }
        assert!(Instant::now() < deadline, "not within {within:?}: {what}\n{dom}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn samples(dom: &str) -> usize {
    dom.split("data-samples=\"")
        .nth(1)
        .and_then(|v| v.split('"').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn open(addr: std::net::SocketAddr, id: &str) -> StreamClient {
    let mut c = StreamClient::open(addr, id);
    assert_eq!(c.status, 200);
    assert!(c.line().starts_with("Switchboard welcomes you!"));
    c
}

/// The real binary (so that the page shows its own memory, not a test
/// process's), with JSON logs.
/// The binary on a free port; answers it, its main address and its
/// internal listener (where the dashboard is).
fn binary() -> (common::process::Proc, std::net::SocketAddr, std::net::SocketAddr) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_switchboard"));
    cmd.env("SWITCHBOARD__SERVER__PORT", "0")
        .env("SWITCHBOARD__SERVER__WORKERS", "2")
        .env("SWITCHBOARD__STREAM__TICK_INTERVAL_MS", "60000");
    let (p, addrs) = common::process::Proc::start(cmd);
    let admin = p.wait_admin();
    (p, addrs[0], admin)
}

fn stats(addr: std::net::SocketAddr) -> serde_json::Value {
    request(addr, "GET", "/stats", &[], b"").unwrap().json()
}

#[test]
fn chromium_shows_the_figures_move_as_traffic_comes_and_goes() {
    const STREAMS: usize = 1000;
    let (_server, addr, admin) = binary();
    let browser = Browser::open(&format!("http://{admin}/"));
    let mut dt = browser.devtools();
    let before = dom_until(&mut dt, Duration::from_secs(30), "two samples", |d| {
        samples(d) >= 2
    });
    assert_eq!(
        attr(&before, "status", "data-state"),
        "live",
        "fed by its event stream"
    );
    assert_eq!(attr(&before, "f-streams", "data-value"), "0");
    assert_eq!(text(&before, "f-routed"), "0 routed");

    // Traffic: 1,000 streams, then 60 messages over about 3 s.
    let streams: Vec<StreamClient> = (0..STREAMS).map(|i| open(addr, &format!("dash{i}"))).collect();
    for n in 0..60 {
        let r = request(addr, "POST", &format!("/send/dash{}", n % 25), &[], b"hi").unwrap();
        assert_eq!(r.status, 200);
        std::thread::sleep(Duration::from_millis(50));
    }
    let during = dom_until(
        &mut dt,
        Duration::from_secs(10),
        "1,000 streams and 60 messages",
        |d| {
            attr(d, "f-streams", "data-value") == STREAMS.to_string()
                && text(d, "f-routed") == "60 routed"
                && text(d, "f-delivered-total") == "60 delivered"
        },
    );
    let table = rows(&during, "samples");
    let column = |i: usize| -> Vec<f64> { table.iter().map(|r| r[i].parse().unwrap()).collect() };
    let (live, connects, messages) = (column(1), column(2), column(3));
    assert!(
        live.contains(&0.0) && live.contains(&(STREAMS as f64)),
        "live streams went 0 -> {STREAMS}: {table:?}"
    );
    assert!(connects.iter().any(|&c| c > 0.0), "connects/s moved: {table:?}");
    assert!(messages.iter().any(|&m| m > 0.0), "messages/s moved: {table:?}");
    let points = attr(&during, "line-streams", "points");
    assert_eq!(
        points.split(' ').count(),
        table.len(),
        "one chart point per sample"
    );
    let desc = text(&during, "chart-desc");
    assert!(desc.contains(&format!("live streams 0 to {STREAMS}")), "{desc}");
    // The memory figures are the server's own.
    let now = stats(admin)["memory"]["rss_bytes"].as_u64().unwrap();
    let rss: u64 = attr(&during, "f-rss", "data-value").parse().unwrap();
    assert!(rss > 0 && rss.abs_diff(now) < now / 4, "page {rss}, /stats {now}");
    let per_stream: u64 = attr(&during, "f-per-stream", "data-value").parse().unwrap();
    assert!(
        (100..20_000).contains(&per_stream),
        "{per_stream} bytes per stream"
    );
    assert_eq!(attr(&during, "f-restarts", "data-value"), "0");

    let png = dt.screenshot();
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );
    let shot = artifacts().join("dashboard.png");
    std::fs::write(&shot, &png).unwrap();
    println!("screenshot: {}", shot.display());

    // And back down when the clients go.
    drop(streams);
    let after = dom_until(&mut dt, Duration::from_secs(10), "0 streams again", |d| {
        attr(d, "f-streams", "data-value") == "0"
    });
    assert_eq!(text(&after, "f-opened"), format!("{STREAMS} opened"));
    let st = stats(admin);
    assert!(
        st["connections"]["http_active"].as_u64().unwrap() >= 1,
        "the page's feed is one HTTP connection: {st}"
    );
}

#[test]
fn the_page_reads_without_javascript_and_the_feed_is_sse() {
    let srv = TestServer::start(settings());
    let _streams: Vec<StreamClient> = (0..3).map(|i| open(srv.addr, &format!("nojs{i}"))).collect();
    assert_eq!(srv.get("/").status, 403, "not on the public port");
    let page = srv.admin_get("/");
    assert_eq!(page.status, 200);
    assert_eq!(page.header("content-type"), Some("text/html; charset=utf-8"));
    let html = page.text();
    assert!(!html.contains("{{"), "every placeholder filled");
    assert_eq!(attr(&html, "f-streams", "data-value"), "3");
    assert!(html.contains("<noscript><meta http-equiv=\"refresh\" content=\"5\"></noscript>"));
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "nothing from elsewhere"
    );
    assert!(
        html.contains("id=\"cluster\" hidden"),
        "no node table without a cluster"
    );

    // The feed: an SSE event a second, each the /stats document.
    use std::io::Write;
    let mut conn = std::net::TcpStream::connect(srv.admin).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(conn, "GET /dashboard/events HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut r = std::io::BufReader::new(conn);
    let (status, headers) = common::read_head(&mut r).unwrap();
    assert_eq!(status, 200);
    assert!(
        headers
            .iter()
            .any(|(k, v)| k == "content-type" && v == "text/event-stream")
    );
    let started = Instant::now();
    let mut events = Vec::new();
    while events.len() < 2 {
        let chunk = common::read_chunk(&mut r).unwrap().expect("feed goes on");
        let text = String::from_utf8(chunk).unwrap();
        for line in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
            events.push(serde_json::from_str::<serde_json::Value>(line).unwrap());
        }
    }
    assert!(started.elapsed() >= Duration::from_millis(800), "one a second");
    assert_eq!(events[1]["stats"]["connections"]["active"], 3);
    assert!(events[1]["uptime_s"].as_f64() > events[0]["uptime_s"].as_f64());
    assert!(events[1]["cluster"].is_null());
}

#[test]
fn in_cluster_mode_the_page_has_a_row_per_node() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    let prefix = format!("sbt-dash-{}", std::process::id());
    let node = |name: &str| {
        let mut s = settings();
        s.cluster.redis_url = url.clone();
        s.cluster.prefix = prefix.clone();
        s.cluster.node_name = name.to_owned();
        let srv = TestServer::start(s);
        let deadline = Instant::now() + Duration::from_secs(10);
        while request(srv.addr, "GET", "/readyz", &[], b"").map_or(true, |r| r.status != 200) {
            assert!(Instant::now() < deadline, "{name} not ready");
            std::thread::sleep(Duration::from_millis(50));
        }
        srv
    };
    let (a, b) = (node("dash-a"), node("dash-b"));
    let _on_a: Vec<StreamClient> = (0..2).map(|i| open(a.addr, &format!("ca{i}"))).collect();
    let _on_b: Vec<StreamClient> = (0..3).map(|i| open(b.addr, &format!("cb{i}"))).collect();
    for _ in 0..5 {
        assert_eq!(
            request(b.addr, "POST", "/send/cb0", &[], b"x").unwrap().status,
            200
        );
    }

    let browser = Browser::open(&format!("http://{}/", a.admin));
    let mut dt = browser.devtools();
    let dom = dom_until(&mut dt, Duration::from_secs(30), "a row for each node", |d| {
        if samples(d) < 1 {
            return false;
        }
        let rows = rows(d, "nodes");
        rows.len() == 2 && rows[0][1] == "2" && rows[1][1] == "3"
    });
    let table = rows(&dom, "nodes");
    assert_eq!(table[0][0], "dash-a (this one)", "{table:?}");
    assert_eq!(table[1][0], "dash-b", "{table:?}");
    assert_eq!(text(&dom, "node"), "dash-a");
    assert!(
        text(&dom, "cluster-caption").contains("2 nodes, 5 streams"),
        "{dom}"
    );

    // Rates per node, from its heartbeats (once a second by default): more
    // streams on b show as connects/s in b's row, and stay shown between
    // heartbeats.
    let _more: Vec<StreamClient> = (0..6)
        .map(|i| {
            std::thread::sleep(Duration::from_millis(200));
            open(b.addr, &format!("cb-more{i}"))
        })
        .collect();
    let moving = dom_until(&mut dt, Duration::from_secs(15), "b's connects/s", |d| {
        let rows = rows(d, "nodes");
        rows.len() == 2 && rows[1][2].parse::<f64>().is_ok_and(|r| r > 0.0)
    });
    let later = dom_until(&mut dt, Duration::from_secs(5), "a later sample", |d| {
        samples(d) > samples(&moving)
    });
    let b_row = &rows(&later, "nodes")[1];
    assert!(b_row[2].parse::<f64>().is_ok(), "b's rate stays shown: {b_row:?}");
    let shot = artifacts().join("dashboard-cluster.png");
    std::fs::write(&shot, dt.screenshot()).unwrap();
    println!("screenshot: {}", shot.display());

    // Redis gone: the page says the nodes are unknown, and why.
    redis.kill();
    let gone = dom_until(&mut dt, Duration::from_secs(20), "nodes unknown", |d| {
        text(d, "cluster-caption").starts_with("Nodes unknown")
    });
    assert!(
        text(&gone, "cluster-caption").contains("cluster bus unavailable"),
        "{}",
        text(&gone, "cluster-caption")
    );
    assert!(rows(&gone, "nodes").is_empty());
}
