//! [`Cluster`] over the registry: fleetctl's etcd driver and fleetd's API handlers both run
//! this, so the two can never disagree.
//!
//! Reads are consistent: a listing is built from one snapshot (one etcd revision), and the
//! files of the units it shows. Writes read the unit, decide with the pure functions of
//! [`crate::decide`], and write conditionally (compare-and-swap on the record's revision);
//! when another client changed the unit in between, they read again, at most [`ATTEMPTS`]
//! times, then give up with [`OpsError::Conflict`]. A refused request writes nothing.
//!
//! The view a write returns is the record and file as written, without placement (see
//! [`views::written_view`]): writes never read the schedule, which at 10,000 units would
//! cost a whole snapshot per unit. Nothing here logs an error: callers decide what a failure
//! means; only what was written is logged, at debug.

mod batches;
mod change;
mod create;
mod events;
mod feed;
mod listing;
mod maintenance;
pub mod page;
pub mod views;
mod watch;

pub use batches::BATCHES_IN_FLIGHT;
pub use events::Sent;
pub use feed::CHANGE_EVERY;
pub use listing::UnitsCursor;
pub use watch::RegistryChanges;

use fleet_core::{DesiredState, MachineId, Requirements, UnitFile, UnitName};
use fleet_registry::kv::Kv;
use fleet_registry::{
    CreateOutcome, EventFilter, LeaderKey, MetadataChange, Registry, RegistryError, Unit, UnitsRole,
};
use std::collections::BTreeSet;
use tracing::debug;

use crate::decide::{self, PutPlan, RestartPlan};
use crate::model::{
    Destroyed, EventListing, EventStream, Expect, MachineListing, PutOutcome, PutRequest,
    Restarted, StateChange, StateFilter, StateListing, UnitListing, UnitView,
};
use crate::{Cluster, DrainStatus, Explanation, OpsError};

/// How often a write re-reads a unit that another client keeps changing.
pub const ATTEMPTS: usize = 5;

/// The registry as fleetctl and the API use it: shared reads, and the units role for every
/// write.
#[derive(Debug, Clone)]
pub struct RegistryCluster<K> {
    registry: Registry<K>,
    units: UnitsRole<K>,
    /// Where user actions are recorded, and as whose (issue 41).
    recorder: events::Recorder,
}

impl<K: Kv> RegistryCluster<K> {
    pub fn new(registry: Registry<K>) -> RegistryCluster<K> {
        let units = UnitsRole::new(registry.clone());
        RegistryCluster {
            registry,
            units,
            recorder: events::Recorder::default(),
        }
    }

    pub fn registry(&self) -> &Registry<K> {
        &self.registry
    }

    /// The states of `names` on every machine (the API's `GET /state?unitName=…`): reads only
    /// their keys, however many other units the registry holds.
    pub async fn states_of(&self, names: &BTreeSet<UnitName>) -> Result<StateListing, OpsError> {
        let states = self.registry.states_of(names).await?;
        Ok(StateListing {
            states: states.items.iter().map(views::state_view).collect(),
            skipped: states.skipped.iter().map(ToString::to_string).collect(),
        })
    }

    /// The unit's record and file, read again while a concurrent replace collects the file
    /// between the two reads.
    async fn unit_with_file(&self, name: &UnitName) -> Result<Option<(Unit, UnitFile)>, OpsError> {
        let mut missing = Missing::default();
        for _ in 0..ATTEMPTS {
            let Some(unit) = self.registry.unit(name).await? else {
                return Ok(None);
            };
            match self.registry.unit_file(&unit).await {
                Ok(file) => return Ok(Some((unit, file))),
                Err(e @ RegistryError::FileMissing { .. }) => missing.again(&unit, e)?,
                Err(e) => return Err(e.into()),
            }
        }
        Err(OpsError::Conflict(name.clone()))
    }

    /// Where `name` runs now (its first scheduled machine), for `--reschedule`.
    async fn placed(&self, name: &UnitName) -> Result<Option<MachineId>, OpsError> {
        let snap = self
            .registry
            .units_snapshot(&BTreeSet::from([name.clone()]))
            .await?;
        Ok(snap
            .schedule
            .get(name)
            .and_then(|m| m.keys().next().cloned()))
    }

