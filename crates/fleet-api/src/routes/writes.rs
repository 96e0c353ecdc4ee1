//! The writes to a unit: fleet's `PUT` and `DELETE`, and the extensions' operations
//! (`PUT ?op=...`). Each checks the request, calls [`fleet_ops::Cluster`] once, and answers
//! fleet's status code, or in the full view 200 with a [`WriteResult`].

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use fleet_api_wire::convert;
use fleet_api_wire::wire::{self, Op, WriteResult};
use fleet_core::{DesiredState, MachineId, UnitName};
use fleet_ops::{
    Cluster, Destroyed, Expect, PutOutcome, PutRequest, RegistryCluster, ReplaceHow, StateChange,
};
use fleet_registry::kv::Kv;
use http::{HeaderValue, StatusCode, header};

use super::{Api, MAX_BODY, Query, check_content_type, first, query_values, read_body};
use crate::entity;
use crate::error::{ApiError, json_response};
use crate::ops::{metadata_changes, unit_file};

pub(super) async fn delete_unit<K: Kv>(
    cluster: &RegistryCluster<K>,
    name: &str,
    query: &Query,
) -> Result<Response, ApiError> {
    let destroyed = match name.parse::<UnitName>() {
        Ok(name) => cluster.destroy(&name).await?,
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
    cluster: &RegistryCluster<K>,
    url_name: &str,
    query: &Query,
    req: Request,
) -> Result<Response, ApiError> {
    check_content_type(req.headers())?;
    let op = match first(&query.raw, wire::OP) {
        None => None,
        Some(op) => Some(Op::parse(&op).ok_or(ApiError::UnknownOp(op))?),
    };
    let body = read_body(req.into_body(), MAX_BODY).await?;
    if let Some(why) = crate::shape::refusal(&body, crate::shape::Top::Object) {
        return Err(ApiError::BodyShape(why));
    }
    let (wire, name, desired) = named_unit(url_name, &body)?;
    if let Some(op) = op {
        if !wire.options.is_empty() {
            return Err(ApiError::OpWithOptions(op.as_str()));
        }
        return run_op(cluster, &name, op, desired, query).await;
    }
    let file = match wire.options.as_slice() {
        [] => None,
        options => Some(unit_file(&name, options)?),
    };
    let (how, expect) = replace_how(query)?;
    let req = PutRequest {
        name,
        file,
        desired,
        how,
    };
    let outcome = match expect {
        Some(Expect::Absent) if req.file.is_some() && req.how == ReplaceHow::default() => {
            // Written with other requests' creates: each records its own outcome.
            let name = req.name.clone();
            let sent = fleet_ops::etcd::Sent::now();
            let created = api.creates.create(&api.cluster.without_events(), req).await;
            cluster.record_put(&name, &created, sent);
            created?
        }
        Some(expect) => cluster.put_if(req, expect).await?,
        None => cluster.put(req).await?,
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

/// A `PUT`'s body: the unit it names (the URL's, which a name in the body must equal) and the
/// desired state it asks, if any.
fn named_unit(
    url_name: &str,
    body: &[u8],
) -> Result<(entity::Unit, UnitName, Option<DesiredState>), ApiError> {
    let wire: entity::Unit = serde_json::from_slice(body).map_err(ApiError::DecodeBody)?;
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
    Ok((wire, name, desired))
}

/// How a `PUT` that replaces a unit's content replaces it, and what it expects of the unit.
/// A request that names none of the extensions is fleet's, and its client waits for fleet's
/// answer to a replace: the unit `inactive` with its new content (issue 38).
fn replace_how(query: &Query) -> Result<(ReplaceHow, Option<Expect>), ApiError> {
    let expect = match first(&query.raw, wire::EXPECT) {
        None => None,
        Some(v) if v == wire::EXPECT_ABSENT => Some(Expect::Absent),
        Some(v) => Some(Expect::Content(
            v.parse().map_err(|_| ApiError::BadExpect(v.clone()))?,
        )),
    };
    let extension = [
        wire::NO_RESTART,
        wire::RESCHEDULE,
        wire::ROLLING,
        wire::EXPECT,
    ]
    .iter()
    .any(|key| !query_values(&query.raw, key).is_empty());
    let how = ReplaceHow {
        no_restart: flag(&query.raw, wire::NO_RESTART),
        reschedule: flag(&query.raw, wire::RESCHEDULE),
        rolling: flag(&query.raw, wire::ROLLING),
        fleet_form: !query.full && !extension,
    };
    Ok((how, expect))
}

/// `POST /units?view=full` (docs/api.md "Creates in one request"): each unit created as a
/// `PUT /units/<name>?expect=absent` with its options would create it, all through one
/// [`Cluster::create_many`] (many units per etcd transaction). The request as a whole is
/// refused (400, nothing written) when it is not a list of at most
/// [`wire::MAX_CREATES`] units each named once; a unit the checks of a `PUT` refuse gets
/// that error as its result, the others are written. 200 with one result per unit, in
/// order.
pub(super) async fn create_units<K: Kv>(
    cluster: &RegistryCluster<K>,
    req: Request,
) -> Result<Response, ApiError> {
    check_content_type(req.headers())?;
    let body = read_body(req.into_body(), MAX_BODY).await?;
    if let Some(why) = crate::shape::refusal(&body, crate::shape::Top::Object) {
        return Err(ApiError::BodyShape(why));
    }
    let asked: wire::Creates = serde_json::from_slice(&body).map_err(ApiError::DecodeBody)?;
    if asked.units.len() > wire::MAX_CREATES {
        return Err(ApiError::TooManyCreates {
            got: asked.units.len(),
            max: wire::MAX_CREATES,
        });
    }
    let mut named = std::collections::HashSet::with_capacity(asked.units.len());
    for unit in &asked.units {
        if unit.name.is_empty() {
            return Err(ApiError::CreateWithoutName);
        }
        if !named.insert(unit.name.as_str()) {
            return Err(ApiError::CreatedTwice(unit.name.clone()));
        }
    }
    let mut results: Vec<Option<wire::CreateResult>> = std::iter::repeat_with(|| None)
        .take(asked.units.len())
        .collect();
    let mut reqs = Vec::with_capacity(asked.units.len());
    let mut asked_at = Vec::with_capacity(asked.units.len());
    for (i, unit) in asked.units.iter().enumerate() {
        match create_request(unit) {
            Ok(req) => {
                asked_at.push(i);
                reqs.push(req);
            }
            Err(e) => results[i] = Some(create_failed(&e)),
        }
    }
    let written = cluster.create_many(reqs).await;
    for (i, (_, res)) in asked_at.into_iter().zip(written) {
        results[i] = Some(match res {
            Ok(outcome) => {
                let result = convert::put_to_wire(&outcome);
                wire::CreateResult {
                    outcome: Some(result.outcome),
                    unit: result.unit,
                    error: None,
                }
            }
            Err(e) => create_failed(&ApiError::Ops(e)),
        });
    }
    let results = results
        .into_iter()
        .map(|r| r.expect("every unit has its result"))
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &wire::CreateResults { results },
    ))
}

/// One unit of a `POST /units`, checked as a `PUT` of it checks it.
fn create_request(unit: &entity::Unit) -> Result<PutRequest, ApiError> {
    let name: UnitName = unit.name.parse()?;
    let desired = match unit.desired_state.as_str() {
        "" => None,
        s => Some(s.parse::<DesiredState>()?),
    };
    let file = match unit.options.as_slice() {
        // Refused by the create itself, as a PUT of a missing unit without options is.
        [] => None,
        options => Some(unit_file(&name, options)?),
    };
    Ok(PutRequest {
        name,
        file,
        desired,
        how: ReplaceHow::default(),
    })
}

fn create_failed(e: &ApiError) -> wire::CreateResult {
    wire::CreateResult {
        error: Some(e.entity(true)),
        ..wire::CreateResult::default()
    }
}

/// The extensions' operations (`PUT /units/<name>?op=...`): 204, or in the full view 200
/// with what was done.
async fn run_op<K: Kv>(
    c: &RegistryCluster<K>,
    name: &UnitName,
    op: Op,
    desired: Option<DesiredState>,
    query: &Query,
) -> Result<Response, ApiError> {
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

/// fleet's `PATCH /machines`: validated as a whole, then applied in one transaction; 204
/// with a JSON content type (fleet's functional tests check it). fleet checks no content type
/// here and its tests send none, so only a wrong one is refused.
pub(super) async fn patch_machines<K: Kv>(
    cluster: &RegistryCluster<K>,
    req: Request,
) -> Result<Response, ApiError> {
    if req.headers().contains_key(header::CONTENT_TYPE) {
        check_content_type(req.headers())?;
    }
    let body = read_body(req.into_body(), MAX_BODY).await?;
    if let Some(why) = crate::shape::refusal(&body, crate::shape::Top::Array) {
        return Err(ApiError::BodyShape(why));
    }
    let ops: Vec<entity::MetadataOp> =
        serde_json::from_slice(&body).map_err(ApiError::DecodeBody)?;
    let changes = metadata_changes(&ops)?;
    cluster.change_metadata(&changes).await?;
    let mut resp = StatusCode::NO_CONTENT.into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}
