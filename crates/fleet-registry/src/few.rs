//! Reads of a few named units whose cost does not grow with the registry (issue 19): only the
//! units' own keys, found through the placement mirror (`P/placement/<name>/<machine>`), in
//! transactions of at most [`MAX_TXN_OPS`] reads. A blocking `fleetctl start` of one unit, the
//! API's `GET /units/<name>` and `GET /state?unitName=…` read this way, so at 100,000 units
//! they read what they read at 10.
//!
//! Unlike [`Registry::snapshot`] such a read is not one revision: it takes two rounds (the
//! units' records and placements, then the schedule entries and states the placements name),
//! and each round may take more than one transaction. A reader that must see every change
//! (a wait) watches from the first round's revision and reads again on a change, so it never
//! misses one; it may see a unit's placement and its state from two revisions in between.

use fleet_core::{DesiredState, MachineId, UnitName};
use futures::StreamExt;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::error::{RegistryError, Result};
use crate::keys::Key;
use crate::kv::{KeyValue, Kv, MAX_TXN_OPS, Revision, Txn, TxnOp, TxnOpResponse};
use crate::read::{self, Listing};
use crate::records::UnitStateRecord;
use crate::registry::Registry;
use crate::snapshot::Snapshot;

/// Keys read per unit in the first round: its record, its placements, its unschedulable
/// reason.
const FIRST_ROUND_OPS: usize = 3;

/// How many transactions of a read of named units are in flight at once.
const READS_IN_FLIGHT: usize = 8;

impl<K: Kv> Registry<K> {
    /// The registry's keys about `names` as a [`Snapshot`] holding only them: their records,
    /// schedule entries and unschedulable reasons, the records of the machines they are placed
    /// on, and their states there. The states of a unit desired `inactive` (whose wait is for
    /// its states to go) are read on every registered machine, since a machine may still
    /// report it after its placement went. A unit with no record has no states read: nothing
    /// shows or waits for the states of a unit that does not exist (a wait for a unit gone is
    /// over), and `fleetctl start` of 1,000 new units on 5,000 machines read 5,000,000 state
    /// keys that way, 39,063 transactions (issue 19). `revision` is the first read's.
    pub async fn units_snapshot(&self, names: &BTreeSet<UnitName>) -> Result<Snapshot> {
        let keys = self.keys();
        let mut snap = Snapshot::default();
        let mut placed: BTreeSet<(UnitName, MachineId)> = BTreeSet::new();
        let first: Vec<TxnOp> = names
            .iter()
            .flat_map(|name| {
                [
                    get(keys.unit(name), false),
                    get(keys.unit_placements(name), true),
                    get(keys.unscheduled(name), false),
                ]
            })
            .collect();
        let per_txn = MAX_TXN_OPS / FIRST_ROUND_OPS * FIRST_ROUND_OPS;
        let (revision, kvs) = self.gets_all(&first, per_txn).await?;
        snap.revision = revision;
        for kv in &kvs {
            match Key::parse(keys, &kv.key) {
                Some(Key::Placement { unit, machine }) => {
                    placed.insert((unit, machine));
                }
                _ => {
                    snap.insert(keys, kv);
                }
            }
        }
        let everywhere: Vec<&UnitName> = names
            .iter()
            .filter(|n| {
                snap.units
                    .get(*n)
                    .is_some_and(|u| u.desired() == DesiredState::Inactive)
            })
            .collect();
        let mut ops = Vec::new();
        if !everywhere.is_empty() {
            for kv in self
                .range_prefix(&keys.machines(), "reading machines")
                .await?
            {
                snap.insert(keys, &kv);
            }
        }
        let mut states: BTreeSet<(&UnitName, &MachineId)> = BTreeSet::new();
        for (unit, machine) in &placed {
            ops.push(get(keys.schedule(machine, unit), false));
            states.insert((unit, machine));
            if !snap.machines.contains_key(machine) {
                ops.push(get(keys.machine(machine), false));
            }
        }
        let machines: Vec<MachineId> = snap.machines.keys().cloned().collect();
        for unit in &everywhere {
            for machine in &machines {
                states.insert((unit, machine));
            }
        }
        ops.extend(
            states
                .iter()
                .map(|(unit, machine)| get(keys.state(machine, unit), false)),
        );
        // A machine's record once, however many of the units are placed on it.
        let mut unique = BTreeSet::new();
        ops.retain(|op| match op {
            TxnOp::Get { key, .. } => unique.insert(key.clone()),
            TxnOp::Put { .. } | TxnOp::Delete { .. } => true,
        });
        for kv in self.gets_all(&ops, MAX_TXN_OPS).await?.1 {
            snap.insert(keys, &kv);
        }
        Ok(snap)
    }

