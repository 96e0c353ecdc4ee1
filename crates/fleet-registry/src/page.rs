//! One page of the unit listing (issue 19): the units after a cursor, in name order, with
//! only their own keys, every read at one revision, so a listing of 100,000 units in pages
//! reads each key once, and a page costs what it costs at 10 units.
//!
//! A page reads, at the listing's revision (its first page's, [`Kv::read`]):
//! 1. `limit + 1` unit records from just after the cursor (`P/unit/<cursor>\0` to the end of
//!    `P/unit/`): one request; the extra record tells whether more follow;
//! 2. the page's placements and unschedulable reasons: the interval of `P/placement/` that
//!    holds `<name>/…` for every name of the page, and that of `P/unscheduled/` from its first
//!    name to its last, in one request;
//! 3. for each machine the page's units are placed on, the interval of its schedule
//!    entries and that of its states from the page's first name to its last
//!    (`P/schedule/<machine>/<first>` to `…/<last>`, the same under `P/unit-state/`),
//!    [`MAX_TXN_OPS`] intervals to a request, a few requests at once. Per machine, not per
//!    placement: a page of 65,535 units on 100 machines is 2 requests, not 1,024 of 128 keys
//!    (a `Get` in a transaction cost etcd 3.4 about 4 times a key of a range here). A state
//!    of a page's unit on a machine that reports it unplaced is read too.
//!
//! The files of the page's units are [`Registry::files_at`] the same revision. What it must
//! not do: read a prefix whole, or anything about a unit outside the page (a placement
//! interval may hold a few keys of other units whose names sort between, left out here).

use fleet_core::{MachineId, UnitFile, UnitHash, UnitName};
use futures::StreamExt;
use std::collections::{BTreeMap, BTreeSet};

use crate::error::{RegistryError, Result};
use crate::keys::Key;
use crate::kv::{KeyValue, Kv, KvError, MAX_TXN_OPS, Read, Revision};
use crate::read::{self, Listing};
use crate::registry::Registry;
use crate::snapshot::Snapshot;

/// How many requests of a page's third round are in flight at once.
const READS_IN_FLIGHT: usize = 4;

/// How often a page is read again at the present after its revision was compacted away.
const ATTEMPTS: usize = 3;

/// One page of units ([`Registry::units_page`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnitsPage {
    /// The page's units, their schedule entries, states and unschedulable reasons (no
    /// machines), at `snapshot.revision`, the revision the next page must be read at.
    pub snapshot: Snapshot,
    /// What the next page starts after (the last unit key of this page, corrupt or not),
    /// when more units follow.
    pub next: Option<String>,
    /// The revision asked for was compacted away (or is ahead of the store): this page was
    /// read at the present.
    pub restarted: bool,
}

impl<K: Kv> Registry<K> {
    /// At most `limit` units whose key segment comes after `after` (from the first without
    /// one), with their keys, at `revision` (the present when None). A revision compacted
    /// away (or ahead of the store) reads the page at the present instead
    /// ([`UnitsPage::restarted`]): the listing
    /// goes on from the same cursor at a new revision, so no unit is shown twice or skipped
    /// unless it was created or destroyed in between, which fleet's own pages (each a read
    /// of the present) allowed too.
    pub async fn units_page(
        &self,
        after: Option<&str>,
        limit: usize,
        revision: Option<Revision>,
    ) -> Result<UnitsPage> {
        let mut revision = revision;
        let mut restarted = false;
        for attempt in 1.. {
            match self.read_page(after, limit, revision).await {
                Ok(mut page) => {
                    page.restarted = restarted;
                    return Ok(page);
                }
                Err(RegistryError::Kv { cause, .. }) if attempt < ATTEMPTS && gone(&cause) => {
                    revision = None;
                    restarted = true;
                }
                Err(e) => return Err(e),
            }
        }
        unreachable!("the last attempt returns")
    }

