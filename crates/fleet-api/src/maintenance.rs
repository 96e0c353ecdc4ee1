//! This API's drain and explain extensions (docs/api.md "Drain and explain"): thin handlers
//! over [`fleet_ops::Cluster`], whose etcd side answers with the engine's own rules.
//!
//! - `GET /drains`: every drain mark; `GET /drains/<machine>`: how its drain stands;
//!   `PUT /drains/<machine>?parallel=N`: drain it; `DELETE /drains/<machine>`: undrain it.
//! - `GET /explain/<unit>`: why the unit is where it is, or nowhere.

use axum::response::Response;
use fleet_api_wire::wire::{self, DrainList, Undrained};
use fleet_core::{MachineId, UnitName};
use fleet_ops::{Cluster, RegistryCluster};
use fleet_registry::kv::Kv;
use http::{Method, StatusCode};

use crate::error::{ApiError, json_response};

pub(crate) async fn list_drains<K: Kv>(c: &RegistryCluster<K>) -> Result<Response, ApiError> {
    let listing = c.machines().await?;
    let drains = DrainList {
        drains: listing.drained,
    };
    Ok(json_response(StatusCode::OK, &drains))
}

/// `parallel` is the values of the `parallel` query parameter (the first counts; none: 1).
pub(crate) async fn drain<K: Kv>(
    c: &RegistryCluster<K>,
    machine: &str,
    method: Method,
    parallel: &[String],
) -> Result<Response, ApiError> {
    let machine: MachineId = machine
        .parse()
        .map_err(|_| ApiError::BadMachineId(machine.to_owned()))?;
    match method {
        Method::GET => Ok(json_response(
            StatusCode::OK,
            &c.drain_status(&machine).await?,
        )),
        Method::PUT => {
            let parallel = match parallel.first() {
                None => 1,
                Some(p) => p
                    .parse::<u32>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| ApiError::BadParallel(p.clone()))?,
            };
            let status = c.drain(&machine, parallel).await?;
            Ok(json_response(StatusCode::OK, &status))
        }
        Method::DELETE => {
            let was_drained = c.undrain(&machine).await?;
            Ok(json_response(StatusCode::OK, &Undrained { was_drained }))
        }
        _ => Err(ApiError::WrongMethod("GET, PUT and DELETE")),
    }
}

pub(crate) async fn explain<K: Kv>(
    c: &RegistryCluster<K>,
    unit: &str,
    method: Method,
) -> Result<Response, ApiError> {
    if method != Method::GET {
        return Err(ApiError::WrongMethod("GET"));
    }
    let Ok(name) = unit.parse::<UnitName>() else {
        return Err(ApiError::UnitNotFound);
    };
    Ok(json_response(StatusCode::OK, &c.explain(&name).await?))
}

/// The query parameter `PUT /drains/<machine>` reads.
pub(crate) const PARALLEL: &str = wire::PARALLEL;
