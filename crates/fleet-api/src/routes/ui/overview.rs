//! What the dashboard's cluster page shows, built from one snapshot of the registry (pure):
//! one page of machines, each with its units as chips coloured by state, the counts per
//! state over the whole cluster, and the units no machine took with the engine's reason.
//! Only the page asked for is sent, so a cluster of 5,000 machines and 100,000 units never
//! goes to the browser in one answer. The snapshot is the API's held view of the registry
//! when it has one (no etcd read but the present revision's key), so the counts, chips and
//! cards all show the registry at one revision.

use fleet_core::{DesiredState, MachineId};
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

/// Every machine's chips: the units scheduled there (non-global and global alike), coloured
/// by the state the machine published.
fn chips<'a>(snap: &'a Snapshot) -> BTreeMap<&'a MachineId, Vec<Chip>> {
    let mut by_machine: BTreeMap<&'a MachineId, Vec<Chip>> = BTreeMap::new();
    for unit in snap.units.values() {
        let Some(machines) = snap.schedule.get(unit.name()) else {
            continue;
        };
        let states = snap.states.get(unit.name());
        for machine in machines.keys() {
            let state = states.and_then(|s| s.get(machine)).map(|s| &s.systemd);
            by_machine.entry(machine).or_default().push(Chip {
                name: unit.name().to_string(),
                shade: Shade::of(state.map(|s| s.active.as_str())),
                active: state.map_or("", |s| s.active.as_str()).to_owned(),
                sub: state.map_or("", |s| s.sub.as_str()).to_owned(),
                desired: desired(unit.desired()).to_owned(),
            });
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

/// Whether `card` matches `filter` (lower-case): the machine itself, or some of its units,
/// which are then the only ones kept.
fn filtered(mut card: Card, filter: &str) -> Option<Card> {
    if filter.is_empty() {
        return Some(card);
    }
    let hit = |s: &str| s.to_lowercase().contains(filter);
    let machine = hit(&card.id)
        || hit(&card.ip)
        || card.metadata.iter().any(|(k, v)| hit(&format!("{k}={v}")));
    if machine {
        return Some(card);
    }
    card.units.retain(|c| hit(&c.name));
    (!card.units.is_empty()).then_some(card)
}

/// The answer to `ask` from `read`.
pub fn overview(read: &Read<'_>, ask: &Ask) -> Overview {
    let snap = read.snap;
    let mut chips = chips(snap);
    let mut counts = Counts {
        machines: snap.machines.len(),
        units: snap.units.len(),
        ..Counts::default()
    };
    for chip in chips.values().flatten() {
        match chip.shade {
            Shade::Active => counts.active += 1,
            Shade::Activating => counts.activating += 1,
            Shade::Failed => counts.failed += 1,
            Shade::Inactive => counts.inactive += 1,
        }
    }
    let waiting = || {
        snap.units.values().filter(|u| {
            u.desired() != DesiredState::Inactive
                && snap.schedule.get(u.name()).is_none_or(|m| m.is_empty())
        })
    };
    counts.unscheduled = waiting().count();
    let unscheduled = waiting()
        .take(MAX_UNSCHEDULED)
        .map(|u| Unscheduled {
            name: u.name().to_string(),
            reason: snap.unscheduled.get(u.name()).cloned().unwrap_or_default(),
        })
        .collect();
    let cards: Vec<Card> = snap
        .machines_with_metadata()
        .values()
        .filter_map(|m| {
            let card = Card {
                id: m.id.to_string(),
                ip: m.public_ip.clone(),
                metadata: m.metadata.clone(),
                drained: snap.drained.contains_key(&m.id),
                leader: read.leader == Some(&m.id),
                units: chips.remove(&m.id).unwrap_or_default(),
            };
            filtered(card, &ask.filter)
        })
        .collect();
    let per_page = match ask.per_page {
        0 => PER_PAGE,
        n => n.min(MAX_PER_PAGE),
    };
    let pages = cards.len().div_ceil(per_page).max(1);
    let page = ask.page.min(pages - 1);
    let matched = cards.len();
    Overview {
        counts,
        page,
        pages,
        per_page,
        matched,
        machines: cards
            .into_iter()
            .skip(page * per_page)
            .take(per_page)
            .collect(),
        unscheduled,
    }
}

#[cfg(test)]
mod tests;
