//! Event ids and the per-id history a reconnecting client resumes from:
//! [`History`] keeps both for one process (the memory broker,
//! [`crate::hub::broker::memory`]); [`FleetRead`] and [`CaughtUp`] are the
//! shape of any history read, this process's or the fleet's in Redis
//! ([`crate::hub::cluster`]), and [`fleet_resume`] the one rule that says
//! what a resuming stream is owed from it.
//!
//! **Event ids** are the clock in microseconds since the Unix epoch, made
//! unique: a message gets `max(previous + 1, now)`. So they increase for
//! every id (and across ids), survive being forgotten (an id whose history
//! expired gets larger ids later, not 1 again), stay above the previous
//! run's as long as the clock does, and tell the age of a message: history
//! needs no timestamps of its own. In a fleet, the publish script in
//! Redis mints them (see [`crate::hub::cluster`]).
//!
//! **History**: an id gets a ring once a message is sent to it (an id that
//! is only held costs nothing here), keeping its last `history.size`
//! messages for `history.ttl_ms`; a sweep drops expired messages and empty
//! rings. Broadcasts are not kept (every id would pay for each).
//!
//! **Resume**: a stream that gives the last event id it saw gets every kept
//! message after it, in order, before any live one (the Router sends both,
//! and one mailbox keeps them in order). If messages after it may be gone
//! (evicted, expired, or sent before this process started), it is told so,
//! with the first id it will get: a gap is never silent. The check is
//! conservative: a client away for longer than the TTL is told of a
//! possible gap even if nothing was sent meanwhile.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::namespace::Namespaces;

/// One message kept: its event id and text.
pub(crate) type KeptMessage = (u64, Arc<str>);

/// The recent messages of one id.
struct Ring {
    /// Oldest first.
    entries: VecDeque<KeptMessage>,
    /// Messages with ids up to this one may be gone (evicted or expired, or
    /// sent before the ring was made).
    lost_before: u64,
}

/// What a stream resuming after an event id is owed.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Resume {
    /// The event id the stream is at once it has these (its welcome's id).
    pub(crate) position: u64,
    /// Kept messages after the given id, oldest first.
    pub(crate) replay: Vec<KeptMessage>,
    /// Messages after the given id may be missing.
    pub(crate) gap: Option<Gap>,
}

/// A possible hole in what a resuming stream gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Gap {
    /// The id the client gave.
    pub(crate) after: u64,
    /// The first id it gets (the first replayed), or `None`: live ones only.
    pub(crate) next: Option<u64>,
}

/// Event ids and rings.
pub(crate) struct History {
    /// How many messages an id keeps, and how long: its namespace's
    /// `history_size` and `history_ttl_ms`, or `history.size` and
    /// `history.ttl_ms`.
    rules: Namespaces,
    /// The first id this process could give: what came before is not here.
    started: u64,
    /// The largest id minted: ids minted from now on are larger.
    clock: u64,
    /// The largest id recorded (delivered): where a stream that does not
    /// resume starts.
    last: u64,
    rings: HashMap<Arc<str>, Ring>,
    /// Messages kept over all rings.
    kept: usize,
}

/// Microseconds since the Unix epoch: the clock event ids are made of.
pub(crate) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros() as u64
}

impl History {
    /// Keeps `size` messages per id for `ttl`.
    #[cfg(test)]
    pub(crate) fn new(size: usize, ttl: Duration) -> Self {
        History::with(Namespaces::uniform(size, ttl.as_millis() as u64))
    }

    /// Keeps as many messages per id, for as long, as `rules` say.
    pub(crate) fn with(rules: Namespaces) -> Self {
        let now = now_us();
        History {
            rules,
            started: now,
            clock: now,
            last: now,
            rings: HashMap::new(),
            kept: 0,
        }
    }

    /// The next event id.
    pub(crate) fn next_id(&mut self) -> u64 {
        self.clock = self.clock.saturating_add(1).max(now_us());
        self.clock
    }

    /// The last event id given: where a stream that does not resume starts.
    #[cfg(test)]
    pub(crate) fn last_id(&self) -> u64 {
        self.last
    }

