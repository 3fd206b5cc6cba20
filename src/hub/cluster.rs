//! Cluster mode: several switchboard processes, on one box or many, behave
//! as one server through Redis pub/sub (the engine Centrifugo, Nchan and
//! Socket.IO use for the same job).
//!
//! - Routing: a node SUBSCRIBEs to `<prefix>:id:<id>` while it holds a
//!   stream of `id` (plus an unsubscribe linger), and every node to
//!   `<prefix>:broadcast`. `/send` and `/broadcast` run [`PUBLISH_SCRIPT`]
//!   ([`Cluster::publish`]), which gives the message its event id, keeps it
//!   in the fleet's history and PUBLISHes it; every node's streams get it
//!   from Redis, this node's from its own echo. The subscriptions live on
//!   one connection owned by the supervised [`super::bus::Bus`] actor.
//! - Commands (PUBLISH, INCRBY, heartbeats, `/cluster`) go over a second,
//!   multiplexed connection that redis-rs's `ConnectionManager` reconnects
//!   by itself ([`Cluster`]).
//! - Every node keeps a heartbeat key with a TTL (`<prefix>:node:<name>`)
//!   and its name in the `<prefix>:nodes` sorted set; `/cluster` reads them.
//! - `/dispatcher` numbers come from `INCRBY <prefix>:dispatcher n`, one
//!   command per batch of requests.
//!
//! A message on the bus, an id's or a broadcast, is
//! `"<instance>/<seq>@<event> <text>"`: the publishing process's random
//! instance id and the publish's number there (by which that node knows
//! its echo, [`AwaitedEcho`]), the event id the script gave it, and the
//! message line. Every node delivers a message under that event id: it is
//! minted once. (A message without one, `"<origin> <text>"` from a node of
//! a version before ids travelled, is delivered without an id.)

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::io::tcp::TcpSettings;
use redis::{AsyncCommands, IntoConnectionInfo};
use serde::{Deserialize, Serialize};

use crate::config::{ClusterSettings, redact_url};
use crate::error::ApiError;
use crate::hub::broker::HeldCount;
use crate::hub::history::{CaughtUp, FleetHistory, FleetRead, KeptMessage};
use crate::hub::router::{MAX_SUBJECTS, NoteKind};
use crate::hub::sharded::{Commands, FLEET_TAG, Topology};
use crate::namespace::Namespaces;
use crate::stats::Stats;

/// How far behind its expiry time a stale name is pruned from the node set;
/// the heartbeat key's TTL, not the set, decides who is live, so clocks that
/// differ between boxes do no harm.
const PRUNE_AFTER_MS: u64 = 60_000;

/// Deletes a node's key and set entry if the key holds this instance.
const LEAVE_SCRIPT: &str = "local v = redis.call('GET', KEYS[1]) \
    if v and string.find(v, ARGV[2], 1, true) then \
    redis.call('DEL', KEYS[1]) redis.call('ZREM', KEYS[2], ARGV[1]) end return 0";

/// Lua for both scripts: an id as Redis stream ids and `HSET` take it.
/// (Redis's Lua turns a number into text with 14 significant digits;
/// event ids have 16.)
const LUA_PRELUDE: &str = "local function fmt(n) return string.format('%.0f', n) end \
    local function ms(id) return tonumber(string.match(id, '^(%d+)')) end \
    local t = redis.call('TIME') \
    local now = tonumber(t[1]) * 1000000 + tonumber(t[2]) \
    local f = redis.call('HMGET', KEYS[1], 'clock', 'epoch') \
    local clock, epoch = tonumber(f[1]), tonumber(f[2]) \
    if not clock or not epoch then clock = now epoch = now \
    redis.call('HSET', KEYS[1], 'clock', fmt(now), 'epoch', fmt(now)) end ";

/// [`LUA_PRELUDE`] on a Redis Cluster, where `KEYS[1]` is the id's own
/// clock (`<prefix>:clock:{<id>}`), in the id's slot: no key is touched by
/// every publish. The hash also records which master minted its last id
/// (`node`: `CLUSTER MYID`). Another master (a replica promoted by a
/// failover, which may lack the last entries; or the slot's new owner
/// after a reshard) begins a new epoch for the id, past its clock: every
/// resume from before it is told a gap, never a silent hole (after a
/// reshard, which loses nothing, the gap is a cautious one). The hash
/// expires with the id's history (`keep`, its TTL in ms, set by the script
/// that includes this): a clock made again starts a new epoch too.
const SHARDED_PRELUDE: &str = "local function fmt(n) return string.format('%.0f', n) end \
    local function ms(id) return tonumber(string.match(id, '^(%d+)')) end \
    local t = redis.call('TIME') \
    local now = tonumber(t[1]) * 1000000 + tonumber(t[2]) \
    local me = redis.call('CLUSTER', 'MYID') \
    local f = redis.call('HMGET', KEYS[1], 'clock', 'epoch', 'node') \
    local clock, epoch = tonumber(f[1]), tonumber(f[2]) \
    if not clock or not epoch then clock = now epoch = now \
    redis.call('HSET', KEYS[1], 'clock', fmt(now), 'epoch', fmt(now), 'node', me) \
    elseif f[3] ~= me then epoch = math.max(now, clock + 1) \
    redis.call('HSET', KEYS[1], 'epoch', fmt(epoch), 'node', me) end \
    local kept = tonumber(keep) \
    if not kept or kept <= 0 then kept = 3600000 end \
    redis.call('PEXPIRE', KEYS[1], kept) ";

/// Claims a broadcast's `Idempotency-Key` on a Redis Cluster, in the
/// fleet's slot, before its copies go to every shard
/// ([`Cluster::broadcast_sharded`]).
///
/// KEYS: the idempotency key. ARGV: the claim, its TTL in ms (short until
/// every copy went: [`Cluster::claim_ms`]). Answers `{1}` (claimed) or
/// `{0, <what the key holds>}`.
const CLAIM_SCRIPT: &str = "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {1} end \
    return {0, redis.call('GET', KEYS[1])}";

/// Every copy of a broadcast went: its claim holds for the key's whole
/// TTL. KEYS: the key. ARGV: the claim, the TTL in ms.
const EXTEND_SCRIPT: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
    return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0";

/// Gives a broadcast's claim back when not every copy went, so that a retry
/// is sent; only if the key still holds this claim (it may have expired
/// and been claimed again). KEYS: the key. ARGV: the claim.
const RELEASE_SCRIPT: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
    return redis.call('DEL', KEYS[1]) end return 0";

/// Publishes a message fleet-wide in one step, so that it has one event id
/// and one place in its id's order on every node:
///
/// 1. with an `Idempotency-Key`, claims it (`SET NX PX`) and stops if it
///    was used (answering `{0, <what the key holds>}`);
/// 2. mints the event id from the fleet's clock (`<prefix>:fleet`, field
///    `clock`): Redis's time in microseconds, above every id given before;
/// 3. keeps the message in the history stream (`XADD`, entry id
///    `<event id>-0`, `MAXLEN history.size`, the key expiring
///    `history.ttl_ms` after its last message; an entry older than that
///    stays while the id gets messages, within `MAXLEN`: a resume is
///    served more, never less, and a per-entry trim would cost every
///    publish one more command). A stream made new (`XADD NOMKSTREAM`
///    finds none) records
///    (`XSETID … MAXDELETEDID`) that ids before it may have had messages
///    that are gone: expired with the previous key, or from before the
///    fleet's epoch;
/// 4. PUBLISHes `<origin>@<event id> <message>` on the channel.
///
/// Answers `{1, <event id>, <receivers>, <repaired>}`. Redis runs a script
/// alone, so the order of event ids is the order of the PUBLISHes, which
/// is the order every node receives them in.
///
/// The fleet's clock is Redis state, so it is checked like input (issue
/// 40). Ids never go backwards (a stream drops what is not after its
/// position), so a clock ahead of Redis's time is followed, not moved
/// back, while it is at most [`CLOCK_TOLERANCE`] ahead: every node accepts
/// such ids ([`MAX_AHEAD`] of Redis's time, as each node measures it). A
/// clock further ahead, up to [`CLOCK_RESET_AFTER`], refuses the publish
/// before anything is kept or sent (`{2, clock, now}`, a 503 naming the
/// skew) until Redis's time reaches it: it can only be there if Redis's
/// time went back or the key was written by hand, and no id past the
/// tolerance was ever given. Further still, or past what Lua's numbers
/// hold exactly (2^52), the clock cannot be waited for: it is reset to
/// Redis's time with a new epoch (every resume from before it is told a
/// gap, as after a failover), and `<repaired>` says so for the log. A
/// history stream whose last entry is at or past the new id (kept under
/// such a clock) is replaced the same way, its loss recorded.
///
/// KEYS: fleet, history stream, idempotency key (the fleet key when there
/// is none). ARGV: origin, message, history.size, history.ttl_ms, channel,
/// claim (`""`: no key), the key's TTL in ms, [`CLOCK_TOLERANCE`] and
/// [`CLOCK_RESET_AFTER`] in microseconds.
const PUBLISH_SCRIPT: &str = "local repaired = 0 \
    if clock - now > tonumber(ARGV[8]) then \
    if clock - now <= tonumber(ARGV[9]) and clock < 4503599627370496 then return {2, fmt(clock), fmt(now)} end \
    clock = now - 1 epoch = now repaired = 1 \
    redis.call('HSET', KEYS[1], 'clock', fmt(clock), 'epoch', fmt(epoch)) end \
    if ARGV[6] ~= '' and not redis.call('SET', KEYS[3], ARGV[6], 'NX', 'PX', ARGV[7]) then \
    return {0, redis.call('GET', KEYS[3])} end \
    local ev = math.max(clock + 1, now) \
    local evs = fmt(ev) \
    redis.call('HSET', KEYS[1], 'clock', evs) \
    if tonumber(ARGV[3]) > 0 then \
    local added = redis.pcall('XADD', KEYS[2], 'NOMKSTREAM', 'MAXLEN', ARGV[3], evs .. '-0', 'm', ARGV[2]) \
    if type(added) == 'table' and added.err then redis.call('DEL', KEYS[2]) added = false repaired = 2 end \
    if not added then \
    redis.call('XADD', KEYS[2], 'MAXLEN', ARGV[3], evs .. '-0', 'm', ARGV[2]) \
    local floor = math.min(math.max(epoch, now - tonumber(ARGV[4]) * 1000), ev - 1) \
    redis.call('XSETID', KEYS[2], evs .. '-0', 'MAXDELETEDID', fmt(floor) .. '-0') end \
    redis.call('PEXPIRE', KEYS[2], ARGV[4]) end \
    return {1, evs, redis.call('PUBLISH', ARGV[5], ARGV[1] .. '@' .. evs .. ' ' .. ARGV[2]), repaired}";

/// How far ahead of Redis's time the fleet's clock may be and still give
/// ids: ids follow the clock, never going back, so a clock pushed ahead
/// (Redis's time stepped back) is followed up to this. Below
/// [`MAX_AHEAD`], so every node accepts every id the script gives.
pub(crate) const CLOCK_TOLERANCE: Duration = Duration::from_secs(30);

/// How far ahead of Redis's time the fleet's clock is reset rather than
/// waited for (see [`PUBLISH_SCRIPT`]): publishes are refused with a 503
/// for at most this long.
const CLOCK_RESET_AFTER: Duration = Duration::from_secs(300);

/// How far ahead of Redis's time (as this node last measured it) an event
/// id from the bus may be; the script gives none past [`CLOCK_TOLERANCE`].
/// A message past it is not the fleet's (hand-written, or a Redis whose
/// time jumped since the last heartbeat) and is dropped, counted
/// (`cluster.ids_ahead`) and logged. This node's own echo is never checked:
/// its id came from the script's answer.
pub(crate) const MAX_AHEAD: Duration = Duration::from_secs(60);

/// Reads the fleet's history for streams that start, resume, or catch up
/// after the pub/sub link was lost: the fleet's clock and epoch and, when
/// `ARGV[1]` is an event id (`""` when not), for each history in `KEYS[2..]`
/// (an id's, the broadcasts'), the id up to which messages may be gone,
/// and the kept messages after that event id. Trimming shows as
/// `entries-added` above `length` (then everything before the first kept
/// entry may be gone); what the stream's creation recorded is its
/// `max-deleted-entry-id`; a stream that is not there expired (so nothing
/// after `now - ttl` was in it) or was lost with the epoch.
///
/// A history stream's key, and what it keeps: TTL (ms) and size.
type History = (String, u64, usize);

/// KEYS: fleet, then the histories. ARGV: since, then for each history
/// what it keeps (its namespace's, or `history.ttl_ms` and
/// `history.size`): its TTL in ms and its size.
const READ_SCRIPT: &str = "local out = {fmt(clock), fmt(epoch)} \
    if ARGV[1] == '' then return out end \
    for i = 2, #KEYS do \
    local size = tonumber(ARGV[2 * i - 1]) \
    local floor = math.max(epoch, now - tonumber(ARGV[2 * i - 2]) * 1000) \
    local lost, entries = floor, {} \
    if size == 0 then lost = clock \
    elseif redis.call('EXISTS', KEYS[i]) == 1 then \
    local info = redis.call('XINFO', 'STREAM', KEYS[i]) \
    local h = {} \
    for j = 1, #info, 2 do h[info[j]] = info[j + 1] end \
    lost = math.max(epoch, ms(h['max-deleted-entry-id'])) \
    if h['entries-added'] > h['length'] and h['first-entry'] then \
    lost = math.max(lost, ms(h['first-entry'][1]) - 1) end \
    entries = redis.call('XRANGE', KEYS[i], '(' .. ARGV[1] .. '-0', '+', 'COUNT', size) end \
    table.insert(out, fmt(lost)) table.insert(out, entries) end \
    return out";

/// Run before every pub/sub link is made. The fleet hash records which
/// Redis keeps it (field `redis`: that server's `run_id`). A different
/// `run_id` means another Redis holds the fleet's history now: a replica
/// promoted by a failover, or the same server restarted from its
/// snapshot or AOF. Either may lack the last entries the fleet gave out
/// (answered 200, delivered, resumed from), and which ones is not
/// knowable from the new server. So the first node to link to it begins
/// a new epoch there, before any publish can reach it (a node publishes
/// only once its own link, fenced first, is up): every resume and
/// catch-up from before it is told of a gap (cause `epoch`), never a
/// silent hole, at the price of a gap also for clients that missed
/// nothing. The clock goes past every id this node saw (`ARGV[1]`), so no
/// id is given twice even if the new server's time is behind. A hash
/// without the field (a fleet of an older version) only records it.
/// Answers `{1, old clock, new epoch}` when it began an epoch, else
/// `{0, clock, epoch}`.
///
/// KEYS: fleet. ARGV: the highest event id this node saw.
const FENCE_SCRIPT: &str = "local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') \
    local was = redis.call('HGET', KEYS[1], 'redis') \
    if was == run then return {0, fmt(clock), fmt(epoch)} end \
    if not was then redis.call('HSET', KEYS[1], 'redis', run) return {0, fmt(clock), fmt(epoch)} end \
    local e = math.max(now, tonumber(ARGV[1]) + 1, clock + 1) \
    redis.call('HSET', KEYS[1], 'clock', fmt(e - 1), 'epoch', fmt(e), 'redis', run) \
    return {1, fmt(clock), fmt(e)}";

/// Restarts the `/dispatcher` count at `ARGV[1]` unless another node did
/// just now (the count is a number INCRBY can go on from): answers the
/// last number taken.
const DISPATCHER_RESET_SCRIPT: &str = "local ok = redis.pcall('INCRBY', KEYS[1], ARGV[1]) \
    if type(ok) == 'number' and ok >= 0 then return ok end \
    redis.call('SET', KEYS[1], ARGV[1]) return tonumber(ARGV[1])";

