//! How many states the agent publishes: never more than a reader takes in of one machine
//! (`fleet_registry::MAX_STATES_PER_MACHINE`, issue 37), so that an agent running more units
//! than that is not mistaken for a host filling etcd, and its states past the bound are not
//! left out by whichever reader meets them last. What it must not do: withdraw a published
//! state to make room (a state a reader holds is worth more than one it would replace).

use fleet_core::UnitName;
use fleet_registry::{MAX_STATES_PER_MACHINE, UnitStateRecord};
use std::collections::BTreeMap;

/// Of `changed` (in unit order), what may be published next to `published`: every update of
/// a unit published already, and new units while room is left under the bound. The second
/// part is how many new units were left unpublished.
pub(super) fn fit(
    published: &BTreeMap<UnitName, UnitStateRecord>,
    changed: Vec<UnitStateRecord>,
) -> (Vec<UnitStateRecord>, usize) {
    let mut room = MAX_STATES_PER_MACHINE.saturating_sub(published.len());
    let mut left_out = 0;
    let fits = changed
        .into_iter()
        .filter(|r| {
            if published.contains_key(&r.name) {
                return true;
            }
            if room == 0 {
                left_out += 1;
                return false;
            }
            room -= 1;
            true
        })
        .collect();
    (fits, left_out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_core::{MachineId, SystemdState};

    fn state(i: usize) -> UnitStateRecord {
        UnitStateRecord {
            name: format!("u{i:05}.service").parse().unwrap(),
            machine: "m1".parse::<MachineId>().unwrap(),
            hash: None,
            systemd: SystemdState::not_found(),
            drop_ins: Vec::new(),
            restart: 0,
            restart_pending: false,
            restarts: 0,
            since: None,
            exit: None,
        }
    }

    #[test]
    fn an_agent_never_publishes_more_states_than_its_bound_but_keeps_updating_those_out() {
        let published: BTreeMap<UnitName, UnitStateRecord> = (0..MAX_STATES_PER_MACHINE - 2)
            .map(|i| (state(i).name.clone(), state(i)))
            .collect();
        // Two updates of published units, then five new ones: room for two.
        let changed: Vec<UnitStateRecord> = [0, 1]
            .into_iter()
            .chain(MAX_STATES_PER_MACHINE..MAX_STATES_PER_MACHINE + 5)
            .map(state)
            .collect();
        let (fits, left_out) = fit(&published, changed);
        assert_eq!(left_out, 3);
        let names: Vec<String> = fits.iter().map(|r| r.name.to_string()).collect();
        assert_eq!(
            names,
            [
                "u00000.service",
                "u00001.service",
                "u10000.service",
                "u10001.service"
            ]
        );
        assert_eq!(published.len() + fits.len() - 2, MAX_STATES_PER_MACHINE);
    }
}
