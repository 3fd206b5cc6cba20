//! Port lists as people type them: "8001-8003,9000". The server reads its
//! `server.extra_ports` with [`parse_ports`], floodtest its `--ports`; each
//! words the errors for its own users from [`PortsError`].

use std::fmt;

/// Most ports one list may hold (c1000k used 100).
pub const MAX_PORTS: usize = 1000;

/// Why a port list was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortsError {
    /// An item that is not a port number from 1 to 65535, as written: an end
    /// of a range keeps the spaces around it ("8001- x" gives `" x"`).
    NotAPort(String),
    /// A range whose first port is above its last, e.g. "9000-8000".
    Backwards(String),
    /// More than [`MAX_PORTS`] ports in all.
    TooMany,
}

impl fmt::Display for PortsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortsError::NotAPort(item) => write!(f, "{item:?} is not a port number from 1 to 65535"),
            PortsError::Backwards(range) => write!(f, "range {range:?} runs backwards"),
            PortsError::TooMany => write!(f, "more than {MAX_PORTS} ports"),
        }
    }
}

impl std::error::Error for PortsError {}

/// Parses "8001-8003,9000" into `[8001, 8002, 8003, 9000]`: comma-separated
/// ports and inclusive `A-B` ranges, spaces allowed around each, at most
/// [`MAX_PORTS`] in all. Empty means none.
pub fn parse_ports(spec: &str) -> Result<Vec<u16>, PortsError> {
    let port = |s: &str| {
        s.trim()
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| PortsError::NotAPort(s.to_owned()))
    };
    let mut ports = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (port(a)?, port(b)?),
            None => (port(part)?, port(part)?),
        };
        if lo > hi {
            return Err(PortsError::Backwards(part.to_owned()));
        }
        if ports.len() + usize::from(hi - lo) + 1 > MAX_PORTS {
            return Err(PortsError::TooMany);
        }
        ports.extend(lo..=hi);
    }
    Ok(ports)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_lists() {
        assert_eq!(parse_ports("").unwrap(), Vec::<u16>::new());
        assert_eq!(parse_ports(" , ,").unwrap(), Vec::<u16>::new());
        assert_eq!(
            parse_ports("8001-8003, 9000").unwrap(),
            vec![8001, 8002, 8003, 9000]
        );
        assert_eq!(parse_ports("8001 - 8002,8001").unwrap(), vec![8001, 8002, 8001]);
        assert_eq!(parse_ports("65535").unwrap(), vec![65535]);
        assert!(parse_ports("9000-8000").is_err());
        assert!(parse_ports("0").is_err());
        assert!(parse_ports("70000").is_err());
        assert!(parse_ports("1-2000").is_err());
        assert!(parse_ports("abc").is_err());
        assert!(parse_ports("8001-").is_err());
        assert!(parse_ports("1-2-3").is_err());
    }

    #[test]
    fn at_most_max_ports() {
        assert_eq!(parse_ports("1-1000").unwrap().len(), MAX_PORTS);
        assert_eq!(parse_ports("1-1001"), Err(PortsError::TooMany));
        assert_eq!(parse_ports("1-999,5000,6000"), Err(PortsError::TooMany));
        assert_eq!(parse_ports("1-65535"), Err(PortsError::TooMany));
    }

    #[test]
    fn errors_name_what_is_wrong() {
        assert_eq!(parse_ports("8001,abc"), Err(PortsError::NotAPort("abc".into())));
        assert_eq!(parse_ports("8001- x"), Err(PortsError::NotAPort(" x".into())));
        assert_eq!(
            parse_ports(" 9000 -8000 "),
            Err(PortsError::Backwards("9000 -8000".into()))
        );
        assert_eq!(
            parse_ports("0").unwrap_err().to_string(),
            "\"0\" is not a port number from 1 to 65535"
        );
        assert_eq!(
            parse_ports("9000-8000").unwrap_err().to_string(),
            "range \"9000-8000\" runs backwards"
        );
        assert_eq!(
            parse_ports("1-2000").unwrap_err().to_string(),
            "more than 1000 ports"
        );
    }
}
