//! Group commit of concurrent creates: `PUT /units/<name>?expect=absent` (what fleetctl sends
//! for a unit it found missing) from many requests at once are written together through
//! [`Cluster::create_many`], many units per etcd transaction, instead of one transaction
//! each. fleetctl sends 128 such requests at a time to a server without `POST /units`
//! (`fleet_ops::create_each`; fleetctl's `driver/creates.rs`), and other clients may too;
//! grouped, they cost etcd a few transactions per round instead of 128.
//!
//! Each request keeps its own answer (created, unchanged, or its own refusal): a group is
//! the etcd side's `create_many`, which decides each unit as a single create would. A
//! request that asked nothing else waits for no timer: a worker takes the first request
//! queued and whatever else is queued at that moment, so one request alone is written at
//! once. PUTs without `expect=absent` (fleet's own clients) never come here.

use fleet_ops::{Cluster, OpsError, PutOutcome, PutRequest, RegistryCluster};
use fleet_registry::kv::Kv;
use std::sync::Arc;
use tokio::sync::{Mutex, mpsc, oneshot};

/// Most creates written as one group (a few etcd transactions, in flight together).
pub const MAX_GROUP: usize = 512;

/// Groups written at once: while one waits on etcd, the next forms.
const WORKERS: usize = 4;

struct Pending {
    req: PutRequest,
    reply: oneshot::Sender<Result<PutOutcome, OpsError>>,
}

type Queue = Arc<Mutex<mpsc::Receiver<Pending>>>;

/// The queue of creates, and the workers that write it (started with the first create, on
/// the runtime serving the API).
#[derive(Debug)]
pub struct Creates {
    tx: std::sync::OnceLock<mpsc::Sender<Pending>>,
}

impl Creates {
    pub fn new() -> Creates {
        Creates {
            tx: std::sync::OnceLock::new(),
        }
    }

    /// Creates `req`'s unit if it is absent, with the creates queued alongside it.
    pub async fn create<K: Kv>(
        &self,
        cluster: &RegistryCluster<K>,
        req: PutRequest,
    ) -> Result<PutOutcome, OpsError> {
        let tx = self.tx.get_or_init(|| start(cluster.clone()));
        let (reply, answer) = oneshot::channel();
        let name = req.name.clone();
        if tx.send(Pending { req, reply }).await.is_err() {
            return Err(OpsError::Conflict(name));
        }
        // A worker answers every request it takes; a dropped reply means it stopped.
        answer.await.unwrap_or(Err(OpsError::Conflict(name)))
    }
}

impl Default for Creates {
    fn default() -> Creates {
        Creates::new()
    }
}

fn start<K: Kv>(cluster: RegistryCluster<K>) -> mpsc::Sender<Pending> {
    let (tx, rx) = mpsc::channel(MAX_GROUP * WORKERS);
    let queue: Queue = Arc::new(Mutex::new(rx));
    for _ in 0..WORKERS {
        tokio::spawn(work(cluster.clone(), queue.clone()));
    }
    tx
}

/// Takes the first queued create and every other queued then (up to [`MAX_GROUP`]), writes
/// them together, answers each; until the API is dropped.
async fn work<K: Kv>(cluster: RegistryCluster<K>, queue: Queue) {
    loop {
        let group = {
            let mut rx = queue.lock().await;
            let Some(first) = rx.recv().await else {
                return;
            };
            let mut group = vec![first];
            while group.len() < MAX_GROUP {
                match rx.try_recv() {
                    Ok(p) => group.push(p),
                    Err(_) => break,
                }
            }
            group
        };
        let (reqs, replies): (Vec<PutRequest>, Vec<_>) =
            group.into_iter().map(|p| (p.req, p.reply)).unzip();
        let written = cluster.create_many(reqs).await;
        for (reply, (_, res)) in replies.into_iter().zip(written) {
            // The client may have gone; its unit is written all the same.
            let _ = reply.send(res);
        }
    }
}
