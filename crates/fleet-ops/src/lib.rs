//! fleet's operations on units, unit states and machines, behind one interface: [`Cluster`].
//! This crate owns three things, and only these:
//! - the interface and its model ([`model`]): what `submit`, `start`, `stop`, `destroy`, each
//!   listing and each wait ask of the cluster, and the types a command prints from, so a
//!   command prints the same bytes over either side. They carry fleet's entities' data plus
//!   what fleetctl shows beyond fleet (unscheduled reasons, restart generations, pending
//!   restarts, the disruption notice);
//! - the pure decisions of the writes ([`decide`]), taken once for every side;
//! - the side over etcd ([`etcd::RegistryCluster`], on the registry's `UnitsRole` and shared
//!   reads), used by fleetctl's etcd driver and by fleetd's API handlers, so the two can
//!   never disagree. Its `explain` and drain status are fleet-scheduler's, the engine's own
//!   rules (re-exported here), without the engine.
//!
//! The other side, over HTTP, is fleetctl's API driver; the wire both it and the API speak
//! is fleet-api-wire's. This crate knows neither HTTP nor clap, and does no I/O except
//! through the registry.

pub mod decide;
pub mod error;
pub mod etcd;
pub mod model;

pub use error::OpsError;
pub use etcd::{RegistryCluster, UnitsCursor};
/// What `explain` and a drain's status answer: fleet-scheduler's types.
pub use fleet_scheduler::{
    DrainStatus, Explanation, MachineVerdict, Rejection, Status as ExplainStatus, Violation,
};
pub use model::{
    ChangeStream, Changes, Destroyed, EventListing, EventStream, Expect, MachineListing,
    PutOutcome, PutRequest, ReplaceHow, Restarted, StateChange, StateFilter, StateListing,
    StateView, UnitListing, UnitStatus, UnitView, WaitView,
};

use fleet_core::{MachineId, UnitName};
use fleet_registry::MetadataChange;
use futures::StreamExt;
use std::collections::BTreeSet;
use std::future::Future;

/// How many creates [`Cluster::create_many`]'s default sends at once (the API driver: one
/// request each, on as many kept-alive connections; fleetd writes concurrent ones together).
pub const CREATES_IN_FLIGHT: usize = 128;

/// What [`Cluster::create_many`] says of each unit, in the order asked.
pub type Created = Vec<(UnitName, Result<PutOutcome, OpsError>)>;

/// [`Cluster::create_many`]'s default: each create on its own ([`Cluster::put_if`] with
/// [`Expect::Absent`]), [`CREATES_IN_FLIGHT`] at a time, results in the order asked. A side
/// that overrides `create_many` falls back on it (the API driver, when the server has no
/// `POST /units`).
pub async fn create_each<C: Cluster>(cluster: &C, reqs: Vec<PutRequest>) -> Created {
    futures::stream::iter(reqs)
        .map(|req| async move {
            let name = req.name.clone();
            (name, cluster.put_if(req, Expect::Absent).await)
        })
        .buffered(CREATES_IN_FLIGHT)
        .collect()
        .await
}

/// What [`Cluster::destroy_many`] says of each unit, in the order asked.
pub type DestroyedMany = Vec<(UnitName, Result<Destroyed, OpsError>)>;

/// How many single writes the defaults of [`Cluster::put_many_if`] and
/// [`Cluster::destroy_many`] have in flight at once.
pub const IN_FLIGHT: usize = 32;

