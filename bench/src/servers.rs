//! The servers under test, each started fresh on a free loopback port with
//! its files in a temporary directory: switchboard (the release binary beside
//! this one) and nginx with the Nchan module (Debian's packages), both with
//! [`WORKERS`] workers. Readiness is an HTTP 200; stopping is SIGTERM to the
//! PID we started, then waiting for it.
//!
//! Started for TLS streams ([`Server::start_tls`]), a server keeps its port
//! plain, for the harness's own requests (readiness, `/stats`), and serves
//! the streams with TLS on a second port: switchboard with
//! `server.tls_cert_file`/`tls_key_file` and `server.tls_ports`, nginx with
//! `listen ... ssl`. The streams' memory is what it would be on a server
//! whose every port is TLS; the harness needs no TLS client of its own.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};

use super::flood::Wire;
use super::process::{self, Spawned, TempDir, display_path, shell_line};
use super::tls::TlsFiles;
use super::{client, procfs};

/// Worker threads (switchboard) and worker processes (nginx): one per core
/// of the 2-core machine, the same for both so neither gets more CPUs.
pub(crate) const WORKERS: u32 = 2;

/// SIGTERM's number on Linux.
const SIGTERM: i32 = 15;

/// How long a server may take to answer its readiness request.
const READY_LIMIT: Duration = Duration::from_secs(15);

/// Where Debian's libnginx-mod-nchan puts the module.
pub(crate) const NCHAN_MODULE: &str = "/usr/lib/nginx/modules/ngx_nchan_module.so";

/// Most descriptors an nginx worker may open (the machine's hard limit).
const NGINX_RLIMIT_NOFILE: u32 = 20_000;

/// Connections per nginx worker, just under its descriptor limit.
const NGINX_WORKER_CONNECTIONS: u32 = 19_990;

/// Which server.
#[derive(clap::ValueEnum, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ServerKind {
    /// This project's server.
    Switchboard,
    /// nginx with the Nchan module (streams: `http-raw-stream` subscribers).
    Nchan,
    /// `bench-floor`: one `write(2)` per held stream and nothing else, the
    /// box's floor for a broadcast (`bench broadcast` measures it beside
    /// the others; no other benchmark takes it).
    #[value(skip)]
    Floor,
}

/// Which servers a benchmark measures (`bench broadcast`, `bench connect`,
/// and in [`Matrix`] `bench idle` and `bench latency`).
#[derive(clap::Args, Debug, Clone)]
pub struct Servers {
    /// Servers to measure [default: switchboard,nchan].
    #[arg(long, value_delimiter = ',', value_enum, value_name = "SERVER,...")]
    pub servers: Option<Vec<ServerKind>>,
}

impl Servers {
    /// The servers the flag chose: both when it was not given.
    pub fn chosen(&self) -> Vec<ServerKind> {
        self.servers
            .clone()
            .unwrap_or_else(|| vec![ServerKind::Switchboard, ServerKind::Nchan])
    }
}

/// Which servers a benchmark measures, and over which transports
/// switchboard's streams are opened (`bench idle` and `bench latency`).
#[derive(clap::Args, Debug, Clone)]
pub struct Matrix {
    /// `--servers`: the servers to measure.
    #[command(flatten)]
    pub servers: Servers,
    /// How switchboard's streams are opened, comma-separated: floodtest's
    /// `--transport` (chunked, sse, ws), or the same inside TLS (tls,
    /// tls-sse, tls-ws: https:// streams to a TLS port, with a test
    /// authority made for the run); the peers are measured on chunked and
    /// tls only [default: chunked; `bench idle --smoke`: chunked,sse,ws].
    #[arg(
        long,
        alias = "transport",
        value_delimiter = ',',
        value_enum,
        value_name = "TRANSPORT,..."
    )]
    pub transports: Option<Vec<Wire>>,
}

impl ServerKind {
    /// What a benchmark over `servers` and `transports` measures, in order:
    /// switchboard over each transport, a peer over those it
    /// [`supports`](Self::supports).
    pub(crate) fn runs(servers: &[ServerKind], transports: &[Wire]) -> Vec<(ServerKind, Wire)> {
        servers
            .iter()
            .flat_map(|&kind| {
                transports
                    .iter()
                    .filter(move |&&t| kind.supports(t))
                    .map(move |&t| (kind, t))
            })
            .collect()
    }

