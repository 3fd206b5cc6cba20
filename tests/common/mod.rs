//! Test helpers: a real server on a free port, and a small blocking HTTP/1.1
//! client over real sockets that can read chunked streams chunk by chunk.
#![allow(dead_code, missing_docs, unreachable_pub)]

use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;
use switchboard::{Server, Settings};

pub mod netns;
pub mod process;

/// How long any single read in a test may wait.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Settings for tests: short ticks, two workers, quiet.
pub fn settings() -> Settings {
    let mut s = Settings::defaults();
    s.server.workers = 2;
    s.stream.tick_interval_ms = 60_000;
    s.server.shutdown_timeout_ms = 2000;
    s
}

/// A server running in this process on 127.0.0.1:0.
pub struct TestServer {
    /// The first listening address.
    pub addr: SocketAddr,
    /// Every listening address.
    pub addrs: Vec<SocketAddr>,
    /// The internal listener (`server.admin_port` 0: a free port), where
    /// `/stats`, `/metrics`, `/cluster`, the dashboard and `/admin/*` are.
    pub admin: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<io::Result<()>>>,
    /// With `server.proxy_protocol` on: what this helper's own requests
    /// start with (a balancer's own LOCAL/UNKNOWN header).
    proxy_prefix: Vec<u8>,
}

/// 127.0.0.1, port 0: the kernel picks the port of a listener the test
/// keeps (and hands to the server it starts).
const LOOPBACK_ANY_PORT: (std::net::Ipv4Addr, u16) = (std::net::Ipv4Addr::LOCALHOST, 0);

impl TestServer {
    pub fn start(settings: Settings) -> Self {
        Self::start_on_ports(settings, 1)
    }

    /// A server listening on `ports` free ports at once.
    pub fn start_on_ports(settings: Settings, ports: usize) -> Self {
        let listeners = (0..ports)
            .map(|_| TcpListener::bind(LOOPBACK_ANY_PORT).unwrap())
            .collect();
        Self::start_on_listeners(settings, listeners)
    }

    /// A server whose first port is plain (what this helper's own requests
    /// use) and whose second, `addrs[1]`, serves TLS with `certs`
    /// (`server.tls_ports`).
    pub fn start_tls(mut settings: Settings, certs: &Certificates) -> Self {
        let listeners: Vec<TcpListener> = (0..2)
            .map(|_| TcpListener::bind(LOOPBACK_ANY_PORT).unwrap())
            .collect();
        settings.server.tls_cert_file = certs.cert.display().to_string();
        settings.server.tls_key_file = certs.key.display().to_string();
        settings.server.tls_ports = listeners[1].local_addr().unwrap().port().to_string();
        Self::start_on_listeners(settings, listeners)
    }

