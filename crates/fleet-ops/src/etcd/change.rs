//! [`Cluster::put_many_if`] and [`Cluster::destroy_many`] over the registry: the replaces
//! and destroys of one command go many units per transaction ([`UnitsRole::change_batch`],
//! within etcd's default `--max-txn-ops`), several transactions in flight, after one read
//! of every record (and of each distinct file) instead of one read per unit. `start
//! --replace` and `destroy` of 300 units took 3.2 s and 1.5 s this way one unit per
//! transaction (docs/benchmarks.md, "Lifecycle latency").
//!
//! Each unit is decided as its single write would be ([`decide::decide_put`], the caller's
//! [`Expect`]), so a refused request is refused the same way. Anything the batch does not
//! cover is done one unit at a time, by the single write: a unit missing or unreadable, a
//! put that is not a replace (a state change, nothing to do), a `--reschedule` (it reads
//! the placement), a name given twice, and every unit of a batch that found one of its units
//! changed since the read. A failure stops new batches as for creates ([`super::batches`]).

use fleet_core::{Requirements, UnitFile, UnitHash, UnitName};
use fleet_registry::kv::Kv;
use fleet_registry::{Change, MAX_TXN_OPS, ReplaceState, Unit, change_batches, dropped_files};
use futures::StreamExt;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use tracing::debug;

use super::batches::{Batch, not_written, send_batches};
use super::{RegistryCluster, views};
use crate::decide::{self, PutPlan};
use crate::model::{Destroyed, Expect, PutOutcome, PutRequest};
use crate::{Cluster, Created, DestroyedMany, IN_FLIGHT, OpsError};

/// A replace the batches write: the request's index, its new file and replace options.
struct Planned {
    at: usize,
    file: UnitFile,
    desired: fleet_core::DesiredState,
    replace: ReplaceState,
}

impl<K: Kv> RegistryCluster<K> {
    pub(super) async fn put_all_if(&self, reqs: Vec<(PutRequest, Expect)>) -> Created {
        let names: BTreeSet<UnitName> = reqs.iter().map(|(r, _)| r.name.clone()).collect();
        let Ok((found, files)) = self.records_and_files(&names).await else {
            // A record or file that cannot be read among them: each unit its own way.
            return all_done(self.put_each(reqs, |_| true).await);
        };
        let mut results: Vec<Option<Result<PutOutcome, OpsError>>> =
            reqs.iter().map(|_| None).collect();
        let mut planned = Vec::new();
        let mut seen = BTreeSet::new();
        for (at, (req, expect)) in reqs.iter().enumerate() {
            let Some(unit) = found.get(&req.name) else {
                continue;
            };
            let Some(file) = files.get(&unit.hash()) else {
                continue;
            };
            if req.how.reschedule || !seen.insert(&req.name) {
                continue;
            }
            if let Err(e) = expect.check(req, Some(unit.hash())) {
                results[at] = Some(Err(e));
                continue;
            }
            match decide::decide_put(req, Some((unit, file))) {
                Ok(PutPlan::Replace {
                    existing,
                    file,
                    desired,
                }) => {
                    let global = Requirements::global(&req.name, &file);
                    let replace = decide::replace_state(req.how, &existing, desired, None, global);
                    planned.push(Planned {
                        at,
                        file,
                        desired,
                        replace,
                    });
                }
                Ok(_) => {}
                Err(e) => results[at] = Some(Err(e)),
            }
        }
        let changes: Vec<Change<'_>> = planned
            .iter()
            .map(|p| Change::Replace {
                existing: &found[&reqs[p.at].0.name],
                file: &p.file,
                desired: p.desired,
                replace: p.replace.clone(),
            })
            .collect();
        let written = self.send_changes(&changes).await;
        let landed = settle(
            written,
            &changes,
            |k| planned[k].at,
            |at| reqs[at].0.name.clone(),
            &mut results,
            |k, unit| {
                let unit = unit.expect("a replace writes its record");
                PutOutcome::Replaced(views::written_view(&unit, &planned[k].file))
            },
        );
        debug!(
            units = reqs.len(),
            batched = landed.len(),
            "replaced units together"
        );
        self.units.collect_files(&dropped_files(landed)).await;
        let rest = self.put_each(reqs, |at| results[at].is_none()).await;
        merge(results, rest)
    }

    pub(super) async fn destroy_all(&self, names: Vec<UnitName>) -> DestroyedMany {
        let set: BTreeSet<UnitName> = names.iter().cloned().collect();
        let Ok(found) = self.units.units_named(&set).await else {
            // A record that cannot be read among them: the single destroy removes it.
            return all_done(self.destroy_each(names, |_| true).await);
        };
        let mut results: Vec<Option<Result<Destroyed, OpsError>>> =
            names.iter().map(|_| None).collect();
        let mut seen = BTreeSet::new();
        let planned: Vec<usize> = (0..names.len())
            .filter(|&at| found.contains_key(&names[at]) && seen.insert(&names[at]))
            .collect();
        let changes: Vec<Change<'_>> = planned
            .iter()
            .map(|&at| Change::Destroy(&found[&names[at]]))
            .collect();
        let written = self.send_changes(&changes).await;
        let landed = settle(
            written,
            &changes,
            |k| planned[k],
            |at| names[at].clone(),
            &mut results,
            |_, _| Destroyed::Unit,
        );
        debug!(
            units = names.len(),
            batched = landed.len(),
            "destroyed units together"
        );
        self.units.collect_files(&dropped_files(landed)).await;
        let rest = self.destroy_each(names, |at| results[at].is_none()).await;
        merge(results, rest)
    }

