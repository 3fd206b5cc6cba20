//! The application's side as real processes, for the tests of the
//! application in the loop (tests/backend.rs, tests/webhooks.rs): its
//! backend in Python (tests/backend/app.py: a JWKS, the subscribe hook,
//! the webhook receiver) and its identity provider's tokens by PyJWT
//! (tests/backend/idp.py).

#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub const HERE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/backend");

/// The Python backend (tests/backend/app.py) on a port it bound itself,
/// serving from its state directory; stopped by pid when dropped.
pub struct Backend {
    child: Child,
    pub addr: SocketAddr,
    pub state: PathBuf,
}

impl Backend {
    pub fn start(name: &str) -> Backend {
        let state = std::env::temp_dir().join(format!("switchboard-backend-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&state);
        std::fs::create_dir_all(&state).unwrap();
        let mut child = Command::new("python3")
            .arg(format!("{HERE}/app.py"))
            .arg(&state)
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .expect("python3 (README: Quick start)");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("app.py said {line:?}"))
            .parse()
            .unwrap();
        Backend { child, addr, state }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn write(&self, file: &str, content: &str) {
        let tmp = self.state.join(format!("{file}.tmp"));
        std::fs::write(&tmp, content).unwrap();
        std::fs::rename(tmp, self.state.join(file)).unwrap();
    }

    /// How many requests it had for `path`.
    pub fn asked(&self, path: &str) -> usize {
        std::fs::read_to_string(self.state.join("requests.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.split(' ').nth(1) == Some(path))
            .count()
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.state);
    }
}

/// The identity provider's side, by PyJWT (tests/backend/idp.py).
pub fn idp(args: &[&str]) -> String {
    let out = Command::new("python3")
        .arg(format!("{HERE}/idp.py"))
        .args(args)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "idp.py {args:?}: {} (pip install 'pyjwt[crypto]': README, Quick start)",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A token for `sub` (audience `switchboard`) signed by the fixture key
/// `key` in `alg`, naming `kid`.
pub fn token(key: &str, alg: &str, kid: &str, sub: &str) -> String {
    idp(&["token", key, alg, kid, sub, "switchboard"])
}

/// An HS256 token for `sub`, valid 10 minutes, signed with `secret`.
pub fn hs256(secret: &str, sub: &str) -> String {
    use jsonwebtoken::{EncodingKey, Header, encode};
    let exp = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        + Duration::from_secs(600))
    .as_secs();
    let claims = serde_json::json!({ "sub": sub, "exp": exp, "role": "reader" });
    encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()).unwrap(),
    )
    .unwrap()
}
