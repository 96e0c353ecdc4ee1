//! Creating many units in few transactions: `fleetctl start foo@{1..100000}.service` wrote
//! one transaction per unit (100,000 units took 54 s, issue 19). A batch is one transaction
//! that creates every unit of it or none: each unit's record, file reference and (once per
//! distinct content) file, guarded by one "absent" compare per unit.
//!
//! Batches fit etcd's default `--max-txn-ops` ([`MAX_TXN_OPS`]), which bounds the compares
//! and each branch's operations separately: a unit takes one compare and two puts, a distinct
//! file one more put, so instances of one template go 63 to a transaction. They fit its
//! default request size too ([`MAX_TXN_BYTES`]): large distinct files go a few at a time, a
//! file of the largest size alone. [`batches`] is the pure rule that cuts a list into such
//! transactions; fleetd never needs a limit raised.
//!
//! What a batch does not do: decide. A batch that finds any of its units already there writes
//! nothing and says so; the caller then creates those units one by one (the per-unit path
//! decides what an existing unit means). Nothing here runs transactions concurrently: the
//! caller chooses how many are in flight.
//!
//! A batch whose answer is lost (a timeout, a connection that broke mid-request) may or may
//! not have been applied. Its records are then read back ([`settle`]): all of them there as
//! written, at one revision, is success; none of them there is safe to send again (the
//! absent compares make a resend harmless); anything else is a collision. The first 100,000
//! -unit run failed on one such timeout while etcd also served 5,000 agents (issue 19).

use fleet_core::{DesiredState, UnitFile, UnitHash, UnitName};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use tracing::debug;

use crate::error::{RegistryError, Result};
use crate::kv::{
    Compare, Kv, KvError, MAX_TXN_BYTES, MAX_TXN_OPS, Revision, TXN_OP_BYTES, Txn, TxnResult,
};
use crate::records::{ReplaceState, Unit, UnitRecord};
use crate::registry::{encode, put};

use super::UnitsRole;

/// One unit of a batch.
#[derive(Debug, Clone, Copy)]
pub struct NewUnit<'a> {
    pub name: &'a UnitName,
    pub file: &'a UnitFile,
    pub desired: DesiredState,
}

/// How often a batch is sent at most: a lost answer whose read-back finds none of the batch's
/// units (or fails too) is sent again after a jittered pause, five times at most. etcd 3.4
/// under 5,000 machines' lease keep-alives stops applying for 14-27 s at a time (issue 19);
/// three sends back to back failed a 100,000-unit submit inside one such stall.
const SENDS: usize = 6;
/// The pauses before a batch is sent again: from half a second, doubling (jittered) to 8 s,
/// about 15 s in all before the last send.
const RESEND_MIN: std::time::Duration = std::time::Duration::from_millis(500);
const RESEND_MAX: std::time::Duration = std::time::Duration::from_secs(8);

/// What reading back a batch whose answer was lost found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Every record as the batch wrote it, all at this revision: the batch was applied.
    Applied(Revision),
    /// None of the batch's units exists: it was not applied.
    Absent,
    /// Some exist, or differ from what the batch wrote: someone else wrote them (or changed
    /// them since). The per-unit path decides, as for a collision.
    Other,
}

/// Decides what became of a batch of `records` from the units found under their names.
pub fn settle(records: &[UnitRecord], found: &BTreeMap<UnitName, Unit>) -> Settled {
    if records.iter().all(|r| !found.contains_key(&r.name)) {
        return Settled::Absent;
    }
    let mut revisions = records.iter().map(|r| {
        found
            .get(&r.name)
            .filter(|u| u.record == *r)
            .map(|u| u.mod_revision)
    });
    match revisions.next().flatten() {
        Some(rev) if revisions.all(|other| other == Some(rev)) => Settled::Applied(rev),
        _ => Settled::Other,
    }
}

/// Operations a batch of `units` units with `files` distinct files puts in its success branch.
fn success_ops(units: usize, files: usize) -> usize {
    2 * units + files
}

/// The request bytes `ops` puts of small keys and records cost, with `file` when it is new
/// to the batch (at most: see [`TXN_OP_BYTES`]).
pub(crate) fn txn_bytes(ops: usize, file: Option<&UnitFile>) -> usize {
    ops * TXN_OP_BYTES + file.map_or(0, |f| f.canonical().len())
}

