//! The actix-web routes: everything but lean streams.
//!
//! | route | |
//! |---|---|
//! | `GET /test/{id}` | fallback stream (streaming body) for what the lean path declines |
//! | `POST /send/{id}` | message to every stream of `id` → `{"id":..,"delivered":n}` (+ `"nodes":m` in cluster mode) |
//! | `POST /broadcast` | message to every stream → `{"delivered":n}` (+ `"nodes":m`) |
//! | `GET /dispatcher` | the Counter's next value, as text |
//! | `GET /stats` | counters, JSON (+ a `cluster` section in cluster mode) |
//! | `GET /metrics` | the same counters in the Prometheus text format |
//! | `GET /` | the live dashboard page (`crate::dashboard`) |
//! | `GET /dashboard/events` | its feed: one SSE event per second with `/stats` (and the cluster's nodes) |
//! | `GET /cluster` | every live node and the totals |
//! | `GET /healthz` | `ok` (liveness) |
//! | `GET /readyz` | `ok`, or 503 while shutting down or while the cluster bus is down |
//! | `POST /admin/crash/{router,counter,bus}` | fault injection, only with `debug.fault_injection` |
//! | `POST /admin/cut/{id}` | fault injection: every stream of `id` drops its connection |
//!
//! Two guards decide who may use what, each in one function:
//! [`Admission::authorize`](crate::admission::Admission::authorize) (publishing: the token, or protected mode) and
//! [`operator_page`] (`/stats`, `/metrics`, `/cluster`, the dashboard and
//! `/admin/*`: the internal listener, or `server.admin_public`, or the
//! `auth.admin_token` bearer). `/healthz` and `/readyz` are served on every
//! listener.

use std::sync::Arc;
use std::time::Duration;

use actix_web::body::BoxBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{Version, header};
use actix_web::middleware::{Next, from_fn};
use actix_web::web::{self, Data, Path, Payload, ServiceConfig};
use actix_web::{HttpRequest, HttpResponse, Route};
use futures_util::StreamExt;
use serde_json::json;

use crate::admission::{Admitted, bearer_is};
use crate::conn::socket::{CloseHandle, Internal};
use crate::counter::Take;
use crate::error::{ApiError, Cors};
use crate::hub::router::CutId;
use crate::hub::{Answer, Target, Undelivered};
use crate::id::{self, IdError};
use crate::idempotency;
use crate::state::ServerState;
use crate::stream::{Framing, Head, Stream, Via};
use crate::supervision::Crash;

/// Registers every route. `fault_injection` adds `/admin/crash/*`.
pub(crate) fn routes(cfg: &mut ServiceConfig, fault_injection: bool) {
    let get = |path: &str, route: Route| web::resource(path).route(route).default_service(only("GET"));
    let post = |path: &str, route: Route| {
        web::resource(path)
            .route(route)
            .route(preflight("POST, OPTIONS", "Authorization, Content-Type"))
            .default_service(only("POST"))
    };
    // An operator page: [`operator_page`] decides before anything else.
    let operator = |path: &str, route: Route| get(path, route).wrap(from_fn(operator_only));
    cfg.service(
        web::resource(["/test/", "/send/", "/presence/"]).to(|| fail(ApiError::BadId(IdError::Empty))),
    )
    .service(
        web::resource("/test/{id}")
            .route(web::get().to(stream))
            .route(preflight(
                "GET, OPTIONS",
                "Authorization, Last-Event-ID, Accept, Cache-Control",
            ))
            .default_service(only("GET")),
    )
    .service(post("/send/{id}", web::post().to(send)))
    .service(post("/broadcast", web::post().to(broadcast)))
    .service(get("/dispatcher", web::get().to(next_count)))
    .service(operator("/stats", web::get().to(stats)))
    .service(operator("/metrics", web::get().to(metrics)))
    .service(operator("/", web::get().to(crate::dashboard::page)))
    .service(operator(
        "/dashboard/events",
        web::get().to(crate::dashboard::events),
    ))
    .service(operator("/cluster", web::get().to(cluster_view)))
    .service(get("/presence/{id}", web::get().to(presence)))
    .service(get("/healthz", web::get().to(healthz)))
    .service(get("/readyz", web::get().to(readyz)));
    if fault_injection {
        cfg.service(post("/admin/crash/{actor}", web::post().to(crash)).wrap(from_fn(operator_only)))
            .service(post("/admin/cut/{id}", web::post().to(cut)).wrap(from_fn(operator_only)));
    }
    cfg.default_service(web::to(|| fail(ApiError::NotFound)));
}