    /// How many messages `id` keeps, and for how many microseconds.
    fn rule(&self, id: &str) -> (usize, u64) {
        let p = self.rules.of(id);
        (p.history_size, p.history_ttl_ms.saturating_mul(1000))
    }

    /// Ids below this may have had messages that are gone now, for an id
    /// whose messages are kept `ttl` microseconds.
    fn floor(&self, now: u64, ttl: u64) -> u64 {
        self.started.max(now.saturating_sub(ttl))
    }

    /// Keeps message `ev` of `id` (minted by [`History::next_id`], so
    /// after every id kept).
    pub(crate) fn record(&mut self, id: &str, ev: u64, msg: &Arc<str>) {
        self.last = self.last.max(ev);
        let (size, ttl) = self.rule(id);
        if size == 0 {
            return;
        }
        let now = now_us();
        if !self.rings.contains_key(id) {
            let lost_before = self.floor(now, ttl);
            self.rings.insert(
                Arc::from(id),
                Ring {
                    entries: VecDeque::new(),
                    lost_before,
                },
            );
        }
        // unwrap: inserted above if it was missing.
        let ring = self.rings.get_mut(id).expect("ring exists");
        ring.entries.push_back((ev, Arc::clone(msg)));
        self.kept += 1;
        self.kept -= ring.expire(now, ttl);
        while ring.entries.len() > size {
            if let Some((gone, _)) = ring.entries.pop_front() {
                ring.lost_before = ring.lost_before.max(gone);
                self.kept -= 1;
            }
        }
    }

    /// This process's history of `id` after `since`, in the shape of a read
    /// of the fleet's ([`FleetRead`]), so that one rule ([`fleet_resume`])
    /// says what a resuming stream is owed, whichever broker kept it. Its
    /// clock is the last id given (where a new stream starts); messages up
    /// to `id.lost_upto` may be gone (evicted, expired, or sent before this
    /// process started).
    pub(crate) fn read(&mut self, id: &str, since: Option<u64>) -> FleetRead {
        let mut read = FleetRead {
            clock: self.last,
            ..FleetRead::default()
        };
        let Some(since) = since.filter(|since| *since <= self.last) else {
            return read;
        };
        let now = now_us();
        let (size, ttl) = self.rule(id);
        let (entries, lost_before) = match self.rings.get_mut(id) {
            Some(ring) => {
                self.kept -= ring.expire(now, ttl);
                let after = ring.entries.partition_point(|(ev, _)| *ev <= since);
                (ring.entries.range(after..).cloned().collect(), ring.lost_before)
            }
            None if size == 0 => (Vec::new(), u64::MAX),
            None => (Vec::new(), self.floor(now, ttl)),
        };
        // Nothing after the last id given can be missing.
        read.id = FleetHistory {
            lost_upto: lost_before.min(self.last),
            entries,
        };
        read
    }

    /// What a stream of `id` that saw everything up to `since` is owed
    /// (`None`: a new client, which starts at the last id).
    #[cfg(test)]
    pub(crate) fn resume(&mut self, id: &str, since: Option<u64>) -> Resume {
        fleet_resume(self.read(id, since), since).0
    }

    /// Drops expired messages, and rings left empty.
    pub(crate) fn sweep(&mut self) {
        let now = now_us();
        let mut dropped = 0;
        let rules = &self.rules;
        self.rings.retain(|id, ring| {
            let ttl = rules.of(id).history_ttl_ms.saturating_mul(1000);
            dropped += ring.expire(now, ttl);
            !ring.entries.is_empty()
        });
        self.kept -= dropped;
        crate::id::shrink_if_sparse(&mut self.rings);
    }

    /// How often [`History::sweep`] should run.
    pub(crate) fn sweep_interval(&self) -> Duration {
        Duration::from_millis(self.rules.shortest_ttl_ms() / 4)
            .clamp(Duration::from_secs(1), Duration::from_secs(60))
    }

    /// Ids with a ring, and messages kept.
    pub(crate) fn sizes(&self) -> (usize, usize) {
        (self.rings.len(), self.kept)
    }
}

