//! Sending a command's batches (each one transaction of many units, all or nothing) several
//! at a time, for creates, replaces and destroys alike. Once one fails no new batch starts:
//! the batches before it (and those already in flight) are written, the failed one and every
//! later one are not. How each batch ended is the caller's to turn into per-unit results.

use fleet_core::UnitName;
use futures::StreamExt;
use std::future::Future;
use std::ops::Range;
use std::sync::Mutex;

use crate::OpsError;

/// How many batch transactions are in flight at once.
pub const BATCHES_IN_FLIGHT: usize = 8;

/// What became of one batch.
pub(super) enum Batch<T> {
    /// Written: what each unit of it became, in order.
    Written(Vec<T>),
    /// A unit of it exists (a create) or changed since it was read: nothing written.
    Collided,
    Failed(OpsError),
    /// Not sent: an earlier batch failed on this unit.
    Stopped(UnitName),
}

/// Sends every batch of `ranges` with `send` ([`BATCHES_IN_FLIGHT`] at a time), in order.
/// `send` answers `None` for a collision; `first` names a batch's first unit.
pub(super) async fn send_batches<T, F, Fut>(
    ranges: Vec<Range<usize>>,
    first: impl Fn(&Range<usize>) -> UnitName,
    send: F,
) -> Vec<(Range<usize>, Batch<T>)>
where
    F: Fn(Range<usize>) -> Fut,
    Fut: Future<Output = Result<Option<Vec<T>>, OpsError>>,
{
    let failed: Mutex<Option<UnitName>> = Mutex::new(None);
    futures::stream::iter(ranges)
        .map(|range| {
            let (failed, first, send) = (&failed, &first, &send);
            async move {
                let stopped = failed.lock().map(|f| f.clone()).unwrap_or_default();
                let batch = match stopped {
                    Some(with) => Batch::Stopped(with),
                    None => match send(range.clone()).await {
                        Ok(Some(written)) => Batch::Written(written),
                        Ok(None) => Batch::Collided,
                        Err(e) => {
                            if let Ok(mut f) = failed.lock() {
                                f.get_or_insert_with(|| first(&range));
                            }
                            Batch::Failed(e)
                        }
                    },
                };
                (range, batch)
            }
        })
        .buffered(BATCHES_IN_FLIGHT)
        .collect()
        .await
}

/// The results of a batch that was not written because it failed (its first unit carries
/// the error) or an earlier one did, for units `at` of it.
pub(super) fn not_written<R>(
    batch: Batch<R>,
    at: impl IntoIterator<Item = usize>,
    name: impl Fn(usize) -> UnitName,
    mut set: impl FnMut(usize, OpsError),
) {
    let (mut first_error, with) = match batch {
        Batch::Failed(e) => (Some(e), None),
        Batch::Stopped(with) => (None, Some(with)),
        Batch::Written(_) | Batch::Collided => return,
    };
    let mut at = at.into_iter().peekable();
    let with = with.unwrap_or_else(|| name(*at.peek().expect("a batch has a unit")));
    for i in at {
        match first_error.take() {
            Some(e) => set(i, e),
            None => set(i, OpsError::NotWritten { with: with.clone() }),
        }
    }
}
