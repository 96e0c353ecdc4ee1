//! Scenario 3, the scale simulation: N simulated machines (real agents on the fake systemd,
//! three real engine candidates) on one real etcd, U units started at once. Measures the time
//! until every unit is scheduled and reported launched, the etcd requests per unit by role and
//! kind, the watch events per scheduling decision, what one `fleetctl start` costs the agents
//! it does not concern, the idle traffic, and recovery from losing 10% of the machines.

use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};
use tokio::time::Instant;

use crate::counting::{Class, Method, Tally};
use crate::metered::Call;
use crate::metrics::{Metrics, received_between};
use crate::report::{self, ms, secs};
use crate::shape::ShapeSpec;
use crate::sim::{Sim, SimSpec, bench_unit, unit_text};
use crate::verdict::{self, Verdict};

mod events;
mod process;
pub use process::{cpu_of_stat, process_cpu, process_rss_mib, rss_of_status};
mod loss;
mod render;
mod roles;
use loss::{LeaderLoss, Loss, lose_tenth};
pub use render::fmt_map;
pub use roles::Roles;

/// How long a convergence may take before the scenario gives up.
pub const CONVERGE_WITHIN: Duration = Duration::from_secs(600);

/// One convergence: U units started at once on a running simulation.
#[derive(Debug, Clone)]
pub struct Converged {
    pub machines: usize,
    pub units: usize,
    pub submitted_in: Duration,
    pub scheduled_in: Duration,
    pub launched_in: Duration,
    pub roles: Roles,
    /// Schedule entries the engines wrote or deleted.
    pub decisions: u64,
    pub etcd: BTreeMap<String, u64>,
    pub etcd_cpu: f64,
    pub bench_cpu: f64,
}

/// Starts units 0..U and waits until every one is scheduled and reported launched.
pub async fn converge(sim: &Sim, units: usize) -> Result<Converged> {
    let all: Vec<_> = (0..units).map(|i| bench_unit(i, 1)).collect();
    let args = sim.write_units(&all)?;
    let before = Roles::now(sim);
    let metrics = Metrics::fetch(&sim.etcd_metrics())?;
    let cpu = process_cpu();
    let t0 = Instant::now();
    sim.submit(&args).await?.all()?;
    let submitted_in = t0.elapsed();
    let scheduled_in = sim
        .monitor
        .wait(t0, CONVERGE_WITHIN, "every unit scheduled", |v| {
            v.scheduled() >= units
        })
        .await?;
    let launched_in = sim
        .monitor
        .wait(t0, CONVERGE_WITHIN, "every unit launched", |v| {
            v.launched() >= units
        })
        .await?;
    let roles = before.since(sim);
    let after = Metrics::fetch(&sim.etcd_metrics())?;
    Ok(Converged {
        machines: sim.machines.len(),
        units,
        submitted_in,
        scheduled_in,
        launched_in,
        decisions: roles.engines.writes(Class::Schedule),
        roles,
        etcd: received_between(&metrics, &after),
        etcd_cpu: after.sum("process_cpu_seconds_total", &[])
            - metrics.sum("process_cpu_seconds_total", &[]),
        bench_cpu: process_cpu() - cpu,
    })
}

/// What one `fleetctl start` cost the agents.
#[derive(Debug)]
struct Uninvolved {
    latency: Duration,
    involved: Option<usize>,
    /// Agents other than the involved one that got a watch event or did more than their
    /// periodic resync (read their own schedule).
    woken: usize,
    /// Agents whose periodic resync happened to fall in the window.
    resyncs: usize,
    /// Watch events delivered to agents other than the involved one.
    stray_events: u64,
    involved_tally: Tally,
    roles: Roles,
    etcd: BTreeMap<String, u64>,
}

