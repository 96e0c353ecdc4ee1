//! The engine among simulated machines, checked against what their systemd actually runs:
//! never two copies of a non-global unit (issue 36). Not against the scheduler's rule: the
//! check knows nothing of placement histories, only which copies run where, and which of
//! them the registry showed.
//!
//! Nothing is atomic. A machine's agent acts on its schedule (starts, stops, loads, unloads)
//! in one step and publishes what its systemd runs in another, maybe rounds later, as a real
//! agent publishes at the end of its pass. A machine vanishes (its lease expires, its states
//! go with it) with copies running or stopping there; its fence stops them at the latest its
//! contract allows, `fleet_core::fence::MARGIN` after the engine saw it vanish; it may come
//! back. The leader asks the disruption rule before each plan ([`Disruption::assess`], with
//! the simulated clock), as fleet-engine's `engine/leading.rs` does, and a new leader may
//! take over at any round, knowing only the registry. One machine may lie: it
//! publishes `active` for every unit it runs no copy of.
//! Here the leader ([`EveryRound`]) plans every unit every round; fleet-engine's pass
//! planner tests run the same with a [`Leader`] that passes as its leader does, skipping
//! rounds and planning only what changed (feature `testing`).
//!
//! The one pair of copies the check excuses is the documented limit of docs/engine.md
//! ("Limits"): a unit placed while another machine, live, ran a copy of it that its agent had
//! not published (no state, or a state from before it started it). Each copy remembers which
//! other copies were unpublished when its machine was given the unit.

mod leader;
#[cfg(test)]
mod scripted;

pub use leader::{EveryRound, Leader};

use super::props::{GenChange, GenWorld, MACHINES, UNITS, build, change, gen_change, gen_world};
use super::*;
use crate::disruption::{Disruption, DisruptionConfig};
use fleet_core::MachineInfo;
use proptest::prelude::*;
use std::time::Duration;
use tokio::time::Instant;

/// The agents' TTL: the disruption rule's window, and its settle and grace by default.
const TTL: Duration = Duration::from_secs(3);
/// What one round of the simulation lasts.
const STEP: Duration = Duration::from_secs(1);

/// A copy in a simulated systemd: running, or its stop job going.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proc {
    Running,
    Stopping,
}

/// One copy of a unit on one machine.
#[derive(Debug, Clone)]
struct Instance {
    proc: Proc,
    /// Unique over the simulation.
    id: u64,
    /// The copies of the unit elsewhere that the registry did not show when this machine was
    /// given the unit (see the module).
    unseen: BTreeSet<u64>,
}

/// A machine whose lease expired.
#[derive(Debug, Clone)]
struct Gone {
    info: MachineInfo,
    /// When its fence has stopped every copy there; `None` once it has.
    fenced_by: Option<Instant>,
}

/// The registry, what each machine's systemd runs and has loaded, the leader's memory.
#[derive(Debug)]
pub struct Sim<L = EveryRound> {
    pub w: World,
    systemd: BTreeMap<(UnitName, MachineId), Instance>,
    /// Unit files in each machine's units directory: what its agent publishes states of.
    loaded: BTreeSet<(UnitName, MachineId)>,
    gone: BTreeMap<MachineId, Gone>,
    now: Instant,
    leader: L,
    /// The copies elsewhere that the registry did not show at each unit's latest placement.
    unseen_at_placement: BTreeMap<(UnitName, MachineId), BTreeSet<u64>>,
    next_copy: u64,
    liar: Option<MachineId>,
    /// The units ever scheduled on the liar: only those may wait for it.
    ever_on_liar: BTreeSet<UnitName>,
}

/// The disruption rule's configuration of every simulated leader.
pub fn cfg() -> DisruptionConfig {
    DisruptionConfig::for_ttl(TTL)
}

impl Sim {
    /// The generated units (made non-global: a global unit runs everywhere) and machines,
    /// nothing scheduled, running or recorded yet.
    pub fn new(g: &GenWorld, liar: Option<usize>) -> Sim {
        let mut g = g.clone();
        g.entries.clear();
        g.states.clear();
        g.left.clear();
        g.units.iter_mut().for_each(|u| u.global = false);
        let w = build(&g);
        let live: Vec<&MachineId> = w.snap.machines.keys().collect();
        let liar = liar
            .filter(|_| !live.is_empty())
            .map(|i| live[i % live.len()].clone());
        Sim { liar, ..Sim::of(w) }
    }

