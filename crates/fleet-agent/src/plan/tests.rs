use super::*;
use proptest::prelude::*;

fn name(s: &str) -> UnitName {
    s.parse().unwrap()
}

fn hash(n: u8) -> UnitHash {
    UnitHash::of_bytes(&[n])
}

fn state(load: &str, active: &str) -> Option<SystemdState> {
    let sub = match active {
        "active" => "running",
        "failed" => "failed",
        "activating" => "start",
        "deactivating" => "stop",
        _ => "dead",
    };
    Some(SystemdState {
        load: load.to_owned(),
        active: active.to_owned(),
        sub: sub.to_owned(),
    })
}

fn linked(n: u8) -> UnitFileState {
    UnitFileState::Present {
        hash: hash(n),
        linked: true,
    }
}

fn current(file: UnitFileState, systemd: Option<SystemdState>) -> CurrentUnit {
    CurrentUnit {
        file,
        systemd,
        need_daemon_reload: false,
        restarted: None,
    }
}

fn want(n: u8, target: Target) -> DesiredUnit {
    DesiredUnit {
        hash: hash(n),
        target,
        restart: 0,
        no_restart: false,
    }
}

fn plan_one(desired: Option<DesiredUnit>, current: Option<CurrentUnit>) -> Vec<(TaskKind, Reason)> {
    let unit = name("a.service");
    let desired = desired.map(|d| (unit.clone(), d)).into_iter().collect();
    let current = current.map(|c| (unit.clone(), c)).into_iter().collect();
    plan(&desired, &current, &BTreeSet::new())
        .into_iter()
        .map(|t| {
            assert_eq!(t.unit, unit);
            (t.kind, t.reason)
        })
        .collect()
}

fn kinds(tasks: &[(TaskKind, Reason)]) -> Vec<TaskKind> {
    tasks.iter().map(|(k, _)| *k).collect()
}

use TaskKind::{Load, ReloadUnitFiles, Start, Stop, Unload};

#[test]
fn adopts_running_unit_with_same_hash_without_any_task() {
    let tasks = plan_one(
        Some(want(1, Target::Launched)),
        Some(current(linked(1), state("loaded", "active"))),
    );
    assert_eq!(tasks, vec![]);
}

#[test]
fn adopts_activating_and_reloading_units_as_launched() {
    for active in ["activating", "reloading"] {
        let tasks = plan_one(
            Some(want(1, Target::Launched)),
            Some(current(linked(1), state("loaded", active))),
        );
        assert_eq!(tasks, vec![], "{active}");
    }
}

#[test]
fn adopts_stopped_unit_desired_loaded_without_any_task() {
    for active in ["inactive", "failed", "deactivating"] {
        let tasks = plan_one(
            Some(want(1, Target::Loaded)),
            Some(current(linked(1), state("loaded", active))),
        );
        assert_eq!(tasks, vec![], "{active}");
    }
}

#[test]
fn loads_and_starts_unit_without_file_and_without_reload() {
    let tasks = plan_one(
        Some(want(1, Target::Launched)),
        Some(current(
            UnitFileState::Absent,
            state("not-found", "inactive"),
        )),
    );
    assert_eq!(
        tasks,
        vec![
            (Load, Reason::FileMissing),
            (Start, Reason::LaunchAfterLoad)
        ]
    );
}

#[test]
fn loads_unit_missing_from_the_current_map() {
    let tasks = plan_one(Some(want(1, Target::Loaded)), None);
    assert_eq!(tasks, vec![(Load, Reason::FileMissing)]);
}

#[test]
fn reloads_when_systemd_still_holds_an_older_definition() {
    let tasks = plan_one(
        Some(want(1, Target::Launched)),
        Some(current(UnitFileState::Absent, state("loaded", "inactive"))),
    );
    assert_eq!(
        tasks,
        vec![
            (Load, Reason::FileMissing),
            (ReloadUnitFiles, Reason::UnitFileChanged),
            (Start, Reason::LaunchAfterLoad),
        ]
    );
}

#[test]
fn unloads_then_loads_when_hash_differs() {
    let tasks = plan_one(
        Some(want(2, Target::Launched)),
        Some(current(linked(1), state("loaded", "active"))),
    );
    let differs = Reason::HashDiffers {
        current: hash(1),
        desired: hash(2),
    };
    assert_eq!(
        tasks,
        vec![
            (Unload, differs.clone()),
            (Load, differs),
            (ReloadUnitFiles, Reason::UnitFileChanged),
            (Start, Reason::LaunchAfterLoad),
        ]
    );
}

