//! What the fleet needs of a Redis Cluster (`cluster.redis_cluster_nodes`)
//! beyond one Redis: the slot of a key ([`slot_of`]), which master serves
//! a slot now ([`Topology`], read with `CLUSTER SHARDS`), and one command
//! connection type for both engines ([`Commands`]).
//!
//! Every key and channel of an id carries the id as its hash tag
//! (`<prefix>:history:{<id>}`, `<prefix>:id:{<id>}`, ...), so they share
//! one slot and one script can touch them all; the fleet's own keys (node
//! heartbeats, the `/dispatcher` count, a broadcast's idempotency key)
//! carry `{!fleet}`, which no id can be (`!` is not an id character). Each
//! shard's broadcast channel and each node's presence hash for a shard's
//! ids carry that shard's tag (`{!b<n>}`, [`Topology::shard_tag`]). See
//! [`super::cluster::Names`].

use std::sync::Arc;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;

/// Slots in a Redis Cluster.
pub(crate) const SLOTS: u16 = 16_384;

/// The hash tag of the fleet's own keys (not an id's: ids never hold `!`).
pub(crate) const FLEET_TAG: &str = "!fleet";

/// The start of each shard's tag ([`Topology::shard_tag`]).
pub(crate) const SHARD_TAG: &str = "!b";

/// The slot of `key`: CRC16 (XMODEM) of its hash tag (the part between the
/// first `{` and the next `}`, if not empty) or of the whole key, modulo
/// 16,384, as Redis Cluster computes it.
pub(crate) fn slot_of(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(hashed) % SLOTS
}

/// The command connection: one Redis's (reconnected by redis-rs's
/// `ConnectionManager`), or a Redis Cluster's (redis-rs's cluster
/// connection, which routes each command by its key's slot, follows MOVED
/// and ASK, and refreshes its slot map). Every command the fleet sends
/// touches one slot.
#[derive(Clone)]
pub(crate) enum Commands {
    One(ConnectionManager),
    Sharded(ClusterConnection),
}

impl ConnectionLike for Commands {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Commands::One(c) => c.req_packed_command(cmd),
            Commands::Sharded(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Commands::One(c) => c.req_packed_commands(pipeline, offset, count),
            Commands::Sharded(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Commands::One(c) => c.get_db(),
            Commands::Sharded(c) => c.get_db(),
        }
    }
}

impl Commands {
    /// `WAIT replicas ms` on the connection the publish of an id in `slot`
    /// ran on: one Redis's, or on a Redis Cluster the slot's master's
    /// (redis-rs keeps one connection per node, so it is the one its
    /// script went over). WAIT counts the writes of that connection.
    pub(crate) async fn wait_replicas(
        &mut self,
        slot: u16,
        replicas: u32,
        ms: u64,
    ) -> redis::RedisResult<u32> {
        let mut wait = redis::cmd("WAIT");
        wait.arg(replicas).arg(ms);
        match self {
            Commands::One(c) => wait.query_async(c).await,
            Commands::Sharded(c) => {
                use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
                let master = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
                let acked = c.route_command(wait, RoutingInfo::SingleNode(master)).await?;
                Ok(redis::from_redis_value(acked)?)
            }
        }
    }
}

/// One shard: its master now, and the slots it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Shard {
    /// `host:port` of its master (its TLS port with TLS).
    pub(crate) master: String,
    /// Inclusive ranges.
    pub(crate) slots: Vec<(u16, u16)>,
}

/// Which master serves each slot, as one `CLUSTER SHARDS` told.
#[derive(Debug, Clone)]
pub(crate) struct Topology {
    pub(crate) shards: Vec<Shard>,
    /// The index in `shards` of each slot's shard (`u8::MAX`: none).
    owner: Arc<[u8]>,
    /// Each shard's tag ([`Topology::shard_tag`]).
    shard_tags: Vec<String>,
}

/// Most tags tried to find one in each shard's slots: every slot is hit
/// long before (a shard of a single slot is found in ~16,384 tries on
/// average), and the search runs once per topology read.
const TAG_TRIES: u32 = 4_000_000;

