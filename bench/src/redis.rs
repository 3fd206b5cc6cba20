//! The Redis that `bench cluster` joins its switchboard processes with:
//! Debian's `redis-server`, started fresh on a free loopback port with no
//! persistence (`--save '' --appendonly no`) and its working directory in a
//! temporary directory, stopped by SIGTERM to the PID we started. A tiny
//! RESP client asks it `PING` (readiness) and `INFO` (commands processed,
//! channels subscribed).

use std::io::{self, BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use super::process::{self, Spawned, TempDir, shell_line};
use super::servers::find_program;

/// The Debian package that has `redis-server`.
pub(crate) const PACKAGE: &str = "redis-server";

/// How long Redis may take to answer `PING`.
const READY_LIMIT: Duration = Duration::from_secs(10);

/// Connect, read and write timeout of each command.
const TIMEOUT: Duration = Duration::from_secs(2);

/// Largest reply read (`INFO` is a few KiB).
const MAX_REPLY: usize = 1 << 20;

/// The command that installs Redis, for the error when it is missing.
pub(crate) fn install_hint() -> String {
    format!(
        "redis-server not found; install it: apt-get install -y {PACKAGE} \
         (or run scripts/bench/peers.sh)"
    )
}

/// A running `redis-server` this harness started.
pub(crate) struct Redis {
    /// Its loopback port.
    pub port: u16,
    /// The process.
    proc: Spawned,
    /// Its working directory and log; removed on drop.
    _dir: TempDir,
    /// Its stdout and stderr.
    log: PathBuf,
    /// How it was started, for the report.
    pub command: String,
}

impl Redis {
    /// Starts a fresh Redis and waits until it answers `PING`.
    pub(crate) fn start() -> anyhow::Result<Self> {
        Self::start_on(process::free_port()?, &[])
    }

    /// Starts a fresh Redis on `port` with `extra` arguments.
    fn start_on(port: u16, extra: &[String]) -> anyhow::Result<Self> {
        let exe = find_program("redis-server").with_context(install_hint)?;
        let dir = TempDir::new("redis")?;
        let mut args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
            "--bind",
            "127.0.0.1",
            "--dir",
            &dir.path().display().to_string(),
        ]
        .map(String::from)
        .to_vec();
        args.extend_from_slice(extra);
        let log = dir.path().join("redis.log");
        let proc = Spawned::logged("redis-server", Command::new(&exe).args(&args), &log)?;
        let mut redis = Redis {
            port,
            proc,
            _dir: dir,
            log,
            command: shell_line(&exe.display().to_string(), &args),
        };
        redis.wait_ready()?;
        Ok(redis)
    }

    /// Its address.
    pub(crate) fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// `redis://127.0.0.1:PORT`, as switchboard's `cluster.redis_url`.
    pub(crate) fn url(&self) -> String {
        format!("redis://{}", self.addr())
    }

    /// Its PID.
    pub(crate) fn pid(&self) -> u32 {
        self.proc.pid()
    }

    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        while started.elapsed() < READY_LIMIT {
            if let Some(st) = self.proc.exited() {
                bail!(
                    "redis-server exited ({st}) before it was ready:\n{}",
                    process::tail(&self.log, 20)
                );
            }
            if command(self.addr(), &["PING"]).is_ok_and(|r| r == Reply::Status("PONG".into())) {
                return Ok(());
            }
            process::pause(Duration::from_millis(50))?;
        }
        bail!(
            "redis-server not ready after {READY_LIMIT:?}:\n{}",
            process::tail(&self.log, 20)
        )
    }

    /// `INFO` as `key → value` pairs.
    pub(crate) fn info(&self) -> anyhow::Result<Vec<(String, String)>> {
        match command(self.addr(), &["INFO"]).context("redis INFO")? {
            Reply::Bulk(text) => Ok(parse_info(&text)),
            other => bail!("redis INFO answered {other:?}"),
        }
    }

    /// `INFO all` (every section, `commandstats` too) as `key → value`.
    pub(crate) fn info_all(&self) -> anyhow::Result<Vec<(String, String)>> {
        match command(self.addr(), &["INFO", "all"]).context("redis INFO all")? {
            Reply::Bulk(text) => Ok(parse_info(&text)),
            other => bail!("redis INFO all answered {other:?}"),
        }
    }

    /// One numeric `INFO` field (None when absent or unreadable).
    pub(crate) fn info_u64(&self, key: &str) -> Option<u64> {
        let info = self.info().ok()?;
        info.iter().find(|(k, _)| k == key)?.1.parse().ok()
    }

    /// SIGTERM and wait. `Some(note)` when it did not exit cleanly.
    pub(crate) fn stop(mut self) -> Option<String> {
        let note = match self.proc.stop() {
            Ok(st) if st.success() => None,
            Ok(st) => Some(format!("redis-server exited with {st} after SIGTERM")),
            Err(e) => Some(format!("redis-server: stopping failed: {e:#}")),
        };
        if let Some(n) = &note {
            eprintln!("bench: {n}\n{}", process::tail(&self.log, 10));
        }
        note
    }
}

