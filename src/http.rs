//! The actix-web routes: everything but lean streams.
//!
//! | route | |
//! |---|---|
//! | `GET /test/{id}` | fallback stream (streaming body) for what the lean path declines |
//! | `POST /send/{id}` | message to every stream of `id` → `{"id":..,"delivered":n}` |
//! | `POST /broadcast` | message to every stream → `{"delivered":n}` |
//! | `GET /dispatcher` | the Counter's next value, as text |
//! | `GET /stats` | counters, JSON |
//! | `GET /healthz` | `ok` |
//! | `POST /admin/crash/{router,counter}` | fault injection, only with `debug.fault_injection` |

use std::sync::Arc;

use actix_web::http::{StatusCode, header};
use actix_web::web::{self, Data, Path, Payload, ServiceConfig};
use actix_web::{HttpRequest, HttpResponse, ResponseError, Route};
use futures_util::StreamExt;
use serde_json::json;

use crate::counter::{self, Take};
use crate::id::{self, IdError};
use crate::router::{self, Broadcast};
use crate::state::ServerState;
use crate::stream::Stream;

/// Why a request failed; each maps to a status and a JSON `{"error": ...}`.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
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
    /// No such route: 404.
    #[error("not found")]
    NotFound,
    /// Route exists, method does not: 405.
    #[error("method not allowed; use {0}")]
    MethodNotAllowed(&'static str),
    /// `stream.max_streams` reached: 503.
    #[error("stream limit of {0} reached")]
    StreamLimit(usize),
    /// Shutting down: 503.
    #[error("server is shutting down")]
    ShuttingDown,
    /// The actor crashed handling this very request and was restarted: 503.
    #[error("{0} crashed handling this request and was restarted; retry")]
    Crashed(&'static str),
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::BadId(_)
            | ApiError::EmptyMessage
            | ApiError::NotUtf8
            | ApiError::LineBreak
            | ApiError::Payload(_) => StatusCode::BAD_REQUEST,
            ApiError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::StreamLimit(_) | ApiError::ShuttingDown | ApiError::Crashed(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        }
    }

    fn error_response(&self) -> HttpResponse {
        let mut res = HttpResponse::build(self.status_code());
        match self {
            ApiError::Unauthorized => {
                res.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
            }
            ApiError::MethodNotAllowed(allow) => {
                res.insert_header((header::ALLOW, *allow));
            }
            _ => {}
        }
        res.json(json!({ "error": self.to_string() }))
    }
}

/// Registers every route. `fault_injection` adds `/admin/crash/*`.
pub fn routes(cfg: &mut ServiceConfig, fault_injection: bool) {
    let get = |path: &str, route: Route| web::resource(path).route(route).default_service(only("GET"));
    let post = |path: &str, route: Route| web::resource(path).route(route).default_service(only("POST"));
    cfg.service(web::resource(["/test/", "/send/"]).to(|| fail(ApiError::BadId(IdError::Empty))))
        .service(get("/test/{id}", web::get().to(stream)))
        .service(post("/send/{id}", web::post().to(send)))
        .service(post("/broadcast", web::post().to(broadcast)))
        .service(get("/dispatcher", web::get().to(dispatcher)))
        .service(get("/stats", web::get().to(stats)))
        .service(get("/healthz", web::get().to(healthz)));
    if fault_injection {
        cfg.service(post("/admin/crash/{actor}", web::post().to(crash)));
    }
    cfg.default_service(web::to(|| fail(ApiError::NotFound)));
}

/// A resource's answer to any method it does not serve.
fn only(allow: &'static str) -> Route {
    web::to(move || fail(ApiError::MethodNotAllowed(allow)))
}

async fn fail(e: ApiError) -> Result<HttpResponse, ApiError> {
    Err(e)
}

