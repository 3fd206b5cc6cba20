//! Durations as users type them on the load tools' command lines, and
//! splitting a total over processes or threads.

use std::time::Duration;

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
pub fn split_evenly(total: u64, parts: u64, i: u64) -> u64 {
    total / parts + u64::from(i < total % parts)
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
}
