//! Webhooks (`hooks.events_url`): the application hears when an id becomes
//! occupied or vacated, and when streams join and leave (Pusher's
//! `channel_occupied`/`channel_vacated` and `member_added`/`member_removed`).
//!
//! - **What decides an event.** `id_occupied` and `id_vacated` are decided
//!   once for the fleet by the broker: in a single process by the memory
//!   broker (`super::hub::broker::memory`), in cluster mode in Redis
//!   (`super::hub::occupancy`). `stream_joined` and `stream_left` come
//!   from the Router, for each stream of a namespace that asks.
//! - **The queue.** [`Webhooks::emit`] never waits: an event goes into a
//!   bounded queue (`hooks.events_queue`), and past it is dropped and
//!   counted. Streams and publishes never wait on the application.
//! - **Delivery.** One task on the backend thread sends batches of at most
//!   [`MAX_BATCH`] events, one at a time and in order, each a POST of
//!   `{"time_ms", "events": [...]}` signed with `X-Switchboard-Signature:
//!   sha256=<hex HMAC-SHA256 of the body>` (`hooks.secret`). A 2xx
//!   delivers it; a failure that may pass (no answer within
//!   `hooks.timeout_ms`, a connection error, 5xx, 408, 429, a redirect) is
//!   retried with backoff, [`FIRST_RETRY`] doubling to [`LAST_RETRY`];
//!   another 4xx is the application refusing the batch: dropped, counted
//!   and logged.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hmac::{KeyInit, Mac};
use sha2::Sha256;
use tokio::sync::mpsc;

use crate::backend::{self, Backend};
use crate::config::Settings;
pub(crate) use crate::events::{EventSet, Name};
use crate::namespace::Namespaces;
use crate::stats::Stats;

/// Most events in one POST.
pub(crate) const MAX_BATCH: usize = 100;

/// The wait before a failed batch is sent again the first time.
pub(crate) const FIRST_RETRY: Duration = Duration::from_millis(250);

/// The longest wait between two tries of a batch.
pub(crate) const LAST_RETRY: Duration = Duration::from_secs(30);

/// How often a drop or a failure is logged at most.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// The signature's header.
pub(crate) const SIGNATURE: &str = "x-switchboard-signature";

/// One event, queued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Event {
    pub(crate) name: Name,
    pub(crate) id: Arc<str>,
    /// The node it happened on (for a node that died, that node).
    pub(crate) node: Arc<str>,
    /// The stream's token's `sub` (stream events).
    pub(crate) sub: Option<Arc<str>>,
}

impl Event {
    fn json(&self) -> serde_json::Value {
        let mut e = serde_json::json!({
            "name": self.name.as_str(),
            "id": &*self.id,
            "node": &*self.node,
        });
        if let Some(sub) = &self.sub {
            e["sub"] = serde_json::Value::from(&**sub);
        }
        e
    }
}

/// The webhooks of a server, shared by the broker, the Router and the
/// admission.
pub(crate) struct Webhooks {
    queue: mpsc::Sender<Event>,
    namespaces: Namespaces,
    /// This node's name (`cluster.node_name`, or `<host>-<pid>`).
    node: Arc<str>,
    stats: Arc<Stats>,
    /// When a drop was last logged.
    dropped_logged: std::sync::Mutex<Option<Instant>>,
}

impl Webhooks {
    /// The webhooks of `settings` (`hooks.events_url` set and checked),
    /// sending from `backend` as node `node`.
    pub(crate) fn start(
        settings: &Settings,
        backend: Arc<Backend>,
        stats: Arc<Stats>,
        node: String,
    ) -> Arc<Webhooks> {
        let hooks = &settings.hooks;
        let (queue, events) = mpsc::channel(hooks.events_queue);
        let sender = Sender {
            url: hooks.events_url.trim().to_owned(),
            secret: hooks.secret.as_bytes().to_vec(),
            timeout: Duration::from_millis(hooks.timeout_ms),
            client: backend.client().clone(),
            stats: Arc::clone(&stats),
        };
        backend.spawn(sender.run(events));
        Arc::new(Webhooks {
            queue,
            namespaces: Namespaces::new(settings),
            node: node.into(),
            stats,
            dropped_logged: std::sync::Mutex::new(None),
        })
    }

    /// The events sent for `id`.
    pub(crate) fn events_of(&self, id: &str) -> EventSet {
        self.namespaces.of(id).events
    }

    /// Queues `name` for `id` if `id`'s namespace sends it; `node`: another
    /// node's (one that died), else this one. Never waits: a full queue
    /// drops it, counted and logged.
    pub(crate) fn emit(&self, name: Name, id: &Arc<str>, node: Option<&Arc<str>>, sub: Option<Arc<str>>) {
        if !self.events_of(id).has(name) {
            return;
        }
        let event = Event {
            name,
            id: Arc::clone(id),
            node: Arc::clone(node.unwrap_or(&self.node)),
            sub,
        };
        // Counted pending before the sender can take it (and count it
        // done), so the gauge never goes below 0.
        self.stats.webhook_pending.fetch_add(1, Relaxed);
        match self.queue.try_send(event) {
            Ok(()) => {
                self.stats.webhook_queued.fetch_add(1, Relaxed);
            }
            Err(_) => {
                self.stats.webhook_pending.fetch_sub(1, Relaxed);
                let dropped = self.stats.webhook_dropped.fetch_add(1, Relaxed) + 1;
                let mut logged = self
                    .dropped_logged
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if logged.is_none_or(|at| at.elapsed() >= LOG_EVERY) {
                    *logged = Some(Instant::now());
                    tracing::warn!(
                        event = "webhook_dropped",
                        dropped,
                        "the webhook queue (hooks.events_queue) is full: events are dropped until \
                         hooks.events_url takes them again"
                    );
                }
            }
        }
    }
}

