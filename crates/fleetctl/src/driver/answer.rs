//! Reading the API's answers: a success's body as its entity, a failure as the [`OpsError`]
//! it stands for, so a command prints what it prints over etcd.

use fleet_api_wire::convert;
use fleet_api_wire::wire::{ErrorBody, ErrorEntity, MachinePage, UnitPage, UnitStatePage};
use fleet_core::UnitName;
use fleet_ops::OpsError;
use http::StatusCode;
use serde::de::DeserializeOwned;

use super::transport::Answer;

/// A success's body as `T`, or the error the answer stands for.
pub(super) fn decode<T: DeserializeOwned>(
    answer: &Answer,
    unit: Option<&UnitName>,
) -> Result<T, OpsError> {
    check(answer, unit)?;
    serde_json::from_slice(&answer.body).map_err(|e| OpsError::Transport {
        what: format!(
            "the API answered {} with a body that is not fleet's entity",
            answer.status
        ),
        cause: Box::new(e),
    })
}

/// Ok for a success; else the error its status and error entity stand for.
pub(super) fn check(answer: &Answer, unit: Option<&UnitName>) -> Result<(), OpsError> {
    if answer.status.is_success() {
        return Ok(());
    }
    Err(error_of(answer.status, &answer.body, unit))
}

/// The error of a failed request about `unit` (the unit its URL names, if any). The full
/// view's `reason` rebuilds the variant. Without one (fleet's own answers, and the server's
/// checks of an entity before any operation runs), a 404 about a unit is
/// [`OpsError::NoSuchUnit`] and a 400 about one is [`OpsError::Invalid`] with fleet's
/// message: the client sends only valid names and states, so what a 400 refuses is the
/// unit's options. Anything else keeps its status and message.
pub fn error_of(status: StatusCode, body: &[u8], unit: Option<&UnitName>) -> OpsError {
    let Ok(ErrorBody { error }) = serde_json::from_slice::<ErrorBody>(body) else {
        return OpsError::Api {
            code: status.as_u16(),
            message: format!("the API answered {status} without an error entity"),
        };
    };
    error_of_entity(status, error, unit)
}

/// [`error_of`] for an error entity already read (one unit's result of a `POST /units`,
/// with its `code` as the status).
pub(super) fn error_of_entity(
    status: StatusCode,
    error: ErrorEntity,
    unit: Option<&UnitName>,
) -> OpsError {
    match (error.reason, status, unit) {
        (None, StatusCode::NOT_FOUND, Some(name)) => OpsError::NoSuchUnit(name.clone()),
        (None, StatusCode::BAD_REQUEST, Some(name)) => OpsError::Invalid {
            name: name.clone(),
            reason: error.message,
        },
        _ => convert::error_from_wire(unit, &error),
    }
}

/// A listing page's continuation.
pub(super) trait Paged {
    fn next_token(&self) -> &str;
}

impl Paged for UnitPage {
    fn next_token(&self) -> &str {
        &self.next_page_token
    }
}

impl Paged for UnitStatePage {
    fn next_token(&self) -> &str {
        &self.next_page_token
    }
}

impl Paged for MachinePage {
    fn next_token(&self) -> &str {
        &self.next_page_token
    }
}

#[cfg(test)]
mod tests;
