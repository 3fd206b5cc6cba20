//! The one error vocabulary of the server: every refusal, whether actix-web
//! answers it ([`ResponseError`]) or a lean path writes it straight to the
//! socket ([`ApiError::write_http1`]), has the same status, headers and
//! `{"error": "..."}` body.

use std::io::Write as _;

use actix_web::http::{StatusCode, header};
use actix_web::{HttpResponse, ResponseError};
use serde_json::json;

use crate::id::IdError;

/// Why a request failed; each maps to a status and a JSON `{"error": ...}`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ApiError {
    /// Bad stream id: 400.
    #[error(transparent)]
    BadId(#[from] IdError),
    /// Empty message: 400.
    #[error("message body is empty")]
    EmptyMessage,
    /// Over `message.max_bytes`: 413.
    #[error("message body is larger than {limit} bytes")]
    TooLarge {
        /// The configured limit.
        limit: usize,
    },
    /// Not UTF-8: 400.
    #[error("message body is not valid UTF-8")]
    NotUtf8,
    /// CR or LF inside: 400 (one event is one line).
    #[error("message body contains CR or LF; a message is one line")]
    LineBreak,
    /// The body could not be read: 400.
    #[error("message body could not be read: {0}")]
    Payload(String),
    /// Missing or wrong bearer token: 401.
    #[error("missing or wrong bearer token")]
    Unauthorized,
    /// A stream without a valid subscriber token (`auth.subscribe_secret`
    /// or `auth.subscribe_public_key_file` set): 401, the reason given.
    #[error("subscriber token refused: {0}")]
    BadToken(String),
    /// A page origin `http.cors_origins` does not list opened a WebSocket: 403.
    #[error("origin not allowed (http.cors_origins)")]
    OriginNotAllowed,
    /// Protected mode: no `auth.publish_token`, a listener beyond loopback,
    /// and a publish (or presence) request from a client that is not
    /// loopback: 403, naming the two ways out.
    #[error(
        "protected mode: publishing is open only to loopback clients because auth.publish_token \
         is empty and the server listens beyond loopback; set auth.publish_token (and send \
         Authorization: Bearer <token>), or set auth.publish_open = true to accept the risk \
         (docs/exposing.md)"
    )]
    PublishProtected,
    /// An operator page on a public listener without `server.admin_public`
    /// or the `auth.admin_token` bearer: 403, saying where it is served.
    #[error(
        "operator pages (/metrics, /stats, /cluster, the dashboard, /admin/*) are served on the \
         internal listener (server.admin_host, server.admin_port); on this port only with \
         server.admin_public = true or Authorization: Bearer <auth.admin_token> (docs/exposing.md)"
    )]
    OperatorPageElsewhere,
    /// A WebSocket upgrade that breaks RFC 6455: 400.
    #[error("WebSocket handshake refused: {0}")]
    BadWebSocket(String),
    /// A WebSocket upgrade without `Sec-WebSocket-Version: 13`: 426.
    #[error("WebSocket version not supported; use 13")]
    WebSocketVersion,
    /// `?since=` or `Last-Event-ID` is not an event id: 400.
    #[error("{0} must be an event id (a decimal number)")]
    BadEventId(&'static str),
    /// `?transport=` other than `poll` or `stream`: 400.
    #[error(
        "transport must be \"poll\" (long-poll) or \"stream\" (the head decides: chunked, SSE or WebSocket)"
    )]
    BadTransport,
    /// `?wait=` that is not a number of milliseconds, or not on a poll: 400.
    #[error("wait must be a number of milliseconds, on a long-poll (?transport=poll)")]
    BadWait,
    /// `?transport=poll` on a WebSocket upgrade: 400.
    #[error("a long-poll (?transport=poll) is a plain GET, not a WebSocket upgrade")]
    PollUpgrade,
    /// No such route: 404.
    #[error("not found")]
    NotFound,
    /// Route exists, method does not: 405.
    #[error("method not allowed; use {0}")]
    MethodNotAllowed(&'static str),
    /// A request head that breaks RFC 9112 (or asks a stream for a body): 400.
    #[error("invalid request head: {0}")]
    BadHead(&'static str),
    /// The request body did not arrive within `server.body_timeout_ms`: 408,
    /// and the connection is closed.
    #[error("request body not received within {ms} ms")]
    BodyTimeout {
        /// The configured timeout.
        ms: u64,
    },
    /// More than one `Authorization` header: 400.
    #[error("more than one Authorization header")]
    RepeatedAuthorization,
    /// Two different subscriber tokens in one request (`Authorization` and
    /// `?token=`, or `?token=` twice): 400.
    #[error("two different subscriber tokens given (Authorization and ?token=, or ?token= twice); give one")]
    ConflictingTokens,
    /// A malformed `Idempotency-Key`: 400.
    #[error("Idempotency-Key {0}")]
    BadIdempotencyKey(&'static str),
    /// An `Idempotency-Key` used before for another request: 422.
    #[error(
        "this Idempotency-Key was used for a different request (another id or message) within publish.idempotency_ttl_ms"
    )]
    IdempotencyKeyReused,
    /// A request with the same `Idempotency-Key` is being served: 409.
    #[error("a request with this Idempotency-Key is in progress; retry once it is answered")]
    IdempotencyInFlight,
    /// Too many `Idempotency-Key`s remembered: 503 with `Retry-After`.
    #[error("too many Idempotency-Keys remembered; nothing was delivered, retry later")]
    TooManyKeys,
    /// More than one `Origin` header: 400 (which page asked is unknown).
    #[error("more than one Origin header")]
    RepeatedOrigin,
    /// The request head did not arrive within `server.head_timeout_ms`: 408.
    #[error("request head not received within {ms} ms")]
    HeadTimeout {
        /// The configured timeout.
        ms: u64,
    },
    /// The request head is larger than `server.max_head_bytes`: 431.
    #[error("request head larger than {limit} bytes")]
    HeadTooLarge {
        /// The configured limit.
        limit: usize,
    },
    /// More header lines than a head may have: 431.
    #[error("request head has more than {limit} header lines")]
    TooManyHeaders {
        /// The limit.
        limit: u8,
    },
    /// The publish backlog stayed full for `publish.wait_ms`: 503 with
    /// `Retry-After`; nothing of the message was delivered or kept.
    #[error(
        "publish backlog full ({limit} deliveries waiting for their streams); nothing was delivered, retry later"
    )]
    Backlogged {
        /// `publish.max_backlog`.
        limit: u64,
    },
    /// An id of a namespace with `max_streams_per_id` has that many
    /// streams: 429 with `Retry-After`.
    #[error(
        "id {:?} has {} streams open, the most its namespace allows (namespaces.{}.max_streams_per_id); retry once one ends",
        .0.id, .0.max, .0.namespace
    )]
    IdFull(Box<IdFull>),
    /// `stream.max_streams` reached: 503.
    #[error("stream limit of {0} reached")]
    StreamLimit(usize),
    /// `server.proxy_protocol` is on and the connection did not start with
    /// a valid PROXY header: 400, closed.
    #[error("{0}")]
    BadProxyHeader(String),
    /// A client address over one of its `[limits]`: 429 with `Retry-After`.
    #[error("too many {what} from this address (the limit is {limit}); retry after {retry_after_s} s")]
    OverLimit {
        /// Which limit (`streams`, `stream_opens`, `publishes`).
        what: &'static str,
        /// The limit, in words.
        limit: String,
        /// Seconds until the address may try again.
        retry_after_s: u64,
    },
    /// A subscriber token names a `kid` none of the identity provider's
    /// keys held has, and they could not be fetched again in time
    /// (`auth.jwks_url` down or slow): 503 with `Retry-After`.
    #[error(
        "the identity provider's keys (auth.jwks_url) could not be fetched to check this token's kid ({0}); retry later"
    )]
    KeysUnavailable(String),
    /// The application's subscribe hook (`hooks.subscribe_url`) refused
    /// the stream: its 401 or 403, with its reason.
    #[error("the application refused this stream: {reason}")]
    HookRefused {
        /// 401 or 403, as the application answered.
        status: u16,
        /// The application's `reason`.
        reason: String,
    },
    /// The subscribe hook failed and `hooks.on_failure` is `"refuse"`: 503
    /// with `Retry-After`.
    #[error("the application's subscribe hook (hooks.subscribe_url) failed ({0}); retry later")]
    HookUnavailable(String),
    /// `hooks.max_in_flight` calls run already: 503 with `Retry-After`.
    #[error("too many subscribe hook calls at once (hooks.max_in_flight = {0}); retry later")]
    HookBusy(usize),
    /// Shutting down: 503.
    #[error("server is shutting down")]
    ShuttingDown,
    /// The actor crashed handling this very request and was restarted: 503.
    #[error("{0} crashed handling this request and was restarted; retry")]
    Crashed(&'static str),
    /// Cluster mode, and Redis did not answer (down, or past
    /// `cluster.command_timeout_ms`): 503.
    #[error("cluster bus unavailable")]
    BusUnavailable,
    /// Cluster mode, and Redis answered a command with an error (a script
    /// that failed, a key of the wrong type): 503, with Redis's words.
    #[error("Redis refused the command ({0})")]
    RedisRefused(String),
    /// Cluster mode, and this node's clock differs from Redis's by more
    /// than the tolerance (`/readyz`): 503.
    #[error(
        "this node's clock differs from Redis's by {skew_ms} ms (more than {tolerance_s} s): event ids, token expiry \
         and history ages would disagree across the fleet; fix the time sync (NTP) of this host or of Redis's"
    )]
    ClockSkew {
        /// Redis's time minus this node's.
        skew_ms: i64,
        /// The tolerance.
        tolerance_s: u64,
    },
    /// Cluster mode, and the fleet's clock is ahead of Redis's time past
    /// the tolerance: 503 with `Retry-After`, nothing kept or sent.
    #[error(
        "the fleet's clock is {ahead_s} s ahead of Redis's time (Redis's time went back, or the fleet key was \
         written by hand); nothing was delivered or kept; publishes resume when Redis's time reaches it"
    )]
    FleetClockAhead {
        /// Seconds the fleet's clock is ahead.
        ahead_s: u64,
    },
}

