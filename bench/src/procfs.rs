//! What the kernel says about the processes under test, from `/proc`:
//! resident memory, CPU time, parents, open sockets, slab memory, and the
//! established connections on a listening address. Every figure is read the
//! same way for switchboard and for nginx. Parsers take text, so tests feed
//! them samples.

use std::collections::HashSet;
use std::io;
use std::net::SocketAddrV4;
use std::path::Path;
use std::time::{Duration, Instant};

/// `/proc/net/tcp` state code of an established connection.
const TCP_ESTABLISHED: &str = "01";

/// `/proc/net/tcp` state code of a closed connection waiting out 2×MSL.
const TCP_TIME_WAIT: &str = "06";

/// A `kB` field of `/proc/PID/status` or `/proc/meminfo` (`VmRSS:`,
/// `Slab:`), in bytes.
pub(crate) fn kb_field(text: &str, key: &str) -> Option<u64> {
    let rest = text.lines().find_map(|l| l.strip_prefix(key))?;
    let mut words = rest.split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => Some(n * 1024),
        _ => None,
    }
}

/// What the harness uses of `/proc/PID/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stat {
    /// Parent PID: how nginx's workers are found from the master.
    pub ppid: u32,
    /// User-mode CPU time, in clock ticks.
    pub utime: u64,
    /// Kernel-mode CPU time, in clock ticks.
    pub stime: u64,
}

/// Parses `/proc/PID/stat`. The command name sits in parentheses and may hold
/// spaces and parentheses itself, so fields are counted after the last `)`.
pub(crate) fn parse_stat(text: &str) -> Option<Stat> {
    let after = &text[text.rfind(')')? + 1..];
    // After the name: state ppid pgrp session tty_nr tpgid flags minflt
    // cminflt majflt cmajflt utime stime ...
    let f: Vec<&str> = after.split_whitespace().collect();
    Some(Stat {
        ppid: f.get(1)?.parse().ok()?,
        utime: f.get(11)?.parse().ok()?,
        stime: f.get(12)?.parse().ok()?,
    })
}

/// How `/proc/net/tcp` writes a local address: the IPv4 address as the
/// native-endian integer of its network-order bytes, then the port, in hex.
pub(crate) fn tcp_local(addr: SocketAddrV4) -> String {
    format!(
        "{:08X}:{:04X}",
        u32::from_ne_bytes(addr.ip().octets()),
        addr.port()
    )
}

/// Established connections whose local end is `addr` in `/proc/net/tcp`
/// text: the server's side of every accepted (or queued for accept)
/// connection, whoever the server is. Counted by distinct remote address:
/// the file is produced a page at a time, and while sockets come and go
/// (another test's connections, TIME_WAITs expiring) one read can list a
/// connection twice (seen here: 1,130 lines for 500 connections).
pub(crate) fn count_established(tcp: &str, addr: SocketAddrV4) -> u64 {
    let want = tcp_local(addr);
    tcp.lines()
        .skip(1)
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (_sl, local, remote, state) = (f.next(), f.next(), f.next(), f.next());
            (local.is_some_and(|l| l.eq_ignore_ascii_case(&want)) && state == Some(TCP_ESTABLISHED))
                .then_some(remote)
                .flatten()
        })
        .collect::<HashSet<&str>>()
        .len() as u64
}

/// Clock ticks until each TIME_WAIT socket in `/proc/net/tcp` text expires
/// (its `tr:tm->when` column: timer 3, then the ticks left, in hex).
pub(crate) fn time_wait_ticks_left(tcp: &str) -> Vec<u64> {
    tcp.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.get(3) != Some(&TCP_TIME_WAIT) {
                return None;
            }
            let when = f.get(5)?.split_once(':')?.1;
            Some(u64::from_str_radix(when, 16).unwrap_or(0))
        })
        .collect()
}