    /// The pairs of `servers` and `transports` that [`runs`](Self::runs)
    /// leaves out: a peer's transports it is not measured on.
    pub(crate) fn unsupported(servers: &[ServerKind], transports: &[Wire]) -> Vec<(ServerKind, Wire)> {
        servers
            .iter()
            .flat_map(|&kind| {
                transports
                    .iter()
                    .filter(move |&&t| !kind.supports(t))
                    .map(move |&t| (kind, t))
            })
            .collect()
    }

    /// Whether its streams are measured over `wire`: switchboard's over
    /// every one; Nchan's as `http-raw-stream` subscribers, plain or with
    /// `listen ... ssl` (its SSE and WebSocket subscribers are not set up).
    pub(crate) fn supports(self, wire: Wire) -> bool {
        match self {
            ServerKind::Switchboard => true,
            ServerKind::Nchan => matches!(wire, Wire::Chunked | Wire::Tls),
            ServerKind::Floor => wire == Wire::Chunked,
        }
    }

    /// Name in tables.
    pub fn label(self) -> &'static str {
        match self {
            ServerKind::Switchboard => "switchboard",
            ServerKind::Nchan => "Nchan",
            ServerKind::Floor => "the floor",
        }
    }

    /// A request that answers 200 once the server serves.
    fn ready_path(self) -> &'static str {
        match self {
            ServerKind::Switchboard | ServerKind::Floor => "/healthz",
            ServerKind::Nchan => "/dispatcher",
        }
    }
}

/// How a switchboard is started beyond the defaults every benchmark uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Launch {
    /// `switchboard --processes N`: a parent starting N servers on the same
    /// port (None: the flag is not passed; one process).
    pub processes: Option<u32>,
    /// Worker threads per server process (None: [`WORKERS`]).
    pub workers: Option<u32>,
    /// `SWITCHBOARD__CLUSTER__REDIS_URL` (None: not set; no Redis).
    pub redis_url: Option<String>,
    /// Another switchboard binary (None: the one beside this harness).
    pub binary: Option<PathBuf>,
    /// More settings (`SWITCHBOARD__...` variables).
    pub env: Vec<(&'static str, String)>,
    /// The port of a `bench-hook` every stream's admission asks: switchboard's
    /// `hooks.subscribe_url`, Nchan's `nchan_authorize_request` (through a
    /// keep-alive upstream). Nchan is started with `launch.hook` only.
    pub hook: Option<u16>,
}

/// A running server this harness started.
pub(crate) struct Server {
    /// Which server.
    pub kind: ServerKind,
    /// Its loopback port.
    pub port: u16,
    /// Its TLS port, when started with [`Server::start_tls`]: where the
    /// streams go ([`Server::stream_url`]).
    pub tls_port: Option<u16>,
    /// switchboard's parent of several server processes (`--processes`):
    /// the servers are its children.
    fleet: bool,
    /// The process (nginx: the master; workers are its children).
    proc: Spawned,
    /// Its configuration and logs; removed when the server is dropped.
    _dir: TempDir,
    /// Its log (switchboard's stderr, nginx's error log), for error messages.
    log: PathBuf,
    /// How it was started, for the report.
    pub command: String,
}

impl Server {
    /// Starts a fresh server and waits until it answers.
    pub(crate) fn start(kind: ServerKind) -> anyhow::Result<Self> {
        Self::start_with(kind, &Launch::default(), None)
    }

    /// Starts a fresh server that also serves TLS with `files` on a second
    /// port ([`Server::tls_port`]), and waits until it answers; without
    /// `files`, [`Server::start`].
    pub(crate) fn start_tls(kind: ServerKind, files: Option<&TlsFiles>) -> anyhow::Result<Self> {
        Self::start_with(kind, &Launch::default(), files)
    }

    /// Starts a fresh `kind` as `launch` says and waits until it answers.
    pub(crate) fn start_launched(kind: ServerKind, launch: &Launch) -> anyhow::Result<Self> {
        Self::start_with(kind, launch, None)
    }

