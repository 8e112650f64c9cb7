//! The one retry schedule of every loop that retries (the aggregator's
//! agent streams, libsync, evictions): exponential delays from backon,
//! doubling from a first delay up to a cap, restarted after a success.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// Delays between attempts: `first`, then twice the previous, at most
/// `max`, forever; [`Backoff::reset`] after a success starts over.
#[derive(Debug)]
pub struct Backoff {
    builder: ExponentialBuilder,
    delays: ExponentialBackoff,
    max: Duration,
    /// Each delay is scaled by a factor in `1 ± jitter`.
    jitter: f64,
}

impl Backoff {
    pub fn new(first: Duration, max: Duration) -> Self {
        let builder = ExponentialBuilder::default()
            .with_min_delay(first)
            .with_max_delay(max)
            .with_factor(2.0)
            .without_max_times();
        Self {
            builder,
            delays: builder.build(),
            max,
            jitter: 0.0,
        }
    }

    /// Spreads each delay over `delay · (1 ± fraction)`, so that clients
    /// failing together (agents restarted at once) do not retry in lockstep.
    /// backon's own jitter only ever lengthens a delay (up to twice), which
    /// is why it is not used.
    pub fn with_jitter(mut self, fraction: f64) -> Self {
        self.jitter = fraction.clamp(0.0, 1.0);
        self
    }

    /// The delay before the next attempt.
    pub fn next_delay(&mut self) -> Duration {
        // `without_max_times`: the schedule never ends, so the fallback is
        // never taken.
        let delay = self.delays.next().unwrap_or(self.max);
        if self.jitter == 0.0 {
            return delay;
        }
        delay.mul_f64(1.0 - self.jitter + 2.0 * self.jitter * fastrand::f64())
    }

    /// After a success: the next delay is the first again.
    pub fn reset(&mut self) {
        self.delays = self.builder.build();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn delays_double_up_to_the_cap_and_restart_after_a_reset() {
        let mut backoff = Backoff::new(S, 60 * S);
        let delays: Vec<u64> = (0..9).map(|_| backoff.next_delay().as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        backoff.reset();
        assert_eq!(backoff.next_delay(), S);
        assert_eq!(backoff.next_delay(), 2 * S);
    }

    #[test]
    fn sub_second_delays_stay_exact() {
        let mut backoff = Backoff::new(Duration::from_millis(500), 30 * S);
        let delays: Vec<u128> = (0..8).map(|_| backoff.next_delay().as_millis()).collect();
        assert_eq!(delays, [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000]);
    }

    #[test]
    fn jitter_stays_within_its_fraction_of_the_delay() {
        let mut backoff = Backoff::new(10 * S, 10 * S).with_jitter(0.2);
        let delays: Vec<Duration> = (0..200).map(|_| backoff.next_delay()).collect();
        assert!(
            delays.iter().all(|d| (8 * S..=12 * S).contains(d)),
            "{delays:?}"
        );
        assert!(
            delays.iter().any(|d| *d != delays[0]),
            "delays are spread, not all equal"
        );
    }
}
