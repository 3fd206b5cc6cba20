//! The client matrix: the HTTP, SSE and WebSocket clients people really use,
//! each a real process of its own language, against the real binary. Every
//! row opens a stream, waits for the welcome line, has the test publish a
//! message to its id, and must print that message. Then the seed's own load
//! client, the Erlang floodtest of the Mochiweb article, holds 2,000 streams.
//!
//! The clients live in `tests/clients/`. They need what `.ci/run` installs:
//! Debian's `erlang-nox` and a JDK (`default-jdk-headless`), curl and wget,
//! `pip install requests aiohttp sseclient-py websockets`, and `npm ci` in
//! `tests/clients/`. A missing one fails its row with that install command;
//! no row is ever skipped.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::process::Proc;

const BIN: &str = env!("CARGO_BIN_EXE_switchboard");

/// The folder of the client programs.
const CLIENTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients");

/// The subscriber secret of the server that needs tokens.
const SECRET: &str = "matrix-secret";

/// How long a client has to print the welcome (a JVM compiling a source
/// file, or Erlang starting, takes a few seconds on a busy machine).
const WELCOME_WITHIN: Duration = Duration::from_secs(60);

/// Starts the release of the binary under test with `env` on a free port.
fn server(env: &[(&str, &str)]) -> (Proc, SocketAddr) {
    let mut cmd = Command::new(BIN);
    cmd.env("SWITCHBOARD__SERVER__PORT", "0")
        .env("SWITCHBOARD__STREAM__TICK_INTERVAL_MS", "1000");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let (p, addrs) = Proc::start(cmd);
    (p, addrs[0])
}

/// One row of the matrix: a client program and how to run it.
struct Row {
    /// What the table calls it.
    name: &'static str,
    /// The transport it opens.
    transport: &'static str,
    /// The program and its arguments; the stream's URL is appended.
    argv: Vec<String>,
    /// What to install if the program is missing.
    install: &'static str,
}

fn row(name: &'static str, transport: &'static str, argv: &[&str], install: &'static str) -> Row {
    Row {
        name,
        transport,
        argv: argv.iter().map(|s| (*s).to_owned()).collect(),
        install,
    }
}

/// What a row's client printed.
struct Outcome {
    welcome: bool,
    message: bool,
    /// The first lines it printed (or why it could not start).
    said: Vec<String>,
}

/// A client process whose stdout lines arrive on a channel.
struct Client {
    child: Child,
    lines: mpsc::Receiver<String>,
    said: Vec<String>,
}

impl Client {
    fn start(argv: &[String]) -> std::io::Result<Client> {
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .current_dir(CLIENTS)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().expect("piped");
        let err = child.stderr.take().expect("piped");
        let tx2 = tx.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx2.send(format!("stderr: {l}"));
            }
        });
        Ok(Client {
            child,
            lines,
            said: Vec::new(),
        })
    }

    /// Waits for a printed line that `pred` accepts.
    fn wait_for(&mut self, within: Duration, pred: impl Fn(&str) -> bool) -> bool {
        let deadline = Instant::now() + within;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let hit = pred(&l);
                    if self.said.len() < 12 {
                        self.said.push(l);
                    }
                    if hit {
                        return true;
                    }
                }
                Err(_) => return false,
            }
        }
        false
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs one row against the server at `addr`: `url` is the stream's URL,
/// `id` its id.
fn run(row: &Row, addr: SocketAddr, url: &str, id: &str) -> Outcome {
    let mut argv = row.argv.clone();
    argv.push(url.to_owned());
    let mut client = match Client::start(&argv) {
        Ok(c) => c,
        Err(e) => {
            return Outcome {
                welcome: false,
                message: false,
                said: vec![format!(
                    "cannot run {}: {e}; install it: {}",
                    argv[0], row.install
                )],
            };
        }
    };
    let welcome = client.wait_for(WELCOME_WITHIN, |l| {
        l.ends_with(&format!("Switchboard welcomes you! Your Id: {id}"))
    });
    let mut message = false;
    if welcome {
        let text = format!("hello {}", row.name);
        let sent = common::request(addr, "POST", &format!("/send/{id}"), &[], text.as_bytes()).unwrap();
        assert_eq!(sent.status, 200, "{}", sent.text());
        message = client.wait_for(Duration::from_secs(10), |l| l.contains(&format!("'{text}'")));
    }
    if !welcome || !message {
        // Whatever else it says (an error, a stack trace) helps the reader.
        client.wait_for(Duration::from_millis(500), |_| false);
    }
    Outcome {
        welcome,
        message,
        said: client.said.clone(),
    }
}