    /// Which of `names` have a unit record now (readable or not): one `Get` of each record,
    /// [`MAX_TXN_OPS`] to a transaction. How a reader of many names, most of them new (a
    /// `fleetctl start` of 50,000 units), learns which to read whole with
    /// [`units_snapshot`](Registry::units_snapshot): a third of the reads of its first round.
    pub async fn units_present(&self, names: &BTreeSet<UnitName>) -> Result<BTreeSet<UnitName>> {
        let keys = self.keys();
        let ops: Vec<TxnOp> = names.iter().map(|n| get(keys.unit(n), false)).collect();
        let (_, kvs) = self.gets_all(&ops, MAX_TXN_OPS).await?;
        Ok(kvs
            .iter()
            .filter_map(|kv| match Key::parse(keys, &kv.key) {
                Some(Key::Unit(unit)) => Some(unit),
                _ => None,
            })
            .collect())
    }

    /// The readable states of `names` on every registered machine, sorted by unit then
    /// machine: one read of the machines and one `Get` per unit and machine, however many
    /// other units the registry holds.
    pub async fn states_of(
        &self,
        names: &BTreeSet<UnitName>,
    ) -> Result<Listing<Vec<UnitStateRecord>>> {
        let keys = self.keys();
        let machines = self
            .range_prefix(&keys.machines(), "listing unit states")
            .await?;
        let machines: Vec<MachineId> = machines
            .iter()
            .filter_map(|kv| match Key::parse(keys, &kv.key) {
                Some(Key::Machine(m)) => Some(m),
                _ => None,
            })
            .collect();
        let ops: Vec<TxnOp> = names
            .iter()
            .flat_map(|n| machines.iter().map(move |m| get(keys.state(m, n), false)))
            .collect();
        let mut kvs = Vec::new();
        let mut revision = 0;
        // etcd has answered this read's listing of the machines.
        let answered = Arc::new(AtomicBool::new(true));
        for chunk in ops.chunks(MAX_TXN_OPS) {
            let (rev, read) = self.gets(chunk.to_vec(), answered.clone()).await?;
            revision = revision.max(rev);
            kvs.extend(read);
        }
        let mut skipped = Vec::new();
        let mut items = read::states(keys, &kvs, &mut skipped);
        items.sort_by(|a, b| (&a.name, &a.machine).cmp(&(&b.name, &b.machine)));
        Ok(Listing {
            revision,
            items,
            skipped,
        })
    }

    /// Every key under `prefix` now (a paged read, see [`Kv::range`]).
    async fn range_prefix(&self, prefix: &str, op: &'static str) -> Result<Vec<KeyValue>> {
        Ok(self
            .kv()
            .range(prefix, true, None)
            .await
            .map_err(RegistryError::kv(op))?
            .kvs)
    }

    /// The keys the `Get`s of `ops` read, `per_txn` to a transaction, [`READS_IN_FLIGHT`]
    /// transactions at a time (a start of 50,000 units read their keys in 1,191 transactions
    /// one after another), with the earliest revision any of them read at: a watch from there
    /// misses no change to what they read.
    async fn gets_all(&self, ops: &[TxnOp], per_txn: usize) -> Result<(Revision, Vec<KeyValue>)> {
        // Owned chunks: a closure over borrowed ones makes the future not `Send` for
        // callers behind an `async fn` of a trait.
        let chunks: Vec<Vec<TxnOp>> = ops.chunks(per_txn.max(1)).map(<[_]>::to_vec).collect();
        let answered = Arc::new(AtomicBool::new(false));
        let mut reads = futures::stream::iter(chunks)
            .map(|chunk| self.gets(chunk, answered.clone()))
            .buffered(READS_IN_FLIGHT);
        let mut revision: Option<Revision> = None;
        let mut kvs = Vec::new();
        while let Some(read) = reads.next().await {
            let (rev, found) = read?;
            revision = Some(revision.map_or(rev, |r| r.min(rev)));
            kvs.extend(found);
        }
        Ok((revision.unwrap_or(0), kvs))
    }