    /// The machines and units of `w`, nothing scheduled, running or recorded yet, no liar.
    pub fn of(w: World) -> Sim {
        let now = Instant::now();
        Sim {
            w,
            systemd: BTreeMap::new(),
            loaded: BTreeSet::new(),
            gone: BTreeMap::new(),
            now,
            leader: EveryRound::new(now),
            unseen_at_placement: BTreeMap::new(),
            next_copy: 0,
            liar: None,
            ever_on_liar: BTreeSet::new(),
        }
    }
}

impl<L: Leader> Sim<L> {
    /// The same simulation with the leader `make` makes, taking over now.
    pub fn with_leader<M: Leader>(self, make: impl FnOnce(Instant) -> M) -> Sim<M> {
        Sim {
            w: self.w,
            systemd: self.systemd,
            loaded: self.loaded,
            gone: self.gone,
            now: self.now,
            leader: make(self.now),
            unseen_at_placement: self.unseen_at_placement,
            next_copy: self.next_copy,
            liar: self.liar,
            ever_on_liar: self.ever_on_liar,
        }
    }

    pub fn leader_mut(&mut self) -> &mut L {
        &mut self.leader
    }

    /// The simulated time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Time passes; the fences whose time came stop their machines' copies.
    pub fn tick(&mut self) {
        self.now += STEP;
        let now = self.now;
        let mut fenced = Vec::new();
        for (m, gone) in &mut self.gone {
            if gone.fenced_by.is_some_and(|at| at <= now) {
                gone.fenced_by = None;
                fenced.push(m.clone());
            }
        }
        self.systemd.retain(|(_, m), _| !fenced.contains(m));
    }

    /// One engine pass, if the leader has one due: its plan, whose writes then land.
    pub fn engine(&mut self) {
        if let Some(plan) = self.leader.pass(&self.w, self.now) {
            self.land(&plan);
            self.leader.landed(&self.w);
        }
    }

    /// The writes of `plan` land.
    fn land(&mut self, plan: &Plan) {
        for d in &plan.decisions {
            if let DecisionKind::Schedule { unit, machine, .. } = &d.kind {
                let unseen = self.unpublished_copies(unit, machine);
                self.unseen_at_placement
                    .insert((unit.clone(), machine.clone()), unseen);
            }
        }
        self.w.apply(&plan.decisions);
        if let Some(liar) = &self.liar {
            let on_liar = self
                .w
                .snap
                .schedule
                .iter()
                .filter(|(_, ms)| ms.contains_key(liar));
            self.ever_on_liar.extend(on_liar.map(|(u, _)| u.clone()));
        }
    }

    /// A new leader: it knows only the registry (a machine it does not see counts as having
    /// just vanished).
    pub fn new_leader(&mut self) {
        self.leader.new_leader(self.now);
    }

    /// The copies of `unit` on live machines other than `machine` whose machine publishes no
    /// state of it that may be running.
    fn unpublished_copies(&self, unit: &UnitName, machine: &MachineId) -> BTreeSet<u64> {
        let shown = |m: &MachineId| {
            let state = self.w.snap.states.get(unit).and_then(|s| s.get(m));
            state.is_some_and(|s| s.systemd.active_state().may_be_running())
        };
        self.systemd
            .iter()
            .filter(|((u, m), _)| u == unit && m != machine)
            .filter(|((_, m), _)| self.w.snap.machines.contains_key(m) && !shown(m))
            .map(|(_, copy)| copy.id)
            .collect()
    }

    fn entry_on(&self, unit: &UnitName, m: &MachineId) -> Option<DesiredState> {
        let entries = self.w.snap.schedule.get(unit)?;
        entries.get(m).map(|e| e.desired)
    }