/// Cuts `units` into consecutive batches, each one transaction within [`MAX_TXN_OPS`]
/// compares and operations and [`MAX_TXN_BYTES`] bytes (a unit alone is a batch whatever its
/// size). A name seen again starts a new batch (etcd refuses a transaction that puts one key
/// twice), where the absent compare then finds the earlier one.
pub fn batches(units: &[NewUnit<'_>]) -> Vec<Range<usize>> {
    cut(units, |u| Write {
        name: u.name,
        own_ops: 2,
        file: Some(u.file),
    })
}

/// What the batching rule needs of one write: the unit it writes (a name once per batch),
/// its operations beside its file, and its file (put once per batch however many share it).
#[derive(Debug)]
pub(crate) struct Write<'a> {
    pub name: &'a UnitName,
    pub own_ops: usize,
    pub file: Option<&'a UnitFile>,
}

/// The one batching rule of every many-unit write (creates, changes, imports): cuts `items`
/// into consecutive batches, each one transaction of at most [`MAX_TXN_OPS`] compares (one
/// per item) and operations (each item's own, a distinct file once) and [`MAX_TXN_BYTES`]
/// bytes. An item alone is a batch whatever its size; a name seen again starts a new batch.
pub(crate) fn cut<'a, T>(items: &'a [T], write: impl Fn(&'a T) -> Write<'a>) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut ops = 0;
    let mut bytes = 0;
    let mut names: BTreeSet<&UnitName> = BTreeSet::new();
    let mut hashes: BTreeSet<UnitHash> = BTreeSet::new();
    for (i, item) in items.iter().enumerate() {
        let w = write(item);
        let hash = w.file.map(UnitFile::hash);
        let is_new = |hashes: &BTreeSet<UnitHash>| hash.is_some_and(|h| !hashes.contains(&h));
        let cost =
            |hashes: &BTreeSet<UnitHash>| txn_bytes(w.own_ops, w.file.filter(|_| is_new(hashes)));
        let fits = i - start < MAX_TXN_OPS
            && ops + w.own_ops + usize::from(is_new(&hashes)) <= MAX_TXN_OPS
            && bytes + cost(&hashes) <= MAX_TXN_BYTES;
        if i > start && (!fits || names.contains(w.name)) {
            out.push(start..i);
            start = i;
            ops = 0;
            bytes = 0;
            names.clear();
            hashes.clear();
        }
        // After a cut the file is new to the batch again.
        bytes += cost(&hashes);
        ops += w.own_ops + usize::from(is_new(&hashes));
        names.insert(w.name);
        hashes.extend(hash);
    }
    if start < items.len() {
        out.push(start..items.len());
    }
    out
}