    async fn read_page(
        &self,
        after: Option<&str>,
        limit: usize,
        revision: Option<Revision>,
    ) -> Result<UnitsPage> {
        let keys = self.keys();
        let first = Read::interval(
            start_after(&keys.units(), after),
            dir_end(&keys.units()),
            limit.saturating_add(1),
        );
        let read = self.read_at(&[first], revision).await?;
        let mut snap = Snapshot {
            revision: revision.unwrap_or(read.revision),
            ..Snapshot::default()
        };
        let mut found = read.found.into_iter().next().unwrap_or_default();
        let more = found.len() > limit;
        found.truncate(limit);
        let next = more
            .then(|| found.last())
            .flatten()
            .and_then(|kv| kv.key.strip_prefix(&keys.units()))
            .map(str::to_owned);
        for kv in &found {
            snap.insert(keys, kv);
        }
        let names: BTreeSet<UnitName> = snap.units.keys().cloned().collect();
        let placed = self.placements(&mut snap, &names).await?;
        if let (Some(first), Some(last)) = (names.first(), names.last()) {
            // Schedule and states are keyed machine first: each machine the page is placed
            // on holds the page's entries and states in one interval of names.
            let machines: BTreeSet<&MachineId> = placed.iter().map(|(_, m)| m).collect();
            let reads: Vec<Read> = machines
                .iter()
                .flat_map(|m| {
                    [
                        names_on(&keys.schedule(m, first), &keys.schedule(m, last)),
                        states_on(&keys.state(m, first), &keys.state(m, last)),
                    ]
                })
                .collect();
            // A machine's states are read in key order, at most its bound and one more.
            let mut bound = read::StateBound::default();
            let mut past = BTreeMap::new();
            for kv in self.gets_at(&reads, Some(snap.revision)).await? {
                if let Some(m) = keys.state_machine(&kv.key)
                    && !bound.take(&m)
                {
                    past.insert(m, kv.mod_revision);
                    continue;
                }
                if let Some(Key::Schedule { unit, .. } | Key::State { unit, .. }) =
                    Key::parse(keys, &kv.key)
                    && names.contains(&unit)
                {
                    snap.insert(keys, &kv);
                }
            }
            // A page reads one key past the bound: how many more there are, it does not know.
            for (m, rev) in past {
                let past = read::Past::AtLeast(bound.past(&m));
                snap.skip(read::states_past_bound(keys, &m, past, rev));
            }
        }
        Ok(UnitsPage {
            snapshot: snap,
            next,
            restarted: false,
        })
    }

    /// The placements of `names` (read at `snap`'s revision), and their unschedulable
    /// reasons into `snap`: one request of two intervals.
    async fn placements(
        &self,
        snap: &mut Snapshot,
        names: &BTreeSet<UnitName>,
    ) -> Result<BTreeSet<(UnitName, MachineId)>> {
        let keys = self.keys();
        let (Some(lo), Some(hi)) = (names.first(), names.last()) else {
            return Ok(BTreeSet::new());
        };
        let (from, to) = placement_bounds(names);
        let reads = [
            Read::interval(
                format!("{}{from}", keys.placements()),
                format!("{}{to}", keys.placements()),
                0,
            ),
            Read::interval(
                keys.unscheduled(lo),
                format!("{}\0", keys.unscheduled(hi)),
                0,
            ),
        ];
        let read = self.read_at(&reads, Some(snap.revision)).await?;
        let mut placed = BTreeSet::new();
        let mut found = read.found.into_iter();
        for kv in found.next().unwrap_or_default() {
            if let Some(Key::Placement { unit, machine }) = Key::parse(keys, &kv.key)
                && names.contains(&unit)
            {
                placed.insert((unit, machine));
            }
        }
        for kv in found.next().unwrap_or_default() {
            if matches!(Key::parse(keys, &kv.key), Some(Key::Unscheduled(u)) if names.contains(&u))
            {
                snap.insert(keys, &kv);
            }
        }
        Ok(placed)
    }

    /// The files of `hashes` as they were at `revision`: [`MAX_TXN_OPS`] to a request,
    /// however many files the registry holds. A file that does not parse is skipped.
    pub async fn files_at(
        &self,
        hashes: &BTreeSet<UnitHash>,
        revision: Revision,
    ) -> Result<Listing<BTreeMap<UnitHash, UnitFile>>> {
        self.files_read(hashes, Some(revision)).await
    }

    /// The files of `hashes` now, as [`files_at`](Registry::files_at) reads them: for a
    /// reader whose units were read over several revisions (a file named by any of them is
    /// there now unless a replace collected it since: the reader reads again then). Each
    /// request reads its own present, so the listing's revision is 0.
    pub async fn files_now(
        &self,
        hashes: &BTreeSet<UnitHash>,
    ) -> Result<Listing<BTreeMap<UnitHash, UnitFile>>> {
        self.files_read(hashes, None).await
    }

