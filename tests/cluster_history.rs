//! Cluster mode's event ids and history over a real `redis-server` (issues
//! 22 and 23): one message has one event id on every node, streams of an
//! id see one order, and a client that resumes (`?since=`, `Last-Event-ID`,
//! WebSocket), on its node, on another, or through a `--processes` fleet,
//! gets exactly what it missed from the fleet's history in Redis, or is
//! told of a gap (history trimmed, Redis flushed).
//!
//! The setup is `tests/common/cluster.rs`.

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use cluster::{
    WAIT, event_line, id_channel, node_settings, open_ids, post, prefix, processes, send_ok, start_node,
    wait_cluster,
};
use common::{RedisServer, StreamClient, request};

/// Issue 22: a message's event id is minted once, by the fleet's publish
/// script in Redis, and carried on the bus: the streams of its id on every
/// node get it under the id `/send` answered, for a plain publish and for
/// a keyed one (delivered on the accepting node from its echo, as on the
/// others), and the fleet's history keeps it under that id.
#[test]
fn one_message_has_one_event_id_on_every_node() {
    let redis = RedisServer::start();
    let p = prefix("oneid");
    let a = start_node(node_settings(&redis, &p, "a"));
    let b = start_node(node_settings(&redis, &p, "b"));
    let req = "GET /test/same?ids=1 HTTP/1.1\r\nhost: t\r\n\r\n";
    let mut on_a = StreamClient::open_raw(a.addr, req);
    let mut on_b = StreamClient::open_raw(b.addr, req);
    on_a.line();
    on_b.line();
    assert_eq!(redis.wait_numsub(&id_channel(&p, "same"), 2, WAIT), 2);
    let plain = post(a.addr, "/send/same", "plain");
    assert_eq!(plain.status, 200);
    let keyed = request(
        b.addr,
        "POST",
        "/send/same",
        &[("idempotency-key", "one-id")],
        b"keyed",
    )
    .unwrap();
    assert_eq!(keyed.status, 200);
    let mut last = String::new();
    for (answer, text) in [(&plain, "plain"), (&keyed, "keyed")] {
        let event = answer.json()["event_id"].as_u64().unwrap().to_string();
        for (node, s) in [("a", &mut on_a), ("b", &mut on_b)] {
            let line = s.line();
            let (id, rest) = line.split_once(' ').unwrap();
            assert_eq!(id, event, "{text} on {node}: {line}");
            assert!(rest.ends_with(&format!("'{text}'")), "{text} on {node}: {line}");
        }
        last = event;
    }
    // Resuming on either node after the first id replays the second under
    // its one id.
    let first = plain.json()["event_id"].as_u64().unwrap();
    for n in [&a, &b] {
        let mut s = StreamClient::open_raw(
            n.addr,
            &format!("GET /test/same?ids=1&since={first} HTTP/1.1\r\nhost: t\r\n\r\n"),
        );
        s.line();
        let replayed = s.line();
        assert!(
            replayed.starts_with(&format!("{last} ")) && replayed.ends_with("'keyed'"),
            "{replayed}"
        );
    }
}

/// Issue 23: two publishers on two nodes sending to one id at once:
/// streams of the id on both nodes get every message once, in one order,
/// the order of their event ids.
#[test]
fn two_publishers_on_two_nodes_give_one_order_everywhere() {
    let redis = RedisServer::start();
    let p = prefix("order");
    let a = start_node(node_settings(&redis, &p, "a"));
    let b = start_node(node_settings(&redis, &p, "b"));
    let mut on_a = open_ids(a.addr, "o", None);
    let mut on_b = open_ids(b.addr, "o", None);
    on_a.line();
    on_b.line();
    redis.wait_numsub(&id_channel(&p, "o"), 2, WAIT);
    const EACH: usize = 100;
    let publishers: Vec<_> = [(a.addr, "a"), (b.addr, "b")]
        .into_iter()
        .map(|(addr, name)| {
            std::thread::spawn(move || {
                (0..EACH)
                    .map(|i| send_ok(addr, "o", &format!("{name}{i}")))
                    .collect::<Vec<u64>>()
            })
        })
        .collect();
    let mut answered: Vec<u64> = publishers.into_iter().flat_map(|p| p.join().unwrap()).collect();
    answered.sort_unstable();
    let seen = |s: &mut StreamClient| -> Vec<(u64, String)> {
        (0..2 * EACH)
            .map(|_| {
                let line = s.line();
                let (ev, rest) = event_line(&line);
                (ev, rest.rsplit_once(": ").unwrap().1.to_owned())
            })
            .collect()
    };
    let (sa, sb) = (seen(&mut on_a), seen(&mut on_b));
    assert_eq!(sa, sb, "the two nodes' streams saw different orders");
    let ids: Vec<u64> = sa.iter().map(|(ev, _)| *ev).collect();
    assert_eq!(ids, answered, "in the order of their ids, each once");
}

