//! The state machine of the in-memory store: keys with their history, the revision counter,
//! the event log, leases and compaction, following etcd's MVCC rules. Synchronous and pure
//! (time comes in as `now`); [`MemKv`](super::MemKv) adds locking, timers and watches.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::ops::Bound;
use std::time::Duration;

use tokio::time::Instant;

use crate::kv::{
    CmpOp, CmpTarget, Compare, Event, EventKind, KeyValue, KvError, LeaseId, MAX_TXN_OPS,
    RangeResult, Read, ReadResult, Revision, Txn, TxnOp, TxnOpResponse, TxnResult,
};

/// etcd's refusal texts, so messages read the same on both sides.
const DUPLICATE_KEY: &str = "etcdserver: duplicate key given in txn request";
const TOO_MANY_OPS: &str = "etcdserver: too many operations in txn request";
const FUTURE_REVISION: &str = "etcdserver: mvcc: required revision is a future revision";

/// Lease IDs are opaque; starting far from 0 keeps them from looking like counts in tests.
const FIRST_LEASE_ID: i64 = 0x6b76_0000_0000_0001;

/// One version of a key: its value from `revision` on, or its deletion (`None`).
#[derive(Debug, Clone)]
struct Entry {
    revision: Revision,
    kv: Option<KeyValue>,
}

#[derive(Debug)]
struct Lease {
    ttl: Duration,
    deadline: Instant,
    keys: BTreeSet<String>,
}

#[derive(Debug)]
pub(super) struct Store {
    /// The revision of the last change; etcd starts an empty store at 1.
    revision: Revision,
    /// Revisions below this one are gone (0: never compacted).
    compacted: Revision,
    /// Every key's versions in revision order.
    keys: BTreeMap<String, Vec<Entry>>,
    /// The events of every revision since the compaction point.
    log: BTreeMap<Revision, Vec<Event>>,
    leases: BTreeMap<i64, Lease>,
    next_lease: i64,
}

impl Default for Store {
    fn default() -> Self {
        Self {
            revision: 1,
            compacted: 0,
            keys: BTreeMap::new(),
            log: BTreeMap::new(),
            leases: BTreeMap::new(),
            next_lease: FIRST_LEASE_ID,
        }
    }
}

impl Store {
    pub(super) fn revision(&self) -> Revision {
        self.revision
    }

    /// The events of every revision after `after`, in order.
    pub(super) fn events_after(
        &self,
        after: Revision,
    ) -> impl Iterator<Item = (Revision, &[Event])> {
        self.log
            .range(after + 1..)
            .map(|(rev, events)| (*rev, events.as_slice()))
    }

    /// The events of every revision from `from` on, or the compaction point if `from` is
    /// older than it.
    pub(super) fn history(
        &self,
        from: Revision,
    ) -> Result<impl Iterator<Item = (Revision, &[Event])>, Revision> {
        if from < self.compacted {
            return Err(self.compacted);
        }
        Ok(self.events_after(from - 1))
    }

    /// The live keys in the range at revision `at`, sorted.
    fn live_at(&self, key: &str, prefix: bool, at: Revision) -> Vec<KeyValue> {
        let version_at = |entries: &Vec<Entry>| version_at(entries, at);
        if prefix {
            self.keys
                .range::<str, _>((Bound::Included(key), Bound::Unbounded))
                .take_while(|(k, _)| k.starts_with(key))
                .filter_map(|(_, entries)| version_at(entries))
                .collect()
        } else {
            self.keys
                .get(key)
                .and_then(version_at)
                .into_iter()
                .collect()
        }
    }

    fn live(&self, key: &str, prefix: bool) -> Vec<KeyValue> {
        // Includes changes made so far by a transaction being applied (at revision + 1), as
        // etcd's reads inside a write transaction do.
        self.live_at(key, prefix, self.revision + 1)
    }

    pub(super) fn range(
        &self,
        key: &str,
        prefix: bool,
        revision: Option<Revision>,
    ) -> Result<RangeResult, KvError> {
        let at = self.read_revision(revision)?;
        Ok(RangeResult {
            // etcd's header carries the current revision even for a read in the past.
            revision: self.revision,
            kvs: self.live_at(key, prefix, at),
        })
    }