/// A Redis Cluster of three masters and three replicas, made by
/// `redis-cli --cluster create`, for `bench cluster --redis-cluster`.
pub(crate) struct RedisCluster {
    /// Every node.
    pub nodes: Vec<Redis>,
    /// How it was made, for the report.
    pub command: String,
}

impl RedisCluster {
    /// Starts six cluster nodes (a node's bus port is its port + 10,000:
    /// ports below 45,000, tried again on another if one was taken) and
    /// joins them; waits until every node says `cluster_state:ok` and every
    /// replica has synced.
    pub(crate) fn start() -> anyhow::Result<Self> {
        let mut nodes = Vec::new();
        for _ in 0..6 {
            let mut last = None;
            for _ in 0..5 {
                let port = cluster_port();
                let extra = ["--cluster-enabled", "yes", "--cluster-node-timeout", "1500"].map(String::from);
                match Redis::start_on(port, &extra) {
                    Ok(r) => {
                        last = None;
                        nodes.push(r);
                        break;
                    }
                    Err(e) => last = Some(e),
                }
            }
            if let Some(e) = last {
                return Err(e.context("starting a Redis Cluster node"));
            }
        }
        let exe = find_program("redis-cli").context("redis-cli (apt-get install -y redis-tools)")?;
        let mut args: Vec<String> = vec!["--cluster".into(), "create".into()];
        args.extend(nodes.iter().map(|n| n.addr().to_string()));
        args.extend(["--cluster-replicas", "1", "--cluster-yes"].map(String::from));
        let out = Command::new(&exe)
            .args(&args)
            .stdin(std::process::Stdio::null())
            .output()
            .context("redis-cli --cluster create")?;
        if !out.status.success() {
            bail!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        let cluster = RedisCluster {
            nodes,
            command: shell_line(&exe.display().to_string(), &args),
        };
        let started = Instant::now();
        while !cluster.settled() {
            if started.elapsed() > Duration::from_secs(30) {
                bail!("the Redis Cluster did not settle within 30 s");
            }
            process::pause(Duration::from_millis(100))?;
        }
        Ok(cluster)
    }

    /// Every node says `cluster_state:ok`, and every replica has synced.
    fn settled(&self) -> bool {
        self.nodes.iter().all(|n| {
            let field = |cmd: &[&str], line: &str| match command(n.addr(), cmd) {
                Ok(Reply::Bulk(text)) => text.lines().any(|l| l.trim_end() == line),
                _ => false,
            };
            field(&["CLUSTER", "INFO"], "cluster_state:ok")
                && (field(&["INFO", "replication"], "role:master")
                    || field(&["INFO", "replication"], "master_link_status:up"))
        })
    }

    /// `cluster.redis_cluster_nodes`: every node.
    pub(crate) fn seeds(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("redis://{}", n.addr()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The nodes that are masters now.
    pub(crate) fn masters(&self) -> Vec<&Redis> {
        self.nodes
            .iter()
            .filter(|n| {
                n.info()
                    .is_ok_and(|i| i.iter().any(|(k, v)| k == "role" && v == "master"))
            })
            .collect()
    }

    /// Stops every node; the notes of those that did not exit cleanly.
    pub(crate) fn stop(self) -> Vec<String> {
        self.nodes.into_iter().filter_map(Redis::stop).collect()
    }
}

/// A port below 45,000 that nothing answers on, nor on its bus port (the
/// port + 10,000): a candidate, tried by starting the node on it.
fn cluster_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    loop {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        let port = 20_000 + (h.finish() % 25_000) as u16;
        let taken = |p: u16| std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, p)).is_ok();
        if !taken(port) && !taken(port + 10_000) {
            return port;
        }
    }
}

