use super::*;
use crate::manager::Change;
use crate::plan::{CurrentUnit, DesiredUnit, Target, Task, TaskKind, UnitFileState, plan};
use std::collections::BTreeSet;

fn name(s: &str) -> UnitName {
    s.parse().unwrap()
}

fn unit(exec: &str) -> UnitFile {
    UnitFile::parse(format!("[Service]\nExecStart={exec}\n").as_bytes()).unwrap()
}

/// A minimal executor following the contract in `manager`'s docs, to drive the fake with
/// real plans the way the agent's loop will.
async fn converge(fake: &FakeManager, desired: &[(&UnitName, &UnitFile, Target)]) -> Vec<Task> {
    let installed = fake.installed().await.unwrap();
    let mut names: BTreeSet<UnitName> = installed.iter().map(|u| u.name.clone()).collect();
    names.extend(desired.iter().map(|(n, _, _)| (*n).clone()));
    let names: Vec<UnitName> = names.into_iter().collect();
    let status = fake.status(&names).await.unwrap();
    let mut current = BTreeMap::new();
    for name in &names {
        let file = match installed.iter().find(|u| &u.name == name) {
            None => UnitFileState::Absent,
            Some(InstalledUnit {
                content: Ok(hash),
                linked,
                ..
            }) => UnitFileState::Present {
                hash: *hash,
                linked: *linked,
            },
            Some(_) => UnitFileState::Unparseable,
        };
        let need_daemon_reload = fake.details(name).await.unwrap().need_daemon_reload;
        let systemd = status.get(name).cloned();
        let unit = CurrentUnit {
            file,
            systemd,
            need_daemon_reload,
            restarted: None,
        };
        current.insert(name.clone(), unit);
    }
    let wanted = desired
        .iter()
        .map(|(n, f, target)| {
            let unit = DesiredUnit {
                hash: f.hash(),
                target: *target,
                restart: 0,
                no_restart: false,
            };
            ((*n).clone(), unit)
        })
        .collect();
    let tasks = plan(&wanted, &current, &BTreeSet::new());
    for task in &tasks {
        let unit = &task.unit;
        match task.kind {
            TaskKind::Unload => {
                assert!(fake.stop(unit).await.unwrap().is_success());
                fake.uninstall(unit).await.unwrap();
            }
            TaskKind::Load => {
                let (_, file, _) = desired.iter().find(|(n, _, _)| *n == unit).unwrap();
                fake.install(unit, file).await.unwrap();
            }
            TaskKind::ReloadUnitFiles => fake.reload().await.unwrap(),
            TaskKind::Stop => assert!(fake.stop(unit).await.unwrap().is_success()),
            TaskKind::Start => assert!(fake.start(unit).await.unwrap().is_success()),
            TaskKind::Restart => {
                assert!(fake.stop(unit).await.unwrap().is_success());
                assert!(fake.start(unit).await.unwrap().is_success());
            }
        }
    }
    tasks
}

fn position(calls: &[Call], wanted: &Call) -> usize {
    calls
        .iter()
        .position(|c| c == wanted)
        .unwrap_or_else(|| panic!("{wanted:?} not in {calls:?}"))
}

#[tokio::test]
async fn keeps_running_unit_when_agent_restarts() {
    let fake = FakeManager::new();
    let a = name("a.service");
    let file = unit("/bin/sleep 1000");
    fake.put_unit(&a, &file, true);
    let pid = fake.main_pid(&a);
    let tasks = converge(&fake, &[(&a, &file, Target::Launched)]).await;
    assert_eq!(tasks, vec![]);
    assert_eq!(fake.main_pid(&a), pid);
    assert_eq!(fake.running_hash(&a), Some(file.hash()));
    let touching: Vec<Call> = fake
        .calls()
        .into_iter()
        .filter(|c| !matches!(c, Call::Installed | Call::Status(_) | Call::Details(_)))
        .collect();
    assert_eq!(touching, vec![]);
}

#[tokio::test]
async fn replaced_unit_runs_the_new_file_after_the_old_one_stopped() {
    let fake = FakeManager::new();
    let a = name("a.service");
    let (old, new) = (unit("/bin/old"), unit("/bin/new"));
    fake.put_unit(&a, &old, true);
    converge(&fake, &[(&a, &new, Target::Launched)]).await;
    assert_eq!(fake.running_hash(&a), Some(new.hash()));
    let calls = fake.calls();
    let stop = position(&calls, &Call::Stop(a.clone()));
    let uninstall = position(&calls, &Call::Uninstall(a.clone()));
    let install = position(&calls, &Call::Install(a.clone(), new.hash()));
    let reload = position(&calls, &Call::Reload);
    let start = position(&calls, &Call::Start(a.clone()));
    assert!(stop < uninstall && uninstall < install && install < reload && reload < start);
    assert_eq!(
        converge(&fake, &[(&a, &new, Target::Launched)]).await,
        vec![]
    );
}