/// More streams than any node can hold (this machine's kind allows 20,000
/// open files a process; a big box a few million): a count read back from
/// Redis above it is not a count.
const MAX_NODE_STREAMS: u64 = 1 << 32;

/// Replaces a claimed key's publish id with the first answer, keeping its
/// TTL (`KEEPTTL`: Redis 6.0 or later).
/// `KEYS[1]`: key; ARGV: `<request> <publish id>`, `<request> <answer>`.
const REMEMBER_SCRIPT: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
    redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL') end return 0";

/// What [`Cluster::publish`] found when Redis ran the publish script.
#[derive(Debug)]
pub(crate) enum PublishOutcome {
    /// The key was new: published to `nodes` other nodes; `local` says
    /// what became of it on this node.
    Fresh {
        /// Other nodes that received it.
        nodes: u64,
        /// This node's part.
        local: LocalDelivery,
        /// With an `Idempotency-Key`: what it holds until the answer
        /// replaces it.
        claim: Option<String>,
        /// The event id the fleet gave it (`None`: a broadcast on a Redis
        /// Cluster, which has none).
        event: Option<u64>,
    },
    /// The key was used before for this request: the first answer, if it
    /// was recorded.
    Repeat(Option<super::Receipt>),
    /// The key was used before for another request.
    Mismatch,
}

/// A fleet publish on the node that made it.
#[derive(Debug)]
pub(crate) enum LocalDelivery {
    /// Its echo came back and this many of this node's streams got it.
    Delivered(u64),
    /// This node was not subscribed when Redis published it (it holds no
    /// stream of the id, or its streams are still waiting for their
    /// SUBSCRIBE): its streams did not get it (nor will they: no echo is
    /// delivered after this answer).
    NotSubscribed,
}

/// Why a publish ([`Cluster::publish`]) failed.
#[derive(Debug)]
pub(crate) enum PublishFailed {
    /// The bus is down: nothing was sent, nothing is delivered anywhere.
    NotSent,
    /// Redis ran it (every node subscribed got it), but fewer replicas
    /// than `redis_wait_replicas` confirmed it in time: a failover may
    /// lose it from the history.
    Unreplicated,
    /// Sent, and Redis did not answer in time: it may still run the script
    /// (a paused Redis does, when it resumes), and then every node
    /// delivers, this one included; or never. A retry with the same key is
    /// safe either way.
    Unknown,
    /// Redis answered with an error (the script failed): the message was
    /// not PUBLISHed (that is the script's last step), so no node got it.
    Refused(String),
    /// The fleet's clock is this far ahead of Redis's time, past
    /// [`CLOCK_TOLERANCE`]: nothing was kept or sent (see
    /// [`PUBLISH_SCRIPT`]).
    ClockAhead(Duration),
    /// A broadcast on a Redis Cluster whose copies went to `reached` of
    /// its `shards` shards, not to the others: the ids of those got it,
    /// the others' did not (`late`: a master that did not answer in time
    /// may still send its copy). Its `Idempotency-Key` was given back, so a
    /// retry sends it again, to every shard; unless Redis did not answer
    /// that either (`key_kept`: the claim then expires within that).
    Partial {
        reached: usize,
        shards: usize,
        late: bool,
        key_kept: Option<Duration>,
    },
}

/// The field that keeps a Redis Cluster's per-shard presence hash there
/// when this node holds no id of that shard (`!`: not an id).
const PRESENCE_MARKER: &str = "!";

/// Most ids one presence pipeline carries (a full rewrite of a node
/// holding a million ids is a hundred of them).
const PRESENCE_BATCH: usize = 10_000;

/// Most publishes one node waits for the echo of at once (each a few
/// dozen bytes; one per attempt while Redis does not answer).
const MAX_PENDING: usize = 100_000;

/// How long a `+switch-master` announcement outweighs what a sentinel
/// answers (see [`Cluster::find_master`]): the sentinels learn a new
/// master's configuration from each other within a few hello periods (2 s
/// each), and an announcement this old has been heard by all of them.
const ANNOUNCEMENT_TRUSTED: Duration = Duration::from_secs(10);

/// One of this node's publishes, waiting for its echo: this node's
/// own streams get the message when Redis hands it back, so that they get
/// it exactly when (and only if) the other nodes do.
pub(crate) struct AwaitedEcho {
    /// Told what this node's streams got.
    pub(crate) waiter: Option<tokio::sync::oneshot::Sender<u64>>,
    /// Forgotten after this (the key's TTL): an echo later than that is
    /// not delivered here.
    expires: Instant,
}

/// The Redis a node speaks to now (see [`Cluster::find_master`]).
struct Master {
    client: redis::Client,
    conn: Commands,
    /// With `redis_wait_replicas`: a connection of the publishes' own, so
    /// that their WAITs (Redis runs nothing else a connection sent while
    /// one waits) do not hold up heartbeats, presence and history reads.
    publish: Option<Commands>,
    /// False until the sentinels named a master: `client` is then only
    /// `redis_url`'s placeholder, and nothing is sent.
    found: bool,
}

impl Master {
    /// Lazily connected (nothing is sent until the first command): the
    /// command connection, and with `wait_replicas` the publishes' own.
    fn open(
        client: redis::Client,
        config: &ConnectionManagerConfig,
        wait_replicas: u32,
        found: bool,
    ) -> redis::RedisResult<Self> {
        let manager =
            || ConnectionManager::new_lazy_with_config(client.clone(), config.clone()).map(Commands::One);
        Ok(Master {
            conn: manager()?,
            publish: if wait_replicas > 0 { Some(manager()?) } else { None },
            client,
            found,
        })
    }
}

/// With `cluster.redis_cluster_nodes`: redis-rs's cluster connection over
/// the seeds (connected in the background: a cluster down at start is
/// survived), with their credentials, TLS checked against `ca` when given,
/// and the command timeout; and the first seed's client, whose
/// credentials and TLS the Bus's links to each shard's master use.
fn sharded_master(
    settings: &ClusterSettings,
    ca: Option<&[u8]>,
    timeout: Duration,
) -> redis::RedisResult<Master> {
    let seeds: Vec<redis::ConnectionInfo> = settings
        .cluster_seeds()
        .iter()
        .map(|s| {
            s.as_str()
                .into_connection_info()
                .map(|i| i.set_tcp_settings(TcpSettings::default().set_nodelay(true)))
        })
        .collect::<Result<_, _>>()?;
    let first = seeds.first().cloned().ok_or_else(|| {
        redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "no cluster.redis_cluster_nodes",
        ))
    })?;
    let certificates = || redis::TlsCertificates {
        client_tls: None,
        root_cert: ca.map(<[u8]>::to_vec),
    };
    let client = |retries: u32| {
        let mut builder = redis::cluster::ClusterClientBuilder::new(seeds.clone())
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .retries(retries)
            .tcp_settings(TcpSettings::default().set_nodelay(true));
        if settings.cluster_tls() && ca.is_some() {
            builder = builder.certs(certificates());
        }
        builder.build()
    };
    // The publishes' own connection never retries: redis-rs would send the
    // publish script again after a connection lost or a timeout, when the
    // first may have run (a second event id, delivered twice). A MOVED or
    // ASK answer (the script did not run) is a 503 that is safe to retry,
    // and refreshes the slot map for the next publish.
    let publishes = client(0)?;
    let cluster = client(2)?;
    let config = || {
        redis::cluster::ClusterConfig::new()
            .set_connection_timeout(timeout)
            .set_response_timeout(timeout)
    };
    let conn = cluster.get_pending_async_connection_with_config(config());
    let publish = publishes.get_pending_async_connection_with_config(config());
    let client = match (ca, first.addr()) {
        (Some(_), redis::ConnectionAddr::TcpTls { .. }) => {
            redis::Client::build_with_tls(first, certificates())?
        }
        _ => redis::Client::open(first)?,
    };
    Ok(Master {
        client,
        conn: Commands::Sharded(conn),
        publish: Some(Commands::Sharded(publish)),
        found: true,
    })
}

/// Where a sentinel is: over TLS with `redis_sentinel_tls`.
fn sentinel_addr(settings: &ClusterSettings, host: String, port: u16) -> redis::ConnectionAddr {
    if settings.redis_sentinel_tls {
        redis::ConnectionAddr::TcpTls {
            host,
            port,
            insecure: false,
            tls_params: None,
        }
    } else {
        redis::ConnectionAddr::Tcp(host, port)
    }
}

/// With `cluster.redis_sentinels`: redis-rs's Sentinel client, which asks
/// the sentinels for the master and checks with `ROLE` that it is one, and
/// connects to the master with `redis_url`'s credentials and db (over TLS
/// when it is a `rediss://` URL; to the sentinels with
/// `redis_sentinel_tls`), checking certificates against `ca` when given.
fn sentinel_client(
    settings: &ClusterSettings,
    url: &redis::ConnectionInfo,
    ca: Option<&[u8]>,
) -> Result<Option<redis::sentinel::SentinelClient>, redis::RedisError> {
    let sentinels = settings.sentinels();
    if sentinels.is_empty() {
        return Ok(None);
    }
    let certificates = || redis::TlsCertificates {
        client_tls: None,
        root_cert: ca.map(<[u8]>::to_vec),
    };
    let addrs = sentinels
        .into_iter()
        .map(|(host, port)| sentinel_addr(settings, host, port));
    let redis = url.redis_settings();
    let mut b = redis::sentinel::SentinelClientBuilder::new(
        addrs,
        &settings.redis_sentinel_master,
        redis::sentinel::SentinelServerType::Master,
    )?
    .set_client_to_redis_db(redis.db())
    .set_client_to_redis_tcp_settings(TcpSettings::default().set_nodelay(true));
    if let Some(user) = redis.username() {
        b = b.set_client_to_redis_username(user);
    }
    if let Some(password) = redis.password() {
        b = b.set_client_to_redis_password(password);
    }
    if !settings.redis_sentinel_password.is_empty() {
        b = b.set_client_to_sentinel_password(&settings.redis_sentinel_password);
    }
    if matches!(url.addr(), redis::ConnectionAddr::TcpTls { .. }) {
        b = b.set_client_to_redis_tls_mode(redis::TlsMode::Secure);
        if ca.is_some() {
            b = b.set_client_to_redis_certificates(certificates());
        }
    }
    if settings.redis_sentinel_tls {
        b = b.set_client_to_sentinel_tls_mode(redis::TlsMode::Secure);
        if ca.is_some() {
            b = b.set_client_to_sentinel_certificates(certificates());
        }
    }
    b.build().map(Some)
}

/// The TLS client the pub/sub link (and the sentinel watch) wraps its
/// socket in: certificates checked against `ca`, or the system's roots.
/// redis-rs builds its own for the command connection from the same
/// certificates.
fn link_tls(ca: Option<&[u8]>) -> Result<tokio_rustls::TlsConnector, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    // redis-rs reads the system's roots for every command connection,
    // with `redis_ca_file` too, and refuses to connect when any could not
    // be read: found here, at start, rather than as a link that is up
    // while every command fails.
    let system = rustls_native_certs::load_native_certs();
    if let Some(e) = system.errors.first() {
        return Err(format!(
            "the system's root certificates could not all be read ({e}), and redis-rs then refuses \
             every TLS connection: fix /etc/ssl/certs, or SSL_CERT_FILE / SSL_CERT_DIR"
        ));
    }
    match ca {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| format!("cluster.redis_ca_file: {e}"))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("cluster.redis_ca_file: {e}"))?;
            }
        }
        None => {
            let (added, _) = roots.add_parsable_certificates(system.certs);
            if added == 0 {
                return Err(
                    "the system has no root certificates to check Redis's TLS certificate \
                            against: install ca-certificates or set cluster.redis_ca_file"
                        .to_owned(),
                );
            }
        }
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// `host:port` of a client's address (a path for a Unix socket).
fn addr_of(client: &redis::Client) -> String {
    match client.get_connection_info().addr() {
        redis::ConnectionAddr::Tcp(host, port) | redis::ConnectionAddr::TcpTls { host, port, .. } => {
            format!("{host}:{port}")
        }
        redis::ConnectionAddr::Unix(path) => path.display().to_string(),
        other => format!("{other}"),
    }
}

/// Channel and key names of one fleet. On a Redis Cluster every name of
/// an id carries the id as its hash tag (`<prefix>:history:{<id>}`), so
/// that its keys and channel share a slot and one script touches them all;
/// the fleet's own names carry [`FLEET_TAG`] (`<prefix>:nodes:{!fleet}`).
/// On one Redis the names have no tags, as they always had.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    prefix: String,
    /// On a Redis Cluster: names carry hash tags.
    sharded: bool,
    /// The broadcast channel, made once: every bus message is compared
    /// with it.
    broadcast: String,
}

impl Names {
    pub(crate) fn new(prefix: &str, sharded: bool) -> Self {
        let mut names = Names {
            prefix: prefix.to_owned(),
            sharded,
            broadcast: String::new(),
        };
        names.broadcast = names.fleet("broadcast");
        names
    }

    /// `<prefix>:<what>:{<id>}` on a Redis Cluster, `<prefix>:<what>:<id>`
    /// on one Redis.
    fn of_id(&self, what: &str, id: &str) -> String {
        if self.sharded {
            format!("{}:{what}:{{{id}}}", self.prefix)
        } else {
            format!("{}:{what}:{id}", self.prefix)
        }
    }

    /// A fleet-wide name: `<prefix>:<what>:{!fleet}` on a Redis Cluster,
    /// `<prefix>:<what>` on one Redis.
    fn fleet(&self, what: &str) -> String {
        if self.sharded {
            format!("{}:{what}:{{{FLEET_TAG}}}", self.prefix)
        } else {
            format!("{}:{what}", self.prefix)
        }
    }

    /// A fleet-wide name of one thing (a node, an instance).
    fn fleet_of(&self, what: &str, name: &str) -> String {
        if self.sharded {
            format!("{}:{what}:{{{FLEET_TAG}}}:{name}", self.prefix)
        } else {
            format!("{}:{what}:{name}", self.prefix)
        }
    }

    /// Whether the names are a Redis Cluster's.
    pub(crate) fn sharded(&self) -> bool {
        self.sharded
    }

    /// The slot of every name of `id` on a Redis Cluster: its hash tag is
    /// the id, so no name needs to be made to find it.
    pub(crate) fn slot_of_id(id: &str) -> u16 {
        crate::hub::sharded::slot_of(id.as_bytes())
    }

    /// The channel of stream id `id`: one per id, a sharded channel
    /// (SSUBSCRIBE, SPUBLISH) in the id's slot on a Redis Cluster.
    pub(crate) fn id_channel(&self, id: &str) -> String {
        self.of_id("id", id)
    }

    /// The channel and history stream of one id (`Some`) or of broadcasts.
    pub(crate) fn of(&self, id: Option<&str>) -> (String, String) {
        match id {
            Some(id) => (self.id_channel(id), self.history_key(id)),
            None => (self.broadcast.clone(), self.broadcasts_key()),
        }
    }

    /// The history stream of `id`.
    fn history_key(&self, id: &str) -> String {
        self.of_id("history", id)
    }

    /// The history stream of broadcasts (not an id's: those have the
    /// `history:` prefix).
    fn broadcasts_key(&self) -> String {
        self.fleet("broadcasts")
    }

    /// The clock and epoch (a hash) event ids of `id` (`None`: of
    /// broadcasts) are minted from: the fleet's on one Redis, the id's own
    /// on a Redis Cluster (no key is touched by every publish).
    fn clock_key(&self, id: Option<&str>) -> String {
        match id {
            Some(id) if self.sharded => self.of_id("clock", id),
            _ => self.fleet_key(),
        }
    }

