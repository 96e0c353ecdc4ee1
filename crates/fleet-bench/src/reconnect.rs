//! Scenario `reconnect`: N simulated machines (real agents, fake systemd) and their engines
//! on one real etcd, which is killed and, after an outage, started again. Measures the etcd
//! requests every role sends in each 100 ms of the first seconds after etcd answers again:
//! whether the agents come back in lockstep (issue 12 item 4, issue 14 item 5), and how long
//! until etcd holds every watch again (its watcher gauge back to what it was before).
//!
//! No units are scheduled: what is measured is the reconnection itself (the watch hints'
//! retries, the schedule re-reads they wake, the engines' view, the presence keep-alives).

use anyhow::Result;
use std::time::{Duration, SystemTime};
use tokio::time::Instant;

use crate::report::{self, Table, secs};
use crate::scale::Roles;
use crate::sim::{Sim, SimSpec};

/// The sampling step.
const STEP: Duration = Duration::from_millis(100);

/// What one run measured.
#[derive(Debug)]
struct Outcome {
    /// All roles' requests in each [`STEP`] after etcd answered again.
    steps: Vec<u64>,
    /// The same for the agents alone.
    agent_steps: Vec<u64>,
    /// etcd's watchers before the outage, and when it held as many again.
    watchers: u64,
    watchers_back: Option<Duration>,
}

pub async fn run(machines: usize, outage: Duration, window: Duration) -> Result<String> {
    let started = SystemTime::now();
    let t0 = Instant::now();
    let mut sim = Sim::start(SimSpec::new(machines)).await?;
    // Let the start's own traffic die down.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let watchers = sim.etcd_watchers().await;
    sim.stop_etcd();
    tokio::time::sleep(outage).await;
    sim.restart_etcd().await;
    let outcome = measure(&sim, window, watchers).await;
    sim.stop().await;
    Ok(render(
        machines,
        outage,
        window,
        &outcome,
        started,
        t0.elapsed(),
    ))
}

/// Samples every role's counters each [`STEP`] for `window` after etcd is back.
async fn measure(sim: &Sim, window: Duration, watchers: u64) -> Outcome {
    let back = Instant::now();
    let mut last = Roles::now(sim);
    let (mut steps, mut agent_steps) = (Vec::new(), Vec::new());
    let mut watchers_back = None;
    let mut tick = tokio::time::interval_at(back + STEP, STEP);
    while back.elapsed() < window {
        tick.tick().await;
        let now = Roles::now(sim);
        let d = between(last, now);
        steps.push(d.client.total() + d.engines.total() + d.agents.total() + d.presence.total());
        agent_steps.push(d.agents.total());
        last = now;
        if watchers_back.is_none() && sim.etcd_watchers().await >= watchers {
            watchers_back = Some(back.elapsed());
        }
    }
    Outcome {
        steps,
        agent_steps,
        watchers,
        watchers_back,
    }
}

/// What every role sent from `a` to `b`.
fn between(a: Roles, b: Roles) -> Roles {
    Roles {
        client: b.client - a.client,
        engines: b.engines - a.engines,
        agents: b.agents - a.agents,
        presence: b.presence - a.presence,
    }
}

fn render(
    machines: usize,
    outage: Duration,
    window: Duration,
    o: &Outcome,
    started: SystemTime,
    took: Duration,
) -> String {
    let per_second = |steps: &[u64]| -> Vec<u64> {
        steps
            .chunks((Duration::from_secs(1).as_millis() / STEP.as_millis()) as usize)
            .map(|c| c.iter().sum())
            .collect()
    };
    let peak = |steps: &[u64]| steps.iter().copied().max().unwrap_or(0);
    let busiest = |steps: &[u64]| {
        let total: u64 = steps.iter().sum();
        let mut sorted = steps.to_vec();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let top: u64 = sorted.iter().take(3).sum();
        if total == 0 {
            0.0
        } else {
            100.0 * top as f64 / total as f64
        }
    };
    let mut table = Table::new(&[
        "second after etcd is back",
        "requests (all roles)",
        "of which agents",
    ]);
    for (i, (all, agents)) in per_second(&o.steps)
        .iter()
        .zip(per_second(&o.agent_steps))
        .enumerate()
    {
        table.row(vec![
            format!("{}-{}", i, i + 1),
            all.to_string(),
            agents.to_string(),
        ]);
    }
    let total: u64 = o.agent_steps.iter().sum();
    let steps: Vec<String> = o.agent_steps.iter().map(u64::to_string).collect();
    format!(
        "{}\n{machines} simulated machines (real agents, fake systemd, 3 engine candidates) on one \
         etcd, no units; etcd SIGKILLed, restarted after {}, then the requests of every role \
         counted for {} once it answers. The figures are the agents' (each machine's lease is kept \
         by fleetd's own presence keeper, retrying every 250 ms while the lease may live: \
         those requests are in the first table only).\n\n{}\n\
         | figure (agents) | measured |\n|---|---|\n\
         | requests in the {} after etcd is back | {total} ({:.0}/s) |\n\
         | busiest 100 ms | {} requests ({} /s) |\n\
         | share of them in the busiest 3 of {} steps of 100 ms | {:.0} % |\n\
         | etcd holds every watch again ({} watchers) after | {} |\n\n\
         Agents' requests per 100 ms: {}\n",
        report::provenance(started, took),
        secs(outage),
        secs(window),
        table.render(),
        secs(window),
        total as f64 / window.as_secs_f64(),
        peak(&o.agent_steps),
        peak(&o.agent_steps) * (Duration::from_secs(1).as_millis() / STEP.as_millis()) as u64,
        o.agent_steps.len(),
        busiest(&o.agent_steps),
        o.watchers,
        o.watchers_back
            .map_or_else(|| format!("not within {}", secs(window)), secs),
        steps.join(" "),
    )
}
