//! [`Cluster::create_many`] over the registry: many units per transaction
//! ([`UnitsRole::create_batch`], within etcd's default `--max-txn-ops`), several
//! transactions in flight. Each unit is decided as a single create would be
//! ([`decide::decide_put`] on no existing unit), so a bad request is refused the same way.
//!
//! What a failure leaves: a batch is all or nothing, and once one fails no new batch starts.
//! The batches before it (and those already in flight) are written, the failed one and every
//! later one are not: the first unit of the failed batch carries the error, the rest say
//! [`OpsError::NotWritten`]. Creating the same units again writes only those missing. A
//! batch that finds one of its units already there writes nothing; its units are then
//! created one by one, which decides what the existing one means, as a single create does.

use fleet_core::{DesiredState, UnitFile};
use fleet_registry::kv::Kv;
use fleet_registry::{NewUnit, batches};

use super::batches::{Batch, not_written, send_batches};
use super::{RegistryCluster, Sent, views};
use crate::decide::{self, PutPlan};
use crate::model::{Expect, PutOutcome, PutRequest};
use crate::{Cluster, Created, OpsError};

impl<K: Kv> RegistryCluster<K> {
    /// Creates `reqs` in batches on this cluster, which records nothing (issue 41): the units
    /// its batches wrote are recorded by `recorder`, and a unit of a batch that collided is
    /// written through `recorder`'s own `put_if`, which records it itself.
    pub(super) async fn create_all(
        &self,
        recorder: &RegistryCluster<K>,
        reqs: Vec<PutRequest>,
    ) -> Created {
        let mut results: Vec<Option<Result<PutOutcome, OpsError>>> = Vec::new();
        let mut planned: Vec<(usize, UnitFile, DesiredState)> = Vec::new();
        for (i, req) in reqs.iter().enumerate() {
            match decide::decide_put(req, None) {
                Ok(PutPlan::Create { file, desired }) => {
                    planned.push((i, file, desired));
                    results.push(None);
                }
                Ok(_) => unreachable!("a put with no unit is a create"),
                Err(e) => results.push(Some(Err(e))),
            }
        }
        let units: Vec<NewUnit<'_>> = planned
            .iter()
            .map(|(i, file, desired)| NewUnit {
                name: &reqs[*i].name,
                file,
                desired: *desired,
            })
            .collect();
        let units = &units;
        let sent = Sent::now();
        let written = send_batches(
            batches(units),
            |range| units[range.start].name.clone(),
            |range| async move { Ok(self.units.create_batch(&units[range]).await?) },
        )
        .await;
        for (range, batch) in written {
            let planned = &planned[range.clone()];
            match batch {
                Batch::Written(written) => {
                    for ((i, file, _), unit) in planned.iter().zip(written) {
                        let view = views::written_view(&unit, file);
                        let created = Ok(PutOutcome::Created(view));
                        recorder.record_put(&reqs[*i].name, &created, sent);
                        results[*i] = Some(created);
                    }
                }
                Batch::Collided => {
                    for (i, _, _) in planned {
                        let req = reqs[*i].clone();
                        results[*i] = Some(recorder.put_if(req, Expect::Absent).await);
                    }
                }
                failed => not_written(
                    failed,
                    planned.iter().map(|(i, _, _)| *i),
                    |i| reqs[i].name.clone(),
                    |i, e| results[i] = Some(Err(e)),
                ),
            }
        }
        reqs.into_iter()
            .zip(results)
            .map(|(req, res)| (req.name, res.expect("every unit has its result")))
            .collect()
    }
}