#[tokio::test]
async fn loads_and_starts_a_new_unit_without_reloading_systemd() {
    let fake = FakeManager::new();
    let a = name("a.service");
    let file = unit("/bin/true");
    converge(&fake, &[(&a, &file, Target::Launched)]).await;
    assert!(!fake.calls().contains(&Call::Reload));
    assert_eq!(fake.running_hash(&a), Some(file.hash()));
    assert!(fake.is_linked(&a));
    assert_eq!(
        fake.file("a.service").unwrap(),
        file.canonical().into_bytes()
    );
}

#[tokio::test]
async fn removes_units_not_scheduled_here_and_leaves_foreign_files() {
    let fake = FakeManager::new();
    let b = name("b.service");
    fake.put_unit(&b, &unit("/bin/b"), true);
    fake.put_file("README", "not a unit");
    converge(&fake, &[]).await;
    assert_eq!(fake.file_names(), vec!["README".to_owned()]);
    assert!(!fake.is_linked(&b));
    assert_eq!(fake.state(&b).active, "inactive");
    assert_eq!(converge(&fake, &[]).await, vec![]);
}

#[tokio::test]
async fn stops_and_starts_to_match_the_target() {
    let fake = FakeManager::new();
    let a = name("a.service");
    let file = unit("/bin/a");
    fake.put_unit(&a, &file, true);
    converge(&fake, &[(&a, &file, Target::Loaded)]).await;
    assert_eq!(fake.state(&a).active, "inactive");
    assert!(fake.is_linked(&a));
    fake.set_active(&a, "failed", "failed");
    converge(&fake, &[(&a, &file, Target::Launched)]).await;
    assert_eq!(fake.state(&a).active, "active");
}

#[tokio::test]
async fn starting_a_changed_unit_without_reload_runs_the_stale_file() {
    let fake = FakeManager::new();
    let a = name("a.service");
    let (old, new) = (unit("/bin/old"), unit("/bin/new"));
    fake.put_unit(&a, &old, false);
    fake.install(&a, &new).await.unwrap();
    assert!(fake.details(&a).await.unwrap().need_daemon_reload);
    fake.start(&a).await.unwrap();
    assert_eq!(fake.running_hash(&a), Some(old.hash()));
    fake.stop(&a).await.unwrap();
    fake.reload().await.unwrap();
    assert!(!fake.details(&a).await.unwrap().need_daemon_reload);
    fake.start(&a).await.unwrap();
    assert_eq!(fake.running_hash(&a), Some(new.hash()));
}

#[tokio::test]
async fn reports_unparseable_files_and_skips_names_that_are_not_units() {
    let fake = FakeManager::new();
    fake.put_file("bad.service", "[Service] garbage\n");
    fake.put_file("notes.txt", "[Service]\nExecStart=/bin/true\n");
    fake.put_file("good.service", "[Service]\nExecStart=/bin/true\n");
    let installed = fake.installed().await.unwrap();
    let names: Vec<String> = installed.iter().map(|u| u.name.to_string()).collect();
    assert_eq!(names, ["bad.service", "good.service"]);
    assert!(matches!(installed[0].content, Err(UnitFileError::Parse(_))));
    assert_eq!(
        *installed[1].content.as_ref().unwrap(),
        unit("/bin/true").hash()
    );
    assert!(!installed[1].linked);
}

#[tokio::test]
async fn stopping_a_unit_systemd_does_not_have_is_not_loaded() {
    let fake = FakeManager::new();
    let a = name("a.service");
    assert_eq!(fake.stop(&a).await.unwrap(), JobOutcome::NotLoaded);
}

#[tokio::test]
async fn starting_a_unit_without_a_file_fails_with_no_such_unit() {
    let fake = FakeManager::new();
    let err = fake.start(&name("a.service")).await.unwrap_err();
    let ManagerError::QueueJob { source, .. } = err else {
        panic!("unexpected {err:?}");
    };
    assert!(source.is_no_such_unit());
}

#[tokio::test]
async fn injected_failures_hit_only_their_operation_and_unit() {
    let fake = FakeManager::new();
    let (a, b) = (name("a.service"), name("b.service"));
    fake.install(&a, &unit("/bin/a")).await.unwrap();
    fake.install(&b, &unit("/bin/b")).await.unwrap();
    fake.fail(Op::Start, Some(&a));
    assert!(matches!(
        fake.start(&a).await,
        Err(ManagerError::QueueJob {
            kind: JobKind::Start,
            ..
        })
    ));
    assert_eq!(fake.start(&b).await.unwrap(), JobOutcome::Done);
    // Stop is another operation; a linked unit loads on demand, so there is a job to run.
    assert_eq!(fake.stop(&a).await.unwrap(), JobOutcome::Done);
    fake.heal();
    assert_eq!(fake.start(&a).await.unwrap(), JobOutcome::Done);
}