    /// [`Kv::read`](crate::kv::Kv::read): every read at one revision, as etcd's read-only
    /// transaction of ranges does.
    pub(super) fn read(
        &self,
        reads: &[Read],
        revision: Option<Revision>,
    ) -> Result<ReadResult, KvError> {
        if reads.len() > MAX_TXN_OPS {
            return Err(KvError::Refused(TOO_MANY_OPS.to_owned()));
        }
        let at = self.read_revision(revision)?;
        let found = reads
            .iter()
            .map(|read| match &read.end {
                None => self.live_at(&read.start, false, at),
                // etcd reads nothing of an interval that ends before it starts.
                Some(end) if end.as_str() <= read.start.as_str() => Vec::new(),
                Some(end) => {
                    let limit = if read.limit == 0 {
                        usize::MAX
                    } else {
                        read.limit
                    };
                    self.keys
                        .range::<str, _>((
                            Bound::Included(read.start.as_str()),
                            Bound::Excluded(end.as_str()),
                        ))
                        .filter_map(|(_, entries)| version_at(entries, at))
                        .take(limit)
                        .collect()
                }
            })
            .collect();
        Ok(ReadResult {
            revision: self.revision,
            found,
        })
    }

    /// The revision a read asks for, checked as etcd checks it.
    fn read_revision(&self, revision: Option<Revision>) -> Result<Revision, KvError> {
        Ok(match revision {
            Some(rev) if rev > self.revision => {
                return Err(KvError::Refused(FUTURE_REVISION.to_owned()));
            }
            Some(rev) if rev > 0 && rev < self.compacted => {
                return Err(KvError::Compacted {
                    requested: rev,
                    compacted: self.compacted,
                });
            }
            Some(rev) if rev > 0 => rev,
            Some(_) | None => self.revision,
        })
    }

    pub(super) fn txn(&mut self, txn: &Txn) -> Result<TxnResult, KvError> {
        check_intervals(&txn.success)?;
        check_intervals(&txn.failure)?;
        let succeeded = txn.compares.iter().all(|c| self.compare(c));
        let ops = if succeeded {
            &txn.success
        } else {
            &txn.failure
        };
        for op in ops {
            if let TxnOp::Put {
                lease: Some(lease), ..
            } = op
                && !self.leases.contains_key(&lease.0)
            {
                return Err(KvError::LeaseNotFound(*lease));
            }
        }
        let mut events = Vec::new();
        let responses = ops.iter().map(|op| self.apply(op, &mut events)).collect();
        self.commit(events);
        Ok(TxnResult {
            succeeded,
            revision: self.revision,
            responses,
        })
    }

    /// Ends a write: a revision only for a write that changed something, as in etcd.
    fn commit(&mut self, events: Vec<Event>) {
        if !events.is_empty() {
            self.revision += 1;
            self.log.insert(self.revision, events);
        }
    }

    fn compare(&self, c: &Compare) -> bool {
        let kvs = self.live(&c.key, c.prefix);
        if kvs.is_empty() {
            // etcd: a value cannot be compared on a missing key (no way to tell it from ""),
            // everything else compares as an absent key's zeros.
            return !matches!(c.target, CmpTarget::Value(_)) && compare_kv(c, &absent(&c.key));
        }
        kvs.iter().all(|kv| compare_kv(c, kv))
    }

    fn apply(&mut self, op: &TxnOp, events: &mut Vec<Event>) -> TxnOpResponse {
        let rev = self.revision + 1;
        match op {
            TxnOp::Put { key, value, lease } => {
                let prev = self.live(key, false).pop();
                let lease = lease.map_or(0, |l| l.0);
                if let Some(prev) = &prev {
                    self.detach(prev);
                }
                if let Some(l) = self.leases.get_mut(&lease) {
                    l.keys.insert(key.clone());
                }
                let kv = KeyValue {
                    key: key.clone(),
                    value: value.clone(),
                    create_revision: prev.as_ref().map_or(rev, |p| p.create_revision),
                    mod_revision: rev,
                    version: prev.as_ref().map_or(1, |p| p.version + 1),
                    lease,
                };
                self.record(key, Some(kv.clone()));
                events.push(Event {
                    kind: EventKind::Put,
                    kv,
                });
                TxnOpResponse::Put
            }
            TxnOp::Delete { key, prefix } => {
                let doomed = self.live(key, *prefix);
                for kv in &doomed {
                    self.detach(kv);
                    self.record(&kv.key, None);
                    events.push(Event {
                        kind: EventKind::Delete,
                        kv: KeyValue {
                            mod_revision: rev,
                            ..absent(&kv.key)
                        },
                    });
                }
                TxnOpResponse::Delete(i64::try_from(doomed.len()).unwrap_or(i64::MAX))
            }
            TxnOp::Get { key, prefix } => TxnOpResponse::Get(self.live(key, *prefix)),
        }
    }

