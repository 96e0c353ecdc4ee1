//! What the operations take and return. Plain data: a command prints from these alone, so it
//! prints the same over either side of [`crate::Cluster`].

use fleet_core::{DesiredState, MachineId, MachineInfo, UnitFile, UnitHash, UnitName};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;

use crate::OpsError;

/// A unit without its file: what a wait and a placement report need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitStatus {
    pub name: UnitName,
    pub hash: UnitHash,
    pub desired: DesiredState,
    /// The machines it is scheduled to, sorted (fleet's `machineID` is the first; a global
    /// unit has every machine that takes it).
    pub machines: Vec<MachineId>,
    /// Why the engine could not place it, if it said.
    pub unscheduled: Option<String>,
    /// Restart generation asked for (`fleetctl restart` bumps it).
    pub restart: u64,
}

/// A unit with its file, as listings and fleet's `Unit` entity show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitView {
    pub status: UnitStatus,
    pub file: UnitFile,
    /// `[X-Fleet] Global=true`.
    pub global: bool,
    /// fleet's `currentState`: `launched` where a machine scheduled to launch it reports it
    /// active, `loaded` where a scheduled machine reports it at all, else `inactive`.
    pub current: DesiredState,
}

impl UnitView {
    pub fn name(&self) -> &UnitName {
        &self.status.name
    }
}

/// Units, and the values that could not be read (each a warning naming its key).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnitListing {
    pub units: Vec<UnitView>,
    pub skipped: Vec<String>,
}

/// One machine's published state of one unit (fleet's `UnitState`, and more).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateView {
    pub name: UnitName,
    pub machine: MachineId,
    /// The file the machine has in place; None: no readable file.
    pub hash: Option<UnitHash>,
    pub load: String,
    pub active: String,
    pub sub: String,
    /// The restart generation the machine has carried out.
    pub restart: u64,
    /// The running process started from an older file than the one in place.
    pub restart_pending: bool,
    /// Restarts after failing on this machine ([`UnitStateRecord`]'s).
    ///
    /// [`UnitStateRecord`]: fleet_registry::UnitStateRecord
    pub restarts: u64,
    /// When it entered its current ActiveState, in microseconds since the epoch.
    pub since: Option<u64>,
    /// How its main process last ended (`exit status 3`).
    pub exit: Option<String>,
}

/// Published unit states, and the values that could not be read (each a warning naming its
/// key): `list-units` warns about a corrupt state as the other listings do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StateListing {
    pub states: Vec<StateView>,
    pub skipped: Vec<String>,
}

/// `GET /state`'s filters: exact machine ID and unit name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StateFilter {
    pub machine: Option<MachineId>,
    pub unit: Option<UnitName>,
}

/// Events (issue 41), oldest first, and the values that could not be read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventListing {
    pub events: Vec<fleet_registry::Event>,
    pub skipped: Vec<String>,
    /// The registry's revision when read (0 over the API).
    pub revision: i64,
}

/// Events as they come: those there when asked, then each new one (`--follow`).
pub type EventStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<fleet_registry::Event, OpsError>> + Send>>;

/// The registry's changes (issue 41): the first names every part (the stream is open: read
/// what you show), then one each time parts changed, coalesced; the stream ends when the
/// watch underneath does. The etcd side follows a watch, the HTTP side fleetd's
/// `GET /fleet/v1/changes`: nothing polls.
pub type ChangeStream = std::pin::Pin<
    Box<dyn futures::Stream<Item = Result<fleet_registry::Changed, OpsError>> + Send>,
>;

/// Live machines, the engine's disruption notice and the drained machines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MachineListing {
    pub machines: Vec<MachineInfo>,
    pub skipped: Vec<String>,
    pub notice: Option<String>,
    /// What is wrong with the engine leader key, when it leads nothing fleet knows of (it
    /// names an unregistered machine, or is stray): no unit is scheduled meanwhile (issue 38).
    pub leader_notice: Option<String>,
    /// Drain marks, by machine (machines not registered included).
    pub drained: Vec<fleet_registry::DrainRecord>,
    /// The machine whose engine leads, if a registered one does (issue 41).
    pub leader: Option<MachineId>,
}

