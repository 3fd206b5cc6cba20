//! `Idempotency-Key` on `/send` and `/broadcast`: a publisher that retries
//! after a timeout or a 503 with the same key delivers its message once.
//!
//! A repeated key within `publish.idempotency_ttl_ms` is answered with the
//! first request's answer and not delivered again; the same key for a
//! different request (another target or message) is refused with 422
//! rather than answered for the first one. A request that failed
//! (nothing delivered: 4xx, or a full backlog's 503) does not keep its key,
//! so its retry is a first attempt. In a single process the keys live here,
//! in memory; in cluster mode in Redis, fleet-wide (`SET NX PX` in the same
//! script as the PUBLISH: see `crate::hub::cluster`).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use actix_web::HttpRequest;

use crate::error::ApiError;

/// The request header.
pub(crate) const HEADER: &str = "idempotency-key";

/// Longest key accepted (a UUID is 36 bytes).
pub(crate) const MAX_KEY_LEN: usize = 255;

/// Most keys one process remembers at once: at ~300 bytes each, ~30 MB.
/// Past it a publish with a new key is refused (503) until keys expire,
/// rather than one being forgotten early, which would let its retry
/// deliver twice.
pub(crate) const MAX_KEYS: usize = 100_000;

/// What a key is bound to: the publish's target and message, as 16 hex
/// digits of their FNV-1a hash (stable across processes and builds, so
/// every node of a fleet computes the same; not a defence against a
/// publisher forging collisions with its own keys).
pub(crate) fn fingerprint(target: &str, msg: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in target.bytes().chain(std::iter::once(b'\n')).chain(msg.bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The request's `Idempotency-Key`, if any: 1 to [`MAX_KEY_LEN`] visible
/// ASCII characters, given once.
pub(crate) fn key_of(req: &HttpRequest) -> Result<Option<String>, ApiError> {
    let mut given = req.headers().get_all(HEADER);
    let (Some(first), second) = (given.next(), given.next()) else {
        return Ok(None);
    };
    if second.is_some() {
        return Err(ApiError::BadIdempotencyKey("given more than once"));
    }
    let key = first.as_bytes();
    if key.is_empty() || key.len() > MAX_KEY_LEN || !key.iter().all(u8::is_ascii_graphic) {
        return Err(ApiError::BadIdempotencyKey(
            "must be 1 to 255 visible ASCII characters",
        ));
    }
    // unwrap: checked ASCII just above.
    Ok(Some(String::from_utf8(key.to_vec()).expect("ASCII")))
}

/// What became of a key.
enum Entry<A> {
    /// A request with it is being served.
    InFlight {
        /// The request's [`fingerprint`].
        request: String,
    },
    /// Answered; the answer is replayed until `expires`.
    Done {
        /// The request's [`fingerprint`].
        request: String,
        /// When the key is forgotten.
        expires: Instant,
        /// The first answer (its status was 200).
        answer: A,
    },
}

/// The keys of one process, each with its first answer (an `A`).
pub(crate) struct Keys<A> {
    /// How long an answered key is remembered.
    ttl: Duration,
    /// The keys, and the answered ones in the order they expire.
    inner: Mutex<Inner<A>>,
}

struct Inner<A> {
    map: HashMap<String, Entry<A>>,
    expiry: VecDeque<(Instant, String)>,
}

/// What [`Keys::begin`] found.
pub(crate) enum Begin<'a, A> {
    /// A new key: serve the request, then [`Ticket::finish`].
    New(Ticket<'a, A>),
    /// Answered before: replay this answer.
    Replay(A),
    /// A request with this key is being served right now.
    InFlight,
    /// The key was used for another request.
    Mismatch,
    /// [`MAX_KEYS`] keys are remembered already.
    Full,
}

impl<A: Clone> Keys<A> {
    /// No keys; answered ones are remembered for `ttl`.
    pub(crate) fn new(ttl: Duration) -> Self {
        Keys {
            ttl,
            inner: Mutex::new(Inner {
                map: HashMap::new(),
                expiry: VecDeque::new(),
            }),
        }
    }

    /// Looks `key` up for the request whose [`fingerprint`] is `request`,
    /// claiming it if it is new.
    pub(crate) fn begin(&self, key: &str, request: &str) -> Begin<'_, A> {
        // unwrap: the lock is never held across a panic (no user code runs under it).
        let mut inner = self.inner.lock().expect("idempotency keys lock");
        inner.forget_expired(Instant::now());
        match inner.map.get(key) {
            Some(Entry::InFlight { request: r } | Entry::Done { request: r, .. }) if r != request => {
                Begin::Mismatch
            }
            Some(Entry::InFlight { .. }) => Begin::InFlight,
            Some(Entry::Done { answer, .. }) => Begin::Replay(answer.clone()),
            None if inner.map.len() >= MAX_KEYS => Begin::Full,
            None => {
                let entry = Entry::InFlight {
                    request: request.to_owned(),
                };
                inner.map.insert(key.to_owned(), entry);
                Begin::New(Ticket {
                    keys: self,
                    key: Some(key.to_owned()),
                    request: request.to_owned(),
                })
            }
        }
    }

    /// Keys remembered now (answered or in flight).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().expect("idempotency keys lock").map.len()
    }
}

