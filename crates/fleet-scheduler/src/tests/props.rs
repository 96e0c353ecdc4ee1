//! Properties of the scheduler over generated clusters, checked by an oracle written
//! directly against fleet-core's rules (not against the planner's own helpers): safety
//! (never two entries of a non-global unit, never on a machine that breaks a rule, a rolling
//! replace never ahead of itself), completeness (every unit some machine could take is
//! placed, unless a machine publishes a copy of it that may run), convergence (a plan applied
//! and planned again yields nothing) and stability (healthy units never move). Generated
//! units carry replace options (no restart, `--reschedule`, rolling) and machines publish
//! states, live or dead, some for units never scheduled there (strays), and the registry
//! records machines units left (the placement history). Never two copies is a property of
//! what machines run, not of the schedule: `sim.rs` checks it against simulated agents.

use super::*;
use fleet_core::{Requirements, units_conflict, units_replace};
use fleet_registry::Rollout;
use proptest::prelude::*;

/// Machine IDs long enough for 8-character short forms; the last one is never live.
pub const MACHINES: [&str; 5] = [
    "alpha000aaaa",
    "bravo000bbbb",
    "charlie0cccc",
    "delta000dddd",
    "echo0000eeee",
];
pub const UNITS: usize = 8;

pub fn unit_name(i: usize) -> String {
    format!("u{i}.service")
}

#[derive(Debug, Clone)]
pub struct GenUnit {
    desired: DesiredState,
    pub global: bool,
    machine_id: Option<(usize, bool)>,
    role: Option<&'static str>,
    machine_of: Option<usize>,
    conflicts: Option<&'static str>,
    replaces: Option<usize>,
    replace: GenReplace,
}

/// Replace options: no restart; a placement generation (0 to 2) with a machine to avoid
/// (4 = a dead one); a machine to prefer (fleet's form; 4 = a dead one); a rolling replace
/// from version 0 or 9 that has reached some machines.
#[derive(Debug, Clone)]
struct GenReplace {
    no_restart: bool,
    placement: u64,
    avoid: Option<usize>,
    prefer: Option<usize>,
    rollout: Option<(u32, Vec<usize>)>,
}

fn gen_replace() -> impl Strategy<Value = GenReplace> {
    (
        prop::bool::weighted(0.2),
        prop::sample::select(vec![0u64, 0, 1, 2]),
        prop::option::of(0..5usize),
        prop::option::weighted(0.2, 0..5usize),
        prop::option::weighted(
            0.3,
            (
                prop::sample::select(vec![0u32, 9]),
                prop::sample::subsequence(vec![0usize, 1, 2, 3], 0..=4),
            ),
        ),
    )
        .prop_map(
            |(no_restart, placement, avoid, prefer, rollout)| GenReplace {
                no_restart,
                placement,
                avoid,
                prefer,
                rollout,
            },
        )
}

impl GenReplace {
    fn state(&self) -> ReplaceState {
        ReplaceState {
            no_restart: self.no_restart,
            placement: self.placement,
            avoid: self.avoid.map(|m| mid(MACHINES[m])),
            prefer: self.prefer.map(|m| mid(MACHINES[m])),
            rollout: self.rollout.as_ref().map(|(previous, updated)| Rollout {
                previous: unit_file("", *previous).hash(),
                updated: updated.iter().map(|m| mid(MACHINES[*m])).collect(),
            }),
        }
    }
}

pub fn gen_unit() -> impl Strategy<Value = GenUnit> {
    (
        prop::sample::select(vec![Inactive, Loaded, Launched, Launched]),
        prop::bool::weighted(0.15),
        prop::option::weighted(0.15, (0..4usize, any::<bool>())),
        prop::option::weighted(0.3, prop::sample::select(vec!["a", "b"])),
        prop::option::weighted(0.2, 0..UNITS),
        prop::option::weighted(
            0.3,
            prop::sample::select(vec!["u0.service", "u1.service", "u[2-4].service", "u7*"]),
        ),
        prop::option::weighted(0.2, 0..UNITS),
        gen_replace(),
    )
        .prop_map(
            |(desired, global, machine_id, role, machine_of, conflicts, replaces, replace)| {
                GenUnit {
                    desired,
                    global,
                    machine_id,
                    role,
                    machine_of,
                    conflicts,
                    replaces,
                    replace,
                }
            },
        )
}

