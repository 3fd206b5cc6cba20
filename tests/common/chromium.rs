#![allow(dead_code, missing_docs, unreachable_pub)]
//! Headless Chromium (Debian's `chromium`) for the tests that need a real
//! browser, and a small client of its DevTools protocol (over a WebSocket,
//! through tungstenite) to read the live DOM and take screenshots.
//!
//! Without Chromium a test fails and says how to install it: it never skips.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub const CHROMIUM: &str = "/usr/bin/chromium";

/// Chromium, in its own process group so that stopping it stops its
/// renderer and helper processes too; and its profile directory.
pub struct Browser {
    child: Child,
    profile: std::path::PathBuf,
}

impl Browser {
    /// Opens `url` in a 1280x900 window.
    pub fn open(url: &str) -> Self {
        Self::open_with(url, &[])
    }

    /// [`Browser::open`] with more command-line arguments, e.g.
    /// `--ignore-certificate-errors-spki-list=...` to trust a test
    /// certificate.
    pub fn open_with(url: &str, extra: &[String]) -> Self {
        assert!(
            std::path::Path::new(CHROMIUM).exists(),
            "{CHROMIUM} not found: install Debian's chromium (apt-get install -y chromium); .ci/run does"
        );
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let profile = std::env::temp_dir().join(format!(
            "switchboard-chromium-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&profile);
        std::fs::create_dir_all(&profile).unwrap();
        use std::os::unix::process::CommandExt;
        let child = Command::new(CHROMIUM)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                "--window-size=1280,900",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            // e.g. SWITCHBOARD_CHROMIUM_ARG=--log-net-log=/tmp/net.json to see
            // what the browser sent and why (it found the stream-cache bug).
            .args(std::env::var("SWITCHBOARD_CHROMIUM_ARG").ok())
            .args(extra)
            .arg(url)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("start chromium");
        Browser { child, profile }
    }

    /// A DevTools connection to the page this browser opened.
    pub fn devtools(&self) -> Devtools {
        let file = self.profile.join("DevToolsActivePort");
        let deadline = Instant::now() + Duration::from_secs(30);
        let port: u16 = loop {
            if let Some(p) = std::fs::read_to_string(&file)
                .ok()
                .and_then(|t| t.lines().next().and_then(|l| l.trim().parse().ok()))
            {
                break p;
            }
            assert!(
                Instant::now() < deadline,
                "chromium wrote no DevToolsActivePort within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let page = loop {
            let targets = http_json(port, "/json/list");
            if let Some(url) = targets
                .as_array()
                .and_then(|t| t.iter().find(|t| t["type"] == "page"))
                .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            {
                break url.to_owned();
            }
            assert!(Instant::now() < deadline, "chromium lists no page: {targets}");
            std::thread::sleep(Duration::from_millis(100));
        };
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let (ws, _) = tungstenite::client(page.as_str(), stream).expect("DevTools WebSocket");
        Devtools { ws, next: 1 }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let group = nix::unistd::Pid::from_raw(-(self.child.id() as i32));
        let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGTERM);
        for _ in 0..50 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// `GET path` on Chromium's DevTools HTTP endpoint, as JSON.
fn http_json(port: u16, path: &str) -> Value {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return Value::Null;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    );
    let mut r = BufReader::new(s);
    let mut len = 0;
    let mut line = String::new();
    while r.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
        if let Some((k, v)) = line.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            len = v.trim().parse().unwrap_or(0);
        }
        line.clear();
    }
    let mut body = vec![0; len];
    if std::io::Read::read_exact(&mut r, &mut body).is_err() {
        return Value::Null;
    }
    serde_json::from_slice(&body).unwrap_or(Value::Null)
}

/// A DevTools protocol session with one page.
pub struct Devtools {
    ws: tungstenite::WebSocket<TcpStream>,
    next: u64,
}

impl Devtools {
    /// Calls `method`; the result, skipping the events in between.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        let msg = json!({ "id": id, "method": method, "params": params }).to_string();
        self.ws.send(tungstenite::Message::text(msg)).unwrap();
        loop {
            let reply = self.ws.read().expect("DevTools reply");
            let Ok(text) = reply.to_text() else { continue };
            let v: Value = serde_json::from_str(text).unwrap();
            if v["id"] == id {
                assert!(v["error"].is_null(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    /// The value of a JavaScript expression in the page, as JSON.
    pub fn eval(&mut self, expression: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true }),
        );
        assert!(r["exceptionDetails"].is_null(), "{expression}: {r}");
        r["result"]["value"].clone()
    }

    /// The page's DOM as it is now. Between a navigation's start and its
    /// new document (a reload) there is no document element: read again.
    pub fn dom(&mut self) -> String {
        for _ in 0..50 {
            let html = self.eval("document.documentElement ? document.documentElement.outerHTML : null");
            if let Some(html) = html.as_str() {
                return html.to_owned();
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        panic!("the page has had no document element for a second");
    }

    /// A PNG of the page as it is now.
    pub fn screenshot(&mut self) -> Vec<u8> {
        use base64::Engine;
        let r = self.call("Page.captureScreenshot", json!({ "format": "png" }));
        base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().expect("screenshot data"))
            .expect("screenshot is base64")
    }
}
