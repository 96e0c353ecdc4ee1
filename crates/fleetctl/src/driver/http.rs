//! [`Cluster`] over fleetd's HTTP API: fleetctl's `--driver=api`. Every call is a request of
//! fleet's v1 API in its full view (`?view=full`, docs/api.md "Extensions"), built and read
//! with fleet-ops' wire entities and conversions, so the server (which runs the etcd side of
//! the same interface) and this client cannot drift. Listings follow `nextPageToken` to the
//! last page. An error entity becomes the [`OpsError`] it stands for, so a command prints
//! what it prints over etcd.
//!
//! No decision is made here: the server decides every write.

use fleet_api_wire::convert;
use fleet_api_wire::wire::{self, MachinePage, UnitPage, UnitStatePage, WriteResult};
use fleet_core::{DesiredState, MachineId, UnitName};
use fleet_ops::{
    Cluster, Destroyed, DrainStatus, Expect, Explanation, MachineListing, OpsError, PutOutcome,
    PutRequest, Restarted, StateChange, StateFilter, StateListing, StateView, UnitListing,
    UnitView,
};
use fleet_registry::MetadataChange;
use fleet_registry::kv::TlsFiles;
use http::Method;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use super::answer::{Paged, check, decode};
use super::transport::{Answer, EndpointError, Transport};
use super::watch::HttpChanges;

/// How often a wait asks the API whether its units changed, once it has waited a while.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// A wait's first polls come this often: most waits end within a few hundred milliseconds
/// (one unit launches in ~60 ms at 100,000 units), and a first poll after a whole interval
/// made a blocking start over the API take ~290 ms where over etcd it took 61 ms
/// (docs/benchmarks.md, "fleetctl at 100,000 units"). After [`FAST_POLLS`] of them each poll
/// waits twice as long as the one before, up to the interval.
pub const FIRST_POLL: Duration = Duration::from_millis(20);

/// How many polls come [`FIRST_POLL`] apart before the pauses double: about the first
/// quarter second. Doubling from the first poll on (20, 40, 80 ms) put the third poll 140 ms
/// in, and a unit active after 65 ms was seen then: a blocking start over the API took
/// 126 ms.
pub const FAST_POLLS: u32 = 10;

/// Units per page asked for (the full view's `pageSize`): a page of units reads only its own
/// keys (docs/api.md "Page tokens"), so 100,000 units are 2 requests that read each key once.
/// States and machines are asked for whole (`pageSize=0`): fleetd reads the whole listing
/// for each of their pages, so 100,000 states in pages of 65,535 cost it two whole reads.
pub const PAGE_SIZE: u16 = u16::MAX;

/// Names per listing request: a `start` of 10,000 units asks in 20 requests (URLs of ~15 kB)
/// rather than with one URL of 10,000 parameters. Each request costs fleetd a snapshot, so
/// fewer is better, up to what proxies and servers take in a request line.
pub(super) const NAMES_PER_REQUEST: usize = 500;

/// Bytes escaped in a path segment or query value: all but RFC 3986's unreserved ones and
/// `@` (common in unit names, and left alone by fleet's client).
const ESCAPED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'@');

/// A client of one fleetd's API.
#[derive(Debug, Clone)]
pub struct HttpCluster {
    transport: Arc<Transport>,
    poll: Duration,
    page_size: u16,
    /// States and machines in one page each (`pageSize=0`), not pages of `page_size`.
    whole_listings: bool,
}

impl HttpCluster {
    async fn put_expecting(
        &self,
        req: PutRequest,
        expect: Option<Expect>,
    ) -> Result<PutOutcome, OpsError> {
        let mut query = Vec::new();
        match expect {
            None => {}
            Some(Expect::Absent) => query.push((wire::EXPECT, wire::EXPECT_ABSENT.to_owned())),
            Some(Expect::Content(hash)) => query.push((wire::EXPECT, hash.to_string())),
        }
        for (on, key) in [
            (req.how.no_restart, wire::NO_RESTART),
            (req.how.reschedule, wire::RESCHEDULE),
            (req.how.rolling, wire::ROLLING),
        ] {
            if on {
                query.push((key, "true".to_owned()));
            }
        }
        let body = unit_body(&req);
        let result = self
            .write(Method::PUT, &req.name, &query, Some(&body))
            .await?;
        convert::put_from_wire(&result)
    }

