//! The cluster registry in etcd v3. Every etcd call in the project lives in this crate.
//!
//! [`Registry`] turns the key schema of [`keys`] into typed operations. Every multi-key change
//! is one transaction guarded by compare-and-swap, so concurrent clients never leave anything
//! half-written; reads used for decisions come from one revision ([`Snapshot`]).

mod error;
pub mod input;
pub mod keys;
pub mod kv;
mod leader;
mod live;
mod metadata;
mod per_machine;
mod read;
mod records;
mod registry;
mod snapshot;
#[cfg(feature = "test-etcd")]
pub mod testing;
mod watch;

pub use error::{RegistryError, Result};
pub use keys::{DEFAULT_PREFIX, Keys, Named};
pub use leader::{EngineWrite, Leadership, MAX_TXN_OPS};
pub use live::{LiveView, Touched};
pub use metadata::{DynamicMetadata, MetadataChange, MetadataKey, MetadataKeyError, apply_dynamic};
pub use per_machine::PerMachine;
pub use read::{Listing, Skipped};
pub use records::{ReplaceState, Rollout, ScheduleEntry, Unit, UnitRecord, UnitStateRecord};
pub use registry::{CreateOutcome, Fence, Presence, Registry};
pub use snapshot::Snapshot;
pub use watch::WatchHints;
