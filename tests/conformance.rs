//! One conformance suite, two engines (issue 36, item 5): the same test
//! functions run against one process (the in-memory engine: the Router
//! mints event ids and keeps the history) and against a fleet of two nodes
//! on a real `redis-server` (the Redis engine: the publish script mints
//! the ids and Redis keeps the history), publishing on one node and
//! streaming on the other. What they share is the contract a later engine
//! (Redis Cluster) must keep too: a message reaches the streams of its id
//! and no other, one order per id, a resume gets exactly what it missed,
//! past the history a resume is told of a gap, a broadcast reaches every
//! id, and `/presence` counts an id's streams.
//!
//! Where the engines differ by design, the test says so: a single
//! process gives a broadcast no event id and keeps none in its history.

#[path = "common/cluster.rs"]
mod cluster;
mod common;
#[path = "common/redis_cluster.rs"]
mod redis_cluster_setup;

use std::cell::RefCell;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use cluster::{WAIT, event_line, id_channel, node_settings, open_ids, post, prefix, send_ok, start_node};
use common::{RedisServer, StreamClient, TestServer, settings};
use redis_cluster_setup::RedisCluster;
use serde_json::Value;
use switchboard::Settings;

/// What a fleet runs on.
enum Backing {
    /// One process: nothing.
    None,
    /// One `redis-server`, and the fleet's prefix.
    Redis(RedisServer, String),
    /// A Redis Cluster, and the fleet's prefix.
    Cluster(RedisCluster, String),
}

/// A server, or a fleet, to run a case against.
struct Engine {
    /// Where messages are published.
    publish_on: SocketAddr,
    /// Where streams are opened: another node in a fleet.
    stream_on: SocketAddr,
    /// The fleet's Redis, or Redis Cluster, and its prefix.
    redis: Backing,
    /// Kept running until the case ends.
    _nodes: Vec<TestServer>,
    /// The nodes that opened a stream of an id, by id.
    held: RefCell<HashSet<(SocketAddr, String)>>,
}

impl Engine {
    /// One process, its settings edited by `edit`.
    fn memory(_test: &str, edit: fn(&mut Settings)) -> Engine {
        let mut s = settings();
        edit(&mut s);
        let srv = TestServer::start(s);
        Engine {
            publish_on: srv.addr,
            stream_on: srv.addr,
            redis: Backing::None,
            _nodes: vec![srv],
            held: RefCell::default(),
        }
    }

    /// Two nodes on one `redis-server`, their settings edited by `edit`.
    fn redis(test: &str, edit: fn(&mut Settings)) -> Engine {
        let redis = RedisServer::start();
        let p = prefix(test);
        let nodes = Self::two_nodes(|name| node_settings(&redis, &p, name), edit);
        Self::fleet(nodes, Backing::Redis(redis, p))
    }

    /// Two nodes on a Redis Cluster of three masters and three replicas
    /// (`cluster.redis_cluster_nodes`), their settings edited by `edit`.
    fn redis_cluster(test: &str, edit: fn(&mut Settings)) -> Engine {
        let redis = RedisCluster::start();
        let p = prefix(test);
        let nodes = Self::two_nodes(|name| redis.node_settings(&p, name), edit);
        Self::fleet(nodes, Backing::Cluster(redis, p))
    }

    /// Nodes `a` and `b`, their settings `of(name)` edited by `edit`.
    fn two_nodes(of: impl Fn(&str) -> Settings, edit: fn(&mut Settings)) -> [TestServer; 2] {
        let node = |name: &str| {
            let mut s = of(name);
            s.cluster.heartbeat_interval_ms = 200;
            edit(&mut s);
            start_node(s)
        };
        [node("a"), node("b")]
    }

    /// Publishing on `a`, streaming on `b`.
    fn fleet([a, b]: [TestServer; 2], redis: Backing) -> Engine {
        Engine {
            publish_on: a.addr,
            stream_on: b.addr,
            redis,
            _nodes: vec![a, b],
            held: RefCell::default(),
        }
    }

