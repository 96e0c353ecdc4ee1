//! Engine leadership and the writes only a leader can make.
//!
//! The leader holds `P/engine/leader` (its machine ID) on a lease of its own. Every engine
//! write is a transaction whose first compares are that key's value *and* its lease, so a
//! deposed leader (lease expired, key taken, or a newer incarnation of the same machine
//! holding it) cannot schedule anything. This module decides nothing about scheduling.

use crate::events::log::{EventConfig, EventLog, EventStats};
use crate::keys::EventSource;
use fleet_core::{MachineId, UnitName};
use futures::{StreamExt, stream};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use tracing::{debug, warn};

use crate::carried::{CarriedTexts, encode_entry};
use crate::error::{RegistryError, Result};
use crate::keys::{Keys, StrayScheduleKey};
use crate::kv::{
    CmpOp, CmpTarget, Compare, KeyValue, Kv, KvError, LeaseId, MAX_TXN_OPS, Revision, Txn, TxnOp,
    TxnOpResponse,
};
use crate::per_machine::PerMachine;
use crate::records::{LeftCopy, MoveRecord, ScheduleEntry};
use crate::registry::{Registry, encode};
use crate::snapshot::Snapshot;
use crate::watch::WatchHints;

mod stray;
pub use stray::LeaderKey;

/// Guards an engine write: it applies only while `key` still holds `value` (our leadership).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub key: String,
    pub value: String,
}

/// The engine's role: campaigns for `P/engine/leader`. Every other engine write (schedules,
/// unschedulable reasons, the disruption notice, drain moves) goes through the [`Leadership`] a campaign
/// wins, so it is fenced.
#[derive(Debug, Clone)]
pub struct EngineRole<K> {
    registry: Registry<K>,
}

/// Proof of leadership. Writes made through it are fenced by the leader key and its lease.
#[derive(Debug, Clone)]
pub struct Leadership<K> {
    registry: Registry<K>,
    pub lease: LeaseId,
    pub fence: Fence,
}

/// One change an engine writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineWrite {
    /// Write (or rewrite) an entry of a machine's schedule.
    Schedule(ScheduleEntry),
    /// Delete an entry of a machine's schedule.
    Unschedule { machine: MachineId, unit: UnitName },
    /// Delete an entry of a machine's schedule whose copy may still run there, and record at
    /// `P/left/<unit>/<machine>`, in the same transaction, that the unit left it and what the
    /// machine had published of the copy: the placement history a new leader reads, so that
    /// copy still holds the unit's next placement back until it has stopped.
    Leave {
        machine: MachineId,
        unit: UnitName,
        copy: LeftCopy,
    },
    /// Rewrite that record: the machine has published the copy since (see [`LeftCopy`]).
    Record {
        unit: UnitName,
        machine: MachineId,
        copy: LeftCopy,
    },
    /// Withdraw that record: the copy stopped, the machine is gone, or the unit is back.
    Forget { unit: UnitName, machine: MachineId },
    /// Publish why a unit cannot be placed, at `P/unscheduled/<unit>`.
    Unschedulable { unit: UnitName, reason: String },
    /// Withdraw that reason.
    ClearUnschedulable { unit: UnitName },
    /// Publish why rescheduling is held (`Some`) at `P/engine/disruption`, or withdraw it.
    Disruption { notice: Option<String> },
    /// Record at `P/moving/<unit>` that the unit is being moved off a drained machine.
    Moving(MoveRecord),
    /// Withdraw that record: the move is over (or no longer wanted).
    Moved { unit: UnitName },
    /// Delete a key under `P/schedule/` that names no entry (issue 38): left alone it would
    /// be warned about by every reader forever.
    DeleteStray(StrayScheduleKey),
}

/// Engine transactions of one kind in flight at once (see [`Leadership::write`]). More is
/// not faster: at 32, in the 100,000-unit launch on 5,000 machines, the engine's bursts of
/// 128-operation transactions pushed 21,777 of the agents' 1 s writes past their deadline
/// (98–2,334 at 8), each sent again, and the launch took 78 s (docs/benchmarks.md, *etcd's
/// profile*).
pub const WRITES_IN_FLIGHT: usize = 8;

