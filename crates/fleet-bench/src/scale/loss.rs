//! Machine loss at scale: a tenth of the machines lost at once, and the machine of the engine
//! that leads. In the production shape a lost machine crashes (nothing revoked: its lease
//! ends after the TTL, as a real crash's), in the lab's its lease is revoked.

use anyhow::{Result, bail};
use std::collections::HashSet;
use std::time::Duration;
use tokio::time::Instant;

use super::{CONVERGE_WITHIN, Roles};
use crate::shape::Shape;
use crate::sim::Sim;

/// Recovery from losing a tenth of the machines.
#[derive(Debug)]
pub(super) struct Loss {
    /// The engines' `engine_move_rate` (`None`: fleetd's default).
    pub move_rate: Option<u32>,
    pub killed: usize,
    pub affected: usize,
    /// Until etcd had ended every lost machine's lease (their presence keys gone): the TTL's
    /// share of the recovery, etcd's, before the engine can see anything.
    pub expired_in: Duration,
    pub rescheduled_in: Duration,
    pub recovered_in: Duration,
    pub roles: Roles,
    /// How the machines were lost: `crash, lease expiry` or `lease revoked`.
    pub how: &'static str,
    /// Running elsewhere within this long (TTL + 5 s after a crash, 10 s after a revoke).
    pub target: Duration,
}

pub(super) async fn lose_tenth(sim: &mut Sim, units: usize) -> Result<Loss> {
    let n = sim.machines.len();
    let count = n.div_ceil(10);
    // The last machines: the engine candidates run on the first ones.
    let victims: Vec<usize> = (n - count..n).collect();
    let dead: HashSet<String> = victims
        .iter()
        .map(|&i| sim.machines[i].id.to_string())
        .collect();
    let affected = sim.monitor.with(|v| v.scheduled_on(&dead));
    let roles = Roles::now(sim);
    let t0 = Instant::now();
    sim.lose(&victims).await?;
    let expired_in = sim
        .monitor
        .wait(
            t0,
            CONVERGE_WITHIN,
            "the lost machines' leases ended",
            |v| v.present_of(&dead) == 0,
        )
        .await?;
    let gone = |v: &crate::monitor::View| v.scheduled_on(&dead) == 0 && v.scheduled() >= units;
    let rescheduled_in = sim
        .monitor
        .wait(
            t0,
            CONVERGE_WITHIN,
            "units of lost machines rescheduled",
            gone,
        )
        .await?;
    let recovered_in = sim
        .monitor
        .wait(
            t0,
            CONVERGE_WITHIN,
            "units of lost machines running elsewhere",
            |v| gone(v) && v.launched() >= units,
        )
        .await?;
    let (how, target) = match sim.spec.shape.shape {
        Shape::Production => (
            "crash, lease expiry",
            sim.spec.agent_ttl + Duration::from_secs(5),
        ),
        Shape::Lab => ("lease revoked", Duration::from_secs(10)),
    };
    Ok(Loss {
        how,
        target,
        move_rate: sim.spec.move_rate,
        killed: count,
        affected,
        expired_in,
        rescheduled_in,
        recovered_in,
        roles: roles.since(sim),
    })
}

/// Losing the machine whose engine leads (its agent, its lease and its engine at once).
#[derive(Debug)]
pub(super) struct LeaderLoss {
    /// Units that ran on the lost machine.
    pub affected: usize,
    /// Until another engine held the leader key.
    pub new_leader_in: Duration,
    /// Until the lost machine's units ran elsewhere.
    pub recovered_in: Duration,
    /// Units not on the lost machine whose placement changed: a new leader that resumes
    /// re-places none.
    pub replaced: usize,
}

pub(super) async fn lose_leader(sim: &mut Sim, units: usize) -> Result<LeaderLoss> {
    let Some(leader) = sim.leader_index().await? else {
        bail!("no engine leads");
    };
    let id = sim.machines[leader].id.to_string();
    let before = sim.monitor.with(crate::monitor::View::placements);
    let affected = before.values().filter(|m| **m == id).count();
    let dead = HashSet::from([id.clone()]);
    let t0 = Instant::now();
    sim.crash(&[leader]);
    let new_leader_in = loop {
        if let Ok(Some(now)) = sim.leader_index().await
            && now != leader
        {
            break t0.elapsed();
        }
        if t0.elapsed() > CONVERGE_WITHIN {
            bail!("no new engine leader within {CONVERGE_WITHIN:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let recovered_in = sim
        .monitor
        .wait(
            t0,
            CONVERGE_WITHIN,
            "the leader's machine's units running elsewhere",
            |v| v.scheduled_on(&dead) == 0 && v.scheduled() >= units && v.launched() >= units,
        )
        .await?;
    let after = sim.monitor.with(crate::monitor::View::placements);
    let replaced = before
        .iter()
        .filter(|(unit, m)| **m != id && after.get(*unit) != Some(*m))
        .count();
    Ok(LeaderLoss {
        affected,
        new_leader_in,
        recovered_in,
        replaced,
    })
}
