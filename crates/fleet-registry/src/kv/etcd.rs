//! [`Kv`] on a real etcd through etcd-client.
//!
//! Owns the connections (one per endpoint, see [`failover`]), the per-call deadline and the
//! translation of etcd-client's errors into [`KvError`]. Its only retry is failover: a call
//! that failed on one member is tried on the next when that is safe, within the same
//! deadline. It does not log errors it returns (the loop that retries is the one that logs).
//! etcd-client's types stay inside this module and its children ([`convert`], [`failover`]
//! and [`watch`]).

pub(crate) mod admin;
mod convert;
mod failover;
mod login;
mod pages;
mod watch;

use std::fmt;
use std::future::Future;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use tracing::debug;

use super::{Kv, KvError, LeaseId, RangeResult, Read, ReadResult, Revision, Txn, TxnResult, Watch};
use convert::{Failure, Request};
use failover::{Call, Member, Members};
use login::Login;
use pages::{PINNED_READ_ATTEMPTS, PageSize, Paged, prefix_end};

/// TLS client files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca_file: Option<std::path::PathBuf>,
    pub cert_file: Option<std::path::PathBuf>,
    pub key_file: Option<std::path::PathBuf>,
}

/// How to reach etcd.
#[derive(Debug, Clone, PartialEq)]
pub struct EtcdConfig {
    pub endpoints: Vec<String>,
    pub request_timeout: std::time::Duration,
    pub tls: TlsFiles,
    /// etcd's username/password authentication (issue 17): `None` connects anonymously
    /// (or as the TLS client certificate's CN, when etcd maps certificates to users).
    pub auth: Option<EtcdAuth>,
}

/// An etcd user and its password. `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdAuth {
    pub username: String,
    pub password: String,
}

impl fmt::Debug for EtcdAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdAuth")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// HTTP/2 pings while a stream (a watch) is open, so a silently vanished server breaks the
/// watch instead of leaving it hanging. etcd's default keepalive policy rejects pings more
/// often than every 5 s, and pings on idle connections altogether.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// How long a ping may go unanswered before the connection is given up (never less than the
/// request deadline). Not the request deadline itself: an etcd starved of CPU under a bulk
/// start at 5,000 machines answered pings later than fleetd's 1 s, and each connection closed
/// under its calls failed them all and logged in again into the same etcd (docs/benchmarks.md,
/// section 7, item 5). A server that vanished still breaks a watch within the interval plus
/// this; a call to it ends at its own deadline as before.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The ping timeout of a client whose requests must end within `request_timeout`.
fn ping_timeout(request_timeout: Duration) -> Duration {
    KEEPALIVE_TIMEOUT.max(request_timeout)
}

/// The store on a real etcd cluster. Cheap to clone: clones share the connections and the
/// choice of the current member.
#[derive(Clone)]
pub struct EtcdKv {
    members: Arc<Members>,
    /// The configured endpoints as one comma-separated string, for error messages.
    endpoints: Arc<str>,
    /// The etcd user calls authenticate as, empty without credentials: for refusals.
    user: Arc<str>,
    request_timeout: Duration,
    /// Said after a connection the server closed or a TLS alert it sent: over TLS without a
    /// client certificate, the likely reason is a server requiring one (it ends the handshake
    /// with a bare alert or closes the connection, depending on timing).
    closed_hint: Option<&'static str>,
    /// How large a page of a prefix read is after the first ([`PageSize::for_deadline`]).
    page: PageSize,
}

/// See [`EtcdKv::closed_hint`].
const NO_CLIENT_CERT_HINT: &str =
    "no TLS client certificate is configured; etcd may require one (--client-cert-auth)";

impl fmt::Debug for EtcdKv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdKv")
            .field("endpoints", &self.endpoints)
            .field("request_timeout", &self.request_timeout)
            .finish_non_exhaustive()
    }
}

