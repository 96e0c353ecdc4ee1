//! A small model of one machine (units directory + systemd) to apply plans to.
//!
//! The model follows the facts the planner relies on: a linked file that systemd has no
//! definition for loads on demand (on a status query or a start); a unit systemd has loaded
//! keeps its definition until a reload; a reload drops definitions whose file is gone and
//! garbage-collects stopped units without one; `Unload` stops before it removes the file.

use super::*;

/// Contents 0..CONTENTS are fleet's files; these two are not.
const CONTENTS: u8 = 3;
const FOREIGN: u8 = 200;
const UNPARSEABLE: u8 = 99;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimFile {
    Absent,
    Unparseable,
    Present(u8),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActiveState {
    Inactive,
    Failed,
    Running,
    Activating,
    Reloading,
    Deactivating,
}

impl ActiveState {
    fn as_str(self) -> &'static str {
        match self {
            Self::Inactive => "inactive",
            Self::Failed => "failed",
            Self::Running => "active",
            Self::Activating => "activating",
            Self::Reloading => "reloading",
            Self::Deactivating => "deactivating",
        }
    }

    fn running(self) -> bool {
        match self {
            Self::Running | Self::Activating | Self::Reloading => true,
            Self::Inactive | Self::Failed | Self::Deactivating => false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimSystemd {
    /// The content systemd loaded the unit from; `None` is `not-found`.
    def: Option<u8>,
    active: ActiveState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimUnit {
    file: SimFile,
    linked: bool,
    systemd: Option<SimSystemd>,
}

impl SimUnit {
    const NOTHING: SimUnit = SimUnit {
        file: SimFile::Absent,
        linked: false,
        systemd: None,
    };

    fn running(&self) -> bool {
        self.systemd.is_some_and(|s| s.active.running())
    }

    /// What systemd would load for this name right now.
    fn loadable(&self) -> Option<u8> {
        if !self.linked {
            return None;
        }
        match self.file {
            SimFile::Absent => None,
            SimFile::Unparseable => Some(UNPARSEABLE),
            SimFile::Present(c) => Some(c),
        }
    }

    fn load_on_demand(&mut self) {
        let Some(def) = self.loadable() else {
            return;
        };
        match &mut self.systemd {
            None => {
                self.systemd = Some(SimSystemd {
                    def: Some(def),
                    active: ActiveState::Inactive,
                })
            }
            Some(s) if s.def.is_none() && !s.active.running() => s.def = Some(def),
            Some(_) => {}
        }
    }

    fn project(&self) -> CurrentUnit {
        let file = match self.file {
            SimFile::Absent => UnitFileState::Absent,
            SimFile::Unparseable => UnitFileState::Unparseable,
            SimFile::Present(c) => UnitFileState::Present {
                hash: hash(c),
                linked: self.linked,
            },
        };
        let systemd = self.systemd.map(|s| SystemdState {
            load: if s.def.is_some() {
                "loaded"
            } else {
                "not-found"
            }
            .to_owned(),
            active: s.active.as_str().to_owned(),
            sub: "whatever".to_owned(),
        });
        let need_daemon_reload = self
            .systemd
            .is_some_and(|s| s.def.is_some() && s.def != self.loadable());
        CurrentUnit {
            file,
            systemd,
            need_daemon_reload,
            restarted: None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct World {
    units: BTreeMap<UnitName, SimUnit>,
    desired: BTreeMap<UnitName, (u8, Target)>,
    pub backoff: BTreeSet<UnitName>,
}

impl World {
    fn unit(&self, name: &UnitName) -> SimUnit {
        self.units.get(name).copied().unwrap_or(SimUnit::NOTHING)
    }

    fn desired(&self) -> BTreeMap<UnitName, DesiredUnit> {
        self.desired
            .iter()
            .map(|(n, (c, target))| {
                let unit = DesiredUnit {
                    hash: hash(*c),
                    target: *target,
                    restart: 0,
                    no_restart: false,
                };
                (n.clone(), unit)
            })
            .collect()
    }

    /// What the agent would see: units with a file or a systemd record (others left out, to
    /// exercise the planner's defaults).
    fn current(&self) -> BTreeMap<UnitName, CurrentUnit> {
        self.units
            .iter()
            .filter(|(_, u)| u.file != SimFile::Absent || u.systemd.is_some())
            .map(|(n, u)| (n.clone(), u.project()))
            .collect()
    }

    pub fn plan(&self) -> Vec<Task> {
        plan(&self.desired(), &self.current(), &self.backoff)
    }

    /// Every other unit the world knows, by name: the scope of a pass after a hint.
    pub fn some_names(&self) -> BTreeSet<UnitName> {
        let known: BTreeSet<&UnitName> = self.units.keys().chain(self.desired.keys()).collect();
        known.into_iter().step_by(2).cloned().collect()
    }

    /// [`plan_of`] the units of `names`, and [`plan`] of a world that has only them.
    pub fn plans_of(&self, names: &BTreeSet<UnitName>) -> (Vec<Task>, Vec<Task>) {
        let (mut desired, mut current) = (self.desired(), self.current());
        let scoped = plan_of(&desired, &current, &self.backoff, names);
        desired.retain(|n, _| names.contains(n));
        current.retain(|n, _| names.contains(n));
        (scoped, plan(&desired, &current, &self.backoff))
    }

    /// Units already as desired, which adoption must leave alone.
    pub fn adoptable(&self) -> Vec<UnitName> {
        self.desired
            .iter()
            .filter(|(name, (c, target))| {
                let u = self.unit(name);
                let current = u.project();
                !self.backoff.contains(*name)
                    && u.file == SimFile::Present(*c)
                    && u.linked
                    && u.systemd.is_some_and(|s| s.def == Some(*c))
                    && !current.need_daemon_reload
                    && u.running() == (*target == Target::Launched)
            })
            .map(|(name, _)| name.clone())
            .collect()
    }

    fn apply(&mut self, task: &Task) {
        let desired = self.desired.get(&task.unit).copied();
        if task.kind == TaskKind::ReloadUnitFiles {
            return self.reload();
        }
        let unit = self
            .units
            .entry(task.unit.clone())
            .or_insert(SimUnit::NOTHING);
        match task.kind {
            TaskKind::Unload => {
                // The executor awaits the stop before the file goes.
                if let Some(s) = &mut unit.systemd {
                    s.active = ActiveState::Inactive;
                }
                unit.file = SimFile::Absent;
                unit.linked = false;
            }
            TaskKind::Load => {
                let (c, _) = desired.expect("load of an undesired unit");
                unit.file = SimFile::Present(c);
                unit.linked = true;
            }
            TaskKind::Stop => {
                if let Some(s) = &mut unit.systemd
                    && (s.active.running() || s.active == ActiveState::Deactivating)
                {
                    s.active = ActiveState::Inactive;
                }
            }
            // The simulator never asks for restarts (its units have generation 0).
            TaskKind::Restart => panic!("restart of {} in the simulator", task.unit),
            TaskKind::Start => {
                let (c, _) = desired.expect("start of an undesired unit");
                unit.load_on_demand();
                let s = unit
                    .systemd
                    .as_mut()
                    .unwrap_or_else(|| panic!("start of {} which systemd cannot load", task.unit));
                assert_eq!(
                    s.def,
                    Some(c),
                    "start of {} runs a stale definition",
                    task.unit
                );
                s.active = ActiveState::Running;
            }
            TaskKind::ReloadUnitFiles => unreachable!("handled above"),
        }
    }

    fn reload(&mut self) {
        for unit in self.units.values_mut() {
            let loadable = unit.loadable();
            let running = unit.running();
            let Some(s) = &mut unit.systemd else { continue };
            let def = match loadable {
                Some(def) => Some(def),
                None if s.def == Some(FOREIGN) => Some(FOREIGN),
                None => None,
            };
            if def.is_none() && !running {
                unit.systemd = None;
            } else {
                s.def = def;
            }
        }
    }

    /// The agent's next status query loads what it asks about on demand.
    fn observe(&mut self) {
        let names: Vec<UnitName> = self
            .units
            .keys()
            .chain(self.desired.keys())
            .cloned()
            .collect();
        for name in names {
            self.units
                .entry(name)
                .or_insert(SimUnit::NOTHING)
                .load_on_demand();
        }
    }

    pub fn check_converges_in_one_pass(&self) {
        let tasks = self.plan();
        let mut after = self.clone();
        for task in &tasks {
            after.apply(task);
        }
        after.observe();
        let again = after.plan();
        assert!(
            again.is_empty(),
            "not converged\nbefore: {self:#?}\ntasks: {tasks:#?}\nafter: {after:#?}\nagain: {again:#?}"
        );
        for (name, before) in &self.units {
            let now = after.unit(name);
            if self.backoff.contains(name) {
                assert_eq!(
                    (now.file, now.linked),
                    (before.file, before.linked),
                    "{name}"
                );
                continue;
            }
            if !self.desired.contains_key(name) && before.file != SimFile::Absent {
                assert_eq!(now.file, SimFile::Absent, "{name}: file left behind");
                assert!(!now.running(), "{name}: still running");
            }
        }
        for (name, (c, target)) in &self.desired {
            if self.backoff.contains(name) {
                continue;
            }
            let now = after.unit(name);
            assert_eq!(now.file, SimFile::Present(*c), "{name}");
            assert!(now.linked, "{name}: not linked");
            assert_eq!(
                now.systemd.and_then(|s| s.def),
                Some(*c),
                "{name}: definition"
            );
            assert_eq!(
                now.running(),
                *target == Target::Launched,
                "{name}: running"
            );
        }
    }
}

fn names() -> Vec<UnitName> {
    (0..6).map(|i| name(&format!("u{i}.service"))).collect()
}

fn active() -> impl Strategy<Value = ActiveState> {
    prop_oneof![
        Just(ActiveState::Inactive),
        Just(ActiveState::Failed),
        Just(ActiveState::Running),
        Just(ActiveState::Activating),
        Just(ActiveState::Reloading),
        Just(ActiveState::Deactivating),
    ]
}

fn sim_unit() -> impl Strategy<Value = SimUnit> {
    let file = prop_oneof![
        2 => Just(SimFile::Absent),
        1 => Just(SimFile::Unparseable),
        4 => (0..CONTENTS).prop_map(SimFile::Present),
    ];
    let def = prop_oneof![
        Just(None),
        Just(Some(FOREIGN)),
        (0..CONTENTS).prop_map(Some),
    ];
    let systemd =
        proptest::option::of((def, active()).prop_map(|(def, active)| SimSystemd { def, active }));
    (file, any::<bool>(), systemd).prop_map(|(file, linked, systemd)| SimUnit {
        file,
        linked: linked && file != SimFile::Absent,
        systemd,
    })
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![Just(Target::Loaded), Just(Target::Launched)]
}

pub fn world() -> impl Strategy<Value = World> {
    let n = names().len();
    let units = proptest::collection::vec(sim_unit(), n);
    let desired = proptest::collection::vec(proptest::option::of((0..CONTENTS, target())), n);
    let backoff = proptest::collection::vec(proptest::bool::weighted(0.15), n);
    (units, desired, backoff).prop_map(|(units, desired, backoff)| {
        let names = names();
        World {
            units: names.iter().cloned().zip(units).collect(),
            desired: names
                .iter()
                .cloned()
                .zip(desired)
                .filter_map(|(n, d)| d.map(|d| (n, d)))
                .collect(),
            backoff: names
                .iter()
                .cloned()
                .zip(backoff)
                .filter_map(|(n, b)| b.then_some(n))
                .collect(),
        }
    })
}
