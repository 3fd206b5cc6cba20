//! Latency histograms for the load tools (HDR, microsecond resolution).

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde_json::{Value, json};

/// Highest latency recorded: one hour, in microseconds (longer is clamped).
const MAX_MICROS: u64 = 3_600_000_000;

/// A latency histogram in microseconds.
#[derive(Clone)]
pub struct Latency(Histogram<u64>);

impl Default for Latency {
    fn default() -> Self {
        // Auto-resizing: it grows to the largest value recorded. With fixed
        // bounds up to an hour every histogram is 196 KB, and each report's
        // snapshot clones them (touching every page), empty or not: 1.5 MB
        // of floodtest's RSS, 150 B of its bytes per stream at 10,000.
        // unwrap: 3 significant figures is a valid precision.
        let mut h = Histogram::new(3).expect("valid histogram precision");
        h.auto(true);
        Latency(h)
    }
}

impl Latency {
    /// Records one sample; values out of range are clamped.
    pub fn record_micros(&mut self, us: u64) {
        // `record`, not `saturating_record`: the latter clamps to the
        // histogram's current top instead of growing it.
        let _ = self.0.record(us.clamp(1, MAX_MICROS));
    }

    /// Adds another histogram's samples.
    pub fn merge(&mut self, other: &Latency) {
        // Both grow to what they record, so add cannot fail; ignore if it would.
        let _ = self.0.add(&other.0);
    }

    /// Number of samples.
    pub fn len(&self) -> u64 {
        self.0.len()
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The value at quantile `q` (0..=1), in milliseconds.
    pub fn ms(&self, q: f64) -> f64 {
        self.0.value_at_quantile(q) as f64 / 1000.0
    }

    /// Largest sample, in milliseconds.
    pub fn max_ms(&self) -> f64 {
        self.0.max() as f64 / 1000.0
    }

    /// `{"p50":..,"p90":..,"p99":..,"p999":..,"max":..}` in ms (nulls if empty).
    pub fn summary(&self) -> Value {
        if self.is_empty() {
            return json!({"p50": null, "p90": null, "p99": null, "p999": null, "max": null});
        }
        json!({
            "p50": self.ms(0.5), "p90": self.ms(0.9), "p99": self.ms(0.99),
            "p999": self.ms(0.999), "max": self.max_ms(),
        })
    }

    /// The recorded buckets as `[[value_us, count], ...]`, to ship between processes.
    pub fn to_pairs(&self) -> Value {
        Value::Array(
            self.0
                .iter_recorded()
                .map(|v| json!([v.value_iterated_to(), v.count_at_value()]))
                .collect(),
        )
    }

    /// Rebuilds from [`Latency::to_pairs`].
    pub fn from_pairs(v: &Value) -> Self {
        let mut h = Latency::default();
        for pair in v.as_array().into_iter().flatten() {
            if let (Some(value), Some(count)) = (pair[0].as_u64(), pair[1].as_u64()) {
                let _ = h.0.record_n(value.clamp(1, MAX_MICROS), count);
            }
        }
        h
    }
}

/// Upper bounds of [`Timeline`] buckets, in microseconds (1 ms to 20 s);
/// one more bucket holds everything later. 50 ms and 1 s are bounds, so
/// "p99 within 50 ms" and "p99 within 1 s" are read exactly.
pub(crate) const TIMELINE_BOUNDS_US: [u64; 15] = [
    1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000, 500_000, 1_000_000, 2_000_000, 5_000_000,
    10_000_000, 15_000_000, 20_000_000,
];

/// Buckets of one [`Second`] histogram.
pub(crate) const TIMELINE_BUCKETS: usize = TIMELINE_BOUNDS_US.len() + 1;

/// What happened to the messages sent, and the ticks due, in one second.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Second {
    /// Messages sent in this second that the server accepted.
    pub sent: u64,
    /// Of the messages sent in this second, those that arrived.
    pub received: u64,
    /// Their latency, by [`TIMELINE_BOUNDS_US`] bucket.
    pub latency: [u64; TIMELINE_BUCKETS],
    /// Lag of the ticks due in this second, by bucket.
    pub ticks: [u64; TIMELINE_BUCKETS],
}

/// Per-second counts keyed by Unix second: a run can then be cut into
/// phases (ramp, hold, a broadcast, the drain) after the fact. Messages
/// count in the second they were sent, ticks in the second they were due,
/// so a loss or a delay is charged to when it was caused.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Timeline(pub BTreeMap<u64, Second>);

/// The bucket of a latency.
pub(crate) fn timeline_bucket(us: u64) -> usize {
    TIMELINE_BOUNDS_US
        .iter()
        .position(|&b| us <= b)
        .unwrap_or(TIMELINE_BUCKETS - 1)
}

