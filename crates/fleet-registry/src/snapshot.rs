//! A consistent view of the whole cluster at one etcd revision, for decisions and listings.

use fleet_core::{MachineId, MachineInfo, UnitName};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use tracing::debug;

use crate::error::{RegistryError, Result};
use crate::keys::{Key, Keys, Kind};
use crate::kv::{KeyValue, Kv, KvError, Revision};
use crate::metadata::{self, DynamicMetadata};
use crate::per_machine::PerMachine;
use crate::read::{self, Skipped};
use crate::records::{
    DrainRecord, LeftCopy, MigrationRecord, MoveRecord, ScheduleEntry, Unit, UnitStateRecord,
};
use crate::registry::Registry;

/// Units, schedule, machines, their dynamic metadata, drains, published states and the
/// placement history, all read at `revision`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub revision: Revision,
    pub units: BTreeMap<UnitName, Unit>,
    /// Machines as they registered, with their configured metadata: what the scheduler
    /// places on is [`machines_with_metadata`](Self::machines_with_metadata).
    pub machines: BTreeMap<MachineId, MachineInfo>,
    /// Dynamic metadata (`PATCH /machines`), of registered machines and others.
    pub metadata: DynamicMetadata,
    /// unit -> machine -> entry.
    pub schedule: BTreeMap<UnitName, PerMachine<ScheduleEntry>>,
    /// unit -> machine -> published state.
    pub states: BTreeMap<UnitName, PerMachine<UnitStateRecord>>,
    /// unit -> why the engine could not place it.
    pub unscheduled: BTreeMap<UnitName, String>,
    /// Drained machines (registered or not), by machine.
    pub drained: BTreeMap<MachineId, DrainRecord>,
    /// Units the engine is moving off a drained machine.
    pub moving: BTreeMap<UnitName, MoveRecord>,
    /// The placement history: unit -> the machines it left while a copy may still have run
    /// there (`P/left/<name>/<machine>`), with what each had published of it then, until the
    /// engine saw that copy stop.
    pub left: BTreeMap<UnitName, PerMachine<LeftCopy>>,
    /// Machines whose units were imported from fleet v1 and that have not joined yet.
    pub migrating: BTreeMap<MachineId, MigrationRecord>,
    /// Values that could not be read, by key: left out of every map above, so a corrupt unit
    /// record reads as no unit, a corrupt schedule entry as no entry. A machine's states past
    /// [`read::MAX_STATES_PER_MACHINE`] are one value here, at its state prefix.
    pub skipped: BTreeMap<String, Skipped>,
    /// How many keys of each machine's states were taken in, and left out past the bound.
    pub state_bound: read::StateBound,
}

impl Snapshot {
    pub(crate) fn skip(&mut self, s: Skipped) {
        self.skipped.insert(s.key.clone(), s);
    }

