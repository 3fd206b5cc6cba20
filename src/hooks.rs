//! The subscribe hook (`hooks.subscribe_url`): the application decides
//! whether a stream request is admitted, after its token is checked and
//! before any stream state exists.
//!
//! A call is a POST of `{"id", "transport", "client", "claims", "headers"}`
//! on the backend thread's keep-alive pool ([`Backend`]). 2xx admits; 401
//! or 403 refuses with that status and the application's `reason`;
//! anything else (another status, a redirect, an answer over
//! [`MAX_ANSWER`], an error, no answer within `hooks.timeout_ms`) is a
//! failure, which `hooks.on_failure` decides. At most
//! `hooks.max_in_flight` calls run at once; past it, 503. A yes is
//! remembered for `hooks.cache_ms` per request as the application saw it
//! (id, transport, client address, token, forwarded headers), by their
//! SHA-256.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::backend::{self, Backend};
use crate::config::{HookSettings, OnHookFailure};
use crate::conn::handshake::Transport;
use crate::error::ApiError;
use crate::stats::Stats;

/// The largest answer read; a longer one is a failure.
pub(crate) const MAX_ANSWER: usize = 64 * 1024;

/// Most admissions remembered at once (`hooks.cache_ms`); past it, expired
/// ones are swept, and if none is, a new one is not remembered.
const MAX_REMEMBERED: usize = 100_000;

/// The longest reason of the application's passed on to the client.
const MAX_REASON: usize = 512;

/// Most calls on the wire at once, each on a connection of the keep-alive
/// pool: the others wait for one (within `hooks.timeout_ms`). A burst of
/// stream requests then reuses warm connections instead of opening one per
/// call (a thousand connections set up at once, and as many open files).
pub(crate) const CONNECTIONS: usize = 64;

/// The subscribe hook, shared by every worker.
pub(crate) struct SubscribeHook {
    url: String,
    /// Header names passed on, lowercase.
    forward: Vec<String>,
    timeout: Duration,
    on_failure: OnHookFailure,
    max_in_flight: usize,
    /// `hooks.max_in_flight` permits.
    in_flight: tokio::sync::Semaphore,
    remember: Duration,
    /// Admissions remembered: the (id, credentials) digest, and until when.
    remembered: Mutex<HashMap<[u8; 32], Instant>>,
    /// [`CONNECTIONS`] permits.
    wire: Arc<tokio::sync::Semaphore>,
    backend: Arc<Backend>,
    stats: Arc<Stats>,
}

/// What a hook call is about, gathered at admission.
pub(crate) struct Ask {
    /// The JSON body.
    body: Vec<u8>,
    /// The (id, credentials) digest a yes is remembered by.
    key: [u8; 32],
}

/// Aborts a call on the backend thread when dropped (a call that ended
/// is not affected).
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How a call ended, before `hooks.on_failure`.
enum Answer {
    Yes,
    No { status: u16, reason: String },
    Failed(String),
}

impl SubscribeHook {
    /// The hook of `settings` (its URL set and checked), calling from
    /// `backend`.
    pub(crate) fn new(settings: &HookSettings, backend: Arc<Backend>, stats: Arc<Stats>) -> SubscribeHook {
        SubscribeHook {
            url: settings.subscribe_url.trim().to_owned(),
            forward: settings
                .forward_headers
                .split(',')
                .map(|h| h.trim().to_ascii_lowercase())
                .filter(|h| !h.is_empty())
                .collect(),
            timeout: Duration::from_millis(settings.timeout_ms),
            on_failure: settings.on_failure,
            max_in_flight: settings.max_in_flight,
            in_flight: tokio::sync::Semaphore::new(settings.max_in_flight),
            remember: Duration::from_millis(settings.cache_ms),
            remembered: Mutex::new(HashMap::new()),
            wire: Arc::new(tokio::sync::Semaphore::new(CONNECTIONS)),
            backend,
            stats,
        }
    }

    /// The call for a stream request of `id` on `transport` from `client`,
    /// with its token's `claims` (verified; `None`: no token) and `token`,
    /// the forwarded headers read from `head`; `None` when a yes for the
    /// same id and credentials is remembered.
    pub(crate) fn ask_for(
        &self,
        id: &str,
        transport: Transport,
        client: std::net::IpAddr,
        token: Option<&str>,
        claims: Option<serde_json::Value>,
        head: &[u8],
    ) -> Option<Ask> {
        let transport = match transport {
            Transport::Plain => "chunked",
            Transport::Sse => "sse",
            Transport::Ws => "ws",
            Transport::Poll => "poll",
        };
        let client = client.to_canonical().to_string();
        // Everything the application is told is in the digest: a yes is
        // remembered for the same request from the same address only.
        let mut headers = serde_json::Map::new();
        let mut digest = Sha256::new();
        for part in [id, transport, &client, token.unwrap_or_default()] {
            digest.update(part.as_bytes());
            digest.update([0]);
        }
        for name in &self.forward {
            let values: Vec<String> = crate::conn::edge::header_values(head, name.as_bytes())
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .collect();
            if values.is_empty() {
                continue;
            }
            let joined = values.join(if name == "cookie" { "; " } else { ", " });
            digest.update([0]);
            digest.update(name.as_bytes());
            digest.update([0]);
            digest.update(joined.as_bytes());
            headers.insert(name.clone(), joined.into());
        }
        let key: [u8; 32] = digest.finalize().into();
        if self.remembers(&key) {
            self.stats.hook_remembered.fetch_add(1, Relaxed);
            return None;
        }
        let body = serde_json::json!({
            "id": id,
            "transport": transport,
            "client": client,
            "claims": claims,
            "headers": headers,
        });
        Some(Ask {
            body: body.to_string().into_bytes(),
            key,
        })
    }

