//! Test helpers: a real server on a free port, and a small blocking HTTP/1.1
//! client over real sockets that can read chunked streams chunk by chunk.
#![allow(dead_code, missing_docs, unreachable_pub)]

use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;
use switchboard::{Server, Settings};

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
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<io::Result<()>>>,
}

impl TestServer {
    pub fn start(settings: Settings) -> Self {
        Self::start_on_ports(settings, 1)
    }

    /// A server listening on `ports` free ports at once.
    pub fn start_on_ports(settings: Settings, ports: usize) -> Self {
        let listeners = (0..ports)
            .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let server = Server::from_listeners(settings, listeners).unwrap();
        let addrs = server.local_addrs();
        let addr = addrs[0];
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            actix::System::new().block_on(server.run(async {
                let _ = rx.await;
            }))
        });
        let ts = TestServer {
            addr,
            addrs,
            stop: Some(tx),
            thread: Some(thread),
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
        request(self.addr, "GET", path, &[], b"")
    }

    pub fn get(&self, path: &str) -> Response {
        self.try_get(path).unwrap()
    }

    pub fn post(&self, path: &str, body: &str) -> Response {
        request(self.addr, "POST", path, &[], body.as_bytes()).unwrap()
    }

    pub fn stats(&self) -> Value {
        self.get("/stats").json()
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
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(READ_TIMEOUT))?;
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
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        s.write_all(request.as_bytes()).unwrap();
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
