//! What a stream request asks for beyond its id, read from its head once
//! the head has passed [`crate::conn::classify::HeadCheck`]: the transport
//! (chunked text, SSE, WebSocket), where to resume, a subscriber token
//! ([`read_request`]), and the page origin for CORS ([`origin`], read
//! once by the admission, which decides CORS with it). (The response head
//! each transport starts with is written by `crate::stream`.)
//!
//! The WebSocket handshake is checked by tungstenite's own server side
//! (`create_response`: method, version, `Upgrade`, `Connection`,
//! `Sec-WebSocket-Version: 13`, a valid key), so the rules are RFC 6455's as
//! a maintained implementation reads them.

use tungstenite::error::ProtocolError;
use tungstenite::http;

use crate::error::ApiError;
use crate::token::bearer_credentials;

/// How a stream's events are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    /// One line per event, in a chunked body (close-delimited on HTTP/1.0).
    Plain,
    /// Server-sent events (`Accept: text/event-stream`).
    Sse,
    /// One WebSocket text frame per event.
    Ws,
    /// Long-poll (`?transport=poll`): one JSON answer with the messages
    /// after `since`, at once or when the next arrives, or an empty list
    /// after `stream.poll_timeout_ms`; then the response ends.
    Poll,
}

/// A stream request's options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StreamRequest {
    /// The transport asked for.
    pub(crate) transport: Transport,
    /// The request line says HTTP/1.0: the body is close-delimited.
    pub(crate) http10: bool,
    /// `?ids=1`: plain lines and WebSocket frames start with the event id.
    pub(crate) ids: bool,
    /// Resume after this event id (`Last-Event-ID`, else `?since=`).
    pub(crate) since: Option<u64>,
    /// A subscriber token (`Authorization: Bearer`, else `?token=`).
    pub(crate) token: Option<String>,
    /// WebSocket: the `Sec-WebSocket-Accept` value to answer with.
    pub(crate) ws_accept: Option<String>,
    /// Long-poll: `?wait=<ms>`, the longest this poll waits for a message
    /// (at most `stream.poll_timeout_ms`; 0: it answers at once).
    pub(crate) wait_ms: Option<u64>,
}

/// Reads a validated stream request head (request line to blank line);
/// its `Origin` is [`origin`]'s.
pub(crate) fn read_request(head: &[u8]) -> Result<StreamRequest, ApiError> {
    let text = String::from_utf8_lossy(head);
    let mut lines = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (method, target, version) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let mut poll = false;
    let mut req = StreamRequest {
        transport: Transport::Plain,
        http10: version == "HTTP/1.0",
        ids: false,
        since: None,
        token: None,
        ws_accept: None,
        wait_ms: None,
    };
    if let Some((_, query)) = target.split_once('?') {
        for pair in query.split('&') {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "since" => {
                    let value = percent_decoded(value).ok_or(ApiError::BadEventId("since"))?;
                    req.since = Some(event_id(&value, "since")?);
                }
                "token" if !value.is_empty() => give_token(&mut req.token, value)?,
                "ids" => req.ids = matches!(value, "" | "1" | "true" | "yes"),
                "transport" => poll = transport(value)?,
                "wait" => {
                    req.wait_ms = Some(event_id(value.as_bytes(), "wait").map_err(|_| ApiError::BadWait)?)
                }
                _ => {}
            }
        }
    }
    let mut authorization = None;
    let mut upgrade = false;
    for line in lines.clone().take_while(|l| !l.is_empty()) {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim_matches([' ', '\t']);
        let is = |n: &str| name.eq_ignore_ascii_case(n);
        if is("accept") && value.split(',').any(|t| media_type(t) == "text/event-stream") {
            req.transport = Transport::Sse;
        } else if is("last-event-id") && !value.is_empty() {
            req.since = Some(event_id(value.as_bytes(), "Last-Event-ID")?);
        } else if is("authorization") {
            if authorization.is_some() {
                return Err(ApiError::RepeatedAuthorization);
            }
            authorization = Some(value);
        } else if is("upgrade")
            && value
                .split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("websocket"))
        {
            upgrade = true;
        }
    }
    if let Some(value) = authorization {
        let token = bearer_credentials(value.as_bytes())
            .ok_or_else(|| ApiError::BadToken("Authorization is not \"Bearer <token>\"".to_owned()))?;
        give_token(&mut req.token, &String::from_utf8_lossy(token))?;
    }
    if !poll && req.wait_ms.is_some() {
        return Err(ApiError::BadWait);
    }
    if poll {
        if upgrade {
            return Err(ApiError::PollUpgrade);
        }
        req.transport = Transport::Poll;
        return Ok(req);
    }
    if upgrade {
        // Only an upgrade needs the headers gathered (for tungstenite).
        let headers: Vec<(&str, &str)> = lines
            .take_while(|l| !l.is_empty())
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n, v.trim_matches([' ', '\t'])))
            .collect();
        req.transport = Transport::Ws;
        req.ws_accept = Some(websocket_accept(method, target, version, &headers)?);
    }
    Ok(req)
}