    /// A server on listeners the test bound; its internal listener on a
    /// free port of `server.admin_host` (tests never use a fixed one).
    pub fn start_on_listeners(mut settings: Settings, listeners: Vec<TcpListener>) -> Self {
        settings.server.admin_port = 0;
        let proxy_prefix = match settings.server.proxy_protocol {
            switchboard::config::ProxyProtocol::Off => Vec::new(),
            switchboard::config::ProxyProtocol::V2 => b"\r\n\r\n\0\r\nQUIT\n\x20\x00\x00\x00".to_vec(),
            _ => b"PROXY UNKNOWN\r\n".to_vec(),
        };
        let server = Server::from_listeners(settings, listeners).unwrap();
        let addrs = server.local_addrs();
        let addr = addrs[0];
        let admin = server.admin_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            actix::System::new().block_on(server.run(async {
                let _ = rx.await;
            }))
        });
        let ts = TestServer {
            addr,
            addrs,
            admin,
            stop: Some(tx),
            thread: Some(thread),
            proxy_prefix,
        };
        ts.wait_ready();
        ts
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.try_get("/healthz").is_ok_and(|r| r.status == 200) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("server did not become ready");
    }

    /// Graceful shutdown, as on SIGTERM; returns when `run` has returned.
    pub fn shutdown(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().unwrap().unwrap();
        }
    }

    pub fn try_get(&self, path: &str) -> io::Result<Response> {
        request_prefixed(self.addr, &self.proxy_prefix, "GET", path, &[], b"")
    }

    pub fn get(&self, path: &str) -> Response {
        self.try_get(path).unwrap()
    }

    pub fn post(&self, path: &str, body: &str) -> Response {
        request_prefixed(self.addr, &self.proxy_prefix, "POST", path, &[], body.as_bytes()).unwrap()
    }

    /// A GET on the internal listener (no PROXY header there).
    pub fn admin_get(&self, path: &str) -> Response {
        request(self.admin, "GET", path, &[], b"").unwrap()
    }

    /// A POST on the internal listener (`/admin/*`).
    pub fn admin_post(&self, path: &str, body: &str) -> Response {
        request(self.admin, "POST", path, &[], body.as_bytes()).unwrap()
    }

    pub fn stats(&self) -> Value {
        self.admin_get("/stats").json()
    }

    /// Polls `/stats` until `pred` holds or `within` passes; returns the last.
    pub fn wait_stats(&self, within: Duration, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let s = self.stats();
            if pred(&s) || Instant::now() > deadline {
                return s;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn open(&self, id: &str) -> StreamClient {
        StreamClient::open(self.addr, id)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A complete (non-streaming) response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// A `/send` answer without its `event_id`, which must be there (a
    /// number: the event id is the publish time, different every run).
    pub fn json_sans_event(&self) -> Value {
        let mut v = self.json();
        let id = v.as_object_mut().and_then(|o| o.remove("event_id"));
        assert!(
            id.as_ref().is_some_and(Value::is_u64),
            "no event_id in {}",
            self.text()
        );
        v
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `error` field of a JSON error body.
    pub fn error(&self) -> String {
        self.json()["error"].as_str().unwrap_or_default().to_owned()
    }
}

/// One request on a fresh connection (`connection: close`).
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> io::Result<Response> {
    request_prefixed(addr, b"", method, path, headers, body)
}

/// [`request`], with `prefix` (a PROXY protocol header) sent first.
pub fn request_prefixed(
    addr: SocketAddr,
    prefix: &[u8],
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> io::Result<Response> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(READ_TIMEOUT))?;
    s.write_all(prefix)?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if method != "GET" || !body.is_empty() {
        head.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    read_response(&mut BufReader::new(s))
}

/// Reads one response with a content-length or chunked body.
pub fn read_response(r: &mut impl BufRead) -> io::Result<Response> {
    let (status, headers) = read_head(r)?;
    let get = |n: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.clone())
    };
    let mut body = Vec::new();
    if let Some(len) = get("content-length") {
        body.resize(len.parse().unwrap(), 0);
        r.read_exact(&mut body)?;
    } else if get("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        while let Some(chunk) = read_chunk(r)? {
            body.extend(chunk);
        }
    } else {
        r.read_to_end(&mut body)?;
    }
    Ok(Response {
        status,
        headers,
        body,
    })
}

/// Reads a status line and headers.
pub fn read_head(r: &mut impl BufRead) -> io::Result<(u16, Vec<(String, String)>)> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("bad status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (k, v) = l.split_once(':').unwrap();
        headers.push((k.trim().to_owned(), v.trim().to_owned()));
    }
    Ok((status, headers))
}

/// Reads one chunk; `None` for the final zero-length chunk.
pub fn read_chunk(r: &mut impl BufRead) -> io::Result<Option<Vec<u8>>> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    let len = usize::from_str_radix(line.trim_end(), 16)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("bad chunk size {line:?}")))?;
    let mut data = vec![0; len + 2];
    r.read_exact(&mut data)?;
    assert_eq!(&data[len..], b"\r\n", "chunk not terminated by CRLF");
    data.truncate(len);
    Ok((len > 0).then_some(data))
}

/// A client holding one stream.
pub struct StreamClient {
    pub reader: BufReader<TcpStream>,
    pub status: u16,
    pub headers: Vec<(String, String)>,
}