/// Cluster mode keeps history on each node, messages from other nodes
/// included: a stream that reconnects to its node with the last event id
/// it saw gets, in order, what was published meanwhile on either node.
#[test]
fn a_stream_resumes_on_its_node_with_messages_published_elsewhere() {
    let redis = RedisServer::start();
    let p = prefix("resume");
    let a = start_node(node_settings(&redis, &p, "a"));
    let b = start_node(node_settings(&redis, &p, "b"));
    let path = "/test/res?ids=1";
    let req = |path: &str| format!("GET {path} HTTP/1.1\r\nhost: t\r\n\r\n");
    let mut s = StreamClient::open_raw(a.addr, &req(path));
    s.line();
    assert_eq!(redis.wait_numsub(&id_channel(&p, "res"), 1, WAIT), 1);
    assert_eq!(post(b.addr, "/send/res", "one").status, 200);
    let seen = s.line();
    assert!(seen.ends_with("Recvd msg #1: 'one'"), "{seen}");
    let last = seen.split(' ').next().unwrap().to_owned();
    drop(s);
    // While it is away (a lingers on the id): one from each node.
    assert_eq!(post(b.addr, "/send/res", "two").status, 200);
    assert_eq!(post(a.addr, "/send/res", "three").status, 200);
    let mut s = StreamClient::open_raw(a.addr, &req(&format!("{path}&since={last}")));
    assert_eq!(s.line(), format!("{last} Switchboard welcomes you! Your Id: res"));
    let two = s.line();
    let three = s.line();
    assert!(two.ends_with("Recvd msg #1: 'two'"), "{two}");
    assert!(three.ends_with("Recvd msg #2: 'three'"), "{three}");
    let ids: Vec<u64> = [&last, &two, &three]
        .iter()
        .map(|l| l.split(' ').next().unwrap().parse().unwrap())
        .collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    assert_eq!(a.stats()["history"]["gaps"], 0);
}

/// Issue 23: a stream that resumes on another node gets what it missed
/// from the fleet's history (published on both nodes while it was away),
/// under the ids `/send` answered, then live messages, none twice.
#[test]
fn a_stream_resumes_on_another_node_with_everything_it_missed() {
    let redis = RedisServer::start();
    let p = prefix("anynode");
    let a = start_node(node_settings(&redis, &p, "a"));
    let b = start_node(node_settings(&redis, &p, "b"));
    let mut s = open_ids(a.addr, "r", None);
    s.line();
    redis.wait_numsub(&id_channel(&p, "r"), 1, WAIT);
    let e1 = send_ok(b.addr, "r", "one");
    assert_eq!(event_line(&s.line()), (e1, "Recvd msg #1: 'one'"));
    drop(s);
    let e2 = send_ok(b.addr, "r", "two");
    let e3 = send_ok(a.addr, "r", "three");
    let mut s = open_ids(b.addr, "r", Some(e1));
    assert_eq!(s.line(), format!("{e1} Switchboard welcomes you! Your Id: r"));
    assert_eq!(event_line(&s.line()), (e2, "Recvd msg #1: 'two'"));
    assert_eq!(event_line(&s.line()), (e3, "Recvd msg #2: 'three'"));
    let e4 = send_ok(a.addr, "r", "four");
    assert_eq!(event_line(&s.line()), (e4, "Recvd msg #3: 'four'"));
    let st = b.stats();
    assert_eq!(st["history"]["gaps"], 0, "{st}");
    assert_eq!(st["history"]["replayed"], 2, "{st}");
    assert!(st["history"]["reads"].as_u64().unwrap() >= 1, "{st}");
}

