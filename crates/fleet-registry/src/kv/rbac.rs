//! A [`Kv`] that checks every request against a user's etcd roles the way etcd 3.4's RBAC
//! does, and refuses what they do not allow with [`KvError::PermissionDenied`]: how tests
//! prove that each role handle of the registry works with exactly the role
//! [`crate::rbac`] plans for it, without a real etcd with auth enabled.
//!
//! The rules (etcd 3.4 `auth/store.go` `isRangeOpPermitted`, `etcdserver/apply_auth.go`
//! `checkTxnAuth`, `checkLeasePuts`, `v3rpc/watch.go` `isWatchPermitted`):
//! - a read of one key needs Read on it; a read of a prefix or an interval needs Read on the
//!   whole range (a read of several is checked read by read, as a transaction's ops are);
//! - a put or delete needs Write on its key (on the whole range for a prefix delete);
//! - a transaction needs Read on every compared key (range), then the permission of every op
//!   of BOTH branches, whichever is taken; nothing of a refused transaction is applied;
//! - a watch needs Read on its range;
//! - granting and keeping a lease alive are always allowed;
//! - revoking a lease needs Write on every key attached to it;
//! - a user holding etcd's `root` role may do everything.
//!
//! Where the fake is stricter than etcd (so a handle that passes here passes on etcd):
//! - a range is allowed here only when ONE permission covers it; etcd 3.4 also accepts a
//!   union of contiguous permissions (its interval tree's `Contains`). No role of the plan
//!   relies on that.
//! - etcd checks a plain put's lease (`checkLeasePuts`) but not the puts of a transaction;
//!   every write of the registry is a transaction, so neither side checks it.
//!
//! A refusal's `what` is the operation and the first refused key, in the order etcd checks:
//! `read <key>`, `read prefix <key>`, `write <key>`, `delete <key>`, `delete prefix <key>`,
//! `watch prefix <key>`, `revoke lease <id> (write <key>)`. Real etcd only says "permission
//! denied", without the key: a test that runs on both sides compares the refusal, not `what`.
//!
//! To find a lease's keys on revoke, the wrapper reads the whole inner store (as a superuser
//! would): meant for tests on [`MemKv`](super::MemKv), not for production.

use super::{
    Kv, KvError, LeaseId, RangeResult, Read, ReadResult, Revision, Txn, TxnOp, TxnResult, Watch,
};
use crate::rbac::{Access, ROLE_ROOT, RoleSpec};

/// `inner`, seen by etcd user `user` holding exactly `roles`.
#[derive(Debug, Clone)]
pub struct Rbac<K> {
    pub inner: K,
    pub user: String,
    pub roles: Vec<RoleSpec>,
}

impl<K: Kv> Rbac<K> {
    pub fn new(inner: K, user: impl Into<String>, roles: Vec<RoleSpec>) -> Rbac<K> {
        Rbac {
            inner,
            user: user.into(),
            roles,
        }
    }

    /// Whether the roles allow `wanted` on `key` (on every key under it with `prefix`).
    pub fn allows(&self, wanted: Access, key: &str, prefix: bool) -> bool {
        self.roles.iter().any(|role| {
            role.name == ROLE_ROOT
                || role.permissions.iter().any(|p| {
                    p.access.covers(wanted)
                        && if prefix {
                            p.prefix && key.starts_with(&p.key)
                        } else {
                            p.permits(wanted, key)
                        }
                })
        })
    }

    fn check(&self, wanted: Access, verb: &str, key: &str, prefix: bool) -> Result<(), KvError> {
        if self.allows(wanted, key, prefix) {
            return Ok(());
        }
        let what = if prefix {
            format!("{verb} prefix {key}")
        } else {
            format!("{verb} {key}")
        };
        Err(self.denied(what))
    }

    fn denied(&self, what: String) -> KvError {
        KvError::PermissionDenied {
            user: self.user.clone(),
            what,
        }
    }

    fn check_op(&self, op: &TxnOp) -> Result<(), KvError> {
        match op {
            TxnOp::Put { key, .. } => self.check(Access::Write, "write", key, false),
            TxnOp::Delete { key, prefix } => self.check(Access::Write, "delete", key, *prefix),
            TxnOp::Get { key, prefix } => self.check(Access::Read, "read", key, *prefix),
        }
    }

