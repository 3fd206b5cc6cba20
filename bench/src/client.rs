//! A tiny blocking HTTP/1.1 client for the harness's own few requests
//! (readiness, `/stats`, `/dispatcher`, the broadcast POST): one connection
//! per request, `connection: close`, short timeouts.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::Context as _;
use serde_json::Value;

/// Connect, write and read timeout of every request.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Largest answer read (the harness only reads small documents).
const MAX_REPLY: u64 = 1 << 20;

/// An answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reply {
    /// Status code.
    pub status: u16,
    /// Body as text (lossy), cut to `content-length` when there is one.
    pub body: String,
}

/// Sends one request and reads the whole answer.
pub(crate) fn request(addr: SocketAddr, method: &str, path: &str, body: &str) -> io::Result<Reply> {
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT)?;
    s.set_read_timeout(Some(TIMEOUT))?;
    s.set_write_timeout(Some(TIMEOUT))?;
    s.set_nodelay(true)?;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-type: text/plain\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes())?;
    let mut buf = Vec::new();
    s.take(MAX_REPLY).read_to_end(&mut buf)?;
    parse_reply(&buf).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not an HTTP response"))
}

/// One keep-alive connection for many POSTs (reconnecting when it breaks):
/// a load loop that opened a connection per request would fill the
/// ephemeral port range with TIME_WAIT sockets.
pub(crate) struct KeepAlive {
    addr: SocketAddr,
    conn: Option<TcpStream>,
}

impl KeepAlive {
    /// Nothing is connected until the first request.
    pub(crate) fn new(addr: SocketAddr) -> Self {
        KeepAlive { addr, conn: None }
    }

    /// POSTs `body` to `path`; answers the status.
    pub(crate) fn post(&mut self, path: &str, body: &str) -> io::Result<u16> {
        let result = self.try_post(path, body);
        if result.is_err() {
            self.conn = None;
        }
        result
    }

    fn try_post(&mut self, path: &str, body: &str) -> io::Result<u16> {
        let conn = match &mut self.conn {
            Some(c) => c,
            slot => {
                let c = TcpStream::connect_timeout(&self.addr, TIMEOUT)?;
                c.set_read_timeout(Some(TIMEOUT))?;
                c.set_nodelay(true)?;
                slot.insert(c)
            }
        };
        let req = format!(
            "POST {path} HTTP/1.1\r\nhost: {}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        conn.write_all(req.as_bytes())?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let n = conn.read(&mut chunk)?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            buf.extend_from_slice(&chunk[..n]);
            if let Some((status, complete)) = answer_status(&buf) {
                if complete {
                    return Ok(status);
                }
            } else if buf.len() as u64 > MAX_REPLY {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "not an HTTP response"));
            }
        }
    }
}

/// The status of a response at the start of `buf` and whether its
/// `content-length` body is all there.
fn answer_status(buf: &[u8]) -> Option<(u16, bool)> {
    let (status, body_start, length) = head(buf)?;
    Some((status, buf.len() >= body_start + length.unwrap_or(0)))
}

/// The status and whole length of the complete response (with a
/// `content-length` body) at the start of `buf`, if it is all there: for
/// reading pipelined answers one after another.
pub(crate) fn next_reply(buf: &[u8]) -> Option<(u16, usize)> {
    let (status, body_start, length) = head(buf)?;
    let end = body_start + length.unwrap_or(0);
    (buf.len() >= end).then_some((status, end))
}

/// Status and body of a complete response (not chunked).
pub(crate) fn parse_reply(buf: &[u8]) -> Option<Reply> {
    let (status, body_start, length) = head(buf)?;
    let body = &buf[body_start..];
    let body = &body[..length.unwrap_or(body.len()).min(body.len())];
    Some(Reply {
        status,
        body: String::from_utf8_lossy(body).into_owned(),
    })
}

/// A response head at the start of `buf`: status, where the body starts,
/// and its `content-length` if it has one.
fn head(buf: &[u8]) -> Option<(u16, usize, Option<usize>)> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&buf[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let length = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok());
    Some((status, end + 4, length))
}

/// GET `path` as JSON; fails on anything but 200.
pub(crate) fn get_json(addr: SocketAddr, path: &str) -> anyhow::Result<Value> {
    let r = request(addr, "GET", path, "").with_context(|| format!("GET {path}"))?;
    anyhow::ensure!(r.status == 200, "GET {path}: status {}", r.status);
    serde_json::from_str(&r.body).with_context(|| format!("GET {path}: not JSON"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies() {
        let r = parse_reply(b"HTTP/1.1 201 Created\r\nContent-Length: 5\r\n\r\nhello...").unwrap();
        assert_eq!((r.status, r.body.as_str()), (201, "hello"));
        let r = parse_reply(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n{\"a\":1}").unwrap();
        assert_eq!(r.body, "{\"a\":1}");
        assert_eq!(parse_reply(b"HTTP/1.1 200 OK\r\n"), None);
        assert_eq!(parse_reply(b"garbage\r\n\r\n"), None);
        assert_eq!(
            answer_status(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n1"),
            Some((200, false))
        );
        assert_eq!(
            answer_status(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n12"),
            Some((200, true))
        );
        assert_eq!(answer_status(b"HTTP/1.1 200 OK\r\n"), None);
    }
}
