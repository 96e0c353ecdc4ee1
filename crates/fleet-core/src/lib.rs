//! Domain types of fleet, shared by every other crate: unit names, unit files and their
//! content hashes, desired and systemd states, machines, and the `[X-Fleet]` placement rules.
//!
//! This crate does no I/O: no tokio, no etcd, no D-Bus. Everything here is parsed once at the
//! edge (`FromStr`, `UnitFile::parse`) so the rest of the code cannot hold an invalid value.

pub mod backoff;
pub mod fence;
mod glob;
pub mod machine;
pub mod name;
pub mod quote;
pub mod state;
pub mod unit_file;
pub mod xfleet;

pub use backoff::Backoff;
pub use machine::{MachineId, MachineIdError, MachineInfo};
pub use name::{NameError, UnitName, UnitType};
pub use state::{ActiveState, DesiredState, LoadState, StateError, SystemdState};
pub use unit_file::{HashError, ParseError, UnitFile, UnitHash, UnitOption};
pub use xfleet::{RequirementError, Requirements, glob_match, units_conflict, units_replace};
