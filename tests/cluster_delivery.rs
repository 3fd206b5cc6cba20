//! Cluster mode over a real `redis-server`: how a message gets from the node
//! that takes it to the streams of its id on every node. Sends and
//! broadcasts across nodes, exactly once (an id open on two nodes, a keyed
//! publish retried through a paused Redis), the subscriptions behind them
//! (batched SUBSCRIBE, a welcome that waits for it, the unsubscribe linger)
//! and the limits a message off the bus is held to.
//!
//! The setup (Redis, nodes, fleets, waits) is `tests/common/cluster.rs`.

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::json;

use cluster::{
    WAIT, binary, binary_node, cluster_names, cluster_pids, id_channel, lines_within, node_settings, open,
    post, prefix, start_node, wait_cluster, wait_ready,
};
use common::process::send_signal;
use common::{RedisServer, StreamClient, TestServer, request};

/// A send on one process reaches a stream held by another process: the
/// answer counts no local stream and one node reached, the stream gets it.
#[test]
fn send_on_one_process_reaches_a_stream_on_another() {
    let redis = RedisServer::start();
    let p = prefix("across");
    let (a, a_addr) = binary_node(binary(&redis, &p), "a");
    let (b, b_addr) = binary_node(binary(&redis, &p), "b");
    let mut far = open(b_addr, "far");
    assert_eq!(redis.wait_numsub(&id_channel(&p, "far"), 1, WAIT), 1);

    let r = post(a_addr, "/send/far", "across the bus");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json_sans_event(),
        json!({"id": "far", "delivered": 0, "nodes": 1})
    );
    assert_eq!(far.line(), "Recvd msg #1: 'across the bus'");

    let r = post(a_addr, "/send/nobody", "x");
    assert_eq!(
        r.json_sans_event(),
        json!({"id": "nobody", "delivered": 0, "nodes": 0})
    );

    // Both processes are in /cluster, by name and with their own pids.
    let c = wait_cluster(a_addr, WAIT, "a and b listed", |c| c["totals"]["nodes"] == 2);
    assert_eq!(c["mode"], "cluster");
    assert_eq!(c["node"], "a");
    assert_eq!(cluster_names(&c), ["a", "b"]);
    let pids: BTreeSet<u64> = [a.pid(), b.pid()].into_iter().map(u64::from).collect();
    assert_eq!(cluster_pids(&c), pids, "{c}");
    drop(far);
}

/// A broadcast on one node reaches the streams of all three nodes once each;
/// the answer counts the local stream and the two other nodes.
#[test]
fn broadcast_reaches_streams_on_three_nodes() {
    let redis = RedisServer::start();
    let p = prefix("broadcast");
    let nodes: Vec<TestServer> = ["a", "b", "c"]
        .into_iter()
        .map(|n| start_node(node_settings(&redis, &p, n)))
        .collect();
    let mut streams: Vec<StreamClient> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| open(n.addr, &format!("b{i}")))
        .collect();
    let channel = format!("{p}:broadcast");
    assert_eq!(redis.wait_numsub(&channel, 3, WAIT), 3);

    let r = post(nodes[0].addr, "/broadcast", "to everyone");
    assert_eq!(r.status, 200, "{}", r.text());
    let first = r.json();
    // The fleet keeps broadcasts too, so they have an event id.
    let event = first["event_id"].as_u64().expect("an event id");
    assert_eq!(first, json!({"delivered": 1, "nodes": 2, "event_id": event}));
    for s in &mut streams {
        assert_eq!(s.line(), "Recvd msg #1: 'to everyone'");
    }
    // Once each: a second broadcast, from another node, is the next line
    // everywhere (node a's own echo of the first came before it).
    let r = post(nodes[2].addr, "/broadcast", "again");
    let second = r.json();
    assert!(second["event_id"].as_u64().unwrap() > event, "{second}");
    assert_eq!(second["delivered"], 1);
    assert_eq!(second["nodes"], 2);
    for s in &mut streams {
        assert_eq!(s.line(), "Recvd msg #2: 'again'");
    }
}