/// Takes `token` as the request's subscriber token: one token, however
/// often it is given; two different ones are refused rather than one of
/// them chosen.
fn give_token(slot: &mut Option<String>, token: &str) -> Result<(), ApiError> {
    match slot {
        Some(t) if t != token => Err(ApiError::ConflictingTokens),
        Some(_) => Ok(()),
        None => {
            *slot = Some(token.to_owned());
            Ok(())
        }
    }
}

/// The value of the head's `Origin` header, if it has one; more than one
/// is refused, since which page asked is then unknown.
pub(crate) fn origin(head: &[u8]) -> Result<Option<&str>, ApiError> {
    let text = std::str::from_utf8(head).unwrap_or_default();
    let mut found = None;
    for line in text
        .split('\n')
        .skip(1)
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
    {
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("origin")
        {
            if found.is_some() {
                return Err(ApiError::RepeatedOrigin);
            }
            found = Some(value.trim_matches([' ', '\t']));
        }
    }
    Ok(found)
}

/// `?transport=`: `poll` asks for long-poll; `stream` (or nothing) for
/// the transport the head asks for (chunked, SSE or WebSocket). Anything
/// else is refused rather than served as something the client did not
/// ask for.
fn transport(value: &str) -> Result<bool, ApiError> {
    match value {
        "poll" => Ok(true),
        "" | "stream" => Ok(false),
        _ => Err(ApiError::BadTransport),
    }
}

/// A media type without its parameters, lower case.
fn media_type(t: &str) -> String {
    t.split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// An event id: exactly a decimal number (ASCII digits, nothing else: no
/// sign, no space, as `str::parse` would take a `+`) that fits in 64 bits.
fn event_id(value: &[u8], field: &'static str) -> Result<u64, ApiError> {
    let number = (!value.is_empty()).then_some(value).and_then(|v| {
        v.iter().try_fold(0u64, |n, &b| {
            let digit = char::from(b).to_digit(10)?;
            n.checked_mul(10)?.checked_add(u64::from(digit))
        })
    });
    number.ok_or(ApiError::BadEventId(field))
}

/// A query value with its percent-escapes decoded, as the path's are
/// (`+` stays `+`); `None` for a broken escape.
fn percent_decoded(value: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(value.len());
    let mut bytes = value.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex = |b: Option<u8>| char::from(b?).to_digit(16);
            out.push(u8::try_from(hex(bytes.next())? << 4 | hex(bytes.next())?).ok()?);
        } else {
            out.push(b);
        }
    }
    Some(out)
}

