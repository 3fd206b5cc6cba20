//! The memory broker: one process. It owns the event-id clock, the
//! per-id [`History`] and the `Idempotency-Key`s of a single process.
//!
//! An event id is minted in the Router's step that delivers the message
//! ([`Broker::keep`]), after the backlog admitted it, so ids follow the
//! order of delivery and a refused publish costs no id. The Router is one
//! actor, so the lock around the history is never contended by publishes;
//! `/stats` reads only counters.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::{Answer, Broker, Counts, Later, LaterFrom, Outgoing, Publishing, Read, Receipt, Subscription};
use crate::config::Settings;
use crate::error::ApiError;
use crate::hub::cluster::{Presence, single_presence};
use crate::hub::history::{CaughtUp, History};
use crate::hub::local::Local;
use crate::hub::occupancy::Single;
use crate::hub::router::Note;
use crate::idempotency::{self, Begin, Keys};
use crate::stats::Stats;
use crate::webhooks::Webhooks;

/// See the module docs.
pub(crate) struct Memory {
    history: Mutex<History>,
    /// Publishes' `Idempotency-Key`s.
    keys: Keys<Receipt>,
    /// Where the history's sizes are published.
    stats: Arc<Stats>,
    /// `cluster.unsubscribe_linger_ms`: how long an id stays occupied
    /// after its last stream.
    linger: Duration,
    /// `id_occupied` and `id_vacated` (with `hooks.events_url`).
    occupancy: Option<Single>,
    /// With occupancy, when the history is next swept.
    history_due: Mutex<std::time::Instant>,
}

impl Memory {
    /// Keeps `history.size` messages per id for `history.ttl_ms`, and keys
    /// for `publish.idempotency_ttl_ms`.
    pub(crate) fn new(settings: &Settings, stats: &Arc<Stats>) -> Self {
        Memory {
            history: Mutex::new(History::with(crate::namespace::Namespaces::new(settings))),
            keys: Keys::new(Duration::from_millis(settings.publish.idempotency_ttl_ms)),
            stats: Arc::clone(stats),
            linger: Duration::from_millis(settings.cluster.unsubscribe_linger_ms),
            occupancy: None,
            history_due: Mutex::new(std::time::Instant::now()),
        }
    }

    /// Sends `id_occupied` and `id_vacated` with `webhooks` (`None`: none).
    pub(crate) fn with_webhooks(mut self, webhooks: Option<Arc<Webhooks>>) -> Self {
        self.occupancy = webhooks.map(|w| Single::new(w, self.linger));
        self
    }

    /// The history; a panic while it was held (a bug) leaves it as it was.
    fn history(&self) -> MutexGuard<'_, History> {
        self.history
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Publishes the history's sizes in `/stats`.
    fn history_stats(&self, history: &History) {
        let (ids, kept) = history.sizes();
        self.stats.history_ids.store(ids as u64, Relaxed);
        self.stats.history_messages.store(kept as u64, Relaxed);
    }
}

impl Broker for Memory {
    fn streams_wait(&self) -> bool {
        false
    }

    fn subscribe(&self, id: &Arc<str>) -> Subscription {
        if let Some(occupancy) = &self.occupancy {
            occupancy.held(id);
        }
        Subscription::Live
    }

    fn unsubscribe(&self, id: Arc<str>) {
        if let Some(occupancy) = &self.occupancy {
            occupancy.released(id);
        }
    }

    fn confirm(&self, _: Arc<str>) -> Subscription {
        Subscription::Live
    }

    fn keep(&self, id: &str, msg: &Arc<str>) -> Option<u64> {
        let mut history = self.history();
        let event = history.next_id();
        history.record(id, event, msg);
        self.history_stats(&history);
        Some(event)
    }

    fn read(&self, id: &Arc<str>, since: Option<u64>) -> Read {
        Read::Now(self.history().read(id, since))
    }

    /// Never asked: one process loses no link.
    fn catch_up(&self, _: Vec<Arc<str>>, _: u64) -> Later<Option<CaughtUp>> {
        Box::pin(async { None })
    }