#[tokio::test]
async fn failures_injected_a_number_of_times_wear_off() {
    let fake = FakeManager::new();
    fake.fail_times(Op::Reload, None, 2);
    assert!(matches!(fake.reload().await, Err(ManagerError::Reload(_))));
    assert!(matches!(fake.reload().await, Err(ManagerError::Reload(_))));
    fake.reload().await.unwrap();
    assert_eq!(fake.calls(), vec![Call::Reload, Call::Reload, Call::Reload]);
}

#[tokio::test]
async fn failed_install_leaves_no_file() {
    let fake = FakeManager::new();
    let a = name("a.service");
    fake.fail(Op::Install, None);
    assert!(matches!(
        fake.install(&a, &unit("/bin/a")).await,
        Err(ManagerError::Link { .. })
    ));
    assert_eq!(fake.file_names(), Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn a_job_that_never_ends_times_out() {
    let fake = FakeManager::new().with_job_timeout(Duration::from_secs(30));
    let a = name("a.service");
    fake.install(&a, &unit("/bin/a")).await.unwrap();
    fake.set_job(JobKind::Start, &a, FakeJob::NeverEnds);
    let started = tokio::time::Instant::now();
    let err = fake.start(&a).await.unwrap_err();
    assert!(
        matches!(err, ManagerError::JobTimeout { waited, .. } if waited == Duration::from_secs(30))
    );
    assert_eq!(started.elapsed(), Duration::from_secs(30));
    fake.clear_job(JobKind::Start, &a);
    assert_eq!(fake.start(&a).await.unwrap(), JobOutcome::Done);
}

#[tokio::test]
async fn a_failing_start_leaves_the_unit_failed() {
    let fake = FakeManager::new();
    let a = name("a.service");
    fake.install(&a, &unit("/bin/false")).await.unwrap();
    fake.set_job(JobKind::Start, &a, FakeJob::Ends(JobOutcome::Failed));
    assert_eq!(fake.start(&a).await.unwrap(), JobOutcome::Failed);
    assert_eq!(fake.state(&a).active, "failed");
    fake.uninstall(&a).await.unwrap();
    assert_eq!(fake.state(&a).active, "inactive");
}

#[tokio::test]
async fn hints_units_after_jobs_and_a_resync_after_reload() {
    let fake = FakeManager::new();
    let mut changes = fake.changes();
    assert_eq!(changes.try_recv(), Some(Change::Resync));
    let a = name("a.service");
    fake.install(&a, &unit("/bin/a")).await.unwrap();
    assert_eq!(changes.try_recv(), None);
    fake.start(&a).await.unwrap();
    assert_eq!(
        changes.recv().await,
        Some(Change::Units([a.clone()].into()))
    );
    fake.set_active(&a, "failed", "failed");
    assert_eq!(
        changes.recv().await,
        Some(Change::Units([a.clone()].into()))
    );
    fake.reload().await.unwrap();
    assert_eq!(changes.recv().await, Some(Change::Resync));
    drop(fake);
    assert_eq!(changes.recv().await, None);
}

#[tokio::test]
async fn details_describe_the_loaded_unit() {
    let fake = FakeManager::new();
    let a = name("a.service");
    fake.put_unit(&a, &unit("/bin/a"), true);
    fake.set_drop_ins(&a, vec!["/run/systemd/system/a.service.d/x.conf".into()]);
    let details = fake.details(&a).await.unwrap();
    assert_eq!(details.state.active, "active");
    assert_eq!(
        details.fragment_path,
        Some(PathBuf::from("/run/systemd/system/a.service"))
    );
    assert_eq!(details.drop_in_paths.len(), 1);
    assert!(details.main_pid.is_some());
    assert!(details.invocation_id.is_some());
    assert!(!details.need_daemon_reload);
}

#[tokio::test]
async fn restarts_a_foreign_unit_of_the_same_name_on_fleets_file() {
    let fake = FakeManager::new();
    let a = name("a.service");
    fake.put_foreign_unit(&a, "active", "running");
    let file = unit("/bin/ours");
    converge(&fake, &[(&a, &file, Target::Launched)]).await;
    assert_eq!(fake.running_hash(&a), Some(file.hash()));
    let calls = fake.calls();
    assert!(position(&calls, &Call::Stop(a.clone())) < position(&calls, &Call::Reload));
}
