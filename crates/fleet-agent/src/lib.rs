//! fleet's per-machine agent: adopts or removes what systemd already runs at boot, then keeps
//! the units scheduled to this machine loaded or launched as desired.

pub mod manager;
pub mod plan;

pub use manager::{
    BusError, Change, ChangeReceiver, ChangeSender, InstalledUnit, JobKind, JobOutcome,
    ManagerError, UnitDetails, UnitFileError, UnitManager,
};
pub use plan::{CurrentUnit, DesiredUnit, Reason, Target, Task, TaskKind, UnitFileState, plan};