impl StreamClient {
    /// `GET /test/{id}` the way curl sends it (lean path).
    pub fn open(addr: SocketAddr, id: &str) -> Self {
        Self::open_raw(
            addr,
            &format!("GET /test/{id} HTTP/1.1\r\nhost: test\r\nuser-agent: t\r\n\r\n"),
        )
    }

    /// Sends `request` verbatim and reads the response head.
    pub fn open_raw(addr: SocketAddr, request: &str) -> Self {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        Self::on(s, request.as_bytes())
    }

    /// Sends `bytes` verbatim on `s` (connected) and reads the response head.
    pub fn on(mut s: TcpStream, bytes: &[u8]) -> Self {
        s.write_all(bytes).unwrap();
        let mut reader = BufReader::new(s);
        let (status, headers) = read_head(&mut reader).unwrap();
        StreamClient {
            reader,
            status,
            headers,
        }
    }

    /// A stream served by actix-web's fallback route: a keep-alive request
    /// first, so the stream is the connection's second request.
    pub fn open_fallback(addr: SocketAddr, id: &str) -> Self {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nhost: test\r\n\r\n")
            .unwrap();
        let mut reader = BufReader::new(s);
        let first = read_response(&mut reader).unwrap();
        assert_eq!(first.text(), "ok");
        let req = format!("GET /test/{id} HTTP/1.1\r\nhost: test\r\n\r\n");
        reader.get_mut().write_all(req.as_bytes()).unwrap();
        let (status, headers) = read_head(&mut reader).unwrap();
        StreamClient {
            reader,
            status,
            headers,
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The next event line (one chunk, one line, without the `\n`).
    pub fn line(&mut self) -> String {
        let chunk = read_chunk(&mut self.reader)
            .expect("reading a chunk")
            .expect("stream ended");
        let text = String::from_utf8(chunk).expect("UTF-8 chunk");
        let line = text.strip_suffix('\n').expect("chunk ends with a newline");
        assert!(!line.contains('\n'), "one line per chunk: {text:?}");
        line.to_owned()
    }

    /// Skips ticks until a line that is not a tick.
    pub fn message(&mut self) -> String {
        loop {
            let l = self.line();
            if !l.starts_with("Chunk ") {
                return l;
            }
        }
    }

    /// Reads until the final zero-length chunk; returns the lines before it.
    pub fn read_to_end(&mut self) -> io::Result<Vec<String>> {
        let mut lines = Vec::new();
        while let Some(c) = read_chunk(&mut self.reader)? {
            lines.push(String::from_utf8(c).unwrap());
        }
        Ok(lines)
    }
}

/// A reply from Redis, as RESP2 encodes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resp {
    /// `+OK`
    Simple(String),
    /// `-ERR ...`
    Error(String),
    /// `:42`
    Int(i64),
    /// `$3\r\nfoo`, or `$-1` (nil).
    Bulk(Option<Vec<u8>>),
    /// `*2 ...`, or `*-1` (nil).
    Array(Option<Vec<Resp>>),
}

impl Resp {
    /// The reply as text: simple strings and bulk strings; `None` for nil.
    pub fn text(&self) -> Option<String> {
        match self {
            Resp::Simple(s) => Some(s.clone()),
            Resp::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        }
    }

    pub fn int(&self) -> Option<i64> {
        match self {
            Resp::Int(n) => Some(*n),
            _ => None,
        }
    }

    pub fn items(&self) -> &[Resp] {
        match self {
            Resp::Array(Some(items)) => items,
            _ => &[],
        }
    }
}

/// Writes one command as a RESP array of bulk strings.
pub fn write_resp_command(w: &mut impl Write, args: &[&str]) -> io::Result<()> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    w.write_all(&out)
}

