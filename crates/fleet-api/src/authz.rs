//! Who may do what over the API (issue 17, docs/security.md "The API: certificates and
//! roles"): the roles, the actions of every route, and the decision, all pure. The router
//! decides here before any handler runs, so a refused request reads and writes nothing.
//!
//! - A client is a [`Peer`], which [`crate::serve`] attaches to each request: the unix
//!   socket's (`admin`: its file mode and group guard it, as in fleet), plain TCP's (`admin`:
//!   fleetd takes plain TCP only on loopback unless told otherwise), or a TLS client
//!   certificate's subject ([`CertSubject`]).
//! - [`Roles`] maps subjects (`CN=<name>`, or `O=<group>`: any of a certificate's O values) to
//!   a [`Role`]; a certificate's CN entry wins over its groups, and of several groups the
//!   highest role counts. A certificate no entry names has no role: every request is refused.
//! - [`action_of`] names what a request does; [`permits`] says whether a role may do it.
//!
//! This module must not touch the registry or parse certificates' signatures: the TLS
//! handshake has already verified the chain; only the subject is read here.

use fleet_api_wire::wire::{self, Op};
use http::Method;
use percent_encoding::percent_decode_str;
use std::collections::BTreeMap;
use std::fmt;

use crate::metrics;
use crate::routes::{Route, is_full, parse_path, query_values};

/// A role of fleetd's configuration (`api_admins`, `api_operators`, `api_viewers`), from the
/// least to the most trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Every read.
    Viewer,
    /// Every read, and every change of units, drains and machine metadata.
    Operator,
    /// Everything.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a request does, as the issue names it (fleetctl's commands).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Submit,
    Load,
    Start,
    Stop,
    Unload,
    Destroy,
    Replace,
    Restart,
    Drain,
    Metadata,
    List,
    Cat,
    Status,
    Journal,
    Explain,
    Metrics,
    /// Write units taken over from fleet v1 with their machines (`POST /import`): schedule
    /// entries, which otherwise only the engine writes. Admins only.
    Import,
    /// Answer whether this machine reaches etcd: any client let in may ask, with or
    /// without a role (a peer fleetd, [`crate::health`]).
    Health,
}

impl Action {
    /// Whether the action only reads.
    pub fn is_read(self) -> bool {
        match self {
            Action::List
            | Action::Cat
            | Action::Status
            | Action::Journal
            | Action::Explain
            | Action::Metrics
            | Action::Health => true,
            Action::Submit
            | Action::Load
            | Action::Start
            | Action::Stop
            | Action::Unload
            | Action::Destroy
            | Action::Replace
            | Action::Restart
            | Action::Drain
            | Action::Metadata
            | Action::Import => false,
        }
    }

    /// The action in a refusal: "role viewer may not {phrase}".
    pub fn phrase(self) -> &'static str {
        match self {
            Action::Submit => "submit units",
            Action::Load => "load units",
            Action::Start => "start units",
            Action::Stop => "stop units",
            Action::Unload => "unload units",
            Action::Destroy => "destroy units",
            Action::Replace => "replace units",
            Action::Restart => "restart units",
            Action::Drain => "drain machines",
            Action::Metadata => "change machine metadata",
            Action::List => "list units, states and machines",
            Action::Cat => "read unit files",
            Action::Status => "read unit status",
            Action::Journal => "read unit journals",
            Action::Explain => "explain units",
            Action::Metrics => "read metrics",
            Action::Import => "import units from fleet with their machines",
            Action::Health => "ask whether this machine reaches etcd",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.phrase())
    }
}

/// Whether `role` may do `action`. An operator needs every read too: fleetctl reads a unit's
/// state while it waits for a start. An import places units itself, bypassing the scheduler
/// and the migration rules' checks of an operator's writes: admins only.
pub fn permits(role: Role, action: Action) -> bool {
    match role {
        Role::Admin => true,
        Role::Operator => action != Action::Import,
        Role::Viewer => action.is_read(),
    }
}

