//! The real `switchboard` binary as a child process of a test, with its
//! JSON log lines collected as they come.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A process this test started, and its log.
pub struct Proc {
    pub child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    /// Spawns `cmd` with JSON logs on a piped stderr, read line by line;
    /// its internal listener on a free port (`server.admin_port` 0, see
    /// [`Proc::wait_admin`]) unless `cmd` names one.
    pub fn spawn(mut cmd: Command) -> Proc {
        if !cmd
            .get_envs()
            .any(|(k, _)| k == "SWITCHBOARD__SERVER__ADMIN_PORT")
        {
            cmd.env("SWITCHBOARD__SERVER__ADMIN_PORT", "0");
        }
        cmd.env("SWITCHBOARD__LOG__FORMAT", "json")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Proc { child, log }
    }

    /// Starts a server on `n` ports named before it starts (processes
    /// sharing a port, fixed extra ports): `make` builds the command for
    /// free ports, and a port another process took before the server bound
    /// it (its log says `Address already in use`) means new ports and a
    /// new try, up to 5. Never a port picked once and trusted.
    /// `listening`: whether to wait for the "switchboard listening" line
    /// (a `--processes` parent does not print it; `ready` is waited for
    /// instead).
    pub fn start_on_free_ports(
        n: usize,
        make: impl Fn(&[u16]) -> Command,
        ready: impl Fn(&Proc, &[u16]) -> bool,
    ) -> (Proc, Vec<u16>) {
        let mut log = String::new();
        for _ in 0..5 {
            let ports: Vec<u16> = (0..n).map(|_| super::free_port()).collect();
            let mut p = Proc::spawn(make(&ports));
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if ready(&p, &ports) {
                    return (p, ports);
                }
                if p.log_contains("Address already in use") {
                    break;
                }
                if p.child.try_wait().ok().flatten().is_some() {
                    std::thread::sleep(Duration::from_millis(100));
                    if p.log_contains("Address already in use") {
                        break;
                    }
                    panic!("the server exited:\n{}", p.log_text());
                }
                assert!(
                    Instant::now() < deadline,
                    "not ready within 30 s:\n{}",
                    p.log_text()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            log = p.log_text();
        }
        panic!("5 tries, each port taken before the server bound it:\n{log}");
    }

    /// Spawns `cmd` and waits for it to listen; answers its addresses.
    pub fn start(cmd: Command) -> (Proc, Vec<SocketAddr>) {
        let p = Proc::spawn(cmd);
        let addrs = p.wait_listening();
        (p, addrs)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The `fields` of every JSON log line whose `fields.<key>` is `value`.
    fn fields_where(&self, key: &str, value: &str) -> Vec<Value> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["fields"][key] == value)
            .map(|v| v["fields"].clone())
            .collect()
    }

    /// The `fields` of every JSON log line whose message is `message`.
    pub fn log_fields(&self, message: &str) -> Vec<Value> {
        self.fields_where("message", message)
    }

    /// The `fields` of every JSON log line whose `event` is `event`.
    pub fn events(&self, event: &str) -> Vec<Value> {
        self.fields_where("event", event)
    }

    /// Waits up to `within` for a log line of `event` that `ok` accepts.
    pub fn wait_event(&self, event: &str, within: Duration, ok: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + within;
        loop {
            if let Some(f) = self.events(event).into_iter().find(&ok) {
                return f;
            }
            assert!(
                Instant::now() < deadline,
                "no {event} line within {within:?}; log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    pub fn log_contains(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    /// The addresses of the first "switchboard listening" line (within 20 s).
    pub fn wait_listening(&self) -> Vec<SocketAddr> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(f) = self.log_fields("switchboard listening").first() {
                return f["addrs"]
                    .as_str()
                    .unwrap()
                    .trim_matches(['[', ']'])
                    .split(", ")
                    .map(|a| a.parse().unwrap())
                    .collect();
            }
            assert!(
                Instant::now() < deadline,
                "no listening line; log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The internal listener's address from the first "switchboard
    /// listening" line (within 20 s).
    pub fn wait_admin(&self) -> SocketAddr {
        self.wait_listening();
        self.log_fields("switchboard listening")[0]["admin"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    }

    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "did not exit within {within:?}; log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// True while the process has not exited.
    pub fn child_alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Sends `signal` ("TERM", "INT", "KILL") to this process.
    pub fn signal(&self, signal: &str) {
        send_signal(self.pid(), signal);
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // SIGKILL to a `--processes` parent would orphan its children: ask
        // with SIGTERM first, and SIGKILL only if it does not exit.
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = Command::new("kill")
                .args(["-TERM", &self.pid().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && self.child.try_wait().ok().flatten().is_none() {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `kill -SIGNAL pid`, for a process this test started (or a child of one).
pub fn send_signal(pid: u32, signal: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(ok.success(), "kill -{signal} {pid}");
}