impl EngineWrite {
    /// Which writes are independent of each other and may land in any order: every write
    /// of one kind touches other keys than the rest of its kind. A rewritten entry and a new
    /// one are one kind.
    fn kind(&self) -> u8 {
        match self {
            EngineWrite::Moving(_) => 0,
            EngineWrite::Unschedule { .. }
            | EngineWrite::Leave { .. }
            | EngineWrite::DeleteStray(_) => 1,
            // A record is forgotten only once its copy has stopped (or its machine is gone):
            // it may share the transactions of the schedule entries that this allows.
            EngineWrite::Schedule(_) | EngineWrite::Record { .. } | EngineWrite::Forget { .. } => 2,
            EngineWrite::Unschedulable { .. } | EngineWrite::ClearUnschedulable { .. } => 3,
            EngineWrite::Moved { .. } => 4,
            EngineWrite::Disruption { .. } => 5,
        }
    }
}

impl<K: Kv> EngineRole<K> {
    pub fn new(registry: Registry<K>) -> EngineRole<K> {
        EngineRole { registry }
    }

    /// The writer of the engine's events (`P/event/engine/`, issue 41). Not fenced: an
    /// event says what a leader did after its fenced write landed.
    pub fn event_log(&self, cfg: EventConfig, stats: EventStats) -> EventLog {
        EventLog::start(
            self.registry.clone(),
            EventSource::Engine,
            cfg,
            stats,
            false,
        )
    }

    /// Tries to become the engine leader: creates the leader key on a new lease of `ttl` if
    /// there is none. A key already holding `me` (our own from before a restart) is taken
    /// over onto the new lease. `None`: another machine leads.
    pub async fn campaign(&self, me: &MachineId, ttl: Duration) -> Result<Option<Leadership<K>>> {
        let lease = self
            .registry
            .kv()
            .grant(ttl)
            .await
            .map_err(RegistryError::kv("granting engine lease"))?;
        match self.claim(me, lease).await {
            Ok(true) => Ok(Some(self.leadership(me, lease))),
            Ok(false) => {
                // Best effort: an unused lease expires by itself anyway.
                let _ = self.registry.kv().revoke(lease).await;
                Ok(None)
            }
            Err(err) => {
                let _ = self.registry.kv().revoke(lease).await;
                Err(err)
            }
        }
    }

    /// Puts `me` on the leader key with `lease` if the key is absent or already ours.
    async fn claim(&self, me: &MachineId, lease: LeaseId) -> Result<bool> {
        let key = self.registry.keys().leader();
        let put = TxnOp::Put {
            key: key.clone(),
            value: me.as_str().as_bytes().to_vec(),
            lease: Some(lease),
        };
        let create = Txn {
            compares: vec![Compare::absent(&key)],
            success: vec![put.clone()],
            failure: vec![TxnOp::Get {
                key: key.clone(),
                prefix: false,
            }],
        };
        let res = self
            .registry
            .txn(create, "campaigning for engine leadership")
            .await?;
        if res.succeeded {
            return Ok(true);
        }
        let holder = match res.responses.first() {
            Some(TxnOpResponse::Get(kvs)) => kvs.first().cloned(),
            Some(TxnOpResponse::Put | TxnOpResponse::Delete(_)) | None => None,
        };
        let Some(holder) = holder else {
            return Ok(false);
        };
        if holder.value == me.as_str().as_bytes() {
            debug!(machine = %me, "taking over our own engine leader key");
        } else if let Some(why) = stray::stale(&holder) {
            warn!(
                holder = %String::from_utf8_lossy(&holder.value),
                reason = why,
                "taking over a stale engine leader key"
            );
        } else {
            return Ok(false);
        }
        let take_over = Txn {
            compares: vec![Compare::mod_revision(&key, holder.mod_revision)],
            success: vec![put],
            failure: vec![],
        };
        let res = self
            .registry
            .txn(take_over, "taking over engine leadership")
            .await?;
        Ok(res.succeeded)
    }

    /// The leadership `me` holds (or held) on `lease`, without campaigning: a test writes
    /// through it exactly what that engine would, fence included, e.g. after it was deposed.
    #[cfg(feature = "test-etcd")]
    pub fn leadership_of(&self, me: &MachineId, lease: LeaseId) -> Leadership<K> {
        self.leadership(me, lease)
    }

    fn leadership(&self, me: &MachineId, lease: LeaseId) -> Leadership<K> {
        Leadership {
            registry: self.registry.clone(),
            lease,
            fence: Fence {
                key: self.registry.keys().leader(),
                value: me.as_str().to_owned(),
            },
        }
    }
}

/// Shared reads of the engine keys: followers and fleetctl read who leads and why it holds.
impl<K: Kv> Registry<K> {
    /// The current engine leader, if any.
    pub async fn leader(&self) -> Result<Option<MachineId>> {
        Ok(self.read_leader().await?.0)
    }

