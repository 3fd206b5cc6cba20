//! A real Redis Cluster for one test: six `redis-server --cluster-enabled
//! yes` (three masters, three replicas) made into a cluster by
//! `redis-cli --cluster create`, each stopped by its pid when the test
//! ends. Each node's bus port is its port + 10,000, so the ports are drawn
//! below 45,000 with the bus port free too, and a node that could not
//! bind either is started again on other ones.
//!
//! Not in `common/mod.rs` (the tools' tests include that): a test file
//! takes it with `#[path = "common/redis_cluster.rs"] mod redis_cluster;`
//! beside `mod common;`.
#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{RedisServer, Resp};

/// `cluster-node-timeout` of every node: a failed master's replica is
/// promoted within 1-2 s of it.
pub const NODE_TIMEOUT_MS: u64 = 1500;

/// Six nodes, three masters with a replica each.
pub struct RedisCluster {
    /// Every node, in the order they were given to `redis-cli --cluster
    /// create` (the first three were made masters).
    pub nodes: Vec<RedisServer>,
    dir: PathBuf,
    /// The arguments every node was started with beyond the usual ones.
    extra: Vec<String>,
}

impl RedisCluster {
    /// Starts six nodes and makes them a cluster; waits until every node
    /// says `cluster_state:ok` and knows every other.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// [`RedisCluster::start`] with `extra` arguments for every node (e.g.
    /// `--cluster-require-full-coverage no`).
    pub fn start_with(extra: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "sb-redis-cluster-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("a directory for the cluster's files");
        let nodes: Vec<RedisServer> = (0..6)
            .map(|_| RedisServer::start_cluster_node(&dir, extra))
            .collect();
        let addrs: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli (apt-get install -y redis-tools) runs");
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let extra = extra.iter().map(|a| (*a).to_owned()).collect();
        let cluster = RedisCluster { nodes, dir, extra };
        cluster.wait_ok(Duration::from_secs(20));
        cluster
    }

