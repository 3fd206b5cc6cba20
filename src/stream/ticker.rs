//! One tick wheel per worker thread, instead of a timer per stream.
//!
//! A timer per stream (`ctx.run_interval`) costs every idle stream about
//! 128 bytes of heap for its whole life. Here a stream costs one weak address
//! (8 bytes, no allocation of its own) in a slot of its worker's wheel. A
//! strong `Addr` would cost as much as the timer: each clone allocates two
//! small `Arc`s of sender state. The wheel splits the tick period
//! into [`SLOTS`] slots and visits one slot per slot width, so a stream ticks
//! once per period (up to one slot width early, the first time) and the ticks
//! of many streams stay spread over the period rather than bunched together.
//!
//! A stream that stops is not taken out at once: the wheel drops its address
//! the next time it visits the slot and finds the actor gone.

use std::cell::RefCell;
use std::time::Duration;

use actix::{Message, WeakAddr};
use tokio::time::MissedTickBehavior;

use super::Stream;

/// Slots per period; the tick of a stream lands within period / SLOTS of
/// where a private timer would put it.
pub const SLOTS: u32 = 64;

/// Time for a tick: sent by the wheel to each stream once per period.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Tick;

/// The streams of one worker, spread over the slots of one period.
struct Wheel {
    slots: Vec<Vec<WeakAddr<Stream>>>,
    /// The slot visited last; a new stream joins it, so its first tick comes
    /// one period (less at most one slot width) after it starts.
    current: usize,
}

thread_local! {
    static WHEEL: RefCell<Option<Wheel>> = const { RefCell::new(None) };
}

/// The wheel's slot width and slot count for a tick period.
pub fn geometry(period: Duration) -> (Duration, usize) {
    let width = (period / SLOTS).max(Duration::from_millis(1));
    let slots = (period.as_nanos() / width.as_nanos()).max(1) as usize;
    (width, slots)
}

/// Ticks `addr` every `period` from now on. Must run on the stream's worker
/// thread, inside its runtime; the first call there starts the wheel.
pub fn register(addr: WeakAddr<Stream>, period: Duration) {
    WHEEL.with_borrow_mut(|wheel| {
        let wheel = wheel.get_or_insert_with(|| {
            let (width, slots) = geometry(period);
            actix_rt::spawn(turn(width));
            Wheel {
                slots: (0..slots).map(|_| Vec::new()).collect(),
                current: 0,
            }
        });
        wheel.slots[wheel.current].push(addr);
    });
}

/// Visits one slot per `width`, forever (the task ends with its worker).
async fn turn(width: Duration) {
    let mut every = tokio::time::interval_at(tokio::time::Instant::now() + width, width);
    every.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        WHEEL.with_borrow_mut(|wheel| {
            if let Some(wheel) = wheel {
                wheel.current = (wheel.current + 1) % wheel.slots.len();
                visit(&mut wheel.slots[wheel.current]);
            }
        });
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
        let (width, slots) = geometry(Duration::from_secs(10));
        assert_eq!(slots, SLOTS as usize);
        assert_eq!(width * slots as u32, Duration::from_secs(10));
    }

    #[test]
    fn short_periods_use_millisecond_slots() {
        assert_eq!(
            geometry(Duration::from_millis(20)),
            (Duration::from_millis(1), 20)
        );
        assert_eq!(geometry(Duration::from_millis(1)), (Duration::from_millis(1), 1));
    }
}
