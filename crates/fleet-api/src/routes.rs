//! The router: fleet's paths under `/fleet/v1` and its legacy alias `/v1-alpha`, matched by
//! hand because fleet's answers depend on more than the route (a trailing `/` is a 404, each
//! resource names its own methods in a 405, the discovery document answers 400).
//!
//! Every response carries `Server: fleetd/<version>`; every error is fleet's error entity.

use axum::Router;
use axum::extract::{Request, State};
use axum::response::Response;
use http::{HeaderValue, Method, StatusCode, header};
use percent_encoding::percent_decode_str;
use std::sync::Arc;
use tracing::{debug, info, warn};

use fleet_api_wire::convert;
use fleet_api_wire::wire;
use fleet_core::UnitName;
use fleet_ops::{Cluster, RegistryCluster, StateFilter, UnitsCursor};
use fleet_registry::kv::Kv;
use fleet_registry::{Registry, SharedStore};
use std::collections::BTreeSet;

use crate::authz::{self, Action, Peer, Principal, Refusal, Role, Roles};
use crate::discovery;
use crate::entity;
use crate::error::{ApiError, json_response};
use crate::held::{HeldView, PageLimit, Report};
use crate::maintenance;
use crate::metrics::{self, Metrics};
use crate::page::{Cursor, UnitsToken};

mod body;
mod changes;
mod events;
mod import;
mod inspect;
mod listings;
mod query;
pub mod ui;
mod writes;

use body::{
    MAX_BODY, REFUSED_BODY_READ, check_content_type, read_body, streamed_unit_page, unit_page,
};
pub(crate) use inspect::Aspect;
use query::{Query, encode, first, listing_paging, page_limit, unit_names, whole_asked};
pub(crate) use query::{is_full, query_values};

/// Prefixes the API answers under; fleet kept the pre-1.0 one as an alias.
pub const PREFIXES: [&str; 2] = ["/fleet/v1", "/v1-alpha"];

/// What the handlers share.
#[derive(Debug)]
pub struct Api<K> {
    cluster: RegistryCluster<K>,
    /// Concurrent `PUT ?expect=absent` creates, written together ([`crate::group`]).
    creates: crate::group::Creates,
    token_limit: u16,
    server: HeaderValue,
    /// This machine's status and journal routes; None: not served
    /// ([`ApiError::NotInspecting`]).
    inspection: Option<inspect::Inspection>,
    metrics: Metrics,
    /// What `GET /metrics` serves; without it, that path is a 404.
    exposed: Option<Arc<prometheus_client::registry::Registry>>,
    /// The roles of client certificates; None: certificates are not checked (every client
    /// is admin), the default of a library caller. fleetd always sets them.
    roles: Option<Roles>,
    /// The view the listing of every unit is served from; None: each page reads etcd.
    held: Option<HeldView<K>>,
    /// What `GET /health` answers from; None: that path is a 404.
    health: Option<crate::health::Health>,
    /// The dashboard's change streams being served ([`ui`]).
    ui_streams: ui::Streams,
    /// `GET /changes`' streams being served ([`changes`]).
    change_streams: changes::Streams,
}

impl<K: Kv> Api<K> {
    /// Users' writes are recorded as events into `sink` (issue 41; fleetd gives the
    /// operator role's writer).
    pub fn with_events(mut self, sink: fleet_registry::EventSink) -> Api<K> {
        self.cluster = self.cluster.with_events(sink);
        self
    }

    /// `version` goes into the `Server` header as `fleetd/<version>`.
    pub fn new(registry: Registry<K>, token_limit: u16, version: &str) -> Api<K> {
        assert!(token_limit > 0, "token_limit is validated by the config");
        Api {
            cluster: RegistryCluster::new(registry),
            creates: crate::group::Creates::new(),
            token_limit,
            server: HeaderValue::from_str(&format!("fleetd/{version}"))
                .unwrap_or_else(|_| HeaderValue::from_static("fleetd")),
            inspection: None,
            metrics: Metrics::default(),
            exposed: None,
            roles: None,
            held: None,
            health: None,
            ui_streams: ui::Streams::default(),
            change_streams: changes::Streams::default(),
        }
    }

    /// `GET /health` answers whether this machine reached etcd lately ([`crate::health`]).
    pub fn with_health(mut self, health: crate::health::Health) -> Api<K> {
        self.health = Some(health);
        self
    }

    /// `GET /units` listings of every unit come from a view of the registry held while
    /// they come, dropped after `idle` without one ([`crate::held`]). Without it every page
    /// reads its keys from etcd.
    pub fn with_held_view(self, idle: std::time::Duration) -> Api<K> {
        let stores = SharedStore::new(self.cluster.registry().clone());
        self.with_held_view_sharing(idle, stores)
    }