async fn one_start(
    sim: &Sim,
    fleetctl: &std::path::Path,
    dir: &std::path::Path,
) -> Result<Uninvolved> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("probe.service");
    std::fs::write(&path, unit_text(999_999, 1))?;
    let snapshot = |sim: &Sim| -> Vec<(Tally, u64)> {
        sim.machines
            .iter()
            .map(|m| (m.counters.tally(), m.calls.get(Call::Installed)))
            .collect()
    };
    let before = snapshot(sim);
    let roles = Roles::now(sim);
    let metrics = Metrics::fetch(&sim.etcd_metrics())?;
    let t0 = Instant::now();
    // fleetctl's default driver is the API (as fleet's); the simulation has only etcd.
    let out = tokio::process::Command::new(fleetctl)
        .args(sim.fleetctl_args(false)?)
        .args(["start", "--block-attempts", "30"])
        .arg(&path)
        .output()
        .await
        .context("running fleetctl")?;
    let latency = t0.elapsed();
    anyhow::ensure!(
        out.status.success(),
        "fleetctl start failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Anything an uninvolved agent would do because of the start happens within milliseconds.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = snapshot(sim);
    let roles = roles.since(sim);
    let etcd = received_between(&metrics, &Metrics::fetch(&sim.etcd_metrics())?);
    let involved_id = sim
        .monitor
        .with(|v| v.machine_of("probe.service").map(str::to_owned));
    let involved = involved_id.and_then(|id| sim.machines.iter().position(|m| m.id.as_str() == id));
    let (mut woken, mut resyncs, mut stray_events) = (0, 0, 0);
    let mut involved_tally = Tally::default();
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        let tally = a.0 - b.0;
        if Some(i) == involved {
            involved_tally = tally;
            continue;
        }
        stray_events += tally.watch_events;
        // A start reaches an agent only through its watch; its periodic resync (every 60 s,
        // whatever happens) reads its own schedule and nothing else.
        let schedule_reads = tally.requests(Method::Range, Class::Schedule);
        if tally.watch_events > 0 || tally.total() > schedule_reads {
            woken += 1;
        } else if a.1 > b.1 {
            resyncs += 1;
        }
    }
    Ok(Uninvolved {
        latency,
        involved,
        woken,
        resyncs,
        stray_events,
        involved_tally,
        roles,
        etcd,
    })
}

/// What happened while nothing changed.
#[derive(Debug)]
struct Idle {
    window: Duration,
    roles: Roles,
    etcd: BTreeMap<String, u64>,
    /// The agents' schedule reads (their periodic resyncs) in each second of the window.
    resyncs_per_second: Vec<u64>,
    /// The leading engine's range reads in the window (`None`: no engine led throughout).
    leader_reads: Option<u64>,
    /// The other engines' range reads, and how many they are.
    follower_reads: u64,
    followers: usize,
}

impl Idle {
    /// The busiest second's share of the window's resync reads (1.0: all in one second, as
    /// in lockstep; 1/60 when spread evenly over a minute).
    fn busiest_share(&self) -> f64 {
        let total: u64 = self.resyncs_per_second.iter().sum();
        let busiest = self.resyncs_per_second.iter().max().copied().unwrap_or(0);
        busiest as f64 / total.max(1) as f64
    }
}

/// What the roles do while nothing changes, with the agents' schedule reads counted per
/// second (sampled every 100 ms).
async fn idle(sim: &Sim, window: Duration) -> Result<Idle> {
    let roles = Roles::now(sim);
    let engines = sim.engine_counters().await?;
    let ranges = |c: &std::sync::Arc<crate::counting::Counters>| c.tally().method(Method::Range);
    let engines_before = engines
        .as_ref()
        .map(|(lead, follow)| (ranges(lead), follow.iter().map(ranges).sum::<u64>()));
    let metrics = Metrics::fetch(&sim.etcd_metrics())?;
    let reads = |sim: &Sim| {
        sim.roles
            .agents
            .tally()
            .requests(Method::Range, Class::Schedule)
    };
    let t0 = Instant::now();
    let mut per_second = vec![0u64; window.as_secs().max(1) as usize];
    let mut last = reads(sim);
    while t0.elapsed() < window {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = reads(sim);
        let second = (t0.elapsed().as_secs() as usize).min(per_second.len() - 1);
        per_second[second] += now - last;
        last = now;
    }
    let etcd = received_between(&metrics, &Metrics::fetch(&sim.etcd_metrics())?);
    let still_leading = match (&engines, sim.engine_counters().await?) {
        (Some((lead, _)), Some((now, _))) => std::sync::Arc::ptr_eq(lead, &now),
        _ => false,
    };
    let (leader_reads, follower_reads, followers) = match (engines, engines_before) {
        (Some((lead, follow)), Some((lead0, follow0))) => (
            still_leading.then(|| ranges(&lead) - lead0),
            follow.iter().map(ranges).sum::<u64>() - follow0,
            follow.len(),
        ),
        _ => (None, 0, 0),
    };
    Ok(Idle {
        window,
        roles: roles.since(sim),
        etcd,
        resyncs_per_second: per_second,
        leader_reads,
        follower_reads,
        followers,
    })
}