/// Every operation fleetctl and the API perform. Reads return consistent views (one etcd
/// revision on the etcd side); writes decide from what they read and are conditional, retrying
/// a bounded number of times when another client changed the unit in between
/// ([`OpsError::Conflict`] when that runs out). A refused request writes nothing.
pub trait Cluster: Clone + Send + Sync + 'static {
    /// How this side tells a waiting command that something may have changed.
    type Changes: Changes;

    /// Units sorted by name, each with its file and where it runs: every unit (`None`), or
    /// those of `names` that exist (read together, not one request per name).
    fn units(
        &self,
        names: Option<&BTreeSet<UnitName>>,
    ) -> impl Future<Output = Result<UnitListing, OpsError>> + Send;

    /// One unit; `None` if there is none.
    fn unit(
        &self,
        name: &UnitName,
    ) -> impl Future<Output = Result<Option<UnitView>, OpsError>> + Send;

    /// Published unit states, sorted by unit then machine, filtered.
    fn states(
        &self,
        filter: &StateFilter,
    ) -> impl Future<Output = Result<StateListing, OpsError>> + Send;

    /// Live machines sorted by ID (dynamic metadata merged over configured metadata), and the
    /// engine's disruption notice if one is held.
    fn machines(&self) -> impl Future<Output = Result<MachineListing, OpsError>> + Send;

    /// fleet's `PUT /units/<name>`, and fleetctl's `submit`/`load`/`start` write: create a unit,
    /// replace its content (`--replace`, with `how`), or change its desired state.
    fn put(&self, req: PutRequest) -> impl Future<Output = Result<PutOutcome, OpsError>> + Send;

    /// [`Cluster::put`], only while the unit is as the caller read it: fleetctl decides a
    /// create or a replace from what it read, and another client's write in between must fail
    /// it ([`OpsError::Conflict`], nothing written), not be written over. This default checks
    /// with a read just before the put; a side that can check on the very record its write
    /// replaces (the etcd side) overrides it, leaving no window between the two.
    fn put_if(
        &self,
        req: PutRequest,
        expect: Expect,
    ) -> impl Future<Output = Result<PutOutcome, OpsError>> + Send {
        async move {
            let current = self.unit(&req.name).await?;
            expect.check(&req, current.map(|u| u.status.hash))?;
            self.put(req).await
        }
    }

    /// Many creates at once: each of `reqs` as [`Cluster::put_if`] with [`Expect::Absent`]
    /// would do it, results in the order asked. This default sends [`CREATES_IN_FLIGHT`] at
    /// a time; the etcd side writes many units per transaction and stops starting new ones
    /// after a transaction fails (the units not written then say [`OpsError::NotWritten`]).
    fn create_many(&self, reqs: Vec<PutRequest>) -> impl Future<Output = Created> + Send {
        create_each(self, reqs)
    }

    /// Many puts: each of `reqs` as [`Cluster::put_if`] would do it, results in the order
    /// asked. This default sends 32 at a time; the etcd side replaces many units per
    /// transaction (`start --replace` of 300 units), and stops starting new ones after a
    /// transaction fails (the units not written then say [`OpsError::NotWritten`]).
    fn put_many_if(&self, reqs: Vec<(PutRequest, Expect)>) -> impl Future<Output = Created> + Send {
        async move {
            futures::stream::iter(reqs)
                .map(|(req, expect)| async move {
                    let name = req.name.clone();
                    (name, self.put_if(req, expect).await)
                })
                .buffered(IN_FLIGHT)
                .collect()
                .await
        }
    }

    /// `stop`, `unload`, or raising a unit to a state: `None` when the unit was already there
    /// (nothing written).
    fn set_state(
        &self,
        name: &UnitName,
        change: StateChange,
    ) -> impl Future<Output = Result<Option<UnitView>, OpsError>> + Send;

    /// `restart`: a launched unit gets a new restart generation, a loaded one is launched.
    fn restart(&self, name: &UnitName) -> impl Future<Output = Result<Restarted, OpsError>> + Send;

    /// `destroy` (`DELETE /units/<name>`): a record that cannot be read is destroyed too.
    fn destroy(&self, name: &UnitName) -> impl Future<Output = Result<Destroyed, OpsError>> + Send;

    /// `destroy` of many units: each as [`Cluster::destroy`] would do it, results in the order
    /// asked. This default sends 32 at a time; the etcd side deletes many units per
    /// transaction, and stops starting new ones after a transaction fails.
    fn destroy_many(&self, names: Vec<UnitName>) -> impl Future<Output = DestroyedMany> + Send {
        async move {
            futures::stream::iter(names)
                .map(|name| async move {
                    let res = self.destroy(&name).await;
                    (name, res)
                })
                .buffered(IN_FLIGHT)
                .collect()
                .await
        }
    }

    /// `PATCH /machines`: all or nothing.
    fn change_metadata(
        &self,
        changes: &[MetadataChange],
    ) -> impl Future<Output = Result<(), OpsError>> + Send;

    /// A rolling replace of a global unit: let `machines` take the new version.
    fn advance_rollout(
        &self,
        name: &UnitName,
        machines: &[MachineId],
    ) -> impl Future<Output = Result<UnitView, OpsError>> + Send;

    /// A rolling replace is over: every machine takes the new version.
    fn finish_rollout(&self, name: &UnitName) -> impl Future<Output = Result<(), OpsError>> + Send;

    /// `drain MACHINE`: the machine takes no new non-global unit, and the engine moves its
    /// non-global units elsewhere, `parallel` on their way at a time (0 counts as 1). A
    /// machine not registered may be drained. Returns how the drain stands once marked.
    fn drain(
        &self,
        machine: &MachineId,
        parallel: u32,
    ) -> impl Future<Output = Result<DrainStatus, OpsError>> + Send;

    /// `undrain MACHINE`: schedulable again (nothing moves back). `false`: it was not drained.
    fn undrain(&self, machine: &MachineId) -> impl Future<Output = Result<bool, OpsError>> + Send;

    /// How the drain of `machine` stands (`parallel` is `None` when it is not drained).
    fn drain_status(
        &self,
        machine: &MachineId,
    ) -> impl Future<Output = Result<DrainStatus, OpsError>> + Send;

    /// `explain UNIT`: why the unit is where it is, or nowhere, by the scheduler's own rules.
    fn explain(
        &self,
        name: &UnitName,
    ) -> impl Future<Output = Result<Explanation, OpsError>> + Send;

    /// The events `filter` matches, oldest first (issue 41).
    fn events(
        &self,
        filter: &fleet_registry::EventFilter,
    ) -> impl Future<Output = Result<EventListing, OpsError>> + Send;

    /// The events `filter` matches now, then each new one as it is written (a watch on the
    /// etcd side, a held response over the API: nothing polls).
    fn follow_events(
        &self,
        filter: fleet_registry::EventFilter,
    ) -> impl Future<Output = Result<EventStream, OpsError>> + Send;

    /// The registry's changes from now on, each saying which parts changed (`list-* --watch`;
    /// fleetd's `GET /fleet/v1/changes` serves the etcd side's).
    fn changes(&self) -> impl Future<Output = Result<ChangeStream, OpsError>> + Send;

    /// What a waiting command watches: the units of `names` (gone ones absent), their
    /// states and the machines' legends, then a hint each time any of it may have changed.
    fn watch(
        &self,
        names: BTreeSet<UnitName>,
    ) -> impl Future<Output = Result<Self::Changes, OpsError>> + Send;
}