fn python(kind: &str) -> Vec<&str> {
    vec!["python3", "clients.py", kind]
}

const PIP: &str = "pip install requests aiohttp sseclient-py websockets";
const NPM: &str = "npm ci (in tests/clients)";

/// Checks the Node packages are there before the rows need them.
fn node_packages_installed() -> bool {
    ["eventsource", "ws"]
        .iter()
        .all(|p| Path::new(CLIENTS).join("node_modules").join(p).exists())
}

/// A subscriber token for `ids`, about `bytes` long: an identity
/// provider's token with many ids is this long.
fn long_token(first: &str, bytes: usize) -> String {
    let mut ids = vec![first.to_owned()];
    while ids.iter().map(|i| i.len() + 3).sum::<usize>() * 4 / 3 < bytes {
        ids.push(format!("room-{:04}", ids.len()));
    }
    switchboard::token::mint(SECRET, &ids, Duration::from_secs(600)).unwrap()
}

#[test]
fn every_client_people_use_gets_its_stream() {
    assert!(
        node_packages_installed(),
        "the Node clients' packages are missing: {NPM}"
    );
    let (_open, addr) = server(&[]);
    let (_locked, locked_addr) = server(&[("SWITCHBOARD__AUTH__SUBSCRIBE_SECRET", SECRET)]);
    let http = |id: &str| format!("http://{addr}/test/{id}");
    let ws = |id: &str| format!("ws://{addr}/test/{id}");
    let rows: Vec<(Row, String, &str)> = vec![
        (
            row(
                "Erlang/OTP httpc ({stream, self})",
                "plain",
                &["escript", "httpc_stream.escript"],
                "apt-get install erlang-nox",
            ),
            http("erlang"),
            "erlang",
        ),
        (
            row(
                "Java java.net.http.HttpClient",
                "plain",
                &["java", "StreamClient.java"],
                "apt-get install default-jdk-headless",
            ),
            http("java"),
            "java",
        ),
        (
            row("curl", "plain", &["curl", "-sSN"], "apt-get install curl"),
            http("curl"),
            "curl",
        ),
        (
            row("wget", "plain", &["wget", "-qO-"], "apt-get install wget"),
            http("wget"),
            "wget",
        ),
        (
            row("Python requests", "plain", &python("requests"), PIP),
            http("requests"),
            "requests",
        ),
        (
            row("Python aiohttp", "plain", &python("aiohttp"), PIP),
            http("aiohttp"),
            "aiohttp",
        ),
        (
            row(
                "Node http",
                "plain",
                &["node", "clients.mjs", "http"],
                "apt-get install nodejs",
            ),
            http("nodehttp"),
            "nodehttp",
        ),
        (
            row(
                "Node fetch",
                "plain",
                &["node", "clients.mjs", "fetch"],
                "apt-get install nodejs",
            ),
            http("nodefetch"),
            "nodefetch",
        ),
        (
            row("Python sseclient-py", "SSE", &python("sseclient"), PIP),
            http("sseclient"),
            "sseclient",
        ),
        (
            row(
                "Node eventsource (npm)",
                "SSE",
                &["node", "clients.mjs", "eventsource"],
                NPM,
            ),
            http("eventsource"),
            "eventsource",
        ),
        (
            row(
                "curl, Accept: text/event-stream",
                "SSE",
                &["curl", "-sSN", "-H", "Accept: text/event-stream"],
                "apt-get install curl",
            ),
            http("curlsse"),
            "curlsse",
        ),
        (
            row("Python websockets", "WebSocket", &python("websockets"), PIP),
            ws("pyws"),
            "pyws",
        ),
        (
            row(
                "Node ws (npm), percent-escaped id",
                "WebSocket",
                &["node", "clients.mjs", "ws"],
                NPM,
            ),
            ws("%6Eodews"),
            "nodews",
        ),
    ];
    let token = long_token("tokenws", 2048);
    assert!(token.len() >= 2048, "{} bytes", token.len());
    let locked_rows: Vec<(Row, String, &str)> = vec![
        (
            row(
                "Python websockets, 2 KiB ?token=",
                "WebSocket",
                &python("websockets"),
                PIP,
            ),
            format!("ws://{locked_addr}/test/tokenws?token={token}"),
            "tokenws",
        ),
        (
            row(
                "Node ws (npm), 2 KiB ?token=",
                "WebSocket",
                &["node", "clients.mjs", "ws"],
                NPM,
            ),
            format!("ws://{locked_addr}/test/tokenws?token={token}"),
            "tokenws",
        ),
        (
            row(
                "Python requests, 2 KiB ?token=",
                "plain",
                &python("requests"),
                PIP,
            ),
            format!("http://{locked_addr}/test/tokenws?token={token}"),
            "tokenws",
        ),
    ];
    // Every row at once, each in a thread of its own.
    let outcomes: Vec<(String, &str, Outcome)> = std::thread::scope(|s| {
        let handles: Vec<_> = rows
            .iter()
            .map(|(r, url, id)| (r, s.spawn(move || run(r, addr, url, id))))
            .chain(
                locked_rows
                    .iter()
                    .map(|(r, url, id)| (r, s.spawn(move || run(r, locked_addr, url, id)))),
            )
            .collect();
        handles
            .into_iter()
            .map(|(r, h)| (r.name.to_owned(), r.transport, h.join().unwrap()))
            .collect()
    });
    // The long-token rows reached the lean path, not actix-web's fallback.
    let locked_stats = common::request(_locked.wait_admin(), "GET", "/stats", &[], b"")
        .unwrap()
        .json();
    let open_stats = common::request(_open.wait_admin(), "GET", "/stats", &[], b"")
        .unwrap()
        .json();
    println!("| client | transport | welcome | message |");
    println!("|---|---|---|---|");
    let mut failed = Vec::new();
    for (name, transport, o) in &outcomes {
        let mark = |ok: bool| if ok { "yes" } else { "NO" };
        println!(
            "| {name} | {transport} | {} | {} |",
            mark(o.welcome),
            mark(o.message)
        );
        if !(o.welcome && o.message) {
            failed.push(format!("{name}: {:#?}", o.said));
        }
    }
    assert!(failed.is_empty(), "rows failed:\n{}", failed.join("\n"));
    for st in [&open_stats, &locked_stats] {
        assert_eq!(st["connections"]["fallback"], 0, "every stream was lean: {st}");
        assert_eq!(st["connections"]["bad_heads"], 0, "{st}");
    }
}

