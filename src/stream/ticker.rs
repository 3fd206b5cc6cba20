//! One tick wheel per worker thread, instead of a timer per stream.
//!
//! A timer per stream (`ctx.run_interval`) costs every idle stream about
//! 128 bytes of heap for its whole life. Here a stream costs one weak address
//! (8 bytes, no allocation of its own) in a slot of its worker's wheel. A
//! strong `Addr` would cost as much as the timer: each clone allocates two
//! small `Arc`s of sender state. The wheel splits the tick period into slots
//! about [`SLOT_WIDTH`] wide and visits one slot per slot width, so a stream
//! ticks once per period (up to one slot width early, the first time) and the
//! ticks of many streams stay spread over the period: at 10,000 streams, 10 s
//! and two workers, about 5 streams a slot per worker, not a burst that would
//! hold up messages.
//!
//! The wheel's task sleeps until the next slot that holds streams is due, and
//! ends when its worker has none: a server with a few streams wakes only for
//! their ticks, an idle one not at all.
//!
//! A stream that stops is not taken out at once: the wheel drops its address
//! the next time it visits the slot and finds the actor gone.
//!
//! A second wheel per worker times long-polls out the same way
//! ([`register_poll`]): a waiting poll would otherwise hold a timer of its
//! own for `stream.poll_timeout_ms`, about 120 bytes more than an idle
//! stream (measured by `scripts/longpoll-bench.py`). Its first tick is the
//! poll's timeout; the poll ends with it, and the wheel forgets it.

use std::cell::RefCell;
use std::thread::LocalKey;
use std::time::{Duration, Instant};

use actix::{Message, WeakAddr};

use super::Stream;

/// Aimed-at slot width: a tick lands within this of where a private timer
/// would put it.
pub(super) const SLOT_WIDTH: Duration = Duration::from_millis(10);

/// Most slots per period (a longer period gets wider slots).
pub(super) const MAX_SLOTS: u32 = 4096;

/// Time for a tick: sent by the wheel to each stream once per period.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Tick;

/// The streams of one worker, spread over the slots of one period.
struct Wheel {
    slots: Vec<Vec<WeakAddr<Stream>>>,
    /// Slot width: the period ÷ the number of slots.
    width: Duration,
    /// Streams in all slots (stopped ones included until visited).
    len: usize,
    /// The slot visited last ...
    current: usize,
    /// ... and the time it was due (slot `current + k` is due `k` widths later).
    visited_at: Instant,
}

impl Wheel {
    /// Widths from `current` to the next slot that holds streams (the
    /// current slot itself, a whole period on, if it is the only one).
    fn next_busy(&self) -> usize {
        let n = self.slots.len();
        (1..=n)
            .find(|&k| !self.slots[(self.current + k) % n].is_empty())
            .unwrap_or(n)
    }
}

thread_local! {
    static WHEEL: RefCell<Option<Wheel>> = const { RefCell::new(None) };
    static POLL_WHEEL: RefCell<Option<Wheel>> = const { RefCell::new(None) };
}

/// Which wheel of a worker: the streams' ticks, or the long-polls'
/// timeouts (each has one period).
#[derive(Clone, Copy)]
enum Which {
    Ticks,
    PollTimeouts,
}

impl Which {
    fn wheel(self) -> &'static LocalKey<RefCell<Option<Wheel>>> {
        match self {
            Which::Ticks => &WHEEL,
            Which::PollTimeouts => &POLL_WHEEL,
        }
    }
}

/// The wheel's slot width and slot count for a tick period.
pub(super) fn geometry(period: Duration) -> (Duration, usize) {
    let slots = (period.as_nanos() / SLOT_WIDTH.as_nanos()).clamp(1, u128::from(MAX_SLOTS)) as u32;
    (period / slots, slots as usize)
}

/// Ticks `addr` every `period` from now on. Must run on the stream's worker
/// thread, inside its runtime; the first call there starts the wheel. (All
/// streams of a worker belong to one server, so they share one period.)
pub(super) fn register(addr: WeakAddr<Stream>, period: Duration) {
    register_in(Which::Ticks, addr, period);
}

/// Sends `addr` a [`Tick`] `period` from now (up to one slot width early):
/// a long-poll's timeout (`stream.poll_timeout_ms`, one period for the
/// worker's polls). The poll ends with it; if it has not (it cannot
/// have, but if), it gets another each period until it stops.
pub(super) fn register_poll(addr: WeakAddr<Stream>, period: Duration) {
    register_in(Which::PollTimeouts, addr, period);
}

fn register_in(which: Which, addr: WeakAddr<Stream>, period: Duration) {
    let now = Instant::now();
    which.wheel().with_borrow_mut(|wheel| {
        let wheel = wheel.get_or_insert_with(|| {
            let (width, slots) = geometry(period);
            actix_rt::spawn(turn(which));
            Wheel {
                slots: (0..slots).map(|_| Vec::new()).collect(),
                width,
                len: 0,
                current: 0,
                visited_at: now,
            }
        });
        // The slot whose time has just passed: it comes round again one
        // period (less at most one width) from now.
        let n = wheel.slots.len();
        let behind =
            (now.saturating_duration_since(wheel.visited_at).as_nanos() / wheel.width.as_nanos()) as usize;
        let slot = (wheel.current + behind.min(n - 1)) % n;
        wheel.slots[slot].push(addr);
        wheel.len += 1;
    });
}

/// Sleeps until the next slot that holds streams is due, visits it, and so
/// on until the worker has no streams left; the next stream starts a new
/// wheel. A worker with few streams wakes only when one of them is due.
async fn turn(which: Which) {
    loop {
        let Some((skip, due)) = which.wheel().with_borrow(|cell| {
            cell.as_ref().map(|w| {
                let skip = w.next_busy();
                (skip, w.visited_at + w.width * skip as u32)
            })
        }) else {
            return;
        };
        // Streams that register meanwhile go to slots already past, so
        // `skip` stays right.
        tokio::time::sleep_until(due.into()).await;
        let more = which.wheel().with_borrow_mut(|cell| {
            let Some(wheel) = cell else { return false };
            wheel.current = (wheel.current + skip) % wheel.slots.len();
            wheel.visited_at = due;
            let slot = &mut wheel.slots[wheel.current];
            let before = slot.len();
            visit(slot);
            wheel.len -= before - slot.len();
            if wheel.len == 0 {
                *cell = None;
                return false;
            }
            true
        });
        if !more {
            return;
        }
    }
}

/// Sends a tick to every live stream of a slot and forgets the stopped ones.
fn visit(slot: &mut Vec<WeakAddr<Stream>>) {
    slot.retain(|weak| match weak.upgrade() {
        Some(addr) if addr.connected() => {
            addr.do_send(Tick);
            true
        }
        _ => false,
    });
    // Give memory back when most of a slot's streams have gone.
    if slot.capacity() > 64 && slot.len() < slot.capacity() / 4 {
        slot.shrink_to(slot.len() * 2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_cover_the_period() {
        assert_eq!(
            geometry(Duration::from_secs(10)),
            (Duration::from_millis(10), 1000)
        );
        assert_eq!(
            geometry(Duration::from_millis(95)),
            (Duration::from_millis(95) / 9, 9)
        );
    }

    #[test]
    fn short_periods_have_one_slot_and_long_ones_wider_slots() {
        assert_eq!(geometry(Duration::from_millis(3)), (Duration::from_millis(3), 1));
        assert_eq!(
            geometry(Duration::from_secs(3600)),
            (Duration::from_secs(3600) / 4096, 4096)
        );
    }
}
