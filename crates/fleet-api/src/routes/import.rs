//! `POST /import`: writes an import plan from fleet v1 (`fleetctl --driver api import-fleet`,
//! docs/migrating.md) with [`Importer::apply`], the writer of the etcd driver too. It writes
//! schedule entries, as only the engine otherwise does, so only an admin may ask
//! ([`crate::authz::Action::Import`]); and the whole plan is checked before anything is
//! written ([`fleet_api_wire::import::plan_of`]): a file that is not what its hash says, a
//! name or option ours refuses, is a 400 that wrote nothing.
//!
//! fleetd's own etcd user writes the plan: without the engine's role etcd refuses the
//! schedule entries, which answers 403 naming that user, as every route does.

use axum::extract::Request;
use axum::response::Response;
use fleet_api_wire::import::{ImportRequest, ImportResult, ImportResults, plan_of};
use fleet_ops::OpsError;
use fleet_registry::kv::Kv;
use fleet_registry::{ImportOutcome, Importer};
use http::StatusCode;
use tracing::info;

use super::Api;
use super::body::{MAX_BODY, check_content_type, read_body};
use crate::error::{ApiError, json_response};
use crate::shape::{Top, refusal};

pub(super) async fn import<K: Kv>(api: &Api<K>, req: Request) -> Result<Response, ApiError> {
    check_content_type(req.headers())?;
    let body = read_body(req.into_body(), MAX_BODY).await?;
    if let Some(why) = refusal(&body, Top::Object) {
        return Err(ApiError::BodyShape(why));
    }
    let asked: ImportRequest = serde_json::from_slice(&body).map_err(ApiError::DecodeBody)?;
    drop(body);
    let plan = plan_of(asked)?;
    let importer = Importer::new(api.cluster.registry().clone());
    let outcomes = importer
        .apply(&plan)
        .await
        .map_err(|e| ApiError::Ops(OpsError::Registry(e)))?;
    let results: Vec<ImportResult> = plan
        .units
        .iter()
        .zip(&outcomes)
        .map(|(unit, outcome)| ImportResult {
            name: unit.name.to_string(),
            written: matches!(outcome, ImportOutcome::Written(_)),
        })
        .collect();
    let written = results.iter().filter(|r| r.written).count();
    info!(
        marks = plan.marks.len(),
        units = results.len(),
        written,
        "imported units from fleet"
    );
    Ok(json_response(StatusCode::OK, &ImportResults { results }))
}
