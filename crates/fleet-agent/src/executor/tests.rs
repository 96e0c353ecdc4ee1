use super::*;
use crate::fake::{Call, FakeJob, FakeManager};
use crate::manager::JobKind;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing_subscriber::layer::SubscriberExt;

fn name(s: &str) -> UnitName {
    s.parse().unwrap()
}

/// The message, level and fields of each event at info or above.
#[derive(Debug, Clone, Default)]
struct Lines(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Lines {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Text(String);
        impl tracing::field::Visit for Text {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn fmt::Debug) {
                self.0.push_str(&format!(" {}={v:?}", f.name()));
            }
        }
        if *event.metadata().level() > tracing::Level::INFO {
            return;
        }
        let mut text = Text(event.metadata().level().to_string());
        event.record(&mut text);
        self.0.lock().unwrap().push(text.0);
    }
}

/// Loads and starts `unit` (its start ending `start`), returning the run and its log.
async fn load_and_start(unit: &str, start: JobOutcome) -> (Outcome, Vec<String>) {
    let fake = FakeManager::new();
    let unit = name(unit);
    fake.set_job(JobKind::Start, &unit, FakeJob::Ends(start));
    let file = UnitFile::parse(b"[Service]\nExecStart=/bin/false\n").unwrap();
    let hashes = BTreeMap::from([(unit.clone(), file.hash())]);
    let files = BTreeMap::from([(file.hash(), file)]);
    let task = |kind, reason| Task {
        kind,
        unit: unit.clone(),
        reason,
    };
    let tasks = vec![
        task(TaskKind::Load, Reason::FileMissing),
        // A reload that is run whatever the files (a new unit's own needs none).
        task(TaskKind::ReloadUnitFiles, Reason::NeedDaemonReload),
        task(TaskKind::Start, Reason::LaunchAfterLoad),
    ];
    let lines = Lines::default();
    let subscriber = tracing_subscriber::registry().with(lines.clone());
    let _default = tracing::subscriber::set_default(subscriber);
    let outcome = execute(&fake, tasks, &hashes, &files).await;
    let log = lines.0.lock().unwrap().clone();
    (outcome, log)
}

#[tokio::test]
#[ignore = "log capture: tracing drops events of a thread-scoped subscriber while other tests log on other threads; make test runs it with --test-threads=1"]
async fn each_task_logs_one_line_with_its_result() {
    let (outcome, log) = load_and_start("web.service", JobOutcome::Done).await;
    assert!(outcome.failed.is_empty(), "{outcome:?}");
    assert_eq!(log.len(), 3, "{log:#?}");
    assert!(
        log.iter()
            .all(|l| l.starts_with("INFO message=task completed")),
        "{log:#?}"
    );
}

#[tokio::test]
#[ignore = "log capture: tracing drops events of a thread-scoped subscriber while other tests log on other threads; make test runs it with --test-threads=1"]
async fn restarting_a_unit_that_died_warns_once_with_why_it_died() {
    let fake = FakeManager::new();
    let unit = name("crashy.service");
    let file = UnitFile::parse(b"[Service]\nExecStart=/bin/crashy\n").unwrap();
    fake.put_unit(&unit, &file, true);
    fake.set_active(&unit, "failed", "failed");
    let task = Task {
        kind: TaskKind::Start,
        unit: unit.clone(),
        reason: Reason::DesiredLaunched {
            active: fleet_core::ActiveState::parse("failed"),
        },
    };
    let lines = Lines::default();
    let subscriber = tracing_subscriber::registry().with(lines.clone());
    let _default = tracing::subscriber::set_default(subscriber);
    let none = BTreeMap::new();
    let outcome = execute(&fake, vec![task], &none, &BTreeMap::new()).await;
    assert!(outcome.failed.is_empty(), "{outcome:?}");
    let log = lines.0.lock().unwrap().clone();
    assert_eq!(log.len(), 1, "{log:#?}");
    assert!(
        log[0].starts_with("WARN message=restarted a unit that failed"),
        "{log:?}"
    );
    assert!(log[0].contains("result=\"exit-code\""), "{log:?}");
    assert!(log[0].contains("exit=\"exit status 1\""), "{log:?}");
}

