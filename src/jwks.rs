//! The identity provider's keys (`auth.jwks_url`): fetched at start-up,
//! again every `auth.jwks_refresh_ms`, and again when a token names a
//! `kid` none of them has (a key rotated in), at most once every
//! [`REFETCH_EVERY`].
//!
//! A fetch that fails (unreachable, a timeout, not 200, not a JWKS, no
//! usable key) changes nothing: the keys held keep working. It is counted
//! (`/stats` `auth.jwks_failures`, `/metrics`
//! `switchboard_jwks_failures_total`) and logged (`jwks_fetch_failed`).
//! Fetches run on the backend thread ([`Backend`]); a stream request
//! whose `kid` is unknown waits for one at most [`KID_WAIT`].

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::{self, Backend};
use crate::stats::Stats;
use crate::token::JwksKeys;

/// How often at most a `kid` no key has fetches the keys again: a flood
/// of tokens with made-up `kid`s costs the identity provider one request
/// per this long.
pub(crate) const REFETCH_EVERY: Duration = Duration::from_secs(5);

/// How long a stream request whose `kid` is unknown waits for the keys
/// (then 503, try again).
pub(crate) const KID_WAIT: Duration = Duration::from_secs(3);

/// How long one fetch may take, connecting included.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest JWKS document read (a provider's holds a few keys, a few
/// KB).
const MAX_DOCUMENT: usize = 1 << 20;

/// What a stream request whose `kid` was unknown learns.
#[derive(Debug, PartialEq)]
pub(crate) enum Learned {
    /// A key of that `kid` is held now.
    Known,
    /// The keys were fetched (now or within [`REFETCH_EVERY`]) and none has
    /// it.
    NotListed,
    /// They could not be fetched in time: why.
    Unreachable(String),
}

/// The fetcher of `auth.jwks_url`'s keys into a verifier's [`JwksKeys`].
pub(crate) struct Jwks {
    url: String,
    keys: Arc<JwksKeys>,
    backend: Arc<Backend>,
    stats: Arc<Stats>,
    fetching: Mutex<Fetching>,
    /// Bumped when a fetch ends: `Ok(())` or why it failed.
    done: watch::Sender<Result<(), String>>,
}

/// When a fetch last started, and whether one runs now.
#[derive(Default)]
struct Fetching {
    last: Option<Instant>,
    running: bool,
}

impl Fetching {
    /// A fetch starts now.
    fn started(&mut self) {
        self.last = Some(Instant::now());
        self.running = true;
    }
}

impl Jwks {
    /// Fetches `url`'s keys into `keys` once, waiting for the answer (at
    /// most [`FETCH_TIMEOUT`]), then again every `refresh` on the backend
    /// thread for as long as the returned fetcher lives. The first fetch's
    /// failure is returned (with the fetcher: a caller with another key
    /// goes on, and the keys come with a later fetch).
    pub(crate) fn start(
        url: &str,
        refresh: Duration,
        keys: Arc<JwksKeys>,
        backend: Arc<Backend>,
        stats: Arc<Stats>,
    ) -> (Arc<Jwks>, Result<usize, String>) {
        let jwks = Arc::new(Jwks {
            url: url.to_owned(),
            keys,
            backend,
            stats,
            fetching: Mutex::new(Fetching::default()),
            done: watch::Sender::new(Ok(())),
        });
        let first = {
            let (tx, rx) = std::sync::mpsc::channel();
            let this = Arc::clone(&jwks);
            jwks.try_start();
            jwks.backend.spawn(async move {
                let _ = tx.send(this.fetch().await);
            });
            rx.recv_timeout(FETCH_TIMEOUT + Duration::from_secs(1))
                .unwrap_or_else(|_| Err("no answer in time".to_owned()))
        };
        let weak = Arc::downgrade(&jwks);
        jwks.backend
            .spawn(refresh_every(weak, refresh.max(Duration::from_secs(1))));
        (jwks, first)
    }