    /// The fleet's clock and epoch (a hash).
    fn fleet_key(&self) -> String {
        self.fleet("fleet")
    }

    /// One process's presence hash: held id -> its streams there. By
    /// instance, not name: a restarted process starts with none, and two
    /// processes given one name do not mix their counts.
    fn presence_key(&self, instance: &str) -> String {
        self.fleet_of("presence", instance)
    }

    /// On a Redis Cluster, one process's presence hash for the ids of the
    /// shard whose tag is `tag` ([`Topology::shard_tag`]):
    /// `<prefix>:presence:{<tag>}:<instance>`, on that shard.
    fn shard_presence_key(&self, tag: &str, instance: &str) -> String {
        format!("{}:presence:{{{tag}}}:{instance}", self.prefix)
    }

    /// The id inside a channel name from [`Names::id_channel`].
    pub(crate) fn id_of<'a>(&self, channel: &'a str) -> Option<&'a str> {
        let id = channel.strip_prefix(self.prefix.as_str())?.strip_prefix(":id:")?;
        if self.sharded {
            id.strip_prefix('{')?.strip_suffix('}')
        } else {
            Some(id)
        }
    }

    /// The channel every node subscribes to (on one Redis).
    pub(crate) fn broadcast(&self) -> &str {
        &self.broadcast
    }

    /// On a Redis Cluster, the broadcast channel of shard `k` of
    /// `topology` (`<prefix>:broadcast:{!b<n>}`, in one of its slots; see
    /// [`Topology::shard_tag`]).
    pub(crate) fn shard_broadcast(&self, topology: &Topology, k: usize) -> Option<String> {
        let tag = topology.shard_tag(k)?;
        Some(format!("{}:broadcast:{{{tag}}}", self.prefix))
    }

    /// Whether `channel` carries broadcasts: the one channel on one Redis,
    /// any shard's on a Redis Cluster.
    pub(crate) fn is_broadcast(&self, channel: &str) -> bool {
        if self.sharded {
            channel
                .strip_prefix(self.prefix.as_str())
                .and_then(|c| c.strip_prefix(":broadcast:{"))
                .is_some_and(|c| c.starts_with(crate::hub::sharded::SHARD_TAG))
        } else {
            channel == self.broadcast
        }
    }

    fn node_key(&self, name: &str) -> String {
        self.fleet_of("node", name)
    }

    fn nodes_key(&self) -> String {
        self.fleet("nodes")
    }

    /// The key prefix.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The nodes that hold ids, scored by when their place expires
    /// ([`super::occupancy`]).
    pub(crate) fn holders_key(&self) -> String {
        self.fleet("holders")
    }

    /// The ids one process holds ([`super::occupancy`]).
    pub(crate) fn holds_key(&self, instance: &str) -> String {
        self.fleet_of("holds", instance)
    }

    /// One process's last occupancy write and its answer
    /// ([`super::occupancy`]).
    pub(crate) fn occupancy_write_key(&self, instance: &str) -> String {
        self.fleet_of("occwrite", instance)
    }

    /// The ids one process took out of a dead node's and has yet to send
    /// as `id_vacated` ([`super::occupancy`]).
    pub(crate) fn reaped_key(&self, instance: &str) -> String {
        self.fleet_of("reaped", instance)
    }

    /// The nodes that hold `id` ([`super::occupancy`]).
    pub(crate) fn occupants_key(&self, id: &str) -> String {
        self.of_id("occupants", id)
    }

    fn counter_key(&self) -> String {
        self.fleet("dispatcher")
    }

    /// An `Idempotency-Key` of a publish to `id` (`None`: a broadcast). On
    /// a Redis Cluster in the id's slot, so the publish script claims it:
    /// a key is then one id's (a key reused for another id is another
    /// key, not a 422).
    fn idempotency_key(&self, id: Option<&str>, key: &str) -> String {
        match id {
            Some(id) if self.sharded => format!("{}:idem:{{{id}}}:{key}", self.prefix),
            None if self.sharded => self.fleet_of("idem", key),
            _ => format!("{}:idem:{key}", self.prefix),
        }
    }
}

/// What this node reports about its bus, in `/stats` under `cluster`.
#[derive(Debug, Default)]
pub(crate) struct ClusterStats {
    /// The bus's pub/sub link is up and subscribed.
    pub(crate) connected: AtomicBool,
    /// Ids this node is subscribed to (held, or lingering).
    pub(crate) subscriptions: AtomicU64,
    /// SUBSCRIBE and UNSUBSCRIBE commands sent (each carries many ids).
    pub(crate) subscribe_commands: AtomicU64,
    /// PUBLISH commands that Redis answered.
    pub(crate) publishes: AtomicU64,
    /// PUBLISH commands that failed or timed out, or were not tried because
    /// the bus was down.
    pub(crate) publish_errors: AtomicU64,
    /// Messages from other nodes handed to the Router.
    pub(crate) received: AtomicU64,
    /// This node's own publishes, back from Redis and ignored.
    pub(crate) echoes: AtomicU64,
    /// Bus messages that were not `"<instance> <one line>"`, or whose line
    /// is longer than `message.max_bytes`, dropped.
    pub(crate) malformed: AtomicU64,
    /// Times the pub/sub link was lost and made again.
    pub(crate) reconnects: AtomicU64,
    /// Ids subscribed again after reconnects.
    pub(crate) resubscribed: AtomicU64,
    /// Failed Redis operations of any kind (connects, commands, heartbeats).
    pub(crate) errors: AtomicU64,
    /// Heartbeats written.
    pub(crate) heartbeats: AtomicU64,
    /// Bus actor restarts after a panic.
    pub(crate) restarts: AtomicU64,
    /// Heartbeats that found another node's entry under this node's name.
    pub(crate) name_conflicts: AtomicU64,
    /// Times this node moved to another master the sentinels named.
    pub(crate) master_switches: AtomicU64,
    /// Times a sentinel named a master other than the one just announced
    /// by `+switch-master` (one that had not heard of the failover yet),
    /// and the node asked again rather than go there.
    pub(crate) stale_sentinel_answers: AtomicU64,
    /// Commands a Redis refused with READONLY (a master that became a
    /// replica); each makes the node ask the sentinels again.
    pub(crate) readonly: AtomicU64,
    /// Publishes fewer than `redis_wait_replicas` replicas confirmed in
    /// time (each answered 503 "unknown").
    pub(crate) wait_short: AtomicU64,
    /// Times this node found another Redis keeping the fleet's history (a
    /// failover, a restart from disk) and began a new epoch (see
    /// [`FENCE_SCRIPT`]).
    pub(crate) history_regressions: AtomicU64,
    /// Redis's time minus this node's, in microseconds, measured at each
    /// heartbeat (half the round trip is the error). Event ids are Redis's
    /// time: bus ids are checked against this node's clock corrected by it.
    pub(crate) clock_skew_us: AtomicI64,
    /// Publishes refused because the fleet's clock was past
    /// [`CLOCK_TOLERANCE`] ahead of Redis's time (503).
    pub(crate) clock_ahead: AtomicU64,
    /// Times the fleet's clock, or an id's history, was found unusable
    /// and reset with a new epoch (see [`PUBLISH_SCRIPT`]).
    pub(crate) clock_resets: AtomicU64,
    /// Bus messages from other nodes whose event id was more than
    /// [`MAX_AHEAD`] past Redis's time, dropped.
    pub(crate) ids_ahead: AtomicU64,
    /// Values read back from Redis that were out of range or not in this
    /// version's format (node entries, presence counts, the `/dispatcher`
    /// count), left out or reset.
    pub(crate) bad_state: AtomicU64,
}

/// One node's entry in Redis, as `/cluster` lists it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct NodeInfo {
    name: String,
    instance: String,
    host: String,
    pid: u32,
    streams: u64,
    uptime_s: u64,
    addr: String,
    /// The figures the dashboard shows per node, as of `at_ms` (default 0
    /// from a node of an older version, which does not write them).
    #[serde(flatten)]
    figures: NodeFigures,
}

/// A node's counters in its heartbeat, for the dashboard's row per node.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct NodeFigures {
    /// Streams ever opened.
    opened: u64,
    /// Messages accepted by its Router.
    routed: u64,
    /// Message events dropped.
    dropped: u64,
    /// Streams cut for not reading.
    slow_disconnects: u64,
    /// Its resident set size.
    rss_bytes: u64,
    /// Router, Counter and Bus restarts.
    restarts: u64,
    /// When these were read (ms since the epoch), for rates.
    at_ms: u64,
}

impl NodeFigures {
    fn of(s: &Stats, bus_restarts: u64) -> Self {
        NodeFigures {
            opened: s.streams_opened.load(Relaxed),
            routed: s.messages_routed.load(Relaxed),
            dropped: s.messages_dropped.load(Relaxed),
            slow_disconnects: s.slow_disconnects.load(Relaxed),
            rss_bytes: crate::stats::rss_bytes().unwrap_or(0),
            restarts: s.router_restarts.load(Relaxed) + s.counter_restarts.load(Relaxed) + bus_restarts,
            at_ms: now_ms(),
        }
    }
}

/// This node's side of the cluster: names, the command connection, its
/// stats. Shared by `Arc` between the workers, the handlers, the Counter and
/// the Bus.
pub(crate) struct Cluster {
    /// This node's name in `/cluster`.
    pub(crate) node: String,
    /// A random id of this process: the origin of its publishes.
    pub(crate) instance: String,
    /// Channel and key names.
    pub(crate) names: Names,
    /// The settings.
    pub(crate) settings: ClusterSettings,
    /// `id_occupied` and `id_vacated`, decided in Redis (with
    /// `hooks.events_url`).
    pub(crate) occupancy: Option<crate::hub::occupancy::Fleet>,
    /// Counters for `/stats`.
    pub(crate) stats: ClusterStats,
    /// `message.max_bytes`: a message from the bus is held to the same
    /// limit as one posted here (anyone who shares the Redis can PUBLISH).
    pub(crate) max_message_bytes: usize,
    /// The server's own counters (streams for the heartbeat).
    pub(crate) server_stats: Arc<Stats>,
    /// Where this node listens, for `/cluster`.
    addr: String,
    host: String,
    started: Instant,
    /// The last [`Cluster::view`] for the dashboard and when it was read:
    /// every open dashboard reads the view once a second, and they share
    /// one read from Redis a second rather than one each.
    view_cache: tokio::sync::Mutex<Option<(Instant, ClusterView)>>,
    /// The Redis this node speaks to: its client (the Bus opens its
    /// pub/sub links with it) and the command connection. Replaced when
    /// the sentinels name another master.
    master: Mutex<Master>,
    /// With `cluster.redis_sentinels`: who to ask for the master.
    sentinel: Option<tokio::sync::Mutex<redis::sentinel::SentinelClient>>,
    /// With a `rediss://` URL or `redis_sentinel_tls`: what the pub/sub
    /// link and the sentinel watch wrap their sockets in.
    tls: Option<tokio_rustls::TlsConnector>,
    /// A command was refused with READONLY: the Bus asks the sentinels
    /// again at its next heartbeat (and drops a link that is on a replica).
    stale_master: AtomicBool,
    /// The master the sentinels last announced (`+switch-master`), and
    /// when: while it is fresh ([`ANNOUNCEMENT_TRUSTED`]),
    /// [`Cluster::find_master`] refuses another one (see there).
    announced: Mutex<Option<(String, Instant)>>,
    /// How the command connection is made (for a new master).
    conn_config: ConnectionManagerConfig,
    /// Ids whose last local stream left, still subscribed until the time
    /// given. Here, not in the Bus, because two actors use it, each through
    /// a method (no guard leaves this module): the Bus fills it
    /// ([`Cluster::linger`]), empties it ([`Cluster::end_linger`],
    /// [`Cluster::expired_lingers`]) and resubscribes it after a reconnect
    /// ([`Cluster::to_subscribe`]); the Hub asks whether this node is among
    /// a publish's receivers ([`Cluster::is_lingering`]).
    lingering: Mutex<HashMap<Arc<str>, tokio::time::Instant>>,
    /// Publishes of this node waiting for their echo, by sequence
    /// number (their publish id is `<instance>/<seq>`). Empty at rest.
    awaited: Mutex<BTreeMap<u64, AwaitedEcho>>,
    /// The last sequence number given to a publish of this node.
    seq: AtomicU64,
    /// [`PUBLISH_SCRIPT`] and [`READ_SCRIPT`] (sent by hash, loaded once).
    publish_script: redis::Script,
    read_script: redis::Script,
    fence_script: redis::Script,
    /// [`CLAIM_SCRIPT`] (a Redis Cluster's broadcasts with a key).
    claim_script: redis::Script,
    /// On a Redis Cluster, the sources of the scripts a publish or a read
    /// runs: each shard's link loads them on its master before it
    /// subscribes ([`Cluster::shard_scripts`]).
    shard_scripts: Vec<String>,
    /// On a Redis Cluster: the topology presence was last written with
    /// ([`Cluster::write_presence_sharded`]).
    presence_topology: Mutex<Option<Arc<Topology>>>,
    /// On a Redis Cluster: which master serves each slot, as the Bus last
    /// read it (`None` before the first read).
    topology: Mutex<Option<Arc<Topology>>>,
    /// On a Redis Cluster: which shards' links are up, by the topology
    /// they were made from.
    shard_links: Mutex<Option<(Arc<Topology>, Vec<bool>)>>,
    /// The highest event id this node saw: in its publishes' answers and
    /// on the bus. [`Cluster::fence`] moves the fleet's clock past it.
    seen: AtomicU64,
    /// What the fleet's history keeps of each id (`history.size` and
    /// `history.ttl_ms`, or its namespace's).
    namespaces: Namespaces,
    /// Redis's version, as its first heartbeat found it (`/stats`).
    redis_version: Mutex<String>,
    /// Redis is older than 7.0: nothing is published (a publish script
    /// would fail halfway, keeping a message it never sent), and `/readyz`
    /// answers 503.
    unusable: AtomicBool,
}

