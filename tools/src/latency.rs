//! Latency histograms for the load tools (HDR, microsecond resolution).

use hdrhistogram::Histogram;
use serde_json::{Value, json};

/// Highest latency recorded exactly: one hour, in microseconds.
const MAX_MICROS: u64 = 3_600_000_000;

/// A latency histogram in microseconds.
#[derive(Clone)]
pub struct Latency(Histogram<u64>);

impl Default for Latency {
    fn default() -> Self {
        // unwrap: constant, valid bounds.
        Latency(Histogram::new_with_bounds(1, MAX_MICROS, 3).expect("valid histogram bounds"))
    }
}

impl Latency {
    /// Records one sample; values out of range are clamped.
    pub fn record_micros(&mut self, us: u64) {
        self.0.saturating_record(us.clamp(1, MAX_MICROS));
    }

    /// Adds another histogram's samples.
    pub fn merge(&mut self, other: &Latency) {
        // unwrap-free: same bounds, so add cannot fail; ignore if it would.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_and_round_trip() {
        let mut h = Latency::default();
        for us in 1..=1000 {
            h.record_micros(us * 10);
        }
        assert!((h.ms(0.5) - 5.0).abs() < 0.05);
        assert!((h.max_ms() - 10.0).abs() < 0.05);
        let back = Latency::from_pairs(&h.to_pairs());
        assert_eq!(back.len(), 1000);
        assert!((back.ms(0.99) - h.ms(0.99)).abs() < 0.05);
    }
}
