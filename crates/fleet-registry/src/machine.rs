//! The role of one machine: its presence (`P/machine/<id>` on its lease) and the unit states
//! it publishes (`P/unit-state/<id>/<unit>`, on the same lease), written by that machine's fleetd;
//! and the reads its agent needs: its own schedule (`P/schedule/<id>/`) and unit files.
//!
//! A handle is made for one [`MachineId`] and builds every key it writes from it: a record
//! naming another machine is refused ([`RegistryError::ForeignMachine`]) before anything is
//! sent, so a machine cannot publish for, or register as, another one.

use crate::events::log::{EventConfig, EventLog, EventStats};
use crate::keys::EventSource;
use fleet_core::{MachineId, MachineInfo, UnitFile, UnitHash, UnitName};
use std::time::Duration;

use crate::carried::{CarriedFile, carried_file};
use crate::error::{RegistryError, Result};
use crate::keys::Key;
use crate::kv::{
    CmpOp, CmpTarget, Compare, Event, EventKind, KeyValue, Kv, LeaseId, MAX_TXN_OPS, Revision, Txn,
    TxnOp, TxnOpResponse,
};
use crate::read::{self, Listing};
use crate::records::{ScheduleEntry, UnitStateRecord};
use crate::registry::{Registry, delete, encode};
use crate::watch::WatchHints;

mod batch;
pub use batch::Batch;

/// A machine's presence: the lease its record and published states hang on. Only
/// [`MachineRole::register`] makes one, so a state can be published only on a lease the
/// machine's own record was registered on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Presence {
    lease: LeaseId,
    resumed: bool,
}

impl Presence {
    /// The lease the machine's record and its published states live on.
    pub fn lease(&self) -> LeaseId {
        self.lease
    }

    /// True when a restarted fleetd took over its predecessor's still-live lease.
    pub fn resumed(&self) -> bool {
        self.resumed
    }
}

/// One change of a machine's schedule, as its watch delivered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScheduleChange {
    /// The entry was written (created or changed), with the file it carries.
    Put(ScheduleEntry, CarriedFile),
    /// The unit's entry was deleted.
    Removed(UnitName),
    /// A value or key that does not read as this machine's entry: re-read the schedule,
    /// which says what to skip.
    Unreadable,
}

/// What one event of [`MachineRole::watch_peers`] did to the machines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerChange {
    /// A machine registered (or re-registered) with this record.
    Put(MachineInfo),
    /// A machine's presence is gone.
    Removed(MachineId),
    /// A value or key that does not read as a presence: re-read the peers.
    Unreadable,
}

/// Writes one machine's presence and unit states, and reads its schedule.
#[derive(Debug, Clone)]
pub struct MachineRole<K> {
    registry: Registry<K>,
    machine: MachineId,
}

impl<K: Kv> MachineRole<K> {
    pub fn new(registry: Registry<K>, machine: MachineId) -> MachineRole<K> {
        MachineRole { registry, machine }
    }

    /// The writer of this machine's agent events (`P/event/machine/<M>/`, issue 41), which
    /// takes its lease at once, so that the agent's events ride in its state writes from the
    /// first ([`EventSink`](crate::EventSink)).
    pub fn event_log(&self, cfg: EventConfig, stats: EventStats) -> EventLog {
        let source = EventSource::Machine(self.machine.clone());
        EventLog::start(self.registry.clone(), source, cfg, stats, true)
    }

    /// The machine this handle writes for.
    pub fn machine(&self) -> &MachineId {
        &self.machine
    }

    /// Refuses a record of another machine than ours.
    fn own(&self, other: &MachineId) -> Result<()> {
        if *other == self.machine {
            return Ok(());
        }
        Err(RegistryError::ForeignMachine {
            role: self.machine.clone(),
            other: other.clone(),
        })
    }

    // ---- reads ----------------------------------------------------------------------------

