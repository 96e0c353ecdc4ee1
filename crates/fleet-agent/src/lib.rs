//! fleet's per-machine agent: adopts or removes what systemd already runs at boot, then keeps
//! the units scheduled to this machine loaded or launched as desired.

pub mod fake;
pub mod manager;
pub mod plan;
pub mod units_dir;

pub use fake::FakeManager;
pub use manager::{
    BusError, Change, ChangeReceiver, ChangeSender, InstalledUnit, JobKind, JobOutcome,
    ManagerError, UnitDetails, UnitFileError, UnitManager,
};
pub use plan::{CurrentUnit, DesiredUnit, Reason, Target, Task, TaskKind, UnitFileState, plan};
pub use units_dir::UnitsDir;