impl Timeline {
    fn at(&mut self, unix_us: u64) -> &mut Second {
        self.0.entry(unix_us / 1_000_000).or_default()
    }

    /// A message stamped `sent_us` (Unix µs) was accepted.
    pub fn sent(&mut self, sent_us: u64) {
        self.at(sent_us).sent += 1;
    }

    /// A message stamped `sent_us` arrived `latency_us` later.
    pub fn received(&mut self, sent_us: u64, latency_us: u64) {
        let s = self.at(sent_us);
        s.received += 1;
        s.latency[timeline_bucket(latency_us)] += 1;
    }

    /// A tick due at `due_us` arrived `lag_us` late.
    pub fn tick(&mut self, due_us: u64, lag_us: u64) {
        self.at(due_us).ticks[timeline_bucket(lag_us)] += 1;
    }

    /// Adds another timeline's counts.
    pub fn merge(&mut self, o: &Timeline) {
        for (sec, s) in &o.0 {
            let mine = self.0.entry(*sec).or_default();
            mine.sent += s.sent;
            mine.received += s.received;
            for b in 0..TIMELINE_BUCKETS {
                mine.latency[b] += s.latency[b];
                mine.ticks[b] += s.ticks[b];
            }
        }
    }

    /// `[[unix_s, sent, received, [latency buckets], [tick buckets]], ...]`.
    pub fn to_json(&self) -> Value {
        Value::Array(
            self.0
                .iter()
                .map(|(sec, s)| json!([sec, s.sent, s.received, s.latency, s.ticks]))
                .collect(),
        )
    }

    /// Reads [`Timeline::to_json`]; malformed rows are skipped.
    pub fn from_json(v: &Value) -> Self {
        let buckets = |v: &Value| {
            let mut out = [0u64; TIMELINE_BUCKETS];
            for (i, c) in v
                .as_array()
                .into_iter()
                .flatten()
                .take(TIMELINE_BUCKETS)
                .enumerate()
            {
                out[i] = c.as_u64().unwrap_or(0);
            }
            out
        };
        let mut t = Timeline::default();
        for row in v.as_array().into_iter().flatten() {
            let Some(sec) = row[0].as_u64() else { continue };
            t.0.insert(
                sec,
                Second {
                    sent: row[1].as_u64().unwrap_or(0),
                    received: row[2].as_u64().unwrap_or(0),
                    latency: buckets(&row[3]),
                    ticks: buckets(&row[4]),
                },
            );
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_and_round_trip() {
        let mut h = Latency::default();
        for us in 1..=1000 {
            h.record_micros(us * 10);
        }
        assert!((h.ms(0.5) - 5.0).abs() < 0.05, "{}", h.ms(0.5));
        assert!((h.max_ms() - 10.0).abs() < 0.05);
        let back = Latency::from_pairs(&h.to_pairs());
        assert_eq!(back.len(), 1000);
        assert!((back.ms(0.99) - h.ms(0.99)).abs() < 0.05);
    }

    /// The histograms grow to what they record (up to an hour) and merge
    /// across ranges: a small one takes a large one's samples.
    #[test]
    fn grows_to_what_it_records_and_merges_across_ranges() {
        let mut small = Latency::default();
        small.record_micros(250);
        let mut large = Latency::default();
        large.record_micros(1_800_000_000);
        large.record_micros(u64::MAX);
        assert!(
            (large.max_ms() - 3_600_000.0).abs() < 3_600.0,
            "{}",
            large.max_ms()
        );
        small.merge(&large);
        assert_eq!(small.len(), 3);
        assert!((small.ms(0.0) - 0.25).abs() < 0.001, "{}", small.ms(0.0));
        assert!((small.ms(0.5) - 1_800_000.0).abs() < 1_800.0, "{}", small.ms(0.5));
    }

    #[test]
    fn timeline_buckets_merge_and_round_trip() {
        assert_eq!(timeline_bucket(0), 0);
        assert_eq!(timeline_bucket(50_000), 5);
        assert_eq!(timeline_bucket(50_001), 6);
        assert_eq!(timeline_bucket(1_000_000), 9);
        assert_eq!(timeline_bucket(u64::MAX), TIMELINE_BUCKETS - 1);
        let mut a = Timeline::default();
        a.sent(5_000_000);
        a.received(5_999_999, 40_000);
        a.tick(6_000_000, 2_000_000);
        let mut b = Timeline::default();
        b.sent(5_100_000);
        b.merge(&a);
        assert_eq!(b.0[&5].sent, 2);
        assert_eq!(b.0[&5].received, 1);
        assert_eq!(b.0[&5].latency[5], 1);
        assert_eq!(b.0[&6].ticks[10], 1);
        assert_eq!(Timeline::from_json(&b.to_json()), b);
    }
}