/// The seed's load client, unchanged but for `http` → `httpc`: 2,000
/// streams from Erlang's httpc (which sends `content-length: 0` and an
/// empty `te:` on every GET), none closed, ticks arriving.
#[test]
fn the_seeds_erlang_floodtest_holds_2000_streams() {
    let (server, addr) = server(&[]);
    let dir = std::env::temp_dir().join(format!("switchboard-floodtest-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let urls = dir.join("urls.txt");
    let list: String = (0..2000)
        .map(|n| format!("http://{addr}/test/flood{n}\n"))
        .collect();
    std::fs::write(&urls, list).unwrap();
    let compiled = Command::new("erlc")
        .arg("-o")
        .arg(&dir)
        .arg(Path::new(CLIENTS).join("floodtest.erl"))
        .status()
        .unwrap_or_else(|e| panic!("cannot run erlc ({e}): apt-get install erlang-nox"));
    assert!(compiled.success());
    // One URL a millisecond, as the article's run; its stats come every 10 s.
    let eval = format!("floodtest:start(\"{}\", 1)", urls.display());
    let mut client = Client::start(&[
        "erl".to_owned(),
        "-noshell".to_owned(),
        "-pa".to_owned(),
        dir.display().to_string(),
        "-eval".to_owned(),
        eval,
    ])
    .unwrap_or_else(|e| panic!("cannot run erl ({e}): apt-get install erlang-nox"));
    let mut stats = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    while stats.len() < 2 && Instant::now() < deadline {
        if client.wait_for(Duration::from_secs(15), |l| l.starts_with("Stats: ")) {
            let line = client
                .said
                .iter()
                .rev()
                .find(|l| l.starts_with("Stats: "))
                .unwrap()
                .clone();
            let nums: Vec<u64> = line
                .trim_start_matches("Stats: {")
                .trim_end_matches('}')
                .split(',')
                .map(|n| n.parse().unwrap())
                .collect();
            println!("{line}");
            if nums[0] == 2000 || !stats.is_empty() {
                stats.push(nums);
            }
        }
    }
    let said = client.said.clone();
    drop(client);
    let st = common::request(server.wait_admin(), "GET", "/stats", &[], b"")
        .unwrap()
        .json();
    drop(server);
    assert!(stats.len() >= 2, "no two Stats lines with 2,000 active: {said:?}");
    let (first, last) = (&stats[0], &stats[stats.len() - 1]);
    assert_eq!(last[0], 2000, "Active: {said:?}");
    assert_eq!(last[1], 0, "Closed: {said:?}");
    // 10 s apart at one tick a second: every stream ticked again.
    assert!(
        last[2] >= first[2] + 2000 * 5,
        "chunks did not keep arriving: {stats:?}"
    );
    assert_eq!(st["connections"]["bad_heads"], 0, "{st}");
}
