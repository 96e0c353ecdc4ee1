//! [`Cluster::create_many`] over the API: the units a `start`, `load` or `submit` found
//! missing go as `POST /units?view=full` (docs/api.md "Creates in one request"), up to
//! [`UNITS_PER_REQUEST`] units and about [`BYTES_PER_REQUEST`] bytes a request,
//! [`REQUESTS_IN_FLIGHT`] requests at once. fleetd writes each request's units many per etcd
//! transaction, as the etcd driver does, where one `PUT` per unit cost both sides a request
//! each (60.6 s for 100,000 units, docs/benchmarks.md "fleetctl at 100,000 units").
//!
//! A server without the extension (fleet's own fleetd, or an older one) answers 405: the
//! units then go one `PUT ?expect=absent` each ([`fleet_ops::create_each`]), as before.
//!
//! What a failure leaves, as over etcd: each unit has its own result from the server. A
//! request that fails as a whole (the connection, a refusal of the request) gives its first
//! unit the error and the others [`OpsError::NotWritten`], and no request starts after it,
//! nor after one in which the server failed to write a unit (a 5xx: etcd away); creating
//! the same units again writes only those still missing.

use fleet_api_wire::convert;
use fleet_api_wire::wire::{self, CreateResults, Reason, WriteResult};
use fleet_core::UnitName;
use fleet_ops::{Created, OpsError, PutRequest};
use futures::StreamExt;
use http::{Method, StatusCode};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use super::answer::{decode, error_of, error_of_entity};
use super::http::{HttpCluster, unit_body};

/// Most units in one `POST /units` (the server takes up to [`wire::MAX_CREATES`]).
pub const UNITS_PER_REQUEST: usize = 1_000;

/// A request's unit entities stop growing past this many bytes (a single bigger unit goes
/// alone; the server reads bodies of up to 4 MiB).
pub const BYTES_PER_REQUEST: usize = 1 << 20;

/// Requests of creates in flight at once: while fleetd writes one, the next is on its way.
pub const REQUESTS_IN_FLIGHT: usize = 4;

/// What the requests of one `create_many` learn as they go.
#[derive(Default)]
struct Progress {
    /// The server answered 405: it has no `POST /units`.
    unsupported: AtomicBool,
    /// A request failed as a whole, at this unit: no request starts after it.
    stopped: Mutex<Option<UnitName>>,
}

impl Progress {
    fn stopped(&self) -> Option<UnitName> {
        self.stopped.lock().expect("never poisoned").clone()
    }

    fn stop(&self, at: &UnitName) {
        self.stopped
            .lock()
            .expect("never poisoned")
            .get_or_insert_with(|| at.clone());
    }
}

/// One request's units, and each one's entity as JSON.
type Chunk = Vec<(PutRequest, Vec<u8>)>;

impl HttpCluster {
    pub(super) async fn create_batched(&self, reqs: Vec<PutRequest>) -> Created {
        let progress = Progress::default();
        let progress = &progress;
        futures::stream::iter(chunks(reqs))
            .map(|chunk| self.create_chunk(chunk, progress))
            .buffered(REQUESTS_IN_FLIGHT)
            .flat_map(futures::stream::iter)
            .collect()
            .await
    }

    async fn create_chunk(&self, chunk: Chunk, progress: &Progress) -> Created {
        if let Some(with) = progress.stopped() {
            return chunk
                .into_iter()
                .map(|(req, _)| {
                    let with = with.clone();
                    (req.name, Err(OpsError::NotWritten { with }))
                })
                .collect();
        }
        if progress.unsupported.load(Ordering::Relaxed) {
            return self.create_each(chunk).await;
        }
        let mut body =
            Vec::with_capacity(chunk.iter().map(|(_, b)| b.len() + 1).sum::<usize>() + 16);
        body.extend_from_slice(b"{\"units\":[");
        for (i, (_, unit)) in chunk.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(unit);
        }
        body.extend_from_slice(b"]}");
        let query = [(wire::VIEW, wire::VIEW_FULL.to_owned())];
        let answer = self.send(Method::POST, "/units", &query, Some(body)).await;
        let names: Vec<UnitName> = chunk.iter().map(|(req, _)| req.name.clone()).collect();
        let failure = match answer {
            Ok(a) if a.status == StatusCode::METHOD_NOT_ALLOWED => {
                progress.unsupported.store(true, Ordering::Relaxed);
                return self.create_each(chunk).await;
            }
            Ok(a) if a.status.is_success() => match decode::<CreateResults>(&a, None) {
                Ok(answered) => match results(names.clone(), answered) {
                    Ok((created, stopped_at)) => {
                        // A unit the server failed to write (etcd away: a 5xx, not a refusal
                        // of the unit) stops the requests after it, as a failed transaction
                        // stops the etcd side's.
                        if let Some(at) = &stopped_at {
                            progress.stop(at);
                        }
                        return created;
                    }
                    Err(e) => e,
                },
                Err(e) => e,
            },
            Ok(a) => error_of(a.status, &a.body, None),
            Err(e) => e,
        };
        progress.stop(&names[0]);
        failed(names, failure)
    }

    async fn create_each(&self, chunk: Chunk) -> Created {
        let reqs = chunk.into_iter().map(|(req, _)| req).collect();
        fleet_ops::create_each(self, reqs).await
    }
}

