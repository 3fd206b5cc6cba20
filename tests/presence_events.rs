//! `join` and `leave` (a namespace's `presence_events`, issue 37): a
//! stream hears the other streams of its id open and end, on every
//! transport and on every node of a fleet on a real `redis-server`, with
//! their token's `sub`; `/presence/{id}` lists the subjects.

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use std::net::SocketAddr;
use std::time::Duration;

use cluster::{WAIT, get, node_settings, post, prefix, start_node, wait_until};
use common::{RedisServer, StreamClient, TestServer, read_chunk};
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

const KEY: &str = "a-subscriber-secret";

/// A token for `sub`, for the ids it may open.
fn token(sub: &str, ids: &[&str]) -> String {
    use jsonwebtoken::{EncodingKey, Header, encode};
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 600;
    let claims = json!({ "sub": sub, "ids": ids, "exp": exp });
    encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(KEY.as_bytes()).unwrap(),
    )
    .unwrap()
}

/// `[namespaces.chat]` with `presence_events`, tokens checked with `KEY`
/// but not required (a stream without one has no `sub`).
fn with_presence(s: &mut switchboard::Settings) {
    s.server.admin_public = true;
    s.auth.subscribe_secret = KEY.to_owned();
    s.namespaces.insert(
        "chat".to_owned(),
        switchboard::config::NamespaceSettings {
            token_required: Some(false),
            presence_events: Some(true),
            ..Default::default()
        },
    );
}

fn open(addr: SocketAddr, target: &str, headers: &str) -> StreamClient {
    let mut c = StreamClient::open_raw(
        addr,
        &format!("GET {target} HTTP/1.1\r\nhost: t\r\n{headers}\r\n"),
    );
    assert_eq!(c.status, 200, "{target}");
    // The welcome (and SSE's retry).
    read_chunk(&mut c.reader).unwrap();
    c
}

/// The next SSE event that is not a tick: its `event:` and `data:`.
fn sse_event(c: &mut StreamClient) -> (String, String) {
    loop {
        let chunk = read_chunk(&mut c.reader).unwrap().expect("stream ended");
        let text = String::from_utf8(chunk).unwrap();
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(str::to_owned)
                .unwrap_or_default()
        };
        let (event, data) = (field("event: "), field("data: "));
        if !["tick", "welcome", ""].contains(&event.as_str()) {
            return (event, data);
        }
    }
}

/// The next line of a chunked stream that is not a tick.
fn line(c: &mut StreamClient) -> String {
    c.message()
}

fn presence(addr: SocketAddr, id: &str) -> Value {
    get(addr, &format!("/presence/{id}")).json()
}

