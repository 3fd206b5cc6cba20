//! Who gets in: the one admission decision for every stream, lean or
//! fallback ([`Admission::admit_stream`]), and for every publish
//! ([`Admission::admit_publish`]).
//!
//! [`Admission`] owns every input those decisions read, so that a change
//! to who may open a stream or publish is a change here: the limits per
//! client address, the subscriber token verifier, the trusted proxies
//! (who the client is), the CORS rule (`http.cors_origins`), the
//! `stream.max_streams` slots, the publish token with protected mode, and
//! shutdown. Streams keep only the limits' handle, to give a counted place
//! back when they stop.

use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use actix_web::HttpRequest;
use actix_web::http::header;
use tokio_util::sync::CancellationToken;

use crate::backend::Backend;
use crate::config::{HttpSettings, Nets, Settings};
use crate::conn::edge::{self, Client, Limits};
use crate::conn::handshake::StreamRequest;
use crate::conn::handshake::{self, Transport};
use crate::error::{ApiError, Cors, CorsAnswer};
use crate::hooks::{Ask, SubscribeHook};
use crate::hub::cluster::Cluster;
use crate::hub::router::Member;
use crate::jwks::{Jwks, Learned};
use crate::namespace::Namespaces;
use crate::per_id::PerId;
use crate::stats::Stats;
use crate::stream::{Open, Via};
use crate::token::{self, Verdict, Verifier};

/// A stream request refused before any stream state exists.
#[derive(Debug)]
pub(crate) struct Refusal {
    /// Why.
    pub(crate) error: ApiError,
    /// What CORS says to the page's origin, decided at admission (an
    /// allowed origin is named, so the page can read why).
    pub(crate) cors: CorsAnswer,
}

/// An admission decided now, or one that must wait for something first.
pub(crate) enum Admitted {
    /// Admitted: the stream opens.
    Open(Open),
    /// Decided by [`Admission::complete`]: its token names a `kid` not
    /// among the identity provider's keys held (they are fetched again),
    /// or the application's subscribe hook is asked. Boxed: only such
    /// requests pay for its size.
    Later(Box<Pending>),
}

/// A stream request that passed every check up to its token, and waits
/// for the identity provider's keys or the application.
pub(crate) struct Pending {
    id: String,
    /// Its token's `kid`, when not among the keys held: the token is
    /// checked once they are fetched again.
    kid: Option<String>,
    /// Its token's time left, once checked.
    expires: Option<std::time::Duration>,
    /// The subscribe hook's call, unless a yes is remembered.
    ask: Option<Ask>,
    /// Its id's namespace has `max_streams_per_id` and this node is in a
    /// fleet: the other nodes' streams of it are read first.
    elsewhere: bool,
    req: StreamRequest,
    cors: CorsAnswer,
    early: Vec<u8>,
    client: Client,
}

/// A stream request's id, and its streams on the other nodes of a fleet
/// (for `max_streams_per_id`; 0 when not read).
struct IdCount<'a> {
    id: &'a str,
    elsewhere: u64,
}

/// Every input of an admission, shared by `Arc` (in the server's state)
/// between the workers and actix-web's handlers.
pub(crate) struct Admission {
    /// The limits per client address (streams, opening and publishing
    /// rates, TLS handshakes); the streams hold the same handle to give a
    /// counted place back.
    pub(crate) limits: Arc<Limits>,
    /// Checks subscriber tokens (`auth.subscribe_secret`,
    /// `auth.subscribe_public_key_file`, `auth.jwks_url`); `None`: open.
    verifier: Option<Verifier>,
    /// Fetches `auth.jwks_url`'s keys into the verifier's.
    jwks: Option<Arc<Jwks>>,
    /// `hooks.subscribe_url`: the application asked before a stream is
    /// admitted.
    hook: Option<SubscribeHook>,
    /// `[namespaces.<name>]`: whether an id's streams need a token, and
    /// whether the hook is asked.
    namespaces: Namespaces,
    /// `max_streams_per_id`: this node's streams of limited ids (the
    /// streams hold the same handle to give their place back).
    pub(crate) per_id: Arc<PerId>,
    /// Cluster mode: where the other nodes' streams of a limited id are
    /// read.
    cluster: Option<Arc<Cluster>>,
    /// `http.trusted_proxies`, parsed.
    trusted_proxies: Nets,
    /// The `[http]` settings: the CORS rule (`http.cors_origins`).
    http: HttpSettings,
    /// `stream.max_streams`: past it a stream request is refused 503.
    max_streams: usize,
    /// `auth.publish_token`; empty: none.
    publish_token: String,
    /// Protected mode, decided once at start-up: no `auth.publish_token`,
    /// no `auth.publish_open`, and some listener bound beyond loopback.
    /// Publishing is then open to loopback clients only
    /// ([`Admission::authorize`]).
    publish_protected: bool,
    /// Counters for `/stats`: refusals, and the streams open (the
    /// `stream.max_streams` slots).
    stats: Arc<Stats>,
    /// Cancelled once on SIGINT/SIGTERM (or the caller's shutdown future):
    /// accept loops stop, actix-web connections drain, new streams are refused.
    pub(crate) shutdown: CancellationToken,
}