    /// The machines with their dynamic metadata over their configured metadata; borrowed
    /// when no registered machine has dynamic metadata.
    pub fn machines_with_metadata(&self) -> Cow<'_, BTreeMap<MachineId, MachineInfo>> {
        if !self.metadata.keys().any(|m| self.machines.contains_key(m)) {
            return Cow::Borrowed(&self.machines);
        }
        let mut machines = self.machines.clone();
        for machine in machines.values_mut() {
            metadata::apply_dynamic(machine, &self.metadata);
        }
        Cow::Owned(machines)
    }

    /// `name` as the unit map holds it, so that the schedule's and the states' copies share
    /// its text (a clone of a name shares it; one decoded from another record does not).
    fn shared_name(&self, name: &mut UnitName) {
        if let Some((known, _)) = self.units.get_key_value(name) {
            *name = known.clone();
        }
    }

    /// `machine` as the machine map holds it (see [`shared_name`](Self::shared_name)).
    fn shared_machine(&self, machine: &mut MachineId) {
        if let Some((known, _)) = self.machines.get_key_value(machine) {
            *machine = known.clone();
        }
    }

    /// `name` and `machine` as this snapshot's maps hold them.
    fn share(&self, name: &mut UnitName, machine: &mut MachineId) {
        self.shared_name(name);
        self.shared_machine(machine);
    }

    /// Adds the value stored at `kv`, if its key is of a kind the snapshot keeps (units,
    /// machines, dynamic metadata, schedule, states, unschedulable reasons, drains, moves,
    /// the placement history): readable, into its map; not, into
    /// [`skipped`](Self::skipped), and returned so that the caller may report it. Whatever was
    /// at the key before must have been [`remove`](Self::remove)d.
    pub(crate) fn insert(&mut self, keys: &Keys, kv: &KeyValue) -> Option<&Skipped> {
        self.insert_from(None, keys, kv)
    }

    /// As [`insert`](Self::insert), but the names of a schedule entry or a state are shared
    /// with `naming`'s maps rather than this snapshot's: a part of a snapshot decoded apart.
    fn insert_sharing(&mut self, naming: &Snapshot, keys: &Keys, kv: &KeyValue) {
        self.insert_from(Some(naming), keys, kv);
    }

    fn insert_from(
        &mut self,
        naming: Option<&Snapshot>,
        keys: &Keys,
        kv: &KeyValue,
    ) -> Option<&Skipped> {
        let inserted = match keys.kind(&kv.key)? {
            Kind::Unit => read::unit(keys, kv).map(|unit| {
                self.units.insert(unit.name().clone(), unit);
            }),
            Kind::Machine => read::machine(keys, kv).map(|m| {
                self.machines.insert(m.id.clone(), m);
            }),
            Kind::Schedule => read::schedule_entry(keys, kv).map(|mut e| {
                naming.unwrap_or(self).share(&mut e.name, &mut e.machine);
                place(&mut self.schedule, e.name.clone(), e.machine.clone(), e);
            }),
            Kind::State => {
                if let Some(machine) = keys.state_machine(&kv.key)
                    && !self.state_bound.take(&machine)
                {
                    return self.past_bound(keys, &machine, kv.mod_revision);
                }
                read::state(keys, kv).map(|mut s| {
                    naming.unwrap_or(self).share(&mut s.name, &mut s.machine);
                    place(&mut self.states, s.name.clone(), s.machine.clone(), s);
                })
            }
            Kind::Unscheduled => read::unscheduled(keys, kv).map(|(unit, reason)| {
                self.unscheduled.insert(unit, reason);
            }),
            Kind::Metadata => metadata::read(keys, kv).map(|(machine, key, value)| {
                self.metadata.entry(machine).or_default().insert(key, value);
            }),
            Kind::Drain => read::drain(keys, kv).map(|d| {
                self.drained.insert(d.machine.clone(), d);
            }),
            Kind::Moving => read::moving(keys, kv).map(|m| {
                self.moving.insert(m.unit.clone(), m);
            }),
            Kind::Migrating => read::migrating(keys, kv).map(|m| {
                self.migrating.insert(m.machine.clone(), m);
            }),
            Kind::Left => read::left(keys, kv).map(|(mut unit, mut machine, copy)| {
                naming.unwrap_or(self).share(&mut unit, &mut machine);
                place(&mut self.left, unit, machine, copy);
            }),
            // Placements mirror the schedule, which the snapshot holds already.
            // Events are no part of the state decisions are made on.
            Kind::File | Kind::FileRef | Kind::Engine | Kind::Placement | Kind::Event => {
                return None;
            }
        };
        let s = inserted.err()?;
        let key = s.key.clone();
        self.skip(s);
        self.skipped.get(&key)
    }

    /// Records one more of `machine`'s states left out past the bound, at its state prefix;
    /// returned (to be reported) only for the first, so that a host writing a million keys
    /// costs one warning.
    fn past_bound(
        &mut self,
        keys: &Keys,
        machine: &MachineId,
        mod_revision: Revision,
    ) -> Option<&Skipped> {
        let past = self.state_bound.past(machine);
        let s = read::states_past_bound(keys, machine, read::Past::Exactly(past), mod_revision);
        let key = s.key.clone();
        self.skip(s);
        (past == 1).then(|| self.skipped.get(&key)).flatten()
    }

    /// A state key that was left out past its machine's bound is gone (a view following the
    /// watch knows it existed, and that [`remove`](Self::remove) found nothing there).
    pub(crate) fn release_past_state(&mut self, keys: &Keys, key: &str) {
        let Some(machine) = keys.state_machine(key) else {
            return;
        };
        let past = self.state_bound.release_past(&machine);
        let prefix = keys.machine_states(&machine);
        if past == 0 {
            self.skipped.remove(&prefix);
        } else if let Some(s) = self.skipped.get(&prefix) {
            let rev = s.mod_revision;
            self.skip(read::states_past_bound(
                keys,
                &machine,
                read::Past::Exactly(past),
                rev,
            ));
        }
    }

    /// Removes what is stored at `key`: its skipped value, or what the key names. A key that
    /// names nothing (its parts do not parse) can hold nothing but a skipped value. Whether
    /// anything was there.
    pub(crate) fn remove(&mut self, keys: &Keys, key: &str) -> bool {
        let held = self.skipped.remove(key).is_some() | self.remove_named(keys, key);
        if held && let Some(machine) = keys.state_machine(key) {
            self.state_bound.release_taken(&machine);
        }
        held
    }

    /// Removes what `key` names from its map; whether it held anything.
    fn remove_named(&mut self, keys: &Keys, key: &str) -> bool {
        match Key::parse(keys, key) {
            Some(Key::Unit(unit)) => self.units.remove(&unit).is_some(),
            Some(Key::Machine(machine)) => self.machines.remove(&machine).is_some(),
            Some(Key::Schedule { machine, unit }) => {
                remove_inner(&mut self.schedule, &unit, &machine)
            }
            Some(Key::State { unit, machine }) => remove_inner(&mut self.states, &unit, &machine),
            Some(Key::Unscheduled(unit)) => self.unscheduled.remove(&unit).is_some(),
            Some(Key::Metadata { machine, key }) => {
                let Some(values) = self.metadata.get_mut(&machine) else {
                    return false;
                };
                let held = values.remove(key.as_str()).is_some();
                if values.is_empty() {
                    self.metadata.remove(&machine);
                }
                held
            }
            Some(Key::Drain(machine)) => self.drained.remove(&machine).is_some(),
            Some(Key::Moving(unit)) => self.moving.remove(&unit).is_some(),
            Some(Key::Migrating(machine)) => self.migrating.remove(&machine).is_some(),
            Some(Key::Left { unit, machine }) => remove_inner(&mut self.left, &unit, &machine),
            Some(
                Key::File(_)
                | Key::FileRef { .. }
                | Key::Leader
                | Key::Disruption
                | Key::Placement { .. }
                | Key::Event { .. },
            )
            | None => false,
        }
    }
}

