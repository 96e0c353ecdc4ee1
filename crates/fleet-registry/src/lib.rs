//! The cluster registry in etcd v3. Every etcd call in the project lives in this crate (but
//! for the tests' own: the `fleet-testing` crate launches etcd and asks its members' status).
//!
//! [`Registry`] turns the key schema of [`keys`] into typed reads; reads used for decisions come
//! from one revision ([`Snapshot`]). Writes go through the handle of a role, each able to write
//! only its own keys: [`UnitsRole`] (fleetctl, the API), [`MachineRole`] (one machine's
//! presence and states), [`EngineRole`] and the [`Leadership`] it wins (fenced schedules).
//! Every multi-key change is one transaction guarded by compare-and-swap, so concurrent
//! clients never leave anything half-written.

mod carried;
pub mod changes;
mod drain;
mod error;
pub mod events;
mod few;
mod import;
pub mod input;
pub mod keys;
pub mod kv;
mod leader;
mod live;
mod machine;
mod metadata;
pub mod metrics;
mod mirror;
mod page;
mod per_machine;
#[cfg(feature = "test-etcd")]
mod raw;
pub mod rbac;
mod read;
mod records;
mod registry;
mod snapshot;
mod store;
mod units;
mod watch;

pub use carried::{CarriedFile, CarriedTexts, MAX_CARRIED_TEXT, texts_of};
pub use changes::{ChangeFeed, Changed, Part};
pub use error::{RegistryError, Result};
pub use events::log::{EventConfig, EventLog, EventSink, EventStats};
pub use events::{Event, EventFilter, EventFollow, EventKind};
pub use few::{UnitsView, concerns};
pub use import::{FileRefusal, ImportOutcome, ImportPlan, ImportedUnit, Importer, check_file};
pub use keys::{
    DEFAULT_PREFIX, EventSource, EventStamp, EventSubject, Key, Keys, Kind, StrayScheduleKey,
};
pub use kv::MAX_TXN_OPS;
pub use leader::{EngineRole, EngineWrite, Fence, LeaderKey, Leadership};
pub use live::LiveView;
pub use machine::{Batch, MachineRole, PeerChange, Presence, ScheduleChange};
pub use metadata::{
    DynamicMetadata, MAX_METADATA_VALUE_BYTES, MetadataChange, MetadataKey, MetadataKeyError,
    apply_dynamic,
};
pub use mirror::Touched;
pub use page::UnitsPage;
pub use per_machine::PerMachine;
pub use read::{Listing, MAX_STATES_PER_MACHINE, Skipped, StateBound};
pub use records::{
    DrainRecord, LeftCopy, MigrationRecord, MoveRecord, ReplaceState, Rollout, ScheduleEntry, Unit,
    UnitRecord, UnitStateRecord,
};
pub use registry::Registry;
pub use snapshot::Snapshot;
pub use store::{Changes, SharedStore, Store, StoreRead, Subscription};
pub use units::{
    Change, CreateOutcome, NewUnit, UnitsRole, batches, change_batches, dropped_files,
};
pub use watch::{Delta, WatchHints};
