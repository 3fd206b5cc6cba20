//! A fleet on a real Redis Cluster (`cluster.redis_cluster_nodes`): six
//! `redis-server --cluster-enabled yes`, three masters and three replicas,
//! made by `redis-cli --cluster create` inside each test
//! (tests/common/redis_cluster.rs). The faults issue 38 names: a shard
//! master SIGKILLed under load, `redis-cli --cluster reshard` of 1,000 slots
//! under load, the whole cluster down, and a node restarted.
//!
//! Under load means a publisher on node `a` sending to ids of every shard
//! in turn while their streams (with event ids) are open on node `b`: what
//! is answered 200 must reach `b`'s streams, each message once and in the
//! order of its id's event ids.

#[path = "common/cluster.rs"]
mod cluster;
mod common;
#[path = "common/redis_cluster.rs"]
mod redis_cluster;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cluster::{WAIT, event_line, lines_within, open_ids, post, prefix, start_node, wait_until};
use common::{StreamClient, TestServer, request};
use redis_cluster::RedisCluster;
use switchboard::Settings;

/// A node of a fleet on `redis`.
fn node_settings(redis: &RedisCluster, prefix: &str, name: &str) -> Settings {
    redis.node_settings(prefix, name)
}

/// `per_shard` ids served by each master, as `(id, master index)`.
fn ids_on_every_shard(redis: &RedisCluster, per_shard: usize) -> Vec<(String, usize)> {
    let mut by_master: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for i in 0.. {
        let id = format!("k{i}");
        let master = redis.master_of(redis.slot_of(&id));
        let ids = by_master.entry(master).or_default();
        if ids.len() < per_shard {
            ids.push(id);
        }
        if by_master.len() == 3 && by_master.values().all(|v| v.len() == per_shard) {
            break;
        }
        assert!(i < 10_000, "no ids for every shard: {by_master:?}");
    }
    by_master
        .into_iter()
        .flat_map(|(m, ids)| ids.into_iter().map(move |id| (id, m)))
        .collect()
}

/// Opens a stream with event ids of each of `ids` on `addr`, and waits
/// until each id's channel has one node on its shard.
fn open_all(
    redis: &RedisCluster,
    p: &str,
    addr: SocketAddr,
    ids: &[(String, usize)],
) -> HashMap<String, StreamClient> {
    open_on(redis, p, addr, ids, 1)
}

/// [`open_all`], waiting for `subscribers` nodes on each id's channel.
fn open_on(
    redis: &RedisCluster,
    p: &str,
    addr: SocketAddr,
    ids: &[(String, usize)],
    subscribers: i64,
) -> HashMap<String, StreamClient> {
    let mut streams = HashMap::new();
    for (id, _) in ids {
        let mut s = open_ids(addr, id, None);
        assert_eq!(s.status, 200, "GET /test/{id}");
        let welcome = s.line();
        assert!(welcome.contains("Switchboard welcomes you!"), "{welcome}");
        streams.insert(id.clone(), s);
    }
    for (id, _) in ids {
        let channel = format!("{p}:id:{{{id}}}");
        assert_eq!(
            redis.wait_shard_numsub(&channel, subscribers, WAIT),
            subscribers,
            "{channel} subscribed"
        );
    }
    streams
}

/// One publish the publisher made.
#[derive(Debug, Clone)]
struct Sent {
    id: String,
    body: String,
    status: u16,
    at: Instant,
}