/// What a request does: `None` when its path names no route, or the route takes no such
/// method (the router answers 404, 405 or 400 then, without reading the registry). `path`
/// is the request's, not yet percent-decoded; `body` is needed only for a `PUT` of a unit
/// (its `desiredState` and `options` tell a start from a submit); without it, or when it is
/// no unit entity, a `PUT` of a unit is a submit.
pub fn action_of(method: &Method, path: &str, query: &str, body: Option<&[u8]>) -> Option<Action> {
    if path == metrics::PATH {
        return (method == Method::GET).then_some(Action::Metrics);
    }
    let decoded = percent_decode_str(path).decode_utf8_lossy();
    let route = parse_path(&decoded)?;
    let get = |a: Action| (method == Method::GET).then_some(a);
    match route {
        Route::Root => None,
        Route::Units => match *method {
            Method::GET => Some(Action::List),
            Method::POST if is_full(query) => Some(creates_action(body)),
            _ => None,
        },
        Route::Discovery | Route::States | Route::State(_) | Route::Drains => get(Action::List),
        Route::Machines => match *method {
            Method::GET => Some(Action::List),
            Method::PATCH => Some(Action::Metadata),
            _ => None,
        },
        Route::Unit(_) => match *method {
            Method::GET => Some(Action::Cat),
            Method::DELETE => Some(Action::Destroy),
            Method::PUT => Some(put_action(query, body)),
            _ => None,
        },
        Route::Drain(_) => match *method {
            Method::GET => Some(Action::List),
            Method::PUT | Method::DELETE => Some(Action::Drain),
            _ => None,
        },
        Route::Explain(_) => get(Action::Explain),
        Route::Import => (method == Method::POST).then_some(Action::Import),
        Route::Health => get(Action::Health),
        Route::Events | Route::Changes => get(Action::List),
        Route::Inspect(_, crate::routes::Aspect::Status) => get(Action::Status),
        Route::Inspect(_, crate::routes::Aspect::Journal) => get(Action::Journal),
    }
}

/// Whether [`action_of`] needs the body of this request to name its action.
pub fn needs_body(method: &Method, query: &str) -> bool {
    match *method {
        Method::PUT => match query_values(query, wire::OP).first() {
            None => true,
            Some(op) => Op::parse(op) == Some(Op::Raise),
        },
        Method::POST => is_full(query),
        _ => false,
    }
}

/// The action of a `POST /units` (creates): a start if any unit is to be launched, else a
/// load if any is to be loaded, else a submit.
fn creates_action(body: Option<&[u8]>) -> Action {
    #[derive(serde::Deserialize, Default)]
    #[serde(default, rename_all = "camelCase")]
    struct Asked {
        desired_state: String,
    }
    #[derive(serde::Deserialize, Default)]
    #[serde(default)]
    struct Creates {
        units: Vec<Asked>,
    }
    let asked: Creates = body
        .and_then(|b| serde_json::from_slice(b).ok())
        .unwrap_or_default();
    let wants = |state: &str| asked.units.iter().any(|u| u.desired_state == state);
    if wants("launched") {
        Action::Start
    } else if wants("loaded") {
        Action::Load
    } else {
        Action::Submit
    }
}

/// The action of a `PUT /units/<name>`: its `op`, else what its body asks.
fn put_action(query: &str, body: Option<&[u8]>) -> Action {
    /// The two fields of a unit entity that name the action.
    #[derive(serde::Deserialize, Default)]
    #[serde(default, rename_all = "camelCase")]
    struct Asked {
        desired_state: String,
        // Counted, never kept: a body of a million options costs no memory here.
        options: Vec<serde::de::IgnoredAny>,
    }
    let asked: Asked = body
        .and_then(|b| serde_json::from_slice(b).ok())
        .unwrap_or_default();
    let by_state = |or: Action| match asked.desired_state.as_str() {
        "launched" => Action::Start,
        "loaded" => Action::Load,
        _ => or,
    };
    let op = query_values(query, wire::OP).first().map(|s| Op::parse(s));
    match op {
        Some(Some(Op::Stop)) => Action::Stop,
        Some(Some(Op::Unload)) => Action::Unload,
        Some(Some(Op::Restart)) => Action::Restart,
        Some(Some(Op::AdvanceRollout | Op::FinishRollout)) => Action::Replace,
        Some(Some(Op::Raise)) => by_state(Action::Load),
        // An op that is none: the handler refuses it (400); a viewer is refused first.
        Some(None) => Action::Submit,
        None if asked.options.is_empty() => match asked.desired_state.as_str() {
            "inactive" => Action::Unload,
            _ => by_state(Action::Submit),
        },
        None if replaces(query) => Action::Replace,
        None => by_state(Action::Submit),
    }
}