#[test]
fn replaces_loaded_unit_without_starting_it() {
    let tasks = plan_one(
        Some(want(2, Target::Loaded)),
        Some(current(linked(1), state("loaded", "inactive"))),
    );
    assert_eq!(kinds(&tasks), vec![Unload, Load, ReloadUnitFiles]);
}

#[test]
fn replaces_without_reload_when_systemd_never_loaded_the_old_file() {
    let tasks = plan_one(
        Some(want(2, Target::Launched)),
        Some(current(linked(1), state("not-found", "inactive"))),
    );
    assert_eq!(kinds(&tasks), vec![Unload, Load, Start]);
}

#[test]
fn replaces_unparseable_file() {
    let tasks = plan_one(
        Some(want(1, Target::Launched)),
        Some(current(
            UnitFileState::Unparseable,
            state("loaded", "failed"),
        )),
    );
    assert_eq!(
        tasks,
        vec![
            (Unload, Reason::FileUnparseable),
            (Load, Reason::FileUnparseable),
            (ReloadUnitFiles, Reason::UnitFileChanged),
            (Start, Reason::LaunchAfterLoad),
        ]
    );
}

#[test]
fn removes_unit_not_scheduled_here() {
    let tasks = plan_one(None, Some(current(linked(1), state("loaded", "active"))));
    assert_eq!(
        tasks,
        vec![
            (Unload, Reason::NotScheduledHere),
            (ReloadUnitFiles, Reason::UnitFileRemoved),
        ]
    );
}

#[test]
fn removes_unparseable_file_not_scheduled_here() {
    let tasks = plan_one(
        None,
        Some(current(
            UnitFileState::Unparseable,
            state("not-found", "inactive"),
        )),
    );
    assert_eq!(tasks, vec![(Unload, Reason::NotScheduledHere)]);
}

#[test]
fn leaves_units_without_a_file_of_ours_alone() {
    let tasks = plan_one(
        None,
        Some(current(UnitFileState::Absent, state("loaded", "active"))),
    );
    assert_eq!(tasks, vec![]);
}

#[test]
fn starts_stopped_unit_desired_launched() {
    for active in ["inactive", "failed", "deactivating"] {
        let tasks = plan_one(
            Some(want(1, Target::Launched)),
            Some(current(linked(1), state("loaded", active))),
        );
        let reason = Reason::DesiredLaunched {
            active: fleet_core::ActiveState::parse(active),
        };
        assert_eq!(tasks, vec![(Start, reason)]);
    }
}

#[test]
fn stops_running_unit_desired_loaded() {
    let tasks = plan_one(
        Some(want(1, Target::Loaded)),
        Some(current(linked(1), state("loaded", "active"))),
    );
    let reason = Reason::DesiredLoaded {
        active: fleet_core::ActiveState::parse("active"),
    };
    assert_eq!(tasks, vec![(Stop, reason)]);
}

#[test]
fn reloads_same_file_when_systemd_needs_it_without_touching_the_process() {
    let mut unit = current(linked(1), state("loaded", "active"));
    unit.need_daemon_reload = true;
    let tasks = plan_one(Some(want(1, Target::Launched)), Some(unit));
    assert_eq!(tasks, vec![(ReloadUnitFiles, Reason::NeedDaemonReload)]);
}

#[test]
fn relinks_file_that_is_not_linked() {
    let file = UnitFileState::Present {
        hash: hash(1),
        linked: false,
    };
    let tasks = plan_one(
        Some(want(1, Target::Launched)),
        Some(current(file, state("not-found", "inactive"))),
    );
    assert_eq!(
        tasks,
        vec![(Load, Reason::NotLinked), (Start, Reason::LaunchAfterLoad)]
    );
}

#[test]
fn restarts_unlinked_unit_that_systemd_runs_from_elsewhere() {
    let file = UnitFileState::Present {
        hash: hash(1),
        linked: false,
    };
    let tasks = plan_one(
        Some(want(1, Target::Launched)),
        Some(current(file, state("loaded", "active"))),
    );
    assert_eq!(kinds(&tasks), vec![Unload, Load, ReloadUnitFiles, Start]);
    assert_eq!(tasks[0].1, Reason::NotLinked);
}