/// What the scale scenario runs.
#[derive(Debug, Clone)]
pub struct ScaleArgs {
    pub machines: usize,
    pub units: usize,
    /// The idle window (at least the agents' 60 s resync).
    pub idle: Duration,
    pub agent_ttl: Duration,
    pub move_rate: Option<u32>,
    pub shape: ShapeSpec,
    /// Whether to converge again with events switched the other way (issue 41's cost).
    pub events_compare: bool,
    /// How long the `events --follow` check emits (zero: no check).
    pub follow: Duration,
    pub fleetctl: PathBuf,
}

impl ScaleArgs {
    /// The simulation of these arguments in `shape`.
    pub(crate) fn spec(&self, shape: ShapeSpec) -> SimSpec {
        let mut spec = SimSpec::shaped(self.machines, shape);
        spec.agent_ttl = self.agent_ttl;
        spec.move_rate = self.move_rate;
        spec
    }
}

/// Everything measured on the scenario's one simulation.
#[derive(Debug)]
struct Measured {
    c: Converged,
    rss: f64,
    idle: Idle,
    one: Result<Uninvolved>,
    loss: Loss,
    leader: Result<LeaderLoss>,
    /// Events in etcd after the launch (count, bytes), with events on.
    space: Option<(u64, u64)>,
    follow: Option<events::Follow>,
}

/// Runs the whole scenario; returns the Markdown section.
pub async fn run(a: ScaleArgs) -> Result<String> {
    let wall = SystemTime::now();
    let started = Instant::now();
    let shape_line = a.shape.line(a.machines);
    println!("scale: {shape_line}");
    // A simulation that cannot start in this shape (its machines cannot log in within
    // fleetd's deadline) is a figure: the section says so.
    let mut sim = match Sim::start(a.spec(a.shape.clone())).await {
        Ok(sim) => sim,
        Err(e) => {
            println!("scale: the simulation did not start: {e:#}");
            let mut out = report::provenance(wall, started.elapsed());
            out.push_str(&format!(
                "\n{shape_line}.\n\nThe simulation did not start: {e:#}.\n"
            ));
            return Ok(out);
        }
    };
    let users = sim.credentials.as_ref().map(|c| {
        let copied = match c.copied {
            true => "copied from this run's first etcd of this size, where they were ",
            false => "",
        };
        format!(
            "etcd's roles and users for {} machines {copied}made in {} (machine roles \
             first, then users; `fleetctl auth add-host` one host after another is slower: \
             each of etcd 3.4's auth changes costs more the more users it holds)",
            c.machines.len(),
            secs(c.took)
        )
    });
    if let Some(users) = &users {
        println!("scale: {users}");
    }
    println!(
        "scale: {} machines registered in {}, agents watching after {}",
        a.machines,
        secs(sim.joined_in),
        secs(sim.agents_ready_in)
    );
    let m = measure(&mut sim, &a).await;
    sim.stop().await;
    let m = m?;
    let other = match a.events_compare {
        true => Some(events::other_way(&a).await?),
        false => None,
    };
    let keys = m.c.roles.keys_written();
    println!("scale: etcd alone, for the {keys} keys the launch wrote");
    let raw = crate::limit::raw_time(keys, &a.shape.etcd_args, a.shape.tls).await?;
    println!(
        "scale: submitted {}, scheduled {}, launched {}",
        crate::limit::ratio(m.c.submitted_in, &raw),
        crate::limit::ratio(m.c.scheduled_in, &raw),
        crate::limit::ratio(m.c.launched_in, &raw)
    );
    let verdicts = verdicts(&a, &m, other.as_ref());
    verdicts.iter().for_each(|v| println!("{}", v.line()));
    let mut out = report::provenance(wall, started.elapsed());
    out.push_str(&format!("\n{shape_line}.\n"));
    if let Some(users) = &users {
        out.push_str(&format!("\n{users}.\n"));
    }
    out.push('\n');
    out.push_str(&render::render(&m.c, m.rss, &m.idle, &m.one, &m.loss));
    out.push_str(&render::ratios(&m.c, &raw));
    out.push_str(&render::leader(&m.leader));
    out.push_str("\nGoals (issue 43; events: issue 41):\n\n");
    out.push_str(&crate::verdict::table(&verdicts));
    Ok(out)
}

