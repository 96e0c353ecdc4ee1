//! [`Pacer`]: how many of a command's batches are in flight, paced to how long etcd takes to
//! answer them. Pure: it is told each answer's time and says how many may be in flight.
//!
//! A bulk `fleetctl start` wrote as fast as etcd took its transactions, so whenever etcd was
//! slower than the submit, every other client queued behind it: in the 100,000 launch on a
//! slower machine, the engine's 1 s decision writes timed out behind the submit and up to
//! 97 % of its `scheduled` events were lost (docs/benchmarks.md, *Renewals that wait*). The
//! pacer keeps what the submit adds to etcd's queue under [`QUEUE_AT_MOST`], a quarter of
//! fleetd's default request deadline, by TCP's rule: one more batch in flight per round of
//! answers on time, half as many after a late one. On an etcd that keeps up it stays at
//! [`BATCHES_IN_FLIGHT`](super::BATCHES_IN_FLIGHT).

use std::time::Duration;

/// How much longer than the fastest answer of this command an answer may take before the
/// pacer counts etcd's queue as the command's doing. Measured from the fastest answer, not
/// from zero, so a distant etcd (a WAN's round trip) is not taken for a busy one.
pub(in crate::etcd) const QUEUE_AT_MOST: Duration = Duration::from_millis(250);

/// The pacer of one command's batches.
#[derive(Debug, Clone)]
pub(in crate::etcd) struct Pacer {
    most: usize,
    /// Batches allowed in flight; fractional so that on-time answers add one per round.
    limit: f64,
    /// The fastest answer so far: etcd's time for a batch with no queue of this command's.
    fastest: Option<Duration>,
    /// How often the limit was halved. A batch sent before the last halving answers for a
    /// limit already cut, so its lateness does not cut again.
    cuts: u64,
}

impl Pacer {
    /// At most `most` in flight, starting at one and doubling each round until an answer is
    /// late (so that the fastest answer is etcd's own, not a queue the command made).
    pub(in crate::etcd) fn new(most: usize) -> Pacer {
        Pacer {
            most: most.max(1),
            limit: 1.0,
            fastest: None,
            cuts: 0,
        }
    }

    /// How many batches may be in flight now.
    pub(in crate::etcd) fn in_flight(&self) -> usize {
        (self.limit as usize).clamp(1, self.most)
    }

    /// What a batch sent now carries, for [`answered`](Self::answered).
    pub(in crate::etcd) fn epoch(&self) -> u64 {
        self.cuts
    }

    /// A batch sent at `epoch` was answered after `took`.
    pub(in crate::etcd) fn answered(&mut self, epoch: u64, took: Duration) {
        let fastest = *self
            .fastest
            .insert(self.fastest.map_or(took, |f| f.min(took)));
        let most = self.most as f64;
        if took > fastest + QUEUE_AT_MOST {
            if epoch == self.cuts {
                self.limit = (self.limit / 2.0).max(1.0);
                self.cuts += 1;
            }
        } else if self.cuts == 0 {
            self.limit = (self.limit + 1.0).min(most);
        } else {
            self.limit = (self.limit + 1.0 / self.limit).min(most);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn doubles_each_round_to_the_most_while_answers_are_on_time() {
        let mut p = Pacer::new(8);
        let mut seen = vec![p.in_flight()];
        while p.in_flight() < 8 {
            for _ in 0..p.in_flight() {
                p.answered(p.epoch(), MS(40));
            }
            seen.push(p.in_flight());
        }
        assert_eq!(seen, [1, 2, 4, 8]);
        p.answered(p.epoch(), MS(40 + 250));
        assert_eq!(p.in_flight(), 8, "250 ms over the fastest is on time");
    }

    #[test]
    fn a_late_answer_halves_once_per_round_then_one_more_per_round() {
        let mut p = Pacer::new(8);
        for _ in 0..7 {
            p.answered(p.epoch(), MS(40));
        }
        assert_eq!(p.in_flight(), 8);
        let sent_at_eight = p.epoch();
        p.answered(sent_at_eight, MS(600));
        assert_eq!(p.in_flight(), 4);
        // The rest of that round was sent at 8 in flight: it says nothing of 4.
        for _ in 0..7 {
            p.answered(sent_at_eight, MS(600));
        }
        assert_eq!(p.in_flight(), 4);
        p.answered(p.epoch(), MS(600));
        assert_eq!(p.in_flight(), 2);
        // On time again: one more after about a round of answers.
        for _ in 0..3 {
            p.answered(p.epoch(), MS(50));
        }
        assert_eq!(p.in_flight(), 3);
    }

    #[test]
    fn never_fewer_than_one_nor_more_than_the_most() {
        let mut p = Pacer::new(3);
        for _ in 0..10 {
            p.answered(p.epoch(), MS(1));
            p.answered(p.epoch(), Duration::from_secs(5));
        }
        assert_eq!(p.in_flight(), 1);
        for _ in 0..100 {
            p.answered(p.epoch(), MS(1));
        }
        assert_eq!(p.in_flight(), 3);
        assert_eq!(Pacer::new(0).in_flight(), 1);
    }

    #[test]
    fn a_distant_etcd_is_not_a_busy_one() {
        let mut p = Pacer::new(8);
        for _ in 0..20 {
            p.answered(p.epoch(), MS(300));
        }
        assert_eq!(p.in_flight(), 8, "a 300 ms round trip with no queue");
    }
}