impl EtcdKv {
    /// Prepares a client for `cfg.endpoints`. Connecting is lazy: this fails only on a bad
    /// configuration (no endpoints, a malformed URL, unreadable TLS files); an unreachable
    /// cluster shows up as [`KvError::Unavailable`] or [`KvError::Timeout`] on the first call.
    /// With `cfg.auth`, each member's client logs in on its first call (see [`login`]):
    /// refused credentials are [`KvError::AuthFailed`] then, and refusals of etcd's RBAC
    /// [`KvError::PermissionDenied`].
    pub async fn connect(cfg: &EtcdConfig) -> Result<EtcdKv, KvError> {
        if cfg.endpoints.is_empty() {
            return Err(KvError::Config("no etcd endpoints configured".to_owned()));
        }
        if cfg.request_timeout.is_zero() {
            return Err(KvError::Config(
                "the etcd request timeout must be positive".to_owned(),
            ));
        }
        let endpoints: Arc<str> = cfg.endpoints.join(",").into();
        let mut options = ConnectOptions::new()
            .with_connect_timeout(cfg.request_timeout)
            // A safety net only: every call has its own deadline. A login may take longer
            // than one call (`login.rs`), and runs on under it.
            .with_timeout(cfg.request_timeout.max(login::LOGIN_TIMEOUT))
            .with_keep_alive(KEEPALIVE_INTERVAL, ping_timeout(cfg.request_timeout))
            .with_keep_alive_while_idle(false)
            // A member cut off from the others then refuses every request at once ("no
            // leader", before handling it: safe to repeat elsewhere) and ends its watches,
            // instead of stalling them until the deadline.
            .with_require_leader(true)
            // etcd's simple tokens expire (`--auth-token-ttl`, 300 s unused by default) and
            // die with a restart: a call refused for its token logs in again (our login, not
            // etcd-client's, which would run within the call's deadline), once.
            .with_auto_token_refresh(false);
        if let Some(tls) = tls_options(&cfg.endpoints, &cfg.tls)? {
            options = options.with_tls(tls);
        }
        let mut members = Vec::with_capacity(cfg.endpoints.len());
        for endpoint in &cfg.endpoints {
            let connect = Client::connect([endpoint], Some(options.clone()));
            let client = match tokio::time::timeout(cfg.request_timeout, connect).await {
                Ok(Ok(client)) => client,
                Ok(Err(e)) => {
                    return Err(KvError::Config(format!(
                        "cannot use etcd endpoint {endpoint}: {}",
                        connect_error(&e, &cfg.tls)
                    )));
                }
                Err(_) => {
                    return Err(KvError::Timeout(cfg.request_timeout, endpoints.to_string()));
                }
            };
            members.push(Member {
                endpoint: endpoint.clone(),
                client,
                login: cfg
                    .auth
                    .as_ref()
                    .map(|a| Login::new(a.username.clone(), a.password.clone())),
            });
        }
        debug!(endpoints = %endpoints, timeout = ?cfg.request_timeout, "etcd client ready");
        let https = cfg.endpoints.iter().all(|e| e.starts_with("https://"));
        Ok(EtcdKv {
            members: Arc::new(Members::new(members)),
            endpoints,
            user: cfg.auth.as_ref().map_or("", |a| a.username.as_str()).into(),
            request_timeout: cfg.request_timeout,
            closed_hint: (https && cfg.tls.cert_file.is_none()).then_some(NO_CLIENT_CERT_HINT),
            page: PageSize::for_deadline(cfg.request_timeout),
        })
    }

    /// Pages of a prefix read aim at `bytes` after the first, instead of what the request
    /// deadline sets: the contract tests read a few MiB in several pages.
    pub fn with_page_bytes(mut self, bytes: usize) -> EtcdKv {
        self.page.bytes = bytes.max(1);
        self
    }

    /// The configured endpoints, comma-separated.
    pub fn endpoints(&self) -> &str {
        &self.endpoints
    }

    /// The endpoint calls go to now: the first configured one until a call fails over.
    pub fn current_endpoint(&self) -> &str {
        &self.members.get(self.members.current()).endpoint
    }

    /// Compacts etcd's history up to `revision`: older revisions can no longer be read or
    /// watched. For tests of the compaction paths (`fleet_testing::TestEtcd::compact`); a
    /// real cluster compacts itself.
    #[cfg(feature = "test-etcd")]
    pub async fn compact(&self, revision: Revision) -> Result<(), KvError> {
        let res = self
            .read(|c| async move { kv_client(&c).compact(revision, None).await })
            .await;
        res.map(drop).map_err(|f| self.error(f, Request::Compact))
    }