impl GenUnit {
    /// The `[X-Fleet]` lines; `Replaces=` only names units before `index` so that replace
    /// chains are acyclic (cycles are fleet's endless loop; see `MAX_ROUNDS`).
    fn xfleet(&self, index: usize) -> String {
        let mut lines = Vec::new();
        if self.global {
            lines.push("Global=true".to_owned());
        }
        if let Some((m, short)) = self.machine_id {
            let id = if short {
                &MACHINES[m][..8]
            } else {
                MACHINES[m]
            };
            lines.push(format!("MachineID={id}"));
        }
        if let Some(role) = self.role {
            lines.push(format!("MachineMetadata=role={role}"));
        }
        if let Some(peer) = self.machine_of.filter(|p| *p != index) {
            lines.push(format!("MachineOf={}", unit_name(peer)));
        }
        if let Some(glob) = self.conflicts {
            lines.push(format!("Conflicts={glob}"));
        }
        if let Some(r) = self.replaces.filter(|r| *r < index) {
            lines.push(format!("Replaces={}", unit_name(r)));
        }
        lines.join(";")
    }
}

#[derive(Debug, Clone)]
pub struct GenWorld {
    /// Live machines (by index into `MACHINES[..4]`) with their role.
    pub machines: Vec<(usize, Option<&'static str>)>,
    pub units: Vec<GenUnit>,
    /// Existing entries: unit, machine (4 = a dead machine), stale file, desired, placement.
    pub entries: Vec<(usize, usize, bool, DesiredState, u64)>,
    unscheduled: Vec<usize>,
    /// Published states: unit, machine (4 = a dead machine), ActiveState.
    pub states: Vec<(usize, usize, &'static str)>,
    /// The placement history: unit, machine it left (4 = a dead machine).
    pub left: Vec<(usize, usize)>,
}

pub fn gen_world() -> impl Strategy<Value = GenWorld> {
    (
        prop::sample::subsequence(vec![0usize, 1, 2, 3], 0..=4).prop_flat_map(|ms| {
            let n = ms.len();
            (
                Just(ms),
                prop::collection::vec(prop::option::of(prop::sample::select(vec!["a", "b"])), n),
            )
        }),
        prop::collection::vec(gen_unit(), 0..=UNITS),
        prop::collection::vec(
            (
                0..UNITS,
                0..5usize,
                prop::bool::weighted(0.2),
                prop::sample::select(vec![Loaded, Launched]),
                prop::sample::select(vec![0u64, 0, 1]),
            ),
            0..10,
        ),
        prop::collection::vec(0..UNITS, 0..3),
        prop::collection::vec(
            (
                0..UNITS,
                0..5usize,
                prop::sample::select(vec![
                    "active",
                    "activating",
                    "deactivating",
                    "inactive",
                    "failed",
                ]),
            ),
            0..4,
        ),
        prop::collection::vec((0..UNITS, 0..5usize), 0..3),
    )
        .prop_map(
            |((ms, roles), units, entries, unscheduled, states, left)| GenWorld {
                machines: ms.into_iter().zip(roles).collect(),
                units,
                entries,
                unscheduled,
                states,
                left,
            },
        )
}

pub fn build(g: &GenWorld) -> World {
    let mut w = World::new();
    for (m, role) in &g.machines {
        let md: Vec<(&str, &str)> = role.iter().map(|r| ("role", *r)).collect();
        w = w.machine(MACHINES[*m], &md);
    }
    for (i, u) in g.units.iter().enumerate() {
        w = w.unit_version(&unit_name(i), u.desired, &u.xfleet(i), 1);
        w = w.replace(&unit_name(i), u.replace.state());
    }
    for (u, m, stale, desired, placement) in &g.entries {
        let hash = match w.snap.units.get(&name(&unit_name(*u))) {
            Some(unit) if !stale => unit.hash(),
            Some(_) | None => unit_file("", 0).hash(),
        };
        w = w.entry_with(&unit_name(*u), MACHINES[*m], hash, *desired);
        w = w.with_entry(&unit_name(*u), MACHINES[*m], |e| e.placement = *placement);
    }
    for (u, m, active) in &g.states {
        w = w.state(&unit_name(*u), MACHINES[*m], active);
    }
    for (u, m) in &g.left {
        w = w.left(&unit_name(*u), MACHINES[*m]);
    }
    for u in &g.unscheduled {
        w.snap
            .unscheduled
            .insert(name(&unit_name(*u)), "stale reason".into());
    }
    w
}

/// The oracle's view of a settled world.
struct View<'w> {
    w: &'w World,
    reqs: BTreeMap<UnitName, Requirements>,
}

impl<'w> View<'w> {
    fn new(w: &'w World) -> View<'w> {
        let reqs = w
            .snap
            .units
            .iter()
            .map(|(n, u)| (n.clone(), Requirements::from_unit(n, &w.files[&u.hash()])))
            .collect();
        View { w, reqs }
    }

    fn on(&self, m: &MachineId) -> Vec<&UnitName> {
        let s = &self.w.snap.schedule;
        s.iter()
            .filter(|(_, ms)| ms.contains_key(m))
            .map(|(u, _)| u)
            .collect()
    }

    /// Units to place: not inactive, with options fleet accepts.
    fn wanted(&self) -> impl Iterator<Item = &UnitName> {
        self.w
            .snap
            .units
            .values()
            .filter(|u| u.desired() != Inactive && self.reqs[u.name()].validate().is_ok())
            .map(|u| u.name())
    }

    /// Whether `u` on `m` breaks MachineID, metadata or MachineOf.
    fn own_rules_fail(&self, u: &UnitName, m: &MachineId) -> bool {
        let r = &self.reqs[u];
        let here = self.on(m);
        !r.machine_id_matches(m)
            || !r.metadata_matches(&self.w.snap.machines[m].metadata)
            || r.machine_of
                .iter()
                .any(|p| !here.iter().any(|h| h.as_str() == p))
    }

    /// Whether a live machine publishes a copy of `u` that may be running: the unit may then
    /// wait for it (which machines may hold it is the rule under test, not the oracle's).
    fn published_running(&self, u: &UnitName) -> bool {
        let snap = &self.w.snap;
        let mut states = snap.states.get(u).into_iter().flatten();
        states.any(|(m, s)| {
            snap.machines.contains_key(m)
                && !["inactive", "failed"].contains(&s.systemd.active.as_str())
        })
    }

    /// The versions `u` may have on `m`: its own, and a rolling replace's previous one on
    /// machines the roll has not reached.
    fn allowed_hashes(&self, u: &UnitName, m: &MachineId) -> Vec<UnitHash> {
        let record = &self.w.snap.units[u].record;
        let mut hashes = vec![record.hash];
        if let Some(r) = &record.replace.rollout
            && !r.updated.contains(m)
        {
            hashes.push(r.previous);
        }
        hashes
    }

    fn clash(&self, a: &UnitName, b: &UnitName) -> bool {
        let (ra, rb) = (&self.reqs[a], &self.reqs[b]);
        units_conflict((a, ra), (b, rb)) || units_replace((a, ra), (b, rb))
    }

    /// Whether a non-global `u` could be added to `m` (being replaced there counts as no,
    /// and so does needing a peer that would leave with a unit `u` replaces).
    fn could_place(&self, u: &UnitName, m: &MachineId) -> bool {
        let r = &self.reqs[u];
        !self.own_rules_fail(u, m)
            && self.on(m).iter().all(|o| {
                let ro = &self.reqs[*o];
                let replaced_by_o = ro.replaces_name(u) && !r.replaces_name(o);
                !units_conflict((u, r), (o, ro)) && !replaced_by_o
            })
            && !self
                .leaving(u, m)
                .iter()
                .any(|l| r.machine_of.iter().any(|p| p == l.as_str()))
    }

    /// The units that leave `m` if `u` joins it: those it replaces, and their followers.
    fn leaving(&self, u: &UnitName, m: &MachineId) -> BTreeSet<UnitName> {
        let r = &self.reqs[u];
        let on = self.on(m);
        let mut out: BTreeSet<UnitName> = on
            .iter()
            .filter(|o| units_replace((u, r), (o, &self.reqs[**o])) && r.replaces_name(o))
            .map(|o| (*o).clone())
            .collect();
        loop {
            let before = out.len();
            for o in &on {
                if self.reqs[*o]
                    .machine_of
                    .iter()
                    .any(|p| out.iter().any(|l| l.as_str() == p))
                {
                    out.insert((*o).clone());
                }
            }
            if out.len() == before {
                return out;
            }
        }
    }
}

fn check_safety(v: &View<'_>) -> Result<(), TestCaseError> {
    for (u, ms) in &v.w.snap.schedule {
        let unit = v.w.snap.units.get(u);
        prop_assert!(v.wanted().any(|w| w == u), "{u} is not wanted");
        prop_assert!(
            v.reqs[u].global || ms.len() == 1,
            "{u} on {:?}",
            ms.keys().collect::<Vec<_>>()
        );
        for (m, entry) in ms {
            prop_assert!(v.w.snap.machines.contains_key(m), "{u} on dead {m}");
            prop_assert!(!v.own_rules_fail(u, m), "{u} breaks its rules on {m}");
            let unit = unit.unwrap();
            prop_assert!(
                v.allowed_hashes(u, m).contains(&entry.hash),
                "{u} version on {m}"
            );
            prop_assert_eq!(entry.desired, unit.desired());
            prop_assert_eq!(entry.no_restart, unit.record.replace.no_restart);
            prop_assert_eq!(entry.placement, unit.record.replace.placement);
            for o in v.on(m) {
                prop_assert!(!v.clash(u, o), "{u} and {o} clash on {m}");
            }
        }
        prop_assert!(
            !v.w.snap.unscheduled.contains_key(u),
            "{u} placed but has a reason"
        );
    }
    Ok(())
}

fn check_completeness(v: &View<'_>) -> Result<(), TestCaseError> {
    for (n, u) in &v.w.snap.units {
        let invalid = u.desired() != Inactive && v.reqs[n].validate().is_err();
        prop_assert!(
            !invalid || v.w.snap.unscheduled.contains_key(n),
            "invalid {n} has no reason"
        );
    }
    for u in v.wanted() {
        let placed_on = v.w.snap.schedule.get(u);
        for m in v.w.snap.machines.keys() {
            if placed_on.is_some_and(|ms| ms.contains_key(m)) {
                continue;
            }
            if v.reqs[u].global {
                let blocked = v.own_rules_fail(u, m) || v.on(m).iter().any(|o| v.clash(u, o));
                prop_assert!(blocked, "global {u} could run on {m}");
            } else if placed_on.is_none() && !v.published_running(u) {
                // With a copy still running, the unit may wait: the machine chosen for it
                // can be another one.
                prop_assert!(!v.could_place(u, m), "{u} could run on {m}");
            }
        }
        if placed_on.is_none() {
            prop_assert!(
                v.w.snap.unscheduled.contains_key(u),
                "{u} unplaced without reason"
            );
        }
    }
    Ok(())
}

fn unschedules(w: &World) -> Vec<String> {
    let d = w.plan();
    let out: Vec<Decision> = d
        .into_iter()
        .filter(|d| matches!(d.kind, DecisionKind::Unschedule { .. }))
        .collect();
    lines(&out)
}

/// Whether `w`'s plan places one of the units in `held` (held back for a running copy).
fn releases(w: &World, held: &[String]) -> bool {
    w.plan().iter().any(|d| {
        matches!(&d.kind, DecisionKind::Schedule { unit, .. } if held.contains(&unit.to_string()))
    })
}

/// A change to one unit of a settled world: what `fleetctl` can do to it.
#[derive(Debug, Clone)]
pub enum GenChange {
    /// A new unit `u{8 + n}` (`Replaces=` only of units before it).
    Arrive(usize, GenUnit),
    Destroy(usize),
    Desired(usize, DesiredState),
    /// A new version of the file, same options.
    Version(usize),
    /// New `[X-Fleet]` options (and so a new file).
    Options(usize, GenUnit),
}

pub fn gen_change() -> impl Strategy<Value = GenChange> {
    prop_oneof![
        (0..3usize, gen_unit()).prop_map(|(n, u)| GenChange::Arrive(n, u)),
        (0..UNITS).prop_map(GenChange::Destroy),
        (
            0..UNITS,
            prop::sample::select(vec![Inactive, Loaded, Launched])
        )
            .prop_map(|(i, d)| GenChange::Desired(i, d)),
        (0..UNITS).prop_map(GenChange::Version),
        (0..UNITS, gen_unit()).prop_map(|(i, u)| GenChange::Options(i, u)),
    ]
}

/// Applies `change` to `w` (a change to a unit that does not exist does nothing); returns
/// the unit it touched.
pub fn change(w: &mut World, change: &GenChange) -> UnitName {
    let existing = |w: &World, i: usize| w.snap.units.get(&name(&unit_name(i))).cloned();
    match change {
        GenChange::Arrive(n, u) => {
            let i = UNITS + n;
            *w = std::mem::take(w).unit_version(&unit_name(i), u.desired, &u.xfleet(i), 1);
            name(&unit_name(i))
        }
        GenChange::Destroy(i) => {
            w.snap.units.remove(&name(&unit_name(*i)));
            name(&unit_name(*i))
        }
        GenChange::Desired(i, d) => {
            if let Some(u) = w.snap.units.get_mut(&name(&unit_name(*i))) {
                u.record.desired = *d;
            }
            name(&unit_name(*i))
        }
        GenChange::Version(i) | GenChange::Options(i, _) => {
            if let Some(u) = existing(w, *i) {
                let text = w.files[&u.hash()].canonical();
                let file = match change {
                    GenChange::Options(_, g) => {
                        let xfleet = g.xfleet(*i).replace(';', "\n");
                        let base = text.split("[X-Fleet]").next().unwrap_or_default();
                        format!("{base}[X-Fleet]\n{xfleet}\n")
                    }
                    _ => format!("{text}\n[Unit]\nDescription=v2\n"),
                };
                let file = UnitFile::parse(file.as_bytes()).unwrap();
                let hash = file.hash();
                w.files.insert(hash, file);
                w.snap.units.get_mut(u.name()).unwrap().record.hash = hash;
            }
            name(&unit_name(*i))
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// What the leader relies on to plan only the units a change touched: whenever
    /// `plan_delta` answers, its plan is the whole plan, decision for decision.
    #[test]
    fn a_plan_of_the_touched_units_is_the_whole_plan(g in gen_world(), changes in prop::collection::vec(gen_change(), 1..4)) {
        let mut w = build(&g);
        w.settle();
        // A leader whose last plan waits for a copy to stop plans the whole.
        if !w.waiting().is_empty() {
            return Ok(());
        }
        let entangled = Entangled::of(&w.snap, &w.files);
        let touched: BTreeSet<UnitName> = changes.iter().map(|c| change(&mut w, c)).collect();
        if let Some(part) = plan_delta(&w.snap, &w.files, &touched, &entangled) {
            let whole = plan(&w.snap, &w.files);
            prop_assert_eq!(lines(&part.decisions), lines(&whole.decisions));
            prop_assert_eq!(part, whole);
        }
    }

    /// What the leader relies on to plan a machine's loss alone: the units it touches (on
    /// machines that are gone, or placed nowhere), less those the disruption rule holds,
    /// planned with the changed units, make the whole plan with the same holds, decision
    /// for decision.
    #[test]
    fn a_loss_planned_alone_is_the_whole_plan_with_the_same_holds(
        g in gen_world(),
        lost in 0..4usize,
        kept in prop::collection::vec(any::<bool>(), UNITS + 3),
        changes in prop::collection::vec(gen_change(), 0..3),
    ) {
        let mut w = build(&g);
        w.settle();
        if !w.waiting().is_empty() {
            return Ok(());
        }
        let entangled = Entangled::of(&w.snap, &w.files);
        let changed: BTreeSet<UnitName> = changes.iter().map(|c| change(&mut w, c)).collect();
        let w = w.without_machine(MACHINES[lost]);
        // The rule holds units of gone machines only: scheduled there, or recorded as left.
        let on_gone = touched_by_loss(&w.snap, &BTreeSet::new(), &BTreeSet::new());
        let held: BTreeSet<UnitName> = on_gone
            .iter()
            .filter(|u| w.snap.schedule.contains_key(*u) || w.snap.left.contains_key(*u))
            .enumerate()
            .filter(|(i, _)| kept[*i % kept.len()])
            .map(|(_, u)| u.clone())
            .collect();
        let touched = touched_by_loss(&w.snap, &changed, &held);
        if let Some(part) = plan_delta_holding(&w.snap, &w.files, &touched, &entangled, &held) {
            let whole = plan_holding(&w.snap, &w.files, &held);
            prop_assert_eq!(lines(&part.decisions), lines(&whole.decisions));
            prop_assert_eq!(part, whole);
        }
    }

    #[test]
    fn a_settled_schedule_is_safe_complete_and_stable(g in gen_world()) {
        let mut w = build(&g);
        w.settle();
        let v = View::new(&w);
        check_safety(&v)?;
        check_completeness(&v)?;
        let again = lines(&w.plan());
        prop_assert!(again.is_empty(), "re-plan not empty: {again:?}");
    }

    #[test]
    fn healthy_units_stay_when_a_machine_joins(g in gen_world(), role in prop::option::of(prop::sample::select(vec!["a", "b"]))) {
        let mut w = build(&g);
        w.settle();
        let md: Vec<(&str, &str)> = role.iter().map(|r| ("role", *r)).collect();
        let w = w.machine("foxtrot0ffff", &md);
        prop_assert_eq!(unschedules(&w), Vec::<String>::new());
    }

    #[test]
    fn healthy_units_stay_when_a_unit_without_replaces_arrives(g in gen_world(), new in gen_unit()) {
        let mut w = build(&g);
        w.settle();
        let held = w.waiting();
        let new = GenUnit { replaces: None, ..new };
        let w = w.unit("u9.service", new.desired, &new.xfleet(9));
        // A held unit is a placement still to come, on the least-loaded machine: the new
        // unit's load (or its conflicts) can make that the machine the held unit's copy runs
        // on, which ends the hold, and the held unit (or a dependent following it) then
        // displaces what it replaces, as any arriving unit with `Replaces=` would. See
        // `a_new_unit_that_evens_the_load_lets_a_held_unit_land_where_its_copy_runs`.
        if !releases(&w, &held) {
            prop_assert_eq!(unschedules(&w), Vec::<String>::new());
        }
    }

    #[test]
    fn a_rolling_replace_gives_the_new_version_only_where_it_has_reached(g in gen_world()) {
        let w = build(&g);
        for d in w.plan() {
            let DecisionKind::Update { unit, machine, hash, .. } = &d.kind else {
                continue;
            };
            let record = &w.snap.units[unit].record;
            let before = w.snap.schedule[unit][machine].hash;
            if let Some(r) = &record.replace.rollout
                && !r.updated.contains(machine)
            {
                prop_assert!(*hash != record.hash || before == record.hash, "{unit} on {machine}");
            }
        }
    }

    #[test]
    fn planning_is_deterministic(g in gen_world()) {
        let w = build(&g);
        prop_assert_eq!(w.plan(), w.plan());
    }
}
