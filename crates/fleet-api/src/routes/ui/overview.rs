//! What the dashboard's cluster page shows, built from one snapshot of the registry (pure):
//! one page of machines, each with its units as chips coloured by state, the counts per
//! state over the whole cluster, and the units no machine took with the engine's reason.
//! Only the page asked for is sent, so a cluster of 5,000 machines and 100,000 units never
//! goes to the browser in one answer. The snapshot is the API's held view of the registry
//! when it has one (no etcd read but the present revision's key), so the counts, chips and
//! cards all show the registry at one revision.

use fleet_core::{DesiredState, MachineId, MachineInfo};
use fleet_registry::Snapshot;
use serde::Serialize;
use std::collections::BTreeMap;

/// Machines on one page when the page does not say.
pub const PER_PAGE: usize = 50;
/// The most machines one page may ask for.
pub const MAX_PER_PAGE: usize = 200;
/// The most unscheduled units listed (the count says how many there are).
pub const MAX_UNSCHEDULED: usize = 100;

/// What the page asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ask {
    pub page: usize,
    pub per_page: usize,
    /// Lower-case; empty: every machine.
    pub filter: String,
}

/// A unit's colour on the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Shade {
    Active,
    Activating,
    Failed,
    Inactive,
}

impl Shade {
    /// systemd's `ActiveState` as the page colours it; none published is inactive.
    pub fn of(active: Option<&str>) -> Shade {
        match active {
            Some("active") => Shade::Active,
            Some("activating" | "deactivating" | "reloading" | "refreshing") => Shade::Activating,
            Some("failed") => Shade::Failed,
            _ => Shade::Inactive,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Chip {
    pub name: String,
    pub shade: Shade,
    /// systemd's `ActiveState`/`SubState` as published, empty when none is.
    pub active: String,
    pub sub: String,
    pub desired: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Card {
    pub id: String,
    pub ip: String,
    pub metadata: BTreeMap<String, String>,
    pub drained: bool,
    pub leader: bool,
    pub units: Vec<Chip>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unscheduled {
    pub name: String,
    pub reason: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub machines: usize,
    pub units: usize,
    pub active: usize,
    pub activating: usize,
    pub failed: usize,
    pub inactive: usize,
    pub unscheduled: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Overview {
    pub counts: Counts,
    pub page: usize,
    pub pages: usize,
    pub per_page: usize,
    /// Machines the filter kept.
    pub matched: usize,
    pub machines: Vec<Card>,
    pub unscheduled: Vec<Unscheduled>,
}

/// What one answer is built from: the registry at one revision, and the engine leader.
#[derive(Debug)]
pub struct Read<'a> {
    pub snap: &'a Snapshot,
    pub leader: Option<&'a MachineId>,
}

/// A unit on a machine, as the snapshot holds it: borrowed, so that only the chips of the
/// page sent are made (100,000 units are 400,000 strings).
#[derive(Debug, Clone, Copy)]
struct Placed<'a> {
    unit: &'a fleet_registry::Unit,
    state: Option<&'a fleet_core::SystemdState>,
}

impl Placed<'_> {
    fn shade(&self) -> Shade {
        Shade::of(self.state.map(|s| s.active.as_str()))
    }

    fn chip(&self) -> Chip {
        Chip {
            name: self.unit.name().to_string(),
            shade: self.shade(),
            active: self.state.map_or("", |s| s.active.as_str()).to_owned(),
            sub: self.state.map_or("", |s| s.sub.as_str()).to_owned(),
            desired: desired(self.unit.desired()).to_owned(),
        }
    }
}

/// Every machine's units: those scheduled there (non-global and global alike), with the
/// state the machine published.
fn placed(snap: &Snapshot) -> BTreeMap<&MachineId, Vec<Placed<'_>>> {
    let mut by_machine: BTreeMap<&MachineId, Vec<Placed<'_>>> = BTreeMap::new();
    for unit in snap.units.values() {
        let Some(machines) = snap.schedule.get(unit.name()) else {
            continue;
        };
        let states = snap.states.get(unit.name());
        for machine in machines.keys() {
            let state = states.and_then(|s| s.get(machine)).map(|s| &s.systemd);
            by_machine
                .entry(machine)
                .or_default()
                .push(Placed { unit, state });
        }
    }
    by_machine
}

fn desired(d: DesiredState) -> &'static str {
    match d {
        DesiredState::Inactive => "inactive",
        DesiredState::Loaded => "loaded",
        DesiredState::Launched => "launched",
    }
}

/// Whether `machine` matches `filter` (lower-case): the machine itself, or some of its
/// units, which are then the only ones kept.
fn filtered<'a>(
    machine: &MachineInfo,
    mut units: Vec<Placed<'a>>,
    filter: &str,
) -> Option<Vec<Placed<'a>>> {
    if filter.is_empty() {
        return Some(units);
    }
    let hit = |s: &str| s.to_lowercase().contains(filter);
    let itself = hit(machine.id.as_str())
        || hit(&machine.public_ip)
        || machine
            .metadata
            .iter()
            .any(|(k, v)| hit(&format!("{k}={v}")));
    if itself {
        return Some(units);
    }
    units.retain(|p| hit(p.unit.name().as_str()));
    (!units.is_empty()).then_some(units)
}

