//! A network namespace joined to this one by a veth pair: a second host
//! for tests that need a peer that is not this machine's loopback (a
//! partition in tests/cluster_outages.rs, a client from elsewhere in
//! tests/exposing.rs).

use std::process::Command;

/// A network namespace of the test's own, joined to this one by a veth
/// pair: a host at `inside`, reached from here at `outside`'s side.
/// Removed (with its veth pair) on drop.
pub struct Netns {
    pub name: String,
    /// This side's end of the veth pair.
    pub host_if: String,
    /// This side's address (Redis listens on it too).
    pub outside: String,
    /// The namespace's address (its node listens there).
    pub inside: String,
}

impl Netns {
    /// The namespace, or why this machine cannot make one (no
    /// CAP_NET_ADMIN, no `ip`). `tag` (a letter or two) tells a test's
    /// namespaces apart; interface names must stay within 15 bytes.
    pub fn create(tag: &str) -> Result<Netns, String> {
        let pid = std::process::id();
        let name = format!("sb{tag}{pid}");
        let ip = |args: &[&str]| -> Result<String, String> {
            let out = Command::new("ip")
                .args(args)
                .output()
                .map_err(|e| format!("ip {args:?}: {e}"))?;
            if out.status.success() {
                Ok(String::from_utf8_lossy(&out.stdout).into_owned())
            } else {
                Err(format!(
                    "ip {args:?}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        };
        // 10.251.X.0/30 on this test's own veth pair: the first X from the
        // pid that no interface here uses yet.
        let net = (0..250)
            .map(|k| format!("10.251.{}", (pid + k) % 250))
            .find(|net| {
                ip(&["-o", "addr", "show", "to", &format!("{net}.0/30")]).is_ok_and(|o| o.trim().is_empty())
            })
            .ok_or("no free 10.251.X.0/30 here")?;
        let (outside, inside) = (format!("{net}.1"), format!("{net}.2"));
        ip(&["netns", "add", &name])?;
        let ns = Netns {
            name: name.clone(),
            host_if: format!("sbh{tag}{pid}"),
            outside: outside.clone(),
            inside: inside.clone(),
        };
        let ns_if = format!("sbn{tag}{pid}");
        ip(&["link", "add", &ns.host_if, "type", "veth", "peer", "name", &ns_if])?;
        ip(&["link", "set", &ns_if, "netns", &name])?;
        ip(&["addr", "add", &format!("{outside}/30"), "dev", &ns.host_if])?;
        ip(&["link", "set", &ns.host_if, "up"])?;
        let inns = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &name, "ip"];
            all.extend(args);
            ip(&all).map(drop)
        };
        inns(&["addr", "add", &format!("{inside}/30"), "dev", &ns_if])?;
        inns(&["link", "set", &ns_if, "up"])?;
        inns(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Drops (`cut`) or lets through again every packet between the
    /// namespace and `port` on the outside: a partition that closes
    /// nothing, as a dropped network does.
    pub fn cut(&self, port: u16, cut: bool) {
        let op = if cut { "-I" } else { "-D" };
        let port = port.to_string();
        for rule in [
            ["OUTPUT", "-d", &self.outside, "--dport", &port],
            ["INPUT", "-s", &self.outside, "--sport", &port],
        ] {
            let mut args = vec!["netns", "exec", &self.name, "iptables", op, rule[0], "-p", "tcp"];
            args.extend(&rule[1..]);
            args.extend(["-j", "DROP"]);
            let out = Command::new("ip").args(&args).output().unwrap();
            assert!(
                out.status.success(),
                "ip {args:?}: {} (apt-get install -y iptables)",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
        // Gone with the namespace's end, unless that never moved there.
        let _ = Command::new("ip").args(["link", "del", &self.host_if]).output();
    }
}

/// Whether this process has CAP_NET_ADMIN and CAP_SYS_ADMIN (bits 12 and
/// 21 of its effective capabilities), which making a network namespace
/// and its veth pair needs.
pub fn can_make_namespaces() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let hex = s
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))?
                .trim()
                .to_owned();
            u64::from_str_radix(&hex, 16).ok()
        })
        .is_some_and(|caps| caps & (1 << 12) != 0 && caps & (1 << 21) != 0)
}