/// Issue 23: an id no node held while messages were sent to it: a client
/// that resumes after the first `/send`'s event id gets the rest, on a
/// node that never held the id.
#[test]
fn an_id_no_node_held_resumes_from_the_first_sends_event_id() {
    let redis = RedisServer::start();
    let p = prefix("ghost");
    let a = start_node(node_settings(&redis, &p, "a"));
    let b = start_node(node_settings(&redis, &p, "b"));
    let first = send_ok(a.addr, "ghost", "m1");
    let e2 = send_ok(a.addr, "ghost", "m2");
    let e3 = send_ok(b.addr, "ghost", "m3");
    assert!(first < e2 && e2 < e3);
    let mut s = open_ids(b.addr, "ghost", Some(first));
    assert_eq!(
        s.line(),
        format!("{first} Switchboard welcomes you! Your Id: ghost")
    );
    assert_eq!(event_line(&s.line()), (e2, "Recvd msg #1: 'm2'"));
    assert_eq!(event_line(&s.line()), (e3, "Recvd msg #2: 'm3'"));
    assert_eq!(b.stats()["history"]["gaps"], 0);
}

/// Issue 23: a broadcast sent while a client was away is replayed when it
/// resumes, in id order with its id's own messages.
#[test]
fn a_broadcast_missed_while_away_is_replayed_in_order() {
    let redis = RedisServer::start();
    let p = prefix("bmiss");
    let a = start_node(node_settings(&redis, &p, "a"));
    let b = start_node(node_settings(&redis, &p, "b"));
    let start = send_ok(a.addr, "bm", "first");
    let e2 = send_ok(b.addr, "bm", "second");
    let r = post(a.addr, "/broadcast", "to all");
    assert_eq!(r.status, 200, "{}", r.text());
    let eb = r.json()["event_id"].as_u64().unwrap();
    let e3 = send_ok(a.addr, "bm", "third");
    assert!(e2 < eb && eb < e3);
    let mut s = open_ids(b.addr, "bm", Some(start));
    s.line();
    assert_eq!(event_line(&s.line()), (e2, "Recvd msg #1: 'second'"));
    assert_eq!(event_line(&s.line()), (eb, "Recvd msg #2: 'to all'"));
    assert_eq!(event_line(&s.line()), (e3, "Recvd msg #3: 'third'"));
    assert_eq!(b.stats()["history"]["gaps"], 0);
}

/// Issue 23: more messages than `history.size` while away is a gap that
/// names the first id kept; then the kept ones, in order, none twice.
#[test]
fn resuming_beyond_the_history_size_is_told_a_gap() {
    let redis = RedisServer::start();
    let p = prefix("trim");
    let node = |name| {
        let mut s = node_settings(&redis, &p, name);
        s.history.size = 3;
        start_node(s)
    };
    let (a, b) = (node("a"), node("b"));
    let start = send_ok(a.addr, "t", "m0");
    let ids: Vec<u64> = (1..=5).map(|i| send_ok(a.addr, "t", &format!("m{i}"))).collect();
    let mut s = open_ids(b.addr, "t", Some(start));
    s.line();
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
    // From inside what is kept: no gap.
    let mut s = open_ids(a.addr, "t", Some(ids[2]));
    s.line();
    assert_eq!(event_line(&s.line()), (ids[3], "Recvd msg #1: 'm4'"));
    let st = b.stats();
    assert_eq!(st["history"]["gaps_by_cause"]["trimmed"], 1, "{st}");
    assert_eq!(a.stats()["history"]["gaps"], 0);
}

/// Issue 37: a namespace's `history_size` is the fleet's for its ids: a
/// resume on another node gets all five of `keep:t`'s messages (it keeps
/// five) and is told of a gap in `t`'s (the server's `history.size`, 2),
/// and a catch-up read (id and broadcasts in one script call, each with
/// its own size) keeps each to its own.
#[test]
fn a_namespace_keeps_its_own_history_across_the_fleet() {
    use switchboard::config::NamespaceSettings;
    let redis = RedisServer::start();
    let p = prefix("nshist");
    let node = |name| {
        let mut s = node_settings(&redis, &p, name);
        s.history.size = 2;
        s.namespaces.insert(
            "keep".into(),
            NamespaceSettings {
                history_size: Some(5),
                ..NamespaceSettings::default()
            },
        );
        start_node(s)
    };
    let (a, b) = (node("a"), node("b"));
    let start = send_ok(a.addr, "other", "m0");
    for id in ["keep:t", "t"] {
        for i in 1..=5 {
            send_ok(a.addr, id, &format!("{id} m{i}"));
        }
    }
    let mut kept = open_ids(b.addr, "keep:t", Some(start));
    kept.line();
    for i in 1..=5 {
        let line = kept.line();
        assert!(line.ends_with(&format!("'keep:t m{i}'")), "{line}");
    }
    let mut trimmed = open_ids(b.addr, "t", Some(start));
    trimmed.line();
    let gap = trimmed.line();
    assert!(gap.contains("Gap: messages after event"), "{gap}");
    for i in 4..=5 {
        let line = trimmed.line();
        assert!(line.ends_with(&format!("'t m{i}'")), "{line}");
    }
}