impl Topology {
    /// Reads a `CLUSTER SHARDS` reply.
    pub(crate) fn parse(reply: redis::Value, tls: bool) -> Result<Topology, String> {
        let shards = match reply {
            redis::Value::Array(shards) => shards,
            other => return Err(format!("CLUSTER SHARDS answered {other:?}")),
        };
        let mut out = Vec::new();
        for shard in shards {
            let fields = pairs(shard)?;
            let mut slots = Vec::new();
            let mut master = None;
            for (name, value) in fields {
                match name.as_str() {
                    "slots" => {
                        let bounds: Vec<i64> = redis::from_redis_value(value)
                            .map_err(|e| format!("CLUSTER SHARDS slots: {e}"))?;
                        for pair in bounds.chunks(2) {
                            if let [a, b] = pair
                                && (0..i64::from(SLOTS)).contains(a)
                                && (*a..i64::from(SLOTS)).contains(b)
                            {
                                slots.push((*a as u16, *b as u16));
                            } else {
                                return Err(format!("CLUSTER SHARDS: a slot range {pair:?}"));
                            }
                        }
                    }
                    "nodes" => {
                        let redis::Value::Array(nodes) = value else {
                            return Err("CLUSTER SHARDS: nodes is not a list".to_owned());
                        };
                        for node in nodes {
                            let node = pairs(node)?;
                            let text = |key: &str| {
                                node.iter()
                                    .find(|(k, _)| k == key)
                                    .and_then(|(_, v)| redis::from_redis_value::<String>(v.clone()).ok())
                            };
                            if text("role").as_deref() != Some("master") {
                                continue;
                            }
                            if text("health").as_deref() != Some("online") {
                                continue;
                            }
                            let host = text("endpoint")
                                .filter(|e| !e.is_empty() && e != "?")
                                .or_else(|| text("ip"));
                            let port = if tls {
                                text("tls-port").or_else(|| text("port"))
                            } else {
                                text("port")
                            };
                            if let (Some(host), Some(port)) = (host, port) {
                                master = Some(if host.contains(':') {
                                    format!("[{host}]:{port}")
                                } else {
                                    format!("{host}:{port}")
                                });
                            }
                        }
                    }
                    _ => {}
                }
            }
            if slots.is_empty() {
                // A master without slots (a reshard emptied it): nothing
                // to route there.
                continue;
            }
            let Some(master) = master else {
                return Err(format!("a shard serving slots {slots:?} has no online master"));
            };
            out.push(Shard { master, slots });
        }
        // In slot order: the same slots read twice give the same indexes.
        for shard in &mut out {
            shard.slots.sort_unstable();
        }
        out.sort_by_key(|shard| shard.slots[0]);
        let mut owner = vec![u8::MAX; usize::from(SLOTS)];
        for (i, shard) in out.iter().enumerate() {
            let i = u8::try_from(i).map_err(|_| "more than 255 shards".to_owned())?;
            for &(a, b) in &shard.slots {
                for slot in a..=b {
                    owner[usize::from(slot)] = i;
                }
            }
        }
        if let Some(slot) = owner.iter().position(|&o| o == u8::MAX) {
            return Err(format!("slot {slot} is served by no master"));
        }
        let mut shard_tags = vec![String::new(); out.len()];
        let mut missing = out.len();
        for n in 0..TAG_TRIES {
            if missing == 0 {
                break;
            }
            let tag = format!("{SHARD_TAG}{n}");
            let k = usize::from(owner[usize::from(slot_of(tag.as_bytes()))]);
            if shard_tags[k].is_empty() {
                shard_tags[k] = tag;
                missing -= 1;
            }
        }
        if let Some(k) = shard_tags.iter().position(String::is_empty) {
            return Err(format!("no broadcast tag found in the slots of shard {k}"));
        }
        Ok(Topology {
            shards: out,
            owner: owner.into(),
            shard_tags,
        })
    }

    /// The hash tag of shard `k`: the first of `!b0`, `!b1`, ... whose slot
    /// the shard serves (not an id: `!` is not an id character). Two
    /// things of the shard carry it:
    /// - its broadcast channel: a broadcast is SPUBLISHed once per shard,
    ///   and each node hands the copy shard `k`'s link brings to the ids
    ///   of shard `k` only, in the order that shard ran their publishes,
    ///   the same on every node (`docs/cluster.md`, "Broadcasts");
    /// - each node's presence hash for the ids of shard `k`, so that
    ///   presence is spread over the shards as the ids are.
    pub(crate) fn shard_tag(&self, k: usize) -> Option<&str> {
        self.shard_tags.get(k).map(String::as_str)
    }

    /// Whether `other` puts every slot in the same shard as this one
    /// (their masters may differ: a failover).
    pub(crate) fn same_slots(&self, other: &Topology) -> bool {
        self.shards.len() == other.shards.len()
            && self
                .shards
                .iter()
                .zip(&other.shards)
                .all(|(a, b)| a.slots == b.slots)
    }

    /// The index in [`Topology::shards`] of the shard that serves `slot`.
    pub(crate) fn shard_of(&self, slot: u16) -> usize {
        usize::from(self.owner[usize::from(slot % SLOTS)])
    }

    /// The index of the shard that serves `key`.
    pub(crate) fn shard_of_key(&self, key: &[u8]) -> usize {
        self.shard_of(slot_of(key))
    }
}