/// Whether a `PUT` with options asks for a replace (the extensions' replace parameters).
fn replaces(query: &str) -> bool {
    let flag = |k: &str| {
        query_values(query, k)
            .iter()
            .any(|v| v == "true" || v == "1")
    };
    let expects_content = query_values(query, wire::EXPECT)
        .first()
        .is_some_and(|v| v != wire::EXPECT_ABSENT);
    expects_content || flag(wire::ROLLING) || flag(wire::RESCHEDULE) || flag(wire::NO_RESTART)
}

/// A subject of the role keys: a certificate's CN, or one of its O values.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Subject {
    Cn(String),
    O(String),
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Subject::Cn(n) => write!(f, "CN={n}"),
            Subject::O(n) => write!(f, "O={n}"),
        }
    }
}

/// Why a role entry or the role table cannot be taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RolesError {
    #[error("{0:?} is not CN=<name> or O=<group>")]
    BadSubject(String),
    #[error("{subject} is given two roles, {first} and {second}")]
    TwoRoles {
        subject: Subject,
        first: Role,
        second: Role,
    },
}

impl std::str::FromStr for Subject {
    type Err = RolesError;

    /// `CN=<name>` or `O=<group>` (the attribute name in any case); the name is taken as
    /// written, and may not be empty or hold control characters.
    fn from_str(s: &str) -> Result<Subject, RolesError> {
        let bad = || RolesError::BadSubject(s.to_owned());
        let (attr, name) = s.split_once('=').ok_or_else(bad)?;
        if name.is_empty() || name.chars().any(char::is_control) || name.trim() != name {
            return Err(bad());
        }
        match attr.to_ascii_uppercase().as_str() {
            "CN" => Ok(Subject::Cn(name.to_owned())),
            "O" => Ok(Subject::O(name.to_owned())),
            _ => Err(bad()),
        }
    }
}

/// Which subjects hold which role, and which hold none whatever else they name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Roles {
    by_subject: BTreeMap<Subject, Role>,
    /// `api_deny` (issue 37): a certificate naming any of these has no role, even one its
    /// other CN or groups would give.
    denied: std::collections::BTreeSet<Subject>,
}

impl Roles {
    /// The table of `entries`; the same subject in two roles is an error (naming one twice
    /// in the same role is not).
    pub fn new(entries: impl IntoIterator<Item = (Subject, Role)>) -> Result<Roles, RolesError> {
        let mut by_subject: BTreeMap<Subject, Role> = BTreeMap::new();
        for (subject, role) in entries {
            match by_subject.get(&subject) {
                Some(&first) if first != role => {
                    let (first, second) = (first.min(role), first.max(role));
                    return Err(RolesError::TwoRoles {
                        subject,
                        first,
                        second,
                    });
                }
                _ => {
                    by_subject.insert(subject, role);
                }
            }
        }
        Ok(Roles {
            by_subject,
            denied: Default::default(),
        })
    }

    /// The same table, with `denied` subjects holding no role whatever else they name.
    pub fn denying(mut self, denied: impl IntoIterator<Item = Subject>) -> Roles {
        self.denied.extend(denied);
        self
    }

    pub fn is_empty(&self) -> bool {
        self.by_subject.is_empty()
    }

    /// The role of a certificate: none if it names a denied subject (a CN or any group),
    /// else its CN's, else the highest of its groups'.
    pub fn role_of(&self, cert: &CertSubject) -> Option<Role> {
        let denied = cert
            .common_names
            .iter()
            .map(|cn| Subject::Cn(cn.clone()))
            .chain(cert.organizations.iter().map(|o| Subject::O(o.clone())))
            .any(|s| self.denied.contains(&s));
        if denied {
            return None;
        }
        let by_cn = cert
            .common_names
            .iter()
            .filter_map(|cn| self.by_subject.get(&Subject::Cn(cn.clone())))
            .max();
        by_cn.copied().or_else(|| {
            cert.organizations
                .iter()
                .filter_map(|o| self.by_subject.get(&Subject::O(o.clone())))
                .max()
                .copied()
        })
    }
}

