//! `switchboard --processes N` over a real `redis-server`: a parent and N
//! children on one port. Streams spread over the children and one send
//! reaches them all; a killed child is restarted; SIGTERM drains every
//! stream and exits 0; SIGKILL to the parent takes the children with it;
//! SIGHUP is passed on (TLS certificates reloaded); and the refusals: no
//! `cluster.redis_url`, port 0, a second fleet on the port, the flag over
//! the configuration file.
//!
//! The setup, [`processes`] among it, is `tests/common/cluster.rs`.

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use cluster::{
    BIN, HeldPort, WAIT, binary, cluster_pids, fleet_is_up, get, id_channel, open, parent_of, post, prefix,
    processes, wait_cluster_of, wait_until,
};
use common::process::{Proc, send_signal};
use common::{RedisServer, StreamClient, request};

/// `--processes 3`: 300 streams of one id spread over three child processes
/// (as /cluster shows them), the parent's log names those pids, and one send
/// to the id reaches each of the 300 exactly once.
#[test]
fn three_processes_share_300_streams_and_one_send_reaches_all() {
    let redis = RedisServer::start();
    let p = prefix("procs3");
    let (parent, addr) = processes(&redis, &p, 3);
    let mut streams: Vec<StreamClient> = (0..300).map(|_| open(addr, "shared")).collect();
    let cl = wait_cluster_of(&parent, addr, WAIT, "300 streams over three nodes", |c| {
        c["totals"]["streams"] == 300
    });
    let per_node: Vec<u64> = cl["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["streams"].as_u64().unwrap())
        .collect();
    assert_eq!(per_node.len(), 3, "{cl}");
    assert!(per_node.iter().all(|&s| s > 0), "{cl}");
    assert_eq!(per_node.iter().sum::<u64>(), 300, "{cl}");
    let pids = cluster_pids(&cl);
    assert_eq!(pids.len(), 3, "{cl}");
    for &pid in &pids {
        assert_eq!(parent_of(pid), Some(u64::from(parent.pid())), "{pid} is a child");
    }
    let logged: BTreeSet<u64> = parent
        .log_fields("started server process")
        .iter()
        .map(|f| f["pid"].as_u64().unwrap())
        .collect();
    assert_eq!(logged, pids, "the pids logged at start are the nodes");

    assert_eq!(redis.wait_numsub(&id_channel(&p, "shared"), 3, WAIT), 3);
    let r = post(addr, "/send/shared", "to all 300");
    assert_eq!(r.status, 200, "{}", r.text());
    let answer = r.json();
    assert_eq!(answer["nodes"], 2, "{answer}");
    assert!(
        per_node.contains(&answer["delivered"].as_u64().unwrap()),
        "{answer} {cl}"
    );
    for s in &mut streams {
        assert_eq!(s.line(), "Recvd msg #1: 'to all 300'");
    }
    let r = post(addr, "/send/shared", "and again");
    assert_eq!(r.json()["nodes"], 2);
    for s in &mut streams {
        assert_eq!(s.line(), "Recvd msg #2: 'and again'");
    }
}

/// A child killed with SIGKILL is restarted by the parent: a new child pid
/// appears in /cluster, the dead one leaves, and the parent lives on.
#[test]
fn a_killed_child_process_is_restarted() {
    let redis = RedisServer::start();
    let p = prefix("respawn");
    let (mut parent, addr) = processes(&redis, &p, 2);
    let before = cluster_pids(&wait_cluster_of(&parent, addr, WAIT, "two nodes", |c| {
        c["totals"]["nodes"] == 2
    }));
    let victim = *before.iter().next().unwrap();
    assert_eq!(
        parent_of(victim),
        Some(u64::from(parent.pid())),
        "{victim} is a child of the parent this test started"
    );
    send_signal(victim as u32, "KILL");

    let cl = wait_cluster_of(&parent, addr, Duration::from_secs(10), "a new child pid", |c| {
        cluster_pids(c).iter().any(|pid| !before.contains(pid))
    });
    let fresh: Vec<u64> = cluster_pids(&cl).difference(&before).copied().collect();
    assert_eq!(fresh.len(), 1, "{cl}");
    assert_eq!(parent_of(fresh[0]), Some(u64::from(parent.pid())));
    wait_cluster_of(
        &parent,
        addr,
        Duration::from_secs(4),
        "the killed pid leaves",
        |c| !cluster_pids(c).contains(&victim) && c["totals"]["nodes"] == 2,
    );
    assert!(
        parent.child.try_wait().unwrap().is_none(),
        "the parent is still running"
    );
    let restarts = parent.log_fields("server process exited; restarting");
    assert_eq!(restarts.len(), 1, "{}", parent.log_text());
    assert_eq!(restarts[0]["restarts"], 1, "{}", parent.log_text());
    // The restarted child serves: streams spread over both again.
    let _streams: Vec<StreamClient> = (0..20).map(|i| open(addr, &format!("r{i}"))).collect();
    wait_cluster_of(&parent, addr, WAIT, "both children hold streams", |c| {
        spread_over_every_node(c, 20)
    });
}

/// SIGTERM to the parent of `--processes 2`: every stream, on either child,
/// ends with the final zero-length chunk, the children are gone and the
/// parent exits 0.
#[test]
fn sigterm_to_the_parent_ends_every_stream_and_exits_zero() {
    let redis = RedisServer::start();
    let p = prefix("term");
    let (mut parent, addr) = processes(&redis, &p, 2);
    let mut streams: Vec<StreamClient> = (0..20).map(|i| open(addr, &format!("t{i}"))).collect();
    let cl = wait_cluster_of(&parent, addr, WAIT, "both children hold streams", |c| {
        spread_over_every_node(c, 20)
    });
    let children = cluster_pids(&cl);

    parent.signal("TERM");
    for s in &mut streams {
        assert_eq!(
            s.read_to_end().unwrap(),
            Vec::<String>::new(),
            "final zero-length chunk"
        );
    }
    let status = parent.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "{status:?}; log:\n{}", parent.log_text());
    for pid in children {
        wait_until(WAIT, &format!("child {pid} gone"), || parent_of(pid).is_none());
    }
}

