//! The chaos soak (issue 12): about five minutes of faults under fleetctl churn on one real
//! cluster, with an invariant checker over etcd's history and every machine's systemd.
//!
//! Faults, one per round, in a random order: kill -9 of a fleetd (systemd restarts it 1 s
//! later), a fleetd stopped and a fleetd hung (SIGSTOP) for longer than the agent TTL, an etcd
//! freeze longer than the TTL (SIGSTOP/SIGCONT of every member), a machine's power loss
//! (once), a machine cut off the network, and a kill -9 of one member of the cluster's
//! 3-member etcd (the raft leader half the time), started again 5 s later. Meanwhile a client
//! loop starts, stops, destroys and replaces units with fleetctl, recording each operation
//! with its time. Two recorders run all along: one polls systemd on every machine
//! (ActiveState and InvocationID of every unit), one records every change of a schedule
//! entry from etcd's watch. After each fault the cluster must converge on what the registry
//! says within [`CONVERGE`], and an etcd freeze must leave every unit the churn did not touch
//! with its machine, MainPID and InvocationID. At the end the checker (`chaos/check.rs`)
//! proves that no unit ran twice at once outside a partition window (a stopped or hung
//! fleetd's fence stops its copies before they move, so its window excuses no double run)
//! and that no unit stopped without a reason (a user's operation on it, a move off a machine
//! cut off the network, or the fence of a machine whose fleetd was away past the TTL), and
//! every revision of etcd's history is replayed to prove no unit was ever scheduled on two
//! machines. It prints the seed, the faults, the operations and the violations (0).
//! `FLEET_FAULT_SEED=<n>` replays a run.
//! Needs root; `make soak`.

#[path = "chaos/check.rs"]
mod check;
#[path = "chaos/record.rs"]
mod record;
mod support;

use anyhow::{Context, Result, bail, ensure};
use check::{Op, Record, Verb, Window, WindowKind};
use fleet_core::DesiredState;
use fleet_functional_tests::{
    Cluster, ClusterSpec, FleetdSpec, Machine, Signal, TestRegistry, cleanup_stale, wait_for_value,
};
use fleet_registry::kv::Kv;
use record::{Control, Seen};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use support::{PREFIX, Placed, Rng, Want, fleetctl, replay, revision, wait_converged};

/// Machines at the start; one of them loses power during the soak.
const MACHINES: usize = 4;
const UNITS: usize = 12;
/// The agent TTL: long enough that a fleetd killed and restarted by systemd (1 s later)
/// resumes its lease and pushes its fence forward before it fires, short enough that a lost
/// machine's units move quickly.
const TTL: Duration = Duration::from_secs(6);
/// How long etcd stays frozen: 3 x TTL + 5 s, so that every machine's lease runs out at the
/// thaw, all together. The fleetds live on and keep their fences pushed (a fleetd that cannot
/// reach etcd does not fence itself), and the engine holds the units of machines that vanish
/// together (`crates/fleet-scheduler/src/disruption.rs`) until they register again: nothing may
/// stop, move or restart.
const FREEZE: Duration = Duration::from_secs(3 * TTL.as_secs() + 5);
/// How long a stopped or hung fleetd stays away: at least twice the TTL, so that its fence
/// fires and its units move before it is back, and up to one TTL more, drawn per round.
const AWAY: Duration = Duration::from_secs(2 * TTL.as_secs());
/// How long a killed etcd member stays down before it is started again.
const MEMBER_DOWN: Duration = Duration::from_secs(5);
/// The soak's etcd: three members, every endpoint given to fleetd and fleetctl.
const ETCD_MEMBERS: usize = 3;
/// How long a machine stays cut off: longer than the agent TTL, so its units move.
const PARTITION: Duration = Duration::from_secs(10);
/// After a machine cut off the network is healed it may take this long to read its schedule
/// and stop its stale copies: part of the documented window (guarantees.md).
const HEAL_BOUND: Duration = Duration::from_secs(10);
/// Every fault is followed by convergence within this bound.
const CONVERGE: Duration = Duration::from_secs(45);
/// Rounds run until this much time has passed (and at least one of each fault ran);
/// `FLEET_CHAOS_SECS` sets another (a short run while working on the soak itself).
const BUDGET: Duration = Duration::from_secs(270);
const MAX_ROUNDS: usize = 40;
/// fleetctl operations per round, spread over the fault.
const OPS_PER_ROUND: usize = 6;
const POLL_EVERY: Duration = Duration::from_millis(300);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    FleetdKill,
    FleetdStop,
    FleetdHang,
    EtcdFreeze,
    PowerLoss,
    NetworkCut,
    /// One machine cut off from etcd alone, its peers in reach (issue 36): it learns so from
    /// them and fences, so this is no window for a double run.
    EtcdCut,
    EtcdMemberKill,
}

