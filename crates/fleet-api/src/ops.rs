//! Every registry call the API makes, and the pure decision of what a `PUT` does.
//!
//! This is the one place handlers reach the registry (issue 15 wants one layer of operations
//! shared with fleetctl; until it exists, the rules here follow fleetctl's `submit` and
//! `--replace`: the same validation, and a replace keeps the unit's placement). Nothing here
//! knows HTTP: handlers turn what it returns into entities and status codes.

use fleet_core::{
    ActiveState, DesiredState, MachineId, Requirements, UnitFile, UnitName, UnitOption,
};
use fleet_registry::kv::Kv;
use fleet_registry::{
    CreateOutcome, MetadataChange, Registry, RegistryError, Snapshot, Unit, UnitStateRecord,
    UnitsRole,
};
use tracing::debug;

use crate::entity;
use crate::error::ApiError;

/// What a `PUT /units/<name>` asks, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutRequest {
    pub name: UnitName,
    /// None: no options in the body.
    pub file: Option<UnitFile>,
    pub desired: Option<DesiredState>,
}

/// What a `PUT` will write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutPlan {
    Create {
        file: UnitFile,
        desired: DesiredState,
    },
    /// New content for an existing unit (`fleetctl … --replace`).
    Replace {
        existing: Unit,
        file: UnitFile,
        desired: DesiredState,
    },
    SetState {
        existing: Unit,
        desired: DesiredState,
    },
    /// Already as asked; nothing to write.
    Unchanged,
}

impl PutPlan {
    /// Whether the answer is "created" (201, fleet's code for new content) or "changed" (204).
    pub fn creates(&self) -> bool {
        matches!(self, Self::Create { .. } | Self::Replace { .. })
    }
}

/// Options from the wire, checked as fleetctl checks a file it submits: the text systemd
/// would read must parse back to the same options (no newline smuggled into a value, no line
/// over systemd's limit, not too big), and the `[X-Fleet]` requirements must be possible.
pub fn unit_file(name: &UnitName, options: &[entity::UnitOption]) -> Result<UnitFile, ApiError> {
    let file = UnitFile::from_options(
        options
            .iter()
            .map(|o| UnitOption {
                section: o.section.clone(),
                name: o.name.clone(),
                value: o.value.clone(),
            })
            .collect(),
    );
    if let Some(bad) = file.options().iter().find(|o| !representable(o)) {
        return Err(ApiError::OptionNotRepresentable(format!(
            "{}.{}",
            bad.section, bad.name
        )));
    }
    let reread = UnitFile::parse(file.canonical().as_bytes()).map_err(ApiError::BadOptions)?;
    // Equal as unit files (canonical text): sections may come interleaved, as in fleet.
    if reread != file {
        // Whatever else the text does not keep (trailing blanks a parser trims, a final `\`).
        return Err(ApiError::OptionsChangeWhenWritten);
    }
    Requirements::from_unit(name, &file).validate()?;
    fleet_core::xfleet::check_values(name, &file)?;
    Ok(file)
}

/// Whether an option can be written as a `Name=Value` line of a `[Section]` at all.
fn representable(o: &UnitOption) -> bool {
    let one_line = |s: &str| !s.contains(['\n', '\r']);
    !o.section.is_empty()
        && !o.name.is_empty()
        && one_line(&o.section)
        && one_line(&o.name)
        && one_line(&o.value)
        && !o.name.contains('=')
        && !o.section.contains(['[', ']'])
}

/// Decides what a `PUT` does to `existing` (with its file), without writing. fleet's rules,
/// made right where fleet was wrong: a template is never activated, not even when created,
/// and a replace never lowers the desired state (fleet reset it to `inactive`).
pub fn decide_put(
    req: PutRequest,
    existing: Option<(Unit, &UnitFile)>,
) -> Result<PutPlan, ApiError> {
    let template_check = |desired: DesiredState| {
        if req.name.is_template() && desired != DesiredState::Inactive {
            return Err(ApiError::ActivateTemplate(req.name.clone()));
        }
        Ok(())
    };
    let Some((existing, existing_file)) = existing else {
        let file = req.file.clone().ok_or(ApiError::NoOptions)?;
        let desired = req.desired.unwrap_or(DesiredState::Inactive);
        template_check(desired)?;
        return Ok(PutPlan::Create { file, desired });
    };
    if let Some(file) = &req.file
        && file.hash() != existing_file.hash()
    {
        let desired = req.desired.unwrap_or(existing.desired());
        template_check(desired)?;
        if desired < existing.desired() {
            return Err(ApiError::ReplaceLowers {
                name: req.name.clone(),
                existing: existing.desired(),
                asked: desired,
            });
        }
        return Ok(PutPlan::Replace {
            existing,
            file: file.clone(),
            desired,
        });
    }
    let desired = req.desired.ok_or(ApiError::NoDesiredState)?;
    template_check(desired)?;
    if desired == existing.desired() {
        return Ok(PutPlan::Unchanged);
    }
    Ok(PutPlan::SetState { existing, desired })
}

