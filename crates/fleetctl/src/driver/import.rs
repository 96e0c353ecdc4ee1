//! `import-fleet` over the API: the plan goes to fleetd as `POST /import` (docs/api.md
//! "Import from fleet v1"), which checks it and writes it as the etcd driver does. A plan of
//! many units goes in several requests, each under [`BYTES_PER_REQUEST`] of JSON (a single
//! bigger unit alone) and [`MAX_UNITS`] units, the marks with the first: the server writes a
//! request's marks before its units, so every mark is written before any unit.
//!
//! No decision is made here: the client planned, the server checks and writes.

use fleet_api_wire::import::{
    BYTES_PER_REQUEST, ImportRequest, ImportResults, MAX_UNITS, PATH, UnitImport, unit_to_wire,
};
use fleet_ops::OpsError;
use fleet_registry::ImportPlan;
use http::{Method, StatusCode};

use super::answer::decode;
use super::http::HttpCluster;

impl HttpCluster {
    /// Sends `plan`; for each of its units, in order, whether fleetd wrote it (`false`: ours
    /// changed since the plan was made). An error stops it: the requests before it are
    /// written, the rest are not sent.
    pub async fn import(&self, plan: &ImportPlan) -> Result<Vec<bool>, OpsError> {
        let units: Vec<UnitImport> = plan.units.iter().map(unit_to_wire).collect();
        let mut written = Vec::with_capacity(units.len());
        for (i, chunk) in requests(units).into_iter().enumerate() {
            let request = ImportRequest {
                marks: if i == 0 {
                    plan.marks.clone()
                } else {
                    Vec::new()
                },
                units: chunk,
            };
            let asked = request.units.len();
            let body = serde_json::to_vec(&request).map_err(|e| OpsError::Transport {
                what: "encoding the import plan".to_owned(),
                cause: Box::new(e),
            })?;
            let answer = self.send(Method::POST, PATH, &[], Some(body)).await?;
            if matches!(
                answer.status,
                StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED
            ) {
                return Err(OpsError::Api {
                    code: answer.status.as_u16(),
                    message: "this fleetd takes no import (POST /fleet/v1/import): it is fleet's \
                              own, or older than the import; use --driver=etcd"
                        .to_owned(),
                });
            }
            let results: ImportResults = decode(&answer, None)?;
            if results.results.len() != asked {
                return Err(OpsError::Api {
                    code: answer.status.as_u16(),
                    message: format!(
                        "fleetd answered {} results to an import of {asked} units",
                        results.results.len()
                    ),
                });
            }
            written.extend(results.results.iter().map(|r| r.written));
        }
        Ok(written)
    }
}

/// `units` cut into requests of at most [`MAX_UNITS`] units and about [`BYTES_PER_REQUEST`]
/// bytes of JSON each (a unit bigger than that alone), in order.
fn requests(units: Vec<UnitImport>) -> Vec<Vec<UnitImport>> {
    let mut out: Vec<Vec<UnitImport>> = Vec::new();
    let mut bytes = 0;
    for unit in units {
        let size = serde_json::to_vec(&unit).map_or(0, |v| v.len()) + 1;
        match out.last_mut() {
            Some(last) if last.len() < MAX_UNITS && bytes + size <= BYTES_PER_REQUEST => {
                bytes += size;
                last.push(unit);
            }
            _ => {
                bytes = size;
                out.push(vec![unit]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(name: &str, file_bytes: usize) -> UnitImport {
        UnitImport {
            name: name.to_owned(),
            file: "x".repeat(file_bytes),
            ..UnitImport::default()
        }
    }

    #[test]
    fn a_plan_is_cut_by_bytes_and_count_in_order_and_a_big_unit_goes_alone() {
        let units: Vec<UnitImport> = (0..5)
            .map(|i| unit(&format!("u{i}.service"), BYTES_PER_REQUEST / 3))
            .chain([unit("big.service", BYTES_PER_REQUEST * 2)])
            .chain([unit("last.service", 10)])
            .collect();
        let sizes: Vec<usize> = requests(units.clone()).iter().map(Vec::len).collect();
        assert_eq!(sizes, [2, 2, 1, 1, 1]);
        let flat: Vec<UnitImport> = requests(units.clone()).into_iter().flatten().collect();
        assert_eq!(flat, units);
        let many: Vec<UnitImport> = (0..MAX_UNITS + 1)
            .map(|i| unit(&format!("u{i}.service"), 1))
            .collect();
        let sizes: Vec<usize> = requests(many).iter().map(Vec::len).collect();
        assert_eq!(sizes, [MAX_UNITS, 1]);
        assert!(requests(Vec::new()).is_empty());
    }
}