    /// [`Server::start_launched`], also serving TLS with `files` on a
    /// second port, when given.
    pub(crate) fn start_full(
        kind: ServerKind,
        launch: &Launch,
        files: Option<&TlsFiles>,
    ) -> anyhow::Result<Self> {
        Self::start_with(kind, launch, files)
    }

    /// Starts a fresh switchboard as `launch` says and waits until it
    /// answers (with several processes: until one of them does).
    pub(crate) fn start_switchboard(launch: &Launch) -> anyhow::Result<Self> {
        Self::start_with(ServerKind::Switchboard, launch, None)
    }

    fn start_with(kind: ServerKind, launch: &Launch, tls: Option<&TlsFiles>) -> anyhow::Result<Self> {
        let dir = TempDir::new(kind.label())?;
        let port = process::free_port()?;
        let tls = match tls {
            Some(files) => Some(TlsListen {
                port: loop {
                    let p = process::free_port()?;
                    if p != port {
                        break p;
                    }
                },
                files,
            }),
            None => None,
        };
        let (proc, log, command, port) = match kind {
            ServerKind::Switchboard => {
                let (p, log, command) = start_switchboard(dir.path(), port, launch, tls.as_ref())?;
                (p, log, command, port)
            }
            ServerKind::Nchan => {
                let (p, log, command) = start_nginx(dir.path(), port, tls.as_ref(), launch.hook)?;
                (p, log, command, port)
            }
            ServerKind::Floor => start_floor(dir.path())?,
        };
        let mut server = Server {
            kind,
            port,
            tls_port: tls.map(|t| t.port),
            fleet: kind == ServerKind::Switchboard && launch.processes.is_some_and(|n| n > 1),
            proc,
            _dir: dir,
            log,
            command,
        };
        server.wait_ready()?;
        Ok(server)
    }

    /// Its listening address.
    pub(crate) fn addr(&self) -> SocketAddr {
        SocketAddr::V4(self.addr_v4())
    }

    /// Its listening address, as `/proc/net/tcp` is searched for it.
    pub(crate) fn addr_v4(&self) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.port)
    }

    /// `http://127.0.0.1:PORT` + `path`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr())
    }

    /// Where the streams go: `https://127.0.0.1:TLS_PORT` + `path` when
    /// started with TLS, else [`Server::url`].
    pub(crate) fn stream_url(&self, path: &str) -> String {
        match self.tls_port {
            Some(p) => format!("https://{}{path}", SocketAddrV4::new(Ipv4Addr::LOCALHOST, p)),
            None => self.url(path),
        }
    }

    /// The streams' server address (the TLS port's, when started with
    /// TLS), as `/proc/net/tcp` is searched for it.
    pub(crate) fn stream_addr_v4(&self) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.tls_port.unwrap_or(self.port))
    }

    /// Every process of the server: switchboard's one (or its parent and
    /// the server processes it started), or nginx's master and its workers
    /// (children found through `/proc/*/stat`).
    pub(crate) fn pids(&self) -> Vec<u32> {
        let master = self.proc.pid();
        let mut pids = vec![master];
        if self.kind == ServerKind::Nchan || self.fleet {
            pids.extend(procfs::children_of(master));
        }
        pids
    }

    /// The PID the harness started (switchboard's parent, nginx's master).
    pub(crate) fn main_pid(&self) -> u32 {
        self.proc.pid()
    }

    /// The end of its log, for error messages.
    pub(crate) fn log_tail(&self, lines: usize) -> String {
        process::tail(&self.log, lines)
    }

    /// Its exit status, if it has exited.
    pub(crate) fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.proc.exited()
    }

    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        while started.elapsed() < READY_LIMIT {
            if let Some(st) = self.proc.exited() {
                bail!(
                    "{} exited ({st}) before it was ready:\n{}",
                    self.kind.label(),
                    process::tail(&self.log, 20)
                );
            }
            if client::request(self.addr(), "GET", self.kind.ready_path(), "").is_ok_and(|r| r.status == 200)
            {
                return Ok(());
            }
            process::pause(Duration::from_millis(50))?;
        }
        bail!(
            "{} not ready after {READY_LIMIT:?}:\n{}",
            self.kind.label(),
            process::tail(&self.log, 20)
        )
    }

    /// Polls `/proc/net/tcp` until `n` connections to this server's stream
    /// port are established, `limit` passes, or `gave_up()` says the client
    /// is gone.
    /// Polls no more often than a few reads' worth of time (a read walks
    /// every socket on the machine).
    pub(crate) fn wait_established(
        &self,
        n: u64,
        limit: Duration,
        mut gave_up: impl FnMut() -> bool,
    ) -> anyhow::Result<Reached> {
        let started = Instant::now();
        let mut max_read = Duration::ZERO;
        loop {
            let (count, read) = procfs::established(self.stream_addr_v4())?;
            max_read = max_read.max(read);
            let reached = |complete| Reached {
                count,
                after: started.elapsed(),
                max_read,
                complete,
            };
            if count >= n {
                return Ok(reached(true));
            }
            if started.elapsed() >= limit || gave_up() {
                return Ok(reached(false));
            }
            process::pause(poll_interval(read).min(limit.saturating_sub(started.elapsed())))?;
        }
    }

    /// SIGTERM and wait. `Some(note)` when it did not exit cleanly (a
    /// finding for the report, not a reason to throw the numbers away).
    pub(crate) fn stop(mut self) -> Option<String> {
        let label = self.kind.label();
        let note = match self.proc.stop() {
            Ok(st) if st.success() => None,
            // bench-floor has no shutdown to do: SIGTERM ends it.
            Ok(st) if self.kind == ServerKind::Floor && st.signal() == Some(SIGTERM) => None,
            Ok(st) => Some(format!("{label} exited with {st} after SIGTERM")),
            Err(e) => Some(format!("{label}: stopping failed: {e:#}")),
        };
        if let Some(n) = &note {
            eprintln!("bench: {n}\n{}", process::tail(&self.log, 10));
        }
        note
    }
}