    /// Machine `m`'s agent acts on its schedule, publishing nothing: it loads and starts what
    /// is scheduled to run there, stops what is not (one step to stopping, one to stopped),
    /// and unloads what is not scheduled there once stopped.
    pub fn act(&mut self, m: &MachineId) -> Result<(), TestCaseError> {
        if !self.w.snap.machines.contains_key(m) {
            return Ok(());
        }
        let mut units: BTreeSet<UnitName> = self
            .w
            .snap
            .schedule
            .iter()
            .filter(|(_, ms)| ms.contains_key(m))
            .map(|(u, _)| u.clone())
            .collect();
        let here = |(u, on): &(UnitName, MachineId)| (on == m).then(|| u.clone());
        units.extend(self.loaded.iter().filter_map(here));
        units.extend(self.systemd.keys().filter_map(here));
        for unit in units {
            let key = (unit.clone(), m.clone());
            let desired = self.entry_on(&unit, m);
            if desired.is_some() {
                self.loaded.insert(key.clone());
            }
            match (desired, self.systemd.get(&key).map(|c| c.proc)) {
                (Some(Launched), None) => {
                    let unseen = self
                        .unseen_at_placement
                        .get(&key)
                        .cloned()
                        .unwrap_or_default();
                    let copy = Instance {
                        proc: Proc::Running,
                        id: self.next_copy,
                        unseen,
                    };
                    self.next_copy += 1;
                    self.systemd.insert(key, copy);
                }
                (Some(Launched), Some(_)) => {
                    self.systemd.get_mut(&key).expect("a copy").proc = Proc::Running;
                }
                (Some(Loaded | Inactive) | None, Some(Proc::Running)) => {
                    self.systemd.get_mut(&key).expect("a copy").proc = Proc::Stopping;
                }
                (Some(Loaded | Inactive) | None, Some(Proc::Stopping)) => {
                    self.systemd.remove(&key);
                }
                (Some(Loaded | Inactive), None) => {}
                (None, None) => {
                    self.loaded.remove(&key);
                }
            }
        }
        self.check_one_copy()
    }

    /// Machine `m`'s agent publishes what its systemd runs: a state for each unit it has
    /// loaded, none for the others; the liar adds `active` for every unit it does not run.
    pub fn publish(&mut self, m: &MachineId) {
        if !self.w.snap.machines.contains_key(m) {
            return;
        }
        for states in self.w.snap.states.values_mut() {
            states.remove(m);
        }
        self.w.snap.states.retain(|_, states| !states.is_empty());
        let units: Vec<UnitName> = self
            .w
            .snap
            .units
            .keys()
            .chain(self.loaded.iter().filter(|(_, on)| on == m).map(|(u, _)| u))
            .cloned()
            .collect();
        for unit in units {
            let key = (unit.clone(), m.clone());
            let active = match self.systemd.get(&key).map(|c| c.proc) {
                Some(Proc::Running) => "active",
                Some(Proc::Stopping) => "deactivating",
                None if self.loaded.contains(&key) => "inactive",
                None if self.liar.as_ref() == Some(m) => "active",
                None => continue,
            };
            self.w = std::mem::take(&mut self.w).state(unit.as_str(), m.as_str(), active);
        }
    }

    /// Machine `m`'s lease expires: its presence and states go, and its agent stops. Its
    /// fence fired at the expiry at the latest, and stops its copies within the margin: the
    /// contract's latest is the margin after the engine sees it vanish, at the next pass.
    pub fn vanish(&mut self, m: &MachineId) {
        let Some(info) = self.w.snap.machines.remove(m) else {
            return;
        };
        for states in self.w.snap.states.values_mut() {
            states.remove(m);
        }
        self.w.snap.states.retain(|_, states| !states.is_empty());
        let fenced_by = Some(self.now + STEP + fleet_core::fence::MARGIN);
        self.gone.insert(m.clone(), Gone { info, fenced_by });
    }

    /// Machine `m` registers again on a new lease. Its fence has fired (its lease expired),
    /// so its copies still stop by the fence's time.
    pub fn come_back(&mut self, m: &MachineId) {
        if let Some(gone) = self.gone.get(m) {
            self.w.snap.machines.insert(m.clone(), gone.info.clone());
        }
    }