impl Cluster {
    /// Sets up the command connection (lazily: nothing is sent until the
    /// first command, and a Redis that is down at start is survived). Must
    /// run inside a tokio runtime, which drives the connection.
    pub(crate) fn new(
        settings: &ClusterSettings,
        namespaces: Namespaces,
        max_message_bytes: usize,
        server_stats: Arc<Stats>,
        addr: String,
    ) -> Result<Self, redis::RedisError> {
        // TCP_NODELAY, which redis-rs leaves off: with Nagle on, a PUBLISH
        // written while the previous one is unacknowledged waits for the
        // delayed ACK (docs/design-notes.md).
        // With sentinels, only the URL's credentials and db are used; without
        // one, a placeholder (nothing is sent to it).
        let url = match settings.redis_url.as_str() {
            "" => "redis://sentinel-master",
            url => url,
        };
        let info = url
            .into_connection_info()?
            .set_tcp_settings(TcpSettings::default().set_nodelay(true));
        let timeout = Duration::from_millis(settings.command_timeout_ms);
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_min_delay(Duration::from_millis(settings.reconnect_min_ms))
            .set_max_delay(Duration::from_millis(settings.reconnect_max_ms))
            .set_number_of_retries(2);
        // The process-wide rustls provider (redis-rs's TLS asks for it).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let tls_error =
            |e: String| redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, "TLS", e));
        let ca = settings.ca_certificates().map_err(tls_error)?;
        let tls = if settings.tls() {
            Some(link_tls(ca.as_deref()).map_err(tls_error)?)
        } else {
            None
        };
        let sharded = settings.redis_cluster();
        let sentinel = sentinel_client(settings, &info, ca.as_deref())?;
        // With sentinels, `redis_url`'s host is a placeholder until the
        // first ask: every command fails fast until the Bus has asked.
        let client = match (&ca, info.addr()) {
            (Some(ca), redis::ConnectionAddr::TcpTls { .. }) if sentinel.is_none() => {
                let certificates = redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(ca.clone()),
                };
                redis::Client::build_with_tls(info, certificates)?
            }
            _ => redis::Client::open(info)?,
        };
        let master = if sharded {
            sharded_master(settings, ca.as_deref(), timeout)?
        } else {
            Master::open(client, &config, settings.redis_wait_replicas, sentinel.is_none())?
        };
        let host = hostname();
        let node = node_name(settings);
        tracing::info!(
            event = "cluster",
            node = %node,
            redis = %redact_url(&settings.redis_url),
            redis_cluster = %settings
                .cluster_seeds()
                .iter()
                .map(|s| redact_url(s))
                .collect::<Vec<_>>()
                .join(","),
            sentinels = %settings.redis_sentinels,
            sentinel_master = %settings.redis_sentinel_master,
            prefix = %settings.prefix,
            "cluster mode"
        );
        let publish_source = if sharded {
            format!(
                "local keep = ARGV[4] {SHARDED_PRELUDE}{}",
                PUBLISH_SCRIPT.replace("'PUBLISH'", "'SPUBLISH'")
            )
        } else {
            format!("{LUA_PRELUDE}{PUBLISH_SCRIPT}")
        };
        let read_source = if sharded {
            format!("local keep = ARGV[2] {SHARDED_PRELUDE}{READ_SCRIPT}")
        } else {
            format!("{LUA_PRELUDE}{READ_SCRIPT}")
        };
        Ok(Cluster {
            node,
            instance: instance_id(),
            names: Names::new(&settings.prefix, sharded),
            settings: settings.clone(),
            max_message_bytes,
            stats: ClusterStats::default(),
            server_stats,
            addr,
            host,
            started: Instant::now(),
            view_cache: tokio::sync::Mutex::new(None),
            master: Mutex::new(master),
            sentinel: sentinel.map(tokio::sync::Mutex::new),
            tls,
            stale_master: AtomicBool::new(false),
            announced: Mutex::new(None),
            conn_config: config,
            lingering: Mutex::new(HashMap::new()),
            awaited: Mutex::new(BTreeMap::new()),
            seq: AtomicU64::new(0),
            publish_script: redis::Script::new(&publish_source),
            read_script: redis::Script::new(&read_source),
            fence_script: redis::Script::new(&format!("{LUA_PRELUDE}{FENCE_SCRIPT}")),
            claim_script: redis::Script::new(CLAIM_SCRIPT),
            shard_scripts: if sharded {
                vec![publish_source, read_source, CLAIM_SCRIPT.to_owned()]
            } else {
                Vec::new()
            },
            topology: Mutex::new(None),
            presence_topology: Mutex::new(None),
            shard_links: Mutex::new(None),
            seen: AtomicU64::new(0),
            namespaces,
            redis_version: Mutex::new(String::new()),
            unusable: AtomicBool::new(false),
            occupancy: None,
        })
    }

    /// Decides `id_occupied` and `id_vacated` for the fleet with
    /// `webhooks` (`None`: none are sent).
    pub(crate) fn with_webhooks(mut self, webhooks: Option<Arc<crate::webhooks::Webhooks>>) -> Self {
        self.occupancy = webhooks.map(|w| crate::hub::occupancy::Fleet::new(w, &self.instance, &self.node));
        self
    }

    fn master(&self) -> MutexGuard<'_, Master> {
        self.master
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The command connection, once there is a master to send to.
    fn conn(&self) -> Option<Commands> {
        let m = self.master();
        m.found.then(|| m.conn.clone())
    }

    /// The publishes' connection (their own with `redis_wait_replicas`).
    fn publish_conn(&self) -> Option<Commands> {
        let m = self.master();
        m.found.then(|| m.publish.as_ref().unwrap_or(&m.conn).clone())
    }

    /// The client the Bus opens its pub/sub links with: the current
    /// master's (see [`Cluster::find_master`]).
    pub(crate) fn client(&self) -> redis::Client {
        self.master().client.clone()
    }

    /// `host:port` of the Redis this node speaks to (`""` while the
    /// sentinels have named none).
    pub(crate) fn master_addr(&self) -> String {
        if self.names.sharded() {
            // Every shard's master, as the Bus last read them.
            return self.topology().map_or_else(String::new, |t| {
                t.shards
                    .iter()
                    .map(|s| s.master.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            });
        }
        let m = self.master();
        if m.found {
            addr_of(&m.client)
        } else {
            String::new()
        }
    }

    /// The TLS client for the hand-written connections, when anything
    /// speaks TLS to Redis.
    pub(crate) fn tls(&self) -> Option<&tokio_rustls::TlsConnector> {
        self.tls.as_ref()
    }

    /// Whether the node follows a master through Redis Sentinel.
    pub(crate) fn sentinels(&self) -> bool {
        self.sentinel.is_some()
    }

    /// Where each sentinel is, as a client the hand-written connections
    /// open (`+switch-master` is followed on every one of them).
    pub(crate) fn sentinel_clients(&self) -> Result<Vec<(String, redis::Client)>, String> {
        self.settings
            .sentinels()
            .into_iter()
            .map(|(host, port)| {
                let name = format!("{host}:{port}");
                let addr = sentinel_addr(&self.settings, host, port);
                let mut redis = redis::RedisConnectionInfo::default();
                if !self.settings.redis_sentinel_password.is_empty() {
                    redis = redis.set_password(&self.settings.redis_sentinel_password);
                }
                let info = format!("redis://{name}")
                    .into_connection_info()
                    .map_err(|e| format!("sentinel {name}: {e}"))?
                    .set_addr(addr)
                    .set_redis_settings(redis);
                let client = redis::Client::open(info).map_err(|e| format!("sentinel {name}: {e}"))?;
                Ok((name, client))
            })
            .collect()
    }

    /// Whether a command was refused with READONLY since the last call.
    pub(crate) fn take_stale_master(&self) -> bool {
        self.stale_master.swap(false, Relaxed)
    }

    /// With sentinels: asks them for the master (redis-rs checks with
    /// `ROLE` that it is one) and, if it is not the one this node speaks
    /// to, moves the command connection there (the Bus's next link goes
    /// there too). Called before every pub/sub link is made, so a node
    /// asks again after any link loss, timeout, `+switch-master` or
    /// READONLY. Without sentinels, nothing to do.
    pub(crate) async fn find_master(&self) -> Result<(), String> {
        let Some(sentinel) = &self.sentinel else {
            return Ok(());
        };
        let mut sentinel = sentinel.lock().await;
        let client = tokio::time::timeout(self.link_timeout(), sentinel.async_get_client())
            .await
            .map_err(|_| {
                format!(
                    "the sentinels ({}) did not name a master for {:?} in time",
                    self.settings.redis_sentinels, self.settings.redis_sentinel_master
                )
            })?
            .map_err(|e| {
                format!(
                    "the sentinels ({}) named no usable master for {:?} (none answered, none knows \
                     the name, or the address it named is unreachable or not a master): {e}",
                    self.settings.redis_sentinels, self.settings.redis_sentinel_master
                )
            })?;
        let addr = addr_of(&client);
        if let Some(announced) = self.announced_master()
            && announced != addr
        {
            // A sentinel that has not heard of the failover yet names the
            // old master, which answers ROLE as a master until the
            // sentinels demote it (seconds after it runs again): a link
            // made there gets nothing the fleet publishes on the new one,
            // and what it misses is behind a new epoch (a gap), not
            // replayed. Ask again until the sentinels agree.
            self.stats.stale_sentinel_answers.fetch_add(1, Relaxed);
            return Err(format!(
                "a sentinel named {addr} as the master, but {announced} was just announced as the new one; \
                 asking again"
            ));
        }
        let mut m = self.master();
        if m.found && addr_of(&m.client) == addr {
            return Ok(());
        }
        let before = if m.found {
            addr_of(&m.client)
        } else {
            String::new()
        };
        *m = Master::open(client, &self.conn_config, self.settings.redis_wait_replicas, true)
            .map_err(|e| format!("connecting to the master at {addr}: {e}"))?;
        drop(m);
        if before.is_empty() {
            tracing::info!(
                event = "redis_master",
                master = %addr,
                "the sentinels name this Redis master; commands and the pub/sub link go there"
            );
        } else {
            self.stats.master_switches.fetch_add(1, Relaxed);
            tracing::warn!(
                event = "redis_master",
                master = %addr,
                before = %before,
                "the sentinels name another Redis master; commands and the pub/sub link move there"
            );
        }
        Ok(())
    }

    /// Takes note of a `+switch-master` announcement naming `to` (see
    /// [`Cluster::find_master`]). True when it is news: no announcement
    /// within [`ANNOUNCEMENT_TRUSTED`] named it (every sentinel announces
    /// a failover, one after another).
    pub(crate) fn announce_master(&self, to: &str) -> bool {
        let mut announced = self
            .announced
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let news = !announced
            .as_ref()
            .is_some_and(|(was, at)| was == to && at.elapsed() < ANNOUNCEMENT_TRUSTED);
        if news {
            *announced = Some((to.to_owned(), Instant::now()));
        }
        news
    }

    /// The master last announced, if that was within
    /// [`ANNOUNCEMENT_TRUSTED`].
    fn announced_master(&self) -> Option<String> {
        let announced = self
            .announced
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        announced
            .as_ref()
            .filter(|(_, at)| at.elapsed() < ANNOUNCEMENT_TRUSTED)
            .map(|(to, _)| to.clone())
    }

    /// The table of awaited echoes (a panic while it was held leaves it
    /// usable).
    fn awaited(&self) -> MutexGuard<'_, BTreeMap<u64, AwaitedEcho>> {
        self.awaited
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits for the echo of this node's publish `seq`, as [`Cluster::publish`]
    /// does, without publishing (for the Bus's tests).
    #[cfg(test)]
    pub(crate) fn await_echo(&self, seq: u64) {
        self.awaited().insert(
            seq,
            AwaitedEcho {
                waiter: None,
                expires: Instant::now() + Duration::from_secs(60),
            },
        );
    }

    /// Takes the publish `seq` of this node whose echo just came, if
    /// it is still waited for.
    pub(crate) fn take_awaited(&self, seq: u64) -> Option<AwaitedEcho> {
        self.awaited().remove(&seq).filter(|p| p.expires > Instant::now())
    }

    /// Publishes `msg` fleet-wide on the channel of `id` (`None`: of
    /// broadcasts), kept in its history (see [`Names::of`]) as its
    /// namespace says, with [`PUBLISH_SCRIPT`]: one
    /// event id, kept in the fleet's history, PUBLISHed in that order; with
    /// `keyed` (an `Idempotency-Key` and the request's fingerprint), only if
    /// the key was not used within `key_ttl`. This node's streams get it
    /// from its echo (see [`AwaitedEcho`]), as every other node's do, so
    /// they see the id's messages in the same order; `subscribed_here`
    /// (asked while the script runs, off the message's path):
    /// this node is subscribed to the channel, so the echo comes and is
    /// waited for.
    pub(crate) async fn publish(
        &self,
        id: Option<&str>,
        msg: &str,
        keyed: Option<(&str, &str)>,
        key_ttl: Duration,
        subscribed_here: impl Future<Output = bool>,
    ) -> Result<PublishOutcome, PublishFailed> {
        if self.names.sharded() && id.is_none() {
            return self.broadcast_sharded(msg, keyed, key_ttl).await;
        }
        if self.fail_fast().is_err() || self.shard_down(id) {
            self.stats.publish_errors.fetch_add(1, Relaxed);
            return Err(PublishFailed::NotSent);
        }
        let (seq, rx) = self.expect_echo(key_ttl);
        let publish_id = format!("{}/{seq}", self.instance);
        let claim = keyed.map(|(_, request)| format!("{request} {publish_id}"));
        let (channel, history) = self.names.of(id);
        let clock = self.names.clock_key(id);
        let key = keyed.map_or_else(|| clock.clone(), |(key, _)| self.names.idempotency_key(id, key));
        let script = self.publish_script.clone();
        let (fleet, origin, text) = (clock, publish_id, msg.to_owned());
        let policy = id.map_or(self.namespaces.default_policy(), |id| self.namespaces.of(id));
        let (size, ttl) = (policy.history_size, policy.history_ttl_ms);
        let (claim_arg, key_ms) = (claim.clone().unwrap_or_default(), key_ttl.as_millis() as u64);
        // The script and its WAIT (below) on one connection: WAIT counts
        // the writes of the connection it is sent on. (Should the manager
        // reconnect between the two, WAIT covers nothing and answers at
        // once: a window of one reconnect.)
        let conn = self.publish_conn();
        let run = self.command_on(conn.clone(), "PUBLISH", async move |mut c| {
            script
                .key(fleet)
                .key(history)
                .key(key)
                .arg(origin)
                .arg(text)
                .arg(size)
                .arg(ttl)
                .arg(channel)
                .arg(claim_arg)
                .arg(key_ms)
                .arg(CLOCK_TOLERANCE.as_micros() as u64)
                .arg(CLOCK_RESET_AFTER.as_micros() as u64)
                .invoke_async::<Vec<redis::Value>>(&mut c)
                .await
        });
        let (r, subscribed_here) = tokio::join!(run, subscribed_here);
        let reply = match r {
            Ok(v) => v,
            Err(e) => {
                self.stats.publish_errors.fetch_add(1, Relaxed);
                return Err(match e {
                    // The script failed before its PUBLISH: no echo comes.
                    ApiError::RedisRefused(why) => {
                        self.awaited().remove(&seq);
                        PublishFailed::Refused(why)
                    }
                    // The echo may still come: the entry stays until its TTL.
                    _ => PublishFailed::Unknown,
                });
            }
        };
        self.stats.publishes.fetch_add(1, Relaxed);
        let mut reply = reply.into_iter();
        let fresh: u8 = reply
            .next()
            .and_then(|v| redis::from_redis_value(v).ok())
            .unwrap_or(0);
        if fresh == 2 {
            self.awaited().remove(&seq);
            let mut number = || {
                reply
                    .next()
                    .and_then(|v| redis::from_redis_value::<String>(v).ok())
                    .and_then(|s| s.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            let (clock, now) = (number(), number());
            self.stats.clock_ahead.fetch_add(1, Relaxed);
            let ahead = Duration::from_micros(clock.saturating_sub(now));
            tracing::warn!(
                event = "fleet_clock_ahead",
                ahead_ms = ahead.as_millis() as u64,
                "a publish was refused: the fleet's clock is ahead of Redis's time by more than the tolerance \
                 (Redis's time went back, or the fleet key was written by hand); publishes resume when \
                 Redis's time reaches it, and a clock further ahead is reset with a new epoch"
            );
            return Err(PublishFailed::ClockAhead(ahead));
        }
        if fresh == 0 {
            self.awaited().remove(&seq);
            return Ok(repeat_of(reply.next(), keyed.map(|(_, request)| request)));
        }
        let event: Option<u64> = reply
            .next()
            .and_then(|v| redis::from_redis_value::<String>(v).ok())
            .and_then(|s| s.parse().ok());
        if let Some(event) = event {
            self.saw(event);
        }
        let wait = self.settings.redis_wait_replicas;
        if wait > 0 {
            // WAIT covers every write this connection sent before it, the
            // script included. Fewer replicas than asked: the master may
            // be one that nobody keeps (paused, and replaced meanwhile).
            // Below the command timeout, so a short count is an answer,
            // not a timeout.
            let ms = (self.settings.command_timeout_ms / 2).max(5);
            // On a Redis Cluster, on the id's master (the slot is unused
            // on one Redis).
            let slot = id.map_or(0, Names::slot_of_id);
            let acked = self
                .command_on(conn, "WAIT", async move |mut c| {
                    c.wait_replicas(slot, wait, ms).await
                })
                .await;
            if !acked.is_ok_and(|n| n >= wait) {
                self.stats.wait_short.fetch_add(1, Relaxed);
                self.stats.publish_errors.fetch_add(1, Relaxed);
                if !subscribed_here {
                    // No echo will come to take it.
                    self.awaited().remove(&seq);
                }
                return Err(PublishFailed::Unreplicated);
            }
        }
        let receivers: u64 = reply
            .next()
            .and_then(|v| redis::from_redis_value(v).ok())
            .unwrap_or(0);
        let repaired: u8 = reply
            .next()
            .and_then(|v| redis::from_redis_value(v).ok())
            .unwrap_or(0);
        if repaired > 0 {
            self.stats.clock_resets.fetch_add(1, Relaxed);
            tracing::warn!(
                event = "fleet_clock_reset",
                event_id = event.unwrap_or(0),
                what = if repaired == 1 {
                    "the fleet's clock"
                } else {
                    "an id's history"
                },
                "found ids far ahead of Redis's time (past what can be waited for); reset to Redis's time \
                 with a new epoch: resumes from before it are told a gap"
            );
        }
        let fresh = |nodes, local| PublishOutcome::Fresh {
            nodes,
            local,
            claim: claim.clone(),
            event,
        };
        let mut rx = rx;
        if subscribed_here && let Ok(Ok(done)) = tokio::time::timeout(self.timeout(), &mut rx).await {
            return Ok(fresh(receivers.saturating_sub(1), LocalDelivery::Delivered(done)));
        }
        // No echo: this node was not among the receivers, unless the echo
        // took the entry just now and is delivering it.
        if self.awaited().remove(&seq).is_none() {
            let done = tokio::time::timeout(self.timeout(), rx)
                .await
                .ok()
                .and_then(Result::ok);
            return Ok(fresh(
                receivers.saturating_sub(1),
                LocalDelivery::Delivered(done.unwrap_or(0)),
            ));
        }
        Ok(fresh(receivers, LocalDelivery::NotSubscribed))
    }

    /// Registers the echo of this node's publish number `seq` (answered):
    /// the link that brings it back hands it to this node's streams and
    /// tells the receiver how many got it. Kept for `key_ttl` (at least the
    /// command timeout).
    fn expect_echo(&self, key_ttl: Duration) -> (u64, tokio::sync::oneshot::Receiver<u64>) {
        let seq = self.seq.fetch_add(1, Relaxed) + 1;
        let (tx, rx) = tokio::sync::oneshot::channel();
        {
            let mut pending = self.awaited();
            let now = Instant::now();
            // Sequence numbers grow and the TTL is one: the oldest entries
            // expire first, so dropping the expired ones is a walk from the
            // front. Past MAX_PENDING the oldest goes too (its echo, if
            // Redis ever runs it, is then not delivered here).
            loop {
                let full = pending.len() >= MAX_PENDING;
                match pending.first_entry() {
                    Some(first) if full || first.get().expires <= now => drop(first.remove()),
                    _ => break,
                }
            }
            pending.insert(
                seq,
                AwaitedEcho {
                    waiter: Some(tx),
                    expires: now + key_ttl.max(self.timeout()),
                },
            );
        }
        (seq, rx)
    }

    /// How many of this node's streams got its publish `seq` (`None`: its
    /// echo did not come in time; then it is not delivered here).
    async fn local_echo(&self, seq: u64, mut rx: tokio::sync::oneshot::Receiver<u64>) -> Option<u64> {
        if let Ok(Ok(done)) = tokio::time::timeout(self.timeout(), &mut rx).await {
            return Some(done);
        }
        // Unless the echo took the entry just now and is delivering it.
        if self.awaited().remove(&seq).is_none() {
            return tokio::time::timeout(self.timeout(), rx)
                .await
                .ok()
                .and_then(Result::ok);
        }
        None
    }

    /// A broadcast on a Redis Cluster: one copy per shard, SPUBLISHed on
    /// that shard's broadcast channel ([`Names::shard_broadcast`]), and
    /// every node hands the copy shard `k`'s link brings to the ids of
    /// shard `k` only. Each id's streams thus get it in the order its own
    /// shard ran it among the id's messages, the same order on every node.
    /// A copy has no event id and is not kept: an id from one shard's
    /// clock would have no order against the ids another shard mints.
    ///
    /// Its `Idempotency-Key` is claimed first, in the fleet's slot
    /// ([`CLAIM_SCRIPT`]). Every shard's link must be up, or nothing is
    /// sent (503, as for an id whose shard is down). Copies that fail
    /// while others went: [`PublishFailed::Partial`], and the claim is
    /// given back, so that a retry sends it again.
    async fn broadcast_sharded(
        &self,
        msg: &str,
        keyed: Option<(&str, &str)>,
        key_ttl: Duration,
    ) -> Result<PublishOutcome, PublishFailed> {
        let channels: Option<Vec<String>> = self.all_shards_up().and_then(|topology| {
            (0..topology.shards.len())
                .map(|k| self.names.shard_broadcast(&topology, k))
                .collect()
        });
        let Some(channels) = channels.filter(|_| self.fail_fast().is_ok()) else {
            self.stats.publish_errors.fetch_add(1, Relaxed);
            return Err(PublishFailed::NotSent);
        };
        let claimed = match keyed {
            None => None,
            Some((key, request)) => {
                let key = self.names.idempotency_key(None, key);
                let number = self.seq.fetch_add(1, Relaxed) + 1;
                let claim = format!("{request} {}/{number}", self.instance);
                let (script, k, c) = (self.claim_script.clone(), key.clone(), claim.clone());
                // Short until every copy went (then `key_ttl`): a claim
                // stranded by a failure goes soon, not a retry's 200.
                let ms = self.claim_ms(key_ttl);
                let reply = self
                    .command_on(self.publish_conn(), "PUBLISH", async move |mut conn| {
                        script
                            .key(k)
                            .arg(c)
                            .arg(ms)
                            .invoke_async::<Vec<redis::Value>>(&mut conn)
                            .await
                    })
                    .await;
                let mut reply = match reply {
                    Ok(reply) => reply.into_iter(),
                    Err(e) => {
                        self.stats.publish_errors.fetch_add(1, Relaxed);
                        if let ApiError::RedisRefused(why) = e {
                            return Err(PublishFailed::Refused(why));
                        }
                        // Redis may have claimed it: nothing was sent, so
                        // the claim is given back, or it expires soon.
                        let kept = self.release_claim(&key, &claim).await;
                        return Err(PublishFailed::Partial {
                            reached: 0,
                            shards: channels.len(),
                            late: false,
                            key_kept: kept.then(|| Duration::from_millis(self.claim_ms(key_ttl))),
                        });
                    }
                };
                let fresh: u8 = reply
                    .next()
                    .and_then(|v| redis::from_redis_value(v).ok())
                    .unwrap_or(0);
                if fresh == 0 {
                    return Ok(repeat_of(reply.next(), Some(request)));
                }
                Some((key, claim))
            }
        };
        let copies = channels.into_iter().map(|channel| {
            let (seq, rx) = self.expect_echo(key_ttl);
            let text = payload(&format!("{}/{seq}", self.instance), None, msg);
            let sent = self.command_on(self.publish_conn(), "PUBLISH", async move |mut c| {
                redis::cmd("SPUBLISH")
                    .arg(channel)
                    .arg(text)
                    .query_async::<u64>(&mut c)
                    .await
            });
            async move { (seq, rx, sent.await) }
        });
        let sent = futures_util::future::join_all(copies).await;
        let shards = sent.len();
        let (mut counts, mut refused, mut refusals) = (Vec::with_capacity(shards), None, 0);
        let mut echoes = Vec::with_capacity(shards);
        for (seq, rx, result) in sent {
            match result {
                Ok(n) => {
                    counts.push(n);
                    echoes.push((seq, rx));
                }
                Err(e) => {
                    if let ApiError::RedisRefused(why) = e {
                        // Not sent: no echo comes.
                        self.awaited().remove(&seq);
                        refused = Some(why);
                        refusals += 1;
                    }
                }
            }
        }
        // Every node subscribes every shard's channel, so each copy reaches
        // as many nodes. One that reached fewer went to a channel some
        // node does not subscribe (yet): its slot moved, or that node's
        // link to the shard is being made again. Those nodes' ids of that
        // shard did not get it, and it is not kept: partly delivered.
        let receivers = counts.iter().copied().max().unwrap_or(0);
        let reached = counts.iter().filter(|&&n| n == receivers).count();
        if reached < shards {
            self.stats.publish_errors.fetch_add(1, Relaxed);
            // Some copy timed out: Redis may still send it.
            let unknown = counts.len() + refusals < shards;
            if reached == 0 && !unknown {
                // Every copy refused: nothing went anywhere.
                let kept = match &claimed {
                    Some((key, claim)) => self.release_claim(key, claim).await,
                    None => false,
                };
                if !kept {
                    return Err(refused.map_or(PublishFailed::Unknown, PublishFailed::Refused));
                }
                return Err(PublishFailed::Partial {
                    reached: 0,
                    shards,
                    late: false,
                    key_kept: Some(Duration::from_millis(self.claim_ms(key_ttl))),
                });
            }
            // A retry sends it again, to every shard.
            let kept = match &claimed {
                Some((key, claim)) => self.release_claim(key, claim).await,
                None => false,
            };
            return Err(PublishFailed::Partial {
                reached,
                shards,
                late: unknown,
                key_kept: kept.then(|| Duration::from_millis(self.claim_ms(key_ttl))),
            });
        }
        self.stats.publishes.fetch_add(1, Relaxed);
        if let Some((key, claim)) = &claimed {
            // Every copy went: the claim holds for the key's whole TTL.
            let ms = key_ttl.as_millis() as u64;
            let _ = self.on_claim(EXTEND_SCRIPT, key, claim, &[ms]).await;
        }
        let echoes = echoes.into_iter().map(|(seq, rx)| self.local_echo(seq, rx));
        let here: u64 = futures_util::future::join_all(echoes)
            .await
            .into_iter()
            .map(|n| n.unwrap_or(0))
            .sum();
        Ok(PublishOutcome::Fresh {
            nodes: receivers.saturating_sub(1),
            local: LocalDelivery::Delivered(here),
            claim: claimed.map(|(_, claim)| claim),
            event: None,
        })
    }

    /// How long a broadcast's claim of its `Idempotency-Key` holds until
    /// every copy went ([`Cluster::broadcast_sharded`]): a few command
    /// timeouts (at least 2 s), at most `key_ttl`.
    fn claim_ms(&self, key_ttl: Duration) -> u64 {
        let short = (4 * self.settings.command_timeout_ms).max(2_000);
        short.min(key_ttl.as_millis() as u64)
    }

    /// Gives back a broadcast's claim `claim` of `key` (only if it is still
    /// this one: [`RELEASE_SCRIPT`]). Answers whether it may still be
    /// there (Redis did not answer): it then expires after
    /// [`Cluster::claim_ms`].
    async fn release_claim(&self, key: &str, claim: &str) -> bool {
        self.on_claim(RELEASE_SCRIPT, key, claim, &[]).await.is_err()
    }

    /// Runs `script` (one of the claim's: [`EXTEND_SCRIPT`],
    /// [`RELEASE_SCRIPT`]) on `key` with ARGV `claim`, then `more`.
    async fn on_claim(
        &self,
        script: &'static str,
        key: &str,
        claim: &str,
        more: &[u64],
    ) -> Result<i64, ApiError> {
        let mut eval = redis::cmd("EVAL");
        eval.arg(script).arg(1).arg(key).arg(claim).arg(more);
        self.command("PUBLISH", async move |mut c| {
            eval.query_async::<i64>(&mut c).await
        })
        .await
    }

    /// Reads the fleet's history for a stream of `id` that resumes after
    /// `since` (or, `None`, starts now) with [`READ_SCRIPT`].
    pub(crate) async fn read_history(&self, id: &str, since: Option<u64>) -> Result<FleetRead, ApiError> {
        // On a Redis Cluster the id's own clock and history, in its slot;
        // broadcasts are not kept there (see Cluster::broadcast_sharded).
        let sharded = self.names.sharded();
        let mut histories = vec![self.history_of(id)];
        if !sharded {
            histories.push(self.broadcasts_history());
        }
        let clock_key = self.names.clock_key(Some(id));
        let (clock, epoch, mut kept) = self.read(clock_key, histories, since).await?;
        let mut read = FleetRead {
            clock,
            epoch,
            ..FleetRead::default()
        };
        if since.is_some() {
            if !sharded {
                read.broadcasts = kept.pop().ok_or(ApiError::BusUnavailable)?;
            }
            read.id = kept.pop().ok_or(ApiError::BusUnavailable)?;
        }
        Ok(read)
    }

    /// Takes note of an event id the fleet gave (see [`FENCE_SCRIPT`]).
    pub(crate) fn saw(&self, event: u64) {
        self.seen.fetch_max(event, Relaxed);
    }

    /// Before a pub/sub link is made: runs [`FENCE_SCRIPT`], so that a
    /// Redis that took over the fleet's history (a failover, a restart
    /// from disk), which may lack its last entries, is a gap for every
    /// resume from before it, never a silent hole. Logged
    /// (`history_regressed`) and counted when it began an epoch.
    pub(crate) async fn fence(&self) -> Result<(), String> {
        if self.names.sharded() {
            // Each id's clock fences itself (SHARDED_PRELUDE).
            return Ok(());
        }
        let seen = self.seen.load(Relaxed);
        let (script, fleet) = (self.fence_script.clone(), self.names.fleet_key());
        let reply: Vec<String> = self
            .command("FENCE", async move |mut c| {
                script.key(fleet).arg(seen).invoke_async(&mut c).await
            })
            .await
            .map_err(|e| format!("checking which Redis keeps the fleet's history: {e:?}"))?;
        if let [fenced, clock, epoch] = reply.as_slice()
            && fenced == "1"
        {
            self.stats.history_regressions.fetch_add(1, Relaxed);
            tracing::warn!(
                event = "history_regressed",
                seen,
                fleet_clock = %clock,
                epoch = %epoch,
                master = %self.master_addr(),
                "another Redis keeps the fleet's history now (a failover, or a restart from disk) and \
                 may lack its last entries: a new epoch, so every resume from before it is told of a gap"
            );
        }
        Ok(())
    }

    /// The fleet's clock (its hash made, with a new epoch, if Redis has
    /// none: a new fleet, or one whose Redis lost its data).
    pub(crate) async fn fleet_clock(&self) -> Result<u64, ApiError> {
        self.read(self.names.fleet_key(), Vec::new(), None)
            .await
            .map(|(clock, _, _)| clock)
    }

    /// After the pub/sub link was lost: what the fleet kept after `since`
    /// for each of `ids` (at most [`CATCH_UP_BATCH`]), one read for all:
    /// `(clock, epoch, broadcasts, each id's)`.
    pub(crate) async fn catch_up(&self, ids: &[Arc<str>], since: u64) -> Result<CaughtUp, ApiError> {
        if self.names.sharded() {
            return self.catch_up_sharded(ids, since).await;
        }
        let histories = std::iter::once(self.broadcasts_history())
            .chain(ids.iter().map(|id| self.history_of(id)))
            .collect();
        let (clock, epoch, mut kept) = self.read(self.names.fleet_key(), histories, Some(since)).await?;
        if kept.len() != ids.len() + 1 {
            return Err(ApiError::BusUnavailable);
        }
        let broadcasts = kept.remove(0);
        Ok(CaughtUp {
            clock,
            epoch,
            broadcasts,
            ids: kept,
            clocks: Vec::new(),
        })
    }

    /// [`Cluster::catch_up`] on a Redis Cluster: each id's clock and
    /// history, read in its slot (all at once on the cluster connection).
    /// The Router asks from where the id's shard's link had its messages
    /// when it went ([`crate::hub::router::Subscribed::PartDown`]): ids of
    /// different shards come over different links, so the node's clock
    /// (the highest id from any of them) says nothing of what another link
    /// still had on its way.
    async fn catch_up_sharded(&self, ids: &[Arc<str>], since: u64) -> Result<CaughtUp, ApiError> {
        let reads = ids.iter().map(|id| {
            let clock_key = self.names.clock_key(Some(id));
            let history = self.history_of(id);
            self.read(clock_key, vec![history], Some(since))
        });
        let mut out = CaughtUp {
            clock: since,
            epoch: 0,
            broadcasts: FleetHistory::default(),
            ids: Vec::with_capacity(ids.len()),
            clocks: Vec::with_capacity(ids.len()),
        };
        for read in futures_util::future::join_all(reads).await {
            let (clock, _, mut kept) = read?;
            // The epoch is folded into the history's floor by READ_SCRIPT.
            out.ids.push(kept.pop().ok_or(ApiError::BusUnavailable)?);
            out.clocks.push(clock.max(since));
            out.clock = out.clock.max(clock);
        }
        Ok(out)
    }

    /// On a Redis Cluster, the scripts every master must have: a link to
    /// a shard's master loads them there before it subscribes. Otherwise
    /// redis-rs answers a NOSCRIPT (a new master: scripts are not
    /// replicated) with `SCRIPT LOAD` on every master, and one master that
    /// does not answer (paused, cut off) would fail the publishes of every
    /// shard until the link notices it.
    pub(crate) fn shard_scripts(&self) -> &[String] {
        &self.shard_scripts
    }

    /// The topology the Bus last read.
    pub(crate) fn topology(&self) -> Option<Arc<Topology>> {
        self.topology
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Reads `CLUSTER SHARDS` on the command connection and keeps it.
    pub(crate) async fn read_topology(&self) -> Result<Arc<Topology>, String> {
        let tls = self.settings.cluster_tls();
        let topology = self
            .command("CLUSTER SHARDS", async move |mut c| {
                let reply: redis::Value = redis::cmd("CLUSTER").arg("SHARDS").query_async(&mut c).await?;
                Ok(Topology::parse(reply, tls))
            })
            .await
            .map_err(|e| format!("reading the cluster's shards: {e:?}"))??;
        let topology = Arc::new(topology);
        *self
            .topology
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::clone(&topology));
        Ok(topology)
    }

    /// A client for the master at `addr` (`host:port`, from the topology),
    /// with the seeds' credentials and TLS: the Bus's link to that shard.
    pub(crate) fn shard_client(&self, addr: &str) -> Result<redis::Client, String> {
        let seed = self.client();
        let info = seed.get_connection_info().clone();
        let (host, port) = addr
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h.trim_matches(['[', ']']).to_owned(), p.parse::<u16>().ok()?)))
            .ok_or_else(|| format!("a shard master's address {addr:?}"))?;
        let addr = match info.addr() {
            redis::ConnectionAddr::TcpTls {
                insecure, tls_params, ..
            } => redis::ConnectionAddr::TcpTls {
                host,
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => redis::ConnectionAddr::Tcp(host, port),
        };
        let shown = format!("{addr:?}");
        redis::Client::open(info.set_addr(addr)).map_err(|e| format!("a client for {shown}: {e}"))
    }

    /// The history stream of `id`, with what it keeps.
    fn history_of(&self, id: &str) -> History {
        let p = self.namespaces.of(id);
        (self.names.history_key(id), p.history_ttl_ms, p.history_size)
    }

    /// The history stream of broadcasts, with what it keeps.
    fn broadcasts_history(&self) -> History {
        let p = self.namespaces.default_policy();
        (self.names.broadcasts_key(), p.history_ttl_ms, p.history_size)
    }

    /// Runs [`READ_SCRIPT`] over `histories`: the fleet's clock and epoch,
    /// and each history's kept messages after `since`.
    async fn read(
        &self,
        fleet: String,
        histories: Vec<History>,
        since: Option<u64>,
    ) -> Result<(u64, u64, Vec<FleetHistory>), ApiError> {
        let started = Instant::now();
        let script = self.read_script.clone();
        let since_arg = since.map(|s| s.to_string()).unwrap_or_default();
        let r = self
            .command("history", async move |mut c| {
                let mut call = script.key(fleet);
                call.arg(since_arg);
                for (key, ttl, size) in histories {
                    call.key(key).arg(ttl).arg(size);
                }
                call.invoke_async::<Vec<redis::Value>>(&mut c).await
            })
            .await;
        let s = &self.server_stats;
        s.history_reads.fetch_add(1, Relaxed);
        s.history_read_us
            .fetch_add(started.elapsed().as_micros() as u64, Relaxed);
        let parsed = r.ok().and_then(|reply| parse_read(reply, self.max_message_bytes));
        if parsed.is_none() {
            s.history_read_errors.fetch_add(1, Relaxed);
        }
        parsed.ok_or(ApiError::BusUnavailable)
    }

    /// Records `answer` as the first answer of `key`, which holds `claim`,
    /// for repeats on any node. Best effort: a repeat that finds only the
    /// claim still is not delivered again.
    pub(crate) async fn remember_answer(&self, key: &str, claim: String, answer: &super::Receipt) {
        let id = answer.id.as_deref();
        let request = claim.split(' ').next().unwrap_or_default();
        // unwrap: a Receipt is numbers and a string; it always serializes.
        let answer = serde_json::to_string(answer).expect("a receipt serializes");
        let (redis_key, answer) = (self.names.idempotency_key(id, key), format!("{request} {answer}"));
        let publish_id = claim;
        let _ = self
            .command("SET", async move |mut c| {
                redis::cmd("EVAL")
                    .arg(REMEMBER_SCRIPT)
                    .arg(1)
                    .arg(redis_key)
                    .arg(publish_id)
                    .arg(answer)
                    .query_async::<i64>(&mut c)
                    .await
            })
            .await;
    }

    /// The lingering table (a panic while it was held leaves it usable).
    /// Private: the Bus and the Hub use it through the methods below.
    fn lingering(&self) -> MutexGuard<'_, HashMap<Arc<str>, tokio::time::Instant>> {
        self.lingering
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether this node is subscribed to `id` though it holds no stream.
    pub(crate) fn is_lingering(&self, id: &str) -> bool {
        self.lingering().contains_key(id)
    }

    /// `id` lost its last local stream: it stays subscribed until `until`.
    pub(crate) fn linger(&self, id: Arc<str>, until: tokio::time::Instant) {
        self.lingering().insert(id, until);
    }

    /// `id` has a local stream again: whether it was still lingering (and
    /// so still subscribed).
    pub(crate) fn end_linger(&self, id: &str) -> bool {
        self.lingering().remove(id).is_some()
    }

    /// Takes the lingering ids whose time is up at `now` (to unsubscribe).
    pub(crate) fn expired_lingers(&self, now: tokio::time::Instant) -> Vec<Arc<str>> {
        let mut expired = Vec::new();
        let mut lingering = self.lingering();
        lingering.retain(|id, until| {
            let keep = *until > now;
            if !keep {
                expired.push(Arc::clone(id));
            }
            keep
        });
        if !expired.is_empty() {
            crate::id::shrink_if_sparse(&mut lingering);
        }
        expired
    }

    /// What a new link subscribes to: the ids `held` here and the
    /// lingering ones, each once.
    pub(crate) fn to_subscribe(&self, held: Vec<Arc<str>>) -> Vec<Arc<str>> {
        let lingering = self.lingering();
        held.into_iter()
            .filter(|id| !lingering.contains_key(id))
            .chain(lingering.keys().cloned())
            .collect()
    }

    /// Redis's time now, as this node estimates it from its own clock and
    /// the skew its last heartbeat measured.
    pub(crate) fn redis_now_us(&self) -> u64 {
        let skew = self.stats.clock_skew_us.load(Relaxed);
        crate::hub::history::now_us().saturating_add_signed(skew)
    }

    /// The skew past [`CLOCK_TOLERANCE`], if it is (what `/readyz` says).
    pub(crate) fn clock_skewed(&self) -> Option<ApiError> {
        let skew = self.stats.clock_skew_us.load(Relaxed);
        (skew.unsigned_abs() > CLOCK_TOLERANCE.as_micros() as u64).then(|| ApiError::ClockSkew {
            skew_ms: skew / 1000,
            tolerance_s: CLOCK_TOLERANCE.as_secs(),
        })
    }

    /// Whether the bus is up on a Redis this version can use: what
    /// `/readyz` reports.
    pub(crate) fn ready(&self) -> bool {
        self.stats.connected.load(Relaxed) && !self.unusable.load(Relaxed)
    }

    /// On a Redis Cluster: which shards' links are up (see
    /// [`Cluster::shard_down`]); `None`: all of them are being made.
    pub(crate) fn shards_up(&self, up: Option<(Arc<Topology>, Vec<bool>)>) {
        *self.shard_links() = up;
    }

    /// On a Redis Cluster: shard `k`'s link is up (and settled) or not, in
    /// `topology` (the same slots, its masters perhaps new).
    pub(crate) fn set_shard_up(&self, k: usize, up: bool, topology: Option<Arc<Topology>>) {
        let mut links = self.shard_links();
        if let Some((t, flags)) = links.as_mut() {
            if let Some(topology) = topology {
                *t = topology;
            }
            if let Some(flag) = flags.get_mut(k) {
                *flag = up;
            }
        }
    }

    /// Whether any shard's link is up.
    pub(crate) fn any_shard_up(&self) -> bool {
        self.shard_links()
            .as_ref()
            .is_some_and(|(_, flags)| flags.iter().any(|&up| up))
    }

    /// On a Redis Cluster: whether the link to the shard of `id` (`None`:
    /// of broadcasts) is down, while others are up. A publish there is
    /// refused at once (503), and only there: the other shards' ids flow.
    fn shard_down(&self, id: Option<&str>) -> bool {
        let links = self.shard_links();
        let Some((topology, flags)) = links.as_ref() else {
            return false;
        };
        match id {
            Some(id) => !flags
                .get(topology.shard_of(Names::slot_of_id(id)))
                .copied()
                .unwrap_or(false),
            None => !flags.iter().all(|&up| up),
        }
    }

    /// The topology, if every shard's link is up (a Redis Cluster).
    fn all_shards_up(&self) -> Option<Arc<Topology>> {
        let links = self.shard_links();
        let (topology, flags) = links.as_ref()?;
        (flags.len() == topology.shards.len() && flags.iter().all(|&up| up)).then(|| Arc::clone(topology))
    }

    fn shard_links(&self) -> MutexGuard<'_, Option<(Arc<Topology>, Vec<bool>)>> {
        self.shard_links
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Answers at once, without Redis, while the bus is down (or Redis is
    /// too old for the fleet's history).
    fn fail_fast(&self) -> Result<(), ApiError> {
        if self.ready() {
            Ok(())
        } else {
            Err(ApiError::BusUnavailable)
        }
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.settings.command_timeout_ms)
    }

    /// How long the bus link may take to connect or to answer a SUBSCRIBE
    /// or PING before it is given up: the heartbeat TTL, not the command
    /// timeout. A box busy enough to miss one command deadline would
    /// otherwise drop the link and resubscribe every id it holds, more
    /// load on top (docs/design-notes.md).
    pub(crate) fn link_timeout(&self) -> Duration {
        Duration::from_millis(
            self.settings
                .heartbeat_ttl_ms
                .max(self.settings.command_timeout_ms),
        )
    }

    /// Runs one command with the command timeout; a failure is counted and
    /// becomes [`ApiError::BusUnavailable`].
    pub(crate) async fn command<T>(
        &self,
        what: &'static str,
        f: impl AsyncFnOnce(Commands) -> redis::RedisResult<T>,
    ) -> Result<T, ApiError> {
        self.command_on(self.conn(), what, f).await
    }

    /// [`Cluster::command`] on a given connection (`None`: no master yet).
    async fn command_on<T>(
        &self,
        conn: Option<Commands>,
        what: &'static str,
        f: impl AsyncFnOnce(Commands) -> redis::RedisResult<T>,
    ) -> Result<T, ApiError> {
        let Some(conn) = conn else {
            self.stats.errors.fetch_add(1, Relaxed);
            return Err(ApiError::BusUnavailable);
        };
        match tokio::time::timeout(self.timeout(), f(conn)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                self.stats.errors.fetch_add(1, Relaxed);
                if self.sentinel.is_some()
                    && (e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
                        || e.code() == Some("READONLY"))
                {
                    self.stats.readonly.fetch_add(1, Relaxed);
                    self.stale_master.store(true, Relaxed);
                }
                tracing::debug!(command = what, cause = %e, "redis command failed");
                // Redis answered, with an error (a script's, a command's):
                // reported as that, not as a Redis that did not answer.
                // A Redis Cluster's redirects and refusals too: the command
                // did not run there.
                if matches!(
                    e.kind(),
                    redis::ErrorKind::Server(
                        redis::ServerErrorKind::ResponseError
                            | redis::ServerErrorKind::ExecAbort
                            | redis::ServerErrorKind::NoPerm
                            | redis::ServerErrorKind::Moved
                            | redis::ServerErrorKind::Ask
                            | redis::ServerErrorKind::TryAgain
                            | redis::ServerErrorKind::ClusterDown
                            | redis::ServerErrorKind::MasterDown
                            | redis::ServerErrorKind::CrossSlot
                    ) | redis::ErrorKind::Extension
                ) {
                    return Err(ApiError::RedisRefused(format!("{what}: {e}")));
                }
                Err(ApiError::BusUnavailable)
            }
            Err(_) => {
                self.stats.errors.fetch_add(1, Relaxed);
                tracing::debug!(command = what, "redis command timed out");
                Err(ApiError::BusUnavailable)
            }
        }
    }

    /// Writes this node's count of streams for each of `counts` (0: the
    /// field goes) to its presence hash and renews the hash's expiry (the
    /// heartbeat TTL: a dead node's counts go with it), in pipelines of at
    /// most [`PRESENCE_BATCH`] ids. `full`: the counts are every id held
    /// here, so the hash is replaced. Answers whether the hash was there
    /// before the write.
    pub(crate) async fn write_presence(&self, counts: &[HeldCount], full: bool) -> Result<bool, ApiError> {
        if self.names.sharded() {
            return self.write_presence_sharded(counts, full).await;
        }
        let key = self.names.presence_key(&self.instance);
        let counts: Vec<&HeldCount> = counts.iter().collect();
        self.write_presence_hash(key, &counts, full).await
    }

    /// [`Cluster::write_presence`] on a Redis Cluster: one hash per shard,
    /// for the ids of that shard, carrying the shard's tag
    /// ([`Names::shard_presence_key`]), so that presence is spread over the
    /// shards as the ids are, and a read of an id's is one shard's. Each
    /// hash keeps a marker field (`!`, not an id) so that a shard where
    /// this node holds no id still has one, and a lost hash is told.
    ///
    /// When the slots moved since the last write (a reshard), the ids are
    /// in other shards now: answers `false` (as for a lost hash), so the
    /// Router writes every held id again (`full`). A hash of a tag no shard
    /// has any more is no longer renewed and expires with the heartbeat
    /// TTL. A failover keeps the slots, and the promoted replica has the
    /// hashes.
    async fn write_presence_sharded(&self, counts: &[HeldCount], full: bool) -> Result<bool, ApiError> {
        let topology = self.topology().ok_or(ApiError::BusUnavailable)?;
        let last = self
            .presence_topology
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let moved = last.as_ref().is_some_and(|t| !t.same_slots(&topology));
        let tags: Vec<&str> = (0..topology.shards.len())
            .map(|k| topology.shard_tag(k).ok_or(ApiError::BusUnavailable))
            .collect::<Result<_, _>>()?;
        let mut groups: Vec<Vec<&HeldCount>> = vec![Vec::new(); tags.len()];
        for c in counts {
            groups[topology.shard_of(Names::slot_of_id(&c.id))].push(c);
        }
        // Every shard's, at once: one whose master is down fails its own
        // write (all is written again at the next beat), not the others'.
        let writes = tags.iter().zip(&groups).map(|(tag, group)| {
            let key = self.names.shard_presence_key(tag, &self.instance);
            self.write_presence_hash(key, group, full)
        });
        let mut existed = true;
        for written in futures_util::future::join_all(writes).await {
            existed &= written?;
        }
        if full || last.is_none() || moved {
            *self
                .presence_topology
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(topology);
        }
        Ok(existed && !moved)
    }

    /// Writes `counts` to one presence hash `key` (see
    /// [`Cluster::write_presence`]). Answers whether it was there before.
    async fn write_presence_hash(
        &self,
        key: String,
        counts: &[&HeldCount],
        full: bool,
    ) -> Result<bool, ApiError> {
        let ttl = self.settings.heartbeat_ttl_ms;
        let marker = self.names.sharded();
        let mut existed = true;
        let mut chunks = counts.chunks(PRESENCE_BATCH).peekable();
        let mut first = true;
        loop {
            let chunk = chunks.next().unwrap_or(&[]);
            let mut pipe = redis::pipe();
            if first {
                pipe.exists(&key);
                if full {
                    pipe.del(&key).ignore();
                }
                if marker {
                    pipe.hset(&key, PRESENCE_MARKER, "").ignore();
                }
            }
            // `<streams>`, or `<streams> <subjects as a JSON array>`.
            let set: Vec<(&str, String)> = chunk
                .iter()
                .filter(|c| c.streams > 0)
                .map(|c| {
                    let value = match &c.subjects {
                        None => c.streams.to_string(),
                        Some(subjects) => format!("{} {subjects}", c.streams),
                    };
                    (&*c.id, value)
                })
                .collect();
            let gone: Vec<&str> = chunk.iter().filter(|c| c.streams == 0).map(|c| &*c.id).collect();
            if !set.is_empty() {
                pipe.hset_multiple(&key, &set).ignore();
            }
            if !gone.is_empty() {
                pipe.hdel(&key, gone).ignore();
            }
            pipe.pexpire(&key, ttl as i64).ignore();
            let answer: Vec<bool> = self
                .command("presence", async move |mut c| pipe.query_async(&mut c).await)
                .await?;
            if first {
                existed = answer.first().copied().unwrap_or(false);
                first = false;
            }
            if chunks.peek().is_none() {
                return Ok(existed);
            }
        }
    }

    /// `/presence/{id}` in cluster mode: the id's streams on every live
    /// node, from their presence hashes (this node's own from `here`, its
    /// live count).
    pub(crate) async fn presence(
        &self,
        id: &str,
        here: usize,
        subjects: Option<Vec<Arc<str>>>,
    ) -> Result<Presence, ApiError> {
        self.fail_fast()?;
        let nodes = self.live_nodes().await?;
        let others: Vec<&NodeInfo> = nodes.iter().filter(|n| n.instance != self.instance).collect();
        let fields: Vec<Option<String>> = if others.is_empty() {
            Vec::new()
        } else {
            // On a Redis Cluster, in the hashes of the id's shard.
            let tag = if self.names.sharded() {
                let topology = self.topology().ok_or(ApiError::BusUnavailable)?;
                let k = topology.shard_of(Names::slot_of_id(id));
                Some(topology.shard_tag(k).ok_or(ApiError::BusUnavailable)?.to_owned())
            } else {
                None
            };
            let mut pipe = redis::pipe();
            for n in &others {
                pipe.hget(
                    match &tag {
                        Some(tag) => self.names.shard_presence_key(tag, &n.instance),
                        None => self.names.presence_key(&n.instance),
                    },
                    id,
                );
            }
            self.command("HGET", async move |mut c| pipe.query_async(&mut c).await)
                .await?
        };
        // `<streams>`, or `<streams> <subjects>` (`presence_events`).
        let mut theirs: Vec<String> = Vec::new();
        let counts = fields.into_iter().map(|f| {
            let f = f?;
            let (count, subjects) = f.split_once(' ').unwrap_or((&f, ""));
            let n = count.parse::<u64>().ok().filter(|n| *n <= MAX_NODE_STREAMS);
            let listed = match subjects {
                "" => Some(Vec::new()),
                json => serde_json::from_str::<Vec<String>>(json).ok(),
            };
            match (n, listed) {
                (Some(n), Some(listed)) => {
                    theirs.extend(listed);
                    Some(n)
                }
                _ => {
                    self.bad_state("a presence count", &f);
                    None
                }
            }
        });
        let mut list: Vec<(String, u64)> = others
            .iter()
            .zip(counts)
            .filter_map(|(n, count)| count.filter(|c| *c > 0).map(|c| (n.name.clone(), c)))
            .collect();
        if here > 0 {
            list.push((self.node.clone(), here as u64));
        }
        list.sort();
        Ok(Presence::of(id, list).with_subjects(subjects, theirs))
    }

    /// The streams of `id` on the other live nodes, from their presence
    /// (as of their last heartbeat).
    pub(crate) async fn streams_elsewhere(&self, id: &str) -> Result<u64, ApiError> {
        Ok(self.presence(id, 0, None).await?.streams)
    }

    /// `n` numbers of the fleet's `/dispatcher` count: the first of them.
    ///
    /// A count Redis cannot increment (at `i64::MAX`, not a number) or
    /// that is negative is reset, logged and counted, and numbering starts
    /// again at 1, rather than every `/dispatcher` answering 503 for good.
    pub(crate) async fn take_numbers(&self, n: u64) -> Result<u64, ApiError> {
        self.fail_fast()?;
        let key = self.names.counter_key();
        let counted = {
            let key = key.clone();
            self.command("INCRBY", async move |mut c| c.incr::<_, _, i64>(key, n).await)
                .await
        };
        let last = match counted {
            Ok(last) if last >= 0 => last as u64,
            Ok(_) | Err(ApiError::RedisRefused(_)) => {
                self.bad_state("the /dispatcher count", "not a count INCRBY can go on from");
                let script = redis::Script::new(DISPATCHER_RESET_SCRIPT);
                self.command("INCRBY", async move |mut c| {
                    script.key(key).arg(n).invoke_async::<i64>(&mut c).await
                })
                .await?
                .max(0) as u64
            }
            Err(e) => return Err(e),
        };
        self.server_stats.counter.store(last, Relaxed);
        Ok((last + 1).saturating_sub(n).max(1))
    }

    /// This node as `/cluster` lists it.
    fn info(&self) -> NodeInfo {
        NodeInfo {
            name: self.node.clone(),
            instance: self.instance.clone(),
            host: self.host.clone(),
            pid: std::process::id(),
            streams: self.server_stats.streams_active() as u64,
            uptime_s: self.started.elapsed().as_secs(),
            addr: self.addr.clone(),
            figures: NodeFigures::of(&self.server_stats, self.stats.restarts.load(Relaxed)),
        }
    }

    /// Writes this node's heartbeat: its key with the TTL, and its name in
    /// the node set scored by when the key expires.
    pub(crate) async fn heartbeat(&self) -> Result<(), ApiError> {
        let ttl = self.settings.heartbeat_ttl_ms;
        let info = serde_json::to_string(&self.info()).expect("NodeInfo serializes");
        let (key, set, name) = (
            self.names.node_key(&self.node),
            self.names.nodes_key(),
            self.node.clone(),
        );
        let expires = now_ms() + ttl;
        let sent = crate::hub::history::now_us();
        let ((secs, micros), previous): ((u64, u64), Option<String>) = self
            .command("heartbeat", async move |mut c| {
                redis::pipe()
                    .atomic()
                    .cmd("TIME")
                    .get(&key)
                    .cmd("SET")
                    .arg(&key)
                    .arg(info)
                    .arg("PX")
                    .arg(ttl)
                    .ignore()
                    .zadd(&set, name, expires)
                    .ignore()
                    .zrembyscore(&set, "-inf", expires.saturating_sub(ttl + PRUNE_AFTER_MS))
                    .ignore()
                    .query_async(&mut c)
                    .await
            })
            .await?;
        // Redis's time against this node's, at the middle of the round trip.
        let answered = crate::hub::history::now_us();
        let redis_us = secs.saturating_mul(1_000_000).saturating_add(micros);
        let here_us = sent / 2 + answered / 2;
        let skew = i64::try_from(redis_us).unwrap_or(i64::MAX) - i64::try_from(here_us).unwrap_or(i64::MAX);
        self.stats.clock_skew_us.store(skew, Relaxed);
        if self.clock_skewed().is_some() && self.stats.heartbeats.load(Relaxed).is_multiple_of(60) {
            tracing::warn!(
                event = "clock_skew",
                skew_ms = skew / 1000,
                tolerance_ms = CLOCK_TOLERANCE.as_millis() as u64,
                "this node's clock differs from Redis's by more than the tolerance; it corrects for it \
                 (event ids are Redis's time) but /readyz answers 503: fix the time sync (NTP)"
            );
        }
        // Our own entry, unless another node uses this name. The first
        // beat may find the entry of this name's previous process (a
        // restarted fleet child), which is fine.
        let first = self.stats.heartbeats.fetch_add(1, Relaxed) == 0;
        if first {
            self.check_version().await;
        }
        let other = previous
            .and_then(|p| serde_json::from_str::<NodeInfo>(&p).ok())
            .filter(|p| p.instance != self.instance);
        if let (false, Some(other)) = (first, other)
            && self.stats.name_conflicts.fetch_add(1, Relaxed).is_multiple_of(60)
        {
            tracing::error!(
                event = "name_conflict",
                node = %self.node,
                other_pid = other.pid,
                other_host = %other.host,
                "another node uses this node's cluster.node_name; /cluster shows only one of them (give each a name of its own)"
            );
        }
        Ok(())
    }

    /// Checks what the fleet's history needs of Redis, once: version 7.0
    /// or later (`XSETID … MAXDELETEDID`, `XINFO STREAM`'s
    /// `entries-added`), or this node publishes nothing and is not ready;
    /// and no eviction of keys with a TTL (history keys have one: evicted,
    /// their messages would be gone without the floor a gap is told from).
    async fn check_version(&self) {
        if self.names.sharded() {
            // CLUSTER SHARDS, which every link reads first, is Redis 7.0's.
            if let (Ok(mut v), Some(_)) = (self.redis_version.lock(), self.topology()) {
                "7.0+ (Redis Cluster)".clone_into(&mut v);
            }
            return;
        }
        let Ok(info) = self
            .command("INFO", async move |mut c| {
                redis::cmd("INFO")
                    .arg("server")
                    .arg("memory")
                    .query_async::<String>(&mut c)
                    .await
            })
            .await
        else {
            return;
        };
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .unwrap_or("")
                .trim()
                .to_owned()
        };
        let version = field("redis_version");
        let major: u32 = version
            .split('.')
            .next()
            .and_then(|m| m.parse().ok())
            .unwrap_or(0);
        if major < 7 {
            self.unusable.store(true, Relaxed);
            tracing::error!(
                event = "redis_too_old",
                version = %version,
                "cluster mode needs Redis 7.0 or later (the fleet's history uses XSETID MAXDELETEDID); \
                 this node publishes nothing and /readyz answers 503 until Redis is upgraded"
            );
        }
        let (maxmemory, policy) = (field("maxmemory"), field("maxmemory_policy"));
        let evicts = policy.starts_with("volatile") || policy.starts_with("allkeys");
        if evicts && maxmemory != "0" && !maxmemory.is_empty() {
            tracing::error!(
                event = "redis_evicts",
                policy = %policy,
                "Redis evicts keys when full (maxmemory-policy {policy}): a history evicted early loses \
                 messages a resuming client is not told of; use noeviction"
            );
        }
        if let Ok(mut v) = self.redis_version.lock() {
            *v = version;
        }
    }

    /// Removes this node from `/cluster` (graceful shutdown), and has its
    /// ids vacated by the next live node ([`Cluster::leave_occupancy`]).
    pub(crate) async fn leave(&self) {
        self.leave_occupancy().await;
        let (key, set, name) = (
            self.names.node_key(&self.node),
            self.names.nodes_key(),
            self.node.clone(),
        );
        let instance = format!("\"instance\":\"{}\"", self.instance);
        let left = self
            .command("leave", async move |mut c| {
                // Only this process's entry: another node of the same name
                // keeps its own.
                redis::cmd("EVAL")
                    .arg(LEAVE_SCRIPT)
                    .arg(2)
                    .arg(&key)
                    .arg(&set)
                    .arg(&name)
                    .arg(&instance)
                    .query_async::<()>(&mut c)
                    .await
            })
            .await;
        if left.is_err() {
            tracing::warn!(
                event = "leave_failed",
                "could not remove this node from /cluster; it drops out when its heartbeat expires"
            );
        }
    }

    /// Every live node (its heartbeat key has not expired), by name, and
    /// the totals.
    pub(crate) async fn view(&self) -> Result<ClusterView, ApiError> {
        self.fail_fast()?;
        let nodes = self.live_nodes().await?;
        Ok(ClusterView::of("cluster", &self.node, nodes))
    }

    /// Every live node's heartbeat entry, by name.
    async fn live_nodes(&self) -> Result<Vec<NodeInfo>, ApiError> {
        let set = self.names.nodes_key();
        let names: Vec<String> = self
            .command("ZRANGE", async move |mut c| c.zrange(set, 0, -1).await)
            .await?;
        let keys: Vec<String> = names.iter().map(|n| self.names.node_key(n)).collect();
        let entries: Vec<Option<String>> = if keys.is_empty() {
            Vec::new()
        } else {
            self.command("MGET", async move |mut c| {
                redis::cmd("MGET").arg(keys).query_async(&mut c).await
            })
            .await?
        };
        // Redis state is input: an entry that does not parse, or claims
        // more streams than a node can hold, is left out, counted and logged.
        let mut nodes: Vec<NodeInfo> = entries
            .into_iter()
            .flatten()
            .filter_map(|e| match serde_json::from_str::<NodeInfo>(&e) {
                Ok(n) if n.streams <= MAX_NODE_STREAMS => Some(n),
                _ => {
                    self.bad_state("a node entry", &e);
                    None
                }
            })
            .collect();
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(nodes)
    }

    /// Counts and logs a value read back from Redis that is not what this
    /// version writes there (hand-edited, another program's, corrupt):
    /// left out of the answer rather than trusted or failing it.
    pub(crate) fn bad_state(&self, what: &str, value: &str) {
        self.stats.bad_state.fetch_add(1, Relaxed);
        let value: String = value.chars().take(80).collect();
        tracing::warn!(
            event = "redis_bad_state",
            what,
            value = %value,
            "a value read from Redis is out of range or not in this version's format; left out (counted in \
             /stats cluster.bad_state)"
        );
    }

    /// [`Cluster::view`], at most `max_age` old (for the dashboard).
    pub(crate) async fn recent_view(&self, max_age: Duration) -> Result<ClusterView, ApiError> {
        let mut cache = self.view_cache.lock().await;
        if let Some((at, view)) = cache.as_ref()
            && at.elapsed() < max_age
        {
            return Ok(view.clone());
        }
        let view = self.view().await?;
        *cache = Some((Instant::now(), view.clone()));
        Ok(view)
    }

    /// The `cluster` section of `/stats`.
    pub(crate) fn snapshot(&self) -> ClusterSnapshot {
        let s = &self.stats;
        let get = |a: &AtomicU64| a.load(Relaxed);
        ClusterSnapshot {
            node: self.node.clone(),
            instance: self.instance.clone(),
            connected: s.connected.load(Relaxed),
            subscriptions: get(&s.subscriptions),
            subscribe_commands: get(&s.subscribe_commands),
            publishes: get(&s.publishes),
            publish_errors: get(&s.publish_errors),
            received: get(&s.received),
            echoes: get(&s.echoes),
            malformed: get(&s.malformed),
            reconnects: get(&s.reconnects),
            resubscribed: get(&s.resubscribed),
            errors: get(&s.errors),
            heartbeats: get(&s.heartbeats),
            restarts: get(&s.restarts),
            name_conflicts: get(&s.name_conflicts),
            master_switches: get(&s.master_switches),
            stale_sentinel_answers: get(&s.stale_sentinel_answers),
            readonly: get(&s.readonly),
            wait_short: get(&s.wait_short),
            history_regressions: get(&s.history_regressions),
            clock_skew_ms: s.clock_skew_us.load(Relaxed) / 1000,
            clock_ahead: get(&s.clock_ahead),
            clock_resets: get(&s.clock_resets),
            ids_ahead: get(&s.ids_ahead),
            bad_state: get(&s.bad_state),
            redis: self.master_addr(),
            redis_version: self.redis_version.lock().map(|v| v.clone()).unwrap_or_default(),
        }
    }
}

