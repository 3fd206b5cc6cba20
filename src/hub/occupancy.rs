//! Occupancy: whether an id has a stream anywhere, decided once for the
//! fleet, for the `id_occupied` and `id_vacated` webhooks
//! ([`crate::webhooks`]).
//!
//! A node holds an id from its first stream of it until the last one has
//! been gone for `cluster.unsubscribe_linger_ms` (a stream back within it
//! changes nothing): [`Single`] in one process, where that is the fleet;
//! [`Fleet`] in cluster mode, where Redis decides.
//!
//! **In Redis** ([`OCCUPANCY_SCRIPT`]), per id a set of the nodes holding
//! it (`<prefix>:occupants:<id>`): the node whose add makes it one member
//! sends `id_occupied`, the one whose removal empties it `id_vacated`.
//! Each node also keeps the set of ids it is in (`<prefix>:holds:<instance>`)
//! and its place in `<prefix>:holders`, scored by when it expires (Redis's
//! time plus the heartbeat TTL, renewed every heartbeat). A node that dies
//! stops renewing it; the first live node to see it expired takes its ids
//! out ([`REAP_SCRIPT`], a bounded number per step) and sends `id_vacated`
//! for those it leaves empty, naming the dead node. A node that finds its
//! own place gone or expired (it lost Redis for longer than the TTL, and
//! may have been reaped) writes every id it holds again: ids reaped
//! meanwhile are occupied again.
//!
//! Changes wait in [`Fleet`] until written. A write whose answer was not
//! read (Redis timed out, the connection dropped, the Bus restarted) is
//! sent again unchanged under its number, and the script answers a repeat
//! with its first answer: a Redis outage delays events, it does not lose
//! or double them. What it cannot cover: Redis losing its data (a restart
//! without persistence, FLUSHALL, a failover that lost the last writes).
//! Every node then writes its ids again, so ids still held are announced
//! occupied again, and one released meanwhile may never be vacated. (A
//! reap step's ids wait on the reaper's list in Redis until sent, so a
//! lost answer loses none of them.) Treat
//! the events as the fleet's state changes, and `/presence/{id}` as the
//! truth to reconcile with.

use std::collections::HashMap;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::AsyncCommands;

use crate::error::ApiError;
use crate::hub::cluster::Cluster;
use crate::webhooks::{Name, Webhooks};

/// Most ids one write, or one step of a reap, carries.
const BATCH: usize = 1_000;

/// Most reap steps per heartbeat.
const REAP_STEPS: usize = 20;

/// Adds and removes this node for ids, renewing its place in the
/// holders, once per write number. KEYS: holders, this node's holds set,
/// its last write's answer, then each id's occupants set. ARGV: this
/// node's member (`<instance> <name>`), the TTL in ms, the write's number,
/// then per id its op (`+` or `-`) and the id. Answers `"<live>
/// <changed>"`: 1 if this node's place was there and unexpired before, and
/// per id a digit, 1 when it made the id occupied (`+`) or vacated (`-`).
///
/// The answer is kept under the write's number: a write sent again
/// because its answer was lost (a timeout, a dropped connection) gets the
/// first answer instead of running twice, whose SADD and SREM would find
/// nothing to change and lose the event.
const OCCUPANCY_SCRIPT: &str = "local last = redis.call('GET', KEYS[3]) \
    if last then \
    local seq, answer = string.match(last, '^(%d+) (.*)$') \
    if seq == ARGV[3] then return answer end end \
    local t = redis.call('TIME') \
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
    local score = redis.call('ZSCORE', KEYS[1], ARGV[1]) \
    local live = '0' \
    if score and tonumber(score) >= now then live = '1' end \
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1]) \
    local changed = {} \
    for k = 4, #KEYS do \
    local j = k - 3 \
    local op, id = ARGV[2 * j + 2], ARGV[2 * j + 3] \
    local c = '0' \
    if op == '+' then \
    if redis.call('SADD', KEYS[k], ARGV[1]) == 1 then \
    redis.call('SADD', KEYS[2], id) \
    if redis.call('SCARD', KEYS[k]) == 1 then c = '1' end end \
    else \
    if redis.call('SREM', KEYS[k], ARGV[1]) == 1 then \
    redis.call('SREM', KEYS[2], id) \
    if redis.call('EXISTS', KEYS[k]) == 0 then c = '1' end end \
    end \
    changed[j] = c \
    end \
    local answer = live .. ' ' .. table.concat(changed) \
    redis.call('SET', KEYS[3], ARGV[3] .. ' ' .. answer, 'PX', tonumber(ARGV[2]) * 10) \
    return answer";