/// `OPTIONS`: a browser's CORS preflight, allowing `methods` with
/// `headers`: on the publish API (a `POST` with `Authorization`), and on
/// `/test/{id}` (a `fetch` that opens a stream with `Authorization` or
/// `Last-Event-ID`). The origin header itself is added by [`cors`] when
/// `http.cors_origins` allows it; without it the browser refuses the call.
fn preflight(methods: &'static str, headers: &'static str) -> Route {
    web::method(actix_web::http::Method::OPTIONS).to(move || async move {
        HttpResponse::NoContent()
            .insert_header((header::ACCESS_CONTROL_ALLOW_METHODS, methods))
            .insert_header((header::ACCESS_CONTROL_ALLOW_HEADERS, headers))
            .insert_header((header::ACCESS_CONTROL_MAX_AGE, "600"))
            .finish()
    })
}

/// Adds `access-control-allow-origin: <origin>` to a response whose
/// request came from an origin `http.cors_origins` allows (as the
/// admission decided it, in the server's middleware; refusals included, so
/// the page can read why), and `vary: Origin` whenever a list is
/// configured, since the answer then depends on the origin.
pub(crate) fn cors(cors: Cors<'_>, res: &mut HttpResponse) {
    let allowed = cors.allow.and_then(|o| header::HeaderValue::from_str(o).ok());
    let vary = cors.vary || allowed.is_some();
    if let Some(origin) = allowed {
        res.headers_mut()
            .insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        res.headers_mut().insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            header::HeaderValue::from_static(crate::error::EXPOSE_HEADERS),
        );
    }
    if vary {
        res.headers_mut()
            .insert(header::VARY, header::HeaderValue::from_static("Origin"));
    }
}

/// A resource's answer to any method it does not serve.
fn only(allow: &'static str) -> Route {
    web::to(move || fail(ApiError::MethodNotAllowed(allow)))
}

async fn fail(e: ApiError) -> Result<HttpResponse, ApiError> {
    Err(e)
}

/// `GET /test/{id}` through actix-web: same wire format, heavier per stream.
///
/// It applies the lean path's head rules that actix-web does not already:
/// the `server.max_head_bytes` bound (here on the head as actix-web parsed
/// it, request line and header lines with CRLF ends; past it 431 and the
/// connection closed, as on the lean path) and no request body on a stream
/// (`Content-Length: 0` is no body). actix-http itself refuses a repeated
/// `Content-Length`, which the lean path accepts when every value is 0.
/// Then the same admission as a lean stream
/// ([`Admission::admit_stream`](crate::admission::Admission::admit_stream)), and the same head ([`Head`]), which
/// actix-web writes.
async fn stream(
    req: HttpRequest,
    id: Path<String>,
    state: Data<ServerState>,
) -> Result<HttpResponse, ApiError> {
    let max_head = state.settings.server.max_head_bytes;
    let refused = if head_len(&req) > max_head {
        if let Some(close) = req.conn_data::<CloseHandle>() {
            close.close();
        }
        Some(ApiError::HeadTooLarge { limit: max_head })
    } else if req.headers().contains_key(header::TRANSFER_ENCODING) {
        Some(ApiError::BadHead(
            "a stream request has no body (Transfer-Encoding)",
        ))
    } else {
        req.headers()
            .get_all(header::CONTENT_LENGTH)
            .find_map(|v| crate::conn::classify::check_length(v.as_bytes()).err())
            .map(|e| state.head_error(e))
    };
    if let Some(e) = refused {
        return Err(state.admission.refusal(e, Cors::default()).error);
    }
    id::validate(&id, state.settings.stream.max_id_len)?;
    let admitted = state
        .admission
        .admit_stream(
            &id,
            &rebuilt_head(&req),
            &[],
            Via::Fallback,
            state.admission.client_of(&req),
        )
        .map_err(|refused| refused.error)?;
    let open = match admitted {
        Admitted::Open(open) => open,
        Admitted::Later(pending) => state
            .admission
            .complete(pending)
            .await
            .map_err(|refused| refused.error)?,
    };
    let head = Head::of(&open);
    let mut res = HttpResponse::Ok();
    for field in head.fields() {
        res.insert_header(field);
    }
    let close_delimited = head.framing() == Framing::Close;
    let close = req.conn_data::<CloseHandle>().cloned();
    let body = Stream::start_body(Arc::from(id.as_str()), open, Arc::clone(&state.streams), close);
    let mut res = res.streaming(body);
    if close_delimited {
        // No chunking and no length: the body ends when the connection does.
        res.head_mut().no_chunking(true);
        res.head_mut()
            .set_connection_type(actix_web::http::ConnectionType::Close);
    }
    Ok(res)
}