    /// Every readable entry of this machine's schedule, at one revision, with the file
    /// each carries.
    pub async fn schedule(&self) -> Result<Listing<Vec<(ScheduleEntry, CarriedFile)>>> {
        let keys = self.registry.keys();
        let res = self
            .registry
            .kv()
            .range(&keys.machine_schedule(&self.machine), true, None)
            .await
            .map_err(RegistryError::kv("reading machine schedule"))?;
        let mut skipped = Vec::new();
        let read = |kv: &KeyValue| {
            read::schedule_entry(keys, kv).map(|e| {
                let file = carried_file(&e, kv);
                (e, file)
            })
        };
        let items = read::all(&res.kvs, read, &mut skipped);
        Ok(Listing {
            revision: res.revision,
            items,
            skipped,
        })
    }

    /// A watch that wakes on every change of this machine's schedule from revision `from` on
    /// (usually the revision just read + 1), keeping the events: read each with
    /// [`schedule_change`](Self::schedule_change).
    pub fn watch_schedule(&self, from: Revision) -> WatchHints {
        let prefix = self.registry.keys().machine_schedule(&self.machine);
        WatchHints::with_events(self.registry.kv().clone(), prefix, from)
    }

    /// What one event of [`watch_schedule`](Self::watch_schedule) did to this machine's
    /// schedule.
    pub fn schedule_change(&self, event: &Event) -> ScheduleChange {
        let keys = self.registry.keys();
        match event.kind {
            EventKind::Put => match read::schedule_entry(keys, &event.kv) {
                Ok(entry) if entry.machine == self.machine => {
                    let file = carried_file(&entry, &event.kv);
                    ScheduleChange::Put(entry, file)
                }
                Ok(_) | Err(_) => ScheduleChange::Unreadable,
            },
            EventKind::Delete => match Key::parse(keys, &event.kv.key) {
                Some(Key::Schedule { machine, unit }) if machine == self.machine => {
                    ScheduleChange::Removed(unit)
                }
                Some(_) | None => ScheduleChange::Unreadable,
            },
        }
    }

    /// See [`Registry::file`].
    pub async fn file(&self, hash: &UnitHash) -> Result<Option<UnitFile>> {
        self.registry.file(hash).await
    }

    /// The files of `hashes`, at most [`MAX_TXN_OPS`], in one request (see
    /// [`Registry::files_named`]). Any number: [`files_batched`](Self::files_batched).
    pub async fn files(
        &self,
        hashes: &[UnitHash],
    ) -> Result<Vec<(UnitHash, Result<Option<UnitFile>>)>> {
        self.registry.files_named(hashes).await
    }

    /// The readable states this machine has published (under any lease still alive).
    pub async fn published_states(&self) -> Result<Listing<Vec<UnitStateRecord>>> {
        self.registry.machine_states(&self.machine).await
    }

    /// Every other machine's presence record (without its dynamic metadata): the peers this
    /// machine asks whether they reach etcd when it cannot (`fleet_agent::witness`).
    pub async fn peers(&self) -> Result<Vec<MachineInfo>> {
        Ok(self.peers_at().await?.items)
    }

    /// As [`peers`](Self::peers), with the revision they were read at.
    pub async fn peers_at(&self) -> Result<Listing<Vec<MachineInfo>>> {
        let keys = self.registry.keys();
        let res = self
            .registry
            .kv()
            .range(&keys.machines(), true, None)
            .await
            .map_err(RegistryError::kv("listing the peer machines"))?;
        let mut skipped = Vec::new();
        let mut peers = read::all(&res.kvs, |kv| read::machine(keys, kv), &mut skipped);
        peers.retain(|m| m.id != self.machine);
        Ok(Listing {
            items: peers,
            revision: res.revision,
            skipped,
        })
    }

    /// A watch that wakes on every change of the machines' presences from revision `from`
    /// on, keeping the events: read each with [`peer_change`](Self::peer_change).
    pub fn watch_peers(&self, from: Revision) -> WatchHints {
        let prefix = self.registry.keys().machines();
        WatchHints::with_events(self.registry.kv().clone(), prefix, from)
    }

    /// What one event of [`watch_peers`](Self::watch_peers) did.
    pub fn peer_change(&self, event: &Event) -> PeerChange {
        let keys = self.registry.keys();
        match event.kind {
            EventKind::Put => match read::machine(keys, &event.kv) {
                Ok(m) => PeerChange::Put(m),
                Err(_) => PeerChange::Unreadable,
            },
            EventKind::Delete => match Key::parse(keys, &event.kv.key) {
                Some(Key::Machine(m)) => PeerChange::Removed(m),
                Some(_) | None => PeerChange::Unreadable,
            },
        }
    }

