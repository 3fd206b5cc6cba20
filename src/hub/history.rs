//! Event ids and the per-id history a reconnecting client resumes from,
//! both kept by the Router (one actor, so ids and rings need no locks).
//!
//! **Event ids** are the Router's clock in microseconds since the Unix
//! epoch, made unique: a message gets `max(previous + 1, now)`. So they
//! increase for every id (and across ids), survive being forgotten (an id
//! whose history expired gets larger ids later, not 1 again), stay above the
//! previous run's as long as the clock does, and tell the age of a message:
//! history needs no timestamps of its own. In cluster mode a message from
//! another node keeps the id its node minted ([`History::witness`]); this
//! node's next ids stay above every id it has seen. A message can then
//! come late, with an id below one this node gave already (two nodes
//! published to one id at the same moment): the ring keeps it in id order,
//! and a stream that resumes from a position it may have skipped is told
//! of a gap.
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

/// One message kept: its event id and text.
pub(crate) type Kept = (u64, Arc<str>);

/// The recent messages of one id.
struct Ring {
    /// Oldest first.
    entries: VecDeque<Kept>,
    /// Messages with ids up to this one may be gone (evicted or expired, or
    /// sent before the ring was made).
    lost_before: u64,
}

/// The window a late message leaves: a stream at a position `p` with
/// `after < p <= upto` may have left before the message came, and resuming
/// after `p` would skip it.
#[derive(Debug, Clone, Copy)]
struct Late {
    after: u64,
    upto: u64,
}

/// The late windows of one id.
#[derive(Debug, Default)]
struct LateWindows {
    /// Oldest first, at most `history.size`, each for the TTL.
    open: VecDeque<Late>,
    /// The largest `upto` of the windows forgotten (past the bound or the
    /// TTL): a resume at or below it is told of a gap, conservatively.
    forgotten_upto: u64,
}

impl LateWindows {
    /// Whether a stream at `since` may have skipped a late message.
    fn crossed(&self, since: u64) -> bool {
        since <= self.forgotten_upto || self.open.iter().any(|w| w.after < since && since <= w.upto)
    }

    fn forget_oldest(&mut self) {
        if let Some(w) = self.open.pop_front() {
            self.forgotten_upto = self.forgotten_upto.max(w.upto);
        }
    }
}