/// Reads one RESP2 reply.
pub fn read_resp(r: &mut impl BufRead) -> io::Result<Resp> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("bad RESP {what}: {line:?}"));
    let body = line.strip_suffix("\r\n").ok_or_else(|| bad("line end"))?;
    let (kind, rest) = body.split_at(body.len().min(1));
    let int = || rest.parse::<i64>().map_err(|_| bad("number"));
    Ok(match kind {
        "+" => Resp::Simple(rest.to_owned()),
        "-" => Resp::Error(rest.to_owned()),
        ":" => Resp::Int(int()?),
        "$" => match int()? {
            n if n < 0 => Resp::Bulk(None),
            n => {
                let mut data = vec![0; n as usize + 2];
                r.read_exact(&mut data)?;
                data.truncate(n as usize);
                Resp::Bulk(Some(data))
            }
        },
        "*" => match int()? {
            n if n < 0 => Resp::Array(None),
            n => Resp::Array(Some((0..n).map(|_| read_resp(r)).collect::<io::Result<_>>()?)),
        },
        _ => return Err(bad("type")),
    })
}

/// One command to the Redis on 127.0.0.1:`port`, on a fresh connection.
pub fn redis_command(port: u16, args: &[&str]) -> io::Result<Resp> {
    let s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(READ_TIMEOUT))?;
    let mut r = BufReader::new(s);
    write_resp_command(r.get_mut(), args)?;
    read_resp(&mut r)
}

/// A TCP port on 127.0.0.1 for a server that cannot bind port 0 itself
/// and report it (redis-server and its sentinels, haproxy, a fleet whose
/// processes share a named port): a candidate, never a reservation. It is
/// drawn at random from 20000-59999 among the ports no socket on this
/// machine uses now (`/proc/net/tcp`), without binding it: a port bound and
/// released here is the very one the kernel may hand the next port-0 bind
/// of another test. Another process can still take it before the server
/// binds it, so every caller starts its server on it and tries another on
/// "in use": `RedisServer`'s constructors, `Proc::start_on_free_ports`,
/// edge.rs's haproxy. A server that can bind port 0 itself (switchboard,
/// `TestServer`'s listeners, the test pages) does that instead; one that
/// cannot is found by its pid on the port it was given
/// ([`listening_ports`]), not by whoever answers there.
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    let taken = ports_in_use();
    loop {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos(),
        );
        let port = 20_000 + (h.finish() % 40_000) as u16;
        if !taken.contains(&port) {
            return port;
        }
    }
}

/// Every local TCP port some socket on this machine has now, in any state.
fn ports_in_use() -> std::collections::HashSet<u16> {
    let mut ports = std::collections::HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let local = line.split_whitespace().nth(1).unwrap_or_default();
            if let Some(port) = local
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok())
            {
                ports.insert(port);
            }
        }
    }
    ports
}

/// The TCP ports on which process `pid` listens (its sockets in LISTEN
/// state, from /proc): how a test knows that what answers on a port it
/// handed a server is that server and not another test's.
pub fn listening_ports(pid: u32) -> Vec<u16> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    let inodes: Vec<String> = fds
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|link| {
            let link = link.to_string_lossy().into_owned();
            Some(link.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    let mut ports = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        // "sl local_address rem_address st ... inode": LISTEN is st 0A.
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 9 && f[3] == "0A" && inodes.iter().any(|i| i == f[9]) {
                let port = f[1]
                    .rsplit_once(':')
                    .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
                ports.extend(port);
            }
        }
    }
    ports
}

/// A real `redis-server` on 127.0.0.1, started for one test, without
/// persistence, stopped (SIGKILL to the process this started) on drop.
pub struct RedisServer {
    pub port: u16,
    child: Option<std::process::Child>,
}

impl RedisServer {
    /// On a free port; retries with another port if one was taken meanwhile.
    pub fn start() -> Self {
        Self::on_some_free_port(Self::try_start_on)
            .unwrap_or_else(|e| panic!("redis-server did not start: {e}"))
    }