/// What was injected, for the report and the checker.
#[derive(Debug)]
struct Injected {
    fault: Fault,
    machine: Option<String>,
    at: Instant,
    lasted: Duration,
    converged_in: Duration,
}

fn unit_name(i: usize) -> String {
    format!("chaos-{i:02}.service")
}

/// Version `v` of unit `i`: different versions have different hashes.
fn unit_text(i: usize, v: u32) -> String {
    format!(
        "[Unit]\nDescription=chaos unit {i} version {v}\n\n[Service]\nExecStart=/bin/sleep {}\n",
        700_000 + 1000 * v + i as u32
    )
}

/// Writes every version of every unit under `dir/v<version>/`; returns the paths.
fn write_versions(dir: &std::path::Path) -> Result<BTreeMap<(usize, u32), String>> {
    let mut paths = BTreeMap::new();
    for v in 0..3 {
        let texts: BTreeMap<String, String> = (0..UNITS)
            .map(|i| (unit_name(i), unit_text(i, v)))
            .collect();
        let written = support::write_units(&dir.join(format!("v{v}")), &texts)?;
        for i in 0..UNITS {
            paths.insert((i, v), written[&unit_name(i)].clone());
        }
    }
    Ok(paths)
}

// --- faults --------------------------------------------------------------------------------

/// The members of the cluster's etcd that run now, by index.
fn running_members(cluster: &Cluster) -> Vec<usize> {
    (0..cluster.etcd_members())
        .filter(|i| {
            cluster
                .state()
                .etcd
                .member(*i)
                .and_then(|m| m.process)
                .is_some_and(|p| p.is_alive())
        })
        .collect()
}

/// The machines' TLS API port.
const API_PORT: u16 = 49157;

fn up(cluster: &Cluster) -> Vec<&Machine> {
    cluster.machines().iter().filter(|m| m.is_up()).collect()
}

/// The faults of the first rounds (each once, shuffled), then random ones; at most one power
/// loss, and never one that would leave fewer than three machines.
fn pick(rng: &mut Rng, round: usize, plan: &[Fault], cluster: &Cluster) -> Fault {
    if let Some(f) = plan.get(round) {
        return *f;
    }
    let mut menu = vec![
        Fault::FleetdKill,
        Fault::FleetdStop,
        Fault::FleetdHang,
        Fault::EtcdFreeze,
        Fault::NetworkCut,
        Fault::EtcdCut,
    ];
    if cluster.etcd_members() > 1 {
        menu.push(Fault::EtcdMemberKill);
    }
    menu[rng.below(menu.len() as u64) as usize]
}

/// How long a stopped or hung fleetd stays away this round.
fn away(rng: &mut Rng) -> Duration {
    AWAY + Duration::from_millis(rng.below(TTL.as_millis() as u64))
}

/// The window of a machine whose fleetd was told to stop or hang at `asked` and had by
/// `stopped`. Its fence fires a TTL after fleetd's last renewal, which is at most a renewal
/// period (TTL/3) before `asked`; another period is left for a renewal sent late, so the fence
/// fires no earlier than TTL/3 after `asked`. It fires at the latest a TTL after `stopped` and
/// has stopped every copy [`fleet_core::fence::MARGIN`] later (the engine's wait rests on
/// that), seen by the poller within [`check::SLACK`]. A stop outside, once fleetd is back
/// say, is not the fence's.
fn fenced(victim: &Machine, asked: Instant, stopped: Instant) -> Window {
    Window {
        kind: WindowKind::Fenced,
        machine: victim.name().to_owned(),
        from: asked + TTL / 3,
        to: stopped + TTL + fleet_core::fence::MARGIN + check::SLACK,
    }
}