    /// The keys the `Get`s of `ops` (at most [`MAX_TXN_OPS`]) read, in one transaction, one
    /// piece of a read whose pieces `answered` follows ([`Registry::read_txn`]).
    async fn gets(
        &self,
        ops: Vec<TxnOp>,
        answered: Arc<AtomicBool>,
    ) -> Result<(Revision, Vec<KeyValue>)> {
        let txn = Txn {
            compares: vec![],
            success: ops,
            failure: vec![],
        };
        let res = self.read_txn(txn, "reading units", &answered).await?;
        let kvs = res
            .responses
            .into_iter()
            .flat_map(|r| match r {
                TxnOpResponse::Get(kvs) => kvs,
                TxnOpResponse::Put | TxnOpResponse::Delete(_) => Vec::new(),
            })
            .collect();
        Ok((res.revision, kvs))
    }
}

fn get(key: String, prefix: bool) -> TxnOp {
    TxnOp::Get { key, prefix }
}

/// Which of `names` a change of `key` concerns, for a reader of a few units that follows a
/// watch: their records, placements, schedule entries, reasons and states, and the records
/// of `machines`.
pub fn concerns(
    keys: &crate::keys::Keys,
    key: &str,
    names: &BTreeSet<UnitName>,
    machines: &BTreeMap<MachineId, fleet_core::MachineInfo>,
) -> bool {
    match Key::parse(keys, key) {
        Some(
            Key::Unit(unit)
            | Key::Unscheduled(unit)
            | Key::Placement { unit, .. }
            | Key::Schedule { unit, .. }
            | Key::State { unit, .. },
        ) => names.contains(&unit),
        Some(Key::Machine(machine)) => machines.contains_key(&machine),
        Some(
            Key::File(_)
            | Key::FileRef { .. }
            | Key::Leader
            | Key::Disruption
            | Key::Metadata { .. }
            | Key::Drain(_)
            | Key::Moving(_)
            | Key::Migrating(_)
            | Key::Left { .. }
            | Key::Event { .. },
        )
        | None => false,
    }
}

/// A few units' part of the registry ([`Registry::units_snapshot`]), current again after each
/// change that concerns them: one watch of the whole prefix from the first read's revision, its
/// events filtered here ([`concerns`]), and a read of the units' keys again on each one that
/// does. Changes to other units cost the watch's traffic and nothing else; an idle registry
/// costs nothing. A watch that ends (etcd away, a compaction) is started again after a read.
#[derive(Debug)]
pub struct UnitsView<K> {
    registry: Registry<K>,
    names: BTreeSet<UnitName>,
    snapshot: Snapshot,
    watch: Option<crate::kv::Watch>,
    /// A change concerned the units and they were not read again yet (the read that would
    /// have was cancelled, or failed): the next [`UnitsView::changed`] reads them first.
    stale: bool,
}

impl<K: Kv> UnitsView<K> {
    pub async fn start(registry: Registry<K>, names: BTreeSet<UnitName>) -> Result<UnitsView<K>> {
        let snapshot = registry.units_snapshot(&names).await?;
        let mut view = UnitsView {
            registry,
            names,
            snapshot,
            watch: None,
            stale: false,
        };
        view.watch().await?;
        Ok(view)
    }

    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    pub fn names(&self) -> &BTreeSet<UnitName> {
        &self.names
    }

