use super::*;
use crate::EngineConfig;
use fleet_core::{DesiredState, MachineId, MachineInfo, UnitFile, UnitHash, UnitName};
use fleet_registry::kv::MemKv;
use fleet_registry::{MachineRole, Registry, UnitsRole};
use std::collections::BTreeMap;
use tokio::sync::watch;

fn machine(s: &str) -> MachineId {
    s.parse().unwrap()
}

fn unit(s: &str) -> UnitName {
    s.parse().unwrap()
}

fn schedule(name: &str, on: &str, reason: Reason) -> Decision {
    Decision {
        kind: DecisionKind::Schedule {
            unit: unit(name),
            machine: machine(on),
            hash: UnitHash::of_bytes(b"x"),
            desired: DesiredState::Launched,
            restart: 0,
            no_restart: false,
            placement: 0,
        },
        reason,
    }
}

fn plan_of(decisions: Vec<Decision>) -> Plan {
    Plan {
        decisions,
        waiting: Default::default(),
        previous_copies: Default::default(),
    }
}

#[test]
fn a_schedule_is_a_placement_unless_the_unit_leaves_another_machine() {
    let fresh = schedule(
        "a.service",
        "m1",
        Reason::NotScheduled {
            desired: DesiredState::Launched,
        },
    );
    let gone = Decision {
        kind: DecisionKind::Unschedule {
            unit: unit("b.service"),
            machine: machine("m2"),
            left: None,
        },
        reason: Reason::MachineGone {
            machine: machine("m2"),
        },
    };
    let moved = schedule(
        "b.service",
        "m1",
        Reason::NotScheduled {
            desired: DesiredState::Launched,
        },
    );
    let drained = schedule(
        "c.service",
        "m1",
        Reason::Drained {
            machine: machine("m3"),
        },
    );
    let stuck = Decision {
        kind: DecisionKind::Unschedulable {
            unit: unit("d.service"),
        },
        reason: Reason::NoMachines,
    };
    let plan = plan_of(vec![
        gone.clone(),
        fresh.clone(),
        moved.clone(),
        drained.clone(),
        stuck.clone(),
    ]);
    let leaving = leaving(&plan);
    assert_eq!(outcome(&fresh, &leaving), Some(Outcome::Placed));
    assert_eq!(outcome(&moved, &leaving), Some(Outcome::Moved));
    assert_eq!(outcome(&drained, &leaving), Some(Outcome::Moved));
    assert_eq!(outcome(&stuck, &leaving), Some(Outcome::Waiting));
    assert_eq!(outcome(&gone, &leaving), None);
}

#[tokio::test(start_paused = true)]
async fn a_leader_counts_its_passes_and_the_units_it_placed() {
    let reg = Registry::new(MemKv::new(), "/metrics-test/");
    let info = MachineInfo {
        id: machine("m1"),
        public_ip: String::new(),
        metadata: BTreeMap::new(),
        version: "test".into(),
        disable_engine: false,
        api: String::new(),
        fence_at: None,
    };
    MachineRole::new(reg.clone(), machine("m1"))
        .register(&info, Duration::from_secs(3600), None)
        .await
        .unwrap();
    let file = UnitFile::parse(b"[Service]\nExecStart=/bin/true\n").unwrap();
    for name in ["a.service", "b.service"] {
        UnitsRole::new(reg.clone())
            .create_unit(&unit(name), &file, DesiredState::Launched)
            .await
            .unwrap();
    }
    let metrics = Metrics::default();
    let cfg =
        EngineConfig::new(machine("m1"), Duration::from_secs(2)).with_metrics(metrics.clone());
    let (stop, shutdown) = watch::channel(false);
    let engine = tokio::spawn(crate::run(reg.clone(), cfg, shutdown));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while metrics.decisions(Outcome::Placed) < 2 {
        assert!(tokio::time::Instant::now() < deadline, "units not placed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(metrics.is_leader());
    assert!(metrics.reconcile_count() >= 1);
    assert_eq!(metrics.decisions(Outcome::Moved), 0);
    stop.send(true).unwrap();
    engine.await.unwrap();
    assert!(!metrics.is_leader(), "a resigned engine is no leader");
}

async fn join(reg: &Registry<MemKv>, id: &str) -> fleet_registry::Presence {
    // Every other field has a default.
    let info: MachineInfo = serde_json::from_value(serde_json::json!({ "id": id })).unwrap();
    let role = MachineRole::new(reg.clone(), machine(id));
    role.register(&info, Duration::from_secs(3600), None)
        .await
        .unwrap()
}

/// Issue 36: the leader counts the units it holds back for a copy on a machine they left,
/// and the states of machines a unit was never scheduled on (which hold nothing back).
#[tokio::test(start_paused = true)]
async fn a_leader_counts_units_waiting_for_a_copy_and_stray_states() {
    use fleet_core::SystemdState;
    use fleet_registry::kv::{Kv, Txn, TxnOp};
    let kv = MemKv::new();
    let reg = Registry::new(kv.clone(), "/metrics-test/");
    let m1 = join(&reg, "m1").await;
    join(&reg, "m2").await;
    let role = MachineRole::new(reg.clone(), machine("m1"));
    for name in ["held.service", "stray.service"] {
        let state = fleet_registry::UnitStateRecord {
            name: unit(name),
            machine: machine("m1"),
            hash: None,
            systemd: SystemdState {
                load: "loaded".into(),
                active: "active".into(),
                sub: String::new(),
            },
            drop_ins: Vec::new(),
            restart: 0,
            restart_pending: false,
            restarts: 0,
            since: None,
            exit: None,
        };
        role.publish_state(&m1, &state).await.unwrap();
    }
    // held.service left m1 (as an engine records it); stray.service was never there.
    let record = TxnOp::Put {
        key: reg.keys().left(&unit("held.service"), &machine("m1")),
        value: Vec::new(),
        lease: None,
    };
    let txn = Txn {
        compares: Vec::new(),
        success: vec![record],
        failure: Vec::new(),
    };
    kv.txn(txn).await.unwrap();
    let file = UnitFile::parse(b"[Service]\nExecStart=/bin/true\n\n[X-Fleet]\nMachineID=m2\n");
    for name in ["held.service", "stray.service"] {
        UnitsRole::new(reg.clone())
            .create_unit(&unit(name), file.as_ref().unwrap(), DesiredState::Launched)
            .await
            .unwrap();
    }
    let metrics = Metrics::default();
    let cfg =
        EngineConfig::new(machine("m1"), Duration::from_secs(2)).with_metrics(metrics.clone());
    let (stop, shutdown) = watch::channel(false);
    let engine = tokio::spawn(crate::run(reg.clone(), cfg, shutdown));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while metrics.decisions(Outcome::Placed) < 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "stray.service not placed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(metrics.waiting_for_previous_copy(), 1, "held.service");
    assert_eq!(metrics.stray_unit_states(), 1, "stray.service on m1");
    stop.send(true).unwrap();
    engine.await.unwrap();
}
