//! `namespaces.<name>.max_streams_per_id`: at most that many streams of
//! one id of the namespace at once (a chat room's seats, a document's
//! editors). Past it a stream request is refused 429 with `Retry-After`.
//!
//! This node counts its own streams of such ids exactly: one more at
//! admission ([`PerId::take`]), one less when the stream is dropped
//! ([`PerId::closed`]; every stream of a limited id was taken, so the
//! stream keeps nothing to say so). In a fleet, the admission adds the
//! other nodes' streams of the id from their presence in Redis, as of
//! their last heartbeat: a burst across nodes can pass the limit by what
//! they admitted within a heartbeat. If Redis cannot be read, this node's
//! own count decides, and that is counted (`per_id.unchecked`).
//!
//! Nothing is kept for ids of other namespaces, and a server without such
//! a namespace takes no lock.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::config::Settings;
use crate::error::ApiError;
use crate::namespace::Namespaces;
use crate::stats::Stats;

/// The streams of limited ids on this node.
pub(crate) struct PerId {
    namespaces: Namespaces,
    /// Some namespace has a limit.
    on: bool,
    /// Open streams per limited id here (an id goes with its last).
    open: Mutex<HashMap<Arc<str>, u32>>,
    stats: Arc<Stats>,
}

impl PerId {
    /// The limits of `settings`' namespaces.
    pub(crate) fn new(settings: &Settings, stats: Arc<Stats>) -> PerId {
        let namespaces = Namespaces::new(settings);
        PerId {
            on: namespaces.limits_streams(),
            namespaces,
            open: Mutex::new(HashMap::new()),
            stats,
        }
    }

    fn open(&self) -> MutexGuard<'_, HashMap<Arc<str>, u32>> {
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `id`'s limit (0: none).
    pub(crate) fn limit(&self, id: &str) -> usize {
        if !self.on {
            return 0;
        }
        self.namespaces.of(id).max_streams_per_id
    }

    /// One more stream of `id`, with `elsewhere` open on other nodes; past
    /// the limit, [`ApiError::IdFull`] (counted).
    pub(crate) fn take(&self, id: &str, elsewhere: u64) -> Result<(), ApiError> {
        let max = self.limit(id);
        if max == 0 {
            return Ok(());
        }
        let mut open = self.open();
        let here = open.get(id).copied().unwrap_or(0);
        if u64::from(here).saturating_add(elsewhere) >= max as u64 {
            drop(open);
            self.stats.per_id_refused.fetch_add(1, Relaxed);
            return Err(ApiError::IdFull(Box::new(crate::error::IdFull {
                id: id.to_owned(),
                namespace: id.split_once(':').map_or(id, |(name, _)| name).to_owned(),
                max,
            })));
        }
        *open.entry(Arc::from(id)).or_insert(0) += 1;
        Ok(())
    }

    /// A stream of `id` taken with [`PerId::take`] ended (or was refused
    /// after it was taken).
    pub(crate) fn closed(&self, id: &str) {
        if self.limit(id) == 0 {
            return;
        }
        let mut open = self.open();
        if let Some(n) = open.get_mut(id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(id);
                crate::id::shrink_if_sparse(&mut open);
            }
        }
    }

    /// The fleet's count could not be read: this node's decides (counted).
    pub(crate) fn unchecked(&self) {
        self.stats.per_id_unchecked.fetch_add(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn per_id(max: usize) -> PerId {
        let mut settings = Settings::defaults();
        settings.namespaces.insert(
            "room".to_owned(),
            crate::config::NamespaceSettings {
                max_streams_per_id: Some(max),
                ..Default::default()
            },
        );
        PerId::new(&settings, Arc::new(Stats::new()))
    }

    #[test]
    fn an_id_takes_up_to_its_limit_and_a_place_comes_back_when_a_stream_ends() {
        let p = per_id(2);
        assert!(p.take("room:1", 0).is_ok());
        assert!(p.take("room:1", 0).is_ok());
        let e = p.take("room:1", 0).unwrap_err();
        assert!(
            e.to_string().contains("namespaces.room.max_streams_per_id"),
            "{e}"
        );
        // Another id, and ids outside the namespace, are not counted.
        assert!(p.take("room:2", 0).is_ok());
        for _ in 0..10 {
            assert!(p.take("lobby", 0).is_ok());
        }
        p.closed("room:1");
        assert!(p.take("room:1", 0).is_ok());
        // The other nodes' streams count too.
        p.closed("room:2");
        assert!(p.take("room:2", 1).is_ok());
        assert!(p.take("room:2", 1).is_err());
        // Nothing is left of an id with no stream.
        p.closed("room:2");
        p.closed("room:1");
        p.closed("room:1");
        assert_eq!(p.open().len(), 0);
        assert_eq!(p.stats.per_id_refused.load(Relaxed), 2);
    }

    #[test]
    fn no_limit_takes_no_lock_and_keeps_nothing() {
        let p = PerId::new(&Settings::defaults(), Arc::new(Stats::new()));
        assert!(!p.on);
        assert!(p.take("a", 1_000_000).is_ok());
        assert_eq!(p.open().len(), 0);
    }
}