    /// Returns once the units' keys were read again after a change that may concern them
    /// (the snapshot may still be the same: the caller compares). Cancel-safe: a change
    /// received by a call that was dropped (a `select!` on a timer) is read by the next.
    pub async fn changed(&mut self) -> Result<()> {
        if self.stale {
            self.snapshot = self.registry.units_snapshot(&self.names).await?;
            self.stale = false;
            return Ok(());
        }
        loop {
            let message = match &mut self.watch {
                Some(watch) => watch.rx.recv().await,
                None => None,
            };
            match message {
                Some(crate::kv::WatchMessage::Events { events, .. }) => {
                    let keys = self.registry.keys();
                    let machines = &self.snapshot.machines;
                    if !events
                        .iter()
                        .any(|e| concerns(keys, &e.kv.key, &self.names, machines))
                    {
                        continue;
                    }
                    self.stale = true;
                    self.snapshot = self.registry.units_snapshot(&self.names).await?;
                    self.stale = false;
                    return Ok(());
                }
                Some(
                    crate::kv::WatchMessage::Compacted { .. } | crate::kv::WatchMessage::Broken,
                )
                | None => {
                    self.watch = None;
                    self.snapshot = self.registry.units_snapshot(&self.names).await?;
                    self.watch().await?;
                    return Ok(());
                }
            }
        }
    }