/// The size of a request head as actix-web parsed it: request line and
/// header lines, each with CRLF and `": "`, and the blank line. The raw head
/// may differ by a few bytes (bare LF line ends, other whitespace), so near
/// the limit the two paths can disagree by that much.
fn head_len(req: &HttpRequest) -> usize {
    let target = req.uri().path_and_query().map_or(1, |p| p.as_str().len());
    let line = req.method().as_str().len() + 1 + target + " HTTP/1.1\r\n".len();
    let headers: usize = req
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + 2 + value.len() + 2)
        .sum();
    line + headers + 2
}

/// The head of a request as actix-web parsed it, for the checks the lean
/// path makes on the raw head ([`crate::conn::handshake`]).
fn rebuilt_head(req: &HttpRequest) -> Vec<u8> {
    let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let version = if req.version() == Version::HTTP_10 {
        "HTTP/1.0"
    } else {
        "HTTP/1.1"
    };
    let mut head = format!("{} {target} {version}\r\n", req.method()).into_bytes();
    for (name, value) in req.headers() {
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    head
}

/// `POST /send/{id}`
async fn send(
    req: HttpRequest,
    id: Path<String>,
    body: Payload,
    state: Data<ServerState>,
) -> Result<HttpResponse, ApiError> {
    state.admission.admit_publish(&req)?;
    let id = id.into_inner();
    id::validate(&id, state.settings.stream.max_id_len)?;
    let key = idempotency::key_of(&req)?;
    let msg = read_message(&req, body, &state).await?;
    publish(&state, Target::Id(id), &msg, key).await
}

/// `POST /broadcast`
async fn broadcast(
    req: HttpRequest,
    body: Payload,
    state: Data<ServerState>,
) -> Result<HttpResponse, ApiError> {
    state.admission.admit_publish(&req)?;
    let key = idempotency::key_of(&req)?;
    let msg = read_message(&req, body, &state).await?;
    publish(&state, Target::All, &msg, key).await
}

/// Publishes through the hub and answers as [`Hub::publish`] decided:
/// 200; 200 marked `idempotent-replayed` for a repeated key; 503 for a
/// publish the other nodes may have missed, with `Retry-After` when
/// nothing was delivered.
///
/// [`Hub::publish`]: crate::hub::Hub::publish
async fn publish(
    state: &ServerState,
    target: Target,
    msg: &Arc<str>,
    key: Option<String>,
) -> Result<HttpResponse, ApiError> {
    Ok(match state.hub.publish(target, msg, key).await? {
        Answer::Done(receipt) => HttpResponse::Ok().json(receipt),
        Answer::Replayed(first) => {
            let mut res = HttpResponse::Ok();
            res.insert_header(("idempotent-replayed", "true"));
            match first {
                Some(receipt) => res.json(receipt),
                None => res.json(json!({
                    "idempotent_replay": true,
                    "note": "accepted once before; its first answer is not recorded (yet)",
                })),
            }
        }
        Answer::LocalOnly(receipt) => {
            // unwrap: a Receipt always serializes, to an object.
            let mut body = serde_json::to_value(receipt).expect("a receipt serializes");
            body["error"] = ApiError::BusUnavailable.to_string().into();
            body["other_nodes"] = "not sent: the bus is down".into();
            HttpResponse::ServiceUnavailable().json(body)
        }
        Answer::NotDelivered(Undelivered { id, error, outcome }) => {
            let mut body = json!({ "error": error.to_string(), "delivered": 0, "outcome": outcome });
            let retry_after_s = match error {
                ApiError::FleetClockAhead { ahead_s } => {
                    body["retry_after_s"] = ahead_s.max(1).into();
                    ahead_s.max(1)
                }
                _ => 1,
            };
            if let Some(id) = id {
                body["id"] = id.into();
            }
            HttpResponse::ServiceUnavailable()
                .insert_header((header::RETRY_AFTER, retry_after_s.to_string()))
                .json(body)
        }
    })
}

/// `GET /dispatcher`
async fn next_count(state: Data<ServerState>) -> Result<HttpResponse, ApiError> {
    let n = state
        .counter
        .send(Take { n: 1 })
        .await
        .unwrap_or(Err(ApiError::Crashed("counter")))?;
    Ok(HttpResponse::Ok()
        .content_type("text/plain; charset=utf-8")
        .body(n.to_string()))
}

/// `GET /stats`; with the publish token (or none set), `limits.refusing`
/// too: the client addresses refused lately.
async fn stats(req: HttpRequest, state: Data<ServerState>) -> HttpResponse {
    let mut doc = state.stats_document();
    if state.admission.authorize(&req).is_ok() {
        doc["limits"]["refusing"] = state.admission.limits.refusing();
    }
    HttpResponse::Ok().json(doc)
}

/// `GET /metrics`: the same counters in the Prometheus text format.
async fn metrics(state: Data<ServerState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(crate::metrics::CONTENT_TYPE)
        .body(crate::metrics::render(
            &state.stats,
            state.hub.cluster(),
            &state.admission.limits,
        ))
}

/// `GET /cluster`: every live node (from their heartbeats in Redis) and the
/// totals; without a bus, this node alone.
async fn cluster_view(state: Data<ServerState>) -> Result<HttpResponse, ApiError> {
    let view = match state.hub.cluster() {
        Some(cluster) => cluster.view().await?,
        None => crate::hub::cluster::single_view(&state.stats, &state.addr),
    };
    // Through a Value, whose keys are sorted: the nodes' fields in the
    // order /cluster has always listed them.
    Ok(HttpResponse::Ok().json(serde_json::to_value(view).map_err(|_| ApiError::Crashed("cluster view"))?))
}

/// `GET /presence/{id}`: the id's open streams, per node.
/// Who may publish may see it (`auth.publish_token`): it tells who listens.
async fn presence(
    req: HttpRequest,
    id: Path<String>,
    state: Data<ServerState>,
) -> Result<HttpResponse, ApiError> {
    state.admission.authorize(&req)?;
    let id = id.into_inner();
    id::validate(&id, state.settings.stream.max_id_len)?;
    Ok(HttpResponse::Ok().json(state.hub.presence(&id).await?))
}

/// `GET /healthz`: the process serves (liveness).
async fn healthz() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; charset=utf-8")
        .body("ok")
}