/// A RESP2 map as CLUSTER SHARDS sends it: a flat list of names and values.
fn pairs(v: redis::Value) -> Result<Vec<(String, redis::Value)>, String> {
    let items = match v {
        redis::Value::Array(items) => items,
        redis::Value::Map(items) => {
            return items
                .into_iter()
                .map(|(k, v)| {
                    Ok((
                        redis::from_redis_value::<String>(k).map_err(|e| e.to_string())?,
                        v,
                    ))
                })
                .collect();
        }
        other => return Err(format!("CLUSTER SHARDS: {other:?} is not a map")),
    };
    let mut out = Vec::with_capacity(items.len() / 2);
    let mut it = items.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        out.push((
            redis::from_redis_value::<String>(k).map_err(|e| e.to_string())?,
            v,
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values Redis gives (`CLUSTER KEYSLOT`), from its documentation and a
    /// real cluster.
    #[test]
    fn slots_are_redis_clusters() {
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"bar"), 5061);
        assert_eq!(slot_of(b"{x}a"), 16287);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"{user1000}.followers"));
        // An empty tag is no tag: the whole key is hashed.
        assert_eq!(
            slot_of(b"foo{}{bar}"),
            crc16::State::<crc16::XMODEM>::calculate(b"foo{}{bar}") % SLOTS
        );
        assert_eq!(slot_of(b"foo{{bar}}zap"), slot_of(b"{bar"));
    }

    fn bulk(s: &str) -> redis::Value {
        redis::Value::BulkString(s.as_bytes().to_vec())
    }

    fn node(port: i64, role: &str, health: &str) -> redis::Value {
        redis::Value::Array(vec![
            bulk("id"),
            bulk("abc"),
            bulk("port"),
            redis::Value::Int(port),
            bulk("ip"),
            bulk("127.0.0.1"),
            bulk("endpoint"),
            bulk("127.0.0.1"),
            bulk("role"),
            bulk(role),
            bulk("health"),
            bulk(health),
        ])
    }

    fn shard(slots: &[i64], nodes: Vec<redis::Value>) -> redis::Value {
        redis::Value::Array(vec![
            bulk("slots"),
            redis::Value::Array(slots.iter().map(|&s| redis::Value::Int(s)).collect()),
            bulk("nodes"),
            redis::Value::Array(nodes),
        ])
    }

    #[test]
    fn shards_are_read_and_every_slot_has_its_master() {
        let reply = redis::Value::Array(vec![
            shard(
                &[0, 5460, 10923, 10999],
                vec![node(7001, "master", "online"), node(7004, "replica", "online")],
            ),
            shard(
                &[5461, 10922],
                vec![node(7005, "replica", "online"), node(7002, "master", "online")],
            ),
            shard(&[11000, 16383], vec![node(7003, "master", "online")]),
            // A master a reshard emptied.
            shard(&[], vec![node(7006, "master", "online")]),
        ]);
        let t = Topology::parse(reply, false).unwrap();
        assert_eq!(t.shards.len(), 3);
        assert_eq!(t.shards[t.shard_of(0)].master, "127.0.0.1:7001");
        assert_eq!(t.shards[t.shard_of(10950)].master, "127.0.0.1:7001");
        assert_eq!(t.shards[t.shard_of(5461)].master, "127.0.0.1:7002");
        assert_eq!(t.shards[t.shard_of(16383)].master, "127.0.0.1:7003");
    }

    /// Each shard has a broadcast tag in its own slots, even a shard of a
    /// single slot, and the same slots give the same tags.
    #[test]
    fn each_shard_has_a_tag_in_its_slots() {
        let reply = || {
            redis::Value::Array(vec![
                shard(&[0, 9000], vec![node(7001, "master", "online")]),
                shard(&[9001, 9001], vec![node(7002, "master", "online")]),
                shard(&[9002, 16383], vec![node(7003, "master", "online")]),
            ])
        };
        let t = Topology::parse(reply(), false).unwrap();
        let tags: Vec<String> = (0..3).map(|k| t.shard_tag(k).unwrap().to_owned()).collect();
        for (k, tag) in tags.iter().enumerate() {
            assert!(tag.starts_with(SHARD_TAG), "{tag}");
            assert_eq!(t.shard_of(slot_of(tag.as_bytes())), k, "{tag}");
            assert_eq!(
                t.shard_of(slot_of(format!("sb:broadcast:{{{tag}}}").as_bytes())),
                k
            );
        }
        assert_eq!(slot_of(tags[1].as_bytes()), 9001);
        let again = Topology::parse(reply(), false).unwrap();
        assert!((0..3).all(|k| again.shard_tag(k) == Some(tags[k].as_str())));
        assert_eq!(t.shard_tag(3), None);
    }

    #[test]
    fn a_slot_without_a_master_is_an_error() {
        let reply = redis::Value::Array(vec![
            shard(&[0, 8000], vec![node(7001, "master", "online")]),
            shard(&[8001, 16383], vec![node(7002, "master", "fail")]),
        ]);
        let e = Topology::parse(reply, false).unwrap_err();
        assert!(e.contains("no online master"), "{e}");
        let reply = redis::Value::Array(vec![shard(&[0, 8000], vec![node(7001, "master", "online")])]);
        let e = Topology::parse(reply, false).unwrap_err();
        assert!(e.contains("slot 8001"), "{e}");
    }
}
