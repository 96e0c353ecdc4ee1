//! Listing units: one snapshot (of only the named units' keys when a few are named), and the
//! files of the units listed only (a page of 100 reads 100 files, not every file), each read
//! once however many units share it. A page after a cursor ([`RegistryCluster::units_after`])
//! reads only its own units' keys and files, at the revision of the listing's first page
//! ([`Registry::units_page`](fleet_registry::Registry::units_page)).

use fleet_core::{UnitFile, UnitHash, UnitName};
use fleet_registry::kv::{Kv, Revision};
use fleet_registry::{Listing, RegistryError, Snapshot, Unit};
use futures::StreamExt;
use std::collections::{BTreeMap, BTreeSet};

use super::page::{PageLimit, Report, page_of};
use super::{ATTEMPTS, RegistryCluster, views};
use crate::OpsError;
use crate::model::UnitListing;

/// Above this many files, a listing reads every file at the snapshot's revision in one range
/// instead of one read per file.
const FILES_READ_ONE_BY_ONE: usize = 64;

/// A listing of named units reads only their keys
/// ([`Registry::units_snapshot`](fleet_registry::Registry::units_snapshot)), so its cost does
/// not grow with the registry. Of more names than this (a bulk `fleetctl start`, most of
/// them new), it reads their records first and the rest of the keys of those that exist.
const FEW_UNITS: usize = 1_000;

/// How many units' files a page read from etcd reads at a time, until its files pass the
/// page's bytes.
const FILES_PER_READ: usize = 1_024;

/// How many file reads are in flight at once.
const CONCURRENT_READS: usize = 32;

/// The files a listing read, what it could not read, and whether one was missing (collected
/// by a concurrent replace or destroy since the snapshot: read again).
struct Files {
    files: BTreeMap<UnitHash, UnitFile>,
    skipped: Vec<String>,
    /// The files in `skipped`: present but not readable.
    unreadable: BTreeSet<UnitHash>,
    missing: bool,
}

/// Where the next page of a listing starts: after the unit key segment `after`, at the
/// listing's `revision`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitsCursor {
    pub after: String,
    pub revision: Revision,
}

impl<K: Kv> RegistryCluster<K> {
    /// The units in name order, from the first (no `cursor`) or after `cursor`, that `limit`
    /// lets into a page ([`page_of`]), with the cursor of the next page when more follow.
    /// Each page reads its own units' keys and files only (at most `limit.units` units'),
    /// all at the revision of the listing's first page, so its cost does not grow with the
    /// registry; a revision compacted away since goes on at the present from the same
    /// cursor (the next cursor carries the new revision). Each page carries what it skipped
    /// of its own read. It reads its units' files only until they pass `limit.bytes`.
    pub async fn units_after(
        &self,
        cursor: Option<&UnitsCursor>,
        limit: PageLimit,
    ) -> Result<(UnitListing, Option<UnitsCursor>), OpsError> {
        let after = cursor.map(|c| c.after.as_str());
        let page = self
            .registry
            .units_page(after, limit.units, cursor.map(|c| c.revision))
            .await?;
        let snap = &page.snapshot;
        let (files, read) = self.page_files(snap, limit.bytes).await?;
        // Only the units whose files were read: the page ends there at the latest.
        let limit = PageLimit {
            units: limit.units.min(read),
            ..limit
        };
        let (listing, cut) = page_of(
            snap,
            &files.items,
            files.skipped.iter(),
            after,
            limit,
            Report::PageRead,
        );
        // Cut by its files' bytes, the page ends before the keys read: the next one starts
        // after its last unit. Otherwise after the last unit read, if more follow.
        let next = cut.or_else(|| {
            page.next.map(|after| UnitsCursor {
                after,
                revision: snap.revision,
            })
        });
        Ok((listing, next))
    }

    /// The files of `snap`'s units in name order, [`FILES_PER_READ`] units' at a time, until
    /// they pass `bytes` in the API's form (or every unit's is read), at the snapshot's
    /// revision; with how many units' files were read. A page of 65,535 units of 1 KiB files
    /// so reads about the 8 MiB it serves, not 64 MiB.
    async fn page_files(
        &self,
        snap: &Snapshot,
        bytes: usize,
    ) -> Result<(Listing<BTreeMap<UnitHash, UnitFile>>, usize), OpsError> {
        let units: Vec<&Unit> = snap.units.values().collect();
        let mut files: Listing<BTreeMap<UnitHash, UnitFile>> = Listing::default();
        let (mut read, mut used) = (0, 0usize);
        for chunk in units.chunks(FILES_PER_READ) {
            let hashes: BTreeSet<UnitHash> = chunk
                .iter()
                .map(|u| u.hash())
                .filter(|h| !files.items.contains_key(h))
                .collect();
            let more = self.registry.files_at(&hashes, snap.revision).await?;
            files.items.extend(more.items);
            files.skipped.extend(more.skipped);
            read += chunk.len();
            used = chunk
                .iter()
                .filter_map(|u| files.items.get(&u.hash()))
                .fold(used, |sum, f| sum.saturating_add(f.api_form_len()));
            if used > bytes {
                break;
            }
        }
        Ok((files, read))
    }

