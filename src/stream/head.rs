//! The response head a stream starts with: the one place that decides it,
//! for every transport and framing (HTTP/1.1 chunked, HTTP/1.0
//! close-delimited, SSE, WebSocket). The lean path writes it as bytes
//! ([`Head::write`]); the fallback path gives actix-web the same fields
//! ([`Head::fields`]) and framing ([`Head::framing`]), and actix-web writes
//! the status line.

use std::io::Write as _;

use super::Open;
use super::sink::Framing;
use crate::conn::handshake::Transport;
use crate::error::Cors;

/// What a stream's response head says.
pub(crate) struct Head<'a> {
    transport: Transport,
    /// The client spoke HTTP/1.0: no chunked encoding.
    http10: bool,
    /// WebSocket: the `Sec-WebSocket-Accept` value.
    ws_accept: Option<&'a str>,
    /// The page's CORS headers.
    cors: Cors<'a>,
}

impl<'a> Head<'a> {
    /// The head of an admitted stream.
    pub(crate) fn of(open: &'a Open) -> Self {
        let req = &open.req;
        Head {
            transport: req.transport,
            http10: req.http10,
            ws_accept: req.ws_accept.as_deref(),
            cors: open.cors.as_cors(),
        }
    }

    /// How the body is delimited: chunks on HTTP/1.1; the end of the
    /// connection on HTTP/1.0 (it has no chunked encoding, RFC 9112 §6.1)
    /// and for a WebSocket (frames delimit themselves).
    pub(crate) fn framing(&self) -> Framing {
        if self.http10 || self.transport == Transport::Ws {
            Framing::Close
        } else {
            Framing::Chunked
        }
    }

    /// The header fields of a `200` stream head besides its framing and
    /// CORS (which the fallback path's middleware adds). `no-store`, not
    /// `no-cache`: with `no-cache` Chromium writes a stream's body into its
    /// HTTP cache, and the next request for the URL then meets that entry
    /// and is sent twice when it is answered `401` (seen in its net log).
    pub(crate) fn fields(&self) -> [(&'static str, &'static str); 3] {
        let content_type = match self.transport {
            Transport::Sse => "text/event-stream",
            Transport::Poll => "application/json",
            Transport::Plain | Transport::Ws => "text/plain; charset=utf-8",
        };
        [
            ("content-type", content_type),
            ("cache-control", "no-store"),
            ("x-accel-buffering", "no"),
        ]
    }

    /// Writes the whole head into `out` (the lean path).
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        // unwrap (each write!): writing into a Vec cannot fail.
        if let Some(accept) = self.ws_accept {
            write!(
                out,
                "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: {accept}\r\n\r\n"
            )
            .expect("format into Vec");
            return;
        }
        out.extend_from_slice(if self.http10 {
            b"HTTP/1.0 200 OK\r\n"
        } else {
            b"HTTP/1.1 200 OK\r\n"
        });
        let [(_, content_type), rest @ ..] = self.fields();
        write!(out, "content-type: {content_type}\r\n").expect("format into Vec");
        if self.framing() == Framing::Chunked {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n");
        }
        for (name, value) in rest {
            write!(out, "{name}: {value}\r\n").expect("format into Vec");
        }
        self.cors.write(out);
        // A long-poll's lean connection ends with its answer: the lean
        // path serves one request per connection (a client's next poll on
        // a kept-alive connection would reach actix-web, which serves it
        // too, but a client must not be left guessing).
        if self.framing() == Framing::Close || self.transport == Transport::Poll {
            out.extend_from_slice(b"connection: close\r\n");
        }
        out.extend_from_slice(b"\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conn::handshake::{origin, read_request};

    /// The head of `request`, with its origin allowed when `cors`.
    fn head_of(request: &str, cors: bool) -> (String, Framing) {
        let allow = cors.then(|| origin(request.as_bytes()).unwrap()).flatten();
        let open = Open {
            req: read_request(request.as_bytes()).unwrap(),
            cors: Cors { allow, vary: cors }.into(),
            early: Vec::new(),
            expires: None,
            counted: None,
            member: None,
        };
        let head = Head::of(&open);
        let mut out = Vec::new();
        head.write(&mut out);
        (String::from_utf8(out).unwrap(), head.framing())
    }

    #[test]
    fn each_transport_and_framing() {
        let (chunked, f) = head_of("GET /test/a HTTP/1.1\r\nHost: h\r\n\r\n", false);
        assert_eq!(f, Framing::Chunked);
        assert_eq!(
            chunked,
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain; charset=utf-8\r\ntransfer-encoding: chunked\r\n\
             cache-control: no-store\r\nx-accel-buffering: no\r\n\r\n"
        );
        let (close, f) = head_of("GET /test/a HTTP/1.0\r\n\r\n", false);
        assert_eq!(f, Framing::Close);
        assert_eq!(
            close,
            "HTTP/1.0 200 OK\r\ncontent-type: text/plain; charset=utf-8\r\n\
             cache-control: no-store\r\nx-accel-buffering: no\r\nconnection: close\r\n\r\n"
        );
        let (sse, _) = head_of(
            "GET /test/a HTTP/1.1\r\nHost: h\r\nAccept: text/event-stream\r\nOrigin: http://p\r\n\r\n",
            true,
        );
        assert!(sse.starts_with(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
        ));
        assert!(sse.ends_with(
            "access-control-allow-origin: http://p\r\nvary: Origin\r\naccess-control-expose-headers: Retry-After, WWW-Authenticate\r\n\r\n"
        ));
        let (ws, f) = head_of(
            "GET /test/a HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
            false,
        );
        assert_eq!(f, Framing::Close);
        assert_eq!(
            ws,
            "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\n\
             sec-websocket-accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n"
        );
    }
}