/// The `cluster` section of `/stats`: this node's bus counters (see
/// [`ClusterStats`], whose fields these are) and the Redis it speaks to.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ClusterSnapshot {
    node: String,
    instance: String,
    connected: bool,
    subscriptions: u64,
    subscribe_commands: u64,
    publishes: u64,
    publish_errors: u64,
    received: u64,
    echoes: u64,
    malformed: u64,
    reconnects: u64,
    resubscribed: u64,
    errors: u64,
    heartbeats: u64,
    restarts: u64,
    name_conflicts: u64,
    master_switches: u64,
    stale_sentinel_answers: u64,
    readonly: u64,
    wait_short: u64,
    history_regressions: u64,
    clock_skew_ms: i64,
    clock_ahead: u64,
    clock_resets: u64,
    ids_ahead: u64,
    bad_state: u64,
    redis: String,
    redis_version: String,
}

/// `/cluster` of a server without a bus: just itself.
pub(crate) fn single_view(stats: &Stats, addr: &str) -> ClusterView {
    let host = hostname();
    let pid = std::process::id();
    let me = NodeInfo {
        name: format!("{host}-{pid}"),
        instance: String::new(),
        host,
        pid,
        streams: stats.streams_active() as u64,
        uptime_s: stats.uptime().as_secs(),
        addr: addr.to_owned(),
        figures: NodeFigures::of(stats, 0),
    };
    ClusterView::of("single", &me.name.clone(), vec![me])
}