    /// A client of the API at `endpoint` (fleet's forms: `unix:///path`, `http://`,
    /// `https://` with `tls`), each request within `request_timeout`. Connects to nothing yet.
    pub fn new(
        endpoint: &str,
        tls: &TlsFiles,
        request_timeout: Duration,
    ) -> Result<HttpCluster, EndpointError> {
        Ok(HttpCluster {
            transport: Arc::new(Transport::new(endpoint, tls, request_timeout)?.guiding()),
            poll: POLL_INTERVAL,
            page_size: PAGE_SIZE,
            whole_listings: true,
        })
    }

    /// Listings ask for pages of `size` entries instead of [`PAGE_SIZE`] (at least 1), the
    /// states and machines too instead of whole.
    pub fn with_page_size(mut self, size: u16) -> HttpCluster {
        self.page_size = size.max(1);
        self.whole_listings = false;
        self
    }

    /// Waits poll every `poll` instead of [`POLL_INTERVAL`].
    pub fn with_poll_interval(mut self, poll: Duration) -> HttpCluster {
        self.poll = poll;
        self
    }

    pub(super) fn poll_interval(&self) -> Duration {
        self.poll
    }

    /// A listing that fleetd reads whole for each page (states, machines): in one page
    /// (`pageSize=0`) unless pages of a size were asked for; from a server that refuses
    /// that (400: one from before it), in pages.
    async fn whole<P: DeserializeOwned + Paged>(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<Vec<P>, OpsError> {
        if !self.whole_listings {
            return self.pages(path, query, self.page_size.to_string()).await;
        }
        match self
            .pages(path, query, wire::WHOLE_LISTING.to_owned())
            .await
        {
            Err(OpsError::Api { code: 400, .. }) => {
                self.pages(path, query, self.page_size.to_string()).await
            }
            other => other,
        }
    }

    /// Every page of a listing at `path` with `query`, in order, `page_size` entries a page.
    async fn pages<P: DeserializeOwned + Paged>(
        &self,
        path: &str,
        query: &[(&str, String)],
        page_size: String,
    ) -> Result<Vec<P>, OpsError> {
        let mut pages = Vec::new();
        let mut token = String::new();
        loop {
            let mut q = query.to_vec();
            q.push((wire::VIEW, wire::VIEW_FULL.to_owned()));
            q.push((wire::PAGE_SIZE, page_size.clone()));
            if !token.is_empty() {
                q.push(("nextPageToken", token.clone()));
            }
            let answer = self.send(Method::GET, path, &q, None).await?;
            let page: P = decode(&answer, None)?;
            token = page.next_token().to_owned();
            pages.push(page);
            if token.is_empty() {
                return Ok(pages);
            }
        }
    }

    pub(super) async fn send(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Vec<u8>>,
    ) -> Result<Answer, OpsError> {
        let uri = self.path_and_query(path, query);
        self.transport.send(method, &uri, body).await
    }

    /// `path` with `query`, its values escaped.
    pub(super) fn path_and_query(&self, path: &str, query: &[(&str, String)]) -> String {
        let mut uri = path.to_owned();
        for (i, (k, v)) in query.iter().enumerate() {
            uri.push(if i == 0 { '?' } else { '&' });
            uri.push_str(k);
            uri.push('=');
            uri.extend(utf8_percent_encode(v, ESCAPED));
        }
        uri
    }

    pub(super) fn transport(&self) -> &Transport {
        &self.transport
    }

    /// A `PUT /units/<name>?view=full&...` with `body`, answered by a WriteResult.
    async fn write(
        &self,
        method: Method,
        name: &UnitName,
        query: &[(&str, String)],
        body: Option<&wire::Unit>,
    ) -> Result<WriteResult, OpsError> {
        let mut q = vec![(wire::VIEW, wire::VIEW_FULL.to_owned())];
        q.extend_from_slice(query);
        let body = match body {
            Some(unit) => Some(serde_json::to_vec(unit).map_err(|e| encoding(name, e))?),
            None => None,
        };
        let answer = self.send(method, &unit_path(name), &q, body).await?;
        decode(&answer, Some(name))
    }

    /// `PUT ?op=...` with a body of `{}` or just a `desiredState`.
    async fn op(
        &self,
        name: &UnitName,
        op: wire::Op,
        desired: Option<DesiredState>,
        more: &[(&str, String)],
    ) -> Result<WriteResult, OpsError> {
        let mut query = vec![(wire::OP, op.as_str().to_owned())];
        query.extend_from_slice(more);
        let body = wire::Unit {
            desired_state: desired.map(|d| d.to_string()).unwrap_or_default(),
            ..wire::Unit::default()
        };
        self.write(Method::PUT, name, &query, Some(&body)).await
    }

    /// The full-view units of `names` (all when `None`), sorted, with what was skipped.
    async fn unit_pages(
        &self,
        names: Option<&BTreeSet<UnitName>>,
    ) -> Result<UnitListing, OpsError> {
        let mut units = BTreeMap::new();
        let mut skipped = Vec::new();
        // In pages, not whole: a page from etcd costs the same at any size of the
        // registry, so each request keeps within the request timeout at a million units.
        for query in name_queries(names) {
            let size = self.page_size.to_string();
            for page in self.pages::<UnitPage>("/units", &query, size).await? {
                for unit in &page.units {
                    let view = convert::unit_from_wire(unit)?;
                    units.insert(view.name().clone(), view);
                }
                extend_new(&mut skipped, page.skipped);
            }
        }
        Ok(UnitListing {
            units: units.into_values().collect(),
            skipped,
        })
    }

    /// Every state a `/state` query lists, with what the listing skipped.
    async fn state_pages(&self, query: &[(&str, String)]) -> Result<StateListing, OpsError> {
        let mut listing = StateListing::default();
        for page in self.whole::<UnitStatePage>("/state", query).await? {
            for s in &page.states {
                listing.states.push(convert::state_from_wire(s)?);
            }
            extend_new(&mut listing.skipped, page.skipped);
        }
        Ok(listing)
    }

    /// The states of any of `names` (one query per [`NAMES_PER_REQUEST`]), sorted by unit
    /// then machine.
    pub(super) async fn states_of(
        &self,
        names: &BTreeSet<UnitName>,
    ) -> Result<Vec<StateView>, OpsError> {
        let mut states = Vec::new();
        for query in name_queries(Some(names)) {
            states.extend(self.state_pages(&query).await?.states);
        }
        states.sort_by(|a, b| (&a.name, &a.machine).cmp(&(&b.name, &b.machine)));
        Ok(states)
    }
}

impl Cluster for HttpCluster {
    type Changes = HttpChanges;