    fn remembers(&self, key: &[u8; 32]) -> bool {
        if self.remember.is_zero() {
            return false;
        }
        let remembered = self
            .remembered
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        remembered.get(key).is_some_and(|until| *until > Instant::now())
    }

    fn remember(&self, key: [u8; 32]) {
        if self.remember.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut remembered = self
            .remembered
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if remembered.len() >= MAX_REMEMBERED {
            remembered.retain(|_, until| *until > now);
            if remembered.len() >= MAX_REMEMBERED {
                return;
            }
        }
        remembered.insert(key, now + self.remember);
    }

    /// Asks the application: `Ok` admits (its yes, or a failure that
    /// `hooks.on_failure = "admit"` lets through), `Err` refuses (its 401
    /// or 403 with its reason, a failure with 503, too many calls at once
    /// with 503). Counted and timed.
    pub(crate) async fn ask(&self, ask: Ask) -> Result<(), ApiError> {
        let stats = &self.stats;
        // Its place among `hooks.max_in_flight`, given back when dropped
        // (also when the stream request's future is).
        let Ok(_place) = self.in_flight.try_acquire() else {
            stats.hook_busy.fetch_add(1, Relaxed);
            return Err(ApiError::HookBusy(self.max_in_flight));
        };
        stats.hook_calls.fetch_add(1, Relaxed);
        let started = Instant::now();
        let call = self.backend.spawn(call(
            self.backend.client().clone(),
            Arc::clone(&self.wire),
            self.url.clone(),
            ask.body,
            self.timeout,
        ));
        // The backend bounds the call by the same timeout; this bound is
        // for a backend thread that does not get to it. The call is
        // aborted when nobody waits for it any more (this future dropped:
        // the request's handler, or shutdown), so it gives its connection
        // back at once.
        let _abort = AbortOnDrop(call.abort_handle());
        let answer = match tokio::time::timeout(self.timeout + Duration::from_millis(100), call).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => Answer::Failed(format!("the call failed ({e})")),
            Err(_) => Answer::Failed(format!("no answer within {} ms", self.timeout.as_millis())),
        };
        stats.hook_seconds.observe(started.elapsed());
        match answer {
            Answer::Yes => {
                stats.hook_admitted.fetch_add(1, Relaxed);
                self.remember(ask.key);
                Ok(())
            }
            Answer::No { status, reason } => {
                stats.hook_refused.fetch_add(1, Relaxed);
                Err(ApiError::HookRefused { status, reason })
            }
            Answer::Failed(why) => {
                stats.hook_failures.fetch_add(1, Relaxed);
                let admit = self.on_failure == OnHookFailure::Admit;
                tracing::warn!(
                    event = "hook_failed",
                    url = %crate::config::redact_endpoint(&self.url),
                    error = %why,
                    admitted = admit,
                    "the subscribe hook failed; hooks.on_failure decides"
                );
                if admit {
                    stats.hook_failures_admitted.fetch_add(1, Relaxed);
                    Ok(())
                } else {
                    Err(ApiError::HookUnavailable(why))
                }
            }
        }
    }
}

/// One call, on the backend thread, once a connection is free: what the
/// application answered within `timeout` (the wait for a connection
/// included).
async fn call(
    client: reqwest::Client,
    wire: Arc<tokio::sync::Semaphore>,
    url: String,
    body: Vec<u8>,
    timeout: Duration,
) -> Answer {
    let deadline = Instant::now() + timeout;
    let late = || Answer::Failed(format!("no answer within {} ms", timeout.as_millis()));
    let waited = tokio::time::timeout_at(deadline.into(), wire.acquire_owned()).await;
    let Ok(Ok(_connection)) = waited else {
        return late();
    };
    let sent = client
        .post(&url)
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .timeout(deadline.saturating_duration_since(Instant::now()))
        .body(body)
        .send()
        .await;
    let response = match sent {
        Ok(response) => response,
        Err(e) if e.is_timeout() => return late(),
        Err(e) => return Answer::Failed(backend::request_error(e)),
    };
    let status = response.status();
    // Read whole (bounded), so the connection goes back to the pool.
    let body = match backend::body_within(response, MAX_ANSWER).await {
        Ok(body) => body,
        Err(why) => return Answer::Failed(why),
    };
    match status.as_u16() {
        200..=299 => Answer::Yes,
        status @ (401 | 403) => Answer::No {
            status,
            reason: reason_of(&body),
        },
        300..=399 => Answer::Failed(format!("answered {status} (redirects are not followed)")),
        _ => Answer::Failed(format!("answered {status}")),
    }
}

/// The application's `{"reason": "..."}`, cut to [`MAX_REASON`] bytes; a
/// generic one when the body has none.
fn reason_of(body: &[u8]) -> String {
    let reason = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("reason")?.as_str().map(str::to_owned))
        .filter(|r| !r.trim().is_empty());
    match reason {
        None => "refused by the application".to_owned(),
        Some(mut r) => {
            if r.len() > MAX_REASON {
                let mut end = MAX_REASON;
                while !r.is_char_boundary(end) {
                    end -= 1;
                }
                r.truncate(end);
            }
            r
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_is_the_applications_or_a_generic_one() {
        assert_eq!(reason_of(br#"{"reason": "not a member"}"#), "not a member");
        assert_eq!(reason_of(b"<html>"), "refused by the application");
        assert_eq!(reason_of(br#"{"reason": " "}"#), "refused by the application");
        let long = format!(r#"{{"reason": "{}"}}"#, "é".repeat(400));
        let r = reason_of(long.as_bytes());
        assert!(
            r.len() <= MAX_REASON && r.chars().all(|c| c == 'é'),
            "{}",
            r.len()
        );
    }
}