    /// [`with_held_view`](Self::with_held_view) on the process's store of the registry,
    /// `stores`, which the engine leader of the same fleetd plans on: fleetd's API does this.
    pub fn with_held_view_sharing(
        mut self,
        idle: std::time::Duration,
        stores: SharedStore<K>,
    ) -> Api<K> {
        self.held = Some(HeldView::new(idle, stores));
        self
    }

    /// A page the held view served, counted by what served it.
    fn served<T>(&self, page: Result<T, crate::held::Bypass>) -> Option<T> {
        match page {
            Ok(page) => {
                self.metrics.held_page("view");
                Some(page)
            }
            Err(bypass) => {
                self.metrics.held_page(bypass.as_str());
                None
            }
        }
    }

    /// The metrics this API counts into.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The held view of [`with_held_view`](Self::with_held_view).
    pub fn held_view(&self) -> Option<&HeldView<K>> {
        self.held.as_ref()
    }

    /// Requests over TLS get the role `roles` gives their client certificate, and are
    /// refused (403) what it does not permit (docs/security.md); the unix socket and plain
    /// TCP stay admin.
    pub fn with_roles(mut self, roles: Roles) -> Api<K> {
        self.roles = Some(roles);
        self
    }

    /// This API, counting its requests into `metrics` and serving `exposed` (every metric
    /// of the process, `metrics` included) at `GET /metrics`.
    pub fn with_metrics(
        mut self,
        metrics: Metrics,
        exposed: Arc<prometheus_client::registry::Registry>,
    ) -> Api<K> {
        self.metrics = metrics;
        self.exposed = Some(exposed);
        self
    }

    /// Serves `GET /units/<name>/status` and `/journal` for the units scheduled on
    /// `machine` (this fleetd's), through `inspector`.
    pub fn with_inspector(
        mut self,
        machine: fleet_core::MachineId,
        inspector: Arc<dyn crate::inspect::Inspector>,
    ) -> Api<K> {
        self.inspection = Some(inspect::Inspection::new(machine, inspector));
        self
    }

    /// The status and journal routes refuse units matching these globs (fleetd's
    /// `deny_units`): the agent does not manage them here, so what systemd has under that
    /// name is the host's, not fleet's. Takes effect with [`Api::with_inspector`].
    pub fn refusing(mut self, deny_units: Vec<String>) -> Api<K> {
        if let Some(i) = self.inspection.as_mut() {
            i.deny_units = deny_units;
        }
        self
    }
}

/// The API as an axum router (a tower service), ready to serve on any listener.
pub fn router<K: Kv>(api: Api<K>) -> Router {
    router_of(Arc::new(api))
}

/// [`router`] over an API the caller keeps a handle on.
pub fn router_of<K: Kv>(api: Arc<Api<K>>) -> Router {
    Router::new().fallback(dispatch::<K>).with_state(api)
}

async fn dispatch<K: Kv>(State(api): State<Arc<Api<K>>>, req: Request) -> Response {
    let started = tokio::time::Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let template = template_of(&path);
    let full = is_full(req.uri().query().unwrap_or(""));
    let answer = match crate::head::check(&req, MAX_BODY) {
        Err(e) => Err(e),
        Ok(()) => authorize(&api, req).await,
    };
    let answer = match answer {
        Err(e) => Err(e),
        Ok(req) => match (&api.exposed, path == metrics::PATH) {
            (Some(exposed), true) => match method {
                Method::GET => Ok(metrics::exposition(exposed, req.headers())),
                _ => Err(ApiError::WrongMethod("GET")),
            },
            (None, true) => Err(ApiError::NoSuchPath),
            (_, false) if ui::is_ui(&path) => ui::handle(&api, req).await,
            (_, false) => route(&api, req).await,
        },
    };
    let mut resp = match answer {
        Ok(resp) => resp,
        Err(e) => {
            if e.status().is_server_error() {
                warn!(method = %method, path = %path, error = %e, "api request failed");
            }
            e.response(full)
        }
    };
    debug!(method = %method, path = %path, status = resp.status().as_u16(), "api request");
    api.metrics
        .answered(template, &method, resp.status(), started.elapsed());
    resp.headers_mut()
        .insert(header::SERVER, api.server.clone());
    resp
}