/// A RESP reply (the kinds these commands get).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// `+OK`.
    Status(String),
    /// `-ERR ...`.
    Error(String),
    /// `:42`.
    Integer(i64),
    /// `$n` and n bytes (None: `$-1`).
    Bulk(String),
    /// `$-1`.
    Nil,
}

/// Sends one command as a RESP array on a fresh connection and reads one reply.
pub(crate) fn command(addr: SocketAddr, args: &[&str]) -> io::Result<Reply> {
    let s = TcpStream::connect_timeout(&addr, TIMEOUT)?;
    s.set_read_timeout(Some(TIMEOUT))?;
    s.set_write_timeout(Some(TIMEOUT))?;
    (&s).write_all(&encode(args))?;
    read_reply(&mut BufReader::new(s))
}

/// A command as a RESP array of bulk strings.
pub(crate) fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend(format!("${}\r\n", a.len()).into_bytes());
        out.extend(a.as_bytes());
        out.extend(b"\r\n");
    }
    out
}

/// Reads one reply (no arrays: the commands here get none).
pub(crate) fn read_reply(r: &mut impl BufRead) -> io::Result<Reply> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("redis reply: {what}"));
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    let line = line.trim_end_matches(['\r', '\n']);
    let (kind, rest) = line.split_at_checked(1).ok_or_else(|| bad("empty line"))?;
    match kind {
        "+" => Ok(Reply::Status(rest.to_owned())),
        "-" => Ok(Reply::Error(rest.to_owned())),
        ":" => rest.parse().map(Reply::Integer).map_err(|_| bad(line)),
        "$" => {
            let n: i64 = rest.parse().map_err(|_| bad(line))?;
            if n < 0 {
                return Ok(Reply::Nil);
            }
            let n = usize::try_from(n).map_err(|_| bad(line))?;
            if n > MAX_REPLY {
                return Err(bad("too long"));
            }
            let mut data = vec![0; n + 2];
            r.read_exact(&mut data)?;
            data.truncate(n);
            Ok(Reply::Bulk(String::from_utf8_lossy(&data).into_owned()))
        }
        _ => Err(bad(line)),
    }
}

/// `INFO` text as `key → value` pairs (section headers and blanks skipped).
pub(crate) fn parse_info(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.trim_end().split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_commands() {
        assert_eq!(encode(&["PING"]), b"*1\r\n$4\r\nPING\r\n");
        assert_eq!(encode(&["INFO", "stats"]), b"*2\r\n$4\r\nINFO\r\n$5\r\nstats\r\n");
    }

    #[test]
    fn reads_replies() {
        let read = |b: &[u8]| read_reply(&mut &b[..]);
        assert_eq!(read(b"+PONG\r\n").unwrap(), Reply::Status("PONG".into()));
        assert_eq!(read(b"-ERR no\r\n").unwrap(), Reply::Error("ERR no".into()));
        assert_eq!(read(b":42\r\n").unwrap(), Reply::Integer(42));
        assert_eq!(read(b"$5\r\nhello\r\n").unwrap(), Reply::Bulk("hello".into()));
        assert_eq!(read(b"$-1\r\n").unwrap(), Reply::Nil);
        assert!(read(b"").is_err());
        assert!(read(b"$5\r\nhel").is_err());
        assert!(read(b"?x\r\n").is_err());
    }

    #[test]
    fn info_fields() {
        let text = "# Server\r\nredis_version:7.0.15\r\n\r\n# Stats\r\ntotal_commands_processed:1234\r\n\
                    pubsub_channels:10001\r\n";
        let info = parse_info(text);
        assert!(info.contains(&("redis_version".into(), "7.0.15".into())));
        assert!(info.contains(&("pubsub_channels".into(), "10001".into())));
        assert_eq!(info.len(), 3);
    }

    #[test]
    fn missing_redis_names_the_install() {
        assert!(install_hint().contains("apt-get install -y redis-server"));
    }
}