/// Injects `fault` and returns once it is over (fleetd restarted, etcd thawed, network
/// healed, etcd member back), with the machine it hit and its documented window, if any.
fn inject(
    cluster: &mut Cluster,
    rng: &mut Rng,
    fault: Fault,
    record: &mut Record,
) -> Result<Option<String>> {
    let machines = up(cluster);
    let victim = machines[rng.below(machines.len() as u64) as usize]
        .name()
        .to_owned();
    let victim = cluster.machine(&victim)?;
    let start = Instant::now();
    match fault {
        Fault::FleetdKill => {
            let old = victim
                .main_pid("fleet.service")?
                .context("fleetd not running")?;
            victim.kill_fleetd(Signal::Kill)?;
            // Back within the TTL: no window, nothing may stop or move.
            support::wait_fleetd_restarted(victim, old)?;
            Ok(Some(victim.name().to_owned()))
        }
        Fault::FleetdStop => {
            let away = away(rng);
            victim.stop_fleetd()?;
            record.windows.push(fenced(victim, start, Instant::now()));
            // How long it stays stopped is the fault itself.
            std::thread::sleep(away);
            victim.start_fleetd()?;
            Ok(Some(victim.name().to_owned()))
        }
        Fault::FleetdHang => {
            let away = away(rng);
            victim.kill_fleetd(Signal::Stop)?;
            record.windows.push(fenced(victim, start, Instant::now()));
            // How long it stays hung is the fault itself.
            std::thread::sleep(away);
            victim.kill_fleetd(Signal::Cont)?;
            Ok(Some(victim.name().to_owned()))
        }
        Fault::EtcdFreeze => {
            // Every member at once: the whole etcd stalls, as a frozen VM or fsync would.
            let members = cluster.state().etcd.processes();
            ensure!(!members.is_empty(), "etcd not running");
            for etcd in &members {
                etcd.signal(Signal::Stop)?;
            }
            // The freeze's length is the fault itself.
            std::thread::sleep(FREEZE);
            for etcd in &members {
                etcd.signal(Signal::Cont)?;
            }
            Ok(None)
        }
        Fault::PowerLoss => {
            victim.poweroff()?;
            record
                .power_lost
                .insert(victim.name().to_owned(), Instant::now());
            Ok(Some(victim.name().to_owned()))
        }
        Fault::NetworkCut => {
            victim.cut_network()?;
            // The partition's length is the fault itself.
            std::thread::sleep(PARTITION);
            victim.heal_network()?;
            record.windows.push(Window {
                kind: WindowKind::Partition,
                machine: victim.name().to_owned(),
                from: start,
                to: Instant::now() + HEAL_BOUND,
            });
            Ok(Some(victim.name().to_owned()))
        }
        Fault::EtcdCut => {
            cluster.cut_from_etcd(victim)?;
            // Its fence fires at its lease's end, as if its fleetd had stopped at the cut.
            record.windows.push(fenced(victim, start, Instant::now()));
            std::thread::sleep(PARTITION);
            cluster.heal_from_etcd(victim)?;
            Ok(Some(victim.name().to_owned()))
        }
        Fault::EtcdMemberKill => {
            // Half the time the raft leader, the harder case (an election).
            let running = running_members(cluster);
            ensure!(running.len() > 1, "no etcd member to spare: {running:?}");
            let member = if rng.below(2) == 0 {
                cluster.etcd_leader()?
            } else {
                running[rng.below(running.len() as u64) as usize]
            };
            cluster.kill_etcd_member(member)?;
            // How long it stays down is the fault itself; nothing may move meanwhile.
            std::thread::sleep(MEMBER_DOWN);
            cluster.start_etcd_member(member)?;
            Ok(Some(format!("etcd member {member}")))
        }
    }
}

// --- churn ---------------------------------------------------------------------------------

