use super::*;
use crate::fake::{FakeManager, Op};
use crate::{Agent, AgentConfig};
use fleet_core::{DesiredState, MachineId, MachineInfo};
use fleet_registry::kv::MemKv;
use fleet_registry::{MachineRole, Registry, ScheduleEntry, UnitsRole};
use tokio::sync::watch;

fn name(s: &str) -> UnitName {
    s.parse().unwrap()
}

/// Until `check` holds, on paused time.
async fn until(what: &str, check: impl Fn() -> bool) {
    for _ in 0..2000 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(start_paused = true)]
async fn an_agent_counts_its_passes_tasks_and_units_by_state() {
    let registry = Registry::new(MemKv::new(), "/t/");
    let machine: MachineId = "m1".parse().unwrap();
    let info = MachineInfo {
        id: machine.clone(),
        public_ip: String::new(),
        metadata: Default::default(),
        version: "test".into(),
        disable_engine: true,
        api: String::new(),
        fence_at: None,
    };
    let role = MachineRole::new(registry.clone(), machine.clone());
    let presence = role
        .register(&info, Duration::from_secs(30), None)
        .await
        .unwrap();
    let file = UnitFile::parse(b"[Service]\nExecStart=/bin/true\n").unwrap();
    let unit = name("a.service");
    UnitsRole::new(registry.clone())
        .create_unit(&unit, &file, DesiredState::Launched)
        .await
        .unwrap();
    let entry = ScheduleEntry {
        name: unit.clone(),
        machine: machine.clone(),
        hash: file.hash(),
        desired: DesiredState::Launched,
        restart: 0,
        no_restart: false,
        placement: 0,
    };
    registry.write_schedule(&[entry], &[]).await.unwrap();

    let metrics = Metrics::default();
    let fake = FakeManager::new();
    let (_presence_tx, presence_rx) = watch::channel(Some(presence));
    let agent = Agent::new(
        role,
        metrics.meter(fake.clone()),
        AgentConfig::new(machine),
        presence_rx,
    )
    .with_metrics(metrics.clone());
    let (stop, shutdown) = watch::channel(false);
    let task = tokio::spawn(agent.run(shutdown));
    until("the unit is started", || {
        metrics.task_count(TaskKind::Start, TaskResult::Succeeded) == 1
    })
    .await;
    until("the pass is over", || metrics.units_in(State::Active) == 1).await;
    assert!(metrics.pass_count() >= 1);
    assert_eq!(metrics.task_count(TaskKind::Load, TaskResult::Succeeded), 1);
    assert_eq!(metrics.units_in(State::Failed), 0);
    assert_eq!(metrics.dbus_errors(Call::Status), 0);

    // A hint for the unit: the pass over it alone counts it again.
    fake.set_active(&unit, "reloading", "reload");
    until("the unit counts as reloading", || {
        metrics.units_in(State::Reloading) == 1
    })
    .await;
    assert_eq!(metrics.units_in(State::Active), 0);

    // A systemd that refuses calls: the metered manager counts the errors.
    fake.fail(Op::Status, None);
    fake.notify_resync();
    until("a status error is counted", || {
        metrics.dbus_errors(Call::Status) >= 1
    })
    .await;
    stop.send(true).unwrap();
    task.await.unwrap();
}

#[test]
fn the_units_gauge_counts_only_units_with_a_file_here() {
    let metrics = Metrics::default();
    let state = |active: &str| SystemdState {
        load: "loaded".into(),
        active: active.into(),
        sub: "x".into(),
    };
    let unit = |file: UnitFileState, systemd: Option<SystemdState>| CurrentUnit {
        file,
        systemd,
        need_daemon_reload: false,
        restarted: None,
    };
    let present = UnitFileState::Present {
        hash: fleet_core::UnitHash::of_bytes(b"x"),
        linked: true,
    };
    let mut units = BTreeMap::new();
    units.insert(name("a.service"), unit(present, Some(state("active"))));
    units.insert(name("b.service"), unit(present, Some(state("failed"))));
    units.insert(name("c.service"), unit(present, Some(state("newfangled"))));
    units.insert(
        name("d.service"),
        unit(UnitFileState::Absent, Some(state("active"))),
    );
    let mut counts = UnitCounts::default();
    counts.count_all(&units);
    metrics.units(&counts);
    assert_eq!(metrics.units_in(State::Active), 1);
    assert_eq!(metrics.units_in(State::Failed), 1);
    assert_eq!(metrics.units_in(State::Other), 1);
    // Counted again for two units only: b failed -> active, a gone.
    units.insert(name("b.service"), unit(present, Some(state("active"))));
    units.remove(&name("a.service"));
    counts.count_of(&units, [&name("a.service"), &name("b.service")]);
    metrics.units(&counts);
    assert_eq!(metrics.units_in(State::Active), 1);
    assert_eq!(metrics.units_in(State::Failed), 0);
    assert_eq!(
        metrics.units_in(State::Other),
        1,
        "c.service, not named, still counts"
    );
    units.clear();
    counts.count_all(&units);
    metrics.units(&counts);
    assert_eq!(
        metrics.units_in(State::Active),
        0,
        "a state no unit is in reads 0"
    );
}
