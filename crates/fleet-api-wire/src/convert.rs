//! The model to the wire and back: the server (fleet-api) turns what [`fleet_ops::Cluster`]
//! returns into entities with the `*_to_wire` functions, and fleetctl's HTTP client turns the
//! entities back with the `*_from_wire` ones. A value survives the round trip through the
//! full view (`?view=full`) unchanged; the default view is fleet's entity alone.

use fleet_core::fence::{parse_rfc3339_micros, rfc3339_micros};
use fleet_core::{DesiredState, MachineId, MachineInfo, Requirements, UnitFile, UnitName};

use crate::wire::{self, Outcome, Reason, WriteResult};
use fleet_ops::OpsError;
use fleet_ops::model::{Destroyed, PutOutcome, Restarted, StateView, UnitStatus, UnitView};

/// The options of a unit file as fleet's entity has them.
pub fn options_to_wire(file: &UnitFile) -> Vec<wire::UnitOption> {
    file.options()
        .iter()
        .map(|o| wire::UnitOption {
            section: o.section.clone(),
            name: o.name.clone(),
            value: o.value.clone(),
        })
        .collect()
}

/// A unit file from fleet's options, as given (the server checks them further).
pub fn options_from_wire(options: &[wire::UnitOption]) -> UnitFile {
    UnitFile::from_options(
        options
            .iter()
            .map(|o| fleet_core::UnitOption {
                section: o.section.clone(),
                name: o.name.clone(),
                value: o.value.clone(),
            })
            .collect(),
    )
}

/// fleet's Unit; `machineID` is the first machine it is scheduled to, left out for a global
/// unit. `full` adds the extensions.
pub fn unit_to_wire(view: &UnitView, full: bool) -> wire::Unit {
    let s = &view.status;
    let mut unit = wire::Unit {
        name: s.name.to_string(),
        options: options_to_wire(&view.file),
        desired_state: s.desired.to_string(),
        current_state: view.current.to_string(),
        machine_id: match s.machines.first() {
            Some(id) if !view.global => id.to_string(),
            _ => String::new(),
        },
        ..wire::Unit::default()
    };
    if full {
        unit.hash = s.hash.to_string();
        unit.machine_ids = s.machines.iter().map(ToString::to_string).collect();
        unit.unscheduled_reason = s.unscheduled.clone().unwrap_or_default();
        unit.restart_generation = s.restart;
    }
    unit
}

/// A full-view Unit back into the model.
pub fn unit_from_wire(unit: &wire::Unit) -> Result<UnitView, OpsError> {
    let name: UnitName = unit
        .name
        .parse()
        .map_err(|e| bad_answer("a unit's name", e))?;
    let file = options_from_wire(&unit.options);
    let hash = match unit.hash.as_str() {
        "" => file.hash(),
        h => h.parse().map_err(|e| bad_answer("a unit's hash", e))?,
    };
    let state = |s: &str, what: &'static str| match s {
        "" => Ok(DesiredState::Inactive),
        s => s.parse::<DesiredState>().map_err(|e| bad_answer(what, e)),
    };
    let machines = unit
        .machine_ids
        .iter()
        .map(|m| m.parse::<MachineId>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad_answer("a unit's machines", e))?;
    let global = Requirements::from_unit(&name, &file).global;
    Ok(UnitView {
        status: UnitStatus {
            name,
            hash,
            desired: state(&unit.desired_state, "a unit's desiredState")?,
            machines,
            unscheduled: (!unit.unscheduled_reason.is_empty())
                .then(|| unit.unscheduled_reason.clone()),
            restart: unit.restart_generation,
        },
        file,
        global,
        current: state(&unit.current_state, "a unit's currentState")?,
    })
}

pub fn state_to_wire(s: &StateView, full: bool) -> wire::UnitState {
    let mut state = wire::UnitState {
        name: s.name.to_string(),
        hash: s.hash.map(|h| h.to_string()).unwrap_or_default(),
        machine_id: s.machine.to_string(),
        systemd_load_state: s.load.clone(),
        systemd_active_state: s.active.clone(),
        systemd_sub_state: s.sub.clone(),
        ..wire::UnitState::default()
    };
    if full {
        state.restart_generation = s.restart;
        state.restart_pending = s.restart_pending;
        state.restarts = s.restarts;
        state.since = s.since.map(rfc3339_micros);
        state.exit = s.exit.clone();
    }
    state
}

