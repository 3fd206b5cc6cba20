//! The real `switchboard` binary as a process: configuration layering, extra
//! ports, SIGTERM, and the open-file limit.

mod common;

use std::io::BufReader;
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use common::process::Proc;
use common::{StreamClient, request};

const BIN: &str = env!("CARGO_BIN_EXE_switchboard");

/// A running binary and its listening addresses.
struct Running {
    p: Proc,
    addrs: Vec<SocketAddr>,
    /// The internal listener (a free port: `Proc` sets `server.admin_port` 0).
    admin: SocketAddr,
}

impl Running {
    /// Starts `cmd` (JSON logs) and waits for "listening".
    fn start(cmd: Command) -> Running {
        Running::of(Proc::spawn(cmd))
    }

    /// A process started (`Proc::spawn`), once it listens.
    fn of(p: Proc) -> Running {
        let addrs = p.wait_listening();
        let admin = p.wait_admin();
        Running { p, addrs, admin }
    }

    fn stats(&self) -> serde_json::Value {
        request(self.admin, "GET", "/stats", &[], b"").unwrap().json()
    }
}

impl std::ops::Deref for Running {
    type Target = Proc;

    fn deref(&self) -> &Proc {
        &self.p
    }
}

impl std::ops::DerefMut for Running {
    fn deref_mut(&mut self) -> &mut Proc {
        &mut self.p
    }
}

fn server() -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env("SWITCHBOARD__SERVER__PORT", "0");
    cmd
}

#[test]
fn sigterm_ends_streams_with_a_final_chunk_and_exits_zero() {
    let mut cmd = server();
    cmd.env("SWITCHBOARD__SERVER__SHUTDOWN_TIMEOUT_MS", "30000");
    let mut p = Running::start(cmd);
    let mut a = StreamClient::open(p.addrs[0], "term");
    a.line();
    let started = Instant::now();
    p.signal("TERM");
    assert_eq!(
        a.read_to_end().unwrap(),
        Vec::<String>::new(),
        "final zero-length chunk"
    );
    let status = p.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "{status:?}");
    // Streams that held shutdown up would take its 30 s timeout.
    assert!(started.elapsed() < Duration::from_secs(15));
    assert!(p.log_contains("SIGTERM"));
    assert!(p.log_contains("shutdown complete"));
}

#[test]
fn sigint_with_nothing_open_exits_zero() {
    let mut p = Running::start(server());
    p.signal("INT");
    assert!(p.wait_exit(Duration::from_secs(5)).success());
}