    /// The current leader, and a watch that wakes on every change of the leader key after
    /// that read (followers wait on it instead of polling).
    pub async fn watch_leader(&self) -> Result<(Option<MachineId>, WatchHints)> {
        let (leader, revision) = self.read_leader().await?;
        let hints = WatchHints::start(self.kv().clone(), self.keys().leader(), revision + 1);
        Ok((leader, hints))
    }

    /// Why the engine holds rescheduling, if it does (see [`EngineWrite::Disruption`]).
    pub async fn disruption(&self) -> Result<Option<String>> {
        let res = self
            .kv()
            .range(&self.keys().disruption(), false, None)
            .await
            .map_err(RegistryError::kv("reading engine disruption notice"))?;
        Ok(res
            .kvs
            .first()
            .map(|kv| String::from_utf8_lossy(&kv.value).into_owned()))
    }

    async fn read_leader(&self) -> Result<(Option<MachineId>, Revision)> {
        let key = self.keys().leader();
        let res = self
            .kv()
            .range(&key, false, None)
            .await
            .map_err(RegistryError::kv("reading engine leader"))?;
        let leader = res
            .kvs
            .first()
            .map(|kv| {
                let text = String::from_utf8_lossy(&kv.value);
                text.parse::<MachineId>()
                    .map_err(|e| RegistryError::Corrupt {
                        key: key.clone(),
                        detail: e.to_string(),
                    })
            })
            .transpose()?;
        Ok((leader, res.revision))
    }
}

impl<K: Kv> Leadership<K> {
    /// The transaction guard: the leader key holds our ID on our lease.
    fn compares(&self) -> Vec<Compare> {
        vec![
            Compare::value(&self.fence.key, self.fence.value.as_bytes().to_vec()),
            Compare {
                key: self.fence.key.clone(),
                prefix: false,
                op: CmpOp::Equal,
                target: CmpTarget::Lease(self.lease.0),
            },
        ]
    }

    /// Refreshes the lease (a lease call, no read). `LostLeadership` when it has expired. A leader that also [`watch`](Self::watch)es its key learns of the key's loss
    /// from the watch, so an idle leader reads nothing.
    pub async fn refresh(&self) -> Result<()> {
        self.refresh_within(Duration::ZERO).await
    }

    /// [`refresh`](Self::refresh), waiting up to `within` for etcd's answer, never less than
    /// the request deadline ([`Kv::keep_alive_within`]).
    pub async fn refresh_within(&self, within: Duration) -> Result<()> {
        match self
            .registry
            .kv()
            .keep_alive_within(self.lease, within)
            .await
        {
            Ok(()) => Ok(()),
            Err(KvError::LeaseNotFound(_)) => Err(RegistryError::LostLeadership),
            Err(err) => Err(RegistryError::kv("renewing engine lease")(err)),
        }
    }

    /// Reads the leader key once: the revision of the read if it still holds our ID on our
    /// lease, `LostLeadership` if it was deleted or taken.
    pub async fn check(&self) -> Result<Revision> {
        let res = self
            .registry
            .kv()
            .range(&self.fence.key, false, None)
            .await
            .map_err(RegistryError::kv("checking engine leadership"))?;
        match res.kvs.first() {
            Some(k) if k.value == self.fence.value.as_bytes() && k.lease == self.lease.0 => {
                Ok(res.revision)
            }
            Some(_) | None => Err(RegistryError::LostLeadership),
        }
    }

    /// Checks the leader key once, then watches it: the hints wake on every change of the
    /// key after that read (a deletion, a takeover, the lease's expiry) and when the watch
    /// broke, so the holder [`check`](Self::check)s again only then.
    pub async fn watch(&self) -> Result<WatchHints> {
        let revision = self.check().await?;
        Ok(WatchHints::start(
            self.registry.kv().clone(),
            self.fence.key.clone(),
            revision + 1,
        ))
    }

    /// Gives leadership up at once (another engine need not wait for the lease to expire):
    /// deletes the key if it is still ours, then revokes the lease.
    pub async fn resign(self) -> Result<()> {
        let kv = self.registry.kv();
        let txn = Txn {
            compares: self.compares(),
            success: vec![TxnOp::Delete {
                key: self.fence.key.clone(),
                prefix: false,
            }],
            failure: vec![],
        };
        kv.txn(txn)
            .await
            .map_err(RegistryError::kv("resigning engine leadership"))?;
        kv.revoke(self.lease)
            .await
            .map_err(RegistryError::kv("revoking engine lease"))
    }

