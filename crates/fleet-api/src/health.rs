//! `GET /fleet/v1/health?within=<ms>` (issue 36): whether this machine reached etcd in the
//! last `within` milliseconds. A fleetd that cannot reach etcd asks its peers this
//! (`fleet_agent::witness`): if one did, it is the one cut off, and it fences itself.
//!
//! The answer is `{"machineID": "...", "etcdReached": true|false}`. Any client the API
//! lets in may ask, with or without a role: a peer presents its own API certificate, which
//! no role table names. It reads nothing of the registry's contents: the [`Reach`] behind it
//! answers from this machine's last lease renewal, or with one bounded probe of etcd.

use axum::response::Response;
use http::{Method, StatusCode};
use serde::Serialize;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{ApiError, json_response};

/// The query parameter: milliseconds, from 1 to [`MAX_WITHIN`].
pub const WITHIN: &str = "within";

/// The longest `within` asked: an hour (a peer asks about seconds).
pub const MAX_WITHIN: Duration = Duration::from_secs(3600);

/// This machine's contact with etcd, as its peers may ask about it.
pub trait Reach: Send + Sync + std::fmt::Debug {
    /// Whether this machine reached etcd (renewed its lease) within `within` before now.
    /// Answers in bounded time.
    fn reached_within(&self, within: Duration) -> Pin<Box<dyn Future<Output = bool> + Send + '_>>;
}

/// What the route serves from.
#[derive(Debug, Clone)]
pub struct Health {
    pub machine: String,
    pub reach: Arc<dyn Reach>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Answer<'a> {
    #[serde(rename = "machineID")]
    machine_id: &'a str,
    etcd_reached: bool,
}

/// The `within` of a query: whole milliseconds, from 1 to [`MAX_WITHIN`].
pub fn within(values: &[String]) -> Result<Duration, ApiError> {
    let [value] = values else {
        return Err(ApiError::BadWithin(values.join(",")));
    };
    match value.parse::<u64>() {
        Ok(ms) if ms > 0 && u128::from(ms) <= MAX_WITHIN.as_millis() => {
            Ok(Duration::from_millis(ms))
        }
        _ => Err(ApiError::BadWithin(value.clone())),
    }
}

pub(crate) async fn handle(
    health: Option<&Health>,
    method: Method,
    within_values: &[String],
) -> Result<Response, ApiError> {
    let health = health.ok_or(ApiError::NoSuchPath)?;
    if method != Method::GET {
        return Err(ApiError::WrongMethod("GET"));
    }
    let within = within(within_values)?;
    let reached = health.reach.reached_within(within).await;
    Ok(json_response(
        StatusCode::OK,
        &Answer {
            machine_id: &health.machine,
            etcd_reached: reached,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn within_takes_one_whole_number_of_milliseconds_up_to_an_hour() {
        let v = |s: &[&str]| within(&s.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(v(&["1500"]).unwrap(), Duration::from_millis(1500));
        assert_eq!(v(&["3600000"]).unwrap(), MAX_WITHIN);
        for bad in [
            &[][..],
            &["0"],
            &["-1"],
            &["1.5"],
            &["3600001"],
            &["1", "2"],
            &["x"],
        ] {
            assert!(v(bad).is_err(), "{bad:?}");
        }
    }
}