/// The counts over the whole cluster, the unscheduled units among them.
fn counts(snap: &Snapshot, placed: &BTreeMap<&MachineId, Vec<Placed<'_>>>) -> Counts {
    let mut counts = Counts {
        machines: snap.machines.len(),
        units: snap.units.len(),
        unscheduled: waiting(snap).count(),
        ..Counts::default()
    };
    for p in placed.values().flatten() {
        match p.shade() {
            Shade::Active => counts.active += 1,
            Shade::Activating => counts.activating += 1,
            Shade::Failed => counts.failed += 1,
            Shade::Inactive => counts.inactive += 1,
        }
    }
    counts
}

/// The units meant to run that no machine took.
fn waiting(snap: &Snapshot) -> impl Iterator<Item = &fleet_registry::Unit> {
    snap.units.values().filter(|u| {
        u.desired() != DesiredState::Inactive
            && snap.schedule.get(u.name()).is_none_or(|m| m.is_empty())
    })
}

/// The answer to `ask` from `read`.
pub fn overview(read: &Read<'_>, ask: &Ask) -> Overview {
    let snap = read.snap;
    let mut placed = placed(snap);
    let counts = counts(snap, &placed);
    let unscheduled = waiting(snap)
        .take(MAX_UNSCHEDULED)
        .map(|u| Unscheduled {
            name: u.name().to_string(),
            reason: snap.unscheduled.get(u.name()).cloned().unwrap_or_default(),
        })
        .collect();
    let machines = snap.machines_with_metadata();
    let kept: Vec<(&MachineInfo, Vec<Placed<'_>>)> = machines
        .values()
        .filter_map(|m| {
            let units = placed.remove(&m.id).unwrap_or_default();
            Some((m, filtered(m, units, &ask.filter)?))
        })
        .collect();
    let per_page = match ask.per_page {
        0 => PER_PAGE,
        n => n.min(MAX_PER_PAGE),
    };
    let pages = kept.len().div_ceil(per_page).max(1);
    let page = ask.page.min(pages - 1);
    let matched = kept.len();
    let card = |(m, units): (&MachineInfo, Vec<Placed<'_>>)| Card {
        id: m.id.to_string(),
        ip: m.public_ip.clone(),
        metadata: m.metadata.clone(),
        drained: snap.drained.contains_key(&m.id),
        leader: read.leader == Some(&m.id),
        units: units.iter().map(Placed::chip).collect(),
    };
    Overview {
        counts,
        page,
        pages,
        per_page,
        matched,
        machines: kept
            .into_iter()
            .skip(page * per_page)
            .take(per_page)
            .map(card)
            .collect(),
        unscheduled,
    }
}

#[cfg(test)]
mod tests;
