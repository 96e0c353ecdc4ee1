//! Both sides of the peer check (issue 36; `fleet_agent::witness`, docs/guarantees.md,
//! promise 2): the question this fleetd asks its peers while it cannot reach etcd
//! ([`PeerWitnesses`]), and its own answer when a peer asks it ([`LeaseReach`], served as
//! `GET /fleet/v1/health`).
//!
//! The peers are the other machines whose presence publishes an API address, read from
//! etcd at start and every [`REFRESH`]; while fewer than [`MAX_ASKED`] are known, each
//! registration and departure is followed as it happens (a watch of the presences: machines
//! that boot together register at about the same time, and one up first must not wait for
//! the next read to know the others). A machine cut off knows them from before the cut. At most [`MAX_ASKED`] of them, chosen at random, are asked at once, each for at
//! most [`ASK_TIMEOUT`]; the first that reached etcd ends the question. Over `https://`,
//! fleetd presents its own API certificate (`api_certfile`, which then needs `clientAuth`)
//! and trusts `api_cafile`; without them it asks only `http://` peers.

use bytes::Bytes;
use fleet_agent::witness::{Answer, Asked, Evidence, Witnesses};
use fleet_api::health::Reach;
use fleet_registry::kv::Kv;
use fleet_registry::{Delta, MachineRole, PeerChange, Presence};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use rand::seq::IndexedRandom;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::ServerName;
use tracing::{Instrument, debug, info};

/// How long one peer has to answer, connection and TLS included: its answer must come while
/// this machine's lease may still be alive (docs/guarantees.md, promise 2).
pub const ASK_TIMEOUT: Duration = Duration::from_millis(750);

/// How long a machine asked spends probing etcd when its last renewal is too old to answer.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// How many peers are asked at once: one that reached etcd is enough.
pub const MAX_ASKED: usize = 5;

/// How often the list of peers is read again.
pub const REFRESH: Duration = Duration::from_secs(30);

/// The largest answer read from a peer.
const MAX_ANSWER: usize = 4096;

/// A peer, as this machine asks it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Peer {
    machine: String,
    /// `https://HOST:PORT` or `http://HOST:PORT`, as the peer advertises its API.
    url: String,
}

/// Why [`PeerWitnesses::follow`] returned.
#[derive(Debug, PartialEq, Eq)]
enum Followed {
    /// Read the peers again.
    Stale,
    ShutDown,
}

/// The other machines, as this fleetd asks them.
#[derive(Clone)]
pub struct PeerWitnesses {
    me: String,
    peers: Arc<RwLock<Vec<Peer>>>,
    tls: Option<TlsConnector>,
}