impl<K: Kv> UnitsRole<K> {
    /// Creates every unit of `units` in one transaction if none of them exists yet: their
    /// records in the order given, or `None` when one of them exists (nothing was written).
    /// `units` must be one of [`batches`]' batches; more is [`RegistryError::TooManyChanges`].
    pub async fn create_batch(&self, units: &[NewUnit<'_>]) -> Result<Option<Vec<Unit>>> {
        let keys = self.registry.keys();
        let mut hashes = BTreeSet::new();
        let mut files = Vec::new();
        for unit in units {
            if hashes.insert(unit.file.hash()) {
                files.push(unit.file);
            }
        }
        let ops = success_ops(units.len(), files.len());
        if units.len() > MAX_TXN_OPS || ops > MAX_TXN_OPS {
            return Err(RegistryError::TooManyChanges {
                count: ops.max(units.len()),
                max: MAX_TXN_OPS,
            });
        }
        let records: Vec<UnitRecord> = units
            .iter()
            .map(|u| UnitRecord {
                name: u.name.clone(),
                hash: u.file.hash(),
                desired: u.desired,
                restart: 0,
                replace: ReplaceState::default(),
            })
            .collect();
        // Each file is (re)written with its references, as `create_unit` does: a concurrent
        // collection of the same hash may have just deleted it.
        let mut success: Vec<_> = files
            .iter()
            .map(|f| put(keys.file(&f.hash()), f.canonical().into_bytes()))
            .collect();
        for record in &records {
            success.push(put(keys.file_ref(&record.hash, &record.name), Vec::new()));
            success.push(put(keys.unit(&record.name), encode(record)));
        }
        let txn = Txn {
            compares: records
                .iter()
                .map(|r| Compare::absent(keys.unit(&r.name)))
                .collect(),
            success,
            failure: vec![],
        };
        let Some(mod_revision) = self.send_batch(txn, &records).await? else {
            return Ok(None);
        };
        debug!(units = units.len(), files = files.len(), "created units");
        Ok(Some(
            records
                .into_iter()
                .map(|record| Unit {
                    record,
                    mod_revision,
                })
                .collect(),
        ))
    }
}

impl<K: Kv> UnitsRole<K> {
    /// Sends a batch's transaction, [`SENDS`] times at most while its answer is lost and the
    /// read-back finds nothing written (or cannot be made: a resend is safe either way, its
    /// absent compares refuse it if the batch landed). The revision it was applied at, or
    /// `None` when a unit of it exists (nothing written by this batch).
    async fn send_batch(&self, txn: Txn, records: &[UnitRecord]) -> Result<Option<Revision>> {
        let mut sent = 0;
        let mut pause = fleet_core::Backoff::new(RESEND_MIN, RESEND_MAX);
        loop {
            sent += 1;
            let lost = match self.registry.kv().txn(txn.clone()).await {
                Ok(TxnResult {
                    succeeded,
                    revision,
                    ..
                }) => {
                    if !succeeded {
                        debug!(
                            units = records.len(),
                            "a unit of the batch exists; nothing written"
                        );
                    }
                    return Ok(succeeded.then_some(revision));
                }
                Err(e) if e.is_transient() => e,
                Err(e) => return Err(RegistryError::kv("creating units")(e)),
            };
            // The error stands after the last send.
            match self.read_back(records, &lost).await {
                Some(Settled::Applied(revision)) => return Ok(Some(revision)),
                Some(Settled::Other) => return Ok(None),
                Some(Settled::Absent) | None if sent < SENDS => {
                    let delay = pause.next_delay();
                    debug!(
                        units = records.len(),
                        sent,
                        ?delay,
                        "a batch whose answer was lost is not written, or cannot be read back; sending it again"
                    );
                    tokio::time::sleep(delay).await;
                }
                Some(Settled::Absent) | None => {
                    return Err(RegistryError::kv("creating units")(lost));
                }
            }
        }
    }