    /// Opens a stream of `id` with event ids (resuming after `since`) on
    /// `addr`, reads its welcome line (answered), and waits until the
    /// engine routes `id`'s messages to it.
    fn open(&self, addr: SocketAddr, id: &str, since: Option<u64>) -> (StreamClient, String) {
        let mut s = open_ids(addr, id, since);
        assert_eq!(s.status, 200, "GET /test/{id} on {addr}");
        let welcome = s.line();
        assert!(
            welcome.contains(&format!("Switchboard welcomes you! Your Id: {id}")),
            "{welcome}"
        );
        // Each node subscribes once per id, whatever its streams (and
        // stays subscribed a while after its last one left).
        let want = || {
            let mut held = self.held.borrow_mut();
            held.insert((addr, id.to_owned()));
            held.iter().filter(|(_, i)| i == id).count() as i64
        };
        match &self.redis {
            Backing::None => {}
            Backing::Redis(redis, p) => {
                let want = want();
                assert_eq!(
                    redis.wait_numsub(&id_channel(p, id), want, WAIT),
                    want,
                    "subscribers of {id}"
                );
            }
            Backing::Cluster(redis, p) => {
                // A sharded channel, in the id's slot.
                let want = want();
                let channel = format!("{p}:id:{{{id}}}");
                assert_eq!(
                    redis.wait_shard_numsub(&channel, want, WAIT),
                    want,
                    "subscribers of {id}"
                );
            }
        }
        (s, welcome)
    }
}

/// The lines `s` has within `within`, its read timeout set short.
fn lines_for(s: &mut StreamClient, within: Duration) -> Vec<String> {
    cluster::lines_within(s, within)
}

fn messages_reach_their_id_and_no_other(e: &Engine) {
    let (mut a, _) = e.open(e.stream_on, "ca", None);
    let (mut b, _) = e.open(e.stream_on, "cb", None);
    let ea = send_ok(e.publish_on, "ca", "for a");
    let eb = send_ok(e.publish_on, "cb", "for b");
    assert_eq!(event_line(&a.line()), (ea, "Recvd msg #1: 'for a'"));
    assert_eq!(event_line(&b.line()), (eb, "Recvd msg #1: 'for b'"));
    // b's message is not a's next one: a's next is its own.
    let ea2 = send_ok(e.publish_on, "ca", "a again");
    assert_eq!(event_line(&a.line()), (ea2, "Recvd msg #2: 'a again'"));
    assert!(lines_for(&mut b, Duration::from_millis(300)).is_empty());
}

fn one_order_per_id_on_every_stream(e: &Engine) {
    let (mut s1, _) = e.open(e.stream_on, "order", None);
    let (mut s2, _) = e.open(e.stream_on, "order", None);
    let (mut s3, _) = e.open(e.publish_on, "order", None);
    // Published from both sides in turn, each after the last's answer.
    let sent: Vec<(u64, String)> = (0..40)
        .map(|i| {
            let on = if i % 2 == 0 { e.publish_on } else { e.stream_on };
            let body = format!("m{i}");
            (send_ok(on, "order", &body), body)
        })
        .collect();
    assert!(
        sent.windows(2).all(|w| w[0].0 < w[1].0),
        "ids not increasing: {sent:?}"
    );
    for (n, s) in [&mut s1, &mut s2, &mut s3].into_iter().enumerate() {
        for (i, (event, body)) in sent.iter().enumerate() {
            let line = s.line();
            assert_eq!(
                event_line(&line),
                (*event, format!("Recvd msg #{}: '{body}'", i + 1).as_str()),
                "stream {n}"
            );
        }
    }
}

fn a_resume_gets_exactly_what_it_missed_then_live(e: &Engine) {
    let (mut s, _) = e.open(e.stream_on, "res", None);
    let e1 = send_ok(e.publish_on, "res", "one");
    assert_eq!(event_line(&s.line()), (e1, "Recvd msg #1: 'one'"));
    drop(s);
    let e2 = send_ok(e.publish_on, "res", "two");
    let e3 = send_ok(e.stream_on, "res", "three");
    let (mut s, welcome) = e.open(e.stream_on, "res", Some(e1));
    assert_eq!(welcome, format!("{e1} Switchboard welcomes you! Your Id: res"));
    assert_eq!(event_line(&s.line()), (e2, "Recvd msg #1: 'two'"));
    assert_eq!(event_line(&s.line()), (e3, "Recvd msg #2: 'three'"));
    let e4 = send_ok(e.publish_on, "res", "four");
    assert_eq!(event_line(&s.line()), (e4, "Recvd msg #3: 'four'"));
    // Nothing twice.
    assert!(lines_for(&mut s, Duration::from_millis(300)).is_empty());
}

