//! The writes to a unit: fleet's `PUT` and `DELETE`, and the extensions' operations
//! (`PUT ?op=...`). Each checks the request, calls [`fleet_ops::Cluster`] once, and answers
//! fleet's status code, or in the full view 200 with a [`WriteResult`].

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use fleet_core::{DesiredState, MachineId, UnitName};
use fleet_ops::convert;
use fleet_ops::wire::{self, Op, WriteResult};
use fleet_ops::{Cluster, Destroyed, Expect, PutOutcome, PutRequest, ReplaceHow, StateChange};
use fleet_registry::kv::Kv;
use http::StatusCode;

use super::{Api, MAX_BODY, Query, check_content_type, first, query_values};
use crate::entity;
use crate::error::{ApiError, json_response};
use crate::ops::unit_file;

pub(super) async fn delete_unit<K: Kv>(
    api: &Api<K>,
    name: &str,
    query: &Query,
) -> Result<Response, ApiError> {
    let destroyed = match name.parse::<UnitName>() {
        Ok(name) => api.cluster.destroy(&name).await?,
        Err(_) => Destroyed::Missing,
    };
    if query.full {
        return Ok(written(&convert::destroyed_to_wire(&destroyed)));
    }
    match destroyed {
        Destroyed::Unit | Destroyed::Unreadable(_) => Ok(StatusCode::NO_CONTENT.into_response()),
        Destroyed::Missing => Err(ApiError::UnitNotFound),
    }
}

/// A full-view write's answer: 200 with what it did.
fn written(result: &WriteResult) -> Response {
    json_response(StatusCode::OK, result)
}

pub(super) async fn put_unit<K: Kv>(
    api: &Api<K>,
    url_name: &str,
    query: &Query,
    req: Request,
) -> Result<Response, ApiError> {
    check_content_type(req.headers())?;
    let op = match first(&query.raw, wire::OP) {
        None => None,
        Some(op) => Some(Op::parse(&op).ok_or(ApiError::UnknownOp(op))?),
    };
    let body = axum::body::to_bytes(req.into_body(), MAX_BODY)
        .await
        .map_err(ApiError::ReadBody)?;
    let wire: entity::Unit = serde_json::from_slice(&body).map_err(ApiError::DecodeBody)?;
    let body_name = if wire.name.is_empty() {
        url_name
    } else {
        wire.name.as_str()
    };
    if body_name != url_name {
        return Err(ApiError::NameMismatch {
            url: url_name.to_owned(),
            body: body_name.to_owned(),
        });
    }
    let name: UnitName = url_name.parse()?;
    let desired = match wire.desired_state.as_str() {
        "" => None,
        s => Some(s.parse::<DesiredState>()?),
    };
    if let Some(op) = op {
        if !wire.options.is_empty() {
            return Err(ApiError::OpWithOptions(op.as_str()));
        }
        return run_op(api, &name, op, desired, query).await;
    }
    let file = match wire.options.as_slice() {
        [] => None,
        options => Some(unit_file(&name, options)?),
    };
    let how = ReplaceHow {
        no_restart: flag(&query.raw, wire::NO_RESTART),
        reschedule: flag(&query.raw, wire::RESCHEDULE),
        rolling: flag(&query.raw, wire::ROLLING),
    };
    let expect = match first(&query.raw, wire::EXPECT) {
        None => None,
        Some(v) if v == wire::EXPECT_ABSENT => Some(Expect::Absent),
        Some(v) => Some(Expect::Content(
            v.parse().map_err(|_| ApiError::BadExpect(v.clone()))?,
        )),
    };
    let req = PutRequest {
        name,
        file,
        desired,
        how,
    };
    let outcome = match expect {
        Some(Expect::Absent) if req.file.is_some() && req.how == ReplaceHow::default() => {
            api.creates.create(&api.cluster, req).await?
        }
        Some(expect) => api.cluster.put_if(req, expect).await?,
        None => api.cluster.put(req).await?,
    };
    if query.full {
        return Ok(written(&convert::put_to_wire(&outcome)));
    }
    let status = match outcome {
        PutOutcome::Created(_) | PutOutcome::Replaced(_) => StatusCode::CREATED,
        PutOutcome::StateChanged(_) => StatusCode::NO_CONTENT,
        // fleet's rule for an existing unit: a PUT that changes no content names a state.
        PutOutcome::Unchanged(_) if desired.is_none() => return Err(ApiError::NoDesiredState),
        PutOutcome::Unchanged(_) => StatusCode::NO_CONTENT,
    };
    Ok(status.into_response())
}

/// The extensions' operations (`PUT /units/<name>?op=...`): 204, or in the full view 200
/// with what was done.
async fn run_op<K: Kv>(
    api: &Api<K>,
    name: &UnitName,
    op: Op,
    desired: Option<DesiredState>,
    query: &Query,
) -> Result<Response, ApiError> {
    let c = &api.cluster;
    let result = match op {
        Op::Stop | Op::Unload | Op::Raise => {
            let change = match op {
                Op::Stop => StateChange::Stop,
                Op::Unload => StateChange::Unload,
                _ => StateChange::Raise(desired.ok_or(ApiError::RaiseWithoutState)?),
            };
            let changed = c.set_state(name, change).await?;
            convert::set_state_to_wire(changed.as_ref())
        }
        Op::Restart => convert::restart_to_wire(c.restart(name).await?),
        Op::AdvanceRollout => {
            let machines = query_values(&query.raw, wire::MACHINE_ID)
                .into_iter()
                .map(|m| {
                    m.parse::<MachineId>()
                        .map_err(|_| ApiError::BadMachineId(m))
                })
                .collect::<Result<Vec<_>, _>>()?;
            convert::rollout_advanced_to_wire(&c.advance_rollout(name, &machines).await?)
        }
        Op::FinishRollout => {
            c.finish_rollout(name).await?;
            WriteResult {
                outcome: wire::Outcome::RolloutFinished,
                unit: None,
                restart_generation: 0,
                detail: String::new(),
            }
        }
    };
    if query.full {
        return Ok(written(&result));
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// A boolean query flag: `true` (or `1`) sets it.
fn flag(query: &str, key: &str) -> bool {
    query_values(query, key)
        .iter()
        .any(|v| v == "true" || v == "1")
}