    /// A read of a key, or of an interval: etcd permits an interval when one permission's
    /// range holds all of it. Here a permission is a key or a prefix, so an interval is
    /// permitted when a prefix permission holds both of its ends.
    fn check_read(&self, read: &Read) -> Result<(), KvError> {
        let Some(end) = &read.end else {
            return self.check(Access::Read, "read", &read.start, false);
        };
        let held = self.roles.iter().any(|role| {
            role.name == ROLE_ROOT
                || role.permissions.iter().any(|p| {
                    p.access.covers(Access::Read)
                        && p.prefix
                        && read.start.starts_with(&p.key)
                        && within_prefix(end, &p.key)
                })
        });
        if held {
            return Ok(());
        }
        Err(self.denied(format!("read {}..{end}", read.start)))
    }

    /// etcd's `checkTxnAuth`: the compares, then the success ops, then the failure ops.
    fn check_txn(&self, txn: &Txn) -> Result<(), KvError> {
        for c in &txn.compares {
            self.check(Access::Read, "read", &c.key, c.prefix)?;
        }
        txn.success
            .iter()
            .chain(&txn.failure)
            .try_for_each(|op| self.check_op(op))
    }
}

/// Whether an interval from a key under `prefix` that ends at `end` stays under `prefix`:
/// `end` is at most the first key after every key that starts with it.
fn within_prefix(end: &str, prefix: &str) -> bool {
    let mut after = prefix.as_bytes().to_vec();
    while let Some(last) = after.pop() {
        if last < 0xff {
            after.push(last + 1);
            return end.as_bytes() <= after.as_slice();
        }
    }
    true
}

impl<K: Kv> Kv for Rbac<K> {
    async fn range(
        &self,
        key: &str,
        prefix: bool,
        revision: Option<Revision>,
    ) -> Result<RangeResult, KvError> {
        self.check(Access::Read, "read", key, prefix)?;
        self.inner.range(key, prefix, revision).await
    }