    /// Waits (at most [`KID_WAIT`]) for the keys to know `kid`: fetched
    /// again unless a fetch started within [`REFETCH_EVERY`] (one then
    /// running is waited for).
    pub(crate) async fn learn(self: &Arc<Self>, kid: &str) -> Learned {
        if self.keys.knows(kid) {
            return Learned::Known;
        }
        let mut done = self.done.subscribe();
        {
            // One lock for the decision, as for a fetch's end (which clears
            // `running` and tells its outcome under it): a learner sees
            // either a fetch running, whose end it then waits for, or the
            // outcome of the last one.
            let mut f = self
                .fetching
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if self.keys.knows(kid) {
                return Learned::Known;
            }
            if f.running {
                // Waited for below.
            } else if f.last.is_some_and(|t| t.elapsed() < REFETCH_EVERY) {
                // Fetched lately: the last fetch's word stands. A failed
                // one says nothing of this `kid`.
                return match &*done.borrow() {
                    Ok(()) => Learned::NotListed,
                    Err(why) => Learned::Unreachable(why.clone()),
                };
            } else {
                f.started();
                let this = Arc::clone(self);
                self.backend.spawn(async move { this.fetch().await });
            }
        }
        match tokio::time::timeout(KID_WAIT, done.changed()).await {
            Err(_) => Learned::Unreachable(format!("no answer within {} s", KID_WAIT.as_secs())),
            Ok(_) if self.keys.knows(kid) => Learned::Known,
            Ok(_) => match &*done.borrow() {
                Ok(()) => Learned::NotListed,
                Err(why) => Learned::Unreachable(why.clone()),
            },
        }
    }

    /// Marks a fetch started, unless one runs: whether it was.
    fn try_start(&self) -> bool {
        let mut f = self
            .fetching
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if f.running {
            return false;
        }
        f.started();
        true
    }

    /// One fetch (marked started by the caller): the keys taken, or why
    /// not; counted, logged, and told to those waiting.
    async fn fetch(&self) -> Result<usize, String> {
        let outcome = match tokio::time::timeout(FETCH_TIMEOUT, self.get()).await {
            Err(_) => Err(format!("no answer within {} s", FETCH_TIMEOUT.as_secs())),
            Ok(got) => got.and_then(|body| self.keys.install(&body)),
        };
        self.stats.jwks_fetches.fetch_add(1, Relaxed);
        let outcome = match outcome {
            Ok((taken, skipped)) => {
                self.stats.jwks_keys.store(taken as u64, Relaxed);
                if !skipped.is_empty() {
                    tracing::warn!(
                        event = "jwks_keys_skipped",
                        url = %crate::config::redact_endpoint(&self.url),
                        skipped = %skipped.join("; "),
                        "some keys of auth.jwks_url are not used"
                    );
                }
                Ok(taken)
            }
            Err(why) => {
                self.stats.jwks_failures.fetch_add(1, Relaxed);
                tracing::warn!(
                    event = "jwks_fetch_failed",
                    url = %crate::config::redact_endpoint(&self.url),
                    error = %why,
                    keys_held = self.keys.len(),
                    "the identity provider's keys could not be fetched; the keys held are kept"
                );
                Err(why)
            }
        };
        let mut f = self
            .fetching
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f.running = false;
        let _previous = self
            .done
            .send_replace(outcome.as_ref().map(|_| ()).map_err(Clone::clone));
        drop(f);
        outcome
    }

    /// The JWKS document, or why not.
    async fn get(&self) -> Result<Vec<u8>, String> {
        let response = self
            .backend
            .client()
            .get(&self.url)
            .header("accept", "application/json")
            .send()
            .await
            .map_err(backend::request_error)?;
        let status = response.status();
        if status != reqwest::StatusCode::OK {
            return Err(format!("answered {status}"));
        }
        backend::body_within(response, MAX_DOCUMENT).await
    }
}

/// Fetches every `refresh` while the fetcher lives.
async fn refresh_every(jwks: Weak<Jwks>, refresh: Duration) {
    loop {
        tokio::time::sleep(refresh).await;
        let Some(jwks) = jwks.upgrade() else { return };
        if jwks.try_start() {
            let _ = jwks.fetch().await;
        }
    }
}