    // ---- presence -------------------------------------------------------------------------

    /// Registers the machine's presence (`info` is its record) on a new lease of `ttl`. If the
    /// record already exists on `previous` (our own lease from before a restart, still alive),
    /// it is taken over and the units' published states survive; any other holder is a
    /// duplicate machine ID.
    pub async fn register(
        &self,
        info: &MachineInfo,
        ttl: Duration,
        previous: Option<LeaseId>,
    ) -> Result<Presence> {
        self.own(&info.id)?;
        let key = self.registry.keys().machine(&self.machine);
        if let Some(lease) = previous
            && let Some(presence) = self.resume_presence(info, lease).await?
        {
            return Ok(presence);
        }
        let lease = self
            .registry
            .kv()
            .grant(ttl)
            .await
            .map_err(RegistryError::kv("granting machine lease"))?;
        let txn = Txn {
            compares: vec![Compare::absent(&key)],
            success: vec![TxnOp::Put {
                key,
                value: encode(info),
                lease: Some(lease),
            }],
            failure: vec![],
        };
        let res = self.registry.txn(txn, "registering machine").await?;
        if !res.succeeded {
            // Best effort: the unused lease would expire by itself anyway.
            let _ = self.registry.kv().revoke(lease).await;
            return Err(RegistryError::DuplicateMachine(info.id.clone()));
        }
        Ok(Presence {
            lease,
            resumed: false,
        })
    }

    async fn resume_presence(
        &self,
        info: &MachineInfo,
        lease: LeaseId,
    ) -> Result<Option<Presence>> {
        if self.registry.kv().keep_alive(lease).await.is_err() {
            return Ok(None);
        }
        let presence = Presence {
            lease,
            resumed: true,
        };
        Ok(self
            .update_presence(&presence, info)
            .await?
            .then_some(presence))
    }

    /// Writes `info` as this machine's record, if the record is still on `presence`'s lease
    /// (false when it is not: the lease expired, or another holds the record).
    pub async fn update_presence(&self, presence: &Presence, info: &MachineInfo) -> Result<bool> {
        self.own(&info.id)?;
        let (key, lease) = (self.registry.keys().machine(&self.machine), presence.lease);
        let txn = Txn {
            compares: vec![Compare {
                key: key.clone(),
                prefix: false,
                op: CmpOp::Equal,
                target: CmpTarget::Lease(lease.0),
            }],
            success: vec![TxnOp::Put {
                key,
                value: encode(info),
                lease: Some(lease),
            }],
            failure: vec![],
        };
        let res = self.registry.txn(txn, "writing machine presence").await?;
        Ok(res.succeeded)
    }

    /// Refreshes a presence lease; `Kv { cause: LeaseNotFound }` once it has expired.
    pub async fn keep_alive(&self, presence: &Presence) -> Result<()> {
        self.registry
            .kv()
            .keep_alive(presence.lease)
            .await
            .map_err(RegistryError::kv("refreshing machine lease"))
    }

    /// [`keep_alive`](Self::keep_alive), waiting up to `within` for etcd's answer, never less
    /// than the request deadline ([`Kv::keep_alive_within`]).
    pub async fn keep_alive_within(&self, presence: &Presence, within: Duration) -> Result<()> {
        self.registry
            .kv()
            .keep_alive_within(presence.lease, within)
            .await
            .map_err(RegistryError::kv("refreshing machine lease"))
    }

    /// Ends a presence: the machine record and every state published under it vanish.
    pub async fn unregister(&self, presence: &Presence) -> Result<()> {
        self.registry
            .kv()
            .revoke(presence.lease)
            .await
            .map_err(RegistryError::kv("revoking machine lease"))
    }

    /// Publishes the state of a unit on this machine (`state.machine`), living as long as
    /// `presence`.
    pub async fn publish_state(&self, presence: &Presence, state: &UnitStateRecord) -> Result<()> {
        self.publish_states(presence, std::slice::from_ref(state))
            .await
    }