/// `--replace`'s options.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplaceHow {
    /// `--no-restart`: the new file is put in place; the running process is left alone.
    pub no_restart: bool,
    /// `--reschedule`: placed afresh, away from the machine it runs on now.
    pub reschedule: bool,
    /// `--rolling`: machines take the new version only as `advance_rollout` lets them.
    pub rolling: bool,
    /// fleet's replace, what a `PUT` in fleet's form gets (no extension asked): the new
    /// content with the state asked, `inactive` when none (lower than now too), and the
    /// unit's machine kept for the launch that follows. fleet's clients wait for
    /// `inactive` before they launch again.
    pub fleet_form: bool,
}

/// A create, a replace or a desired-state change of one unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutRequest {
    pub name: UnitName,
    /// None: the state alone changes (the unit must exist).
    pub file: Option<UnitFile>,
    /// None: inactive for a new unit, unchanged for a replaced one (never lowered).
    pub desired: Option<DesiredState>,
    pub how: ReplaceHow,
}

/// What a conditional put ([`crate::Cluster::put_if`]) expects of the unit: what the caller
/// decided from when it read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// No such unit: a create.
    Absent,
    /// A unit with this content: a replace decided from it.
    Content(UnitHash),
}

impl Expect {
    /// Whether a put of `req` may go ahead over a unit whose content is `current` (`None`: no
    /// unit): as expected, or already holding the very content asked for (another client put
    /// the same). Anything else was changed by another client since the caller read it.
    pub fn check(self, req: &PutRequest, current: Option<UnitHash>) -> Result<(), OpsError> {
        let asked = req.file.as_ref().map(UnitFile::hash);
        let expected = match self {
            Expect::Absent => None,
            Expect::Content(hash) => Some(hash),
        };
        if current == expected || (current.is_some() && current == asked) {
            Ok(())
        } else {
            Err(OpsError::Conflict(req.name.clone()))
        }
    }
}

/// What a put did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutOutcome {
    Created(UnitView),
    Replaced(UnitView),
    StateChanged(UnitView),
    /// Already as asked; nothing written.
    Unchanged(UnitView),
}

/// A desired-state change by `stop`, `unload`, `load` or `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateChange {
    /// `stop`: launched becomes loaded; an inactive unit is an error.
    Stop,
    /// `unload`: anything becomes inactive.
    Unload,
    /// Raise to this state, never lower.
    Raise(DesiredState),
}

/// What `restart` asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restarted {
    /// A launched unit: wait until every machine running it carried out this generation.
    Generation(u64),
    /// A loaded unit was launched: wait until it is.
    Launched,
}

/// What `destroy` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destroyed {
    Unit,
    /// A record that could not be read was removed; the string says why it was unreadable.
    Unreadable(String),
    /// There was no such unit.
    Missing,
}

/// What a wait sees: the watched units that exist, their states by machine, and every live
/// machine (for legends).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WaitView {
    pub units: BTreeMap<UnitName, UnitStatus>,
    pub states: BTreeMap<UnitName, BTreeMap<MachineId, StateView>>,
    pub machines: BTreeMap<MachineId, MachineInfo>,
}

impl WaitView {
    /// What a wait on `names` sees, on either side: of the units, states and machines given
    /// (those of `names` or more), the named units, their states grouped by machine, and
    /// every machine. The etcd side gives a snapshot's, the HTTP side its listings', so the
    /// two views of one registry are equal and a wait judges them alike.
    pub fn of(
        names: &BTreeSet<UnitName>,
        units: impl IntoIterator<Item = (UnitName, UnitStatus)>,
        states: impl IntoIterator<Item = StateView>,
        machines: impl IntoIterator<Item = MachineInfo>,
    ) -> WaitView {
        let units = units
            .into_iter()
            .filter(|(name, _)| names.contains(name))
            .collect();
        let mut by_unit: BTreeMap<UnitName, BTreeMap<MachineId, StateView>> = BTreeMap::new();
        for s in states.into_iter().filter(|s| names.contains(&s.name)) {
            by_unit
                .entry(s.name.clone())
                .or_default()
                .insert(s.machine.clone(), s);
        }
        WaitView {
            units,
            states: by_unit,
            machines: machines.into_iter().map(|m| (m.id.clone(), m)).collect(),
        }
    }
}

/// A watch of some units, from [`crate::Cluster::watch`].
pub trait Changes: Send {
    /// The view as of now.
    fn view(&self) -> &WaitView;

    /// Returns once the view may have changed (it is then current again). The etcd side
    /// follows a watch; the HTTP side polls.
    fn changed(&mut self) -> impl Future<Output = Result<(), OpsError>> + Send;

    /// The units watched.
    fn names(&self) -> &BTreeSet<UnitName>;
}