/// A graceful stop: this node's place expires after the linger (ARGV[2]
/// ms of Redis's time), so a client that reconnects to another node within
/// it keeps its id occupied, and otherwise the next live node vacates its
/// ids. KEYS: holders. ARGV: the member, the linger in ms.
const LEAVE_SCRIPT: &str = "local t = redis.call('TIME') \
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
    return redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])";

/// Takes up to ARGV[2] ids out of one expired node's holds (the first in
/// the holders whose time has passed), and drops its place once none is
/// left. Each id it leaves with no node goes onto the reaping node's list
/// (`<id> <dead node's name>`), which that node sends as `id_vacated` and
/// then trims: an answer lost on the way (a timeout) loses no event, the
/// next step finds them there. KEYS: holders, the reaper's list. ARGV: the
/// key prefix, the most ids. Answers `{}` (no node expired) or `{member,
/// how many were vacated}`.
const REAP_SCRIPT: &str = "local t = redis.call('TIME') \
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
    local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. now, 'LIMIT', 0, 1) \
    if #dead == 0 then return {} end \
    local member = dead[1] \
    local instance = string.match(member, '^(%S+)') \
    local name = string.match(member, '^%S+ (.*)$') or member \
    local holds = ARGV[1] .. ':holds:' .. instance \
    local ids = redis.call('SPOP', holds, tonumber(ARGV[2])) \
    local vacated = {} \
    for _, id in ipairs(ids) do \
    local key = ARGV[1] .. ':occupants:' .. id \
    if redis.call('SREM', key, member) == 1 and redis.call('EXISTS', key) == 0 then \
    vacated[#vacated + 1] = id .. ' ' .. name end \
    end \
    if #vacated > 0 then redis.call('RPUSH', KEYS[2], unpack(vacated)) end \
    if redis.call('EXISTS', holds) == 0 then redis.call('ZREM', KEYS[1], member) end \
    return {member, #vacated}";

/// Occupancy in a single process: every id held here is held by the fleet.
pub(crate) struct Single {
    webhooks: Arc<Webhooks>,
    linger: Duration,
    /// Ids whose last stream left, and when they are vacated.
    lingering: Mutex<HashMap<Arc<str>, Instant>>,
}

impl Single {
    /// Vacates an id `linger` after its last stream.
    pub(crate) fn new(webhooks: Arc<Webhooks>, linger: Duration) -> Single {
        Single {
            webhooks,
            linger,
            lingering: Mutex::new(HashMap::new()),
        }
    }

    fn lingering(&self) -> MutexGuard<'_, HashMap<Arc<str>, Instant>> {
        self.lingering
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `id` has its first stream here (or one again).
    pub(crate) fn held(&self, id: &Arc<str>) {
        if !self.webhooks.events_of(id).occupancy() {
            return;
        }
        if self.lingering().remove(id).is_none() {
            self.webhooks.emit(Name::IdOccupied, id, None, None);
        }
    }

    /// `id`'s last stream here is gone.
    pub(crate) fn released(&self, id: Arc<str>) {
        if self.webhooks.events_of(&id).occupancy() {
            self.lingering().insert(id, Instant::now() + self.linger);
        }
    }

    /// Vacates the ids whose linger is over.
    pub(crate) fn sweep(&self) {
        let now = Instant::now();
        let mut expired = Vec::new();
        self.lingering().retain(|id, until| {
            let over = *until <= now;
            if over {
                expired.push(Arc::clone(id));
            }
            !over
        });
        for id in expired {
            self.webhooks.emit(Name::IdVacated, &id, None, None);
        }
    }

    /// The process stops: every lingering id is vacated now.
    pub(crate) fn vacate_all(&self) {
        let lingering: Vec<Arc<str>> = self.lingering().drain().map(|(id, _)| id).collect();
        for id in lingering {
            self.webhooks.emit(Name::IdVacated, &id, None, None);
        }
    }

    /// How often [`Single::sweep`] should run.
    pub(crate) fn sweep_every(&self) -> Duration {
        (self.linger / 4).clamp(Duration::from_millis(10), Duration::from_millis(500))
    }
}

/// Occupancy in a fleet: this node's changes, written to Redis.
pub(crate) struct Fleet {
    webhooks: Arc<Webhooks>,
    /// This node in the occupants sets: `<instance> <name>`.
    member: String,
    /// Changes not yet written: an id and whether it is held.
    pending: Mutex<HashMap<Arc<str>, bool>>,
    /// A write whose answer was not read (it failed, timed out, or its
    /// task was dropped with a Bus restart): its number and changes, sent
    /// again, unchanged, before anything newer.
    in_doubt: Mutex<Option<(u64, Batch)>>,
    /// The last write's number.
    seq: AtomicU64,
    /// A write is out (writes must not overtake each other).
    writing: AtomicBool,
    /// Some id of this node's was written: its place should be there.
    written: AtomicBool,
    /// This node's place was found lost: every id it holds is to be
    /// written again (kept until [`Fleet::hold_all`] has them).
    rewrite: AtomicBool,
}

/// Occupancy changes: an id and whether it is held.
type Batch = Vec<(Arc<str>, bool)>;

/// Clears [`Fleet::writing`] however a write ends (its task may be
/// dropped with a Bus restart).
struct Writing<'a>(&'a Fleet);

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.0.writing.store(false, SeqCst);
    }
}