    /// Watches everything after the snapshot's revision.
    async fn watch(&mut self) -> Result<()> {
        let watch = self
            .registry
            .kv()
            .watch(
                self.registry.keys().prefix(),
                true,
                self.snapshot.revision + 1,
            )
            .await
            .map_err(RegistryError::kv("watching units"))?;
        self.watch = Some(watch);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{Hook, Hooked, KvError, MemKv, Request};
    use crate::registry::{READ_RETRIES, encode, put};
    use crate::{MachineRole, ScheduleEntry, UnitsRole};
    use fleet_core::{MachineInfo, SystemdState, UnitFile};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    fn name(s: &str) -> UnitName {
        s.parse().unwrap()
    }

    fn machine(s: &str) -> MachineId {
        s.parse().unwrap()
    }

    /// Units `a` (launched, on m1), `b` (inactive, unscheduled, m2 still reports it) and
    /// `c` (launched, on m2); every machine reports what it runs.
    async fn registry() -> Registry<MemKv> {
        let reg = Registry::new(MemKv::new(), "/few-test/");
        let file = UnitFile::parse(b"[Service]\nExecStart=/bin/true\n").unwrap();
        let units = UnitsRole::new(reg.clone());
        for (n, desired) in [
            ("a.service", DesiredState::Launched),
            ("b.service", DesiredState::Inactive),
            ("c.service", DesiredState::Launched),
        ] {
            units.create_unit(&name(n), &file, desired).await.unwrap();
        }
        let keys = reg.keys();
        let mut ops = Vec::new();
        for (n, m) in [("a.service", "m1"), ("c.service", "m2")] {
            let entry = ScheduleEntry {
                name: name(n),
                machine: machine(m),
                hash: file.hash(),
                desired: DesiredState::Launched,
                restart: 0,
                no_restart: false,
                placement: 0,
            };
            ops.push(put(
                keys.schedule(&entry.machine, &entry.name),
                encode(&entry),
            ));
            ops.push(put(keys.placement(&entry.name, &entry.machine), Vec::new()));
        }
        let txn = Txn {
            compares: vec![],
            success: ops,
            failure: vec![],
        };
        reg.kv().txn(txn).await.unwrap();
        for (m, running) in [
            ("m1", &["a.service"][..]),
            ("m2", &["b.service", "c.service"]),
        ] {
            let info = MachineInfo {
                id: machine(m),
                public_ip: String::new(),
                metadata: Default::default(),
                version: "test".into(),
                disable_engine: false,
                api: String::new(),
                fence_at: None,
            };
            let role = MachineRole::new(reg.clone(), machine(m));
            let presence = role
                .register(&info, Duration::from_secs(3600), None)
                .await
                .unwrap();
            for n in running {
                let state = UnitStateRecord {
                    name: name(n),
                    machine: machine(m),
                    hash: Some(file.hash()),
                    systemd: SystemdState {
                        load: "loaded".into(),
                        active: "active".into(),
                        sub: "running".into(),
                    },
                    drop_ins: vec![],
                    restart: 0,
                    restart_pending: false,
                    restarts: 0,
                    since: None,
                    exit: None,
                };
                role.publish_state(&presence, &state).await.unwrap();
            }
        }
        reg
    }

    #[tokio::test(start_paused = true)]
    async fn a_few_units_read_as_the_whole_snapshot_has_them() {
        let reg = registry().await;
        let full = reg.snapshot().await.unwrap();
        let names = BTreeSet::from([name("a.service"), name("b.service"), name("gone.service")]);
        let few = reg.units_snapshot(&names).await.unwrap();
        for n in &names {
            assert_eq!(few.units.get(n), full.units.get(n), "{n}");
            assert_eq!(few.schedule.get(n), full.schedule.get(n), "{n}");
            assert_eq!(few.states.get(n), full.states.get(n), "{n}");
            assert_eq!(few.unscheduled.get(n), full.unscheduled.get(n), "{n}");
        }
        assert!(
            few.states.contains_key(&name("b.service")),
            "an inactive unit's state on a machine it is no longer placed on"
        );
        assert!(!few.units.contains_key(&name("c.service")));
        assert!(!few.states.contains_key(&name("c.service")));
        assert!(few.machines.contains_key(&machine("m1")));
    }

    /// Times out the first `late` transactions, as an etcd answering past the deadline would.
    #[derive(Clone)]
    struct Late(Arc<AtomicU32>);

    impl Hook for Late {
        async fn before(&self, request: Request<'_>) -> std::result::Result<(), KvError> {
            let late = matches!(request, Request::Txn(_))
                && self
                    .0
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok();
            match late {
                true => Err(KvError::Timeout(Duration::from_secs(3), "test".into())),
                false => Ok(()),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_past_its_deadline_is_asked_again_twice_once_etcd_answered_a_piece_of_it() {
        let reg = registry().await;
        let names = BTreeSet::from([name("a.service"), name("c.service")]);
        let want = reg.units_snapshot(&names).await.unwrap();
        let late = |n: u32| {
            let kv = Hooked {
                inner: reg.kv().clone(),
                hook: Late(Arc::new(AtomicU32::new(n))),
            };
            Registry::new(kv, "/few-test/")
        };
        // An etcd that has answered none of the read may be hung: no second ask.
        let err = late(1).units_snapshot(&names).await;
        assert!(err.unwrap_err().to_string().contains("reading units"));
        let err = late(1).units_named(&names).await;
        assert!(err.unwrap_err().to_string().contains("reading unit"));
        // One that answered the listing of the machines is slow: the rest is asked again.
        let states = late(READ_RETRIES).states_of(&names).await.unwrap();
        assert_eq!(
            states.items.len(),
            want.states.values().map(|s| s.len()).sum::<usize>()
        );
        let err = late(READ_RETRIES + 1).states_of(&names).await;
        assert!(err.unwrap_err().to_string().contains("reading units"));
    }

    #[tokio::test(start_paused = true)]
    async fn the_states_of_a_unit_are_read_on_every_machine() {
        let reg = registry().await;
        let listing = reg
            .states_of(&BTreeSet::from([name("b.service"), name("c.service")]))
            .await
            .unwrap();
        let found: Vec<(String, String)> = listing
            .items
            .iter()
            .map(|s| (s.name.to_string(), s.machine.to_string()))
            .collect();
        assert_eq!(
            found,
            [
                ("b.service".to_owned(), "m2".to_owned()),
                ("c.service".to_owned(), "m2".to_owned())
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_units_view_wakes_on_its_units_changes_only() {
        let reg = registry().await;
        let mut view = UnitsView::start(reg.clone(), BTreeSet::from([name("a.service")]))
            .await
            .unwrap();
        let file = UnitFile::parse(b"[Service]\nExecStart=/bin/false\n").unwrap();
        let units = UnitsRole::new(reg.clone());
        units
            .create_unit(&name("other.service"), &file, DesiredState::Launched)
            .await
            .unwrap();
        let woken = tokio::time::timeout(Duration::from_secs(1), view.changed()).await;
        assert!(woken.is_err(), "woken by another unit");
        let a = units.unit(&name("a.service")).await.unwrap().unwrap();
        units.set_desired(&a, DesiredState::Loaded).await.unwrap();
        tokio::time::timeout(Duration::from_secs(1), view.changed())
            .await
            .expect("woken by its unit")
            .unwrap();
        assert_eq!(
            view.snapshot().units[&name("a.service")].desired(),
            DesiredState::Loaded
        );
    }
}