/// One id open on two nodes: each stream gets every message exactly once,
/// whichever node takes the send; that node answers delivered 1, nodes 1.
#[test]
fn one_id_on_two_nodes_gets_each_message_exactly_once() {
    let redis = RedisServer::start();
    let p = prefix("twice");
    let a = start_node(node_settings(&redis, &p, "a"));
    let b = start_node(node_settings(&redis, &p, "b"));
    let mut on_a = open(a.addr, "both");
    let mut on_b = open(b.addr, "both");
    assert_eq!(redis.wait_numsub(&id_channel(&p, "both"), 2, WAIT), 2);

    let expect = json!({"id": "both", "delivered": 1, "nodes": 1});
    // Sends alternate between the nodes. Redis hands a node its own echo
    // before any later publish, so a stream that did not ignore the echo
    // of its node's send would see that message twice before the next one.
    for (n, (via, msg)) in [(&a, "one"), (&b, "two"), (&a, "three"), (&b, "four")]
        .into_iter()
        .enumerate()
    {
        let r = post(via.addr, "/send/both", msg);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json_sans_event(), expect, "sending {msg:?}");
        let line = format!("Recvd msg #{}: '{msg}'", n + 1);
        assert_eq!(on_a.line(), line, "the stream on a");
        assert_eq!(on_b.line(), line, "the stream on b");
    }
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(sa["cluster"]["received"], 2, "{sa}");
    assert_eq!(sb["cluster"]["received"], 2, "{sb}");
}

/// In cluster mode a stream's welcome waits for its id's SUBSCRIBE: a
/// message another node publishes right after the welcome arrives.
#[test]
fn a_welcomed_stream_gets_a_message_sent_at_once_from_another_node() {
    let redis = RedisServer::start();
    let p = prefix("welcome");
    let a = start_node(node_settings(&redis, &p, "a"));
    let b = start_node(node_settings(&redis, &p, "b"));
    for i in 0..50 {
        let id = format!("w{i}");
        let mut s = open(a.addr, &id);
        let r = b.post(&format!("/send/{id}"), "right away");
        assert_eq!(
            r.json_sans_event(),
            json!({"id": id, "delivered": 0, "nodes": 1}),
            "stream {i}"
        );
        assert_eq!(s.line(), "Recvd msg #1: 'right away'");
    }
}