/// What a write found.
pub(crate) enum Wrote {
    /// Written (or nothing to write).
    Done,
    /// This node's place was gone or expired: every id it holds must be
    /// written again.
    Lost,
}

impl Fleet {
    /// This node's occupancy, as `instance` named `node`.
    pub(crate) fn new(webhooks: Arc<Webhooks>, instance: &str, node: &str) -> Fleet {
        Fleet {
            webhooks,
            member: format!("{instance} {node}"),
            pending: Mutex::new(HashMap::new()),
            in_doubt: Mutex::new(None),
            seq: AtomicU64::new(0),
            writing: AtomicBool::new(false),
            written: AtomicBool::new(false),
            rewrite: AtomicBool::new(false),
        }
    }

    fn pending(&self) -> MutexGuard<'_, HashMap<Arc<str>, bool>> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `id` is held here now (`true`: its first stream; `false`: its last
    /// one gone, after the linger). Written at the next step.
    pub(crate) fn change(&self, id: &Arc<str>, held: bool) {
        if self.webhooks.events_of(id).occupancy() {
            self.pending().insert(Arc::clone(id), held);
        }
    }

    /// Every id in `held` is held here (after [`Wrote::Lost`]).
    pub(crate) fn hold_all(&self, held: impl IntoIterator<Item = Arc<str>>) {
        let mut pending = self.pending();
        for id in held {
            if self.webhooks.events_of(&id).occupancy() {
                pending.entry(id).or_insert(true);
            }
        }
        self.rewrite.store(false, SeqCst);
    }

    fn in_doubt(&self) -> MutexGuard<'_, Option<(u64, Batch)>> {
        self.in_doubt
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a change waits to be written.
    pub(crate) fn has_changes(&self) -> bool {
        !self.pending().is_empty()
    }
}

impl Cluster {
    /// Writes up to [`BATCH`] of this node's occupancy changes (and renews
    /// its place: also with none), and sends the events the fleet's state
    /// says. `None` while another write is out. A write whose answer is
    /// not read is sent again, unchanged and under its number, before
    /// anything newer (the script answers a repeat with its first answer).
    pub(crate) async fn write_occupancy(&self) -> Option<Result<Wrote, ApiError>> {
        let fleet = self.occupancy.as_ref()?;
        if fleet.writing.swap(true, SeqCst) {
            return None;
        }
        let _writing = Writing(fleet);
        if fleet.rewrite.load(SeqCst) {
            return Some(Ok(Wrote::Lost));
        }
        let (seq, batch) = {
            let mut doubt = fleet.in_doubt();
            let (seq, batch) = doubt.take().unwrap_or_else(|| {
                let mut pending = fleet.pending();
                let ids: Vec<Arc<str>> = pending.keys().take(BATCH).cloned().collect();
                let batch: Batch = ids
                    .into_iter()
                    .filter_map(|id| pending.remove_entry(&id))
                    .collect();
                (fleet.seq.fetch_add(1, SeqCst) + 1, batch)
            });
            // In doubt until its answer is read.
            *doubt = Some((seq, batch.clone()));
            (seq, batch)
        };
        let (live, changed) = match self.run_occupancy(fleet, seq, &batch).await {
            Ok(answer) => answer,
            Err(e) => return Some(Err(e)),
        };
        *fleet.in_doubt() = None;
        for ((id, held), changed) in batch.iter().zip(changed.bytes()) {
            if changed == b'1' {
                let name = if *held { Name::IdOccupied } else { Name::IdVacated };
                fleet.webhooks.emit(name, id, None, None);
            }
        }
        let lost = !live && fleet.written.load(SeqCst);
        if !batch.is_empty() {
            fleet.written.store(true, SeqCst);
        }
        if lost {
            fleet.rewrite.store(true, SeqCst);
        }
        Some(Ok(if lost { Wrote::Lost } else { Wrote::Done }))
    }

