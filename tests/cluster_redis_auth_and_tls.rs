//! Cluster mode over a real `redis-server`: how a node logs in to Redis and
//! checks who it talks to. The user and password of `cluster.redis_url`
//! (by ACL), and `rediss://` with a test authority (`cluster.redis_ca_file`),
//! where a node given another authority refuses Redis and still serves its
//! own streams.
//!
//! Sentinels over TLS are `tests/cluster_sentinel.rs`; the setup is
//! `tests/common/cluster.rs`.

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use std::time::Duration;

use serde_json::json;

use cluster::{
    WAIT, fleet_binary, get, id_channel, node_settings, open, post, prefix, start_node, wait_until,
};
use common::process::Proc;
use common::{RedisServer, TestServer};

/// The pub/sub link authenticates as the URL says (user and password, by
/// ACL): a node logged in as its own user gets a message from another node;
/// a node with a wrong password never becomes ready, counts its errors, and
/// still serves its own streams.
#[test]
fn the_bus_logs_in_with_the_urls_user_and_password() {
    let redis = RedisServer::start();
    let acl = redis.command(&["ACL", "SETUSER", "sb", "on", ">s3cret", "~*", "&*", "+@all"]);
    assert_eq!(acl, common::Resp::Simple("OK".into()), "{acl:?}");
    let p = prefix("auth");
    let user_url = redis.url().replace("redis://", "redis://sb:s3cret@");
    let mut s = node_settings(&redis, &p, "user");
    s.cluster.redis_url = user_url;
    let with_user = start_node(s);
    let other = start_node(node_settings(&redis, &p, "other"));
    let mut far = open(with_user.addr, "authed");
    assert_eq!(redis.wait_numsub(&id_channel(&p, "authed"), 1, WAIT), 1);
    let r = post(other.addr, "/send/authed", "logged in");
    assert_eq!(
        r.json_sans_event(),
        json!({"id": "authed", "delivered": 0, "nodes": 1})
    );
    assert_eq!(far.line(), "Recvd msg #1: 'logged in'");

    let mut s = node_settings(&redis, &p, "wrong");
    s.cluster.redis_url = redis.url().replace("redis://", "redis://sb:nope@");
    let wrong = TestServer::start(s);
    wait_until(WAIT, "errors counted with a wrong password", || {
        wrong.get("/stats").json()["cluster"]["errors"].as_u64() > Some(1)
    });
    assert_eq!(wrong.get("/readyz").status, 503);
    let mut local = open(wrong.addr, "local");
    let r = post(wrong.addr, "/send/local", "here");
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(local.line(), "Recvd msg #1: 'here'");
}

/// Issue 25: Redis over TLS (`rediss://`, as managed Redis services
/// require), with certificates a test authority signed. Two nodes that
/// trust that authority (`cluster.redis_ca_file`) route to each other's
/// streams through it; a node given another authority is refused by its
/// own check of Redis's certificate: it says so in its log, is not ready,
/// and still delivers its own streams' messages (answering 503).
#[test]
fn nodes_route_over_tls_and_a_wrong_authority_is_refused() {
    let dir = std::env::temp_dir().join(format!("sbt-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = common::make_certificates(&dir, "good");
    let other = common::make_certificates(&dir, "other");
    let (cert, key, ca) = (
        good.cert.display().to_string(),
        good.key.display().to_string(),
        good.ca.display().to_string(),
    );
    let (redis, tls_port) = RedisServer::start_with_tls_port(|tls_port| {
        vec![
            "--tls-port".to_owned(),
            tls_port.to_string(),
            "--tls-cert-file".to_owned(),
            cert.clone(),
            "--tls-key-file".to_owned(),
            key.clone(),
            "--tls-ca-cert-file".to_owned(),
            ca.clone(),
            "--tls-auth-clients".to_owned(),
            "no".to_owned(),
        ]
    });
    let p = prefix("tls");
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let node = |name: &str, ca: &std::path::Path| {
        let mut cmd = fleet_binary(&p);
        cmd.env("SWITCHBOARD__CLUSTER__REDIS_URL", &url)
            .env("SWITCHBOARD__CLUSTER__REDIS_CA_FILE", ca)
            .env("SWITCHBOARD__CLUSTER__NODE_NAME", name)
            .env("SWITCHBOARD__CLUSTER__RECONNECT_MAX_MS", "500");
        let p = Proc::spawn(cmd);
        let addr = p.wait_listening()[0];
        (p, addr)
    };
    let (a, a_addr) = node("a", &good.ca);
    let (b, b_addr) = node("b", &good.ca);
    for (p, addr) in [(&a, a_addr), (&b, b_addr)] {
        wait_until(Duration::from_secs(10), "a node over TLS ready", || {
            get(addr, "/readyz").status == 200
        });
        assert!(p.log_contains("\"bus_up\""), "{}", p.log_text());
    }
    let mut far = open(a_addr, "secret");
    assert_eq!(redis.wait_numsub(&id_channel(&p, "secret"), 1, WAIT), 1);
    let r = post(b_addr, "/send/secret", "over tls");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(far.line(), "Recvd msg #1: 'over tls'");
    // Both nodes' links are subscribed, through the TLS port (the only
    // one they were given).
    let clients = redis.command(&["CLIENT", "LIST"]).text().unwrap();
    assert!(
        clients.lines().filter(|l| l.contains("cmd=subscribe")).count() >= 2,
        "{clients}"
    );

    let (c, c_addr) = node("c", &other.ca);
    let refused = c.wait_event("bus_down", Duration::from_secs(10), |_| true);
    let reason = refused.to_string();
    assert!(
        reason.contains("TLS with 127.0.0.1") && reason.contains("UnknownIssuer"),
        "{reason}"
    );
    assert_eq!(get(c_addr, "/readyz").status, 503);
    // Its command connection (redis-rs's TLS) is refused too: no heartbeat.
    let beat = redis.command(&["EXISTS", &format!("{p}:node:c")]);
    assert_eq!(beat.int(), Some(0), "{beat:?}");
    assert_eq!(redis.command(&["EXISTS", &format!("{p}:node:a")]).int(), Some(1));
    let mut local = open(c_addr, "alone");
    let r = post(c_addr, "/send/alone", "local only");
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(local.line(), "Recvd msg #1: 'local only'");
    drop((a, b, c));
    let _ = std::fs::remove_dir_all(&dir);
}