/// What a read of the fleet's history in Redis found (cluster mode, see
/// [`crate::hub::cluster`]): the fleet's clock and, for a resume, each of
/// the id's and the broadcasts' kept messages after the position.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct FleetRead {
    /// The last event id the fleet gave: every message with an id up to
    /// it was published before the read.
    pub(crate) clock: u64,
    /// The fleet's epoch: ids below it may be gone with a Redis that lost
    /// its data (a restart without persistence, `FLUSHALL`).
    pub(crate) epoch: u64,
    /// The id's kept messages after the position, and the id below which
    /// messages may be gone (trimmed, expired, lost).
    pub(crate) id: FleetHistory,
    /// The same for broadcasts.
    pub(crate) broadcasts: FleetHistory,
}

/// Kept messages of one history in Redis.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct FleetHistory {
    /// Ids up to this one may have had messages that are gone.
    pub(crate) lost_upto: u64,
    /// After the position, oldest first.
    pub(crate) entries: Vec<KeptMessage>,
}

/// What a catch-up read of several ids found, after the point where a
/// broker's link was lost (see [`crate::hub::broker::Broker::catch_up`]).
#[derive(Debug)]
pub(crate) struct CaughtUp {
    /// The fleet's clock and epoch.
    pub(crate) clock: u64,
    pub(crate) epoch: u64,
    /// Broadcasts after the position.
    pub(crate) broadcasts: FleetHistory,
    /// Each id's messages after it, in the order asked.
    pub(crate) ids: Vec<FleetHistory>,
    /// Empty, or each id's own clock (a Redis Cluster's, where each id
    /// has one): where its live messages take over from what was read.
    pub(crate) clocks: Vec<u64>,
}

/// Why a resume was told of a gap, for `/stats` (`history.gaps_by_cause`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GapCause {
    /// Trimmed by `history.size`, expired by `history.ttl_ms`, or from
    /// before the history began.
    Trimmed,
    /// Below the fleet's epoch: Redis lost its data since.
    Epoch,
    /// An id the history never gave (a future one, another fleet's, or
    /// one from before this fleet's clock was reset).
    Unknown,
    /// The read of the fleet's history failed.
    ReadFailed,
}

/// What a stream that saw everything up to `since` is owed, from a read of
/// the fleet's history (`None`: a new stream, at the fleet's clock).
pub(crate) fn fleet_resume(read: FleetRead, since: Option<u64>) -> (Resume, Option<GapCause>) {
    let Some(since) = since else {
        return (
            Resume {
                position: read.clock,
                ..Resume::default()
            },
            None,
        );
    };
    if since > read.clock {
        let gap = Gap {
            after: since,
            next: None,
        };
        return (
            Resume {
                position: read.clock,
                replay: Vec::new(),
                gap: Some(gap),
            },
            Some(GapCause::Unknown),
        );
    }
    let cause = if since < read.epoch {
        Some(GapCause::Epoch)
    } else if since < read.id.lost_upto || since < read.broadcasts.lost_upto {
        Some(GapCause::Trimmed)
    } else {
        None
    };
    // Both are in id order: merge them.
    let (mut of_id, mut of_broadcasts) = (
        read.id.entries.into_iter().peekable(),
        read.broadcasts.entries.into_iter().peekable(),
    );
    let mut replay = Vec::with_capacity(of_id.len() + of_broadcasts.len());
    loop {
        let next = match (of_id.peek(), of_broadcasts.peek()) {
            (Some(mine), Some(broadcast)) if mine.0 <= broadcast.0 => of_id.next(),
            (Some(_), Some(_)) => of_broadcasts.next(),
            (Some(_), None) => of_id.next(),
            (None, _) => of_broadcasts.next(),
        };
        match next {
            Some(kept) if kept.0 > since => replay.push(kept),
            Some(_) => {}
            None => break,
        }
    }
    let mut resume = Resume::after(since, replay, cause.is_some());
    if resume.replay.is_empty() {
        // Nothing kept after `since`: the stream has (or, after a gap, is
        // told it may miss) everything up to the clock, so that is where
        // it stands. Left at `since`, a client that resumes from there
        // before the next message would be told of the same gap again,
        // and a quiet id's resume point would fall behind the history's
        // time to live and be told of a gap that is not one. (With a
        // replay, the position moves with each message replayed: each
        // event's id must be a point to resume from.)
        resume.position = resume.position.max(read.clock);
    }
    (resume, cause)
}

