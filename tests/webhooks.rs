//! Webhooks (`hooks.events_url`, issue 37) as the application gets them:
//! a Python receiver (tests/backend/app.py) checks each batch's HMAC and
//! logs its events; the server runs in this process or, for a fleet on a
//! real `redis-server`, as binaries (one of them killed).

#[path = "common/app.rs"]
mod app;
#[path = "common/cluster.rs"]
mod cluster;
mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use app::Backend;
use cluster::{WAIT, binary, binary_node, post, prefix, wait_until};
use common::{RedisServer, StreamClient, TestServer, request};
use serde_json::Value;

const SECRET: &str = "a-webhook-secret-of-some-length";

/// The receiver, with its key.
fn receiver(name: &str) -> Backend {
    let app = Backend::start(name);
    app.write("secret", SECRET);
    app
}

/// Every event the receiver logged so far.
fn events(app: &Backend) -> Vec<Value> {
    std::fs::read_to_string(app.state.join("events.log"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The logged events of `id`, as `name@node` (with `/sub` when there is
/// one), in order.
fn of(app: &Backend, id: &str) -> Vec<String> {
    events(app)
        .iter()
        .filter(|e| e["id"] == id)
        .map(|e| {
            assert_eq!(e["verified"], true, "signature: {e}");
            let mut s = format!("{}@{}", e["name"].as_str().unwrap(), e["node"].as_str().unwrap());
            if let Some(sub) = e["sub"].as_str() {
                s.push('/');
                s.push_str(sub);
            }
            s
        })
        .collect()
}

/// Waits until `id` has `n` events logged, and for a moment more (a
/// duplicate would come within it): they are its events.
fn settled(app: &Backend, id: &str, n: usize) -> Vec<String> {
    wait_until(Duration::from_secs(10), &format!("{n} events of {id}"), || {
        of(app, id).len() >= n
    });
    std::thread::sleep(Duration::from_millis(600));
    of(app, id)
}

fn single(app: &Backend, edit: impl FnOnce(&mut switchboard::Settings)) -> TestServer {
    let mut s = common::settings();
    s.server.admin_public = true;
    s.hooks.events_url = app.url("/events");
    s.hooks.secret = SECRET.to_owned();
    s.cluster.unsubscribe_linger_ms = 300;
    s.cluster.node_name = "solo".to_owned();
    edit(&mut s);
    TestServer::start(s)
}

fn stats(addr: SocketAddr) -> Value {
    request(addr, "GET", "/stats", &[], b"").unwrap().json()
}

fn open(addr: SocketAddr, target: &str) -> StreamClient {
    let mut c = StreamClient::open_raw(addr, &format!("GET {target} HTTP/1.1\r\nhost: t\r\n\r\n"));
    assert_eq!(c.status, 200, "{target}");
    c.line();
    c
}

/// One process: an id is occupied by its first stream and vacated once
/// its last has been gone for the linger (a stream back within it changes
/// nothing); each batch is signed; a namespace that asks gets each stream
/// joining and leaving with its token's `sub`, and ids outside it only
/// what `hooks.events` names.
#[test]
fn one_process_sends_occupied_vacated_and_stream_events_signed() {
    let app = receiver("webhooks-single");
    let key = "a-subscriber-secret";
    let srv = single(&app, |s| {
        s.auth.subscribe_secret = key.to_owned();
        s.namespaces.insert(
            "chat".to_owned(),
            switchboard::config::NamespaceSettings {
                token_required: Some(true),
                webhooks: Some("id_occupied, id_vacated, stream_joined, stream_left".to_owned()),
                ..Default::default()
            },
        );
        s.namespaces.insert(
            "quiet".to_owned(),
            switchboard::config::NamespaceSettings {
                token_required: Some(false),
                webhooks: Some(String::new()),
                ..Default::default()
            },
        );
    });
    // A user's token for the ids it may open.
    let token = |sub: &str| {
        use jsonwebtoken::{EncodingKey, Header, encode};
        let exp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 600;
        let claims = serde_json::json!({ "sub": sub, "ids": ["room", "chat:1"], "exp": exp });
        encode(
            &Header::default(),
            &claims,
            &EncodingKey::from_secret(key.as_bytes()).unwrap(),
        )
        .unwrap()
    };
    // Outside any namespace: occupied and vacated only (hooks.events).
    let (a, b) = (
        open(srv.addr, &format!("/test/room?token={}", token("x"))),
        open(srv.addr, &format!("/test/room?token={}", token("y"))),
    );
    assert_eq!(settled(&app, "room", 1), ["id_occupied@solo"]);
    drop(a);
    std::thread::sleep(Duration::from_millis(100));
    drop(b);
    // Back within the linger: still occupied.
    std::thread::sleep(Duration::from_millis(100));
    let again = open(srv.addr, &format!("/test/room?token={}", token("x")));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(of(&app, "room"), ["id_occupied@solo"]);
    drop(again);
    assert_eq!(settled(&app, "room", 2), ["id_occupied@solo", "id_vacated@solo"]);

    // The chat namespace: every stream, with its sub (chunked, and SSE
    // with its token in the Authorization header).
    let alice = open(srv.addr, &format!("/test/chat:1?token={}", token("alice")));
    let bob = StreamClient::open_raw(
        srv.addr,
        &format!(
            "GET /test/chat:1 HTTP/1.1\r\nhost: t\r\naccept: text/event-stream\r\nauthorization: Bearer {}\r\n\r\n",
            token("bob")
        ),
    );
    assert_eq!(bob.status, 200);
    let got = settled(&app, "chat:1", 3);
    assert_eq!(got[0], "stream_joined@solo/alice", "{got:?}");
    assert!(got[1..].contains(&"id_occupied@solo".to_owned()), "{got:?}");
    assert!(got[1..].contains(&"stream_joined@solo/bob".to_owned()), "{got:?}");
    drop(alice);
    drop(bob);
    let got = settled(&app, "chat:1", 6);
    assert_eq!(got.len(), 6, "{got:?}");
    assert!(
        got[3..5].contains(&"stream_left@solo/alice".to_owned()),
        "{got:?}"
    );
    assert!(got[3..5].contains(&"stream_left@solo/bob".to_owned()), "{got:?}");
    assert_eq!(got[5], "id_vacated@solo", "{got:?}");

    // A namespace that sends none.
    drop(open(srv.addr, "/test/quiet:1"));
    std::thread::sleep(Duration::from_millis(800));
    assert!(of(&app, "quiet:1").is_empty());
    let s = stats(srv.addr);
    let hooks = &s["hooks"];
    assert_eq!(hooks["events_sent"], events(&app).len(), "{hooks}");
    assert_eq!(hooks["events_queued"], hooks["events_sent"], "{hooks}");
    assert_eq!(hooks["events_dropped"], 0, "{hooks}");
    assert_eq!(hooks["events_pending"], 0, "{hooks}");
}

/// A server that stops vacates its ids at once (not a linger later, when
/// it is gone) and sends what is queued before it exits.
#[test]
fn a_stopping_server_vacates_its_ids_and_sends_what_is_queued() {
    let app = receiver("webhooks-stop");
    let mut srv = single(&app, |s| s.cluster.unsubscribe_linger_ms = 60_000);
    let _held = [open(srv.addr, "/test/bye"), open(srv.addr, "/test/bye")];
    assert_eq!(settled(&app, "bye", 1), ["id_occupied@solo"]);
    srv.shutdown();
    assert_eq!(of(&app, "bye"), ["id_occupied@solo", "id_vacated@solo"]);
}

/// An endpoint that hangs or fails never slows a stream or a publish:
/// events wait in the queue (bounded: past it they are dropped, counted,
/// logged) and are retried; once the endpoint answers, every event
/// queued is delivered, in order. A batch it refuses with a 4xx is
/// dropped and counted, not retried.
#[test]
fn a_dead_endpoint_slows_nothing_and_loses_only_what_it_counts() {
    let app = receiver("webhooks-dead");
    app.write("events.mode", "hang");
    let srv = single(&app, |s| {
        s.hooks.timeout_ms = 200;
        s.hooks.events_queue = 20;
        s.cluster.unsubscribe_linger_ms = 10;
    });
    let started = Instant::now();
    for i in 0..30 {
        let id = format!("dead-{i}");
        let mut c = open(srv.addr, &format!("/test/{id}"));
        let sent = post(srv.addr, &format!("/send/{id}"), "hi");
        assert_eq!(sent.status, 200, "{}", sent.text());
        assert!(c.line().ends_with("'hi'"));
    }
    // 30 streams opened, each sent a message, in well under the time one
    // webhook try takes per event.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    wait_until(WAIT, "the queue overflowing", || {
        stats(srv.addr)["hooks"]["events_dropped"].as_u64() > Some(0)
    });
    wait_until(WAIT, "failed tries counted", || {
        stats(srv.addr)["hooks"]["events_failures"].as_u64() > Some(0)
    });
    let metrics = request(srv.addr, "GET", "/metrics", &[], b"").unwrap().text();
    assert!(
        metrics.contains("switchboard_webhook_events_dropped_total "),
        "{metrics}"
    );
    app.write("events.mode", "ok");
    wait_until(Duration::from_secs(40), "every queued event delivered", || {
        let h = &stats(srv.addr)["hooks"];
        h["events_pending"] == 0 && h["events_sent"] == h["events_queued"]
    });
    let h = stats(srv.addr)["hooks"].clone();
    let queued = h["events_queued"].as_u64().unwrap();
    assert_eq!(events(&app).len() as u64, queued, "{h}");
    assert_eq!(queued + h["events_dropped"].as_u64().unwrap(), 60, "{h}");
    // In order: each id's occupied before its vacated.
    for i in 0..30 {
        let got = of(&app, &format!("dead-{i}"));
        if got.len() == 2 {
            assert_eq!(got, ["id_occupied@solo", "id_vacated@solo"]);
        }
    }
    // A 4xx: dropped, counted, not retried.
    app.write("events.mode", "400");
    drop(open(srv.addr, "/test/refused"));
    wait_until(
        WAIT,
        "its occupied and vacated refused, counted, not pending",
        || {
            let h = &stats(srv.addr)["hooks"];
            h["events_rejected"] == 2 && h["events_pending"] == 0
        },
    );
    assert_eq!(of(&app, "refused").len(), 0);
}

/// Two nodes on one Redis: an id whose streams open and close on both
/// gets exactly one `id_occupied` (from the node that held it first) and
/// one `id_vacated` (from the node that held it last). A node killed with
/// SIGKILL has its ids vacated by the other once its place expires,
/// naming it.
#[test]
fn a_fleet_sends_one_occupied_and_one_vacated_and_vacates_a_dead_nodes_ids() {
    let redis = RedisServer::start();
    let app = receiver("webhooks-fleet");
    let p = prefix("webhooks");
    let node = |name: &str| {
        let mut cmd = binary(&redis, &p);
        cmd.env("SWITCHBOARD__HOOKS__EVENTS_URL", app.url("/events"))
            .env("SWITCHBOARD__HOOKS__SECRET", SECRET)
            .env("SWITCHBOARD__CLUSTER__UNSUBSCRIBE_LINGER_MS", "200")
            .env("SWITCHBOARD__CLUSTER__HEARTBEAT_INTERVAL_MS", "200")
            .env("SWITCHBOARD__CLUSTER__HEARTBEAT_TTL_MS", "1500")
            .env("SWITCHBOARD__DEBUG__FAULT_INJECTION", "true");
        binary_node(cmd, name)
    };
    let (_a, on_a) = node("a");
    let (b, on_b) = node("b");
    // b's Bus restarts first (its occupancy writes go on).
    let crashed = request(on_b, "POST", "/admin/crash/bus", &[], b"").unwrap();
    assert!(crashed.status < 300, "{}", crashed.text());
    // Opened on a, then b, twice over; closed on a first, b last.
    let first = open(on_a, "/test/shared");
    let got = settled(&app, "shared", 1);
    assert_eq!(got, ["id_occupied@a"]);
    let mut held = vec![
        open(on_b, "/test/shared"),
        open(on_a, "/test/shared"),
        open(on_b, "/test/shared"),
    ];
    std::thread::sleep(Duration::from_millis(500));
    drop(first);
    held.remove(1);
    std::thread::sleep(Duration::from_millis(600));
    // a has none left (past its linger); b still holds it.
    assert_eq!(of(&app, "shared"), ["id_occupied@a"]);
    drop(held);
    assert_eq!(settled(&app, "shared", 2), ["id_occupied@a", "id_vacated@b"]);
    // Again, from b first: one occupied, from b.
    let again = open(on_b, "/test/shared");
    assert_eq!(settled(&app, "shared", 3)[2], "id_occupied@b");
    let also = open(on_a, "/test/shared");
    drop(again);

    // b dies holding `orphan` and `shared` (a still holds `shared`).
    let _orphan = open(on_b, "/test/orphan");
    let _shared = open(on_b, "/test/shared");
    assert_eq!(settled(&app, "orphan", 1), ["id_occupied@b"]);
    b.signal("KILL");
    let got = settled(&app, "orphan", 2);
    assert_eq!(got, ["id_occupied@b", "id_vacated@b"]);
    // `shared` is still held by a: not vacated.
    assert_eq!(of(&app, "shared").len(), 3, "{:?}", of(&app, "shared"));
    drop(also);
    assert_eq!(settled(&app, "shared", 4)[3], "id_vacated@a");

    // c stops gracefully holding `graceful`: vacated once its streams
    // are gone (by c before it exits, or by a after c's place expires).
    let (c, on_c) = node("c");
    let _graceful = open(on_c, "/test/graceful");
    assert_eq!(settled(&app, "graceful", 1), ["id_occupied@c"]);
    c.signal("TERM");
    assert_eq!(settled(&app, "graceful", 2), ["id_occupied@c", "id_vacated@c"]);
}

/// Settings that cannot work stop the start, naming the key.
#[test]
fn webhook_settings_that_cannot_work_stop_the_start() {
    let run = |env: &[(&str, &str)]| {
        let mut cmd = std::process::Command::new(cluster::BIN);
        cmd.env("SWITCHBOARD__SERVER__PORT", "0")
            .env("SWITCHBOARD__HOOKS__EVENTS_URL", "http://127.0.0.1:9/events");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let no_secret = run(&[]);
    assert!(no_secret.contains("hooks.secret"), "{no_secret}");
    let unknown = run(&[
        ("SWITCHBOARD__HOOKS__SECRET", SECRET),
        ("SWITCHBOARD__HOOKS__EVENTS", "id_occupied, channel_vacated"),
    ]);
    assert!(
        unknown.contains("hooks.events") && unknown.contains("channel_vacated"),
        "{unknown}"
    );
    let namespaced = run(&[
        ("SWITCHBOARD__HOOKS__SECRET", SECRET),
        (
            "SWITCHBOARD__NAMESPACES__CHAT__WEBHOOKS",
            "stream_joined, member_added",
        ),
    ]);
    assert!(
        namespaced.contains("namespaces.*.webhooks") && namespaced.contains("member_added"),
        "{namespaced}"
    );
}

/// A write whose answer is lost (Redis stopped answering: the command timed
/// out, then ran once Redis did) is sent again under its number and gets
/// its first answer: the id is announced occupied exactly once, not never
/// (a plain retry would find this node already in the set and say
/// nothing).
#[test]
fn an_occupancy_write_whose_answer_was_lost_is_not_lost() {
    let redis = RedisServer::start();
    let app = receiver("webhooks-doubt");
    let p = prefix("doubt");
    let mut s = cluster::node_settings(&redis, &p, "a");
    s.hooks.events_url = app.url("/events");
    s.hooks.secret = SECRET.to_owned();
    s.cluster.command_timeout_ms = 200;
    s.cluster.heartbeat_interval_ms = 200;
    s.cluster.heartbeat_ttl_ms = 5000;
    let a = cluster::start_node(s);
    let pid = redis.pid().expect("redis pid");
    common::process::send_signal(pid, "STOP");
    // Its head comes at once; its welcome waits for the subscription.
    let c = StreamClient::open_raw(a.addr, "GET /test/doubt HTTP/1.1\r\nhost: t\r\n\r\n");
    assert_eq!(c.status, 200);
    // Writes time out meanwhile; Redis runs them once it goes on.
    std::thread::sleep(Duration::from_millis(1200));
    common::process::send_signal(pid, "CONT");
    assert_eq!(settled(&app, "doubt", 1), ["id_occupied@a"]);
    assert!(a.stats()["cluster"]["errors"].as_u64() > Some(0));
    drop(c);
    assert_eq!(settled(&app, "doubt", 2), ["id_occupied@a", "id_vacated@a"]);
}

/// The ids a reaper takes out of a dead node's wait in Redis until it has
/// sent them: a reap whose answer is lost (Redis stopped answering, then
/// ran it) still ends in `id_vacated`.
#[test]
fn a_reap_whose_answer_was_lost_still_vacates() {
    let redis = RedisServer::start();
    let app = receiver("webhooks-reap");
    let p = prefix("reap");
    let node = |name: &str, ttl: &str| {
        let mut cmd = binary(&redis, &p);
        cmd.env("SWITCHBOARD__HOOKS__EVENTS_URL", app.url("/events"))
            .env("SWITCHBOARD__HOOKS__SECRET", SECRET)
            .env("SWITCHBOARD__CLUSTER__HEARTBEAT_INTERVAL_MS", "200")
            .env("SWITCHBOARD__CLUSTER__HEARTBEAT_TTL_MS", ttl)
            .env("SWITCHBOARD__CLUSTER__COMMAND_TIMEOUT_MS", "200");
        binary_node(cmd, name)
    };
    // a outlives Redis's pause (its own place must not expire); b dies.
    let (_a, _) = node("a", "20000");
    let (b, on_b) = node("b", "1000");
    let _orphan = open(on_b, "/test/orphan");
    assert_eq!(settled(&app, "orphan", 1), ["id_occupied@b"]);
    b.signal("KILL");
    let pid = redis.pid().expect("redis pid");
    common::process::send_signal(pid, "STOP");
    // b's place expires meanwhile; a's reaps time out and run on CONT.
    std::thread::sleep(Duration::from_millis(1500));
    common::process::send_signal(pid, "CONT");
    assert_eq!(settled(&app, "orphan", 2), ["id_occupied@b", "id_vacated@b"]);
}