/// `/presence/{id}`'s answer: the id, its streams, and the nodes that
/// have any, by name. Fields in the order the answer has always had.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Presence {
    pub(crate) id: String,
    pub(crate) nodes: Vec<NodePresence>,
    /// The sum over `nodes`.
    pub(crate) streams: u64,
    /// With `presence_events`: the subjects.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) subjects: Option<PresentSubjects>,
}

/// The distinct token subjects of an id's streams (`presence_events`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PresentSubjects {
    /// Sorted, at most [`MAX_SUBJECTS`].
    pub(crate) list: Vec<String>,
    /// How many distinct ones there are (counted from at most
    /// [`MAX_SUBJECTS`] per node).
    pub(crate) count: usize,
}

/// One node's streams of an id.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct NodePresence {
    pub(crate) node: String,
    pub(crate) streams: u64,
}

impl Presence {
    /// From `(node, streams)` pairs, in their order.
    fn of(id: &str, nodes: Vec<(String, u64)>) -> Presence {
        let streams = nodes.iter().fold(0u64, |sum, (_, n)| sum.saturating_add(*n));
        let nodes = nodes
            .into_iter()
            .map(|(node, streams)| NodePresence { node, streams })
            .collect();
        Presence {
            id: id.to_owned(),
            nodes,
            streams,
            subjects: None,
        }
    }

