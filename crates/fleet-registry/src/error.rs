//! The registry's one error type.

use fleet_core::{MachineId, UnitHash, UnitName};

use crate::kv::KvError;

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// etcd failed or could not be reached; `op` names what the registry was doing. The
    /// etcd error is part of the message and deliberately not a `source()`: error chains
    /// (anyhow's `{:#}` in fleetctl and fleetd) would print it twice.
    #[error("{op}: {cause}")]
    Kv { op: &'static str, cause: KvError },
    /// Another client changed the unit between our read and our write.
    #[error("unit {0} was changed concurrently by another client; nothing was written, try again")]
    Conflict(UnitName),
    #[error("unit {0} not found")]
    UnitNotFound(UnitName),
    /// A unit record points at a file that is not in the registry.
    #[error("unit file {hash} of {unit} is missing from the registry")]
    FileMissing { unit: UnitName, hash: UnitHash },
    #[error("corrupt registry value at {key}: {detail}")]
    Corrupt { key: String, detail: String },
    /// Another live fleetd holds this machine ID.
    #[error(
        "machine ID {0} is already registered by a live fleetd; is /etc/machine-id duplicated?"
    )]
    DuplicateMachine(MachineId),
    /// A machine's role was asked to write a record of another machine.
    #[error("the registry role of machine {role} cannot write for machine {other}")]
    ForeignMachine { role: MachineId, other: MachineId },
    /// A write fenced by leadership found that we are not the leader any more.
    #[error("not the engine leader any more")]
    LostLeadership,
    /// One transaction cannot hold that many changes (etcd's `--max-txn-ops`).
    #[error("{count} changes in one request, at most {max} are applied together")]
    TooManyChanges { count: usize, max: usize },
    /// A value larger than the registry takes for it (a client's mistake, not etcd's).
    #[error("{what} of {size} bytes, more than the {max} allowed")]
    ValueTooLarge {
        what: &'static str,
        size: usize,
        max: usize,
    },
    /// A [`Store`](crate::Store) or a [`LiveView`](crate::LiveView) cannot follow the registry any more (its watch ended
    /// or fell behind a compaction); a new view reads everything again.
    #[error("lost track of the registry: {0}")]
    ViewLost(String),
}

impl RegistryError {
    pub(crate) fn kv(op: &'static str) -> impl FnOnce(KvError) -> RegistryError {
        move |cause| RegistryError::Kv { op, cause }
    }

    /// Whether the failure is about reaching etcd (worth retrying later).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Kv { cause, .. } => cause.is_transient(),
            Self::ViewLost(_) => true,
            Self::Conflict(_)
            | Self::UnitNotFound(_)
            | Self::FileMissing { .. }
            | Self::Corrupt { .. }
            | Self::DuplicateMachine(_)
            | Self::ForeignMachine { .. }
            | Self::LostLeadership
            | Self::TooManyChanges { .. }
            | Self::ValueTooLarge { .. } => false,
        }
    }
}

pub type Result<T, E = RegistryError> = std::result::Result<T, E>;
