//! A follower's judgement of the leader key (issue 38, item 3): a key that leads nothing is
//! taken over rather than followed forever. Pure: the follower reads the key
//! ([`Registry::leader_key`](fleet_registry::Registry::leader_key)) and acts on the verdict.
//!
//! A key naming a machine that is not registered is taken over only once the same key
//! (the same mod revision) has named an unregistered machine for [`grace`]: a leader's
//! agent re-registers within an agent TTL of etcd's return, so a real leader that lost its
//! presence for a moment keeps leading. The follower must be registered itself
//! (`LeaderKey::Unregistered::judged`), or it suspects nothing.

use fleet_registry::LeaderKey;
use fleet_registry::kv::Revision;
use std::time::Duration;
use tokio::time::Instant;

use super::EngineConfig;

/// How long a leader key may name an unregistered machine before a follower takes it over:
/// two agent TTLs (the disruption rule's window is the agent TTL).
pub(super) fn grace(cfg: &EngineConfig) -> Duration {
    cfg.disruption.window * 2
}

/// Since when the key at `mod_revision` has named an unregistered machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Suspicion {
    pub mod_revision: Revision,
    pub since: Instant,
}

impl Suspicion {
    /// When the suspicion ripens.
    pub fn due(&self, grace: Duration) -> Instant {
        self.since + grace
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    /// No key, or one that leads nothing: campaign (a campaign takes a stale key over).
    Campaign,
    /// The key has named an unregistered machine for the whole grace: take it over.
    TakeOver,
    /// Follow the leader, suspecting its key or not.
    Follow(Option<Suspicion>),
}

/// The verdict on `key`, read at `now`, after the suspicion `before`.
pub(super) fn judge(
    before: Option<Suspicion>,
    key: &LeaderKey,
    now: Instant,
    grace: Duration,
) -> Verdict {
    match key {
        LeaderKey::Vacant | LeaderKey::Stray { .. } => Verdict::Campaign,
        LeaderKey::Held { .. } | LeaderKey::Unregistered { judged: false, .. } => {
            Verdict::Follow(None)
        }
        LeaderKey::Unregistered {
            mod_revision,
            judged: true,
            ..
        } => match before {
            Some(s) if s.mod_revision == *mod_revision && now >= s.due(grace) => Verdict::TakeOver,
            Some(s) if s.mod_revision == *mod_revision => Verdict::Follow(Some(s)),
            _ => Verdict::Follow(Some(Suspicion {
                mod_revision: *mod_revision,
                since: now,
            })),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unregistered(mod_revision: Revision, judged: bool) -> LeaderKey {
        LeaderKey::Unregistered {
            machine: "gone".parse().unwrap(),
            mod_revision,
            judged,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_naming_an_unregistered_machine_is_taken_over_only_after_the_grace() {
        let grace = Duration::from_secs(60);
        let t0 = Instant::now();
        let Verdict::Follow(Some(s)) = judge(None, &unregistered(7, true), t0, grace) else {
            panic!("suspected at once");
        };
        let early = t0 + Duration::from_secs(59);
        assert_eq!(
            judge(Some(s), &unregistered(7, true), early, grace),
            Verdict::Follow(Some(s))
        );
        let due = t0 + grace;
        assert_eq!(
            judge(Some(s), &unregistered(7, true), due, grace),
            Verdict::TakeOver
        );
        // Another key (rewritten since) starts the grace again.
        let Verdict::Follow(Some(again)) = judge(Some(s), &unregistered(8, true), due, grace)
        else {
            panic!("suspected again");
        };
        assert_eq!(again.since, due);
    }

    #[test]
    fn a_registered_leader_or_an_unregistered_judge_suspects_nothing() {
        let now = Instant::now();
        let grace = Duration::from_secs(60);
        let old = Suspicion {
            mod_revision: 7,
            since: now - grace * 2,
        };
        let held = LeaderKey::Held {
            machine: "m1".parse().unwrap(),
        };
        assert_eq!(judge(Some(old), &held, now, grace), Verdict::Follow(None));
        assert_eq!(
            judge(Some(old), &unregistered(7, false), now, grace),
            Verdict::Follow(None)
        );
        assert_eq!(
            judge(None, &LeaderKey::Vacant, now, grace),
            Verdict::Campaign
        );
    }
}