/// The headers of an answer a page on another origin may read besides
/// the CORS-safelisted ones: how long to wait before retrying (429, 503)
/// and why a token was refused (401). Without this a page's client sees
/// the status but not the `Retry-After` it must honour.
pub(crate) const EXPOSE_HEADERS: &str = "Retry-After, WWW-Authenticate";

/// [`EXPOSE_HEADERS`] as a header line.
const EXPOSE_LINE: &[u8] = b"access-control-expose-headers: Retry-After, WWW-Authenticate\r\n";

/// The CORS headers of an answer a lean path writes itself.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Cors<'a> {
    /// The page's origin, when `http.cors_origins` allows it:
    /// `access-control-allow-origin` names it.
    pub(crate) allow: Option<&'a str>,
    /// `http.cors_origins` is set, so the answer depends on `Origin`:
    /// `vary: Origin` (also for an origin it does not allow).
    pub(crate) vary: bool,
}

impl Cors<'_> {
    /// Appends the header lines.
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        if let Some(origin) = self.allow {
            // unwrap: writing into a Vec cannot fail.
            write!(out, "access-control-allow-origin: {origin}\r\n").expect("format into Vec");
        }
        if self.vary || self.allow.is_some() {
            out.extend_from_slice(b"vary: Origin\r\n");
        }
        if self.allow.is_some() {
            out.extend_from_slice(EXPOSE_LINE);
        }
    }
}