/// Puts `value`, `unit`'s on `machine`, into `map`.
fn place<V>(
    map: &mut BTreeMap<UnitName, PerMachine<V>>,
    unit: UnitName,
    machine: MachineId,
    value: V,
) {
    map.entry(unit).or_default().insert(machine, value);
}

/// Removes `unit`'s value on `machine` from `map`; whether there was one.
fn remove_inner<V>(
    map: &mut BTreeMap<UnitName, PerMachine<V>>,
    unit: &UnitName,
    machine: &MachineId,
) -> bool {
    let Some(inner) = map.get_mut(unit) else {
        return false;
    };
    let held = inner.remove(machine).is_some();
    if inner.is_empty() {
        map.remove(unit);
    }
    held
}

impl<K: Kv> Registry<K> {
    /// Reads everything at one revision, all prefixes at once (at 100,000 units one after
    /// another they were most of a listing's time). A value that cannot be read is left out
    /// and listed in [`Snapshot::skipped`].
    ///
    /// The pages are decoded as they arrive ([`Kv::range_each`]) on a thread of the
    /// snapshot's own, while etcd serves the next ones: decoded after the last page on the
    /// caller's one thread, the 300,000 records of a listing of 100,000 units kept one core
    /// busy ~0.4 s with the other idle (issue 19). Units and machines are decoded first, so
    /// that the records decoded after them share their names' text; then the states on a
    /// second thread beside the rest ([`decode`]).
    pub async fn snapshot(&self) -> Result<Snapshot> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.snapshot_once().await {
                // The revision was ours to choose: read the present again.
                Err(RegistryError::Kv {
                    cause: KvError::Compacted { .. },
                    ..
                }) if attempt < SNAPSHOT_ATTEMPTS => {
                    debug!(attempt, "snapshot compacted away, reading again");
                }
                res => return res,
            }
        }
    }

    /// The store's present revision, from a (linearizable) read of one key; `doing` names
    /// the read in its error.
    pub async fn present_revision(&self, doing: &'static str) -> Result<Revision> {
        Ok(self
            .kv()
            .range(&self.keys().leader(), false, None)
            .await
            .map_err(RegistryError::kv(doing))?
            .revision)
    }

    async fn snapshot_once(&self) -> Result<Snapshot> {
        let keys = self.keys();
        // One key's read tells the present revision; everything is read at it.
        let revision = self.present_revision("reading snapshot").await?;
        // In the order `decode` expects: the NAMING prefixes first, the states at STATES.
        let prefixes = [
            keys.units(),
            keys.machines(),
            keys.schedules(),
            keys.states(),
            keys.unscheduled_all(),
            keys.metadata_all(),
            keys.drains(),
            keys.moves(),
            keys.lefts(),
            keys.migrations(),
        ];
        let abandoned = Arc::new(AtomicBool::new(false));
        let (pages, decoder) = Decoder::start(keys, revision, &abandoned);
        let reads = prefixes.iter().enumerate().map(|(i, prefix)| {
            let pages = pages.clone();
            async move {
                // The decoder ends once every sender is gone, whatever was sent.
                let page = |kvs| {
                    let _ = pages.send(Decode::Page(i, kvs));
                };
                self.kv().range_each(prefix, revision, page).await?;
                let _ = pages.send(Decode::Done(i));
                Ok(())
            }
        });
        let read = futures::future::try_join_all(reads).await;
        if read.is_err() {
            // What arrived belongs to a read that failed: not worth decoding.
            abandoned.store(true, Ordering::Relaxed);
        }
        drop(pages);
        let snap = decoder.finish(keys);
        read.map_err(RegistryError::kv("reading snapshot"))?;
        Ok(snap)
    }
}