/// What waiting for established connections saw.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reached {
    /// Established connections at the last reading.
    pub count: u64,
    /// Time from the start of the wait to the last reading.
    pub after: Duration,
    /// Longest `/proc/net/tcp` read.
    pub max_read: Duration,
    /// The wanted count was reached.
    pub complete: bool,
}

/// Time between `/proc/net/tcp` polls after a read that took `read`: four
/// reads' worth, so polling costs at most a fifth of a core, within
/// 50 ms..5 s. (A read walks every socket on the machine: ~3 µs a line when
/// quiet, over 1 s for 40,000 sockets while thousands connect.)
pub(crate) fn poll_interval(read: Duration) -> Duration {
    (read * 4).clamp(Duration::from_millis(50), Duration::from_secs(5))
}

/// A release binary that sits beside this one (`switchboard`, `floodtest`).
pub(crate) fn sibling(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the bench executable")?;
    let path = exe.with_file_name(name);
    if !path.is_file() {
        bail!(
            "{} not found; build it first: cargo build --release --bins",
            path.display()
        );
    }
    Ok(path)
}

/// A server's TLS port and the files it serves it with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TlsListen<'a> {
    /// The port, beside the plain one.
    pub port: u16,
    /// Certificate and key.
    pub files: &'a TlsFiles,
}

fn start_switchboard(
    dir: &Path,
    port: u16,
    launch: &Launch,
    tls: Option<&TlsListen<'_>>,
) -> anyhow::Result<(Spawned, PathBuf, String)> {
    let exe = match &launch.binary {
        Some(path) => path.clone(),
        None => sibling("switchboard")?,
    };
    let log = dir.join("switchboard.log");
    let (mut env, args) = switchboard_env_args(port, launch);
    if let Some(t) = tls {
        env.extend(switchboard_tls_env(t));
    }
    let mut cmd = Command::new(&exe);
    // Only these settings: none leaks in from the harness's environment.
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("SWITCHBOARD__")) {
        cmd.env_remove(k);
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v))).args(&args);
    let command = env.iter().map(|(k, v)| format!("{k}={v} ")).collect::<String>()
        + &shell_line(&display_path(&exe), &args);
    Ok((Spawned::logged("switchboard", &mut cmd, &log)?, log, command))
}

/// Starts `bench-floor` on a port it picks itself, and reads which from
/// its first line.
fn start_floor(dir: &Path) -> anyhow::Result<(Spawned, PathBuf, String, u16)> {
    start_listening("bench-floor", &["--port", "0"], dir)
}