impl Admission {
    /// The admission inputs of `settings`; an invalid `auth.subscribe_secret`
    /// or `auth.subscribe_public_key_file`,
    /// `limits.exempt` or `http.trusted_proxies` is an error naming its key.
    /// `publish_protected` is protected mode as decided from the addresses
    /// bound.
    pub(crate) fn new(
        settings: &Settings,
        stats: Arc<Stats>,
        publish_protected: bool,
        shutdown: CancellationToken,
        backend: Option<&Arc<Backend>>,
        cluster: Option<Arc<Cluster>>,
    ) -> io::Result<Admission> {
        let auth = &settings.auth;
        let invalid =
            |key: &str, e: String| io::Error::new(io::ErrorKind::InvalidInput, format!("{key}: {e}"));
        let public_key = match auth.subscribe_public_key_file.as_str() {
            "" => None,
            path => {
                let pem = std::fs::read(path).map_err(|e| {
                    invalid(
                        "auth.subscribe_public_key_file",
                        format!("cannot read {path}: {e}"),
                    )
                })?;
                Some(
                    crate::token::public_key(&pem)
                        .map_err(|e| invalid("auth.subscribe_public_key_file", format!("{path}: {e}")))?,
                )
            }
        };
        // Checked by `Settings::validate`: http:// or https://.
        let jwks_url = auth.jwks_url.trim();
        if (public_key.is_some() || !jwks_url.is_empty()) && auth.subscribe_audience.is_empty() {
            // An identity provider signs every application's tokens with
            // the same key: without an audience, one minted for another
            // application opens streams here.
            tracing::warn!(
                event = "token_audience_unset",
                "auth.subscribe_public_key_file or auth.jwks_url is set without auth.subscribe_audience: \
                 a token the identity provider signed for any application it serves is taken"
            );
        }
        let other_key = public_key.is_some() || !auth.subscribe_secret.is_empty();
        let verifier = match (auth.subscribe_secret.as_str(), public_key, jwks_url) {
            ("", None, "") => None,
            (secret, public_key, url) => Some(
                Verifier::new(
                    secret,
                    public_key,
                    !url.is_empty(),
                    &auth.subscribe_audience,
                    &auth.subscribe_issuer,
                )
                .map_err(|e| invalid("auth.subscribe_secret", e))?,
            ),
        };
        let hook_url = settings.hooks.subscribe_url.trim();
        let hook = match (backend, hook_url) {
            (Some(backend), url) if !url.is_empty() => Some(SubscribeHook::new(
                &settings.hooks,
                Arc::clone(backend),
                Arc::clone(&stats),
            )),
            _ => None,
        };
        let jwks = match (verifier.as_ref().and_then(Verifier::jwks), backend) {
            (None, _) | (_, None) => None,
            (Some(keys), Some(backend)) => {
                let backend = Arc::clone(backend);
                let refresh = std::time::Duration::from_millis(auth.jwks_refresh_ms);
                let (jwks, first) =
                    Jwks::start(jwks_url, refresh, Arc::clone(keys), backend, Arc::clone(&stats));
                match first {
                    Ok(_) => {}
                    // Logged by the fetch (`jwks_fetch_failed`); the keys
                    // come with a later one.
                    Err(_) if other_key => {}
                    Err(why) => {
                        return Err(invalid(
                            "auth.jwks_url",
                            format!(
                                "the identity provider's keys could not be fetched from {jwks_url} ({why}), \
                                 and no other key (auth.subscribe_secret, auth.subscribe_public_key_file) \
                                 is configured to check tokens with"
                            ),
                        ));
                    }
                }
                Some(jwks)
            }
        };
        let limits = Arc::new(Limits::new(&settings.limits).map_err(|e| invalid("limits.exempt", e))?);
        let trusted_proxies =
            Nets::parse(&settings.http.trusted_proxies).map_err(|e| invalid("http.trusted_proxies", e))?;
        Ok(Admission {
            limits,
            verifier,
            jwks,
            hook,
            namespaces: Namespaces::new(settings),
            per_id: Arc::new(PerId::new(settings, Arc::clone(&stats))),
            cluster,
            trusted_proxies,
            http: settings.http.clone(),
            max_streams: settings.stream.max_streams,
            publish_token: auth.publish_token.clone(),
            publish_protected,
            stats,
            shutdown,
        })
    }