    /// Applies `writes`, fenced by this leadership, in transactions of at most
    /// [`MAX_TXN_OPS`] operations (a schedule write is two: the entry and its placement, kept
    /// in one transaction; a [`Leave`](EngineWrite::Leave) three, with its record). Returns the highest revision a
    /// transaction that changed something landed at (`None` if none did: nothing to write,
    /// or only deletes of keys already gone). A reader of the registry's watch that has
    /// applied that revision sees every write; a transaction that changed nothing has no
    /// event, and its revision may be one that no event of the registry's prefix reaches.
    ///
    /// Consecutive writes of one kind (see [`EngineWrite::kind`]) touch distinct keys and
    /// are independent of each other: their transactions go [`WRITES_IN_FLIGHT`] at a time,
    /// and a kind starts only once every transaction of the kind before it has landed. At
    /// 100,000 units one at a time was 1,563 round trips queued behind the agents' writes,
    /// most of the two minutes between the last unit written and the last one scheduled
    /// (issue 19). `LostLeadership` if a fence failed: of that kind, any of its transactions
    /// may have landed, and no later kind was sent (callers order the kinds so that this is
    /// safe, removals first).
    pub async fn write(&self, writes: &[EngineWrite]) -> Result<Option<Revision>> {
        self.write_carrying(writes, &CarriedTexts::new()).await
    }

    /// As [`write`](Self::write), each schedule entry whose file's text is in `texts`
    /// carrying it (see [`crate::carried`]): its agent then need not read the file.
    pub async fn write_carrying(
        &self,
        writes: &[EngineWrite],
        texts: &CarriedTexts,
    ) -> Result<Option<Revision>> {
        let mut revision = None;
        for run in writes.chunk_by(|a, b| a.kind() == b.kind()) {
            let landed = self.send_all(self.transactions(run, texts)).await?;
            revision = landed.into_iter().flatten().max().max(revision);
        }
        Ok(revision)
    }

    /// The operations of `writes` cut into transactions of at most [`MAX_TXN_OPS`], the
    /// operations of one write never split.
    fn transactions(&self, writes: &[EngineWrite], texts: &CarriedTexts) -> Vec<Vec<TxnOp>> {
        let mut txns = Vec::new();
        let mut ops = Vec::with_capacity(MAX_TXN_OPS);
        for write in writes {
            let before = ops.len();
            self.ops(write, texts, &mut ops);
            if ops.len() > MAX_TXN_OPS {
                let rest = ops.split_off(before);
                txns.push(std::mem::replace(&mut ops, rest));
            }
        }
        if !ops.is_empty() {
            txns.push(ops);
        }
        txns
    }

    /// Repairs the placement mirror from the schedule in `snapshot` (a new leader's view):
    /// writes the placements missing for its entries, deletes those without an entry
    /// (written before the mirror existed, or by a registry edited by hand). One paged read of
    /// `P/placement/` and, when everything is in order, nothing written. Returns how many
    /// placements were written or deleted.
    pub async fn repair_placements(&self, snapshot: &Snapshot) -> Result<usize> {
        let keys = self.registry.keys();
        let read = self
            .registry
            .kv()
            .range(&keys.placements(), true, None)
            .await
            .map_err(RegistryError::kv("reading placements"))?;
        let ops = placement_repairs(keys, &snapshot.schedule, &read.kvs);
        let repaired = ops.len();
        // Each placement is its own key: any order will do.
        let txns = ops.chunks(MAX_TXN_OPS).map(<[TxnOp]>::to_vec).collect();
        self.send_all(txns).await?;
        Ok(repaired)
    }

    /// Sends `txns`, each fenced by this leadership, [`WRITES_IN_FLIGHT`] at a time, in any
    /// order; the revisions they landed at (`None` for one that changed nothing), or the
    /// first error.
    async fn send_all(&self, txns: Vec<Vec<TxnOp>>) -> Result<Vec<Option<Revision>>> {
        // Owned transactions moved into each future: a future borrowing them would not be
        // `Send` for every lifetime, which the engine's spawned task needs.
        let landed: Vec<Result<Option<Revision>>> = stream::iter(txns)
            .map(|ops| async move { self.fenced(ops).await })
            .buffer_unordered(WRITES_IN_FLIGHT)
            .collect()
            .await;
        landed.into_iter().collect()
    }