    pub fn machines(&self) -> Vec<MachineId> {
        self.w.snap.machines.keys().cloned().collect()
    }

    /// Never two copies of a unit, running or stopping, on two machines, but for one the
    /// registry did not show when the other's machine was given the unit.
    pub fn check_one_copy(&self) -> Result<(), TestCaseError> {
        let mut copies: BTreeMap<&UnitName, Vec<(&MachineId, &Instance)>> = BTreeMap::new();
        for ((unit, machine), copy) in &self.systemd {
            copies.entry(unit).or_default().push((machine, copy));
        }
        for (unit, copies) in copies {
            for (i, (ma, a)) in copies.iter().enumerate() {
                for (mb, b) in &copies[i + 1..] {
                    let excused = a.unseen.contains(&b.id) || b.unseen.contains(&a.id);
                    prop_assert!(
                        excused,
                        "{unit} runs on {ma} ({:?}) and {mb} ({:?})",
                        a.proc,
                        b.proc
                    );
                }
            }
        }
        Ok(())
    }

    /// Once every machine acted and published for a while: a unit waits for a previous copy
    /// only on the liar, and only if it was scheduled there; every stray is the liar's; no
    /// unit is held and no record names a machine that is gone. A record stays only on the
    /// liar, or of a copy its machine never published (docs/engine.md: its agent publishes
    /// nothing of a unit it has no file of, so nothing shows it stopped).
    pub fn check_settled(&mut self) -> Result<(), TestCaseError> {
        let plan = plan(&self.w.snap, &self.w.files);
        for (unit, machine) in plan.previous_copies {
            prop_assert_eq!(Some(&machine), self.liar.as_ref(), "{} waits", unit);
            prop_assert!(
                self.ever_on_liar.contains(&unit),
                "{unit} never was on the liar"
            );
        }
        let found = strays(&self.w.snap, &self.w.files, self.w.snap.states.keys());
        for (unit, machine) in found {
            prop_assert_eq!(
                Some(&machine),
                self.liar.as_ref(),
                "stray {} on {}",
                unit,
                machine
            );
        }
        let held = self
            .leader
            .disruption_mut()
            .assess(self.now, &self.w.snap)
            .held;
        prop_assert!(held.is_empty(), "still held: {held:?}");
        for (unit, machines) in &self.w.snap.left {
            for (machine, copy) in machines {
                prop_assert!(
                    self.w.snap.machines.contains_key(machine),
                    "{unit} left {machine}, which is gone"
                );
                let published = self.w.snap.states.get(unit).and_then(|s| s.get(machine));
                let unpublished = *copy == LeftCopy::Unpublished && published.is_none();
                prop_assert!(
                    self.liar.as_ref() == Some(machine) || unpublished,
                    "{unit} left {machine} ({copy}), still recorded"
                );
            }
        }
        Ok(())
    }
}

/// What happens between two engine passes: what `fleetctl` can do, a unit pinned
/// (`MachineID=`) to a machine, which moves it if it runs elsewhere, a machine's lease
/// expiring or coming back, a new leader.
#[derive(Debug, Clone)]
pub enum Event {
    Change(GenChange),
    /// The `n`th unit (modulo their number) gets a desired state.
    Desired(usize, DesiredState),
    /// The `n`th unit (modulo their number) gets `MachineID=` the `m`th machine.
    Pin(usize, usize),
    Vanish(usize),
    ComeBack(usize),
    NewLeader,
}

pub fn gen_event() -> impl Strategy<Value = Option<Event>> {
    prop_oneof![
        2 => Just(None),
        3 => gen_change().prop_map(|c| Some(Event::Change(c))),
        // Stopping and starting again is what leaves a unit unplaced for a while.
        2 => (0..UNITS, prop::sample::select(vec![Inactive, Loaded, Launched]))
            .prop_map(|(u, d)| Some(Event::Desired(u, d))),
        3 => (0..UNITS, 0..4usize).prop_map(|(u, m)| Some(Event::Pin(u, m))),
        2 => (0..4usize).prop_map(|m| Some(Event::Vanish(m))),
        1 => (0..4usize).prop_map(|m| Some(Event::ComeBack(m))),
        1 => Just(Some(Event::NewLeader)),
    ]
}