/// How long until each IPv4 TIME_WAIT socket on the machine expires. Each
/// holds a little slab memory until then (60 s after its connection closed).
pub(crate) fn time_wait_left(ticks_per_sec: u64) -> io::Result<Vec<Duration>> {
    let text = std::fs::read_to_string("/proc/net/tcp")?;
    let per_sec = ticks_per_sec.max(1) as f64;
    Ok(time_wait_ticks_left(&text)
        .into_iter()
        .map(|t| Duration::from_secs_f64(t as f64 / per_sec))
        .collect())
}

/// Established connections on `addr` now, and how long reading
/// `/proc/net/tcp` took (it grows with every socket on the machine).
pub(crate) fn established(addr: SocketAddrV4) -> io::Result<(u64, Duration)> {
    let t = Instant::now();
    let text = std::fs::read_to_string("/proc/net/tcp")?;
    Ok((count_established(&text, addr), t.elapsed()))
}

/// The kernel's slab memory (socket structures live there), in bytes.
pub(crate) fn slab_bytes() -> io::Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo")?;
    kb_field(&text, "Slab:").ok_or_else(|| io::Error::other("no Slab: line in /proc/meminfo"))
}

/// Sum of VmRSS over `pids`, in bytes.
pub(crate) fn rss_bytes(pids: &[u32]) -> io::Result<u64> {
    pids.iter().try_fold(0, |sum, pid| {
        let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let rss = kb_field(&text, "VmRSS:").ok_or_else(|| io::Error::other(format!("no VmRSS for {pid}")))?;
        Ok(sum + rss)
    })
}

/// `/proc/PID/stat` of one process.
pub(crate) fn stat(pid: u32) -> io::Result<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_stat(&text).ok_or_else(|| io::Error::other(format!("unreadable /proc/{pid}/stat")))
}

/// User and kernel CPU time summed over `pids` (all their threads), in
/// clock ticks: `(utime, stime)`.
pub(crate) fn cpu_ticks(pids: &[u32]) -> io::Result<(u64, u64)> {
    pids.iter().try_fold((0, 0), |(user, sys), &pid| {
        let s = stat(pid)?;
        Ok((user + s.utime, sys + s.stime))
    })
}

/// Live processes whose parent is `parent` (nginx's workers), found by
/// scanning `/proc/*/stat`. Bounded by the number of processes.
pub(crate) fn children_of(parent: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut kids: Vec<u32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| stat(pid).is_ok_and(|s| s.ppid == parent))
        .collect();
    kids.sort_unstable();
    kids
}

/// Open descriptors of `pid` that are sockets: how many connections each
/// nginx process (or switchboard) holds.
pub(crate) fn socket_fds(pid: u32) -> io::Result<u64> {
    let mut n = 0;
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        let Ok(entry) = entry else { continue };
        if std::fs::read_link(entry.path()).is_ok_and(|l| is_socket_link(&l)) {
            n += 1;
        }
    }
    Ok(n)
}

fn is_socket_link(link: &Path) -> bool {
    link.to_str().is_some_and(|s| s.starts_with("socket:"))
}

/// Clock ticks per second, the unit of `/proc/PID/stat` times (`getconf
/// CLK_TCK`; Linux reports them in USER_HZ, 100 on every common build).
pub(crate) fn clock_ticks_per_sec() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(100)
}

/// `delta` bytes spread over `n` streams (`None` with no streams).
pub(crate) fn per_stream(delta: i64, n: u64) -> Option<f64> {
    (n > 0).then(|| delta as f64 / n as f64)
}