/// The client side: `OPS_PER_ROUND` random fleetctl operations, one every `spacing`. Returns
/// each with the moment it was issued (the checker's reasons to stop a unit); a failure must
/// be one clean message.
fn churn(
    cluster: &Cluster,
    rng: &mut Rng,
    versions: &mut [u32],
    paths: &BTreeMap<(usize, u32), String>,
    spacing: Duration,
) -> Result<Vec<Op>> {
    let mut done = Vec::new();
    for _ in 0..OPS_PER_ROUND {
        let i = rng.below(UNITS as u64) as usize;
        let (verb, arg) = match rng.below(10) {
            0..=3 => (Verb::Start, paths[&(i, versions[i])].clone()),
            4..=5 => (Verb::Stop, unit_name(i)),
            6 => (Verb::Destroy, unit_name(i)),
            _ => {
                versions[i] = (versions[i] + 1) % 3;
                (Verb::Replace, paths[&(i, versions[i])].clone())
            }
        };
        let mut line: Vec<String> = match verb {
            Verb::Replace => vec!["start".into(), "--no-block".into(), "--replace".into()],
            Verb::Destroy => vec!["destroy".into()],
            Verb::Start => vec!["start".into(), "--no-block".into()],
            Verb::Stop => vec!["stop".into(), "--no-block".into()],
        };
        line.push(arg);
        let at = Instant::now();
        let run = fleetctl(cluster, &line)?;
        ensure!(
            run.success
                || (!run.stderr.trim().is_empty()
                    && run.stderr.lines().count() <= 3
                    && !run.stderr.contains("panicked")),
            "fleetctl {} failed unclearly: {run:?}",
            line.join(" ")
        );
        done.push(Op {
            at,
            unit: unit_name(i),
            verb,
            succeeded: run.success,
        });
        // The spacing spreads the operations over the fault: it is the load, not a wait.
        std::thread::sleep(spacing);
    }
    Ok(done)
}

/// What the machines must run: the registry's desired states.
fn wanted(registry: &TestRegistry) -> Result<BTreeMap<String, Want>> {
    let units = registry.block_on(registry.registry().units())?.items;
    let mut want: BTreeMap<String, Want> = (0..UNITS).map(|i| (unit_name(i), Want::Gone)).collect();
    for u in &units {
        let w = match u.desired() {
            DesiredState::Inactive => Want::Inactive,
            DesiredState::Loaded => Want::Loaded,
            DesiredState::Launched => Want::Launched,
        };
        want.insert(u.name().to_string(), w);
    }
    Ok(want)
}

/// Where each unit runs now: its machine, MainPID and InvocationID.
fn running(cluster: &Cluster) -> Result<BTreeMap<String, Placed>> {
    let names: Vec<String> = (0..UNITS).map(unit_name).collect();
    let mut out = BTreeMap::new();
    for m in up(cluster) {
        for (unit, view) in support::units_on(m, &names)? {
            if view.is_active() {
                let placed = Placed {
                    machine: m.name().to_owned(),
                    identity: view.identity(),
                };
                out.insert(unit, placed);
            }
        }
    }
    Ok(out)
}

/// Every machine's presence key and the lease it hangs on.
fn presence_leases(registry: &TestRegistry) -> Result<BTreeMap<String, i64>> {
    let prefix = registry.registry().keys().machines();
    let res = registry
        .block_on(registry.registry().raw_kv().range(&prefix, true, None))
        .context("reading the machines' presence")?;
    Ok(res.kvs.into_iter().map(|kv| (kv.key, kv.lease)).collect())
}

/// Waits for etcd to answer again after a fault (a thawed etcd answers at once; this only
/// guards the read of the desired states).
fn wanted_when_ready(registry: &TestRegistry) -> Result<BTreeMap<String, Want>> {
    wait_for_value(CONVERGE, Duration::from_millis(200), || {
        wanted(registry).ok()
    })
    .context("etcd did not answer after the fault")
}

// --- the soak ------------------------------------------------------------------------------

/// What an etcd freeze must not change, read just before it.
struct BeforeFreeze {
    /// The presence leases of the machines with power.
    leases: BTreeMap<String, i64>,
    runs: BTreeMap<String, Placed>,
}

/// One soak's state, beside the recorders (which have views of the cluster of their own).
struct Soak<'a> {
    /// The cluster the faults are injected into (a member kill changes its etcd state).
    cluster: &'a mut Cluster,
    /// A view of the same cluster for the client loop, which runs while a fault is injected.
    view: Cluster,
    registry: &'a TestRegistry,
    rng: Rng,
    paths: BTreeMap<(usize, u32), String>,
    /// The version each unit's next start or replace uses.
    versions: Vec<u32>,
    record: Record,
    injected: Vec<Injected>,
    start: Instant,
}

