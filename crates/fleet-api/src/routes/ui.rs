//! The dashboard under `/ui/` on every listener of the API (issue 42): one page of plain
//! HTML, CSS and JavaScript embedded in the binary, and two reads of its own.
//!
//! - `GET /ui/` (and its assets): the page. It reads the cluster through `/ui/api/overview`
//!   and fleet's own API (`/fleet/v1/units/<name>`, `/state`, `/explain`, the journal, the
//!   events followed), and acts through fleet's API too (start, stop, destroy, drain), so
//!   every action is decided by the same roles as fleetctl's ([`crate::authz`]).
//! - `GET /ui/api/overview?page=&perPage=&filter=`: one page of machines with their units
//!   ([`overview`]), the counts per state, the unscheduled units, the client's role; built
//!   from the held view of the registry ([`crate::held`]) when the API has one, so that a
//!   page open on a cluster of 100,000 units reads none of its keys from etcd per change.
//! - `GET /ui/api/changes`: server-sent events, one `change` (with the revision) after any
//!   change of the registry, at most every [`CHANGE_EVERY`]: the page re-reads then, and
//!   never polls. At most [`MAX_STREAMS`] at once.
//!
//! Browsers send client certificates and cookies by themselves, so a request from a
//! browser (it carries `Origin` or `Sec-Fetch-Site`) that changes anything must carry the
//! header the page sets, [`CSRF_HEADER`]: another site cannot set it without a preflight,
//! which fleetd never grants. fleetctl and fleet's own clients send neither header and are
//! not concerned. Every page answer carries a strict Content-Security-Policy (no inline
//! script or style, nothing from elsewhere); the page writes every name, metadata value and
//! file line as text, never as markup.

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fleet_registry::kv::Kv;

use super::Api;
use super::query::query_values;
use crate::authz::Principal;
use crate::error::{ApiError, json_response};

pub mod overview;

/// Where the dashboard lives.
pub const PREFIX: &str = "/ui";
/// The header every state-changing request from a browser must carry (any value).
pub const CSRF_HEADER: &str = "x-fleet-csrf";
/// The most change streams served at once.
pub const MAX_STREAMS: usize = 64;
/// The least time between two `change` events of one stream.
pub const CHANGE_EVERY: Duration = Duration::from_millis(300);
/// A comment line on an idle stream this often, so that proxies keep it.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

const INDEX: &str = include_str!("ui/index.html");
const SCRIPT: &str = include_str!("ui/app.js");
const STYLE: &str = include_str!("ui/app.css");
const ICON: &str = include_str!("ui/favicon.svg");

/// Nothing but this origin's own script, style, images and requests; no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

/// The change streams being served (shared by the clones of the API's state).
#[derive(Debug, Default, Clone)]
pub struct Streams(Arc<AtomicUsize>);

/// Whether `path` is the dashboard's.
pub fn is_ui(path: &str) -> bool {
    path == PREFIX
        || path
            .strip_prefix(PREFIX)
            .is_some_and(|r| r.starts_with('/'))
}

/// The route's template, for the metrics.
pub fn template(path: &str) -> &'static str {
    match path.strip_prefix(PREFIX) {
        Some("/api/overview") => "/ui/api/overview",
        Some("/api/changes") => "/ui/api/changes",
        _ => "/ui/",
    }
}

/// Refuses a browser's state-changing request without [`CSRF_HEADER`] (403): see the
/// module's doc.
pub fn csrf(method: &Method, headers: &HeaderMap) -> Result<(), ApiError> {
    let changes = !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    let browser = headers.contains_key(header::ORIGIN) || headers.contains_key("sec-fetch-site");
    if changes && browser && !headers.contains_key(CSRF_HEADER) {
        return Err(ApiError::CrossSite);
    }
    Ok(())
}

/// Serves a request under [`PREFIX`].
pub async fn handle<K: Kv>(api: &Api<K>, req: Request) -> Result<Response, ApiError> {
    if req.method() != Method::GET {
        return Err(ApiError::WrongMethod("GET"));
    }
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    match path.strip_prefix(PREFIX).unwrap_or("") {
        "" => Ok(redirect()),
        "/" | "/index.html" => Ok(page(INDEX, "text/html; charset=utf-8")),
        "/app.js" => Ok(page(SCRIPT, "text/javascript; charset=utf-8")),
        "/app.css" => Ok(page(STYLE, "text/css; charset=utf-8")),
        "/favicon.svg" => Ok(page(ICON, "image/svg+xml")),
        "/api/overview" => {
            let role = req
                .extensions()
                .get::<Principal>()
                .and_then(|p| p.role)
                .map_or("none", |r| r.as_str());
            read_overview(api, &query, role).await
        }
        "/api/changes" => changes(api).await,
        _ => Err(ApiError::NoSuchPath),
    }
}