/// Publishes to each of `ids` in turn, one round every 25 ms, on `addr`,
/// until `stop`; answers every publish made.
fn publish_until(
    addr: SocketAddr,
    ids: Vec<String>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<Sent>> {
    std::thread::spawn(move || {
        let mut sent = Vec::new();
        let mut round = 0u64;
        let deadline = Instant::now() + Duration::from_secs(60);
        while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
            round += 1;
            for id in &ids {
                let body = format!("{id}-{round}");
                let status = request(addr, "POST", &format!("/send/{id}"), &[], body.as_bytes())
                    .map(|r| r.status)
                    .unwrap_or(0);
                sent.push(Sent {
                    id: id.clone(),
                    body,
                    status,
                    at: Instant::now(),
                });
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        sent
    })
}

/// The message bodies a stream got, in order, and whether it was told a
/// gap.
fn bodies(lines: &[String]) -> (Vec<String>, bool) {
    let mut got = Vec::new();
    let mut gap = false;
    for line in lines {
        let (_, rest) = event_line(line);
        if rest.starts_with("Gap:") {
            gap = true;
        } else if let Some(body) = rest
            .split_once(": '")
            .and_then(|(_, b)| b.strip_suffix('\''))
            .filter(|_| rest.starts_with("Recvd msg #"))
        {
            got.push(body.to_owned());
        }
    }
    (got, gap)
}

/// Every publish answered 200 reached its id's stream, once each, in the
/// order they were sent (messages answered 503 may have reached it too:
/// "unknown", or this node's streams alone).
fn assert_every_200_delivered_once_in_order(sent: &[Sent], streams: &mut HashMap<String, StreamClient>) {
    // Every stream read at once, for 2 s.
    let read: Vec<(String, Vec<String>)> = std::thread::scope(|scope| {
        let readers: Vec<_> = streams
            .iter_mut()
            .map(|(id, s)| scope.spawn(move || (id.clone(), lines_within(s, Duration::from_secs(2)))))
            .collect();
        readers.into_iter().map(|r| r.join().unwrap()).collect()
    });
    for (id, lines) in &read {
        let (got, _) = bodies(lines);
        let mut seen = std::collections::HashSet::new();
        for b in &got {
            assert!(seen.insert(b.clone()), "{id}: {b} delivered twice: {lines:#?}");
        }
        // `<id>-<round>`; "first" (sent before the rounds) is round 0.
        let round = |b: &str| {
            b.rsplit_once('-')
                .and_then(|(_, r)| r.parse::<u64>().ok())
                .unwrap_or(0)
        };
        assert!(
            got.windows(2).all(|w| round(&w[0]) < round(&w[1])),
            "{id}: out of order: {got:?}"
        );
        let answered: Vec<&Sent> = sent.iter().filter(|x| x.id == *id && x.status == 200).collect();
        let lost: Vec<&str> = answered
            .iter()
            .filter(|x| !seen.contains(&x.body))
            .map(|x| x.body.as_str())
            .collect();
        assert!(!answered.is_empty(), "{id}: nothing answered 200");
        assert!(
            lost.is_empty(),
            "{id}: answered 200 and never delivered: {lost:?}"
        );
    }
}

/// A shard master SIGKILLed under load (issue 38, "Faults"): only that
/// shard's ids answer 503 while its replica is promoted; the other shards'
/// ids keep flowing with no pause (Redis's `cluster-require-full-coverage
/// no`: by default Redis refuses every command while a slot has no
/// master); nothing answered 200 is lost; delivery to the other node is
/// back within 5 s of the promotion.
#[test]
fn a_shard_master_killed_under_load_stops_only_its_own_ids() {
    let mut redis = RedisCluster::start_with(&["--cluster-require-full-coverage", "no"]);
    let p = prefix("rc_kill");
    let a = start_node(node_settings(&redis, &p, "a"));
    let b = start_node(node_settings(&redis, &p, "b"));
    let ids = ids_on_every_shard(&redis, 2);
    let mut streams = open_all(&redis, &p, b.addr, &ids);
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = publish_until(
        a.addr,
        ids.iter().map(|(id, _)| id.clone()).collect(),
        Arc::clone(&stop),
    );
    std::thread::sleep(Duration::from_millis(1500));
    let victim = ids[0].1;
    let slot = redis.slot_of(&ids[0].0);
    redis.nodes[victim].kill();
    let killed = Instant::now();
    // The replica's promotion, as the cluster tells it.
    let mut promoted = None;
    while promoted.is_none() {
        assert!(
            killed.elapsed() < Duration::from_secs(15),
            "no replica was promoted"
        );
        std::thread::sleep(Duration::from_millis(50));
        let master = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| redis.master_of(slot)));
        if master.is_ok_and(|m| m != victim) {
            promoted = Some(Instant::now());
        }
    }
    let promoted = promoted.unwrap();
    std::thread::sleep(Duration::from_secs(6));
    stop.store(true, Ordering::Relaxed);
    let sent = publisher.join().unwrap();
    let on_victim: Vec<&str> = ids
        .iter()
        .filter(|(_, m)| *m == victim)
        .map(|(id, _)| id.as_str())
        .collect();
    // The other shards: every publish answered 200, before, during, after.
    let refused: Vec<&Sent> = sent
        .iter()
        .filter(|x| !on_victim.contains(&x.id.as_str()) && x.status != 200)
        .collect();
    assert!(refused.is_empty(), "other shards' ids refused: {refused:?}");
    // The victim's: refused for a while, then 200 again soon after the
    // promotion.
    let back = sent
        .iter()
        .filter(|x| on_victim.contains(&x.id.as_str()) && x.at > killed)
        .skip_while(|x| x.status == 200)
        .find(|x| x.status == 200)
        .map(|x| x.at);
    let back = back.expect("the killed shard's ids were never answered 200 again");
    let refusals = sent
        .iter()
        .filter(|x| on_victim.contains(&x.id.as_str()) && x.status != 200)
        .count();
    assert!(refusals > 0, "nothing was refused while the shard had no master");
    eprintln!(
        "promotion {:.2} s after the kill; the shard's ids answered 200 again {:.2} s after the promotion \
         ({refusals} refused); {} publishes",
        promoted.duration_since(killed).as_secs_f64(),
        back.saturating_duration_since(promoted).as_secs_f64(),
        sent.len()
    );
    assert!(
        back.saturating_duration_since(promoted) < Duration::from_secs(5),
        "back {:?} after the promotion",
        back.saturating_duration_since(promoted)
    );
    assert_every_200_delivered_once_in_order(&sent, &mut streams);
    // The victim's streams were told a gap (a new master begins a new
    // epoch: it may lack the last entries), never a silent hole.
    drop((a, b));
}

