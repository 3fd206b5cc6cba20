//! Stream ids: what a client names its stream and a publisher addresses.
//! Also connection ids ([`ConnId`], which carry their start time) and the
//! shrink rule of every table keyed by id ([`shrink_if_sparse`]).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Why an id was refused; the text goes into the 400 response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum IdError {
    /// Zero-length id.
    #[error("invalid id: empty")]
    Empty,
    /// Longer than `stream.max_id_len`.
    #[error("invalid id: longer than {max} characters")]
    TooLong {
        /// The configured maximum.
        max: usize,
    },
    /// A character outside the unreserved URL set and `:`.
    #[error("invalid id: only A-Za-z0-9 and . _ ~ - : are allowed")]
    BadChar,
}

/// Below this many slots a table keyed by id is never shrunk (a shrink
/// costs a rehash).
const SHRINK_MIN_CAPACITY: usize = 1024;

/// Gives a large table keyed by stream id its memory back once it is less
/// than a quarter full: a `HashMap` keeps its peak capacity otherwise (the
/// Router's streams, the history's rings, the bus's lingering ids, after a
/// crowd has left).
pub(crate) fn shrink_if_sparse<K: Eq + Hash, V, S: BuildHasher>(table: &mut HashMap<K, V, S>) {
    let cap = table.capacity();
    if cap > SHRINK_MIN_CAPACITY && table.len() < cap / 4 {
        table.shrink_to_fit();
    }
}

/// True for the characters an id may contain: RFC 3986 "unreserved", and
/// `:`, which separates a namespace from the rest (`chat:room1`; a path
/// segment may hold it unescaped, RFC 3986 `pchar`), so an id never needs
/// escaping in a URL path and never breaks a line of the wire format.
pub(crate) fn is_id_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'~' | b'-' | b':')
}

/// Checks an id against the rules and the configured length limit.
pub(crate) fn validate(id: &str, max_len: usize) -> Result<(), IdError> {
    if id.is_empty() {
        Err(IdError::Empty)
    } else if id.len() > max_len {
        Err(IdError::TooLong { max: max_len })
    } else if !id.bytes().all(is_id_byte) {
        Err(IdError::BadChar)
    } else {
        Ok(())
    }
}

/// Identifies one stream connection (several may share a stream id).
///
/// It also says when the stream started: the high 40 bits are milliseconds
/// since the first id of the process (34 years), the low 24 a counter. So a
/// stream's lifetime costs no field of its own: the stream's fields are a
/// 40-byte allocation, and 8 bytes more would make it the next size class
/// (16 bytes more per idle stream), while its task cell has 8 bytes to
/// spare, not 16. Two ids are equal only if 2^24 streams started within
/// the same millisecond.
pub(crate) type ConnId = u64;

/// Bits of a [`ConnId`] that count; the rest is its start time.
const COUNTER_BITS: u32 = 24;

/// When the process handed out its first connection id.
static EPOCH: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);

/// Hands out process-unique connection ids, stamped with the time.
pub(crate) fn next_conn_id() -> ConnId {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let count = NEXT.fetch_add(1, Ordering::Relaxed) & ((1 << COUNTER_BITS) - 1);
    let ms = EPOCH.elapsed().as_millis() as u64;
    (ms << COUNTER_BITS) | count
}

/// How long ago connection `conn` was given its id (to the millisecond).
pub(crate) fn conn_age(conn: ConnId) -> Duration {
    let started = Duration::from_millis(conn >> COUNTER_BITS);
    EPOCH.elapsed().saturating_sub(started)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_ids_are_unique_and_tell_their_age() {
        let ids: Vec<ConnId> = (0..100_000).map(|_| next_conn_id()).collect();
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ids.len(), "duplicate connection ids");
        let old = ids[0];
        std::thread::sleep(Duration::from_millis(30));
        let age = conn_age(old);
        assert!(age >= Duration::from_millis(29), "{age:?}");
        assert!(age < Duration::from_secs(5), "{age:?}");
        assert!(conn_age(next_conn_id()) < age, "a new id is younger");
    }

    #[test]
    fn rules() {
        assert_eq!(validate("foo-1.2_x~", 64), Ok(()));
        assert_eq!(validate("", 64), Err(IdError::Empty));
        assert_eq!(validate("abcd", 3), Err(IdError::TooLong { max: 3 }));
        assert_eq!(validate("a b", 64), Err(IdError::BadChar));
        assert_eq!(validate("a/b", 64), Err(IdError::BadChar));
        assert_eq!(validate("é", 64), Err(IdError::BadChar));
        assert_eq!(validate("a%20", 64), Err(IdError::BadChar));
    }
}

/// Property tests: [`validate`] agrees with the rule written out plainly.
#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(crate::proptest_config())]

        /// Any string, any limit: valid exactly when non-empty, within the
        /// limit and made of RFC 3986 unreserved characters and `:` only.
        #[test]
        fn ids_follow_the_rule(id in prop_oneof!["[A-Za-z0-9._~:-]{0,20}", ".{0,20}"], max in 1usize..20) {
            let unreserved = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._~-:";
            let expected = !id.is_empty() && id.len() <= max && id.chars().all(|c| unreserved.contains(c));
            prop_assert_eq!(validate(&id, max).is_ok(), expected, "{:?}", id);
        }
    }
}