fn redirect() -> Response {
    let mut resp = StatusCode::PERMANENT_REDIRECT.into_response();
    resp.headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static("/ui/"));
    resp
}

fn guarded(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

fn page(text: &'static str, kind: &'static str) -> Response {
    guarded(([(header::CONTENT_TYPE, kind)], text).into_response())
}

/// What `/ui/api/overview` answers: the overview, the client's role (the page shows no
/// action to a viewer; fleetd refuses them anyway) and the engine leader.
#[derive(serde::Serialize)]
struct Answer<'a> {
    #[serde(flatten)]
    overview: overview::Overview,
    role: &'a str,
    leader: Option<String>,
    /// This fleetd's machine, whose units' journals it streams (none: it serves none).
    here: Option<String>,
}

/// The overview's answer: [`overview::overview`] of the held view of the registry (its
/// present revision and the leader key are the only keys read), or, without one, of a
/// snapshot read from etcd.
async fn read_overview<K: Kv>(api: &Api<K>, query: &str, role: &str) -> Result<Response, ApiError> {
    let number = |key: &'static str| {
        query_values(query, key)
            .first()
            .map_or(Ok(0), |v| v.parse::<usize>())
            .map_err(|_| ApiError::BadUiNumber(key))
    };
    let ask = overview::Ask {
        page: number("page")?,
        per_page: number("perPage")?,
        filter: query_values(query, "filter")
            .first()
            .map(|f| f.trim().to_lowercase())
            .unwrap_or_default(),
    };
    let leader = match api.cluster.registry().leader_key(None).await {
        Ok(fleet_registry::LeaderKey::Held { machine }) => Some(machine),
        Ok(_) => None,
        Err(e) => return Err(fleet_ops::OpsError::from(e).into()),
    };
    let held = match &api.held {
        Some(held) => held
            .read_at(api.cluster.registry(), None, |view| {
                overview::overview(
                    &overview::Read {
                        snap: view.snapshot(),
                        leader: leader.as_ref(),
                    },
                    &ask,
                )
            })
            .await?
            .ok(),
        None => None,
    };
    let overview = match held {
        Some(overview) => overview,
        None => {
            let snap = api
                .cluster
                .registry()
                .snapshot()
                .await
                .map_err(fleet_ops::OpsError::from)?;
            overview::overview(
                &overview::Read {
                    snap: &snap,
                    leader: leader.as_ref(),
                },
                &ask,
            )
        }
    };
    let answer = Answer {
        overview,
        role,
        leader: leader.map(|l| l.to_string()),
        here: api.inspection.as_ref().map(|i| i.machine.to_string()),
    };
    Ok(guarded(json_response(StatusCode::OK, &answer)))
}

/// The change stream: see the module's doc.
async fn changes<K: Kv>(api: &Api<K>) -> Result<Response, ApiError> {
    let streams = api.ui_streams.0.clone();
    if streams.fetch_add(1, Ordering::SeqCst) >= MAX_STREAMS {
        streams.fetch_sub(1, Ordering::SeqCst);
        return Err(ApiError::TooManyStreams(MAX_STREAMS));
    }
    let slot = Slot(streams);
    let hints = match api.cluster.registry().watch_everything().await {
        Ok(h) => h,
        Err(e) => return Err(fleet_ops::OpsError::from(e).into()),
    };
    let events =
        futures::stream::unfold((hints, slot, true), |(mut hints, slot, first)| async move {
            if first {
                // The first event says the stream is open: the page reads once then.
                let open = bytes::Bytes::from_static(b"retry: 2000\nevent: change\ndata: 0\n\n");
                return Some((Ok::<_, std::io::Error>(open), (hints, slot, false)));
            }
            let line = match tokio::time::timeout(KEEP_ALIVE, hints.changed()).await {
                Ok(None) => return None,
                Ok(Some(revision)) => {
                    tokio::time::sleep(CHANGE_EVERY).await;
                    format!("event: change\ndata: {revision}\n\n")
                }
                Err(_) => ": still here\n\n".to_owned(),
            };
            Some((Ok(bytes::Bytes::from(line)), (hints, slot, false)))
        });
    let mut resp = Response::new(Body::from_stream(events));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    Ok(guarded(resp))
}

/// One stream's place among [`MAX_STREAMS`], given back when the stream ends.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