impl<A> Inner<A> {
    fn forget_expired(&mut self, now: Instant) {
        while let Some((at, _)) = self.expiry.front()
            && *at <= now
        {
            // unwrap: front() just said there is one.
            let (at, key) = self.expiry.pop_front().expect("front");
            if matches!(self.map.get(&key), Some(Entry::Done { expires, .. }) if *expires == at) {
                self.map.remove(&key);
            }
        }
        if self.map.is_empty() && self.map.capacity() > 1024 {
            self.map = HashMap::new();
            self.expiry = VecDeque::new();
        }
    }
}

/// A claimed key. [`Ticket::finish`] keeps the answer for the key's time;
/// dropped without it (the request failed), the key is released, so a
/// retry is a first attempt.
pub(crate) struct Ticket<'a, A> {
    keys: &'a Keys<A>,
    key: Option<String>,
    /// The request's [`fingerprint`].
    request: String,
}

impl<A> Ticket<'_, A> {
    /// The request succeeded with `answer`: replay it for the key's time.
    pub(crate) fn finish(mut self, answer: A) {
        // unwrap: only `finish` and `drop` take it, once.
        let key = self.key.take().expect("a ticket finishes once");
        let expires = Instant::now() + self.keys.ttl;
        let mut inner = self.keys.inner.lock().expect("idempotency keys lock");
        inner.expiry.push_back((expires, key.clone()));
        inner.map.insert(
            key,
            Entry::Done {
                request: std::mem::take(&mut self.request),
                expires,
                answer,
            },
        );
    }
}

impl<A> Drop for Ticket<'_, A> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.keys
                .inner
                .lock()
                .expect("idempotency keys lock")
                .map
                .remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_answered_once_then_replayed_until_it_expires() {
        let keys = Keys::<u64>::new(Duration::from_millis(50));
        let Begin::New(ticket) = keys.begin("k", "r1") else {
            panic!("a new key")
        };
        assert!(matches!(keys.begin("k", "r1"), Begin::InFlight));
        assert!(matches!(keys.begin("k", "r2"), Begin::Mismatch));
        ticket.finish(3);
        match keys.begin("k", "r1") {
            Begin::Replay(answer) => assert_eq!(answer, 3),
            _ => panic!("replayed"),
        }
        assert!(matches!(keys.begin("k", "r2"), Begin::Mismatch));
        std::thread::sleep(Duration::from_millis(60));
        assert!(matches!(keys.begin("k", "r2"), Begin::New(_)));
        assert_eq!(keys.len(), 0, "the dropped ticket released its key");
    }

    #[test]
    fn a_failed_request_releases_its_key() {
        let keys = Keys::<u64>::new(Duration::from_secs(60));
        match keys.begin("k", "r") {
            Begin::New(ticket) => drop(ticket),
            _ => panic!("a new key"),
        }
        assert!(matches!(keys.begin("k", "r"), Begin::New(_)));
    }

    #[test]
    fn fingerprints_are_stable_and_tell_requests_apart() {
        // FNV-1a of "" then "\n": fixed, whatever the process or build.
        assert_eq!(fingerprint("", ""), "af63c74c8601c8dd");
        assert_ne!(fingerprint("send:a", "x"), fingerprint("send:b", "x"));
        assert_ne!(fingerprint("send:a", "x"), fingerprint("send:a", "y"));
        assert_ne!(fingerprint("send:a\nb", ""), fingerprint("send:a", "b"));
    }
}