    async fn read(
        &self,
        reads: &[Read],
        revision: Option<Revision>,
    ) -> Result<ReadResult, KvError> {
        for read in reads {
            self.check_read(read)?;
        }
        self.inner.read(reads, revision).await
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResult, KvError> {
        self.check_txn(&txn)?;
        self.inner.txn(txn).await
    }

    async fn grant(&self, ttl: std::time::Duration) -> Result<LeaseId, KvError> {
        self.inner.grant(ttl).await
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<(), KvError> {
        self.inner.keep_alive(lease).await
    }

    async fn keep_alive_within(
        &self,
        lease: LeaseId,
        within: std::time::Duration,
    ) -> Result<(), KvError> {
        self.inner.keep_alive_within(lease, within).await
    }

    async fn revoke(&self, lease: LeaseId) -> Result<(), KvError> {
        let all = self.inner.range("", true, None).await?;
        if let Some(kv) = all
            .kvs
            .iter()
            .find(|kv| kv.lease == lease.0 && !self.allows(Access::Write, &kv.key, false))
        {
            return Err(self.denied(format!("revoke lease {} (write {})", lease.0, kv.key)));
        }
        self.inner.revoke(lease).await
    }

    async fn watch(
        &self,
        key: &str,
        prefix: bool,
        from_revision: Revision,
    ) -> Result<Watch, KvError> {
        self.check(Access::Read, "watch", key, prefix)?;
        self.inner.watch(key, prefix, from_revision).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Keys;
    use crate::kv::{Compare, MemKv};
    use crate::rbac;
    use fleet_core::MachineId;
    use std::time::Duration;

    fn m(s: &str) -> MachineId {
        s.parse().unwrap()
    }

    fn put(key: &str, lease: Option<LeaseId>) -> TxnOp {
        TxnOp::Put {
            key: key.to_owned(),
            value: b"v".to_vec(),
            lease,
        }
    }

    fn txn(compares: Vec<Compare>, success: Vec<TxnOp>, failure: Vec<TxnOp>) -> Txn {
        Txn {
            compares,
            success,
            failure,
        }
    }

    fn machine_m1(kv: &MemKv) -> Rbac<MemKv> {
        let keys = Keys::new("/p/");
        Rbac::new(kv.clone(), "host-m1", vec![rbac::machine(&keys, &m("m1"))])
    }

    fn denied(err: KvError) -> (String, String) {
        match err {
            KvError::PermissionDenied { user, what } => (user, what),
            other => panic!("not a refusal: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_write_outside_the_role_is_refused_naming_the_user_and_the_key() {
        let kv = MemKv::new();
        let host = machine_m1(&kv);
        host.txn(txn(vec![], vec![put("/p/machine/m1", None)], vec![]))
            .await
            .unwrap();
        let err = host
            .txn(txn(
                vec![],
                vec![put("/p/schedule/m2/a.service", None)],
                vec![],
            ))
            .await
            .unwrap_err();
        assert_eq!(
            denied(err),
            (
                "host-m1".to_owned(),
                "write /p/schedule/m2/a.service".to_owned()
            )
        );
        assert!(
            kv.range("/p/schedule/", true, None)
                .await
                .unwrap()
                .kvs
                .is_empty()
        );
    }

    #[tokio::test]
    async fn a_prefix_read_needs_one_permission_over_the_whole_range() {
        let kv = MemKv::new();
        let host = machine_m1(&kv);
        host.range("/p/schedule/m1/", true, None).await.unwrap();
        host.range("/p/schedule/m1/a.service", false, None)
            .await
            .unwrap();
        let err = host.range("/p/schedule/", true, None).await.unwrap_err();
        assert_eq!(denied(err).1, "read prefix /p/schedule/");
        // Its own presence is one key: writable alone, not as a prefix (m1 would cover m10);
        // every presence is read (its peers, issue 36).
        host.range("/p/machine/m1", false, None).await.unwrap();
        host.range("/p/machine/", true, None).await.unwrap();
        let err = host.range("/p/", true, None).await.unwrap_err();
        assert_eq!(denied(err).1, "read prefix /p/");
    }

    #[tokio::test]
    async fn a_transaction_needs_its_compares_read_and_both_branches_permitted() {
        let kv = MemKv::new();
        let host = machine_m1(&kv);
        let own = "/p/unit-state/m1/a.service";
        host.txn(txn(
            vec![Compare::absent(own)],
            vec![put(own, None)],
            vec![],
        ))
        .await
        .unwrap();
        let err = host
            .txn(txn(
                vec![Compare::absent("/p/engine/leader")],
                vec![put(own, None)],
                vec![],
            ))
            .await
            .unwrap_err();
        assert_eq!(denied(err).1, "read /p/engine/leader");
        // The failure branch is never taken here, but etcd checks it all the same.
        let err = host
            .txn(txn(
                vec![Compare::absent("/p/unit-state/m1/b.service")],
                vec![put("/p/unit-state/m1/b.service", None)],
                vec![TxnOp::Delete {
                    key: "/p/unit-state/".to_owned(),
                    prefix: true,
                }],
            ))
            .await
            .unwrap_err();
        assert_eq!(denied(err).1, "delete prefix /p/unit-state/");
        let left = kv.range("/p/unit-state/", true, None).await.unwrap();
        assert_eq!(left.kvs.len(), 1, "the refused transaction wrote nothing");
    }

    #[tokio::test]
    async fn a_watch_needs_read_on_its_range() {
        let kv = MemKv::new();
        let host = machine_m1(&kv);
        host.watch("/p/schedule/m1/", true, 1).await.unwrap();
        let err = host.watch("/p/", true, 1).await.unwrap_err();
        assert_eq!(denied(err).1, "watch prefix /p/");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_is_revoked_only_by_who_may_write_every_key_on_it() {
        let kv = MemKv::new();
        let host = machine_m1(&kv);
        let lease = host.grant(Duration::from_secs(10)).await.unwrap();
        host.keep_alive(lease).await.unwrap();
        host.txn(txn(vec![], vec![put("/p/machine/m1", Some(lease))], vec![]))
            .await
            .unwrap();
        let other = Rbac::new(
            kv.clone(),
            "host-m2",
            vec![rbac::machine(&Keys::new("/p/"), &m("m2"))],
        );
        let err = other.revoke(lease).await.unwrap_err();
        assert_eq!(
            denied(err).1,
            format!("revoke lease {} (write /p/machine/m1)", lease.0)
        );
        host.revoke(lease).await.unwrap();
        assert!(kv.range("/p/", true, None).await.unwrap().kvs.is_empty());
    }

    #[tokio::test]
    async fn the_root_role_may_do_everything() {
        let kv = MemKv::new();
        let root = Rbac::new(
            kv,
            "root",
            vec![RoleSpec {
                name: ROLE_ROOT.to_owned(),
                permissions: vec![],
            }],
        );
        root.txn(txn(vec![], vec![put("/p/engine/leader", None)], vec![]))
            .await
            .unwrap();
        root.range("/", true, None).await.unwrap();
    }
}
