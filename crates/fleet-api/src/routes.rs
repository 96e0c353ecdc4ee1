//! The router: fleet's paths under `/fleet/v1` and its legacy alias `/v1-alpha`, matched by
//! hand because fleet's answers depend on more than the route (a trailing `/` is a 404, each
//! resource names its own methods in a 405, the discovery document answers 400).
//!
//! Every response carries `Server: fleetd/<version>`; every error is fleet's error entity.

use axum::Router;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use percent_encoding::percent_decode_str;
use std::sync::Arc;
use tracing::{debug, warn};

use fleet_core::{DesiredState, UnitName};
use fleet_registry::Registry;
use fleet_registry::kv::Kv;

use crate::discovery;
use crate::entity;
use crate::error::{ApiError, json_response};
use crate::ops::{Ops, PutRequest, metadata_changes, unit_file};
use crate::page::PageToken;

/// Prefixes the API answers under; fleet kept the pre-1.0 one as an alias.
pub const PREFIXES: [&str; 2] = ["/fleet/v1", "/v1-alpha"];

/// Largest request body read: a unit file may be 1 MiB, and JSON escaping can double it.
const MAX_BODY: usize = 4 * 1024 * 1024;

/// What the handlers share.
#[derive(Debug)]
pub struct Api<K> {
    ops: Ops<K>,
    token_limit: u16,
    server: HeaderValue,
}

impl<K: Kv> Api<K> {
    /// `version` goes into the `Server` header as `fleetd/<version>`.
    pub fn new(registry: Registry<K>, token_limit: u16, version: &str) -> Api<K> {
        assert!(token_limit > 0, "token_limit is validated by the config");
        Api {
            ops: Ops::new(registry),
            token_limit,
            server: HeaderValue::from_str(&format!("fleetd/{version}"))
                .unwrap_or_else(|_| HeaderValue::from_static("fleetd")),
        }
    }
}

/// The API as an axum router (a tower service), ready to serve on any listener.
pub fn router<K: Kv>(api: Api<K>) -> Router {
    Router::new()
        .fallback(dispatch::<K>)
        .with_state(Arc::new(api))
}

async fn dispatch<K: Kv>(State(api): State<Arc<Api<K>>>, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let mut resp = match route(&api, req).await {
        Ok(resp) => resp,
        Err(e) => {
            if e.status().is_server_error() {
                warn!(method = %method, path = %path, error = %e, "api request failed");
            }
            e.into_response()
        }
    };
    debug!(method = %method, path = %path, status = resp.status().as_u16(), "api request");
    resp.headers_mut()
        .insert(header::SERVER, api.server.clone());
    resp
}

/// Which resource a path names (already percent-decoded).
#[derive(Debug, PartialEq, Eq)]
enum Route<'a> {
    Root,
    Discovery,
    Machines,
    Units,
    Unit(&'a str),
    States,
    State(&'a str),
}

fn parse_path(path: &str) -> Option<Route<'_>> {
    if path == "/" {
        return Some(Route::Root);
    }
    let rest = PREFIXES.iter().find_map(|p| path.strip_prefix(p))?;
    let item = |base: &str| {
        let item = rest.strip_prefix(base)?.strip_prefix('/')?;
        (!item.is_empty() && !item.contains('/')).then_some(item)
    };
    match rest {
        "" => Some(Route::Root),
        "/discovery" => Some(Route::Discovery),
        "/machines" => Some(Route::Machines),
        "/units" => Some(Route::Units),
        "/state" => Some(Route::States),
        _ => item("/units")
            .map(Route::Unit)
            .or_else(|| item("/state").map(Route::State)),
    }
}

async fn route<K: Kv>(api: &Api<K>, req: Request) -> Result<Response, ApiError> {
    let decoded = percent_decode_str(req.uri().path()).decode_utf8_lossy();
    let route = parse_path(&decoded).ok_or(ApiError::NoSuchPath)?;
    let query = req.uri().query().unwrap_or("").to_owned();
    let method = req.method().clone();
    match (route, method) {
        (Route::Root, _) => Err(ApiError::NoMethodsHere),
        (Route::Discovery, Method::GET) => Ok(json_response(
            StatusCode::OK,
            &discovery::document(req.headers().get(header::HOST)),
        )),
        (Route::Discovery, _) => Err(ApiError::DiscoveryNotGet),
        (Route::Machines, Method::GET) => list_machines(api, &query).await,
        (Route::Machines, Method::PATCH) => patch_machines(api, req).await,
        (Route::Machines, _) => Err(ApiError::WrongMethod("GET and PATCH")),
        (Route::Units, Method::GET) => list_units(api, &query).await,
        (Route::Units, _) => Err(ApiError::WrongMethod("GET")),
        (Route::Unit(name), Method::GET) => match api.ops.unit(name).await? {
            Some(unit) => Ok(json_response(StatusCode::OK, &unit)),
            None => Err(ApiError::UnitNotFound),
        },
        (Route::Unit(name), Method::DELETE) => match api.ops.destroy(name).await? {
            true => Ok(StatusCode::NO_CONTENT.into_response()),
            false => Err(ApiError::UnitNotFound),
        },
        (Route::Unit(name), Method::PUT) => {
            let name = name.to_owned();
            put_unit(api, &name, req).await
        }
        (Route::Unit(_), _) => Err(ApiError::WrongMethod("GET, PUT and DELETE")),
        (Route::States, Method::GET) => list_states(api, &query).await,
        (Route::State(name), Method::GET) => {
            let states = api.ops.states(None, Some(name)).await?;
            match states.into_iter().next() {
                Some(state) => Ok(json_response(StatusCode::OK, &state)),
                None => Err(ApiError::StateNotFound),
            }
        }
        (Route::States | Route::State(_), _) => Err(ApiError::WrongMethod("GET")),
    }
}