/// Many streams opening at once are subscribed in a few batched SUBSCRIBE
/// commands, not one per id; each gets its welcome once its id is
/// subscribed, so every one of them is.
#[test]
fn a_burst_of_new_ids_is_a_few_subscribe_commands() {
    use std::io::{BufRead, BufReader, Write};
    let redis = RedisServer::start();
    let p = prefix("burst");
    let a = start_node(node_settings(&redis, &p, "a"));
    let before = a.stats()["cluster"]["subscribe_commands"].as_u64().unwrap();
    // All 1,000 requests go out before any answer is read.
    let mut conns: Vec<std::net::TcpStream> = (0..1000)
        .map(|i| {
            let mut c = std::net::TcpStream::connect(a.addr).unwrap();
            write!(c, "GET /test/b{i} HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
            c
        })
        .collect();
    for (i, c) in conns.iter_mut().enumerate() {
        c.set_read_timeout(Some(WAIT)).unwrap();
        let mut r = BufReader::new(c);
        let mut head = String::new();
        while head != "\r\n" {
            head.clear();
            r.read_line(&mut head).unwrap();
        }
        let (mut size, mut line) = (String::new(), String::new());
        r.read_line(&mut size).unwrap();
        r.read_line(&mut line).unwrap();
        assert_eq!(
            line.trim_end(),
            format!("Switchboard welcomes you! Your Id: b{i}")
        );
    }
    let st = a.stats();
    assert_eq!(st["cluster"]["subscriptions"], 1000, "{st}");
    let commands = st["cluster"]["subscribe_commands"].as_u64().unwrap() - before;
    assert!(
        commands <= 20,
        "{commands} SUBSCRIBE commands for 1,000 ids: {st}"
    );
    // Welcomed means subscribed: Redis has every one of them.
    for i in [0, 499, 999] {
        assert_eq!(redis.numsub(&id_channel(&p, &format!("b{i}"))), 1);
    }
    drop(conns);
}

/// When the last local stream of an id closes, its subscription stays for
/// `unsubscribe_linger_ms` and then goes: PUBSUB NUMSUB 1 → 0, not before.
#[test]
fn a_closed_streams_subscription_goes_after_the_linger() {
    let redis = RedisServer::start();
    let p = prefix("linger");
    let mut s = node_settings(&redis, &p, "a");
    s.cluster.unsubscribe_linger_ms = 300;
    let a = start_node(s);
    let channel = id_channel(&p, "brief");
    let stream = open(a.addr, "brief");
    assert_eq!(redis.wait_numsub(&channel, 1, WAIT), 1);
    assert_eq!(a.stats()["cluster"]["subscriptions"], 1);

    let closed = Instant::now();
    drop(stream);
    assert_eq!(redis.wait_numsub(&channel, 0, WAIT), 0);
    let gone = closed.elapsed();
    assert!(
        gone >= Duration::from_millis(300),
        "unsubscribed {gone:?} after the close"
    );
    // The server notices a close within a second; the linger adds 300 ms.
    assert!(
        gone < Duration::from_millis(2000),
        "unsubscribed only {gone:?} after the close"
    );
    let st = a.wait_stats(WAIT, |s| s["cluster"]["subscriptions"] == 0);
    assert_eq!(st["cluster"]["subscriptions"], 0, "{st}");
}

/// A stream of the same id reopened within the linger keeps the one
/// subscription: no UNSUBSCRIBE reaches Redis, NUMSUB stays 1 past the
/// linger, and a send from another node still reaches the new stream.
#[test]
fn reopening_within_the_linger_keeps_the_subscription() {
    let redis = RedisServer::start();
    let p = prefix("relinger");
    let mut s = node_settings(&redis, &p, "a");
    s.cluster.unsubscribe_linger_ms = 300;
    let a = start_node(s);
    let b = start_node(node_settings(&redis, &p, "b"));
    let channel = id_channel(&p, "back");
    let first = open(a.addr, "back");
    assert_eq!(redis.wait_numsub(&channel, 1, WAIT), 1);
    let monitor = redis.monitor();

    drop(first);
    // The node has seen the close (the linger has begun); reopen at once.
    a.wait_stats(WAIT, |s| s["connections"]["active"] == 0);
    let mut again = open(a.addr, "back");
    // Three lingers' worth: the subscription must hold throughout.
    let until = Instant::now() + Duration::from_millis(900);
    while Instant::now() < until {
        assert_eq!(redis.numsub(&channel), 1, "the subscription was dropped");
        std::thread::sleep(Duration::from_millis(10));
    }
    let seen = monitor.lines();
    assert!(
        seen.iter().any(|l| l.to_ascii_lowercase().contains("\"numsub\"")),
        "the monitor sees commands: {seen:?}"
    );
    let unsubscribes: Vec<String> = seen
        .into_iter()
        .filter(|l| l.to_ascii_lowercase().contains("\"unsubscribe\""))
        .collect();
    assert!(unsubscribes.is_empty(), "{unsubscribes:?}");
    assert_eq!(a.stats()["cluster"]["subscriptions"], 1);

    let r = post(b.addr, "/send/back", "still subscribed");
    assert_eq!(
        r.json_sans_event(),
        json!({"id": "back", "delivered": 0, "nodes": 1})
    );
    assert_eq!(again.line(), "Recvd msg #1: 'still subscribed'");
}

/// While a node lingers on an id it no longer holds, its own subscription
/// is not counted among the other nodes a send reached.
#[test]
fn nodes_counts_other_nodes_only_during_the_linger() {
    let redis = RedisServer::start();
    let p = prefix("lingercount");
    let mut s = node_settings(&redis, &p, "a");
    s.cluster.unsubscribe_linger_ms = 3000;
    let a = start_node(s);
    let stream = open(a.addr, "gone");
    drop(stream);
    a.wait_stats(WAIT, |s| s["connections"]["active"] == 0);
    assert_eq!(redis.numsub(&id_channel(&p, "gone")), 1, "still lingering");
    let r = a.post("/send/gone", "to nobody");
    assert_eq!(
        r.json_sans_event(),
        json!({"id": "gone", "delivered": 0, "nodes": 0})
    );
}

/// Issue 21: Redis paused (SIGSTOP) under `/send`. A publisher that sends
/// each message with an `Idempotency-Key` and retries on 503 delivers it
/// exactly once to every stream, on the publishing node and on the other,
/// however late Redis runs the first attempt's publish.
#[test]
fn with_an_idempotency_key_retries_through_a_paused_redis_deliver_exactly_once() {
    let redis = RedisServer::start();
    let p = prefix("idem");
    let node = |name: &str| {
        let mut s = node_settings(&redis, &p, name);
        s.cluster.command_timeout_ms = 300;
        s.cluster.heartbeat_ttl_ms = 10_000;
        start_node(s)
    };
    let (a, b) = (node("a"), node("b"));
    let mut streams: Vec<StreamClient> = (0..20).map(|_| open(a.addr, "once")).collect();
    streams.extend((0..20).map(|_| open(b.addr, "once")));
    redis.wait_numsub(&id_channel(&p, "once"), 2, WAIT);
    let keyed = |addr: SocketAddr, key: &str, body: &str| {
        request(
            addr,
            "POST",
            "/send/once",
            &[("idempotency-key", key)],
            body.as_bytes(),
        )
        .unwrap()
    };
    assert_eq!(keyed(a.addr, "k0", "m0").status, 200);
    let pid = redis.pid().expect("redis pid");
    send_signal(pid, "STOP");
    // m1 while Redis is paused: 503, outcome unknown; retried every 300 ms,
    // on either node, until Redis is back (SIGCONT after 2 s).
    let first = keyed(a.addr, "k1", "m1");
    assert_eq!(first.status, 503, "{}", first.text());
    assert!(
        first.json()["outcome"].as_str().unwrap().starts_with("unknown"),
        "{}",
        first.text()
    );
    let resume = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(2));
        send_signal(pid, "CONT");
    });
    let mut answers = vec![first.status];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let addr = if answers.len() % 2 == 0 { a.addr } else { b.addr };
        let r = keyed(addr, "k1", "m1");
        answers.push(r.status);
        if r.status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "no 200 within 20 s: {answers:?}");
        std::thread::sleep(Duration::from_millis(300));
    }
    resume.join().unwrap();
    wait_ready(a.addr);
    wait_ready(b.addr);
    // A repeat of k1 once all is well: its first answer, nothing delivered.
    let again = keyed(b.addr, "k1", "m1");
    assert_eq!(
        (again.status, again.header("idempotent-replayed")),
        (200, Some("true"))
    );
    // The same key for another message, on either node: 422, nothing sent.
    assert_eq!(keyed(a.addr, "k1", "not m1").status, 422);
    assert_eq!(keyed(b.addr, "k2", "m2").status, 200);
    for (n, c) in streams.iter_mut().enumerate() {
        let got = lines_within(c, Duration::from_millis(if n == 0 { 2000 } else { 200 }));
        let count = |m: &str| got.iter().filter(|l| l.ends_with(&format!("'{m}'"))).count();
        assert_eq!(
            (count("m0"), count("m1"), count("m2")),
            (1, 1, 1),
            "stream {n} ({}) got {got:?}; answers {answers:?}",
            if n < 20 { "a" } else { "b" }
        );
    }
    // The repeat of k1 after the retries was answered from Redis on b.
    let st = b.stats();
    assert!(st["publish"]["idempotent_replays"].as_u64().unwrap() >= 1, "{st}");
}