/// A fleet parent killed with SIGKILL takes its children with it (they get
/// SIGTERM from the kernel and drain): no orphan keeps serving the port.
#[test]
fn children_end_when_the_parent_is_killed() {
    let redis = RedisServer::start();
    let p = prefix("orphans");
    let (parent, addr) = processes(&redis, &p, 2);
    let children = cluster_pids(&get(addr, "/cluster").json());
    assert_eq!(children.len(), 2);
    parent.signal("KILL");
    let running = |pid: &u64| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
        })
    };
    wait_until(WAIT, "both children gone", || !children.iter().any(running));
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "something still listens on {addr}"
    );
}

/// A `--processes 2` fleet passes SIGHUP on: every process reads its TLS
/// certificate again (two `tls_reloaded` lines), so whichever process the
/// kernel hands a connection to serves the new one. The parent does not
/// die of the signal.
#[test]
fn a_fleet_passes_sighup_on_and_every_process_reloads_its_certificate() {
    let redis = RedisServer::start();
    let dir = std::env::temp_dir().join(format!("switchboard-fleet-hup-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let first = common::make_certificates(&dir, "first");
    let second = common::make_certificates(&dir, "second");
    let (cert, key) = (dir.join("served.crt"), dir.join("served.key"));
    std::fs::copy(&first.cert, &cert).unwrap();
    std::fs::copy(&first.key, &key).unwrap();
    let fleet = |ports: &[u16]| {
        let (port, tls_port) = (ports[0], ports[1]);
        let mut cmd = binary(&redis, &prefix("fleethup"));
        cmd.args(["--processes", "2"])
            .env("SWITCHBOARD__SERVER__PORT", port.to_string())
            .env("SWITCHBOARD__SERVER__EXTRA_PORTS", tls_port.to_string())
            .env("SWITCHBOARD__SERVER__TLS_PORTS", tls_port.to_string())
            .env("SWITCHBOARD__SERVER__TLS_CERT_FILE", &cert)
            .env("SWITCHBOARD__SERVER__TLS_KEY_FILE", &key);
        cmd
    };
    // Up once both children are in /cluster.
    let (mut parent, ports) = Proc::start_on_free_ports(2, fleet, |p, ports| fleet_is_up(p, ports[0], 2));
    let tls_port = ports[1];
    let curl = |ca: &std::path::Path| {
        Command::new("curl")
            .args(["-sS", "--max-time", "10", "--cacert"])
            .arg(ca)
            .arg(format!("https://127.0.0.1:{tls_port}/dispatcher"))
            .output()
            .expect("curl")
            .status
            .success()
    };
    assert!(curl(&first.ca));
    std::fs::copy(&second.cert, &cert).unwrap();
    std::fs::copy(&second.key, &key).unwrap();
    parent.signal("HUP");
    wait_until(Duration::from_secs(10), "both processes reloaded", || {
        parent.events("tls_reloaded").len() == 2
    });
    // Ten new connections, spread by the kernel: every one gets the new
    // certificate.
    for _ in 0..10 {
        assert!(curl(&second.ca), "an old certificate was served");
    }
    assert!(parent.child_alive(), "the parent survived SIGHUP");
    drop(parent);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without TLS a SIGHUP to a fleet changes nothing: every process logs it
/// and keeps serving (before, the children died of it and every stream
/// with them), and a stream held across it still gets its messages.
#[test]
fn a_fleet_without_tls_survives_sighup_with_its_streams() {
    let redis = RedisServer::start();
    let (mut parent, addr) = processes(&redis, &prefix("hupplain"), 2);
    let mut held = StreamClient::open(addr, "kept");
    held.line();
    parent.signal("HUP");
    wait_until(
        Duration::from_secs(10),
        "both processes logged the SIGHUP",
        || {
            parent
                .log_fields("SIGHUP: no TLS certificate to reload; nothing changes")
                .len()
                == 2
        },
    );
    assert!(parent.events("process_exit").is_empty(), "{}", parent.log_text());
    assert!(parent.child_alive());
    // Published through whichever process the kernel picks (`delivered`
    // counts only that process's own streams): the held stream gets it.
    let sent = request(addr, "POST", "/send/kept", &[], b"after hup").unwrap();
    assert_eq!(sent.status, 200, "{}", sent.text());
    assert!(held.message().ends_with("'after hup'"));
}

/// `--processes 2` needs `cluster.redis_url`: without it the binary exits
/// non-zero at once and says so; with port 0 it is refused too.
#[test]
fn processes_without_redis_url_or_with_port_zero_are_refused() {
    // A port this test holds: the binary must refuse before it binds one.
    let held = HeldPort::new();
    let port = held.port.to_string();
    let mut cmd = Command::new(BIN);
    cmd.args(["--processes", "2"])
        .env("SWITCHBOARD__SERVER__PORT", &port);
    let mut p = Proc::spawn(cmd);
    let started = Instant::now();
    let status = p.wait_exit(Duration::from_secs(15));
    assert!(!status.success(), "{status:?}");
    assert!(started.elapsed() < Duration::from_secs(15));
    wait_until(WAIT, "stderr read", || p.log_text().contains("cluster.redis_url"));

    let redis = RedisServer::start();
    let mut cmd = Command::new(BIN);
    cmd.args(["--processes", "2"])
        .env("SWITCHBOARD__SERVER__PORT", "0")
        .env("SWITCHBOARD__CLUSTER__REDIS_URL", redis.url());
    let mut p = Proc::spawn(cmd);
    let status = p.wait_exit(Duration::from_secs(15));
    assert!(!status.success(), "port 0 with --processes 2 was accepted");
}

/// A second fleet on a port a fleet already holds is refused at start: it
/// would share the first one's connections and route none of its messages.
#[test]
fn a_second_fleet_on_the_same_port_is_refused() {
    let redis = RedisServer::start();
    let p = prefix("twofleets");
    let (_first, addr) = processes(&redis, &p, 2);
    let mut cmd = binary(&redis, &prefix("twofleets-other"));
    cmd.args(["--processes", "2"])
        .env("SWITCHBOARD__SERVER__PORT", addr.port().to_string());
    let mut second = Proc::spawn(cmd);
    let status = second.wait_exit(Duration::from_secs(5));
    assert!(!status.success(), "{status:?}");
    wait_until(WAIT, "the reason in the log", || {
        second
            .log_text()
            .contains("another switchboard, or another fleet")
    });
}

/// `--processes 1` wins over a configuration file that asks for 4 (and has
/// no Redis): the flag is applied before the settings are checked.
#[test]
fn the_processes_flag_overrides_the_config_file() {
    let dir = std::env::temp_dir().join(format!("sb-flag-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("four.toml");
    std::fs::write(&file, "[server]\nprocesses = 4\nport = 0\n").unwrap();
    let mut cmd = Command::new(BIN);
    cmd.arg("--config").arg(&file).args(["--processes", "1"]);
    let p = Proc::spawn(cmd);
    let addr = p.wait_listening()[0];
    assert_eq!(get(addr, "/healthz").status, 200);
    let mut cmd = Command::new(BIN);
    cmd.arg("--config").arg(&file);
    let mut refused = Proc::spawn(cmd);
    assert!(!refused.wait_exit(Duration::from_secs(3)).success());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `/cluster` counts `streams` in all, and every node holds some of them.
fn spread_over_every_node(cluster: &Value, streams: u64) -> bool {
    cluster["totals"]["streams"] == streams
        && cluster["nodes"]
            .as_array()
            .is_some_and(|nodes| nodes.iter().all(|n| n["streams"].as_u64() > Some(0)))
}