impl Soak<'_> {
    /// The presence leases of the machines that still have power. A machine that lost it
    /// stays off for the rest of the soak, and its lease runs out on its own within the TTL,
    /// freeze or not: a freeze soon after a power loss found that lease gone and took it for
    /// one the freeze cost (seed 1796324055596633425, at c09850d and after).
    fn powered_leases(&self) -> Result<BTreeMap<String, i64>> {
        let keys = self.registry.registry().keys();
        let mut leases = presence_leases(self.registry)?;
        for name in self.record.power_lost.keys() {
            leases.remove(&keys.machine(self.cluster.machine(name)?.id()));
        }
        Ok(leases)
    }

    /// After an etcd freeze, once convergence is proven and the engine's hold has run out (at
    /// `held_until`): every unit the round's operations did not name runs where it ran before,
    /// the very same run (MainPID and InvocationID). A stalled etcd is no reason to stop, move
    /// or restart anything (issue 12 item 2), even when it cost every lease: the engine holds
    /// machines that vanish together until they register again. Returns how many of the
    /// machines' leases it cost, of how many.
    fn freeze_moved_nothing(
        &self,
        before: BeforeFreeze,
        done: &[Op],
        held_until: Instant,
    ) -> Result<(usize, usize)> {
        // A unit the engine held and then moved anyway would show only after the grace.
        std::thread::sleep(held_until.saturating_duration_since(Instant::now()));
        // Every machine registered again by now: a lease that lapsed was replaced.
        let after = self.powered_leases()?;
        let lost = before
            .leases
            .iter()
            .filter(|(k, l)| after.get(*k) != Some(*l))
            .count();
        let touched: BTreeSet<&str> = done.iter().map(|op| op.unit.as_str()).collect();
        let now = running(self.cluster)?;
        let changed: Vec<String> = before
            .runs
            .iter()
            .filter(|(unit, _)| !touched.contains(unit.as_str()))
            .filter(|(unit, was)| now.get(*unit) != Some(*was))
            .map(|(unit, was)| format!("{unit}: {was:?} -> {:?}", now.get(unit)))
            .collect();
        ensure!(
            changed.is_empty(),
            "units the churn did not touch changed machine, MainPID or InvocationID across \
             the etcd freeze (it cost {lost} of {} leases): {changed:?}",
            before.leases.len()
        );
        Ok((lost, before.leases.len()))
    }

    /// One round: `fault` under churn, then convergence within [`CONVERGE`].
    fn round(&mut self, round: usize, fault: Fault) -> Result<()> {
        let registry = self.registry;
        let mut churn_rng = Rng::from_seed(self.rng.next());
        let spacing = Duration::from_millis(200 + self.rng.below(800));
        let before_freeze = match fault {
            Fault::EtcdFreeze => Some(BeforeFreeze {
                leases: self.powered_leases()?,
                runs: running(self.cluster)?,
            }),
            Fault::FleetdKill
            | Fault::FleetdStop
            | Fault::FleetdHang
            | Fault::PowerLoss
            | Fault::NetworkCut
            | Fault::EtcdCut
            | Fault::EtcdMemberKill => None,
        };
        let at = Instant::now();
        let (rng, versions, paths, record, view) = (
            &mut self.rng,
            &mut self.versions,
            &self.paths,
            &mut self.record,
            &self.view,
        );
        let cluster = &mut *self.cluster;
        let (hit, done) = std::thread::scope(|s| -> Result<_> {
            let client = s.spawn(|| churn(view, &mut churn_rng, versions, paths, spacing));
            let hit = inject(cluster, rng, fault, record);
            let done = client.join().expect("the client loop does not panic");
            Ok((hit?, done?))
        })?;
        let lasted = at.elapsed();
        // The engine's hold of machines that vanished at a thaw lasts 2 x TTL.
        let held_until = Instant::now() + 2 * TTL + check::SLACK;
        let cluster = &*self.cluster;
        let want = wanted_when_ready(registry)?;
        support::wait_registered(cluster, registry)?;
        wait_converged(cluster, registry, &want, CONVERGE).with_context(|| {
            format!("round {round}: no convergence within {CONVERGE:?} after {fault:?}")
        })?;
        let converged_in = at.elapsed() - lasted;
        let leases = match before_freeze {
            Some(before) => {
                let (lost, of) = self
                    .freeze_moved_nothing(before, &done, held_until)
                    .with_context(|| format!("round {round}"))?;
                format!("; it cost {lost} of {of} leases, and no unit moved")
            }
            None => String::new(),
        };
        eprintln!(
            "round {round} at {:.1} s: {fault:?} on {hit:?} for {lasted:.1?}, converged \
             {converged_in:.1?} later; {} operations{leases}",
            at.duration_since(self.start).as_secs_f64(),
            done.len()
        );
        self.record.ops.extend(done);
        self.injected.push(Injected {
            fault,
            machine: hit,
            at,
            lasted,
            converged_in,
        });
        Ok(())
    }

    /// Every round until the budget is spent (and every fault of `plan` ran), then the
    /// control, once every documented window is over (or it would be excused).
    fn run(&mut self, plan: &[Fault], budget: Duration, seen: &Mutex<Seen>) -> Result<Control> {
        for round in 0..MAX_ROUNDS {
            if round >= plan.len() && self.start.elapsed() > budget {
                break;
            }
            let fault = pick(&mut self.rng, round, plan, self.cluster);
            self.round(round, fault)?;
        }
        if let Some(end) = self.record.windows.iter().map(|w| w.to).max() {
            std::thread::sleep(end.saturating_duration_since(Instant::now()));
        }
        // The control's stop must be one no user operation excuses: a unit operated on within
        // the checker's slack of now is not taken for it (its stop would be excused).
        let recent: BTreeSet<String> = self
            .record
            .ops
            .iter()
            .filter(|op| op.at + 2 * check::SLACK >= Instant::now())
            .map(|op| op.unit.clone())
            .collect();
        record::control(self.cluster, seen, &recent)
    }

    /// Prints the faults, the operations and what the recorders saw.
    fn report(&self, seen: &Seen) {
        eprintln!("chaos: faults injected ({}):", self.injected.len());
        for f in &self.injected {
            eprintln!(
                "  {:>6.1} s  {:?} on {} for {:.1?}, converged {:.1?} later",
                f.at.duration_since(self.start).as_secs_f64(),
                f.fault,
                f.machine.as_deref().unwrap_or("the cluster"),
                f.lasted,
                f.converged_in
            );
        }
        let mut by_verb: BTreeMap<Verb, (usize, usize)> = BTreeMap::new();
        for op in &self.record.ops {
            let counts = by_verb.entry(op.verb).or_default();
            counts.0 += 1;
            counts.1 += usize::from(!op.succeeded);
        }
        eprintln!(
            "chaos: {} fleetctl operations, (run, refused cleanly) by verb: {by_verb:?}",
            self.record.ops.len()
        );
        eprintln!(
            "chaos: {} runs of units seen in {} polls, {} schedule changes of {} events",
            self.record.runs.len(),
            seen.polls,
            self.record.changes.len(),
            seen.events
        );
        let windows = |kind| {
            self.record
                .windows
                .iter()
                .filter(|w| w.kind == kind)
                .count()
        };
        eprintln!(
            "chaos: {} partition windows; {} fenced windows, in which {} runs stopped (the \
             fence's)",
            windows(WindowKind::Partition),
            windows(WindowKind::Fenced),
            check::fenced_stops(&self.record)
        );
    }
}