/// [`state_to_wire`] without copying: the entity that borrows `s`, written as the same JSON.
pub fn state_out(s: &StateView, full: bool) -> wire::UnitStateOut<'_> {
    wire::UnitStateOut {
        name: s.name.as_str(),
        hash: s.hash.as_ref(),
        machine_id: s.machine.as_str(),
        systemd_load_state: &s.load,
        systemd_active_state: &s.active,
        systemd_sub_state: &s.sub,
        restart_generation: if full { s.restart } else { 0 },
        restart_pending: full && s.restart_pending,
        restarts: if full { s.restarts } else { 0 },
        since: s.since.filter(|_| full).map(rfc3339_micros),
        exit: s.exit.as_deref().filter(|_| full),
    }
}

pub fn state_from_wire(s: &wire::UnitState) -> Result<StateView, OpsError> {
    Ok(StateView {
        name: s
            .name
            .parse()
            .map_err(|e| bad_answer("a state's unit", e))?,
        machine: s
            .machine_id
            .parse()
            .map_err(|e| bad_answer("a state's machine", e))?,
        hash: match s.hash.as_str() {
            "" => None,
            h => Some(h.parse().map_err(|e| bad_answer("a state's hash", e))?),
        },
        load: s.systemd_load_state.clone(),
        active: s.systemd_active_state.clone(),
        sub: s.systemd_sub_state.clone(),
        restart: s.restart_generation,
        restart_pending: s.restart_pending,
        restarts: s.restarts,
        since: s
            .since
            .as_deref()
            .map(|t| {
                parse_rfc3339_micros(t)
                    .ok_or_else(|| bad_answer("a state's since", BadTime(t.to_owned())))
            })
            .transpose()?,
        exit: s.exit.clone(),
    })
}

pub fn machine_to_wire(m: &MachineInfo, full: bool) -> wire::Machine {
    let mut machine = wire::Machine {
        id: m.id.to_string(),
        primary_ip: m.public_ip.clone(),
        metadata: m.metadata.clone(),
        fence_at: m.fence_at,
        ..wire::Machine::default()
    };
    if full {
        machine.version = m.version.clone();
        machine.disable_engine = m.disable_engine;
        machine.api = m.api.clone();
    }
    machine
}

pub fn machine_from_wire(m: &wire::Machine) -> Result<MachineInfo, OpsError> {
    Ok(MachineInfo {
        id: m.id.parse().map_err(|e| bad_answer("a machine's ID", e))?,
        public_ip: m.primary_ip.clone(),
        metadata: m.metadata.clone(),
        version: m.version.clone(),
        disable_engine: m.disable_engine,
        api: m.api.clone(),
        fence_at: m.fence_at,
    })
}

/// The full-view body of a put's outcome.
pub fn put_to_wire(outcome: &PutOutcome) -> WriteResult {
    let (outcome, view) = match outcome {
        PutOutcome::Created(v) => (Outcome::Created, v),
        PutOutcome::Replaced(v) => (Outcome::Replaced, v),
        PutOutcome::StateChanged(v) => (Outcome::StateChanged, v),
        PutOutcome::Unchanged(v) => (Outcome::Unchanged, v),
    };
    written(outcome, Some(view))
}

pub fn put_from_wire(result: &WriteResult) -> Result<PutOutcome, OpsError> {
    let view = written_unit(result)?;
    Ok(match result.outcome {
        Outcome::Created => PutOutcome::Created(view),
        Outcome::Replaced => PutOutcome::Replaced(view),
        Outcome::StateChanged => PutOutcome::StateChanged(view),
        Outcome::Unchanged => PutOutcome::Unchanged(view),
        other => return Err(unexpected(other)),
    })
}

/// The full-view body of `op=stop|unload|raise`: `None` (already there) is `unchanged`
/// without a unit.
pub fn set_state_to_wire(changed: Option<&UnitView>) -> WriteResult {
    match changed {
        Some(v) => written(Outcome::StateChanged, Some(v)),
        None => written(Outcome::Unchanged, None),
    }
}

pub fn set_state_from_wire(result: &WriteResult) -> Result<Option<UnitView>, OpsError> {
    match result.outcome {
        Outcome::StateChanged => Ok(Some(written_unit(result)?)),
        Outcome::Unchanged => Ok(None),
        other => Err(unexpected(other)),
    }
}

pub fn restart_to_wire(r: Restarted) -> WriteResult {
    match r {
        Restarted::Generation(generation) => WriteResult {
            restart_generation: generation,
            ..written(Outcome::Restarted, None)
        },
        Restarted::Launched => written(Outcome::Launched, None),
    }
}

pub fn restart_from_wire(result: &WriteResult) -> Result<Restarted, OpsError> {
    match result.outcome {
        Outcome::Restarted => Ok(Restarted::Generation(result.restart_generation)),
        Outcome::Launched => Ok(Restarted::Launched),
        other => Err(unexpected(other)),
    }
}