/// With `history.size = 3` (see [`small_history`]).
fn resuming_past_the_history_is_told_a_gap(e: &Engine) {
    let start = send_ok(e.publish_on, "gap", "m0");
    let ids: Vec<u64> = (1..=5)
        .map(|i| send_ok(e.publish_on, "gap", &format!("m{i}")))
        .collect();
    let (mut s, _) = e.open(e.stream_on, "gap", Some(start));
    assert_eq!(
        s.line(),
        format!(
            "{start} Gap: messages after event {start} may be missing; history resumes at event {}",
            ids[2]
        )
    );
    for (n, i) in (3..=5).enumerate() {
        assert_eq!(
            event_line(&s.line()),
            (ids[i - 1], format!("Recvd msg #{}: 'm{i}'", n + 1).as_str())
        );
    }
    // From inside what is kept: no gap, the rest.
    let (mut s, _) = e.open(e.stream_on, "gap", Some(ids[2]));
    assert_eq!(event_line(&s.line()), (ids[3], "Recvd msg #1: 'm4'"));
    assert_eq!(event_line(&s.line()), (ids[4], "Recvd msg #2: 'm5'"));
}

fn small_history(s: &mut Settings) {
    s.history.size = 3;
}

fn a_broadcast_reaches_every_id(e: &Engine) {
    let (mut x, _) = e.open(e.stream_on, "bx", None);
    let (mut y, _) = e.open(e.stream_on, "by", None);
    let (mut z, _) = e.open(e.publish_on, "bz", None);
    let r = post(e.publish_on, "/broadcast", "to all");
    assert_eq!(r.status, 200, "{}", r.text());
    let event = r.json()["event_id"].as_u64();
    for s in [&mut x, &mut y, &mut z] {
        let line = s.line();
        match event {
            Some(event) => assert_eq!(event_line(&line), (event, "Recvd msg #1: 'to all'")),
            // One process: a broadcast has no event id (and no history).
            None => assert!(line.ends_with("Recvd msg #1: 'to all'"), "{line}"),
        }
    }
    // A Redis Cluster's broadcast has none either: an id from one slot's
    // clock has no order against the other shards' ids.
    assert_eq!(
        event.is_some(),
        matches!(e.redis, Backing::Redis(..)),
        "a broadcast's event id: {}",
        r.text()
    );
}

fn presence_counts_an_ids_streams(e: &Engine) {
    let presence = |addr| -> Value { cluster::get(addr, "/presence/pr").json() };
    let wait_streams = |want: u64| {
        let deadline = Instant::now() + WAIT;
        loop {
            let (p, q) = (presence(e.publish_on), presence(e.stream_on));
            if p["streams"] == want && q["streams"] == want {
                return p;
            }
            assert!(
                Instant::now() < deadline,
                "presence: {p} and {q}, want {want} streams"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_streams(0);
    let (s1, _) = e.open(e.stream_on, "pr", None);
    let (s2, _) = e.open(e.stream_on, "pr", None);
    let (s3, _) = e.open(e.publish_on, "pr", None);
    let p = wait_streams(3);
    assert_eq!(p["id"], "pr");
    let by_node: u64 = p["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["streams"].as_u64().unwrap())
        .sum();
    assert_eq!(by_node, 3, "{p}");
    drop((s1, s2));
    wait_streams(1);
    drop(s3);
    wait_streams(0);
}

/// A `#[test]` per engine for each case: `memory::<case>`, `redis::<case>`
/// and `redis_cluster::<case>`.
macro_rules! conformance {
    ($($case:ident $(with $edit:expr)?;)*) => {
        mod memory {
            use super::*;
            $(
                #[test]
                fn $case() {
                    let edit: fn(&mut Settings) = conformance!(@edit $($edit)?);
                    super::$case(&super::Engine::memory(stringify!($case), edit));
                }
            )*
        }
        mod redis {
            use super::*;
            $(
                #[test]
                fn $case() {
                    let edit: fn(&mut Settings) = conformance!(@edit $($edit)?);
                    super::$case(&super::Engine::redis(stringify!($case), edit));
                }
            )*
        }
        mod redis_cluster {
            use super::*;
            $(
                #[test]
                fn $case() {
                    let edit: fn(&mut Settings) = conformance!(@edit $($edit)?);
                    super::$case(&super::Engine::redis_cluster(stringify!($case), edit));
                }
            )*
        }
    };
    (@edit) => { |_| {} };
    (@edit $edit:expr) => { $edit };
}

conformance! {
    messages_reach_their_id_and_no_other;
    one_order_per_id_on_every_stream;
    a_resume_gets_exactly_what_it_missed_then_live;
    resuming_past_the_history_is_told_a_gap with small_history;
    a_broadcast_reaches_every_id;
    presence_counts_an_ids_streams;
}