/// The changes a `PATCH /machines` asks for, every operation checked before any is applied
/// (fleet's order of checks and messages). Any machine ID is accepted, registered or not; a
/// value must be one line of printable text (it ends up in `key=value` lists).
pub fn metadata_changes(ops: &[entity::MetadataOp]) -> Result<Vec<MetadataChange>, ApiError> {
    let mut changes = Vec::with_capacity(ops.len());
    for op in ops {
        let remove = match op.op.as_str() {
            "add" | "replace" => false,
            "remove" => true,
            _ => return Err(ApiError::PatchOp),
        };
        let (machine, key) = op
            .path
            .strip_prefix('/')
            .and_then(|p| p.split_once("/metadata/"))
            .ok_or(ApiError::PatchPath)?;
        let machine = machine.parse().map_err(|_| ApiError::PatchPath)?;
        let key = key.parse().map_err(|_| ApiError::PatchPath)?;
        if remove {
            changes.push(MetadataChange::Remove { machine, key });
            continue;
        }
        let value = op.value.as_ref().map(|v| v.as_str()).unwrap_or("");
        if value.is_empty() {
            return Err(ApiError::PatchNoValue);
        }
        if value.chars().any(char::is_control) {
            return Err(ApiError::PatchBadValue);
        }
        changes.push(MetadataChange::Set {
            machine,
            key,
            value: value.to_owned(),
        });
    }
    Ok(changes)
}

/// The registry as the API uses it: the shared reads, and the units role for every write.
#[derive(Debug, Clone)]
pub struct Ops<K> {
    registry: Registry<K>,
    units: UnitsRole<K>,
}

impl<K: Kv> Ops<K> {
    pub fn new(registry: Registry<K>) -> Ops<K> {
        let units = UnitsRole::new(registry.clone());
        Ops { registry, units }
    }

    /// Every unit, sorted by name, with its file, current state and machine, at one revision.
    pub async fn units(&self) -> Result<Vec<entity::Unit>, RegistryError> {
        let snap = self.registry.snapshot().await?;
        let files = self.registry.files(Some(snap.revision)).await?;
        let units = snap
            .units
            .values()
            .filter_map(|unit| {
                // A unit whose file is unreadable is left out, as a corrupt record is.
                let file = files.items.get(&unit.hash())?;
                Some(unit_entity(&snap, unit, file))
            })
            .collect();
        Ok(units)
    }