    /// Sends `ops` in one transaction fenced by this leadership; the revision it landed at,
    /// if it changed anything.
    async fn fenced(&self, ops: Vec<TxnOp>) -> Result<Option<Revision>> {
        let txn = Txn {
            compares: self.compares(),
            success: ops,
            failure: vec![],
        };
        let res = self.registry.txn(txn, "writing engine decisions").await?;
        if !res.succeeded {
            return Err(RegistryError::LostLeadership);
        }
        let changed = res.responses.iter().any(|r| match r {
            TxnOpResponse::Put => true,
            TxnOpResponse::Delete(deleted) => *deleted > 0,
            TxnOpResponse::Get(_) => false,
        });
        Ok(changed.then_some(res.revision))
    }

    /// The operations of `write`, pushed onto `ops`.
    fn ops(&self, write: &EngineWrite, texts: &CarriedTexts, ops: &mut Vec<TxnOp>) {
        let keys = self.registry.keys();
        let delete = |key| TxnOp::Delete { key, prefix: false };
        match write {
            EngineWrite::Schedule(entry) => {
                let text = texts.get(&entry.hash).map(String::as_str);
                ops.push(TxnOp::Put {
                    key: keys.schedule(&entry.machine, &entry.name),
                    value: encode_entry(entry, text),
                    lease: None,
                });
                ops.push(placement_put(keys, &entry.name, &entry.machine));
            }
            EngineWrite::Unschedule { machine, unit } => {
                ops.push(delete(keys.schedule(machine, unit)));
                ops.push(delete(keys.placement(unit, machine)));
            }
            EngineWrite::Leave {
                machine,
                unit,
                copy,
            } => {
                ops.push(delete(keys.schedule(machine, unit)));
                ops.push(delete(keys.placement(unit, machine)));
                ops.push(TxnOp::Put {
                    key: keys.left(unit, machine),
                    value: copy.value().to_vec(),
                    lease: None,
                });
            }
            EngineWrite::Record {
                unit,
                machine,
                copy,
            } => ops.push(TxnOp::Put {
                key: keys.left(unit, machine),
                value: copy.value().to_vec(),
                lease: None,
            }),
            EngineWrite::Forget { unit, machine } => ops.push(delete(keys.left(unit, machine))),
            EngineWrite::Unschedulable { unit, reason } => ops.push(TxnOp::Put {
                key: keys.unscheduled(unit),
                value: reason.as_bytes().to_vec(),
                lease: None,
            }),
            EngineWrite::ClearUnschedulable { unit } => ops.push(delete(keys.unscheduled(unit))),
            EngineWrite::Disruption {
                notice: Some(notice),
            } => ops.push(TxnOp::Put {
                key: keys.disruption(),
                value: notice.as_bytes().to_vec(),
                lease: None,
            }),
            EngineWrite::Disruption { notice: None } => ops.push(delete(keys.disruption())),
            EngineWrite::Moving(record) => ops.push(TxnOp::Put {
                key: keys.moving(&record.unit),
                value: encode(record),
                lease: None,
            }),
            EngineWrite::Moved { unit } => ops.push(delete(keys.moving(unit))),
            EngineWrite::DeleteStray(key) => ops.push(delete(key.as_str().to_owned())),
        }
    }
}

fn placement_put(keys: &Keys, unit: &UnitName, machine: &MachineId) -> TxnOp {
    TxnOp::Put {
        key: keys.placement(unit, machine),
        value: Vec::new(),
        lease: None,
    }
}

/// What makes the placements `stored` mirror `schedule` exactly: puts of the missing ones,
/// deletes of the others (an unparsable placement key is deleted too: only the engine
/// writes there).
fn placement_repairs(
    keys: &Keys,
    schedule: &BTreeMap<UnitName, PerMachine<ScheduleEntry>>,
    stored: &[KeyValue],
) -> Vec<TxnOp> {
    let mut present: BTreeSet<&str> = stored.iter().map(|kv| kv.key.as_str()).collect();
    let mut ops = Vec::new();
    for (unit, machines) in schedule {
        for machine in machines.keys() {
            let key = keys.placement(unit, machine);
            if !present.remove(key.as_str()) {
                ops.push(placement_put(keys, unit, machine));
            }
        }
    }
    ops.extend(present.into_iter().map(|key| TxnOp::Delete {
        key: key.to_owned(),
        prefix: false,
    }));
    ops
}

#[cfg(test)]
mod tests;
