//! What cluster mode shows of the fleet, over a real `redis-server`: the
//! fleet-wide `/dispatcher` count, `/cluster`, the cluster section of
//! `/stats`, `/metrics` labelled by node, `/presence/{id}` across nodes, a
//! node name used twice; and that a single process without Redis answers
//! as before.
//!
//! The setup is `tests/common/cluster.rs`.

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use switchboard::Settings;

use cluster::{WAIT, get, id_channel, node_settings, open, post, prefix, start_node, wait_until};
use common::{RedisServer, TestServer, settings};

/// `/dispatcher` asked through two nodes at once hands out every number
/// from 1 to 400 exactly once: the count lives in Redis, not in a node.
#[test]
fn dispatcher_through_two_nodes_is_unique_and_gap_free() {
    let redis = RedisServer::start();
    let p = prefix("dispatcher");
    let a = start_node(node_settings(&redis, &p, "a"));
    let b = start_node(node_settings(&redis, &p, "b"));
    let mut numbers: Vec<u64> = std::thread::scope(|scope| {
        let workers: Vec<_> = [a.addr, b.addr]
            .into_iter()
            .flat_map(|addr| std::iter::repeat_n(addr, 4))
            .map(|addr| {
                scope.spawn(move || {
                    (0..50)
                        .map(|_| {
                            let r = get(addr, "/dispatcher");
                            assert_eq!(r.status, 200, "{}", r.text());
                            r.text().parse::<u64>().unwrap()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().unwrap()).collect()
    });
    numbers.sort_unstable();
    assert_eq!(numbers, (1..=400).collect::<Vec<_>>());
    let key = format!("{p}:dispatcher");
    assert_eq!(redis.command(&["GET", &key]).text().as_deref(), Some("400"));
}

/// /stats has a cluster section: connected, the ids subscribed (one per id,
/// however many streams hold it), publishes and the echoes of its own
/// publishes, which are counted and not delivered twice.
#[test]
fn stats_have_a_cluster_section() {
    let redis = RedisServer::start();
    let p = prefix("stats");
    let mut s = node_settings(&redis, &p, "solo");
    s.cluster.unsubscribe_linger_ms = 300;
    let a = start_node(s);
    let mut x1 = open(a.addr, "x");
    let mut x2 = open(a.addr, "x");
    let y = open(a.addr, "y");
    let st = a.wait_stats(WAIT, |s| s["cluster"]["subscriptions"] == 2);
    let c = &st["cluster"];
    assert_eq!(c["subscriptions"], 2, "{st}");
    assert_eq!(c["connected"], true, "{st}");
    assert_eq!(c["node"], "solo", "{st}");
    assert!(c["instance"].is_string(), "{st}");
    assert_eq!(redis.wait_numsub(&id_channel(&p, "x"), 1, WAIT), 1);

    let r = a.post("/send/x", "m1");
    assert_eq!(
        r.json_sans_event(),
        json!({"id": "x", "delivered": 2, "nodes": 0})
    );
    // The echo of its own publish comes back, counted: it is how this
    // node's streams get the message, in the fleet's order.
    let st = a.wait_stats(WAIT, |s| s["cluster"]["echoes"] == 1);
    assert_eq!(st["cluster"]["echoes"], 1, "{st}");
    let r = a.post("/send/x", "m2");
    assert_eq!(r.json()["delivered"], 2);
    for s in [&mut x1, &mut x2] {
        assert_eq!(s.line(), "Recvd msg #1: 'm1'");
        assert_eq!(s.line(), "Recvd msg #2: 'm2'");
    }
    let st = a.wait_stats(WAIT, |s| s["cluster"]["echoes"] == 2);
    let c = &st["cluster"];
    assert_eq!(c["echoes"], 2, "{st}");
    assert_eq!(c["publishes"], 2, "{st}");
    assert_eq!(c["publish_errors"], 0, "{st}");
    assert_eq!(c["received"], 0, "{st}");
    let st = a.wait_stats(WAIT, |s| s["cluster"]["heartbeats"].as_u64() > Some(0));
    assert!(st["cluster"]["heartbeats"].as_u64() > Some(0), "{st}");
    let st = a.wait_stats(WAIT, |s| s["cluster"]["redis_version"] != "");
    assert!(
        st["cluster"]["redis_version"].as_str().unwrap().contains('.'),
        "{st}"
    );

    drop(y);
    let st = a.wait_stats(WAIT, |s| s["cluster"]["subscriptions"] == 1);
    assert_eq!(st["cluster"]["subscriptions"], 1, "{st}");
    assert_eq!(redis.wait_numsub(&id_channel(&p, "y"), 0, WAIT), 0);
}

/// In cluster mode every metric carries this node's name.
#[test]
fn metrics_carry_the_node_name_in_cluster_mode() {
    let redis = RedisServer::start();
    let p = prefix("metrics");
    let a = start_node(node_settings(&redis, &p, "node-a"));
    let b = start_node(node_settings(&redis, &p, "node-b"));
    let mut on_b = open(b.addr, "far");
    redis.wait_numsub(&id_channel(&p, "far"), 1, WAIT);
    assert_eq!(post(a.addr, "/send/far", "over the bus").status, 200);
    assert!(on_b.message().ends_with("'over the bus'"));
    let body = get(a.addr, "/metrics").text();
    let samples: Vec<&str> = body.lines().filter(|l| !l.starts_with('#')).collect();
    assert!(!samples.is_empty(), "{body}");
    assert!(samples.iter().all(|l| l.contains("node=\"node-a\"")), "{body}");
    for line in [
        "switchboard_streams_active{node=\"node-a\"} 0",
        "switchboard_cluster_bus_connected{node=\"node-a\"} 1",
        "switchboard_cluster_publishes_total{node=\"node-a\"} 1",
    ] {
        assert!(body.lines().any(|l| l == line), "{line} in\n{body}");
    }
    // The message crossed to b: b timed it from its arrival off the bus
    // (the client may read it a moment before b's worker counts it).
    let timed = "switchboard_message_latency_seconds_count{node=\"node-b\"} 1";
    let mut far = String::new();
    wait_until(WAIT, "b timed the message", || {
        far = get(b.addr, "/metrics").text();
        far.lines().any(|l| l == timed)
    });
    let received = "switchboard_cluster_received_total{node=\"node-b\"} 1";
    assert!(far.lines().any(|l| l == received), "{received} in\n{far}");
    // promtool accepts the cluster's exposition too.
    let mut lint = Command::new("/usr/bin/promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("/usr/bin/promtool (apt-get install -y prometheus)");
    std::io::Write::write_all(&mut lint.stdin.take().unwrap(), far.as_bytes()).unwrap();
    let out = lint.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Issue 23: `/presence/{id}` on any node counts the id's open streams on
/// every live node, within a heartbeat of streams opening and closing.
#[test]
fn presence_counts_streams_on_every_node() {
    let redis = RedisServer::start();
    let p = prefix("presence");
    let node = |name| {
        let mut s = node_settings(&redis, &p, name);
        s.cluster.heartbeat_interval_ms = 200;
        start_node(s)
    };
    let (a, b) = (node("a"), node("b"));
    let presence = |n: &TestServer| n.get("/presence/p").json();
    let wait_presence = |want: Value| {
        for n in [&a, &b] {
            let deadline = Instant::now() + WAIT;
            loop {
                let got = presence(n);
                if got == want {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "presence on {}: {got}, want {want}",
                    n.addr
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    let a1 = open(a.addr, "p");
    let a2 = open(a.addr, "p");
    let b1 = open(b.addr, "p");
    wait_presence(json!({"id": "p", "streams": 3, "nodes": [
        {"node": "a", "streams": 2}, {"node": "b", "streams": 1}]}));
    drop(a1);
    drop(b1);
    wait_presence(json!({"id": "p", "streams": 1, "nodes": [{"node": "a", "streams": 1}]}));
    drop(a2);
    wait_presence(json!({"id": "p", "streams": 0, "nodes": []}));
    // Redis losing everything: each node writes all it holds again.
    let _b2 = open(b.addr, "p");
    wait_presence(json!({"id": "p", "streams": 1, "nodes": [{"node": "b", "streams": 1}]}));
    redis.command(&["FLUSHALL"]);
    wait_presence(json!({"id": "p", "streams": 1, "nodes": [{"node": "b", "streams": 1}]}));
}

/// Two live nodes under one name are noticed: their heartbeats find each
/// other's entry, and each counts it in `cluster.name_conflicts`.
#[test]
fn a_node_name_used_twice_is_noticed() {
    let redis = RedisServer::start();
    let p = prefix("dupname");
    let beat = |mut s: Settings| {
        s.cluster.heartbeat_interval_ms = 100;
        s
    };
    let a = start_node(beat(node_settings(&redis, &p, "dup")));
    let b = start_node(beat(node_settings(&redis, &p, "dup")));
    for n in [&a, &b] {
        let st = n.wait_stats(WAIT, |s| s["cluster"]["name_conflicts"].as_u64() > Some(0));
        assert!(st["cluster"]["name_conflicts"].as_u64() > Some(0), "{st}");
    }
}

/// Without `cluster.redis_url` nothing changes: /readyz is ok, /cluster
/// describes this one process, /stats has no cluster section, and /send
/// answers without `nodes`.
#[test]
fn single_mode_answers_are_unchanged() {
    let srv = TestServer::start(settings());
    let r = srv.get("/readyz");
    assert_eq!((r.status, r.text()), (200, "ok".to_owned()));
    let c = srv.admin_get("/cluster").json();
    assert_eq!(c["mode"], "single", "{c}");
    assert_eq!(c["nodes"].as_array().unwrap().len(), 1, "{c}");
    assert_eq!(c["totals"]["nodes"], 1, "{c}");
    assert_eq!(c["nodes"][0]["pid"], std::process::id(), "{c}");
    assert!(srv.stats().get("cluster").is_none());
    assert_eq!(
        srv.post("/send/x", "m").json_sans_event(),
        json!({"id": "x", "delivered": 0})
    );
    let _s = srv.open("one");
    srv.wait_stats(WAIT, |s| s["connections"]["active"] == 1);
    assert_eq!(srv.admin_get("/cluster").json()["totals"]["streams"], 1);
    // Presence has the cluster's shape, for this process alone.
    let p = srv.get("/presence/one").json();
    let name = c["nodes"][0]["name"].clone();
    assert_eq!(
        p,
        json!({"id": "one", "streams": 1, "nodes": [{"node": name, "streams": 1}]})
    );
    assert_eq!(
        srv.get("/presence/none").json(),
        json!({"id": "none", "streams": 0, "nodes": []})
    );
    assert_eq!(srv.get("/presence/").status, 400);
}