    async fn units(&self, names: Option<&BTreeSet<UnitName>>) -> Result<UnitListing, OpsError> {
        self.unit_pages(names).await
    }

    async fn unit(&self, name: &UnitName) -> Result<Option<UnitView>, OpsError> {
        let q = [(wire::VIEW, wire::VIEW_FULL.to_owned())];
        let answer = self.send(Method::GET, &unit_path(name), &q, None).await?;
        match decode::<wire::Unit>(&answer, Some(name)) {
            Ok(unit) => convert::unit_from_wire(&unit).map(Some),
            Err(OpsError::NoSuchUnit(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn states(&self, filter: &StateFilter) -> Result<StateListing, OpsError> {
        let mut query = Vec::new();
        if let Some(m) = &filter.machine {
            query.push((wire::MACHINE_ID, m.to_string()));
        }
        if let Some(u) = &filter.unit {
            query.push((wire::UNIT_NAME, u.to_string()));
        }
        self.state_pages(&query).await
    }

    async fn machines(&self) -> Result<MachineListing, OpsError> {
        let mut listing = MachineListing::default();
        for page in self.whole::<MachinePage>("/machines", &[]).await? {
            for m in &page.machines {
                let machine = convert::machine_from_wire(m)?;
                if m.leader {
                    listing.leader = Some(machine.id.clone());
                }
                listing.machines.push(machine);
            }
            extend_new(&mut listing.skipped, page.skipped);
            if listing.notice.is_none() && !page.disruption_notice.is_empty() {
                listing.notice = Some(page.disruption_notice);
            }
            if listing.leader_notice.is_none() && !page.engine_leader_notice.is_empty() {
                listing.leader_notice = Some(page.engine_leader_notice);
            }
        }
        let answer = self.send(Method::GET, "/drains", &[], None).await?;
        listing.drained = decode::<wire::DrainList>(&answer, None)?.drains;
        Ok(listing)
    }

    async fn drain(&self, machine: &MachineId, parallel: u32) -> Result<DrainStatus, OpsError> {
        let query = [(wire::PARALLEL, parallel.to_string())];
        let answer = self
            .send(Method::PUT, &drain_path(machine), &query, None)
            .await?;
        decode(&answer, None)
    }

    async fn undrain(&self, machine: &MachineId) -> Result<bool, OpsError> {
        let answer = self
            .send(Method::DELETE, &drain_path(machine), &[], None)
            .await?;
        Ok(decode::<wire::Undrained>(&answer, None)?.was_drained)
    }

    async fn drain_status(&self, machine: &MachineId) -> Result<DrainStatus, OpsError> {
        let answer = self
            .send(Method::GET, &drain_path(machine), &[], None)
            .await?;
        decode(&answer, None)
    }

    async fn explain(&self, name: &UnitName) -> Result<Explanation, OpsError> {
        let path = format!("/explain/{}", utf8_percent_encode(name.as_str(), ESCAPED));
        let answer = self.send(Method::GET, &path, &[], None).await?;
        decode(&answer, Some(name))
    }

    async fn put(&self, req: PutRequest) -> Result<PutOutcome, OpsError> {
        self.put_expecting(req, None).await
    }

    /// Many units per request (`POST /units`), several requests in flight
    /// ([`super::creates`]); one request per unit from a server without that extension.
    async fn create_many(&self, reqs: Vec<PutRequest>) -> fleet_ops::Created {
        self.create_batched(reqs).await
    }

    /// The server checks `expect` on the record it writes over (`?expect=`), so of two
    /// clients replacing the same version only one wins, as over etcd.
    async fn put_if(&self, req: PutRequest, expect: Expect) -> Result<PutOutcome, OpsError> {
        self.put_expecting(req, Some(expect)).await
    }

    async fn set_state(
        &self,
        name: &UnitName,
        change: StateChange,
    ) -> Result<Option<UnitView>, OpsError> {
        let result = match change {
            StateChange::Stop => self.op(name, wire::Op::Stop, None, &[]).await?,
            StateChange::Unload => self.op(name, wire::Op::Unload, None, &[]).await?,
            StateChange::Raise(to) => self.op(name, wire::Op::Raise, Some(to), &[]).await?,
        };
        convert::set_state_from_wire(&result)
    }

    async fn restart(&self, name: &UnitName) -> Result<Restarted, OpsError> {
        let result = self.op(name, wire::Op::Restart, None, &[]).await?;
        convert::restart_from_wire(&result)
    }

    async fn destroy(&self, name: &UnitName) -> Result<Destroyed, OpsError> {
        let result = self.write(Method::DELETE, name, &[], None).await?;
        convert::destroyed_from_wire(&result)
    }

    async fn change_metadata(&self, changes: &[MetadataChange]) -> Result<(), OpsError> {
        let ops: Vec<wire::MetadataOp> = changes.iter().map(metadata_op).collect();
        let body = serde_json::to_vec(&ops).map_err(|e| OpsError::Transport {
            what: "encoding a metadata patch".into(),
            cause: Box::new(e),
        })?;
        let answer = self
            .send(Method::PATCH, "/machines", &[], Some(body))
            .await?;
        check(&answer, None)
    }

    async fn advance_rollout(
        &self,
        name: &UnitName,
        machines: &[MachineId],
    ) -> Result<UnitView, OpsError> {
        let more: Vec<(&str, String)> = machines
            .iter()
            .map(|m| (wire::MACHINE_ID, m.to_string()))
            .collect();
        let result = self.op(name, wire::Op::AdvanceRollout, None, &more).await?;
        convert::rollout_advanced_from_wire(&result)
    }

    async fn finish_rollout(&self, name: &UnitName) -> Result<(), OpsError> {
        let result = self.op(name, wire::Op::FinishRollout, None, &[]).await?;
        match result.outcome {
            wire::Outcome::RolloutFinished => Ok(()),
            other => Err(bad_answer(format!(
                "outcome {other:?} does not answer finishRollout"
            ))),
        }
    }

    async fn watch(&self, names: BTreeSet<UnitName>) -> Result<HttpChanges, OpsError> {
        HttpChanges::start(self.clone(), names).await
    }

    async fn events(
        &self,
        filter: &fleet_registry::EventFilter,
    ) -> Result<fleet_ops::EventListing, OpsError> {
        self.event_page(filter).await
    }

    async fn follow_events(
        &self,
        filter: fleet_registry::EventFilter,
    ) -> Result<fleet_ops::EventStream, OpsError> {
        self.event_stream(filter).await
    }

    async fn changes(&self) -> Result<fleet_ops::ChangeStream, OpsError> {
        self.open_changes()
            .await
            .map_err(super::changes::Unopened::into_error)
    }
}

/// The Unit entity a put of `req` sends: its name, options and desired state.
pub(super) fn unit_body(req: &PutRequest) -> wire::Unit {
    wire::Unit {
        name: req.name.to_string(),
        options: req
            .file
            .as_ref()
            .map(convert::options_to_wire)
            .unwrap_or_default(),
        desired_state: req.desired.map(|d| d.to_string()).unwrap_or_default(),
        ..wire::Unit::default()
    }
}

fn drain_path(machine: &MachineId) -> String {
    format!("/drains/{}", utf8_percent_encode(machine.as_str(), ESCAPED))
}

pub(super) fn unit_path(name: &UnitName) -> String {
    format!("/units/{}", utf8_percent_encode(name.as_str(), ESCAPED))
}

/// The `unitName` queries of a listing of `names`: none for every unit, else one per
/// [`NAMES_PER_REQUEST`] names (no request at all for no names).
fn name_queries(names: Option<&BTreeSet<UnitName>>) -> Vec<Vec<(&'static str, String)>> {
    let Some(names) = names else {
        return vec![Vec::new()];
    };
    let names: Vec<&UnitName> = names.iter().collect();
    names
        .chunks(NAMES_PER_REQUEST)
        .map(|chunk| {
            chunk
                .iter()
                .map(|n| (wire::UNIT_NAME, n.to_string()))
                .collect()
        })
        .collect()
}

/// Appends what `more` has that `all` has not (every page of a listing may repeat what the
/// listing as a whole skipped).
fn extend_new(all: &mut Vec<String>, more: Vec<String>) {
    for s in more {
        if !all.contains(&s) {
            all.push(s);
        }
    }
}

fn metadata_op(change: &MetadataChange) -> wire::MetadataOp {
    match change {
        MetadataChange::Set {
            machine,
            key,
            value,
        } => wire::MetadataOp {
            op: "add".into(),
            path: format!("/{machine}/metadata/{key}"),
            value: Some(wire::MetadataValue::Wrapped {
                value: value.clone(),
            }),
        },
        MetadataChange::Remove { machine, key } => wire::MetadataOp {
            op: "remove".into(),
            path: format!("/{machine}/metadata/{key}"),
            value: None,
        },
    }
}

fn encoding(name: &UnitName, e: serde_json::Error) -> OpsError {
    OpsError::Transport {
        what: format!("encoding the request about {name}"),
        cause: Box::new(e),
    }
}

fn bad_answer(why: String) -> OpsError {
    OpsError::Transport {
        what: "the API answered something this fleetctl cannot read".into(),
        cause: why.into(),
    }
}

#[cfg(test)]
mod tests;