/// Issue 21: a bus message is held to the limits of a posted one. A
/// PUBLISH straight to a channel in Redis (anyone sharing the Redis can)
/// with a line over `message.max_bytes`, or with a line break, or (issue
/// 22) with an event id that is not a number or is far ahead of the node's
/// clock, is dropped and counted, never delivered or kept; a message of a
/// node from before event ids travelled is delivered, with an id given here.
#[test]
fn oversized_or_multiline_bus_messages_are_dropped_and_counted() {
    let redis = RedisServer::start();
    let p = prefix("bigbus");
    let mut s = node_settings(&redis, &p, "n");
    s.message.max_bytes = 100;
    let n = start_node(s);
    let mut c = open(n.addr, "victim");
    redis.wait_numsub(&id_channel(&p, "victim"), 1, WAIT);
    // `<origin>[@<event id>] <line>`: too long, two lines, an id that is not
    // a number, an id far in the future; then one of a node from before
    // event ids travelled (it gets an id here) and a good one.
    let big = format!("intruder@1 {}", "x".repeat(5000));
    let two = "intruder@2 one\ntwo".to_owned();
    let bad_id = "intruder@x3 hello".to_owned();
    let far = "intruder@99999999999999999 hello".to_owned();
    let old = "intruder hello from before".to_owned();
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros();
    let fine = format!("intruder@{now_us} {}", "y".repeat(100));
    for payload in [&big, &two, &bad_id, &far, &old, &fine] {
        redis.command(&["PUBLISH", &id_channel(&p, "victim"), payload]);
    }
    assert_eq!(c.line(), "Recvd msg #1: 'hello from before'");
    assert_eq!(c.line(), format!("Recvd msg #2: '{}'", "y".repeat(100)));
    let st = n.stats();
    // The far id is well formed, and dropped as ahead of Redis's time.
    assert_eq!(st["cluster"]["malformed"], 3, "{st}");
    assert_eq!(st["cluster"]["ids_ahead"], 1, "{st}");
    // The fleet's history is in Redis, kept by the publishing script: a
    // node keeps nothing of what arrives on the bus.
    assert_eq!(st["history"]["messages"], 0, "{st}");
    assert_eq!(st["messages"]["routed"], 2, "{st}");
}