/// `redis-cli --cluster reshard` of 1,000 slots under load: nothing
/// answered 200 is lost, and a resume across it is exact or tells a gap.
#[test]
fn a_reshard_of_a_thousand_slots_under_load_loses_nothing() {
    let redis = RedisCluster::start();
    let p = prefix("rc_reshard");
    let a = start_node(node_settings(&redis, &p, "a"));
    let b = start_node(node_settings(&redis, &p, "b"));
    let ids = ids_on_every_shard(&redis, 6);
    let before: HashMap<String, usize> = ids.iter().cloned().collect();
    let mut streams = open_all(&redis, &p, b.addr, &ids);
    let first: HashMap<String, u64> = ids
        .iter()
        .map(|(id, _)| (id.clone(), cluster::send_ok(a.addr, id, "first")))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = publish_until(
        a.addr,
        ids.iter().map(|(id, _)| id.clone()).collect(),
        Arc::clone(&stop),
    );
    std::thread::sleep(Duration::from_millis(500));
    let masters = redis.masters();
    let (from, to) = (masters[0], masters[1]);
    let began = Instant::now();
    redis.reshard(from, to, 1000);
    let took = began.elapsed();
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    let sent = publisher.join().unwrap();
    let moved: Vec<&String> = ids
        .iter()
        .map(|(id, _)| id)
        .filter(|id| redis.master_of(redis.slot_of(id)) != before[*id])
        .collect();
    assert!(!moved.is_empty(), "no id's slot moved: pick more ids");
    let ok = sent.iter().filter(|x| x.status == 200).count();
    eprintln!(
        "reshard of 1,000 slots took {:.1} s; {} of {} ids moved; {ok} of {} publishes answered 200",
        took.as_secs_f64(),
        moved.len(),
        ids.len(),
        sent.len()
    );
    // Publishing went on after the reshard, to every id.
    for (id, _) in &ids {
        let last = sent.iter().rev().find(|x| &x.id == id).unwrap();
        assert_eq!(last.status, 200, "{id}'s last publish: {last:?}");
    }
    assert_every_200_delivered_once_in_order(&sent, &mut streams);
    // A resume from before the reshard, on the other node: every message
    // answered 200 since, or a gap told.
    for id in moved {
        let mut s = open_ids(a.addr, id, Some(first[id]));
        assert_eq!(s.status, 200);
        let lines = lines_within(&mut s, Duration::from_secs(1));
        let (got, gap) = bodies(&lines[1..]);
        let answered: Vec<&str> = sent
            .iter()
            .filter(|x| &x.id == id && x.status == 200)
            .map(|x| x.body.as_str())
            .collect();
        if !gap {
            let missing: Vec<&&str> = answered.iter().filter(|b| !got.iter().any(|g| g == *b)).collect();
            assert!(
                missing.is_empty(),
                "{id}: resumed without a gap and missing {missing:?}"
            );
        }
    }
    // Presence follows the ids to their new shards: node a sees b's
    // stream of every id (b wrote its presence again once the slots moved),
    // from b's hash on each id's shard, and every master keeps one.
    wait_until(Duration::from_secs(10), "b's streams in a's /presence", || {
        ids.iter()
            .all(|(id, _)| cluster::get(a.addr, &format!("/presence/{id}")).json()["streams"] == 1)
    });
    assert_presence_on_every_master(&redis, &p);
}

