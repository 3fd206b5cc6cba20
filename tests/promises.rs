//! The promises issue 40 found broken, each reproduced against real
//! processes: one malformed TLS record made the TLS path panic; a stream
//! that panicked kept its per-address slot; and a fleet whose clock ran
//! ahead of the node answered 200 for messages no stream got.

mod common;

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use common::process::Proc;
use common::{RedisServer, StreamClient, TestServer, make_certificates, request, settings};

const BIN: &str = env!("CARGO_BIN_EXE_switchboard");

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("switchboard-promises-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `curl` over TLS, trusting `ca`: (exit code, body).
fn curl_tls(ca: &std::path::Path, url: &str) -> (i32, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert"])
        .arg(ca)
        .arg(url)
        .output()
        .expect("curl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The record of issue 40, and two like it: a handshake record whose
/// message claims more bytes than the record holds. Before the fix the
/// first made rustls panic (`range start index 43 out of range`) inside
/// the server; now each is refused, counted as a failed handshake, and
/// the server goes on serving TLS.
#[test]
fn malformed_tls_records_are_refused_and_counted_never_a_panic() {
    let dir = temp_dir("tls");
    let certs = make_certificates(&dir, "p");
    let mut cmd = Command::new(BIN);
    cmd.env("SWITCHBOARD__SERVER__PORT", "0")
        // The operator pages on the public port too (tests/exposing.rs
        // tests where they belong).
        .env("SWITCHBOARD__SERVER__ADMIN_PUBLIC", "true")
        .env("SWITCHBOARD__SERVER__TLS_CERT_FILE", &certs.cert)
        .env("SWITCHBOARD__SERVER__TLS_KEY_FILE", &certs.key)
        // What made the first panic cost 158 MB of RSS for good.
        .env("RUST_BACKTRACE", "1");
    let (p, addrs) = Proc::start(cmd);
    let addr = addrs[0];
    let record = |hs: &[u8]| {
        let mut r = vec![0x16, 0x03, 0x01];
        r.extend((hs.len() as u16).to_be_bytes());
        r.extend(hs);
        r
    };
    let mut issue_40 = vec![0x01, 0xff, 0xff, 0xff, 0x03, 0x03];
    issue_40.extend([0u8; 32]);
    let mut short = vec![0x01, 0x00, 0x01, 0x00];
    short.extend([0x03, 0x03]);
    let sends: Vec<Vec<u8>> = vec![
        record(&issue_40),
        // The same, in two writes.
        record(&issue_40),
        // A message 256 bytes long in a record of 6.
        record(&short),
    ];
    for (i, bytes) in sends.iter().enumerate() {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        if i == 1 {
            s.write_all(&bytes[..20]).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            s.write_all(&bytes[20..]).unwrap();
        } else {
            s.write_all(bytes).unwrap();
        }
        // The server answers with an alert or waits for more; either way
        // it must not panic. Give it the time the issue's probe gave.
        let mut buf = [0u8; 64];
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        let _ = s.read(&mut buf);
    }
    let (code, body) = curl_tls(&certs.ca, &format!("https://127.0.0.1:{}/stats", addr.port()));
    assert_eq!(code, 0, "TLS still served after the records: {body}");
    let stats: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(stats["panics"], 0, "{stats}");
    assert!(
        stats["tls"]["handshake_failures"].as_u64().unwrap() >= 1,
        "{stats}"
    );
    assert!(
        p.events("panic").is_empty(),
        "no panic is logged: {:?}",
        p.events("panic")
    );
    drop(p);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A stream whose handler panics (fault injection: `/admin/cut/{id}?panic=1`)
/// gives back its per-address slot, its counters and its Router entry, as
/// one that ends normally does; the panic is counted.
#[test]
fn a_stream_that_panics_gives_back_its_slot_and_its_counters() {
    let mut s = settings();
    s.server.admin_public = true;
    s.debug.fault_injection = true;
    s.limits.streams_per_ip = 1;
    s.limits.exempt = String::new();
    let srv = TestServer::start(s);
    let mut first = StreamClient::open(srv.addr, "boom");
    assert_eq!(first.status, 200);
    first.line();
    let refused = StreamClient::open(srv.addr, "other");
    assert_eq!(refused.status, 429, "one stream per address");
    let r = srv.post("/admin/cut/boom?panic=1", "");
    assert_eq!(r.status, 200, "{}", r.text());
    let stats = srv.wait_stats(Duration::from_secs(10), |s| {
        s["panics"].as_u64() >= Some(1) && s["connections"]["active"] == 0
    });
    assert!(stats["panics"].as_u64() >= Some(1), "{stats}");
    assert_eq!(stats["connections"]["active"], 0, "{stats}");
    // The address's slot is free again, and the id has no stale entry.
    let mut again = StreamClient::open(srv.addr, "boom");
    assert_eq!(again.status, 200, "the slot was given back");
    again.line();
    let sent = srv.post("/send/boom", "after the panic");
    assert!(sent.text().contains("\"delivered\":1"), "{}", sent.text());
    assert_eq!(again.message(), "Recvd msg #1: 'after the panic'");
}

fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as u64
}

fn post(addr: SocketAddr, path: &str, body: &str) -> common::Response {
    request(addr, "POST", path, &[], body.as_bytes()).unwrap()
}

fn wait_ready(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !request(addr, "GET", "/readyz", &[], b"").is_ok_and(|r| r.status == 200) {
        assert!(Instant::now() < deadline, "{addr} not ready");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The issue's reproduction: the fleet's clock two minutes ahead of the
/// node. Before the fix `/send` answered 200 and no stream got the
/// message (the node dropped its own echo). Now the publish is refused
/// with a 503 that says why, nothing is kept or sent; past five minutes
/// the clock is reset with a new epoch and publishing goes on.
#[test]
fn a_fleet_clock_ahead_of_redis_is_refused_with_a_503_never_a_lost_200() {
    let redis = RedisServer::start();
    let (p, addr, mut stream) = node_with_a_stream(&redis, "promises", "ck");
    let first = post(addr, "/send/ck", "before");
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(stream.message(), "Recvd msg #1: 'before'");

    let ahead = (now_us() + 120_000_000).to_string();
    redis.command(&["HSET", "promises:fleet", "clock", &ahead]);
    let refused = post(addr, "/send/ck", "lost before the fix");
    assert_eq!(refused.status, 503, "{}", refused.text());
    let body = refused.json();
    assert!(
        body["error"].as_str().unwrap().contains("ahead of Redis's time"),
        "{body}"
    );
    let retry: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((100..=121).contains(&retry), "Retry-After {retry}");
    let broadcast = post(addr, "/broadcast", "nor this");
    assert_eq!(broadcast.status, 503, "{}", broadcast.text());

    // Ten minutes ahead cannot be waited for: reset, with a new epoch.
    let far = (now_us() + 600_000_000).to_string();
    redis.command(&["HSET", "promises:fleet", "clock", &far]);
    let after = post(addr, "/send/ck", "after the reset");
    assert_eq!(after.status, 200, "{}", after.text());
    assert_eq!(after.json()["delivered"], 1, "{}", after.text());
    // The stream gets it next: neither refused message ever reached it.
    assert_eq!(stream.message(), "Recvd msg #2: 'after the reset'");
    let stats = get_json(addr, "/stats");
    assert!(stats["cluster"]["clock_ahead"].as_u64() >= Some(2), "{stats}");
    assert_eq!(stats["cluster"]["clock_resets"], 1, "{stats}");
    assert!(!p.events("fleet_clock_reset").is_empty());
}

/// The binary in cluster mode on `redis` (keys under `prefix`), ready,
/// with a stream of `id` open on it and welcomed.
fn node_with_a_stream(redis: &RedisServer, prefix: &str, id: &str) -> (Proc, SocketAddr, StreamClient) {
    let mut cmd = Command::new(BIN);
    cmd.env("SWITCHBOARD__SERVER__PORT", "0")
        // The operator pages on the public port too (tests/exposing.rs
        // tests where they belong).
        .env("SWITCHBOARD__SERVER__ADMIN_PUBLIC", "true")
        .env("SWITCHBOARD__CLUSTER__REDIS_URL", redis.url())
        .env("SWITCHBOARD__CLUSTER__PREFIX", prefix);
    let (p, addrs) = Proc::start(cmd);
    let addr = addrs[0];
    wait_ready(addr);
    let mut stream = StreamClient::open(addr, id);
    stream.line();
    (p, addr, stream)
}

fn get_json(addr: SocketAddr, path: &str) -> Value {
    request(addr, "GET", path, &[], b"").unwrap().json()
}

/// A node whose clock runs two minutes behind Redis's (the binary under
/// libfaketime; Redis itself will not run under it), in a fleet with a
/// node whose clock is right. Event ids are Redis's time, so every id the
/// other node publishes is two minutes ahead of the slow node's clock:
/// before the fix it dropped them all (while `/send` answered 200). Now
/// each node corrects for the skew its heartbeat measures, messages flow
/// both ways, and the skew shows in `/stats` and `/metrics`, with `/readyz`
/// answering 503 that names it.
#[test]
fn a_node_whose_clock_is_behind_redis_loses_nothing_and_readyz_names_the_skew() {
    // libfaketime preloaded into the binary itself, not the `faketime`
    // wrapper: the wrapper forks, and stopping it left the node running.
    let lib = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";
    assert!(
        std::path::Path::new(lib).exists(),
        "libfaketime is not installed; this test runs a node under it: apt-get install -y faketime"
    );
    let redis = RedisServer::start();
    let mut cmd = Command::new(BIN);
    cmd.env("LD_PRELOAD", lib)
        .env("FAKETIME", "-120s")
        .env("SWITCHBOARD__SERVER__PORT", "0")
        // The operator pages on the public port too (tests/exposing.rs
        // tests where they belong).
        .env("SWITCHBOARD__SERVER__ADMIN_PUBLIC", "true")
        .env("SWITCHBOARD__CLUSTER__REDIS_URL", redis.url())
        .env("SWITCHBOARD__CLUSTER__PREFIX", "skew")
        .env("SWITCHBOARD__CLUSTER__NODE_NAME", "slow")
        .env("SWITCHBOARD__CLUSTER__HEARTBEAT_INTERVAL_MS", "200");
    let (slow_proc, addrs) = Proc::start(cmd);
    let slow = addrs[0];
    let mut s = settings();
    s.cluster.redis_url = redis.url();
    s.cluster.prefix = "skew".into();
    s.cluster.node_name = "right".into();
    s.server.admin_public = true;
    let right = TestServer::start(s);
    wait_ready(right.addr);

    // The slow node: its bus comes up, then its heartbeat measures the skew.
    let deadline = Instant::now() + Duration::from_secs(15);
    let readyz = loop {
        let r = request(slow, "GET", "/readyz", &[], b"").unwrap();
        if r.status == 503 && r.text().contains("clock differs") {
            break r;
        }
        assert!(Instant::now() < deadline, "readyz: {} {}", r.status, r.text());
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(readyz.text().contains("more than 30 s"), "{}", readyz.text());
    let skew = get_json(slow, "/stats")["cluster"]["clock_skew_ms"]
        .as_i64()
        .unwrap();
    assert!((110_000..130_000).contains(&skew), "skew {skew} ms");
    let metrics = request(slow, "GET", "/metrics", &[], b"").unwrap().text();
    assert!(
        metrics.contains("switchboard_cluster_clock_skew_seconds{"),
        "{metrics}"
    );
    assert!(
        right.stats()["cluster"]["clock_skew_ms"].as_i64().unwrap().abs() < 5_000,
        "the right node measures no skew"
    );

    // Both ways across the fleet.
    for (from, to, id) in [(right.addr, slow, "to-slow"), (slow, right.addr, "to-right")] {
        let mut stream = StreamClient::open(to, id);
        stream.line();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let r = post(from, &format!("/send/{id}"), "across");
            assert_eq!(r.status, 200, "{}", r.text());
            if r.json()["nodes"].as_u64() >= Some(1) {
                break;
            }
            assert!(Instant::now() < deadline, "{to} never subscribed to {id}");
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(stream.message().ends_with("'across'"), "{id}");
    }
    assert_eq!(get_json(slow, "/stats")["cluster"]["ids_ahead"], 0);
    assert!(slow_proc.events("bus_id_ahead").is_empty());
}

/// Redis state is input (issue 40): what an earlier version, a hand edit
/// or another program left under the fleet's prefix is checked, healed or
/// left out, with a logged reason, instead of wedging every request.
/// Before the fix each of these answered 503 for good (or, for the node
/// entry, added u64::MAX into the totals).
#[test]
fn out_of_range_redis_state_heals_or_is_left_out() {
    let redis = RedisServer::start();
    let (p, addr, mut stream) = node_with_a_stream(&redis, "state", "st");

    // A fleet clock past what Lua's numbers hold: reset, with a new epoch.
    redis.command(&["HSET", "state:fleet", "clock", "100000000000000000000"]);
    let r = post(addr, "/send/st", "one");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(stream.message(), "Recvd msg #1: 'one'");

    // An id's history whose last entry is in the future: replaced.
    let future = format!("{}-0", now_us() + 3_600_000_000);
    redis.command(&["DEL", "state:history:st"]);
    redis.command(&["XADD", "state:history:st", &future, "m", "from the future"]);
    let r = post(addr, "/send/st", "two");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(stream.message(), "Recvd msg #2: 'two'");

    // The /dispatcher count at i64::MAX, then not a number: numbering
    // starts again at 1.
    redis.command(&["SET", "state:dispatcher", &i64::MAX.to_string()]);
    let r = request(addr, "GET", "/dispatcher", &[], b"").unwrap();
    assert_eq!((r.status, r.text()), (200, "1".to_owned()));
    redis.command(&["SET", "state:dispatcher", "many"]);
    let r = request(addr, "GET", "/dispatcher", &[], b"").unwrap();
    assert_eq!((r.status, r.text()), (200, "1".to_owned()));
    let r = request(addr, "GET", "/dispatcher", &[], b"").unwrap();
    assert_eq!((r.status, r.text()), (200, "2".to_owned()));

    // A node entry claiming u64::MAX streams, and a presence count that is
    // not a number: left out of /cluster and /presence.
    let far_future_ms = (now_us() / 1000 + 60_000).to_string();
    for (name, entry) in [
        (
            "liar",
            r#"{"name":"liar","instance":"liar1","host":"h","pid":1,"streams":18446744073709551615,"uptime_s":1,"addr":"x"}"#,
        ),
        (
            "odd",
            r#"{"name":"odd","instance":"odd1","host":"h","pid":2,"streams":1,"uptime_s":1,"addr":"y"}"#,
        ),
    ] {
        redis.command(&["SET", &format!("state:node:{name}"), entry, "PX", "60000"]);
        redis.command(&["ZADD", "state:nodes", &far_future_ms, name]);
    }
    redis.command(&["HSET", "state:presence:odd1", "st", "lots"]);
    let view = get_json(addr, "/cluster");
    let names: Vec<&str> = view["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["name"].as_str())
        .collect();
    assert!(
        names.contains(&"odd") && !names.contains(&"liar"),
        "the liar is left out: {view}"
    );
    assert!(view["totals"]["streams"].as_u64() <= Some(2), "{view}");
    let presence = request(addr, "GET", "/presence/st", &[], b"").unwrap();
    assert_eq!(presence.status, 200, "{}", presence.text());
    assert_eq!(presence.json()["streams"], 1, "{}", presence.text());

    let stats = get_json(addr, "/stats");
    assert!(stats["cluster"]["bad_state"].as_u64() >= Some(4), "{stats}");
    assert!(stats["cluster"]["clock_resets"].as_u64() >= Some(2), "{stats}");
    assert!(!p.events("redis_bad_state").is_empty());
}