    /// Reads back the units of a batch whose answer was lost; `None` if that read fails.
    async fn read_back(&self, records: &[UnitRecord], lost: &KvError) -> Option<Settled> {
        let names: BTreeSet<UnitName> = records.iter().map(|r| r.name.clone()).collect();
        let found = self.registry.units_named(&names).await.ok()?;
        let settled = settle(records, &found);
        debug!(units = records.len(), error = %lost, ?settled, "read back a batch whose answer was lost");
        Some(settled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(i: usize) -> UnitName {
        format!("foo@{i}.service").parse().unwrap()
    }

    fn file(exec: &str) -> UnitFile {
        UnitFile::parse(format!("[Service]\nExecStart={exec}\n").as_bytes()).unwrap()
    }

    fn new_units<'a>(names: &'a [UnitName], files: &'a [UnitFile]) -> Vec<NewUnit<'a>> {
        names
            .iter()
            .enumerate()
            .map(|(i, name)| NewUnit {
                name,
                file: &files[i % files.len()],
                desired: DesiredState::Launched,
            })
            .collect()
    }

    /// The compares and success operations of each batch, as `create_batch` builds them.
    fn op_counts(units: &[NewUnit<'_>]) -> Vec<(usize, usize)> {
        batches(units)
            .into_iter()
            .map(|r| {
                let b = &units[r];
                let files: BTreeSet<UnitHash> = b.iter().map(|u| u.file.hash()).collect();
                (b.len(), success_ops(b.len(), files.len()))
            })
            .collect()
    }

    #[test]
    fn instances_of_one_template_go_sixty_three_to_a_transaction() {
        let names: Vec<UnitName> = (0..1000).map(name).collect();
        let files = [file("/bin/true")];
        let units = new_units(&names, &files);
        let counts = op_counts(&units);
        assert_eq!(counts.len(), 1000_usize.div_ceil(63));
        assert!(
            counts[..counts.len() - 1]
                .iter()
                .all(|&(u, ops)| u == 63 && ops == 127)
        );
    }

    #[test]
    fn every_batch_fits_etcds_default_max_txn_ops_whatever_the_files() {
        let names: Vec<UnitName> = (0..500).map(name).collect();
        for distinct in [1, 2, 7, 63, 500] {
            let files: Vec<UnitFile> = (0..distinct).map(|i| file(&format!("/bin/{i}"))).collect();
            let units = new_units(&names, &files);
            let ranges = batches(&units);
            let covered: usize = ranges.iter().map(|r| r.len()).sum();
            assert_eq!(covered, units.len(), "{distinct} files");
            assert!(ranges.windows(2).all(|w| w[0].end == w[1].start));
            for (compares, ops) in op_counts(&units) {
                assert!(
                    compares <= MAX_TXN_OPS && ops <= MAX_TXN_OPS,
                    "{distinct} files"
                );
            }
        }
    }

    /// A unit file of about `kib` KiB, distinct by `i`.
    fn big_file(i: usize, kib: usize) -> UnitFile {
        let mut text = format!("[Service]\nExecStart=/bin/{i}\n");
        for line in 0..kib {
            text.push_str(&format!("Environment=X{line}={}\n", "x".repeat(1000)));
        }
        UnitFile::parse(text.as_bytes()).unwrap()
    }

    #[test]
    fn large_files_go_as_many_to_a_transaction_as_fit_etcds_request_size() {
        // Issue 38: 5 files of 965 KB went as one 4.8 MB request, 200 of 96 KB as one too.
        for (count, kib) in [(5, 965), (200, 96), (3, 1020)] {
            let names: Vec<UnitName> = (0..count).map(name).collect();
            let files: Vec<UnitFile> = (0..count).map(|i| big_file(i, kib)).collect();
            let units = new_units(&names, &files);
            let ranges = batches(&units);
            assert_eq!(ranges.iter().map(|r| r.len()).sum::<usize>(), count);
            for r in &ranges {
                let bytes: usize = units[r.clone()]
                    .iter()
                    .map(|u| txn_bytes(2, Some(u.file)))
                    .sum();
                assert!(
                    r.len() == 1 || bytes <= MAX_TXN_BYTES,
                    "{count} x {kib} KiB: {r:?} is {bytes} bytes"
                );
            }
            // Nothing cut finer than it must be: each batch but the last is full.
            if kib == 96 {
                assert!(ranges[0].len() >= 9, "{ranges:?}");
            }
        }
        // A file of the largest size is a batch of its own, never an empty one before it.
        let names = [name(0), name(1)];
        let files = [big_file(0, 1030), big_file(1, 1)];
        assert_eq!(batches(&new_units(&names, &files)), vec![0..1, 1..2]);
    }

    #[test]
    fn a_name_given_twice_starts_a_new_batch() {
        let names = [name(1), name(2), name(1)];
        let files = [file("/bin/true")];
        let units = new_units(&names, &files);
        assert_eq!(batches(&units), vec![0..2, 2..3]);
    }

    #[test]
    fn no_units_make_no_batch() {
        assert!(batches(&[]).is_empty());
    }

    fn record(i: usize, exec: &str) -> UnitRecord {
        UnitRecord {
            name: name(i),
            hash: file(exec).hash(),
            desired: DesiredState::Launched,
            restart: 0,
            replace: ReplaceState::default(),
        }
    }

    fn found(units: &[(UnitRecord, Revision)]) -> BTreeMap<UnitName, Unit> {
        units
            .iter()
            .map(|(record, mod_revision)| {
                let unit = Unit {
                    record: record.clone(),
                    mod_revision: *mod_revision,
                };
                (record.name.clone(), unit)
            })
            .collect()
    }

    #[test]
    fn a_lost_batch_was_applied_only_if_every_record_is_there_as_written_at_one_revision() {
        let ours = [record(1, "/bin/a"), record(2, "/bin/a")];
        assert_eq!(settle(&ours, &BTreeMap::new()), Settled::Absent);
        let all = found(&[(ours[0].clone(), 7), (ours[1].clone(), 7)]);
        assert_eq!(settle(&ours, &all), Settled::Applied(7));
        let one = found(&[(ours[0].clone(), 7)]);
        assert_eq!(settle(&ours, &one), Settled::Other, "one of two");
        let apart = found(&[(ours[0].clone(), 7), (ours[1].clone(), 8)]);
        assert_eq!(settle(&ours, &apart), Settled::Other, "two writes");
        let theirs = found(&[(ours[0].clone(), 7), (record(2, "/bin/b"), 7)]);
        assert_eq!(settle(&ours, &theirs), Settled::Other, "other content");
    }

    /// Loses the answers of the first `lose` create transactions, each applied first when
    /// `applied`: a timeout after etcd wrote it, or before it got there.
    #[derive(Debug, Clone)]
    struct LoseAnswers {
        store: crate::kv::MemKv,
        lose: std::sync::Arc<std::sync::atomic::AtomicUsize>,
        applied: bool,
        sent: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    }

    impl crate::kv::Hook for LoseAnswers {
        async fn before(
            &self,
            request: crate::kv::Request<'_>,
        ) -> std::result::Result<(), KvError> {
            use std::sync::atomic::Ordering::SeqCst;
            let crate::kv::Request::Txn(txn) = request else {
                return Ok(());
            };
            if txn.compares.is_empty() {
                return Ok(());
            }
            self.sent.fetch_add(1, SeqCst);
            if self
                .lose
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_err()
            {
                return Ok(());
            }
            if self.applied {
                self.store.txn(txn.clone()).await?;
            }
            Err(KvError::Timeout(
                std::time::Duration::from_secs(5),
                "test".to_owned(),
            ))
        }
    }

    async fn create_losing(
        lose: usize,
        applied: bool,
    ) -> (Result<Option<Vec<Unit>>>, usize, usize) {
        let store = crate::kv::MemKv::new();
        let hook = LoseAnswers {
            store: store.clone(),
            lose: std::sync::Arc::new(lose.into()),
            applied,
            sent: std::sync::Arc::default(),
        };
        let kv = crate::kv::Hooked {
            inner: store.clone(),
            hook: hook.clone(),
        };
        let role = UnitsRole::new(crate::Registry::new(kv, "/t/"));
        let names: Vec<UnitName> = (0..3).map(name).collect();
        let files = [file("/bin/true")];
        let created = role.create_batch(&new_units(&names, &files)).await;
        let units = crate::Registry::new(store, "/t/")
            .units()
            .await
            .unwrap()
            .items
            .len();
        (
            created,
            hook.sent.load(std::sync::atomic::Ordering::SeqCst),
            units,
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_applied_before_its_answer_was_lost_is_written_once_and_reported_written() {
        let (created, sent, units) = create_losing(1, true).await;
        let created = created.unwrap().expect("reported written");
        assert_eq!((created.len(), sent, units), (3, 1, 3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_lost_before_etcd_applied_it_is_sent_again() {
        let (created, sent, units) = create_losing(2, false).await;
        assert_eq!(created.unwrap().map(|c| c.len()), Some(3));
        assert_eq!((sent, units), (3, 3));
    }

    /// etcd 3.4 stalled for 14-27 s under 5,000 machines (issue 19): the pauses between
    /// sends (about 15 s in all) carry a batch over such a stall.
    #[tokio::test(start_paused = true)]
    async fn a_batch_lost_four_times_in_a_stall_is_written_on_the_fifth_send_after_pauses() {
        let t0 = tokio::time::Instant::now();
        let (created, sent, units) = create_losing(4, false).await;
        assert_eq!(created.unwrap().map(|c| c.len()), Some(3));
        assert_eq!((sent, units), (5, 3));
        assert!(t0.elapsed() >= RESEND_MIN * 4, "{:?}", t0.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_lost_every_time_fails_with_the_timeout_and_writes_nothing() {
        let (created, sent, units) = create_losing(usize::MAX, false).await;
        let err = created.unwrap_err().to_string();
        assert!(err.contains("timed out"), "{err}");
        assert_eq!((sent, units), (SENDS, 0));
    }
}