/// What a stream is owed when the read of the fleet's history failed: a
/// gap after `since` if it resumes (its next messages are live ones), at
/// `position`.
pub(crate) fn failed_read(since: Option<u64>, position: u64) -> (Resume, Option<GapCause>) {
    let gap = since.map(|after| Gap { after, next: None });
    (
        Resume {
            position,
            replay: Vec::new(),
            gap,
        },
        gap.map(|_| GapCause::ReadFailed),
    )
}

impl Resume {
    /// A stream at `since` gets `replay`; `lost`: messages after `since`
    /// may be gone, a gap named by the first id it gets.
    fn after(since: u64, replay: Vec<KeptMessage>, lost: bool) -> Resume {
        let gap = lost.then(|| Gap {
            after: since,
            next: replay.first().map(|(ev, _)| *ev),
        });
        Resume {
            position: since,
            replay,
            gap,
        }
    }
}

impl Ring {
    /// Drops messages older than `ttl` at `now`; returns how many.
    fn expire(&mut self, now: u64, ttl: u64) -> usize {
        let mut n = 0;
        while let Some((ev, _)) = self.entries.front() {
            if ev.saturating_add(ttl) >= now {
                break;
            }
            self.lost_before = self.lost_before.max(*ev);
            self.entries.pop_front();
            n += 1;
        }
        if self.entries.is_empty() {
            self.entries = VecDeque::new();
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    #[test]
    fn ids_increase_and_resume_replays_what_followed() {
        let mut h = History::new(3, Duration::from_secs(60));
        let fresh = h.resume("a", None);
        assert_eq!(fresh.position, h.last_id());
        // As the Router does: each id minted and recorded in one step.
        let ids: Vec<u64> = ["1", "2", "3"]
            .into_iter()
            .map(|text| {
                let ev = h.next_id();
                h.record("a", ev, &msg(text));
                ev
            })
            .collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]));
        let r = h.resume("a", Some(ids[0]));
        assert_eq!(r.position, ids[0]);
        assert_eq!(r.replay, vec![(ids[1], msg("2")), (ids[2], msg("3"))]);
        assert_eq!(r.gap, None);
        // Another id's history is its own.
        assert_eq!(h.resume("b", Some(ids[2])).replay, vec![]);
        // Up to date: nothing owed, no gap.
        assert_eq!(
            h.resume("a", Some(ids[2])),
            Resume {
                position: ids[2],
                ..Resume::default()
            }
        );
    }

    /// An id of a namespace keeps what its namespace says; one outside,
    /// the server's `history.size`; a namespace that keeps none, none.
    #[test]
    fn each_namespace_keeps_its_own_history() {
        let mut settings = crate::config::Settings::defaults();
        settings.history.size = 1;
        for (name, size) in [("chat", 3), ("quiet", 0)] {
            settings.namespaces.insert(
                name.into(),
                crate::config::NamespaceSettings {
                    history_size: Some(size),
                    ..Default::default()
                },
            );
        }
        let mut h = History::with(Namespaces::new(&settings));
        let start = h.resume("x", None).position;
        for id in ["chat:a", "a", "quiet:a"] {
            for text in ["1", "2", "3"] {
                let ev = h.next_id();
                h.record(id, ev, &msg(text));
            }
        }
        let kept = |h: &mut History, id: &str| h.resume(id, Some(start)).replay.len();
        assert_eq!(kept(&mut h, "chat:a"), 3);
        assert_eq!(kept(&mut h, "a"), 1);
        assert_eq!(kept(&mut h, "quiet:a"), 0);
        assert!(h.resume("chat:a", Some(start)).gap.is_none());
        assert!(h.resume("a", Some(start)).gap.is_some());
        assert_eq!(h.sizes(), (2, 4));
    }

    #[test]
    fn evicted_messages_are_a_gap_named_by_the_next_id() {
        let mut h = History::new(2, Duration::from_secs(60));
        let start = h.resume("a", None).position;
        let ids: Vec<u64> = (0..5)
            .map(|_| {
                let ev = h.next_id();
                h.record("a", ev, &msg("m"));
                ev
            })
            .collect();
        assert_eq!(h.sizes(), (1, 2));
        let r = h.resume("a", Some(start));
        assert_eq!(r.replay.len(), 2);
        assert_eq!(
            r.gap,
            Some(Gap {
                after: start,
                next: Some(ids[3])
            })
        );
        // From just before the oldest kept one: nothing missing.
        assert_eq!(h.resume("a", Some(ids[2])).gap, None);
        // An id this process never gave.
        assert_eq!(
            h.resume("a", Some(u64::MAX)).gap,
            Some(Gap {
                after: u64::MAX,
                next: None
            })
        );
        // Before this process started: it cannot know, so it says.
        assert!(h.resume("z", Some(start - 1)).gap.is_some());
    }

    #[test]
    fn expired_messages_go_and_their_ring_with_them() {
        let mut h = History::new(10, Duration::from_millis(1));
        let start = h.resume("a", None).position;
        let ev = h.next_id();
        h.record("a", ev, &msg("m"));
        std::thread::sleep(Duration::from_millis(5));
        h.sweep();
        assert_eq!(h.sizes(), (0, 0));
        let r = h.resume("a", Some(start));
        assert_eq!(r.replay, vec![]);
        assert_eq!(
            r.gap,
            Some(Gap {
                after: start,
                next: None
            })
        );
    }

    #[test]
    fn fleet_reads_merge_broadcasts_and_tell_gaps_by_cause() {
        let kept = |ids: &[u64]| ids.iter().map(|i| (*i, msg(&i.to_string()))).collect::<Vec<_>>();
        let read = |id_lost, b_lost, epoch| FleetRead {
            clock: 100,
            epoch,
            id: FleetHistory {
                lost_upto: id_lost,
                entries: kept(&[20, 40, 60]),
            },
            broadcasts: FleetHistory {
                lost_upto: b_lost,
                entries: kept(&[30, 50]),
            },
        };
        // Merged in id order, after the position only, no gap.
        let (r, cause) = fleet_resume(read(10, 10, 5), Some(25));
        assert_eq!(r.replay, kept(&[30, 40, 50, 60]));
        assert_eq!((r.position, r.gap, cause), (25, None, None));
        // Trimmed (either history), then the epoch, then an unknown id.
        let (r, cause) = fleet_resume(read(10, 28, 5), Some(25));
        assert_eq!(
            r.gap,
            Some(Gap {
                after: 25,
                next: Some(30)
            })
        );
        assert_eq!(cause, Some(GapCause::Trimmed));
        let (_, cause) = fleet_resume(read(10, 10, 26), Some(25));
        assert_eq!(cause, Some(GapCause::Epoch));
        let (r, cause) = fleet_resume(read(10, 10, 5), Some(101));
        assert_eq!(
            (r.position, r.replay.len(), cause),
            (100, 0, Some(GapCause::Unknown))
        );
        // A new stream starts at the fleet's clock.
        let (r, cause) = fleet_resume(read(10, 10, 5), None);
        assert_eq!((r.position, r.replay.len(), r.gap, cause), (100, 0, None, None));
    }

    #[test]
    fn no_history_means_every_resume_that_missed_something_is_told() {
        let mut h = History::new(0, Duration::from_secs(60));
        let start = h.resume("a", None).position;
        let ev = h.next_id();
        h.record("a", ev, &msg("m"));
        assert_eq!(h.sizes(), (0, 0));
        assert!(h.resume("a", Some(start)).gap.is_some());
        assert_eq!(h.resume("a", Some(ev)).gap, None);
    }
}
