//! One page of a unit listing, built from a snapshot of the registry without I/O: from the
//! view fleetd's API holds and from a page read from etcd alike, so the two cut their pages
//! and report what they could not read the same way.
//!
//! A page holds at most a count of units, and at most [`PAGE_BYTES`] of their files as the
//! API writes them (issue 43). fleetctl asks for pages of 65,535 units, and a registry of
//! large unit files made a page of tens of MB: 24 MB took up to 4.3 s to serve in a debug
//! build, and a few hundred MB would pass fleetctl's 3 s deadline whatever the build. The
//! page's cursor says where the next one starts, whatever cut it.

use fleet_core::{UnitFile, UnitHash, UnitName};
use fleet_registry::{Key, Skipped, Snapshot, Unit};
use std::collections::{BTreeMap, BTreeSet};

use super::listing::UnitsCursor;
use super::views;
use crate::model::UnitListing;

/// The most of its units' files, in the API's form, that one page holds (a unit whose file
/// alone is larger still makes a page of one). A unit file's API form is at most 3 MiB
/// (`fleet_core::unit_file::MAX_API_FORM_BYTES`).
pub const PAGE_BYTES: usize = 8 * 1024 * 1024;

/// How much one page of a unit listing holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageLimit {
    /// At most this many units (at least one).
    pub units: usize,
    /// Units while their files' API form is within this many bytes (at least one unit).
    pub bytes: usize,
}

impl PageLimit {
    /// Everything: the full view's whole listing, one page by definition.
    pub const WHOLE: PageLimit = PageLimit {
        units: usize::MAX,
        bytes: usize::MAX,
    };

    /// Pages of at most `units` units and [`PAGE_BYTES`] of files.
    pub fn units(units: usize) -> PageLimit {
        PageLimit {
            units,
            bytes: PAGE_BYTES,
        }
    }
}

/// Which of the values that could not be read a page reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    /// A page of a snapshot of everything (fleetd's held view): the values of its own units'
    /// keys, and those that name nothing on the first page only.
    Page,
    /// A page read from etcd by itself: the values of its own units' keys, and every value
    /// of its read that names nothing (that read was the page's own).
    PageRead,
    /// The whole listing: everything the registry could not read, as one snapshot's
    /// listing reports it.
    Whole,
}

/// The units of `snap` after the unit named `after` (from the first without one) that
/// `limit` lets into one page, with the cursor of the next page when more follow. A unit
/// whose file is not in `files` is left out, as a corrupt record is, and reported: as its
/// unreadable file, or as a file missing from the registry. What could not be read is
/// reported as `report` says: for a page, the values of its own units' keys (its records,
/// schedule entries, states, reasons and files) and, as [`Report`] says, those naming
/// nothing; for the whole listing, everything (`snap.skipped`, and the `unreadable` files a
/// unit names).
pub fn page_of<'a>(
    snap: &'a Snapshot,
    files: &BTreeMap<UnitHash, UnitFile>,
    unreadable: impl Iterator<Item = &'a Skipped>,
    after: Option<&str>,
    limit: PageLimit,
    report: Report,
) -> (UnitListing, Option<UnitsCursor>) {
    let (page, more) = select(snap, files, after, limit);
    let units = page
        .iter()
        .filter_map(|u| Some(views::unit_view(snap, u, files.get(&u.hash())?)))
        .collect();
    let unreadable: Vec<&Skipped> = unreadable.collect();
    let unreadable_hashes: BTreeSet<UnitHash> = unreadable
        .iter()
        .filter_map(|s| match s.named.as_deref() {
            Some(Key::File(hash)) => Some(*hash),
            _ => None,
        })
        .collect();
    let missing = views::missing_files(page.iter().copied(), files, &unreadable_hashes);
    // The page's names: after `after`, up to its last unit (to the end on the last page).
    let last = page.last().filter(|_| more).map(|u| u.name().as_str());
    let on_page = |name: &UnitName| {
        after.is_none_or(|a| name.as_str() > a) && last.is_none_or(|l| name.as_str() <= l)
    };
    let first = after.is_none();
    let reported = |s: &&Skipped| match (report, s.named.as_deref()) {
        (Report::Whole, _) => true,
        (
            Report::Page | Report::PageRead,
            Some(
                Key::Unit(name)
                | Key::Schedule { unit: name, .. }
                | Key::State { unit: name, .. }
                | Key::Unscheduled(name),
            ),
        ) => on_page(name),
        (Report::Page | Report::PageRead, Some(_)) => false,
        (Report::Page, None) => first,
        (Report::PageRead, None) => true,
    };
    // Only the files some listed unit names, as a listing from etcd reads only those.
    let mut unreadable = unreadable.into_iter().peekable();
    let named: BTreeSet<UnitHash> = match (unreadable.peek(), report) {
        (None, _) => BTreeSet::new(),
        (Some(_), Report::Page | Report::PageRead) => page.iter().map(|u| u.hash()).collect(),
        (Some(_), Report::Whole) => snap.units.values().map(Unit::hash).collect(),
    };
    let unreadable = unreadable
        .filter(|s| matches!(s.named.as_deref(), Some(Key::File(hash)) if named.contains(hash)));
    let skipped = snap
        .skipped
        .values()
        .filter(reported)
        .chain(unreadable)
        .map(ToString::to_string)
        .chain(missing)
        .collect();
    let next = page.last().filter(|_| more).map(|u| UnitsCursor {
        after: u.name().to_string(),
        revision: snap.revision,
    });
    (UnitListing { units, skipped }, next)
}

/// The units after `after` that `limit` lets into a page, in name order, and whether more
/// follow. A unit whose file is not in `files` counts no bytes (it is left out of the page's
/// units and reported).
fn select<'a>(
    snap: &'a Snapshot,
    files: &BTreeMap<UnitHash, UnitFile>,
    after: Option<&str>,
    limit: PageLimit,
) -> (Vec<&'a Unit>, bool) {
    let mut rest = snap
        .units
        .values()
        .skip_while(|u| after.is_some_and(|a| u.name().as_str() <= a))
        .peekable();
    let mut page = Vec::new();
    let mut bytes = 0usize;
    while let Some(unit) = rest.peek() {
        if page.len() >= limit.units.max(1) {
            break;
        }
        if limit.bytes != usize::MAX {
            let size = files.get(&unit.hash()).map_or(0, UnitFile::api_form_len);
            if !page.is_empty() && bytes.saturating_add(size) > limit.bytes {
                break;
            }
            bytes = bytes.saturating_add(size);
        }
        page.push(*unit);
        rest.next();
    }
    let more = rest.peek().is_some();
    (page, more)
}

#[cfg(test)]
mod tests;
