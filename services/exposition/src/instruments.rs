//! Event counters and histograms a service updates as things happen and
//! renders at each scrape, in the same text as every other family.
//!
//! Everything here is a fixed set of atomics owned by the service instance
//! (no global registry): the label values are known up front, so every
//! series exists from the start at 0 (a `rate()` sees the first event), a
//! label nobody listed cannot be counted, and two servers in one process
//! (the tests) keep separate counts.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::text::{Family, Labels, push_header, push_u64_value, push_value};

/// One count that only goes up.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub const fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    pub fn inc(&self) {
        self.add(1);
    }

    pub fn add(&self, n: u64) {
        // Relaxed: a scrape needs each count, not an order between them.
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Writes the family with this one unlabelled sample.
    pub fn render(&self, name: &'static str, help: &'static str, out: &mut String) {
        let mut family = Family::counter(name, help);
        family.sample(&[], self.get() as f64);
        family.render(out);
    }
}

/// Counts under one label whose values are fixed up front, rendered in
/// that order.
#[derive(Debug)]
pub struct Counters {
    key: &'static str,
    values: &'static [&'static str],
    counts: Box<[Counter]>,
}

impl Counters {
    pub fn new(key: &'static str, values: &'static [&'static str]) -> Self {
        Self {
            key,
            values,
            counts: values.iter().map(|_| Counter::new()).collect(),
        }
    }

    /// Counts under the `index`-th value (the hot path: no lookup). An
    /// index past the list is a programming error and counts nothing.
    pub fn inc_at(&self, index: usize) {
        if let Some(count) = self.counts.get(index) {
            count.inc();
        }
    }

    /// Counts under `value`; a value not in the list counts nothing and
    /// logs a warning (the list and the caller disagree: a bug, not input).
    pub fn inc(&self, value: &str) {
        match self.values.iter().position(|v| *v == value) {
            Some(index) => self.inc_at(index),
            None => tracing::warn!(
                key = self.key,
                value,
                "not a listed label value; not counted"
            ),
        }
    }

    /// The count under `value` (0 when it is not listed).
    pub fn get(&self, value: &str) -> u64 {
        self.values
            .iter()
            .position(|v| *v == value)
            .map_or(0, |i| self.counts[i].get())
    }

    pub fn render(&self, name: &'static str, help: &'static str, out: &mut String) {
        let mut family = Family::counter(name, help);
        for (value, count) in self.values.iter().zip(self.counts.iter()) {
            family.sample(&[(self.key, value)], count.get() as f64);
        }
        family.render(out);
    }
}

/// A Prometheus histogram over fixed upper bounds (seconds, bytes, …).
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Observations per bucket, not cumulative; the last is `+Inf`.
    buckets: Box<[AtomicU64]>,
    /// The sum's `f64` bits, added to with compare-and-swap.
    sum: AtomicU64,
}

impl Histogram {
    /// `bounds` must ascend (they are the `le` labels, in order).
    pub fn new(bounds: &'static [f64]) -> Self {
        debug_assert!(bounds.is_sorted(), "histogram bounds must ascend");
        Self {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0f64.to_bits()),
        }
    }

    pub fn observe(&self, value: f64) {
        // The first bucket whose bound is ≥ value (`le` is inclusive).
        let bucket = self.bounds.partition_point(|bound| *bound < value);
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        let _ = self
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + value).to_bits())
            });
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    pub fn sum(&self) -> f64 {
        f64::from_bits(self.sum.load(Ordering::Relaxed))
    }

    /// Writes `_bucket` (cumulative, ending with `+Inf`), `_sum` and
    /// `_count`. The count is the `+Inf` bucket, so the two always agree.
    pub fn render(&self, name: &'static str, help: &'static str, out: &mut String) {
        push_header(out, name, help, "histogram");
        let mut cumulative = 0u64;
        let mut le = Labels::default();
        let bounds = self.bounds.iter().map(|b| Some(*b)).chain([None]);
        for (bound, bucket) in bounds.zip(self.buckets.iter()) {
            cumulative += bucket.load(Ordering::Relaxed);
            le.clear();
            match bound {
                Some(bound) => le.push("le", &bound.to_string()),
                None => le.push("le", "+Inf"),
            }
            sample_line(out, name, "_bucket", &le, |s| push_u64_value(s, cumulative));
        }
        let sum = self.sum();
        sample_line(out, name, "_sum", &Labels::default(), |s| {
            push_value(s, sum)
        });
        sample_line(out, name, "_count", &Labels::default(), |s| {
            push_u64_value(s, cumulative);
        });
    }
}

fn sample_line(
    out: &mut String,
    name: &str,
    suffix: &str,
    labels: &Labels,
    value: impl FnOnce(&mut String),
) {
    out.push_str(name);
    out.push_str(suffix);
    labels.push_braced(out);
    out.push(' ');
    value(out);
    out.push('\n');
}

#[cfg(test)]
mod tests;