/// Replays etcd's history from `from`: at no revision is a unit scheduled on two machines.
fn never_scheduled_twice(registry: &TestRegistry, from: i64) -> Result<usize> {
    let base = format!("{PREFIX}schedule/");
    replay(registry, from, |rev, state| {
        let mut on: BTreeMap<&str, &str> = BTreeMap::new();
        for key in state.keys() {
            let Some((machine, unit)) = key.strip_prefix(&base).and_then(|r| r.split_once('/'))
            else {
                continue;
            };
            if let Some(other) = on.insert(unit, machine) {
                bail!("revision {rev}: {unit} scheduled on {other} and {machine}");
            }
        }
        Ok(())
    })
}

/// Splits the checker's findings into those about the control copy, which must be there
/// (two copies at once, and one stop without a reason), and the rest, returned. A finding is
/// the control's when it names the control's invocation: any other run of the same unit,
/// on any machine, stays a finding of its own.
fn without_control(record: &Record, start: Instant, control: &Control) -> Result<Vec<String>> {
    let mark = format!("(invocation {})", control.invocation);
    let (mine, rest): (Vec<String>, Vec<String>) = check::violations(record, start)
        .into_iter()
        .partition(|v| v.contains(&mark));
    let Control { unit, machine, .. } = control;
    eprintln!("chaos: the control copy of {unit} on {machine}: {mine:?}");
    let stops = mine
        .iter()
        .filter(|v| v.contains("without a user operation"))
        .count();
    let doubles = mine.iter().filter(|v| v.contains("at once")).count();
    ensure!(
        doubles >= 1 && stops == 1,
        "the checker missed the control copy of {unit} on {machine}: {mine:?}; its runs: \
         {:#?}; windows: {:#?}",
        record
            .runs
            .iter()
            .filter(|r| &r.unit == unit)
            .collect::<Vec<_>>(),
        record.windows
    );
    Ok(rest)
}