/// What a stream resuming after an event id is owed.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Resume {
    /// The event id the stream is at once it has these (its welcome's id).
    pub(crate) position: u64,
    /// Kept messages after the given id, oldest first.
    pub(crate) replay: Vec<Kept>,
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
    size: usize,
    ttl_us: u64,
    /// The first id this process could give: what came before is not here.
    started: u64,
    /// The largest id minted here or seen from another node: ids minted
    /// from now on are larger.
    clock: u64,
    /// The largest id recorded (delivered): where a stream that does not
    /// resume starts. Below `clock` while a keyed publish's id is minted
    /// and its message not back yet.
    last: u64,
    rings: HashMap<Arc<str>, Ring>,
    /// Late messages' windows per id, oldest first (at most `size` per id,
    /// for the TTL). Empty unless messages of two nodes crossed.
    late: HashMap<Arc<str>, LateWindows>,
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
    pub(crate) fn new(size: usize, ttl: Duration) -> Self {
        let now = now_us();
        History {
            size,
            ttl_us: ttl.as_micros() as u64,
            started: now,
            clock: now,
            last: now,
            rings: HashMap::new(),
            late: HashMap::new(),
            kept: 0,
        }
    }

    /// The next event id.
    pub(crate) fn next_id(&mut self) -> u64 {
        self.clock = self.clock.saturating_add(1).max(now_us());
        self.clock
    }

    /// Takes note of `event`, minted by another node, and returns it: ids
    /// this node mints from now on are larger. (The bus refuses ids far
    /// ahead of this node's clock, so one cannot push it out of reach.)
    pub(crate) fn witness(&mut self, event: u64) -> u64 {
        self.clock = self.clock.max(event);
        event
    }

    /// The largest id minted here or seen from another node.
    pub(crate) fn clock(&self) -> u64 {
        self.clock
    }

    /// The last event id given: where a stream that does not resume starts.
    #[cfg(test)]
    pub(crate) fn last_id(&self) -> u64 {
        self.last
    }

    /// Ids below this may have had messages that are gone now.
    fn floor(&self, now: u64) -> u64 {
        self.started.max(now.saturating_sub(self.ttl_us))
    }

    /// Keeps message `ev` of `id`.
    pub(crate) fn record(&mut self, id: &str, ev: u64, msg: &Arc<str>) {
        let top = self.last;
        self.last = self.last.max(ev);
        if self.size == 0 {
            return;
        }
        let now = now_us();
        if !self.rings.contains_key(id) {
            let lost_before = self.floor(now);
            self.rings.insert(
                Arc::from(id),
                Ring {
                    entries: VecDeque::new(),
                    lost_before,
                },
            );
        }
        let (size, ttl) = (self.size, self.ttl_us);
        // unwrap: inserted above if it was missing.
        let ring = self.rings.get_mut(id).expect("ring exists");
        // In id order: a message from another node may come after a later
        // one of this node (nearly always it goes at the back).
        let at = ring.entries.partition_point(|(kept, _)| *kept <= ev);
        ring.entries.insert(at, (ev, Arc::clone(msg)));
        self.kept += 1;
        self.kept -= ring.expire(now, ttl);
        if ev <= top {
            // Late (another node's message crossed one recorded here), or
            // an id another message has too: streams may be past it already
            // (a welcome's position is the last id recorded, of any id).
            let after = if ev < top { ev } else { ev - 1 };
            if !self.late.contains_key(id) {
                // The id's key is allocated once, not per late message.
                self.late.insert(Arc::from(id), LateWindows::default());
            }
            // unwrap: inserted above if it was missing.
            let windows = self.late.get_mut(id).expect("windows exist");
            windows.open.push_back(Late { after, upto: top });
            if windows.open.len() > size {
                windows.forget_oldest();
            }
        }
        while ring.entries.len() > size {
            if let Some((gone, _)) = ring.entries.pop_front() {
                ring.lost_before = ring.lost_before.max(gone);
                self.kept -= 1;
            }
        }
    }

    /// What a stream of `id` that saw everything up to `since` is owed
    /// (`None`: a new client, which starts at the last id).
    pub(crate) fn resume(&mut self, id: &str, since: Option<u64>) -> Resume {
        let Some(since) = since else {
            return Resume {
                position: self.last,
                ..Resume::default()
            };
        };
        if since > self.last {
            // Not an id this process gave: all it can say is "from here".
            return Resume {
                position: self.last,
                replay: Vec::new(),
                gap: Some(Gap {
                    after: since,
                    next: None,
                }),
            };
        }
        let now = now_us();
        let crossed = self.late.get(id).is_some_and(|w| w.crossed(since));
        let (replay, lost_before) = match self.rings.get_mut(id) {
            Some(ring) => {
                self.kept -= ring.expire(now, self.ttl_us);
                let after = ring.entries.partition_point(|(ev, _)| *ev <= since);
                (ring.entries.range(after..).cloned().collect(), ring.lost_before)
            }
            None if self.size == 0 => (Vec::new(), u64::MAX),
            None => (Vec::new(), self.floor(now)),
        };
        let gap = ((since < lost_before && since < self.last) || crossed).then(|| Gap {
            after: since,
            next: replay.first().map(|(ev, _)| *ev),
        });
        Resume {
            position: since,
            replay,
            gap,
        }
    }

    /// Drops expired messages, and rings left empty; forgets late windows
    /// older than the TTL (a resume from inside one still hears a gap for
    /// one TTL more; after that, from below the TTL's floor).
    pub(crate) fn sweep(&mut self) {
        let (now, ttl) = (now_us(), self.ttl_us);
        self.late.retain(|_, windows| {
            while windows
                .open
                .front()
                .is_some_and(|w| w.upto.saturating_add(ttl) < now)
            {
                windows.forget_oldest();
            }
            !windows.open.is_empty() || windows.forgotten_upto.saturating_add(2 * ttl) >= now
        });
        crate::id::shrink_if_sparse(&mut self.late);
        let mut dropped = 0;
        self.rings.retain(|_, ring| {
            dropped += ring.expire(now, ttl);
            !ring.entries.is_empty()
        });
        self.kept -= dropped;
        crate::id::shrink_if_sparse(&mut self.rings);
    }

    /// How often [`History::sweep`] should run.
    pub(crate) fn sweep_interval(&self) -> Duration {
        Duration::from_micros(self.ttl_us / 4).clamp(Duration::from_secs(1), Duration::from_secs(60))
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
    pub(crate) id: KeptIn,
    /// The same for broadcasts.
    pub(crate) broadcasts: KeptIn,
}

