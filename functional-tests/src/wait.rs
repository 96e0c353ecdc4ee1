//! Waiting for a condition with a deadline: the only way tests here wait. A fixed sleep is
//! either too short on a busy 2-core CI box or wastes time everywhere else; polling a condition
//! is neither.

use anyhow::{Result, bail};
use std::time::{Duration, Instant};

/// Polls `condition` every `poll` until it returns true, or fails after `timeout`.
/// The condition runs at least once, even with a zero timeout.
pub fn wait_for(
    timeout: Duration,
    poll: Duration,
    mut condition: impl FnMut() -> bool,
) -> Result<()> {
    wait_for_value(timeout, poll, || condition().then_some(()))
}

/// Polls `probe` every `poll` until it yields a value, or fails after `timeout`.
pub fn wait_for_value<T>(
    timeout: Duration,
    poll: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe() {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            bail!("condition not met within {timeout:?}");
        }
        std::thread::sleep(poll.min(deadline.saturating_duration_since(Instant::now())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_as_soon_as_the_condition_holds() {
        let mut calls = 0;
        wait_for(Duration::from_secs(5), Duration::from_millis(1), || {
            calls += 1;
            calls == 3
        })
        .unwrap();
        assert_eq!(calls, 3);
    }

    #[test]
    fn fails_after_the_timeout() {
        let started = Instant::now();
        let err = wait_for(Duration::from_millis(30), Duration::from_millis(5), || {
            false
        })
        .unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(30));
        assert!(err.to_string().contains("not met"), "{err}");
    }

    #[test]
    fn yields_the_probed_value() {
        let value = wait_for_value(Duration::ZERO, Duration::ZERO, || Some(7)).unwrap();
        assert_eq!(value, 7);
    }
}