    /// Whether `http.trusted_proxies` names any proxy.
    pub(crate) fn trusts_proxies(&self) -> bool {
        !self.trusted_proxies.is_empty()
    }

    /// The client's address for an actix-web request: the socket's peer
    /// or the PROXY header's source ([`Rewound`]), or, from a trusted
    /// proxy, what its `X-Forwarded-For` says.
    ///
    /// [`Rewound`]: crate::conn::socket::Rewound
    pub(crate) fn client_of(&self, req: &HttpRequest) -> Client {
        let proxied = req.conn_data::<crate::conn::socket::Proxied>().is_some();
        let peer = req.peer_addr().map_or(IpAddr::from([0, 0, 0, 0]), |a| a.ip());
        let ip = edge::forwarded_for(
            peer,
            &self.trusted_proxies,
            req.headers().get_all("x-forwarded-for").map(|v| v.as_bytes()),
        );
        Client::new(ip, proxied || ip.to_canonical() != peer.to_canonical())
    }

    /// The client's address for a lean stream: `peer` (the socket's, or
    /// the PROXY header's source: `proxied`), or from a trusted proxy what
    /// the head's `X-Forwarded-For` says.
    pub(crate) fn client_of_head(&self, peer: IpAddr, proxied: bool, head: &[u8]) -> Client {
        if self.trusted_proxies.is_empty() {
            return Client::new(peer, proxied);
        }
        let ip = edge::forwarded_for(
            peer,
            &self.trusted_proxies,
            edge::header_values(head, b"x-forwarded-for"),
        );
        Client::new(ip, proxied || ip.to_canonical() != peer.to_canonical())
    }