    /// Deletes this machine's state keys of the layout before issue 17
    /// (`P/state/<unit>/<id>`) for `names`: a fleetd upgraded in place resumes its old lease,
    /// which would keep them alive forever. Exact keys only, no range read (the machine's etcd
    /// role reads no other machine's keys). How many existed.
    pub async fn remove_legacy_states(&self, names: &[UnitName]) -> Result<i64> {
        let keys = self.registry.keys();
        let mut deleted = 0;
        for chunk in names.chunks(MAX_TXN_OPS) {
            let txn = Txn {
                compares: vec![],
                success: chunk
                    .iter()
                    .map(|name| delete(keys.legacy_state(name, &self.machine)))
                    .collect(),
                failure: vec![],
            };
            let res = self
                .registry
                .txn(txn, "removing old-layout unit states")
                .await?;
            deleted += res
                .responses
                .iter()
                .map(|r| match r {
                    TxnOpResponse::Delete(n) => *n,
                    TxnOpResponse::Put | TxnOpResponse::Get(_) => 0,
                })
                .sum::<i64>();
        }
        Ok(deleted)
    }

    /// Publishes `states` (at most [`MAX_TXN_OPS`], all of this machine) in one transaction
    /// on the presence's lease: with 100,000 units on 5,000 machines, one transaction per
    /// state was most of etcd's requests (docs/benchmarks.md, "Scale II"). Any number:
    /// [`publish_batch`](Self::publish_batch).
    pub async fn publish_states(
        &self,
        presence: &Presence,
        states: &[UnitStateRecord],
    ) -> Result<()> {
        self.publish_states_with(presence, states, Vec::new()).await
    }

    /// [`publish_states`](Self::publish_states) with `also` (the puts of events aboard) in
    /// the same transaction.
    pub(crate) async fn publish_states_with(
        &self,
        presence: &Presence,
        states: &[UnitStateRecord],
        also: Vec<TxnOp>,
    ) -> Result<()> {
        if states.len() + also.len() > MAX_TXN_OPS {
            return Err(RegistryError::TooManyChanges {
                count: states.len() + also.len(),
                max: MAX_TXN_OPS,
            });
        }
        let mut success = Vec::with_capacity(states.len() + also.len());
        for state in states {
            self.own(&state.machine)?;
            success.push(TxnOp::Put {
                key: self.registry.keys().state(&self.machine, &state.name),
                value: encode(state),
                lease: Some(presence.lease),
            });
        }
        success.extend(also);
        let txn = Txn {
            compares: vec![],
            success,
            failure: vec![],
        };
        self.registry.txn(txn, "publishing unit state").await?;
        Ok(())
    }

    /// Withdraws the states of `names` (at most [`MAX_TXN_OPS`]) in one transaction. Any
    /// number: [`withdraw_batch`](Self::withdraw_batch).
    pub async fn remove_states(&self, names: &[UnitName]) -> Result<()> {
        if names.len() > MAX_TXN_OPS {
            return Err(RegistryError::TooManyChanges {
                count: names.len(),
                max: MAX_TXN_OPS,
            });
        }
        let txn = Txn {
            compares: vec![],
            success: names
                .iter()
                .map(|name| delete(self.registry.keys().state(&self.machine, name)))
                .collect(),
            failure: vec![],
        };
        self.registry.txn(txn, "removing unit state").await?;
        Ok(())
    }

    /// Withdraws the state of `name` on this machine (only this machine's entry).
    pub async fn remove_state(&self, name: &UnitName) -> Result<()> {
        self.remove_states(std::slice::from_ref(name)).await
    }

    /// Deletes this machine's migration mark (`P/migrating/<id>`, written by
    /// `fleetctl import-fleet`): its agent has taken over the units fleet ran here, so the
    /// engine treats it as any machine from now on. Whether there was one.
    pub async fn end_migration(&self) -> Result<bool> {
        let txn = Txn {
            compares: vec![],
            success: vec![delete(self.registry.keys().migrating(&self.machine))],
            failure: vec![],
        };
        let res = self
            .registry
            .txn(txn, "ending this machine's migration")
            .await?;
        Ok(res
            .responses
            .iter()
            .any(|r| matches!(r, TxnOpResponse::Delete(n) if *n > 0)))
    }
}
