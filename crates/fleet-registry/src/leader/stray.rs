//! A leader key that leads nothing (issue 38, item 3): one stray key stopped all scheduling,
//! silently and forever. What the key holds is read here with its holder's presence, for the
//! followers that decide to take it over and for `fleetctl list-machines`, which shows it.
//!
//! - Without a lease (`etcdctl put` by hand) or holding no machine ID, the key is stale: the
//!   next campaign takes it over (`EngineRole::claim`).
//! - On a live lease, naming a machine that has no presence record: some engine keeps a
//!   lease alive for a machine that is not in the cluster (a decommissioned host, a hand-made
//!   lease, a fleetd whose agent cannot register). A follower that sees the same key so for
//!   a while takes it over ([`EngineRole::take_over_unregistered`]), in a transaction that
//!   checks, as it writes, that the key is unchanged, that its machine still has no presence
//!   and that the taker's own machine has one (an engine not in the cluster itself has no
//!   standing to judge, and two of them would take the key from each other forever).
//!
//! Taking a key over is safe whoever held it: every write of an engine that thinks it leads
//! is fenced on the key's value and lease, so the deposed holder schedules nothing more.

use fleet_core::MachineId;
use std::fmt;
use std::time::Duration;
use tracing::warn;

use super::{EngineRole, Leadership};
use crate::error::{RegistryError, Result};
use crate::kv::{CmpOp, CmpTarget, Compare, KeyValue, Kv, Revision, Txn, TxnOp};
use crate::registry::Registry;

/// What the leader key holds, read with its holder's presence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaderKey {
    /// No key: no engine leads, and one campaigns at once.
    Vacant,
    /// A registered machine leads.
    Held { machine: MachineId },
    /// The key names `machine`, which has no presence record. `judged`: whether the reader
    /// (`me` of [`Registry::leader_key`]) is registered, so may take the key over.
    Unregistered {
        machine: MachineId,
        mod_revision: Revision,
        judged: bool,
    },
    /// The key holds `value` but leads nothing (`why`): the next campaign takes it over.
    Stray {
        value: String,
        why: &'static str,
        mod_revision: Revision,
    },
}

impl fmt::Display for LeaderKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaderKey::Vacant => f.write_str("no engine leads (no leader key)"),
            LeaderKey::Held { machine } => write!(f, "machine {machine} leads the engine"),
            LeaderKey::Unregistered { machine, .. } => write!(
                f,
                "the engine leader key names machine {machine}, which is not registered: \
                 nothing is scheduled until a registered engine takes it over"
            ),
            LeaderKey::Stray { value, why, .. } => write!(
                f,
                "the engine leader key holds {value:?}, which leads nothing ({why}): the \
                 next engine campaign takes it over"
            ),
        }
    }
}

/// Why the leader key `holder` leads nothing, if it does not: written without a lease (by
/// hand: it would never expire, and no engine would ever lead again), or holding no machine
/// ID.
pub(super) fn stale(holder: &KeyValue) -> Option<&'static str> {
    if holder.lease == 0 {
        return Some("it has no lease");
    }
    let names_a_machine = std::str::from_utf8(&holder.value)
        .ok()
        .is_some_and(|v| v.parse::<MachineId>().is_ok());
    (!names_a_machine).then_some("it names no machine")
}

impl<K: Kv> Registry<K> {
    /// What the leader key holds, as `me` judges it: a key naming another machine reads
    /// that machine's presence too, and, when it has none, `me`'s own. One read of the key,
    /// plus one or two of a presence.
    pub async fn leader_key(&self, me: Option<&MachineId>) -> Result<LeaderKey> {
        let res = self
            .kv()
            .range(&self.keys().leader(), false, None)
            .await
            .map_err(RegistryError::kv("reading engine leader"))?;
        let Some(holder) = res.kvs.first() else {
            return Ok(LeaderKey::Vacant);
        };
        if let Some(why) = stale(holder) {
            return Ok(LeaderKey::Stray {
                value: String::from_utf8_lossy(&holder.value).into_owned(),
                why,
                mod_revision: holder.mod_revision,
            });
        }
        let machine: MachineId = String::from_utf8_lossy(&holder.value)
            .parse()
            .expect("stale() checked that it names a machine");
        if Some(&machine) == me || self.registered(&machine, res.revision).await? {
            return Ok(LeaderKey::Held { machine });
        }
        let judged = match me {
            Some(me) => self.registered(me, res.revision).await?,
            None => false,
        };
        Ok(LeaderKey::Unregistered {
            machine,
            mod_revision: holder.mod_revision,
            judged,
        })
    }

    /// Whether `machine` has a presence record at `revision`.
    async fn registered(&self, machine: &MachineId, revision: Revision) -> Result<bool> {
        let res = self
            .kv()
            .range(&self.keys().machine(machine), false, Some(revision))
            .await
            .map_err(RegistryError::kv("reading the engine leader's presence"))?;
        Ok(!res.kvs.is_empty())
    }
}

impl<K: Kv> EngineRole<K> {
    /// Takes over the leader key `held` names, an unregistered machine's, on a new lease of
    /// `ttl`: only if, as it writes, the key is as read (`mod_revision`), that machine still
    /// has no presence record and `me` has one. `None`: any of these no longer holds.
    pub async fn take_over_unregistered(
        &self,
        me: &MachineId,
        ttl: Duration,
        held: &LeaderKey,
    ) -> Result<Option<Leadership<K>>> {
        let LeaderKey::Unregistered {
            machine,
            mod_revision,
            judged: true,
        } = held
        else {
            return Ok(None);
        };
        let keys = self.registry.keys();
        let lease = self
            .registry
            .kv()
            .grant(ttl)
            .await
            .map_err(RegistryError::kv("granting engine lease"))?;
        let key = keys.leader();
        let txn = Txn {
            compares: vec![
                Compare::mod_revision(&key, *mod_revision),
                Compare::absent(keys.machine(machine)),
                Compare {
                    key: keys.machine(me),
                    prefix: false,
                    op: CmpOp::Greater,
                    target: CmpTarget::CreateRevision(0),
                },
            ],
            success: vec![TxnOp::Put {
                key,
                value: me.as_str().as_bytes().to_vec(),
                lease: Some(lease),
            }],
            failure: vec![],
        };
        let res = self
            .registry
            .txn(
                txn,
                "taking over engine leadership from an unregistered machine",
            )
            .await;
        match res {
            Ok(res) if res.succeeded => {
                warn!(
                    holder = %machine,
                    "took over the engine leader key of a machine that is not registered"
                );
                Ok(Some(self.leadership(me, lease)))
            }
            other => {
                // Best effort: an unused lease expires by itself anyway.
                let _ = self.registry.kv().revoke(lease).await;
                other.map(|_| None)
            }
        }
    }
}