/// Every master holds a presence hash of its ids (one per node per shard,
/// `<prefix>:presence:{<shard tag>}:<instance>`), none in the fleet's slot.
fn assert_presence_on_every_master(redis: &RedisCluster, p: &str) {
    for m in redis.masters() {
        let keys = redis.nodes[m].command(&["KEYS", &format!("{p}:presence:*")]);
        let keys: Vec<String> = keys.items().iter().filter_map(common::Resp::text).collect();
        assert!(!keys.is_empty(), "no presence hash on master {m}");
        for key in &keys {
            assert!(key.starts_with(&format!("{p}:presence:{{!b")), "{key}");
        }
    }
}

/// The whole cluster down: publishes answer 503 and `/readyz` 503; once it
/// is back (every node restarted from its `nodes.conf`), the fleet is ready
/// again and messages flow from one node to the other.
#[test]
fn the_whole_cluster_down_answers_503_then_recovers() {
    let mut redis = RedisCluster::start();
    let p = prefix("rc_down");
    let a = start_node(node_settings(&redis, &p, "a"));
    let b = start_node(node_settings(&redis, &p, "b"));
    let ids = ids_on_every_shard(&redis, 1);
    let mut streams = open_all(&redis, &p, b.addr, &ids);
    for i in 0..redis.nodes.len() {
        redis.nodes[i].kill();
    }
    wait_until(Duration::from_secs(10), "/readyz 503 on both nodes", || {
        [a.addr, b.addr]
            .iter()
            .all(|addr| request(*addr, "GET", "/readyz", &[], b"").is_ok_and(|r| r.status == 503))
    });
    for (id, _) in &ids {
        let r = post(a.addr, &format!("/send/{id}"), "while down");
        assert_eq!(r.status, 503, "{id}: {}", r.text());
    }
    for i in 0..redis.nodes.len() {
        redis.restart(i);
    }
    redis.wait_ok(Duration::from_secs(30));
    wait_until(Duration::from_secs(20), "/readyz 200 on both nodes", || {
        [a.addr, b.addr]
            .iter()
            .all(|addr| request(*addr, "GET", "/readyz", &[], b"").is_ok_and(|r| r.status == 200))
    });
    // Cross-node delivery to every shard's id, on the streams that stayed.
    let deadline = Instant::now() + Duration::from_secs(10);
    for (id, _) in &ids {
        loop {
            let r = post(a.addr, &format!("/send/{id}"), &format!("back {id}"));
            if r.status == 200 {
                break;
            }
            assert!(Instant::now() < deadline, "{id}: {}", r.text());
            std::thread::sleep(Duration::from_millis(100));
        }
        let s = streams.get_mut(id).unwrap();
        let lines = lines_within(s, Duration::from_secs(2));
        assert!(
            lines.iter().any(|l| l.ends_with(&format!("'back {id}'"))),
            "{id}: {lines:?}"
        );
    }
}