/// `reqs` in requests' worth, in order, each with its entity encoded. A name already in
/// the request starts the next one (the server refuses a request naming a unit twice; the
/// second create of it then answers as a second `PUT` would).
fn chunks(reqs: Vec<PutRequest>) -> Vec<Chunk> {
    let mut chunks: Vec<Chunk> = Vec::new();
    let mut bytes = 0;
    let mut named = std::collections::HashSet::new();
    for req in reqs {
        let unit = serde_json::to_vec(&unit_body(&req)).expect("a unit entity always encodes");
        let full = chunks.last().is_none_or(|c| {
            c.len() >= UNITS_PER_REQUEST
                || bytes + unit.len() > BYTES_PER_REQUEST
                || named.contains(&req.name)
        });
        if full {
            chunks.push(Vec::new());
            bytes = 0;
            named.clear();
        }
        bytes += unit.len() + 1;
        named.insert(req.name.clone());
        chunks.last_mut().expect("pushed above").push((req, unit));
    }
    chunks
}

/// Each unit's result as [`Cluster::put_if`](fleet_ops::Cluster::put_if) gives it, and the
/// unit the server failed to write (a 5xx), if one: no request should follow.
fn results(
    names: Vec<UnitName>,
    answered: CreateResults,
) -> Result<(Created, Option<UnitName>), OpsError> {
    if answered.results.len() != names.len() {
        return Err(OpsError::Transport {
            what: "the API answered an invalid value for a create of many units".into(),
            cause: format!(
                "{} results for {} units",
                answered.results.len(),
                names.len()
            )
            .into(),
        });
    }
    // The server's create stops at a failed transaction: the unit that failed says why,
    // the units it did not write after it say `notWritten` (docs/api.md).
    let stopped_at = names
        .iter()
        .zip(&answered.results)
        .find(|(_, r)| {
            r.error
                .as_ref()
                .is_some_and(|e| e.code >= 500 && e.reason != Some(Reason::NotWritten))
        })
        .map(|(name, _)| name.clone());
    let created = names
        .into_iter()
        .zip(answered.results)
        .map(|(name, result)| {
            let res = match (result.error, result.outcome) {
                (Some(error), _) if error.reason == Some(Reason::NotWritten) => {
                    let with = stopped_at.clone().unwrap_or_else(|| name.clone());
                    Err(OpsError::NotWritten { with })
                }
                (Some(error), _) => {
                    let status = StatusCode::from_u16(error.code)
                        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                    Err(error_of_entity(status, error, Some(&name)))
                }
                (None, Some(outcome)) => convert::put_from_wire(&WriteResult {
                    outcome,
                    unit: result.unit,
                    restart_generation: 0,
                    detail: String::new(),
                }),
                (None, None) => Err(OpsError::Transport {
                    what: format!("the API answered no result for {name}"),
                    cause: "neither an outcome nor an error".into(),
                }),
            };
            (name, res)
        })
        .collect();
    Ok((created, stopped_at))
}