#[test]
fn reloads_linked_file_that_systemd_reports_not_found() {
    let tasks = plan_one(
        Some(want(1, Target::Launched)),
        Some(current(linked(1), state("not-found", "inactive"))),
    );
    let start = Reason::DesiredLaunched {
        active: fleet_core::ActiveState::parse("inactive"),
    };
    assert_eq!(
        tasks,
        vec![(ReloadUnitFiles, Reason::NotFoundBySystemd), (Start, start)]
    );
}

#[test]
fn restarts_unit_systemd_runs_without_our_file() {
    let running = Reason::RunningWithoutOurFile {
        active: fleet_core::ActiveState::parse("active"),
    };
    let tasks = plan_one(
        Some(want(1, Target::Launched)),
        Some(current(UnitFileState::Absent, state("not-found", "active"))),
    );
    assert_eq!(
        tasks,
        vec![
            (Unload, running.clone()),
            (Load, running),
            (ReloadUnitFiles, Reason::UnitFileChanged),
            (Start, Reason::LaunchAfterLoad),
        ]
    );
}

#[test]
fn restarts_unit_running_although_systemd_lost_its_file() {
    let tasks = plan_one(
        Some(want(1, Target::Launched)),
        Some(current(linked(1), state("not-found", "active"))),
    );
    assert_eq!(kinds(&tasks), vec![Unload, Load, ReloadUnitFiles, Start]);
}

#[test]
fn skips_units_in_backoff_and_their_reloads() {
    let a = name("a.service");
    let b = name("b.service");
    let desired = [(a.clone(), want(2, Target::Launched))].into();
    let current = [
        (a.clone(), current(linked(1), state("loaded", "active"))),
        (b.clone(), current(linked(1), state("loaded", "active"))),
    ]
    .into();
    let backoff = [a.clone()].into();
    let tasks = plan(&desired, &current, &backoff);
    assert_eq!(
        tasks,
        vec![
            Task {
                kind: Unload,
                unit: b.clone(),
                reason: Reason::NotScheduledHere
            },
            Task {
                kind: ReloadUnitFiles,
                unit: b,
                reason: Reason::UnitFileRemoved
            },
        ]
    );
    let all = [a.clone()].into_iter().chain([name("b.service")]).collect();
    assert_eq!(plan(&desired, &BTreeMap::new(), &all), vec![]);
}

#[test]
fn plans_one_reload_for_many_units_named_after_the_first() {
    let desired = (0..5)
        .map(|i| (name(&format!("u{i}.service")), want(2, Target::Launched)))
        .collect();
    let current = (0..5)
        .map(|i| {
            let unit = current(linked(1), state("loaded", "active"));
            (name(&format!("u{i}.service")), unit)
        })
        .collect();
    let tasks = plan(&desired, &current, &BTreeSet::new());
    let reloads: Vec<_> = tasks.iter().filter(|t| t.kind == ReloadUnitFiles).collect();
    assert_eq!(reloads.len(), 1);
    assert_eq!(reloads[0].unit, name("u0.service"));
    let order: Vec<_> = tasks.iter().map(|t| (t.kind, t.unit.to_string())).collect();
    assert_eq!(order[0], (Unload, "u0.service".to_owned()));
    assert_eq!(order[4], (Unload, "u4.service".to_owned()));
    assert_eq!(order[5], (Load, "u0.service".to_owned()));
    assert_eq!(order[10], (ReloadUnitFiles, "u0.service".to_owned()));
    assert_eq!(order[11], (Start, "u0.service".to_owned()));
    assert_eq!(tasks.len(), 16);
}

#[test]
fn reasons_read_like_fleets_log_lines() {
    assert_eq!(
        Reason::NotScheduledHere.to_string(),
        "unit loaded but not scheduled here"
    );
    assert_eq!(
        Reason::FileMissing.to_string(),
        "unit scheduled here but not loaded"
    );
    let differs = Reason::HashDiffers {
        current: hash(1),
        desired: hash(2),
    };
    let text = differs.to_string();
    assert!(
        text.contains(&hash(1).short()) && text.contains(&hash(2).short()),
        "{text}"
    );
    let launched = Reason::DesiredLaunched {
        active: fleet_core::ActiveState::parse("failed"),
    };
    assert_eq!(
        launched.to_string(),
        "unit failed but desired state is launched"
    );
}

