//! fleet's per-machine agent: adopts or removes what systemd already runs at boot, then keeps
//! the units scheduled to this machine loaded or launched as desired.
//!
//! - [`mod@plan`]: the pure planner, `plan(&desired, &current, &backoff) -> Vec<Task>`.
//! - `desired`: the pure desired-state builder, schedule + unit files -> desired units.
//! - [`manager`]: the [`UnitManager`] trait the executor drives, with its contract.
//! - [`systemd`]: the real [`UnitManager`] over D-Bus (the only module that names zbus).
//! - `fake` (feature `fake`): an in-memory [`UnitManager`] for tests and the bench.
//! - [`units_dir`]: the units directory (`/run/fleet/units`) on disk.
//! - [`agent`]: the loop: boot (preload, adopt or remove), reconcile, publish states.
//! - `ledger`: restart generations and running versions systemd cannot tell, on disk.
//! - [`executor`]: runs a plan's tasks in order on a [`UnitManager`].
//! - [`fence`]: the units the fence stops, and the loop that keeps it armed in systemd.
//! - [`presence`]: the machine's registration on a lease, kept alive beside the agent.
//! - `revivals`: spacing the restarts of a unit that keeps failing after it started.

pub mod agent;
mod current;
mod desired;
pub mod executor;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
pub mod fence;
mod ledger;
pub mod manager;
pub mod metrics;
pub mod plan;
pub mod presence;
mod revivals;
pub mod systemd;
pub mod units_dir;
pub mod witness;

pub use agent::{Agent, AgentConfig, Progress};
#[cfg(any(test, feature = "fake"))]
pub use fake::FakeManager;
pub use manager::{
    BusError, Change, ChangeReceiver, ChangeSender, InstalledUnit, JobKind, JobOutcome, MainExit,
    ManagerError, ReloadFacts, UnitDetails, UnitFacts, UnitFileError, UnitManager, UnitSource,
};
pub use metrics::{CallObserver, Metered, Metrics};
pub use plan::{CurrentUnit, DesiredUnit, Reason, Target, Task, TaskKind, UnitFileState, plan};
pub use presence::PresenceKeeper;
pub use systemd::{SystemdConfig, SystemdManager};
pub use units_dir::UnitsDir;
