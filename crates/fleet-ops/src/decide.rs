//! The pure decisions of the writes: what a put, a state change and a restart do to a unit
//! as read, and what a replace records. The etcd side reads, calls these, and writes
//! conditionally; nothing here does I/O.

use fleet_core::{
    DesiredState, MachineId, RequirementError, Requirements, UnitFile, UnitHash, UnitName,
};
use fleet_registry::{ReplaceState, Rollout, Unit};
use std::collections::BTreeSet;

use crate::OpsError;
use crate::model::{PutRequest, ReplaceHow, StateChange};

/// What a put will write.
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
    Unchanged(Unit),
}

impl PutPlan {
    /// For logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Create { .. } => "create",
            Self::Replace { .. } => "replace",
            Self::SetState { .. } => "set state",
            Self::Unchanged(_) => "unchanged",
        }
    }
}

/// How a unit's new content stands against what the registry holds: the create, keep or
/// replace that fleetctl decides for each argument before it writes anything (so that one bad
/// argument writes nothing) and that the API decides again for every `PUT` (fleet's own
/// clients send nothing else). One rule, run on both sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Content {
    /// No such unit: a create.
    New,
    /// The same file: nothing to write (fleetctl's "nothing to do", the API's state change).
    Same,
    /// Another file: a replace, where [`replace_lowers`] allows it.
    Differs,
}

/// [`Content`] of a file hashing to `new` for a unit holding `existing` (`None`: no unit).
pub fn content(existing: Option<UnitHash>, new: UnitHash) -> Content {
    match existing {
        None => Content::New,
        Some(held) if held == new => Content::Same,
        Some(_) => Content::Differs,
    }
}

/// Whether replacing a unit's content with the desired state `asked` would lower its desired
/// state `existing`: never done (fleet reset it to `inactive`). fleetctl words it with fleet's
/// "can not replace … in state …, use the appropriate command" (`submit` asks `inactive`,
/// `load` `loaded`, `start` `launched`); the API answers [`OpsError::ReplaceLowers`].
pub fn replace_lowers(existing: DesiredState, asked: DesiredState) -> bool {
    asked < existing
}

/// What a put does to `existing` (with its file). fleet's rules, made right where fleet was
/// wrong: a template is never activated, not even when created; a replace never lowers the
/// desired state (fleet reset it to `inactive`), unless it comes in fleet's form
/// ([`ReplaceHow::fleet_form`]), whose clients wait for that reset. The same file, or none,
/// with no desired state is `Unchanged` (fleetctl's submit of a unit already there); a state
/// alone may lower (fleet's `PUT` with `desiredState` is how its clients stop and unload).
pub fn decide_put(
    req: &PutRequest,
    existing: Option<(&Unit, &UnitFile)>,
) -> Result<PutPlan, OpsError> {
    let name = &req.name;
    let Some((existing, existing_file)) = existing else {
        let file = req
            .file
            .clone()
            .ok_or_else(|| OpsError::NoOptions(name.clone()))?;
        let desired = req.desired.unwrap_or(DesiredState::Inactive);
        template_check(name, desired)?;
        validate_file(name, &file)?;
        return Ok(PutPlan::Create { file, desired });
    };
    if let Some(file) = &req.file
        && content(Some(existing_file.hash()), file.hash()) == Content::Differs
    {
        let desired = match req.how.fleet_form {
            true => req.desired.unwrap_or(DesiredState::Inactive),
            false => req.desired.unwrap_or(existing.desired()),
        };
        template_check(name, desired)?;
        if replace_lowers(existing.desired(), desired) && !req.how.fleet_form {
            return Err(OpsError::ReplaceLowers {
                name: name.clone(),
                existing: existing.desired(),
                asked: desired,
            });
        }
        validate_file(name, file)?;
        return Ok(PutPlan::Replace {
            existing: existing.clone(),
            file: file.clone(),
            desired,
        });
    }
    match req.desired {
        Some(desired) if desired != existing.desired() => {
            template_check(name, desired)?;
            Ok(PutPlan::SetState {
                existing: existing.clone(),
                desired,
            })
        }
        Some(_) | None => Ok(PutPlan::Unchanged(existing.clone())),
    }
}