    /// Adds a version of `key` at the revision being written.
    fn record(&mut self, key: &str, kv: Option<KeyValue>) {
        let revision = self.revision + 1;
        self.keys
            .entry(key.to_owned())
            .or_default()
            .push(Entry { revision, kv });
    }

    fn detach(&mut self, kv: &KeyValue) {
        if let Some(lease) = self.leases.get_mut(&kv.lease) {
            lease.keys.remove(&kv.key);
        }
    }

    /// A lease of `ttl` (whole seconds, at least 1) from `now`.
    pub(super) fn grant(&mut self, ttl: Duration, now: Instant) -> LeaseId {
        let id = self.next_lease;
        self.next_lease += 1;
        let ttl = Duration::from_secs(whole_seconds(ttl));
        self.leases.insert(
            id,
            Lease {
                ttl,
                deadline: now + ttl,
                keys: BTreeSet::new(),
            },
        );
        LeaseId(id)
    }

    /// Renews the lease for its TTL from `now`. A lease past its deadline is gone even if
    /// its timer has not revoked it yet, as in etcd.
    pub(super) fn keep_alive(&mut self, lease: LeaseId, now: Instant) -> Result<(), KvError> {
        match self.leases.get(&lease.0) {
            Some(l) if l.deadline > now => {
                self.renew(lease, now);
                Ok(())
            }
            Some(_) | None => Err(KvError::LeaseNotFound(lease)),
        }
    }

    /// Gives the lease its full TTL again from `now`, expired or not.
    pub(super) fn renew(&mut self, lease: LeaseId, now: Instant) {
        if let Some(l) = self.leases.get_mut(&lease.0) {
            l.deadline = now + l.ttl;
        }
    }

    /// Every lease gets its full TTL again from `now`: what etcd does when a new leader takes
    /// over, e.g. after the cluster was down.
    pub(super) fn renew_all(&mut self, now: Instant) {
        for lease in self.leases.values_mut() {
            lease.deadline = now + lease.ttl;
        }
    }

    pub(super) fn lease_deadline(&self, lease: LeaseId) -> Option<Instant> {
        self.leases.get(&lease.0).map(|l| l.deadline)
    }

    /// Removes the lease and deletes its keys, in key order, in one revision (if it had any).
    /// Unknown leases are ignored.
    pub(super) fn revoke(&mut self, lease: LeaseId) {
        let Some(l) = self.leases.remove(&lease.0) else {
            return;
        };
        let rev = self.revision + 1;
        let mut events = Vec::new();
        for key in l.keys {
            self.record(&key, None);
            events.push(Event {
                kind: EventKind::Delete,
                kv: KeyValue {
                    mod_revision: rev,
                    ..absent(&key)
                },
            });
        }
        self.commit(events);
    }

    /// Forgets history before `revision`, as etcd's compaction: older reads and watches then
    /// fail with `Compacted`.
    pub(super) fn compact(&mut self, revision: Revision) -> Result<(), KvError> {
        if revision > self.revision {
            return Err(KvError::Refused(FUTURE_REVISION.to_owned()));
        }
        if revision <= self.compacted {
            return Err(KvError::Compacted {
                requested: revision,
                compacted: self.compacted,
            });
        }
        self.compacted = revision;
        self.log = self.log.split_off(&revision);
        for entries in self.keys.values_mut() {
            // Keep the version current at `revision` (if live) and everything after it.
            let older = entries.iter().filter(|e| e.revision <= revision).count();
            let keep_from = match older.checked_sub(1) {
                Some(current) if entries[current].kv.is_some() => current,
                Some(_) | None => older,
            };
            entries.drain(..keep_from);
        }
        self.keys.retain(|_, entries| !entries.is_empty());
        Ok(())
    }
}

/// What etcd compares an empty range against, and the shape of a deletion event's key.
fn absent(key: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Vec::new(),
        create_revision: 0,
        mod_revision: 0,
        version: 0,
        lease: 0,
    }
}