    fn presence_every(&self) -> Option<Duration> {
        None
    }

    /// Never asked ([`Memory::presence_every`] is `None`).
    fn write_presence(&self, _: Counts, _: bool) -> Later<Result<bool, ()>> {
        Box::pin(async { Ok(true) })
    }

    /// One process: its streams had it from the Router.
    fn notify(&self, _: &Arc<str>, _: &Note) {}

    /// The lingering ids are vacated now (the process is about to exit).
    fn stopping(&self) {
        if let Some(occupancy) = &self.occupancy {
            occupancy.vacate_all();
        }
    }

    fn upkeep_every(&self) -> Option<Duration> {
        let history = self.history().sweep_interval();
        Some(match &self.occupancy {
            Some(occupancy) => history.min(occupancy.sweep_every()),
            None => history,
        })
    }

    fn upkeep(&self) {
        if let Some(occupancy) = &self.occupancy {
            occupancy.sweep();
            // Called more often than the history needs: swept when due,
            // and the history not locked before.
            let now = std::time::Instant::now();
            let mut due = self
                .history_due
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if *due > now {
                return;
            }
            *due = now + self.history().sweep_interval();
        }
        let mut history = self.history();
        history.sweep();
        self.history_stats(&history);
    }

    /// This node's streams get it from the Router, which mints its id
    /// ([`Memory::keep`]). With a key: a failure (an error, or a full
    /// backlog) releases it, since nothing was delivered, so a retry is a
    /// first attempt.
    fn publish<'a>(&'a self, out: Outgoing<'a>, here: &'a Local) -> Publishing<'a> {
        let Outgoing { target, msg, key } = out;
        Box::pin(async move {
            let Some(key) = key else {
                return here.deliver(target, msg).await.map(Answer::Done);
            };
            let request = idempotency::fingerprint(&target.name(), msg);
            match self.keys.begin(&key, &request) {
                Begin::Replay(answer) => Ok(here.replayed(Some(answer))),
                Begin::InFlight => Err(ApiError::IdempotencyInFlight),
                Begin::Mismatch => Err(ApiError::IdempotencyKeyReused),
                Begin::Full => Err(ApiError::TooManyKeys),
                Begin::New(ticket) => {
                    let receipt = here.deliver(target, msg).await?;
                    ticket.finish(receipt.clone());
                    Ok(Answer::Done(receipt))
                }
            }
        })
    }

    fn presence<'a>(
        &'a self,
        id: &'a str,
        here: usize,
        subjects: Option<Vec<Arc<str>>>,
    ) -> LaterFrom<'a, Result<Presence, ApiError>> {
        Box::pin(async move { Ok(single_presence(id, here).with_subjects(subjects, Vec::new())) })
    }
}

/// The memory broker under a real Router with one stream that takes what
/// it is handed: ids minted in delivery order and read back for a resume,
/// `Idempotency-Key`s, and a full backlog that mints nothing.
#[cfg(test)]
mod tests {
    use actix::{Actor, Addr};

    use super::*;
    use crate::hub::broker::Target;
    use crate::hub::history::FleetHistory;
    use crate::hub::router::testing::{Taker, Took};
    use crate::hub::router::{Login, Router};
    use crate::id::next_conn_id;

    /// The broker, its Router with one stream of `x` (holding what it is
    /// handed if `hold`), and the Router as a publisher sees it.
    async fn start(hold: bool, wait_ms: u64) -> (Arc<Memory>, Local, Took, Addr<Taker>) {
        let mut settings = Settings::defaults();
        settings.publish.max_backlog = 1;
        settings.publish.wait_ms = wait_ms;
        let stats = Arc::new(Stats::new());
        let memory = Arc::new(Memory::new(&settings, &stats));
        let router = Router::<Taker>::new(Arc::clone(&stats), Arc::clone(&memory) as Arc<dyn Broker>).start();
        let taker = Taker::new(hold);
        let took = Arc::clone(&taker.took);
        let addr = taker.start();
        router
            .send(Login {
                id: Arc::from("x"),
                conn: next_conn_id(),
                addr: addr.downgrade(),
            })
            .await
            .unwrap();
        let local = Local {
            publish_to: router.clone().recipient(),
            broadcast_to: router.clone().recipient(),
            count_of: router.recipient(),
            stats,
            publish: settings.publish.clone(),
            shutdown: tokio_util::sync::CancellationToken::new(),
        };
        (memory, local, took, addr)
    }