    /// `start` on a free port, and on another if that one was taken
    /// before redis-server bound it ([`free_port`]); up to 5 tries.
    fn on_some_free_port(start: impl Fn(u16) -> io::Result<Self>) -> io::Result<Self> {
        let mut last = None;
        for _ in 0..5 {
            match start(free_port()) {
                Ok(r) => return Ok(r),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("tried at least once"))
    }

    /// On `port` (e.g. the port of a Redis killed before, to restart it).
    pub fn start_on(port: u16) -> Self {
        Self::try_start_on(port).unwrap_or_else(|e| panic!("redis-server on port {port}: {e}"))
    }

    /// On a free port, with `args` after the usual ones (e.g. a replica's
    /// `--replicaof`).
    pub fn start_with(args: &[&str]) -> Self {
        Self::on_some_free_port(|port| Self::try_start(port, args))
            .unwrap_or_else(|e| panic!("redis-server {args:?}: {e}"))
    }

    /// On a free port, with `args(tls_port)` after the usual ones, where
    /// `tls_port` is a second free port the arguments name (`--tls-port`):
    /// both are picked again if either was taken before redis-server bound
    /// it. Answers the server and its second port.
    pub fn start_with_tls_port(args: impl Fn(u16) -> Vec<String>) -> (Self, u16) {
        let tls_port = std::cell::Cell::new(0);
        let redis = Self::on_some_free_port(|port| {
            tls_port.set(free_port());
            let args = args(tls_port.get());
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            Self::try_start(port, &args)
        })
        .unwrap_or_else(|e| panic!("redis-server with a TLS port: {e}"));
        (redis, tls_port.get())
    }

    /// A Sentinel (`redis-server FILE --sentinel`) on a free port, with
    /// `conf` as its configuration file (written to `dir`, as Sentinel
    /// rewrites it).
    pub fn sentinel(dir: &std::path::Path, conf: &str) -> Self {
        Self::sentinel_with_tls_port(dir, |_| conf.to_owned()).0
    }

    /// [`RedisServer::sentinel`] whose configuration `conf(tls_port)`
    /// names a second free port (`tls-port`), picked again with the first
    /// if either was taken. Answers the sentinel and its second port.
    pub fn sentinel_with_tls_port(dir: &std::path::Path, conf: impl Fn(u16) -> String) -> (Self, u16) {
        let tls_port = std::cell::Cell::new(0);
        let sentinel = Self::on_some_free_port(|port| {
            tls_port.set(free_port());
            let file = dir.join(format!("sentinel-{port}.conf"));
            std::fs::write(
                &file,
                // Its log beside it (`sentinel-PORT.log`), for a failed
                // test to show what the sentinels did.
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {0}\nlogfile {0}/sentinel-{port}.log\n{1}",
                    dir.display(),
                    conf(tls_port.get())
                ),
            )?;
            Self::spawn_and_ping(
                port,
                std::process::Command::new("redis-server")
                    .arg(&file)
                    .arg("--sentinel"),
            )
        })
        .unwrap_or_else(|e| panic!("redis-server --sentinel: {e}"));
        (sentinel, tls_port.get())
    }

    /// A Redis Cluster node (`--cluster-enabled yes`) keeping its
    /// `nodes.conf` in `dir`, on a port below 45,000 whose bus port (the
    /// port + 10,000) is free too; both are picked again if either was
    /// taken before redis-server bound it.
    pub fn start_cluster_node(dir: &std::path::Path, extra: &[&str]) -> Self {
        let mut last = None;
        for _ in 0..5 {
            let port = loop {
                let p = free_port();
                if p < 45_000 && !ports_in_use().contains(&(p + 10_000)) {
                    break p;
                }
            };
            match Self::try_start_cluster_node(dir, port, extra) {
                Ok(r) => return r,
                Err(e) => last = Some(e),
            }
        }
        panic!("a Redis Cluster node did not start: {:?}", last.expect("tried"));
    }