    async fn run_occupancy(
        &self,
        fleet: &Fleet,
        seq: u64,
        batch: &[(Arc<str>, bool)],
    ) -> Result<(bool, String), ApiError> {
        static SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(OCCUPANCY_SCRIPT));
        let mut invocation = SCRIPT.prepare_invoke();
        invocation
            .key(self.names.holders_key())
            .key(self.names.holds_key(&self.instance))
            .key(self.names.occupancy_write_key(&self.instance));
        for (id, _) in batch {
            invocation.key(self.names.occupants_key(id));
        }
        invocation
            .arg(&fleet.member)
            .arg(self.settings.heartbeat_ttl_ms)
            .arg(seq);
        for (id, held) in batch {
            invocation.arg(if *held { "+" } else { "-" }).arg(&**id);
        }
        let answer: String = self
            .command("occupancy", async move |mut c| {
                invocation.invoke_async(&mut c).await
            })
            .await?;
        match answer.split_once(' ') {
            Some((live @ ("0" | "1"), changed)) if changed.len() == batch.len() => {
                Ok((live == "1", changed.to_owned()))
            }
            _ => {
                self.bad_state("an occupancy answer", &answer);
                Err(ApiError::RedisRefused("occupancy: not an answer per id".into()))
            }
        }
    }

    /// Takes the ids of nodes whose place expired out of the fleet's
    /// occupancy, at most [`REAP_STEPS`] × [`BATCH`] of them, and sends
    /// `id_vacated` for each id left with no node, naming the dead node.
    pub(crate) async fn reap_occupancy(&self) -> Result<(), ApiError> {
        let Some(fleet) = self.occupancy.as_ref() else {
            return Ok(());
        };
        // What an earlier step took out but whose answer was lost.
        self.send_reaped(fleet).await?;
        for _ in 0..REAP_STEPS {
            static SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(REAP_SCRIPT));
            let (holders, list, prefix) = (
                self.names.holders_key(),
                self.names.reaped_key(&self.instance),
                self.names.prefix().to_owned(),
            );
            let answer: Vec<redis::Value> = self
                .command("occupancy reap", async move |mut c| {
                    SCRIPT
                        .key(holders)
                        .key(list)
                        .arg(prefix)
                        .arg(BATCH)
                        .invoke_async(&mut c)
                        .await
                })
                .await?;
            let Some((member, vacated)) = reaped(answer) else {
                return Ok(());
            };
            tracing::info!(
                event = "occupancy_reaped",
                node = %member.split_once(' ').map_or(&*member, |(_, name)| name),
                vacated,
                "a node's heartbeat expired: its ids were taken out of the fleet's occupancy"
            );
            self.send_reaped(fleet).await?;
        }
        Ok(())
    }

    /// Sends the ids on this node's reaped list as `id_vacated` (naming the
    /// node that held them), then trims what it sent: at least once, never
    /// lost.
    async fn send_reaped(&self, fleet: &Fleet) -> Result<(), ApiError> {
        loop {
            let list = self.names.reaped_key(&self.instance);
            let entries: Vec<String> = {
                let list = list.clone();
                self.command("occupancy reaped", async move |mut c| {
                    c.lrange(list, 0, BATCH as isize - 1).await
                })
                .await?
            };
            if entries.is_empty() {
                return Ok(());
            }
            for entry in &entries {
                let Some((id, node)) = entry.split_once(' ') else {
                    self.bad_state("a reaped id", entry);
                    continue;
                };
                fleet
                    .webhooks
                    .emit(Name::IdVacated, &Arc::from(id), Some(&Arc::from(node)), None);
            }
            let sent = entries.len() as isize;
            self.command("occupancy reaped", async move |mut c| {
                c.ltrim::<_, ()>(list, sent, -1).await
            })
            .await?;
        }
    }

    /// At a graceful stop: this node's place expires after the unsubscribe
    /// linger ([`LEAVE_SCRIPT`]), and the next live node to look then
    /// vacates its ids, instead of a heartbeat TTL later.
    pub(crate) async fn leave_occupancy(&self) {
        static SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(LEAVE_SCRIPT));
        let Some(fleet) = self.occupancy.as_ref() else {
            return;
        };
        let (holders, member, linger) = (
            self.names.holders_key(),
            fleet.member.clone(),
            self.settings.unsubscribe_linger_ms,
        );
        let _ = self
            .command("occupancy leave", async move |mut c| {
                SCRIPT
                    .key(holders)
                    .arg(member)
                    .arg(linger)
                    .invoke_async::<i64>(&mut c)
                    .await
            })
            .await;
    }
}

/// A reap step's answer: the node and the ids it left vacated.
fn reaped(answer: Vec<redis::Value>) -> Option<(String, u64)> {
    let mut parts = answer.into_iter();
    let member: String = redis::from_redis_value(parts.next()?).ok()?;
    let vacated: u64 = redis::from_redis_value(parts.next()?).ok()?;
    Some((member, vacated))
}