/// A node restarted mid-run subscribes again on every shard: streams of
/// ids on each shard opened on the new process get what another node
/// publishes.
#[test]
fn a_node_restarted_subscribes_on_every_shard() {
    let redis = RedisCluster::start();
    let p = prefix("rc_restart");
    let a = start_node(node_settings(&redis, &p, "a"));
    let b = start_node(node_settings(&redis, &p, "b"));
    let ids = ids_on_every_shard(&redis, 2);
    let streams = open_all(&redis, &p, b.addr, &ids);
    drop(streams);
    drop(b);
    let b: TestServer = start_node(node_settings(&redis, &p, "b"));
    let mut streams = open_all(&redis, &p, b.addr, &ids);
    wait_until(Duration::from_secs(10), "b's streams in a's /presence", || {
        ids.iter()
            .all(|(id, _)| cluster::get(a.addr, &format!("/presence/{id}")).json()["streams"] == 1)
    });
    assert_presence_on_every_master(&redis, &p);
    for (id, _) in &ids {
        let event = cluster::send_ok(a.addr, id, &format!("to {id}"));
        let line = streams.get_mut(id).unwrap().line();
        assert_eq!(
            event_line(&line),
            (event, format!("Recvd msg #1: 'to {id}'").as_str())
        );
    }
}

/// The message bodies of a stream's lines, with or without event ids.
fn any_bodies(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .filter_map(|line| {
            let (_, rest) = line.split_once("Recvd msg #")?;
            let (_, body) = rest.split_once(": '")?;
            body.strip_suffix('\'').map(str::to_owned)
        })
        .collect()
}