fn compare_kv(c: &Compare, kv: &KeyValue) -> bool {
    let ordering = match &c.target {
        CmpTarget::Value(value) => kv.value.as_slice().cmp(value.as_slice()),
        CmpTarget::Version(version) => kv.version.cmp(version),
        CmpTarget::CreateRevision(rev) => kv.create_revision.cmp(rev),
        CmpTarget::ModRevision(rev) => kv.mod_revision.cmp(rev),
        CmpTarget::Lease(lease) => kv.lease.cmp(lease),
    };
    match c.op {
        CmpOp::Equal => ordering.is_eq(),
        CmpOp::NotEqual => ordering.is_ne(),
        CmpOp::Less => ordering.is_lt(),
        CmpOp::Greater => ordering.is_gt(),
    }
}

/// etcd refuses a transaction branch that writes a key twice (two puts, or a put inside a
/// deleted range), before looking at its compares.
/// A key's value at revision `at`, if it was live then.
fn version_at(entries: &[Entry], at: Revision) -> Option<KeyValue> {
    entries
        .iter()
        .rev()
        .find(|e| e.revision <= at)
        .and_then(|e| e.kv.clone())
}

fn check_intervals(ops: &[TxnOp]) -> Result<(), KvError> {
    let mut puts = HashSet::new();
    for op in ops {
        if let TxnOp::Put { key, .. } = op
            && !puts.insert(key.as_str())
        {
            return Err(KvError::Refused(DUPLICATE_KEY.to_owned()));
        }
    }
    for op in ops {
        if let TxnOp::Delete { key, prefix } = op {
            let hit = |put: &&str| {
                if *prefix {
                    put.starts_with(key.as_str())
                } else {
                    put == key
                }
            };
            if puts.iter().any(hit) {
                return Err(KvError::Refused(DUPLICATE_KEY.to_owned()));
            }
        }
    }
    Ok(())
}

/// etcd takes whole seconds; rounding up keeps the lease at least as long as asked.
fn whole_seconds(ttl: Duration) -> u64 {
    (ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, value: &str) -> TxnOp {
        TxnOp::Put {
            key: key.into(),
            value: value.into(),
            lease: None,
        }
    }

    fn write(store: &mut Store, ops: Vec<TxnOp>) -> TxnResult {
        store
            .txn(&Txn {
                success: ops,
                ..Txn::default()
            })
            .unwrap()
    }

    #[test]
    fn starts_at_revision_one_and_counts_versions() {
        let mut s = Store::default();
        assert_eq!(s.revision(), 1);
        write(&mut s, vec![put("a", "1")]);
        write(&mut s, vec![put("a", "2")]);
        let kv = &s.range("a", false, None).unwrap().kvs[0];
        assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (2, 3, 2));
    }

    #[test]
    fn recreated_key_starts_a_new_life() {
        let mut s = Store::default();
        write(&mut s, vec![put("a", "1")]);
        write(
            &mut s,
            vec![TxnOp::Delete {
                key: "a".into(),
                prefix: false,
            }],
        );
        write(&mut s, vec![put("a", "2")]);
        let kv = &s.range("a", false, None).unwrap().kvs[0];
        assert_eq!((kv.create_revision, kv.version), (4, 1));
    }

    #[test]
    fn refuses_a_put_inside_a_deleted_range_in_the_same_branch() {
        let mut s = Store::default();
        let err = s
            .txn(&Txn {
                failure: vec![
                    TxnOp::Delete {
                        key: "a/".into(),
                        prefix: true,
                    },
                    put("a/b", "1"),
                ],
                ..Txn::default()
            })
            .unwrap_err();
        assert!(matches!(err, KvError::Refused(m) if m == DUPLICATE_KEY));
    }

    #[test]
    fn compaction_keeps_the_current_version_of_each_key() {
        let mut s = Store::default();
        write(&mut s, vec![put("a", "1")]); // 2
        write(&mut s, vec![put("b", "1")]); // 3
        write(&mut s, vec![put("a", "2")]); // 4
        s.compact(4).unwrap();
        assert_eq!(s.range("b", false, Some(4)).unwrap().kvs.len(), 1);
        assert_eq!(s.range("a", false, Some(4)).unwrap().kvs[0].value, b"2");
        assert!(matches!(
            s.range("a", false, Some(3)),
            Err(KvError::Compacted {
                requested: 3,
                compacted: 4
            })
        ));
        assert!(matches!(s.history(3), Err(4)));
        assert!(matches!(s.compact(4), Err(KvError::Compacted { .. })));
    }

    #[test]
    fn rounds_lease_ttl_up_to_whole_seconds() {
        assert_eq!(whole_seconds(Duration::ZERO), 1);
        assert_eq!(whole_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(whole_seconds(Duration::from_secs(3)), 3);
    }
}
