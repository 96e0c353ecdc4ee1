//! Registry contents for the tests of the readers: machines as their agents would show them.

use std::time::Duration;

use fleet_core::UnitName;
use fleet_registry::Registry;
use fleet_registry::kv::Kv;

/// A machine for the tests of the readers: registers `info` (on a lease of `ttl`) and
/// publishes, for each `(unit, hash, up)`, the state its agent would: loaded, and active and
/// running when `up`, else inactive and dead.
pub async fn machine_running<K: Kv>(
    registry: &Registry<K>,
    info: &fleet_core::MachineInfo,
    ttl: Duration,
    units: &[(UnitName, fleet_core::UnitHash, bool)],
) {
    let role = fleet_registry::MachineRole::new(registry.clone(), info.id.clone());
    let presence = role
        .register(info, ttl, None)
        .await
        .expect("machine registers");
    for (name, hash, up) in units {
        let state = fleet_registry::UnitStateRecord {
            name: name.clone(),
            machine: info.id.clone(),
            hash: Some(*hash),
            systemd: fleet_core::SystemdState {
                load: "loaded".into(),
                active: if *up { "active" } else { "inactive" }.into(),
                sub: if *up { "running" } else { "dead" }.into(),
            },
            drop_ins: vec![],
            restart: 0,
            restart_pending: false,
            restarts: 0,
            since: None,
            exit: None,
        };
        role.publish_state(&presence, &state)
            .await
            .expect("state published");
    }
}