pub fn destroyed_to_wire(d: &Destroyed) -> WriteResult {
    match d {
        Destroyed::Unit => written(Outcome::Destroyed, None),
        Destroyed::Unreadable(why) => WriteResult {
            detail: why.clone(),
            ..written(Outcome::Unreadable, None)
        },
        Destroyed::Missing => written(Outcome::Missing, None),
    }
}

pub fn destroyed_from_wire(result: &WriteResult) -> Result<Destroyed, OpsError> {
    match result.outcome {
        Outcome::Destroyed => Ok(Destroyed::Unit),
        Outcome::Unreadable => Ok(Destroyed::Unreadable(result.detail.clone())),
        Outcome::Missing => Ok(Destroyed::Missing),
        other => Err(unexpected(other)),
    }
}

/// `op=advanceRollout`'s body, with the unit as written.
pub fn rollout_advanced_to_wire(view: &UnitView) -> WriteResult {
    written(Outcome::RolloutAdvanced, Some(view))
}

pub fn rollout_advanced_from_wire(result: &WriteResult) -> Result<UnitView, OpsError> {
    match result.outcome {
        Outcome::RolloutAdvanced => written_unit(result),
        other => Err(unexpected(other)),
    }
}

fn written(outcome: Outcome, view: Option<&UnitView>) -> WriteResult {
    WriteResult {
        outcome,
        unit: view.map(|v| unit_to_wire(v, true)),
        restart_generation: 0,
        detail: String::new(),
    }
}

fn written_unit(result: &WriteResult) -> Result<UnitView, OpsError> {
    let unit = result
        .unit
        .as_ref()
        .ok_or_else(|| bad_answer("a write's result", MissingUnit))?;
    unit_from_wire(unit)
}

/// The reason a full-view error entity gives for `e`, if it has one.
pub fn reason_of(e: &OpsError) -> Option<Reason> {
    Some(match e {
        OpsError::NoSuchUnit(_) => Reason::NoSuchUnit,
        OpsError::Conflict(_) => Reason::Conflict,
        OpsError::StopInactive(_) => Reason::StopInactive,
        OpsError::RestartInactive(_) => Reason::RestartInactive,
        OpsError::ActivateTemplate(_) => Reason::ActivateTemplate,
        OpsError::NoOptions(_) => Reason::NoOptions,
        OpsError::ReplaceLowers { .. } => Reason::ReplaceLowers,
        OpsError::Invalid { .. } => Reason::Invalid,
        OpsError::Registry(_) => Reason::Registry,
        OpsError::NotWritten { .. } => Reason::NotWritten,
        OpsError::Api { .. } | OpsError::Transport { .. } => {
            return None;
        }
    })
}

/// The error an error entity stands for. `unit` is the unit the request's URL named. The
/// variants carrying only a name are rebuilt; any other error keeps its status and its
/// message (the `detail` of a full-view entity, which is what fleetctl prints).
pub fn error_from_wire(unit: Option<&UnitName>, e: &wire::ErrorEntity) -> OpsError {
    let message = if e.detail.is_empty() {
        e.message.clone()
    } else {
        e.detail.clone()
    };
    let api = || OpsError::Api {
        code: e.code,
        message: message.clone(),
    };
    let (Some(reason), Some(name)) = (e.reason, unit) else {
        return api();
    };
    let name = name.clone();
    match reason {
        Reason::NoSuchUnit => OpsError::NoSuchUnit(name),
        Reason::Conflict => OpsError::Conflict(name),
        Reason::StopInactive => OpsError::StopInactive(name),
        Reason::RestartInactive => OpsError::RestartInactive(name),
        Reason::ActivateTemplate => OpsError::ActivateTemplate(name),
        Reason::NoOptions => OpsError::NoOptions(name),
        // The unit whose failure stopped it is another result's: the many-unit create's
        // client rebuilds it (fleetctl's `driver/creates.rs`).
        Reason::ReplaceLowers | Reason::Invalid | Reason::Registry | Reason::NotWritten => api(),
    }
}

fn unexpected(outcome: Outcome) -> OpsError {
    bad_answer("a write's result", UnexpectedOutcome(outcome))
}

fn bad_answer(what: &str, e: impl std::error::Error + Send + Sync + 'static) -> OpsError {
    OpsError::Transport {
        what: format!("the API answered an invalid value for {what}"),
        cause: Box::new(e),
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a time in RFC 3339")]
struct BadTime(String);

#[derive(Debug, thiserror::Error)]
#[error("no unit in the result")]
struct MissingUnit;

#[derive(Debug, thiserror::Error)]
#[error("outcome {0:?} does not answer this request")]
struct UnexpectedOutcome(Outcome);

#[cfg(test)]
mod tests;