/// `GET /readyz`: this node should get traffic: not shutting down and, in
/// cluster mode, its bus link to Redis is up and subscribed.
async fn readyz(state: Data<ServerState>) -> Result<HttpResponse, ApiError> {
    if state.admission.shutdown.is_cancelled() {
        return Err(ApiError::ShuttingDown);
    }
    if let Some(cluster) = state.hub.cluster() {
        if !cluster.ready() {
            return Err(ApiError::BusUnavailable);
        }
        if let Some(skewed) = cluster.clock_skewed() {
            return Err(skewed);
        }
    }
    Ok(healthz().await)
}

/// `POST /admin/crash/{router|counter|bus}`: makes that actor panic in a handler.
async fn crash(
    req: HttpRequest,
    actor: Path<String>,
    state: Data<ServerState>,
) -> Result<HttpResponse, ApiError> {
    state.admission.authorize(&req)?;
    // The answer is `None` (the handler panicked) or a mailbox error; either
    // way the actor is now restarting.
    match actor.as_str() {
        "router" => drop(state.router().send(Crash).await),
        "counter" => drop(state.counter.send(Crash).await),
        "bus" => {
            if !state.hub.crash_bus().await {
                return Err(ApiError::NotFound);
            }
        }
        _ => return Err(ApiError::NotFound),
    }
    Ok(HttpResponse::Accepted().json(json!({ "crashed": actor.as_str() })))
}

