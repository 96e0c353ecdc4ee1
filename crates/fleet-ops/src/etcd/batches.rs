//! Sending a command's batches (each one transaction of many units, all or nothing) several
//! at a time, for creates, replaces and destroys alike. Once one fails no new batch starts:
//! the batches before it (and those already in flight) are written, the failed one and every
//! later one are not. How each batch ended is the caller's to turn into per-unit results.
//! How many are in flight is paced to etcd's answers ([`pace`]).

use fleet_core::UnitName;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use std::future::Future;
use std::ops::Range;
use std::sync::Mutex;
use tokio::time::Instant;

use crate::OpsError;

mod pace;
use pace::Pacer;

/// How many batch transactions are in flight at once at most; fewer while etcd's answers
/// say it is queueing them ([`pace`]).
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

/// Sends every batch of `ranges` with `send`, in order, as many at once as the [`Pacer`]
/// allows (at most [`BATCHES_IN_FLIGHT`]). `send` answers `None` for a collision; `first`
/// names a batch's first unit. The results come in the order of `ranges`.
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
    let one = |range: Range<usize>| send_one(range, &failed, &first, &send);
    let mut pacer = Pacer::new(BATCHES_IN_FLIGHT);
    let mut done: Vec<Option<(Range<usize>, Batch<T>)>> = Vec::new();
    done.resize_with(ranges.len(), || None);
    let mut waiting = ranges.into_iter().enumerate().peekable();
    let mut in_flight = FuturesUnordered::new();
    // The first batch not answered yet: as with a window of `buffered`, no batch starts more
    // than the pacer's count past it, so a batch that takes long (a failure being read back)
    // holds back the ones after it.
    let mut oldest = 0;
    loop {
        let window = oldest + pacer.in_flight();
        while let Some((at, range)) = waiting.next_if(|(at, _)| *at < window) {
            let (epoch, sent) = (pacer.epoch(), Instant::now());
            let batch = one(range.clone());
            in_flight.push(async move { (at, epoch, sent, range, batch.await) });
        }
        let Some((at, epoch, sent, range, batch)) = in_flight.next().await else {
            break;
        };
        if matches!(batch, Batch::Written(_) | Batch::Collided) {
            pacer.answered(epoch, sent.elapsed());
        }
        done[at] = Some((range, batch));
        while done.get(oldest).is_some_and(Option::is_some) {
            oldest += 1;
        }
    }
    done.into_iter()
        .map(|d| d.expect("every batch was sent or stopped"))
        .collect()
}

/// Sends one batch, unless an earlier one failed (`failed` names its first unit, set here
/// when this one fails).
async fn send_one<T, F, Fut>(
    range: Range<usize>,
    failed: &Mutex<Option<UnitName>>,
    first: impl Fn(&Range<usize>) -> UnitName,
    send: F,
) -> Batch<T>
where
    F: Fn(Range<usize>) -> Fut,
    Fut: Future<Output = Result<Option<Vec<T>>, OpsError>>,
{
    let stopped = failed.lock().map(|f| f.clone()).unwrap_or_default();
    if let Some(with) = stopped {
        return Batch::Stopped(with);
    }
    match send(range.clone()).await {
        Ok(Some(written)) => Batch::Written(written),
        Ok(None) => Batch::Collided,
        Err(e) => {
            if let Ok(mut f) = failed.lock() {
                f.get_or_insert_with(|| first(&range));
            }
            Batch::Failed(e)
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// Sends 300 one-unit batches to an etcd that answers each after `latency(n)`, n being
    /// how many were in flight when it was sent; returns how many were in flight at each send.
    async fn sends(latency: impl Fn(usize) -> Duration) -> Vec<usize> {
        let (now, seen) = (AtomicUsize::new(0), Mutex::new(Vec::new()));
        let send = |range: Range<usize>| {
            let n = now.fetch_add(1, Ordering::SeqCst) + 1;
            seen.lock().unwrap().push(n);
            let (now, took) = (&now, latency(n));
            async move {
                tokio::time::sleep(took).await;
                now.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, OpsError>(Some(vec![range.start]))
            }
        };
        let ranges: Vec<Range<usize>> = (0..300).map(|i| i..i + 1).collect();
        let name = |_: &Range<usize>| "a.service".parse().unwrap();
        let out = send_batches(ranges, name, send).await;
        for (i, (range, batch)) in out.into_iter().enumerate() {
            assert_eq!(range, i..i + 1, "in the order sent");
            assert!(matches!(batch, Batch::Written(w) if w == [i]));
        }
        seen.into_inner().unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn an_etcd_that_keeps_up_gets_every_batch_in_flight_at_once() {
        // The batches of a round are answered together and sent again together: each round
        // past the first three fills up to the most.
        let seen = sends(|_| Duration::from_millis(40)).await;
        let full_rounds = seen.iter().filter(|n| **n == BATCHES_IN_FLIGHT).count();
        assert_eq!(
            full_rounds,
            (300 - 1 - 2 - 4) / BATCHES_IN_FLIGHT,
            "{seen:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_queue_the_batches_make_keeps_fewer_in_flight() {
        // Each batch in flight adds 60 ms: past 5 at once, etcd's queue is the command's.
        let seen = sends(|n| Duration::from_millis(60) * n as u32).await;
        let steady = &seen[20..];
        assert!(steady.iter().all(|n| *n < BATCHES_IN_FLIGHT), "{seen:?}");
        let mean = steady.iter().sum::<usize>() as f64 / steady.len() as f64;
        assert!(mean >= 2.5, "still several at once: {mean} {seen:?}");
    }
}