/// One process: an SSE, a chunked and a WebSocket stream of `chat:1` each
/// hear the others join and leave, with their `sub` (none for a stream
/// without a token) and the node; `/presence` lists the subjects; an id
/// outside the namespace hears nothing of the kind.
#[test]
fn streams_hear_joins_and_leaves_on_every_transport() {
    let mut s = common::settings();
    with_presence(&mut s);
    s.cluster.node_name = "solo".to_owned();
    let srv = TestServer::start(s);
    let addr = srv.addr;
    let ids = ["chat:1", "room"];
    let mut watcher = open(
        addr,
        &format!("/test/chat:1?token={}", token("watcher", &ids)),
        "accept: text/event-stream\r\n",
    );
    let mut alice = open(addr, &format!("/test/chat:1?token={}", token("alice", &ids)), "");
    assert_eq!(
        sse_event(&mut watcher),
        ("join".to_owned(), r#"{"sub":"alice","node":"solo"}"#.to_owned())
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut ws = rt.block_on(async {
        let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/test/chat:1"))
            .await
            .unwrap();
        // Its welcome.
        ws.next().await.unwrap().unwrap();
        ws
    });
    // Without a token: no sub.
    assert_eq!(
        sse_event(&mut watcher),
        ("join".to_owned(), r#"{"node":"solo"}"#.to_owned())
    );
    assert_eq!(line(&mut alice), r#"Join: {"node":"solo"}"#);
    let p = presence(addr, "chat:1");
    assert_eq!(p["streams"], 3, "{p}");
    assert_eq!(
        p["subjects"],
        json!({"list": ["alice", "watcher"], "count": 2}),
        "{p}"
    );
    drop(alice);
    assert_eq!(
        sse_event(&mut watcher),
        ("leave".to_owned(), r#"{"sub":"alice","node":"solo"}"#.to_owned())
    );
    let frame = rt.block_on(async {
        loop {
            match tokio::time::timeout(WAIT, ws.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap()
            {
                Message::Text(t) if !t.starts_with("Chunk ") => return t.to_string(),
                _ => {}
            }
        }
    });
    assert_eq!(frame, r#"Leave: {"sub":"alice","node":"solo"}"#);
    wait_until(WAIT, "alice gone from the subjects", || {
        presence(addr, "chat:1")["subjects"] == json!({"list": ["watcher"], "count": 1})
    });
    // Outside the namespace: no join, no subjects.
    let mut first = open(addr, &format!("/test/room?token={}", token("x", &ids)), "");
    let _second = open(addr, &format!("/test/room?token={}", token("y", &ids)), "");
    assert_eq!(post(addr, "/send/room", "hi").status, 200);
    assert!(line(&mut first).ends_with("'hi'"));
    assert!(presence(addr, "room").get("subjects").is_none());
    let stats = srv.stats();
    assert_eq!(stats["presence_events"]["failed"], 0, "{stats}");
    assert!(stats["presence_events"]["sent"].as_u64() >= Some(3), "{stats}");
}

/// A fleet: a stream on one node hears a stream of its id on another join
/// and leave, named by that node, and `/presence` on either lists the
/// subjects of both.
#[test]
fn joins_and_leaves_cross_the_fleet() {
    let redis = RedisServer::start();
    let p = prefix("joins");
    let node = |name: &str| {
        let mut s = node_settings(&redis, &p, name);
        with_presence(&mut s);
        s.cluster.heartbeat_interval_ms = 200;
        start_node(s)
    };
    let (a, b) = (node("a"), node("b"));
    let ids = ["chat:7"];
    let mut on_a = open(
        a.addr,
        &format!("/test/chat:7?token={}", token("ann", &ids)),
        "accept: text/event-stream\r\n",
    );
    // a hears the id's channel (its stream's welcome came after its
    // subscription); b's stream's join is PUBLISHed there.
    assert_eq!(redis.wait_numsub(&cluster::id_channel(&p, "chat:7"), 1, WAIT), 1);
    let bob = open(b.addr, &format!("/test/chat:7?token={}", token("bob", &ids)), "");
    assert_eq!(
        sse_event(&mut on_a),
        ("join".to_owned(), r#"{"sub":"bob","node":"b"}"#.to_owned())
    );
    for at in [a.addr, b.addr] {
        wait_until(Duration::from_secs(5), "both subjects listed", || {
            presence(at, "chat:7")["subjects"] == json!({"list": ["ann", "bob"], "count": 2})
        });
    }
    drop(bob);
    assert_eq!(
        sse_event(&mut on_a),
        ("leave".to_owned(), r#"{"sub":"bob","node":"b"}"#.to_owned())
    );
    assert!(a.stats()["presence_events"]["received"].as_u64() >= Some(2));
}

/// `max_streams_per_id`: an id takes that many streams, on the lean path
/// and actix-web's; one more is refused 429 with why and `Retry-After`,
/// and a place comes back when a stream ends. Other ids, and ids outside
/// the namespace, are not limited.
#[test]
fn an_id_takes_at_most_its_namespaces_streams() {
    let mut s = common::settings();
    s.server.admin_public = true;
    s.namespaces.insert(
        "room".to_owned(),
        switchboard::config::NamespaceSettings {
            max_streams_per_id: Some(2),
            ..Default::default()
        },
    );
    let srv = TestServer::start(s);
    let addr = srv.addr;
    let first = open(addr, "/test/room:1", "");
    let _second = StreamClient::open_fallback(addr, "room:1");
    let refused = common::request(addr, "GET", "/test/room:1", &[], b"").unwrap();
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert!(
        refused.error().contains("namespaces.room.max_streams_per_id"),
        "{}",
        refused.error()
    );
    assert_eq!(refused.header("retry-after"), Some("5"));
    let mut fallback = StreamClient::open_fallback(addr, "room:1");
    assert_eq!(fallback.status, 429);
    drop(fallback.reader.get_mut().shutdown(std::net::Shutdown::Both));
    let _other = open(addr, "/test/room:2", "");
    for _ in 0..3 {
        let _lobby = open(addr, "/test/lobby", "");
    }
    drop(first);
    let mut back = None;
    wait_until(WAIT, "a place back for room:1", || {
        let c = StreamClient::open_raw(addr, "GET /test/room:1 HTTP/1.1\r\nhost: t\r\n\r\n");
        let admitted = c.status == 200;
        if admitted {
            back = Some(c);
        }
        admitted
    });
    assert!(srv.stats()["per_id"]["refused"].as_u64() >= Some(2));
}

/// In a fleet, the other nodes' streams of the id count (as of their last
/// heartbeat).
#[test]
fn a_fleet_counts_every_nodes_streams_of_a_limited_id() {
    let redis = RedisServer::start();
    let p = prefix("perid");
    let node = |name: &str| {
        let mut s = node_settings(&redis, &p, name);
        s.cluster.heartbeat_interval_ms = 200;
        s.namespaces.insert(
            "room".to_owned(),
            switchboard::config::NamespaceSettings {
                max_streams_per_id: Some(2),
                ..Default::default()
            },
        );
        start_node(s)
    };
    let (a, b) = (node("a"), node("b"));
    let _on_a = open(a.addr, "/test/room:9", "");
    let _on_b = open(b.addr, "/test/room:9", "");
    // Once each node's count is in Redis, neither takes a third.
    for at in [a.addr, b.addr] {
        wait_until(Duration::from_secs(5), "both streams in presence", || {
            presence(at, "room:9")["streams"] == 2
        });
    }
    for at in [a.addr, b.addr] {
        let r = common::request(at, "GET", "/test/room:9", &[], b"").unwrap();
        assert_eq!(r.status, 429, "{}", r.text());
    }
    assert_eq!(a.stats()["per_id"]["unchecked"], 0);
}
