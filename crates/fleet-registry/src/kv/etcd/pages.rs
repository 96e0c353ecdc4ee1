//! Paged reads of a prefix: how large a page is (it grows with the request deadline), the
//! intervals a prefix read is cut into and read at once, and the read that pins every page
//! after the first at the first page's revision. Owns no connection: each page is a call
//! through [`EtcdKv`]'s failover like any other read.

use std::time::Duration;

use etcd_client::{Client, GetOptions};
use tokio::time::Instant;
use tracing::debug;

use super::{EtcdKv, Failure, Request, convert, kv_client, watch};
use crate::kv::{KeyValue, KvError, RANGE_PAGE, RangeResult, Revision};

/// The size of a page of a prefix read after the first ([`RANGE_PAGE`] keys): etcd 3.4
/// cannot limit a page by bytes, so the next page asks for as many keys as make `bytes` at
/// the sizes seen so far, at most `keys`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PageSize {
    pub(super) bytes: usize,
    pub(super) keys: usize,
}

/// A page per second of the request deadline, the deadline counted from 1 s to
/// [`PAGE_SECONDS_AT_MOST`].
///
/// Small pages cost: etcd 3.4 walks its index over the rest of the range for every page, so a
/// prefix read in n pages costs etcd about n²/2 walks of a page. 100,000 keys of 150 bytes read
/// 500 at a time took 1.2 s, against 0.35 s in one read. At 400,000 units `list-unit-files`
/// took 8.1-10.8 s and 7.5-10.1 s of etcd's CPU in pages of 4 MiB (at most 10,000 keys),
/// 5.6-6.7 s and 4.9-5.9 s in fleetctl's pages below (3 s: 12 MiB, 30,000 keys), and
/// 5.5-7.4 s in pages of 16 MiB (64 MiB gained nothing more).
///
/// Large pages cost too: each must come within the request deadline. With fleetd's default
/// of 1 s, three listings at once at 100,000 units failed about 6 times in 10 in pages of
/// 4 MiB and every time in pages of 16 MiB. So pages grow with the deadline: fleetd's 1 s
/// keeps 4 MiB, fleetctl's 3 s reads 12 MiB.
pub(super) const PAGE_PER_SECOND: PageSize = PageSize {
    bytes: 4 << 20,
    keys: 10_000,
};

/// Pages stop growing with deadlines longer than this (16 MiB, 40,000 keys).
const PAGE_SECONDS_AT_MOST: f64 = 4.0;

impl PageSize {
    /// The pages of a client whose requests must end within `deadline`.
    pub(super) fn for_deadline(deadline: Duration) -> PageSize {
        let seconds = deadline.as_secs_f64().clamp(1.0, PAGE_SECONDS_AT_MOST);
        let scale = |per_second: usize| (per_second as f64 * seconds) as usize;
        PageSize {
            bytes: scale(PAGE_PER_SECOND.bytes),
            keys: scale(PAGE_PER_SECOND.keys),
        }
    }
}

/// How often a read of the present starts again after history was compacted between its
/// pages.
pub(super) const PINNED_READ_ATTEMPTS: u32 = 3;

/// How often a page of a prefix read that passed its deadline is asked again, each time for
/// half its keys, before the read fails. Every earlier page stays read: the page is asked at
/// the same pinned revision, so the result is still the registry at one revision.
///
/// Only pages after the first: an etcd that answered this read's first page is slow, one
/// that never answered may be hung, and a read of a hung etcd fails within its deadline (a
/// `fleetctl --request-timeout 2 list-units` against a frozen etcd fails within 4 s,
/// functional-tests' `a_frozen_etcd_moves_and_restarts_nothing_and_fleetctl_fails_within_its_timeout`).
///
/// Under a load etcd cannot keep up with, a page of 4 MiB (fleetd's 1 s) passes its deadline
/// when a smaller one does not. In the million at fleetd's defaults, a new engine leader's
/// read of the registry failed its page three times over and started again from its first
/// page each time: scheduling stood still at 273,648 of 400,000 units. A single key is not
/// asked again: it is one small read, and its deadline is the caller's.
pub(super) const PAGE_RETRIES: u32 = 2;