/// A request that failed as a whole: its first unit has the error, the others were not
/// written because of it.
fn failed(names: Vec<UnitName>, error: OpsError) -> Created {
    let with = names[0].clone();
    let mut error = Some(error);
    names
        .into_iter()
        .map(|name| {
            let res = error
                .take()
                .unwrap_or_else(|| OpsError::NotWritten { with: with.clone() });
            (name, Err(res))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_core::{DesiredState, UnitFile};
    use fleet_ops::ReplaceHow;

    /// A unit whose file has `lines` environment lines of about 1,000 bytes.
    fn req(name: &str, lines: usize) -> PutRequest {
        let mut text = "[Service]\nExecStart=/bin/true\n".to_owned();
        for i in 0..lines {
            text.push_str(&format!("Environment=V{i:04}={}\n", "x".repeat(980)));
        }
        PutRequest {
            name: name.parse().unwrap(),
            file: Some(UnitFile::parse(text.as_bytes()).unwrap()),
            desired: Some(DesiredState::Launched),
            how: ReplaceHow::default(),
        }
    }

    /// Each request's unit names.
    fn names_of(chunks: Vec<Chunk>) -> Vec<Vec<String>> {
        chunks
            .iter()
            .map(|c| c.iter().map(|(r, _)| r.name.to_string()).collect())
            .collect()
    }

    #[test]
    fn requests_hold_at_most_their_units_and_bytes_in_order() {
        let reqs: Vec<PutRequest> = (0..2_500)
            .map(|i| req(&format!("a@{i}.service"), 0))
            .collect();
        let sizes: Vec<usize> = chunks(reqs).iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![1_000, 1_000, 500]);

        // A little over a third of a request's bytes each (JSON adds to every line).
        let big = BYTES_PER_REQUEST / 3 / 1_000 - 10;
        let reqs = vec![
            req("a.service", big),
            req("b.service", big),
            req("c.service", big),
            req("d.service", 0),
        ];
        let chunked = names_of(chunks(reqs));
        assert_eq!(
            chunked,
            vec![
                vec!["a.service", "b.service"],
                vec!["c.service", "d.service"]
            ]
        );
    }

    #[test]
    fn a_name_given_again_starts_the_next_request() {
        let reqs = ["a.service", "b.service", "a.service", "c.service"]
            .map(|n| req(n, 0))
            .to_vec();
        let chunked = names_of(chunks(reqs));
        assert_eq!(
            chunked,
            vec![
                vec!["a.service", "b.service"],
                vec!["a.service", "c.service"]
            ]
        );
    }

    #[test]
    fn a_failed_request_names_its_first_unit_for_the_others() {
        let names: Vec<UnitName> = ["a.service", "b.service"]
            .iter()
            .map(|n| n.parse().unwrap())
            .collect();
        let out = failed(names, OpsError::Conflict("a.service".parse().unwrap()));
        assert!(matches!(out[0].1, Err(OpsError::Conflict(_))));
        assert!(
            matches!(&out[1].1, Err(OpsError::NotWritten { with }) if with.as_str() == "a.service")
        );
    }

    #[test]
    fn a_server_failure_names_the_unit_the_units_not_written_after_it_name() {
        let names: Vec<UnitName> = ["a.service", "b.service", "c.service", "d.service"]
            .iter()
            .map(|n| n.parse().unwrap())
            .collect();
        let error = |code, reason| wire::CreateResult {
            error: Some(wire::ErrorEntity {
                code,
                message: "m".into(),
                reason,
                detail: String::new(),
            }),
            ..wire::CreateResult::default()
        };
        let answered = CreateResults {
            results: vec![
                error(409, Some(Reason::Conflict)),
                error(500, Some(Reason::Registry)),
                error(503, Some(Reason::NotWritten)),
                error(503, Some(Reason::NotWritten)),
            ],
        };
        let (created, stopped_at) = results(names.clone(), answered).unwrap();
        assert_eq!(
            stopped_at,
            Some(names[1].clone()),
            "a refusal (409) stops nothing"
        );
        assert!(matches!(created[0].1, Err(OpsError::Conflict(_))));
        assert!(matches!(created[1].1, Err(OpsError::Api { code: 500, .. })));
        for (_, res) in &created[2..] {
            assert!(
                matches!(res, Err(OpsError::NotWritten { with }) if with == &names[1]),
                "{res:?}"
            );
        }
    }

    #[test]
    fn results_must_answer_every_unit() {
        let names = vec!["a.service".parse().unwrap()];
        let e = results(names, CreateResults::default()).unwrap_err();
        assert!(e.to_string().contains("0 results for 1 units"), "{e}");
    }
}