    /// One page of [`Cluster::units`]: the units (of `names`, or all) from the `skip`th on,
    /// at most `take`, with whether more follow. Only that page's files are read, so paging
    /// through every unit reads each file once. The first page (`skip` 0) also carries what
    /// the snapshot skipped.
    pub async fn units_page(
        &self,
        names: Option<&BTreeSet<UnitName>>,
        skip: usize,
        take: usize,
    ) -> Result<(UnitListing, bool), OpsError> {
        self.units_where(names, skip, Some(take)).await
    }

    pub(super) async fn units_where(
        &self,
        names: Option<&BTreeSet<UnitName>>,
        skip: usize,
        take: Option<usize>,
    ) -> Result<(UnitListing, bool), OpsError> {
        let mut attempt = 1;
        loop {
            let snap = match names {
                // Many names, most often new ones: their records first, then the rest of
                // the keys of the units that have one. Never a snapshot of everything: a
                // start of 50,000 units into 950,000 read the whole registry that way, and
                // failed past fleetctl's 3 s deadline (issue 43).
                Some(names) if names.len() > FEW_UNITS => {
                    let present = self.registry.units_present(names).await?;
                    self.registry.units_snapshot(&present).await?
                }
                Some(names) => self.registry.units_snapshot(names).await?,
                None => self.registry.snapshot().await?,
            };
            let selected: Vec<&Unit> = snap
                .units
                .values()
                .filter(|u| names.is_none_or(|n| n.contains(u.name())))
                .collect();
            let more = take.is_some_and(|t| selected.len() > skip.saturating_add(t));
            let page: Vec<&Unit> = selected
                .into_iter()
                .skip(skip)
                .take(take.unwrap_or(usize::MAX))
                .collect();
            let hashes: BTreeSet<UnitHash> = page.iter().map(|u| u.hash()).collect();
            let files = self.files_at(&snap, &hashes, names.is_some()).await?;
            if files.missing && attempt < ATTEMPTS {
                attempt += 1;
                continue;
            }
            // A unit whose file cannot be read is left out, as a corrupt record is.
            let missing =
                views::missing_files(page.iter().copied(), &files.files, &files.unreadable);
            let units = page
                .into_iter()
                .filter_map(|u| Some(views::unit_view(&snap, u, files.files.get(&u.hash())?)))
                .collect();
            let mut skipped: Vec<String> = Vec::new();
            if skip == 0 {
                skipped.extend(snap.skipped.values().map(ToString::to_string));
            }
            skipped.extend(files.skipped);
            skipped.extend(missing);
            return Ok((UnitListing { units, skipped }, more));
        }
    }

    /// The files of `hashes`: one by one (concurrently) for a few; for more, those of a
    /// `partial` snapshot (of named units) by key, many to a request, else every file at the
    /// snapshot's revision.
    async fn files_at(
        &self,
        snap: &Snapshot,
        hashes: &BTreeSet<UnitHash>,
        partial: bool,
    ) -> Result<Files, OpsError> {
        if hashes.len() > FILES_READ_ONE_BY_ONE && partial {
            let read = self.registry.files_now(hashes).await?;
            let unreadable = unreadable_files(&read.skipped);
            let missing = hashes
                .iter()
                .any(|h| !read.items.contains_key(h) && !unreadable.contains(h));
            return Ok(Files {
                missing,
                unreadable,
                skipped: read.skipped.iter().map(ToString::to_string).collect(),
                files: read.items,
            });
        }
        if hashes.len() > FILES_READ_ONE_BY_ONE && !partial {
            // Read at the snapshot's revision: every file a unit of it names is there.
            let all = self.registry.files(Some(snap.revision)).await?;
            let keys: BTreeSet<String> = hashes
                .iter()
                .map(|h| self.registry.keys().file(h))
                .collect();
            let skipped: Vec<&fleet_registry::Skipped> = all
                .skipped
                .iter()
                .filter(|s| keys.contains(&s.key))
                .collect();
            return Ok(Files {
                missing: false,
                unreadable: unreadable_files(skipped.iter().copied()),
                skipped: skipped.iter().map(ToString::to_string).collect(),
                files: all.items,
            });
        }
        let read: Vec<(UnitHash, Result<Option<UnitFile>, RegistryError>)> =
            futures::stream::iter(hashes.iter().copied())
                .map(|h| async move { (h, self.registry.file(&h).await) })
                .buffered(CONCURRENT_READS)
                .collect()
                .await;
        let mut files = Files {
            files: BTreeMap::new(),
            skipped: Vec::new(),
            unreadable: BTreeSet::new(),
            missing: false,
        };
        for (hash, res) in read {
            match res {
                Ok(Some(file)) => {
                    files.files.insert(hash, file);
                }
                Ok(None) => files.missing = true,
                Err(RegistryError::Corrupt { key, detail }) => {
                    files.unreadable.insert(hash);
                    files
                        .skipped
                        .push(format!("skipped corrupt registry value at {key}: {detail}"));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(files)
    }
}

/// The files among `skipped` keys: present, but not readable as unit files.
fn unreadable_files<'a>(
    skipped: impl IntoIterator<Item = &'a fleet_registry::Skipped>,
) -> BTreeSet<UnitHash> {
    skipped
        .into_iter()
        .filter_map(|s| match s.named.as_deref() {
            Some(fleet_registry::Key::File(hash)) => Some(*hash),
            _ => None,
        })
        .collect()
}