    /// The seed list for `cluster.redis_cluster_nodes`: every node.
    pub fn seeds(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The settings of a fleet node on this cluster, with `prefix` and
    /// `name`, its operator pages on its port, heartbeats every 200 ms.
    pub fn node_settings(&self, prefix: &str, name: &str) -> switchboard::Settings {
        let mut s = crate::common::settings();
        s.server.admin_public = true;
        s.cluster.redis_cluster_nodes = self.seeds();
        s.cluster.prefix = prefix.to_owned();
        s.cluster.node_name = name.to_owned();
        s.cluster.heartbeat_interval_ms = 200;
        s
    }

    /// Waits until every live node reports `cluster_state:ok` and every
    /// slot is served by a master it agrees on.
    pub fn wait_ok(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let ok = self.nodes.iter().filter(|n| n.pid().is_some()).all(|n| {
                let info = n.command(&["CLUSTER", "INFO"]).text().unwrap_or_default();
                info.lines().any(|l| l.trim_end() == "cluster_state:ok")
                    && info.lines().any(|l| l.trim_end() == "cluster_slots_ok:16384")
            });
            // Every replica has synced with its master: one that has not
            // cannot take over (its data is too old to be elected).
            let ok = ok
                && self.nodes.iter().filter(|n| n.pid().is_some()).all(|n| {
                    let info = n.command(&["INFO", "replication"]).text().unwrap_or_default();
                    info.lines().any(|l| l.trim_end() == "role:master")
                        || info.lines().any(|l| l.trim_end() == "master_link_status:up")
                });
            let agreed = ok && {
                let views: Vec<Vec<(u16, u16)>> = self
                    .nodes
                    .iter()
                    .filter(|n| n.pid().is_some())
                    .map(|n| self.masters_seen_by(n))
                    .collect();
                views.windows(2).all(|w| w[0] == w[1])
            };
            if agreed {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the Redis Cluster did not settle within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `(first slot, master's port)` of every slot range, as `n` sees it.
    fn masters_seen_by(&self, n: &RedisServer) -> Vec<(u16, u16)> {
        let mut seen = Vec::new();
        for range in n.command(&["CLUSTER", "SLOTS"]).items() {
            let items = range.items();
            let (Some(first), Some(master)) = (items.first().and_then(Resp::int), items.get(2)) else {
                continue;
            };
            if let Some(port) = master.items().get(1).and_then(Resp::int) {
                seen.push((first as u16, port as u16));
            }
        }
        seen.sort_unstable();
        seen
    }

    /// The slot of `key`, as Redis computes it.
    pub fn slot_of(&self, key: &str) -> u16 {
        self.any_live()
            .command(&["CLUSTER", "KEYSLOT", key])
            .int()
            .expect("CLUSTER KEYSLOT answers a number") as u16
    }

    /// The index in `nodes` of the master that serves `slot` now.
    pub fn master_of(&self, slot: u16) -> usize {
        let reply = self.any_live().command(&["CLUSTER", "SLOTS"]);
        for range in reply.items() {
            let items = range.items();
            let (Some(a), Some(b)) = (
                items.first().and_then(Resp::int),
                items.get(1).and_then(Resp::int),
            ) else {
                continue;
            };
            if (a..=b).contains(&i64::from(slot)) {
                let port = items[2]
                    .items()
                    .get(1)
                    .and_then(Resp::int)
                    .expect("a master's port") as u16;
                return self
                    .nodes
                    .iter()
                    .position(|n| n.port == port)
                    .expect("the master is one of ours");
            }
        }
        panic!("slot {slot} is served by no master");
    }

    /// The index in `nodes` of a replica of the master that serves
    /// `slot` now, as that master's `INFO replication` lists it (another
    /// node's `CLUSTER SLOTS` may not know it yet).
    pub fn replica_of(&self, slot: u16) -> usize {
        let master = &self.nodes[self.master_of(slot)];
        let info = master
            .command(&["INFO", "replication"])
            .text()
            .expect("INFO replication answers text");
        let port: u16 = info
            .lines()
            .find_map(|l| {
                l.strip_prefix("slave0:")?
                    .split(',')
                    .find_map(|kv| kv.strip_prefix("port="))?
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("slot {slot}'s master has no replica: {info}"));
        self.nodes
            .iter()
            .position(|n| n.port == port)
            .expect("the replica is one of ours")
    }

    /// `PUBSUB SHARDNUMSUB channel` on the master of the channel's slot:
    /// how many connections subscribe to it there.
    pub fn shard_numsub(&self, channel: &str) -> i64 {
        let master = &self.nodes[self.master_of(self.slot_of(channel))];
        let r = master.command(&["PUBSUB", "SHARDNUMSUB", channel]);
        r.items()
            .get(1)
            .and_then(Resp::int)
            .unwrap_or_else(|| panic!("PUBSUB SHARDNUMSUB {channel}: {r:?}"))
    }

    /// Polls [`RedisCluster::shard_numsub`] until it is `n` or `within`
    /// passes; returns the last count.
    pub fn wait_shard_numsub(&self, channel: &str, n: i64, within: Duration) -> i64 {
        let deadline = Instant::now() + within;
        loop {
            let got = self.shard_numsub(channel);
            if got == n || Instant::now() > deadline {
                return got;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts node `i` again on its port (after [`RedisServer::kill`]): it
    /// rejoins the cluster from the `nodes.conf` it kept.
    pub fn restart(&mut self, i: usize) {
        let port = self.nodes[i].port;
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        self.nodes[i] = RedisServer::try_start_cluster_node(&self.dir, port, &extra)
            .unwrap_or_else(|e| panic!("restarting the cluster node on {port}: {e}"));
    }

    /// `CLUSTER MYID` of node `i`.
    pub fn node_id(&self, i: usize) -> String {
        self.nodes[i]
            .command(&["CLUSTER", "MYID"])
            .text()
            .expect("CLUSTER MYID answers an id")
    }

    /// `redis-cli --cluster reshard`: moves `slots` slots from master
    /// `from` to master `to` (indexes in `nodes`), keys and all.
    pub fn reshard(&self, from: usize, to: usize, slots: u32) {
        let out = Command::new("redis-cli")
            .args([
                "--cluster",
                "reshard",
                &format!("127.0.0.1:{}", self.nodes[from].port),
            ])
            .args(["--cluster-from", &self.node_id(from)])
            .args(["--cluster-to", &self.node_id(to)])
            .args(["--cluster-slots", &slots.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli --cluster reshard runs");
        assert!(
            out.status.success(),
            "redis-cli --cluster reshard: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The indexes of the nodes that are masters now.
    pub fn masters(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| {
                self.nodes[i].pid().is_some()
                    && self.nodes[i]
                        .command(&["ROLE"])
                        .items()
                        .first()
                        .and_then(Resp::text)
                        .as_deref()
                        == Some("master")
            })
            .collect()
    }

    fn any_live(&self) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.pid().is_some())
            .expect("a live node")
    }
}

static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            n.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
