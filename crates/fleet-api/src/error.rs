//! Every way a request fails, each with its status code and fleet's message where fleet had
//! one. The response is always fleet's error entity with a JSON content type.

use axum::response::{IntoResponse, Response};
use fleet_api_wire::convert::reason_of;
use fleet_core::{MachineId, NameError, ParseError, RequirementError, StateError, UnitName};
use fleet_ops::OpsError;
use fleet_registry::RegistryError;
use fleet_registry::kv::KvError;
use http::{HeaderValue, StatusCode, header};

use crate::entity::{ErrorBody, ErrorEntity};
use crate::inspect::InspectError;
use crate::page::PageError;

/// fleet's message while etcd cannot be reached; fleetctl shows it to users.
pub const ETCD_UNREACHABLE: &str = "fleet server unable to communicate with etcd";

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("not found")]
    NoSuchPath,
    /// `/` and the API's root: there is nothing to do there.
    #[error("method not allowed")]
    NoMethodsHere,
    /// A resource that takes other methods; the message lists them, as fleet's does.
    #[error("only {0} supported against this resource")]
    WrongMethod(&'static str),
    /// fleet answers 400, not 405, to a wrong method on the discovery document.
    #[error("only HTTP GET supported against this resource")]
    DiscoveryNotGet,
    #[error("unit does not exist")]
    UnitNotFound,
    #[error("unit state does not exist")]
    StateNotFound,
    #[error("expected 1 Content-Type, got {0}")]
    ContentTypeCount(usize),
    #[error("only acceptable Content-Type is application/json")]
    NotJson,
    #[error("unable to read body: {0}")]
    ReadBody(#[source] axum::Error),
    #[error("the request body is larger than {0} bytes")]
    BodyTooLarge(usize),
    #[error("the request body did not arrive within {0:?}")]
    BodyTimeout(std::time::Duration),
    #[error("unsupported expectation {}", fleet_core::quote::quote(.0))]
    Expectation(String),
    #[error("unable to decode body: {0}")]
    DecodeBody(#[source] serde_json::Error),
    /// Issue 38: JSON arrays where fleet's entities are objects.
    #[error("unable to decode body: {0}")]
    BodyShape(&'static str),
    #[error("name in URL {url:?} differs from unit name in request body {body:?}")]
    NameMismatch { url: String, body: String },
    #[error(transparent)]
    BadName(#[from] NameError),
    #[error(transparent)]
    BadState(#[from] StateError),
    #[error("invalid unit options: {0}")]
    BadOptions(#[source] ParseError),
    /// An option no unit file can hold as given (a newline in a value, an empty name...).
    #[error("invalid unit options: option {0:?} cannot be written in a unit file")]
    OptionNotRepresentable(String),
    #[error("invalid unit options: they do not read back the same from a unit file")]
    OptionsChangeWhenWritten,
    #[error(transparent)]
    BadRequirements(#[from] RequirementError),
    #[error("must provide DesiredState to update existing unit")]
    NoDesiredState,
    /// An extension's `op` that is not one ([`fleet_api_wire::wire::Op`]).
    #[error("unknown op {0:?}")]
    UnknownOp(String),
    #[error("op {0} takes no options")]
    OpWithOptions(&'static str),
    #[error("op raise needs a desiredState")]
    RaiseWithoutState,
    #[error("invalid machineID {0:?}")]
    BadMachineId(String),
    #[error("pageSize must be 1 to 65535, got {0:?}")]
    BadPageSize(String),
    #[error("pageSize 0 (the whole listing) takes no nextPageToken")]
    WholeWithToken,
    #[error("parallel must be a whole number from 1, got {0:?}")]
    BadParallel(String),
    /// A journal asked of a unit that is not a service: a slice's or a target's journal
    /// would be every unit's under it (issue 37).
    #[error("the journal is served for .service units only, not {0}")]
    JournalOfNonService(UnitName),
    #[error("within must be a whole number of milliseconds from 1 to 3600000, got {0:?}")]
    BadWithin(String),
    #[error("expect must be absent or a unit file hash, got {0:?}")]
    BadExpect(String),
    /// A `POST /units` of more units than [`fleet_api_wire::wire::MAX_CREATES`].
    #[error("a request creates at most {max} units, got {got}")]
    TooManyCreates { got: usize, max: usize },
    /// A `POST /units` naming a unit twice, or a unit with no name.
    #[error("unit {0:?} is named twice in the request")]
    CreatedTwice(String),
    #[error("every unit of the request needs a name")]
    CreateWithoutName,
    #[error("invalid op: expect add, remove, or replace")]
    PatchOp,
    #[error("machine metadata path invalid")]
    PatchPath,
    #[error("invalid value: add and replace require a value")]
    PatchNoValue,
    #[error("invalid value: metadata values are one line of printable text")]
    PatchBadValue,
    #[error("lines must be a whole number from 0 to {max}, got {0:?}", max = crate::inspect::MAX_LINES)]
    BadLines(String),
    #[error("follow must be true or false, got {0:?}")]
    BadFollow(String),
    #[error("since must be a number and a unit (s, m, h, d), got {0:?}")]
    BadSince(String),
    #[error("output must be one of {modes}, got {0:?}", modes = fleet_api_wire::wire::JOURNAL_OUTPUTS.join(", "))]
    BadOutput(String),
    /// The unit is fleet's but placed nowhere: no machine has its status or journal.
    #[error("unit {0} is not scheduled anywhere")]
    NotScheduled(UnitName),
    /// Only the fleetd of the unit's own machine answers for it.
    #[error("unit {unit} is scheduled on {machines}, not on this one ({here})")]
    ScheduledElsewhere {
        unit: UnitName,
        /// `machine A` or `machines A, B`.
        machines: String,
        here: MachineId,
    },
    /// Scheduled here, but the agent refuses it (`deny_units`): systemd's unit of that name
    /// is the host's.
    #[error("unit {0} matches deny_units here: fleetd does not manage it on this machine")]
    Refused(UnitName),
    /// This API was built without an inspector (only fleetd's has one).
    #[error("unit status and journals are not served here")]
    NotInspecting,
    #[error("already streaming {0} journals; try again later")]
    TooManyJournals(usize),
    #[error("already answering {0} status requests; try again later")]
    TooManyStatuses(usize),
    /// The dashboard's change streams are all taken (`routes/ui.rs`).
    #[error("already serving {0} dashboard change streams; try again later")]
    TooManyStreams(usize),
    /// `GET /changes`' streams are all taken (`routes/changes.rs`).
    #[error("already serving {0} change streams; try again later")]
    TooManyChangeStreams(usize),
    /// A browser's state-changing request without the dashboard's header (`routes/ui.rs`):
    /// another site's page may have sent it with this browser's certificate.
    #[error(
        "a browser's request that changes anything must carry the X-Fleet-CSRF header the \
         dashboard sets; refused as possibly sent by another site"
    )]
    CrossSite,
    /// A dashboard query parameter that is no number.
    #[error("{0} must be a whole number")]
    BadUiNumber(&'static str),
    #[error("inspecting the unit failed: {0}")]
    Inspect(#[from] InspectError),
    #[error(transparent)]
    Page(#[from] PageError),
    /// A `POST /import` whose plan the server does not take as it is: nothing was written.
    #[error("invalid import: {0}")]
    BadImport(#[from] fleet_api_wire::import::PlanError),
    /// The client's role does not permit the request (authz.rs).
    #[error("role {role} may not {action}")]
    Forbidden {
        role: crate::authz::Role,
        action: crate::authz::Action,
    },
    /// A client certificate of the CA that no role entry names (its subject).
    #[error("certificate {0} has no role in fleetd's configuration")]
    NoRole(String),
    /// What fleet-ops refused or failed to do.
    #[error(transparent)]
    Ops(#[from] OpsError),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::NoSuchPath
            | Self::UnitNotFound
            | Self::StateNotFound
            | Self::NotScheduled(_)
            | Self::ScheduledElsewhere { .. }
            | Self::Refused(_)
            | Self::NotInspecting => StatusCode::NOT_FOUND,
            Self::TooManyJournals(_)
            | Self::TooManyStatuses(_)
            | Self::TooManyStreams(_)
            | Self::TooManyChangeStreams(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Inspect(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::NoMethodsHere | Self::WrongMethod(_) => StatusCode::METHOD_NOT_ALLOWED,
            Self::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::BodyTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Expectation(_) => StatusCode::EXPECTATION_FAILED,
            Self::ContentTypeCount(_) | Self::NotJson => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::DiscoveryNotGet
            | Self::ReadBody(_)
            | Self::DecodeBody(_)
            | Self::BodyShape(_)
            | Self::NameMismatch { .. }
            | Self::BadName(_)
            | Self::BadState(_)
            | Self::BadOptions(_)
            | Self::OptionNotRepresentable(_)
            | Self::OptionsChangeWhenWritten
            | Self::BadRequirements(_)
            | Self::UnknownOp(_)
            | Self::OpWithOptions(_)
            | Self::RaiseWithoutState
            | Self::BadMachineId(_)
            | Self::BadPageSize(_)
            | Self::BadUiNumber(_)
            | Self::WholeWithToken
            | Self::BadParallel(_)
            | Self::BadExpect(_)
            | Self::BadWithin(_)
            | Self::JournalOfNonService(_)
            | Self::TooManyCreates { .. }
            | Self::CreatedTwice(_)
            | Self::CreateWithoutName
            | Self::PatchOp
            | Self::PatchPath
            | Self::PatchNoValue
            | Self::PatchBadValue
            | Self::BadLines(_)
            | Self::BadFollow(_)
            | Self::BadSince(_)
            | Self::BadOutput(_)
            | Self::BadImport(_)
            | Self::Page(_) => StatusCode::BAD_REQUEST,
            Self::NoDesiredState => StatusCode::CONFLICT,
            Self::Forbidden { .. } | Self::NoRole(_) | Self::CrossSite => StatusCode::FORBIDDEN,
            Self::Ops(e) => ops_status(e),
        }
    }

    fn message(&self) -> String {
        match self {
            Self::Ops(e) => ops_message(e),
            other => other.to_string(),
        }
    }

    /// fleet's error entity; in the full view (`?view=full`) with the operation's reason and
    /// fleetctl's message beside fleet's.
    pub fn response(self, full: bool) -> Response {
        let status = self.status();
        let body = ErrorBody {
            error: self.entity(full),
        };
        json_response(status, &body)
    }

    /// The error entity of [`ApiError::response`] (also one unit's result of a
    /// `POST /units`).
    pub fn entity(&self, full: bool) -> ErrorEntity {
        let (reason, detail) = match self {
            Self::Ops(e) if full => (reason_of(e), e.to_string()),
            _ => (None, String::new()),
        };
        ErrorEntity {
            code: self.status().as_u16(),
            message: self.message(),
            reason,
            detail,
        }
    }
}

fn ops_status(e: &OpsError) -> StatusCode {
    match e {
        OpsError::NoSuchUnit(_) => StatusCode::NOT_FOUND,
        OpsError::ActivateTemplate(_) | OpsError::Invalid { .. } => StatusCode::BAD_REQUEST,
        OpsError::Conflict(_)
        | OpsError::StopInactive(_)
        | OpsError::RestartInactive(_)
        | OpsError::NoOptions(_)
        | OpsError::ReplaceLowers { .. } => StatusCode::CONFLICT,
        OpsError::Registry(e) if e.is_transient() => StatusCode::SERVICE_UNAVAILABLE,
        OpsError::NotWritten { .. } => StatusCode::SERVICE_UNAVAILABLE,
        OpsError::Registry(RegistryError::Kv {
            cause: KvError::PermissionDenied { .. },
            ..
        }) => StatusCode::FORBIDDEN,
        OpsError::Registry(RegistryError::Conflict(_)) => StatusCode::CONFLICT,
        OpsError::Registry(
            RegistryError::TooManyChanges { .. } | RegistryError::ValueTooLarge { .. },
        ) => StatusCode::BAD_REQUEST,
        OpsError::Registry(_) | OpsError::Transport { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        OpsError::Api { code, .. } => {
            StatusCode::from_u16(*code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
        }
    }
}

/// fleet's messages where fleet had one; the API's own wording where it had one before
/// fleet-ops (clients may match it); else fleetctl's.
fn ops_message(e: &OpsError) -> String {
    match e {
        OpsError::NoSuchUnit(_) => "unit does not exist".to_owned(),
        OpsError::ActivateTemplate(name) => format!("cannot activate template {:?}", name.as_str()),
        OpsError::NoOptions(_) => "unit does not exist and options field empty".to_owned(),
        OpsError::ReplaceLowers {
            name,
            existing,
            asked,
        } => format!(
            "can not replace Unit({name}) in state '{existing}' with desiredState '{asked}'"
        ),
        OpsError::Conflict(name) => RegistryError::Conflict(name.clone()).to_string(),
        // fleet's wording, which fleetctl prints; the etcd error goes to the log.
        OpsError::Registry(e) if e.is_transient() => ETCD_UNREACHABLE.to_owned(),
        // Not the client's role: etcd's RBAC refused fleetd's own user (docs/security.md).
        OpsError::Registry(RegistryError::Kv {
            cause: KvError::PermissionDenied { user, what },
            ..
        }) => format!("fleetd's etcd user '{user}' may not {what} (refused by etcd's RBAC)"),
        other => other.to_string(),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.response(false)
    }
}

/// `value` as a JSON body with `status`.
pub fn json_response<T: serde::Serialize>(status: StatusCode, value: &T) -> Response {
    let body = serde_json::to_vec(value).expect("API entities always serialize");
    let mut resp = (status, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}
