//! Values as users type them on the load tools' command lines (durations,
//! source-address and port lists), and splitting a total over processes or
//! threads.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use switchboard_ports::{MAX_PORTS, PortsError};

/// Most source addresses one flood binds (a /16).
const MAX_SOURCE_IPS: usize = 65_536;

/// Parses "10s", "500ms", "2m", "1h" or a plain number of seconds ("1.5").
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, "s"),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 10s, 500ms, 2m"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use ms, s, m or h)")),
    };
    if !(secs.is_finite() && secs >= 0.0) {
        return Err(format!("{s:?} is not a positive duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Part `i` of `total` split over `parts` as evenly as whole numbers allow
/// (the first `total % parts` parts get one more).
pub(crate) fn split_evenly(total: u64, parts: u64, i: u64) -> u64 {
    total / parts + u64::from(i < total % parts)
}

/// Parses "127.0.0.2-127.0.0.20" or "127.0.0.2,127.0.0.5" into addresses.
pub(crate) fn parse_ip_list(spec: &str) -> Result<Vec<IpAddr>, String> {
    let one = |s: &str| {
        s.parse::<Ipv4Addr>()
            .map(|ip| u64::from(u32::from(ip)))
            .map_err(|_| format!("{s:?} is not an IPv4 address"))
    };
    // unwrap-free: every number came from a u32.
    parse_ranges(spec, MAX_SOURCE_IPS, one, |x| {
        IpAddr::V4(Ipv4Addr::from(u32::try_from(x).unwrap_or(u32::MAX)))
    })
}

/// Parses "8001-8003,9000" into `[8001, 8002, 8003, 9000]` (at most
/// [`MAX_PORTS`] server ports one flood spreads over). Empty means none.
/// Errors are worded as the other lists here: a bad item without the spaces
/// around it, and the list named when it is too long.
pub(crate) fn parse_ports(spec: &str) -> Result<Vec<u16>, String> {
    switchboard_ports::parse_ports(spec).map_err(|e| match e {
        PortsError::NotAPort(item) => PortsError::NotAPort(item.trim().to_owned()).to_string(),
        PortsError::TooMany => format!("more than {MAX_PORTS} in {spec:?}"),
        e => e.to_string(),
    })
}

/// A comma-separated list of items and inclusive `A-B` ranges, at most `max`
/// items in all. `one` reads an item as a number; `item` turns numbers back.
fn parse_ranges<T>(
    spec: &str,
    max: usize,
    one: impl Fn(&str) -> Result<u64, String>,
    item: impl Fn(u64) -> T,
) -> Result<Vec<T>, String> {
    let mut out = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (one(a.trim())?, one(b.trim())?),
            None => (one(part)?, one(part)?),
        };
        if lo > hi {
            return Err(format!("range {part:?} runs backwards"));
        }
        if (out.len() as u64).saturating_add(hi - lo + 1) > max as u64 {
            return Err(format!("more than {max} in {spec:?}"));
        }
        out.extend((lo..=hi).map(&item));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits() {
        let parts: Vec<u64> = (0..3).map(|i| split_evenly(10, 3, i)).collect();
        assert_eq!(parts, vec![4, 3, 3]);
    }

    #[test]
    fn units() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5d").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn ip_lists() {
        assert_eq!(parse_ip_list("127.0.0.2-127.0.0.4").unwrap().len(), 3);
        assert_eq!(parse_ip_list("127.0.0.2,127.0.0.9").unwrap().len(), 2);
        assert!(parse_ip_list("127.0.0.5-127.0.0.2").is_err());
        assert!(parse_ip_list("10.0.0.0-10.2.0.0").is_err());
    }

    #[test]
    fn port_lists_keep_this_crates_wording() {
        assert_eq!(
            parse_ports("8001-8003, 9000").unwrap(),
            vec![8001, 8002, 8003, 9000]
        );
        assert_eq!(
            parse_ports("8001- x").unwrap_err(),
            "\"x\" is not a port number from 1 to 65535"
        );
        assert_eq!(
            parse_ports("9000-8000").unwrap_err(),
            "range \"9000-8000\" runs backwards"
        );
        assert_eq!(parse_ports("1-2000").unwrap_err(), "more than 1000 in \"1-2000\"");
    }
}