/// [`Cors`] as it was decided at a stream's admission, kept with the
/// answer (the stream's head, or its refusal) so that the answer writes
/// what was decided instead of asking `http.cors_origins` again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CorsAnswer {
    /// The page's origin, when `http.cors_origins` allows it.
    allow: Option<String>,
    /// `http.cors_origins` is set: `vary: Origin`.
    vary: bool,
}

impl CorsAnswer {
    /// The header lines to write.
    pub(crate) fn as_cors(&self) -> Cors<'_> {
        Cors {
            allow: self.allow.as_deref(),
            vary: self.vary,
        }
    }
}

impl From<Cors<'_>> for CorsAnswer {
    fn from(cors: Cors<'_>) -> Self {
        CorsAnswer {
            allow: cors.allow.map(str::to_owned),
            vary: cors.vary,
        }
    }
}

/// [`ApiError::IdFull`]'s fields, boxed: an admission's future carries an
/// `ApiError`'s size, and this variant is rare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IdFull {
    pub(crate) id: String,
    pub(crate) namespace: String,
    pub(crate) max: usize,
}

impl ApiError {
    /// The header this error adds to its response, if any.
    fn extra_header(&self) -> Option<(header::HeaderName, std::borrow::Cow<'static, str>)> {
        let header = |name, value: &'static str| Some((name, value.into()));
        match self {
            ApiError::Unauthorized | ApiError::BadToken(_) => header(header::WWW_AUTHENTICATE, "Bearer"),
            ApiError::WebSocketVersion => header(header::SEC_WEBSOCKET_VERSION, "13"),
            ApiError::MethodNotAllowed(allow) => header(header::ALLOW, allow),
            ApiError::Backlogged { .. } | ApiError::TooManyKeys => header(header::RETRY_AFTER, "1"),
            ApiError::IdFull(_) => header(header::RETRY_AFTER, "5"),
            ApiError::KeysUnavailable(_) => header(header::RETRY_AFTER, "5"),
            // RFC 9110 §15.5.2: a 401 says how to authenticate.
            ApiError::HookRefused { status: 401, .. } => header(header::WWW_AUTHENTICATE, "Bearer"),
            ApiError::HookUnavailable(_) | ApiError::HookBusy(_) => header(header::RETRY_AFTER, "1"),
            ApiError::FleetClockAhead { ahead_s } => {
                Some((header::RETRY_AFTER, ahead_s.max(&1).to_string().into()))
            }
            ApiError::OverLimit { retry_after_s, .. } => {
                Some((header::RETRY_AFTER, retry_after_s.to_string().into()))
            }
            _ => None,
        }
    }