/// Kept messages of one history in Redis.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct KeptIn {
    /// Ids up to this one may have had messages that are gone.
    pub(crate) lost_upto: u64,
    /// After the position, oldest first.
    pub(crate) entries: Vec<Kept>,
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
    let (mut a, mut b) = (
        read.id.entries.into_iter().peekable(),
        read.broadcasts.entries.into_iter().peekable(),
    );
    let mut replay = Vec::with_capacity(a.len() + b.len());
    loop {
        let next = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if x.0 <= y.0 => a.next(),
            (Some(_), Some(_)) => b.next(),
            (Some(_), None) => a.next(),
            (None, _) => b.next(),
        };
        match next {
            Some(kept) if kept.0 > since => replay.push(kept),
            Some(_) => {}
            None => break,
        }
    }
    let gap = cause.map(|_| Gap {
        after: since,
        next: replay.first().map(|(ev, _)| *ev),
    });
    (
        Resume {
            position: since,
            replay,
            gap,
        },
        cause,
    )
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
    fn ids_minted_elsewhere_are_kept_in_order_and_raise_the_clock() {
        let mut h = History::new(10, Duration::from_secs(60));
        // Ids well after this process's start, so none is "before it".
        std::thread::sleep(Duration::from_millis(2));
        let mine = h.next_id();
        h.record("a", mine, &msg("mine"));
        // Another node's message minted just before this node's.
        let theirs = h.witness(mine - 1);
        h.record("a", theirs, &msg("theirs"));
        let r = h.resume("a", Some(theirs - 1));
        assert_eq!(r.replay, vec![(theirs, msg("theirs")), (mine, msg("mine"))]);
        // A stream that was at `mine` may have left before `theirs` came:
        // resuming there is told of a gap; from before both it is not.
        let r = h.resume("a", Some(mine));
        assert_eq!(
            r.gap,
            Some(Gap {
                after: mine,
                next: None
            })
        );
        assert_eq!(h.resume("a", Some(theirs - 1)).gap, None);
        // One from a node whose clock is ahead: later ids here are above it.
        let ahead = h.witness(mine + 1_000_000);
        h.record("a", ahead, &msg("ahead"));
        assert_eq!(h.last_id(), ahead);
        assert!(h.next_id() > ahead);
        assert_eq!(h.resume("a", Some(mine)).replay, vec![(ahead, msg("ahead"))]);
        assert_eq!(h.resume("a", Some(ahead)).gap, None);
    }

    #[test]
    fn a_late_window_still_tells_a_gap_once_forgotten() {
        // Overflow: two windows kept per id (size 2); the oldest goes.
        let mut h = History::new(2, Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(2));
        let mut windows = Vec::new();
        for _ in 0..3 {
            let mine = h.next_id();
            h.record("a", mine, &msg("mine"));
            let theirs = h.witness(mine - 1);
            h.record("a", theirs, &msg("theirs"));
            windows.push(mine);
        }
        for at in &windows {
            assert!(h.resume("a", Some(*at)).gap.is_some(), "at {at}");
        }
        // Expiry: after the TTL the window goes, the gap stays for one TTL
        // more (then a resume from there is below the TTL's floor).
        let mut h = History::new(10, Duration::from_millis(40));
        std::thread::sleep(Duration::from_millis(2));
        let mine = h.next_id();
        h.record("a", mine, &msg("mine"));
        let theirs = h.witness(mine - 1);
        h.record("a", theirs, &msg("theirs"));
        std::thread::sleep(Duration::from_millis(50));
        h.sweep();
        assert!(h.late["a"].open.is_empty());
        assert!(h.resume("a", Some(mine)).gap.is_some());
        std::thread::sleep(Duration::from_millis(50));
        h.sweep();
        assert!(h.late.is_empty());
    }

    #[test]
    fn an_id_minted_ahead_is_not_a_position_until_its_message_is_recorded() {
        // A keyed cluster publish: its id is minted, its message comes back
        // from Redis a moment later.
        let mut h = History::new(10, Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(2));
        let before = h.resume("a", None).position;
        let keyed = h.next_id();
        // A stream welcomed meanwhile starts before it, and leaves.
        let position = h.resume("a", None).position;
        assert_eq!(position, before);
        h.record("a", keyed, &msg("keyed"));
        let r = h.resume("a", Some(position));
        assert_eq!(r.replay, vec![(keyed, msg("keyed"))]);
        assert_eq!(r.gap, None);
        // Another message with the same id as one recorded here (two nodes'
        // clocks gave the same microsecond): a stream at that id is told.
        let twin = h.witness(keyed);
        h.record("a", twin, &msg("twin"));
        assert!(h.resume("a", Some(keyed)).gap.is_some());
        assert_eq!(h.resume("a", Some(keyed - 1)).replay.len(), 2);
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