#[tokio::test]
#[ignore = "log capture: tracing drops events of a thread-scoped subscriber while other tests log on other threads; make test runs it with --test-threads=1"]
async fn a_failed_start_carries_systemds_result_and_exit_status() {
    let (outcome, log) = load_and_start("bad.service", JobOutcome::Failed).await;
    let error = outcome.failed[&name("bad.service")].to_string();
    assert_eq!(
        error,
        "start job ended failed (result exit-code, exit status 1)"
    );
    let failed: Vec<&String> = log.iter().filter(|l| l.contains("task failed")).collect();
    assert_eq!(failed.len(), 1, "{log:#?}");
    assert!(failed[0].starts_with("WARN"), "{failed:?}");
    assert!(failed[0].contains("result=\"exit-code\""), "{failed:?}");
    assert!(failed[0].contains("exit=\"exit status 1\""), "{failed:?}");
    assert_eq!(log.len(), 3, "one line per task: {log:#?}");
}
fn hashes_of(units: &[UnitName], file: &UnitFile) -> BTreeMap<UnitName, UnitHash> {
    units.iter().map(|u| (u.clone(), file.hash())).collect()
}

/// The plan of replacing every unit of `units` (running `old`) by `new`.
fn replace_plan(units: &[UnitName], old: &UnitFile, new: &UnitFile) -> Vec<Task> {
    let reason = Reason::HashDiffers {
        current: old.hash(),
        desired: new.hash(),
    };
    let mut tasks = Vec::new();
    for kind in [TaskKind::Unload, TaskKind::Load] {
        tasks.extend(units.iter().map(|u| Task {
            kind,
            unit: u.clone(),
            reason: reason.clone(),
        }));
    }
    tasks.push(Task {
        kind: TaskKind::ReloadUnitFiles,
        unit: units[0].clone(),
        reason: Reason::UnitFileChanged,
    });
    tasks.extend(units.iter().map(|u| Task {
        kind: TaskKind::Start,
        unit: u.clone(),
        reason: Reason::LaunchAfterLoad,
    }));
    tasks
}