    /// The JSON body.
    fn body(&self) -> String {
        json!({ "error": self.to_string() }).to_string()
    }

    /// Appends this error as a whole HTTP/1.1 response to `out`, for the lean
    /// paths that write to the socket themselves. `close` adds
    /// `connection: close` (the caller then closes); `cors`, the page's
    /// CORS headers, so that a page can read why it was refused.
    pub(crate) fn write_http1(&self, out: &mut Vec<u8>, close: bool, cors: Cors<'_>) {
        let status = self.status_code();
        let body = self.body();
        // unwrap: writing into a Vec cannot fail.
        write!(
            out,
            "HTTP/1.1 {} {}\r\ncontent-length: {}\r\ncontent-type: application/json\r\n",
            status.as_u16(),
            status.canonical_reason().unwrap_or(""),
            body.len()
        )
        .expect("format into Vec");
        if let Some((name, value)) = self.extra_header() {
            write!(out, "{name}: {value}\r\n").expect("format into Vec");
        }
        cors.write(out);
        if close {
            out.extend_from_slice(b"connection: close\r\n");
        }
        write!(out, "date: {}\r\n\r\n{body}", crate::conn::http_date::now()).expect("format into Vec");
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::BadId(_)
            | ApiError::EmptyMessage
            | ApiError::NotUtf8
            | ApiError::LineBreak
            | ApiError::Payload(_)
            | ApiError::BadHead(_)
            | ApiError::BadProxyHeader(_)
            | ApiError::RepeatedAuthorization
            | ApiError::ConflictingTokens
            | ApiError::BadIdempotencyKey(_)
            | ApiError::RepeatedOrigin
            | ApiError::BadWebSocket(_)
            | ApiError::BadTransport
            | ApiError::BadWait
            | ApiError::PollUpgrade
            | ApiError::BadEventId(_) => StatusCode::BAD_REQUEST,
            ApiError::BadToken(_) => StatusCode::UNAUTHORIZED,
            ApiError::HookRefused { status, .. } => {
                StatusCode::from_u16(*status).unwrap_or(StatusCode::FORBIDDEN)
            }
            ApiError::OriginNotAllowed | ApiError::PublishProtected | ApiError::OperatorPageElsewhere => {
                StatusCode::FORBIDDEN
            }
            ApiError::IdempotencyInFlight => StatusCode::CONFLICT,
            ApiError::IdempotencyKeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::WebSocketVersion => StatusCode::UPGRADE_REQUIRED,
            ApiError::OverLimit { .. } | ApiError::IdFull(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::HeadTimeout { .. } | ApiError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ApiError::HeadTooLarge { .. } | ApiError::TooManyHeaders { .. } => {
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
            }
            ApiError::StreamLimit(_)
            | ApiError::Backlogged { .. }
            | ApiError::TooManyKeys
            | ApiError::ShuttingDown
            | ApiError::KeysUnavailable(_)
            | ApiError::HookUnavailable(_)
            | ApiError::HookBusy(_)
            | ApiError::Crashed(_)
            | ApiError::BusUnavailable
            | ApiError::RedisRefused(_)
            | ApiError::ClockSkew { .. }
            | ApiError::FleetClockAhead { .. } => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let mut res = HttpResponse::build(self.status_code());
        if let Some((name, value)) = self.extra_header() {
            res.insert_header((name, value.into_owned()));
        }
        // A body that stopped arriving leaves the connection mid-request:
        // nothing more can be read from it; and a server shutting down
        // keeps no connection open.
        if matches!(self, ApiError::BodyTimeout { .. } | ApiError::ShuttingDown) {
            res.force_close();
        }
        res.content_type("application/json").body(self.body())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lean_answers_match_actix_web_answers() {
        let e = ApiError::Unauthorized;
        let mut out = Vec::new();
        e.write_http1(&mut out, true, Cors::default());
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 401 Unauthorized\r\n"), "{text}");
        assert!(text.contains("www-authenticate: Bearer\r\n"), "{text}");
        assert!(text.contains("connection: close\r\n"), "{text}");
        assert!(
            text.ends_with(r#"{"error":"missing or wrong bearer token"}"#),
            "{text}"
        );
        let res = e.error_response();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(res.headers().get(header::WWW_AUTHENTICATE).unwrap(), "Bearer");
    }

    #[test]
    fn head_errors() {
        let mut out = Vec::new();
        ApiError::HeadTimeout { ms: 5000 }.write_http1(&mut out, true, Cors::default());
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 408 Request Timeout\r\n"), "{text}");
        assert!(text.ends_with(r#"{"error":"request head not received within 5000 ms"}"#));
        let mut out = Vec::new();
        ApiError::HeadTooLarge { limit: 8192 }.write_http1(&mut out, false, Cors::default());
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
            "{text}"
        );
        assert!(!text.contains("connection: close"), "{text}");
        let mut out = Vec::new();
        let cors = Cors {
            allow: Some("http://a.example"),
            vary: true,
        };
        ApiError::BadToken("none given".into()).write_http1(&mut out, true, cors);
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("access-control-allow-origin: http://a.example\r\nvary: Origin\r\n"),
            "{text}"
        );
        // Kept with a refusal, the same answer writes the same bytes.
        let kept = CorsAnswer::from(cors);
        let mut again = Vec::new();
        ApiError::BadToken("none given".into()).write_http1(&mut again, true, kept.as_cors());
        assert_eq!(String::from_utf8(again).unwrap(), text);
    }
}
