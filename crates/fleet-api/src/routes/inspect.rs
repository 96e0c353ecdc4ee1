//! `GET /units/<name>/status` and `GET /units/<name>/journal` (docs/api.md "Status and
//! journal"): answered only for fleet's units, and only by the fleetd of a machine the unit is
//! scheduled on. The order of checks is the promise: the query first (400), then the registry
//! (503 while etcd is away, 404 for no such unit or one scheduled elsewhere), and only then
//! does the [`Inspector`] run anything.

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use fleet_api_wire::wire::{self, UnitStatus};
use fleet_core::{MachineId, UnitName};
use fleet_ops::{Cluster, OpsError};
use fleet_registry::kv::Kv;
use futures::StreamExt;
use http::{HeaderValue, Method, StatusCode, header};
use std::sync::Arc;
use tokio::sync::Semaphore;

use super::{Api, Query, first};
use crate::error::{ApiError, json_response};
use crate::inspect::{
    DEFAULT_LINES, DEFAULT_OUTPUT, Inspector, JournalRequest, MAX_JOURNALS, MAX_LINES, MAX_STATUSES,
};

/// What a fleetd inspects its own units with.
#[derive(Debug)]
pub(crate) struct Inspection {
    pub(crate) machine: MachineId,
    pub(crate) inspector: Arc<dyn Inspector>,
    /// One permit per journal being streamed.
    pub(crate) journals: Arc<Semaphore>,
    /// One permit per status being answered.
    pub(crate) statuses: Arc<Semaphore>,
    /// Globs of units this machine's agent refuses to manage (`deny_units`).
    pub(crate) deny_units: Vec<String>,
}

impl Inspection {
    pub(crate) fn new(machine: MachineId, inspector: Arc<dyn Inspector>) -> Inspection {
        Inspection {
            machine,
            inspector,
            journals: Arc::new(Semaphore::new(MAX_JOURNALS)),
            statuses: Arc::new(Semaphore::new(MAX_STATUSES)),
            deny_units: Vec::new(),
        }
    }
}

/// Which of a unit's two inspection resources a path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Aspect {
    Status,
    Journal,
}

/// `/units/<name>/status` or `/units/<name>/journal` (after the prefix).
pub(crate) fn parse(rest: &str) -> Option<(&str, Aspect)> {
    let item = rest.strip_prefix("/units/")?;
    let (name, aspect) = if let Some(name) = item.strip_suffix(wire::STATUS_SUFFIX) {
        (name, Aspect::Status)
    } else {
        (item.strip_suffix(wire::JOURNAL_SUFFIX)?, Aspect::Journal)
    };
    (!name.is_empty() && !name.contains('/')).then_some((name, aspect))
}

pub(crate) async fn handle<K: Kv>(
    api: &Api<K>,
    name: &str,
    aspect: Aspect,
    method: Method,
    query: &Query,
) -> Result<Response, ApiError> {
    if method != Method::GET {
        return Err(ApiError::WrongMethod("GET"));
    }
    let lines = lines(query)?;
    let journal = match aspect {
        Aspect::Status => None,
        Aspect::Journal => Some(JournalRequest {
            lines,
            follow: follow(query)?,
            output: output(query)?,
        }),
    };
    let inspection = api.inspection.as_ref().ok_or(ApiError::NotInspecting)?;
    // A name that cannot name a unit names none.
    let name: UnitName = name.parse().map_err(|_| ApiError::UnitNotFound)?;
    // Only a service's own lines: systemctl and journalctl match a slice's (or a scope's)
    // journal by every unit under it, so `system.slice` would read every service's.
    let service = name.unit_type() == fleet_core::UnitType::Service;
    if journal.is_some() && !service {
        return Err(ApiError::JournalOfNonService(name));
    }
    let lines = if service { lines } else { 0 };
    scheduled_here(api, &inspection.machine, &name).await?;
    if inspection
        .deny_units
        .iter()
        .any(|g| fleet_core::glob_match(g, name.as_str()))
    {
        return Err(ApiError::Refused(name));
    }
    match journal {
        None => {
            let _permit = inspection
                .statuses
                .try_acquire()
                .map_err(|_| ApiError::TooManyStatuses(MAX_STATUSES))?;
            let report = inspection.inspector.status(&name, lines).await?;
            let status = UnitStatus {
                machine_id: inspection.machine.to_string(),
                name: name.to_string(),
                text: report.text,
                properties: report.properties,
            };
            Ok(json_response(StatusCode::OK, &status))
        }
        Some(request) => journal_response(inspection, &name, request).await,
    }
}