/// Checks the upgrade with tungstenite's server handshake and returns the
/// accept key.
fn websocket_accept(
    method: &str,
    target: &str,
    version: &str,
    headers: &[(&str, &str)],
) -> Result<String, ApiError> {
    let mut builder = http::Request::builder()
        .method(method)
        .uri(target)
        .version(match version {
            "HTTP/1.0" => http::Version::HTTP_10,
            _ => http::Version::HTTP_11,
        });
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let request = builder
        .body(())
        .map_err(|e| ApiError::BadWebSocket(format!("unreadable request: {e}")))?;
    match tungstenite::handshake::server::create_response(&request) {
        Ok(response) => Ok(response
            .headers()
            .get("Sec-WebSocket-Accept")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()),
        Err(tungstenite::Error::Protocol(ProtocolError::MissingSecWebSocketVersionHeader)) => {
            Err(ApiError::WebSocketVersion)
        }
        Err(e) => Err(ApiError::BadWebSocket(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(head: &str) -> Result<StreamRequest, ApiError> {
        read_request(head.as_bytes())
    }

    #[test]
    fn plain_sse_and_resume() {
        let r = p("GET /test/foo HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
        assert_eq!((r.transport, r.since, r.ids), (Transport::Plain, None, false));
        let r = p("GET /test/foo?since=17&ids=1 HTTP/1.1\r\nHost: a\r\nAccept: text/html, Text/Event-Stream;q=1\r\n\r\n")
            .unwrap();
        assert_eq!((r.transport, r.since, r.ids), (Transport::Sse, Some(17), true));
        // Last-Event-ID is newer than the URL's since (EventSource keeps its URL).
        let r = p("GET /test/foo?since=17 HTTP/1.1\r\nHost: a\r\nLast-Event-ID: 20\r\n\r\n").unwrap();
        assert_eq!(r.since, Some(20));
        assert_eq!(
            p("GET /test/foo?since=x HTTP/1.1\r\nHost: a\r\n\r\n"),
            Err(ApiError::BadEventId("since"))
        );
        assert_eq!(
            p("GET /test/foo HTTP/1.1\r\nHost: a\r\nLast-Event-ID: -1\r\n\r\n"),
            Err(ApiError::BadEventId("Last-Event-ID"))
        );
    }

    #[test]
    fn event_ids_are_exactly_decimal_numbers() {
        assert_eq!(event_id(b"0", "since"), Ok(0));
        assert_eq!(event_id(b"007", "since"), Ok(7));
        assert_eq!(event_id(b"18446744073709551615", "since"), Ok(u64::MAX));
        for bad in [
            &b""[..],
            b"+5",
            b"-1",
            b" 5",
            b"5 ",
            b"1e3",
            b"18446744073709551616",
            "\u{663}".as_bytes(),
        ] {
            assert_eq!(
                event_id(bad, "since"),
                Err(ApiError::BadEventId("since")),
                "{bad:?}"
            );
        }
        assert_eq!(percent_decoded("%31%32"), Some(b"12".to_vec()));
        assert_eq!(percent_decoded("+%2b%2B"), Some(b"+++".to_vec()));
        assert_eq!(percent_decoded("%3"), None);
        assert_eq!(percent_decoded("%g1"), None);
        let r = p("GET /test/foo?since=%31%32 HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
        assert_eq!(r.since, Some(12));
    }

    #[test]
    fn tokens() {
        let r = p("GET /test/foo?token=abc HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
        assert_eq!(r.token.as_deref(), Some("abc"));
        // The same token twice is one token; two different ones are refused.
        let r =
            p("GET /test/foo?token=xyz HTTP/1.1\r\nHost: a\r\nAuthorization: bearer xyz\r\n\r\n").unwrap();
        assert_eq!(r.token.as_deref(), Some("xyz"));
        let r = p("GET /test/foo?token=abc&token=abc HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
        assert_eq!(r.token.as_deref(), Some("abc"));
        assert_eq!(
            p("GET /test/foo?token=abc HTTP/1.1\r\nHost: a\r\nAuthorization: bearer xyz\r\n\r\n"),
            Err(ApiError::ConflictingTokens)
        );
        assert_eq!(
            p("GET /test/foo?token=abc&token=xyz HTTP/1.1\r\nHost: a\r\n\r\n"),
            Err(ApiError::ConflictingTokens)
        );
        assert!(matches!(
            p("GET /test/foo HTTP/1.1\r\nHost: a\r\nAuthorization: Basic xyz\r\n\r\n"),
            Err(ApiError::BadToken(_))
        ));
        assert_eq!(
            p(
                "GET /test/foo HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer a\r\nAuthorization: Bearer b\r\n\r\n"
            ),
            Err(ApiError::RepeatedAuthorization)
        );
    }

    #[test]
    fn one_origin_at_most() {
        let head = b"GET /test/foo HTTP/1.1\r\nHost: a\r\nOrigin:  http://a.example\r\n\r\n";
        assert_eq!(origin(head), Ok(Some("http://a.example")));
        assert_eq!(origin(b"GET /test/foo HTTP/1.1\r\nHost: a\r\n\r\n"), Ok(None));
        assert_eq!(
            origin(b"GET /test/foo HTTP/1.1\r\nHost: a\r\nOrigin: http://evil\r\norigin: http://a.example\r\n\r\n"),
            Err(ApiError::RepeatedOrigin)
        );
    }

    #[test]
    fn websocket_handshakes() {
        let ok = "GET /test/foo HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: keep-alive, Upgrade\r\n\
                  Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
        let r = p(ok).unwrap();
        assert_eq!(r.transport, Transport::Ws);
        // RFC 6455 §1.3's example.
        assert_eq!(r.ws_accept.as_deref(), Some("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="));
        assert_eq!(
            p(&ok.replace("Version: 13", "Version: 8")),
            Err(ApiError::WebSocketVersion)
        );
        assert!(matches!(
            p(&ok.replace("Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", "")),
            Err(ApiError::BadWebSocket(_))
        ));
        assert!(matches!(
            p(&ok.replace("Connection: keep-alive, Upgrade", "Connection: keep-alive")),
            Err(ApiError::BadWebSocket(_))
        ));
    }
}