/// The keys a page that passed its deadline asks for when asked again.
pub(super) fn smaller_page(limit: usize) -> usize {
    (limit / 2).max(1)
}

/// A failed paged read: on its first page (nothing pinned yet, or the caller's revision), or
/// on a later one, pinned at the first page's revision.
pub(super) enum Paged {
    First(Failure),
    Later(Failure),
}

impl EtcdKv {
    /// What a failed paged read of `key` at `revision` (None: the present) tells its caller.
    pub(super) async fn paged_error(
        &self,
        failure: Paged,
        key: &str,
        prefix: bool,
        revision: Option<Revision>,
    ) -> KvError {
        match failure {
            Paged::First(Failure::Compacted(_)) | Paged::Later(Failure::Compacted(_)) => {
                let requested = revision.unwrap_or(0);
                // etcd does not say where it compacted to; a watch from revision 1
                // does. If that fails, requested + 1 is still true as a lower bound.
                let deadline = Instant::now() + self.request_timeout;
                let compacted = watch::compact_revision(self, key, deadline).await;
                KvError::Compacted {
                    requested,
                    compacted: compacted.unwrap_or(requested + 1),
                }
            }
            Paged::First(f) | Paged::Later(f) => self.error(f, Request::Range { key, prefix }),
        }
    }

    /// Reads `key` (one key, or the keys under it) at `revision`, a prefix in pages of
    /// about [`PageSize`]: every page after the first is read at the first one's revision,
    /// so the result is the registry at one revision, as a single read would be. Each page
    /// gets the request deadline of its own. What is left after the first page is read as
    /// [`SPLITS`]' intervals at once, each in pages: etcd serves them side by side, and the
    /// pages of one arrive while the others are read.
    ///
    /// Each page goes to `sink` as it arrives, with its interval's place in key order (the
    /// first page is interval 0); an interval's pages come in order. Returns the revision
    /// read at.
    pub(super) async fn read_pages(
        &self,
        key: &str,
        prefix: bool,
        revision: Option<Revision>,
        sink: &(dyn Fn(usize, Vec<KeyValue>) + Sync),
    ) -> Result<Revision, Paged> {
        let end = prefix.then(|| prefix_end(key.as_bytes()));
        let start = key.as_bytes().to_vec();
        let (first, next) = self
            .read_page(start, end.as_deref(), revision.unwrap_or(0), RANGE_PAGE, 0)
            .await
            .map_err(Paged::First)?;
        // etcd's header carries the current revision: for a read of the present, the
        // revision every later page must be read at.
        let pinned = revision.unwrap_or(first.revision);
        let limit = next_page_keys(&first.kvs, self.page);
        sink(0, first.kvs);
        let (Some(next), Some(end)) = (next, end) else {
            return Ok(first.revision);
        };
        let reads = split(key.as_bytes(), next, end)
            .into_iter()
            .enumerate()
            .map(|(i, (start, end))| self.read_interval(start, end, pinned, limit, i + 1, sink));
        futures::future::try_join_all(reads)
            .await
            .map_err(Paged::Later)?;
        Ok(first.revision)
    }

    /// Every key in `[start, end)` at revision `pinned`, in pages (the first of `limit`
    /// keys), each handed to `sink` as interval `interval`.
    async fn read_interval(
        &self,
        mut start: Vec<u8>,
        end: Vec<u8>,
        pinned: Revision,
        mut limit: usize,
        interval: usize,
        sink: &(dyn Fn(usize, Vec<KeyValue>) + Sync),
    ) -> Result<(), Failure> {
        loop {
            let (page, next) = self
                .read_page(start, Some(&end), pinned, limit, PAGE_RETRIES)
                .await?;
            limit = next_page_keys(&page.kvs, self.page);
            sink(interval, page.kvs);
            match next {
                Some(next) => start = next,
                None => return Ok(()),
            }
        }
    }

