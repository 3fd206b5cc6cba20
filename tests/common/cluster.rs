//! Cluster mode's test setup, shared by the `tests/cluster_*.rs` files:
//! a real `redis-server` per test ([`RedisServer`]), nodes in this
//! process ([`start_node`]) or as the real binary ([`binary_node`], and
//! [`processes`] for a `--processes N` fleet), the requests and waits the
//! tests make of them, and the readers of `?ids=1` streams.
//!
//! Every test starts its own redis-server on a free port and uses its own
//! `cluster.prefix` ([`prefix`]), so the tests share nothing and run in
//! parallel.
//!
//! Not in `common/mod.rs`: the tools' tests include that too, and
//! [`BIN`] exists only in this package's tests. A test file takes it with
//! `#[path = "common/cluster.rs"] mod cluster;` beside `mod common;`.
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use switchboard::Settings;

use crate::common::process::Proc;
use crate::common::{RedisServer, Response, StreamClient, TestServer, request, settings};

/// The server binary Cargo built for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_switchboard");

/// The bound on every wait for something that should happen at once.
pub const WAIT: Duration = Duration::from_secs(5);

/// A `cluster.prefix` no other test (or earlier run) uses.
pub fn prefix(test: &str) -> String {
    format!("sbt-{test}-{}", std::process::id())
}

/// The Redis channel of one id.
pub fn id_channel(prefix: &str, id: &str) -> String {
    format!("{prefix}:id:{id}")
}