    async fn files_read(
        &self,
        hashes: &BTreeSet<UnitHash>,
        revision: Option<Revision>,
    ) -> Result<Listing<BTreeMap<UnitHash, UnitFile>>> {
        let keys = self.keys();
        let reads: Vec<Read> = hashes.iter().map(|h| Read::key(keys.file(h))).collect();
        let kvs = self.gets_at(&reads, revision).await?;
        let mut skipped = Vec::new();
        let items = read::all(&kvs, |kv| read::file(keys, kv), &mut skipped)
            .into_iter()
            .collect();
        Ok(Listing {
            revision: revision.unwrap_or(0),
            items,
            skipped,
        })
    }

    /// Every key `reads` find at `revision` (None: the present of each request),
    /// [`MAX_TXN_OPS`] reads to a request, a few requests at once.
    async fn gets_at(&self, reads: &[Read], revision: Option<Revision>) -> Result<Vec<KeyValue>> {
        // Owned chunks: a future borrowing one would not be `Send` for every lifetime, which
        // the API's handlers need.
        let chunks: Vec<Vec<Read>> = reads.chunks(MAX_TXN_OPS).map(<[Read]>::to_vec).collect();
        let chunks: Vec<Result<Vec<KeyValue>>> = futures::stream::iter(chunks)
            .map(|chunk| async move {
                let read = self.read_at(&chunk, revision).await?;
                Ok(read.found.into_iter().flatten().collect())
            })
            .buffered(READS_IN_FLIGHT)
            .collect()
            .await;
        let mut kvs = Vec::new();
        for chunk in chunks {
            kvs.extend(chunk?);
        }
        Ok(kvs)
    }

    async fn read_at(
        &self,
        reads: &[Read],
        revision: Option<Revision>,
    ) -> Result<crate::kv::ReadResult> {
        self.kv()
            .read(reads, revision)
            .await
            .map_err(RegistryError::kv("reading a page of units"))
    }
}

/// Whether a read failed because its revision is not there to read: compacted away, or
/// ahead of the store (a token from before etcd was restored from a backup).
fn gone(cause: &KvError) -> bool {
    match cause {
        KvError::Compacted { .. } => true,
        KvError::Refused(message) => message.contains("future revision"),
        KvError::Unavailable { .. }
        | KvError::Timeout(..)
        | KvError::LeaseNotFound(_)
        | KvError::PermissionDenied { .. }
        | KvError::AuthFailed { .. }
        | KvError::Config(_) => false,
    }
}

/// The keys from `first` to `last` inclusive.
fn names_on(first: &str, last: &str) -> Read {
    Read::interval(first, format!("{last}\0"), 0)
}

/// The states of one machine from `first` to `last`: at most
/// [`read::MAX_STATES_PER_MACHINE`] and one more, so that a host that wrote a million keys
/// between two names of a page costs a page no more than its bound (issue 37).
fn states_on(first: &str, last: &str) -> Read {
    Read::interval(first, format!("{last}\0"), read::MAX_STATES_PER_MACHINE + 1)
}

/// The first key under `dir` after `dir<after>` (all of `dir` without `after`): the key
/// followed by a NUL, the smallest string greater than it.
fn start_after(dir: &str, after: Option<&str>) -> String {
    match after {
        Some(after) => format!("{dir}{after}\0"),
        None => dir.to_owned(),
    }
}

/// The end of the interval of the keys under `dir` (which ends with `/`): `/` is followed by
/// `0` in byte order.
fn dir_end(dir: &str) -> String {
    let base = dir.strip_suffix('/').unwrap_or(dir);
    format!("{base}0")
}

/// The interval of key segments `[from, to)` under `P/placement/` that holds `<name>/…` for
/// every one of `names` (not empty). Not `first/` to `last0`: a name sorts before another it
/// is a prefix of, but `a.service/…` sorts after `a.service.d.service/…` (`.` < `/`), so the
/// bounds are the least and the greatest `<name>/` themselves.
fn placement_bounds(names: &BTreeSet<UnitName>) -> (String, String) {
    let dirs = names.iter().map(|n| format!("{n}/"));
    let from = dirs.clone().min().unwrap_or_default();
    let to = dirs.max().map(|d| dir_end(&d)).unwrap_or_default();
    (from, to)
}

#[cfg(test)]
mod tests;