#[test]
fn maps_desired_states_to_targets() {
    assert_eq!(Target::from_desired(DesiredState::Inactive), None);
    assert_eq!(
        Target::from_desired(DesiredState::Loaded),
        Some(Target::Loaded)
    );
    assert_eq!(
        Target::from_desired(DesiredState::Launched),
        Some(Target::Launched)
    );
}

mod sim;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn converges_in_one_pass(world in sim::world()) {
        world.check_converges_in_one_pass();
    }

    #[test]
    fn tasks_are_sorted_by_kind_with_at_most_one_reload(world in sim::world()) {
        let tasks = world.plan();
        prop_assert!(tasks.windows(2).all(|w| w[0].kind <= w[1].kind));
        let reloads = tasks.iter().filter(|t| t.kind == ReloadUnitFiles).count();
        prop_assert!(reloads <= 1);
    }

    #[test]
    fn a_plan_of_some_units_is_the_plan_of_a_world_of_only_them(world in sim::world()) {
        let (scoped, alone) = world.plans_of(&world.some_names());
        prop_assert_eq!(scoped, alone);
    }

    #[test]
    fn never_plans_a_task_for_a_unit_in_backoff(world in sim::world()) {
        for task in world.plan() {
            prop_assert!(!world.backoff.contains(&task.unit), "{task:?}");
        }
    }

    #[test]
    fn never_touches_an_adopted_unit(world in sim::world()) {
        let tasks = world.plan();
        for name in world.adoptable() {
            let touched: Vec<_> = tasks.iter().filter(|t| t.unit == name).collect();
            prop_assert!(touched.is_empty(), "{name}: {touched:?}");
        }
    }

    #[test]
    fn plans_each_unit_kind_at_most_once(world in sim::world()) {
        let tasks = world.plan();
        let mut seen = BTreeSet::new();
        for task in tasks.iter().filter(|t| t.kind != ReloadUnitFiles) {
            prop_assert!(seen.insert((task.kind, task.unit.clone())), "{task:?} twice");
        }
    }

    #[test]
    fn never_stops_and_starts_the_same_unit_in_one_plan(world in sim::world()) {
        let tasks = world.plan();
        for stop in tasks.iter().filter(|t| t.kind == Stop) {
            prop_assert!(!tasks.iter().any(|t| t.kind == Start && t.unit == stop.unit));
        }
    }
}

#[test]
fn restarts_running_unit_once_a_newer_generation_is_asked_for() {
    let mut want = want(1, Target::Launched);
    want.restart = 2;
    let mut now = current(linked(1), state("loaded", "active"));
    now.restarted = Some(1);
    let tasks = plan_one(Some(want), Some(now.clone()));
    assert_eq!(
        tasks,
        vec![(
            TaskKind::Restart,
            Reason::RestartRequested { done: 1, wanted: 2 }
        )]
    );
    now.restarted = Some(2);
    assert_eq!(plan_one(Some(want), Some(now)), vec![], "done already");
}

#[test]
fn never_restarts_on_a_guess_when_the_done_generation_is_unknown() {
    let mut want = want(1, Target::Launched);
    want.restart = 5;
    let tasks = plan_one(
        Some(want),
        Some(current(linked(1), state("loaded", "active"))),
    );
    assert_eq!(tasks, vec![]);
}

#[test]
fn a_stopped_unit_with_a_restart_pending_is_simply_started() {
    let mut want = want(1, Target::Launched);
    want.restart = 3;
    let mut now = current(linked(1), state("loaded", "inactive"));
    now.restarted = Some(1);
    assert_eq!(kinds(&plan_one(Some(want), Some(now))), vec![Start]);
}

#[test]
fn swaps_the_file_of_a_running_unit_without_restarting_it_when_asked() {
    let mut want = want(2, Target::Launched);
    want.no_restart = true;
    let tasks = plan_one(
        Some(want),
        Some(current(linked(1), state("loaded", "active"))),
    );
    assert_eq!(kinds(&tasks), vec![Load, ReloadUnitFiles]);
    assert_eq!(
        tasks[0].1,
        Reason::ReplaceWithoutRestart {
            current: hash(1),
            desired: hash(2)
        }
    );
}

#[test]
fn a_stopped_unit_is_replaced_normally_even_with_no_restart() {
    let mut want = want(2, Target::Launched);
    want.no_restart = true;
    let tasks = plan_one(
        Some(want),
        Some(current(linked(1), state("loaded", "inactive"))),
    );
    assert_eq!(kinds(&tasks), vec![Unload, Load, ReloadUnitFiles, Start]);
}
