//! The agent's pure planner: from what should run on this machine and what runs here, the tasks
//! that converge the two.
//!
//! Synchronous and free of I/O, time and logging; the executor runs the tasks (see
//! [`crate::manager`] for what it must guarantee) and the loop logs them with their reasons.
//!
//! The rule the rest hangs on is adoption: a unit whose file already has the desired hash and
//! whose systemd state already matches gets no task at all, so an agent restart leaves running
//! units untouched (fleet reloaded and "started" every unit after a restart, issue #720).

use fleet_core::{ActiveState, DesiredState, LoadState, SystemdState, UnitHash, UnitName};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// What a unit scheduled here should be. `inactive` units are not scheduled anywhere, so they
/// are simply absent from the desired map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// File written and linked into systemd, unit not running.
    Loaded,
    /// File written and linked, unit running.
    Launched,
}

impl Target {
    /// `None` for [`DesiredState::Inactive`], which means "not here".
    pub fn from_desired(state: DesiredState) -> Option<Target> {
        match state {
            DesiredState::Inactive => None,
            DesiredState::Loaded => Some(Target::Loaded),
            DesiredState::Launched => Some(Target::Launched),
        }
    }
}

/// A unit that should be on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DesiredUnit {
    pub hash: UnitHash,
    pub target: Target,
    /// The restart generation asked for (`fleetctl restart` bumps it).
    pub restart: u64,
    /// A new file replaces the old one without restarting a running unit (`--no-restart`).
    pub no_restart: bool,
}

/// The unit's file in the units directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitFileState {
    /// No file.
    Absent,
    /// A file that could not be read or parsed.
    Unparseable,
    /// A file with this hash; `linked` when systemd's runtime directory links to it.
    Present { hash: UnitHash, linked: bool },
}

/// What this machine has for one unit. A unit absent from the current map is
/// `{ file: Absent, systemd: None, need_daemon_reload: false }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentUnit {
    pub file: UnitFileState,
    /// systemd's states; `None` when systemd has no record, which is treated as `not-found`.
    pub systemd: Option<SystemdState>,
    /// systemd's `NeedDaemonReload`: what it has loaded is older than the files on disk.
    pub need_daemon_reload: bool,
    /// The restart generation this machine carried out; `None` when it does not know (then no
    /// restart is ever guessed: a running unit is never restarted on a doubt).
    pub restarted: Option<u64>,
}

/// What a task does. Declaration order is execution order: every unload, then every load, then
/// one reload, then stops, then starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TaskKind {
    /// Stop the unit, await the stop, then uninstall its file.
    Unload,
    /// Write and link the desired file.
    Load,
    /// daemon-reload; global, at most one per plan.
    ReloadUnitFiles,
    Stop,
    Start,
    /// Stop then start a running unit, awaiting each job: `fleetctl restart`.
    Restart,
}

impl fmt::Display for TaskKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Unload => "unload",
            Self::Load => "load",
            Self::ReloadUnitFiles => "reload-unit-files",
            Self::Stop => "stop",
            Self::Start => "start",
            Self::Restart => "restart",
        })
    }
}

/// Why a task exists; ends up in the logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// A file is in the units directory but the unit is not scheduled here.
    NotScheduledHere,
    /// The file in the units directory is not the desired one.
    HashDiffers {
        current: UnitHash,
        desired: UnitHash,
    },
    /// The file in the units directory could not be read or parsed.
    FileUnparseable,
    /// Scheduled here, but there is no file yet.
    FileMissing,
    /// The file is there but not linked into systemd.
    NotLinked,
    /// systemd runs the unit although no file of ours defines it (its load state is
    /// `not-found`, or the unit comes from elsewhere): what runs is unknown, so restart it.
    RunningWithoutOurFile { active: ActiveState },
    /// A file was written for a unit systemd has loaded from something else.
    UnitFileChanged,
    /// A file was removed for a unit systemd has loaded.
    UnitFileRemoved,
    /// systemd reports `NeedDaemonReload`.
    NeedDaemonReload,
    /// The file is linked but systemd reports `not-found`.
    NotFoundBySystemd,
    /// The file was (re)loaded and the unit should run.
    LaunchAfterLoad,
    /// Desired launched; systemd's ActiveState, `active`, is not started.
    DesiredLaunched { active: ActiveState },
    /// Desired loaded; systemd's ActiveState, `active`, is started.
    DesiredLoaded { active: ActiveState },
    /// A restart was asked for (`fleetctl restart`): generation `wanted`, done `done`.
    RestartRequested { done: u64, wanted: u64 },
    /// `--no-restart`: the file differs; swap it and reload, leave the process running.
    ReplaceWithoutRestart {
        current: UnitHash,
        desired: UnitHash,
    },
}