#[tokio::test]
async fn replacing_300_units_costs_one_reload_and_keeps_their_links() {
    let fake = FakeManager::new();
    let old = UnitFile::parse(b"[Service]\nExecStart=/bin/sleep 1\n").unwrap();
    let new = UnitFile::parse(b"[Service]\nExecStart=/bin/sleep 2\n").unwrap();
    let units: Vec<UnitName> = (0..300)
        .map(|i| name(&format!("u{i:03}.service")))
        .collect();
    for u in &units {
        fake.put_unit(u, &old, true);
    }
    fake.take_calls();
    let files = BTreeMap::from([(new.hash(), new.clone())]);
    let tasks = replace_plan(&units, &old, &new);
    let outcome = execute(&fake, tasks, &hashes_of(&units, &new), &files).await;
    assert!(outcome.failed.is_empty(), "{:?}", outcome.failed);
    let calls = fake.calls();
    let reloads: Vec<usize> = (0..calls.len())
        .filter(|i| calls[*i] == Call::Reload)
        .collect();
    assert_eq!(reloads.len(), 1, "one daemon-reload for the batch");
    assert!(
        !calls.iter().any(|c| matches!(c, Call::Uninstall(_))),
        "a replaced file is written over, not unlinked and relinked"
    );
    let at = |c: &Call| calls.iter().position(|x| x == c).unwrap();
    for u in &units {
        let (stop, install) = (
            at(&Call::Stop(u.clone())),
            at(&Call::Install(u.clone(), new.hash())),
        );
        let start = at(&Call::Start(u.clone()));
        assert!(
            stop < install && install < reloads[0] && reloads[0] < start,
            "{u}"
        );
        assert!(fake.is_linked(u));
        assert_eq!(
            fake.running_hash(u),
            Some(new.hash()),
            "{u} runs the new file"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_new_unit_starts_without_waiting_for_an_unrelated_stop() {
    let fake = FakeManager::new().with_job_timeout(Duration::from_secs(100));
    let file = UnitFile::parse(b"[Service]\nExecStart=/bin/sleep infinity\n").unwrap();
    let (gone, new) = (name("gone.service"), name("new.service"));
    fake.put_unit(&gone, &file, true);
    fake.set_job(JobKind::Stop, &gone, FakeJob::NeverEnds);
    let tasks = vec![
        Task {
            kind: TaskKind::Unload,
            unit: gone.clone(),
            reason: Reason::NotScheduledHere,
        },
        Task {
            kind: TaskKind::Load,
            unit: new.clone(),
            reason: Reason::FileMissing,
        },
        Task {
            kind: TaskKind::ReloadUnitFiles,
            unit: gone.clone(),
            reason: Reason::UnitFileRemoved,
        },
        Task {
            kind: TaskKind::Start,
            unit: new.clone(),
            reason: Reason::LaunchAfterLoad,
        },
    ];
    let hashes = BTreeMap::from([(new.clone(), file.hash())]);
    let files = BTreeMap::from([(file.hash(), file.clone())]);
    let run = {
        let fake = fake.clone();
        tokio::spawn(async move { execute(&fake, tasks, &hashes, &files).await })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!run.is_finished(), "the stop of gone.service still runs");
    assert!(
        fake.calls().contains(&Call::Start(new.clone())),
        "{:?}",
        fake.calls()
    );
    assert_eq!(fake.state(&new).active, "active");
    let outcome = run.await.unwrap();
    assert_eq!(outcome.failed.keys().collect::<Vec<_>>(), vec![&gone]);
    // The failed stop left gone.service's file and definition as they were: nothing stale.
    assert!(!fake.calls().contains(&Call::Reload), "{:?}", fake.calls());
}

/// `n` units installed and running in `fake`.
fn running_units(fake: &FakeManager, n: usize) -> Vec<UnitName> {
    let file = UnitFile::parse(b"[Service]\nExecStart=/bin/sleep infinity\n").unwrap();
    let units: Vec<UnitName> = (0..n).map(|i| name(&format!("u{i}.service"))).collect();
    for u in &units {
        fake.put_unit(u, &file, true);
    }
    units
}

#[tokio::test(start_paused = true)]
async fn stops_of_many_units_are_issued_without_awaiting_each_other() {
    // More units than there are slots: a stop waits for its job without one.
    for kind in [TaskKind::Unload, TaskKind::Stop] {
        let fake = FakeManager::new().with_job_timeout(Duration::from_secs(100));
        let units = running_units(&fake, 3 * CONCURRENCY);
        for u in &units {
            fake.set_job(JobKind::Stop, u, FakeJob::NeverEnds);
        }
        let reason = match kind {
            TaskKind::Unload => Reason::NotScheduledHere,
            _ => Reason::DesiredLoaded {
                active: fleet_core::ActiveState::parse("active"),
            },
        };
        let tasks = units
            .iter()
            .map(|u| Task {
                kind,
                unit: u.clone(),
                reason: reason.clone(),
            })
            .collect();
        let run = {
            let fake = fake.clone();
            tokio::spawn(
                async move { execute(&fake, tasks, &BTreeMap::new(), &BTreeMap::new()).await },
            )
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        let stops = fake
            .calls()
            .iter()
            .filter(|c| matches!(c, Call::Stop(_)))
            .count();
        assert_eq!(
            stops,
            units.len(),
            "{kind}: every stop is queued while none has ended"
        );
        let outcome = run.await.unwrap();
        assert_eq!(outcome.failed.len(), units.len());
    }
}

#[tokio::test(start_paused = true)]
async fn unloads_beyond_the_slots_all_end_uninstalled() {
    let fake = FakeManager::new();
    let units = running_units(&fake, 3 * CONCURRENCY);
    let tasks = units
        .iter()
        .map(|u| Task {
            kind: TaskKind::Unload,
            unit: u.clone(),
            reason: Reason::NotScheduledHere,
        })
        .collect();
    let outcome = execute(&fake, tasks, &BTreeMap::new(), &BTreeMap::new()).await;
    assert!(outcome.failed.is_empty(), "{:?}", outcome.failed);
    assert_eq!(outcome.executed, units.len());
    for u in &units {
        assert_eq!(fake.state(u).active, "inactive", "{u}");
        assert!(fake.calls().contains(&Call::Uninstall(u.clone())), "{u}");
    }
}
