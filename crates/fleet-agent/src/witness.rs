//! Outside evidence for a machine that cannot reach etcd (issue 36; docs/guarantees.md,
//! promise 2). From inside, a host cut off alone from etcd looks like an etcd outage: its
//! keep-alives fail either way. The difference is whether the other machines still reach
//! etcd. If one does, this machine's lease will run out while the engine is alive, and its
//! units will be started elsewhere: the fence must fire at the lease's end, so the presence
//! keeper stops pushing it forward (and takes back what it pushed since the last renewal).
//! If none does (or none answers), it is an outage, or this machine cannot tell: the fence
//! moves on, and nothing is stopped on that ground alone.
//!
//! A peer is asked whether it reached etcd *after* this machine's first failed keep-alive
//! was sent (`within`, counted back from the moment the peer answers, which is no earlier
//! than the question was sent). An etcd freeze seen by every host has no such success, so
//! it fences nobody. A lying peer can only say "reached" and make this machine fence itself
//! early: it stops units, it never runs one twice.
//!
//! What remains: a host cut off from etcd and from every peer keeps its units (it cannot
//! tell that from a network outage of the whole cluster), and the engine starts them
//! elsewhere once its lease and fence margin are gone. docs/guarantees.md says so.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// What one peer answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The peer's machine ID, for logs.
    pub machine: String,
    /// Whether it reached etcd (a renewal of its lease, or a fresh probe) within the time asked.
    pub reached: bool,
}

/// What the peers said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Evidence {
    /// Machine `by` reached etcd after this machine could not: this one is cut off alone.
    CutOff { by: String },
    /// No peer reached etcd in that time, or none answered: an outage, as far as this
    /// machine can tell.
    NoneReached { asked: usize, answered: usize },
}

impl Evidence {
    /// The evidence of `answers` from `asked` peers: cut off as soon as one peer reached etcd.
    pub fn of(asked: usize, answers: &[Answer]) -> Evidence {
        match answers.iter().find(|a| a.reached) {
            Some(a) => Evidence::CutOff {
                by: a.machine.clone(),
            },
            None => Evidence::NoneReached {
                asked,
                answered: answers.len(),
            },
        }
    }

    pub fn is_cut_off(&self) -> bool {
        matches!(self, Evidence::CutOff { .. })
    }
}

impl fmt::Display for Evidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Evidence::CutOff { by } => write!(f, "machine {by} reaches etcd"),
            Evidence::NoneReached { asked, answered } => {
                write!(f, "no peer reaches etcd ({answered} of {asked} answered)")
            }
        }
    }
}

/// A boxed future, so that a keeper holds any witnesses behind one pointer.
pub type Asked<'a> = Pin<Box<dyn Future<Output = Evidence> + Send + 'a>>;

/// The other machines, as this machine can ask them.
pub trait Witnesses: Send + Sync + fmt::Debug {
    /// Asks the peers whether they reached etcd within `within` before answering. Returns
    /// within a bounded time, whatever the peers do.
    fn ask(&self, within: Duration) -> Asked<'_>;
}

/// Witnesses that always give the same evidence, for tests.
#[derive(Debug, Clone)]
pub struct Fixed(pub std::sync::Arc<std::sync::Mutex<Evidence>>);

impl Fixed {
    pub fn new(evidence: Evidence) -> Fixed {
        Fixed(std::sync::Arc::new(std::sync::Mutex::new(evidence)))
    }

    pub fn set(&self, evidence: Evidence) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = evidence;
    }
}

impl Witnesses for Fixed {
    fn ask(&self, _within: Duration) -> Asked<'_> {
        let evidence = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Box::pin(async move { evidence })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(machine: &str, reached: bool) -> Answer {
        Answer {
            machine: machine.to_owned(),
            reached,
        }
    }

    #[test]
    fn one_peer_that_reached_etcd_is_enough_to_know_this_machine_is_cut_off() {
        let answers = [answer("m2", false), answer("m3", true)];
        assert_eq!(
            Evidence::of(3, &answers),
            Evidence::CutOff { by: "m3".into() }
        );
    }

    #[test]
    fn silence_or_peers_that_cannot_reach_etcd_either_mean_an_outage() {
        assert_eq!(
            Evidence::of(2, &[answer("m2", false)]),
            Evidence::NoneReached {
                asked: 2,
                answered: 1
            }
        );
        assert!(!Evidence::of(0, &[]).is_cut_off());
    }
}