/// How much a reason for the reload weighs: 0 for forgetting removed units (no start needs
/// it), 1 for files this plan writes (needed only if systemd still holds the old version once
/// they are written), 2 for a definition systemd holds stale whatever this plan writes.
pub fn reload_rank(reason: &Reason) -> u8 {
    match reason {
        Reason::UnitFileRemoved => 0,
        Reason::UnitFileChanged => 1,
        _ => 2,
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotScheduledHere => f.write_str("unit loaded but not scheduled here"),
            Self::HashDiffers { current, desired } => write!(
                f,
                "unit file hash {} differs from desired {}",
                current.short(),
                desired.short()
            ),
            Self::FileUnparseable => f.write_str("unit file in the units directory is unreadable"),
            Self::FileMissing => f.write_str("unit scheduled here but not loaded"),
            Self::NotLinked => f.write_str("unit file not linked into systemd"),
            Self::RunningWithoutOurFile { active } => {
                write!(f, "unit {active} in systemd without fleet's unit file")
            }
            Self::UnitFileChanged => f.write_str("unit file of a unit systemd has loaded changed"),
            Self::UnitFileRemoved => f.write_str("unit file of a unit systemd has loaded removed"),
            Self::NeedDaemonReload => f.write_str("systemd reports NeedDaemonReload"),
            Self::NotFoundBySystemd => {
                f.write_str("unit file linked but systemd reports not-found")
            }
            Self::LaunchAfterLoad => f.write_str("unit file loaded and desired state is launched"),
            Self::DesiredLaunched { active } => {
                write!(f, "unit {active} but desired state is launched")
            }
            Self::DesiredLoaded { active } => {
                write!(f, "unit {active} but desired state is loaded")
            }
            Self::RestartRequested { done, wanted } => {
                write!(f, "restart {wanted} requested, {done} done")
            }
            Self::ReplaceWithoutRestart { current, desired } => write!(
                f,
                "unit file hash {} replaced by {} without restart",
                current.short(),
                desired.short()
            ),
        }
    }
}

/// One step of a plan. For [`TaskKind::ReloadUnitFiles`], `unit` is the first unit (by name)
/// that needs the reload; the reload itself is global.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    pub kind: TaskKind,
    pub unit: UnitName,
    pub reason: Reason,
}

/// The tasks that take `current` to `desired`, sorted by [`TaskKind`] and, within a kind, by
/// unit name. Units in `backoff` get no task, and do not cause a reload.
pub fn plan(
    desired: &BTreeMap<UnitName, DesiredUnit>,
    current: &BTreeMap<UnitName, CurrentUnit>,
    backoff: &BTreeSet<UnitName>,
) -> Vec<Task> {
    let names: BTreeSet<&UnitName> = desired.keys().chain(current.keys()).collect();
    plan_names(desired, current, backoff, names)
}

/// The tasks of [`plan`] for the units of `names` alone: what a pass plans after a hint
/// that named them. Each unit's tasks depend on that unit alone; the plan's one reload is
/// named after the first of these units that needs it.
pub fn plan_of(
    desired: &BTreeMap<UnitName, DesiredUnit>,
    current: &BTreeMap<UnitName, CurrentUnit>,
    backoff: &BTreeSet<UnitName>,
    names: &BTreeSet<UnitName>,
) -> Vec<Task> {
    plan_names(desired, current, backoff, names)
}

fn plan_names<'a>(
    desired: &BTreeMap<UnitName, DesiredUnit>,
    current: &BTreeMap<UnitName, CurrentUnit>,
    backoff: &BTreeSet<UnitName>,
    names: impl IntoIterator<Item = &'a UnitName>,
) -> Vec<Task> {
    let mut plan = Plan::default();
    for name in names.into_iter().filter(|n| !backoff.contains(*n)) {
        let view = View::of(current.get(name));
        match desired.get(name) {
            Some(want) => plan.desired_unit(name, want, &view),
            None => plan.undesired_unit(name, &view),
        }
    }
    plan.finish()
}

/// The facts about one unit's current state the rules look at.
struct View {
    file: UnitFileState,
    active: ActiveState,
    /// [`ActiveState::is_started`]: up or on its way up.
    started: bool,
    /// systemd has a unit object with a definition, or a process, that the file on disk may
    /// not match: `load != not-found`, or anything started.
    holds: bool,
    not_found: bool,
    need_daemon_reload: bool,
    restarted: Option<u64>,
}

impl View {
    fn of(current: Option<&CurrentUnit>) -> View {
        let systemd = current.and_then(|c| c.systemd.as_ref());
        let active = systemd.map_or(ActiveState::Inactive, SystemdState::active_state);
        let started = active.is_started();
        let not_found = systemd.is_none_or(|s| s.load_state() == LoadState::NotFound);
        View {
            file: current.map_or(UnitFileState::Absent, |c| c.file),
            active,
            started,
            holds: !not_found || started,
            not_found,
            need_daemon_reload: current.is_some_and(|c| c.need_daemon_reload),
            restarted: current.and_then(|c| c.restarted),
        }
    }
}

#[derive(Default)]
struct Plan {
    tasks: Vec<Task>,
    reload: Option<Task>,
}

impl Plan {
    fn push(&mut self, kind: TaskKind, unit: &UnitName, reason: Reason) {
        self.tasks.push(Task {
            kind,
            unit: unit.clone(),
            reason,
        });
    }

