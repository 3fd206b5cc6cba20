//! The client side of HTTP/1.1 for the load tools: finding the end of a
//! response head, and reading a `content-length` response. Written for the
//! tools alone (the server has its own request parsing), so one side's bug
//! cannot hide the other's.

/// Advances a matcher for the blank line that ends a head: `matched` is how
/// much of `"\r\n\r\n"` the bytes so far end with; 4 means the head is over.
pub(crate) fn head_end_step(matched: u8, b: u8) -> u8 {
    match (matched, b) {
        (0 | 2, b'\r') | (1 | 3, b'\n') => matched + 1,
        (_, b'\r') => 1,
        _ => 0,
    }
}

/// Largest response head a client here waits for before calling it garbage.
pub(crate) const MAX_RESPONSE_HEAD: usize = 64 * 1024;

/// A complete response at the start of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Response {
    /// Status code.
    pub status: u16,
    /// Where the body starts.
    pub body_start: usize,
    /// Bytes the whole response spans (head and body).
    pub len: usize,
    /// The server said `connection: close`.
    pub close: bool,
}

impl Response {
    /// The body within the buffer it was parsed from.
    pub(crate) fn body<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        &buf[self.body_start..self.len]
    }
}

/// A response these tools do not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not an HTTP/1.1 response with a content-length body")]
pub(crate) struct Unreadable;

/// Parses a response whose body has a `content-length` (or none, for 204 and
/// 304). `Ok(None)`: not complete yet. `Err(Unreadable)`: not something these tools
/// read (no length, chunked, a head over [`MAX_RESPONSE_HEAD`], garbage).
pub(crate) fn parse_response(buf: &[u8]) -> Result<Option<Response>, Unreadable> {
    let Some(head_end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if buf.len() > MAX_RESPONSE_HEAD {
            Err(Unreadable)
        } else {
            Ok(None)
        };
    };
    let head = std::str::from_utf8(&buf[..head_end]).map_err(|_| Unreadable)?;
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or(Unreadable)?;
    let mut length = None;
    let mut close = false;
    for line in lines {
        let (k, v) = line.split_once(':').ok_or(Unreadable)?;
        let (k, v) = (k.trim(), v.trim());
        if k.eq_ignore_ascii_case("content-length") {
            length = Some(v.parse::<usize>().map_err(|_| Unreadable)?);
        } else if k.eq_ignore_ascii_case("connection") && v.eq_ignore_ascii_case("close") {
            close = true;
        } else if k.eq_ignore_ascii_case("transfer-encoding") {
            return Err(Unreadable);
        }
    }
    let length = match (length, status) {
        (Some(n), _) => n,
        (None, 204 | 304) => 0,
        (None, _) => return Err(Unreadable),
    };
    let body_start = head_end + 4;
    let len = body_start + length;
    if buf.len() < len {
        return Ok(None);
    }
    Ok(Some(Response {
        status,
        body_start,
        len,
        close,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_end() {
        let mut m = 0;
        for (i, b) in b"GET / HTTP/1.1\r\nx: y\r\r\n\r\n".iter().enumerate() {
            m = head_end_step(m, *b);
            if m == 4 {
                assert_eq!(i, 24);
                return;
            }
        }
        panic!("end not found");
    }

    #[test]
    fn responses() {
        let r = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n12HTTP/1.1 503 X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        let first = parse_response(r).unwrap().unwrap();
        assert_eq!(
            (first.status, first.body(r), first.close),
            (200, &b"12"[..], false)
        );
        let second = parse_response(&r[first.len..]).unwrap().unwrap();
        assert_eq!((second.status, second.close), (503, true));
        assert_eq!(parse_response(&r[..first.len - 1]).unwrap(), None);
        assert!(parse_response(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n").is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\n\r\n").is_err());
        assert!(parse_response(&vec![b'x'; MAX_RESPONSE_HEAD + 1]).is_err());
    }
}