/// Polls `f` every 10 ms until it holds; panics naming `what` after `within`.
pub fn wait_until(within: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn get(addr: SocketAddr, path: &str) -> Response {
    request(addr, "GET", path, &[], b"").unwrap_or_else(|e| panic!("GET {path} on {addr}: {e}"))
}

pub fn post(addr: SocketAddr, path: &str, body: &str) -> Response {
    request(addr, "POST", path, &[], body.as_bytes()).unwrap_or_else(|e| panic!("POST {path} on {addr}: {e}"))
}

/// Waits until `/readyz` answers 200 (the node's bus is connected).
pub fn wait_ready(addr: SocketAddr) {
    wait_until(WAIT, &format!("{addr} /readyz 200"), || {
        request(addr, "GET", "/readyz", &[], b"").is_ok_and(|r| r.status == 200)
    });
}

/// `/cluster` once it answers 200 with `pred` holding; `Err` with the last
/// answer (or null) when `within` passes first.
pub fn try_wait_cluster(
    addr: SocketAddr,
    within: Duration,
    pred: impl Fn(&Value) -> bool,
) -> Result<Value, Value> {
    let mut last = Value::Null;
    let deadline = Instant::now() + within;
    loop {
        if let Ok(r) = request(addr, "GET", "/cluster", &[], b"")
            && r.status == 200
        {
            last = r.json();
            if pred(&last) {
                return Ok(last);
            }
        }
        if Instant::now() > deadline {
            return Err(last);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `/cluster` once `pred` holds; panics naming `what` after `within`.
pub fn wait_cluster(addr: SocketAddr, within: Duration, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    try_wait_cluster(addr, within, pred)
        .unwrap_or_else(|last| panic!("not within {within:?}: {what}; last /cluster: {last}"))
}

/// The `pid`s of the nodes in a `/cluster` answer.
pub fn cluster_pids(cluster: &Value) -> BTreeSet<u64> {
    cluster["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["pid"].as_u64().unwrap())
        .collect()
}

pub fn cluster_names(cluster: &Value) -> Vec<String> {
    cluster["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap().to_owned())
        .collect()
}

/// Settings for an in-process node `name` on `redis` under `prefix`.
pub fn node_settings(redis: &RedisServer, prefix: &str, name: &str) -> Settings {
    let mut s = settings();
    // These tests read /cluster, /stats and /metrics on a node's (or a
    // fleet's) one port, so the operator pages are served there too; the
    // rules of the internal listener are tests/exposing.rs's.
    s.server.admin_public = true;
    s.cluster.redis_url = redis.url();
    s.cluster.prefix = prefix.to_owned();
    s.cluster.node_name = name.to_owned();
    s
}

/// An in-process node, started and with its bus connected.
pub fn start_node(s: Settings) -> TestServer {
    let srv = TestServer::start(s);
    wait_ready(srv.addr);
    srv
}

/// Opens `id` on `addr` and reads its welcome line.
pub fn open(addr: SocketAddr, id: &str) -> StreamClient {
    let mut c = StreamClient::open(addr, id);
    assert_eq!(c.status, 200, "GET /test/{id} on {addr}");
    assert_eq!(c.line(), format!("Switchboard welcomes you! Your Id: {id}"));
    c
}

/// [`wait_cluster`], with `p`'s log if it fails.
pub fn wait_cluster_of(
    p: &Proc,
    addr: SocketAddr,
    within: Duration,
    what: &str,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    try_wait_cluster(addr, within, pred).unwrap_or_else(|last| {
        panic!(
            "not within {within:?}: {what}; last /cluster: {last}; log:\n{}",
            p.log_text()
        )
    })
}

/// The parent pid of `pid`, from /proc/PID/stat (None once it is gone).
pub fn parent_of(pid: u64) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ...": comm may hold spaces, so split after ')'.
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
}

/// The binary with a cluster configuration: JSON logs, one worker, no ticks.
pub fn binary(redis: &RedisServer, prefix: &str) -> Command {
    let mut cmd = fleet_binary(prefix);
    cmd.env("SWITCHBOARD__CLUSTER__REDIS_URL", redis.url());
    cmd
}

/// [`binary`] without saying where Redis is.
pub fn fleet_binary(prefix: &str) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env("SWITCHBOARD__SERVER__PORT", "0")
        // As in `node_settings`: the operator pages on the fleet's port.
        .env("SWITCHBOARD__SERVER__ADMIN_PUBLIC", "true")
        .env("SWITCHBOARD__SERVER__WORKERS", "1")
        .env("SWITCHBOARD__SERVER__SHUTDOWN_TIMEOUT_MS", "3000")
        .env("SWITCHBOARD__STREAM__TICK_INTERVAL_MS", "600000")
        .env("SWITCHBOARD__CLUSTER__PREFIX", prefix);
    cmd
}

/// One single-process node as a binary named `name`; waits for its bus.
pub fn binary_node(mut cmd: Command, name: &str) -> (Proc, SocketAddr) {
    cmd.env("SWITCHBOARD__CLUSTER__NODE_NAME", name);
    let p = Proc::spawn(cmd);
    let addr = p.wait_listening()[0];
    wait_ready(addr);
    (p, addr)
}

/// `--processes n` on one port, once its `n` children are in `/cluster`
/// and listening. The port is named before the fleet starts (the parent
/// holds no socket to report): one taken meanwhile means another try on
/// new ports.
pub fn processes(redis: &RedisServer, prefix: &str, n: usize) -> (Proc, SocketAddr) {
    let fleet = |ports: &[u16]| {
        let mut cmd = binary(redis, prefix);
        cmd.args(["--processes", &n.to_string()])
            .env("SWITCHBOARD__SERVER__PORT", ports[0].to_string())
            .env("SWITCHBOARD__CLUSTER__HEARTBEAT_INTERVAL_MS", "200")
            .env("SWITCHBOARD__CLUSTER__HEARTBEAT_TTL_MS", "1500");
        cmd
    };
    let (parent, ports) = Proc::start_on_free_ports(1, fleet, |p, ports| fleet_is_up(p, ports[0], n));
    let addr: SocketAddr = ([127, 0, 0, 1], ports[0]).into();
    // Every child listens before streams are opened, so the kernel spreads
    // them over all.
    wait_until(WAIT, &format!("{n} listening lines"), || {
        parent.log_fields("switchboard listening").len() >= n
    });
    (parent, addr)
}

/// Whether `/cluster` on `port` lists `n` nodes, each a child of `parent`:
/// its fleet is up, and what answers on the port is that fleet, not a
/// server of another test that took the port first.
pub fn fleet_is_up(parent: &Proc, port: u16, n: usize) -> bool {
    let Ok(r) = request(([127, 0, 0, 1], port).into(), "GET", "/cluster", &[], b"") else {
        return false;
    };
    let Ok(c) = serde_json::from_slice::<Value>(&r.body) else {
        return false;
    };
    let parent = u64::from(parent.pid());
    r.status == 200
        && c["totals"]["nodes"] == n
        && cluster_pids(&c).iter().all(|&pid| parent_of(pid) == Some(parent))
}

/// A port kept for a server that starts later (a Redis the nodes are told
/// of before it runs), instead of a `free_port()` anyone may take
/// meanwhile: bound but not listening, so a connection to it is refused
/// as if nothing were there and the kernel gives it to no port-0 bind.
/// Bound with SO_REUSEADDR, as redis-server binds: Linux lets such
/// sockets share a port while none of them listens, so the server takes
/// it while this still holds it. Drop it once the server runs.
pub struct HeldPort {
    pub port: u16,
    /// The bound socket: the hold.
    _socket: socket2::Socket,
}

impl HeldPort {
    pub fn new() -> Self {
        use socket2::{Domain, Socket, Type};
        let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        socket.set_reuse_address(true).unwrap();
        let any: SocketAddr = ([127, 0, 0, 1], 0).into();
        socket.bind(&any.into()).unwrap();
        // unwrap: an IPv4 socket just bound has an IPv4 address.
        let port = socket.local_addr().unwrap().as_socket().unwrap().port();
        HeldPort {
            port,
            _socket: socket,
        }
    }
}

/// Reads every line `c` has within `within` (ticks are a minute apart in
/// tests, so these are the messages).
pub fn lines_within(c: &mut StreamClient, within: Duration) -> Vec<String> {
    use std::io::BufRead;
    c.reader
        .get_mut()
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let deadline = Instant::now() + within;
    let mut lines = Vec::new();
    while Instant::now() < deadline {
        let mut size = String::new();
        match c.reader.read_line(&mut size) {
            Ok(0) => break,
            Ok(_) => {
                let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
                let mut chunk = vec![0u8; n + 2];
                std::io::Read::read_exact(&mut c.reader, &mut chunk).unwrap();
                lines.push(String::from_utf8_lossy(&chunk[..n]).trim_end().to_owned());
            }
            Err(_) => {}
        }
    }
    lines
}

/// A stream with event ids (`?ids=1`) on `addr`, resuming after `since`.
pub fn open_ids(addr: SocketAddr, id: &str, since: Option<u64>) -> StreamClient {
    let since = since.map(|s| format!("&since={s}")).unwrap_or_default();
    StreamClient::open_raw(
        addr,
        &format!("GET /test/{id}?ids=1{since} HTTP/1.1\r\nhost: t\r\n\r\n"),
    )
}

/// A line of an `?ids=1` stream: its event id and the rest.
pub fn event_line(line: &str) -> (u64, &str) {
    let (id, rest) = line
        .split_once(' ')
        .unwrap_or_else(|| panic!("no event id: {line}"));
    (id.parse().unwrap_or_else(|_| panic!("no event id: {line}")), rest)
}

/// `/send` to `id` on `addr`: its event id.
pub fn send_ok(addr: SocketAddr, id: &str, text: &str) -> u64 {
    let r = post(addr, &format!("/send/{id}"), text);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["event_id"].as_u64().unwrap()
}