/// Starts the sibling binary `name` with `args`, which binds a port of its
/// own choosing and prints `listening on 127.0.0.1:PORT`: the process, its
/// log, its command line and the port.
pub(crate) fn start_listening(
    name: &str,
    args: &[&str],
    dir: &Path,
) -> anyhow::Result<(Spawned, PathBuf, String, u16)> {
    let exe = sibling(name)?;
    let log = dir.join(format!("{name}.log"));
    let mut proc = Spawned::logged(name, Command::new(&exe).args(args), &log)?;
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let command = shell_line(&display_path(&exe), &args);
    let started = Instant::now();
    while started.elapsed() < READY_LIMIT {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(port) = floor_port(&text) {
            return Ok((proc, log, command, port));
        }
        if let Some(st) = proc.exited() {
            bail!("{name} exited ({st}) before it listened:\n{text}");
        }
        process::pause(Duration::from_millis(20))?;
    }
    bail!("{name} did not say its port within {READY_LIMIT:?}")
}

/// The port in `bench-floor`'s `listening on 127.0.0.1:PORT` line.
fn floor_port(log: &str) -> Option<u16> {
    log.lines()
        .find_map(|l| l.strip_prefix("listening on "))
        .and_then(|a| a.trim().rsplit_once(':'))
        .and_then(|(_, p)| p.parse().ok())
}