/// `GET /test/{id}` through actix-web: same wire format, heavier per stream.
async fn stream(id: Path<String>, state: Data<ServerState>) -> Result<HttpResponse, ApiError> {
    let s = &state.settings.stream;
    id::validate(&id, s.max_id_len)?;
    if state.shutdown.is_cancelled() {
        return Err(ApiError::ShuttingDown);
    }
    if !state.stats.try_reserve_stream(s.max_streams) {
        return Err(ApiError::StreamLimit(s.max_streams));
    }
    let body = Stream::start_body(Arc::from(id.as_str()), state.into_inner());
    Ok(HttpResponse::Ok()
        .content_type("text/plain; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header(("x-accel-buffering", "no"))
        .streaming(body))
}

/// `POST /send/{id}`
async fn send(
    req: HttpRequest,
    id: Path<String>,
    body: Payload,
    state: Data<ServerState>,
) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    let id = id.into_inner();
    id::validate(&id, state.settings.stream.max_id_len)?;
    let msg = read_message(&req, body, state.settings.message.max_bytes).await?;
    let delivered = state
        .router
        .send(router::Send { id: id.clone(), msg })
        .await
        .ok()
        .flatten()
        .ok_or(ApiError::Crashed("router"))?;
    Ok(HttpResponse::Ok().json(json!({ "id": id, "delivered": delivered })))
}

/// `POST /broadcast`
async fn broadcast(
    req: HttpRequest,
    body: Payload,
    state: Data<ServerState>,
) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    let msg = read_message(&req, body, state.settings.message.max_bytes).await?;
    let delivered = state
        .router
        .send(Broadcast { msg })
        .await
        .ok()
        .flatten()
        .ok_or(ApiError::Crashed("router"))?;
    Ok(HttpResponse::Ok().json(json!({ "delivered": delivered })))
}

/// `GET /dispatcher`
async fn dispatcher(state: Data<ServerState>) -> Result<HttpResponse, ApiError> {
    let n = state
        .counter
        .send(Take(1))
        .await
        .ok()
        .flatten()
        .ok_or(ApiError::Crashed("counter"))?;
    Ok(HttpResponse::Ok()
        .content_type("text/plain; charset=utf-8")
        .body(n.to_string()))
}

/// `GET /stats`
async fn stats(state: Data<ServerState>) -> HttpResponse {
    HttpResponse::Ok().json(state.stats.snapshot())
}

/// `GET /healthz`
async fn healthz() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; charset=utf-8")
        .body("ok")
}

/// `POST /admin/crash/{router|counter}`: makes that actor panic in a handler.
async fn crash(
    req: HttpRequest,
    actor: Path<String>,
    state: Data<ServerState>,
) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    // The answer is `None` (the handler panicked) or a mailbox error; either
    // way the actor is now restarting.
    match actor.as_str() {
        "router" => drop(state.router.send(router::Crash).await),
        "counter" => drop(state.counter.send(counter::Crash).await),
        _ => return Err(ApiError::NotFound),
    }
    Ok(HttpResponse::Accepted().json(json!({ "crashed": actor.as_str() })))
}

/// Checks `Authorization: Bearer <auth.publish_token>` when a token is set.
fn authorize(req: &HttpRequest, state: &ServerState) -> Result<(), ApiError> {
    let token = &state.settings.auth.publish_token;
    if token.is_empty() {
        return Ok(());
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        .unwrap_or_default();
    if constant_time_eq(given, token.as_bytes()) {
        Ok(())
    } else {
        Err(ApiError::Unauthorized)
    }
}

/// Compares without an early exit, so timing does not leak the token.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Reads a message body: at most `max` bytes, UTF-8, one non-empty line.
async fn read_message(req: &HttpRequest, mut body: Payload, max: usize) -> Result<Arc<str>, ApiError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > max) {
        return Err(ApiError::TooLarge { limit: max });
    }
    let mut bytes = web::BytesMut::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| ApiError::Payload(e.to_string()))?;
        if bytes.len() + chunk.len() > max {
            return Err(ApiError::TooLarge { limit: max });
        }
        bytes.extend_from_slice(&chunk);
    }
    let text = std::str::from_utf8(&bytes).map_err(|_| ApiError::NotUtf8)?;
    if text.is_empty() {
        return Err(ApiError::EmptyMessage);
    }
    if text.contains(['\r', '\n']) {
        return Err(ApiError::LineBreak);
    }
    Ok(Arc::from(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_compare() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
