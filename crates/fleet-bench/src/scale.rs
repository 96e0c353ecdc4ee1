//! Scenario 3, the scale simulation: N simulated machines (real agents on the fake systemd,
//! three real engine candidates) on one real etcd, U units started at once. Measures the time
//! until every unit is scheduled and reported launched, the etcd requests per unit by role and
//! kind, the watch events per scheduling decision, what one `fleetctl start` costs the agents
//! it does not concern, the idle traffic, and recovery from losing 10% of the machines.

use anyhow::{Context, Result};
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, SystemTime};
use tokio::time::Instant;

use crate::counting::{Class, Method, Tally};
use crate::metered::Call;
use crate::metrics::{Metrics, received_between};
use crate::report::{self, ms, secs};
use crate::sim::{Sim, SimSpec, bench_unit, unit_text};

mod render;
pub use render::fmt_map;

/// How long a convergence may take before the scenario gives up.
pub const CONVERGE_WITHIN: Duration = Duration::from_secs(600);

/// Every role's requests over one phase.
#[derive(Debug, Clone, Copy, Default)]
pub struct Roles {
    pub client: Tally,
    pub engines: Tally,
    pub agents: Tally,
    pub presence: Tally,
}

impl Roles {
    pub fn now(sim: &Sim) -> Roles {
        Roles {
            client: sim.roles.client.tally(),
            engines: sim.roles.engines.tally(),
            agents: sim.roles.agents.tally(),
            presence: sim.roles.presence.tally(),
        }
    }

    pub fn since(self, sim: &Sim) -> Roles {
        let now = Roles::now(sim);
        Roles {
            client: now.client - self.client,
            engines: now.engines - self.engines,
            agents: now.agents - self.agents,
            presence: now.presence - self.presence,
        }
    }

    fn all(&self) -> [(&'static str, &Tally); 4] {
        [
            ("fleetctl", &self.client),
            ("engines", &self.engines),
            ("agents", &self.agents),
            ("presence", &self.presence),
        ]
    }

    /// Writes by fleetctl, the engines and the agents (not lease keep-alives).
    pub fn writes(&self) -> u64 {
        self.client.all_writes() + self.engines.all_writes() + self.agents.all_writes()
    }

    /// Requests by fleetctl, the engines and the agents.
    pub fn requests(&self) -> u64 {
        self.client.total() + self.engines.total() + self.agents.total()
    }
}

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
    let metrics = Metrics::fetch(&sim.etcd_endpoint())?;
    let cpu = process_cpu();
    let t0 = Instant::now();
    sim.submit(&args).await?;
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
    let after = Metrics::fetch(&sim.etcd_endpoint())?;
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

/// This process's CPU time (user + system), in seconds.
pub fn process_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    cpu_of_stat(&stat)
}

/// utime + stime of a `/proc/<pid>/stat` line, in seconds (USER_HZ is 100 on Linux).
pub fn cpu_of_stat(stat: &str) -> f64 {
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    // After the command: state is field 3, utime 14 and stime 15 (1-based).
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (tick(11) + tick(12)) / 100.0
}

/// This process's resident memory, MiB.
pub fn process_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    rss_of_status(&status)
}

/// VmRSS of a `/proc/<pid>/status`, MiB.
pub fn rss_of_status(status: &str) -> f64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|l| l.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
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
    let metrics = Metrics::fetch(&sim.etcd_endpoint())?;
    let t0 = Instant::now();
    // fleetctl's default driver is the API (as fleet's); the simulation has only etcd.
    let out = tokio::process::Command::new(fleetctl)
        .args(["--driver", "etcd"])
        .arg("--endpoint")
        .arg(sim.etcd_endpoint())
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
    let etcd = received_between(&metrics, &Metrics::fetch(&sim.etcd_endpoint())?);
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

/// Recovery from losing a tenth of the machines.
#[derive(Debug)]
struct Loss {
    /// The engines' `engine_move_rate` (`None`: fleetd's default).
    move_rate: Option<u32>,
    killed: usize,
    affected: usize,
    rescheduled_in: Duration,
    recovered_in: Duration,
    roles: Roles,
}

async fn lose_tenth(sim: &mut Sim, units: usize) -> Result<Loss> {
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
    sim.kill(&victims).await?;
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
    Ok(Loss {
        move_rate: sim.spec.move_rate,
        killed: count,
        affected,
        rescheduled_in,
        recovered_in,
        roles: roles.since(sim),
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
    let metrics = Metrics::fetch(&sim.etcd_endpoint())?;
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
    let etcd = received_between(&metrics, &Metrics::fetch(&sim.etcd_endpoint())?);
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

/// Runs the whole scenario; returns the Markdown section.
pub async fn run(
    machines: usize,
    units: usize,
    idle_window: Duration,
    agent_ttl: Duration,
    move_rate: Option<u32>,
    fleetctl: &std::path::Path,
) -> Result<String> {
    let wall = SystemTime::now();
    let started = Instant::now();
    println!("scale: starting {machines} simulated machines");
    let mut spec = SimSpec::new(machines);
    spec.agent_ttl = agent_ttl;
    spec.move_rate = move_rate;
    let mut sim = Sim::start(spec).await?;
    println!(
        "scale: {machines} machines registered in {}, agents watching after {}",
        secs(sim.joined_in),
        secs(sim.agents_ready_in)
    );
    let c = converge(&sim, units).await?;
    println!(
        "scale: {units} units submitted in {}, scheduled in {}, launched in {}",
        secs(c.submitted_in),
        secs(c.scheduled_in),
        secs(c.launched_in)
    );
    let rss = process_rss_mib();
    println!("scale: idle for {}", secs(idle_window));
    let idle = idle(&sim, idle_window).await?;
    println!(
        "scale: idle; the busiest second held {:.1} % of the agents' resync reads",
        idle.busiest_share() * 100.0
    );
    let dir = report::work_dir();
    // A failed probe (fleetctl's reads at this size) is a figure, not the end of the run.
    let one = one_start(&sim, fleetctl, &dir).await;
    match &one {
        Ok(one) => println!(
            "scale: one fleetctl start took {}, uninvolved agents woken: {}",
            ms(one.latency),
            one.woken
        ),
        Err(e) => println!("scale: one fleetctl start failed: {e:#}"),
    }
    // The probe's unit runs too, when the probe got it started.
    let loss = lose_tenth(&mut sim, units + usize::from(one.is_ok())).await?;
    println!(
        "scale: lost {} machines ({} units): rescheduled in {}, running again in {}",
        loss.killed,
        loss.affected,
        secs(loss.rescheduled_in),
        secs(loss.recovered_in)
    );
    sim.stop().await;
    let mut out = report::provenance(wall, started.elapsed());
    out.push_str(&crate::sim::etcd_line(&crate::sim::etcd_args_from_env()));
    out.push('\n');
    out.push_str(&render::render(&c, rss, &idle, &one, &loss));
    Ok(out)
}