/// The request, with its [`Principal`] among its extensions, if its client may do what it
/// asks; else the refusal (403). Decided before any handler runs, so a refused request
/// reads and writes nothing. The body is never read here for a role that may do every
/// action (operator, admin): it goes to the handler untouched. A viewer may do no write, so
/// its `PUT` or `POST` is refused whatever it holds; at most [`REFUSED_BODY_READ`] bytes of
/// it are read, only to name the action (a larger one is named as its method and query
/// say), and nothing of it is kept (issue 37: 200 refused 4 MiB bodies must not cost
/// 800 MiB).
async fn authorize<K>(api: &Api<K>, req: Request) -> Result<Request, ApiError> {
    let principal = Principal::of(req.extensions().get::<Peer>(), api.roles.as_ref());
    let query = req.uri().query().unwrap_or("").to_owned();
    let (mut parts, body) = req.into_parts();
    if let Err(e) = ui::csrf(&parts.method, &parts.headers) {
        info!(
            client = %principal.shown(),
            method = %parts.method,
            path = %parts.uri.path(),
            "api request refused: a browser's write without the dashboard's header"
        );
        return Err(e);
    }
    let may_refuse_a_write = principal.role == Some(Role::Viewer);
    let (body, read) = if may_refuse_a_write && authz::needs_body(&parts.method, &query) {
        let bytes = read_body(body, REFUSED_BODY_READ).await.ok();
        (axum::body::Body::empty(), bytes)
    } else {
        (body, None)
    };
    let action = authz::action_of(&parts.method, parts.uri.path(), &query, read.as_deref());
    if let Err(refusal) = authz::decide(&principal, action) {
        info!(
            client = %principal.shown(),
            role = principal.role.map(Role::as_str),
            action = action.map(Action::phrase),
            method = %parts.method,
            path = %parts.uri.path(),
            "api request refused"
        );
        return Err(match refusal {
            Refusal::NoRole(subject) => ApiError::NoRole(subject),
            Refusal::Forbidden { role, action } => ApiError::Forbidden { role, action },
        });
    }
    parts.extensions.insert(principal);
    Ok(Request::from_parts(parts, body))
}

/// Which resource a path names (already percent-decoded).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Route<'a> {
    Root,
    Discovery,
    Machines,
    Units,
    Unit(&'a str),
    States,
    State(&'a str),
    Drains,
    Drain(&'a str),
    Explain(&'a str),
    /// `POST /import`: an import plan from fleet v1 ([`import`]).
    Import,
    /// Whether this machine reaches etcd ([`crate::health`]).
    Health,
    /// What happened (issue 41): a page, or a stream with `follow=true`.
    Events,
    /// The registry's changes as they happen (issue 41): a held stream.
    Changes,
    /// `/units/<name>/status` and `/units/<name>/journal`.
    Inspect(&'a str, inspect::Aspect),
}

impl Route<'_> {
    /// The route's template, for the metrics: a resource's name is never a label value.
    fn template(&self) -> &'static str {
        match self {
            Route::Root => "/",
            Route::Discovery => "/discovery",
            Route::Machines => "/machines",
            Route::Units => "/units",
            Route::Unit(_) => "/units/{name}",
            Route::States => "/state",
            Route::State(_) => "/state/{name}",
            Route::Drains => "/drains",
            Route::Drain(_) => "/drains/{machine}",
            Route::Explain(_) => "/explain/{name}",
            Route::Import => "/import",
            Route::Health => "/health",
            Route::Events => "/events",
            Route::Changes => "/changes",
            Route::Inspect(_, inspect::Aspect::Status) => "/units/{name}/status",
            Route::Inspect(_, inspect::Aspect::Journal) => "/units/{name}/journal",
        }
    }
}

/// The template of the route `path` (not yet decoded) names: `other` when none, so that
/// probing random paths makes one series.
fn template_of(path: &str) -> &'static str {
    if path == metrics::PATH {
        return metrics::PATH;
    }
    if ui::is_ui(path) {
        return ui::template(path);
    }
    let decoded = percent_decode_str(path).decode_utf8_lossy();
    parse_path(&decoded).map_or("other", |r| r.template())
}

pub(crate) fn parse_path(path: &str) -> Option<Route<'_>> {
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
        "/drains" => Some(Route::Drains),
        "/health" => Some(Route::Health),
        fleet_api_wire::import::PATH => Some(Route::Import),
        "/events" => Some(Route::Events),
        fleet_api_wire::changes::PATH => Some(Route::Changes),
        _ => item("/units")
            .map(Route::Unit)
            .or_else(|| item("/state").map(Route::State))
            .or_else(|| item("/drains").map(Route::Drain))
            .or_else(|| item("/explain").map(Route::Explain))
            .or_else(|| inspect::parse(rest).map(|(name, a)| Route::Inspect(name, a))),
    }
}