    /// One page: `start` alone (no `end`), or up to `limit` keys of `[start, end)`, at
    /// revision `pinned` (0: the present), on whichever member answers under a request
    /// deadline of its own (at a pinned revision every member serves the same keys). A page
    /// of a range that passes its deadline is asked again for fewer keys, up to `retries`
    /// times ([`PAGE_RETRIES`]). With the key the next page starts at, if there are more.
    async fn read_page(
        &self,
        start: Vec<u8>,
        end: Option<&[u8]>,
        pinned: Revision,
        mut limit: usize,
        retries: u32,
    ) -> Result<(RangeResult, Option<Vec<u8>>), Failure> {
        let mut retries = if end.is_some() { retries } else { 0 };
        loop {
            match self.ask_page(start.clone(), end, pinned, limit).await {
                Err(Failure::Timeout) if retries > 0 => {
                    retries -= 1;
                    limit = smaller_page(limit);
                    debug!(
                        timeout = ?self.request_timeout,
                        keys = limit,
                        "a page passed its deadline, asking again for fewer keys"
                    );
                }
                answer => return answer,
            }
        }
    }

    /// One request of [`read_page`](Self::read_page)'s.
    async fn ask_page(
        &self,
        start: Vec<u8>,
        end: Option<&[u8]>,
        pinned: Revision,
        limit: usize,
    ) -> Result<(RangeResult, Option<Vec<u8>>), Failure> {
        let mut options = GetOptions::new().with_revision(pinned);
        if let Some(end) = end {
            options = options
                .with_range(end.to_vec())
                .with_limit(i64::try_from(limit).unwrap_or(i64::MAX));
        }
        let get = |c: Client| {
            let (start, options) = (start.clone(), options.clone());
            async move { kv_client(&c).get(start, Some(options)).await }
        };
        let resp = self.read(get).await?;
        let next = (end.is_some() && resp.more())
            .then(|| resp.kvs().last().map(|kv| after(kv.key())))
            .flatten();
        Ok((convert::range_result(resp), next))
    }
}

/// Where the rest of a prefix read is cut into intervals read at once: after the prefix,
/// keys starting below "4", "8", "c", "i", "p", and the others. Machine IDs (hex) spread
/// over the first four; unit names over the last three. Any key falls in exactly one of
/// them, so a prefix of other keys is read as it would be in one interval.
const SPLITS: [&[u8]; 5] = [b"4", b"8", b"c", b"i", b"p"];

/// `[from, end)` cut at the [`SPLITS`] after `prefix` that fall inside it, in key order.
pub(super) fn split(prefix: &[u8], from: Vec<u8>, end: Vec<u8>) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut cuts: Vec<Vec<u8>> = SPLITS
        .iter()
        .map(|s| [prefix, s].concat())
        .filter(|cut| *cut > from && (*cut < end || end == [0]))
        .collect();
    cuts.push(end);
    let mut intervals = Vec::with_capacity(cuts.len());
    let mut start = from;
    for cut in cuts {
        intervals.push((std::mem::replace(&mut start, cut.clone()), cut));
    }
    intervals
}

/// How many keys the page after `page` asks for: about `size` of keys like these.
pub(super) fn next_page_keys(page: &[KeyValue], size: PageSize) -> usize {
    let bytes: usize = page.iter().map(|kv| kv.key.len() + kv.value.len()).sum();
    let per_key = (bytes / page.len().max(1)).max(1);
    (size.bytes / per_key).clamp(1, size.keys)
}

/// The end of the range of keys starting with `prefix` (etcd-client's `with_prefix`).
pub(super) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    match prefix.iter().rposition(|b| *b < 0xff) {
        Some(i) => {
            let mut end = prefix[..=i].to_vec();
            end[i] += 1;
            end
        }
        // Every key from `prefix` on: etcd reads "\0" as "no end".
        None => vec![0],
    }
}

/// The first key after `key`.
pub(super) fn after(key: &[u8]) -> Vec<u8> {
    let mut next = key.to_vec();
    next.push(0);
    next
}
