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

use actix_web::http::header;
use actix_web::web::{self, Data, Path, Payload, ServiceConfig};
use actix_web::{HttpRequest, HttpResponse, Route};
use futures_util::StreamExt;
use serde_json::json;

use crate::counter::{self, Take};
use crate::error::ApiError;
use crate::id::{self, IdError};
use crate::router::{self, Broadcast, Publish};
use crate::state::ServerState;
use crate::stream::Stream;

/// Registers every route. `fault_injection` adds `/admin/crash/*`.
pub(crate) fn routes(cfg: &mut ServiceConfig, fault_injection: bool) {
    let get = |path: &str, route: Route| web::resource(path).route(route).default_service(only("GET"));
    let post = |path: &str, route: Route| web::resource(path).route(route).default_service(only("POST"));
    cfg.service(web::resource(["/test/", "/send/"]).to(|| fail(ApiError::BadId(IdError::Empty))))
        .service(get("/test/{id}", web::get().to(stream)))
        .service(post("/send/{id}", web::post().to(send)))
        .service(post("/broadcast", web::post().to(broadcast)))
        .service(get("/dispatcher", web::get().to(next_count)))
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
    let body = Stream::start_body(Arc::from(id.as_str()), Arc::clone(&state.streams));
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
        .router()
        .send(Publish { id: id.clone(), msg })
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
        .router()
        .send(Broadcast { msg })
        .await
        .ok()
        .flatten()
        .ok_or(ApiError::Crashed("router"))?;
    Ok(HttpResponse::Ok().json(json!({ "delivered": delivered })))
}

/// `GET /dispatcher`
async fn next_count(state: Data<ServerState>) -> Result<HttpResponse, ApiError> {
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
        "router" => drop(state.router().send(router::Crash).await),
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
    validate_message(&bytes).map(Arc::from)
}

/// A message is one non-empty line of UTF-8 (its size is checked while it
/// is read).
fn validate_message(bytes: &[u8]) -> Result<&str, ApiError> {
    let text = std::str::from_utf8(bytes).map_err(|_| ApiError::NotUtf8)?;
    if text.is_empty() {
        return Err(ApiError::EmptyMessage);
    }
    if text.contains(['\r', '\n']) {
        return Err(ApiError::LineBreak);
    }
    Ok(text)
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

/// Property tests: message validation agrees with the rule written out
/// plainly, for arbitrary bytes.
#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(crate::proptest_config())]

        /// A message is accepted, unchanged, exactly when it is non-empty
        /// UTF-8 without CR or LF; otherwise the error names the first rule
        /// broken.
        #[test]
        fn messages_follow_the_rule(bytes in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..64),
            "[^\r\n]{0,40}".prop_map(String::into_bytes),
            ".{0,20}[\r\n].{0,20}".prop_map(String::into_bytes),
        ]) {
            let expected = match std::str::from_utf8(&bytes) {
                Err(_) => Err(ApiError::NotUtf8),
                Ok("") => Err(ApiError::EmptyMessage),
                Ok(t) if t.contains('\r') || t.contains('\n') => Err(ApiError::LineBreak),
                Ok(t) => Ok(t),
            };
            prop_assert_eq!(validate_message(&bytes), expected);
        }
    }
}