    /// Runs a call that may be repeated on another member, under the request deadline.
    async fn read<T, F, Fut>(&self, call: F) -> Result<T, Failure>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = Instant::now() + self.request_timeout;
        self.with_failover(Call::Read, deadline, call).await
    }

    /// Creates a watch on whichever member answers, under the request deadline.
    async fn watch_on_any<T, F, Fut>(&self, call: F) -> Result<T, Failure>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = Instant::now() + self.request_timeout;
        self.with_failover(Call::Watch, deadline, call).await
    }

    /// Runs a write, repeated on another member only if etcd never got it.
    async fn write<T, F, Fut>(&self, call: F) -> Result<T, Failure>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = Instant::now() + self.request_timeout;
        self.with_failover(Call::Write, deadline, call).await
    }

    async fn with_failover<T, F, Fut>(
        &self,
        kind: Call,
        deadline: Instant,
        call: F,
    ) -> Result<T, Failure>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.members.call(kind, deadline, call).await
    }

    /// The error callers see for a failed `request`. Compaction is handled where a revision
    /// was asked for (ranges, watches); anywhere else it is a refusal.
    fn error(&self, failure: Failure, request: Request<'_>) -> KvError {
        match failure {
            Failure::NotSent(detail) | Failure::NoLeader(detail) | Failure::Unreachable(detail) => {
                KvError::Unavailable {
                    endpoints: self.endpoints.to_string(),
                    detail: match self.closed_hint {
                        Some(hint) if ended_by_server(&detail) => {
                            format!("{detail}; {hint}")
                        }
                        _ if not_grpc(&detail) => format!("{detail}; {NOT_GRPC_HINT}"),
                        _ => detail,
                    },
                }
            }
            Failure::Timeout => KvError::Timeout(self.request_timeout, self.endpoints.to_string()),
            Failure::Compacted(msg) => KvError::Refused(msg),
            Failure::LeaseNotFound(msg) => match request.lease() {
                Some(lease) => KvError::LeaseNotFound(lease),
                None => KvError::Refused(msg),
            },
            Failure::PermissionDenied => KvError::PermissionDenied {
                user: self.user.to_string(),
                what: request.describe(),
            },
            Failure::AuthFailed(detail) => KvError::AuthFailed {
                user: self.user.to_string(),
                detail,
            },
            Failure::Refused(msg) => KvError::Refused(msg),
        }
    }
}