    fn out<'a>(target: &'a Target, msg: &'a Arc<str>, key: Option<String>) -> Outgoing<'a> {
        Outgoing { target, msg, key }
    }

    fn done(answer: Result<Answer, ApiError>) -> Receipt {
        match answer {
            Ok(Answer::Done(receipt)) => receipt,
            other => panic!("not delivered: {other:?}"),
        }
    }

    #[actix_rt::test]
    async fn ids_are_minted_in_delivery_order_and_a_resume_reads_them_back() {
        let (memory, here, took, _stream) = start(false, 1_000).await;
        let x = Target::Id("x".to_owned());
        let (a, b) = (Arc::from("a"), Arc::from("b"));
        let first = done(memory.publish(out(&x, &a, None), &here).await);
        let second = done(memory.publish(out(&x, &b, None), &here).await);
        assert_eq!((first.delivered, second.delivered), (1, 1));
        let (e1, e2) = (first.event_id.unwrap(), second.event_id.unwrap());
        assert!(e2 > e1);
        // The stream got each under the id its receipt names.
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            *took.lock().unwrap(),
            [("a".to_owned(), Some(e1)), ("b".to_owned(), Some(e2))]
        );
        // A stream that had the first is owed the second, with no gap.
        let Read::Now(read) = memory.read(&Arc::from("x"), Some(e1)) else {
            panic!("a memory read answers at once");
        };
        assert_eq!(read.clock, e2);
        assert_eq!(
            read.id,
            FleetHistory {
                lost_upto: read.id.lost_upto,
                entries: vec![(e2, Arc::clone(&b))],
            }
        );
        assert!(read.id.lost_upto <= e1, "no gap after {e1}: {read:?}");
        // A broadcast has no event id in one process.
        let all = done(memory.publish(out(&Target::All, &a, None), &here).await);
        assert_eq!((all.delivered, all.event_id), (1, None));
    }

    #[actix_rt::test]
    async fn a_repeated_key_gets_the_first_answer_and_delivers_nothing() {
        let (memory, here, took, _stream) = start(false, 1_000).await;
        let x = Target::Id("x".to_owned());
        let (a, other) = (Arc::from("a"), Arc::from("other"));
        let key = || Some("k1".to_owned());
        let first = done(memory.publish(out(&x, &a, key()), &here).await);
        match memory.publish(out(&x, &a, key()), &here).await {
            Ok(Answer::Replayed(Some(again))) => assert_eq!(again, first),
            other => panic!("not replayed: {other:?}"),
        }
        assert!(matches!(
            memory.publish(out(&x, &other, key()), &here).await,
            Err(ApiError::IdempotencyKeyReused)
        ));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(took.lock().unwrap().len(), 1, "delivered once");
    }

    #[actix_rt::test]
    async fn a_full_backlog_refuses_and_mints_nothing() {
        // The stream holds its first delivery: the backlog (bound 1) is
        // full for the second, which waits 50 ms and is refused.
        let (memory, here, _, _stream) = start(true, 50).await;
        let x = Target::Id("x".to_owned());
        let first = done(memory.publish(out(&x, &Arc::from("a"), None), &here).await);
        assert!(matches!(
            memory.publish(out(&x, &Arc::from("b"), None), &here).await,
            Err(ApiError::Backlogged { limit: 1 })
        ));
        // Nothing after the first was kept.
        let Read::Now(read) = memory.read(&Arc::from("x"), first.event_id) else {
            panic!("a memory read answers at once");
        };
        assert!(read.id.entries.is_empty());
        assert_eq!(read.clock, first.event_id.unwrap());
    }
}