/// The first rounds' faults: each once, in a random order.
fn first_faults(rng: &mut Rng, cluster: &Cluster) -> Vec<Fault> {
    let mut plan = vec![
        Fault::FleetdKill,
        Fault::FleetdStop,
        Fault::FleetdHang,
        Fault::EtcdFreeze,
        Fault::NetworkCut,
        Fault::EtcdCut,
        Fault::PowerLoss,
    ];
    if cluster.etcd_members() > 1 {
        plan.push(Fault::EtcdMemberKill);
    }
    for i in (1..plan.len()).rev() {
        plan.swap(i, rng.below(i as u64 + 1) as usize);
    }
    plan
}

#[test]
#[ignore = "soak: run last by make test, alone by make soak"]
fn soak_chaos_of_faults_under_fleetctl_churn_breaks_no_invariant() -> Result<()> {
    let mut rng = Rng::from_env_or_time("chaos");
    let budget = std::env::var("FLEET_CHAOS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(BUDGET, Duration::from_secs);
    let spec = FleetdSpec {
        agent_ttl: format!("{}s", TTL.as_secs()),
        // The TLS API: each fleetd asks its peers when etcd does not answer (EtcdCut).
        ..FleetdSpec::default()
            .with_env("FLEET_ENGINE_RECONCILE_INTERVAL", "0.5")
            .with_api_tls(API_PORT)
    };
    cleanup_stale()?;
    let mut cluster =
        Cluster::start(ClusterSpec::with_fleetd(MACHINES, spec).with_etcd_members(ETCD_MEMBERS))?;
    ensure!(cluster.etcd_members() == ETCD_MEMBERS);
    let registry = TestRegistry::of(&cluster)?;
    support::wait_registered(&cluster, &registry)?;
    let watcher = TestRegistry::of(&cluster)?;
    // The recorders' own views of the cluster: the soak needs it mutably for member kills.
    let (polled, watched) = (
        Cluster::attach(cluster.dir())?,
        Cluster::attach(cluster.dir())?,
    );
    let paths = write_versions(&cluster.dir().join("chaos-units"))?;
    let mut line = vec!["start".to_owned(), "--no-block".to_owned()];
    line.extend((0..UNITS).map(|i| paths[&(i, 0)].clone()));
    support::fleetctl_ok(&cluster, &line)?;
    wait_converged(&cluster, &registry, &wanted(&registry)?, CONVERGE)?;

    let plan = first_faults(&mut rng, &cluster);
    let from = revision(&registry)?;
    let view = Cluster::attach(cluster.dir())?;
    let mut soak = Soak {
        cluster: &mut cluster,
        view,
        registry: &registry,
        rng,
        paths,
        versions: vec![0; UNITS],
        record: Record::default(),
        injected: Vec::new(),
        start: Instant::now(),
    };
    let seen = Mutex::new(Seen::default());
    let stop = AtomicBool::new(false);
    let control = std::thread::scope(|s| -> Result<Control> {
        let poller = s.spawn(|| record::poll_systemd(&polled, &seen, &stop));
        let history = s.spawn(|| record::watch_schedules(&watched, &watcher, from, &seen, &stop));
        let control = soak.run(&plan, budget, &seen);
        stop.store(true, Ordering::SeqCst);
        poller.join().expect("the systemd poller does not panic");
        history
            .join()
            .expect("the history recorder does not panic")?;
        control
    })?;

    let seen = seen.into_inner().unwrap_or_else(|e| e.into_inner());
    soak.record.runs = seen.closed.clone();
    soak.record.runs.extend(seen.open.values().cloned());
    soak.record.changes = seen.changes.clone();
    let mut violations = without_control(&soak.record, soak.start, &control)?;
    match never_scheduled_twice(&registry, from) {
        Ok(n) => eprintln!("chaos: {n} revisions of etcd's history replayed"),
        Err(e) => violations.push(format!("{e:#}")),
    }
    soak.report(&seen);
    eprintln!("chaos: violations: {}", violations.len());
    for v in &violations {
        eprintln!("  {v}");
    }
    ensure!(
        violations.is_empty(),
        "{} invariant violations (FLEET_FAULT_SEED replays the run)",
        violations.len()
    );
    support::finish(cluster)
}