/// How many times [`Registry::snapshot`] reads again when a compaction takes the revision
/// it chose.
const SNAPSHOT_ATTEMPTS: u32 = 3;

/// The prefixes before this place in the snapshot's list (units, machines) name what the
/// others refer to: [`decode`] takes them whole first.
const NAMING: usize = 2;

/// The place of the states in the snapshot's list of prefixes.
const STATES: usize = 3;

/// What the snapshot's reads hand its decoder: a page of the `i`th prefix, or that prefix's
/// end.
enum Decode {
    Page(usize, Vec<KeyValue>),
    Done(usize),
}

/// Where a snapshot's pages are decoded: a thread of its own, not one of tokio's blocking
/// threads (fleetd keeps 4 for the agent's file work, and the reads may take a second), and
/// not a task (under paused time a blocking task holds the clock, and the caller's runtime
/// may have one thread). Decoded after the reads, by the caller, if the OS refuses a thread.
enum Decoder {
    Thread(std::thread::JoinHandle<Snapshot>),
    Inline {
        revision: Revision,
        pages: Receiver<Decode>,
        abandoned: Arc<AtomicBool>,
    },
}

impl Decoder {
    /// Starts decoding what is sent on the sender returned.
    fn start(
        keys: &Keys,
        revision: Revision,
        abandoned: &Arc<AtomicBool>,
    ) -> (Sender<Decode>, Decoder) {
        let (pages, decoded) = std::sync::mpsc::channel::<Decode>();
        let (keys, gave_up) = (keys.clone(), Arc::clone(abandoned));
        let thread = std::thread::Builder::new()
            .name("snapshot-decode".into())
            .spawn(move || decode(&keys, revision, decoded, &gave_up));
        match thread {
            Ok(handle) => (pages, Decoder::Thread(handle)),
            Err(e) => {
                debug!(error = %e, "no thread to decode a snapshot; decoding it inline");
                let (pages, decoded) = std::sync::mpsc::channel::<Decode>();
                let abandoned = Arc::clone(abandoned);
                (
                    pages,
                    Decoder::Inline {
                        revision,
                        pages: decoded,
                        abandoned,
                    },
                )
            }
        }
    }

