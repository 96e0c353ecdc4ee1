//! A [`Kv`] that runs a [`Hook`] around every request and otherwise passes it on: how tests
//! slow down, fail or count requests, and the bench meters them, without restating every
//! method of the trait.

use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

use super::{Kv, KvError, LeaseId, RangeResult, Read, ReadResult, Revision, Txn, TxnResult, Watch};

/// A request about to be made, as a [`Hook`] sees it.
#[derive(Debug, Clone, Copy)]
pub enum Request<'a> {
    Range {
        key: &'a str,
        prefix: bool,
    },
    /// Keys and bounded intervals at one revision ([`Kv::read`]).
    Read(&'a [Read]),
    Txn(&'a Txn),
    Grant,
    /// A renewal, waiting `within` for its answer if given ([`Kv::keep_alive_within`]), else
    /// the request deadline.
    KeepAlive {
        lease: LeaseId,
        within: Option<Duration>,
    },
    Revoke(LeaseId),
    Watch {
        key: &'a str,
        prefix: bool,
    },
}

/// What a request came to, as [`Hook::after`] sees it.
#[derive(Debug, Clone, Copy)]
pub enum Outcome<'a> {
    Range(&'a RangeResult),
    Read(&'a ReadResult),
    Txn(&'a TxnResult),
    /// A lease granted, kept alive or revoked, or a watch created.
    Done,
    Failed(&'a KvError),
}

/// What a [`Hooked`] store does around each request: before it, wait, count, or fail it (the
/// error is returned instead of making the request); after it, look at what it came to.
pub trait Hook: Clone + Send + Sync + 'static {
    fn before(&self, request: Request<'_>) -> impl Future<Output = Result<(), KvError>> + Send;

    /// After each request that [`Hook::before`] let through, with how long the inner store
    /// took to answer it.
    fn after(&self, request: Request<'_>, outcome: Outcome<'_>, took: Duration) {
        let _ = (request, outcome, took);
    }

    /// Every watch created through the store, before the caller gets it: a hook may pass its
    /// messages on through a task of its own, to count them.
    fn watched(&self, watch: Watch) -> Watch {
        watch
    }
}

/// `inner`, with `hook` run around every request.
#[derive(Debug, Clone)]
pub struct Hooked<K, H> {
    pub inner: K,
    pub hook: H,
}

impl<K, H: Hook> Hooked<K, H> {
    /// Tells the hook what `request` came to; a result that is not an error is turned into an
    /// [`Outcome`] by `seen`.
    fn after<T>(
        &self,
        request: Request<'_>,
        sent: Instant,
        res: Result<T, KvError>,
        seen: impl FnOnce(&T) -> Outcome<'_>,
    ) -> Result<T, KvError> {
        let took = sent.elapsed();
        match &res {
            Ok(value) => self.hook.after(request, seen(value), took),
            Err(e) => self.hook.after(request, Outcome::Failed(e), took),
        }
        res
    }
}

impl<K: Kv, H: Hook> Kv for Hooked<K, H> {
    async fn range(
        &self,
        key: &str,
        prefix: bool,
        revision: Option<Revision>,
    ) -> Result<RangeResult, KvError> {
        let request = Request::Range { key, prefix };
        self.hook.before(request).await?;
        let sent = Instant::now();
        let res = self.inner.range(key, prefix, revision).await;
        self.after(request, sent, res, |r| Outcome::Range(r))
    }

    async fn read(
        &self,
        reads: &[Read],
        revision: Option<Revision>,
    ) -> Result<ReadResult, KvError> {
        let request = Request::Read(reads);
        self.hook.before(request).await?;
        let sent = Instant::now();
        let res = self.inner.read(reads, revision).await;
        self.after(request, sent, res, |r| Outcome::Read(r))
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResult, KvError> {
        self.hook.before(Request::Txn(&txn)).await?;
        // The inner store takes the transaction; `after` is told which one it was.
        let copy = txn.clone();
        let sent = Instant::now();
        let res = self.inner.txn(txn).await;
        self.after(Request::Txn(&copy), sent, res, |r| Outcome::Txn(r))
    }

    async fn grant(&self, ttl: Duration) -> Result<LeaseId, KvError> {
        self.hook.before(Request::Grant).await?;
        let sent = Instant::now();
        let res = self.inner.grant(ttl).await;
        self.after(Request::Grant, sent, res, |_| Outcome::Done)
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<(), KvError> {
        let request = Request::KeepAlive {
            lease,
            within: None,
        };
        self.hook.before(request).await?;
        let sent = Instant::now();
        let res = self.inner.keep_alive(lease).await;
        self.after(request, sent, res, |_| Outcome::Done)
    }

    async fn keep_alive_within(&self, lease: LeaseId, within: Duration) -> Result<(), KvError> {
        let request = Request::KeepAlive {
            lease,
            within: Some(within),
        };
        self.hook.before(request).await?;
        let sent = Instant::now();
        let res = self.inner.keep_alive_within(lease, within).await;
        self.after(request, sent, res, |_| Outcome::Done)
    }

    async fn revoke(&self, lease: LeaseId) -> Result<(), KvError> {
        let request = Request::Revoke(lease);
        self.hook.before(request).await?;
        let sent = Instant::now();
        let res = self.inner.revoke(lease).await;
        self.after(request, sent, res, |_| Outcome::Done)
    }

    async fn watch(
        &self,
        key: &str,
        prefix: bool,
        from_revision: Revision,
    ) -> Result<Watch, KvError> {
        let request = Request::Watch { key, prefix };
        self.hook.before(request).await?;
        let sent = Instant::now();
        let res = self.inner.watch(key, prefix, from_revision).await;
        let watch = self.after(request, sent, res, |_| Outcome::Done)?;
        Ok(self.hook.watched(watch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{MemKv, TxnOp};
    use std::sync::{Arc, Mutex};

    /// Records, for every request, whether it succeeded and what it read.
    #[derive(Debug, Clone, Default)]
    struct Seen(Arc<Mutex<Vec<String>>>);

    impl Hook for Seen {
        async fn before(&self, _: Request<'_>) -> Result<(), KvError> {
            Ok(())
        }

        fn after(&self, request: Request<'_>, outcome: Outcome<'_>, _: Duration) {
            let line = match (request, outcome) {
                (Request::Range { key, .. }, Outcome::Range(r)) => {
                    format!("range {key}: {} keys", r.kvs.len())
                }
                (Request::Txn(t), Outcome::Txn(r)) => {
                    format!("txn of {} ops: {}", t.success.len(), r.succeeded)
                }
                (_, Outcome::Failed(_)) => "failed".to_owned(),
                (_, _) => "done".to_owned(),
            };
            self.0.lock().unwrap().push(line);
        }
    }

    #[tokio::test]
    async fn tells_the_hook_what_each_request_came_to() {
        let kv = Hooked {
            inner: MemKv::new(),
            hook: Seen::default(),
        };
        let put = TxnOp::Put {
            key: "/a".to_owned(),
            value: b"v".to_vec(),
            lease: None,
        };
        kv.txn(Txn {
            compares: vec![],
            success: vec![put],
            failure: vec![],
        })
        .await
        .unwrap();
        kv.range("/a", false, None).await.unwrap();
        kv.keep_alive(LeaseId(42)).await.unwrap_err();
        assert_eq!(
            *kv.hook.0.lock().unwrap(),
            ["txn of 1 ops: true", "range /a: 1 keys", "failed"]
        );
    }
}