    /// With the subjects of `here` (this node's; `None`: the id's
    /// namespace keeps none) and of the other nodes (`theirs`).
    pub(crate) fn with_subjects(mut self, here: Option<Vec<Arc<str>>>, theirs: Vec<String>) -> Presence {
        if let Some(here) = here {
            let mut all: Vec<String> = theirs;
            all.extend(here.iter().map(|s| s.to_string()));
            all.sort();
            all.dedup();
            let count = all.len();
            all.truncate(MAX_SUBJECTS);
            self.subjects = Some(PresentSubjects { list: all, count });
        }
        self
    }
}

/// `/presence/{id}` of a server without a bus: this process alone.
pub(crate) fn single_presence(id: &str, here: usize) -> Presence {
    let name = format!("{}-{}", hostname(), std::process::id());
    let nodes = if here > 0 {
        vec![(name, here as u64)]
    } else {
        Vec::new()
    };
    Presence::of(id, nodes)
}

/// `/cluster`'s answer: the live nodes by name, and the totals.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ClusterView {
    /// "cluster", or "single" without a bus.
    pub(crate) mode: &'static str,
    /// The node that answers.
    pub(crate) node: String,
    pub(crate) nodes: Vec<NodeInfo>,
    pub(crate) totals: ViewTotals,
}