/// fleet's template rule, for every write path (fleetctl checks it before it reads
/// anything, and words it with a hint): a template (`name@.service`) is never activated,
/// only ever `inactive`; its instances are what runs.
pub fn template_check(name: &UnitName, desired: DesiredState) -> Result<(), OpsError> {
    if name.is_template() && desired != DesiredState::Inactive {
        return Err(OpsError::ActivateTemplate(name.clone()));
    }
    Ok(())
}

/// The unit check of every write path (fleetctl's submit, the API's wire check, and
/// [`decide_put`]): a file's `[X-Fleet]` requirements must be possible and their values
/// valid. Each side words the error its own way ([`validate_file`] is fleetctl's).
pub fn check_requirements(name: &UnitName, file: &UnitFile) -> Result<(), RequirementError> {
    Requirements::from_unit(name, file).validate()?;
    fleet_core::xfleet::check_values(name, file)
}

/// [`check_requirements`] as an [`OpsError`]: `<unit>: <reason>`, what fleetctl prints.
pub fn validate_file(name: &UnitName, file: &UnitFile) -> Result<(), OpsError> {
    check_requirements(name, file).map_err(|e| OpsError::Invalid {
        name: name.clone(),
        reason: e.to_string(),
    })
}

/// The desired state `change` sets on `unit`; `None` when it is already there.
pub fn decide_state(change: StateChange, unit: &Unit) -> Result<Option<DesiredState>, OpsError> {
    let current = unit.desired();
    match change {
        StateChange::Stop => match current {
            DesiredState::Inactive => Err(OpsError::StopInactive(unit.name().clone())),
            DesiredState::Loaded => Ok(None),
            DesiredState::Launched => Ok(Some(DesiredState::Loaded)),
        },
        StateChange::Unload => {
            Ok((current != DesiredState::Inactive).then_some(DesiredState::Inactive))
        }
        StateChange::Raise(target) if target > current => {
            template_check(unit.name(), target)?;
            Ok(Some(target))
        }
        StateChange::Raise(_) => Ok(None),
    }
}

/// What a restart does to a unit as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartPlan {
    /// Launched: a new restart generation.
    NewGeneration,
    /// Loaded: launch it.
    Launch,
}

pub fn decide_restart(unit: &Unit) -> Result<RestartPlan, OpsError> {
    match unit.desired() {
        DesiredState::Inactive => Err(OpsError::RestartInactive(unit.name().clone())),
        DesiredState::Loaded => Ok(RestartPlan::Launch),
        DesiredState::Launched => Ok(RestartPlan::NewGeneration),
    }
}

/// The replace options recorded with the new version of `existing`, to be `desired`. `placed`
/// is the machine it runs on now (what `reschedule` avoids, what fleet's form keeps for the
/// launch that follows when it leaves the unit inactive); `global` whether the new file is
/// global: only a global unit is rolled machine by machine, any other is replaced at once.
pub fn replace_state(
    how: ReplaceHow,
    existing: &Unit,
    desired: DesiredState,
    placed: Option<&MachineId>,
    global: bool,
) -> ReplaceState {
    let old = &existing.record.replace;
    ReplaceState {
        no_restart: how.no_restart,
        placement: old.placement + u64::from(how.reschedule),
        avoid: if how.reschedule {
            placed.cloned()
        } else {
            None
        },
        prefer: placed
            .filter(|_| how.fleet_form && desired == DesiredState::Inactive)
            .cloned(),
        rollout: (how.rolling && global).then(|| Rollout {
            previous: existing.hash(),
            updated: BTreeSet::new(),
        }),
    }
}

#[cfg(test)]
mod tests;