/// The subject of a client certificate, as far as the roles read it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CertSubject {
    pub common_names: Vec<String>,
    pub organizations: Vec<String>,
}

impl CertSubject {
    /// The subject of a DER certificate; `None` when it cannot be parsed (the handshake
    /// verified it, so this does not happen with a certificate rustls accepted).
    pub fn from_der(der: &[u8]) -> Option<CertSubject> {
        use x509_parser::prelude::{FromDer, X509Certificate};
        let (_, cert) = X509Certificate::from_der(der).ok()?;
        let subject = cert.subject();
        let strings = |attrs: Vec<&x509_parser::x509::AttributeTypeAndValue<'_>>| {
            attrs
                .into_iter()
                .filter_map(|a| a.as_str().ok().map(str::to_owned))
                .collect()
        };
        Some(CertSubject {
            common_names: strings(subject.iter_common_name().collect()),
            organizations: strings(subject.iter_organization().collect()),
        })
    }
}

impl fmt::Display for CertSubject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .common_names
            .iter()
            .map(|n| format!("CN={n}"))
            .chain(self.organizations.iter().map(|o| format!("O={o}")))
            .collect();
        if parts.is_empty() {
            f.write_str("with no CN or O")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}

/// Who sent a request, as [`crate::serve`] saw the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// The unix socket: its mode and group decide who may connect.
    Local,
    /// Plain TCP: no identity (fleetd serves it on loopback only, unless told otherwise).
    Plain,
    /// TLS with a client certificate of the CA; `None`: its subject could not be read.
    Certificate(Option<CertSubject>),
}

/// The uid of the process at the other end of the unix socket, when the kernel said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalUid(pub Option<u32>);

/// The client a request comes from and the role it holds; the router adds it to each
/// request's extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub peer: Peer,
    /// `None`: a certificate that no role entry names.
    pub role: Option<Role>,
}

impl Principal {
    /// The principal of `peer` (`None`: the router called in-process, as tests do, which
    /// counts as the unix socket). `roles` None: this API checks no certificate's role (a
    /// library default; fleetd always gives its table).
    pub fn of(peer: Option<&Peer>, roles: Option<&Roles>) -> Principal {
        let peer = peer.cloned().unwrap_or(Peer::Local);
        let role = match (&peer, roles) {
            (Peer::Local | Peer::Plain, _) | (Peer::Certificate(_), None) => Some(Role::Admin),
            (Peer::Certificate(Some(subject)), Some(roles)) => roles.role_of(subject),
            (Peer::Certificate(None), Some(_)) => None,
        };
        Principal { peer, role }
    }

    /// Who a user action recorded as an event is by (issue 41): the certificate's subject,
    /// `local uid <n>` on the unix socket (`uid`), `plain tcp`.
    pub fn who(&self, uid: Option<LocalUid>) -> String {
        match (&self.peer, uid) {
            (Peer::Local, Some(LocalUid(Some(uid)))) => format!("local uid {uid}"),
            _ => self.shown(),
        }
    }

    /// The subject shown in a refusal and in logs: `CN=bob`, `local`, `plain tcp`.
    pub fn shown(&self) -> String {
        match &self.peer {
            Peer::Local => "local".to_owned(),
            Peer::Plain => "plain tcp".to_owned(),
            Peer::Certificate(Some(s)) => s.to_string(),
            Peer::Certificate(None) => "with an unreadable subject".to_owned(),
        }
    }
}

/// Why a request is refused before it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A certificate no role entry names (its subject shown).
    NoRole(String),
    /// The role may not do the action.
    Forbidden { role: Role, action: Action },
}

/// The decision: `Ok` to go on, or why not. A request with no action (no such route or
/// method) goes on only with a role: the router answers it without the registry. The
/// health question needs no role ([`Action::Health`]).
pub fn decide(principal: &Principal, action: Option<Action>) -> Result<(), Refusal> {
    if action == Some(Action::Health) {
        return Ok(());
    }
    let Some(role) = principal.role else {
        return Err(Refusal::NoRole(principal.shown()));
    };
    match action {
        Some(action) if !permits(role, action) => Err(Refusal::Forbidden { role, action }),
        Some(_) | None => Ok(()),
    }
}

#[cfg(test)]
mod tests;