#[test]
fn environment_overrides_the_config_file_which_overrides_defaults() {
    let dir = std::env::temp_dir().join(format!("switchboard-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("test.toml");
    std::fs::write(&file, "[stream]\ntick_interval_ms = 600000\nmax_id_len = 4\n").unwrap();
    let mut cmd = server();
    cmd.arg("--config").arg(&file);
    cmd.env("SWITCHBOARD__STREAM__TICK_INTERVAL_MS", "100");
    cmd.env("SWITCHBOARD__AUTH__PUBLISH_TOKEN", "0071e3");
    let p = Running::start(cmd);
    // From the file: ids of at most 4 characters.
    let r = request(p.addrs[0], "GET", "/test/abcde", &[], b"").unwrap();
    assert_eq!(r.status, 400);
    // From the environment: ticks every 100 ms, not every 10 minutes.
    let mut c = StreamClient::open(p.addrs[0], "abcd");
    c.line();
    assert_eq!(c.line(), "Chunk 1 for id abcd");
    // A numeric-looking token is kept exactly as written.
    let send = |token: &str| {
        let auth = format!("Bearer {token}");
        request(
            p.addrs[0],
            "POST",
            "/send/abcd",
            &[("authorization", &auth)],
            b"m",
        )
        .unwrap()
    };
    assert_eq!(send("71000").status, 401);
    assert_eq!(send("0071e3").status, 200);
    assert!(!p.log_contains("0071e3"), "the token is never logged");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_configuration_is_refused_with_the_key_named() {
    for (key, value, expect) in [
        ("SWITCHBOARD__SERVER__PORT", "eighty", "port"),
        ("SWITCHBOARD__SERVER__PROT", "80", "prot"),
        (
            "SWITCHBOARD__SERVER__EXTRA_PORTS",
            "9000-8000",
            "server.extra_ports",
        ),
        ("SWITCHBOARD__LOG__FORMAT", "xml", "xml"),
    ] {
        let out = Command::new(BIN).env(key, value).output().unwrap();
        assert!(!out.status.success(), "{key}={value} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expect), "{key}={value}: {err}");
    }
    let out = Command::new(BIN)
        .args(["--config", "/nonexistent.toml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// `server.reuse_port`: two processes on one port share its connections;
/// without it the second cannot bind and says where.
#[test]
fn reuse_port_lets_two_processes_share_a_port() {
    // Each process has its own internal listener (admin_port 0), to read
    // its own /stats.
    let with_port = |port: u16| {
        let mut cmd = server();
        cmd.env("SWITCHBOARD__SERVER__PORT", port.to_string())
            .env("SWITCHBOARD__SERVER__REUSE_PORT", "true");
        cmd
    };
    let listening = |p: &Proc, _: &[u16]| !p.log_fields("switchboard listening").is_empty();
    let (first, ports) = Proc::start_on_free_ports(1, |p| with_port(p[0]), listening);
    let shared = ports[0];
    let a = Running::of(first);
    let start = || Running::start(with_port(shared));
    let b = start();
    let streams: Vec<StreamClient> = (0..40)
        .map(|i| StreamClient::open(a.addrs[0], &format!("rp{i}")))
        .collect();
    assert!(streams.iter().all(|s| s.status == 200));
    let active = |p: &Running| {
        request(p.admin, "GET", "/stats", &[], b"").unwrap().json()["connections"]["active"]
            .as_u64()
            .unwrap()
    };
    let (on_a, on_b) = (active(&a), active(&b));
    assert_eq!(on_a + on_b, 40);
    assert!(
        on_a > 0 && on_b > 0,
        "the kernel spread none to one of them: {on_a} / {on_b}"
    );

    // Without reuse_port the port is taken.
    let out = Command::new(BIN)
        .env("SWITCHBOARD__SERVER__PORT", shared.to_string())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("listening on 127.0.0.1:{shared}")), "{err}");
}

#[test]
fn the_address_file_names_the_ports_it_took() {
    let dir = std::env::temp_dir().join(format!("switchboard-address-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("addresses");
    let _ = std::fs::remove_file(&file);
    let mut cmd = server();
    cmd.env("SWITCHBOARD__SERVER__ADDRESS_FILE", &file);
    let mut p = Running::start(cmd);
    // Written as the "listening" line is logged: at most a moment later.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !file.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let text = std::fs::read_to_string(&file).expect("address file written");
    let lines: Vec<&str> = text.lines().collect();
    let expected: Vec<String> = p
        .addrs
        .iter()
        .map(|a| format!("public {a}"))
        .chain([format!("admin {}", p.admin)])
        .collect();
    assert_eq!(lines, expected);
    // Each address the file names serves.
    let public: SocketAddr = lines[0]["public ".len()..].parse().unwrap();
    let admin: SocketAddr = lines.last().unwrap()["admin ".len()..].parse().unwrap();
    assert_eq!(request(public, "GET", "/healthz", &[], b"").unwrap().status, 200);
    assert_eq!(request(admin, "GET", "/stats", &[], b"").unwrap().status, 200);
    p.signal("TERM");
    assert!(p.wait_exit(Duration::from_secs(10)).success());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn extra_ports_serve_the_same_server() {
    let (p, _) = Proc::start_on_free_ports(
        2,
        |free| {
            let mut cmd = server();
            cmd.env(
                "SWITCHBOARD__SERVER__EXTRA_PORTS",
                format!("{},{}", free[0], free[1]),
            );
            cmd
        },
        |p, _| !p.log_fields("switchboard listening").is_empty(),
    );
    let p = Running::of(p);
    assert_eq!(p.addrs.len(), 3);
    let mut c = StreamClient::open(p.addrs[2], "port");
    c.line();
    let r = request(p.addrs[1], "POST", "/send/port", &[], b"via another port").unwrap();
    assert_eq!(r.json()["delivered"], 1);
    assert_eq!(c.line(), "Recvd msg #1: 'via another port'");
}

#[test]
fn at_the_open_file_limit_streams_survive_and_accepting_resumes() {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &format!("ulimit -n 64 && exec {BIN}")]);
    cmd.env("SWITCHBOARD__SERVER__PORT", "0")
        .env("SWITCHBOARD__SERVER__WORKERS", "1")
        .env("SWITCHBOARD__STREAM__TICK_INTERVAL_MS", "200");
    let p = Running::start(cmd);
    let addr = p.addrs[0];

    // Open more streams than the server has descriptors for.
    let mut welcomed = Vec::new();
    let mut waiting = Vec::new();
    for i in 0..80 {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        std::io::Write::write_all(
            &mut s,
            format!("GET /test/f{i} HTTP/1.1\r\nhost: t\r\n\r\n").as_bytes(),
        )
        .unwrap();
        let mut r = BufReader::new(s);
        match common::read_head(&mut r) {
            Ok((200, _)) => welcomed.push(r),
            _ => waiting.push(r),
        }
        if waiting.len() == 3 {
            break;
        }
    }
    assert!(
        welcomed.len() > 20 && !waiting.is_empty(),
        "{} welcomed",
        welcomed.len()
    );
    assert!(p.log_contains("open-file limit reached"));
    let hit = &p.events("fd_limit")[0];
    assert!(hit["cause"].as_str().unwrap().contains("open files"), "{hit}");

    // Existing streams keep ticking.
    for r in welcomed.iter_mut().take(5) {
        r.get_mut()
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let first = common::read_chunk(r).unwrap().unwrap();
        assert!(
            String::from_utf8(first)
                .unwrap()
                .starts_with("Switchboard welcomes you!")
        );
        let tick = common::read_chunk(r).unwrap().unwrap();
        assert!(String::from_utf8(tick).unwrap().starts_with("Chunk 1 for id"));
    }

    // Free descriptors: the queued connections are accepted and served.
    welcomed.truncate(welcomed.len() - 30);
    let mut r = waiting.remove(0);
    r.get_mut()
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let (status, _) = common::read_head(&mut r).unwrap();
    assert_eq!(status, 200);
    drop(waiting);
    let stats = p.stats();
    assert!(stats["accept"]["fd_limit"].as_u64().unwrap() > 0, "{stats}");
    assert!(p.log_contains("accepting again"));
    assert!(p.events("fd_limit_cleared")[0]["paused_ms"].is_u64());
}

/// JSON logs: the notable events by their stable `event` names, a
/// summary of slow disconnects per interval rather than a line each, and
/// the rate limit: a storm of one error writes at most 20 lines per 10 s,
/// and the rest is counted and reported.
#[test]
fn json_logs_name_their_events_and_a_storm_is_rate_limited() {
    let mut cmd = server();
    cmd.env("SWITCHBOARD__DEBUG__FAULT_INJECTION", "true")
        .env("SWITCHBOARD__STREAM__MAX_PENDING_BYTES", "8192");
    let mut p = Running::start(cmd);
    let addr = p.addrs[0];
    let start = &p.events("start")[0];
    assert_eq!(start["pid"], p.pid(), "{start}");
    assert_eq!(start["version"], env!("CARGO_PKG_VERSION"));
    assert!(start["open_files"].as_u64().unwrap() > 64, "{start}");
    assert_eq!(p.events("bind")[0]["workers"].as_u64().map(|w| w > 0), Some(true));
    // Logged right after "listening", which the start waited for: this
    // test's log reader may not have it yet.
    p.wait_event("config", Duration::from_secs(5), |_| true);
    assert_eq!(p.events("config").len(), 1);

    // A storm: 60 Router crashes, each an actor_panic and a restart line.
    let crashes = 60;
    let storm = Instant::now();
    for _ in 0..crashes {
        let _ = request(p.admin, "POST", "/admin/crash/router", &[], b"");
    }
    // The answer comes once the handler has panicked; the restart follows.
    let deadline = Instant::now() + Duration::from_secs(5);
    while p.stats()["actors"]["router"]["restarts"] != crashes {
        assert!(Instant::now() < deadline, "{}", p.stats());
        std::thread::sleep(Duration::from_millis(20));
    }
    let windows = 1 + storm.elapsed().as_secs() / 10;
    let written = p.events("restart").len() as u64;
    assert!(written <= 20 * windows, "{written} restart lines");
    // Panic messages go through the log too, as JSON, under the same limit.
    let panics = p.events("panic");
    assert!(
        !panics.is_empty() && panics.len() as u64 <= 20 * windows,
        "{} panic lines",
        panics.len()
    );
    assert!(
        panics[0]["cause"].as_str().unwrap().contains("fault injection"),
        "{}",
        panics[0]
    );
    // The reports (every 10 s; the storm may straddle one) account for
    // every line.
    let reported = |p: &Running| -> u64 {
        p.events("log_suppressed")
            .iter()
            .filter(|f| {
                f["statement"]
                    .as_str()
                    .is_some_and(|s| s.starts_with("src/hub/router.rs:"))
            })
            .map(|f| f["lines"].as_u64().unwrap())
            .sum()
    };
    let deadline = Instant::now() + Duration::from_secs(25);
    while written + reported(&p) < crashes {
        assert!(
            Instant::now() < deadline,
            "suppressed lines not reported:\n{}",
            p.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        written + reported(&p),
        crashes,
        "written + suppressed = every restart"
    );
    assert!(written < crashes, "the limit held some back");
    assert_eq!(p.events("log_suppressed")[0]["window_s"], 10);
    let metrics = request(p.admin, "GET", "/metrics", &[], b"").unwrap().text();
    let suppressed: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("switchboard_log_lines_suppressed_total "))
        .expect("the suppressed counter")
        .parse()
        .unwrap();
    // Restart and actor_panic lines both; panic lines are limited too.
    let all_written = written + p.events("actor_panic").len() as u64 + p.events("panic").len() as u64;
    assert!(
        suppressed + all_written >= 3 * crashes,
        "{suppressed} suppressed, {all_written} written"
    );

    // A client that stops reading is cut; the log sums it up.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(&addr.into()).unwrap();
    let mut slow: TcpStream = sock.into();
    std::io::Write::write_all(&mut slow, b"GET /test/slowlog HTTP/1.1\r\nhost: t\r\n\r\n").unwrap();
    let msg = "x".repeat(4000);
    let mut sent = 0;
    while sent < 2000 && p.stats()["connections"]["slow_disconnects"] == 0 {
        let r = request(addr, "POST", "/send/slowlog", &[], msg.as_bytes()).unwrap();
        assert_eq!(r.status, 200);
        sent += 1;
    }
    let summary = p.wait_event("slow_disconnects", Duration::from_secs(15), |_| true);
    assert_eq!(summary["count"], 1, "{summary}");
    assert_eq!(summary["total"], 1, "{summary}");
    assert_eq!(summary["interval_s"], 10);
    drop(slow);

    p.signal("TERM");
    assert!(p.wait_exit(Duration::from_secs(10)).success());
    assert_eq!(p.events("signal")[0]["signal"], "SIGTERM");
    assert!(p.events("stop")[0]["streams"].is_u64());
    assert!(p.events("stopped")[0]["elapsed_ms"].is_u64());
    // Every line is JSON, and every line of switchboard's that is info or
    // louder names its event.
    for line in p.log_text().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        if v["target"].as_str().is_some_and(|t| t.starts_with("switchboard")) {
            assert!(v["fields"]["event"].is_string(), "no event: {line}");
        }
    }
}

/// `switchboard token` mints what the server, with the same secret from the
/// environment, lets in; a token for another id or from another secret is
/// refused with 401.
#[test]
fn token_subcommand_mints_tokens_the_server_accepts() {
    let mint = |args: &[&str]| {
        let out = Command::new(BIN)
            .arg("token")
            .args(args)
            .env("SWITCHBOARD__AUTH__SUBSCRIBE_SECRET", "shared-secret")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    let token = mint(&["--id", "tok", "--ttl", "1h"]);
    assert_eq!(token.split('.').count(), 3, "a JWT: {token}");
    let wrong_secret = mint(&["--id", "tok", "--secret", "other"]);
    let two = mint(&["--id", "a", "--id", "tok", "--ttl", "90s"]);

    let mut cmd = server();
    cmd.env("SWITCHBOARD__AUTH__SUBSCRIBE_SECRET", "shared-secret");
    let p = Running::start(cmd);
    let open = |path: &str| {
        let r = StreamClient::open_raw(p.addrs[0], &format!("GET {path} HTTP/1.1\r\nhost: t\r\n\r\n"));
        r.status
    };
    assert_eq!(open(&format!("/test/tok?token={token}")), 200);
    assert_eq!(open(&format!("/test/tok?token={two}")), 200);
    assert_eq!(open(&format!("/test/other?token={token}")), 401);
    assert_eq!(open(&format!("/test/tok?token={wrong_secret}")), 401);
    assert_eq!(open("/test/tok"), 401);

    // Without a secret there is nothing to sign with: a clear error.
    let out = Command::new(BIN).args(["token", "--id", "x"]).output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("auth.subscribe_secret is empty"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `auth.subscribe_public_key_file`: tokens an identity provider signs with
/// its private key (RS256 here) open streams; a token "signed" in HS256 with
/// the public key as its secret, or in another kind of key's algorithm, is
/// refused 401 with the reason. A key file that cannot be read, or that
/// holds a private key, stops the start with the setting named.
#[test]
fn an_identity_providers_public_key_lets_its_tokens_in() {
    use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/jwt");
    let read = |name: &str| std::fs::read(format!("{dir}/{name}")).unwrap();
    let sign = |alg: Algorithm, key: &EncodingKey| {
        let exp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 600;
        let claims = serde_json::json!({ "sub": "idp", "exp": exp, "iss": "https://id.example/" });
        encode(&Header::new(alg), &claims, key).unwrap()
    };
    let rs256 = sign(
        Algorithm::RS256,
        &EncodingKey::from_rsa_pem(&read("rsa.key.pem")).unwrap(),
    );
    let confused = sign(
        Algorithm::HS256,
        &EncodingKey::from_secret(&read("rsa.pub.pem")).unwrap(),
    );
    let es256 = sign(
        Algorithm::ES256,
        &EncodingKey::from_ec_pem(&read("p256.key.pem")).unwrap(),
    );

    let mut cmd = server();
    cmd.env(
        "SWITCHBOARD__AUTH__SUBSCRIBE_PUBLIC_KEY_FILE",
        format!("{dir}/rsa.pub.pem"),
    );
    let p = Running::start(cmd);
    // No audience set: any application's token from that provider would do.
    p.wait_event("token_audience_unset", Duration::from_secs(5), |_| true);
    let open = |token: &str| {
        let r = request(p.addrs[0], "GET", &format!("/test/idp?token={token}"), &[], b"").unwrap();
        (r.status, String::from_utf8_lossy(&r.body).into_owned())
    };
    let mut stream = StreamClient::open_raw(
        p.addrs[0],
        &format!("GET /test/idp?token={rs256} HTTP/1.1\r\nhost: t\r\n\r\n"),
    );
    assert_eq!(stream.status, 200);
    assert_eq!(stream.line(), "Switchboard welcomes you! Your Id: idp");
    let (status, body) = open(&confused);
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("token alg HS256 is not accepted"), "{body}");
    let (status, body) = open(&es256);
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("token alg ES256 is not accepted"), "{body}");

    for (path, expect) in [
        (format!("{dir}/missing.pem"), "cannot read"),
        (format!("{dir}/rsa.key.pem"), "private key"),
    ] {
        let out = server()
            .env("SWITCHBOARD__AUTH__SUBSCRIBE_PUBLIC_KEY_FILE", &path)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{path} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("auth.subscribe_public_key_file") && err.contains(expect),
            "{path}: {err}"
        );
    }
}