/// Converges, then measures idle, one start, the events, and the two machine losses.
async fn measure(sim: &mut Sim, a: &ScaleArgs) -> Result<Measured> {
    let c = converge(sim, a.units).await?;
    println!(
        "scale: {} units submitted in {}, scheduled in {}, launched in {} (each from the \
         start of the submit)",
        a.units,
        secs(c.submitted_in),
        secs(c.scheduled_in),
        secs(c.launched_in)
    );
    println!(
        "scale: requests past their deadline: {} ({}); leases lost: {}",
        c.roles.timeouts(),
        c.roles.timeouts_by_role(),
        c.roles.leases_lost()
    );
    println!(
        "scale: requests past their deadline by kind: {}",
        c.roles.timeouts_by_method()
    );
    println!(
        "scale: transactions, mean / slowest: {}",
        c.roles.txn_latency_by_role()
    );
    let rss = process_rss_mib();
    let (space, follow) = events_figures(sim, a).await?;
    println!("scale: idle for {}", secs(a.idle));
    let idle = idle(sim, a.idle).await?;
    println!(
        "scale: idle; the busiest second held {:.1} % of the agents' resync reads",
        idle.busiest_share() * 100.0
    );
    // A failed probe (fleetctl's reads at this size) is a figure, not the end of the run.
    let one = one_start(sim, &a.fleetctl, &report::work_dir()).await;
    match &one {
        Ok(one) => println!(
            "scale: one fleetctl start took {}, uninvolved agents woken: {}",
            ms(one.latency),
            one.woken
        ),
        Err(e) => println!("scale: one fleetctl start failed: {e:#}"),
    }
    // The probe's unit runs too, when the probe got it started.
    let total = a.units + usize::from(one.is_ok());
    let loss = lose_tenth(sim, total).await?;
    println!(
        "scale: lost {} machines ({} units): leases ended in {}, rescheduled in {}, running \
         again in {}",
        loss.killed,
        loss.affected,
        secs(loss.expired_in),
        secs(loss.rescheduled_in),
        secs(loss.recovered_in)
    );
    let leader = loss::lose_leader(sim, total).await;
    match &leader {
        Ok(l) => println!(
            "scale: lost the leader's machine ({} units): new leader in {}, running again in \
             {}, {} other units re-placed",
            l.affected,
            secs(l.new_leader_in),
            secs(l.recovered_in),
            l.replaced
        ),
        Err(e) => println!("scale: losing the leader's machine: {e:#}"),
    }
    Ok(Measured {
        c,
        rss,
        idle,
        one,
        loss,
        leader,
        space,
        follow,
    })
}

/// With events on: their space in etcd after the launch, and the follow check.
async fn events_figures(
    sim: &Sim,
    a: &ScaleArgs,
) -> Result<(Option<(u64, u64)>, Option<events::Follow>)> {
    if !a.shape.events {
        return Ok((None, None));
    }
    // The writers batch: let the last events of the launch land.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let space = sim.event_space().await?;
    println!(
        "scale: {} keys of events in etcd, {} bytes",
        space.0, space.1
    );
    let follow = match a.follow.is_zero() {
        true => None,
        false => {
            let f = events::follow_check(sim, &a.fleetctl, a.follow).await?;
            println!(
                "scale: events --follow printed {} of {} events (kept up: {})",
                f.seen,
                f.emitted,
                f.kept_up()
            );
            Some(f)
        }
    };
    Ok((Some(space), follow))
}

fn verdicts(a: &ScaleArgs, m: &Measured, other: Option<&Converged>) -> Vec<Verdict> {
    let c = &m.c;
    let mut v = vec![
        verdict::launch(
            c.units,
            c.machines,
            c.launched_in,
            c.roles.timeouts(),
            c.roles.leases_lost(),
        ),
        verdict::machine_loss(
            m.loss.recovered_in,
            m.loss.target,
            m.loss.how,
            c.units,
            c.machines,
        ),
    ];
    match &m.leader {
        Ok(l) => v.push(verdict::leader_loss(
            l.recovered_in,
            l.replaced,
            a.agent_ttl,
        )),
        Err(e) => v.push(Verdict {
            goal: "the engine leader's machine lost".into(),
            measured: format!("failed: {e:#}"),
            met: false,
        }),
    }
    if let Some(o) = other {
        let (on, off) = if a.shape.events { (c, o) } else { (o, c) };
        v.push(verdict::events_cost(
            on.launched_in,
            off.launched_in,
            events::COST_WITHIN,
        ));
    }
    if let Some((n, bytes)) = m.space {
        v.push(verdict::events_space(
            n,
            bytes,
            c.units,
            events::SPACE_PER_UNIT,
        ));
    }
    if let Some(f) = m.follow {
        v.push(verdict::follow(
            f.emitted,
            f.seen,
            f.lag,
            events::FOLLOW_LAG,
        ));
    }
    v
}