/// The cluster a write of `req` goes through: recorded as events by whom it is (issue 41).
fn acting<K: Kv>(api: &Api<K>, req: &Request) -> RegistryCluster<K> {
    let who = req.extensions().get::<Principal>().map(|p| {
        let uid = req.extensions().get::<authz::LocalUid>().copied();
        p.who(uid)
    });
    api.cluster.acting_as(who.as_deref())
}

async fn route<K: Kv>(api: &Api<K>, req: Request) -> Result<Response, ApiError> {
    let decoded = percent_decode_str(req.uri().path()).decode_utf8_lossy();
    let route = parse_path(&decoded).ok_or(ApiError::NoSuchPath)?;
    let raw = req.uri().query().unwrap_or("").to_owned();
    let query = Query {
        full: is_full(&raw),
        raw,
    };
    let method = req.method().clone();
    let acting = acting(api, &req);
    match (route, method) {
        (Route::Root, _) => Err(ApiError::NoMethodsHere),
        (Route::Discovery, Method::GET) => Ok(json_response(
            StatusCode::OK,
            &discovery::document(req.headers().get(header::HOST)),
        )),
        (Route::Discovery, _) => Err(ApiError::DiscoveryNotGet),
        (Route::Machines, Method::GET) => listings::list_machines(api, &query).await,
        (Route::Machines, Method::PATCH) => writes::patch_machines(&acting, req).await,
        (Route::Machines, _) => Err(ApiError::WrongMethod("GET and PATCH")),
        (Route::Units, Method::GET) => listings::list_units(api, &query).await,
        (Route::Units, Method::POST) if query.full => writes::create_units(&acting, req).await,
        (Route::Units, _) => Err(ApiError::WrongMethod("GET")),
        (Route::Unit(name), Method::GET) => {
            // A name that cannot name a unit names none.
            let Ok(name) = name.parse::<UnitName>() else {
                return Err(ApiError::UnitNotFound);
            };
            match api.cluster.unit(&name).await? {
                Some(unit) => Ok(json_response(
                    StatusCode::OK,
                    &convert::unit_to_wire(&unit, query.full),
                )),
                None => Err(ApiError::UnitNotFound),
            }
        }
        (Route::Unit(name), Method::DELETE) => writes::delete_unit(&acting, name, &query).await,
        (Route::Unit(name), Method::PUT) => {
            let name = name.to_owned();
            writes::put_unit(api, &acting, &name, &query, req).await
        }
        (Route::Unit(_), _) => Err(ApiError::WrongMethod("GET, PUT and DELETE")),
        (Route::States, Method::GET) => listings::list_states(api, &query).await,
        (Route::State(name), Method::GET) => {
            let Ok(name) = name.parse::<UnitName>() else {
                return Err(ApiError::StateNotFound);
            };
            let filter = StateFilter {
                machine: None,
                unit: Some(name),
            };
            match api.cluster.states(&filter).await?.states.first() {
                Some(state) => Ok(json_response(
                    StatusCode::OK,
                    &convert::state_to_wire(state, query.full),
                )),
                None => Err(ApiError::StateNotFound),
            }
        }
        (Route::States | Route::State(_), _) => Err(ApiError::WrongMethod("GET")),
        (Route::Drains, Method::GET) => maintenance::list_drains(&api.cluster).await,
        (Route::Drains, _) => Err(ApiError::WrongMethod("GET")),
        (Route::Drain(machine), method) => {
            let parallel = query_values(&query.raw, maintenance::PARALLEL);
            maintenance::drain(&acting, machine, method, &parallel).await
        }
        (Route::Explain(unit), method) => maintenance::explain(&api.cluster, unit, method).await,
        (Route::Import, Method::POST) => import::import(api, req).await,
        (Route::Import, _) => Err(ApiError::WrongMethod("POST")),
        (Route::Health, method) => {
            let within = query_values(&query.raw, crate::health::WITHIN);
            crate::health::handle(api.health.as_ref(), method, &within).await
        }
        (Route::Inspect(unit, aspect), method) => {
            inspect::handle(api, unit, aspect, method, &query).await
        }
        (Route::Events, Method::GET) => events::handle(&api.cluster, &query).await,
        (Route::Changes, Method::GET) => changes::handle(&api.cluster, &api.change_streams).await,
        (Route::Events | Route::Changes, _) => Err(ApiError::WrongMethod("GET")),
    }
}

#[cfg(test)]
mod tests;