async fn list_machines<K: Kv>(api: &Api<K>, query: &str) -> Result<Response, ApiError> {
    let token = page_token(api, query)?;
    let (machines, next) = token.slice(api.ops.machines().await?);
    let page = entity::MachinePage {
        machines,
        next_page_token: encode(next),
        ..Default::default()
    };
    Ok(json_response(StatusCode::OK, &page))
}

async fn list_units<K: Kv>(api: &Api<K>, query: &str) -> Result<Response, ApiError> {
    let token = page_token(api, query)?;
    let (units, next) = token.slice(api.ops.units().await?);
    let page = entity::UnitPage {
        units,
        next_page_token: encode(next),
        ..Default::default()
    };
    Ok(json_response(StatusCode::OK, &page))
}

async fn list_states<K: Kv>(api: &Api<K>, query: &str) -> Result<Response, ApiError> {
    // The token first: a bad one is a 400 without a registry read.
    let token = page_token(api, query)?;
    let machine = first(query, "machineID");
    let unit = first(query, "unitName");
    let states = api.ops.states(machine.as_deref(), unit.as_deref()).await?;
    let (states, next) = token.slice(states);
    let page = entity::UnitStatePage {
        states,
        next_page_token: encode(next),
    };
    Ok(json_response(StatusCode::OK, &page))
}

async fn put_unit<K: Kv>(api: &Api<K>, url_name: &str, req: Request) -> Result<Response, ApiError> {
    check_content_type(req.headers())?;
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
    let file = match wire.options.as_slice() {
        [] => None,
        options => Some(unit_file(&name, options)?),
    };
    let plan = api
        .ops
        .put(PutRequest {
            name,
            file,
            desired,
        })
        .await?;
    let status = if plan.creates() {
        StatusCode::CREATED
    } else {
        StatusCode::NO_CONTENT
    };
    Ok(status.into_response())
}

/// fleet's `PATCH /machines`: validated as a whole, then applied in one transaction; 204
/// with a JSON content type (fleet's functional tests check it). fleet checks no content type
/// here and its tests send none, so only a wrong one is refused.
async fn patch_machines<K: Kv>(api: &Api<K>, req: Request) -> Result<Response, ApiError> {
    if req.headers().contains_key(header::CONTENT_TYPE) {
        check_content_type(req.headers())?;
    }
    let body = axum::body::to_bytes(req.into_body(), MAX_BODY)
        .await
        .map_err(ApiError::ReadBody)?;
    let ops: Vec<entity::MetadataOp> =
        serde_json::from_slice(&body).map_err(ApiError::DecodeBody)?;
    let changes = metadata_changes(&ops)?;
    api.ops.change_metadata(&changes).await?;
    let mut resp = StatusCode::NO_CONTENT.into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

/// fleet's rule: exactly one `Content-Type`, `application/json` with any parameters.
fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let values: Vec<&HeaderValue> = headers.get_all(header::CONTENT_TYPE).iter().collect();
    let [value] = values[..] else {
        return Err(ApiError::ContentTypeCount(values.len()));
    };
    let media = value.to_str().unwrap_or("");
    let media = media.split(';').next().unwrap_or("").trim();
    if media != "application/json" {
        return Err(ApiError::NotJson);
    }
    Ok(())
}

fn page_token<K>(api: &Api<K>, query: &str) -> Result<PageToken, ApiError> {
    let values = query_values(query, "nextPageToken");
    Ok(PageToken::from_request(&values, api.token_limit)?)
}

fn encode(token: Option<PageToken>) -> String {
    token.map(PageToken::encode).unwrap_or_default()
}

fn first(query: &str, key: &str) -> Option<String> {
    query_values(query, key).into_iter().next()
}

/// Every value of `key` in a URL query, decoded as Go's `url.ParseQuery` does (`+` is a
/// space). A token's `=` padding may come unescaped: only the first `=` splits.
fn query_values(query: &str, key: &str) -> Vec<String> {
    let decode = |s: &str| {
        percent_decode_str(&s.replace('+', " "))
            .decode_utf8_lossy()
            .into_owned()
    };
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k) == key).then(|| decode(v))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_resources_under_both_prefixes() {
        for prefix in PREFIXES {
            let p = |s: &str| format!("{prefix}{s}");
            assert_eq!(parse_path(&p("")), Some(Route::Root));
            assert_eq!(parse_path(&p("/units")), Some(Route::Units));
            assert_eq!(
                parse_path(&p("/units/a@1.service")),
                Some(Route::Unit("a@1.service"))
            );
            assert_eq!(
                parse_path(&p("/state/a.service")),
                Some(Route::State("a.service"))
            );
            assert_eq!(parse_path(&p("/units/")), None);
            assert_eq!(parse_path(&p("/units/a/b")), None);
            assert_eq!(parse_path(&p("/")), None);
            assert_eq!(parse_path(&p("/unitsx")), None);
        }
        assert_eq!(parse_path("/"), Some(Route::Root));
        assert_eq!(parse_path("/fleet/v2/units"), None);
    }

    #[test]
    fn query_values_decode_like_go() {
        let q = "nextPageToken=ZAACAA==&unitName=a%40b.service&x=1+2&unitName=c";
        assert_eq!(query_values(q, "nextPageToken"), vec!["ZAACAA=="]);
        assert_eq!(query_values(q, "unitName"), vec!["a@b.service", "c"]);
        assert_eq!(query_values(q, "x"), vec!["1 2"]);
        assert!(query_values(q, "machineID").is_empty());
    }
}
