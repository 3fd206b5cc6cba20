//! Load-tool targets: `http://HOST:PORT/PATH` and `https://HOST:PORT/PATH`
//! URLs, checked to be loopback.
//!
//! The load tools only aim at this machine unless told otherwise
//! (`--allow-remote`): a typo must not flood someone else's server.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// Why a URL cannot be a target.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TargetError {
    /// Not `http://host:port/path` (or `https://`).
    #[error("{0:?} is not an http:// or https:// URL with an IP host (or localhost)")]
    Malformed(String),
    /// Not a loopback address, and remote targets were not allowed.
    #[error("{0} is not a loopback address; pass --allow-remote to load another machine")]
    NotLoopback(IpAddr),
}

/// A parsed `http://` or `https://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Where to connect.
    pub addr: SocketAddr,
    /// Path and query, starting with `/`; may hold a `{n}` or `{id}` placeholder.
    pub path: String,
    /// `https://`: TLS, with [`Target::host`] as the server's name.
    pub tls: bool,
    /// The host as the URL names it (`127.0.0.1`, `::1`, `localhost`): the
    /// name a TLS server's certificate must hold.
    pub host: String,
}

impl Target {
    /// Parses `url`; refuses non-loopback hosts unless `allow_remote`.
    pub fn parse(url: &str, allow_remote: bool) -> Result<Self, TargetError> {
        let bad = || TargetError::Malformed(url.to_owned());
        let (tls, rest) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
            (Some(rest), _) => (false, rest),
            (None, Some(rest)) => (true, rest),
            (None, None) => return Err(bad()),
        };
        let default_port = if tls { 443 } else { 80 };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let (host, port) = match authority.strip_prefix('[') {
            // [v6] or [v6]:port
            Some(v6) => {
                let (host, rest) = v6.split_once(']').ok_or_else(bad)?;
                match rest.strip_prefix(':') {
                    Some(p) => (host, p.parse::<u16>().map_err(|_| bad())?),
                    None if rest.is_empty() => (host, default_port),
                    None => return Err(bad()),
                }
            }
            None => match authority.split_once(':') {
                Some((h, p)) => (h, p.parse::<u16>().map_err(|_| bad())?),
                None => (authority, default_port),
            },
        };
        let ip: IpAddr = if host.eq_ignore_ascii_case("localhost") {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        } else {
            host.parse().map_err(|_| bad())?
        };
        if !allow_remote && !ip.is_loopback() {
            return Err(TargetError::NotLoopback(ip));
        }
        Ok(Target {
            addr: SocketAddr::new(ip, port),
            path: path.to_owned(),
            tls,
            host: host.to_owned(),
        })
    }

    /// `http://HOST:PORT` or `https://HOST:PORT`, the host as the URL named it.
    pub fn origin(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        let port = self.addr.port();
        if self.host.contains(':') {
            format!("{scheme}://[{}]:{port}", self.host)
        } else {
            format!("{scheme}://{}:{port}", self.host)
        }
    }

    /// The same server (scheme, host and port) with another path.
    pub fn with_path(&self, path: &str) -> Self {
        Target {
            path: path.to_owned(),
            ..self.clone()
        }
    }

    /// The path with `{n}` replaced by `n`.
    pub fn path_for(&self, n: u64) -> String {
        self.path.replace("{n}", &n.to_string())
    }

    /// The `Host` header value.
    pub fn host_header(&self) -> String {
        self.addr.to_string()
    }
}

/// The stream id in a stream path: its last segment, without a query.
pub(crate) fn id_of(path: &str) -> &str {
    let path = path.split('?').next().unwrap_or(path);
    path.rsplit('/').next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_guards() {
        let t = Target::parse("http://127.0.0.1:8000/test/{n}", false).unwrap();
        assert_eq!(t.addr, "127.0.0.1:8000".parse().unwrap());
        assert_eq!(t.path_for(7), "/test/7");
        assert_eq!(
            Target::parse("http://localhost/x", false).unwrap().addr.port(),
            80
        );
        assert_eq!(
            Target::parse("http://[::1]:9/", false).unwrap().addr,
            "[::1]:9".parse().unwrap()
        );
        assert_eq!(
            Target::parse("http://10.0.0.1:80/", false),
            Err(TargetError::NotLoopback("10.0.0.1".parse().unwrap()))
        );
        assert!(Target::parse("http://10.0.0.1:80/", true).is_ok());
        assert!(Target::parse("ftp://127.0.0.1/", false).is_err());
        assert!(Target::parse("http://example.com/", true).is_err());
        assert!(!t.tls);
        assert_eq!(t.origin(), "http://127.0.0.1:8000");
    }

    #[test]
    fn https_targets_keep_their_host_for_the_certificate() {
        let t = Target::parse("https://127.0.0.1:8443/test/{n}", false).unwrap();
        assert!(t.tls);
        assert_eq!((t.addr.port(), t.host.as_str()), (8443, "127.0.0.1"));
        assert_eq!(t.origin(), "https://127.0.0.1:8443");
        let l = Target::parse("https://localhost/x", false).unwrap();
        assert_eq!(
            (l.addr, l.host.as_str()),
            ("127.0.0.1:443".parse().unwrap(), "localhost")
        );
        assert_eq!(l.origin(), "https://localhost:443");
        let v6 = Target::parse("https://[::1]:9/", false).unwrap();
        assert_eq!(v6.origin(), "https://[::1]:9");
        assert_eq!(v6.with_path("/stats").path, "/stats");
        assert!(v6.with_path("/stats").tls);
        assert_eq!(
            Target::parse("https://10.0.0.1/", false),
            Err(TargetError::NotLoopback("10.0.0.1".parse().unwrap()))
        );
    }

    #[test]
    fn ids() {
        assert_eq!(id_of("/test/c12?x=1"), "c12");
    }
}
