//! Why an operation failed. The messages are what fleetctl prints, over either side; the API
//! turns each variant into fleet's status code and error entity.

use fleet_core::{DesiredState, UnitName};
use fleet_registry::RegistryError;

#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    #[error("Unit {0} does not exist")]
    NoSuchUnit(UnitName),
    /// Another client kept changing the unit; a retry resolves it.
    #[error("unit {0} was changed concurrently by another client; nothing was written, try again")]
    Conflict(UnitName),
    #[error("Unable to stop unit {0} in state inactive")]
    StopInactive(UnitName),
    #[error("Unable to restart unit {0} in state inactive")]
    RestartInactive(UnitName),
    #[error("cannot activate template {0}")]
    ActivateTemplate(UnitName),
    #[error("a new unit needs options")]
    NoOptions(UnitName),
    #[error("can not replace Unit({name}) in state '{existing}' with one in state '{asked}'")]
    ReplaceLowers {
        name: UnitName,
        existing: DesiredState,
        asked: DesiredState,
    },
    /// The unit file or its `[X-Fleet]` options are not valid.
    #[error("{name}: {reason}")]
    Invalid { name: UnitName, reason: String },
    /// Not written: a many-unit create, replace or destroy stopped when the write of `with`
    /// failed (that unit's error says why); writing it again is safe.
    #[error("not written: the command stopped when writing {with} failed")]
    NotWritten { with: UnitName },
    /// The registry (etcd) failed or is away.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The API answered with an error this interface has no variant for.
    #[error("{message}")]
    Api { code: u16, message: String },
    /// The API could not be reached or answered something that is not fleet's API. The cause
    /// is part of the message and deliberately not a `source()`, as in `RegistryError::Kv`:
    /// error chains (anyhow's `{:#}`) would print it twice.
    #[error("{what}: {cause}")]
    Transport {
        what: String,
        cause: Box<dyn std::error::Error + Send + Sync>,
    },
}