    /// The plan's one reload is named after the first unit that needs it for the weightiest
    /// reason ([`reload_rank`]): the executor holds starts back only for a reload that a start
    /// may need, and checks whether files written this pass left systemd anything stale.
    fn need_reload(&mut self, unit: &UnitName, reason: Reason) {
        let task = Task {
            kind: TaskKind::ReloadUnitFiles,
            unit: unit.clone(),
            reason,
        };
        match &self.reload {
            Some(r) if reload_rank(&r.reason) >= reload_rank(&task.reason) => {}
            Some(_) | None => self.reload = Some(task),
        }
    }

    fn undesired_unit(&mut self, name: &UnitName, view: &View) {
        match view.file {
            // Not ours: fleet only removes what is in its units directory.
            UnitFileState::Absent => {}
            UnitFileState::Unparseable | UnitFileState::Present { .. } => {
                self.push(TaskKind::Unload, name, Reason::NotScheduledHere);
                if view.holds {
                    self.need_reload(name, Reason::UnitFileRemoved);
                }
            }
        }
    }

    fn desired_unit(&mut self, name: &UnitName, want: &DesiredUnit, view: &View) {
        match view.file {
            UnitFileState::Present { hash, linked } if hash == want.hash => {
                self.same_file(name, want, view, linked);
            }
            UnitFileState::Present { hash, linked }
                if want.no_restart && linked && view.started && !view.not_found =>
            {
                // The new file goes in place and systemd reloads it; the running process is
                // left alone and picks the new version up at its next restart.
                let reason = Reason::ReplaceWithoutRestart {
                    current: hash,
                    desired: want.hash,
                };
                self.push(TaskKind::Load, name, reason);
                self.need_reload(name, Reason::UnitFileChanged);
            }
            UnitFileState::Present { hash, .. } => {
                let reason = Reason::HashDiffers {
                    current: hash,
                    desired: want.hash,
                };
                self.replace(name, want, view, reason);
            }
            UnitFileState::Unparseable => self.replace(name, want, view, Reason::FileUnparseable),
            UnitFileState::Absent if view.started => {
                let active = view.active.clone();
                self.replace(name, want, view, Reason::RunningWithoutOurFile { active });
            }
            UnitFileState::Absent => {
                self.push(TaskKind::Load, name, Reason::FileMissing);
                // A unit systemd never loaded loads on demand; one it holds from elsewhere
                // keeps that definition until a reload.
                if view.holds || view.need_daemon_reload {
                    self.need_reload(name, Reason::UnitFileChanged);
                }
                self.start_after_load(name, want);
            }
        }
    }

    /// Stop what runs, swap the file, reload if systemd held the old definition, start again.
    fn replace(&mut self, name: &UnitName, want: &DesiredUnit, view: &View, reason: Reason) {
        self.push(TaskKind::Unload, name, reason.clone());
        self.push(TaskKind::Load, name, reason);
        if view.holds {
            self.need_reload(name, Reason::UnitFileChanged);
        }
        self.start_after_load(name, want);
    }

    fn start_after_load(&mut self, name: &UnitName, want: &DesiredUnit) {
        match want.target {
            Target::Launched => self.push(TaskKind::Start, name, Reason::LaunchAfterLoad),
            Target::Loaded => {}
        }
    }

    fn same_file(&mut self, name: &UnitName, want: &DesiredUnit, view: &View, linked: bool) {
        if view.not_found && view.started {
            let active = view.active.clone();
            return self.replace(name, want, view, Reason::RunningWithoutOurFile { active });
        }
        if !linked {
            if view.holds {
                // systemd's definition came from somewhere else: restart on ours.
                return self.replace(name, want, view, Reason::NotLinked);
            }
            self.push(TaskKind::Load, name, Reason::NotLinked);
            return self.start_after_load(name, want);
        }
        if view.not_found {
            self.need_reload(name, Reason::NotFoundBySystemd);
        } else if view.need_daemon_reload {
            self.need_reload(name, Reason::NeedDaemonReload);
        }
        match (want.target, view.started) {
            (Target::Launched, false) => {
                let active = view.active.clone();
                self.push(TaskKind::Start, name, Reason::DesiredLaunched { active });
            }
            (Target::Loaded, true) => {
                let active = view.active.clone();
                self.push(TaskKind::Stop, name, Reason::DesiredLoaded { active });
            }
            (Target::Launched, true) => match view.restarted {
                Some(done) if done < want.restart => {
                    let reason = Reason::RestartRequested {
                        done,
                        wanted: want.restart,
                    };
                    self.push(TaskKind::Restart, name, reason);
                }
                // Adoption: the file and the state already match; leave the unit alone.
                Some(_) | None => {}
            },
            (Target::Loaded, false) => {}
        }
    }

    fn finish(mut self) -> Vec<Task> {
        self.tasks.extend(self.reload);
        // Stable: within a kind, tasks keep the name order they were generated in.
        self.tasks.sort_by_key(|t| t.kind);
        self.tasks
    }
}

#[cfg(test)]
mod tests;
