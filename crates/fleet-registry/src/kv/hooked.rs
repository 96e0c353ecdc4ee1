//! A [`Kv`] that runs a [`Hook`] before every request and then passes it on: how tests slow
//! down, fail or count requests without restating every method of the trait.

use std::future::Future;
use std::time::Duration;

use super::{Kv, KvError, LeaseId, RangeResult, Revision, Txn, TxnResult, Watch};

/// A request about to be made, as a [`Hook`] sees it.
#[derive(Debug, Clone, Copy)]
pub enum Request<'a> {
    Range { key: &'a str, prefix: bool },
    Txn(&'a Txn),
    Grant,
    KeepAlive(LeaseId),
    Revoke(LeaseId),
    Watch { key: &'a str, prefix: bool },
}

/// What a [`Hooked`] store does before each request: wait, count, or fail it (the error is
/// returned instead of making the request).
pub trait Hook: Clone + Send + Sync + 'static {
    fn before(&self, request: Request<'_>) -> impl Future<Output = Result<(), KvError>> + Send;
}

/// `inner`, with `hook` run before every request.
#[derive(Debug, Clone)]
pub struct Hooked<K, H> {
    pub inner: K,
    pub hook: H,
}

impl<K: Kv, H: Hook> Kv for Hooked<K, H> {
    async fn range(
        &self,
        key: &str,
        prefix: bool,
        revision: Option<Revision>,
    ) -> Result<RangeResult, KvError> {
        self.hook.before(Request::Range { key, prefix }).await?;
        self.inner.range(key, prefix, revision).await
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResult, KvError> {
        self.hook.before(Request::Txn(&txn)).await?;
        self.inner.txn(txn).await
    }

    async fn grant(&self, ttl: Duration) -> Result<LeaseId, KvError> {
        self.hook.before(Request::Grant).await?;
        self.inner.grant(ttl).await
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<(), KvError> {
        self.hook.before(Request::KeepAlive(lease)).await?;
        self.inner.keep_alive(lease).await
    }

    async fn revoke(&self, lease: LeaseId) -> Result<(), KvError> {
        self.hook.before(Request::Revoke(lease)).await?;
        self.inner.revoke(lease).await
    }

    async fn watch(
        &self,
        key: &str,
        prefix: bool,
        from_revision: Revision,
    ) -> Result<Watch, KvError> {
        self.hook.before(Request::Watch { key, prefix }).await?;
        self.inner.watch(key, prefix, from_revision).await
    }
}