    /// A Redis Cluster node on `port` (again, after it was stopped: it
    /// rejoins with the `nodes.conf` it kept in `dir`).
    pub fn try_start_cluster_node(dir: &std::path::Path, port: u16, extra: &[&str]) -> io::Result<Self> {
        let conf = format!("nodes-{port}.conf");
        let dir = dir.display().to_string();
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            &conf,
            "--cluster-node-timeout",
            "1500",
            "--dir",
            &dir,
        ];
        args.extend_from_slice(extra);
        Self::try_start(port, &args)
    }

    fn try_start_on(port: u16) -> io::Result<Self> {
        Self::try_start(port, &[])
    }

    fn try_start(port: u16, args: &[&str]) -> io::Result<Self> {
        let port_arg = port.to_string();
        let mut cmd = std::process::Command::new("redis-server");
        cmd.args(["--port", &port_arg, "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(args);
        Self::spawn_and_ping(port, &mut cmd)
    }

    fn spawn_and_ping(port: u16, cmd: &mut std::process::Command) -> io::Result<Self> {
        let child = cmd
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
        let child = match child {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::NotFound => panic!(
                "redis-server is not installed; the cluster tests need a real one: \
                 apt-get install -y redis-server"
            ),
            Err(e) => panic!("cannot start redis-server: {e}"),
        };
        let mut redis = RedisServer {
            port,
            child: Some(child),
        };
        let pid = redis.pid().expect("just spawned");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            // Ours, not another test's Redis that took the port first (it
            // would answer a PING just as well). Redis binds every port it
            // was given before it answers anything.
            let info = redis_command(port, &["INFO", "server"])
                .ok()
                .and_then(|r| r.text());
            if info.is_some_and(|t| t.lines().any(|l| l.trim_end() == format!("process_id:{pid}"))) {
                return Ok(redis);
            }
            let child = redis.child.as_mut().unwrap();
            if let Some(status) = child.try_wait()? {
                redis.child = None;
                return Err(io::Error::other(format!(
                    "redis-server exited with {status} (port {port} taken?)"
                )));
            }
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("redis-server on port {port} did not answer INFO as pid {pid} within 5 s"),
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `redis://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The process id of the redis-server this started.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Sends one command and returns its reply; panics if Redis cannot be reached.
    pub fn command(&self, args: &[&str]) -> Resp {
        redis_command(self.port, args).unwrap_or_else(|e| panic!("redis {args:?}: {e}"))
    }

    /// `PUBSUB NUMSUB channel`: how many connections subscribe to it.
    pub fn numsub(&self, channel: &str) -> i64 {
        let r = self.command(&["PUBSUB", "NUMSUB", channel]);
        r.items()
            .get(1)
            .and_then(Resp::int)
            .unwrap_or_else(|| panic!("PUBSUB NUMSUB {channel}: {r:?}"))
    }

    /// Polls `PUBSUB NUMSUB channel` until it is `n` or `within` passes;
    /// returns the last count.
    pub fn wait_numsub(&self, channel: &str, n: i64, within: Duration) -> i64 {
        let deadline = Instant::now() + within;
        loop {
            let got = self.numsub(channel);
            if got == n || Instant::now() > deadline {
                return got;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A `MONITOR` connection: every command Redis runs from now on, one
    /// line each, collected by a reader thread.
    pub fn monitor(&self) -> RedisMonitor {
        let s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        let mut r = BufReader::new(s);
        write_resp_command(r.get_mut(), &["MONITOR"]).unwrap();
        let mut first = String::new();
        r.read_line(&mut first).unwrap();
        assert_eq!(first, "+OK\r\n", "MONITOR");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = std::sync::Arc::clone(&lines);
        let shutdown = r.get_ref().try_clone().unwrap();
        std::thread::spawn(move || {
            for line in r.lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        RedisMonitor { lines, shutdown }
    }

    /// SIGKILL to the redis-server this started, and reap it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The lines a `MONITOR` connection has seen (`+<time> [0 addr] "CMD" "arg"`).
pub struct RedisMonitor {
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    shutdown: TcpStream,
}

impl RedisMonitor {
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}

impl Drop for RedisMonitor {
    fn drop(&mut self) {
        let _ = self.shutdown.shutdown(std::net::Shutdown::Both);
    }
}

/// Files of a test certificate authority and a server certificate it
/// signed, made with the `openssl` command line (see [`make_certificates`]).
pub struct Certificates {
    /// The authority's certificate (PEM): what a client trusts.
    pub ca: std::path::PathBuf,
    /// The server's certificate (PEM), for `127.0.0.1` and `localhost`.
    pub cert: std::path::PathBuf,
    /// The server's private key (PEM).
    pub key: std::path::PathBuf,
}

/// Makes, in `dir`, a certificate authority named `name` and a server
/// certificate it signed for `IP:127.0.0.1` and `DNS:localhost` (P-256
/// keys, valid two days). Two calls with different names make authorities
/// that do not trust each other's certificates.
pub fn make_certificates(dir: &std::path::Path, name: &str) -> Certificates {
    let file = |ext: &str| dir.join(format!("{name}{ext}"));
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap_or_else(|e| panic!("openssl (apt-get install -y openssl): {e}"));
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let path = |p: &std::path::Path| p.display().to_string();
    let (ca_key, ca, key, csr, cert, ext) = (
        file("-ca.key"),
        file("-ca.pem"),
        file(".key"),
        file(".csr"),
        file(".crt"),
        file(".ext"),
    );
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let subject = format!("/CN={name} test authority");
    let mut args = vec!["req", "-x509", "-days", "2", "-subj", &subject];
    args.extend(ec);
    let (ca_key_s, ca_s) = (path(&ca_key), path(&ca));
    args.extend([
        "-keyout",
        &ca_key_s,
        "-out",
        &ca_s,
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    openssl(&args);
    let (key_s, csr_s, cert_s, ext_s) = (path(&key), path(&csr), path(&cert), path(&ext));
    let mut args = vec!["req", "-subj", "/CN=127.0.0.1", "-keyout", &key_s, "-out", &csr_s];
    args.extend(ec);
    openssl(&args);
    std::fs::write(
        &ext,
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
         keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        &csr_s,
        "-CA",
        &ca_s,
        "-CAkey",
        &ca_key_s,
        "-CAcreateserial",
        "-days",
        "2",
        "-out",
        &cert_s,
        "-extfile",
        &ext_s,
    ]);
    Certificates { ca, cert, key }
}

/// A certificate for `127.0.0.1` and `localhost` signed by `certs`' own
/// authority (same key as `certs.key`) that expired in 2020: `openssl ca`
/// with fixed dates. Answers the certificate's path.
pub fn make_expired_certificate(
    dir: &std::path::Path,
    name: &str,
    certs: &Certificates,
) -> std::path::PathBuf {
    let file = |ext: &str| dir.join(format!("{name}{ext}"));
    let (conf, csr, out) = (file("-expired.cnf"), file("-expired.csr"), file("-expired.crt"));
    std::fs::write(file("-index.txt"), "").unwrap();
    std::fs::write(file("-serial"), "01\n").unwrap();
    std::fs::write(
        &conf,
        format!(
            "[ca]\ndefault_ca = t\n[t]\ndatabase = {name}-index.txt\nnew_certs_dir = .\n\
             serial = {name}-serial\ndefault_md = sha256\npolicy = p\n[p]\ncommonName = supplied\n\
             [x]\nsubjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
             keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        ),
    )
    .unwrap();
    let ca_key = certs.ca.with_file_name(
        certs
            .ca
            .file_name()
            .unwrap()
            .to_string_lossy()
            .replace("-ca.pem", "-ca.key"),
    );
    let path = |p: &std::path::Path| p.display().to_string();
    for args in [
        vec![
            "req".to_owned(),
            "-new".into(),
            "-subj".into(),
            "/CN=127.0.0.1".into(),
            "-key".into(),
            path(&certs.key),
            "-out".into(),
            path(&csr),
        ],
        vec![
            "ca".to_owned(),
            "-batch".into(),
            "-notext".into(),
            "-config".into(),
            path(&conf),
            "-extensions".into(),
            "x".into(),
            "-cert".into(),
            path(&certs.ca),
            "-keyfile".into(),
            path(&ca_key),
            "-startdate".into(),
            "20200101000000Z".into(),
            "-enddate".into(),
            "20200102000000Z".into(),
            "-in".into(),
            path(&csr),
            "-out".into(),
            path(&out),
        ],
    ] {
        let o = std::process::Command::new("openssl")
            .args(&args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    out
}

/// The base64 SHA-256 of a certificate's public key: what Chromium's
/// `--ignore-certificate-errors-spki-list` trusts.
pub fn spki_hash(cert: &std::path::Path) -> String {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl x509 -in '{}' -pubkey -noout | openssl pkey -pubin -outform der | \
             openssl dgst -sha256 -binary | base64",
            cert.display()
        ))
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}