/// A broadcast comes in one order with each id's messages on every node
/// (issue 38, "Broadcasts"): each shard sends its own copy, in its order
/// among its ids' messages, and each node hands shard k's copy to shard
/// k's ids. Broadcasts from both nodes race messages to ids of every shard
/// from several publishers; every id's streams on both nodes then get the
/// same sequence, and every broadcast answered 200 reached every stream.
/// (Before, every broadcast came over the link of the fleet's slot, and
/// the two nodes' links interleaved it differently with an id's messages
/// that came over its own shard's.)
#[test]
fn a_broadcast_comes_in_one_order_with_each_ids_messages_on_every_node() {
    let redis = RedisCluster::start();
    let p = prefix("rc_order");
    let a = start_node(node_settings(&redis, &p, "a"));
    let b = start_node(node_settings(&redis, &p, "b"));
    let ids = ids_on_every_shard(&redis, 4);
    let mut on_a = open_all(&redis, &p, a.addr, &ids);
    let mut on_b = open_on(&redis, &p, b.addr, &ids, 2);
    const ROUNDS: usize = 100;
    // Four publishers, each with its own ids (so each id's messages go in
    // one order), half on each node; a broadcaster on each node.
    let mut threads = Vec::new();
    for (t, chunk) in ids.chunks(ids.len().div_ceil(4)).enumerate() {
        let ids: Vec<String> = chunk.iter().map(|(id, _)| id.clone()).collect();
        let addr = if t % 2 == 0 { a.addr } else { b.addr };
        threads.push(std::thread::spawn(move || {
            for round in 0..ROUNDS {
                for id in &ids {
                    let r = post(addr, &format!("/send/{id}"), &format!("{id}-{round}"));
                    assert_eq!(r.status, 200, "{}", r.text());
                }
            }
        }));
    }
    for (name, addr) in [("a", a.addr), ("b", b.addr)] {
        threads.push(std::thread::spawn(move || {
            for round in 0..ROUNDS {
                let r = post(addr, "/broadcast", &format!("all-{name}{round}"));
                assert_eq!(r.status, 200, "{}", r.text());
                assert_eq!(r.json()["nodes"], 1, "{}", r.text());
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    let read = |streams: &mut HashMap<String, StreamClient>| -> HashMap<String, Vec<String>> {
        std::thread::scope(|scope| {
            let readers: Vec<_> = streams
                .iter_mut()
                .map(|(id, s)| {
                    scope.spawn(move || (id.clone(), any_bodies(&lines_within(s, Duration::from_secs(3)))))
                })
                .collect();
            readers.into_iter().map(|r| r.join().unwrap()).collect()
        })
    };
    let (got_a, got_b) = (read(&mut on_a), read(&mut on_b));
    let mut differ = Vec::new();
    for (id, _) in &ids {
        let (x, y) = (&got_a[id], &got_b[id]);
        assert_eq!(x.len(), 3 * ROUNDS, "{id} on a: {x:?}");
        assert_eq!(
            x.iter().filter(|m| m.starts_with("all-")).count(),
            2 * ROUNDS,
            "{id}: every broadcast on a"
        );
        if x != y {
            let at = x.iter().zip(y).position(|(m, n)| m != n).unwrap_or(0);
            differ.push(format!(
                "{id} from #{at}: a {:?}, b {:?}",
                &x[at..(at + 4).min(x.len())],
                &y[at..(at + 4).min(y.len())]
            ));
        }
    }
    assert!(
        differ.is_empty(),
        "a different order on the two nodes: {differ:#?}"
    );
}

/// A broadcast whose copy one shard's master does not take (paused with
/// SIGSTOP, before any link notices) is answered 503 saying how many
/// shards' ids got it, never 200; its `Idempotency-Key` is given back, so
/// the retry once the master is back is sent, to every shard. Meanwhile
/// the other shards' ids take publishes.
#[test]
fn a_broadcast_one_shard_did_not_take_is_a_503_that_says_so() {
    let redis = RedisCluster::start();
    let p = prefix("rc_partial");
    let mut s = node_settings(&redis, &p, "a");
    // The links notice a silent master only after 5 s; a command gives up
    // after 300 ms.
    s.cluster.heartbeat_ttl_ms = 5000;
    s.cluster.command_timeout_ms = 300;
    let a = start_node(s);
    let ids = ids_on_every_shard(&redis, 1);
    let mut streams = open_all(&redis, &p, a.addr, &ids);
    // A master that does not serve the fleet's slot (the key's claim).
    let fleet = redis.master_of(redis.slot_of("{!fleet}"));
    let &(ref paused_id, paused) = ids.iter().find(|(_, m)| *m != fleet).unwrap();
    let pid = redis.nodes[paused].pid().expect("redis pid");
    common::process::send_signal(pid, "STOP");
    // The other shards' ids flow on, from the first publish of the run:
    // each master had the scripts loaded when its link was made (redis-rs
    // answers a NOSCRIPT with SCRIPT LOAD on every master, the paused one
    // too, and each first publish timed out that way).
    for (id, master) in &ids {
        if *master != paused {
            let r = post(a.addr, &format!("/send/{id}"), "first");
            assert_eq!(r.status, 200, "{id}: {}", r.text());
            let line = streams.get_mut(id).unwrap().line();
            assert!(line.ends_with("'first'"), "{id}: {line}");
        }
    }
    let key = [("Idempotency-Key", "b-1")];
    let r = request(a.addr, "POST", "/broadcast", &key, b"once").unwrap();
    common::process::send_signal(pid, "CONT");
    assert_eq!(r.status, 503, "{}", r.text());
    let outcome = r.json()["outcome"].as_str().unwrap_or_default().to_owned();
    assert!(
        outcome.starts_with("partly delivered: the ids of 2 of the Redis Cluster's 3 shards got it"),
        "{outcome}"
    );
    // The other shards' ids had it at once.
    for (id, master) in &ids {
        if *master != paused {
            let line = streams.get_mut(id).unwrap().line();
            assert!(line.ends_with("'once'"), "{id}: {line}");
        }
    }
    // Back: the retry with the same key is sent to every shard (the
    // paused shard's late copy may come first: "may get it twice").
    let deadline = Instant::now() + Duration::from_secs(10);
    let r = loop {
        let r = request(a.addr, "POST", "/broadcast", &key, b"once").unwrap();
        if r.status == 200 || Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(r.status, 200, "{}", r.text());
    // Sent to every shard this time: the key now holds that answer, past
    // the claim's first few seconds.
    std::thread::sleep(Duration::from_secs(3));
    let again = request(a.addr, "POST", "/broadcast", &key, b"once").unwrap();
    assert_eq!(
        (again.status, again.header("idempotent-replayed")),
        (200, Some("true")),
        "{}",
        again.text()
    );
    assert_eq!(
        again.json()["delivered"],
        r.json()["delivered"],
        "{}",
        again.text()
    );
    let lines = lines_within(streams.get_mut(paused_id).unwrap(), Duration::from_secs(2));
    assert!(
        lines.iter().any(|l| l.ends_with("'once'")),
        "{paused_id}: {lines:?}"
    );
}

/// `cluster.redis_wait_replicas = 1` on a Redis Cluster: a publish
/// answers 200 once its id's master's replica has it (`WAIT` on that
/// master, over the connection its script ran on); with that replica
/// paused, 503 "unknown" (counted in `cluster.wait_short`), while an id of
/// another shard, whose replica runs, still answers 200.
#[test]
fn a_publish_on_a_redis_cluster_waits_for_its_masters_replica() {
    let redis = RedisCluster::start();
    let p = prefix("rc_wait");
    let mut s = node_settings(&redis, &p, "w");
    s.cluster.redis_wait_replicas = 1;
    // WAIT gets half of it (as in cluster_sentinel.rs).
    s.cluster.command_timeout_ms = 1000;
    let n = start_node(s);
    let ids = ids_on_every_shard(&redis, 1);
    // A replica that has not finished its first sync with its master
    // acknowledges nothing yet (seen once under a loaded CI box): each
    // shard's first publish may be retried until it has.
    for (id, _) in &ids {
        let deadline = Instant::now() + Duration::from_secs(15);
        let r = loop {
            let r = post(n.addr, &format!("/send/{id}"), "kept");
            if r.status == 200 || Instant::now() > deadline {
                break r;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        assert_eq!(r.status, 200, "{id}: {}", r.text());
    }
    let (paused_id, _) = &ids[0];
    let (other_id, _) = &ids[1];
    let replica = redis.replica_of(redis.slot_of(paused_id));
    let pid = redis.nodes[replica].pid().expect("redis pid");
    let short = n.stats()["cluster"]["wait_short"].as_u64().unwrap();
    common::process::send_signal(pid, "STOP");
    let r = post(n.addr, &format!("/send/{paused_id}"), "unreplicated");
    let other = post(n.addr, &format!("/send/{other_id}"), "replicated");
    common::process::send_signal(pid, "CONT");
    assert_eq!(r.status, 503, "{}", r.text());
    let outcome = r.json()["outcome"].as_str().unwrap_or_default().to_owned();
    assert!(
        outcome.starts_with("unknown") && outcome.contains("redis_wait_replicas"),
        "{outcome}"
    );
    assert_eq!(n.stats()["cluster"]["wait_short"], short + 1);
    assert_eq!(other.status, 200, "{}", other.text());
    // The replica back: 200 again.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = post(n.addr, &format!("/send/{paused_id}"), "again");
        if r.status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "{}", r.text());
        std::thread::sleep(Duration::from_millis(200));
    }
}
