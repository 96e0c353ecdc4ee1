//! A small map from machine to value, for the per-unit maps of a [`Snapshot`]
//! (`unit -> machine -> schedule entry / state`).
//!
//! Almost every unit is on one machine (a global unit on every machine is the exception), and
//! a `BTreeMap` allocates a node with room for eleven entries for its first one: with 1,000
//! units the engine's view held ~4 MiB of empty node slots in its schedule and state maps
//! (measured with heaptrack on fleetd, issue 6's memory figure). A sorted `Vec` holds exactly
//! what is there, and lookups over a handful of machines are as fast.
//!
//! [`Snapshot`]: crate::Snapshot

use fleet_core::MachineId;

/// Values by machine, sorted by machine ID; the subset of `BTreeMap`'s API the code uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerMachine<V> {
    entries: Vec<(MachineId, V)>,
}

impl<V> Default for PerMachine<V> {
    fn default() -> Self {
        PerMachine {
            entries: Vec::new(),
        }
    }
}

impl<V> PerMachine<V> {
    fn position(&self, machine: &MachineId) -> Result<usize, usize> {
        self.entries.binary_search_by(|(m, _)| m.cmp(machine))
    }

    pub fn get(&self, machine: &MachineId) -> Option<&V> {
        self.position(machine).ok().map(|i| &self.entries[i].1)
    }

    pub fn get_mut(&mut self, machine: &MachineId) -> Option<&mut V> {
        self.position(machine).ok().map(|i| &mut self.entries[i].1)
    }

    pub fn contains_key(&self, machine: &MachineId) -> bool {
        self.position(machine).is_ok()
    }

    /// Inserts or replaces; returns the value replaced.
    pub fn insert(&mut self, machine: MachineId, value: V) -> Option<V> {
        match self.position(&machine) {
            Ok(i) => Some(std::mem::replace(&mut self.entries[i].1, value)),
            Err(i) => {
                if self.entries.is_empty() {
                    // The usual case: one machine. Vec would reserve four.
                    self.entries.reserve_exact(1);
                }
                self.entries.insert(i, (machine, value));
                None
            }
        }
    }

    pub fn remove(&mut self, machine: &MachineId) -> Option<V> {
        let i = self.position(machine).ok()?;
        Some(self.entries.remove(i).1)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries in machine order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&MachineId, &V)> + ExactSizeIterator {
        self.entries.iter().map(|(m, v)| (m, v))
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &MachineId> + ExactSizeIterator {
        self.entries.iter().map(|(m, _)| m)
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> + ExactSizeIterator {
        self.entries.iter().map(|(_, v)| v)
    }
}

impl<V> std::ops::Index<&MachineId> for PerMachine<V> {
    type Output = V;

    fn index(&self, machine: &MachineId) -> &V {
        self.get(machine)
            .unwrap_or_else(|| panic!("no entry for machine {machine}"))
    }
}

impl<'a, V> IntoIterator for &'a PerMachine<V> {
    type Item = (&'a MachineId, &'a V);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (MachineId, V)>,
        fn(&'a (MachineId, V)) -> (&'a MachineId, &'a V),
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter().map(|(m, v)| (m, v))
    }
}

impl<V> FromIterator<(MachineId, V)> for PerMachine<V> {
    fn from_iter<I: IntoIterator<Item = (MachineId, V)>>(iter: I) -> Self {
        let mut map = PerMachine::default();
        for (m, v) in iter {
            map.insert(m, v);
        }
        map
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn m(s: &str) -> MachineId {
        s.parse().unwrap()
    }

    /// Behaves as a BTreeMap under any sequence of inserts and removes.
    #[test]
    fn behaves_as_a_btreemap() {
        let names = ["m3", "m1", "m2", "m1", "m4", "m2", "m0", "m3"];
        let mut ours = PerMachine::default();
        let mut theirs = BTreeMap::new();
        for (i, name) in names.iter().enumerate() {
            if i % 3 == 2 {
                assert_eq!(ours.remove(&m(name)), theirs.remove(&m(name)));
            } else {
                assert_eq!(ours.insert(m(name), i), theirs.insert(m(name), i));
            }
            assert!(ours.iter().eq(theirs.iter()));
            assert_eq!(ours.len(), theirs.len());
            for probe in ["m0", "m1", "m2", "m3", "m4", "m5"] {
                assert_eq!(ours.get(&m(probe)), theirs.get(&m(probe)));
            }
        }
    }

    #[test]
    fn one_entry_takes_room_for_one() {
        let mut map = PerMachine::default();
        map.insert(m("m1"), 1u8);
        assert_eq!(map.entries.capacity(), 1);
        assert_eq!(map[&m("m1")], 1);
    }
}