    /// The CORS headers of a stream's answer to a page from `origin`:
    /// decided once per stream request, at its admission, and carried to
    /// whichever answer it gets.
    pub(crate) fn cors<'a>(&self, origin: Option<&'a str>) -> Cors<'a> {
        Cors {
            allow: origin.filter(|o| self.http.allows_origin(o.as_bytes())),
            vary: self.http.cors_enabled(),
        }
    }

    /// A refusal of a stream request, counted (`tokens_refused`,
    /// `origins_refused`, or `bad_heads`), answered with `cors` (as
    /// [`Admission::cors`] decided it).
    pub(crate) fn refusal(&self, error: ApiError, cors: Cors<'_>) -> Refusal {
        let counter = match error {
            ApiError::BadToken(_) => Some(&self.stats.tokens_refused),
            ApiError::OriginNotAllowed => Some(&self.stats.origins_refused),
            // Counted where they are decided (`limits.refused`).
            ApiError::ShuttingDown | ApiError::StreamLimit(_) | ApiError::OverLimit { .. } => None,
            ApiError::KeysUnavailable(_) => Some(&self.stats.jwks_kid_unavailable),
            // Counted by the hook.
            ApiError::HookRefused { .. } | ApiError::HookUnavailable(_) | ApiError::HookBusy(_) => None,
            _ => Some(&self.stats.bad_heads),
        };
        if let Some(counter) = counter {
            counter.fetch_add(1, Relaxed);
        }
        Refusal {
            error,
            cors: cors.into(),
        }
    }

    /// The one admission decision for a stream of `id`, lean or fallback
    /// (`via`), whose whole head (validated) is `head`, with `early` the
    /// bytes the client sent right behind it, in this order: shutdown (503),
    /// the client address's opening rate (429: every stream request spends
    /// one, refused later or not), one `Origin` at most, its transport, HTTP
    /// version and resume point ([`handshake::read_request`]), its page
    /// origin (a WebSocket's, against `http.cors_origins`), its subscriber token
    /// when a subscriber key is set, a WebSocket only as a
    /// connection's first request (on the lean path), then a
    /// `stream.max_streams` slot, which it takes (given back when the
    /// stream stops). Refusals are counted ([`Admission::refusal`]).
    ///
    /// A token whose `kid` names none of the identity provider's keys held
    /// is decided later ([`Admitted::Later`], [`Admission::complete`]).
    pub(crate) fn admit_stream(
        &self,
        id: &str,
        head: &[u8],
        early: &[u8],
        via: Via,
        client: Client,
    ) -> Result<Admitted, Refusal> {
        // The origin first, read once, and what CORS says to it decided
        // once, so that every answer after it, refusal or stream, names it.
        // Two `Origin` headers leave the page unknown: none is named, and
        // the request is refused after the opening rate.
        let origin = handshake::origin(head);
        let page = origin.as_ref().ok().copied().flatten();
        let cors = self.cors(page);
        let refused = |error: ApiError| self.refusal(error, cors);
        // Shutting down: whatever else is wrong, the answer is "go elsewhere".
        if self.shutdown.is_cancelled() {
            return Err(refused(ApiError::ShuttingDown));
        }
        // The opening rate first: a flood of bad tokens counts too.
        let limits = &self.limits;
        limits.admit_open(client).map_err(refused)?;
        if let Err(repeated) = origin {
            return Err(refused(repeated));
        }
        let req = handshake::read_request(head).map_err(refused)?;
        // Browsers apply no CORS to WebSockets: the server checks the
        // origin itself, once a list is configured (`vary`).
        if req.transport == Transport::Ws && cors.vary && page.is_some() && cors.allow.is_none() {
            return Err(refused(ApiError::OriginNotAllowed));
        }
        // Its namespace's rules (the server's, outside every namespace).
        let policy = self.namespaces.of(id);
        let (expires, kid) = match &self.verifier {
            None => (None, None),
            Some(verifier) => match req.token.as_deref() {
                // `token_required = false`: open, unless a token is given
                // (then it is checked, and ends the stream).
                None if !policy.token_required => (None, None),
                None => {
                    return Err(refused(ApiError::BadToken(
                        "none given: use ?token=<jwt> or Authorization: Bearer <jwt>".to_owned(),
                    )));
                }
                Some(token) => match verifier.verify(token, id) {
                    Verdict::Valid(left) => (Some(left), None),
                    Verdict::Refused(why) => return Err(refused(ApiError::BadToken(why))),
                    Verdict::UnknownKid(kid) => (None, Some(kid)),
                },
            },
        };
        if req.transport == Transport::Ws && via == Via::Fallback {
            // Only a first request on a connection is peeked and can become a
            // WebSocket (every WebSocket client opens a connection for it).
            return Err(refused(ApiError::BadWebSocket(
                "a WebSocket upgrade must be the first request on its connection".to_owned(),
            )));
        }
        // The application's hook: the claims it is given are those of a
        // token checked already, or checked before the call (a `kid` not
        // held); a token nobody checks (no key configured) gives none.
        let checked = self.verifier.is_some();
        let ask = self
            .hook
            .as_ref()
            .filter(|_| policy.subscribe_hook)
            .and_then(|hook| {
                let token = req.token.as_deref();
                let claims = token.filter(|_| checked).and_then(token::claims_of);
                hook.ask_for(id, req.transport, client.ip, token, claims, head)
            });
        let elsewhere = self.cluster.is_some() && self.per_id.limit(id) > 0;
        if kid.is_none() && ask.is_none() && !elsewhere {
            return self
                .open(
                    IdCount { id, elsewhere: 0 },
                    req,
                    cors,
                    expires,
                    early.to_vec(),
                    client,
                )
                .map(Admitted::Open);
        }
        Ok(Admitted::Later(Box::new(Pending {
            id: id.to_owned(),
            kid,
            expires,
            ask,
            elsewhere,
            req,
            cors: cors.into(),
            early: early.to_vec(),
            client,
        })))
    }

    /// A stream request [`Admission::admit_stream`] could not decide at
    /// once ([`Admitted::Later`]), decided: a token whose `kid` was not
    /// held is checked once the identity provider's keys are fetched again
    /// (at most [`crate::jwks::REFETCH_EVERY`] after the last fetch,
    /// waited for at most [`crate::jwks::KID_WAIT`]): a `kid` still
    /// unknown is refused 401, keys that could not be fetched 503 with
    /// `Retry-After`. Then the application's subscribe hook is asked
    /// ([`SubscribeHook::ask`]), and the rest of the admission decided.
    pub(crate) async fn complete(&self, pending: Box<Pending>) -> Result<Open, Refusal> {
        let Pending {
            id,
            kid,
            mut expires,
            ask,
            elsewhere,
            req,
            cors,
            early,
            client,
        } = *pending;
        let refused = |error: ApiError| self.refusal(error, cors.as_cors());
        if let Some(kid) = kid {
            let token = req.token.as_deref().unwrap_or_default();
            let (Some(verifier), Some(jwks)) = (&self.verifier, &self.jwks) else {
                return Err(refused(ApiError::BadToken(token::kid_not_listed(&kid))));
            };
            let Some(learned) = self.unless_shut_down(jwks.learn(&kid)).await else {
                return Err(refused(ApiError::ShuttingDown));
            };
            if let Learned::Unreachable(why) = learned {
                return Err(refused(ApiError::KeysUnavailable(why)));
            }
            expires = Some(
                verifier
                    .check(token, &id)
                    .map_err(|why| refused(ApiError::BadToken(why)))?,
            );
        }
        if let (Some(hook), Some(ask)) = (&self.hook, ask) {
            let Some(answer) = self.unless_shut_down(hook.ask(ask)).await else {
                return Err(refused(ApiError::ShuttingDown));
            };
            answer.map_err(refused)?;
        }
        // The other nodes' streams of a limited id, as of their last
        // heartbeat; if Redis cannot say, this node's count decides.
        let mut others = 0;
        if let (true, Some(cluster)) = (elsewhere, &self.cluster) {
            match self.unless_shut_down(cluster.streams_elsewhere(&id)).await {
                None => return Err(refused(ApiError::ShuttingDown)),
                Some(Ok(n)) => others = n,
                Some(Err(_)) => self.per_id.unchecked(),
            }
        }
        let target = IdCount {
            id: &id,
            elsewhere: others,
        };
        self.open(target, req, cors.as_cors(), expires, early, client)
    }

    /// `wait`'s outcome, or `None` once the server shuts down first (the
    /// request is then answered 503 at once instead of its socket closing
    /// with the process; the call waited for is dropped, which aborts it).
    async fn unless_shut_down<T>(&self, wait: impl std::future::Future<Output = T>) -> Option<T> {
        tokio::select! {
            biased;
            () = self.shutdown.cancelled() => None,
            outcome = wait => Some(outcome),
        }
    }

    /// The last steps of an admission: the client address's count of
    /// streams, and a `stream.max_streams` slot.
    fn open(
        &self,
        IdCount { id, elsewhere }: IdCount<'_>,
        req: StreamRequest,
        cors: Cors<'_>,
        expires: Option<std::time::Duration>,
        early: Vec<u8>,
        client: Client,
    ) -> Result<Open, Refusal> {
        let refused = |error: ApiError| self.refusal(error, cors);
        let limits = &self.limits;
        // Its id's streams (429), with `elsewhere` on other nodes.
        self.per_id.take(id, elsewhere).map_err(refused)?;
        // The client's address: its count (429).
        let counted = match limits.count_stream(client) {
            Ok(counted) => counted,
            Err(e) => {
                self.per_id.closed(id);
                return Err(refused(e));
            }
        };
        let max = self.max_streams;
        if !self.stats.try_reserve_stream(max) {
            if let Some(slot) = counted {
                limits.stream_closed(slot);
            }
            self.per_id.closed(id);
            return Err(refused(ApiError::StreamLimit(max)));
        }
        let member = self.member_of(id, req.token.as_deref());
        Ok(Open {
            req,
            cors: cors.into(),
            expires,
            early,
            counted,
            member,
        })
    }

    /// A stream of `id` is a member the Router keeps, with its token's
    /// `sub` (a token checked: there is a key), when its namespace sends
    /// `stream_joined` or `stream_left`, or has `presence_events`.
    fn member_of(&self, id: &str, token: Option<&str>) -> Option<Box<Member>> {
        let policy = self.namespaces.of(id);
        let (webhooks, presence) = (policy.events.streams(), policy.presence_events);
        if !webhooks && !presence {
            return None;
        }
        let sub = token
            .filter(|_| self.verifier.is_some())
            .and_then(token::claims_of)
            .and_then(|claims| claims.get("sub")?.as_str().map(Arc::from));
        Some(Box::new(Member {
            sub,
            webhooks,
            presence,
        }))
    }

    /// What a `/send` or `/broadcast` passes before its body is read, in
    /// this order: who may publish ([`Admission::authorize`]: 400, 401,
    /// 403), then the client address's publishing rate (429).
    pub(crate) fn admit_publish(&self, req: &HttpRequest) -> Result<(), ApiError> {
        self.authorize(req)?;
        self.limits.admit_publish(self.client_of(req))
    }

    /// Who may publish (and see `/presence`, `/admin/*`, `/stats`'
    /// `limits.refusing`): with `auth.publish_token` set, a request with
    /// `Authorization: Bearer <token>` (401 otherwise); without one, anyone,
    /// except in protected mode (`Admission::publish_protected`), where a
    /// client that is not loopback is refused 403 with the two ways out.
    ///
    /// The client is the one the `[limits]` see ([`Admission::client_of`]):
    /// behind a proxy that passes it on (PROXY protocol, a trusted
    /// `X-Forwarded-For`), the real client, not the proxy on loopback.
    pub(crate) fn authorize(&self, req: &HttpRequest) -> Result<(), ApiError> {
        let token = &self.publish_token;
        if token.is_empty() {
            if self.publish_protected && !is_loopback(self.client_of(req)) {
                return Err(ApiError::PublishProtected);
            }
            return Ok(());
        }
        if bearer_is(req, token)? {
            Ok(())
        } else {
            Err(ApiError::Unauthorized)
        }
    }
}

