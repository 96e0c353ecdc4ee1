//! Whether this machine's lease may have lapsed since the agent last read its schedule
//! (issue 36). A fleetd frozen past its fence's deadline wakes up with a schedule from before:
//! its fence stopped the units, the engine started them elsewhere, and the change events of
//! the fenced units would make the agent start them again from the old schedule, a second
//! copy, before it hears of the new lease. So while in doubt the agent acts on nothing, and
//! once the lease is renewed it reads the whole schedule before it acts again.
//!
//! In doubt: the fence's deadline has passed (the lease may have expired), or it passed at
//! some point since the last schedule read ([`Deadline::lapses`] counts such lapses, as the
//! presence keeper saw them when it pushed the deadline again). Only a read that began after
//! a renewal ends a lapse: a thawed fleetd's first keep-alive times out at once, and the move
//! of the fence that follows says nothing of the lease ([`Deadline::live_lapses`]).
//! Pure: `now` is an argument.

use crate::fence::Deadline;
use tokio::sync::watch;
use tokio::time::Instant;

#[derive(Debug)]
pub(crate) struct LeaseDoubt {
    fence: Option<watch::Receiver<Option<Deadline>>>,
    /// The lapses counted when the last schedule read began on a live lease.
    read_at_lapses: u64,
}

impl LeaseDoubt {
    /// No fence: never in doubt, as before the fence.
    pub(crate) fn none() -> LeaseDoubt {
        LeaseDoubt {
            fence: None,
            read_at_lapses: 0,
        }
    }

    pub(crate) fn of(fence: watch::Receiver<Option<Deadline>>) -> LeaseDoubt {
        LeaseDoubt {
            fence: Some(fence),
            read_at_lapses: 0,
        }
    }

    /// The deadline as it stands.
    pub(crate) fn deadline(&self) -> Option<Deadline> {
        self.fence.as_ref().and_then(|f| *f.borrow())
    }

    /// Whether the agent must not act on the schedule it holds.
    pub(crate) fn in_doubt(&self, now: Instant) -> bool {
        doubtful(self.deadline(), self.read_at_lapses, now)
    }

    /// Whether a read of the schedule now would end the doubt: in doubt, but the lease was
    /// renewed since (a renewal, not only a move of the fence after etcd did not answer).
    pub(crate) fn wants_read(&self, now: Instant) -> bool {
        self.deadline()
            .is_some_and(|d| now <= d.at && d.live() && d.lapses > self.read_at_lapses)
    }

    /// A schedule read that began at `started`, with the deadline `at_start`, succeeded: it
    /// ends the lapses a renewal had ended before it began.
    pub(crate) fn read(&mut self, at_start: Option<Deadline>, started: Instant) {
        if let Some(d) = at_start
            && started <= d.at
        {
            self.read_at_lapses = self.read_at_lapses.max(d.live_lapses);
        }
    }
}

fn doubtful(deadline: Option<Deadline>, read_at_lapses: u64, now: Instant) -> bool {
    deadline.is_some_and(|d| now > d.at || d.lapses > read_at_lapses)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[tokio::test(start_paused = true)]
    async fn a_live_lease_read_once_is_never_in_doubt() {
        let t0 = Instant::now();
        let (tx, rx) = watch::channel(Some(Deadline {
            at: t0 + secs(3),
            lapses: 0,
            live_lapses: 0,
        }));
        let mut d = LeaseDoubt::of(rx);
        d.read(d.deadline(), t0);
        assert!(!d.in_doubt(t0 + secs(1)));
        tx.send_replace(Some(Deadline {
            at: t0 + secs(4),
            lapses: 0,
            live_lapses: 0,
        }));
        assert!(!d.in_doubt(t0 + secs(3)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_passed_deadline_is_doubt_until_a_read_on_the_renewed_lease() {
        let t0 = Instant::now();
        let (tx, rx) = watch::channel(Some(Deadline {
            at: t0 + secs(3),
            lapses: 0,
            live_lapses: 0,
        }));
        let mut d = LeaseDoubt::of(rx);
        d.read(d.deadline(), t0);
        assert!(d.in_doubt(t0 + secs(10)), "frozen past the deadline");
        assert!(
            !d.wants_read(t0 + secs(10)),
            "no read before the lease is renewed"
        );
        // Thawed: a new lease, the deadline pushed again; the lapse is counted.
        tx.send_replace(Some(Deadline {
            at: t0 + secs(13),
            lapses: 1,
            live_lapses: 1,
        }));
        assert!(
            d.in_doubt(t0 + secs(10)),
            "the schedule is still the old one"
        );
        assert!(d.wants_read(t0 + secs(10)));
        // A read that began before the renewal does not end it.
        d.read(
            Some(Deadline {
                at: t0 + secs(3),
                lapses: 0,
                live_lapses: 0,
            }),
            t0 + secs(9),
        );
        assert!(d.in_doubt(t0 + secs(10)));
        d.read(d.deadline(), t0 + secs(10));
        assert!(!d.in_doubt(t0 + secs(11)));
    }

    /// The thawed fleetd's first keep-alive timed out (its timer ran out while frozen): the
    /// fence moved on, but a read then would be on a lease that may have expired, and it
    /// neither is asked for nor ends the doubt. The registration that follows does.
    #[tokio::test(start_paused = true)]
    async fn a_move_of_the_fence_after_a_lapse_is_doubt_until_a_renewal() {
        let t0 = Instant::now();
        let first = Deadline::renewed(None, t0 + secs(3), t0);
        let (tx, rx) = watch::channel(Some(first));
        let mut d = LeaseDoubt::of(rx);
        d.read(d.deadline(), t0);
        let moved = Deadline::moved(Some(first), t0 + secs(13), t0 + secs(10));
        tx.send_replace(Some(moved));
        assert!(d.in_doubt(t0 + secs(10)));
        assert!(!d.wants_read(t0 + secs(10)), "no renewal yet");
        d.read(d.deadline(), t0 + secs(10));
        assert!(
            d.in_doubt(t0 + secs(11)),
            "a read on a moved fence ended the doubt"
        );
        tx.send_replace(Some(Deadline::renewed(
            Some(moved),
            t0 + secs(14),
            t0 + secs(11),
        )));
        assert!(d.wants_read(t0 + secs(11)));
        d.read(d.deadline(), t0 + secs(11));
        assert!(!d.in_doubt(t0 + secs(12)));
        assert!(!d.wants_read(t0 + secs(12)));
    }

    #[test]
    fn no_fence_is_never_in_doubt() {
        let d = LeaseDoubt::none();
        assert!(!d.in_doubt(Instant::now()));
        assert!(!d.wants_read(Instant::now()));
    }
}