impl Kv for EtcdKv {
    async fn range(
        &self,
        key: &str,
        prefix: bool,
        revision: Option<Revision>,
    ) -> Result<RangeResult, KvError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            // Each interval's pages in order, the intervals in key order.
            let parts: Mutex<Vec<Vec<super::KeyValue>>> = Mutex::new(Vec::new());
            let sink = |interval: usize, kvs: Vec<super::KeyValue>| {
                let mut parts = parts.lock().unwrap_or_else(PoisonError::into_inner);
                if parts.len() <= interval {
                    parts.resize_with(interval + 1, Vec::new);
                }
                parts[interval].extend(kvs);
            };
            let failure = match self.read_pages(key, prefix, revision, &sink).await {
                Ok(revision) => {
                    let parts = parts.into_inner().unwrap_or_else(PoisonError::into_inner);
                    return Ok(RangeResult {
                        revision,
                        kvs: parts.into_iter().flatten().collect(),
                    });
                }
                Err(failure) => failure,
            };
            match failure {
                // History was compacted under a read this call pinned itself (no revision
                // was asked for): the caller wanted the present, so read it again.
                Paged::Later(Failure::Compacted(_))
                    if revision.is_none() && attempt < PINNED_READ_ATTEMPTS =>
                {
                    debug!(key, attempt, "range pages compacted away, reading again");
                }
                failure => return Err(self.paged_error(failure, key, prefix, revision).await),
            }
        }
    }

    async fn range_each<F>(&self, prefix: &str, revision: Revision, page: F) -> Result<(), KvError>
    where
        F: FnMut(Vec<super::KeyValue>) + Send,
    {
        let page = Mutex::new(page);
        let sink = |_: usize, kvs: Vec<super::KeyValue>| {
            (page.lock().unwrap_or_else(PoisonError::into_inner))(kvs);
        };
        match self.read_pages(prefix, true, Some(revision), &sink).await {
            Ok(_) => Ok(()),
            Err(failure) => Err(self
                .paged_error(failure, prefix, true, Some(revision))
                .await),
        }
    }

    async fn read(
        &self,
        reads: &[Read],
        revision: Option<Revision>,
    ) -> Result<ReadResult, KvError> {
        // A read-only transaction: etcd serves every range of it at the one revision asked
        // (or its present), like any read, on whichever member answers.
        let txn = convert::reads(reads, revision);
        let get = |c: Client| {
            let txn = txn.clone();
            async move { kv_client(&c).txn(txn).await }
        };
        let first = reads.first().map_or("", |r| r.start.as_str());
        match self.read(get).await {
            Ok(resp) => Ok(convert::read_result(&resp)),
            Err(Failure::Compacted(_)) => {
                let requested = revision.unwrap_or(0);
                let deadline = Instant::now() + self.request_timeout;
                let compacted = watch::compact_revision(self, first, deadline).await;
                Err(KvError::Compacted {
                    requested,
                    compacted: compacted.unwrap_or(requested + 1),
                })
            }
            Err(f) => Err(self.error(
                f,
                Request::Range {
                    key: first,
                    prefix: reads.first().is_some_and(|r| r.end.is_some()),
                },
            )),
        }
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResult, KvError> {
        let put = |c: Client| {
            let txn = convert::txn(txn.clone());
            async move { kv_client(&c).txn(txn).await }
        };
        match self.write(put).await {
            Ok(resp) => Ok(convert::txn_result(&resp)),
            Err(f) => Err(self.error(f, Request::Txn(&txn))),
        }
    }

    async fn grant(&self, ttl: Duration) -> Result<LeaseId, KvError> {
        let ttl = whole_seconds(ttl);
        match self
            .read(|c| async move { c.lease_client().grant(ttl, None).await })
            .await
        {
            Ok(resp) => Ok(LeaseId(resp.id())),
            Err(f) => Err(self.error(f, Request::Grant)),
        }
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<(), KvError> {
        self.keep_alive_within(lease, self.request_timeout).await
    }

    async fn keep_alive_within(&self, lease: LeaseId, within: Duration) -> Result<(), KvError> {
        // etcd-client sends the first ping and reads its answer before returning the keeper;
        // a TTL of 0 in that answer (expired or unknown lease) comes back as an error. Dropping
        // the keeper and its stream then closes the keep-alive stream.
        let ping = |c: Client| async move { c.lease_client().keep_alive(lease.0).await };
        let within = within.max(self.request_timeout);
        let deadline = Instant::now() + within;
        match self.with_failover(Call::Read, deadline, ping).await {
            Ok(_) => Ok(()),
            Err(Failure::Timeout) => Err(KvError::Timeout(within, self.endpoints.to_string())),
            Err(f) => Err(self.error(f, Request::KeepAlive(lease))),
        }
    }

    async fn revoke(&self, lease: LeaseId) -> Result<(), KvError> {
        let revoke = |c: Client| async move { c.lease_client().revoke(lease.0).await };
        match self.read(revoke).await {
            Ok(_) | Err(Failure::LeaseNotFound(_)) => Ok(()),
            Err(f) => Err(self.error(f, Request::Revoke(lease))),
        }
    }

    async fn watch(
        &self,
        key: &str,
        prefix: bool,
        from_revision: Revision,
    ) -> Result<Watch, KvError> {
        watch::start(self, key, prefix, from_revision).await
    }
}

/// The largest response decoded: what etcd itself may send (its gRPC send limit is
/// `i32::MAX`). etcd-client's default, 4 MiB, failed a listing once the registry held more
/// than 4 MiB of unit files, and a watch message for a revision that deletes many keys.
const MAX_RESPONSE_BYTES: usize = i32::MAX as usize;

/// A KV client that decodes responses of any size etcd sends.
fn kv_client(client: &Client) -> etcd_client::KvClient {
    client
        .kv_client()
        .max_decoding_message_size(MAX_RESPONSE_BYTES)
}

/// A watch client that decodes responses of any size etcd sends: etcd 3.4 sends one revision
/// in one message unless the watch asks for fragments, which etcd-client does not let us tell
/// apart.
pub(super) fn watch_client(client: &Client) -> etcd_client::WatchClient {
    client
        .watch_client()
        .max_decoding_message_size(MAX_RESPONSE_BYTES)
}

/// Said when the server answered, but not in HTTP/2: an HTTP/1 server (a web server, a
/// proxy, an etcd v2 API behind one) rather than etcd's gRPC port.
const NOT_GRPC_HINT: &str = "the endpoint answered, but not as etcd's gRPC API (is it an HTTP server, or etcd's peer port?)";

/// Whether a transport failure is an HTTP/2 protocol error: what hyper says when the other
/// end speaks something else.
fn not_grpc(detail: &str) -> bool {
    detail.contains("h2 protocol error") || detail.contains("frame with invalid size")
}

/// Whether a transport failure is the server ending the connection (rather than refusing it,
/// timing out, or failing our own certificate checks). A TLS server that wants a client
/// certificate does that in one of these ways, depending on timing.
fn ended_by_server(detail: &str) -> bool {
    [
        "connection closed",
        "received fatal alert",
        "broken pipe",
        "connection reset",
    ]
    .iter()
    .any(|s| detail.contains(s))
}

/// etcd takes whole seconds; rounding up keeps the lease at least as long as asked.
fn whole_seconds(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

/// TLS settings for `https://` endpoints, read and checked now so a bad file is reported by
/// name instead of as a handshake failure later.
fn tls_options(endpoints: &[String], files: &TlsFiles) -> Result<Option<TlsOptions>, KvError> {
    let https = endpoints
        .iter()
        .filter(|e| e.starts_with("https://"))
        .count();
    if https == 0 {
        return Ok(None);
    }
    if https != endpoints.len() {
        return Err(KvError::Config(format!(
            "etcd endpoints mix https and http: {}",
            endpoints.join(",")
        )));
    }
    let Some(ca_file) = &files.ca_file else {
        return Err(KvError::Config(
            "https etcd endpoints need a CA file (etcd_cafile)".to_owned(),
        ));
    };
    let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(read_pem(ca_file)?));
    match (&files.cert_file, &files.key_file) {
        (Some(cert), Some(key)) => {
            tls = tls.identity(Identity::from_pem(read_pem(cert)?, read_pem(key)?));
        }
        (None, None) => {}
        (Some(cert), None) => {
            return Err(KvError::Config(format!(
                "etcd client certificate {} given without a key file (etcd_keyfile)",
                cert.display()
            )));
        }
        (None, Some(key)) => {
            return Err(KvError::Config(format!(
                "etcd client key {} given without a certificate file (etcd_certfile)",
                key.display()
            )));
        }
    }
    Ok(Some(tls))
}

/// What went wrong building a client. etcd-client shows a TLS identity it cannot use as
/// "transport error: transport error"; the cause (`InconsistentKeys(KeyMismatch)`,
/// `PrivateKeyParseError`, `InvalidCertificate(BadEncoding)`) is only in its debug form.
fn connect_error(err: &etcd_client::Error, tls: &TlsFiles) -> String {
    let shown = err.to_string();
    let debug = format!("{err:?}");
    let Some(cause) = debug
        .split_once("Transport, ")
        .and_then(|(_, rest)| rest.strip_suffix("))"))
    else {
        return shown;
    };
    match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => format!(
            "the TLS client certificate {} and key {} cannot be used ({cause})",
            cert.display(),
            key.display()
        ),
        _ => format!("{shown} ({cause})"),
    }
}

fn read_pem(path: &Path) -> Result<Vec<u8>, KvError> {
    let bytes = std::fs::read(path)
        .map_err(|e| KvError::Config(format!("cannot read {}: {e}", path.display())))?;
    if !bytes.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(KvError::Config(format!(
            "{} is not a PEM file",
            path.display()
        )));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests;
