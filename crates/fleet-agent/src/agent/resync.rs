//! When the agent's periodic resync fires. Every agent of a cluster starts within seconds of
//! the others (a reboot of the fleet, an etcd outage that restarts them, a bench), and a fixed
//! interval kept them in step: in the 1,000-machine simulation every agent read its schedule
//! in the same 100 ms once a minute (docs/benchmarks.md, section 6). So the first resync
//! comes at a random phase of the interval, and each later one after 90–100 % of it: the
//! phases stay spread and never drift back into step, and no two resyncs of one agent are
//! more than one interval apart (the safety net's promise).
//!
//! Pure but for the random draw: the caller sleeps what [`Resync::next_delay`] returns.

use std::time::Duration;

/// The shortest delay handed out: a zero interval must not make the loop spin.
const MIN_DELAY: Duration = Duration::from_millis(10);

/// The share of the interval a later resync may come early by.
const EARLY: f64 = 0.1;

/// The delays between one agent's periodic resyncs.
#[derive(Debug, Clone)]
pub(super) struct Resync {
    interval: Duration,
    first: bool,
}

impl Resync {
    pub(super) fn new(interval: Duration) -> Resync {
        Resync {
            interval,
            first: true,
        }
    }

    /// The delay until the next resync.
    pub(super) fn next_delay(&mut self) -> Duration {
        let d = delay(self.interval, self.first, rand::random::<f64>());
        self.first = false;
        d
    }
}

/// The delay for a uniform draw `unit` in `[0, 1)`: the first anywhere in the interval (a
/// phase), later ones in its last tenth.
fn delay(interval: Duration, first: bool, unit: f64) -> Duration {
    let unit = unit.clamp(0.0, 1.0);
    let share = if first { unit } else { 1.0 - EARLY * unit };
    interval.mul_f64(share).max(MIN_DELAY)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn agents_started_together_spread_their_first_resyncs_over_the_interval() {
        let mut per_second = [0usize; 60];
        for _ in 0..1000 {
            let first = Resync::new(MINUTE).next_delay();
            assert!(first <= MINUTE && first >= MIN_DELAY, "{first:?}");
            per_second[(first.as_secs() as usize).min(59)] += 1;
        }
        let busiest = per_second.iter().max().copied().unwrap_or(0);
        // Uniform is ~17 a second; lockstep was all 1,000 in one.
        assert!(busiest < 50, "busiest second had {busiest} of 1000");
    }

    #[test]
    fn later_resyncs_come_after_nine_tenths_to_all_of_the_interval() {
        let mut r = Resync::new(MINUTE);
        r.next_delay();
        let later: Vec<Duration> = (0..200).map(|_| r.next_delay()).collect();
        assert!(
            later
                .iter()
                .all(|d| *d >= MINUTE.mul_f64(1.0 - EARLY) && *d <= MINUTE)
        );
        let distinct: std::collections::BTreeSet<_> = later.iter().collect();
        assert!(distinct.len() > 190, "{} distinct delays", distinct.len());
    }

    #[test]
    fn the_bounds_of_the_draw_give_the_bounds_of_the_delay() {
        assert_eq!(delay(MINUTE, true, 0.0), MIN_DELAY);
        assert_eq!(delay(MINUTE, true, 1.0), MINUTE);
        assert_eq!(delay(MINUTE, false, 0.0), MINUTE);
        assert_eq!(delay(MINUTE, false, 1.0), MINUTE.mul_f64(0.9));
        assert_eq!(delay(Duration::ZERO, false, 0.5), MIN_DELAY);
    }
}