/// switchboard's environment and arguments for `launch` on `port`.
pub(crate) fn switchboard_env_args(port: u16, launch: &Launch) -> (Vec<(&'static str, String)>, Vec<String>) {
    let mut env = vec![
        ("SWITCHBOARD__SERVER__HOST", "127.0.0.1".to_owned()),
        ("SWITCHBOARD__SERVER__PORT", port.to_string()),
        (
            "SWITCHBOARD__SERVER__WORKERS",
            launch.workers.unwrap_or(WORKERS).to_string(),
        ),
        ("SWITCHBOARD__LOG__LEVEL", "warn".to_owned()),
    ];
    if let Some(url) = &launch.redis_url {
        env.push(("SWITCHBOARD__CLUSTER__REDIS_URL", url.clone()));
    }
    env.extend(launch.env.iter().cloned());
    if launch.binary.is_none() {
        // The harness (and floodtest, by default) reads `/stats` and
        // `/cluster` on the server's one loopback port, as every run
        // recorded so far did: this build serves them on its internal
        // listener, so it is told to serve them on its port too, and its
        // internal listener takes a free port (0), so that two servers or a
        // fleet never contend for the default one. Another binary (an older
        // build) may not know these keys, and serves the pages on its port.
        env.push(("SWITCHBOARD__SERVER__ADMIN_PUBLIC", "true".to_owned()));
        env.push(("SWITCHBOARD__SERVER__ADMIN_PORT", "0".to_owned()));
    }
    let args = match launch.processes {
        Some(n) => vec!["--processes".to_owned(), n.to_string()],
        None => Vec::new(),
    };
    (env, args)
}

/// switchboard's TLS settings: `t.port` as an extra port that alone serves
/// TLS, with `t.files`.
pub(crate) fn switchboard_tls_env(t: &TlsListen<'_>) -> Vec<(&'static str, String)> {
    vec![
        ("SWITCHBOARD__SERVER__EXTRA_PORTS", t.port.to_string()),
        ("SWITCHBOARD__SERVER__TLS_PORTS", t.port.to_string()),
        (
            "SWITCHBOARD__SERVER__TLS_CERT_FILE",
            t.files.cert.display().to_string(),
        ),
        (
            "SWITCHBOARD__SERVER__TLS_KEY_FILE",
            t.files.key.display().to_string(),
        ),
    ]
}

fn start_nginx(
    dir: &Path,
    port: u16,
    tls: Option<&TlsListen<'_>>,
    hook: Option<u16>,
) -> anyhow::Result<(Spawned, PathBuf, String)> {
    let nginx = find_program("nginx").context("nginx not found; run scripts/bench/peers.sh")?;
    if !Path::new(NCHAN_MODULE).is_file() {
        bail!("{NCHAN_MODULE} not found; run scripts/bench/peers.sh");
    }
    let d = dir.display().to_string();
    std::fs::write(
        dir.join("nginx.conf"),
        nginx_conf(&d, &port.to_string(), tls, hook),
    )?;
    let log = dir.join("error.log");
    let args: Vec<String> = vec![
        "-p".into(),
        format!("{d}/"),
        "-c".into(),
        format!("{d}/nginx.conf"),
        // Before reading the configuration nginx would open its default
        // error log under /var/log; -e keeps it in our directory.
        "-e".into(),
        format!("{d}/error.log"),
    ];
    let command = shell_line(&nginx.display().to_string(), &args);
    let proc = Spawned::logged("nginx", Command::new(&nginx).args(&args), &dir.join("nginx.out"))?;
    Ok((proc, log, command))
}

/// The nginx configuration: Nchan raw-stream subscribers on `/test/{id}`, its
/// publisher on `/send/{id}`, a constant `/dispatcher`; `daemon off` so the
/// PID we start is the master; everything it writes under `dir`. With
/// `tls`, the same server also listens with `ssl` on the TLS port (TLS 1.2
/// and 1.3, as switchboard serves; nginx's other SSL defaults). With
/// `hook`, every subscriber is authorized first by a GET to that port's
/// `/hook` (`nchan_authorize_request`, a keep-alive upstream of 64
/// connections, as switchboard's hook pool).
pub(crate) fn nginx_conf(dir: &str, port: &str, tls: Option<&TlsListen<'_>>, hook: Option<u16>) -> String {
    let (upstream, authorize, auth_location) = match hook {
        Some(p) => (
            format!("  upstream hook {{ server 127.0.0.1:{p}; keepalive 64; }}\n"),
            " nchan_authorize_request /auth;",
            "    location = /auth { internal; proxy_pass http://hook/hook; proxy_http_version 1.1; \
             proxy_set_header Connection \"\"; proxy_pass_request_body off; proxy_set_header Content-Length \"\"; }\n",
        ),
        None => (String::new(), "", ""),
    };
    let ssl = match tls {
        Some(t) => format!(
            "    listen 127.0.0.1:{} ssl backlog=4096;
    ssl_certificate {};
    ssl_certificate_key {};
    ssl_protocols TLSv1.2 TLSv1.3;
",
            t.port,
            t.files.cert.display(),
            t.files.key.display()
        ),
        None => String::new(),
    };
    format!(
        "load_module {NCHAN_MODULE};
worker_processes {WORKERS};
worker_rlimit_nofile {NGINX_RLIMIT_NOFILE};
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections {NGINX_WORKER_CONNECTIONS}; multi_accept on; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body; proxy_temp_path {dir}/proxy; fastcgi_temp_path {dir}/fcgi;
  uwsgi_temp_path {dir}/uwsgi; scgi_temp_path {dir}/scgi;
  keepalive_requests 1000000;
{upstream}  server {{
    listen 127.0.0.1:{port} backlog=4096;
{ssl}    location = /dispatcher {{ default_type text/plain; return 200 \"1\"; }}
    location ~ ^/test/(.+)$ {{ nchan_subscriber http-raw-stream; nchan_channel_id $1;{authorize} }}
    location ~ ^/send/(.+)$ {{ nchan_publisher; nchan_channel_id $1; }}
{auth_location}  }}
}}
"
    )
}

/// `name` on PATH, or in /usr/sbin (root's nginx is there even when PATH
/// lacks it).
pub(crate) fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_says_its_port_on_its_first_line() {
        assert_eq!(floor_port("listening on 127.0.0.1:40123\n"), Some(40123));
        assert_eq!(floor_port("bench-floor: wrote 3 of 3\n"), None);
        assert_eq!(floor_port("listening on 127.0.0.1:\n"), None);
    }

    #[test]
    fn nginx_conf_is_the_verified_one() {
        let c = nginx_conf("/tmp/x", "8123", None, None);
        assert!(c.starts_with("load_module /usr/lib/nginx/modules/ngx_nchan_module.so;\n"));
        assert!(c.contains("worker_processes 2;"));
        assert!(c.contains("daemon off;"));
        assert!(c.contains("pid /tmp/x/nginx.pid;"));
        assert!(c.contains("listen 127.0.0.1:8123 backlog=4096;"));
        assert!(
            c.contains("location ~ ^/test/(.+)$ { nchan_subscriber http-raw-stream; nchan_channel_id $1; }")
        );
        assert!(c.contains("return 200 \"1\";"));
        assert_eq!(c.matches('{').count(), c.matches('}').count());
        assert!(!c.contains("ssl"));
        let files = TlsFiles {
            ca: "/tmp/r/ca.pem".into(),
            cert: "/tmp/r/server.crt".into(),
            key: "/tmp/r/server.key".into(),
        };
        let t = TlsListen {
            port: 8443,
            files: &files,
        };
        let c = nginx_conf("/tmp/x", "8123", Some(&t), None);
        assert!(
            c.contains("listen 127.0.0.1:8123 backlog=4096;\n    listen 127.0.0.1:8443 ssl backlog=4096;")
        );
        assert!(c.contains("ssl_certificate /tmp/r/server.crt;"));
        assert!(c.contains("ssl_certificate_key /tmp/r/server.key;"));
        assert!(c.contains("ssl_protocols TLSv1.2 TLSv1.3;"));
        assert_eq!(c.matches('{').count(), c.matches('}').count());
        let env = switchboard_tls_env(&t);
        assert!(env.contains(&("SWITCHBOARD__SERVER__TLS_PORTS", "8443".into())));
        assert!(env.contains(&("SWITCHBOARD__SERVER__EXTRA_PORTS", "8443".into())));
        assert!(env.contains(&("SWITCHBOARD__SERVER__TLS_CERT_FILE", "/tmp/r/server.crt".into())));
        assert!(env.contains(&("SWITCHBOARD__SERVER__TLS_KEY_FILE", "/tmp/r/server.key".into())));
    }

    #[test]
    fn peers_run_the_transports_they_support() {
        let all = [Wire::Chunked, Wire::Ws, Wire::Tls, Wire::TlsWs];
        let both = [ServerKind::Switchboard, ServerKind::Nchan];
        let runs = ServerKind::runs(&both, &all);
        assert_eq!(runs.len(), 6);
        assert_eq!(
            runs[4..],
            [(ServerKind::Nchan, Wire::Chunked), (ServerKind::Nchan, Wire::Tls)]
        );
        assert_eq!(
            ServerKind::unsupported(&both, &all),
            [(ServerKind::Nchan, Wire::Ws), (ServerKind::Nchan, Wire::TlsWs)]
        );
    }

    #[test]
    fn switchboard_launches() {
        let (env, args) = switchboard_env_args(8123, &Launch::default());
        assert!(args.is_empty());
        assert!(env.contains(&("SWITCHBOARD__SERVER__WORKERS", "2".into())));
        assert!(!env.iter().any(|(k, _)| k.contains("CLUSTER")));
        assert!(env.contains(&("SWITCHBOARD__SERVER__ADMIN_PUBLIC", "true".into())));
        assert!(env.contains(&("SWITCHBOARD__SERVER__ADMIN_PORT", "0".into())));
        let fleet = Launch {
            processes: Some(4),
            workers: Some(1),
            redis_url: Some("redis://127.0.0.1:6390".into()),
            ..Launch::default()
        };
        let (env, args) = switchboard_env_args(8123, &fleet);
        assert_eq!(args, ["--processes", "4"]);
        assert!(env.contains(&("SWITCHBOARD__SERVER__PORT", "8123".into())));
        assert!(env.contains(&("SWITCHBOARD__SERVER__WORKERS", "1".into())));
        assert!(env.contains(&("SWITCHBOARD__CLUSTER__REDIS_URL", "redis://127.0.0.1:6390".into())));
    }

    #[test]
    fn polling_backs_off_with_read_time() {
        assert_eq!(poll_interval(Duration::from_millis(1)), Duration::from_millis(50));
        assert_eq!(
            poll_interval(Duration::from_millis(30)),
            Duration::from_millis(120)
        );
        assert_eq!(poll_interval(Duration::from_secs(1)), Duration::from_secs(4));
        assert_eq!(poll_interval(Duration::from_secs(2)), Duration::from_secs(5));
    }

    #[test]
    fn finds_programs() {
        assert!(find_program("sh").is_some());
        assert!(find_program("no-such-program-here").is_none());
    }
}