/// `POST /admin/cut/{id}`: every stream of `id` on this node drops its
/// connection at once (no final chunk, no close frame), as a crash or a
/// network failure would: what a client's reconnect and resume must survive.
/// With `?panic=1` each stream panics in its handler instead, as a bug would:
/// its slot, counters and Router entry must be given back all the same.
async fn cut(req: HttpRequest, id: Path<String>, state: Data<ServerState>) -> Result<HttpResponse, ApiError> {
    state.admission.authorize(&req)?;
    let panic = req.query_string().split('&').any(|p| p == "panic=1");
    let n = state
        .router()
        .send(CutId {
            id: id.into_inner(),
            panic,
        })
        .await
        .ok()
        .flatten()
        .ok_or(ApiError::Crashed("router"))?;
    Ok(HttpResponse::Ok().json(json!({ "cut": n })))
}

/// Whether an operator page may be served here: on the internal listener,
/// with `server.admin_public`, or to a request with
/// `Authorization: Bearer <auth.admin_token>`; otherwise 403 saying where
/// it is served.
fn operator_page(req: &HttpRequest, state: &ServerState) -> Result<(), ApiError> {
    if req.conn_data::<Internal>().is_some() || state.settings.server.admin_public {
        return Ok(());
    }
    let token = &state.settings.auth.admin_token;
    if !token.is_empty() && bearer_is(req, token)? {
        return Ok(());
    }
    Err(ApiError::OperatorPageElsewhere)
}

/// [`operator_page`] in front of a resource's handlers.
async fn operator_only(
    req: ServiceRequest,
    next: Next<BoxBody>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let allowed = match req.app_data::<Data<ServerState>>() {
        Some(state) => operator_page(req.request(), state),
        None => Err(ApiError::OperatorPageElsewhere),
    };
    match allowed {
        Ok(()) => next.call(req).await,
        Err(e) => Ok(req.error_response(e)),
    }
}

/// Reads a message body: at most `max` bytes, UTF-8, one non-empty line.
///
/// The whole body must arrive within `server.body_timeout_ms` of the head
/// (408 and the connection closed otherwise), and a body still arriving when
/// the server shuts down is cut with 503: a stalled upload holds neither an
/// fd nor shutdown.
async fn read_message(req: &HttpRequest, body: Payload, state: &ServerState) -> Result<Arc<str>, ApiError> {
    let max = state.settings.message.max_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > max) {
        return Err(ApiError::TooLarge { limit: max });
    }
    let ms = state.settings.server.body_timeout_ms;
    let cut = |e: ApiError| {
        // The rest of the body may never come: the connection cannot serve
        // another request.
        if let Some(close) = req.conn_data::<CloseHandle>() {
            close.close();
        }
        Err(e)
    };
    let bytes = tokio::select! {
        biased;
        () = state.admission.shutdown.cancelled() => return cut(ApiError::ShuttingDown),
        read = tokio::time::timeout(Duration::from_millis(ms), read_body(body, max)) => match read {
            Ok(bytes) => bytes?,
            Err(_) => return cut(ApiError::BodyTimeout { ms }),
        },
    };
    validate_message(&bytes).map(Arc::from)
}

/// Reads a body of at most `max` bytes.
async fn read_body(mut body: Payload, max: usize) -> Result<web::BytesMut, ApiError> {
    let mut bytes = web::BytesMut::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| ApiError::Payload(e.to_string()))?;
        if bytes.len() + chunk.len() > max {
            return Err(ApiError::TooLarge { limit: max });
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
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