    /// Creates `name`; `None` when another client created it first with the same content
    /// below `desired` (read again: it is then raised).
    async fn create(
        &self,
        name: &UnitName,
        file: &UnitFile,
        desired: DesiredState,
    ) -> Result<Option<PutOutcome>, OpsError> {
        match self.units.create_unit(name, file, desired).await? {
            CreateOutcome::Created(unit) => {
                Ok(Some(PutOutcome::Created(views::written_view(&unit, file))))
            }
            // Created by another client since we read: the same content at or above the
            // state asked is what was asked; a lower state is raised on the next pass; other
            // content is theirs to keep.
            CreateOutcome::Exists(unit) if unit.hash() == file.hash() => {
                if unit.desired() < desired {
                    return Ok(None);
                }
                Ok(Some(PutOutcome::Unchanged(views::written_view(
                    &unit, file,
                ))))
            }
            CreateOutcome::Exists(_) => Err(OpsError::Conflict(name.clone())),
        }
    }

    /// Reads, decides and writes one put; `None` when another client changed the unit
    /// between the read and the write (read again). With `expect`, the unit read must be as
    /// the caller expects; the write is conditional on that very record, so no other write
    /// can come in between.
    async fn put_once(
        &self,
        req: &PutRequest,
        expect: Option<Expect>,
    ) -> Result<Option<PutOutcome>, OpsError> {
        let existing = self.unit_with_file(&req.name).await?;
        if let Some(expect) = expect {
            expect.check(req, existing.as_ref().map(|(u, _)| u.hash()))?;
        }
        let plan = decide::decide_put(req, existing.as_ref().map(|(u, f)| (u, f)))?;
        debug!(unit = %req.name, plan = plan.kind(), "putting unit");
        let written = match plan {
            PutPlan::Create { file, desired } => {
                return self.create(&req.name, &file, desired).await;
            }
            PutPlan::Replace {
                existing,
                file,
                desired,
            } => {
                let keeps_machine = req.how.fleet_form && desired == DesiredState::Inactive;
                let placed = if req.how.reschedule || keeps_machine {
                    self.placed(&req.name).await?
                } else {
                    None
                };
                let global = Requirements::global(&req.name, &file);
                let state =
                    decide::replace_state(req.how, &existing, desired, placed.as_ref(), global);
                match self
                    .units
                    .replace_unit_with(&existing, &file, desired, state)
                    .await
                {
                    Ok(unit) => PutOutcome::Replaced(views::written_view(&unit, &file)),
                    Err(RegistryError::Conflict(_)) => return Ok(None),
                    Err(e) => return Err(e.into()),
                }
            }
            PutPlan::SetState {
                existing: unit,
                desired,
            } => {
                let file = &existing.as_ref().expect("decided on an existing unit").1;
                match self.units.set_desired(&unit, desired).await {
                    Ok(unit) => PutOutcome::StateChanged(views::written_view(&unit, file)),
                    Err(RegistryError::Conflict(_)) => return Ok(None),
                    Err(e) => return Err(e.into()),
                }
            }
            PutPlan::Unchanged(unit) => {
                let file = &existing.as_ref().expect("decided on an existing unit").1;
                PutOutcome::Unchanged(views::written_view(&unit, file))
            }
        };
        Ok(Some(written))
    }
}

impl<K: Kv> RegistryCluster<K> {
    /// The file of a unit just written, for the view a write returns.
    async fn written(&self, unit: &Unit) -> Result<UnitView, OpsError> {
        let file = self.registry.unit_file(unit).await?;
        Ok(views::written_view(unit, &file))
    }

    /// [`Cluster::put`] and [`Cluster::put_if`]: read, decide, write, again while another
    /// client changes the unit in between.
    async fn put_tries(
        &self,
        req: &PutRequest,
        expect: Option<Expect>,
    ) -> Result<PutOutcome, OpsError> {
        for _ in 0..ATTEMPTS {
            if let Some(outcome) = self.put_once(req, expect).await? {
                return Ok(outcome);
            }
        }
        Err(OpsError::Conflict(req.name.clone()))
    }