impl<L: Leader> Sim<L> {
    fn nth_unit(&mut self, n: usize) -> Option<&mut fleet_registry::Unit> {
        let count = self.w.snap.units.len();
        self.w.snap.units.values_mut().nth(n % count.max(1))
    }

    pub fn happen(&mut self, event: &Event) {
        match event {
            Event::Change(c) => {
                change(&mut self.w, &non_global(c));
            }
            Event::Desired(n, desired) => {
                if let Some(u) = self.nth_unit(*n) {
                    u.record.desired = *desired;
                }
            }
            Event::Pin(n, m) => {
                let file = unit_file(&format!("MachineID={}", MACHINES[*m]), 1);
                if let Some(u) = self.nth_unit(*n) {
                    u.record.hash = file.hash();
                    self.w.files.insert(file.hash(), file);
                }
            }
            Event::Vanish(m) => self.vanish(&mid(MACHINES[*m])),
            Event::ComeBack(m) => self.come_back(&mid(MACHINES[*m])),
            Event::NewLeader => self.new_leader(),
        }
    }
}

/// What each machine (by index into the live ones) does in a round: acts, publishes.
pub type Agents = Vec<(bool, bool)>;

/// An agent acts less often than it publishes: what lags most is what the checks are about.
pub fn gen_agent() -> impl Strategy<Value = (bool, bool)> {
    (prop::bool::weighted(0.4), prop::bool::weighted(0.6))
}

/// A generated history: what happens before each round, and what each agent does in it.
pub fn gen_history() -> impl Strategy<Value = Vec<(Option<Event>, Agents)>> {
    prop::collection::vec((gen_event(), prop::collection::vec(gen_agent(), 4)), 1..24)
}

/// Plays `history` (each round's event, then the round), then lets every agent act and
/// publish for a dozen rounds, checking for two copies throughout: what comes before the
/// checks of a settled cluster.
pub fn play<L: Leader>(
    sim: &mut Sim<L>,
    history: &[(Option<Event>, Agents)],
) -> Result<(), TestCaseError> {
    for (event, agents) in history {
        if let Some(event) = event {
            sim.happen(event);
        }
        round(sim, agents)?;
    }
    let everyone = vec![(true, true); 4];
    for _ in 0..12 {
        round(sim, &everyone)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Agents that act and publish in separate steps, each in some rounds only, machines
    /// vanishing with copies running or stopping and coming back, a new leader now and then,
    /// a machine that lies about units it does not run, and units changed under them: never
    /// two copies but for an unpublished one (see the module). Once everything settles, a
    /// unit waits for a previous copy only on the liar, and only if it was scheduled there;
    /// every stray is the liar's; nothing is held and no record names a machine gone.
    #[test]
    fn never_two_copies_whatever_agents_lag_machines_vanish_or_one_lies(
        g in gen_world(),
        liar in prop::option::of(0..4usize),
        rounds in gen_history(),
    ) {
        let mut sim = Sim::new(&g, liar);
        play(&mut sim, &rounds)?;
        sim.check_settled()?;
    }
}

/// A tick, an engine pass, then each live machine's agent acting and publishing as told.
pub fn round<L: Leader>(sim: &mut Sim<L>, agents: &Agents) -> Result<(), TestCaseError> {
    sim.tick();
    sim.check_one_copy()?;
    sim.engine();
    for (m, (acts, publishes)) in sim.machines().iter().zip(agents) {
        if *acts {
            sim.act(m)?;
        }
        if *publishes {
            sim.publish(m);
        }
    }
    Ok(())
}

/// `c`, its units made non-global.
fn non_global(c: &GenChange) -> GenChange {
    match c.clone() {
        GenChange::Arrive(n, mut u) => {
            u.global = false;
            GenChange::Arrive(n, u)
        }
        GenChange::Options(i, mut u) => {
            u.global = false;
            GenChange::Options(i, u)
        }
        other @ (GenChange::Destroy(_) | GenChange::Desired(..) | GenChange::Version(_)) => other,
    }
}