/// [`ClusterView`]'s sums.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ViewTotals {
    pub(crate) nodes: usize,
    pub(crate) streams: u64,
}

impl ClusterView {
    fn of(mode: &'static str, node: &str, nodes: Vec<NodeInfo>) -> ClusterView {
        let streams = nodes.iter().fold(0u64, |sum, n| sum.saturating_add(n.streams));
        ClusterView {
            mode,
            node: node.to_owned(),
            totals: ViewTotals {
                nodes: nodes.len(),
                streams,
            },
            nodes,
        }
    }
}

/// A message as it travels on the bus (see the module docs).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Payload<'a> {
    /// `<instance>` or `<instance>/<seq>`.
    pub(crate) origin: &'a str,
    /// The event id its node minted; `None` for a broadcast, and for a
    /// message from a node of a version before event ids travelled.
    pub(crate) event: Option<u64>,
    /// The message line.
    pub(crate) text: &'a str,
}

/// What a key's claim that was already there holds (`stored`: the
/// script's second answer): the first publish's answer, or a `Mismatch` if
/// it was for another target or message than `request`.
fn repeat_of(stored: Option<redis::Value>, request: Option<&str>) -> PublishOutcome {
    let stored: String = stored
        .and_then(|v| redis::from_redis_value(v).ok())
        .unwrap_or_default();
    let (bound_to, rest) = stored.split_once(' ').unwrap_or((&stored, ""));
    if Some(bound_to) != request {
        return PublishOutcome::Mismatch;
    }
    PublishOutcome::Repeat(serde_json::from_str(rest).ok())
}

/// A bus payload: `"<origin>@<event> <text>"`, or `"<origin> <text>"`
/// without an event id. The id rides on the origin so that a node of a
/// version before it travelled, which compares the origin with its own and
/// delivers the rest, still delivers the text unchanged.
fn payload(origin: &str, event: Option<u64>, text: &str) -> String {
    match event {
        Some(event) => format!("{origin}@{event} {text}"),
        None => format!("{origin} {text}"),
    }
}

/// A bus payload's parts, if it is `"<origin>[@<event id>] <one line>"`.
pub(crate) fn parse_payload(payload: &[u8]) -> Option<Payload<'_>> {
    let text = std::str::from_utf8(payload).ok()?;
    let (origin, text) = text.split_once(' ')?;
    let (origin, event) = match origin.split_once('@') {
        None => (origin, None),
        Some((origin, digits)) => {
            let all_digits = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
            (origin, Some(digits.parse().ok().filter(|_| all_digits)?))
        }
    };
    (!origin.is_empty() && !text.is_empty() && !text.contains(['\r', '\n'])).then_some(Payload {
        origin,
        event,
        text,
    })
}

/// A `join` or `leave` on the bus: `<instance>!<join|leave> <json>`, the
/// JSON one line (`None`: not one).
pub(crate) fn parse_note(payload: &[u8]) -> Option<(&str, NoteKind, &str)> {
    let text = std::str::from_utf8(payload).ok()?;
    let (origin, json) = text.split_once(' ')?;
    let (instance, kind) = origin.split_once('!')?;
    let kind = NoteKind::parse(kind)?;
    (!instance.is_empty() && json.starts_with('{') && !json.contains(['\r', '\n']))
        .then_some((instance, kind, json))
}

/// [`READ_SCRIPT`]'s answer: `[clock, epoch]`, then for each history
/// `lost_upto, entries`. An entry whose text is not one line of at most
/// `max_bytes` (anyone who shares the Redis can write there) is left out;
/// `None` if the answer is not in this shape at all.
fn parse_read(reply: Vec<redis::Value>, max_bytes: usize) -> Option<(u64, u64, Vec<FleetHistory>)> {
    fn number(v: redis::Value) -> Option<u64> {
        redis::from_redis_value::<String>(v).ok()?.parse().ok()
    }
    fn entries(v: redis::Value, max_bytes: usize) -> Option<Vec<KeptMessage>> {
        let raw: Vec<(String, Vec<String>)> = redis::from_redis_value(v).ok()?;
        Some(
            raw.into_iter()
                .filter_map(|(id, fields)| {
                    let (ms, seq) = id.split_once('-')?;
                    let event: u64 = ms.parse().ok().filter(|_| seq == "0")?;
                    let text = match fields.as_slice() {
                        [m, text] if m == "m" => text,
                        _ => return None,
                    };
                    (!text.is_empty() && text.len() <= max_bytes && !text.contains(['\r', '\n']))
                        .then(|| (event, Arc::from(text.as_str())))
                })
                .collect(),
        )
    }
    let mut reply = reply.into_iter();
    let (clock, epoch) = (number(reply.next()?)?, number(reply.next()?)?);
    let mut kept = Vec::new();
    while let Some(lost) = reply.next() {
        kept.push(FleetHistory {
            lost_upto: number(lost)?,
            entries: entries(reply.next()?, max_bytes)?,
        });
    }
    Some((clock, epoch, kept))
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Where other machines reach `addr`, as `/cluster` lists it: the host
/// name in place of an unspecified address (0.0.0.0, the Docker image's).
pub(crate) fn advertised(addr: std::net::SocketAddr) -> String {
    if addr.ip().is_unspecified() {
        format!("{}:{}", hostname(), addr.port())
    } else {
        addr.to_string()
    }
}

/// The kernel's host name.
/// This node's name: `cluster.node_name`, or `<host>-<pid>`.
pub(crate) fn node_name(settings: &ClusterSettings) -> String {
    if settings.node_name.is_empty() {
        format!("{}-{}", hostname(), std::process::id())
    } else {
        settings.node_name.clone()
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// 16 hex digits, random per process (std's hasher keys are random).
fn instance_id() -> String {
    let seed = RandomState::new().hash_one((std::process::id(), now_ms()));
    format!("{seed:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let n = Names::new("sb", false);
        assert_eq!(n.id_channel("foo"), "sb:id:foo");
        assert_eq!(n.id_of("sb:id:foo"), Some("foo"));
        assert_eq!(n.id_of("sb:broadcast"), None);
        assert_eq!(n.id_of("other:id:foo"), None);
        assert_eq!(n.broadcast(), "sb:broadcast");
        // One Redis: the names every earlier version used.
        assert_eq!(n.history_key("a:b"), "sb:history:a:b");
        assert_eq!(n.clock_key(Some("a")), "sb:fleet");
        assert_eq!(n.presence_key("i1"), "sb:presence:i1");
        assert_eq!(n.idempotency_key(Some("a"), "k"), "sb:idem:k");
    }

    /// On a Redis Cluster everything of an id shares its slot, and the
    /// fleet's own names share another.
    #[test]
    fn a_redis_clusters_names_put_an_id_in_one_slot() {
        use crate::hub::sharded::slot_of;
        let n = Names::new("sb", true);
        for id in ["foo", "chat:room1", "a.b~c-d_e"] {
            let channel = n.id_channel(id);
            assert_eq!(n.id_of(&channel), Some(id));
            let slot = slot_of(id.as_bytes());
            assert_eq!(Names::slot_of_id(id), slot);
            for key in [
                channel,
                n.history_key(id),
                n.clock_key(Some(id)),
                n.idempotency_key(Some(id), "k1"),
                n.occupants_key(id),
            ] {
                assert_eq!(slot_of(key.as_bytes()), slot, "{key}");
            }
        }
        let fleet = slot_of(FLEET_TAG.as_bytes());
        for key in [
            n.broadcast().to_owned(),
            n.clock_key(None),
            n.presence_key("i1"),
            n.node_key("a"),
            n.nodes_key(),
            n.counter_key(),
            n.idempotency_key(None, "k1"),
        ] {
            assert_eq!(slot_of(key.as_bytes()), fleet, "{key}");
        }
        assert_eq!(n.id_of(n.broadcast()), None);
        // A node's presence for the ids of one shard: in that shard's tag.
        assert_eq!(n.shard_presence_key("!b3", "i1"), "sb:presence:{!b3}:i1");
        assert_eq!(
            slot_of(n.shard_presence_key("!b3", "i1").as_bytes()),
            slot_of(b"!b3")
        );
        // Each shard's broadcast channel (Topology::shard_tag).
        assert!(n.is_broadcast("sb:broadcast:{!b17}"));
        assert!(!n.is_broadcast("sb:id:{b17}"));
        assert!(!n.is_broadcast("other:broadcast:{!b17}"));
        assert_eq!(n.id_of("sb:broadcast:{!b17}"), None);
        let one = Names::new("sb", false);
        assert!(one.is_broadcast("sb:broadcast"));
        assert!(!one.is_broadcast("sb:broadcast:{!b17}"));
    }

    #[test]
    fn payloads() {
        let p = |origin, event, text| Some(Payload { origin, event, text });
        assert_eq!(
            parse_payload(b"abc@17 hello world"),
            p("abc", Some(17), "hello world")
        );
        assert_eq!(parse_payload(b"abc/3@4 hi"), p("abc/3", Some(4), "hi"));
        assert_eq!(parse_payload(b"abc hi"), p("abc", None, "hi"));
        for (event, text) in [(Some(5), "x y"), (None, "7 x"), (None, "- x")] {
            assert_eq!(
                parse_payload(payload("abc", event, text).as_bytes()),
                p("abc", event, text)
            );
        }
        // A message of a node from before event ids travelled is read as
        // it was meant, whatever its first word.
        assert_eq!(parse_payload(b"abc 42 apples"), p("abc", None, "42 apples"));
        assert_eq!(parse_payload(b"abc@ hi"), None);
        assert_eq!(parse_payload(b"abc@+1 hi"), None);
        assert_eq!(parse_payload(b"abc@1x hi"), None);
        assert_eq!(parse_payload(b"@1 hi"), None);
        assert_eq!(parse_payload(b"abc"), None);
        assert_eq!(parse_payload(b" hello"), None);
        assert_eq!(parse_payload(b"abc "), None);
        assert_eq!(parse_payload(b"abc a\nb"), None);
        assert_eq!(parse_payload(b"abc \xff"), None);
    }

    #[test]
    fn instance_ids_differ() {
        assert_ne!(instance_id(), instance_id());
        assert_eq!(instance_id().len(), 16);
    }
}
