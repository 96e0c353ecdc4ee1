//! The one retry delay of the project: exponential backoff with decorrelated jitter (the
//! variant of "Exponential Backoff And Jitter", AWS Architecture Blog, 2015): each delay is
//! drawn uniformly from `[min, 3 × the previous one]`, that range capped at `max`. The cap
//! bounds the range before the draw, not the delay after it: capping the delay would put two
//! thirds of the retries at exactly `max`, in step again once the range reaches it. Every loop that retries
//! etcd or systemd uses it, so that after an etcd outage a thousand agents do not come back in
//! lockstep, as six hand-written doublings made them (issue 14).
//!
//! Pure: no clock and no sleeping here, the caller sleeps what [`Backoff::next_delay`]
//! returns. The random source is a tiny per-instance generator seeded once from `rand`, or
//! from a seed for tests.

use std::time::Duration;

/// Retry delays for one thing that fails: growing, jittered, bounded.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    /// The last delay handed out (`min` before the first).
    last: Duration,
    state: u64,
}

impl Backoff {
    /// Delays from `min` up to `max` (`max` below `min` counts as `min`), seeded at random.
    pub fn new(min: Duration, max: Duration) -> Backoff {
        Backoff::seeded(min, max, rand::random())
    }

    /// The same with a fixed seed: the same seed gives the same delays.
    pub fn seeded(min: Duration, max: Duration, seed: u64) -> Backoff {
        Backoff {
            min,
            max: max.max(min),
            last: min,
            state: seed,
        }
    }

    /// The delay before the next attempt: uniform in `[min, min(3 × last, max)]`.
    pub fn next_delay(&mut self) -> Duration {
        let low = self.min.as_secs_f64();
        let high = (self.last.as_secs_f64() * 3.0)
            .min(self.max.as_secs_f64())
            .max(low);
        let delay = low + (high - low) * self.unit();
        self.last = Duration::from_secs_f64(delay).clamp(self.min, self.max);
        self.last
    }

    /// After a success: the next failure starts from `min` again.
    pub fn reset(&mut self) {
        self.last = self.min;
    }

    /// The last delay handed out (`min` before the first or after a reset).
    pub fn last(&self) -> Duration {
        self.last
    }

    /// A uniform number in `[0, 1)` (splitmix64: tiny state, good enough to spread retries).
    fn unit(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn the_same_seed_gives_the_same_delays_and_another_seed_others() {
        let run = |seed| {
            let mut b = Backoff::seeded(ms(100), ms(5000), seed);
            (0..8).map(|_| b.next_delay()).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn a_reset_starts_again_from_the_minimum() {
        let mut b = Backoff::seeded(ms(100), ms(5000), 1);
        for _ in 0..20 {
            b.next_delay();
        }
        b.reset();
        assert_eq!(b.last(), ms(100));
        assert!(b.next_delay() <= ms(300));
    }

    #[test]
    fn at_the_cap_the_delays_spread_over_the_whole_range_instead_of_piling_up_at_it() {
        let mut b = Backoff::seeded(ms(100), ms(5000), 11);
        let delays: Vec<Duration> = (0..1000).map(|_| b.next_delay()).skip(20).collect();
        let at_cap = delays.iter().filter(|d| **d == ms(5000)).count();
        assert!(at_cap < 10, "{at_cap} of {} at the cap", delays.len());
        let below_half = delays.iter().filter(|d| **d < ms(2500)).count();
        assert!(below_half > 300, "{below_half} below half the cap");
    }

    #[test]
    fn a_maximum_below_the_minimum_pins_every_delay_to_the_minimum() {
        let mut b = Backoff::seeded(ms(200), ms(50), 3);
        assert!((0..10).all(|_| b.next_delay() == ms(200)));
    }

    #[test]
    fn a_thousand_retriers_do_not_retry_in_lockstep() {
        // 1,000 agents whose watch broke at the same instant: their third retry is spread
        // over seconds, not one instant (the old doubling put all 1,000 at 700 ms).
        let mut thirds: Vec<Duration> = (0..1000u64)
            .map(|seed| {
                let mut b = Backoff::seeded(ms(100), ms(5000), seed);
                (0..3).map(|_| b.next_delay()).sum()
            })
            .collect();
        thirds.sort();
        let (p10, p90) = (thirds[100], thirds[900]);
        assert!(p90 - p10 > ms(500), "p10 {p10:?}, p90 {p90:?}");
        thirds.dedup();
        assert!(thirds.len() > 990, "{} distinct instants", thirds.len());
    }

    proptest! {
        #[test]
        fn every_delay_is_within_the_bounds_and_at_most_three_times_the_last(
            seed in any::<u64>(), min in 1u64..1000, span in 0u64..100_000, n in 1usize..50
        ) {
            let (min, max) = (ms(min), ms(min + span));
            let mut b = Backoff::seeded(min, max, seed);
            let mut last = min;
            for _ in 0..n {
                let d = b.next_delay();
                prop_assert!(d >= min && d <= max, "{d:?} outside [{min:?}, {max:?}]");
                prop_assert!(d <= last * 3 + ms(1), "{d:?} after {last:?}");
                last = d;
            }
        }
    }
}