/// The unit must be fleet's and scheduled on `here` (a global unit: `here` is one of the
/// machines it applies to), as `here`'s own schedule says: one key its machine role may read,
/// so that an agent-only host serves its own units' status and journal (issue 37). Only a
/// unit not scheduled here is looked up in the rest of the registry, to say where it runs;
/// a host that may not read that says only that it is not here.
async fn scheduled_here<K: Kv>(
    api: &Api<K>,
    here: &MachineId,
    name: &UnitName,
) -> Result<(), ApiError> {
    if api
        .cluster
        .registry()
        .scheduled_on(here, name)
        .await
        .map_err(OpsError::from)?
    {
        return Ok(());
    }
    let unit = match api.cluster.unit(name).await {
        Ok(unit) => unit,
        Err(OpsError::Registry(fleet_registry::RegistryError::Kv {
            cause: fleet_registry::kv::KvError::PermissionDenied { .. },
            ..
        })) => return Err(ApiError::NotScheduled(name.clone())),
        Err(e) => return Err(e.into()),
    };
    let Some(unit) = unit else {
        return Err(OpsError::NoSuchUnit(name.clone()).into());
    };
    let machines = &unit.status.machines;
    if machines.contains(here) {
        return Ok(());
    }
    if machines.is_empty() {
        return Err(ApiError::NotScheduled(name.clone()));
    }
    Err(ApiError::ScheduledElsewhere {
        unit: name.clone(),
        machines: machine_list(machines),
        here: here.clone(),
    })
}

/// `machine A`, `machines A, B, C`, or `machines A, B, C and N more`.
fn machine_list(machines: &[MachineId]) -> String {
    const SHOWN: usize = 3;
    let mut text = if machines.len() == 1 {
        "machine ".to_owned()
    } else {
        "machines ".to_owned()
    };
    let shown: Vec<&str> = machines.iter().take(SHOWN).map(|m| m.as_str()).collect();
    text.push_str(&shown.join(", "));
    if machines.len() > SHOWN {
        text.push_str(&format!(" and {} more", machines.len() - SHOWN));
    }
    text
}

async fn journal_response(
    inspection: &Inspection,
    name: &UnitName,
    request: JournalRequest,
) -> Result<Response, ApiError> {
    let permit = inspection
        .journals
        .clone()
        .try_acquire_owned()
        .map_err(|_| ApiError::TooManyJournals(MAX_JOURNALS))?;
    let stream = inspection.inspector.journal(name, request).await?;
    // The permit lives as long as the body: a client that goes away drops both.
    let body = stream.map(move |chunk| {
        let _held = &permit;
        chunk
    });
    let mut resp = (StatusCode::OK, Body::from_stream(body)).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    Ok(resp)
}

fn lines(query: &Query) -> Result<u32, ApiError> {
    match first(&query.raw, wire::LINES) {
        None => Ok(DEFAULT_LINES),
        // Digits only: journalctl reads `+N` and `-N` as other requests.
        Some(v) => v
            .bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| v.parse::<u32>().ok())
            .flatten()
            .filter(|n| *n <= MAX_LINES)
            .ok_or(ApiError::BadLines(v)),
    }
}

pub(super) fn follow(query: &Query) -> Result<bool, ApiError> {
    match first(&query.raw, wire::FOLLOW).as_deref() {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(ApiError::BadFollow(other.to_owned())),
    }
}

fn output(query: &Query) -> Result<&'static str, ApiError> {
    match first(&query.raw, wire::OUTPUT) {
        None => Ok(DEFAULT_OUTPUT),
        Some(v) => wire::JOURNAL_OUTPUTS
            .iter()
            .find(|o| **o == v)
            .copied()
            .ok_or(ApiError::BadOutput(v)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_a_units_status_and_journal() {
        assert_eq!(
            parse("/units/a@1.service/status"),
            Some(("a@1.service", Aspect::Status))
        );
        assert_eq!(
            parse("/units/a.service/journal"),
            Some(("a.service", Aspect::Journal))
        );
        assert_eq!(parse("/units//status"), None);
        assert_eq!(parse("/units/a/b.service/status"), None);
        assert_eq!(parse("/units/a.service/logs"), None);
        assert_eq!(parse("/state/a.service/status"), None);
    }

    #[test]
    fn lists_a_few_machines_then_counts_the_rest() {
        let ids = |n: usize| -> Vec<MachineId> {
            (0..n).map(|i| format!("m{i}").parse().unwrap()).collect()
        };
        assert_eq!(machine_list(&ids(1)), "machine m0");
        assert_eq!(machine_list(&ids(3)), "machines m0, m1, m2");
        assert_eq!(machine_list(&ids(5)), "machines m0, m1, m2 and 2 more");
    }
}