    /// The snapshot, once every sender of the pages is gone. Waits for the thread in
    /// place: on a multi-thread runtime its other tasks move to another worker meanwhile.
    fn finish(self, keys: &Keys) -> Snapshot {
        match self {
            Decoder::Thread(handle) => {
                let join = || {
                    handle
                        .join()
                        .unwrap_or_else(|e| std::panic::resume_unwind(e))
                };
                match tokio::runtime::Handle::current().runtime_flavor() {
                    tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(join),
                    _ => join(),
                }
            }
            Decoder::Inline {
                revision,
                pages,
                abandoned,
            } => decode(keys, revision, pages, &abandoned),
        }
    }
}

/// Builds the snapshot at `revision` from what `pages` brings, until every sender is gone
/// or `abandoned` is set (then what it built is thrown away). Pages of the units and
/// machines (the first two prefixes) are decoded as they come; the others wait until those
/// two are whole, so that their records share the names. Then the states (prefix `STATES`)
/// are decoded on a second thread (inline if the OS refuses one), beside the rest: once the
/// last page has arrived, etcd is done and both cores are free.
fn decode(
    keys: &Keys,
    revision: Revision,
    pages: Receiver<Decode>,
    abandoned: &AtomicBool,
) -> Snapshot {
    let mut snap = Snapshot {
        revision,
        ..Snapshot::default()
    };
    let live = || !abandoned.load(Ordering::Relaxed);
    let mut naming_done = 0;
    let mut waiting: Vec<(usize, Vec<KeyValue>)> = Vec::new();
    for message in pages.iter().take_while(|_| live()) {
        match message {
            Decode::Page(i, kvs) if i < NAMING => {
                for kv in &kvs {
                    snap.insert(keys, kv);
                }
            }
            Decode::Page(i, kvs) => waiting.push((i, kvs)),
            Decode::Done(i) if i < NAMING => {
                naming_done += 1;
                if naming_done == NAMING {
                    break;
                }
            }
            Decode::Done(_) => {}
        }
    }
    let naming = &snap;
    let (states, rest) = std::thread::scope(|scope| {
        let (to_states, from_main) = std::sync::mpsc::channel::<Vec<KeyValue>>();
        let states = std::thread::Builder::new()
            .name("snapshot-states".into())
            .spawn_scoped(scope, move || {
                let mut part = Snapshot::default();
                for kv in from_main.iter().flatten() {
                    part.insert_sharing(naming, keys, &kv);
                }
                part
            })
            .ok();
        let mut rest = Snapshot::default();
        let pending = waiting.into_iter().map(|(i, kvs)| Decode::Page(i, kvs));
        for message in pending.chain(pages.iter()).take_while(|_| live()) {
            match message {
                Decode::Page(STATES, kvs) if states.is_some() => {
                    let _ = to_states.send(kvs);
                }
                Decode::Page(_, kvs) => {
                    for kv in &kvs {
                        rest.insert_sharing(naming, keys, kv);
                    }
                }
                Decode::Done(_) => {}
            }
        }
        drop(to_states);
        let states = states.map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)));
        (states, rest)
    });
    if let Some(states) = states {
        snap.absorb(states);
    }
    snap.absorb(rest);
    snap
}

impl Snapshot {
    /// Takes in what `part` decoded apart: records of kinds other than units and machines,
    /// of keys this snapshot does not hold.
    fn absorb(&mut self, part: Snapshot) {
        merge(&mut self.schedule, part.schedule);
        merge(&mut self.states, part.states);
        merge(&mut self.unscheduled, part.unscheduled);
        merge(&mut self.metadata, part.metadata);
        merge(&mut self.drained, part.drained);
        merge(&mut self.moving, part.moving);
        merge(&mut self.left, part.left);
        merge(&mut self.migrating, part.migrating);
        merge(&mut self.skipped, part.skipped);
        self.state_bound.absorb(part.state_bound);
    }
}

/// `from`'s entries into `into`; moved whole when `into` is empty (the common case: each
/// map is decoded by one part).
fn merge<K: Ord, V>(into: &mut BTreeMap<K, V>, from: BTreeMap<K, V>) {
    if into.is_empty() {
        *into = from;
    } else {
        into.extend(from);
    }
}

#[cfg(test)]
mod tests;
