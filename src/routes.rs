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

use std::sync::Arc;
use std::time::Duration;

use actix_web::http::{StatusCode, Version, header};
use actix_web::web::{self, Data, Path, Payload, ServiceConfig};
use actix_web::{HttpRequest, HttpResponse, Route};
use futures_util::StreamExt;
use serde_json::json;

use crate::cluster;
use crate::cluster::{Here, Once, PublishFailed};
use crate::counter::{self, Take};
use crate::error::ApiError;
use crate::handshake::Transport;
use crate::id::{self, IdError};
use crate::idempotency::{self, Begin};
use crate::router::{self, Broadcast, Busy, Publish, Published, Router};
use crate::socket::CloseHandle;
use crate::state::ServerState;
use crate::stream::Stream;

/// Registers every route. `fault_injection` adds `/admin/crash/*`.
pub(crate) fn routes(cfg: &mut ServiceConfig, fault_injection: bool) {
    let get = |path: &str, route: Route| web::resource(path).route(route).default_service(only("GET"));
    let post = |path: &str, route: Route| {
        web::resource(path)
            .route(route)
            .route(preflight("POST, OPTIONS", "Authorization, Content-Type"))
            .default_service(only("POST"))
    };
    cfg.service(web::resource(["/test/", "/send/"]).to(|| fail(ApiError::BadId(IdError::Empty))))
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
        .service(get("/stats", web::get().to(stats)))
        .service(get("/metrics", web::get().to(metrics)))
        .service(get("/", web::get().to(crate::dashboard::page)))
        .service(get("/dashboard/events", web::get().to(crate::dashboard::events)))
        .service(get("/cluster", web::get().to(cluster_view)))
        .service(get("/healthz", web::get().to(healthz)))
        .service(get("/readyz", web::get().to(readyz)));
    if fault_injection {
        cfg.service(post("/admin/crash/{actor}", web::post().to(crash)))
            .service(post("/admin/cut/{id}", web::post().to(cut)));
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
/// request came from an origin `http.cors_origins` allows (the server's
/// middleware decides; refusals included, so the page can read why), and
/// `vary: Origin` whenever a list is configured, since the answer then
/// depends on the origin.
pub(crate) fn cors(allowed: Option<header::HeaderValue>, vary: bool, res: &mut HttpResponse) {
    let vary = vary || allowed.is_some();
    if let Some(origin) = allowed {
        res.headers_mut()
            .insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
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
/// It applies the lean path's rules that actix-web does not already: the
/// `server.max_head_bytes` bound (here on the head as actix-web parsed it,
/// request line and header lines with CRLF ends; past it 431 and the
/// connection closed, as on the lean path), no request body on a stream
/// (`Content-Length: 0` is no body), and a close-delimited body for
/// HTTP/1.0, which has no chunked encoding (RFC 9112 §6.1). actix-http
/// itself refuses a repeated `Content-Length`, which the lean path accepts
/// when every value is 0.
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
            .find_map(|v| crate::classify::check_length(v.as_bytes()).err())
            .map(|e| state.head_error(e))
    };
    if let Some(e) = refused {
        state
            .stats
            .bad_heads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return Err(e);
    }
    let s = &state.settings.stream;
    id::validate(&id, s.max_id_len)?;
    if state.shutdown.is_cancelled() {
        return Err(ApiError::ShuttingDown);
    }
    let open = state
        .open_stream(&id, &rebuilt_head(&req), &[])
        .map_err(|refused| refused.error)?;
    if open.req.transport == Transport::Ws {
        state
            .stats
            .bad_heads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Only a first request on a connection is peeked and can become a
        // WebSocket (every WebSocket client opens a connection for it).
        return Err(ApiError::BadWebSocket(
            "a WebSocket upgrade must be the first request on its connection".to_owned(),
        ));
    }
    if !state.stats.try_reserve_stream(s.max_streams) {
        return Err(ApiError::StreamLimit(s.max_streams));
    }
    let sse = open.req.transport == Transport::Sse;
    let close = req.conn_data::<CloseHandle>().cloned();
    let body = Stream::start_body(Arc::from(id.as_str()), open, Arc::clone(&state.streams), close);
    let mut res = HttpResponse::Ok();
    res.content_type(if sse {
        "text/event-stream"
    } else {
        "text/plain; charset=utf-8"
    })
    .insert_header((header::CACHE_CONTROL, "no-cache"))
    .insert_header(("x-accel-buffering", "no"));
    let mut res = res.streaming(body);
    if req.version() == Version::HTTP_10 {
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

/// The head of a request as actix-web parsed it, in HTTP/1.1 form, for the
/// checks the lean path makes on the raw head ([`crate::handshake`]).
fn rebuilt_head(req: &HttpRequest) -> Vec<u8> {
    let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let mut head = format!("{} {target} HTTP/1.1\r\n", req.method()).into_bytes();
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
    authorize(&req, &state)?;
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
    authorize(&req, &state)?;
    let key = idempotency::key_of(&req)?;
    let msg = read_message(&req, body, &state).await?;
    publish(&state, Target::All, &msg, key).await
}

/// Who a publish is for.
enum Target {
    /// Every stream of this id (`/send`).
    Id(String),
    /// Every stream (`/broadcast`).
    All,
}

impl Target {
    /// How an `Idempotency-Key` names the target it is bound to.
    fn name(&self) -> String {
        match self {
            Target::Id(id) => format!("send:{id}"),
            Target::All => "broadcast".to_owned(),
        }
    }
}

/// Publishes `msg`, once per `Idempotency-Key` when one is given (see
/// [`crate::idempotency`]): a repeat within `publish.idempotency_ttl_ms`
/// gets the first answer and delivers nothing.
async fn publish(
    state: &ServerState,
    target: Target,
    msg: &Arc<str>,
    key: Option<String>,
) -> Result<HttpResponse, ApiError> {
    let Some(key) = key else {
        let (status, body) = publish_here_first(state, &target, msg).await?;
        return Ok(HttpResponse::build(status).json(body));
    };
    let request = idempotency::fingerprint(&target.name(), msg);
    if let Some(cluster) = &state.cluster {
        return publish_once(state, cluster, &target, msg, &key, &request).await;
    }
    match state.keys.begin(&key, &request) {
        Begin::Replay(answer) => Ok(replayed(state, answer)),
        Begin::InFlight => Err(ApiError::IdempotencyInFlight),
        Begin::Mismatch => Err(ApiError::IdempotencyKeyReused),
        Begin::Full => Err(ApiError::TooManyKeys),
        Begin::New(ticket) => {
            // A failure (an error, or a full backlog's 503) releases the
            // key: nothing was delivered, so a retry is a first attempt.
            // One process has no bus, so what it answers is a success.
            let (status, body) = publish_here_first(state, &target, msg).await?;
            ticket.finish(&body);
            Ok(HttpResponse::build(status).json(body))
        }
    }
}

/// A keyed cluster publish whose echo did not come back here: this node's
/// streams get it now (always taken, as a message from the bus is).
async fn deliver_here(
    state: &ServerState,
    target: &Target,
    msg: &Arc<str>,
) -> Result<serde_json::Value, ApiError> {
    let accepted = std::time::Instant::now();
    Ok(match target {
        Target::Id(id) => {
            let id = id.clone();
            let msg = Arc::clone(msg);
            let p: Published = taken(
                state,
                Publish {
                    id,
                    msg,
                    accepted,
                    limit: None,
                },
            )
            .await?;
            json!({ "delivered": p.delivered, "event_id": p.event })
        }
        Target::All => {
            let msg = Arc::clone(msg);
            let n: usize = taken(
                state,
                Broadcast {
                    msg,
                    accepted,
                    limit: None,
                },
            )
            .await?;
            json!({ "delivered": n })
        }
    })
}

/// Hands the Router a publish it always takes (`limit: None`).
async fn taken<M, T>(state: &ServerState, m: M) -> Result<T, ApiError>
where
    M: actix::Message<Result = Option<Result<T, Busy>>> + Send + 'static,
    T: Send + 'static,
    Router<Stream>: actix::Handler<M>,
{
    let answer = state.router().send(m).await;
    answer
        .ok()
        .flatten()
        .and_then(Result::ok)
        .ok_or(ApiError::Crashed("router"))
}

/// The first answer to an `Idempotency-Key`, again.
fn replayed(state: &ServerState, answer: serde_json::Value) -> HttpResponse {
    state
        .stats
        .publish_replayed
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    HttpResponse::Ok()
        .insert_header(("idempotent-replayed", "true"))
        .json(answer)
}

/// Delivers to this node's streams (waiting for room in the backlog), then
/// in cluster mode PUBLISHes for the other nodes.
///
/// A 503 from the backlog means nothing was delivered anywhere. A 503 from
/// Redis says so in the answer: this node's streams got the message, and
/// the other nodes' `other_nodes`: "not sent" (the bus was down), or
/// "unknown" (Redis did not answer in time and may still run the PUBLISH;
/// only a retry with an `Idempotency-Key` is then safe).
async fn publish_here_first(
    state: &ServerState,
    target: &Target,
    msg: &Arc<str>,
) -> Result<(StatusCode, serde_json::Value), ApiError> {
    let accepted = std::time::Instant::now();
    let (mut body, delivered) = match target {
        Target::Id(id) => {
            let Published { delivered, event } = admitted(state, 1, |limit| Publish {
                id: id.clone(),
                msg: Arc::clone(msg),
                accepted,
                limit,
            })
            .await?;
            (
                json!({ "id": id, "delivered": delivered, "event_id": event }),
                delivered,
            )
        }
        Target::All => {
            let streams = state.stats.streams_active() as u64;
            let delivered = admitted(state, streams, |limit| Broadcast {
                msg: Arc::clone(msg),
                accepted,
                limit,
            })
            .await?;
            (json!({ "delivered": delivered }), delivered)
        }
    };
    let Some(cluster) = &state.cluster else {
        return Ok((StatusCode::OK, body));
    };
    // This node's own subscription is counted out when it holds the id or
    // lingers on it; every node subscribes to the broadcast channel.
    let (channel, subscribed_here) = match target {
        Target::Id(id) => (
            cluster.names.id_channel(id),
            delivered > 0 || cluster.is_lingering(id),
        ),
        Target::All => (cluster.names.broadcast().to_owned(), true),
    };
    match cluster.publish(channel, msg, subscribed_here).await {
        Ok(nodes) => {
            body["nodes"] = nodes.into();
            Ok((StatusCode::OK, body))
        }
        Err(failed) => {
            body["error"] = ApiError::BusUnavailable.to_string().into();
            body["other_nodes"] = match failed {
                PublishFailed::NotSent => "not sent: the bus is down",
                PublishFailed::Unknown => {
                    "unknown: Redis did not answer in time and may still deliver it; \
                     retry only with an Idempotency-Key"
                }
            }
            .into();
            Ok((StatusCode::SERVICE_UNAVAILABLE, body))
        }
    }
}

/// A publish with an `Idempotency-Key` in cluster mode: the key is claimed
/// in Redis in the same script as the PUBLISH, and this node's streams get
/// the message from its echo, so every node, this one included, delivers
/// it exactly when Redis runs the script, and a retry with the key never
/// delivers it twice, whichever node it reaches.
async fn publish_once(
    state: &ServerState,
    cluster: &cluster::Cluster,
    target: &Target,
    msg: &Arc<str>,
    key: &str,
    request: &str,
) -> Result<HttpResponse, ApiError> {
    wait_for_room(state).await?;
    let (channel, subscribed_here) = match target {
        Target::Id(id) => {
            let holds = state
                .router()
                .send(router::Holds(id.clone()))
                .await
                .map_err(|_| ApiError::Crashed("router"))?;
            (cluster.names.id_channel(id), holds || cluster.is_lingering(id))
        }
        Target::All => (cluster.names.broadcast().to_owned(), true),
    };
    let ttl = Duration::from_millis(state.settings.publish.idempotency_ttl_ms);
    match cluster
        .publish_once(channel, msg, key, request, ttl, subscribed_here)
        .await
    {
        Ok(Once::Mismatch) => Err(ApiError::IdempotencyKeyReused),
        Ok(Once::Repeat(first)) => Ok(replayed(
            state,
            first.unwrap_or_else(|| {
                json!({ "idempotent_replay": true, "note": "accepted once before; its first answer is not recorded (yet)" })
            }),
        )),
        Ok(Once::Fresh { nodes, here, claim }) => {
            let mut body = match here {
                Here::Delivered(body) => body,
                Here::Deliver => deliver_here(state, target, msg).await?,
            };
            if let Target::Id(id) = target {
                body["id"] = id.as_str().into();
            }
            body["nodes"] = nodes.into();
            cluster.remember_answer(key, claim, &body).await;
            Ok(HttpResponse::Ok().json(body))
        }
        Err(failed) => {
            let outcome = match failed {
                PublishFailed::NotSent => "not delivered anywhere: the bus is down; retry",
                PublishFailed::Unknown => {
                    "unknown: Redis did not answer in time; if it runs the publish later, every node \
                     delivers it then; retry with the same Idempotency-Key, which never delivers twice"
                }
            };
            let mut body = json!({ "error": ApiError::BusUnavailable.to_string(), "delivered": 0, "outcome": outcome });
            if let Target::Id(id) = target {
                body["id"] = id.as_str().into();
            }
            Ok(HttpResponse::ServiceUnavailable()
                .insert_header((header::RETRY_AFTER, "1"))
                .json(body))
        }
    }
}

/// How often a publish that found the backlog full asks the Router again.
const BACKLOG_RETRY: Duration = Duration::from_millis(10);

/// Hands a publish (`make(limit)`) to the Router, waiting while the
/// publish backlog is full ([`with_room`]); `need`: about how many
/// deliveries it makes. The Router, one actor, decides each admission, so
/// concurrent publishers cannot overshoot the bound together.
async fn admitted<M, T>(
    state: &ServerState,
    need: u64,
    make: impl Fn(Option<u64>) -> M,
) -> Result<T, ApiError>
where
    M: actix::Message<Result = Option<Result<T, Busy>>> + Send + 'static,
    T: Send + 'static,
    Router<Stream>: actix::Handler<M>,
{
    let limit = Some(state.settings.publish.max_backlog);
    with_room(state, need, async || {
        let answer = state.router().send(make(limit)).await;
        answer.ok().flatten().ok_or(ApiError::Crashed("router"))
    })
    .await
}

/// Waits while this node's publish backlog is full, for a keyed cluster
/// publish, whose delivery here comes from its echo and cannot be refused
/// then ([`with_room`]). Approximate: keyed publishes that find room at
/// the same moment may carry the backlog past the bound together.
async fn wait_for_room(state: &ServerState) -> Result<(), ApiError> {
    with_room(state, 1, async || {
        Ok(if has_room(state, 1) { Ok(()) } else { Err(Busy) })
    })
    .await
}

/// Whether `need` more deliveries would fit in the publish backlog now
/// (an empty one takes anything), read without asking the Router.
fn has_room(state: &ServerState, need: u64) -> bool {
    let backlog = state
        .stats
        .publish_backlog
        .load(std::sync::atomic::Ordering::Relaxed);
    backlog == 0 || backlog + need <= state.settings.publish.max_backlog
}

/// Runs `attempt` until it finds room in the publish backlog, for at most
/// `publish.wait_ms`; then 503 with `Retry-After` (`publish.rejected`),
/// nothing of the message delivered or kept. This is what pushes back on a
/// publisher faster than the streams take its messages. Between attempts
/// it reads the backlog every [`BACKLOG_RETRY`] and tries again only once
/// `need` deliveries would fit, so waiting publishers cost the Router
/// nothing while it catches up.
async fn with_room<T>(
    state: &ServerState,
    need: u64,
    mut attempt: impl AsyncFnMut() -> Result<Result<T, Busy>, ApiError>,
) -> Result<T, ApiError> {
    let publish = &state.settings.publish;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(publish.wait_ms);
    loop {
        if let Ok(done) = attempt().await? {
            return Ok(done);
        }
        loop {
            if tokio::time::Instant::now() + BACKLOG_RETRY > deadline {
                state
                    .stats
                    .publish_rejected
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return Err(ApiError::Backlogged {
                    limit: publish.max_backlog,
                });
            }
            tokio::select! {
                () = state.shutdown.cancelled() => return Err(ApiError::ShuttingDown),
                () = tokio::time::sleep(BACKLOG_RETRY) => {}
            }
            if has_room(state, need) {
                break;
            }
        }
    }
}

/// `GET /dispatcher`
async fn next_count(state: Data<ServerState>) -> Result<HttpResponse, ApiError> {
    let n = state
        .counter
        .send(Take(1))
        .await
        .unwrap_or(Err(ApiError::Crashed("counter")))?;
    Ok(HttpResponse::Ok()
        .content_type("text/plain; charset=utf-8")
        .body(n.to_string()))
}

/// `GET /stats`
async fn stats(state: Data<ServerState>) -> HttpResponse {
    HttpResponse::Ok().json(state.stats_document())
}

/// `GET /metrics`: the same counters in the Prometheus text format.
async fn metrics(state: Data<ServerState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(crate::metrics::CONTENT_TYPE)
        .body(crate::metrics::render(&state.stats, state.cluster.as_ref()))
}

/// `GET /cluster`: every live node (from their heartbeats in Redis) and the
/// totals; without a bus, this node alone.
async fn cluster_view(state: Data<ServerState>) -> Result<HttpResponse, ApiError> {
    let view = match &state.cluster {
        Some(cluster) => cluster.view().await?,
        None => cluster::single_view(&state.stats, &state.addr),
    };
    Ok(HttpResponse::Ok().json(view))
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
    if state.shutdown.is_cancelled() {
        return Err(ApiError::ShuttingDown);
    }
    if let Some(cluster) = &state.cluster
        && !cluster.stats.connected.load(std::sync::atomic::Ordering::Relaxed)
    {
        return Err(ApiError::BusUnavailable);
    }
    Ok(healthz().await)
}

/// `POST /admin/crash/{router|counter|bus}`: makes that actor panic in a handler.
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
        "bus" => match &state.bus {
            Some(bus) => drop(bus.send(cluster::bus::Crash).await),
            None => return Err(ApiError::NotFound),
        },
        _ => return Err(ApiError::NotFound),
    }
    Ok(HttpResponse::Accepted().json(json!({ "crashed": actor.as_str() })))
}

/// `POST /admin/cut/{id}`: every stream of `id` on this node drops its
/// connection at once (no final chunk, no close frame), as a crash or a
/// network failure would: what a client's reconnect and resume must survive.
async fn cut(req: HttpRequest, id: Path<String>, state: Data<ServerState>) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    let n = state
        .router()
        .send(router::CutId(id.into_inner()))
        .await
        .ok()
        .flatten()
        .ok_or(ApiError::Crashed("router"))?;
    Ok(HttpResponse::Ok().json(json!({ "cut": n })))
}

/// Checks `Authorization: Bearer <auth.publish_token>` when a token is set.
///
/// The scheme is case-insensitive (RFC 9110 §11.1), spaces after it are
/// allowed; two `Authorization` headers are refused (400) rather than one
/// of them checked.
fn authorize(req: &HttpRequest, state: &ServerState) -> Result<(), ApiError> {
    let token = &state.settings.auth.publish_token;
    if token.is_empty() {
        return Ok(());
    }
    let mut given = req.headers().get_all(header::AUTHORIZATION);
    let (first, second) = (given.next(), given.next());
    if second.is_some() {
        return Err(ApiError::RepeatedAuthorization);
    }
    let credentials = first
        .and_then(|v| crate::handshake::bearer_credentials(v.as_bytes()))
        .unwrap_or_default();
    if constant_time_eq(credentials, token.as_bytes()) {
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
        () = state.shutdown.cancelled() => return cut(ApiError::ShuttingDown),
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