impl std::fmt::Debug for PeerWitnesses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerWitnesses")
            .field("me", &self.me)
            .field("peers", &self.peers)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl PeerWitnesses {
    /// Witnesses that know no peer yet; `tls`: how to ask `https://` peers.
    pub fn new(me: String, tls: Option<TlsConnector>) -> PeerWitnesses {
        PeerWitnesses {
            me,
            peers: Arc::default(),
            tls,
        }
    }

    /// Reads the peers from etcd now and every [`REFRESH`] until `shutdown`; in between,
    /// while fewer than [`MAX_ASKED`] can be asked, follows each registration as it happens
    /// (a watch of the presences), so a machine up before its peers learns of them at once.
    pub fn spawn_refresh<K: Kv>(
        &self,
        tasks: &mut tokio::task::JoinSet<anyhow::Result<()>>,
        role: MachineRole<K>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let this = self.clone();
        let task = async move {
            let mut backoff = fleet_core::Backoff::new(Duration::from_secs(1), REFRESH);
            loop {
                let wait = match role.peers_at().await {
                    Ok(listing) => {
                        backoff.reset();
                        let follow = this.follow(&role, listing, &mut shutdown);
                        if follow.await == Followed::ShutDown {
                            return Ok(());
                        }
                        Duration::ZERO
                    }
                    Err(e) => {
                        debug!(error = %e, "reading the peers failed; keeping the last list");
                        backoff.next_delay()
                    }
                };
                tokio::select! {
                    _ = shutdown.changed() => return Ok(()),
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        };
        tasks.spawn(task.instrument(tracing::info_span!("witnesses")));
    }

    /// Takes `listing` as the peers, then applies each registration and departure while
    /// fewer than [`MAX_ASKED`] peers can be asked, until [`REFRESH`] has passed or the
    /// watch cannot say what changed: then the caller reads them all again.
    async fn follow<K: Kv>(
        &self,
        role: &MachineRole<K>,
        listing: fleet_registry::Listing<Vec<fleet_core::MachineInfo>>,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Followed {
        let mut known: BTreeMap<fleet_core::MachineId, fleet_core::MachineInfo> = listing
            .items
            .into_iter()
            .map(|m| (m.id.clone(), m))
            .collect();
        self.set_peers(known.values().cloned().collect());
        let mut hints =
            (self.askable() < MAX_ASKED).then(|| role.watch_peers(listing.revision + 1));
        let refresh = tokio::time::sleep(REFRESH);
        tokio::pin!(refresh);
        loop {
            let changed = async {
                match hints.as_mut() {
                    Some(h) => h.changed().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.changed() => return Followed::ShutDown,
                () = &mut refresh => return Followed::Stale,
                c = changed => if c.is_none() { return Followed::Stale },
            }
            let Some(h) = hints.as_mut() else { continue };
            let Delta::Events(events) = h.take() else {
                return Followed::Stale;
            };
            for event in &events {
                match role.peer_change(event) {
                    PeerChange::Put(m) => {
                        known.insert(m.id.clone(), m);
                    }
                    PeerChange::Removed(m) => {
                        known.remove(&m);
                    }
                    PeerChange::Unreadable => return Followed::Stale,
                }
            }
            known.retain(|id, _| id.to_string() != self.me);
            self.set_peers(known.values().cloned().collect());
            if self.askable() >= MAX_ASKED {
                hints = None;
            }
        }
    }

    /// How many peers can be asked.
    fn askable(&self) -> usize {
        self.peers.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    fn set_peers(&self, machines: Vec<fleet_core::MachineInfo>) {
        let askable = |url: &str| {
            url.starts_with("http://") || (url.starts_with("https://") && self.tls.is_some())
        };
        let peers: Vec<Peer> = machines
            .into_iter()
            .filter(|m| m.id.to_string() != self.me && askable(&m.api))
            .map(|m| Peer {
                machine: m.id.to_string(),
                url: m.api,
            })
            .collect();
        let mut held = self.peers.write().unwrap_or_else(|e| e.into_inner());
        if held.len() != peers.len() {
            info!(
                peers = peers.len(),
                "peers to ask when etcd does not answer"
            );
        }
        *held = peers;
    }

    async fn asking(&self, within: Duration) -> Evidence {
        let chosen: Vec<Peer> = {
            let peers = self.peers.read().unwrap_or_else(|e| e.into_inner());
            peers
                .choose_multiple(&mut rand::rng(), MAX_ASKED)
                .cloned()
                .collect()
        };
        let mut pending: FuturesUnordered<_> = chosen
            .iter()
            .map(|peer| async move {
                let answer = tokio::time::timeout(ASK_TIMEOUT, ask(peer, within, &self.tls)).await;
                match answer {
                    Ok(Ok(a)) => Some(a),
                    Ok(Err(why)) => {
                        debug!(peer = %peer.machine, url = %peer.url, why = %why, "peer did not answer");
                        None
                    }
                    Err(_) => {
                        debug!(peer = %peer.machine, url = %peer.url, "peer did not answer in time");
                        None
                    }
                }
            })
            .collect();
        let mut answers = Vec::new();
        while let Some(answer) = pending.next().await {
            let Some(answer) = answer.filter(|a| a.machine != self.me) else {
                continue;
            };
            let reached = answer.reached;
            answers.push(answer);
            if reached {
                break;
            }
        }
        let evidence = Evidence::of(chosen.len(), &answers);
        debug!(evidence = %evidence, "peers asked whether they reach etcd");
        evidence
    }
}

impl Witnesses for PeerWitnesses {
    fn ask(&self, within: Duration) -> Asked<'_> {
        Box::pin(self.asking(within))
    }
}

/// The witnesses of this fleetd, reading their peers until `shutdown`: none with
/// `disable_fence` (nothing to decide).
pub fn spawn<K: Kv>(
    tasks: &mut tokio::task::JoinSet<anyhow::Result<()>>,
    config: &crate::config::Config,
    registry: &fleet_registry::Registry<K>,
    machine: &fleet_core::MachineId,
    shutdown: &watch::Receiver<bool>,
) -> anyhow::Result<Option<Arc<dyn Witnesses>>> {
    if config.disable_fence {
        return Ok(None);
    }
    let tls = match &config.api.tls {
        Some(files) => Some(crate::api::tls::connector(files)?),
        None => None,
    };
    let witnesses = PeerWitnesses::new(machine.to_string(), tls);
    let role = MachineRole::new(registry.clone(), machine.clone());
    witnesses.spawn_refresh(tasks, role, shutdown.clone());
    Ok(Some(Arc::new(witnesses)))
}

/// `GET <url>/fleet/v1/health?within=<ms>` of one peer.
async fn ask(peer: &Peer, within: Duration, tls: &Option<TlsConnector>) -> Result<Answer, String> {
    let (secure, authority) = match peer.url.split_once("://") {
        Some(("https", rest)) => (true, rest),
        Some(("http", rest)) => (false, rest),
        _ => return Err("not an http(s) URL".into()),
    };
    let authority = authority.trim_end_matches('/');
    let tcp = tokio::net::TcpStream::connect(authority)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let path = format!(
        "/fleet/v1/health?{}={}",
        fleet_api::health::WITHIN,
        within.as_millis().max(1)
    );
    let body = if secure {
        let connector = tls.as_ref().ok_or("https without api tls files")?;
        let host = authority
            .rsplit_once(':')
            .map_or(authority, |(h, _)| h)
            .trim_start_matches('[')
            .trim_end_matches(']');
        let name = ServerName::try_from(host.to_owned()).map_err(|e| format!("{host}: {e}"))?;
        let stream = connector
            .connect(name, tcp)
            .await
            .map_err(|e| format!("tls: {e}"))?;
        get(stream, authority, &path).await?
    } else {
        get(tcp, authority, &path).await?
    };
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Wire {
        #[serde(rename = "machineID")]
        machine_id: String,
        etcd_reached: bool,
    }
    let wire: Wire = serde_json::from_slice(&body).map_err(|e| format!("answer: {e}"))?;
    Ok(Answer {
        machine: wire.machine_id,
        reached: wire.etcd_reached,
    })
}

/// One HTTP/1.1 GET over `io`: the body of a 200, at most [`MAX_ANSWER`] bytes.
async fn get<S>(io: S, authority: &str, path: &str) -> Result<Bytes, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| format!("http: {e}"))?;
    let conn = tokio::spawn(conn);
    let req = http::Request::get(path)
        .header(http::header::HOST, authority)
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("http: {e}"))?;
    let status = resp.status();
    let body = Limited::new(resp.into_body(), MAX_ANSWER)
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?
        .to_bytes();
    conn.abort();
    if status != http::StatusCode::OK {
        return Err(format!("status {status}"));
    }
    Ok(body)
}

/// This machine's answer to a peer: reached etcd within the time asked if its last lease
/// renewal was sent in that time, or else if one probe of etcd (a renewal, at most
/// [`PROBE_TIMEOUT`]) succeeds now. Concurrent questions share one probe, and a probe that
/// failed a moment ago answers "no" without another.
#[derive(Debug)]
pub struct LeaseReach<K> {
    pub renewals: watch::Receiver<Option<Instant>>,
    pub presence: watch::Receiver<Option<Presence>>,
    pub role: MachineRole<K>,
    /// The send time of the last probe and whether it succeeded.
    last_probe: tokio::sync::Mutex<Option<(Instant, bool)>>,
}

impl<K: Kv> LeaseReach<K> {
    pub fn new(
        renewals: watch::Receiver<Option<Instant>>,
        presence: watch::Receiver<Option<Presence>>,
        role: MachineRole<K>,
    ) -> LeaseReach<K> {
        LeaseReach {
            renewals,
            presence,
            role,
            last_probe: tokio::sync::Mutex::new(None),
        }
    }

    async fn reached(&self, within: Duration) -> bool {
        let fresh = |at: Instant| at.elapsed() <= within;
        if self.renewals.borrow().is_some_and(fresh) {
            return true;
        }
        let mut last = self.last_probe.lock().await;
        match *last {
            Some((at, true)) if fresh(at) => return true,
            Some((at, false)) if at.elapsed() < PROBE_TIMEOUT => return false,
            _ => {}
        }
        if self.renewals.borrow().is_some_and(fresh) {
            return true;
        }
        let Some(presence) = *self.presence.borrow() else {
            return false;
        };
        let sent = Instant::now();
        let ok = matches!(
            tokio::time::timeout(PROBE_TIMEOUT, self.role.keep_alive(&presence)).await,
            Ok(Ok(()))
        );
        if !ok {
            debug!("a peer asked whether this machine reaches etcd: it does not");
        }
        *last = Some((sent, ok));
        ok
    }
}

impl<K: Kv + std::fmt::Debug> Reach for LeaseReach<K> {
    fn reached_within(&self, within: Duration) -> Pin<Box<dyn Future<Output = bool> + Send + '_>> {
        Box::pin(self.reached(within))
    }
}

#[cfg(test)]
mod tests;