/// `after - before` as a signed number (memory can shrink between readings).
pub(crate) fn delta(before: u64, after: u64) -> i64 {
    after as i64 - before as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn status_and_meminfo_fields() {
        let status = "Name:\tswitchboard\nVmPeak:\t  100 kB\nVmRSS:\t   12345 kB\nRssAnon:\t 1 kB\n";
        assert_eq!(kb_field(status, "VmRSS:"), Some(12345 * 1024));
        assert_eq!(kb_field(status, "VmSwap:"), None);
        let meminfo = "MemTotal:       24683656 kB\nSlab:             204800 kB\nSReclaimable:   1 kB\n";
        assert_eq!(kb_field(meminfo, "Slab:"), Some(204800 * 1024));
        // A prefix of another key does not match it.
        assert_eq!(kb_field(meminfo, "SReclaim:"), None);
        assert_eq!(kb_field("VmRSS: lots kB\n", "VmRSS:"), None);
    }

    #[test]
    fn stat_fields_after_odd_names() {
        let line = "4242 (nginx: worker) (x) S 4241 4241 4241 0 -1 4194624 120 0 0 0 37 15 0 0 20 0 1 0 \
                    99 1000 200 18446744073709551615\n";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                ppid: 4241,
                utime: 37,
                stime: 15
            })
        );
        assert_eq!(parse_stat("12 (short) S 1 2"), None);
        assert_eq!(parse_stat("no parens"), None);
    }

    #[test]
    fn established_counts_only_the_servers_side() {
        let server = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 8000);
        assert_eq!(tcp_local(server), "0100007F:1F40");
        let tcp =
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 0100007F:1F40 0200007F:9C41 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0 20 4 30 10 -1
   2: 0100007F:1F40 0300007F:8001 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0 20 4 30 10 -1
   3: 0200007F:9C41 0100007F:1F40 01 00000000:00000000 00:00000000 00000000     0        0 4 1 0 20 4 30 10 -1
   4: 0200007F:1F40 0100007F:1F40 01 00000000:00000000 00:00000000 00000000     0        0 5 1 0 20 4 30 10 -1
   5: 0100007F:1F40 0400007F:8002 06 00000000:00000000 00:00000000 00000000     0        0 0 1 0 20 4 30 10 -1
   6: 0100007F:1F41 0400007F:8003 01 00000000:00000000 00:00000000 00000000     0        0 6 1 0 20 4 30 10 -1
";
        // Lines 1 and 2: accepted on 127.0.0.1:8000. Not: the listener (0A),
        // the clients' own ends (3), a client that happens to use port 8000 on
        // another address (4), TIME_WAIT (5), another port (6).
        assert_eq!(count_established(tcp, server), 2);
        assert_eq!(count_established("", server), 0);
        // A line listed twice by a read that raced socket churn counts once.
        let twice = format!("{tcp}{}\n", tcp.lines().nth(2).unwrap());
        assert_eq!(count_established(&twice, server), 2);
        // The TIME_WAIT line's timer: 03:00000BB8 = 3,000 ticks left.
        let tw = tcp.replace(
            "06 00000000:00000000 00:00000000",
            "06 00000000:00000000 03:00000BB8",
        );
        assert_eq!(time_wait_ticks_left(&tw), vec![3000]);
        assert!(time_wait_ticks_left("header only").is_empty());
    }

    #[test]
    fn reading_this_process() {
        let me = std::process::id();
        assert!(rss_bytes(&[me]).unwrap() > 0);
        assert!(stat(me).unwrap().ppid > 0);
        assert!(slab_bytes().unwrap() > 0);
        let _ = cpu_ticks(&[me]).unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let std::net::SocketAddr::V4(addr) = l.local_addr().unwrap() else {
            panic!("v4")
        };
        let _c = std::net::TcpStream::connect(addr).unwrap();
        let (_s, _) = l.accept().unwrap();
        assert_eq!(established(addr).unwrap().0, 1);
        assert!(socket_fds(me).unwrap() >= 3);
        assert!(clock_ticks_per_sec() > 0);
    }

    #[test]
    fn per_stream_division() {
        assert_eq!(per_stream(15_000_000, 10_000), Some(1500.0));
        assert_eq!(per_stream(-4096, 1024), Some(-4.0));
        assert_eq!(per_stream(100, 0), None);
        assert_eq!(delta(10, 4), -6);
        assert_eq!(delta(4, 10), 6);
    }
}