    /// Sends `changes` as batches, several at a time.
    async fn send_changes<'a>(
        &self,
        changes: &'a [Change<'a>],
    ) -> Vec<(Range<usize>, Batch<Option<Unit>>)> {
        send_batches(
            change_batches(changes),
            |range| changes[range.start].name().clone(),
            |range| async move { Ok(self.units.change_batch(&changes[range]).await?) },
        )
        .await
    }

    /// The records of `names` that exist, and the file of each, read together.
    async fn records_and_files(
        &self,
        names: &BTreeSet<UnitName>,
    ) -> Result<(BTreeMap<UnitName, Unit>, BTreeMap<UnitHash, UnitFile>), OpsError> {
        let found = self.units.units_named(names).await?;
        let hashes: BTreeSet<UnitHash> = found.values().map(Unit::hash).collect();
        let hashes: Vec<UnitHash> = hashes.into_iter().collect();
        let mut files = BTreeMap::new();
        for chunk in hashes.chunks(MAX_TXN_OPS) {
            for (hash, file) in self.registry.files_named(chunk).await? {
                // A file missing (collected by a concurrent replace) or unreadable: that unit
                // goes the single way, which reads it again.
                if let Ok(Some(file)) = file {
                    files.insert(hash, file);
                }
            }
        }
        Ok((found, files))
    }

    /// The single put of every request `todo` says, [`IN_FLIGHT`] at a time; `None` for the
    /// others. In the order asked.
    async fn put_each(
        &self,
        reqs: Vec<(PutRequest, Expect)>,
        todo: impl Fn(usize) -> bool,
    ) -> Vec<(UnitName, Option<Result<PutOutcome, OpsError>>)> {
        futures::stream::iter(reqs.into_iter().enumerate())
            .map(|(at, (req, expect))| {
                let todo = todo(at);
                async move {
                    let name = req.name.clone();
                    let res = match todo {
                        true => Some(self.put_if(req, expect).await),
                        false => None,
                    };
                    (name, res)
                }
            })
            .buffered(IN_FLIGHT)
            .collect()
            .await
    }

    /// The single destroy of every name `todo` says, [`IN_FLIGHT`] at a time.
    async fn destroy_each(
        &self,
        names: Vec<UnitName>,
        todo: impl Fn(usize) -> bool,
    ) -> Vec<(UnitName, Option<Result<Destroyed, OpsError>>)> {
        futures::stream::iter(names.into_iter().enumerate())
            .map(|(at, name)| {
                let todo = todo(at);
                async move {
                    let res = match todo {
                        true => Some(self.destroy(&name).await),
                        false => None,
                    };
                    (name, res)
                }
            })
            .buffered(IN_FLIGHT)
            .collect()
            .await
    }
}

/// Turns how each batch ended into results: the `k`th change written gives `done(k, unit)`
/// at request `at(k)`; a failed or stopped batch's units are not written; a collided
/// batch's are left for the single way. Returns the changes that landed.
fn settle<'c, R>(
    written: Vec<(Range<usize>, Batch<Option<Unit>>)>,
    changes: &'c [Change<'c>],
    at: impl Fn(usize) -> usize,
    name: impl Fn(usize) -> UnitName,
    results: &mut [Option<Result<R, OpsError>>],
    mut done: impl FnMut(usize, Option<Unit>) -> R,
) -> Vec<&'c Change<'c>> {
    let mut landed = Vec::new();
    for (range, batch) in written {
        match batch {
            Batch::Written(units) => {
                for (k, unit) in range.clone().zip(units) {
                    results[at(k)] = Some(Ok(done(k, unit)));
                }
                landed.extend(range.map(|k| &changes[k]));
            }
            Batch::Collided => {}
            failed => not_written(failed, range.map(&at), &name, |i, e| {
                results[i] = Some(Err(e))
            }),
        }
    }
    landed
}

/// The batches' results, with the single writes' where the batches left none.
fn merge<T>(
    results: Vec<Option<Result<T, OpsError>>>,
    rest: Vec<(UnitName, Option<Result<T, OpsError>>)>,
) -> Vec<(UnitName, Result<T, OpsError>)> {
    results
        .into_iter()
        .zip(rest)
        .map(|(done, (name, single))| (name, done.or(single).expect("every unit has its result")))
        .collect()
}

/// Results of which every unit has one.
fn all_done<T>(results: Vec<(UnitName, Option<T>)>) -> Vec<(UnitName, T)> {
    results
        .into_iter()
        .map(|(name, res)| (name, res.expect("every unit has its result")))
        .collect()
}