    /// [`Cluster::destroy`]'s reads and writes.
    async fn destroy_tries(&self, name: &UnitName) -> Result<Destroyed, OpsError> {
        for _ in 0..ATTEMPTS {
            let unit = match self.units.unit(name).await {
                Ok(Some(unit)) => unit,
                Ok(None) => return Ok(Destroyed::Missing),
                Err(e @ RegistryError::Corrupt { .. }) => {
                    match self.units.destroy_unreadable_unit(name).await {
                        Ok(true) => {
                            debug!(unit = %name, "destroyed unreadable unit");
                            return Ok(Destroyed::Unreadable(e.to_string()));
                        }
                        Ok(false) => return Ok(Destroyed::Missing),
                        Err(RegistryError::Conflict(_)) => continue,
                        Err(e) => return Err(e.into()),
                    }
                }
                Err(e) => return Err(e.into()),
            };
            match self.units.destroy_unit(&unit).await {
                Ok(()) => {
                    debug!(unit = %name, "destroyed unit");
                    return Ok(Destroyed::Unit);
                }
                Err(RegistryError::Conflict(_)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(OpsError::Conflict(name.clone()))
    }
}

impl<K: Kv> RegistryCluster<K> {
    /// What is wrong with the engine leader key, when it leads nothing fleet knows of (issue
    /// 38): nothing is scheduled meanwhile.
    async fn leader_notice(&self) -> Result<Option<String>, OpsError> {
        Ok(self.leader().await?.1)
    }

    /// The registered machine whose engine leads, if one does, and what is wrong with the
    /// leader key when it leads nothing fleet knows of.
    async fn leader(&self) -> Result<(Option<MachineId>, Option<String>), OpsError> {
        let leader = self.registry.leader_key(None).await?;
        Ok(match leader {
            // No key is a moment of an election, or a cluster without engines.
            LeaderKey::Vacant => (None, None),
            LeaderKey::Held { machine } => (Some(machine), None),
            LeaderKey::Unregistered { .. } | LeaderKey::Stray { .. } => {
                (None, Some(leader.to_string()))
            }
        })
    }
}

/// A unit record whose file was missing at the last read. A replace may have collected the
/// file between the two reads: the record then changed, and reading again finds the new one.
/// The same record twice without its file is no race but a registry that lost the file
/// (issue 38): an error saying so, not a "changed concurrently, try again" forever.
#[derive(Debug, Default)]
struct Missing {
    revision: Option<i64>,
}

impl Missing {
    fn again(&mut self, unit: &Unit, e: RegistryError) -> Result<(), OpsError> {
        if self.revision == Some(unit.mod_revision) {
            return Err(e.into());
        }
        self.revision = Some(unit.mod_revision);
        Ok(())
    }
}

impl<K: Kv> Cluster for RegistryCluster<K> {
    type Changes = RegistryChanges<K>;

    async fn units(&self, names: Option<&BTreeSet<UnitName>>) -> Result<UnitListing, OpsError> {
        Ok(self.units_where(names, 0, None).await?.0)
    }

    async fn unit(&self, name: &UnitName) -> Result<Option<UnitView>, OpsError> {
        let names = BTreeSet::from([name.clone()]);
        let mut missing = Missing::default();
        for _ in 0..ATTEMPTS {
            // Only this unit's keys (issue 19): the same cost at 100,000 units as at 10.
            let snap = self.registry.units_snapshot(&names).await?;
            // A record that cannot be read is an error naming its key, not an absent unit.
            let key = self.registry.keys().unit(name);
            if let Some(skipped) = snap.skipped.get(&key) {
                return Err(RegistryError::from(skipped.clone()).into());
            }
            let Some(unit) = snap.units.get(name) else {
                return Ok(None);
            };
            match self.registry.unit_file(unit).await {
                Ok(file) => return Ok(Some(views::unit_view(&snap, unit, &file))),
                // Collected by a replace since the read: read again, as a client would.
                Err(e @ RegistryError::FileMissing { .. }) => missing.again(unit, e)?,
                Err(e) => return Err(e.into()),
            }
        }
        Err(OpsError::Conflict(name.clone()))
    }

    async fn states(&self, filter: &StateFilter) -> Result<StateListing, OpsError> {
        let states = match (&filter.unit, &filter.machine) {
            (Some(unit), _) => {
                self.registry
                    .states_of(&BTreeSet::from([unit.clone()]))
                    .await?
            }
            (None, Some(machine)) => self.registry.machine_states(machine).await?,
            (None, None) => self.registry.unit_states().await?,
        };
        Ok(StateListing {
            skipped: states.skipped.iter().map(ToString::to_string).collect(),
            // Moved, not copied: 100,000 states are half a million strings (issue 19).
            states: states
                .items
                .into_iter()
                .filter(|s| filter.machine.as_ref().is_none_or(|m| &s.machine == m))
                .filter(|s| filter.unit.as_ref().is_none_or(|u| &s.name == u))
                .map(views::into_state_view)
                .collect(),
        })
    }

    async fn machines(&self) -> Result<MachineListing, OpsError> {
        let machines = self.registry.machines().await?;
        let notice = self.registry.disruption().await?;
        let (leader, leader_notice) = self.leader().await?;
        let drains = self.registry.drains().await?;
        let skipped = machines.skipped.iter().chain(&drains.skipped);
        Ok(MachineListing {
            machines: machines.items,
            skipped: skipped.map(ToString::to_string).collect(),
            notice,
            leader_notice,
            drained: drains.items,
            leader,
        })
    }

    async fn put(&self, req: PutRequest) -> Result<PutOutcome, OpsError> {
        let sent = Sent::now();
        let outcome = self.put_tries(&req, None).await;
        self.record_put(&req.name, &outcome, sent);
        outcome
    }

    async fn put_if(&self, req: PutRequest, expect: Expect) -> Result<PutOutcome, OpsError> {
        let sent = Sent::now();
        let outcome = self.put_tries(&req, Some(expect)).await;
        self.record_put(&req.name, &outcome, sent);
        outcome
    }

    async fn create_many(&self, reqs: Vec<PutRequest>) -> crate::Created {
        // A batch that collided is written again unit by unit through `put_if`, which
        // records its own: recorded here are the units the batches wrote.
        self.without_events().create_all(self, reqs).await
    }

    async fn put_many_if(&self, reqs: Vec<(PutRequest, Expect)>) -> crate::Created {
        let sent = Sent::now();
        let outcomes = self.without_events().put_all_if(reqs).await;
        self.record_puts(&outcomes, sent);
        outcomes
    }

    async fn set_state(
        &self,
        name: &UnitName,
        change: StateChange,
    ) -> Result<Option<UnitView>, OpsError> {
        for _ in 0..ATTEMPTS {
            let Some(unit) = self.registry.unit(name).await? else {
                return Err(OpsError::NoSuchUnit(name.clone()));
            };
            let Some(desired) = decide::decide_state(change, &unit)? else {
                return Ok(None);
            };
            let sent = Sent::now();
            match self.units.set_desired(&unit, desired).await {
                Ok(unit) => {
                    debug!(unit = %name, desired = %desired, "set desired state");
                    let view = self.written(&unit).await?;
                    self.record_state(name, &view, sent);
                    return Ok(Some(view));
                }
                Err(RegistryError::Conflict(_)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(OpsError::Conflict(name.clone()))
    }

    async fn restart(&self, name: &UnitName) -> Result<Restarted, OpsError> {
        for _ in 0..ATTEMPTS {
            let Some(unit) = self.registry.unit(name).await? else {
                return Err(OpsError::NoSuchUnit(name.clone()));
            };
            let sent = Sent::now();
            let res = match decide::decide_restart(&unit)? {
                RestartPlan::Launch => self
                    .units
                    .set_desired(&unit, DesiredState::Launched)
                    .await
                    .map(|_| Restarted::Launched),
                RestartPlan::NewGeneration => self
                    .units
                    .request_restart(&unit)
                    .await
                    .map(|u| Restarted::Generation(u.record.restart)),
            };
            match res {
                Ok(done) => {
                    debug!(unit = %name, restarted = ?done, "requested restart");
                    self.record_restart(name, &done, sent);
                    return Ok(done);
                }
                Err(RegistryError::Conflict(_)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(OpsError::Conflict(name.clone()))
    }

    async fn destroy(&self, name: &UnitName) -> Result<Destroyed, OpsError> {
        let sent = Sent::now();
        let outcome = self.destroy_tries(name).await;
        self.record_destroy(name, &outcome, sent);
        outcome
    }

    async fn destroy_many(&self, names: Vec<UnitName>) -> crate::DestroyedMany {
        let sent = Sent::now();
        let outcomes = self.without_events().destroy_all(names).await;
        for (name, outcome) in &outcomes {
            self.record_destroy(name, outcome, sent);
        }
        outcomes
    }

    async fn drain(&self, machine: &MachineId, parallel: u32) -> Result<DrainStatus, OpsError> {
        let sent = Sent::now();
        self.units.drain(machine, parallel).await?;
        let status = self.drain_status(machine).await;
        if let Ok(status) = &status {
            self.record_drain(machine, status, sent);
        }
        status
    }

    async fn undrain(&self, machine: &MachineId) -> Result<bool, OpsError> {
        let sent = Sent::now();
        let undrained = self.units.undrain(machine).await?;
        if undrained {
            self.record_undrain(machine, sent);
        }
        Ok(undrained)
    }

    async fn drain_status(&self, machine: &MachineId) -> Result<DrainStatus, OpsError> {
        let (snap, files) = self.scheduler_view().await?;
        Ok(fleet_scheduler::drain_status(&snap, &files, machine))
    }

    async fn explain(&self, name: &UnitName) -> Result<Explanation, OpsError> {
        let (snap, files) = self.scheduler_view().await?;
        let mut explanation = fleet_scheduler::explain(&snap, &files, name);
        // "The engine places it in its next pass" is false while no engine can lead.
        if let Some(notice) = self.leader_notice().await? {
            explanation.summary = format!("{}; but {notice}", explanation.summary);
        }
        Ok(explanation)
    }

    async fn change_metadata(&self, changes: &[MetadataChange]) -> Result<(), OpsError> {
        if changes.is_empty() {
            return Ok(());
        }
        let sent = Sent::now();
        self.units.change_metadata(changes).await?;
        self.record_metadata(changes, sent);
        Ok(())
    }

    async fn advance_rollout(
        &self,
        name: &UnitName,
        machines: &[MachineId],
    ) -> Result<UnitView, OpsError> {
        for _ in 0..ATTEMPTS {
            let Some(unit) = self.units.unit(name).await? else {
                return Err(OpsError::NoSuchUnit(name.clone()));
            };
            match self
                .units
                .advance_rollout(&unit, machines.iter().cloned())
                .await
            {
                Ok(unit) => return self.written(&unit).await,
                Err(RegistryError::Conflict(_)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(OpsError::Conflict(name.clone()))
    }

    async fn finish_rollout(&self, name: &UnitName) -> Result<(), OpsError> {
        for _ in 0..ATTEMPTS {
            let Some(unit) = self.units.unit(name).await? else {
                return Ok(());
            };
            match self.units.finish_rollout(&unit).await {
                Ok(_) => return Ok(()),
                Err(RegistryError::Conflict(_)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(OpsError::Conflict(name.clone()))
    }

    async fn watch(&self, names: BTreeSet<UnitName>) -> Result<RegistryChanges<K>, OpsError> {
        RegistryChanges::start(self.registry.clone(), names).await
    }

    async fn events(&self, filter: &EventFilter) -> Result<EventListing, OpsError> {
        self.list_events(filter).await
    }

    async fn follow_events(&self, filter: EventFilter) -> Result<EventStream, OpsError> {
        self.follow(filter).await
    }

    async fn changes(&self) -> Result<crate::ChangeStream, OpsError> {
        self.change_stream().await
    }
}