/// Issue 23: Redis losing its data (`FLUSHALL`, as a restart without
/// persistence) starts a new epoch: a resume from before it is told of a
/// gap, and then gets what was sent since, in order.
#[test]
fn flushall_is_a_gap_never_a_silent_hole() {
    let redis = RedisServer::start();
    let p = prefix("flush");
    let a = start_node(node_settings(&redis, &p, "a"));
    let before = send_ok(a.addr, "f", "old");
    redis.command(&["FLUSHALL"]);
    let after = send_ok(a.addr, "f", "new");
    let mut s = open_ids(a.addr, "f", Some(before));
    s.line();
    assert_eq!(
        s.line(),
        format!(
            "{before} Gap: messages after event {before} may be missing; history resumes at event {after}"
        )
    );
    assert_eq!(event_line(&s.line()), (after, "Recvd msg #1: 'new'"));
    let st = a.stats();
    assert_eq!(st["history"]["gaps_by_cause"]["epoch"], 1, "{st}");
}

/// Issue 23: WebSocket `?since=` on a node other than the one the client
/// was on.
#[test]
fn a_websocket_resumes_with_since_on_another_node() {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    let redis = RedisServer::start();
    let p = prefix("wsnode");
    let a = start_node(node_settings(&redis, &p, "a"));
    let b = start_node(node_settings(&redis, &p, "b"));
    let e1 = send_ok(a.addr, "w", "one");
    let e2 = send_ok(a.addr, "w", "two");
    let addr = b.addr;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let url = format!("ws://{addr}/test/w?since={e1}&ids=1");
        let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
        let mut texts = Vec::new();
        while texts.len() < 2 {
            match tokio::time::timeout(WAIT, ws.next()).await {
                Ok(Some(Ok(Message::Text(t)))) if !t.starts_with("Chunk ") => texts.push(t.to_string()),
                Ok(Some(Ok(Message::Text(_) | Message::Pong(_)))) => {}
                other => panic!("expected a text frame, got {other:?}"),
            }
        }
        assert_eq!(texts[0], format!("{e1} Switchboard welcomes you! Your Id: w"));
        assert_eq!(texts[1], format!("{e2} Recvd msg #1: 'two'"));
    });
}

/// Issue 23: through the shared port of a `--processes 4` fleet, where the
/// kernel hands each reconnect to any process: every reconnect gets
/// exactly what it missed, in order, with no gap.
#[test]
fn every_reconnect_through_a_four_process_fleet_is_exact() {
    let redis = RedisServer::start();
    let p = prefix("fleet4");
    let (_parent, addr) = processes(&redis, &p, 4);
    let mut last = send_ok(addr, "fl", "start");
    let mut n = 0;
    // Every round's stream stays open, to see where the kernel put them.
    let mut held = Vec::new();
    for round in 0..8 {
        let sent: Vec<(u64, String)> = (0..3)
            .map(|i| {
                n += 1;
                let text = format!("r{round}m{i}");
                (send_ok(addr, "fl", &text), text)
            })
            .collect();
        let mut s = open_ids(addr, "fl", Some(last));
        assert_eq!(s.line(), format!("{last} Switchboard welcomes you! Your Id: fl"));
        for (i, (ev, text)) in sent.iter().enumerate() {
            let line = s.line();
            assert_eq!(
                event_line(&line),
                (*ev, format!("Recvd msg #{}: '{text}'", i + 1).as_str()),
                "round {round}"
            );
        }
        // And live after the switch: one more, on whichever process.
        let ev = send_ok(addr, "fl", &format!("live{round}"));
        assert_eq!(
            event_line(&s.line()),
            (ev, format!("Recvd msg #4: 'live{round}'").as_str())
        );
        last = ev;
        held.push(s);
    }
    assert_eq!(n, 24);
    // They were served by more than one process (the test proves nothing
    // if the kernel gave every reconnect to the one that held the id).
    let c = wait_cluster(addr, WAIT, "8 streams over the fleet", |c| {
        c["totals"]["streams"] == 8
    });
    let serving = c["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["streams"] != 0)
        .count();
    assert!(serving >= 2, "all on one process: {c}");
}