    /// One unit; None if there is none (or the name cannot name one).
    pub async fn unit(&self, name: &str) -> Result<Option<entity::Unit>, RegistryError> {
        let Ok(name) = name.parse::<UnitName>() else {
            return Ok(None);
        };
        if self.registry.unit(&name).await?.is_none() {
            return Ok(None);
        }
        // Current state and machine come from the schedule and the published states. A
        // replace between the snapshot and the file read may have collected the file the
        // snapshot names: read again, as a client would.
        let mut attempts = 0;
        loop {
            let snap = self.registry.snapshot().await?;
            let Some(unit) = snap.units.get(&name) else {
                return Ok(None);
            };
            match self.registry.unit_file(unit).await {
                Ok(file) => return Ok(Some(unit_entity(&snap, unit, &file))),
                Err(RegistryError::FileMissing { .. }) if attempts < 3 => attempts += 1,
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads what a `PUT` needs, decides, and writes. A refused request writes nothing.
    pub async fn put(&self, req: PutRequest) -> Result<PutPlan, ApiError> {
        let existing = self.registry.unit(&req.name).await?;
        let plan = match existing {
            None => decide_put(req.clone(), None)?,
            Some(unit) => {
                // The file of the record we read is gone only if another client replaced or
                // destroyed the unit since: a conflict (409), which a retry resolves.
                let file = self.registry.unit_file(&unit).await.map_err(|e| match e {
                    RegistryError::FileMissing { unit, .. } => RegistryError::Conflict(unit),
                    e => e,
                })?;
                decide_put(req.clone(), Some((unit, &file)))?
            }
        };
        self.apply(&req.name, &plan).await?;
        Ok(plan)
    }

    async fn apply(&self, name: &UnitName, plan: &PutPlan) -> Result<(), RegistryError> {
        match plan {
            PutPlan::Create { file, desired } => {
                match self.units.create_unit(name, file, *desired).await? {
                    CreateOutcome::Created(_) => {}
                    // Created by another client since we read: theirs stays.
                    CreateOutcome::Exists(_) => return Err(RegistryError::Conflict(name.clone())),
                }
            }
            PutPlan::Replace {
                existing,
                file,
                desired,
            } => {
                self.units.replace_unit(existing, file, *desired).await?;
            }
            PutPlan::SetState { existing, desired } => {
                self.units.set_desired(existing, *desired).await?;
            }
            PutPlan::Unchanged => {}
        }
        debug!(unit = %name, plan = ?plan_kind(plan), "api wrote unit");
        Ok(())
    }

    /// Destroys a unit; false if there was none. A record that cannot be read is destroyed
    /// too: the API is how an operator without etcd access cleans one up.
    pub async fn destroy(&self, name: &str) -> Result<bool, RegistryError> {
        let Ok(name) = name.parse::<UnitName>() else {
            return Ok(false);
        };
        match self.registry.unit(&name).await {
            Ok(Some(unit)) => {
                self.units.destroy_unit(&unit).await?;
                Ok(true)
            }
            Ok(None) => Ok(false),
            Err(RegistryError::Corrupt { .. }) => self.units.destroy_unreadable_unit(&name).await,
            Err(e) => Err(e),
        }
    }

    /// Published unit states, sorted by unit then machine, filtered by exact machine ID and
    /// unit name when given.
    pub async fn states(
        &self,
        machine: Option<&str>,
        unit: Option<&str>,
    ) -> Result<Vec<entity::UnitState>, RegistryError> {
        let states = self.registry.unit_states().await?;
        Ok(states
            .items
            .iter()
            .filter(|s| machine.is_none_or(|m| s.machine.as_str() == m))
            .filter(|s| unit.is_none_or(|u| s.name.as_str() == u))
            .map(state_entity)
            .collect())
    }

    /// Live machines, sorted by ID, each with its dynamic metadata over its configured
    /// metadata (merged by the registry, as the engine's view merges it).
    pub async fn machines(&self) -> Result<Vec<entity::Machine>, RegistryError> {
        let machines = self.registry.machines().await?;
        Ok(machines
            .items
            .into_iter()
            .map(|m| entity::Machine {
                id: m.id.to_string(),
                primary_ip: m.public_ip,
                metadata: m.metadata,
                ..Default::default()
            })
            .collect())
    }

    /// Applies a patch's changes, all or nothing.
    pub async fn change_metadata(&self, changes: &[MetadataChange]) -> Result<(), RegistryError> {
        if changes.is_empty() {
            return Ok(());
        }
        self.units.change_metadata(changes).await
    }
}

fn plan_kind(plan: &PutPlan) -> &'static str {
    match plan {
        PutPlan::Create { .. } => "create",
        PutPlan::Replace { .. } => "replace",
        PutPlan::SetState { .. } => "set state",
        PutPlan::Unchanged => "unchanged",
    }
}

fn state_entity(s: &UnitStateRecord) -> entity::UnitState {
    entity::UnitState {
        name: s.name.to_string(),
        hash: s.hash.map(|h| h.to_string()).unwrap_or_default(),
        machine_id: s.machine.to_string(),
        systemd_load_state: s.systemd.load.clone(),
        systemd_active_state: s.systemd.active.clone(),
        systemd_sub_state: s.systemd.sub.clone(),
        ..Default::default()
    }
}

/// fleet's Unit: `currentState` is `launched` where a machine scheduled to launch it reports
/// it active, `loaded` where a scheduled machine reports it at all, else `inactive` (the rule
/// of fleetctl's `list-unit-files`); `machineID` is the machine it is scheduled to, left out
/// for a global unit.
fn unit_entity(snap: &Snapshot, unit: &Unit, file: &UnitFile) -> entity::Unit {
    let name = unit.name();
    let global = Requirements::from_unit(name, file).global;
    let scheduled = snap.schedule.get(name);
    let mut current = DesiredState::Inactive;
    let mut machine: Option<&MachineId> = None;
    for (id, entry) in scheduled.into_iter().flat_map(|p| p.iter()) {
        machine.get_or_insert(id);
        let Some(state) = snap.states.get(name).and_then(|s| s.get(id)) else {
            continue;
        };
        let here = if entry.desired == DesiredState::Launched
            && state.systemd.active_state() == ActiveState::Active
        {
            DesiredState::Launched
        } else {
            DesiredState::Loaded
        };
        current = current.max(here);
    }
    entity::Unit {
        name: name.to_string(),
        options: file
            .options()
            .iter()
            .map(|o| entity::UnitOption {
                section: o.section.clone(),
                name: o.name.clone(),
                value: o.value.clone(),
            })
            .collect(),
        desired_state: unit.desired().to_string(),
        current_state: current.to_string(),
        machine_id: match machine {
            Some(id) if !global => id.to_string(),
            _ => String::new(),
        },
        ..Default::default()
    }
}