/// A loopback client: its socket's peer is a loopback address. An
/// address a PROXY header or `X-Forwarded-For` claims never counts (as
/// for the limits' exemptions): whoever reaches the proxy could claim it.
fn is_loopback(client: Client) -> bool {
    client.ip.is_loopback() && !client.claimed
}

/// Whether the request's `Authorization: Bearer` credentials are `token`
/// (compared in constant time).
///
/// The scheme is case-insensitive (RFC 9110 §11.1), spaces after it are
/// allowed; two `Authorization` headers are refused (400) rather than one
/// of them checked.
pub(crate) fn bearer_is(req: &HttpRequest, token: &str) -> Result<bool, ApiError> {
    let mut given = req.headers().get_all(header::AUTHORIZATION);
    let (first, second) = (given.next(), given.next());
    if second.is_some() {
        return Err(ApiError::RepeatedAuthorization);
    }
    let credentials = first
        .and_then(|v| token::bearer_credentials(v.as_bytes()))
        .unwrap_or_default();
    Ok(token::constant_time_eq(credentials, token.as_bytes()))
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, SocketAddr};
    use std::time::Duration;

    use actix_web::http::StatusCode;
    use actix_web::{ResponseError, test::TestRequest};

    use super::*;

    /// A client on the documentation network: never exempt from limits.
    const REMOTE: [u8; 4] = [192, 0, 2, 7];

    fn remote() -> Client {
        Client::new(IpAddr::from(REMOTE), false)
    }

    fn admission(edit: impl FnOnce(&mut Settings), protected: bool) -> Admission {
        let mut settings = Settings::defaults();
        edit(&mut settings);
        Admission::new(
            &settings,
            Arc::new(Stats::new()),
            protected,
            CancellationToken::new(),
            Backend::of(&settings.endpoints()).unwrap().as_ref(),
            None,
        )
        .unwrap()
    }

    fn head(path: &str, extra: &str) -> Vec<u8> {
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n").into_bytes()
    }

    fn refused(a: &Admission, head: &[u8], via: Via) -> (StatusCode, String) {
        match a.admit_stream("a", head, b"", via, remote()) {
            Ok(_) => panic!("admitted: {}", String::from_utf8_lossy(head)),
            Err(r) => (r.error.status_code(), r.error.to_string()),
        }
    }

    #[test]
    fn shutdown_refuses_before_anything_else_is_read() {
        let a = admission(|s| s.auth.subscribe_secret = "s".repeat(32), false);
        a.shutdown.cancel();
        // No token, two origins: still "go elsewhere".
        let h = head("/test/a", "Origin: http://a\r\nOrigin: http://b\r\n");
        assert_eq!(refused(&a, &h, Via::Lean).0, StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn a_refused_request_still_spends_its_opening_rate() {
        let a = admission(
            |s| {
                s.auth.subscribe_secret = "s".repeat(32);
                s.limits.stream_opens_per_ip_per_s = 1;
                s.limits.stream_opens_burst = 1;
            },
            false,
        );
        let h = head("/test/a", "");
        let (status, why) = refused(&a, &h, Via::Lean);
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{why}");
        assert!(why.contains("none given"), "{why}");
        // The second, within the second, is over the rate: 429, not 401.
        assert_eq!(refused(&a, &h, Via::Lean).0, StatusCode::TOO_MANY_REQUESTS);
    }

    #[test]
    fn two_origins_are_refused_and_no_origin_is_named() {
        let a = admission(|s| s.http.cors_origins = "http://a".to_owned(), false);
        let h = head("/test/a", "Origin: http://a\r\nOrigin: http://a\r\n");
        let Err(r) = a.admit_stream("a", &h, b"", Via::Lean, remote()) else {
            panic!("admitted");
        };
        assert_eq!(r.error.status_code(), StatusCode::BAD_REQUEST);
        assert_eq!(r.cors.as_cors().allow, None);
    }

    #[test]
    fn a_refusal_names_an_allowed_origin_and_only_an_allowed_one() {
        let a = admission(
            |s| {
                s.http.cors_origins = "http://good".to_owned();
                s.auth.subscribe_secret = "s".repeat(32);
            },
            false,
        );
        for (origin, named) in [("http://good", Some("http://good")), ("http://evil", None)] {
            let h = head("/test/a", &format!("Origin: {origin}\r\n"));
            let Err(r) = a.admit_stream("a", &h, b"", Via::Lean, remote()) else {
                panic!("admitted without a token");
            };
            assert_eq!(r.error.status_code(), StatusCode::UNAUTHORIZED);
            assert_eq!(r.cors.as_cors().allow, named, "{origin}");
            assert!(r.cors.as_cors().vary);
        }
    }

    #[test]
    fn a_websocket_from_a_page_not_listed_is_refused_403() {
        let a = admission(|s| s.http.cors_origins = "http://good".to_owned(), false);
        let ws = "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\
                  Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";
        let h = head("/test/a", &format!("{ws}Origin: http://evil\r\n"));
        assert_eq!(refused(&a, &h, Via::Lean).0, StatusCode::FORBIDDEN);
        // From a listed page, admitted; as a fallback request, refused.
        let h = head("/test/a", &format!("{ws}Origin: http://good\r\n"));
        assert!(a.admit_stream("a", &h, b"", Via::Lean, remote()).is_ok());
        let (status, why) = refused(&a, &h, Via::Fallback);
        assert_eq!(status, StatusCode::BAD_REQUEST, "{why}");
        assert!(why.contains("first request"), "{why}");
    }

    #[test]
    fn a_valid_token_admits_and_its_lifetime_is_carried() {
        let secret = "s".repeat(32);
        let a = admission(|s| s.auth.subscribe_secret = secret.clone(), false);
        let token = token::mint(&secret, &["a".to_owned()], Duration::from_secs(60)).unwrap();
        let h = head(&format!("/test/a?token={token}"), "");
        let Ok(Admitted::Open(open)) = a.admit_stream("a", &h, b"tail", Via::Lean, remote()) else {
            panic!("not admitted at once");
        };
        let left = open.expires.expect("a token's lifetime");
        assert!(
            left <= Duration::from_secs(60) && left > Duration::from_secs(50),
            "{left:?}"
        );
        assert_eq!(open.early, b"tail");
        // The same token does not open another id.
        let Err(r) = a.admit_stream("b", &h, b"", Via::Lean, remote()) else {
            panic!("a token for a opened b");
        };
        assert_eq!(r.error.status_code(), StatusCode::UNAUTHORIZED);
    }

    #[test]
    fn past_max_streams_a_stream_is_refused_and_its_address_count_given_back() {
        let a = admission(
            |s| {
                s.stream.max_streams = 1;
                s.limits.streams_per_ip = 1;
            },
            false,
        );
        let h = head("/test/a", "");
        let Ok(Admitted::Open(first)) = a.admit_stream("a", &h, b"", Via::Lean, remote()) else {
            panic!("not admitted at once");
        };
        assert!(first.counted.is_some());
        // Another address: the server-wide cap refuses it (503) ...
        let other = Client::new(IpAddr::from([192, 0, 2, 8]), false);
        let Err(r) = a.admit_stream("a", &h, b"", Via::Lean, other) else {
            panic!("past max_streams");
        };
        assert_eq!(r.error.status_code(), StatusCode::SERVICE_UNAVAILABLE);
        // ... and gives its address's place back: once the first stream's
        // reservation is released, that address opens one.
        a.stats.stream_closed(Duration::ZERO);
        a.limits.stream_closed(first.counted.unwrap());
        assert!(a.admit_stream("a", &h, b"", Via::Lean, other).is_ok());
    }

    fn publish(peer: [u8; 4], auth: Option<&str>) -> actix_web::HttpRequest {
        let mut req = TestRequest::post()
            .uri("/send/a")
            .peer_addr(SocketAddr::from((peer, 40000)));
        if let Some(auth) = auth {
            req = req.insert_header(("Authorization", auth));
        }
        req.to_http_request()
    }

    #[test]
    fn protected_mode_lets_only_loopback_publish() {
        let a = admission(|_| {}, true);
        assert!(a.admit_publish(&publish([127, 0, 0, 1], None)).is_ok());
        let e = a.admit_publish(&publish(REMOTE, None)).unwrap_err();
        assert_eq!(e.status_code(), StatusCode::FORBIDDEN);
        assert!(e.to_string().contains("auth.publish_token"), "{e}");
        // Not protected: anyone.
        assert!(
            admission(|_| {}, false)
                .admit_publish(&publish(REMOTE, None))
                .is_ok()
        );
    }

    #[test]
    fn a_publish_token_is_asked_of_everyone_loopback_included() {
        let a = admission(|s| s.auth.publish_token = "t0ken".to_owned(), true);
        for peer in [[127, 0, 0, 1], REMOTE] {
            assert_eq!(
                a.admit_publish(&publish(peer, None)).unwrap_err().status_code(),
                StatusCode::UNAUTHORIZED
            );
            assert_eq!(
                a.admit_publish(&publish(peer, Some("Bearer wrong")))
                    .unwrap_err()
                    .status_code(),
                StatusCode::UNAUTHORIZED
            );
            assert!(a.admit_publish(&publish(peer, Some("bearer  t0ken"))).is_ok());
        }
    }

    #[test]
    fn the_publishing_rate_applies_after_who_may_publish() {
        let a = admission(
            |s| {
                s.auth.publish_token = "t0ken".to_owned();
                s.limits.publishes_per_ip_per_s = 1;
                s.limits.publishes_burst = 1;
            },
            false,
        );
        // Refused for its token: no rate spent.
        for _ in 0..3 {
            assert_eq!(
                a.admit_publish(&publish(REMOTE, None)).unwrap_err().status_code(),
                StatusCode::UNAUTHORIZED
            );
        }
        assert!(a.admit_publish(&publish(REMOTE, Some("Bearer t0ken"))).is_ok());
        assert_eq!(
            a.admit_publish(&publish(REMOTE, Some("Bearer t0ken")))
                .unwrap_err()
                .status_code(),
            StatusCode::TOO_MANY_REQUESTS
        );
    }
}