/// The task that sends the queue's batches.
struct Sender {
    url: String,
    secret: Vec<u8>,
    timeout: Duration,
    /// The backend's client (not the backend: this task runs on its
    /// thread, which stops when the backend is dropped).
    client: reqwest::Client,
    stats: Arc<Stats>,
}

/// How one try of a batch ended.
enum Sent {
    Delivered,
    /// The application refused it (a 4xx other than 408 and 429).
    Refused(u16),
    /// It may pass later.
    Failed(String),
}

impl Sender {
    /// Sends every batch, until the queue's senders are gone.
    async fn run(self, mut events: mpsc::Receiver<Event>) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        let mut failed_logged: Option<Instant> = None;
        loop {
            if events.recv_many(&mut batch, MAX_BATCH).await == 0 {
                return;
            }
            let body = body_of(&batch);
            let signature = sign(&self.secret, &body);
            let mut wait = FIRST_RETRY;
            loop {
                match self.send(&body, &signature).await {
                    Sent::Delivered => {
                        self.stats.webhook_batches.fetch_add(1, Relaxed);
                        self.stats.webhook_sent.fetch_add(batch.len() as u64, Relaxed);
                        break;
                    }
                    Sent::Refused(status) => {
                        self.stats.webhook_rejected.fetch_add(batch.len() as u64, Relaxed);
                        tracing::error!(
                            event = "webhook_rejected",
                            status,
                            events = batch.len(),
                            "hooks.events_url refused a batch of events: they are dropped (a 4xx is not retried)"
                        );
                        break;
                    }
                    Sent::Failed(why) => {
                        self.stats.webhook_failures.fetch_add(1, Relaxed);
                        if failed_logged.is_none_or(|at| at.elapsed() >= LOG_EVERY) {
                            failed_logged = Some(Instant::now());
                            tracing::warn!(
                                event = "webhook_failed",
                                cause = %why,
                                retry_ms = wait.as_millis() as u64,
                                "a batch of events could not be sent to hooks.events_url: tried again"
                            );
                        }
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(LAST_RETRY);
                    }
                }
            }
            self.stats.webhook_pending.fetch_sub(batch.len() as u64, Relaxed);
            batch.clear();
        }
    }

    /// One try.
    async fn send(&self, body: &[u8], signature: &str) -> Sent {
        let started = Instant::now();
        let request = self
            .client
            .post(&self.url)
            .header("content-type", "application/json")
            .header(SIGNATURE, signature)
            .body(body.to_vec())
            .timeout(self.timeout)
            .send();
        let sent = match request.await {
            Err(e) => Sent::Failed(backend::request_error(e)),
            Ok(answer) => {
                let status = answer.status().as_u16();
                // Read (bounded) so the connection goes back to the pool.
                let _ = backend::body_within(answer, crate::hooks::MAX_ANSWER).await;
                match status {
                    200..=299 => Sent::Delivered,
                    408 | 429 => Sent::Failed(format!("it answered {status}")),
                    400..=499 => Sent::Refused(status),
                    _ => Sent::Failed(format!("it answered {status}")),
                }
            }
        };
        self.stats.webhook_seconds.observe(started.elapsed());
        sent
    }
}

/// A batch's JSON body.
fn body_of(batch: &[Event]) -> Vec<u8> {
    let time_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let events: Vec<serde_json::Value> = batch.iter().map(Event::json).collect();
    serde_json::json!({ "time_ms": time_ms, "events": events })
        .to_string()
        .into_bytes()
}

/// `sha256=<hex HMAC-SHA256 of body keyed with secret>`.
pub(crate) fn sign(secret: &[u8], body: &[u8]) -> String {
    let mut mac = hmac::Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let mut hex = String::with_capacity(7 + 64);
    hex.push_str("sha256=");
    for b in digest {
        hex.push_str(&format!("{b:02x}"));
    }
    hex
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 4231's test case 2: the signature is standard HMAC-SHA256, so
    /// any library checks it.
    #[test]
    fn the_signature_is_hmac_sha256_in_hex() {
        assert_eq!(
            sign(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn an_event_carries_sub_only_when_it_has_one() {
        let mut e = Event {
            name: Name::StreamJoined,
            id: "chat:1".into(),
            node: "a".into(),
            sub: None,
        };
        assert_eq!(
            e.json(),
            serde_json::json!({"name": "stream_joined", "id": "chat:1", "node": "a"})
        );
        e.sub = Some("alice".into());
        assert_eq!(e.json()["sub"], "alice");
    }
}
